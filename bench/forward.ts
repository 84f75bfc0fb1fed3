// bench/forward.ts: what forwarding costs, against baselines measured in the same run. A bare node:http
// destination (bench/bare.ts, a child process) takes BENCH_FORWARD_BACKLOG (20k) bodies: from a plain undici
// loop POSTing them at BENCH_FORWARD_CONCURRENCY (32) over kept-alive connections, then forwarded from the
// inbox at the same concurrency, then again while a second destination is down (its connections refused).
// Each of BENCH_ROUNDS (3) rounds measures all of them one after the other, after one warm-up round, so a
// shared machine's noise lands on all alike; each ratio is taken within its round and the median printed
// (targets: forwarding ≥ 0.5× the loop; beside a down one ≥ 0.9× alone). Beside each rate: the CPU this
// process spent per request or forward (the worker's own, steadier than rates on a busy machine), the
// destination's per request (the same work on both sides), PostgreSQL's backends' per forward, and the
// commits per forward. SQLite, and PostgreSQL too unless BENCH_POSTGRES=0 or none is reachable. Then, unless
// BENCH_NATS=0 or no NATS answers, the same backlog forwarded into a JetStream destination against the
// official client's own loop publishing the same bodies, message IDs and headers, each awaiting its PubAck,
// at the same concurrency (target: ≥ 0.5×), each into a fresh stream. BENCH_COMPARE=/path/to/another/checkout
// forwards the same backlog with that checkout's forwarder and store too, in each round right after this
// one's, and prints the ratios of the two (CPU per forward, the worker's and PostgreSQL's, and the rate).
//   npm run bench -- forward          BENCH_FORWARD_BACKLOG=5000 BENCH_ROUNDS=1 npm run bench -- forward
//   BENCH_COMPARE=/tmp/before BENCH_FORWARD_BACKLOG=5000 BENCH_NATS=0 npm run bench -- forward

import { spawnSync } from "node:child_process";
import { readdirSync } from "node:fs";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { Agent, request } from "undici";
import { brokerSender, HEADERS, messageId, parseBrokerDestination } from "../lib/brokers.ts";
import { DEFAULTS } from "../lib/defaults.ts";
import type { Sender } from "../lib/forwarding/forward.ts";
import { forward } from "../lib/forwarding/forwarder.ts";
import { connect } from "../inbox.ts";
import { loadDestinations } from "../lib/routing/routes.ts";
const [connectHere, forwardHere, loadHere] = [connect, forward, loadDestinations];
import type { Inbox } from "../lib/store.ts";
import { ROOT, cpuMs, f, knob, startChild, tempDir, type Child } from "./common.ts";

const BACKLOG = knob("BENCH_FORWARD_BACKLOG", 20_000);
const CONCURRENCY = knob("BENCH_FORWARD_CONCURRENCY", 32);
const ROUNDS = knob("BENCH_ROUNDS", 3);
const WARMUP = Math.min(BACKLOG, 2_000);
const SECRET = `whsec_${Buffer.from("bench forwarding secret").toString("base64")}`;
const POSTGRES = process.env.INBOX_TEST_POSTGRES ?? "postgres://postgres@127.0.0.1:5432/test";
const NATS = process.env.BENCH_NATS ?? DEFAULTS.natsUrl;
const COMPARE = process.env.BENCH_COMPARE;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

/** Tree is the forwarder and store of one checkout: this one, or BENCH_COMPARE's. */
interface Tree {
  name: string;
  connect: typeof connect;
  forward: typeof forward;
  loadDestinations: typeof loadDestinations;
}

// tree loads a checkout's forwarder, store and sources parser, so that two trees can take turns in one process.
async function tree(root: string): Promise<Tree> {
  if (resolve(root) === resolve(ROOT)) return { name: "this tree", connect, forward, loadDestinations };
  const at = (path: string) => import(pathToFileURL(resolve(root, path)).href);
  const name = spawnSync("git", ["-C", root, "log", "-1", "--format=%h"], { encoding: "utf8" }).stdout.trim() || root;
  return {
    name,
    connect: (await at("inbox.ts")).connect,
    forward: (await at("lib/forwarding/forwarder.ts")).forward,
    loadDestinations: (await at("lib/routing/routes.ts")).loadDestinations,
  };
}

const bodyOf = (i: number) =>
  Buffer.from(JSON.stringify({ type: "payment.succeeded", customer: `c${i % 1000}`, amount: (i % 100) + 1 }));

/** Run is one timed pass: its rate, and the CPU and commits it took per request or forward. */
interface Run {
  rate: number;
  /** This process's CPU per request (the loop) or forward (the worker), in µs. */
  cpuUs: number;
  /** The destination's CPU per request, in µs (an HTTP destination). */
  sinkUs?: number;
  /** PostgreSQL's backends' CPU per forward, in µs (PostgreSQL only). */
  dbUs?: number;
  commits?: number;
}

const ownCpuMs = () => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
};

// timed runs work and returns its rate over n, with this process's and the destination's CPU per item.
async function timed(n: number, sink: Child | undefined, work: () => Promise<void>): Promise<Run> {
  const [cpu0, sink0] = [ownCpuMs(), sink?.cpuMs() ?? 0];
  const started = performance.now();
  await work();
  const ms = performance.now() - started;
  return {
    rate: (n / ms) * 1000,
    cpuUs: ((ownCpuMs() - cpu0) * 1000) / n,
    ...(sink ? { sinkUs: ((sink.cpuMs() - sink0) * 1000) / n } : {}),
  };
}

// loop is the baseline: CONCURRENCY loops POST the same bodies with undici, one request each at a time,
// over as many kept-alive connections as the forwarder opens.
async function loop(url: string, n: number, sink: Child): Promise<Run> {
  const agent = new Agent({ connections: CONCURRENCY });
  let next = 0;
  try {
    return await timed(n, sink, async () => {
      await Promise.all(
        Array.from({ length: CONCURRENCY }, async () => {
          for (let i = next++; i < n; i = next++) {
            const res = await request(url, {
              method: "POST",
              dispatcher: agent,
              body: bodyOf(i),
              headers: { "content-type": "application/json" },
            });
            await res.body.dump();
            if (res.statusCode !== 200) throw new Error(`baseline: HTTP ${res.statusCode}`);
          }
        }),
      );
    });
  } finally {
    await agent.close();
  }
}

// fill stores the backlog through the inbox itself, each delivery routed to the given destinations.
async function fill(inbox: Inbox, n: number, destinations: string[]): Promise<void> {
  for (let start = 0; start < n; start += 1_000) {
    await Promise.all(
      Array.from({ length: Math.min(1_000, n - start) }, (_, k) =>
        inbox.store({ id: `fw_${start + k}`, body: bodyOf(start + k), contentType: "application/json", destinations }),
      ),
    );
  }
}

// backendCpuMs sums the CPU of the PostgreSQL backends serving this bench (found by application_name),
// from /proc: the server runs on this machine, or the figure is left out.
async function backendCpuMs(inbox: Inbox, name: string): Promise<Map<number, number> | undefined> {
  if (inbox.backend !== "postgres") return undefined;
  const rows = await inbox.query("SELECT pid FROM pg_stat_activity WHERE application_name = ?", name);
  const cpu = new Map<number, number>();
  try {
    const pids = new Set(readdirSync("/proc"));
    for (const r of rows) if (pids.has(String(r.pid))) cpu.set(Number(r.pid), cpuMs(Number(r.pid)));
  } catch {
    return undefined;
  }
  return cpu.size > 0 ? cpu : undefined;
}

// drain forwards n stored deliveries to the destination "app" (an HTTP URL, or a broker's settings) and
// times it; beside it, when asked, a lane of its own for the destination "down", which is down, started
// before the timing so that its breaker opens within it. Without that lane, down's rows just wait.
async function drain(
  target: string,
  app: string | Record<string, unknown>,
  n: number,
  withDown: boolean,
  sink: Child | undefined,
  t?: Tree,
): Promise<Run> {
  const { connect, forward, loadDestinations } = t ?? {
    connect: connectHere,
    forward: forwardHere,
    loadDestinations: loadHere,
  };
  const name = `bench-forward-${process.pid}`;
  let commits = 0;
  // On SQLite, the connection worker.ts gives its forwarding lanes: an fdatasync of its own, off the event loop.
  const pg = target.startsWith("postgres");
  const inbox = await connect(pg ? `${target}&application_name=${name}` : target, {
    onCommit: () => void commits++,
    ...(pg ? {} : { syncOffLoop: true }),
  });
  const senders = new Map<string, Sender>();
  try {
    // Alone or beside a down one, the same rows: each delivery routed to both, so that only the down lane differs.
    await fill(inbox, n, typeof app === "string" ? ["app", "down"] : ["app"]);
    const settings =
      typeof app === "string"
        ? { url: app, secret: SECRET, maxInFlight: CONCURRENCY }
        : { ...app, maxInFlight: CONCURRENCY };
    const forwarding = loadDestinations(
      { $destinations: { app: settings } },
      {},
      { brokerCheck: (d, s, where) => void parseBrokerDestination(d, s, where) },
    );
    if (typeof app !== "string") senders.set("app", brokerSender(parseBrokerDestination("app", settings, "app")));
    const down = loadDestinations(
      { $destinations: { down: { url: "http://127.0.0.1:1/", secret: SECRET, maxInFlight: CONCURRENCY } } },
      {},
    );
    const stop = new AbortController();
    const beside = withDown
      ? forward({ inbox, forwarding: down, signal: stop.signal, log: () => {} })
      : Promise.resolve();
    const db0 = await backendCpuMs(inbox, name);
    commits = 0;
    let done = 0;
    const run = await timed(n, sink, async () => {
      done = (await forward({ inbox, forwarding, senders, once: true, log: () => {} })).done;
    });
    run.commits = commits / n;
    const db1 = await backendCpuMs(inbox, name);
    if (db0 && db1) run.dbUs = ([...db1].reduce((sum, [pid, ms]) => sum + ms - (db0.get(pid) ?? 0), 0) * 1000) / n;
    stop.abort();
    await beside;
    if (done !== n) throw new Error(`forward: expected ${n} done, got ${done}`);
    return run;
  } finally {
    for (const sender of senders.values()) await sender.close();
    await inbox.close();
  }
}

/** Jet is the NATS JetStream side of the bench: fresh streams, and the official client's own loop. */
interface Jet {
  /** fresh makes a stream of its own and returns a subject template it captures. */
  fresh(): Promise<string>;
  /** raw publishes n bodies with js.publish at CONCURRENCY, each awaiting its PubAck, as a forward would send them. */
  raw(n: number): Promise<Run>;
  close(): Promise<void>;
}

// jet connects to NATS, or says in one line why the JetStream rows are left out.
async function jet(): Promise<Jet | undefined> {
  if (process.env.BENCH_NATS === "0") return undefined;
  const { connect: natsConnect, headers } = await import("@nats-io/transport-node");
  const { jetstream, jetstreamManager } = await import("@nats-io/jetstream");
  let nc: Awaited<ReturnType<typeof natsConnect>>;
  try {
    nc = await natsConnect({ servers: NATS, reconnect: false, timeout: 2_000 });
  } catch (error) {
    console.log(
      `  JetStream: no NATS at ${NATS} (${error instanceof Error ? error.message : String(error)}), left out`,
    );
    return undefined;
  }
  const jsm = await jetstreamManager(nc);
  const js = jetstream(nc);
  const tag = `benchfw${process.pid}`;
  const streams: string[] = [];
  const fresh = async () => {
    const name = `BENCH_FW_${process.pid}_${streams.length}`;
    streams.push(name);
    await jsm.streams.add({ name, subjects: [`${tag}${streams.length}.>`] });
    return `${tag}${streams.length}`;
  };
  return {
    fresh: async () => `${await fresh()}.{source}.{type}`,
    raw: async (n) => {
      const prefix = await fresh();
      let next = 0;
      return timed(n, undefined, async () => {
        await Promise.all(
          Array.from({ length: CONCURRENCY }, async () => {
            for (let i = next++; i < n; i = next++) {
              const h = headers();
              h.set(HEADERS.source, "default");
              h.set(HEADERS.id, `fw_${i}`);
              h.set(HEADERS.attempt, "1");
              h.set("Content-Type", "application/json");
              await js.publish(`${prefix}.default._`, bodyOf(i), {
                msgID: messageId("app", { source: "default", id: `fw_${i}`, replays: 0 }),
                headers: h,
              });
            }
          }),
        );
      });
    },
    close: async () => {
      for (const name of streams) await jsm.streams.delete(name).catch(() => {});
      await nc.close();
    },
  };
}

async function postgresTarget(): Promise<{ url: string; drop: () => Promise<void> } | undefined> {
  if (process.env.BENCH_POSTGRES === "0") return undefined;
  const pg = (await import("pg")).default;
  const schema = `bench_forward_${process.pid}_${Math.floor(Math.random() * 1e6)}`;
  const client = new pg.Client({ connectionString: POSTGRES, connectionTimeoutMillis: 2_000 });
  try {
    await client.connect();
  } catch {
    return undefined;
  }
  return {
    url: `${POSTGRES}?schema=${schema}`,
    drop: async () => {
      await client.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
      await client.end();
    },
  };
}

/** forwardBench runs the baseline and both forwarding drains on each backend, and returns the summary. */
export async function forwardBench(): Promise<string> {
  const { loadavg } = await import("node:os");
  const avg = () =>
    loadavg()
      .map((x) => x.toFixed(1))
      .join(", ");
  console.log(
    `forward: ${BACKLOG} bodies to a bare node:http destination at concurrency ${CONCURRENCY}, ${ROUNDS} rounds after a warm-up (load average ${avg()})`,
  );
  const sink = await startChild("bench/bare.ts", []);
  const { dir, cleanup } = tempDir();
  const lines: string[] = [];
  let js: Jet | undefined;
  try {
    const targets: [string, () => Promise<{ target: string; drop: () => Promise<void> }>][] = [
      ["sqlite", async () => ({ target: join(dir, `forward-${Math.random()}.db`), drop: async () => {} })],
    ];
    const pg = await postgresTarget();
    if (pg) await pg.drop();
    else console.log("  postgres: not reachable (or BENCH_POSTGRES=0), left out");
    if (pg)
      targets.push([
        "postgres",
        async () => {
          const p = (await postgresTarget())!;
          return { target: p.url, drop: p.drop };
        },
      ]);
    const measure = async (
      make: () => Promise<{ target: string; drop: () => Promise<void> }>,
      n: number,
      withDown: boolean,
      to: string | Record<string, unknown> = sink.url,
      code?: Tree,
    ) => {
      const t = await make();
      try {
        return await drain(t.target, to, n, withDown, typeof to === "string" ? sink : undefined, code);
      } finally {
        await t.drop();
      }
    };
    const other = COMPARE ? await tree(COMPARE) : undefined;
    if (other)
      console.log(
        `  BENCH_COMPARE: ${other.name} (${resolve(COMPARE!)}) forwards each backend's backlog right after this tree`,
      );
    js = await jet();
    const nats = async () => ({ type: "nats", url: NATS, subject: await js!.fresh() });
    // The warm-up: undici, the forwarder and each backend's code get compiled before anything is timed.
    await loop(sink.url, WARMUP, sink);
    for (const [, make] of targets) await measure(make, WARMUP, false);
    if (other) for (const [, make] of targets) await measure(make, WARMUP, false, sink.url, other);
    if (js) {
      await js.raw(WARMUP);
      await measure(targets[0]![1], WARMUP, false, await nats());
    }
    const loops: Run[] = [];
    const raws: Run[] = [];
    const runs = new Map<string, { alone: Run[]; beside: Run[]; jet: Run[]; other: Run[] }>(
      targets.map(([name]) => [name, { alone: [], beside: [], jet: [], other: [] }]),
    );
    const show = (label: string, r: Run, extra = "") =>
      console.log(
        `  ${label.padEnd(36)}: ${f(r.rate).padStart(6)}/s  ${f(r.cpuUs)} µs CPU each` +
          (r.sinkUs !== undefined ? `, destination ${f(r.sinkUs)} µs` : "") +
          (r.dbUs !== undefined ? `, PostgreSQL ${f(r.dbUs)} µs` : "") +
          (r.commits !== undefined ? `, ${f(r.commits, 3)} commits` : "") +
          extra,
      );
    for (let round = 1; round <= ROUNDS; round++) {
      console.log(` round ${round} (load average ${avg()})`);
      const base = await loop(sink.url, BACKLOG, sink);
      loops.push(base);
      show("plain undici loop", base);
      for (const [name, make] of targets) {
        for (const withDown of [false, true]) {
          const r = await measure(make, BACKLOG, withDown);
          runs.get(name)![withDown ? "beside" : "alone"].push(r);
          show(
            `${name} forward${withDown ? ", beside a down one" : ""}`,
            r,
            `  ×${f(r.rate / base.rate, 2)} of the loop`,
          );
          if (withDown || !other) continue;
          const o = await measure(make, BACKLOG, false, sink.url, other);
          runs.get(name)!.other.push(o);
          show(`${name} forward [${other.name}]`, o, `  ×${f(o.rate / base.rate, 2)} of the loop`);
        }
      }
      if (!js) continue;
      const raw = await js.raw(BACKLOG);
      raws.push(raw);
      show("JetStream: @nats-io publish loop", raw);
      for (const [name, make] of targets) {
        const r = await measure(make, BACKLOG, false, await nats());
        runs.get(name)!.jet.push(r);
        show(`${name} forward into JetStream`, r, `  ×${f(r.rate / raw.rate, 2)} of the loop`);
      }
    }
    const m = (rs: Run[], key: keyof Run) => median(rs.map((r) => r[key] as number));
    lines.push(
      `forward loop: ${f(m(loops, "rate"))}/s, ${f(m(loops, "cpuUs"))} µs CPU a request (median of ${ROUNDS}; load average ${avg()})`,
    );
    for (const [name] of targets) {
      const { alone, beside } = runs.get(name)!;
      const ofLoop = median(alone.map((r, i) => r.rate / loops[i]!.rate));
      const ofAlone = median(beside.map((r, i) => r.rate / alone[i]!.rate));
      const db = alone[0]!.dbUs !== undefined ? `, PostgreSQL ${f(m(alone, "dbUs"))} µs` : "";
      lines.push(
        `forward ${name}: ${f(m(alone, "rate"))}/s = ×${f(ofLoop, 2)} of a plain undici loop (target ≥ 0.5), ${f(m(alone, "cpuUs"))} µs CPU a forward${db}, ` +
          `${f(m(alone, "commits"), 3)} commits a forward; beside a down destination ${f(m(beside, "rate"))}/s = ×${f(ofAlone, 2)} of alone (target ≥ 0.9), ${f(m(beside, "cpuUs"))} µs CPU a forward`,
      );
      const o = runs.get(name)!.other;
      if (other && o.length > 0) {
        const ratio = (key: keyof Run) =>
          f(median(alone.map((r, i) => (r[key] as number) / (o[i]![key] as number))), 2);
        lines.push(
          `forward ${name} against ${other.name} (median of the rounds' ratios): CPU a forward ×${ratio("cpuUs")} (${f(m(alone, "cpuUs"))} against ${f(m(o, "cpuUs"))} µs)` +
            (alone[0]!.dbUs !== undefined
              ? `, PostgreSQL's ×${ratio("dbUs")} (${f(m(alone, "dbUs"))} against ${f(m(o, "dbUs"))} µs)`
              : "") +
            `, rate ×${ratio("rate")}`,
        );
      }
      const j = runs.get(name)!.jet;
      if (j.length > 0) {
        lines.push(
          `forward ${name} into JetStream: ${f(m(j, "rate"))}/s = ×${f(median(j.map((r, i) => r.rate / raws[i]!.rate)), 2)} of the @nats-io publish loop ` +
            `(${f(m(raws, "rate"))}/s, ${f(m(raws, "cpuUs"))} µs CPU a publish; target ≥ 0.5), ${f(m(j, "cpuUs"))} µs CPU a forward`,
        );
      }
    }
  } finally {
    await js?.close();
    await sink.stop();
    cleanup();
  }
  return lines.join("\n");
}

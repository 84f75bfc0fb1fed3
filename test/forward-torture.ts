// test/forward-torture.ts: forwarding on PostgreSQL under torture, for test/forward-torture.test.ts (short)
// and test/torture.ts (long, TORTURE_FORWARD_SECONDS). Four forwarding workers (test/fixtures/forward-worker.ts)
// share one schema and eight HTTP destinations that fail, hang, throttle, come back, count with a token
// bucket of their own, and answer slower than a third of the lease (so heartbeats matter), while workers
// are SIGKILLed and restarted and their connections ended with pg_terminate_backend at random. Then it
// lets them drain and reads what each destination accepted. Not a test file of its own.

import type { ChildProcess } from "node:child_process";
import { once } from "node:events";
import { writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import { join } from "node:path";
import pg from "pg";
import { connect } from "../inbox.ts";
import type { Random } from "./chaos.ts";
import { spawnScript } from "./helpers.ts";

export interface ForwardTortureOptions {
  /** A postgres:// URL with its own ?schema=. */
  url: string;
  dir: string;
  deliveries: number;
  workers: number;
  /** How long the chaos lasts; then the workers drain what is left, unharmed. */
  seconds: number;
  killEveryMs: number;
  terminateEveryMs: number;
  leaseMs: number;
  random: Random;
}

/** DestinationSeen is what one destination saw: requests, deliveries it accepted (2xx) and how many twice, refusals by its bucket. */
export interface DestinationSeen {
  name: string;
  requests: number;
  accepted: number;
  acceptedTwice: number;
  refusedByBucket: number;
}

export interface ForwardTortureReport {
  deliveries: number;
  destinations: DestinationSeen[];
  kills: number;
  terminations: number;
  /** Workers that exited without being killed (each with the end of its log). */
  unexpectedExits: string[];
  /** 40P01s the workers logged ("deadlock detected"), and those the server counted meanwhile (every database on it). */
  deadlocksLogged: number;
  serverDeadlocks: number;
  /** Rows not done when the drain ended. */
  notDone: number;
  drained: boolean;
  /** Each destination's maxInFlight, summed: the most forwards one SIGKILL can leave answered but not marked, twice over (see docs/forwarding.md). */
  inFlightPerWorker: number;
}

const SECRET = `whsec_${Buffer.from("forward torture").toString("base64")}`;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

type Behaviour = (
  id: string,
  n: number,
  elapsedMs: number,
) => { status: number; afterMs?: number; headers?: Record<string, string> } | "hang";

export async function forwardTorture(o: ForwardTortureOptions): Promise<ForwardTortureReport> {
  const started = performance.now();
  const downFor = (o.seconds * 1000) / 3;
  // Low enough that one token's time (100 ms) outlasts a loaded machine's delays between a permit and the arrival.
  const rate = { perSecond: 10, burst: 3 };
  let tokens = rate.burst;
  let tokensAt = performance.now();
  const behaviours: Record<string, Behaviour> = {
    steady: () => ({ status: 200, afterMs: 5 }),
    // Every third delivery fails twice before it gets through.
    flaky: (id, n) => (hash(id) % 3 === 0 && n <= 2 ? { status: 500 } : { status: 200 }),
    // One request in ten hangs past the destination's timeout.
    hanging: (id, n) => (hash(id + n) % 10 === 0 ? "hang" : { status: 200 }),
    throttled: (id, n) => (hash(id + n) % 5 === 0 ? { status: 429, headers: { "retry-after": "1" } } : { status: 200 }),
    // Counts with a bucket of its own, of the rate and burst the sources file gives it.
    rated: () => {
      const now = performance.now();
      tokens = Math.min(rate.burst, tokens + ((now - tokensAt) * rate.perSecond) / 1000);
      tokensAt = now;
      if (tokens < 1) return { status: 429 };
      tokens--;
      return { status: 200 };
    },
    // Down for the first third of the chaos, then back.
    comeback: (_id, _n, elapsed) => (elapsed < downFor ? { status: 503 } : { status: 200 }),
    // Slower than a third of the lease: only the heartbeat keeps the lease while it answers.
    slow: () => ({ status: 200, afterMs: Math.round(o.leaseMs / 3 + 200) }),
    jittery: (id, n) => ({ status: 200, afterMs: hash(id + n) % 300 }),
  };
  const seen = new Map<string, DestinationSeen & { counts: Map<string, number>; okCounts: Map<string, number> }>();
  const servers: Server[] = [];
  const urls: Record<string, string> = {};
  for (const [name, behave] of Object.entries(behaviours)) {
    const s = {
      name,
      requests: 0,
      accepted: 0,
      acceptedTwice: 0,
      refusedByBucket: 0,
      counts: new Map<string, number>(),
      okCounts: new Map<string, number>(),
    };
    seen.set(name, s);
    const server = createServer((req, res) => {
      req.resume().on("end", () => {
        const id = String(req.headers["webhook-id"]);
        const n = (s.counts.get(id) ?? 0) + 1;
        s.counts.set(id, n);
        s.requests++;
        const answer = behave(id, n, performance.now() - started);
        if (answer === "hang") return;
        if (name === "rated" && answer.status === 429) s.refusedByBucket++;
        setTimeout(() => {
          if (answer.status < 300) s.okCounts.set(id, (s.okCounts.get(id) ?? 0) + 1);
          res.writeHead(answer.status, answer.headers).end();
        }, answer.afterMs ?? 0);
      });
    });
    server.listen(0, "127.0.0.1");
    await once(server, "listening");
    servers.push(server);
    urls[name] = `http://127.0.0.1:${(server.address() as { port: number }).port}/`;
  }
  const maxInFlight = 4;
  const sources = join(o.dir, "torture-sources.json");
  writeFileSync(
    sources,
    JSON.stringify({
      $destinations: Object.fromEntries(
        Object.keys(behaviours).map((name) => [
          name,
          {
            url: urls[name],
            secret: SECRET,
            maxInFlight,
            timeout: name === "hanging" ? 1 : 5,
            breaker: { failures: 20, coolDown: 0.3, window: 2 },
            ...(name === "rated" ? { rate: rate.perSecond, burst: rate.burst } : {}),
          },
        ]),
      ),
    }),
  );

  const appName = `inbox-torture-${process.pid}`;
  const url = new URL(o.url);
  url.searchParams.set("application_name", appName);
  const target = url.toString();
  const inbox = await connect(o.url);
  const names = Object.keys(behaviours);
  await Promise.all(
    Array.from({ length: o.deliveries }, (_, i) =>
      inbox.store({
        source: "torture",
        id: `evt_${i}`,
        body: Buffer.from(JSON.stringify({ i })),
        contentType: "application/json",
        destinations: names,
      }),
    ),
  );

  const admin = new pg.Client({ connectionString: o.url.replace(/\?.*$/, "") });
  await admin.connect();
  const serverDeadlocks = async () =>
    Number((await admin.query("SELECT sum(deadlocks) AS n FROM pg_stat_database")).rows[0].n);
  const deadlocksBefore = await serverDeadlocks();

  const report = { kills: 0, terminations: 0, unexpectedExits: [] as string[], deadlocksLogged: 0 };
  const workers = new Set<{ child: ChildProcess; killed: boolean; log: string }>();
  const spawnWorker = () => {
    const w = {
      child: spawnScript("test/fixtures/forward-worker.ts", [
        "--db",
        target,
        "--sources",
        sources,
        "--lease-ms",
        String(o.leaseMs),
        "--log",
      ]),
      killed: false,
      log: "",
    };
    w.child.stdout!.resume();
    w.child.stderr!.on("data", (d: Buffer) => {
      const text = d.toString();
      report.deadlocksLogged += text.match(/deadlock detected/g)?.length ?? 0;
      w.log = (w.log + text).slice(-4_000);
    });
    w.child.on("exit", (code, signal) => {
      workers.delete(w);
      if (!w.killed) report.unexpectedExits.push(`exit ${code ?? signal}: ${w.log.slice(-1_000)}`);
    });
    workers.add(w);
  };
  const notDone = async () =>
    Number((await inbox.query("SELECT count(*) AS n FROM deliveries WHERE status <> 'done'"))[0]!.n);
  try {
    for (let i = 0; i < o.workers; i++) spawnWorker();
    const chaosUntil = performance.now() + o.seconds * 1000;
    let nextKill = performance.now() + o.killEveryMs * (0.5 + o.random());
    let nextTerminate = performance.now() + o.terminateEveryMs * (0.5 + o.random());
    while (performance.now() < chaosUntil) {
      await sleep(50);
      if (o.killEveryMs > 0 && performance.now() >= nextKill) {
        const victim = [...workers][Math.floor(o.random() * workers.size)];
        if (victim) {
          victim.killed = true;
          victim.child.kill("SIGKILL");
          report.kills++;
          spawnWorker();
        }
        nextKill = performance.now() + o.killEveryMs * (0.5 + o.random());
      }
      if (o.terminateEveryMs > 0 && performance.now() >= nextTerminate) {
        const { rows } = await admin.query(
          "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) AS n FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()",
          [appName],
        );
        report.terminations += Number(rows[0].n);
        nextTerminate = performance.now() + o.terminateEveryMs * (0.5 + o.random());
      }
    }
    // The drain: no more chaos, at most two minutes, or as long as the chaos lasted if longer.
    const drainUntil = performance.now() + Math.max(120_000, o.seconds * 1000);
    while (performance.now() < drainUntil && (await notDone()) > 0) await sleep(100);
    const left = await notDone();
    for (const w of workers) w.killed = true;
    for (const w of [...workers]) w.child.kill("SIGTERM");
    while (workers.size > 0) await sleep(50);
    const destinations = [...seen.values()].map(({ counts: _c, okCounts, ...s }) => ({
      ...s,
      accepted: okCounts.size,
      acceptedTwice: [...okCounts.values()].reduce((n, c) => n + c - 1, 0),
    }));
    return {
      deliveries: o.deliveries,
      destinations,
      ...report,
      serverDeadlocks: (await serverDeadlocks()) - deadlocksBefore,
      notDone: left,
      drained: left === 0,
      inFlightPerWorker: maxInFlight * names.length,
    };
  } finally {
    for (const w of workers) {
      w.killed = true;
      w.child.kill("SIGKILL");
    }
    await admin.end().catch(() => {});
    await inbox.close();
    for (const server of servers) {
      server.closeAllConnections();
      server.close();
    }
  }
}

// hash spreads a string over whole numbers, the same for the same string in every run.
function hash(s: string): number {
  let h = 2166136261;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 16777619) >>> 0;
  return h;
}

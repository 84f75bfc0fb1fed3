// bench/forward.ts: what forwarding costs, against baselines measured in the same run. A bare node:http
// destination (bench/bare.ts, a child process) takes BENCH_FORWARD_BACKLOG (20k) bodies: first from a
// plain undici loop POSTing them at BENCH_FORWARD_CONCURRENCY (32), then forwarded from the inbox at the
// same concurrency, then again while a second destination is down (its connections refused). Prints the
// rates and the two ratios the issue asks for (target: forwarding ≥ 0.5× the loop; beside a down one ≥ 0.9×
// alone). SQLite, and PostgreSQL too unless BENCH_POSTGRES=0 or none is reachable.
//   npm run bench -- forward          BENCH_FORWARD_BACKLOG=5000 npm run bench -- forward

import { join } from "node:path";
import { Agent, request } from "undici";
import { forward } from "../forwarder.ts";
import { connect } from "../inbox.ts";
import { loadDestinations } from "../routes.ts";
import type { Inbox } from "../store.ts";
import { f, knob, startChild, tempDir } from "./common.ts";

const BACKLOG = knob("BENCH_FORWARD_BACKLOG", 20_000);
const CONCURRENCY = knob("BENCH_FORWARD_CONCURRENCY", 32);
const SECRET = `whsec_${Buffer.from("bench forwarding secret").toString("base64")}`;
const POSTGRES = process.env.INBOX_TEST_POSTGRES ?? "postgres://postgres@127.0.0.1:5432/test";

const bodyOf = (i: number) => Buffer.from(JSON.stringify({ type: "payment.succeeded", customer: `c${i % 1000}`, amount: (i % 100) + 1 }));

// loop is the baseline: CONCURRENCY loops POST the same bodies with undici, one request each at a time.
async function loop(url: string): Promise<number> {
  const agent = new Agent({ connections: CONCURRENCY });
  let next = 0;
  const started = performance.now();
  await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
    for (let i = next++; i < BACKLOG; i = next++) {
      const res = await request(url, { method: "POST", dispatcher: agent, body: bodyOf(i), headers: { "content-type": "application/json" } });
      await res.body.dump();
      if (res.statusCode !== 200) throw new Error(`baseline: HTTP ${res.statusCode}`);
    }
  }));
  const ms = performance.now() - started;
  await agent.close();
  return (BACKLOG / ms) * 1000;
}

// fill stores the backlog through the inbox itself, each delivery routed to the given destinations.
async function fill(inbox: Inbox, destinations: string[]): Promise<void> {
  for (let start = 0; start < BACKLOG; start += 1_000) {
    await Promise.all(Array.from({ length: Math.min(1_000, BACKLOG - start) }, (_, k) =>
      inbox.store({ id: `fw_${start + k}`, body: bodyOf(start + k), contentType: "application/json", destinations })));
  }
}

// drain forwards the app's backlog and times it; beside it, when asked, a lane of its own for a destination
// that is down, as a second worker process would run it.
async function drain(target: string, url: string, withDown: boolean): Promise<number> {
  const inbox = await connect(target);
  try {
    await fill(inbox, withDown ? ["app", "down"] : ["app"]);
    const app = loadDestinations({ $destinations: { app: { url, secret: SECRET, maxInFlight: CONCURRENCY } } }, {});
    const down = loadDestinations({ $destinations: { down: { url: "http://127.0.0.1:1/", secret: SECRET, maxInFlight: CONCURRENCY } } }, {});
    const stop = new AbortController();
    const beside = withDown ? forward({ inbox, forwarding: down, signal: stop.signal, log: () => {} }) : Promise.resolve();
    const started = performance.now();
    const stats = await forward({ inbox, forwarding: app, once: true, log: () => {} });
    const ms = performance.now() - started;
    stop.abort();
    await beside;
    if (stats.done !== BACKLOG) throw new Error(`forward: expected ${BACKLOG} done, got ${JSON.stringify(stats)}`);
    return (BACKLOG / ms) * 1000;
  } finally {
    await inbox.close();
  }
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
  console.log(`forward: ${BACKLOG} bodies to a bare node:http destination at concurrency ${CONCURRENCY}`);
  const sink = await startChild("bench/bare.ts", []);
  const { dir, cleanup } = tempDir();
  const lines: string[] = [];
  try {
    const base = await loop(sink.url);
    console.log(`  plain undici loop          : ${f(base)}/s`);
    const targets: [string, () => Promise<{ target: string; drop: () => Promise<void> }>][] = [
      ["sqlite", async () => ({ target: join(dir, `forward-${Math.random()}.db`), drop: async () => {} })],
    ];
    const pg = await postgresTarget();
    if (pg) await pg.drop();
    if (pg) targets.push(["postgres", async () => {
      const p = (await postgresTarget())!;
      return { target: p.url, drop: p.drop };
    }]);
    for (const [name, make] of targets) {
      const rates: number[] = [];
      for (const withDown of [false, true]) {
        const t = await make();
        try {
          rates.push(await drain(t.target, sink.url, withDown));
        } finally {
          await t.drop();
        }
        console.log(`  ${name} forward${withDown ? ", beside a down one" : ""}`.padEnd(29) + `: ${f(rates.at(-1)!)}/s`);
      }
      const [alone, beside] = rates as [number, number];
      lines.push(`forward ${name}: ${f(alone)}/s = ×${f(alone / base, 2)} of a plain undici loop (${f(base)}/s; target ≥ 0.5); beside a down destination ${f(beside)}/s = ×${f(beside / alone, 2)} of alone (target ≥ 0.9)`);
    }
  } finally {
    await sink.stop();
    cleanup();
  }
  return lines.join("\n");
}

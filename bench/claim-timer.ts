// bench/claim-timer.ts: times the claims and the finishes of a PostgreSQL worker, for bench/backlog.ts.
// Loaded before the script it measures, it wraps PostgresInbox's claim and finish statements and, at
// exit, writes one JSON line per call to BENCH_CLAIM_LOG: kind ("claim" or "finish"), ms since start,
// the round trip in ms, and how many deliveries it leased or marked done:
//   BENCH_CLAIM_LOG=/tmp/claims.jsonl npx node --import tsx --import ./bench/claim-timer.ts worker.ts --once --db postgres://…

import { writeFileSync } from "node:fs";
import { PostgresInbox } from "../lib/postgres/postgres.ts";

const out = process.env.BENCH_CLAIM_LOG;
if (!out) throw new TypeError("bench/claim-timer.ts: expected BENCH_CLAIM_LOG to name the file to write, got nothing");
const calls: [string, number, number, number][] = [];
const started = performance.now();
type Method = (...args: unknown[]) => Promise<unknown[] | Map<unknown, unknown>>;
const proto = PostgresInbox.prototype as unknown as Record<string, Method>;
// claimIn and finishAll are the statements on their connection, without the wait for a free one: what
// grows with the drain, if anything does, is the database's work for them.
for (const [kind, name] of [
  ["claim", "claimIn"],
  ["finish", "finishAll"],
] as const) {
  const original = proto[name];
  if (typeof original !== "function") throw new TypeError(`bench/claim-timer.ts: PostgresInbox has no ${name} to time`);
  proto[name] = async function timed(this: unknown, ...args: unknown[]) {
    const t0 = performance.now();
    const result = await original.apply(this, args);
    calls.push([kind, t0 - started, performance.now() - t0, Array.isArray(result) ? result.length : result.size]);
    return result;
  };
}
process.on("exit", () => writeFileSync(out, calls.map((c) => JSON.stringify(c)).join("\n") + "\n"));

// bench/ordered.ts: what per-key ordering costs a worker. In one run, the same backlog of BENCH_LARGE
// (200k) deliveries drained unordered, then spread over BENCH_ORDER_KEYS (10k) keys, with the record-
// payment handler at BENCH_CONCURRENCY (128); then the same backlog on one key, where nothing may run
// at once, timed over its first and its last BENCH_ORDER_SAMPLE (2,000) deliveries to show the claim's
// cost does not grow with the key's backlog. Prints the rates, their ratio, and µs per delivery.
//   npm run bench -- ordered         BENCH_LARGE=200000 BENCH_ORDER_KEYS=10000 BENCH_ORDER_SAMPLE=2000

import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { pathToFileURL } from "node:url";
import { SqliteInbox } from "../lib/sqlite/sqlite.ts";
import { ensurePayments, recordPayment, run, type Job } from "../worker.ts";
import { f, fillBacklog, flushFill, knob, tempDir } from "./common.ts";
import { drainChild } from "./worker.ts";

const LARGE = knob("BENCH_LARGE", 200_000);
const KEYS = knob("BENCH_ORDER_KEYS", 10_000);
const SAMPLE = knob("BENCH_ORDER_SAMPLE", 2_000);
const CONCURRENCY = knob("BENCH_CONCURRENCY", 128);

// orderBacklog gives a filled backlog order keys (round robin over `keys`) and event times shuffled
// against arrival, as providers deliver them, then builds each key's head the way store() would have.
function orderBacklog(path: string, keys: number): void {
  const db = new DatabaseSync(path);
  db.exec("PRAGMA synchronous = OFF"); // only while filling a throwaway bench database
  db.exec("BEGIN");
  db.prepare(
    `UPDATE deliveries SET order_key = 'key' || (rowid % ?), event_time = available_at - ((rowid * 7919) % 1000)`,
  ).run(BigInt(keys));
  db.exec(`INSERT INTO order_keys (source, order_key, head_id, head_event_time, head_seq, due)
           SELECT source, order_key, id, event_time, rowid, available_at FROM (
             SELECT source, order_key, id, event_time, rowid, available_at,
                    row_number() OVER (PARTITION BY source, order_key ORDER BY event_time, rowid) AS n
             FROM deliveries) WHERE n = 1`);
  db.exec("COMMIT");
  db.exec("PRAGMA wal_checkpoint(TRUNCATE)");
  db.close();
  flushFill(path);
}

// drainSome runs the worker on the one-key inbox until `count` deliveries are done (or it is empty),
// and returns the ms and CPU ms it took and the most handlers that ever ran at once. CPU is the claim's
// cost without the fsync each one-at-a-time delivery waits for.
async function drainSome(
  inbox: SqliteInbox,
  count: number,
): Promise<{ ms: number; cpuMs: number; done: number; most: number }> {
  const stop = new AbortController();
  let [running, most, done] = [0, 0, 0];
  const handler = (job: Job) => {
    running++;
    most = Math.max(most, running);
    recordPayment(job);
    // Counted as running until the next turn, so that two handlers of one key overlapping would show.
    return new Promise<void>((resolve) =>
      setImmediate(() => {
        running--;
        if (++done >= count) stop.abort();
        resolve();
      }),
    );
  };
  const [t0, cpu0] = [performance.now(), process.cpuUsage()];
  await run(handler, { inbox, once: true, concurrency: CONCURRENCY, signal: stop.signal, log: () => {} });
  const cpu = process.cpuUsage(cpu0);
  return { ms: performance.now() - t0, cpuMs: (cpu.user + cpu.system) / 1000, done, most };
}

/** ordered runs the three drains and returns the one-line summary. */
export async function ordered(): Promise<string> {
  const { dir, cleanup } = tempDir();
  console.log(
    `ordered: backlog of ${LARGE}, unordered vs over ${KEYS} keys vs one key, concurrency ${CONCURRENCY}, record-payment handler`,
  );
  try {
    const rates: number[] = [];
    for (const keys of [0, KEYS]) {
      const path = join(dir, `ordered-${keys}.db`);
      fillBacklog(path, LARGE);
      if (keys > 0) orderBacklog(path, keys);
      const d = await drainChild(path, CONCURRENCY);
      if (d.done !== LARGE) throw new Error(`expected ${LARGE} done, got ${d.done} (failed ${d.failed})`);
      rates.push((d.done / d.ms) * 1000);
      console.log(
        `  ${keys === 0 ? "unordered" : `over ${keys} keys`}`.padEnd(18) +
          `: drained in ${f(d.ms / 1000, 2)} s = ${f(rates.at(-1)!)} deliveries/s`,
      );
    }
    const [unordered, spread] = rates as [number, number];

    const path = join(dir, "ordered-one.db");
    fillBacklog(path, LARGE);
    orderBacklog(path, 1);
    const inbox = new SqliteInbox(path);
    await ensurePayments(inbox);
    const first = await drainSome(inbox, SAMPLE);
    // Skip to the end of the drain: all but the last SAMPLE marked done in event-time order, as if
    // drained, and the key's head moved on as a finish would have moved it.
    inbox.db.exec("BEGIN");
    inbox.db
      .prepare(`UPDATE deliveries SET status = 'done', finished_at = 0 WHERE rowid IN (
                        SELECT rowid FROM deliveries WHERE status = 'received' AND order_key = 'key0'
                        ORDER BY event_time, rowid LIMIT ?)`)
      .run(Math.max(0, LARGE - 2 * SAMPLE));
    inbox.db.exec(`UPDATE order_keys SET (head_id, head_event_time, head_seq, due) =
                     (SELECT id, event_time, rowid, available_at FROM deliveries
                      WHERE source = 'default' AND order_key = 'key0' AND status = 'received' ORDER BY event_time, rowid LIMIT 1)`);
    inbox.db.exec("COMMIT");
    const last = await drainSome(inbox, SAMPLE);
    const left = (
      inbox.db.prepare("SELECT count(*) AS n FROM deliveries WHERE status <> 'done'").get() as { n: number }
    ).n;
    await inbox.close();
    if (left !== 0)
      throw new Error(`one key: ${left} deliveries left after the drain (${JSON.stringify([first, last])})`);
    const per = (d: typeof first) => [(d.ms * 1000) / d.done, (d.cpuMs * 1000) / d.done] as const;
    const [[usFirst, cpuFirst], [usLast, cpuLast]] = [per(first), per(last)];
    console.log(
      `  one key, first ${first.done}: ${f(usFirst)} µs per delivery (${f(cpuFirst)} µs CPU), at most ${first.most} running at once`,
    );
    console.log(
      `  one key, last ${last.done}:  ${f(usLast)} µs per delivery (${f(cpuLast)} µs CPU), at most ${last.most} running at once`,
    );
    return (
      `ordered: ${f(unordered)}/s unordered | ${f(spread)}/s over ${KEYS} keys = ×${f(spread / unordered, 2)} | ` +
      `one key of ${LARGE}, first → last ${SAMPLE}: ${f(usFirst)} → ${f(usLast)} µs per delivery (×${f(usLast / usFirst, 2)}), ` +
      `${f(cpuFirst)} → ${f(cpuLast)} µs CPU (×${f(cpuLast / cpuFirst, 2)}), at most ${Math.max(first.most, last.most)} at once`
    );
  } finally {
    cleanup();
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) console.log(await ordered());

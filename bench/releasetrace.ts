// bench/releasetrace.ts: why PostgreSQL's acks slow while a day is released. bench/purge.ts's day of
// BENCH_PURGE_ROWS (200,000) done deliveries of 1 KB, its bodies in a day's partition; acks paced at
// BENCH_PURGE_RATE (1000/s) into a receiver for BENCH_SECONDS before, all through a purge in a process started
// before (bench/purge-warm.ts), and BENCH_SECONDS after; meanwhile pg_stat_activity read every
// BENCH_RELEASETRACE_EVERY ms (3) for what the purge's connections are doing. Prints the ack p99 before, during and
// after, then each of the purge's statements (its first words) with how long it was seen and how many slow acks
// (over twice the p99 before) were sent while it ran, and the mount options of the file system under the
// server's data directory when it is on this machine (discard: docs/production.md#the-file-system).
//   BENCH_PURGE_ROWS=1000000 npm run bench -- releasetrace

import pg from "pg";
import { connect } from "../inbox.ts";
import { periodOf } from "../lib/postgres/periods.ts";
import { f, knob, mountOf, SECONDS, startChild, tempDir } from "./common.ts";
import { purgeChild, RATE, ROWS } from "./purge.ts";
import { fillPostgres } from "./stored.ts";
import { paced } from "./latency.ts";
import { inboxTargets } from "./targets.ts";

const EVERY = knob("BENCH_RELEASETRACE_EVERY", 3);
// The purge's connections name themselves so, and only they are traced.
const PURGE_APP = "bench_releasetrace_purge";

// Ack is one paced ack: when it was due, and how long it took from then.
interface Ack {
  at: number;
  ms: number;
}

const p99 = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(0.99 * (xs.length - 1))] ?? NaN;

export async function releasetrace(): Promise<string> {
  const target = (await inboxTargets()).find((t) => t.name === "PostgreSQL");
  if (!target) return "releasetrace: PostgreSQL not reachable, skipped";
  const { dir, cleanup } = tempDir();
  const { db, drop } = await target.fresh(dir, "releasetrace");
  try {
    const inbox = await connect(db);
    const day = periodOf(Date.now() - 8 * 86_400_000);
    await inbox.query(
      `CREATE TABLE ${day.name} PARTITION OF delivery_bodies FOR VALUES FROM (${day.from}) TO (${day.until})`,
    );
    await fillPostgres(inbox, ROWS, day.until - 1, 1, true);
    await inbox.close();
    const monitor = new pg.Client({ connectionString: db.replace(/\?.*$/, "") });
    await monitor.connect();
    const dataDir = (await monitor.query("SELECT current_setting('data_directory') AS d")).rows[0].d as string;
    const receiver = await startChild("receiver.ts", ["--port", "0", "--db", db, "--quiet"]);
    const purgeUrl = new URL(db);
    purgeUrl.searchParams.set("application_name", PURGE_APP);
    const running = purgeChild(purgeUrl.toString(), true);
    await running.ready;
    // Paced until stopped: BENCH_SECONDS before, the purge, BENCH_SECONDS after (an hour at most).
    let stop!: () => void;
    const stopped = new Promise<void>((resolve) => (stop = resolve));
    const pacing = paced(receiver.url, RATE, 3600, stopped);
    await new Promise((resolve) => setTimeout(resolve, SECONDS * 1000));
    const from = performance.now();
    running.go();
    let finished = false;
    void running.done.finally(() => (finished = true)).catch(() => {});
    // Each statement of the purge's, by its first words: when it was first and last seen running.
    const seen = new Map<string, { first: number; last: number; waits: Set<string> }>();
    while (!finished) {
      const { rows } = await monitor.query(
        `SELECT coalesce(wait_event_type || ':' || wait_event, '') AS wait,
                left(regexp_replace(query, '\\s+', ' ', 'g'), 60) AS query
           FROM pg_stat_activity
          WHERE datname = current_database() AND application_name = $1 AND state = 'active'`,
        [PURGE_APP],
      );
      const now = performance.now();
      for (const r of rows as { wait: string; query: string }[]) {
        const s = seen.get(r.query) ?? { first: now, last: now, waits: new Set<string>() };
        s.last = now;
        if (r.wait) s.waits.add(r.wait);
        seen.set(r.query, s);
      }
      await new Promise((resolve) => setTimeout(resolve, EVERY));
    }
    const until = performance.now();
    const { ms } = await running.done;
    await new Promise((resolve) => setTimeout(resolve, SECONDS * 1000));
    stop();
    const answered = await pacing;
    await receiver.stop();
    await monitor.end();
    const acks: Ack[] = Array.from(answered.inOrder, (ms, i) => ({ at: answered.start + (i * 1000) / RATE, ms }));

    const before = acks.filter((a) => a.at < from).map((a) => a.ms);
    const during = acks.filter((a) => a.at >= from && a.at < until).map((a) => a.ms);
    const after = acks.filter((a) => a.at >= until).map((a) => a.ms);
    const slowMs = 2 * p99(before);
    const slow = acks.filter((a) => a.at >= from && a.at < until && a.ms > slowMs);
    const lines = [
      `releasetrace: ${f(ROWS)} bodies of one day released in ${f(ms / 1000, 1)} s at ${f(RATE)} acks/s; data directory on ${mountOf(dataDir)}`,
      `  ack p99 before ${f(p99(before), 2)} ms, during ${f(p99(during), 2)} ms (×${f(p99(during) / p99(before), 2)}), after ${f(p99(after), 2)} ms; ${slow.length} of ${during.length} acks during over ${f(slowMs, 1)} ms`,
    ];
    const steps = [...seen.entries()].sort((a, b) => a[1].first - b[1].first);
    const placed = new Set<Ack>();
    for (const [query, s] of steps) {
      const within = slow.filter((a) => a.at >= s.first - EVERY && a.at <= s.last + EVERY);
      for (const a of within) placed.add(a);
      const inside = within.length;
      lines.push(
        `  +${f(s.first - from)} ms, seen ${f(s.last - s.first)} ms, ${inside} slow acks sent: ${query}${s.waits.size ? ` [${[...s.waits].join(", ")}]` : ""}`,
      );
    }
    lines.push(`  ${slow.length - placed.size} slow acks sent while no statement of the purge's was seen running`);
    return lines.join("\n");
  } finally {
    await drop();
    cleanup();
  }
}

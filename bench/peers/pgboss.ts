// bench/peers/pgboss.ts: pg-boss 12 as a peer, on a PostgreSQL database of its own (TARGET is its URL).
// Ingest: boss.send per POST, at 32 and 128 connections (its pool of 10). Drain: its fastest documented
// worker, work() with batchSize 500, localConcurrency 2 (one per core), burstWhenBatchFull, and
// transactional: true, so the payments of a batch, one row per job in one unnest insert, commit in the
// same transaction as the batch's completion.
//   npx tsx bench/peers/pgboss.ts serve|drain postgres://127.0.0.1:5432/bench_pgboss [N]

import { PgBoss, type Db, type Job as BossJob } from "pg-boss";
import pg from "pg";
import { PAYMENTS_SQL, backlogJob, main, payment, type Job } from "./shared.ts";

const QUEUE = "payments";
const BATCH = 500;
const LOCAL_CONCURRENCY = 2; // 4 measured no faster on these 2 cores

async function boss(target: string): Promise<PgBoss> {
  // No maintenance, no cron: only the queue itself runs during the measurement.
  const b = new PgBoss({ connectionString: target, supervise: false, schedule: false, max: 10 });
  b.on("error", (error) => console.error(`pg-boss: ${String(error)}`));
  await b.start();
  await b.createQueue(QUEUE);
  return b;
}

await main({
  async enqueue(target) {
    const b = await boss(target);
    return (job: Job) => b.send(QUEUE, job);
  },
  async fill(target, n) {
    const b = await boss(target);
    for (let start = 0; start < n; start += 5000) {
      const jobs = [];
      for (let i = start; i < Math.min(n, start + 5000); i++) jobs.push({ data: backlogJob(i) });
      await b.insert(QUEUE, jobs);
    }
    await b.stop({ graceful: false });
  },
  async drain(target, n) {
    const pool = new pg.Pool({ connectionString: target, max: 1 });
    await pool.query(PAYMENTS_SQL);
    const b = await boss(target);
    let handled = 0;
    let finished!: () => void;
    const all = new Promise<void>((resolve) => (finished = resolve));
    await b.work(
      QUEUE,
      {
        batchSize: BATCH,
        localConcurrency: LOCAL_CONCURRENCY,
        burstWhenBatchFull: true,
        pollingIntervalSeconds: 0.5,
        transactional: true,
      },
      async (jobs: BossJob<Job>[], tx: Db) => {
        const rows = jobs.map((j) => payment(j.data));
        await tx.executeSql(
          `INSERT INTO payments (source, delivery_id, customer, amount)
           SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::numeric[])`,
          [
            rows.map((r) => r.source),
            rows.map((r) => r.delivery_id),
            rows.map((r) => r.customer),
            rows.map((r) => r.amount),
          ],
        );
        if ((handled += jobs.length) >= n) finished();
      },
    );
    await all;
    // A graceful stop waits for the last batches' transactions to commit.
    await b.stop({ graceful: true });
    const { rows } = await pool.query<{ n: string }>("SELECT count(*) AS n FROM payments");
    await pool.end();
    if (Number(rows[0]!.n) !== n) throw new Error(`pg-boss: expected ${n} payments, got ${rows[0]!.n}`);
    return n;
  },
});

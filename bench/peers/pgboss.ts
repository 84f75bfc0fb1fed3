// bench/peers/pgboss.ts: pg-boss 10 as a peer, on a PostgreSQL database of its own (TARGET is its URL).
// Ingest: boss.send per POST. Drain: its fastest documented path, fetch(batchSize 500) in parallel
// loops (10.x has no localConcurrency option), and the payments insert plus complete() in one
// transaction through the `db` option, so a job's payment commits with its completion.
//   npx tsx bench/peers/pgboss.ts serve|drain postgres://127.0.0.1:5432/bench_pgboss [N]

import PgBoss from "pg-boss";
import pg from "pg";
import { PAYMENTS_SQL, backlogJob, main, payment, type Job } from "./shared.ts";

const QUEUE = "payments";
/** BATCH is the fetch's batchSize; LOOPS fetch at once, one connection each. */
const BATCH = 500;
const LOOPS = 2;

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
      for (let i = start; i < Math.min(n, start + 5000); i++) jobs.push({ name: QUEUE, data: backlogJob(i) });
      await b.insert(jobs);
    }
    await b.stop({ graceful: false, wait: true });
  },
  async drain(target, n) {
    const b = await boss(target);
    const pool = new pg.Pool({ connectionString: target, max: LOOPS });
    await pool.query(PAYMENTS_SQL);
    let done = 0;
    const loop = async () => {
      for (;;) {
        const jobs = await b.fetch<Job>(QUEUE, { batchSize: BATCH });
        if (jobs.length === 0) return;
        const rows = jobs.map((j) => payment(j.data));
        const client = await pool.connect();
        try {
          await client.query("BEGIN");
          await client.query(
            `INSERT INTO payments (source, delivery_id, customer, amount)
             SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::numeric[])`,
            [rows.map((r) => r.source), rows.map((r) => r.delivery_id), rows.map((r) => r.customer), rows.map((r) => r.amount)],
          );
          await b.complete(QUEUE, jobs.map((j) => j.id), { db: { executeSql: (text, values) => client.query(text, values) } });
          await client.query("COMMIT");
          done += jobs.length;
        } catch (error) {
          await client.query("ROLLBACK");
          throw error;
        } finally {
          client.release();
        }
      }
    };
    await Promise.all(Array.from({ length: LOOPS }, loop));
    await pool.end();
    await b.stop({ graceful: false, wait: true });
    if (done !== n) throw new Error(`pg-boss: expected ${n} done, got ${done}`);
    return done;
  },
});

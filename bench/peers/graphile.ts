// bench/peers/graphile.ts: graphile-worker 0.18 as a peer, on a PostgreSQL database of its own.
// Ingest: WorkerUtils.addJob per POST. Drain: the settings its performance page documents for
// throughput, a local queue that locks 500 jobs per fetch, completions batched (completeJobBatchDelay 0)
// and 24 jobs at once; the task inserts the payment with helpers.query, which commits on its own: a
// job's completion is a separate transaction that graphile-worker runs after the task resolves.
//   npx tsx bench/peers/graphile.ts serve|drain postgres://127.0.0.1:5432/bench_graphile [N]

import { Logger, makeWorkerUtils, run, runMigrations } from "graphile-worker";
import pg from "pg";
import { PAYMENTS_SQL, backlogJob, main, payment, type Job } from "./shared.ts";

const TASK = "record_payment";
const CONCURRENCY = 24;
// A line per job would be the fixture's cost, not the queue's: the inbox's rows run --quiet too.
const logger = new Logger(() => () => {});

await main({
  async enqueue(target) {
    const utils = await makeWorkerUtils({ connectionString: target, logger });
    await utils.migrate();
    return (job: Job) => utils.addJob(TASK, job);
  },
  async fill(target, n) {
    const utils = await makeWorkerUtils({ connectionString: target, logger });
    await utils.migrate();
    for (let start = 0; start < n; start += 5000) {
      const specs = [];
      for (let i = start; i < Math.min(n, start + 5000); i++) specs.push({ identifier: TASK, payload: backlogJob(i) });
      await utils.addJobs(specs);
    }
    await utils.release();
  },
  async drain(target, n) {
    const pool = new pg.Pool({ connectionString: target, max: 2 });
    await pool.query(PAYMENTS_SQL);
    await runMigrations({ connectionString: target, logger });
    let done = 0;
    let failed = 0;
    const runner = await run({
      connectionString: target,
      concurrency: CONCURRENCY,
      maxPoolSize: CONCURRENCY + 2,
      noHandleSignals: true,
      pollInterval: 100,
      logger,
      preset: { worker: { localQueue: { size: 500 }, completeJobBatchDelay: 0, failJobBatchDelay: 0 } },
      taskList: {
        [TASK]: async (raw, helpers) => {
          const p = payment(raw as Job);
          await helpers.query("INSERT INTO payments (source, delivery_id, customer, amount) VALUES ($1, $2, $3, $4)", [
            p.source,
            p.delivery_id,
            p.customer,
            p.amount,
          ]);
        },
      },
    });
    runner.events.on("job:success", () => done++);
    runner.events.on("job:failed", () => failed++);
    // Done when every job has been completed (completed jobs are deleted from the table).
    for (;;) {
      await new Promise((r) => setTimeout(r, 50));
      if (failed > 0) throw new Error(`graphile-worker: ${failed} jobs failed`);
      if (done >= n) {
        const { rows } = await pool.query<{ n: string }>("SELECT count(*) AS n FROM graphile_worker._private_jobs");
        if (Number(rows[0]!.n) === 0) break;
      }
    }
    await runner.stop();
    await pool.end();
    return done;
  },
});

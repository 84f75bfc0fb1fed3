// bench/peers/bullmq.ts: BullMQ 6 as a peer, on a redis-server of its own (TARGET is its URL; the
// bench starts it with the AOF fsync'd "always" or "everysec"). Ingest: queue.add per POST. Drain: a
// Worker at concurrency 100 with removeOnComplete, its documented settings for throughput; the handler
// records the payment with an HSET in the same Redis, so it is as durable as the queue, but not atomic
// with the job's completion (BullMQ completes a job in a script of its own after the handler resolves).
//   npx tsx bench/peers/bullmq.ts serve|drain redis://127.0.0.1:PORT [N]

import { Queue, Worker } from "bullmq";
import { Redis } from "ioredis";
import { backlogJob, main, payment, type Job } from "./shared.ts";

const QUEUE = "payments";
const CONCURRENCY = 100;

function connection(target: string) {
  const u = new URL(target);
  return { host: u.hostname, port: Number(u.port), maxRetriesPerRequest: null };
}

const queue = (target: string) =>
  new Queue<Job>(QUEUE, { connection: connection(target), defaultJobOptions: { removeOnComplete: true } });

await main({
  async enqueue(target) {
    const q = queue(target);
    await q.waitUntilReady();
    return (job: Job) => q.add("payment", job);
  },
  async fill(target, n) {
    const q = queue(target);
    for (let start = 0; start < n; start += 1000) {
      const jobs = [];
      for (let i = start; i < Math.min(n, start + 1000); i++) jobs.push({ name: "payment", data: backlogJob(i) });
      await q.addBulk(jobs);
    }
    await q.close();
  },
  async drain(target, n) {
    const redis = new Redis(connection(target));
    let done = 0;
    let failed = 0;
    let finished!: () => void;
    const all = new Promise<void>((resolve) => (finished = resolve));
    const worker = new Worker<Job>(
      QUEUE,
      async (job) => {
        const p = payment(job.data);
        await redis.hset(
          "payments",
          p.delivery_id,
          JSON.stringify({ source: p.source, customer: p.customer, amount: p.amount }),
        );
      },
      { connection: connection(target), concurrency: CONCURRENCY },
    );
    worker.on("completed", () => {
      if (++done + failed === n) finished();
    });
    worker.on("failed", () => {
      if (done + ++failed === n) finished();
    });
    await all;
    await worker.close();
    const stored = await redis.hlen("payments");
    await redis.quit();
    if (failed > 0 || stored !== n) throw new Error(`bullmq: ${done} done, ${failed} failed, ${stored} payments`);
    return done;
  },
});

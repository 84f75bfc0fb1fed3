// bench/peers/shared.ts: what the peer fixtures share: the bare node:http front that enqueues each
// POST, the record-payment fields of a job, and the command line every fixture answers:
//   npx tsx bench/peers/<peer>.ts serve TARGET        # "Listening on …", then enqueue each POST
//   npx tsx bench/peers/<peer>.ts drain TARGET N      # fill N jobs, drain them, print one JSON line

import { createServer } from "node:http";

/** Job is what every peer enqueues: the delivery ID and the raw body, as the inbox stores them. */
export interface Job {
  id: string;
  body: string;
}

/** Payment is the record-payment handler's row: the same four columns as the inbox's payments table. */
export interface Payment {
  source: string;
  delivery_id: string;
  customer: string;
  amount: number;
}

/** payment parses a job's body as the inbox's recordPayment does, and fails the same way on a bad one. */
export function payment(job: Job): Payment {
  const event = JSON.parse(job.body) as { customer?: unknown; amount?: unknown } | null;
  if (typeof event?.customer !== "string" || typeof event.amount !== "number") {
    throw new Error(`expected {"customer": string, "amount": number}`);
  }
  return { source: "default", delivery_id: job.id, customer: event.customer, amount: event.amount };
}

/** backlogJob is the i-th job of a filled backlog, with the same bodies as bench/common.ts's fillBacklog. */
export function backlogJob(i: number): Job {
  return {
    id: `bk_${i}`,
    body: JSON.stringify({ type: "payment.succeeded", customer: `c${i % 1000}`, amount: (i % 100) + 1 }),
  };
}

/**
 * serve is bench/bare.ts with one call added: each POST's body and X-Delivery-Id go to enqueue, and the
 * 200 goes out only once enqueue has resolved, i.e. once the peer says the job is stored.
 */
export function serve(enqueue: (job: Job) => unknown): void {
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (d: Buffer) => chunks.push(d));
    req.on("end", () => {
      const id = req.headers["x-delivery-id"];
      Promise.resolve()
        .then(() => enqueue({ id: typeof id === "string" ? id : "", body: Buffer.concat(chunks).toString() }))
        .then(
          () => {
            res.writeHead(200, { "content-type": "text/plain; charset=utf-8", "content-length": 6 });
            res.end("stored");
          },
          (error: unknown) => {
            res.writeHead(500, { "content-type": "text/plain; charset=utf-8" });
            res.end(String(error));
          },
        );
    });
  });
  server.listen(0, "127.0.0.1", () => {
    const address = server.address();
    console.log(`Listening on http://127.0.0.1:${typeof address === "object" && address ? address.port : 0}`);
  });
  process.on("SIGTERM", () => server.close(() => process.exit(0)));
}

/** Drained is what a fixture's drain prints: jobs done, and how long the fill and the drain took. */
export interface Drained {
  done: number;
  fillMs: number;
  ms: number;
}

/**
 * main reads the fixture's command line and runs serve or drain. drain returns how many jobs it saw
 * done; the clock around it is started after the fill.
 */
export async function main(peer: {
  enqueue: (target: string) => Promise<(job: Job) => unknown>;
  fill: (target: string, n: number) => Promise<void>;
  drain: (target: string, n: number) => Promise<number>;
}): Promise<void> {
  const [mode, target, count] = process.argv.slice(2);
  if (mode === "serve" && target) {
    serve(await peer.enqueue(target));
  } else if (mode === "drain" && target && Number(count) > 0) {
    const n = Number(count);
    const t0 = performance.now();
    await peer.fill(target, n);
    const t1 = performance.now();
    const done = await peer.drain(target, n);
    const drained: Drained = { done, fillMs: t1 - t0, ms: performance.now() - t1 };
    console.log(JSON.stringify(drained));
    process.exit(0);
  } else {
    console.error("usage: serve TARGET | drain TARGET N");
    process.exit(2);
  }
}

/** PAYMENTS_SQL is the payments table the PostgreSQL peers write, keyed by delivery as the inbox's is. */
export const PAYMENTS_SQL = `CREATE TABLE IF NOT EXISTS payments (
  source      text    NOT NULL,
  delivery_id text    NOT NULL,
  customer    text    NOT NULL,
  amount      numeric NOT NULL,
  PRIMARY KEY (source, delivery_id))`;

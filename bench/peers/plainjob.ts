// bench/peers/plainjob.ts: plainjob as a peer, a SQLite queue, on a file of its own (TARGET is its
// path, with "?synchronous=FULL" to override the synchronous=NORMAL that defineQueue sets). plainjob
// speaks better-sqlite3 or bun:sqlite; a dozen lines below give it node:sqlite, the inbox's driver, so
// no native module is built. Ingest: queue.add per POST. Drain: one defineWorker (it takes one job at a
// time); the handler inserts the payment into the same file, in its own transaction, as plainjob marks a
// job done only after the handler returns.
//   npx tsx bench/peers/plainjob.ts serve|drain /tmp/plainjob.db[?synchronous=FULL] [N]

import { DatabaseSync, type StatementSync } from "node:sqlite";
import { defineQueue, defineWorker, type Connection } from "plainjob";
import { backlogJob, main, payment, type Job } from "./shared.ts";

/** nodeSqlite is plainjob's Connection over node:sqlite: better-sqlite3's transaction(fn).immediate() and all. */
function nodeSqlite(db: DatabaseSync, filename: string): Connection {
  const transaction = (fn: (...args: unknown[]) => unknown) => {
    const inside =
      (mode: string) =>
      (...args: unknown[]) => {
        db.exec(`BEGIN ${mode}`);
        try {
          const result = fn(...args);
          db.exec("COMMIT");
          return result;
        } catch (error) {
          db.exec("ROLLBACK");
          throw error;
        }
      };
    return Object.assign(inside("DEFERRED"), {
      deferred: inside("DEFERRED"),
      immediate: inside("IMMEDIATE"),
      exclusive: inside("EXCLUSIVE"),
    });
  };
  return {
    driver: "better-sqlite3",
    filename,
    pragma: (stmt: string) => db.exec(`PRAGMA ${stmt}`),
    exec: (stmt: string) => db.exec(stmt),
    // node:sqlite types changes as number | bigint; without readBigInts it is always a number.
    prepare: (sql: string) => db.prepare(sql) as StatementSync & ReturnType<Connection["prepare"]>,
    transaction: transaction as Connection["transaction"],
    close: () => db.close(),
  };
}

function open(target: string) {
  const [path, query] = target.split("?");
  const db = new DatabaseSync(path!);
  const queue = defineQueue({ connection: nodeSqlite(db, path!), logger: quiet });
  const synchronous = new URLSearchParams(query).get("synchronous");
  if (synchronous) db.exec(`PRAGMA synchronous = ${synchronous === "FULL" ? "FULL" : "NORMAL"}`);
  db.exec(`CREATE TABLE IF NOT EXISTS payments (source TEXT NOT NULL, delivery_id TEXT NOT NULL, customer TEXT NOT NULL,
             amount REAL NOT NULL, PRIMARY KEY (source, delivery_id))`);
  return { db, queue };
}

const quiet = { error: () => {}, warn: () => {}, info: () => {}, debug: () => {} };

await main({
  async enqueue(target) {
    const { queue } = open(target);
    return (job: Job) => queue.add("payment", job);
  },
  async fill(target, n) {
    const { queue } = open(target);
    for (let start = 0; start < n; start += 5000) {
      const jobs = [];
      for (let i = start; i < Math.min(n, start + 5000); i++) jobs.push(backlogJob(i));
      queue.addMany("payment", jobs);
    }
    queue.close();
  },
  async drain(target, n) {
    const { db, queue } = open(target);
    const insert = db.prepare("INSERT INTO payments (source, delivery_id, customer, amount) VALUES (?, ?, ?, ?)");
    let done = 0;
    let finished!: () => void;
    const all = new Promise<void>((resolve) => (finished = resolve));
    const worker = defineWorker(
      "payment",
      (job) => {
        const p = payment(JSON.parse(job.data) as Job);
        insert.run(p.source, p.delivery_id, p.customer, p.amount);
      },
      {
        queue,
        logger: quiet,
        pollIntervall: 10,
        onCompleted: () => {
          if (++done === n) finished();
        },
        onFailed: (_job, error) => {
          throw new Error(`plainjob: a job failed: ${error}`);
        },
      },
    );
    void worker.start();
    await all;
    await worker.stop();
    queue.close();
    return done;
  },
});

// bench/fill.ts: fills an inbox at any --db target with N due deliveries, for bench/worker.ts and
// bench/backlog.ts where they cannot write the SQLite file directly (fillBacklog in bench/common.ts). On
// PostgreSQL one INSERT … SELECT FROM generate_series per 100,000 rows (a million in well under a minute),
// the same rows store() makes; elsewhere through store(), 512 at a time so they share commits. The table is
// left as the server leaves it (this machine's runs with autovacuum off: no statistics, no visibility map);
// BENCH_FILL_VACUUM=1 runs VACUUM (ANALYZE) after the fill, as autovacuum would for a backlog that grew slowly.
//   npx tsx bench/fill.ts TARGET N

import { connect } from "../inbox.ts";
import { backlogJob } from "./peers/shared.ts";

const [target, count] = [process.argv[2], Number(process.argv[3])];
if (!target || !(count > 0)) {
  console.error("usage: npx tsx bench/fill.ts TARGET N");
  process.exit(2);
}
// `await` whether connect() returns the inbox or, as with a network backend, a promise of it.
const inbox = await connect(target);
if (inbox.backend === "postgres") {
  const now = Date.now();
  for (let start = 0; start < count; start += 100_000) {
    // The bodies, IDs and due times of backlogJob and fillBacklog: bk_i, due in the order of i.
    await inbox.query(
      `INSERT INTO deliveries (source, id, body, body_sha256, content_type, received_at, status, available_at)
       SELECT 'default', 'bk_' || i, b, encode(sha256(b), 'hex'), 'application/json', ?::bigint, 'received', ?::bigint - ?::bigint + i
       FROM (SELECT i, convert_to('{"type":"payment.succeeded","customer":"c' || (i % 1000) || '","amount":' || (i % 100 + 1) || '}', 'UTF8') AS b
             FROM generate_series(?::bigint, ?::bigint) AS i) AS g`,
      now,
      now,
      count,
      start,
      Math.min(count, start + 100_000) - 1,
    );
  }
  if (process.env.BENCH_FILL_VACUUM === "1") await inbox.query("VACUUM (ANALYZE) deliveries");
} else {
  for (let start = 0; start < count; start += 512) {
    const stores = [];
    for (let i = start; i < Math.min(count, start + 512); i++) {
      const job = backlogJob(i);
      stores.push(inbox.store({ id: job.id, body: Buffer.from(job.body), contentType: "application/json" }));
    }
    await Promise.all(stores);
  }
}
await inbox.close();

// bench/fill.ts: fills an inbox at any --db target with N due deliveries through the inbox's own
// store(), 512 at a time so they share commits. bench/worker.ts uses it where it cannot write the
// SQLite file directly (fillBacklog in bench/common.ts), that is, for the PostgreSQL target.
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
for (let start = 0; start < count; start += 512) {
  const stores = [];
  for (let i = start; i < Math.min(count, start + 512); i++) {
    const job = backlogJob(i);
    stores.push(inbox.store({ id: job.id, body: Buffer.from(job.body), contentType: "application/json" }));
  }
  await Promise.all(stores);
}
await inbox.close();

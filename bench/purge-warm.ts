// bench/purge-warm.ts: bench/purge.ts's purge in a process already started, as a worker started with
// --purge-every runs it: it opens the inbox, says "ready", purges when a line comes on its stdin (the same
// batches, rest and audit as `inbox.ts purge`), prints what it purged as JSON and exits. So the acks measured
// "during" a purge meet the release, not Node loading its modules (a day of a thousand rows, purged by a new
// `inbox.ts purge`, moved the ack's p99 by a third on two cores: docs/operations.md#a-day-released-by-one-row).
//   node --import tsx bench/purge-warm.ts DB BATCH REST

import { createInterface } from "node:readline";
import { connect } from "../inbox.ts";

const [db, batch, rest] = process.argv.slice(2);
if (!db || !batch || !rest) throw new Error("usage: purge-warm.ts DB BATCH REST");
const inbox = await connect(db);
console.log("ready");
for await (const _ of createInterface({ input: process.stdin })) break;
const purged = await inbox.purge({
  batch: Number(batch),
  rest: Number(rest),
  audit: { who: "cli:bench", operation: "purge", target: "purge bodies-after=7d forget-after=30d" },
});
console.log(JSON.stringify(purged));
await inbox.close();

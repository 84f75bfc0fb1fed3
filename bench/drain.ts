// bench/drain.ts: one worker draining a filled inbox with the article's record-payment handler, in a
// process of its own so its peak RSS is its alone. bench/worker.ts runs it; it prints one JSON line.
//   npx tsx bench/drain.ts DB CONCURRENCY

import { Inbox } from "../inbox.ts";
import { ensurePayments, recordPayment, run } from "../worker.ts";
import { rssMb } from "./common.ts";

const [path, concurrency] = [process.argv[2]!, Number(process.argv[3] ?? 8)];
const inbox = new Inbox(path);
ensurePayments(inbox.db);
let peak = rssMb(process.pid);
const sampler = setInterval(() => (peak = Math.max(peak, rssMb(process.pid))), 100);
const started = performance.now();
const stats = await run(recordPayment, { inbox, once: true, concurrency, log: () => {} });
const ms = performance.now() - started;
clearInterval(sampler);
await inbox.close();
console.log(JSON.stringify({ ...stats, ms, peakRssMb: Math.max(peak, rssMb(process.pid, true)) }));

// bench/drain.ts: one worker draining a filled inbox with the article's record-payment handler, in a
// process of its own so its peak RSS is its alone. bench/worker.ts runs it; it prints one JSON line.
//   npx tsx bench/drain.ts DB CONCURRENCY

import { SqliteInbox } from "../lib/sqlite/sqlite.ts";
import { ensurePayments, recordPayment, run } from "../worker.ts";

const [path, concurrency] = [process.argv[2]!, Number(process.argv[3] ?? 8)];
const inbox = new SqliteInbox(path);
await ensurePayments(inbox);
// RSS over the run, so a plateau can be told from growth. Read here, not through common.ts: that would
// load autocannon into this process, and its 40 MB would be counted as the worker's.
const rssMb = (peak = false) => (peak ? process.resourceUsage().maxRSS * 1024 : process.memoryUsage.rss()) / 2 ** 20;
const samples: { at: number; rss: number }[] = [];
const started = performance.now();
const sampler = setInterval(() => samples.push({ at: performance.now() - started, rss: rssMb() }), 100);
const cpu0 = process.cpuUsage();
const stats = await run(recordPayment, { inbox, once: true, concurrency, log: () => {} });
const ms = performance.now() - started;
// CPU of the whole process, its threads included: a figure that a busy machine's noise bends less than ms.
const cpu = process.cpuUsage(cpu0);
clearInterval(sampler);
await inbox.close();
const peakIn = (from: number, to: number) =>
  Math.max(0, ...samples.filter((s) => s.at >= from * ms && s.at < to * ms).map((s) => s.rss));
console.log(
  JSON.stringify({
    ...stats,
    ms,
    cpuMs: (cpu.user + cpu.system) / 1000,
    peakRssMb: rssMb(true),
    // The highest RSS in each quarter of the run.
    quartersMb: [peakIn(0, 0.25), peakIn(0.25, 0.5), peakIn(0.5, 0.75), peakIn(0.75, 1.01)],
    heapUsedMb: process.memoryUsage().heapUsed / 2 ** 20,
  }),
);

// bench/run.ts: `npm run bench` runs every benchmark in turn; `npm run bench -- ingest worker` runs some.
// Each benchmark measures its own baseline in the same run and ends with its summary; those are printed
// again together at the end. Scale with BENCH_SECONDS, BENCH_LARGE, BENCH_MIXED_BACKLOG, …; leave the
// peers out with BENCH_PEERS=0, the inbox-on-PostgreSQL rows with BENCH_POSTGRES=0.
//   npm run bench                       # about 10 minutes on 2 cores
//   BENCH_SECONDS=3 BENCH_LARGE=50000 npm run bench -- worker mixed
//   npm run bench -- generators         # wrk against autocannon, not part of the default run
//   npm run bench -- runtimes           # Node, Deno and Bun, each against its own bare server
//   npm run bench -- pgingest           # the PostgreSQL front door taken apart, not part of the default run
//   npm run bench -- commits            # what one SQLite group commit costs, by batch size, without HTTP
//   npm run bench -- purgetrace         # why SQLite's acks slow during a purge: each store's time taken apart
//   npm run bench -- releasetrace       # why PostgreSQL's acks slow while a day is released: the purge's statements beside them
//   npm run bench -- attempts           # what keeping each try in the attempt log costs a done mark, on both stores
//   BENCH_TRANSFORM_BASELINE=/tmp/before npm run bench -- transforms   # a transform's process against another tree's

import { execFileSync } from "node:child_process";
import { cpus, totalmem } from "node:os";
import { admin } from "./admin.ts";
import { backlog } from "./backlog.ts";
import { generators } from "./generators.ts";
import { ingest } from "./ingest.ts";
import { latency } from "./latency.ts";
import { mixed } from "./mixed.ts";
import { observe } from "./observe.ts";
import { ordered } from "./ordered.ts";
import { pgclient } from "./pgclient.ts";
import { runtimes } from "./runtimes.ts";
import { worker } from "./worker.ts";

const BENCHES: Record<string, () => Promise<string>> = {
  ingest,
  latency,
  worker,
  backlog,
  mixed,
  pgclient,
  generators,
  observe,
  admin,
  ordered,
  purge: async () => (await import("./purge.ts")).purge(),
  purgetrace: async () => (await import("./purgetrace.ts")).purgetrace(),
  releasetrace: async () => (await import("./releasetrace.ts")).releasetrace(),
  listing: async () => (await import("./listing.ts")).listing(),
  byid: async () => (await import("./byid.ts")).byid(),
  runtimes,
  forward: async () => (await import("./forward.ts")).forwardBench(),
  brokers: async () => (await import("./brokers.ts")).brokers(),
  consume: async () => (await import("./consume.ts")).consume(),
  traces: async () => (await import("./traces.ts")).traces(),
  redact: async () => (await import("./redact.ts")).redactBench(),
  attempts: async () => (await import("./attempts.ts")).attemptsBench(),
  backup: async () => (await import("./backup.ts")).backupBench(),
  startup: async () => (await import("./startup.ts")).startupBench(),
  routing: async () => (await import("./routing.ts")).routing(),
  transforms: async () => (await import("./transforms.ts")).transforms(),
  sandbox: async () => (await import("./sandbox.ts")).sandboxBench(),
  slow: async () => (await import("./slow.ts")).slow(),
  pgstore: async () => (await import("./pgstore.ts")).pgstore(),
  pgingest: async () => (await import("./pgingest.ts")).pgingest(),
  commits: async () => (await import("./commits.ts")).commits(),
  regex: async () => (await import("./regex.ts")).regex(),
  trust: async () => (await import("./trust.ts")).trust(),
  bodysearch: async () => (await import("./bodysearch.ts")).bodysearch(),
  stored: async () => (await import("./stored.ts")).stored(),
  narrow: async () => (await import("./narrow.ts")).narrow(),
};
const DEFAULT = [
  "ingest",
  "latency",
  "worker",
  "backlog",
  "mixed",
  "pgclient",
  "pgstore",
  "observe",
  "purge",
  "stored",
  "narrow",
  "admin",
  "ordered",
  "runtimes",
  "forward",
  "brokers",
  "consume",
  "traces",
  "redact",
  "backup",
  "startup",
  "routing",
  "regex",
  "trust",
  "bodysearch",
  "slow",
  "sandbox",
];

const wanted = process.argv.slice(2);
for (const name of wanted) {
  if (!(name in BENCHES)) {
    console.error(`bench: no benchmark named ${name}; choose from ${Object.keys(BENCHES).join(", ")}`);
    process.exit(2);
  }
}
const names = wanted.length > 0 ? wanted : DEFAULT;
let load = "";
try {
  load = execFileSync("uptime", { encoding: "utf8" })
    .trim()
    .replace(/.*load average/, "load average");
} catch {
  // uptime is only context for the reader.
}
console.log(
  `${new Date().toISOString()}  Node ${process.version}  ${cpus().length} cores  ${(totalmem() / 2 ** 30).toFixed(0)} GB  ${load}`,
);
const summaries: string[] = [];
for (const name of names) {
  const started = performance.now();
  summaries.push(await BENCHES[name]!());
  console.log(`${summaries.at(-1)}  (${((performance.now() - started) / 1000).toFixed(0)} s)\n`);
}
if (summaries.length > 1) console.log(`summary\n${summaries.join("\n")}`);

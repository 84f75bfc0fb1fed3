// bench/ingest.ts: durable ingest against the bare node:http baseline, same Node, same load (wrk), same
// run. Closed loop at BENCH_CONNECTIONS (32): the receiver with unique IDs, with 30% duplicates, with a
// log line per request to a pipe (the default; the others use --quiet), with SQLite's checkpoints
// inside commits (--inline-checkpoints) instead of on their own thread, with the fsync inside each
// commit on the HTTP thread (--sync-in-commit) instead of an fdatasync on libuv's pool, and on a Node
// whose young generation is capped at 4 MB a semi-space (its memory); then bare, the receiver, the capped
// one and --sync-in-commit at BENCH_CONNECTIONS_HIGH (128); then the peers (bench/peers), each a bare node:http server that answers
// after its queue's enqueue resolves. Every server runs side by side, and each round measures them one
// after the other, so that the noise of a shared machine lands on all alike; ratios are taken within a
// round, and the median is reported. Also the CPU each server, and wrk, spends per request.
// BENCH_COMPARE=/path/to/another/checkout adds that checkout's receiver (--quiet) on each database at both
// connection counts, in the same rounds: an A/B of two commits, as bench/backlog.ts has for the drain.
//   npm run bench -- ingest          BENCH_SECONDS=4 BENCH_ROUNDS=3 BENCH_CONNECTIONS=32 BENCH_PEERS=0
//   git worktree add /tmp/before HEAD~1 && BENCH_COMPARE=/tmp/before BENCH_PEERS=0 npm run bench -- ingest

import { spawnSync } from "node:child_process";
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";
import {
  CONNECTIONS,
  WARMUP_SECONDS,
  f,
  hammer,
  knob,
  row,
  startChild,
  tempDir,
  type Child,
  type Load,
} from "./common.ts";
import { label as peerLabel, peers as availablePeers, type Peer, type Store } from "./peers/index.ts";
import { inboxTargets } from "./targets.ts";

const SECONDS = knob("BENCH_SECONDS", 4);
const ROUNDS = knob("BENCH_ROUNDS", 3);
const HIGH = knob("BENCH_CONNECTIONS_HIGH", 128);
// The Node flag that caps V8's young generation, as docs/performance.md suggests where memory is tight.
const SMALL_YOUNG = "--max-semi-space-size=4";
const COMPARE = process.env.BENCH_COMPARE;

/** Server is one process under load: started once, measured by every Run that names it. */
interface Server {
  start: () => Promise<Child>;
  child?: Child;
  stores: (() => Promise<void>)[];
}

/** Run is one row: a server, a connection count, a share of duplicates. */
interface Run {
  name: string;
  server: Server;
  connections: number;
  duplicates?: number;
  /** The row this one's ratio is taken against (bare at the same connections), and the inbox's row. */
  base?: Run;
  inbox?: Run;
  peer?: Peer;
  loads: Load[];
  cpu: number[];
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

/** ingest runs the comparison and returns its one-line summary. */
export async function ingest(): Promise<string> {
  const { dir, cleanup } = tempDir();
  const server = (script: string, args: string[] = [], nodeArgs: string[] = []): Server => ({
    start: () => startChild(script, ["--port", "0", ...args], false, undefined, nodeArgs),
    stores: [],
  });
  const runs: Run[] = [];
  const add = (r: Omit<Run, "loads" | "cpu">) => {
    const run = { ...r, loads: [], cpu: [] };
    runs.push(run);
    return run;
  };
  const bare = server("bench/bare.ts");
  const bare32 = add({ name: "bare node:http", server: bare, connections: CONNECTIONS });
  const bareHigh = add({ name: "bare node:http", server: bare, connections: HIGH });
  const inbox: Record<number, Run> = {};
  // The receiver on PostgreSQL, set against the peers too: the PostgreSQL front door's targets are theirs.
  const onPostgres: Record<number, Run> = {};
  // The SQLite receiver with its fsync inside each commit, to set the default's off-loop fdatasync against.
  const inCommit: Record<number, Run> = {};
  const small: Record<number, Run> = {};
  const receivers: Run[] = [];
  // Each of this checkout's --quiet receivers beside BENCH_COMPARE's at the same connections and database.
  const pairs: [mine: Run, theirs: Run][] = [];
  const other =
    COMPARE === undefined
      ? ""
      : spawnSync("git", ["-C", COMPARE, "log", "-1", "--format=%h"], { encoding: "utf8" }).stdout.trim() || COMPARE;
  const targets = await inboxTargets();
  for (const target of targets) {
    const at = async (
      label: string,
      args: string[] = [],
      nodeArgs: string[] = [],
      script = "receiver.ts",
    ): Promise<Server> => {
      const fresh = await target.fresh(dir, `ingest_${label}`);
      const s = server(script, ["--db", fresh.db, ...args], nodeArgs);
      s.stores.push(fresh.drop);
      return s;
    };
    const t = target.name;
    const quiet = await at("quiet", ["--quiet"]);
    const r32 = add({ name: `receiver --quiet [${t}]`, server: quiet, connections: CONNECTIONS, base: bare32 });
    receivers.push(r32);
    if (t === "SQLite") {
      inbox[CONNECTIONS] = r32;
      add({
        name: `receiver 30% duplicates [${t}]`,
        server: await at("dup", ["--quiet"]),
        connections: CONNECTIONS,
        duplicates: 0.3,
        base: bare32,
      });
      add({
        name: `receiver logging to a pipe [${t}]`,
        server: await at("logged"),
        connections: CONNECTIONS,
        base: bare32,
      });
      add({
        name: `receiver --inline-checkpoints [${t}]`,
        server: await at("inline", ["--quiet", "--inline-checkpoints"]),
        connections: CONNECTIONS,
        base: bare32,
      });
      // The fsync inside each COMMIT on the HTTP thread, as before the fdatasync moved to libuv's pool.
      // V8's young generation capped (it grows to 64 MB under load): the receiver's memory, and what it costs.
      small[CONNECTIONS] = add({
        name: `receiver ${SMALL_YOUNG} [${t}]`,
        server: await at("small", ["--quiet"], [SMALL_YOUNG]),
        connections: CONNECTIONS,
        base: bare32,
      });
      receivers.push(
        (inCommit[CONNECTIONS] = add({
          name: `receiver --sync-in-commit [${t}]`,
          server: await at("in_commit", ["--quiet", "--sync-in-commit"]),
          connections: CONNECTIONS,
          base: bare32,
        })),
      );
    }
    // A receiver of its own at HIGH, so each connection count's peak RSS is its own.
    const rHigh = add({
      name: `receiver --quiet [${t}]`,
      server: await at("quiet_high", ["--quiet"]),
      connections: HIGH,
      base: bareHigh,
    });
    receivers.push(rHigh);
    if (t === "PostgreSQL") [onPostgres[CONNECTIONS], onPostgres[HIGH]] = [r32, rHigh];
    if (COMPARE !== undefined) {
      for (const mine of [r32, rHigh]) {
        const theirs = add({
          name: `receiver --quiet [${t} ${other}]`,
          server: await at(`compare_${mine.connections}`, ["--quiet"], [], resolve(COMPARE, "receiver.ts")),
          connections: mine.connections,
          base: mine.base,
        });
        receivers.push(theirs);
        pairs.push([mine, theirs]);
      }
    }
    if (t === "SQLite") {
      inbox[HIGH] = rHigh;
      small[HIGH] = add({
        name: `receiver ${SMALL_YOUNG} [${t}]`,
        server: await at("small_high", ["--quiet"], [SMALL_YOUNG]),
        connections: HIGH,
        base: bareHigh,
      });
      receivers.push(
        (inCommit[HIGH] = add({
          name: `receiver --sync-in-commit [${t}]`,
          server: await at("in_commit_high", ["--quiet", "--sync-in-commit"]),
          connections: HIGH,
          base: bareHigh,
        })),
      );
    }
  }
  const peers = await availablePeers();
  for (const peer of peers) {
    let store: Store | undefined;
    const s: Server = {
      start: async () => {
        store = await peer.store(dir, `ingest${peers.indexOf(peer)}`);
        return startChild(peer.script, ["serve", store.target]);
      },
      stores: [() => store?.drop() ?? Promise.resolve()],
    };
    add({ name: peerLabel(peer), server: s, connections: CONNECTIONS, base: bare32, inbox: inbox[CONNECTIONS], peer });
    if (peer.high)
      add({ name: peerLabel(peer), server: s, connections: HIGH, base: bareHigh, inbox: inbox[HIGH], peer });
  }
  const servers = [...new Set(runs.map((r) => r.server))];
  console.log(
    `ingest: ${CONNECTIONS} and ${HIGH} connections, ${ROUNDS} round(s) of ${SECONDS} s per row, wrk on the same cores`,
  );
  try {
    for (const s of servers) s.child = await s.start();
    for (const r of runs)
      await hammer(r.server.child!.url, {
        seconds: WARMUP_SECONDS,
        connections: r.connections,
        duplicates: r.duplicates,
      });
    for (let round = 1; round <= ROUNDS; round++) {
      console.log(`  round ${round}`);
      for (const r of runs) {
        const child = r.server.child!;
        const c0 = child.cpuMs();
        const load = await hammer(child.url, {
          seconds: SECONDS,
          connections: r.connections,
          duplicates: r.duplicates,
        });
        r.cpu.push(((child.cpuMs() - c0) * 1000) / Math.max(1, load.ok + load.non2xx));
        r.loads.push(load);
        const ratio = r.base ? `×${f(load.rps / r.base.loads.at(-1)!.rps, 2)} of bare  ` : "";
        row(`  ${r.name} @${r.connections}`, load, `${ratio}CPU ${f(r.cpu.at(-1)!)} µs/req`);
      }
    }
  } finally {
    for (const s of servers) await s.child?.stop();
    for (const s of servers) for (const drop of s.stores) await drop();
    cleanup();
  }
  const rps = (r: Run) => median(r.loads.map((l) => l.rps));
  const of = (r: Run, base: Run) => median(r.loads.map((l, i) => l.rps / base.loads[i]!.rps));
  const us = (r: Run) => median(r.cpu);
  const gen = (r: Run) => median(r.loads.map((l) => l.generatorUs));
  const lat = (r: Run) =>
    `p50 ${f(median(r.loads.map((l) => l.p50)), 1)} p99 ${f(median(r.loads.map((l) => l.p99)), 1)} ms`;
  console.log(
    `  peak RSS: ${servers.map((s) => `${runs.find((r) => r.server === s)!.name} ${f(s.child?.peakRssMb() ?? NaN)} MB`).join(", ")}`,
  );
  const receiverRss = (connections: number) =>
    Math.max(
      ...[
        ...new Set(
          runs.filter((r) => !r.peer && r.server !== bare && r.connections === connections).map((r) => r.server),
        ),
      ].map((s) => s.child?.peakRssMb() ?? NaN),
    );
  const parts: string[] = [];
  for (const base of [bare32, bareHigh]) {
    const c = base.connections;
    const mine = runs.filter((r) => r.base === base && !r.peer);
    parts.push(
      `${c} conn: bare ${f(rps(base))} req/s (${lat(base)}, ${f(us(base))} µs CPU/req, wrk ${f(gen(base))} µs/req)` +
        mine
          .map(
            (r) =>
              ` | ${r.name.replace(" [SQLite]", "")} ${f(rps(r))} req/s ×${f(of(r, base), 2)}` +
              (receivers.includes(r) ? ` (${lat(r)}, ${f(us(r))} µs CPU/req)` : ""),
          )
          .join(""),
    );
    for (const [mine, theirs] of pairs.filter(([m]) => m.base === base)) {
      parts.push(
        `${c} conn: A/B ${mine.name} against ${other} ×${f(of(mine, theirs), 2)} (CPU ${f(us(mine))} against ${f(us(theirs))} µs/req)`,
      );
    }
    if (inbox[c] && inCommit[c])
      parts.push(
        `${c} conn: receiver against --sync-in-commit ×${f(of(inbox[c]!, inCommit[c]!), 2)}, ${SMALL_YOUNG} against the receiver ×${f(of(small[c]!, inbox[c]!), 2)}`,
      );
    const theirs = runs.filter((r) => r.base === base && r.peer);
    // The CPU is the fixture's own, node:http and the client; PostgreSQL's or Redis's is not counted.
    for (const r of theirs) {
      parts.push(
        `${c} conn: ${r.name} ${f(rps(r))} req/s ×${f(of(r, base), 2)} of bare, inbox ×${f(of(r.inbox!, r), 2)}` +
          `${onPostgres[c] ? `, inbox on PostgreSQL ×${f(of(onPostgres[c]!, r), 2)}` : ""} (${lat(r)}, fixture ${f(us(r))} µs CPU/req)`,
      );
    }
    const durable = theirs.filter((r) => r.peer!.durable);
    if (durable.length > 0 && inbox[c]) {
      const best = durable.reduce((a, b) => (rps(a) >= rps(b) ? a : b));
      parts.push(`${c} conn: inbox against the best durable peer (${best.name}) ×${f(of(inbox[c]!, best), 2)}`);
    }
  }
  const peak = (r: Run | undefined) => f(r?.server.child?.peakRssMb() ?? NaN);
  return (
    `ingest (median of ${ROUNDS}):\n  ${parts.join("\n  ")}\n  receiver --quiet peak RSS ${peak(inbox[CONNECTIONS])} MB at ${CONNECTIONS} connections, ` +
    `${peak(inbox[HIGH])} MB at ${HIGH}; with ${SMALL_YOUNG} ${peak(small[CONNECTIONS])} and ${peak(small[HIGH])} MB ` +
    `(every receiver row: up to ${f(receiverRss(CONNECTIONS))} and ${f(receiverRss(HIGH))} MB; bare node:http ${peak(bare32)} MB)`
  );
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) console.log(await ingest());

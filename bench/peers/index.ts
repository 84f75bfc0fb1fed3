// bench/peers/index.ts: the queues a new user could have picked instead of the inbox, as bench/ingest
// and bench/worker run them: each with its durability setting, its drain settings, and a fresh store
// of its own per run (a PostgreSQL database, a redis-server, a SQLite file), removed afterwards.

import { spawn } from "node:child_process";
import { join } from "node:path";
import { ROOT, knob } from "../common.ts";
import { freshDatabase, pgReachable } from "./pgdb.ts";
import { startRedis } from "./redis.ts";
import type { Drained } from "./shared.ts";

/** Store is where one run of a peer keeps its jobs, and how to remove it. */
export interface Store {
  target: string;
  drop: () => Promise<void>;
}

/** Peer is one queue as the benchmarks run it. */
export interface Peer {
  name: string;
  /** What a 200 (or a finished job) means on disk, printed next to every figure. */
  durability: string;
  /** Whether a 200 means what the inbox's means: on disk, fsync'd, before the answer. */
  durable: boolean;
  /** The drain's settings, printed next to its figure. */
  settings: string;
  script: string;
  /** Whether it needs the machine's PostgreSQL. */
  postgres: boolean;
  /** The backlog its drain uses, when not BENCH_LARGE (a peer too slow to drain that many in the time). */
  backlog?: number;
  /** Whether bench/ingest also runs it at BENCH_CONNECTIONS_HIGH. */
  high: boolean;
  store: (dir: string, label: string) => Promise<Store>;
}

const pg =
  (database: string) =>
  async (_dir: string, label: string): Promise<Store> => {
    const db = await freshDatabase(`${database}_${label}`);
    return { target: db.url, drop: db.drop };
  };
const redis = (fsync: "always" | "everysec") => async (): Promise<Store> => {
  const server = await startRedis(fsync);
  return { target: server.url, drop: server.stop };
};
const sqlite =
  (query: string) =>
  async (dir: string, label: string): Promise<Store> => ({
    target: join(dir, `plainjob-${label}.db${query}`),
    drop: async () => {},
  });

/** PEERS are the queues of issue #14, in the order they are printed. */
export const PEERS: Peer[] = [
  {
    name: "pg-boss 12",
    durability: "PostgreSQL synchronous_commit=on",
    durable: true,
    settings: "batchSize 500, localConcurrency 2, transactional, burstWhenBatchFull",
    script: "bench/peers/pgboss.ts",
    postgres: true,
    high: true,
    store: pg("bench_pgboss"),
  },
  {
    name: "graphile-worker 0.18",
    durability: "PostgreSQL synchronous_commit=on",
    durable: true,
    settings: "concurrency 24, localQueue 500, completeJobBatchDelay 0",
    script: "bench/peers/graphile.ts",
    postgres: true,
    high: false,
    store: pg("bench_graphile"),
  },
  {
    name: "BullMQ 6",
    durability: "Redis AOF appendfsync=always",
    durable: true,
    settings: "concurrency 100, removeOnComplete, payment HSET",
    script: "bench/peers/bullmq.ts",
    postgres: false,
    high: true,
    store: redis("always"),
  },
  {
    name: "BullMQ 6",
    durability: "Redis AOF appendfsync=everysec (up to 1 s lost)",
    durable: false,
    settings: "concurrency 100, removeOnComplete, payment HSET",
    script: "bench/peers/bullmq.ts",
    postgres: false,
    high: true,
    store: redis("everysec"),
  },
  {
    name: "plainjob 0.0.14",
    durability: "SQLite synchronous=FULL",
    durable: true,
    settings: "one worker, payment insert in the same file",
    script: "bench/peers/plainjob.ts",
    postgres: false,
    high: false,
    backlog: knob("BENCH_PLAINJOB_FULL_BACKLOG", 5_000),
    store: sqlite("?synchronous=FULL"),
  },
  {
    name: "plainjob 0.0.14",
    durability: "SQLite synchronous=NORMAL (its default; a power cut can lose the last commits)",
    durable: false,
    settings: "one worker, payment insert in the same file",
    script: "bench/peers/plainjob.ts",
    postgres: false,
    high: true,
    store: sqlite(""),
  },
];

/** label names a peer's row: its name and durability. */
export const label = (p: Peer) => `${p.name} [${p.durability.replace(/ \(.*\)/, "")}]`;

let reachable: Promise<boolean> | undefined;

/**
 * peers returns the peers this machine can run (BENCH_PEERS=0 runs none; BENCH_PEERS=pg-boss,always runs
 * those whose row label contains one of the words); without a reachable PostgreSQL the PostgreSQL peers
 * are left out, with one line saying so.
 */
export async function peers(): Promise<Peer[]> {
  const wanted = process.env.BENCH_PEERS;
  if (wanted === "0") return [];
  const words =
    wanted === undefined || wanted === "1"
      ? []
      : wanted
          .toLowerCase()
          .split(",")
          .map((w) => w.trim())
          .filter(Boolean);
  const chosen = PEERS.filter((p) => words.length === 0 || words.some((w) => label(p).toLowerCase().includes(w)));
  reachable ??= pgReachable();
  if (await reachable) return chosen;
  console.log("bench: PostgreSQL is not reachable at BENCH_PG_URL; the pg-boss and graphile-worker rows are skipped");
  return chosen.filter((p) => !p.postgres);
}

/** drainPeer fills a fresh store with n jobs and drains it with the peer's fixture, in a process of its own. */
export async function drainPeer(peer: Peer, dir: string, n: number, label: string): Promise<Drained> {
  const store = await peer.store(dir, label);
  try {
    const child = spawn(
      process.execPath,
      ["--import", "tsx", join(ROOT, peer.script), "drain", store.target, String(n)],
      {
        cwd: ROOT,
        stdio: ["ignore", "pipe", "pipe"],
      },
    );
    let out = "";
    let err = "";
    child.stdout.on("data", (d: Buffer) => (out += d));
    child.stderr.on("data", (d: Buffer) => (err += d));
    const code = await new Promise<number | null>((resolve) => child.on("exit", resolve));
    if (code !== 0) throw new Error(`${peer.script} drain exited with ${code}: ${err.slice(-1000)}`);
    const drained = JSON.parse(out.trim().split("\n").at(-1)!) as Drained;
    if (drained.done !== n) throw new Error(`${peer.script}: expected ${n} done, got ${drained.done}`);
    return drained;
  } finally {
    await store.drop();
  }
}

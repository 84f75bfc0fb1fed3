// test/powerloss/scenarios.ts: the power-loss cycles, for test/powerloss.test.ts and `npm run torture -- powerloss`.
// The real receiver.ts and worker.ts run with their database on the fault layer (layer.ts) under load; at a
// random moment all is SIGKILLed and the power cut; mounted and started again, the database must hold every
// ID answered 200 (logged outside the layer), be intact, and drain exactly once.

import { spawn, type ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import {
  appendFileSync,
  chmodSync,
  chownSync,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  statSync,
} from "node:fs";
import { dirname, join, resolve } from "node:path";
import { DatabaseSync } from "node:sqlite";
import type { Random } from "../chaos.ts";
import { freePort, PG_BIN, spawnScript, startReceiver } from "../helpers.ts";
import { Layer, type CutOptions } from "./layer.ts";

/** ReceiverBuild says which receiver serves: the real receiver.ts by default, a control fixture, or another tree's. */
export interface ReceiverBuild {
  /** A script path, relative to the repository or absolute (another worktree's receiver.ts). @default "receiver.ts" */
  script: string;
  /** Extra arguments after --port 0 --db TARGET. */
  args: string[];
}

/** RECEIVER is the real receiver.ts, quiet. */
export const RECEIVER: ReceiverBuild = { script: "receiver.ts", args: ["--quiet"] };

/**
 * receiverBuild is the receiver named by POWERLOSS_RECEIVER (a script, e.g. another worktree's receiver.ts)
 * and POWERLOSS_RECEIVER_ARGS (its extra arguments, split on spaces), else RECEIVER. The caller passes its env.
 */
export function receiverBuild(env: NodeJS.ProcessEnv): ReceiverBuild {
  const args = env.POWERLOSS_RECEIVER_ARGS?.split(/\s+/).filter(Boolean);
  return { script: env.POWERLOSS_RECEIVER || RECEIVER.script, args: args ?? RECEIVER.args };
}

/** PowerLossOptions sizes a scenario. */
export interface PowerLossOptions {
  /** A folder outside the layer: the layer's backing folder, its mount point, the log of acknowledged IDs. */
  dir: string;
  /** A name for the figures, e.g. "sqlite" or "sqlite synchronous=OFF". */
  label: string;
  cycles: number;
  /** Concurrent senders. */
  senders: number;
  /** The power is cut a random time in [minUpMs, maxUpMs] after the receiver starts listening. */
  minUpMs: number;
  maxUpMs: number;
  random: Random;
  /** @default RECEIVER */
  receiver?: ReceiverBuild;
  /** The second and third cut of every four keep each unsynced page with probability 1/2, as a real cut may; the others none. @default false */
  mixedCuts?: boolean;
  /** End at the first cycle that loses an acknowledged ID (for the controls' short runs). @default false */
  untilLoss?: boolean;
  /** PostgreSQL only: server settings added to (and overriding) the durable ones, as name=value. @default [] */
  serverSettings?: string[];
  /** Called after each cycle with the figures so far, to show progress. */
  onCycle?: (r: PowerLossReport) => void;
}

/** PowerLossReport is what the senders were told, and what the database held after each cut and at the end. */
export interface PowerLossReport {
  backend: "sqlite" | "postgres";
  label: string;
  cycles: number;
  requests: number;
  /** Distinct IDs answered 200. */
  acked: number;
  /** Acknowledged IDs missing after a cut: must be [] (the controls must lose some). */
  lost: string[];
  /** Deliveries in the database at the end. */
  stored: number;
  /** PRAGMA integrity_check, or amcheck on PostgreSQL, when not ok: must be []. */
  integrity: string[];
  /** After a cut: a payment without its done mark, a done delivery without its payment, a failed delivery: must be []. */
  payments: string[];
  /** Whether the final worker run finished every stored delivery. */
  drained: boolean;
  /** After the drain: deliveries not done, not paid exactly once, or paid a wrong amount: must be []. */
  exactlyOnce: string[];
  /** False when the database did not come back, or could not be read, after a cut (a control may do that). */
  recovered: boolean;
  /** What the cuts threw away: unsynced pages dropped (and kept, in harsh cuts), and names undone. */
  droppedPages: number;
  keptPages: number;
  undoneNames: number;
  ms: number;
}

// A database the scenario runs on: the SQLite file as it is, or a PostgreSQL server it starts and kills.
interface Site {
  backend: "sqlite" | "postgres";
  /** The --db the scripts get. */
  target: string;
  /** start brings the database up on a freshly mounted layer; false if it cannot (a control may break it). */
  start(): Promise<{ ok: true } | { ok: false; why: string }>;
  /** kill SIGKILLs the database's processes at once; the promise ends when they are all gone. */
  kill(): Promise<void>;
  read(): Promise<Contents>;
  stop(): Promise<void>;
}

// Contents is what a check reads from the database.
interface Contents {
  integrity: string;
  deliveries: Map<string, string>;
  payments: Map<string, number[]>;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** amountOf is the payment amount sent for an ID, so a stored payment can be checked against it. */
export function amountOf(id: string): number {
  return 1 + (createHash("sha256").update(id).digest().readUInt16BE(0) % 1000);
}

/** powerLossSqlite runs the scenario with the SQLite file on the layer. */
export async function powerLossSqlite(o: PowerLossOptions): Promise<PowerLossReport> {
  const layer = await Layer.mount(join(o.dir, "backing"), join(o.dir, "mnt"));
  const path = join(layer.mountpoint, "inbox.db");
  const site: Site = {
    backend: "sqlite",
    target: path,
    start: async () => ({ ok: true }),
    kill: async () => {},
    read: async () => readSqlite(path),
    stop: async () => {},
  };
  return runScenario(o, layer, site);
}

/** powerLossPostgres runs the scenario on a private PostgreSQL cluster whose data directory is on the layer. */
export async function powerLossPostgres(o: PowerLossOptions): Promise<PowerLossReport> {
  if (!PG_BIN) throw new Error("powerLossPostgres: no PostgreSQL server binaries under /usr/lib/postgresql/*/bin");
  const layer = await Layer.mount(join(o.dir, "backing"), join(o.dir, "mnt"));
  try {
    const site = await postgresSite(o.dir, layer.mountpoint, o.serverSettings ?? []);
    return await runScenario(o, layer, site);
  } catch (error) {
    await layer.unmount();
    throw error;
  }
}

async function runScenario(o: PowerLossOptions, layer: Layer, site: Site): Promise<PowerLossReport> {
  const started = Date.now();
  const receiver = o.receiver ?? RECEIVER;
  const ackLog = join(o.dir, "acked.log");
  const acked = new Set<string>();
  const lost = new Set<string>();
  // IDs sent but never answered 200 are sent again in the next cycle, as a provider retries.
  const unanswered: string[] = [];
  const report: PowerLossReport = {
    backend: site.backend,
    label: o.label,
    cycles: 0,
    requests: 0,
    acked: 0,
    lost: [],
    stored: 0,
    integrity: [],
    payments: [],
    drained: false,
    exactlyOnce: [],
    recovered: true,
    droppedPages: 0,
    keptPages: 0,
    undoneNames: 0,
    ms: 0,
  };
  const finish = () => {
    report.acked = acked.size;
    report.lost = [...lost];
    report.ms = Date.now() - started;
    return report;
  };
  try {
    let up = await site.start();
    if (!up.ok) throw new Error(`${o.label}: the database did not start on a fresh layer: ${up.why}`);
    for (let cycle = 0; cycle < o.cycles; cycle++) {
      const server = await startReceiver(site.target, receiver.args, {}, receiver.script);
      // The worker's own commits fsync too, and would make the receiver's earlier commits durable with
      // them: every second cycle runs without it, so that a receiver that answers too early shows.
      const worker = cycle % 2 === 0 ? startWorker(site.target) : undefined;
      let sending = true;
      const sender = async (k: number) => {
        for (let i = 0; sending; ) {
          const id = unanswered.shift() ?? `${site.backend}-c${cycle}-s${k}-${i++}`;
          report.requests++;
          try {
            const res = await fetch(server.url, {
              method: "POST",
              headers: { "x-delivery-id": id, "content-type": "application/json" },
              body: JSON.stringify({ customer: `customer-${k}`, amount: amountOf(id) }),
              signal: AbortSignal.timeout(15_000),
            });
            await res.text();
            if (res.status !== 200) unanswered.push(id);
            else if (!acked.has(id)) {
              acked.add(id);
              appendFileSync(ackLog, `${id}\n`);
            }
          } catch {
            unanswered.push(id); // the receiver died under this request
            if (sending) await sleep(20);
          }
        }
      };
      const senders = Array.from({ length: o.senders }, (_, k) => sender(k));
      await sleep(o.minUpMs + o.random() * (o.maxUpMs - o.minUpMs));

      // Everything dies at once, as in a power cut: the database server first (its processes are all
      // signalled before kill() first waits), so that nothing it acknowledged is flushed after the instant.
      sending = false;
      const dying = [site.kill(), server.stop("SIGKILL"), worker?.kill()];
      await Promise.all(dying);
      await Promise.all(senders);
      // Harsh cuts in the second and third of every four cycles: each pairing of worker and cut comes round.
      const harsh = o.mixedCuts === true && (cycle % 4 === 1 || cycle % 4 === 2);
      const cutOptions: CutOptions = harsh ? { keep: 0.5, seed: 1 + Math.floor(o.random() * 2 ** 31) } : {};
      const cut = await layer.powerCycle(cutOptions);
      report.cycles++;
      report.droppedPages += cut.droppedPages;
      report.keptPages += cut.keptPages;
      report.undoneNames += cut.undone;

      up = await site.start();
      let contents: Contents | undefined;
      try {
        if (up.ok) contents = await site.read();
      } catch (error) {
        up = { ok: false, why: `cannot read it: ${error instanceof Error ? error.message : String(error)}` };
      }
      if (!contents || !up.ok) {
        // The database did not come back (a control may break it): everything acknowledged is lost.
        report.recovered = false;
        report.integrity.push(`cycle ${cycle}: the database is unusable after the cut: ${up.ok ? "" : up.why}`);
        for (const id of acked) lost.add(id);
        o.onCycle?.(finish());
        break;
      }
      if (contents.integrity !== "ok") report.integrity.push(`cycle ${cycle}: ${contents.integrity}`);
      // The reference is the log on the disk outside the layer, as a sender's own records would be.
      const logged = existsSync(ackLog) ? readFileSync(ackLog, "utf8").split("\n") : [];
      for (const id of logged) if (id && !contents.deliveries.has(id)) lost.add(id);
      report.payments.push(...paymentProblems(contents).map((p) => `cycle ${cycle}: ${p}`));
      report.stored = contents.deliveries.size;
      o.onCycle?.(finish());
      if (o.untilLoss && lost.size > 0) break;
    }

    if (report.recovered) {
      // The last start: a worker drains what was stored (leases held at the cut run out first).
      const worker = startWorker(site.target);
      const deadline = Date.now() + 120_000;
      let contents = await site.read();
      while (Date.now() < deadline) {
        if ([...contents.deliveries.values()].every((s) => s === "done" || s === "failed")) {
          report.drained = true;
          break;
        }
        await sleep(250);
        contents = await site.read();
      }
      await worker.stop();
      contents = await site.read();
      report.stored = contents.deliveries.size;
      report.exactlyOnce = exactlyOnceProblems(contents);
      if (contents.integrity !== "ok") report.integrity.push(`after the drain: ${contents.integrity}`);
    }
    return finish();
  } finally {
    await site.stop();
    await layer.unmount();
  }
}

// paymentProblems lists, after a cut, what breaks the rule that a payment and its done mark commit together.
function paymentProblems(c: Contents): string[] {
  const problems: string[] = [];
  for (const [id, status] of c.deliveries) {
    const paid = c.payments.get(id)?.length ?? 0;
    if (status === "done" && paid !== 1) problems.push(`${id} is done with ${paid} payments`);
    if (status !== "done" && paid > 0) problems.push(`${id} is ${status} but paid`);
    if (status === "failed") problems.push(`${id} failed`);
  }
  for (const id of c.payments.keys()) if (!c.deliveries.has(id)) problems.push(`payment ${id} has no delivery`);
  return problems.slice(0, 20);
}

// exactlyOnceProblems lists, after the drain, every delivery not done and paid exactly once, the right amount.
function exactlyOnceProblems(c: Contents): string[] {
  const problems: string[] = [];
  for (const [id, status] of c.deliveries) {
    const amounts = c.payments.get(id) ?? [];
    if (status !== "done") problems.push(`${id} is ${status}`);
    else if (amounts.length !== 1) problems.push(`${id} paid ${amounts.length} times`);
    else if (amounts[0] !== amountOf(id)) problems.push(`${id} paid ${amounts[0]}, sent ${amountOf(id)}`);
  }
  for (const id of c.payments.keys()) if (!c.deliveries.has(id)) problems.push(`payment ${id} has no delivery`);
  return problems.slice(0, 20);
}

// startWorker runs the real worker.ts, which records the article's payments, one row per delivery.
function startWorker(target: string): { kill(): Promise<void>; stop(): Promise<void> } {
  const child = spawnScript("worker.ts", ["--db", target, "--lease", "2", "--concurrency", "8", "--quiet"]);
  let said = "";
  child.stderr!.on("data", (d) => (said = (said + d).slice(-2_000)));
  child.stdout!.resume();
  const exited = new Promise<string>((resolve) => child.on("exit", (code, signal) => resolve(String(code ?? signal))));
  const end = async (signal: NodeJS.Signals) => {
    if (child.exitCode === null && child.signalCode === null) child.kill(signal);
    const how = await exited;
    // A worker stopped before it set its handlers up dies of the SIGTERM itself: that is a clean stop too.
    if (signal === "SIGTERM" && how !== "0" && how !== "SIGTERM")
      throw new Error(`worker.ts exited ${how}: ${said.trim()}`);
  };
  return { kill: () => end("SIGKILL"), stop: () => end("SIGTERM") };
}

// ---- SQLite ---------------------------------------------------------------------------------------

function readSqlite(path: string): Contents {
  if (!existsSync(path)) return { integrity: "ok", deliveries: new Map(), payments: new Map() };
  const conn = new DatabaseSync(path, { timeout: 10_000 });
  try {
    const integrity = (conn.prepare("PRAGMA integrity_check").all() as { integrity_check: string }[])
      .map((r) => r.integrity_check)
      .join("; ");
    const tables = new Set(
      (conn.prepare("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')").all() as { name: string }[]).map(
        (r) => r.name,
      ),
    );
    const deliveries = new Map<string, string>();
    if (tables.has("deliveries")) {
      for (const r of conn.prepare("SELECT id, status FROM deliveries").all() as { id: string; status: string }[])
        deliveries.set(r.id, r.status);
    }
    const payments = new Map<string, number[]>();
    if (tables.has("payments")) {
      for (const r of conn.prepare("SELECT delivery_id, amount FROM payments").all() as {
        delivery_id: string;
        amount: number;
      }[]) {
        payments.set(r.delivery_id, [...(payments.get(r.delivery_id) ?? []), r.amount]);
      }
    }
    return { integrity, deliveries, payments };
  } finally {
    conn.close();
  }
}

// ---- PostgreSQL -----------------------------------------------------------------------------------

// The durable settings the scenario holds PostgreSQL to, and small sizes so that checkpoints, buffer
// evictions and new WAL segments all happen within a few seconds of load.
const POSTGRES_SETTINGS = [
  "fsync=on",
  "synchronous_commit=on",
  "full_page_writes=on",
  "shared_buffers=16MB",
  "max_wal_size=64MB",
  "min_wal_size=32MB",
  "checkpoint_timeout=30s",
  "max_connections=60",
  "listen_addresses=127.0.0.1",
];

const SCHEMA = "powerloss";

async function postgresSite(dir: string, mountpoint: string, extra: string[]): Promise<Site> {
  const bin = PG_BIN!;
  const data = join(mountpoint, "pgdata");
  const sockets = join(dir, "sockets");
  const logFile = join(dir, "postgres.log");
  // initdb and postgres refuse to run as root: as root, run them as the postgres user, owning their folders.
  const asRoot = process.getuid?.() === 0;
  const owner = asRoot
    ? { uid: Number(await output("id", ["-u", "postgres"])), gid: Number(await output("id", ["-g", "postgres"])) }
    : undefined;
  const command = (program: string, args: string[]): [string, string[]] =>
    asRoot
      ? ["setpriv", ["--reuid=postgres", "--regid=postgres", "--init-groups", "--", join(bin, program), ...args]]
      : [join(bin, program), args];
  // The test's folders are private to root (mkdtemp): let the postgres user through to its own.
  for (let d = resolve(dir); owner && d !== "/"; d = dirname(d)) {
    const mode = statSync(d).mode;
    if (!(mode & 0o001)) chmodSync(d, (mode & 0o7777) | 0o711);
  }
  mkdirSync(sockets, { recursive: true });
  mkdirSync(data, { recursive: true, mode: 0o700 });
  if (owner) {
    chownSync(sockets, owner.uid, owner.gid);
    chownSync(data, owner.uid, owner.gid);
  }
  // initdb syncs what it wrote (no --no-sync): the new cluster is durable before the first cut.
  const [initdb, initArgs] = command("initdb", ["-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8"]);
  await output(initdb, initArgs);
  const port = await freePort();
  const url = `postgres://postgres@127.0.0.1:${port}/postgres`;
  let postmaster: ChildProcess | undefined;
  let exited: Promise<void> = Promise.resolve();

  const connectOnce = async () => {
    const { default: pg } = await import("pg");
    const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 2_000 });
    client.on("error", () => {});
    await client.connect();
    return client;
  };
  return {
    backend: "postgres",
    target: `${url}?schema=${SCHEMA}`,
    start: async () => {
      const settings = [...POSTGRES_SETTINGS, ...extra].flatMap((s) => ["-c", s]);
      const [program, args] = command("postgres", ["-D", data, "-p", String(port), "-k", sockets, ...settings]);
      const child = spawn(program, args, { cwd: "/", stdio: ["ignore", "pipe", "pipe"] });
      postmaster = child;
      for (const stream of [child.stdout!, child.stderr!]) stream.on("data", (d) => appendFileSync(logFile, d));
      exited = new Promise((resolve) => child.on("exit", () => resolve()));
      let gone = false;
      void exited.then(() => (gone = true));
      const deadline = Date.now() + 120_000;
      while (Date.now() < deadline && !gone) {
        try {
          const client = await connectOnce();
          await client.end();
          return { ok: true };
        } catch {
          await sleep(100);
        }
      }
      const tail = readFileSync(logFile, "utf8").trim().split("\n").slice(-3).join(" / ");
      if (!gone) child.kill("SIGKILL");
      await exited;
      return { ok: false, why: tail };
    },
    kill: async () => {
      if (!postmaster?.pid || postmaster.exitCode !== null || postmaster.signalCode !== null) return;
      // Stop the postmaster first, so it forks nothing new while its children are listed and killed.
      const pid = postmaster.pid;
      process.kill(pid, "SIGSTOP");
      const children = childrenOf(pid);
      for (const child of children) tryKill(child);
      process.kill(pid, "SIGKILL");
      await exited;
      while (children.some(alive)) await sleep(10);
    },
    read: async () => {
      const client = await connectOnce();
      try {
        const integrity = await amcheck(client);
        const deliveries = new Map<string, string>();
        const payments = new Map<string, number[]>();
        const has = async (table: string) =>
          (await client.query("SELECT to_regclass($1) IS NOT NULL AS ok", [`${SCHEMA}.${table}`])).rows[0].ok === true;
        if (await has("deliveries")) {
          for (const r of (await client.query(`SELECT id, status FROM ${SCHEMA}.deliveries`)).rows)
            deliveries.set(r.id, r.status);
        }
        if (await has("payments")) {
          for (const r of (await client.query(`SELECT delivery_id, amount FROM ${SCHEMA}.payments`)).rows) {
            payments.set(r.delivery_id, [...(payments.get(r.delivery_id) ?? []), Number(r.amount)]);
          }
        }
        return { integrity, deliveries, payments };
      } finally {
        await client.end();
      }
    },
    stop: async () => {
      if (postmaster && postmaster.exitCode === null && postmaster.signalCode === null) {
        postmaster.kill("SIGINT"); // fast shutdown
        await exited;
      }
    },
  };
}

// amcheck verifies every B-tree index of the scenario's schema and of the catalogs against its table: each
// partition's own index, as a partitioned table's index (relkind I) holds no entries of its own to check.
async function amcheck(client: {
  query(sql: string, params?: unknown[]): Promise<{ rows: Record<string, unknown>[] }>;
}): Promise<string> {
  try {
    await client.query("CREATE EXTENSION IF NOT EXISTS amcheck");
    await client.query(
      `SELECT bt_index_check(index => c.oid, heapallindexed => true)
       FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace
            JOIN pg_am a ON a.oid = c.relam
       WHERE n.nspname IN ($1, 'pg_catalog') AND a.amname = 'btree' AND c.relpersistence = 'p' AND c.relkind = 'i'`,
      [SCHEMA],
    );
    return "ok";
  } catch (error) {
    return `amcheck: ${error instanceof Error ? error.message : String(error)}`;
  }
}

function childrenOf(parent: number): number[] {
  const pids: number[] = [];
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    const stat = procStat(Number(name));
    if (stat && stat.ppid === parent) pids.push(Number(name));
  }
  return pids;
}

function procStat(pid: number): { state: string; ppid: number } | undefined {
  try {
    const text = readFileSync(`/proc/${pid}/stat`, "utf8");
    // The command name may hold spaces and parentheses: the fields start after the last ")".
    const [state, ppid] = text.slice(text.lastIndexOf(")") + 2).split(" ");
    return { state: state!, ppid: Number(ppid) };
  } catch {
    return undefined;
  }
}

// A process is gone once it has no entry or is a zombie: either way its files are closed.
const alive = (pid: number) => {
  const stat = procStat(pid);
  return stat !== undefined && stat.state !== "Z";
};

function tryKill(pid: number): void {
  try {
    process.kill(pid, "SIGKILL");
  } catch {
    // Already gone.
  }
}

function output(program: string, args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(program, args, { cwd: "/", stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    let err = "";
    child.stdout.on("data", (d) => (out += d));
    child.stderr.on("data", (d) => (err += d));
    child.on("error", reject);
    child.on("close", (code) =>
      code === 0
        ? resolve(out.trim())
        : reject(
            new Error(`${program} ${args.join(" ")}: exit ${code}: ${err.trim().split("\n").slice(-2).join(" / ")}`),
          ),
    );
  });
}

// test/chaos.ts: the crash scenarios, shared by the bounded tests (test/crash.test.ts, test/faults.test.ts)
// and the long run (`npm run torture`). Each one runs real child processes on a real database file, kills
// them with SIGKILL at random moments, and returns what it counted; the callers assert on the counts.
// postgresPipeline runs the whole pipeline on PostgreSQL, with dropped connections and server restarts too.

import type { ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { DatabaseSync } from "node:sqlite";
import { connect } from "../inbox.ts";
import { SqliteInbox } from "../lib/sqlite/sqlite.ts";
import type { Inbox } from "../lib/store.ts";
import { sha256 } from "../lib/rows.ts";
import { APPLICATION_NAME } from "../lib/postgres/commit.ts";
import { spawnScript, startReceiver } from "./helpers.ts";

/** Random is a seeded source of numbers in [0, 1), so a failing run can be replayed from its seed. */
export type Random = () => number;

/** seeded returns mulberry32 on the given seed. */
export function seeded(seed: number): Random {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const between = (random: Random, min: number, max: number) => min + Math.floor(random() * (max - min + 1));
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

// ---- Bodies that check themselves ----------------------------------------------------------------

/**
 * selfCheckingBody is the body sent for an ID: `id|length|sha256|payload`, where the payload is binary
 * (not UTF-8) and derived from the ID, so any stored row can be checked for being whole.
 */
export function selfCheckingBody(id: string, maxBytes = 16_384): Buffer {
  const length = 1 + (createHash("sha256").update(id).digest().readUInt32BE(0) % maxBytes);
  const payload = createHash("shake256", { outputLength: length }).update(id).digest();
  return Buffer.concat([Buffer.from(`${id}|${length}|${sha256(payload)}|`), payload]);
}

/** bodyIsWhole says whether a stored body is exactly the one its own header describes. */
export function bodyIsWhole(id: string, body: Uint8Array): boolean {
  const bytes = Buffer.from(body);
  const parts: number[] = [];
  for (let at = 0; parts.length < 3; at++) {
    at = bytes.indexOf(0x7c, at); // "|"
    if (at < 0) return false;
    parts.push(at);
  }
  const [a, b, c] = parts as [number, number, number];
  const payload = bytes.subarray(c + 1);
  return (
    bytes.subarray(0, a).toString() === id &&
    Number(bytes.subarray(a + 1, b).toString()) === payload.length &&
    bytes.subarray(b + 1, c).toString() === sha256(payload)
  );
}

// ---- 1. The receiver, killed while senders send ----------------------------------------------------

/** ReceiverCrashOptions sizes the receiver scenario. */
export interface ReceiverCrashOptions {
  dir: string;
  rounds: number;
  /** Concurrent senders. */
  senders: number;
  /** The receiver is killed a random time in [minUpMs, maxUpMs] after it starts listening. */
  minUpMs: number;
  maxUpMs: number;
  random: Random;
}

/** ReceiverCrashReport is what the receiver scenario counted, and what it found in the database. */
export interface ReceiverCrashReport {
  rounds: number;
  kills: number;
  sent: number;
  acked: number;
  duplicatesAcked: number;
  /** Resent deliveries not answered `duplicate`: must be 0. */
  wrongAnswers: string[];
  stored: number;
  /** Acknowledged IDs missing from the database: must be 0. */
  lost: string[];
  /** Rows whose body is not whole: must be 0. */
  partial: string[];
  integrity: string;
}

/**
 * receiverCrash runs rounds of: start receiver.ts, let concurrent senders POST self-checking bodies (and
 * resend acknowledged ones), SIGKILL it at a random moment. Then it checks the database file.
 */
export async function receiverCrash(o: ReceiverCrashOptions): Promise<ReceiverCrashReport> {
  const db = join(o.dir, "receiver-crash.db");
  const acked: string[] = [];
  const report = { rounds: o.rounds, kills: 0, sent: 0, acked: 0, duplicatesAcked: 0, wrongAnswers: [] as string[] };
  for (let round = 0; round < o.rounds; round++) {
    const receiver = await startReceiver(db, ["--quiet"]);
    let up = true;
    const sender = async (k: number) => {
      for (let i = 0; up; i++) {
        // One request in five resends a delivery already acknowledged: it must come back 200 duplicate.
        const resend = acked.length > 0 && o.random() < 0.2;
        const id = resend ? acked[Math.floor(o.random() * acked.length)]! : `r${round}-s${k}-${i}`;
        report.sent++;
        let answer: { status: number; text: string };
        try {
          const res = await fetch(receiver.url, {
            method: "POST",
            headers: { "x-delivery-id": id, "content-type": "application/octet-stream" },
            body: new Uint8Array(selfCheckingBody(id)),
            signal: AbortSignal.timeout(10_000),
          });
          answer = { status: res.status, text: await res.text() };
        } catch {
          // The receiver died under this request: unacknowledged, so a provider would keep it.
          if (!up) return;
          continue;
        }
        if (answer.status !== 200) continue;
        if (!resend) acked.push(id);
        else if (answer.text === "duplicate") report.duplicatesAcked++;
        else report.wrongAnswers.push(`${id} was resent and answered ${answer.text}`);
      }
    };
    const senders = Array.from({ length: o.senders }, (_, k) => sender(k));
    await sleep(between(o.random, o.minUpMs, o.maxUpMs));
    up = false;
    await receiver.stop("SIGKILL");
    report.kills++;
    await Promise.all(senders);
  }
  report.acked = acked.length;

  const conn = new DatabaseSync(db);
  try {
    const integrity = (conn.prepare("PRAGMA integrity_check").get() as { integrity_check: string }).integrity_check;
    const rows = conn.prepare("SELECT id, body, body_sha256 FROM deliveries").all() as {
      id: string;
      body: Uint8Array;
      body_sha256: string;
    }[];
    const ids = new Set(rows.map((r) => r.id));
    return {
      ...report,
      stored: rows.length,
      lost: acked.filter((id) => !ids.has(id)),
      partial: rows.filter((r) => !bodyIsWhole(r.id, r.body) || sha256(r.body) !== r.body_sha256).map((r) => r.id),
      integrity,
    };
  } finally {
    conn.close();
  }
}

// ---- 2. Workers, killed one at a time over a backlog -----------------------------------------------

/** prepareLedger creates the tables of the balance fixture: one account, and a row per applied effect. */
export function prepareLedger(inbox: SqliteInbox): void {
  inbox.db.exec(`CREATE TABLE IF NOT EXISTS accounts (name TEXT PRIMARY KEY, balance INTEGER NOT NULL);
                 INSERT OR IGNORE INTO accounts VALUES ('main', 0);
                 -- No unique key on purpose: an effect applied twice must show up, not be refused.
                 CREATE TABLE IF NOT EXISTS effects (delivery_id TEXT NOT NULL, pid INTEGER NOT NULL, attempt INTEGER NOT NULL);`);
}

/** Ledger is what the balance fixture's database says after a run. */
export interface Ledger {
  deliveries: number;
  done: number;
  processing: number;
  notDone: number;
  balance: number;
  expected: number;
  /** Deliveries done whose effect is missing: must be 0. */
  lost: number;
  /** Deliveries whose effect was applied more than once: must be 0. */
  doubled: number;
  /** Deliveries finished on a later attempt than the first, after their earlier lease expired. */
  takenOver: number;
}

/** readLedger checks a balance-fixture database: statuses, the balance, and the effects per delivery. */
export function readLedger(path: string): Ledger {
  const conn = new DatabaseSync(path, { timeout: 5_000 });
  try {
    const one = <T>(sql: string) => conn.prepare(sql).get() as T;
    const counts = one<{ n: number; done: number; processing: number; expected: number }>(
      `SELECT count(*) AS n, coalesce(sum(status = 'done'), 0) AS done, coalesce(sum(status = 'processing'), 0) AS processing,
              coalesce(sum(json_extract(CASE WHEN purged_at IS NULL THEN CAST(body AS TEXT) END, '$.amount')), 0) AS expected
       FROM deliveries`,
    );
    const effects = one<{ lost: number; doubled: number; takenOver: number }>(
      `SELECT coalesce(sum(d.status = 'done' AND e.n IS NULL), 0) AS lost,
              coalesce(sum(e.n > 1), 0) AS doubled,
              coalesce(sum(d.status = 'done' AND d.attempts > 1), 0) AS takenOver
       FROM deliveries d LEFT JOIN (SELECT delivery_id, count(*) AS n FROM effects GROUP BY delivery_id) e ON e.delivery_id = d.id`,
    );
    return {
      deliveries: counts.n,
      done: counts.done,
      processing: counts.processing,
      notDone: counts.n - counts.done,
      balance: one<{ balance: number }>("SELECT balance FROM accounts WHERE name = 'main'").balance,
      expected: counts.expected,
      ...effects,
    };
  } finally {
    conn.close();
  }
}

/** WorkerProcess is a balance-fixture worker with what it has said so far. */
export interface WorkerProcess {
  child: ChildProcess;
  /** IDs it claimed and has not yet finished, as far as its own lines tell. */
  inFlight: Set<string>;
  lines: string[];
  exited: Promise<number | null>;
}

/** startWorker spawns test/fixtures/balance-worker.ts on a database (a path or a URL) with the given extra arguments. */
export function startWorker(db: string, args: string[] = [], env: NodeJS.ProcessEnv = {}): WorkerProcess {
  const child = spawnScript("test/fixtures/balance-worker.ts", ["--db", db, ...args], env);
  const w: WorkerProcess = {
    child,
    inFlight: new Set(),
    lines: [],
    exited: new Promise((resolve) => child.on("exit", (code) => resolve(code))),
  };
  child.stderr!.on("data", (d) => w.lines.push(`stderr: ${d}`));
  createInterface({ input: child.stdout! }).on("line", (line) => {
    w.lines.push(line);
    const claim = /^claim (\S+)/.exec(line);
    if (claim) w.inFlight.add(claim[1]!);
    const end = /^(\S+?):? (done|failed|released|the lease was lost)/.exec(line);
    if (end) w.inFlight.delete(end[1]!);
  });
  return w;
}

/** WorkerCrashOptions sizes the worker scenario. */
export interface WorkerCrashOptions {
  dir: string;
  deliveries: number;
  workers: number;
  concurrency: number;
  leaseMs: number;
  /** Longest simulated work in a handler, in ms. */
  workMs: number;
  /** A worker is killed about this often, at random in [0.5, 1.5] times it. */
  killEveryMs: number;
  /** The scenario fails if the backlog is not done by then. */
  deadlineMs: number;
  random: Random;
}

/** WorkerCrashReport is the ledger after the run, plus the kills and what they interrupted. */
export interface WorkerCrashReport extends Ledger {
  kills: number;
  /** Kills that landed while the worker had a handler in flight (claimed, not yet finished). */
  killsMidHandler: number;
  finishedInTime: boolean;
}

/**
 * workerCrash stores a backlog of payments, runs several balance-fixture workers over it with short
 * leases, and SIGKILLs one at random about every killEveryMs, restarting it, until the backlog is done.
 */
export async function workerCrash(o: WorkerCrashOptions): Promise<WorkerCrashReport> {
  const db = join(o.dir, "worker-crash.db");
  const inbox = new SqliteInbox(db);
  prepareLedger(inbox);
  await Promise.all(
    Array.from({ length: o.deliveries }, (_, i) =>
      inbox.store({ id: `pay-${i}`, body: Buffer.from(JSON.stringify({ amount: between(o.random, 1, 1000) })) }),
    ),
  );
  await inbox.close();

  const args = ["--lease-ms", String(o.leaseMs), "--concurrency", String(o.concurrency), "--work-ms", String(o.workMs)];
  const workers = Array.from({ length: o.workers }, () => startWorker(db, args));
  let kills = 0;
  let killsMidHandler = 0;
  const deadline = Date.now() + o.deadlineMs;
  let nextKill = Date.now() + o.killEveryMs * (0.5 + o.random());
  let finishedInTime = false;
  while (Date.now() < deadline) {
    if (readLedger(db).done === o.deliveries) {
      finishedInTime = true;
      break;
    }
    if (Date.now() >= nextKill) {
      const k = Math.floor(o.random() * workers.length);
      const victim = workers[k]!;
      if (victim.inFlight.size > 0) killsMidHandler++;
      victim.child.kill("SIGKILL");
      await victim.exited;
      kills++;
      workers[k] = startWorker(db, args);
      nextKill = Date.now() + o.killEveryMs * (0.5 + o.random());
    }
    await sleep(50);
  }
  for (const w of workers) w.child.kill("SIGTERM");
  await Promise.all(workers.map((w) => w.exited));
  return { ...readLedger(db), kills, killsMidHandler, finishedInTime };
}

// ---- 3. A storm of processes storing and claiming at once ---------------------------------------

/** Claimer names how the storm processes claim: the inbox's own claim, or one of the naive ones. */
export type Claimer = "inbox" | "deferred" | "split";

/** StormReport is what K storm processes did between them. */
export interface StormReport {
  processes: number;
  deliveries: number;
  claims: number;
  /** Stored deliveries nobody claimed, or that are missing: must be 0. */
  lost: number;
  /** Deliveries claimed more than once: must be 0. */
  doubled: number;
  /** Operations that failed (SQLITE_BUSY and the like): must be 0. */
  errors: string[];
  exitCodes: (number | null)[];
}

/** busyStorm runs `processes` storm fixtures at once on one database and tallies their claims. */
export async function busyStorm(o: {
  dir: string;
  processes: number;
  perProcess: number;
  claimer: Claimer;
}): Promise<StormReport> {
  const db = join(o.dir, `storm-${o.claimer}.db`);
  // Create the schema first, so the storm is about storing and claiming, not about the first migration.
  await new SqliteInbox(db).close();
  const runs = Array.from({ length: o.processes }, (_, me) => {
    const child = spawnScript("test/fixtures/storm.ts", [
      "--db",
      db,
      "--me",
      String(me),
      "--procs",
      String(o.processes),
      "--count",
      String(o.perProcess),
      "--claimer",
      o.claimer,
    ]);
    let out = "";
    let err = "";
    child.stdout!.on("data", (d) => (out += d));
    child.stderr!.on("data", (d) => (err += d));
    return new Promise<{ code: number | null; out: string; err: string }>((resolve) =>
      child.on("close", (code) => resolve({ code, out, err })),
    );
  });
  const results = await Promise.all(runs);
  const seen = new Map<string, number>();
  const errors: string[] = [];
  for (const r of results) {
    const last = r.out.trim().split("\n").at(-1) ?? "";
    let parsed: { claimed: string[]; errors: string[] } = { claimed: [], errors: [] };
    try {
      parsed = JSON.parse(last) as typeof parsed;
    } catch {
      errors.push(`a storm process exited ${r.code} without its summary: ${r.err.trim().split("\n").at(-1) ?? ""}`);
    }
    for (const id of parsed.claimed) seen.set(id, (seen.get(id) ?? 0) + 1);
    errors.push(...parsed.errors);
  }
  const conn = new DatabaseSync(db);
  const ids = (conn.prepare("SELECT id FROM deliveries").all() as { id: string }[]).map((r) => r.id);
  conn.close();
  const expected = o.processes * o.perProcess;
  return {
    processes: o.processes,
    deliveries: ids.length,
    claims: [...seen.values()].reduce((a, b) => a + b, 0),
    lost: expected - ids.filter((id) => seen.has(id)).length,
    doubled: [...seen.values()].filter((n) => n > 1).length,
    errors,
    exitCodes: results.map((r) => r.code),
  };
}

// ---- 4. The whole pipeline: senders, a receiver and workers, any of them killed ----------------------

/** PipelineCrashOptions sizes the end-to-end scenario. */
export interface PipelineCrashOptions {
  dir: string;
  /** How long the kills go on; then the backlog is drained. */
  seconds: number;
  senders: number;
  workers: number;
  /** One process, the receiver or a worker, is killed about this often. */
  killEveryMs: number;
  random: Random;
  /** The workers also purge every done body this often (retention under crashes). @default undefined, no purge */
  purgeEveryMs?: number;
}

/** PipelineCrashReport is what the senders were told, and what the ledger says after the drain. */
export interface PipelineCrashReport extends Ledger {
  kills: number;
  receiverKills: number;
  acked: number;
  /** Acknowledged IDs that are not in the database, or not done: must be 0. */
  lostAcked: number;
  integrity: string;
  drained: boolean;
  /** Bodies purged (tombstones), and tombstones of deliveries that were not done: must be 0. */
  purged: number;
  purgedUndone: number;
}

/**
 * pipelineCrash runs senders against receiver.ts while balance-fixture workers process what it stores,
 * and SIGKILLs the receiver or a worker about every killEveryMs. Senders resend what was not answered
 * 200, as a provider does. Afterwards every acknowledged payment must be applied exactly once.
 */
export async function pipelineCrash(o: PipelineCrashOptions): Promise<PipelineCrashReport> {
  const db = join(o.dir, "pipeline.db");
  const setup = new SqliteInbox(db);
  prepareLedger(setup);
  await setup.close();
  const amountOf = (id: string) => 1 + (createHash("sha256").update(id).digest().readUInt16BE(0) % 1000);

  let receiver = await startReceiver(db, ["--quiet"]);
  const workerArgs = [
    "--lease-ms",
    "1000",
    "--work-ms",
    "40",
    ...(o.purgeEveryMs ? ["--purge-every-ms", String(o.purgeEveryMs)] : []),
  ];
  const workers = Array.from({ length: o.workers }, () => startWorker(db, workerArgs));
  const acked = new Set<string>();
  let sending = true;
  const sender = async (k: number) => {
    const unanswered: string[] = [];
    for (let i = 0; sending; ) {
      const id = unanswered.shift() ?? `p-s${k}-${i++}`;
      try {
        const res = await fetch(receiver.url, {
          method: "POST",
          headers: { "x-delivery-id": id },
          body: JSON.stringify({ amount: amountOf(id) }),
          signal: AbortSignal.timeout(10_000),
        });
        await res.text();
        if (res.status === 200) acked.add(id);
        else unanswered.push(id);
      } catch {
        unanswered.push(id); // the receiver died under this request: send it again
        await sleep(20);
      }
    }
  };
  const senders = Array.from({ length: o.senders }, (_, k) => sender(k));

  let kills = 0;
  let receiverKills = 0;
  const until = Date.now() + o.seconds * 1000;
  while (Date.now() < until) {
    await sleep(o.killEveryMs * (0.5 + o.random()));
    // Half the kills take the receiver, half a worker picked at random.
    const k = o.random() < 0.5 ? -1 : Math.floor(o.random() * workers.length);
    if (k < 0) {
      await receiver.stop("SIGKILL");
      receiver = await startReceiver(db, ["--quiet"]);
      receiverKills++;
    } else {
      workers[k]!.child.kill("SIGKILL");
      await workers[k]!.exited;
      workers[k] = startWorker(db, workerArgs);
    }
    kills++;
  }
  sending = false;
  await Promise.all(senders);

  // Let the workers drain what was stored, then stop everything.
  const deadline = Date.now() + 120_000;
  let drained = false;
  while (Date.now() < deadline) {
    const l = readLedger(db);
    if (l.done === l.deliveries) {
      drained = true;
      break;
    }
    await sleep(100);
  }
  await receiver.stop("SIGTERM");
  for (const w of workers) w.child.kill("SIGTERM");
  await Promise.all(workers.map((w) => w.exited));

  const conn = new DatabaseSync(db);
  const integrity = (conn.prepare("PRAGMA integrity_check").get() as { integrity_check: string }).integrity_check;
  const done = new Set(
    (conn.prepare("SELECT id FROM deliveries WHERE status = 'done'").all() as { id: string }[]).map((r) => r.id),
  );
  const purged = conn
    .prepare(
      "SELECT count(*) AS n, coalesce(sum(status <> 'done'), 0) AS undone FROM deliveries WHERE purged_at IS NOT NULL",
    )
    .get() as { n: number; undone: number };
  // A purged body no longer says its amount; the ID does, as the senders chose it.
  const ids = conn.prepare("SELECT id FROM deliveries").all() as { id: string }[];
  conn.close();
  const ledger = readLedger(db);
  return {
    ...ledger,
    expected: o.purgeEveryMs ? ids.reduce((sum, r) => sum + amountOf(r.id), 0) : ledger.expected,
    kills,
    receiverKills,
    acked: acked.size,
    lostAcked: [...acked].filter((id) => !done.has(id)).length,
    integrity,
    drained,
    purged: purged.n,
    purgedUndone: purged.undone,
  };
}

// ---- 5. The whole pipeline on PostgreSQL: two receivers, three workers, dropped connections, a restart ---

/** prepareLedgerOn creates the balance fixture's tables on any backend (prepareLedger is SQLite's own). */
export async function prepareLedgerOn(inbox: Inbox): Promise<void> {
  await inbox.query("CREATE TABLE IF NOT EXISTS accounts (name TEXT PRIMARY KEY, balance BIGINT NOT NULL)");
  await inbox.query("INSERT INTO accounts VALUES ('main', 0) ON CONFLICT DO NOTHING");
  // No unique key on purpose: an effect applied twice must show up, not be refused.
  await inbox.query(
    "CREATE TABLE IF NOT EXISTS effects (delivery_id TEXT NOT NULL, pid INTEGER NOT NULL, attempt INTEGER NOT NULL)",
  );
}

/** readLedgerOn is readLedger for an inbox on PostgreSQL, read through the contract's query(). */
export async function readLedgerOn(inbox: Inbox): Promise<Ledger> {
  const [counts] = await inbox.query(
    `SELECT count(*) AS n, count(*) FILTER (WHERE status = 'done') AS done, count(*) FILTER (WHERE status = 'processing') AS processing,
            coalesce(sum((convert_from(body, 'UTF8')::json->>'amount')::bigint), 0)::bigint AS expected FROM deliveries`,
  );
  const [effects] = await inbox.query(
    `SELECT count(*) FILTER (WHERE d.status = 'done' AND e.n IS NULL) AS lost, count(*) FILTER (WHERE e.n > 1) AS doubled,
            count(*) FILTER (WHERE d.status = 'done' AND d.attempts > 1) AS taken_over
     FROM deliveries d LEFT JOIN (SELECT delivery_id, count(*) AS n FROM effects GROUP BY delivery_id) e ON e.delivery_id = d.id`,
  );
  const [account] = await inbox.query("SELECT balance FROM accounts WHERE name = 'main'");
  const n = Number(counts!.n);
  const done = Number(counts!.done);
  return {
    deliveries: n,
    done,
    processing: Number(counts!.processing),
    notDone: n - done,
    balance: Number(account!.balance),
    expected: Number(counts!.expected),
    lost: Number(effects!.lost),
    doubled: Number(effects!.doubled),
    takenOver: Number(effects!.taken_over),
  };
}

/** PostgresPipelineOptions sizes the PostgreSQL pipeline scenario. */
export interface PostgresPipelineOptions {
  /** A postgres:// URL with its own ?schema=; the scenario adds an application_name to find its connections. */
  url: string;
  seconds: number;
  senders: number;
  receivers: number;
  workers: number;
  /** One process, a receiver or a worker, is SIGKILLed about this often; 0 for none. */
  killEveryMs: number;
  /** The scripts' connections are ended with pg_terminate_backend about this often; 0 for never. */
  terminateEveryMs: number;
  /** Restarts the server (a private one: never the shared server) this many times, evenly over the load. */
  restart?: { times: number; run: () => Promise<void> };
  random: Random;
}

/** PostgresPipelineReport is what the senders were told, what chaos was done, and what the ledger says. */
export interface PostgresPipelineReport extends Ledger {
  kills: number;
  receiverKills: number;
  /** Backends ended by pg_terminate_backend, over all the rounds. */
  terminations: number;
  /** Of those, the ones that were running a statement or inside a transaction (not idle) when ended. */
  terminationsMidTransaction: number;
  terminateRounds: number;
  serverRestarts: number;
  requests: number;
  /** Answers 503 (the database could not take the delivery): the sender keeps it and sends it again. */
  unavailable: number;
  /** 503 answers without a Retry-After: must be 0. */
  unavailableWithoutRetryAfter: number;
  acked: number;
  /** Acknowledged IDs that are not done after the drain: must be 0. */
  lostAcked: number;
  /** Scripts that exited without being killed: must be []; every script survives a dropped connection. */
  unexpectedExits: string[];
  /** A (re)started script that could not connect and was started again: only right after a restart. */
  failedStarts: number;
  drained: boolean;
  /** How long the load and the chaos went on, and how long the drain took after it. */
  loadMs: number;
  drainMs: number;
}

/**
 * postgresPipeline runs senders against several receivers, alternating between them, while balance-fixture
 * workers process what they store, all on one PostgreSQL schema. Meanwhile it SIGKILLs one script about
 * every killEveryMs (and starts it again), ends the scripts' connections with pg_terminate_backend, and
 * restarts the server if given one. Then it drains the backlog and reads the ledger.
 */
export async function postgresPipeline(o: PostgresPipelineOptions): Promise<PostgresPipelineReport> {
  const url = new URL(o.url);
  const schema = url.searchParams.get("schema") ?? "public";
  const appName = `${APPLICATION_NAME} chaos ${schema}`;
  url.searchParams.set("application_name", appName);
  const target = url.toString();
  // The test's own connection is named otherwise, so the terminations never end it.
  const reader = await connect(o.url.replace(/\?/, `?application_name=inbox-chaos-reader&`));
  await prepareLedgerOn(reader);
  const amountOf = (id: string) => 1 + (createHash("sha256").update(id).digest().readUInt16BE(0) % 1000);
  const report = {
    kills: 0,
    receiverKills: 0,
    terminations: 0,
    terminationsMidTransaction: 0,
    terminateRounds: 0,
    serverRestarts: 0,
    requests: 0,
    unavailable: 0,
    unavailableWithoutRetryAfter: 0,
    unexpectedExits: [] as string[],
    failedStarts: 0,
  };

  // Every script is watched: one that exits while nobody killed it is a failure of the scenario.
  let stopping = false;
  const watch = (name: string, child: ChildProcess, log: () => string) => {
    const entry = { killed: false };
    child.on("exit", (code, signal) => {
      // The error's own line and the first frames say where it came from; the last lines are Node's banner.
      const said = log()
        .split("\n")
        .filter((l) => /Error|error|^\s+at /.test(l))
        .slice(0, 6)
        .join(" / ");
      if (!entry.killed && !stopping) report.unexpectedExits.push(`${name} exited ${code ?? signal}: ${said}`);
    });
    return entry;
  };
  type Script = { kill(): Promise<void>; url?: string };
  const startReceiverScript = async (k: number): Promise<Script> => {
    for (;;) {
      try {
        const r = await startReceiver(target, ["--quiet"]);
        const w = watch(`receiver ${k}`, r.child, r.log);
        return { url: r.url, kill: async () => void ((w.killed = true), await r.stop("SIGKILL")) };
      } catch {
        report.failedStarts++;
        await sleep(100);
      }
    }
  };
  const workerArgs = ["--lease-ms", "1000", "--work-ms", "20", "--concurrency", "8", "--retry-delay-ms", "100"];
  const startWorkerScript = async (k: number): Promise<Script> => {
    for (;;) {
      const w = startWorker(target, workerArgs);
      const ready = await Promise.race([
        new Promise<boolean>((resolve) => {
          const t = setInterval(() => w.lines.includes("ready") && (clearInterval(t), resolve(true)), 20);
          void w.exited.then(() => clearInterval(t));
        }),
        w.exited.then(() => false),
      ]);
      if (!ready) {
        report.failedStarts++;
        await sleep(100);
        continue;
      }
      const entry = watch(`worker ${k}`, w.child, () => w.lines.join(""));
      return {
        kill: async () => {
          entry.killed = true;
          w.child.kill("SIGKILL");
          await w.exited;
        },
      };
    }
  };
  const receivers = await Promise.all(Array.from({ length: o.receivers }, (_, k) => startReceiverScript(k)));
  const workers = await Promise.all(Array.from({ length: o.workers }, (_, k) => startWorkerScript(k)));

  const acked = new Set<string>();
  let sending = true;
  const sender = async (k: number) => {
    const unanswered: string[] = [];
    for (let i = 0, turn = k; sending; turn++) {
      const id = unanswered.shift() ?? `pg-s${k}-${i++}`;
      // Alternate between the receivers, as a load balancer would; one being restarted is skipped by the next.
      const to = receivers[turn % receivers.length]!.url!;
      report.requests++;
      try {
        const res = await fetch(to, {
          method: "POST",
          headers: { "x-delivery-id": id },
          body: JSON.stringify({ amount: amountOf(id) }),
          signal: AbortSignal.timeout(15_000),
        });
        await res.text();
        if (res.status === 200) acked.add(id);
        else {
          if (res.status === 503) {
            report.unavailable++;
            if (!res.headers.get("retry-after")) report.unavailableWithoutRetryAfter++;
          }
          unanswered.push(id);
          await sleep(20);
        }
      } catch {
        unanswered.push(id); // the receiver died under this request: send it again
        await sleep(20);
      }
    }
  };
  const senders = Array.from({ length: o.senders }, (_, k) => sender(k));

  // pg_terminate_backend on every connection the scripts hold: pool connections mid-batch, and LISTENs.
  const terminator = (async () => {
    if (o.terminateEveryMs <= 0) return;
    while (sending) {
      await sleep(o.terminateEveryMs * (0.5 + o.random()));
      if (!sending) break;
      try {
        const rows = await reader.query(
          `SELECT pg_terminate_backend(pid) AS ended, state FROM pg_stat_activity
           WHERE datname = current_database() AND application_name = ? AND pid <> pg_backend_pid()`,
          appName,
        );
        report.terminations += rows.filter((r) => r.ended === true).length;
        report.terminationsMidTransaction += rows.filter((r) => r.ended === true && r.state !== "idle").length;
        report.terminateRounds++;
      } catch {
        // The server is restarting: nothing to end right now.
      }
    }
  })();

  // The server restarts, spread evenly over the run. A script (re)started while the server is down fails
  // to connect and is started again: that is counted in failedStarts, never as an unexpected exit.
  const started = Date.now();
  const until = started + o.seconds * 1000;
  const restarts = o.restart?.times ?? 0;
  const restarter = (async () => {
    for (let i = 1; i <= restarts; i++) {
      await sleep(started + (i * o.seconds * 1000) / (restarts + 1) - Date.now());
      await o.restart!.run();
      report.serverRestarts++;
    }
  })();
  while (Date.now() < until) {
    await sleep(o.killEveryMs > 0 ? o.killEveryMs * (0.5 + o.random()) : 100);
    if (o.killEveryMs <= 0) continue;
    const k = Math.floor(o.random() * (receivers.length + workers.length));
    if (k < receivers.length) {
      await receivers[k]!.kill();
      receivers[k] = await startReceiverScript(k);
      report.receiverKills++;
    } else {
      const j = k - receivers.length;
      await workers[j]!.kill();
      workers[j] = await startWorkerScript(j);
    }
    report.kills++;
  }
  await restarter;
  sending = false;
  await Promise.all([...senders, terminator]);

  // Let the workers drain what was stored, then stop everything.
  const drainFrom = Date.now();
  const deadline = drainFrom + 120_000;
  let drained = false;
  while (Date.now() < deadline) {
    const l = await readLedgerOn(reader);
    if (l.done === l.deliveries) {
      drained = true;
      break;
    }
    await sleep(200);
  }
  stopping = true;
  await Promise.all([...receivers, ...workers].map((s) => s.kill()));
  const done = new Set(
    (await reader.query("SELECT id FROM deliveries WHERE status = 'done'")).map((r) => r.id as string),
  );
  const ledger = await readLedgerOn(reader);
  await reader.close();
  return {
    ...ledger,
    ...report,
    acked: acked.size,
    lostAcked: [...acked].filter((id) => !done.has(id)).length,
    drained,
    loadMs: drainFrom - started,
    drainMs: Date.now() - drainFrom,
  };
}

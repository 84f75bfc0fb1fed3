// postgres/commit.ts: how the PostgreSQL inbox's writes reach the server. Writes are queued and batched,
// up to the pool's size of transactions at once (two of stores alone), each committed (synchronous_commit
// on) before its ops settle, a batch of new deliveries in one round trip; a failed op is redone alone
// under a savepoint, a lost connection fails its batch and is dropped. Beside it: the LISTEN/NOTIFY
// wake-ups, ready(), and NOW and toPg(), the time and parameters every statement of the backend takes.

import pg from "pg";
import { DEFAULTS } from "../defaults.ts";
import { message } from "../log.ts";
import { passingSqlstate } from "../errors.ts";
import { inOneWrite, parseTarget, Pool, UncertainCommit } from "./pool.ts";
import type { Incoming, InboxOptions, Lease, LocalWrite, SqlValue, Stored, Try } from "../store.ts";

/** APPLICATION_NAME is how this inbox's connections appear in pg_stat_activity, unless the URL names another. */
export const APPLICATION_NAME = "webhook-inbox";

// int8 as a JS number: times in ms and counts are far below 2^53.
const TYPES = {
  getTypeParser: ((oid: number, format?: string) =>
    oid === 20
      ? (value: string) => Number(value)
      : pg.types.getTypeParser(oid, format as "text")) as typeof pg.types.getTypeParser,
};

// BY_INDEX keeps the rest of a transaction on index scans and nested loops, the plans the hot path's
// statements get anyway once the table has statistics. Without them (a backlog filled faster than
// autovacuum analyzes it, or a server with autovacuum off) the planner guesses, and guessed wrong for the
// claim (see claimIn), for the done marks and for the lock that a batch takes before them (lockInOrder):
// it read every waiting row through the due index and hash-joined them, 500 ms for 256 done marks at a
// fresh 1M backlog instead of 3 ms, and the lock read the whole table (70 ms for 63 rows at 3,000).
export const BY_INDEX = `SELECT set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true),
                         set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)`;
// NO_FLUSH lets a claim's transaction commit without waiting for the WAL flush (see claimIn).
export const NO_FLUSH = "SELECT set_config('synchronous_commit', 'off', true)";
// BY_DEFAULT gives the statements after them (a handler's writes) the connection's own plans back. SET LOCAL
// … TO DEFAULT is the value a RESET would give, for this transaction only: reading it from pg_settings
// built the view's every row (368 of them), 1.3–3 ms for each batch of done marks.
export const BY_DEFAULT = `SET LOCAL enable_bitmapscan TO DEFAULT; SET LOCAL enable_seqscan TO DEFAULT;
                           SET LOCAL enable_hashjoin TO DEFAULT; SET LOCAL enable_mergejoin TO DEFAULT`;

// named gives each statement text a server-side prepared statement, parsed and planned once per
// connection rather than at every call: a handler's insert runs hundreds of times per batch.
const names = new Map<string, string>();
export function named(text: string, values: unknown[]): { name: string; text: string; values: unknown[] } {
  let name = names.get(text);
  if (name === undefined) names.set(text, (name = `inbox_${names.size}`));
  return { name, text, values };
}

// One queued write. Stores and finishes of one batch share a statement each; the rest run one by one.
export type Op =
  | {
      kind: "store";
      source: string;
      incoming: Incoming;
      digest: string;
      routes: readonly string[];
      /** Its order key and event time, checked and worked out once, by store(). */
      order: { key: string | null; eventTime: number | null; strict: boolean };
      resolve(v: unknown): void;
      reject(e: unknown): void;
    }
  | {
      kind: "finish";
      lease: Lease;
      writes: readonly LocalWrite[];
      /** The try, kept in the attempt log with the done mark. */
      attempt?: Try;
      resolve(v: unknown): void;
      reject(e: unknown): void;
    }
  | {
      kind: "other" | "claim";
      run(client: pg.PoolClient): Promise<unknown>;
      together?: boolean;
      locks?: Locks;
      resolve(v: unknown): void;
      reject(e: unknown): void;
    };

/**
 * Locks names the rows an op will wait for: its lease's row (and its order key's), or a destination's.
 * The batch takes them all before any op runs, in the one order (see lockInOrder).
 */
export interface Locks {
  lease?: Lease;
  destination?: string;
}

export type Queued = Op extends infer T ? (T extends Op ? Omit<T, "resolve" | "reject"> : never) : never;

// A batch error concerns the connection or the server, not one op: every op of the batch fails with it,
// the batch is never redone, and its connection is dropped. A read-only server (25006) is one: a primary
// turned standby. So is a COMMIT that may not be on the standby. The classes are passing()'s (one list, in
// errors.ts), with XX (an internal error) and a socket's code besides.
function isBatchError(error: unknown): boolean {
  if (error instanceof UncertainCommit) return true;
  const code = (error as { code?: unknown }).code;
  if (typeof code !== "string") return /connection|terminat|not queryable|timeout|rolled back/i.test(message(error));
  return passingSqlstate(code) || code.startsWith("XX") || /^E[A-Z]+$/.test(code);
}

// Every statement takes the time as $1: a pinned clock in tests, else NULL and the database's own, so
// that hosts whose clocks differ still agree on when a lease ends.
/** NOW is the time every statement takes as $1: a pinned clock in tests, else the database's own. */
export const NOW = "coalesce($1::bigint, (extract(epoch FROM statement_timestamp()) * 1000)::bigint)";

const translated = new Map<string, string>();
/** toPg turns `?` parameters into PostgreSQL's $1, $2 …, leaving quoted text alone. */
export function toPg(sql: string, offset = 0): string {
  const key = `${offset}:${sql}`;
  let text = translated.get(key);
  if (text === undefined) {
    let n = offset;
    text = sql.replace(/'(?:[^']|'')*'|"(?:[^"]|"")*"|\?/g, (m) => (m === "?" ? `$${++n}` : m));
    translated.set(key, text);
  }
  return text;
}

/**
 * PostgresCommitter is the pool and its batches: enqueue() runs a write in the next transaction and
 * settles it after COMMIT; stores and finishes of one batch go through storeAll() and finishAll(), which
 * PostgresInbox implements (its stores through postgres/store.ts). It also keeps the LISTEN connection that wakes workers (onWake()).
 */
export abstract class PostgresCommitter {
  readonly target: string;
  readonly schema: string;
  protected readonly pool: Pool;
  protected readonly batchSize: number;
  protected readonly poolSize: number;
  private readonly listen: boolean;
  protected queue: Op[] = [];
  private running = 0;
  // Transactions of stores alone in flight (see DEFAULTS.storeBatchesInFlight).
  private storing = 0;
  private scheduled = false;
  private idle: (() => void)[] = [];
  protected closed = false;
  private lastNotify = 0;
  private listener: pg.Client | undefined;
  private wakeListeners: ((payload?: string) => void)[] = [];
  private listenTimer: NodeJS.Timeout | undefined;
  private readonly onCommit: ((size: number, ms: number) => void) | undefined;
  // The error of the last batch that failed as a whole (a lost server, a full disk), until one commits.
  protected commitError: unknown;

  constructor(url: string, options: InboxOptions) {
    const target = parseTarget(url);
    this.target = target.redacted;
    this.schema = target.schema;
    this.batchSize = Math.max(1, options.batchSize ?? DEFAULTS.batchSize);
    this.poolSize = Math.max(1, Math.round(options.poolSize ?? DEFAULTS.poolSize));
    this.listen = (options.listen ?? true) && target.listen !== false;
    this.onCommit = options.onCommit;
    this.pool = new Pool(target, {
      size: this.poolSize,
      connectTimeoutMs: DEFAULTS.connectTimeoutMs,
      applicationName: APPLICATION_NAME,
      types: TYPES,
    });
  }

  protected abstract storeAll(client: pg.PoolClient, ops: Extract<Op, { kind: "store" }>[]): Promise<Map<Op, Stored>>;
  protected abstract storeOnce(ops: Extract<Op, { kind: "store" }>[]): pg.QueryConfig | undefined;
  protected abstract finishAll(
    client: pg.PoolClient,
    ops: Extract<Op, { kind: "finish" }>[],
  ): Promise<Map<Op, boolean>>;

  onWake(listener: (payload?: string) => void): () => void {
    this.wakeListeners.push(listener);
    if (this.listen && !this.listener && !this.listenTimer) void this.startListening();
    return () => void (this.wakeListeners = this.wakeListeners.filter((l) => l !== listener));
  }

  // startListening keeps one connection LISTENing; when it drops, polling carries on and it comes back.
  private async startListening(): Promise<void> {
    if (this.closed) return;
    const client = this.pool.listener();
    // Held from the start, not once connected: an onWake() while the LISTEN is still on its way must not
    // open a second connection (which woke every listener twice, and which close() left open).
    this.listener = client;
    const retry = () => {
      if (this.listener === client) this.listener = undefined;
      client.end().catch(() => {});
      if (!this.closed && !this.listenTimer) {
        this.listenTimer = setTimeout(() => {
          this.listenTimer = undefined;
          void this.startListening();
        }, 1_000);
        this.listenTimer.unref();
      }
    };
    client.on("error", retry);
    client.on("end", retry);
    // The payload says what woke it: '' for new deliveries, 'config' for a new configuration (applyConfig).
    client.on("notification", (n) => {
      for (const listener of this.wakeListeners) listener(n.payload);
    });
    try {
      await client.connect();
      await client.query(`LISTEN ${this.channel()}`);
      // Unref'd like a timer: a LISTEN alone must not keep a finished script alive.
      (client as unknown as { connection: { stream: { unref(): void } } }).connection.stream.unref();
    } catch {
      retry();
    }
  }

  protected channel(): string {
    return `inbox_wake_${this.schema}`;
  }

  // notify wakes listening workers at commit; at most once per notifyEveryMs from this process, since
  // every NOTIFY serialises commits on a global lock.
  protected notify(client: pg.PoolClient, added: number): void {
    if (!this.listen || added === 0) return;
    const t = performance.now();
    if (t - this.lastNotify < DEFAULTS.notifyEveryMs) return;
    this.lastNotify = t;
    void client.query("SELECT pg_notify($1, '')", [this.channel()]).catch(() => {});
  }

  flush(): Promise<void> {
    if (this.queue.length === 0 && this.running === 0) return Promise.resolve();
    return new Promise((resolve) => this.idle.push(resolve));
  }

  async close(): Promise<void> {
    if (this.closed) return;
    await this.flush();
    this.closed = true;
    clearTimeout(this.listenTimer);
    const listener = this.listener;
    this.listener = undefined;
    await listener?.end().catch(() => {});
    await this.pool.end();
  }

  /**
   * ready asks the server, within DEFAULTS.readyTimeoutMs, whether it takes writes: reachable, not a
   * standby, not read-only. After a batch failed as a whole it also commits a write of its own (the
   * schema's version row, unchanged), so a full disk counts until a write goes through again.
   */
  async ready(): Promise<true | string> {
    if (this.closed) return "the inbox is closed";
    const probe = async (): Promise<true | string> => {
      const client = await this.pool.transaction();
      let broken: Error | undefined;
      try {
        const { rows } = await client.query(
          "SELECT pg_is_in_recovery() AS recovery, current_setting('transaction_read_only') AS ro",
        );
        const failed = this.commitError;
        if (!rows[0].recovery && rows[0].ro !== "on" && failed !== undefined) {
          await client.query(
            "UPDATE inbox_migrations SET version = version WHERE version = (SELECT max(version) FROM inbox_migrations)",
          );
        }
        await this.pool.commit(client);
        if (rows[0].recovery) return "the database is a standby, in recovery";
        if (rows[0].ro === "on") return "the database is read-only";
        if (this.commitError === failed) this.commitError = undefined;
        return true;
      } catch (error) {
        broken = error instanceof Error ? error : new Error(message(error));
        await client.query("ROLLBACK").catch(() => {});
        throw broken;
      } finally {
        client.release(broken);
      }
    };
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<string>((resolve) => {
      timer = setTimeout(
        () => resolve(`no answer from ${this.target} within ${DEFAULTS.readyTimeoutMs} ms`),
        DEFAULTS.readyTimeoutMs,
      );
    });
    try {
      return await Promise.race([probe().catch((error: unknown) => `cannot commit: ${message(error)}`), timeout]);
    } finally {
      clearTimeout(timer);
    }
  }

  // other queues an op of its own; together, one that touches only its own lease's row, which may run beside the others.
  // locks names the rows it will wait for, which the batch then takes first, in the one order.
  protected other(run: (client: pg.PoolClient) => Promise<unknown>, together = false, locks?: Locks): Promise<unknown> {
    return this.enqueue({ kind: "other", run, together, ...(locks ? { locks } : {}) });
  }

  // prepared names the hot path's statements (store, claim, done marks, the locks before them, a permit), so
  // each connection parses and plans them once: planning the store's INSERT took 0.3 ms, as long as running
  // it for a small batch. Behind a per-transaction pooler (?listen=false) nothing is kept on a server
  // connection, named statements included: there they go unnamed, as the handlers' writes do.
  protected prepared(text: string, values: unknown[]): pg.QueryConfig {
    return this.pool.pooled ? { text, values } : named(text, values);
  }

  protected enqueue(op: Queued): Promise<unknown> {
    if (this.closed) return Promise.reject(new Error(`inbox ${this.target} is closed`));
    return new Promise((resolve, reject) => {
      this.queue.push({ ...op, resolve, reject } as Op);
      this.schedule();
    });
  }

  // schedule starts a transaction for what is queued, up to poolSize at once; setImmediate lets every
  // request already read off the sockets join the batch.
  private schedule(): void {
    if (this.scheduled || this.queue.length === 0 || this.running >= this.poolSize) return;
    this.scheduled = true;
    setImmediate(() => {
      this.scheduled = false;
      while (this.queue.length > 0 && this.running < this.poolSize) {
        // Stores wait for a batch of them to commit rather than go in a smaller transaction beside it: the
        // next batch is then larger, and its COMMIT shares the server's next flush (docs/performance.md).
        const stores = this.queue.length <= this.batchSize && this.queue.every((op) => op.kind === "store");
        if (stores && this.storing >= DEFAULTS.storeBatchesInFlight) break;
        const batch = this.queue.splice(0, this.batchSize);
        // A claim runs in a transaction of its own, beside the commit of the finishes queued with it: on
        // PostgreSQL the two proceed at once, so the worker has its next batch while the last one commits
        // (SQLite has one writer, and shares the commit instead). Measured in docs/performance.md.
        // Claims take their destinations' rows in name order, as every transaction does (lockInOrder).
        const claims = (batch.filter((op) => op.kind === "claim") as Extract<Op, { run: unknown }>[]).sort((a, b) =>
          compare(a.locks?.destination ?? "", b.locks?.destination ?? ""),
        );
        const rest = claims.length === 0 ? batch : batch.filter((op) => op.kind !== "claim");
        for (const group of claims.length === 0 ? [batch] : rest.length === 0 ? [claims] : [claims, rest]) {
          this.running++;
          if (stores) this.storing++;
          void this.transact(group).finally(() => {
            this.running--;
            if (stores) this.storing--;
            this.schedule();
            if (this.running === 0 && this.queue.length === 0) for (const resolve of this.idle.splice(0)) resolve();
          });
        }
      }
    });
  }

  // transact commits a batch in one READ COMMITTED transaction and settles each op after COMMIT. Ops run
  // together first (one statement for all the stores, one for all the finishes); if one of them fails,
  // the transaction is redone with a savepoint per op, so only that op fails.
  private async transact(batch: Op[]): Promise<void> {
    if (batch.every((op) => op.kind === "store")) {
      batch = await this.storeInOneTrip(batch as Extract<Op, { kind: "store" }>[]);
      if (batch.length === 0) return;
    }
    const started = performance.now();
    let client: pg.PoolClient;
    try {
      client = await this.pool.transaction();
    } catch (error) {
      this.commitError = error;
      return this.rejectAll(batch, error);
    }
    let broken: Error | undefined;
    // A connection that drops (pg_terminate_backend, a restart) says so on its client too: then it is
    // destroyed on release, whatever the queries said.
    const dropped = (error: Error) => void (broken ??= error);
    client.on("error", dropped);
    try {
      let results: Map<Op, { ok: boolean; value: unknown }>;
      try {
        results = await this.attempt(client, batch, false);
      } catch (error) {
        if (isBatchError(error)) throw error;
        await client.query("ROLLBACK");
        await this.pool.begin(client);
        results = await this.attempt(client, batch, true);
      }
      this.commitError = undefined;
      this.onCommit?.(batch.length, performance.now() - started);
      for (const op of batch) {
        const r = results.get(op)!;
        if (r.ok) op.resolve(r.value);
        else op.reject(r.value);
      }
    } catch (error) {
      broken = error instanceof Error ? error : new Error(message(error));
      if (isBatchError(broken)) this.commitError = broken;
      await client.query("ROLLBACK").catch(() => {});
      this.rejectAll(batch, error);
    } finally {
      client.off("error", dropped);
      // A connection that failed mid-batch is dropped rather than handed to the next batch.
      client.release(broken !== undefined && isBatchError(broken) ? broken : undefined);
    }
  }

  // storeInOneTrip commits a batch of stores that one statement can store whole (storeOnce) with BEGIN, the
  // statement and COMMIT written at once: one round trip a batch where there were three, each 200 still
  // after the COMMIT's answer. It settles the stored, and returns what it leaves to transact(): the copies
  // of deliveries already stored (a duplicate or a conflict, which storeAll tells apart), or the whole batch
  // when the statement failed (a bad row: redone op by op there), or the batch it could not do this way.
  private async storeInOneTrip(batch: Extract<Op, { kind: "store" }>[]): Promise<Op[]> {
    const statement = this.storeOnce(batch);
    if (statement === undefined) return batch;
    const started = performance.now();
    let result: pg.QueryResult;
    try {
      result = await this.pool.inOneTrip(statement, (client) => this.notify(client, batch.length));
    } catch (error) {
      if (!isBatchError(error)) return batch;
      this.commitError = error;
      this.rejectAll(batch, error);
      return [];
    }
    this.commitError = undefined;
    this.onCommit?.(batch.length, performance.now() - started);
    const stored = new Set(result.rows.map((r: { source: string; id: string }) => `${r.source}\u0000${r.id}`));
    const rest: Op[] = [];
    for (const op of batch) {
      if (stored.has(`${op.source}\u0000${op.incoming.id}`)) op.resolve("stored");
      else rest.push(op);
    }
    return rest;
  }

  // lockInOrder takes every row lock the batch's ops will wait for before any of them runs, in the one
  // order that every transaction of every host takes them (docs/postgres.md, "Locks, in one order"):
  // destinations by name, then deliveries by (source, id, route), then order keys by (source, destination,
  // key), every text compared by its bytes (COLLATE "C", as JavaScript's sort of enterKeys and storeAll does:
  // under a database's own collation, 'cus_Nf' and 'cus_nA' would sort the other way round there). A
  // transaction then waits only for rows after every row it holds, so no two can wait on each
  // other in a circle, whatever was queued beside what. ORDER BY comes before FOR UPDATE in the plan: rows
  // are locked as they come out of the sort. A claim's own batch takes nothing here: it waits only on its
  // destination's row (claims sorted by name) and takes every other row with SKIP LOCKED. An extend
  // waits for nothing either (SKIP LOCKED), so it is not named here.
  private lockInOrder(client: pg.PoolClient, batch: Op[]): Promise<unknown> {
    const destinations = new Set<string>();
    const leases: Lease[] = [];
    for (const op of batch) {
      if (op.kind === "finish") leases.push(op.lease);
      else if (op.kind === "other" && op.locks?.lease) leases.push(op.locks.lease);
      else if (op.kind === "other" && op.locks?.destination) destinations.add(op.locks.destination);
    }
    // Every lock's statement is sent here, at once, none waiting on another's answer: whatever the caller
    // sends next goes after all of them.
    const locks: Promise<unknown>[] = [];
    if (destinations.size > 0) {
      locks.push(
        client.query(`SELECT 1 FROM destinations WHERE name = ANY($1::text[]) ORDER BY name COLLATE "C" FOR UPDATE`, [
          [...destinations],
        ]),
      );
    }
    if (leases.length === 0) return Promise.all(locks);
    // By index, as the done marks after it (BY_INDEX): planned blind, it read the whole table for each batch.
    // The settings hold for the rest of the transaction; the inbox's own statements all go by key, and
    // finishAll gives a handler's writes the connection's plans back.
    client.query(this.prepared(BY_INDEX, [])).catch(() => {}); // a failure shows in the lock, which waits behind it
    locks.push(
      client.query(
        this.prepared(
          `SELECT 1 FROM delivery_rows d JOIN unnest($1::text[], $2::text[], $3::smallint[], $4::text[]) AS u(s, i, r, t)
         ON d.source = u.s AND d.id = u.i AND d.route = u.r AND d.lease_token = u.t AND d.status IN ('received', 'processing')
       ORDER BY d.source COLLATE "C", d.id COLLATE "C", d.route FOR NO KEY UPDATE OF d`,
          [
            leases.map((l) => l.source),
            leases.map((l) => l.id),
            leases.map((l) => l.route),
            leases.map((l) => l.token),
          ],
        ),
      ),
    );
    const keyed = leases.filter((l) => l.orderKey !== null);
    if (keyed.length > 0) {
      locks.push(
        client.query(
          `SELECT 1 FROM order_keys WHERE (source, destination, order_key) IN (SELECT * FROM unnest($1::text[], $2::text[], $3::text[]))
         ORDER BY source COLLATE "C", destination COLLATE "C", order_key COLLATE "C" FOR UPDATE`,
          [keyed.map((l) => l.source), keyed.map((l) => l.destination), keyed.map((l) => l.orderKey)],
        ),
      );
    }
    return Promise.all(locks);
  }

  private rejectAll(batch: Op[], error: unknown): void {
    const failure = new Error(`inbox ${this.target}: ${message(error)}`, { cause: error });
    for (const op of batch) op.reject(failure);
  }

  private async attempt(
    client: pg.PoolClient,
    batch: Op[],
    guarded: boolean,
  ): Promise<Map<Op, { ok: boolean; value: unknown }>> {
    const results = new Map<Op, { ok: boolean; value: unknown }>();
    if (!guarded) {
      // The locks are not awaited before the ops: the connection sends the ops' statements behind them, and
      // the server runs them in that order, so every lock is still taken first, and a batch of done marks
      // saves a round trip. If anything fails, the locks' own error is the one thrown (the statements behind
      // a failed lock say only that the transaction is aborted).
      // Corked, the locks and the statements the ops send at once (a batch's done marks) go in one write.
      let running!: Promise<void>;
      const locked = inOneWrite(client, () => {
        const locked = this.lockInOrder(client, batch);
        running = this.runTogether(client, batch, results);
        return locked;
      });
      locked.catch(() => {});
      try {
        await running;
      } catch (error) {
        await locked;
        throw error;
      }
      await locked;
    } else {
      await this.lockInOrder(client, batch);
      for (const op of batch) {
        await client.query("SAVEPOINT op");
        try {
          const value =
            op.kind === "store"
              ? (await this.storeAll(client, [op])).get(op)
              : op.kind === "finish"
                ? (await this.finishAll(client, [op])).get(op)
                : await op.run(client);
          await client.query("RELEASE SAVEPOINT op");
          results.set(op, { ok: true, value });
        } catch (error) {
          if (isBatchError(error)) throw error;
          await client.query("ROLLBACK TO SAVEPOINT op");
          await client.query("RELEASE SAVEPOINT op");
          results.set(op, { ok: false, value: error });
        }
      }
    }
    await this.pool.commit(client);
    return results;
  }

  // runTogether runs a batch's ops with a statement for all its stores and one for all its finishes.
  private async runTogether(
    client: pg.PoolClient,
    batch: Op[],
    results: Map<Op, { ok: boolean; value: unknown }>,
  ): Promise<void> {
    const stores = batch.filter((op) => op.kind === "store");
    const finishes = batch.filter((op) => op.kind === "finish");
    if (stores.length > 0)
      for (const [op, value] of await this.storeAll(client, stores)) results.set(op, { ok: true, value });
    if (finishes.length > 0)
      for (const [op, value] of await this.finishAll(client, finishes)) results.set(op, { ok: true, value });
    // Ops that touch only their own lease's row (extend, fail, release) go out together: the connection
    // pipelines their statements, so a heartbeat's extends or a lane's releases cost a round trip or two,
    // not one each, while the finishes beside them wait to commit. The others run in turn, as they may
    // read a row to write it. One that fails fails the attempt, which is redone op by op; ops that failed
    // only as bystanders say "current transaction is aborted", so the error kept is another one.
    for (const op of batch)
      if ((op.kind === "other" && !op.together) || op.kind === "claim")
        results.set(op, { ok: true, value: await op.run(client) });
    const together = batch.filter((op) => op.kind === "other" && op.together) as Extract<Op, { run: unknown }>[];
    const settled = await Promise.allSettled(together.map((op) => op.run(client)));
    const failures = settled
      .filter((r) => r.status === "rejected")
      .map((r) => (r as PromiseRejectedResult).reason as unknown);
    if (failures.length > 0) throw failures.find((e) => (e as { code?: unknown }).code !== "25P02") ?? failures[0];
    together.forEach((op, i) =>
      results.set(op, { ok: true, value: (settled[i] as PromiseFulfilledResult<unknown>).value }),
    );
  }
}

// A plain one-row INSERT of bound values, with nothing after it (no ON CONFLICT, no RETURNING): n of them
// with the same text make one statement of n rows, which writes all n or fails.
const ONE_ROW_INSERT = /^(\s*INSERT\s+INTO\s+[^;?']+?)\s+VALUES\s*\(\s*\?(?:\s*,\s*\?)*\s*\)\s*;?\s*$/i;
// PostgreSQL's limit on a statement's parameters.
const MOST_PARAMS = 65_535;

/**
 * mergedInserts is the run() of the Tx that a batch of finishes hands its handlers. While `merging`, runs of
 * the same one-row INSERT text that come one after another (each delivery's payment, say) are held and sent
 * as one multi-row INSERT when another statement, a read of tx.client, or flush() comes: one statement a
 * batch instead of one a delivery, in the same place among the others and in the same transaction as the
 * done marks. Each resolves 1; a merged statement that fails, or writes fewer rows than it was given (a
 * trigger skipped one), fails them all, and the batch is then redone op by op, unmerged.
 */
export function mergedInserts(send: (sql: string, params: SqlValue[]) => Promise<number>): {
  run: (sql: string, ...params: SqlValue[]) => Promise<number>;
  flush: () => void;
  stop: () => void;
} {
  let merging = true;
  let held:
    | {
        sql: string;
        head: string;
        rows: SqlValue[][];
        settle: { resolve: (n: number) => void; reject: (e: unknown) => void }[];
      }
    | undefined;
  const flush = () => {
    const group = held;
    held = undefined;
    if (group === undefined) return;
    const width = group.rows[0]!.length;
    const most = Math.max(1, Math.floor(MOST_PARAMS / Math.max(1, width)));
    for (let i = 0; i < group.rows.length; i += most) {
      const rows = group.rows.slice(i, i + most);
      const settle = group.settle.slice(i, i + most);
      const sql =
        rows.length === 1
          ? group.sql
          : `${group.head} VALUES ${Array(rows.length)
              .fill(`(${Array(width).fill("?").join(", ")})`)
              .join(", ")}`;
      send(sql, rows.flat()).then(
        (count) => {
          if (count === rows.length) for (const s of settle) s.resolve(1);
          else {
            const error = new Error(
              `a merged insert wrote ${count} of ${rows.length} rows; each write is redone alone`,
            );
            for (const s of settle) s.reject(error);
          }
        },
        (error: unknown) => {
          for (const s of settle) s.reject(error);
        },
      );
    }
  };
  const run = (sql: string, ...params: SqlValue[]): Promise<number> => {
    const insert = merging ? ONE_ROW_INSERT.exec(sql) : null;
    if (insert === null || params.length !== (sql.match(/\?/g)?.length ?? 0)) {
      flush();
      return send(sql, params);
    }
    if (held !== undefined && held.sql !== sql) flush();
    const group = (held ??= { sql, head: insert[1]!, rows: [], settle: [] });
    return new Promise<number>((resolve, reject) => {
      group.rows.push(params);
      group.settle.push({ resolve, reject });
    });
  };
  return { run, flush, stop: () => ((merging = false), flush()) };
}

// compare orders names by their code units, as COLLATE "C" orders the destinations' names (ASCII, see DESTINATION_NAME).
function compare(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

// sqlite/bulk.ts: the operator's bulk writes on SQLite: restore() and restoreAttempts() from another inbox's
// pages, retry and replay by filter, purge() and dropBodies() with the incremental vacuum after them, and
// vacuum(). Each runs in batches, each batch one write of the commit queue (sqlite/commit.ts), resting
// between them so acks get the write lock. SqliteInbox holds one and hands it these calls, through the
// CommitQueue it gives.

import { filterSqlChecked } from "./searching.ts";
import type { DatabaseSync, SQLInputValue } from "node:sqlite";
import { DEFAULTS } from "../defaults.ts";
import type { Audit, BulkOptions, Cursor, Delivery, Filter, KeptAttempt, PurgeOptions, Purged } from "../store.ts";
import { bulkBatchSize, purgeCutoffs, replayDestination } from "../checks.ts";
import { ATTEMPT_SQL, replayToCount } from "../sql.ts";
import { paced } from "../timing.ts";

import { rowInserter } from "./bodies.ts";
import { whole } from "./commit.ts";
import { enterKey, rebuildKey, settleKey, type Statements } from "./order-keys.ts";
import { writeAudit } from "./records.ts";

type Row = Record<string, SQLInputValue>;

/** CommitQueue is what the bulk writes need of the inbox: its connection, its statements, its clock and its queue. */
export interface CommitQueue {
  db: DatabaseSync;
  sql: Statements;
  now: () => number;
  /** enqueue runs a write in the next group commit (SqliteCommitter's). */
  enqueue(run: (db: DatabaseSync, guarded: boolean) => unknown, partial?: boolean): Promise<unknown>;
  /** flush resolves once every write queued so far is committed. */
  flush(): Promise<void>;
}

// A delivery's row as restore() writes it, every column given: its SQL made once.
const insertRestored = rowInserter();

/** SqliteBulk is the operator's bulk writes of a SqliteInbox, each batch queued through its CommitQueue. */
export class SqliteBulk {
  private readonly db: DatabaseSync;
  private readonly sql: Statements;
  private readonly now: () => number;
  private readonly queue: CommitQueue;

  constructor(queue: CommitQueue) {
    this.queue = queue;
    this.db = queue.db;
    this.sql = queue.sql;
    this.now = queue.now;
  }

  private enqueue(run: (db: DatabaseSync, guarded: boolean) => unknown, partial?: boolean): Promise<unknown> {
    return this.queue.enqueue(run, partial);
  }

  private flush(): Promise<void> {
    return this.queue.flush();
  }

  // atomic queues a batch that commits whole with its audit entry, or not at all (whole()).
  private atomic<T>(run: () => T): Promise<T> {
    return this.enqueue((db, guarded) => whole(db, guarded, run), true) as Promise<T>;
  }

  /** restore writes deliveries as they are, in one transaction; keys already here are skipped. */
  restore(deliveries: readonly Delivery[], audit?: Audit): Promise<number> {
    return this.atomic(() => {
      let added = 0;
      const keys = new Map<string, [string, string, string]>();
      // In arrival order, so that the rowids that break event-time ties keep it.
      for (const d of [...deliveries].sort((a, b) => a.receivedAt - b.receivedAt)) {
        const changed = Number(
          insertRestored(this.sql, {
            source: d.source,
            id: d.id,
            body: d.body,
            body_sha256: d.bodySha256,
            content_type: d.contentType,
            event_type: d.eventType,
            provider_time: d.providerTime,
            received_at: d.receivedAt,
            status: d.status,
            attempts: d.attempts,
            available_at: d.availableAt,
            leased_until: d.leasedUntil,
            lease_ms: d.leasedUntil === null ? null : Math.max(1, d.leasedUntil - this.now()),
            error: d.error,
            conflicts: d.conflicts,
            finished_at: d.finishedAt,
            replays: d.replays ?? 0,
            purged_at: d.purgedAt ?? null,
            order_key: d.orderKey ?? null,
            event_time: d.eventTime ?? null,
            newer_id: d.newerId ?? null,
            route: d.route ?? 0,
            destination: d.destination ?? DEFAULTS.destination,
            headers: d.headers ? JSON.stringify(d.headers) : null,
            traceparent: d.traceparent ?? null,
            origin: d.origin ?? "webhook",
          }).changes,
        );
        added += changed;
        const destination = d.destination ?? DEFAULTS.destination;
        if (changed === 1 && d.orderKey != null)
          keys.set(JSON.stringify([d.source, destination, d.orderKey]), [d.source, destination, d.orderKey]);
      }
      for (const [source, destination, key] of keys.values()) rebuildKey(this.sql, source, destination, key);
      writeAudit(this.sql, audit, added, this.now());
      return added;
    });
  }

  /**
   * restoreAttempts writes each route's tries in their seq order, in one transaction, into a route of the same
   * delivery that has none yet, the newest kept of them alone (the target's attemptsKept, as its own tries'
   * trim would leave them); a route given in two calls gets the first call's tries alone.
   */
  restoreAttempts(tries: readonly KeptAttempt[], kept: number): Promise<number> {
    const routes = new Map<string, KeptAttempt[]>();
    for (const t of tries) {
      const key = JSON.stringify([t.source, t.id, t.destination]);
      const route = routes.get(key);
      if (route) route.push(t);
      else routes.set(key, [t]);
    }
    return this.atomic(() => {
      let wrote = 0;
      for (const route of routes.values()) {
        const { source, id, destination, receivedAt, bodySha256 } = route[0]!;
        const bare = this.sql(
          `SELECT 1 FROM deliveries d WHERE source = ? AND id = ? AND destination = ? AND received_at = ? AND body_sha256 = ?
              AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.source = d.source AND a.id = d.id AND a.destination = d.destination)`,
        ).get(source, id, destination, receivedAt, bodySha256);
        if (bare === undefined) continue;
        for (const t of route.sort((a, b) => a.seq - b.seq).slice(-kept))
          wrote += Number(
            this.sql(ATTEMPT_SQL.keep).run(
              source,
              id,
              destination,
              t.attempt,
              t.startedAt,
              t.ms,
              t.status,
              t.error,
              t.headers === null ? null : JSON.stringify(t.headers),
              t.body,
            ).changes,
          );
      }
      return wrote;
    });
  }

  /** retryMatching queues the failed deliveries that match again, in batches of their own transaction each. */
  async retryMatching(filter: Filter, options: BulkOptions = {}): Promise<number> {
    const failed = "status = 'failed' AND purged_at IS NULL";
    if (options.dryRun) return this.countWhere(filter, failed);
    let total = 0;
    await this.inBatches(filter, failed, options, (keys, now) => {
      const before = total;
      for (const k of keys) {
        const row =
          this.sql(`UPDATE delivery_rows SET status = 'received', attempts = 0, error = NULL, available_at = ?, finished_at = NULL
                WHERE source = ? AND id = ? AND route = ? AND status = 'failed' RETURNING order_key, destination`).get(
            now,
            k.source,
            k.id,
            k.route!,
          ) as Row | undefined;
        if (!row) continue;
        total++;
        // An ordered delivery waits its turn again: its key's head row decides when.
        if (row.order_key !== null)
          settleKey(this.sql, k.source, row.destination as string, row.order_key as string, k.id, false);
      }
      return total - before;
    });
    return total;
  }

  /** replayMatching puts the done deliveries that match through the handler again; tombstones are counted, not replayed. */
  async replayMatching(
    filter: Filter,
    options: BulkOptions & { to?: string } = {},
  ): Promise<{ replayed: number; tombstoned: number }> {
    if (options.to !== undefined) return this.replayTo(filter, options.to, options);
    const kept = "status = 'done' AND purged_at IS NULL";
    const tombstoned = () => this.countWhere(filter, "status = 'done' AND purged_at IS NOT NULL");
    if (options.dryRun) return { replayed: await this.countWhere(filter, kept), tombstoned: await tombstoned() };
    let replayed = 0;
    await this.inBatches(filter, kept, options, (keys, now) => {
      const before = replayed;
      for (const k of keys) {
        const row =
          this.sql(`UPDATE delivery_rows SET status = 'received', attempts = 0, replays = replays + 1, error = NULL, available_at = ?,
                       finished_at = NULL, leased_until = NULL, lease_token = NULL
                WHERE source = ? AND id = ? AND route = ? AND status = 'done' AND purged_at IS NULL RETURNING order_key, destination`).get(
            now,
            k.source,
            k.id,
            k.route!,
          ) as Row | undefined;
        if (!row) continue;
        replayed++;
        if (row.order_key !== null)
          settleKey(this.sql, k.source, row.destination as string, row.order_key as string, k.id, false);
      }
      return replayed - before;
    });
    return { replayed, tombstoned: await tombstoned() };
  }

  // replayTo sends each matching delivery (once, whichever of its rows matched) to one destination: its
  // row there goes again if done, and a row is added, as the next route, if its routes never chose it.
  // A row there that is still waiting or failed is left alone: it is on its way, or `retry` is the tool.
  private async replayTo(
    filter: Filter,
    to: string,
    options: BulkOptions,
  ): Promise<{ replayed: number; tombstoned: number }> {
    replayDestination(to);
    const kept = "purged_at IS NULL";
    const tombstoned = () => this.countWhere(filter, "purged_at IS NOT NULL");
    if (options.dryRun) {
      const { where, params } = filterSqlChecked(this.sql, filter);
      const { n } = this.sql(replayToCount(where)).get(...params, to) as { n: number };
      return { replayed: Number(n), tombstoned: await tombstoned() };
    }
    let replayed = 0;
    const seen = new Set<string>();
    await this.inBatches(filter, kept, options, (keys, now) => {
      const before = replayed;
      for (const k of keys) {
        // A delivery's other rows match too: the first one seen speaks for it, before any read.
        const delivery = `${k.source}\u0000${k.id}`;
        if (seen.has(delivery)) continue;
        seen.add(delivery);
        const there = this.sql(
          "SELECT rowid, status FROM deliveries WHERE source = ? AND id = ? AND destination = ?",
        ).get(k.source, k.id, to) as Row | undefined;
        if (there !== undefined) {
          if (there.status !== "done") continue;
          const row =
            this.sql(`UPDATE delivery_rows SET status = 'received', attempts = 0, replays = replays + 1, error = NULL, available_at = ?,
                         finished_at = NULL, leased_until = NULL, lease_token = NULL
                  WHERE rowid = ? AND status = 'done' AND purged_at IS NULL RETURNING order_key`).get(
              now,
              there.rowid as number,
            ) as Row | undefined;
          if (!row) continue;
          replayed++;
          if (row.order_key !== null) settleKey(this.sql, k.source, to, row.order_key as string, k.id, false);
          continue;
        }
        // Routing after the fact: the delivery gets a row for this destination, as its next route, and a copy of
        // its body where the body was kept apart.
        const from = this.sql(
          "SELECT body_seq FROM delivery_rows WHERE source = ? AND id = ? AND route = ? AND purged_at IS NULL",
        ).get(k.source, k.id, k.route!) as Row | undefined;
        if (!from) continue;
        const seq =
          from.body_seq === null
            ? null
            : Number(
                this.sql("INSERT INTO delivery_bodies (body) SELECT body FROM delivery_bodies WHERE seq = ?").run(
                  from.body_seq,
                ).lastInsertRowid,
              );
        const added =
          this.sql(`INSERT INTO delivery_rows (source, id, body, body_sha256, content_type, event_type, provider_time, received_at, status,
                                        available_at, order_key, event_time, route, destination, headers, traceparent, replays, origin, body_seq)
                SELECT source, id, body, body_sha256, content_type, event_type, provider_time, received_at, 'received', ?,
                       order_key, event_time, (SELECT max(route) + 1 FROM delivery_rows WHERE source = ?2 AND id = ?3), ?4, headers, traceparent, 1, origin, ?6
                FROM delivery_rows WHERE source = ?2 AND id = ?3 AND route = ?5 AND purged_at IS NULL
                RETURNING rowid, order_key, event_time`).get(now, k.source, k.id, to, k.route!, seq) as Row | undefined;
        if (!added) continue;
        replayed++;
        if (added.order_key !== null) {
          enterKey(
            this.sql,
            k.source,
            to,
            added.order_key as string,
            k.id,
            added.event_time as number,
            added.rowid as number,
            now,
            false,
          );
        }
      }
      return replayed - before;
    });
    return { replayed, tombstoned: await tombstoned() };
  }

  private async countWhere(filter: Filter, also: string): Promise<number> {
    const { where, params } = filterSqlChecked(this.sql, filter);
    return (this.sql(`SELECT count(*) AS n FROM deliveries WHERE ${also} AND ${where}`).get(...params) as { n: number })
      .n;
  }

  // inBatches walks the deliveries that match, oldest first, a batch per transaction, and hands each
  // batch's keys to act inside it; what act changed is added to the audit entry in the same transaction
  // (the first batch writes it, even when it changes nothing). The cursor moves past every batch, so a
  // delivery changed by a worker meanwhile (retried, then failed again) is never taken twice in one run,
  // and the run always ends.
  private async inBatches(
    filter: Filter,
    also: string,
    options: BulkOptions,
    act: (keys: Cursor[], now: number) => number,
  ): Promise<void> {
    const size = bulkBatchSize(options.batch);
    const { where, params } = filterSqlChecked(this.sql, filter);
    let after: Cursor | undefined;
    for (;;) {
      const picked = await this.atomic(() => {
        const cursor = after === undefined ? "" : "AND (received_at, source, id, route) > (?, ?, ?, ?)";
        const keys = (
          this.sql(`SELECT received_at, source, id, route FROM deliveries WHERE ${also} AND ${where} ${cursor}
                ORDER BY received_at, source, id, route LIMIT ?`).all(
            ...params,
            ...(after ? [after.receivedAt, after.source, after.id, after.route!] : []),
            size,
          ) as Row[]
        ).map((r) => ({
          receivedAt: r.received_at as number,
          source: r.source as string,
          id: r.id as string,
          route: r.route as number,
        }));
        const now = this.now();
        writeAudit(this.sql, options.audit, act(keys, now), now);
        return keys;
      });
      if (picked.length < size) return;
      after = picked.at(-1);
    }
  }

  /** purge drops old done bodies (tombstones stay), forgets old tombstones, then gives the space back. */
  async purge(options: PurgeOptions = {}): Promise<Purged> {
    const { bodiesBefore, forgetBefore, batch, rest } = purgeCutoffs(options, this.now());
    if (options.dryRun) {
      const bodies = this.sql(`SELECT count(*) AS n, coalesce(sum(length(body)), 0) AS bytes FROM deliveries
              WHERE status = 'done' AND purged_at IS NULL AND received_at < ?`).get(bodiesBefore) as {
        n: number;
        bytes: number;
      };
      // What is past both ages goes in one run: its body now, then its tombstone.
      const forgotten = this.sql(
        "SELECT count(*) AS n FROM deliveries WHERE purged_at IS NOT NULL AND received_at < ?",
      ).get(forgetBefore) as { n: number };
      const both = this.sql(
        "SELECT count(*) AS n FROM deliveries WHERE status = 'done' AND purged_at IS NULL AND received_at < ?",
      ).get(forgetBefore) as { n: number };
      return { bodies: bodies.n, bytes: bodies.bytes, forgotten: forgotten.n + both.n, vacuumedBytes: 0 };
    }
    const purged: Purged = { bodies: 0, bytes: 0, forgotten: 0, vacuumedBytes: 0 };
    for (;;) {
      const { n, bytes } = await paced(rest, () =>
        this.atomic(() =>
          this.dropBatch(
            "SELECT rowid, length(body) AS bytes FROM deliveries WHERE status = 'done' AND purged_at IS NULL AND received_at < ? ORDER BY received_at LIMIT ?",
            [bodiesBefore, batch],
            options.audit,
          ),
        ),
      );
      purged.bodies += n;
      purged.bytes += bytes;
      if (n < batch || options.signal?.aborted) break;
    }
    for (;;) {
      if (options.signal?.aborted) return purged;
      const n = await paced(rest, () =>
        this.atomic(() => {
          const gone = this.sql(`DELETE FROM delivery_rows WHERE rowid IN (
                SELECT rowid FROM deliveries WHERE purged_at IS NOT NULL AND received_at < ? ORDER BY received_at LIMIT ?)
                RETURNING source, id, destination`).all(forgetBefore, batch) as {
            source: string;
            id: string;
            destination: string;
          }[];
          // A forgotten delivery's attempt log goes with it: the answers it kept may be as private as the body.
          const tries = this.sql("DELETE FROM attempts WHERE source = ? AND id = ? AND destination = ?");
          for (const d of gone) tries.run(d.source, d.id, d.destination);
          const forgot = gone.length;
          writeAudit(this.sql, options.audit, forgot, this.now());
          return forgot;
        }),
      );
      purged.forgotten += n;
      if (n < batch) break;
    }
    purged.vacuumedBytes = await this.vacuumFree(options.signal, rest);
    const { auto_vacuum } = this.sql("PRAGMA auto_vacuum").get() as { auto_vacuum: number };
    if (auto_vacuum === 0) purged.fileKeepsSize = true;
    return purged;
  }

  /** dropBodies makes tombstones of the settled deliveries that match (purge by name), in batches. */
  async dropBodies(filter: Filter, options: BulkOptions = {}): Promise<{ bodies: number; bytes: number }> {
    const { where, params } = filterSqlChecked(this.sql, filter);
    const size = bulkBatchSize(options.batch);
    const pick = `SELECT rowid, length(body) AS bytes FROM deliveries
                  WHERE status IN ('done', 'failed') AND purged_at IS NULL AND ${where} ORDER BY received_at LIMIT ?`;
    if (options.dryRun) {
      const r = this.sql(`SELECT count(*) AS n, coalesce(sum(length(body)), 0) AS bytes FROM deliveries
                          WHERE status IN ('done', 'failed') AND purged_at IS NULL AND ${where}`).get(...params) as {
        n: number;
        bytes: number;
      };
      return { bodies: r.n, bytes: r.bytes };
    }
    const total = { bodies: 0, bytes: 0 };
    for (;;) {
      const { n, bytes } = await paced(DEFAULTS.purgeRest, () =>
        this.atomic(() => this.dropBatch(pick, [...params, size], options.audit)),
      );
      total.bodies += n;
      total.bytes += bytes;
      if (n < size) break;
    }
    await this.vacuumFree();
    return total;
  }

  // dropBatch makes tombstones of the rows a query picks, inside the current transaction. The row stays,
  // with its hash: store()'s ON CONFLICT still finds the ID, and a different body still counts as a
  // conflict. A row whose body is apart, or small, is marked in place and its body's row deleted: the row
  // keeps its size, and no index entry of it moves (SQLite still rewrites about half the pages of bodies such
  // deletes empty, docs/table.md#on-sqlite). A row that carries a large
  // body (stored before bodies apart) is moved rather than updated in place: SQLite never merges the
  // half-empty pages an UPDATE leaves, so the file would not shrink; a DELETE rebalances them into free
  // pages, and the re-inserted tombstones pack densely at the end of the table.
  private dropBatch(pick: string, params: SQLInputValue[], audit: Audit | undefined): { n: number; bytes: number } {
    const rows = this.sql(pick).all(...params) as { rowid: number; bytes: number }[];
    if (rows.length === 0) {
      writeAudit(this.sql, audit, 0, this.now());
      return { n: 0, bytes: 0 };
    }
    const settled = "rowid IN (SELECT value FROM json_each(?)) AND purged_at IS NULL AND status IN ('done', 'failed')";
    // Each picked row still settled, told apart by where its body is: apart or small, marked in place; large in
    // its row, moved.
    const kinds = this.sql(
      `SELECT rowid, body_seq IS NULL AND length(body) > ? AS moves FROM delivery_rows WHERE ${settled}`,
    ).all(DEFAULTS.inlineBodyBytes, JSON.stringify(rows.map((r) => r.rowid))) as { rowid: number; moves: number }[];
    const inPlace = JSON.stringify(kinds.filter((k) => k.moves === 0).map((k) => k.rowid));
    const moved = kinds.filter((k) => k.moves === 1).map((k) => k.rowid);
    const now = this.now();
    this.sql(`DELETE FROM delivery_bodies WHERE seq IN (SELECT body_seq FROM delivery_rows WHERE ${settled})`).run(
      inPlace,
    );
    let n = Number(
      this.sql(`UPDATE delivery_rows SET body = X'', body_seq = NULL, purged_at = ? WHERE ${settled}`).run(now, inPlace)
        .changes,
    );
    if (moved.length > 0) {
      // SELECT *: every column, those of later migrations too; a mismatch fails loudly, never drops one.
      this.db.exec("CREATE TEMP TABLE IF NOT EXISTS purging AS SELECT * FROM main.delivery_rows WHERE 0");
      const ids = JSON.stringify(moved);
      this.sql(`INSERT INTO temp.purging SELECT * FROM main.delivery_rows WHERE ${settled}`).run(ids);
      n += Number(this.sql(`DELETE FROM main.delivery_rows WHERE ${settled}`).run(ids).changes);
      this.sql("UPDATE temp.purging SET body = X'', purged_at = ?").run(now);
      this.sql("INSERT INTO main.delivery_rows SELECT * FROM temp.purging ORDER BY received_at").run();
      this.sql("DELETE FROM temp.purging").run();
    }
    writeAudit(this.sql, audit, n, now);
    return { n, bytes: rows.reduce((sum, r) => sum + r.bytes, 0) };
  }

  // vacuumFree gives free pages back to the file system, a bounded step per transaction, when the file
  // was created with auto_vacuum = INCREMENTAL (see openDatabase; an older file needs vacuum() once).
  // The file itself shrinks at the next checkpoint, which copies the shorter database out of the WAL.
  private async vacuumFree(signal?: AbortSignal, rest: number = DEFAULTS.purgeRest): Promise<number> {
    const pragma = (name: string) => Object.values(this.sql(`PRAGMA ${name}`).get() as Record<string, number>)[0]!;
    if (pragma("auto_vacuum") !== 2) return 0;
    const pageSize = pragma("page_size");
    let pages = 0;
    for (;;) {
      const free = pragma("freelist_count");
      if (free === 0 || signal?.aborted) break;
      const step = Math.min(free, DEFAULTS.vacuumStepPages);
      await paced(rest, () => this.enqueue(() => this.db.prepare(`PRAGMA incremental_vacuum(${step})`).all()));
      pages += step;
    }
    return pages * pageSize;
  }

  /**
   * vacuum rewrites the whole file once, switching it to auto_vacuum = INCREMENTAL, so that purge can shrink
   * a database created before retention existed. It holds the write lock until done (seconds per GB):
   * receivers' acks wait meanwhile, so run it in a quiet moment. SQLite only.
   */
  async vacuum(): Promise<{ before: number; after: number }> {
    await this.flush();
    const size = () => {
      const { page_count: pages } = this.db.prepare("PRAGMA page_count").get() as { page_count: number };
      const { page_size: bytes } = this.db.prepare("PRAGMA page_size").get() as { page_size: number };
      return pages * bytes;
    };
    const before = size();
    this.db.exec("PRAGMA auto_vacuum = INCREMENTAL");
    this.db.exec("VACUUM");
    this.db.exec("PRAGMA wal_checkpoint(TRUNCATE)");
    return { before, after: size() };
  }
}

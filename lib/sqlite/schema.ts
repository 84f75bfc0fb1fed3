// sqlite/schema.ts: the SQLite inbox's file: its schema as an ordered list of migrations (tracked with
// PRAGMA user_version), openDatabase() with each PRAGMA and why, and what the file was opened with, read
// back and checked (durabilityProblem()). A new column or index is a new entry at the end of MIGRATIONS,
// here and in postgres/schema.ts. Not run on its own.

import { existsSync } from "node:fs";
import { dirname } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { DEFAULTS } from "../defaults.ts";
import { message } from "../log.ts";
import { describeRuntime } from "../runtime.ts";
import { SQLITE_CONTAINS, jsonContains, searchableJson } from "../search.ts";

/** MIGRATIONS is the schema, in order: a shipped entry is never edited, only followed by a new one. */
export const MIGRATIONS: readonly string[] = [
  `CREATE TABLE deliveries (
     source        TEXT    NOT NULL,
     id            TEXT    NOT NULL,
     body          BLOB    NOT NULL,
     body_sha256   TEXT    NOT NULL,
     content_type  TEXT,
     event_type    TEXT,
     provider_time INTEGER,
     received_at   INTEGER NOT NULL,
     status        TEXT    NOT NULL CHECK (status IN ('received', 'processing', 'done', 'failed')),
     attempts      INTEGER NOT NULL DEFAULT 0,
     available_at  INTEGER NOT NULL,
     leased_until  INTEGER,
     lease_token   TEXT,
     error         TEXT,
     conflicts     INTEGER NOT NULL DEFAULT 0,
     finished_at   INTEGER,
     PRIMARY KEY (source, id)
   );
   -- Partial indexes keep a claim's cost flat however many done rows pile up behind it.
   CREATE INDEX deliveries_due ON deliveries (available_at) WHERE status = 'received';
   CREATE INDEX deliveries_leased ON deliveries (leased_until) WHERE status = 'processing';
   CREATE INDEX deliveries_failed ON deliveries (received_at) WHERE status = 'failed';`,
  // The length each lease was granted for, so a claim can tell a clock that stepped back from a live lease.
  `ALTER TABLE deliveries ADD COLUMN lease_ms INTEGER;`,
  // Replays, tombstones (a purged body leaves the row, hash and times, so its ID is still a duplicate), and
  // the indexes that keep search and the bulk commands off a full scan. A tombstone stays in deliveries, not in a
  // table of its own, so that store() stays one INSERT, unchanged: its ON CONFLICT already finds the ID.
  `ALTER TABLE deliveries ADD COLUMN replays INTEGER NOT NULL DEFAULT 0;
   ALTER TABLE deliveries ADD COLUMN purged_at INTEGER;
   CREATE INDEX deliveries_received ON deliveries (received_at, source, id);
   -- Only done rows with a body: what purge drops next, and what replay may take, without walking tombstones.
   CREATE INDEX deliveries_kept ON deliveries (received_at) WHERE status = 'done' AND purged_at IS NULL;
   CREATE INDEX deliveries_purged ON deliveries (received_at) WHERE purged_at IS NOT NULL;`,
  // The operator page's overview (summary, histogram) from indexes alone, however many done rows pile up:
  // what was finished per minute; what is not done, by status, age and source; and conflicting duplicates.
  `CREATE INDEX IF NOT EXISTS deliveries_finished ON deliveries (finished_at) WHERE finished_at IS NOT NULL;
   CREATE INDEX IF NOT EXISTS deliveries_open ON deliveries (status, received_at, source) WHERE status <> 'done';
   CREATE INDEX IF NOT EXISTS deliveries_conflicts ON deliveries (conflicts) WHERE conflicts > 0;
   -- Failures grouped by their error without reading the failed rows themselves; only failed rows pay for it.
   CREATE INDEX IF NOT EXISTS deliveries_failed_error ON deliveries (error, received_at) WHERE status = 'failed';
   -- Every failed try's error, not only the last one's, for the person reading a delivery's page.
   CREATE TABLE IF NOT EXISTS attempt_errors (
     source TEXT NOT NULL, id TEXT NOT NULL, attempt INTEGER NOT NULL, error TEXT NOT NULL, failed_at INTEGER NOT NULL);
   CREATE INDEX IF NOT EXISTS attempt_errors_delivery ON attempt_errors (source, id);`,
  // Ordering (see claimBatch and settleKey). Ordered deliveries leave the unordered claim's index, so it
  // never walks past them; each key's head row says which one may run next and from when (due).
  `ALTER TABLE deliveries ADD COLUMN order_key TEXT;
   ALTER TABLE deliveries ADD COLUMN event_time INTEGER;
   ALTER TABLE deliveries ADD COLUMN newer_id TEXT;
   DROP INDEX deliveries_due;
   CREATE INDEX deliveries_due ON deliveries (available_at) WHERE status = 'received' AND order_key IS NULL;
   -- The rowid, last in every SQLite index, is the arrival order that breaks event-time ties.
   CREATE INDEX deliveries_ordered ON deliveries (source, order_key, event_time) WHERE status = 'received' AND order_key IS NOT NULL;
   CREATE TABLE order_keys (
     source          TEXT    NOT NULL,
     order_key       TEXT    NOT NULL,
     -- The head: the delivery that runs next (received, due at due), runs now (processing, due NULL), or
     -- blocks the key (failed under strict, due NULL); NULL when nothing of the key is waiting.
     head_id         TEXT,
     head_event_time INTEGER,
     head_seq        INTEGER,
     due             INTEGER,
     -- The newest event handled so far: an older one after it is handed over stale.
     last_event_time INTEGER,
     last_id         TEXT,
     strict          INTEGER NOT NULL DEFAULT 0,
     PRIMARY KEY (source, order_key)
   );
   CREATE INDEX order_keys_due ON order_keys (due) WHERE due IS NOT NULL;`,
  // Destinations (docs/forwarding.md): one row per route of a delivery, keyed by its place among them
  // (route 0, the first, is what a copy is a duplicate of, and alone counts conflicts), each with its own
  // status, attempts, lease, errors and order. SQLite cannot change a primary key in place, so the table
  // is rebuilt; rowids are kept, as they are the arrival order that breaks event-time ties. Every existing
  // row becomes route 0 of the handler. The claim's indexes lead with the destination, so one claim walks
  // only its own destination's due rows, and a destination that holds its deliveries is never walked past.
  `CREATE TABLE deliveries_next (
     source        TEXT    NOT NULL,
     id            TEXT    NOT NULL,
     body          BLOB    NOT NULL,
     body_sha256   TEXT    NOT NULL,
     content_type  TEXT,
     event_type    TEXT,
     provider_time INTEGER,
     received_at   INTEGER NOT NULL,
     status        TEXT    NOT NULL CHECK (status IN ('received', 'processing', 'done', 'failed')),
     attempts      INTEGER NOT NULL DEFAULT 0,
     available_at  INTEGER NOT NULL,
     leased_until  INTEGER,
     lease_token   TEXT,
     error         TEXT,
     conflicts     INTEGER NOT NULL DEFAULT 0,
     finished_at   INTEGER,
     lease_ms      INTEGER,
     replays       INTEGER NOT NULL DEFAULT 0,
     purged_at     INTEGER,
     order_key     TEXT,
     event_time    INTEGER,
     newer_id      TEXT,
     route         INTEGER NOT NULL DEFAULT 0,
     destination   TEXT    NOT NULL DEFAULT 'handler',
     headers       TEXT,
     traceparent   TEXT,
     PRIMARY KEY (source, id, route)
   );
   INSERT INTO deliveries_next (rowid, source, id, body, body_sha256, content_type, event_type, provider_time, received_at, status,
                                attempts, available_at, leased_until, lease_token, error, conflicts, finished_at, lease_ms, replays,
                                purged_at, order_key, event_time, newer_id)
   SELECT rowid, source, id, body, body_sha256, content_type, event_type, provider_time, received_at, status,
          attempts, available_at, leased_until, lease_token, error, conflicts, finished_at, lease_ms, replays,
          purged_at, order_key, event_time, newer_id FROM deliveries;
   DROP TABLE deliveries;
   ALTER TABLE deliveries_next RENAME TO deliveries;
   CREATE INDEX deliveries_due ON deliveries (destination, available_at) WHERE status = 'received' AND order_key IS NULL;
   CREATE INDEX deliveries_leased ON deliveries (destination, leased_until) WHERE status = 'processing';
   CREATE INDEX deliveries_failed ON deliveries (received_at) WHERE status = 'failed';
   CREATE INDEX deliveries_received ON deliveries (received_at, source, id);
   CREATE INDEX deliveries_kept ON deliveries (received_at) WHERE status = 'done' AND purged_at IS NULL;
   CREATE INDEX deliveries_purged ON deliveries (received_at) WHERE purged_at IS NOT NULL;
   CREATE INDEX deliveries_finished ON deliveries (finished_at) WHERE finished_at IS NOT NULL;
   CREATE INDEX deliveries_open ON deliveries (status, received_at, source) WHERE status <> 'done';
   CREATE INDEX deliveries_conflicts ON deliveries (conflicts) WHERE conflicts > 0;
   CREATE INDEX deliveries_failed_error ON deliveries (error, received_at) WHERE status = 'failed';
   CREATE INDEX deliveries_ordered ON deliveries (source, destination, order_key, event_time) WHERE status = 'received' AND order_key IS NOT NULL;
   -- Each destination goes through a key's deliveries on its own: a key's head is per destination.
   CREATE TABLE order_keys_next (
     source          TEXT    NOT NULL,
     destination     TEXT    NOT NULL DEFAULT 'handler',
     order_key       TEXT    NOT NULL,
     head_id         TEXT,
     head_event_time INTEGER,
     head_seq        INTEGER,
     due             INTEGER,
     last_event_time INTEGER,
     last_id         TEXT,
     strict          INTEGER NOT NULL DEFAULT 0,
     PRIMARY KEY (source, destination, order_key)
   );
   INSERT INTO order_keys_next (source, order_key, head_id, head_event_time, head_seq, due, last_event_time, last_id, strict)
   SELECT source, order_key, head_id, head_event_time, head_seq, due, last_event_time, last_id, strict FROM order_keys;
   DROP TABLE order_keys;
   ALTER TABLE order_keys_next RENAME TO order_keys;
   CREATE INDEX order_keys_due ON order_keys (destination, due) WHERE due IS NOT NULL;
   ALTER TABLE attempt_errors ADD COLUMN destination TEXT NOT NULL DEFAULT 'handler';
   -- A destination's shared state: paused, its breaker, and its rate limit's tokens, one row each.
   CREATE TABLE destinations (
     name          TEXT    PRIMARY KEY,
     paused        INTEGER NOT NULL DEFAULT 0,
     paused_reason TEXT,
     state         TEXT    NOT NULL DEFAULT 'closed' CHECK (state IN ('closed', 'open', 'probing')),
     retry_at      INTEGER,
     probe_until   INTEGER,
     failures      INTEGER NOT NULL DEFAULT 0,
     window_start  INTEGER,
     window_done   INTEGER NOT NULL DEFAULT 0,
     window_failed INTEGER NOT NULL DEFAULT 0,
     last_error    TEXT,
     last_error_at INTEGER,
     tokens        REAL,
     tokens_at     INTEGER,
     changed_at    INTEGER
   );`,
  // The operator page at a million deliveries: what is open counted by destination (destinations()), and
  // what finished by status (histogram()), from the indexes alone. Without the destination and the status
  // in them, each overview read ~100k table rows at random, 200 ms and 90 ms of its 410.
  `DROP INDEX deliveries_open;
   CREATE INDEX deliveries_open ON deliveries (status, received_at, source, destination) WHERE status <> 'done';
   DROP INDEX deliveries_finished;
   CREATE INDEX deliveries_finished ON deliveries (finished_at, status) WHERE finished_at IS NOT NULL;`,
  // The API (lib/api/): its keys, by hash alone; each POST's first answer under its Idempotency-Key; and the
  // audit log of every change made through the API or the page.
  `CREATE TABLE api_keys (
     id         TEXT PRIMARY KEY,
     name       TEXT NOT NULL,
     scope      TEXT NOT NULL CHECK (scope IN ('read', 'write')),
     hash       TEXT NOT NULL UNIQUE,
     created_at INTEGER NOT NULL,
     revoked_at INTEGER
   ) STRICT;
   CREATE TABLE idempotency (
     key          TEXT PRIMARY KEY,
     request_hash TEXT NOT NULL,
     status       INTEGER NOT NULL,
     body         TEXT NOT NULL,
     at           INTEGER NOT NULL
   ) STRICT;
   CREATE INDEX idempotency_at ON idempotency (at);
   CREATE TABLE audit (
     seq       INTEGER PRIMARY KEY AUTOINCREMENT,
     at        INTEGER NOT NULL,
     who       TEXT NOT NULL,
     operation TEXT NOT NULL,
     target    TEXT NOT NULL,
     count     INTEGER NOT NULL
   ) STRICT;`,
  // Reconcile (docs/reconcile.md): where a delivery came from, the provider's webhook or its API, fetched
  // back after the webhook never came. Every existing row arrived as a webhook (a constant default: no rewrite).
  `ALTER TABLE deliveries ADD COLUMN origin TEXT NOT NULL DEFAULT 'webhook';`,
  // Configuration in the database (lib/config/): each applied version of the sources file's JSON, secrets
  // as env:NAME, with its transforms' code and SHA-256; the newest is in force.
  `CREATE TABLE inbox_config (
     version    INTEGER PRIMARY KEY,
     document   TEXT    NOT NULL,
     transforms TEXT    NOT NULL,
     actor      TEXT    NOT NULL,
     applied_at INTEGER NOT NULL
   );`,
  // Trust (docs/security.md): each configuration version says which way it came (the operator's file, or the
  // API) and whose hand wrote each part; a version the API applied before this knew no better is the API's
  // whole. Each audit entry gets the key of its change, so that a change made in several transactions (a
  // bulk retry's batches) keeps one entry, and a batch redone writes it once.
  `ALTER TABLE inbox_config ADD COLUMN way TEXT NOT NULL DEFAULT 'operator';
   UPDATE inbox_config SET way = 'api' WHERE actor LIKE 'key:%';
   ALTER TABLE inbox_config ADD COLUMN trust TEXT NOT NULL DEFAULT '{}';
   ALTER TABLE audit ADD COLUMN change TEXT;
   CREATE UNIQUE INDEX audit_change ON audit (change);`,
  // The secret store (lib/secrets.ts): each value sealed with the operator's key, which the database never
  // holds; and a count of its changes, which running scripts watch to open them again.
  `CREATE TABLE secrets (
     name   TEXT    PRIMARY KEY,
     sealed TEXT    NOT NULL,
     set_at INTEGER NOT NULL,
     set_by TEXT    NOT NULL
   ) STRICT;
   CREATE TABLE secrets_version (
     one     INTEGER PRIMARY KEY CHECK (one = 1),
     version INTEGER NOT NULL
   ) STRICT;
   INSERT INTO secrets_version (one, version) VALUES (1, 0);`,
  // The admin scope (docs/api.md#keys): a key that may also make and revoke keys. SQLite cannot change a
  // CHECK in place, so the table is made again with the wider one and its rows copied, in this migration's
  // transaction.
  `CREATE TABLE api_keys_scoped (
     id         TEXT PRIMARY KEY,
     name       TEXT NOT NULL,
     scope      TEXT NOT NULL CHECK (scope IN ('read', 'write', 'admin')),
     hash       TEXT NOT NULL UNIQUE,
     created_at INTEGER NOT NULL,
     revoked_at INTEGER
   ) STRICT;
   INSERT INTO api_keys_scoped (id, name, scope, hash, created_at, revoked_at)
     SELECT id, name, scope, hash, created_at, revoked_at FROM api_keys;
   DROP TABLE api_keys;
   ALTER TABLE api_keys_scoped RENAME TO api_keys;`,
  // The attempt log (docs/forwarding.md#the-attempt-log): every try, the good ones too, with its timing and
  // the destination's answer, where attempt_errors kept a failed try's error alone. Its rows come along,
  // untimed; seq orders tries that started in the same millisecond and says which are oldest to let go.
  `CREATE TABLE attempts (
     seq         INTEGER PRIMARY KEY,
     source      TEXT    NOT NULL,
     id          TEXT    NOT NULL,
     destination TEXT    NOT NULL,
     attempt     INTEGER NOT NULL,
     started_at  INTEGER NOT NULL,
     ms          INTEGER,
     status      INTEGER,
     error       TEXT,
     headers     TEXT,
     body        TEXT
   ) STRICT;
   CREATE INDEX attempts_delivery ON attempts (source, id, destination, seq);
   INSERT INTO attempts (source, id, destination, attempt, started_at, error)
     SELECT source, id, destination, attempt, failed_at, error FROM attempt_errors ORDER BY failed_at, rowid;
   DROP TABLE attempt_errors;`,
  // Search (lib/search.ts, docs/operations.md#searching-bodies): an FTS5 index of the words of each JSON body's
  // strings, numbers and booleans, by the row's rowid, for bodyWords and as bodyJson's first look; contentless,
  // so the words are not stored twice, and with contentless_delete so a row can leave it. Opt-in: the table is
  // made here empty, and nothing fills it until `inbox.ts search enable` turns it on (lib/sqlite/searching.ts;
  // triggers then, moved after the ack by the next migration) and indexes the rows already there in batches; an
  // inbox that never asks pays nothing at a store or at this upgrade. search_state is whether it is on and how
  // far the backfill got.
  `CREATE VIRTUAL TABLE deliveries_search USING fts5(words, content = '', contentless_delete = 1);
   CREATE TABLE search_state (
     one         INTEGER PRIMARY KEY CHECK (one = 1),
     enabled     INTEGER NOT NULL DEFAULT 0,
     changed_at  INTEGER,
     until_rowid INTEGER NOT NULL DEFAULT 0,
     done_rowid  INTEGER NOT NULL DEFAULT 0,
     backfilled  INTEGER NOT NULL DEFAULT 0,
     to_backfill INTEGER NOT NULL DEFAULT 0
   );
   INSERT INTO search_state (one) VALUES (1);`,
  // Search after the ack (lib/sqlite/searching.ts): a store no longer indexes its body in its own transaction;
  // done_rowid becomes the index's place, every row at or below it indexed (or not indexable), and
  // indexSearch() takes the rows past it, a batch per transaction: SQLite has one writer, so a rowid is never
  // committed after a larger one. The insert trigger goes; the two that take a dropped body out stay, made
  // once here and gated on search_state rather than added and dropped by enable and disable, as a migration
  // cannot add a trigger to some inboxes only: a row dropped past the place was never indexed, and a body
  // changed there is read by the indexer when it gets there. A row deleted at the top hands its rowid to the
  // next row stored (SQLite's rule without AUTOINCREMENT), so the place steps back below it. An inbox with
  // the index on at this upgrade: its trigger had indexed every row, the place is its last; one still
  // backfilling is emptied and backfilled from the start, as its trigger had indexed rows past the backfill's.
  `DROP TRIGGER IF EXISTS deliveries_search_insert;
   DROP TRIGGER IF EXISTS deliveries_search_update;
   DROP TRIGGER IF EXISTS deliveries_search_delete;
   UPDATE search_state SET done_rowid = (SELECT coalesce(max(rowid), 0) FROM deliveries)
    WHERE enabled = 1 AND done_rowid >= until_rowid;
   INSERT INTO deliveries_search (deliveries_search)
     SELECT 'delete-all' FROM search_state WHERE enabled = 1 AND done_rowid < until_rowid;
   UPDATE search_state SET done_rowid = 0, backfilled = 0, until_rowid = (SELECT coalesce(max(rowid), 0) FROM deliveries),
          to_backfill = (SELECT count(*) FROM deliveries WHERE purged_at IS NULL)
    WHERE enabled = 1 AND done_rowid < until_rowid;
   CREATE TRIGGER deliveries_search_update AFTER UPDATE OF body ON deliveries
     WHEN old.rowid <= (SELECT done_rowid FROM search_state WHERE enabled = 1)
   BEGIN
     DELETE FROM deliveries_search WHERE rowid = old.rowid;
     INSERT INTO deliveries_search (rowid, words)
       SELECT new.rowid, (SELECT group_concat(CASE type WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' ELSE value END, ' ')
                            FROM json_tree(CAST(new.body AS TEXT)) WHERE type IN ('text', 'integer', 'real', 'true', 'false'))
        WHERE length(new.body) <= 65536 AND json_valid(CAST(new.body AS TEXT));
   END;
   CREATE TRIGGER deliveries_search_delete AFTER DELETE ON deliveries
     WHEN (SELECT enabled FROM search_state) = 1
   BEGIN
     DELETE FROM deliveries_search WHERE rowid = old.rowid AND old.rowid <= (SELECT done_rowid FROM search_state);
     UPDATE search_state SET done_rowid = min(done_rowid, (SELECT coalesce(max(rowid), 0) FROM deliveries)),
                             until_rowid = min(until_rowid, (SELECT coalesce(max(rowid), 0) FROM deliveries))
      WHERE max(done_rowid, until_rowid) > (SELECT coalesce(max(rowid), 0) FROM deliveries);
   END;`,
  // Bodies apart (docs/table.md#bodies-apart): a body larger than inlineBodyBytes lives in delivery_bodies,
  // in the order stored, and its row in delivery_rows keeps an empty one and the body's seq. A claim, an
  // extend and a finish then rewrite a row of a few hundred bytes, not one that carries its body; purge
  // marks the row in place and deletes the body's row, rather than moving every row and its index entries
  // (about 3 KB of WAL a purged row; the two take about 0.7 KB, docs/table.md#on-sqlite). deliveries is
  // a view of the two with every column it had, and writable through INSTEAD OF triggers, so SQL written
  // against the table reads and writes as before; the inbox itself writes delivery_rows. Rows stored before
  // keep their bodies inline: the upgrade is a rename and a view, instant at any size. A later column of
  // delivery_rows must be added to the view and its triggers too.
  `ALTER TABLE deliveries RENAME TO delivery_rows;
   ALTER TABLE delivery_rows ADD COLUMN body_seq INTEGER;
   CREATE TABLE delivery_bodies (seq INTEGER PRIMARY KEY, body BLOB NOT NULL);
   CREATE VIEW deliveries AS
     SELECT r.rowid AS rowid,
            r.source,
            r.id,
            CASE WHEN r.body_seq IS NULL THEN r.body
                 ELSE coalesce((SELECT b.body FROM delivery_bodies b WHERE b.seq = r.body_seq), X'') END AS body,
            r.body_sha256,
            r.content_type,
            r.event_type,
            r.provider_time,
            r.received_at,
            r.status,
            r.attempts,
            r.available_at,
            r.leased_until,
            r.lease_token,
            r.error,
            r.conflicts,
            r.finished_at,
            r.lease_ms,
            r.replays,
            r.purged_at,
            r.order_key,
            r.event_time,
            r.newer_id,
            r.route,
            r.destination,
            r.headers,
            r.traceparent,
            r.origin
       FROM delivery_rows r;
   -- A row goes with its body, whoever deletes it.
   CREATE TRIGGER delivery_rows_body AFTER DELETE ON delivery_rows WHEN old.body_seq IS NOT NULL
   BEGIN
     DELETE FROM delivery_bodies WHERE seq = old.body_seq;
   END;
   -- SQL written against the table keeps its bodies where store() would: one over 256 bytes (inlineBodyBytes)
   -- apart, the rest in its row. Inside a trigger, last_insert_rowid() is the body's seq just inserted.
   CREATE TRIGGER deliveries_insert INSTEAD OF INSERT ON deliveries
   BEGIN
     INSERT INTO delivery_bodies (body) SELECT new.body WHERE length(new.body) > 256;
     INSERT INTO delivery_rows (source, id, body, body_sha256, content_type, event_type, provider_time, received_at, status, attempts,
                                available_at, leased_until, lease_token, error, conflicts, finished_at, lease_ms, replays, purged_at,
                                order_key, event_time, newer_id, route, destination, headers, traceparent, origin, body_seq)
     VALUES (new.source, new.id, CASE WHEN length(new.body) > 256 THEN X'' ELSE new.body END, new.body_sha256,
             new.content_type, new.event_type, new.provider_time, new.received_at, new.status, coalesce(new.attempts, 0),
             new.available_at, new.leased_until, new.lease_token, new.error, coalesce(new.conflicts, 0), new.finished_at,
             new.lease_ms, coalesce(new.replays, 0), new.purged_at, new.order_key, new.event_time, new.newer_id,
             coalesce(new.route, 0), coalesce(new.destination, 'handler'), new.headers, new.traceparent,
             coalesce(new.origin, 'webhook'), CASE WHEN length(new.body) > 256 THEN last_insert_rowid() END);
   END;
   -- A body set through the view is kept in its row, and the one it replaces is let go.
   CREATE TRIGGER deliveries_update INSTEAD OF UPDATE ON deliveries
   BEGIN
     UPDATE delivery_rows SET source = new.source, id = new.id, body_sha256 = new.body_sha256, content_type = new.content_type,
                              event_type = new.event_type, provider_time = new.provider_time, received_at = new.received_at,
                              status = new.status, attempts = new.attempts, available_at = new.available_at,
                              leased_until = new.leased_until, lease_token = new.lease_token, error = new.error, conflicts = new.conflicts,
                              finished_at = new.finished_at, lease_ms = new.lease_ms, replays = new.replays, purged_at = new.purged_at,
                              order_key = new.order_key, event_time = new.event_time, newer_id = new.newer_id, route = new.route,
                              destination = new.destination, headers = new.headers, traceparent = new.traceparent, origin = new.origin
      WHERE rowid = old.rowid;
     DELETE FROM delivery_bodies
      WHERE new.body IS NOT old.body AND seq = (SELECT body_seq FROM delivery_rows WHERE rowid = old.rowid);
     UPDATE delivery_rows SET body = new.body, body_seq = NULL WHERE rowid = old.rowid AND new.body IS NOT old.body;
   END;
   CREATE TRIGGER deliveries_delete INSTEAD OF DELETE ON deliveries
   BEGIN
     DELETE FROM delivery_rows WHERE rowid = old.rowid;
   END;`,
];

/** openDatabase opens (creating if needed) an inbox database and brings its schema up to date. */
export function openDatabase(path: string, busyTimeoutMs: number = DEFAULTS.busyTimeoutMs): DatabaseSync {
  let db: DatabaseSync;
  try {
    db = new DatabaseSync(path, { timeout: busyTimeoutMs });
  } catch (error) {
    // SQLite only says "unable to open database file"; a missing folder is the usual cause, so name it.
    const reason = existsSync(dirname(path)) ? message(error) : `no such directory ${dirname(path)}`;
    throw new Error(`open ${path}: ${reason}`, { cause: error });
  }
  try {
    // Before anything else writes the file: a new database is created able to give freed pages back
    // (purge's incremental vacuum). On an existing file this does nothing until a VACUUM (vacuum()).
    db.exec("PRAGMA auto_vacuum = INCREMENTAL");
    // WAL lets the worker read while the receiver writes, and makes each commit one append.
    db.exec("PRAGMA journal_mode = WAL");
    // FULL fsyncs the WAL at every commit: a 200 means the delivery survives a power cut.
    db.exec("PRAGMA synchronous = FULL");
    // A checkpoint copies the WAL into the database and fsyncs it, in whichever commit crosses the
    // threshold. 4000 pages (16 MB, not the default 1000) means a quarter as many, each writing the
    // pages that many small commits touched over and over only once. The WAL file is reused, not grown.
    db.exec(`PRAGMA wal_autocheckpoint = ${DEFAULTS.walAutocheckpointPages}`);
    // 16 MB of page cache (the default is 2 MB) keeps the indexes a claim and a finish walk in memory at
    // a backlog of 200k; it is a bound, so memory stays flat whatever the backlog.
    db.exec("PRAGMA cache_size = -16000");
    // The claim's ORDER BY may sort in a temporary b-tree: in memory, not a temporary file.
    db.exec("PRAGMA temp_store = MEMORY");
    // Read back, not assumed: a runtime's own SQLite, or a target that is not a file, may not hold them.
    const problem = durabilityProblem(readDurability(db));
    if (problem !== undefined) throw new Error(`${problem}: a 200 would not mean the delivery is safe on disk`);
    migrate(db);
    registerSearch(db);
    // SQLite quietly opens a file it may not write read-only: find out now, not at the first delivery.
    // (BEGIN IMMEDIATE alone succeeds on a read-only file in WAL mode; a real write, rolled back, does not.)
    db.exec("BEGIN IMMEDIATE");
    try {
      db.exec(`PRAGMA user_version = ${MIGRATIONS.length}`);
    } finally {
      db.exec("ROLLBACK");
    }
  } catch (error) {
    db.close();
    throw new Error(`open ${path}: ${message(error)}`, { cause: error });
  }
  return db;
}

/**
 * registerSearch gives a connection jsonContains as SQL (SQLITE_CONTAINS), with which a bodyJson search rechecks
 * the rows its FTS5 index found. Only queries call it, never a trigger, so a writer without it (the sqlite3
 * shell, an older inbox) still writes the file.
 */
export function registerSearch(db: DatabaseSync): void {
  // The needle is the same text for every row of one search: parsed once, not once a row.
  let last: { text: string; needle: unknown } | undefined;
  db.function(SQLITE_CONTAINS, { deterministic: true }, (body, text) => {
    if (!(body instanceof Uint8Array) || typeof text !== "string") return 0;
    if (last?.text !== text) last = { text, needle: JSON.parse(text) };
    const doc = searchableJson(body, DEFAULTS.searchBodyBytes);
    return doc !== undefined && jsonContains(doc, last.needle) ? 1 : 0;
  });
}

/** Durability is what an inbox database was opened with, read back from SQLite on the runtime that opened it. */
export interface Durability {
  /** The runtime whose node:sqlite opened it, as "node 24.21.0": each runtime bundles its own SQLite. */
  runtime: string;
  /** sqlite_version() of that SQLite. */
  sqliteVersion: string;
  /** PRAGMA journal_mode: "wal" on a file; "memory" for :memory:. */
  journalMode: string;
  /** PRAGMA synchronous: 2 is FULL, 3 EXTRA; 1, NORMAL, only with ownWalSync. */
  synchronous: number;
  /** The inbox fdatasyncs the WAL itself before it settles any write, off the event loop (syncOffLoop), so commits need no fsync of their own. */
  ownWalSync?: boolean;
  /** Whether SQLite was built for threads (THREADSAFE not 0): the checkpoint and gauge threads open their own connections. */
  threadsafe: boolean;
}

/** readDurability reads journal_mode, synchronous, the SQLite version and its thread safety back from an open database. */
export function readDurability(db: DatabaseSync): Durability {
  const one = (sql: string) => Object.values(db.prepare(sql).get() ?? {})[0];
  const options = (db.prepare("PRAGMA compile_options").all() as { compile_options: string }[]).map(
    (r) => r.compile_options,
  );
  return {
    runtime: describeRuntime(),
    sqliteVersion: String(one("SELECT sqlite_version()")),
    journalMode: String(one("PRAGMA journal_mode")).toLowerCase(),
    synchronous: Number(one("PRAGMA synchronous")),
    threadsafe: !options.includes("THREADSAFE=0"),
  };
}

// The WAL-reset bug (sqlite.org/wal.html#walresetbug): with two connections writing and checkpointing at
// once, as the receiver and its checkpoint thread do, a checkpoint could skip committed frames. Fixed in
// 3.51.3, and in the 3.50.7 and 3.44.6 backports.
const WAL_RESET_FIXED: readonly (readonly [number, number, number])[] = [
  [3, 44, 6],
  [3, 50, 7],
  [3, 51, 3],
];

/** walResetFixed says whether this SQLite version has the WAL-reset fix. */
export function walResetFixed(version: string): boolean {
  const v = version.split(".").map(Number);
  if (v.length < 3 || v.some((n) => !Number.isInteger(n)))
    throw new TypeError(`walResetFixed: expected a version like 3.51.3, got ${JSON.stringify(version)}`);
  const atLeast = (fix: readonly number[]) => (v[0]! - fix[0]! || v[1]! - fix[1]! || v[2]! - fix[2]!) >= 0;
  // Fixed from the last entry on; before it, only within a backport's own minor line.
  return (
    atLeast(WAL_RESET_FIXED.at(-1)!) ||
    WAL_RESET_FIXED.some((fix) => v[0] === fix[0] && v[1] === fix[1] && atLeast(fix))
  );
}

/**
 * durabilityProblem says, in one clause, why an opened database cannot keep the inbox's promise (a 200
 * means the delivery survives a crash or a power cut), or undefined when it can.
 */
export function durabilityProblem(d: Durability): string | undefined {
  const sqlite = `SQLite ${d.sqliteVersion} (${d.runtime})`;
  if (d.journalMode !== "wal") return `journal_mode is ${d.journalMode}, not wal, on ${sqlite}`;
  if (d.synchronous < (d.ownWalSync ? 1 : 2))
    return `synchronous is ${d.synchronous}, not ${d.ownWalSync ? "NORMAL (1) with the inbox's own fdatasync" : "FULL (2)"}, on ${sqlite}`;
  if (!walResetFixed(d.sqliteVersion)) return `${sqlite} has the WAL-reset bug (fixed in 3.51.3, 3.50.7 and 3.44.6)`;
  if (!d.threadsafe)
    return `${sqlite} was built without thread safety (THREADSAFE=0), and the inbox checkpoints on a thread`;
  return undefined;
}

function migrate(db: DatabaseSync): void {
  const { user_version: version } = db.prepare("PRAGMA user_version").get() as { user_version: number };
  if (version > MIGRATIONS.length) {
    throw new Error(`schema version ${version} is newer than this code knows (${MIGRATIONS.length})`);
  }
  for (let next = version; next < MIGRATIONS.length; next++) {
    // IMMEDIATE, so two processes opening a new file don't both run the same migration.
    db.exec("BEGIN IMMEDIATE");
    try {
      const { user_version: now } = db.prepare("PRAGMA user_version").get() as { user_version: number };
      if (now === next) {
        db.exec(MIGRATIONS[next]!);
        db.exec(`PRAGMA user_version = ${next + 1}`);
      }
      db.exec("COMMIT");
    } catch (error) {
      db.exec("ROLLBACK");
      throw error;
    }
  }
}

/**
 * isInbox peeks, read-only, for the deliveries table, so the CLI neither creates nor converts a file it
 * was only asked to look at; an empty file may still become an inbox. Anything that cannot be read this
 * way is left to openDatabase to report in its own words.
 */
export function isInbox(path: string): boolean {
  let db: DatabaseSync;
  try {
    db = new DatabaseSync(path, { readOnly: true });
  } catch {
    return true;
  }
  try {
    // deliveries: a table before bodies apart, a view since.
    const tables = db.prepare("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')").all() as {
      name: string;
    }[];
    return tables.length === 0 || tables.some((t) => t.name === "deliveries");
  } catch {
    return true;
  } finally {
    db.close();
  }
}

// postgres/schema.ts: the PostgreSQL inbox's schema, as an ordered list of migrations (tracked in the
// inbox_migrations table), which lib/postgres/migrate.ts applies. A new column or index is a new entry at the
// end of MIGRATIONS, here and in sqlite/schema.ts. Not run on its own.

// delivery_keys as the split makes it, whether its keys are copied in the split or ahead of it (prepareKeys).
export const KEYS_TABLE = `CREATE TABLE delivery_keys (
       source      text     NOT NULL,
       id          text     NOT NULL,
       route       smallint NOT NULL,
       received_at bigint   NOT NULL
     ) WITH (autovacuum_vacuum_scale_factor = 0.02)`;

/** MIGRATIONS is the schema, in order: a shipped entry is never edited, only followed by a new one. */
export const MIGRATIONS: readonly string[] = [
  `CREATE TABLE deliveries (
     source        text    NOT NULL,
     id            text    NOT NULL,
     body          bytea   NOT NULL,
     body_sha256   text    NOT NULL,
     content_type  text,
     event_type    text,
     provider_time bigint,
     received_at   bigint  NOT NULL,
     status        text    NOT NULL CHECK (status IN ('received', 'processing', 'done', 'failed')),
     attempts      integer NOT NULL DEFAULT 0,
     -- When it is next due: for a received delivery its (re)try time, for a processing one its lease's
     -- end, so one partial index serves new work, retries and takeovers alike.
     available_at  bigint  NOT NULL,
     leased_until  bigint,
     lease_token   text,
     lease_ms      integer,
     error         text,
     conflicts     integer NOT NULL DEFAULT 0,
     finished_at   bigint,
     PRIMARY KEY (source, id)
   ) WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);
   -- Partial, so a claim walks only what is waiting, however many done rows pile up behind it.
   CREATE INDEX deliveries_due ON deliveries (available_at) WHERE status IN ('received', 'processing');
   CREATE INDEX deliveries_failed ON deliveries (received_at) WHERE status = 'failed';`,

  // Replays, tombstones (a purged body leaves the row with its hash and times, so its ID is still a
  // duplicate and store() stays one INSERT), and what keeps search and the bulk commands off full scans.
  `ALTER TABLE deliveries ADD COLUMN replays integer NOT NULL DEFAULT 0;
   ALTER TABLE deliveries ADD COLUMN purged_at bigint;
   -- Only done rows with a body: what purge drops next and replay may take, without walking tombstones.
   CREATE INDEX deliveries_kept ON deliveries (received_at) WHERE status = 'done' AND purged_at IS NULL;
   CREATE INDEX deliveries_purged ON deliveries (received_at) WHERE purged_at IS NOT NULL;
   -- Newest first, for search() and the operator's list: the one index on every row besides the key.
   CREATE INDEX deliveries_received ON deliveries (received_at);`,
  // The operator page's overview (summary, histogram) from indexes alone, however many done rows pile up:
  // what was finished per minute; what is not done, by status, age and source; and conflicting duplicates.
  `CREATE INDEX IF NOT EXISTS deliveries_finished ON deliveries (finished_at) WHERE finished_at IS NOT NULL;
   CREATE INDEX IF NOT EXISTS deliveries_open ON deliveries (status, received_at, source) WHERE status <> 'done';
   CREATE INDEX IF NOT EXISTS deliveries_conflicts ON deliveries (conflicts) WHERE conflicts > 0;
   -- Failures grouped by their error without reading the failed rows themselves; only failed rows pay for it.
   CREATE INDEX IF NOT EXISTS deliveries_failed_error ON deliveries (error, received_at) WHERE status = 'failed';
   -- Every failed try's error, not only the last one's, for the person reading a delivery's page.
   CREATE TABLE IF NOT EXISTS attempt_errors (
     source text NOT NULL, id text NOT NULL, attempt integer NOT NULL, error text NOT NULL, failed_at bigint NOT NULL,
     seq bigserial PRIMARY KEY);
   CREATE INDEX IF NOT EXISTS attempt_errors_delivery ON attempt_errors (source, id);`,
  // Ordering (see claimBatch and settleKeys). Ordered deliveries that wait leave the claim's index, so it
  // never walks past them; each key's head row says which one may run next and from when (due).
  `ALTER TABLE deliveries ADD COLUMN order_key text, ADD COLUMN event_time bigint, ADD COLUMN arrival bigint,
                         ADD COLUMN newer_id text;
   CREATE SEQUENCE deliveries_arrival;
   DROP INDEX deliveries_due;
   CREATE INDEX deliveries_due ON deliveries (available_at) WHERE (status = 'received' AND order_key IS NULL) OR status = 'processing';
   CREATE INDEX deliveries_ordered ON deliveries (source, order_key, event_time, arrival) WHERE status = 'received' AND order_key IS NOT NULL;
   CREATE TABLE order_keys (
     source          text    NOT NULL,
     order_key       text    NOT NULL,
     -- The head: the delivery that runs next (received, due at due), runs now (processing, due NULL), or
     -- blocks the key (failed under strict, due NULL); NULL when nothing of the key is waiting.
     head_id         text,
     head_event_time bigint,
     head_seq        bigint,
     due             bigint,
     -- The newest event handled so far: an older one after it is handed over stale.
     last_event_time bigint,
     last_id         text,
     strict          boolean NOT NULL DEFAULT false,
     PRIMARY KEY (source, order_key)
   ) WITH (autovacuum_vacuum_scale_factor = 0.02);
   CREATE INDEX order_keys_due ON order_keys (due) WHERE due IS NOT NULL;`,
  // Destinations (docs/forwarding.md): one row per route of a delivery, keyed by its place among them
  // (route 0, the first, is what a copy is a duplicate of, and alone counts conflicts), each with its own
  // status, attempts, lease, errors and order. Every existing row becomes route 0 of the handler (a
  // constant default: no rewrite). The claim's indexes lead with the destination, so one claim walks only
  // its own destination's due rows, and a destination that holds its deliveries is never walked past.
  `ALTER TABLE deliveries ADD COLUMN route smallint NOT NULL DEFAULT 0, ADD COLUMN destination text NOT NULL DEFAULT 'handler',
                         ADD COLUMN headers text, ADD COLUMN traceparent text;
   ALTER TABLE deliveries DROP CONSTRAINT deliveries_pkey, ADD PRIMARY KEY (source, id, route);
   DROP INDEX deliveries_due;
   CREATE INDEX deliveries_due ON deliveries (destination, available_at) WHERE (status = 'received' AND order_key IS NULL) OR status = 'processing';
   DROP INDEX deliveries_ordered;
   CREATE INDEX deliveries_ordered ON deliveries (source, destination, order_key, event_time, arrival) WHERE status = 'received' AND order_key IS NOT NULL;
   -- Each destination goes through a key's deliveries on its own: a key's head is per destination.
   ALTER TABLE order_keys ADD COLUMN destination text NOT NULL DEFAULT 'handler';
   ALTER TABLE order_keys DROP CONSTRAINT order_keys_pkey, ADD PRIMARY KEY (source, destination, order_key);
   DROP INDEX order_keys_due;
   CREATE INDEX order_keys_due ON order_keys (destination, due) WHERE due IS NOT NULL;
   ALTER TABLE attempt_errors ADD COLUMN destination text NOT NULL DEFAULT 'handler';
   -- A destination's shared state: paused, its breaker, and its rate limit's tokens, one row each.
   CREATE TABLE destinations (
     name          text    PRIMARY KEY,
     paused        boolean NOT NULL DEFAULT false,
     paused_reason text,
     state         text    NOT NULL DEFAULT 'closed' CHECK (state IN ('closed', 'open', 'probing')),
     retry_at      bigint,
     probe_until   bigint,
     failures      integer NOT NULL DEFAULT 0,
     window_start  bigint,
     window_done   integer NOT NULL DEFAULT 0,
     window_failed integer NOT NULL DEFAULT 0,
     last_error    text,
     last_error_at bigint,
     tokens        double precision,
     tokens_at     bigint,
     changed_at    bigint
   );`,
  // The operator page at a million deliveries: what is open counted by destination (destinations()), and
  // what finished by status (histogram()), from the indexes alone rather than ~100k heap rows at random.
  `DROP INDEX deliveries_open;
   CREATE INDEX deliveries_open ON deliveries (status, received_at, source, destination) WHERE status <> 'done';
   DROP INDEX deliveries_finished;
   CREATE INDEX deliveries_finished ON deliveries (finished_at, status) WHERE finished_at IS NOT NULL;`,
  // The API (lib/api/): its keys, by hash alone; each POST's first answer under its Idempotency-Key; and the
  // audit log of every change made through the API or the page.
  `CREATE TABLE api_keys (
     id         text   PRIMARY KEY,
     name       text   NOT NULL,
     scope      text   NOT NULL CHECK (scope IN ('read', 'write')),
     hash       text   NOT NULL UNIQUE,
     created_at bigint NOT NULL,
     revoked_at bigint
   );
   CREATE TABLE idempotency (
     key          text    PRIMARY KEY,
     request_hash text    NOT NULL,
     status       integer NOT NULL,
     body         text    NOT NULL,
     at           bigint  NOT NULL
   );
   CREATE INDEX idempotency_at ON idempotency (at);
   CREATE TABLE audit (
     seq       bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
     at        bigint  NOT NULL,
     who       text    NOT NULL,
     operation text    NOT NULL,
     target    text    NOT NULL,
     count     integer NOT NULL
   );`,
  // Reconcile (docs/reconcile.md): where a delivery came from, the provider's webhook or its API, fetched
  // back after the webhook never came. Every existing row arrived as a webhook (a constant default: no rewrite).
  `ALTER TABLE deliveries ADD COLUMN origin text NOT NULL DEFAULT 'webhook';`,
  // Configuration in the database (lib/config/): each applied version of the sources file's JSON, secrets
  // as env:NAME, with its transforms' code and SHA-256; the newest is in force. Text, not jsonb: a dump
  // gives the document back byte for byte.
  `CREATE TABLE inbox_config (
     version    integer PRIMARY KEY,
     document   text    NOT NULL,
     transforms text    NOT NULL,
     actor      text    NOT NULL,
     applied_at bigint  NOT NULL
   );`,
  // Trust (docs/security.md): each configuration version says which way it came (the operator's file, or the
  // API) and whose hand wrote each part; a version the API applied before this knew no better is the API's
  // whole. Each audit entry gets the key of its change, so that a change made in several transactions (a
  // bulk retry's batches) keeps one entry, and a batch redone writes it once.
  `ALTER TABLE inbox_config ADD COLUMN way text NOT NULL DEFAULT 'operator', ADD COLUMN trust text NOT NULL DEFAULT '{}';
   UPDATE inbox_config SET way = 'api' WHERE actor LIKE 'key:%';
   ALTER TABLE audit ADD COLUMN change text UNIQUE;`,
  // The secret store (lib/secrets.ts): each value sealed with the operator's key, which the database never
  // holds; and a count of its changes, which running scripts watch to open them again.
  `CREATE TABLE secrets (
     name   text   PRIMARY KEY,
     sealed text   NOT NULL,
     set_at bigint NOT NULL,
     set_by text   NOT NULL
   );
   CREATE TABLE secrets_version (
     one     integer PRIMARY KEY CHECK (one = 1),
     version bigint  NOT NULL
   );
   INSERT INTO secrets_version (one, version) VALUES (1, 0);`,
  // The admin scope (docs/api.md#keys): a key that may also make and revoke keys.
  `ALTER TABLE api_keys DROP CONSTRAINT api_keys_scope_check;
   ALTER TABLE api_keys ADD CONSTRAINT api_keys_scope_check CHECK (scope IN ('read', 'write', 'admin'));`,
  // The attempt log (docs/forwarding.md#the-attempt-log): every try, the good ones too, with its timing and
  // the destination's answer, where attempt_errors kept a failed try's error alone. Its rows come along,
  // untimed; seq orders tries that started in the same millisecond and says which are oldest to let go.
  `CREATE TABLE attempts (
     seq         bigserial PRIMARY KEY,
     source      text      NOT NULL,
     id          text      NOT NULL,
     destination text      NOT NULL,
     attempt     integer   NOT NULL,
     started_at  bigint    NOT NULL,
     ms          integer,
     status      smallint,
     error       text,
     headers     text,
     body        text
   );
   CREATE INDEX attempts_delivery ON attempts (source, id, destination, seq);
   INSERT INTO attempts (source, id, destination, attempt, started_at, error)
     SELECT source, id, destination, attempt, failed_at, error FROM attempt_errors ORDER BY failed_at, seq;
   DROP TABLE attempt_errors;`,
  // Bodies in a table of their own (docs/table.md#bodies-apart): a claim, an extend and a done mark update a
  // row of a few hundred bytes and never copy its body, which a row under about 2 kB carries inline (so
  // TOAST, whose threshold is compiled in, never moves it out, whatever toast_tuple_target says). The table
  // is renamed delivery_rows, and deliveries becomes the view that whoever queries the inbox reads as before;
  // rows stored before this keep their body inline (no rewrite: the upgrade is instant), new ones have an
  // empty one there. The view stays writable through INSTEAD OF triggers, for SQL written against the table.
  // The bodies are partitioned by the day they were received (retention drops a day whole: purge(), and
  // periods.ts makes each day's partition ahead); the default partition takes a day that has none.
  `CREATE TABLE delivery_bodies (
     source      text     NOT NULL,
     id          text     NOT NULL,
     route       smallint NOT NULL,
     received_at bigint   NOT NULL,
     body        bytea    NOT NULL,
     PRIMARY KEY (source, id, route, received_at)
   ) PARTITION BY RANGE (received_at);
   CREATE TABLE delivery_bodies_default PARTITION OF delivery_bodies DEFAULT;
   ALTER TABLE deliveries RENAME TO delivery_rows;
   -- The body as a subquery, not a join: a query that reads no body never evaluates it (PostgreSQL 15 does
   -- not remove a LEFT JOIN to a partitioned table, so a count over the view would have read every body's
   -- key), and one that does finds it by its full key, received_at pruning the partitions as it runs.
   CREATE VIEW deliveries AS
     SELECT r.source, r.id,
            coalesce((SELECT b.body FROM delivery_bodies b
                       WHERE b.source = r.source AND b.id = r.id AND b.route = r.route AND b.received_at = r.received_at),
                     r.body) AS body,
            r.body_sha256, r.content_type, r.event_type,
            r.provider_time, r.received_at, r.status, r.attempts, r.available_at, r.leased_until,
            r.lease_token, r.lease_ms, r.error, r.conflicts, r.finished_at, r.replays,
            r.purged_at, r.order_key, r.event_time, r.arrival, r.newer_id, r.route,
            r.destination, r.headers, r.traceparent, r.origin
       FROM delivery_rows r;
   -- An INSERT into the view that leaves a column out gets the table's default, as it did.
   ALTER VIEW deliveries ALTER COLUMN attempts SET DEFAULT 0, ALTER COLUMN conflicts SET DEFAULT 0,
     ALTER COLUMN replays SET DEFAULT 0, ALTER COLUMN route SET DEFAULT 0, ALTER COLUMN destination SET DEFAULT 'handler',
     ALTER COLUMN origin SET DEFAULT 'webhook';
   -- Its tables are the schema's it was made in (FROM CURRENT), whatever search_path the session writing the
   -- view has: a connection to another schema, or none, writes the rows of this one.
   CREATE FUNCTION deliveries_written() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
   BEGIN
     IF TG_OP = 'INSERT' THEN
       INSERT INTO delivery_rows (source, id, body, body_sha256, content_type, event_type, provider_time, received_at, status, attempts, available_at, leased_until, lease_token, lease_ms, error, conflicts, finished_at, replays, purged_at, order_key, event_time, arrival, newer_id, route, destination, headers, traceparent, origin)
       VALUES (NEW.source, NEW.id, '\\x'::bytea, NEW.body_sha256, NEW.content_type, NEW.event_type, NEW.provider_time, NEW.received_at, NEW.status, NEW.attempts, NEW.available_at, NEW.leased_until, NEW.lease_token, NEW.lease_ms, NEW.error, NEW.conflicts, NEW.finished_at, NEW.replays, NEW.purged_at, NEW.order_key, NEW.event_time, NEW.arrival, NEW.newer_id, NEW.route, NEW.destination, NEW.headers, NEW.traceparent, NEW.origin);
     ELSIF TG_OP = 'UPDATE' THEN
       UPDATE delivery_rows SET (source, id, body_sha256, content_type, event_type, provider_time, received_at, status, attempts, available_at, leased_until, lease_token, lease_ms, error, conflicts, finished_at, replays, purged_at, order_key, event_time, arrival, newer_id, route, destination, headers, traceparent, origin)
         = (NEW.source, NEW.id, NEW.body_sha256, NEW.content_type, NEW.event_type, NEW.provider_time, NEW.received_at, NEW.status, NEW.attempts, NEW.available_at, NEW.leased_until, NEW.lease_token, NEW.lease_ms, NEW.error, NEW.conflicts, NEW.finished_at, NEW.replays, NEW.purged_at, NEW.order_key, NEW.event_time, NEW.arrival, NEW.newer_id, NEW.route, NEW.destination, NEW.headers, NEW.traceparent, NEW.origin)
        WHERE source = OLD.source AND id = OLD.id AND route = OLD.route;
       IF NEW.body IS NOT DISTINCT FROM OLD.body AND (NEW.source, NEW.id, NEW.route) = (OLD.source, OLD.id, OLD.route) THEN
         RETURN NEW;
       END IF;
       DELETE FROM delivery_bodies WHERE source = OLD.source AND id = OLD.id AND route = OLD.route AND received_at = OLD.received_at;
       UPDATE delivery_rows SET body = '\\x'::bytea WHERE source = NEW.source AND id = NEW.id AND route = NEW.route;
     ELSE
       DELETE FROM delivery_bodies WHERE source = OLD.source AND id = OLD.id AND route = OLD.route AND received_at = OLD.received_at;
       DELETE FROM delivery_rows WHERE source = OLD.source AND id = OLD.id AND route = OLD.route;
       RETURN OLD;
     END IF;
     IF octet_length(NEW.body) > 0 THEN
       INSERT INTO delivery_bodies (source, id, route, received_at, body) VALUES (NEW.source, NEW.id, NEW.route, NEW.received_at, NEW.body);
     END IF;
     RETURN NEW;
   END $$;
   CREATE TRIGGER deliveries_written INSTEAD OF INSERT OR UPDATE OR DELETE ON deliveries
     FOR EACH ROW EXECUTE FUNCTION deliveries_written();
   -- A row's body wherever it is, for a statement on delivery_rows that must search or weigh it (a row
   -- stored before this keeps it inline).
   CREATE FUNCTION delivery_body(s text, i text, r smallint, at bigint, inline bytea) RETURNS bytea LANGUAGE sql STABLE AS $$
     SELECT coalesce((SELECT b.body FROM delivery_bodies b WHERE b.source = s AND b.id = i AND b.route = r AND b.received_at = at),
                     inline) $$;`,
  // Search (lib/search.ts, docs/operations.md#searching-bodies): each delivery's JSON body once, in a table of its
  // own keyed as duplicates are, with GIN indexes for bodyJson (jsonb_path_ops: @> alone, a third the size of
  // jsonb_ops) and bodyWords (a tsvector of its strings, numbers and booleans: full-text, not pg_trgm, which
  // bench/bodysearch.ts measures beside it, and which needs an extension). Not indexes on deliveries: each claim,
  // finish or retry rewrites its row in a new place (never a HOT update) and would parse the body and make its
  // tsvector again; here a delivery is parsed once, when it is stored. inbox_search_json() is the JSON a body
  // holds, or NULL when it is past 65536 bytes (DEFAULTS.searchBodyBytes), not UTF-8 or not JSON, so a store
  // never fails on a body the index cannot take (not PARALLEL SAFE: its EXCEPTION block is a subtransaction).
  // Opt-in: the table is made here empty, and nothing fills it until `inbox.ts search enable` adds the triggers
  // (lib/postgres/searching.ts; inbox_search_sync() here indexed in the store's transaction, until the next
  // migration moved indexing after the ack) and indexes the rows already there in batches; an inbox that never
  // asks pays nothing at a store or at this upgrade. search_state is whether it is on and how far the backfill got.
  `CREATE FUNCTION inbox_search_json(body bytea) RETURNS jsonb LANGUAGE plpgsql IMMUTABLE STRICT AS $$
   BEGIN
     IF length(body) > 65536 THEN RETURN NULL; END IF;
     RETURN convert_from(body, 'UTF8')::jsonb;
   EXCEPTION WHEN data_exception THEN
     RETURN NULL;
   END $$;
   CREATE TABLE deliveries_search (
     source text  NOT NULL,
     id     text  NOT NULL,
     doc    jsonb NOT NULL,
     PRIMARY KEY (source, id)
   );
   -- A delivery's rows (one per route) share its body: route 0, which every delivery has, stands for them.
   CREATE FUNCTION inbox_search_sync() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
   BEGIN
     IF TG_OP <> 'INSERT' THEN
       DELETE FROM deliveries_search WHERE source = OLD.source AND id = OLD.id;
     END IF;
     -- An empty body is none: a tombstone's, or a row whose body is in delivery_bodies (its own trigger there).
     IF TG_OP <> 'DELETE' AND octet_length(NEW.body) > 0 THEN
       INSERT INTO deliveries_search (source, id, doc)
         SELECT NEW.source, NEW.id, j FROM inbox_search_json(NEW.body) AS j WHERE j IS NOT NULL
         ON CONFLICT (source, id) DO UPDATE SET doc = excluded.doc;
     END IF;
     RETURN NULL;
   END $$;
   CREATE INDEX deliveries_search_json ON deliveries_search USING gin (doc jsonb_path_ops);
   CREATE INDEX deliveries_search_words ON deliveries_search USING gin
     (jsonb_to_tsvector('simple'::regconfig, doc, '["string", "numeric", "boolean"]'::jsonb));
   CREATE TABLE search_state (
     one          integer PRIMARY KEY CHECK (one = 1),
     enabled      boolean NOT NULL DEFAULT false,
     changed_at   bigint,
     after_source text,
     after_id     text,
     done         boolean NOT NULL DEFAULT false,
     backfilled   bigint  NOT NULL DEFAULT 0,
     to_backfill  bigint  NOT NULL DEFAULT 0
   );
   INSERT INTO search_state (one) VALUES (1);`,
  // Search after the ack (lib/postgres/searching.ts): a store no longer indexes its body in its own transaction.
  // Its insert trigger puts the delivery's key in search_pending, a row of a few bytes, and indexSearch() takes
  // the oldest keys out and indexes their bodies, in one transaction. A queue, not a place in a sequence: a
  // store's transaction may commit after one that took a later value, and a cursor that moved past the later
  // one would skip it; a key in the queue is seen once its store commits, whenever that is, and leaves it in
  // the transaction that indexes it. A statement's trigger, not a row's: a store's group commit is one INSERT.
  // The trigger that takes a dropped body out keeps doing so at once; a body set again (through the deliveries
  // view) goes back into the queue. The body table needs no trigger: the indexer reads the body wherever it is.
  // An inbox with the index on at this upgrade has its triggers swapped.
  `CREATE TABLE search_pending (
     seq    bigserial PRIMARY KEY,
     source text NOT NULL,
     id     text NOT NULL
   ) WITH (autovacuum_vacuum_scale_factor = 0.01);
   CREATE FUNCTION inbox_search_queue() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
   BEGIN
     INSERT INTO search_pending (source, id) SELECT source, id FROM added WHERE route = 0 AND purged_at IS NULL;
     RETURN NULL;
   END $$;
   CREATE FUNCTION inbox_search_forget() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
   BEGIN
     DELETE FROM deliveries_search WHERE source = OLD.source AND id = OLD.id;
     IF TG_OP = 'UPDATE' AND NEW.purged_at IS NULL THEN
       INSERT INTO search_pending (source, id) VALUES (NEW.source, NEW.id);
     END IF;
     RETURN NULL;
   END $$;
   DO $$ BEGIN
     IF (SELECT enabled FROM search_state) THEN
       DROP TRIGGER IF EXISTS deliveries_search_insert ON delivery_rows;
       DROP TRIGGER IF EXISTS deliveries_search_update ON delivery_rows;
       DROP TRIGGER IF EXISTS deliveries_search_delete ON delivery_rows;
       DROP TRIGGER IF EXISTS deliveries_search_body ON delivery_bodies;
       CREATE TRIGGER deliveries_search_insert AFTER INSERT ON delivery_rows
         REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION inbox_search_queue();
       CREATE TRIGGER deliveries_search_update AFTER UPDATE OF body ON delivery_rows
         FOR EACH ROW WHEN (NEW.route = 0) EXECUTE FUNCTION inbox_search_forget();
       CREATE TRIGGER deliveries_search_delete AFTER DELETE ON delivery_rows
         FOR EACH ROW WHEN (OLD.route = 0) EXECUTE FUNCTION inbox_search_forget();
     END IF;
   END $$;`,
  // A body in its row is not looked up in delivery_bodies (docs/table.md#bodies-apart): a body of at most
  // DEFAULTS.inlineBodyBytes stays in delivery_rows.body and a larger one leaves it empty, never both, so the
  // view and delivery_body() probe the day's partition only for an empty one, as the claim already does. A
  // tombstone's is empty, and is not looked up either: its body's row may wait in its day's partition for a
  // release that could not have its lock (purge marks the day first), and the view showed it meanwhile.
  // delivery_body() has no purged_at to go by; its callers pass the rows that still have a body.
  `CREATE OR REPLACE VIEW deliveries AS
     SELECT r.source, r.id,
            CASE WHEN octet_length(r.body) > 0 OR r.purged_at IS NOT NULL THEN r.body ELSE
              coalesce((SELECT b.body FROM delivery_bodies b
                         WHERE b.source = r.source AND b.id = r.id AND b.route = r.route AND b.received_at = r.received_at),
                       r.body) END AS body,
            r.body_sha256, r.content_type, r.event_type,
            r.provider_time, r.received_at, r.status, r.attempts, r.available_at, r.leased_until,
            r.lease_token, r.lease_ms, r.error, r.conflicts, r.finished_at, r.replays,
            r.purged_at, r.order_key, r.event_time, r.arrival, r.newer_id, r.route,
            r.destination, r.headers, r.traceparent, r.origin
       FROM delivery_rows r;
   CREATE OR REPLACE FUNCTION delivery_body(s text, i text, r smallint, at bigint, inline bytea) RETURNS bytea LANGUAGE sql STABLE AS $$
     SELECT CASE WHEN octet_length(inline) > 0 THEN inline ELSE
              coalesce((SELECT b.body FROM delivery_bodies b WHERE b.source = s AND b.id = i AND b.route = r AND b.received_at = at),
                       inline) END $$;`,
  // A hot queue and a cold history (docs/table.md#hot-and-cold): delivery_rows becomes a table partitioned by
  // status, so that PostgreSQL's own row movement moves a row (a cross-partition UPDATE is a DELETE and an
  // INSERT) and the statements that write it stay as they were. delivery_rows_hot holds the rows with work left
  // (received, processing): the backlog's size, fillfactor 70. delivery_history, the default partition, holds the
  // done and failed rows, partitioned by the UTC day of received_at as delivery_bodies is (periods.ts makes each
  // day's partition beside its bodies'). A unique index on a partitioned table must hold its partition keys,
  // which (source, id, route) does not, so the key that answers a duplicate moves to delivery_keys, unpartitioned;
  // each partition keeps a unique index of its own on the key for the statements that find a row by it.
  // The old table is not copied: its rows with work left (the backlog) move to the hot partition, a CHECK says
  // the rest are history received before the end of the UTC day of the newest of them, and the table is attached as the history's partition for everything before that, its scan skipped by the
  // CHECK; its indexes are the partitioned ones' twins, so they are attached, not built. The view, its trigger
  // and the search triggers named the old table by OID: they are made again on the new one.
  // Its keys' copy was shipped inline and later made conditional on a copy ahead (prepareKeys), an edit rather
  // than a new entry: an entry before this one cannot be added (its number is every later inbox's), and one after
  // it comes too late. The edit changes no inbox's schema: one past this entry never runs it again, and one that
  // runs it ends with the same delivery_keys whichever branch it takes (test/migrate-history.test.ts compares them).
  `ALTER TABLE delivery_rows RENAME TO delivery_rows_before;
   DROP VIEW deliveries;
   DROP TRIGGER IF EXISTS deliveries_search_insert ON delivery_rows_before;
   DROP TRIGGER IF EXISTS deliveries_search_update ON delivery_rows_before;
   DROP TRIGGER IF EXISTS deliveries_search_delete ON delivery_rows_before;
   -- The copy ahead's mirror (prepareKeys), before the backlog's move below deletes from the old table.
   DROP TRIGGER IF EXISTS delivery_keys_ahead_insert ON delivery_rows_before;
   DROP TRIGGER IF EXISTS delivery_keys_ahead_delete ON delivery_rows_before;
   DROP TRIGGER IF EXISTS delivery_keys_ahead_update ON delivery_rows_before;
   DROP FUNCTION IF EXISTS delivery_keys_ahead();
   CREATE TABLE delivery_rows (LIKE delivery_rows_before INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY LIST (status);
   CREATE TABLE delivery_rows_hot PARTITION OF delivery_rows FOR VALUES IN ('received', 'processing')
     WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);
   ALTER TABLE delivery_rows_hot ADD CONSTRAINT delivery_rows_hot_pkey PRIMARY KEY (source, id, route);
   CREATE TABLE delivery_history PARTITION OF delivery_rows DEFAULT PARTITION BY RANGE (received_at);
   CREATE TABLE delivery_history_default PARTITION OF delivery_history DEFAULT
     WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);
   ALTER TABLE delivery_history_default ADD CONSTRAINT delivery_history_default_pkey PRIMARY KEY (source, id, route);
   -- What is not done, by status, age and source, on the history's partitions alone (periods.ts makes it on each
   -- day's; the old table keeps its own): on the hot partition every row is not done, and there it made the plan
   -- of a done mark that names the status (to open that partition alone) walk the whole backlog, chosen on a
   -- partition not yet analyzed, as the generic plan of the one table once did (postgres.ts finishAll).
   CREATE INDEX delivery_history_default_open ON delivery_history_default (status, received_at, source, destination)
     WHERE status <> 'done';
   -- The old table's indexes, word for word, so that the attach below takes them as they are; all but its
   -- deliveries_open (above).
   CREATE INDEX delivery_rows_due ON delivery_rows (destination, available_at) WHERE (status = 'received' AND order_key IS NULL) OR status = 'processing';
   CREATE INDEX delivery_rows_ordered ON delivery_rows (source, destination, order_key, event_time, arrival) WHERE status = 'received' AND order_key IS NOT NULL;
   CREATE INDEX delivery_rows_failed ON delivery_rows (received_at) WHERE status = 'failed';
   CREATE INDEX delivery_rows_kept ON delivery_rows (received_at) WHERE status = 'done' AND purged_at IS NULL;
   CREATE INDEX delivery_rows_purged ON delivery_rows (received_at) WHERE purged_at IS NOT NULL;
   CREATE INDEX delivery_rows_received ON delivery_rows (received_at);
   CREATE INDEX delivery_rows_finished ON delivery_rows (finished_at, status) WHERE finished_at IS NOT NULL;
   CREATE INDEX delivery_rows_conflicts ON delivery_rows (conflicts) WHERE conflicts > 0;
   CREATE INDEX delivery_rows_failed_error ON delivery_rows (error, received_at) WHERE status = 'failed';
   -- Every key ever stored and not yet forgotten: a store inserts here first, and only the new ones' rows.
   -- Copied ahead, outside this transaction (prepareKeys, below), when delivery_keys_copied says it was: what is
   -- left is its marks of keys deleted meanwhile. Otherwise (a new inbox, or a copy ahead cut short, whose part
   -- is dropped) copied here, the primary key built after the copy, in one sort, rather than entry by entry.
   DO $$ BEGIN
     IF to_regclass('delivery_keys_copied') IS NOT NULL THEN
       DELETE FROM delivery_keys WHERE received_at = -1;
       DROP INDEX delivery_keys_gone;
       DROP TABLE delivery_keys_copied;
       RETURN;
     END IF;
     DROP TABLE IF EXISTS delivery_keys;
     ${KEYS_TABLE};
     INSERT INTO delivery_keys (source, id, route, received_at) SELECT source, id, route, received_at FROM delivery_rows_before;
     ALTER TABLE delivery_keys ADD PRIMARY KEY (source, id, route);
   END $$;
   -- The backlog, small, to the hot partition.
   INSERT INTO delivery_rows_hot SELECT * FROM delivery_rows_before WHERE status IN ('received', 'processing');
   DELETE FROM delivery_rows_before WHERE status IN ('received', 'processing');
   -- The cut is the end of the UTC day of the newest row (periods.ts makes the days after it); an old table
   -- with no history in it (a new inbox, or one whose rows all had work left) is dropped instead.
   DO $$
   DECLARE
     newest bigint := (SELECT max(received_at) FROM delivery_rows_before);
     cut bigint := (floor(newest / 86400000.0)::bigint + 1) * 86400000;
   BEGIN
     IF newest IS NULL THEN
       DROP TABLE delivery_rows_before;
       RETURN;
     END IF;
     EXECUTE format('ALTER TABLE delivery_rows_before ADD CONSTRAINT delivery_rows_before_history
                       CHECK (status NOT IN (''received'', ''processing'') AND received_at < %s)', cut);
     EXECUTE format('ALTER TABLE delivery_history ATTACH PARTITION delivery_rows_before FOR VALUES FROM (MINVALUE) TO (%s)', cut);
   END $$;
   CREATE VIEW deliveries AS
     SELECT r.source, r.id,
            CASE WHEN octet_length(r.body) > 0 OR r.purged_at IS NOT NULL THEN r.body ELSE
              coalesce((SELECT b.body FROM delivery_bodies b
                         WHERE b.source = r.source AND b.id = r.id AND b.route = r.route AND b.received_at = r.received_at),
                       r.body) END AS body,
            r.body_sha256, r.content_type, r.event_type,
            r.provider_time, r.received_at, r.status, r.attempts, r.available_at, r.leased_until,
            r.lease_token, r.lease_ms, r.error, r.conflicts, r.finished_at, r.replays,
            r.purged_at, r.order_key, r.event_time, r.arrival, r.newer_id, r.route,
            r.destination, r.headers, r.traceparent, r.origin
       FROM delivery_rows r;
   ALTER VIEW deliveries ALTER COLUMN attempts SET DEFAULT 0, ALTER COLUMN conflicts SET DEFAULT 0,
     ALTER COLUMN replays SET DEFAULT 0, ALTER COLUMN route SET DEFAULT 0, ALTER COLUMN destination SET DEFAULT 'handler',
     ALTER COLUMN origin SET DEFAULT 'webhook';
   -- As before, and the key with the row: an insert through the view is a duplicate if its key is taken
   -- (the primary key's error, as the old table gave), a delete forgets it.
   CREATE OR REPLACE FUNCTION deliveries_written() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
   BEGIN
     IF TG_OP = 'INSERT' THEN
       INSERT INTO delivery_keys (source, id, route, received_at) VALUES (NEW.source, NEW.id, NEW.route, NEW.received_at);
       INSERT INTO delivery_rows (source, id, body, body_sha256, content_type, event_type, provider_time, received_at, status, attempts, available_at, leased_until, lease_token, lease_ms, error, conflicts, finished_at, replays, purged_at, order_key, event_time, arrival, newer_id, route, destination, headers, traceparent, origin)
       VALUES (NEW.source, NEW.id, '\\x'::bytea, NEW.body_sha256, NEW.content_type, NEW.event_type, NEW.provider_time, NEW.received_at, NEW.status, NEW.attempts, NEW.available_at, NEW.leased_until, NEW.lease_token, NEW.lease_ms, NEW.error, NEW.conflicts, NEW.finished_at, NEW.replays, NEW.purged_at, NEW.order_key, NEW.event_time, NEW.arrival, NEW.newer_id, NEW.route, NEW.destination, NEW.headers, NEW.traceparent, NEW.origin);
     ELSIF TG_OP = 'UPDATE' THEN
       IF (NEW.source, NEW.id, NEW.route, NEW.received_at) IS DISTINCT FROM (OLD.source, OLD.id, OLD.route, OLD.received_at) THEN
         UPDATE delivery_keys SET (source, id, route, received_at) = (NEW.source, NEW.id, NEW.route, NEW.received_at)
          WHERE source = OLD.source AND id = OLD.id AND route = OLD.route;
       END IF;
       UPDATE delivery_rows SET (source, id, body_sha256, content_type, event_type, provider_time, received_at, status, attempts, available_at, leased_until, lease_token, lease_ms, error, conflicts, finished_at, replays, purged_at, order_key, event_time, arrival, newer_id, route, destination, headers, traceparent, origin)
         = (NEW.source, NEW.id, NEW.body_sha256, NEW.content_type, NEW.event_type, NEW.provider_time, NEW.received_at, NEW.status, NEW.attempts, NEW.available_at, NEW.leased_until, NEW.lease_token, NEW.lease_ms, NEW.error, NEW.conflicts, NEW.finished_at, NEW.replays, NEW.purged_at, NEW.order_key, NEW.event_time, NEW.arrival, NEW.newer_id, NEW.route, NEW.destination, NEW.headers, NEW.traceparent, NEW.origin)
        WHERE source = OLD.source AND id = OLD.id AND route = OLD.route AND received_at = OLD.received_at;
       IF NEW.body IS NOT DISTINCT FROM OLD.body AND (NEW.source, NEW.id, NEW.route) = (OLD.source, OLD.id, OLD.route) THEN
         RETURN NEW;
       END IF;
       DELETE FROM delivery_bodies WHERE source = OLD.source AND id = OLD.id AND route = OLD.route AND received_at = OLD.received_at;
       UPDATE delivery_rows SET body = '\\x'::bytea WHERE source = NEW.source AND id = NEW.id AND route = NEW.route AND received_at = NEW.received_at;
     ELSE
       DELETE FROM delivery_bodies WHERE source = OLD.source AND id = OLD.id AND route = OLD.route AND received_at = OLD.received_at;
       DELETE FROM delivery_rows WHERE source = OLD.source AND id = OLD.id AND route = OLD.route AND received_at = OLD.received_at;
       DELETE FROM delivery_keys WHERE source = OLD.source AND id = OLD.id AND route = OLD.route;
       RETURN OLD;
     END IF;
     IF octet_length(NEW.body) > 0 THEN
       INSERT INTO delivery_bodies (source, id, route, received_at, body) VALUES (NEW.source, NEW.id, NEW.route, NEW.received_at, NEW.body);
     END IF;
     RETURN NEW;
   END $$;
   CREATE TRIGGER deliveries_written INSTEAD OF INSERT OR UPDATE OR DELETE ON deliveries
     FOR EACH ROW EXECUTE FUNCTION deliveries_written();
   -- A row moved between partitions (a done mark, a replay, a retry) fires AFTER DELETE on the partition it
   -- left: that is no delivery forgotten, and its search document stays. The row is found again in the
   -- statement's own effects, which an AFTER trigger sees, by its key and day: two partitions probed at most.
   CREATE OR REPLACE FUNCTION inbox_search_forget() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
   BEGIN
     IF TG_OP = 'DELETE' AND EXISTS (SELECT 1 FROM delivery_rows WHERE source = OLD.source AND id = OLD.id AND route = OLD.route
                                        AND received_at = OLD.received_at) THEN
       RETURN NULL;
     END IF;
     DELETE FROM deliveries_search WHERE source = OLD.source AND id = OLD.id;
     IF TG_OP = 'UPDATE' AND NEW.purged_at IS NULL THEN
       INSERT INTO search_pending (source, id) VALUES (NEW.source, NEW.id);
     END IF;
     RETURN NULL;
   END $$;
   DO $$ BEGIN
     IF (SELECT enabled FROM search_state) THEN
       CREATE TRIGGER deliveries_search_insert AFTER INSERT ON delivery_rows
         REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION inbox_search_queue();
       CREATE TRIGGER deliveries_search_update AFTER UPDATE OF body ON delivery_rows
         FOR EACH ROW WHEN (NEW.route = 0) EXECUTE FUNCTION inbox_search_forget();
       CREATE TRIGGER deliveries_search_delete AFTER DELETE ON delivery_rows
         FOR EACH ROW WHEN (OLD.route = 0) EXECUTE FUNCTION inbox_search_forget();
     END IF;
   END $$;`,
  // The failed rows' index in the page's order, newest first (docs/performance.md#lists-at-ten-million): by time
  // alone, a source's failed page checked the source in each row, three heap pages read for each row it kept,
  // cold. With the source in the index it reads one a row. It takes the old one's place rather than joining it:
  // beside it, the planner took the old one still, as it prices a scan of an index of more than one column as
  // less in the heap's order. Declared on delivery_rows, it is made on every partition (the hot one holds no
  // failed row, and its writes never enter it) and on each day makePeriods() makes later. migrate() builds it on
  // each partition ahead of this, online (prepareFailedIndex), and the CREATE INDEX below attaches what it finds.
  `DROP INDEX delivery_rows_failed;
   CREATE INDEX delivery_rows_failed ON delivery_rows (received_at, source, id, route) WHERE status = 'failed';`,
  // A day released whole (docs/table.md#hot-and-cold): its done rows become tombstones by one row here, not by
  // a rewrite of the day. A row is its day's tombstone when it was done before the release (finished_at before
  // released_at, or unknown): one done since (replayed, or retried from failed, and done again) keeps its body,
  // which the release kept, and is found by the index of finished rows (finished_at at or after released_at). day
  // is the UTC day's start (periods.ts periodOf().from). The view reads such a row as a tombstone, its purged_at
  // the release's time and its body empty; the statements that read delivery_rows itself ask released_days as the
  // view does (periods.ts unreleased(), bodyKept()). The view's join to released_days is left
  // out of a plan that reads neither body nor purged_at (PostgreSQL removes a left join to a unique key).
  `CREATE TABLE released_days (
     day         bigint PRIMARY KEY,
     released_at bigint NOT NULL
   );
   CREATE OR REPLACE VIEW deliveries AS
     SELECT r.source, r.id,
            CASE WHEN rd.released_at IS NOT NULL THEN '\\x'::bytea
                 WHEN octet_length(r.body) > 0 OR r.purged_at IS NOT NULL THEN r.body ELSE
              coalesce((SELECT b.body FROM delivery_bodies b
                         WHERE b.source = r.source AND b.id = r.id AND b.route = r.route AND b.received_at = r.received_at),
                       r.body) END AS body,
            r.body_sha256, r.content_type, r.event_type,
            r.provider_time, r.received_at, r.status, r.attempts, r.available_at, r.leased_until,
            r.lease_token, r.lease_ms, r.error, r.conflicts, r.finished_at, r.replays,
            coalesce(r.purged_at, rd.released_at) AS purged_at, r.order_key, r.event_time, r.arrival, r.newer_id, r.route,
            r.destination, r.headers, r.traceparent, r.origin
       FROM delivery_rows r LEFT JOIN released_days rd
         ON rd.day = r.received_at - r.received_at % 86400000 AND r.status = 'done' AND r.purged_at IS NULL
            AND (r.finished_at IS NULL OR r.finished_at < rd.released_at);`,
  // A body search's matches by when they were received (docs/performance.md#the-newest-matches-first): each
  // search row holds its delivery's hour and day (inbox_search_periods(), whose spelling lib/search.ts's
  // searchPeriods() follows), beside its JSON and beside its words in their GIN indexes, so a search with many
  // matches asks for those of its newest hours or days and PostgreSQL intersects the two in the index, rechecking
  // only those rows. The trigger fills them from delivery_keys for every row indexed from now on, whichever
  // host's indexer copies it. The rows indexed before stay without (NULL, in no hour), and
  // search_state.dated_since is the time from which every row has them: a search walks hours and days back to it,
  // then asks for the rest as before. This one only adds the column: a moment's lock on deliveries_search. The
  // indexes that hold the periods are the next migration's, built ahead of it online (prepareDatedSearch).
  `ALTER TABLE deliveries_search ADD COLUMN periods text[];
   CREATE FUNCTION inbox_search_periods(at bigint) RETURNS text[] LANGUAGE sql IMMUTABLE AS
     $$ SELECT ARRAY['h' || (at / 3600000)::text, 'd' || (at / 86400000)::text] $$;
   CREATE FUNCTION inbox_search_dated() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
   BEGIN
     NEW.periods := (SELECT inbox_search_periods(received_at) FROM delivery_keys
                      WHERE source = NEW.source AND id = NEW.id AND route = 0);
     RETURN NEW;
   END $$;
   CREATE TRIGGER deliveries_search_dated BEFORE INSERT ON deliveries_search
     FOR EACH ROW EXECUTE FUNCTION inbox_search_dated();
   ALTER TABLE search_state ADD COLUMN dated_since bigint NOT NULL DEFAULT 0;
   UPDATE search_state SET dated_since = coalesce((SELECT max(received_at) + 1 FROM delivery_rows), 0)
    WHERE EXISTS (SELECT 1 FROM deliveries_search);`,
  // Both search indexes with the periods as their second column, in the place of those without. migrate() builds
  // each ahead, online, as deliveries_search_json_dated and deliveries_search_words_dated (prepareDatedSearch):
  // one of those, valid and of the form, takes the old one's name here, under a lock held for that rename alone.
  // Without it (behind a per-transaction pooler, or a near miss, which is dropped) the index is built here, as it
  // was, body searches and the indexer waiting meanwhile. An inbox that took the periods in one migration with
  // the column, as a session's main did, has them already and is left as it is.
  `DO $$ BEGIN
     IF pg_get_indexdef('deliveries_search_json'::regclass) NOT LIKE '%periods)' THEN
       DROP INDEX deliveries_search_json;
       IF EXISTS (SELECT 1 FROM pg_index WHERE indexrelid = to_regclass('deliveries_search_json_dated') AND indisvalid
                     AND pg_get_indexdef(indexrelid) LIKE '% USING gin (doc jsonb_path_ops, periods)') THEN
         ALTER INDEX deliveries_search_json_dated RENAME TO deliveries_search_json;
       ELSE
         DROP INDEX IF EXISTS deliveries_search_json_dated;
         CREATE INDEX deliveries_search_json ON deliveries_search USING gin (doc jsonb_path_ops, periods);
       END IF;
     END IF;
     IF pg_get_indexdef('deliveries_search_words'::regclass) NOT LIKE '%periods)' THEN
       DROP INDEX deliveries_search_words;
       IF EXISTS (SELECT 1 FROM pg_index WHERE indexrelid = to_regclass('deliveries_search_words_dated') AND indisvalid
                     AND pg_get_indexdef(indexrelid) LIKE
                       '% USING gin (jsonb_to_tsvector(''simple''::regconfig, doc, ''["string", "numeric", "boolean"]''::jsonb), periods)') THEN
         ALTER INDEX deliveries_search_words_dated RENAME TO deliveries_search_words;
       ELSE
         DROP INDEX IF EXISTS deliveries_search_words_dated;
         CREATE INDEX deliveries_search_words ON deliveries_search USING gin
           (jsonb_to_tsvector('simple'::regconfig, doc, '["string", "numeric", "boolean"]'::jsonb), periods);
       END IF;
     END IF;
   END $$;`,
];

// postgres/migrate.ts: migrate(), which brings a PostgreSQL inbox's schema up to MIGRATIONS (lib/postgres/schema.ts)
// under an advisory lock, so that ten hosts starting at once migrate once, and what it does online ahead of the
// migrations that would otherwise hold a table for minutes: the split's keys copied (prepareKeys), the failed
// rows' index and the search indexes with periods built (prepareFailedIndex, prepareDatedSearch;
// docs/table.md#built-ahead). Not run on its own.

import type pg from "pg";
import { DEFAULTS } from "../defaults.ts";
import { givingWay } from "./periods.ts";
import type { Pool } from "./pool.ts";
import { KEYS_TABLE, MIGRATIONS } from "./schema.ts";

// The split of delivery_rows into a hot queue and a history, whose keys' copy prepareKeys runs ahead of it.
const SPLIT = MIGRATIONS.findIndex((m) => m.startsWith("ALTER TABLE delivery_rows RENAME TO delivery_rows_before"));

/** KeysAhead is how prepareKeys copies; a test's hooks besides the batch. */
export interface KeysAhead {
  /** Keys copied per transaction. @default DEFAULTS.keysCopyBatch */
  batch?: number;
  /** Runs inside each batch's transaction, after its copy and before its commit: a test's store or crash. */
  during?: (batch: number) => Promise<void>;
  /** Runs before each batch's transaction begins: a test's race with the copy's snapshot. */
  before?: (batch: number) => Promise<void>;
  /** Begins a transaction on the session: the pool's begin() behind a per-transaction pooler. @default BEGIN */
  begin?: () => Promise<unknown>;
  /** Takes a session-level advisory lock so that two hosts do not both copy; not behind a per-transaction pooler. @default true */
  alone?: boolean;
}

/**
 * prepareKeys copies the keys of delivery_rows into delivery_keys ahead of the split (docs/table.md#the-upgrade),
 * online, when the schema is at the version just before it and only then, so that the split's transaction, which
 * holds the table's lock, has no copy left to do. It returns how many rows its batches read (0 when there was
 * nothing to do).
 * Each step is a transaction of its own under the migrations' advisory lock (a migration never runs halfway
 * through one) that finds the schema still before the split; a step cut short leaves what the next open resumes,
 * and the split drops a copy it finds unfinished and copies as it always did.
 */
export async function prepareKeys(session: pg.ClientBase, schema: string, ahead: KeysAhead = {}): Promise<number> {
  const { batch = DEFAULTS.keysCopyBatch, begin = () => session.query("BEGIN"), alone = true } = ahead;
  // Whether there is a copy to make: the schema just before the split, and no whole copy made.
  const due = async () => {
    const copied = await session.query("SELECT to_regclass('delivery_keys_copied') IS NOT NULL AS copied");
    return !copied.rows[0].copied && (await versionOf(session)) === SPLIT;
  };
  // Read once without a lock first: a schema not just before the split (or already copied) stops here.
  await begin();
  const now = await due().finally(() => session.query("ROLLBACK"));
  if (!now) return 0;
  // A step runs only while the schema is still just before the split: another host may have split it meanwhile.
  const step = async <T>(run: () => Promise<T>): Promise<T | undefined> => {
    await begin();
    try {
      await session.query("SELECT pg_advisory_xact_lock(hashtext($1))", [`webhook-inbox:${schema}`]);
      if (!(await due())) {
        await session.query("ROLLBACK");
        return undefined;
      }
      const result = await run();
      const { command } = await session.query("COMMIT");
      if (command !== "COMMIT") throw new Error(`the server answered ${command} to COMMIT`);
      return result;
    } catch (error) {
      await session.query("ROLLBACK").catch(() => {});
      throw error;
    }
  };
  if (alone) await session.query("SELECT pg_advisory_lock(hashtext($1))", [`webhook-inbox:keys:${schema}`]);
  try {
    // The table as the split makes it, its primary key made first (each key then checked as it comes), and
    // the old table's writers mirrored into it from now on, old code's too (a rolling upgrade). A deleted row
    // leaves a mark, its key with received_at -1 (no delivery is received before 1970), not nothing: a batch
    // whose snapshot still saw the row would otherwise copy its key back after the delete, a duplicate of a
    // delivery that is gone; the mark makes that copy a conflict, and a new store of the key overwrites it.
    // CREATE TRIGGER waits for the table's writers in flight, and stores queue behind it: it gives way, and tries
    // again.
    await givingWay(
      (work) => step(() => work(session as pg.PoolClient)),
      async (_client, bounded) => {
        if ((await session.query("SELECT to_regclass('delivery_keys') IS NOT NULL AS made")).rows[0].made) return;
        await session.query(`
          ${KEYS_TABLE};
          ALTER TABLE delivery_keys ADD PRIMARY KEY (source, id, route);
          CREATE INDEX delivery_keys_gone ON delivery_keys (source) WHERE received_at = -1;
          CREATE FUNCTION delivery_keys_ahead() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
          BEGIN
            IF TG_OP = 'INSERT' THEN
              INSERT INTO delivery_keys (source, id, route, received_at) SELECT source, id, route, received_at FROM added
                ON CONFLICT (source, id, route) DO UPDATE SET received_at = excluded.received_at;
            ELSIF TG_OP = 'DELETE' THEN
              INSERT INTO delivery_keys (source, id, route, received_at) SELECT source, id, route, -1 FROM gone
                ON CONFLICT (source, id, route) DO UPDATE SET received_at = -1;
            ELSE
              IF (NEW.source, NEW.id, NEW.route) IS DISTINCT FROM (OLD.source, OLD.id, OLD.route) THEN
                INSERT INTO delivery_keys (source, id, route, received_at) VALUES (OLD.source, OLD.id, OLD.route, -1)
                  ON CONFLICT (source, id, route) DO UPDATE SET received_at = -1;
              END IF;
              INSERT INTO delivery_keys (source, id, route, received_at) VALUES (NEW.source, NEW.id, NEW.route, NEW.received_at)
                ON CONFLICT (source, id, route) DO UPDATE SET received_at = excluded.received_at;
            END IF;
            RETURN NULL;
          END $$;`);
        // A statement's triggers for stores and deletes (a group commit is one INSERT, a purge's batch one
        // DELETE); a row's for the rare update of a key, which a claim or a done mark never is.
        await bounded(`
          CREATE TRIGGER delivery_keys_ahead_insert AFTER INSERT ON delivery_rows
            REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION delivery_keys_ahead()`);
        await session.query(`
          CREATE TRIGGER delivery_keys_ahead_delete AFTER DELETE ON delivery_rows
            REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION delivery_keys_ahead();
          CREATE TRIGGER delivery_keys_ahead_update AFTER UPDATE ON delivery_rows FOR EACH ROW
            WHEN ((NEW.source, NEW.id, NEW.route, NEW.received_at) IS DISTINCT FROM (OLD.source, OLD.id, OLD.route, OLD.received_at))
            EXECUTE FUNCTION delivery_keys_ahead();`);
      },
      // As long as it takes, a rest between tries: the split without the copy ahead would wait as long, and the
      // stores with it.
      { tries: Number.POSITIVE_INFINITY },
    );
    // The keys in the old table's key order, a batch a transaction, from the start again after a crash: a key
    // already there, copied or stored since, is left as it is, and so is a deleted row's mark.
    let after: { source: string; id: string; route: number } | undefined;
    let copied = 0;
    for (let n = 1; ; n++) {
      await ahead.before?.(n);
      const seen = await step(async () => {
        const { rows } = await session.query(
          `WITH batch AS (
             SELECT source, id, route, received_at FROM delivery_rows
              ${after ? "WHERE (source, id, route) > ($2, $3, $4)" : ""}
              ORDER BY source, id, route LIMIT $1),
           copied AS (
             INSERT INTO delivery_keys (source, id, route, received_at) SELECT * FROM batch
               ON CONFLICT (source, id, route) DO NOTHING)
           SELECT source, id, route, (SELECT count(*) FROM batch)::integer AS n
             FROM batch ORDER BY source DESC, id DESC, route DESC LIMIT 1`,
          after ? [batch, after.source, after.id, after.route] : [batch],
        );
        await ahead.during?.(n);
        return rows[0] as { source: string; id: string; route: number; n: number } | undefined;
      });
      if (seen === undefined) break;
      copied += seen.n;
      after = seen;
      if (seen.n < batch) break;
    }
    // Copied whole: the split may skip its copy. Its own transaction, as a step: a crash before it is a copy
    // that the next open runs again.
    await step(async () => {
      await session.query("CREATE TABLE delivery_keys_copied (keys bigint NOT NULL)");
      await session.query("INSERT INTO delivery_keys_copied (keys) VALUES ($1)", [copied]);
    });
    return copied;
  } finally {
    if (alone) await session.query("SELECT pg_advisory_unlock(hashtext($1))", [`webhook-inbox:keys:${schema}`]);
  }
}

// The migration that makes delivery_rows_failed again in the page's order, whose build prepareFailedIndex runs ahead.
const FAILED = MIGRATIONS.findIndex((m) => m.startsWith("DROP INDEX delivery_rows_failed;"));
// Its index on a partition as pg_get_indexdef() gives it, after the name and the table: an index of this form, valid,
// is one the migration's CREATE INDEX on delivery_rows attaches as it is rather than builds again.
const FAILED_FORM = "USING btree (received_at, source, id, route) WHERE (status = 'failed'::text)";

/** IndexAhead is a test's hook into prepareFailedIndex. */
export interface IndexAhead {
  /** Runs before each build, with its partition's name (or its index's, for the search's): a test's race with it. */
  before?: (partition: string) => Promise<void>;
}

/**
 * prepareFailedIndex builds the failed rows' index in the page's order on each partition of delivery_rows ahead
 * of the migration that declares it (docs/table.md#built-ahead), online, when the schema is at the
 * version just before that migration and only then, so that the migration, which holds delivery_rows' lock,
 * finds it built and attaches it. It returns how many partitions it built it on (0 when there was nothing to do).
 * Each is a CREATE INDEX CONCURRENTLY, outside any transaction: it lets stores, claims and done marks through, and
 * waits for every transaction older than it in the database, as long as it takes. An index a build cut short left
 * INVALID (the host died, or the build failed) is dropped and built again: attached as it is, it would leave the
 * migration's index invalid.
 */
export async function prepareFailedIndex(
  session: pg.ClientBase,
  schema: string,
  ahead: IndexAhead = {},
): Promise<number> {
  // Whether there is an index to build: the schema just before the migration. Every host that runs migrate() calls
  // this first, so under the session's lock below it stays so, but for a host behind a per-transaction pooler, which
  // builds nothing ahead and may migrate meanwhile: each partition asks again.
  const due = async () => (await versionOf(session)) === FAILED;
  if (!(await due())) return 0;
  // A second host waits here for the first, then finds each partition built.
  return builtAhead(session, `webhook-inbox:failed:${schema}`, async () => {
    // The leaves as they are now; a day made later is small, and the migration builds its index.
    const { rows: leaves } = await session.query(
      "SELECT relid::regclass::text AS name FROM pg_partition_tree(to_regclass('delivery_rows')) WHERE isleaf ORDER BY relid",
    );
    let built = 0;
    for (const { name } of leaves as { name: string }[]) {
      await ahead.before?.(name);
      if (!(await due())) break;
      // The server quotes the names (regclass's text): DDL takes no bound parameters.
      const { rows } = await session.query(
        `SELECT i.indexrelid::regclass::text AS name, i.indisvalid AS valid FROM pg_index i
            WHERE i.indrelid = to_regclass($1)
              AND regexp_replace(pg_get_indexdef(i.indexrelid), '^CREATE INDEX \\S+ ON \\S+ ', '') = $2`,
        [name, FAILED_FORM],
      );
      const found = rows as { name: string; valid: boolean }[];
      if (found.some((index) => index.valid)) continue;
      for (const left of found) await session.query(`DROP INDEX CONCURRENTLY ${left.name}`);
      // Unnamed, as the migration's CREATE INDEX names what it builds on a partition: the same name either way.
      await session.query(
        `CREATE INDEX CONCURRENTLY ON ${name} (received_at, source, id, route) WHERE status = 'failed'`,
      );
      built++;
    }
    return built;
  });
}

// The migration that gives both search indexes the periods, whose builds prepareDatedSearch runs ahead.
const DATED = MIGRATIONS.findIndex((m) => m.includes("deliveries_search_json_dated"));
// Each search index with the periods, as pg_get_indexdef() gives it after the name and the table; the migration
// checks the same forms. Built ahead under its name with _dated after it.
const DATED_FORMS = [
  ["deliveries_search_json", "USING gin (doc jsonb_path_ops, periods)"],
  [
    "deliveries_search_words",
    `USING gin (jsonb_to_tsvector('simple'::regconfig, doc, '["string", "numeric", "boolean"]'::jsonb), periods)`,
  ],
] as const;
const INDEX_FORM = "regexp_replace(pg_get_indexdef(i.indexrelid), '^CREATE INDEX \\S+ ON \\S+ ', '')";

/**
 * prepareDatedSearch builds both body search indexes with the periods (docs/table.md#built-ahead) ahead of the
 * migration that takes them, online, when the schema is at the version just before it and only then: each a
 * CREATE INDEX CONCURRENTLY deliveries_search_json_dated (and _words_dated) outside any transaction, which body
 * searches, the indexer and a purge's deletes go through, waiting for every transaction older than it as
 * prepareFailedIndex's builds do; the migration then renames each in the old one's place. It returns how many it
 * built. One left INVALID by a build cut short is dropped and built again, and an index that has the periods
 * already (an inbox that took them in one migration) is not built beside.
 */
export async function prepareDatedSearch(
  session: pg.ClientBase,
  schema: string,
  ahead: IndexAhead = {},
): Promise<number> {
  const due = async () => (await versionOf(session)) === DATED;
  if (!(await due())) return 0;
  // A second host waits here for the first, then finds both built.
  return builtAhead(session, `webhook-inbox:dated:${schema}`, async () => {
    let built = 0;
    for (const [name, form] of DATED_FORMS) {
      await ahead.before?.(name);
      if (!(await due())) break;
      const { rows } = await session.query(
        `SELECT i.indexrelid::regclass::text AS name, i.indisvalid AS valid, ${INDEX_FORM} = $3 AS formed,
                c.relname = $1 AS old FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
          WHERE i.indrelid = to_regclass('deliveries_search') AND c.relname IN ($1, $2)`,
        [name, `${name}_dated`, form],
      );
      const found = rows as { name: string; valid: boolean; formed: boolean; old: boolean }[];
      if (found.some((index) => index.formed && index.valid)) continue;
      for (const left of found.filter((index) => !index.old))
        await session.query(`DROP INDEX CONCURRENTLY ${left.name}`);
      await session.query(`CREATE INDEX CONCURRENTLY ${name}_dated ON deliveries_search ${form}`);
      built++;
    }
    return built;
  });
}

/**
 * builtAhead runs build on session under the session-level advisory lock named lock, with no bound on a statement
 * or a lock wait and on one core, and undoes both after. A second host rests DEFAULTS.indexAheadRestMs and asks for
 * the lock again rather than wait in pg_advisory_lock(): a statement waiting there is a transaction that the first's
 * build waits for in turn. No bound on a wait, as a build waits for transactions, not for a lock that stores queue
 * behind, and the migration without it would wait for the same ones with the table locked. On one core: the other
 * is the acks'. A session that failed is dropped by its caller: its settings and lock go with it.
 */
async function builtAhead(session: pg.ClientBase, lock: string, build: () => Promise<number>): Promise<number> {
  while (!(await session.query("SELECT pg_try_advisory_lock(hashtext($1)) AS had", [lock])).rows[0].had)
    await new Promise((resolve) => setTimeout(resolve, DEFAULTS.indexAheadRestMs));
  let ended = false;
  try {
    await session.query("SET lock_timeout = 0; SET statement_timeout = 0; SET max_parallel_maintenance_workers = 0");
    const built = await build();
    ended = true;
    return built;
  } finally {
    const undo = async () => {
      await session.query("RESET lock_timeout; RESET statement_timeout; RESET max_parallel_maintenance_workers");
      await session.query("SELECT pg_advisory_unlock(hashtext($1))", [lock]);
    };
    await (ended ? undo() : undo().catch(() => {}));
  }
}

/**
 * migrate brings the schema up to date under an advisory lock, with what can be done online first, each on a
 * connection of its own: the split's keys copied ahead of it (prepareKeys), and the failed rows' index built
 * ahead of the migration that declares it (prepareFailedIndex). An inbox before either is first brought to just
 * before it in a transaction of its own; a new schema (version 0) has nothing to copy or build and is made in one
 * transaction.
 */
export async function migrate(pool: Pool, schema: string): Promise<void> {
  let at = await versionOf(pool);
  // Only an inbox from before the split has keys to copy ahead: every other open (nearly all) takes no
  // connection for it. prepareKeys checks the version again under the migrations' lock.
  if (at > 0 && at <= SPLIT) {
    if (at < SPLIT) await migrateTo(pool, schema, SPLIT);
    await onSession(pool, "copy delivery_keys ahead", (session) =>
      prepareKeys(session, schema, { begin: () => pool.begin(session), alone: !pool.pooled }),
    );
    at = SPLIT;
  }
  // Not behind a per-transaction pooler, which lends a session's lock to whoever comes next: there the
  // migration builds the index under its lock, as it did.
  if (at > 0 && at <= FAILED && !pool.pooled) {
    if (at < FAILED) await migrateTo(pool, schema, FAILED);
    await onSession(pool, "build delivery_rows_failed ahead", (session) => prepareFailedIndex(session, schema));
    at = FAILED;
  }
  // The same for the search indexes with the periods.
  if (at > 0 && at <= DATED && !pool.pooled) {
    if (at < DATED) await migrateTo(pool, schema, DATED);
    await onSession(pool, "build the search indexes with periods ahead", (session) =>
      prepareDatedSearch(session, schema),
    );
  }
  await migrateTo(pool, schema, MIGRATIONS.length);
}

// onSession runs run on a connection of the pool's own, released when it returns and dropped when it throws (with
// whatever session state it left), the error saying what was being done.
async function onSession(pool: Pool, what: string, run: (session: pg.PoolClient) => Promise<unknown>): Promise<void> {
  const session = await pool.connect();
  try {
    await run(session);
    session.release();
  } catch (error) {
    session.release(error instanceof Error ? error : new Error(String(error)));
    throw new Error(`${what}: ${error instanceof Error ? error.message : String(error)}`, { cause: error });
  }
}

// versionOf reads the schema's version without a lock (0 where nothing was made yet), through the pool or on a
// session: migrateTo reads it again under its lock, and the steps ahead under theirs.
async function versionOf(db: Pick<Pool | pg.ClientBase, "query">): Promise<number> {
  // Two statements: a name that does not exist fails a statement as it is parsed, whatever CASE guards it.
  const made = await db.query("SELECT to_regclass('inbox_migrations') IS NOT NULL AS made");
  if (!made.rows[0].made) return 0;
  const { rows } = await db.query("SELECT coalesce(max(version), 0) AS version FROM inbox_migrations");
  return Number(rows[0].version);
}

/** migrateTo applies the migrations due before the version until, in one transaction, under an advisory lock. */
async function migrateTo(pool: Pool, schema: string, until: number): Promise<void> {
  const client = await pool.transaction();
  try {
    await client.query("SELECT pg_advisory_xact_lock(hashtext($1))", [`webhook-inbox:${schema}`]);
    await client.query(`CREATE SCHEMA IF NOT EXISTS ${schema}`);
    await client.query(`CREATE TABLE IF NOT EXISTS inbox_migrations (
                          version    integer PRIMARY KEY,
                          applied_at timestamptz NOT NULL DEFAULT now())`);
    const { rows } = await client.query("SELECT coalesce(max(version), 0) AS version FROM inbox_migrations");
    const version = Number(rows[0].version);
    if (version > MIGRATIONS.length) {
      throw new Error(`schema version ${version} is newer than this code knows (${MIGRATIONS.length})`);
    }
    for (let next = version; next < until; next++) {
      // The view first, then its tables, in the order a write through the view takes them: the split renames the
      // table and then drops the view, and a write through the view that came between held the one and waited for
      // the other (a deadlock, which PostgreSQL may end by failing the split).
      if (next === SPLIT) await client.query("LOCK TABLE deliveries IN ACCESS EXCLUSIVE MODE");
      await client.query(MIGRATIONS[next]!);
      await client.query("INSERT INTO inbox_migrations (version) VALUES ($1)", [next + 1]);
    }
    await pool.commit(client);
  } catch (error) {
    await client.query("ROLLBACK").catch(() => {});
    throw error;
  } finally {
    client.release();
  }
}

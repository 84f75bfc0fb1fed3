// postgres/periods.ts: the days of delivery_bodies (docs/table.md#bodies-apart), a partition each, and of
// delivery_history beside them (docs/table.md#hot-and-cold), whose done rows a purge makes tombstones by one row in
// released_days (releaseDay, unreleased()): made ahead
// (makePeriods, at open and at every purge) so that a day's bodies land in a table of their own, and
// released whole (releasePeriod, then dropDetached) once a purge's cutoff has passed the day's end: one DROP
// gives its bytes back to the file system, with no dead rows for vacuum; the history's days are listed
// (historyBefore) for forget to release whole (PostgresBulk's forgetDay). Each of those waits for a lock on a
// parent as givingWay() does, which a purge's batches share. PostgresInbox and PostgresBulk call them. Not run on its own.

import type pg from "pg";
import { DEFAULTS } from "../defaults.ts";
import { paced } from "../timing.ts";
import type { Pool } from "./pool.ts";

const DAY = 86_400_000;

/** Period is one day of bodies: its partition's name and its bounds, in ms since the epoch (from inclusive). */
export interface Period {
  name: string;
  from: number;
  until: number;
}

/** periodOf names the day that holds the time at, as UTC: delivery_bodies_d20261206. */
export function periodOf(at: number): Period {
  if (!Number.isSafeInteger(at)) throw new TypeError(`periodOf: expected a time in ms, got ${at}`);
  const from = Math.floor(at / DAY) * DAY;
  const day = new Date(from).toISOString().slice(0, 10).replaceAll("-", "");
  return { name: `delivery_bodies_d${day}`, from, until: from + DAY };
}

/** historyOf names a day's partition of delivery_history, the state rows of that day that are done or failed. */
export function historyOf(period: Period): string {
  return period.name.replace(/^delivery_bodies_/, "delivery_history_");
}

/**
 * makePeriods makes the partitions of the day of now and of the ahead days after it, where they are missing:
 * the day's bodies' and, beside it, the day's history's (docs/table.md#hot-and-cold), each with its unique key
 * (a partitioned table cannot have one of its own) and its index of what is not done (not on the hot partition). A day whose rows already went to a default partition
 * (nobody made it ahead) is left there, to be purged row by row: PostgreSQL refuses a partition that rows of
 * the default one belong to. A day of history before the upgrade to partitions is the old table's.
 */
export async function makePeriods(pool: Pool, now: number, ahead: number, lockMs: number): Promise<void> {
  for (let day = 0; day <= ahead; day++) {
    const period = periodOf(now + day * DAY);
    const history = historyOf(period);
    // A day already made is not made again: CREATE TABLE IF NOT EXISTS … PARTITION OF takes its parent's lock
    // before it finds the table there, so each open and purge queued two locks a day that every store or done
    // mark in flight made wait, and that waited for them, for nothing.
    const { rows } = await pool.query(
      "SELECT to_regclass($1) IS NOT NULL AS bodies, to_regclass($2) IS NOT NULL AS history",
      [period.name, history],
    );
    const made = rows[0] as { bodies: boolean; history: boolean };
    // DDL takes no bound parameters: the names and bounds are made here from a checked integer, never from input.
    if (!made.bodies)
      await makeOne(pool, lockMs, [
        `CREATE TABLE IF NOT EXISTS ${period.name} PARTITION OF delivery_bodies FOR VALUES FROM (${period.from}) TO (${period.until})`,
      ]);
    if (made.history) continue;
    await makeOne(pool, lockMs, [
      `CREATE TABLE IF NOT EXISTS ${history} PARTITION OF delivery_history FOR VALUES FROM (${period.from}) TO (${period.until})`,
      `CREATE UNIQUE INDEX IF NOT EXISTS ${history}_key ON ${history} (source, id, route)`,
      `CREATE INDEX IF NOT EXISTS ${history}_open ON ${history} (status, received_at, source, destination) WHERE status <> 'done'`,
    ]);
  }
}

// makeOne runs one partition's DDL in a transaction that gives way, once, as a release does: making a partition
// locks its parent whole, and a CREATE queued behind a transaction in flight would hold up every store (or done
// mark) queued behind it. A day not made now is made by a later purge or open: it is made days ahead.
async function makeOne(pool: Pool, lockMs: number, statements: string[]): Promise<void> {
  try {
    await givingWay(
      (run) => ownTransaction(pool, run),
      async (_client, bounded) => {
        for (const sql of statements) await bounded(sql);
      },
      { lockMs, tries: 1 },
    );
  } catch (error) {
    // 55P03: the lock was not had in time; 23514: the default partition holds rows of that day; 42P07 or
    // 23505: another process made it first; 42P17: the day is the old table's, from before the upgrade.
    if (!["55P03", "23514", "42P07", "23505", "42P17"].includes((error as { code?: string }).code ?? "")) throw error;
  }
}

/**
 * Transaction runs run in a transaction, committed when run returns and rolled back when it throws: a
 * connection of the pool's own (ownTransaction) or an op of the inbox's commit queue (PostgresCommitter's other()).
 */
export type Transaction<T> = (run: (client: pg.PoolClient) => Promise<T>) => Promise<T>;

/** Bounded runs one statement of a give-way transaction, waiting for its locks lockMs at most (givingWay). */
export type Bounded = (sql: string, values?: unknown[]) => Promise<pg.QueryResult>;

/** GiveWay is how a give-way transaction waits for its locks and how often it tries again (givingWay). */
export interface GiveWay {
  /** How long a statement run through Bounded waits for a lock before its try gives way. @default DEFAULTS.periodLockMs */
  lockMs?: number;
  /** How many tries in all, the first one included, before the last one's lock timeout is thrown. @default DEFAULTS.periodLockTries */
  tries?: number;
  /** How long it rests between two tries. @default DEFAULTS.periodLockMs */
  restMs?: number;
}

/**
 * givingWay runs work in a transaction (one that transaction opens, commits when work returns and rolls back
 * when it throws) whose Bounded statements wait lockMs at most for a lock: a lock queued behind a transaction
 * in flight would hold up every store or done mark queued behind it, so a try that cannot have its lock in time
 * (lock_timeout's error, 55P03) is rolled back, and tried again after a rest, tries times in all. It returns
 * what work returned; the last try's 55P03, or any other error at once, is thrown (gaveWay() tells the first).
 */
export async function givingWay<T>(
  transaction: Transaction<T>,
  work: (client: pg.PoolClient, bounded: Bounded) => Promise<T>,
  way: GiveWay = {},
): Promise<T> {
  // Read at each call, not at import: DEFAULTS are the one place for them, and a test may set them.
  const { lockMs = DEFAULTS.periodLockMs, tries = DEFAULTS.periodLockTries, restMs = DEFAULTS.periodLockMs } = way;
  for (let n = 1; ; n++) {
    try {
      return await transaction(async (client) => {
        // A purge is background work: one backend, never a gather's workers too, which took both of a small
        // machine's cores from the acks while a day's bodies were summed (docs/operations.md#a-day-released-by-one-row).
        await client.query("SELECT set_config('max_parallel_workers_per_gather', '0', true)");
        return work(client, async (sql, values) => {
          // Set for this statement alone: the rest of the transaction waits as long as any other.
          await client.query("SELECT set_config('lock_timeout', $1, true)", [`${lockMs}ms`]);
          const result = await client.query(sql, values);
          await client.query("SELECT set_config('lock_timeout', '0', true)");
          return result;
        });
      });
    } catch (error) {
      if (!gaveWay(error) || n >= tries) throw error;
    }
    await new Promise((resolve) => setTimeout(resolve, restMs));
  }
}

/** gaveWay says an error is a give-way transaction's lock not had in time (55P03, lock_timeout's). */
export function gaveWay(error: unknown): boolean {
  return (error as { code?: unknown }).code === "55P03";
}

/**
 * ownTransaction runs run in a transaction of its own on the pool: committed when keep says so of what run
 * returned (by default always), rolled back when it says not or when run throws.
 */
export async function ownTransaction<T>(
  pool: Pool,
  run: (client: pg.PoolClient) => Promise<T>,
  keep: (result: T) => boolean = () => true,
): Promise<T> {
  const client = await pool.transaction();
  try {
    const result = await run(client);
    if (keep(result)) await pool.commit(client);
    else await client.query("ROLLBACK");
    return result;
  } catch (error) {
    await client.query("ROLLBACK").catch(() => {});
    throw error;
  } finally {
    client.release();
  }
}

/** periodsMade names the day partitions delivery_bodies has now, oldest first. */
export async function periodsMade(pool: Pool): Promise<string[]> {
  const { rows } = await pool.query(
    `SELECT c.relname AS name FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
      WHERE i.inhparent = to_regclass('delivery_bodies') AND c.relname LIKE 'delivery\\_bodies\\_d%' ORDER BY c.relname`,
  );
  return (rows as { name: string }[]).map((r) => r.name);
}

/** periodsBefore lists the day partitions that end at or before the time before, oldest first. */
export async function periodsBefore(pool: Pool, before: number): Promise<Period[]> {
  const periods: Period[] = [];
  for (const name of await periodsMade(pool)) {
    const day = /^delivery_bodies_d(\d{4})(\d{2})(\d{2})$/.exec(name);
    if (!day) continue;
    const from = Date.UTC(Number(day[1]), Number(day[2]) - 1, Number(day[3]));
    if (from + DAY <= before) periods.push({ name, from, until: from + DAY });
  }
  return periods;
}

/**
 * releasePeriod detaches a day's partition in a transaction that transaction gives it (dropDetached drops it after), after moving the bodies purge must
 * keep (a row not made a tombstone: failed, still to do, or done since its day was marked) to the default
 * partition. It returns how many bodies it kept and the bytes of those it let go. The DETACH locks
 * delivery_bodies for the transaction's few statements: stores wait for it, not for a purge of the day row by
 * row; it gives way (givingWay) to a transaction in flight, and throws 55P03 when every try did.
 */
export function releasePeriod(
  transaction: Transaction<Released>,
  period: Period,
  releasedAt?: number,
  rest: number = DEFAULTS.purgeRest,
): Promise<Released> {
  return givingWay(transaction, (client, bounded) => releaseIn(client, bounded, period, releasedAt, rest));
}

/** Released is what a day's release kept of its bodies, and the bytes of those it let go. */
export interface Released {
  kept: number;
  bytes: number;
}

// releaseIn is one try of releasePeriod, in the transaction of client.
async function releaseIn(
  client: pg.PoolClient,
  bounded: Bounded,
  period: Period,
  releasedAt: number | undefined,
  rest: number,
): Promise<Released> {
  // The bodies to keep are found before the DETACH, under a lock that stops writes to this day alone (an
  // import or a restore of old deliveries), so the DETACH's lock on every day, which stores wait behind,
  // is held for a copy of those few bodies, not for a scan of the whole day: that scan under the
  // lock was the acks' worst window while a day was released (docs/operations.md#retention-by-period).
  await bounded(`LOCK TABLE ${period.name} IN SHARE MODE`);
  // The rows that keep their bodies are found by the partial indexes of the rows with work left
  // (deliveries_open) and of the done ones not yet tombstones (deliveries_kept), each bounded by the day: a
  // few rows, where a join from the partition probed delivery_rows once for each of the day's bodies. Of a day
  // released (releaseDay), whose every done row is in deliveries_kept still, the done ones kept are those done
  // since its release, which the day's index of finished rows finds (releasedAt: its complement, unreleased()).
  const doneKept = releasedAt === undefined ? unreleased() : "finished_at >= $3::bigint";
  await client.query(
    `CREATE TEMP TABLE kept_bodies ON COMMIT DROP AS
     SELECT b.source, b.id, b.route, b.received_at, b.body FROM ${period.name} b
      WHERE (b.source, b.id, b.route, b.received_at) IN (
        SELECT source, id, route, received_at FROM delivery_rows
         WHERE status IN ('received', 'processing', 'failed') AND purged_at IS NULL AND received_at >= $1 AND received_at < $2
        UNION ALL
        SELECT source, id, route, received_at FROM delivery_rows
         WHERE status = 'done' AND purged_at IS NULL AND received_at >= $1 AND received_at < $2 AND ${doneKept})`,
    releasedAt === undefined ? [period.from, period.until] : [period.from, period.until, releasedAt],
  );
  // The bytes a purge reports are the bodies' own, as when it deletes them one by one; the day's tombstones
  // were marked without reading them.
  const all = await inSteps(
    client,
    period.name,
    (range) => `SELECT coalesce(sum(octet_length(body)), 0)::bigint AS bytes FROM ${period.name} WHERE ${range}`,
    [],
    rest,
  );
  const { rows } = await client.query("SELECT coalesce(sum(octet_length(body)), 0)::bigint AS bytes FROM kept_bodies");
  await bounded(`ALTER TABLE delivery_bodies DETACH PARTITION ${period.name}`);
  const kept = await client.query(
    "INSERT INTO delivery_bodies (source, id, route, received_at, body) SELECT source, id, route, received_at, body FROM kept_bodies",
  );
  return { kept: kept.rowCount ?? 0, bytes: all.bytes! - Number(rows[0].bytes) };
}

/**
 * unreleased is the condition, in SQL, that a row (of delivery_rows, qualified by row as "d." or not at all) is
 * not its day's tombstone by a release (releaseDay): its day was not released, or it was done since. Beside
 * `status = 'done' AND purged_at IS NULL` it says what the view's purged_at says, for the statements that read
 * delivery_rows itself; a partial index cannot say it (its predicate cannot read another table).
 */
export function unreleased(row = ""): string {
  if (!/^([a-z]\.)?$/.test(row)) throw new TypeError(`unreleased: expected a table's alias and a dot, got ${row}`);
  return `NOT EXISTS (SELECT 1 FROM released_days rd WHERE rd.day = ${row}received_at - ${row}received_at % ${DAY}
                        AND (${row}finished_at IS NULL OR ${row}finished_at < rd.released_at))`;
}

/**
 * bodyKept is the condition, in SQL, that a row (qualified by row as in unreleased()) still has its body as the
 * view reads it: not a tombstone by its own purged_at, nor, when done, by its day's release.
 */
export function bodyKept(row = ""): string {
  return `${row}purged_at IS NULL AND (${row}status <> 'done' OR ${unreleased(row)})`;
}

/** Tombstoned is what a day's release made tombstones: its done rows, and the bytes of the bodies they held in their rows. */
export interface Tombstoned {
  n: number;
  bytes: number;
}

/**
 * releaseDay makes every done row of a day's history a tombstone without writing it: one row in released_days
 * (the day, and at as its release's time) says that each done row of the day finished before at is a tombstone,
 * as the view and every statement that reads delivery_rows itself read it (unreleased()); the day's partition is
 * neither copied nor updated, where writing it anew took 10 s of a core and its gigabytes of WAL at a million rows
 * (docs/operations.md#retention-by-period). Only a row that holds its body in itself (at most
 * DEFAULTS.inlineBodyBytes) is written, its body emptied and purged_at set, so that no body outlives its
 * retention in a row; and the day's search documents are deleted. It runs in a transaction that transaction
 * gives it, under a lock on the day's partition alone that a write into that day (a late done mark, a replay of
 * one of its rows) waits for: a replay that waited reads the release once it goes on, as a statement's snapshot is
 * taken after its locks. written runs in the same transaction with the count (the audit). It returns undefined,
 * with nothing done, when the day has no partition of its own in delivery_history (its rows went to the default
 * partition, or are the old table's from before the upgrade), when a writer holds one of its rows, or when the
 * day was released before (the rows done since are made tombstones in batches): those are marked row by row.
 */
export function releaseDay(
  transaction: Transaction<Tombstoned | undefined>,
  period: Period,
  at: number,
  written: (client: pg.PoolClient, n: number) => Promise<void>,
  rest: number = DEFAULTS.purgeRest,
): Promise<Tombstoned | undefined> {
  return givingWay(transaction, (client) => releaseDayIn(client, period, at, written, rest));
}

// releaseDayIn is one try of releaseDay, in the transaction of client.
async function releaseDayIn(
  client: pg.PoolClient,
  period: Period,
  at: number,
  written: (client: pg.PoolClient, n: number) => Promise<void>,
  rest: number,
): Promise<Tombstoned | undefined> {
  const day = historyOf(period); // a name periodOf() made from an integer
  const attached = await client.query(
    `SELECT 1 FROM pg_inherits WHERE inhrelid = to_regclass($1) AND inhparent = to_regclass('delivery_history')`,
    [day],
  );
  if (attached.rowCount === 0) return undefined;
  // Reads go on; a write into the day waits for the commit. A writer already in the day leaves the day to the
  // batches, which wait for its rows one at a time, rather than have every store queued behind this lock.
  await client.query("SAVEPOINT day");
  try {
    await client.query(`LOCK TABLE ${day} IN EXCLUSIVE MODE NOWAIT`);
  } catch (error) {
    if (!gaveWay(error)) throw error;
    await client.query("ROLLBACK TO SAVEPOINT day");
    return undefined;
  }
  const again = await client.query("SELECT 1 FROM released_days WHERE day = $1", [period.from]);
  if (again.rowCount !== 0) return undefined;
  // What the release makes tombstones, as the view reads them: done before at (a clock ahead of the purge's may
  // have finished a row after it).
  const before = "status = 'done' AND purged_at IS NULL AND (finished_at IS NULL OR finished_at < $1)";
  const counted = await inSteps(
    client,
    day,
    (range) =>
      `SELECT count(*)::integer AS n, coalesce(sum(octet_length(body)), 0)::bigint AS bytes,
              count(*) FILTER (WHERE octet_length(body) > 0)::integer AS inline FROM ${day} WHERE ${before} AND ${range}`,
    [at],
    rest,
  );
  const n = counted.n;
  if (n === 0) return { n: 0, bytes: 0 };
  // Searched bodies leave the index with their row's body, as the row's update trigger does for a batch.
  await client.query(
    `DELETE FROM deliveries_search s USING ${day} r
      WHERE (SELECT enabled FROM search_state) AND r.route = 0 AND ${before}
        AND s.source = r.source AND s.id = r.id`,
    [at],
  );
  // A body kept in its row would outlive its retention there, readable by SQL and in every backup: it is emptied
  // (a second read of the day, only where the count found such a body).
  if (counted.inline > 0)
    await client.query(
      `UPDATE ${day} SET body = '\\x'::bytea, purged_at = $1 WHERE ${before} AND octet_length(body) > 0`,
      [at],
    );
  await client.query("INSERT INTO released_days (day, released_at) VALUES ($1, $2)", [period.from, at]);
  // Statistics of the day's finished times, in a sample: a later purge asks the day for the rows done since its
  // release (finished_at at or after it), which its index of finished rows answers in a probe once the planner
  // knows the day's finished times end long before; without them it guessed a third of the day and walked it
  // whole. Two columns, not the whole row's (187 ms at a million rows, on a core the acks share): with the
  // statuses too, a replay or purge by filter that asks the day for its failed rows, or those not done, is
  // planned as a probe of the day's index of what is not done. A sample of 3,000 rows, not 30,000: the questions
  // are only where the finished times end and how few rows are not done, and the default sample's random reads
  // of the day were the release's slowest acks after its DROP.
  await client.query("SELECT set_config('default_statistics_target', $1, true)", [
    String(DEFAULTS.releaseStatisticsTarget),
  ]);
  await client.query(`ANALYZE ${day} (finished_at, status)`);
  await written(client, n);
  return { n, bytes: counted.bytes };
}

/**
 * inSteps reads a whole table for a sum, DEFAULTS.releaseReadPages of its pages at a time (a TID range scan each,
 * range the condition sql puts in its WHERE, bound as the last two parameters), resting rest times as long as each
 * step took, and adds up every numeric column of the steps' one-row answers. A day of a million rows read in
 * one go took a core and the disk from the acks for a quarter of a second (docs/operations.md#a-day-released-by-one-row);
 * under the caller's lock the table cannot change between steps.
 */
export async function inSteps(
  client: pg.PoolClient,
  table: string,
  sql: (range: string) => string,
  params: unknown[],
  rest: number,
): Promise<Record<string, number>> {
  const { rows } = await client.query(
    `SELECT (pg_relation_size($1::regclass) / current_setting('block_size')::bigint)::bigint AS pages,
            current_setting('server_version_num')::integer >= 140000 AS ranges`,
    [table],
  );
  // Before PostgreSQL 14 a range of ctid is a filter on a scan of the whole table, not a TID range scan: one read.
  const pages = rows[0].ranges ? Number(rows[0].pages) : 0;
  const step = DEFAULTS.releaseReadPages;
  const range = rows[0].ranges
    ? `ctid >= $${params.length + 1}::tid AND ctid < $${params.length + 2}::tid`
    : `$${params.length + 1}::tid IS NOT NULL AND $${params.length + 2}::tid IS NOT NULL`;
  const total: Record<string, number> = {};
  // At least one step, so that an empty table still answers with its zeros.
  for (let from = 0; from === 0 || from < pages; from += step) {
    const last = from + step >= pages;
    const read = () => client.query(sql(range), [...params, `(${from},0)`, `(${from + step},0)`]);
    const { rows: got } = last ? await read() : await paced(rest, read);
    for (const [k, v] of Object.entries(got[0] as Record<string, unknown>)) total[k] = (total[k] ?? 0) + Number(v);
  }
  return total;
}

/** Release is one released day: its start (periodOf().from), its end, and the time of its release. */
export interface Release {
  day: number;
  until: number;
  releasedAt: number;
}

/** releasedBefore lists the released days (releaseDay) that begin before the time before, oldest first. */
export async function releasedBefore(pool: Pool, before: number): Promise<Release[]> {
  const { rows } = await pool.query("SELECT day, released_at FROM released_days WHERE day < $1 ORDER BY day", [before]);
  return (rows as { day: string; released_at: string }[]).map((r) => ({
    day: Number(r.day),
    until: Number(r.day) + DAY,
    releasedAt: Number(r.released_at),
  }));
}

/** unreleasedSpans gives the spans of time from start to end that none of the released days covers, each [from, until). */
export function unreleasedSpans(releases: Release[], start: number, end: number): [number, number][] {
  const spans: [number, number][] = [];
  let from = start;
  for (const { day, until } of releases) {
    if (day > from) spans.push([from, Math.min(day, end)]);
    from = Math.max(from, until);
  }
  if (from < end) spans.push([from, end]);
  return spans.filter(([a, b]) => a < b);
}

/** historyBefore lists the days of delivery_history (their bodies' Period) that end at or before the time before, oldest first. */
export async function historyBefore(pool: Pool, before: number): Promise<Period[]> {
  const { rows } = await pool.query(
    `SELECT c.relname AS name FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
      WHERE i.inhparent = to_regclass('delivery_history') AND c.relname LIKE 'delivery\\_history\\_d%' ORDER BY c.relname`,
  );
  const periods: Period[] = [];
  for (const { name } of rows as { name: string }[]) {
    const day = /^delivery_history_d(\d{4})(\d{2})(\d{2})$/.exec(name);
    if (!day) continue;
    const period = periodOf(Date.UTC(Number(day[1]), Number(day[2]) - 1, Number(day[3])));
    if (period.until <= before) periods.push(period);
  }
  return periods;
}

/**
 * dropDetached drops the days a release detached, of bodies or of history, and the days' partitions that a
 * version before the released days left behind a copy it swapped in (_was), each in a transaction of its own
 * after the one that detached it: PostgreSQL removes a dropped table's files at commit, before it lets go of
 * its locks, and a DROP in the release's transaction held the lock on delivery_bodies that every store waits
 * behind while a day's gigabyte was unlinked. A day a crash left detached between the two is dropped by the
 * next purge: a history day is detached only after its keys, attempts and search documents were deleted
 * (PostgresBulk's forgetDay), so its table is all that is left of it. It returns how many it dropped.
 */
export async function dropDetached(pool: Pool): Promise<number> {
  const { rows } = await pool.query(
    `SELECT relname AS name FROM pg_class
      WHERE relnamespace = current_schema()::regnamespace AND relkind = 'r' AND NOT relispartition
        AND (relname LIKE 'delivery\\_bodies\\_d%' OR relname LIKE 'delivery\\_history\\_d%')`,
  );
  let dropped = 0;
  for (const { name } of rows as { name: string }[]) {
    // DDL takes no bound parameters: only a name of the shape periodOf() and historyOf() make is ever put in it.
    if (!/^delivery_(bodies|history)_d\d{8}(_was)?$/.test(name)) continue;
    await pool.query(`DROP TABLE IF EXISTS ${name}`);
    dropped++;
  }
  return dropped;
}

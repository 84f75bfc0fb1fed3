// sql.ts: the SQL both backends run word for word, kept once so the two cannot drift apart in what a filter
// matches or a held key is: a Filter as a WHERE condition (filterSql(), in each dialect), the ordering's
// status queries (ORDERING_SQL), a try kept in the attempt log (ATTEMPT_SQL), and search()'s statement
// (searchSql(), with a list's columns, listColumns()). DISTINCT_SOURCES is PostgreSQL's alone, but filterSql's PostgreSQL dialect
// is built from it; SQL that one backend alone runs stays inline in that backend's function.

import { type BodySearchPart, bodySearchSql, type MatchingKeys, pgKeysSql } from "./search.ts";
import { STATUSES, type Backend, type Cursor, type Filter, type SqlValue, type Try } from "./store.ts";

const FILTER_FIELDS: Record<keyof Filter, "string" | "number"> = {
  status: "string",
  source: "string",
  type: "string",
  since: "number",
  until: "number",
  errorMatch: "string",
  bodyContains: "string",
  bodyJson: "string",
  bodyWords: "string",
  id: "string",
  destination: "string",
};

/**
 * listColumns is what a list selects (search() with bodies: false): every column toDelivery() reads, the body
 * as no bytes. A list shows no body; on PostgreSQL, where the view reads each body from its day's partition,
 * leaving it out halves the pages a cold page of 50 reads (bench listing).
 */
export function listColumns(backend: Backend): string {
  const body = backend === "postgres" ? "'\\x'::bytea" : "X''";
  return `source, id, ${body} AS body, body_sha256, content_type, event_type, provider_time, received_at, status, attempts,
          available_at, leased_until, error, conflicts, finished_at, replays, purged_at, order_key, event_time, newer_id,
          destination, route, headers, traceparent, origin`;
}

/**
 * searchSql is search()'s statement on either backend, with `?` parameters: the rows a filter's WHERE matches
 * (filterSql()), newest first, a page after the cursor. On PostgreSQL the cursor's time is also spelled out on
 * its own, so the received_at index bounds the scan.
 */
export function searchSql(
  backend: Backend,
  filter: FilterSql,
  page: { after?: Cursor; limit: number; bodies?: boolean },
): { sql: string; params: SqlValue[] } {
  const { after } = page;
  const pg = backend === "postgres";
  const columns = page.bodies === false ? listColumns(backend) : "*";
  if (pg && filter.keyed !== undefined) {
    // A body search: its matches' keys sorted newest first, and each one's row read, with the rest of the
    // filter, until the page is full (a nested loop under the LIMIT). Joined to the rows as a whole, every
    // match's row was read before the sort: 3,334 probes into the days' partitions for a page of 50.
    const { where, params } = filter.keyed;
    const keys = pgKeysSql(filter.keyed.keys);
    const cursor =
      after === undefined
        ? ""
        : "WHERE received_at <= ?::bigint AND (received_at, source, id, route) < (?::bigint, ?::text, ?::text, ?::smallint)";
    return {
      sql: `SELECT d.* FROM (SELECT * FROM (${keys.sql}) k ${cursor}
                              ORDER BY received_at DESC, source DESC, id DESC, route DESC) k
            CROSS JOIN LATERAL (SELECT ${columns} FROM deliveries
                                 WHERE source = k.source AND id = k.id AND route = k.route AND received_at = k.received_at
                                   AND ${where}) d
            ORDER BY k.received_at DESC, k.source DESC, k.id DESC, k.route DESC LIMIT ?::integer`,
      params: [
        ...keys.params,
        ...(after === undefined ? [] : [after.receivedAt, after.receivedAt, after.source, after.id, after.route ?? -1]),
        ...params,
        page.limit,
      ],
    };
  }
  if (!pg && filter.rechecked !== undefined) {
    // A containment: the rows its words found and the rest of the filter keeps, sorted newest first from their
    // rows alone, and each one's body then checked until the page is full. In one WHERE, every body found was read
    // and parsed before the sort. OFFSET keeps SQLite from folding the sorted rows into the outer query, which
    // would check each body first again; it runs them as a coroutine, read in their order (docs/performance.md#a-page-of-a-body-search-newest-first).
    const { where, params, check } = filter.rechecked;
    return {
      sql: `SELECT ${columns === "*" ? "deliveries.*" : columns} FROM (SELECT rowid AS found, received_at AS found_at, source AS found_source, id AS found_id,
                                       route AS found_route
                                  FROM deliveries WHERE ${where} ${after === undefined ? "" : "AND (received_at, source, id, route) < (?, ?, ?, ?)"}
                                 ORDER BY received_at DESC, source DESC, id DESC, route DESC LIMIT -1 OFFSET 0)
            CROSS JOIN deliveries ON deliveries.rowid = found
            WHERE ${check.where}
            ORDER BY found_at DESC, found_source DESC, found_id DESC, found_route DESC LIMIT ?`,
      params: [
        ...params,
        ...(after === undefined ? [] : [after.receivedAt, after.source, after.id, after.route ?? -1]),
        ...check.params,
        page.limit,
      ],
    };
  }
  const cursor =
    after === undefined
      ? ""
      : pg
        ? "AND received_at <= ?::bigint AND (received_at, source, id, route) < (?::bigint, ?::text, ?::text, ?::smallint)"
        : "AND (received_at, source, id, route) < (?, ?, ?, ?)";
  const cursorParams =
    after === undefined
      ? []
      : [...(pg ? [after.receivedAt] : []), after.receivedAt, after.source, after.id, after.route ?? -1];
  return {
    sql: `SELECT ${columns} FROM deliveries WHERE ${filter.where} ${cursor}
          ORDER BY received_at DESC, source DESC, id DESC, route DESC LIMIT ${pg ? "?::integer" : "?"}`,
    params: [...filter.params, ...cursorParams, page.limit],
  };
}

/**
 * DISTINCT_SOURCES lists the sources on PostgreSQL by a loose index scan: one probe of a primary key per source.
 * It reads delivery_keys, which holds every delivery's key in one unpartitioned table (docs/table.md#hot-and-cold):
 * on deliveries each probe was a Merge Append over every day's partition.
 */
export const DISTINCT_SOURCES = `WITH RECURSIVE s(source) AS (
    SELECT min(source) FROM delivery_keys
    UNION ALL SELECT (SELECT min(source) FROM delivery_keys WHERE source > s.source) FROM s WHERE s.source IS NOT NULL)
  SELECT source FROM s WHERE source IS NOT NULL`;

/**
 * IdKeys is what delivery_keys holds for a filter's ID on PostgreSQL, read in a statement before the one that
 * reads its rows (idKeysSql()): the sources it was stored under and its routes' first and last received_at.
 */
export interface IdKeys {
  sources: string[];
  first: number;
  last: number;
}

/**
 * idKeysSql is the statement that reads an ID's IdKeys from delivery_keys, one probe of its primary key per
 * source (the filter's, or each found by DISTINCT_SOURCES); it answers one row, its sources NULL when the ID
 * is not stored.
 */
export function idKeysSql(id: string, source: string | undefined): { sql: string; params: SqlValue[] } {
  const key = idKeyWhere(id, source);
  return {
    sql: `SELECT array_agg(DISTINCT source) AS sources, min(received_at) AS first, max(received_at) AS last FROM delivery_keys
          WHERE ${key.where}`,
    params: key.params,
  };
}

// idKeyWhere finds an ID's keys in delivery_keys: a probe of its primary key per source, the filter's or each one
// DISTINCT_SOURCES finds (PostgreSQL 15 has no skip scan, so an ID alone would read the whole key).
function idKeyWhere(id: string, source: string | undefined): { where: string; params: SqlValue[] } {
  return source === undefined
    ? { where: `source = ANY (ARRAY(${DISTINCT_SOURCES})) AND id = ?::text`, params: [id] }
    : { where: "source = ?::text AND id = ?::text", params: [source, id] };
}

/**
 * FilterSql is a filter's WHERE condition with its `?` parameters. keyed, on PostgreSQL with a body search, is
 * the same filter split in two: the keys its first search form matches (MatchingKeys), and the condition on the
 * rest (the other forms' included), which a page of the search walks newest first (searchSql()). rechecked, on
 * SQLite with a containment, is split as well: the check of each body (BodySearchPart.recheck), and the rest.
 * walked, on SQLite with a body search, is the FTS5 expression of its forms together (FTS5 ANDs terms side by
 * side), the condition on the rest, and a containment's check of each body apart (lib/sqlite/searchwalk.ts).
 */
export interface FilterSql {
  where: string;
  params: SqlValue[];
  keyed?: { keys: MatchingKeys; where: string; params: SqlValue[] };
  rechecked?: { where: string; params: SqlValue[]; check: { where: string; params: SqlValue[] } };
  walked?: { match: string; where: string; params: SqlValue[]; check?: { where: string; params: SqlValue[] } };
}

/**
 * filterSql turns a Filter into a WHERE condition with `?` parameters, in the backend's dialect. It throws
 * a TypeError for a field it does not know or a value of the wrong type, so a typo never matches everything.
 * On PostgreSQL, keys (the filter's ID's, idKeysSql()) names its sources and days as values, which the planner
 * prunes the days' partitions by; without them the statement reads them from delivery_keys itself.
 */
export function filterSql(filter: Filter, backend: Backend, keys?: IdKeys): FilterSql {
  if (filter === null || typeof filter !== "object")
    throw new TypeError(`filter: expected an object, got ${filter === null ? "null" : typeof filter}`);
  for (const [key, value] of Object.entries(filter)) {
    const kind = FILTER_FIELDS[key as keyof Filter];
    if (kind === undefined)
      throw new TypeError(
        `filter: expected one of ${Object.keys(FILTER_FIELDS).join(", ")}, got ${JSON.stringify(key)}`,
      );
    if (value === undefined) continue;
    if (kind === "number" ? !Number.isFinite(value) : typeof value !== "string") {
      throw new TypeError(
        `filter: expected ${key} to be a ${kind === "number" ? "finite number (ms since the epoch)" : "string"}, got ${JSON.stringify(value)}`,
      );
    }
  }
  if (filter.status !== undefined && !STATUSES.includes(filter.status)) {
    throw new TypeError(
      `filter: expected status to be one of ${STATUSES.join(", ")}, got ${JSON.stringify(filter.status)}`,
    );
  }
  const pg = backend === "postgres";
  const where: string[] = [];
  const params: SqlValue[] = [];
  const add = (sql: string, value: SqlValue) => void (where.push(sql), params.push(value));
  // On SQLite, two hints for the planner, which otherwise walks a third of the table by the primary key's
  // source and sorts it (350 ms at a million rows): status <> 'done' spelled out lets it use the partial index
  // of what is not done (deliveries_open, which holds received_at and source), and +source keeps it off the
  // primary key unless the ID is given too, so it walks received_at newest first. PostgreSQL needs neither.
  if (filter.status !== undefined)
    add(!pg && filter.status !== "done" ? "status = ? AND status <> 'done'" : "status = ?", filter.status);
  if (filter.source !== undefined) add(!pg && filter.id === undefined ? "+source = ?" : "source = ?", filter.source);
  if (filter.id !== undefined && !pg) add("id = ?", filter.id);
  if (filter.id !== undefined && pg && keys !== undefined) {
    // Its sources and days as values: the plan is made for the days between the first and the last alone (two
    // partitions, where the form below plans every day's and prunes as it runs: 3.3–3.8 ms at ten million).
    if (filter.source === undefined) {
      where.push(keys.sources.length === 0 ? "FALSE" : `source IN (${keys.sources.map(() => "?::text").join(", ")})`);
      params.push(...keys.sources);
    }
    add("id = ?", filter.id);
    where.push("received_at BETWEEN ?::bigint AND ?::bigint");
    params.push(keys.first, keys.last);
  } else if (filter.id !== undefined && pg) {
    // PostgreSQL 15 has no skip scan, so an ID without its source would read the whole primary key (100 ms at a
    // million rows): it probes the key once per source instead, the sources found by a loose index scan.
    if (filter.source === undefined) where.push(`source = ANY (ARRAY(${DISTINCT_SOURCES}))`);
    add("id = ?", filter.id);
    // And when its rows were received, from delivery_keys: the view then opens only the partitions of the days
    // between the first and the last, where it probed every day's (9.7–11.1 ms a page at ten million over 36
    // days, against 0.76 before the split). A range, as PostgreSQL prunes partitions by a subquery's value
    // compared with the key while the statement runs, but not by an array of them (= ANY).
    const key = idKeyWhere(filter.id, filter.source);
    where.push(
      `received_at BETWEEN (SELECT min(received_at) FROM delivery_keys WHERE ${key.where}) AND (SELECT max(received_at) FROM delivery_keys WHERE ${key.where})`,
    );
    params.push(...key.params, ...key.params);
  }
  if (filter.type !== undefined) add("event_type = ?", filter.type);
  if (filter.destination !== undefined) add("destination = ?", filter.destination);
  if (filter.since !== undefined) add(pg ? "received_at >= ?::bigint" : "received_at >= ?", Math.floor(filter.since));
  if (filter.until !== undefined) add(pg ? "received_at < ?::bigint" : "received_at < ?", Math.ceil(filter.until));
  // instr and strpos, not LIKE: the operator's text is matched as it is, % and _ included.
  if (filter.errorMatch !== undefined)
    add(pg ? "strpos(lower(error), lower(?::text)) > 0" : "instr(lower(error), lower(?)) > 0", filter.errorMatch);
  // The body is bytes: the needle goes in as the bytes of its UTF-8 text, so any body can be searched. On
  // PostgreSQL a tombstone's body is its row's, empty, as the view reads it: its body's own row may still wait in
  // its day's partition (docs/table.md#bodies-apart), where delivery_body(), which has no purged_at, would find it.
  if (filter.bodyContains !== undefined)
    add(
      pg
        ? "position(?::bytea IN CASE WHEN purged_at IS NULL THEN delivery_body(source, id, route, received_at, body) ELSE body END) > 0"
        : "instr(body, ?) > 0",
      Buffer.from(filter.bodyContains, "utf8"),
    );
  const body = bodySearchSql(filter, backend);
  const joined = (all: string[]) => (all.length === 0 ? "TRUE" : all.join(" AND "));
  // The filter with some of its body search's parts left out: the rest of it, for a page (searchSql()).
  const without = (left: (part: BodySearchPart, i: number) => boolean) => {
    const kept = body.parts.filter((part, i) => !left(part, i));
    return {
      where: joined([...where, ...kept.map((p) => p.sql)]),
      params: [...params, ...kept.flatMap((p) => p.params)],
    };
  };
  const matching = body.keys;
  const keyed = matching && { keys: matching, ...without((_, i) => i === 0) };
  const checks = body.parts.filter((part) => part.recheck);
  const rechecked = checks.length > 0 && {
    ...without((part) => part.recheck === true),
    check: { where: joined(checks.map((p) => p.sql)), params: checks.flatMap((p) => p.params) },
  };
  const matches = body.parts.flatMap((part) => (part.match === undefined ? [] : [part.match]));
  const walked = matches.length > 0 && {
    match: matches.join(" "),
    ...without((part) => part.match !== undefined || part.recheck === true),
    ...(rechecked && { check: rechecked.check }),
  };
  for (const part of body.parts) {
    where.push(part.sql);
    params.push(...part.params);
  }
  return {
    where: joined(where),
    params,
    ...(keyed && { keyed }),
    ...(rechecked && { rechecked }),
    ...(walked && { walked }),
  };
}

// HELD_KEYS finds the held keys; both backends run it, `?` being the time now.
const HELD_KEYS = `
  SELECT * FROM (
    SELECT k.source, k.destination, k.order_key, k.head_id, k.due, d.status, d.attempts, d.error,
           (SELECT count(*) FROM deliveries w WHERE w.source = k.source AND w.destination = k.destination AND w.order_key = k.order_key
                                                AND w.status = 'received' AND w.id <> k.head_id) AS waiting
    FROM order_keys k JOIN deliveries d ON d.source = k.source AND d.id = k.head_id AND d.destination = k.destination
    WHERE (d.status = 'received' AND d.attempts > 0 AND k.due > ?) OR d.status = 'failed') h
  WHERE waiting > 0 ORDER BY coalesce(due, 0), source, order_key, destination`;

// ORDERING_COUNTS counts what OrderingStatus counts, on both backends.
const ORDERING_COUNTS = `
  SELECT (SELECT count(*) FROM order_keys WHERE head_id IS NOT NULL) AS keys,
         (SELECT count(*) FROM deliveries WHERE newer_id IS NOT NULL) AS stale,
         (SELECT count(*) FROM deliveries d WHERE d.status = 'failed' AND d.order_key IS NOT NULL AND NOT EXISTS
            (SELECT 1 FROM order_keys k WHERE k.source = d.source AND k.destination = d.destination AND k.order_key = d.order_key
                                          AND k.head_id = d.id)) AS passed`;

/** ORDERING_SQL holds the status queries of ordering, which the PostgreSQL backend runs too. */
export const ORDERING_SQL = { held: HELD_KEYS, counts: ORDERING_COUNTS } as const;

/**
 * replayToCount is the statement that counts what replayMatching(filter, { to }) would send, word for word
 * on both backends (`?` the filter's where, then the destination, then days' own): each delivery once,
 * whichever of its rows matched, whose row there is done (again) or missing (added). A dry run counting rows
 * said 36 where the replay then sent 19. days, a condition on the row there (`t`), names when its rows were
 * received: PostgreSQL's count of an ID names the ID's days (postgres/bulk.ts replayTo), where the row there,
 * found by its key alone, was planned in every day's partition.
 */
export function replayToCount(where: string, days?: string): string {
  return `SELECT count(*) AS n FROM (SELECT DISTINCT source, id FROM deliveries WHERE purged_at IS NULL AND ${where}) m
           WHERE NOT EXISTS (SELECT 1 FROM deliveries t WHERE t.source = m.source AND t.id = m.id AND t.destination = ?
                                                         AND NOT (t.status = 'done' AND t.purged_at IS NULL)${days === undefined ? "" : ` AND ${days}`})`;
}

/**
 * ATTEMPT_SQL keeps a try in the attempt log and lets the oldest go past the cap, word for word on both
 * backends, in the transaction of the finish or fail that settles it. `keep` takes tryParams()'s values;
 * `trim` takes the delivery's source, id and destination twice, then the cap.
 */
export const ATTEMPT_SQL = {
  keep: `INSERT INTO attempts (source, id, destination, attempt, started_at, ms, status, error, headers, body)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
  // Finds nothing to cut, by the index, until a delivery has more tries than the cap: one probe per try
  // that may take it past (mayOverflow()).
  trim: `DELETE FROM attempts WHERE source = ? AND id = ? AND destination = ? AND seq <= (
           SELECT seq FROM attempts WHERE source = ? AND id = ? AND destination = ? ORDER BY seq DESC LIMIT 1 OFFSET ?)`,
} as const;

/** tryParams are ATTEMPT_SQL.keep's values for one try: the delivery's, its attempt number, and what the try came to. */
export function tryParams(
  d: { source: string; id: string; destination: string },
  attempt: number,
  error: string | null,
  tried: Try | undefined,
  now: number,
): SqlValue[] {
  return [
    d.source,
    d.id,
    d.destination,
    attempt,
    Math.round(tried?.startedAt ?? now),
    tried === undefined ? null : Math.round(tried.ms),
    tried?.status ?? null,
    error,
    tried?.headers === undefined ? null : JSON.stringify(tried.headers),
    tried?.body ?? null,
  ];
}

/**
 * mayOverflow says whether a good try may take its delivery's log past the cap, so that trim must run with
 * it. A first try of a delivery never replayed cannot, but for one more try than the cap: its earlier tries
 * (failures, each trimmed as it was kept) came before a retry by hand reset its attempts, and once it is
 * done only a replay, which counts, starts it again. So the hot path, a forward that succeeds at once,
 * runs no trim, and a log holds at most attemptsKept + 1 tries.
 */
export function mayOverflow(lease: { attempts: number; replays: number }): boolean {
  return lease.attempts > 1 || lease.replays > 0;
}

/** trimParams are ATTEMPT_SQL.trim's values: the delivery's key twice, and how many tries it keeps. */
export function trimParams(d: { source: string; id: string; destination: string }, kept: number): SqlValue[] {
  return [d.source, d.id, d.destination, d.source, d.id, d.destination, kept];
}

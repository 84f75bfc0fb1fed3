// sqlite/searchwalk.ts: a page of a body search (bodyJson or bodyWords) with many matches, walked newest first
// along the index of when each row was received, a window of it at a time. The page that sorts its matches first
// (searchSql()) reads every match's row to sort it: a repository's 33,333 pushes at ten million, scattered across
// the file, for a page of 50. The FTS5 index's rowids are the rows' own, and FTS5 reads its lists from a rowid on,
// so a window asks FTS5 for the matches between its rows' least and greatest rowid alone (stored in order, a
// window's rows are a narrow band of rowids; rows brought in by an import are a second band, and still in the
// range), tests each entry of deliveries_received in the window against that set, and reads only the rows in it.
// Each next window is sized by what the last one found, as PostgreSQL's walk is (lib/postgres/searchwalk.ts), and
// after the last the rest is walked against every match at once. A needle with few matches (counted first, up to
// searchWalkAt()) is sorted as before. The SQL is this backend's alone (docs/performance.md#the-newest-matches-first).

import { DEFAULTS } from "../defaults.ts";
import { toDelivery } from "../rows.ts";
import { type FilterSql, listColumns, searchSql } from "../sql.ts";
import type { Cursor, Delivery, Filter, SqlValue } from "../store.ts";
import type { Statements } from "./order-keys.ts";

type Row = Record<string, unknown>;
// The first window's entries of the time index (a few milliseconds of it read), the most a window takes, and the
// most windows before the rest is walked at once.
const FIRST = 20_000;
const LARGEST = 2_000_000;
const MOST = 10;

/**
 * searchWalkAt is how many matches make a needle walked rather than sorted, among rows stored. A sort reads each
 * match's row, anywhere in the file; a walk reads the time index in order, about rows / matches entries for each
 * row it keeps, a few hundred to a page. So the walk wins once matches² passes rows over
 * DEFAULTS.searchWalkEntries, and never under DEFAULTS.searchWalkAbove matches, a page.
 */
export function searchWalkAt(rows: number): number {
  return Math.max(DEFAULTS.searchWalkAbove, Math.ceil(Math.sqrt(rows / DEFAULTS.searchWalkEntries)));
}

/** Windows is how a walk sizes its windows, in entries of the time index: a test's small ones. */
export interface Windows {
  /** @default 20_000 */
  first?: number;
  /** @default 10 */
  most?: number;
}

/**
 * walkedPage is search()'s page of a filter with a body search on SQLite (filter.walked from filterSql()):
 * walked, or sorted first when the needle has few matches. since and until bound the walk.
 */
export function walkedPage(
  sql: Statements,
  filter: FilterSql & { walked: NonNullable<FilterSql["walked"]> },
  bounds: Pick<Filter, "since" | "until">,
  page: { after?: Cursor; limit: number; bodies?: boolean },
  windows: Windows = {},
): Delivery[] {
  const first = windows.first ?? FIRST;
  const { match, check } = filter.walked;
  // A condition and each body's check after it, the latter last: a row's body is read only if the rest keeps it.
  const checked = (rest: { where: string; params: SqlValue[] }) =>
    check === undefined
      ? rest
      : { where: `${rest.where} AND ${check.where}`, params: [...rest.params, ...check.params] };
  const { rows } = sql("SELECT coalesce(max(rowid), 0) AS rows FROM delivery_rows").get() as { rows: number };
  const at = searchWalkAt(rows);
  // Up to as many matches as make a walk: when there are fewer, these are all of them, and the sorted page reads
  // those rows rather than ask FTS5 again (a phrase of common words costs tens of milliseconds to look up, none
  // found or not).
  const matched = (
    sql("SELECT rowid FROM deliveries_search WHERE deliveries_search MATCH ? LIMIT ?").all(match, at) as {
      rowid: number;
    }[]
  ).map((r) => r.rowid);
  const { after } = page;
  if (matched.length === 0) return [];
  if (matched.length < at) {
    const listed = {
      where: `rowid IN (SELECT value FROM json_each(?)) AND ${filter.walked.where}`,
      params: [JSON.stringify(matched), ...filter.walked.params],
    };
    const sorted = searchSql(
      "sqlite",
      { ...checked(listed), ...(check !== undefined && { rechecked: { ...listed, check } }) },
      page,
    );
    return (sql(sorted.sql).all(...(sorted.params as never[])) as Row[]).map(toDelivery);
  }
  const { where, params } = checked(filter.walked);
  const columns = page.bodies === false ? listColumns("sqlite") : "deliveries.*";
  const since = bounds.since === undefined ? undefined : Math.floor(bounds.since);
  const found: Delivery[] = [];
  // The rows received in [from, to) that match, after the cursor and by the rest of the filter, newest first, up
  // to the page's rest; the matches asked for between the rowids lo and hi when given, else all of them. +rowid: a
  // test of each entry against the set, which SQLite makes once, not a lookup driven by it. The route, which the
  // index lacks, orders the rows of one delivery, read for those in the set alone. OFFSET 0 keeps the walk a
  // coroutine that the page reads only as far as it needs. The rowids are cast: node:sqlite binds a number as a
  // REAL, and FTS5 then tests each rowid rather than start its lists at the bound (80 ms against 0.7 here).
  const within = (from: number | undefined, to: number, range?: { lo: number; hi: number }) => {
    const walk = `SELECT rowid AS found, received_at AS found_at, source AS found_source, id AS found_id, route AS found_route
                    FROM delivery_rows INDEXED BY deliveries_received
                   WHERE received_at < ? ${from === undefined ? "" : "AND received_at >= ?"}
                     ${after === undefined ? "" : "AND (received_at, source, id) <= (?, ?, ?)"}
                     AND +rowid IN (SELECT rowid FROM deliveries_search WHERE deliveries_search MATCH ?
                                     ${range === undefined ? "" : "AND rowid BETWEEN CAST(? AS INTEGER) AND CAST(? AS INTEGER)"})
                   ORDER BY received_at DESC, source DESC, id DESC, route DESC LIMIT -1 OFFSET 0`;
    const statement = `SELECT ${columns} FROM (${walk}) CROSS JOIN deliveries ON deliveries.rowid = found
                        WHERE ${where}
                          ${after === undefined ? "" : "AND (found_at, found_source, found_id, found_route) < (?, ?, ?, ?)"}
                        ORDER BY found_at DESC, found_source DESC, found_id DESC, found_route DESC LIMIT ?`;
    const values = [
      to,
      ...(from === undefined ? [] : [from]),
      ...(after === undefined ? [] : [after.receivedAt, after.source, after.id]),
      match,
      ...(range === undefined ? [] : [range.lo, range.hi]),
      ...params,
      ...(after === undefined ? [] : [after.receivedAt, after.source, after.id, after.route ?? -1]),
      page.limit - found.length,
    ];
    found.push(...(sql(statement).all(...(values as never[])) as Row[]).map(toDelivery));
  };
  const top = Math.min(
    bounds.until === undefined ? Number.POSITIVE_INFINITY : Math.ceil(bounds.until),
    after === undefined ? Number.POSITIVE_INFINITY : after.receivedAt + 1,
  );
  let to = Number.isFinite(top)
    ? top
    : Number((sql("SELECT max(received_at) AS newest FROM delivery_rows").get() as { newest: number }).newest) + 1;
  let entries = first;
  for (let k = 0; k < (windows.most ?? MOST); k++) {
    // The window: the next entries of the time index back from to, whole milliseconds, no further back than since.
    const edge = sql(
      `SELECT received_at AS at FROM delivery_rows INDEXED BY deliveries_received WHERE received_at < ?
        ORDER BY received_at DESC LIMIT 1 OFFSET ?`,
    ).get(to, entries - 1) as { at: number } | undefined;
    if (edge === undefined || (since !== undefined && edge.at <= since)) break;
    const from = edge.at;
    const range = sql(
      `SELECT min(rowid) AS lo, max(rowid) AS hi FROM delivery_rows INDEXED BY deliveries_received
        WHERE received_at >= ? AND received_at < ?`,
    ).get(from, to) as { lo: number | null; hi: number | null };
    const before = found.length;
    if (range.lo !== null && range.hi !== null) within(from, to, { lo: range.lo, hi: range.hi });
    if (found.length === page.limit) return found;
    const got = found.length - before;
    const need = page.limit - found.length;
    entries = Math.min(LARGEST, got === 0 ? entries * 4 : Math.max(first, Math.ceil((entries * need * 1.5) / got)));
    to = from;
  }
  // The rest, from where the windows stopped, against every match.
  within(since, to);
  return found;
}

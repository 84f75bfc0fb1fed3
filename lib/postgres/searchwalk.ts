// postgres/searchwalk.ts: a page of a body search (bodyJson or bodyWords) with many matches, walked back from its
// newest hour. One statement that reads every match before it sorts them rechecked each one's JSON and read its
// key: a repository's 33,334 pushes at ten million, for a page of 50. Each search row holds its hour and day beside
// its JSON and beside its words, in their GIN indexes (the migration after released_days), so a window of time is
// asked for by its periods, and PostgreSQL intersects the form's entries with theirs in the index and rechecks
// only what both hold. A needle with few matches (at most DEFAULTS.searchWalkAbove, counted first) is read at once,
// as before: walking windows would cost it a statement each. The rows indexed before that migration hold no
// period; they were all received before search_state.dated_since, which the walk stops at, and the last statement
// asks for every match older than the windows, theirs included. The form that walks is the filter's first (JSON
// when both are given); the other is a condition on each row. The SQL is this backend's alone
// (docs/performance.md#the-newest-matches-first).

import type pg from "pg";
import { DEFAULTS } from "../defaults.ts";
import { type KeysWindow, searchPeriods } from "../search.ts";
import { type FilterSql, searchSql } from "../sql.ts";
import type { Cursor, Delivery } from "../store.ts";
import { toPg } from "./commit.ts";
import { toDelivery } from "../rows.ts";

const HOUR = 3_600_000;
const DAY = 86_400_000;
// The walk's first window, and the most windows it asks before it asks for the rest in one statement. Each next
// window is as long as the last one's matches say the page's rest needs, half again, an hour at least (a window
// is read by whole hours, or by whole days past one: a window's periods are entries of the index that its scan
// reads, a few dozen at most), and four times the last when it found none.
const FIRST = HOUR;
const MOST = 10;
const LONGEST = 32 * DAY;

/**
 * walkedPage is search()'s page of a filter with a body search (filter.keyed from filterSql()): walked, or in one
 * statement when the needle has few matches. It runs on client, in the caller's transaction.
 */
export async function walkedPage(
  client: pg.ClientBase,
  filter: FilterSql & { keyed: NonNullable<FilterSql["keyed"]> },
  page: { after?: Cursor; limit: number; bodies?: boolean },
  now: number,
): Promise<Delivery[]> {
  const { keys } = filter.keyed;
  // The walk starts at the newest row, looked for in the last day's partitions first: cold, every day's index
  // read to find it was 135 pages at ten million, 20 this way.
  const { rows } = await client.query(
    toPg(`SELECT (SELECT dated_since FROM search_state) AS dated_since,
            (SELECT count(*) FROM (SELECT 1 FROM deliveries_search WHERE ${keys.where} LIMIT ?::integer) m) AS n,
            (SELECT max(received_at) FROM delivery_rows WHERE received_at >= ?::bigint) AS newest`),
    [...keys.params, DEFAULTS.searchWalkAbove + 1, now - DAY],
  );
  const probe = rows[0];
  const found: Delivery[] = [];
  const read = async (keyed: FilterSql["keyed"]) => {
    const { sql, params } = searchSql("postgres", { ...filter, keyed }, { ...page, limit: page.limit - found.length });
    found.push(...(await client.query(toPg(sql), params)).rows.map(toDelivery));
  };
  if (Number(probe.n) <= DEFAULTS.searchWalkAbove) {
    await read(filter.keyed);
    return found;
  }
  // Nothing received in the last day: the newest row, wherever it is.
  const newest = Number(
    probe.newest ?? (await client.query("SELECT max(received_at) AS newest FROM delivery_rows")).rows[0].newest,
  );
  const datedSince = Number(probe.dated_since);
  const within = (window: KeysWindow) => read({ ...filter.keyed, keys: { ...keys, window } });
  // Every route of a delivery has route 0's received_at (a replay to a new destination copies it), by which
  // its row is indexed: a window's bounds hold all of them or none.
  let to = (page.after?.receivedAt ?? newest) + 1;
  let span = FIRST;
  for (let n = 0; n < MOST; n++) {
    const from = to - span;
    if (from < datedSince) break;
    const before = found.length;
    await within({ periods: searchPeriods(from, to, span < DAY ? "hour" : "day"), from, to });
    if (found.length === page.limit) return found;
    const got = found.length - before;
    const need = page.limit - found.length;
    span = Math.min(LONGEST, got === 0 ? span * 4 : Math.max(HOUR, Math.ceil((span * need * 1.5) / got)));
    to = from;
  }
  await within({ to });
  return found;
}

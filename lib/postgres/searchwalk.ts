// postgres/searchwalk.ts: a page of a containment search (bodyJson) with many matches, walked back from its newest
// hour. One statement that reads every match before it sorts them rechecked each one's JSON and read its key: a
// repository's 33,334 pushes at ten million, for a page of 50. deliveries_search_json holds each row's hour and day
// beside its JSON (the migration after released_days), so a window of time is asked for by its periods, and
// PostgreSQL intersects the needle's entries with theirs in the index and rechecks only what both hold. A needle
// with few matches (at most DEFAULTS.searchWalkAbove, counted first) is read at once, as before: walking windows
// would cost it a statement each. The rows indexed before that migration hold no period; they were all received
// before search_state.dated_since, which the walk stops at, and the last statement asks for every match older
// than the windows, theirs included. The SQL is this backend's alone (docs/performance.md#the-newest-matches-first).

import type pg from "pg";
import { DEFAULTS } from "../defaults.ts";
import { parseBodyJson, pgDatedKeys, searchPeriods } from "../search.ts";
import { type FilterSql, searchSql } from "../sql.ts";
import type { Cursor, Delivery } from "../store.ts";
import { toPg } from "./commit.ts";
import { toDelivery } from "../rows.ts";

const HOUR = 3_600_000;
const DAY = 86_400_000;
// The windows, newest first, each before the last: hours for the first day, then days (a window's periods are
// entries of the index that a scan of it reads, a few dozen at most). Past the last, the rest in one statement.
const WINDOWS = [HOUR, 3 * HOUR, 12 * HOUR, 2 * DAY, 8 * DAY, 32 * DAY];

/**
 * containmentPage is search()'s page of a filter whose first body search form is a containment (filter.keyed from
 * filterSql()): walked, or in one statement when the needle has few matches. It runs on client, in the caller's
 * transaction.
 */
export async function containmentPage(
  client: pg.ClientBase,
  bodyJson: string,
  filter: FilterSql & { keyed: NonNullable<FilterSql["keyed"]> },
  page: { after?: Cursor; limit: number; bodies?: boolean },
): Promise<Delivery[]> {
  const needle = JSON.stringify(parseBodyJson(bodyJson));
  const { rows } = await client.query(
    `SELECT (SELECT dated_since FROM search_state) AS dated_since,
            (SELECT max(received_at) FROM delivery_rows) AS newest,
            (SELECT count(*) FROM (SELECT 1 FROM deliveries_search WHERE doc @> $1::jsonb LIMIT $2::integer) m) AS n`,
    [needle, DEFAULTS.searchWalkAbove + 1],
  );
  const probe = rows[0];
  const found: Delivery[] = [];
  const read = async (keyed: FilterSql["keyed"]) => {
    const { sql, params } = searchSql("postgres", { ...filter, keyed }, { ...page, limit: page.limit - found.length });
    found.push(...(await client.query(toPg(sql), params)).rows.map(toDelivery));
  };
  if (Number(probe.n) <= DEFAULTS.searchWalkAbove || probe.newest === null) {
    await read(filter.keyed);
    return found;
  }
  const datedSince = Number(probe.dated_since);
  const within = (window: Parameters<typeof pgDatedKeys>[1]) =>
    read({ ...filter.keyed, keys: pgDatedKeys(needle, window) });
  // Every route of a delivery has route 0's received_at (a replay to a new destination copies it), by which
  // its row is indexed: a window's bounds hold all of them or none.
  let to = (page.after?.receivedAt ?? Number(probe.newest)) + 1;
  for (const span of WINDOWS) {
    const from = to - span;
    if (from < datedSince) break;
    await within({ periods: searchPeriods(from, to, span < DAY ? "hour" : "day"), from, to });
    if (found.length === page.limit) return found;
    to = from;
  }
  await within({ to });
  return found;
}

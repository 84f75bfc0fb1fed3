// search.ts: searching bodies through an index, in one place for both backends: what a search form asks
// (bodyJson, a JSON document the body contains; bodyWords, words its values hold), checked once; the SQL each
// backend runs for it (bodySearchSql()); and jsonContains(), PostgreSQL's jsonb @> in TypeScript, which SQLite
// registers to recheck what its FTS5 index found. The indexes themselves are migrations (search's entry in
// lib/sqlite/schema.ts and lib/postgres/schema.ts), which this SQL must match word for word. Not run on its own.

import { DEFAULTS } from "./defaults.ts";
import type { Backend, Filter, SqlValue } from "./store.ts";

/**
 * SearchOff is a bodyJson or bodyWords search asked of an inbox whose search index is off, or still being
 * filled: the index is opt-in (`inbox.ts search enable`), as it costs every store. The API answers it 409, the
 * page and the CLI print its message. bodyContains needs no index and is never refused.
 */
export class SearchOff extends Error {
  constructor(status: { enabled: boolean; backfilled: number; toBackfill: number }) {
    super(
      status.enabled
        ? `body search (bodyJson, bodyWords) is not ready: the index is being filled (${status.backfilled} of ${status.toBackfill} rows); \`inbox.ts search enable\` carries it on, \`inbox.ts search status\` says how far it got`
        : "body search (bodyJson, bodyWords) is off in this inbox: an operator turns it on with `inbox.ts search enable` (docs/operations.md#searching-bodies); bodyContains works without it",
    );
    this.name = "SearchOff";
  }
}

/**
 * SearchTooBroad is a body search (bodyJson, bodyWords, bodyContains) that ran past its bound
 * (DEFAULTS.searchTimeoutMs, or the inbox's searchTimeoutMs) and was stopped by the database: its words were
 * too common, or its time range too wide, to answer without reading most bodies. The API answers it 422, the
 * page prints its message, the CLI one line and exit 1. PostgreSQL only: node:sqlite cannot stop a statement.
 */
export class SearchTooBroad extends Error {
  /** Asked again as it is, it fails again: passing() (lib/errors.ts) must not take its 57014 cause for a blip. */
  readonly passing = false;
  constructor(timeoutMs: number, options?: ErrorOptions) {
    super(
      `body search stopped after ${timeoutMs} ms: it matches or reads too many bodies; narrow it by time (since, until) or source, or look for a rarer word (bodyJson finds a value whole)`,
      options,
    );
    this.name = "SearchTooBroad";
  }
}

/**
 * refusedSearch is the HTTP status the API and the page answer a refused search with: 409 when the index is
 * off (the request is sound, the inbox's state refuses it), 422 when it stopped at its bound (asked again as
 * it is, it fails again; narrowed, it answers); undefined for any other error.
 */
export function refusedSearch(error: unknown): 409 | 422 | undefined {
  return error instanceof SearchOff ? 409 : error instanceof SearchTooBroad ? 422 : undefined;
}

/** readsBodies says whether a filter reads bodies or the search index (bodyJson, bodyWords, bodyContains): the forms searchTimeoutMs bounds. */
export const readsBodies = (filter: {
  bodyJson?: string | undefined;
  bodyWords?: string | undefined;
  bodyContains?: string | undefined;
}): boolean => searching(filter) || filter.bodyContains !== undefined;

/**
 * indexAll runs an indexer (Inbox.indexSearch(), or a backend's own) a batch per transaction until a batch
 * comes back short, which says nothing is left, or until stopped says so: what a search form does before it
 * reads the index, and the worker's tick.
 */
export async function indexAll(index: (limit: number) => Promise<number>, stopped = () => false): Promise<void> {
  const batch = DEFAULTS.searchIndexBatch;
  while (!stopped() && (await index(batch)) === batch);
}

/** searching says whether a filter asks for a form only the search index answers (bodyJson, bodyWords). */
export const searching = (filter: { bodyJson?: string | undefined; bodyWords?: string | undefined }): boolean =>
  filter.bodyJson !== undefined || filter.bodyWords !== undefined;

/** SQLITE_CONTAINS names the function openDatabase registers on each SQLite connection: jsonContains over a stored body. */
export const SQLITE_CONTAINS = "inbox_json_contains";

// A word (or a value looked for) must hold a letter or a digit: a tokenizer drops everything else, and a
// phrase of no tokens matches nothing on one backend and everything on the other.
const WORDLIKE = /[\p{L}\p{N}]/u;

/**
 * boundBodyContains gives a list that looks for a substring of the body (bodyContains, which no index serves)
 * and names no start a start of windowMs before its end (until, else now), so that it reads a day's bodies
 * rather than every one; since is that start, undefined when the filter needed none. The list says so to
 * whoever asked, who may name an earlier since. Bulk commands do not call it: their filter is what they act on.
 */
export function boundBodyContains(
  filter: Filter,
  now: number,
  windowMs: number = DEFAULTS.bodyContainsWindowMs,
): { filter: Filter; since: number | undefined } {
  if (filter.bodyContains === undefined || filter.since !== undefined) return { filter, since: undefined };
  const since = (filter.until ?? now) - windowMs;
  return { filter: { ...filter, since }, since };
}

/**
 * parseBodyJson reads a bodyJson form: a JSON object or array the body must contain, as PostgreSQL's @> says.
 * It throws a TypeError unless the text is JSON of that shape holding at least one value an index can look
 * up (a string with a letter or digit, a whole number, true or false): nothing else narrows the search.
 */
export function parseBodyJson(text: string): unknown {
  let needle: unknown;
  try {
    needle = JSON.parse(text);
  } catch {
    throw new TypeError(
      `bodyJson: expected a JSON object such as {"data":{"object":{"customer":"cus_123"}}}, got ${text}`,
    );
  }
  if (needle === null || typeof needle !== "object")
    throw new TypeError(`bodyJson: expected a JSON object or array, got ${text}`);
  if (lookups(needle).length === 0)
    throw new TypeError(`bodyJson: expected at least one string, whole number or true/false to look for, got ${text}`);
  return needle;
}

/**
 * bodyWordsOf reads a bodyWords form: words separated by spaces, each of which a string, number or boolean
 * value of the body must hold (any case); a word of several tokens (cus_123, invoice.paid) is matched as a
 * phrase. It throws a TypeError when no word holds a letter or a digit.
 */
export function bodyWordsOf(text: string): string[] {
  const words = text.split(/\s+/).filter((w) => WORDLIKE.test(w));
  if (words.length === 0)
    throw new TypeError(`bodyWords: expected a word with a letter or a digit, got ${JSON.stringify(text)}`);
  return words;
}

// lookups lists the values of a needle an index can look up, as the words the index holds them by.
function lookups(needle: unknown): string[] {
  if (typeof needle === "string") return WORDLIKE.test(needle) ? [needle] : [];
  // A whole number is written the same by JSON.stringify and SQLite's json_tree; a fraction or an exponent
  // may not be, so it is left to the recheck alone.
  if (typeof needle === "number") return Number.isSafeInteger(needle) ? [String(needle)] : [];
  if (typeof needle === "boolean") return [String(needle)];
  if (needle === null) return [];
  return Object.values(needle as object).flatMap(lookups);
}

/**
 * jsonContains says whether doc contains needle as PostgreSQL's jsonb @> does: an object holds each of the
 * needle's keys with a value that contains the needle's; an array holds, for each element of the needle's,
 * one that contains it; a scalar is equal.
 */
export function jsonContains(doc: unknown, needle: unknown): boolean {
  if (Array.isArray(needle)) {
    if (!Array.isArray(doc)) return false;
    return needle.every((n) => doc.some((d) => jsonContains(d, n)));
  }
  if (needle !== null && typeof needle === "object") {
    if (doc === null || typeof doc !== "object" || Array.isArray(doc)) return false;
    return Object.entries(needle).every(
      ([k, n]) => Object.hasOwn(doc, k) && jsonContains((doc as Record<string, unknown>)[k], n),
    );
  }
  return doc === needle;
}

/**
 * searchableJson parses a stored body as the search indexes see it: its JSON value, or undefined when it is
 * past maxBytes, not UTF-8 or not JSON, which no body search finds.
 */
export function searchableJson(body: Uint8Array, maxBytes: number): unknown {
  if (body.byteLength > maxBytes) return undefined;
  try {
    return JSON.parse(UTF8.decode(body));
  } catch {
    return undefined;
  }
}

const UTF8 = new TextDecoder("utf-8", { fatal: true });

// An FTS5 phrase: the text in double quotes, a quote doubled; FTS5's tokenizer splits it as it split the body.
const phrase = (text: string) => `"${text.replaceAll('"', '""')}"`;

/**
 * bodySearchSql is the WHERE condition, with `?` parameters, for a filter's bodyJson and bodyWords in the
 * backend's dialect; it throws a TypeError for a form parseBodyJson or bodyWordsOf refuses.
 *
 * Both look in a table of their own, deliveries_search, that the indexer fills after a body is stored, and catches
 * up before this SQL runs (Inbox.indexSearch(), lib/sqlite/searching.ts, lib/postgres/searching.ts). PostgreSQL: each
 * delivery's JSON (doc), by its source and ID, under two GIN indexes, jsonb_path_ops for @> and a tsvector of its
 * strings, numbers and booleans, whose expression is spelled here as the migration spells it so that the planner
 * matches it; GIN is lossy, and PostgreSQL rechecks each row it finds. SQLite: an FTS5 table of the same values'
 * words, by the row's rowid; a containment looks up its needle's values there and rechecks each row found with
 * jsonContains.
 */
export function bodySearchSql(
  filter: { bodyJson?: string | undefined; bodyWords?: string | undefined },
  backend: Backend,
): { parts: BodySearchPart[]; keys?: MatchingKeys } {
  const parts: BodySearchPart[] = [];
  let keys: MatchingKeys | undefined;
  if (filter.bodyJson !== undefined) {
    const needle = parseBodyJson(filter.bodyJson);
    const text = JSON.stringify(needle);
    if (backend === "postgres") {
      keys = { where: "doc @> ?::jsonb", params: [text] };
      parts.push({ sql: pgMatching("doc @> ?::jsonb"), params: [text] });
    } else {
      const match = lookups(needle).map(phrase).join(" ");
      parts.push(
        {
          sql: "rowid IN (SELECT rowid FROM deliveries_search WHERE deliveries_search MATCH ?)",
          params: [match],
          match,
        },
        { sql: `${SQLITE_CONTAINS}(body, ?)`, params: [text], recheck: true },
      );
    }
  }
  if (filter.bodyWords !== undefined) {
    const words = bodyWordsOf(filter.bodyWords);
    if (backend === "postgres") {
      const query = words.map(() => "phraseto_tsquery('simple'::regconfig, ?::text)").join(" && ");
      keys ??= { where: `${PG_WORDS} @@ (${query})`, params: words };
      parts.push({ sql: pgMatching(`${PG_WORDS} @@ (${query})`), params: words });
    } else {
      const match = words.map(phrase).join(" ");
      parts.push({
        sql: "rowid IN (SELECT rowid FROM deliveries_search WHERE deliveries_search MATCH ?)",
        params: [match],
        match,
      });
    }
  }
  return keys === undefined ? { parts } : { parts, keys };
}

/**
 * BodySearchPart is one condition of a body search with its `?` parameters. recheck marks SQLite's check of a
 * containment against each body its words found, which reads and parses the body: a page applies it to the rows
 * in page order, until the page is full (searchSql()). match is, on SQLite, the FTS5 expression a part looks up,
 * which a walked page asks for as a set (lib/sqlite/searchwalk.ts).
 */
export interface BodySearchPart {
  sql: string;
  params: SqlValue[];
  recheck?: true;
  match?: string;
}

/**
 * MatchingKeys is, on PostgreSQL, a filter's first body search form as a condition on deliveries_search with its
 * `?` parameters, and the window of time a walk narrows it to: what a page of a body search reads newest first
 * (searchSql(), through pgKeysSql()).
 */
export interface MatchingKeys {
  where: string;
  params: SqlValue[];
  window?: KeysWindow;
}

/**
 * KeysWindow is a window of time: the matches received before `to` and from `from` on, found among the rows
 * indexed under one of `periods` (searchPeriods()) when it is given, where PostgreSQL intersects the form's entries
 * with the periods' in its GIN index (each holds periods beside the JSON or its words) and rechecks only what both
 * hold; without periods, among every row, those indexed without any included.
 */
export interface KeysWindow {
  periods?: string[];
  from?: number;
  to: number;
}

// pgMatching is the deliveries whose row in deliveries_search meets the condition (its `?` bound once).
// Spelled as a plain IN, the planner walks deliveries newest first and probes the search table row by row,
// hoping for 50 matches soon: seconds at a million for a needle with few. The matches are found once, through
// the GIN index, each rechecked (m, materialized); the two arrays are made of them, and the IN keeps each
// source with its own IDs. (The condition was spelled three times, once for each, and each was a scan of the
// index with a recheck of every match: three times the work for a needle with many.) They find the matches' keys in
// delivery_keys, with each route's received_at, and the rows are joined to those by all four: a nested loop
// into the partitioned delivery_rows whose every probe is pruned to its own day's partition (and the hot one)
// as it runs (docs/table.md#hot-and-cold). Probed with the arrays themselves, every day's partition was read
// for every match: 36 of them at ten million. OFFSET 0 keeps the keys a subquery of their own: flattened, the
// planner paired the rows with the search table's source and ID, and left received_at to a filter that prunes
// nothing.
const pgMatching = (condition: string) => `(source, id, route, received_at) IN (${pgMatchingKeys(condition)} OFFSET 0)`;

const pgMatchingKeys = (condition: string) =>
  `WITH m AS MATERIALIZED (SELECT source, id FROM deliveries_search WHERE ${condition})
     SELECT k.source, k.id, k.route, k.received_at FROM delivery_keys k
      WHERE k.source = ANY (ARRAY(SELECT DISTINCT source FROM m))
        AND k.id = ANY (ARRAY(SELECT id FROM m))
        AND (k.source, k.id) IN (SELECT source, id FROM m)`;

/**
 * pgKeysSql is the SELECT of the keys in delivery_keys (source, id, route, received_at) that a form matches,
 * within its window when it has one, with its `?` parameters.
 */
export function pgKeysSql(keys: MatchingKeys): { sql: string; params: SqlValue[] } {
  const { where, params, window } = keys;
  if (window === undefined) return { sql: pgMatchingKeys(where), params };
  const { periods, from, to } = window;
  return {
    sql: `SELECT * FROM (${pgMatchingKeys(periods === undefined ? where : `${where} AND periods && ?::text[]`)}) w
           WHERE received_at < ?::bigint${from === undefined ? "" : " AND received_at >= ?::bigint"}`,
    params: [
      ...params,
      ...(periods === undefined ? [] : [`{${periods.join(",")}}`]),
      to,
      ...(from === undefined ? [] : [from]),
    ],
  };
}

/**
 * searchPeriods is the periods a row received in [from, to) may be indexed under on PostgreSQL: its hours (`h`
 * and the hours since the epoch) or, by = "day", its days (`d`), as the migration's inbox_search_periods() spells
 * them for each row it indexes (lib/postgres/schema.ts).
 */
export function searchPeriods(from: number, to: number, by: "hour" | "day"): string[] {
  const [prefix, ms] = by === "hour" ? ["h", 3_600_000] : ["d", 86_400_000];
  const periods: string[] = [];
  for (let n = Math.floor(from / ms); n <= Math.floor((to - 1) / ms); n++) periods.push(`${prefix}${n}`);
  return periods;
}

// The expression of PostgreSQL's deliveries_search_words index, word for word.
const PG_WORDS = `jsonb_to_tsvector('simple'::regconfig, doc, '["string", "numeric", "boolean"]'::jsonb)`;

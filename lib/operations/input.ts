// lib/operations/input.ts: what the operator page and the API read from a request, checked: its form, the filter in its URL
// (so a link to a list can be shared), the cursor of a page, and a destination's name. A bad field is an
// HttpError with the status to answer and a message that says what was expected.

import type { IncomingMessage } from "node:http";
import { type Cursor, DESTINATION_NAME, STATUSES, type Delivery, type Filter, type Status } from "../store.ts";
import { parseDuration, utc } from "../format.ts";
import { bodyWordsOf, parseBodyJson } from "../search.ts";

const MAX_FORM_BYTES = 64 * 1024;

/** HttpError is a request the page refuses: its status, and a message for the person who sent it. */
export class HttpError extends Error {
  readonly status: number;
  constructor(status: number, message: string) {
    super(message);
    this.status = status;
  }
}

/** readForm reads a posted form, refusing another content type or one past 64 KiB. */
export async function readForm(req: IncomingMessage): Promise<URLSearchParams> {
  const type = req.headers["content-type"] ?? "";
  if (!type.startsWith("application/x-www-form-urlencoded"))
    throw new HttpError(415, "expected a form (application/x-www-form-urlencoded)");
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > MAX_FORM_BYTES) throw new HttpError(413, "form too large");
    chunks.push(chunk as Buffer);
  }
  return new URLSearchParams(Buffer.concat(chunks).toString("utf8"));
}

/** The filter fields as they appear in a URL, so a link to a list can be shared. */
const FILTER_FIELDS = [
  "status",
  "source",
  "destination",
  "type",
  "since",
  "until",
  "id",
  "q",
  "bodyJson",
  "bodyWords",
  "error",
] as const;

/**
 * parseTime reads a time field as the page, the API and the CLI take one: a number of ms since the epoch, an
 * ISO date (UTC when it names no zone), or an age ago (30m, 2h, 3d, 2w) from now.
 */
export function parseTime(value: string | number, field: string, now: number): number {
  if (typeof value === "number") return value;
  if (/^\d+$/.test(value)) return Number(value);
  const ago = parseDuration(value);
  if (ago !== undefined) return now - ago;
  const ms = Date.parse(/[zZ]|[+-]\d\d:?\d\d$/.test(value) ? value : `${value}Z`);
  if (Number.isNaN(ms))
    throw new HttpError(
      400,
      `${field}: expected a date such as 2026-12-02T19:00 (UTC), or an age ago such as 2h or 3d, got ${value}`,
    );
  return ms;
}

/** filterFrom reads a Filter from query or form fields, an age taken back from now; an empty field means no constraint. */
export function filterFrom(params: URLSearchParams, now: number): Filter {
  const get = (name: string) => params.get(name)?.trim() || undefined;
  const filter: Filter = {};
  const status = get("status");
  if (status !== undefined) {
    if (!(STATUSES as readonly string[]).includes(status))
      throw new HttpError(400, `status: expected one of ${STATUSES.join(", ")}, got ${status}`);
    filter.status = status as Status;
  }
  const [source, type, id, q, error, since, until, destination] = [
    "source",
    "type",
    "id",
    "q",
    "error",
    "since",
    "until",
    "destination",
  ].map(get);
  if (source !== undefined) filter.source = source;
  if (destination !== undefined) {
    if (!DESTINATION_NAME.test(destination))
      throw new HttpError(400, `destination: expected a destination's name, got ${destination}`);
    filter.destination = destination;
  }
  if (type !== undefined) filter.type = type;
  if (id !== undefined) filter.id = id;
  if (q !== undefined) filter.bodyContains = q;
  // Checked here, so that a form the index cannot answer is a 400 that says why, not a failed search.
  for (const [name, parse] of [
    ["bodyJson", parseBodyJson],
    ["bodyWords", bodyWordsOf],
  ] as const) {
    const value = get(name);
    if (value === undefined) continue;
    try {
      parse(value);
    } catch (error) {
      throw new HttpError(400, (error as Error).message);
    }
    filter[name] = value;
  }
  if (error !== undefined) filter.errorMatch = error;
  if (since !== undefined) filter.since = parseTime(since, "since", now);
  if (until !== undefined) filter.until = parseTime(until, "until", now);
  return filter;
}

/** filterQuery writes the filter fields of params (and extra ones) back as a query string. */
export function filterQuery(params: URLSearchParams, extra: Record<string, string> = {}): string {
  const out = new URLSearchParams();
  for (const name of FILTER_FIELDS) {
    const value = params.get(name)?.trim();
    if (value) out.set(name, value);
  }
  for (const [k, v] of Object.entries(extra)) out.set(k, v);
  return out.toString();
}

/** encodeCursor names a row for the next page's ?after=, route included: a delivery's rows (one per destination) may straddle two pages. */
export function encodeCursor(d: Delivery): string {
  return Buffer.from(JSON.stringify([d.receivedAt, d.source, d.id, d.route])).toString("base64url");
}

/** decodeCursor reads ?after=, refusing with a 400 what this page did not write. */
export function decodeCursor(text: string | null): Cursor | undefined {
  if (!text) return undefined;
  try {
    const [receivedAt, source, id, route] = JSON.parse(Buffer.from(text, "base64url").toString("utf8")) as unknown[];
    // A cursor from before destinations has no route: the store starts such a page past the whole delivery.
    if (
      typeof receivedAt === "number" &&
      typeof source === "string" &&
      typeof id === "string" &&
      (route === undefined || Number.isInteger(route))
    ) {
      return { receivedAt, source, id, ...(route === undefined ? {} : { route: route as number }) };
    }
  } catch {
    // Falls through to the 400 below: a cursor is only ever one this page wrote.
  }
  throw new HttpError(400, "after: not a cursor this page wrote");
}

/** destinationField reads a form's destination: undefined when none is named, a 400 when it is no name. */
export function destinationField(form: URLSearchParams): string | undefined {
  const name = form.get("destination");
  if (name === null || name === "") return undefined;
  if (!DESTINATION_NAME.test(name)) throw new HttpError(400, `destination: expected a destination's name, got ${name}`);
  return name;
}

/** bulkFilter is the filter a bulk action works on: retry takes the failed ones that match, replay the done ones. */
export function bulkFilter(params: URLSearchParams, kind: "retry" | "replay", now: number): Filter {
  const filter = filterFrom(params, now);
  const needed = kind === "retry" ? "failed" : "done";
  if (filter.status !== undefined && filter.status !== needed) {
    throw new HttpError(
      400,
      `only ${needed} deliveries can be ${kind === "retry" ? "retried" : "replayed"}; this filter asks for ${filter.status}`,
    );
  }
  return { ...filter, status: needed };
}

/** describe says a filter in words, for the confirmation and the audit line. */
export function describe(filter: Filter): string {
  const parts = Object.entries(filter)
    .filter(([, v]) => v !== undefined)
    .map(([k, v]) => `${k}=${k === "since" || k === "until" ? utc(v as number) : JSON.stringify(v)}`);
  return parts.length === 0 ? "everything" : parts.join(" ");
}

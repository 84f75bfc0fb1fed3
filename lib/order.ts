// order.ts: where a source's order key and event time come from. A sources file turns ordering on per
// source ("order"), with a preset for the providers whose key is clear; the receiver calls orderOfRequest
// on each verified delivery and stores what it finds. Not run on its own; see receiver.ts --sources.
//   "stripe": { "provider": "stripe", "secret": "env:STRIPE_SECRET", "order": true }
//   "app":    { "provider": "standard", "secret": "env:APP_SECRET", "order": { "key": "/data/id", "time": "/at", "strict": true } }

import type { Headers } from "./store.ts";

/** OrderRule is a source's ordering, as loadSources reads it from the sources file. */
export interface OrderRule {
  /** Where the key comes from: a JSON pointer into the body, a header, or a provider's preset. */
  key: { pointer: string[] } | { header: string } | { preset: string };
  /** A JSON pointer to the event time (seconds, ms or an ISO date); presets know their own. */
  time?: string[];
  /** A delivery set aside as failed blocks its key until it is retried, instead of letting later ones pass. @default false */
  strict: boolean;
}

/** Ordering is what the receiver hands to store() for one delivery. */
export interface Ordering {
  orderKey: string | null;
  eventTime: number | null;
  strictOrder: boolean;
}

/** ORDER_PRESETS says, per provider that has one, what its preset orders by; docs/ordering.md repeats it. */
export const ORDER_PRESETS: Readonly<Record<string, string>> = {
  stripe: "data.object.id (the object the event is about), in the event's created time",
  shopify:
    "admin_graphql_api_id (gid://shopify/Order/820982911946154508), else the topic's resource and a safe-integer id, in X-Shopify-Triggered-At, else updated_at",
  github:
    "repository.full_name and the issue or pull request number (octo/app#42), in its updated_at; other events are unordered",
};

const ORDER_KEYS = new Set(["key", "header", "time", "strict"]);

/**
 * parseOrder reads a source's "order" setting: true for the provider's preset, or an object with key (a
 * JSON pointer) or header, and optionally time (a JSON pointer) and strict. It throws a TypeError that
 * names the source and says what was expected.
 */
export function parseOrder(provider: string, setting: unknown, where: string): OrderRule | undefined {
  if (setting === undefined || setting === false) return undefined;
  const preset = () => {
    if (!(provider in ORDER_PRESETS)) {
      throw new TypeError(
        `${where}: order has no preset for ${provider}; expected {"key": "/json/pointer"} or {"header": "Name"} (presets: ${Object.keys(ORDER_PRESETS).join(", ")})`,
      );
    }
    return { preset: provider };
  };
  if (setting === true) return { key: preset(), strict: false };
  if (typeof setting !== "object" || setting === null || Array.isArray(setting)) {
    throw new TypeError(
      `${where}: expected order to be true or an object with key or header, got ${JSON.stringify(setting)}`,
    );
  }
  const o = setting as Record<string, unknown>;
  const unknown = Object.keys(o).filter((k) => !ORDER_KEYS.has(k));
  if (unknown.length > 0)
    throw new TypeError(
      `${where}: unknown order setting ${unknown.map((k) => JSON.stringify(k)).join(", ")}; expected key, header, time, strict`,
    );
  if (o.key !== undefined && o.header !== undefined)
    throw new TypeError(`${where}: give order a key or a header, not both`);
  if (o.strict !== undefined && typeof o.strict !== "boolean")
    throw new TypeError(`${where}: expected order.strict to be true or false, got ${JSON.stringify(o.strict)}`);
  if (o.header !== undefined && (typeof o.header !== "string" || !/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/.test(o.header))) {
    throw new TypeError(`${where}: expected order.header to be a header name, got ${JSON.stringify(o.header)}`);
  }
  const key =
    o.key !== undefined
      ? { pointer: pointer(o.key, `${where}: order.key`) }
      : o.header !== undefined
        ? { header: (o.header as string).toLowerCase() }
        : preset();
  const time = o.time === undefined ? undefined : pointer(o.time, `${where}: order.time`);
  return { key, ...(time ? { time } : {}), strict: o.strict === true };
}

// pointer parses an RFC 6901 JSON pointer ("/data/object/id") into its unescaped tokens.
function pointer(text: unknown, where: string): string[] {
  if (typeof text !== "string" || !text.startsWith("/") || /~[^01]|~$/.test(text)) {
    throw new TypeError(`${where}: expected a JSON pointer such as "/data/object/id", got ${JSON.stringify(text)}`);
  }
  return text
    .slice(1)
    .split("/")
    .map((t) => t.replaceAll("~1", "/").replaceAll("~0", "~"));
}

function at(value: unknown, path: readonly string[]): unknown {
  for (const token of path) {
    if (typeof value !== "object" || value === null || !Object.hasOwn(value, token)) return undefined;
    value = (value as Record<string, unknown>)[token];
  }
  return value;
}

// A key is text or a whole number; anything else (an object, a missing field) leaves the delivery unordered.
function keyText(value: unknown): string | null {
  if (typeof value === "string" && value !== "" && value.length <= 512) return value;
  return typeof value === "number" && Number.isSafeInteger(value) ? String(value) : null;
}

// A time is seconds or ms since the epoch (told apart by size), or an ISO date.
function timeOf(value: unknown): number | null {
  if (typeof value === "number" && Number.isFinite(value) && value > 0)
    return value < 1e11 ? Math.round(value * 1000) : Math.round(value);
  if (typeof value === "string" && value !== "") {
    const ms = Date.parse(value);
    return Number.isFinite(ms) ? ms : null;
  }
  return null;
}

function header(headers: Headers, name: string): string | undefined {
  const values = headers[name];
  return values?.length === 1 ? values[0] : undefined;
}

function preset(provider: string, headers: Headers, event: unknown): { key: string | null; time: number | null } {
  switch (provider) {
    case "stripe":
      return { key: keyText(at(event, ["data", "object", "id"])), time: timeOf(at(event, ["created"])) };
    case "shopify": {
      // Shopify's numeric IDs pass 2^53, which JSON.parse rounds; its GraphQL ID carries them as text.
      const gid = keyText(at(event, ["admin_graphql_api_id"]));
      const resource = header(headers, "x-shopify-topic")?.split("/")[0];
      const id = keyText(at(event, ["id"]));
      return {
        key: gid ?? (resource && id ? `${resource}:${id}` : null),
        time: timeOf(header(headers, "x-shopify-triggered-at")) ?? timeOf(at(event, ["updated_at"])),
      };
    }
    case "github": {
      const repo = keyText(at(event, ["repository", "full_name"]));
      const thing = at(event, ["pull_request"]) ?? at(event, ["issue"]);
      const number = keyText(at(thing, ["number"]));
      return { key: repo && number ? `${repo}#${number}` : null, time: timeOf(at(thing, ["updated_at"])) };
    }
    default:
      return { key: null, time: null };
  }
}

// What nearly every delivery gets, made once: callers only read (spread) it.
const UNORDERED: Ordering = Object.freeze({ orderKey: null, eventTime: null, strictOrder: false });

/**
 * orderOfRequest finds a verified delivery's order key and event time under its source's rule; with no
 * rule, or no key in this delivery, it is unordered. The event time falls back to the provider's signed
 * time in store().
 */
export function orderOfRequest(rule: OrderRule | undefined, headers: Headers, body: Buffer): Ordering {
  if (!rule) return UNORDERED;
  let event: unknown;
  const parsed = () => {
    try {
      event ??= JSON.parse(body.toString("utf8"));
    } catch {
      event = null;
    }
    return event;
  };
  let found: { key: string | null; time: number | null };
  if ("preset" in rule.key) found = preset(rule.key.preset, headers, parsed());
  else if ("header" in rule.key) found = { key: keyText(header(headers, rule.key.header)), time: null };
  else found = { key: keyText(at(parsed(), rule.key.pointer)), time: null };
  const time = rule.time ? timeOf(at(parsed(), rule.time)) : found.time;
  return { orderKey: found.key, eventTime: found.key === null ? null : time, strictOrder: rule.strict };
}

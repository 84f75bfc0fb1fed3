// routing/filter.ts: a route's "filter", the JSON syntax Hookdeck's and Convoy's filters share, compiled once at
// start-up into plain closures and checked when a delivery is stored (routes.ts routeTo, handler.ts). Not
// run on its own; docs/forwarding.md ("Filters") has the syntax and every place where the two gateways differ.
//   "routes": [{ "to": "billing", "filter": { "body": { "livemode": true, "data": { "object": { "amount_due": { "$gt": 10000 } } } } } }]

import { RE2JS } from "re2js";
import { DEFAULTS } from "../defaults.ts";

/** FilterInput is what a filter sees of a delivery; the receiver's is lazy (filterInput), so a body is parsed only if a filter reads it. */
export interface FilterInput {
  /** The parsed JSON body, or undefined when the body is not JSON (then it matches no body filter). */
  readonly body: unknown;
  /** Header names in lower case; a header sent once is a string, a repeated one a list. */
  readonly headers: Readonly<Record<string, string | string[]>>;
  /** The query string's parameters, the same way. */
  readonly query: Readonly<Record<string, string | string[]>>;
  /** The request's path, without its query. */
  readonly path: string;
  readonly source: string;
  /** The event type, or undefined where the provider's scheme found none. */
  readonly type: string | undefined;
}

/**
 * RouteFilter is a compiled route filter: true when the delivery matches. It never throws. reads names the
 * scopes it looks at (body, headers, …), so the receiver keeps the headers a header filter read (handler.ts).
 */
export type RouteFilter = ((input: FilterInput) => boolean) & { readonly reads: ReadonlySet<string> };

/** SCOPES are the parts of a delivery a filter may match, the top level's only keys besides $or, $and and $not. */
const SCOPES = ["body", "headers", "query", "path", "source", "type"] as const;

/** OPERATORS are the operators a filter may use. */
const OPERATORS = [
  "$eq",
  "$neq",
  "$gt",
  "$gte",
  "$lt",
  "$lte",
  "$in",
  "$nin",
  "$startsWith",
  "$endsWith",
  "$regex",
  "$exist",
  "$literal",
  "$or",
  "$and",
  "$not",
] as const;

const LOGICAL = new Set(["$or", "$and", "$not"]);
const KNOWN = new Set<string>(OPERATORS);

// Matcher tests one value of the delivery; undefined stands for a field that is missing.
type Matcher = (value: unknown) => boolean;

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);
const kindOf = (v: unknown) =>
  v === null
    ? "null"
    : Array.isArray(v)
      ? "a list"
      : isObject(v)
        ? "an object"
        : typeof v === "string"
          ? "a string"
          : typeof v;
const isPrimitive = (v: unknown): v is string | number | boolean | null =>
  v === null || typeof v === "string" || typeof v === "number" || typeof v === "boolean";

// regexLeft is how many characters the $regex tests of the filter now running may still read: each filter
// starts with DEFAULTS.filterRegexChars (compileFilter), and one that would read more matches nothing. RE2
// runs in time linear in what it reads, so this bounds the work of any one filter. Filters run one at a
// time (synchronously), so one counter serves them all.
let regexLeft = 0;
const OVER_BUDGET = Symbol("over the $regex budget");

// linear compiles a $regex with RE2 (re2js, pure JavaScript, so the same on Node, Deno and Bun), which runs
// in time linear in its input; what RE2 cannot run that way (a backreference, lookaround) is refused.
function linear(pattern: string, at: string): RE2JS {
  try {
    return RE2JS.compile(pattern);
  } catch (error) {
    let js = true;
    try {
      new RegExp(pattern);
    } catch {
      js = false;
    }
    const why = (error as Error).message.replace(/^error parsing regexp: /, "");
    return fail(
      at,
      js
        ? `the regular expression ${JSON.stringify(pattern)} needs backtracking (a backreference or lookaround), which RE2 refuses so that a match takes linear time: ${why}`
        : `the regular expression ${JSON.stringify(pattern)} does not compile: ${why}`,
    );
  }
}

// operatorKey finds where an operand holds a key starting with $, at any depth, or undefined.
function operatorKey(v: unknown, path: string): string | undefined {
  if (Array.isArray(v)) {
    for (const [i, x] of v.entries()) {
      const found = operatorKey(x, `${path}[${i}]`);
      if (found) return found;
    }
    return undefined;
  }
  if (!isObject(v)) return undefined;
  for (const [key, x] of Object.entries(v)) {
    if (key.startsWith("$")) return joined(path, key);
    const found = operatorKey(x, joined(path, key));
    if (found) return found;
  }
  return undefined;
}

// literal reads the value that $eq, $neq, or an item of $in's or $nin's list compares with. Such a value is
// taken as it is, so an operator inside it ({"$neq": {"$ref": "created_at"}}) would silently compare with
// an object: it is refused, and {"$literal": X} is the way to say X is meant as it is.
function literal(operand: unknown, at: string, op: string): unknown {
  if (isObject(operand) && Object.keys(operand).length === 1 && Object.hasOwn(operand, "$literal"))
    return operand.$literal;
  const found = operatorKey(operand, at);
  if (found === undefined) return operand;
  const key = found.slice(found.lastIndexOf(".") + 1);
  return fail(
    found,
    `${key === "$ref" ? "$ref (Hookdeck's reference to another field) is not supported here" : `${key} inside a value to compare with is not an operator here`}; the operand of ${op} is a value, and an object with keys starting with $ is written {"$literal": {...}}`,
  );
}

/** FilterError is a mistake in a filter: where it is (the route, then the path inside the filter) and what is wrong. */
class FilterError extends TypeError {}

/**
 * compileFilter checks a route's filter and compiles it once. where names the source and the route; a
 * mistake (an unknown operator or scope, an operand of the wrong type, a regex that does not compile)
 * throws a TypeError of one line: `source "stripe": route #2 (billing): filter at body.amount: …`.
 */
export function compileFilter(spec: unknown, where: string): RouteFilter {
  try {
    const reads = new Set<string>();
    const match = top(spec, "", reads);
    // Each filter starts with its own budget of text for $regex (see regexBudget).
    const filter = (input: FilterInput) => {
      regexLeft = DEFAULTS.filterRegexChars;
      try {
        return match(input);
      } catch {
        // Over the $regex budget, or a stack too deep: the filter does not match, whatever $not says.
        return false;
      }
    };
    return Object.assign(filter, { reads: reads as ReadonlySet<string> });
  } catch (error) {
    if (error instanceof FilterError) throw new TypeError(`${where}: filter${error.message}`);
    throw error;
  }
}

// fail throws a FilterError whose message carries the path inside the filter.
function fail(path: string, mistake: string): never {
  throw new FilterError(`${path ? ` at ${path}` : ""}: ${mistake}`);
}

const joined = (path: string, key: string) => (path ? `${path}.${key}` : key);

// top compiles the filter's top level: an object of scopes (body, headers, …) and $or/$and/$not of such objects.
function top(spec: unknown, path: string, reads: Set<string>): (input: FilterInput) => boolean {
  if (!isObject(spec))
    fail(
      path,
      `expected an object of ${SCOPES.join(", ")} (as Hookdeck's and Convoy's filters have), got ${kindOf(spec)}`,
    );
  const parts: ((input: FilterInput) => boolean)[] = [];
  for (const [key, value] of Object.entries(spec)) {
    if (key === "$or" || key === "$and") {
      const list = conditions(value, joined(path, key), (s, p) => top(s, p, reads));
      parts.push(key === "$or" ? (input) => list.some((m) => m(input)) : (input) => list.every((m) => m(input)));
    } else if (key === "$not") {
      const inner = top(value, joined(path, key), reads);
      parts.push((input) => !inner(input));
    } else if ((SCOPES as readonly string[]).includes(key)) {
      const scope = key as (typeof SCOPES)[number];
      reads.add(scope);
      const m = compile(
        scope === "headers" ? lowerNames(value) : scope === "path" ? convoyPath(value) : value,
        joined(path, key),
      );
      // One closure per scope, each reading one property: cheaper than input[scope] for every delivery.
      parts.push(
        scope === "body"
          ? (input) => m(input.body)
          : scope === "headers"
            ? (input) => m(input.headers)
            : scope === "query"
              ? (input) => m(input.query)
              : scope === "path"
                ? (input) => m(input.path)
                : scope === "source"
                  ? (input) => m(input.source)
                  : (input) => m(input.type),
      );
    } else {
      fail(
        joined(path, key),
        key.startsWith("$")
          ? `${key} cannot stand at the top; it goes inside one of ${SCOPES.join(", ")}`
          : `unknown part ${JSON.stringify(key)}; expected ${SCOPES.join(", ")}, or $or, $and, $not of them`,
      );
    }
  }
  return parts.length === 1 ? parts[0]! : (input) => parts.every((p) => p(input));
}

// conditions compiles the list of an $or or an $and.
function conditions<T>(value: unknown, path: string, each: (spec: unknown, path: string) => T): T[] {
  if (!Array.isArray(value) || value.length === 0)
    fail(path, `expected a list of conditions, got ${Array.isArray(value) ? "an empty list" : kindOf(value)}`);
  return value.map((spec, i) => each(spec, `${path}[${i}]`));
}

// lowerNames lower-cases header names, inside $or/$and/$not too, since header names are not case-sensitive.
function lowerNames(spec: unknown): unknown {
  if (!isObject(spec)) return spec;
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(spec)) {
    if (key === "$or" || key === "$and") out[key] = Array.isArray(value) ? value.map(lowerNames) : value;
    else if (key === "$not") out[key] = lowerNames(value);
    else out[key.startsWith("$") ? key : key.toLowerCase()] = value;
  }
  return out;
}

// convoyPath takes Convoy's spelling of a path filter, { "path": X }, as X: here the path is one string.
function convoyPath(spec: unknown): unknown {
  return isObject(spec) && Object.keys(spec).length === 1 && "path" in spec ? spec.path : spec;
}

/** compile turns one filter value into a Matcher: a plain value, a list, an object of fields, or operators. */
function compile(spec: unknown, path: string): Matcher {
  if (isPrimitive(spec)) return equals(spec);
  if (Array.isArray(spec)) {
    // A list matches a list that contains every one of its items (Hookdeck's "array contains (multiple)").
    const items = spec.map((item, i) => compile(item, `${path}[${i}]`));
    return (v) => Array.isArray(v) && items.every((m) => v.some((x) => m(x)));
  }
  if (!isObject(spec)) fail(path, `expected a JSON value, got ${kindOf(spec)}`);
  const parts: Matcher[] = [];
  const fields: [string, Matcher][] = [];
  let operators = 0;
  for (const [key, value] of Object.entries(spec)) {
    if (!key.startsWith("$")) {
      fields.push([key, compile(value, joined(path, key))]);
      continue;
    }
    if (!LOGICAL.has(key)) operators++;
    parts.push(operator(key, value, path));
  }
  if (operators > 0 && fields.length > 0) {
    fail(
      path,
      `mixes operators (${Object.keys(spec)
        .filter((k) => k.startsWith("$"))
        .join(
          ", ",
        )}) with fields (${fields.map(([k]) => k).join(", ")}); put the fields one level down, or join both with $and`,
    );
  }
  if (fields.length > 0 || parts.length === 0) {
    // An object matches an object whose fields match, or a list holding one such object (Hookdeck's "also valid").
    const one = (v: unknown) => {
      if (!isObject(v)) return false;
      for (const [key, m] of fields) if (!m(Object.hasOwn(v, key) ? v[key] : undefined)) return false;
      return true;
    };
    parts.push((v) => (Array.isArray(v) ? v.some(one) : one(v)));
  }
  return parts.length === 1 ? parts[0]! : (v) => parts.every((m) => m(v));
}

// anyOf applies a test to a value, or to each item of a list: an operator on a list matches if any item does.
const anyOf =
  (test: (x: unknown) => boolean): Matcher =>
  (v) =>
    Array.isArray(v) ? v.some(test) : v !== undefined && test(v);

// equals is the plain value's test, strict (1 is not "1"), with "array contains" for a list.
function equals(value: string | number | boolean | null): Matcher {
  return (v) => v === value || (Array.isArray(v) && v.includes(value));
}

// same is deep equality of JSON values.
function same(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (Array.isArray(a)) return Array.isArray(b) && a.length === b.length && a.every((x, i) => same(x, b[i]));
  if (!isObject(a) || !isObject(b)) return false;
  const keys = Object.keys(a);
  return keys.length === Object.keys(b).length && keys.every((k) => Object.hasOwn(b, k) && same(a[k], b[k]));
}

// operator compiles one $operator and its operand, checking the operand's type now rather than at each delivery.
function operator(key: string, operand: unknown, path: string): Matcher {
  const at = joined(path, key);
  const expect = (what: string): never =>
    fail(at, `expected ${what}, got ${kindOf(operand)}${isPrimitive(operand) ? ` ${JSON.stringify(operand)}` : ""}`);
  switch (key) {
    case "$literal":
    case "$eq":
    case "$neq": {
      if (operand === undefined) expect("a JSON value");
      // $literal's operand is a value as it is, whatever its keys; so is {"$literal": …} as $eq's or $neq's.
      const value = key === "$literal" ? operand : literal(operand, at, key);
      const eq = isPrimitive(value)
        ? equals(value)
        : (v: unknown) => same(v, value) || (Array.isArray(v) && v.some((x) => same(x, value)));
      // A missing field is not "not equal": only $exist: false (or $not) matches what is not there, as on Hookdeck.
      return key === "$neq" ? (v) => v !== undefined && !eq(v) : eq;
    }
    case "$gt":
    case "$gte":
    case "$lt":
    case "$lte": {
      if (!(typeof operand === "string" || (typeof operand === "number" && Number.isFinite(operand))))
        expect("a number, or a string to compare as text (an ISO date)");
      const kind = typeof operand;
      const x = operand as number | string;
      const test =
        key === "$gt"
          ? (v: unknown) => typeof v === kind && (v as number | string) > x
          : key === "$gte"
            ? (v: unknown) => typeof v === kind && (v as number | string) >= x
            : key === "$lt"
              ? (v: unknown) => typeof v === kind && (v as number | string) < x
              : (v: unknown) => typeof v === kind && (v as number | string) <= x;
      return anyOf(test);
    }
    case "$in":
    case "$nin": {
      let inside: Matcher;
      if (typeof operand === "string") {
        // Hookdeck's other form: the field's text contains the operand.
        inside = anyOf((v) => typeof v === "string" && v.includes(operand));
      } else if (Array.isArray(operand) && operand.length > 0) {
        const values = operand.map((x, i) => literal(x, `${at}[${i}]`, key));
        const plain = values.every(isPrimitive) ? new Set(values) : undefined;
        const test = plain ? (v: unknown) => plain.has(v as never) : (v: unknown) => values.some((x) => same(v, x));
        inside = anyOf(test);
      } else {
        return expect("a non-empty list of values (or, as on Hookdeck, a string the field's text contains)");
      }
      return key === "$in" ? inside : (v) => v !== undefined && !inside(v);
    }
    case "$startsWith":
    case "$endsWith": {
      if (typeof operand !== "string") expect("a string");
      const text = operand as string;
      return anyOf(
        key === "$startsWith"
          ? (v) => typeof v === "string" && v.startsWith(text)
          : (v) => typeof v === "string" && v.endsWith(text),
      );
    }
    case "$regex": {
      if (typeof operand !== "string") expect("a regular expression as a string");
      const re = linear(operand as string, at);
      return anyOf((v) => {
        if (typeof v !== "string") return false;
        regexLeft -= v.length;
        if (regexLeft < 0) throw OVER_BUDGET;
        return re.matcher(v).find();
      });
    }
    case "$exist": {
      if (typeof operand !== "boolean") expect("true or false");
      return operand ? (v) => v !== undefined : (v) => v === undefined;
    }
    case "$or":
    case "$and": {
      const list = conditions(operand, at, compile);
      return key === "$or" ? (v) => list.some((m) => m(v)) : (v) => list.every((m) => m(v));
    }
    case "$not": {
      if (operand === undefined) expect("a condition");
      const inner = compile(operand, at);
      return (v) => !inner(v);
    }
    default:
      if (key === "$ref") return fail(at, "$ref (Hookdeck's reference to another field) is not supported here");
      if (key.startsWith("$."))
        return fail(
          at,
          "Convoy's positional $. syntax is not supported; a filter on a list already matches any of its items",
        );
      if (KNOWN.has(key)) return fail(at, `${key} is not handled`);
      return fail(at, `unknown operator ${key}; expected one of ${OPERATORS.join(", ")}`);
  }
}

/** Arrival is what the receiver knows of a delivery when it stores it, for filterInput. */
export interface Arrival {
  source: string;
  eventType: string | null;
  body: Uint8Array;
  /** node:http's headersDistinct: names in lower case, repeats kept apart. */
  headers: Readonly<Record<string, readonly string[] | undefined>>;
  /** The request target; only its query is read (the path a filter sees is the source's own). */
  url: string;
  /** The body already parsed, where verifying the signature did (providers.ts), so it is not parsed twice. */
  parsed?: Record<string, unknown>;
}

/**
 * filterInput is a delivery as a filter sees it, each part worked out on first use and kept: the body is
 * parsed only if a filter reads it, once for every route.
 */
export function filterInput(arrival: Arrival): FilterInput {
  return new LazyInput(arrival);
}

// LazyInput is filterInput's object: a class, so its getters live on the prototype rather than being made
// for each delivery (an object literal with getters cost more than the filters themselves).
class LazyInput implements FilterInput {
  readonly source: string;
  readonly type: string | undefined;
  readonly #arrival: Arrival;
  #body: unknown = UNREAD;
  #headers?: Record<string, string | string[]>;
  #query?: Record<string, string | string[]>;

  constructor(arrival: Arrival) {
    this.#arrival = arrival;
    this.source = arrival.source;
    this.type = arrival.eventType ?? undefined;
  }

  get body(): unknown {
    if (this.#body === UNREAD) {
      const b = this.#arrival.body;
      // A body past the bounds is, to filters, not JSON: parsing deep nesting costs far more than its size says.
      if (b.byteLength > DEFAULTS.filterBodyBytes || tooDeep(b, DEFAULTS.filterDepth)) this.#body = undefined;
      else if (this.#arrival.parsed !== undefined) this.#body = this.#arrival.parsed;
      else {
        try {
          this.#body = JSON.parse(Buffer.from(b.buffer, b.byteOffset, b.byteLength).toString("utf8"));
        } catch {
          this.#body = undefined;
        }
      }
    }
    return this.#body;
  }

  get headers(): Record<string, string | string[]> {
    if (!this.#headers) {
      const headers: Record<string, string | string[]> = {};
      for (const name in this.#arrival.headers) {
        const values = this.#arrival.headers[name];
        if (values && values.length > 0) headers[name.toLowerCase()] = values.length === 1 ? values[0]! : [...values];
      }
      this.#headers = headers;
    }
    return this.#headers;
  }

  get query(): Record<string, string | string[]> {
    if (!this.#query) {
      const query: Record<string, string | string[]> = {};
      const url = this.#arrival.url;
      const q = url.indexOf("?");
      if (q >= 0) {
        for (const [name, value] of new URLSearchParams(url.slice(q + 1))) {
          const had = query[name];
          query[name] = had === undefined ? value : Array.isArray(had) ? [...had, value] : [had, value];
        }
      }
      this.#query = query;
    }
    return this.#query;
  }

  // The source's own path, whatever the mount: a basePath, or a slash more, must not route one delivery
  // differently on one mount than on another (nor than preview shows).
  get path(): string {
    return `/${this.#arrival.source}`;
  }
}

const UNREAD = Symbol("unread");

// tooDeep says whether JSON text nests lists and objects more than depth deep, reading no further than the
// first place where it does: a byte scan, outside strings, much cheaper than the parse it spares.
function tooDeep(b: Uint8Array, depth: number): boolean {
  let level = 0;
  let inString = false;
  for (let i = 0; i < b.length; i++) {
    const c = b[i]!;
    if (inString) {
      if (c === 0x5c)
        i++; // a backslash: the next byte is escaped
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) inString = true;
    else if (c === 0x5b || c === 0x7b) {
      if (++level > depth) return true;
    } else if (c === 0x5d || c === 0x7d) level--;
  }
  return false;
}

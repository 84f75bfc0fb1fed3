// routing/routes.ts: where each delivery goes. The sources file names destinations under "$destinations" (a key no
// source can have: "$" is not in a source name) and gives each source "routes"; a source without routes
// goes to the handler, as before. Not run on its own: loadSources (config/sources.ts) reads the routes, and
// worker.ts reads the destinations through loadDestinations. See docs/forwarding.md.
//   "$destinations": { "app": { "url": "https://app.internal/webhooks", "secret": "env:APP_FORWARD_SECRET" } },
//   "stripe": { "provider": "stripe", "secret": "env:STRIPE_SECRET", "routes": ["handler", { "to": "app", "types": ["invoice.*"] }] }

import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { DEFAULTS } from "../defaults.ts";
import type { Reach } from "../reach.ts";
import { isReference, plainName, readReference, type Values } from "../references.ts";
import { compileFilter, type FilterInput, type RouteFilter } from "./filter.ts";
import { DESTINATION_NAME, type BreakerPolicy } from "../store.ts";

/** Route is one of a source's routes: a destination, the deliveries it takes, how they are reshaped, and what a 4xx answer means. */
export interface Route {
  to: string;
  /** Glob patterns (`invoice.*`); a delivery whose event type matches none is not sent this way. @default every type */
  types?: RegExp[];
  /** The route's filter (filter.ts), compiled once; a delivery it does not match is not sent this way. @default every delivery */
  filter?: RouteFilter;
  /** The module that reshapes each forward this way (transform.ts); it overrides the destination's. @default the destination's, else none */
  transform?: TransformSetting;
  /** A 4xx answer (other than 408, 409, 425, 429) sets the delivery aside at once instead of retrying. @default false */
  permanent4xx: boolean;
  /** Whether the receiver keeps the provider's own headers for this route: its destination forwards them, or a transform may read them. */
  forwardHeaders: boolean;
}

/**
 * TransformSetting is a transform as the configuration wrote it, and its time limit: the path of a module
 * (the operator's file) or its code (`{"code": "…"}`, run in the sandbox: sandbox.ts).
 */
export interface TransformSetting {
  /**
   * What names it: the module's path as written (relative paths are taken from the sources file's folder,
   * worker.ts), or `code:` and the first 12 hex digits of its code's SHA-256.
   */
  module: string;
  /** Its JavaScript, when the configuration holds it; a module path's code is read when it is applied. */
  code?: string;
  /** The operator asked for the module to run in a child process of its own (`{"module": …, "process": true}`), not the sandbox. @default false */
  process?: boolean;
  /** @default DEFAULTS.transformTimeoutMs */
  timeoutMs: number;
}

/** HttpDestination is a destination reached over HTTP, as its entry in "$destinations" says. */
export interface HttpDestination {
  kind: "http";
  name: string;
  url: URL;
  /** Standard Webhooks secrets (whsec_ + base64, or raw text): each signs, so the app may rotate. */
  secrets: string[];
  /** Headers of its own (a bearer token, basic auth): read from the environment, never logged or shown. */
  headers: Record<string, string>;
  /** The names of those headers whose values are secrets (bearer, basic, env:NAME), redacted (redact.ts). @default every header */
  secretHeaders?: string[];
  connectTimeoutMs: number;
  timeoutMs: number;
  /** Requests in flight at once from one worker (the rate limit is the one shared by every worker). */
  maxInFlight: number;
  /** Most forwards per second, by every worker together. @default no limit */
  rate?: { perSecond: number; burst?: number };
  /** PEM of a private CA to trust, besides the system's. */
  ca?: string;
  /** Send the provider's own headers along (Stripe-Signature, X-Hub-Signature-256 …). */
  forwardHeaders: boolean;
  /** The breaker's policy, or false for none. */
  breaker: BreakerPolicy | false;
  /** The module that reshapes each forward here, unless the route names its own. @default none */
  transform?: TransformSetting;
  /** Where it may connect, when the API or the page set it (lib/reach.ts); the operator's own reach anything. @default anything */
  reach?: Reach;
}

/** BrokerDestination is a destination that publishes into a broker; brokers.ts reads its settings. */
export interface BrokerDestination {
  kind: "broker";
  name: string;
  type: string;
  settings: Record<string, unknown>;
  maxInFlight: number;
  rate?: { perSecond: number; burst?: number };
  breaker: BreakerPolicy | false;
  forwardHeaders: false;
  transform?: TransformSetting;
}

/** Destination is any configured destination; the handler is not one here, it is always there. */
export type Destination = HttpDestination | BrokerDestination;

/** Operator is where the inbox announces breakers, pauses and deliveries set aside, as signed Standard Webhooks events. */
export interface Operator {
  url: URL;
  secrets: string[];
  headers: Record<string, string>;
  /** The names of its headers whose values are secrets (bearer, basic, env:NAME). @default every header */
  secretHeaders?: string[];
  /** Where it may connect, when the API set it (lib/reach.ts). @default anything */
  reach?: Reach;
}

/** Forwarding is what the worker reads from a sources file: the destinations, and the operator's URL. */
export interface Forwarding {
  destinations: Map<string, Destination>;
  operator?: Operator;
}

/** TOP_KEYS are the sources file's own keys, beside the sources; none can clash with a source's name. */
export const TOP_KEYS = ["$destinations", "$operator"] as const;

const DESTINATION_KEYS = [
  "type",
  "url",
  "secret",
  "headers",
  "bearer",
  "basic",
  "timeout",
  "connectTimeout",
  "maxInFlight",
  "rate",
  "burst",
  "ca",
  "forwardHeaders",
  "breaker",
  "transform",
  "transformTimeout",
];
const BREAKER_KEYS = ["failures", "rate", "minTries", "window", "coolDown"];
const ROUTE_KEYS = ["to", "types", "filter", "transform", "transformTimeout", "permanent4xx"];

const isObject = (value: unknown): value is Record<string, unknown> =>
  typeof value === "object" && value !== null && !Array.isArray(value);
const kindOf = (value: unknown) => (value === null ? "null" : Array.isArray(value) ? "a list" : typeof value);

/** glob turns an event-type pattern into a RegExp: `*` stands for any run of characters, dots included. */
export function glob(pattern: string): RegExp {
  return new RegExp(
    `^${pattern
      .split("*")
      .map((part) => part.replace(/[.+?^${}()|[\]\\]/g, "\\$&"))
      .join(".*")}$`,
  );
}

/**
 * parseRoutes reads a source's "routes": a list of destination names or { to, types, filter, transform, transformTimeout, permanent4xx }. Each
 * must name a destination of the file or the handler. No routes means the handler alone.
 */
export function parseRoutes(setting: unknown, config: Record<string, unknown>, where: string): Route[] {
  const defined = isObject(config.$destinations) ? config.$destinations : {};
  // The receiver keeps the provider's headers where the destination forwards them or a transform may read them.
  const forwards = (to: string) =>
    isObject(defined[to]) && (defined[to]!.forwardHeaders === true || defined[to]!.transform !== undefined);
  if (setting === undefined) return [{ to: DEFAULTS.destination, permanent4xx: false, forwardHeaders: false }];
  if (!Array.isArray(setting) || setting.length === 0)
    throw new TypeError(`${where}: expected routes to be a list of destinations, got ${kindOf(setting)}`);
  const routes: Route[] = [];
  for (const [i, item] of setting.entries()) {
    const at = `${where}: route #${i + 1}`;
    const r = typeof item === "string" ? { to: item } : item;
    if (!isObject(r))
      throw new TypeError(
        `${at}: expected a destination's name or { "to": name, "types": [...] }, got ${kindOf(item)}`,
      );
    const unknown = Object.keys(r).filter((k) => !ROUTE_KEYS.includes(k));
    if (unknown.length > 0)
      throw new TypeError(
        `${at}: unknown setting ${unknown.map((k) => JSON.stringify(k)).join(", ")}; expected ${ROUTE_KEYS.join(", ")}`,
      );
    const to = r.to;
    // An own key of $destinations only: `in` would take "toString" for a destination too.
    if (typeof to !== "string" || (to !== DEFAULTS.destination && !Object.hasOwn(defined, to))) {
      const known = [DEFAULTS.destination, ...Object.keys(defined)].join(", ");
      throw new TypeError(
        `${at}: expected "to" to name a destination (${known}), got ${JSON.stringify(to) ?? "(none)"}`,
      );
    }
    if (routes.some((x) => x.to === to))
      throw new TypeError(`${at}: ${to} is routed to twice; give one route several types instead`);
    let types: RegExp[] | undefined;
    if (r.types !== undefined) {
      if (!Array.isArray(r.types) || r.types.length === 0 || r.types.some((t) => typeof t !== "string" || t === "")) {
        throw new TypeError(
          `${at}: expected types to be a list of event types or patterns such as "invoice.*", got ${JSON.stringify(r.types)}`,
        );
      }
      types = (r.types as string[]).map(glob);
    }
    if (r.permanent4xx !== undefined && typeof r.permanent4xx !== "boolean")
      throw new TypeError(`${at}: expected permanent4xx to be true or false, got ${JSON.stringify(r.permanent4xx)}`);
    const filter = r.filter === undefined ? undefined : compileFilter(r.filter, `${at} (${to})`);
    const transform = transformOf(r, `${at} (${to})`);
    if (transform && to === DEFAULTS.destination)
      throw new TypeError(
        `${at}: the handler gets each delivery as it was stored; a transform applies to destinations`,
      );
    routes.push({
      to,
      ...(types ? { types } : {}),
      ...(filter ? { filter } : {}),
      ...(transform ? { transform } : {}),
      permanent4xx: r.permanent4xx === true,
      forwardHeaders: forwards(to) || transform !== undefined,
    });
  }
  return routes;
}

/**
 * routeTo picks the destinations of a delivery of this event type, in the routes' order: types first (the
 * cheaper test), then the filter against input (filter.ts filterInput). A route with a filter takes
 * nothing when no input is given.
 */
export function routeTo(routes: readonly Route[], eventType: string | null, input?: FilterInput): string[] {
  const chosen: string[] = [];
  for (const r of routes) if (refusal(r, eventType, input) === undefined) chosen.push(r.to);
  return chosen;
}

/**
 * chooseRoutes fixes a delivery's routes at store time: the destinations routeTo() picks, and whether its
 * headers are kept, for the routes that forward them and wherever a filter read them, so that `preview`,
 * and whatever looks at the delivery later, sees what the filter saw when it chose.
 */
export function chooseRoutes(
  routes: readonly Route[],
  eventType: string | null,
  input?: FilterInput,
): { destinations: string[]; keepHeaders: boolean } {
  const destinations = routeTo(routes, eventType, input);
  const keepHeaders = routes.some(
    (r) => (r.forwardHeaders && destinations.includes(r.to)) || r.filter?.reads.has("headers") === true,
  );
  return { destinations, keepHeaders };
}

/** refusal says which test of a route a delivery fails, types first (the cheaper), or undefined if the route takes it. */
export function refusal(
  route: Route,
  eventType: string | null,
  input?: FilterInput,
): "its types" | "its filter" | undefined {
  if (route.types !== undefined && (eventType === null || !route.types.some((t) => t.test(eventType))))
    return "its types";
  if (route.filter !== undefined && (input === undefined || !route.filter(input))) return "its filter";
  return undefined;
}

// transformOf reads "transform" and "transformTimeout" (seconds) of a route or a destination.
function transformOf(settings: Record<string, unknown>, where: string): TransformSetting | undefined {
  const module = settings.transform;
  if (module === undefined) {
    if (settings.transformTimeout !== undefined)
      throw new TypeError(`${where}: transformTimeout applies only with transform`);
    return undefined;
  }
  let code: string | undefined;
  let name: string;
  let process = false;
  if (isObject(module) && "module" in module) {
    // The operator's module, in a child process, asked for explicitly: the only way to use npm packages.
    const extra = Object.keys(module).filter((k) => k !== "module" && k !== "process");
    if (
      typeof module.module !== "string" ||
      !/\.(ts|mts|js|mjs)$/.test(module.module) ||
      module.process !== true ||
      extra.length > 0
    )
      throw new TypeError(
        `${where}: expected transform to be {"module": "<path of a .ts, .mts, .js or .mjs file>", "process": true} (a module run in a child process of its own), got ${JSON.stringify(module)}`,
      );
    name = module.module;
    process = true;
  } else if (isObject(module)) {
    const extra = Object.keys(module).filter((k) => k !== "code");
    if (typeof module.code !== "string" || module.code.trim() === "" || extra.length > 0)
      throw new TypeError(
        `${where}: expected transform to be {"code": "<JavaScript>"} (and no other key), got ${JSON.stringify(Object.keys(module))}`,
      );
    if (Buffer.byteLength(module.code) > DEFAULTS.sandboxCodeBytes)
      throw new TypeError(
        `${where}: transform code is longer than ${DEFAULTS.sandboxCodeBytes} bytes, the most it may be`,
      );
    code = module.code;
    name = `code:${createHash("sha256").update(code).digest("hex").slice(0, 12)}`;
  } else if (typeof module !== "string" || !/\.(ts|mts|js|mjs)$/.test(module)) {
    throw new TypeError(
      `${where}: expected transform to be {"code": "<JavaScript>"} or the path of a module (.ts, .mts, .js or .mjs) whose default export reshapes each forward, got ${JSON.stringify(module)}`,
    );
  } else name = module;
  return {
    module: name,
    ...(code === undefined ? {} : { code }),
    ...(process ? { process } : {}),
    timeoutMs: seconds(
      settings.transformTimeout,
      DEFAULTS.transformTimeoutMs,
      where,
      "transformTimeout",
      DEFAULTS.maxTransformTimeoutMs,
    ),
  };
}

// secretsOf reads one secret or several; a reference (env:NAME, secret:NAME) is read from env. With resolve
// false (the receiver, which forwards nothing), only their shape is checked, so it needs none of the worker's secrets.
function secretsOf(value: unknown, env: Values, where: string, resolve: boolean, required: boolean): string[] {
  const list = value === undefined ? [] : Array.isArray(value) ? value : [value];
  if (list.some((s) => typeof s !== "string" || s === ""))
    throw new TypeError(`${where}: expected secret to be a string or a list of strings`);
  if (required && list.length === 0)
    throw new TypeError(
      `${where}: missing secret; it signs each forward (write "env:NAME" to read it from the environment)`,
    );
  return (list as string[]).map((text, i) =>
    readReference(text, env, `${where}: ${list.length > 1 ? `secret #${i + 1}` : "secret"}`, resolve),
  );
}

// seconds reads a duration written in seconds, above 0 and at most maxMs (each setting's documented bound).
function seconds(value: unknown, fallbackMs: number, where: string, setting: string, maxMs: number): number {
  if (value === undefined) return fallbackMs;
  if (typeof value !== "number" || !Number.isFinite(value) || value <= 0 || value * 1000 > maxMs)
    throw new TypeError(
      `${where}: expected ${setting} to be a number of seconds above 0 and at most ${maxMs / 1000}, got ${JSON.stringify(value)}`,
    );
  return Math.round(value * 1000);
}

// whole reads a count, 1 or more and at most max.
function whole(value: unknown, fallback: number, where: string, setting: string, max: number): number {
  if (value === undefined) return fallback;
  if (!Number.isInteger(value) || (value as number) < 1 || (value as number) > max)
    throw new TypeError(
      `${where}: expected ${setting} to be a whole number from 1 to ${max}, got ${JSON.stringify(value)}`,
    );
  return value as number;
}

function httpUrl(value: unknown, where: string): URL {
  let url: URL | undefined;
  try {
    url = typeof value === "string" ? new URL(value) : undefined;
  } catch {
    url = undefined;
  }
  if (!url || !/^https?:$/.test(url.protocol))
    throw new TypeError(
      `${where}: expected url to be an http:// or https:// address, got ${JSON.stringify(value) ?? "(none)"}`,
    );
  if (url.username || url.password)
    throw new TypeError(
      `${where}: put credentials in "bearer", "basic" or "headers" (from the environment), not in the url`,
    );
  return url;
}

// ownHeaders reads a destination's headers, bearer and basic; secretHeaders names those that are secrets (a
// value written in the file is not one, and redacting it would blank ordinary words in the errors shown).
function ownHeaders(
  settings: Record<string, unknown>,
  env: Values,
  where: string,
  resolve: boolean,
): { headers: Record<string, string>; secretHeaders: string[] } {
  const headers: Record<string, string> = {};
  const secretHeaders: string[] = [];
  if (settings.headers !== undefined) {
    if (!isObject(settings.headers))
      throw new TypeError(
        `${where}: expected headers to map header names to values (or env:NAME, secret:NAME), got ${kindOf(settings.headers)}`,
      );
    for (const [name, value] of Object.entries(settings.headers)) {
      if (!/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/.test(name))
        throw new TypeError(`${where}: expected a header name, got ${JSON.stringify(name)}`);
      if (typeof value !== "string")
        throw new TypeError(`${where}: expected header ${name} to be a string (or env:NAME, secret:NAME)`);
      headers[name.toLowerCase()] = readReference(value, env, `${where}: header ${name}`, resolve);
      if (isReference(value)) secretHeaders.push(name.toLowerCase());
    }
  }
  if (settings.bearer !== undefined && settings.basic !== undefined)
    throw new TypeError(`${where}: give bearer or basic, not both`);
  if (settings.bearer !== undefined) {
    if (typeof settings.bearer !== "string" || !isReference(settings.bearer))
      throw new TypeError(
        `${where}: expected bearer to be env:NAME or secret:NAME (a token is never written in the file)`,
      );
    headers.authorization = `Bearer ${readReference(settings.bearer, env, `${where}: bearer`, resolve)}`;
  }
  if (settings.basic !== undefined) {
    if (typeof settings.basic !== "string" || !isReference(settings.basic))
      throw new TypeError(`${where}: expected basic to be env:NAME or secret:NAME holding user:password`);
    const pair = readReference(settings.basic, env, `${where}: basic`, resolve);
    if (resolve && !pair.includes(":"))
      throw new TypeError(`${where}: basic reads user:password from the environment; the value has no ":"`);
    headers.authorization = `Basic ${Buffer.from(pair).toString("base64")}`;
  }
  // Authorization is a credential however it was written.
  if (headers.authorization !== undefined && !secretHeaders.includes("authorization"))
    secretHeaders.push("authorization");
  return { headers, secretHeaders };
}

function breakerOf(value: unknown, where: string): BreakerPolicy | false {
  if (value === false) return false;
  if (value !== undefined && !isObject(value))
    throw new TypeError(
      `${where}: expected breaker to be false or { failures, rate, minTries, window, coolDown }, got ${kindOf(value)}`,
    );
  const b = value ?? {};
  const unknown = Object.keys(b).filter((k) => !BREAKER_KEYS.includes(k));
  if (unknown.length > 0)
    throw new TypeError(
      `${where}: unknown breaker setting ${unknown.map((k) => JSON.stringify(k)).join(", ")}; expected ${BREAKER_KEYS.join(", ")}`,
    );
  const rate = b.rate ?? DEFAULTS.breakerRate;
  if (typeof rate !== "number" || !(rate > 0 && rate <= 1))
    throw new TypeError(
      `${where}: expected breaker.rate to be a share of failed tries, above 0 and at most 1, got ${JSON.stringify(rate)}`,
    );
  return {
    failures: whole(b.failures, DEFAULTS.breakerFailures, where, "breaker.failures", DEFAULTS.maxCount),
    rate,
    minTries: whole(b.minTries, DEFAULTS.breakerMinTries, where, "breaker.minTries", DEFAULTS.maxCount),
    windowMs: seconds(b.window, DEFAULTS.breakerWindowMs, where, "breaker.window", DEFAULTS.maxBreakerMs),
    coolDownMs: seconds(b.coolDown, DEFAULTS.breakerCoolDownMs, where, "breaker.coolDown", DEFAULTS.maxBreakerMs),
  };
}

/**
 * loadDestinations reads "$destinations" and "$operator" from a parsed sources file. Secrets and headers
 * are read from env (`env:NAME`, `secret:NAME`); with resolve false only their shape is checked (the receiver's start-up). It
 * throws a TypeError naming the destination and the mistake, never a secret. brokerCheck, where given,
 * checks a broker destination's own settings (brokers.ts).
 */
export function loadDestinations(
  config: unknown,
  env: Values,
  options: {
    resolve?: boolean;
    brokerCheck?: (name: string, settings: Record<string, unknown>, where: string) => void;
  } = {},
): Forwarding {
  const resolve = options.resolve ?? true;
  const destinations = new Map<string, Destination>();
  if (!isObject(config)) return { destinations };
  for (const key of Object.keys(config)) {
    if (key.startsWith("$") && !(TOP_KEYS as readonly string[]).includes(key))
      throw new TypeError(
        `sources: unknown key ${JSON.stringify(key)}; expected a source's name or one of ${TOP_KEYS.join(", ")}`,
      );
  }
  const section = config.$destinations;
  if (section !== undefined && !isObject(section))
    throw new TypeError(
      `$destinations: expected an object mapping destination names to settings, got ${kindOf(section)}`,
    );
  for (const [name, settings] of Object.entries(section ?? {})) {
    const where = `destination ${JSON.stringify(name)}`;
    if (!plainName(name, DESTINATION_NAME))
      throw new TypeError(`${where}: expected a name of letters, digits, ".", "_", "~" or "-" (not "." or "..")`);
    if (name === DEFAULTS.destination)
      throw new TypeError(`${where}: the name is the handler's (worker.ts), which is always there; pick another`);
    if (!isObject(settings))
      throw new TypeError(`${where}: expected an object with url and secret, got ${kindOf(settings)}`);
    const type = settings.type ?? "http";
    const rate =
      settings.rate === undefined
        ? undefined
        : {
            perSecond: ratePerSecond(settings.rate, where),
            ...(settings.burst === undefined
              ? {}
              : { burst: whole(settings.burst, 1, where, "burst", DEFAULTS.maxRate) }),
          };
    if (settings.rate === undefined && settings.burst !== undefined)
      throw new TypeError(`${where}: burst applies only with rate`);
    if (type !== "http") {
      if (typeof type !== "string" || !/^[a-z]+$/.test(type))
        throw new TypeError(`${where}: expected type to be http or a broker's name, got ${JSON.stringify(type)}`);
      if (!options.brokerCheck)
        throw new TypeError(`${where}: type ${type} is not known here (brokers: see docs/forwarding.md)`);
      options.brokerCheck(name, settings, where);
      const transform = transformOf(settings, where);
      destinations.set(name, {
        kind: "broker",
        name,
        type,
        settings,
        maxInFlight: whole(
          settings.maxInFlight,
          DEFAULTS.forwardInFlight,
          where,
          "maxInFlight",
          DEFAULTS.maxForwardInFlight,
        ),
        ...(rate ? { rate } : {}),
        breaker: breakerOf(settings.breaker, where),
        forwardHeaders: false,
        ...(transform ? { transform } : {}),
      });
      continue;
    }
    const unknown = Object.keys(settings).filter((k) => !DESTINATION_KEYS.includes(k));
    if (unknown.length > 0)
      throw new TypeError(
        `${where}: unknown setting ${unknown.map((k) => JSON.stringify(k)).join(", ")}; expected ${DESTINATION_KEYS.join(", ")}`,
      );
    if (settings.forwardHeaders !== undefined && typeof settings.forwardHeaders !== "boolean")
      throw new TypeError(`${where}: expected forwardHeaders to be true or false`);
    let ca: string | undefined;
    if (settings.ca !== undefined) {
      if (typeof settings.ca !== "string" || settings.ca === "")
        throw new TypeError(`${where}: expected ca to be the path of a PEM file`);
      if (resolve) {
        try {
          ca = readFileSync(settings.ca, "utf8");
        } catch (error) {
          throw new TypeError(`${where}: cannot read the ca file ${settings.ca}: ${(error as Error).message}`);
        }
        if (!ca.includes("-----BEGIN CERTIFICATE-----"))
          throw new TypeError(`${where}: the ca file ${settings.ca} holds no PEM certificate`);
      }
    }
    const transform = transformOf(settings, where);
    destinations.set(name, {
      kind: "http",
      name,
      url: httpUrl(settings.url, where),
      secrets: secretsOf(settings.secret, env, where, resolve, true),
      ...ownHeaders(settings, env, where, resolve),
      connectTimeoutMs: seconds(
        settings.connectTimeout,
        DEFAULTS.connectTimeoutForwardMs,
        where,
        "connectTimeout",
        DEFAULTS.maxForwardTimeoutMs,
      ),
      timeoutMs: seconds(settings.timeout, DEFAULTS.forwardTimeoutMs, where, "timeout", DEFAULTS.maxForwardTimeoutMs),
      maxInFlight: whole(
        settings.maxInFlight,
        DEFAULTS.forwardInFlight,
        where,
        "maxInFlight",
        DEFAULTS.maxForwardInFlight,
      ),
      ...(rate ? { rate } : {}),
      ...(ca ? { ca } : {}),
      forwardHeaders: settings.forwardHeaders === true,
      breaker: breakerOf(settings.breaker, where),
      ...(transform ? { transform } : {}),
    });
  }
  let operator: Operator | undefined;
  if (config.$operator !== undefined) {
    const o = config.$operator;
    if (!isObject(o)) throw new TypeError(`$operator: expected { "url": ..., "secret": ... }, got ${kindOf(o)}`);
    const unknown = Object.keys(o).filter((k) => !["url", "secret", "headers", "bearer", "basic"].includes(k));
    if (unknown.length > 0)
      throw new TypeError(
        `$operator: unknown setting ${unknown.map((k) => JSON.stringify(k)).join(", ")}; expected url, secret, headers, bearer, basic`,
      );
    operator = {
      url: httpUrl(o.url, "$operator"),
      secrets: secretsOf(o.secret, env, "$operator", resolve, true),
      ...ownHeaders(o, env, "$operator", resolve),
    };
  }
  return { destinations, ...(operator ? { operator } : {}) };
}

function ratePerSecond(value: unknown, where: string): number {
  if (typeof value !== "number" || !Number.isFinite(value) || value <= 0 || value > DEFAULTS.maxRate)
    throw new TypeError(
      `${where}: expected rate to be forwards per second, above 0 and at most ${DEFAULTS.maxRate}, got ${JSON.stringify(value)}`,
    );
  return value;
}

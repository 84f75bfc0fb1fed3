// lib/config/sources.ts: a sources file read and checked whole: readSourcesFile() parses it without quoting
// a secret, loadSources() turns it into the receiver's sources (signature schemes from providers.ts, routes,
// ordering, reconcile and broker settings, each checked where it is defined). It is also the package's
// "./providers" export, so it re-exports what providers.ts gives an app: sign(), verify() and their types.

import { readFileSync } from "node:fs";
import { parseBrokerSource } from "../consume.ts";
import { DEFAULTS } from "../defaults.ts";
import { parseOrder } from "../order.ts";
import {
  COMPILED,
  compile,
  isObject,
  kindOf,
  list,
  PROVIDERS,
  type Provider,
  type Scheme,
  secretKey,
  type Source,
  TIMED,
} from "../providers.ts";
import { parseReconcile } from "../reconcile/config.ts";
import { keyOf, readReference, referenceOf, type Values } from "../references.ts";
import { parseRoutes, TOP_KEYS } from "../routing/routes.ts";

export * from "../providers.ts";

/** SourceSettings is one entry of a sources file, as written; an `hmac` source adds the Scheme's settings. */
export interface SourceSettings extends Partial<Scheme> {
  provider: Provider;
  /** One secret or several (any verifies, so a rotation holds both); `env:NAME` reads the environment, `secret:NAME` the inbox's secret store. Optional for plain only. */
  secret?: string | string[];
  /** Seconds; only for schemes that sign a timestamp. @default the preset's, else DEFAULT_TOLERANCE_S */
  tolerance?: number;
  /** The URL the sender posts to, as it was given it; only, and always, for schemes that sign {url}. */
  url?: string;
  /** Per-key ordering: true for the provider's preset, or { key | header, time?, strict? } (order.ts). */
  order?: unknown;
  /** Where its deliveries go: destinations of "$destinations", or the handler (routes.ts). @default ["handler"] */
  routes?: unknown;
  /** A broker to consume instead of an HTTP path, with provider "plain" or none (consume.ts). @default none */
  broker?: unknown;
}

const SETTINGS_KEYS = ["provider", "secret", "tolerance", "url", "order", "routes", "reconcile", "broker"];
const SCHEME_KEYS = [
  "header",
  "prefix",
  "separator",
  "algorithm",
  "encoding",
  "signed",
  "id",
  "eventType",
  "timestamp",
  "timestampUnit",
  "ahead",
];

/**
 * readSourcesFile reads and parses a sources file. Its error says where the JSON broke but quotes none of
 * the text, which may hold a secret.
 */
export function readSourcesFile(path: string): unknown {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (error) {
    throw new Error(`cannot read the sources file: ${(error as Error).message}`);
  }
  try {
    return JSON.parse(text);
  } catch (error) {
    // V8 quotes a piece of the text in JSON errors, and that piece may hold a secret: keep only where.
    throw new Error(
      `the sources file is not valid JSON${/ at position \d+/.exec((error as Error).message)?.[0] ?? ""}`,
    );
  }
}

/**
 * loadSources turns a parsed sources file into the receiver's sources, keyed by URL path name. It reads
 * its secrets' references (`env:NAME`, `secret:NAME`) from env, and throws a TypeError naming the source and the mistake (never a secret).
 * A "reconcile" setting is checked; its API credential is read only with options.reconcile (inbox.ts
 * reconcile), so the receiver and the worker never need it in their environment. With options.verify
 * false (the worker and the page, which verify no signature and only redact the secrets they know), a
 * secret whose variable is not set is left out rather than refused.
 */
export function loadSources(
  config: unknown,
  env: Values,
  options: { reconcile?: boolean; verify?: boolean } = {},
): Map<string, Source> {
  if (!isObject(config)) {
    throw new TypeError(`sources: expected a JSON object mapping source names to settings, got ${kindOf(config)}`);
  }
  const sources = new Map<string, Source>();
  for (const [name, settings] of Object.entries(config)) {
    // The file's own keys ("$destinations", "$operator") start with "$", which no source name can.
    if ((TOP_KEYS as readonly string[]).includes(name)) continue;
    if (name.startsWith("$"))
      throw new TypeError(
        `sources: unknown key ${JSON.stringify(name)}; expected a source's name or one of ${TOP_KEYS.join(", ")}`,
      );
    const where = `source ${JSON.stringify(name)}`;
    // The name becomes the URL path, so it must be one plain path segment.
    if (!/^[A-Za-z0-9._~-]+$/.test(name) || name === "." || name === "..") {
      throw new TypeError(`${where}: expected a name of letters, digits, ".", "_", "~" or "-" (it is the URL path)`);
    }
    if (!isObject(settings))
      throw new TypeError(`${where}: expected an object with provider and secret, got ${kindOf(settings)}`);

    // A broker source's messages carry no HTTP signature: its provider is plain, written or not.
    const provider = settings.broker !== undefined && settings.provider === undefined ? "plain" : settings.provider;
    if (typeof provider !== "string" || !(PROVIDERS as readonly string[]).includes(provider)) {
      throw new TypeError(
        `${where}: unknown provider ${JSON.stringify(provider) ?? "(none)"}; expected one of ${PROVIDERS.join(", ")}`,
      );
    }
    const p = provider as Provider;
    const allowed = p === "hmac" ? [...SETTINGS_KEYS, ...SCHEME_KEYS] : SETTINGS_KEYS;
    const unknown = Object.keys(settings).filter((key) => !allowed.includes(key));
    if (unknown.length > 0) {
      const hint =
        p !== "hmac" && unknown.some((k) => SCHEME_KEYS.includes(k)) ? ` (scheme settings need provider "hmac")` : "";
      throw new TypeError(
        `${where}: unknown setting ${unknown.map((k) => JSON.stringify(k)).join(", ")}; expected ${allowed.join(", ")}${hint}`,
      );
    }
    let scheme: Scheme | undefined;
    if (p === "hmac") {
      scheme = Object.fromEntries(
        SCHEME_KEYS.filter((k) => settings[k] !== undefined).map((k) => [k, settings[k]]),
      ) as unknown as Scheme;
      if (settings.tolerance !== undefined) scheme.tolerance = settings.tolerance as number;
    }
    const compiled = p === "hmac" ? compile(scheme!, where) : COMPILED[p];

    const written = settings.secret;
    const secretList = list(written);
    if (secretList.some((s) => typeof s !== "string"))
      throw new TypeError(`${where}: expected secret to be a string or a list of strings`);
    if (secretList.length === 0 && p !== "plain") {
      throw new TypeError(
        `${where}: missing secret; a ${p} source needs one (write "env:NAME" to read it from the environment)`,
      );
    }
    const unread = (text: string) => {
      const ref = options.verify === false ? referenceOf(text) : undefined;
      return ref !== undefined && !env[keyOf(ref)];
    };
    const secrets = (secretList as string[]).flatMap((text, i) => {
      if (unread(text)) return [];
      const which = secretList.length > 1 ? `secret #${i + 1}` : "secret";
      const value = readReference(text, env, `${where}: ${which}`);
      if (value === "") throw new TypeError(`${where}: ${which} is empty`);
      return [secretKey(p, value, `${where}: ${which}`)];
    });

    let toleranceS = 0;
    if (compiled.timestamp) {
      const t = settings.tolerance ?? compiled.tolerance;
      if (typeof t !== "number" || !Number.isInteger(t) || t < 1 || t > DEFAULTS.maxToleranceS)
        throw new TypeError(
          `${where}: expected tolerance to be a whole number of seconds from 1 to ${DEFAULTS.maxToleranceS}, got ${JSON.stringify(t)}`,
        );
      toleranceS = t;
    } else if (settings.tolerance !== undefined) {
      throw new TypeError(
        p === "hmac"
          ? `${where}: tolerance applies only with a timestamp`
          : `${where}: tolerance applies only to ${TIMED.join(", ")}; ${p} signs no timestamp`,
      );
    }

    let url: string | undefined;
    if (compiled.uses.has("url")) {
      const u = settings.url;
      let parsed: URL | undefined;
      try {
        parsed = typeof u === "string" ? new URL(u) : undefined;
      } catch {
        parsed = undefined;
      }
      if (!parsed || !/^https?:$/.test(parsed.protocol) || parsed.search || parsed.hash) {
        throw new TypeError(
          `${where}: expected url to be the address the sender posts to, as it was given it (https://host/path, no query: the request's own is added), got ${JSON.stringify(u) ?? "(none)"}`,
        );
      }
      url = u as string;
    } else if (settings.url !== undefined) {
      throw new TypeError(
        `${where}: url applies only to schemes that sign {url} (square, twilio, or hmac with {url} in signed)`,
      );
    }
    const order = parseOrder(p, settings.order, where);
    const routes = parseRoutes(settings.routes, config, where);
    if (settings.broker !== undefined && p !== "plain")
      throw new TypeError(
        `${where}: a broker source takes provider "plain" or none; a broker's message carries no ${p} signature`,
      );
    const broker = settings.broker === undefined ? undefined : parseBrokerSource(settings.broker, where, env);
    sources.set(name, {
      name,
      provider: p,
      secrets,
      toleranceS,
      ...(url ? { url } : {}),
      ...(scheme ? { scheme } : {}),
      ...(order ? { order } : {}),
      ...(settings.routes !== undefined ? { routes } : {}),
      ...(settings.reconcile !== undefined
        ? { reconcile: parseReconcile(p, settings.reconcile, env, where, options.reconcile ?? false) }
        : {}),
      ...(broker ? { broker } : {}),
    });
  }
  if (sources.size === 0) throw new TypeError("sources: expected at least one source, got an empty object");
  return sources;
}

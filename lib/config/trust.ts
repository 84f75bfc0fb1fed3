// config/trust.ts: the trust rule, in one place. What the operator writes on the host (a file, by `config
// apply`, `--sources` or SIGHUP) is trusted as it always was; what arrives through the API or the page reaches
// no environment variable, no address and no file that the operator did not hand it. trustOf() says whose
// hand wrote each part of a document, from the way it came and the version before it; checkDocument() holds
// every part the API wrote to the operator's Policy. plan() runs both for every way in, and a worker runs the
// check again on the version it takes up. See docs/security.md.

import { parseAllow, Reach } from "../reach.ts";
import { referencesIn, type Values } from "../references.ts";
import type { Way } from "../store.ts";

/** Trust says, per part of a document (`source NAME`, `destination NAME`, `$operator`), whose hand wrote it. */
export type Trust = Record<string, Way>;

/** Policy is what the operator hands the API: environment variables it may name, and where it may connect. */
export interface Policy {
  /** The names an API-written part may read with env:NAME (INBOX_API_ENV). */
  apiEnv: ReadonlySet<string>;
  /** Where an API-written destination may connect (INBOX_API_DESTINATIONS_ALLOW, and the inbox's own ports). */
  reach: Reach;
}

/**
 * policyFrom reads the operator's Policy from a script's environment: INBOX_API_ENV (names, comma-separated)
 * and INBOX_API_DESTINATIONS_ALLOW (CIDRs); ownPorts are the ports the inbox's scripts listen on. A value
 * that cannot be read is a TypeError of one line.
 */
export function policyFrom(env: Values, ownPorts: readonly number[] = []): Policy {
  const names = (env.INBOX_API_ENV ?? "")
    .split(",")
    .map((n) => n.trim())
    .filter(Boolean);
  for (const n of names)
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(n))
      throw new TypeError(`INBOX_API_ENV: expected names of environment variables, separated by commas; got ${n}`);
  return {
    apiEnv: new Set(names),
    reach: new Reach({ allow: parseAllow(env.INBOX_API_DESTINATIONS_ALLOW), ownPorts }),
  };
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

/** partsOf lists a document's parts with their settings: each source, each destination, and `$operator`. */
export function partsOf(parsed: unknown): Map<string, unknown> {
  const out = new Map<string, unknown>();
  if (!isObject(parsed)) return out;
  for (const [key, value] of Object.entries(parsed)) {
    if (key === "$destinations" && isObject(value))
      for (const [name, d] of Object.entries(value)) out.set(`destination ${name}`, d);
    else out.set(key.startsWith("$") ? key : `source ${key}`, value);
  }
  return out;
}

/**
 * trustOf says whose hand wrote each part of a document that came by way. From the operator, every part is
 * the operator's. Through the API, a part left exactly as the version in force has it keeps that version's
 * trust (its own entry, else that version's way); a part the API changed or added is the API's.
 */
export function trustOf(parsed: unknown, way: Way, before?: { parsed: unknown; trust: Trust; way: Way }): Trust {
  const now = partsOf(parsed);
  const was = partsOf(before?.parsed);
  const out: Trust = {};
  for (const [part, value] of now) {
    if (way === "operator") out[part] = "operator";
    else if (before && was.has(part) && canonical(was.get(part)) === canonical(value))
      out[part] = before.trust[part] ?? before.way;
    else out[part] = "api";
  }
  return out;
}

/** canonical is a JSON text with its keys sorted, so a part written in another order is the same part. */
export function canonical(value: unknown): string {
  return JSON.stringify(value, (_key, v: unknown) =>
    isObject(v) ? Object.fromEntries(Object.entries(v).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) : v,
  );
}

// The settings whose value is a secret when it is not a reference; a URL only when it holds a password.
const SECRET_KEYS = new Set(["secret", "pass", "token"]);

/** inTheClear says whether a setting's value is a secret written as it is, rather than as a reference. */
export function inTheClear(key: string, value: unknown): boolean {
  const clear = (v: unknown) => typeof v === "string" && !v.startsWith("env:") && !v.startsWith("secret:");
  if (SECRET_KEYS.has(key)) return Array.isArray(value) ? value.some(clear) : clear(value);
  if (key !== "url" || !clear(value)) return false;
  try {
    return new URL(value as string).password !== "";
  } catch {
    return false;
  }
}

/** holders lists the settings objects of a part that may hold a secret: the part, and its broker. */
export function holders(part: unknown): Record<string, unknown>[] {
  if (!isObject(part)) return [];
  return [part, ...(isObject(part.broker) ? [part.broker] : [])];
}

/**
 * checkDocument holds every part the API wrote (trust "api") to the operator's Policy, and throws a
 * TypeError of one line, naming the part, at the first thing it may not do: name an environment variable
 * INBOX_API_ENV does not allow (refused before it is read, set or not), hold a secret in the clear (it belongs
 * in the secret store), name a file on the host (a CA, a transform module), or aim a destination, the operator's URL, a broker
 * or a reconcile API at an address the rule refuses: a literal in any spelling, and a name as the resolver
 * answers now. At apply every address is checked ("all"). A process that runs a version checks again only
 * those no connection hook will ("unhooked": a broker's servers, a reconcile API): an HTTP destination's
 * and the operator's URL are held to its own Policy at each connection, on the address connected to
 * (lib/reach.ts), so one it may not reach fails its forwards rather than stopping the rest. With
 * sourcesOnly (the receiver, which reads nothing else), only the sources are checked. The operator's parts
 * pass as they are.
 */
export async function checkDocument(
  parsed: unknown,
  trust: Trust,
  policy: Policy,
  options: { addresses: "all" | "unhooked"; sourcesOnly?: boolean },
): Promise<void> {
  for (const [part, value] of partsOf(parsed)) {
    if ((trust[part] ?? "api") !== "api") continue;
    // A process that reads only the sources (the receiver) holds only them to the rule: the rest is the
    // worker's to read, and to refuse.
    if (options.sourcesOnly && !part.startsWith("source ")) continue;
    for (const { ref, path } of referencesIn(value))
      if (ref.kind === "env" && !policy.apiEnv.has(ref.name))
        throw new TypeError(
          `${part}: ${path.join(".")} names the environment variable ${ref.name}, which a change through the API may not read (the operator allows names with INBOX_API_ENV); set a secret instead (PUT /api/v1/secrets/{name}) and write secret:NAME`,
        );
    for (const where of transformPaths(value))
      throw new TypeError(
        `${part}: ${where} names a module file on the host, which a change through the API may not (only the operator's file may); write the transform as {"code": "<JavaScript>"}, run in the sandbox`,
      );
    for (const settings of holders(value))
      for (const [key, v] of Object.entries(settings)) {
        if (inTheClear(key, v))
          throw new TypeError(
            `${part}: ${key} holds a secret in the clear; set it as a secret (PUT /api/v1/secrets/{name}) and write secret:NAME`,
          );
        if (key === "ca")
          throw new TypeError(
            `${part}: ca names a file on the host, which a change through the API may not; only the operator's file may`,
          );
      }
    for (const { where, url, hooked } of addressesOf(part, value)) {
      if (hooked && options.addresses === "unhooked") continue;
      const why = await policy.reach.resolve(url);
      if (why) throw new TypeError(`${part}: ${where} ${why}`);
    }
  }
}

// transformPaths lists where a part names a transform by a module's path: its own "transform", its routes'.
function transformPaths(value: unknown): string[] {
  if (!isObject(value)) return [];
  const names = (t: unknown) => typeof t === "string" || (isObject(t) && "module" in t);
  const out = names(value.transform) ? ["transform"] : [];
  if (Array.isArray(value.routes))
    value.routes.forEach((r, i) => {
      if (isObject(r) && names(r.transform)) out.push(`routes[${i}].transform`);
    });
  return out;
}

// addressesOf lists the URLs a part connects to, each with whether its connections are checked by a hook
// (an HTTP destination's or the operator's url, through undici) or not (a broker's servers, a reconcile
// API's base). A reference is left unread; a URL that does not parse is left to the part's own checks.
function addressesOf(part: string, value: unknown): { where: string; url: URL; hooked: boolean }[] {
  if (!isObject(value)) return [];
  const urls: { where: string; text: unknown; hooked: boolean }[] = [];
  if (part.startsWith("destination ") || part === "$operator")
    urls.push({ where: "url", text: value.url, hooked: value.type === undefined || value.type === "http" });
  if (isObject(value.broker)) urls.push({ where: "broker url", text: value.broker.url, hooked: false });
  if (isObject(value.reconcile))
    urls.push({ where: "reconcile apiBase", text: value.reconcile.apiBase, hooked: false });
  const out: { where: string; url: URL; hooked: boolean }[] = [];
  for (const { where, text, hooked } of urls) {
    if (typeof text !== "string" || text.startsWith("env:") || text.startsWith("secret:")) continue;
    for (const one of text.split(",")) {
      try {
        out.push({ where, url: new URL(one.trim()), hooked });
      } catch {
        // Not a URL: the part's own checks say so.
      }
    }
  }
  return out;
}

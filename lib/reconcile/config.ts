// reconcile/config.ts: a source's "reconcile" setting in the sources file, checked once at start-up:
// which provider API to ask for what it failed to deliver, with which credential (`env:NAME` or
// `secret:NAME`, read here, listed in credentials so that lib/redact.ts keeps it out of every output).
// docs/reconcile.md.

import { isReference, readReference, type Values } from "../references.ts";
//   "stripe": { "provider": "stripe", "secret": "env:WHSEC", "reconcile": { "apiKey": "env:STRIPE_KEY" } }

/** StripeReconcile is a Stripe source's reconcile setting: `GET /v1/events` with a restricted key. */
export interface StripeReconcile {
  provider: "stripe";
  apiKey: string;
  /** Up to 20 event types to ask for; none asks for every type. */
  types?: string[];
  /** Ask only for what Stripe has not delivered (delivery_success=false). @default true */
  onlyFailed: boolean;
  /** Another API address (a test server, a proxy): http(s)://host:port. @default Stripe's own */
  apiBase?: string;
  /** The values never to show: the API key. */
  credentials: string[];
}

/** GithubHook says whose hook's deliveries to list: an app's, a repository's or an organization's. */
export type GithubHook =
  | { kind: "app"; appId: string; privateKey: string }
  | { kind: "repo"; owner: string; repo: string; hookId: number; token: string }
  | { kind: "org"; org: string; hookId: number; token: string };

/** GithubReconcile is a GitHub source's reconcile setting: a hook's deliveries, fetched or redelivered. */
export interface GithubReconcile {
  provider: "github";
  hook: GithubHook;
  /** "fetch" stores each missing delivery from its request; "redeliver" asks GitHub to send it again, signed. @default "fetch" */
  mode: "fetch" | "redeliver";
  /** Another API address (GitHub Enterprise Server, a test server). @default https://api.github.com */
  apiBase?: string;
  /** The values never to show: the token or the app's private key. */
  credentials: string[];
}

/** ReconcileSettings is what a source's "reconcile" setting becomes. */
export type ReconcileSettings = StripeReconcile | GithubReconcile;

/** RECONCILE_PROVIDERS are the providers whose API reconcile knows. */
export const RECONCILE_PROVIDERS = ["stripe", "github"] as const;

/**
 * parseReconcile checks a source's "reconcile" setting and, with read, reads its credential's reference
 * from env (without, the credential is left empty: the receiver and the worker check the setting but
 * never hold the key). It throws a TypeError naming the source and the mistake, never the credential.
 */
export function parseReconcile(
  provider: string,
  setting: unknown,
  env: Values,
  where: string,
  read = true,
): ReconcileSettings {
  const at = `${where}: reconcile`;
  if (typeof setting !== "object" || setting === null || Array.isArray(setting))
    throw new TypeError(`${at}: expected an object`);
  const s = setting as Record<string, unknown>;
  const only = (keys: string[]) => {
    const unknown = Object.keys(s).filter((k) => !keys.includes(k));
    if (unknown.length > 0)
      throw new TypeError(
        `${at}: unknown setting ${unknown.map((k) => JSON.stringify(k)).join(", ")}; expected ${keys.join(", ")}`,
      );
  };
  const text = (key: string): string => {
    if (typeof s[key] !== "string" || s[key] === "")
      throw new TypeError(`${at}: expected ${key} to be a non-empty string`);
    return s[key] as string;
  };
  const credential = (key: string): string => {
    const written = text(key);
    // Written into the file, a credential would be in every copy of it: only a reference is taken.
    if (!isReference(written))
      throw new TypeError(
        `${at}: expected ${key} to be "env:NAME" or "secret:NAME", a variable or a secret of the store that holds it`,
      );
    return readReference(written, env, `${at}: ${key}`, read);
  };
  const apiBase = (): string | undefined => {
    if (s.apiBase === undefined) return undefined;
    const u = text("apiBase");
    if (!/^https?:\/\/[^/?#]+(\/[^?#]*)?$/.test(u))
      throw new TypeError(`${at}: expected apiBase to be http(s)://host[:port][/path]`);
    return u.replace(/\/+$/, "");
  };
  const base = apiBase();
  if (provider === "stripe") {
    only(["apiKey", "types", "onlyFailed", "apiBase"]);
    // The stripe SDK takes a host, a port and a protocol: a path would be dropped without a word.
    if (base && new URL(base).pathname !== "/")
      throw new TypeError(`${at}: expected apiBase to be http(s)://host[:port], with no path`);
    const apiKey = credential("apiKey");
    const types = s.types;
    if (
      types !== undefined &&
      (!Array.isArray(types) ||
        types.length === 0 ||
        types.length > 20 ||
        types.some((t) => typeof t !== "string" || t === ""))
    )
      throw new TypeError(`${at}: expected types to be a list of 1 to 20 event types (Stripe's limit)`);
    if (s.onlyFailed !== undefined && typeof s.onlyFailed !== "boolean")
      throw new TypeError(`${at}: expected onlyFailed to be true or false`);
    return {
      provider: "stripe",
      apiKey,
      ...(types ? { types: types as string[] } : {}),
      onlyFailed: (s.onlyFailed as boolean | undefined) ?? true,
      ...(base ? { apiBase: base } : {}),
      credentials: apiKey ? [apiKey] : [],
    };
  }
  if (provider === "github") {
    const kind = s.hook;
    const mode = s.mode ?? "fetch";
    if (mode !== "fetch" && mode !== "redeliver")
      throw new TypeError(`${at}: expected mode to be "fetch" or "redeliver"`);
    const hookId = (): number => {
      if (typeof s.hookId !== "number" || !Number.isSafeInteger(s.hookId) || s.hookId < 1)
        throw new TypeError(`${at}: expected hookId to be the hook's number`);
      return s.hookId;
    };
    let hook: GithubHook;
    if (kind === "app") {
      only(["hook", "appId", "privateKey", "mode", "apiBase"]);
      const appId = typeof s.appId === "number" ? String(s.appId) : text("appId");
      hook = { kind: "app", appId, privateKey: credential("privateKey") };
    } else if (kind === "repo") {
      only(["hook", "owner", "repo", "hookId", "token", "mode", "apiBase"]);
      hook = { kind: "repo", owner: text("owner"), repo: text("repo"), hookId: hookId(), token: credential("token") };
    } else if (kind === "org") {
      only(["hook", "org", "hookId", "token", "mode", "apiBase"]);
      hook = { kind: "org", org: text("org"), hookId: hookId(), token: credential("token") };
    } else throw new TypeError(`${at}: expected hook to be "app", "repo" or "org"`);
    const secret = hook.kind === "app" ? hook.privateKey : hook.token;
    return { provider: "github", hook, mode, ...(base ? { apiBase: base } : {}), credentials: secret ? [secret] : [] };
  }
  throw new TypeError(
    `${at}: a ${provider} source has no API to reconcile from; reconcile knows ${RECONCILE_PROVIDERS.join(", ")}`,
  );
}

// providers.ts: how each sender signs its webhooks and where it puts the delivery ID. The receiver calls
// verify() on the raw bytes before anything is stored; send.ts calls sign() to sign like a provider.
// Not run on its own; see receiver.ts --sources and send.ts --provider.

import { createHmac, timingSafeEqual } from "node:crypto";
import { DEFAULTS } from "./inbox.ts";
import { parseOrder, type OrderRule } from "./order.ts";

/** Provider names a signature scheme the receiver can check. */
export type Provider = "standard" | "stripe" | "github" | "shopify" | "slack" | "plain";
/** PROVIDERS lists every scheme, in the order the README's table gives them. */
export const PROVIDERS: readonly Provider[] = ["standard", "stripe", "github", "shopify", "slack", "plain"];

/** TIMED are the providers that sign a timestamp, so a replayed delivery goes stale. */
export const TIMED: readonly Provider[] = ["standard", "stripe", "slack"];

/** DEFAULT_TOLERANCE_S is how old (or, for standard and slack, how far ahead) a signed timestamp may be. */
export const DEFAULT_TOLERANCE_S: number = DEFAULTS.signatureToleranceS;

/** Source is one configured sender: its name (the URL path), its scheme and its secrets. */
export interface Source {
  name: string;
  provider: Provider;
  /** Any one of these verifies, which is how secrets are rotated. Empty means unsigned. */
  secrets: Buffer[];
  /** Seconds a signed timestamp may be off, for schemes that sign one. */
  toleranceS: number;
  /** Per-key ordering (order.ts); none means its deliveries are unordered. */
  order?: OrderRule;
}

/** Headers are a request's headers with repeats kept apart, as node:http's headersDistinct gives them. */
export type Headers = Record<string, string[] | undefined>;

/** Verdict is verify()'s answer: a delivery to store, a reply to send instead, or a rejection. */
export type Verdict =
  | { kind: "delivery"; id: string; eventType: string | null; providerTime: number | null }
  | { kind: "reply"; status: number; contentType: string; body: string }
  | { kind: "reject"; status: 400 | 401; reason: string };

/** unsignedSource is the article's sender: one source, `default`, at `/`, reading X-Delivery-Id. */
export function unsignedSource(): Source {
  return { name: DEFAULTS.source, provider: "plain", secrets: [], toleranceS: 0 };
}

// ---- Sources ---------------------------------------------------------------------------------------

/** SourceSettings is one entry of a sources file, as written. */
export interface SourceSettings {
  provider: Provider;
  /** One secret or several (any verifies); `env:NAME` reads the environment. Optional for plain only. */
  secret?: string | string[];
  /** Seconds; only for standard, stripe and slack. @default DEFAULT_TOLERANCE_S */
  tolerance?: number;
  /** Per-key ordering: true for the provider's preset, or { key | header, time?, strict? } (order.ts). */
  order?: unknown;
}

const SETTINGS_KEYS = new Set(["provider", "secret", "tolerance", "order"]);

/**
 * loadSources turns a parsed sources file into the receiver's sources, keyed by URL path name. It reads
 * `env:NAME` secrets from env, and throws a TypeError naming the source and the mistake (never a secret).
 */
export function loadSources(config: unknown, env: Readonly<Record<string, string | undefined>>): Map<string, Source> {
  if (!isObject(config)) {
    throw new TypeError(`sources: expected a JSON object mapping source names to settings, got ${kindOf(config)}`);
  }
  const sources = new Map<string, Source>();
  for (const [name, settings] of Object.entries(config)) {
    const where = `source ${JSON.stringify(name)}`;
    // The name becomes the URL path, so it must be one plain path segment.
    if (!/^[A-Za-z0-9._~-]+$/.test(name) || name === "." || name === "..") {
      throw new TypeError(`${where}: expected a name of letters, digits, ".", "_", "~" or "-" (it is the URL path)`);
    }
    if (!isObject(settings)) throw new TypeError(`${where}: expected an object with provider and secret, got ${kindOf(settings)}`);
    const unknown = Object.keys(settings).filter((key) => !SETTINGS_KEYS.has(key));
    if (unknown.length > 0) throw new TypeError(`${where}: unknown setting ${unknown.map((k) => JSON.stringify(k)).join(", ")}; expected provider, secret, tolerance, order`);

    const provider = settings.provider;
    if (typeof provider !== "string" || !(PROVIDERS as readonly string[]).includes(provider)) {
      throw new TypeError(`${where}: unknown provider ${JSON.stringify(provider) ?? "(none)"}; expected one of ${PROVIDERS.join(", ")}`);
    }
    const p = provider as Provider;

    const written = settings.secret;
    const list = written === undefined ? [] : Array.isArray(written) ? written : [written];
    if (list.some((s) => typeof s !== "string")) throw new TypeError(`${where}: expected secret to be a string or a list of strings`);
    if (list.length === 0 && p !== "plain") {
      throw new TypeError(`${where}: missing secret; a ${p} source needs one (write "env:NAME" to read it from the environment)`);
    }
    const secrets = (list as string[]).map((text, i) => {
      const which = list.length > 1 ? `secret #${i + 1}` : "secret";
      let value = text;
      if (text.startsWith("env:")) {
        const variable = text.slice(4);
        value = env[variable] ?? "";
        if (!variable || value === "") throw new TypeError(`${where}: ${which} reads the environment variable ${variable || "(no name)"}, which is not set`);
      }
      if (value === "") throw new TypeError(`${where}: ${which} is empty`);
      return secretKey(p, value, `${where}: ${which}`);
    });

    let toleranceS = 0;
    if (TIMED.includes(p)) {
      const t = settings.tolerance ?? DEFAULT_TOLERANCE_S;
      if (typeof t !== "number" || !Number.isInteger(t) || t < 1) throw new TypeError(`${where}: expected tolerance to be a whole number of seconds, 1 or more, got ${JSON.stringify(t)}`);
      toleranceS = t;
    } else if (settings.tolerance !== undefined) {
      throw new TypeError(`${where}: tolerance applies only to ${TIMED.join(", ")}; ${p} signs no timestamp`);
    }
    const order = parseOrder(p, settings.order, where);
    sources.set(name, { name, provider: p, secrets, toleranceS, ...(order ? { order } : {}) });
  }
  if (sources.size === 0) throw new TypeError("sources: expected at least one source, got an empty object");
  return sources;
}

/**
 * secretKey turns a secret as the provider hands it out into the HMAC key: Standard Webhooks' `whsec_`
 * + base64 is decoded; Stripe's `whsec_…` is used whole; the others are used as they are. It throws a
 * TypeError, prefixed with context, for a value that cannot be right.
 */
export function secretKey(provider: Provider, secret: string, context: string = provider): Buffer {
  if (provider === "standard") {
    const encoded = secret.startsWith("whsec_") ? secret.slice(6) : "";
    // Re-encoding catches what Node's lenient base64 decoder would silently skip.
    const key = Buffer.from(encoded, "base64");
    if (!encoded || key.length === 0 || key.toString("base64") !== encoded) {
      throw new TypeError(`${context} is not a whsec_ secret: expected whsec_ followed by base64, as Standard Webhooks and Svix give it`);
    }
    return key;
  }
  if (provider === "stripe" && !/^whsec_\S+$/.test(secret)) {
    throw new TypeError(`${context} is not a whsec_ secret: expected Stripe's signing secret, whsec_ followed by letters and digits`);
  }
  return Buffer.from(secret, "utf8");
}

// ---- Verifying -------------------------------------------------------------------------------------

// one returns a header that must appear at most once; a repeat is how smuggled or confused requests look.
function one(headers: Headers, name: string): string | undefined | null {
  const values = headers[name];
  if (values === undefined) return undefined;
  return values.length === 1 ? values[0]! : null;
}

/** safeEqual compares two byte strings in constant time, checking the lengths first. */
export function safeEqual(a: Buffer, b: Buffer): boolean {
  return a.length === b.length && timingSafeEqual(a, b);
}

// matches says whether any given signature equals the HMAC of the parts under any secret. It compares the
// encoded text, not decoded bytes: lenient decoders would let a changed base64 padding bit pass.
function matches(secrets: Buffer[], parts: (string | Buffer)[], encoding: "hex" | "base64", given: string[]): boolean {
  const candidates = given.map((text) => Buffer.from(text, "latin1"));
  let ok = false;
  for (const secret of secrets) {
    const mac = createHmac("sha256", secret);
    for (const part of parts) mac.update(part);
    const expected = Buffer.from(mac.digest(encoding), "latin1");
    // No early exit: every candidate is compared, so the time does not say which one was close.
    for (const candidate of candidates) ok = safeEqual(candidate, expected) || ok;
  }
  return ok;
}

// seconds parses a signed timestamp: digits only, so "1e9", " 12", "+12" and "12.5" are all refused.
function seconds(text: string): number | undefined {
  return /^[0-9]{1,12}$/.test(text) ? Number(text) : undefined;
}

// stale says why a signed timestamp is outside its window, or undefined if it is inside. Windows are
// inclusive: exactly tolerance seconds off is still accepted, as the providers' own libraries do.
function stale(ts: number, nowMs: number, toleranceS: number, futureToo: boolean): string | undefined {
  const now = Math.floor(nowMs / 1000);
  if (now - ts > toleranceS) return `timestamp is ${now - ts} s old, over the ${toleranceS}-s window`;
  if (futureToo && ts - now > toleranceS) return `timestamp is ${ts - now} s ahead, over the ${toleranceS}-s window`;
  return undefined;
}

// fromJson reads fields of a verified body; a body that is not a JSON object gives undefined.
function fromJson(body: Buffer): Record<string, unknown> | undefined {
  try {
    const value: unknown = JSON.parse(body.toString("utf8"));
    return isObject(value) ? value : undefined;
  } catch {
    return undefined;
  }
}

function text(value: unknown): string | null {
  return typeof value === "string" && value !== "" ? value : null;
}

const reject = (status: 400 | 401, reason: string): Verdict => ({ kind: "reject", status, reason });

/**
 * verify checks a request's signature on the raw body under any of the source's secrets, then finds its
 * delivery ID, event type and signed time. Nothing in the body is read until the signature holds.
 */
export function verify(source: Source, headers: Headers, body: Buffer, nowMs: number): Verdict {
  switch (source.provider) {
    case "standard": {
      // Svix sends the same scheme under its own names; a request is read under one family only.
      const prefix = headers["webhook-signature"] === undefined && headers["svix-signature"] !== undefined ? "svix" : "webhook";
      const signature = one(headers, `${prefix}-signature`);
      const timestamp = one(headers, `${prefix}-timestamp`);
      const id = one(headers, `${prefix}-id`);
      if (signature === null) return reject(401, `${prefix}-signature sent more than once`);
      if (timestamp === null) return reject(401, `${prefix}-timestamp sent more than once`);
      if (id === null) return reject(400, `${prefix}-id sent more than once`);
      if (!signature) return reject(401, `missing ${prefix}-signature`);
      if (!timestamp) return reject(401, `missing ${prefix}-timestamp`);
      if (!id) return reject(400, `missing ${prefix}-id`);
      const ts = seconds(timestamp);
      if (ts === undefined) return reject(401, `${prefix}-timestamp is not a whole number of seconds`);
      // Space-separated "v1,<base64>" entries; other versions (v1a, v2) are skipped, not refused.
      const v1 = signature.split(" ").filter((s) => s.startsWith("v1,")).map((s) => s.slice(3));
      if (v1.length === 0) return reject(401, `no v1 signature in ${prefix}-signature`);
      if (!matches(source.secrets, [`${id}.${timestamp}.`, body], "base64", v1)) return reject(401, "signature does not match");
      const late = stale(ts, nowMs, source.toleranceS, true);
      if (late) return reject(401, late);
      return { kind: "delivery", id, eventType: text(fromJson(body)?.type), providerTime: ts * 1000 };
    }

    case "stripe": {
      const header = one(headers, "stripe-signature");
      if (header === null) return reject(401, "Stripe-Signature sent more than once");
      if (!header) return reject(401, "missing Stripe-Signature");
      let timestamp: string | undefined;
      const v1: string[] = [];
      for (const item of header.split(",")) {
        const eq = item.indexOf("=");
        const [key, value] = eq < 0 ? [item, ""] : [item.slice(0, eq), item.slice(eq + 1)];
        if (key === "t") {
          if (timestamp !== undefined) return reject(401, "Stripe-Signature has t= more than once");
          timestamp = value;
        } else if (key === "v1") {
          v1.push(value);
        } // v0 (test mode's old scheme) and any future scheme are ignored.
      }
      if (timestamp === undefined) return reject(401, "Stripe-Signature has no t=");
      const ts = seconds(timestamp);
      if (ts === undefined) return reject(401, "Stripe-Signature t= is not a whole number of seconds");
      if (v1.length === 0) return reject(401, "no v1 signature in Stripe-Signature");
      if (!matches(source.secrets, [`${timestamp}.`, body], "hex", v1)) return reject(401, "signature does not match");
      // Stripe's window looks back only: its libraries accept any timestamp not older than the tolerance.
      const late = stale(ts, nowMs, source.toleranceS, false);
      if (late) return reject(401, late);
      const event = fromJson(body);
      const id = text(event?.id);
      if (!id) return reject(400, event ? "missing id in the event" : "body is not a JSON event, so it has no id");
      return { kind: "delivery", id, eventType: text(event?.type), providerTime: ts * 1000 };
    }

    case "github": {
      const signature = one(headers, "x-hub-signature-256");
      const id = one(headers, "x-github-delivery");
      if (signature === null) return reject(401, "X-Hub-Signature-256 sent more than once");
      if (id === null) return reject(400, "X-GitHub-Delivery sent more than once");
      if (!signature) return reject(401, "missing X-Hub-Signature-256");
      if (!signature.startsWith("sha256=")) return reject(401, "X-Hub-Signature-256 is not sha256=<hex>");
      if (!matches(source.secrets, [body], "hex", [signature.slice(7)])) return reject(401, "signature does not match");
      if (!id) return reject(400, "missing X-GitHub-Delivery");
      return { kind: "delivery", id, eventType: text(one(headers, "x-github-event")), providerTime: null };
    }

    case "shopify": {
      const signature = one(headers, "x-shopify-hmac-sha256");
      const id = one(headers, "x-shopify-webhook-id");
      if (signature === null) return reject(401, "X-Shopify-Hmac-Sha256 sent more than once");
      if (id === null) return reject(400, "X-Shopify-Webhook-Id sent more than once");
      if (!signature) return reject(401, "missing X-Shopify-Hmac-Sha256");
      if (!matches(source.secrets, [body], "base64", [signature])) return reject(401, "signature does not match");
      if (!id) return reject(400, "missing X-Shopify-Webhook-Id");
      return { kind: "delivery", id, eventType: text(one(headers, "x-shopify-topic")), providerTime: null };
    }

    case "slack": {
      const signature = one(headers, "x-slack-signature");
      const timestamp = one(headers, "x-slack-request-timestamp");
      if (signature === null) return reject(401, "X-Slack-Signature sent more than once");
      if (timestamp === null) return reject(401, "X-Slack-Request-Timestamp sent more than once");
      if (!signature) return reject(401, "missing X-Slack-Signature");
      if (!timestamp) return reject(401, "missing X-Slack-Request-Timestamp");
      const ts = seconds(timestamp);
      if (ts === undefined) return reject(401, "X-Slack-Request-Timestamp is not a whole number of seconds");
      if (!signature.startsWith("v0=")) return reject(401, "no v0 signature in X-Slack-Signature");
      if (!matches(source.secrets, [`v0:${timestamp}:`, body], "hex", [signature.slice(3)])) return reject(401, "signature does not match");
      const late = stale(ts, nowMs, source.toleranceS, true);
      if (late) return reject(401, late);
      const event = fromJson(body);
      // Slack checks a new Events API URL with a signed handshake; it wants the challenge back, not a 200 "stored".
      if (event?.type === "url_verification") {
        const challenge = text(event.challenge);
        if (!challenge) return reject(400, "url_verification without a challenge");
        return { kind: "reply", status: 200, contentType: "text/plain; charset=utf-8", body: challenge };
      }
      const id = text(event?.event_id);
      if (!id) return reject(400, event ? "missing event_id in the event" : "body is not a JSON event, so it has no event_id");
      const inner = event!.event;
      return { kind: "delivery", id, eventType: text(isObject(inner) ? inner.type : undefined), providerTime: ts * 1000 };
    }

    case "plain": {
      const id = one(headers, "x-delivery-id");
      if (id === null) return reject(400, "X-Delivery-Id sent more than once");
      if (source.secrets.length > 0) {
        const signature = one(headers, "x-signature");
        if (signature === null) return reject(401, "X-Signature sent more than once");
        if (!signature) return reject(401, "missing X-Signature");
        if (!signature.startsWith("sha256=")) return reject(401, "X-Signature is not sha256=<hex>");
        if (!matches(source.secrets, [body], "hex", [signature.slice(7)])) return reject(401, "signature does not match");
      }
      if (!id) return reject(400, "missing delivery id");
      return { kind: "delivery", id, eventType: null, providerTime: null };
    }
  }
}

// ---- Signing ---------------------------------------------------------------------------------------

/** Signable is what sign() needs: the delivery ID, the exact body bytes, and the time to sign. */
export interface Signable {
  /** For stripe and slack the ID travels in the body (`id`, `event_id`); it is not added as a header. */
  id: string;
  body: Buffer | string;
  /** Seconds since the epoch, for the schemes that sign a timestamp. */
  timestampS: number;
  /** Sent as X-GitHub-Event or X-Shopify-Topic; the other schemes carry the type in the body. */
  eventType?: string;
}

/**
 * sign returns the headers a provider would send with this body, signed with the given secret (as the
 * provider hands it out, e.g. whsec_…). An empty secret is allowed only for plain, which then signs nothing.
 */
export function sign(provider: Provider, secret: string, delivery: Signable): Record<string, string> {
  if (!secret && provider !== "plain") throw new TypeError(`sign: a ${provider} delivery needs a secret`);
  const key = secret ? secretKey(provider, secret) : Buffer.alloc(0);
  const body = typeof delivery.body === "string" ? Buffer.from(delivery.body, "utf8") : delivery.body;
  const ts = String(Math.floor(delivery.timestampS));
  const mac = (encoding: "hex" | "base64", ...parts: (string | Buffer)[]) => {
    const h = createHmac("sha256", key);
    for (const part of parts) h.update(part);
    return h.digest(encoding);
  };
  switch (provider) {
    case "standard":
      return { "webhook-id": delivery.id, "webhook-timestamp": ts, "webhook-signature": `v1,${mac("base64", `${delivery.id}.${ts}.`, body)}` };
    case "stripe":
      return { "stripe-signature": `t=${ts},v1=${mac("hex", `${ts}.`, body)}` };
    case "github":
      return {
        "x-github-delivery": delivery.id, "x-hub-signature-256": `sha256=${mac("hex", body)}`,
        ...(delivery.eventType ? { "x-github-event": delivery.eventType } : {}),
      };
    case "shopify":
      return {
        "x-shopify-webhook-id": delivery.id, "x-shopify-hmac-sha256": mac("base64", body),
        ...(delivery.eventType ? { "x-shopify-topic": delivery.eventType } : {}),
      };
    case "slack":
      return { "x-slack-request-timestamp": ts, "x-slack-signature": `v0=${mac("hex", `v0:${ts}:`, body)}` };
    case "plain":
      return { "x-delivery-id": delivery.id, ...(secret ? { "x-signature": `sha256=${mac("hex", body)}` } : {}) };
  }
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function kindOf(value: unknown): string {
  return value === null ? "null" : Array.isArray(value) ? "a list" : typeof value;
}

// providers.ts: how each sender signs its webhooks and where it puts the delivery ID. Every scheme is one
// row of PRESETS, read by a single HMAC checker; the `hmac` provider lets a sources file declare a new row.
// The receiver calls verify() on the raw bytes before anything is stored; send.ts calls sign() to sign
// like a provider. Not run on its own; see receiver.ts --sources and send.ts --provider.

import { createHash, createHmac, timingSafeEqual } from "node:crypto";
import type { BrokerSource } from "./consume.ts";
import { DEFAULTS } from "./defaults.ts";
import type { OrderRule } from "./order.ts";
import type { ReconcileSettings } from "./reconcile/config.ts";
import type { Route } from "./routing/routes.ts";
import type { Headers } from "./store.ts";

/** Provider names a signature scheme the receiver can check: a preset, or `hmac` declared in the sources file. */
export type Provider =
  | "standard"
  | "stripe"
  | "github"
  | "shopify"
  | "slack"
  | "paddle"
  | "linear"
  | "square"
  | "twilio"
  | "zoom"
  | "intercom"
  | "plain"
  | "hmac";
/** PROVIDERS lists every scheme, in the order docs/providers.md's table gives them. */
export const PROVIDERS: readonly Provider[] = [
  "standard",
  "stripe",
  "github",
  "shopify",
  "slack",
  "paddle",
  "linear",
  "square",
  "twilio",
  "zoom",
  "intercom",
  "plain",
  "hmac",
];
/** Preset is a provider whose scheme is built in. */
export type Preset = Exclude<Provider, "hmac">;

/** DEFAULT_TOLERANCE_S is how old (or, where the scheme says so, how far ahead) a signed timestamp may be. */
export const DEFAULT_TOLERANCE_S: number = DEFAULTS.signatureToleranceS;

/** Algorithm is the HMAC's hash. */
export type Algorithm = "sha1" | "sha256" | "sha512";
/** Encoding is how the sender writes the HMAC in its header. */
export type Encoding = "hex" | "base64";

/**
 * Scheme describes how one sender signs and names its deliveries: the settings of an `hmac` source, and
 * every preset. Places are written `header:Name`, `body:/json/pointer` (read only once the body verified),
 * `sha256:body` (the body's hash, for senders that give no ID) or, for the timestamp, `signature:key`
 * (a `key=value` item of the signature header, as Stripe's `t=`).
 */
export interface Scheme {
  /** The header that carries the signature. */
  header: string;
  /** Text before each signature, such as `sha256=` or `v1,`. @default "" */
  prefix?: string;
  /** Splits several signatures in one header (" " for Standard Webhooks, "," for Stripe); items without the prefix are skipped. @default one signature */
  separator?: string;
  /** @default "sha256" */
  algorithm?: Algorithm;
  /** @default "hex" */
  encoding?: Encoding;
  /** What is signed: literal text and {body}, {timestamp}, {id}, {url}, {form}, {header:Name}. @default "{body}" */
  signed?: string;
  /** Where the delivery ID is; several places are tried in order. */
  id: string | string[];
  /** Where the event type is, tried in order. @default none */
  eventType?: string | string[];
  /** Where the signed timestamp is. @default none: the scheme has no replay window */
  timestamp?: string;
  /** Whether the timestamp counts seconds or milliseconds. @default "s" */
  timestampUnit?: "s" | "ms";
  /** Whether a timestamp too far ahead is refused as well as one too old. @default true */
  ahead?: boolean;
  /** Seconds the timestamp may be off. @default DEFAULT_TOLERANCE_S */
  tolerance?: number;
}

/**
 * PRESETS are the built-in schemes, each as its provider documents it. Shopify marks a duplicate with
 * X-Shopify-Event-Id (its current docs); X-Shopify-Webhook-Id keys the delivery only when that is absent.
 * Paddle's 5 s and Linear's ±60 s are the windows their own SDKs enforce.
 */
export const PRESETS: Readonly<Record<Preset, Scheme>> = {
  standard: {
    header: "webhook-signature",
    prefix: "v1,",
    separator: " ",
    encoding: "base64",
    signed: "{id}.{timestamp}.{body}",
    id: "header:webhook-id",
    eventType: "body:/type",
    timestamp: "header:webhook-timestamp",
  },
  stripe: {
    header: "Stripe-Signature",
    prefix: "v1=",
    separator: ",",
    signed: "{timestamp}.{body}",
    id: "body:/id",
    eventType: "body:/type",
    timestamp: "signature:t",
    ahead: false,
  },
  github: {
    header: "X-Hub-Signature-256",
    prefix: "sha256=",
    id: "header:X-GitHub-Delivery",
    eventType: "header:X-GitHub-Event",
  },
  shopify: {
    header: "X-Shopify-Hmac-Sha256",
    encoding: "base64",
    id: ["header:X-Shopify-Event-Id", "header:X-Shopify-Webhook-Id"],
    eventType: "header:X-Shopify-Topic",
  },
  slack: {
    header: "X-Slack-Signature",
    prefix: "v0=",
    signed: "v0:{timestamp}:{body}",
    id: "body:/event_id",
    eventType: "body:/event/type",
    timestamp: "header:X-Slack-Request-Timestamp",
  },
  paddle: {
    header: "Paddle-Signature",
    prefix: "h1=",
    separator: ";",
    signed: "{timestamp}:{body}",
    id: "body:/event_id",
    eventType: "body:/event_type",
    timestamp: "signature:ts",
    ahead: false,
    tolerance: 5,
  },
  linear: {
    header: "Linear-Signature",
    id: "header:Linear-Delivery",
    eventType: "header:Linear-Event",
    timestamp: "body:/webhookTimestamp",
    timestampUnit: "ms",
    tolerance: 60,
  },
  square: {
    header: "X-Square-HmacSha256-Signature",
    encoding: "base64",
    signed: "{url}{body}",
    id: "body:/event_id",
    eventType: "body:/type",
  },
  twilio: {
    header: "X-Twilio-Signature",
    algorithm: "sha1",
    encoding: "base64",
    signed: "{url}{form}",
    id: ["header:I-Twilio-Idempotency-Token", "sha256:body"],
  },
  zoom: {
    header: "x-zm-signature",
    prefix: "v0=",
    signed: "v0:{timestamp}:{body}",
    id: "sha256:body",
    eventType: "body:/event",
    timestamp: "header:x-zm-request-timestamp",
  },
  intercom: { header: "X-Hub-Signature", prefix: "sha1=", algorithm: "sha1", id: "body:/id", eventType: "body:/topic" },
  plain: { header: "X-Signature", prefix: "sha256=", id: "header:X-Delivery-Id" },
};

// Svix sends Standard Webhooks under its own header names; a request is read under one family only.
const SVIX: Scheme = {
  ...PRESETS.standard,
  header: "svix-signature",
  id: "header:svix-id",
  timestamp: "header:svix-timestamp",
};

/** TIMED are the presets that sign a timestamp, so a replayed delivery goes stale. */
export const TIMED: readonly Preset[] = (Object.keys(PRESETS) as Preset[]).filter(
  (p) => PRESETS[p].timestamp !== undefined,
);

/** Source is one configured sender: its name (the URL path), its scheme and its secrets. */
export interface Source {
  name: string;
  provider: Provider;
  /** Any one of these verifies, which is how secrets are rotated. Empty means unsigned. */
  secrets: Buffer[];
  /** Seconds a signed timestamp may be off, for schemes that sign one. */
  toleranceS: number;
  /** The URL the sender was given, for schemes that sign it (Square, Twilio); the request's query is added. */
  url?: string;
  /** The declared scheme of an `hmac` source; presets use PRESETS. */
  scheme?: Scheme;
  /** Per-key ordering (order.ts); none means its deliveries are unordered. */
  order?: OrderRule;
  /** Where its deliveries go (routes.ts); none means the handler alone. */
  routes?: Route[];
  /** How `inbox.ts reconcile` fetches back what the provider never delivered (docs/reconcile.md); none: it is not reconciled. */
  reconcile?: ReconcileSettings;
  /** A broker to consume (consume.ts, run by consumer.ts) instead of an HTTP path: the receiver does not serve it. */
  broker?: BrokerSource;
}

/** Verdict is verify()'s answer: a delivery to store, a reply to send instead, or a rejection. */
export type Verdict =
  | { kind: "delivery"; id: string; eventType: string | null; providerTime: number | null }
  | { kind: "reply"; status: number; contentType: string; body: string }
  | { kind: "reject"; status: 400 | 401; reason: string };

/** unsignedSource is the article's sender: one source, `default`, at `/`, reading X-Delivery-Id. */
export function unsignedSource(): Source {
  return { name: DEFAULTS.source, provider: "plain", secrets: [], toleranceS: 0 };
}

// ---- Compiling a scheme ----------------------------------------------------------------------------

// Place is where a value is read from; `name` is the header as the sender spells it, for messages.
type Place =
  | { from: "header"; key: string; name: string }
  | { from: "body"; path: string[]; name: string }
  | { from: "sha256"; name: string }
  | { from: "signature"; key: string; name: string };
type Part = string | { placeholder: "body" | "timestamp" | "id" | "url" | "form" } | { header: string; name: string };

// Compiled is a Scheme checked and parsed once, so a request only walks it.
export interface Compiled {
  header: string;
  key: string;
  prefix: string;
  separator: string | undefined;
  algorithm: Algorithm;
  encoding: Encoding;
  parts: Part[];
  uses: Set<string>;
  id: Place[];
  eventType: Place[];
  timestamp: Place | undefined;
  unit: "s" | "ms";
  ahead: boolean;
  tolerance: number;
}

const ALGORITHMS: readonly Algorithm[] = ["sha1", "sha256", "sha512"];
const ENCODINGS: readonly Encoding[] = ["hex", "base64"];
const PLACEHOLDERS = ["body", "timestamp", "id", "url", "form"] as const;
const TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/; // an HTTP header name

function place(text: unknown, where: string, setting: string, allowed: readonly Place["from"][]): Place {
  const expected = allowed
    .map(
      (a) =>
        ({ header: "header:Name", body: "body:/json/pointer", sha256: "sha256:body", signature: "signature:key" })[a],
    )
    .join(", ");
  if (typeof text !== "string")
    throw new TypeError(`${where}: expected ${setting} to be one of ${expected}, got ${kindOf(text)}`);
  const colon = text.indexOf(":");
  const [kind, rest] = colon < 0 ? [text, ""] : [text.slice(0, colon), text.slice(colon + 1)];
  const ok = (allowed as readonly string[]).includes(kind);
  if (ok && kind === "header" && TOKEN.test(rest)) return { from: "header", key: rest.toLowerCase(), name: rest };
  if (ok && kind === "body" && rest.startsWith("/")) {
    // JSON Pointer (RFC 6901): "~1" is "/" and "~0" is "~" inside a name.
    const path = rest
      .slice(1)
      .split("/")
      .map((s) => s.replaceAll("~1", "/").replaceAll("~0", "~"));
    return { from: "body", path, name: path.join(".") };
  }
  if (ok && kind === "sha256" && rest === "body") return { from: "sha256", name: "sha256:body" };
  if (ok && kind === "signature" && /^[A-Za-z0-9_-]+$/.test(rest))
    return { from: "signature", key: rest, name: `${rest}=` };
  throw new TypeError(`${where}: expected ${setting} to be one of ${expected}, got ${JSON.stringify(text)}`);
}

function template(text: string, where: string): Part[] {
  const parts: Part[] = [];
  let last = 0;
  const literal = (s: string) => {
    if (/[{}]/.test(s)) throw new TypeError(`${where}: signed has an unmatched brace in ${JSON.stringify(s)}`);
    if (s) parts.push(s);
  };
  for (const m of text.matchAll(/\{([^{}]*)\}/g)) {
    literal(text.slice(last, m.index));
    last = m.index + m[0].length;
    const name = m[1]!;
    if ((PLACEHOLDERS as readonly string[]).includes(name))
      parts.push({ placeholder: name as (typeof PLACEHOLDERS)[number] });
    else if (name.startsWith("header:") && TOKEN.test(name.slice(7)))
      parts.push({ header: name.slice(7).toLowerCase(), name: name.slice(7) });
    else
      throw new TypeError(
        `${where}: unknown placeholder {${name}} in signed; expected {body}, {timestamp}, {id}, {url}, {form} or {header:Name}`,
      );
  }
  literal(text.slice(last));
  return parts;
}

export const list = (value: unknown): unknown[] => (value === undefined ? [] : Array.isArray(value) ? value : [value]);

/** compile checks a scheme and parses it; it throws a TypeError, prefixed with where, naming the setting that is wrong. */
export function compile(scheme: Scheme, where: string): Compiled {
  const s = scheme as unknown as Record<string, unknown>;
  const str = (key: string, fallback: string) => {
    const v = s[key] ?? fallback;
    if (typeof v !== "string") throw new TypeError(`${where}: expected ${key} to be a string, got ${kindOf(v)}`);
    return v;
  };
  const header = str("header", "");
  if (!TOKEN.test(header))
    throw new TypeError(
      `${where}: expected header to name the signature header, got ${JSON.stringify(s.header) ?? "(none)"}`,
    );
  const prefix = str("prefix", "");
  const separator = s.separator === undefined ? undefined : str("separator", "");
  if (separator === "") throw new TypeError(`${where}: expected separator to be at least one character`);
  const algorithm = s.algorithm ?? "sha256";
  if (!(ALGORITHMS as readonly unknown[]).includes(algorithm))
    throw new TypeError(
      `${where}: expected algorithm to be one of ${ALGORITHMS.join(", ")}, got ${JSON.stringify(algorithm)}`,
    );
  const encoding = s.encoding ?? "hex";
  if (!(ENCODINGS as readonly unknown[]).includes(encoding))
    throw new TypeError(`${where}: expected encoding to be hex or base64, got ${JSON.stringify(encoding)}`);
  const parts = template(str("signed", "{body}"), where);
  const uses = new Set(parts.map((p) => (typeof p === "string" ? "" : "placeholder" in p ? p.placeholder : "header")));
  if (!uses.has("body") && !uses.has("form"))
    throw new TypeError(`${where}: signed must include {body} (or {form}), or the body would go unsigned`);

  const ids = list(s.id).map((p) => place(p, where, "id", ["header", "body", "sha256"]));
  if (ids.length === 0)
    throw new TypeError(
      `${where}: missing id; say where the delivery ID is (header:Name, body:/json/pointer or sha256:body)`,
    );
  const eventType = list(s.eventType).map((p) => place(p, where, "eventType", ["header", "body"]));
  const timestamp =
    s.timestamp === undefined ? undefined : place(s.timestamp, where, "timestamp", ["header", "body", "signature"]);
  if (timestamp?.from === "signature" && separator === undefined)
    throw new TypeError(
      `${where}: timestamp "signature:${timestamp.key}" needs a separator to split the signature header`,
    );
  if (uses.has("timestamp") && (!timestamp || timestamp.from === "body"))
    throw new TypeError(`${where}: {timestamp} in signed needs timestamp from a header or the signature header`);
  if (uses.has("id") && ids[0]!.from !== "header")
    throw new TypeError(`${where}: {id} in signed needs the first id place to be a header`);
  for (const key of ["timestampUnit", "ahead"] as const) {
    if (s[key] !== undefined && !timestamp) throw new TypeError(`${where}: ${key} applies only with a timestamp`);
  }
  const unit = s.timestampUnit ?? "s";
  if (unit !== "s" && unit !== "ms")
    throw new TypeError(`${where}: expected timestampUnit to be "s" or "ms", got ${JSON.stringify(unit)}`);
  const ahead = s.ahead ?? true;
  if (typeof ahead !== "boolean")
    throw new TypeError(`${where}: expected ahead to be true or false, got ${JSON.stringify(ahead)}`);
  return {
    header,
    key: header.toLowerCase(),
    prefix,
    separator,
    algorithm: algorithm as Algorithm,
    encoding: encoding as Encoding,
    parts,
    uses,
    id: ids,
    eventType,
    timestamp,
    unit,
    ahead,
    tolerance: scheme.tolerance ?? DEFAULT_TOLERANCE_S,
  };
}

export const COMPILED = Object.fromEntries(
  Object.entries(PRESETS).map(([p, scheme]) => [p, compile(scheme, `preset ${p}`)]),
) as Record<Preset, Compiled>;
const COMPILED_SVIX = compile(SVIX, "preset svix");
const declared = new WeakMap<Scheme, Compiled>();

function compiledFor(source: Source): Compiled {
  if (source.provider !== "hmac") return COMPILED[source.provider];
  if (!source.scheme) throw new TypeError(`source ${source.name}: an hmac source needs its scheme, got none`);
  let c = declared.get(source.scheme);
  if (!c) declared.set(source.scheme, (c = compile(source.scheme, `source ${JSON.stringify(source.name)}`)));
  return c;
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
      throw new TypeError(
        `${context} is not a whsec_ secret: expected whsec_ followed by base64, as Standard Webhooks and Svix give it`,
      );
    }
    return key;
  }
  if (provider === "stripe" && !/^whsec_\S+$/.test(secret)) {
    throw new TypeError(
      `${context} is not a whsec_ secret: expected Stripe's signing secret, whsec_ followed by letters and digits`,
    );
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

function mac(algorithm: Algorithm, key: Buffer, parts: (string | Buffer)[], encoding: Encoding): string {
  const h = createHmac(algorithm, key);
  for (const part of parts) h.update(part);
  return h.digest(encoding);
}

// matching returns the secret under which any given signature equals the HMAC of the parts. It compares
// the encoded text, not decoded bytes: lenient decoders would let a changed base64 padding bit pass.
function matching(c: Compiled, secrets: Buffer[], parts: (string | Buffer)[], given: string[]): Buffer | undefined {
  const candidates = given.map((text) => Buffer.from(text, "latin1"));
  let found: Buffer | undefined;
  for (const secret of secrets) {
    const expected = Buffer.from(mac(c.algorithm, secret, parts, c.encoding), "latin1");
    // No early exit: every candidate is compared, so the time does not say which one was close.
    for (const candidate of candidates) if (safeEqual(candidate, expected)) found ??= secret;
  }
  return found;
}

// digits parses a signed timestamp: digits only, so "1e9", " 12", "+12" and "12.5" are all refused.
function digits(text: string): number | undefined {
  return /^[0-9]{1,15}$/.test(text) ? Number(text) : undefined;
}

// stale says why a signed timestamp is outside its window, or undefined if it is inside. Windows are
// inclusive: exactly tolerance seconds off is still accepted, as the providers' own libraries do.
function stale(ts: number, nowMs: number, c: Compiled, toleranceS: number): string | undefined {
  const [now, per] = c.unit === "s" ? [Math.floor(nowMs / 1000), 1] : [nowMs, 1000];
  if (now - ts > toleranceS * per) return `timestamp is ${(now - ts) / per} s old, over the ${toleranceS}-s window`;
  if (c.ahead && ts - now > toleranceS * per)
    return `timestamp is ${(ts - now) / per} s ahead, over the ${toleranceS}-s window`;
  return undefined;
}

// fromJson reads fields of a verified body; a body that is not a JSON object gives undefined.
function fromJson(body: Buffer | string): Record<string, unknown> | undefined {
  try {
    const value: unknown = JSON.parse(body.toString("utf8"));
    return isObject(value) ? value : undefined;
  } catch {
    return undefined;
  }
}

function pointer(value: unknown, path: string[]): unknown {
  for (const key of path) {
    if (Array.isArray(value) && /^(0|[1-9][0-9]*)$/.test(key)) value = value[Number(key)];
    else if (isObject(value) && Object.hasOwn(value, key)) value = value[key];
    else return undefined;
  }
  return value;
}

function text(value: unknown): string | null {
  return typeof value === "string" && value !== "" ? value : null;
}

const sha256Hex = (body: Buffer) => createHash("sha256").update(body).digest("hex");
const formType = (contentType: string | undefined) => /^application\/x-www-form-urlencoded\b/i.test(contentType ?? "");
const isForm = (headers: Headers) => formType(headers["content-type"]?.[0]);

// formText is Twilio's signed form: each parameter name then its value, names sorted, a repeated name's
// distinct values sorted, as twilio-node's validateRequest builds it.
function formText(body: Buffer): string {
  const byName = new Map<string, Set<string>>();
  for (const [name, value] of new URLSearchParams(body.toString("utf8"))) {
    if (!byName.has(name)) byName.set(name, new Set());
    byName.get(name)!.add(value);
  }
  return [...byName.keys()]
    .sort()
    .map((name) =>
      [...byName.get(name)!]
        .sort()
        .map((v) => name + v)
        .join(""),
    )
    .join("");
}

const reject = (status: 400 | 401, reason: string): Verdict => ({ kind: "reject", status, reason });

// Hook handles what a table row cannot say: a signed handshake to answer, or a body of another shape.
// It runs once the signature and the window hold, and returns undefined to carry on as the row says.
type Hook = (request: {
  headers: Headers;
  body: Buffer;
  secret: Buffer;
  providerTime: number | null;
}) => Verdict | undefined;

const HOOKS: Partial<Record<Preset, Hook>> = {
  slack: ({ headers, body, providerTime }) => {
    // Slash commands and interactive payloads are forms with no event_id. Each invocation has its own
    // trigger_id, so that is the key; the few payloads without one (view_closed) are keyed by their hash.
    if (isForm(headers)) {
      const form = new URLSearchParams(body.toString("utf8"));
      const payload = form.has("payload") ? fromJson(form.get("payload")!) : undefined;
      const id = text(payload ? payload.trigger_id : form.get("trigger_id")) ?? `sha256:${sha256Hex(body)}`;
      return { kind: "delivery", id, eventType: text(payload ? payload.type : form.get("command")), providerTime };
    }
    const event = fromJson(body);
    // Slack checks a new Events API URL with a signed handshake; it wants the challenge back, not a 200 "stored".
    if (event?.type !== "url_verification") return undefined;
    const challenge = text(event.challenge);
    if (!challenge) return reject(400, "url_verification without a challenge");
    return { kind: "reply", status: 200, contentType: "text/plain; charset=utf-8", body: challenge };
  },
  zoom: ({ body, secret }) => {
    // Zoom validates an endpoint with a signed challenge: the plainToken back, with its HMAC under the secret.
    const event = fromJson(body);
    if (event?.event !== "endpoint.url_validation") return undefined;
    const plainToken = text(pointer(event, ["payload", "plainToken"]));
    if (!plainToken) return reject(400, "endpoint.url_validation without payload.plainToken");
    const encryptedToken = createHmac("sha256", secret).update(plainToken).digest("hex");
    return {
      kind: "reply",
      status: 200,
      contentType: "application/json; charset=utf-8",
      body: JSON.stringify({ plainToken, encryptedToken }),
    };
  },
};

/**
 * verify checks a request's signature on the raw body under any of the source's secrets, then finds its
 * delivery ID, event type and signed time. Nothing in the body is read until the signature holds. The
 * target is the request's path and query, for schemes that sign the URL. parsed, where given, gets the
 * body as a JSON object if verifying had to parse it.
 */
export function verify(
  source: Source,
  headers: Headers,
  body: Buffer,
  nowMs: number,
  target: string = "/",
  parsed?: { event?: Record<string, unknown> },
): Verdict {
  let c = compiledFor(source);
  if (
    source.provider === "standard" &&
    headers["webhook-signature"] === undefined &&
    headers["svix-signature"] !== undefined
  )
    c = COMPILED_SVIX;
  const unsigned = source.provider === "plain" && source.secrets.length === 0;

  const signature = one(headers, c.key);
  if (signature === null) return reject(401, `${c.header} sent more than once`);
  let tsText: string | undefined;
  if (c.timestamp?.from === "header") {
    const t = one(headers, c.timestamp.key);
    if (t === null) return reject(401, `${c.timestamp.name} sent more than once`);
    tsText = t;
  }
  const idHeaders = new Map<string, string | undefined>();
  for (const p of c.id) {
    if (p.from !== "header") continue;
    const v = one(headers, p.key);
    if (v === null) return reject(400, `${p.name} sent more than once`);
    idHeaders.set(p.key, v);
  }

  let secret: Buffer = Buffer.alloc(0);
  if (!unsigned) {
    if (!signature) return reject(401, `missing ${c.header}`);
    if (c.timestamp?.from === "header" && !tsText) return reject(401, `missing ${c.timestamp.name}`);
    const items = c.separator === undefined ? [signature] : signature.split(c.separator);
    if (c.timestamp?.from === "signature") {
      const key = `${c.timestamp.key}=`;
      const found = items.filter((item) => item.startsWith(key));
      if (found.length > 1) return reject(401, `${c.header} has ${key} more than once`);
      if (found.length === 0) return reject(401, `${c.header} has no ${key}`);
      tsText = found[0]!.slice(key.length);
    }
    if (tsText !== undefined && digits(tsText) === undefined) {
      return reject(
        401,
        `${c.timestamp!.from === "signature" ? `${c.header} ${c.timestamp!.name}` : c.timestamp!.name} is not a whole number of ${c.unit === "s" ? "seconds" : "milliseconds"}`,
      );
    }
    // Items of another version (v1a, v2, Stripe's v0) are skipped, not refused.
    const given = items.filter((item) => item.startsWith(c.prefix)).map((item) => item.slice(c.prefix.length));
    if (given.length === 0) return reject(401, `no ${c.prefix} signature in ${c.header}`);
    const signedId = c.id[0]!.from === "header" ? idHeaders.get((c.id[0] as { key: string }).key) : undefined;
    if (c.uses.has("id") && !signedId) return reject(400, `missing ${c.id[0]!.name}`);

    const parts: (string | Buffer)[] = [];
    for (const part of c.parts) {
      if (typeof part === "string") parts.push(part);
      else if ("header" in part) {
        const v = one(headers, part.header);
        if (typeof v !== "string")
          return reject(401, v === null ? `${part.name} sent more than once` : `missing ${part.name}, which is signed`);
        parts.push(v);
      } else if (part.placeholder === "body") parts.push(body);
      else if (part.placeholder === "timestamp") parts.push(tsText!);
      else if (part.placeholder === "id") parts.push(signedId!);
      else if (part.placeholder === "url") {
        const query = target.indexOf("?");
        parts.push(source.url! + (query < 0 ? "" : target.slice(query)));
      } else if (isForm(headers)) parts.push(formText(body));
      else {
        // A body that is not a form is signed through the URL instead: its bodySHA256 parameter (Twilio).
        const query = target.indexOf("?");
        const hash = new URLSearchParams(query < 0 ? "" : target.slice(query + 1)).get("bodySHA256") ?? "";
        if (!safeEqual(Buffer.from(hash, "latin1"), Buffer.from(sha256Hex(body))))
          return reject(401, "body is not a form, and the URL's bodySHA256 is not its SHA-256");
      }
    }
    const matched = matching(c, source.secrets, parts, given);
    if (!matched) return reject(401, "signature does not match");
    secret = matched;
  }

  let event: Record<string, unknown> | undefined | null = null; // null: not parsed yet
  const json = () => (event === null ? (event = fromJson(body)) : event);
  let providerTime: number | null = null;
  if (c.timestamp) {
    let ts: number | undefined;
    if (c.timestamp.from === "body") {
      const v = pointer(json(), c.timestamp.path);
      ts =
        typeof v === "number" && Number.isSafeInteger(v) && v >= 0 ? v : typeof v === "string" ? digits(v) : undefined;
      if (ts === undefined)
        return reject(
          401,
          v === undefined
            ? `missing ${c.timestamp.name} in the event`
            : `${c.timestamp.name} is not a whole number of ${c.unit === "s" ? "seconds" : "milliseconds"}`,
        );
    } else {
      ts = digits(tsText!)!;
    }
    const late = stale(ts, nowMs, c, source.toleranceS);
    if (late) return reject(401, late);
    providerTime = c.unit === "s" ? ts * 1000 : ts;
  }

  const hooked =
    source.provider === "hmac" ? undefined : HOOKS[source.provider]?.({ headers, body, secret, providerTime });
  if (hooked) return hooked;

  const read = (p: Place): string | null =>
    p.from === "header"
      ? text(idHeaders.has(p.key) ? idHeaders.get(p.key) : one(headers, p.key))
      : p.from === "body"
        ? text(pointer(json(), p.path))
        : p.from === "sha256"
          ? `sha256:${sha256Hex(body)}`
          : null;
  let id: string | null = null;
  for (const p of c.id) if (!id) id = read(p);
  if (!id) {
    const inBody = c.id.filter((p) => p.from === "body");
    if (inBody.length > 0 && !json())
      return reject(400, `body is not a JSON event, so it has no ${inBody.map((p) => p.name).join(" or ")}`);
    return reject(
      400,
      `missing ${c.id.map((p) => (p.from === "body" ? `${p.name} in the event` : p.name)).join(" and ")}`,
    );
  }
  let eventType: string | null = null;
  for (const p of c.eventType) if (!eventType) eventType = read(p);
  // The body as verifying parsed it, for route filters (filter.ts), which then need not parse it again.
  if (parsed && event) parsed.event = event;
  return { kind: "delivery", id, eventType, providerTime };
}

// ---- Signing ---------------------------------------------------------------------------------------

/** Signable is what sign() needs: the delivery ID, the exact body bytes, and the time to sign. */
export interface Signable {
  /** Sent in the scheme's ID headers; where the ID travels in the body (Stripe's `id`), the body must carry it. */
  id: string;
  body: Buffer | string;
  /** Seconds since the epoch, for the schemes that sign a timestamp. */
  timestampS: number;
  /** Sent in the scheme's event-type header (X-GitHub-Event, X-Shopify-Topic, Linear-Event), where it has one. */
  eventType?: string;
  /** The whole URL posted to, query included, for schemes that sign it (Square, Twilio). */
  url?: string;
  /** Further headers to send, and to sign where the scheme signs {header:Name} (Twilio needs content-type). */
  headers?: Record<string, string>;
}

/**
 * sign returns the headers a provider would send with this body, signed with the given secret (as the
 * provider hands it out, e.g. whsec_…). An empty secret is allowed only for plain, which then signs
 * nothing. For `hmac`, pass the declared scheme.
 */
export function sign(provider: Provider, secret: string, delivery: Signable, scheme?: Scheme): Record<string, string> {
  if (!secret && provider !== "plain") throw new TypeError(`sign: a ${provider} delivery needs a secret`);
  if (provider === "hmac" && !scheme) throw new TypeError("sign: an hmac delivery needs its scheme, got none");
  const c = provider === "hmac" ? compile(scheme!, "sign") : COMPILED[provider];
  const body = typeof delivery.body === "string" ? Buffer.from(delivery.body, "utf8") : delivery.body;
  const out: Record<string, string> = {};
  for (const p of c.id) if (p.from === "header") out[p.key] = delivery.id;
  const typeHeader = c.eventType.find((p) => p.from === "header");
  if (delivery.eventType && typeHeader?.from === "header") out[typeHeader.key] = delivery.eventType;
  for (const [name, value] of Object.entries(delivery.headers ?? {})) out[name.toLowerCase()] = value;
  if (!secret) return out;

  const ts = String(Math.floor(c.unit === "s" ? delivery.timestampS : delivery.timestampS * 1000));
  if (c.timestamp?.from === "header") out[c.timestamp.key] = ts;
  const parts = c.parts.map((part) => {
    if (typeof part === "string") return part;
    if ("header" in part) return out[part.header] ?? "";
    switch (part.placeholder) {
      case "body":
        return body;
      case "timestamp":
        return ts;
      case "id":
        return delivery.id;
      case "url":
        if (!delivery.url) throw new TypeError(`sign: a ${provider} delivery signs its URL; pass url`);
        return delivery.url;
      case "form":
        // A body that is not a form is bound through the URL instead (Twilio's bodySHA256): the caller's url carries it.
        return formType(out["content-type"]) ? formText(body) : "";
    }
  });
  const signature = `${c.prefix}${mac(c.algorithm, secretKey(provider, secret), parts, c.encoding)}`;
  out[c.key] = c.timestamp?.from === "signature" ? `${c.timestamp.key}=${ts}${c.separator}${signature}` : signature;
  return out;
}

export function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

export function kindOf(value: unknown): string {
  return value === null ? "null" : Array.isArray(value) ? "a list" : typeof value;
}

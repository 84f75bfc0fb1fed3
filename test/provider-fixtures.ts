// test/provider-fixtures.ts: what the provider tests share: the published vectors, an independent signer,
// every signed scheme (Svix included) and the one-byte mutations of the property tests.

import { createHmac } from "node:crypto";
import fc from "fast-check";
import { Webhook as SvixWebhook } from "svix";
import { loadSources, sign, type Headers, type Provider, type Source } from "../providers.ts";

// Published test vectors.
export const STANDARD = {
  secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", id: "msg_p5jXN8AQM9LWM0D4loKWxJek", ts: 1614265330,
  body: '{"test": 2432232314}', signature: "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
};
export const GITHUB = {
  secret: "It's a Secret to Everybody", body: "Hello, World!",
  signature: "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
};
// The worked example in Slack's guide "Verifying requests from Slack" (a slash command, form-encoded).
export const SLACK = {
  secret: "8f742231b10e8888abcd99yyyzzz85a5", ts: 1531420618,
  body: "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c",
  signature: "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503",
};
export const STRIPE_SECRET = "whsec_test_3b1f0c9a7d2e4c6b8a0f1e2d3c4b5a69";
export const T = 1_700_000_000; // a pinned "now", in seconds

/** source builds one configured source the way a sources file would. */
export function source(provider: Provider, secret: string | string[] | undefined, tolerance?: number): Source {
  return loadSources({ s: { provider, ...(secret === undefined ? {} : { secret }), ...(tolerance === undefined ? {} : { tolerance }) } }, {}).get("s")!;
}

/** headers turns plain headers into headersDistinct's shape: lower-case names, every value a list. */
export function headers(h: Record<string, string | string[]>): Headers {
  return Object.fromEntries(Object.entries(h).map(([k, v]) => [k.toLowerCase(), Array.isArray(v) ? v : [v]]));
}

/** hmac is an independent signer, so the tests check the scheme rather than echo providers.ts. */
export function hmac(key: string | Buffer, text: string, encoding: "hex" | "base64"): string {
  return createHmac("sha256", key).update(text).digest(encoding);
}
/** standardKey decodes a whsec_ secret into its HMAC key, as the Standard Webhooks spec says. */
export const standardKey = (secret: string) => Buffer.from(secret.slice("whsec_".length), "base64");

/** svixHeaders signs with Svix's own SDK, under its svix-* header names. */
export function svixHeaders(id: string, body: Buffer | string, ts: number): Record<string, string> {
  return { "svix-id": id, "svix-timestamp": String(ts), "svix-signature": new SvixWebhook(STANDARD.secret).sign(id, new Date(ts * 1000), body.toString()) };
}

// ---- The property: one changed byte anywhere that is signed gets a 401 -------------------------------

/** Scheme is one signed delivery, with the parts a forger could change. */
export interface Scheme {
  name: string;
  source: Source;
  /** Headers and body for a delivery with this ID and body, signed at T. */
  make(id: string, body: Buffer): { headers: Record<string, string>; body: Buffer };
  /** The headers a forger may change a byte of: signature, timestamp, and the ID where it is signed. */
  signedHeaders: string[];
}

const JSON_ID: Record<string, (id: string, payload: string) => string> = {
  stripe: (id, payload) => JSON.stringify({ id, object: "event", type: "t", data: { payload } }),
  slack: (id, payload) => JSON.stringify({ type: "event_callback", event_id: id, event: { type: "t", payload } }),
};

/** SCHEMES lists every scheme with a signature, Svix included, for the property tests here and over HTTP. */
export const SCHEMES: Scheme[] = [
  { name: "standard", source: source("standard", STANDARD.secret), signedHeaders: ["webhook-signature", "webhook-timestamp", "webhook-id"],
    make: (id, body) => ({ headers: sign("standard", STANDARD.secret, { id, body, timestampS: T }), body }) },
  { name: "svix", source: source("standard", STANDARD.secret), signedHeaders: ["svix-signature", "svix-timestamp", "svix-id"],
    make: (id, body) => ({ headers: svixHeaders(id, body.toString("latin1"), T), body: Buffer.from(body.toString("latin1")) }) },
  { name: "stripe", source: source("stripe", STRIPE_SECRET), signedHeaders: ["stripe-signature"],
    make: (id, body) => { const b = Buffer.from(JSON_ID.stripe!(id, body.toString("base64"))); return { headers: sign("stripe", STRIPE_SECRET, { id, body: b, timestampS: T }), body: b }; } },
  { name: "slack", source: source("slack", SLACK.secret), signedHeaders: ["x-slack-signature", "x-slack-request-timestamp"],
    make: (id, body) => { const b = Buffer.from(JSON_ID.slack!(id, body.toString("base64"))); return { headers: sign("slack", SLACK.secret, { id, body: b, timestampS: T }), body: b }; } },
  { name: "github", source: source("github", GITHUB.secret), signedHeaders: ["x-hub-signature-256"],
    make: (id, body) => ({ headers: sign("github", GITHUB.secret, { id, body, timestampS: T, eventType: "push" }), body }) },
  { name: "shopify", source: source("shopify", "shpss_k"), signedHeaders: ["x-shopify-hmac-sha256"],
    make: (id, body) => ({ headers: sign("shopify", "shpss_k", { id, body, timestampS: T }), body }) },
  { name: "plain", source: source("plain", "k"), signedHeaders: ["x-signature"],
    make: (id, body) => ({ headers: sign("plain", "k", { id, body, timestampS: T }), body }) },
];

/** Mutation is one changed byte: in the body, or in one of the signed headers (printable, as HTTP allows). */
export type Mutation = { where: "body"; index: number; byte: number } | { where: "header"; which: number; index: number; byte: number };

/** mutationArb draws a changed byte; apply() turns it into a real change (never the same byte again). */
export const mutationArb: fc.Arbitrary<Mutation> = fc.oneof(
  fc.record({ where: fc.constant("body" as const), index: fc.nat(), byte: fc.integer({ min: 1, max: 255 }) }),
  fc.record({ where: fc.constant("header" as const), which: fc.nat(), index: fc.nat(), byte: fc.integer({ min: 1, max: 93 }) }),
);
/** idArb draws delivery IDs as providers write them. */
export const idArb = fc.stringMatching(/^[A-Za-z0-9_-]{1,40}$/);
/** bodyArb draws raw bodies, any bytes, so nothing relies on the body being text. */
export const bodyArb = fc.uint8Array({ minLength: 1, maxLength: 200 }).map((a) => Buffer.from(a));

/** apply changes exactly one byte; header bytes stay in printable ASCII (0x21-0x7e) so HTTP can carry them. */
export function apply(scheme: Scheme, signed: { headers: Record<string, string>; body: Buffer }, m: Mutation) {
  const headers = { ...signed.headers };
  let body = signed.body;
  if (m.where === "body") {
    body = Buffer.from(body);
    const i = m.index % body.length;
    body[i] = (body[i]! + m.byte) % 256;
  } else {
    const name = scheme.signedHeaders[m.which % scheme.signedHeaders.length]!;
    const value = headers[name]!;
    const i = m.index % value.length;
    const code = 0x21 + ((value.charCodeAt(i) - 0x21 + m.byte) % 94);
    headers[name] = value.slice(0, i) + String.fromCharCode(code) + value.slice(i + 1);
  }
  return { headers, body };
}


// test/provider-fixtures.ts: what the provider tests share: the published vectors, an independent signer,
// every signed scheme (Svix included) and the one-byte mutations of the property tests.

import { createHash, createHmac } from "node:crypto";
import fc from "fast-check";
import { Webhook as SvixWebhook } from "svix";
import type { Headers } from "../lib/store.ts";
import {
  loadSources,
  sign,
  type Provider,
  type Scheme as SignatureScheme,
  type Signable,
  type Source,
} from "../lib/config/sources.ts";

// Published test vectors.
export const STANDARD = {
  secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
  id: "msg_p5jXN8AQM9LWM0D4loKWxJek",
  ts: 1614265330,
  body: '{"test": 2432232314}',
  signature: "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
};
export const GITHUB = {
  secret: "It's a Secret to Everybody",
  body: "Hello, World!",
  signature: "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
};
// The worked example in Slack's guide "Verifying requests from Slack" (a slash command, form-encoded).
export const SLACK = {
  secret: "8f742231b10e8888abcd99yyyzzz85a5",
  ts: 1531420618,
  body: "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c",
  signature: "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503",
};
// Square's SDK test vector for WebhooksHelper.verifySignature (notification URL + body, base64 HMAC-SHA256).
export const SQUARE = {
  key: "Ibxx_5AKakO-3qeNVR61Dw",
  url: "https://webhook.site/679a4f3a-dcfa-49ee-bac5-9d0edad886b9",
  body: '{"merchant_id":"MLEFBHHSJGVHD","type":"webhooks.test_notification","event_id":"ac3ac95b-f97d-458c-a6e6-18981597e05f","created_at":"2022-07-13T20:30:59.037339943Z","data":{"type":"webhooks","id":"bc368e64-01aa-407e-b46e-3231809b1129"}}',
  signature: "GF4YkrJgGBDZ9NIYbNXBnMzqb2HoL4RW/S6vkZ9/2N4=",
};
// Twilio's "Validating signatures" example (a form) and twilio-node's test of a JSON body signed via bodySHA256.
export const TWILIO = {
  token: "12345",
  url: "https://mycompany.com/myapp.php",
  query: "?foo=1&bar=2",
  params: {
    CallSid: "CA1234567890ABCDE",
    Caller: "+12349013030",
    Digits: "1234",
    From: "+12349013030",
    To: "+18005551212",
  },
  signature: "0/KCTR6DLpKmkAf8muzZqo1nDgQ=",
  jsonBody: '{"property": "value", "boolean": true}',
  jsonQuery: "?foo=1&bar=2&bodySHA256=0a1ff7634d9ab3b95db5c9a2dfe9416e41502b283a80c7cf19632632f96e6620",
  jsonSignature: "a9nBmqA0ju/hNViExpshrM61xv4=",
};
export const STRIPE_SECRET = "whsec_test_3b1f0c9a7d2e4c6b8a0f1e2d3c4b5a69";
export const T = 1_700_000_000; // a pinned "now", in seconds

/** source builds one configured source the way a sources file would; extra carries url or an hmac scheme. */
export function source(
  provider: Provider,
  secret: string | string[] | undefined,
  tolerance?: number,
  extra: Record<string, unknown> = {},
): Source {
  const url = provider === "square" ? SQUARE.url : provider === "twilio" ? TWILIO.url : undefined;
  return loadSources(
    {
      s: {
        provider,
        ...(secret === undefined ? {} : { secret }),
        ...(tolerance === undefined ? {} : { tolerance }),
        ...(url ? { url } : {}),
        ...extra,
      },
    },
    {},
  ).get("s")!;
}

/** CUSTOM is a declared hmac scheme unlike any preset: sha512, base64, several signatures, a signed header. */
export const CUSTOM = {
  header: "X-Acme-Signature",
  prefix: "s1:",
  separator: " ",
  algorithm: "sha512",
  encoding: "base64",
  signed: "{timestamp}.{header:X-Acme-Account}.{body}",
  id: ["header:X-Acme-Delivery"],
  eventType: "body:/kind",
  timestamp: "header:X-Acme-Time",
  tolerance: 120,
} as const;

/** headers turns plain headers into headersDistinct's shape: lower-case names, every value a list. */
export function headers(h: Record<string, string | string[]>): Headers {
  return Object.fromEntries(Object.entries(h).map(([k, v]) => [k.toLowerCase(), Array.isArray(v) ? v : [v]]));
}

/** hmac is an independent signer, so the tests check the scheme rather than echo providers.ts. */
export function hmac(
  key: string | Buffer,
  text: string,
  encoding: "hex" | "base64",
  algorithm: "sha1" | "sha256" | "sha512" = "sha256",
): string {
  return createHmac(algorithm, key).update(text).digest(encoding);
}
/** standardKey decodes a whsec_ secret into its HMAC key, as the Standard Webhooks spec says. */
export const standardKey = (secret: string) => Buffer.from(secret.slice("whsec_".length), "base64");

/** svixHeaders signs with Svix's own SDK, under its svix-* header names. */
export function svixHeaders(id: string, body: Buffer | string, ts: number): Record<string, string> {
  return {
    "svix-id": id,
    "svix-timestamp": String(ts),
    "svix-signature": new SvixWebhook(STANDARD.secret).sign(id, new Date(ts * 1000), body.toString()),
  };
}

// ---- The property: one changed byte anywhere that is signed gets a 401 -------------------------------

/** Scheme is one signed delivery, with the parts a forger could change. */
export interface Scheme {
  name: string;
  source: Source;
  /** Headers and body for a delivery with this ID and body, signed at T; query is the URL's, where it is signed. */
  make(id: string, body: Buffer): { headers: Record<string, string>; body: Buffer; query?: string };
  /** The headers a forger may change a byte of: signature, timestamp, and the ID where it is signed. */
  signedHeaders: string[];
}

const JSON_ID: Record<string, (id: string, payload: string) => string> = {
  stripe: (id, payload) => JSON.stringify({ id, object: "event", type: "t", data: { payload } }),
  slack: (id, payload) => JSON.stringify({ type: "event_callback", event_id: id, event: { type: "t", payload } }),
  paddle: (id, payload) =>
    JSON.stringify({
      event_id: id,
      event_type: "transaction.paid",
      occurred_at: "2023-11-14T22:13:20Z",
      data: { payload },
    }),
  linear: (_id, payload) =>
    JSON.stringify({ action: "create", type: "Issue", data: { payload }, webhookTimestamp: T * 1000 }),
  square: (id, payload) =>
    JSON.stringify({ merchant_id: "M1", type: "payment.created", event_id: id, data: { payload } }),
  zoom: (_id, payload) => JSON.stringify({ event: "meeting.started", event_ts: T * 1000, payload: { payload } }),
  intercom: (id, payload) =>
    JSON.stringify({ type: "notification_event", id, topic: "conversation.user.created", data: { payload } }),
  custom: (_id, payload) => JSON.stringify({ kind: "thing.done", payload }),
};
const wrapped =
  (name: string, provider: Provider, secret: string, extra: Partial<Signable> = {}, scheme?: SignatureScheme) =>
  (id: string, body: Buffer) => {
    const b = Buffer.from(JSON_ID[name]!(id, body.toString("base64")));
    return { headers: sign(provider, secret, { id, body: b, timestampS: T, ...extra }, scheme), body: b };
  };
// Twilio signs a JSON body through the URL: bodySHA256 binds the body, the URL is signed.
const twilioJson = (id: string, body: Buffer) => {
  const query = `?bodySHA256=${createHash("sha256").update(body).digest("hex")}`;
  return { headers: sign("twilio", TWILIO.token, { id, body, timestampS: T, url: TWILIO.url + query }), body, query };
};

/** SCHEMES lists every scheme with a signature, Svix included, for the property tests here and over HTTP. */
export const SCHEMES: Scheme[] = [
  {
    name: "standard",
    source: source("standard", STANDARD.secret),
    signedHeaders: ["webhook-signature", "webhook-timestamp", "webhook-id"],
    make: (id, body) => ({ headers: sign("standard", STANDARD.secret, { id, body, timestampS: T }), body }),
  },
  {
    name: "svix",
    source: source("standard", STANDARD.secret),
    signedHeaders: ["svix-signature", "svix-timestamp", "svix-id"],
    make: (id, body) => ({
      headers: svixHeaders(id, body.toString("latin1"), T),
      body: Buffer.from(body.toString("latin1")),
    }),
  },
  {
    name: "stripe",
    source: source("stripe", STRIPE_SECRET),
    signedHeaders: ["stripe-signature"],
    make: (id, body) => {
      const b = Buffer.from(JSON_ID.stripe!(id, body.toString("base64")));
      return { headers: sign("stripe", STRIPE_SECRET, { id, body: b, timestampS: T }), body: b };
    },
  },
  {
    name: "slack",
    source: source("slack", SLACK.secret),
    signedHeaders: ["x-slack-signature", "x-slack-request-timestamp"],
    make: (id, body) => {
      const b = Buffer.from(JSON_ID.slack!(id, body.toString("base64")));
      return { headers: sign("slack", SLACK.secret, { id, body: b, timestampS: T }), body: b };
    },
  },
  {
    name: "github",
    source: source("github", GITHUB.secret),
    signedHeaders: ["x-hub-signature-256"],
    make: (id, body) => ({
      headers: sign("github", GITHUB.secret, { id, body, timestampS: T, eventType: "push" }),
      body,
    }),
  },
  {
    name: "shopify",
    source: source("shopify", "shpss_k"),
    signedHeaders: ["x-shopify-hmac-sha256"],
    make: (id, body) => ({ headers: sign("shopify", "shpss_k", { id, body, timestampS: T }), body }),
  },
  {
    name: "plain",
    source: source("plain", "k"),
    signedHeaders: ["x-signature"],
    make: (id, body) => ({ headers: sign("plain", "k", { id, body, timestampS: T }), body }),
  },
  {
    name: "paddle",
    source: source("paddle", "pdl_ntfset_k"),
    signedHeaders: ["paddle-signature"],
    make: wrapped("paddle", "paddle", "pdl_ntfset_k"),
  },
  {
    name: "linear",
    source: source("linear", "lin_wh_k"),
    signedHeaders: ["linear-signature"],
    make: wrapped("linear", "linear", "lin_wh_k"),
  },
  {
    name: "square",
    source: source("square", SQUARE.key),
    signedHeaders: ["x-square-hmacsha256-signature"],
    make: wrapped("square", "square", SQUARE.key, { url: SQUARE.url }),
  },
  { name: "twilio", source: source("twilio", TWILIO.token), signedHeaders: ["x-twilio-signature"], make: twilioJson },
  {
    name: "zoom",
    source: source("zoom", "zoom-secret-token"),
    signedHeaders: ["x-zm-signature", "x-zm-request-timestamp"],
    make: wrapped("zoom", "zoom", "zoom-secret-token"),
  },
  {
    name: "intercom",
    source: source("intercom", "intercom-client-secret"),
    signedHeaders: ["x-hub-signature"],
    make: wrapped("intercom", "intercom", "intercom-client-secret"),
  },
  {
    name: "hmac",
    source: source("hmac", "acme-secret", undefined, CUSTOM),
    signedHeaders: ["x-acme-signature", "x-acme-time", "x-acme-account"],
    make: wrapped(
      "custom",
      "hmac",
      "acme-secret",
      { headers: { "x-acme-account": "acct_1" } },
      CUSTOM as unknown as SignatureScheme,
    ),
  },
];

/** Mutation is one changed byte: in the body, or in one of the signed headers (printable, as HTTP allows). */
export type Mutation =
  | { where: "body"; index: number; byte: number }
  | { where: "header"; which: number; index: number; byte: number };

/** mutationArb draws a changed byte; apply() turns it into a real change (never the same byte again). */
export const mutationArb: fc.Arbitrary<Mutation> = fc.oneof(
  fc.record({ where: fc.constant("body" as const), index: fc.nat(), byte: fc.integer({ min: 1, max: 255 }) }),
  fc.record({
    where: fc.constant("header" as const),
    which: fc.nat(),
    index: fc.nat(),
    byte: fc.integer({ min: 1, max: 93 }),
  }),
);
/** idArb draws delivery IDs as providers write them. */
export const idArb = fc.stringMatching(/^[A-Za-z0-9_-]{1,40}$/);
/** bodyArb draws raw bodies, any bytes, so nothing relies on the body being text. */
export const bodyArb = fc.uint8Array({ minLength: 1, maxLength: 200 }).map((a) => Buffer.from(a));

/** apply changes exactly one byte; header bytes stay in printable ASCII (0x21-0x7e) so HTTP can carry them. */
export function apply(
  scheme: Scheme,
  signed: { headers: Record<string, string>; body: Buffer; query?: string },
  m: Mutation,
) {
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
  return { headers, body, query: signed.query };
}

// test/providers.test.ts: every signature scheme checked through verify(), no network: the providers'
// published vectors, exact replay windows, key rotation, unknown versions, repeated headers, the sources
// file, the providers' own SDKs, and a property test that any changed byte is refused.

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { sign as octokitSign, verify as octokitVerify } from "@octokit/webhooks-methods";
import fc from "fast-check";
import { Webhook as StandardWebhook } from "standardwebhooks";
import Stripe from "stripe";
import { Webhook as SvixWebhook } from "svix";
import { loadSources, sign, verify, type Provider, type Source, type Verdict } from "../providers.ts";
import {
  GITHUB, SCHEMES, SLACK, STANDARD, STRIPE_SECRET, T, apply, bodyArb, headers, hmac, idArb, mutationArb, source, standardKey, svixHeaders,
} from "./provider-fixtures.ts";

const stripeEvent = (id = "evt_1", type = "invoice.paid") => JSON.stringify({ id, object: "event", type, data: { object: { amount: 5 } } });
const slackEvent = (id = "Ev1", type = "app_mention") => JSON.stringify({ type: "event_callback", event_id: id, event: { type, text: "hi" } });

const delivered = (v: Verdict) => {
  assert.equal(v.kind, "delivery", `expected a delivery, got ${JSON.stringify(v)}`);
  return v as Extract<Verdict, { kind: "delivery" }>;
};
const refused = (v: Verdict, status: 400 | 401, reason?: RegExp) => {
  assert.equal(v.kind, "reject", `expected a ${status}, got ${JSON.stringify(v)}`);
  const r = v as Extract<Verdict, { kind: "reject" }>;
  assert.equal(r.status, status, r.reason);
  if (reason) assert.match(r.reason, reason);
};

describe("the published test vectors", () => {
  it("Standard Webhooks: the spec's secret, id, timestamp and body give its signature, and verify", () => {
    const h = sign("standard", STANDARD.secret, { id: STANDARD.id, body: STANDARD.body, timestampS: STANDARD.ts });
    assert.equal(h["webhook-signature"], STANDARD.signature);
    const v = delivered(verify(source("standard", STANDARD.secret), headers({
      "webhook-id": STANDARD.id, "webhook-timestamp": String(STANDARD.ts), "webhook-signature": STANDARD.signature,
    }), Buffer.from(STANDARD.body), STANDARD.ts * 1000));
    assert.deepEqual(v, { kind: "delivery", id: STANDARD.id, eventType: null, providerTime: STANDARD.ts * 1000 });
  });

  it("GitHub: \"It's a Secret to Everybody\" over \"Hello, World!\" gives the documented sha256", () => {
    assert.equal(sign("github", GITHUB.secret, { id: "d1", body: GITHUB.body, timestampS: T })["x-hub-signature-256"], GITHUB.signature);
    const v = delivered(verify(source("github", GITHUB.secret), headers({
      "x-hub-signature-256": GITHUB.signature, "x-github-delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958", "x-github-event": "issues",
    }), Buffer.from(GITHUB.body), 0));
    assert.equal(v.id, "72d3162e-cc78-11e3-81ab-4c9367dc0958");
    assert.equal(v.eventType, "issues");
  });

  it("Slack: the guide's signing secret, timestamp and body give its v0 signature, and the signature verifies", () => {
    assert.equal(sign("slack", SLACK.secret, { id: "", body: SLACK.body, timestampS: SLACK.ts })["x-slack-signature"], SLACK.signature);
    const h = headers({ "content-type": "application/x-www-form-urlencoded", "x-slack-signature": SLACK.signature, "x-slack-request-timestamp": String(SLACK.ts) });
    // A slash command carries no event_id: it is keyed by its trigger_id, and typed by its command.
    assert.deepEqual(verify(source("slack", SLACK.secret), h, Buffer.from(SLACK.body), SLACK.ts * 1000),
      { kind: "delivery", id: "398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c", eventType: "/webhook-collect", providerTime: SLACK.ts * 1000 });
    const wrong = headers({ "content-type": "application/x-www-form-urlencoded", "x-slack-signature": SLACK.signature.replace("a2114", "a2115"), "x-slack-request-timestamp": String(SLACK.ts) });
    refused(verify(source("slack", SLACK.secret), wrong, Buffer.from(SLACK.body), SLACK.ts * 1000), 401, /does not match/);
  });
});

describe("replay windows", () => {
  const standardAt = (ts: number, nowS: number, ms = 0, tolerance?: number) => {
    const body = Buffer.from('{"type":"ping"}');
    const h = headers(sign("standard", STANDARD.secret, { id: "msg_1", body, timestampS: ts }));
    return verify(source("standard", STANDARD.secret, tolerance), h, body, nowS * 1000 + ms);
  };
  it("standard accepts exactly 300 s either way and refuses 301, to the second", () => {
    delivered(standardAt(T, T + 300, 999));
    refused(standardAt(T, T + 301), 401, /301 s old/);
    delivered(standardAt(T, T - 300));
    refused(standardAt(T, T - 301, 999), 401, /301 s ahead/);
  });
  it("standard takes its tolerance from the source", () => {
    delivered(standardAt(T, T + 10, 999, 10));
    refused(standardAt(T, T + 11, 0, 10), 401, /over the 10-s window/);
    refused(standardAt(T, T - 11, 0, 10), 401, /ahead/);
  });

  const stripeAt = (ts: number, nowS: number, ms = 0) => {
    const body = Buffer.from(stripeEvent());
    const h = headers({ "stripe-signature": `t=${ts},v1=${hmac(STRIPE_SECRET, `${ts}.${body}`, "hex")}` });
    return verify(source("stripe", STRIPE_SECRET), h, body, nowS * 1000 + ms);
  };
  it("stripe accepts a timestamp exactly 300 s old and refuses 301", () => {
    delivered(stripeAt(T, T + 300, 999));
    refused(stripeAt(T, T + 301), 401, /301 s old/);
  });
  it("stripe's window looks only into the past, as Stripe's own libraries do", () => {
    delivered(stripeAt(T + 3600, T));
  });

  const slackAt = (ts: number, nowS: number, ms = 0) => {
    const body = Buffer.from(slackEvent());
    const h = headers({ "x-slack-request-timestamp": String(ts), "x-slack-signature": `v0=${hmac(SLACK.secret, `v0:${ts}:${body}`, "hex")}` });
    return verify(source("slack", SLACK.secret), h, body, nowS * 1000 + ms);
  };
  it("slack accepts exactly 300 s either way and refuses 301", () => {
    delivered(slackAt(T, T + 300, 999));
    refused(slackAt(T, T + 301), 401, /old/);
    delivered(slackAt(T, T - 300));
    refused(slackAt(T, T - 301, 999), 401, /ahead/);
  });
  it("github, shopify and plain sign no timestamp, so a year-old delivery still verifies", () => {
    const body = Buffer.from("{}");
    const yearLater = (T + 365 * 86400) * 1000;
    for (const provider of ["github", "shopify", "plain"] as const) {
      delivered(verify(source(provider, "k"), headers(sign(provider, "k", { id: "d1", body, timestampS: T })), body, yearLater));
    }
  });
});

describe("timestamps", () => {
  it("refuses a timestamp that is not a plain whole number, even when it is correctly signed", () => {
    const body = stripeEvent();
    for (const ts of ["1700000000.0", "+1700000000", "1.7e9", " 1700000000", "1700000000 ", "-1", "0x6553f100", "", "１７００"]) {
      const std = headers({ "webhook-id": "m", "webhook-timestamp": ts, "webhook-signature": `v1,${hmac(standardKey(STANDARD.secret), `m.${ts}.${body}`, "base64")}` });
      refused(verify(source("standard", STANDARD.secret), std, Buffer.from(body), T * 1000), 401);
      const stripe = headers({ "stripe-signature": `t=${ts},v1=${hmac(STRIPE_SECRET, `${ts}.${body}`, "hex")}` });
      refused(verify(source("stripe", STRIPE_SECRET), stripe, Buffer.from(body), T * 1000), 401);
      const slack = headers({ "x-slack-request-timestamp": ts, "x-slack-signature": `v0=${hmac(SLACK.secret, `v0:${ts}:${body}`, "hex")}` });
      refused(verify(source("slack", SLACK.secret), slack, Buffer.from(body), T * 1000), 401);
    }
  });
  it("refuses a Stripe-Signature that gives t= twice", () => {
    const body = stripeEvent();
    const v1 = hmac(STRIPE_SECRET, `${T}.${body}`, "hex");
    refused(verify(source("stripe", STRIPE_SECRET), headers({ "stripe-signature": `t=${T},t=${T},v1=${v1}` }), Buffer.from(body), T * 1000), 401, /t= more than once/);
  });
});

describe("secrets and signatures", () => {
  const body = Buffer.from(stripeEvent("evt_rot"));
  const cases: { provider: Provider; old: string; next: string; stranger: string }[] = [
    { provider: "standard", old: STANDARD.secret, next: "whsec_" + Buffer.alloc(32, 7).toString("base64"), stranger: "whsec_" + Buffer.alloc(32, 9).toString("base64") },
    { provider: "stripe", old: STRIPE_SECRET, next: "whsec_new", stranger: "whsec_other" },
    { provider: "github", old: "old", next: "new", stranger: "other" },
    { provider: "shopify", old: "old", next: "new", stranger: "other" },
    { provider: "slack", old: "old", next: "new", stranger: "other" },
    { provider: "plain", old: "old", next: "new", stranger: "other" },
  ];
  for (const { provider, old, next, stranger } of cases) {
    it(`${provider}: during a rotation either secret verifies; any other is refused`, () => {
      const both = source(provider, [old, next]);
      const bodyFor = provider === "slack" ? Buffer.from(slackEvent()) : body;
      for (const secret of [old, next]) delivered(verify(both, headers(sign(provider, secret, { id: "d1", body: bodyFor, timestampS: T })), bodyFor, T * 1000));
      refused(verify(both, headers(sign(provider, stranger, { id: "d1", body: bodyFor, timestampS: T })), bodyFor, T * 1000), 401, /does not match/);
      // Control: the retired secret alone no longer verifies what the new one signed.
      refused(verify(source(provider, old), headers(sign(provider, next, { id: "d1", body: bodyFor, timestampS: T })), bodyFor, T * 1000), 401);
    });
  }

  it("standard accepts the delivery when any one of several signatures matches, and skips versions it does not know", () => {
    const good = sign("standard", STANDARD.secret, { id: "m", body, timestampS: T })["webhook-signature"]!;
    const forged = "v1," + Buffer.alloc(32).toString("base64");
    const src = source("standard", STANDARD.secret);
    for (const signature of [`${forged} ${good}`, `${good} ${forged}`, `v1a,${"A".repeat(88)} v2,xyz ${good}`]) {
      delivered(verify(src, headers({ "webhook-id": "m", "webhook-timestamp": String(T), "webhook-signature": signature }), body, T * 1000));
    }
    refused(verify(src, headers({ "webhook-id": "m", "webhook-timestamp": String(T), "webhook-signature": `v1a,${good.slice(3)} v2,${good.slice(3)}` }), body, T * 1000), 401, /no v1/);
  });

  it("stripe accepts any matching v1 among several and ignores v0 and unknown schemes", () => {
    const v1 = hmac(STRIPE_SECRET, `${T}.${body}`, "hex");
    const src = source("stripe", STRIPE_SECRET);
    const at = (header: string) => verify(src, headers({ "stripe-signature": header }), body, T * 1000);
    delivered(at(`t=${T},v1=${"0".repeat(64)},v1=${v1}`));
    delivered(at(`t=${T},v0=${"f".repeat(64)},v2=abc,v1=${v1}`));
    refused(at(`t=${T},v0=${v1}`), 401, /no v1/);
  });

  it("slack and github have one signature version each: another is refused as unsigned", () => {
    const slackBody = Buffer.from(slackEvent());
    refused(verify(source("slack", "k"), headers({ "x-slack-request-timestamp": String(T), "x-slack-signature": `v1=${hmac("k", `v0:${T}:${slackBody}`, "hex")}` }), slackBody, T * 1000), 401, /no v0/);
    refused(verify(source("github", "k"), headers({ "x-hub-signature-256": `sha1=${hmac("k", "{}", "hex")}`, "x-github-delivery": "d" }), Buffer.from("{}"), 0), 401);
  });

  it("compares the encoded signature exactly: upper-case hex or altered base64 padding bits are refused", () => {
    const src = source("github", GITHUB.secret);
    refused(verify(src, headers({ "x-hub-signature-256": GITHUB.signature.toUpperCase().replace("SHA256", "sha256"), "x-github-delivery": "d" }), Buffer.from(GITHUB.body), 0), 401);
    // "...1OE=" and "...1OF=" decode to the same bytes in a lenient decoder; only the sent text counts.
    const loose = STANDARD.signature.replace("1OE=", "1OF=");
    assert.deepEqual(Buffer.from(loose.slice(3), "base64"), Buffer.from(STANDARD.signature.slice(3), "base64"));
    refused(verify(source("standard", STANDARD.secret), headers({ "webhook-id": STANDARD.id, "webhook-timestamp": String(STANDARD.ts), "webhook-signature": loose }), Buffer.from(STANDARD.body), STANDARD.ts * 1000), 401);
  });

  it("a source with no secrets refuses every signed scheme rather than waving it through", () => {
    const open: Source = { name: "s", provider: "github", secrets: [], toleranceS: 0 };
    refused(verify(open, headers(sign("github", "k", { id: "d", body: "{}", timestampS: T })), Buffer.from("{}"), 0), 401);
  });
});

describe("repeated headers", () => {
  const body = Buffer.from(stripeEvent());
  const slackBody = Buffer.from(slackEvent());
  const twice = (h: Record<string, string>, name: string) => headers({ ...h, [name]: [h[name]!, h[name]!] });
  const cases: [Provider, string, Buffer, string, 400 | 401][] = [
    ["standard", STANDARD.secret, body, "webhook-signature", 401],
    ["standard", STANDARD.secret, body, "webhook-timestamp", 401],
    ["standard", STANDARD.secret, body, "webhook-id", 400],
    ["stripe", STRIPE_SECRET, body, "stripe-signature", 401],
    ["github", "k", body, "x-hub-signature-256", 401],
    ["github", "k", body, "x-github-delivery", 400],
    ["shopify", "k", body, "x-shopify-hmac-sha256", 401],
    ["shopify", "k", body, "x-shopify-webhook-id", 400],
    ["slack", "k", slackBody, "x-slack-signature", 401],
    ["slack", "k", slackBody, "x-slack-request-timestamp", 401],
    ["plain", "k", body, "x-signature", 401],
    ["plain", "k", body, "x-delivery-id", 400],
  ];
  for (const [provider, secret, b, name, status] of cases) {
    it(`${provider}: ${name} sent twice, even with the same valid value, is refused with ${status}`, () => {
      const h = sign(provider, secret, { id: "d1", body: b, timestampS: T });
      delivered(verify(source(provider, secret), headers(h), b, T * 1000)); // control
      refused(verify(source(provider, secret), twice(h, name), b, T * 1000), status, /more than once/);
    });
  }
  it("svix: svix-signature, svix-timestamp and svix-id sent twice are refused too", () => {
    const h = svixHeaders("msg_1", body, T);
    for (const [name, status] of [["svix-signature", 401], ["svix-timestamp", 401], ["svix-id", 400]] as const) {
      refused(verify(source("standard", STANDARD.secret), twice(h, name), body, T * 1000), status, /more than once/);
    }
  });
});

describe("the delivery ID, event type and provider time", () => {
  it("standard: webhook-id, type from the body, the signed timestamp; a body that is not JSON is still a delivery", () => {
    const src = source("standard", STANDARD.secret);
    const body = Buffer.from('{"type":"invoice.paid","data":{}}');
    assert.deepEqual(verify(src, headers(sign("standard", STANDARD.secret, { id: "msg_9", body, timestampS: T })), body, T * 1000),
      { kind: "delivery", id: "msg_9", eventType: "invoice.paid", providerTime: T * 1000 });
    const raw = Buffer.from([0xff, 0x00, 0x80]);
    assert.equal(delivered(verify(src, headers(sign("standard", STANDARD.secret, { id: "msg_b", body: raw, timestampS: T })), raw, T * 1000)).eventType, null);
  });
  it("standard: a missing webhook-id is a 400, a missing signature or timestamp a 401", () => {
    const src = source("standard", STANDARD.secret);
    const body = Buffer.from("{}");
    const h = sign("standard", STANDARD.secret, { id: "m", body, timestampS: T });
    for (const [name, status] of [["webhook-id", 400], ["webhook-signature", 401], ["webhook-timestamp", 401]] as const) {
      const { [name]: _gone, ...rest } = h;
      refused(verify(src, headers(rest), body, T * 1000), status, /missing/);
    }
  });
  it("svix: the same scheme under svix-id, svix-timestamp, svix-signature", () => {
    const body = Buffer.from('{"type":"user.created"}');
    assert.deepEqual(verify(source("standard", STANDARD.secret), headers(svixHeaders("msg_svix", body, T)), body, T * 1000),
      { kind: "delivery", id: "msg_svix", eventType: "user.created", providerTime: T * 1000 });
  });
  it("stripe: id and type from the verified JSON body, time from t=; no id is a 400", () => {
    const src = source("stripe", STRIPE_SECRET);
    const at = (body: string) => verify(src, headers(sign("stripe", STRIPE_SECRET, { id: "", body, timestampS: T })), Buffer.from(body), T * 1000);
    assert.deepEqual(at(stripeEvent("evt_42", "charge.refunded")), { kind: "delivery", id: "evt_42", eventType: "charge.refunded", providerTime: T * 1000 });
    refused(at('{"object":"event","type":"x"}'), 400, /missing id/);
    refused(at('{"id":""}'), 400, /missing id/);
    refused(at('{"id":42}'), 400, /missing id/);
    refused(at("not json"), 400, /not a JSON event/);
    refused(at("[1,2]"), 400, /not a JSON event/);
  });
  it("github: X-GitHub-Delivery and X-GitHub-Event; no delivery header is a 400 once the signature holds", () => {
    const src = source("github", "k");
    const h = sign("github", "k", { id: "g1", body: "{}", timestampS: T, eventType: "push" });
    assert.deepEqual(verify(src, headers(h), Buffer.from("{}"), 0), { kind: "delivery", id: "g1", eventType: "push", providerTime: null });
    const { "x-github-delivery": _id, ...noId } = h;
    refused(verify(src, headers(noId), Buffer.from("{}"), 0), 400, /missing X-GitHub-Delivery/);
    const { "x-hub-signature-256": _sig, ...noSig } = h;
    refused(verify(src, headers(noSig), Buffer.from("{}"), 0), 401, /missing/);
  });
  it("shopify: X-Shopify-Event-Id keys the delivery, X-Shopify-Webhook-Id only when it is absent; no ID is a 400", () => {
    const src = source("shopify", "k");
    const signature = sign("shopify", "k", { id: "", body: "{}", timestampS: T })["x-shopify-hmac-sha256"]!;
    const at = (h: Record<string, string>) => verify(src, headers({ "x-shopify-hmac-sha256": signature, "x-shopify-topic": "orders/create", ...h }), Buffer.from("{}"), 0);
    // Shopify sends one event to every subscription, and again on retry, under one X-Shopify-Event-Id.
    assert.deepEqual(at({ "x-shopify-event-id": "ev1", "x-shopify-webhook-id": "wh1" }), { kind: "delivery", id: "ev1", eventType: "orders/create", providerTime: null });
    assert.equal(delivered(at({ "x-shopify-webhook-id": "wh1" })).id, "wh1");
    refused(at({}), 400, /missing X-Shopify-Event-Id and X-Shopify-Webhook-Id/);
    refused(verify(src, headers({ "x-shopify-hmac-sha256": signature, "x-shopify-event-id": ["a", "a"] }), Buffer.from("{}"), 0), 400, /X-Shopify-Event-Id sent more than once/);
  });
  it("slack: event_id and event.type from the verified body, time from the timestamp header", () => {
    const src = source("slack", "k");
    const at = (body: string) => verify(src, headers(sign("slack", "k", { id: "", body, timestampS: T })), Buffer.from(body), T * 1000);
    assert.deepEqual(at(slackEvent("Ev08", "reaction_added")), { kind: "delivery", id: "Ev08", eventType: "reaction_added", providerTime: T * 1000 });
    refused(at('{"type":"event_callback","event":{"type":"x"}}'), 400, /event_id/);
  });
  it("slack: the signed url_verification handshake is answered with its challenge, not stored", () => {
    const body = JSON.stringify({ token: "Jhj5dZrVaK7ZwHHjRyZWjbDl", challenge: "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P", type: "url_verification" });
    const src = source("slack", "k");
    assert.deepEqual(verify(src, headers(sign("slack", "k", { id: "", body, timestampS: T })), Buffer.from(body), T * 1000),
      { kind: "reply", status: 200, contentType: "text/plain; charset=utf-8", body: "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P" });
    // Unsigned, it is just another forgery.
    refused(verify(src, headers({ "x-slack-request-timestamp": String(T), "x-slack-signature": "v0=" + "0".repeat(64) }), Buffer.from(body), T * 1000), 401);
  });
  it("plain: X-Delivery-Id, with X-Signature checked only when the source has a secret", () => {
    const body = Buffer.from("{}");
    delivered(verify(source("plain", undefined), headers({ "x-delivery-id": "p1" }), body, 0));
    refused(verify(source("plain", "k"), headers({ "x-delivery-id": "p1" }), body, 0), 401, /missing X-Signature/);
    delivered(verify(source("plain", "k"), headers(sign("plain", "k", { id: "p1", body, timestampS: 0 })), body, 0));
  });
});

describe("loadSources()", () => {
  const fails = (config: unknown, pattern: RegExp, env: Record<string, string> = {}) =>
    assert.throws(() => loadSources(config, env), (error: unknown) => error instanceof TypeError && pattern.test(error.message));

  it("reads the issue's example, taking env: secrets from the environment and defaulting the tolerance", () => {
    const sources = loadSources({
      stripe: { provider: "stripe", secret: STRIPE_SECRET },
      github: { provider: "github", secret: ["old", "new"] },
      billing: { provider: "standard", secret: "env:BILLING_WEBHOOK_SECRET", tolerance: 600 },
    }, { BILLING_WEBHOOK_SECRET: STANDARD.secret });
    assert.deepEqual([...sources.keys()], ["stripe", "github", "billing"]);
    assert.deepEqual(sources.get("github")!.secrets, [Buffer.from("old"), Buffer.from("new")]);
    assert.equal(sources.get("stripe")!.toleranceS, 300);
    assert.equal(sources.get("billing")!.toleranceS, 600);
    assert.deepEqual(sources.get("billing")!.secrets, [standardKey(STANDARD.secret)]);
    assert.deepEqual(sources.get("stripe")!.secrets, [Buffer.from(STRIPE_SECRET)]);
  });
  it("lets a plain source go unsigned", () => {
    assert.deepEqual(loadSources({ open: { provider: "plain" } }, {}).get("open")!.secrets, []);
  });
  it("names the source and the mistake", () => {
    fails({ s: { provider: "strip", secret: "x" } }, /source "s": unknown provider "strip"; expected one of standard, stripe, github, shopify, slack, paddle, linear, square, twilio, zoom, intercom, plain, hmac/);
    fails({ s: { secret: "x" } }, /unknown provider \(none\)/);
    fails({ s: { provider: "github" } }, /source "s": missing secret/);
    fails({ s: { provider: "github", secret: [] } }, /missing secret/);
    fails({ s: { provider: "github", secret: "" } }, /secret is empty/);
    fails({ s: { provider: "github", secret: 42 } }, /string or a list of strings/);
    fails({ s: { provider: "github", secret: "env:GH_SECRET" } }, /environment variable GH_SECRET, which is not set/);
    fails({ s: { provider: "github", secret: ["a", "env:GH_SECRET"] } }, /secret #2 reads the environment variable GH_SECRET/, { GH_SECRET: "" });
    fails({ s: { provider: "standard", secret: "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw" } }, /not a whsec_ secret/);
    fails({ s: { provider: "standard", secret: "whsec_" } }, /not a whsec_ secret/);
    fails({ s: { provider: "standard", secret: "whsec_not base64!" } }, /not a whsec_ secret/);
    fails({ s: { provider: "standard", secret: "env:S" } }, /not a whsec_ secret/, { S: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS" });
    fails({ s: { provider: "stripe", secret: "sk_live_oops" } }, /not a whsec_ secret/);
    fails({ s: { provider: "github", secret: "k", tolerance: 60 } }, /tolerance applies only to standard, stripe, slack, paddle, linear, zoom; github signs no timestamp/);
    fails({ s: { provider: "stripe", secret: STRIPE_SECRET, tolerance: 0 } }, /whole number of seconds, 1 or more, got 0/);
    fails({ s: { provider: "stripe", secret: STRIPE_SECRET, tolerance: "300" } }, /got "300"/);
    fails({ s: { provider: "github", secrets: ["k"] } }, /unknown setting "secrets"/);
    fails({ "a/b": { provider: "github", secret: "k" } }, /it is the URL path/);
    fails({ s: "github" }, /expected an object with provider and secret, got string/);
    fails([], /expected a JSON object mapping source names to settings, got a list/);
    fails({}, /at least one source/);
  });
  it("never puts a secret in its message", () => {
    for (const [config, env] of [
      [{ s: { provider: "standard", secret: "whsec_TOPSECRET!!" } }, {}],
      [{ s: { provider: "stripe", secret: "TOPSECRET" } }, {}],
      [{ s: { provider: "standard", secret: "env:X" } }, { X: "TOPSECRET" }],
    ] as const) {
      assert.throws(() => loadSources(config, env), (error: Error) => !error.message.includes("TOPSECRET"));
    }
  });
});

describe("the providers' own SDKs", () => {
  const now = () => Math.floor(Date.now() / 1000);
  it("standardwebhooks: what its Webhook.sign() signs is accepted, and what sign() signs its verify() accepts", () => {
    const wh = new StandardWebhook(STANDARD.secret);
    const body = '{"type":"invoice.paid","n":1}';
    const ts = now();
    const h = { "webhook-id": "msg_sdk", "webhook-timestamp": String(ts), "webhook-signature": wh.sign("msg_sdk", new Date(ts * 1000), body) };
    assert.equal(delivered(verify(source("standard", STANDARD.secret), headers(h), Buffer.from(body), ts * 1000)).eventType, "invoice.paid");
    assert.deepEqual(wh.verify(body, sign("standard", STANDARD.secret, { id: "msg_me", body, timestampS: ts })), JSON.parse(body));
  });
  it("svix: its Webhook.sign() under svix-* headers is accepted, and it verifies ours", () => {
    const body = '{"type":"user.created"}';
    const ts = now();
    delivered(verify(source("standard", STANDARD.secret), headers(svixHeaders("msg_svix", body, ts)), Buffer.from(body), ts * 1000));
    const ours = sign("standard", STANDARD.secret, { id: "msg_me", body, timestampS: ts });
    const asSvix = { "svix-id": ours["webhook-id"]!, "svix-timestamp": ours["webhook-timestamp"]!, "svix-signature": ours["webhook-signature"]! };
    assert.deepEqual(new SvixWebhook(STANDARD.secret).verify(body, asSvix), JSON.parse(body));
  });
  it("stripe: webhooks.generateTestHeaderString() is accepted, and constructEvent() accepts ours", () => {
    const stripe = new Stripe("sk_test_not_used");
    const body = stripeEvent("evt_sdk", "payment_intent.succeeded");
    const ts = now();
    const header = stripe.webhooks.generateTestHeaderString({ payload: body, secret: STRIPE_SECRET, timestamp: ts });
    assert.deepEqual(verify(source("stripe", STRIPE_SECRET), headers({ "stripe-signature": header }), Buffer.from(body), ts * 1000),
      { kind: "delivery", id: "evt_sdk", eventType: "payment_intent.succeeded", providerTime: ts * 1000 });
    const ours = sign("stripe", STRIPE_SECRET, { id: "evt_sdk", body, timestampS: ts })["stripe-signature"]!;
    assert.equal(stripe.webhooks.constructEvent(body, ours, STRIPE_SECRET).id, "evt_sdk");
  });
  it("@octokit/webhooks-methods: its sign() is accepted, and its verify() accepts ours", async () => {
    const body = '{"action":"opened","number":1}';
    const signature = await octokitSign("octo-secret", body);
    delivered(verify(source("github", "octo-secret"), headers({ "x-hub-signature-256": signature, "x-github-delivery": "g-sdk", "x-github-event": "pull_request" }), Buffer.from(body), 0));
    assert.equal(await octokitVerify("octo-secret", body, sign("github", "octo-secret", { id: "g", body, timestampS: 0 })["x-hub-signature-256"]!), true);
  });
});

describe("a property: changing any one signed byte", () => {
  for (const scheme of SCHEMES) {
    it(`${scheme.name}: any changed byte of the body, signature, timestamp or signed ID gets a 401`, () => {
      fc.assert(fc.property(idArb, bodyArb, mutationArb, (id, body, m) => {
        const signed = scheme.make(id, body);
        const ok = verify(scheme.source, headers(signed.headers), signed.body, T * 1000, `/${signed.query ?? ""}`);
        assert.equal(ok.kind, "delivery", `control: the unchanged delivery verifies (${JSON.stringify(ok)})`);
        const forged = apply(scheme, signed, m);
        const v = verify(scheme.source, headers(forged.headers), forged.body, T * 1000, `/${forged.query ?? ""}`);
        assert.equal(v.kind === "reject" && v.status, 401, `${JSON.stringify(m)} gave ${JSON.stringify(v)}`);
      }), { numRuns: 400 });
    });
  }

  it("github, shopify and plain do not sign their ID header: a changed ID verifies, as a different delivery", () => {
    for (const scheme of SCHEMES.filter((s) => ["github", "shopify", "plain"].includes(s.name))) {
      const signed = scheme.make("d1", Buffer.from("{}"));
      const idHeader = Object.keys(signed.headers).find((h) => /delivery|event-id|^x-delivery-id/.test(h))!;
      const v = verify(scheme.source, headers({ ...signed.headers, [idHeader]: "d2" }), signed.body, T * 1000);
      assert.equal(delivered(v).id, "d2");
    }
  });
});

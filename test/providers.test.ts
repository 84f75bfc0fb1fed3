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
import { LinearWebhookClient } from "@linear/sdk/webhooks";
import { Paddle } from "@paddle/paddle-node-sdk";
import { WebhooksHelper as SquareWebhooks } from "square";
import twilio from "twilio";
import { createHash, createHmac } from "node:crypto";
import {
  PRESETS,
  loadSources,
  sign,
  verify,
  type Provider,
  type Scheme,
  type Source,
  type Verdict,
} from "../lib/config/sources.ts";
import {
  CUSTOM,
  GITHUB,
  SCHEMES,
  SLACK,
  SQUARE,
  STANDARD,
  STRIPE_SECRET,
  T,
  TWILIO,
  apply,
  bodyArb,
  headers,
  hmac,
  idArb,
  mutationArb,
  source,
  standardKey,
  svixHeaders,
} from "./provider-fixtures.ts";

const stripeEvent = (id = "evt_1", type = "invoice.paid") =>
  JSON.stringify({ id, object: "event", type, data: { object: { amount: 5 } } });
const slackEvent = (id = "Ev1", type = "app_mention") =>
  JSON.stringify({ type: "event_callback", event_id: id, event: { type, text: "hi" } });

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
    const v = delivered(
      verify(
        source("standard", STANDARD.secret),
        headers({
          "webhook-id": STANDARD.id,
          "webhook-timestamp": String(STANDARD.ts),
          "webhook-signature": STANDARD.signature,
        }),
        Buffer.from(STANDARD.body),
        STANDARD.ts * 1000,
      ),
    );
    assert.deepEqual(v, { kind: "delivery", id: STANDARD.id, eventType: null, providerTime: STANDARD.ts * 1000 });
  });

  it('GitHub: "It\'s a Secret to Everybody" over "Hello, World!" gives the documented sha256', () => {
    assert.equal(
      sign("github", GITHUB.secret, { id: "d1", body: GITHUB.body, timestampS: T })["x-hub-signature-256"],
      GITHUB.signature,
    );
    const v = delivered(
      verify(
        source("github", GITHUB.secret),
        headers({
          "x-hub-signature-256": GITHUB.signature,
          "x-github-delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958",
          "x-github-event": "issues",
        }),
        Buffer.from(GITHUB.body),
        0,
      ),
    );
    assert.equal(v.id, "72d3162e-cc78-11e3-81ab-4c9367dc0958");
    assert.equal(v.eventType, "issues");
  });

  it("Slack: the guide's signing secret, timestamp and body give its v0 signature, and the signature verifies", () => {
    assert.equal(
      sign("slack", SLACK.secret, { id: "", body: SLACK.body, timestampS: SLACK.ts })["x-slack-signature"],
      SLACK.signature,
    );
    const h = headers({
      "content-type": "application/x-www-form-urlencoded",
      "x-slack-signature": SLACK.signature,
      "x-slack-request-timestamp": String(SLACK.ts),
    });
    // A slash command carries no event_id: it is keyed by its trigger_id, and typed by its command.
    assert.deepEqual(verify(source("slack", SLACK.secret), h, Buffer.from(SLACK.body), SLACK.ts * 1000), {
      kind: "delivery",
      id: "398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c",
      eventType: "/webhook-collect",
      providerTime: SLACK.ts * 1000,
    });
    const wrong = headers({
      "content-type": "application/x-www-form-urlencoded",
      "x-slack-signature": SLACK.signature.replace("a2114", "a2115"),
      "x-slack-request-timestamp": String(SLACK.ts),
    });
    refused(
      verify(source("slack", SLACK.secret), wrong, Buffer.from(SLACK.body), SLACK.ts * 1000),
      401,
      /does not match/,
    );
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
    const h = headers({
      "x-slack-request-timestamp": String(ts),
      "x-slack-signature": `v0=${hmac(SLACK.secret, `v0:${ts}:${body}`, "hex")}`,
    });
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
      delivered(
        verify(source(provider, "k"), headers(sign(provider, "k", { id: "d1", body, timestampS: T })), body, yearLater),
      );
    }
  });
});

describe("timestamps", () => {
  it("refuses a timestamp that is not a plain whole number, even when it is correctly signed", () => {
    const body = stripeEvent();
    for (const ts of [
      "1700000000.0",
      "+1700000000",
      "1.7e9",
      " 1700000000",
      "1700000000 ",
      "-1",
      "0x6553f100",
      "",
      "１７００",
    ]) {
      const std = headers({
        "webhook-id": "m",
        "webhook-timestamp": ts,
        "webhook-signature": `v1,${hmac(standardKey(STANDARD.secret), `m.${ts}.${body}`, "base64")}`,
      });
      refused(verify(source("standard", STANDARD.secret), std, Buffer.from(body), T * 1000), 401);
      const stripe = headers({ "stripe-signature": `t=${ts},v1=${hmac(STRIPE_SECRET, `${ts}.${body}`, "hex")}` });
      refused(verify(source("stripe", STRIPE_SECRET), stripe, Buffer.from(body), T * 1000), 401);
      const slack = headers({
        "x-slack-request-timestamp": ts,
        "x-slack-signature": `v0=${hmac(SLACK.secret, `v0:${ts}:${body}`, "hex")}`,
      });
      refused(verify(source("slack", SLACK.secret), slack, Buffer.from(body), T * 1000), 401);
    }
  });
  it("refuses a Stripe-Signature that gives t= twice", () => {
    const body = stripeEvent();
    const v1 = hmac(STRIPE_SECRET, `${T}.${body}`, "hex");
    refused(
      verify(
        source("stripe", STRIPE_SECRET),
        headers({ "stripe-signature": `t=${T},t=${T},v1=${v1}` }),
        Buffer.from(body),
        T * 1000,
      ),
      401,
      /t= more than once/,
    );
  });
});

describe("secrets and signatures", () => {
  const body = Buffer.from(stripeEvent("evt_rot"));
  const cases: { provider: Provider; old: string; next: string; stranger: string }[] = [
    {
      provider: "standard",
      old: STANDARD.secret,
      next: "whsec_" + Buffer.alloc(32, 7).toString("base64"),
      stranger: "whsec_" + Buffer.alloc(32, 9).toString("base64"),
    },
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
      for (const secret of [old, next])
        delivered(
          verify(both, headers(sign(provider, secret, { id: "d1", body: bodyFor, timestampS: T })), bodyFor, T * 1000),
        );
      refused(
        verify(both, headers(sign(provider, stranger, { id: "d1", body: bodyFor, timestampS: T })), bodyFor, T * 1000),
        401,
        /does not match/,
      );
      // Control: the retired secret alone no longer verifies what the new one signed.
      refused(
        verify(
          source(provider, old),
          headers(sign(provider, next, { id: "d1", body: bodyFor, timestampS: T })),
          bodyFor,
          T * 1000,
        ),
        401,
      );
    });
  }

  it("standard accepts the delivery when any one of several signatures matches, and skips versions it does not know", () => {
    const good = sign("standard", STANDARD.secret, { id: "m", body, timestampS: T })["webhook-signature"]!;
    const forged = "v1," + Buffer.alloc(32).toString("base64");
    const src = source("standard", STANDARD.secret);
    for (const signature of [`${forged} ${good}`, `${good} ${forged}`, `v1a,${"A".repeat(88)} v2,xyz ${good}`]) {
      delivered(
        verify(
          src,
          headers({ "webhook-id": "m", "webhook-timestamp": String(T), "webhook-signature": signature }),
          body,
          T * 1000,
        ),
      );
    }
    refused(
      verify(
        src,
        headers({
          "webhook-id": "m",
          "webhook-timestamp": String(T),
          "webhook-signature": `v1a,${good.slice(3)} v2,${good.slice(3)}`,
        }),
        body,
        T * 1000,
      ),
      401,
      /no v1/,
    );
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
    refused(
      verify(
        source("slack", "k"),
        headers({
          "x-slack-request-timestamp": String(T),
          "x-slack-signature": `v1=${hmac("k", `v0:${T}:${slackBody}`, "hex")}`,
        }),
        slackBody,
        T * 1000,
      ),
      401,
      /no v0/,
    );
    refused(
      verify(
        source("github", "k"),
        headers({ "x-hub-signature-256": `sha1=${hmac("k", "{}", "hex")}`, "x-github-delivery": "d" }),
        Buffer.from("{}"),
        0,
      ),
      401,
    );
  });

  it("compares the encoded signature exactly: upper-case hex or altered base64 padding bits are refused", () => {
    const src = source("github", GITHUB.secret);
    refused(
      verify(
        src,
        headers({
          "x-hub-signature-256": GITHUB.signature.toUpperCase().replace("SHA256", "sha256"),
          "x-github-delivery": "d",
        }),
        Buffer.from(GITHUB.body),
        0,
      ),
      401,
    );
    // "...1OE=" and "...1OF=" decode to the same bytes in a lenient decoder; only the sent text counts.
    const loose = STANDARD.signature.replace("1OE=", "1OF=");
    assert.deepEqual(Buffer.from(loose.slice(3), "base64"), Buffer.from(STANDARD.signature.slice(3), "base64"));
    refused(
      verify(
        source("standard", STANDARD.secret),
        headers({ "webhook-id": STANDARD.id, "webhook-timestamp": String(STANDARD.ts), "webhook-signature": loose }),
        Buffer.from(STANDARD.body),
        STANDARD.ts * 1000,
      ),
      401,
    );
  });

  it("a source with no secrets refuses every signed scheme rather than waving it through", () => {
    const open: Source = { name: "s", provider: "github", secrets: [], toleranceS: 0 };
    refused(
      verify(open, headers(sign("github", "k", { id: "d", body: "{}", timestampS: T })), Buffer.from("{}"), 0),
      401,
    );
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
    for (const [name, status] of [
      ["svix-signature", 401],
      ["svix-timestamp", 401],
      ["svix-id", 400],
    ] as const) {
      refused(verify(source("standard", STANDARD.secret), twice(h, name), body, T * 1000), status, /more than once/);
    }
  });
});

describe("the delivery ID, event type and provider time", () => {
  it("standard: webhook-id, type from the body, the signed timestamp; a body that is not JSON is still a delivery", () => {
    const src = source("standard", STANDARD.secret);
    const body = Buffer.from('{"type":"invoice.paid","data":{}}');
    assert.deepEqual(
      verify(src, headers(sign("standard", STANDARD.secret, { id: "msg_9", body, timestampS: T })), body, T * 1000),
      { kind: "delivery", id: "msg_9", eventType: "invoice.paid", providerTime: T * 1000 },
    );
    const raw = Buffer.from([0xff, 0x00, 0x80]);
    assert.equal(
      delivered(
        verify(
          src,
          headers(sign("standard", STANDARD.secret, { id: "msg_b", body: raw, timestampS: T })),
          raw,
          T * 1000,
        ),
      ).eventType,
      null,
    );
  });
  it("standard: a missing webhook-id is a 400, a missing signature or timestamp a 401", () => {
    const src = source("standard", STANDARD.secret);
    const body = Buffer.from("{}");
    const h = sign("standard", STANDARD.secret, { id: "m", body, timestampS: T });
    for (const [name, status] of [
      ["webhook-id", 400],
      ["webhook-signature", 401],
      ["webhook-timestamp", 401],
    ] as const) {
      const { [name]: _gone, ...rest } = h;
      refused(verify(src, headers(rest), body, T * 1000), status, /missing/);
    }
  });
  it("svix: the same scheme under svix-id, svix-timestamp, svix-signature", () => {
    const body = Buffer.from('{"type":"user.created"}');
    assert.deepEqual(
      verify(source("standard", STANDARD.secret), headers(svixHeaders("msg_svix", body, T)), body, T * 1000),
      { kind: "delivery", id: "msg_svix", eventType: "user.created", providerTime: T * 1000 },
    );
  });
  it("stripe: id and type from the verified JSON body, time from t=; no id is a 400", () => {
    const src = source("stripe", STRIPE_SECRET);
    const at = (body: string) =>
      verify(src, headers(sign("stripe", STRIPE_SECRET, { id: "", body, timestampS: T })), Buffer.from(body), T * 1000);
    assert.deepEqual(at(stripeEvent("evt_42", "charge.refunded")), {
      kind: "delivery",
      id: "evt_42",
      eventType: "charge.refunded",
      providerTime: T * 1000,
    });
    refused(at('{"object":"event","type":"x"}'), 400, /missing id/);
    refused(at('{"id":""}'), 400, /missing id/);
    refused(at('{"id":42}'), 400, /missing id/);
    refused(at("not json"), 400, /not a JSON event/);
    refused(at("[1,2]"), 400, /not a JSON event/);
  });
  it("github: X-GitHub-Delivery and X-GitHub-Event; no delivery header is a 400 once the signature holds", () => {
    const src = source("github", "k");
    const h = sign("github", "k", { id: "g1", body: "{}", timestampS: T, eventType: "push" });
    assert.deepEqual(verify(src, headers(h), Buffer.from("{}"), 0), {
      kind: "delivery",
      id: "g1",
      eventType: "push",
      providerTime: null,
    });
    const { "x-github-delivery": _id, ...noId } = h;
    refused(verify(src, headers(noId), Buffer.from("{}"), 0), 400, /missing X-GitHub-Delivery/);
    const { "x-hub-signature-256": _sig, ...noSig } = h;
    refused(verify(src, headers(noSig), Buffer.from("{}"), 0), 401, /missing/);
  });
  it("shopify: X-Shopify-Event-Id keys the delivery, X-Shopify-Webhook-Id only when it is absent; no ID is a 400", () => {
    const src = source("shopify", "k");
    const signature = sign("shopify", "k", { id: "", body: "{}", timestampS: T })["x-shopify-hmac-sha256"]!;
    const at = (h: Record<string, string>) =>
      verify(
        src,
        headers({ "x-shopify-hmac-sha256": signature, "x-shopify-topic": "orders/create", ...h }),
        Buffer.from("{}"),
        0,
      );
    // Shopify sends one event to every subscription, and again on retry, under one X-Shopify-Event-Id.
    assert.deepEqual(at({ "x-shopify-event-id": "ev1", "x-shopify-webhook-id": "wh1" }), {
      kind: "delivery",
      id: "ev1",
      eventType: "orders/create",
      providerTime: null,
    });
    assert.equal(delivered(at({ "x-shopify-webhook-id": "wh1" })).id, "wh1");
    refused(at({}), 400, /missing X-Shopify-Event-Id and X-Shopify-Webhook-Id/);
    refused(
      verify(
        src,
        headers({ "x-shopify-hmac-sha256": signature, "x-shopify-event-id": ["a", "a"] }),
        Buffer.from("{}"),
        0,
      ),
      400,
      /X-Shopify-Event-Id sent more than once/,
    );
  });
  it("slack: event_id and event.type from the verified body, time from the timestamp header", () => {
    const src = source("slack", "k");
    const at = (body: string) =>
      verify(src, headers(sign("slack", "k", { id: "", body, timestampS: T })), Buffer.from(body), T * 1000);
    assert.deepEqual(at(slackEvent("Ev08", "reaction_added")), {
      kind: "delivery",
      id: "Ev08",
      eventType: "reaction_added",
      providerTime: T * 1000,
    });
    refused(at('{"type":"event_callback","event":{"type":"x"}}'), 400, /event_id/);
  });
  it("slack: the signed url_verification handshake is answered with its challenge, not stored", () => {
    const body = JSON.stringify({
      token: "Jhj5dZrVaK7ZwHHjRyZWjbDl",
      challenge: "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
      type: "url_verification",
    });
    const src = source("slack", "k");
    assert.deepEqual(
      verify(src, headers(sign("slack", "k", { id: "", body, timestampS: T })), Buffer.from(body), T * 1000),
      {
        kind: "reply",
        status: 200,
        contentType: "text/plain; charset=utf-8",
        body: "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
      },
    );
    // Unsigned, it is just another forgery.
    refused(
      verify(
        src,
        headers({ "x-slack-request-timestamp": String(T), "x-slack-signature": "v0=" + "0".repeat(64) }),
        Buffer.from(body),
        T * 1000,
      ),
      401,
    );
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
    assert.throws(
      () => loadSources(config, env),
      (error: unknown) => error instanceof TypeError && pattern.test(error.message),
    );

  it("reads the issue's example, taking env: secrets from the environment and defaulting the tolerance", () => {
    const sources = loadSources(
      {
        stripe: { provider: "stripe", secret: STRIPE_SECRET },
        github: { provider: "github", secret: ["old", "new"] },
        billing: { provider: "standard", secret: "env:BILLING_WEBHOOK_SECRET", tolerance: 600 },
      },
      { BILLING_WEBHOOK_SECRET: STANDARD.secret },
    );
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
    fails(
      { s: { provider: "strip", secret: "x" } },
      /source "s": unknown provider "strip"; expected one of standard, stripe, github, shopify, slack, paddle, linear, square, twilio, zoom, intercom, plain, hmac/,
    );
    fails({ s: { secret: "x" } }, /unknown provider \(none\)/);
    fails({ s: { provider: "github" } }, /source "s": missing secret/);
    fails({ s: { provider: "github", secret: [] } }, /missing secret/);
    fails({ s: { provider: "github", secret: "" } }, /secret is empty/);
    fails({ s: { provider: "github", secret: 42 } }, /string or a list of strings/);
    fails({ s: { provider: "github", secret: "env:GH_SECRET" } }, /environment variable GH_SECRET, which is not set/);
    fails(
      { s: { provider: "github", secret: ["a", "env:GH_SECRET"] } },
      /secret #2 reads the environment variable GH_SECRET/,
      { GH_SECRET: "" },
    );
    fails({ s: { provider: "standard", secret: "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw" } }, /not a whsec_ secret/);
    fails({ s: { provider: "standard", secret: "whsec_" } }, /not a whsec_ secret/);
    fails({ s: { provider: "standard", secret: "whsec_not base64!" } }, /not a whsec_ secret/);
    fails({ s: { provider: "standard", secret: "env:S" } }, /not a whsec_ secret/, {
      S: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS",
    });
    fails({ s: { provider: "stripe", secret: "sk_live_oops" } }, /not a whsec_ secret/);
    fails(
      { s: { provider: "github", secret: "k", tolerance: 60 } },
      /tolerance applies only to standard, stripe, slack, paddle, linear, zoom; github signs no timestamp/,
    );
    fails(
      { s: { provider: "stripe", secret: STRIPE_SECRET, tolerance: 0 } },
      /whole number of seconds from 1 to 86400, got 0/,
    );
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
      assert.throws(
        () => loadSources(config, env),
        (error: Error) => !error.message.includes("TOPSECRET"),
      );
    }
  });
});

describe("the providers' own SDKs", () => {
  const now = () => Math.floor(Date.now() / 1000);
  it("standardwebhooks: what its Webhook.sign() signs is accepted, and what sign() signs its verify() accepts", () => {
    const wh = new StandardWebhook(STANDARD.secret);
    const body = '{"type":"invoice.paid","n":1}';
    const ts = now();
    const h = {
      "webhook-id": "msg_sdk",
      "webhook-timestamp": String(ts),
      "webhook-signature": wh.sign("msg_sdk", new Date(ts * 1000), body),
    };
    assert.equal(
      delivered(verify(source("standard", STANDARD.secret), headers(h), Buffer.from(body), ts * 1000)).eventType,
      "invoice.paid",
    );
    assert.deepEqual(
      wh.verify(body, sign("standard", STANDARD.secret, { id: "msg_me", body, timestampS: ts })),
      JSON.parse(body),
    );
  });
  it("svix: its Webhook.sign() under svix-* headers is accepted, and it verifies ours", () => {
    const body = '{"type":"user.created"}';
    const ts = now();
    delivered(
      verify(
        source("standard", STANDARD.secret),
        headers(svixHeaders("msg_svix", body, ts)),
        Buffer.from(body),
        ts * 1000,
      ),
    );
    const ours = sign("standard", STANDARD.secret, { id: "msg_me", body, timestampS: ts });
    const asSvix = {
      "svix-id": ours["webhook-id"]!,
      "svix-timestamp": ours["webhook-timestamp"]!,
      "svix-signature": ours["webhook-signature"]!,
    };
    assert.deepEqual(new SvixWebhook(STANDARD.secret).verify(body, asSvix), JSON.parse(body));
  });
  it("stripe: webhooks.generateTestHeaderString() is accepted, and constructEvent() accepts ours", () => {
    const stripe = new Stripe("sk_test_not_used");
    const body = stripeEvent("evt_sdk", "payment_intent.succeeded");
    const ts = now();
    const header = stripe.webhooks.generateTestHeaderString({ payload: body, secret: STRIPE_SECRET, timestamp: ts });
    assert.deepEqual(
      verify(source("stripe", STRIPE_SECRET), headers({ "stripe-signature": header }), Buffer.from(body), ts * 1000),
      { kind: "delivery", id: "evt_sdk", eventType: "payment_intent.succeeded", providerTime: ts * 1000 },
    );
    const ours = sign("stripe", STRIPE_SECRET, { id: "evt_sdk", body, timestampS: ts })["stripe-signature"]!;
    assert.equal(stripe.webhooks.constructEvent(body, ours, STRIPE_SECRET).id, "evt_sdk");
  });
  it("@octokit/webhooks-methods: its sign() is accepted, and its verify() accepts ours", async () => {
    const body = '{"action":"opened","number":1}';
    const signature = await octokitSign("octo-secret", body);
    delivered(
      verify(
        source("github", "octo-secret"),
        headers({ "x-hub-signature-256": signature, "x-github-delivery": "g-sdk", "x-github-event": "pull_request" }),
        Buffer.from(body),
        0,
      ),
    );
    assert.equal(
      await octokitVerify(
        "octo-secret",
        body,
        sign("github", "octo-secret", { id: "g", body, timestampS: 0 })["x-hub-signature-256"]!,
      ),
      true,
    );
  });
});

describe("a property: changing any one signed byte", () => {
  for (const scheme of SCHEMES) {
    it(`${scheme.name}: any changed byte of the body, signature, timestamp or signed ID gets a 401`, () => {
      fc.assert(
        fc.property(idArb, bodyArb, mutationArb, (id, body, m) => {
          const signed = scheme.make(id, body);
          const ok = verify(scheme.source, headers(signed.headers), signed.body, T * 1000, `/${signed.query ?? ""}`);
          assert.equal(ok.kind, "delivery", `control: the unchanged delivery verifies (${JSON.stringify(ok)})`);
          const forged = apply(scheme, signed, m);
          const v = verify(scheme.source, headers(forged.headers), forged.body, T * 1000, `/${forged.query ?? ""}`);
          assert.equal(v.kind === "reject" && v.status, 401, `${JSON.stringify(m)} gave ${JSON.stringify(v)}`);
        }),
        { numRuns: 400 },
      );
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

// ---- The presets added with the hmac provider ------------------------------------------------------

const form = (params: Record<string, string>) => new URLSearchParams(params).toString();
const FORM = { "content-type": "application/x-www-form-urlencoded" };
const paddleEvent = (id = "evt_01hv8x", type = "transaction.paid") =>
  JSON.stringify({
    event_id: id,
    event_type: type,
    occurred_at: "2024-04-12T10:18:49.621022Z",
    notification_id: "ntf_01",
    data: { id: "txn_01" },
  });
const linearEvent = (tsMs: number) =>
  JSON.stringify({
    action: "create",
    type: "Issue",
    data: { id: "i1", title: "t" },
    createdAt: "2024-01-01T00:00:00.000Z",
    webhookTimestamp: tsMs,
    webhookId: "wh1",
  });
const zoomEvent = (tsMs = T * 1000) =>
  JSON.stringify({ event: "meeting.started", event_ts: tsMs, payload: { account_id: "a1", object: { id: "m1" } } });
const intercomEvent = (id = "notif_ccd8a4d0-f965-11e3-a367-c779cae3e1b3") =>
  JSON.stringify({
    type: "notification_event",
    app_id: "a",
    id,
    topic: "conversation.user.created",
    delivery_attempts: 1,
    created_at: T,
    data: { item: {} },
  });

describe("the presets' vectors", () => {
  it("Square: the SDK's own vector (notification URL + body) verifies, and sign() gives its signature", () => {
    const v = verify(
      source("square", SQUARE.key),
      headers({ "x-square-hmacsha256-signature": SQUARE.signature }),
      Buffer.from(SQUARE.body),
      0,
      "/square",
    );
    assert.deepEqual(v, {
      kind: "delivery",
      id: "ac3ac95b-f97d-458c-a6e6-18981597e05f",
      eventType: "webhooks.test_notification",
      providerTime: null,
    });
    assert.equal(
      sign("square", SQUARE.key, { id: "", body: SQUARE.body, timestampS: 0, url: SQUARE.url })[
        "x-square-hmacsha256-signature"
      ],
      SQUARE.signature,
    );
    // The URL is signed: the same request at another query string is not the one Square signed.
    refused(
      verify(
        source("square", SQUARE.key),
        headers({ "x-square-hmacsha256-signature": SQUARE.signature }),
        Buffer.from(SQUARE.body),
        0,
        "/square?x=1",
      ),
      401,
      /does not match/,
    );
  });

  it("Twilio: the docs' form example (URL + sorted parameters, HMAC-SHA1) verifies, and sign() gives its signature", () => {
    const body = form(TWILIO.params);
    const h = headers({ ...FORM, "x-twilio-signature": TWILIO.signature, "i-twilio-idempotency-token": "a1b2c3" });
    assert.deepEqual(verify(source("twilio", TWILIO.token), h, Buffer.from(body), 0, `/twilio${TWILIO.query}`), {
      kind: "delivery",
      id: "a1b2c3",
      eventType: null,
      providerTime: null,
    });
    assert.equal(
      sign("twilio", TWILIO.token, { id: "x", body, timestampS: 0, url: TWILIO.url + TWILIO.query, headers: FORM })[
        "x-twilio-signature"
      ],
      TWILIO.signature,
    );
    refused(
      verify(source("twilio", TWILIO.token), h, Buffer.from(body), 0, "/twilio?foo=1&bar=3"),
      401,
      /does not match/,
    );
    // Without the idempotency header, a byte-identical retry still finds its first copy by the body's hash.
    const noToken = headers({ ...FORM, "x-twilio-signature": TWILIO.signature });
    assert.equal(
      delivered(verify(source("twilio", TWILIO.token), noToken, Buffer.from(body), 0, `/t${TWILIO.query}`)).id,
      `sha256:${createHash("sha256").update(body).digest("hex")}`,
    );
  });

  it("Twilio: twilio-node's JSON vector, signed through the URL's bodySHA256, verifies; a changed body does not", () => {
    const h = headers({ "content-type": "application/json", "x-twilio-signature": TWILIO.jsonSignature });
    delivered(verify(source("twilio", TWILIO.token), h, Buffer.from(TWILIO.jsonBody), 0, `/t${TWILIO.jsonQuery}`));
    refused(
      verify(
        source("twilio", TWILIO.token),
        h,
        Buffer.from(TWILIO.jsonBody.replace("value", "valuf")),
        0,
        `/t${TWILIO.jsonQuery}`,
      ),
      401,
      /bodySHA256/,
    );
    refused(
      verify(source("twilio", TWILIO.token), h, Buffer.from(TWILIO.jsonBody), 0, `/t${TWILIO.query}`),
      401,
      /bodySHA256/,
    );
  });

  it("Twilio signs the parsed form, not its bytes: '+' and '%20' are the same parameters, as in twilio-node", () => {
    const h = (body: string) =>
      headers({
        ...FORM,
        "x-twilio-signature": sign("twilio", TWILIO.token, {
          id: "",
          body,
          timestampS: 0,
          url: TWILIO.url,
          headers: FORM,
        })["x-twilio-signature"]!,
      });
    const signedPlus = h("Body=hello+world");
    delivered(verify(source("twilio", TWILIO.token), signedPlus, Buffer.from("Body=hello%20world"), 0, "/t"));
    // Control: a different parameter value is refused.
    refused(verify(source("twilio", TWILIO.token), signedPlus, Buffer.from("Body=hello+worle"), 0, "/t"), 401);
  });

  // No published vector: these are computed here with node:crypto, independently of providers.ts.
  it("Paddle (vector computed here): ts=…;h1=hex(HMAC-SHA256(ts:body)), event_id and event_type from the body", () => {
    const body = paddleEvent();
    const header = `ts=${T};h1=${hmac("pdl_ntfset_k", `${T}:${body}`, "hex")}`;
    assert.equal(sign("paddle", "pdl_ntfset_k", { id: "", body, timestampS: T })["paddle-signature"], header);
    assert.deepEqual(
      verify(source("paddle", "pdl_ntfset_k"), headers({ "paddle-signature": header }), Buffer.from(body), T * 1000),
      { kind: "delivery", id: "evt_01hv8x", eventType: "transaction.paid", providerTime: T * 1000 },
    );
  });
  it("Linear (vector computed here): hex(HMAC-SHA256(body)), Linear-Delivery, Linear-Event, webhookTimestamp in ms", () => {
    const body = linearEvent(T * 1000 + 123);
    const h = {
      "linear-signature": hmac("lin_wh_k", body, "hex"),
      "linear-delivery": "234d1a4e-b617-4388-90fe-adc3633d6b72",
      "linear-event": "Issue",
    };
    assert.equal(
      sign("linear", "lin_wh_k", { id: h["linear-delivery"], body, timestampS: T, eventType: "Issue" })[
        "linear-signature"
      ],
      h["linear-signature"],
    );
    assert.deepEqual(verify(source("linear", "lin_wh_k"), headers(h), Buffer.from(body), T * 1000), {
      kind: "delivery",
      id: "234d1a4e-b617-4388-90fe-adc3633d6b72",
      eventType: "Issue",
      providerTime: T * 1000 + 123,
    });
    refused(
      verify(
        source("linear", "lin_wh_k"),
        headers(h),
        Buffer.from(JSON.stringify({ webhookTimestamp: "soon" })),
        T * 1000,
      ),
      401,
      /does not match/,
    );
  });
  it("Zoom (vector computed here): v0=hex(HMAC-SHA256(v0:ts:body)), keyed by the body's hash, typed by event", () => {
    const body = zoomEvent();
    const h = {
      "x-zm-request-timestamp": String(T),
      "x-zm-signature": `v0=${hmac("zoom-secret-token", `v0:${T}:${body}`, "hex")}`,
    };
    assert.deepEqual(sign("zoom", "zoom-secret-token", { id: "", body, timestampS: T }), h);
    assert.deepEqual(verify(source("zoom", "zoom-secret-token"), headers(h), Buffer.from(body), T * 1000), {
      kind: "delivery",
      id: `sha256:${createHash("sha256").update(body).digest("hex")}`,
      eventType: "meeting.started",
      providerTime: T * 1000,
    });
  });
  it("Zoom: the signed endpoint.url_validation gets plainToken and its HMAC back as JSON, and is not stored", () => {
    const body = JSON.stringify({
      payload: { plainToken: "qgg8vlvZRS6UYooatFL8Aw" },
      event_ts: T * 1000,
      event: "endpoint.url_validation",
    });
    const src = source("zoom", ["old-token", "zoom-secret-token"]);
    const v = verify(
      src,
      headers(sign("zoom", "zoom-secret-token", { id: "", body, timestampS: T })),
      Buffer.from(body),
      T * 1000,
    );
    // Answered with the secret that signed the request, so a rotation does not break validation.
    assert.deepEqual(v, {
      kind: "reply",
      status: 200,
      contentType: "application/json; charset=utf-8",
      body: JSON.stringify({
        plainToken: "qgg8vlvZRS6UYooatFL8Aw",
        encryptedToken: createHmac("sha256", "zoom-secret-token").update("qgg8vlvZRS6UYooatFL8Aw").digest("hex"),
      }),
    });
    refused(
      verify(
        src,
        headers({ "x-zm-request-timestamp": String(T), "x-zm-signature": "v0=" + "0".repeat(64) }),
        Buffer.from(body),
        T * 1000,
      ),
      401,
    );
  });
  it("Shopify (vector computed here): base64(HMAC-SHA256(body)) in X-Shopify-Hmac-Sha256", () => {
    const body = '{"id":820982911946154508,"email":"jon@example.com"}';
    const h = {
      "x-shopify-hmac-sha256": hmac("shpss_k", body, "base64"),
      "x-shopify-event-id": "98880550-7158-44d4-b7cd-2c97c8a091b5",
      "x-shopify-topic": "orders/create",
    };
    assert.equal(
      sign("shopify", "shpss_k", { id: "", body, timestampS: 0 })["x-shopify-hmac-sha256"],
      h["x-shopify-hmac-sha256"],
    );
    assert.equal(
      delivered(verify(source("shopify", "shpss_k"), headers(h), Buffer.from(body), 0)).id,
      "98880550-7158-44d4-b7cd-2c97c8a091b5",
    );
  });
  it("Intercom (vector computed here): X-Hub-Signature sha1=hex(HMAC-SHA1(body)), id and topic from the body", () => {
    const body = intercomEvent();
    const h = { "x-hub-signature": `sha1=${hmac("intercom-client-secret", body, "hex", "sha1")}` };
    assert.deepEqual(sign("intercom", "intercom-client-secret", { id: "", body, timestampS: 0 }), h);
    assert.deepEqual(verify(source("intercom", "intercom-client-secret"), headers(h), Buffer.from(body), 0), {
      kind: "delivery",
      id: "notif_ccd8a4d0-f965-11e3-a367-c779cae3e1b3",
      eventType: "conversation.user.created",
      providerTime: null,
    });
  });
});

describe("Slack's forms", () => {
  const at = (body: string, ts = T) =>
    verify(
      source("slack", "k"),
      headers({ ...FORM, ...sign("slack", "k", { id: "", body, timestampS: ts }) }),
      Buffer.from(body),
      T * 1000,
    );
  it("an interactive payload is keyed by its trigger_id and typed by its type", () => {
    const payload = JSON.stringify({
      type: "block_actions",
      trigger_id: "13345224609.738474920.8088930838d88f008e0",
      actions: [{ action_id: "a" }],
    });
    assert.deepEqual(at(form({ payload })), {
      kind: "delivery",
      id: "13345224609.738474920.8088930838d88f008e0",
      eventType: "block_actions",
      providerTime: T * 1000,
    });
  });
  it("a payload without a trigger_id (view_closed) is keyed by the body's SHA-256", () => {
    const body = form({ payload: JSON.stringify({ type: "view_closed", view: { id: "V1" } }) });
    assert.equal(delivered(at(body)).id, `sha256:${createHash("sha256").update(body).digest("hex")}`);
  });
  it("a form keeps the signature and the replay window: forged or stale is a 401", () => {
    const body = form({ command: "/deploy", trigger_id: "t1" });
    refused(
      verify(
        source("slack", "k"),
        headers({ ...FORM, ...sign("slack", "other", { id: "", body, timestampS: T }) }),
        Buffer.from(body),
        T * 1000,
      ),
      401,
    );
    refused(at(body, T - 301), 401, /301 s old/);
  });
});

describe("replay windows of the new presets", () => {
  const paddleAt = (ts: number, nowMs: number) => {
    const body = Buffer.from(paddleEvent());
    return verify(source("paddle", "k"), headers(sign("paddle", "k", { id: "", body, timestampS: ts })), body, nowMs);
  };
  it("paddle accepts exactly 5 s old and refuses 6, looking only into the past, as its SDK does", () => {
    delivered(paddleAt(T, (T + 5) * 1000 + 999));
    refused(paddleAt(T, (T + 6) * 1000), 401, /6 s old, over the 5-s window/);
    delivered(paddleAt(T + 3600, T * 1000));
  });
  const linearAt = (tsMs: number, nowMs: number) => {
    const body = Buffer.from(linearEvent(tsMs));
    return verify(source("linear", "k"), headers(sign("linear", "k", { id: "d", body, timestampS: 0 })), body, nowMs);
  };
  it("linear accepts exactly 60 000 ms either way and refuses 60 001, to the millisecond, as its SDK does", () => {
    delivered(linearAt(T * 1000, T * 1000 + 60_000));
    refused(linearAt(T * 1000, T * 1000 + 60_001), 401, /60.001 s old, over the 60-s window/);
    delivered(linearAt(T * 1000, T * 1000 - 60_000));
    refused(linearAt(T * 1000, T * 1000 - 60_001), 401, /ahead/);
  });
  it("linear refuses a signed body whose webhookTimestamp is missing or not whole milliseconds", () => {
    for (const body of ['{"type":"Issue"}', '{"webhookTimestamp":1.5}', '{"webhookTimestamp":"1e3"}']) {
      refused(
        verify(
          source("linear", "k"),
          headers(sign("linear", "k", { id: "d", body, timestampS: 0 })),
          Buffer.from(body),
          T * 1000,
        ),
        401,
        /webhookTimestamp/,
      );
    }
  });
  const zoomAt = (ts: number, nowS: number, ms = 0) => {
    const body = Buffer.from(zoomEvent());
    return verify(
      source("zoom", "k"),
      headers(sign("zoom", "k", { id: "", body, timestampS: ts })),
      body,
      nowS * 1000 + ms,
    );
  };
  it("zoom accepts exactly 300 s either way and refuses 301", () => {
    delivered(zoomAt(T, T + 300, 999));
    refused(zoomAt(T, T + 301), 401, /301 s old/);
    delivered(zoomAt(T, T - 300));
    refused(zoomAt(T, T - 301, 999), 401, /301 s ahead/);
  });
  it("each source's tolerance is its own: paddle at 60 s, linear at 5 s", () => {
    const body = Buffer.from(paddleEvent());
    delivered(
      verify(
        source("paddle", "k", 60),
        headers(sign("paddle", "k", { id: "", body, timestampS: T })),
        body,
        (T + 60) * 1000,
      ),
    );
    const lbody = Buffer.from(linearEvent(T * 1000));
    refused(
      verify(
        source("linear", "k", 5),
        headers(sign("linear", "k", { id: "d", body: lbody, timestampS: 0 })),
        lbody,
        (T + 6) * 1000,
      ),
      401,
      /5-s window/,
    );
  });
  it("square, twilio and intercom sign no timestamp, so a year-old delivery still verifies", () => {
    const yearLater = (T + 365 * 86400) * 1000;
    const body = Buffer.from(intercomEvent());
    delivered(
      verify(source("intercom", "k"), headers(sign("intercom", "k", { id: "", body, timestampS: T })), body, yearLater),
    );
    delivered(
      verify(
        source("square", SQUARE.key),
        headers({ "x-square-hmacsha256-signature": SQUARE.signature }),
        Buffer.from(SQUARE.body),
        yearLater,
      ),
    );
    delivered(
      verify(
        source("twilio", TWILIO.token),
        headers({ ...FORM, "x-twilio-signature": TWILIO.signature }),
        Buffer.from(form(TWILIO.params)),
        yearLater,
        `/t${TWILIO.query}`,
      ),
    );
  });
});

describe("the new presets: rotation and repeated headers", () => {
  const bodies: Record<string, string> = {
    paddle: paddleEvent(),
    linear: linearEvent(T * 1000),
    square: SQUARE.body,
    twilio: "{}",
    zoom: zoomEvent(),
    intercom: intercomEvent(),
  };
  const target = (p: string, body: string) =>
    p === "twilio" ? `/t?bodySHA256=${createHash("sha256").update(body).digest("hex")}` : "/";
  const signed = (p: Provider, secret: string) => {
    const body = bodies[p]!;
    const url = p === "square" ? SQUARE.url : p === "twilio" ? TWILIO.url + target(p, body).slice(2) : undefined;
    return sign(p, secret, { id: "d1", body, timestampS: T, ...(url ? { url } : {}) });
  };
  for (const p of ["paddle", "linear", "square", "twilio", "zoom", "intercom"] as const) {
    it(`${p}: during a rotation either secret verifies; any other is refused`, () => {
      const check = (src: Source, secret: string) =>
        verify(src, headers(signed(p, secret)), Buffer.from(bodies[p]!), T * 1000, target(p, bodies[p]!));
      for (const secret of ["old", "new"]) delivered(check(source(p, ["old", "new"]), secret));
      refused(check(source(p, ["old", "new"]), "other"), 401, /does not match/);
      refused(check(source(p, "old"), "new"), 401);
    });
  }
  const cases: [Provider, string, 400 | 401][] = [
    ["paddle", "paddle-signature", 401],
    ["linear", "linear-signature", 401],
    ["linear", "linear-delivery", 400],
    ["square", "x-square-hmacsha256-signature", 401],
    ["twilio", "x-twilio-signature", 401],
    ["twilio", "i-twilio-idempotency-token", 400],
    ["zoom", "x-zm-signature", 401],
    ["zoom", "x-zm-request-timestamp", 401],
    ["intercom", "x-hub-signature", 401],
  ];
  for (const [p, name, status] of cases) {
    it(`${p}: ${name} sent twice is refused with ${status}`, () => {
      const h = signed(p, "k");
      const body = Buffer.from(bodies[p]!);
      delivered(verify(source(p, "k"), headers(h), body, T * 1000, target(p, bodies[p]!))); // control
      refused(
        verify(source(p, "k"), headers({ ...h, [name]: [h[name]!, h[name]!] }), body, T * 1000, target(p, bodies[p]!)),
        status,
        /more than once/,
      );
    });
  }
});

describe("the hmac provider", () => {
  const custom = source("hmac", ["acme-old", "acme-secret"], undefined, CUSTOM);
  const customHeaders = (secret: string, body: string, ts = T) => ({
    "x-acme-delivery": "dl_1",
    "x-acme-account": "acct_1",
    "x-acme-time": String(ts),
    "x-acme-signature": `s0:ignored s1:${hmac(secret, `${ts}.acct_1.${body}`, "base64", "sha512")}`,
  });
  it("verifies a declared scheme against an independent signer, skipping other versions, with its own window", () => {
    const body = '{"kind":"thing.done"}';
    assert.deepEqual(verify(custom, headers(customHeaders("acme-secret", body)), Buffer.from(body), T * 1000), {
      kind: "delivery",
      id: "dl_1",
      eventType: "thing.done",
      providerTime: T * 1000,
    });
    delivered(verify(custom, headers(customHeaders("acme-old", body)), Buffer.from(body), T * 1000));
    refused(
      verify(
        custom,
        headers({ ...customHeaders("acme-secret", body), "x-acme-account": "acct_2" }),
        Buffer.from(body),
        T * 1000,
      ),
      401,
      /does not match/,
    );
    refused(
      verify(custom, headers(customHeaders("acme-secret", body, T - 121)), Buffer.from(body), T * 1000),
      401,
      /121 s old, over the 120-s window/,
    );
    const { "x-acme-account": _gone, ...noAccount } = customHeaders("acme-secret", body);
    refused(
      verify(custom, headers(noAccount), Buffer.from(body), T * 1000),
      401,
      /missing X-Acme-Account, which is signed/,
    );
  });
  it("sign() with the declared scheme is what verify() accepts", () => {
    const body = '{"kind":"x"}';
    const h = sign(
      "hmac",
      "acme-secret",
      { id: "dl_2", body, timestampS: T, headers: { "X-Acme-Account": "acct_9" } },
      CUSTOM as unknown as Scheme,
    );
    assert.equal(delivered(verify(custom, headers(h), Buffer.from(body), T * 1000)).id, "dl_2");
  });
  it("every preset written out as hmac settings gives the same verdicts on the published vectors", () => {
    const as = (preset: Exclude<Provider, "hmac">, secret: string, url?: string) => {
      const { tolerance, ...scheme } = PRESETS[preset];
      return source("hmac", secret, tolerance, { ...scheme, ...(url ? { url } : {}) });
    };
    const gh = headers({
      "x-hub-signature-256": GITHUB.signature,
      "x-github-delivery": "g1",
      "x-github-event": "issues",
    });
    assert.deepEqual(
      verify(as("github", GITHUB.secret), gh, Buffer.from(GITHUB.body), 0),
      verify(source("github", GITHUB.secret), gh, Buffer.from(GITHUB.body), 0),
    );
    const sq = headers({ "x-square-hmacsha256-signature": SQUARE.signature });
    assert.deepEqual(
      verify(as("square", SQUARE.key, SQUARE.url), sq, Buffer.from(SQUARE.body), 0, "/"),
      verify(source("square", SQUARE.key), sq, Buffer.from(SQUARE.body), 0, "/"),
    );
    const tw = headers({ ...FORM, "x-twilio-signature": TWILIO.signature, "i-twilio-idempotency-token": "tok" });
    assert.equal(
      delivered(
        verify(as("twilio", TWILIO.token, TWILIO.url), tw, Buffer.from(form(TWILIO.params)), 0, `/${TWILIO.query}`),
      ).id,
      "tok",
    );
    const stripeBody = stripeEvent();
    const st = headers(sign("stripe", STRIPE_SECRET, { id: "", body: stripeBody, timestampS: T }));
    assert.deepEqual(
      verify(as("stripe", STRIPE_SECRET), st, Buffer.from(stripeBody), T * 1000),
      verify(source("stripe", STRIPE_SECRET), st, Buffer.from(stripeBody), T * 1000),
    );
  });

  const fails = (settings: Record<string, unknown>, pattern: RegExp) =>
    assert.throws(
      () => loadSources({ s: { provider: "hmac", secret: "k", header: "X-Sig", id: "header:X-Id", ...settings } }, {}),
      (error: unknown) =>
        error instanceof TypeError && pattern.test(error.message) && error.message.startsWith('source "s": '),
    );
  it("names the mistake in a declared scheme, one setting at a time", () => {
    fails({ algorithm: "md5" }, /expected algorithm to be one of sha1, sha256, sha512, got "md5"/);
    fails({ encoding: "base32" }, /expected encoding to be hex or base64, got "base32"/);
    fails({ signed: "{timestamp}.{body}" }, /\{timestamp\} in signed needs timestamp from a header/);
    fails(
      { signed: "{nonce}.{body}" },
      /unknown placeholder \{nonce\} in signed; expected \{body\}, \{timestamp\}, \{id\}, \{url\}, \{form\} or \{header:Name\}/,
    );
    fails({ signed: "{body" }, /unmatched brace/);
    fails({ signed: "{timestamp}", timestamp: "header:X-Ts" }, /signed must include \{body\}/);
    fails({ signed: "{url}{body}" }, /expected url to be the address the sender posts to/);
    fails({ signed: "{url}{body}", url: "https://example.com/hook?x=1" }, /no query/);
    fails({ url: "https://example.com/hook" }, /url applies only to schemes that sign \{url\}/);
    fails({ id: "query:x" }, /expected id to be one of header:Name, body:\/json\/pointer, sha256:body, got "query:x"/);
    fails({ id: [] }, /missing id/);
    fails({ id: "body:/id", signed: "{id}.{body}" }, /\{id\} in signed needs the first id place to be a header/);
    fails({ timestamp: "signature:t" }, /needs a separator/);
    fails({ timestampUnit: "ms" }, /timestampUnit applies only with a timestamp/);
    fails({ tolerance: 60 }, /tolerance applies only with a timestamp/);
    fails({ timestamp: "header:X-Ts", timestampUnit: "min" }, /expected timestampUnit to be "s" or "ms"/);
    fails({ header: "X Sig" }, /expected header to name the signature header/);
    fails({ headers: "X-Sig" }, /unknown setting "headers"/);
    fails({ prefix: 3 }, /expected prefix to be a string, got number/);
  });
  it("keeps scheme settings off the presets, pointing at hmac", () => {
    assert.throws(
      () => loadSources({ s: { provider: "github", secret: "k", algorithm: "sha1" } }, {}),
      /unknown setting "algorithm".*need provider "hmac"/,
    );
    assert.throws(() => loadSources({ s: { provider: "square", secret: "k" } }, {}), /expected url/);
  });
});

describe("the new presets' SDKs", () => {
  const nowS = () => Math.floor(Date.now() / 1000);
  it("@paddle/paddle-node-sdk: isSignatureValid() accepts what sign() signs, and rejects a changed body", async () => {
    const paddle = new Paddle("pdl_sdbx_apikey_not_used");
    const body = paddleEvent();
    const header = sign("paddle", "pdl_ntfset_sdk", { id: "", body, timestampS: nowS() })["paddle-signature"]!;
    assert.equal(await paddle.webhooks.isSignatureValid(body, "pdl_ntfset_sdk", header), true);
    assert.equal(await paddle.webhooks.isSignatureValid(body.replace("paid", "paie"), "pdl_ntfset_sdk", header), false);
  });
  it("@linear/sdk: LinearWebhookClient.verify() accepts what sign() signs", () => {
    const body = linearEvent(Date.now());
    const signature = sign("linear", "lin_wh_sdk", { id: "d", body, timestampS: 0 })["linear-signature"]!;
    assert.equal(new LinearWebhookClient("lin_wh_sdk").verify(Buffer.from(body), signature), true);
    assert.throws(() => new LinearWebhookClient("lin_wh_other").verify(Buffer.from(body), signature));
  });
  it("square: WebhooksHelper.verifySignature() accepts what sign() signs", async () => {
    const body = JSON.stringify({ merchant_id: "M", type: "payment.updated", event_id: "e-sdk", data: {} });
    const signatureHeader = sign("square", "sq-key", {
      id: "",
      body,
      timestampS: 0,
      url: "https://example.com/square",
    })["x-square-hmacsha256-signature"]!;
    assert.equal(
      await SquareWebhooks.verifySignature({
        requestBody: body,
        signatureHeader,
        signatureKey: "sq-key",
        notificationUrl: "https://example.com/square",
      }),
      true,
    );
    assert.equal(
      await SquareWebhooks.verifySignature({
        requestBody: body,
        signatureHeader,
        signatureKey: "sq-key",
        notificationUrl: "https://example.com/other",
      }),
      false,
    );
  });
  it("twilio: getExpectedTwilioSignature() is accepted, and validateRequest() / validateRequestWithBody() accept ours", () => {
    const params = {
      MessageSid: "SM1",
      Body: "hello world",
      From: "+15550001111",
      To: "+15552223333",
      MediaUrl0: "https://x/y?z=1",
    };
    const url = "https://example.com/twilio?via=sms";
    const theirs = twilio.getExpectedTwilioSignature("tw-token", url, params);
    delivered(
      verify(
        source("twilio", "tw-token", undefined, { url: "https://example.com/twilio" }),
        headers({ ...FORM, "x-twilio-signature": theirs }),
        Buffer.from(form(params)),
        0,
        "/twilio?via=sms",
      ),
    );
    const ours = sign("twilio", "tw-token", { id: "", body: form(params), timestampS: 0, url, headers: FORM })[
      "x-twilio-signature"
    ]!;
    assert.equal(twilio.validateRequest("tw-token", ours, url, params), true);
    const json = '{"event":"x"}';
    const jsonUrl = `https://example.com/twilio?bodySHA256=${createHash("sha256").update(json).digest("hex")}`;
    const oursJson = sign("twilio", "tw-token", { id: "", body: json, timestampS: 0, url: jsonUrl })[
      "x-twilio-signature"
    ]!;
    assert.equal(twilio.validateRequestWithBody("tw-token", oursJson, jsonUrl, json), true);
  });
});

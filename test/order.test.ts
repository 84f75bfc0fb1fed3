// test/order.test.ts: the order key and event time of a source, from the sources file (order.ts and
// loadSources) to the handler: the presets of Stripe, Shopify and GitHub, a JSON pointer, a header, the
// mistakes a sources file can make, and Stripe events sent out of order through a real receiver.

import assert from "node:assert/strict";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { request } from "undici";
import { SqliteInbox } from "../lib/sqlite/sqlite.ts";
import { orderOfRequest, parseOrder } from "../lib/order.ts";
import { loadSources, sign } from "../lib/config/sources.ts";
import type { Headers } from "../lib/store.ts";
import { createReceiver } from "../receiver.ts";
import { run } from "../worker.ts";
import { STRIPE_SECRET, T } from "./provider-fixtures.ts";
import { tempDir } from "./helpers.ts";

const json = (value: unknown) => Buffer.from(JSON.stringify(value));
const headers = (h: Record<string, string>): Headers => Object.fromEntries(Object.entries(h).map(([k, v]) => [k, [v]]));
const rule = (provider: string, setting: unknown) => parseOrder(provider, setting, 'source "x"');

describe("parseOrder() and orderOfRequest()", () => {
  it("orders Stripe by data.object.id, in the event's created time (not the signature's)", () => {
    const event = {
      id: "evt_1",
      created: 1_700_000_123,
      type: "customer.subscription.updated",
      data: { object: { id: "sub_9" } },
    };
    assert.deepEqual(orderOfRequest(rule("stripe", true), {}, json(event)), {
      orderKey: "sub_9",
      eventTime: 1_700_000_123_000,
      strictOrder: false,
    });
  });

  it("orders Shopify by the resource's GraphQL ID, else its topic and id, in X-Shopify-Triggered-At, else updated_at", () => {
    const order = rule("shopify", { strict: true });
    const h = headers({ "x-shopify-topic": "orders/updated", "x-shopify-triggered-at": "2026-01-02T03:04:05.678Z" });
    const big = Buffer.from(
      '{"id": 820982911946154508, "admin_graphql_api_id": "gid://shopify/Order/820982911946154508"}',
    );
    assert.equal(orderOfRequest(order, h, big).orderKey, "gid://shopify/Order/820982911946154508");
    assert.deepEqual(
      orderOfRequest(order, h, Buffer.from('{"id": 820982911946154508}')),
      { orderKey: null, eventTime: null, strictOrder: true },
      "an id past 2^53 is not a key it can trust",
    );
    assert.deepEqual(orderOfRequest(order, h, json({ id: 4503599627, updated_at: "2026-01-01T00:00:00Z" })), {
      orderKey: "orders:4503599627",
      eventTime: Date.parse("2026-01-02T03:04:05.678Z"),
      strictOrder: true,
    });
    assert.equal(
      orderOfRequest(
        order,
        headers({ "x-shopify-topic": "products/update" }),
        json({ id: 7, updated_at: "2026-01-01T00:00:00Z" }),
      ).eventTime,
      Date.parse("2026-01-01T00:00:00Z"),
    );
  });

  it("orders GitHub by repository and issue or pull request number; a push is unordered", () => {
    const github = rule("github", true);
    const issue = {
      action: "edited",
      issue: { number: 42, updated_at: "2026-01-01T00:00:00Z" },
      repository: { full_name: "octo/app" },
    };
    assert.deepEqual(orderOfRequest(github, {}, json(issue)), {
      orderKey: "octo/app#42",
      eventTime: Date.parse("2026-01-01T00:00:00Z"),
      strictOrder: false,
    });
    assert.equal(
      orderOfRequest(github, {}, json({ pull_request: { number: 7 }, repository: { full_name: "octo/app" } })).orderKey,
      "octo/app#7",
    );
    assert.equal(
      orderOfRequest(github, {}, json({ ref: "refs/heads/main", repository: { full_name: "octo/app" } })).orderKey,
      null,
    );
  });

  it("reads a JSON pointer (with ~1 and ~0 escapes) and a time in seconds, ms or ISO; or a header", () => {
    const pointer = rule("standard", { key: "/data/a~1b", time: "/at" });
    assert.deepEqual(orderOfRequest(pointer, {}, json({ data: { "a/b": "k1" }, at: 1_700_000_000 })), {
      orderKey: "k1",
      eventTime: 1_700_000_000_000,
      strictOrder: false,
    });
    assert.equal(
      orderOfRequest(pointer, {}, json({ data: { "a/b": 12 }, at: 1_700_000_000_123 })).eventTime,
      1_700_000_000_123,
    );
    assert.equal(
      orderOfRequest(pointer, {}, json({ data: { "a/b": { no: 1 } } })).orderKey,
      null,
      "an object is no key",
    );
    assert.equal(orderOfRequest(pointer, {}, Buffer.from("not json")).orderKey, null);
    const byHeader = rule("plain", { header: "X-Order-Key" });
    assert.equal(orderOfRequest(byHeader, headers({ "x-order-key": "acct_1" }), Buffer.from("{}")).orderKey, "acct_1");
    assert.equal(
      orderOfRequest(byHeader, { "x-order-key": ["a", "b"] }, Buffer.from("{}")).orderKey,
      null,
      "a repeated header is no key",
    );
    assert.deepEqual(orderOfRequest(undefined, {}, json({})), { orderKey: null, eventTime: null, strictOrder: false });
  });

  it("refuses a sources file's order settings that cannot be right, naming the source", () => {
    const load =
      (order: unknown, provider = "standard") =>
      () =>
        loadSources({ app: { provider, secret: "whsec_c2VjcmV0", order } }, {});
    assert.throws(load(true), /source "app": order has no preset for standard/);
    assert.throws(load({ key: "data.id" }), /expected a JSON pointer such as "\/data\/object\/id", got "data.id"/);
    assert.throws(load({ key: "/a", header: "X" }), /not both/);
    assert.throws(load({ header: "bad header" }), /expected order.header to be a header name/);
    assert.throws(load({ key: "/a", strict: "yes" }), /expected order.strict to be true or false/);
    assert.throws(load({ key: "/a", sort: 1 }), /unknown order setting "sort"/);
    assert.throws(load(5), /expected order to be true or an object/);
    assert.equal(
      loadSources({ s: { provider: "stripe", secret: STRIPE_SECRET, order: { strict: true } } }, {}).get("s")!.order!
        .strict,
      true,
    );
    assert.equal(loadSources({ s: { provider: "stripe", secret: STRIPE_SECRET } }, {}).get("s")!.order, undefined);
  });
});

describe("Stripe events out of order, through a real receiver", () => {
  const { dir, cleanup } = tempDir();
  after(cleanup);

  it("handles each subscription's events in created order, and flags the one that came after a newer one", async () => {
    const inbox = new SqliteInbox(join(dir, "inbox.db"));
    const sources = loadSources({ stripe: { provider: "stripe", secret: STRIPE_SECRET, order: true } }, {});
    const receiver = createReceiver({ inbox, sources, now: () => T * 1000, log: () => {} });
    await new Promise<void>((resolve) => receiver.server.listen(0, "127.0.0.1", resolve));
    const address = receiver.server.address();
    const base = `http://127.0.0.1:${typeof address === "object" && address ? address.port : 0}/stripe`;
    const send = async (id: string, type: string, created: number, sub: string) => {
      const body = JSON.stringify({ id, object: "event", type, created, data: { object: { id: sub } } });
      // Signed at T for all of them: the send time says nothing of the order.
      const response = await request(base, {
        method: "POST",
        body,
        headers: { "content-type": "application/json", ...sign("stripe", STRIPE_SECRET, { id, body, timestampS: T }) },
      });
      assert.equal(response.statusCode, 200);
      await response.body.text();
    };
    try {
      await send("evt_updated", "customer.subscription.updated", T - 10, "sub_1");
      await send("evt_created", "customer.subscription.created", T - 20, "sub_1");
      await send("evt_other", "customer.subscription.created", T - 30, "sub_2");
      const seen: string[] = [];
      const handler = (job: { delivery: { id: string }; stale: boolean; newerId?: string }) =>
        void seen.push(`${job.delivery.id}${job.stale ? ` (stale, after ${job.newerId})` : ""}`);
      await run(handler, { inbox, once: true, concurrency: 1, log: () => {} });
      assert.deepEqual(
        seen.filter((s) => s !== "evt_other"),
        ["evt_created", "evt_updated"],
        "created first, though it arrived second",
      );
      await send("evt_late", "customer.subscription.updated", T - 15, "sub_1");
      await run(handler, { inbox, once: true, log: () => {} });
      assert.equal(seen.at(-1), "evt_late (stale, after evt_updated)");
      const [late] = await inbox.find("evt_late", "stripe");
      assert.deepEqual([late!.orderKey, late!.eventTime], ["sub_1", (T - 15) * 1000]);
    } finally {
      await receiver.close();
      await inbox.close();
    }
  });
});

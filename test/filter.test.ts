// test/filter.test.ts: route filters (lib/routing/filter.ts) on their own: every operator on a value, on a list and on
// a missing field, each beside a twin that must not match (its control); the examples of Hookdeck's and
// Convoy's filter docs as they are written there; and the one-line mistakes that stop start-up. Pure: no
// store, so it runs once; the receiver and both backends are test/routing.test.ts's.

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { compileFilter, filterInput, type FilterInput } from "../lib/routing/filter.ts";

const input = (parts: Partial<FilterInput>): FilterInput => ({
  body: undefined,
  headers: {},
  query: {},
  path: "/shop",
  source: "shop",
  type: undefined,
  ...parts,
});
const matches = (filter: unknown, parts: Partial<FilterInput>) => compileFilter(filter, "route")(input(parts));
const onBody = (filter: unknown, body: unknown) => matches({ body: filter }, { body });
const mistake = (filter: unknown) => {
  try {
    compileFilter(filter, 'source "shop": route #2 (billing)');
  } catch (error) {
    return (error as Error).message;
  }
  return "(compiled)";
};

// Each row: a filter on body.x, then values of x it must match and values it must not (undefined: x missing).
const OPERATORS: [string, unknown, unknown[], unknown[]][] = [
  ["a plain value (equal, strict)", 5, [5, [1, 5]], [6, "5", [1, 6], undefined]],
  ["$eq", { $eq: "a" }, ["a", ["b", "a"]], ["b", ["b"], undefined]],
  [
    "$eq of an object (deep)",
    { $eq: { k: [1, 2] } },
    [{ k: [1, 2] }, [{ k: [1, 2] }]],
    [{ k: [2, 1] }, { k: [1, 2], j: 1 }, undefined],
  ],
  ["$neq", { $neq: "a" }, ["b", ["b", "c"], null], ["a", ["b", "a"], undefined]],
  ["$gt", { $gt: 10 }, [11, [1, 11]], [10, "11", [1, 2], undefined]],
  ["$gte", { $gte: 10 }, [10, 11], [9, undefined]],
  ["$lt", { $lt: 10 }, [9, [20, 9]], [10, undefined]],
  [
    "$lte on text (an ISO date)",
    { $lte: "2026-01-01" },
    ["2025-12-31", "2026-01-01"],
    ["2026-01-02", 20250101, undefined],
  ],
  ["$in a list", { $in: ["a", 1] }, ["a", 1, ["z", 1]], ["b", "1", ["z"], undefined]],
  [
    "$in a string (the field's text contains it)",
    { $in: "gift" },
    ["a gift card", ["x", "gifts"]],
    ["Gift", 7, undefined],
  ],
  ["$nin", { $nin: ["a", "b"] }, ["c", ["c", "d"]], ["a", ["c", "a"], undefined]],
  [
    "$startsWith",
    { $startsWith: "refs/heads/" },
    ["refs/heads/main", ["x", "refs/heads/a"]],
    ["refs/tags/v1", 1, undefined],
  ],
  ["$endsWith", { $endsWith: ".myshopify.com" }, ["a.myshopify.com"], ["a.myshopify.com.evil", undefined]],
  ["$regex", { $regex: "^ord_[0-9]+$" }, ["ord_12", ["x", "ord_1"]], ["ord_", "xord_1", 12, undefined]],
  ["$exist: true", { $exist: true }, [0, null, "", []], [undefined]],
  ["$exist: false", { $exist: false }, [undefined], [0, null]],
  ["$or in a field", { $or: [1, 5] }, [1, 5, [5]], [2, undefined]],
  ["$and in a field", { $and: [{ $gt: 1 }, { $lt: 5 }] }, [2, 4], [1, 5, undefined]],
  ["$not", { $not: { $eq: "a" } }, ["b", undefined], ["a", ["a"]]],
  ["a list (contains every item)", ["a", "b"], [["b", "a", "c"]], [["a"], "a", undefined]],
  ["an object (its fields)", { k: 1 }, [{ k: 1, j: 2 }, [{ k: 2 }, { k: 1 }]], [{ k: 2 }, { j: 1 }, 1, undefined]],
];

describe("compileFilter(): operators", () => {
  for (const [name, filter, yes, no] of OPERATORS) {
    it(`${name}: matches ${yes.map((v) => JSON.stringify(v) ?? "missing").join(", ")}; not ${no.map((v) => JSON.stringify(v) ?? "missing").join(", ")}`, () => {
      for (const x of yes)
        assert.equal(
          onBody({ x: filter }, x === undefined ? {} : { x }),
          true,
          `${JSON.stringify(filter)} on ${JSON.stringify(x)}`,
        );
      for (const x of no)
        assert.equal(
          onBody({ x: filter }, x === undefined ? {} : { x }),
          false,
          `${JSON.stringify(filter)} on ${JSON.stringify(x)}`,
        );
    });
  }

  it("a missing field fails every test but $exist: false and a $not (as on Hookdeck)", () => {
    for (const f of [
      { $neq: 1 },
      { $nin: [1] },
      { $gt: 0 },
      { $startsWith: "" },
      { $regex: "" },
      null,
      { k: { $exist: false } },
    ])
      assert.equal(onBody({ x: f }, {}), false, JSON.stringify(f));
    assert.equal(onBody({ x: { $exist: false } }, {}), true);
    assert.equal(onBody({ x: { $not: { $eq: 1 } } }, {}), true);
    assert.equal(onBody({ x: null }, { x: null }), true, "null is a value, not a missing field");
  });

  it("a body that is not JSON matches no body filter, but $exist: false says it has none", () => {
    const raw = (body: string) =>
      filterInput({ source: "shop", eventType: null, body: Buffer.from(body), headers: {}, url: "/shop" });
    assert.equal(compileFilter({ body: { $exist: true } }, "r")(raw('{"a":1}')), true, "control: JSON is read");
    assert.equal(compileFilter({ body: { $exist: true } }, "r")(raw("<xml>a</xml>")), false);
    assert.equal(compileFilter({ body: { $in: "xml" } }, "r")(raw("<xml>a</xml>")), false);
    assert.equal(compileFilter({ body: { $exist: false } }, "r")(raw("<xml>a</xml>")), true);
  });

  it("headers match by any case of their names, a repeated header as a list; query, path, source and type too", () => {
    const seen = filterInput({
      source: "github",
      eventType: "push",
      body: Buffer.from("{}"),
      url: "/github?region=eu&tag=a&tag=b",
      headers: { "x-github-event": ["push"], "x-tag": ["one", "two"] },
    });
    const t = (f: unknown) => compileFilter(f, "r")(seen);
    assert.equal(t({ headers: { "X-GitHub-Event": "push" } }), true);
    assert.equal(t({ headers: { "X-GitHub-Event": "ping" } }), false);
    assert.equal(t({ headers: { $or: [{ "X-TAG": "two" }, { "x-none": "1" }] } }), true);
    assert.equal(t({ headers: { "x-tag": ["one", "two"] } }), true);
    assert.equal(t({ query: { region: "eu", tag: "b" } }), true);
    assert.equal(t({ query: { region: "us" } }), false);
    assert.equal(t({ path: "/github" }), true);
    assert.equal(t({ path: { path: "/github" } }), true, "Convoy's spelling of a path filter");
    assert.equal(t({ path: { $startsWith: "/gitlab" } }), false);
    assert.equal(t({ source: "github", type: { $in: ["push", "ping"] } }), true);
    assert.equal(t({ type: "pull_request" }), false);
    assert.equal(t({ $not: { type: "push" } }), false);
  });

  it("a path filter sees the source's own path on every mount: a base path or a trailing slash changes nothing", () => {
    const at = (url: string) =>
      filterInput({ source: "shop", eventType: null, body: Buffer.from("{}"), headers: {}, url });
    const f = compileFilter({ path: "/shop", query: { a: "1" } }, "r");
    for (const url of ["/shop?a=1", "/shop/?a=1", "//shop?a=1", "/webhooks/shop?a=1"])
      assert.equal(f(at(url)), true, url);
    assert.equal(f(at("/webhooks/shop")), false, "control: the query is still the request's own");
  });
});

describe("compileFilter(): Hookdeck's documented examples", () => {
  // hookdeck.com/docs/filters and hookdeck/simple-json-match's readme; each with a twin that must not match.
  const product = { product: { title: "Gift Card", tags: ["gift", "something", "another"], inventory: 5 } };
  const cases: [string, unknown, unknown, boolean][] = [
    ["single value match", false, false, true],
    ["single value match (control)", false, true, false],
    ["simple primitive match", { type: "order/created" }, { type: "order/created", order: { id: 123 } }, true],
    [
      "simple primitive match (control)",
      { type: "order/updated" },
      { type: "order/created", order: { id: 123 } },
      false,
    ],
    ["nested object match", { product: { inventory: 0 } }, { product: { title: "A product", inventory: 0 } }, true],
    [
      "nested object match (control)",
      { product: { inventory: 1 } },
      { product: { title: "A product", inventory: 0 } },
      false,
    ],
    [
      "an object inside a list",
      { order: { items: { id: 456 } } },
      { order: { id: 123, items: [{ id: 456, title: "My product" }] } },
      true,
    ],
    [
      "an object inside a list (control)",
      { order: { items: { id: 457 } } },
      { order: { id: 123, items: [{ id: 456, title: "My product" }] } },
      false,
    ],
    ["array contains", { product: { tags: "gift" } }, product, true],
    ["array contains (control)", { product: { tags: "gifts" } }, product, false],
    ["array contains (multiple)", { product: { tags: ["gift", "something"] } }, product, true],
    ["array contains (multiple, control)", { product: { tags: ["gift", "nothing"] } }, product, false],
    ["$lte", { product: { inventory: { $lte: 10 } } }, product, true],
    ["$lte (control)", { product: { inventory: { $lte: 4 } } }, product, false],
    ["$or of values", { product: { inventory: { $or: [1, 5] } } }, product, true],
    ["$or of objects", { $or: [{ hello: "johny" }, { hello: "mark" }] }, { hello: "world" }, false],
    ["$or of objects (the other way)", { $or: [{ hello: "johny" }, { hello: "world" }] }, { hello: "world" }, true],
    ["$eq on the type", { type: { $eq: "payment_intent.succeeded" } }, { type: "payment_intent.succeeded" }, true],
    [
      "$in a list of types",
      { type: { $in: ["payment_intent.succeeded", "invoice.paid"] } },
      { type: "invoice.paid" },
      true,
    ],
    [
      "$in a list of types (control)",
      { type: { $in: ["payment_intent.succeeded", "invoice.paid"] } },
      { type: "invoice.voided" },
      false,
    ],
    [
      "$gte on a nested amount",
      { data: { object: { amount: { $gte: 1000 } } } },
      { data: { object: { amount: 1000 } } },
      true,
    ],
    [
      "$gte on a nested amount (control)",
      { data: { object: { amount: { $gte: 1000 } } } },
      { data: { object: { amount: 999 } } },
      false,
    ],
  ];
  for (const [name, filter, body, expected] of cases) {
    it(`${name}: ${expected ? "matches" : "does not match"}`, () => assert.equal(onBody(filter, body), expected));
  }

  it("a path filter is a string at the root of its scope", () => {
    assert.equal(matches({ path: "/shop" }, {}), true);
    assert.equal(matches({ path: "/other" }, {}), false);
  });

  it("$or at the top joins scopes", () => {
    const f = {
      $or: [{ body: { type: { $eq: "payment_intent.succeeded" } } }, { body: { type: { $eq: "invoice.paid" } } }],
    };
    assert.equal(matches(f, { body: { type: "invoice.paid" } }), true);
    assert.equal(matches(f, { body: { type: "invoice.voided" } }), false);
  });
});

describe("compileFilter(): Convoy's documented examples", () => {
  // getconvoy.io/docs/product-manual/filters; Convoy writes a body filter without the "body" key in its editor.
  const cases: [string, unknown, unknown, boolean][] = [
    ["direct object match", { event_type: "created" }, { event_type: "created" }, true],
    ["direct object match (control)", { event_type: "created" }, { event_type: "deleted" }, false],
    ["nested object match", { event: { type: "created" } }, { event: { type: "created" } }, true],
    ["array contains match", { dish: { ingredients: "rice" } }, { dish: { ingredients: ["beans", "rice"] } }, true],
    ["array contains match (control)", { dish: { ingredients: "rice" } }, { dish: { ingredients: ["beans"] } }, false],
    ["$neq", { event: { $neq: "created" } }, { event: "deleted" }, true],
    ["$neq (control)", { event: { $neq: "created" } }, { event: "created" }, false],
    ["$or", { $or: [{ cities: "london" }, { type: "weekly" }] }, { cities: ["lagos", "london"], type: "daily" }, true],
    ["$or (control)", { $or: [{ cities: "london" }, { type: "weekly" }] }, { cities: ["lagos"], type: "daily" }, false],
    [
      "$and with an $or",
      { $and: [{ age: { $gte: 10 } }, { $or: [{ type: "weekly" }, { cities: "lagos" }] }] },
      { age: 10, cities: ["lagos"], type: "daily" },
      true,
    ],
    [
      "$and with an $or (control)",
      { $and: [{ age: { $gte: 10 } }, { $or: [{ type: "weekly" }, { cities: "lagos" }] }] },
      { age: 9, cities: ["lagos"], type: "weekly" },
      false,
    ],
    ["$in", { operation: { $in: ["created", "deleted"] } }, { operation: "deleted" }, true],
    ["$in (control)", { operation: { $in: ["created", "deleted"] } }, { operation: "updated" }, false],
    ["$nin", { operation: { $nin: ["updated", "truncated"] } }, { operation: "created" }, true],
    ["$nin (control)", { operation: { $nin: ["updated", "truncated"] } }, { operation: "truncated" }, false],
    ["$gt", { age: { $gt: 1 } }, { age: 2 }, true],
    ["$gt (control)", { age: { $gt: 1 } }, { age: 1 }, false],
    ["$regex", { event_type: { $regex: "^order\\." } }, { event_type: "order.created" }, true],
    ["$regex (control)", { event_type: { $regex: "^order\\." } }, { event_type: "refund.created" }, false],
    ["$exist", { event: { id: { $exist: true } } }, { event: { id: "e1" } }, true],
    ["$exist (control)", { event: { id: { $exist: true } } }, { event: {} }, false],
  ];
  for (const [name, filter, body, expected] of cases) {
    it(`${name}: ${expected ? "matches" : "does not match"}`, () => assert.equal(onBody(filter, body), expected));
  }

  it("the four scopes at once", () => {
    const f = {
      body: { event_type: "order.created" },
      headers: { "x-source": "billing" },
      query: { region: "eu" },
      path: { path: "/v2/orders" },
    };
    const all = {
      body: { event_type: "order.created" },
      headers: { "x-source": "billing" },
      query: { region: "eu" },
      path: "/v2/orders",
    };
    assert.equal(matches(f, all), true);
    assert.equal(matches(f, { ...all, query: { region: "us" } }), false);
  });
});

describe("compileFilter(): mistakes stop start-up with one line", () => {
  const cases: [string, unknown, string][] = [
    [
      "an unknown operator",
      { body: { amount: { $gtt: 1 } } },
      "filter at body.amount.$gtt: unknown operator $gtt; expected one of $eq, $neq,",
    ],
    [
      "an operand of the wrong type",
      { body: { amount: { $gt: [1] } } },
      "filter at body.amount.$gt: expected a number, or a string to compare as text (an ISO date), got a list",
    ],
    [
      "a regex that does not compile",
      { body: { id: { $regex: "(" } } },
      'filter at body.id.$regex: the regular expression "(" does not compile:',
    ],
    [
      "$exist with no boolean",
      { body: { id: { $exist: "yes" } } },
      'filter at body.id.$exist: expected true or false, got a string "yes"',
    ],
    ["an empty $or", { $or: [] }, "filter at $or: expected a list of conditions, got an empty list"],
    [
      "an unknown scope",
      { bdy: { a: 1 } },
      'filter at bdy: unknown part "bdy"; expected body, headers, query, path, source, type',
    ],
    ["an operator at the top", { $eq: 1 }, "filter at $eq: $eq cannot stand at the top"],
    ["operators beside fields", { body: { a: 1, $gt: 2 } }, "filter at body: mixes operators ($gt) with fields (a)"],
    [
      "Hookdeck's $ref",
      { body: { a: { $ref: "b" } } },
      "filter at body.a.$ref: $ref (Hookdeck's reference to another field) is not supported here",
    ],
    [
      "Convoy's positional $.",
      { body: { "$.venues.$.name": "x" } },
      "filter at body.$.venues.$.name: Convoy's positional $. syntax is not supported",
    ],
    ["not an object", "livemode", "filter: expected an object of body, headers, query, path, source, type"],
  ];
  for (const [name, filter, expected] of cases) {
    it(`${name}: ${expected}`, () => {
      const text = mistake(filter);
      assert.ok(text.startsWith(`source "shop": route #2 (billing): ${expected}`), text);
      assert.doesNotMatch(text, /\n/);
    });
  }

  it("control: a good filter compiles", () => assert.equal(mistake({ body: { amount: { $gt: 1 } } }), "(compiled)"));
});

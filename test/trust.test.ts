// test/trust.test.ts: lib/config/trust.ts, the trust rule in one place. trustOf() says whose hand wrote each part
// by the way a change came; checkDocument() holds the parts the API wrote to the operator's Policy, each rule
// beside its control (the same part the operator's, or the same name or range allowed, passes); and
// fieldChanges() tells the audit log what changed down to the field without a secret's value.
//   npx node --test test/trust.test.ts

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { fieldChanges } from "../lib/config/config.ts";
import { checkDocument, type Policy, policyFrom, type Trust, trustOf } from "../lib/config/trust.ts";

const doc = (app: Record<string, unknown>, extra: Record<string, unknown> = {}) => ({
  $destinations: { app, ...extra },
  st: { provider: "plain", routes: ["app"] },
});
const APP = { url: "https://app.example.com/hooks", secret: "secret:app" };

describe("trustOf()", () => {
  it("makes every part the operator's when the operator's file came", () => {
    assert.deepEqual(trustOf(doc(APP), "operator"), { "destination app": "operator", "source st": "operator" });
  });

  it("keeps the trust of a part an API change left as it was, keys in any order, and makes the rest the API's", () => {
    const before = { parsed: doc(APP), trust: { "destination app": "operator" as const }, way: "operator" as const };
    const reordered = { secret: APP.secret, url: APP.url };
    assert.deepEqual(trustOf(doc(reordered, { more: { url: "https://x.example.com" } }), "api", before), {
      "destination app": "operator",
      "destination more": "api",
      "source st": "operator",
    });
    assert.equal(trustOf(doc({ ...APP, timeout: 5 }), "api", before)["destination app"], "api", "changed: the API's");
  });
});

describe("checkDocument()", () => {
  const policy = (env: Record<string, string> = {}): Policy => policyFrom(env, [8000, 8001]);
  const api: Trust = { "destination app": "api", "source st": "api" };
  const operator: Trust = { "destination app": "operator", "source st": "operator" };
  const refuses = (settings: Record<string, unknown>, p: Policy, why: RegExp) =>
    assert.rejects(checkDocument(doc(settings), api, p, { addresses: "all" }), why);
  const passes = (settings: Record<string, unknown>, p: Policy, trust = api) =>
    checkDocument(doc(settings), trust, p, { addresses: "all" });

  it("refuses an environment variable INBOX_API_ENV does not name; passes it when named, or in the operator's part", async () => {
    const leak = { ...APP, headers: { "x-leak": "env:DB_PASSWORD" } };
    await refuses(
      leak,
      policy(),
      /destination app: headers\.x-leak names the environment variable DB_PASSWORD, which a change through the API may not read/,
    );
    await passes(leak, policy({ INBOX_API_ENV: "OTHER, DB_PASSWORD" }));
    await passes(leak, policy(), operator);
  });

  it("refuses a secret in the clear and a file; passes a reference, and the operator's own", async () => {
    await refuses({ ...APP, secret: "whsec_abc" }, policy(), /secret holds a secret in the clear/);
    await refuses({ ...APP, url: "https://user:pw@app.example.com/" }, policy(), /url holds a secret in the clear/);
    await refuses({ ...APP, ca: "/etc/ssl/private.pem" }, policy(), /ca names a file on the host/);
    await passes({ ...APP, secret: "whsec_abc", ca: "/etc/ssl/private.pem" }, policy(), operator);
  });

  it("refuses a destination inside the network, a broker's too, unless the operator allows its range", async () => {
    await refuses(
      { ...APP, url: "http://10.1.2.3/x" },
      policy(),
      /url 10\.1\.2\.3 is private, RFC 1918 \(10\.0\.0\.0\/8\)/,
    );
    await refuses(
      { type: "nats", url: "nats://127.0.0.1:4222", subject: "x" },
      policy(),
      /url 127\.0\.0\.1 is loopback/,
    );
    await passes({ ...APP, url: "http://10.1.2.3/x" }, policy({ INBOX_API_DESTINATIONS_ALLOW: "10.0.0.0/8" }));
    await refuses(
      { ...APP, url: "http://10.1.2.3:8001/x" },
      policy({ INBOX_API_DESTINATIONS_ALLOW: "10.0.0.0/8" }),
      /port 8001 is one of the inbox's own/,
    );
  });

  it("leaves an HTTP destination's address to its connections where a version is run, not a broker's; and checks only the sources for the receiver", async () => {
    const inside = doc(
      { ...APP, url: "http://127.0.0.1:9/x" },
      { bus: { type: "nats", url: "nats://10.0.0.5:4222", subject: "x" } },
    );
    const trust: Trust = { ...api, "destination bus": "api" };
    await assert.rejects(
      checkDocument(inside, trust, policy(), { addresses: "unhooked" }),
      /destination bus: url 10\.0\.0\.5/,
    );
    const httpOnly = doc({ ...APP, url: "http://127.0.0.1:9/x" });
    await checkDocument(httpOnly, api, policy(), { addresses: "unhooked" });
    await assert.rejects(
      checkDocument(httpOnly, api, policy(), { addresses: "all" }),
      /loopback/,
      "the control: at apply it is refused",
    );
    const sourceOk = doc({ ...APP, headers: { a: "env:NOPE" } });
    await checkDocument(sourceOk, api, policy(), { addresses: "all", sourcesOnly: true });
    await assert.rejects(checkDocument(sourceOk, api, policy(), { addresses: "all" }), /env.*NOPE|NOPE/);
  });

  it("refuses INBOX_API_ENV and INBOX_API_DESTINATIONS_ALLOW that cannot be read, in one line", () => {
    assert.throws(() => policyFrom({ INBOX_API_ENV: "A,B-C" }), /INBOX_API_ENV: expected names/);
    assert.throws(() => policyFrom({ INBOX_API_DESTINATIONS_ALLOW: "10.0.0.0/40" }), /INBOX_API_DESTINATIONS_ALLOW/);
  });
});

describe("fieldChanges()", () => {
  it("says what changed down to the field, references as written, and no value that may be a secret", () => {
    const before = doc({ ...APP, headers: { "x-token": "env:A", "x-plan": "gold-plan-value" } });
    const after = doc(
      {
        url: "https://new.example.com/hooks",
        secret: "whsec_in_the_clear_value",
        headers: { "x-token": "secret:B", "x-plan": "silver-plan-value" },
      },
      { more: { url: "https://more.example.com" } },
    );
    const lines = fieldChanges(before, after);
    assert.equal(lines[1], "+ destination more");
    assert.match(
      lines[0]!,
      /^~ destination app: url https:\/\/app\.example\.com\/hooks → https:\/\/new\.example\.com\/hooks/,
    );
    assert.match(lines[0]!, /secret secret:app → \(a secret, not shown\)/);
    assert.match(lines[0]!, /headers\.x-token env:A → secret:B/);
    assert.match(lines[0]!, /headers\.x-plan \(a value, not shown\) → \(a value, not shown\)/);
    for (const value of ["whsec_in_the_clear_value", "gold-plan-value", "silver-plan-value"])
      assert.ok(!lines.join("\n").includes(value), value);
    assert.deepEqual(fieldChanges(before, before), [], "the control: no change, no line");
  });
});

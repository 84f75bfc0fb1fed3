// test/contract-audit.test.ts: the contract's part for trust (docs/security.md), on both backends
// (test/contract-harness.ts): every method that changes the inbox on someone's behalf writes its audit entry
// in the change's own transaction, exactly one per change, a bulk change's batches adding to one entry; with
// the audit insert made to fail (a trigger on the audit table), the method rejects and its change is not made,
// the control being the same call without the trigger, which makes it. The secret store keeps rows as they
// are given (sealed), and counts its changes for the watchers.
//   npx node --test test/contract-audit.test.ts

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { mintKey } from "../lib/api/keys.ts";
import type { Audit, Inbox } from "../lib/store.ts";
import { body, contract, LEASE, T0 } from "./contract-harness.ts";
import { refuseAudit } from "./helpers.ts";

// state is what a change may touch, as text: the deliveries, the destinations, the configuration, the keys and
// the secrets.
async function state(inbox: Inbox): Promise<string> {
  return JSON.stringify([
    await inbox.query(
      "SELECT source, id, route, destination, status, attempts, replays, purged_at FROM deliveries ORDER BY source, id, route",
    ),
    await inbox.query("SELECT name, paused, paused_reason FROM destinations ORDER BY name"),
    await inbox.query("SELECT version, document FROM inbox_config ORDER BY version"),
    await inbox.query("SELECT id, revoked_at FROM api_keys ORDER BY id"),
    await inbox.query("SELECT name, sealed FROM secrets ORDER BY name"),
  ]);
}

const entries = async (inbox: Inbox) => (await inbox.auditLog({ limit: 1_000 })).length;

contract((suite) => {
  const { open } = suite;

  // Each case readies the inbox, then makes one change on someone's behalf; count is its entry's count.
  const cases: {
    name: string;
    ready?: (inbox: Inbox) => Promise<void>;
    change: (inbox: Inbox, audit: Audit) => Promise<unknown>;
    count: number;
  }[] = [
    { name: "pause", change: (i, a) => i.pause("app", "deploying", a), count: 1 },
    {
      name: "resume",
      ready: async (i) => void (await i.pause("app")),
      change: (i, a) => i.resume("app", a),
      count: 1,
    },
    {
      name: "retry (one)",
      ready: (i) => failed(i, ["evt_1"]),
      change: (i, a) => i.retry({ source: "st", id: "evt_1" }, a),
      count: 1,
    },
    {
      name: "retry (all failed)",
      ready: (i) => failed(i, ["evt_1", "evt_2"]),
      change: (i, a) => i.retry({ allFailed: true }, a),
      count: 2,
    },
    {
      name: "retryMatching, in batches of 2",
      ready: (i) => failed(i, ["evt_1", "evt_2", "evt_3", "evt_4", "evt_5"]),
      change: (i, a) => i.retryMatching({ source: "st" }, { batch: 2, audit: a }),
      count: 5,
    },
    {
      name: "replayMatching, in batches of 2",
      ready: (i) => done(i, ["evt_1", "evt_2", "evt_3"]),
      change: (i, a) => i.replayMatching({ source: "st" }, { batch: 2, audit: a }),
      count: 3,
    },
    {
      name: "replayMatching to another destination",
      ready: (i) => done(i, ["evt_1", "evt_2"]),
      change: (i, a) => i.replayMatching({ source: "st" }, { to: "other", audit: a }),
      count: 2,
    },
    {
      name: "dropBodies",
      ready: (i) => done(i, ["evt_1", "evt_2"]),
      change: (i, a) => i.dropBodies({ source: "st" }, { batch: 1, audit: a }),
      count: 2,
    },
    {
      name: "purge",
      ready: (i) => done(i, ["evt_1", "evt_2"]),
      change: (i, a) => i.purge({ bodiesAfterMs: 0, forgetAfterMs: 86_400_000, rest: 0, batch: 1, audit: a }),
      count: 2,
    },
    {
      name: "restore",
      change: (i, a) =>
        i.restore(
          [
            {
              source: "st",
              id: "evt_r",
              body: body({}),
              bodySha256: "x",
              contentType: null,
              eventType: null,
              providerTime: null,
              receivedAt: T0,
              status: "received",
              attempts: 0,
              availableAt: T0,
              leasedUntil: null,
              error: null,
              conflicts: 0,
              finishedAt: null,
              replays: 0,
              purgedAt: null,
              orderKey: null,
              eventTime: null,
              newerId: null,
              destination: "app",
              route: 0,
              headers: null,
              traceparent: null,
              origin: "webhook",
            },
          ],
          a,
        ),
      count: 1,
    },
    {
      name: "applyConfig",
      change: (i, a) =>
        i.applyConfig('{"st": {"provider": "plain"}}', { actor: "cli:ops", expectedVersion: 0, audit: a, parts: 1 }),
      count: 1,
    },
    {
      name: "addApiKey",
      change: (i, a) => i.addApiKey(mintKey({ scope: "read", name: "k", now: T0 }).row, a),
      count: 1,
    },
    {
      name: "revokeApiKey",
      ready: async (i) => i.addApiKey({ ...mintKey({ scope: "read", name: "k", now: T0 }).row, id: "k1" }),
      change: (i, a) => i.revokeApiKey("k1", T0 + 1, a),
      count: 1,
    },
    {
      name: "setSecret",
      change: (i, a) => i.setSecret({ name: "s", sealed: "v1.x.y.z", setAt: T0, setBy: "cli:ops" }, a),
      count: 1,
    },
    {
      name: "deleteSecret",
      ready: async (i) => void (await i.setSecret({ name: "s", sealed: "v1.x.y.z", setAt: T0, setBy: "cli:ops" })),
      change: (i, a) => i.deleteSecret("s", a),
      count: 1,
    },
    {
      name: "putSecrets",
      change: (i, a) =>
        i.putSecrets(
          [
            { name: "a", sealed: "v1.k.1.1", setAt: T0, setBy: "cli:ops" },
            { name: "b", sealed: "v1.k.2.2", setAt: T0, setBy: "cli:ops" },
          ],
          a,
        ),
      count: 2,
    },
  ];

  // failed stores deliveries for destination app of source st and sets each aside as failed.
  async function failed(inbox: Inbox, ids: string[]): Promise<void> {
    for (const id of ids) await inbox.store({ source: "st", id, body: body({ id }), destinations: ["app"] });
    for (const lease of await inbox.claimBatch(ids.length, LEASE, { destination: "app" }))
      await inbox.fail(lease, "boom", { permanent: true });
  }

  // done stores deliveries for destination app of source st and finishes each.
  async function done(inbox: Inbox, ids: string[]): Promise<void> {
    for (const id of ids) await inbox.store({ source: "st", id, body: body({ id }), destinations: ["app"] });
    for (const lease of await inbox.claimBatch(ids.length, LEASE, { destination: "app" })) await inbox.finish(lease);
  }

  describe("a change and its audit entry, in one transaction", () => {
    for (const c of cases) {
      it(`${c.name}: refused whole when its entry cannot be written; made, with exactly one entry, when it can`, async () => {
        const inbox = await open();
        await inbox.pause("app").then(() => inbox.resume("app"));
        await c.ready?.(inbox);
        suite.t = T0 + 1_000;
        const before = await state(inbox);
        const had = await entries(inbox);
        const allow = await refuseAudit(inbox);
        await assert.rejects(
          c.change(inbox, { who: "cli:ops", operation: c.name, target: `the test's ${c.name}` }),
          /audit refused/,
        );
        assert.equal(await state(inbox), before, "nothing of the change was made");
        assert.equal(await entries(inbox), had);
        // The control: the same change, its entry allowed, is made, and leaves exactly one entry.
        await allow();
        await c.change(inbox, { who: "cli:ops", operation: c.name, target: `the test's ${c.name}` });
        assert.notEqual(await state(inbox), before, "the change was made");
        const log = await inbox.auditLog({ limit: 1_000 });
        assert.equal(log.length, had + 1, "one entry, however many transactions the change took");
        assert.deepEqual(
          [log[0]!.who, log[0]!.operation, log[0]!.target, log[0]!.count],
          ["cli:ops", c.name, `the test's ${c.name}`, c.count],
        );
      });
    }

    it("a change made without an Audit writes none (a worker's own retention, a breaker's tally)", async () => {
      const inbox = await open();
      await done(inbox, ["evt_1"]);
      await inbox.purge({ bodiesAfterMs: 0, forgetAfterMs: 86_400_000, rest: 0 });
      assert.equal(await entries(inbox), 0);
    });
  });

  describe("the audit log's counts and the secret store", () => {
    it("auditCounts counts the entries by the kind of their actor, the part of who before its first ':'", async () => {
      const inbox = await open();
      for (const who of ["key:a1", "key:b2", "page:local", "cli:ops", "sighup:worker.ts", "start"])
        await inbox.addAudit({ at: T0, who, operation: "x", target: "y", count: 0 });
      assert.deepEqual(await inbox.auditCounts(), [
        { kind: "cli", n: 1 },
        { kind: "key", n: 2 },
        { kind: "page", n: 1 },
        { kind: "sighup", n: 1 },
        { kind: "start", n: 1 },
      ]);
    });

    it("keeps each secret as it was given, lists them by name, and counts every change for the watchers", async () => {
      const inbox = await open();
      const v0 = await inbox.secretsVersion();
      assert.equal(await inbox.setSecret({ name: "b", sealed: "v1.k.1.1", setAt: T0, setBy: "key:a" }), true);
      assert.equal(await inbox.setSecret({ name: "a", sealed: "v1.k.2.2", setAt: T0, setBy: "key:a" }), true);
      assert.equal(await inbox.setSecret({ name: "a", sealed: "v1.k.3.3", setAt: T0 + 1, setBy: "cli:ops" }), false);
      assert.deepEqual(await inbox.secrets(), [
        { name: "a", sealed: "v1.k.3.3", setAt: T0 + 1, setBy: "cli:ops" },
        { name: "b", sealed: "v1.k.1.1", setAt: T0, setBy: "key:a" },
      ]);
      assert.equal(await inbox.secretsVersion(), v0 + 3);
      assert.equal(await inbox.deleteSecret("a"), true);
      assert.equal(await inbox.deleteSecret("a"), false, "a second delete changes nothing");
      assert.equal(await inbox.secretsVersion(), v0 + 4, "and is not counted");
      // Copied as they are, still sealed, into another inbox (inbox.ts copy's pair).
      const other = await suite.another();
      assert.equal(await other.putSecrets(await inbox.secrets()), 1);
      assert.deepEqual(await other.secrets(), await inbox.secrets());
    });
  });
});

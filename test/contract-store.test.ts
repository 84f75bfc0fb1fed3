// test/contract-store.test.ts: the contract's store(), on both backends (test/contract-harness.ts): a delivery kept
// once under its (source, id), a duplicate told from a conflict, bodies byte-exact in a batch and on every route.
//   npx node --import tsx --test test/contract-store.test.ts

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { DEFAULTS } from "../lib/defaults.ts";
import { sha256 } from "../lib/rows.ts";
import { body, contract, T0 } from "./contract-harness.ts";

contract((suite) => {
  const { open } = suite;
  describe("store()", () => {
    it("keeps the first copy: stored, then duplicate, then conflict for a different body", async () => {
      const inbox = await open();
      assert.equal(await inbox.store({ id: "evt_1", body: body({ amount: 1 }) }), "stored");
      assert.equal(await inbox.store({ id: "evt_1", body: body({ amount: 1 }) }), "duplicate");
      assert.equal(await inbox.store({ id: "evt_1", body: body({ amount: 2 }) }), "conflict");
      const [d] = await inbox.find("evt_1");
      assert.deepEqual(d!.body, body({ amount: 1 }));
      assert.equal(d!.conflicts, 1);
      assert.equal(d!.receivedAt, T0);
    });

    it("tells the copies of one key apart within one group commit", async () => {
      const inbox = await open();
      const results = await Promise.all([
        inbox.store({ id: "evt_1", body: body({ a: 1 }) }),
        inbox.store({ id: "evt_1", body: body({ a: 1 }) }),
        inbox.store({ id: "evt_1", body: body({ a: 2 }) }),
        inbox.store({ id: "evt_2", body: body({}) }),
      ]);
      assert.deepEqual(results, ["stored", "duplicate", "conflict", "stored"]);
      assert.equal((await inbox.find("evt_1"))[0]!.conflicts, 1);
    });

    it("keeps bodies byte-exact, bytes that are not UTF-8 included, and one ID apart in two sources", async () => {
      const inbox = await open();
      const bytes = Buffer.from([0xff, 0x00, 0xfe, 0x22, 0x5c, 0x7b]);
      await inbox.store({
        source: "stripe",
        id: "x",
        body: bytes,
        eventType: "a.b",
        providerTime: 123,
        contentType: "application/json",
      });
      await inbox.store({ source: "github", id: "x", body: body({}) });
      const found = await inbox.find("x");
      assert.deepEqual(
        found.map((d) => d.source),
        ["github", "stripe"],
      );
      const stripe = (await inbox.find("x", "stripe"))[0]!;
      assert.deepEqual(stripe.body, bytes);
      assert.deepEqual([stripe.eventType, stripe.providerTime, stripe.contentType], ["a.b", 123, "application/json"]);
    });

    it("keeps every body of one batch apart, byte for byte, on every route: empty, binary and long alike", async () => {
      const inbox = await open();
      const bodies = [
        Buffer.alloc(0),
        Buffer.from([0x00, 0x5c, 0x78, 0xff]),
        Buffer.alloc(70_000, 0xab),
        body({ n: 1 }),
        Buffer.from("\\x00"),
      ];
      // Stored in one turn, so they share a batch (and on PostgreSQL one INSERT); the last goes to two routes.
      await Promise.all(
        bodies.map((b, i) =>
          inbox.store({ id: `b${i}`, body: b, ...(i === 4 ? { destinations: ["one", "two"] } : {}) }),
        ),
      );
      const rows = await inbox.query("SELECT id, route, body FROM deliveries ORDER BY id, route");
      assert.deepEqual(
        rows.map((r) => [r.id, r.route, Buffer.from(r.body as Uint8Array).toString("hex")]),
        [
          ...bodies.slice(0, 4).map((b, i) => [`b${i}`, 0, b.toString("hex")]),
          ["b4", 0, bodies[4]!.toString("hex")],
          ["b4", 1, bodies[4]!.toString("hex")],
        ],
      );
    });

    // PostgreSQL keeps a body of at most inlineBodyBytes in its row and a larger one apart
    // (docs/table.md#bodies-apart): the kept body is read from either.
    for (const [where, memo] of [
      ["in its row", ""],
      ["apart", "m".repeat(DEFAULTS.inlineBodyBytes)],
    ] as const)
      it(`judges a copy of a reconciled delivery by its parsed JSON, its body kept ${where}: the webhook's other bytes are a duplicate, the kept bytes stay`, async () => {
        const inbox = await open();
        const event = {
          id: "evt_1",
          object: "event",
          type: "invoice.paid",
          data: { object: { id: "in_1", amount_paid: 500, memo } },
        };
        const compact = Buffer.from(JSON.stringify(event));
        assert.equal(compact.length > DEFAULTS.inlineBodyBytes, where === "apart");
        // Stripe's webhook: the same JSON, pretty-printed, its keys in another order.
        const { type, ...rest } = event;
        const pretty = Buffer.from(JSON.stringify({ type, ...rest }, null, 2));
        assert.notEqual(sha256(compact), sha256(pretty));
        await inbox.store({
          source: "stripe",
          id: "evt_1",
          body: compact,
          origin: "reconcile",
          destinations: ["handler", "app"],
        });
        // Stored as one turn's batch beside another copy, as a receiver's group commit takes them.
        const [first, second] = await Promise.all([
          inbox.store({ source: "stripe", id: "evt_1", body: pretty }),
          inbox.store({ source: "stripe", id: "evt_1", body: pretty }),
        ]);
        assert.deepEqual([first, second], ["duplicate", "duplicate"]);
        const kept = await inbox.find("evt_1", "stripe");
        assert.deepEqual(
          kept.map((d) => [d.destination, d.conflicts, Buffer.from(d.body).equals(compact)]),
          [
            ["handler", 0, true],
            ["app", 0, true],
          ],
        );
        // (control) Other JSON under the same ID is still a conflict, counted once on route 0.
        const changed = Buffer.from(
          JSON.stringify({ ...event, data: { object: { id: "in_1", amount_paid: 501, memo } } }, null, 2),
        );
        assert.equal(await inbox.store({ source: "stripe", id: "evt_1", body: changed }), "conflict");
        assert.equal((await inbox.find("evt_1", "stripe"))[0]!.conflicts, 1);
        // (control) A webhook's own bytes are the rule where the kept copy came from a webhook: other bytes conflict.
        await inbox.store({ source: "stripe", id: "evt_2", body: compact });
        assert.equal(await inbox.store({ source: "stripe", id: "evt_2", body: pretty }), "conflict");
      });

    it("keeps where a delivery came from: webhook unless told, reconcile kept on every route, a claim, a restore and a replay --to", async () => {
      const inbox = await open();
      await inbox.store({ source: "stripe", id: "evt_w", body: body({}) });
      await inbox.store({
        source: "stripe",
        id: "evt_r",
        body: body({}),
        origin: "reconcile",
        destinations: ["handler", "app"],
      });
      assert.deepEqual(
        (await inbox.find("evt_w")).map((d) => d.origin),
        ["webhook"],
      );
      assert.deepEqual(
        (await inbox.find("evt_r")).map((d) => d.origin),
        ["reconcile", "reconcile"],
      );
      // A webhook that comes after the fetch is a duplicate: the fetched row stays as it was.
      assert.equal(await inbox.store({ source: "stripe", id: "evt_r", body: body({}) }), "duplicate");
      assert.deepEqual(
        (await inbox.find("evt_r")).map((d) => d.origin),
        ["reconcile", "reconcile"],
      );
      const leases = await inbox.claimBatch(10, 30_000);
      assert.deepEqual(leases.map((l) => `${l.id}:${l.origin}`).sort(), ["evt_r:reconcile", "evt_w:webhook"]);
      for (const l of leases) await inbox.finish(l);
      assert.equal((await inbox.replayMatching({ id: "evt_r", destination: "handler" }, { to: "audit" })).replayed, 1);
      assert.deepEqual((await inbox.find("evt_r")).map((d) => `${d.destination}:${d.origin}`).sort(), [
        "app:reconcile",
        "audit:reconcile",
        "handler:reconcile",
      ]);
      // An import puts it back as it was exported.
      const rows = await inbox.find("evt_r");
      await inbox.query("DELETE FROM deliveries WHERE id = 'evt_r'");
      assert.equal((await inbox.find("evt_r")).length, 0);
      assert.equal(await inbox.restore(rows), 3);
      assert.deepEqual(
        (await inbox.find("evt_r")).map((d) => d.origin),
        ["reconcile", "reconcile", "reconcile"],
      );
    });
  });
});

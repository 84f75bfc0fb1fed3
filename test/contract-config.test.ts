// test/contract-config.test.ts: the configuration kept in the database, on both backends
// (test/contract-harness.ts): applyConfig() as one transaction (a version each, refused on a stale
// expectedVersion or while rows wait for a destination it removes), readConfig() and configVersion(), the
// history paged newest first (configVersions()) and copied whole (configHistory(), restoreConfig()).
//   npx node --import tsx --test test/contract-config.test.ts

import assert from "node:assert/strict";
import { it } from "node:test";
import { body, contract } from "./contract-harness.ts";

const doc = (destinations: string[]) =>
  `${JSON.stringify({
    s: { provider: "plain", routes: destinations },
    $destinations: Object.fromEntries(destinations.map((d) => [d, { url: "http://127.0.0.1:1/", secret: "env:X" }])),
  })}\n`;

contract((suite) => {
  const { open } = suite;

  it("readConfig() is undefined and configVersion() 0 until a configuration is applied; then each apply is a version", async () => {
    const inbox = await open();
    assert.equal(await inbox.readConfig(), undefined);
    assert.equal(await inbox.configVersion(), 0);
    const transforms = { "./t.ts": { sha256: "ab".repeat(32), code: "export default () => null;" } };
    const first = await inbox.applyConfig(doc(["app"]), { actor: "test", expectedVersion: 0, transforms });
    assert.deepEqual(first, { applied: true, version: 1, cancelled: 0 });
    const read = await inbox.readConfig();
    assert.equal(read?.version, 1);
    assert.equal(read?.document, doc(["app"]), "the text as applied, byte for byte");
    assert.deepEqual(read?.transforms, transforms);
    assert.equal(read?.actor, "test");
    assert.equal(read?.appliedAt, suite.t);
    assert.deepEqual(await inbox.applyConfig(doc(["app", "b"]), { actor: "test" }), {
      applied: true,
      version: 2,
      cancelled: 0,
    });
    assert.equal(await inbox.configVersion(), 2);
    // A second inbox on the same target sees it: the configuration is the database's, not the process's.
    const other = await open();
    assert.equal((await other.readConfig())?.document, doc(["app", "b"]));
  });

  it("configVersions() pages the versions newest first, below a version when given, each whole", async () => {
    const inbox = await open();
    assert.deepEqual(await inbox.configVersions({ limit: 5 }), []);
    for (const [i, names] of [["a"], ["a", "b"], ["b"]].entries()) {
      await inbox.applyConfig(doc(names), { actor: `actor${i}`, way: i === 1 ? "api" : "operator" });
      suite.t += 1_000;
    }
    const page = await inbox.configVersions({ limit: 2 });
    assert.deepEqual(
      page.map((v) => [v.version, v.actor, v.way, v.document]),
      [
        [3, "actor2", "operator", doc(["b"])],
        [2, "actor1", "api", doc(["a", "b"])],
      ],
    );
    assert.deepEqual(
      (await inbox.configVersions({ before: 2, limit: 2 })).map((v) => v.version),
      [1],
    );
    assert.deepEqual(await inbox.configVersions({ before: 1, limit: 2 }), []);
    assert.deepEqual((await inbox.configVersions({ before: 3, limit: 1 }))[0], (await inbox.configHistory())[1]);
  });

  it("configHistory() lists every version oldest first; restoreConfig() writes them into another inbox as they are, and skips what is there", async () => {
    const inbox = await open();
    const transforms = { "./t.ts": { sha256: "cd".repeat(32), code: "export default () => ({});" } };
    await inbox.applyConfig(doc(["app"]), { actor: "ann", transforms });
    suite.t += 60_000;
    await inbox.applyConfig(doc(["app", "b"]), { actor: "bo" });
    const history = await inbox.configHistory();
    assert.deepEqual(
      history.map((v) => [v.version, v.actor, v.appliedAt, v.document]),
      [
        [1, "ann", suite.t - 60_000, doc(["app"])],
        [2, "bo", suite.t, doc(["app", "b"])],
      ],
    );
    assert.deepEqual(history[0]!.transforms, transforms);
    const copy = await suite.another();
    assert.deepEqual(await copy.configHistory(), []);
    assert.equal(await copy.restoreConfig(history), 2);
    assert.deepEqual(await copy.configHistory(), history, "numbers, actors, times and transforms kept");
    assert.equal((await copy.readConfig())?.version, 2, "the newest is in force there too");
    assert.equal(await copy.configVersion(), 2);
    assert.equal(await copy.restoreConfig(history), 0, "run again, it writes nothing");
    // The next version applied there follows on from the copied history.
    assert.deepEqual(await copy.applyConfig(doc(["b"]), { actor: "cy", expectedVersion: 2 }), {
      applied: true,
      version: 3,
      cancelled: 0,
    });
  });

  it("applyConfig() refuses a stale expectedVersion and changes nothing", async () => {
    const inbox = await open();
    await inbox.applyConfig(doc(["app"]), { actor: "a" });
    const stale = await inbox.applyConfig(doc(["b"]), { actor: "b", expectedVersion: 0 });
    assert.deepEqual(stale, { applied: false, reason: "version", version: 1 });
    assert.equal((await inbox.readConfig())?.document, doc(["app"]));
    // Control: the right version goes through.
    assert.equal((await inbox.applyConfig(doc(["b"]), { actor: "b", expectedVersion: 1 })).applied, true);
  });

  it("applyConfig() refuses to remove a destination rows wait for; with cancelWaiting it sets them aside and pauses it, in one transaction", async () => {
    const inbox = await open();
    await inbox.applyConfig(doc(["app", "b"]), { actor: "t" });
    await inbox.store({ source: "s", id: "w1", body: body({}), destinations: ["app"] });
    await inbox.store({ source: "s", id: "w2", body: body({}), destinations: ["app", "b"] });
    const refused = await inbox.applyConfig(doc(["b"]), { actor: "t", removed: ["app"] });
    assert.deepEqual(refused, { applied: false, reason: "waiting", waiting: [{ destination: "app", n: 2 }] });
    assert.equal(await inbox.configVersion(), 1, "nothing changed");
    assert.equal((await inbox.destinations()).find((d) => d.name === "app")?.state, "closed");
    // Control: with cancelWaiting the same removal goes through.
    const cancelled = await inbox.applyConfig(doc(["b"]), { actor: "t", removed: ["app"], cancelWaiting: true });
    assert.deepEqual(cancelled, { applied: true, version: 2, cancelled: 2 });
    const app = (await inbox.destinations()).find((d) => d.name === "app")!;
    assert.equal(app.state, "paused");
    assert.match(app.pausedReason ?? "", /removed from the configuration \(version 2\)/);
    assert.equal(app.waiting, 0);
    assert.equal(app.failed, 2);
    const rows = await inbox.find("w2", "s");
    assert.deepEqual(
      rows.map((r) => [r.destination, r.status]).sort(),
      [
        ["app", "failed"],
        ["b", "received"],
      ],
      "only the removed destination's rows are set aside",
    );
    // Brought back, it is let go again; a pause by a person would stay.
    await inbox.applyConfig(doc(["app", "b"]), { actor: "t" });
    assert.equal((await inbox.destinations()).find((d) => d.name === "app")?.state, "closed");
  });
});

// test/config-live.test.ts: a configuration changed while receiver.ts and two worker.ts run, on SQLite and
// on PostgreSQL (there as two hosts would: separate processes on one server, nothing shared but it). Each
// change goes through `inbox.ts config apply` (or SIGHUP) and is taken up with no restart: a new
// destination gets forwards, a changed transform is used, a bad file changes nothing, a filter applies to
// what is stored after it, a pause and a removal stop what starts after them with no lease lost, and a
// removal that rows wait for is refused.
//   npx node --import tsx --test test/config-live.test.ts

import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { connect } from "../inbox.ts";
import { sign } from "../lib/providers.ts";
import { backends, destinationServer, runScript, startReceiver, startWorker, tempDir, until } from "./helpers.ts";
import { signalChild } from "../lib/runtime.ts";

const DEST_SECRET = `whsec_${Buffer.from("the destinations' secret").toString("base64")}`;
const SOURCE_SECRET = `whsec_${Buffer.from("the provider's secret").toString("base64")}`;
const ENV = { DEST_SECRET, SOURCE_SECRET };

for (const backend of await backends("config_live")) {
  describe(`a configuration changed live, on ${backend.name}`, { skip: backend.skip }, () => {
    it("is taken up by a running receiver and two workers: a new destination, a changed transform, a bad file, a filter, a pause, a removal, SIGHUP", async () => {
      const { target: db, cleanup } = await backend.make();
      const dir = tempDir();
      const dest = await destinationServer();
      const transform = join(dir.dir, "shape.mjs");
      const file = join(dir.dir, "sources.json");
      const other = join(dir.dir, "other.json");
      const destination = (name: string, extra: Record<string, unknown> = {}) => ({
        url: `${dest.url}/${name}`,
        secret: "env:DEST_SECRET",
        // One forward at a time per worker, so a slow destination has some in flight and some waiting.
        maxInFlight: 1,
        ...extra,
      });
      const write = (path: string, d: unknown) => writeFileSync(path, `${JSON.stringify(d, null, 2)}\n`);
      const doc = (routes: string[], destinations: Record<string, unknown>) => ({
        st: { provider: "standard", secret: "env:SOURCE_SECRET", routes },
        $destinations: destinations,
      });
      const apply = (path: string, ...more: string[]) =>
        runScript("inbox.ts", ["config", "apply", path, "--db", db, ...more], ENV);
      let n = 0;
      const post = async (count = 1, extra: Record<string, unknown> = {}): Promise<string[]> => {
        const ids: string[] = [];
        for (let i = 0; i < count; i++) {
          const id = `evt_${++n}`;
          const body = JSON.stringify({ n, ...extra });
          const r = await fetch(`${receiver.url}/st`, {
            method: "POST",
            headers: {
              ...sign("standard", SOURCE_SECRET, { id, body, timestampS: Math.floor(Date.now() / 1000) }),
              "content-type": "application/json",
            },
            body,
          });
          assert.equal(r.status, 200, await r.text());
          ids.push(id);
        }
        return ids;
      };
      const sentTo = (to: string, id: string) => dest.got.filter((g) => g.to === to && g.id === id);
      // Every running script has taken version v up: the receiver serves it, each worker runs it.
      const takenUp = async (v: number, since: number) => {
        await until(`version ${v} taken up`, () =>
          [receiver.log(), ...workers.map((w) => w.log())].every((l) =>
            new RegExp(`(serving|running) configuration version ${v}\\b`).test(l),
          ),
        );
        return Date.now() - since;
      };
      const version = async () => Number((await inbox.query("SELECT max(version) AS v FROM inbox_config"))[0]!.v);
      const tookMs: number[] = [];

      write(file, doc(["a"], { a: destination("a") }));
      const receiver = await startReceiver(db, ["--sources", file], ENV);
      // Two workers started without --sources: they run what the database holds.
      const workers = [startWorker(db, [], ENV), startWorker(db, [], ENV)];
      const inbox = await connect(db);
      try {
        const [d1] = await post();
        await until("d1 forwarded to a", () => sentTo("a", d1!).length === 1);

        // A new destination, while everything runs.
        write(other, doc(["a", "b"], { a: destination("a"), b: destination("b") }));
        const dry = await apply(other, "--dry-run");
        assert.equal(dry.code, 0, dry.stderr);
        assert.match(dry.stdout, /Would change version 1:\n {2}~ source st\n {2}\+ destination b/);
        assert.equal(await version(), 1, "a dry run changes nothing");
        let applied = await apply(other);
        assert.equal(applied.code, 0, applied.stderr);
        tookMs.push(await takenUp(2, Date.now()));
        const [d2] = await post();
        await until("d2 forwarded to a and b", () => sentTo("a", d2!).length === 1 && sentTo("b", d2!).length === 1);
        assert.equal(sentTo("b", d1!).length, 0, "control: a delivery stored before the change is not routed to b");

        // A transform on b, then changed: the next forwards use the new code.
        writeFileSync(transform, "export default (d) => ({ body: { shaped: 1, id: d.id } });\n");
        write(other, doc(["a", "b"], { a: destination("a"), b: destination("b", { transform }) }));
        applied = await apply(other);
        assert.equal(applied.code, 0, applied.stderr);
        assert.match(applied.stdout, /\+ transform .*shape\.mjs \(sha256 [0-9a-f]{12}\)/);
        tookMs.push(await takenUp(3, Date.now()));
        const [d3] = await post();
        await until("d3 shaped by version 1", () => sentTo("b", d3!).length === 1);
        assert.deepEqual(JSON.parse(sentTo("b", d3!)[0]!.body), { shaped: 1, id: d3 });
        writeFileSync(transform, "export default (d) => ({ body: { shaped: 2, id: d.id } });\n");
        applied = await apply(other);
        assert.equal(applied.code, 0, applied.stderr);
        assert.match(applied.stdout, /~ transform .*shape\.mjs \(sha256 [0-9a-f]{12} → [0-9a-f]{12}\)/);
        tookMs.push(await takenUp(4, Date.now()));
        const [d4] = await post();
        await until("d4 shaped by version 2", () => sentTo("b", d4!).length === 1 && sentTo("a", d4!).length === 1);
        assert.deepEqual(JSON.parse(sentTo("b", d4!)[0]!.body), { shaped: 2, id: d4 });
        assert.deepEqual(JSON.parse(sentTo("a", d4!)[0]!.body), { n: 4 }, "a has no transform");

        // A file that fails validation changes nothing, and the old routes still route.
        write(other, doc(["a", "b", "nowhere"], { a: destination("a"), b: destination("b", { transform }) }));
        const bad = await apply(other);
        assert.equal(bad.code, 2);
        assert.match(bad.stderr, /expected "to" to name a destination.*nothing changed/);
        assert.equal(await version(), 4);
        const [d5] = await post();
        await until("d5 forwarded to a and b", () => sentTo("a", d5!).length === 1 && sentTo("b", d5!).length === 1);

        // A filter on the route to b applies to the deliveries stored after it.
        write(other, {
          ...doc([], { a: destination("a"), b: destination("b", { transform }) }),
          st: {
            provider: "standard",
            secret: "env:SOURCE_SECRET",
            routes: ["a", { to: "b", filter: { body: { keep: true } } }],
          },
        });
        applied = await apply(other);
        assert.equal(applied.code, 0, applied.stderr);
        tookMs.push(await takenUp(5, Date.now()));
        const [dropped] = await post(1, { keep: false });
        const [kept] = await post(1, { keep: true });
        await until(
          "kept forwarded to a and b",
          () => sentTo("a", kept!).length === 1 && sentTo("b", kept!).length === 1,
        );
        await until("dropped forwarded to a", () => sentTo("a", dropped!).length === 1);
        assert.equal(sentTo("b", dropped!).length, 0, "the filter keeps it from b");
        assert.deepEqual(
          (await inbox.find(dropped!, "st")).map((r) => r.destination),
          ["a"],
          "routed to a alone, at store time",
        );

        // Pause a while its forwards are in flight: none starts after the pause has committed.
        dest.delay.set("a", 1_500);
        const slowA = await post(6);
        await until("a forward to a in flight", () => slowA.some((id) => sentTo("a", id).length > 0));
        const paused = await runScript("inbox.ts", ["pause", "a", "--db", db], ENV);
        assert.equal(paused.code, 0, paused.stderr);
        const pausedAt = Date.now();
        await sleep(2_500);
        const afterPause = dest.got.filter((g) => g.to === "a" && g.at > pausedAt);
        assert.deepEqual(afterPause, [], "nothing sent to a after its pause committed");
        const sentA = slowA.filter((id) => sentTo("a", id).length > 0);
        assert.ok(sentA.length >= 1 && sentA.length < slowA.length, `some, not all, went before the pause: ${sentA}`);

        // Removing a, with rows still waiting for it, is refused, and nothing changes.
        write(other, doc(["b"], { b: destination("b", { transform }) }));
        const refused = await apply(other);
        assert.equal(refused.code, 1, refused.stderr);
        assert.match(
          refused.stderr,
          /deliveries still wait for a destination this removes \(\d+ for a\); nothing changed/,
        );
        assert.equal(await version(), 5);

        // Remove b while its forwards are in flight, cancelling what waits: nothing is sent after the commit.
        dest.delay.set("b", 1_500);
        const slowB = await post(6, { keep: true });
        await until("a forward to b in flight", () => slowB.some((id) => sentTo("b", id).length > 0));
        write(other, doc(["a"], { a: destination("a") }));
        const removed = await apply(other, "--cancel-waiting");
        assert.equal(removed.code, 0, removed.stderr);
        const removedAt = Date.now();
        assert.match(removed.stdout, /- destination b/);
        tookMs.push(await takenUp(6, removedAt - 1));
        await sleep(2_000);
        assert.deepEqual(
          dest.got.filter((g) => g.to === "b" && g.at > removedAt),
          [],
          "nothing sent to b after its removal committed",
        );
        const rowsB = await inbox.query(
          "SELECT id, status, error FROM deliveries WHERE destination = 'b' AND id IN (" +
            slowB.map((id) => `'${id}'`).join(",") +
            ")",
        );
        for (const row of rowsB) {
          const sent = sentTo("b", row.id as string).length;
          assert.ok(sent <= 1, `${row.id} sent once at most`);
          if (sent === 1)
            assert.equal(row.status, "done", `${row.id} was sent, and its done mark kept (no lease lost)`);
          else assert.notEqual(row.status, "done", `${row.id} was not sent`);
        }
        // What waits for a destination that is gone is shown, not left in silence.
        const waitingB = rowsB.filter((r) => r.status === "received" || r.status === "processing").length;
        const status = await runScript("inbox.ts", ["status", "--db", db], ENV);
        assert.equal(status.code, 0, status.stderr);
        if (waitingB > 0)
          assert.match(status.stdout, new RegExp(`waiting for a removed destination: b, ${waitingB} deliver`));
        else assert.doesNotMatch(status.stdout, /waiting for a removed destination/);
        // Each row not sent was cancelled in the removal's transaction (those not yet claimed), or waits (those a
        // lane had claimed ahead and gave back): as many cancelled as the command said.
        const cancelled = rowsB.filter((r) => r.status === "failed");
        for (const r of cancelled)
          assert.match(String(r.error), /cancelled: destination b removed by configuration version 6/);
        assert.equal(
          Number(/(\d+) waiting deliver(?:y|ies) set aside/.exec(removed.stdout)?.[1] ?? 0),
          cancelled.length,
        );
        assert.equal(rowsB.length, slowB.length);
        // Rows stored for b after the removal (a receiver takes up to its check to see it) wait, shown:
        // here, one stored straight into the inbox as an old receiver would have.
        await inbox.store({ source: "st", id: "late", body: Buffer.from("{}"), destinations: ["b"] });
        const shown = await runScript("inbox.ts", ["status", "--db", db], ENV);
        assert.match(shown.stdout, new RegExp(`waiting for a removed destination: b, ${waitingB + 1} deliver`));
        const scraped = await (await fetch(`${receiver.url}/metrics`)).text();
        assert.match(scraped, new RegExp(`inbox_destination_removed_waiting\\{destination="b"\\} ${waitingB + 1}`));

        // SIGHUP with a half-written --sources file changes nothing, and says why.
        writeFileSync(file, '{"st": {"provider": "standard", ');
        signalChild(receiver.child, "SIGHUP");
        await until("the receiver says why", () =>
          /SIGHUP: .*sources\.json: not valid JSON( at position \d+)?; nothing changed/.test(receiver.log()),
        );
        assert.equal(await version(), 6);
        // Control: a whole file, at SIGHUP, is applied.
        write(file, doc(["a"], { a: destination("a"), c: destination("c") }));
        signalChild(receiver.child, "SIGHUP");
        tookMs.push(await takenUp(7, Date.now()));
        assert.equal(await version(), 7);
      } finally {
        const codes = await Promise.all([receiver.stop(), ...workers.map((w) => w.stop())]);
        await inbox.close();
        dest.server.close();
        for (const w of workers) {
          assert.match(w.log(), /forwarded \d+, \d+ to retry, \d+ set aside, \d+ held, 0 lost to other workers/);
          assert.doesNotMatch(w.log(), /lease was lost/);
        }
        assert.deepEqual(codes, [0, 0, 0]);
        console.log(`# ${backend.name}: versions taken up by all three in ${tookMs.join(", ")} ms`);
        dir.cleanup();
        await cleanup();
      }
    });
  });
}

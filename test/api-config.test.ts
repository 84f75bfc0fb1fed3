// test/api-config.test.ts: issue 36's story told through the API, on SQLite and on PostgreSQL (there as two
// hosts would: separate processes on one server, nothing shared but it), with admin.ts serving the API, and a
// receiver.ts and two worker.ts running, none of them restarted. Through the generated client (openapi-fetch):
// a destination with a transform, and a route to it with a filter, are created; signed deliveries reach it,
// their forwards' Standard Webhooks signatures verified; a test delivery reaches it; the transform changed and
// applied again is the code the next forwards run; a document that fails validation changes nothing and the old
// routes still route; a pause stops every forward that had not started when it committed; a destination deleted
// while its forwards are in flight is sent nothing after the delete committed, and no lease is lost.
//   npx node --import tsx --test test/api-config.test.ts

import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";
import createClient from "openapi-fetch";
import { Webhook } from "standardwebhooks";
import { connect } from "../inbox.ts";
import { sign } from "../lib/providers.ts";
import { TEST_SOURCE } from "../lib/store.ts";
import type { paths } from "./generated/api.ts";
import {
  backends,
  destinationServer,
  runScript,
  startAdmin,
  startReceiver,
  startWorker,
  tempDir,
  until,
} from "./helpers.ts";

const DEST_SECRET = `whsec_${Buffer.from("the destinations' secret, API").toString("base64")}`;
const SOURCE_SECRET = `whsec_${Buffer.from("the provider's secret, API").toString("base64")}`;
// The operator hands the API the two variables and the destination server on loopback (docs/security.md):
// admin.ts checks a change by them, and the workers each forward's address.
const ENV = {
  DEST_SECRET,
  SOURCE_SECRET,
  INBOX_API_ENV: "DEST_SECRET,SOURCE_SECRET",
  INBOX_API_DESTINATIONS_ALLOW: "127.0.0.1/32",
};

for (const backend of await backends("api_config")) {
  describe(`the configuration changed through the API while a receiver and two workers run, on ${backend.name}`, {
    skip: backend.skip,
  }, () => {
    it("creates a destination with a transform and a filtered route, forwards verified, a transform changed live, a bad document refused, a pause, a delete in flight", async () => {
      const { target: db, cleanup } = await backend.make();
      const dir = tempDir();
      const dest = await destinationServer();
      // The transform is code the configuration holds, run in the sandbox: no file on any host.
      const transform = (n: number) => ({ code: `export default (d) => ({ body: { shaped: ${n}, id: d.id } });\n` });
      const shape = join(dir.dir, "shape.mjs");
      writeFileSync(shape, "export default (d) => ({});\n");
      const made = await runScript("inbox.ts", ["keys", "create", "--scope", "write", "--json", "--db", db]);
      assert.equal(made.code, 0, made.stderr);
      const key = (JSON.parse(made.stdout) as { id: string; key: string }).key;
      // Nothing is configured yet: the receiver serves the default source, the workers the handler alone.
      const [admin, receiver] = await Promise.all([startAdmin(["--db", db], ENV), startReceiver(db, [], ENV)]);
      // A worker says which version it takes up, not the one it starts with: each is up before the first change.
      const workers = [0, 1].map(() => startWorker(db, ["--metrics-port", "0"], ENV));
      await until("both workers up", () => workers.every((w) => /Metrics on/.test(w.log())));
      const inbox = await connect(db);
      const api = createClient<paths>({ baseUrl: admin.url, headers: { authorization: `Bearer ${key}` } });
      const verifier = new Webhook(DEST_SECRET);

      const destination = (name: string, extra: Record<string, unknown> = {}) => ({
        url: `${dest.url}/${name}`,
        secret: "env:DEST_SECRET",
        // One forward at a time per worker, so a slow destination has some in flight and some waiting.
        maxInFlight: 1,
        ...extra,
      });
      const source = (routes: unknown[]) => ({ provider: "standard", secret: "env:SOURCE_SECRET", routes });
      const filtered = { to: "b", filter: { body: { keep: true } } };
      let n = 0;
      const post = async (count: number, keep: boolean): Promise<string[]> => {
        const ids: string[] = [];
        for (let i = 0; i < count; i++) {
          const id = `evt_${++n}`;
          const body = JSON.stringify({ n, keep });
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
      const takenUp = (v: number) =>
        until(`version ${v} taken up`, () =>
          [receiver.log(), ...workers.map((w) => w.log())].every((l) =>
            new RegExp(`(serving|running) configuration version ${v}\\b`).test(l),
          ),
        );
      const version = async () => (await inbox.readConfig())?.version ?? 0;
      const waitingFor = async (to: string, ids: string[]) =>
        (await inbox.query("SELECT id, status, error FROM deliveries WHERE destination = ?", to)).filter((r) =>
          ids.includes(r.id as string),
        );

      try {
        // One whole document first (a document needs a source), then a destination and a route through their own paths.
        const first = await api.PUT("/api/v1/config", {
          body: { document: { st: source(["a"]), $destinations: { a: destination("a") } }, expectedVersion: 0 },
        });
        assert.equal(first.data?.version, 1, JSON.stringify(first.error));
        const b = await api.PUT("/api/v1/destinations/{name}", {
          params: { path: { name: "b" } },
          body: { settings: destination("b", { transform: transform(1) }) },
        });
        assert.equal(b.data?.version, 2, JSON.stringify(b.error));
        assert.equal(b.data!.changes[0], "+ destination b");
        assert.match(b.data!.changes[1]!, /^\+ transform code:[0-9a-f]{12} \(sha256 [0-9a-f]{12}\)$/);
        const route = await api.PUT("/api/v1/sources/{name}", {
          params: { path: { name: "st" } },
          body: { settings: source(["a", filtered]), expectedVersion: 2 },
        });
        assert.deepEqual([route.data?.version, route.data?.changes], [3, ["~ source st"]]);
        assert.equal((await inbox.readConfig())!.actor, `key:${JSON.parse(made.stdout).id}`);
        await takenUp(3);

        // Signed deliveries: the filter lets the one with keep through to b; both reach a. Each forward is signed.
        const [kept] = await post(1, true);
        const [dropped] = await post(1, false);
        await until("kept forwarded to a and b, dropped to a", () =>
          [sentTo("a", kept!), sentTo("b", kept!), sentTo("a", dropped!)].every((s) => s.length === 1),
        );
        assert.deepEqual(
          (await inbox.find(dropped!, "st")).map((r) => r.destination),
          ["a"],
          "the filter kept it from b at store time",
        );
        assert.deepEqual(JSON.parse(sentTo("b", kept!)[0]!.body), { shaped: 1, id: kept });
        assert.deepEqual(JSON.parse(sentTo("a", kept!)[0]!.body), { n: 1, keep: true }, "a has no transform");
        const tried = await api.POST("/api/v1/filters/test", {
          body: { filter: filtered.filter, delivery: { source: "st", id: dropped! } },
        });
        assert.deepEqual(tried.data, { matches: false, notes: [] });

        // A test delivery, to b alone, through its transform.
        const test = await api.POST("/api/v1/destinations/{name}/test", { params: { path: { name: "b" } }, body: {} });
        assert.equal(test.response.status, 202);
        await until("the test delivery forwarded to b", () => sentTo("b", test.data!.id).length === 1);
        assert.deepEqual(JSON.parse(sentTo("b", test.data!.id)[0]!.body), { shaped: 1, id: test.data!.id });
        assert.equal(sentTo("a", test.data!.id).length, 0, "to b alone");
        const followed = await api.GET("/api/v1/deliveries/{source}/{id}", {
          params: { path: { source: TEST_SOURCE, id: test.data!.id } },
        });
        await until("its row done", async () => (await inbox.find(test.data!.id, TEST_SOURCE))[0]?.status === "done");
        assert.deepEqual(
          followed.data!.rows.map((r) => [r.destination, r.origin, r.eventType]),
          [["b", "test", "inbox.test"]],
        );

        // A module path through the API is refused: only the operator's file names files on the host.
        const path = await api.PUT("/api/v1/destinations/{name}", {
          params: { path: { name: "b" } },
          body: { settings: destination("b", { transform: shape }) },
        });
        assert.equal(path.response.status, 400);
        assert.match(JSON.stringify(path.error), /transform names a module file on the host/);

        // The transform's code changed through the API: its new hash is a new version, and the next forwards
        // run the new code, with no restart and no file.
        const read = await api.GET("/api/v1/config");
        const document = read.data!.document! as { $destinations: Record<string, Record<string, unknown>> };
        document.$destinations.b!.transform = transform(2);
        const again = await api.PUT("/api/v1/config", {
          body: { document, expectedVersion: read.data!.version },
        });
        assert.equal(again.data?.version, 4, JSON.stringify(again.error));
        assert.match(again.data!.changes.join("\n"), /\+ transform code:[0-9a-f]{12} \(sha256 [0-9a-f]{12}\)/);
        await takenUp(4);
        const [reshaped] = await post(1, true);
        await until("reshaped forwarded to b", () => sentTo("b", reshaped!).length === 1);
        assert.deepEqual(JSON.parse(sentTo("b", reshaped!)[0]!.body), { shaped: 2, id: reshaped });

        // A document that fails validation changes nothing, and the old routes still route.
        const before = await inbox.readConfig();
        const bad = await api.PUT("/api/v1/config", {
          body: { document: { ...read.data!.document!, st: source(["a", filtered, "nowhere"]) } },
        });
        assert.equal(bad.response.status, 400);
        assert.match(bad.error!.detail, /source "st": route #3: expected "to" to name a destination .*"nowhere"/);
        assert.deepEqual(await inbox.readConfig(), before, "nothing changed");
        const [still] = await post(1, true);
        await until(
          "still forwarded to a and b",
          () => sentTo("a", still!).length === 1 && sentTo("b", still!).length === 1,
        );

        // Pause b while its forwards are in flight: none starts after the pause has committed.
        dest.delay.set("b", 1_000);
        const slow = await post(6, true);
        await until("a forward to b in flight", () => slow.some((id) => sentTo("b", id).length > 0));
        const paused = await api.POST("/api/v1/destinations/{name}/pause", {
          params: { path: { name: "b" } },
          body: { reason: "deploying" },
        });
        assert.deepEqual(paused.data, { changed: true });
        const pausedAt = Date.now();
        // Settled: what was in flight finished, and what a lane had claimed ahead went back.
        await until("nothing of b's in flight", async () =>
          (await waitingFor("b", slow)).every((r) => r.status !== "processing"),
        );
        // A forward whose last pause read came before the commit may still reach b after the reply (on a busy
        // machine its request can take longer than the pause's reply did): it began before the pause, and each
        // worker has at most one such (maxInFlight 1). What the pause must stop began after it, as a forward
        // the pause let through would (its worker's previous one answered a second later).
        const late = dest.got.filter((g) => g.to === "b" && g.at > pausedAt);
        const began = await Promise.all(
          late.map(async (g) =>
            (await inbox.attempts({ source: "st", id: g.id, receivedAt: 0, destination: "b" })).map((a) => a.startedAt),
          ),
        );
        assert.ok(late.length <= workers.length, `at most one forward a worker let through: ${late.length}`);
        assert.deepEqual(
          began.filter((starts) => starts.every((at) => at > pausedAt)),
          [],
          "nothing sent to b that began after its pause committed",
        );
        const sentBefore = slow.filter((id) => sentTo("b", id).length > 0);
        assert.ok(sentBefore.length < slow.length, `some waited for the resume: sent ${sentBefore}`);
        await api.POST("/api/v1/destinations/{name}/resume", { params: { path: { name: "b" } }, body: {} });
        await until("every slow one forwarded to b after the resume", () =>
          slow.every((id) => sentTo("b", id).length === 1),
        );

        // Delete b while its forwards are in flight: first its route, then b, which is refused while rows wait
        // for it, then let go with cancelWaiting. Nothing is sent to b after the delete committed.
        // Slower still, so the three requests below fit inside one forward on a busy machine.
        dest.delay.set("b", 2_000);
        const last = await post(6, true);
        await until("a forward to b in flight", () => last.some((id) => sentTo("b", id).length > 0));
        const unrouted = await api.PUT("/api/v1/sources/{name}", {
          params: { path: { name: "st" } },
          body: { settings: source(["a"]) },
        });
        assert.equal(unrouted.data?.version, 5, JSON.stringify(unrouted.error));
        const refused = await api.DELETE("/api/v1/destinations/{name}", { params: { path: { name: "b" } } });
        assert.equal(refused.response.status, 409);
        assert.equal(refused.error!.waiting![0]!.destination, "b");
        assert.equal(await version(), 5, "refused, nothing changed");
        const deleted = await api.DELETE("/api/v1/destinations/{name}", {
          params: { path: { name: "b" }, query: { cancelWaiting: true } },
        });
        const deletedAt = Date.now();
        assert.equal(deleted.data?.version, 6);
        assert.equal(deleted.data?.changes[0], "- destination b");
        assert.match(deleted.data!.changes[1]!, /^- transform code:[0-9a-f]{12}$/);
        // b answers each forward 2 s after it came: one that came less than that before the commit was in flight.
        assert.ok(
          dest.got.some((g) => g.to === "b" && last.includes(g.id) && g.at > deletedAt - 2_000),
          "a forward to b was in flight when the delete committed",
        );
        await takenUp(6);
        await until("nothing of b's in flight", async () =>
          (await waitingFor("b", last)).every((r) => r.status !== "processing"),
        );
        assert.deepEqual(
          dest.got.filter((g) => g.to === "b" && g.at > deletedAt),
          [],
          "nothing sent to b after its delete committed",
        );
        // Rows a lane had claimed ahead and gave back after the delete wait, shown; applying the version in force
        // again with cancelWaiting lets them go too.
        const read6 = await api.GET("/api/v1/config");
        const letGo = await api.PUT("/api/v1/config", {
          body: { document: read6.data!.document!, expectedVersion: 6, cancelWaiting: true },
        });
        assert.equal(letGo.response.status, 200, JSON.stringify(letGo.error));
        for (const row of await waitingFor("b", last)) {
          const sent = sentTo("b", row.id as string).length;
          if (sent === 1)
            assert.equal(row.status, "done", `${row.id} was sent, and its done mark kept (no lease lost)`);
          else {
            assert.equal(sent, 0, `${row.id} sent once at most`);
            assert.equal(row.status, "failed", `${row.id} was not sent: cancelled, as asked`);
            assert.match(String(row.error), /cancelled: destination b removed by configuration version [67]/);
          }
        }
        const rowsB = await waitingFor("b", last);
        assert.ok(
          rowsB.some((r) => r.status === "done") && rowsB.some((r) => r.status === "failed"),
          "some went, some were cancelled",
        );
        const [after] = await post(1, true);
        await until("after forwarded to a", () => sentTo("a", after!).length === 1);

        // Every forward to b was signed by the inbox, and none was sent twice.
        for (const g of dest.got.filter((x) => x.to === "b"))
          verifier.verify(g.body, g.headers as Record<string, string>);
        const ids = dest.got.filter((x) => x.to === "b").map((x) => x.id);
        assert.equal(new Set(ids).size, ids.length, "no forward to b sent twice");
      } finally {
        const codes = await Promise.all([receiver.stop(), ...workers.map((w) => w.stop())]);
        admin.child.kill("SIGTERM");
        await inbox.close();
        dest.server.close();
        for (const w of workers) {
          assert.match(w.log(), /forwarded \d+, \d+ to retry, \d+ set aside, \d+ held, 0 lost to other workers/);
          assert.doesNotMatch(w.log(), /lease was lost/);
        }
        assert.deepEqual(codes, [0, 0, 0]);
        dir.cleanup();
        await cleanup();
      }
    });
  });
}

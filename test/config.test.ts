// test/config.test.ts: `inbox.ts config apply` and `config dump` as an operator runs them, on SQLite and
// PostgreSQL: the round trip (dump, apply, dump gives the same bytes and no new version), a dry run that
// changes nothing, a file that fails validation refused whole, secrets kept as env:NAME, a removal refused
// while rows wait, and the scripts started without --sources serving what the database holds (or the
// default source on an inbox with none), a worker refusing a transform that is not the one applied.
//   npx node --import tsx --test test/config.test.ts

import assert from "node:assert/strict";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";
import { connect } from "../inbox.ts";
import { watchConfig } from "../lib/config/watch.ts";
import { sign } from "../lib/providers.ts";
import { FakeClock } from "./clock.ts";
import { signalChild } from "../lib/runtime.ts";
import { backends, type ReceiverProcess, runScript, spawnScript, startReceiver, tempDir, until } from "./helpers.ts";

const DEST_SECRET = `whsec_${Buffer.from("the destinations' secret").toString("base64")}`;
const SOURCE_SECRET = `whsec_${Buffer.from("the provider's secret").toString("base64")}`;
const ENV = { DEST_SECRET, SOURCE_SECRET };

for (const backend of await backends("config_cli")) {
  describe(`inbox.ts config, on ${backend.name}`, { skip: backend.skip }, () => {
    it("apply and dump round-trip byte for byte; a dry run and a bad file change nothing; secrets stay references", async () => {
      const { target: db, cleanup } = await backend.make();
      const dir = tempDir();
      try {
        const cli = (...args: string[]) => runScript("inbox.ts", [...args, "--db", db], ENV);
        // An inbox the scripts made, with no configuration yet.
        assert.equal((await runScript("worker.ts", ["--db", db, "--once"], ENV)).code, 0);
        const none = await cli("config", "dump");
        assert.equal(none.code, 1);
        assert.match(none.stderr, /No configuration in this inbox: the scripts serve the default source/);

        const file = join(dir.dir, "sources.json");
        const text = `{
  "st": { "provider": "standard", "secret": "env:SOURCE_SECRET", "routes": ["handler", { "to": "app", "types": ["invoice.*"] }] },
  "$destinations": { "app": { "url": "http://127.0.0.1:1/hooks", "secret": "env:DEST_SECRET", "maxInFlight": 4 } }
}
`;
        writeFileSync(file, text);
        const dry = await cli("config", "apply", file, "--dry-run");
        assert.equal(dry.code, 0, dry.stderr);
        assert.equal(dry.stdout, "Would change none (the default source):\n  + source st\n  + destination app\n");
        assert.equal((await cli("config", "dump")).code, 1, "a dry run applied nothing");

        const applied = await cli("config", "apply", file, "--actor", "ann");
        assert.equal(applied.code, 0, applied.stderr);
        assert.match(applied.stdout, /^Applied version 1 \(was none \(the default source\)\):/);
        const dumped = await cli("config", "dump");
        assert.equal(dumped.stdout, text, "dump gives back the file as applied");
        const out = join(dir.dir, "dumped.json");
        assert.equal((await cli("config", "dump", "--out", out)).code, 0);
        const again = await cli("config", "apply", out);
        assert.equal(again.code, 0, again.stderr);
        assert.equal(again.stdout, "No change from version 1.\n");
        // Keys in another order are no change either; the version stays.
        const parsed = JSON.parse(text) as Record<string, unknown>;
        writeFileSync(out, JSON.stringify(Object.fromEntries(Object.entries(parsed).reverse())));
        assert.equal((await cli("config", "apply", out)).stdout, "No change from version 1.\n");
        const info = JSON.parse((await cli("config", "dump", "--json")).stdout) as { version: number; actor: string };
        assert.deepEqual([info.version, info.actor], [1, "ann"]);

        // The secrets are stored as the references the file names, never their values.
        const inbox = await connect(db);
        try {
          const stored = await inbox.readConfig();
          assert.ok(stored?.document.includes("env:DEST_SECRET"));
          const all = JSON.stringify(await inbox.query("SELECT * FROM inbox_config"));
          assert.ok(!all.includes(DEST_SECRET) && !all.includes(SOURCE_SECRET), "no secret's value is stored");
        } finally {
          await inbox.close();
        }

        // A file that fails validation is refused whole: exit 2, one line, nothing changed.
        for (const [bad, why] of [
          [text.replace('"to": "app"', '"to": "nowhere"'), /route #2: expected "to" to name a destination/],
          [text.replace("env:DEST_SECRET", "not-a-whsec"), /destination "app": secret is not a whsec_ secret/],
          [text.slice(0, 40), /not valid JSON/],
          ["", /is empty/],
        ] as const) {
          writeFileSync(file, bad);
          const r = await cli("config", "apply", file);
          assert.equal(r.code, 2, r.stderr);
          assert.match(r.stderr, why);
          assert.match(r.stderr, /nothing changed/);
          assert.equal(r.stderr.trim().split("\n").length, 1, r.stderr);
        }
        assert.equal((await cli("config", "dump")).stdout, text, "the configuration in force stays");
        // An env:NAME that is not set where apply runs is a mistake too, quoted by name only.
        writeFileSync(file, text);
        const unset = await runScript("inbox.ts", ["config", "apply", file, "--db", db], { SOURCE_SECRET: "" });
        assert.equal(unset.code, 2);
        assert.match(unset.stderr, /SOURCE_SECRET/);
      } finally {
        dir.cleanup();
        await cleanup();
      }
    });

    it("watchConfig() hears of each version another process applies, on the clock's timer (a fake one here), once each", async () => {
      const { target: db, cleanup } = await backend.make();
      const clock = new FakeClock();
      // Two inboxes, as two processes: one applies, the other watches. listen off: the timer alone is tested.
      const watcher = await connect(db, { listen: false });
      const writer = await connect(db);
      try {
        const seen: number[] = [];
        const errors: string[] = [];
        const stop = watchConfig(watcher, {
          clock,
          version: 0,
          everyMs: 1_000,
          onChange: (c) => void seen.push(c.version),
          onError: (why) => void errors.push(why),
        });
        await clock.advance(3_000);
        assert.deepEqual(seen, [], "control: nothing applied, nothing heard");
        await writer.applyConfig('{"s": {"provider": "plain"}}', { actor: "t" });
        assert.deepEqual(seen, [], "not before the timer fires");
        await clock.advance(1_000);
        // The check the timer fired reads the database for real: wait for its answer, bounded, not a guess.
        await until("version 1 heard", () => seen.length >= 1);
        assert.deepEqual(seen, [1]);
        await writer.applyConfig('{"s": {"provider": "plain"}, "t": {"provider": "plain"}}', { actor: "t" });
        await writer.applyConfig('{"t": {"provider": "plain"}}', { actor: "t" });
        await clock.advance(5_000);
        await until("version 3 heard", () => seen.length >= 2);
        assert.deepEqual(seen, [1, 3], "two versions between two checks: the newest, once");
        stop();
        await writer.applyConfig('{"u": {"provider": "plain"}}', { actor: "t" });
        await clock.advance(5_000);
        assert.deepEqual(seen, [1, 3], "stopped, it hears nothing more");
        assert.deepEqual(errors, []);
      } finally {
        await watcher.close();
        await writer.close();
        await cleanup();
      }
    });

    it("on PostgreSQL, the commit's NOTIFY wakes a watcher at once, its timer never firing", {
      skip: backend.name === "postgres" ? false : "PostgreSQL's LISTEN/NOTIFY; SQLite has only the timer",
    }, async () => {
      const { target: db, cleanup } = await backend.make();
      const clock = new FakeClock();
      const watcher = await connect(db);
      const writer = await connect(db);
      try {
        const seen: number[] = [];
        const stop = watchConfig(watcher, {
          clock,
          version: 0,
          onChange: (c) => void seen.push(c.version),
          onError: () => {},
        });
        // The LISTEN connection is on its way: a store's wake-up ('' payload) is not a configuration.
        await new Promise((resolve) => setTimeout(resolve, 500));
        await writer.store({ id: "evt_1", body: Buffer.from("{}") });
        await writer.applyConfig('{"s": {"provider": "plain"}}', { actor: "t" });
        const end = Date.now() + 10_000;
        while (seen.length === 0 && Date.now() < end) await new Promise((resolve) => setTimeout(resolve, 20));
        assert.deepEqual(seen, [1]);
        assert.equal(clock.now(), 0, "the fake clock never moved: the NOTIFY woke it");
        stop();
      } finally {
        await watcher.close();
        await writer.close();
        await cleanup();
      }
    });

    it("worker.ts applies its --sources file at start and again at SIGHUP; a missing or half-written file changes nothing", async () => {
      const { target: db, cleanup } = await backend.make();
      const dir = tempDir();
      const file = join(dir.dir, "sources.json");
      const doc = (names: string[]) =>
        JSON.stringify({
          st: { provider: "standard", secret: "env:SOURCE_SECRET", routes: names },
          $destinations: Object.fromEntries(
            names.map((d) => [d, { url: "http://127.0.0.1:1/", secret: "env:DEST_SECRET" }]),
          ),
        });
      writeFileSync(file, doc(["app"]));
      const worker = spawnScript("worker.ts", ["--db", db, "--sources", file], ENV);
      let log = "";
      worker.stderr!.on("data", (d) => (log += d));
      const exited = new Promise((resolve) => worker.on("exit", resolve));
      const until = async (re: RegExp) => {
        const end = Date.now() + 20_000;
        while (!re.test(log) && Date.now() < end) await new Promise((resolve) => setTimeout(resolve, 25));
        assert.match(log, re);
      };
      try {
        await until(/sources\.json applied as configuration version 1/);
        // Give it time to set its handlers up: the version it runs is read after the apply.
        await new Promise((resolve) => setTimeout(resolve, 500));
        writeFileSync(file, doc(["app", "crm"]).slice(0, 50));
        signalChild(worker, "SIGHUP");
        await until(/SIGHUP: .*sources\.json: not valid JSON( at position \d+)?; nothing changed/);
        rmSync(file);
        signalChild(worker, "SIGHUP");
        await until(/SIGHUP: .*cannot read .*sources\.json.*; nothing changed/);
        const inbox = await connect(db);
        try {
          assert.equal(await inbox.configVersion(), 1, "nothing changed");
          // Control: a whole file at SIGHUP is applied, and the worker runs it.
          writeFileSync(file, doc(["app", "crm"]));
          signalChild(worker, "SIGHUP");
          await until(/SIGHUP: .*applied as configuration version 2: ~ source st, \+ destination crm/);
          await until(/worker: now running configuration version 2/);
          assert.equal(await inbox.configVersion(), 2);
        } finally {
          await inbox.close();
        }
      } finally {
        signalChild(worker, "SIGTERM");
        await exited;
        dir.cleanup();
        await cleanup();
      }
    });

    it("refuses to remove a destination while rows wait for it, unless --cancel-waiting", async () => {
      const { target: db, cleanup } = await backend.make();
      const dir = tempDir();
      let onEnd = async (): Promise<unknown> => undefined;
      try {
        const cli = (...args: string[]) => runScript("inbox.ts", [...args, "--db", db], ENV);
        const file = join(dir.dir, "sources.json");
        const doc = (destinations: string[]) =>
          JSON.stringify({
            st: { provider: "standard", secret: "env:SOURCE_SECRET", routes: destinations },
            $destinations: Object.fromEntries(
              destinations.map((d) => [d, { url: "http://127.0.0.1:1/", secret: "env:DEST_SECRET" }]),
            ),
          });
        writeFileSync(file, doc(["app", "crm"]));
        // The receiver applies its --sources file at start, and stores into what the database holds.
        const receiver = await startReceiver(db, ["--sources", file], ENV);
        onEnd = () => receiver.stop();
        for (const id of ["evt_1", "evt_2"]) {
          const body = JSON.stringify({ id });
          const r = await fetch(`${receiver.url}/st`, {
            method: "POST",
            headers: { ...sign("standard", SOURCE_SECRET, { id, body, timestampS: Math.floor(Date.now() / 1000) }) },
            body,
          });
          assert.equal(r.status, 200);
        }
        await receiver.stop();
        writeFileSync(file, doc(["app"]));
        const dry = await cli("config", "apply", file, "--dry-run");
        assert.match(dry.stdout, /- destination crm\n {2}2 deliveries wait for crm/);
        const refused = await cli("config", "apply", file);
        assert.equal(refused.code, 1);
        assert.match(
          refused.stderr,
          /deliveries still wait for a destination this removes \(2 for crm\); nothing changed/,
        );
        assert.match((await cli("config", "dump")).stdout, /"crm"/, "nothing changed");
        // Control: a removal nothing waits for goes through.
        writeFileSync(file, doc(["crm"]));
        const crmOnly = await cli("config", "apply", file, "--cancel-waiting");
        assert.equal(crmOnly.code, 0, crmOnly.stderr);
        assert.match(crmOnly.stdout, /- destination app\n {2}2 waiting deliveries set aside as failed/);
        const status = await cli("status");
        assert.match(status.stdout, /^failed {5}2$/m);
        assert.doesNotMatch(status.stdout, /waiting for a removed destination/);
      } finally {
        await onEnd();
        dir.cleanup();
        await cleanup();
      }
    });

    it("a worker without --handler refuses a configuration in the database whose source goes to the handler, as it refuses such a file", async () => {
      const { target: db, cleanup } = await backend.make();
      const dir = tempDir();
      try {
        const file = join(dir.dir, "sources.json");
        writeFileSync(file, JSON.stringify({ st: { provider: "standard", secret: "env:SOURCE_SECRET" } }));
        // An inbox the scripts made (as inbox.ts init would), with no configuration yet.
        assert.equal((await runScript("worker.ts", ["--db", db, "--once"], ENV)).code, 0);
        const applied = await runScript("inbox.ts", ["config", "apply", file, "--db", db], ENV);
        assert.equal(applied.code, 0, applied.stderr);
        const refused = await runScript("worker.ts", ["--db", db, "--once"], ENV);
        assert.equal(refused.code, 2);
        assert.match(
          refused.stderr,
          /source "st" has no routes, so its deliveries go to the handler, and no --handler is given/,
        );
        // The control: the same configuration with a handler named runs.
        const handler = join(dir.dir, "handler.mjs");
        writeFileSync(handler, "export default () => {};\n");
        const handled = await runScript("worker.ts", ["--db", db, "--once", "--handler", handler], ENV);
        assert.equal(handled.code, 0, handled.stderr);
      } finally {
        dir.cleanup();
        await cleanup();
      }
    });

    it("scripts started without --sources serve the database's configuration, or the default source on an inbox with none", async () => {
      const { target: db, cleanup } = await backend.make();
      const dir = tempDir();
      let receiver: ReceiverProcess | undefined;
      try {
        receiver = await startReceiver(db, [], ENV);
        const unsigned = await fetch(`${receiver.url}/`, {
          method: "POST",
          headers: { "x-delivery-id": "evt_plain" },
          body: "{}",
        });
        assert.equal(unsigned.status, 200, "no configuration: the article's default source at /");
        await receiver.stop();
        const file = join(dir.dir, "sources.json");
        const transform = join(dir.dir, "t.mjs");
        writeFileSync(transform, "export default () => null;\n");
        writeFileSync(
          file,
          JSON.stringify({
            // Routes that name the handler: a signed source with none, and no --handler, stops the worker.
            st: { provider: "standard", secret: "env:SOURCE_SECRET", routes: ["handler", "app"] },
            $destinations: { app: { url: "http://127.0.0.1:1/", secret: "env:DEST_SECRET", transform } },
          }),
        );
        const applied = await runScript("inbox.ts", ["config", "apply", file, "--db", db], ENV);
        assert.equal(applied.code, 0, applied.stderr);
        receiver = await startReceiver(db, [], ENV);
        assert.equal((await fetch(`${receiver.url}/st`, { method: "POST", body: "{}" })).status, 401, "st is signed");
        assert.equal(
          (await fetch(`${receiver.url}/`, { method: "POST", body: "{}" })).status,
          404,
          "no default source",
        );
        await receiver.stop();
        assert.equal((await runScript("worker.ts", ["--db", db, "--once", "--handler", "demo"], ENV)).code, 0);
        // A host whose copy of the transform is not the one applied refuses to start, saying which.
        writeFileSync(transform, "export default (d) => ({ body: d.id });\n");
        const drifted = await runScript("worker.ts", ["--db", db, "--once", "--handler", "demo"], ENV);
        assert.equal(drifted.code, 2);
        assert.match(drifted.stderr, /transform .*t\.mjs here \(sha256 [0-9a-f]{12}\) is not the one applied/);
        assert.equal(readFileSync(transform, "utf8").includes("d.id"), true);
      } finally {
        await receiver?.stop();
        dir.cleanup();
        await cleanup();
      }
    });
  });
}

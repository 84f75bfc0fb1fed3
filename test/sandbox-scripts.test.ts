// test/sandbox-scripts.test.ts: transforms held in the configuration as code run in the sandbox of a real
// worker.ts (issue 48), on SQLite and on PostgreSQL. Through a real receiver and real destinations: the issue's
// probes as the transform's code reach no file, variable, connection, process or timer; a loop is stopped at
// its time limit while the other destination's forwards go on; a memory bomb is stopped at its memory limit
// (the worker's RSS read from /proc); the worker's PID never changes. The control is the same probe as an
// operator's module file, in a child process, which does reach the host. Hookdeck-style code runs unchanged.
//   NODE_COMPILE_CACHE=node_modules/.cache/node-compile npx node --test test/sandbox-scripts.test.ts

import assert from "node:assert/strict";
import { once } from "node:events";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";
import { connect } from "../inbox.ts";
import type { Delivery } from "../lib/store.ts";
import {
  backends,
  destinationServer,
  runScript,
  spawnScript,
  startAdmin,
  startReceiver,
  tempDir,
  until,
} from "./helpers.ts";

const SECRET = `whsec_${Buffer.from("the sandbox test's secret").toString("base64")}`;

// The probe, chosen by the body's "probe": what the host gives away, a loop, a memory bomb, or an answer.
const PROBE = `
export default async (d) => {
  const probe = d.json && d.json.probe;
  if (probe === "loop") for (;;) {}
  if (probe === "bomb") { const held = []; for (;;) held.push(new ArrayBuffer(1 << 20)); }
  if (probe === "reach") {
    const seen = [];
    try { const fs = await import("node:fs"); seen.push("file:" + fs.readFileSync("/etc/hostname", "utf8").length); } catch { seen.push("file:none"); }
    seen.push("env:" + (typeof process === "object" && process.env ? Object.keys(process.env).length : "none"));
    seen.push("net:" + (typeof fetch === "function" ? "yes" : "none"));
    try { const cp = await import("node:child_process"); seen.push("spawn:" + typeof cp.spawn); } catch { seen.push("spawn:none"); }
    seen.push("kill:" + (typeof process === "object" && typeof process.kill === "function" ? "yes" : "none"));
    seen.push("timer:" + (typeof setTimeout === "function" ? "yes" : "none"));
    return { body: seen.join(" ") };
  }
  return { body: { ok: d.id } };
};
`;

const HEADER = `addHandler('transform', (request, context) => {
  request.headers['example-header'] = 'Hello World';
  return request;
});`;
const TYPE = `addHandler("transform", (request, context) => { request.headers["x-event-type"] = request.body.type; return request; });`;

const rssMb = (pid: number) => Number(/VmRSS:\s*(\d+)/.exec(readFileSync(`/proc/${pid}/status`, "latin1"))![1]) / 1024;

for (const backend of await backends("sandbox_scripts")) {
  describe(`transforms as code in a real worker's sandbox, on ${backend.name}`, { skip: backend.skip }, () => {
    it("reach nothing of the host, stop at their limits while the other destination forwards, and leave the worker as it was", async () => {
      const { target, cleanup } = await backend.make();
      const dir = tempDir();
      const dest = await destinationServer();
      writeFileSync(join(dir.dir, "probe.mjs"), PROBE);
      const file = join(dir.dir, "sources.json");
      writeFileSync(
        file,
        JSON.stringify({
          $destinations: {
            app: { url: `${dest.url}/app`, secret: SECRET, transform: { code: PROBE }, transformTimeout: 5 },
            other: { url: `${dest.url}/other`, secret: SECRET },
            // Room for the bomb to reach its memory limit before its time limit, on a busy machine.
            heavy: { url: `${dest.url}/heavy`, secret: SECRET, transform: { code: PROBE }, transformTimeout: 60 },
            // The control: the same probe as the operator's module file, run in a child process.
            control: {
              url: `${dest.url}/control`,
              secret: SECRET,
              transform: { module: "./probe.mjs", process: true },
            },
            header: { url: `${dest.url}/header`, secret: SECRET, transform: { code: HEADER } },
            type: { url: `${dest.url}/type`, secret: SECRET, transform: { code: TYPE } },
          },
          shop: { provider: "plain", routes: ["app", "other", "header", "type"] },
          ctl: { provider: "plain", routes: ["control"] },
          big: { provider: "plain", routes: ["heavy"] },
        }),
      );
      const receiver = await startReceiver(target, ["--sources", file]);
      const post = async (source: string, id: string, body: unknown) => {
        const r = await fetch(`${receiver.url}/${source}`, {
          method: "POST",
          headers: { "x-delivery-id": id, "content-type": "application/json" },
          body: JSON.stringify(body),
        });
        assert.equal(r.status, 200, await r.text());
      };
      await post("shop", "1-loop", { probe: "loop", type: "order.paid" });
      await post("shop", "2-reach", { probe: "reach", type: "order.paid" });
      await post("big", "3-bomb", { probe: "bomb" });
      for (const n of [3, 4, 5, 6]) await post("shop", `${n}-ok`, { type: "order.paid", n });
      await post("ctl", "c-reach", { probe: "reach" });
      await receiver.stop();

      const worker = spawnScript("worker.ts", ["--sources", file, "--db", target, "--max-attempts", "1"]);
      let log = "";
      worker.stderr!.on("data", (d) => (log += d));
      worker.stdout!.on("data", (d) => (log += d));
      const pid = worker.pid!;
      const inbox = await connect(target);
      try {
        const rows = async () => (await inbox.list({ limit: 100 })) as Delivery[];
        const row = async (id: string, to: string) => (await rows()).find((r) => r.id === id && r.destination === to)!;
        // The other destination gets all six while the loop is still running: a loop holds one sandbox thread, not the worker.
        await until("other got all six", () => dest.got.filter((g) => g.to === "other").length === 6, 60_000);
        assert.equal((await row("1-loop", "app")).status, "processing", "the loop was still running then");
        let peak = 0;
        await until(
          "every row settled",
          async () => {
            peak = Math.max(peak, rssMb(pid));
            const all = await rows();
            return all.length === 26 && all.every((r) => r.status === "done" || r.status === "failed");
          },
          120_000,
        );
        console.log(`# ${backend.name}: the worker's RSS peaked at ${Math.round(peak)} MB (the bomb's limit is 64 MB)`);
        assert.equal(worker.exitCode, null, `the worker still runs: ${log.slice(-2000)}`);
        process.kill(pid, 0);
        assert.equal(worker.pid, pid);
        assert.match(
          (await row("1-loop", "app")).error ?? "",
          /^transform code:[0-9a-f]{12} ran past its 5000 ms limit/,
        );
        assert.match(
          (await row("3-bomb", "heavy")).error ?? "",
          /^transform code:[0-9a-f]{12} ran out of memory: past its 64 MB limit/,
        );
        assert.ok(peak < 400, `the worker's RSS stayed under 400 MB: ${peak}`);
        const body = (to: string, id: string) => dest.got.find((g) => g.to === to && g.id === id)?.body;
        assert.equal(body("app", "2-reach"), "file:none env:none net:none spawn:none kill:none timer:none");
        assert.match(body("control", "c-reach") ?? "", /^file:\d+ env:\d+ net:yes spawn:function kill:yes timer:yes$/);
        for (const n of [3, 4, 5, 6]) assert.deepEqual(JSON.parse(body("app", `${n}-ok`)!), { ok: `${n}-ok` });
        // Hookdeck's two examples, as its docs print them: the header added, the body sent byte for byte.
        const header = dest.got.find((g) => g.to === "header" && g.id === "4-ok")!;
        assert.equal(header.headers["example-header"], "Hello World");
        assert.equal(header.body, JSON.stringify({ type: "order.paid", n: 4 }));
        const type = dest.got.find((g) => g.to === "type" && g.id === "5-ok")!;
        assert.equal(type.headers["x-event-type"], "order.paid");

        // A read key's previews run the loop in the page's sandbox, two at once: the third is answered 503
        // with Retry-After, and spends nothing; the two that ran fail at the loop's limit, as the worker's did.
        const made = await runScript("inbox.ts", ["keys", "create", "--scope", "read", "--json", "--db", target]);
        assert.equal(made.code, 0, made.stderr);
        const key = (JSON.parse(made.stdout) as { key: string }).key;
        const admin = await startAdmin(["--db", target, "--sources", file]);
        try {
          const previews = await Promise.all(
            [1, 2, 3].map(() =>
              fetch(`${admin.url}/api/v1/deliveries/shop/1-loop/preview?to=app`, {
                headers: { authorization: `Bearer ${key}` },
              }).then(async (r) => ({ status: r.status, retry: r.headers.get("retry-after"), body: await r.text() })),
            ),
          );
          const statuses = previews.map((p) => p.status).sort();
          assert.deepEqual(statuses, [200, 200, 503], JSON.stringify(previews));
          assert.equal(previews.find((p) => p.status === 503)!.retry, "1");
          for (const p of previews.filter((p) => p.status === 200))
            assert.match(p.body, /ran past its 5000 ms limit, so it was stopped/);
          // The control: one at a time, none is refused.
          const alone = await fetch(`${admin.url}/api/v1/deliveries/shop/2-reach/preview?to=app`, {
            headers: { authorization: `Bearer ${key}` },
          });
          assert.equal(alone.status, 200);
        } finally {
          admin.child.kill("SIGTERM");
          await once(admin.child, "exit");
        }
      } finally {
        worker.kill("SIGTERM");
        await once(worker, "exit");
        await inbox.close();
        dest.server.close();
        await cleanup();
        dir.cleanup();
      }
    });
  });
}

// test/preview.test.ts: `inbox.ts preview` agrees with routing (issue 37): for header, path and body filters,
// the routes preview shows, the rows the real receiver (a receiver.ts child) stored, and the requests worker.ts
// then really sends to HTTP destinations on a free port are the same, headers included; and the try number
// preview and the operator page show for a done delivery is the one its replay sends. On SQLite and PostgreSQL.

import assert from "node:assert/strict";
import { readFileSync, writeFileSync } from "node:fs";
import { createServer, type IncomingHttpHeaders, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { describe, it } from "node:test";
import { createAdmin, listenAdmin } from "../admin.ts";
import { connect } from "../inbox.ts";
import { preview as previewOf } from "../lib/forwarding/preview.ts";
import { backends, runScript, startReceiver, tempDir } from "./helpers.ts";

const SECRET = `whsec_${Buffer.from("the apps' forwarding secret").toString("base64")}`;

interface Got {
  destination: string;
  headers: IncomingHttpHeaders;
  body: string;
}

// destinations starts one HTTP server that takes every forward, noting which destination (its path) got what.
async function destinations(): Promise<{ url: string; got: Got[]; server: Server }> {
  const got: Got[] = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      got.push({ destination: req.url!.slice(1), headers: req.headers, body: Buffer.concat(chunks).toString() });
      res.end("ok");
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, got, server };
}

interface Seen {
  routes: { to: string; chosen: boolean; stored: boolean; why?: string }[];
  requests: { destination: string; headers: Record<string, string>; body: string }[];
  notes: string[];
}

for (const backend of await backends("preview")) {
  describe(`preview agrees with the receiver and the forwards, on ${backend.name}`, { skip: backend.skip }, () => {
    it("header, path and body filters: preview's routes and requests, the stored rows and the real forwards agree", async () => {
      const dir = tempDir();
      const { target, cleanup } = await backend.make();
      const dest = await destinations();
      try {
        const file = join(dir.dir, "sources.json");
        const to = (name: string) => ({ url: `${dest.url}/${name}`, secret: SECRET });
        writeFileSync(
          file,
          JSON.stringify({
            // by-header does not forward headers: the filter alone must keep them.
            $destinations: { "by-header": to("by-header"), "by-path": to("by-path"), "by-body": to("by-body") },
            shop: {
              provider: "plain",
              routes: [
                { to: "by-header", filter: { headers: { "X-Shop-Topic": "orders/create" } } },
                { to: "by-path", filter: { path: "/shop" } },
                { to: "by-body", filter: { body: { order: { total: { $gte: 100 } } } } },
              ],
            },
          }),
        );
        const receiver = await startReceiver(target, ["--sources", file, "--quiet"]);
        const send = async (id: string, topic: string, total: number) => {
          const r = await fetch(`${receiver.url}/shop`, {
            method: "POST",
            headers: { "x-delivery-id": id, "x-shop-topic": topic, "content-type": "application/json" },
            body: JSON.stringify({ order: { id, total } }),
          });
          assert.equal(r.status, 200, await r.text());
        };
        await send("o1", "orders/create", 250); // all three
        await send("o2", "orders/paid", 20); // by-path only
        await send("o3", "orders/create", 5); // by-header and by-path
        await receiver.stop();

        const expected: Record<string, string[]> = {
          o1: ["by-body", "by-header", "by-path"],
          o2: ["by-path"],
          o3: ["by-header", "by-path"],
        };
        const preview = async (id: string): Promise<Seen> => {
          const r = await runScript("inbox.ts", ["preview", id, "--sources", file, "--db", target, "--json"]);
          assert.equal(r.code, 0, r.stderr);
          return JSON.parse(r.stdout) as Seen;
        };
        const before: Record<string, Seen> = {};
        const inbox = await connect(target);
        try {
          for (const [id, want] of Object.entries(expected)) {
            const rows = (await inbox.find(id)).map((d) => d.destination).sort();
            assert.deepEqual(rows, want, `${id}: the stored rows`);
            const seen = await preview(id);
            before[id] = seen;
            assert.deepEqual(
              seen.routes
                .filter((r) => r.chosen)
                .map((r) => r.to)
                .sort(),
              want,
              `${id}: the routes preview shows chosen (notes: ${seen.notes.join("; ")})`,
            );
            assert.ok(
              seen.routes.every((r) => r.chosen === r.stored),
              `${id}: chosen now as when stored`,
            );
            assert.deepEqual(seen.requests.map((r) => r.destination).sort(), want, `${id}: the requests preview shows`);
          }
        } finally {
          await inbox.close();
        }

        const w = await runScript("worker.ts", ["--sources", file, "--db", target, "--once"]);
        assert.equal(w.code, 0, w.stderr);
        // The real forwards: exactly the requests preview showed, each header as shown, but for the
        // signature and its timestamp, which are made when sent.
        const made = new Set(["webhook-signature", "webhook-timestamp"]);
        const compare = (seen: Record<string, Seen>, got: Got[], what: string) => {
          const shown = Object.values(seen).flatMap((s) => s.requests);
          assert.equal(got.length, shown.length, `${what}: as many forwards as preview showed`);
          for (const r of shown) {
            const id = (JSON.parse(r.body) as { order: { id: string } }).order.id;
            const g = got.find((x) => x.destination === r.destination && x.headers["inbox-delivery-id"] === id);
            assert.ok(g, `${what}: ${id} went to ${r.destination}`);
            assert.equal(g.body, r.body, `${what}: ${id} to ${r.destination}: the body`);
            for (const [name, value] of Object.entries(r.headers))
              if (!made.has(name) && name !== "traceparent")
                assert.equal(g.headers[name], value, `${what}: ${id} to ${r.destination}: header ${name}`);
            assert.equal(g.headers["inbox-attempt"], "1");
          }
        };
        compare(before, dest.got, "the first forwards");

        // Done now: preview shows the try a replay would send, and the replay sends just that.
        const after: Record<string, Seen> = {};
        for (const id of Object.keys(expected)) after[id] = await preview(id);
        for (const s of Object.values(after))
          for (const r of s.requests) assert.equal(r.headers["inbox-attempt"], "1", `${r.destination}: a replay's try`);
        // The operator page shows the same preview: a done delivery's next try is 1 there too.
        const inboxNow = await connect(target);
        const admin = createAdmin({
          inbox: inboxNow,
          preview: (rows) => previewOf(rows, JSON.parse(readFileSync(file, "utf8")), { base: dir.dir }),
        });
        try {
          const url = await listenAdmin(admin, { host: "127.0.0.1", port: 0 });
          const page = await (await fetch(`${url}/delivery?source=shop&id=o1&preview=1`)).text();
          assert.match(page, /by-header: chosen/);
          assert.equal([...page.matchAll(/inbox-attempt: (\d+)/g)].map((m) => m[1]).join(","), "1,1,1", "the page");
        } finally {
          await new Promise((resolve) => admin.server.close(resolve));
          await inboxNow.close();
        }
        dest.got.length = 0;
        for (const id of Object.keys(expected)) {
          const r = await runScript("inbox.ts", ["replay", id, "--db", target]);
          assert.equal(r.code, 0, r.stderr);
        }
        const again = await runScript("worker.ts", ["--sources", file, "--db", target, "--once"]);
        assert.equal(again.code, 0, again.stderr);
        compare(after, dest.got, "the replays");
      } finally {
        await new Promise((resolve) => dest.server.close(resolve));
        await cleanup();
        dir.cleanup();
      }
    });

    it("without --sources, previews against the configuration in force in the database, as the page and the API do", async () => {
      const dir = tempDir();
      const { target, cleanup } = await backend.make();
      try {
        const doc = (min: number) => ({
          $destinations: { big: { url: "http://127.0.0.1:1/big", secret: SECRET } },
          shop: { provider: "plain", routes: [{ to: "big", filter: { body: { total: { $gte: min } } } }] },
        });
        const file = join(dir.dir, "sources.json");
        writeFileSync(file, JSON.stringify(doc(100)));
        const cli = (...args: string[]) => runScript("inbox.ts", [...args, "--db", target]);
        // (control) Before any configuration, there is nothing to preview against: one line, exit 1.
        assert.equal((await cli("init")).code, 0);
        const inbox = await connect(target);
        await inbox.store({ source: "shop", id: "o1", body: Buffer.from('{"total":150}'), destinations: ["big"] });
        await inbox.close();
        const none = await cli("preview", "o1");
        assert.equal(none.code, 1, none.stderr);
        assert.match(none.stderr, /^No configuration in this inbox to preview against: pass --sources FILE/);
        assert.equal((await cli("config", "apply", file)).code, 0);
        const fromFile = await cli("preview", "o1", "--sources", file, "--json");
        const inForce = await cli("preview", "o1", "--json");
        assert.equal(inForce.code, 0, inForce.stderr);
        // The same preview, but for what is made afresh each time: a trace and the signature's time.
        const steady = (text: string) =>
          text.replace(/"(traceparent|webhook-timestamp)": "[^"]*"/g, '"$1": "…"').replace(/\d{10}\./g, "…");
        assert.equal(steady(inForce.stdout), steady(fromFile.stdout));
        assert.deepEqual((JSON.parse(inForce.stdout) as Seen).routes, [{ to: "big", chosen: true, stored: true }]);
        // A version applied since (as the API would) is what preview reads next, with no file named.
        writeFileSync(file, JSON.stringify(doc(200)));
        assert.equal((await cli("config", "apply", file)).code, 0);
        const later = JSON.parse((await cli("preview", "o1", "--json")).stdout) as Seen;
        assert.deepEqual(later.routes, [{ to: "big", chosen: false, why: "its filter", stored: true }]);
      } finally {
        dir.cleanup();
        await cleanup();
      }
    });
  });
}

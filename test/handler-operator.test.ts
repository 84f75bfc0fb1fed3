// test/handler-operator.test.ts: a delivery the TypeScript handler sets aside (run(), the "handler"
// destination) is announced to the operator's URL as a signed delivery.set_aside event, like a forwarded
// one, on both backends; and worker.ts does it from the sources file's $operator. A real operator server on
// a free port, verified with the standardwebhooks library; a retried delivery is not announced.

import assert from "node:assert/strict";
import { once } from "node:events";
import { writeFileSync } from "node:fs";
import { createServer, type IncomingHttpHeaders, type Server } from "node:http";
import { join } from "node:path";
import { afterEach, beforeEach, describe, it } from "node:test";
import { Webhook } from "standardwebhooks";
import { connect } from "../inbox.ts";
import { loadDestinations } from "../lib/routing/routes.ts";
import { PermanentError, type Inbox } from "../lib/store.ts";
import { run } from "../worker.ts";
import { backends, runScript, tempDir } from "./helpers.ts";

const T0 = 1_700_000_000_000;
const OPS_SECRET = `whsec_${Buffer.from("the operator's secret").toString("base64")}`;

/** Heard is one event the operator's server was sent, verified. */
interface Heard {
  type: string;
  timestamp: string;
  data: Record<string, unknown>;
}

// operator starts a real HTTP server on a free port that verifies each event it is sent.
async function operator(): Promise<{
  url: string;
  heard: Heard[];
  raw: { headers: IncomingHttpHeaders; body: string }[];
  close: () => Promise<void>;
}> {
  const heard: Heard[] = [];
  const raw: { headers: IncomingHttpHeaders; body: string }[] = [];
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req
      .on("data", (c: Buffer) => chunks.push(c))
      .on("end", () => {
        const body = Buffer.concat(chunks).toString("utf8");
        raw.push({ headers: req.headers, body });
        heard.push(new Webhook(OPS_SECRET).verify(body, req.headers as Record<string, string>) as Heard);
        res.writeHead(204).end();
      });
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  return {
    url: `http://127.0.0.1:${(server.address() as { port: number }).port}/inbox-events`,
    heard,
    raw,
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

// waitFor polls a condition the test is waiting on (an announcement is posted after the delivery settles).
async function waitFor(ok: () => boolean): Promise<void> {
  for (let i = 0; i < 500 && !ok(); i++) await new Promise((resolve) => setTimeout(resolve, 10));
  assert.ok(ok(), "waited 5 s in vain");
}

const BACKENDS = await backends("handlerops");

for (const backend of BACKENDS) {
  describe(`the handler's deliveries set aside, on ${backend.name}`, { skip: backend.skip }, () => {
    let target: string;
    let cleanup: () => Promise<void>;
    let inbox: Inbox;
    let t: number;
    let ops: Awaited<ReturnType<typeof operator>>;
    beforeEach(async () => {
      ({ target, cleanup } = await backend.make());
      t = T0;
      inbox = await connect(target, { now: () => t, random: () => 0, maxAttempts: 2 });
      ops = await operator();
    });
    afterEach(async () => {
      await ops.close();
      await inbox.close();
      await cleanup();
    });

    it("announces each to the operator's URL, signed, with the source, ID, destination, attempts and error; a delivery retried is not announced", async () => {
      const { operator: to } = loadDestinations({ $operator: { url: ops.url, secret: OPS_SECRET } }, {});
      await inbox.store({ source: "stripe", id: "evt_bad", body: Buffer.from('{"type":"x"}') });
      await inbox.store({ source: "stripe", id: "evt_retry", body: Buffer.from('{"type":"y"}') });
      const stats = await run(
        ({ delivery }) => {
          if (delivery.id === "evt_bad") throw new PermanentError("no such customer");
          throw new Error("the bank is down");
        },
        { inbox, once: true, log: () => {}, operator: to! },
      );
      assert.deepEqual([stats.failed, stats.retried], [1, 1]);
      await waitFor(() => ops.heard.length >= 1);
      // The one left to retry is announced when its last attempt fails, and not before.
      t += 3_600_000;
      await run(
        () => {
          throw new Error("the bank is still down");
        },
        { inbox, once: true, log: () => {}, operator: to! },
      );
      await waitFor(() => ops.heard.length >= 2);
      assert.deepEqual(
        ops.heard.map((h) => [h.type, h.data]),
        [
          [
            "delivery.set_aside",
            { source: "stripe", id: "evt_bad", destination: "handler", attempts: 1, error: "no such customer" },
          ],
          [
            "delivery.set_aside",
            { source: "stripe", id: "evt_retry", destination: "handler", attempts: 2, error: "the bank is still down" },
          ],
        ],
      );
    });

    it("announces a delivery its claim set aside because the worker handling it died on the last attempt", async () => {
      const { operator: to } = loadDestinations({ $operator: { url: ops.url, secret: OPS_SECRET } }, {});
      await inbox.store({ source: "stripe", id: "evt_crash", body: Buffer.from('{"type":"x"}') });
      // Two workers took it and died with it, the second on its last attempt; the lease has run out.
      assert.equal((await inbox.claim(1_000))!.attempts, 1);
      t += 1_001;
      assert.equal((await inbox.claim(1_000))!.attempts, 2);
      t += 1_001;
      let ran = 0;
      const stats = await run(() => void ran++, { inbox, once: true, log: () => {}, operator: to! });
      assert.deepEqual([ran, stats.failed], [0, 1]);
      await waitFor(() => ops.heard.length >= 1);
      assert.deepEqual(
        ops.heard.map((h) => [h.type, { ...h.data, error: undefined }]),
        [
          [
            "delivery.set_aside",
            { source: "stripe", id: "evt_crash", destination: "handler", attempts: 2, error: undefined },
          ],
        ],
      );
      assert.match(String(ops.heard[0]!.data.error), /^gave up: the lease expired on the last attempt/);
    });
  });
}

describe("worker.ts with $operator in the sources file", () => {
  it("announces the handler's delivery set aside (a body that is not JSON) to the operator's URL", async () => {
    const dir = tempDir();
    const ops = await operator();
    try {
      const db = join(dir.dir, "inbox.db");
      const inbox = await connect(db);
      await inbox.store({ source: "shop", id: "evt_1", body: Buffer.from("not json") });
      await inbox.close();
      const file = join(dir.dir, "sources.json");
      writeFileSync(
        file,
        JSON.stringify({ $operator: { url: ops.url, secret: "env:OPS_SECRET" }, shop: { provider: "plain" } }),
      );
      const r = await runScript("worker.ts", ["--sources", file, "--db", db, "--once", "--handler", "demo"], {
        OPS_SECRET: OPS_SECRET,
      });
      assert.equal(r.code, 0, r.stderr);
      assert.equal(ops.heard.length, 1, r.stderr);
      assert.equal(ops.heard[0]!.type, "delivery.set_aside");
      assert.deepEqual(
        { ...ops.heard[0]!.data, error: undefined },
        { source: "shop", id: "evt_1", destination: "handler", attempts: 1, error: undefined },
      );
      assert.match(String(ops.heard[0]!.data.error), /^the body is not JSON/);
    } finally {
      await ops.close();
      dir.cleanup();
    }
  });
});

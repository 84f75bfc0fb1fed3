// test/transform.test.ts: transforms (lib/forwarding/transform.ts) before each forward, on both backends: real
// destination servers on free ports, transform modules written to a temp folder and run in their processes.
// JSON, bytes, strings, null and header changes; the signature over the bytes sent; throws, wrong shapes and
// a loop that never ends, each failing only its try; a replay after the module is fixed uses the new code.
// The inbox's clock is pinned, so retries come due when the test says.

import assert from "node:assert/strict";
import { createHmac } from "node:crypto";
import { once } from "node:events";
import { writeFileSync } from "node:fs";
import { createServer, type IncomingHttpHeaders } from "node:http";
import { join } from "node:path";
import { afterEach, beforeEach, describe, it } from "node:test";
import { Webhook } from "standardwebhooks";
import { connect } from "../inbox.ts";
import { brokerSender, parseBrokerDestination } from "../lib/brokers.ts";
import type { Sender } from "../lib/forwarding/forward.ts";
import { forward } from "../lib/forwarding/forwarder.ts";
import { loadDestinations, parseRoutes, type Route } from "../lib/routing/routes.ts";
import type { Inbox } from "../lib/store.ts";
import { Transformer, transformInput } from "../lib/forwarding/transform.ts";
import { jetStreamSuite } from "./brokers-suite.ts";
import { backends, NATS, natsSkip, tempDir } from "./helpers.ts";

const T0 = 1_700_000_000_000;
const natsSkipped = await natsSkip();
const jet = natsSkipped ? undefined : jetStreamSuite(NATS);
const SECRET = `whsec_${Buffer.from("the shop app's secret").toString("base64")}`;

interface Received {
  headers: IncomingHttpHeaders;
  body: Buffer;
}

async function destination(): Promise<{ url: string; got: Received[]; close: () => Promise<void> }> {
  const got: Received[] = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req
      .on("data", (c: Buffer) => chunks.push(c))
      .on("end", () => {
        got.push({ headers: req.headers, body: Buffer.concat(chunks) });
        res.writeHead(200).end();
      });
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  return {
    url: `http://127.0.0.1:${(server.address() as { port: number }).port}/hooks`,
    got,
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

// The modules the tests route through, as a user would write them.
const MODULES: Record<string, string> = {
  "shop-orders.ts": `
    interface ShopifyOrder { id: number; total_price: string; customer?: { email?: string } }
    export default (d: { json: unknown; headers: Record<string, string>; attempt: number }) => {
      const o = d.json as ShopifyOrder;
      return {
        body: { orderId: String(o.id), total: Number(o.total_price), email: o.customer?.email ?? null, shop: d.headers["x-shopify-shop-domain"] },
        headers: { "x-order-source": "shopify", "inbox-event-type": null },
      };
    };`,
  "by-id.ts": `
    export default (d: { id: string; body: Uint8Array }) =>
      d.id === "bytes" ? { body: new Uint8Array([0, 1, 2, 255]), headers: { "content-type": "application/octet-stream" } }
      : d.id === "text" ? { body: "<order id='1'/>", headers: { "content-type": "application/xml" } }
      : d.id === "skip" ? null
      : {};`,
  "throws.ts": `export default (d: { json: { id?: string } }) => { if (!d.json.id) throw new Error("no order id"); return {}; };`,
  "wrong.ts": `export default () => ({ bdy: "typo" });`,
  "loop.ts": `export default () => { for (;;) {} };`,
  "version.ts": `export default () => ({ body: "v1" });`,
};

for (const backend of await backends("transform")) {
  describe(`transforms on ${backend.name}`, { skip: backend.skip }, () => {
    let target: string;
    let cleanup: () => Promise<void>;
    let dir: { dir: string; cleanup: () => void };
    let t: number;
    let opened: Inbox[];
    let servers: { close: () => Promise<void> }[];
    const open = async (maxAttempts = 3) => {
      const inbox = await connect(target, { now: () => t, random: () => 0, maxAttempts });
      opened.push(inbox);
      return inbox;
    };
    const serve = async () => {
      const d = await destination();
      servers.push(d);
      return d;
    };
    // routesOf gives source "shop" one route per destination, each with the module and limit given.
    const routesOf = (config: Record<string, unknown>, list: unknown[]) =>
      new Map<string, readonly Route[]>([["shop", parseRoutes(list, config, 'source "shop"')]]);
    const run = (inbox: Inbox, destinations: Record<string, Record<string, unknown>>, routes: unknown[]) => {
      const config = { $destinations: destinations };
      return forward({
        inbox,
        forwarding: loadDestinations(config, {}),
        routes: routesOf(config, routes),
        transformBase: dir.dir,
        once: true,
        log: () => {},
      });
    };

    beforeEach(async () => {
      ({ target, cleanup } = await backend.make());
      dir = tempDir();
      for (const [name, text] of Object.entries(MODULES)) writeFileSync(join(dir.dir, name), text);
      t = T0;
      opened = [];
      servers = [];
    });
    afterEach(async () => {
      for (const s of servers) await s.close();
      for (const inbox of opened) await inbox.close();
      await cleanup();
      dir.cleanup();
    });

    it("sends what the transform returns, signed over the bytes sent; the stored body stays byte for byte", async () => {
      const inbox = await open();
      const app = await serve();
      const stored = Buffer.from(
        '{"id":820982911946154508,"total_price":"199.00","customer":{"email":"ann@example.com"}}',
      );
      await inbox.store({
        source: "shop",
        id: "ord_1",
        body: stored,
        contentType: "application/json",
        eventType: "orders/create",
        destinations: ["app"],
        headers: { "x-shopify-shop-domain": ["ann.myshopify.com"] },
      });
      const stats = await run(inbox, { app: { url: app.url, secret: SECRET } }, [
        { to: "app", transform: { module: "./shop-orders.ts", process: true } },
      ]);
      assert.equal(stats.done, 1);
      const [r] = app.got;
      assert.deepEqual(JSON.parse(r!.body.toString()), {
        orderId: "820982911946154500",
        total: 199,
        email: "ann@example.com",
        shop: "ann.myshopify.com",
      });
      assert.equal(r!.headers["content-type"], "application/json");
      assert.equal(r!.headers["x-order-source"], "shopify");
      assert.equal(r!.headers["inbox-event-type"], undefined, "removed by the transform");
      assert.equal(r!.headers["inbox-delivery-id"], "ord_1", "the inbox's other headers stay");
      assert.ok(new Webhook(SECRET).verify(r!.body.toString(), r!.headers as Record<string, string>));
      // The control: the same signature does not verify over the stored bytes.
      assert.throws(
        () => new Webhook(SECRET).verify(stored.toString(), r!.headers as Record<string, string>),
        /No matching signature/,
      );
      const [row] = await inbox.find("ord_1");
      assert.deepEqual(row!.body, stored);
      assert.equal(row!.status, "done");
    });

    it("sends bytes and strings as they are, with the content type the transform gives; null skips the destination, done and nothing sent", async () => {
      const inbox = await open();
      const app = await serve();
      for (const id of ["bytes", "text", "skip", "same"]) {
        await inbox.store({
          source: "shop",
          id,
          body: Buffer.from(`{"id":"${id}"}`),
          contentType: "application/json",
          destinations: ["app"],
        });
      }
      const stats = await run(inbox, { app: { url: app.url, secret: SECRET } }, [
        { to: "app", transform: { module: "./by-id.ts", process: true } },
      ]);
      assert.equal(stats.done, 4);
      const byId = new Map(app.got.map((g) => [g.headers["inbox-delivery-id"], g]));
      assert.deepEqual([...byId.keys()].sort(), ["bytes", "same", "text"]);
      assert.deepEqual(byId.get("bytes")!.body, Buffer.from([0, 1, 2, 255]));
      assert.equal(byId.get("bytes")!.headers["content-type"], "application/octet-stream");
      assert.equal(byId.get("text")!.body.toString(), "<order id='1'/>");
      assert.equal(byId.get("text")!.headers["content-type"], "application/xml");
      assert.equal(byId.get("same")!.body.toString(), '{"id":"same"}', "{} sends the delivery unchanged");
      // Checked by hand, as Standard Webhooks signs (HMAC-SHA256 of id.timestamp.body): the library reads only JSON.
      for (const g of app.got) {
        const mac = createHmac("sha256", Buffer.from(SECRET.slice(6), "base64"))
          .update(`${g.headers["webhook-id"]}.${g.headers["webhook-timestamp"]}.`)
          .update(g.body)
          .digest("base64");
        assert.equal(g.headers["webhook-signature"], `v1,${mac}`);
      }
      assert.equal((await inbox.find("skip"))[0]!.status, "done");
    });

    it("a transform that throws or returns a wrong shape fails its try with a clear error, retried, then set aside; the breaker does not count it", async () => {
      const inbox = await open(2);
      const app = await serve();
      await inbox.store({
        source: "shop",
        id: "no_id",
        body: Buffer.from("{}"),
        contentType: "application/json",
        destinations: ["thrown"],
      });
      await inbox.store({
        source: "shop",
        id: "typo",
        body: Buffer.from("{}"),
        contentType: "application/json",
        destinations: ["wrong"],
      });
      const destinations = {
        thrown: { url: app.url, secret: SECRET, breaker: { failures: 1 } },
        wrong: { url: app.url, secret: SECRET, breaker: { failures: 1 } },
      };
      const routes = [
        { to: "thrown", transform: { module: "./throws.ts", process: true } },
        { to: "wrong", transform: { module: "./wrong.ts", process: true } },
      ];
      let stats = await run(inbox, destinations, routes);
      assert.equal(stats.retried, 2);
      const [thrown] = await inbox.find("no_id");
      assert.equal(thrown!.status, "received");
      assert.match(thrown!.error!, /^transform \.\/throws\.ts threw Error: no order id \(at throws\.ts:\d+:\d+\)$/);
      assert.equal(
        (await inbox.find("typo"))[0]!.error,
        'transform ./wrong.ts returned an object with "bdy"; expected only body and headers',
      );
      const states = await inbox.destinations();
      for (const name of ["thrown", "wrong"])
        assert.equal(
          states.find((d) => d.name === name)?.state,
          "closed",
          `${name}: one failure would open it, were it counted`,
        );
      t += 60 * 60_000;
      stats = await run(inbox, destinations, routes);
      assert.equal(stats.failed, 2, "set aside after the last attempt");
      assert.equal((await inbox.find("no_id"))[0]!.status, "failed");
      assert.equal(app.got.length, 0);
    });

    it("a transform that never ends fails its try at its time limit, while the other lanes and the event loop go on", async () => {
      const inbox = await open();
      const app = await serve();
      await inbox.store({ source: "shop", id: "stuck", body: Buffer.from("{}"), destinations: ["looping"] });
      for (let i = 0; i < 5; i++)
        await inbox.store({ source: "shop", id: `free_${i}`, body: Buffer.from("{}"), destinations: ["plain"] });
      let ticks = 0;
      const ticker = setInterval(() => ticks++, 20);
      const started = performance.now();
      const stats = await run(
        inbox,
        { looping: { url: app.url, secret: SECRET }, plain: { url: app.url, secret: SECRET } },
        [{ to: "looping", transform: { module: "./loop.ts", process: true }, transformTimeout: 0.3 }, "plain"],
      );
      clearInterval(ticker);
      assert.equal(stats.done, 5);
      assert.equal(stats.retried, 1);
      assert.match(
        (await inbox.find("stuck"))[0]!.error!,
        /^transform \.\/loop\.ts ran past its 300 ms limit, so its process was stopped$/,
      );
      assert.ok(performance.now() - started >= 300);
      assert.ok(ticks >= 3, `the event loop ran its timers meanwhile (${ticks} ticks)`);
      assert.deepEqual(app.got.map((g) => g.headers["inbox-delivery-id"]).sort(), [
        "free_0",
        "free_1",
        "free_2",
        "free_3",
        "free_4",
      ]);
      // The control: the same route with a transform that ends sends it.
      writeFileSync(join(dir.dir, "loop.ts"), "export default () => ({});");
      t += 60 * 60_000;
      const again = await run(
        inbox,
        { looping: { url: app.url, secret: SECRET }, plain: { url: app.url, secret: SECRET } },
        [{ to: "looping", transform: { module: "./loop.ts", process: true }, transformTimeout: 0.3 }, "plain"],
      );
      assert.equal(again.done, 1);
    });

    it("a destination's transform reshapes what is published into JetStream too: its body and a header", {
      skip: natsSkipped,
    }, async () => {
      const inbox = await open();
      const stream = `XF_${process.pid}_${backend.name}`;
      jet!.made.push(stream);
      await jet!.jsm.streams.add({ name: stream, subjects: [`xf${process.pid}${backend.name}.>`] });
      await inbox.store({
        source: "shop",
        id: "ord_5",
        body: Buffer.from('{"id":5,"total_price":"5.00"}'),
        contentType: "application/json",
        eventType: "orders/create",
        destinations: ["events"],
        headers: {},
      });
      const settings = {
        type: "nats",
        url: NATS,
        subject: `xf${process.pid}${backend.name}.{source}`,
        stream,
        transform: { module: "./shop-orders.ts", process: true },
      };
      const forwarding = loadDestinations(
        { $destinations: { events: settings } },
        {},
        { brokerCheck: (name, x, where) => void parseBrokerDestination(name, x, where) },
      );
      const senders = new Map<string, Sender>([
        ["events", brokerSender(parseBrokerDestination("events", settings)) as Sender],
      ]);
      try {
        const stats = await forward({ inbox, forwarding, senders, transformBase: dir.dir, once: true, log: () => {} });
        assert.equal(stats.done, 1);
      } finally {
        await senders.get("events")!.close();
      }
      const m = await jet!.jsm.streams.getMessage(stream, { seq: 1 });
      assert.deepEqual(JSON.parse(new TextDecoder().decode(m!.data)), { orderId: "5", total: 5, email: null });
      assert.equal(m!.header.get("x-order-source"), "shopify");
      assert.equal(m!.header.get("inbox-event-type"), "", "removed by the transform");
      assert.equal(m!.header.get("inbox-delivery-id"), "ord_5");
    });

    it("a replay after the module is fixed sends what the new code returns", async () => {
      const inbox = await open();
      const app = await serve();
      await inbox.store({ source: "shop", id: "ord_9", body: Buffer.from("{}"), destinations: ["app"] });
      const routes = [{ to: "app", transform: { module: "./version.ts", process: true } }];
      await run(inbox, { app: { url: app.url, secret: SECRET } }, routes);
      writeFileSync(join(dir.dir, "version.ts"), `export default () => ({ body: "v2" });`);
      assert.deepEqual(await inbox.replayMatching({ source: "shop", id: "ord_9" }), { replayed: 1, tombstoned: 0 });
      await run(inbox, { app: { url: app.url, secret: SECRET } }, routes);
      assert.deepEqual(
        app.got.map((g) => g.body.toString()),
        ["v1", "v2"],
      );
    });
  });
}

describe("Transformer", () => {
  it("a module that cannot be used says why, and a fresh process loads it once it is fixed", async () => {
    const dir = tempDir();
    const file = join(dir.dir, "t.ts");
    writeFileSync(file, "export const notDefault = 1;");
    const t = new Transformer(file, "./t.ts");
    try {
      assert.equal(
        await t.load(),
        "could not be loaded: its default export is undefined; expected a function (export default (d) => …)",
      );
      const lease = {
        source: "s",
        id: "1",
        body: Buffer.from("[1,2]"),
        contentType: null,
        eventType: null,
        attempts: 1,
        headers: null,
        receivedAt: 0,
      } as never;
      await assert.rejects(t.run(transformInput(lease, "d")), /transform \.\/t\.ts could not be loaded/);
      writeFileSync(file, "export default (d: { json: number[] }) => ({ body: d.json.length });");
      assert.equal((await t.run(transformInput(lease, "d")))!.body.toString(), "2");
    } finally {
      await t.close();
      dir.cleanup();
    }
  });

  it("a process that dies while idle (process.exit in the module's own timer) is replaced, not waited on", async () => {
    const dir = tempDir();
    const file = join(dir.dir, "late.ts");
    writeFileSync(file, 'export default () => { setTimeout(() => process.exit(3), 10); return { body: "ok" }; };');
    const t = new Transformer(file, "./late.ts");
    try {
      const lease = {
        source: "s",
        id: "1",
        body: Buffer.from("{}"),
        contentType: null,
        eventType: null,
        attempts: 1,
        headers: null,
        receivedAt: 0,
      } as never;
      assert.equal((await t.run(transformInput(lease, "d"), 5_000))!.body.toString(), "ok");
      // Long enough for the late exit to end the process; the next delivery must not be sent to it.
      await new Promise((resolve) => setTimeout(resolve, 200));
      assert.equal((await t.run(transformInput(lease, "d"), 5_000))!.body.toString(), "ok");
    } finally {
      await t.close();
      dir.cleanup();
    }
  });
});

describe("Transformer: what it returns, and errors outside the call", () => {
  const lease = (id: string) =>
    ({
      source: "s",
      id,
      body: Buffer.from("{}"),
      contentType: null,
      eventType: null,
      attempts: 1,
      headers: null,
      receivedAt: 0,
    }) as never;

  it("checks header values by the HTTP client's rule: tab and Latin-1 pass; U+007F, \\x01, U+0100 and the headers undici refuses fail", async () => {
    const dir = tempDir();
    const file = join(dir.dir, "h.ts");
    writeFileSync(file, "export default (d: { id: string }) => ({ headers: JSON.parse(d.id) });");
    const t = new Transformer(file, "./h.ts");
    const run = (headers: Record<string, string>) => t.run(transformInput(lease(JSON.stringify(headers)), "d"), 5_000);
    try {
      assert.deepEqual((await run({ "x-a": "a\tb", "x-b": "Zoë ÿ" }))!.headers, { "x-a": "a\tb", "x-b": "Zoë ÿ" });
      for (const [value, char] of [
        ["a\x7f", "U+007F"],
        ["\x01", "U+0001"],
        ["\u0100", "U+0100"],
        ["😀", "U+1F600"],
      ] as const)
        await assert.rejects(
          run({ "x-a": value }),
          new RegExp(`returned header x-a with the character ${char.replace("+", "\\+")} at`),
        );
      for (const name of ["keep-alive", "upgrade", "expect", "transfer-encoding", "connection"])
        await assert.rejects(run({ [name]: "x" }), /which the inbox or the connection sets itself/, name);
      await assert.rejects(run({ "x a": "1" }), /the header name "x a", which HTTP does not allow/);
    } finally {
      await t.close();
      dir.cleanup();
    }
  });

  it("an error from a callback the call in hand set fails that call; the process goes on for the next", async () => {
    const dir = tempDir();
    const file = join(dir.dir, "cb.ts");
    writeFileSync(
      file,
      `export default (d: { id: string }) => d.id === "bad"
        ? new Promise(() => setTimeout(() => { throw new Error("inner " + d.id); }, 10))
        : { body: "ok " + process.pid };`,
    );
    const t = new Transformer(file, "./cb.ts");
    try {
      const first = (await t.run(transformInput(lease("good"), "d"), 5_000))!.body.toString();
      await assert.rejects(
        t.run(transformInput(lease("bad"), "d"), 5_000),
        /^Error: transform \.\/cb\.ts threw Error: inner bad \(at cb\.ts:\d+:\d+\) from a callback of its own$/,
      );
      assert.equal(
        (await t.run(transformInput(lease("good"), "d"), 5_000))!.body.toString(),
        first,
        "the same process",
      );
    } finally {
      await t.close();
      dir.cleanup();
    }
  });
});

describe("parseRoutes() with a transform", () => {
  it("refuses one on a route to the handler, which gets each delivery as stored, and takes one on a destination's", () => {
    const config = { $destinations: { app: { url: "http://127.0.0.1:1/hook" } } };
    assert.throws(
      () => parseRoutes([{ to: "handler", transform: "./t.ts" }], config, 'source "shop"'),
      /a transform applies to destinations/,
    );
    assert.equal(
      parseRoutes([{ to: "app", transform: "./t.ts" }], config, 'source "shop"')[0]!.transform?.module,
      "./t.ts",
    );
  });
});

// test/mounts.test.ts: the one request handler mounted the ways users mount it: receiver.ts's node:http
// server, Express (first in line, and behind express.raw), Fastify, Hono on @hono/node-server, and the
// bare Fetch handler. Each runs the providers' HTTP cases over real HTTP on a free port, against a real
// SQLite inbox, and must give the same answers: stored, duplicate, 400, 401, 404, 405, 413, 503.

import assert from "node:assert/strict";
import type { AddressInfo } from "node:net";
import { createServer, type Server } from "node:http";
import { join } from "node:path";
import { Readable } from "node:stream";
import { DatabaseSync } from "node:sqlite";
import { after, before, describe, it } from "node:test";
import { serve } from "@hono/node-server";
import express from "express";
import fastify from "fastify";
import fc from "fast-check";
import { Hono } from "hono";
import { request } from "undici";
import { connect } from "../inbox.ts";
import { createWebhooks, type WebhooksOptions } from "../lib/receiver.ts";
import { loadSources, sign, type Source } from "../lib/config/sources.ts";
import { createReceiver } from "../receiver.ts";
import { SCHEMES, SLACK, T, apply, bodyArb, idArb, mutationArb, source } from "./provider-fixtures.ts";
import { tempDir } from "./helpers.ts";

/** Mount is one way of serving the handler: it starts an app on a free port and says where the sources are. */
interface Mount {
  name: string;
  start(options: WebhooksOptions): Promise<{ base: string; close: () => Promise<void> }>;
}

const listening = async (server: Server, prefix: string) => {
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    base: `http://127.0.0.1:${(server.address() as AddressInfo).port}${prefix}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
};

const MOUNTS: Mount[] = [
  {
    name: "receiver.ts (node:http)",
    start: async (options) => {
      const receiver = createReceiver({
        ...options,
        inbox: options.inbox as Parameters<typeof createReceiver>[0]["inbox"],
      });
      return listening(receiver.server, "");
    },
  },
  {
    name: "express, mounted before any body parser",
    start: async (options) => {
      const webhooks = createWebhooks(options);
      const app = express();
      app.use("/hooks", webhooks.express);
      // The app's own JSON routes come after, untouched.
      app.use(express.json());
      app.post("/api/echo", (req, res) => void res.json(req.body));
      return listening(createServer(app), "/hooks");
    },
  },
  {
    name: "express, behind express.raw({ type: '*/*' })",
    start: async (options) => {
      // A route (unlike app.use) leaves its path in req.url, so the handler is told the prefix.
      const webhooks = createWebhooks({ ...options, basePath: "/hooks" });
      const app = express();
      app.post("/hooks/:source", express.raw({ type: "*/*", limit: "2mb" }), webhooks.express);
      app.all("/hooks/:source", webhooks.express);
      return listening(createServer(app), "/hooks");
    },
  },
  {
    name: "fastify, with the raw request handed over",
    start: async (options) => {
      const webhooks = createWebhooks({ ...options, basePath: "/hooks" });
      const app = fastify();
      await app.register(async (scope) => {
        // Leave the body unread for the handler, which verifies the bytes themselves.
        scope.removeAllContentTypeParsers();
        scope.addContentTypeParser("*", (_request, _payload, done) => done(null));
        scope.all("/hooks/*", (req, reply) => {
          reply.hijack();
          webhooks.node(req.raw, reply.raw);
        });
      });
      await app.listen({ port: 0, host: "127.0.0.1" });
      return { base: `http://127.0.0.1:${(app.server.address() as AddressInfo).port}/hooks`, close: () => app.close() };
    },
  },
  {
    name: "hono on @hono/node-server (the Fetch handler)",
    start: async (options) => {
      const webhooks = createWebhooks({ ...options, basePath: "/hooks" });
      const app = new Hono();
      app.all("/hooks/*", (c) => webhooks.fetch(c.req.raw));
      const server = await new Promise<Server>((resolve) => {
        const s = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }, () => resolve(s as Server));
      });
      return {
        base: `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks`,
        close: () =>
          new Promise<void>((resolve) => {
            server.close(() => resolve());
            server.closeAllConnections();
          }),
      };
    },
  },
];

// Every signed scheme of the fixtures, each at its own path; svix shares standard's settings.
const SOURCES = new Map<string, Source>(SCHEMES.map((s) => [s.name, { ...s.source, name: s.name }]));
SOURCES.set("open", { name: "open", provider: "plain", secrets: [], toleranceS: 0 });
SOURCES.set("slack-events", { ...source("slack", SLACK.secret), name: "slack-events" });

const dir = tempDir("mounts-");
after(() => dir.cleanup());

for (const mount of MOUNTS) {
  describe(mount.name, () => {
    const path = join(dir.dir, `${mount.name.replace(/\W+/g, "-")}.db`);
    let inbox: Awaited<ReturnType<typeof connect>>;
    let app: { base: string; close: () => Promise<void> };
    const lines: string[] = [];
    let reader: DatabaseSync;
    before(async () => {
      inbox = await connect(path);
      app = await mount.start({
        inbox,
        sources: SOURCES,
        now: () => T * 1000,
        maxBodyBytes: 64_000,
        log: (line) => lines.push(line),
      });
      reader = new DatabaseSync(path, { readOnly: true });
    });
    after(async () => {
      await app.close();
      reader.close();
      await inbox.close();
    });
    const count = (source?: string) =>
      (source === undefined
        ? reader.prepare("SELECT count(*) AS n FROM deliveries").get()
        : reader.prepare("SELECT count(*) AS n FROM deliveries WHERE source = ?").get(source)) as { n: number };
    const post = async (
      where: string,
      message: { headers: Record<string, string | string[]>; body: string | Buffer },
      method = "POST",
    ) => {
      const response = await request(app.base + where, {
        method,
        headers: message.headers,
        body: method === "GET" ? undefined : message.body,
      });
      return { status: response.statusCode, text: await response.body.text(), headers: response.headers };
    };

    for (const scheme of SCHEMES) {
      it(`${scheme.name}: 200 stored, on disk before the answer; 200 duplicate for the retry`, async () => {
        const signed = scheme.make(`${scheme.name}_1`, Buffer.from(`{"n":1}`));
        const first = await post(`/${scheme.name}${signed.query ?? ""}`, signed);
        assert.deepEqual([first.status, first.text], [200, "stored"]);
        // Read from a second connection the moment the 200 arrives: the commit came first.
        assert.equal(count(scheme.name).n, 1);
        assert.equal((await post(`/${scheme.name}${signed.query ?? ""}`, signed)).text, "duplicate");
        assert.equal(count(scheme.name).n, 1);
      });
    }

    it("property: any one changed signed byte is a 401 through this mount, for every scheme, and nothing is stored", async () => {
      const before = count().n;
      for (const scheme of SCHEMES) {
        await fc.assert(
          fc.asyncProperty(idArb, bodyArb, mutationArb, async (id, body, m) => {
            const forged = apply(scheme, scheme.make(id, body), m);
            const answer = await post(`/${scheme.name}${forged.query ?? ""}`, forged);
            assert.equal(answer.status, 401, `${scheme.name} ${JSON.stringify(m)}: ${answer.text}`);
          }),
          { numRuns: 10 },
        );
      }
      assert.equal(count().n, before);
    });

    it("400 for a repeated ID header and for a missing ID, 401 for a repeated signature", async () => {
      const github = SCHEMES.find((s) => s.name === "github")!.make("g_dup", Buffer.from("{}"));
      const twice = (name: string) => ({
        body: github.body,
        headers: { ...github.headers, [name]: [github.headers[name]!, github.headers[name]!] },
      });
      const repeatedId = await post("/github", twice("x-github-delivery"));
      assert.equal(repeatedId.status, 400, repeatedId.text);
      assert.match(repeatedId.text, /X-GitHub-Delivery sent more than once/);
      assert.equal((await post("/github", twice("x-hub-signature-256"))).status, 401);
      const { "x-github-delivery": _id, ...noId } = github.headers;
      assert.match((await post("/github", { body: github.body, headers: noId })).text, /missing X-GitHub-Delivery/);
      assert.equal(count("github").n, 1);
    });

    it("404 for a path that is not a source, 405 with Allow: POST for another method", async () => {
      assert.equal((await post("/nope", { headers: {}, body: "{}" })).status, 404);
      const get = await post("/open", { headers: {}, body: "" }, "GET");
      assert.equal(get.status, 405);
      assert.equal(get.headers.allow, "POST");
    });

    it("413 for a body over the limit, declared or streamed, and nothing stored", async () => {
      const big = Buffer.alloc(64_001, "a");
      const declared = await post("/open", { headers: { "x-delivery-id": "big" }, body: big });
      assert.equal(declared.status, 413, declared.text);
      const streamed = await request(app.base + "/open", {
        method: "POST",
        headers: { "x-delivery-id": "big2" },
        body: Readable.from(
          (function* () {
            for (let i = 0; i < 100; i++) yield Buffer.alloc(1_000, "b");
          })(),
        ),
      }).catch((error: Error) => ({ statusCode: `connection cut: ${error.message}`, body: { dump: async () => {} } }));
      // The handler may cut the connection once it has answered; either way the sender saw no 200.
      assert.ok(
        streamed.statusCode === 413 || String(streamed.statusCode).startsWith("connection cut"),
        String(streamed.statusCode),
      );
      await streamed.body.dump();
      assert.equal(count("open").n, 0);
    });

    it("503 with Retry-After when the store fails, then stored on the retry", async () => {
      const admin = new DatabaseSync(path);
      admin.exec(
        "CREATE TRIGGER refuse BEFORE INSERT ON delivery_rows BEGIN SELECT RAISE(ABORT, 'simulated: database or disk is full'); END",
      );
      try {
        const refused = await post("/open", { headers: { "x-delivery-id": "o503" }, body: "{}" });
        assert.equal(refused.status, 503);
        assert.equal(refused.headers["retry-after"], "5");
      } finally {
        admin.exec("DROP TRIGGER refuse");
        admin.close();
      }
      assert.equal((await post("/open", { headers: { "x-delivery-id": "o503" }, body: "{}" })).text, "stored");
      assert.ok(
        lines.some((l) => /^rejected open\/o503: 503 could not store: .*disk is full/.test(l)),
        lines.join("\n"),
      );
    });

    it("answers Slack's and Zoom's signed handshakes without storing them", async () => {
      const slackBody = JSON.stringify({ token: "t", challenge: "ch4ll3nge", type: "url_verification" });
      const slack = await post("/slack-events", {
        body: slackBody,
        headers: {
          "content-type": "application/json",
          ...sign("slack", SLACK.secret, { id: "", body: slackBody, timestampS: T }),
        },
      });
      assert.deepEqual([slack.status, slack.text], [200, "ch4ll3nge"]);
      const zoomBody = JSON.stringify({
        payload: { plainToken: "qgg8vlvZRS6UYooatFL8Aw" },
        event_ts: T * 1000,
        event: "endpoint.url_validation",
      });
      const zoom = await post("/zoom", {
        body: zoomBody,
        headers: {
          "content-type": "application/json",
          ...sign("zoom", "zoom-secret-token", { id: "", body: zoomBody, timestampS: T }),
        },
      });
      assert.equal(zoom.status, 200);
      assert.equal(JSON.parse(zoom.text).plainToken, "qgg8vlvZRS6UYooatFL8Aw");
      assert.equal(count("slack-events").n + count("zoom").n, count("zoom").n);
    });

    it("stores a Slack slash command (a form) under its trigger_id", async () => {
      const body = new URLSearchParams({ command: "/deploy", text: "prod", trigger_id: "tr_1" }).toString();
      const headers = {
        "content-type": "application/x-www-form-urlencoded",
        ...sign("slack", SLACK.secret, { id: "", body, timestampS: T }),
      };
      assert.equal((await post("/slack-events", { body, headers })).text, "stored");
      assert.deepEqual(
        { ...reader.prepare("SELECT id, event_type FROM deliveries WHERE source = 'slack-events'").get() },
        { id: "tr_1", event_type: "/deploy" },
      );
    });
  });
}

describe("express after a JSON body parser", () => {
  it("refuses with a 500 that says to mount it first or use express.raw, and stores nothing", async () => {
    const db = join(dir.dir, "parsed-first.db");
    const inbox = await connect(db);
    const lines: string[] = [];
    const app = express();
    app.use(express.json());
    app.use(
      "/hooks",
      createWebhooks({ inbox, sources: SOURCES, now: () => T * 1000, log: (l) => lines.push(l) }).express,
    );
    const served = await listening(createServer(app), "/hooks");
    try {
      const github = SCHEMES.find((s) => s.name === "github")!.make("g1", Buffer.from('{"a":1}'));
      const response = await request(`${served.base}/github`, {
        method: "POST",
        headers: { ...github.headers, "content-type": "application/json" },
        body: github.body,
      });
      assert.equal(response.statusCode, 500);
      assert.match(
        await response.body.text(),
        /already read by a body parser \(express\.json\(\) or similar\).*mount the inbox before the parser, or give it express\.raw/,
      );
      assert.ok(
        lines.some((l) => l.startsWith("rejected: 500 the request body was already read")),
        lines.join("\n"),
      );
      // Control: a body the JSON parser skips (not JSON) is still read raw, and verifies.
      const plain = SCHEMES.find((s) => s.name === "github")!.make("g2", Buffer.from("x=1"));
      const ok = await request(`${served.base}/github`, {
        method: "POST",
        headers: { ...plain.headers, "content-type": "text/plain" },
        body: plain.body,
      });
      assert.equal(await ok.body.text(), "stored");
    } finally {
      await served.close();
      await inbox.close();
    }
  });
});

describe("the Fetch handler on its own", () => {
  it("takes a Request and gives a Response, as Next.js route handlers, Bun and Deno call it", async () => {
    const inbox = await connect(join(dir.dir, "fetch.db"));
    try {
      const webhooks = createWebhooks({
        inbox,
        sources: SOURCES,
        basePath: "/api/webhooks",
        now: () => T * 1000,
        log: () => {},
      });
      const stripe = SCHEMES.find((s) => s.name === "stripe")!.make("evt_fetch", Buffer.from("{}"));
      const call = () =>
        webhooks.fetch(
          new Request("https://app.example/api/webhooks/stripe", {
            method: "POST",
            headers: stripe.headers,
            body: new Uint8Array(stripe.body),
          }),
        );
      const first = await call();
      assert.deepEqual([first.status, await first.text()], [200, "stored"]);
      assert.equal(await (await call()).text(), "duplicate");
      assert.equal(webhooks.inFlight, 0);
    } finally {
      await inbox.close();
    }
  });

  it("never serves a broker source over HTTP, by any spelling of its path, nor after setSources", async () => {
    const inbox = await connect(join(dir.dir, "fetch-broker.db"));
    try {
      const sources = loadSources(
        { web: { provider: "plain" }, orders: { broker: { type: "rabbitmq", queue: "orders", idHeader: "x-id" } } },
        {},
      );
      const webhooks = createWebhooks({ inbox, sources, basePath: "/hooks", log: () => {} });
      const post = async (path: string, id: string) =>
        (
          await webhooks.fetch(
            new Request(`https://app.example${path}`, { method: "POST", headers: { "x-delivery-id": id }, body: "{}" }),
          )
        ).status;
      for (const path of ["/hooks/orders", "/hooks/orders/", "/hooks//orders?x=1"])
        assert.equal(await post(path, "evt_b"), 404, path);
      // Control: its HTTP neighbour, served by the same handler, stores.
      assert.equal(await post("/hooks/web", "evt_w"), 200);
      webhooks.setSources(sources);
      assert.equal(await post("/hooks/orders", "evt_b2"), 404, "after setSources");
      await inbox.flush();
      assert.equal((await inbox.find("evt_b")).length, 0);
    } finally {
      await inbox.close();
    }
  });

  it("routes a request whose body was still arriving when setSources swapped the sources by the filters it found", async () => {
    const inbox = await connect(join(dir.dir, "fetch-swap.db"));
    try {
      const doc = {
        $destinations: { app: { url: "http://127.0.0.1:1/", secret: "whsec_x" } },
        s: { provider: "plain", routes: [{ to: "app", filter: { body: { a: 1 } } }] },
      };
      const webhooks = createWebhooks({ inbox, sources: loadSources(doc, {}), log: () => {} });
      const post = (id: string, body: BodyInit) =>
        webhooks.fetch(
          new Request("https://app.example/s", {
            method: "POST",
            headers: { "x-delivery-id": id },
            body,
            duplex: "half",
          } as RequestInit),
        );
      // Control: with no swap, the filter takes the delivery.
      assert.equal((await post("evt_still", '{"a":1}')).status, 200);
      let end!: () => void;
      const body = new ReadableStream<Uint8Array>({
        start: (controller) => {
          controller.enqueue(new TextEncoder().encode('{"a":'));
          end = () => {
            controller.enqueue(new TextEncoder().encode("1}"));
            controller.close();
          };
        },
      });
      const answer = post("evt_swapped", body);
      await new Promise((resolve) => setTimeout(resolve, 50));
      // The same document loaded again: new Source objects, as a configuration taken up live gives.
      webhooks.setSources(loadSources(doc, {}));
      end();
      assert.equal((await answer).status, 200);
      await inbox.flush();
      for (const id of ["evt_still", "evt_swapped"])
        assert.deepEqual(
          (await inbox.find(id)).map((r) => r.destination),
          ["app"],
          id,
        );
    } finally {
      await inbox.close();
    }
  });

  it("answers 408 to a body that falls behind its pace, and stores none of it", async () => {
    const inbox = await connect(join(dir.dir, "fetch-slow.db"));
    try {
      // Limits as parameters: 50 ms of grace, then 1,000 bytes a second; the body sends 2 bytes and stalls.
      const webhooks = createWebhooks({ inbox, bodyTimeoutMs: 50, minBodyRate: 1_000, log: () => {} });
      let cancelled = false;
      const body = new ReadableStream<Uint8Array>({
        start: (controller) => controller.enqueue(new TextEncoder().encode("{}")),
        cancel: () => void (cancelled = true),
      });
      const call = (b: BodyInit, id: string) =>
        webhooks.fetch(
          new Request("https://app.example/", {
            method: "POST",
            headers: { "x-delivery-id": id },
            body: b,
            duplex: "half",
          } as RequestInit),
        );
      const slow = await call(body, "evt_slow");
      assert.equal(slow.status, 408);
      assert.match(await slow.text(), /^body too slow: 2 bytes in \d+ ms/);
      assert.ok(cancelled, "the stalled body is cancelled, not left open");
      // Control: the same handler takes a body that is all there.
      assert.equal(await (await call("{}", "evt_whole")).text(), "stored");
      await inbox.flush();
      assert.deepEqual((await inbox.find("evt_slow")).length, 0);
      assert.equal(webhooks.inFlight, 0);
    } finally {
      await inbox.close();
    }
  });
});

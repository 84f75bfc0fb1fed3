// test/redact.test.ts: no secret the worker knows is kept or shown, even when a destination's answer echoes
// it. First redactor()'s forms and markers, secretsOf()'s names and an answer cut in the middle of a token;
// then, on both backends, destinations that echo every request header in their 4xx and 5xx answers (and
// one whose debug page prints its environment), forwarded once, and every place checked: the database
// itself, the log, the traces, the metrics, the announcements, `inbox.ts destinations --json`, `show` and
// `export` (its cli(), in this process), and the operator page in Chromium. The control, with redaction off, finds a secret in each.
//   npx node --import tsx --test test/redact.test.ts

import assert from "node:assert/strict";
import { once } from "node:events";
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { createServer, type Server } from "node:http";
import { after, before, describe, it } from "node:test";
import type { Browser } from "playwright-core";
import { createAdmin, listenAdmin } from "../admin.ts";
import { cli, connect } from "../inbox.ts";
import { parseBrokerDestination } from "../lib/brokers.ts";
import { httpSender } from "../lib/forwarding/forward.ts";
import { forward } from "../lib/forwarding/forwarder.ts";
import { Metrics } from "../lib/metrics.ts";
import { loadSources } from "../lib/config/sources.ts";
import { redactor, secretsOf, type Secret } from "../lib/redact.ts";
import { loadDestinations, type HttpDestination } from "../lib/routing/routes.ts";
import { PermanentError, type Inbox, type Lease } from "../lib/store.ts";
import { run } from "../worker.ts";
import { installSdk, spanJson } from "./fixtures/otel.ts";
import { backends, chromiumSkip, launchChromium, runScript, tempDir } from "./helpers.ts";

const spans = installSdk();
const secret = (value: string, name = "app bearer", owner = "app"): Secret => ({ value, name, owner });

describe("redactor()", () => {
  const token = "tok+/live=never shown";
  const { redact } = redactor([secret(token)]);

  it("replaces a secret plain, percent-encoded in either case or mixed, form-encoded, JSON- and HTML-escaped, each with its marker", () => {
    const encoded = encodeURIComponent(token);
    for (const form of [
      token,
      encoded,
      encoded.toLowerCase(),
      encoded.replace("%2F", "/"),
      encoded.replace(/%20/g, "+"),
      JSON.stringify(token).slice(1, -1).replace("/", "\\/"),
      token.replace("/", "&#47;"),
      token.replace("/", "&#x2f;"),
      token.replace(" ", "&#32;"),
      token.replace("+", "\\u002B"),
    ]) {
      assert.equal(redact(`before ${form} after`), "before [redacted: app bearer] after", form);
    }
  });

  it("finds a basic pair as its base64, unpadded and base64url, and its password alone", () => {
    const forwarding = loadDestinations(
      { $destinations: { crm: { url: "http://127.0.0.1:1/", secret: "whsec_AAAA", basic: "env:CRM" } } },
      { CRM: "crm-user:pa$$ w0rd??>" },
    );
    const { redact: hide } = redactor(secretsOf(forwarding));
    const pair = Buffer.from("crm-user:pa$$ w0rd??>");
    for (const form of [
      pair.toString("base64"),
      pair.toString("base64").replace(/=+$/, ""),
      pair.toString("base64url"),
      "crm-user:pa$$ w0rd??>",
      "pa$$ w0rd??>",
      encodeURIComponent("pa$$ w0rd??>"),
    ]) {
      assert.equal(hide(`<${form}>`), "<[redacted: crm basic]>", form);
    }
  });

  it("tries the longest value first, names a shared value after the destination it is for, and leaves values under 6 characters alone", () => {
    const all = [
      secret("abcdef", "app header x-a"),
      secret("abcdefgh", "app bearer"),
      secret("shared-token", "crm bearer", "crm"),
      secret("shared-token", "app header x-b"),
      secret("abcde", "app header x-c"),
    ];
    assert.equal(
      redactor(all).redact("abcdefgh abcdef abcde shared-token"),
      "[redacted: app bearer] [redacted: app header x-a] abcde [redacted: crm bearer]",
    );
    assert.equal(redactor(all, { mine: "app" }).redact("shared-token"), "[redacted: app header x-b]");
  });

  it("gives back the very text when there is nothing to redact, and with no secrets only cuts it", () => {
    const text = `HTTP 500 from app: ${"nothing secret here ".repeat(10)}`;
    assert.equal(redact(text), text);
    assert.equal(redactor([]).redact(text, 8), "HTTP 500");
  });

  it("never keeps part of a secret at a cut: one that starts before it is replaced whole, text after it is left out", () => {
    const text = `12345${token}6789`;
    assert.equal(redact(text, 8), "12345[redacted: app bearer]");
    assert.equal(redact(text, 5), "12345");
    assert.equal(redact(text, 100), "12345[redacted: app bearer]6789");
  });
});

describe("secretsOf()", () => {
  it("names each destination's, the operator's and each source's secrets, and leaves out a header written in the file", () => {
    const config = {
      $destinations: {
        app: {
          url: "http://127.0.0.1:1/",
          secret: ["whsec_c2VjcmV0LW9uZQ==", "whsec_c2VjcmV0LXR3bw=="],
          bearer: "env:T",
          headers: { "X-Api-Key": "env:K", "X-Team": "payments" },
        },
      },
      $operator: { url: "http://127.0.0.1:1/", secret: "whsec_b3BzLXNlY3JldA==", basic: "env:B" },
      stripe: { provider: "stripe", secret: "env:S", routes: ["app"] },
      svix: { provider: "standard", secret: "whsec_c291cmNlLWtleQ==" },
    };
    const env = { T: "token-123456", K: "key-123456", B: "ops:password-1", S: "whsec_stripe123" };
    const found = secretsOf(loadDestinations(config, env), { sources: loadSources(config, env).values() });
    const names = (value: string) => found.filter((s) => s.value === value).map((s) => s.name);
    assert.deepEqual(names("whsec_c2VjcmV0LW9uZQ=="), ["app secret #1"]);
    assert.deepEqual(names("c2VjcmV0LXR3bw=="), ["app secret #2"]);
    assert.deepEqual(names("token-123456"), ["app bearer"]);
    assert.deepEqual(names("key-123456"), ["app header x-api-key"]);
    assert.deepEqual(names("payments"), [], "a header written in the file is not a secret");
    assert.deepEqual(names("password-1"), ["$operator basic"]);
    assert.deepEqual(names("whsec_stripe123"), ["source stripe secret"]);
    assert.deepEqual(names("whsec_c291cmNlLWtleQ=="), ["source svix secret"]);
  });

  it("names a broker's pass, token and the password in its URL", () => {
    const env = { NP: "nats-pass-1", NT: "nats-token-1", RU: "amqp://guest:rabbit%2Fpass@127.0.0.1:5672" };
    const brokers = [
      parseBrokerDestination("audit", { type: "nats", subject: "a.b", user: "u", pass: "env:NP" }, "audit", env),
      parseBrokerDestination(
        "tokened",
        { type: "nats", url: "nats://u:nats-url-pass@127.0.0.1:4222", subject: "a.b", token: "env:NT" },
        "tokened",
        env,
      ),
      parseBrokerDestination("queue", { type: "rabbitmq", url: "env:RU", routingKey: "q" }, "queue", env),
    ];
    const found = secretsOf(undefined, { brokers }).map((s) => `${s.name}=${s.value}`);
    assert.deepEqual(found, [
      "audit pass=nats-pass-1",
      "tokened token=nats-token-1",
      "tokened password=nats-url-pass",
      "queue password=rabbit/pass",
    ]);
    assert.equal(
      redactor(secretsOf(undefined, { brokers })).redact(`connect to ${env.RU} failed`),
      "connect to amqp://guest:[redacted: queue password]@127.0.0.1:5672 failed",
    );
  });
});

// echo starts a destination on a free port whose answers say what it was sent, as error pages, debug proxies
// and gateways do: answer(path, headers, body) gives the status and the text.
async function echo(
  answer: (
    path: string,
    raw: string[],
    body: string,
  ) => { status: number; text: string; headers?: Record<string, string> },
): Promise<{ url: string; server: Server }> {
  const server = createServer((req, res) => {
    let body = "";
    req.on("data", (c: Buffer) => (body += c));
    req.on("end", () => {
      const a = answer(req.url ?? "/", req.rawHeaders, body);
      res.writeHead(a.status, { "content-type": "text/plain", ...a.headers }).end(a.text);
    });
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  return { url: `http://127.0.0.1:${(server.address() as { port: number }).port}`, server };
}
const close = (server: Server) =>
  new Promise<void>((resolve) => {
    server.closeAllConnections();
    server.close(() => resolve());
  });

describe("an answer cut in the middle of a token", () => {
  it("keeps no part of it: the token that straddles the cut is replaced whole", async () => {
    const token = "tok_straddles_the_cut_0123456789";
    const { url, server } = await echo(() => ({ status: 500, text: `${"x".repeat(30)} Bearer ${token} and more` }));
    const d = loadDestinations(
      { $destinations: { app: { url, secret: "whsec_AAAA", bearer: "env:T" } } },
      { T: token },
    ).destinations.get("app") as HttpDestination;
    const lease = {
      source: "shop",
      id: "evt_1",
      body: Buffer.from("{}"),
      contentType: null,
      attempts: 1,
      orderKey: null,
      newerId: null,
      headers: null,
    } as unknown as Lease;
    const send = async (redacting: boolean) => {
      const sender = httpSender(d, {
        answerBytes: 45,
        ...(redacting ? { redactor: redactor(secretsOf({ destinations: new Map([["app", d]]) })) } : {}),
      });
      try {
        const outcome = await sender.send(lease, { signal: new AbortController().signal, permanent4xx: false });
        return outcome.kind === "done" ? "" : outcome.error;
      } finally {
        await sender.close();
      }
    };
    try {
      const kept = await send(true);
      assert.equal(kept, `HTTP 500 from app: ${"x".repeat(30)} Bearer [redacted: app bearer]`);
      // The control: without the redactor the first half of the token is kept.
      assert.match(await send(false), /Bearer tok_str$/);
    } finally {
      await close(server);
    }
  });
});

describe("worker.ts and run()", () => {
  it("worker.ts, as people run it, logs and stores a failed try's answer with the secrets it echoed redacted", async () => {
    const dir = tempDir();
    const { url, server } = await echo((_, raw) => ({ status: 500, text: raw.join(" ") }));
    try {
      const file = join(dir.dir, "sources.json");
      writeFileSync(
        file,
        JSON.stringify({
          $destinations: { app: { url, secret: "env:APP_SECRET", bearer: "env:APP_TOKEN" } },
          shop: { provider: "plain", secret: "env:SHOP_SECRET", routes: ["app"] },
        }),
      );
      const db = join(dir.dir, "inbox.db");
      const inbox = await connect(db);
      await inbox.store({ source: "shop", id: "evt_1", body: Buffer.from("{}"), destinations: ["app"] });
      await inbox.close();
      const run = await runScript("worker.ts", ["--sources", file, "--db", db, "--once"], ENV);
      assert.equal(run.code, 0, run.stderr);
      assert.match(run.stderr, /shop\/evt_1 → app failed \(attempt 1\).*authorization Bearer \[redacted: app bearer\]/);
      const again = await connect(db);
      const [row] = await again.query("SELECT error FROM deliveries WHERE destination = 'app'");
      await again.close();
      assert.match(String(row!.error), /Bearer \[redacted: app bearer\]/);
      assert.deepEqual(leaks(`${run.stderr}${String(row!.error)}`), []);
    } finally {
      await close(server);
      dir.cleanup();
    }
  });

  it("run() stores and logs a handler's error with the secrets it quotes redacted; the control without redact keeps them", async () => {
    const dir = tempDir();
    try {
      const inbox = await connect(join(dir.dir, "inbox.db"));
      const { redact } = redactor([secret(ENV.SHOP_SECRET, "source shop secret", "source shop")], { mine: "handler" });
      const failing = () => {
        throw new PermanentError(`the API said: invalid key ${ENV.SHOP_SECRET}`);
      };
      const errors: string[] = [];
      for (const [id, options] of [
        ["evt_on", { redact }],
        ["evt_off", {}],
      ] as const) {
        await inbox.store({ id, body: Buffer.from("{}") });
        const lines: string[] = [];
        await run(failing, { inbox, once: true, log: (line) => void lines.push(line), ...options });
        const [row] = await inbox.query("SELECT error FROM deliveries WHERE id = ?", id);
        errors.push(`${String(row!.error)} ${lines.join(" ")}`);
      }
      await inbox.close();
      assert.match(errors[0]!, /invalid key \[redacted: source shop secret\]/);
      assert.deepEqual(leaks(errors[0]!), []);
      assert.notDeepEqual(leaks(errors[1]!), [], "the control: without redact the secret is kept");
    } finally {
      dir.cleanup();
    }
  });
});

// The secrets, each with characters an echo encodes, and what must never be found anywhere: each value,
// URL-encoded, its first and last 10 characters (so half a token is a leak too), and the basic pair's base64.
const ENV = {
  APP_TOKEN: "tok_live_app+/=4242abcdef",
  APP_KEY: "key-app-9f8e7d6c5b4a",
  APP_SECRET: `whsec_${Buffer.from("the app's forwarding key").toString("base64")}`,
  CRM_BASIC: "crm-user:pa$$ w0rd!crm",
  CRM_SECRET: `whsec_${Buffer.from("the crm's forwarding key").toString("base64")}`,
  OLD_TOKEN: "tok_old_destination_77",
  OLD_SECRET: `whsec_${Buffer.from("the old app's key").toString("base64")}`,
  HOP_TOKEN: "tok_hop_redirected_55",
  HOP_SECRET: `whsec_${Buffer.from("the hop's key").toString("base64")}`,
  OPS_TOKEN: "tok_operator_99887766",
  OPS_SECRET: `whsec_${Buffer.from("the operator's key").toString("base64")}`,
  SHOP_SECRET: "shop-signing-secret-31337",
};
const NEEDLES = [
  ...new Set(
    Object.entries(ENV).flatMap(([name, v]) => {
      const values = name === "CRM_BASIC" ? [v, v.slice(v.indexOf(":") + 1), Buffer.from(v).toString("base64")] : [v];
      return values.flatMap((x) => [x, encodeURIComponent(x), x.slice(0, 10), x.slice(-10)]);
    }),
  ),
];
const leaks = (text: string) => NEEDLES.filter((n) => text.includes(n));

// printed runs inbox.ts's own cli() here, as `npx tsx inbox.ts ARGS` would (a child process each costs
// seconds of start-up on a busy machine), and returns what it printed.
async function printed(...args: string[]): Promise<string> {
  const out: string[] = [];
  const [log, error, code] = [console.log, console.error, process.exitCode];
  console.log = console.error = (...parts: unknown[]) => void out.push(parts.join(" "));
  process.exitCode = undefined;
  try {
    await cli(["node", "inbox.ts", ...args]);
    assert.equal(process.exitCode ?? 0, 0, `inbox.ts ${args.join(" ")} failed: ${out.join("\n")}`);
  } finally {
    [console.log, console.error, process.exitCode] = [log, error, code];
  }
  return out.join("\n");
}

const SKIP_BROWSER = chromiumSkip();

for (const backend of await backends("redact")) {
  describe(`destinations that echo what they are sent, on ${backend.name}`, { skip: backend.skip }, () => {
    let browser: Browser | undefined;
    before(async () => {
      if (!SKIP_BROWSER) browser = await launchChromium();
    });
    after(async () => {
      await browser?.close();
    });

    // scene forwards one delivery to three destinations that each echo what they got in a failed answer,
    // with redaction on or off, and returns the text of every place a secret could show.
    async function scene(redact: boolean): Promise<Record<string, string>> {
      const made = await backend.make();
      const exports = tempDir();
      const announced: string[] = [];
      let heard = () => {};
      const ops = createServer((req, res) => {
        let body = "";
        req.on("data", (c: Buffer) => (body += c));
        req.on("end", () => {
          announced.push(body);
          res.writeHead(204).end();
          heard();
        });
      });
      ops.listen(0, "127.0.0.1");
      await once(ops, "listening");
      // app: a 500 error page listing the request's headers, and a link that carries the credential URL-encoded;
      // crm: a 400 that quotes the basic credentials, decoded; old: a 410 whose debug page prints its environment;
      // hop: a redirect whose Location carries the bearer, which the try's error quotes from the header, not the body.
      const destinations = await echo((path, raw, body) => {
        const headers = Object.fromEntries(
          raw.flatMap((_, i) => (i % 2 === 0 ? [[raw[i]!.toLowerCase(), raw[i + 1]!]] : [])),
        );
        const all = raw.map((x, i) => (i % 2 === 0 ? `${x}: ` : `${x}\n`)).join("");
        if (path === "/app")
          return {
            status: 500,
            text: `500 at /app: log in again at /login?auth=${encodeURIComponent(headers.authorization!)}\n${all}${body}`,
          };
        if (path === "/hop")
          return { status: 302, text: "", headers: { location: `/login?token=${headers.authorization!.slice(7)}` } };
        if (path === "/crm")
          return {
            status: 400,
            text: `bad credentials: ${Buffer.from(headers.authorization!.slice(6), "base64").toString()}\n${all}${body}`,
          };
        return {
          status: 410,
          text: `gone. APP_FORWARD_SECRET=${ENV.APP_SECRET} SHOP_SECRET=${ENV.SHOP_SECRET}\n${all}${body}`,
        };
      });
      const config = {
        $destinations: {
          app: {
            url: `${destinations.url}/app`,
            secret: "env:APP_SECRET",
            bearer: "env:APP_TOKEN",
            headers: { "X-Api-Key": "env:APP_KEY", "X-Team": "payments" },
            breaker: { failures: 1 },
          },
          crm: { url: `${destinations.url}/crm`, secret: "env:CRM_SECRET", basic: "env:CRM_BASIC" },
          old: { url: `${destinations.url}/old`, secret: "env:OLD_SECRET", bearer: "env:OLD_TOKEN" },
          hop: { url: `${destinations.url}/hop`, secret: "env:HOP_SECRET", bearer: "env:HOP_TOKEN" },
        },
        $operator: {
          url: `http://127.0.0.1:${(ops.address() as { port: number }).port}/`,
          secret: "env:OPS_SECRET",
          bearer: "env:OPS_TOKEN",
        },
        shop: {
          provider: "plain",
          secret: "env:SHOP_SECRET",
          routes: ["app", { to: "crm", permanent4xx: true }, "old", "hop"],
        },
      };
      const sources = loadSources(config, ENV);
      const forwarding = loadDestinations(config, ENV);
      const inbox: Inbox = await connect(made.target);
      const places: Record<string, string> = {};
      try {
        await inbox.store({
          source: "shop",
          id: "evt_1",
          body: Buffer.from('{"type":"order.paid","amount":5}'),
          destinations: ["app", "crm", "old", "hop"],
        });
        const lines: string[] = [];
        const metrics = new Metrics({ inbox, processMetrics: false });
        spans.reset();
        // Three announcements: app's breaker opened, crm's delivery set aside, old paused.
        const three = new Promise<void>((resolve) => void (heard = () => announced.length >= 3 && resolve()));
        await forward({
          inbox,
          forwarding,
          routes: new Map([...sources.values()].map((s) => [s.name, s.routes ?? []])),
          once: true,
          metrics,
          redact,
          secrets: secretsOf(forwarding, { sources: sources.values() }),
          log: (line, fields) => void lines.push(`${line} ${JSON.stringify(fields ?? {})}`),
        });
        await three;
        places.log = lines.join("\n");
        places.traces = JSON.stringify(spans.getFinishedSpans().map(spanJson));
        places.metrics = await metrics.text();
        places.announcements = announced.join("\n");
        places["inbox.ts destinations --json"] = await printed("destinations", "--json", "--db", made.target);
        places["inbox.ts show"] = await printed("show", "evt_1", "--destination", "app", "--db", made.target);
        const file = join(exports.dir, "export.jsonl");
        await printed("export", "--out", file, "--db", made.target);
        places["inbox.ts export"] = readFileSync(file, "utf8");
        if (browser) {
          const admin = createAdmin({ inbox, audit: () => {} });
          const url = await listenAdmin(admin, { host: "127.0.0.1", port: 0 });
          const page = await browser.newPage();
          try {
            for (const path of ["/destinations", "/delivery?source=shop&id=evt_1", "/failures"]) {
              await page.goto(`${url}${path}`);
              // biome-ignore lint/performance/useDomNodeTextContent: what a person reads, hidden text left out
              places[`the page ${path}`] = `${await page.innerText("body")}\n${await page.content()}`;
            }
          } finally {
            await page.close();
            admin.server.closeAllConnections();
            await new Promise((resolve) => admin.server.close(resolve));
          }
        }
        if (backend.name === "postgres") {
          const tables = await inbox.query(
            "SELECT table_name AS t FROM information_schema.tables WHERE table_schema = current_schema()",
          );
          const rows = await Promise.all(
            tables.map((r) => inbox.query(`SELECT row_to_json(x)::text AS j FROM "${String(r.t)}" x`)),
          );
          places["the database"] = rows
            .flat()
            .map((r) => r.j)
            .join("\n");
        }
      } finally {
        await inbox.close();
        await close(destinations.server);
        await close(ops);
      }
      // SQLite: every byte of the file and its WAL, as a copy of the database would hold them.
      if (backend.name === "sqlite") {
        const dir = dirname(made.target);
        places["the database"] = readdirSync(dir)
          .filter((f) => f.startsWith("inbox.db"))
          .map((f) => readFileSync(`${dir}/${f}`, "latin1"))
          .join("\n");
      }
      await made.cleanup();
      exports.cleanup();
      return places;
    }

    it("shows no secret in the database, the log, the traces, the metrics, the announcements, the CLI, an export or the page in Chromium", async () => {
      const places = await scene(true);
      if (SKIP_BROWSER) assert.equal(Object.keys(places).length, 8);
      else assert.equal(Object.keys(places).length, 11);
      for (const [place, text] of Object.entries(places)) {
        assert.deepEqual(leaks(text), [], `a secret in ${place}`);
        if (place !== "metrics")
          assert.match(
            text,
            /\[redacted: (app bearer|app header x-api-key|crm basic|app secret|source shop secret)\]/,
            place,
          );
      }
      assert.match(
        places["inbox.ts destinations --json"]!,
        /redacted: app secret.*redacted: source shop secret/s,
        "the old app's environment, named",
      );
      assert.doesNotMatch(
        places["inbox.ts destinations --json"]!,
        /redacted: [^\]]*x-team/,
        "a header written in the file is not a secret",
      );
    });

    it("the control: with redaction off, each of those places shows a secret (but the metrics, which carry no text)", async () => {
      const places = await scene(false);
      for (const [place, text] of Object.entries(places)) {
        if (place === "metrics") assert.deepEqual(leaks(text), [], "metrics carry no error text");
        else assert.notDeepEqual(leaks(text), [], `the control found no secret in ${place}`);
      }
    });
  });
}

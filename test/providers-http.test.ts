// test/providers-http.test.ts: signed sources through real HTTP. An in-process receiver on a free port
// with its clock pinned answers every case of the issue (200, 401, 400, 404, Slack's handshake), stores
// nothing it refuses, and accepts what the providers' SDKs sign; then the real scripts: receiver.ts
// refusing bad sources files at start-up, send.ts signing like each provider, and inbox.ts showing it.

import assert from "node:assert/strict";
import { existsSync, writeFileSync } from "node:fs";
import { request as httpRequest } from "node:http";
import { join } from "node:path";
import { after, before, beforeEach, describe, it } from "node:test";
import { sign as octokitSign } from "@octokit/webhooks-methods";
import fc from "fast-check";
import { Webhook as StandardWebhook } from "standardwebhooks";
import Stripe from "stripe";
import { request } from "undici";
import { SqliteInbox } from "../lib/sqlite/sqlite.ts";
import { loadSources, sign } from "../lib/config/sources.ts";
import { createReceiver, type Receiver } from "../receiver.ts";
import { run } from "../worker.ts";
import {
  SCHEMES,
  STANDARD,
  STRIPE_SECRET,
  T,
  apply,
  bodyArb,
  idArb,
  mutationArb,
  svixHeaders,
} from "./provider-fixtures.ts";
import { runScript, startReceiver, tempDir, type ReceiverProcess } from "./helpers.ts";

const SECRETS = {
  standard: STANDARD.secret,
  stripe: STRIPE_SECRET,
  github: "gh-secret",
  shopify: "shpss_secret",
  slack: "slack-signing-secret",
  plain: "plain-secret",
} as const;
const SOURCES = {
  standard: { provider: "standard", secret: "env:TEST_STANDARD_SECRET" },
  stripe: { provider: "stripe", secret: SECRETS.stripe },
  github: { provider: "github", secret: ["gh-old", SECRETS.github] },
  shopify: { provider: "shopify", secret: SECRETS.shopify },
  slack: { provider: "slack", secret: SECRETS.slack },
  plain: { provider: "plain", secret: SECRETS.plain },
  open: { provider: "plain" },
  // A short window, to show that a source's tolerance is its own.
  strict: { provider: "standard", secret: STANDARD.secret, tolerance: 5 },
};
const ENV = { TEST_STANDARD_SECRET: STANDARD.secret };
// The presets added with the hmac provider, for send.ts; Square and Twilio sign the URL they were given.
const MORE_SECRETS = {
  paddle: "pdl_ntfset_s",
  linear: "lin_wh_s",
  square: "sq-signature-key",
  twilio: "tw-auth-token",
  zoom: "zoom-token",
  intercom: "ic-secret",
} as const;
const PUBLIC = "https://hooks.example.com";
const MORE_SOURCES = Object.fromEntries(
  Object.entries(MORE_SECRETS).map(([p, secret]) => [
    p,
    { provider: p, secret, ...(p === "square" || p === "twilio" ? { url: `${PUBLIC}/${p}` } : {}) },
  ]),
);

/** delivery builds a provider-shaped body with this ID and type, signed at `at` seconds with `secret`. */
type Named = keyof typeof SECRETS;
function delivery(
  provider: Named,
  id: string,
  type: string,
  at = T,
  secret: string = SECRETS[provider],
): { body: string; headers: Record<string, string> } {
  const body =
    provider === "stripe"
      ? JSON.stringify({ id, object: "event", type, data: { object: { amount: 5 } } })
      : provider === "slack"
        ? JSON.stringify({ type: "event_callback", event_id: id, event: { type } })
        : provider === "standard"
          ? JSON.stringify({ type, data: {} })
          : JSON.stringify({ n: 1 });
  return {
    body,
    headers: {
      "content-type": "application/json",
      ...sign(provider, secret, { id, body, timestampS: at, eventType: type }),
    },
  };
}

let dir: { dir: string; cleanup: () => void };
let inbox: SqliteInbox;
let receiver: Receiver;
let base: string;
let clock = T * 1000;
let logs: string[] = [];

async function post(path: string, message: { body: string | Buffer; headers: Record<string, string | string[]> }) {
  const response = await request(base + path, { method: "POST", headers: message.headers, body: message.body });
  return { status: response.statusCode, text: await response.body.text(), type: response.headers["content-type"] };
}
// postRepeated sends each value of a header on a line of its own through node:http's client, which does
// so on all three runtimes; on Bun, `undici` is Bun's own built-in client, which joins them into one line.
async function postRepeated(path: string, message: { body: string; headers: Record<string, string | string[]> }) {
  return new Promise<{ status: number; text: string }>((resolve, reject) => {
    const req = httpRequest(base + path, { method: "POST", headers: message.headers }, (res) => {
      let text = "";
      res
        .setEncoding("utf8")
        .on("data", (chunk) => (text += chunk))
        .on("end", () => resolve({ status: res.statusCode!, text }));
    });
    req.on("error", reject).end(message.body);
  });
}
const count = () => (inbox.db.prepare("SELECT count(*) AS n FROM deliveries").get() as { n: number }).n;
const row = (source: string, id: string) =>
  inbox.db
    .prepare("SELECT source, id, event_type, provider_time FROM deliveries WHERE source = ? AND id = ?")
    .get(source, id) as
    | { source: string; id: string; event_type: string | null; provider_time: number | null }
    | undefined;

before(async () => {
  dir = tempDir("providers-http-");
  inbox = new SqliteInbox(join(dir.dir, "inbox.db"));
  receiver = createReceiver({
    inbox,
    sources: loadSources(SOURCES, ENV),
    now: () => clock,
    log: (line) => logs.push(line),
  });
  await new Promise<void>((resolve) => receiver.server.listen(0, "127.0.0.1", resolve));
  const address = receiver.server.address();
  base = `http://127.0.0.1:${typeof address === "object" && address ? address.port : 0}`;
});
after(async () => {
  await receiver.close();
  await inbox.close();
  dir.cleanup();
});
beforeEach(() => {
  clock = T * 1000;
  logs = [];
  inbox.db.exec("DELETE FROM deliveries");
});

describe("signed sources over HTTP", () => {
  const types: Record<Named, string | null> = {
    standard: "invoice.paid",
    stripe: "invoice.paid",
    github: "push",
    shopify: "orders/create",
    slack: "app_mention",
    plain: null,
  };
  for (const provider of ["standard", "stripe", "github", "shopify", "slack", "plain"] as const) {
    it(`${provider}: 200 stored, then 200 duplicate, keeping the source, the event type and the provider's time`, async () => {
      const d = delivery(provider, `${provider}_1`, types[provider] ?? "x");
      assert.deepEqual(await post(`/${provider}`, d), {
        status: 200,
        text: "stored",
        type: "text/plain; charset=utf-8",
      });
      clock += 60_000; // a provider's retry, a minute later, re-signed
      const retry = delivery(provider, `${provider}_1`, types[provider] ?? "x", T + 60);
      assert.equal((await post(`/${provider}`, retry)).text, "duplicate");
      const timed = provider === "standard" || provider === "stripe" || provider === "slack";
      assert.deepEqual(
        { ...row(provider, `${provider}_1`) },
        {
          source: provider,
          id: `${provider}_1`,
          event_type: types[provider],
          provider_time: timed ? T * 1000 : null,
        },
      );
      assert.equal(count(), 1);
    });
  }

  it("a plain source without a secret stores on X-Delivery-Id alone", async () => {
    assert.equal((await post("/open", { body: "{}", headers: { "x-delivery-id": "o1" } })).text, "stored");
  });

  it("401 for a bad signature: nothing stored, the reason logged, never the secret or the expected signature", async () => {
    const forged = delivery("github", "g1", "push", T, "not-the-secret");
    const answer = await post("/github", forged);
    assert.equal(answer.status, 401);
    assert.match(answer.text, /signature does not match/);
    assert.equal(count(), 0);
    const expected = sign("github", SECRETS.github, { id: "g1", body: forged.body, timestampS: T })[
      "x-hub-signature-256"
    ]!;
    const said = logs.join("\n") + answer.text;
    assert.match(said, /rejected: 401 github: signature does not match/);
    for (const secret of [SECRETS.github, "gh-old", expected, expected.slice(7)])
      assert.ok(!said.includes(secret), `leaked ${secret}`);
  });

  it("401 for a missing signature, for each signed provider", async () => {
    for (const provider of ["standard", "stripe", "github", "shopify", "slack", "plain"] as const) {
      const answer = await post(`/${provider}`, {
        body: "{}",
        headers: {
          "content-type": "application/json",
          "x-delivery-id": "x",
          "webhook-id": "x",
          "x-github-delivery": "x",
          "x-shopify-webhook-id": "x",
        },
      });
      assert.equal(answer.status, 401, `${provider}: ${answer.text}`);
      assert.match(answer.text, /missing/);
    }
    assert.equal(count(), 0);
  });

  it("401 for a stale timestamp, at the exact edge of each window", async () => {
    const at = async (provider: Named, source: string, signedAt: number, nowMs: number) => {
      clock = nowMs;
      return (await post(`/${source}`, delivery(provider, `${source}_${signedAt}_${nowMs}`, "t", signedAt))).status;
    };
    for (const provider of ["standard", "stripe", "slack"] as const) {
      assert.equal(await at(provider, provider, T, (T + 300) * 1000 + 999), 200, `${provider} at 300 s`);
      assert.equal(await at(provider, provider, T, (T + 301) * 1000), 401, `${provider} at 301 s`);
    }
    assert.equal(await at("standard", "standard", T + 300, T * 1000), 200, "standard 300 s ahead");
    assert.equal(await at("standard", "standard", T + 301, T * 1000), 401, "standard 301 s ahead");
    assert.equal(await at("slack", "slack", T + 301, T * 1000), 401, "slack 301 s ahead");
    assert.equal(await at("stripe", "stripe", T + 3600, T * 1000), 200, "stripe looks only into the past");
    assert.equal(await at("standard", "strict", T, (T + 5) * 1000 + 999), 200, "strict at 5 s");
    assert.equal(await at("standard", "strict", T, (T + 6) * 1000), 401, "strict at 6 s");
    assert.ok(logs.some((line) => /401 stripe: timestamp is 301 s old, over the 300-s window/.test(line)));
    assert.equal(count(), 6);
  });

  it("400 when the delivery ID is missing, once the signature holds", async () => {
    const noId = {
      body: '{"object":"event","type":"x"}',
      headers: sign("stripe", SECRETS.stripe, { id: "", body: '{"object":"event","type":"x"}', timestampS: T }),
    };
    assert.equal((await post("/stripe", noId)).status, 400);
    const { "x-github-delivery": _id, ...github } = delivery("github", "g", "push").headers;
    assert.equal((await post("/github", { body: '{"n":1}', headers: github })).status, 400);
    const { "webhook-id": _wid, ...standard } = delivery("standard", "m", "t").headers;
    assert.equal((await post("/standard", { body: '{"type":"t","data":{}}', headers: standard })).status, 400);
    assert.equal(count(), 0);
  });

  it("404 for an unknown source, and for / once sources are configured", async () => {
    for (const path of ["/nope", "/", "/stripe/extra"]) {
      const answer = await post(path, delivery("stripe", "evt_404", "t"));
      assert.equal(answer.status, 404, path);
    }
    assert.equal(count(), 0);
  });

  it("Slack's url_verification handshake gets its challenge back as 200 and is not stored", async () => {
    const body = JSON.stringify({
      token: "Jhj5dZrVaK7ZwHHjRyZWjbDl",
      challenge: "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
      type: "url_verification",
    });
    const answer = await post("/slack", {
      body,
      headers: { "content-type": "application/json", ...sign("slack", SECRETS.slack, { id: "", body, timestampS: T }) },
    });
    assert.deepEqual(answer, {
      status: 200,
      text: "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
      type: "text/plain; charset=utf-8",
    });
    assert.equal(count(), 0);
  });

  it("repeated signature, timestamp and ID headers are refused through node:http, which would otherwise join them", async () => {
    const cases: [string, Named, string, number][] = [
      ["/github", "github", "x-hub-signature-256", 401],
      ["/github", "github", "x-github-delivery", 400],
      ["/standard", "standard", "webhook-signature", 401],
      ["/standard", "standard", "webhook-timestamp", 401],
      ["/standard", "standard", "webhook-id", 400],
      ["/stripe", "stripe", "stripe-signature", 401],
      ["/shopify", "shopify", "x-shopify-hmac-sha256", 401],
      ["/shopify", "shopify", "x-shopify-webhook-id", 400],
      ["/slack", "slack", "x-slack-signature", 401],
      ["/slack", "slack", "x-slack-request-timestamp", 401],
      ["/plain", "plain", "x-delivery-id", 400],
    ];
    for (const [path, provider, name, status] of cases) {
      const d = delivery(provider, "dup_1", "t");
      const headers: Record<string, string | string[]> = { ...d.headers, [name]: [d.headers[name]!, d.headers[name]!] };
      const answer = await postRepeated(path, { body: d.body, headers });
      assert.equal(answer.status, status, `${name}: ${answer.text}`);
      assert.match(answer.text, /more than once/);
    }
    assert.equal(count(), 0);
  });

  it("rotates keys: either of github's two secrets verifies, a third does not", async () => {
    assert.equal((await post("/github", delivery("github", "r1", "push", T, "gh-old"))).text, "stored");
    assert.equal((await post("/github", delivery("github", "r2", "push", T, SECRETS.github))).text, "stored");
    assert.equal((await post("/github", delivery("github", "r3", "push", T, "gh-next"))).status, 401);
    assert.equal(count(), 2);
  });

  it("accepts what the providers' SDKs sign: standardwebhooks, svix, stripe and @octokit/webhooks-methods", async () => {
    const now = Math.floor(Date.now() / 1000);
    clock = now * 1000;
    const body = '{"type":"invoice.paid","data":{}}';
    const standard = {
      "webhook-id": "msg_sdk",
      "webhook-timestamp": String(now),
      "webhook-signature": new StandardWebhook(STANDARD.secret).sign("msg_sdk", new Date(now * 1000), body),
    };
    assert.equal((await post("/standard", { body, headers: standard })).text, "stored");
    assert.equal((await post("/standard", { body, headers: svixHeaders("msg_svix", body, now) })).text, "stored");
    const event = JSON.stringify({ id: "evt_sdk", object: "event", type: "charge.succeeded", data: { object: {} } });
    // The async form: on Deno and Bun, stripe's package exports its Web Crypto build, which signs only asynchronously.
    const header = await new Stripe("sk_test_not_used").webhooks.generateTestHeaderStringAsync({
      payload: event,
      secret: SECRETS.stripe,
      timestamp: now,
    });
    assert.equal((await post("/stripe", { body: event, headers: { "stripe-signature": header } })).text, "stored");
    const signature = await octokitSign(SECRETS.github, body);
    assert.equal(
      (
        await post("/github", {
          body,
          headers: { "x-hub-signature-256": signature, "x-github-delivery": "g_sdk", "x-github-event": "push" },
        })
      ).text,
      "stored",
    );
    assert.deepEqual(
      { ...row("stripe", "evt_sdk") },
      { source: "stripe", id: "evt_sdk", event_type: "charge.succeeded", provider_time: now * 1000 },
    );
    assert.equal(count(), 4);
  });

  it("property: a delivery with any one signed byte changed gets a 401 over HTTP, and nothing is stored", async () => {
    for (const scheme of SCHEMES) {
      const path = scheme.name === "svix" ? "/standard" : `/${scheme.name}`;
      // SCHEMES sign with the fixtures' secrets; serve them from a source that has those secrets.
      const local = createReceiver({
        inbox,
        sources: new Map([[path.slice(1), scheme.source]]),
        now: () => T * 1000,
        log: () => {},
      });
      await new Promise<void>((resolve) => local.server.listen(0, "127.0.0.1", resolve));
      const address = local.server.address();
      const url = `http://127.0.0.1:${typeof address === "object" && address ? address.port : 0}${path}`;
      try {
        await fc.assert(
          fc.asyncProperty(idArb, bodyArb, mutationArb, async (id, body, m) => {
            const forged = apply(scheme, scheme.make(id, body), m);
            const response = await request(url + (forged.query ?? ""), {
              method: "POST",
              headers: forged.headers,
              body: forged.body,
            });
            await response.body.text(); // not dump(): Bun's built-in undici has none
            assert.equal(response.statusCode, 401, `${scheme.name} ${JSON.stringify(m)}`);
          }),
          { numRuns: 25 },
        );
        assert.equal(count(), 0, scheme.name);
        // Control: the same setup stores the unchanged delivery, so the 401s above were the signature's doing.
        const good = scheme.make("control", Buffer.from("ok"));
        const response = await request(url + (good.query ?? ""), {
          method: "POST",
          headers: good.headers,
          body: good.body,
        });
        assert.equal(await response.body.text(), "stored");
        inbox.db.exec("DELETE FROM deliveries");
      } finally {
        await local.close();
      }
    }
  });

  it("the worker's handler sees the source, the event type and the provider's time", async () => {
    await post("/stripe", delivery("stripe", "evt_w", "invoice.paid"));
    await post("/github", delivery("github", "g_w", "push"));
    const seen: string[] = [];
    await run(
      (job) =>
        void seen.push(
          `${job.delivery.source} ${job.delivery.id} ${job.delivery.eventType} ${job.delivery.providerTime}`,
        ),
      { inbox, once: true, log: () => {} },
    );
    assert.deepEqual(seen.sort(), ["github g_w push null", `stripe evt_w invoice.paid ${T * 1000}`]);
  });
});

describe("receiver.ts --sources", () => {
  let tmp: { dir: string; cleanup: () => void };
  before(() => (tmp = tempDir("providers-cli-")));
  after(() => tmp.cleanup());

  const startWith = async (config: unknown, env: Record<string, string> = {}) => {
    const file = join(tmp.dir, `sources-${Math.random().toString(36).slice(2)}.json`);
    writeFileSync(file, typeof config === "string" ? config : JSON.stringify(config));
    const db = join(tmp.dir, `bad-${Math.random().toString(36).slice(2)}.db`);
    const result = await runScript("receiver.ts", ["--port", "0", "--db", db, "--sources", file], env);
    return { ...result, dbCreated: existsSync(db) };
  };

  const cases: [string, unknown, RegExp, Record<string, string>?][] = [
    ["an unknown provider", { s: { provider: "paypal", secret: "k" } }, /source "s": unknown provider "paypal"/],
    ["a missing secret", { s: { provider: "stripe" } }, /source "s": missing secret/],
    [
      "an env: variable that is not set",
      { s: { provider: "github", secret: "env:INBOX_TEST_UNSET_VAR" } },
      /environment variable INBOX_TEST_UNSET_VAR, which is not set/,
    ],
    [
      "a bad whsec_ value",
      { s: { provider: "standard", secret: "whsec_TOPSECRET!" } },
      /source "s": secret is not a whsec_ secret/,
    ],
    ["a file that is not JSON", '{"s": {"provider": "github", "secret": "TOPSECRET",}}', /not valid JSON/],
    ["a file that is missing", null, /cannot read the sources file .*ENOENT/],
    [
      "an hmac scheme with an unknown algorithm",
      { s: { provider: "hmac", secret: "TOPSECRET", header: "X-Sig", id: "header:X-Id", algorithm: "md5" } },
      /source "s": expected algorithm to be one of sha1, sha256, sha512, got "md5"/,
    ],
    [
      "an hmac template placeholder that does not exist",
      { s: { provider: "hmac", secret: "TOPSECRET", header: "X-Sig", id: "header:X-Id", signed: "{nonce}{body}" } },
      /source "s": unknown placeholder \{nonce\} in signed/,
    ],
    [
      "an unknown hmac setting",
      { s: { provider: "hmac", secret: "TOPSECRET", header: "X-Sig", id: "header:X-Id", hash: "sha1" } },
      /source "s": unknown setting "hash"/,
    ],
    [
      "a square source without its url",
      { s: { provider: "square", secret: "TOPSECRET" } },
      /source "s": expected url to be the address the sender posts to/,
    ],
  ];
  for (const [what, config, pattern] of cases) {
    it(`stops at start-up on ${what}: one line, exit 2, no database created`, async () => {
      const result =
        config === null
          ? {
              ...(await runScript("receiver.ts", [
                "--port",
                "0",
                "--db",
                join(tmp.dir, "never.db"),
                "--sources",
                join(tmp.dir, "missing.json"),
              ])),
              dbCreated: existsSync(join(tmp.dir, "never.db")),
            }
          : await startWith(config);
      assert.equal(result.code, 2, result.stderr);
      const lines = result.stderr.trimEnd().split("\n");
      assert.equal(lines.length, 1, result.stderr);
      assert.match(lines[0]!, pattern);
      assert.ok(!result.stderr.includes("TOPSECRET"), "the secret must not be echoed");
      assert.equal(result.stdout, "");
      assert.equal(result.dbCreated, false);
    });
  }

  describe("with a running receiver and send.ts signing like each provider", () => {
    let rx: ReceiverProcess;
    let db: string;
    before(async () => {
      const file = join(tmp.dir, "sources.json");
      writeFileSync(file, JSON.stringify({ ...SOURCES, ...MORE_SOURCES }));
      db = join(tmp.dir, "inbox.db");
      // INBOX_SOURCES stands for --sources.
      rx = await startReceiver(db, [], { ...ENV, INBOX_SOURCES: file });
    });
    after(async () => {
      await rx.stop();
    });

    it("lists its sources at start-up and warns only about the unsigned one", () => {
      const log = rx.log();
      assert.match(log, /source stripe: stripe, POST \/stripe, 1 secret/);
      assert.match(log, /source github: github, POST \/github, 2 secrets/);
      assert.match(log, /warning: source open is not verified/);
      assert.doesNotMatch(log, /warning: deliveries are not verified/);
      assert.ok(!log.includes(STRIPE_SECRET) && !log.includes(STANDARD.secret), "no secret in the start-up lines");
    });

    for (const provider of ["standard", "stripe", "github", "shopify", "slack", "plain"] as const) {
      it(`send.ts --provider ${provider}: stored, duplicate, stored, duplicate`, async () => {
        const result = await runScript("send.ts", [
          "--provider",
          provider,
          "--secret",
          SECRETS[provider],
          "--url",
          `${rx.url}/${provider}`,
        ]);
        assert.equal(result.code, 0, result.stderr + result.stdout);
        assert.equal(result.stdout, "evt_100: stored\nevt_100: duplicate\nevt_101: stored\nevt_100: duplicate\n");
      });
    }

    for (const [provider, secret] of Object.entries(MORE_SECRETS)) {
      it(`send.ts --provider ${provider}: stored, duplicate, stored, duplicate`, async () => {
        const result = await runScript("send.ts", [
          "--provider",
          provider,
          "--secret",
          secret,
          "--url",
          `${rx.url}/${provider}`,
          "--signed-url",
          `${PUBLIC}/${provider}`,
        ]);
        assert.equal(result.code, 0, result.stderr + result.stdout);
        assert.equal(result.stdout, "evt_100: stored\nevt_100: duplicate\nevt_101: stored\nevt_100: duplicate\n");
      });
    }

    it("send.ts with the wrong secret prints each 401 and exits 1", async () => {
      const result = await runScript("send.ts", [
        "--provider",
        "stripe",
        "--secret",
        "whsec_wrong",
        "--url",
        `${rx.url}/stripe`,
      ]);
      assert.equal(result.code, 1);
      assert.match(result.stdout, /^evt_100: 401 stripe: signature does not match$/m);
    });

    it("send.ts refuses an unknown provider or a malformed secret before sending anything (exit 2)", async () => {
      for (const args of [
        ["--provider", "paypal", "--secret", "k"],
        ["--provider", "stripe", "--secret", "sk_live_x"],
        ["--provider", "github"],
      ]) {
        const result = await runScript("send.ts", [...args, "--url", `${rx.url}/stripe`]);
        assert.equal(result.code, 2, args.join(" "));
        assert.equal(result.stderr.trimEnd().split("\n").length, 1, result.stderr);
        assert.equal(result.stdout, "");
      }
    });

    it("inbox.ts list, show and status show each delivery's source and type", async () => {
      const list = await runScript("inbox.ts", ["list", "--db", db, "--limit", "50"]);
      assert.match(list.stdout, /^stripe\tevt_100\treceived\t0\tpayment_intent\.succeeded\t/m);
      assert.match(list.stdout, /^shopify\tevt_101\treceived\t0\torders\/paid\t/m);
      const show = await runScript("inbox.ts", ["show", "evt_100", "--source", "slack", "--db", db]);
      assert.match(show.stdout, /^source +slack$/m);
      assert.match(show.stdout, /^type +payment$/m);
      assert.match(show.stdout, /^provider time +\d{4}-/m);
      const status = await runScript("inbox.ts", ["status", "--db", db]);
      assert.match(status.stdout, /^by source and type:$/m);
      assert.match(status.stdout, /^ {2}standard +payment\.succeeded +received 2$/m);
      assert.match(status.stdout, /^ {2}github +payment +received 2$/m);
      const json = JSON.parse((await runScript("inbox.ts", ["status", "--db", db, "--json"])).stdout);
      assert.ok(
        json.sources.some(
          (s: { source: string; eventType: string; counts: { received: number } }) =>
            s.source === "stripe" && s.eventType === "payment_intent.succeeded" && s.counts.received === 2,
        ),
      );
    });
  });

  it("without --sources keeps the article's unsigned default source at / and says so", async () => {
    const rx = await startReceiver(join(tmp.dir, "plain.db"));
    try {
      const response = await request(rx.url + "/", {
        method: "POST",
        headers: { "x-delivery-id": "evt_1" },
        body: "{}",
      });
      assert.equal(await response.body.text(), "stored");
      assert.match(rx.log(), /warning: deliveries are not verified/);
    } finally {
      await rx.stop();
    }
  });
});

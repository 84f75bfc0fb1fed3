// test/docs-run.test.ts: the docs' set-ups followed word for word, as a newcomer types them (issue 49): the
// README's "Stripe → your app", docs/forwarding.md's sources file, "Running it", its Node app of "In your app"
// and "Seeing it", and docs/brokers.md's two set-ups, a broker as a destination and brokers as sources. Each
// block is read from the page and run as it stands, in a folder of its own beside the clone (its scripts
// linked in, so `npx tsx receiver.ts` is the clone's); what a page leaves to the reader is given the fewest
// words: its hosts point at this machine's free ports, its placeholders (`whsec_...`) get real secrets, and a
// broker's stream, queue and exchange names get this run's suffix, so the shared brokers' other users never
// meet them. docs/production.md's commands are run by test/production.test.ts, which sets up its server.

import assert from "node:assert/strict";
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { copyFileSync, readdirSync, readFileSync, symlinkSync, writeFileSync } from "node:fs";
import { createServer, type IncomingHttpHeaders } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { Webhook } from "standardwebhooks";
import { sign } from "../lib/providers.ts";
import { jetstream } from "@nats-io/jetstream";
import { jetStreamSuite, rabbitSuite } from "./brokers-suite.ts";
import { freePort, NATS, natsSkip, opensslSkip, pki, RABBITMQ, rabbitmqSkip, ROOT, tempDir, until } from "./helpers.ts";

const page = (path: string) => readFileSync(join(ROOT, path), "utf8");

/** section is a page's text from one heading to the next of the same level. */
function section(text: string, heading: string): string {
  const start = text.indexOf(`${heading}\n`);
  assert.ok(start >= 0, `the page has ${heading}`);
  const level = /^#+/.exec(heading)![0];
  const next = text.slice(start + heading.length).search(new RegExp(`\\n${level} `));
  return next < 0 ? text.slice(start) : text.slice(start, start + heading.length + next + 1);
}

/** fences are a section's fenced blocks, in order: their language and body. */
const fences = (text: string) =>
  [...text.matchAll(/^```(\w*)\n([\s\S]*?)^```$/gm)].map((m) => ({ lang: m[1]!, body: m[2]! }));

const started: ChildProcess[] = [];
const folders: (() => void)[] = [];
after(async () => {
  for (const child of started) stop(child);
  for (const cleanup of folders) cleanup();
});

// folder makes a reader's working folder: the clone's scripts copied in (a script runs its main() only when
// it is the file named, which a link would not be) and lib/ and node_modules/ linked, so the page's `npx tsx
// receiver.ts` runs the clone's code, while sources.json and inbox.db are the folder's own.
function folder(): string {
  const { dir, cleanup } = tempDir("inbox-docs-run-");
  folders.push(cleanup);
  for (const name of readdirSync(ROOT)) {
    if (name.endsWith(".ts")) copyFileSync(join(ROOT, name), join(dir, name));
    else if (["lib", "node_modules", "package.json"].includes(name)) symlinkSync(join(ROOT, name), join(dir, name));
  }
  return dir;
}

// shell runs one line of a page as a shell runs it, in the reader's folder; it must succeed.
function shell(line: string, cwd: string, env: NodeJS.ProcessEnv): string {
  const r = spawnSync("sh", ["-ec", line], { cwd, env: { ...process.env, ...env }, encoding: "utf8" });
  assert.equal(r.status, 0, `${line}\n${r.stdout}${r.stderr}`);
  return `${r.stdout}${r.stderr}`;
}

// background starts a line's command that the page runs with `&`, in a process group of its own.
function background(command: string, cwd: string, env: NodeJS.ProcessEnv): { child: ChildProcess; log: () => string } {
  const child = spawn("sh", ["-c", command], {
    cwd,
    env: { ...process.env, ...env },
    stdio: ["ignore", "pipe", "pipe"],
    detached: true,
  });
  started.push(child);
  let log = "";
  child.stdout!.on("data", (d) => (log += d));
  child.stderr!.on("data", (d) => (log += d));
  return { child, log: () => log };
}

// stop sends SIGTERM to a started command's group: npx, tsx and the Node that runs the script.
function stop(child: ChildProcess): void {
  try {
    process.kill(-child.pid!, "SIGTERM");
  } catch {
    // Gone already.
  }
}

// stopped stops a started command's group and resolves once every process of it is gone.
async function stopped(child: ChildProcess): Promise<void> {
  stop(child);
  const alive = () => {
    try {
      process.kill(-child.pid!, 0);
      return true;
    } catch {
      return false;
    }
  };
  await until("the command's processes stop", () => !alive(), 30_000);
}

// exports reads `export A=x B=y` lines into variables, each placeholder given a value of the test's own.
function exports(body: string, values: Record<string, string>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const line of body.split("\n").filter((l) => l.startsWith("export ")))
    for (const [, name, value] of line.matchAll(/(\w+)=(\S+)/g)) out[name!] = values[name!] ?? value!;
  return out;
}

// app is a destination that verifies each forward's Standard Webhooks signature and keeps what came.
async function app(
  secret: string,
): Promise<{ port: number; got: { id: string; headers: IncomingHttpHeaders; body: string }[] }> {
  const got: { id: string; headers: IncomingHttpHeaders; body: string }[] = [];
  const verifier = new Webhook(secret);
  const server = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      try {
        verifier.verify(body, req.headers as Record<string, string>);
      } catch {
        return void res.writeHead(401).end();
      }
      got.push({ id: String(req.headers["webhook-id"]), headers: req.headers, body });
      res.writeHead(204).end();
    });
  }).listen(0, "127.0.0.1");
  await once(server, "listening");
  after(() => server.close());
  return { port: (server.address() as { port: number }).port, got };
}

describe("the README's Stripe → your app, followed word for word", () => {
  it("stores Stripe's signed events once each and forwards each to the app, signed, once", async () => {
    const text = section(page("README.md"), "## Stripe → your app");
    const [sources, commands] = fences(text);
    assert.equal(sources!.lang, "json");
    assert.equal(commands!.lang, "sh");
    const dir = folder();
    const vars = exports(commands!.body, {});
    const dest = await app(vars.APP_SECRET!);
    const port = String(await freePort());
    writeFileSync(join(dir, "sources.json"), sources!.body.replace("127.0.0.1:3000", `127.0.0.1:${dest.port}`));
    const env = { ...vars, PORT: port };
    const lines = commands!.body.split("\n").filter((l) => l.trim() !== "" && !l.startsWith("export "));
    assert.equal(lines.length, 3, commands!.body);
    assert.match(shell(lines[0]!, dir, env), /Created an inbox at inbox\.db\.[\s\S]*Applied version 1/);
    const [receiver, worker] = lines[1]!
      .replace(/\s+#.*$/, "")
      .split("&")
      .map((c) => c.trim())
      .filter(Boolean)
      .map((c) => background(c, dir, env));
    await until("the receiver listens", () => /Listening on/.test(receiver!.log()), 30_000);
    const sent = shell(lines[2]!.replace(/\s+#.*$/, "").replace(":8000/", `:${port}/`), dir, env);
    assert.equal(sent, "evt_100: stored\nevt_100: duplicate\nevt_101: stored\nevt_100: duplicate\n");
    await until("both events forwarded", () => dest.got.length >= 2, 30_000);
    // Once each, whatever Stripe's retries: evt_100 came three times.
    assert.deepEqual(dest.got.map((g) => g.id).sort(), ["stripe:evt_100", "stripe:evt_101"]);
    // SIGTERM to each command's group (npx, tsx and the script): each script drains, says so, and is gone.
    await Promise.all([stopped(worker!.child), stopped(receiver!.child)]);
    assert.match(worker!.log(), /^worker: forwarded 2, 0 to retry, 0 set aside/m);
    assert.match(receiver!.log(), /SIGTERM: finishing the requests in flight, then stopping/);
  });
});

describe("docs/forwarding.md, followed word for word", { skip: opensslSkip() }, () => {
  it("its sources file, run as 'Running it' says, forwards to its Node app and over TLS to billing; 'Seeing it' runs", async () => {
    const text = page("docs/forwarding.md");
    const dir = folder();
    // The secrets the page leaves to the reader: each whsec_... a Standard Webhooks secret of this run's.
    const secret = (n: number) => `whsec_${Buffer.from(`docs-run secret number ${n} padded`).toString("base64")}`;
    const running = fences(section(text, "## Running it"))[0]!;
    const vars = exports(running.body, {
      STRIPE_WEBHOOK_SECRET: secret(1),
      APP_FORWARD_SECRET: secret(2),
      APP_FORWARD_SECRET_NEXT: secret(3),
      APP_TOKEN: "t0ken-of-the-app",
      BILLING_SECRET: secret(4),
      OPS_SECRET: secret(5),
    });
    assert.deepEqual(Object.keys(vars).sort(), [
      "APP_FORWARD_SECRET",
      "APP_FORWARD_SECRET_NEXT",
      "APP_TOKEN",
      "BILLING_SECRET",
      "OPS_SECRET",
      "STRIPE_WEBHOOK_SECRET",
    ]);
    // The app of "In your app", as the page shows it, on a free port.
    const appCode = fences(section(text, "## In your app")).find((f) => f.body.startsWith("// app.ts\n"))!;
    const appPort = await freePort();
    writeFileSync(join(dir, "app.ts"), appCode.body.replace(".listen(3000)", `.listen(${appPort})`));
    const theApp = background("node app.ts", dir, { APP_FORWARD_SECRET: vars.APP_FORWARD_SECRET! });
    // billing: over TLS, its certificate signed by the private CA the sources file names; $operator: plain.
    const certs = pki(dir);
    const billing: { headers: IncomingHttpHeaders; body: string }[] = [];
    const tls = createHttpsServer({ key: certs.key, cert: certs.cert }, (req, res) => {
      let body = "";
      req
        .on("data", (c) => (body += c))
        .on("end", () => {
          billing.push({ headers: req.headers, body });
          res.writeHead(204).end();
        });
    }).listen(0, "127.0.0.1");
    await once(tls, "listening");
    after(() => tls.close());
    const ops = await app(vars.OPS_SECRET!);
    const sources = fences(section(text, "## The sources file"))[0]!;
    assert.equal(sources.lang, "json");
    writeFileSync(
      join(dir, "sources.json"),
      sources.body
        .replace("https://app.internal/webhooks", `http://127.0.0.1:${appPort}/webhooks`)
        .replace(
          "https://billing.internal/hooks",
          `https://127.0.0.1:${(tls.address() as { port: number }).port}/hooks`,
        )
        .replace("https://ops.internal/inbox-events", `http://127.0.0.1:${ops.port}/inbox-events`)
        .replace("/etc/ssl/private-ca.pem", certs.caFile),
    );
    const port = String(await freePort());
    const env = { ...vars, PORT: port };
    const lines = running.body.split("\n").filter((l) => l.trim() !== "" && !l.startsWith("export "));
    assert.equal(lines.length, 2, running.body);
    const receiver = background(lines[0]!.replace(/\s*&$/, ""), dir, env);
    const worker = background(lines[1]!, dir, env);
    await until(`the receiver listens: ${receiver.log()}`, () => /Listening on/.test(receiver.log()), 30_000);
    await until("the app listens", async () => {
      try {
        return (await fetch(`http://127.0.0.1:${appPort}/`, { method: "POST", body: "{}" })).status === 401;
      } catch {
        return false;
      }
    });

    // Stripe sends an invoice (to app and billing) and a customer event (to app alone), signed.
    for (const [id, type] of [
      ["evt_1", "invoice.paid"],
      ["evt_2", "customer.created"],
    ] as const) {
      const body = JSON.stringify({ id, object: "event", type, data: { object: { id: `obj_${id}` } } }, null, 2);
      const headers = sign("stripe", vars.STRIPE_WEBHOOK_SECRET!, {
        id,
        body,
        timestampS: Math.floor(Date.now() / 1000),
      });
      const r = await fetch(`http://127.0.0.1:${port}/stripe`, {
        method: "POST",
        headers: { ...headers, "content-type": "application/json" },
        body,
      });
      assert.equal(`${r.status} ${await r.text()}`, "200 stored");
    }
    const handled = () => [...theApp.log().matchAll(/^handling (\S+)/gm)].map((m) => m[1]!).sort();
    await until("the app handled both", () => handled().length === 2, 30_000);
    assert.deepEqual(handled(), ["stripe:evt_1", "stripe:evt_2"]);
    await until("billing got the invoice", () => billing.length === 1, 30_000);
    assert.equal(billing[0]!.headers["inbox-delivery-id"], "evt_1");
    assert.match(
      String(billing[0]!.headers["stripe-signature"]),
      /^t=\d+,v1=/,
      "forwardHeaders: Stripe's own header along",
    );
    new Webhook(vars.BILLING_SECRET!).verify(billing[0]!.body, billing[0]!.headers as Record<string, string>);

    // "Seeing it", every line as written.
    const seeing = fences(section(text, "## Seeing it"))[0]!
      .body.split("\n")
      .filter((l) => l.trim() !== "");
    assert.ok(seeing.length >= 8, seeing.join("\n"));
    const said = seeing.map((line) => shell(line.replace(/\s+#.*$/, ""), dir, env));
    assert.match(said[0]!, /^app\s+closed/m);
    assert.match(said.at(-1)!, /^destination +app$/m);
    // The replay --to app sent both again; the app, keyed by webhook-id, handled each once.
    await until(
      "the replays reached the app",
      () =>
        /stripe:evt_2/.test(theApp.log()) &&
        worker
          .log()
          .split("\n")
          .filter((l) => / → app done/.test(l)).length >= 4,
      30_000,
    );
    assert.deepEqual(handled(), ["stripe:evt_1", "stripe:evt_2"]);
    await Promise.all([stopped(worker.child), stopped(receiver.child), stopped(theApp.child)]);
    assert.match(worker.log(), /^worker: forwarded \d+, 0 to retry, 0 set aside/m);
  });
});

const brokersDown = (await natsSkip()) || (await rabbitmqSkip());

describe("docs/brokers.md, followed word for word", { skip: brokersDown }, () => {
  const run = `${process.pid}${Math.random().toString(36).slice(2, 6)}`;
  // The names the pages give, made this run's own on the shared brokers: streams, subjects, queues, exchange.
  const rename = (text: string) =>
    text
      .replaceAll('"WEBHOOKS"', `"WH_${run}"`)
      .replaceAll("webhooks.{source}", `wh${run}.{source}`)
      .replaceAll('"exchange": "webhooks"', `"exchange": "webhooks_${run}"`)
      .replaceAll('"ORDERS"', `"ORD_${run}"`)
      .replaceAll("orders.", `ord${run}.`)
      .replaceAll('"queue": "billing"', `"queue": "billing_${run}"`);
  // Registered first, so it runs before the suites close their connections.
  after(async () => {
    await rabbit.channel?.deleteQueue(`billing_${run}`).catch(() => {});
    await rabbit.channel?.deleteExchange(`webhooks_${run}`).catch(() => {});
  });
  const jet = jetStreamSuite(NATS);
  const rabbit = rabbitSuite(RABBITMQ, `audit_${run}`);
  const text = page("docs/brokers.md");
  const running = fences(section(text, "## In the sources file")).find((f) => f.lang === "sh")!;
  const vars = exports(running.body, {
    STRIPE_SECRET: `whsec_${Buffer.from("docs-run brokers stripe secret").toString("base64")}`,
  });
  // A queue bound to the exchange, as a consumer of audit would have; every message it takes is kept here.
  const audit = async () => {
    await rabbit.channel.assertExchange(`webhooks_${run}`, "topic", { durable: false, autoDelete: false });
    await rabbit.channel.assertQueue(`audit_${run}`, { durable: false });
    await rabbit.channel.bindQueue(`audit_${run}`, `webhooks_${run}`, "#");
  };
  const audited = async () => {
    const got: string[] = [];
    for (let m = await rabbit.channel.get(`audit_${run}`); m; m = await rabbit.channel.get(`audit_${run}`)) {
      got.push(m.fields.routingKey);
      rabbit.channel.ack(m);
    }
    return got;
  };

  it("a broker as a destination: each Stripe event published once to the stream, each invoice to the exchange", async () => {
    const dir = folder();
    const [sources] = fences(section(text, "## In the sources file"));
    assert.equal(sources!.lang, "json");
    writeFileSync(join(dir, "sources.json"), rename(sources!.body));
    jet.made.push(`WH_${run}`);
    await jet.jsm.streams.add({ name: `WH_${run}`, subjects: [`wh${run}.>`] });
    await audit();
    const port = String(await freePort());
    const env = { ...vars, PORT: port };
    const [receiverLine, workerLine] = running.body
      .split("\n")
      .filter((l) => l.trim() !== "" && !l.startsWith("export "));
    const receiver = background(receiverLine!.replace(/\s*&$/, ""), dir, env);
    const worker = background(workerLine!, dir, env);
    await until(`the receiver listens: ${receiver.log()}`, () => /Listening on/.test(receiver.log()), 30_000);
    for (const [id, type] of [
      ["evt_b1", "invoice.paid"],
      ["evt_b2", "customer.created"],
    ] as const) {
      const body = JSON.stringify({ id, object: "event", type, data: { object: {} } });
      const headers = sign("stripe", vars.STRIPE_SECRET!, { id, body, timestampS: Math.floor(Date.now() / 1000) });
      const r = await fetch(`http://127.0.0.1:${port}/stripe`, { method: "POST", headers, body });
      assert.equal(`${r.status} ${await r.text()}`, "200 stored");
    }
    await until(
      `both published: ${worker.log()}`,
      async () => (await jet.jsm.streams.info(`WH_${run}`)).state.messages === 2,
      30_000,
    );
    let keys: string[] = [];
    await until(
      "the invoice in the exchange's queue",
      async () => (keys = [...keys, ...(await audited())]).length >= 1,
      30_000,
    );
    assert.deepEqual(keys, ["stripe.invoice.paid"]);
    await Promise.all([stopped(worker.child), stopped(receiver.child)]);
    assert.equal((await jet.jsm.streams.info(`WH_${run}`)).state.messages, 2, "each once, not again on the way out");
  });

  it("brokers as sources: a JetStream message and a RabbitMQ message handled once each by the page's handler.ts", async () => {
    const dir = folder();
    const part = section(text, "## Brokers as sources");
    const blocks = fences(part);
    const sources = blocks.find((f) => f.lang === "json")!;
    const handler = blocks.find((f) => f.lang === "ts" && f.body.startsWith("// handler.ts\n"))!;
    const commands = blocks.find((f) => f.lang === "sh")!;
    writeFileSync(join(dir, "sources.json"), rename(sources.body));
    writeFileSync(join(dir, "handler.ts"), handler.body);
    jet.made.push(`ORD_${run}`);
    await jet.jsm.streams.add({ name: `ORD_${run}`, subjects: [`ord${run}.>`] });
    await rabbit.channel.assertQueue(`billing_${run}`, { durable: true });
    await audit();
    await audited();
    const metricsPort = String(await freePort());
    const [consumerLine, workerLine] = commands.body.split("\n").filter((l) => l.trim() !== "");
    const consumer = background(consumerLine!.replace(/\s*&$/, "").replace("9465", metricsPort), dir, vars);
    const worker = background(workerLine!, dir, vars);
    await until(
      `the consumer serves its metrics: ${consumer.log()}`,
      async () => {
        try {
          return (await fetch(`http://127.0.0.1:${metricsPort}/livez`)).ok;
        } catch {
          return false;
        }
      },
      30_000,
    );
    const js = jetstream(jet.nc);
    await js.publish(`ord${run}.paid`, JSON.stringify({ order: "o1", total: 5 }), { msgID: "o1" });
    rabbit.channel.sendToQueue(`billing_${run}`, Buffer.from(JSON.stringify({ invoice: "b1" })), {
      headers: { "x-request-id": "b1" },
      contentType: "application/json",
    });
    const handled = () => [...worker.log().matchAll(/^handled (\S+): (.*)$/gm)].map((m) => `${m[1]} ${m[2]}`).sort();
    await until(`both handled: ${worker.log()}${consumer.log()}`, () => handled().length === 2, 30_000);
    assert.deepEqual(handled(), ['billing:b1 {"invoice":"b1"}', 'orders:o1 {"order":"o1","total":5}']);
    let keys: string[] = [];
    await until(
      "orders.paid at the audit exchange",
      async () => (keys = [...keys, ...(await audited())]).length >= 1,
      30_000,
    );
    assert.deepEqual(keys, [`orders.ord${run}.paid`]);
    await Promise.all([stopped(worker.child), stopped(consumer.child)]);
  });
});

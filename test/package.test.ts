// test/package.test.ts: the package as an app gets it. npm pack (which builds dist/ with tsc), then a fresh
// app installs the tarball with npm install (from the npm cache where it can), type-checks its own code
// against the package's declarations, mounts the handler in Express, serves a real request, and runs the
// worker and the CLI through npx webhook-inbox. The same app then runs on Deno and Bun where they are present.

import assert from "node:assert/strict";
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import {
  copyFileSync,
  existsSync,
  mkdirSync,
  readFileSync,
  readdirSync,
  rmSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { after, before, describe, it } from "node:test";
import { ROOT, freePort, runScript, runtimeBinary, tempDir } from "./helpers.ts";

// The app's own code: it imports only the package's names, as documented, and a misuse must not compile.
const APP = `// A fresh app that installed webhook-inbox from its tarball: the handler mounted in Express.
import express from "express";
import { connect, type Stored } from "webhook-inbox";
import { createWebhooks } from "webhook-inbox/webhooks";
// The module's first name, kept for the apps that import it: the same function.
import { createHandler } from "webhook-inbox/handler";
import { run, type Job, type RunStats } from "webhook-inbox/worker";
import { loadSources } from "webhook-inbox/providers";
import type { Transform } from "webhook-inbox/transform";

const inbox = await connect(process.argv[2] ?? "app.db");
const sources = loadSources({ shop: { provider: "plain" } }, process.env);
const app = express();
if (createHandler !== createWebhooks) throw new Error("webhook-inbox/handler is not webhook-inbox/webhooks");
app.use("/webhooks", createWebhooks({ inbox, sources }).express);
app.use(express.json());

// The declarations are the package's own, not any: a wrong option fails to compile, results are typed.
// @ts-expect-error inbox must be an Inbox
createWebhooks({ inbox: 42 });
// A transform is typed from the package: d is the delivery, and what it returns is checked.
export const reshape: Transform = (d) => (d.eventType === null ? null : { body: { id: d.id, attempt: d.attempt }, headers: { "x-app": "1" } });
// @ts-expect-error a header's value is a string, or null to remove it
export const wrong: Transform = () => ({ headers: { "x-app": 1 } });
const outcome: Stored = await inbox.store({ source: "boot", id: "typed", body: new TextEncoder().encode("{}") });
const seen: string[] = [];
const stats: RunStats = await run((job: Job) => void seen.push(\`\${job.delivery.source}/\${job.delivery.id}\`), { inbox, once: true, log: () => {} });

const server = app.listen(0, "127.0.0.1", () => {
  const address = server.address();
  console.log(\`\${outcome}, \${stats.done} done (\${seen.join(", ")}); Listening on http://127.0.0.1:\${typeof address === "object" && address ? address.port : 0}\`);
});
process.on("SIGTERM", () => server.close(() => void inbox.close().then(() => process.exit(0))));
`;

// The same handler on Deno's and Bun's own Fetch servers (Deno.serve, Bun.serve): each runtime's own HTTP
// server is the one thing that differs here, so the choice is made once, in this app.
const FETCH_APP = `import { connect } from "webhook-inbox";
import { createWebhooks } from "webhook-inbox/webhooks";

declare const Deno: { serve(o: { port: number; hostname: string; onListen(a: { port: number }): void }, h: (r: Request) => Promise<Response>): unknown } | undefined;
declare const Bun: { serve(o: { port: number; hostname: string; fetch: (r: Request) => Promise<Response> }): { port: number } } | undefined;
const inbox = await connect(process.argv[2]!);
const webhooks = createWebhooks({ inbox, basePath: "/webhooks" });
const listening = (port: number) => console.log(\`Listening on http://127.0.0.1:\${port}\`);
if (typeof Deno !== "undefined") Deno.serve({ port: 0, hostname: "127.0.0.1", onListen: ({ port }) => listening(port) }, webhooks.fetch);
else listening(Bun!.serve({ port: 0, hostname: "127.0.0.1", fetch: webhooks.fetch }).port);
process.on("SIGTERM", () => void inbox.close().then(() => process.exit(0)));
`;

// The app's dev dependencies, at the versions this repository's own lock file holds, so npm finds them
// in the cache npm ci filled.
const lock = JSON.parse(readFileSync(join(ROOT, "package-lock.json"), "utf8")) as {
  packages: Record<string, { version: string }>;
};
const pinned = (name: string) => `${name}@${lock.packages[`node_modules/${name}`]!.version}`;

// This Node first on PATH: npx, npm and the bin's `#!/usr/bin/env node` run on the project's Node 24.
const ENV = { ...process.env, PATH: `${dirname(process.execPath)}:${process.env.PATH}`, NO_COLOR: "1" };

function exec(
  command: string,
  args: string[],
  cwd: string,
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { cwd, env: ENV, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d) => (stdout += d));
    child.stderr.on("data", (d) => (stderr += d));
    child.on("error", reject);
    child.on("close", (code) => resolve({ code, stdout, stderr }));
  });
}

// startApp runs app.ts under a runtime and waits for its Listening line.
async function startApp(
  command: string,
  args: string[],
  cwd: string,
): Promise<{ child: ChildProcess; url: string; line: string; stop: () => Promise<number | null> }> {
  const child = spawn(command, args, { cwd, env: ENV, stdio: ["ignore", "pipe", "pipe"] });
  let stderr = "";
  child.stderr!.on("data", (d) => (stderr += d));
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
  const line = await new Promise<string>((resolve, reject) => {
    createInterface({ input: child.stdout! }).on("line", (line) => {
      if (/Listening on http:\/\/\S+/.test(line)) resolve(line);
    });
    void exited.then((code) => reject(new Error(`the app exited with ${code} before listening: ${stderr}`)));
  });
  const url = /Listening on (http:\/\/\S+)/.exec(line)![1]!;
  return { child, url, line, stop: async () => (process.kill(child.pid!, "SIGTERM"), exited) };
}

const post = async (url: string, id: string) =>
  (
    await fetch(`${url}/webhooks/shop`, {
      method: "POST",
      headers: { "x-delivery-id": id },
      body: JSON.stringify({ customer: "Ann", amount: 5 }),
    })
  ).text();

const BINARIES = {
  deno: runtimeBinary("deno", "the installed package's tests on deno"),
  bun: runtimeBinary("bun", "the installed package's tests on bun"),
};

// An app's strict tsconfig for one file; no skipLibCheck, so the package's declarations are checked too.
const tsconfig = (file: string) =>
  JSON.stringify({
    compilerOptions: {
      target: "es2024",
      module: "nodenext",
      moduleResolution: "nodenext",
      strict: true,
      noEmit: true,
      verbatimModuleSyntax: true,
      erasableSyntaxOnly: true,
      types: ["node"],
    },
    files: [file],
  });

let work: { dir: string; cleanup: () => void };
let app: string;
let tarball: string;

before(async () => {
  work = tempDir("inbox-package-");
  const packed = await exec("npm", ["pack", "--pack-destination", work.dir], ROOT);
  assert.equal(packed.code, 0, packed.stderr);
  tarball = join(work.dir, readdirSync(work.dir).find((f) => f.endsWith(".tgz"))!);
  app = join(work.dir, "app");
  mkdirSync(app);
  writeFileSync(join(app, "package.json"), JSON.stringify({ name: "an-app", private: true, type: "module" }));
  writeFileSync(join(app, "app.ts"), APP);
  writeFileSync(join(app, "fetch-app.ts"), FETCH_APP);
  writeFileSync(join(app, "tsconfig.json"), tsconfig("app.ts"));
  const installed = await exec(
    "npm",
    [
      "install",
      "--prefer-offline",
      "--no-audit",
      "--no-fund",
      tarball,
      pinned("express"),
      pinned("@types/express"),
      pinned("@types/node"),
    ],
    app,
  );
  assert.equal(installed.code, 0, installed.stderr);
});
after(() => work?.cleanup());

describe("npm pack", () => {
  it("makes a package named webhook-inbox, not private, with the command and the documented entry points", () => {
    const manifest = JSON.parse(readFileSync(join(app, "node_modules", "webhook-inbox", "package.json"), "utf8"));
    assert.equal(manifest.name, "webhook-inbox");
    assert.equal(manifest.private, undefined);
    assert.deepEqual(manifest.bin, { "webhook-inbox": "dist/cli.js" });
    for (const entry of [".", "./webhooks", "./handler", "./worker", "./providers", "./transform"])
      assert.ok(manifest.exports[entry]?.types, entry);
    // Only what an app runs: the compiled code and its declarations, no tests, no benchmarks, no TypeScript sources.
    const dist = join(app, "node_modules", "webhook-inbox", "dist");
    const files = readdirSync(dist, { recursive: true, encoding: "utf8" }).filter(
      (f) => !statSync(join(dist, f)).isDirectory(),
    );
    assert.deepEqual(
      files.filter((f) => !/\.(js|d\.ts)$/.test(f)),
      [],
    );
    assert.ok(files.includes("inbox.js") && files.includes("inbox.d.ts"));
    // QuickJS in WebAssembly (its core and its release build) is the transforms' sandbox (issue 48).
    assert.deepEqual(Object.keys(manifest.dependencies).sort(), [
      "@asteasolutions/zod-to-openapi",
      "@jitl/quickjs-wasmfile-release-sync",
      "@opentelemetry/api",
      "commander",
      "pg",
      "prom-client",
      "quickjs-emscripten-core",
      "re2js",
      "undici",
      "zod",
    ]);
    // The broker clients and the SDKs reconcile asks Stripe and GitHub through are optional peers: installed
    // by whoever publishes into a broker, or reconciles from that provider, by no one else.
    const peers = [
      "@nats-io/jetstream",
      "@nats-io/transport-node",
      "@octokit/auth-app",
      "@octokit/rest",
      "amqplib",
      "stripe",
    ];
    assert.deepEqual(Object.keys(manifest.peerDependencies).sort(), peers);
    for (const name of peers) assert.deepEqual(manifest.peerDependenciesMeta[name], { optional: true }, name);
    // The alert rules and the dashboard ship with it (docs/observability.md, docs/production.md).
    for (const file of ["alerts.yml", "dashboard.json"])
      assert.ok(existsSync(join(app, "node_modules", "webhook-inbox", "ops", file)), `ops/${file}`);
  });
});

describe("an app that installed the tarball", () => {
  it("type-checks against the package's declarations (a misuse fails to compile)", async () => {
    const tsc = await exec(join(ROOT, "node_modules", ".bin", "tsc"), ["-p", "."], app);
    assert.equal(tsc.code, 0, tsc.stdout + tsc.stderr);
  });

  it("(control) the same check fails once the misuse is no longer expected to", async () => {
    writeFileSync(join(app, "wrong.ts"), APP.replace("// @ts-expect-error inbox must be an Inbox\n", ""));
    writeFileSync(join(app, "tsconfig.wrong.json"), tsconfig("wrong.ts"));
    try {
      const tsc = await exec(join(ROOT, "node_modules", ".bin", "tsc"), ["-p", "tsconfig.wrong.json"], app);
      assert.notEqual(tsc.code, 0);
      assert.match(
        tsc.stdout,
        /^wrong\.ts\(\d+,\d+\): error TS2322: Type 'number' is not assignable to type '.*Inbox.*'/m,
      );
      assert.equal(tsc.stdout.trim().split("\n").length, 1, tsc.stdout);
    } finally {
      rmSync(join(app, "wrong.ts"));
      rmSync(join(app, "tsconfig.wrong.json"));
    }
  });

  it("serves a real request through the handler mounted in Express, on Node", async () => {
    const served = await startApp(process.execPath, ["app.ts", "node.db"], app);
    try {
      // connect() and run() from the package, before the first request: the app's own delivery, handled.
      assert.match(served.line, /^stored, 1 done \(boot\/typed\); Listening on /);
      assert.equal(await post(served.url, "evt_1"), "stored");
      assert.equal(await post(served.url, "evt_1"), "duplicate");
    } finally {
      assert.equal(await served.stop(), 0);
    }
  });

  it("runs the worker and the CLI through npx webhook-inbox", async () => {
    const worker = await exec("npx", ["webhook-inbox", "worker", "--once", "--db", "node.db"], app);
    assert.equal(worker.code, 0, worker.stderr);
    assert.match(worker.stderr, /^shop\/evt_1 done$/m);
    const status = await exec("npx", ["webhook-inbox", "inbox", "status", "--db", "node.db"], app);
    assert.equal(status.code, 0, status.stderr);
    assert.match(status.stdout, /^done {7}2$/m); // evt_1, and the app's own typed store at start
  });

  it("installs no broker client, and a worker or consumer whose sources file names a broker stops at start-up with one line saying what to install", async () => {
    for (const name of ["amqplib", "@nats-io/transport-node", "@nats-io/jetstream"])
      assert.ok(!existsSync(join(app, "node_modules", name)), `${name} was installed`);
    for (const [type, install] of [
      ["rabbitmq", "npm install amqplib"],
      ["nats", "npm install @nats-io/transport-node @nats-io/jetstream"],
    ] as const) {
      const settings =
        type === "nats"
          ? { type, subject: "webhooks.{source}", stream: "WEBHOOKS" }
          : { type, exchange: "webhooks", routingKey: "{source}" };
      writeFileSync(
        join(app, `${type}.json`),
        JSON.stringify({
          $destinations: { events: settings },
          shop: { provider: "plain", routes: ["handler", "events"] },
        }),
      );
      const worker = await exec(
        "npx",
        ["webhook-inbox", "worker", "--once", "--db", "brokers.db", "--sources", `${type}.json`],
        app,
      );
      assert.equal(worker.code, 2, worker.stderr);
      assert.equal(worker.stderr.trim().split("\n").length, 1, worker.stderr);
      assert.ok(worker.stderr.trim().endsWith(install), worker.stderr);
      // The same for the consumer of a broker source.
      const broker =
        type === "nats"
          ? { type, url: "nats://127.0.0.1:4222", stream: "ORDERS", consumer: "inbox" }
          : { type, url: "amqp://127.0.0.1:5672", queue: "orders" };
      writeFileSync(join(app, `${type}-source.json`), JSON.stringify({ orders: { broker } }));
      const consumer = await exec(
        "npx",
        ["webhook-inbox", "consumer", "--db", "brokers.db", "--sources", `${type}-source.json`],
        app,
      );
      assert.equal(consumer.code, 2, consumer.stderr);
      assert.equal(consumer.stderr.trim().split("\n").length, 1, consumer.stderr);
      assert.ok(consumer.stderr.includes('source "orders" consumes'), consumer.stderr);
      assert.ok(consumer.stderr.trim().endsWith(install), consumer.stderr);
    }
  });

  it("answers each command's --help as the script does, in the words of the package's command, and --version", async () => {
    for (const command of ["receiver", "worker", "consumer", "inbox", "admin"]) {
      const [installed, script] = await Promise.all([
        exec("npx", ["webhook-inbox", command, "--help"], app),
        runScript(`${command}.ts`, ["--help"]),
      ]);
      assert.equal(installed.code, 0, `${command}: ${installed.stderr}`);
      // The same options; the usage line and the examples name what the user runs here.
      assert.match(script.stdout, new RegExp(`^Usage: ${command}\\.ts `, "m"));
      assert.match(installed.stdout, new RegExp(`^Usage: webhook-inbox ${command} `, "m"));
      assert.doesNotMatch(installed.stdout, /npx tsx|\b(receiver|worker|inbox|admin)\.ts\b/, command);
      assert.match(installed.stdout, new RegExp(`^  npx webhook-inbox ${command}\\b`, "m"), command);
      const options = (help: string) =>
        help.slice(help.indexOf("Options:"), help.indexOf("\n\n", help.indexOf("Options:")));
      assert.equal(options(installed.stdout), options(script.stdout), command);
      const version = await exec("npx", ["webhook-inbox", command, "--version"], app);
      assert.equal(version.stdout, "0.1.0\n", command);
    }
    const version = await exec("npx", ["webhook-inbox", "--version"], app);
    assert.equal(`${version.code} ${version.stdout}`, "0 0.1.0\n");
    const unknown = await exec("npx", ["webhook-inbox", "sender"], app);
    assert.equal(unknown.code, 2);
    assert.equal(
      unknown.stderr,
      "webhook-inbox: unknown command sender (receiver, worker, consumer, inbox, admin; run with --help for usage)\n",
    );
  });

  for (const name of ["deno", "bun"] as const) {
    const binary = BINARIES[name];
    // Deno reads the app's package.json and node_modules as they are; `deno run -A npm:webhook-inbox` and
    // `bunx --bun webhook-inbox` run the package's command on the runtime itself, not on the bin's Node.
    const cli = name === "deno" ? ["run", "-A", "npm:webhook-inbox"] : ["x", "--bun", "webhook-inbox"];
    it(`serves the same app and runs the worker through the package's command on ${name}`, {
      skip: binary ? false : `no ${name}`,
    }, async () => {
      const db = `${name}.db`;
      const served = await startApp(binary!, [...(name === "deno" ? ["run", "-A"] : []), "app.ts", db], app);
      try {
        assert.match(served.line, /^stored, 1 done \(boot\/typed\); Listening on /);
        assert.equal(await post(served.url, "evt_1"), "stored");
        assert.equal(await post(served.url, "evt_1"), "duplicate");
      } finally {
        assert.equal(await served.stop(), 0);
      }
      const worker = await exec(binary!, [...cli, "worker", "--once", "--db", db], app);
      assert.equal(worker.code, 0, worker.stderr);
      assert.match(worker.stderr, /^shop\/evt_1 done$/m);
    });

    it(`serves the handler's fetch on ${name}'s own server (${name === "deno" ? "Deno.serve" : "Bun.serve"})`, {
      skip: binary ? false : `no ${name}`,
    }, async () => {
      const served = await startApp(
        binary!,
        [...(name === "deno" ? ["run", "-A"] : []), "fetch-app.ts", `${name}-fetch.db`],
        app,
      );
      try {
        const send = async (id: string) =>
          (
            await fetch(`${served.url}/webhooks`, { method: "POST", headers: { "x-delivery-id": id }, body: "{}" })
          ).text();
        assert.equal(await send("evt_1"), "stored");
        assert.equal(await send("evt_1"), "duplicate");
        const repeated = await fetch(`${served.url}/webhooks`, {
          method: "POST",
          headers: [
            ["x-delivery-id", "a"],
            ["x-delivery-id", "b"],
          ],
          body: "{}",
        });
        assert.equal(repeated.status, 400, await repeated.text());
      } finally {
        assert.equal(await served.stop(), 0);
      }
    });
  }

  it("type-checks the same app under Deno's own checker, where Deno is present", {
    skip: BINARIES.deno ? false : "no deno",
  }, async () => {
    const checked = await exec(BINARIES.deno!, ["check", "app.ts"], app);
    assert.equal(checked.code, 0, checked.stdout + checked.stderr);
  });
});

// The README's "In your app", word for word: its shell blocks run as written (npm's own settings, from the
// environment, keep it off the network where the cache has the packages), its files written as shown.
const README = readFileSync(join(ROOT, "README.md"), "utf8");
const firstApp = README.slice(README.indexOf("## In your app\n"), README.indexOf("## What it guarantees"));
const fences = [...firstApp.matchAll(/^```(\w+)\n([\s\S]*?)^```$/gm)].map((m) => ({ lang: m[1]!, body: m[2]! }));
// A newcomer's machine: its own Node (20 here), its npm, nothing of this repository's on PATH.
const SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
const NEWCOMER = {
  ...process.env,
  PATH: SYSTEM_PATH,
  NO_COLOR: "1",
  npm_config_prefer_offline: "true",
  npm_config_audit: "false",
  npm_config_fund: "false",
  npm_config_update_notifier: "false",
};
const SYSTEM_NODE = ["/usr/local/bin/node", "/usr/bin/node"].find(
  (p) => existsSync(p) && spawnSync(p, ["--version"], { encoding: "utf8" }).stdout.startsWith("v20."),
);

function sh(script: string, cwd: string, env: NodeJS.ProcessEnv = NEWCOMER) {
  return spawnSync("sh", ["-ec", script], { cwd, env, encoding: "utf8", timeout: 240_000 });
}

describe("the README's first app, followed word for word from an empty folder", () => {
  let home: string;
  let myApp: string;
  before(() => {
    home = join(work.dir, "newcomer");
    // The clone: the README's `npm pack` in it; the tarball is the one packed above, by the same command.
    assert.equal(fences[0]!.body.replace(/\s*#.*$/gm, "").trim(), "npm pack");
    mkdirSync(join(home, "webhook-inbox"), { recursive: true });
    copyFileSync(tarball, join(home, "webhook-inbox", "webhook-inbox-0.1.0.tgz"));
  });

  it("makes the app as the README says: npm init -y, type module, the tarball, Node 24 beside it", () => {
    const setup = fences[1]!;
    assert.equal(setup.lang, "sh");
    assert.match(setup.body, /npm init -y/);
    const r = sh(setup.body, home);
    assert.equal(r.status, 0, r.stderr);
    myApp = join(home, "my-app");
    const manifest = JSON.parse(readFileSync(join(myApp, "package.json"), "utf8"));
    assert.equal(manifest.type, "module");
    assert.ok(manifest.dependencies["webhook-inbox"]);
    assert.ok(manifest.devDependencies.node);
  });

  it("serves the README's server.ts, runs its handler.ts in the worker, and shows the status it says", async () => {
    const [sources, server, handler, run] = fences.slice(2);
    assert.equal(sources!.lang, "json");
    writeFileSync(join(myApp, "sources.json"), sources!.body);
    writeFileSync(join(myApp, "server.ts"), server!.body);
    writeFileSync(join(myApp, "handler.ts"), handler!.body);
    const lines = run!.body.trim().split("\n");
    assert.equal(lines[0], "npx node server.ts &");
    const port = String(await freePort());
    // A process group of its own: npx, and the Node it starts, are stopped together.
    const started = spawn("npx", ["node", "server.ts"], {
      cwd: myApp,
      env: { ...NEWCOMER, PORT: port },
      stdio: ["ignore", "pipe", "pipe"],
      detached: true,
    });
    const exited = new Promise((resolve) => started.on("exit", resolve));
    try {
      await new Promise<void>((resolve, reject) => {
        let err = "";
        started.stderr!.on("data", (d) => (err += d));
        createInterface({ input: started.stdout! }).on("line", (l) => {
          if (l === `Listening on http://127.0.0.1:${port}`) resolve();
        });
        started.on("exit", (code) => reject(new Error(`server.ts exited with ${code}: ${err}`)));
      });
      for (const line of lines.slice(1)) {
        const [command, expected] = line.split(/\s+#\s+/);
        const r = sh(command!.replaceAll("8000", port), myApp);
        assert.equal(r.status, 0, `${command}: ${r.stderr}`);
        assert.ok(
          `${r.stdout}${r.stderr}`.includes(expected!.trim()),
          `${command}: expected ${expected}, got ${r.stdout}${r.stderr}`,
        );
      }
    } finally {
      process.kill(-started.pid!, "SIGTERM");
      await exited;
    }
    // Loopback only, as the receiver: the port is not open on another address of this machine.
    assert.match(server!.body, /\.listen\(port, "127\.0\.0\.1", /);
  });

  it("stops with one line and exit 2 on the machine's Node 20, naming Node 24 and how to get it: the bin, the handler's module, connect()", {
    skip: SYSTEM_NODE ? false : "no Node 20 on this machine",
  }, () => {
    for (const [what, args] of [
      ["the bin", [join(myApp, "node_modules", "webhook-inbox", "dist", "cli.js"), "inbox", "status"]],
      ["the handler's module", ["--input-type=module", "-e", 'await import("webhook-inbox/handler");']],
      [
        "connect()",
        ["--input-type=module", "-e", 'const { connect } = await import("webhook-inbox"); await connect("x.db");'],
      ],
      [
        "the worker's module",
        [
          "--input-type=module",
          "-e",
          'const { connect } = await import("webhook-inbox"); await import("webhook-inbox/worker"); await connect("x.db");',
        ],
      ],
    ] as const) {
      const r = spawnSync(SYSTEM_NODE!, args, { cwd: myApp, env: NEWCOMER, encoding: "utf8" });
      assert.equal(r.status, 2, `${what}: ${r.stderr}`);
      assert.equal(r.stderr.trim().split("\n").length, 1, `${what}: ${r.stderr}`);
      assert.match(
        r.stderr,
        /^webhook-inbox needs Node 24 \(for node:sqlite\); this is Node 20\.\S+ Install it into your app with npm install --save-dev node@24, then run npx webhook-inbox/,
        what,
      );
    }
    // (control) The same bin on the app's Node 24, through npx, runs.
    const ok = sh("npx webhook-inbox inbox status", myApp);
    assert.equal(ok.status, 0, ok.stderr);
  });
});

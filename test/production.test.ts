// test/production.test.ts: docs/production.md's systemd units, run. Every ```ini block that opens with
// `# /etc/…` is a file of the page; each unit's ExecStart is run with its own flags, its EnvironmentFile
// (the page's env file) and its WorkingDirectory, with the install's paths moved into a temp folder: the
// installed `webhook-inbox` command becomes this repository's cli.ts under tsx, the ports free ones. The
// receiver takes a signed delivery, the worker does it, the page answers, the backup unit writes a checked
// backup, the consumer consumes a JetStream source, and each long-running unit drains and exits 0 on SIGTERM. systemd-analyze verifies each unit
// where it is installed.

import assert from "node:assert/strict";
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { DatabaseSync } from "node:sqlite";
import { after, before, describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { jetstreamManager } from "@nats-io/jetstream";
import { connect as natsConnect } from "@nats-io/transport-node";
import { sign } from "../lib/providers.ts";
import { check } from "../lib/sqlite/backup.ts";
import { NATS, natsSkip, ROOT, freePort, tempDir } from "./helpers.ts";

const PAGE = readFileSync(join(ROOT, "docs", "production.md"), "utf8");
const INSTALLED = "/opt/webhook-inbox/node_modules/.bin/webhook-inbox";

/** files are the page's ```ini blocks, by the path each one's first line names. */
const files = new Map<string, string>();
for (const m of PAGE.matchAll(/^```ini\n# (\/\S+)\n([\s\S]*?)^```$/gm)) files.set(m[1]!, m[2]!);
const sourcesJson = /^```json\n([\s\S]*?)^```$/m.exec(PAGE)?.[1];

const { dir, cleanup } = tempDir("inbox-production-");
after(cleanup);
// The install's folders, each moved under the temp folder.
const MOVED: [string, string][] = [
  ["/var/lib/webhook-inbox", join(dir, "var-lib")],
  ["/var/backups/webhook-inbox", join(dir, "backups")],
  ["/etc/webhook-inbox", join(dir, "etc")],
];
const moved = (text: string) => MOVED.reduce((t, [from, to]) => t.split(from).join(to), text);

/** setting reads one key of a unit (the last, as systemd does). */
function setting(unit: string, key: string): string | undefined {
  return [...unit.matchAll(new RegExp(`^${key}=(.*)$`, "gm"))].at(-1)?.[1]?.trim();
}

let env: Record<string, string> = {};
const ports = new Map<string, string>();

before(async () => {
  for (const [, to] of MOVED) mkdirSync(to, { recursive: true });
  const envFile = files.get("/etc/webhook-inbox/env");
  assert.ok(envFile, "the page shows the environment file");
  env = Object.fromEntries(
    envFile
      .split("\n")
      .filter((l) => /^[A-Z_]+=/.test(l))
      .map((l) => [l.slice(0, l.indexOf("=")), moved(l.slice(l.indexOf("=") + 1))]),
  );
  assert.ok(sourcesJson, "the page shows the sources file");
  writeFileSync(env.INBOX_SOURCES!, sourcesJson);
  // The page's fixed ports, each given a free one here.
  for (const port of ["8000", "8001", "9464", "9465"]) ports.set(port, String(await freePort()));
  env.PORT = ports.get(env.PORT!) ?? env.PORT!;
});

/** command turns a unit's ExecStart into what runs here: the installed command is cli.ts under tsx. */
function command(unit: string, extra: NodeJS.ProcessEnv = {}): { argv: string[]; cwd: string; env: NodeJS.ProcessEnv } {
  const line = setting(unit, "ExecStart");
  assert.ok(line, "the unit has an ExecStart");
  const words = moved(line)
    .split(/\s+/)
    .map((w) => ports.get(w) ?? w);
  assert.equal(words[0], INSTALLED, "the unit runs the installed webhook-inbox command");
  assert.equal(setting(unit, "EnvironmentFile"), "/etc/webhook-inbox/env");
  const cwd = moved(setting(unit, "WorkingDirectory") ?? "/var/lib/webhook-inbox");
  return {
    argv: ["--import", import.meta.resolve("tsx"), join(ROOT, "cli.ts"), ...words.slice(1)],
    cwd,
    env: { ...process.env, ...env, ...extra },
  };
}

interface Running {
  child: ChildProcess;
  /** The first line of stdout or stderr that matches, once it comes. */
  line(pattern: RegExp): Promise<string>;
  output(): string;
  exited: Promise<number | null>;
}
function start(unit: string, extra: NodeJS.ProcessEnv = {}): Running {
  const { argv, cwd, env: vars } = command(unit, extra);
  const child = spawn(process.execPath, argv, { cwd, env: vars, stdio: ["ignore", "pipe", "pipe"] });
  const lines: string[] = [];
  const waiting: { pattern: RegExp; resolve: (l: string) => void }[] = [];
  for (const stream of [child.stdout!, child.stderr!]) {
    createInterface({ input: stream }).on("line", (l) => {
      lines.push(l);
      for (const w of waiting.filter((x) => x.pattern.test(l))) w.resolve(l);
    });
  }
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
  return {
    child,
    exited,
    output: () => lines.join("\n"),
    line: (pattern) =>
      new Promise((resolve, reject) => {
        const seen = lines.find((l) => pattern.test(l));
        if (seen) return resolve(seen);
        waiting.push({ pattern, resolve });
        void exited.then((code) => reject(new Error(`exited with ${code} before ${pattern}: ${lines.join("\n")}`)));
      }),
  };
}

const unit = (name: string) => {
  const text = files.get(`/etc/systemd/system/${name}`);
  assert.ok(text, `the page shows ${name}`);
  return text;
};

describe("docs/production.md's systemd units, run as written", () => {
  it("show the environment file, the sources file, and a unit for the receiver, the worker, the consumer, the page and the backups", () => {
    assert.deepEqual([...files.keys()].filter((p) => p.startsWith("/etc/systemd/")).sort(), [
      "/etc/systemd/system/webhook-inbox-admin.service",
      "/etc/systemd/system/webhook-inbox-backup.service",
      "/etc/systemd/system/webhook-inbox-backup.timer",
      "/etc/systemd/system/webhook-inbox-consumer.service",
      "/etc/systemd/system/webhook-inbox-receiver.service",
      "/etc/systemd/system/webhook-inbox-worker.service",
    ]);
  });

  it("receive a signed delivery, do it, serve the page, back it up, and drain on SIGTERM", async () => {
    const receiver = start(unit("webhook-inbox-receiver.service"));
    const worker = start(unit("webhook-inbox-worker.service"));
    const admin = start(unit("webhook-inbox-admin.service"));
    try {
      const url = /Listening on (http:\/\/[^\s"]+)/.exec(await receiver.line(/Listening on/))![1]!;
      const body = JSON.stringify({
        id: "evt_prod_1",
        object: "event",
        type: "payment.succeeded",
        customer: "Ann",
        amount: 5,
      });
      const headers = {
        "content-type": "application/json",
        ...sign("stripe", env.STRIPE_WEBHOOK_SECRET!, {
          id: "evt_prod_1",
          body,
          timestampS: Math.floor(Date.now() / 1000),
        }),
      };
      const res = await fetch(`${url}/stripe`, { method: "POST", headers, body });
      assert.equal(`${res.status} ${await res.text()}`, "200 stored");
      // The secret came from the environment file: a wrong one is refused.
      const forged = await fetch(`${url}/stripe`, {
        method: "POST",
        headers: { ...headers, "stripe-signature": "t=1,v1=00" },
        body,
      });
      assert.equal(forged.status, 401);

      await worker.line(/Metrics on/);
      const metrics = await fetch(`http://127.0.0.1:${ports.get("9464")}/metrics`);
      assert.equal(metrics.status, 200);
      const db = env.INBOX_DB!;
      for (let status = ""; status !== "done"; await sleep(50)) {
        const conn = new DatabaseSync(db, { readOnly: true });
        status = (conn.prepare("SELECT status FROM deliveries WHERE id = 'evt_prod_1'").get() as { status: string })
          .status;
        conn.close();
        assert.notEqual(status, "failed", worker.output());
      }

      await admin.line(/http:\/\/127\.0\.0\.1/);
      const page = await fetch(`http://127.0.0.1:${ports.get("8001")}/`);
      assert.equal(page.status, 200);

      const backup = start(unit("webhook-inbox-backup.service"));
      assert.equal(await backup.exited, 0, backup.output());
      const made = readdirSync(join(dir, "backups"));
      assert.equal(made.length, 1);
      assert.equal(check(join(dir, "backups", made[0]!)).counts.done, 1, "the backup holds the delivery, done");
    } finally {
      for (const r of [receiver, worker, admin]) r.child.kill("SIGTERM");
    }
    assert.equal(await receiver.exited, 0, receiver.output());
    assert.equal(await worker.exited, 0, worker.output());
    assert.equal(await admin.exited, 0, admin.output());
  });

  it("consume a broker source with the consumer unit, serve its metrics, and drain on SIGTERM; with no broker source it exits 2", async (t) => {
    const none = start(unit("webhook-inbox-consumer.service"));
    assert.equal(await none.exited, 2, none.output());
    assert.match(none.output(), /no source has a "broker" to consume/);
    if (await natsSkip()) return t.skip("no NATS JetStream");
    const nc = await natsConnect({ servers: NATS, reconnect: false });
    const jsm = await jetstreamManager(nc);
    const stream = `PROD_${Math.random().toString(36).slice(2, 8).toUpperCase()}`;
    await jsm.streams.add({ name: stream, subjects: [`${stream.toLowerCase()}.>`] });
    const sources = join(dir, "etc", "brokers.json");
    writeFileSync(
      sources,
      JSON.stringify({ orders: { broker: { type: "nats", url: NATS, stream, consumer: "inbox" } } }),
    );
    const consumer = start(unit("webhook-inbox-consumer.service"), { INBOX_SOURCES: sources });
    try {
      const url = `http://127.0.0.1:${ports.get("9465")}`;
      let ready = 0;
      for (let i = 0; i < 200 && ready !== 200; i++, await sleep(50))
        ready = await fetch(`${url}/readyz`).then(
          (r) => r.status,
          () => 0,
        );
      assert.equal(ready, 200, consumer.output());
      assert.match(await (await fetch(`${url}/metrics`)).text(), /inbox_consumed_total/);
    } finally {
      consumer.child.kill("SIGTERM");
      assert.equal(await consumer.exited, 0, consumer.output());
      await jsm.streams.delete(stream).catch(() => {});
      await nc.close();
    }
  });

  it("pass systemd-analyze verify", (t) => {
    if (!existsSync(ANALYZE)) return t.skip("systemd-analyze is not installed");
    const names = [...files.keys()].filter((p) => p.startsWith("/etc/systemd/")).map((p) => p.split("/").at(-1)!);
    assert.deepEqual(verify(Object.fromEntries(names.map((name) => [name, unit(name)]))), []);
  });
});

const ANALYZE = "/usr/bin/systemd-analyze";
// verify writes units to a folder of their own and returns what systemd-analyze says of them. Only the
// command's path is swapped, for one that exists here: systemd checks that it does.
function verify(units: Record<string, string>): string[] {
  const folder = join(dir, `units-${Object.keys(units).length}-${Math.random().toString(36).slice(2)}`);
  mkdirSync(folder, { recursive: true });
  for (const [name, text] of Object.entries(units))
    writeFileSync(join(folder, name), text.split(INSTALLED).join("/usr/bin/env"));
  const r = spawnSync(ANALYZE, ["verify", ...Object.keys(units).map((n) => join(folder, n))], { encoding: "utf8" });
  return `${r.stdout}${r.stderr}`.split("\n").filter((l) => l.trim() !== "");
}

describe("the units' checks (a control)", () => {
  it("a flag the command does not have stops the unit with exit 2, and systemd-analyze reports an unknown key", async (t) => {
    const wrong = unit("webhook-inbox-receiver.service").replace(/^(ExecStart=.*)$/m, "$1 --no-such-flag");
    const r = start(wrong);
    assert.equal(await r.exited, 2, r.output());
    if (!existsSync(ANALYZE)) return t.skip("systemd-analyze is not installed");
    const complaints = verify({
      "webhook-inbox-receiver.service": unit("webhook-inbox-receiver.service").replace(
        "[Service]\n",
        "[Service]\nRestartt=always\n",
      ),
    });
    assert.ok(
      complaints.some((l) => /Unknown key/.test(l)),
      complaints.join("\n"),
    );
  });
});

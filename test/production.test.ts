// test/production.test.ts: docs/production.md, run. Its set-up commands run as written, as root, with the
// install's paths moved into a temp folder and a user of the test's own (removed after): the user, the
// folders and their owners, Node 24 and the packed package installed. Every ```ini block that opens with
// `# /etc/…` is a file of the page, and the ```ts block that opens with `// /opt/…` the handler; each
// unit's ExecStart runs the installed `webhook-inbox` command as that user, with the unit's PATH, its
// EnvironmentFile and its WorkingDirectory, the ports free ones. The receiver takes a signed delivery, the
// worker's handler does it, the page answers, the backup unit writes a checked backup readable by the
// user alone, and each long-running unit drains and exits 0 on SIGTERM. systemd-analyze verifies each unit
// where it is installed. Then the page's own commands run as written, through sudo as that user with the
// environment file (init, config apply, keys, a restore, a drill, an upgrade), from a root shell whose PATH
// finds the system's Node 20; the control, the file without PATH, exits 2 on it.

import assert from "node:assert/strict";
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { chmodSync, existsSync, mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { DatabaseSync } from "node:sqlite";
import { after, before, describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { sign } from "../lib/providers.ts";
import { check } from "../lib/sqlite/backup.ts";
import { ROOT, freePort, tempDir } from "./helpers.ts";

const PAGE = readFileSync(join(ROOT, "docs", "production.md"), "utf8");
const INSTALLED = "/opt/webhook-inbox/node_modules/.bin/webhook-inbox";

/** files are the page's ```ini blocks, by the path each one's first line names. */
const files = new Map<string, string>();
for (const m of PAGE.matchAll(/^```ini\n# (\/\S+)\n([\s\S]*?)^```$/gm)) files.set(m[1]!, m[2]!);
const sourcesJson = /^```json\n([\s\S]*?)^```$/m.exec(PAGE)?.[1];
const handlerTs = /^```ts\n\/\/ \/opt\/webhook-inbox\/handler\.ts\n([\s\S]*?)^```$/m.exec(PAGE);
const SETUP = PAGE.slice(PAGE.indexOf("## Set up\n"), PAGE.indexOf("## systemd units"));
const setupSh = /^```sh\n([\s\S]*?)^```$/m.exec(SETUP)?.[1];
// The user the set-up makes, a name of this run's own.
const USER = `wi${process.pid}${Math.random().toString(36).slice(2, 6)}`;

const { dir, cleanup } = tempDir("inbox-production-");
after(() => {
  spawnSync("userdel", [USER]);
  cleanup();
});
// The install's folders, each moved under the temp folder; the tarball is the one this test packs.
const MOVED: [string, string][] = [
  ["/var/lib/webhook-inbox", join(dir, "var-lib")],
  ["/var/backups/webhook-inbox", join(dir, "backups")],
  ["/etc/webhook-inbox", join(dir, "etc")],
  ["/opt/webhook-inbox", join(dir, "opt")],
  ["/root/webhook-inbox-0.1.0.tgz", join(dir, "pack", "webhook-inbox-0.1.0.tgz")],
];
const moved = (text: string) => MOVED.reduce((t, [from, to]) => t.split(from).join(to), text);

/** setting reads one key of a unit (the last, as systemd does). */
function setting(unit: string, key: string): string | undefined {
  return [...unit.matchAll(new RegExp(`^${key}=(.*)$`, "gm"))].at(-1)?.[1]?.trim();
}

let env: Record<string, string> = {};
const ports = new Map<string, string>();
let ids: { uid: number; gid: number };

before(async () => {
  // Every user may pass through the temp folder to the install and the inbox's folders below it.
  chmodSync(dir, 0o755);
  mkdirSync(join(dir, "pack"));
  const packed = spawnSync("npm", ["pack", "--pack-destination", join(dir, "pack")], { cwd: ROOT, encoding: "utf8" });
  assert.equal(packed.status, 0, packed.stderr);
  assert.ok(setupSh, "the page shows the set-up commands");
  // The page's user name, `inbox`, where the commands name the user or its group, becomes this run's.
  const script = moved(setupSh)
    .replace(/ inbox$/m, ` ${USER}`)
    .replace(/(-[og]) inbox\b/g, `$1 ${USER}`);
  const setup = spawnSync("sh", ["-ec", script], {
    cwd: dir,
    encoding: "utf8",
    env: { ...process.env, npm_config_prefer_offline: "true", npm_config_audit: "false", npm_config_fund: "false" },
  });
  assert.equal(setup.status, 0, setup.stderr);
  ids = {
    uid: Number(spawnSync("id", ["-u", USER], { encoding: "utf8" }).stdout),
    gid: Number(spawnSync("id", ["-g", USER], { encoding: "utf8" }).stdout),
  };
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
  assert.ok(handlerTs, "the page shows the handler");
  writeFileSync(join(dir, "opt", "handler.ts"), handlerTs[1]!);
  // The page's fixed ports, each given a free one here.
  for (const port of ["8000", "8001", "9464", "9465"]) ports.set(port, String(await freePort()));
  env.PORT = ports.get(env.PORT!) ?? env.PORT!;
});

/** command turns a unit's ExecStart into what runs here: the installed command, on the unit's PATH. */
function command(unit: string): { argv: string[]; cwd: string; env: NodeJS.ProcessEnv } {
  const line = setting(unit, "ExecStart");
  assert.ok(line, "the unit has an ExecStart");
  const words = moved(line)
    .split(/\s+/)
    .map((w) => ports.get(w) ?? w);
  assert.equal(words[0], moved(INSTALLED), "the unit runs the installed webhook-inbox command");
  assert.equal(setting(unit, "EnvironmentFile"), "/etc/webhook-inbox/env");
  const cwd = moved(setting(unit, "WorkingDirectory") ?? "/var/lib/webhook-inbox");
  const path = /^PATH=(.*)$/.exec(setting(unit, "Environment") ?? "")?.[1];
  assert.ok(path, "the unit sets PATH, for the Node the set-up installed");
  return { argv: [moved(INSTALLED), ...words.slice(1)], cwd, env: { PATH: moved(path), ...env } };
}

interface Running {
  child: ChildProcess;
  /** The first line of stdout or stderr that matches, once it comes. */
  line(pattern: RegExp): Promise<string>;
  output(): string;
  exited: Promise<number | null>;
}
function start(unit: string): Running {
  const { argv, cwd, env: vars } = command(unit);
  // As the unit's User= and Group=: the set-up's folders and modes must let it do its work.
  assert.equal(setting(unit, "User"), "inbox");
  const [file, ...args] = argv;
  const child = spawn(file!, args, { cwd, env: vars, stdio: ["ignore", "pipe", "pipe"], ...ids });
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
        type: "invoice.paid",
        data: { object: { id: "in_1", amount_paid: 500 } },
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
      // The unit gives the page its token: another local process is asked to log in, the token's holder is let in.
      const page = await fetch(`http://127.0.0.1:${ports.get("8001")}/`);
      assert.equal(page.status, 401);
      const bearer = await fetch(`http://127.0.0.1:${ports.get("8001")}/`, {
        headers: { authorization: `Bearer ${env.ADMIN_TOKEN}` },
      });
      assert.equal(bearer.status, 200);

      const backup = start(unit("webhook-inbox-backup.service"));
      assert.equal(await backup.exited, 0, backup.output());
      const made = readdirSync(join(dir, "backups"));
      assert.equal(made.length, 1);
      assert.equal(check(join(dir, "backups", made[0]!)).counts.done, 1, "the backup holds the delivery, done");
      // It holds every body: the user's alone, in a folder of the user's alone.
      const copy = statSync(join(dir, "backups", made[0]!));
      assert.equal(copy.mode & 0o777, 0o600);
      assert.equal(copy.uid, ids.uid);
      assert.equal(statSync(join(dir, "backups")).mode & 0o777, 0o700);
      // The worker ran the page's handler, not the article's.
      await worker.line(/paid: in_1 500/);
    } finally {
      for (const r of [receiver, worker, admin]) r.child.kill("SIGTERM");
    }
    assert.equal(await receiver.exited, 0, receiver.output());
    assert.equal(await worker.exited, 0, worker.output());
    assert.equal(await admin.exited, 0, admin.output());
  });

  it("start the consumer unit as written: with the page's sources file, which names no broker source, it stops at once with exit 2 and one line", async () => {
    // Consuming itself is proved by test/consume*.test.ts through consumer.ts; the installed package here
    // has no broker client, which the page says to add beside it for broker sources.
    const consumer = start(unit("webhook-inbox-consumer.service"));
    assert.equal(await consumer.exited, 2, consumer.output());
    assert.match(consumer.output(), /no source has a "broker" to consume/);
  });

  it("pass systemd-analyze verify", (t) => {
    if (!existsSync(ANALYZE)) return t.skip("systemd-analyze is not installed");
    const names = [...files.keys()].filter((p) => p.startsWith("/etc/systemd/")).map((p) => p.split("/").at(-1)!);
    assert.deepEqual(verify(Object.fromEntries(names.map((name) => [name, unit(name)]))), []);
  });
});

// The page's own commands, every ```sh line that runs the inbox's CLI as the inbox user or installs, in the
// page's order; systemctl and journalctl lines need a running systemd and are left to the units' test above.
const COMMANDS = [...PAGE.matchAll(/^```sh\n([\s\S]*?)^```$/gm)]
  .flatMap((m) => m[1]!.split("\n"))
  .filter((l) => /^(sudo -u inbox env |cd \/opt\/webhook-inbox && sudo npm install )/.test(l));
const SUDO = ["/usr/bin/sudo", "/bin/sudo"].find((p) => existsSync(p));
// A root shell's own PATH, sudo's secure_path: the system's Node (20 here) is the one it finds, as on the server.
const ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

describe("docs/production.md's commands, run as written on the server it sets up", {
  skip: SUDO ? false : "no sudo on this machine (apt-get install sudo)",
}, () => {
  it("create the inbox, apply its configuration, make and list a key, restore a backup and a drill, then upgrade", () => {
    assert.ok(COMMANDS.length >= 9, `the page's commands: ${COMMANDS.join("\n")}`);
    // The environment file as the page shows it, its comment line included, the paths and port moved here.
    const envBlock = /^```ini\n(# \/etc\/webhook-inbox\/env\n[\s\S]*?)^```$/m.exec(PAGE)?.[1];
    assert.ok(envBlock);
    writeFileSync(join(dir, "etc", "env"), moved(envBlock).replace(/^PORT=8000$/m, `PORT=${env.PORT}`));
    const backup = readdirSync(join(dir, "backups")).find((f) => f.endsWith(".db"));
    assert.ok(backup, "the backup unit's test left a backup");
    const run = (line: string) => {
      // The upgrade's tarball is this one, its name as the set-up's; the example backup's, the one made above.
      const script = moved(line.replace(/webhook-inbox-NEW_VERSION\.tgz/, "webhook-inbox-0.1.0.tgz"))
        .replace(/sudo -u inbox /, `sudo -u ${USER} `)
        .replace(/inbox-20261203T120000Z\.db/g, backup);
      const r = spawnSync("sh", ["-ec", script], {
        cwd: dir,
        encoding: "utf8",
        env: {
          PATH: ROOT_PATH,
          npm_config_prefer_offline: "true",
          npm_config_audit: "false",
          npm_config_fund: "false",
        },
      });
      assert.equal(r.status, 0, `${line}\n${r.stdout}${r.stderr}`);
      return r.stdout;
    };
    const said = COMMANDS.map((line) => ({ line, out: run(line) }));
    const out = (pattern: RegExp) => said.find((x) => pattern.test(x.line))!.out;
    assert.match(out(/inbox init$/), /is already an inbox|Created an inbox/);
    assert.match(out(/keys create/), /^wik_\S+\n$/);
    assert.match(out(/keys list$/), /read +created .* grafana/);
    assert.match(out(/inbox status --db \S+drill\.db$/), /^done {7}1$/m);
    // The restore put the backup's file in place: the delivery it holds, done, as the inbox user's file.
    const restored = statSync(env.INBOX_DB!);
    assert.equal(restored.uid, ids.uid);
    assert.equal(check(env.INBOX_DB!).counts.done, 1);
  });

  it("(control) the page's key command with the environment file read as the page once wrote it (no PATH): the system's Node 20 exits 2", (t) => {
    const line = COMMANDS.find((l) => /keys list$/.test(l))!;
    const noPath = join(dir, "etc", "env-without-path");
    writeFileSync(noPath, `INBOX_DB=${env.INBOX_DB}\n`);
    const nodeOnPath = spawnSync("sh", ["-c", "node --version"], {
      encoding: "utf8",
      env: { PATH: ROOT_PATH },
    }).stdout;
    if (!nodeOnPath.startsWith("v20."))
      return t.skip(`the system's node is ${nodeOnPath.trim() || "missing"}, not Node 20`);
    const script = moved(line)
      .replace(/sudo -u inbox /, `sudo -u ${USER} `)
      .replace(`$(grep -v '^#' ${join(dir, "etc")}/env)`, `$(cat ${noPath})`);
    const r = spawnSync("sh", ["-c", script], {
      cwd: dir,
      encoding: "utf8",
      env: { PATH: ROOT_PATH },
    });
    assert.equal(r.status, 2, r.stderr);
    assert.match(r.stderr, /needs Node 24/);
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

// test/backup.test.ts: a lost disk loses nothing acknowledged before the last backup. A real receiver under
// load, `inbox.ts backup` run beside it, more load, then the database and its WAL deleted and `inbox.ts
// restore` run: every delivery acknowledged before the backup began is back, and every ID answers duplicate.
// The control: a plain `cp` of the live file, under the same load, is caught by the same check.

import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { closeSync, existsSync, openSync, readdirSync, rmSync, statSync, writeFileSync, writeSync } from "node:fs";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { after, describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { backup, backupName, check, healthProblem } from "../lib/sqlite/backup.ts";
import { SqliteInbox } from "../lib/sqlite/sqlite.ts";
import { sha256 } from "../lib/rows.ts";
import { runScript, spawnScript, startReceiver, tempDir, type ReceiverProcess } from "./helpers.ts";

const { dir, cleanup } = tempDir("inbox-backup-");
after(cleanup);

// Load is four senders posting new deliveries as fast as the receiver acks them; each ack is noted with
// the moment it arrived, so "acknowledged before the backup began" can be asked of any moment.
interface Load {
  acked: { id: string; at: number }[];
  stop(): Promise<void>;
}
function load(receiver: ReceiverProcess, prefix: string, senders = 4): Load {
  const acked: { id: string; at: number }[] = [];
  let going = true;
  const sender = async (k: number) => {
    for (let i = 0; going; i++) {
      const id = `${prefix}-${k}-${i}`;
      try {
        const res = await fetch(receiver.url, { method: "POST", headers: { "x-delivery-id": id }, body: bodyOf(id) });
        if (res.status === 200 && (await res.text()) === "stored") acked.push({ id, at: Date.now() });
      } catch {
        return; // the receiver is gone: unacknowledged, a provider would send it again
      }
    }
  };
  const running = Array.from({ length: senders }, (_, k) => sender(k));
  return { acked, stop: async () => void ((going = false), await Promise.all(running)) };
}

// fill gives an inbox n done deliveries of about 500 bytes, written straight into the table.
function fill(path: string, n: number): void {
  new SqliteInbox(path).close();
  const db = new DatabaseSync(path);
  const insert =
    db.prepare(`INSERT INTO deliveries (source, id, body, body_sha256, received_at, status, available_at, finished_at)
                             VALUES ('default', ?, ?, ?, 0, 'done', 0, 0)`);
  const body = Buffer.from("x".repeat(500));
  db.exec("BEGIN");
  for (let i = 0; i < n; i++) insert.run(`old-${i}`, body, sha256(body));
  db.exec("COMMIT");
  db.close();
}
const CP_ROWS = 50_000;

// How many copies the control makes with cp at most; it stops at the first one the check catches.
const CP_TRIES = 100;

// until waits for the senders to get somewhere, however fast this machine is today.
async function until(done: () => boolean): Promise<void> {
  while (!done()) await sleep(10);
}

// bodyOf is each delivery's body, the same every time it is sent.
const bodyOf = (id: string) => JSON.stringify({ id, customer: "Ann", amount: 5 });

// problems lists what a copy lacks: each delivery acknowledged before `since` must be in it, in a sound file.
function problems(copy: string, acked: { id: string; at: number }[], since: number): string[] {
  let db: DatabaseSync | undefined;
  try {
    db = new DatabaseSync(copy, { readOnly: true });
    const integrity = (db.prepare("PRAGMA integrity_check").get() as { integrity_check: string }).integrity_check;
    if (integrity !== "ok") return [`integrity_check: ${integrity}`];
    const ids = new Set((db.prepare("SELECT id FROM deliveries").all() as { id: string }[]).map((r) => r.id));
    return acked
      .filter((a) => a.at < since && !ids.has(a.id))
      .map((a) => `${a.id}, acknowledged before the copy, is missing`);
  } catch (error) {
    return [`unreadable: ${(error as Error).message}`];
  } finally {
    db?.close();
  }
}

describe("a lost disk, with a backup taken under load", () => {
  it("restores every delivery acknowledged before the backup began, and each ID still answers duplicate", async () => {
    const db = join(dir, "lost.db");
    const file = join(dir, "backups", "lost-backup.db");
    execFileSync("mkdir", ["-p", join(dir, "backups")]);
    const receiver = await startReceiver(db, ["--quiet"]);
    const traffic = load(receiver, "before");
    await until(() => traffic.acked.length >= 50);
    const taken = await runScript("inbox.ts", ["backup", file, "--db", db, "--json"]);
    assert.equal(taken.code, 0, taken.stderr);
    const report = JSON.parse(taken.stdout) as { startedAt: number; integrity: string; counts: Record<string, number> };
    // Deliveries acknowledged after the backup began: these the disk takes with it.
    await until(() => traffic.acked.filter((a) => a.at > report.startedAt).length >= 20);
    await traffic.stop();
    await receiver.stop("SIGKILL");
    const before = traffic.acked.filter((a) => a.at < report.startedAt);
    assert.ok(before.length >= 50, `${before.length} acknowledged before the backup began`);

    // The disk is lost: the database, its WAL and its shared memory.
    for (const suffix of ["", "-wal", "-shm"]) rmSync(db + suffix, { force: true });
    const restored = await runScript("inbox.ts", ["restore", file, "--db", db]);
    assert.equal(restored.code, 0, restored.stderr);
    assert.match(restored.stdout, /^Restored .* deliveries/m);
    assert.deepEqual(problems(db, traffic.acked, report.startedAt), []);

    // A provider sends them all again: each is a duplicate, and nothing runs twice.
    const again = await startReceiver(db, ["--quiet"]);
    try {
      const held = (
        new DatabaseSync(db, { readOnly: true }).prepare("SELECT id FROM deliveries").all() as { id: string }[]
      ).map((r) => r.id);
      assert.ok(held.length >= before.length);
      const answers = new Map<string, number>();
      for (let i = 0; i < held.length; i += 64) {
        await Promise.all(
          held.slice(i, i + 64).map(async (id) => {
            const text = await (
              await fetch(again.url, { method: "POST", headers: { "x-delivery-id": id }, body: bodyOf(id) })
            ).text();
            answers.set(text, (answers.get(text) ?? 0) + 1);
          }),
        );
      }
      assert.deepEqual(Object.fromEntries(answers), { duplicate: held.length });
    } finally {
      await again.stop();
    }
  });

  it(`CONTROL: a plain cp of the live file misses acknowledged deliveries, or is damaged, in at least one of ${CP_TRIES} tries`, async (t) => {
    // An inbox with some history, as a real one has: copying it takes a while, as it would.
    const db = join(dir, "cp.db");
    fill(db, CP_ROWS);
    const receiver = await startReceiver(db, ["--quiet"]);
    const traffic = load(receiver, "cp");
    const found: string[][] = [];
    try {
      // Whether a copy misses anything depends on where the checkpoint thread is when cp reads the file,
      // so it is tried until one does, up to CP_TRIES times.
      while (found.length < CP_TRIES && !found.some((p) => p.length > 0)) {
        // Copied while acks keep coming: some just before the copy, some during it.
        const seen = traffic.acked.length;
        await until(() => traffic.acked.length >= seen + 3);
        const copy = join(dir, `cp-copy-${found.length}.db`);
        const since = Date.now();
        execFileSync("cp", [db, copy]);
        found.push(problems(copy, traffic.acked, since));
      }
    } finally {
      await traffic.stop();
      await receiver.stop();
    }
    t.diagnostic(
      `the copy made with cp was caught at try ${found.findIndex((p) => p.length > 0) + 1} of ${CP_TRIES}: ${found.find((p) => p.length > 0)?.[0]}`,
    );
    assert.ok(
      found.some((p) => p.length > 0),
      "a cp of the live file was always whole: the test above could not fail",
    );
    // The same check passes on the live file itself once the receiver has closed it.
    assert.deepEqual(problems(db, traffic.acked, Date.now()), []);
  });
});

describe("inbox.ts restore", () => {
  it("refuses, in one line, a database that a receiver has open, and leaves it as it was", async () => {
    const db = join(dir, "busy.db");
    const receiver = await startReceiver(db, ["--quiet"]);
    try {
      await fetch(receiver.url, { method: "POST", headers: { "x-delivery-id": "kept" }, body: "{}" });
      const file = join(dir, "busy-backup.db");
      assert.equal((await runScript("inbox.ts", ["backup", file, "--db", db])).code, 0);
      const refused = await runScript("inbox.ts", ["restore", file, "--db", db]);
      assert.equal(refused.code, 1);
      assert.equal(refused.stderr.trim().split("\n").length, 1, refused.stderr);
      assert.match(refused.stderr, /busy\.db is in use/);
      const res = await fetch(receiver.url, { method: "POST", headers: { "x-delivery-id": "kept" }, body: "{}" });
      assert.equal(await res.text(), "duplicate");
    } finally {
      await receiver.stop();
    }
  });

  it("moves the database it replaces aside, WAL and all, so nothing is lost and no old WAL is replayed into the restored file", async () => {
    const db = join(dir, "idle.db");
    const receiver = await startReceiver(db, ["--quiet"]);
    const post = async (id: string) =>
      (await fetch(receiver.url, { method: "POST", headers: { "x-delivery-id": id }, body: "{}" })).text();
    assert.equal(await post("in-the-backup"), "stored");
    await backup(db, join(dir, "idle-backup.db"));
    assert.equal(await post("after-the-backup"), "stored");
    // Killed, the receiver leaves its WAL behind, as a crash does.
    await receiver.stop("SIGKILL");
    assert.ok(existsSync(`${db}-wal`));
    const r = await runScript("inbox.ts", ["restore", join(dir, "idle-backup.db"), "--db", db]);
    assert.equal(r.code, 0, r.stderr);
    const aside = /moved aside to (\S+idle\.db\.before-restore-\w+)/.exec(r.stdout)?.[1];
    assert.ok(aside, r.stdout);
    const ids = (path: string) =>
      (
        new DatabaseSync(path, { readOnly: true }).prepare("SELECT id FROM deliveries ORDER BY id").all() as {
          id: string;
        }[]
      ).map((x) => x.id);
    assert.deepEqual(ids(db), ["in-the-backup"]);
    assert.deepEqual(ids(aside), ["after-the-backup", "in-the-backup"], "the replaced database kept what it had");
    // The restored inbox holds the restore's own audit entry from its first moment, and only that one.
    const audit = new DatabaseSync(db, { readOnly: true }).prepare("SELECT who, operation, target FROM audit").all();
    assert.deepEqual(
      audit.map((e) => [String(e.who).replace(/^cli:.*/, "cli"), e.operation, e.target]),
      [["cli", "restore", `restore file=${JSON.stringify(join(dir, "idle-backup.db"))}`]],
    );
  });

  it("restores nothing when its audit entry cannot be written into the copy, and leaves the database as it was", async () => {
    const db = join(dir, "audited.db");
    const inbox = new SqliteInbox(db);
    await inbox.store({ id: "in-the-backup", body: Buffer.from("{}") });
    await inbox.close();
    const copy = join(dir, "audited-backup.db");
    await backup(db, copy);
    // The backup refuses every audit insert (a trigger made in it), as a full disk would refuse it.
    const refusing = new DatabaseSync(copy);
    refusing.exec("CREATE TRIGGER refuse_audit BEFORE INSERT ON audit BEGIN SELECT RAISE(ABORT, 'audit refused'); END");
    refusing.close();
    const later = new SqliteInbox(db);
    await later.store({ id: "after-the-backup", body: Buffer.from("{}") });
    await later.close();
    const r = await runScript("inbox.ts", ["restore", copy, "--db", db]);
    assert.equal(r.code, 1);
    assert.match(r.stderr, /audit refused; nothing changed/);
    const ids = new DatabaseSync(db, { readOnly: true }).prepare("SELECT id FROM deliveries ORDER BY id").all();
    assert.deepEqual(
      ids.map((x) => x.id),
      ["after-the-backup", "in-the-backup"],
      "the database in place is the one it was",
    );
  });

  it("refuses a damaged backup, in one line, and changes nothing", async () => {
    const good = join(dir, "good.db");
    const inbox = new SqliteInbox(good);
    for (let i = 0; i < 300; i++) await inbox.store({ id: `d${i}`, body: Buffer.from("x".repeat(500)) });
    await inbox.close();
    const damaged = join(dir, "damaged-backup.db");
    await backup(good, damaged);
    damage(damaged);
    const r = await runScript("inbox.ts", ["restore", damaged, "--db", join(dir, "fresh.db")]);
    assert.equal(r.code, 1);
    assert.match(r.stderr, /integrity_check/);
    assert.ok(!existsSync(join(dir, "fresh.db")));
  });
});

describe("inbox.ts backup --dir --keep", () => {
  it("keeps the newest N, never the one it just made, and a failed backup removes none", async () => {
    const db = join(dir, "rotate.db");
    const folder = join(dir, "rotated");
    execFileSync("mkdir", ["-p", folder]);
    const inbox = new SqliteInbox(db);
    await inbox.store({ id: "one", body: Buffer.from("{}") });
    await inbox.close();
    const hour = 3_600_000;
    const t0 = Date.UTC(2026, 11, 3, 12);
    for (let h = 0; h < 5; h++) {
      const at = t0 + h * hour;
      await backup(db, join(folder, backupName(join(dir, "rotate.db"), at)), { keep: 3, now: () => at });
    }
    assert.deepEqual(readdirSync(folder).sort(), [
      "rotate-20261203T140000Z.db",
      "rotate-20261203T150000Z.db",
      "rotate-20261203T160000Z.db",
    ]);
    await assert.rejects(backup(join(dir, "no-such.db"), join(folder, "rotate-20261203T170000Z.db"), { keep: 1 }));
    assert.equal(readdirSync(folder).length, 3, "a failed backup removed nothing, and left no partial file");
    assert.ok(!existsSync(join(dir, "no-such.db")), "nor made the missing database");
    await assert.rejects(backup(db, db), /another file than the database/);
    assert.equal(check(db).counts.received, 1, "the database is left as it was");
    const cli = await runScript("inbox.ts", ["backup", "--dir", folder, "--keep", "2", "--db", db]);
    assert.equal(cli.code, 0, cli.stderr);
    assert.match(cli.stdout, /Removed 2 older backups/);
    assert.equal(readdirSync(folder).length, 2);
    // The file the CLI says it wrote: by name, the newest could be a made-up one above on a clock behind it.
    assert.equal(check(/^Backed up \S+ to (\S+):/m.exec(cli.stdout)![1]!).counts.received, 1);
  });
});

describe("inbox.ts backup after a backup was killed", () => {
  it("removes the partial copy the killed one left, and never one a live backup is still writing", async () => {
    const db = join(dir, "killed.db");
    const folder = join(dir, "killed");
    execFileSync("mkdir", ["-p", folder]);
    // Big enough that the copy and its integrity_check take a while, so the kill lands while the partial exists.
    fill(db, 100_000);
    const killed = spawnScript("inbox.ts", ["backup", "--dir", folder, "--db", db]);
    const partials = () => readdirSync(folder).filter((name) => name.includes(".partial-"));
    while (partials().length === 0 && killed.exitCode === null) await sleep(2);
    killed.kill("SIGKILL");
    await new Promise((resolve) => killed.once("exit", resolve));
    // The copy, and its journal if the kill came while the copy switched to one.
    const left = partials();
    assert.ok(
      left.length >= 1,
      `the SIGKILL landed mid-backup, leaving its partial copy: ${readdirSync(folder).join(", ")}`,
    );
    // A backup still running in another process, by the name it would write under (its PID alive).
    const live = spawn("sleep", ["30"]);
    const writing = `.killed-20261203T120000Z.db.partial-${live.pid}`;
    writeFileSync(join(folder, writing), "still being written");
    // Another database's partial copy, its process gone too: not this backup's to judge.
    const other = `.other.db.partial-${killed.pid}`;
    writeFileSync(join(folder, other), "someone else's");
    try {
      const cli = await runScript("inbox.ts", ["backup", "--dir", folder, "--db", db]);
      assert.equal(cli.code, 0, cli.stderr);
      assert.match(
        cli.stdout,
        new RegExp(`Removed ${left.length} partial (copy|copies) left by a backup that was killed`),
      );
      assert.deepEqual(
        partials().sort(),
        [other, writing].sort(),
        "the killed one's partial is gone; the live one's and the other database's stay",
      );
    } finally {
      live.kill();
    }
  });
});

// damage overwrites a page in the middle of a database file with bytes SQLite cannot read, as a bad disk
// (or a power cut under synchronous=OFF) leaves one.
function damage(path: string): void {
  const size = statSync(path).size;
  const fd = openSync(path, "r+");
  try {
    writeSync(fd, Buffer.alloc(4096, 0xa5), 0, 4096, Math.floor(size / 2 / 4096) * 4096);
  } finally {
    closeSync(fd);
  }
}

describe("the start-up quick_check", () => {
  // A file of 300 deliveries whose receiver stopped cleanly after its first start, which checked it.
  const sound = async (name: string) => {
    const db = join(dir, name);
    const inbox = new SqliteInbox(db);
    for (let i = 0; i < 300; i++) await inbox.store({ id: `h${i}`, body: Buffer.from("y".repeat(500)) });
    await inbox.close();
    assert.equal(healthProblem(db), undefined);
    assert.ok(!existsSync(`${db}-checked`), "never checked yet");
    const first = await startReceiver(db, ["--quiet"]);
    assert.equal(await first.stop(), 0);
    assert.ok(existsSync(`${db}-checked`), "the first start checked it and wrote down the pass");
    assert.deepEqual(
      readdirSync(dir).filter((f) => f.startsWith(`${name}-running.`)),
      [],
      "the clean stop removed its mark",
    );
    return db;
  };

  it("is not paid at every start: a file checked today that stopped cleanly starts unread, damaged or not", async () => {
    const db = await sound("health-skip.db");
    damage(db);
    assert.notEqual(healthProblem(db), undefined);
    const worker = await runScript("worker.ts", ["--once", "--db", db]);
    assert.doesNotMatch(worker.stderr, /quick_check/);
  });

  it("(control) runs once its last pass is a day old: refuses the damaged file in one line, exit 2, worker and receiver", async () => {
    const db = await sound("health-old.db");
    damage(db);
    writeFileSync(`${db}-checked`, String(Date.now() - 25 * 3_600_000));
    const refused = await runScript("receiver.ts", ["--port", "0", "--db", db]);
    assert.equal(refused.code, 2, "exit 2, which systemd's RestartPreventExitStatus=2 does not restart in a loop");
    assert.match(refused.stderr, /fails SQLite's quick_check.*--force/);
    assert.equal(refused.stderr.trim().split("\n").length, 1, refused.stderr);
    const worker = await runScript("worker.ts", ["--once", "--db", db]);
    assert.equal(worker.code, 2, worker.stderr);
    assert.match(worker.stderr, /fails SQLite's quick_check/);
  });

  it("runs after an unclean stop: a receiver killed with SIGKILL leaves its mark, and the next start refuses the damage", async () => {
    const db = await sound("health-kill.db");
    const killed = await startReceiver(db, ["--quiet"]);
    await killed.stop("SIGKILL");
    assert.equal(readdirSync(dir).filter((f) => f.startsWith("health-kill.db-running.")).length, 1);
    damage(db);
    const worker = await runScript("worker.ts", ["--once", "--db", db]);
    assert.equal(worker.code, 2, worker.stderr);
    assert.match(worker.stderr, /fails SQLite's quick_check/);
  });

  it("--skip-check and --force are two switches: one skips a due check, the other checks and starts on damage, saying so", async () => {
    const db = await sound("health-flags.db");
    damage(db);
    rmSync(`${db}-checked`);
    const skipped = await runScript("worker.ts", ["--once", "--db", db, "--skip-check"]);
    assert.doesNotMatch(skipped.stderr, /quick_check/);
    const forced = await runScript("worker.ts", ["--once", "--db", db, "--force"]);
    assert.match(forced.stderr, /fails SQLite's quick_check .*starting anyway, as --force asks/);
    const receiver = await startReceiver(db, ["--quiet", "--force"]);
    assert.match(receiver.log(), /starting anyway/);
    await receiver.stop();
    // Neither recorded a pass: the next start without them still refuses.
    const refused = await runScript("worker.ts", ["--once", "--db", db]);
    assert.equal(refused.code, 2, refused.stderr);
  });
});

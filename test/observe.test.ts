// test/observe.test.ts: what an operator sees from outside, on both backends: the metrics against the
// database after a known workload (parsed by a real Prometheus text parser), the gauges and readiness of
// the store's contract, /livez and /readyz (a full disk, a PostgreSQL server stopped and started again,
// a shutdown), the JSON log format, and the progress lines that only a terminal gets.

import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import {
  chmodSync,
  closeSync,
  existsSync,
  mkdirSync,
  openSync,
  readdirSync,
  rmSync,
  writeFileSync,
  writeSync,
} from "node:fs";
import { createServer as createNetServer } from "node:net";
import { join } from "node:path";
import { after, afterEach, before, beforeEach, describe, it } from "node:test";
import parse from "parse-prometheus-text-format";
import { connect } from "../inbox.ts";
import { jsonLine, lineLog, progress } from "../lib/log.ts";
import { PermanentError, type Inbox, type InboxOptions } from "../lib/store.ts";
import { Metrics } from "../lib/metrics.ts";
import { createReceiver } from "../receiver.ts";
import { sign } from "../lib/providers.ts";
import { flood } from "../send.ts";
import { run, type Job } from "../worker.ts";
import { ROOT, backends, runScript, startReceiver, tempDir } from "./helpers.ts";

const quiet = () => {};

const BACKENDS = await backends("observe");

/**
 * scrape parses Prometheus text with a real parser (which throws on a malformed line) and returns a
 * lookup: the sum of the samples of one series name whose labels include the given ones. The parser
 * folds a labelled histogram's series into one, so histograms are read a second time with their TYPE
 * lines left out, as plain series (name_bucket, name_sum, name_count) that keep their labels.
 */
function scrape(text: string): {
  value(name: string, labels?: Record<string, string>): number;
  labelValues(): string[];
} {
  const families = parse(text);
  const histograms = new Set(families.filter((f) => f.type === "HISTOGRAM").map((f) => f.name));
  const plain = parse(
    text
      .split("\n")
      .filter((l) => !histograms.has(/^# (?:TYPE|HELP) (\S+)/.exec(l)?.[1] ?? ""))
      .join("\n"),
  );
  const all = [
    ...families.filter((f) => !histograms.has(f.name)),
    ...plain.filter((f) => !families.some((g) => g.name === f.name && !histograms.has(g.name))),
  ];
  return {
    value: (name, labels = {}) => {
      let sum = 0;
      for (const f of all.filter((f) => f.name === name)) {
        for (const m of f.metrics) {
          if (Object.entries(labels).every(([k, v]) => m.labels?.[k] === v)) sum += Number(m.value);
        }
      }
      return sum;
    },
    labelValues: () => all.flatMap((f) => f.metrics.flatMap((m) => Object.values(m.labels ?? {}))),
  };
}

async function get(url: string): Promise<{ status: number; text: string }> {
  const res = await fetch(url);
  return { status: res.status, text: await res.text() };
}

// until polls check every 50 ms (a readiness that is cached for a second) for at most ms.
async function until(what: string, ms: number, check: () => Promise<boolean>): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`gave up waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

const SECRET = "s3cret-value-never-logged";
const MARKER = "BODY-MARKER-never-logged";

for (const backend of BACKENDS) {
  describe(`observability on ${backend.name}`, { skip: backend.skip }, () => {
    let target: string;
    let cleanup: () => Promise<void>;
    let opened: Inbox[];
    let t: number;
    const open = async (options: InboxOptions = {}) => {
      const inbox = await connect(target, options);
      opened.push(inbox);
      return inbox;
    };
    beforeEach(async () => {
      ({ target, cleanup } = await backend.make());
      opened = [];
      t = 1_700_000_000_000;
    });
    afterEach(async () => {
      for (const inbox of opened) await inbox.close();
      await cleanup();
    });

    describe("gauges()", () => {
      it("counts per source and status and finds the oldest wait, as status() does", async () => {
        const inbox = await open({ now: () => t, random: () => 0 });
        assert.deepEqual(await inbox.gauges(), { bySourceStatus: [], oldestWaitingMs: [] });
        for (let i = 0; i < 4; i++) await inbox.store({ source: "a", id: `a${i}`, body: Buffer.from("{}") });
        t += 1_000;
        for (let i = 0; i < 2; i++) await inbox.store({ source: "b", id: `b${i}`, body: Buffer.from("{}") });
        t += 500;
        const [first, second, third] = await inbox.claimBatch(3);
        await inbox.finish(first!);
        await inbox.fail(second!, "no", { permanent: true });
        assert.equal(third!.source, "a");
        const gauges = await inbox.gauges();
        assert.deepEqual(gauges.bySourceStatus, [
          { source: "a", status: "received", n: 1 },
          { source: "a", status: "processing", n: 1 },
          { source: "a", status: "done", n: 1 },
          { source: "a", status: "failed", n: 1 },
          { source: "b", status: "received", n: 2 },
        ]);
        assert.deepEqual(gauges.oldestWaitingMs, [
          { source: "a", ms: 1_500 },
          { source: "b", ms: 500 },
        ]);
        const status = await inbox.status();
        for (const g of gauges.bySourceStatus) {
          const counted = status.sources
            .filter((s) => s.source === g.source)
            .reduce((n, s) => n + s.counts[g.status], 0);
          assert.equal(g.n, counted, `${g.source} ${g.status}`);
        }
      });
    });

    describe("claimBatch()", () => {
      it("marks a takeover, and only a takeover", async () => {
        const inbox = await open({ now: () => t, random: () => 0 });
        await inbox.store({ id: "old", body: Buffer.from("{}") });
        t += 1;
        await inbox.store({ id: "new", body: Buffer.from("{}") });
        const [held] = await inbox.claimBatch(1, 1_000);
        assert.equal(held!.id, "old");
        assert.equal(held!.takeover, undefined);
        t += 5_000;
        const taken = await inbox.claimBatch(5, 1_000);
        // Order aside (each backend sorts a takeover by its own due time), one of the two was taken over.
        assert.deepEqual(taken.map((l) => [l.id, l.takeover === true]).sort(), [
          ["new", false],
          ["old", true],
        ]);
      });
    });

    describe("ready()", () => {
      it("is true on an inbox that commits, and says why not once closed", async () => {
        const inbox = await connect(target);
        assert.equal(await inbox.ready(), true);
        await inbox.store({ id: "x", body: Buffer.from("{}") });
        assert.equal(await inbox.ready(), true);
        await inbox.close();
        assert.match(String(await inbox.ready()), /closed/);
      });
    });

    describe("/metrics", () => {
      it("matches the database after duplicates, conflicts, bad signatures and failing handlers, and counts from zero after a restart", async () => {
        const { dir, cleanup: rmDir } = tempDir();
        const sourcesFile = join(dir, "sources.json");
        writeFileSync(
          sourcesFile,
          JSON.stringify({ shop: { provider: "plain", secret: SECRET }, open: { provider: "plain" } }),
        );
        let receiver = await startReceiver(target, ["--sources", sourcesFile, "--max-body", "2000", "--quiet"]);
        try {
          const post = async (path: string, id: string | undefined, event: unknown, secret = "") => {
            const body = typeof event === "string" ? event : JSON.stringify(event);
            const headers: Record<string, string> = secret
              ? sign("plain", secret, { id: id ?? "", body, timestampS: 0 })
              : {};
            if (id !== undefined) headers["x-delivery-id"] = id;
            const res = await fetch(`${receiver.url}/${path}`, { method: "POST", headers, body });
            return { status: res.status, text: await res.text() };
          };
          const kinds = ["ok", "ok", "ok", "ok", "ok", "ok", "ok", "ok", "permanent", "permanent", "flaky", "flaky"];
          for (const [i, kind] of kinds.entries())
            assert.equal((await post("shop", `s-${i}`, { kind, customer: "Ann", amount: i }, SECRET)).text, "stored");
          for (const i of [0, 1, 2])
            assert.equal(
              (await post("shop", `s-${i}`, { kind: kinds[i], customer: "Ann", amount: i }, SECRET)).text,
              "duplicate",
            );
          for (const i of [3, 4])
            assert.equal(
              (await post("shop", `s-${i}`, { kind: "ok", customer: "Ann", amount: 99 }, SECRET)).text,
              "duplicate",
            );
          for (let i = 0; i < 4; i++)
            assert.equal((await post("shop", `bad-${i}`, { kind: "ok" }, "wrong-secret")).status, 401);
          for (let i = 0; i < 5; i++)
            assert.equal((await post("open", `o-${i}`, { kind: "ok", customer: "Bo", amount: i })).text, "stored");
          for (let i = 0; i < 2; i++) assert.equal((await post("nowhere", `n-${i}`, {})).status, 404);
          assert.equal((await post("open", "big", "x".repeat(3_000))).status, 413);
          assert.equal((await post("open", undefined, {})).status, 400);

          const m = scrape((await get(`${receiver.url}/metrics`)).text);
          const db = await open();
          const count = async (sql: string, ...params: string[]) =>
            Number(Object.values((await db.query(sql, ...params))[0]!)[0]);
          for (const source of ["shop", "open"]) {
            assert.equal(
              m.value("inbox_received_total", { source, result: "stored" }),
              await count("SELECT count(*) AS n FROM deliveries WHERE source = ?", source),
            );
            assert.equal(
              m.value("inbox_received_total", { source, result: "conflict" }),
              await count("SELECT coalesce(sum(conflicts), 0) AS n FROM deliveries WHERE source = ?", source),
            );
            assert.equal(
              m.value("inbox_deliveries", { source, status: "received" }),
              await count("SELECT count(*) AS n FROM deliveries WHERE source = ? AND status = 'received'", source),
            );
          }
          assert.equal(m.value("inbox_received_total", { source: "shop", result: "duplicate" }), 3);
          assert.equal(m.value("inbox_received_total", { source: "shop", result: "rejected" }), 4);
          assert.equal(m.value("inbox_rejected_total", { source: "shop", status: "401", reason: "signature" }), 4);
          assert.equal(m.value("inbox_rejected_total", { source: "-", status: "404", reason: "unknown_source" }), 2);
          assert.equal(m.value("inbox_rejected_total", { source: "open", status: "413", reason: "too_large" }), 1);
          assert.equal(m.value("inbox_rejected_total", { source: "open", status: "400", reason: "malformed" }), 1);
          assert.equal(m.value("inbox_received_total", { result: "unavailable" }), 0);
          assert.equal(
            m.value("inbox_ack_duration_seconds_count", { source: "shop" }),
            17,
            "every 200: stored, duplicate, conflict",
          );
          assert.equal(m.value("inbox_ack_duration_seconds_bucket", { source: "open", le: "+Inf" }), 5);
          assert.ok(m.value("inbox_commit_batch_size_sum") >= 17, "every store went through a commit");
          assert.ok(m.value("inbox_commit_duration_seconds_count") >= 1);
          assert.ok(m.value("inbox_oldest_waiting_seconds", { source: "shop" }) >= 0);
          assert.ok(m.value("process_cpu_seconds_total") > 0, "Node's own metrics are there too");
          for (const value of m.labelValues())
            assert.doesNotMatch(value, /^(s|o|bad|n)-\d+$|^big$/, "no delivery ID is a label");

          // The worker: failing handlers, retried at once (no backoff), two attempts at most.
          const metrics = { current: undefined as Metrics | undefined };
          const work = await open({
            maxAttempts: 2,
            retryDelayMs: 0,
            onCommit: (size, ms) => metrics.current?.commit(size, ms),
          });
          metrics.current = new Metrics({ inbox: work, gaugeCacheMs: 0, processMetrics: false });
          const handler = (job: Job) => {
            const { kind } = job.event as { kind: string };
            if (kind === "permanent") throw new PermanentError("not ours");
            if (kind === "flaky") throw new Error("downstream is down");
          };
          const stats = await run(handler, { inbox: work, once: true, log: quiet, metrics: metrics.current });
          assert.deepEqual([stats.done, stats.failed, stats.retried], [13, 4, 2]);
          const w = scrape(await metrics.current.text());
          const attempts = await count("SELECT sum(attempts) AS n FROM deliveries");
          assert.equal(attempts, 13 + 2 + 2 * 2);
          assert.equal(w.value("inbox_attempts_total"), attempts);
          assert.equal(w.value("inbox_handler_duration_seconds_count"), attempts);
          assert.equal(w.value("inbox_queue_wait_seconds_count"), 17, "one wait per delivery: its first claim");
          assert.equal(w.value("inbox_retries_total", { source: "shop" }), 2);
          assert.equal(
            w.value("inbox_failures_total"),
            await count("SELECT count(*) AS n FROM deliveries WHERE status = 'failed'"),
          );
          assert.equal(w.value("inbox_lease_takeovers_total"), 0);
          assert.equal(w.value("inbox_leases_lost_total"), 0);
          for (const status of ["done", "failed", "received", "processing"]) {
            for (const source of ["shop", "open"]) {
              assert.equal(
                w.value("inbox_deliveries", { source, status }),
                await count("SELECT count(*) AS n FROM deliveries WHERE source = ? AND status = ?", source, status),
                `${source} ${status}`,
              );
            }
          }
          assert.equal(w.value("inbox_oldest_waiting_seconds"), 0, "nothing waits");

          // A new receiver process counts from zero; the gauges still read the database.
          await receiver.stop();
          receiver = await startReceiver(target, ["--sources", sourcesFile, "--quiet"]);
          const again = scrape((await get(`${receiver.url}/metrics`)).text);
          assert.equal(again.value("inbox_received_total"), 0);
          assert.equal(again.value("inbox_deliveries", { source: "shop", status: "done" }), 8);
          assert.equal(again.value("inbox_deliveries", { source: "open", status: "done" }), 5);
          assert.equal(again.value("inbox_deliveries", { source: "shop", status: "failed" }), 4);
        } finally {
          await receiver.stop();
          rmDir();
        }
      });

      it("is served by worker.ts on --metrics-port, with /livez and /readyz", async () => {
        const child = (await import("./helpers.ts")).spawnScript("worker.ts", [
          "--db",
          target,
          "--metrics-port",
          "0",
          "--quiet",
          "--handler",
          "demo",
        ]);
        let stderr = "";
        child.stderr!.on("data", (d) => (stderr += d));
        try {
          await until("the metrics line", 20_000, async () => /Metrics on (\S+)/.test(stderr));
          const url = /Metrics on (\S+)/.exec(stderr)![1]!;
          const m = scrape((await get(url)).text);
          assert.equal(m.value("inbox_attempts_total"), 0);
          assert.equal(m.value("inbox_ready"), 1);
          assert.deepEqual(await get(url.replace("/metrics", "/livez")), { status: 200, text: "ok" });
          assert.deepEqual(await get(url.replace("/metrics", "/readyz")), { status: 200, text: "ready" });
          assert.equal((await get(url.replace("/metrics", "/nope"))).status, 404);
        } finally {
          child.kill("SIGTERM");
          await new Promise((resolve) => child.on("close", resolve));
        }
      });
    });

    describe("/livez and /readyz", () => {
      it("answer 200, and /readyz fails from the moment shutdown begins", async () => {
        const inbox = await open();
        const receiver = createReceiver({ inbox, log: quiet });
        await new Promise<void>((resolve) => receiver.server.listen(0, "127.0.0.1", resolve));
        const { port } = receiver.server.address() as { port: number };
        assert.deepEqual(await get(`http://127.0.0.1:${port}/livez`), { status: 200, text: "ok" });
        assert.deepEqual(await get(`http://127.0.0.1:${port}/readyz`), { status: 200, text: "ready" });
        assert.equal((await get(`http://127.0.0.1:${port}/metrics`)).status, 404, "no metrics unless asked for");
        const closed = receiver.close();
        assert.equal(await receiver.readiness.ready(), "shutting down");
        await closed;
      });
    });
  });
}

describe("/readyz on a full disk: a 2 MB tmpfs (when the tests may mount one)", () => {
  const { dir, cleanup } = tempDir();
  const mnt = join(dir, "tmpfs");
  let mounted = false;
  before(() => {
    mkdirSync(mnt);
    try {
      execFileSync("mount", ["-t", "tmpfs", "-o", "size=2m", "tmpfs", mnt], { stdio: "ignore" });
      mounted = true;
    } catch {
      // Not root, or no mount in this sandbox.
    }
  });
  after(() => {
    if (mounted) execFileSync("umount", [mnt]);
    cleanup();
  });

  it("fails while the disk is full and recovers once space is freed, without a restart", async (t) => {
    if (!mounted) return t.skip("cannot mount a tmpfs here");
    const receiver = await startReceiver(join(mnt, "inbox.db"), ["--quiet"]);
    const ready = () => get(`${receiver.url}/readyz`);
    try {
      assert.equal((await ready()).status, 200);
      const fd = openSync(join(mnt, "ballast"), "w");
      try {
        for (const chunk = Buffer.alloc(4096); ; ) writeSync(fd, chunk);
      } catch (error) {
        assert.equal((error as NodeJS.ErrnoException).code, "ENOSPC");
      } finally {
        closeSync(fd);
      }
      const res = await fetch(receiver.url, {
        method: "POST",
        headers: { "x-delivery-id": "full" },
        body: "x".repeat(100_000),
      });
      assert.equal(res.status, 503);
      await until("/readyz to fail", 5_000, async () => (await ready()).status === 503);
      assert.match((await ready()).text, /not ready: cannot commit: .*full/);
      const m = scrape((await get(`${receiver.url}/metrics`)).text);
      assert.equal(m.value("inbox_received_total", { result: "unavailable" }), 1);
      assert.equal(m.value("inbox_ready"), 0, "the scrape says so too");
      rmSync(join(mnt, "ballast"));
      await until("/readyz to recover", 5_000, async () => (await ready()).status === 200);
      assert.equal(scrape((await get(`${receiver.url}/metrics`)).text).value("inbox_ready"), 1);
      const stored = await fetch(receiver.url, { method: "POST", headers: { "x-delivery-id": "after" }, body: "{}" });
      assert.equal(await stored.text(), "stored");
    } finally {
      await receiver.stop("SIGKILL");
      for (const name of readdirSync(mnt)) rmSync(join(mnt, name), { force: true });
    }
  });
});

// A private PostgreSQL cluster of this test's own, so stopping it stops no one else's tests.
const PG_BIN = "/usr/lib/postgresql/15/bin";
const privateSkip = !existsSync(join(PG_BIN, "initdb"))
  ? `no ${PG_BIN}/initdb to make a private PostgreSQL cluster`
  : false;

describe("/readyz with PostgreSQL stopped and started again, then read-only (a private cluster)", {
  skip: privateSkip,
}, () => {
  const { dir, cleanup } = tempDir("inbox-pg-");
  const data = join(dir, "data");
  let port = 0;
  const asPostgres = (cmd: string, args: string[]) => {
    const result = spawnSync("runuser", ["-u", "postgres", "--", join(PG_BIN, cmd), ...args], { encoding: "utf8" });
    if (result.status !== 0) throw new Error(`${cmd}: ${result.stderr || result.stdout}`);
  };
  const pgCtl = (action: "start" | "stop") =>
    asPostgres("pg_ctl", [
      "-D",
      data,
      "-w",
      "-l",
      join(dir, "log"),
      ...(action === "start"
        ? ["-o", `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off`, "start"]
        : ["-m", "fast", "stop"]),
    ]);
  before(async () => {
    port = await new Promise<number>((resolve) => {
      const s = createNetServer().listen(0, "127.0.0.1", () => {
        const p = (s.address() as { port: number }).port;
        s.close(() => resolve(p));
      });
    });
    chmodSync(dir, 0o777);
    asPostgres("initdb", ["-D", data, "-U", "postgres", "--auth=trust"]);
    pgCtl("start");
  });
  after(() => {
    try {
      pgCtl("stop");
    } catch {
      // Already stopped by a failed test.
    }
    cleanup();
  });

  it("fails while the server is down and recovers when it is back, without a restart", async () => {
    const url = `postgres://postgres@127.0.0.1:${port}/postgres?schema=ready`;
    const receiver = await startReceiver(url, ["--quiet"]);
    const ready = () => get(`${receiver.url}/readyz`);
    try {
      assert.equal((await ready()).status, 200);
      assert.equal(scrape((await get(`${receiver.url}/metrics`)).text).value("inbox_ready"), 1);
      pgCtl("stop");
      await until("/readyz to fail", 10_000, async () => (await ready()).status === 503);
      assert.match((await ready()).text, /not ready: /);
      assert.equal(
        scrape((await get(`${receiver.url}/metrics`)).text).value("inbox_ready"),
        0,
        "the scrape says so too",
      );
      const res = await fetch(receiver.url, { method: "POST", headers: { "x-delivery-id": "down" }, body: "{}" });
      assert.equal(res.status, 503);
      pgCtl("start");
      await until("/readyz to recover", 15_000, async () => (await ready()).status === 200);
      const stored = await fetch(receiver.url, { method: "POST", headers: { "x-delivery-id": "down" }, body: "{}" });
      assert.equal(await stored.text(), "stored");

      // Read-only: every session's transactions, the receiver's pool included once the server reloads.
      const { default: pg } = await import("pg");
      const admin = new pg.Client({ connectionString: `postgres://postgres@127.0.0.1:${port}/postgres` });
      await admin.connect();
      try {
        await admin.query("ALTER SYSTEM SET default_transaction_read_only = on");
        await admin.query("SELECT pg_reload_conf()");
        await until("/readyz to fail on a read-only server", 10_000, async () => (await ready()).status === 503);
        assert.match((await ready()).text, /read-only/);
        await admin.query("ALTER SYSTEM RESET default_transaction_read_only");
        await admin.query("SELECT pg_reload_conf()");
        await until("/readyz to recover", 10_000, async () => (await ready()).status === 200);
      } finally {
        await admin.end();
      }
    } finally {
      await receiver.stop("SIGKILL");
    }
  });
});

describe("--log-format json", () => {
  it("writes one JSON object per line with pino's fields, never a body or a secret", async () => {
    const { dir, cleanup } = tempDir();
    const sourcesFile = join(dir, "sources.json");
    writeFileSync(sourcesFile, JSON.stringify({ shop: { provider: "plain", secret: SECRET } }));
    const db = join(dir, "inbox.db");
    const receiver = await startReceiver(db, ["--sources", sourcesFile, "--log-format", "json"]);
    try {
      const body = JSON.stringify({ customer: MARKER, amount: 1 });
      const headers = { ...sign("plain", SECRET, { id: "evt_1", body, timestampS: 0 }), "x-delivery-id": "evt_1" };
      assert.equal(await (await fetch(`${receiver.url}/shop`, { method: "POST", headers, body })).text(), "stored");
      assert.equal(
        (
          await fetch(`${receiver.url}/shop`, {
            method: "POST",
            headers: { ...headers, "x-signature": "sha256=00" },
            body,
          })
        ).status,
        401,
      );
      await fetch(`${receiver.url}/shop`, {
        method: "POST",
        headers: { "x-delivery-id": "evt_2" },
        body: "not json " + MARKER,
      });
      await until("the log lines", 5_000, async () => receiver.log().split("\n").filter(Boolean).length >= 4);
    } finally {
      await receiver.stop();
    }
    const worker = await runScript("worker.ts", ["--once", "--db", db, "--log-format", "json", "--handler", "demo"]);
    assert.equal(worker.code, 0);
    const lines = [...receiver.log().split("\n"), ...worker.stderr.split("\n")].filter(Boolean);
    const events = lines.map((line) => JSON.parse(line) as Record<string, unknown>);
    for (const e of events) {
      assert.equal(typeof e.level, "number");
      assert.equal(typeof e.time, "number");
      assert.equal(typeof e.msg, "string");
    }
    assert.ok(
      events.some((e) => e.msg === "shop/evt_1 done" && e.source === "shop" && e.id === "evt_1" && e.status === "done"),
    );
    const stored = events.find((e) => e.msg === "stored shop/evt_1")!;
    assert.deepEqual([stored.level, stored.source, stored.id, stored.status], [30, "shop", "evt_1", 200]);
    assert.ok(events.some((e) => e.status === 401 && e.level === 40 && e.source === "shop"));
    assert.ok(!lines.some((l) => l.includes(MARKER) || l.includes(SECRET)), "no body, no secret");
    cleanup();
  });

  it("lineLog still writes the lines of one turn in one write, in either format", async () => {
    for (const format of ["text", "json"] as const) {
      const writes: string[] = [];
      const { log } = lineLog({ write: (text: string) => writes.push(text) }, format);
      log("one", { id: "a" });
      log("two", { id: "b", level: "warn" });
      await new Promise((resolve) => setImmediate(resolve));
      assert.equal(writes.length, 1);
      const lines = writes[0]!.trimEnd().split("\n");
      if (format === "text") assert.deepEqual(lines, ["one", "two"]);
      else
        assert.deepEqual(
          lines.map((l) => {
            const { time: _, ...rest } = JSON.parse(l);
            return rest;
          }),
          [
            { level: 30, msg: "one", id: "a" },
            { level: 40, msg: "two", id: "b" },
          ],
        );
    }
    assert.equal(jsonLine("x", {}, 5), '{"level":30,"time":5,"msg":"x"}');
  });
});

describe("progress", () => {
  it("prints nothing extra when the output is not a terminal", async () => {
    const { dir, cleanup } = tempDir();
    const db = join(dir, "inbox.db");
    const inbox = await connect(db);
    for (let i = 0; i < 3; i++)
      await inbox.store({ id: `evt_${i}`, body: Buffer.from(JSON.stringify({ customer: "Ann", amount: 1 })) });
    await inbox.close();
    const worker = await runScript("worker.ts", ["--once", "--db", db, "--handler", "demo"]);
    assert.equal(worker.code, 0);
    assert.deepEqual(worker.stderr.trimEnd().split("\n"), [
      "evt_0 done",
      "evt_1 done",
      "evt_2 done",
      "worker: 3 done, 0 to retry, 0 failed, 0 lost to other workers",
    ]);
    const writes: string[] = [];
    assert.equal(
      progress({ write: (s: string) => writes.push(s) }, () => ({ done: 1, total: 2 })),
      undefined,
    );
    assert.deepEqual(writes, []);
    cleanup();
  });

  it("draws done of total, the rate and the time left on a terminal, and clears it", () => {
    const writes: string[] = [];
    let ms = 0;
    const shown = progress({ write: (s: string) => writes.push(s), isTTY: true }, () => ({ done: 250, total: 1000 }), {
      now: () => ms,
    })!;
    ms = 1_000;
    shown.write("a log line\n");
    shown.stop();
    shown.write("after\n");
    assert.match(writes.join(""), /250 of 1,000 \(25%\), 250\/s, 3 s left/);
    assert.equal(writes.at(-2), "\r\x1b[K");
    assert.equal(writes.at(-1), "after\n", "once stopped, lines go straight through");
  });

  it("shows worker.ts --once's progress in a pseudo-terminal (script from util-linux)", async (t) => {
    if (spawnSync("script", ["--version"]).status !== 0) return t.skip("no script(1) here");
    const { dir, cleanup } = tempDir();
    const db = join(dir, "inbox.db");
    const inbox = await connect(db);
    for (let i = 0; i < 3; i++)
      await inbox.store({ id: `evt_${i}`, body: Buffer.from(JSON.stringify({ customer: "Ann", amount: 1 })) });
    await inbox.close();
    const tsx = join(ROOT, "node_modules", ".bin", "tsx");
    const out = spawnSync(
      "script",
      ["-qfec", `${process.execPath} --import tsx ${join(ROOT, "worker.ts")} --once --quiet --db ${db}`, "/dev/null"],
      { cwd: ROOT, encoding: "utf8", env: { ...process.env, PATH: `${join(tsx, "..")}:${process.env.PATH}` } },
    );
    assert.equal(out.status, 0, out.stderr);
    assert.match(out.stdout, /\r\x1b\[K0 of 3 \(0%\)/);
    assert.match(out.stdout, /worker: 3 done/);
    cleanup();
  });
});

describe("send.ts flood mode", () => {
  it("sends count deliveries with the share of duplicates asked for, and the summary matches the inbox", async () => {
    const { dir, cleanup } = tempDir();
    const inbox = await connect(join(dir, "inbox.db"));
    const receiver = createReceiver({ inbox, log: quiet });
    await new Promise<void>((resolve) => receiver.server.listen(0, "127.0.0.1", resolve));
    const { port } = receiver.server.address() as { port: number };
    let seed = 1;
    const random = () => ((seed = (seed * 16807) % 2147483647) - 1) / 2147483646;
    const summary = await flood(`http://127.0.0.1:${port}/`, { count: 400, concurrency: 8, duplicates: 0.25, random });
    assert.equal(summary.sent, 400);
    assert.equal(summary.stored + summary.duplicate, 400);
    assert.deepEqual([summary.errors, summary.refused], [0, {}]);
    assert.ok(
      summary.duplicate > 50 && summary.duplicate < 150,
      `about a quarter duplicates, got ${summary.duplicate}`,
    );
    assert.equal((await inbox.status()).counts.received, summary.stored);
    assert.ok(summary.p99Ms >= summary.p50Ms && summary.p50Ms > 0);
    const cli = await runScript("send.ts", [
      "--url",
      `http://127.0.0.1:${port}/`,
      "--count",
      "20",
      "--duplicates",
      "50%",
    ]);
    assert.equal(cli.code, 0, cli.stderr);
    assert.equal(cli.stderr, "", "not a terminal: no progress");
    assert.match(
      cli.stdout,
      /^sent 20 in \d+\.\d s: stored \d+, duplicate \d+, refused 0; \d+ req\/s; p50 [\d.]+ ms, p99 [\d.]+ ms\n$/,
    );
    await receiver.close();
    await inbox.close();
    cleanup();
  });
});

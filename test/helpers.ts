// test/helpers.ts: what every test file needs: throwaway folders, the scripts run as real child
// processes on this same runtime (Node, Node under tsx, Deno or Bun), and a receiver on a free port.

import { execFileSync, spawn, spawnSync, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import {
  closeSync,
  constants,
  existsSync,
  mkdtempSync,
  open,
  openSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { createServer, type IncomingHttpHeaders, type Server } from "node:http";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import type { Browser } from "playwright-core";
import { scriptCommand, signalChild } from "../lib/runtime.ts";

/** ROOT is the repository's top folder, where the scripts live. */
export const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");

/** tempDir makes a fresh folder and returns it with a function that removes it. */
export function tempDir(prefix = "inbox-test-"): { dir: string; cleanup: () => void } {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  return { dir, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

/** spawnScript starts one of the suite's scripts (a test fixture, or a script at an absolute path) on this same runtime, as this test runs (npm test: Node's own type stripping). */
export function spawnScript(script: string, args: string[] = [], env: NodeJS.ProcessEnv = {}): ChildProcess {
  const { command, args: all } = scriptCommand(resolve(ROOT, script), args);
  return spawn(command, all, {
    cwd: ROOT,
    env: { ...process.env, ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
}

/** runScript runs a script to the end and returns its exit code and output. */
export async function runScript(
  script: string,
  args: string[] = [],
  env: NodeJS.ProcessEnv = {},
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawnScript(script, args, env);
  let stdout = "";
  let stderr = "";
  child.stdout!.on("data", (d) => (stdout += d));
  child.stderr!.on("data", (d) => (stderr += d));
  const code = await new Promise<number | null>((resolve) => child.on("close", resolve));
  return { code, stdout, stderr };
}

/** ReceiverProcess is a receiver.ts child listening on a free port. */
export interface ReceiverProcess {
  child: ChildProcess;
  url: string;
  port: number;
  /** Everything it has written to stderr so far (its one line per delivery). */
  log(): string;
  /** stop sends SIGTERM (or the given signal) and resolves with the exit code. */
  stop(signal?: NodeJS.Signals): Promise<number | null>;
}

/** startReceiver starts receiver.ts (or another script that serves as it does) on port 0 and waits for its "Listening on" line. */
export async function startReceiver(
  db: string,
  args: string[] = [],
  env: NodeJS.ProcessEnv = {},
  script = "receiver.ts",
): Promise<ReceiverProcess> {
  const child = spawnScript(script, ["--port", "0", "--db", db, ...args], env);
  let stderr = "";
  child.stderr!.on("data", (d) => (stderr += d));
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
  const url = await new Promise<string>((resolve, reject) => {
    createInterface({ input: child.stdout! }).on("line", (line) => {
      const match = /^(?:\{.*"msg":")?Listening on (http:\/\/[^\s"]+)/.exec(line);
      if (match) resolve(match[1]!);
    });
    void exited.then((code) => reject(new Error(`receiver exited with ${code} before listening: ${stderr}`)));
  });
  return {
    child,
    url,
    port: Number(new URL(url).port),
    log: () => stderr,
    stop: async (signal = "SIGTERM") => {
      signalChild(child, signal);
      return exited;
    },
  };
}

/** WorkerProcess is a worker.ts child with its stderr kept. */
export interface WorkerProcess {
  child: ChildProcess;
  /** Everything it has written to stderr so far. */
  log(): string;
  /** stop sends SIGTERM and resolves with the exit code. */
  stop(): Promise<number | null>;
}

/** startWorker starts worker.ts on db with args and env; it does not wait for anything. */
export function startWorker(db: string, args: string[] = [], env: NodeJS.ProcessEnv = {}): WorkerProcess {
  const child = spawnScript("worker.ts", ["--db", db, ...args], env);
  let stderr = "";
  child.stderr!.on("data", (d) => (stderr += d));
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
  return {
    child,
    log: () => stderr,
    stop: () => {
      signalChild(child, "SIGTERM");
      return exited;
    },
  };
}

/** startAdmin runs admin.ts with args on a free port and resolves with its URL once it listens, and all it wrote so far (log()). */
export async function startAdmin(
  args: string[],
  env: NodeJS.ProcessEnv = {},
): Promise<{ url: string; child: ChildProcess; port: number; log: () => string }> {
  const port = await freePort();
  const child = spawnScript("admin.ts", [...args, "--port", String(port)], env);
  let out = "";
  await new Promise<void>((resolve, reject) => {
    child.stdout!.on("data", (d) => {
      out += d;
      if (out.includes("Operator page on")) resolve();
    });
    child.stderr!.on("data", (d) => (out += d));
    child.on("exit", (code) => reject(new Error(`admin.ts exited ${code}: ${out}`)));
  });
  return { url: `http://127.0.0.1:${port}`, child, port, log: () => out };
}

/** Forwarded is one request a destinationServer was sent: its path's name, the delivery's ID, its headers, body, and when it arrived. */
export interface Forwarded {
  to: string;
  id: string;
  headers: IncomingHttpHeaders;
  body: string;
  /** When its headers arrived, in ms since the epoch: when the forward started, as near as the server can tell. */
  at: number;
}

/**
 * destinationServer is a destination for forwards, on a free port: it keeps each request it is sent and
 * answers 200, each path (`/a` is destination a's) after its own delay in ms, none unless set.
 */
export async function destinationServer(): Promise<{
  server: Server;
  url: string;
  got: Forwarded[];
  delay: Map<string, number>;
}> {
  const got: Forwarded[] = [];
  const delay = new Map<string, number>();
  const server = createServer((req, res) => {
    const at = Date.now();
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const to = (req.url ?? "/").slice(1);
      const id = String(req.headers["inbox-delivery-id"]);
      got.push({ to, id, headers: req.headers, body: Buffer.concat(chunks).toString(), at });
      setTimeout(() => res.writeHead(200).end(), delay.get(to) ?? 0);
    });
  }).listen(0, "127.0.0.1");
  await once(server, "listening");
  return { server, url: `http://127.0.0.1:${(server.address() as { port: number }).port}`, got, delay };
}

/** until polls a condition every 25 ms, failing with what it waited for after ms (20 s unless given). */
export async function until(what: string, ok: () => boolean | Promise<boolean>, ms = 20_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await ok())) {
    if (Date.now() > end) throw new Error(`gave up waiting: ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

/** POSTGRES is the server the PostgreSQL tests use: INBOX_TEST_POSTGRES, else the local one. */
export const POSTGRES = process.env.INBOX_TEST_POSTGRES ?? "postgres://postgres@127.0.0.1:5432/test";

let reachable: Promise<string | false> | undefined;

/**
 * postgresSkip is false when the PostgreSQL server answers, else the reason to skip, said once in one
 * line. With INBOX_REQUIRE_POSTGRES=1 (as .ci/run sets it) an unreachable server fails the run instead.
 */
export function postgresSkip(): Promise<string | false> {
  reachable ??= (async () => {
    const { default: pg } = await import("pg");
    const client = new pg.Client({ connectionString: POSTGRES, connectionTimeoutMillis: 3_000 });
    try {
      await client.connect();
      await client.query("SELECT 1");
      return false;
    } catch (error) {
      const why = `no PostgreSQL at ${POSTGRES} (${error instanceof Error ? error.message : String(error)})`;
      if (process.env.INBOX_REQUIRE_POSTGRES === "1") throw new Error(`INBOX_REQUIRE_POSTGRES=1 but ${why}`);
      console.log(
        `# PostgreSQL tests skipped: ${why}; start PostgreSQL or set INBOX_TEST_POSTGRES=postgres://… to run them.`,
      );
      return why;
    } finally {
      await client.end().catch(() => {});
    }
  })();
  return reachable;
}

/** uniqueName is a lower-case SQL name of prefix's letters, unique to this process and call. */
function uniqueName(prefix: string): string {
  return `${prefix}_${process.pid}_${Math.random().toString(36).slice(2, 8)}`.toLowerCase().replace(/[^a-z0-9_]/g, "_");
}

/** freshSchema names a new, empty schema on the test server and returns its URL and how to drop it. */
export async function freshSchema(prefix: string): Promise<{ url: string; schema: string; drop: () => Promise<void> }> {
  const schema = uniqueName(prefix);
  const url = new URL(POSTGRES);
  url.searchParams.set("schema", schema);
  return {
    url: url.toString(),
    schema,
    drop: async () => {
      const { default: pg } = await import("pg");
      const client = new pg.Client({ connectionString: POSTGRES });
      await client.connect();
      try {
        await client.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
      } finally {
        await client.end();
      }
    },
  };
}

/** PG_SEARCH_ON turns a past PostgreSQL schema's search index on, as `inbox.ts search enable` left it (lib/postgres/searching.ts). */
export const PG_SEARCH_ON = `
  UPDATE search_state SET enabled = true, done = true;
  CREATE TRIGGER deliveries_search_insert AFTER INSERT ON delivery_rows
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION inbox_search_queue();
  CREATE TRIGGER deliveries_search_update AFTER UPDATE OF body ON delivery_rows
    FOR EACH ROW WHEN (NEW.route = 0) EXECUTE FUNCTION inbox_search_forget();
  CREATE TRIGGER deliveries_search_delete AFTER DELETE ON delivery_rows
    FOR EACH ROW WHEN (OLD.route = 0) EXECUTE FUNCTION inbox_search_forget();`;

/**
 * pastSchema makes an inbox as an older version of the code left it, for a test of the migrations after: a
 * SQLite file at path, or a PostgreSQL schema (its name: made here, in POSTGRES; freshSchema() names one and
 * drops it), at the migrations given, each recorded as that backend's migrate() records it. exec() writes
 * what that version wrote into it (and rejects what its tables refuse); close() lets go of it.
 */
export async function pastSchema(
  backend: "sqlite" | "postgres",
  target: string,
  migrations: readonly string[],
): Promise<{ exec(sql: string): Promise<void>; close(): Promise<void> }> {
  if (backend === "sqlite") {
    const { DatabaseSync } = await import("node:sqlite");
    const db = new DatabaseSync(target);
    for (const m of migrations) db.exec(m);
    db.exec(`PRAGMA user_version = ${migrations.length}`);
    return { exec: async (sql) => db.exec(sql), close: async () => db.close() };
  }
  const { default: pg } = await import("pg");
  const client = new pg.Client({ connectionString: POSTGRES });
  await client.connect();
  await client.query(`CREATE SCHEMA ${target}`);
  await client.query(`SET search_path = ${target}`);
  await client.query(
    "CREATE TABLE inbox_migrations (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())",
  );
  for (const [i, m] of migrations.entries()) {
    await client.query(m);
    await client.query("INSERT INTO inbox_migrations (version) VALUES ($1)", [i + 1]);
  }
  return { exec: async (sql) => void (await client.query(sql)), close: () => client.end() };
}

/**
 * bodyProbes connects to a PostgreSQL inbox's schema (a postgres:// URL with ?schema=) to count what a read costs
 * in delivery_bodies: probes(sql, id) runs the read, which must return one row, and says how many scans of the
 * table's partitions it made, from the backend's own counts before and after it in one transaction (they are
 * not flushed to the shared ones, nor reset, until the session is idle).
 */
export async function bodyProbes(
  url: string,
): Promise<{ probes(sql: string, id: string): Promise<number>; close(): Promise<void> }> {
  const { default: pg } = await import("pg");
  const schema = new URL(url).searchParams.get("schema")!;
  const client = new pg.Client({ connectionString: url.replace(/[?&]schema=([^&]+)/, "") });
  await client.connect();
  const scans = async () =>
    (
      await client.query(
        `SELECT coalesce(sum(coalesce(idx_scan, 0) + seq_scan), 0)::integer AS n FROM pg_stat_xact_user_tables
          WHERE schemaname = $1 AND relname LIKE 'delivery\\_bodies%'`,
        [schema],
      )
    ).rows[0].n as number;
  return {
    async probes(sql, id) {
      await client.query("BEGIN");
      try {
        // In the transaction, as a PgBouncer in transaction mode may give the next one another server connection.
        await client.query(`SET LOCAL search_path = ${schema}`);
        const before = await scans();
        const { rows } = await client.query(sql, [id]);
        if (rows.length !== 1) throw new Error(`bodyProbes: expected one row of ${id}, got ${rows.length}`);
        return (await scans()) - before;
      } finally {
        await client.query("COMMIT");
      }
    },
    close: () => client.end(),
  };
}

/** PrivatePostgres is a throwaway PostgreSQL cluster of one test file's own, which it may stop and restart. */
export interface PrivatePostgres {
  /** The URL of its `postgres` database; add ?schema= as usual. */
  url: string;
  port: number;
  /** start starts the server (again) and waits until it accepts connections. */
  start(): Promise<void>;
  /** stop stops it: fast ends sessions cleanly, immediate is a crash (recovery from the WAL on start). */
  stop(mode?: "fast" | "immediate"): Promise<void>;
  /** restart stops and starts it in one go. */
  restart(mode?: "fast" | "immediate"): Promise<void>;
  /** kill SIGKILLs every process of the server at once, as a machine that dies leaves it; it is not started again. */
  kill(): Promise<void>;
  /** standby makes a streaming standby of this server (pg_basebackup -R), started on a free port, and waits until it streams. */
  standby(settings?: Record<string, string>): Promise<PrivatePostgres>;
  /** promote turns a standby into a primary and waits until it takes writes. */
  promote(): Promise<void>;
  /** destroy stops it and removes its files. */
  destroy(): Promise<void>;
}

/** PG_BIN is the folder of the PostgreSQL server binaries (initdb, postgres), if any are installed. */
export const PG_BIN = ["17", "16", "15", "14", "13"]
  .map((v) => `/usr/lib/postgresql/${v}/bin`)
  .find((d) => existsSync(join(d, "initdb")));

// asPostgres runs one of the server's binaries, as the postgres user when this is root (initdb, pg_ctl and
// pgbouncer refuse to run as root), and throws with the end of its output if it fails.
async function asPostgres(path: string, args: string[]): Promise<void> {
  const asRoot = process.getuid?.() === 0;
  const [cmd, all] = asRoot ? ["runuser", ["-u", "postgres", "--", path, ...args]] : [path, args];
  const r = await new Promise<{ code: number | null; out: string }>((resolve) => {
    const child = spawn(cmd as string, all as string[], { stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    child.stdout.on("data", (d) => (out += d));
    child.stderr.on("data", (d) => (out += d));
    child.on("close", (code) => resolve({ code, out }));
    child.on("error", (error) => resolve({ code: -1, out: error.message }));
  });
  if (r.code !== 0)
    throw new Error(`${path} ${args.join(" ")}: exit ${r.code}: ${r.out.trim().split("\n").slice(-3).join(" / ")}`);
}

// A folder the postgres user owns, when this is root.
async function ownFolder(prefix: string): Promise<{ dir: string; cleanup: () => void }> {
  const made = tempDir(prefix);
  if (process.getuid?.() === 0) {
    const { chownSync } = await import("node:fs");
    const { execFileSync } = await import("node:child_process");
    chownSync(
      made.dir,
      Number(execFileSync("id", ["-u", "postgres"]).toString()),
      Number(execFileSync("id", ["-g", "postgres"]).toString()),
    );
  }
  return made;
}

/**
 * privatePostgres initialises a cluster in a temp folder and starts it on a free port. The machine's shared
 * server is never restarted: other test runs use it at the same time. Returns the reason to skip, in one
 * line, where the PostgreSQL binaries are absent; with INBOX_REQUIRE_POSTGRES=1 it throws instead.
 * settings are passed to the server as -c name=value (synchronous_standby_names for a failover test).
 */
export async function privatePostgres(
  options: { settings?: Record<string, string> } = {},
): Promise<PrivatePostgres | string> {
  const missing = (why: string) => {
    if (process.env.INBOX_REQUIRE_POSTGRES === "1") throw new Error(`INBOX_REQUIRE_POSTGRES=1 but ${why}`);
    console.log(`# private PostgreSQL tests skipped: ${why}; install PostgreSQL's server binaries to run them.`);
    return why;
  };
  if (!PG_BIN) return missing("no initdb under /usr/lib/postgresql/*/bin");
  const { dir, cleanup } = await ownFolder("inbox-pg-");
  const data = join(dir, "data");
  try {
    await asPostgres(join(PG_BIN, "initdb"), ["-D", data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"]);
  } catch (error) {
    cleanup();
    return missing(`initdb failed (${error instanceof Error ? error.message : String(error)})`);
  }
  return cluster(dir, data, cleanup, options.settings ?? {});
}

// cluster starts the cluster in data on a free port and returns its handle.
async function cluster(
  dir: string,
  data: string,
  cleanup: () => void,
  settings: Record<string, string>,
): Promise<PrivatePostgres> {
  const bin = PG_BIN!;
  const port = await freePort();
  const extra = Object.entries(settings)
    .map(([name, value]) => ` -c ${name}='${value}'`)
    .join("");
  const options = `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100${extra}`;
  const pgctl = (args: string[]) =>
    asPostgres(join(bin, "pg_ctl"), ["-D", data, "-l", join(dir, "log"), "-o", options, "-w", "-t", "60", ...args]);
  const url = `postgres://postgres@127.0.0.1:${port}/postgres`;
  const server: PrivatePostgres = {
    url,
    port,
    start: () => pgctl(["start"]),
    stop: (mode = "fast") => pgctl(["stop", "-m", mode]),
    restart: (mode = "fast") => pgctl(["restart", "-m", mode]),
    kill: async () => {
      const { readFileSync, readdirSync } = await import("node:fs");
      const { execFileSync } = await import("node:child_process");
      const lines = readFileSync(join(data, "postmaster.pid"), "utf8").split("\n");
      const postmaster = Number(lines[0]);
      const children = readdirSync("/proc")
        .filter((p) => /^\d+$/.test(p))
        .filter((p) => {
          try {
            return (
              Number(
                readFileSync(`/proc/${p}/stat`, "utf8")
                  .replace(/^.*\) /s, "")
                  .split(" ")[1],
              ) === postmaster
            );
          } catch {
            return false; // it ended while we looked
          }
        })
        .map(Number);
      for (const pid of [postmaster, ...children]) {
        try {
          process.kill(pid, "SIGKILL");
        } catch {
          // a backend that ended on its own meanwhile
        }
      }
      while (
        [postmaster, ...children].some(
          (pid) => existsSync(`/proc/${pid}`) && !/\) Z /.test(readFileSync(`/proc/${pid}/stat`, "utf8")),
        )
      ) {
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
      // A killed postmaster leaves its System V segment behind; nothing else will remove it.
      const shmid = (lines[6] ?? "").trim().split(/\s+/)[1];
      if (shmid) {
        try {
          execFileSync("ipcrm", ["-m", shmid], { stdio: "ignore" });
        } catch {
          // already gone
        }
      }
    },
    standby: async (standbySettings = {}) => {
      const made = await ownFolder("inbox-pg-standby-");
      const standbyData = join(made.dir, "data");
      await asPostgres(join(bin, "pg_basebackup"), [
        "-D",
        standbyData,
        "-R",
        "-X",
        "stream",
        "-c",
        "fast",
        "-h",
        "127.0.0.1",
        "-p",
        String(port),
        "-U",
        "postgres",
      ]);
      const standby = await cluster(made.dir, standbyData, made.cleanup, standbySettings);
      // Streaming, and as synchronous as this server asks it to be, before anyone counts on it.
      const { default: pg } = await import("pg");
      const client = new pg.Client({ connectionString: url });
      await client.connect();
      try {
        for (let i = 0; ; i++) {
          const { rows } = await client.query(
            `SELECT count(*) FILTER (WHERE state = 'streaming' AND (current_setting('synchronous_standby_names') = '' OR sync_state = 'sync')) AS ok
             FROM pg_stat_replication`,
          );
          if (Number(rows[0].ok) > 0) break;
          if (i > 600) throw new Error(`the standby on port ${standby.port} did not stream within a minute`);
          await new Promise((resolve) => setTimeout(resolve, 100));
        }
      } finally {
        await client.end();
      }
      return standby;
    },
    promote: () => pgctl(["promote"]),
    destroy: async () => {
      await server.stop("immediate").catch(() => {});
      cleanup();
    },
  };
  await server.start();
  return server;
}

/** PrivatePgBouncer is a PgBouncer of one test file's own, in transaction mode, in front of a PostgreSQL server. */
export interface PrivatePgBouncer {
  /** The URL of the upstream's database through PgBouncer (with ?listen=false, as the inbox needs there). */
  url: string;
  port: number;
  /** admin runs a command on PgBouncer's console (SHOW STATS, SHOW POOLS …) and returns its rows. */
  admin(command: string): Promise<Record<string, unknown>[]>;
  stop(): Promise<void>;
}

/** PGBOUNCER is the PgBouncer binary: INBOX_PGBOUNCER, else Debian's package. */
export const PGBOUNCER = process.env.INBOX_PGBOUNCER ?? "/usr/sbin/pgbouncer";

/**
 * privatePgBouncer starts PgBouncer in transaction mode on a free port in front of upstream (the test
 * server by default), with pool_size server connections. Returns the reason to skip, in one line, where the
 * binary is absent; with INBOX_REQUIRE_PGBOUNCER=1 (as .ci/run sets it) it throws instead.
 */
export async function privatePgBouncer(upstream = POSTGRES, poolSize = 10): Promise<PrivatePgBouncer | string> {
  if (!existsSync(PGBOUNCER)) {
    const why = `no PgBouncer at ${PGBOUNCER}`;
    if (process.env.INBOX_REQUIRE_PGBOUNCER === "1")
      throw new Error(`INBOX_REQUIRE_PGBOUNCER=1 but ${why} (apt-get install -y pgbouncer)`);
    console.log(
      `# PgBouncer tests skipped: ${why}; apt-get install -y pgbouncer (or set INBOX_PGBOUNCER) to run them.`,
    );
    return why;
  }
  const up = new URL(upstream);
  const { dir, cleanup } = await ownFolder("inbox-pgbouncer-");
  const { writeFileSync } = await import("node:fs");
  const port = await freePort();
  writeFileSync(join(dir, "users.txt"), `"${decodeURIComponent(up.username) || "postgres"}" ""\n`);
  writeFileSync(
    join(dir, "pgbouncer.ini"),
    [
      "[databases]",
      `* = host=${up.hostname} port=${up.port || 5432}`,
      "[pgbouncer]",
      "listen_addr = 127.0.0.1",
      `listen_port = ${port}`,
      "unix_socket_dir =",
      "auth_type = trust",
      `auth_file = ${join(dir, "users.txt")}`,
      `admin_users = ${decodeURIComponent(up.username) || "postgres"}`,
      "pool_mode = transaction",
      `default_pool_size = ${poolSize}`,
      "max_client_conn = 500",
      `logfile = ${join(dir, "log")}`,
      "",
    ].join("\n"),
  );
  const asRoot = process.getuid?.() === 0;
  const args = [join(dir, "pgbouncer.ini")];
  const child = asRoot
    ? spawn("runuser", ["-u", "postgres", "--", PGBOUNCER, ...args], { stdio: "ignore" })
    : spawn(PGBOUNCER, args, { stdio: "ignore" });
  const exited = new Promise<number | null>((resolve) => child.on("exit", resolve));
  const { default: pg } = await import("pg");
  const admin = async (command: string) => {
    const client = new pg.Client({
      connectionString: `postgres://${up.username || "postgres"}@127.0.0.1:${port}/pgbouncer`,
    });
    await client.connect();
    try {
      return (await client.query(command)).rows as Record<string, unknown>[];
    } finally {
      await client.end();
    }
  };
  for (let i = 0; ; i++) {
    try {
      await admin("SHOW VERSION");
      break;
    } catch (error) {
      if (child.exitCode !== null || i > 100) {
        child.kill("SIGKILL");
        cleanup();
        throw new Error(
          `pgbouncer did not start on port ${port}: ${error instanceof Error ? error.message : String(error)}`,
        );
      }
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }
  const url = new URL(upstream);
  url.host = `127.0.0.1:${port}`;
  url.searchParams.set("listen", "false");
  return {
    url: url.toString(),
    port,
    admin,
    stop: async () => {
      // runuser passes SIGTERM on to PgBouncer, which closes its connections and exits.
      child.kill("SIGTERM");
      await exited;
      cleanup();
    },
  };
}

/**
 * refuseAudit makes every insert into an inbox's audit log fail, as a full disk or a revoked privilege would
 * (a trigger, on either backend), and returns how to let them through again.
 */
export async function refuseAudit(inbox: {
  backend: string;
  query(sql: string): Promise<unknown>;
}): Promise<() => Promise<void>> {
  if (inbox.backend === "sqlite") {
    await inbox.query(
      "CREATE TRIGGER refuse_audit BEFORE INSERT ON audit BEGIN SELECT RAISE(ABORT, 'audit refused'); END",
    );
    return async () => void (await inbox.query("DROP TRIGGER refuse_audit"));
  }
  await inbox.query(
    "CREATE FUNCTION refuse_audit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'audit refused'; END $$",
  );
  await inbox.query("CREATE TRIGGER refuse_audit BEFORE INSERT ON audit FOR EACH ROW EXECUTE FUNCTION refuse_audit()");
  return async () => {
    await inbox.query("DROP TRIGGER refuse_audit ON audit");
    await inbox.query("DROP FUNCTION refuse_audit()");
  };
}

/** freePort asks the system for a TCP port nobody listens on right now. */
export async function freePort(): Promise<number> {
  const { createServer } = await import("node:net");
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.on("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolve(port));
    });
  });
}

/**
 * runtimeBinary finds Deno's or Bun's binary: in node_modules/.bin, where npm install puts the pinned dev
 * dependency, else on PATH. Absent, it says once in one line what is skipped and returns undefined; with
 * INBOX_REQUIRE_DENO=1 or INBOX_REQUIRE_BUN=1 (as .ci/run sets them) it throws instead.
 */
export function runtimeBinary(name: "deno" | "bun", skipped: string): string | undefined {
  const local = join(ROOT, "node_modules", ".bin", name);
  if (existsSync(local)) return local;
  const which = spawnSync("which", [name], { encoding: "utf8" });
  if (which.status === 0) return which.stdout.trim();
  const why = `no ${name} in node_modules/.bin or on PATH`;
  const require = `INBOX_REQUIRE_${name.toUpperCase()}`;
  if (process.env[require] === "1") throw new Error(`${require}=1 but ${why} (npm install brings it)`);
  console.log(`# ${skipped} skipped: ${why}; npm install (it is a dev dependency) to run them.`);
  return undefined;
}

/** CHROMIUM is the browser the tests drive: INBOX_CHROMIUM, else Debian's package. */
export const CHROMIUM = process.env.INBOX_CHROMIUM ?? "/usr/bin/chromium";

/** CHROMIUM_ARGS keep a headless run quiet and offline: no sandbox (root in a container), no GPU, no phoning home. */
export const CHROMIUM_ARGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

/** chromiumSkip is false when Chromium is there, else the reason to skip, said once; required, it throws. */
export function chromiumSkip(): string | false {
  if (existsSync(CHROMIUM)) return false;
  const why = `no Chromium at ${CHROMIUM}`;
  if (process.env.INBOX_REQUIRE_CHROMIUM === "1")
    throw new Error(`INBOX_REQUIRE_CHROMIUM=1 but ${why} (apt-get install -y chromium)`);
  console.log(`# Browser tests skipped: ${why}; apt-get install -y chromium to run them.`);
  return why;
}

/** launchChromium starts the browser with a fresh profile of its own (playwright makes one per launch). */
export async function launchChromium(): Promise<Browser> {
  const { chromium } = await import("playwright-core");
  return chromium.launch({ executablePath: CHROMIUM, args: CHROMIUM_ARGS, headless: true });
}

/** TestBackend is one store the shared suites run against: its name, why it is skipped, and a fresh target. */
export interface TestBackend {
  name: "sqlite" | "postgres";
  skip: string | false;
  /**
   * make prepares an empty target (a file, or a database copied from an empty inbox: freshInbox()) and says how to
   * remove it; with empty, a PostgreSQL schema with nothing in it (freshSchema()), for code of another tree to migrate.
   */
  make(options?: { empty?: boolean }): Promise<{ target: string; cleanup: () => Promise<void> }>;
}

/** backends lists both stores for a suite: a SQLite file in a temp folder, and a fresh database named after prefix. */
export async function backends(prefix: string): Promise<TestBackend[]> {
  return [
    {
      name: "sqlite",
      skip: false,
      make: async () => {
        const dir = tempDir();
        return { target: join(dir.dir, "inbox.db"), cleanup: async () => dir.cleanup() };
      },
    },
    {
      name: "postgres",
      skip: await postgresSkip(),
      make: async (options = {}) => {
        const fresh = options.empty ? await freshSchema(prefix) : await freshInbox(prefix);
        return { target: fresh.url, cleanup: fresh.drop };
      },
    },
  ];
}

/** T0 is where the pinned clock of the contract suite starts each test, in ms since the epoch. */
export const T0 = 1_700_000_000_000;

/**
 * POSTGRES_ADMIN is where the test databases are made and dropped: INBOX_TEST_POSTGRES_ADMIN, else POSTGRES. A
 * run through PgBouncer sets it to the server itself, as a database in use through a pooler's connection could
 * be neither renamed nor copied.
 */
const POSTGRES_ADMIN = process.env.INBOX_TEST_POSTGRES_ADMIN ?? POSTGRES;

// on names a database on the server of url, keeping its user, host and options: ?schema= adds the inbox's schema.
function on(url: string, database: string, schema?: string): string {
  const u = new URL(url);
  u.pathname = `/${database}`;
  if (schema) u.searchParams.set("schema", schema);
  return u.toString();
}

// adminRun runs one statement on the server, on a connection of its own (CREATE DATABASE takes no transaction),
// and returns its rows, trying again while the database it names is still in use by connections a closed
// inbox let go a moment ago (tries: how often, at 50 ms apart).
async function adminRun(sql: string, params: unknown[] = [], tries = 100): Promise<Record<string, unknown>[]> {
  const { default: pg } = await import("pg");
  const client = new pg.Client({ connectionString: POSTGRES_ADMIN });
  await client.connect();
  try {
    for (let tried = 1; ; tried++) {
      try {
        return (await client.query(sql, params)).rows;
      } catch (error) {
        // 55006: object_in_use, a source or a renamed database some session still has open.
        if ((error as { code?: string }).code !== "55006" || tried >= tries) throw error;
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
    }
  } finally {
    await client.end();
  }
}

let template: Promise<string> | undefined;

/**
 * inboxTemplate is a database that holds an empty inbox, opened once on the pinned clock at T0 (migrated, its
 * days made), for backends() to copy per test: a copy takes about 50 ms where migrating a fresh schema took
 * 300–700 ms, most of a PostgreSQL test's time. It is named after the text of what an open runs (every file
 * of lib/postgres/, and the defaults), so a change to them makes a new one, one made by a run of other code is
 * never used, and the templates of other code are dropped when a new one is built. Processes that find it
 * missing each build one under a name of their own, and rename it; the one whose rename loses drops its own.
 * None is ever connected to once built, as a copy needs.
 */
export function inboxTemplate(): Promise<string> {
  template ??= (async () => {
    const { createHash } = await import("node:crypto");
    const hash = createHash("sha256");
    const postgres = readdirSync(join(ROOT, "lib", "postgres")).sort();
    for (const file of [...postgres.map((f) => `lib/postgres/${f}`), "lib/defaults.ts"])
      hash.update(readFileSync(join(ROOT, file)));
    const name = `inbox_template_${hash.digest("hex").slice(0, 16)}`;
    const built = await adminRun("SELECT datname FROM pg_database WHERE datname ~ '^inbox_template_[0-9a-f]{16}$'");
    if (built.some((d) => d.datname === name)) return name;
    // Templates of other code (built ones only: one being built has a suffix) are dropped while nothing has
    // them open: no FORCE, one try. A run of that code copying one at this moment keeps it, and one that
    // finds it gone a moment later builds its own again (freshInbox()).
    for (const { datname } of built) await adminRun(`DROP DATABASE IF EXISTS ${datname}`, [], 1).catch(() => {});
    const building = uniqueName(name);
    await adminRun(`CREATE DATABASE ${building}`);
    try {
      const { connect } = await import("../inbox.ts");
      const inbox = await connect(on(POSTGRES_ADMIN, building, "inbox"), { now: () => T0 });
      await inbox.close();
      await adminRun(`ALTER DATABASE ${building} RENAME TO ${name}`);
    } catch (error) {
      await adminRun(`DROP DATABASE IF EXISTS ${building} WITH (FORCE)`);
      // 42P04: another process's rename came first; its template is the same.
      if ((error as { code?: string }).code !== "42P04") throw error;
    }
    return name;
  })();
  return template;
}

/**
 * freshInbox copies inboxTemplate() into a database of its own, named after prefix, and returns the URL of
 * its inbox (on POSTGRES's server, through PgBouncer where the run goes through it) and how to drop it.
 */
export async function freshInbox(prefix: string): Promise<{ url: string; drop: () => Promise<void> }> {
  const database = uniqueName(prefix);
  try {
    await adminRun(`CREATE DATABASE ${database} TEMPLATE ${await inboxTemplate()}`);
  } catch (error) {
    // 3D000: the template was dropped by a run of other code after this process found it; build it again.
    if ((error as { code?: string }).code !== "3D000") throw error;
    template = undefined;
    await adminRun(`CREATE DATABASE ${database} TEMPLATE ${await inboxTemplate()}`);
  }
  return {
    url: on(POSTGRES, database, "inbox"),
    // FORCE: a pooler's idle server connections to it, or those of an inbox a test left open, end with it.
    drop: async () => {
      await adminRun(`DROP DATABASE IF EXISTS ${database} WITH (FORCE)`);
    },
  };
}

/**
 * CONTRACT_FILES are the files of the contract suite, test/contract-*.test.ts, one per area, in name
 * order: the suite that holds both backends to the Inbox contract, which other files run whole (behind
 * PgBouncer, on Deno and Bun).
 */
export const CONTRACT_FILES: readonly string[] = readdirSync(join(ROOT, "test"))
  .filter((f) => /^contract-[\w-]+\.test\.ts$/.test(f))
  .sort()
  .map((f) => `test/${f}`);

/**
 * schemaClient is a plain pg client of its own on POSTGRES, with an inbox's schema as its search path and lockMs as
 * its lock_timeout (0: wait): a part of a test that must hold, write or wait beside an inbox on its own connection.
 */
export async function schemaClient(schema: string, lockMs = 0): Promise<import("pg").Client> {
  const { default: pg } = await import("pg");
  const c = new pg.Client({ connectionString: POSTGRES, options: `-c search_path=${schema}` });
  c.on("error", () => {});
  await c.connect();
  await c.query(`SET lock_timeout = '${lockMs}ms'`);
  return c;
}

/**
 * holding opens a REPEATABLE READ transaction on holder, its snapshot taken, and returns its virtual transaction
 * ID: a transaction older than a concurrent index build, which the build's last phase waits for until it ends.
 */
export async function holding(holder: import("pg").Client): Promise<string> {
  await holder.query("BEGIN ISOLATION LEVEL REPEATABLE READ");
  await holder.query("SELECT 1");
  return (await holder.query("SELECT virtualtransaction AS vxid FROM pg_locks WHERE pid = pg_backend_pid() LIMIT 1"))
    .rows[0].vxid as string;
}

/** waitingOn returns once the backend pid waits for the transaction vxid (holding()'s), as watcher sees it. */
export async function waitingOn(watcher: import("pg").Client, pid: number, vxid: string): Promise<void> {
  for (;;) {
    const { rowCount } = await watcher.query(
      "SELECT 1 FROM pg_locks WHERE pid = $1 AND NOT granted AND locktype = 'virtualxid' AND virtualxid = $2",
      [pid, vxid],
    );
    if (rowCount) return;
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

/** NATS is the JetStream server the broker tests use: INBOX_TEST_NATS, else the local one. */
export const NATS = process.env.INBOX_TEST_NATS ?? "nats://127.0.0.1:4222";

/** RABBITMQ is the RabbitMQ server the broker tests use: INBOX_TEST_RABBITMQ, else the local one as guest. */
export const RABBITMQ = process.env.INBOX_TEST_RABBITMQ ?? "amqp://guest:guest@127.0.0.1:5672";

let natsReachable: Promise<string | false> | undefined;
let rabbitReachable: Promise<string | false> | undefined;

// skipOrRequire turns a failed probe into the one line that says what was skipped, or, when the run
// requires the service (INBOX_REQUIRE_<NAME>=1, as .ci/run sets it), into a failure.
function skipOrRequire(what: string, variable: string, why: string, how: string): string {
  if (process.env[variable] === "1") throw new Error(`${variable}=1 but ${why}`);
  console.log(`# ${what} tests skipped: ${why}; ${how}`);
  return why;
}

// probing asks a broker three times, a second apart, before it is taken for absent: on a machine loaded by
// other test files, NATS's JetStream answer once took longer than the 3 s a probe waits, and a run that
// requires the broker (INBOX_REQUIRE_NATS=1, as CI) would have failed every broker test for it.
async function probing(probe: () => Promise<void>): Promise<void> {
  for (let tries = 1; ; tries++) {
    try {
      return await probe();
    } catch (error) {
      if (tries >= 3) throw error;
      await new Promise((resolve) => setTimeout(resolve, 1_000));
    }
  }
}

/** natsSkip is false when NATS with JetStream answers, else the reason to skip, said once; INBOX_REQUIRE_NATS=1 fails instead. */
export function natsSkip(): Promise<string | false> {
  natsReachable ??= (async () => {
    const { connect } = await import("@nats-io/transport-node");
    const { jetstreamManager } = await import("@nats-io/jetstream");
    try {
      await probing(async () => {
        // The client's own connect timeout, when it fires before the server's first answer, leaves the
        // socket that answer then opens with nobody to close it, and the test file's process never ends
        // (seen under load). So the probe waits 3 s itself, and an attempt it gave up on is closed when it lands.
        const attempt = connect({ servers: NATS, timeout: 20_000, reconnect: false });
        let bound: NodeJS.Timeout | undefined;
        const nc = await Promise.race([
          attempt,
          new Promise<never>((_, reject) => {
            bound = setTimeout(() => {
              attempt.then(
                (late) => late.close(),
                () => {},
              );
              reject(new Error("no answer within 3 s"));
            }, 3_000);
          }),
        ]).finally(() => clearTimeout(bound));
        try {
          await (await jetstreamManager(nc)).getAccountInfo();
        } finally {
          await nc.close();
        }
      });
      return false;
    } catch (error) {
      return skipOrRequire(
        "NATS JetStream",
        "INBOX_REQUIRE_NATS",
        `no NATS JetStream at ${NATS} (${error instanceof Error ? error.message : String(error)})`,
        "start nats-server -js or set INBOX_TEST_NATS=nats://… to run them.",
      );
    }
  })();
  return natsReachable;
}

/** rabbitmqSkip is false when RabbitMQ answers, else the reason to skip, said once; INBOX_REQUIRE_RABBITMQ=1 fails instead. */
export function rabbitmqSkip(): Promise<string | false> {
  rabbitReachable ??= (async () => {
    const amqp = await import("amqplib");
    try {
      await probing(async () => {
        const model = await amqp.connect(RABBITMQ, { timeout: 3_000 });
        await model.close();
      });
      return false;
    } catch (error) {
      const where = new URL(RABBITMQ);
      return skipOrRequire(
        "RabbitMQ",
        "INBOX_REQUIRE_RABBITMQ",
        `no RabbitMQ at ${where.host} (${error instanceof Error ? error.message : String(error)})`,
        "start rabbitmq-server or set INBOX_TEST_RABBITMQ=amqp://… to run them.",
      );
    }
  })();
  return rabbitReachable;
}

/**
 * brokerRestartSkip is false when the broker type's server is reachable, local, and can be restarted here
 * (rabbitmqctl, or nats-server and start-stop-daemon), else the reason to skip, said once;
 * INBOX_REQUIRE_NATS=1 or INBOX_REQUIRE_RABBITMQ=1 fails instead.
 */
export async function brokerRestartSkip(type: "nats" | "rabbitmq"): Promise<string | false> {
  const down = type === "nats" ? await natsSkip() : await rabbitmqSkip();
  if (down) return down;
  const host = new URL(type === "nats" ? NATS : RABBITMQ).hostname;
  const tools = type === "nats" ? ["/usr/sbin/nats-server", "/usr/sbin/start-stop-daemon"] : ["/usr/sbin/rabbitmqctl"];
  const missing = tools.filter((t) => !existsSync(t));
  const why =
    host !== "127.0.0.1" && host !== "localhost"
      ? `the ${type} server at ${host} is not local`
      : missing.length > 0
        ? `${missing.join(" and ")} not found`
        : undefined;
  if (!why) return false;
  return skipOrRequire(
    `${type === "nats" ? "NATS JetStream" : "RabbitMQ"} restart`,
    type === "nats" ? "INBOX_REQUIRE_NATS" : "INBOX_REQUIRE_RABBITMQ",
    why,
    "run them where the broker is local and its tools are installed.",
  );
}

/** opensslSkip is false when openssl runs, else the reason, said once; required, it throws instead. */
export function opensslSkip(): string | false {
  if (spawnSync("openssl", ["version"]).status === 0) return false;
  const why = "no openssl on PATH";
  if (process.env.INBOX_REQUIRE_OPENSSL === "1")
    throw new Error(`INBOX_REQUIRE_OPENSSL=1 but ${why} (apt-get install -y openssl)`);
  console.log(`# TLS forwarding tests skipped: ${why}; apt-get install -y openssl to run them.`);
  return why;
}

/** Pki is a private CA and a server certificate it signed for 127.0.0.1, and another CA that signed nothing. */
export interface Pki {
  caFile: string;
  otherCaFile: string;
  key: Buffer;
  cert: Buffer;
}

/** pki makes the certificates with openssl in dir: EC keys, valid for two days. */
export function pki(dir: string): Pki {
  const run = (...args: string[]) => {
    const r = spawnSync("openssl", args, { cwd: dir, encoding: "utf8" });
    if (r.status !== 0) throw new Error(`openssl ${args[0]}: ${r.stderr}`);
  };
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
  for (const name of ["ca", "other-ca"]) {
    run(
      "req",
      "-x509",
      ...ec,
      "-keyout",
      `${name}.key`,
      "-out",
      `${name}.pem`,
      "-days",
      "2",
      "-subj",
      `/CN=inbox test ${name}`,
      "-addext",
      "basicConstraints=critical,CA:TRUE",
      "-addext",
      "keyUsage=critical,keyCertSign,cRLSign",
    );
  }
  run("req", ...ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1");
  writeFileSync(
    join(dir, "server.ext"),
    "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
  );
  run(
    "x509",
    "-req",
    "-in",
    "server.csr",
    "-CA",
    "ca.pem",
    "-CAkey",
    "ca.key",
    "-CAcreateserial",
    "-out",
    "server.pem",
    "-days",
    "2",
    "-extfile",
    "server.ext",
  );
  return {
    caFile: join(dir, "ca.pem"),
    otherCaFile: join(dir, "other-ca.pem"),
    key: readFileSync(join(dir, "server.key")),
    cert: readFileSync(join(dir, "server.pem")),
  };
}

/**
 * holdThreadPool occupies every thread of libuv's pool with an open() of a named pipe (made in dir) that blocks
 * until its other end is opened; release() opens those ends, and the pool is free again. What waits for the
 * pool (syncOffLoop's fdatasync of the WAL) is then plain to see.
 */
export async function holdThreadPool(dir: string): Promise<{ release: () => Promise<void> }> {
  const size = Number(process.env.UV_THREADPOOL_SIZE ?? 4);
  const fifos = Array.from({ length: size }, (_, i) => join(dir, `hold${i}`));
  for (const fifo of fifos) execFileSync("mkfifo", [fifo]);
  const readers = fifos.map(
    (fifo) =>
      new Promise<number>((resolve, reject) => open(fifo, "r", (error, fd) => (error ? reject(error) : resolve(fd)))),
  );
  // Each open() is on its thread once the main thread has had a turn to hand it over.
  await turns(2);
  let released = false;
  return {
    release: async () => {
      if (released) return;
      released = true;
      const writers = fifos.map((fifo) => openSync(fifo, constants.O_WRONLY | constants.O_NONBLOCK));
      for (const fd of await Promise.all(readers)) closeSync(fd);
      for (const fd of writers) closeSync(fd);
    },
  };
}

/** turns lets the event loop go round n times: enough for a group commit, which runs on the next one. */
export async function turns(n: number): Promise<void> {
  for (let i = 0; i < n; i++) await new Promise((resolve) => setImmediate(resolve));
}

// test/helpers.ts: what every test file needs: throwaway folders, the scripts run as real child
// processes on this same runtime (Node under tsx, Node, Deno or Bun), and a receiver on a free port.

import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import type { Browser } from "playwright-core";
import { scriptCommand, signalChild } from "../runtime.ts";

/** ROOT is the repository's top folder, where the scripts live. */
export const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");

/** tempDir makes a fresh folder and returns it with a function that removes it. */
export function tempDir(prefix = "inbox-test-"): { dir: string; cleanup: () => void } {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  return { dir, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

/** spawnScript starts one of the suite's scripts (or a test fixture) on this same runtime, as this test runs (tsx on Node). */
export function spawnScript(script: string, args: string[] = [], env: NodeJS.ProcessEnv = {}): ChildProcess {
  const { command, args: all } = scriptCommand(join(ROOT, script), args);
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

/** startReceiver starts receiver.ts on port 0 and waits for its "Listening on" line. */
export async function startReceiver(db: string, args: string[] = [], env: NodeJS.ProcessEnv = {}): Promise<ReceiverProcess> {
  const child = spawnScript("receiver.ts", ["--port", "0", "--db", db, ...args], env);
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
      console.log(`# PostgreSQL tests skipped: ${why}; start PostgreSQL or set INBOX_TEST_POSTGRES=postgres://… to run them.`);
      return why;
    } finally {
      await client.end().catch(() => {});
    }
  })();
  return reachable;
}

/** freshSchema names a new, empty schema on the test server and returns its URL and how to drop it. */
export async function freshSchema(prefix: string): Promise<{ url: string; schema: string; drop: () => Promise<void> }> {
  const schema = `${prefix}_${process.pid}_${Math.random().toString(36).slice(2, 8)}`.toLowerCase().replace(/[^a-z0-9_]/g, "_");
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
  /** destroy stops it and removes its files. */
  destroy(): Promise<void>;
}

const PG_BIN = ["17", "16", "15", "14", "13"].map((v) => `/usr/lib/postgresql/${v}/bin`).find((d) => existsSync(join(d, "initdb")));

/**
 * privatePostgres initialises a cluster in a temp folder and starts it on a free port. The machine's shared
 * server is never restarted: other test runs use it at the same time. Returns the reason to skip, in one
 * line, where the PostgreSQL binaries are absent; with INBOX_REQUIRE_POSTGRES=1 it throws instead.
 */
export async function privatePostgres(): Promise<PrivatePostgres | string> {
  const missing = (why: string) => {
    if (process.env.INBOX_REQUIRE_POSTGRES === "1") throw new Error(`INBOX_REQUIRE_POSTGRES=1 but ${why}`);
    console.log(`# private PostgreSQL tests skipped: ${why}; install PostgreSQL's server binaries to run them.`);
    return why;
  };
  if (!PG_BIN) return missing("no initdb under /usr/lib/postgresql/*/bin");
  const { dir, cleanup } = tempDir("inbox-pg-");
  const data = join(dir, "data");
  // initdb refuses to run as root: run the server binaries as the postgres user, owning the folder.
  const asRoot = process.getuid?.() === 0;
  const exec = async (bin: string, args: string[]) => {
    const [cmd, all] = asRoot ? ["runuser", ["-u", "postgres", "--", join(PG_BIN, bin), ...args]] : [join(PG_BIN, bin), args];
    const r = await new Promise<{ code: number | null; out: string }>((resolve) => {
      const child = spawn(cmd as string, all as string[], { stdio: ["ignore", "pipe", "pipe"] });
      let out = "";
      child.stdout.on("data", (d) => (out += d));
      child.stderr.on("data", (d) => (out += d));
      child.on("close", (code) => resolve({ code, out }));
      child.on("error", (error) => resolve({ code: -1, out: error.message }));
    });
    if (r.code !== 0) throw new Error(`${bin} ${args.join(" ")}: exit ${r.code}: ${r.out.trim().split("\n").slice(-3).join(" / ")}`);
  };
  if (asRoot) {
    const { chownSync } = await import("node:fs");
    const { execFileSync } = await import("node:child_process");
    const uid = Number(execFileSync("id", ["-u", "postgres"]).toString());
    const gid = Number(execFileSync("id", ["-g", "postgres"]).toString());
    chownSync(dir, uid, gid);
  }
  try {
    await exec("initdb", ["-D", data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"]);
  } catch (error) {
    cleanup();
    return missing(`initdb failed (${error instanceof Error ? error.message : String(error)})`);
  }
  const port = await freePort();
  const options = `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100`;
  const pgctl = (args: string[]) => exec("pg_ctl", ["-D", data, "-l", join(dir, "log"), "-o", options, "-w", "-t", "60", ...args]);
  const server: PrivatePostgres = {
    url: `postgres://postgres@127.0.0.1:${port}/postgres`,
    port,
    start: () => pgctl(["start"]),
    stop: (mode = "fast") => pgctl(["stop", "-m", mode]),
    restart: (mode = "fast") => pgctl(["restart", "-m", mode]),
    destroy: async () => {
      await server.stop("immediate").catch(() => {});
      cleanup();
    },
  };
  await server.start();
  return server;
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
  "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
  "--disable-component-update", "--disable-sync",
];

/** chromiumSkip is false when Chromium is there, else the reason to skip, said once; required, it throws. */
export function chromiumSkip(): string | false {
  if (existsSync(CHROMIUM)) return false;
  const why = `no Chromium at ${CHROMIUM}`;
  if (process.env.INBOX_REQUIRE_CHROMIUM === "1") throw new Error(`INBOX_REQUIRE_CHROMIUM=1 but ${why} (apt-get install -y chromium)`);
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
  /** make prepares an empty target (a file, or a fresh schema) and says how to remove it. */
  make(): Promise<{ target: string; cleanup: () => Promise<void> }>;
}

/** backends lists both stores for a suite: a SQLite file in a temp folder, and a fresh schema named after prefix. */
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
      make: async () => {
        const fresh = await freshSchema(prefix);
        return { target: fresh.url, cleanup: fresh.drop };
      },
    },
  ];
}

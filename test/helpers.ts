// test/helpers.ts: what every test file needs: throwaway folders, the scripts run as real child
// processes on this same Node, and a receiver on a free port.

import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import type { Browser } from "playwright-core";

/** ROOT is the repository's top folder, where the scripts live. */
export const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");

/** tempDir makes a fresh folder and returns it with a function that removes it. */
export function tempDir(prefix = "inbox-test-"): { dir: string; cleanup: () => void } {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  return { dir, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

/** spawnScript starts one of the suite's scripts (or a test fixture) under tsx, on this same Node. */
export function spawnScript(script: string, args: string[] = [], env: NodeJS.ProcessEnv = {}): ChildProcess {
  return spawn(process.execPath, ["--import", "tsx", join(ROOT, script), ...args], {
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
      const match = /^Listening on (http:\/\/\S+)/.exec(line);
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
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
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

// bench/common.ts: what every benchmark shares: servers as child processes on this same Node, their
// peak RSS from /proc, a closed-loop load generator (wrk, light enough to leave the cores to the server),
// the backlog filler, and the knobs.

import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { closeSync, fsyncSync, mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { DatabaseSync } from "node:sqlite";
import { scriptCommand, type RuntimeName } from "../lib/runtime.ts";
import { openDatabase } from "../lib/sqlite/schema.ts";
import { sha256 } from "../lib/rows.ts";

/** ROOT is the repository's top folder. */
export const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");

/** knob reads a numeric BENCH_* environment variable, so a run can be scaled up or down. */
export function knob(name: string, fallback: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === "") return fallback;
  const n = Number(raw);
  if (!Number.isFinite(n) || n <= 0) throw new TypeError(`${name}: expected a positive number, got ${raw}`);
  return n;
}

/** Knobs shared by the HTTP benchmarks. */
export const SECONDS = knob("BENCH_SECONDS", 8);
export const WARMUP_SECONDS = knob("BENCH_WARMUP", 2);
export const CONNECTIONS = knob("BENCH_CONNECTIONS", 32);

/** tempDir is a throwaway folder on the real disk (not tmpfs), so every fsync is a real one. */
export function tempDir(): { dir: string; cleanup: () => void } {
  const dir = mkdtempSync(join(tmpdir(), "inbox-bench-"));
  return { dir, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

/** Child is a benchmarked process: where it listens, and its memory as Linux counts it. */
export interface Child {
  child: ChildProcess;
  url: string;
  /** Peak resident set size so far, in MB (VmHWM). */
  peakRssMb(): number;
  /** CPU time used so far, user and system, in ms. */
  cpuMs(): number;
  /** Everything written to stderr, when it was kept. */
  stderr(): string;
  stop(): Promise<void>;
}

function status(pid: number, field: string): number {
  const match = new RegExp(`^${field}:\\s+(\\d+) kB`, "m").exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return match ? Number(match[1]) / 1024 : NaN;
}

/** cpuMs reads a process's CPU time so far, user plus system (all its threads), in ms. */
export function cpuMs(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
  return ((Number(fields[11]) + Number(fields[12])) * 1000) / 100; // clock ticks of 1/100 s
}

/**
 * transformCpuMs reads the CPU time so far of this process's live transform processes (transform-child.ts),
 * in ms: a transform's work, which this process's own cpuUsage() no longer counts. 0 where there are none.
 */
export function transformCpuMs(): number {
  let sum = 0;
  try {
    for (const pid of readFileSync(`/proc/self/task/${process.pid}/children`, "utf8").trim().split(/\s+/)) {
      if (pid && readFileSync(`/proc/${pid}/cmdline`, "latin1").includes("transform-child")) sum += cpuMs(Number(pid));
    }
  } catch {
    // A child that ended between the two reads has no CPU left to count.
  }
  return sum;
}

/** rssMb reads a process's current (VmRSS) or peak (VmHWM) resident set size in MB. */
export function rssMb(pid: number, peak = false): number {
  return status(pid, peak ? "VmHWM" : "VmRSS");
}

/**
 * startChild runs a script (of this checkout, or at an absolute path) under tsx on this Node (or, given `on`, on that runtime: bench/runtimes.ts) and
 * waits for its "Listening on" line. Its stderr is a pipe that is read and dropped (or kept), so a logging
 * server pays for its lines as it would in production. nodeArgs go to Node itself, before the script (V8's
 * memory flags, say).
 */
export async function startChild(
  script: string,
  args: string[],
  keepStderr = false,
  on?: { name: RuntimeName; binary: string },
  nodeArgs: string[] = [],
): Promise<Child> {
  const command = on
    ? scriptCommand(resolve(ROOT, script), args, on)
    : { command: process.execPath, args: [...nodeArgs, "--import", "tsx", resolve(ROOT, script), ...args] };
  const child = spawn(command.command, command.args, {
    cwd: ROOT,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let err = "";
  child.stderr!.on("data", (d: Buffer) => {
    if (keepStderr || err.length < 4096) err += d;
  });
  const exited = new Promise<void>((resolve) => child.on("exit", () => resolve()));
  const url = await new Promise<string>((resolve, reject) => {
    createInterface({ input: child.stdout! }).on("line", (line) => {
      const match = /^Listening on (http:\/\/\S+)/.exec(line);
      if (match) resolve(match[1]!);
    });
    void exited.then(() => reject(new Error(`${script} exited before listening: ${err}`)));
  });
  let peak = 0;
  return {
    child,
    url,
    peakRssMb: () => (child.exitCode === null ? (peak = Math.max(peak, rssMb(child.pid!, true))) : peak),
    stderr: () => err,
    cpuMs: () => cpuMs(child.pid!),
    stop: async () => {
      if (child.exitCode === null) {
        peak = Math.max(peak, rssMb(child.pid!, true));
        child.kill("SIGTERM");
      }
      await exited;
    },
  };
}

/** Load is what one closed-loop run measured. */
export interface Load {
  rps: number;
  p50: number;
  p99: number;
  ok: number;
  non2xx: number;
  errors: number;
  /** CPU the load generator spent per request, user and system, in µs. */
  generatorUs: number;
}

/**
 * BODY is the article's payment event; every request carries it. BENCH_BODY_BYTES pads it to that many bytes
 * (a `description` of x's), for a Stripe-sized body of about 1 KB rather than the article's 54 bytes.
 */
export const BODY = padded(
  { type: "payment.succeeded", customer: "Ann", amount: 5 },
  Number(process.env.BENCH_BODY_BYTES ?? 0),
);

// padded is an event's JSON, with a description added to make it `bytes` long when it is shorter.
function padded(event: Record<string, unknown>, bytes: number): string {
  const bare = JSON.stringify(event);
  const room = bytes - bare.length - ',"description":""'.length;
  return room > 0 ? JSON.stringify({ ...event, description: "x".repeat(room) }) : bare;
}

let wrkChecked = false;

/**
 * ensureWrk makes sure Debian's wrk is installed, installing it with apt-get when it is not (the bench
 * runs as root on the bench machine); otherwise it stops the run with one line saying what to do.
 */
export function ensureWrk(): void {
  if (wrkChecked) return;
  const found = () => spawnSync("wrk", ["--version"], { encoding: "utf8" }).error === undefined;
  if (!found()) {
    console.log("bench: wrk is not installed; installing it with apt-get (Debian's package)");
    let ok = spawnSync("apt-get", ["install", "-y", "wrk"], { stdio: "ignore" }).status === 0;
    if (!ok) ok = spawnSync("sh", ["-c", "apt-get update && apt-get install -y wrk"], { stdio: "ignore" }).status === 0;
    if (!ok || !found())
      throw new Error(
        "bench: wrk is missing and apt-get could not install it; run `apt-get install -y wrk` as root, then rerun",
      );
  }
  wrkChecked = true;
}

let runs = 0;

/**
 * hammer runs closed-loop load against url for seconds with wrk (two threads, one per core): each
 * connection sends its next POST as soon as the last answer arrives. IDs are unique, except that a
 * fraction `duplicates` repeats a recent one (bench/wrk.lua).
 */
export async function hammer(
  url: string,
  opts: { seconds: number; connections?: number; duplicates?: number },
): Promise<Load> {
  ensureWrk();
  const connections = opts.connections ?? CONNECTIONS;
  const prefix = `r${process.pid}-${++runs}`;
  const child = spawn(
    "wrk",
    [
      "-t",
      String(Math.min(2, connections)),
      "-c",
      String(connections),
      "-d",
      `${opts.seconds}s`,
      "--timeout",
      "30s",
      "--latency",
      "-s",
      join(ROOT, "bench/wrk.lua"),
      url,
      "--",
      prefix,
      String(opts.duplicates ?? 0),
      BODY,
    ],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  let out = "";
  child.stdout.on("data", (d: Buffer) => (out += d));
  child.stderr.on("data", (d: Buffer) => (out += d));
  const code = await new Promise<number | null>((resolve) => child.on("exit", resolve));
  const json = out.split("\n").find((l) => l.startsWith('{"requests"'));
  if (code !== 0 || !json) throw new Error(`wrk exited with ${code}: ${out.trim()}`);
  const r = JSON.parse(json) as {
    requests: number;
    duration_us: number;
    non2xx: number;
    errors: number;
    p50_us: number;
    p99_us: number;
    cpu_s: number;
  };
  const ok = r.requests - r.non2xx;
  return {
    rps: ok / (r.duration_us / 1e6),
    p50: r.p50_us / 1000,
    p99: r.p99_us / 1000,
    ok,
    non2xx: r.non2xx,
    errors: r.errors,
    generatorUs: (r.cpu_s * 1e6) / Math.max(1, r.requests),
  };
}

/** orderBody is a Shopify-style order of at least bytes bytes: the transform benches' input. */
export function orderBody(bytes: number): Buffer {
  const items: unknown[] = [];
  let text = "";
  while ((text = JSON.stringify({ id: 1, currency: "EUR", items })).length < bytes)
    items.push({ sku: `sku-${items.length}`, qty: 1, price: "9.99" });
  return Buffer.from(text);
}

/**
 * timeCalls makes n calls, at most inFlight at once, and gives the µs of wall time and of CPU a call: this
 * process's with its threads, and its transforms' processes' (transformCpuMs).
 */
export async function timeCalls(
  call: () => Promise<unknown>,
  n: number,
  inFlight: number,
): Promise<{ wallUs: number; cpuUs: number }> {
  const cpuNow = () => {
    const u = process.cpuUsage();
    return (u.user + u.system) / 1000 + transformCpuMs();
  };
  const cpu0 = cpuNow();
  const started = performance.now();
  let next = 0;
  await Promise.all(
    Array.from({ length: inFlight }, async () => {
      while (next++ < n) await call();
    }),
  );
  return { wallUs: ((performance.now() - started) * 1000) / n, cpuUs: ((cpuNow() - cpu0) * 1000) / n };
}

/**
 * flushFill writes a filled bench database to disk before it is measured. A fill writes with synchronous off,
 * so its gigabytes sit dirty in the page cache, and the inbox's first fsync of the file would write them all
 * back: an inbox of 1M measured ×0.45 of an empty one's ingest that way, ×0.98 once flushed (bench stored).
 * An inbox that grew over months carries no such debt; the fill pays it here, before the clock starts.
 */
export function flushFill(path: string): void {
  const fd = openSync(path, "r+");
  try {
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

// payment is the body fillBacklog gives its i-th delivery unless told another: a small payment event.
const payment = (i: number) =>
  Buffer.from(JSON.stringify({ type: "payment.succeeded", customer: `c${i % 1000}`, amount: (i % 100) + 1 }));

/** fillBacklog inserts n due deliveries straight into the table, in big transactions: no HTTP, no fsync per row. */
export function fillBacklog(path: string, n: number, prefix = "bk", bodyOf: (i: number) => Buffer = payment): void {
  openDatabase(path).close();
  const db = new DatabaseSync(path);
  db.exec("PRAGMA synchronous = OFF"); // only while filling a throwaway bench database
  const insert = db.prepare(
    `INSERT INTO deliveries (source, id, body, body_sha256, content_type, received_at, status, available_at)
     VALUES ('default', ?, ?, ?, 'application/json', ?, 'received', ?)`,
  );
  const now = Date.now();
  for (let start = 0; start < n; start += 50_000) {
    db.exec("BEGIN");
    for (let i = start; i < Math.min(n, start + 50_000); i++) {
      const body = bodyOf(i);
      insert.run(`${prefix}_${i}`, body, sha256(body), now, now - n + i);
    }
    db.exec("COMMIT");
  }
  db.exec("PRAGMA wal_checkpoint(TRUNCATE)");
  db.close();
  flushFill(path);
}

/** f formats a number for a summary line. */
export function f(n: number, digits = 0): string {
  return Number.isFinite(n) ? n.toFixed(digits) : "n/a";
}

/** line prints one labelled result row. */
export function row(label: string, load: Load, extra = ""): void {
  console.log(
    `  ${label.padEnd(34)} ${f(load.rps).padStart(7)} req/s  p50 ${f(load.p50, 1)} ms  p99 ${f(load.p99, 1)} ms` +
      (load.non2xx || load.errors ? `  non-2xx ${load.non2xx} errors ${load.errors}` : "") +
      (extra ? `  ${extra}` : "") +
      `  wrk ${f(load.generatorUs)} µs/req`,
  );
}

// mountOf names the options of the file system that holds path, from /proc/mounts (the longest mount point).
export function mountOf(path: string): string {
  try {
    const mounts = readFileSync("/proc/mounts", "utf8")
      .split("\n")
      .map((line) => line.split(" "))
      .filter((m) => m.length > 3 && (path === m[1] || path.startsWith(m[1] === "/" ? "/" : `${m[1]}/`)))
      .sort((a, b) => b[1]!.length - a[1]!.length);
    return mounts[0] ? `${mounts[0][1]} ${mounts[0][2]} ${mounts[0][3]}` : "not found";
  } catch {
    return "not readable";
  }
}

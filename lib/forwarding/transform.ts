// forwarding/transform.ts: transforms, which reshape a delivery before each forward (a route's or a destination's
// "transform" in the sources file). Code the configuration holds ({"code": "…"}) runs in the sandbox (sandbox.ts:
// QuickJS in WebAssembly, a context per code kept for a bounded number of calls). A module file runs in a child process of its own
// (transform-child.ts), one delivery at a time, killed past its time or memory limit.
// The forwarder (forwarder.ts) and `inbox.ts preview` run them; apps import the types to write one:
//   import type { Transform } from "webhook-inbox/transform";
//   export default ((d) => ({ body: { id: d.id, type: d.eventType }, headers: { "x-app": "1" } })) satisfies Transform;

import { type ChildProcess, fork } from "node:child_process";
import { createHash } from "node:crypto";
import { once } from "node:events";
import { readdirSync, readFileSync } from "node:fs";
import { validateHeaderName, validateHeaderValue } from "node:http";
import { isAbsolute, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { DEFAULTS } from "../defaults.ts";
import type { Headers, Lease } from "../store.ts";
import { Sandbox, type SandboxOptions } from "./sandbox.ts";

/** JsonValue is any value JSON can hold. */
export type JsonValue = string | number | boolean | null | JsonValue[] | { [key: string]: JsonValue };

/** TransformInput is what a transform gets: the delivery as stored, and which try of which destination this is. */
export interface TransformInput {
  /** The delivery's ID, as its provider sent it. */
  id: string;
  source: string;
  /** The destination this forward goes to. */
  destination: string;
  eventType: string | null;
  /** This try's number, from 1. */
  attempt: number;
  contentType: string | null;
  /** The body byte for byte as the provider sent it. */
  body: Uint8Array;
  /** The body parsed as JSON, or undefined when it is not JSON. */
  json: unknown;
  /** The provider's own headers (names in lower case, repeats joined with ", "). */
  headers: Record<string, string>;
  /** When the inbox received it, in ms since the epoch. */
  receivedAt: number;
}

/**
 * TransformResult is what to send: a new body (bytes and strings go as they are; any other JSON value as
 * JSON, application/json), headers to add (a string) or remove (null), or null to skip this destination for
 * this delivery. `{}` sends the delivery unchanged.
 */
export type TransformResult = null | {
  body?: Uint8Array | string | JsonValue;
  headers?: Record<string, string | null>;
};

/** Transform is a transform module's default export. */
export type Transform = (delivery: TransformInput) => TransformResult | Promise<TransformResult>;

/** defineTransform returns its argument: `export default defineTransform((d) => …)` gets d typed without an annotation. */
export function defineTransform(transform: Transform): Transform {
  return transform;
}

/** Shaped is a forward as its transform reshaped it: the bytes to send, their content type, and header changes (null removes). */
export interface Shaped {
  body: Buffer;
  contentType: string | null;
  headers: Record<string, string | null>;
}

/** TransformError is a try that a transform failed: it threw, returned what cannot be sent, or ran too long. */
export class TransformError extends Error {}

// Headers a transform may not touch: the signature is made over the bytes sent, and the rest are the connection's.
const RESERVED = new Set([
  "webhook-id",
  "webhook-timestamp",
  "webhook-signature",
  "content-length",
  "host",
  "transfer-encoding",
  "connection",
  // undici refuses these outright ("invalid keep-alive header", "expect header not supported").
  "keep-alive",
  "upgrade",
  "expect",
]);
// What the HTTP client refuses in a header value, as Node's and undici's checks have it (for the message only:
// the check itself is Node's validateHeaderValue).
const BAD_VALUE_CHAR = /[^\t\x20-\x7e\x80-\xff]/u;
const validHeader = (check: () => void) => {
  try {
    check();
    return true;
  } catch {
    return false;
  }
};

/** transformInput is a leased delivery as its transform sees it. */
export function transformInput(lease: Lease, destination: string): TransformInput {
  const headers: Record<string, string> = {};
  for (const [name, values] of Object.entries(lease.headers ?? ({} as Headers)))
    if (values && values.length > 0) headers[name] = values.join(", ");
  return {
    id: lease.id,
    source: lease.source,
    destination,
    eventType: lease.eventType,
    attempt: lease.attempts,
    contentType: lease.contentType,
    body: lease.body,
    json: undefined,
    headers,
    receivedAt: lease.receivedAt,
  };
}

// TSX is tsx's register(), for modules written in the TypeScript that Node's type stripping does not take.
let TSX: string | undefined;
try {
  TSX = import.meta.resolve("tsx/esm/api");
} catch {
  TSX = undefined;
}
const CHILD = fileURLToPath(
  new URL(`./transform-child${fileURLToPath(import.meta.url).endsWith(".ts") ? ".ts" : ".js"}`, import.meta.url),
);

interface Job {
  input: TransformInput;
  timeoutMs: number;
  resolve(shaped: Shaped | null): void;
  reject(error: TransformError): void;
}

type Answer =
  | { ready: true }
  | { loadError: string }
  | { stray: string; id?: number; delivery?: string }
  | {
      id: number;
      result: { skip: true } | { skip: false; body?: Uint8Array; json: boolean; headers?: unknown };
      error?: undefined;
    }
  | { id: number; error: string };

// Deliveries handed to a child ahead of their turn, so it never waits on a round trip between two. The
// child still runs them one at a time, in order, and each one's time limit starts when the one before it
// comes back.
const AHEAD = 16;

/** Child is one process running the module, and the deliveries handed to it, oldest first. */
interface Child {
  process: ChildProcess;
  ready: Promise<string | undefined>;
  sent: { id: number; job: Job }[];
  timer?: NodeJS.Timeout;
  watch?: NodeJS.Timeout;
  /** The last of its stderr, which says why V8 ended it (its heap full). */
  stderr: string;
  /** Why this side killed it, for its exit to say. */
  killedFor?: string;
}

/** TransformLimits are what a transform's process may use; Transforms and Transformer take them. */
export interface TransformLimits {
  /** Megabytes of V8 heap (--max-old-space-size): past it V8 ends the process, and the try fails. @default DEFAULTS.transformHeapMb */
  heapMb?: number;
  /** Megabytes of memory in all (its RSS: heap, Buffers, native), watched every transformWatchMs on Linux; past it the process is killed and the try fails. @default DEFAULTS.transformMemoryMb */
  memoryMb?: number;
  /** Where an error the module throws outside any call (its own timer) is logged, naming the module. @default console.error */
  log?: (line: string) => void;
  /** The sandbox's limits, for transforms given as code. @default SandboxOptions' defaults */
  sandbox?: SandboxOptions;
  /** A sandbox shared with others, which close() leaves running. @default one of its own, made at the first code transform */
  shared?: Sandbox;
  /** Each module as its version was applied: a process starts only on a file whose SHA-256 is still this; the sandbox runs this code. @default none: the file as it is */
  applied?: Readonly<Record<string, { sha256: string; code?: string }>>;
}

// rssMb reads a process's resident memory from Linux's /proc, or undefined where there is none.
function rssMb(pid: number): number | undefined {
  try {
    const kb = /VmRSS:\s*(\d+)\s*kB/.exec(readFileSync(`/proc/${pid}/status`, "latin1"))?.[1];
    return kb === undefined ? undefined : Number(kb) / 1024;
  } catch {
    return undefined;
  }
}

/**
 * Transformer runs one module in a child process of its own, one delivery at a time. Past a delivery's
 * time limit, or its memory limit, the process is killed (that stops any loop, awaited or not, and frees
 * all it held), that delivery fails, and a fresh process loads the module for the ones behind it.
 */
export class Transformer implements Runner {
  /** The module's file URL. */
  readonly url: string;
  /** The module as the sources file named it, for errors. */
  readonly name: string;
  readonly #heapMb: number;
  readonly #memoryMb: number;
  readonly #log: (line: string) => void;
  #child?: Child;
  #queue: Job[] = [];
  #next = 1;
  #closed = false;
  #starting = false;

  readonly #sha256: string | undefined;

  constructor(module: string, name = module, limits: TransformLimits = {}) {
    this.url = module.startsWith("file:") ? module : pathToFileURL(module).href;
    this.name = name;
    this.#sha256 = limits.applied?.[name]?.sha256;
    this.#heapMb = limits.heapMb ?? DEFAULTS.transformHeapMb;
    this.#memoryMb = limits.memoryMb ?? DEFAULTS.transformMemoryMb;
    this.#log = limits.log ?? ((line) => console.error(line));
  }

  /** run reshapes one delivery; it rejects with a TransformError whose message says what went wrong. */
  run(input: TransformInput, timeoutMs: number = DEFAULTS.transformTimeoutMs): Promise<Shaped | null> {
    if (this.#closed) return Promise.reject(new TransformError(`transform ${this.name}: stopped`));
    return new Promise((resolve, reject) => {
      this.#queue.push({ input, timeoutMs, resolve, reject });
      void this.#pump();
    });
  }

  /** load starts the process and says why the module cannot be used, or undefined when it can. */
  async load(): Promise<string | undefined> {
    return this.#drift() ?? this.#start().ready;
  }

  /** close stops the process; deliveries still waiting fail. */
  async close(): Promise<void> {
    this.#closed = true;
    const child = this.#child;
    this.#child = undefined;
    for (const job of [...(child?.sent.map((s) => s.job) ?? []), ...this.#queue.splice(0)])
      job.reject(new TransformError(`transform ${this.name}: stopped`));
    if (child) {
      child.sent = [];
      const ended = child.process.exitCode !== null || child.process.signalCode !== null;
      // Held until it has exited: an unref'd process's exit alone would not keep the caller's loop alive.
      if (!ended) child.process.ref();
      const exited = ended ? Promise.resolve() : once(child.process, "exit").then(() => {});
      this.#drop(child);
      await exited;
    }
  }

  #start(): Child {
    if (this.#child) return this.#child;
    // The worker's own flags (tsx's loader among them) but its heap limit, which is the transform's own, and
    // an inspector, whose port is the worker's.
    const execArgv = [
      ...process.execArgv.filter((a) => !a.startsWith("--max-old-space-size") && !a.startsWith("--inspect")),
      `--max-old-space-size=${this.#heapMb}`,
    ];
    const proc = fork(CHILD, [this.url, ...(TSX ? [TSX] : [])], {
      execArgv,
      serialization: "advanced",
      stdio: ["ignore", "inherit", "pipe", "ipc"],
      // None of the worker's secrets: the module sees only what locates programs and formats text.
      env: childEnv(process.env),
      // A process group of its own, so that what it spawns is ended with it (killTree).
      detached: process.platform !== "win32",
    });
    const child: Child = { process: proc, ready: Promise.resolve(undefined), sent: [], stderr: "" };
    // Passed through as the module wrote it, and its tail kept: V8 says there why it ended the process. V8's
    // own dump as it ends one (its last GCs, its native stack) is left out: the try's error says it in a line.
    let dumping = false;
    proc.stderr!.on("data", (chunk: Buffer) => {
      const text = chunk.toString("latin1");
      child.stderr = (child.stderr + text).slice(-4096);
      dumping ||= /<--- Last few GCs --->|FATAL ERROR:/.test(child.stderr);
      if (!dumping) process.stderr.write(chunk);
    });
    // An idle process keeps no worker alive; a delivery in hand keeps its timer.
    proc.unref();
    (proc.channel as { unref?: () => void } | undefined)?.unref?.();
    (proc.stderr as unknown as { unref?: () => void }).unref?.();
    child.watch = setInterval(() => this.#watch(child), DEFAULTS.transformWatchMs);
    child.watch.unref();
    child.ready = new Promise<string | undefined>((resolve) => {
      const timer = setTimeout(
        () => resolve(`did not load within ${DEFAULTS.transformLoadMs} ms`),
        DEFAULTS.transformLoadMs,
      );
      let loaded = false;
      const done = (why: string | undefined) => {
        clearTimeout(timer);
        loaded = true;
        resolve(why);
      };
      proc.on("message", (m: Answer) => {
        if ("ready" in m) return done(undefined);
        if ("loadError" in m) return done(`could not be loaded: ${m.loadError}`);
        if ("stray" in m) return this.#stray(m);
        this.#answered(child, m);
      });
      // A process that dies (process.exit, its heap full, a signal) fails the delivery in hand; dead while
      // idle, it is let go, so the next delivery starts a fresh one rather than wait on it.
      const died = (why: string) => {
        if (child.sent.length > 0) return this.#lost(child, why);
        this.#drop(child);
        if (!loaded) done(`could not be loaded: ${why}`);
      };
      proc.on("error", (e) => died(`failed in its process: ${e.message}`));
      proc.on("exit", (code, signal) => died(this.#ended(child, code, signal)));
    });
    this.#child = child;
    return child;
  }

  // drift says why the module's file is not the one applied, or undefined when it is (or none was given).
  #drift(): string | undefined {
    if (this.#sha256 === undefined) return undefined;
    let here: string;
    try {
      here = createHash("sha256")
        .update(readFileSync(fileURLToPath(this.url)))
        .digest("hex");
    } catch (error) {
      return `cannot be read: ${(error as Error).message}`;
    }
    return here === this.#sha256
      ? undefined
      : `here (sha256 ${here.slice(0, 12)}) is not the one applied (sha256 ${this.#sha256.slice(0, 12)}); apply its new version to run it`;
  }

  // ended says why a process ended, from its exit and what V8 wrote last.
  #ended(child: Child, code: number | null, signal: NodeJS.Signals | null): string {
    if (child.killedFor) return child.killedFor;
    if (/heap limit|heap out of memory/i.test(child.stderr))
      return `ran out of memory: its heap reached its ${this.#heapMb} MB limit, so its process ended`;
    return `ended its process (${signal ? `signal ${signal}` : `exit code ${code}`})`;
  }

  // watch kills a process past its memory limit: Buffers and native memory are outside V8's heap limit.
  #watch(child: Child): void {
    const mb = rssMb(child.process.pid ?? 0);
    if (mb === undefined) return void clearInterval(child.watch);
    if (mb <= this.#memoryMb) return;
    const why = `ran out of memory: its process used ${Math.round(mb)} MB, past its ${this.#memoryMb} MB limit, so it was stopped`;
    child.killedFor = why;
    if (child.sent.length > 0) this.#lost(child, why);
    else {
      this.#drop(child);
      this.#log(`transform ${this.name} ${why} while idle`);
    }
  }

  // stray is an error the module threw outside any call in hand (its process failed the call in hand that set
  // one itself): the module is blamed in the log, and the delivery in hand goes on.
  #stray(m: { stray: string; delivery?: string }): void {
    const when =
      m.delivery === undefined
        ? "outside any delivery's call"
        : `from a timer or callback set while it ran delivery ${m.delivery}, after that call had returned`;
    this.#log(`transform ${this.name} threw ${m.stray} ${when}; no delivery is failed for it`);
  }

  // pump hands waiting deliveries to the process, starting one (and loading the module) when there is none.
  async #pump(): Promise<void> {
    if (this.#starting || this.#queue.length === 0 || this.#closed) return;
    // A file changed since its version was applied is not the code applied: no process starts on it, the
    // first or one started again after the last was stopped.
    const drift = this.#child ? undefined : this.#drift();
    if (drift !== undefined) {
      for (const job of this.#queue.splice(0)) job.reject(new TransformError(`transform ${this.name} ${drift}`));
      return;
    }
    const child = this.#start();
    if (child.sent.length === 0) {
      this.#starting = true;
      const why = await child.ready;
      this.#starting = false;
      if (why !== undefined) {
        // Each delivery fails with the reason; a module fixed meanwhile loads for the next one.
        this.#drop(child);
        for (const job of this.#queue.splice(0)) job.reject(new TransformError(`transform ${this.name} ${why}`));
        return;
      }
    }
    if (this.#child !== child) return void this.#pump();
    while (child.sent.length < AHEAD && this.#queue.length > 0) {
      const job = this.#queue.shift()!;
      const id = this.#next++;
      child.sent.push({ id, job });
      // A send to a process that has just died fails here; its exit fails the delivery.
      child.process.send({ id, input: job.input }, (error) => void error);
      if (child.sent.length === 1) this.#time(child);
    }
  }

  // time starts the oldest delivery's limit: the process is on it now.
  #time(child: Child): void {
    clearTimeout(child.timer);
    const head = child.sent[0];
    if (head)
      child.timer = setTimeout(
        () => this.#lost(child, `ran past its ${head.job.timeoutMs} ms limit, so its process was stopped`),
        head.job.timeoutMs,
      );
  }

  #answered(child: Child, answer: Exclude<Answer, { ready: true } | { loadError: string } | { stray: string }>): void {
    const head = child.sent[0];
    if (!head || head.id !== answer.id) return;
    child.sent.shift();
    this.#time(child);
    try {
      if (answer.error !== undefined) throw new TransformError(`transform ${this.name} ${answer.error}`);
      head.job.resolve(answer.result.skip ? null : shape(answer.result, head.job.input, this.name));
    } catch (error) {
      head.job.reject(error as TransformError);
    }
    void this.#pump();
  }

  // lost fails the delivery in hand, drops its process, and hands the ones behind it to a fresh one.
  #lost(child: Child, why: string): void {
    if (child.sent.length === 0) return;
    const [head, ...behind] = child.sent;
    child.sent = [];
    this.#drop(child);
    this.#queue.unshift(...behind.map((s) => s.job));
    head!.job.reject(new TransformError(`transform ${this.name} ${why}`));
    void this.#pump();
  }

  #drop(child: Child): void {
    clearTimeout(child.timer);
    clearInterval(child.watch);
    if (this.#child === child) this.#child = undefined;
    if (child.process.exitCode === null && child.process.signalCode === null) killTree(child.process);
    // Ended on its own: what it spawned may still run, in its group.
    else if (child.process.pid) killGroup(child.process.pid);
  }
}

// The variables a transform's process keeps of the worker's: none that may hold a secret.
const CHILD_ENV = ["PATH", "LANG", "LC_ALL", "TZ", "NODE_ENV", "TMPDIR", "SystemRoot"];

/** childEnv is the environment a module transform's process gets: CHILD_ENV's names alone, never the worker's secrets. */
export function childEnv(env: NodeJS.ProcessEnv): Record<string, string> {
  const out: Record<string, string> = {};
  for (const name of CHILD_ENV) if (env[name] !== undefined) out[name] = env[name]!;
  return out;
}

// descendants lists the processes below pid, from Linux's /proc (none elsewhere): one that left its group
// (detached, setsid) is still its parent's child while that parent lives.
function descendants(pid: number): number[] {
  const parent = new Map<number, number>();
  try {
    for (const entry of readdirSync("/proc")) {
      if (!/^\d+$/.test(entry)) continue;
      try {
        const stat = readFileSync(`/proc/${entry}/stat`, "latin1");
        parent.set(Number(entry), Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]));
      } catch {
        // Gone between the listing and the read.
      }
    }
  } catch {
    return [];
  }
  const out: number[] = [];
  const walk = (p: number) => {
    for (const [child, ppid] of parent) if (ppid === p && !out.includes(child)) out.push(child), walk(child);
  };
  walk(pid);
  return out;
}

const kill = (pid: number) => {
  try {
    process.kill(pid, "SIGKILL");
  } catch {
    // Already gone.
  }
};

// killGroup ends a process group: what a transform's process spawned, that stayed in its group.
function killGroup(pid: number): void {
  if (process.platform !== "win32") kill(-pid);
}

// killTree ends a transform's process and everything below it: its descendants (found before it dies, as
// they are reparented after), its group, then the process itself.
function killTree(child: ChildProcess): void {
  const pid = child.pid;
  if (pid === undefined) return void child.kill("SIGKILL");
  for (const d of descendants(pid)) kill(d);
  killGroup(pid);
  child.kill("SIGKILL");
}

// shape checks a transform's headers and settles the body's content type.
function shape(
  result: { body?: Uint8Array; json: boolean; headers?: unknown },
  input: TransformInput,
  name: string,
): Shaped {
  const fail = (why: string): never => {
    throw new TransformError(`transform ${name} returned ${why}`);
  };
  const headers: Record<string, string | null> = {};
  if (result.headers !== undefined) {
    if (typeof result.headers !== "object" || result.headers === null || Array.isArray(result.headers))
      fail("headers that are not an object of names and values");
    for (const [raw, value] of Object.entries(result.headers as Record<string, unknown>)) {
      const name = raw.toLowerCase();
      if (!validHeader(() => validateHeaderName(raw)))
        fail(`the header name ${JSON.stringify(raw)}, which HTTP does not allow`);
      if (RESERVED.has(name))
        fail(`the header ${name}, which the inbox or the connection sets itself (the signature covers the bytes sent)`);
      if (value !== null && typeof value !== "string")
        fail(`header ${name} as ${typeof value}; expected a string, or null to remove it`);
      // The HTTP client's own rule, which it applies as the request goes out (undici's and Node's are the same).
      if (typeof value === "string" && !validHeader(() => validateHeaderValue(name, value))) {
        const at = [...value].findIndex((c) => BAD_VALUE_CHAR.test(c));
        const c = [...value][at]!.codePointAt(0)!;
        fail(
          `header ${name} with the character U+${c.toString(16).toUpperCase().padStart(4, "0")} at ${at}, which HTTP does not send (a value holds tab and U+0020 to U+00FF but U+007F; sent as Latin-1, one byte each)`,
        );
      }
      headers[name] = value as string | null;
    }
  }
  const given = headers["content-type"];
  delete headers["content-type"];
  const contentType =
    typeof given === "string" ? given : given === null ? null : result.json ? "application/json" : input.contentType;
  const body =
    result.body === undefined
      ? Buffer.from(input.body.buffer, input.body.byteOffset, input.body.byteLength)
      : Buffer.from(result.body.buffer, result.body.byteOffset, result.body.byteLength);
  return { body, contentType, headers };
}

/** Runner is what runs one transform for the forwarder: a module's process (Transformer) or code in the sandbox (CodeTransformer). */
export interface Runner {
  readonly name: string;
  run(input: TransformInput, timeoutMs?: number): Promise<Shaped | null>;
  load(): Promise<string | undefined>;
  close(): Promise<void>;
}

/**
 * CodeTransformer runs a transform's code in the sandbox (sandbox.ts), in a context kept for its code for a
 * bounded number of calls: its own
 * contract, `export default (delivery) => …`, or Hookdeck's, `addHandler("transform", (request, context) => …)`.
 */
export class CodeTransformer implements Runner {
  readonly name: string;
  readonly #code: string;
  readonly #sandbox: Sandbox;

  constructor(code: string, name: string, sandbox: Sandbox) {
    this.#code = code;
    this.name = name;
    this.#sandbox = sandbox;
  }

  /** run reshapes one delivery; it rejects with a TransformError whose message says what went wrong. */
  async run(input: TransformInput, timeoutMs: number = DEFAULTS.transformTimeoutMs): Promise<Shaped | null> {
    const { body, json: _, ...meta } = input;
    const answer = await this.#sandbox.run({ code: this.#code, meta, body, timeoutMs });
    if ("error" in answer) throw new TransformError(`transform ${this.name} ${answer.error}`);
    if (answer.skip) return null;
    return shape(answer, input, this.name);
  }

  /** load says why the code cannot be used (it does not compile, or defines no transform), or undefined; every thread is started. */
  load(): Promise<string | undefined> {
    this.#sandbox.warm();
    return this.#sandbox.check(this.#code);
  }

  async close(): Promise<void> {}
}

/** TransformUse names one transform: a module's path (in a process when process), or code with its `code:` name (routes.ts's TransformSetting). */
export interface TransformUse {
  module: string;
  code?: string;
  process?: boolean;
}

// Node's own type stripping (node:module), where the runtime has it: a .ts module runs in the sandbox as the
// JavaScript it erases to.
const strip = (
  (await import("node:module")) as unknown as { stripTypeScriptTypes?: (code: string, options?: object) => string }
).stripTypeScriptTypes;

/**
 * sandboxCode is a module file's code as the sandbox runs it: JavaScript as it is, TypeScript with its types
 * erased (`import type` lines and all), which needs a runtime with node:module's stripTypeScriptTypes.
 */
export function sandboxCode(module: string, code: string): string {
  if (!/\.m?ts$/.test(module)) return code;
  if (!strip)
    throw new TransformError(
      `transform ${module} is TypeScript, whose types this runtime cannot erase for the sandbox; write it in JavaScript, or run it in a process ({"module": …, "process": true})`,
    );
  try {
    return strip(code, { mode: "strip" });
  } catch (error) {
    throw new TransformError(`transform ${module} could not be read as TypeScript: ${(error as Error).message}`);
  }
}

/**
 * Transforms keeps one Runner per transform, for the forwarder's lanes to share: code runs in one sandbox
 * shared by all, a module in a process of its own. Relative module paths are taken from base (the sources
 * file's folder, as worker.ts says).
 */
export class Transforms {
  readonly #base: string;
  readonly #limits: TransformLimits;
  readonly #all = new Map<string, Runner>();
  #sandbox?: Sandbox;

  constructor(base: string, limits: TransformLimits = {}) {
    this.#base = base;
    this.#limits = limits;
  }

  /** get returns the Runner of a transform, as the configuration names it. */
  get(use: TransformUse | string): Runner {
    const { module, process: own } = typeof use === "string" ? { module: use, process: false } : use;
    let code = typeof use === "string" ? undefined : use.code;
    // A module file runs in the sandbox too, unless the operator asked for its process: the code its version
    // applied, else the file as it is.
    if (code === undefined && !own) {
      const path = isAbsolute(module) ? module : resolve(this.#base, module);
      try {
        code = sandboxCode(module, this.#limits.applied?.[module]?.code ?? readFileSync(path, "utf8"));
      } catch (error) {
        const why =
          error instanceof TransformError
            ? error.message
            : `transform ${module} could not be read: ${(error as Error).message}`;
        return unusable(module, why);
      }
    }
    if (code !== undefined) {
      let t = this.#all.get(module);
      if (!t) {
        this.#sandbox ??= this.#limits.shared ?? new Sandbox(this.#limits.sandbox);
        this.#all.set(module, (t = new CodeTransformer(code, module, this.#sandbox)));
      }
      return t;
    }
    const path = isAbsolute(module) ? module : resolve(this.#base, module);
    let t = this.#all.get(path);
    if (!t) this.#all.set(path, (t = new Transformer(path, module, this.#limits)));
    return t;
  }

  /** close stops every process and the sandbox's threads. */
  async close(): Promise<void> {
    const own = this.#sandbox === this.#limits.shared ? undefined : this.#sandbox;
    await Promise.all([...[...this.#all.values()].map((t) => t.close()), own?.close()]);
    this.#all.clear();
    this.#sandbox = undefined;
  }
}

// unusable is a transform that cannot run, for each call to fail with why (a file that cannot be read).
function unusable(name: string, why: string): Runner {
  return {
    name,
    run: () => Promise.reject(new TransformError(why)),
    load: async () => why.replace(`transform ${name} `, ""),
    close: async () => {},
  };
}

// The sandbox that checks code as a configuration is applied: one thread, started at the first check.
let checker: Sandbox | undefined;

/**
 * checkCode runs the top level of each transform given as code in the sandbox and says, in one line, the
 * first that does not compile or defines no transform (`where: transform code:… threw SyntaxError: …`), or
 * undefined when all can run. A change through the API, the page, `config apply` or SIGHUP calls it first.
 */
export async function checkCode(uses: readonly (TransformUse & { where: string })[]): Promise<string | undefined> {
  for (const use of uses) {
    if (use.code === undefined || use.process) continue;
    checker ??= new Sandbox({ threads: 1 });
    let code: string;
    try {
      code = use.module.startsWith("code:") ? use.code : sandboxCode(use.module, use.code);
    } catch (error) {
      return `${use.where}: ${(error as Error).message}`;
    }
    const why = await checker.check(code);
    if (why !== undefined) return `${use.where}: transform ${use.module} ${why}`;
  }
  return undefined;
}

/**
 * checkTransforms loads each module in transforms, whose processes then serve the forwards, and says what
 * cannot be used: `where: transform ./x.ts could not be loaded: …`, or undefined when all can. worker.ts
 * calls it at start-up and hands the same transforms to forward().
 */
export async function checkTransforms(
  uses: readonly (TransformUse & { where: string })[],
  transforms: Transforms,
): Promise<string | undefined> {
  // All at once; the first in the file's order that cannot be used is the one reported.
  const why = await Promise.all(uses.map((use) => transforms.get(use).load()));
  const i = why.findIndex((w) => w !== undefined);
  return i < 0 ? undefined : `${uses[i]!.where}: transform ${uses[i]!.module} ${why[i]}`;
}

// forwarding/sandbox.ts: runs a transform's JavaScript in QuickJS compiled to WebAssembly (quickjs-emscripten),
// on worker threads of its own (sandbox-thread.ts). A call runs in a context of its code's, made at most every
// contextCalls calls and after any failure, with a memory limit and a deadline and no file system, network,
// environment, process or timers; past either limit that call fails with one line naming it, and the thread, the
// worker and the other calls go on. transform.ts wraps it for the forwarder.
//   const box = new Sandbox(); await box.run({ code, meta, body, timeoutMs: 1000 }); await box.close();

import { once } from "node:events";
import { fileURLToPath } from "node:url";
import { Worker } from "node:worker_threads";
import { DEFAULTS } from "../defaults.ts";
import type { ThreadAnswer, ThreadCall } from "./sandbox-thread.ts";

/** SandboxCall is one call: the code, the delivery (its body apart) and the time it may take. */
export interface SandboxCall {
  code: string;
  meta: Record<string, unknown>;
  body: Uint8Array;
  timeoutMs: number;
  /** Run only the code's top level, to check that it compiles and defines a transform. @default false */
  check?: boolean;
}

/** SandboxAnswer is what the call came to: skip, what to send (body unchanged when absent), or why it failed. */
export type SandboxAnswer =
  | { skip: true }
  | { skip: false; body?: Uint8Array; json: boolean; headers: Record<string, unknown> }
  | { error: string; limit?: "time" | "memory" };

/** SandboxOptions are the sandbox's limits. */
export interface SandboxOptions {
  /** Megabytes of WebAssembly memory each thread's engine has, for one call at a time: past it, the call fails. @default DEFAULTS.sandboxMemoryMb */
  memoryMb?: number;
  /** Threads that run calls, each one call at a time. @default DEFAULTS.sandboxThreads */
  threads?: number;
  /** Milliseconds past a call's limit after which its thread is ended from outside. @default DEFAULTS.sandboxGraceMs */
  graceMs?: number;
  /** Calls one context runs (a code evaluated once) before it is made afresh. @default DEFAULTS.sandboxContextCalls */
  contextCalls?: number;
  /** Contexts, one per code, each thread keeps between calls. @default DEFAULTS.sandboxContextsKept */
  contextsKept?: number;
}

const THREAD = fileURLToPath(
  new URL(`./sandbox-thread${fileURLToPath(import.meta.url).endsWith(".ts") ? ".ts" : ".js"}`, import.meta.url),
);

interface Waiting {
  call: SandboxCall;
  resolve(answer: SandboxAnswer): void;
}

/** Thread is one worker thread and the call it has in hand. */
interface Thread {
  worker: Worker;
  ready: Promise<void>;
  busy?: { id: number; waiting: Waiting; timer: NodeJS.Timeout };
}

/**
 * Sandbox runs transform calls on a few threads, one call per thread at a time, in the order they came.
 * Each thread's engine lives in a WebAssembly memory of at most memoryMb, which holds every object, string and
 * buffer a call makes. A thread that a call could not stop (stuck past its deadline and the grace) is ended and
 * replaced.
 */
export class Sandbox {
  readonly #memoryMb: number;
  readonly #size: number;
  readonly #graceMs: number;
  readonly #contextCalls: number;
  readonly #contextsKept: number;
  readonly #threads = new Set<Thread>();
  readonly #idle: Thread[] = [];
  readonly #queue: Waiting[] = [];
  #next = 1;
  #closed = false;

  constructor(options: SandboxOptions = {}) {
    this.#memoryMb = options.memoryMb ?? DEFAULTS.sandboxMemoryMb;
    this.#size = options.threads ?? DEFAULTS.sandboxThreads;
    this.#graceMs = options.graceMs ?? DEFAULTS.sandboxGraceMs;
    this.#contextCalls = options.contextCalls ?? DEFAULTS.sandboxContextCalls;
    this.#contextsKept = options.contextsKept ?? DEFAULTS.sandboxContextsKept;
    for (const [name, value, least] of [
      ["threads", this.#size, 1],
      ["contextCalls", this.#contextCalls, 1],
      ["contextsKept", this.#contextsKept, 0],
    ] as const)
      if (!Number.isInteger(value) || value < least)
        throw new TypeError(`Sandbox: expected ${name} to be a whole number from ${least}, got ${value}`);
  }

  /** run makes one call; it never rejects: a failure is an answer with its one line. */
  run(call: SandboxCall): Promise<SandboxAnswer> {
    if (this.#closed) return Promise.resolve({ error: "stopped" });
    if (Buffer.byteLength(call.code) > DEFAULTS.sandboxCodeBytes)
      return Promise.resolve({
        error: `is longer than ${DEFAULTS.sandboxCodeBytes} bytes, the most a transform may be`,
      });
    return new Promise((resolve) => {
      this.#queue.push({ call, resolve });
      this.#pump();
    });
  }

  /** check says why code cannot be used as a transform (it does not compile, or defines none), or undefined when it can. */
  async check(code: string, timeoutMs: number = DEFAULTS.transformTimeoutMs): Promise<string | undefined> {
    const answer = await this.run({ code, meta: {}, body: new Uint8Array(), timeoutMs, check: true });
    return "error" in answer ? answer.error : undefined;
  }

  /**
   * warm starts every thread now, so that the first calls of a version do not wait on engines loading one by
   * one: a forward's transform runs after its wave was let go (a pause checked), and should not lag behind it.
   */
  warm(): void {
    while (!this.#closed && this.#threads.size < this.#size) this.#idle.push(this.#start());
  }

  /** close ends the threads; calls still waiting are answered "stopped". */
  async close(): Promise<void> {
    this.#closed = true;
    for (const w of this.#queue.splice(0)) w.resolve({ error: "stopped" });
    await Promise.all([...this.#threads].map((t) => this.#end(t, "stopped")));
  }

  #pump(): void {
    while (this.#queue.length > 0 && !this.#closed) {
      const thread = this.#idle.pop() ?? (this.#threads.size < this.#size ? this.#start() : undefined);
      if (!thread) return;
      this.#give(thread, this.#queue.shift()!);
    }
  }

  #start(): Thread {
    // Its own resource limits: a heap for the host side of the thread; the engine's memory is its WebAssembly
    // memory, whose maximum the thread sets from memoryMb.
    const worker = new Worker(THREAD, {
      resourceLimits: { maxOldGenerationSizeMb: 64 },
      workerData: { memoryMb: this.#memoryMb, contextCalls: this.#contextCalls, contextsKept: this.#contextsKept },
    });
    worker.unref();
    // Settled either way: a thread that fails to start answers its call through "error" and "exit".
    const thread: Thread = {
      worker,
      ready: once(worker, "message").then(
        () => {},
        () => {},
      ),
    };
    worker.on("message", (m: ThreadAnswer | { ready: true }) => {
      if ("ready" in m) return;
      this.#answered(thread, m);
    });
    worker.on("error", (e) => this.#lost(thread, `failed in its thread: ${e.message}`));
    worker.on("exit", () => this.#lost(thread, "ended its thread"));
    this.#threads.add(thread);
    return thread;
  }

  #give(thread: Thread, waiting: Waiting): void {
    const id = this.#next++;
    const { call } = waiting;
    // Held while a call is in hand: an idle thread keeps no process alive.
    thread.worker.ref();
    const timer = setTimeout(
      () => void this.#end(thread, `ran past its ${call.timeoutMs} ms limit, so its thread was stopped`, "time"),
      call.timeoutMs + this.#graceMs + DEFAULTS.transformLoadMs,
    );
    thread.busy = { id, waiting, timer };
    const job: ThreadCall = {
      id,
      code: call.code,
      meta: call.meta,
      body: call.body,
      timeoutMs: call.timeoutMs,
      memoryMb: this.#memoryMb,
      ...(call.check ? { check: true } : {}),
    };
    // The deadline is the thread's to keep once it runs the call; the timer above only catches a thread that
    // cannot keep it. Sent after the thread has loaded the engine, which the first call waits for.
    void thread.ready.then(() => {
      if (thread.busy?.id === id) {
        clearTimeout(timer);
        thread.busy.timer = setTimeout(
          () => void this.#end(thread, `ran past its ${call.timeoutMs} ms limit, so its thread was stopped`, "time"),
          call.timeoutMs + this.#graceMs,
        );
        thread.worker.postMessage(job);
      }
    });
  }

  #answered(thread: Thread, answer: ThreadAnswer): void {
    const busy = thread.busy;
    if (!busy || busy.id !== answer.id) return;
    clearTimeout(busy.timer);
    thread.busy = undefined;
    thread.worker.unref();
    const { id: _, ...rest } = answer;
    busy.waiting.resolve(rest as SandboxAnswer);
    this.#idle.push(thread);
    this.#pump();
  }

  // lost answers the call in hand of a thread that ended, and lets the next call start a fresh one.
  #lost(thread: Thread, why: string): void {
    if (!this.#threads.delete(thread)) return;
    const at = this.#idle.indexOf(thread);
    if (at >= 0) this.#idle.splice(at, 1);
    const busy = thread.busy;
    thread.busy = undefined;
    if (busy) {
      clearTimeout(busy.timer);
      busy.waiting.resolve({ error: why });
    }
    this.#pump();
  }

  // end stops a thread; its call in hand, if any, fails with why.
  async #end(thread: Thread, why: string | undefined, limit?: "time" | "memory"): Promise<void> {
    const busy = thread.busy;
    thread.busy = undefined;
    if (busy && why !== undefined) {
      clearTimeout(busy.timer);
      busy.waiting.resolve({ error: why, ...(limit ? { limit } : {}) });
    }
    this.#threads.delete(thread);
    const at = this.#idle.indexOf(thread);
    if (at >= 0) this.#idle.splice(at, 1);
    await thread.worker.terminate();
    this.#pump();
  }
}

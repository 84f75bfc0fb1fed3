// forwarding/transform.ts: transforms, modules that reshape a delivery before each forward (a route's or a destination's
// "transform" in the sources file). Each module runs in a worker thread of its own (transform-thread.ts),
// one delivery at a time, stopped when it runs past its time limit, so a loop holds no lane and no handler.
// The forwarder (forwarder.ts) and `inbox.ts preview` run them; apps import the types to write one:
//   import type { Transform } from "webhook-inbox/transform";
//   export default ((d) => ({ body: { id: d.id, type: d.eventType }, headers: { "x-app": "1" } })) satisfies Transform;

import { isAbsolute, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { Worker } from "node:worker_threads";
import { DEFAULTS } from "../defaults.ts";
import type { Headers, Lease } from "../store.ts";

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
]);
const TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

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
const THREAD = new URL(
  `./transform-thread${fileURLToPath(import.meta.url).endsWith(".ts") ? ".ts" : ".js"}`,
  import.meta.url,
);

interface Job {
  input: TransformInput;
  timeoutMs: number;
  resolve(shaped: Shaped | null): void;
  reject(error: TransformError): void;
}

type Answer =
  | {
      id: number;
      result: { skip: true } | { skip: false; body?: Uint8Array; json: boolean; headers?: unknown };
      error?: undefined;
    }
  | { id: number; error: string };

// Deliveries handed to a thread ahead of their turn, so it never waits on a round trip between two. The
// thread still runs them one at a time, in order, and each one's time limit starts when the one before it
// comes back.
const AHEAD = 16;

/** Thread is one worker thread running the module, and the deliveries handed to it, oldest first. */
interface Thread {
  worker: Worker;
  ready: Promise<string | undefined>;
  sent: { id: number; job: Job }[];
  timer?: NodeJS.Timeout;
}

/**
 * Transformer runs one module in a thread of its own, one delivery at a time. Past a delivery's time limit
 * the thread is terminated (that stops any loop, awaited or not), that delivery fails, and a fresh thread
 * loads the module for the ones behind it.
 */
export class Transformer {
  /** The module's file URL. */
  readonly url: string;
  /** The module as the sources file named it, for errors. */
  readonly name: string;
  #thread?: Thread;
  #queue: Job[] = [];
  #next = 1;
  #closed = false;
  #starting = false;

  constructor(module: string, name = module) {
    this.url = module.startsWith("file:") ? module : pathToFileURL(module).href;
    this.name = name;
  }

  /** run reshapes one delivery; it rejects with a TransformError whose message says what went wrong. */
  run(input: TransformInput, timeoutMs: number = DEFAULTS.transformTimeoutMs): Promise<Shaped | null> {
    if (this.#closed) return Promise.reject(new TransformError(`transform ${this.name}: stopped`));
    return new Promise((resolve, reject) => {
      this.#queue.push({ input, timeoutMs, resolve, reject });
      void this.#pump();
    });
  }

  /** load starts the thread and says why the module cannot be used, or undefined when it can. */
  async load(): Promise<string | undefined> {
    return this.#start().ready;
  }

  /** close stops the thread; deliveries still waiting fail. */
  async close(): Promise<void> {
    this.#closed = true;
    const thread = this.#thread;
    this.#thread = undefined;
    for (const job of [...(thread?.sent.map((s) => s.job) ?? []), ...this.#queue.splice(0)])
      job.reject(new TransformError(`transform ${this.name}: stopped`));
    if (thread) {
      clearTimeout(thread.timer);
      thread.sent = [];
      await thread.worker.terminate();
    }
  }

  #start(): Thread {
    if (this.#thread) return this.#thread;
    const worker = new Worker(THREAD, {
      workerData: { module: this.url, tsx: TSX },
      resourceLimits: { maxOldGenerationSizeMb: DEFAULTS.transformHeapMb },
    });
    // An idle thread keeps no process alive; a delivery in hand keeps its timer.
    worker.unref();
    const thread: Thread = { worker, ready: Promise.resolve(undefined), sent: [] };
    thread.ready = new Promise<string | undefined>((resolve) => {
      const timer = setTimeout(
        () => resolve(`did not load within ${DEFAULTS.transformLoadMs} ms`),
        DEFAULTS.transformLoadMs,
      );
      const done = (why: string | undefined) => {
        clearTimeout(timer);
        worker.off("message", first);
        if (why === undefined) worker.on("message", (m: Answer) => this.#answered(thread, m));
        resolve(why);
      };
      const first = (m: { ready?: true; loadError?: string }) =>
        done(m.ready ? undefined : `could not be loaded: ${m.loadError}`);
      worker.on("message", first);
      // A thread that dies (an uncaught error in a callback, its heap full, process.exit) fails the delivery in
      // hand; dead while idle, it is let go, so the next delivery starts a fresh one rather than wait on it.
      const died = (why: string, loading: string) => {
        if (thread.sent.length > 0) return this.#lost(thread, why);
        this.#drop(thread);
        done(loading);
      };
      worker.on("error", (e) => died(`failed in its thread: ${e.message}`, `could not be loaded: ${e.message}`));
      worker.on("exit", () => died("ended its thread", "could not be loaded: its thread exited"));
    });
    this.#thread = thread;
    return thread;
  }

  // pump hands waiting deliveries to the thread, starting one (and loading the module) when there is none.
  async #pump(): Promise<void> {
    if (this.#starting || this.#queue.length === 0 || this.#closed) return;
    const thread = this.#start();
    if (thread.sent.length === 0) {
      this.#starting = true;
      const why = await thread.ready;
      this.#starting = false;
      if (why !== undefined) {
        // Each delivery fails with the reason; a module fixed meanwhile loads for the next one.
        this.#drop(thread);
        for (const job of this.#queue.splice(0)) job.reject(new TransformError(`transform ${this.name} ${why}`));
        return;
      }
    }
    if (this.#thread !== thread) return void this.#pump();
    while (thread.sent.length < AHEAD && this.#queue.length > 0) {
      const job = this.#queue.shift()!;
      const id = this.#next++;
      thread.sent.push({ id, job });
      // The body's own bytes, moved rather than cloned: cloning a view copies its whole backing buffer, which
      // for a row read from PostgreSQL is the connection's read buffer, not the body.
      const body = new Uint8Array(job.input.body);
      thread.worker.postMessage({ id, input: { ...job.input, body } }, [body.buffer]);
      if (thread.sent.length === 1) this.#time(thread);
    }
  }

  // time starts the oldest delivery's limit: the thread is on it now.
  #time(thread: Thread): void {
    clearTimeout(thread.timer);
    const head = thread.sent[0];
    if (head)
      thread.timer = setTimeout(
        () => this.#lost(thread, `ran past its ${head.job.timeoutMs} ms limit, so its thread was stopped`),
        head.job.timeoutMs,
      );
  }

  #answered(thread: Thread, answer: Answer): void {
    const head = thread.sent[0];
    if (!head || head.id !== answer.id) return;
    thread.sent.shift();
    this.#time(thread);
    try {
      if (answer.error !== undefined) throw new TransformError(`transform ${this.name} ${answer.error}`);
      head.job.resolve(answer.result.skip ? null : shape(answer.result, head.job.input, this.name));
    } catch (error) {
      head.job.reject(error as TransformError);
    }
    void this.#pump();
  }

  // lost fails the delivery in hand, drops its thread, and hands the ones behind it to a fresh thread.
  #lost(thread: Thread, why: string): void {
    if (thread.sent.length === 0) return;
    const [head, ...behind] = thread.sent;
    thread.sent = [];
    this.#drop(thread);
    this.#queue.unshift(...behind.map((s) => s.job));
    head!.job.reject(new TransformError(`transform ${this.name} ${why}`));
    void this.#pump();
  }

  #drop(thread: Thread): void {
    clearTimeout(thread.timer);
    if (this.#thread === thread) this.#thread = undefined;
    void thread.worker.terminate();
  }
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
      if (!TOKEN.test(raw)) fail(`the header name ${JSON.stringify(raw)}, which HTTP does not allow`);
      if (RESERVED.has(name))
        fail(`the header ${name}, which the inbox sets itself (the signature covers the bytes sent)`);
      if (value !== null && (typeof value !== "string" || /[\r\n\0]/.test(value)))
        fail(
          `header ${name} as ${typeof value === "string" ? "text with a line break" : typeof value}; expected a string, or null to remove it`,
        );
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

/**
 * Transforms keeps one Transformer per module, for the forwarder's lanes to share. Relative module paths
 * are taken from base (the sources file's folder, as worker.ts says).
 */
export class Transforms {
  readonly #base: string;
  readonly #all = new Map<string, Transformer>();

  constructor(base: string) {
    this.#base = base;
  }

  /** get returns the Transformer of a module, as the sources file names it. */
  get(module: string): Transformer {
    const path = isAbsolute(module) ? module : resolve(this.#base, module);
    let t = this.#all.get(path);
    if (!t) this.#all.set(path, (t = new Transformer(path, module)));
    return t;
  }

  /** close stops every thread. */
  async close(): Promise<void> {
    await Promise.all([...this.#all.values()].map((t) => t.close()));
    this.#all.clear();
  }
}

/**
 * checkTransforms loads each module in transforms, whose threads then serve the forwards, and says what
 * cannot be used: `where: transform ./x.ts could not be loaded: …`, or undefined when all can. worker.ts
 * calls it at start-up and hands the same transforms to forward().
 */
export async function checkTransforms(
  uses: readonly { module: string; where: string }[],
  transforms: Transforms,
): Promise<string | undefined> {
  // All at once; the first in the file's order that cannot be used is the one reported.
  const why = await Promise.all(uses.map((use) => transforms.get(use.module).load()));
  const i = why.findIndex((w) => w !== undefined);
  return i < 0 ? undefined : `${uses[i]!.where}: transform ${uses[i]!.module} ${why[i]}`;
}

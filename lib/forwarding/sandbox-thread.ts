// forwarding/sandbox-thread.ts: the worker thread that runs transform code in QuickJS compiled to WebAssembly.
// sandbox.ts starts it and hands it one call at a time; each call gets a QuickJS context of its own, in memory
// bounded by the thread's WebAssembly memory and with an interrupt at its deadline, disposed when the call ends,
// so nothing a call leaves behind reaches the next. The engine has no file system, network, timers, process or environment to give:
// only what the prelude below defines exists. Not run on its own.

import { parentPort, workerData } from "node:worker_threads";
import variant from "@jitl/quickjs-wasmfile-release-sync";
import {
  type QuickJSContext,
  type QuickJSHandle,
  type QuickJSRuntime,
  type QuickJSSyncVariant,
  newQuickJSWASMModuleFromVariant,
  newVariant,
} from "quickjs-emscripten-core";

/** ThreadCall is one call as sandbox.ts sends it. */
export interface ThreadCall {
  id: number;
  code: string;
  /** Check only that the code compiles and defines a transform; run nothing of it but its top level. */
  check?: boolean;
  /** The delivery, its body apart. */
  meta: Record<string, unknown>;
  body: Uint8Array;
  timeoutMs: number;
  memoryMb: number;
}

/** ThreadAnswer is what a call came to: what to send, or the one line saying why not. */
export type ThreadAnswer =
  | { id: number; skip: true }
  | { id: number; skip: false; body?: Uint8Array; json: boolean; headers: Record<string, unknown> }
  | { id: number; error: string; limit?: "time" | "memory" };

// The prelude runs first in every context: it defines the two contracts' entry points and drive(), which calls
// the transform and turns what it returned into a JSON line (and bytes in __outBytes). Written in the engine's
// JavaScript, so a transform that tampers with a builtin spoils only its own answer, which the host checks.
const PRELUDE = String.raw`
"use strict";
(() => {
  const g = globalThis;
  let handler;
  // What the transform returned and cannot be sent: said as it is, not as an error the code threw.
  class ShapeError extends TypeError {}
  Object.defineProperty(ShapeError.prototype, "name", { value: "ShapeError" });
  const quiet = () => {};
  g.console = { log: quiet, info: quiet, warn: quiet, error: quiet, debug: quiet };
  g.addHandler = (name, fn) => {
    if (name !== "transform") throw new TypeError("addHandler: expected \"transform\", got " + JSON.stringify(name));
    if (typeof fn !== "function") throw new TypeError("addHandler: expected a function");
    handler = fn;
  };
  const kind = (v) => v === null ? "null" : Array.isArray(v) ? "a list" : v instanceof Uint8Array ? "bytes" : typeof v === "object" ? "an object" : typeof v;
  const bodyOut = (body, sameText) => {
    if (body instanceof Uint8Array || body instanceof ArrayBuffer) {
      g.__outBytes = body instanceof ArrayBuffer ? body : body.slice().buffer;
      return { kind: "bytes" };
    }
    if (typeof body === "string") return body === sameText ? { kind: "same" } : { kind: "text", text: body };
    const text = JSON.stringify(body);
    if (text === undefined) throw new ShapeError("returned a body that is " + kind(body) + "; expected bytes, a string or a JSON value");
    return { kind: "json", text };
  };
  g.__defines = (mod) => handler ? "hookdeck" : mod && typeof mod.default === "function" ? "delivery" : undefined;
  g.__drive = async (mod) => {
    const input = JSON.parse(g.__in);
    const text = g.__text;
    if (handler) {
      // Hookdeck's contract: the request's headers, body (parsed JSON, or the raw string), query and path;
      // what is returned is sent, its headers as they now are.
      let body = text;
      try { body = JSON.parse(text); } catch {}
      const before = typeof body === "object" && body !== null ? JSON.stringify(body) : undefined;
      const headers = Object.assign({}, input.headers || {});
      const request = { headers, body, query: "", path: "/" };
      const context = { id: input.id, source: input.source, destination: input.destination, eventType: input.eventType, attempt: input.attempt, receivedAt: input.receivedAt };
      const out = await handler(request, context);
      if (out === null) return JSON.stringify({ skip: true });
      if (typeof out !== "object" || Array.isArray(out)) throw new ShapeError("returned " + kind(out) + "; expected the request (or null to skip this destination)");
      if ((out.path ?? "/") !== "/" || (out.query ?? "") !== "")
        throw new ShapeError("changed the request's path or query, which this inbox does not send: each destination has its own URL");
      const given = out.headers ?? {};
      if (typeof given !== "object" || given === null || Array.isArray(given)) throw new ShapeError("returned headers that are not an object of names and values");
      const changes = {};
      const was = {};
      for (const [name, value] of Object.entries(input.headers || {})) was[name.toLowerCase()] = value;
      const now = {};
      for (const [name, value] of Object.entries(given)) now[name.toLowerCase()] = value;
      for (const [name, value] of Object.entries(now)) if (was[name] !== value) changes[name] = typeof value === "number" ? String(value) : value;
      for (const name of Object.keys(was)) if (!(name in now)) changes[name] = null;
      let shaped;
      if (out.body === undefined) shaped = { kind: "text", text: "" };
      else if (before !== undefined && typeof out.body === "object" && out.body !== null && !(out.body instanceof Uint8Array) && JSON.stringify(out.body) === before) shaped = { kind: "same" };
      else shaped = bodyOut(out.body, text);
      return JSON.stringify({ skip: false, body: shaped, headers: changes, hookdeck: true });
    }
    // The project's contract: (delivery) => { body?, headers? } | null.
    const delivery = Object.assign({}, input, { body: new Uint8Array(g.__body) });
    Object.defineProperty(delivery, "json", { enumerable: true, get() { try { return JSON.parse(text); } catch { return undefined; } } });
    const out = await mod.default(delivery);
    if (out === null) return JSON.stringify({ skip: true });
    if (typeof out !== "object" || Array.isArray(out) || out instanceof Uint8Array) throw new ShapeError("returned " + kind(out) + "; expected null (skip this destination) or { body?, headers? }");
    const extra = Object.keys(out).filter((k) => k !== "body" && k !== "headers");
    if (extra.length > 0) throw new ShapeError("returned an object with " + extra.map((k) => JSON.stringify(k)).join(", ") + "; expected only body and headers");
    return JSON.stringify({ skip: false, body: out.body === undefined ? { kind: "same" } : bodyOut(out.body), headers: out.headers ?? {} });
  };
})();
`;

// The engine's whole memory is one WebAssembly.Memory whose maximum is the limit: QuickJS's own malloc limit
// counts allocations rather than their bytes in this build (it has no malloc_usable_size), so the memory's
// maximum is what holds: past it every allocation fails, and the call ends "out of memory". Its 16 MB start
// is the engine's own need.
const { memoryMb } = workerData as { memoryMb: number };
const memory = new WebAssembly.Memory({
  initial: 256,
  maximum: Math.max(256, Math.ceil((memoryMb * 1024 * 1024) / 65_536)),
});
// The package's types are its CommonJS build's, whose default sits one level down; as ESM it is the variant.
const QuickJS = await newQuickJSWASMModuleFromVariant(
  newVariant(((variant as { default?: unknown }).default ?? variant) as QuickJSSyncVariant, { wasmMemory: memory }),
);
const decoder = new TextDecoder();
const encoder = new TextEncoder();

/** LimitError is a call stopped at one of its limits. */
class LimitError extends Error {
  readonly limit: "time" | "memory";
  constructor(message: string, limit: "time" | "memory") {
    super(message);
    this.limit = limit;
  }
}

// described turns an error the code threw (a handle) into one line, and says which limit stopped it, if one did.
function described(ctx: QuickJSContext, handle: QuickJSHandle, call: ThreadCall, timedOut: () => boolean): Error {
  let error: { name?: unknown; message?: unknown } | unknown;
  try {
    error = ctx.dump(handle);
  } catch {
    error = undefined;
  }
  const name = String((error as { name?: unknown })?.name ?? "");
  const message = String((error as { message?: unknown })?.message ?? error);
  if (timedOut() || (name === "InternalError" && message === "interrupted"))
    return new LimitError(`ran past its ${call.timeoutMs} ms limit, so it was stopped`, "time");
  if (/out of memory/i.test(message) || error === undefined)
    return new LimitError(`ran out of memory: past its ${call.memoryMb} MB limit, so it was stopped`, "memory");
  if (name === "ShapeError") return new Error(message);
  if (/stack overflow/i.test(message)) return new Error(`threw ${name || "Error"}: ${message} (its stack is bounded)`);
  return new Error(
    typeof error === "object" && error !== null && "message" in error
      ? `threw ${name || "Error"}: ${message}`
      : `threw a non-error value: ${message}`,
  );
}

let kept: QuickJSRuntime | undefined;

// call runs one transform call in a context of its own, and disposes all of it before it returns.
function call(job: ThreadCall): ThreadAnswer {
  const started = Date.now();
  const deadline = started + job.timeoutMs;
  let interrupted = false;
  // A runtime is kept between the calls that end cleanly (it holds no value of theirs once their context is
  // gone, and no job is left queued); a call that failed, or left a job behind, takes its runtime with it.
  const rt: QuickJSRuntime = kept ?? QuickJS.newRuntime();
  kept = undefined;
  let clean = false;
  rt.setMemoryLimit(job.memoryMb * 1024 * 1024);
  rt.setMaxStackSize(512 * 1024);
  rt.setInterruptHandler(() => {
    if (Date.now() > deadline) interrupted = true;
    return interrupted;
  });
  const ctx = rt.newContext();
  const handles: QuickJSHandle[] = [];
  const keep = (h: QuickJSHandle) => (handles.push(h), h);
  const timedOut = () => interrupted;
  try {
    const unwrap = (r: ReturnType<QuickJSContext["evalCode"]>): QuickJSHandle => {
      if (r.error) {
        keep(r.error);
        throw described(ctx, r.error, job, timedOut);
      }
      return keep(r.value);
    };
    unwrap(ctx.evalCode(PRELUDE, "prelude.js", { type: "global" }));
    // A module when it has export (the project's contract), a script when not (Hookdeck's addHandler).
    const isModule = /(^|[\s;])export\s/.test(job.code);
    let mod = unwrap(ctx.evalCode(job.code, "transform.js", { type: isModule ? "module" : "global" }));
    if (isModule) {
      rt.executePendingJobs();
      const state = ctx.getPromiseState(mod);
      if (state.type === "rejected") {
        keep(state.error);
        throw described(ctx, state.error, job, timedOut);
      }
      if (state.type === "pending") throw new Error("did not finish loading: its top-level await never settled");
      if (!state.notAPromise) mod = keep(state.value);
    } else mod = ctx.undefined;
    ctx.setProp(ctx.global, "__module", mod);
    const defines = ctx.dump(unwrap(ctx.evalCode("__defines(globalThis.__module)", "drive.js", { type: "global" })));
    if (defines === undefined)
      throw new Error(
        'defines no transform: expected export default (delivery) => …, or addHandler("transform", (request, context) => …)',
      );
    if (job.check) {
      clean = true;
      return { id: job.id, skip: true };
    }
    const text = decoder.decode(job.body);
    ctx.setProp(ctx.global, "__in", keep(ctx.newString(JSON.stringify(job.meta))));
    ctx.setProp(ctx.global, "__text", keep(ctx.newString(text)));
    const copy = job.body.slice();
    ctx.setProp(ctx.global, "__body", keep(ctx.newArrayBuffer(copy.buffer)));
    const promise = unwrap(ctx.evalCode("__drive(globalThis.__module)", "drive.js", { type: "global" }));
    // No timers or I/O exist in here, so its jobs are all it can wait on: once they are run, it has settled or never will.
    const ran = rt.executePendingJobs();
    if (ran.error) {
      keep(ran.error);
      throw described(ctx, ran.error, job, timedOut);
    }
    const state = ctx.getPromiseState(promise);
    if (state.type === "pending")
      throw new Error("returned a promise that never settles (there are no timers or I/O to wait on here)");
    if (state.type === "rejected") {
      keep(state.error);
      throw described(ctx, state.error, job, timedOut);
    }
    const line = JSON.parse(ctx.getString(keep(state.value))) as {
      skip: boolean;
      body?: { kind: "same" | "text" | "json" | "bytes"; text?: string };
      headers?: Record<string, unknown>;
    };
    clean = !rt.hasPendingJob();
    if (line.skip) return { id: job.id, skip: true };
    let body: Uint8Array | undefined;
    if (line.body?.kind === "text" || line.body?.kind === "json") body = encoder.encode(line.body.text ?? "");
    else if (line.body?.kind === "bytes") {
      const out = keep(ctx.getProp(ctx.global, "__outBytes"));
      const view = ctx.getArrayBuffer(out);
      body = view.value.slice();
      view.dispose();
    }
    return {
      id: job.id,
      skip: false,
      json: line.body?.kind === "json",
      headers: line.headers ?? {},
      ...(body ? { body } : {}),
    };
  } catch (error) {
    return {
      id: job.id,
      error: (error as Error).message,
      ...(error instanceof LimitError ? { limit: error.limit } : {}),
    };
  } finally {
    for (const h of handles.reverse()) if (h.alive) h.dispose();
    ctx.dispose();
    if (clean) kept = rt;
    else rt.dispose();
  }
}

parentPort!.on("message", (job: ThreadCall) => parentPort!.postMessage(call(job)));
parentPort!.postMessage({ ready: true });

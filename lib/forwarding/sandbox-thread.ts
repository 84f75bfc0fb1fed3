// forwarding/sandbox-thread.ts: the worker thread that runs transform code in QuickJS compiled to WebAssembly.
// sandbox.ts starts it and hands it one call at a time. A transform's code gets a QuickJS context of its own, in
// memory bounded by the thread's WebAssembly memory and with an interrupt at each call's deadline; the prelude
// and the code are evaluated once in it, the intrinsics and the prelude's globals are then frozen, and the
// context runs the code's next calls, up to DEFAULTS.sandboxContextCalls of them: what the code's own top level
// holds is all that carries from one call to the next. A call that fails ends its context, and one that runs out
// of memory ends every context of the thread. The engine has no file system, network, timers, process or
// environment to give: only what the prelude below defines exists. Not run on its own.

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

// The prelude runs first in every context, before the transform's code. Its value is { drive, defines, lock }:
// drive calls the transform and turns what it returned into a JSON line (and bytes); defines says which contract
// the code took; lock, run once the code's top level has, freezes what the next call would otherwise inherit
// from this one. Written in the engine's JavaScript, so a transform that tampers with a builtin spoils only its
// own answer, which the host checks.
const PRELUDE = String.raw`
"use strict";
(() => {
  const g = globalThis;
  // The engine's own globals, before anything is added: what lock freezes, with console and addHandler.
  const standard = Reflect.ownKeys(g);
  const { defineProperty, getOwnPropertyDescriptor, getPrototypeOf, freeze, isFrozen, preventExtensions } = Object;
  const ownKeys = Reflect.ownKeys;
  let handler;
  let locked = false;
  // What the transform returned and cannot be sent: said as it is, not as an error the code threw.
  class ShapeError extends TypeError {}
  defineProperty(ShapeError.prototype, "name", { value: "ShapeError" });
  const quiet = () => {};
  g.console = { log: quiet, info: quiet, warn: quiet, error: quiet, debug: quiet };
  g.addHandler = (name, fn) => {
    // Only at the code's top level: a call may not change what the next call runs.
    if (locked) throw new TypeError("addHandler: only at the top level of the code, not while a delivery runs");
    if (name !== "transform") throw new TypeError("addHandler: expected \"transform\", got " + JSON.stringify(name));
    if (typeof fn !== "function") throw new TypeError("addHandler: expected a function");
    handler = fn;
  };
  const kind = (v) => v === null ? "null" : Array.isArray(v) ? "a list" : v instanceof Uint8Array ? "bytes" : typeof v === "object" ? "an object" : typeof v;
  const defines = (mod) => handler ? "hookdeck" : mod && typeof mod.default === "function" ? "delivery" : undefined;

  // Properties that code sets on its own objects while the prototype holds them (this.name in an Error's
  // subclass, o.toString = …): frozen as data they would refuse that assignment (the "override mistake"),
  // so they become accessors that give the same value and let an object have its own.
  const overridable = new Set(["constructor", "name", "message", "toString", "valueOf", "toLocaleString", "toJSON", "hasOwnProperty", "isPrototypeOf", "propertyIsEnumerable"]);
  const tame = (proto, key) => {
    const d = getOwnPropertyDescriptor(proto, key);
    if (!d || !("value" in d) || !d.writable || !d.configurable) return;
    const value = d.value;
    // Methods, which have no prototype of their own for the walk to tame in turn.
    defineProperty(proto, key, {
      get() { return value; },
      set(v) {
        if (this === proto) throw new TypeError("cannot assign to " + String(key) + ": the sandbox's builtins are frozen");
        defineProperty(this, key, { value: v, writable: true, enumerable: true, configurable: true });
      },
      enumerable: d.enumerable,
      configurable: false,
    });
  };
  // deepFreeze freezes an object, what its properties hold and its prototype chain, once each.
  const deepFreeze = (roots) => {
    const todo = roots.slice();
    // The global object is not frozen itself: the code's own top-level names live on it.
    const seen = new Set([g]);
    while (todo.length > 0) {
      const o = todo.pop();
      if ((typeof o !== "object" && typeof o !== "function") || o === null || seen.has(o)) continue;
      seen.add(o);
      const c = getOwnPropertyDescriptor(o, "constructor");
      if ((c && "value" in c && typeof c.value === "function" && c.value.prototype === o) || o === Error.prototype)
        for (const key of overridable) tame(o, key);
      for (const key of ownKeys(o)) {
        const d = getOwnPropertyDescriptor(o, key);
        if ("value" in d) todo.push(d.value);
        else todo.push(d.get, d.set);
      }
      todo.push(getPrototypeOf(o));
      if (!isFrozen(o)) freeze(o);
    }
  };
  // lock freezes the engine's builtins (those named by a global and those reached only through a value: the
  // prototypes of generators, async functions and iterators), makes the prelude's globals fixed, and lets no
  // new global be added. The code's own top-level names stay as it made them: they are its state.
  const lock = () => {
    locked = true;
    const hidden = [
      function* () {}, async function () {}, async function* () {}, (function* () {})(), (async function* () {})(),
      [][Symbol.iterator](), new Map()[Symbol.iterator](), new Set()[Symbol.iterator](), ""[Symbol.iterator](),
      /a/g[Symbol.matchAll](""),
    ];
    const named = [...standard, "console", "addHandler"];
    deepFreeze([getPrototypeOf(g), ...named.map((k) => g[k]), ...hidden.map((h) => getPrototypeOf(h))]);
    for (const key of named) {
      const d = getOwnPropertyDescriptor(g, key);
      if (d && d.configurable) defineProperty(g, key, { configurable: false, ...("value" in d ? { writable: false } : {}) });
    }
    preventExtensions(g);
  };

  const drive = async (mod, inputText, text, bodyBuffer) => {
    let outBytes;
    const bodyOut = (body, sameText) => {
      if (body instanceof Uint8Array || body instanceof ArrayBuffer) {
        outBytes = body instanceof ArrayBuffer ? body : body.slice().buffer;
        return { kind: "bytes" };
      }
      if (typeof body === "string") return body === sameText ? { kind: "same" } : { kind: "text", text: body };
      const text = JSON.stringify(body);
      if (text === undefined) throw new ShapeError("returned a body that is " + kind(body) + "; expected bytes, a string or a JSON value");
      return { kind: "json", text };
    };
    const input = JSON.parse(inputText);
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
      if (out === null) return [JSON.stringify({ skip: true })];
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
      return [JSON.stringify({ skip: false, body: shaped, headers: changes, hookdeck: true }), outBytes];
    }
    // The project's contract: (delivery) => { body?, headers? } | null.
    const delivery = Object.assign({}, input, { body: new Uint8Array(bodyBuffer) });
    // Parsed at the first look and kept for the call, one object as a module's process gives: QuickJS
    // interprets, and a body parsed at each d.json cost as many parses as the code had looks.
    let json;
    let parsed = false;
    defineProperty(delivery, "json", { enumerable: true, get() {
      if (!parsed) { parsed = true; try { json = JSON.parse(text); } catch {} }
      return json;
    } });
    const out = await mod.default(delivery);
    if (out === null) return [JSON.stringify({ skip: true })];
    if (typeof out !== "object" || Array.isArray(out) || out instanceof Uint8Array) throw new ShapeError("returned " + kind(out) + "; expected null (skip this destination) or { body?, headers? }");
    const extra = Object.keys(out).filter((k) => k !== "body" && k !== "headers");
    if (extra.length > 0) throw new ShapeError("returned an object with " + extra.map((k) => JSON.stringify(k)).join(", ") + "; expected only body and headers");
    return [JSON.stringify({ skip: false, body: out.body === undefined ? { kind: "same" } : bodyOut(out.body), headers: out.headers ?? {} }), outBytes];
  };
  return { drive, defines, lock };
})();
`;

// The engine's whole memory is one WebAssembly.Memory whose maximum is the limit: QuickJS's own malloc limit
// counts allocations rather than their bytes in this build (it has no malloc_usable_size), so the memory's
// maximum is what holds: past it every allocation fails, and the call ends "out of memory". Its 16 MB start
// is the engine's own need.
const { memoryMb, contextCalls, contextsKept } = workerData as {
  memoryMb: number;
  contextCalls: number;
  contextsKept: number;
};
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

/** Context is a transform's code evaluated once in a QuickJS context, kept for its next calls. */
interface Context {
  rt: QuickJSRuntime;
  ctx: QuickJSContext;
  /** Handles that live as long as the context: the prelude's value, drive, and the code's module. */
  held: QuickJSHandle[];
  drive: QuickJSHandle;
  mod: QuickJSHandle;
  /** Calls run in it so far; at contextCalls it is ended. */
  calls: number;
  /** The running call's deadline, which the interrupt handler reads, and whether it was passed. */
  deadline: number;
  interrupted: boolean;
}

// The contexts this thread keeps, by code, the least recently used first (a Map keeps the order it was set in).
const contexts = new Map<string, Context>();

function retire(code: string, context: Context): void {
  if (contexts.get(code) === context) contexts.delete(code);
  for (const h of context.held.reverse()) if (h.alive) h.dispose();
  context.ctx.dispose();
  context.rt.dispose();
}

// unwrapped gives an evaluation's value, or throws what the code threw as one line.
function unwrapped(
  context: Context,
  r: ReturnType<QuickJSContext["evalCode"]>,
  job: ThreadCall,
  keep: (h: QuickJSHandle) => QuickJSHandle,
): QuickJSHandle {
  if (r.error) {
    keep(r.error);
    throw described(context.ctx, r.error, job, () => context.interrupted);
  }
  return keep(r.value);
}

// open makes a context for the job's code: its own runtime, the prelude, the code's top level, then lock. It
// runs within the job's deadline, which the caller has set.
function open(job: ThreadCall, context: Context): void {
  const { rt, ctx, held } = context;
  const keep = (h: QuickJSHandle) => (held.push(h), h);
  const prelude = unwrapped(context, ctx.evalCode(PRELUDE, "prelude.js", { type: "global" }), job, keep);
  context.drive = keep(ctx.getProp(prelude, "drive"));
  const defines = keep(ctx.getProp(prelude, "defines"));
  // A module when it has export (the project's contract), a script when not (Hookdeck's addHandler).
  const isModule = /(^|[\s;])export\s/.test(job.code);
  let mod = unwrapped(
    context,
    ctx.evalCode(job.code, "transform.js", { type: isModule ? "module" : "global" }),
    job,
    keep,
  );
  if (isModule) {
    rt.executePendingJobs();
    const state = ctx.getPromiseState(mod);
    if (state.type === "rejected") {
      keep(state.error);
      throw described(ctx, state.error, job, () => context.interrupted);
    }
    if (state.type === "pending") throw new Error("did not finish loading: its top-level await never settled");
    if (!state.notAPromise) mod = keep(state.value);
  } else mod = ctx.undefined;
  context.mod = mod;
  const said = ctx.callFunction(defines, ctx.undefined, mod);
  if (ctx.dump(unwrapped(context, said, job, keep)) === undefined)
    throw new Error(
      'defines no transform: expected export default (delivery) => …, or addHandler("transform", (request, context) => …)',
    );
  const locked = ctx.callFunction(keep(ctx.getProp(prelude, "lock")), ctx.undefined);
  unwrapped(context, locked, job, keep);
}

// call runs one transform call in its code's context, made first when there is none. A context whose call
// failed, left a job queued, or reached its contextCalls is ended before the answer goes back.
function call(job: ThreadCall): ThreadAnswer {
  // A check runs in a context of its own, made and ended here, and leaves the kept one as it was.
  let context = job.check ? undefined : contexts.get(job.code);
  if (context) contexts.delete(job.code);
  const fresh = !context;
  if (!context) {
    const rt = QuickJS.newRuntime();
    rt.setMemoryLimit(job.memoryMb * 1024 * 1024);
    rt.setMaxStackSize(512 * 1024);
    const ctx = rt.newContext();
    const made: Context = {
      rt,
      ctx,
      held: [],
      drive: ctx.undefined,
      mod: ctx.undefined,
      calls: 0,
      deadline: 0,
      interrupted: false,
    };
    // Set once for the context's life: it reads the deadline each call sets.
    rt.setInterruptHandler(() => {
      if (Date.now() > made.deadline) made.interrupted = true;
      return made.interrupted;
    });
    context = made;
  }
  const c = context;
  c.deadline = Date.now() + job.timeoutMs;
  c.interrupted = false;
  const { rt, ctx } = c;
  const handles: QuickJSHandle[] = [];
  const keep = (h: QuickJSHandle) => (handles.push(h), h);
  let clean = false;
  try {
    if (fresh) open(job, c);
    if (job.check) return { id: job.id, skip: true };
    c.calls++;
    const copy = job.body.slice();
    const promise = unwrapped(
      c,
      ctx.callFunction(
        c.drive,
        ctx.undefined,
        c.mod,
        keep(ctx.newString(JSON.stringify(job.meta))),
        keep(ctx.newString(decoder.decode(job.body))),
        keep(ctx.newArrayBuffer(copy.buffer)),
      ),
      job,
      keep,
    );
    // No timers or I/O exist in here, so its jobs are all it can wait on: once they are run, it has settled or never will.
    const ran = rt.executePendingJobs();
    if (ran.error) {
      keep(ran.error);
      throw described(ctx, ran.error, job, () => c.interrupted);
    }
    const state = ctx.getPromiseState(promise);
    if (state.type === "pending")
      throw new Error("returned a promise that never settles (there are no timers or I/O to wait on here)");
    if (state.type === "rejected") {
      keep(state.error);
      throw described(ctx, state.error, job, () => c.interrupted);
    }
    const pair = keep(state.value);
    const line = JSON.parse(ctx.getString(keep(ctx.getProp(pair, 0)))) as {
      skip: boolean;
      body?: { kind: "same" | "text" | "json" | "bytes"; text?: string };
      headers?: Record<string, unknown>;
    };
    clean = !rt.hasPendingJob();
    if (line.skip) return { id: job.id, skip: true };
    let body: Uint8Array | undefined;
    if (line.body?.kind === "text" || line.body?.kind === "json") body = encoder.encode(line.body.text ?? "");
    else if (line.body?.kind === "bytes") {
      const view = ctx.getArrayBuffer(keep(ctx.getProp(pair, 1)));
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
    // Out of memory: the engines of this thread share one memory, so every kept context goes, and the next
    // calls start in an empty one rather than fail behind what another transform holds.
    if (error instanceof LimitError && error.limit === "memory") for (const [code, k] of contexts) retire(code, k);
    return {
      id: job.id,
      error: (error as Error).message,
      ...(error instanceof LimitError ? { limit: error.limit } : {}),
    };
  } finally {
    for (const h of handles.reverse()) if (h.alive) h.dispose();
    if (clean && !job.check && c.calls < contextCalls) {
      contexts.set(job.code, c);
      for (const [code, k] of contexts) {
        if (contexts.size <= contextsKept) break;
        retire(code, k);
      }
    } else retire(job.code, c);
  }
}

parentPort!.on("message", (job: ThreadCall) => parentPort!.postMessage(call(job)));
parentPort!.postMessage({ ready: true });

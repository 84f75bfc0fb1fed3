// forwarding/transform-child.ts: the child process one transform module runs in. transform.ts forks it with the
// module's URL, a heap limit and a watch on its memory, and kills it past a time or memory limit, so neither a
// loop nor a heap or Buffer that grows without end reaches the worker. It loads the module once, then runs one
// delivery at a time and sends back what to send. Not run on its own.

import { AsyncLocalStorage } from "node:async_hooks";

/** ChildJob is one delivery for the transform, as transform.ts sends it. */
interface ChildJob {
  id: number;
  input: Record<string, unknown> & { body: Uint8Array };
}

// The parent is the only reader of argv here: the module's URL and tsx's register(), when it is installed.
const [module = "", tsx] = process.argv.slice(2) as [string?, string?];
const send = (message: unknown) => process.send!(message);
// Which delivery's call a callback was set in, so an error thrown later, from a timer of the module's own,
// is blamed on the module and not on the delivery in hand when it fires.
const calls = new AsyncLocalStorage<{ id: number; delivery: string }>();
let inHand: number | undefined;
const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** ShapeError is a transform's answer that cannot be sent, as against an error the transform threw. */
class ShapeError extends Error {}

const kindOf = (v: unknown) =>
  v === null
    ? "null"
    : Array.isArray(v)
      ? "a list"
      : v instanceof Uint8Array
        ? "bytes"
        : typeof v === "object"
          ? "an object"
          : typeof v;

// Where a failure happened in the user's module: the first line of its stack that names the module.
function whereIn(error: unknown): string {
  const stack = (error as { stack?: unknown })?.stack;
  if (typeof stack !== "string") return "";
  const line = stack.split("\n").find((l) => l.includes(module.replace(/^file:\/\//, "")) || l.includes(module));
  const at = line ? /\(?([^()\s]+:\d+:\d+)\)?\s*$/.exec(line)?.[1] : undefined;
  return at
    ? ` (at ${
        at
          .replace(/^file:\/\//, "")
          .split("/")
          .slice(-1)[0]
      })`
    : "";
}

const described = (error: unknown) =>
  error instanceof Error ? `${error.name}: ${error.message}${whereIn(error)}` : `a non-error value: ${String(error)}`;

// normalize turns what the transform returned into bytes and headers, or says why it cannot be sent.
function normalize(
  out: unknown,
): { skip: true } | { skip: false; body?: Uint8Array; json: boolean; headers?: unknown } {
  if (out === null) return { skip: true };
  if (typeof out !== "object" || Array.isArray(out) || out instanceof Uint8Array) {
    throw new ShapeError(`returned ${kindOf(out)}; expected null (skip this destination) or { body?, headers? }`);
  }
  const extra = Object.keys(out).filter((k) => k !== "body" && k !== "headers");
  if (extra.length > 0)
    throw new ShapeError(
      `returned an object with ${extra.map((k) => JSON.stringify(k)).join(", ")}; expected only body and headers`,
    );
  const { body, headers } = out as { body?: unknown; headers?: unknown };
  if (body === undefined) return { skip: false, json: false, headers };
  if (body instanceof Uint8Array) return { skip: false, body, json: false, headers };
  if (body instanceof ArrayBuffer) return { skip: false, body: new Uint8Array(body), json: false, headers };
  if (typeof body === "string") return { skip: false, body: encoder.encode(body), json: false, headers };
  const text = JSON.stringify(body);
  if (text === undefined)
    throw new ShapeError(`returned a body that is ${kindOf(body)}; expected bytes, a string or a JSON value`);
  return { skip: false, body: encoder.encode(text), json: true, headers };
}

let transform: ((input: unknown) => unknown) | undefined;
try {
  // tsx, where it is installed, lets the module use the TypeScript that Node's own type stripping does not take.
  if (tsx) {
    try {
      ((await import(tsx)) as { register(): void }).register();
    } catch {
      // Node strips erasable TypeScript itself.
    }
  }
  const loaded = (await import(module)) as { default?: unknown };
  // A module that tsx loaded as CommonJS has its default export one level down.
  const fn =
    typeof loaded.default === "function"
      ? loaded.default
      : (loaded.default as { default?: unknown } | undefined)?.default;
  if (typeof fn !== "function")
    throw new TypeError(`its default export is ${kindOf(fn)}; expected a function (export default (d) => …)`);
  transform = fn as (input: unknown) => unknown;
  send({ ready: true });
} catch (error) {
  const path = module.startsWith("file:") ? new URL(module).pathname : module;
  const missing =
    (error as { code?: string }).code === "ERR_MODULE_NOT_FOUND" && (error as Error).message.includes(`'${path}'`);
  // A package the transform imports and cannot find where it is (webhook-inbox itself, from a transforms
  // folder outside the app): one line, the loader's first, without its require stack, and what to do.
  const unfound =
    !missing && /^(ERR_MODULE_NOT_FOUND|MODULE_NOT_FOUND)$/.test(String((error as { code?: string }).code));
  const firstLine = String((error as Error).message).split("\n")[0];
  send({
    loadError: missing
      ? `there is no file ${path}`
      : unfound
        ? `${firstLine}; a transform imports only types from webhook-inbox (import type), which leave nothing to load (docs/forwarding.md#transformations)`
        : error instanceof TypeError && !whereIn(error)
          ? error.message
          : described(error).replace(/ imported from \S*transform-child\.[jt]s/, ""),
  });
}

// An error no call awaits (a timer, a callback, a promise left unhandled) does not end the process. Set by
// the call in hand, it fails that call, which is let go even if its promise never settles; set by a call
// that has returned (or by the module itself), it is sent to the parent, which logs it against the module.
let abandon: ((error: ShapeError) => void) | undefined;
const stray = (error: unknown) => {
  const from = calls.getStore();
  if (from !== undefined && from.id === inHand && abandon)
    return abandon(new ShapeError(`threw ${described(error)} from a callback of its own`));
  send({ stray: described(error), id: from?.id, delivery: from?.delivery });
};
process.on("uncaughtException", stray);
process.on("unhandledRejection", stray);
// The parent gone (the worker killed), nothing is left to answer to.
process.on("disconnect", () => process.exit(0));

// One delivery at a time: transform.ts times the one in hand, and that is this process's only job.
let chain = Promise.resolve();
process.on("message", (job: ChildJob) => {
  chain = chain.then(() =>
    calls.run({ id: job.id, delivery: String(job.input.id) }, async () => {
      inHand = job.id;
      let answer: unknown;
      try {
        let json: unknown;
        try {
          json = JSON.parse(decoder.decode(job.input.body));
        } catch {
          json = undefined;
        }
        const given = new Promise<never>((_, reject) => (abandon = reject));
        answer = { id: job.id, result: normalize(await Promise.race([transform!({ ...job.input, json }), given])) };
      } catch (error) {
        answer = { id: job.id, error: error instanceof ShapeError ? error.message : `threw ${described(error)}` };
      }
      inHand = undefined;
      abandon = undefined;
      try {
        send(answer);
      } catch {
        send({
          id: job.id,
          error:
            "returned something that cannot leave its process (a function, a class instance?); expected bytes, a string or JSON, and string headers",
        });
      }
    }),
  );
});

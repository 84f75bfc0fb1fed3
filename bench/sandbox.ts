// bench/sandbox.ts: what a transform call costs in the sandbox (lib/forwarding/sandbox.ts: QuickJS in
// WebAssembly, a context kept per code for DEFAULTS.sandboxContextCalls calls, on worker threads), in a sandbox
// that makes a fresh context each call (contextCalls 1, as before issue 48's follow-up), against the same code
// as an operator's module in its child process (transform.ts's Transformer) and as a plain function call in the
// worker, in one run: a
// small reshape of a 300-byte body and one of a 64 KiB body (which the transform parses), one call at a time
// and 16 in flight. CPU counts this process, its threads, and the transform's process (Linux's /proc).
// Ratios are each side's over the plain call's and the sandbox's over the child process's.
//   npm run bench -- sandbox
//   BENCH_SANDBOX_N=2000 npm run bench -- sandbox

import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { Sandbox } from "../lib/forwarding/sandbox.ts";
import { CodeTransformer, type Shaped, type TransformInput, Transformer } from "../lib/forwarding/transform.ts";
import { f, knob, orderBody, tempDir, timeCalls } from "./common.ts";

const N = knob("BENCH_SANDBOX_N", 300);
const IN_FLIGHT = 16;

// The reshape of the transform docs: a few fields of the parsed body, one header.
const CODE = `export default (d) => ({
  body: { orderId: String(d.json.id), lines: d.json.items.length, currency: d.json.currency },
  headers: { "x-order-source": "shopify" },
});
`;
const plainTransform = (d: TransformInput) => {
  const json = JSON.parse(Buffer.from(d.body).toString("utf8")) as { id: number; items: unknown[]; currency: string };
  const body = { orderId: String(json.id), lines: json.items.length, currency: json.currency };
  return {
    body: Buffer.from(JSON.stringify(body)),
    contentType: "application/json",
    headers: { "x-order-source": "shopify" },
  } as Shaped;
};

type Call = (input: TransformInput) => Promise<Shaped | null>;

// run makes n calls of one side, each checked, at most inFlight at once.
const run = (call: Call, input: TransformInput, n: number, inFlight: number) =>
  timeCalls(
    async () => {
      const shaped = await call(input);
      if (shaped?.headers["x-order-source"] !== "shopify") throw new Error("sandbox bench: a wrong answer");
    },
    n,
    inFlight,
  );

/** sandboxBench runs the benchmark and returns its summary line. */
export async function sandboxBench(): Promise<string> {
  const dir = tempDir();
  const file = join(dir.dir, "shape.mjs");
  writeFileSync(file, CODE);
  const box = new Sandbox();
  const freshBox = new Sandbox({ contextCalls: 1 });
  const child = new Transformer(file, "./shape.mjs");
  const code = new CodeTransformer(CODE, "code:bench", box);
  const fresh = new CodeTransformer(CODE, "code:bench", freshBox);
  const sides: [string, Call][] = [
    ["plain", async (d) => plainTransform(d)],
    ["process", (d) => child.run(d, 5_000)],
    ["sandbox", (d) => code.run(d, 5_000)],
    ["fresh", (d) => fresh.run(d, 5_000)],
  ];
  const input = (body: Buffer): TransformInput => ({
    id: "o1",
    source: "shop",
    destination: "app",
    eventType: "orders/create",
    attempt: 1,
    contentType: "application/json",
    body,
    json: undefined,
    headers: {},
    receivedAt: 0,
  });
  const bodies = [orderBody(300), orderBody(64 * 1024)];
  console.log(`sandbox: ${N} calls a side, bodies of ${bodies.map((b) => b.length).join(" and ")} bytes`);
  const lines: string[] = [];
  try {
    for (const [, call] of sides) await run(call, input(bodies[0]!), 50, 4);
    for (const body of bodies) {
      for (const inFlight of [1, IN_FLIGHT]) {
        const got: Record<string, { wallUs: number; cpuUs: number }> = {};
        for (const [name, call] of sides) got[name] = await run(call, input(body), N, inFlight);
        const { plain, process: proc, sandbox, fresh: once } = got as Record<string, { wallUs: number; cpuUs: number }>;
        const line = `${body.length} B, ${inFlight} in flight: plain ${f(plain!.wallUs, 1)} µs (${f(plain!.cpuUs, 1)} µs CPU), process ${f(proc!.wallUs, 1)} µs (${f(proc!.cpuUs, 1)} CPU), sandbox ${f(sandbox!.wallUs, 1)} µs (${f(sandbox!.cpuUs, 1)} CPU) = ${f(sandbox!.wallUs / proc!.wallUs, 2)}× the process's wall, ${f(sandbox!.cpuUs / proc!.cpuUs, 2)}× its CPU, ${f(sandbox!.cpuUs / plain!.cpuUs, 0)}× the plain call's CPU; a fresh context each call ${f(once!.wallUs, 1)} µs (${f(once!.cpuUs, 1)} CPU) = ${f(once!.cpuUs / sandbox!.cpuUs, 2)}× the kept context's CPU`;
        console.log(`  ${line}`);
        lines.push(line);
      }
    }
  } finally {
    await child.close();
    await box.close();
    await freshBox.close();
    dir.cleanup();
  }
  return `sandbox: ${lines.join("; ")}`;
}

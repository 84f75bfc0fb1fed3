// bench/transforms.ts: what a transform costs per forward in its own process (lib/forwarding/transform.ts),
// against a baseline in the same run: BENCH_TRANSFORM_BASELINE names another checkout (main before issue 37,
// whose transforms ran in worker threads) whose Transformer runs the same module on the same deliveries. Each
// of BENCH_ROUNDS (3) rounds runs BENCH_TRANSFORM_N (2000) calls per side, one at a time (the wall time of a
// call) and 16 in flight (as a lane keeps them), for a 300-byte and a 64 KiB JSON body, alternating sides;
// CPU counts this process and the transforms' processes (Linux's /proc). Ratios are this tree's over the
// baseline's, within a round, and the medians are printed.
//   BENCH_TRANSFORM_BASELINE=/tmp/before npm run bench -- transforms

import { writeFileSync } from "node:fs";
import { join } from "node:path";
import type { Transformer as TransformerType } from "../lib/forwarding/transform.ts";
import { f, knob, orderBody, tempDir, timeCalls } from "./common.ts";

const N = knob("BENCH_TRANSFORM_N", 2_000);
const ROUNDS = knob("BENCH_ROUNDS", 3);
const IN_FLIGHT = 16;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

// SHAPE is the Shopify-style reshape of the transform docs: a few fields of the body, one header.
const SHAPE = `export default (d: { json: { id: number; items: unknown[]; currency: string } }) => ({
  body: { orderId: String(d.json.id), lines: d.json.items.length, currency: d.json.currency },
  headers: { "x-order-source": "shopify" },
});`;

type Side = { name: string; t: TransformerType; input: (body: Buffer) => unknown };

// run makes n calls of one side, each checked, at most inFlight at once.
function run(side: Side, body: Buffer, n: number, inFlight: number): Promise<{ wallUs: number; cpuUs: number }> {
  const input = side.input(body) as Parameters<TransformerType["run"]>[0];
  return timeCalls(
    async () => {
      const shaped = await side.t.run(input, 5_000);
      if (shaped?.headers["x-order-source"] !== "shopify") throw new Error("transforms bench: a wrong answer");
    },
    n,
    inFlight,
  );
}

/** transforms runs the benchmark and returns its summary line. */
export async function transforms(): Promise<string> {
  const dir = tempDir();
  const file = join(dir.dir, "shape.ts");
  writeFileSync(file, SHAPE);
  const lease = (body: Buffer) => ({
    source: "shop",
    id: "o1",
    body,
    contentType: "application/json",
    eventType: "orders/create",
    attempts: 1,
    headers: null,
    receivedAt: 0,
  });
  const load = async (from: string, name: string): Promise<Side> => {
    const m = (await import(
      join(from, "lib/forwarding/transform.ts")
    )) as typeof import("../lib/forwarding/transform.ts");
    const t = new m.Transformer(file, "./shape.ts");
    const why = await t.load();
    if (why) throw new Error(`transforms bench: ${name}: ${why}`);
    return { name, t, input: (body) => m.transformInput(lease(body) as never, "app") };
  };
  const baseline = process.env.BENCH_TRANSFORM_BASELINE;
  const sides = [await load(join(import.meta.dirname, ".."), "this tree")];
  if (baseline) sides.unshift(await load(baseline, `baseline ${baseline}`));
  const bodies = [orderBody(300), orderBody(64 * 1024)];
  console.log(
    `transforms: ${N} calls a side, one at a time and ${IN_FLIGHT} in flight, bodies of ${bodies.map((b) => b.length).join(" and ")} bytes, ${ROUNDS} rounds`,
  );
  const ratios: Record<string, number[]> = {};
  const figures: Record<string, number[]> = {};
  try {
    for (const side of sides) for (const body of bodies) await run(side, body, Math.min(N, 500), IN_FLIGHT);
    for (let round = 1; round <= ROUNDS; round++) {
      for (const body of bodies) {
        for (const inFlight of [1, IN_FLIGHT]) {
          const got: Record<string, { wallUs: number; cpuUs: number }> = {};
          for (const side of round % 2 === 0 ? [...sides].reverse() : sides)
            got[side.name] = await run(side, body, N, inFlight);
          const key = `${body.length} B, ${inFlight} in flight`;
          const mine = got["this tree"]!;
          (figures[`${key}: wall`] ??= []).push(mine.wallUs);
          (figures[`${key}: cpu`] ??= []).push(mine.cpuUs);
          const parts = Object.entries(got).map(
            ([name, r]) => `${name} ${f(r.wallUs, 1)} µs a call (${f(r.cpuUs, 1)} µs CPU)`,
          );
          if (baseline) {
            const base = got[sides[0]!.name]!;
            (ratios[`${key}: wall`] ??= []).push(mine.wallUs / base.wallUs);
            (ratios[`${key}: cpu`] ??= []).push(mine.cpuUs / base.cpuUs);
            parts.push(`= ${f(mine.wallUs / base.wallUs, 2)}× the wall, ${f(mine.cpuUs / base.cpuUs, 2)}× the CPU`);
          }
          console.log(`  round ${round}, ${key}: ${parts.join(", ")}`);
        }
      }
    }
  } finally {
    for (const side of sides) await side.t.close();
    dir.cleanup();
  }
  const keys = Object.keys(figures).filter((k) => k.endsWith(": wall"));
  return `transforms (medians of ${ROUNDS}): ${keys
    .map((k) => {
      const key = k.slice(0, -": wall".length);
      const cpu = `${key}: cpu`;
      return `${key} ${f(median(figures[k]!), 1)} µs a call, ${f(median(figures[cpu]!), 1)} µs CPU${
        ratios[k] ? ` (${f(median(ratios[k]!), 2)}× and ${f(median(ratios[cpu]!), 2)}× the baseline's)` : ""
      }`;
    })
    .join("; ")}`;
}

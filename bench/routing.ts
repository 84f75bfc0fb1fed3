// bench/routing.ts: what filters and transforms cost, each against its baseline in the same run.
// Receiving: the handler (lib/receiver.ts) over a real SQLite inbox, its fsync off the event loop as the
// receiver's, takes BENCH_ROUTING_N (4000) signed Standard Webhooks deliveries at BENCH_CONNECTIONS (32) at
// once, through routes with `types` alone, then through the same routes each with a filter on the body and
// a header (target: ≥ 0.90× the rate with types alone); beside it, what routeTo() alone costs per delivery.
// Forwarding: BENCH_ROUTING_N deliveries forwarded to a bare node:http destination (bench/bare.ts) with no
// transform, then with a transform that reshapes the JSON, run in the sandbox as every module is by default
// (lib/forwarding/sandbox.ts); the CPU per forward counts the sandbox's threads, in this process.
// Each of BENCH_ROUNDS (3) rounds measures both sides in BENCH_ROUTING_SLICES (4) turns each, alternating,
// after a warm-up; ratios are taken within a round and the median printed.
//   npm run bench -- routing          BENCH_ROUTING_N=2000 BENCH_ROUNDS=1 npm run bench -- routing

import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { connect } from "../inbox.ts";
import { filterInput } from "../lib/routing/filter.ts";
import { forward } from "../lib/forwarding/forwarder.ts";
import { createWebhooks } from "../lib/receiver.ts";
import { loadSources, sign } from "../lib/config/sources.ts";
import { loadDestinations, routeTo, type Route } from "../lib/routing/routes.ts";
import type { Inbox } from "../lib/store.ts";
import { Transforms } from "../lib/forwarding/transform.ts";
import { CONNECTIONS, f, knob, startChild, tempDir, transformCpuMs } from "./common.ts";

const N = knob("BENCH_ROUTING_N", 4_000);
const ROUNDS = knob("BENCH_ROUNDS", 3);
// Turns each side takes within a round (see below).
const SLICES = knob("BENCH_ROUTING_SLICES", 4);
const SECRET = `whsec_${Buffer.from("bench routing source secret").toString("base64")}`;
const APP_SECRET = `whsec_${Buffer.from("bench routing app secret").toString("base64")}`;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
// This process's CPU and its transforms' processes' (lib/forwarding/transform-child.ts).
const ownCpuMs = () => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000 + transformCpuMs();
};

// A filter of the kind people write: a value in the body, a comparison, a prefix, and a header.
const FILTER = {
  body: { type: { $startsWith: "payment." }, amount: { $gt: 0 }, customer: { $exist: true } },
  headers: { "content-type": { $startsWith: "application/json" } },
};

// config is the sources file: four routes from one source, with types alone or each with a filter too.
function config(filtered: boolean): Record<string, unknown> {
  const route = (to: string) => ({ to, types: ["payment.*"], ...(filtered ? { filter: FILTER } : {}) });
  const app = (name: string) => ({ url: `http://127.0.0.1:1/${name}`, secret: APP_SECRET });
  return {
    $destinations: { billing: app("billing"), ledger: app("ledger"), crm: app("crm") },
    shop: {
      provider: "standard",
      secret: SECRET,
      routes: [route("handler"), route("billing"), route("ledger"), route("crm")],
    },
  };
}

const bodyOf = (i: number) =>
  JSON.stringify({
    type: "payment.succeeded",
    customer: `c${i % 1000}`,
    amount: (i % 100) + 1,
    currency: "eur",
    note: "x".repeat(200),
  });

// receive pushes n signed deliveries through one handler, CONNECTIONS at a time; its rate and CPU per delivery.
async function receive(
  handler: ReturnType<typeof createWebhooks>,
  prefix: string,
  n: number,
): Promise<{ rate: number; cpuUs: number }> {
  const ts = Math.floor(Date.now() / 1000);
  const requests = Array.from({ length: n }, (_, i) => {
    const body = bodyOf(i);
    return new Request("http://bench.local/shop", {
      method: "POST",
      body,
      headers: {
        ...sign("standard", SECRET, { id: `${prefix}-${i}`, body, timestampS: ts }),
        "content-type": "application/json",
      },
    });
  });
  let next = 0;
  const cpu0 = ownCpuMs();
  const started = performance.now();
  await Promise.all(
    Array.from({ length: CONNECTIONS }, async () => {
      while (next < requests.length) {
        const res = await handler.fetch(requests[next++]!);
        if (res.status !== 200) throw new Error(`routing bench: ${res.status} ${await res.text()}`);
      }
    }),
  );
  const ms = performance.now() - started;
  return { rate: n / (ms / 1000), cpuUs: ((ownCpuMs() - cpu0) * 1000) / n };
}

// decide is routeTo() alone, n times, as the handler calls it (a fresh lazy input, so each body is parsed).
function decide(routes: readonly Route[], n: number): number {
  const body = Buffer.from(bodyOf(1));
  const headers = { "content-type": ["application/json"], "webhook-id": ["x"] };
  const started = performance.now();
  let chosen = 0;
  for (let i = 0; i < n; i++) {
    const filtered = routes.some((r) => r.filter);
    chosen += routeTo(
      routes,
      "payment.succeeded",
      filtered
        ? filterInput({ source: "shop", eventType: "payment.succeeded", body, headers, url: "/shop" })
        : undefined,
    ).length;
  }
  if (chosen !== 4 * n) throw new Error(`routing bench: expected every route chosen, got ${chosen} of ${4 * n}`);
  return ((performance.now() - started) * 1000) / n;
}

// SHAPE is the transform forwarded through: the payment in the app's own JSON, as a Shopify recipe would.
const SHAPE = `export default (d: { json: { type: string; customer: string; amount: number; currency: string } }) => ({
  body: { kind: d.json.type, customerId: d.json.customer, cents: d.json.amount * 100, currency: d.json.currency.toUpperCase() },
  headers: { "x-shape": "1" },
});`;

async function forwardRun(
  path: string,
  sinkUrl: string,
  transform: boolean,
  transforms: Transforms,
  n: number,
): Promise<{ rate: number; cpuUs: number }> {
  const inbox: Inbox = await connect(path);
  try {
    for (let i = 0; i < n; i += 500) {
      await Promise.all(
        Array.from({ length: Math.min(500, n - i) }, (_, j) =>
          inbox.store({
            source: "shop",
            id: `f${i + j}`,
            body: Buffer.from(bodyOf(i + j)),
            contentType: "application/json",
            eventType: "payment.succeeded",
            destinations: ["app"],
          }),
        ),
      );
    }
    const cfg = { $destinations: { app: { url: sinkUrl, secret: APP_SECRET, maxInFlight: CONNECTIONS } } };
    const routes = new Map([
      [
        "shop",
        [
          {
            to: "app",
            permanent4xx: false,
            forwardHeaders: false,
            ...(transform ? { transform: { module: "./shape.ts", timeoutMs: 1000 } } : {}),
          },
        ] as Route[],
      ],
    ]);
    const cpu0 = ownCpuMs();
    const started = performance.now();
    const stats = await forward({
      inbox,
      forwarding: loadDestinations(cfg, {}),
      routes,
      transforms,
      once: true,
      log: () => {},
    });
    const ms = performance.now() - started;
    if (stats.done !== n) throw new Error(`routing bench: forwarded ${stats.done} of ${n}`);
    return { rate: n / (ms / 1000), cpuUs: ((ownCpuMs() - cpu0) * 1000) / n };
  } finally {
    await inbox.close();
  }
}

/** routing runs the benchmark and returns its summary line. */
export async function routing(): Promise<string> {
  const dir = tempDir();
  const sink = await startChild("bench/bare.ts", []);
  try {
    writeFileSync(join(dir.dir, "shape.ts"), SHAPE);
    // The transform's process is started and its module loaded once, as a running worker has it, not in each run.
    const transforms = new Transforms(dir.dir);
    console.log(`routing: ${N} deliveries a run, ${CONNECTIONS} at once, ${ROUNDS} rounds after a warm-up`);
    const inboxes = {
      types: await connect(join(dir.dir, "types.db"), { syncOffLoop: true }),
      filter: await connect(join(dir.dir, "filter.db"), { syncOffLoop: true }),
    };
    const handlers = {
      types: createWebhooks({ inbox: inboxes.types, sources: loadSources(config(false), {}), log: () => {} }),
      filter: createWebhooks({ inbox: inboxes.filter, sources: loadSources(config(true), {}), log: () => {} }),
    };
    const routesOf = (filtered: boolean) => loadSources(config(filtered), {}).get("shop")!.routes!;
    const receiveRatios: number[] = [];
    const forwardRatios: number[] = [];
    const extraCpu: number[] = [];
    const rows: string[] = [];
    try {
      await receive(handlers.types, "warm-t", Math.min(N, 1000));
      await receive(handlers.filter, "warm-f", Math.min(N, 1000));
      await forwardRun(join(dir.dir, "warm.db"), sink.url, true, transforms, Math.min(N, 1000));
      // A shared machine's load drifts within seconds: each round takes both sides in SLICES turns, one after
      // the other, and adds up each side's time and CPU, so the drift lands on both alike.
      const sum = (runs: { rate: number; cpuUs: number }[], n: number) => {
        const ms = runs.reduce((t, r) => t + (n / r.rate) * 1000, 0);
        return { rate: (n * runs.length) / (ms / 1000), cpuUs: runs.reduce((t, r) => t + r.cpuUs, 0) / runs.length };
      };
      const slice = Math.max(1, Math.floor(N / SLICES));
      for (let round = 1; round <= ROUNDS; round++) {
        const [t, fl, p, sh]: { rate: number; cpuUs: number }[][] = [[], [], [], []];
        // In turns A B B A …, so that neither side always goes first.
        for (let i = 0; i < SLICES; i++) {
          for (const side of i % 2 === 0 ? (["types", "filter"] as const) : (["filter", "types"] as const)) {
            (side === "types" ? t : fl).push(await receive(handlers[side], `${side}${round}-${i}`, slice));
          }
        }
        const types = sum(t, slice);
        const filter = sum(fl, slice);
        receiveRatios.push(filter.rate / types.rate);
        const decideTypes = decide(routesOf(false), 20_000);
        const decideFilter = decide(routesOf(true), 20_000);
        for (let i = 0; i < SLICES; i++) {
          for (const shape of i % 2 === 0 ? [false, true] : [true, false]) {
            (shape ? sh : p).push(
              await forwardRun(
                join(dir.dir, `${shape ? "shaped" : "plain"}-${round}-${i}.db`),
                sink.url,
                shape,
                transforms,
                slice,
              ),
            );
          }
        }
        const plain = sum(p, slice);
        const shaped = sum(sh, slice);
        forwardRatios.push(shaped.rate / plain.rate);
        extraCpu.push(shaped.cpuUs - plain.cpuUs);
        rows.push(
          `  round ${round}: receiving, types alone ${f(types.rate)}/s (${f(types.cpuUs)} µs CPU each), a filter on every route ${f(filter.rate)}/s (${f(filter.cpuUs)} µs) = ${f(filter.rate / types.rate, 2)}×;` +
            ` routeTo() alone ${f(decideTypes, 1)} µs vs ${f(decideFilter, 1)} µs per delivery`,
          `           forwarding, no transform ${f(plain.rate)}/s (${f(plain.cpuUs)} µs CPU each), with a transform ${f(shaped.rate)}/s (${f(shaped.cpuUs)} µs, its sandbox threads' included) = ${f(shaped.rate / plain.rate, 2)}×`,
        );
        console.log(rows.slice(-2).join("\n"));
      }
    } finally {
      await inboxes.types.close();
      await inboxes.filter.close();
      await transforms.close();
    }
    return (
      `routing: receiving with a filter on every route ${f(median(receiveRatios), 2)}× the rate with types alone (target ≥ 0.90); ` +
      `forwarding with a transform ${f(median(forwardRatios), 2)}× the rate without, ${f(median(extraCpu))} µs more CPU per forward (medians of ${ROUNDS})`
    );
  } finally {
    sink.child.kill();
    dir.cleanup();
  }
}

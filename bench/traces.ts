// bench/traces.ts: what tracing costs the receive path, with no OpenTelemetry SDK and with one, in one run.
// Each configuration runs in a child process of its own (a registered SDK cannot be taken back), alternated
// none, SDK, none, SDK, each BENCH_SECONDS with BENCH_TRACE_CONCURRENCY requests in flight through the
// receiver's handler (handler.answer, no HTTP): on a SQLite file on the real disk (the path as a request
// meets it), and on a store in memory (the handler's CPU alone, where a cost would show most). Each child
// also times the tracing calls alone (startReceive and end), per request.
//   npm run bench -- traces          BENCH_SECONDS=8 BENCH_TRACE_CONCURRENCY=32

import { execFileSync, spawn } from "node:child_process";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { createWebhooks, type WebhookRequest } from "../lib/receiver.ts";
import { SqliteInbox } from "../lib/sqlite/sqlite.ts";
import type { Incoming, Stored } from "../lib/store.ts";
import { startReceive } from "../lib/traces.ts";
import { f, knob, ROOT, tempDir } from "./common.ts";

const SECONDS = knob("BENCH_SECONDS", 8);
const CONCURRENCY = knob("BENCH_TRACE_CONCURRENCY", 32);
const CALLS = 200_000;

type Sdk = "none" | "sdk";
type Store = "sqlite" | "memory";
interface Result {
  rate: number;
  callNs: number;
}

// child measures one configuration in this process and prints its Result as JSON.
async function child(sdk: Sdk, store: Store): Promise<void> {
  if (sdk === "sdk") {
    // An SDK as an app would run one in production: batched export, here to an exporter that drops the spans.
    const { propagation, trace } = await import("@opentelemetry/api");
    const { ExportResultCode, W3CTraceContextPropagator } = await import("@opentelemetry/core");
    const { BatchSpanProcessor, TracerProvider } = await import("@opentelemetry/sdk-trace");
    const exporter = {
      export: (_: unknown, done: (r: { code: number }) => void) => done({ code: ExportResultCode.SUCCESS }),
      shutdown: async () => {},
    };
    trace.setGlobalTracerProvider(new TracerProvider({ spanProcessors: [new BatchSpanProcessor({ exporter })] }));
    propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  }
  const { dir, cleanup } = tempDir();
  const inbox =
    store === "sqlite"
      ? new SqliteInbox(join(dir, "traces.db"))
      : { store: async (_: Incoming): Promise<Stored> => "stored" };
  const handler = createWebhooks({ inbox, log: () => {} });
  const body = Buffer.from(JSON.stringify({ type: "payment.succeeded", customer: "c1", amount: 42 }));
  const request = (i: number): WebhookRequest => ({
    method: "POST",
    url: "/",
    read: async () => body,
    headers: {
      "content-type": ["application/json"],
      "x-delivery-id": [`d${i}`],
      traceparent: [`00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01`],
    },
  });
  let next = 0;
  let done = 0;
  const until = performance.now() + SECONDS * 1000;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (performance.now() < until) {
        const a = await handler.answer(request(next++));
        if (a.status !== 200) throw new Error(`answered ${a.status}: ${a.body}`);
        done++;
      }
    }),
  );
  const rate = (done / (performance.now() - t0)) * 1000;
  const headers = request(0).headers;
  const c0 = performance.now();
  for (let i = 0; i < CALLS; i++)
    startReceive(headers).end({ status: 200, source: "default", id: "d", result: "stored" });
  const callNs = ((performance.now() - c0) * 1e6) / CALLS;
  if ("close" in inbox) await inbox.close();
  cleanup();
  console.log(JSON.stringify({ rate, callNs } satisfies Result));
}

function measure(sdk: Sdk, store: Store): Promise<Result> {
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, ["--import", "tsx", join(ROOT, "bench/traces.ts"), "--child", sdk, store], {
      cwd: ROOT,
      stdio: ["ignore", "pipe", "inherit"],
    });
    let out = "";
    p.stdout.on("data", (d: Buffer) => (out += d));
    p.on("exit", (code) =>
      code === 0
        ? resolve(JSON.parse(out.trim().split("\n").at(-1)!) as Result)
        : reject(new Error(`bench/traces.ts child exited with ${code}`)),
    );
  });
}

/** traces alternates the configurations, prints each, and returns the summary line. */
export async function traces(): Promise<string> {
  let load = "";
  try {
    load = execFileSync("uptime", { encoding: "utf8" })
      .trim()
      .replace(/.*load average/, "load average");
  } catch {
    // uptime is only context for the reader.
  }
  console.log(
    `traces: the receive path through handler.answer(), ${CONCURRENCY} in flight, ${SECONDS} s per run, no SDK and SDK alternated; ${load}`,
  );
  const summary: string[] = [];
  for (const store of ["memory", "sqlite"] as const) {
    const runs: Record<Sdk, Result[]> = { none: [], sdk: [] };
    for (const sdk of ["none", "sdk", "none", "sdk"] as const) runs[sdk].push(await measure(sdk, store));
    const mean = (rs: Result[], k: keyof Result) => rs.reduce((n, r) => n + r[k], 0) / rs.length;
    const [none, sdk] = [mean(runs.none, "rate"), mean(runs.sdk, "rate")];
    const label = store === "memory" ? "store in memory (CPU alone)" : "SQLite on disk";
    console.log(
      `  ${label.padEnd(28)} no SDK ${runs.none.map((r) => f(r.rate)).join(" / ")} req/s, SDK ${runs.sdk.map((r) => f(r.rate)).join(" / ")} req/s: ` +
        `SDK at ${f(sdk / none, 2)}x; the tracing calls alone ${f(mean(runs.none, "callNs"), 0)} ns per request without an SDK, ${f(mean(runs.sdk, "callNs"), 0)} ns with one ` +
        `(${f((mean(runs.none, "callNs") / 1e9) * none * 100, 2)}% of a request's time without)`,
    );
    summary.push(
      `${store === "memory" ? "in memory" : "SQLite"}: no SDK ${f(none)} req/s, SDK ${f(sdk / none, 2)}x, the API without SDK ${f(mean(runs.none, "callNs"), 0)} ns/request`,
    );
  }
  return `traces: ${summary.join("; ")}`;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href && process.argv[2] === "--child") {
  await child(process.argv[3] as Sdk, process.argv[4] as Store);
}

// bench/latency.ts: the ack's latency at half the saturated rate, open loop. Finds the receiver's
// saturated rate (closed loop, BENCH_CONNECTIONS), then sends at half that rate on a fixed schedule
// whatever the answers do, timing each request from when it was due (so a stall is not hidden), first
// to the bare node:http baseline, then to the receiver. Prints p50/p99/p99.9/max of each.
//   npm run bench -- latency          BENCH_SECONDS=8 BENCH_RATE=<req/s, skips the search>

import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { Pool } from "undici";
import { BODY, CONNECTIONS, SECONDS, WARMUP_SECONDS, f, hammer, knob, startChild, tempDir } from "./common.ts";

/** Paced is what one open-loop run measured, in ms from when each request was due. */
export interface Paced {
  rate: number;
  sent: number;
  ok: number;
  p50: number;
  p99: number;
  p999: number;
  max: number;
}

function percentile(sorted: Float64Array, p: number): number {
  return sorted.length === 0 ? NaN : sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))]!;
}

/** paced sends `rate` POSTs a second for `seconds` on a fixed schedule (open loop), unique IDs. */
export async function paced(url: string, rate: number, seconds: number): Promise<Paced> {
  // Enough connections that a slow answer never holds back the schedule; undici queues the rest.
  const pool = new Pool(url, { connections: knob("BENCH_POOL", 256), pipelining: 1 });
  const total = Math.round(rate * seconds);
  const latencies = new Float64Array(total);
  const prefix = `lat${process.pid}-${Date.now()}-`;
  let sent = 0;
  let answered = 0;
  let ok = 0;
  const start = performance.now();
  await new Promise<void>((resolve) => {
    const send = (i: number, due: number) => {
      pool.request({
        path: "/", method: "POST", body: BODY,
        headers: { "content-type": "application/json", "x-delivery-id": prefix + i },
      }).then(
        async (res) => {
          await res.body.dump();
          latencies[i] = performance.now() - due;
          if (res.statusCode === 200) ok++;
        },
        () => (latencies[i] = performance.now() - due),
      ).finally(() => {
        if (++answered === total) resolve();
      });
    };
    const tick = () => {
      // Send whatever is due by now (request i is due at i / rate), each timed from its own due moment.
      const due = Math.min(total, Math.floor(((performance.now() - start) / 1000) * rate) + 1);
      while (sent < due) {
        send(sent, start + (sent * 1000) / rate);
        sent++;
      }
      if (sent < total) setTimeout(tick, 1);
    };
    tick();
  });
  await pool.close();
  latencies.sort();
  return {
    rate, sent, ok,
    p50: percentile(latencies, 0.5), p99: percentile(latencies, 0.99), p999: percentile(latencies, 0.999),
    max: latencies[latencies.length - 1] ?? NaN,
  };
}

function show(label: string, p: Paced): void {
  console.log(`  ${label.padEnd(22)} ${f(p.rate)} req/s open loop: p50 ${f(p.p50, 2)} ms  p99 ${f(p.p99, 2)} ms  p99.9 ${f(p.p999, 2)} ms  max ${f(p.max, 1)} ms  (${p.ok}/${p.sent} answered 200)`);
}

/** latency runs the search and both paced runs and returns the one-line summary. */
export async function latency(): Promise<string> {
  const { dir, cleanup } = tempDir();
  try {
    const receiver = await startChild("receiver.ts", ["--port", "0", "--db", join(dir, "latency.db"), "--quiet"]);
    let saturated = knob("BENCH_RATE", 0) * 2;
    if (!saturated) {
      await hammer(receiver.url, { seconds: WARMUP_SECONDS });
      saturated = (await hammer(receiver.url, { seconds: SECONDS })).rps;
      console.log(`latency: receiver saturates at ${f(saturated)} req/s (closed loop, ${CONNECTIONS} connections); pacing at half`);
    }
    const rate = Math.round(saturated / 2);
    const mine = await paced(receiver.url, rate, SECONDS);
    const rss = receiver.peakRssMb();
    await receiver.stop();
    const bare = await startChild("bench/bare.ts", []);
    await paced(bare.url, rate, Math.min(2, SECONDS));
    const base = await paced(bare.url, rate, SECONDS);
    await bare.stop();
    show("bare node:http", base);
    show("receiver (durable)", mine);
    return `latency: ${f(rate)} req/s open loop (half of ${f(saturated)}) | receiver ack p50 ${f(mine.p50, 2)} p99 ${f(mine.p99, 2)} p99.9 ${f(mine.p999, 2)} ms` +
      ` | bare p50 ${f(base.p50, 2)} p99 ${f(base.p99, 2)} ms | p99 receiver/bare ×${f(mine.p99 / base.p99, 1)} | ${mine.ok}/${mine.sent} stored | receiver peak RSS ${f(rss)} MB`;
  } finally {
    cleanup();
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) console.log(await latency());

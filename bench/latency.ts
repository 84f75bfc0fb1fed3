// bench/latency.ts: the ack's latency at half the saturated rate, open loop. Finds the receiver's
// saturated rate (closed loop with wrk, BENCH_CONNECTIONS), then sends at half that rate on a fixed schedule
// whatever the answers do, timing each request from when it was due (so a stall is not hidden), first
// to the receiver, to the receiver with --inline-checkpoints, with --sync-in-commit (its fsync inside each
// commit, on the HTTP thread), then to the bare node:http baseline.
// Prints p50/p99/p99.9/max of each, and the pacer's own CPU per request (wrk cannot pace: it is
// closed-loop only, so the open-loop sender is the raw-socket one below).
//   npm run bench -- latency          BENCH_SECONDS=8 BENCH_RATE=<req/s, skips the search>

import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { connect, type Socket } from "node:net";
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
  /** CPU this process spent sending and timing, per request, in µs. */
  generatorUs: number;
  /** Every request's latency, sorted, for a percentile over several runs together. */
  latencies: Float64Array;
  /** Every request's latency in the order they were due: request i was due at start + i * 1000 / rate. */
  inOrder: Float64Array;
  /** When the first request was due, on performance.now()'s clock. */
  start: number;
}

const BODY_BYTES = Buffer.byteLength(BODY);

function percentile(sorted: Float64Array, p: number): number {
  return sorted.length === 0 ? NaN : sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))]!;
}

/**
 * paced sends `rate` POSTs a second for `seconds` on a fixed schedule (open loop), unique IDs. It speaks
 * HTTP/1.1 on raw keep-alive sockets: a general client (undici) costs several times the CPU per request,
 * and on 2 cores that CPU is taken from the server being measured. A request due while every connection
 * is busy waits its turn, and that wait counts in its latency. With `stop`, it sends until that settles (or
 * `seconds` have passed), and ends once every request sent is answered.
 */
export async function paced(url: string, rate: number, seconds: number, stop?: Promise<unknown>): Promise<Paced> {
  const { hostname, port } = new URL(url);
  let total = Math.round(rate * seconds);
  const latencies = new Float64Array(total);
  const prefix = `lat${process.pid}-${Date.now()}-`;
  const waiting: number[] = [];
  let sent = 0;
  let answered = 0;
  let ok = 0;
  let start = 0;
  let finished!: () => void;
  const done = new Promise<void>((resolve) => (finished = resolve));

  interface Conn {
    socket: Socket;
    request: number;
    data: string;
  }
  const idle: Conn[] = [];
  const open = () =>
    new Promise<Conn>((resolve, reject) => {
      const socket = connect(Number(port), hostname, () => resolve(conn));
      socket.setNoDelay(true);
      socket.setEncoding("latin1");
      const conn: Conn = { socket, request: -1, data: "" };
      socket.on("data", (d: string) => {
        conn.data += d;
        answer(conn);
      });
      socket.on("error", reject);
      // A connection the server closed (say, idle past its keep-alive timeout) fails the request it
      // carried, if any, and is replaced.
      socket.on("close", () => {
        if (answered === total) return;
        if (conn.request >= 0) settle(conn.request, false);
        const at = idle.indexOf(conn);
        if (at >= 0) idle.splice(at, 1);
        void open().then(ready, () => {});
      });
    });
  const send = (conn: Conn, i: number) => {
    conn.request = i;
    conn.socket.write(
      `POST / HTTP/1.1\r\nHost: ${hostname}\r\nContent-Type: application/json\r\nX-Delivery-Id: ${prefix}${i}\r\nContent-Length: ${BODY_BYTES}\r\n\r\n${BODY}`,
    );
  };
  const settle = (i: number, good: boolean) => {
    latencies[i] = performance.now() - (start + (i * 1000) / rate);
    if (good) ok++;
    if (++answered === total) finished();
  };
  const ready = (conn: Conn) => {
    conn.request = -1;
    const next = waiting.shift();
    if (next === undefined) idle.push(conn);
    else send(conn, next);
  };
  const answer = (conn: Conn) => {
    const head = conn.data.indexOf("\r\n\r\n");
    if (head < 0) return;
    const length = Number(/content-length: *(\d+)/i.exec(conn.data.slice(0, head))?.[1] ?? 0);
    if (conn.data.length < head + 4 + length) return;
    const good = conn.data.startsWith("HTTP/1.1 200");
    conn.data = conn.data.slice(head + 4 + length);
    settle(conn.request, good);
    if (answered < total) ready(conn);
  };
  const conns = await Promise.all(Array.from({ length: knob("BENCH_POOL", 64) }, open));
  idle.push(...conns);
  const cpu0 = process.cpuUsage();
  start = performance.now();
  const tick = () => {
    // Send whatever is due by now (request i is due at i / rate).
    const due = Math.min(total, Math.floor(((performance.now() - start) / 1000) * rate) + 1);
    for (; sent < due; sent++) {
      // The longest idle first, so that none idles long enough to be closed.
      const conn = idle.shift();
      if (conn) send(conn, sent);
      else waiting.push(sent);
    }
    if (sent < total) setTimeout(tick, 1);
  };
  tick();
  const end = () => {
    total = sent;
    if (answered === total) finished();
  };
  stop?.then(end, end);
  await done;
  const cpu = process.cpuUsage(cpu0);
  for (const conn of idle) conn.socket.destroy();
  for (const conn of conns) conn.socket.destroy();
  const inOrder = latencies.slice(0, total);
  const sorted = inOrder.slice().sort();
  return {
    rate,
    sent,
    ok,
    p50: percentile(sorted, 0.5),
    p99: percentile(sorted, 0.99),
    p999: percentile(sorted, 0.999),
    max: sorted[sorted.length - 1] ?? NaN,
    generatorUs: (cpu.user + cpu.system) / Math.max(1, total),
    latencies: sorted,
    inOrder,
    start,
  };
}

function show(label: string, p: Paced): void {
  console.log(
    `  ${label.padEnd(22)} ${f(p.rate)} req/s open loop: p50 ${f(p.p50, 2)} ms  p99 ${f(p.p99, 2)} ms  p99.9 ${f(p.p999, 2)} ms  max ${f(p.max, 1)} ms  (${p.ok}/${p.sent} answered 200, pacer ${f(p.generatorUs)} µs CPU/req)`,
  );
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
      console.log(
        `latency: receiver saturates at ${f(saturated)} req/s (closed loop, ${CONNECTIONS} connections); pacing at half`,
      );
    }
    const rate = Math.round(saturated / 2);
    const mine = await paced(receiver.url, rate, SECONDS);
    const rss = receiver.peakRssMb();
    await receiver.stop();
    // The same receiver with SQLite's own checkpoints, inside commits: what the checkpoint thread saves.
    const inline = await startChild("receiver.ts", [
      "--port",
      "0",
      "--db",
      join(dir, "inline.db"),
      "--quiet",
      "--inline-checkpoints",
    ]);
    const theirs = await paced(inline.url, rate, SECONDS);
    await inline.stop();
    // The same receiver with the fsync inside each commit, on the HTTP thread: what the off-loop fdatasync changes.
    const inCommit = await startChild("receiver.ts", [
      "--port",
      "0",
      "--db",
      join(dir, "in-commit.db"),
      "--quiet",
      "--sync-in-commit",
    ]);
    const blocking = await paced(inCommit.url, rate, SECONDS);
    await inCommit.stop();
    const bare = await startChild("bench/bare.ts", []);
    await paced(bare.url, rate, Math.min(2, SECONDS));
    const base = await paced(bare.url, rate, SECONDS);
    await bare.stop();
    show("bare node:http", base);
    show("receiver (durable)", mine);
    show("… inline checkpoints", theirs);
    show("… --sync-in-commit", blocking);
    return (
      `latency: ${f(rate)} req/s open loop (half of ${f(saturated)}) | receiver ack p50 ${f(mine.p50, 2)} p99 ${f(mine.p99, 2)} p99.9 ${f(mine.p999, 2)} ms` +
      ` | bare p50 ${f(base.p50, 2)} p99 ${f(base.p99, 2)} ms | p99 receiver/bare ×${f(mine.p99 / base.p99, 1)} | inline checkpoints p99 ${f(theirs.p99, 2)} ms | --sync-in-commit p99 ${f(blocking.p99, 2)} ms | ${mine.ok}/${mine.sent} stored | receiver peak RSS ${f(rss)} MB | pacer ${f(mine.generatorUs)} µs CPU/req`
    );
  } finally {
    cleanup();
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) console.log(await latency());

// bench/slow.ts: the receiver's memory, and a real delivery's latency, with 10,000 sockets stalled on it
// (issue 31). Half stop mid-headers, half after the headers and 10 bytes of a 1,000-byte body, spread over
// 40 loopback addresses (127.0.0.2–41, 250 each, under the default --max-connections-per-ip). First with
// limits too long to close any, so the memory is theirs to hold; then with the defaults, timing how long
// until the limits have closed every one. The baseline is the same receiver before the stall, in the same
// run. The stalled sockets never read, as an attacker's need not: what the receiver holds is counted from its
// side, in its open file descriptors. The receiver's child raises its own `ulimit -n` for the 10,000.
//   npm run bench -- slow          BENCH_STALLED=10000 BENCH_DELIVERIES=200

import { spawn } from "node:child_process";
import { readdirSync, readlinkSync } from "node:fs";
import { join } from "node:path";
import { connect, type Socket } from "node:net";
import { createInterface } from "node:readline";
import { DEFAULTS } from "../lib/defaults.ts";
import { ROOT, f, knob, rssMb, tempDir } from "./common.ts";

const STALLED = knob("BENCH_STALLED", 10_000);
const DELIVERIES = knob("BENCH_DELIVERIES", 200);
const PER_ADDRESS = 250;

interface Receiver {
  pid: number;
  port: number;
  stop(): Promise<void>;
}

// start runs receiver.ts in a shell that first raises its open-file limit (a hard limit under 20,000
// cannot be raised by an unprivileged user; then the run says so when the sockets fail).
async function start(db: string, args: string[]): Promise<Receiver> {
  const child = spawn(
    "sh",
    [
      "-c",
      'ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"; exec "$0" "$@"',
      process.execPath,
      "--import",
      "tsx",
      join(ROOT, "receiver.ts"),
      "--port",
      "0",
      "--db",
      db,
      "--quiet",
      ...args,
    ],
    { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] },
  );
  let err = "";
  child.stderr!.on("data", (d: Buffer) => void (err.length < 4096 && (err += d)));
  const exited = new Promise<void>((resolve) => child.on("exit", () => resolve()));
  const port = await new Promise<number>((resolve, reject) => {
    createInterface({ input: child.stdout! }).on("line", (line) => {
      const match = /^Listening on http:\/\/[^:]+:(\d+)/.exec(line);
      if (match) resolve(Number(match[1]));
    });
    void exited.then(() => reject(new Error(`receiver exited before listening: ${err}`)));
  });
  return { pid: child.pid!, port, stop: async () => void (child.kill("SIGTERM"), await exited) };
}

// deliverAll sends n real deliveries one after another from 127.0.0.1, each on its own connection, and
// returns each one's latency in ms; any answer but 200 counts as a failure.
async function deliverAll(port: number, prefix: string, n: number): Promise<{ ms: number[]; failed: number }> {
  const ms: number[] = [];
  let failed = 0;
  for (let i = 0; i < n; i++) {
    const started = performance.now();
    const status = await new Promise<number>((resolve) => {
      const socket = connect({ port, host: "127.0.0.1", localAddress: "127.0.0.1" });
      const body = JSON.stringify({ customer: "Ann", amount: 5, n: i });
      let text = "";
      socket.on("data", (d: Buffer) => (text += d.toString("latin1")));
      socket.on("error", () => {});
      socket.on("close", () => resolve(Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1] ?? 0)));
      socket.write(
        `POST / HTTP/1.1\r\nHost: x\r\nX-Delivery-Id: ${prefix}-${i}\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n${body}`,
      );
    });
    ms.push(performance.now() - started);
    if (status !== 200) failed++;
  }
  return { ms, failed };
}

// fds counts a process's open sockets: its listener, its database's connection if any, and each stalled one.
const fds = (pid: number) =>
  readdirSync(`/proc/${pid}/fd`).filter((fd) => {
    try {
      return readlinkSync(`/proc/${pid}/fd/${fd}`).startsWith("socket:");
    } catch {
      return false; // closed while being read
    }
  }).length;

// stallAll opens the stalled sockets, 500 at a time, and resolves with them. None reads: a 408 or a close
// sits unread in its buffer, and only the receiver's side shows what it let go.
async function stallAll(port: number): Promise<Socket[]> {
  const sockets: Socket[] = [];
  for (let i = 0; i < STALLED; i += 500) {
    await Promise.all(
      Array.from({ length: Math.min(500, STALLED - i) }, (_, j) => {
        const n = i + j;
        const socket = connect({ port, host: "127.0.0.1", localAddress: `127.0.0.${2 + Math.floor(n / PER_ADDRESS)}` });
        socket.on("error", () => {});
        sockets.push(socket);
        return new Promise<void>((resolve) => {
          socket.once("close", () => resolve());
          socket.once("connect", () => {
            socket.write(
              n % 2 === 1
                ? `POST / HTTP/1.1\r\nHost: x\r\nX-Delivery-Id: stall-${n}\r\nContent-Length: 1000\r\n\r\n{"partial":`
                : `POST / HTTP/1.1\r\nHost: x\r\nX-Delivery-Id: stall-${n}\r\n`,
            );
            resolve();
          });
        });
      }),
    );
  }
  return sockets;
}

const pct = (ms: number[], p: number) =>
  [...ms].sort((a, b) => a - b)[Math.min(ms.length - 1, Math.floor(ms.length * p))]!;
const settle = () => new Promise((resolve) => setTimeout(resolve, 1_000));

/** slow runs both phases and returns the summary line. */
export async function slow(): Promise<string> {
  if (Math.ceil(STALLED / PER_ADDRESS) > 250)
    throw new TypeError(`BENCH_STALLED: at most ${250 * PER_ADDRESS}, got ${STALLED}`);
  const dir = tempDir();
  try {
    // Phase 1: limits of ten minutes, so every stalled socket is held while the memory is read.
    const held = await start(join(dir.dir, "held.db"), ["--headers-timeout", "600000", "--body-timeout", "600000"]);
    await deliverAll(held.port, "warm", DELIVERIES);
    await settle();
    const idleRss = rssMb(held.pid);
    const idleFds = fds(held.pid);
    const before = await deliverAll(held.port, "before", DELIVERIES);
    const stall = await stallAll(held.port);
    await settle();
    const stalledRss = rssMb(held.pid);
    const open = fds(held.pid) - idleFds;
    const during = await deliverAll(held.port, "during", DELIVERIES);
    for (const s of stall) s.destroy();
    await held.stop();
    const perSocketKb = ((stalledRss - idleRss) * 1024) / open;
    console.log(
      `slow: idle receiver ${f(idleRss)} MB; with ${open} of ${STALLED} sockets stalled and held ${f(stalledRss)} MB ` +
        `(×${f(stalledRss / idleRss, 2)}, ${f(perSocketKb, 1)} KB a socket)`,
    );
    console.log(
      `  real deliveries from 127.0.0.1: before p50 ${f(pct(before.ms, 0.5), 2)} p99 ${f(pct(before.ms, 0.99), 2)} ms; ` +
        `during the stall p50 ${f(pct(during.ms, 0.5), 2)} p99 ${f(pct(during.ms, 0.99), 2)} ms (p50 ×${f(pct(during.ms, 0.5) / pct(before.ms, 0.5), 2)}); ` +
        `not 200: ${before.failed} before, ${during.failed} during`,
    );

    // Phase 2: the defaults. The clock starts once every socket is open.
    const limited = await start(join(dir.dir, "limited.db"), []);
    await deliverAll(limited.port, "warm", 10);
    const baseFds = fds(limited.pid);
    const again = await stallAll(limited.port);
    const openedAt = performance.now();
    const peakRss = rssMb(limited.pid);
    const heldFds = fds(limited.pid) - baseFds;
    // Cleared once the receiver holds no more descriptors than before (a minute at most, then it says so).
    while (fds(limited.pid) > baseFds && performance.now() - openedAt < 60_000)
      await new Promise((resolve) => setTimeout(resolve, 100));
    const left = fds(limited.pid) - baseFds;
    const clearedS = (performance.now() - openedAt) / 1000;
    await settle();
    const afterRss = rssMb(limited.pid);
    for (const s of again) s.destroy();
    await limited.stop();
    console.log(
      `  defaults (headers ${DEFAULTS.headersTimeoutMs / 1000} s, body ${DEFAULTS.bodyTimeoutMs / 1000} s + ${DEFAULTS.minBodyRate} B/s): ` +
        `${heldFds} held, ${left > 0 ? `${left} STILL OPEN` : "every one closed"} by the receiver ${f(clearedS, 1)} s after the last opened; RSS ${f(peakRss)} MB with them, ${f(afterRss)} MB after`,
    );
    return (
      `slow: ${STALLED} stalled sockets: receiver RSS ${f(stalledRss)} MB vs ${f(idleRss)} MB idle (×${f(stalledRss / idleRss, 2)}, ${f(perSocketKb, 1)} KB each); ` +
      `real deliveries all 200: ${during.failed === 0 ? "yes" : "NO"}, p50 ×${f(pct(during.ms, 0.5) / pct(before.ms, 0.5), 2)}; ` +
      `${left > 0 ? `defaults left ${left} open after ${f(clearedS, 1)} s` : `defaults close them all in ${f(clearedS, 1)} s`}`
    );
  } finally {
    dir.cleanup();
  }
}

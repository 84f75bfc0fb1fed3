// bench/trust.ts: what the trust rule costs a forward (docs/security.md), against a forward's own cost measured
// in the same run. First forwards that succeed: BENCH_TRUST_BACKLOG (5k) deliveries forwarded from SQLite to a
// bare node:http destination on loopback (bench/bare.ts), by a destination held to the address rule (lib/reach.ts,
// loopback allowed: each connection checked through undici's connector and its lookup) and by the same
// destination unheld, alternating over BENCH_ROUNDS (3) rounds, so a busy machine's noise lands on both: the
// median ratios of their rates and of the worker's CPU per forward. Then each part on its own, timed in a loop
// against that CPU per forward: one address check (refusal(), as every connection runs it), and opening a sealed
// secret (Keyring.open(), AES-256-GCM), which a worker does once per secret when it takes a version up.
//   npm run bench -- trust          BENCH_TRUST_BACKLOG=2000 BENCH_ROUNDS=1 npm run bench -- trust

import { join } from "node:path";
import { connect } from "../inbox.ts";
import { forward } from "../lib/forwarding/forwarder.ts";
import { parseAllow, Reach } from "../lib/reach.ts";
import { loadDestinations, type HttpDestination } from "../lib/routing/routes.ts";
import { Keyring } from "../lib/secrets.ts";
import { f, knob, startChild, tempDir } from "./common.ts";

const BACKLOG = knob("BENCH_TRUST_BACKLOG", 5_000);
const ROUNDS = knob("BENCH_ROUNDS", 3);
const CONCURRENCY = 32;
const SECRET = `whsec_${Buffer.from("the bench's forwarding secret").toString("base64")}`;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const ownCpuMs = () => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
};

// drain forwards n fresh deliveries to one destination at url, held to reach when given, and returns the rate
// and this process's CPU per forward.
async function drain(path: string, url: string, n: number, reach?: Reach): Promise<{ rate: number; cpuUs: number }> {
  const loaded = loadDestinations({ $destinations: { d0: { url, secret: SECRET, maxInFlight: CONCURRENCY } } }, {});
  const d0 = loaded.destinations.get("d0") as HttpDestination;
  const forwarding = { destinations: new Map([["d0", reach ? { ...d0, reach } : d0]]) };
  const inbox = await connect(path, { syncOffLoop: true });
  try {
    for (let start = 0; start < n; start += 1_000) {
      await Promise.all(
        Array.from({ length: Math.min(1_000, n - start) }, (_, k) =>
          inbox.store({
            id: `tr_${start + k}`,
            body: Buffer.from(JSON.stringify({ type: "payment.succeeded", n: start + k })),
            destinations: ["d0"],
          }),
        ),
      );
    }
    const cpu0 = ownCpuMs();
    const started = performance.now();
    const done = (await forward({ inbox, forwarding, once: true, log: () => {} })).done;
    const ms = performance.now() - started;
    if (done !== n) throw new Error(`trust: expected ${n} done, got ${done}`);
    return { rate: (n / ms) * 1000, cpuUs: ((ownCpuMs() - cpu0) * 1000) / n };
  } finally {
    await inbox.close();
  }
}

// time runs fn in a loop after a warm-up and returns its µs per call.
function time(fn: () => unknown): number {
  for (let i = 0; i < 2_000; i++) fn();
  const n = 50_000;
  const started = performance.now();
  for (let i = 0; i < n; i++) fn();
  return ((performance.now() - started) * 1000) / n;
}

/** trust runs both parts and returns the summary line. */
export async function trust(): Promise<string> {
  const sink = await startChild("bench/bare.ts", []);
  const { dir, cleanup } = tempDir();
  const reach = new Reach({ allow: parseAllow("127.0.0.1/32"), ownPorts: [8000, 8001] });
  try {
    console.log(
      `trust: ${BACKLOG} forwards that succeed, held to the address rule against unheld, ${ROUNDS} rounds after a warm-up (a shared machine: read the ratios)`,
    );
    await drain(join(dir, "warm.db"), sink.url, Math.min(BACKLOG, 1_000), reach);
    const rates: number[] = [];
    const cpus: number[] = [];
    const bareCpus: number[] = [];
    for (let round = 1; round <= ROUNDS; round++) {
      // Each round runs both, in turns that alternate, each on a fresh file.
      const order = round % 2 === 1 ? [true, false] : [false, true];
      const runs = new Map<boolean, { rate: number; cpuUs: number }>();
      for (const held of order)
        runs.set(held, await drain(join(dir, `r${round}-${held}.db`), sink.url, BACKLOG, held ? reach : undefined));
      const [held, bare] = [runs.get(true)!, runs.get(false)!];
      rates.push(held.rate / bare.rate);
      cpus.push(held.cpuUs / bare.cpuUs);
      bareCpus.push(bare.cpuUs);
      console.log(
        `  round ${round}: held ${f(held.rate)}/s, ${f(held.cpuUs)} µs a forward; unheld ${f(bare.rate)}/s, ${f(bare.cpuUs)} µs; rate ×${(held.rate / bare.rate).toFixed(2)}`,
      );
    }

    const forwardUs = median(bareCpus);
    // Each part alone: an address check as a connection runs it (allowed, and refused: its range named), and a
    // URL's at apply; opening one sealed secret, as a worker does for each the version it takes up names.
    const port = Number(new URL(sink.url).port);
    const allowed = time(() => reach.refusal("127.0.0.1", port));
    const refused = time(() => reach.refusal("169.254.169.254", 80));
    const publicAddress = time(() => reach.refusal("93.184.216.34", 443));
    const ring = new Keyring([Buffer.alloc(32, 1)]);
    const sealed = ring.seal("app_signing", SECRET);
    const open = time(() => ring.open("app_signing", sealed));
    console.log(
      `  one address check: ${allowed.toFixed(2)} µs allowed by the operator, ${refused.toFixed(2)} µs refused, ${publicAddress.toFixed(2)} µs public; a forward's own CPU ${f(forwardUs)} µs (×${(allowed / forwardUs).toFixed(4)})`,
    );
    console.log(
      `  opening one sealed secret: ${open.toFixed(2)} µs (×${(open / forwardUs).toFixed(4)} of a forward), once per secret per version taken up, not per forward`,
    );
    return `trust: forwards held to the address rule ×${median(rates).toFixed(2)} the rate (${rates.map((r) => `×${r.toFixed(2)}`).join(", ")}) and ×${median(cpus).toFixed(2)} the CPU of unheld ones; an address check ${allowed.toFixed(2)} µs and opening a secret ${open.toFixed(2)} µs, beside ${f(forwardUs)} µs of CPU a forward`;
  } finally {
    await sink.stop();
    cleanup();
  }
}

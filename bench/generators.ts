// bench/generators.ts: does the load generator change the answer? Measures bare node:http and the
// receiver with wrk (what the benchmarks use) and with autocannon (what they used before), alternating
// in rounds, and prints each generator's CPU per request beside the server's: on 2 cores, whatever the
// generator burns is taken from the server it measures.
//   npm run bench -- generators          BENCH_SECONDS=4 BENCH_ROUNDS=3

import autocannon from "autocannon";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { BODY, CONNECTIONS, WARMUP_SECONDS, f, hammer, knob, startChild, tempDir, type Load } from "./common.ts";

const SECONDS = knob("BENCH_SECONDS", 4);
const ROUNDS = knob("BENCH_ROUNDS", 3);
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

let runs = 0;

/** autocannonLoad is the old generator, unique IDs, measured with its own CPU per request (it runs in this process). */
async function autocannonLoad(url: string, seconds: number): Promise<Load> {
  const prefix = `a${process.pid}-${++runs}-`;
  let n = 0;
  const cpu0 = process.cpuUsage();
  const result = await autocannon({
    url,
    connections: CONNECTIONS,
    duration: seconds,
    timeout: 30,
    requests: [
      {
        method: "POST",
        body: BODY,
        setupRequest: (request) => {
          request.headers = { "content-type": "application/json", "x-delivery-id": prefix + n++ };
          return request;
        },
      },
    ],
  });
  const cpu = process.cpuUsage(cpu0);
  const ok = result["2xx"];
  return {
    rps: ok / result.duration,
    p50: result.latency.p50,
    p99: result.latency.p99,
    ok,
    non2xx: result.non2xx,
    errors: result.errors + result.timeouts,
    generatorUs: (cpu.user + cpu.system) / Math.max(1, ok + result.non2xx),
  };
}

/** generators runs the comparison and returns its one-line summary. */
export async function generators(): Promise<string> {
  const { dir, cleanup } = tempDir();
  const servers = [
    await startChild("bench/bare.ts", []),
    await startChild("receiver.ts", ["--port", "0", "--db", join(dir, "gen.db"), "--quiet"]),
  ];
  const kinds = [
    { name: "wrk", load: (url: string, s: number) => hammer(url, { seconds: s }) },
    { name: "autocannon", load: autocannonLoad },
  ];
  // [server][generator] → per round: req/s, generator µs/req, server µs/req
  const got = servers.map(() => kinds.map(() => ({ rps: [] as number[], gen: [] as number[], srv: [] as number[] })));
  console.log(
    `generators: ${CONNECTIONS} connections, ${ROUNDS} round(s) of ${SECONDS} s, bare node:http and receiver --quiet`,
  );
  try {
    for (const s of servers) for (const k of kinds) await k.load(s.url, WARMUP_SECONDS);
    for (let round = 1; round <= ROUNDS; round++) {
      for (const [si, s] of servers.entries()) {
        for (const [ki, k] of kinds.entries()) {
          const c0 = s.cpuMs();
          const load = await k.load(s.url, SECONDS);
          const srv = ((s.cpuMs() - c0) * 1000) / (load.ok + load.non2xx);
          const g = got[si]![ki]!;
          g.rps.push(load.rps);
          g.gen.push(load.generatorUs);
          g.srv.push(srv);
          console.log(
            `  round ${round} ${si === 0 ? "bare    " : "receiver"} ${k.name.padEnd(10)} ${f(load.rps).padStart(7)} req/s  server ${f(srv)} µs/req  generator ${f(load.generatorUs)} µs/req`,
          );
        }
      }
    }
  } finally {
    for (const s of servers) await s.stop();
    cleanup();
  }
  const part = (si: number, ki: number) => {
    const g = got[si]![ki]!;
    return `${kinds[ki]!.name} ${f(median(g.rps))} req/s (server ${f(median(g.srv))} µs/req, generator ${f(median(g.gen))} µs/req)`;
  };
  const ratio = (ki: number) => median(got[1]![ki]!.rps.map((r, i) => r / got[0]![ki]!.rps[i]!));
  return (
    `generators (median of ${ROUNDS}): bare: ${part(0, 0)} | ${part(0, 1)} | receiver: ${part(1, 0)} | ${part(1, 1)}` +
    ` | receiver/bare with wrk ×${f(ratio(0), 2)}, with autocannon ×${f(ratio(1), 2)}`
  );
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) console.log(await generators());

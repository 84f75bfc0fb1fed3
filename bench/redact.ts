// bench/redact.ts: what redacting the secrets a destination's answer may echo costs (docs/forwarding.md, "Secrets
// in answers"), against baselines measured in the same run. First forwards that succeed: BENCH_REDACT_BACKLOG
// (5k) deliveries forwarded from SQLite to a bare node:http destination (bench/bare.ts) with the redactors
// compiled, as the worker runs, and with `redact: false`, alternating over BENCH_ROUNDS (3) rounds, so a busy
// machine's noise lands on both: the median ratio of their rates and of the worker's CPU per forward (nothing
// runs on a success, so both should be 1.00 give or take the noise). Then a failed try: one redaction of a
// 256-byte answer that echoes the request's headers, the secrets of a sources file of 10 destinations
// compiled, timed in a loop against judge() of the same answer, which every failed try already runs.
//   npm run bench -- redact          BENCH_REDACT_BACKLOG=2000 BENCH_ROUNDS=1 npm run bench -- redact

import { join } from "node:path";
import { connect } from "../inbox.ts";
import { judge } from "../lib/forwarding/forward.ts";
import { forward } from "../lib/forwarding/forwarder.ts";
import { redactor, secretsOf } from "../lib/redact.ts";
import { loadDestinations } from "../lib/routing/routes.ts";
import { f, knob, startChild, tempDir } from "./common.ts";

const BACKLOG = knob("BENCH_REDACT_BACKLOG", 5_000);
const ROUNDS = knob("BENCH_ROUNDS", 3);
const CONCURRENCY = 32;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const ownCpuMs = () => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
};

// A sources file of ten destinations, each with a signing secret, a bearer token and an API key from the environment.
function sources(url: string): { config: Record<string, unknown>; env: Record<string, string> } {
  const env: Record<string, string> = {};
  const destinations: Record<string, unknown> = {};
  for (let i = 0; i < 10; i++) {
    env[`T${i}`] = `tok_live_${i}_${"x".repeat(24)}`;
    env[`K${i}`] = `key_${i}_${"y".repeat(20)}`;
    destinations[`d${i}`] = {
      url,
      secret: `whsec_${Buffer.from(`forwarding key ${i}`).toString("base64")}`,
      bearer: `env:T${i}`,
      headers: { "X-Api-Key": `env:K${i}` },
      maxInFlight: CONCURRENCY,
    };
  }
  return { config: { $destinations: destinations }, env };
}

// drain forwards n fresh deliveries to d0, all answered 200, and returns the rate and this process's CPU per forward.
async function drain(path: string, url: string, n: number, redact: boolean): Promise<{ rate: number; cpuUs: number }> {
  const { config, env } = sources(url);
  const all = loadDestinations(config, env);
  const forwarding = { destinations: new Map([["d0", all.destinations.get("d0")!]]) };
  const inbox = await connect(path, { syncOffLoop: true });
  try {
    for (let start = 0; start < n; start += 1_000) {
      await Promise.all(
        Array.from({ length: Math.min(1_000, n - start) }, (_, k) =>
          inbox.store({
            id: `rd_${start + k}`,
            body: Buffer.from(JSON.stringify({ type: "payment.succeeded", n: start + k })),
            destinations: ["d0"],
          }),
        ),
      );
    }
    const cpu0 = ownCpuMs();
    const started = performance.now();
    const done = (await forward({ inbox, forwarding, once: true, log: () => {}, redact, secrets: secretsOf(all) }))
      .done;
    const ms = performance.now() - started;
    if (done !== n) throw new Error(`redact: expected ${n} done, got ${done}`);
    return { rate: (n / ms) * 1000, cpuUs: ((ownCpuMs() - cpu0) * 1000) / n };
  } finally {
    await inbox.close();
  }
}

/** redactBench runs both parts and returns the summary line. */
export async function redactBench(): Promise<string> {
  const sink = await startChild("bench/bare.ts", []);
  const { dir, cleanup } = tempDir();
  try {
    console.log(
      `redact: ${BACKLOG} forwards that succeed, redactors compiled against redact: false, ${ROUNDS} rounds after a warm-up`,
    );
    await drain(join(dir, "warm.db"), sink.url, Math.min(BACKLOG, 1_000), true);
    const rates: number[] = [];
    const cpus: number[] = [];
    for (let round = 1; round <= ROUNDS; round++) {
      // Each round runs both, in turns that alternate, each on a fresh file.
      const order = round % 2 === 1 ? [true, false] : [false, true];
      const runs = new Map<boolean, { rate: number; cpuUs: number }>();
      for (const on of order) runs.set(on, await drain(join(dir, `r${round}-${on}.db`), sink.url, BACKLOG, on));
      const [on, off] = [runs.get(true)!, runs.get(false)!];
      rates.push(on.rate / off.rate);
      cpus.push(on.cpuUs / off.cpuUs);
      console.log(
        `  round ${round}: redacting ${f(on.rate)}/s, ${f(on.cpuUs)} µs a forward; not redacting ${f(off.rate)}/s, ${f(off.cpuUs)} µs; rate ×${(on.rate / off.rate).toFixed(2)}`,
      );
    }

    const { config, env } = sources("http://127.0.0.1:1/");
    const all = loadDestinations(config, env);
    const { redact } = redactor(secretsOf(all), { mine: "d0" });
    const d0 = all.destinations.get("d0")!;
    const headers = d0.kind === "http" ? d0.headers : {};
    // What an error page that lists the request's headers keeps: its first 256 bytes, the bearer token and the key in them.
    const answer = `500 Internal Server Error\n${Object.entries({
      ...headers,
      "content-type": "application/json",
      "user-agent": "webhook-inbox",
      traceparent: `00-${"a".repeat(32)}-${"b".repeat(16)}-01`,
    })
      .map(([k, v]) => `${k}: ${v}`)
      .join("\n")}\n${"z".repeat(256)}`.slice(0, 256);
    const clean = answer.replace(/tok_live_0_x+|key_0_y+/g, "-");
    const time = (fn: () => unknown) => {
      for (let i = 0; i < 2_000; i++) fn();
      const n = 50_000;
      const started = performance.now();
      for (let i = 0; i < n; i++) fn();
      return ((performance.now() - started) * 1000) / n;
    };
    const judged = time(() => judge(500, {}, answer, "d0", false, 0));
    const withSecrets = time(() => redact(answer));
    const without = time(() => redact(clean));
    console.log(
      `  a failed try: judge() ${judged.toFixed(2)} µs; redacting its 256-byte answer ${withSecrets.toFixed(2)} µs (×${(withSecrets / judged).toFixed(1)} of judge) with 2 secrets in it, ${without.toFixed(2)} µs with none (${secretsOf(all).length} secret values of 10 destinations compiled)`,
    );
    return `redact: a success ×${median(rates).toFixed(2)} the rate (${rates.map((r) => `×${r.toFixed(2)}`).join(", ")}) and ×${median(cpus).toFixed(2)} the CPU a forward of not redacting; a failed try +${withSecrets.toFixed(1)} µs (judge() ${judged.toFixed(1)} µs)`;
  } finally {
    await sink.stop();
    cleanup();
  }
}

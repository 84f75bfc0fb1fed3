// bench/attempts.ts: what keeping each try in the attempt log costs the store (docs/forwarding.md#the-attempt-log),
// against the same done marks without it, measured in the same run. BENCH_ATTEMPTS_BACKLOG (5k) deliveries are
// claimed a hundred at a time and marked done together (one group commit, as a lane's batcher sends them), on a
// fresh inbox each time: without a try, and with the try a forward that succeeded at once keeps (a 200, five
// headers, a short JSON body). The two alternate over BENCH_ROUNDS (3) rounds, so a shared machine's noise lands
// on both; the median ratios of this process's CPU per done mark, of PostgreSQL's backends' (found by
// application_name, from /proc) and of the wall time are printed. SQLite, and PostgreSQL unless BENCH_POSTGRES=0
// or none answers. The forward's own share (redacting the answer's headers and body before they are kept) is
// timed in a loop beside it, with the secrets of a file of ten destinations compiled.
//   npm run bench -- attempts          BENCH_ATTEMPTS_BACKLOG=2000 BENCH_ROUNDS=1 npm run bench -- attempts

import { readdirSync } from "node:fs";
import { join } from "node:path";
import { connect } from "../inbox.ts";
import { redactAttempt, redactor, type Secret } from "../lib/redact.ts";
import type { Inbox, Try } from "../lib/store.ts";
import { cpuMs, f, knob, tempDir } from "./common.ts";

const BACKLOG = knob("BENCH_ATTEMPTS_BACKLOG", 5_000);
const ROUNDS = knob("BENCH_ROUNDS", 3);
const BATCH = 100;
const POSTGRES = process.env.INBOX_TEST_POSTGRES ?? "postgres://postgres@127.0.0.1:5432/test";
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const ownCpuMs = () => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
};

// What a forward that succeeded keeps: a bare node:http answer's headers, and an API's short acknowledgement.
const ANSWER: Omit<Try, "startedAt" | "ms"> = {
  status: 200,
  headers: {
    "content-type": "application/json",
    date: "Sun, 06 Dec 2026 11:00:00 GMT",
    connection: "keep-alive",
    "keep-alive": "timeout=5",
    "content-length": "17",
  },
  body: '{"received":true}',
};

interface Pass {
  /** This process's CPU per done mark, in µs. */
  cpuUs: number;
  /** PostgreSQL's backends' CPU per done mark, in µs (PostgreSQL on this machine only). */
  dbUs?: number;
  /** Wall time per done mark, in µs. */
  wallUs: number;
}

// backendCpuMs sums the CPU of the PostgreSQL backends of this pass, by application_name, from /proc.
async function backendCpuMs(inbox: Inbox, name: string): Promise<number | undefined> {
  if (inbox.backend !== "postgres") return undefined;
  const rows = await inbox.query("SELECT pid FROM pg_stat_activity WHERE application_name = ?", name);
  try {
    const pids = new Set(readdirSync("/proc"));
    const live = rows.map((r) => String(r.pid)).filter((pid) => pids.has(pid));
    return live.length === 0 ? undefined : live.reduce((sum, pid) => sum + cpuMs(Number(pid)), 0);
  } catch {
    return undefined;
  }
}

// pass stores n deliveries, then claims and marks them done a batch at a time, with a try each or none.
async function pass(target: string, n: number, keep: boolean): Promise<Pass> {
  const pg = target.startsWith("postgres");
  const name = `bench-attempts-${process.pid}`;
  const inbox = await connect(pg ? `${target}&application_name=${name}` : target, pg ? {} : { syncOffLoop: true });
  try {
    for (let start = 0; start < n; start += 1_000)
      await Promise.all(
        Array.from({ length: Math.min(1_000, n - start) }, (_, k) =>
          inbox.store({ id: `at_${start + k}`, body: Buffer.from(`{"n":${start + k}}`), destinations: ["app"] }),
        ),
      );
    const db0 = await backendCpuMs(inbox, name);
    const cpu0 = ownCpuMs();
    const started = performance.now();
    let done = 0;
    for (;;) {
      const leases = await inbox.claimBatch(BATCH, 60_000, { destination: "app" });
      if (leases.length === 0) break;
      const at = Date.now();
      const held = await Promise.all(
        leases.map((l) => (keep ? inbox.finish(l, [], { startedAt: at, ms: 3, ...ANSWER }) : inbox.finish(l))),
      );
      done += held.filter(Boolean).length;
    }
    const wallUs = ((performance.now() - started) * 1000) / n;
    const cpuUs = ((ownCpuMs() - cpu0) * 1000) / n;
    const db1 = await backendCpuMs(inbox, name);
    if (done !== n) throw new Error(`attempts: expected ${n} done, got ${done}`);
    return { cpuUs, wallUs, ...(db0 !== undefined && db1 !== undefined ? { dbUs: ((db1 - db0) * 1000) / n } : {}) };
  } finally {
    await inbox.close();
  }
}

// postgresTarget hands out a fresh schema's URL for each pass, dropped at the end; undefined when
// BENCH_POSTGRES=0 or none answers.
async function postgresTarget(): Promise<{ schema: () => string; drop: () => Promise<void> } | undefined> {
  if (process.env.BENCH_POSTGRES === "0") return undefined;
  const pg = (await import("pg")).default;
  const client = new pg.Client({ connectionString: POSTGRES, connectionTimeoutMillis: 2_000 });
  try {
    await client.connect();
  } catch {
    return undefined;
  }
  const schemas: string[] = [];
  return {
    schema: () => {
      const s = `bench_attempts_${process.pid}_${schemas.length}`;
      schemas.push(s);
      return `${POSTGRES}?schema=${s}`;
    },
    drop: async () => {
      for (const s of schemas) await client.query(`DROP SCHEMA IF EXISTS ${s} CASCADE`);
      await client.end();
    },
  };
}

/** attemptsBench measures both backends and the forward's redaction, and returns the summary line. */
export async function attemptsBench(): Promise<string> {
  const { dir, cleanup } = tempDir();
  const pgAt = await postgresTarget();
  const summary: string[] = [];
  try {
    console.log(
      `attempts: ${BACKLOG} done marks in batches of ${BATCH}, with a try kept each against none, ${ROUNDS} rounds after a warm-up`,
    );
    const backends: [string, (tag: string) => string][] = [["sqlite", (tag) => join(dir, `${tag}.db`)]];
    if (pgAt) backends.push(["postgres", () => pgAt.schema()]);
    else console.log("  postgres: not reachable (or BENCH_POSTGRES=0), left out");
    for (const [backend, target] of backends) {
      await pass(target("warm"), Math.min(BACKLOG, 1_000), true);
      const cpu: number[] = [];
      const db: number[] = [];
      const wall: number[] = [];
      const kept: Pass[] = [];
      const none: Pass[] = [];
      for (let round = 1; round <= ROUNDS; round++) {
        const order = round % 2 === 1 ? [true, false] : [false, true];
        const runs = new Map<boolean, Pass>();
        for (const keep of order) runs.set(keep, await pass(target(`r${round}-${keep}`), BACKLOG, keep));
        const [on, off] = [runs.get(true)!, runs.get(false)!];
        kept.push(on);
        none.push(off);
        cpu.push(on.cpuUs / off.cpuUs);
        wall.push(on.wallUs / off.wallUs);
        if (on.dbUs !== undefined && off.dbUs !== undefined) db.push(on.dbUs / off.dbUs);
        console.log(
          `  ${backend} round ${round}: with a try ${f(on.cpuUs)} µs CPU a done mark${on.dbUs === undefined ? "" : `, PostgreSQL ${f(on.dbUs)} µs`}, ${f(on.wallUs)} µs wall; without ${f(off.cpuUs)} µs${off.dbUs === undefined ? "" : `, PostgreSQL ${f(off.dbUs)} µs`}, ${f(off.wallUs)} µs wall`,
        );
      }
      const m = (ps: Pass[], k: keyof Pass) => median(ps.map((p) => p[k] ?? 0));
      const line = `attempts ${backend}: CPU a done mark ×${median(cpu).toFixed(2)} (${f(m(kept, "cpuUs"))} against ${f(m(none, "cpuUs"))} µs)${db.length > 0 ? `, PostgreSQL's ×${median(db).toFixed(2)} (${f(m(kept, "dbUs"))} against ${f(m(none, "dbUs"))} µs)` : ""}, wall ×${median(wall).toFixed(2)} (${f(m(kept, "wallUs"))} against ${f(m(none, "wallUs"))} µs)`;
      console.log(line);
      summary.push(line);
    }

    // The forward's share: the answer redacted before it is kept, with 40 secret values compiled (none in it).
    const secrets: Secret[] = [];
    for (let i = 0; i < 10; i++) {
      secrets.push({ value: `tok_live_${i}_${"x".repeat(24)}`, name: `d${i} bearer`, owner: `d${i}` });
      secrets.push({ value: `key_${i}_${"y".repeat(20)}`, name: `d${i} header x-api-key`, owner: `d${i}` });
      secrets.push({
        value: `whsec_${Buffer.from(`forwarding key ${i}`).toString("base64")}`,
        name: `d${i} secret`,
        owner: `d${i}`,
      });
      secrets.push({
        value: Buffer.from(`forwarding key ${i}`).toString("base64"),
        name: `d${i} secret`,
        owner: `d${i}`,
      });
    }
    const { redact } = redactor(secrets, { mine: "d0" });
    const tried = {
      attempt: 1,
      destination: "d0",
      startedAt: 0,
      ms: 3,
      error: null,
      status: 200,
      headers: ANSWER.headers!,
      body: ANSWER.body!,
    };
    for (let i = 0; i < 2_000; i++) redactAttempt(tried, redact);
    const loops = 50_000;
    const t0 = performance.now();
    for (let i = 0; i < loops; i++) redactAttempt(tried, redact);
    const us = ((performance.now() - t0) * 1000) / loops;
    const line = `attempts redaction: ${us.toFixed(2)} µs to redact a good answer's five headers and body`;
    console.log(line);
    summary.push(line);
    return summary.join("\n");
  } finally {
    await pgAt?.drop();
    cleanup();
  }
}

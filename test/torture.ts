// test/torture.ts: the long version of the crash suite (`npm run torture`). The same scenarios as
// test/crash.test.ts and the storm of test/faults.test.ts, run for many rounds, then the figures the
// docs/reliability.md quotes. Exits 1 if anything was lost, doubled or partial.
//   TORTURE_ROUNDS=200 TORTURE_SECONDS=300 TORTURE_STORMS=5 CHAOS_SEED=42 npm run torture
// TORTURE_FORWARD_SECONDS: how long the forwarding torture on PostgreSQL runs (test/forward-torture.ts: four
// workers, eight destinations, SIGKILLs and pg_terminate_backend; default 60, 0 to skip).
// TORTURE_ROUNDS: receiver kill rounds (default 50); TORTURE_SECONDS: how long workers are killed over
// fresh backlogs (default 60; the whole pipeline then runs a quarter of that, at least 10 s);
// TORTURE_STORMS: SQLITE_BUSY storms of 4 processes (default 3). TORTURE_POSTGRES_SECONDS: how long the
// PostgreSQL pipeline runs (default 0, skipped): half on the test server with pg_terminate_backend, half on a
// private cluster restarted about every 10 s (INBOX_TEST_POSTGRES as for the tests). TORTURE_FAILOVERS: rounds
// of test/failover.ts (default 0, skipped), each TORTURE_FAILOVER_SECONDS of load (default 20) before the
// primary is SIGKILLed and as long after its synchronous standby is promoted, at PostgreSQL's own settings.
// `npm run torture -- powerloss` runs only the power-loss cycles (test/powerloss/), `-- crash` only the above;
// without a name, both. POWERLOSS_CYCLES: power cuts per backend (default 20), half of them harsh (some
// unsynced pages kept); POWERLOSS_CONTROL_CYCLES: cuts per control (default 6; each must lose acked IDs);
// POWERLOSS_RECEIVER=/other/tree/receiver.ts (and POWERLOSS_RECEIVER_ARGS) tests another receiver build.

import { mkdirSync } from "node:fs";
import { loadavg } from "node:os";
import { join } from "node:path";
import { failover } from "./failover.ts";
import { forwardTorture } from "./forward-torture.ts";
import {
  busyStorm,
  pipelineCrash,
  postgresPipeline,
  receiverCrash,
  seeded,
  workerCrash,
  type PostgresPipelineReport,
} from "./chaos.ts";
import { freshSchema, PG_BIN, postgresSkip, privatePostgres, tempDir } from "./helpers.ts";
import { fuseSkip } from "./powerloss/layer.ts";
import {
  powerLossPostgres,
  powerLossSqlite,
  receiverBuild,
  type PowerLossOptions,
  type PowerLossReport,
} from "./powerloss/scenarios.ts";

const rounds = Number(process.env.TORTURE_ROUNDS ?? 50);
const seconds = Number(process.env.TORTURE_SECONDS ?? 60);
const storms = Number(process.env.TORTURE_STORMS ?? 3);
const postgresSeconds = Number(process.env.TORTURE_POSTGRES_SECONDS ?? 0);
const forwardSeconds = Number(process.env.TORTURE_FORWARD_SECONDS ?? 60);
const failovers = Number(process.env.TORTURE_FAILOVERS ?? 0);
const failoverSeconds = Number(process.env.TORTURE_FAILOVER_SECONDS ?? 20);
// The pipeline runs for a quarter of the worker time, at least 10 s.
const pipelineSeconds = Math.max(10, Math.round(seconds / 4));
const powerCycles = Number(process.env.POWERLOSS_CYCLES ?? 20);
const controlCycles = Number(process.env.POWERLOSS_CONTROL_CYCLES ?? 6);
const seed = Number(process.env.CHAOS_SEED ?? Date.now() % 100_000);
const sections = process.argv.slice(2);
if (sections.some((name) => name !== "crash" && name !== "powerloss")) {
  console.error(`torture: expected the sections crash and/or powerloss, got ${sections.join(" ")}`);
  process.exit(2);
}
const crash = sections.length === 0 || sections.includes("crash");
const powerloss = sections.length === 0 || sections.includes("powerloss");
for (const [name, value] of [
  ["POWERLOSS_CYCLES", powerCycles],
  ["POWERLOSS_CONTROL_CYCLES", controlCycles],
  ["TORTURE_ROUNDS", rounds],
  ["TORTURE_SECONDS", seconds],
  ["TORTURE_STORMS", storms],
  ["TORTURE_POSTGRES_SECONDS", postgresSeconds],
  ["TORTURE_FORWARD_SECONDS", forwardSeconds],
  ["TORTURE_FAILOVERS", failovers],
  ["TORTURE_FAILOVER_SECONDS", failoverSeconds],
  ["CHAOS_SEED", seed],
] as const) {
  if (!Number.isInteger(value) || value < 0) {
    console.error(`torture: expected ${name} to be a whole number >= 0, got ${process.env[name]}`);
    process.exit(2);
  }
}
const random = seeded(seed);
const { dir, cleanup } = tempDir("inbox-torture-");
const started = Date.now();
const problems: string[] = [];
// fresh gives each backlog or storm a database of its own, inside the one folder removed at the end.
const fresh = (name: string) => {
  mkdirSync(join(dir, name));
  return join(dir, name);
};
if (!crash) {
  try {
    problems.push(...(await powerLoss()));
  } finally {
    cleanup();
  }
  for (const p of problems) console.error(`torture: ${p}`);
  process.exit(problems.length > 0 ? 1 : 0);
}
console.log(
  `torture: seed ${seed}, ${rounds} receiver rounds, ${seconds} s of worker kills, ${storms} storms, ` +
    `${pipelineSeconds} s of pipeline kills (in ${dir})`,
);

try {
  // 1. The receiver, killed mid-traffic, round after round, on one database file.
  const r = await receiverCrash({ dir, rounds, senders: 8, minUpMs: 100, maxUpMs: 1_000, random });
  console.log(
    `receiver: ${r.rounds} rounds, ${r.kills} kills, ${r.sent} requests, ${r.acked} new deliveries acknowledged ` +
      `(+${r.duplicatesAcked} resent duplicates), ${r.stored} stored, lost ${r.lost.length}, partial ${r.partial.length}, integrity ${r.integrity}`,
  );
  if (r.lost.length > 0) problems.push(`receiver lost acknowledged deliveries: ${r.lost.slice(0, 5).join(", ")}`);
  if (r.partial.length > 0) problems.push(`receiver stored partial bodies: ${r.partial.slice(0, 5).join(", ")}`);
  if (r.integrity !== "ok") problems.push(`integrity_check: ${r.integrity}`);
  if (r.wrongAnswers.length > 0) problems.push(`receiver: ${r.wrongAnswers.slice(0, 5).join("; ")}`);

  // 2. Workers killed about every second over fresh backlogs, until the time is up.
  const w = {
    runs: 0,
    deliveries: 0,
    kills: 0,
    midHandler: 0,
    takenOver: 0,
    lost: 0,
    doubled: 0,
    unbalanced: 0,
    unfinished: 0,
  };
  const workersUntil = Date.now() + seconds * 1000;
  while (Date.now() < workersUntil) {
    const run = await workerCrash({
      dir: fresh(`workers-${w.runs}`),
      deliveries: 2_000,
      workers: 3,
      concurrency: 4,
      leaseMs: 1_000,
      workMs: 80,
      killEveryMs: 1_000,
      deadlineMs: 300_000,
      random,
    });
    w.runs++;
    w.deliveries += run.deliveries;
    w.kills += run.kills;
    w.midHandler += run.killsMidHandler;
    w.takenOver += run.takenOver;
    w.lost += run.lost + run.notDone;
    w.doubled += run.doubled;
    if (run.balance !== run.expected) w.unbalanced++;
    if (!run.finishedInTime || run.processing > 0) w.unfinished++;
  }
  console.log(
    `workers: ${w.runs} backlogs, ${w.deliveries} deliveries, ${w.kills} kills (${w.midHandler} with handlers in flight), ` +
      `${w.takenOver} taken over after their lease expired, balances exact in ${w.runs - w.unbalanced}/${w.runs}, lost ${w.lost}, doubled ${w.doubled}`,
  );
  if (w.lost > 0 || w.doubled > 0 || w.unbalanced > 0 || w.unfinished > 0)
    problems.push(`workers: ${JSON.stringify(w)}`);

  // 3. SQLITE_BUSY storms: four processes storing and claiming at once.
  const s = { deliveries: 0, claims: 0, lost: 0, doubled: 0, errors: 0 };
  for (let i = 0; i < storms; i++) {
    const run = await busyStorm({ dir: fresh(`storm-${i}`), processes: 4, perProcess: 500, claimer: "inbox" });
    s.deliveries += run.deliveries;
    s.claims += run.claims;
    s.lost += run.lost;
    s.doubled += run.doubled;
    s.errors += run.errors.length + run.exitCodes.filter((c) => c !== 0).length;
  }
  console.log(
    `storms: ${storms} × 4 processes, ${s.deliveries} deliveries, ${s.claims} claims, lost ${s.lost}, doubled ${s.doubled}, errors ${s.errors}`,
  );
  if (s.lost > 0 || s.doubled > 0 || s.errors > 0) problems.push(`storms: ${JSON.stringify(s)}`);

  // 4. The whole pipeline: senders, the receiver and workers, any of them killed about every second.
  const p = await pipelineCrash({
    dir: fresh("pipeline"),
    seconds: pipelineSeconds,
    senders: 4,
    workers: 3,
    killEveryMs: 1_000,
    random,
  });
  console.log(
    `pipeline: ${pipelineSeconds} s, ${p.kills} kills (${p.receiverKills} of the receiver), ${p.acked} acknowledged, ` +
      `${p.deliveries} stored and done ${p.done}, ${p.takenOver} taken over, balance ${p.balance === p.expected ? "exact" : "WRONG"}, ` +
      `lost ${p.lostAcked + p.lost}, doubled ${p.doubled}, integrity ${p.integrity}`,
  );
  if (
    !p.drained ||
    p.lostAcked > 0 ||
    p.lost > 0 ||
    p.doubled > 0 ||
    p.balance !== p.expected ||
    p.integrity !== "ok"
  ) {
    problems.push(`pipeline: ${JSON.stringify(p)}`);
  }

  // 5. The pipeline on PostgreSQL: two receivers, three workers, kills, dropped connections, restarts.
  const pgRuns: PostgresPipelineReport[] = [];
  if (postgresSeconds > 0) {
    const half = Math.max(5, Math.round(postgresSeconds / 2));
    const report = (name: string, q: PostgresPipelineReport) => {
      pgRuns.push(q);
      console.log(
        `${name}: ${half} s, ${q.kills} kills (${q.receiverKills} of receivers), ${q.terminations} connections terminated ` +
          `in ${q.terminateRounds} rounds (${q.terminationsMidTransaction} mid-transaction), ${q.serverRestarts} server restarts, ${q.acked} acknowledged, ${q.deliveries} stored and done ` +
          `${q.done}, ${q.unavailable} answered 503, balance ${q.balance === q.expected ? "exact" : "WRONG"}, ` +
          `lost ${q.lostAcked + q.lost}, doubled ${q.doubled}, unexpected exits ${q.unexpectedExits.length}`,
      );
      if (
        !q.drained ||
        q.lostAcked > 0 ||
        q.lost > 0 ||
        q.doubled > 0 ||
        q.balance !== q.expected ||
        q.unexpectedExits.length > 0 ||
        q.unavailableWithoutRetryAfter > 0
      )
        problems.push(`${name}: ${JSON.stringify(q)}`);
    };
    if ((await postgresSkip()) === false) {
      const schema = await freshSchema("torture");
      try {
        report(
          "postgres",
          await postgresPipeline({
            url: schema.url,
            seconds: half,
            senders: 4,
            receivers: 2,
            workers: 3,
            killEveryMs: 1_000,
            terminateEveryMs: 1_500,
            random,
          }),
        );
      } finally {
        await schema.drop();
      }
    }
    const server = await privatePostgres();
    if (typeof server !== "string") {
      try {
        let n = 0;
        report(
          "postgres restarts",
          await postgresPipeline({
            url: `${server.url}?schema=torture`,
            seconds: half,
            senders: 4,
            receivers: 2,
            workers: 3,
            killEveryMs: 1_000,
            terminateEveryMs: 0,
            restart: {
              times: Math.max(1, Math.round(half / 10)),
              run: () => server.restart(n++ % 2 ? "fast" : "immediate"),
            },
            random,
          }),
        );
      } finally {
        await server.destroy();
      }
    }
  }
  // 5b. Forwarding on PostgreSQL: four workers, eight destinations that fail, hang, throttle and come back,
  // SIGKILLs and dropped connections. Nothing lost, no worker exits by itself, no deadlock, and the
  // duplicates within the bound docs/forwarding.md states.
  if (forwardSeconds > 0 && (await postgresSkip()) === false) {
    const schema = await freshSchema("fwdtorture");
    try {
      const q = await forwardTorture({
        url: schema.url,
        dir: fresh("forward"),
        deliveries: Math.max(60, forwardSeconds * 3),
        workers: 4,
        seconds: forwardSeconds,
        killEveryMs: 2_000,
        terminateEveryMs: 1_500,
        leaseMs: 3_000,
        random,
      });
      const twice = q.destinations.reduce((n, d) => n + d.acceptedTwice, 0);
      const bound = q.kills * 2 * q.inFlightPerWorker;
      console.log(
        `forwarding: ${forwardSeconds} s, ${q.deliveries} deliveries × ${q.destinations.length} destinations, ${q.kills} SIGKILLs, ` +
          `${q.terminations} connections terminated, ${twice} accepted twice (bound ${bound}; ${q.destinations.map((d) => `${d.name} ${d.acceptedTwice}`).join(", ")}), ` +
          `not done ${q.notDone}, deadlocks logged ${q.deadlocksLogged} (server-wide meanwhile ${q.serverDeadlocks}), bucket refusals ` +
          `${q.destinations.find((d) => d.name === "rated")!.refusedByBucket}, unexpected exits ${q.unexpectedExits.length}`,
      );
      const lost = q.destinations.filter((d) => d.accepted < q.deliveries);
      // The bucket's refusals are printed, not held to zero: see test/forward-torture.test.ts.
      if (!q.drained || lost.length > 0 || q.unexpectedExits.length > 0 || q.deadlocksLogged > 0 || twice > bound)
        problems.push(`forwarding: ${JSON.stringify(q)}`);
    } finally {
      await schema.drop();
    }
  }
  // 6. Failovers: the primary SIGKILLed under load, its synchronous standby promoted, no script restarted.
  const f = { deliveries: 0, lost: 0, doubled: 0, gaps: [] as number[], kills: [] as number[] };
  for (let round = 0; round < failovers; round++) {
    const q = await failover({
      synchronous: true,
      beforeS: failoverSeconds,
      afterS: failoverSeconds,
      stallMs: 1_000,
      senders: 8,
      keys: 8,
      random,
    });
    if (typeof q === "string") break;
    f.deliveries += q.deliveries;
    f.lost += q.lostAcked + q.lost;
    f.doubled += q.doubled;
    f.gaps.push(q.ackGapMs);
    f.kills.push(q.killToAckMs);
    console.log(
      `failover ${round + 1}: ${q.acked} acknowledged, ${q.deliveries} done, ${q.handledOrdered} ordered; no 200 for ${q.ackGapMs} ms ` +
        `(1 s of stalled replication, then from the kill to the next 200 ${q.killToAckMs} ms; pg_ctl promote took ${q.promoteMs} ms); ${q.unavailable} answered 503, ` +
        `${q.requestErrors} failed requests, ${q.duplicatesAfterKill} resent answered duplicate, ${q.retriedHandlers} handlers run again; ` +
        `lost ${q.lostAcked + q.lost}, doubled ${q.doubled}, out of order ${q.outOfOrder.length}`,
    );
    if (
      !q.drained ||
      q.lostAcked > 0 ||
      q.lost > 0 ||
      q.doubled > 0 ||
      q.balance !== q.expected ||
      q.outOfOrder.length > 0 ||
      q.unexpectedExits.length > 0 ||
      q.idleAfter.length > 0
    )
      problems.push(`failover ${round + 1}: ${JSON.stringify(q)}`);
  }
  if (f.gaps.length > 0) {
    const sorted = [...f.kills].sort((a, b) => a - b);
    console.log(
      `failovers: ${f.gaps.length}, kill to first 200: min ${sorted[0]} ms, median ${sorted[Math.floor(sorted.length / 2)]} ms, ` +
        `max ${sorted.at(-1)} ms; lost ${f.lost}, doubled ${f.doubled}`,
    );
  }

  const pg = pgRuns.reduce(
    (a, q) => ({
      deliveries: a.deliveries + q.deliveries,
      kills: a.kills + q.kills,
      lost: a.lost + q.lostAcked + q.lost,
      doubled: a.doubled + q.doubled,
    }),
    { deliveries: 0, kills: 0, lost: 0, doubled: 0 },
  );

  const deliveries = r.stored + w.deliveries + s.deliveries + p.deliveries + pg.deliveries + f.deliveries;
  const lost = r.lost.length + w.lost + s.lost + p.lostAcked + p.lost + pg.lost + f.lost;
  const doubled = w.doubled + s.doubled + p.doubled + pg.doubled + f.doubled;
  console.log(
    `total: rounds ${r.rounds + w.runs + storms + 1 + pgRuns.length + f.gaps.length}, deliveries ${deliveries}, kills ${r.kills + w.kills + p.kills + pg.kills}, ` +
      `lost=${lost}, doubled=${doubled}, partial=${r.partial.length}, in ${Math.round((Date.now() - started) / 1000)} s`,
  );
  if (powerloss) problems.push(...(await powerLoss()));
} finally {
  cleanup();
}
if (problems.length > 0) {
  for (const p of problems) console.error(`torture: ${p}`);
  process.exit(1);
}

// powerLoss runs the power-loss scenarios long: the receiver on both backends through many cuts, then the
// controls, which must lose acknowledged IDs. It prints a line per run and a summary, and returns what failed.
async function powerLoss(): Promise<string[]> {
  const found: string[] = [];
  if (await fuseSkip()) return found;
  const receiver = receiverBuild(process.env);
  const load = () =>
    loadavg()
      .map((l) => l.toFixed(2))
      .join(" ");
  const loadBefore = load();
  console.log(
    `powerloss: seed ${seed}, ${powerCycles} cuts per backend (half harsh), ${controlCycles} per control, ` +
      `receiver ${receiver.script} ${receiver.args.join(" ")}, load average ${loadBefore}`,
  );
  const unsafe = (args: string[]) => ({ script: "test/fixtures/unsafe-receiver.ts", args });
  type Run = {
    control: boolean;
    run: (o: PowerLossOptions) => Promise<PowerLossReport>;
    o: Omit<PowerLossOptions, "dir" | "random">;
  };
  const base = { senders: 16, minUpMs: 500, maxUpMs: 3_000 };
  const runs: Run[] = [
    {
      control: false,
      run: powerLossSqlite,
      o: { ...base, label: "sqlite", cycles: powerCycles, mixedCuts: true, receiver },
    },
    {
      control: true,
      run: powerLossSqlite,
      o: {
        ...base,
        label: "sqlite synchronous=OFF",
        cycles: controlCycles,
        receiver: unsafe(["--synchronous", "OFF"]),
      },
    },
    {
      control: true,
      run: powerLossSqlite,
      o: {
        ...base,
        label: "sqlite synchronous=NORMAL",
        cycles: controlCycles,
        receiver: unsafe(["--synchronous", "NORMAL"]),
      },
    },
  ];
  if (PG_BIN) {
    runs.push(
      {
        control: false,
        run: powerLossPostgres,
        o: { ...base, label: "postgres", cycles: powerCycles, mixedCuts: true, receiver },
      },
      {
        control: true,
        run: powerLossPostgres,
        o: { ...base, label: "postgres fsync=off", cycles: controlCycles, serverSettings: ["fsync=off"] },
      },
      {
        control: true,
        run: powerLossPostgres,
        o: {
          ...base,
          label: "postgres synchronous_commit=off",
          cycles: controlCycles,
          receiver: unsafe(["--synchronous-commit", "off"]),
        },
      },
    );
  } else {
    console.log("powerloss: PostgreSQL skipped: no server binaries under /usr/lib/postgresql/*/bin");
  }
  const reports: PowerLossReport[] = [];
  for (const [k, { control, run, o }] of runs.entries()) {
    const r = await run({ ...o, dir: fresh(`powerloss-${k}`), random });
    reports.push(r);
    const ok = (list: string[]) =>
      list.length === 0 ? "ok" : `${list.length} problems (${list.slice(0, 3).join("; ")})`;
    console.log(
      `powerloss ${control ? "control " : ""}${r.label}: ${r.cycles} cuts, ${r.requests} requests, ${r.acked} acked, lost ${r.lost.length}, ` +
        `${r.stored} stored, integrity ${ok(r.integrity)}, payments ${ok(r.payments)}, ` +
        `${r.recovered ? `drained ${r.drained ? "exactly once" : "NOT"} ${ok(r.exactlyOnce)}` : "the database did not come back"}, ` +
        `${r.droppedPages} unsynced pages dropped (${r.keptPages} kept by harsh cuts), ${r.undoneNames} names undone, ${Math.round(r.ms / 1000)} s`,
    );
    if (control) {
      if (r.lost.length === 0)
        found.push(`control ${r.label} lost nothing in ${r.cycles} cuts: the test did not show it can fail`);
    } else if (
      r.lost.length > 0 ||
      r.integrity.length > 0 ||
      r.payments.length > 0 ||
      !r.drained ||
      r.exactlyOnce.length > 0
    ) {
      found.push(`powerloss ${r.label}: ${JSON.stringify({ ...r, lost: r.lost.slice(0, 10) })}`);
    }
  }
  console.log(`powerloss summary (load average before ${loadBefore}, after ${load()}):`);
  for (const r of reports)
    console.log(
      `  ${r.label.padEnd(32)} ${String(r.cycles).padStart(4)} cuts ${String(r.acked).padStart(8)} acked ${String(r.lost.length).padStart(7)} lost`,
    );
  return found;
}

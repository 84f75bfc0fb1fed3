// test/failover.ts: the failover scenario, shared by test/failover.test.ts (short) and `npm run torture` (long).
// A private primary and a standby made from it with pg_basebackup -R; two receivers and three workers given
// both hosts in one URL; senders under load, one source ordered by key. Then the primary's WAL sender
// stalls (the lag a slow link leaves), every process of the primary is SIGKILLed, and the standby is
// promoted. No script is restarted. It returns what the senders were told and what the new primary holds.

import { createHash } from "node:crypto";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { connect } from "../inbox.ts";
import { prepareLedgerOn, readLedgerOn, startWorker, type Ledger, type Random, type WorkerProcess } from "./chaos.ts";
import { privatePostgres, startReceiver, tempDir, type PrivatePostgres, type ReceiverProcess } from "./helpers.ts";

/** FailoverOptions sizes the failover scenario. */
export interface FailoverOptions {
  /** Commits wait for the standby (synchronous_standby_names = '*'); false is the control, asynchronous. */
  synchronous: boolean;
  /** Seconds of load before the primary dies, and after the standby is promoted. */
  beforeS: number;
  afterS: number;
  /** How long the primary's WAL sender is stopped (SIGSTOP) right before the primary dies. */
  stallMs: number;
  /** Senders of unordered payments, each alternating between the receivers. */
  senders: number;
  /** Keys of the ordered source, each sent in event-time order by a sender of its own. */
  keys: number;
  random: Random;
  /** Settings for the standby, such as wal_retrieve_retry_interval. @default none: PostgreSQL's own */
  standby?: Record<string, string>;
}

/** FailoverReport is what the senders were told, what the scripts did, and what the new primary holds. */
export interface FailoverReport extends Ledger {
  acked: number;
  /** Acknowledged IDs that are not done on the new primary: 0 with a synchronous standby. */
  lostAcked: number;
  lostAckedIds: string[];
  /** Ordered keys whose handled sequence breaks event time, or handles one delivery twice: must be []. */
  outOfOrder: string[];
  handledOrdered: number;
  /** Scripts that exited: must be []; none is ever restarted. */
  unexpectedExits: string[];
  /** Receivers and workers that did nothing after the promotion: must be []. */
  idleAfter: string[];
  /** Longest time without any 200, around the failover, and its parts. */
  ackGapMs: number;
  /** From the SIGKILL to the first 200, and from the promotion to it (the inbox's own part). */
  killToAckMs: number;
  promotedToAckMs: number;
  /** How long pg_ctl promote took. */
  promoteMs: number;
  /** Answers 503 and requests that failed outright (both resent), during the whole run. */
  unavailable: number;
  requestErrors: number;
  /** IDs resent after the kill and answered duplicate: stored and on the standby, only their 200 was lost. */
  duplicatesAfterKill: number;
  /** Deliveries whose handler ran again (its first finish failed with the primary, or its lease ran out). */
  retriedHandlers: number;
  drained: boolean;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, Math.max(0, ms)));

/** failover runs the scenario on two throwaway clusters, or returns the reason to skip (no server binaries). */
export async function failover(o: FailoverOptions): Promise<FailoverReport | string> {
  const primary = await privatePostgres(o.synchronous ? { settings: { synchronous_standby_names: "*" } } : {});
  if (typeof primary === "string") return primary;
  let standby: PrivatePostgres | undefined;
  const dir = tempDir("inbox-failover-");
  const receivers: ReceiverProcess[] = [];
  const workers: WorkerProcess[] = [];
  try {
    standby = await primary.standby(o.standby);
    const url = `postgres://postgres@127.0.0.1:${primary.port},127.0.0.1:${standby.port}/postgres?schema=failover&target_session_attrs=read-write`;
    const reader = await connect(url);
    await prepareLedgerOn(reader);
    await reader.query(
      "CREATE TABLE handled (seq bigserial PRIMARY KEY, order_key text NOT NULL, event_time bigint, id text NOT NULL)",
    );
    const sources = join(dir.dir, "sources.json");
    writeFileSync(
      sources,
      JSON.stringify({
        pay: { provider: "plain" },
        ordered: { provider: "plain", order: { key: "/key", time: "/at" } },
      }),
    );

    // Every script is watched: none is restarted, so one that exits is a failure of the scenario.
    const unexpectedExits: string[] = [];
    let stopping = false;
    for (let k = 0; k < 2; k++) {
      const r = await startReceiver(url, ["--quiet", "--sources", sources]);
      r.child.on(
        "exit",
        (code, signal) =>
          void (stopping || unexpectedExits.push(`receiver ${k} exited ${code ?? signal}: ${r.log().slice(-300)}`)),
      );
      receivers.push(r);
    }
    for (let k = 0; k < 3; k++) {
      const w = startWorker(url, [
        "--lease-ms",
        "1000",
        "--work-ms",
        "20",
        "--concurrency",
        "8",
        "--retry-delay-ms",
        "100",
        "--record-order",
      ]);
      void w.exited.then(
        (code) =>
          void (stopping || unexpectedExits.push(`worker ${k} exited ${code}: ${w.lines.slice(-5).join(" / ")}`)),
      );
      workers.push(w);
    }
    while (!workers.every((w) => w.lines.includes("ready"))) {
      if (unexpectedExits.length > 0) throw new Error(`a script did not start: ${unexpectedExits.join("; ")}`);
      await sleep(20);
    }

    const amountOf = (id: string) => 1 + (createHash("sha256").update(id).digest().readUInt16BE(0) % 1000);
    const acked = new Set<string>();
    const ackTimes: number[] = [];
    const ackedBy = new Map<number, number[]>(); // receiver → times of its 200s
    const counts = { unavailable: 0, requestErrors: 0, duplicatesAfterKill: 0 };
    let killedAt = Infinity;
    let sending = true;
    let turn = 0;
    // post sends one delivery until it is answered 200, as a provider does, alternating between receivers.
    const post = async (path: string, id: string, event: Record<string, unknown>) => {
      while (sending) {
        const k = turn++ % receivers.length;
        try {
          const res = await fetch(`${receivers[k]!.url}/${path}`, {
            method: "POST",
            headers: { "x-delivery-id": id, "content-type": "application/json" },
            body: JSON.stringify({ amount: amountOf(id), ...event }),
            signal: AbortSignal.timeout(30_000),
          });
          const text = await res.text();
          if (res.status === 200) {
            const now = Date.now();
            acked.add(id);
            ackTimes.push(now);
            ackedBy.set(k, [...(ackedBy.get(k) ?? []), now]);
            if (text === "duplicate" && now > killedAt) counts.duplicatesAfterKill++;
            return;
          }
          if (res.status === 503) counts.unavailable++;
        } catch {
          counts.requestErrors++;
        }
        await sleep(20);
      }
    };
    const senders = [
      ...Array.from({ length: o.senders }, async (_, s) => {
        for (let i = 0; sending; i++) await post("pay", `fo-p${s}-${i}`, {});
      }),
      ...Array.from({ length: o.keys }, async (_, key) => {
        for (let i = 0; sending; i++)
          await post("ordered", `fo-k${key}-${i}`, { key: `k${key}`, at: 1_700_000_000_000 + i });
      }),
    ];

    await sleep(o.beforeS * 1000);
    // The lag spike: WAL the primary has written and the standby has not, when the primary dies. Its WAL
    // sender stops (as on a stalled link), so nothing more leaves for the standby, not even into the socket.
    const [walSender] = await queryOn(primary.url, "SELECT pid FROM pg_stat_replication");
    if (o.stallMs > 0 && walSender) process.kill(Number(walSender.pid), "SIGSTOP");
    await sleep(o.stallMs);
    await primary.kill();
    killedAt = Date.now();
    const promoting = Date.now();
    await standby.promote();
    const promotedAt = Date.now();
    const lines = workers.map((w) => w.lines.length);
    await sleep(o.afterS * 1000);
    sending = false;
    await Promise.all(senders);

    // Drain what was stored, then stop everything.
    let drained = false;
    for (const deadline = Date.now() + 120_000; Date.now() < deadline; await sleep(200)) {
      const l = await readLedgerOn(reader);
      if (l.done === l.deliveries) {
        drained = true;
        break;
      }
    }
    const idleAfter = [
      ...receivers.flatMap((_, k) => ((ackedBy.get(k) ?? []).some((t) => t > promotedAt) ? [] : [`receiver ${k}`])),
      ...workers.flatMap((w, k) =>
        w.lines.slice(lines[k]).some((l) => l.startsWith("claim ")) ? [] : [`worker ${k}`],
      ),
    ];
    stopping = true;
    await Promise.all(receivers.map((r) => r.stop("SIGTERM")));
    for (const w of workers) w.child.kill("SIGTERM");
    await Promise.all(workers.map((w) => w.exited));

    const done = new Set(
      (await reader.query("SELECT id FROM deliveries WHERE status = 'done'")).map((r) => r.id as string),
    );
    const handled = await reader.query("SELECT order_key, event_time, id FROM handled ORDER BY seq");
    const ledger = await readLedgerOn(reader);
    await reader.close();
    const outOfOrder: string[] = [];
    const byKey = new Map<string, { t: number; id: string }[]>();
    for (const h of handled)
      byKey.set(h.order_key as string, [
        ...(byKey.get(h.order_key as string) ?? []),
        { t: Number(h.event_time), id: h.id as string },
      ]);
    for (const [key, seq] of byKey) {
      if (seq.some((h, i) => i > 0 && h.t < seq[i - 1]!.t)) outOfOrder.push(`${key}: handled out of event time`);
      if (new Set(seq.map((h) => h.id)).size !== seq.length) outOfOrder.push(`${key}: a delivery handled twice`);
    }
    ackTimes.sort((a, b) => a - b);
    const firstAfter = ackTimes.find((t) => t > killedAt) ?? Infinity;
    const lastBefore = ackTimes.filter((t) => t <= killedAt).at(-1) ?? killedAt;
    const lostAckedIds = [...acked].filter((id) => !done.has(id));
    return {
      ...ledger,
      ...counts,
      acked: acked.size,
      lostAcked: lostAckedIds.length,
      lostAckedIds: lostAckedIds.slice(0, 10),
      outOfOrder,
      handledOrdered: handled.length,
      unexpectedExits,
      idleAfter,
      ackGapMs: firstAfter - lastBefore,
      killToAckMs: firstAfter - killedAt,
      promotedToAckMs: firstAfter - promotedAt,
      promoteMs: promotedAt - promoting,
      retriedHandlers: ledger.takenOver,
      drained,
    };
  } finally {
    for (const r of receivers) await r.stop("SIGKILL");
    for (const w of workers) w.child.kill("SIGKILL");
    await Promise.all(workers.map((w) => w.exited));
    await primary.destroy();
    await standby?.destroy();
    dir.cleanup();
  }
}

// queryOn runs one statement on a server directly (the standby, which the inbox's URL would not pick).
async function queryOn(url: string, sql: string): Promise<Record<string, unknown>[]> {
  const { default: pg } = await import("pg");
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return (await client.query(sql)).rows;
  } finally {
    await client.end();
  }
}

// test/ordering-model.test.ts: a model-based test of ordering. fast-check drives random histories (stores
// of a few keys arriving out of event-time order, claims, finishes, failures, retries, releases, expiring
// leases taken over, and crashes) against a real inbox on both backends and a plain model of the rule.
// After every claim: each key runs one delivery at a time, its heads start in event time then arrival,
// and a delivery is flagged stale exactly when a newer one of its key was already handled.
//   MODEL_RUNS=1000 npx node --import tsx --test test/ordering-model.test.ts

import assert from "node:assert/strict";
import { copyFileSync, existsSync } from "node:fs";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import fc from "fast-check";
import { connect } from "../inbox.ts";
import type { Inbox, Lease, Status } from "../lib/store.ts";
import { freshInbox, postgresSkip, tempDir } from "./helpers.ts";

const MAX_ATTEMPTS = 3;
const LEASE = 500;
const DELAY = 100;
const RUNS = Number(process.env.MODEL_RUNS ?? 300);
// k2 is strict: a delivery set aside as failed blocks it. k1 lets later ones pass. null is unordered.
const KEYS = ["k1", "k2", null] as const;
const STRICT = new Set(["k2"]);

interface Row {
  id: string;
  key: string | null;
  eventTime: number;
  seq: number;
  status: Status;
  attempts: number;
  availableAt: number;
  leasedUntil: number | null;
  token: string | null;
}
interface Model {
  now: number;
  rows: Map<string, Row>;
  last: Map<string, { time: number; id: string }>;
}
interface Real {
  clock: { now: number };
  open: () => Promise<Inbox>;
  inbox: Inbox;
  held: Lease[];
}
type Cmd = fc.AsyncCommand<Model, Real>;

const before = (a: Row, b: Row) => a.eventTime - b.eventTime || a.seq - b.seq;

// eligible is what the rule says a claim may take now, after setting aside expired last attempts.
function eligible(m: Model): Row[] {
  for (const row of m.rows.values()) {
    if (row.status === "processing" && row.leasedUntil! <= m.now && row.attempts >= MAX_ATTEMPTS) {
      Object.assign(row, { status: "failed", leasedUntil: null, token: null });
    }
  }
  const out: Row[] = [];
  for (const key of KEYS) {
    const rows = [...m.rows.values()].filter((r) => r.key === key);
    if (key === null) {
      out.push(
        ...rows.filter(
          (r) =>
            (r.status === "received" && r.availableAt <= m.now) ||
            (r.status === "processing" && r.leasedUntil! <= m.now),
        ),
      );
      continue;
    }
    const running = rows.find((r) => r.status === "processing");
    if (running) {
      if (running.leasedUntil! <= m.now) out.push(running);
      continue;
    }
    if (STRICT.has(key) && rows.some((r) => r.status === "failed")) continue;
    const head = rows.filter((r) => r.status === "received").sort(before)[0];
    if (head && head.availableAt <= m.now) out.push(head);
  }
  return out;
}

const current = (m: Model, lease: Lease) => {
  const row = m.rows.get(lease.id)!;
  return row.status === "processing" && row.token === lease.token ? row : undefined;
};
// Mostly a recent lease, as a worker would hold; sometimes an old one, stale after a takeover.
const pick = (r: Real, i: number) => r.held[r.held.length - 1 - (i % Math.min(r.held.length, i % 5 === 0 ? 40 : 3))];

class Store implements Cmd {
  readonly key: string | null;
  readonly eventTime: number;
  constructor(key: string | null, eventTime: number) {
    this.key = key;
    this.eventTime = eventTime;
  }
  check = () => true;
  async run(m: Model, r: Real) {
    const id = `d${m.rows.size}`;
    assert.equal(
      await r.inbox.store({
        id,
        body: Buffer.from("{}"),
        orderKey: this.key,
        eventTime: this.eventTime,
        strictOrder: STRICT.has(this.key ?? ""),
      }),
      "stored",
    );
    m.rows.set(id, {
      id,
      key: this.key,
      eventTime: this.eventTime,
      seq: m.rows.size,
      status: "received",
      attempts: 0,
      availableAt: m.now,
      leasedUntil: null,
      token: null,
    });
  }
  toString = () => `store(${this.key}, t=${this.eventTime})`;
}

class Claim implements Cmd {
  readonly limit: number;
  constructor(limit: number) {
    this.limit = limit;
  }
  check = () => true;
  async run(m: Model, r: Real) {
    const want = eligible(m);
    const leases = await r.inbox.claimBatch(this.limit, LEASE);
    const got = leases.map((l) => l.id).sort();
    if (want.length <= this.limit)
      assert.deepEqual(got, want.map((w) => w.id).sort(), "claims every delivery the rule allows, and no other");
    else {
      assert.equal(got.length, this.limit);
      for (const id of got)
        assert.ok(
          want.some((w) => w.id === id),
          `${id} was not allowed to run`,
        );
    }
    for (const lease of leases) {
      const row = m.rows.get(lease.id)!;
      if (row.key !== null) {
        const others = [...m.rows.values()].filter((o) => o.key === row.key && o !== row);
        assert.ok(
          !others.some((o) => o.status === "processing"),
          `${row.id}: another delivery of ${row.key} holds a lease`,
        );
        // A takeover re-runs the key's running delivery; any other start is the key's first in event time.
        const ahead =
          row.status === "processing" ? [] : others.filter((o) => o.status === "received" && before(o, row) < 0);
        assert.deepEqual(
          ahead.map((o) => o.id),
          [],
          `${row.id} of ${row.key} starts before earlier events`,
        );
        const last = m.last.get(row.key);
        const newer = last !== undefined && last.time > row.eventTime ? last.id : null;
        assert.equal(lease.newerId, newer, `${row.id}: stale exactly when a newer event of ${row.key} was handled`);
      }
      Object.assign(row, {
        status: "processing",
        attempts: row.attempts + 1,
        leasedUntil: m.now + LEASE,
        token: lease.token,
      });
      assert.equal(lease.attempts, row.attempts);
      r.held.push(lease);
    }
  }
  toString = () => `claim(${this.limit})`;
}

class Finish implements Cmd {
  readonly n: number;
  constructor(n: number) {
    this.n = n;
  }
  check = () => true;
  async run(m: Model, r: Real) {
    const lease = pick(r, this.n);
    if (!lease) return;
    const row = current(m, lease);
    assert.equal(await r.inbox.finish(lease), row !== undefined, "only the current lease may finish");
    if (!row) return;
    Object.assign(row, { status: "done", leasedUntil: null, token: null });
    const last = row.key === null ? undefined : m.last.get(row.key);
    if (row.key !== null && (last === undefined || last.time <= row.eventTime))
      m.last.set(row.key, { time: row.eventTime, id: row.id });
  }
  toString = () => `finish(#${this.n})`;
}

class Fail implements Cmd {
  readonly n: number;
  readonly permanent: boolean;
  constructor(n: number, permanent: boolean) {
    this.n = n;
    this.permanent = permanent;
  }
  check = () => true;
  async run(m: Model, r: Real) {
    const lease = pick(r, this.n);
    if (!lease) return;
    const row = current(m, lease);
    const outcome = await r.inbox.fail(lease, "boom", { permanent: this.permanent });
    if (!row) return void assert.equal(outcome, undefined);
    if (this.permanent || row.attempts >= MAX_ATTEMPTS)
      Object.assign(row, { status: "failed", leasedUntil: null, token: null });
    else
      Object.assign(row, {
        status: "received",
        availableAt: (outcome as { retryAt: number }).retryAt,
        leasedUntil: null,
        token: null,
      });
  }
  toString = () => `fail(#${this.n}${this.permanent ? ", permanently" : ""})`;
}

class Release implements Cmd {
  readonly n: number;
  constructor(n: number) {
    this.n = n;
  }
  check = () => true;
  async run(m: Model, r: Real) {
    const lease = pick(r, this.n);
    if (!lease) return;
    const row = current(m, lease);
    assert.equal(await r.inbox.release(lease), row !== undefined);
    if (row)
      Object.assign(row, {
        status: "received",
        attempts: Math.max(0, row.attempts - 1),
        availableAt: m.now,
        leasedUntil: null,
        token: null,
      });
  }
  toString = () => `release(#${this.n})`;
}

class Retry implements Cmd {
  readonly n: number;
  constructor(n: number) {
    this.n = n;
  }
  check = (m: Readonly<Model>) => m.rows.size > 0;
  async run(m: Model, r: Real) {
    const row = [...m.rows.values()][this.n % m.rows.size]!;
    assert.equal(await r.inbox.retry({ id: row.id }), row.status === "failed" ? 1 : 0);
    if (row.status === "failed") Object.assign(row, { status: "received", attempts: 0, availableAt: m.now });
  }
  toString = () => `retry(#${this.n})`;
}

class Expire implements Cmd {
  readonly ms: number;
  constructor(ms: number) {
    this.ms = ms;
  }
  check = () => true;
  async run(m: Model, r: Real) {
    m.now += this.ms;
    r.clock.now += this.ms;
  }
  toString = () => `expire(+${this.ms} ms)`;
}

class Crash implements Cmd {
  check = () => true;
  async run(_m: Model, r: Real) {
    await r.inbox.close();
    r.inbox = await r.open();
  }
  toString = () => "crash";
}

const commands = [
  fc.tuple(fc.constantFrom(...KEYS), fc.integer({ min: 1, max: 12 })).map(([key, time]) => new Store(key, time)),
  fc.tuple(fc.constantFrom(...KEYS), fc.integer({ min: 1, max: 12 })).map(([key, time]) => new Store(key, time)),
  fc.integer({ min: 1, max: 4 }).map((n) => new Claim(n)),
  fc.integer({ min: 1, max: 4 }).map((n) => new Claim(n)),
  fc.nat(40).map((n) => new Finish(n)),
  fc.nat(40).map((n) => new Finish(n)),
  fc.tuple(fc.nat(40), fc.boolean()).map(([n, permanent]) => new Fail(n, permanent)),
  fc.nat(40).map((n) => new Release(n)),
  fc.nat(40).map((n) => new Retry(n)),
  fc.nat(40).map((n) => new Retry(n)),
  fc.tuple(fc.nat(40), fc.boolean()).map(([n, permanent]) => new Fail(n, permanent)),
  fc.constantFrom(1, DELAY, LEASE, 4 * DELAY).map((ms) => new Expire(ms)),
  fc.constant(new Crash()),
];

const pgSkip = await postgresSkip();
const { dir, cleanup } = tempDir("inbox-ordering-model-");
after(cleanup);
let runs = 0;
// Each SQLite history starts from a copy of one file connect() made and closed: the same empty, migrated
// inbox a new file would be, without running every migration again for each of the runs.
const template = join(dir, "template.db");
await (await connect(template)).close();
assert.ok(!existsSync(`${template}-wal`), "the template is one file, its log checkpointed");

const BACKENDS = [
  {
    name: "sqlite",
    skip: false as string | false,
    runs: RUNS,
    make: async () => {
      const target = join(dir, `model-${runs++}.db`);
      copyFileSync(template, target);
      return { target, drop: async () => {} };
    },
  },
  {
    name: "postgres",
    skip: pgSkip,
    runs: Math.max(5, Math.round(RUNS / 15)),
    // A copy of the template inbox (freshInbox()), as the SQLite half copies its file.
    make: async () => {
      const fresh = await freshInbox("ordmodel");
      return { target: fresh.url, drop: fresh.drop };
    },
  },
];

for (const backend of BACKENDS) {
  describe(`ordering against a model on ${backend.name}`, { skip: backend.skip }, () => {
    it(`holds over ${backend.runs} random histories: one at a time per key, in event time, stale exactly when a newer one was handled`, async () => {
      await fc.assert(
        fc.asyncProperty(fc.commands(commands, { maxCommands: 60, size: "max" }), async (cmds) => {
          const clock = { now: 1_000_000 };
          const { target, drop } = await backend.make();
          const open = () =>
            connect(target, {
              now: () => clock.now,
              maxAttempts: MAX_ATTEMPTS,
              retryDelayMs: DELAY,
              retryCapMs: 1_000,
              retryJitter: 0,
            });
          const real: Real = { clock, open, inbox: await open(), held: [] };
          try {
            await fc.asyncModelRun(() => ({ model: { now: clock.now, rows: new Map(), last: new Map() }, real }), cmds);
          } finally {
            await real.inbox.close();
            await drop();
          }
        }),
        { numRuns: backend.runs },
      );
    });
  });
}

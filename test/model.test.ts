// test/model.test.ts: a model-based test. fast-check drives random sequences of store, duplicate, claim,
// extend, finish, fail, expire (the pinned clock moves on), retry and crash (the database closed and
// reopened) against a real SqliteInbox on a real file, and against a plain in-memory model of what each should
// do. After every step the two must agree row for row.

import assert from "node:assert/strict";
import { copyFileSync, existsSync } from "node:fs";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import fc from "fast-check";
import { SqliteInbox } from "../lib/sqlite/sqlite.ts";
import type { Lease, Status, Tx } from "../lib/store.ts";
import { tempDir } from "./helpers.ts";

const MAX_ATTEMPTS = 3;
const LEASE = 500;
const DELAY = 100;
const CAP = 1_000;
const RUNS = Number(process.env.MODEL_RUNS ?? 400);

interface ModelRow {
  order: number;
  body: string;
  status: Status;
  attempts: number;
  availableAt: number;
  leasedUntil: number | null;
  token: string | null;
  effects: number;
}
interface Model {
  now: number;
  rows: Map<string, ModelRow>;
}
interface Real {
  clock: { now: number };
  path: string;
  inbox: SqliteInbox;
  /** Leases handed out so far, stale ones included: a worker may still hold one after a takeover. */
  held: Lease[];
}
type Cmd = fc.AsyncCommand<Model, Real>;

const { dir, cleanup } = tempDir("inbox-model-");
after(cleanup);
let runs = 0;

const open = (path: string, clock: { now: number }) =>
  new SqliteInbox(path, {
    now: () => clock.now,
    maxAttempts: MAX_ATTEMPTS,
    retryDelayMs: DELAY,
    retryCapMs: CAP,
    retryJitter: 0,
  });
// Each history starts from a copy of one file a SqliteInbox made and closed: the same empty, migrated inbox a
// new file would be, without running every migration again for each of the runs.
const template = join(dir, "template.db");
await open(template, { now: 0 }).close();
assert.ok(!existsSync(`${template}-wal`), "the template is one file, its log checkpointed");
const modelBackoff = (attempts: number) => Math.min(CAP, DELAY * 2 ** Math.max(0, attempts - 1));

// The model's claim: give up on expired last attempts, then the due rows by due time and arrival order.
function modelEligible(m: Model): string[] {
  for (const row of m.rows.values()) {
    if (row.status === "processing" && row.leasedUntil! <= m.now && row.attempts >= MAX_ATTEMPTS) {
      Object.assign(row, { status: "failed", leasedUntil: null, token: null });
    }
  }
  return [...m.rows.entries()]
    .filter(
      ([, r]) =>
        (r.status === "received" && r.availableAt <= m.now) || (r.status === "processing" && r.leasedUntil! <= m.now),
    )
    .sort(
      ([, a], [, b]) =>
        (a.status === "received" ? a.availableAt : a.leasedUntil!) -
          (b.status === "received" ? b.availableAt : b.leasedUntil!) || a.order - b.order,
    )
    .map(([id]) => id);
}

// agree compares every row of the database with the model, and checks the invariants on the way.
function agree(m: Model, r: Real): void {
  const rows = r.inbox.db
    .prepare(
      `SELECT d.id, d.status, d.attempts, d.available_at, d.leased_until, d.lease_token, coalesce(e.n, 0) AS effects
     FROM deliveries d LEFT JOIN (SELECT id, count(*) AS n FROM effects GROUP BY id) e USING (id)`,
    )
    .all() as {
    id: string;
    status: Status;
    attempts: number;
    available_at: number;
    leased_until: number | null;
    lease_token: string | null;
    effects: number;
  }[];
  assert.equal(rows.length, m.rows.size, "no delivery lost, none invented");
  for (const row of rows) {
    const want = m.rows.get(row.id);
    assert.ok(want, `unexpected row ${row.id}`);
    assert.ok(row.attempts <= MAX_ATTEMPTS, `${row.id} has ${row.attempts} attempts`);
    assert.deepEqual(
      {
        status: row.status,
        attempts: row.attempts,
        leasedUntil: row.leased_until,
        token: row.lease_token,
        effects: row.effects,
      },
      {
        status: want.status,
        attempts: want.attempts,
        leasedUntil: want.leasedUntil,
        token: want.token,
        effects: want.effects,
      },
      row.id,
    );
    if (row.status === "received") assert.equal(row.available_at, want.availableAt, `${row.id} due time`);
    assert.ok(row.effects <= 1, `${row.id}: local effect applied ${row.effects} times`);
  }
}

const pickLease = (r: Real, i: number) => r.held[i % r.held.length]!;

class Store implements Cmd {
  readonly id: string;
  readonly body: string;
  constructor(id: string, body: string) {
    this.id = id;
    this.body = body;
  }
  check = () => true;
  async run(m: Model, r: Real) {
    const existing = m.rows.get(this.id);
    const outcome = await r.inbox.store({ id: this.id, body: Buffer.from(this.body) });
    assert.equal(outcome, !existing ? "stored" : existing.body === this.body ? "duplicate" : "conflict");
    if (!existing) {
      m.rows.set(this.id, {
        order: m.rows.size,
        body: this.body,
        status: "received",
        attempts: 0,
        availableAt: m.now,
        leasedUntil: null,
        token: null,
        effects: 0,
      });
    }
    agree(m, r);
  }
  toString = () => `store(${this.id}, ${this.body})`;
}

class Duplicate implements Cmd {
  readonly pick: number;
  constructor(pick: number) {
    this.pick = pick;
  }
  check = (m: Readonly<Model>) => m.rows.size > 0;
  async run(m: Model, r: Real) {
    const [id, row] = [...m.rows.entries()][this.pick % m.rows.size]!;
    assert.equal(await r.inbox.store({ id, body: Buffer.from(row.body) }), "duplicate");
    agree(m, r);
  }
  toString = () => `duplicate(#${this.pick})`;
}

class Claim implements Cmd {
  readonly limit: number;
  constructor(limit: number) {
    this.limit = limit;
  }
  check = () => true;
  async run(m: Model, r: Real) {
    const eligible = modelEligible(m);
    const leases = await r.inbox.claimBatch(this.limit, LEASE);
    assert.deepEqual(
      leases.map((l) => l.id).sort(),
      eligible.slice(0, this.limit).sort(),
      "claims exactly the due deliveries, oldest first",
    );
    for (const lease of leases) {
      Object.assign(m.rows.get(lease.id)!, {
        status: "processing",
        attempts: lease.attempts,
        leasedUntil: m.now + LEASE,
        token: lease.token,
      });
      r.held.push(lease);
    }
    if (eligible.length <= this.limit) {
      const expired = [...m.rows.values()].filter((row) => row.status === "processing" && row.leasedUntil! <= m.now);
      assert.equal(expired.length, 0, "no expired lease is left after a claim pass");
    }
    agree(m, r);
  }
  toString = () => `claim(${this.limit})`;
}

const current = (m: Model, lease: Lease) => {
  const row = m.rows.get(lease.id)!;
  return row.status === "processing" && row.token === lease.token ? row : undefined;
};

class Extend implements Cmd {
  readonly pick: number;
  constructor(pick: number) {
    this.pick = pick;
  }
  check = (m: Readonly<Model>) => m.rows.size > 0;
  async run(m: Model, r: Real) {
    if (r.held.length === 0) return;
    const lease = pickLease(r, this.pick);
    const row = current(m, lease);
    assert.equal(await r.inbox.extend(lease, LEASE), row !== undefined);
    if (row) row.leasedUntil = m.now + LEASE;
    agree(m, r);
  }
  toString = () => `extend(#${this.pick})`;
}

class Finish implements Cmd {
  readonly pick: number;
  readonly write: boolean;
  constructor(pick: number, write: boolean) {
    this.pick = pick;
    this.write = write;
  }
  check = (m: Readonly<Model>) => m.rows.size > 0;
  async run(m: Model, r: Real) {
    if (r.held.length === 0) return;
    const lease = pickLease(r, this.pick);
    const row = current(m, lease);
    const writes = this.write ? [(tx: Tx) => tx.run("INSERT INTO effects VALUES (?)", lease.id)] : [];
    assert.equal(await r.inbox.finish(lease, writes), row !== undefined, "only the current lease may finish");
    if (row)
      Object.assign(row, {
        status: "done",
        leasedUntil: null,
        token: null,
        effects: row.effects + (this.write ? 1 : 0),
      });
    agree(m, r);
  }
  toString = () => `finish(#${this.pick}${this.write ? ", with a write" : ""})`;
}

class Fail implements Cmd {
  readonly pick: number;
  readonly permanent: boolean;
  constructor(pick: number, permanent: boolean) {
    this.pick = pick;
    this.permanent = permanent;
  }
  check = (m: Readonly<Model>) => m.rows.size > 0;
  async run(m: Model, r: Real) {
    if (r.held.length === 0) return;
    const lease = pickLease(r, this.pick);
    const row = current(m, lease);
    const outcome = await r.inbox.fail(lease, "boom", { permanent: this.permanent });
    if (!row) return void assert.equal(outcome, undefined, "a lost lease cannot record a failure");
    if (this.permanent || row.attempts >= MAX_ATTEMPTS) {
      assert.deepEqual(outcome, { status: "failed" });
      Object.assign(row, { status: "failed", leasedUntil: null, token: null });
    } else {
      const retryAt = m.now + modelBackoff(row.attempts);
      assert.deepEqual(outcome, { status: "received", retryAt });
      Object.assign(row, { status: "received", availableAt: retryAt, leasedUntil: null, token: null });
    }
    agree(m, r);
  }
  toString = () => `fail(#${this.pick}${this.permanent ? ", permanently" : ""})`;
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

class Retry implements Cmd {
  readonly pick: number;
  constructor(pick: number) {
    this.pick = pick;
  }
  check = (m: Readonly<Model>) => m.rows.size > 0;
  async run(m: Model, r: Real) {
    const [id, row] = [...m.rows.entries()][this.pick % m.rows.size]!;
    assert.equal(await r.inbox.retry({ id }), row.status === "failed" ? 1 : 0);
    if (row.status === "failed") Object.assign(row, { status: "received", attempts: 0, availableAt: m.now });
    agree(m, r);
  }
  toString = () => `retry(#${this.pick})`;
}

class Crash implements Cmd {
  check = () => true;
  async run(m: Model, r: Real) {
    await r.inbox.close();
    r.inbox = open(r.path, r.clock);
    agree(m, r);
  }
  toString = () => "crash";
}

const commands = [
  fc
    .tuple(fc.constantFrom("a", "b", "c", "d", "e", "f"), fc.constantFrom("{}", '{"x":1}'))
    .map(([id, body]) => new Store(id, body)),
  fc.nat(50).map((n) => new Duplicate(n)),
  fc.integer({ min: 1, max: 8 }).map((n) => new Claim(n)),
  fc.nat(50).map((n) => new Extend(n)),
  fc.tuple(fc.nat(50), fc.boolean()).map(([n, write]) => new Finish(n, write)),
  fc.tuple(fc.nat(50), fc.boolean()).map(([n, permanent]) => new Fail(n, permanent)),
  fc.constantFrom(1, DELAY, LEASE / 2, LEASE, LEASE + 1, CAP, 5 * LEASE).map((ms) => new Expire(ms)),
  fc.nat(50).map((n) => new Retry(n)),
  fc.constant(new Crash()),
];

describe("the inbox against a model", () => {
  it(`never diverges over ${RUNS} random histories: nothing lost, attempts within the maximum, no expired lease after a claim pass`, async () => {
    await fc.assert(
      fc.asyncProperty(fc.commands(commands, { maxCommands: 60 }), async (cmds) => {
        const clock = { now: 1_000_000 };
        const path = join(dir, `model-${runs++}.db`);
        copyFileSync(template, path);
        const real: Real = { clock, path, inbox: open(path, clock), held: [] };
        real.inbox.db.exec("CREATE TABLE effects (id TEXT NOT NULL)");
        try {
          await fc.asyncModelRun(() => ({ model: { now: clock.now, rows: new Map() }, real }), cmds);
        } finally {
          await real.inbox.close();
        }
      }),
      { numRuns: RUNS },
    );
  });
});

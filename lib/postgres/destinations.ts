// postgres/destinations.ts: a destination's gate on PostgreSQL, its row in `destinations`: pause and resume
// (each audited in its own transaction), the permit a forwarder asks before a wave (a pause read, or a rate's
// tokens), the breaker's tally of a wave's answers, and the row made once per process outside any batch.
// Held by PostgresInbox, whose claim locks the same row through lock(); its ops go through the inbox's queue.

import type pg from "pg";
import { breakerAfter, checkClaim, checkPermit, gatePermit } from "../breaker.ts";
import type { Audit, BreakerChange, BreakerPolicy, Permit, Rate, Tally } from "../store.ts";
import { NOW, type Locks } from "./commit.ts";
import type { Pool } from "./pool.ts";
import { writeAudit } from "./records.ts";

/** GatesQueue is what PostgresGates needs of its inbox: the pool, the clock, the commit queue, NOTIFY, named plans. */
export interface GatesQueue {
  pool: Pool;
  pinned: (() => number) | undefined;
  /** other queues an op of its own in the next batch (PostgresCommitter's). */
  other(run: (client: pg.PoolClient) => Promise<unknown>, together?: boolean, locks?: Locks): Promise<unknown>;
  notify(client: pg.PoolClient, added: number): void;
  prepared(text: string, values: unknown[]): pg.QueryConfig;
}

/** PostgresGates is the destinations' rows of a PostgresInbox: pause, resume, permits and the breaker. */
export class PostgresGates {
  // The destinations whose row this process has made sure of (see made).
  private madeRows = new Map<string, Promise<void>>();

  private readonly queue: GatesQueue;

  constructor(queue: GatesQueue) {
    this.queue = queue;
  }

  // now is the time every statement takes as $1 (NOW): the pinned clock, else null and the database's own.
  private now(): number | null {
    return this.queue.pinned ? this.queue.pinned() : null;
  }

  async pause(destination: string, reason: string = "paused by a person", audit?: Audit): Promise<boolean> {
    checkClaim({ destination });
    await this.made(destination);
    return this.queue.other(
      async (client) => {
        const { rowCount } = await client.query(
          `INSERT INTO destinations AS d (name, paused, paused_reason, changed_at) VALUES ($2, true, $3, ${NOW})
         ON CONFLICT (name) DO UPDATE SET paused = true, paused_reason = $3, changed_at = ${NOW} WHERE NOT d.paused`,
          [this.now(), destination, reason],
        );
        await writeAudit(client, audit, rowCount ?? 0, this.now());
        return rowCount === 1;
      },
      false,
      { destination },
    ) as Promise<boolean>;
  }

  async resume(destination: string, audit?: Audit): Promise<boolean> {
    checkClaim({ destination });
    return this.queue.other(
      async (client) => {
        const { rowCount } = await client.query(
          `UPDATE destinations SET paused = false, paused_reason = NULL, state = 'closed', failures = 0, window_start = NULL,
                window_done = 0, window_failed = 0, retry_at = NULL, probe_until = NULL, changed_at = ${NOW}
         WHERE name = $2 AND paused`,
          [this.now(), destination],
        );
        await writeAudit(client, audit, rowCount ?? 0, this.now());
        if (rowCount === 1) this.queue.notify(client, 1);
        return rowCount === 1;
      },
      false,
      { destination },
    ) as Promise<boolean>;
  }

  permit(destination: string, n: number, rate?: Rate): Promise<Permit> {
    checkPermit(destination, n, rate);
    // Without a rate, one read: a pause committed before it is seen, and nothing is locked or written.
    if (!rate) {
      return this.queue.pool
        .query(this.queue.prepared("SELECT paused FROM destinations WHERE name = $1", [destination]))
        .then(({ rows }) => {
          const { tokens: _, ...permit } = gatePermit(rows[0], n, 0, undefined);
          return permit;
        });
    }
    return this.made(destination).then(() =>
      this.queue.other(
        async (client) => {
          const row = await this.lock(client, destination);
          const now = Number(row.now);
          const { tokens, ...answer } = gatePermit(row, n, now, rate);
          if (tokens !== null)
            await client.query("UPDATE destinations SET tokens = $1, tokens_at = $2 WHERE name = $3", [
              tokens,
              now,
              destination,
            ]);
          return answer;
        },
        false,
        { destination },
      ),
    ) as Promise<Permit>;
  }

  // made makes a destination's row, once per process, in a statement of its own outside any batch. Made
  // inside a batch, a new row is locked outside the one order: a batch whose insert of it waited on
  // another's uncommitted insert, while holding a row that one then locked for update, deadlocked in the
  // forwarding torture when four workers started at once. Once per process: a row that goes missing after
  // all (an operator's DELETE, a failover that lost its commit) is made again after lockDestination says so.
  made(destination: string): Promise<void> {
    let made = this.madeRows.get(destination);
    if (made === undefined) {
      made = this.queue.pool
        .query("INSERT INTO destinations (name) VALUES ($1) ON CONFLICT (name) DO NOTHING", [destination])
        .then(() => {});
      this.madeRows.set(destination, made);
      made.catch(() => this.madeRows.delete(destination));
    }
    return made;
  }

  // lockDestination reads a destination's row, made by made(), FOR UPDATE with the database's clock.
  async lock(client: pg.PoolClient, destination: string): Promise<Record<string, unknown>> {
    const {
      rows: [row],
    } = await client.query(`SELECT *, ${NOW} AS now FROM destinations WHERE name = $2 FOR UPDATE`, [
      this.now(),
      destination,
    ]);
    if (row !== undefined) return row as Record<string, unknown>;
    this.madeRows.delete(destination);
    throw new Error(`destination ${JSON.stringify(destination)} has no row; it is made again on the next try`);
  }

  tally(destination: string, tally: Tally, policy: BreakerPolicy): Promise<BreakerChange | undefined> {
    checkClaim({ destination });
    return this.made(destination).then(() =>
      this.queue.other(
        async (client) => {
          const row = await this.lock(client, destination);
          const next = breakerAfter(row, tally, policy, Number(row.now));
          const r = next.row;
          await client.query(
            `UPDATE destinations SET state = $1, retry_at = $2, failures = $3, window_start = $4, window_done = $5, window_failed = $6,
                last_error = $7, last_error_at = $8, changed_at = CASE WHEN state <> $1 THEN $9 ELSE changed_at END
         WHERE name = $10`,
            [
              r.state,
              r.retry_at,
              r.failures,
              r.window_start,
              r.window_done,
              r.window_failed,
              r.last_error,
              r.last_error_at,
              Number(row.now),
              destination,
            ],
          );
          return next.change;
        },
        false,
        { destination },
      ),
    ) as Promise<BreakerChange | undefined>;
  }
}

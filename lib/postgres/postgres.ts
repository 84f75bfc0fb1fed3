// postgres/postgres.ts: the Inbox on PostgreSQL, for receivers and workers on many hosts sharing one database: a
// delivery's whole life and the operator's bulk actions, as SQL, on the schema of postgres/schema.ts, its
// writes batched and committed by postgres/commit.ts, its reads in postgres/reads.ts. The contract of
// store.ts, beside SqliteInbox in sqlite.ts; every script picks it when --db or INBOX_DB is a URL:
//   INBOX_DB=postgres://127.0.0.1:5432/test?schema=inbox npx tsx receiver.ts
// ?schema=NAME keeps the tables in a schema of their own; ?listen=false polls without LISTEN (PgBouncer).
// Several hosts (postgres://h1:5432,h2:5433/db) follow a failover; postgres/pool.ts holds the connections.

import type pg from "pg";
import { DEFAULTS } from "../defaults.ts";
import { message } from "../log.ts";
import { BY_DEFAULT, BY_INDEX, mergedInserts, NO_FLUSH, type Op } from "./commit.ts";
import { NOW, PostgresReads, toPg } from "./reads.ts";
import { migrate } from "./schema.ts";
import {
  DESTINATION_NAME,
  NO_DESTINATION,
  type Permit,
  type Rate,
  type BreakerChange,
  type BreakerPolicy,
  type ClaimOptions,
  type FailOptions,
  type Tally,
  type Backend,
  type BulkOptions,
  type Cursor,
  type Delivery,
  type Failure,
  type Filter,
  type Inbox,
  type InboxOptions,
  type Incoming,
  type Lease,
  type LocalWrite,
  type Purged,
  type PurgeOptions,
  type SetAside,
  type SqlValue,
  type Stored,
  type Tx,
} from "../store.ts";
import { breakerAfter, checkClaim, gateClaim, checkPermit, gatePermit, tellSetAside } from "../breaker.ts";
import { routesOf, bulkBatchSize, checkOptions, orderOf, purgeCutoffs } from "../checks.ts";
import { sha256, toDelivery } from "../rows.ts";
import { filterSql } from "../sql.ts";
import { retryDelay, paced } from "../timing.ts";

export { redact } from "./pool.ts";

// concatenated puts a batch's bodies in one buffer, with each body's 1-based offset and length for
// substring(): pg sends a Buffer parameter as binary, where an array of them goes as a text literal with
// every body hex-encoded, which the server then parses back. A body given more than once (a delivery's
// rows for its other routes) is sent once, each row pointing at it.
function concatenated(bodies: Uint8Array[]): { all: Buffer; offsets: number[]; lengths: number[] } {
  const offsets: number[] = [];
  const lengths: number[] = [];
  const parts: Uint8Array[] = [];
  const placed = new Map<Uint8Array, number>();
  let at = 1;
  for (const body of bodies) {
    let offset = placed.get(body);
    if (offset === undefined) {
      placed.set(body, (offset = at));
      parts.push(body);
      at += body.byteLength;
    }
    offsets.push(offset);
    lengths.push(body.byteLength);
  }
  return { all: Buffer.concat(parts), offsets, lengths };
}

// byKey sorts a batch's deliveries by (source, id), the one order every transaction takes their rows in.
function byKey<T extends { source: string; incoming: { id: string } }>(ops: T[]): T[] {
  return ops.sort((a, b) =>
    a.source < b.source
      ? -1
      : a.source > b.source
        ? 1
        : a.incoming.id < b.incoming.id
          ? -1
          : a.incoming.id > b.incoming.id
            ? 1
            : 0,
  );
}

/** PostgresInbox is the Inbox on a PostgreSQL database; open it with PostgresInbox.open or connect(). */
export class PostgresInbox extends PostgresReads implements Inbox {
  readonly backend: Backend = "postgres";
  private readonly random: () => number;
  private readonly maxAttempts: number;
  private readonly backoffOptions: { retryDelayMs: number; retryCapMs: number; retryJitter: number };
  // The keyset claim's cursor per destination: the due time this process's claims have walked to, and
  // when they last started from the start (see claimIn).
  private claimFrom = new Map<string, { at: number; fromStartAt: number }>();
  // The destinations whose row this process has made sure of (see made).
  private madeRows = new Map<string, Promise<void>>();

  private constructor(url: string, options: InboxOptions) {
    checkOptions(options);
    super(url, options);
    this.random = options.random ?? Math.random;
    this.maxAttempts = Math.max(1, options.maxAttempts ?? DEFAULTS.maxAttempts);
    this.backoffOptions = {
      retryDelayMs: options.retryDelayMs ?? DEFAULTS.retryDelayMs,
      retryCapMs: options.retryCapMs ?? DEFAULTS.retryCapMs,
      retryJitter: options.retryJitter ?? DEFAULTS.retryJitter,
    };
  }

  /** open connects, migrates under an advisory lock (ten hosts starting at once migrate once), and checks the schema. */
  static async open(url: string, options: InboxOptions = {}): Promise<PostgresInbox> {
    const inbox = new PostgresInbox(url, options);
    try {
      await migrate(inbox.pool, inbox.schema);
    } catch (error) {
      await inbox.pool.end().catch(() => {});
      throw new Error(`open ${inbox.target}: ${message(error)}`, { cause: error });
    }
    return inbox;
  }

  store(delivery: Incoming): Promise<Stored> {
    const source = delivery.source ?? DEFAULTS.source;
    orderOf(delivery, null);
    const routes = routesOf(delivery);
    return this.enqueue({
      kind: "store",
      source,
      incoming: delivery,
      digest: sha256(delivery.body),
      routes,
    }) as Promise<Stored>;
  }

  async claim(leaseMs: number = DEFAULTS.leaseMs, options: ClaimOptions = {}): Promise<Lease | undefined> {
    return (await this.claimBatch(1, leaseMs, options))[0];
  }

  claimBatch(limit: number, leaseMs: number = DEFAULTS.leaseMs, options: ClaimOptions = {}): Promise<Lease[]> {
    if (!Number.isInteger(limit) || limit < 1) throw new TypeError(`claimBatch: expected limit >= 1, got ${limit}`);
    const destination = checkClaim(options);
    let setAside: SetAside[] = [];
    const claim = () =>
      this.enqueue({
        kind: "claim",
        locks: { destination },
        run: (client: pg.PoolClient) => {
          setAside = [];
          return this.gatedClaim(client, limit, leaseMs, destination, options, setAside);
        },
      }) as Promise<Lease[]>;
    // A limited claim locks the destination's row, which made() makes outside any batch (rule 3 of
    // docs/postgres.md); a plain claim goes straight to the queue.
    const limited = options.maxInFlight !== undefined || options.rate !== undefined;
    return tellSetAside(limited ? this.made(destination).then(claim) : claim(), options, () => setAside);
  }

  // gatedClaim asks the destination's row how many may be claimed (gateClaim), claims them, and writes back
  // the probe and the rate's tokens. The row is locked only when a limit or the breaker needs it, so the
  // claims of a destination with neither never wait on one another.
  private async gatedClaim(
    client: pg.PoolClient,
    limit: number,
    leaseMs: number,
    destination: string,
    options: ClaimOptions,
    setAside: SetAside[],
  ): Promise<Lease[]> {
    const read = await client.query("SELECT *, " + NOW + " AS now FROM destinations WHERE name = $2", [
      this.now(),
      destination,
    ]);
    let row = read.rows[0] as Record<string, unknown> | undefined;
    const plain =
      options.maxInFlight === undefined &&
      options.rate === undefined &&
      (row === undefined || (!row.paused && row.state === "closed"));
    if (plain) return this.claimIn(client, limit, leaseMs, destination, setAside);
    // A destination that is paused, or whose breaker is open, costs its lane this one read: no lock, no write.
    if (row !== undefined && gateClaim(row, limit, Number(row.now), {}, 0).n === 0) return [];
    row = await this.lockDestination(client, destination);
    const now = Number(row.now);
    const inFlight =
      options.maxInFlight === undefined
        ? 0
        : Number(
            (
              await client.query(
                `SELECT count(*) AS n FROM deliveries WHERE destination = $1 AND status = 'processing' AND leased_until > $2`,
                [destination, now],
              )
            ).rows[0].n,
          );
    const gate = gateClaim(row, limit, now, options, inFlight);
    const leases = gate.n === 0 ? [] : await this.claimIn(client, gate.n, leaseMs, destination, setAside);
    if (gate.probe && leases.length > 0) {
      await client.query(
        "UPDATE destinations SET state = 'probing', probe_until = $1, changed_at = $2 WHERE name = $3",
        [now + leaseMs, now, destination],
      );
      leases[0]!.probe = true;
    }
    if (gate.tokens !== null) {
      await client.query("UPDATE destinations SET tokens = $1, tokens_at = $2 WHERE name = $3", [
        gate.tokens - leases.length,
        now,
        destination,
      ]);
    }
    return leases;
  }

  // claimIn leases up to limit due deliveries of a destination. A keyset claim starts its walk of the due
  // index where this process's last full claim of that destination ended (from); a walk from the start
  // passes every entry that the drain has left dead behind it, which autovacuum has not cleared (or never
  // will, where it is off). Every due time set later (a store, a retry, a lease's end, a release) is at or
  // after the moment it is set, and the cursor is never past the moment of the claim that set it, so a row
  // falls behind the cursor only when a claim skipped it as locked and then that lock went away (another
  // claim rolled back) or when the database's clock stepped back. So a keyset claim that comes back short
  // goes on from the start, and one claim in DEFAULTS.claimFromStartMs starts there anyway, which bounds
  // the wait of such a row under a backlog that never runs dry.
  private async claimIn(
    client: pg.PoolClient,
    limit: number,
    leaseMs: number,
    destination: string,
    setAside: SetAside[],
    again = true,
    keyset = true,
  ): Promise<Lease[]> {
    // Pacing, not a due time: a pinned clock (tests) drives it, else this host's monotonic one.
    const now = this.pinned ? this.pinned() : performance.now();
    const cursor = this.claimFrom.get(destination);
    const from =
      keyset && cursor !== undefined && now - cursor.fromStartAt < DEFAULTS.claimFromStartMs ? cursor.at : undefined;
    const fromStartAt = from === undefined ? now : cursor!.fromStartAt;
    {
      // One statement: pick what is due, skipping rows another worker is claiming right now, and lease it.
      // A delivery whose lease ran out on its last attempt (its worker crashed) is set aside instead.
      // Ordered deliveries are reached only as the head of an idle key (k), whose row lock keeps another
      // host from running the same key; the head rows of the keys claimed then say the key runs (due NULL).
      // Index scans and nested loops only, the plan the planner picks anyway once it has statistics. A table
      // filled faster than autovacuum analyzes it has none, and the planner then sorted every waiting row on
      // disk and hash-joined all of them for each claim: 118 ms against 5 ms at a fresh 100k backlog, a
      // drain at 4.3k/s against 14k/s. The claim has a transaction of its own, so these touch nothing else.
      // Its commit does not wait for the WAL to reach the disk (synchronous_commit off, in this transaction
      // only): a claim that a crash of the server takes back is a delivery claimed again, as when a worker
      // dies, and the done mark, whose commit does wait, carries the claim with it (the WAL is written in
      // order). Waiting for a flush of its own made every claim as slow as a commit of stored deliveries.
      // One random token per claim, each row's ordinal after it: fencing needs only a token that no other
      // claim of the row had, and gen_random_uuid() per row cost the server about 6 µs of CPU a delivery.
      // RETURNING names the columns a lease is made of: d.* (lease_ms, arrival, available_at besides) cost
      // it several µs a row more, measured in docs/performance.md.
      client.query(this.prepared(BY_INDEX, [])).catch(() => {}); // a failure shows in the claim itself, which waits behind it on the connection
      client.query(this.prepared(NO_FLUSH, [])).catch(() => {});
      const { rows } = await client.query(
        this.prepared(
          `WITH k AS (
           SELECT source, destination, order_key, head_id, due FROM order_keys WHERE destination = $5 AND due <= ${NOW}
           ORDER BY due LIMIT $2::integer FOR UPDATE SKIP LOCKED),
         u AS (
           SELECT source, id, route, available_at AS due, (status = 'processing' AND attempts >= $4) AS gave_up,
                  status = 'processing' AS takeover FROM deliveries
           WHERE destination = $5 AND ((status = 'received' AND order_key IS NULL) OR status = 'processing')
             AND available_at >= $6::bigint AND available_at <= ${NOW}
           ORDER BY available_at LIMIT $2::integer FOR UPDATE SKIP LOCKED),
         p AS (
           SELECT *, row_number() OVER () AS n FROM (
             SELECT * FROM (SELECT source, id, route, due, gave_up, takeover, true AS walked FROM u
                            UNION ALL
                            SELECT k.source, k.head_id, d.route, k.due, false, false, false FROM k
                            JOIN deliveries d ON d.source = k.source AND d.id = k.head_id AND d.destination = k.destination) x
             ORDER BY due LIMIT $2::integer) y),
         c AS (
         UPDATE deliveries d SET
           status       = CASE WHEN gave_up THEN 'failed' ELSE 'processing' END,
           attempts     = CASE WHEN gave_up THEN d.attempts ELSE d.attempts + 1 END,
           leased_until = CASE WHEN gave_up THEN NULL ELSE ${NOW} + $3::bigint END,
           available_at = CASE WHEN gave_up THEN d.available_at ELSE ${NOW} + $3::bigint END,
           lease_ms     = $3::integer,
           lease_token  = CASE WHEN gave_up THEN NULL ELSE (SELECT gen_random_uuid()::text) || '-' || p.n END,
           error        = CASE WHEN gave_up THEN 'gave up: the lease expired on the last attempt (the worker crashed or hung)' ELSE d.error END,
           finished_at  = CASE WHEN gave_up THEN ${NOW} ELSE d.finished_at END,
           newer_id     = CASE WHEN d.order_key IS NULL THEN NULL ELSE
                            (SELECT CASE WHEN o.last_event_time > d.event_time THEN o.last_id END FROM order_keys o
                             WHERE o.source = d.source AND o.destination = d.destination AND o.order_key = d.order_key) END
         FROM p WHERE d.source = p.source AND d.id = p.id AND d.route = p.route AND d.status IN ('received', 'processing')
         RETURNING d.source, d.id, d.route, d.destination, d.body, d.body_sha256, d.content_type, d.event_type, d.provider_time,
                   d.received_at, d.status, d.attempts, d.leased_until, d.lease_token, d.error, d.conflicts, d.finished_at,
                   d.replays, d.purged_at, d.order_key, d.event_time, d.newer_id, d.headers, d.traceparent, p.due, p.takeover, p.walked),
         busy AS (
           UPDATE order_keys o SET due = NULL FROM k
           WHERE o.source = k.source AND o.destination = k.destination AND o.order_key = k.order_key
             AND EXISTS (SELECT 1 FROM c WHERE c.source = k.source AND c.id = k.head_id))
         SELECT * FROM c`,
          [this.now(), limit, leaseMs, this.maxAttempts, destination, from ?? Number.MIN_SAFE_INTEGER],
        ),
      );
      // The next claim starts at the last due time this one walked to; the rows at that same time that it
      // left (locked, or past the limit) are still ahead of a cursor that takes >=.
      const walked = rows.filter((row) => row.walked);
      const at = walked.length > 0 ? Math.max(...walked.map((row) => row.due as number)) : from;
      if (at === undefined) this.claimFrom.delete(destination);
      else this.claimFrom.set(destination, { at, fromStartAt });
      const failed = rows.filter((row) => row.status === "failed");
      for (const row of failed)
        setAside.push({ source: row.source, id: row.id, destination, attempts: row.attempts, error: row.error });
      const gaveUp = failed.filter((row) => row.order_key !== null);
      if (gaveUp.length > 0) {
        await this.settleKeys(
          client,
          gaveUp.map((row) => ({
            source: row.source,
            destination: row.destination,
            key: row.order_key,
            from: row.id,
            setAside: true,
          })),
        );
      }
      const leases: Lease[] = [];
      // A delivery set aside just now took a place of the limit, and a key whose head it was has a new head,
      // due already: claim as many more in this same pass.
      const claimed = rows.filter((row) => row.status === "processing").length;
      if (failed.length > 0 && again && claimed < limit)
        leases.push(...(await this.claimIn(client, limit - claimed, leaseMs, destination, setAside, false)));
      // Short from the cursor: what is left may be behind it.
      else if (from !== undefined && rows.length < limit) {
        this.claimFrom.delete(destination);
        leases.push(...(await this.claimIn(client, limit - claimed, leaseMs, destination, setAside, again, false)));
      }
      for (const row of rows.sort((a, b) => a.due - b.due || a.received_at - b.received_at)) {
        if (row.status !== "processing") continue;
        const lease = toDelivery(row) as Lease;
        lease.availableAt = row.due;
        lease.token = row.lease_token;
        if (row.takeover) lease.takeover = true;
        leases.push(lease);
      }
      return leases.sort((a, b) => a.availableAt - b.availableAt || a.receivedAt - b.receivedAt);
    }
  }

  extend(lease: Lease, leaseMs: number = DEFAULTS.leaseMs): Promise<boolean> {
    return this.other(async (client) => {
      // The lease's own row and no other: the delivery's other routes are other lanes' leases, and a
      // heartbeat that locked them held up their done marks and failures (the deadlock of issue 26).
      // SKIP LOCKED: a heartbeat never waits on its own row. That row is locked only by this lease's
      // finish or fail in flight (or a takeover's claim); a row busy that way still holds the lease as far
      // as anyone has committed, and the next heartbeat extends it if that transaction rolls back. NO KEY:
      // the lock an UPDATE takes, which leaves a receiver's FOR KEY SHARE on route 0 alone.
      const { rows } = await client.query(
        `WITH l AS (SELECT source, id, route FROM deliveries WHERE source = $3 AND id = $4 AND route = $6 FOR NO KEY UPDATE SKIP LOCKED)
         UPDATE deliveries d SET leased_until = ${NOW} + $2::bigint, available_at = ${NOW} + $2::bigint, lease_ms = $2::integer
         FROM l WHERE d.source = l.source AND d.id = l.id AND d.route = l.route AND d.lease_token = $5 AND d.status = 'processing'
         RETURNING d.leased_until`,
        [this.now(), leaseMs, lease.source, lease.id, lease.token, lease.route],
      );
      if (rows.length === 1) {
        lease.leasedUntil = rows[0].leased_until;
        return true;
      }
      const held = await client.query(
        "SELECT 1 FROM deliveries WHERE source = $1 AND id = $2 AND route = $4 AND lease_token = $3 AND status = 'processing'",
        [lease.source, lease.id, lease.token, lease.route],
      );
      return held.rows.length === 1;
    }, true) as Promise<boolean>;
  }

  finish(lease: Lease, writes: readonly LocalWrite[] = []): Promise<boolean> {
    return this.enqueue({ kind: "finish", lease, writes }) as Promise<boolean>;
  }

  fail(lease: Lease, error: string, options: FailOptions = {}): Promise<Failure | undefined> {
    const delay = retryDelay(lease.attempts, options, { ...this.backoffOptions, random: this.random });
    return this.other(
      async (client) => {
        const { rows } = await client.query(
          `UPDATE deliveries SET
           status       = CASE WHEN $2::boolean OR attempts >= $3 THEN 'failed' ELSE 'received' END,
           available_at = CASE WHEN $2::boolean OR attempts >= $3 THEN available_at ELSE ${NOW} + $4::bigint END,
           finished_at  = CASE WHEN $2::boolean OR attempts >= $3 THEN ${NOW} ELSE NULL END,
           error = $5, leased_until = NULL, lease_token = NULL
         WHERE source = $6 AND id = $7 AND route = $9 AND lease_token = $8 AND status = 'processing'
         RETURNING status, available_at, attempts`,
          [
            this.now(),
            options.permanent === true,
            this.maxAttempts,
            delay,
            error,
            lease.source,
            lease.id,
            lease.token,
            lease.route,
          ],
        );
        if (rows.length === 0) return undefined;
        await client.query(
          `INSERT INTO attempt_errors (source, id, attempt, error, failed_at, destination) VALUES ($2, $3, $4, $5, ${NOW}, $6)`,
          [this.now(), lease.source, lease.id, rows[0].attempts, error, lease.destination],
        );
        if (lease.orderKey !== null) {
          await this.settleKeys(client, [
            {
              source: lease.source,
              destination: lease.destination,
              key: lease.orderKey,
              from: lease.id,
              setAside: rows[0].status === "failed",
            },
          ]);
        }
        return rows[0].status === "failed"
          ? { status: "failed" }
          : { status: "received", retryAt: rows[0].available_at };
      },
      true,
      { lease },
    ) as Promise<Failure | undefined>;
  }

  release(lease: Lease): Promise<boolean> {
    return this.other(
      async (client) => {
        const { rowCount } = await client.query(
          `UPDATE deliveries SET status = 'received', attempts = greatest(attempts - 1, 0), leased_until = NULL,
                lease_token = NULL, available_at = ${NOW}
         WHERE source = $2 AND id = $3 AND route = $5 AND lease_token = $4 AND status = 'processing'`,
          [this.now(), lease.source, lease.id, lease.token, lease.route],
        );
        if (rowCount === 1 && lease.orderKey !== null) {
          await this.settleKeys(client, [
            {
              source: lease.source,
              destination: lease.destination,
              key: lease.orderKey,
              from: lease.id,
              setAside: false,
            },
          ]);
        }
        return rowCount === 1;
      },
      true,
      { lease },
    ) as Promise<boolean>;
  }

  retry(target: { source?: string; id: string } | { allFailed: true }): Promise<number> {
    return this.other(async (client) => {
      const { rows } =
        "allFailed" in target
          ? await client.query(
              `UPDATE deliveries SET status = 'received', attempts = 0, error = NULL, available_at = ${NOW}, finished_at = NULL
           WHERE status = 'failed' AND purged_at IS NULL RETURNING source, id, order_key, destination`,
              [this.now()],
            )
          : await client.query(
              `UPDATE deliveries SET status = 'received', attempts = 0, error = NULL, available_at = ${NOW}, finished_at = NULL
           WHERE source = $2 AND id = $3 AND status = 'failed' AND purged_at IS NULL RETURNING source, id, order_key, destination`,
              [this.now(), target.source ?? DEFAULTS.source, target.id],
            );
      const ordered = rows.filter((r) => r.order_key !== null);
      if (ordered.length > 0) {
        await this.settleKeys(
          client,
          ordered.map((r) => ({
            source: r.source,
            destination: r.destination,
            key: r.order_key,
            from: r.id,
            setAside: false,
          })),
        );
      }
      this.notify(client, rows.length);
      return rows.length;
    }) as Promise<number>;
  }

  restore(deliveries: readonly Delivery[]): Promise<number> {
    const col = <K extends keyof Delivery>(k: K) => deliveries.map((d) => d[k] ?? null);
    // Ordered rows take their arrival order from when they were received, as store() would have.
    const byArrival = deliveries.map((d, i) => [d.receivedAt, i] as const).sort((a, b) => a[0] - b[0] || a[1] - b[1]);
    const place = new Array<number>(deliveries.length);
    byArrival.forEach(([, i], n) => (place[i] = n));
    return this.other(async (client) => {
      const { rows } = await client.query(
        `INSERT INTO deliveries (source, id, body, body_sha256, content_type, event_type, provider_time, received_at,
                                 status, attempts, available_at, leased_until, lease_ms, error, conflicts, finished_at,
                                 replays, purged_at, order_key, event_time, newer_id, arrival, route, destination, headers, traceparent)
         SELECT s, i, b, h, ct, et, pt, ra, st, at,
                CASE WHEN st = 'processing' THEN coalesce(lu, av) ELSE av END, lu,
                CASE WHEN lu IS NULL THEN NULL ELSE greatest(1, lu - ${NOW}) END, er, cf, fa, rp, pu, ok, ev, nw,
                CASE WHEN ok IS NULL THEN NULL ELSE (SELECT nextval('deliveries_arrival')) * 1000000 + n END, ro, de, hd, tp
         FROM unnest($2::text[], $3::text[], $4::bytea[], $5::text[], $6::text[], $7::text[], $8::bigint[], $9::bigint[],
                     $10::text[], $11::integer[], $12::bigint[], $13::bigint[], $14::text[], $15::integer[], $16::bigint[],
                     $17::integer[], $18::bigint[], $19::text[], $20::bigint[], $21::text[], $22::integer[],
                     $23::smallint[], $24::text[], $25::text[], $26::text[])
              AS u(s, i, b, h, ct, et, pt, ra, st, at, av, lu, er, cf, fa, rp, pu, ok, ev, nw, n, ro, de, hd, tp)
         ORDER BY s, i, ro
         ON CONFLICT (source, id, route) DO NOTHING
         RETURNING source, destination, order_key`,
        [
          this.now(),
          col("source"),
          col("id"),
          col("body"),
          col("bodySha256"),
          col("contentType"),
          col("eventType"),
          col("providerTime"),
          col("receivedAt"),
          col("status"),
          col("attempts"),
          col("availableAt"),
          col("leasedUntil"),
          col("error"),
          col("conflicts"),
          col("finishedAt"),
          deliveries.map((d) => d.replays ?? 0),
          deliveries.map((d) => d.purgedAt ?? null),
          col("orderKey"),
          col("eventTime"),
          col("newerId"),
          place,
          deliveries.map((d) => d.route ?? 0),
          deliveries.map((d) => d.destination ?? DEFAULTS.destination),
          deliveries.map((d) => (d.headers ? JSON.stringify(d.headers) : null)),
          deliveries.map((d) => d.traceparent ?? null),
        ],
      );
      const keys = new Map<string, [string, string, string]>();
      for (const r of rows)
        if (r.order_key !== null)
          keys.set(JSON.stringify([r.source, r.destination, r.order_key]), [r.source, r.destination, r.order_key]);
      if (keys.size > 0) await this.rebuildKeys(client, [...keys.values()].sort());
      return rows.length;
    }) as Promise<number>;
  }

  async retryMatching(filter: Filter, options: BulkOptions = {}): Promise<number> {
    const failed = "status = 'failed' AND purged_at IS NULL";
    if (options.dryRun) return this.countWhere(filter, failed);
    let total = 0;
    await this.inBatches(filter, failed, options.batch, async (client, keys) => {
      const { rows } = await client.query(
        `UPDATE deliveries d SET status = 'received', attempts = 0, error = NULL, available_at = ${NOW}, finished_at = NULL
         FROM unnest($2::text[], $3::text[], $4::smallint[]) AS u(s, i, r) WHERE d.source = u.s AND d.id = u.i AND d.route = u.r AND d.status = 'failed'
         RETURNING d.source, d.id, d.order_key, d.destination`,
        [this.now(), keys.map((k) => k.source), keys.map((k) => k.id), keys.map((k) => k.route!)],
      );
      total += rows.length;
      await this.settleReturned(client, rows);
      this.notify(client, rows.length);
    });
    return total;
  }

  async replayMatching(
    filter: Filter,
    options: BulkOptions & { to?: string } = {},
  ): Promise<{ replayed: number; tombstoned: number }> {
    if (options.to !== undefined) return this.replayTo(filter, options.to, options);
    const kept = "status = 'done' AND purged_at IS NULL";
    const tombstoned = () => this.countWhere(filter, "status = 'done' AND purged_at IS NOT NULL");
    if (options.dryRun) return { replayed: await this.countWhere(filter, kept), tombstoned: await tombstoned() };
    let replayed = 0;
    await this.inBatches(filter, kept, options.batch, async (client, keys) => {
      const { rows } = await client.query(
        `UPDATE deliveries d SET status = 'received', attempts = 0, replays = d.replays + 1, error = NULL, available_at = ${NOW},
                finished_at = NULL, leased_until = NULL, lease_token = NULL
         FROM unnest($2::text[], $3::text[], $4::smallint[]) AS u(s, i, r)
         WHERE d.source = u.s AND d.id = u.i AND d.route = u.r AND d.status = 'done' AND d.purged_at IS NULL
         RETURNING d.source, d.id, d.order_key, d.destination`,
        [this.now(), keys.map((k) => k.source), keys.map((k) => k.id), keys.map((k) => k.route!)],
      );
      replayed += rows.length;
      await this.settleReturned(client, rows);
      this.notify(client, rows.length);
    });
    return { replayed, tombstoned: await tombstoned() };
  }

  // replayTo sends each matching delivery (once, whichever of its rows matched) to one destination: its
  // row there goes again if done, and a row is added, as the next route, if its routes never chose it.
  // A row there that is still waiting or failed is left alone: it is on its way, or `retry` is the tool.
  private async replayTo(
    filter: Filter,
    to: string,
    options: BulkOptions,
  ): Promise<{ replayed: number; tombstoned: number }> {
    if (!DESTINATION_NAME.test(to))
      throw new TypeError(`replay: expected --to to name a destination, got ${JSON.stringify(to)}`);
    const kept = "purged_at IS NULL";
    const tombstoned = () => this.countWhere(filter, "purged_at IS NOT NULL");
    if (options.dryRun) return { replayed: await this.countWhere(filter, kept), tombstoned: await tombstoned() };
    let replayed = 0;
    const seen = new Set<string>();
    await this.inBatches(filter, kept, options.batch, async (client, keys) => {
      const mine = keys.filter((k) => !seen.has(`${k.source}\u0000${k.id}`) && seen.add(`${k.source}\u0000${k.id}`));
      if (mine.length === 0) return;
      const args = [this.now(), mine.map((k) => k.source), mine.map((k) => k.id), mine.map((k) => k.route!), to];
      const again = await client.query(
        `UPDATE deliveries d SET status = 'received', attempts = 0, replays = d.replays + 1, error = NULL, available_at = ${NOW},
                finished_at = NULL, leased_until = NULL, lease_token = NULL
         FROM unnest($2::text[], $3::text[]) AS u(s, i)
         WHERE d.source = u.s AND d.id = u.i AND d.destination = $4 AND d.status = 'done' AND d.purged_at IS NULL
         RETURNING d.source, d.id, d.order_key, d.destination`,
        [this.now(), mine.map((k) => k.source), mine.map((k) => k.id), to],
      );
      // Routing after the fact: a delivery with no row there gets one, as its next route.
      const added = await client.query(
        `INSERT INTO deliveries (source, id, body, body_sha256, content_type, event_type, provider_time, received_at, status,
                                 available_at, order_key, event_time, arrival, route, destination, headers, traceparent, replays)
         SELECT d.source, d.id, d.body, d.body_sha256, d.content_type, d.event_type, d.provider_time, d.received_at, 'received', ${NOW},
                d.order_key, d.event_time, CASE WHEN d.order_key IS NULL THEN NULL ELSE nextval('deliveries_arrival') * 1000000 END,
                (SELECT max(m.route) + 1 FROM deliveries m WHERE m.source = d.source AND m.id = d.id), $5, d.headers, d.traceparent, 1
         FROM unnest($2::text[], $3::text[], $4::smallint[]) AS u(s, i, r)
         JOIN deliveries d ON d.source = u.s AND d.id = u.i AND d.route = u.r AND d.purged_at IS NULL
         WHERE NOT EXISTS (SELECT 1 FROM deliveries o WHERE o.source = u.s AND o.id = u.i AND o.destination = $5)
         ORDER BY d.source, d.id
         RETURNING source, id, order_key, event_time, arrival, available_at`,
        args,
      );
      replayed += again.rows.length + added.rows.length;
      await this.settleReturned(client, again.rows);
      const ordered = added.rows.filter((r) => r.order_key !== null);
      if (ordered.length > 0) {
        await this.enterKeys(
          client,
          ordered.map((r) => ({
            source: r.source,
            destination: to,
            key: r.order_key,
            id: r.id,
            eventTime: r.event_time,
            seq: r.arrival,
            due: r.available_at,
            strict: false,
          })),
        );
      }
      this.notify(client, again.rows.length + added.rows.length);
    });
    return { replayed, tombstoned: await tombstoned() };
  }

  // settleReturned lets the ordered ones among requeued deliveries wait their turn again, by their key's head.
  private async settleReturned(
    client: pg.PoolClient,
    rows: { source: string; id: string; order_key: string | null; destination: string }[],
  ): Promise<void> {
    const ordered = rows.filter((r) => r.order_key !== null);
    if (ordered.length > 0) {
      await this.settleKeys(
        client,
        ordered.map((r) => ({
          source: r.source,
          destination: r.destination,
          key: r.order_key!,
          from: r.id,
          setAside: false,
        })),
      );
    }
  }

  private async countWhere(filter: Filter, also: string): Promise<number> {
    const { where, params } = filterSql(filter, "postgres");
    const { rows } = await this.pool.query(
      toPg(`SELECT count(*) AS n FROM deliveries WHERE ${also} AND ${where}`),
      params,
    );
    return Number(rows[0].n);
  }

  // inBatches walks the deliveries that match, oldest first, a batch per transaction, locking each batch's
  // rows and handing their keys to act inside it. The cursor moves past every batch, so a delivery a
  // worker changes meanwhile (retried, then failed again) is never taken twice in one run.
  private async inBatches(
    filter: Filter,
    also: string,
    batch: number | undefined,
    act: (client: pg.PoolClient, keys: Cursor[]) => Promise<void>,
  ): Promise<void> {
    const size = bulkBatchSize(batch);
    const { where, params } = filterSql(filter, "postgres");
    let after: Cursor | undefined;
    for (;;) {
      const picked = (await this.other(async (client) => {
        const cursor =
          after === undefined
            ? ""
            : "AND received_at >= ?::bigint AND (received_at, source, id, route) > (?::bigint, ?::text, ?::text, ?::smallint)";
        const { rows } = await client.query(
          toPg(`SELECT received_at, source, id, route FROM deliveries WHERE ${also} AND ${where} ${cursor}
                ORDER BY received_at, source, id, route LIMIT ?::integer FOR UPDATE`),
          [
            ...params,
            ...(after ? [after.receivedAt, after.receivedAt, after.source, after.id, after.route!] : []),
            size,
          ],
        );
        const keys = rows.map((r) => ({
          receivedAt: r.received_at as number,
          source: r.source as string,
          id: r.id as string,
          route: r.route as number,
        }));
        if (keys.length > 0) await act(client, keys);
        return keys;
      })) as Cursor[];
      if (picked.length < size) return;
      after = picked.at(-1);
    }
  }

  async purge(options: PurgeOptions = {}): Promise<Purged> {
    const { bodiesBefore, forgetBefore, batch, rest } = purgeCutoffs(options, this.pinned ? this.pinned() : Date.now());
    if (options.dryRun) {
      const { rows } = await this.pool.query(
        `SELECT (SELECT count(*) FROM deliveries WHERE status = 'done' AND purged_at IS NULL AND received_at < $1) AS bodies,
                (SELECT coalesce(sum(octet_length(body)), 0) FROM deliveries WHERE status = 'done' AND purged_at IS NULL AND received_at < $1) AS bytes,
                (SELECT count(*) FROM deliveries WHERE purged_at IS NOT NULL AND received_at < $2)
                + (SELECT count(*) FROM deliveries WHERE status = 'done' AND purged_at IS NULL AND received_at < $2) AS forgotten`,
        [bodiesBefore, forgetBefore],
      );
      return { bodies: rows[0].bodies, bytes: Number(rows[0].bytes), forgotten: rows[0].forgotten, vacuumedBytes: 0 };
    }
    const purged: Purged = { bodies: 0, bytes: 0, forgotten: 0, vacuumedBytes: 0 };
    for (;;) {
      const { n, bytes } = await paced(rest, () =>
        this.dropBatch("status = 'done' AND purged_at IS NULL AND received_at < ?::bigint", [bodiesBefore], batch),
      );
      purged.bodies += n;
      purged.bytes += bytes;
      if (n < batch || options.signal?.aborted) break;
    }
    // Deleted a batch per transaction, so autovacuum (tuned tight on this table) reclaims them as it goes.
    for (;;) {
      if (options.signal?.aborted) return purged;
      const n = (await paced(rest, () =>
        this.other(
          async (client) =>
            (
              await client.query(
                `DELETE FROM deliveries WHERE (source, id, route) IN (
           SELECT source, id, route FROM deliveries WHERE purged_at IS NOT NULL AND received_at < $1
           ORDER BY received_at LIMIT $2 FOR UPDATE SKIP LOCKED)`,
                [forgetBefore, batch],
              )
            ).rowCount ?? 0,
        ),
      )) as number;
      purged.forgotten += n;
      if (n < batch) break;
    }
    return purged;
  }

  async dropBodies(filter: Filter, options: BulkOptions = {}): Promise<{ bodies: number; bytes: number }> {
    const { where, params } = filterSql(filter, "postgres");
    const size = bulkBatchSize(options.batch);
    const also = `status IN ('done', 'failed') AND purged_at IS NULL AND ${where}`;
    if (options.dryRun) {
      const { rows } = await this.pool.query(
        toPg(`SELECT count(*) AS n, coalesce(sum(octet_length(body)), 0) AS bytes FROM deliveries WHERE ${also}`),
        params,
      );
      return { bodies: rows[0].n, bytes: Number(rows[0].bytes) };
    }
    const total = { bodies: 0, bytes: 0 };
    for (;;) {
      const { n, bytes } = await paced(DEFAULTS.purgeRest, () => this.dropBatch(also, params, size));
      total.bodies += n;
      total.bytes += bytes;
      if (n < size) break;
    }
    return total;
  }

  // dropBatch empties the bodies of up to batch rows matching where, in one transaction. The row stays with
  // its hash, so store()'s ON CONFLICT still finds the ID and a different body still counts as a conflict.
  private dropBatch(where: string, params: SqlValue[], batch: number): Promise<{ n: number; bytes: number }> {
    return this.other(async (client) => {
      const { rows } = await client.query(
        toPg(`WITH p AS (SELECT source, id, route, octet_length(body) AS bytes FROM deliveries WHERE ${where}
                         ORDER BY received_at LIMIT ?::integer FOR UPDATE SKIP LOCKED)
              UPDATE deliveries d SET body = '\\x'::bytea, purged_at = ?::bigint FROM p
              WHERE d.source = p.source AND d.id = p.id AND d.route = p.route AND d.purged_at IS NULL AND d.status IN ('done', 'failed')
              RETURNING p.bytes`),
        [...params, batch, this.pinned ? this.pinned() : Date.now()],
      );
      return { n: rows.length, bytes: rows.reduce((sum, r) => sum + Number(r.bytes), 0) };
    }) as Promise<{ n: number; bytes: number }>;
  }

  // rebuildKeys brings keys' head rows up to date with their deliveries after a copy: the newest done
  // event is the last handled, a processing delivery runs the key, else its first waiting one is the head.
  // (The strict setting is the source's, and comes back with the key's next delivery.)
  private async rebuildKeys(client: pg.PoolClient, keys: [string, string, string][]): Promise<void> {
    const [sources, destinations, names] = [keys.map((k) => k[0]), keys.map((k) => k[1]), keys.map((k) => k[2])];
    await client.query(
      `INSERT INTO order_keys (source, destination, order_key) SELECT * FROM unnest($1::text[], $2::text[], $3::text[])
       ON CONFLICT (source, destination, order_key) DO NOTHING`,
      [sources, destinations, names],
    );
    await client.query(
      `UPDATE order_keys o SET
         (last_event_time, last_id) = (SELECT d.event_time, d.id FROM deliveries d
                                       WHERE d.source = o.source AND d.destination = o.destination AND d.order_key = o.order_key
                                       AND d.status = 'done' ORDER BY d.event_time DESC, d.arrival DESC LIMIT 1),
         (head_id, head_event_time, head_seq, due) = (
           SELECT d.id, d.event_time, d.arrival, CASE WHEN d.status = 'processing' THEN NULL ELSE d.available_at END
           FROM deliveries d WHERE d.source = o.source AND d.destination = o.destination AND d.order_key = o.order_key
                                AND d.status IN ('received', 'processing')
           ORDER BY d.status = 'processing' DESC, d.event_time, d.arrival LIMIT 1)
       FROM unnest($1::text[], $2::text[], $3::text[]) AS u(s, de, k) WHERE o.source = u.s AND o.destination = u.de AND o.order_key = u.k`,
      [sources, destinations, names],
    );
  }

  async pause(destination: string, reason: string = "paused by a person"): Promise<boolean> {
    checkClaim({ destination });
    await this.made(destination);
    return this.other(
      async (client) => {
        const { rowCount } = await client.query(
          `INSERT INTO destinations AS d (name, paused, paused_reason, changed_at) VALUES ($2, true, $3, ${NOW})
         ON CONFLICT (name) DO UPDATE SET paused = true, paused_reason = $3, changed_at = ${NOW} WHERE NOT d.paused`,
          [this.now(), destination, reason],
        );
        return rowCount === 1;
      },
      false,
      { destination },
    ) as Promise<boolean>;
  }

  async resume(destination: string): Promise<boolean> {
    checkClaim({ destination });
    return this.other(
      async (client) => {
        const { rowCount } = await client.query(
          `UPDATE destinations SET paused = false, paused_reason = NULL, state = 'closed', failures = 0, window_start = NULL,
                window_done = 0, window_failed = 0, retry_at = NULL, probe_until = NULL, changed_at = ${NOW}
         WHERE name = $2 AND paused`,
          [this.now(), destination],
        );
        if (rowCount === 1) this.notify(client, 1);
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
      return this.pool
        .query(this.prepared("SELECT paused FROM destinations WHERE name = $1", [destination]))
        .then(({ rows }) => {
          const { tokens: _, ...permit } = gatePermit(rows[0], n, 0, undefined);
          return permit;
        });
    }
    return this.made(destination).then(() =>
      this.other(
        async (client) => {
          const row = await this.lockDestination(client, destination);
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
  private made(destination: string): Promise<void> {
    let made = this.madeRows.get(destination);
    if (made === undefined) {
      made = this.pool
        .query("INSERT INTO destinations (name) VALUES ($1) ON CONFLICT (name) DO NOTHING", [destination])
        .then(() => {});
      this.madeRows.set(destination, made);
      made.catch(() => this.madeRows.delete(destination));
    }
    return made;
  }

  // lockDestination reads a destination's row, made by made(), FOR UPDATE with the database's clock.
  private async lockDestination(client: pg.PoolClient, destination: string): Promise<Record<string, unknown>> {
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
      this.other(
        async (client) => {
          const row = await this.lockDestination(client, destination);
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

  // storeOnce is the one statement that stores a whole batch when nothing need follow it in the transaction:
  // every delivery with one route at most, no order key, and its (source, id) once in the batch. The
  // committer then sends BEGIN, it and COMMIT in one write, one round trip a batch (postgres/commit.ts);
  // the rows it returns are the stored ones, and the copies it skipped go through storeAll after.
  protected storeOnce(ops: Extract<Op, { kind: "store" }>[]): pg.QueryConfig | undefined {
    const keys = new Set<string>();
    for (const op of ops) {
      if (op.routes.length > 1 || op.incoming.orderKey != null) return undefined;
      const k = `${op.source}\u0000${op.incoming.id}`;
      if (keys.has(k)) return undefined;
      keys.add(k);
    }
    const place = new Map(ops.map((op, i) => [op, i]));
    return this.storeStatement(
      byKey([...ops]).map((op) => ({ op, route: 0 })),
      place,
    );
  }

  // storeStatement inserts the given routes of a batch's deliveries. Ordered rows take their arrival order
  // from one sequence value per batch plus their place in it (place: each op's place in the batch).
  private storeStatement(
    list: { op: Extract<Op, { kind: "store" }>; route: number }[],
    place: Map<Op, number>,
  ): pg.QueryConfig {
    const orders = new Map(list.map((x) => [x.op, orderOf(x.op.incoming, null)]));
    const none = (x: { op: Extract<Op, { kind: "store" }> }) => x.op.routes.length === 0;
    const bodies = concatenated(list.map((x) => x.op.incoming.body));
    return this.prepared(
      `INSERT INTO deliveries (source, id, body, body_sha256, content_type, event_type, provider_time, received_at, status, available_at,
                               order_key, event_time, arrival, route, destination, headers, traceparent, finished_at)
       SELECT s, i, substring($18::bytea FROM bo FOR bl), h, ct, et, pt, ${NOW}, st, ${NOW}, ok, CASE WHEN ok IS NULL THEN ev ELSE coalesce(ev, ${NOW}) END,
              CASE WHEN ok IS NULL THEN NULL ELSE (SELECT nextval('deliveries_arrival')) * 1000000 + n END, ro, de, hd, tp,
              CASE WHEN st = 'done' THEN ${NOW} END
       FROM unnest($2::text[], $3::text[], $4::integer[], $5::text[], $6::text[], $7::text[], $8::bigint[], $9::text[], $10::bigint[], $11::integer[],
                   $12::smallint[], $13::text[], $14::text[], $15::text[], $16::text[], $17::integer[])
            AS u(s, i, bo, h, ct, et, pt, ok, ev, n, ro, de, hd, tp, st, bl)
       ON CONFLICT (source, id, route) DO NOTHING
       RETURNING source, id, route, destination, order_key, event_time, arrival, available_at`,
      [
        this.now(),
        list.map((x) => x.op.source),
        list.map((x) => x.op.incoming.id),
        bodies.offsets,
        list.map((x) => x.op.digest),
        list.map((x) => x.op.incoming.contentType ?? null),
        list.map((x) => x.op.incoming.eventType ?? null),
        list.map((x) => x.op.incoming.providerTime ?? null),
        list.map((x) => (none(x) ? null : orders.get(x.op)!.key)),
        list.map((x) => orders.get(x.op)!.eventTime),
        list.map((x) => place.get(x.op)! * 16 + x.route),
        list.map((x) => x.route),
        list.map((x) => x.op.routes[x.route] ?? NO_DESTINATION),
        list.map((x) => (x.op.incoming.headers ? JSON.stringify(x.op.incoming.headers) : null)),
        list.map((x) => x.op.incoming.traceparent ?? null),
        list.map((x) => (none(x) ? "done" : "received")),
        bodies.lengths,
        bodies.all,
      ],
    );
  }

  // storeAll inserts a batch's deliveries, in key order so that two receivers' batches take their row locks
  // in the same order and cannot deadlock: first each delivery's route 0 in one statement, which decides
  // what is new, then the other routes of the new ones. The first copy of a key is stored; every other is a
  // duplicate, or a conflict when its body's hash differs from the stored one.
  protected async storeAll(client: pg.PoolClient, ops: Extract<Op, { kind: "store" }>[]): Promise<Map<Op, Stored>> {
    const key = (op: { source: string; incoming: { id: string } }) => `${op.source}\u0000${op.incoming.id}`;
    const firsts = new Map<string, (typeof ops)[number]>();
    for (const op of ops) if (!firsts.has(key(op))) firsts.set(key(op), op);
    const rows = byKey([...firsts.values()]);
    const orders = new Map(rows.map((op) => [op, orderOf(op.incoming, null)]));
    const place = new Map(ops.map((op, i) => [op, i]));
    const insert = (list: { op: (typeof ops)[number]; route: number }[]) =>
      client.query(this.storeStatement(list, place));
    const inserted = await insert(rows.map((op) => ({ op, route: 0 })));
    const stored = new Set(inserted.rows.map((r) => `${r.source}\u0000${r.id}`));
    const more = rows
      .filter((op) => stored.has(key(op)))
      .flatMap((op) => op.routes.slice(1).map((_, i) => ({ op, route: i + 1 })));
    const all = more.length === 0 ? inserted.rows : [...inserted.rows, ...(await insert(more)).rows];
    const ordered = all.filter((r) => r.order_key !== null);
    if (ordered.length > 0) {
      const strict = new Map(rows.map((op) => [key(op), orders.get(op)!.strict]));
      await this.enterKeys(
        client,
        ordered.map((r) => ({
          source: r.source,
          destination: r.destination,
          key: r.order_key,
          id: r.id,
          eventTime: r.event_time,
          seq: r.arrival,
          due: r.available_at,
          strict: strict.get(`${r.source}\u0000${r.id}`)!,
        })),
      );
    }
    const results = new Map<Op, Stored>();
    const others: typeof ops = [];
    for (const op of ops) {
      if (stored.has(key(op)) && firsts.get(key(op)) === op) results.set(op, "stored");
      else others.push(op);
    }
    if (others.length === 0) {
      this.notify(client, stored.size);
      return results;
    }
    // FOR KEY SHARE writes a lock, so this COMMIT waits for the standby like any write: a copy stored by a
    // COMMIT whose wait was cancelled (committed here, perhaps not on the standby) is answered only once it
    // is there too. It blocks no update, only a delete (purge skips locked rows).
    const kept = await client.query(
      `SELECT source, id, body_sha256 FROM deliveries WHERE (source, id) IN (SELECT * FROM unnest($1::text[], $2::text[])) AND route = 0
       FOR KEY SHARE`,
      [others.map((op) => op.source), others.map((op) => op.incoming.id)],
    );
    const digests = new Map(kept.rows.map((r) => [`${r.source}\u0000${r.id}`, r.body_sha256 as string]));
    const conflicts = new Map<string, number>();
    for (const op of others) {
      const conflict = digests.get(key(op)) !== op.digest;
      results.set(op, conflict ? "conflict" : "duplicate");
      if (conflict) conflicts.set(key(op), (conflicts.get(key(op)) ?? 0) + 1);
    }
    if (conflicts.size > 0) {
      const keys = [...conflicts.keys()].sort().map((k) => k.split("\u0000") as [string, string]);
      await client.query(
        `UPDATE deliveries d SET conflicts = d.conflicts + u.n
         FROM unnest($1::text[], $2::text[], $3::integer[]) AS u(s, i, n) WHERE d.source = u.s AND d.id = u.i AND d.route = 0`,
        [keys.map((k) => k[0]), keys.map((k) => k[1]), keys.map((k) => conflicts.get(k.join("\u0000"))!)],
      );
    }
    this.notify(client, stored.size);
    return results;
  }

  // enterKeys puts newly stored deliveries at their keys' heads (per destination) where the key is idle and
  // they come first in event time (or it had nothing waiting); a running or blocked key picks its next head
  // when it settles. One row per key (the batch's earliest), in key order, so two receivers cannot deadlock.
  private async enterKeys(
    client: pg.PoolClient,
    entries: {
      source: string;
      destination: string;
      key: string;
      id: string;
      eventTime: number;
      seq: number;
      due: number;
      strict: boolean;
    }[],
  ): Promise<void> {
    const name = (e: { source: string; destination: string; key: string }) =>
      `${e.source}\u0000${e.destination}\u0000${e.key}`;
    const first = new Map<string, (typeof entries)[number]>();
    for (const e of entries) {
      const seen = first.get(name(e));
      if (!seen || e.eventTime < seen.eventTime || (e.eventTime === seen.eventTime && e.seq < seen.seq))
        first.set(name(e), e);
    }
    const list = [...first.values()].sort((a, b) => (name(a) < name(b) ? -1 : name(a) > name(b) ? 1 : 0));
    const earlier =
      "o.head_id IS NULL OR (o.due IS NOT NULL AND (excluded.head_event_time, excluded.head_seq) < (o.head_event_time, o.head_seq))";
    await client.query(
      `INSERT INTO order_keys AS o (source, destination, order_key, head_id, head_event_time, head_seq, due, strict)
       SELECT * FROM unnest($1::text[], $8::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[], $7::boolean[])
       ON CONFLICT (source, destination, order_key) DO UPDATE SET
         strict = excluded.strict,
         head_id = CASE WHEN ${earlier} THEN excluded.head_id ELSE o.head_id END,
         head_event_time = CASE WHEN ${earlier} THEN excluded.head_event_time ELSE o.head_event_time END,
         head_seq = CASE WHEN ${earlier} THEN excluded.head_seq ELSE o.head_seq END,
         due = CASE WHEN ${earlier} THEN excluded.due ELSE o.due END`,
      [
        list.map((e) => e.source),
        list.map((e) => e.key),
        list.map((e) => e.id),
        list.map((e) => e.eventTime),
        list.map((e) => e.seq),
        list.map((e) => e.due),
        list.map((e) => e.strict),
        list.map((e) => e.destination),
      ],
    );
  }

  // settleKeys moves each key's head to its first waiting delivery in event time, then arrival, after the
  // delivery `from` left the head (done, retried, released, set aside) or came back (retry), and records
  // a handled delivery's event time as the key's newest. It leaves a key alone while another delivery runs
  // or blocks it, and a strict key blocked when `from` is set aside. The key rows are locked first, so
  // the head is read in a snapshot that includes every store that touched the key before.
  private async settleKeys(
    client: pg.PoolClient,
    items: {
      source: string;
      destination: string;
      key: string;
      from: string;
      setAside: boolean;
      handledTime?: number | null;
    }[],
  ): Promise<void> {
    const name = (i: { source: string; destination: string; key: string }) =>
      `${i.source}\u0000${i.destination}\u0000${i.key}`;
    const byKey = new Map<string, (typeof items)[number]>();
    for (const item of items) if (!byKey.has(name(item)) || item.handledTime != null) byKey.set(name(item), item);
    const list = [...byKey.values()].sort((a, b) => (name(a) < name(b) ? -1 : name(a) > name(b) ? 1 : 0));
    const [sources, destinations, keys] = [
      list.map((i) => i.source),
      list.map((i) => i.destination),
      list.map((i) => i.key),
    ];
    await client.query(
      `SELECT 1 FROM order_keys WHERE (source, destination, order_key) IN (SELECT * FROM unnest($1::text[], $2::text[], $3::text[]))
       ORDER BY source COLLATE "C", destination COLLATE "C", order_key COLLATE "C" FOR UPDATE`,
      [sources, destinations, keys],
    );
    const newer = "u.ht IS NOT NULL AND (o.last_event_time IS NULL OR o.last_event_time <= u.ht)";
    await client.query(
      `UPDATE order_keys o SET
         last_event_time = CASE WHEN ${newer} THEN u.ht ELSE o.last_event_time END,
         last_id = CASE WHEN ${newer} THEN u.f ELSE o.last_id END,
         (head_id, head_event_time, head_seq, due) =
           (SELECT d.id, d.event_time, d.arrival, d.available_at FROM deliveries d
            WHERE d.source = o.source AND d.destination = o.destination AND d.order_key = o.order_key AND d.status = 'received'
            ORDER BY d.event_time, d.arrival LIMIT 1)
       FROM unnest($1::text[], $2::text[], $3::text[], $4::boolean[], $5::bigint[], $6::text[]) AS u(s, k, f, sa, ht, de)
       WHERE o.source = u.s AND o.destination = u.de AND o.order_key = u.k AND (o.head_id IS NULL OR o.head_id = u.f OR o.due IS NOT NULL)
         AND NOT (o.strict AND u.sa)`,
      [
        sources,
        keys,
        list.map((i) => i.from),
        list.map((i) => i.setAside),
        list.map((i) => i.handledTime ?? null),
        destinations,
      ],
    );
  }

  // finishAll sets the fenced done marks of a batch in one statement, then runs the writes of the leases
  // that still held, all in this transaction: a lost lease writes nothing. The writes are sent together
  // (the connection pipelines them), a batch's one-row inserts of one text as one statement
  // (mergedInserts); one that fails fails the attempt, which is redone op by op, unmerged.
  // The status is checked as `(…) IS TRUE`, which no index's key or predicate matches, so each done mark
  // finds its row by the key: the generic plan of `status = 'processing'` (a 20k backlog, no statistics) went
  // through deliveries_open instead, and read every leased row once for each done mark.
  protected async finishAll(client: pg.PoolClient, ops: Extract<Op, { kind: "finish" }>[]): Promise<Map<Op, boolean>> {
    client.query(this.prepared(BY_INDEX, [])).catch(() => {}); // a failure shows in the done marks, which wait behind it
    const marked = client.query(
      this.prepared(
        `UPDATE deliveries d SET status = 'done', leased_until = NULL, lease_token = NULL, error = NULL, finished_at = ${NOW}
       FROM unnest($2::text[], $3::text[], $4::text[], $5::smallint[]) AS u(s, i, t, r)
       WHERE d.source = u.s AND d.id = u.i AND d.route = u.r AND d.lease_token = u.t AND (d.status = 'processing') IS TRUE
       RETURNING d.source, d.id, d.route`,
        [
          this.now(),
          ops.map((op) => op.lease.source),
          ops.map((op) => op.lease.id),
          ops.map((op) => op.lease.token),
          ops.map((op) => op.lease.route),
        ],
      ),
    );
    // Awaited, not left to fail the statements after it: with no writes behind it, an error here would
    // leave only COMMIT, which ends an aborted transaction with a silent rollback. The handlers' writes get
    // the connection's own plans back; done marks with none (a forwarder's) need nothing after them.
    const writing = ops.some((op) => op.writes.length > 0);
    const [{ rows }] = await Promise.all([marked, ...(writing ? [client.query(BY_DEFAULT)] : [])]);
    const held = new Set(rows.map((r) => `${r.source}\u0000${r.id}\u0000${r.route}`));
    const holds = (lease: Lease) => held.has(`${lease.source}\u0000${lease.id}\u0000${lease.route}`);
    const moved = ops.filter((op) => op.lease.orderKey !== null && holds(op.lease));
    if (moved.length > 0) {
      await this.settleKeys(
        client,
        moved.map((op) => ({
          source: op.lease.source,
          destination: op.lease.destination,
          key: op.lease.orderKey!,
          from: op.lease.id,
          setAside: false,
          handledTime: op.lease.eventTime,
        })),
      );
    }
    const results = new Map<Op, boolean>();
    const send = (sql: string, params: SqlValue[]) =>
      client.query(this.prepared(toPg(sql), params)).then((r) => r.rowCount ?? 0);
    const writes = mergedInserts(send);
    if (ops.length === 1) writes.stop();
    const tx: Tx = {
      backend: "postgres",
      // A handler's own query goes after the inserts held before it.
      get client() {
        writes.flush();
        return client;
      },
      run: writes.run,
    };
    const pending: Promise<unknown>[] = [];
    for (const op of ops) {
      const ok = holds(op.lease);
      results.set(op, ok);
      if (!ok) continue;
      for (const write of op.writes) {
        try {
          pending.push(Promise.resolve(write(tx)));
        } catch (error) {
          pending.push(Promise.reject(error));
        }
      }
    }
    writes.stop();
    const settled = await Promise.allSettled(pending);
    const failed = settled.find((s) => s.status === "rejected");
    if (failed) throw (failed as PromiseRejectedResult).reason;
    return results;
  }
}

// postgres/postgres.ts: the Inbox on PostgreSQL, for receivers and workers on many hosts sharing one database: a
// delivery's lease (claim, extend, done, fail, release) as SQL, on the schema of postgres/schema.ts, its writes
// batched and committed by postgres/commit.ts (which it extends); it holds its store path (postgres/store.ts),
// reads (postgres/reads.ts), bulk writes (postgres/bulk.ts) and the rest, and hands them those calls. Beside
// SqliteInbox; picked when --db is a URL:
//   INBOX_DB=postgres://127.0.0.1:5432/test?schema=inbox npx tsx receiver.ts
// ?schema=NAME keeps the tables in a schema of their own; ?listen=false polls without LISTEN (PgBouncer).
// Several hosts (postgres://h1:5432,h2:5433/db) follow a failover; postgres/pool.ts holds the connections.

import type pg from "pg";
import { DEFAULTS } from "../defaults.ts";
import { whileMoved } from "../errors.ts";
import { message } from "../log.ts";
import { BY_DEFAULT, BY_INDEX, mergedInserts, NO_FLUSH, NOW, PostgresCommitter, toPg, type Op } from "./commit.ts";
import { PostgresBulk } from "./bulk.ts";
import { inOneWrite } from "./pool.ts";
import { PostgresGates } from "./destinations.ts";
import { settleKeys, settleRows } from "./order-keys.ts";
import { PostgresReads } from "./reads.ts";
import { PostgresRecords, writeAudit } from "./records.ts";
import { givingWay, makePeriods, ownTransaction } from "./periods.ts";
import { PostgresSearching } from "./searching.ts";
import { PostgresStores } from "./store.ts";
import { migrate } from "./migrate.ts";
import type {
  Permit,
  Rate,
  BreakerChange,
  BreakerPolicy,
  ClaimOptions,
  FailOptions,
  Tally,
  Backend,
  BulkOptions,
  Cursor,
  Delivery,
  Failure,
  Filter,
  Inbox,
  InboxOptions,
  Incoming,
  Lease,
  LocalWrite,
  Purged,
  PurgeOptions,
  SetAside,
  SqlValue,
  Stored,
  Tx,
  Attempt,
  Try,
  Status,
  InboxStatus,
  Summary,
  Bucket,
  Kept,
  KeptAttempt,
  DestinationState,
  Gauges,
  ApiKey,
  Audit,
  EnableSearchOptions,
  SearchStatus,
  AuditEntry,
  StoredSecret,
  Remembered,
  ApplyConfigOptions,
  ConfigApplied,
  StoredConfig,
  AttemptCursor,
} from "../store.ts";
import { checkClaim, gateClaim, tellSetAside } from "../breaker.ts";
import { routesOf, checkOptions, orderOf } from "../checks.ts";
import { sha256, toDelivery } from "../rows.ts";
import { ATTEMPT_SQL, mayOverflow, trimParams, tryParams } from "../sql.ts";
import { retryDelay } from "../timing.ts";

export { redact } from "./pool.ts";

/** PostgresInbox is the Inbox on a PostgreSQL database; open it with PostgresInbox.open or connect(). */
export class PostgresInbox extends PostgresCommitter implements Inbox {
  readonly backend: Backend = "postgres";
  private readonly random: () => number;
  private readonly maxAttempts: number;
  private readonly attemptsKept: number;
  private readonly backoffOptions: { retryDelayMs: number; retryCapMs: number; retryJitter: number };
  // The keyset claim's cursor per destination: the due time this process's claims have walked to, and
  // when they last started from the start (see claimIn).
  private claimFrom = new Map<string, { at: number; fromStartAt: number }>();
  private readonly pinned: (() => number) | undefined;
  // The operator's reads, which lock nothing and wait for no batch: this inbox hands them over as they are.
  private readonly reads: PostgresReads;
  // The operator's bulk writes, each batch an op of this inbox's commit queue.
  private readonly bulk: PostgresBulk;
  // What the inbox keeps beside its deliveries: the configuration's versions, API keys, answers, the audit log.
  private readonly records: PostgresRecords;
  // The body search index's switch and backfill.
  private readonly searching: PostgresSearching;
  // The destinations' rows: pause, resume, permits, the breaker.
  private readonly gates: PostgresGates;
  // The store path: a batch's new deliveries written, and its copies of stored ones told apart.
  private readonly stores: PostgresStores;
  // This process's one look at the hot partition's statistics (analyzeHot), once it has begun.
  private analyzing: Promise<void> | undefined;

  private constructor(url: string, options: InboxOptions) {
    checkOptions(options);
    super(url, options);
    this.pinned = options.now;
    this.reads = new PostgresReads(this.pool, options.now, options.searchTimeoutMs);
    this.bulk = new PostgresBulk({
      pool: this.pool,
      pinned: options.now,
      other: (run, together, locks) => this.other(run, together, locks),
      notify: (client, added) => this.notify(client, added),
    });
    this.searching = new PostgresSearching({
      pool: this.pool,
      pinned: options.now,
      other: (run) => this.other(run),
    });
    this.records = new PostgresRecords({
      pool: this.pool,
      pinned: options.now,
      other: (run, together, locks) => this.other(run, together, locks),
      schema: this.schema,
      channel: () => this.channel(),
    });
    this.gates = new PostgresGates({
      pool: this.pool,
      pinned: options.now,
      other: (run, together, locks) => this.other(run, together, locks),
      notify: (client, added) => this.notify(client, added),
      prepared: (text, values) => this.prepared(text, values),
    });
    this.stores = new PostgresStores({
      pinned: options.now,
      notify: (client, added) => this.notify(client, added),
      prepared: (text, values) => this.prepared(text, values),
    });
    this.random = options.random ?? Math.random;
    this.maxAttempts = Math.max(1, options.maxAttempts ?? DEFAULTS.maxAttempts);
    this.attemptsKept = Math.max(1, options.attemptsKept ?? DEFAULTS.attemptsKept);
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
      await makePeriods(
        inbox.pool,
        inbox.pinned ? inbox.pinned() : Date.now(),
        DEFAULTS.periodsAhead,
        DEFAULTS.periodLockMs,
      );
    } catch (error) {
      await inbox.pool.end().catch(() => {});
      throw new Error(`open ${inbox.target}: ${message(error)}`, { cause: error });
    }
    return inbox;
  }

  // now is the time every statement takes as $1 (NOW): the pinned clock, else null and the database's own.
  private now(): number | null {
    return this.pinned ? this.pinned() : null;
  }

  attempts(d: { source: string; id: string; receivedAt: number; destination?: string }): Promise<Attempt[]> {
    return this.reads.attempts(d);
  }
  find(id: string, source?: string): Promise<Delivery[]> {
    return this.reads.find(id, source);
  }
  list(filter?: { status?: Status; source?: string; limit?: number }): Promise<Delivery[]> {
    return this.reads.list(filter);
  }
  status(): Promise<InboxStatus> {
    return this.reads.status();
  }
  summary(): Promise<Summary> {
    return this.reads.summary();
  }
  histogram(since: number, bucketMs: number, until?: number): Promise<Bucket[]> {
    return this.reads.histogram(since, bucketMs, until);
  }
  page(after: { source: string; id: string; route?: number } | undefined, limit: number): Promise<Delivery[]> {
    return this.reads.page(after, limit);
  }
  // A search form reads the index once it has caught up with every row stored before it (indexSearch()).
  async search(filter: Filter, page?: { after?: Cursor; limit?: number; bodies?: boolean }): Promise<Delivery[]> {
    await this.searching.catchUp(filter);
    return this.reads.search(filter, page);
  }
  async count(filter: Filter): Promise<number> {
    await this.searching.catchUp(filter);
    return this.reads.count(filter);
  }
  kept(): Promise<Kept> {
    return this.reads.kept();
  }
  destinations(windowMs?: number): Promise<DestinationState[]> {
    return this.reads.destinations(windowMs);
  }
  query(sql: string, ...params: SqlValue[]): Promise<Record<string, unknown>[]> {
    return this.reads.query(sql, ...params);
  }
  gauges(): Promise<Gauges> {
    return this.reads.gauges();
  }

  restore(deliveries: readonly Delivery[], audit?: Audit): Promise<number> {
    return this.bulk.restore(deliveries, audit);
  }
  attemptPage(after: AttemptCursor | undefined, limit: number): Promise<KeptAttempt[]> {
    return this.reads.attemptPage(after, limit);
  }
  restoreAttempts(tries: readonly KeptAttempt[]): Promise<number> {
    return this.bulk.restoreAttempts(tries, this.attemptsKept);
  }
  async retryMatching(filter: Filter, options?: BulkOptions): Promise<number> {
    await this.searching.catchUp(filter);
    return this.bulk.retryMatching(filter, options);
  }
  async replayMatching(
    filter: Filter,
    options?: BulkOptions & { to?: string },
  ): Promise<{ replayed: number; tombstoned: number }> {
    await this.searching.catchUp(filter);
    return this.bulk.replayMatching(filter, options);
  }
  purge(options?: PurgeOptions): Promise<Purged> {
    return this.bulk.purge(options);
  }
  async dropBodies(filter: Filter, options?: BulkOptions): Promise<{ bodies: number; bytes: number }> {
    await this.searching.catchUp(filter);
    return this.bulk.dropBodies(filter, options);
  }

  store(delivery: Incoming): Promise<Stored> {
    const source = delivery.source ?? DEFAULTS.source;
    const order = orderOf(delivery, null);
    const routes = routesOf(delivery);
    return this.enqueue({
      kind: "store",
      source,
      incoming: delivery,
      digest: sha256(delivery.body),
      routes,
      order,
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
    // A takeover's walk may meet a row whose late done mark or failure just moved it out of the hot partition
    // (40001): the claim is run again, and reads the row where it went (DEFAULTS.movedTries).
    const claimAgain = () => whileMoved(claim, DEFAULTS.movedTries);
    const claimed = limited ? this.gates.made(destination).then(claimAgain) : claimAgain();
    return tellSetAside(
      claimed.then((leases) => {
        if (leases.length >= DEFAULTS.analyzeHotAt && this.analyzing === undefined) this.analyzeHot();
        return leases;
      }),
      options,
      () => setAside,
    );
  }

  /** close lets the hot partition's one ANALYZE (analyzeHot), if it is under way, end before the pool does. */
  override async close(): Promise<void> {
    await this.analyzing;
    await super.close();
  }

  // analyzeHot has the hot partition analyzed, once a process, where neither it nor autovacuum ever did: the done
  // mark names its status twice (finishAll), and on a partition with no statistics the planner multiplies the
  // two clauses' default selectivities, takes a backlog of thousands for a row, and compares every done mark
  // with every backlog row (docs/table.md#hot-and-cold). Off the claim's path: its batch is not held up, and a
  // failure leaves the partition to autovacuum, as before. It gives way (givingWay), as ANALYZE waits for a VACUUM in flight.
  private analyzeHot(): void {
    this.analyzing = (async () => {
      const { rows } = await this.pool.query(
        `SELECT last_analyze IS NULL AND last_autoanalyze IS NULL AS never
           FROM pg_stat_user_tables WHERE relid = to_regclass('delivery_rows_hot')`,
      );
      if (!rows[0]?.never) return;
      await givingWay(
        (run) => ownTransaction(this.pool, run),
        (_client, bounded) => bounded("ANALYZE delivery_rows_hot"),
        { tries: 1 },
      );
    })().catch(() => {});
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
    row = await this.gates.lock(client, destination);
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
      // it several µs a row more, measured in docs/performance.md. A body is in its row or in delivery_bodies,
      // never both (every writer keeps the row's empty when it writes the other): one in its row is not
      // looked up there, which cost an index probe of the day's partition a row.
      const { rows } = await inOneWrite(client, () => {
        client.query(this.prepared(BY_INDEX, [])).catch(() => {}); // a failure shows in the claim itself, which waits behind it on the connection
        client.query(this.prepared(NO_FLUSH, [])).catch(() => {});
        return client.query(
          this.prepared(
            `WITH k AS (
           SELECT source, destination, order_key, head_id, due FROM order_keys WHERE destination = $5 AND due <= ${NOW}
           ORDER BY due LIMIT $2::integer FOR UPDATE SKIP LOCKED),
         u AS (
           SELECT source, id, route, available_at AS due, (status = 'processing' AND attempts >= $4) AS gave_up,
                  status = 'processing' AS takeover FROM delivery_rows
           WHERE destination = $5 AND ((status = 'received' AND order_key IS NULL) OR status = 'processing')
             AND available_at >= $6::bigint AND available_at <= ${NOW}
           ORDER BY available_at LIMIT $2::integer FOR UPDATE SKIP LOCKED),
         p AS (
           SELECT *, row_number() OVER () AS n FROM (
             SELECT * FROM (SELECT source, id, route, due, gave_up, takeover, true AS walked FROM u
                            UNION ALL
                            SELECT k.source, k.head_id, d.route, k.due, false, false, false FROM k
                            JOIN delivery_rows d ON d.source = k.source AND d.id = k.head_id AND d.destination = k.destination
                                                 AND d.status IN ('received', 'processing')) x
             ORDER BY due LIMIT $2::integer) y),
         -- Each picked row by its key: the status is checked as (…) IS TRUE, which no index predicate matches.
         -- As a plain IN, a generic plan made when the statistics saw no open row (a full inbox of done ones)
         -- walked deliveries_open from the start for every claim: 235 ms a claim at 2,000 open, ×0.02 drain
         -- beside 200k done (npm run bench -- stored).
         c AS (
         UPDATE delivery_rows d SET
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
         -- The plain status too, which opens the hot partition alone (docs/table.md#hot-and-cold).
         FROM p WHERE d.source = p.source AND d.id = p.id AND d.route = p.route AND (d.status IN ('received', 'processing')) IS TRUE
                  AND d.status IN ('received', 'processing')
         RETURNING d.source, d.id, d.route, d.destination,
                   CASE WHEN octet_length(d.body) > 0 THEN d.body ELSE
                     coalesce((SELECT b.body FROM delivery_bodies b WHERE b.source = d.source AND b.id = d.id AND b.route = d.route
                                AND b.received_at = d.received_at), d.body) END AS body, d.body_sha256, d.content_type, d.event_type, d.provider_time,
                   d.received_at, d.status, d.attempts, d.leased_until, d.lease_token, d.error, d.conflicts, d.finished_at,
                   d.replays, d.purged_at, d.order_key, d.event_time, d.newer_id, d.headers, d.traceparent, d.origin, p.due, p.takeover, p.walked),
         busy AS (
           UPDATE order_keys o SET due = NULL FROM k
           WHERE o.source = k.source AND o.destination = k.destination AND o.order_key = k.order_key
             AND EXISTS (SELECT 1 FROM c WHERE c.source = k.source AND c.id = k.head_id))
         SELECT * FROM c`,
            [this.now(), limit, leaseMs, this.maxAttempts, destination, from ?? Number.MIN_SAFE_INTEGER],
          ),
        );
      });
      // The next claim starts at the last due time this one walked to; the rows at that same time that it
      // left (locked, or past the limit) are still ahead of a cursor that takes >=.
      const walked = rows.filter((row) => row.walked);
      const at = walked.length > 0 ? Math.max(...walked.map((row) => row.due as number)) : from;
      if (at === undefined) this.claimFrom.delete(destination);
      else this.claimFrom.set(destination, { at, fromStartAt });
      const failed = rows.filter((row) => row.status === "failed");
      for (const row of failed)
        setAside.push({ source: row.source, id: row.id, destination, attempts: row.attempts, error: row.error });
      await settleRows(client, failed, true);
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
        `WITH l AS (SELECT source, id, route FROM delivery_rows WHERE source = $3 AND id = $4 AND route = $6 AND status = 'processing'
                      FOR NO KEY UPDATE SKIP LOCKED)
         UPDATE delivery_rows d SET leased_until = ${NOW} + $2::bigint, available_at = ${NOW} + $2::bigint, lease_ms = $2::integer
         FROM l WHERE d.source = l.source AND d.id = l.id AND d.route = l.route AND d.lease_token = $5 AND d.status = 'processing'
         RETURNING d.leased_until`,
        [this.now(), leaseMs, lease.source, lease.id, lease.token, lease.route],
      );
      if (rows.length === 1) {
        lease.leasedUntil = rows[0].leased_until;
        return true;
      }
      const held = await client.query(
        "SELECT 1 FROM delivery_rows WHERE source = $1 AND id = $2 AND route = $4 AND lease_token = $3 AND status = 'processing'",
        [lease.source, lease.id, lease.token, lease.route],
      );
      return held.rows.length === 1;
    }, true) as Promise<boolean>;
  }

  finish(lease: Lease, writes: readonly LocalWrite[] = [], attempt?: Try): Promise<boolean> {
    return this.enqueue({ kind: "finish", lease, writes, ...(attempt ? { attempt } : {}) }) as Promise<boolean>;
  }

  fail(lease: Lease, error: string, options: FailOptions = {}): Promise<Failure | undefined> {
    const delay = retryDelay(lease.attempts, options, { ...this.backoffOptions, random: this.random });
    return this.other(
      async (client) => {
        const { rows } = await client.query(
          `UPDATE delivery_rows SET
           status       = CASE WHEN $2::boolean OR attempts >= $3 THEN 'failed' ELSE 'received' END,
           available_at = CASE WHEN $2::boolean OR attempts >= $3 THEN available_at ELSE ${NOW} + $4::bigint END,
           finished_at  = CASE WHEN $2::boolean OR attempts >= $3 THEN ${NOW} ELSE NULL END,
           error = $5, leased_until = NULL, lease_token = NULL
         WHERE source = $6 AND id = $7 AND route = $9 AND lease_token = $8 AND status = 'processing'
         RETURNING status, available_at, attempts, ${NOW} AS now`,
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
        // A try that came with no time of its own started at the store's now: the server's, unless pinned.
        const now = Number(rows[0].now);
        await client.query(toPg(ATTEMPT_SQL.keep), tryParams(lease, rows[0].attempts, error, options.attempt, now));
        await client.query(toPg(ATTEMPT_SQL.trim), trimParams(lease, this.attemptsKept));
        if (lease.orderKey !== null) {
          await settleKeys(client, [
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
          `UPDATE delivery_rows SET status = 'received', attempts = greatest(attempts - 1, 0), leased_until = NULL,
                lease_token = NULL, available_at = ${NOW}
         WHERE source = $2 AND id = $3 AND route = $5 AND lease_token = $4 AND status = 'processing'`,
          [this.now(), lease.source, lease.id, lease.token, lease.route],
        );
        if (rowCount === 1 && lease.orderKey !== null) {
          await settleKeys(client, [
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

  retry(target: { source?: string; id: string } | { allFailed: true }, audit?: Audit): Promise<number> {
    return this.other(async (client) => {
      const { rows } =
        "allFailed" in target
          ? await client.query(
              `UPDATE delivery_rows SET status = 'received', attempts = 0, error = NULL, available_at = ${NOW}, finished_at = NULL
           WHERE status = 'failed' AND purged_at IS NULL RETURNING source, id, order_key, destination`,
              [this.now()],
            )
          : await client.query(
              `UPDATE delivery_rows SET status = 'received', attempts = 0, error = NULL, available_at = ${NOW}, finished_at = NULL
           WHERE source = $2 AND id = $3 AND status = 'failed' AND purged_at IS NULL
             AND received_at IN (SELECT received_at FROM delivery_keys WHERE source = $2 AND id = $3)
           RETURNING source, id, order_key, destination`,
              [this.now(), target.source ?? DEFAULTS.source, target.id],
            );
      await settleRows(client, rows, false);
      await writeAudit(client, audit, rows.length, this.now());
      this.notify(client, rows.length);
      return rows.length;
    }) as Promise<number>;
  }

  pause(destination: string, reason?: string, audit?: Audit): Promise<boolean> {
    return this.gates.pause(destination, reason, audit);
  }

  resume(destination: string, audit?: Audit): Promise<boolean> {
    return this.gates.resume(destination, audit);
  }

  permit(destination: string, n: number, rate?: Rate): Promise<Permit> {
    return this.gates.permit(destination, n, rate);
  }

  tally(destination: string, tally: Tally, policy: BreakerPolicy): Promise<BreakerChange | undefined> {
    return this.gates.tally(destination, tally, policy);
  }

  // The stores of a batch, which the committer hands over here (postgres/store.ts).
  protected storeOnce(ops: Extract<Op, { kind: "store" }>[]): pg.QueryConfig | undefined {
    return this.stores.storeOnce(ops);
  }
  protected storeAll(client: pg.PoolClient, ops: Extract<Op, { kind: "store" }>[]): Promise<Map<Op, Stored>> {
    return this.stores.storeAll(client, ops);
  }

  // finishAll sets the fenced done marks of a batch in one statement, then runs the writes of the leases
  // that still held, all in this transaction: a lost lease writes nothing. The writes are sent together
  // (the connection pipelines them), a batch's one-row inserts of one text as one statement
  // (mergedInserts); one that fails fails the attempt, which is redone op by op, unmerged.
  // The status is checked as `(…) IS TRUE`, which no index's key or predicate matches, so each done mark
  // finds its row by the key: the generic plan of `status = 'processing'` (a 20k backlog, no statistics) went
  // through deliveries_open instead, and read every leased row once for each done mark. The plain
  // `status IN ('received', 'processing')` after it matches no row fewer: it is there for partition pruning,
  // which reads the partition key in a plain comparison and not inside `IS TRUE`, so the mark opens the hot
  // partition alone (docs/table.md#hot-and-cold). Without it the plan probes every day of the history too.
  protected async finishAll(client: pg.PoolClient, ops: Extract<Op, { kind: "finish" }>[]): Promise<Map<Op, boolean>> {
    client.query(this.prepared(BY_INDEX, [])).catch(() => {}); // a failure shows in the done marks, which wait behind it
    const marked = client.query(
      this.prepared(
        `UPDATE delivery_rows d SET status = 'done', leased_until = NULL, lease_token = NULL, error = NULL, finished_at = ${NOW}
       FROM unnest($2::text[], $3::text[], $4::text[], $5::smallint[]) AS u(s, i, t, r)
       WHERE d.source = u.s AND d.id = u.i AND d.route = u.r AND d.lease_token = u.t AND (d.status = 'processing') IS TRUE
         AND d.status IN ('received', 'processing')
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
      await settleKeys(
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
    const tried = ops.filter((op) => op.attempt !== undefined && holds(op.lease));
    const keeping = tried.length > 0 ? this.keepTries(client, tried) : undefined;
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
    if (keeping) pending.push(keeping);
    const settled = await Promise.allSettled(pending);
    const failed = settled.find((s) => s.status === "rejected");
    if (failed) throw (failed as PromiseRejectedResult).reason;
    return results;
  }

  // keepTries adds a batch's tries to the attempt log and lets each delivery's oldest go past the cap: one
  // statement a batch, whatever its size, and a second where a try may take a log past it, sent behind the
  // done marks in their transaction.
  private keepTries(client: pg.PoolClient, ops: Extract<Op, { kind: "finish" }>[]): Promise<unknown> {
    const rows = ops.map((op) => tryParams(op.lease, op.lease.attempts, null, op.attempt, 0));
    const column = (i: number) => rows.map((r) => r[i]);
    const kept = client.query(
      this.prepared(
        `INSERT INTO attempts (source, id, destination, attempt, started_at, ms, status, error, headers, body)
         SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::integer[], $5::bigint[], $6::integer[],
                              $7::smallint[], $8::text[], $9::text[], $10::text[])`,
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9].map(column),
      ),
    );
    const over = ops.filter((op) => mayOverflow(op.lease));
    if (over.length === 0) return kept;
    const trimmed = client.query(
      this.prepared(
        `DELETE FROM attempts a USING (
           SELECT u.s, u.i, u.d, (SELECT x.seq FROM attempts x WHERE x.source = u.s AND x.id = u.i AND x.destination = u.d
                                  ORDER BY x.seq DESC LIMIT 1 OFFSET $4) AS cut
             FROM unnest($1::text[], $2::text[], $3::text[]) AS u(s, i, d)) c
         WHERE a.source = c.s AND a.id = c.i AND a.destination = c.d AND a.seq <= c.cut`,
        [
          over.map((op) => op.lease.source),
          over.map((op) => op.lease.id),
          over.map((op) => op.lease.destination),
          this.attemptsKept,
        ],
      ),
    );
    return Promise.all([kept, trimmed]);
  }

  /** failuresByError counts the failed deliveries by their exact last error, through the failed rows' partial index. */
  async failuresByError(): Promise<{ error: string | null; count: number; latest: number }[]> {
    const { rows } = await this.pool.query(
      "SELECT error, count(*) AS n, max(received_at) AS latest FROM deliveries WHERE status = 'failed' GROUP BY error",
    );
    return rows.map((r: { error: string | null; n: string; latest: string }) => ({
      error: r.error,
      count: Number(r.n),
      latest: Number(r.latest),
    }));
  }

  searchStatus(): Promise<SearchStatus> {
    return this.searching.status();
  }
  enableSearch(options?: EnableSearchOptions): Promise<SearchStatus> {
    return this.searching.enable(options);
  }
  disableSearch(audit?: Audit): Promise<boolean> {
    return this.searching.disable(audit);
  }
  indexSearch(limit?: number): Promise<number> {
    return this.searching.index(limit);
  }
  addApiKey(key: ApiKey, audit?: Audit): Promise<void> {
    return this.records.addApiKey(key, audit);
  }
  apiKeys(): Promise<ApiKey[]> {
    return this.records.apiKeys();
  }
  apiKeyByHash(hash: string): Promise<ApiKey | undefined> {
    return this.records.apiKeyByHash(hash);
  }
  revokeApiKey(id: string, at: number, audit?: Audit): Promise<boolean> {
    return this.records.revokeApiKey(id, at, audit);
  }
  remember(record: Remembered, expiredBefore: number): Promise<Remembered> {
    return this.records.remember(record, expiredBefore);
  }
  recall(key: string, since: number): Promise<Remembered | undefined> {
    return this.records.recall(key, since);
  }
  addAudit(entry: Omit<AuditEntry, "seq">): Promise<void> {
    return this.records.addAudit(entry);
  }
  auditLog(page: { before?: number; limit: number }): Promise<AuditEntry[]> {
    return this.records.auditLog(page);
  }
  auditCounts(): Promise<{ kind: string; n: number }[]> {
    return this.records.auditCounts();
  }
  setSecret(secret: StoredSecret, audit?: Audit): Promise<boolean> {
    return this.records.setSecret(secret, audit);
  }
  deleteSecret(name: string, audit?: Audit): Promise<boolean> {
    return this.records.deleteSecret(name, audit);
  }
  secrets(): Promise<StoredSecret[]> {
    return this.records.secrets();
  }
  putSecrets(secrets: readonly StoredSecret[], audit?: Audit): Promise<number> {
    return this.records.putSecrets(secrets, audit);
  }
  secretsVersion(): Promise<number> {
    return this.records.secretsVersion();
  }
  readConfig(): Promise<StoredConfig | undefined> {
    return this.records.readConfig();
  }
  configVersion(): Promise<number> {
    return this.records.configVersion();
  }
  applyConfig(document: string, options: ApplyConfigOptions): Promise<ConfigApplied> {
    return this.records.applyConfig(document, options);
  }
  configHistory(): Promise<StoredConfig[]> {
    return this.records.configHistory();
  }
  configVersions(page: { before?: number; limit: number }): Promise<StoredConfig[]> {
    return this.records.configVersions(page);
  }
  restoreConfig(versions: readonly StoredConfig[]): Promise<number> {
    return this.records.restoreConfig(versions);
  }
  restoreApiKeys(keys: readonly ApiKey[]): Promise<number> {
    return this.records.restoreApiKeys(keys);
  }
  restoreAudit(entries: readonly AuditEntry[]): Promise<number> {
    return this.records.restoreAudit(entries);
  }
}

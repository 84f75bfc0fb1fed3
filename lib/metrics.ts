// metrics.ts: what the inbox reports. One prom-client registry per process with the intake (receiver),
// queue (gauges read from the store, cached) and work (worker) metrics, and the small HTTP routes that
// show them: /metrics in Prometheus's text format, /livez, /readyz. Imported by receiver.ts and worker.ts:
//   curl http://127.0.0.1:8000/metrics                       # the receiver serves it on its own port
//   npx tsx worker.ts --metrics-port 9464 && curl http://127.0.0.1:9464/metrics
// No delivery ID is ever a label: sources are few and named in the config, statuses and results fixed.

import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import client from "prom-client";
import { DEFAULTS } from "./defaults.ts";
import { message } from "./log.ts";
import type { DestinationState, Gauges, Inbox, Lease, Stored } from "./store.ts";
import { sqlstate } from "./errors.ts";
import { REMOVED } from "./rows.ts";

/** Answered is how the receiver answered one request, as received_total counts it. */
export type Answered = Stored | "rejected" | "unavailable";

/** Reason is the class of a refusal: rejected_total's label beside the status code. */
export type Reason = "signature" | "malformed" | "too_large" | "unknown_source";

/** NO_SOURCE is the source label of a request that named no known source (a 404, a malformed request). */
export const NO_SOURCE = "-";

/** reasonOf classes a refusal by its status code. */
export function reasonOf(status: number): Reason {
  return status === 401 ? "signature" : status === 404 ? "unknown_source" : status === 413 ? "too_large" : "malformed";
}

/** MetricsOptions configures Metrics. */
export interface MetricsOptions {
  /** The store whose queue the gauges show. */
  inbox: Inbox;
  /** Milliseconds a scrape reuses the gauges read by the one before. @default DEFAULTS.gaugeCacheMs */
  gaugeCacheMs?: number;
  /** Node's own process metrics (CPU, memory, event-loop lag) beside the inbox's. @default true */
  processMetrics?: boolean;
  /** The clock for queue wait, in ms since the epoch (the store's clock). @default Date.now */
  now?: () => number;
}

// Latencies from 0.5 ms (a shared group commit) to 10 s (a stalled disk); handler times to a minute.
const ACK_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];
const WORK_BUCKETS = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60];
const WAIT_BUCKETS = [0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 14400, 86400];
const BATCH_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512];

// Tally is one counter series' increments since the last scrape, in a plain number; Spread is one
// histogram series in plain numbers (a count per bucket, the sum, the count). prom-client hashes the
// label values on every inc() and observe() (1 to 3 µs each, measured), which on a request that costs
// about 45 µs in all is most of the 10% the metrics may take; so the hot path only adds to these, and
// the scrape hands them to prom-client, which writes the text.
interface Tally {
  labels: Record<string, string>;
  pending: number;
}

class Spread {
  readonly labels: Record<string, string>;
  readonly bounds: readonly number[];
  readonly counts: Float64Array;
  sum = 0;
  count = 0;
  constructor(labels: Record<string, string>, bounds: readonly number[]) {
    this.labels = labels;
    this.bounds = bounds;
    this.counts = new Float64Array(bounds.length);
  }
  observe(value: number): void {
    const bounds = this.bounds;
    let i = 0;
    while (i < bounds.length && value > bounds[i]!) i++;
    if (i < bounds.length) this.counts[i]!++;
    this.sum += value;
    this.count++;
  }
}

// Tallied is a prom-client Counter fed from tallies: each scrape adds what they gathered since the last.
class Tallied<T extends string> extends client.Counter<T> {
  private readonly tallies = new Map<string, Tally>();
  constructor(config: { name: string; help: string; labelNames: readonly T[]; registers: client.Registry[] }) {
    super({
      ...config,
      collect() {
        for (const tally of (this as Tallied<T>).tallies.values()) {
          if (tally.pending > 0) this.inc(tally.labels as client.LabelValues<T>, tally.pending);
          tally.pending = 0;
        }
      },
    });
  }
  tally(key: string, labels: Record<string, string>): Tally {
    let tally = this.tallies.get(key);
    if (!tally) this.tallies.set(key, (tally = { labels, pending: 0 }));
    return tally;
  }
}

// Spreads is a prom-client Histogram whose series are Spreads: get() returns them in prom-client's own
// shape (cumulative buckets, +Inf, _sum, _count), and the registry writes the text as for any histogram.
class Spreads<T extends string> extends client.Histogram<T> {
  private readonly spreads = new Map<string, Spread>();
  private readonly metric: { name: string; help: string; bounds: readonly number[] };
  constructor(config: {
    name: string;
    help: string;
    labelNames?: readonly T[];
    buckets: number[];
    registers: client.Registry[];
  }) {
    super(config);
    this.metric = { name: config.name, help: config.help, bounds: config.buckets };
  }
  spread(key: string, labels: Record<string, string>): Spread {
    let spread = this.spreads.get(key);
    if (!spread) this.spreads.set(key, (spread = new Spread(labels, this.metric.bounds)));
    return spread;
  }
  // The registry asks for getForPromString when a metric has one, as Histogram does: both return ours.
  getForPromString(): Promise<client.MetricObjectWithValues<client.MetricValueWithName<T>>> {
    return this.get();
  }

  override async get(): Promise<client.MetricObjectWithValues<client.MetricValueWithName<T>>> {
    const { name, help, bounds } = this.metric;
    const values: client.MetricValueWithName<T>[] = [];
    const at = (labels: Record<string, string | number>, value: number, metricName: string) =>
      values.push({ labels: labels as client.LabelValues<T>, value, metricName });
    for (const s of this.spreads.values()) {
      let cumulative = 0;
      bounds.forEach((le, i) => at({ ...s.labels, le }, (cumulative += s.counts[i]!), `${name}_bucket`));
      at({ ...s.labels, le: "+Inf" }, s.count, `${name}_bucket`);
      at(s.labels, s.sum, `${name}_sum`);
      at(s.labels, s.count, `${name}_count`);
    }
    // MetricType is an enum only in prom-client's types; at run time the type is its string.
    return {
      name,
      help,
      type: "histogram" as unknown as client.MetricType,
      values,
      aggregator: "sum",
      collect: () => {},
    };
  }
}

/**
 * Metrics holds a process's registry and the calls that feed it: observe() once per receiver answer,
 * commit() from the store's committer, and claimed/handled/retried/failed/lost from the worker. Each
 * call adds to plain numbers kept per label set (see Tally), so the hot path neither hashes nor allocates.
 */
export class Metrics {
  readonly registry = new client.Registry();
  private readonly inbox: Inbox;
  private readonly gaugeCacheMs: number;
  private readonly now: () => number;
  private gaugeRead: { at: number; value: Promise<Gauges | undefined> } | undefined;
  private readiness: Readiness | undefined;
  // Per source, then per result: two lookups of strings that exist already, no key built per request.
  private readonly intake = new Map<string, Map<string, Tally>>();
  private readonly acks = new Map<string, Spread>();

  private readonly received: Tallied<"source" | "result">;
  private readonly rejected: Tallied<"source" | "status" | "reason">;
  private readonly ack: Spreads<"source">;
  private readonly batch: Spread;
  private readonly commitSeconds: Spread;
  private readonly handler: Spreads<"source">;
  private readonly wait: Spreads<"source">;
  private readonly attempts: Tallied<"source">;
  private readonly origins: Tallied<"source" | "origin">;
  private readonly retries: Tallied<"source">;
  private readonly failures: Tallied<"source">;
  private readonly takeovers: Tallied<"source">;
  private readonly lostLeases: Tallied<"source">;
  private readonly forwards: Tallied<"destination" | "outcome">;
  private readonly forwardSeconds: Spreads<"destination">;
  private readonly dbErrors: Tallied<"role" | "class">;
  private readonly counted = new WeakSet<object>();
  private destinationRead: { at: number; value: Promise<DestinationState[] | undefined> } | undefined;

  constructor(options: MetricsOptions) {
    this.inbox = options.inbox;
    this.gaugeCacheMs = options.gaugeCacheMs ?? DEFAULTS.gaugeCacheMs;
    if (!Number.isFinite(this.gaugeCacheMs) || this.gaugeCacheMs < 0) {
      throw new TypeError(`Metrics: expected gaugeCacheMs to be a number >= 0, got ${this.gaugeCacheMs}`);
    }
    this.now = options.now ?? Date.now;
    const registers = [this.registry];
    this.received = new Tallied({
      name: "inbox_received_total",
      help: "Requests to store a delivery, by source and result (stored, duplicate, conflict, rejected, unavailable).",
      labelNames: ["source", "result"],
      registers,
    });
    this.rejected = new Tallied({
      name: "inbox_rejected_total",
      help: "Requests refused and not stored, by status code and reason class.",
      labelNames: ["source", "status", "reason"],
      registers,
    });
    this.ack = new Spreads({
      name: "inbox_ack_duration_seconds",
      help: "From the request's arrival to its 200, the delivery committed.",
      labelNames: ["source"],
      buckets: ACK_BUCKETS,
      registers,
    });
    this.batch = new Spreads({
      name: "inbox_commit_batch_size",
      help: "Writes (stores, claims, finishes …) shared by one group commit.",
      buckets: BATCH_BUCKETS,
      registers,
    }).spread("", {});
    this.commitSeconds = new Spreads({
      name: "inbox_commit_duration_seconds",
      help: "How long one group commit took, its fsync included.",
      buckets: ACK_BUCKETS,
      registers,
    }).spread("", {});
    this.handler = new Spreads({
      name: "inbox_handler_duration_seconds",
      help: "How long a handler ran on one delivery, success or not.",
      labelNames: ["source"],
      buckets: WORK_BUCKETS,
      registers,
    });
    this.wait = new Spreads({
      name: "inbox_queue_wait_seconds",
      help: "From a delivery's arrival to its first claim.",
      labelNames: ["source"],
      buckets: WAIT_BUCKETS,
      registers,
    });
    this.attempts = new Tallied({
      name: "inbox_attempts_total",
      help: "Claims of a delivery, each one try.",
      labelNames: ["source"],
      registers,
    });
    this.origins = new Tallied({
      name: "inbox_claimed_by_origin_total",
      help: "First tries of a delivery's routes (the handler and each destination take it up once each), by source and origin (webhook, or reconcile: fetched from the provider's API).",
      labelNames: ["source", "origin"],
      registers,
    });
    this.retries = new Tallied({
      name: "inbox_retries_total",
      help: "Failed tries put back in the queue for later.",
      labelNames: ["source"],
      registers,
    });
    this.failures = new Tallied({
      name: "inbox_failures_total",
      help: "Deliveries set aside as failed: a permanent error, or the last attempt used.",
      labelNames: ["source"],
      registers,
    });
    this.takeovers = new Tallied({
      name: "inbox_lease_takeovers_total",
      help: "Claims that took a delivery over from a worker whose lease had run out.",
      labelNames: ["source"],
      registers,
    });
    this.lostLeases = new Tallied({
      name: "inbox_leases_lost_total",
      help: "Leases this worker lost to a takeover while it worked: its writes were rolled back.",
      labelNames: ["source"],
      registers,
    });
    this.forwards = new Tallied({
      name: "inbox_forwards_total",
      help: "Forwards (and publishes) to a destination, by outcome: done, retry, failed (set aside), gone (410).",
      labelNames: ["destination", "outcome"],
      registers,
    });
    this.dbErrors = new Tallied({
      name: "inbox_db_errors_total",
      help: "Database errors a worker met and carried on from, by role (handler, forward) and class (SQLSTATE class: 40 deadlock or serialization, 08 connection, 53 resources, 57 cancelled or shutting down; or a socket's or SQLite's code).",
      labelNames: ["role", "class"],
      registers,
    });
    this.forwardSeconds = new Spreads({
      name: "inbox_forward_duration_seconds",
      help: "How long one forward took, from the request to its answer (or failure).",
      labelNames: ["destination"],
      buckets: WORK_BUCKETS,
      registers,
    });
    const self = this;
    new client.Gauge({
      name: "inbox_destination_state",
      help: "Each destination's state: 0 closed (forwarding), 1 open (its breaker: waiting or probing), 2 paused.",
      labelNames: ["destination"],
      registers,
      async collect() {
        const states = await self.destinationStates();
        if (!states) return;
        this.reset();
        for (const d of states)
          this.set({ destination: d.name }, d.state === "closed" ? 0 : d.state === "open" ? 1 : 2);
      },
    });
    new client.Gauge({
      name: "inbox_destination_waiting",
      help: "Deliveries waiting for each destination (received, not yet leased).",
      labelNames: ["destination"],
      registers,
      async collect() {
        const states = await self.destinationStates();
        if (!states) return;
        this.reset();
        for (const d of states) this.set({ destination: d.name }, d.waiting);
      },
    });
    new client.Gauge({
      name: "inbox_destination_removed_waiting",
      help: "Deliveries still waiting (or leased) for a destination the configuration has removed (lib/config/): cancel them or bring it back.",
      labelNames: ["destination"],
      registers,
      async collect() {
        const states = await self.destinationStates();
        if (!states) return;
        this.reset();
        for (const d of states)
          if (d.pausedReason?.startsWith(REMOVED)) this.set({ destination: d.name }, d.waiting + d.processing);
      },
    });
    new client.Gauge({
      name: "inbox_deliveries",
      help: "Deliveries in the store, by source and status (read at most every gaugeCacheMs).",
      labelNames: ["source", "status"],
      registers,
      async collect() {
        const gauges = await self.gauges();
        if (!gauges) return;
        this.reset();
        for (const g of gauges.bySourceStatus) this.set({ source: g.source, status: g.status }, g.n);
      },
    });
    new client.Gauge({
      name: "inbox_oldest_waiting_seconds",
      help: "Per source, how long the oldest delivery not yet done or failed has waited since it arrived.",
      labelNames: ["source"],
      registers,
      async collect() {
        const gauges = await self.gauges();
        if (!gauges) return;
        this.reset();
        for (const g of gauges.oldestWaitingMs) this.set({ source: g.source }, g.ms / 1000);
      },
    });
    if (options.processMetrics ?? true) client.collectDefaultMetrics({ register: this.registry });
  }

  /** observe counts one receiver answer; ackMs is given for the 200s, status for the refusals. */
  observe(source: string, outcome: Answered, ackMs?: number, status?: number): void {
    let bySource = this.intake.get(source);
    if (!bySource) this.intake.set(source, (bySource = new Map()));
    let tally = bySource.get(outcome);
    if (!tally)
      bySource.set(outcome, (tally = this.received.tally(`${source}\u0000${outcome}`, { source, result: outcome })));
    tally.pending++;
    if (ackMs !== undefined) {
      let spread = this.acks.get(source);
      if (!spread) this.acks.set(source, (spread = this.ack.spread(source, { source })));
      spread.observe(ackMs / 1000);
    }
    if (outcome === "rejected" && status !== undefined) {
      const reason = reasonOf(status);
      this.rejected.tally(`${source}\u0000${status}`, { source, status: String(status), reason }).pending++;
    }
  }

  /** commit records one group commit: pass it as the store's onCommit. */
  readonly commit = (size: number, ms: number): void => {
    this.batch.observe(size);
    this.commitSeconds.observe(ms / 1000);
  };

  /** claimed counts a try; its first claim also times the wait since arrival, a takeover is counted too. */
  claimed(lease: Lease): void {
    const { source } = lease;
    this.attempts.tally(source, { source }).pending++;
    if (lease.attempts === 1 && !lease.takeover) {
      this.wait.spread(source, { source }).observe(Math.max(0, this.now() - lease.receivedAt) / 1000);
      const origin = lease.origin ?? "webhook";
      this.origins.tally(`${source}\n${origin}`, { source, origin }).pending++;
    }
    if (lease.takeover) this.takeovers.tally(source, { source }).pending++;
  }

  /** handled times one run of a handler, whatever its outcome. */
  handled(lease: Lease, ms: number): void {
    this.handler.spread(lease.source, { source: lease.source }).observe(ms / 1000);
  }

  /** retried counts a failed try put back in the queue. */
  retried(lease: Lease): void {
    this.retries.tally(lease.source, { source: lease.source }).pending++;
  }

  /** failed counts a delivery set aside as failed. */
  failed(delivery: { source: string }): void {
    this.failures.tally(delivery.source, { source: delivery.source }).pending++;
  }

  /** lost counts a lease lost to another worker while this one worked. */
  lost(lease: Lease): void {
    this.lostLeases.tally(lease.source, { source: lease.source }).pending++;
  }

  /**
   * reportReadiness adds inbox_ready, what /readyz would answer, as 1 or 0: a receiver that still answers
   * scrapes but cannot commit (a full disk, a lost PostgreSQL) shows as up and not ready. Called by the
   * receiver and by listen(); a second call only swaps the readiness it reads.
   */
  reportReadiness(readiness: Readiness): void {
    const first = this.readiness === undefined;
    this.readiness = readiness;
    if (!first) return;
    const self = this;
    // Registered only once asked for: an unset label-less gauge would show 0, not ready, where nobody said so.
    new client.Gauge({
      name: "inbox_ready",
      help: "1 while a delivery could be committed now (what /readyz answers), else 0.",
      registers: [this.registry],
      async collect() {
        this.set((await self.readiness!.ready()) === true ? 1 : 0);
      },
    });
  }

  /** forwarded counts one forward to a destination by its outcome, and times it. */
  forwarded(destination: string, outcome: "done" | "retry" | "failed" | "gone", ms: number): void {
    this.forwards.tally(`${destination}\u0000${outcome}`, { destination, outcome }).pending++;
    this.forwardSeconds.spread(destination, { destination }).observe(ms / 1000);
  }

  /** dbError counts one database error that the handler loop or a forwarding lane met and carried on from. */
  dbError(role: "handler" | "forward", error: unknown): void {
    // A batch that fails rejects each of its ops with the same error: that is one error, not one per op.
    if (error instanceof Object) {
      if (this.counted.has(error)) return;
      this.counted.add(error);
    }
    const kind = sqlstate(error);
    this.dbErrors.tally(`${role}\u0000${kind}`, { role, class: kind }).pending++;
  }

  // destinationStates reads the destinations at most once per gaugeCacheMs, as gauges() does.
  private destinationStates(): Promise<DestinationState[] | undefined> {
    const t = performance.now();
    if (!this.destinationRead || t - this.destinationRead.at >= this.gaugeCacheMs) {
      this.destinationRead = { at: t, value: this.inbox.destinations().catch(() => undefined) };
    }
    return this.destinationRead.value;
  }

  /** text renders the registry in Prometheus's text format. */
  text(): Promise<string> {
    return this.registry.metrics();
  }

  /** listen serves /metrics, /livez and /readyz alone on a port of its own (the worker's --metrics-port). */
  async listen(port: number, host: string = DEFAULTS.host, readiness?: Readiness): Promise<Server> {
    const ready = readiness ?? new Readiness(this.inbox);
    this.reportReadiness(ready);
    const server = createServer((req, res) => {
      if (route(req, res, ready, this)) return;
      res.writeHead(404, { "content-type": "text/plain; charset=utf-8" });
      res.end("not found: try /metrics, /livez or /readyz");
    });
    await new Promise<void>((resolve, reject) => server.once("error", reject).listen(port, host, () => resolve()));
    return server;
  }

  // gauges reads the store's gauges at most once per gaugeCacheMs, however many scrapes and collectors
  // ask; a failed read keeps the last values on show rather than failing the whole scrape.
  private gauges(): Promise<Gauges | undefined> {
    const t = performance.now();
    if (!this.gaugeRead || t - this.gaugeRead.at >= this.gaugeCacheMs) {
      this.gaugeRead = { at: t, value: this.inbox.gauges().catch(() => undefined) };
    }
    return this.gaugeRead.value;
  }

  /**
   * consumedFrom shows a broker source's tallies (consume.ts's ConsumerCounts), read at each scrape:
   * inbox_consumed_total by source and result (consumed, stored, duplicate, refused, acked, redelivered,
   * unavailable) and inbox_consumer_lag, the messages its broker still holds for it; given its health,
   * inbox_consumer_state and inbox_consumer_pauses_total by reason.
   */
  consumedFrom(source: string, counts: { readonly lag: number }, health?: ConsumerHealth): void {
    this.consumedSources ??= new Map();
    const sources = this.consumedSources;
    sources.set(source, counts);
    if (health) this.consumerHealth.set(source, health);
    if (sources.size > 1) return;
    const healths = this.consumerHealth;
    new client.Gauge({
      name: "inbox_consumer_state",
      help: "Each broker source's consumer: 0 consuming, 1 paused (its stream, queue or consumer gone, cancelled, no permission, no connection; or starting), 2 starved (taking nothing while its broker holds messages for it), 3 refused (its settings could lose a message).",
      labelNames: ["source"],
      registers: [this.registry],
      collect() {
        for (const [name, h] of healths) this.set({ source: name }, h.code());
      },
    });
    new client.Counter({
      name: "inbox_consumer_pauses_total",
      help: "Times a broker source's consumer stopped consuming, by reason (consumer_deleted, stream_missing, queue_missing, cancelled, permission, connection, refused).",
      labelNames: ["source", "reason"],
      registers: [this.registry],
      collect() {
        this.reset();
        for (const [name, h] of healths) {
          // Every reason is shown from the start, at 0, so that increase() sees the first pause.
          for (const reason of h.reasons) this.inc({ source: name, reason }, 0);
          for (const [reason, n] of h.pauses) this.inc({ source: name, reason }, n);
        }
      },
    });
    new client.Counter({
      name: "inbox_consumed_total",
      help: "Messages of broker sources, by source and what became of them (consumed, stored, duplicate, refused, acked, redelivered, unavailable).",
      labelNames: ["source", "result"],
      registers: [this.registry],
      collect() {
        this.reset();
        for (const [name, c] of sources)
          for (const [result, n] of Object.entries(c) as [string, number][])
            if (result !== "lag") this.inc({ source: name, result }, n);
      },
    });
    new client.Gauge({
      name: "inbox_consumer_lag",
      help: "Messages a broker source's broker still holds for it: JetStream's pending, RabbitMQ's queue depth.",
      labelNames: ["source"],
      registers: [this.registry],
      collect() {
        for (const [name, c] of sources) this.set({ source: name }, c.lag);
      },
    });
  }

  private consumedSources?: Map<string, { readonly lag: number }>;
  private readonly consumerHealth = new Map<string, ConsumerHealth>();
}

/** ConsumerHealth is what the metrics read of a broker source's consumer (consume-health.ts's Health). */
export interface ConsumerHealth {
  /** inbox_consumer_state's value now. */
  code(): number;
  /** Its pauses so far, by reason. */
  readonly pauses: ReadonlyMap<string, number>;
  /** Every reason a pause may have, each shown from 0. */
  readonly reasons: readonly string[];
}

/** Readiness answers /readyz: the store's ready(), cached for cacheMs, and false at once when stopping. */
export class Readiness {
  private readonly inbox: Inbox;
  private readonly cacheMs: number;
  private read: { at: number; value: Promise<true | string> } | undefined;
  /** stopping is true once the process has begun to stop: a load balancer should send no more. */
  stopping: () => boolean;
  /** also is what else the process must be to be ready (consumer.ts: each source consuming, none starved). */
  private readonly also: () => true | string;

  constructor(inbox: Inbox, options: { cacheMs?: number; stopping?: () => boolean; also?: () => true | string } = {}) {
    this.inbox = inbox;
    this.also = options.also ?? (() => true);
    this.cacheMs = options.cacheMs ?? DEFAULTS.readyCacheMs;
    if (!Number.isFinite(this.cacheMs) || this.cacheMs < 0)
      throw new TypeError(`Readiness: expected cacheMs to be a number >= 0, got ${this.cacheMs}`);
    this.stopping = options.stopping ?? (() => false);
  }

  /** ready is true if a delivery could be committed now, else why not. */
  async ready(): Promise<true | string> {
    if (this.stopping()) return "shutting down";
    const also = this.also();
    if (also !== true) return also;
    const t = performance.now();
    if (!this.read || t - this.read.at >= this.cacheMs) {
      this.read = { at: t, value: this.inbox.ready().catch((error: unknown) => `cannot commit: ${message(error)}`) };
    }
    return this.read.value;
  }
}

/**
 * route answers GET (or HEAD) /livez, /readyz and, given metrics, /metrics, and returns true; any other
 * request is the caller's, and it returns false. /livez answers while the event loop turns; /readyz
 * only while a delivery could be committed now.
 */
export function route(req: IncomingMessage, res: ServerResponse, readiness: Readiness, metrics?: Metrics): boolean {
  if (req.method !== "GET" && req.method !== "HEAD") return false;
  const path = (req.url ?? "/").split("?")[0];
  if (path !== "/livez" && path !== "/readyz" && (path !== "/metrics" || !metrics)) return false;
  const answer = (status: number, text: string, type = "text/plain; charset=utf-8") => {
    if (res.headersSent || res.destroyed) return;
    const closing = readiness.stopping() ? { connection: "close" } : {};
    res.writeHead(status, { "content-type": type, "content-length": Buffer.byteLength(text), ...closing });
    res.end(req.method === "HEAD" ? undefined : text);
  };
  if (path === "/livez") answer(200, "ok");
  else if (path === "/readyz")
    void readiness.ready().then((ok) => answer(ok === true ? 200 : 503, ok === true ? "ready" : `not ready: ${ok}`));
  else
    metrics!.text().then(
      (text) => answer(200, text, metrics!.registry.contentType),
      (error: unknown) => answer(500, `metrics: ${message(error)}`),
    );
  return true;
}

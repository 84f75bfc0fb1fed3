// metrics.ts: what the inbox reports. One prom-client registry per process with the intake (receiver),
// queue (gauges read from the store, cached) and work (worker) metrics, and the small HTTP routes that
// show them: /metrics in Prometheus's text format, /livez, /readyz. Imported by receiver.ts and worker.ts:
//   curl http://127.0.0.1:8000/metrics                       # the receiver serves it on its own port
//   npx tsx worker.ts --metrics-port 9464 && curl http://127.0.0.1:9464/metrics
// No delivery ID is ever a label: sources are few and named in the config, statuses and results fixed.

import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import client from "prom-client";
import { DEFAULTS, message, type Gauges, type Inbox, type Lease, type Stored } from "./inbox.ts";

/** Outcome is how the receiver answered one request, as received_total counts it. */
export type Outcome = Stored | "rejected" | "unavailable";

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

/**
 * Metrics holds a process's registry and the calls that feed it: observe() once per receiver answer,
 * commit() from the store's committer, and claimed/handled/retried/failed/lost from the worker. Each
 * call is a counter or histogram child looked up once per label set, so the hot path allocates nothing.
 */
export class Metrics {
  readonly registry = new client.Registry();
  private readonly inbox: Inbox;
  private readonly gaugeCacheMs: number;
  private readonly now: () => number;
  private readonly children = new Map<string, unknown>();
  private gaugeRead: { at: number; value: Promise<Gauges | undefined> } | undefined;

  private readonly received: client.Counter<"source" | "result">;
  private readonly rejected: client.Counter<"source" | "status" | "reason">;
  private readonly ack: client.Histogram<"source">;
  private readonly batch: client.Histogram;
  private readonly commitSeconds: client.Histogram;
  private readonly handler: client.Histogram<"source">;
  private readonly wait: client.Histogram<"source">;
  private readonly attempts: client.Counter<"source">;
  private readonly retries: client.Counter<"source">;
  private readonly failures: client.Counter<"source">;
  private readonly takeovers: client.Counter<"source">;
  private readonly lostLeases: client.Counter<"source">;

  constructor(options: MetricsOptions) {
    this.inbox = options.inbox;
    this.gaugeCacheMs = options.gaugeCacheMs ?? DEFAULTS.gaugeCacheMs;
    if (!Number.isFinite(this.gaugeCacheMs) || this.gaugeCacheMs < 0) {
      throw new TypeError(`Metrics: expected gaugeCacheMs to be a number >= 0, got ${this.gaugeCacheMs}`);
    }
    this.now = options.now ?? Date.now;
    const registers = [this.registry];
    this.received = new client.Counter({
      name: "inbox_received_total", help: "Requests to store a delivery, by source and result (stored, duplicate, conflict, rejected, unavailable).",
      labelNames: ["source", "result"], registers,
    });
    this.rejected = new client.Counter({
      name: "inbox_rejected_total", help: "Requests refused and not stored, by status code and reason class.",
      labelNames: ["source", "status", "reason"], registers,
    });
    this.ack = new client.Histogram({
      name: "inbox_ack_duration_seconds", help: "From the request's arrival to its 200, the delivery committed.",
      labelNames: ["source"], buckets: ACK_BUCKETS, registers,
    });
    this.batch = new client.Histogram({
      name: "inbox_commit_batch_size", help: "Writes (stores, claims, finishes …) shared by one group commit.", buckets: BATCH_BUCKETS, registers,
    });
    this.commitSeconds = new client.Histogram({
      name: "inbox_commit_duration_seconds", help: "How long one group commit took, its fsync included.", buckets: ACK_BUCKETS, registers,
    });
    this.handler = new client.Histogram({
      name: "inbox_handler_duration_seconds", help: "How long a handler ran on one delivery, success or not.",
      labelNames: ["source"], buckets: WORK_BUCKETS, registers,
    });
    this.wait = new client.Histogram({
      name: "inbox_queue_wait_seconds", help: "From a delivery's arrival to its first claim.",
      labelNames: ["source"], buckets: WAIT_BUCKETS, registers,
    });
    this.attempts = new client.Counter({ name: "inbox_attempts_total", help: "Claims of a delivery, each one try.", labelNames: ["source"], registers });
    this.retries = new client.Counter({ name: "inbox_retries_total", help: "Failed tries put back in the queue for later.", labelNames: ["source"], registers });
    this.failures = new client.Counter({
      name: "inbox_failures_total", help: "Deliveries set aside as failed: a permanent error, or the last attempt used.", labelNames: ["source"], registers,
    });
    this.takeovers = new client.Counter({
      name: "inbox_lease_takeovers_total", help: "Claims that took a delivery over from a worker whose lease had run out.", labelNames: ["source"], registers,
    });
    this.lostLeases = new client.Counter({
      name: "inbox_leases_lost_total", help: "Leases this worker lost to a takeover while it worked: its writes were rolled back.", labelNames: ["source"], registers,
    });
    const self = this;
    new client.Gauge({
      name: "inbox_deliveries", help: "Deliveries in the store, by source and status (read at most every gaugeCacheMs).",
      labelNames: ["source", "status"], registers,
      async collect() {
        const gauges = await self.gauges();
        if (!gauges) return;
        this.reset();
        for (const g of gauges.bySourceStatus) this.set({ source: g.source, status: g.status }, g.n);
      },
    });
    new client.Gauge({
      name: "inbox_oldest_waiting_seconds", help: "Per source, how long the oldest delivery not yet done or failed has waited since it arrived.",
      labelNames: ["source"], registers,
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
  observe(source: string, outcome: Outcome, ackMs?: number, status?: number): void {
    this.child(this.received, "r", source, outcome).inc();
    if (ackMs !== undefined) this.child(this.ack, "a", source).observe(ackMs / 1000);
    if (outcome === "rejected" && status !== undefined) this.child(this.rejected, "x", source, String(status), reasonOf(status)).inc();
  }

  /** commit records one group commit: pass it as the store's onCommit. */
  readonly commit = (size: number, ms: number): void => {
    this.batch.observe(size);
    this.commitSeconds.observe(ms / 1000);
  };

  /** claimed counts a try; its first claim also times the wait since arrival, a takeover is counted too. */
  claimed(lease: Lease): void {
    this.child(this.attempts, "t", lease.source).inc();
    if (lease.attempts === 1 && !lease.takeover) this.child(this.wait, "w", lease.source).observe(Math.max(0, this.now() - lease.receivedAt) / 1000);
    if (lease.takeover) this.child(this.takeovers, "o", lease.source).inc();
  }

  /** handled times one run of a handler, whatever its outcome. */
  handled(lease: Lease, ms: number): void {
    this.child(this.handler, "h", lease.source).observe(ms / 1000);
  }

  /** retried counts a failed try put back in the queue. */
  retried(lease: Lease): void {
    this.child(this.retries, "y", lease.source).inc();
  }

  /** failed counts a delivery set aside as failed. */
  failed(lease: Lease): void {
    this.child(this.failures, "f", lease.source).inc();
  }

  /** lost counts a lease lost to another worker while this one worked. */
  lost(lease: Lease): void {
    this.child(this.lostLeases, "l", lease.source).inc();
  }

  /** text renders the registry in Prometheus's text format. */
  text(): Promise<string> {
    return this.registry.metrics();
  }

  /** listen serves /metrics, /livez and /readyz alone on a port of its own (the worker's --metrics-port). */
  async listen(port: number, host: string = DEFAULTS.host, readiness?: Readiness): Promise<Server> {
    const ready = readiness ?? new Readiness(this.inbox);
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

  // child returns the metric's child for these label values, made once.
  private child<T>(metric: { labels(...values: string[]): T }, tag: string, ...values: string[]): T {
    const key = `${tag}\u0000${values.join("\u0000")}`;
    let found = this.children.get(key) as T | undefined;
    if (found === undefined) {
      found = metric.labels(...values);
      this.children.set(key, found);
    }
    return found;
  }
}

/** Readiness answers /readyz: the store's ready(), cached for cacheMs, and false at once when stopping. */
export class Readiness {
  private readonly inbox: Inbox;
  private readonly cacheMs: number;
  private read: { at: number; value: Promise<true | string> } | undefined;
  /** stopping is true once the process has begun to stop: a load balancer should send no more. */
  stopping: () => boolean;

  constructor(inbox: Inbox, options: { cacheMs?: number; stopping?: () => boolean } = {}) {
    this.inbox = inbox;
    this.cacheMs = options.cacheMs ?? DEFAULTS.readyCacheMs;
    if (!Number.isFinite(this.cacheMs) || this.cacheMs < 0) throw new TypeError(`Readiness: expected cacheMs to be a number >= 0, got ${this.cacheMs}`);
    this.stopping = options.stopping ?? (() => false);
  }

  /** ready is true if a delivery could be committed now, else why not. */
  async ready(): Promise<true | string> {
    if (this.stopping()) return "shutting down";
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
  else if (path === "/readyz") void readiness.ready().then((ok) => answer(ok === true ? 200 : 503, ok === true ? "ready" : `not ready: ${ok}`));
  else metrics!.text().then((text) => answer(200, text, metrics!.registry.contentType), (error: unknown) => answer(500, `metrics: ${message(error)}`));
  return true;
}

// lib/receiver.ts: the receiver as a library. One request handler verifies, stores, and answers 200 only once
// the delivery is committed. It mounts three ways: on node:http, as Express/Connect middleware, and as a
// Fetch API handler (Hono, Next.js route handlers, Bun, Deno). receiver.ts is this handler on node:http.
//   const webhooks = createWebhooks({ inbox: connect("inbox.db"), sources: loadSources(config, process.env) });
//   http.createServer(webhooks.node) | app.use("/webhooks", webhooks.express) | export const POST = webhooks.fetch

import type { IncomingMessage, ServerResponse } from "node:http";
import { DEFAULTS } from "./defaults.ts";
import { filterInput } from "./routing/filter.ts";
import { label, message, silent, type Log } from "./log.ts";
import { type Answered, NO_SOURCE, type Metrics } from "./metrics.ts";
import { orderOfRequest } from "./order.ts";
import { unsignedSource, verify, type Source, type Verdict } from "./providers.ts";
import { chooseRoutes } from "./routing/routes.ts";
import type { Headers, Inbox, Stored } from "./store.ts";
import { requireSqlite } from "./runtime.ts";
import { startReceive } from "./traces.ts";

// An app that mounts the handler on a Node without node:sqlite stops here, with one line, not at connect().
requireSqlite();

/** WebhooksOptions configures createWebhooks; every number has a default in DEFAULTS. */
export interface WebhooksOptions {
  /** Where deliveries are stored; the handler only ever calls store(). */
  inbox: Pick<Inbox, "store">;
  /** Sources by name, each served at POST /<name>. @default the unsigned `default` source at / */
  sources?: ReadonlyMap<string, Source>;
  /** A path prefix to drop before the source name is looked up, where the framework passes the whole path (Hono, Next.js, Fastify). @default "" */
  basePath?: string;
  /** @default DEFAULTS.maxBodyBytes */
  maxBodyBytes?: number;
  /** @default DEFAULTS.maxIdLength */
  maxIdLength?: number;
  /** Requests whose body is complete and whose store has not answered, past which the answer is 503. @default DEFAULTS.maxInFlight */
  maxInFlight?: number;
  /** Milliseconds a body may take before it must keep up minBodyRate; then 408. @default DEFAULTS.bodyTimeoutMs */
  bodyTimeoutMs?: number;
  /** Bytes a second a body must average once bodyTimeoutMs has passed. @default DEFAULTS.minBodyRate */
  minBodyRate?: number;
  /**
   * Count a request against maxInFlight from its headers, as before issue 31, so that senders stalled
   * mid-body fill it. For comparison only: the tests' control. @default false
   */
  inFlightFromHeaders?: boolean;
  /** @default DEFAULTS.retryAfterS */
  retryAfterS?: number;
  /** Where the one line per delivery goes; the fields are for the JSON format. @default console.error */
  log?: Log;
  /** Counts every answer (serve it with metrics.ts's route()). @default none */
  metrics?: Metrics;
  /** The clock for signature windows, in ms since the epoch. @default Date.now */
  now?: () => number;
  /** Whether node:http answers should close their connection; receiver.ts says yes while it stops. @default never */
  closing?: () => boolean;
}

/** WebhookRequest is one request as every mount hands it over: headers kept apart, the body read on demand. */
export interface WebhookRequest {
  method: string;
  /** The path and query, as the request line gives them. */
  url: string;
  headers: Headers;
  /** read returns the whole body, refusing (413) past the limit, (400) a body cut short and (408) one too slow. */
  read(maxBody: number): Promise<Buffer>;
}

/** WebhookAnswer is what the handler replies, whichever way it is mounted. */
export interface WebhookAnswer {
  status: number;
  headers: Record<string, string>;
  body: string;
  /** The rest of the request was not read, so the connection must not carry another one. */
  closeConnection?: boolean;
}

/** Webhooks is the one request handler in its three mounts, plus the shared core they translate to and from. */
export interface Webhooks {
  /** node is a node:http request listener. */
  node(req: IncomingMessage, res: ServerResponse): void;
  /**
   * express is Express/Connect middleware. Mount it before any body parser, or after express.raw({ type:
   * "*\/*" }); a path that is not a source goes on to next().
   */
  express(req: IncomingMessage & { body?: unknown }, res: ServerResponse, next?: (error?: unknown) => void): void;
  /** fetch is a Fetch API handler: (Request) => Promise<Response>. */
  fetch(request: Request): Promise<Response>;
  /** answer runs one request through verify, store and reply; the mounts only translate. */
  answer(request: WebhookRequest): Promise<WebhookAnswer>;
  /** inFlight counts the requests, by every mount, whose body is complete and whose answer is not yet decided. */
  readonly inFlight: number;
  /** idle resolves once no request is in flight. */
  idle(): Promise<void>;
  /**
   * setSources serves these sources from the next request on (a configuration taken up while running,
   * lib/config/); a request already past its lookup finishes with the sources it found.
   */
  setSources(sources: ReadonlyMap<string, Source> | undefined): void;
}

// Verified is a signature's verdict that a delivery is to be stored.
type Verified = Extract<Verdict, { kind: "delivery" }>;

// Ctx is what one request has found out so far, for its metrics, its log line and its span.
interface Ctx {
  source: string;
  started: number;
  /** The receive span's, stored with the delivery (traces.ts). */
  traceparent: string | null;
  id?: string;
  result?: Stored;
  /** Whether this request took a place among the maxInFlight, which answer() gives back. */
  counted?: boolean;
}

/** Rejected is a request turned away before storing: the status and the reason for the log. */
export class Rejected extends Error {
  readonly status: number;
  readonly closeConnection: boolean;
  readonly headers: Record<string, string>;
  constructor(status: number, reason: string, closeConnection = false, headers: Record<string, string> = {}) {
    super(reason);
    this.status = status;
    this.closeConnection = closeConnection;
    this.headers = headers;
  }
}

// The top cause of broken signatures in Express apps: a JSON parser ran first and the raw bytes are gone.
const PARSED_FIRST =
  "the request body was already read by a body parser (express.json() or similar), so its signature cannot be checked; " +
  'mount the inbox before the parser, or give it express.raw({ type: "*/*" })';

/** createWebhooks builds the one request handler over an open inbox. */
export function createWebhooks(options: WebhooksOptions): Webhooks {
  const core = new Receiving(options);
  const { fromHeaders, maxInFlight } = core;
  const onNode = (req: IncomingMessage, res: ServerResponse, read: (maxBody: number) => Promise<Buffer>) => {
    if (fromHeaders) {
      if (core.inFlight >= maxInFlight) return core.send(req, res, core.busy(core.sourceNameOf(req.url ?? "/"), true));
      core.inFlight++;
    }
    // answer() always settles, a client that hung up included (its body read fails), so the request
    // leaves there, without a listener on every response. A destroyed response gets nothing written.
    void core
      .answer({ method: req.method ?? "GET", url: req.url ?? "/", headers: req.headersDistinct, read })
      .then((a) => {
        if (fromHeaders) core.leave();
        core.send(req, res, a);
      });
  };

  return {
    answer: (request) => core.answer(request),
    get inFlight() {
      return core.inFlight;
    },
    idle: () => core.idle(),
    setSources: (sources) => core.setSources(sources),

    node: (req, res) => onNode(req, res, (limit) => readBody(req, limit, core.pace)),

    express: (req, res, next) => {
      // Express strips its mount path from req.url (and keeps the query), so the source name is what is left.
      if (next && !core.sourceFor(req.url ?? "/")) return next();
      const parsed = req.body;
      if (Buffer.isBuffer(parsed)) {
        // express.raw() kept the bytes; its own limit applies first, then this one.
        return onNode(req, res, async (limit) => {
          if (parsed.length > limit) throw new Rejected(413, `body is over the ${limit}-byte limit`);
          return parsed;
        });
      }
      if (req.readableEnded || (req as { _body?: unknown })._body === true) {
        return onNode(req, res, async () => {
          throw new Rejected(500, PARSED_FIRST);
        });
      }
      onNode(req, res, (limit) => readBody(req, limit, core.pace));
    },

    fetch: async (request) => {
      const url = new URL(request.url);
      if (fromHeaders) {
        if (core.inFlight >= maxInFlight) return toResponse(core.busy(core.sourceNameOf(url.pathname), true));
        core.inFlight++;
      }
      try {
        return toResponse(
          await core.answer({
            method: request.method,
            url: url.pathname + url.search,
            headers: distinct(request.headers),
            read: (limit) => readStream(request, limit, core.pace),
          }),
        );
      } finally {
        if (fromHeaders) core.leave();
      }
    },
  };
}

// text is a plain-text answer.
function text(
  status: number,
  body: string,
  headers: Record<string, string> = {},
  closeConnection = false,
): WebhookAnswer {
  return { status, body, headers: { "content-type": "text/plain; charset=utf-8", ...headers }, closeConnection };
}

// The two answers nearly every request gets, made once: the mounts only read an WebhookAnswer.
const STORED = text(200, "stored");
const DUPLICATE = text(200, "duplicate");

// Receiving is the handler's core, shared by its three mounts: the settings checked once, the requests in
// flight, and one request's way through verify, route, store and reply.
class Receiving {
  readonly inbox: Pick<Inbox, "store">;
  readonly maxBody: number;
  readonly maxIdLength: number;
  readonly maxInFlight: number;
  readonly retryAfter: string;
  readonly log: Log;
  // Under --quiet the line per delivery is not even built: it would be most of the handler's own work.
  readonly logs: boolean;
  readonly metrics: Metrics | undefined;
  readonly now: () => number;
  sources: ReadonlyMap<string, Source>;
  readonly basePath: string;
  // The sources with a filter on a route: only their deliveries are looked into (filter.ts).
  filtered: ReadonlySet<Source>;
  readonly closing: () => boolean;
  readonly pace: Pace;
  readonly fromHeaders: boolean;
  // A path that is exactly a source's (no query, no extra slashes) is found without a split or a regex.
  exact: ReadonlyMap<string, Source>;
  inFlight = 0;
  readonly waiting: (() => void)[] = [];

  constructor(options: WebhooksOptions) {
    this.inbox = options.inbox;
    this.maxBody = options.maxBodyBytes ?? DEFAULTS.maxBodyBytes;
    this.maxIdLength = options.maxIdLength ?? DEFAULTS.maxIdLength;
    this.maxInFlight = options.maxInFlight ?? DEFAULTS.maxInFlight;
    this.retryAfter = String(options.retryAfterS ?? DEFAULTS.retryAfterS);
    this.log = options.log ?? ((line: string) => console.error(line));
    this.logs = this.log !== silent;
    this.metrics = options.metrics;
    this.now = options.now ?? Date.now;
    this.basePath = (options.basePath ?? "").replace(/\/+$/, "");
    this.sources = this.exact = new Map();
    this.filtered = new Set();
    this.setSources(options.sources);
    this.closing = options.closing ?? (() => false);
    this.pace = {
      graceMs: options.bodyTimeoutMs ?? DEFAULTS.bodyTimeoutMs,
      rate: options.minBodyRate ?? DEFAULTS.minBodyRate,
    };
    this.fromHeaders = options.inFlightFromHeaders ?? false;
    for (const [name, value] of [
      ["maxBodyBytes", this.maxBody],
      ["maxIdLength", this.maxIdLength],
      ["maxInFlight", this.maxInFlight],
      ["bodyTimeoutMs", this.pace.graceMs],
      ["minBodyRate", this.pace.rate],
    ] as const) {
      if (!Number.isInteger(value) || value < 1)
        throw new TypeError(`createWebhooks: expected ${name} to be a whole number of 1 or more, got ${value}`);
    }
    if (this.basePath && !this.basePath.startsWith("/"))
      throw new TypeError(
        `createWebhooks: expected basePath to start with "/", got ${JSON.stringify(options.basePath)}`,
      );
  }

  // setSources swaps the sources and what is derived from them in one step, between two requests.
  setSources(sources: ReadonlyMap<string, Source> | undefined): void {
    const next = new Map<string, Source>();
    // A broker source is consumed by consumer.ts; nobody may post into it over HTTP, so it is not served.
    for (const [name, source] of sources ?? [["", unsignedSource()]]) if (!source.broker) next.set(name, source);
    this.filtered = new Set([...next.values()].filter((s) => s.routes?.some((r) => r.filter !== undefined)));
    this.exact = new Map([...next].map(([name, source]) => [`${this.basePath}/${name}`, source]));
    this.sources = next;
  }

  // seen counts one answer, once per request, at the point where its outcome is decided.
  seen(source: string, outcome: Answered, started: number, status?: number): void {
    this.metrics?.observe(
      source,
      outcome,
      status === undefined && outcome !== "unavailable" ? performance.now() - started : undefined,
      status,
    );
  }

  leave(): void {
    if (--this.inFlight === 0) for (const resolve of this.waiting.splice(0)) resolve();
  }

  idle(): Promise<void> {
    return this.inFlight === 0 ? Promise.resolve() : new Promise<void>((resolve) => this.waiting.push(resolve));
  }

  // busy answers past maxInFlight. Counted from the headers (the comparison), the body is still unread,
  // so the connection must close; counted from the body's end, it may carry the sender's next request.
  busy(source: string, unread: boolean): WebhookAnswer {
    this.seen(source, "unavailable", performance.now());
    this.log(`rejected: 503 over ${this.maxInFlight} requests in flight`, { level: "error", status: 503 });
    return text(503, "busy, try again later", { "retry-after": this.retryAfter }, unread);
  }

  // sourceFor finds the source a path names, or undefined; the mounts that can pass a request on use it.
  sourceFor(url: string): Source | undefined {
    const found = this.exact.get(url);
    if (found) return found;
    let path = url.split("?")[0]!;
    const base = this.basePath;
    if (base && (path === base || path.startsWith(`${base}/`))) path = path.slice(base.length);
    return this.sources.get(path.replace(/^\/+|\/+$/g, ""));
  }

  sourceNameOf(url: string): string {
    return this.sourceFor(url)?.name ?? NO_SOURCE;
  }

  async answer(req: WebhookRequest): Promise<WebhookAnswer> {
    const traced = startReceive(req.headers);
    const ctx: Ctx = { source: NO_SOURCE, started: performance.now(), traceparent: traced.traceparent };
    let a: WebhookAnswer;
    try {
      a = await traced.run(() => this.answerIn(req, ctx));
    } finally {
      if (ctx.counted) this.leave();
    }
    traced.end({
      status: a.status,
      ...(ctx.source === NO_SOURCE ? {} : { source: ctx.source }),
      id: ctx.id,
      result: ctx.result,
    });
    return a;
  }

  async answerIn(req: WebhookRequest, ctx: Ctx): Promise<WebhookAnswer> {
    try {
      return await this.handle(req, ctx);
    } catch (error) {
      if (error instanceof Rejected) {
        if (error.status !== 404 || req.method === "POST") {
          this.seen(ctx.source, "rejected", ctx.started, error.status);
          this.log(`rejected: ${error.status} ${error.message}`, {
            level: "warn",
            ...(ctx.source === NO_SOURCE ? {} : { source: ctx.source }),
            status: error.status,
          });
        }
        return text(error.status, error.message, error.headers, error.closeConnection);
      }
      this.seen(ctx.source, "unavailable", ctx.started);
      this.log(`rejected: ${message(error)}`, { level: "error", status: 500 });
      return text(500, "internal error");
    }
  }

  // handle is one request's way: its source, its body within the limits, its signature, then the store.
  async handle(req: WebhookRequest, ctx: Ctx): Promise<WebhookAnswer> {
    const source = this.sourceFor(req.url);
    if (!source) throw new Rejected(404, `no source at ${req.url.split("?")[0]}`);
    // Read with the lookup: a setSources() while the body arrives brings new Source objects, not in its set.
    const filtered = this.filtered.has(source);
    ctx.source = source.name;
    if (req.method !== "POST") throw new Rejected(405, `method ${req.method} not allowed`, false, { allow: "POST" });
    // Node's parser has already refused a repeated, non-numeric or conflicting Content-Length (400).
    const length = req.headers["content-length"]?.[0];
    const declared = length === undefined ? undefined : Number(length);
    if (declared !== undefined && declared > this.maxBody)
      throw new Rejected(413, `body of ${declared} bytes is over the ${this.maxBody}-byte limit`, true);

    const body = await req.read(this.maxBody);
    // Only now does the request take a place: one still sending costs memory and a socket, which the body's
    // own limits bound, but nothing that waits on the disk. So stalled senders cannot fill maxInFlight.
    if (!this.fromHeaders) {
      if (this.inFlight >= this.maxInFlight) return this.busy(source.name, false);
      this.inFlight++;
      ctx.counted = true;
    }
    // A source with a filter keeps the body as verifying parsed it, so the filters need not parse it again.
    const parsed: { event?: Record<string, unknown> } | undefined = filtered ? {} : undefined;
    const verdict = verify(source, req.headers, body, this.now(), req.url, parsed);
    // Named by source, so a log fed by several providers says whose signature failed.
    if (verdict.kind === "reject")
      throw new Rejected(
        verdict.status,
        source.name === DEFAULTS.source ? verdict.reason : `${source.name}: ${verdict.reason}`,
      );
    if (verdict.kind === "reply") return text(verdict.status, verdict.body, { "content-type": verdict.contentType });
    const id = verdict.id;
    if (id.length > this.maxIdLength) throw new Rejected(400, `delivery id longer than ${this.maxIdLength} characters`);
    ctx.id = id;
    return this.store(req, ctx, source, body, verdict, parsed);
  }

  // store fixes the delivery's routes, now at store time (one row per destination chosen, routes.ts), and
  // answers once it is on disk: 200 either way, for the provider must stop sending it; 503 if it is not.
  async store(
    req: WebhookRequest,
    ctx: Ctx,
    source: Source,
    body: Buffer,
    verdict: Verified,
    parsed: { event?: Record<string, unknown> } | undefined,
  ): Promise<WebhookAnswer> {
    const id = verdict.id;
    let outcome: Stored;
    try {
      const routes = source.routes;
      const chosen = routes
        ? chooseRoutes(
            routes,
            verdict.eventType,
            parsed
              ? filterInput({
                  source: source.name,
                  eventType: verdict.eventType,
                  body,
                  headers: req.headers,
                  url: req.url,
                  parsed: parsed.event,
                })
              : undefined,
          )
        : undefined;
      outcome = await this.inbox.store({
        source: source.name,
        id,
        body,
        contentType: req.headers["content-type"]?.[0] ?? null,
        eventType: verdict.eventType,
        providerTime: verdict.providerTime,
        traceparent: ctx.traceparent,
        ...orderOfRequest(source.order, req.headers, body),
        ...(chosen ? { destinations: chosen.destinations } : {}),
        ...(chosen?.keepHeaders ? { headers: req.headers } : {}),
      });
    } catch (error) {
      // Not on disk, so the sender must keep it and try again.
      this.seen(source.name, "unavailable", ctx.started);
      this.log(`rejected ${label({ source: source.name, id })}: 503 could not store: ${message(error)}`, {
        level: "error",
        source: source.name,
        id,
        status: 503,
      });
      return text(503, "try again later", { "retry-after": this.retryAfter });
    }
    this.seen(source.name, outcome, ctx.started);
    ctx.result = outcome;
    if (this.logs)
      this.log(
        `${outcome === "stored" ? "stored" : outcome === "conflict" ? "duplicate (conflict: the body differs; kept the first)" : "duplicate"} ${label({ source: source.name, id })}`,
        { source: source.name, id, status: 200, result: outcome },
      );
    return outcome === "stored" ? STORED : DUPLICATE;
  }

  // send writes an answer on node:http. The rest of a refused body must not be read as the next request:
  // after the answer has gone out, the client gets a moment to read it, then the connection is dropped.
  send(req: IncomingMessage, res: ServerResponse, a: WebhookAnswer): void {
    if (res.headersSent || res.destroyed) return;
    // While the receiver stops, each answer closes its connection: kept alive, it would hold the exit up
    // for as long as the client kept it, and carry more requests in meanwhile.
    const close = a.closeConnection || this.closing();
    // A flat [name, value, …] list: node:http writes it as it is, without walking an object's keys.
    const head: string[] = [];
    for (const name in a.headers) head.push(name, a.headers[name]!);
    head.push("content-length", String(Buffer.byteLength(a.body)));
    if (close) head.push("connection", "close");
    res.writeHead(a.status, head);
    res.end(a.body);
    if (a.closeConnection) {
      const socket = req.socket;
      res.on("finish", () => setTimeout(() => socket.destroy(), 1_000).unref());
    }
  }
}

function toResponse(a: WebhookAnswer): Response {
  // A Fetch runtime owns its connections; Connection is not a header a handler may set there.
  return new Response(a.body, { status: a.status, headers: a.headers });
}

// distinct gives Fetch headers in headersDistinct's shape. The Fetch API has already joined repeats with
// ", ", so they are split again there: a repeated signature or ID is refused as it is on node:http. (A
// signed header whose one value holds ", " reads as repeated in this mount only.)
function distinct(headers: globalThis.Headers): Headers {
  const out: Headers = {};
  headers.forEach((value, name) => {
    out[name] = value.split(", ");
  });
  return out;
}

// Pace is how fast a body must arrive: after graceMs, at rate bytes a second on average since it began.
interface Pace {
  graceMs: number;
  rate: number;
}

// paced calls tooSlow once the body has fallen behind its pace: at graceMs + received / rate from the start.
// One timer per body, re-armed only when it fires, so a fast body costs no timer work per chunk. The clock is
// performance.now, and the limits are parameters, which is how the tests make it fire within a second.
function paced(pace: Pace, received: () => number, tooSlow: (why: string) => void): { stop(): void } {
  const started = performance.now();
  const check = () => {
    const late = performance.now() - (started + pace.graceMs + (received() * 1000) / pace.rate);
    if (late < 0) {
      timer = setTimeout(check, Math.ceil(-late)).unref();
      return;
    }
    tooSlow(
      `body too slow: ${received()} bytes in ${Math.round(performance.now() - started)} ms, under ${pace.rate} bytes/s after ${pace.graceMs} ms`,
    );
  };
  let timer = setTimeout(check, pace.graceMs).unref();
  return { stop: () => clearTimeout(timer) };
}

// readBody reads the whole body, counting bytes as they arrive so a liar or a stream is cut at the limit,
// and fails if the client hangs up before the end, or falls behind its pace: a fragment is never stored.
function readBody(req: IncomingMessage, maxBody: number, pace: Pace): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const clock = paced(
      pace,
      () => size,
      (why) => stop(new Rejected(408, why, true)),
    );
    const stop = (error: Rejected) => {
      clock.stop();
      req.off("data", onData).off("end", onEnd).off("close", onClose);
      req.pause();
      reject(error);
    };
    const onData = (chunk: Buffer) => {
      size += chunk.length;
      if (size > maxBody) return stop(new Rejected(413, `body is over the ${maxBody}-byte limit`, true));
      chunks.push(chunk);
    };
    const onEnd = () => {
      clock.stop();
      req.off("close", onClose);
      resolve(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, size));
    };
    const onClose = () => stop(new Rejected(400, `body cut short after ${size} bytes`, true));
    req.on("data", onData).on("end", onEnd).on("close", onClose);
  });
}

// readStream is readBody for a Fetch Request: counted as it arrives, cancelled at the limit or when it falls
// behind its pace.
async function readStream(request: Request, maxBody: number, pace: Pace): Promise<Buffer> {
  if (!request.body) return Buffer.alloc(0);
  const reader = request.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  // A cancel ends the pending read as if the body were done, so the reason is kept to be thrown after it.
  let slow: string | undefined;
  const clock = paced(
    pace,
    () => size,
    (why) => {
      slow = why;
      void reader.cancel().catch(() => {});
    },
  );
  try {
    for (;;) {
      let chunk: ReadableStreamReadResult<Uint8Array>;
      try {
        chunk = await reader.read();
      } catch {
        throw new Rejected(slow ? 408 : 400, slow ?? `body cut short after ${size} bytes`, true);
      }
      if (slow) throw new Rejected(408, slow, true);
      if (chunk.done) break;
      size += chunk.value.byteLength;
      if (size > maxBody) {
        await reader.cancel().catch(() => {});
        throw new Rejected(413, `body is over the ${maxBody}-byte limit`, true);
      }
      chunks.push(chunk.value);
    }
  } finally {
    clock.stop();
  }
  return Buffer.concat(chunks, size);
}

// The names this module had as lib/receiver.ts, for apps that import the package's "./handler" export.
/** @deprecated Use createWebhooks. */
export const createHandler = createWebhooks;
/** @deprecated Use WebhooksOptions. */
export type HandlerOptions = WebhooksOptions;
/** @deprecated Use Webhooks. */
export type Handler = Webhooks;

// lib/api/api.ts: the JSON API under /api/v1/, served by the operator page's server (lib/admin/server.ts):
// bearer API keys (read, write or admin), each request checked against lib/api/schemas.ts's OPERATIONS, errors
// as application/problem+json (RFC 9457), a POST's Idempotency-Key kept in the store, one audit entry per change,
// and every refusal counted. The actions are the page's own (lib/operations/actions.ts); the configuration's
// operations are lib/api/config.ts's, the keys' lib/api/keys.ts's. The page's forms run the same operations
// through perform(). GET /openapi.json too.

import { createHash } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";
import client from "prom-client";
import type { z } from "zod";
import {
  destinationStates,
  pauseDestination,
  replayOne,
  resumeDestination,
  retryOne,
  retryOrReplayAll,
  sendTest,
  targetLabel,
} from "../operations/actions.ts";
import { bulkFilter, decodeCursor, describe, encodeCursor, HttpError, parseTime } from "../operations/input.ts";
import { DEFAULTS } from "../defaults.ts";
import { message } from "../log.ts";
import { PreviewBusy } from "../forwarding/preview.ts";
import { redactAttempt } from "../redact.ts";
import { boundBodyContains, refusedSearch } from "../search.ts";
import type { ApiKey, Delivery, Filter, Inbox, Scope } from "../store.ts";
import { type Answer, type ApiContext, ApiError, type Call, type Operate } from "./call.ts";
import { CONFIG_HANDLERS, configuredDestinations } from "./config.ts";
import { SECRET_HANDLERS } from "./secrets.ts";
import { allows, hashKey, KEY_HANDLERS } from "./keys.ts";
import { openApiDocument } from "./openapi.ts";
import {
  type AuditQuery,
  type BulkBody,
  type DeliveryPath,
  type DestinationPath,
  type FilterFields,
  type ListQuery,
  OPERATIONS,
  type OneTarget,
  type Operation,
  type OperationId,
  type PauseBody,
  PostHeaders,
  type PreviewQuery,
  type TestBody,
} from "./schemas.ts";

/**
 * Refusal is why the API refused a request before it ran: inbox_api_refused_total's reason label. A read_key
 * asked for a change, a write_key for what only an admin key may do (make or revoke a key). A foreign_host is
 * a page with no token asked by a name that is not loopback: DNS rebinding (session.ts).
 */
export type Refusal =
  | "no_key"
  | "unknown_key"
  | "revoked_key"
  | "read_key"
  | "write_key"
  | "read_only"
  | "foreign_host";

/** Caller is who asks for an operation and what they may do: an API key (`key:ID`), or the page's session (`page:…`). */
export interface Caller {
  who: string;
  scope: Scope;
}

/** AnswerOf is the JSON an operation answers, as its schema says. */
export type AnswerOf<I extends OperationId> = z.output<
  Extract<(typeof OPERATIONS)[number], { operationId: I }>["answer"]
>;

// refusal says why a caller of scope may not run op (on a page that may be read-only), or undefined if it may.
function refusal(op: Operation, scope: Scope, readOnly: boolean): { reason: Refusal; detail: string } | undefined {
  if (!allows(scope, op.scope))
    return {
      reason: scope === "read" ? "read_key" : "write_key",
      detail:
        op.scope === "admin"
          ? `${op.operationId} makes or revokes a key, which only an admin key (or the page's token) may do; this one is ${scope}`
          : `${op.operationId} changes the inbox, which a read key may not`,
    };
  if (op.scope !== "read" && readOnly)
    return { reason: "read_only", detail: "the operator page runs --read-only: every change is refused" };
  return undefined;
}

/** ApiMetrics counts the API's refusals and answers, on a registry of its own that the page serves at /metrics. */
export class ApiMetrics {
  /** registry holds the API's metrics. */
  readonly registry = new client.Registry();
  /** refused counts each refusal by its reason. */
  readonly refused = new client.Counter({
    name: "inbox_api_refused_total",
    help: "API requests refused before they ran: no key, an unknown or revoked one, a read key that writes, a read-only page, or a Host that is not loopback on a page with no token.",
    labelNames: ["reason"] as const,
    registers: [this.registry],
  });
  /** answered counts every API answer by operation and status. */
  readonly answered = new client.Counter({
    name: "inbox_api_requests_total",
    help: "API answers, by operation and status code.",
    labelNames: ["operation", "status"] as const,
    registers: [this.registry],
  });
  /** audited counts the audit log's entries by the kind of their actor, read from the store at each scrape. */
  readonly audited: client.Gauge<"actor">;

  /** The audit log's counts are read from inbox, which every way in (not only this page) writes to. */
  constructor(inbox: Pick<Inbox, "auditCounts">) {
    this.audited = new client.Gauge({
      name: "inbox_audit_entries",
      help: "Entries in the audit log, by the kind of their actor: key (the API), page, cli, start, sighup.",
      labelNames: ["actor"] as const,
      registers: [this.registry],
      async collect() {
        const counts = await inbox.auditCounts();
        this.reset();
        for (const { kind, n } of counts) this.set({ actor: kind }, n);
      },
    });
  }
}

const MAX_BODY_BYTES = 64 * 1024;

// Problem answers, one place: the status's own phrase for the title, the detail saying what was expected.
const TITLES: Record<number, string> = {
  400: "Bad Request",
  401: "Unauthorized",
  403: "Forbidden",
  404: "Not Found",
  405: "Method Not Allowed",
  409: "Conflict",
  413: "Content Too Large",
  415: "Unsupported Media Type",
  422: "Unprocessable Content",
  500: "Internal Server Error",
  503: "Service Unavailable",
};

/** Api answers the JSON API's requests and /openapi.json; handle() is false for a path that is neither. */
export class Api {
  /** metrics counts refusals and answers. */
  readonly metrics: ApiMetrics;
  private readonly ctx: ApiContext;
  private document: string | undefined;

  constructor(ctx: ApiContext) {
    this.ctx = ctx;
    this.metrics = new ApiMetrics(ctx.inbox);
  }

  /**
   * refuse answers a request the page refused before routing it (lib/admin/server.ts), when its path is the
   * API's or the document's: a problem+json, counted by its reason, as the API's own refusals are. False for
   * the page's paths, which the page answers.
   */
  refuse(res: ServerResponse, url: URL, reason: Refusal, status: 403, detail: string): boolean {
    if (url.pathname !== "/openapi.json" && !url.pathname.startsWith("/api/")) return false;
    this.metrics.refused.inc({ reason });
    this.send(
      res,
      status,
      { type: "about:blank", title: TITLES[status], status, detail },
      { "content-type": "application/problem+json" },
    );
    this.metrics.answered.inc({ operation: "-", status: String(status) });
    return true;
  }

  /** handle answers req when its path is the API's or the document's, and says whether it was. */
  async handle(req: IncomingMessage, res: ServerResponse, url: URL): Promise<boolean> {
    if (url.pathname === "/openapi.json" && req.method === "GET") {
      this.document ??= JSON.stringify(openApiDocument(), null, 2);
      res.writeHead(200, { "content-type": "application/json", "cache-control": "no-store" }).end(this.document);
      return true;
    }
    if (!url.pathname.startsWith("/api/")) return false;
    let operation = "-";
    try {
      const [op, params] = match(req.method ?? "GET", url.pathname);
      operation = op.operationId;
      const key = await this.authorise(req, op);
      await this.run(req, res, url, op, params, key);
    } catch (error) {
      const status = error instanceof HttpError ? error.status : (refusedSearch(error) ?? 500);
      if (status === 500) console.error(`api: ${req.method} ${url.pathname}: ${message(error)}`);
      const detail = status === 500 ? "Something went wrong; the server's log says what." : message(error);
      const members = error instanceof ApiError ? error.members : {};
      this.send(
        res,
        status,
        { type: "about:blank", title: TITLES[status] ?? "Error", status, detail, ...members },
        {
          "content-type": "application/problem+json",
          ...(status === 401 ? { "www-authenticate": 'Bearer realm="webhook-inbox"' } : {}),
          ...(error instanceof ApiError ? error.headers : {}),
        },
      );
    }
    this.metrics.answered.inc({ operation, status: String(res.statusCode) });
    return true;
  }

  // authorise finds the bearer key and checks its scope; every refusal is counted, and changes nothing.
  private async authorise(req: IncomingMessage, op: Operation): Promise<ApiKey> {
    const refuse = (reason: Refusal, status: 401 | 403, detail: string): never => {
      this.metrics.refused.inc({ reason });
      throw new ApiError(status, detail);
    };
    const bearer = /^Bearer ([^\s]+)$/i.exec(req.headers.authorization ?? "")?.[1];
    if (bearer === undefined)
      return refuse("no_key", 401, "expected Authorization: Bearer <key>; make one with inbox.ts keys create");
    const key = await this.ctx.inbox.apiKeyByHash(hashKey(bearer));
    if (!key) return refuse("unknown_key", 401, "that API key is not known here");
    if (key.revokedAt !== null) return refuse("revoked_key", 401, `API key ${key.id} was revoked`);
    const refused = refusal(op, key.scope, this.ctx.readOnly);
    if (refused) return refuse(refused.reason, 403, `API key ${key.id}: ${refused.detail}`);
    return key;
  }

  /**
   * perform runs an operation for the operator page as the API runs it for a key: the caller's scope checked
   * (and the page's --read-only), its input parsed by the operation's own schemas, its change audited as the
   * caller in the change's own transaction, its answer checked. A change made on the page is an API change in
   * every sense: held to the operator's rule (docs/security.md) and refused alike. It throws the ApiError an
   * API request would have been answered with.
   */
  async perform<I extends OperationId>(
    operationId: I,
    input: { params?: Record<string, unknown>; query?: Record<string, unknown>; body?: unknown },
    caller: Caller,
  ): Promise<{ body: AnswerOf<I>; change?: { target: string; count: number } }> {
    const op = (OPERATIONS as readonly Operation[]).find((o) => o.operationId === operationId)!;
    const refused = refusal(op, caller.scope, this.ctx.readOnly);
    if (refused) throw new ApiError(403, refused.detail);
    const checked = {
      params: op.params ? parse(op.params, input.params ?? {}, "path") : {},
      query: op.query ? parse(op.query, input.query ?? {}, "query") : {},
      body: op.body ? parse(op.body, input.body ?? {}, "body") : undefined,
    };
    const { answer } = await this.execute(op, checked, caller.who, this.ctx.now());
    return { body: op.answer.parse(answer.body) as AnswerOf<I>, ...(answer.change ? { change: answer.change } : {}) };
  }

  // execute runs an operation on its checked input, each change's audit entry written as who, and returns its
  // answer beside the JSON text its schema makes of it.
  private async execute(
    op: Operation,
    input: Pick<Call, "params" | "query" | "body">,
    who: string,
    now: number,
  ): Promise<{ answer: Answer; text: string }> {
    // Each change's entry is written by the store call that makes it, in the same transaction.
    const audit = (target: string) => ({ at: now, who, operation: op.operationId, target });
    const answer = await OPERATION_HANDLERS[op.operationId as OperationId](this.ctx, { ...input, who, audit });
    return { answer, text: JSON.stringify(op.answer.parse(answer.body)) };
  }

  // run validates the request against its operation's schemas, answers a replayed Idempotency-Key from the
  // store, runs the operation, audits a change, and keeps the first answer under its key.
  private async run(
    req: IncomingMessage,
    res: ServerResponse,
    url: URL,
    op: Operation,
    rawParams: Record<string, string>,
    key: ApiKey,
  ): Promise<void> {
    const params = op.params ? parse(op.params, rawParams, "path") : {};
    const query = op.query ? parse(op.query, Object.fromEntries(url.searchParams), "query") : {};
    let body: unknown;
    let raw = "";
    let idempotency: string | undefined;
    if (op.method === "post")
      idempotency = parse(PostHeaders, { "idempotency-key": req.headers["idempotency-key"] }, "header")[
        "idempotency-key"
      ];
    if (op.body) {
      raw = await readBody(req);
      body = parse(op.body, raw === "" ? {} : json(raw), "body");
    }
    const remembered = idempotency === undefined ? undefined : `key:${key.id}:${idempotency}`;
    // Only a request with an Idempotency-Key is compared with the one its key first came with.
    const requestHash =
      remembered === undefined
        ? ""
        : createHash("sha256")
            .update(JSON.stringify([op.operationId, params, raw]))
            .digest("hex");
    const now = this.ctx.now();
    if (remembered !== undefined) {
      const first = await this.ctx.inbox.recall(remembered, now - DEFAULTS.apiIdempotencyMs);
      if (first) {
        if (first.requestHash !== requestHash)
          throw new ApiError(422, "this Idempotency-Key was used before with a different request: use a new key");
        this.send(res, first.status, first.body, { "content-type": "application/json", "idempotent-replayed": "true" });
        return;
      }
    }
    const who = `key:${key.id}`;
    const { answer, text } = await this.execute(op, { params, query, body }, who, now);
    if (answer.change)
      this.ctx.audit(
        `api audit: who=${who} action=${op.operationId} ${answer.change.target} count=${answer.change.count}`,
      );
    if (remembered !== undefined) {
      const kept = await this.ctx.inbox.remember(
        { key: remembered, requestHash, status: op.status, body: op.kept ? op.kept(text) : text, at: now },
        now - DEFAULTS.apiIdempotencyMs,
      );
      // An answer the database must not keep (a new key) goes to its caller whole; a replay gets what was kept.
      this.send(res, kept.status, op.kept ? text : kept.body, { "content-type": "application/json" });
      return;
    }
    this.send(res, op.status, text, { "content-type": "application/json" });
  }

  // Every answer goes out through send, which hides the sources file's secrets wherever they are.
  private send(res: ServerResponse, status: number, body: unknown, headers: Record<string, string>): void {
    const text = typeof body === "string" ? body : JSON.stringify(body);
    res.writeHead(status, { "cache-control": "no-store", "x-content-type-options": "nosniff", ...headers });
    res.end(this.ctx.redact(text));
  }
}

// ROUTES is each operation with its path as a pattern and the names of its parameters, compiled once.
const ROUTES = (OPERATIONS as readonly Operation[]).map((op) => {
  const names: string[] = [];
  const pattern = op.path.replace(/\{(\w+)\}/g, (_, name: string) => {
    names.push(name);
    return "([^/]+)";
  });
  return { op, names, pattern: new RegExp(`^${pattern}$`) };
});

// match finds the operation a method and path name, with the path's parameters; a 404 or 405 when none does.
function match(method: string, path: string): [Operation, Record<string, string>] {
  let allowed = false;
  for (const { op, names, pattern } of ROUTES) {
    const m = pattern.exec(path);
    if (!m) continue;
    if (op.method.toUpperCase() !== method) {
      allowed = true;
      continue;
    }
    try {
      return [op, Object.fromEntries(names.map((n, i) => [n, decodeURIComponent(m[i + 1]!)]))];
    } catch {
      throw new ApiError(400, `path: not valid percent-encoding: ${path}`);
    }
  }
  if (allowed) throw new ApiError(405, `${method} is not an operation on ${path}; see /openapi.json`);
  throw new ApiError(404, `no operation at ${path}; see /openapi.json`);
}

// parse checks a part of the request against its schema: a 400 naming every field that does not fit.
function parse<S extends z.ZodType>(schema: S, value: unknown, where: string): z.output<S> {
  const result = schema.safeParse(value);
  if (result.success) return result.data;
  const errors = result.error.issues.map((i) => ({ path: [where, ...i.path].join("."), message: i.message }));
  throw new ApiError(400, errors.map((e) => `${e.path}: ${e.message}`).join("; "), { errors });
}

function json(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch (error) {
    throw new ApiError(400, `body: expected JSON: ${message(error)}`);
  }
}

// readBody reads a POST's or a PUT's JSON text, refusing another content type or one past 64 KiB.
async function readBody(req: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > MAX_BODY_BYTES) throw new ApiError(413, `body: expected at most ${MAX_BODY_BYTES} bytes`);
    chunks.push(chunk as Buffer);
  }
  const text = Buffer.concat(chunks).toString("utf8");
  const type = req.headers["content-type"] ?? "";
  if (text !== "" && !/^application\/(.+\+)?json\b/.test(type))
    throw new ApiError(415, `expected Content-Type: application/json, got ${type || "none"}`);
  return text;
}

// ---- The operations: each reads its checked input and runs the page's own action ----

// filterOf turns the API's filter fields into the store's Filter: a time as the page reads one, an age
// (since=2h) taken back from now.
function filterOf(f: z.output<typeof FilterFields>, now: number): Filter {
  const { error, body, since, until, ...rest } = f;
  const filter: Filter = Object.fromEntries(Object.entries(rest).filter(([, v]) => v !== undefined));
  if (error !== undefined) filter.errorMatch = error;
  if (body !== undefined) filter.bodyContains = body;
  if (since !== undefined) filter.since = parseTime(since, "since", now);
  if (until !== undefined) filter.until = parseTime(until, "until", now);
  return filter;
}

// row shows a stored row without its body, its error redacted.
function row(ctx: ApiContext, d: Delivery): Record<string, unknown> {
  return { ...d, error: d.error === null ? null : ctx.redact(d.error) };
}

// found reads a delivery's rows, or answers 404.
async function found(ctx: ApiContext, call: Call): Promise<Delivery[]> {
  const { source, id } = call.params as z.output<typeof DeliveryPath>;
  const rows = await ctx.inbox.find(id, source);
  if (rows.length === 0) throw new ApiError(404, `no delivery ${source}/${id}`);
  return rows;
}

// onOne runs a retry or a replay of one delivery (one destination's row, or all of them) and audits it.
function onOne(act: typeof retryOne | typeof replayOne): Operate {
  return async (ctx, call) => {
    const [d] = await found(ctx, call);
    const { destination } = call.body as z.output<typeof OneTarget>;
    const target = { source: d!.source, id: d!.id, ...(destination === undefined ? {} : { destination }) };
    const count = await act(ctx.inbox, target, ctx.batchSize, call.audit(targetLabel(target)));
    return { body: { count }, change: { target: targetLabel(target), count } };
  };
}

const OPERATION_HANDLERS: Record<OperationId, Operate> = {
  ...CONFIG_HANDLERS,
  ...SECRET_HANDLERS,
  ...KEY_HANDLERS,
  listDeliveries: async (ctx, call) => {
    const { limit, after, ...fields } = call.query as z.output<typeof ListQuery>;
    let cursor: ReturnType<typeof decodeCursor>;
    try {
      cursor = decodeCursor(after ?? null);
    } catch {
      throw new ApiError(400, "query.after: not a cursor this API wrote");
    }
    const { filter, since } = boundBodyContains(filterOf(fields, ctx.now()), ctx.now());
    const rows = await ctx.inbox.search(filter, { limit, bodies: false, ...(cursor ? { after: cursor } : {}) });
    return {
      body: {
        items: rows.map((d) => row(ctx, d)),
        next: rows.length === limit ? encodeCursor(rows.at(-1)!) : null,
        ...(since === undefined ? {} : { bodySince: since }),
      },
    };
  },
  getDelivery: async (ctx, call) => {
    const rows = await found(ctx, call);
    return { body: { rows: rows.map((d) => row(ctx, d)), bodyBase64: rows[0]!.body.toString("base64") } };
  },
  listAttempts: async (ctx, call) => {
    const [d] = await found(ctx, call);
    const attempts = await ctx.inbox.attempts({ source: d!.source, id: d!.id, receivedAt: d!.receivedAt });
    return { body: { attempts: attempts.map((a) => redactAttempt(a, ctx.redact)) } };
  },
  previewDelivery: async (ctx, call) => {
    const rows = await found(ctx, call);
    const { to } = call.query as z.output<typeof PreviewQuery>;
    if (!ctx.preview)
      throw new ApiError(409, "this page previews nothing: there is no configuration to preview against");
    try {
      return { body: await ctx.preview(rows, to === undefined ? {} : { to }) };
    } catch (error) {
      if (error instanceof PreviewBusy)
        throw new ApiError(503, message(error), {}, { "retry-after": String(error.retryAfterS) });
      throw new ApiError(409, message(error));
    }
  },
  retryDelivery: onOne(retryOne),
  replayDelivery: onOne(replayOne),
  bulkDeliveries: async (ctx, call) => {
    const { action, filter: fields, dryRun } = call.body as z.output<typeof BulkBody>;
    // The page's own reading of a filter, and its rule: a retry takes the failed rows, a replay the done ones.
    const params = new URLSearchParams();
    for (const [k, v] of Object.entries(fields)) if (v !== undefined) params.set(k === "body" ? "q" : k, String(v));
    const filter = bulkFilter(params, action, ctx.now());
    if (dryRun) return { body: { count: await ctx.inbox.count(filter) } };
    const target = `${action} filter: ${describe(filter)}`;
    const count = await retryOrReplayAll(ctx.inbox, action, filter, ctx.batchSize, call.audit(target));
    return { body: { count }, change: { target, count } };
  },
  getStatus: async (ctx) => ({ body: await ctx.inbox.summary() }),
  listDestinations: async (ctx) => ({
    body: {
      items: (await destinationStates(ctx.inbox, await configuredDestinations(ctx))).map((d) => ({
        ...d,
        lastError: d.lastError === null ? null : ctx.redact(d.lastError),
      })),
    },
  }),
  pauseDestination: async (ctx, call) => {
    const { name } = call.params as z.output<typeof DestinationPath>;
    const reason = (call.body as z.output<typeof PauseBody>).reason?.trim() || "paused through the API";
    const target = `destination=${JSON.stringify(name)} reason=${JSON.stringify(reason)}`;
    const change = await pauseDestination(
      ctx.inbox,
      { destination: name, reason, by: call.who },
      {
        configured: await configuredDestinations(ctx),
        audit: call.audit(target),
        ...(ctx.announce ? { announce: ctx.announce } : {}),
      },
    );
    return { body: change, change: { target, count: change.changed ? 1 : 0 } };
  },
  resumeDestination: async (ctx, call) => {
    const { name } = call.params as z.output<typeof DestinationPath>;
    const target = `destination=${JSON.stringify(name)}`;
    const change = await resumeDestination(
      ctx.inbox,
      { destination: name, by: call.who },
      {
        configured: await configuredDestinations(ctx),
        audit: call.audit(target),
        ...(ctx.announce ? { announce: ctx.announce } : {}),
      },
    );
    return { body: change, change: { target, count: change.changed ? 1 : 0 } };
  },
  testDestination: async (ctx, call) => {
    const { name } = call.params as z.output<typeof DestinationPath>;
    const { data } = call.body as z.output<typeof TestBody>;
    const sent = await sendTest(ctx.inbox, { destination: name, data, now: ctx.now(), audit: call.audit });
    return { body: sent, change: { target: targetLabel(sent), count: 1 } };
  },
  listAudit: async (ctx, call) => {
    const { limit, after } = call.query as z.output<typeof AuditQuery>;
    const before = after === undefined ? undefined : Number(after);
    if (before !== undefined && !Number.isSafeInteger(before))
      throw new ApiError(400, "query.after: not a cursor this API wrote");
    const items = await ctx.inbox.auditLog({ limit, ...(before === undefined ? {} : { before }) });
    return { body: { items, next: items.length === limit ? String(items.at(-1)!.seq) : null } };
  },
};

// lib/api/schemas.ts: the JSON API's shapes, as zod schemas: what each operation takes (path, query, body)
// and what it answers. The same schemas validate every request (lib/api/routes.ts) and make the OpenAPI
// document (lib/api/openapi.ts), so the two cannot drift. Nothing here runs a request.

import { extendZodWithOpenApi } from "@asteasolutions/zod-to-openapi";
import { z } from "zod";
import { DEFAULTS } from "../defaults.ts";
import { DESTINATION_NAME, STATUSES } from "../store.ts";

extendZodWithOpenApi(z);

/** Problem is an error answer, application/problem+json (RFC 9457). */
export const Problem = z
  .object({
    type: z.string().openapi({ example: "about:blank" }),
    title: z.string(),
    status: z.number().int(),
    detail: z.string(),
    errors: z.array(z.object({ path: z.string(), message: z.string() })).optional(),
  })
  .openapi("Problem");

const Status = z.enum(STATUSES as ["received", "processing", "done", "failed"]).openapi("Status");
const Counts = z.object({ received: z.number(), processing: z.number(), done: z.number(), failed: z.number() });

/** DeliveryRow is one destination's row of a stored delivery, without its body. */
export const DeliveryRow = z
  .object({
    source: z.string(),
    id: z.string(),
    destination: z.string(),
    route: z.number().int(),
    status: Status,
    attempts: z.number().int(),
    replays: z.number().int(),
    eventType: z.string().nullable(),
    contentType: z.string().nullable(),
    bodySha256: z.string(),
    receivedAt: z.number().int(),
    availableAt: z.number().int(),
    finishedAt: z.number().int().nullable(),
    purgedAt: z.number().int().nullable(),
    error: z.string().nullable(),
    conflicts: z.number().int(),
    orderKey: z.string().nullable(),
  })
  .openapi("DeliveryRow");

/** DeliveryPage is one page of a list or a search, with the cursor of the next one (null at the end). */
export const DeliveryPage = z
  .object({ items: z.array(DeliveryRow), next: z.string().nullable() })
  .openapi("DeliveryPage");

/** DeliveryShown is a delivery with every destination's row, and its body in base64. */
export const DeliveryShown = z.object({ rows: z.array(DeliveryRow), bodyBase64: z.string() }).openapi("DeliveryShown");

/** Attempts is a delivery's failed tries, oldest first. */
export const Attempts = z
  .object({
    attempts: z.array(
      z.object({
        attempt: z.number().int(),
        error: z.string(),
        failedAt: z.number().int(),
        destination: z.string().optional(),
      }),
    ),
  })
  .openapi("Attempts");

/** StatusCounts is the overview's counts: per status, and per source. */
export const StatusCounts = z
  .object({
    counts: Counts,
    sources: z.array(z.object({ source: z.string(), counts: Counts })),
    oldestWaitingMs: z.number().nullable(),
    estimated: z.boolean(),
  })
  .openapi("StatusCounts");

/** Destination is one destination's state, as the page's destinations table shows it. */
export const Destination = z
  .object({
    name: z.string(),
    state: z.enum(["closed", "open", "paused"]),
    probing: z.boolean(),
    pausedReason: z.string().nullable(),
    waiting: z.number().int(),
    processing: z.number().int(),
    failed: z.number().int(),
    failureRate: z.number().nullable(),
    lastError: z.string().nullable(),
    lastErrorAt: z.number().int().nullable(),
  })
  .openapi("Destination");

/** Destinations lists every destination. */
export const Destinations = z.object({ items: z.array(Destination) }).openapi("Destinations");

/** Count says how many rows an action changed (or, in a dry run, would). */
export const Count = z.object({ count: z.number().int() }).openapi("Count");

/** Changed says whether a pause or resume changed the state, and whether the operator's URL was told. */
export const Changed = z
  .object({ changed: z.boolean(), told: z.union([z.literal(true), z.string()]).optional() })
  .openapi("Changed");

/** PreviewShown is what a stored delivery would become under the sources file now (`inbox.ts preview`). */
export const PreviewShown = z
  .object({
    routes: z.array(z.object({ to: z.string(), chosen: z.boolean(), why: z.string().optional() })),
    requests: z.array(z.record(z.string(), z.unknown())),
    notes: z.array(z.string()),
  })
  .openapi("Preview");

/** AuditPage is one page of the audit log, newest first, with the cursor of the next one. */
export const AuditPage = z
  .object({
    items: z.array(
      z.object({
        seq: z.number().int(),
        at: z.number().int(),
        who: z.string(),
        operation: z.string(),
        target: z.string(),
        count: z.number().int(),
      }),
    ),
    next: z.string().nullable(),
  })
  .openapi("AuditPage");

const name = z.string().min(1).max(200).regex(DESTINATION_NAME, "expected one plain word: letters, digits, . _ ~ -");
const limit = z.coerce.number().int().min(1).max(DEFAULTS.apiMaxPage).default(DEFAULTS.apiPageSize);
const time = z.coerce.number().int().min(0);

/** DeliveryPath names one delivery: its source and its ID. */
export const DeliveryPath = z.object({ source: name, id: z.string().min(1).max(1000) });

/** DestinationPath names one destination. */
export const DestinationPath = z.object({ name });

/** FilterFields is what picks deliveries, in a search's query or a bulk action's body; every field narrows. */
export const FilterFields = z.object({
  status: Status.optional(),
  source: name.optional(),
  type: z.string().max(200).optional(),
  since: time.optional(),
  until: time.optional(),
  error: z.string().max(200).optional().openapi({ description: "A case-insensitive substring of the last error." }),
  body: z.string().max(200).optional().openapi({ description: "A substring of the body, as UTF-8 text." }),
  id: z.string().max(1000).optional(),
  destination: name.optional(),
});

/** ListQuery is a search's filter, with its page size and the cursor a previous page returned. */
export const ListQuery = FilterFields.extend({
  limit,
  after: z.string().max(2000).optional().openapi({ description: "The `next` cursor of the previous page." }),
});

/** AuditQuery pages the audit log. */
export const AuditQuery = z.object({ limit, after: z.string().max(100).optional() });

/** OneTarget is a retry's or replay's body: one destination's row, or every row of the delivery when none is named. */
export const OneTarget = z.object({ destination: name.optional() }).strict();

/** PauseBody is a pause's reason. */
export const PauseBody = z.object({ reason: z.string().max(200).optional() }).strict();

/** ResumeBody is empty. */
export const ResumeBody = z.object({}).strict();

/** BulkBody retries every failed delivery a filter matches, or replays every done one; dryRun only counts. */
export const BulkBody = z
  .object({
    action: z.enum(["retry", "replay"]),
    filter: FilterFields.strict(),
    dryRun: z.boolean().default(false),
  })
  .strict();

/** PostHeaders is what every POST may carry: an Idempotency-Key, so that sending it again does not act twice. */
export const PostHeaders = z.object({
  "idempotency-key": z.string().min(1).max(255).optional().openapi({
    description:
      "Any unique text: the first answer is kept for 24 h, and a POST with the same key and body gets it again; with a different body, a 422.",
  }),
});

/** Operation is one API operation: where it is, what it takes and answers, and the scope it needs. */
export interface Operation {
  operationId: string;
  method: "get" | "post";
  /** The path in OpenAPI's form, /api/v1/deliveries/{source}/{id}. */
  path: string;
  summary: string;
  /** read for a GET; write for anything that changes the inbox. */
  scope: "read" | "write";
  params?: z.ZodObject;
  query?: z.ZodObject;
  body?: z.ZodType;
  /** The answer's status and shape. */
  status: 200;
  answer: z.ZodType;
  /** The statuses beyond 400, 401 and 403 (and 422 for a POST) that it may answer with a Problem. */
  problems?: readonly number[];
}

const D = "/api/v1/deliveries/{source}/{id}";

/** OPERATIONS is every operation of the API, in the document's order. */
export const OPERATIONS = [
  {
    operationId: "listDeliveries",
    method: "get",
    path: "/api/v1/deliveries",
    summary: "List and search deliveries, newest first, one page at a time",
    scope: "read",
    query: ListQuery,
    status: 200,
    answer: DeliveryPage,
  },
  {
    operationId: "getDelivery",
    method: "get",
    path: D,
    summary: "Show one delivery: every destination's row, and its body",
    scope: "read",
    params: DeliveryPath,
    status: 200,
    answer: DeliveryShown,
    problems: [404],
  },
  {
    operationId: "listAttempts",
    method: "get",
    path: `${D}/attempts`,
    summary: "A delivery's failed tries",
    scope: "read",
    params: DeliveryPath,
    status: 200,
    answer: Attempts,
    problems: [404],
  },
  {
    operationId: "previewDelivery",
    method: "get",
    path: `${D}/preview`,
    summary: "A dry run of the routes against a stored delivery: what each destination would be sent now",
    scope: "read",
    params: DeliveryPath,
    status: 200,
    answer: PreviewShown,
    problems: [404, 409],
  },
  {
    operationId: "retryDelivery",
    method: "post",
    path: `${D}/retry`,
    summary: "Queue a failed delivery again (one destination's row, or every failed row)",
    scope: "write",
    params: DeliveryPath,
    body: OneTarget,
    status: 200,
    answer: Count,
    problems: [404],
  },
  {
    operationId: "replayDelivery",
    method: "post",
    path: `${D}/replay`,
    summary: "Put a done delivery through again (one destination's row, or every done row)",
    scope: "write",
    params: DeliveryPath,
    body: OneTarget,
    status: 200,
    answer: Count,
    problems: [404],
  },
  {
    operationId: "bulkDeliveries",
    method: "post",
    path: "/api/v1/deliveries/bulk",
    summary: "Retry every failed delivery a filter matches, or replay every done one",
    scope: "write",
    body: BulkBody,
    status: 200,
    answer: Count,
  },
  {
    operationId: "getStatus",
    method: "get",
    path: "/api/v1/status",
    summary: "The status counts, in all and per source",
    scope: "read",
    status: 200,
    answer: StatusCounts,
  },
  {
    operationId: "listDestinations",
    method: "get",
    path: "/api/v1/destinations",
    summary: "Every destination's state",
    scope: "read",
    status: 200,
    answer: Destinations,
  },
  {
    operationId: "pauseDestination",
    method: "post",
    path: "/api/v1/destinations/{name}/pause",
    summary: "Hold a destination's deliveries until it is resumed; none is discarded",
    scope: "write",
    params: DestinationPath,
    body: PauseBody,
    status: 200,
    answer: Changed,
    problems: [404],
  },
  {
    operationId: "resumeDestination",
    method: "post",
    path: "/api/v1/destinations/{name}/resume",
    summary: "Let a paused destination's deliveries go again",
    scope: "write",
    params: DestinationPath,
    body: ResumeBody,
    status: 200,
    answer: Changed,
    problems: [404],
  },
  {
    operationId: "listAudit",
    method: "get",
    path: "/api/v1/audit",
    summary: "The audit log: every change made through the API or the page, newest first",
    scope: "read",
    query: AuditQuery,
    status: 200,
    answer: AuditPage,
  },
] as const satisfies readonly Operation[];

/** OperationId names one of OPERATIONS. */
export type OperationId = (typeof OPERATIONS)[number]["operationId"];

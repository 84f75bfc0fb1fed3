// lib/api/schemas.ts: the JSON API's shapes, as zod schemas: what each operation takes (path, query, body)
// and what it answers. The same schemas validate every request (lib/api/api.ts) and make the OpenAPI
// document (lib/api/openapi.ts), so the two cannot drift. Nothing here runs a request.

import { extendZodWithOpenApi } from "@asteasolutions/zod-to-openapi";
import { z } from "zod";
import { DEFAULTS } from "../defaults.ts";
import { SECRET_NAME } from "../references.ts";
import { bodyWordsOf, parseBodyJson } from "../search.ts";
import { DESTINATION_NAME, ORIGINS, SCOPES, type Scope as ScopeName, STATUSES, TEST_SOURCE } from "../store.ts";

extendZodWithOpenApi(z);

/** Problem is an error answer, application/problem+json (RFC 9457). */
export const Problem = z
  .object({
    type: z.string().openapi({ example: "about:blank" }),
    title: z.string(),
    status: z.number().int(),
    detail: z.string(),
    errors: z.array(z.object({ path: z.string(), message: z.string() })).optional(),
    waiting: z
      .array(z.object({ destination: z.string(), n: z.number().int() }))
      .optional()
      .openapi({ description: "A change refused while rows wait for a destination it removes: how many, for which." }),
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
    origin: z.enum(ORIGINS as ["webhook", "reconcile", "test"]),
  })
  .openapi("DeliveryRow");

/** DeliveryPage is one page of a list or a search, with the cursor of the next one (null at the end). */
export const DeliveryPage = z
  .object({
    items: z.array(DeliveryRow),
    next: z.string().nullable(),
    bodySince: z.number().int().optional().openapi({
      description:
        "When a search by `body` named no `since`: the start it read from (ms since the epoch), a day before `until` or now.",
    }),
  })
  .openapi("DeliveryPage");

/** DeliveryShown is a delivery with every destination's row, and its body in base64. */
export const DeliveryShown = z.object({ rows: z.array(DeliveryRow), bodyBase64: z.string() }).openapi("DeliveryShown");

/** Attempt is one try of a delivery, as its attempt log keeps it (docs/forwarding.md#the-attempt-log). */
export const Attempt = z
  .object({
    attempt: z
      .number()
      .int()
      .openapi({ description: "Which attempt it was: 1 for the first try, again from 1 after a retry by hand" }),
    destination: z.string().openapi({ description: "The destination the try went to (handler: the worker's handler)" }),
    startedAt: z.number().int().openapi({ description: "When the try started, in ms since the epoch" }),
    ms: z
      .number()
      .int()
      .nullable()
      .openapi({ description: "How long it took, in ms; null for a try kept before tries were timed" }),
    status: z.number().int().nullable().openapi({
      description:
        "The HTTP status answered; null when no answer came (a timeout, a connection error) or the try was not a forward",
    }),
    error: z.string().nullable().openapi({ description: "Why the try failed, redacted; null when it succeeded" }),
    headers: z.record(z.string(), z.string()).nullable().openapi({ description: "The answer's headers, redacted" }),
    body: z.string().nullable().openapi({ description: "The answer's first bytes (4 KiB by default), redacted" }),
  })
  .openapi("Attempt");

/** Attempts is a delivery's attempt log, oldest first. */
export const Attempts = z.object({ attempts: z.array(Attempt) }).openapi("Attempts");

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

const name = z
  .string()
  .min(1)
  .max(200)
  .regex(DESTINATION_NAME, "expected one plain word: letters, digits, . _ ~ -")
  .refine((n) => n !== "." && n !== "..", 'expected a name, not "." or ".."');
// A delivery's source is a source's name, or the one test deliveries are stored under (which starts with $).
const sourceName = z
  .string()
  .min(1)
  .max(200)
  .regex(
    new RegExp(`^(?:${DESTINATION_NAME.source.slice(1, -1)}|\\${TEST_SOURCE})$`),
    `expected one plain word (letters, digits, . _ ~ -) or ${TEST_SOURCE}`,
  );
const limit = z.coerce.number().int().min(1).max(DEFAULTS.apiMaxPage).default(DEFAULTS.apiPageSize);
// A time as the page and the CLI take one: ms since the epoch, an ISO date (UTC when it names no zone), or an age ago.
const time = z.union([z.number().int().min(0), z.string().min(1).max(40)]).openapi({
  description: "ms since the epoch, an ISO date such as 2026-12-02T19:00Z, or an age ago: 30m, 2h, 3d, 2w",
});

/** DeliveryPath names one delivery: its source and its ID. */
export const DeliveryPath = z.object({ source: sourceName, id: z.string().min(1).max(1000) });

/** SourcePath names one source of the configuration. */
export const SourcePath = z.object({ name });

/** DestinationPath names one destination. */
export const DestinationPath = z.object({ name });

const secretName = z
  .string()
  .regex(SECRET_NAME, "expected one plain word of up to 128: letters, digits, . _ ~ -")
  .refine((n) => n !== "." && n !== "..", 'expected a name, not "." or ".."');

/** SecretPath names one secret of the store. */
export const SecretPath = z.object({ name: secretName });

/** SecretBody is a secret's value, sealed as it arrives and never answered back. */
export const SecretBody = z
  .object({
    value: z
      .string()
      .min(1)
      .max(DEFAULTS.maxSecretBytes)
      .openapi({ description: "The value. Sealed at once; no answer, list or log ever shows it again." }),
  })
  .strict();

/** SecretShown is one secret as the API lists it: its name, when it was set and by whom, and which key sealed it; never its value. */
export const SecretShown = z
  .object({ name: z.string(), setAt: z.number().int(), setBy: z.string(), key: z.string() })
  .openapi("Secret");

/** Secrets lists the secret store, by name. */
export const Secrets = z.object({ items: z.array(SecretShown) }).openapi("Secrets");

/** SecretSet is what setting a secret did: whether it is new. */
export const SecretSet = z.object({ name: z.string(), created: z.boolean() }).openapi("SecretSet");

/** SecretDeleted is a secret removed. */
export const SecretDeleted = z.object({ name: z.string(), deleted: z.literal(true) }).openapi("SecretDeleted");

// fits turns a parser that throws into a refinement that says whether a value parses.
const fits = (parse: (text: string) => unknown) => (text: string) => {
  try {
    parse(text);
    return true;
  } catch {
    return false;
  }
};

/** FilterFields is what picks deliveries, in a search's query or a bulk action's body; every field narrows. */
export const FilterFields = z.object({
  status: Status.optional(),
  source: sourceName.optional(),
  type: z.string().max(200).optional(),
  since: time.optional(),
  until: time.optional(),
  error: z.string().max(200).optional().openapi({ description: "A case-insensitive substring of the last error." }),
  body: z.string().max(200).optional().openapi({
    description:
      "A substring of the body, as UTF-8 text. No index serves it: it reads every body the other fields leave, so a list with no `since` reads the last day's (`bodySince` says from when).",
  }),
  bodyJson: z
    .string()
    .max(2000)
    .refine(fits(parseBodyJson), {
      message: "expected a JSON object or array holding a string, whole number or true/false to look for",
    })
    .optional()
    .openapi({
      description:
        'A JSON object the body contains, as PostgreSQL\'s jsonb `@>` says: `{"data":{"object":{"customer":"cus_123"}}}`. Found through an index; a body that is not JSON, or past 64 KiB, never matches. The index is off unless an operator ran `inbox.ts search enable`: until it is on and filled, a 409 problem says so.',
    }),
  bodyWords: z
    .string()
    .max(200)
    .refine(fits(bodyWordsOf), { message: "expected a word with a letter or a digit" })
    .optional()
    .openapi({
      description:
        "Words, separated by spaces, each of which a string, number or boolean of the body holds, in any case (`cus_123 refunded`). Found through an index; the same bodies never match. A 409 problem while the index is off, as for bodyJson.",
    }),
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

// ---- The configuration: a sources file's document, read and changed whole or a part at a time ----

// A document, or one part of it: checked by the code that checks a sources file (lib/config/config.ts), not here.
const Settings = z.record(z.string(), z.unknown());
const version = z.number().int().min(0);
const expectedVersion = version.optional().openapi({
  description:
    "The version you read (GET /api/v1/config): refused with a 409 if another was applied since. Without it, the version in force when the request arrives.",
});
const dryRun = z
  .boolean()
  .default(false)
  .openapi({ description: "Check it and say what it would change; change nothing." });
// A query's true or false (DELETE takes no body); the document shows it as the boolean it is.
const flag = z
  .stringbool({ truthy: ["true"], falsy: ["false"], error: "expected true or false" })
  .optional()
  .openapi({ type: "boolean" });

const Way = z.enum(["operator", "api"]).openapi("Way", {
  description: "Which way a version came: the operator's file on the host, or the API (or the operator page).",
});
const configFields = {
  version: version.openapi({ description: "0 when none was ever applied: the scripts serve the default source." }),
  actor: z.string().nullable(),
  appliedAt: z.number().int().nullable(),
  way: Way.nullable(),
  trust: z.record(z.string(), Way).openapi({
    description:
      "Per part (`source NAME`, `destination NAME`, `$operator`), whose hand last wrote it: a part the API wrote is held to the operator's rule (docs/security.md).",
  }),
  document: Settings.nullable().openapi({
    description:
      "The sources file, as JSON. Secrets are what it says, env:NAME and secret:NAME references; one written in the clear is shown as a marker, which a change refuses.",
  }),
  transforms: z
    .record(z.string(), z.string())
    .openapi({ description: "Each transform module the document names, and its code's SHA-256." }),
};

/** ConfigShown is the configuration in force: its version, who applied it, when and which way, its document, its transforms' SHA-256. */
export const ConfigShown = z.object(configFields).openapi("Config");

/** ConfigVersionPath names one version of the configuration. */
export const ConfigVersionPath = z.object({
  version: z.coerce.number().int().min(1).openapi({ type: "integer" }),
});

/** ConfigVersionQuery names the version to compare one with: the one before it unless given. */
export const ConfigVersionQuery = z.object({
  against: z.coerce.number().int().min(0).optional().openapi({
    type: "integer",
    description: "The version to compare it with (0: nothing); the one before it unless given.",
  }),
});

const changeLines = z.array(z.string()).openapi({
  description:
    "What it changed, as the audit log says it: `~ destination app: url http://a → http://b`, `+ source st`, `~ transform ./t.mjs (sha256 … → …)`; a value that may be a secret is never shown.",
});

/** ConfigVersionShown is one version of the configuration, and what it changed from another. */
export const ConfigVersionShown = z
  .object({ ...configFields, against: version, changes: changeLines })
  .openapi("ConfigVersion");

/** ConfigVersionsQuery pages the configuration's history. */
export const ConfigVersionsQuery = z.object({
  limit,
  after: z.coerce.number().int().min(1).optional().openapi({
    type: "integer",
    description: "The `next` cursor of the previous page.",
  }),
});

/** ConfigVersions is one page of the configuration's history, newest first: each version and what it changed from the one before. */
export const ConfigVersions = z
  .object({
    items: z.array(
      z.object({
        version,
        actor: z.string(),
        appliedAt: z.number().int(),
        way: Way,
        changes: changeLines,
      }),
    ),
    next: z.number().int().nullable(),
  })
  .openapi("ConfigVersions");

/** ConfigBody is a whole document to apply, as `inbox.ts config apply` takes a sources file. */
export const ConfigBody = z
  .object({
    document: Settings.openapi({ description: "A sources file's JSON (docs/providers.md, docs/forwarding.md)." }),
    expectedVersion,
    cancelWaiting: z.boolean().default(false).openapi({
      description:
        "Set aside as failed the deliveries waiting for a destination this removes, rather than refuse (409) while they wait.",
    }),
    dryRun,
  })
  .strict();

/** PartBody is one source's or one destination's settings, as they are written in a sources file. */
export const PartBody = z
  .object({
    settings: Settings.openapi({
      description:
        "A source's settings (provider, secret, routes with their filters and transforms …), or a destination's as under $destinations.",
    }),
    expectedVersion,
    dryRun,
  })
  .strict();

/** RemoveSourceQuery is a source's removal's options. */
export const RemoveSourceQuery = z.object({
  expectedVersion: z.coerce.number().int().min(0).optional().openapi({
    type: "integer",
    description: "The version you read: refused with a 409 if another was applied since.",
  }),
  dryRun: flag,
});

/** RemoveDestinationQuery is a destination's removal's options: cancelWaiting lets the rows that wait for it go, as failed. */
export const RemoveDestinationQuery = RemoveSourceQuery.extend({
  cancelWaiting: flag.openapi({
    type: "boolean",
    description: "Set aside as failed the deliveries waiting for it, rather than refuse (409) while they wait.",
  }),
});

/** ConfigChange is what a change did, or in a dry run would do: the difference, a line per part, and the version. */
export const ConfigChange = z
  .object({
    applied: z.boolean().openapi({ description: "false for a dry run, or a document that is the one in force." }),
    dryRun: z.boolean(),
    version: version.openapi({ description: "The version in force now." }),
    previousVersion: version,
    changes: z.array(z.string()).openapi({
      description: "`+ destination b`, `- source old`, `~ source st`, `~ transform ./t.mjs (sha256 … → …)`.",
    }),
    removed: z.array(z.object({ destination: z.string(), waiting: z.number().int() })),
    cancelled: z.number().int().openapi({ description: "Waiting deliveries set aside as failed." }),
  })
  .openapi("ConfigChange");

/** TestBody is a test delivery's data, put in its body; a line saying what it is when none is given. */
export const TestBody = z.object({ data: z.unknown().optional() }).strict();

/** TestSent is the test delivery stored: follow it with getDelivery. */
export const TestSent = z
  .object({ source: z.string(), id: z.string(), eventType: z.string(), destination: z.string() })
  .openapi("TestSent");

/** FilterTestBody is a route's filter and what to try it on: a stored delivery, or a body (and headers) given here. */
export const FilterTestBody = z
  .object({
    filter: Settings.openapi({ description: "A route's filter, as in a sources file (docs/forwarding.md)." }),
    delivery: DeliveryPath.strict()
      .optional()
      .openapi({ description: "A stored delivery: its body and kept headers." }),
    body: z.unknown().optional().openapi({ description: "A JSON body to try it on, instead of a stored delivery." }),
    headers: z.record(z.string(), z.union([z.string(), z.array(z.string())])).optional(),
    source: sourceName.optional().openapi({ description: "The source a body given here came to." }),
    type: z.string().max(200).optional().openapi({ description: "Its event type." }),
  })
  .strict()
  .refine((b) => (b.delivery === undefined) !== (b.body === undefined), {
    message: "expected either delivery (a stored one) or body (one given here)",
  })
  .refine(
    (b) => b.delivery === undefined || (b.headers === undefined && b.source === undefined && b.type === undefined),
    { message: "headers, source and type go with a body given here; a stored delivery has its own" },
  );

/** FilterResult says whether the filter takes the delivery, and what it could not see. */
export const FilterResult = z.object({ matches: z.boolean(), notes: z.array(z.string()) }).openapi("FilterResult");

/** PreviewQuery names one destination to preview for, chosen by the routes or not. */
export const PreviewQuery = z.object({
  to: name.optional().openapi({
    description:
      "One destination to preview, chosen by the routes or not (a new destination, before any delivery went to it); without it, the delivery's own.",
  }),
});

// ---- API keys: listed by anyone who may read; made and revoked by an admin key ----

const Scope = z.enum(SCOPES).openapi("Scope", {
  description:
    "read looks; write also retries, replays, pauses and changes the configuration; admin also makes and revokes keys.",
});

/** KeyShown is one API key as listed: never the key or its hash. */
export const KeyShown = z
  .object({
    id: z.string(),
    name: z.string(),
    scope: Scope,
    createdAt: z.number().int(),
    revokedAt: z.number().int().nullable(),
  })
  .openapi("Key");

/** Keys lists every API key, revoked ones too, oldest first. */
export const Keys = z.object({ items: z.array(KeyShown) }).openapi("Keys");

/** KeyBody is a new key's scope and what it is for. */
export const KeyBody = z
  .object({
    scope: Scope,
    name: z.string().max(200).default("").openapi({ description: "What the key is for, shown in the list." }),
  })
  .strict();

/** KeyMade is a new key: the key itself, shown this once; the inbox keeps its SHA-256 alone. */
export const KeyMade = KeyShown.extend({
  key: z.string().nullable().openapi({
    description:
      "The key, shown in this answer alone: send it as Authorization: Bearer <key>. null in an answer replayed for an Idempotency-Key, which the database keeps without it.",
  }),
}).openapi("KeyMade");

/** KeyPath names one key by its ID. */
export const KeyPath = z.object({
  id: z.string().regex(/^[A-Za-z0-9_-]{1,64}$/, "expected a key's ID, as listKeys shows it"),
});

/** KeyRevoked says whether revoking changed anything: false when the key already was revoked. */
export const KeyRevoked = z.object({ id: z.string(), revoked: z.boolean() }).openapi("KeyRevoked");

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
  method: "get" | "post" | "put" | "delete";
  /** The path in OpenAPI's form, /api/v1/deliveries/{source}/{id}. */
  path: string;
  summary: string;
  /** read for a GET; write for anything that changes the inbox; admin for what makes or revokes a key. */
  scope: ScopeName;
  params?: z.ZodObject;
  query?: z.ZodObject;
  body?: z.ZodType;
  /** The answer's status (201: made; 202: stored, to be forwarded) and shape. */
  status: 200 | 201 | 202;
  answer: z.ZodType;
  /** The statuses beyond 400, 401 and 403 (and 422 for a POST) that it may answer with a Problem. */
  problems?: readonly number[];
  /** What an Idempotency-Key keeps of the answer's JSON text, where the answer holds what the database must never keep (a new key). @default all of it */
  kept?: (text: string) => string;
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
    // bodyJson or bodyWords on an inbox whose search index is off (inbox.ts search enable); a body search
    // stopped at its time bound (SearchTooBroad, DEFAULTS.searchTimeoutMs).
    problems: [409, 422],
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
    summary: "A delivery's attempt log: every try, its timing, and the answer's status, headers and first bytes",
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
    summary:
      "A dry run of the routes against a stored delivery: what each destination would be sent now, transforms run in the sandbox (503 with Retry-After while as many previews as the host runs at once are running)",
    scope: "read",
    params: DeliveryPath,
    query: PreviewQuery,
    status: 200,
    answer: PreviewShown,
    problems: [404, 409, 503],
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
    operationId: "testDestination",
    method: "post",
    path: "/api/v1/destinations/{name}/test",
    summary: "Store a test delivery (event type inbox.test) for this destination alone; the worker forwards it",
    scope: "write",
    params: DestinationPath,
    body: TestBody,
    status: 202,
    answer: TestSent,
    problems: [404],
  },
  {
    operationId: "getConfig",
    method: "get",
    path: "/api/v1/config",
    summary: "The configuration in force: its version, who applied it and when, its document, its transforms' SHA-256",
    scope: "read",
    status: 200,
    answer: ConfigShown,
  },
  {
    operationId: "listConfigVersions",
    method: "get",
    path: "/api/v1/config/versions",
    summary:
      "The configuration's history, newest first: who applied each version, when, which way, and what it changed",
    scope: "read",
    query: ConfigVersionsQuery,
    status: 200,
    answer: ConfigVersions,
  },
  {
    operationId: "getConfigVersion",
    method: "get",
    path: "/api/v1/config/versions/{version}",
    summary: "One version of the configuration, and what it changed from the one before it (or from the version given)",
    scope: "read",
    params: ConfigVersionPath,
    query: ConfigVersionQuery,
    status: 200,
    answer: ConfigVersionShown,
    problems: [404],
  },
  {
    operationId: "applyConfig",
    method: "put",
    path: "/api/v1/config",
    summary: "Apply a whole document, checked as `inbox.ts config apply` checks a file, as one transaction",
    scope: "write",
    body: ConfigBody,
    status: 200,
    answer: ConfigChange,
    problems: [409],
  },
  {
    operationId: "putSource",
    method: "put",
    path: "/api/v1/sources/{name}",
    summary: "Create or replace one source's settings, its routes and their filters and transforms included",
    scope: "write",
    params: SourcePath,
    body: PartBody,
    status: 200,
    answer: ConfigChange,
    problems: [409],
  },
  {
    operationId: "deleteSource",
    method: "delete",
    path: "/api/v1/sources/{name}",
    summary: "Remove one source: the receivers stop serving its path",
    scope: "write",
    params: SourcePath,
    query: RemoveSourceQuery,
    status: 200,
    answer: ConfigChange,
    problems: [404, 409],
  },
  {
    operationId: "putDestination",
    method: "put",
    path: "/api/v1/destinations/{name}",
    summary: "Create or replace one destination's settings, as under $destinations in a sources file",
    scope: "write",
    params: DestinationPath,
    body: PartBody,
    status: 200,
    answer: ConfigChange,
    problems: [409],
  },
  {
    operationId: "deleteDestination",
    method: "delete",
    path: "/api/v1/destinations/{name}",
    summary:
      "Remove one destination: no forward to it starts after the commit; refused while deliveries wait for it, unless cancelWaiting",
    scope: "write",
    params: DestinationPath,
    query: RemoveDestinationQuery,
    status: 200,
    answer: ConfigChange,
    problems: [404, 409],
  },
  {
    operationId: "testFilter",
    method: "post",
    path: "/api/v1/filters/test",
    summary: "Try a route's filter on a stored delivery, or on a body given here; nothing is saved",
    scope: "read",
    body: FilterTestBody,
    status: 200,
    answer: FilterResult,
    problems: [404],
  },
  {
    operationId: "listAudit",
    method: "get",
    path: "/api/v1/audit",
    summary: "The audit log: every change, by every way in (the API, the page, the CLI, a script's file), newest first",
    scope: "read",
    query: AuditQuery,
    status: 200,
    answer: AuditPage,
  },
  {
    operationId: "listSecrets",
    method: "get",
    path: "/api/v1/secrets",
    summary: "The secret store: each secret's name, when it was set and by whom; never a value",
    scope: "read",
    status: 200,
    answer: Secrets,
  },
  {
    operationId: "putSecret",
    method: "put",
    path: "/api/v1/secrets/{name}",
    summary:
      "Set a secret, sealed under the operator's key; a configuration names it as secret:NAME. Its value is never answered back",
    scope: "write",
    params: SecretPath,
    body: SecretBody,
    status: 200,
    answer: SecretSet,
    problems: [503],
  },
  {
    operationId: "deleteSecret",
    method: "delete",
    path: "/api/v1/secrets/{name}",
    summary: "Remove a secret; refused while the configuration in force names it",
    scope: "write",
    params: SecretPath,
    status: 200,
    answer: SecretDeleted,
    problems: [404, 409],
  },
  {
    operationId: "listKeys",
    method: "get",
    path: "/api/v1/keys",
    summary: "The API keys: each one's ID, name, scope, when it was made and revoked; never a key or its hash",
    scope: "read",
    status: 200,
    answer: Keys,
  },
  {
    operationId: "createKey",
    method: "post",
    path: "/api/v1/keys",
    summary: "Make an API key, shown in this answer alone; the inbox keeps its SHA-256",
    scope: "admin",
    body: KeyBody,
    status: 201,
    answer: KeyMade,
    kept: (text: string) => JSON.stringify({ ...(JSON.parse(text) as object), key: null }),
  },
  {
    operationId: "revokeKey",
    method: "post",
    path: "/api/v1/keys/{id}/revoke",
    summary: "Revoke an API key, for good: it is refused (401) from then on",
    scope: "admin",
    params: KeyPath,
    body: ResumeBody,
    status: 200,
    answer: KeyRevoked,
    problems: [404],
  },
] as const satisfies readonly Operation[];

/** OperationId names one of OPERATIONS. */
export type OperationId = (typeof OPERATIONS)[number]["operationId"];

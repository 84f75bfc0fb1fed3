// lib/api/openapi.ts: the OpenAPI 3.1 document of the JSON API, made by @asteasolutions/zod-to-openapi from
// lib/api/schemas.ts's OPERATIONS, the same schemas that validate each request: nothing here is written by
// hand but the document's title and the bearer scheme. Served at GET /openapi.json by lib/api/api.ts.

import { OpenAPIRegistry, OpenApiGeneratorV31, type RouteConfig } from "@asteasolutions/zod-to-openapi";
import { OPERATIONS, PostHeaders, Problem } from "./schemas.ts";

const TITLES: Record<number, string> = {
  400: "The request does not fit the schema",
  401: "No API key, or an unknown or revoked one",
  403: "A read key asked for a change, a write key for what only an admin key may do (make or revoke a key), or the page runs read-only",
  404: "No such delivery, source, destination, secret, configuration version or key",
  405: "The path is served, but not with this method",
  409: "It conflicts with the inbox as it is: another configuration was applied since the version named, deliveries wait for a destination the change removes (listed in waiting), a route still names the destination to remove, or there is no configuration to preview against",
  413: "The body is past 64 KiB",
  415: "The body is not JSON (Content-Type: application/json)",
  422: "A POST: the Idempotency-Key was used before with a different request. A list: a body search (bodyJson, bodyWords, body) ran past its time bound; narrow it by time or source",
};

// answered are the problems the API's routing answers for an operation before it runs, beside its own: a
// path that names a thing may name none (404), any path with another method (405), a body too large or not
// JSON (413, 415), a POST's Idempotency-Key reused (422).
function answered(op: (typeof OPERATIONS)[number]): number[] {
  const own = "problems" in op ? op.problems : [];
  const all = [
    400,
    401,
    403,
    ...("params" in op ? [404] : []),
    405,
    ...("body" in op ? [413, 415] : []),
    ...(op.method === "post" ? [422] : []),
    ...own,
  ];
  return [...new Set(all)].sort((a, b) => a - b);
}

const problem = (status: number) => ({
  description: TITLES[status] ?? "A problem",
  content: { "application/problem+json": { schema: Problem } },
});

/** openApiDocument builds the document, once per call: every operation, its schemas, and the bearer scheme. */
export function openApiDocument(): Record<string, unknown> {
  const registry = new OpenAPIRegistry();
  const bearer = registry.registerComponent("securitySchemes", "apiKey", {
    type: "http",
    scheme: "bearer",
    description:
      "An API key made by `inbox.ts keys create --scope read|write|admin`, or by an admin key (createKey). read looks; write also changes; admin also makes and revokes keys.",
  });
  for (const op of OPERATIONS) {
    const statuses = answered(op);
    const request: RouteConfig["request"] = {
      ...("params" in op ? { params: op.params } : {}),
      ...("query" in op ? { query: op.query } : {}),
      ...(op.method === "post" ? { headers: PostHeaders } : {}),
      ...("body" in op
        ? {
            body: { required: true, content: { "application/json": { schema: op.body } } },
          }
        : {}),
    };
    registry.registerPath({
      operationId: op.operationId,
      method: op.method,
      path: op.path,
      summary: op.summary,
      security: [{ [bearer.name]: [] }],
      request,
      responses: {
        [op.status]: { description: "OK", content: { "application/json": { schema: op.answer } } },
        ...Object.fromEntries(statuses.map((s) => [s, problem(s)])),
      },
    });
  }
  return new OpenApiGeneratorV31(registry.definitions).generateDocument({
    openapi: "3.1.0",
    info: {
      title: "webhook-inbox API",
      version: "1",
      description:
        "Everything the operator page does with deliveries and destinations, the configuration (sources, destinations, routes and their filters and transforms, its history, the secrets) and the API keys. See docs/api.md.",
    },
  }) as unknown as Record<string, unknown>;
}

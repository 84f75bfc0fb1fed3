// test/reconcile-servers.ts: a local Stripe and a local GitHub for test/reconcile.test.ts, on real HTTP,
// written from the API references (Stripe's "List all events" and errors; GitHub's "List deliveries for a
// repository webhook" / "for an app webhook", "Get a delivery", "Redeliver a delivery", its rate-limit
// headers and Link cursors) with example responses from test/fixtures/reconcile/. The SDKs talk to them.

import { createPublicKey, verify as verifySignature } from "node:crypto";
import { readFileSync } from "node:fs";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { join } from "node:path";
import { ROOT } from "./helpers.ts";

const FIXTURES = join(ROOT, "test", "fixtures", "reconcile");

/** fixture reads one of the example responses. */
export function fixture(name: string): Record<string, unknown> {
  return JSON.parse(readFileSync(join(FIXTURES, name), "utf8")) as Record<string, unknown>;
}

/** Fault is one answer put in the way of the next matching request: a status, its headers, a body. */
export interface Fault {
  status: number;
  headers?: Record<string, string>;
  body: unknown;
  /** Answer this many requests so (the next ones); Infinity for all. @default 1 */
  times?: number;
  /** Only requests this matches. @default all */
  match?: (url: URL) => boolean;
}

function send(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  res.writeHead(status, { "content-type": "application/json", ...headers });
  res.end(JSON.stringify(body));
}

async function listen(server: Server): Promise<string> {
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  if (typeof address !== "object" || address === null) throw new Error("no address");
  return `http://127.0.0.1:${address.port}`;
}

/** StripeEvent is an event as the fake Stripe keeps it: the API object, and whether its webhooks got through. */
export interface StripeEvent {
  event: Record<string, unknown> & { id: string; created: number; type: string };
  delivered: boolean;
}

/** stripeEvent makes an event shaped like the fixture's, with its own id, type, time and object. */
export function stripeEvent(
  id: string,
  type: string,
  createdS: number,
  object: Record<string, unknown>,
): StripeEvent["event"] {
  const base = fixture("stripe-event.json");
  return { ...base, id, type, created: createdS, data: { object } } as StripeEvent["event"];
}

/**
 * FakeStripe answers GET /v1/events as Stripe does: newest first, limit (1 to 100, default 10),
 * starting_after, created[gte], types[], delivery_success; 401 for a key that is not its own (echoing the
 * key, which Stripe masks, so a leak would show); faults queued in front of the next requests.
 */
export class FakeStripe {
  readonly events: StripeEvent[] = [];
  readonly requests: URL[] = [];
  readonly faults: Fault[] = [];
  readonly answers: string[] = [];
  url = "";
  private server = createServer((req, res) => this.answer(req, res));

  private readonly key: string;

  constructor(key: string) {
    this.key = key;
  }

  async start(): Promise<this> {
    this.url = await listen(this.server);
    return this;
  }

  async stop(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise((resolve) => this.server.close(resolve));
  }

  private answer(req: IncomingMessage, res: ServerResponse) {
    const url = new URL(req.url ?? "/", "http://stripe.local");
    this.requests.push(url);
    const reply = (status: number, body: unknown, headers: Record<string, string> = {}) => {
      this.answers.push(JSON.stringify(body));
      send(res, status, body, { "request-id": `req_${this.requests.length}`, ...headers });
    };
    const given = /^Bearer (.+)$/.exec(req.headers.authorization ?? "")?.[1];
    if (given !== this.key) {
      const body = fixture("stripe-error-401.json") as { error: { message: string } };
      return reply(401, { error: { ...body.error, message: `Invalid API Key provided: ${given}` } });
    }
    const fault = this.faults[0];
    if (fault && (fault.match?.(url) ?? true)) {
      fault.times = (fault.times ?? 1) - 1;
      if (fault.times <= 0) this.faults.shift();
      return reply(fault.status, fault.body, fault.headers);
    }
    if (req.method !== "GET" || url.pathname !== "/v1/events")
      return reply(404, {
        error: { type: "invalid_request_error", message: `Unrecognized request URL (${req.method}: ${url.pathname})` },
      });
    const limit = Number(url.searchParams.get("limit") ?? 10);
    if (!Number.isInteger(limit) || limit < 1 || limit > 100)
      return reply(400, {
        error: { type: "invalid_request_error", message: "Invalid integer: limit", param: "limit" },
      });
    const gte = url.searchParams.get("created[gte]");
    const success = url.searchParams.get("delivery_success");
    const types = [...url.searchParams.entries()].filter(([k]) => /^types\[\d*\]$/.test(k)).map(([, v]) => v);
    let list = [...this.events].sort((a, b) => b.event.created - a.event.created || (a.event.id < b.event.id ? 1 : -1));
    if (gte !== null) list = list.filter((e) => e.event.created >= Number(gte));
    if (success !== null) list = list.filter((e) => e.delivered === (success === "true"));
    if (types.length > 0) list = list.filter((e) => types.includes(e.event.type));
    const after = url.searchParams.get("starting_after");
    if (after !== null) {
      const at = list.findIndex((e) => e.event.id === after);
      if (at < 0)
        return reply(400, {
          error: { type: "invalid_request_error", message: `No such event: '${after}'`, param: "starting_after" },
        });
      list = list.slice(at + 1);
    }
    const page = list.slice(0, limit);
    const body = fixture("stripe-list.json");
    reply(200, { ...body, data: page.map((e) => e.event), has_more: list.length > limit });
  }
}

/** GithubDelivery is one try of a hook's delivery, with the request GitHub sent. */
export interface GithubDelivery {
  id: number;
  guid: string;
  delivered_at: string;
  redelivery: boolean;
  status_code: number;
  event: string;
  action: string | null;
  payload: Record<string, unknown>;
}

/**
 * FakeGithub answers a hook's deliveries as GitHub does, for one repository's hook, its owner's (an
 * organization's) hook with the same number, and the app's hook:
 * newest first, per_page (default 30, at most 100), an opaque cursor in the Link header's rel="next",
 * x-ratelimit-* headers on every answer, 401 "Bad credentials" for a token (or app JWT) not its own, the
 * full delivery with its request headers and payload, and a redelivery that adds a try to the list and
 * calls onRedeliver, which the test makes send the webhook, signed, to the real receiver.
 */
export class FakeGithub {
  readonly deliveries: GithubDelivery[] = [];
  readonly requests: { method: string; url: URL }[] = [];
  readonly faults: Fault[] = [];
  readonly redeliveries: number[] = [];
  onRedeliver: (d: GithubDelivery) => Promise<void> = async () => {};
  url = "";
  remaining = 5000;
  private nextId = 1_000_000;
  private server = createServer((req, res) => void this.answer(req, res));

  private readonly auth: { token?: string; appId?: string; publicKeyPem?: string };
  readonly repo = { owner: "octo", repo: "shop", hookId: 42 };

  constructor(auth: { token?: string; appId?: string; publicKeyPem?: string }) {
    this.auth = auth;
  }

  async start(): Promise<this> {
    this.url = await listen(this.server);
    return this;
  }

  async stop(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise((resolve) => this.server.close(resolve));
  }

  /** add records a try GitHub made (newest last, as they happen). */
  add(d: Omit<GithubDelivery, "id">): GithubDelivery {
    const full = { ...d, id: this.nextId++ };
    this.deliveries.push(full);
    return full;
  }

  // authorised checks a token (`token X` or `Bearer X`), or an app's RS256 JWT against its public key.
  private authorised(header: string | undefined, app: boolean): boolean {
    const [, scheme, value] = /^(token|bearer) (.+)$/i.exec(header ?? "") ?? [];
    if (!value) return false;
    if (!app) return value === this.auth.token && scheme !== undefined;
    const [h, p, s] = value.split(".");
    if (!h || !p || !s || !this.auth.publicKeyPem) return false;
    const ok = verifySignature(
      "RSA-SHA256",
      Buffer.from(`${h}.${p}`),
      createPublicKey(this.auth.publicKeyPem),
      Buffer.from(s, "base64url"),
    );
    const claims = JSON.parse(Buffer.from(p, "base64url").toString()) as { iss?: string | number };
    return ok && String(claims.iss) === this.auth.appId;
  }

  private async answer(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? "/", this.url);
    this.requests.push({ method: req.method ?? "GET", url });
    for await (const _ of req);
    this.remaining = Math.max(0, this.remaining - 1);
    const rate = {
      "x-ratelimit-limit": "5000",
      "x-ratelimit-remaining": String(this.remaining),
      "x-ratelimit-reset": String(Math.floor(Date.now() / 1000) + 3600),
      "x-ratelimit-used": String(5000 - this.remaining),
      "x-ratelimit-resource": "core",
    };
    const { owner, repo, hookId } = this.repo;
    const repoBase = `/repos/${owner}/${repo}/hooks/${hookId}/deliveries`;
    const appBase = "/app/hook/deliveries";
    const orgBase = `/orgs/${owner}/hooks/${hookId}/deliveries`;
    const base = [appBase, repoBase, orgBase].find((b) => url.pathname === b || url.pathname.startsWith(`${b}/`));
    if (!base) return send(res, 404, { message: "Not Found", documentation_url: "https://docs.github.com/rest" }, rate);
    if (!this.authorised(req.headers.authorization, base === appBase))
      return send(res, 401, fixture("github-error-401.json"), rate);
    const fault = this.faults[0];
    if (fault && (fault.match?.(url) ?? true)) {
      fault.times = (fault.times ?? 1) - 1;
      if (fault.times <= 0) this.faults.shift();
      return send(res, fault.status, fault.body, { ...rate, ...fault.headers });
    }
    const rest = url.pathname.slice(base.length);
    if (req.method === "GET" && rest === "") {
      const perPage = Number(url.searchParams.get("per_page") ?? 30);
      if (!Number.isInteger(perPage) || perPage < 1 || perPage > 100)
        return send(
          res,
          422,
          { message: "Validation Failed", documentation_url: "https://docs.github.com/rest" },
          rate,
        );
      const newest = [...this.deliveries].reverse();
      const cursor = url.searchParams.get("cursor");
      // GitHub's cursor is opaque: here, the id of the last try of the page before, in base64.
      const from = cursor
        ? newest.findIndex((d) => d.id === Number(Buffer.from(cursor, "base64url").toString())) + 1
        : 0;
      const page = newest.slice(from, from + perPage);
      const headers: Record<string, string> = { ...rate };
      if (from + perPage < newest.length) {
        const next = new URL(url);
        next.searchParams.set("cursor", Buffer.from(String(page.at(-1)!.id)).toString("base64url"));
        headers.link = `<${next}>; rel="next"`;
      }
      const item = fixture("github-delivery-item.json");
      return send(
        res,
        200,
        page.map(({ payload: _, ...d }) => ({
          ...item,
          ...d,
          status: d.status_code < 300 ? "OK" : "Invalid HTTP Response: 503",
        })),
        headers,
      );
    }
    const one = /^\/(\d+)(\/attempts)?$/.exec(rest);
    const d = one ? this.deliveries.find((x) => x.id === Number(one[1])) : undefined;
    if (!one || !d)
      return send(res, 404, { message: "Not Found", documentation_url: "https://docs.github.com/rest" }, rate);
    if (req.method === "GET" && !one[2]) {
      const full = fixture("github-delivery.json") as { request: { headers: Record<string, string> } };
      const { payload, ...item } = d;
      return send(
        res,
        200,
        {
          ...full,
          ...item,
          request: {
            headers: {
              ...full.request.headers,
              "X-GitHub-Delivery": d.guid,
              "X-GitHub-Event": d.event,
              "X-Hub-Signature-256": "sha256=0000",
            },
            payload,
          },
        },
        rate,
      );
    }
    if (req.method === "POST" && one[2]) {
      this.redeliveries.push(d.id);
      send(res, 202, {}, rate);
      await this.onRedeliver(d);
      this.add({ ...d, redelivery: true, status_code: 200, delivered_at: new Date().toISOString() });
      return;
    }
    send(res, 404, { message: "Not Found" }, rate);
  }
}

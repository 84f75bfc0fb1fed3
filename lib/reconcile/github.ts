// reconcile/github.ts: what GitHub sent, from a hook's deliveries through the official @octokit/rest (an
// optional peer, loaded only here): an app's hook (an app JWT from @octokit/auth-app), a repository's or an
// organization's (a token). Paged by cursor, newest first, until delivered_at is older than since. Each
// guid is stored from its delivery's request, or redelivered, as the source says. Rate limits are waited out.

import type { GithubReconcile } from "./config.ts";
import type { Found, Lister, Verdict } from "./loop.ts";
import { DEFAULTS } from "../defaults.ts";
import type { Headers } from "../store.ts";

// The signature headers are left out: they signed the bytes GitHub sent, which the API does not give back.
const UNSIGNED = /^x-hub-signature/;

/** githubLister lists a hook's deliveries through Octokit, pointed at settings.apiBase if given. */
export async function githubLister(settings: GithubReconcile): Promise<Lister> {
  const load = async () => {
    const { Octokit } = await import("@octokit/rest");
    const auth = settings.hook.kind === "app" ? (await import("@octokit/auth-app")).createAppAuth : undefined;
    return { Octokit, auth };
  };
  const { Octokit, auth } = await load().catch((error) => {
    throw new Error(
      `reconcile from GitHub needs @octokit/rest (and @octokit/auth-app for an app): npm install @octokit/rest @octokit/auth-app (${error})`,
    );
  });
  const hook = settings.hook;
  const octokit = new Octokit({
    ...(settings.apiBase ? { baseUrl: settings.apiBase } : {}),
    ...(hook.kind === "app"
      ? { authStrategy: auth, auth: { appId: hook.appId, privateKey: hook.privateKey } }
      : { auth: hook.token }),
    // Octokit's request log would write each failed call to the console; the run tells its own.
    log: { debug() {}, info() {}, warn() {}, error() {} },
  });
  const where =
    hook.kind === "app"
      ? {}
      : hook.kind === "repo"
        ? { owner: hook.owner, repo: hook.repo, hook_id: hook.hookId }
        : { org: hook.org, hook_id: hook.hookId };
  const api = hook.kind === "app" ? octokit.rest.apps : hook.kind === "repo" ? octokit.rest.repos : octokit.rest.orgs;
  // One signature for the three: the app's, the repository's and the organization's calls differ only in where.
  const listCall = api.listWebhookDeliveries as unknown as (
    p: object,
  ) => Promise<{ data: Item[]; headers: { link?: string } }>;
  const getCall = api.getWebhookDelivery as unknown as (p: object) => Promise<{ data: Full }>;
  const redeliverCall = api.redeliverWebhookDelivery as unknown as (p: object) => Promise<unknown>;

  return async function* list(since, call) {
    let cursor: string | undefined;
    // Each guid's tries, a redelivery among them, are listed apart, the redelivery first (newest first),
    // maybe a page before: one asked for already is not asked again.
    const asked = new Set<string>();
    for (;;) {
      const res = await call(`list deliveries${cursor ? ` after cursor ${cursor}` : ""}`, () =>
        listCall({ ...where, per_page: DEFAULTS.reconcilePage, ...(cursor ? { cursor } : {}) }),
      );
      const fresh = res.data.filter((d) => Date.parse(d.delivered_at) >= since);
      for (const d of res.data) if (d.redelivery) asked.add(d.guid);
      yield fresh.map(
        (d): Found => ({
          id: d.guid,
          eventType: d.event,
          providerTime: Date.parse(d.delivered_at),
          ...(settings.mode === "fetch"
            ? { load: async () => request((await getCall({ ...where, delivery_id: d.id })).data) }
            : {
                redeliver: async () => void (await redeliverCall({ ...where, delivery_id: d.id })),
                asked: asked.has(d.guid),
              }),
        }),
      );
      // Newest first: a page that reaches past since is the last one needed.
      cursor = nextCursor(res.headers.link);
      if (cursor === undefined || fresh.length < res.data.length || res.data.length === 0) return;
    }
  };
}

interface Item {
  id: number;
  guid: string;
  delivered_at: string;
  redelivery: boolean;
  event: string;
}

interface Full extends Item {
  request: { headers: Record<string, unknown> | null; payload: Record<string, unknown> | null };
}

// request is a fetched delivery as the inbox keeps it: the payload as JSON, the request's headers but its signatures.
function request(d: Full): { body: Buffer; headers: Headers; contentType: string } {
  const headers: Headers = {};
  for (const [name, value] of Object.entries(d.request.headers ?? {})) {
    const key = name.toLowerCase();
    if (UNSIGNED.test(key) || key === "content-type" || value === undefined || value === null) continue;
    headers[key] = Array.isArray(value) ? value.map(String) : [String(value)];
  }
  headers["x-github-delivery"] ??= [d.guid];
  headers["x-github-event"] ??= [d.event];
  return { body: Buffer.from(JSON.stringify(d.request.payload ?? {})), headers, contentType: "application/json" };
}

// nextCursor reads the cursor of the Link header's rel="next" URL, as GitHub pages hook deliveries.
function nextCursor(link: string | undefined): string | undefined {
  const next = link?.split(",").find((part) => /rel="next"/.test(part));
  const url = next ? /<([^>]+)>/.exec(next)?.[1] : undefined;
  return url ? (new URL(url).searchParams.get("cursor") ?? undefined) : undefined;
}

/**
 * judgeGithub reads a failed GitHub call: a 429, or a 403 with x-ratelimit-remaining 0, waits for its
 * Retry-After or x-ratelimit-reset; a 5xx or the network waits its back-off; a bad credential stops.
 */
export function judgeGithub(now: () => number): (error: unknown) => Verdict {
  return (error) => {
    const e = error as { status?: number; response?: { headers?: Record<string, string | undefined> } };
    const h = e.response?.headers ?? {};
    const retryAfter = Number(h["retry-after"]);
    const limited =
      e.status === 429 || (e.status === 403 && (h["x-ratelimit-remaining"] === "0" || h["retry-after"] !== undefined));
    if (limited) {
      if (Number.isFinite(retryAfter) && retryAfter >= 0) return { retryAfterMs: retryAfter * 1000 };
      const reset = Number(h["x-ratelimit-reset"]);
      if (h["x-ratelimit-remaining"] === "0" && Number.isFinite(reset))
        return { retryAfterMs: Math.max(0, reset * 1000 - now()) };
      return {};
    }
    if (e.status === undefined || e.status >= 500) return {};
    return { fatal: true };
  };
}

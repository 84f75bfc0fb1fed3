// reconcile/stripe.ts: what Stripe sent, from `GET /v1/events` through the official stripe SDK (an
// optional peer, loaded only here): created since a time, Stripe's failed deliveries only unless told
// otherwise, paged with limit and starting_after. Each event is stored under its evt_ id, the id the
// webhook carries (the stripe preset reads body:/id), as the API's JSON. Its 429s are waited out.

import { DEFAULTS } from "../defaults.ts";
import type { StripeReconcile } from "./config.ts";
import type { Found, Lister, Verdict } from "./loop.ts";

/** stripeLister lists a Stripe account's events through the SDK, pointed at settings.apiBase if given. */
export async function stripeLister(settings: StripeReconcile): Promise<Lister> {
  const { default: Stripe } = await import("stripe").catch((error) => {
    throw new Error(`reconcile from Stripe needs the stripe package: npm install stripe (${error})`);
  });
  const base = settings.apiBase ? new URL(settings.apiBase) : undefined;
  const stripe = new Stripe(settings.apiKey, {
    // The run waits out 429s itself, on its own clock, so the SDK's own retries are off.
    maxNetworkRetries: 0,
    telemetry: false,
    ...(base
      ? {
          host: base.hostname,
          port: base.port || (base.protocol === "https:" ? 443 : 80),
          protocol: base.protocol === "https:" ? "https" : "http",
        }
      : {}),
  });
  return async function* list(since, call) {
    let after: string | undefined;
    for (;;) {
      const page = await call(`list events${after ? ` after ${after}` : ""}`, () =>
        stripe.events.list({
          limit: DEFAULTS.reconcilePage,
          created: { gte: Math.floor(since / 1000) },
          ...(settings.types ? { types: settings.types } : {}),
          ...(settings.onlyFailed ? { delivery_success: false } : {}),
          ...(after ? { starting_after: after } : {}),
        }),
      );
      yield page.data.map(
        (event): Found => ({
          id: event.id,
          eventType: event.type,
          providerTime: event.created * 1000,
          // The list holds each event whole: nothing more to fetch.
          load: async () => ({ body: Buffer.from(JSON.stringify(event)), contentType: "application/json" }),
        }),
      );
      if (!page.has_more || page.data.length === 0) return;
      after = page.data[page.data.length - 1]!.id;
    }
  };
}

/** judgeStripe reads a failed Stripe call: a 429, a 5xx or the network waits; a bad key or request stops. */
export function judgeStripe(error: unknown): Verdict {
  const e = error as { statusCode?: number; type?: string; headers?: Record<string, string | undefined> };
  const status = e.statusCode;
  if (status === 429 || e.type === "StripeRateLimitError") {
    const after = Number(e.headers?.["retry-after"]);
    return Number.isFinite(after) && after >= 0 ? { retryAfterMs: after * 1000 } : {};
  }
  if (status !== undefined && status >= 500) return {};
  if (status === undefined && (e.type === "StripeConnectionError" || e.type === "StripeAPIError")) return {};
  return { fatal: true };
}

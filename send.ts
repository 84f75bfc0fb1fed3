// send.ts: a sender, on undici, that replays the article's story: evt_100 three times (the provider
// retried) and evt_101 once. Point it at a running receiver:
//   npx tsx send.ts [--url http://127.0.0.1:8000]
// It prints "evt_100: stored", then "evt_100: duplicate", and so on. With --provider and --secret it
// signs each delivery as that provider would, to check a receiver's sources: see `--help`.

import { createHash } from "node:crypto";
import { pathToFileURL } from "node:url";
import { request } from "undici";
import { DEFAULTS, message } from "./inbox.ts";
import { PROVIDERS, sign, type Preset } from "./providers.ts";

/** SENDABLE are the providers send.ts can sign like; an `hmac` scheme lives in a sources file, not on the command line. */
export const SENDABLE = PROVIDERS.filter((p): p is Preset => p !== "hmac");

/** Outgoing is one webhook to send: its delivery ID and its JSON event. */
export interface Outgoing {
  id: string;
  event: unknown;
}

/** STORY is the article's four deliveries; the repeats keep their ID, as a provider's retry would. */
export const STORY: readonly Outgoing[] = [
  { id: "evt_100", event: { customer: "Maria Lopez", amount: 24.99 } },
  { id: "evt_100", event: { customer: "Maria Lopez", amount: 24.99 } },
  { id: "evt_101", event: { customer: "Sam Okafor", amount: 12.5 } },
  { id: "evt_100", event: { customer: "Maria Lopez", amount: 24.99 } },
];

/** Signing says whose scheme to sign with; without it, deliveries go out unsigned, as in the article. */
export interface Signing {
  provider: Preset;
  /** The secret as the provider hands it out (Stripe's and Standard Webhooks' begin whsec_). */
  secret: string;
  /** The URL the provider was given, which Square and Twilio sign. @default the URL posted to */
  signedUrl?: string;
  /** The clock for the signed timestamp, in ms since the epoch. @default Date.now */
  now?: () => number;
}

/**
 * signed returns the body, headers and URL for one delivery: the event wrapped as the provider wraps it
 * (the delivery ID inside the body where the provider puts it there), signed now. The body depends only
 * on the delivery (Linear's signed timestamp aside), so a retry is a true duplicate, as a provider's is.
 */
export function signed(delivery: Outgoing, signing: Signing | undefined, url: string): { body: string; headers: Record<string, string>; url: string } {
  if (!signing) return { body: JSON.stringify(delivery.event), headers: { "content-type": "application/json", "x-delivery-id": delivery.id }, url };
  const { provider, secret } = signing;
  const nowMs = (signing.now ?? Date.now)();
  const { id, event } = delivery;
  const [body, eventType]: [unknown, string | undefined] =
    provider === "standard" ? [{ type: "payment.succeeded", data: event }, undefined]
    : provider === "stripe" ? [{ id, object: "event", type: "payment_intent.succeeded", data: { object: event } }, undefined]
    : provider === "slack" ? [{ type: "event_callback", event_id: id, event: { type: "payment", payment: event } }, undefined]
    : provider === "github" ? [event, "payment"]
    : provider === "shopify" ? [event, "orders/paid"]
    : provider === "paddle" ? [{ event_id: id, event_type: "transaction.paid", data: event }, undefined]
    : provider === "linear" ? [{ action: "create", type: "Payment", data: event, webhookTimestamp: nowMs }, "Payment"]
    : provider === "square" ? [{ merchant_id: "M1", type: "payment.updated", event_id: id, data: { object: event } }, undefined]
    : provider === "zoom" ? [{ event: "payment.succeeded", payload: { id, object: event } }, undefined]
    : provider === "intercom" ? [{ type: "notification_event", id, topic: "payment.succeeded", data: { item: event } }, undefined]
    : [event, undefined];
  const text = JSON.stringify(body);
  // Twilio signs a JSON body through the URL: its SHA-256 goes in as bodySHA256, and the URL is signed.
  const hash = provider === "twilio" ? `bodySHA256=${createHash("sha256").update(text).digest("hex")}` : "";
  const withHash = (u: string) => (hash ? `${u}${u.includes("?") ? "&" : "?"}${hash}` : u);
  const headers = sign(provider, secret, { id, body: text, timestampS: Math.floor(nowMs / 1000), eventType, url: withHash(signing.signedUrl ?? url) });
  return { body: text, headers: { "content-type": "application/json", ...headers }, url: withHash(url) };
}

/** send posts one delivery, signed if signing is given, and returns the receiver's status and answer. */
export async function send(url: string, delivery: Outgoing, signing?: Signing): Promise<{ status: number; text: string }> {
  const out = signed(delivery, signing, url);
  const response = await request(out.url, { method: "POST", headers: out.headers, body: out.body });
  return { status: response.statusCode, text: (await response.body.text()).trim() };
}

async function main(argv: string[]): Promise<void> {
  const { Command } = await import("commander");
  const program = new Command("send.ts")
    .description("Send the article's deliveries, duplicates included, to a receiver.")
    .option("--url <url>", "the receiver's address", `http://${DEFAULTS.host}:${DEFAULTS.port}`)
    .option("--provider <name>", `sign like this provider: ${SENDABLE.join(", ")} (default: unsigned, X-Delivery-Id)`)
    .option("--secret <secret>", "the source's secret, as the provider gives it (whsec_… for stripe and standard)")
    .option("--signed-url <url>", "the URL the provider was given, which square and twilio sign (default: --url)")
    .addHelpText("after", `
Examples:
  npx tsx receiver.ts &    # in another terminal
  npx tsx send.ts
  npx tsx send.ts --url http://127.0.0.1:9000
  npx tsx send.ts --provider stripe --secret "$STRIPE_WEBHOOK_SECRET" --url http://127.0.0.1:8000/stripe`)
    .showHelpAfterError("(run with --help for usage)");
  program.exitOverride((error) => process.exit(error.exitCode === 0 ? 0 : 2));
  await program.parseAsync(argv);
  const { url, provider, secret, signedUrl } = program.opts<{ url: string; provider?: string; secret?: string; signedUrl?: string }>();
  try {
    new URL(url);
  } catch {
    console.error(`send: --url must be an address such as http://127.0.0.1:8000, got ${url}`);
    process.exit(2);
  }
  let signing: Signing | undefined;
  if (provider !== undefined || secret !== undefined) {
    if (!(SENDABLE as readonly string[]).includes(provider ?? "")) {
      console.error(`send: --provider must be one of ${SENDABLE.join(", ")}, got ${provider ?? "(none)"}`);
      process.exit(2);
    }
    signing = { provider: provider as Preset, secret: secret ?? "", ...(signedUrl ? { signedUrl } : {}) };
    try {
      signed(STORY[0]!, signing, url); // a bad secret is a usage error, found before anything is sent
    } catch (error) {
      console.error(`send: --secret: ${message(error)}`);
      process.exit(2);
    }
  }

  for (const delivery of STORY) {
    try {
      const { status, text } = await send(url, delivery, signing);
      console.log(status === 200 ? `${delivery.id}: ${text}` : `${delivery.id}: ${status} ${text}`);
      if (status !== 200) process.exitCode = 1;
    } catch (error) {
      const refused = (error as { code?: string }).code === "ECONNREFUSED";
      console.error(refused
        ? `send: no receiver at ${url} (connection refused); start one with: npx tsx receiver.ts`
        : `send: ${delivery.id} could not be sent to ${url}: ${message(error)}`);
      process.exit(1);
    }
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) await main(process.argv);

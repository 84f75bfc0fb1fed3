// send.ts: a sender, on undici, that replays the article's story: evt_100 three times (the provider
// retried) and evt_101 once. Point it at a running receiver:
//   npx tsx send.ts [--url http://127.0.0.1:8000]
// It prints "evt_100: stored", then "evt_100: duplicate", and so on. With --provider and --secret it
// signs each delivery as that provider would, to check a receiver's sources: see `--help`.
// With --count N it floods instead, to try a deployment: npx tsx send.ts --count 10000 --concurrency 32 --duplicates 10%

import { createHash } from "node:crypto";
import { pathToFileURL } from "node:url";
import { request } from "undici";
import { DEFAULTS } from "./lib/defaults.ts";
import { speakTo } from "./lib/format.ts";
import { jsonLine, LOG_FORMATS, message, progress, type LogFormat } from "./lib/log.ts";
import { PROVIDERS, sign, type Preset } from "./lib/providers.ts";

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
export function signed(
  delivery: Outgoing,
  signing: Signing | undefined,
  url: string,
): { body: string; headers: Record<string, string>; url: string } {
  if (!signing)
    return {
      body: JSON.stringify(delivery.event),
      headers: { "content-type": "application/json", "x-delivery-id": delivery.id },
      url,
    };
  const { provider, secret } = signing;
  const nowMs = (signing.now ?? Date.now)();
  const { id, event } = delivery;
  const [body, eventType]: [unknown, string | undefined] =
    provider === "standard"
      ? [{ type: "payment.succeeded", data: event }, undefined]
      : provider === "stripe"
        ? [{ id, object: "event", type: "payment_intent.succeeded", data: { object: event } }, undefined]
        : provider === "slack"
          ? [{ type: "event_callback", event_id: id, event: { type: "payment", payment: event } }, undefined]
          : provider === "github"
            ? [event, "payment"]
            : provider === "shopify"
              ? [event, "orders/paid"]
              : provider === "paddle"
                ? [{ event_id: id, event_type: "transaction.paid", data: event }, undefined]
                : provider === "linear"
                  ? [{ action: "create", type: "Payment", data: event, webhookTimestamp: nowMs }, "Payment"]
                  : provider === "square"
                    ? [{ merchant_id: "M1", type: "payment.updated", event_id: id, data: { object: event } }, undefined]
                    : provider === "zoom"
                      ? [{ event: "payment.succeeded", payload: { id, object: event } }, undefined]
                      : provider === "intercom"
                        ? [
                            { type: "notification_event", id, topic: "payment.succeeded", data: { item: event } },
                            undefined,
                          ]
                        : [event, undefined];
  const text = JSON.stringify(body);
  // Twilio signs a JSON body through the URL: its SHA-256 goes in as bodySHA256, and the URL is signed.
  const hash = provider === "twilio" ? `bodySHA256=${createHash("sha256").update(text).digest("hex")}` : "";
  const withHash = (u: string) => (hash ? `${u}${u.includes("?") ? "&" : "?"}${hash}` : u);
  const headers = sign(provider, secret, {
    id,
    body: text,
    timestampS: Math.floor(nowMs / 1000),
    eventType,
    url: withHash(signing.signedUrl ?? url),
  });
  return { body: text, headers: { "content-type": "application/json", ...headers }, url: withHash(url) };
}

/** send posts one delivery, signed if signing is given, and returns the receiver's status and answer. */
export async function send(
  url: string,
  delivery: Outgoing,
  signing?: Signing,
): Promise<{ status: number; text: string }> {
  const out = signed(delivery, signing, url);
  const response = await request(out.url, { method: "POST", headers: out.headers, body: out.body });
  return { status: response.statusCode, text: (await response.body.text()).trim() };
}

/** FloodOptions sizes flood(). */
export interface FloodOptions {
  /** Deliveries to send, resends included. */
  count: number;
  /** Requests in flight at once. @default 16 */
  concurrency?: number;
  /** Fraction in [0, 1] of the deliveries that resend an earlier one, same ID and body. @default 0 */
  duplicates?: number;
  signing?: Signing;
  /** A number in [0, 1) that picks the resends. @default Math.random */
  random?: () => number;
  /** Called after each answer, for a progress line. @default none */
  onAnswer?: (summary: FloodSummary) => void;
}

/** FloodSummary is what a flood did: the answers by kind, the rate, and the latency of the answers. */
export interface FloodSummary {
  sent: number;
  stored: number;
  duplicate: number;
  /** Answers other than 200, by status. */
  refused: Record<string, number>;
  /** Requests that got no answer at all (refused connections, resets). */
  errors: number;
  seconds: number;
  perSecond: number;
  p50Ms: number;
  p99Ms: number;
}

/**
 * flood sends count deliveries, concurrency at a time, each with an ID unique to this run, except that
 * a duplicates fraction resend one sent before (its ID and its body, as a provider's retry would). It
 * resolves once every request has been answered or has failed.
 */
export async function flood(url: string, options: FloodOptions): Promise<FloodSummary> {
  const concurrency = options.concurrency ?? 16;
  const duplicates = options.duplicates ?? 0;
  if (!Number.isInteger(options.count) || options.count < 1)
    throw new TypeError(`flood: expected count >= 1, got ${options.count}`);
  if (!Number.isInteger(concurrency) || concurrency < 1)
    throw new TypeError(`flood: expected concurrency >= 1, got ${concurrency}`);
  if (!(duplicates >= 0 && duplicates <= 1))
    throw new TypeError(`flood: expected duplicates in [0, 1], got ${duplicates}`);
  const random = options.random ?? Math.random;
  // A prefix of its own, so a second run against the same inbox sends new deliveries, not duplicates.
  const run = `flood-${Date.now().toString(36)}-${Math.floor(random() * 36 ** 4).toString(36)}`;
  const firsts: Outgoing[] = [];
  const plan: Outgoing[] = [];
  for (let i = 0; i < options.count; i++) {
    if (firsts.length > 0 && random() < duplicates) plan.push(firsts[Math.floor(random() * firsts.length)]!);
    else {
      const delivery = { id: `${run}-${i}`, event: { customer: "Flood", amount: 1 + (i % 100) } };
      firsts.push(delivery);
      plan.push(delivery);
    }
  }
  const summary: FloodSummary = {
    sent: 0,
    stored: 0,
    duplicate: 0,
    refused: {},
    errors: 0,
    seconds: 0,
    perSecond: 0,
    p50Ms: 0,
    p99Ms: 0,
  };
  const latencies: number[] = [];
  const started = performance.now();
  let next = 0;
  const lane = async () => {
    while (next < plan.length) {
      const delivery = plan[next++]!;
      const t0 = performance.now();
      try {
        const { status, text } = await send(url, delivery, options.signing);
        latencies.push(performance.now() - t0);
        if (status === 200 && text === "stored") summary.stored++;
        else if (status === 200) summary.duplicate++;
        else summary.refused[status] = (summary.refused[status] ?? 0) + 1;
      } catch {
        summary.errors++;
      }
      summary.sent++;
      options.onAnswer?.(summary);
    }
  };
  await Promise.all(Array.from({ length: Math.min(concurrency, plan.length) }, lane));
  summary.seconds = (performance.now() - started) / 1000;
  summary.perSecond = summary.sent / summary.seconds;
  latencies.sort((a, b) => a - b);
  const at = (q: number) =>
    latencies.length === 0 ? 0 : latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))]!;
  summary.p50Ms = at(0.5);
  summary.p99Ms = at(0.99);
  return summary;
}

/** floodLine is the summary as one line for people. */
export function floodLine(s: FloodSummary): string {
  const refused = Object.values(s.refused).reduce((a, b) => a + b, 0);
  const by = Object.entries(s.refused)
    .map(([status, n]) => `${n}× ${status}`)
    .join(", ");
  return (
    `sent ${s.sent} in ${s.seconds.toFixed(1)} s: stored ${s.stored}, duplicate ${s.duplicate}, refused ${refused}${by ? ` (${by})` : ""}` +
    `${s.errors > 0 ? `, no answer ${s.errors}` : ""}; ${Math.round(s.perSecond)} req/s; p50 ${s.p50Ms.toFixed(2)} ms, p99 ${s.p99Ms.toFixed(2)} ms`
  );
}

async function main(argv: string[]): Promise<void> {
  const { Command, InvalidArgumentError } = await import("commander");
  const whole = (value: string) => {
    const n = Number(value);
    if (!Number.isInteger(n) || n < 1) throw new InvalidArgumentError("expected a whole number of 1 or more.");
    return n;
  };
  const percent = (value: string) => {
    const n = Number(value.replace(/%$/, ""));
    if (value.trim() === "" || !Number.isFinite(n) || n < 0 || n > 100)
      throw new InvalidArgumentError("expected a percentage from 0 to 100, such as 10%.");
    return n / 100;
  };
  const logFormat = (value: string) => {
    if (!(LOG_FORMATS as readonly string[]).includes(value))
      throw new InvalidArgumentError(`expected ${LOG_FORMATS.join(" or ")}.`);
    return value as LogFormat;
  };
  const program = new Command("send.ts")
    .description("Send the article's deliveries, duplicates included, to a receiver.")
    .option("--url <url>", "the receiver's address", `http://${DEFAULTS.host}:${DEFAULTS.port}`)
    .option("--provider <name>", `sign like this provider: ${SENDABLE.join(", ")} (default: unsigned, X-Delivery-Id)`)
    .option("--secret <secret>", "the source's secret, as the provider gives it (whsec_… for stripe and standard)")
    .option("--signed-url <url>", "the URL the provider was given, which square and twilio sign (default: --url)")
    .option(
      "--count <n>",
      "flood: send this many deliveries instead of the article's four, then print a summary",
      whole,
    )
    .option("--concurrency <n>", "flood: requests in flight at once", whole, 16)
    .option(
      "--duplicates <percent>",
      "flood: this share of the deliveries resend an earlier one (e.g. 10%)",
      percent,
      0,
    )
    .option(
      "--log-format <format>",
      `text, or json: the answers and the summary as JSON objects, one per line (${LOG_FORMATS.join(" or ")})`,
      logFormat,
      "text",
    )
    .addHelpText(
      "after",
      `
Examples:
  npx tsx receiver.ts &    # in another terminal
  npx tsx send.ts
  npx tsx send.ts --url http://127.0.0.1:9000
  npx tsx send.ts --provider stripe --secret "$STRIPE_WEBHOOK_SECRET" --url http://127.0.0.1:8000/stripe
  npx tsx send.ts --count 10000 --concurrency 32 --duplicates 10%     # flood; progress on a terminal`,
    )
    .showHelpAfterError("(run with --help for usage)");
  speakTo(program, argv);
  program.exitOverride((error) => process.exit(error.exitCode === 0 ? 0 : 2));
  await program.parseAsync(argv);
  const {
    url,
    provider,
    secret,
    signedUrl,
    count,
    concurrency,
    duplicates,
    logFormat: format,
  } = program.opts<{
    url: string;
    provider?: string;
    secret?: string;
    signedUrl?: string;
    count?: number;
    concurrency: number;
    duplicates: number;
    logFormat: LogFormat;
  }>();
  const json = format === "json";
  const say = (line: string) => console.error(json ? jsonLine(line, { level: "error" }) : line);
  try {
    new URL(url);
  } catch {
    say(`send: --url must be an address such as http://127.0.0.1:8000, got ${url}`);
    process.exit(2);
  }
  let signing: Signing | undefined;
  if (provider !== undefined || secret !== undefined) {
    if (!(SENDABLE as readonly string[]).includes(provider ?? "")) {
      say(`send: --provider must be one of ${SENDABLE.join(", ")}, got ${provider ?? "(none)"}`);
      process.exit(2);
    }
    signing = { provider: provider as Preset, secret: secret ?? "", ...(signedUrl ? { signedUrl } : {}) };
    try {
      signed(STORY[0]!, signing, url); // a bad secret is a usage error, found before anything is sent
    } catch (error) {
      say(`send: --secret: ${message(error)}`);
      process.exit(2);
    }
  }

  if (count !== undefined) {
    // The live line goes to stderr, on a terminal only; the summary to stdout, whatever it is.
    let sent = 0;
    const shown = progress(process.stderr, () => ({ done: sent, total: count }));
    const summary = await flood(url, {
      count,
      concurrency,
      duplicates,
      signing,
      onAnswer: (s) => void (sent = s.sent),
    });
    shown?.stop();
    console.log(json ? jsonLine(floodLine(summary), { ...summary }) : floodLine(summary));
    if (summary.errors === summary.sent) {
      say(`send: no receiver answered at ${url}; start one with: npx tsx receiver.ts`);
      process.exit(1);
    }
    if (summary.errors > 0 || Object.keys(summary.refused).length > 0) process.exitCode = 1;
    return;
  }

  for (const delivery of STORY) {
    try {
      const { status, text } = await send(url, delivery, signing);
      const line = status === 200 ? `${delivery.id}: ${text}` : `${delivery.id}: ${status} ${text}`;
      console.log(
        json
          ? jsonLine(line, { level: status === 200 ? "info" : "warn", id: delivery.id, status, answer: text })
          : line,
      );
      if (status !== 200) process.exitCode = 1;
    } catch (error) {
      const refused = (error as { code?: string }).code === "ECONNREFUSED";
      say(
        refused
          ? `send: no receiver at ${url} (connection refused); start one with: npx tsx receiver.ts`
          : `send: ${delivery.id} could not be sent to ${url}: ${message(error)}`,
      );
      process.exit(1);
    }
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) await main(process.argv);

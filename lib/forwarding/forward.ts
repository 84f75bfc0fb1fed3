// forwarding/forward.ts: one delivery over HTTP to a destination's own endpoint, and what its answer means (the table
// in docs/forwarding.md). The raw body goes byte-exact with its content type, signed as Standard Webhooks
// with the destination's own secrets; redirects are not followed. The forwarder (forwarder.ts) calls it;
// announce() posts the operator's events the same way. Not run on its own.

import { createHmac, createSecretKey, randomBytes, randomFillSync } from "node:crypto";
import { rootCertificates } from "node:tls";
import type { Agent } from "undici";
import { DEFAULTS } from "../defaults.ts";
import { message } from "../log.ts";
import { secretKey, sign } from "../providers.ts";
import { REFUSED_CODE } from "../reach.ts";
import type { Redactor } from "../redact.ts";
import type { HttpDestination, Operator } from "../routing/routes.ts";
import type { Lease } from "../store.ts";

/**
 * SendResult is what one forward (or publish) came to; every destination, HTTP or broker, answers with one,
 * with the answer itself where one came (for the delivery's attempt log).
 */
export type SendResult = (
  | { kind: "done" }
  /** Try again later, no sooner than afterMs if the destination said so (Retry-After). */
  | { kind: "retry"; error: string; afterMs?: number }
  /** Retrying cannot help: set the delivery aside. */
  | { kind: "failed"; error: string }
  /** The destination said it is gone (410): pause it, and hand the delivery back without spending its attempt. */
  | { kind: "gone"; error: string }
) & { reply?: Reply };

/** Reply is a destination's answer as the attempt log keeps it: its status, headers and first bytes, redacted. */
export interface Reply {
  status: number;
  headers: Record<string, string>;
  body: string;
}

/** Sender forwards one delivery to one destination; the forwarder runs one per destination. */
export interface Sender {
  /**
   * send forwards the leased delivery (its body and content type as its transform left them); it never
   * throws: a failure is an SendResult. headers are the transform's changes: a string sets one, null removes it.
   */
  send(
    lease: Lease,
    options: { signal: AbortSignal; permanent4xx: boolean; headers?: Record<string, string | null> },
  ): Promise<SendResult>;
  close(): Promise<void>;
}

// Headers of the connection, not of the message, and the ones the forward sets itself: never copied from
// the provider's request.
const HOP_BY_HOP = new Set([
  "connection",
  "keep-alive",
  "transfer-encoding",
  "te",
  "trailer",
  "upgrade",
  "proxy-authorization",
  "proxy-authenticate",
  "host",
  "content-length",
  "expect",
]);

/** signatures signs a body for Standard Webhooks with every secret (the app may hold any one: rotation). */
export function signatures(
  secrets: readonly string[],
  id: string,
  body: Buffer,
  timestampS: number,
): Record<string, string> {
  const all = secrets.map((secret) => sign("standard", secret, { id, body, timestampS }));
  return { ...all[0]!, "webhook-signature": all.map((h) => h["webhook-signature"]).join(" ") };
}

/**
 * signer is signatures() for one destination's secrets, their keys prepared once: an HMAC keyed with raw
 * bytes prepares the key again at every call, which cost more than the rest of a forward's signing.
 */
export function signer(
  secrets: readonly string[],
  where: string,
): (id: string, body: Buffer, timestampS: number) => Record<string, string> {
  const keys = secrets.map((s, i) =>
    createSecretKey(secretKey("standard", s, `${where}: ${secrets.length > 1 ? `secret #${i + 1}` : "secret"}`)),
  );
  return (id, body, timestampS) => {
    const ts = String(timestampS);
    const signed = keys.map(
      (key) => `v1,${createHmac("sha256", key).update(`${id}.${ts}.`).update(body).digest("base64")}`,
    );
    return { "webhook-id": id, "webhook-timestamp": ts, "webhook-signature": signed.join(" ") };
  };
}

/** checkSecrets throws a TypeError if a secret is not Standard Webhooks' whsec_ + base64 (caught at start-up, not at the first forward). */
export function checkSecrets(secrets: readonly string[], where: string): void {
  secrets.forEach((s, i) =>
    secretKey("standard", s, `${where}: ${secrets.length > 1 ? `secret #${i + 1}` : "secret"}`),
  );
}

// Random bytes for fresh trace IDs, drawn a few thousand at a time: one call each costs more than a trace is worth.
const pool = Buffer.alloc(24 * 256);
let pooled = pool.length;

/** traceparentOf is the delivery's stored W3C traceparent, or a fresh one when none was taken at receive time. */
export function traceparentOf(lease: Pick<Lease, "traceparent">): string {
  if (lease.traceparent && /^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$/.test(lease.traceparent))
    return lease.traceparent;
  if (pooled === pool.length) {
    randomFillSync(pool);
    pooled = 0;
  }
  const hex = pool.toString("hex", pooled, (pooled += 24));
  return `00-${hex.slice(0, 32)}-${hex.slice(32)}-01`;
}

/**
 * forwardHeaders builds the headers of one forward; the delivery's key (source:id) is its webhook-id.
 * sign is the destination's signer(), made once; changes are a transform's (null removes a header). The
 * signature is made last, over lease.body: the bytes that are sent.
 */
export function forwardHeaders(
  destination: HttpDestination,
  lease: Lease,
  nowMs: number,
  sign: (id: string, body: Buffer, timestampS: number) => Record<string, string> = signer(
    destination.secrets,
    `destination ${JSON.stringify(destination.name)}`,
  ),
  changes?: Record<string, string | null>,
): Record<string, string> {
  const headers: Record<string, string> = {};
  if (destination.forwardHeaders && lease.headers) {
    for (const [name, values] of Object.entries(lease.headers)) {
      if (
        !values ||
        values.length === 0 ||
        HOP_BY_HOP.has(name) ||
        name.startsWith("webhook-") ||
        name.startsWith("inbox-")
      )
        continue;
      headers[name] = values.join(", ");
    }
  }
  Object.assign(headers, destination.headers, {
    "content-type": lease.contentType ?? "application/octet-stream",
    "user-agent": "webhook-inbox",
    traceparent: traceparentOf(lease),
    "inbox-source": lease.source,
    "inbox-delivery-id": lease.id,
    "inbox-attempt": String(lease.attempts),
    ...(lease.eventType ? { "inbox-event-type": lease.eventType } : {}),
    ...(lease.orderKey !== null
      ? { "inbox-order-key": lease.orderKey, "inbox-stale": lease.newerId !== null ? "true" : "false" }
      : {}),
    ...(lease.newerId !== null ? { "inbox-newer-id": lease.newerId } : {}),
  });
  if (changes) {
    for (const [name, value] of Object.entries(changes)) {
      if (value === null) delete headers[name];
      else headers[name] = value;
    }
  }
  return Object.assign(headers, sign(`${lease.source}:${lease.id}`, lease.body, Math.floor(nowMs / 1000)));
}

/**
 * retryAfterMs reads a Retry-After header: seconds, or an HTTP date; undefined if absent or unreadable.
 * A time already past counts as now.
 */
export function retryAfterMs(value: string | string[] | undefined, nowMs: number): number | undefined {
  const text = Array.isArray(value) ? value[0] : value;
  if (text === undefined || text.trim() === "") return undefined;
  if (/^\s*\d+\s*$/.test(text)) return Number(text) * 1000;
  const at = Date.parse(text);
  return Number.isNaN(at) ? undefined : Math.max(0, at - nowMs);
}

/**
 * judge turns an answer into an SendResult, by the table in docs/forwarding.md: 2xx done; 410 gone; 429 and
 * 503 retry no sooner than Retry-After; 408, 409, 425 and 429 retry; another 4xx is permanent only if
 * the route says so; 3xx (not followed) and 5xx retry. The error keeps the answer's first bytes.
 */
export function judge(
  status: number,
  headers: Record<string, string | string[] | undefined>,
  head: string,
  name: string,
  permanent4xx: boolean,
  nowMs: number,
): SendResult {
  if (status >= 200 && status < 300) return { kind: "done" };
  const shown = head.replace(/\s+/g, " ").trim();
  const error = `HTTP ${status} from ${name}${status >= 300 && status < 400 && headers.location ? ` (a redirect to ${String(headers.location)}, not followed)` : ""}${shown ? `: ${shown}` : ""}`;
  if (status === 410) return { kind: "gone", error };
  if (status === 429 || status === 503) {
    const afterMs = retryAfterMs(headers["retry-after"], nowMs);
    return { kind: "retry", error, ...(afterMs !== undefined ? { afterMs } : {}) };
  }
  if (status >= 400 && status < 500 && ![408, 409, 425, 429].includes(status) && permanent4xx)
    return { kind: "failed", error };
  return { kind: "retry", error };
}

// undici is loaded by the first forward or announcement, not at start-up: its import is about a third of
// a second of CPU, which a worker with no HTTP destination (worker.ts --once, say) would pay for nothing.
let undiciModule: typeof import("undici") | undefined;
const undici = async () => (undiciModule ??= await import("undici"));

/**
 * httpSender forwards to one HTTP destination through a connection pool of its own, TLS verified. A failed
 * answer's first bytes are kept with its error, redacted first by redactor (redact.ts) where given.
 */
export function httpSender(
  destination: HttpDestination,
  options: { now?: () => number; answerBytes?: number; bodyBytes?: number; redactor?: Redactor } = {},
): Sender {
  const sign = signer(destination.secrets, `destination ${JSON.stringify(destination.name)}`);
  const now = options.now ?? Date.now;
  const answerBytes = options.answerBytes ?? DEFAULTS.answerBytes;
  const bodyBytes = Math.max(answerBytes, options.bodyBytes ?? DEFAULTS.attemptBodyBytes);
  const redactor = options.redactor;
  const pool = ({ Agent, buildConnector }: typeof import("undici")): Agent => {
    const connect = {
      timeout: destination.connectTimeoutMs,
      rejectUnauthorized: true,
      // A private CA is trusted besides the system's, not instead of them.
      ...(destination.ca ? { ca: [...rootCertificates, destination.ca] } : {}),
    };
    return new Agent({
      connections: destination.maxInFlight,
      // A destination the API set is checked on the address each connection goes to (lib/reach.ts).
      connect: destination.reach
        ? (destination.reach.connector(
            buildConnector as never,
            connect,
          ) as unknown as import("undici").buildConnector.connector)
        : connect,
      headersTimeout: destination.timeoutMs,
      bodyTimeout: destination.timeoutMs,
    });
  };
  let agent: Agent | undefined;
  const name = destination.name;
  return {
    async send(lease, { signal, permanent4xx, headers: changes }) {
      // One controller for the worker's signal and the forward's own timeout (AbortSignal.any with
      // AbortSignal.timeout cost more than the signing).
      const controller = new AbortController();
      let timedOut = false;
      const stop = () => controller.abort(signal.reason);
      if (signal.aborted) stop();
      else signal.addEventListener("abort", stop, { once: true });
      const timer = setTimeout(() => {
        timedOut = true;
        controller.abort(new Error(`no answer within ${destination.timeoutMs} ms`));
      }, destination.timeoutMs);
      try {
        const module = undiciModule ?? (await undici());
        agent ??= pool(module);
        const { request } = module;
        const res = await request(destination.url, {
          method: "POST",
          dispatcher: agent,
          headers: forwardHeaders(destination, lease, now(), sign, changes),
          body: lease.body,
          signal: controller.signal,
        });
        // Every answer's first bytes are kept in the attempt log, a good one's too. Read past the cut by the
        // longest secret's reach, so a secret that straddles it is seen whole and replaced, not kept in half;
        // redacted before judge() folds its whitespace. The rest is let go, the connection with it.
        const good = res.statusCode >= 200 && res.statusCode < 300;
        const read = await firstBytes(res.body, bodyBytes, redactor?.reach ?? 0, good ? 1 << 20 : 0);
        const cut = (keep: number) => (redactor ? redactor.redact(read.text, keep) : read.text.slice(0, keep));
        const body = cut(read.keep(bodyBytes));
        // The error's head is cut on its own, so that a secret straddling its cut leaves its marker whole.
        const head = good ? "" : cut(read.keep(answerBytes));
        const reply: Reply = { status: res.statusCode, headers: answerHeaders(res.headers, redactor), body };
        return { ...judge(res.statusCode, res.headers, head, name, permanent4xx, now()), reply };
      } catch (error) {
        if (timedOut && !signal.aborted)
          return { kind: "retry", error: `${name} did not answer within ${destination.timeoutMs} ms` };
        if (signal.aborted) return { kind: "retry", error: `forward to ${name} stopped: ${message(signal.reason)}` };
        // The rule refused the address: no retry reaches it until the operator allows it, and the
        // destination said nothing, so its breaker counts the try as it counts a permanent 4xx: not down.
        if (codeOf(error) === REFUSED_CODE) return refused(name, error);
        if (codeOf(error) === "UND_ERR_CONNECT_TIMEOUT")
          return {
            kind: "retry",
            error: `${name}: no connection within ${destination.connectTimeoutMs} ms (UND_ERR_CONNECT_TIMEOUT)`,
          };
        return { kind: "retry", error: `${name}: ${describe(error)}` };
      } finally {
        clearTimeout(timer);
        signal.removeEventListener("abort", stop);
      }
    },
    close: async () => agent?.close(),
  };
}

// answerHeaders are an answer's headers as the attempt log keeps them: one string each, redacted, since a
// destination may echo what it was sent (a signature, a token) in a header as well as in its body.
function answerHeaders(
  headers: Record<string, string | string[] | undefined>,
  redactor: Redactor | undefined,
): Record<string, string> {
  const kept: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue;
    const text = Array.isArray(value) ? value.join(", ") : value;
    kept[name] = redactor ? redactor.redact(text) : text;
  }
  return kept;
}

// firstBytes reads up to n bytes of an answer for the delivery's page, and more past them, then lets the
// rest go: text is all it kept, keep(m) the characters of its first m bytes. It reads on, keeping nothing,
// up to `through` bytes in all, so that a good answer a little longer than the cut leaves its connection
// whole for the next forward rather than cut.
async function firstBytes(
  body: AsyncIterable<Buffer> & { destroy(): void },
  n: number,
  more: number,
  through = 0,
): Promise<{ text: string; keep: (m: number) => number }> {
  const chunks: Buffer[] = [];
  let size = 0;
  try {
    for await (const chunk of body) {
      if (size < n + more) chunks.push(chunk);
      size += chunk.length;
      if (size >= Math.max(n + more, through)) break;
    }
  } catch {
    // An answer cut short still says what it said so far.
  } finally {
    body.destroy();
  }
  const all = Buffer.concat(chunks);
  return { text: all.subarray(0, n + more).toString("utf8"), keep: (m) => all.subarray(0, m).toString("utf8").length };
}

// refused is the SendResult of a forward whose connection the address rule refused (lib/reach.ts): set aside
// now, saying why, for the operator to allow the range and retry.
function refused(name: string, error: unknown): SendResult {
  const e = error as { message?: string; cause?: { code?: string; message?: string } };
  const why = e.cause?.code === REFUSED_CODE ? e.cause.message : e.message;
  return { kind: "failed", error: `${name}: ${why ?? "refused"}` };
}

// codeOf is a network failure's code, on the error or on its cause.
function codeOf(error: unknown): string | undefined {
  const e = error as { code?: string; cause?: { code?: string } };
  return e.code ?? e.cause?.code;
}

// describe names a network failure the way an operator searches for it: the code, then what it says, and
// "TLS" before a certificate that could not be verified (OpenSSL's verify codes, and Node's ERR_TLS_…).
function describe(error: unknown): string {
  const code = codeOf(error);
  const text = (error as { cause?: { message?: string } }).cause?.message ?? message(error);
  const said = code && !text.includes(code) ? `${code}: ${text}` : text;
  return code && /CERT|VERIFY|SIGNATURE|^ERR_TLS_|^ERR_SSL_/.test(code) ? `TLS: ${said}` : said;
}

/** OperatorEvent is one announcement: a breaker opened or closed, a destination paused or resumed, a delivery set aside. */
export interface OperatorEvent {
  type:
    | "destination.opened"
    | "destination.closed"
    | "destination.paused"
    | "destination.resumed"
    | "delivery.set_aside";
  data: Record<string, unknown>;
}

/**
 * announce posts an operator event to the operator's URL as a signed Standard Webhooks event (Svix's
 * operational webhooks are the model), trying three times; it never throws, and says how it went.
 */
export async function announce(
  operator: Operator,
  event: OperatorEvent,
  nowMs: number = Date.now(),
): Promise<true | string> {
  const id = `evt_${randomBytes(12).toString("hex")}`;
  const body = Buffer.from(
    JSON.stringify({ type: event.type, timestamp: new Date(nowMs).toISOString(), data: event.data }),
  );
  let last = "";
  const module = await undici();
  // An $operator the API set is held to the address rule, as its destinations are.
  const dispatcher = operator.reach
    ? new module.Agent({
        connect: operator.reach.connector(module.buildConnector as never, {
          timeout: 5_000,
        }) as unknown as import("undici").buildConnector.connector,
      })
    : undefined;
  try {
    for (let attempt = 1; attempt <= 3; attempt++) {
      try {
        const res = await module.request(operator.url, {
          method: "POST",
          ...(dispatcher ? { dispatcher } : {}),
          body,
          signal: AbortSignal.timeout(5_000),
          headers: {
            ...operator.headers,
            "content-type": "application/json",
            "user-agent": "webhook-inbox",
            ...signatures(operator.secrets, id, body, Math.floor(nowMs / 1000)),
          },
        });
        await res.body.dump().catch(() => {});
        if (res.statusCode >= 200 && res.statusCode < 300) return true;
        last = `HTTP ${res.statusCode}`;
      } catch (error) {
        last = describe(error);
        // A refused address stays refused: trying again reaches nothing.
        if (codeOf(error) === REFUSED_CODE) break;
      }
      if (attempt < 3) await new Promise((resolve) => setTimeout(resolve, 200 * attempt));
    }
  } finally {
    await dispatcher?.close().catch(() => {});
  }
  return `the operator's URL did not take ${event.type} (${last})`;
}

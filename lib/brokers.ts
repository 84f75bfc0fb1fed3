// brokers.ts: publishing a delivery into a message broker, as a destination of its own: NATS JetStream (the
// official @nats-io clients) or RabbitMQ (amqplib). A publish resolves done only once the broker has the
// message (JetStream's PubAck, RabbitMQ's publisher confirm), and every failure maps to retry or failed,
// like an HTTP forward's; brokerSender() is a broker destination as the forwarder runs it. docs/brokers.md
// says what each guarantees. Not run on its own:
//   const broker = openBroker(parseBrokerDestination("audit", { type: "nats", subject: "webhooks.{source}.{type}" }, undefined, process.env));
//   const outcome = await broker.publish(messageOf(job.delivery, job.traceparent), job.signal);

import type { ChannelModel, ConfirmChannel, Options as AmqpOptions } from "amqplib";
import type { JetStreamClient } from "@nats-io/jetstream";
import type { MsgHdrs, NatsConnection } from "@nats-io/transport-node";
import { DEFAULTS } from "./defaults.ts";
import { message as messageOfError } from "./log.ts";
import { isReference, readReference, type Values } from "./references.ts";
import type { Delivery, Lease } from "./store.ts";

/** BROKER_TYPES names the destination types this file serves; a destination of another type is not a broker. */
export const BROKER_TYPES = ["nats", "rabbitmq"] as const;

/**
 * BROKER_CLIENTS names the npm packages each broker type's client needs. They are optional peer
 * dependencies: an install that never publishes into a broker does not pull them in.
 */
export const BROKER_CLIENTS: Readonly<Record<(typeof BROKER_TYPES)[number], readonly string[]>> = {
  nats: ["@nats-io/transport-node", "@nats-io/jetstream"],
  rabbitmq: ["amqplib"],
};

/**
 * missingClient loads a broker type's client packages (as its first publish or consume would) and returns
 * the one line to stop start-up with if one is not installed, naming the destination or source that needs
 * it and what to install; undefined if all are there.
 */
export async function missingClient(
  type: (typeof BROKER_TYPES)[number],
  name: string,
  role: "destination" | "source" = "destination",
  packages: readonly string[] = BROKER_CLIENTS[type],
): Promise<string | undefined> {
  for (const pkg of packages) {
    try {
      await import(pkg);
    } catch (error) {
      const code = (error as { code?: string }).code;
      if (code !== "ERR_MODULE_NOT_FOUND" && !/Cannot find (?:module|package)/.test(messageOfError(error))) throw error;
      return `${role} ${JSON.stringify(name)} ${role === "source" ? "consumes" : "publishes to"} ${type === "nats" ? "NATS JetStream" : "RabbitMQ"}, but ${pkg} is not installed: npm install ${packages.join(" ")}`;
    }
  }
  return undefined;
}

/** NatsDestination is a JetStream destination from the sources file, checked, its secrets read. */
export interface NatsDestination {
  type: "nats";
  name: string;
  /** Server URLs (nats:// or tls://), tried in turn. */
  servers: string[];
  /** Where each delivery goes, with {source} and {type} filled in; a route may give its own. */
  subject: string;
  /** The stream that must capture the subject; a publish any other stream (or none) would take fails. */
  stream?: string;
  user?: string;
  pass?: string;
  token?: string;
  /** Milliseconds to wait for the PubAck (and to connect). */
  timeoutMs: number;
}

/** RabbitDestination is a RabbitMQ destination from the sources file, checked, its secrets read. */
export interface RabbitDestination {
  type: "rabbitmq";
  name: string;
  /** amqp:// or amqps://, with its credentials. */
  url: string;
  /** The exchange; "" is the default exchange, where the routing key is a queue's name. */
  exchange: string;
  /** The routing key, with {source} and {type} filled in; a route may give its own. */
  routingKey: string;
  /** Refuse (retry) a message that no queue takes, rather than let the exchange drop it after confirming. */
  mandatory: boolean;
  /** Milliseconds to wait for the publisher confirm (and to connect). */
  timeoutMs: number;
}

/** BrokerDestination is either broker's destination. */
export type BrokerDestination = NatsDestination | RabbitDestination;

/** BrokerMessage is what a publish sends: the delivery's raw body and what the consumer needs to know of it. */
export interface BrokerMessage {
  source: string;
  id: string;
  /** The raw body, byte for byte as it was received. */
  body: Uint8Array;
  contentType: string | null;
  eventType: string | null;
  /** Which try this is, from 1. */
  attempt: number;
  /** Times a person replayed the delivery; each replay is a new message to the broker (see messageId). */
  replays: number;
  /** The order key, for an ordered delivery ([ordering](docs/ordering.md)). */
  orderKey: string | null;
  /** Set when handed over stale: the ID of a newer delivery of its order key that was already handled. */
  newerId: string | null;
  /** The W3C traceparent to carry on (job.traceparent), if any. */
  traceparent?: string | null;
  /** The route's subject (NATS) or routing key (RabbitMQ) template, in place of the destination's. */
  to?: string;
  /** Headers a transform (transform.ts) adds (a string) or removes (null), after the inbox's own. */
  headers?: Record<string, string | null>;
}

/** PublishResult is how a publish ended: done once the broker has it, else retry later or give up. */
export type PublishResult =
  | { kind: "done" }
  | { kind: "retry"; error: string; afterMs?: number }
  | { kind: "failed"; error: string };

/** Broker publishes to one destination, over a connection it opens when first needed and reopens when lost. */
export interface Broker {
  readonly destination: BrokerDestination;
  /** publish sends one message and waits for the broker's acknowledgement; it never throws. */
  publish(message: BrokerMessage, signal?: AbortSignal): Promise<PublishResult>;
  /** close lets go of the connection; a later publish opens a new one. */
  close(): Promise<void>;
}

/** messageOf builds the message of a claimed delivery: pass job.delivery and job.traceparent. */
export function messageOf(
  delivery: Pick<
    Delivery,
    "source" | "id" | "body" | "contentType" | "eventType" | "replays" | "orderKey" | "newerId" | "attempts"
  >,
  traceparent?: string | null,
  to?: string,
): BrokerMessage {
  return {
    source: delivery.source,
    id: delivery.id,
    body: delivery.body,
    contentType: delivery.contentType,
    eventType: delivery.eventType,
    attempt: delivery.attempts,
    replays: delivery.replays,
    orderKey: delivery.orderKey,
    newerId: delivery.newerId,
    traceparent: traceparent ?? null,
    ...(to === undefined ? {} : { to }),
  };
}

/**
 * messageId is the key a broker deduplicates on (Nats-Msg-Id) and a consumer may (AMQP message_id): the
 * destination, the source and the delivery's ID, each percent-encoded so that no ":" inside one is taken
 * for a separator. The destination is part of it because two destinations may feed one stream, where a
 * shared ID would make the second a duplicate of the first and drop it. A replay adds its number, so that
 * a person's replay reaches the broker again instead of being dropped as a duplicate of the first send.
 */
export function messageId(destination: string, m: Pick<BrokerMessage, "source" | "id" | "replays">): string {
  const key = [destination, m.source, m.id].map(encodeURIComponent).join(":");
  return m.replays > 0 ? `${key}:replay-${m.replays}` : key;
}

// Settings every destination takes, which routes.ts reads (in flight, rate limit, breaker, transform); not brokers.ts's own.
const SHARED_KEYS = ["maxInFlight", "rate", "burst", "breaker", "transform", "transformTimeout"];
const NATS_KEYS = ["type", "url", "subject", "stream", "user", "pass", "token", "timeoutMs", ...SHARED_KEYS];
const RABBIT_KEYS = ["type", "url", "exchange", "routingKey", "mandatory", "timeoutMs", ...SHARED_KEYS];

/**
 * parseBrokerDestination checks a broker destination's settings from the sources file and reads its
 * references (`env:NAME`, `secret:NAME`) from env. It throws a TypeError of one line that starts with where (the place that
 * names the destination, as routes.ts's brokerCheck gives it) and says the mistake, never a secret's value.
 * With resolve false it checks the settings' shape only, reading nothing from env (the receiver's check:
 * the secrets are the worker's).
 */
export function parseBrokerDestination(
  name: string,
  settings: unknown,
  where = `destination ${JSON.stringify(name)}`,
  env: Values = {},
  resolve = true,
): BrokerDestination {
  // Typed where it is declared, so that TypeScript narrows past each call to it.
  const fail: (mistake: string) => never = (mistake) => {
    throw new TypeError(`${where}: ${mistake}`);
  };
  if (settings === null || typeof settings !== "object" || Array.isArray(settings))
    fail(`expected an object with type, url and more, got ${kindOf(settings)}`);
  const s = settings as Record<string, unknown>;
  const type = s.type;
  if (type !== "nats" && type !== "rabbitmq")
    fail(`expected type to be one of ${BROKER_TYPES.join(", ")}, got ${JSON.stringify(type) ?? "(none)"}`);
  const allowed = type === "nats" ? NATS_KEYS : RABBIT_KEYS;
  const unknown = Object.keys(s).filter((k) => !allowed.includes(k));
  if (unknown.length > 0)
    fail(
      `unknown setting ${unknown.map((k) => JSON.stringify(k)).join(", ")}; a ${type} destination takes ${allowed.join(", ")}`,
    );

  // A value that may be written as env:NAME. Only its name is ever said back, never what it holds.
  const read = (key: string, secret: boolean): string | undefined => {
    const v = s[key];
    if (v === undefined) return undefined;
    if (typeof v !== "string")
      return fail(`expected ${key} to be a string${secret ? ' (or "env:NAME", "secret:NAME")' : ""}, got ${kindOf(v)}`);
    if (!isReference(v)) {
      if (v === "") fail(`${key} is empty`);
      return v;
    }
    const value = readReference(v, env, `${where}: ${key}`, resolve);
    return resolve ? value : UNRESOLVED;
  };
  const timeoutMs = s.timeoutMs ?? DEFAULTS.brokerTimeoutMs;
  if (
    typeof timeoutMs !== "number" ||
    !Number.isInteger(timeoutMs) ||
    timeoutMs < 1 ||
    timeoutMs > DEFAULTS.maxBrokerTimeoutMs
  )
    fail(
      `expected timeoutMs to be a whole number of ms from 1 to ${DEFAULTS.maxBrokerTimeoutMs}, got ${JSON.stringify(timeoutMs)}`,
    );

  if (type === "nats") {
    const url = read("url", true) ?? DEFAULTS.natsUrl;
    const servers = url.split(",").map((u) => u.trim());
    for (const server of url === UNRESOLVED ? [] : servers) {
      // The URL may hold a user and password: say which part is wrong, never the URL itself.
      let parsed: URL | undefined;
      try {
        parsed = new URL(server);
      } catch {
        fail("expected url to be nats://host:port (several may be given, separated by commas); it is not a URL");
      }
      if (!["nats:", "tls:"].includes(parsed!.protocol)) fail("expected url to start with nats:// or tls://");
    }
    const subject = read("subject", false) ?? fail('missing subject, such as "webhooks.{source}.{type}"');
    checkTarget({ type: "nats" }, subject, where);
    const stream = read("stream", false);
    if (stream !== undefined && !/^[^\s.*>\\/]+$/.test(stream))
      fail(
        `expected stream to be a stream's name (no spaces, ".", "*", ">", "/" or "\\"), got ${JSON.stringify(stream)}`,
      );
    const user = read("user", true);
    const pass = read("pass", true);
    const token = read("token", true);
    if ((user === undefined) !== (pass === undefined)) fail("expected user and pass together, or neither");
    if (token !== undefined && user !== undefined) fail("expected a token or a user and pass, not both");
    return {
      type,
      name,
      servers,
      subject,
      timeoutMs: timeoutMs as number,
      ...(stream === undefined ? {} : { stream }),
      ...(user === undefined ? {} : { user, pass: pass! }),
      ...(token === undefined ? {} : { token }),
    };
  }

  const url = read("url", true) ?? DEFAULTS.rabbitmqUrl;
  if (url !== UNRESOLVED) {
    let parsed: URL | undefined;
    try {
      parsed = new URL(url);
    } catch {
      fail("expected url to be amqp://user:password@host:port/vhost; it is not a URL");
    }
    if (!["amqp:", "amqps:"].includes(parsed!.protocol)) fail("expected url to start with amqp:// or amqps://");
  }
  const exchange = s.exchange ?? "";
  if (typeof exchange !== "string")
    fail(`expected exchange to be a string ("" for the default exchange), got ${kindOf(exchange)}`);
  const routingKey =
    read("routingKey", false) ??
    fail(
      'missing routingKey: a queue\'s name on the default exchange, or a pattern such as "webhooks.{source}.{type}"',
    );
  checkTarget({ type: "rabbitmq" }, routingKey, where);
  const mandatory = s.mandatory ?? true;
  if (typeof mandatory !== "boolean") fail(`expected mandatory to be true or false, got ${JSON.stringify(mandatory)}`);
  return {
    type,
    name,
    url,
    exchange: exchange as string,
    routingKey,
    mandatory: mandatory as boolean,
    timeoutMs: timeoutMs as number,
  };
}

// What a reference stands for when the settings' shape alone is checked (resolve false).
const UNRESOLVED = "(read from the environment by the worker)";

const PLACEHOLDER = /\{([^{}]*)\}/g;

/**
 * checkTarget checks a subject (NATS) or routing key (RabbitMQ) template, the destination's or a route's
 * own: only {source} and {type} may be filled in, and a NATS subject must be one a publish can use.
 */
export function checkTarget(destination: Pick<BrokerDestination, "type">, template: string, where: string): void {
  const what = destination.type === "nats" ? "subject" : "routingKey";
  for (const [, name] of template.matchAll(PLACEHOLDER)) {
    if (name !== "source" && name !== "type")
      throw new TypeError(
        `${where}: ${what} ${JSON.stringify(template)} names {${name}}; expected only {source} and {type}`,
      );
  }
  const bare = template.replace(PLACEHOLDER, "x");
  if (/[{}]/.test(bare)) throw new TypeError(`${where}: ${what} ${JSON.stringify(template)} has an unmatched brace`);
  if (destination.type === "nats") {
    if (!/^[^\s.*>]+(\.[^\s.*>]+)*$/.test(bare)) {
      throw new TypeError(
        `${where}: subject ${JSON.stringify(template)} is not one a message can be published to: expected tokens separated by single dots, with no spaces, "*" or ">"`,
      );
    }
  } else if (Buffer.byteLength(bare) > 255) {
    throw new TypeError(`${where}: routingKey ${JSON.stringify(template)} is longer than AMQP's 255 bytes`);
  }
}

// targetOf fills a template in for one message. In a NATS subject an event type's dots stay token breaks
// (invoice.paid becomes two tokens, so a consumer can subscribe to webhooks.stripe.invoice.>), while what
// a subject cannot hold becomes "_"; a delivery with no event type gets "_" too.
function targetOf(destination: BrokerDestination, m: BrokerMessage): string {
  const template = m.to ?? (destination.type === "nats" ? destination.subject : destination.routingKey);
  const nats = destination.type === "nats";
  const token = (text: string) =>
    nats
      ? text
          .split(".")
          .map((t) => t.replace(/[\s*>]/g, "_") || "_")
          .join(".")
      : text;
  return template.replace(PLACEHOLDER, (_, name: string) =>
    name === "source" ? token(m.source) : m.eventType ? token(m.eventType) : "_",
  );
}

/**
 * HEADERS names what each message carries besides its body, the same on both brokers and as an HTTP
 * forward's headers (forward.ts), so a consumer reads one set of names whichever way a delivery came.
 */
export const HEADERS = {
  source: "inbox-source",
  id: "inbox-delivery-id",
  eventType: "inbox-event-type",
  attempt: "inbox-attempt",
  orderKey: "inbox-order-key",
  stale: "inbox-stale",
  newerId: "inbox-newer-id",
  traceparent: "traceparent",
} as const;

// headerValues lists a message's headers; values the broker's wire format cannot hold (a line break in an
// ID) are percent-encoded, which a plain ID never needs.
function headerValues(m: BrokerMessage): [string, string][] {
  const safe = (v: string) => (/^[\x20-\x7e]*$/.test(v) ? v : encodeURIComponent(v));
  const out: [string, string][] = [
    [HEADERS.source, safe(m.source)],
    [HEADERS.id, safe(m.id)],
    [HEADERS.attempt, String(m.attempt)],
  ];
  if (m.eventType !== null) out.push([HEADERS.eventType, safe(m.eventType)]);
  if (m.orderKey !== null)
    out.push([HEADERS.orderKey, safe(m.orderKey)], [HEADERS.stale, m.newerId !== null ? "true" : "false"]);
  if (m.newerId !== null) out.push([HEADERS.newerId, safe(m.newerId)]);
  if (m.traceparent) out.push([HEADERS.traceparent, safe(m.traceparent)]);
  if (m.headers) {
    const changes = m.headers;
    return [
      ...out.filter(([k]) => !(k in changes)),
      ...Object.entries(changes)
        .filter((e): e is [string, string] => e[1] !== null)
        .map(([k, v]): [string, string] => [k, safe(v)]),
    ];
  }
  return out;
}

/**
 * brokerSender is a broker destination as the forwarder (forwarder.ts) runs it: its Sender, which sends a
 * leased delivery, its traceparent carried on, and answers with the same outcomes an HTTP forward has.
 */
export function brokerSender(destination: BrokerDestination): {
  send(lease: Lease, options: { signal: AbortSignal; headers?: Record<string, string | null> }): Promise<PublishResult>;
  close(): Promise<void>;
} {
  const broker = openBroker(destination);
  return {
    send: (lease, { signal, headers }) =>
      broker.publish({ ...messageOf(lease, lease.traceparent), ...(headers ? { headers } : {}) }, signal),
    close: () => broker.close(),
  };
}

/** openBroker returns the publisher of one destination; it connects on the first publish, not before. */
export function openBroker(destination: BrokerDestination): Broker {
  return destination.type === "nats" ? natsBroker(destination) : rabbitBroker(destination);
}

const retry = (error: string, afterMs?: number): PublishResult => ({
  kind: "retry",
  error,
  ...(afterMs === undefined ? {} : { afterMs }),
});

// abortable settles with the promise, or with a retry as soon as the signal aborts (the lease was lost, or
// the worker is stopping). A publish that lands anyway is no harm: the next try is a duplicate of it.
function abortable<T>(work: Promise<T>, signal: AbortSignal | undefined): Promise<T | PublishResult> {
  if (!signal) return work;
  if (signal.aborted) return Promise.resolve(retry(`not published: ${messageOfError(signal.reason)}`));
  return new Promise((resolve, reject) => {
    const onAbort = () => resolve(retry(`gave up waiting for the broker: ${messageOfError(signal.reason)}`));
    signal.addEventListener("abort", onAbort, { once: true });
    work.then(resolve, reject).finally(() => signal.removeEventListener("abort", onAbort));
  });
}

function natsBroker(d: NatsDestination): Broker {
  type Conn = { nc: NatsConnection; js: JetStreamClient; headers: () => MsgHdrs; tooBig: (e: unknown) => boolean };
  let conn: Promise<Conn> | undefined;
  const open = (): Promise<Conn> => {
    conn ??= (async () => {
      const { connect, headers, errors } = await import("@nats-io/transport-node");
      const { jetstream, JetStreamApiError } = await import("@nats-io/jetstream");
      // The client reconnects on its own, for ever, holding publishes meanwhile; each still times out.
      const nc = await connect({
        servers: d.servers,
        name: `webhook-inbox ${d.name}`,
        timeout: d.timeoutMs,
        reconnect: true,
        maxReconnectAttempts: -1,
        ...(d.user === undefined ? {} : { user: d.user, pass: d.pass }),
        ...(d.token === undefined ? {} : { token: d.token }),
      });
      // Closed for good (close() or a fatal error): the next publish connects again.
      void nc.closed().then(() => {
        if (conn === opened) conn = undefined;
      });
      const tooBig = (e: unknown) =>
        (e instanceof errors.InvalidArgumentError && /max_payload/.test(e.message)) ||
        // 10054: the stream's own max_msg_size.
        (e instanceof JetStreamApiError && e.code === 10054);
      return { nc, js: jetstream(nc, { timeout: d.timeoutMs }), headers, tooBig };
    })();
    const opened = conn;
    conn.catch(() => {
      if (conn === opened) conn = undefined;
    });
    return conn;
  };
  return {
    destination: d,
    async publish(m, signal) {
      if (signal?.aborted) return retry(`not published: ${messageOfError(signal.reason)}`);
      const subject = targetOf(d, m);
      let c: Conn;
      try {
        c = await open();
      } catch (error) {
        return retry(`nats ${d.name}: cannot connect: ${messageOfError(error)}`);
      }
      const h = c.headers();
      for (const [k, v] of headerValues(m)) h.set(k, v);
      if (m.contentType !== null) h.set("Content-Type", m.contentType);
      try {
        const ack = await abortable(
          c.js.publish(subject, m.body, {
            msgID: messageId(d.name, m),
            headers: h,
            timeout: d.timeoutMs,
            ...(d.stream === undefined ? {} : { expect: { streamName: d.stream } }),
          }),
          signal,
        );
        // A PubAck marked duplicate is done too: the stream took this message before, within its window.
        return "kind" in ack ? ack : { kind: "done" };
      } catch (error) {
        const why = `nats ${d.name}: publish to ${subject}: ${natsReason(error)}`;
        return c.tooBig(error) ? { kind: "failed", error: why } : retry(why);
      }
    },
    async close() {
      const c = await conn?.catch(() => undefined);
      conn = undefined;
      if (c && !c.nc.isClosed()) await c.nc.close();
    },
  };
}

// natsReason says why a publish failed in words an operator can act on.
function natsReason(error: unknown): string {
  const text = messageOfError(error);
  // The client reports no responders as JetStream not enabled; the usual cause is a subject no stream captures.
  if (/no responders|jetstream is not enabled/i.test(text))
    return "no stream captures this subject (no responders; or JetStream is off)";
  if (/timeout/i.test(text)) return "no PubAck in time (timeout)";
  return text;
}

function rabbitBroker(d: RabbitDestination): Broker {
  type Conn = { model: ChannelModel; channel: ConfirmChannel; returned: Set<string>; why: { error?: string } };
  let conn: Promise<Conn> | undefined;
  const open = (): Promise<Conn> => {
    conn ??= (async () => {
      const amqp = await import("amqplib");
      const model = await amqp.connect(d.url, {
        timeout: d.timeoutMs,
        clientProperties: { connection_name: `webhook-inbox ${d.name}` },
      });
      const why: Conn["why"] = {};
      const returned = new Set<string>();
      let channel: ConfirmChannel;
      try {
        channel = await model.createConfirmChannel();
      } catch (error) {
        await model.close().catch(() => {});
        throw error;
      }
      // A closed channel or connection (a missing exchange closes the channel; a restart the connection)
      // ends this one: the publishes waiting fail with its reason, and the next opens a new one.
      const lost = (error?: Error) => {
        if (error) why.error ??= messageOfError(error);
        if (conn === opened) conn = undefined;
        void model.close().catch(() => {});
      };
      model.on("error", lost).on("close", lost);
      channel.on("error", lost).on("close", lost);
      // With mandatory, RabbitMQ returns a message no queue takes before it confirms it: remember which.
      channel.on("return", (msg: { properties: { messageId?: string } }) => {
        if (msg.properties.messageId !== undefined) returned.add(msg.properties.messageId);
      });
      return { model, channel, returned, why };
    })();
    const opened = conn;
    conn.catch(() => {
      if (conn === opened) conn = undefined;
    });
    return conn;
  };
  return {
    destination: d,
    async publish(m, signal) {
      if (signal?.aborted) return retry(`not published: ${messageOfError(signal.reason)}`);
      const routingKey = targetOf(d, m);
      if (Buffer.byteLength(routingKey) > 255)
        return { kind: "failed", error: `rabbitmq ${d.name}: routing key longer than 255 bytes` };
      let c: Conn;
      try {
        c = await open();
      } catch (error) {
        return retry(`rabbitmq ${d.name}: cannot connect: ${messageOfError(error)}`);
      }
      const id = messageId(d.name, m);
      const headers: Record<string, string | number> = {};
      for (const [k, v] of headerValues(m)) headers[k] = k === HEADERS.attempt ? m.attempt : v;
      const properties: AmqpOptions.Publish = {
        persistent: true,
        messageId: id,
        mandatory: d.mandatory,
        appId: "webhook-inbox",
        headers,
        ...(m.contentType === null ? {} : { contentType: m.contentType }),
        ...(m.eventType === null ? {} : { type: m.eventType }),
      };
      const body = Buffer.isBuffer(m.body) ? m.body : Buffer.from(m.body.buffer, m.body.byteOffset, m.body.byteLength);
      const where = `rabbitmq ${d.name}: publish to ${d.exchange === "" ? "the default exchange" : `exchange ${d.exchange}`} with routing key ${routingKey}`;
      let timer: NodeJS.Timeout | undefined;
      try {
        const confirmed = new Promise<void>((resolve, reject) => {
          c.channel.publish(d.exchange, routingKey, body, properties, (error: unknown) =>
            error ? reject(error) : resolve(),
          );
          timer = setTimeout(() => reject(new Error(`no confirm within ${d.timeoutMs} ms`)), d.timeoutMs);
        });
        const settled = await abortable(confirmed, signal);
        if (settled !== undefined) return settled;
      } catch (error) {
        // A nack, a closed channel (say why it closed), or no confirm in time: the broker may or may not have it.
        const reason = c.why.error ?? messageOfError(error);
        return tooBigForAmqp(error, reason)
          ? { kind: "failed", error: `${where}: ${reason}` }
          : retry(`${where}: ${reason}`);
      } finally {
        clearTimeout(timer);
      }
      if (c.returned.delete(id)) return retry(`${where}: no queue is bound to take it (returned unroutable)`);
      return { kind: "done" };
    },
    async close() {
      const c = await conn?.catch(() => undefined);
      conn = undefined;
      if (c)
        await c.model.close().catch((error: unknown) => {
          // Already closed by the broker or by a lost connection: nothing is left to let go of.
          if (!/closed/i.test(messageOfError(error))) throw error;
        });
    },
  };
}

// tooBigForAmqp tells the failures that retrying cannot cure: headers past amqplib's 64 KiB table, a
// message past the broker's max_message_size.
function tooBigForAmqp(error: unknown, reason: string): boolean {
  return error instanceof RangeError || /larger than configured max size|message size/i.test(reason);
}

function kindOf(value: unknown): string {
  return value === null
    ? "null"
    : Array.isArray(value)
      ? "a list"
      : typeof value === "object"
        ? "an object"
        : JSON.stringify(value);
}

// consume.ts: brokers as sources. A durable JetStream consumer or a RabbitMQ queue whose messages become
// deliveries of a source, stored through the same routes as a webhook and acknowledged to the broker only
// once the store's promise (the durable commit) has resolved. consumer.ts runs one Consumer per source;
// docs/brokers.md says which identity each broker's message is stored under. Not run on its own:
//   const c = new Consumer({ inbox, source, log: console.error }); c.start(); … await c.stop();

import type { Channel, ConsumeMessage } from "amqplib";
import type { JsMsg } from "@nats-io/jetstream";
import { parseBrokerDestination } from "./brokers.ts";
import { DEFAULTS } from "./defaults.ts";
import { label, message } from "./log.ts";
import { type OrderRule, orderOfRequest } from "./order.ts";
import type { Values } from "./references.ts";
import { filterInput } from "./routing/filter.ts";
import { chooseRoutes, type Route } from "./routing/routes.ts";
import type { Headers, Inbox, Stored } from "./store.ts";

/** JetStreamSource is a source that consumes a JetStream stream through a durable pull consumer. */
export interface JetStreamSource {
  type: "nats";
  servers: string[];
  user?: string;
  pass?: string;
  token?: string;
  timeoutMs: number;
  /** The stream to read. */
  stream: string;
  /** The durable consumer's name, created if it is not there (explicit acks). */
  consumer: string;
  /** Only the stream's subjects that match this (a NATS subject filter, wildcards allowed). */
  filter?: string;
  /** Messages delivered and not yet acknowledged, at most: the consumer's max_ack_pending. */
  maxAckPending: number;
  /** The consumer's ack_wait when it is created: how long before an unacknowledged message is delivered again. */
  ackWaitMs: number;
  /** A top-level field of a JSON body that holds the event type, in place of the subject. */
  eventTypeField?: string;
}

/** RabbitSource is a source that consumes one RabbitMQ queue. */
export interface RabbitSource {
  type: "rabbitmq";
  url: string;
  timeoutMs: number;
  /** The queue to consume; it must exist (its DLX, if any, takes refused messages). */
  queue: string;
  /** Messages delivered and not yet acknowledged, at most: the channel's prefetch. */
  prefetch: number;
  /** A header that holds the delivery ID where the message-id property is not set. */
  idHeader?: string;
  /** A top-level field of a JSON body that holds the delivery ID, after the property and idHeader. */
  idField?: string;
  /** A top-level field of a JSON body that holds the event type, in place of the routing key. */
  eventTypeField?: string;
}

/** BrokerSource is either broker's source settings, checked, their secrets read. */
export type BrokerSource = JetStreamSource | RabbitSource;

const CONNECTION = ["type", "url", "timeoutMs"];
const NATS_SOURCE_KEYS = [
  ...CONNECTION,
  "user",
  "pass",
  "token",
  "stream",
  "consumer",
  "filter",
  "maxAckPending",
  "ackWaitMs",
  "eventTypeField",
];
const RABBIT_SOURCE_KEYS = [...CONNECTION, "queue", "prefetch", "idHeader", "idField", "eventTypeField"];

/**
 * parseBrokerSource checks a source's "broker" settings and reads its references (`env:NAME`, `secret:NAME`) from env. The
 * connection settings (url, credentials, timeoutMs) are checked by the destinations' own parser, so both
 * sides take them alike; it throws a TypeError of one line starting with where, never with a secret.
 */
export function parseBrokerSource(settings: unknown, where: string, env: Values, resolve = true): BrokerSource {
  const fail: (mistake: string) => never = (mistake) => {
    throw new TypeError(`${where}: broker: ${mistake}`);
  };
  if (settings === null || typeof settings !== "object" || Array.isArray(settings))
    fail('expected an object such as {"type": "nats", "stream": "ORDERS", "consumer": "inbox"}');
  const s = settings as Record<string, unknown>;
  if (s.type !== "nats" && s.type !== "rabbitmq")
    fail(`expected type to be nats or rabbitmq, got ${JSON.stringify(s.type) ?? "(none)"}`);
  const allowed = s.type === "nats" ? NATS_SOURCE_KEYS : RABBIT_SOURCE_KEYS;
  const unknown = Object.keys(s).filter((k) => !allowed.includes(k));
  if (unknown.length > 0)
    fail(
      `unknown setting ${unknown.map((k) => JSON.stringify(k)).join(", ")}; a ${s.type} source takes ${allowed.join(", ")}`,
    );
  const name = (key: string, pattern: RegExp, what: string, required: boolean): string | undefined => {
    const v = s[key];
    if (v === undefined) return required ? fail(`missing ${key}, ${what}`) : undefined;
    if (typeof v !== "string" || !pattern.test(v)) fail(`expected ${key} to be ${what}, got ${JSON.stringify(v)}`);
    return v as string;
  };
  const whole = (key: string, fallback: number): number => {
    const v = s[key] ?? fallback;
    if (typeof v !== "number" || !Number.isInteger(v) || v < 1 || v > 65_535)
      fail(`expected ${key} to be a whole number from 1 to 65535, got ${JSON.stringify(v)}`);
    return v as number;
  };
  const ms = (key: string, fallback: number): number => {
    const v = s[key] ?? fallback;
    if (typeof v !== "number" || !Number.isInteger(v) || v < 1_000 || v > DEFAULTS.maxAckWaitMs)
      fail(
        `expected ${key} to be a whole number of ms from 1000 to ${DEFAULTS.maxAckWaitMs}, got ${JSON.stringify(v)}`,
      );
    return v as number;
  };
  const field = name("eventTypeField", /^[^\s]+$/, "a top-level field of the JSON body", false);
  const connection = Object.fromEntries(
    Object.entries(s).filter(([k]) => [...CONNECTION, "user", "pass", "token"].includes(k)),
  );
  if (s.type === "nats") {
    const d = parseBrokerDestination("", { ...connection, subject: "x" }, `${where}: broker`, env, resolve);
    if (d.type !== "nats") throw new Error("unreachable");
    return {
      type: "nats",
      servers: d.servers,
      timeoutMs: d.timeoutMs,
      ...(d.user === undefined ? {} : { user: d.user, pass: d.pass! }),
      ...(d.token === undefined ? {} : { token: d.token }),
      stream: name("stream", /^[^\s.*>\\/]+$/, "a stream's name", true)!,
      consumer: name("consumer", /^[^\s.*>\\/]+$/, "a durable consumer's name", true)!,
      maxAckPending: whole("maxAckPending", DEFAULTS.consumePrefetch),
      ackWaitMs: ms("ackWaitMs", DEFAULTS.consumeAckWaitMs),
      ...optional("filter", name("filter", /^[^\s]+$/, "a subject filter such as orders.>", false)),
      ...optional("eventTypeField", field),
    };
  }
  const d = parseBrokerDestination("", { ...connection, routingKey: "x" }, `${where}: broker`, env, resolve);
  if (d.type !== "rabbitmq") throw new Error("unreachable");
  return {
    type: "rabbitmq",
    url: d.url,
    timeoutMs: d.timeoutMs,
    queue: name("queue", /^.{1,255}$/s, "a queue's name", true)!,
    prefetch: whole("prefetch", DEFAULTS.consumePrefetch),
    ...optional("idHeader", name("idHeader", /^[^\s]+$/, "a header's name", false)),
    ...optional("idField", name("idField", /^[^\s]+$/, "a top-level field of the JSON body", false)),
    ...optional("eventTypeField", field),
  };
}

function optional<K extends string>(key: K, value: string | undefined): Partial<Record<K, string>> {
  return value === undefined ? {} : ({ [key]: value } as Record<K, string>);
}

/** ConsumedSource is what a Consumer needs of a source: its name, routes and ordering, and its broker. */
export interface ConsumedSource {
  name: string;
  routes?: Route[];
  order?: OrderRule;
  broker: BrokerSource;
}

/** ConsumerCounts are a consumer's tallies since it started, as the metrics and the status line show them. */
export interface ConsumerCounts {
  consumed: number;
  stored: number;
  duplicate: number;
  refused: number;
  acked: number;
  redelivered: number;
  /** Store failures: the message was not acknowledged, and the broker keeps it. */
  unavailable: number;
  /** Messages the broker still holds for this consumer, as it last said. */
  lag: number;
}

/** ConsumerOptions configures a Consumer. */
export interface ConsumerOptions {
  inbox: Inbox;
  source: ConsumedSource;
  /** Where log lines go. @default console.error */
  log?: (line: string) => void;
  /** @default DEFAULTS.maxBodyBytes */
  maxBodyBytes?: number;
  /** @default DEFAULTS.maxIdLength */
  maxIdLength?: number;
  /** How long purge keeps a tombstone, to check the stream's max_age against. @default DEFAULTS.forgetAfterMs */
  forgetAfterMs?: number;
  /**
   * Acknowledge each message as soon as it arrives, before its store: the mistake this file exists to
   * avoid, for the control of test/consume-crash.test.ts only. @default false
   */
  ackBeforeStore?: boolean;
}

// A message as both brokers' loops hand it over: what to store, or why not, and how to settle it.
interface Arrived {
  id?: string;
  refusal?: string;
  body: Buffer;
  eventType: string | null;
  contentType: string | null;
  headers: Headers;
  redelivered: boolean;
}

/** Refused is a message that cannot be stored, whatever is tried: it is terminated or dead-lettered. */
class Refused extends Error {}

/**
 * Consumer consumes one broker source into the inbox. Messages are stored as they arrive, many in one
 * group commit; each is acknowledged once its store has resolved, the run of them that a commit settled
 * in one go. A store that fails leaves the message unacknowledged, so the broker delivers it again.
 */
export class Consumer {
  readonly counts: ConsumerCounts = {
    consumed: 0,
    stored: 0,
    duplicate: 0,
    refused: 0,
    acked: 0,
    redelivered: 0,
    unavailable: 0,
    lag: 0,
  };
  readonly inbox: Inbox;
  readonly source: ConsumedSource;
  readonly log: (line: string) => void;
  readonly maxBody: number;
  readonly maxId: number;
  readonly early: boolean;
  readonly forgetAfterMs: number;
  stopping = false;
  running?: Promise<void>;
  // halt stops the deliveries of the connection at hand; wake ends the wait between two connections.
  halt?: () => Promise<unknown>;
  wake?: () => void;

  constructor(options: ConsumerOptions) {
    this.inbox = options.inbox;
    this.source = options.source;
    this.log = options.log ?? ((line) => console.error(line));
    this.maxBody = options.maxBodyBytes ?? DEFAULTS.maxBodyBytes;
    this.maxId = options.maxIdLength ?? DEFAULTS.maxIdLength;
    this.early = options.ackBeforeStore ?? false;
    this.forgetAfterMs = options.forgetAfterMs ?? DEFAULTS.forgetAfterMs;
  }

  /** start connects and consumes until stop(); a lost connection is opened again after a pause. */
  start(): void {
    this.running ??= this.loop();
  }

  /** stop stops consuming, waits for the stores in flight and their acks, and closes the connection. */
  async stop(): Promise<void> {
    this.stopping = true;
    // First no more deliveries; the loop then waits for the stores in flight, acks them, and closes.
    await this.halt?.().catch(() => {});
    this.wake?.();
    await this.running;
  }

  async loop(): Promise<void> {
    const b = this.source.broker;
    while (!this.stopping) {
      try {
        await (b.type === "nats" ? this.jetstream(b) : this.rabbit(b));
      } catch (error) {
        if (this.stopping) break;
        this.log(`consume ${this.source.name}: ${message(error)}; connecting again in 1 s`);
      }
      if (!this.stopping)
        await new Promise<void>((r) => {
          this.wake = r;
          setTimeout(r, DEFAULTS.consumeReconnectMs);
        });
    }
  }

  // store puts one arrived message through the source's routes into the inbox, as the receiver's handler
  // does a request; it resolves once the commit is durable.
  async store(m: Arrived): Promise<Stored> {
    if (m.refusal !== undefined) throw new Refused(m.refusal);
    const id = m.id!;
    if (m.body.length > this.maxBody)
      throw new Refused(`body of ${m.body.length} bytes is over the ${this.maxBody}-byte limit`);
    if (id.length > this.maxId) throw new Refused(`delivery id longer than ${this.maxId} characters`);
    const s = this.source;
    const chosen = s.routes
      ? chooseRoutes(
          s.routes,
          m.eventType,
          s.routes.some((r) => r.filter !== undefined)
            ? filterInput({ source: s.name, eventType: m.eventType, body: m.body, headers: m.headers, url: "/" })
            : undefined,
        )
      : undefined;
    return this.inbox.store({
      source: s.name,
      id,
      body: m.body,
      contentType: m.contentType,
      eventType: m.eventType,
      ...orderOfRequest(s.order, m.headers, m.body),
      ...(chosen ? { destinations: chosen.destinations } : {}),
      ...(chosen?.keepHeaders ? { headers: m.headers } : {}),
    });
  }

  // settle stores a message and says how it ended: "ack" once stored (or a duplicate), "refuse" for a
  // message no try can store, "keep" when the store failed and the broker must deliver it again.
  async settle(m: Arrived): Promise<"ack" | "refuse" | "keep"> {
    this.counts.consumed++;
    if (m.redelivered) this.counts.redelivered++;
    try {
      const outcome = await this.store(m);
      if (outcome === "stored") this.counts.stored++;
      else this.counts.duplicate++;
      return "ack";
    } catch (error) {
      if (error instanceof Refused) {
        this.counts.refused++;
        this.log(
          `refused a message of ${this.source.name}${m.id ? ` (${label({ source: this.source.name, id: m.id })})` : ""}: ${error.message}`,
        );
        return "refuse";
      }
      this.counts.unavailable++;
      this.log(`could not store a message of ${this.source.name}, not acknowledged: ${message(error)}`);
      return "keep";
    }
  }

  async jetstream(b: JetStreamSource): Promise<void> {
    const { connect } = await import("@nats-io/transport-node");
    const { jetstream, jetstreamManager, AckPolicy, DeliverPolicy } = await import("@nats-io/jetstream");
    const nc = await connect({
      servers: b.servers,
      name: `webhook-inbox source ${this.source.name}`,
      timeout: b.timeoutMs,
      reconnect: true,
      maxReconnectAttempts: -1,
      ...(b.user === undefined ? {} : { user: b.user, pass: b.pass }),
      ...(b.token === undefined ? {} : { token: b.token }),
    });
    try {
      const jsm = await jetstreamManager(nc, { timeout: b.timeoutMs });
      // A message can come back for as long as the stream keeps it: the tombstones must outlive that.
      const maxAgeMs = (await jsm.streams.info(b.stream)).config.max_age / 1e6;
      if (maxAgeMs === 0 || maxAgeMs > this.forgetAfterMs)
        this.log(
          `consume ${this.source.name}: stream ${b.stream} keeps messages ${maxAgeMs === 0 ? "for ever" : `${Math.round(maxAgeMs / 86_400_000)} days`}, longer than purge keeps IDs (${Math.round(this.forgetAfterMs / 86_400_000)} days): set its max_age, or purge with a longer --forget-after, or a message redelivered after that is stored again`,
        );
      const info = await jsm.consumers.info(b.stream, b.consumer).catch(() => undefined);
      const ackWaitNs = b.ackWaitMs * 1e6;
      if (!info)
        await jsm.consumers.add(b.stream, {
          durable_name: b.consumer,
          ack_policy: AckPolicy.Explicit,
          deliver_policy: DeliverPolicy.All,
          ack_wait: ackWaitNs,
          max_ack_pending: b.maxAckPending,
          ...(b.filter === undefined ? {} : { filter_subject: b.filter }),
        });
      const ackWaitMs = (info?.config.ack_wait ?? ackWaitNs) / 1e6;
      const consumer = await jetstream(nc, { timeout: b.timeoutMs }).consumers.get(b.stream, b.consumer);
      const messages = await consumer.consume({ max_messages: b.maxAckPending });
      this.halt = () => messages.close();
      if (this.stopping) await messages.close();
      // Messages whose store is in flight: told the server they are still being worked on (AckProgress)
      // when a slow commit holds them for a third of the ack wait, so it does not deliver them again.
      const inFlight = new Map<JsMsg, number>();
      const progress = setInterval(
        () => {
          const old = performance.now() - ackWaitMs / 3;
          for (const [m, since] of inFlight) if (since < old) m.working();
        },
        Math.max(100, ackWaitMs / 6),
      );
      let chain: Promise<void> = Promise.resolve();
      try {
        for await (const m of messages) {
          if (this.stopping) break;
          this.counts.lag = m.info.pending;
          inFlight.set(m, performance.now());
          const arrived = this.ofJetStream(m, b);
          // The control's mistake: the ack has reached the server (a double ack) before the store begins.
          const settled = this.early
            ? m.ackAck().then(() => {
                this.counts.acked++;
                return this.settle(arrived);
              })
            : this.settle(arrived);
          // Acks go in arrival order, each run that one commit settled sent together in one write.
          chain = chain
            .then(async () => {
              const how = await settled;
              inFlight.delete(m);
              if (this.early) return;
              if (how === "ack") {
                m.ack();
                this.counts.acked++;
              } else if (how === "refuse")
                m.term(); // No reason: nats-server 2.9 ignores a +TERM that carries one.
              else m.nak(DEFAULTS.consumeReconnectMs);
            })
            .catch((error: unknown) => this.log(`consume ${this.source.name}: ${message(error)}`));
        }
      } finally {
        await chain;
        clearInterval(progress);
        await nc.flush().catch(() => {});
      }
    } finally {
      await nc.drain().catch(() => nc.close());
    }
  }

  private ofJetStream(m: JsMsg, b: JetStreamSource): Arrived {
    const headers: Headers = {};
    let msgId: string | undefined;
    let contentType: string | null = null;
    if (m.headers)
      for (const [k, v] of m.headers) {
        headers[k.toLowerCase()] = v;
        if (k.toLowerCase() === "nats-msg-id") msgId = v[0];
        if (k.toLowerCase() === "content-type") contentType = v[0] ?? null;
      }
    const body = Buffer.from(m.data);
    const typed = b.eventTypeField === undefined ? undefined : fieldOf(body, b.eventTypeField);
    return {
      id: msgId || `${m.info.stream}:${m.info.streamSequence}`,
      ...(typed?.refusal === undefined ? {} : { refusal: typed.refusal }),
      body,
      eventType: typed ? (typed.value ?? null) : m.subject,
      contentType,
      headers,
      redelivered: m.redelivered,
    };
  }

  async rabbit(b: RabbitSource): Promise<void> {
    const amqp = await import("amqplib");
    const model = await amqp.connect(b.url, { timeout: b.timeoutMs });
    // Once the connection is gone, so are its deliveries: the broker has put the unacknowledged back.
    let broken = false;
    const closed = new Promise<void>((resolve) => {
      model.on("close", () => {
        broken = true;
        resolve();
      });
      model.on("error", () => {});
    });
    const channel: Channel = await model.createChannel();
    channel.on("error", () => {});
    await channel.prefetch(b.prefetch);
    await channel.checkQueue(b.queue);
    const lag = setInterval(() => {
      channel.checkQueue(b.queue).then(
        (q) => (this.counts.lag = q.messageCount),
        () => {},
      );
    }, DEFAULTS.consumeLagEveryMs);
    // Acks go in delivery order: once a run of stored messages is settled, the last one acknowledges the
    // whole run (AMQP's multiple flag), one frame for what one commit stored.
    let chain: Promise<void> = Promise.resolve();
    let lastOk: ConsumeMessage | undefined;
    let scheduled = false;
    let run = 0;
    const flush = () => {
      scheduled = false;
      if (lastOk && !broken) {
        channel.ack(lastOk, true);
        this.counts.acked += run;
      }
      lastOk = undefined;
      run = 0;
    };
    const { consumerTag } = await channel.consume(b.queue, (m) => {
      if (m === null) return;
      const arrived = this.ofRabbit(m, b);
      // The control's mistake: the ack is written to the socket a turn before the store begins.
      const settled = this.early
        ? new Promise<void>((resolve) => {
            channel.ack(m);
            this.counts.acked++;
            setImmediate(resolve);
          }).then(() => this.settle(arrived))
        : this.settle(arrived);
      chain = chain
        .then(async () => {
          const how = await settled;
          if (this.early || broken) return;
          if (how === "ack") {
            lastOk = m;
            run++;
            if (!scheduled) {
              scheduled = true;
              queueMicrotask(flush);
            }
          } else if (how === "refuse") {
            flush();
            if (!broken) channel.nack(m, false, false);
          } else {
            // The store is down: drop the channel, so that the broker puts every unacknowledged message
            // back in the queue, and open a new one after a pause.
            flush();
            broken = true;
            void model.close().catch(() => {});
          }
        })
        .catch((error: unknown) => this.log(`consume ${this.source.name}: ${message(error)}`));
    });
    let halted!: () => void;
    const stopped = new Promise<void>((r) => (halted = r));
    this.halt = async () => {
      if (!broken) await channel.cancel(consumerTag);
      halted();
    };
    if (this.stopping) await this.halt();
    await Promise.race([closed, stopped]);
    clearInterval(lag);
    // Deliveries already on the wire when the cancel went out still arrive, and lengthen the chain.
    for (let seen = chain; ; seen = chain) {
      await seen;
      await new Promise((r) => setTimeout(r, 50));
      if (seen === chain) break;
    }
    // The acks of the last run go out before the connection closes.
    flush();
    await model.close().catch(() => {});
  }

  private ofRabbit(m: ConsumeMessage, b: RabbitSource): Arrived {
    const headers: Headers = {};
    for (const [k, v] of Object.entries(m.properties.headers ?? {}))
      if (v !== undefined && v !== null) headers[k.toLowerCase()] = [String(v)];
    const body = m.content;
    let id: string | undefined = m.properties.messageId || undefined;
    let refusal: string | undefined;
    if (id === undefined && b.idHeader !== undefined) id = headers[b.idHeader.toLowerCase()]?.[0] || undefined;
    if (id === undefined && b.idField !== undefined) {
      const f = fieldOf(body, b.idField);
      refusal = f.refusal;
      id = f.value;
    }
    if (id === undefined)
      refusal ??= `no delivery ID: no message-id property${b.idHeader ? `, no ${b.idHeader} header` : ""}${b.idField ? `, no ${b.idField} field in the body` : ""}`;
    const typed = b.eventTypeField === undefined ? undefined : fieldOf(body, b.eventTypeField);
    refusal ??= typed?.refusal;
    return {
      ...(id === undefined ? {} : { id }),
      ...(refusal === undefined ? {} : { refusal }),
      body,
      eventType: typed ? (typed.value ?? null) : m.fields.routingKey || null,
      contentType: m.properties.contentType ?? null,
      headers,
      redelivered: m.fields.redelivered,
    };
  }
}

// fieldOf reads a top-level string (or number) field of a JSON body; a body that is not JSON is refused.
function fieldOf(body: Buffer, field: string): { value?: string; refusal?: string } {
  let parsed: unknown;
  try {
    parsed = JSON.parse(body.toString("utf8"));
  } catch {
    return { refusal: `the body is not JSON, so it has no ${field} field` };
  }
  const v = parsed !== null && typeof parsed === "object" ? (parsed as Record<string, unknown>)[field] : undefined;
  return typeof v === "string" && v !== "" ? { value: v } : typeof v === "number" ? { value: String(v) } : {};
}

/** BrokerState is what a broker says of a source's consumer, for `inbox.ts status`. */
export type BrokerState =
  | { type: "nats"; pending: number; unacked: number; redelivered: number }
  | { type: "rabbitmq"; ready: number; consumers: number }
  | { type: "nats" | "rabbitmq"; error: string };

/**
 * brokerState asks the broker how far behind a source's consumer is: JetStream's pending, unacknowledged
 * and redelivered counts for the durable consumer, RabbitMQ's ready messages and consumers of the queue.
 * It never throws: a broker that cannot be asked is an error to show.
 */
export async function brokerState(b: BrokerSource): Promise<BrokerState> {
  try {
    if (b.type === "nats") {
      const { connect } = await import("@nats-io/transport-node");
      const { jetstreamManager } = await import("@nats-io/jetstream");
      const nc = await connect({
        servers: b.servers,
        timeout: b.timeoutMs,
        reconnect: false,
        ...(b.user === undefined ? {} : { user: b.user, pass: b.pass }),
        ...(b.token === undefined ? {} : { token: b.token }),
      });
      try {
        const jsm = await jetstreamManager(nc, { timeout: b.timeoutMs });
        const info = await jsm.consumers.info(b.stream, b.consumer);
        return {
          type: "nats",
          pending: info.num_pending,
          unacked: info.num_ack_pending,
          redelivered: info.num_redelivered,
        };
      } finally {
        await nc.close();
      }
    }
    const amqp = await import("amqplib");
    const model = await amqp.connect(b.url, { timeout: b.timeoutMs });
    try {
      const channel = await model.createChannel();
      const q = await channel.checkQueue(b.queue);
      return { type: "rabbitmq", ready: q.messageCount, consumers: q.consumerCount };
    } finally {
      await model.close().catch(() => {});
    }
  } catch (error) {
    return { type: b.type, error: message(error) };
  }
}

/** BrokerLine is one broker source as the CLI's status and the operator page show it. */
export interface BrokerLine {
  source: string;
  /** Where it is consumed from: the stream and consumer, or the queue. */
  from: string;
  /** What its broker says, in words, or why it could not be asked. */
  said: string;
  state: BrokerState;
}

/** brokerLines asks each of the sources that has a broker how far behind its consumer is (brokerState). */
export function brokerLines(sources: Iterable<{ name: string; broker?: BrokerSource }>): Promise<BrokerLine[]> {
  const asked: Promise<BrokerLine>[] = [];
  for (const s of sources) {
    const b = s.broker;
    if (!b) continue;
    const from = b.type === "nats" ? `JetStream ${b.stream}, consumer ${b.consumer}` : `RabbitMQ queue ${b.queue}`;
    asked.push(
      brokerState(b).then((state) => ({
        source: s.name,
        from,
        state,
        said:
          "error" in state
            ? `cannot ask: ${state.error}`
            : state.type === "nats"
              ? `${state.pending} pending, ${state.unacked} delivered and not yet acked, ${state.redelivered} redelivered`
              : `${state.ready} ready in the queue, ${state.consumers} consumers`,
      })),
    );
  }
  return Promise.all(asked);
}

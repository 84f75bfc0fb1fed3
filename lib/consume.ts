// consume.ts: brokers as sources. A durable JetStream consumer or a RabbitMQ queue whose messages become
// deliveries of a source, stored through the same routes as a webhook and acknowledged to the broker only
// once the store's promise (the durable commit) has resolved. consumer.ts runs one Consumer per source;
// docs/brokers.md says which identity each broker's message is stored under. Not run on its own:
//   const c = new Consumer({ inbox, source, log: console.error }); c.start(); … await c.stop();

import type { Channel, ConsumeMessage } from "amqplib";
import type { JsMsg } from "@nats-io/jetstream";
import { parseBrokerDestination } from "./brokers.ts";
import {
  Health,
  judgeJetStreamConsumer,
  judgeRabbitQueue,
  ourDescription,
  pauseOf,
  probeQueue,
  type Pause,
  type Verdict,
} from "./consume-health.ts";
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
  /** The durable consumer's name, created if it is not there (explicit acks); one that is there is checked. */
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
   * Taking nothing for longer than this while the broker holds messages for it makes the consumer starved:
   * unhealthy on /readyz and in inbox_consumer_state. @default DEFAULTS.consumeStarvedAfterMs
   */
  starvedAfterMs?: number;
  /** The clock the starved bound is measured on, in ms. @default Date.now */
  now?: () => number;
  /** Milliseconds between two readings of the lag, each a check of the JetStream consumer too. @default DEFAULTS.consumeLagEveryMs */
  checkEveryMs?: number;
  /**
   * Acknowledge each message as soon as it arrives, before its store: the mistake this file exists to
   * avoid, for the control of test/consume-crash.test.ts only. @default false
   */
  ackBeforeStore?: boolean;
}

/** Paused is a stream, queue or consumer the consumer cannot consume from now: its pause, and why in one clause. */
class Paused extends Error {
  readonly pause: Pause;
  constructor(pause: Pause, why: string) {
    super(why);
    this.pause = pause;
  }
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

/** Unstorable is a message that cannot be stored, whatever is tried: it is terminated or dead-lettered. */
class Unstorable extends Error {}

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
  readonly checkEveryMs: number;
  /** Whether it consumes, and if not why; its pauses counted by reason. */
  readonly health: Health;
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
    this.checkEveryMs = options.checkEveryMs ?? DEFAULTS.consumeLagEveryMs;
    this.health = new Health({
      source: this.source.name,
      log: this.log,
      now: options.now ?? Date.now,
      starvedAfterMs: options.starvedAfterMs ?? DEFAULTS.consumeStarvedAfterMs,
      retryMs: DEFAULTS.consumeReconnectMs,
      lag: () => this.counts.lag,
    });
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
        // Whatever stopped it is one line and one count, said once however many tries it takes to pass.
        if (error instanceof Paused) this.health.paused(error.pause, error.message);
        else this.health.paused(pauseOf(error), `${this.where()}: ${message(error)}`);
      }
      if (!this.stopping)
        await new Promise<void>((r) => {
          this.wake = r;
          setTimeout(r, DEFAULTS.consumeReconnectMs);
        });
    }
  }

  // where says what the source consumes from, for a pause's line.
  private where(): string {
    const b = this.source.broker;
    return b.type === "nats" ? `JetStream stream ${b.stream}, consumer ${b.consumer}` : `RabbitMQ queue ${b.queue}`;
  }

  // verdict logs a check's notes once each, and throws a refusal as a pause that waits for a person.
  private readonly noted = new Set<string>();
  private verdict(v: Verdict): void {
    for (const note of v.notes)
      if (!this.noted.has(note)) {
        this.noted.add(note);
        this.log(`consume ${this.source.name}: ${note}`);
      }
    if (v.refusal !== undefined) throw new Paused("refused", v.refusal);
  }

  // store puts one arrived message through the source's routes into the inbox, as the receiver's handler
  // does a request; it resolves once the commit is durable.
  async store(m: Arrived): Promise<Stored> {
    if (m.refusal !== undefined) throw new Unstorable(m.refusal);
    const id = m.id!;
    if (m.body.length > this.maxBody)
      throw new Unstorable(`body of ${m.body.length} bytes is over the ${this.maxBody}-byte limit`);
    if (id.length > this.maxId) throw new Unstorable(`delivery id longer than ${this.maxId} characters`);
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
      if (error instanceof Unstorable) {
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
      // check reads the stream and the durable consumer, makes the consumer where it is missing, corrects it
      // where the inbox made it, and throws a Paused that says why it cannot be consumed from; it returns the
      // consumer's ack_wait. It runs before the first pull, after every reconnect, and at each lag reading.
      const check = async (): Promise<number> => {
        const stream = await jsm.streams.info(b.stream).catch((error: unknown) => {
          throw pauseOf(error) === "stream_missing"
            ? new Paused("stream_missing", `JetStream stream ${b.stream} does not exist`)
            : error;
        });
        // A message can come back for as long as the stream keeps it: the tombstones must outlive that.
        const maxAgeMs = stream.config.max_age / 1e6;
        if (maxAgeMs === 0 || maxAgeMs > this.forgetAfterMs)
          this.verdict({
            fix: {},
            notes: [
              `stream ${b.stream} keeps messages ${maxAgeMs === 0 ? "for ever" : `${Math.round(maxAgeMs / 86_400_000)} days`}, longer than purge keeps IDs (${Math.round(this.forgetAfterMs / 86_400_000)} days): set its max_age, or purge with a longer --forget-after, or a message redelivered after that is stored again`,
            ],
          });
        let info = await jsm.consumers.info(b.stream, b.consumer).catch((error: unknown) => {
          if (/consumer not found/i.test(message(error))) return undefined;
          throw error;
        });
        if (!info) {
          info = await jsm.consumers.add(b.stream, {
            durable_name: b.consumer,
            description: ourDescription(this.source.name),
            ack_policy: AckPolicy.Explicit,
            deliver_policy: DeliverPolicy.All,
            ack_wait: b.ackWaitMs * 1e6,
            max_ack_pending: b.maxAckPending,
            max_deliver: -1,
            ...(b.filter === undefined ? {} : { filter_subject: b.filter }),
          });
          this.log(
            `consume ${this.source.name}: made JetStream consumer ${b.stream}/${b.consumer} (ack_policy explicit, deliver_policy all)`,
          );
        }
        const verdict = judgeJetStreamConsumer(info.config, b);
        if (Object.keys(verdict.fix).length > 0 && verdict.refusal === undefined) {
          info = await jsm.consumers.update(b.stream, b.consumer, verdict.fix);
          this.log(
            `consume ${this.source.name}: corrected JetStream consumer ${b.stream}/${b.consumer}, which the inbox made: ${Object.entries(
              verdict.fix,
            )
              .map(([k, v]) => `${k} ${JSON.stringify(v)}`)
              .join(", ")}`,
          );
        }
        this.verdict(verdict);
        this.counts.lag = info.num_pending;
        return (info.config.ack_wait ?? b.ackWaitMs * 1e6) / 1e6;
      };
      const ackWaitMs = await check();
      const consumer = await jetstream(nc, { timeout: b.timeoutMs }).consumers.get(b.stream, b.consumer);
      // A consumer or stream deleted under it ends the messages with an error, which the loop says and counts.
      const messages = await consumer.consume({ max_messages: b.maxAckPending, abort_on_missing_resource: true });
      this.halt = () => messages.close();
      if (this.stopping) await messages.close();
      // A pause found while the messages flow (a check refused, a permission lost) ends them too.
      let ended: unknown;
      const endWith = (error: unknown) => {
        ended ??= error;
        void messages.close();
      };
      let checking = false;
      const recheck = () => {
        if (checking || this.stopping) return;
        checking = true;
        check()
          .then(() => {
            this.health.consuming();
            this.health.review();
          }, endWith)
          .finally(() => (checking = false));
      };
      const lag = setInterval(recheck, this.checkEveryMs);
      void (async () => {
        for await (const s of nc.status()) {
          if (s.type === "disconnect")
            this.health.paused("connection", `${this.where()}: lost its connection to NATS; the client connects again`);
          else if (s.type === "reconnect") recheck();
          else if (s.type === "error" && pauseOf(s.error) === "permission")
            endWith(new Paused("permission", `${this.where()}: ${message(s.error)}`));
        }
      })();
      this.health.consuming();
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
          this.health.took();
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
        clearInterval(lag);
        await chain;
        clearInterval(progress);
        await nc.flush().catch(() => {});
      }
      if (ended !== undefined && !this.stopping) throw ended;
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
      // Without the publisher's ID, the stream's sequence alone is no identity: a stream deleted and made
      // again numbers its messages from 1. The time the stream stored the message (in ns, exact from the
      // reply subject, the same on every redelivery) tells its lifetimes apart.
      id: msgId || `${m.info.stream}:${m.info.streamSequence}:${m.timestampNanos}`,
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
    // Once the connection or the channel is gone, so are its deliveries: the broker has put the
    // unacknowledged back. A basic.cancel from the broker (the queue deleted) ends them as well.
    let broken = false;
    let storeDown = false;
    let ended: Paused | undefined;
    let end!: () => void;
    const over = new Promise<void>((resolve) => (end = resolve));
    const breakWith = (pause?: Paused) => {
      broken = true;
      ended ??= pause;
      end();
    };
    model.on("close", () => breakWith(new Paused("connection", `${this.where()}: the connection to RabbitMQ closed`)));
    model.on("error", () => {});
    try {
      // The queue's settings, read before each subscription: its own channel, as each refusal closes one.
      await probeQueue(model, b.queue).then(
        (q) => this.verdict(judgeRabbitQueue(q, b.queue)),
        (error: unknown) => {
          throw pauseOf(error) === "queue_missing"
            ? new Paused("queue_missing", `RabbitMQ queue ${b.queue} does not exist`)
            : error;
        },
      );
    } catch (error) {
      await model.close().catch(() => {});
      throw error;
    }
    const channel: Channel = await model.createChannel();
    // The broker says why it closes a channel (403 ACCESS_REFUSED: a permission taken away) before it does.
    let why: unknown;
    channel.on("error", (error: unknown) => (why = error));
    channel.on("close", () =>
      breakWith(
        why === undefined
          ? new Paused("connection", `${this.where()}: RabbitMQ closed the consumer's channel`)
          : new Paused(pauseOf(why), `${this.where()}: ${message(why)}`),
      ),
    );
    // consumer.ts's own settings on its own channel: at most prefetch unacknowledged, and manual acks.
    await channel.prefetch(b.prefetch);
    // The lag is read on a channel of its own: a failed check (the queue gone) closes the channel it ran on.
    const asking = await model.createChannel();
    asking.on("error", () => {});
    const lag = setInterval(() => {
      asking.checkQueue(b.queue).then(
        (q) => {
          this.counts.lag = q.messageCount;
          this.health.review();
        },
        () => {},
      );
    }, this.checkEveryMs);
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
    let cancelled = false;
    const { consumerTag } = await channel.consume(
      b.queue,
      (m) => {
        if (m === null) {
          // The broker's basic.cancel: the queue was deleted, or its node went away. The run ends here and
          // the loop subscribes again once the queue is back.
          cancelled = true;
          ended ??= new Paused("cancelled", `RabbitMQ cancelled the consumer of queue ${b.queue} (basic.cancel)`);
          end();
          return;
        }
        this.health.took();
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
              storeDown = true;
              breakWith();
              void model.close().catch(() => {});
            }
          })
          .catch((error: unknown) => this.log(`consume ${this.source.name}: ${message(error)}`));
      },
      { noAck: false },
    );
    this.health.consuming();
    let halted!: () => void;
    const stopped = new Promise<void>((r) => (halted = r));
    this.halt = async () => {
      if (!broken && !cancelled) await channel.cancel(consumerTag).catch(() => {});
      halted();
    };
    if (this.stopping) await this.halt();
    await Promise.race([over, stopped]);
    clearInterval(lag);
    // Deliveries already on the wire when the cancel went out still arrive, and lengthen the chain.
    for (let seen = chain; ; seen = chain) {
      await seen;
      await new Promise((r) => setTimeout(r, 50));
      if (seen === chain) break;
    }
    // The acks of the last run go out before the connection closes: after a basic.cancel too, on the
    // channel that is still open, for what was stored before it.
    flush();
    const pause = ended;
    await model.close().catch(() => {});
    // A store that is down is the inbox's own pause, said by each message's line: no broker pause to count.
    if (pause !== undefined && !storeDown && !this.stopping) throw pause;
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
export type BrokerState = (
  | { type: "nats"; pending: number; unacked: number; redelivered: number; waiting: number }
  | { type: "rabbitmq"; ready: number; consumers: number }
  | { type: "nats" | "rabbitmq"; error: string }
) & {
  /** What the inbox's checks find wrong with it, as consumer.ts would say it; undefined when nothing. */
  problem?: string;
};

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
          waiting: info.num_waiting,
          ...problemOf(judgeJetStreamConsumer(info.config, b), info.num_pending, info.num_waiting === 0, "pulls from"),
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
      const verdict = judgeRabbitQueue(await probeQueue(model, b.queue), b.queue);
      return {
        type: "rabbitmq",
        ready: q.messageCount,
        consumers: q.consumerCount,
        ...problemOf(verdict, q.messageCount, q.consumerCount === 0, "consumes"),
      };
    } finally {
      await model.close().catch(() => {});
    }
  } catch (error) {
    const pause = pauseOf(error);
    const problem =
      pause === "stream_missing"
        ? `stream ${(b as JetStreamSource).stream} does not exist: consumer.ts waits for it`
        : pause === "consumer_deleted"
          ? `consumer ${(b as JetStreamSource).consumer} does not exist: consumer.ts makes it when it starts or finds it gone`
          : pause === "queue_missing"
            ? `queue ${(b as RabbitSource).queue} does not exist: consumer.ts waits for it to be declared again`
            : undefined;
    return { type: b.type, error: message(error), ...(problem === undefined ? {} : { problem }) };
  }
}

// problemOf is what the page and the status show wrong with a source's consumer: the check's refusal (the
// same as consumer.ts's), else messages waiting while nobody takes them.
function problemOf(v: Verdict, waiting: number, nobody: boolean, takes: string): { problem?: string } {
  if (v.refusal !== undefined) return { problem: v.refusal };
  return nobody && waiting > 0 ? { problem: `nobody ${takes} it while ${waiting} wait: is consumer.ts running?` } : {};
}

/** BrokerLine is one broker source as the CLI's status and the operator page show it. */
export interface BrokerLine {
  source: string;
  /** Where it is consumed from: the stream and consumer, or the queue. */
  from: string;
  /** What its broker says, in words, or why it could not be asked. */
  said: string;
  /** What the inbox's checks find wrong with it (BrokerState's problem); undefined when nothing. */
  problem?: string;
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
        ...(state.problem === undefined ? {} : { problem: state.problem }),
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

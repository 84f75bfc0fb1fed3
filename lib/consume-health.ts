// consume-health.ts: what the inbox checks of a broker source's consumer (lib/consume.ts runs the checks).
// Its settings, read at start, after every reconnect and at each lag reading: a JetStream durable consumer's,
// a RabbitMQ queue's, each refused in one line (the setting and the fix) where it could ack a message before
// its commit or lose one. And its health while it runs: every pause (the consumer deleted, the stream or
// queue gone, a basic.cancel, no permission, no connection) logged in one line and counted, and a consumer
// that takes nothing while its broker holds messages for it found starved. Not run on its own.

import { message } from "./log.ts";

/** OURS starts the description of a JetStream consumer consumer.ts made: that one it may correct; anyone else's it only checks. */
export const OURS = "webhook-inbox";

/** ourDescription is the description consumer.ts gives a JetStream consumer it makes for a source. */
export function ourDescription(source: string): string {
  return `${OURS} consumer.ts, source ${source}: made by the inbox, which corrects its settings`;
}

/** Verdict is what a check found: the one line that refuses it, the corrections to make, and notes to log. */
export interface Verdict {
  /** Why it cannot be consumed from safely, and the fix, in one line; undefined when it can. */
  refusal?: string;
  /** Settings to change, where the inbox made the consumer (a JetStream consumer update). */
  fix: Record<string, unknown>;
  /** Settings worth a line in the log that put no message at risk. */
  notes: string[];
}

/** The part of a JetStream consumer's config the check reads (the server's own field names). */
export interface JetStreamConsumerConfig {
  description?: string;
  ack_policy?: string;
  deliver_policy?: string;
  ack_wait?: number;
  max_deliver?: number;
  max_ack_pending?: number;
  filter_subject?: string;
  filter_subjects?: string[];
  deliver_subject?: string;
  headers_only?: boolean;
}

/** What a source asks of its JetStream consumer (consume.ts's JetStreamSource). */
export interface JetStreamWanted {
  stream: string;
  consumer: string;
  filter?: string;
  maxAckPending: number;
  ackWaitMs: number;
}

// The least ack_wait the AckProgress timer can keep alive (a tick of at least 100 ms, sent at a third of it).
const LEAST_ACK_WAIT_MS = 1_000;

/**
 * judgeJetStreamConsumer checks a durable consumer's settings against its source. It refuses what lets a
 * message be acknowledged before its commit (ack_policy none or all), or never delivered to the inbox
 * (max_deliver, a filter other than the source's, deliver_policy new or last, headers only, a push
 * consumer); a consumer the inbox made (its description starts with OURS) is corrected where JetStream
 * lets a setting change, and refused only where it does not.
 */
export function judgeJetStreamConsumer(c: JetStreamConsumerConfig, want: JetStreamWanted): Verdict {
  const ours = c.description?.startsWith(OURS) === true;
  const name = `JetStream consumer ${want.stream}/${want.consumer}`;
  const remake = `delete it (consumer.ts makes it again as it needs it) or name another in "consumer"`;
  const fix: Record<string, unknown> = {};
  const notes: string[] = [];
  const refuse = (setting: string, why: string, how = remake): Verdict => ({
    refusal: `${name} has ${setting}: ${why}; ${how}`,
    fix: {},
    notes,
  });
  if (c.deliver_subject)
    return refuse(
      `deliver_subject ${c.deliver_subject} (a push consumer)`,
      "consumer.ts pulls, and a push consumer sends its messages to whoever listens there",
    );
  if (c.ack_policy !== "explicit")
    return refuse(
      `ack_policy ${c.ack_policy ?? "(none given)"}`,
      c.ack_policy === "all"
        ? "one ack acknowledges every earlier message, stored or not"
        : "the server takes each message as acknowledged when it sends it, so one that a crash loses before its commit is never sent again",
    );
  if (c.headers_only) return refuse("headers_only true", "its messages arrive without their bodies");
  if (c.deliver_policy === "new" || c.deliver_policy === "last" || c.deliver_policy === "last_per_subject")
    return refuse(
      `deliver_policy ${c.deliver_policy}`,
      "it skips the messages that were in the stream when it was made, and if it is made again, whatever came while it was gone",
    );
  const filters = c.filter_subjects?.length ? c.filter_subjects : c.filter_subject ? [c.filter_subject] : [];
  const wanted = want.filter === undefined ? [] : [want.filter];
  if (filters.join(" ") !== wanted.join(" ")) {
    const has = filters.length ? `filter ${filters.join(", ")}` : "no filter (every subject)";
    const asks = want.filter === undefined ? "no filter" : `filter ${want.filter}`;
    if (!ours || filters.length > 1)
      return refuse(
        has,
        `the source asks for ${asks}, so it would store messages of subjects the source does not take, or never see some it does`,
        `set the source's "filter" to match, or ${remake}`,
      );
    fix.filter_subject = want.filter ?? "";
  }
  if (c.max_deliver !== undefined && c.max_deliver > 0) {
    if (!ours)
      return refuse(
        `max_deliver ${c.max_deliver}`,
        `a message the store could not take ${c.max_deliver} times (the database down for a few seconds) is never delivered again`,
        `set max_deliver to -1 (consumer.ts terminates a poison message itself), or ${remake}`,
      );
    fix.max_deliver = -1;
  }
  const ackWaitMs = (c.ack_wait ?? 30e9) / 1e6;
  if (ackWaitMs !== want.ackWaitMs) {
    if (ours) fix.ack_wait = want.ackWaitMs * 1e6;
    else if (ackWaitMs < LEAST_ACK_WAIT_MS)
      notes.push(
        `${name} has ack_wait ${ackWaitMs} ms, under the ${LEAST_ACK_WAIT_MS} ms AckProgress can keep alive: a slow commit's messages are delivered again, and taken as duplicates`,
      );
    else
      notes.push(
        `${name} has ack_wait ${ackWaitMs} ms, the source asks ${want.ackWaitMs} ms: it keeps ${ackWaitMs} ms (someone else made it)`,
      );
  }
  if (c.max_ack_pending !== want.maxAckPending) {
    if (ours) fix.max_ack_pending = want.maxAckPending;
    else
      notes.push(
        `${name} has max_ack_pending ${c.max_ack_pending ?? "(none)"}, the source asks ${want.maxAckPending}: it keeps its own (someone else made it)`,
      );
  }
  if (c.deliver_policy !== "all")
    notes.push(`${name} has deliver_policy ${c.deliver_policy}: the messages before its start were never delivered`);
  return { fix, notes };
}

/** RabbitQueue is a queue's properties and arguments, as declaring it again showed them (probeQueue). */
export interface RabbitQueue {
  durable: boolean;
  autoDelete: boolean;
  args: Record<string, unknown>;
}

/**
 * judgeRabbitQueue refuses a queue that drops messages before the inbox can take them: one that is not
 * durable (gone with a broker restart), auto-deletes (gone with its last consumer, a consumer.ts restart),
 * expires (x-expires), or drops them unconsumed (x-message-ttl, or x-max-length dropping the oldest)
 * without a dead-letter exchange to keep them. The inbox never declares a source's queue, so it never
 * corrects one.
 */
export function judgeRabbitQueue(q: RabbitQueue, queue: string): Verdict {
  const refuse = (setting: string, why: string, how: string): Verdict => ({
    refusal: `RabbitMQ queue ${queue} has ${setting}: ${why}; ${how}`,
    fix: {},
    notes: [],
  });
  const again = "declare it again without it (delete it first, when it is empty)";
  if (!q.durable) return refuse("durable false", "a broker restart loses every message in it", again);
  if (q.autoDelete)
    return refuse(
      "auto_delete true",
      "it is deleted with its last consumer, a consumer.ts restart, and its messages",
      again,
    );
  if (q.args["x-expires"] !== undefined)
    return refuse(
      `x-expires ${String(q.args["x-expires"])}`,
      "it is deleted, with its messages, once nothing has consumed it for that long",
      again,
    );
  const dlx = q.args["x-dead-letter-exchange"] !== undefined;
  if (q.args["x-message-ttl"] !== undefined && !dlx)
    return refuse(
      `x-message-ttl ${String(q.args["x-message-ttl"])}`,
      "a message older than that is dropped before the inbox takes it",
      `give it an x-dead-letter-exchange to keep them, or ${again}`,
    );
  const overflow = q.args["x-overflow"] ?? "drop-head";
  for (const limit of ["x-max-length", "x-max-length-bytes"])
    if (q.args[limit] !== undefined && overflow === "drop-head" && !dlx)
      return refuse(
        `${limit} ${String(q.args[limit])}`,
        "past it the oldest message is dropped before the inbox takes it",
        `set x-overflow to reject-publish, or give it an x-dead-letter-exchange, or ${again}`,
      );
  return { fix: {}, notes: [] };
}

// RabbitMQ's answer to a declaration that differs from the queue: which setting, and its value and type.
const INEQUIVALENT =
  /inequivalent arg '([^']+)' for queue .*: received .* but current is (?:the value '(.*)' of type '(\w+)'|'(.*)')/;

/**
 * QueueProber is what probeQueue needs of an amqplib connection, said here rather than imported: amqplib is an
 * optional peer, and an app that installed the package without it must still type-check its declarations.
 */
export interface QueueProber {
  createChannel(): Promise<{
    on(event: "error", listener: (error: Error) => void): unknown;
    checkQueue(queue: string): Promise<unknown>;
    assertQueue(
      queue: string,
      options: { durable: boolean; autoDelete: boolean; exclusive: boolean; arguments: Record<string, unknown> },
    ): Promise<unknown>;
    close(): Promise<void>;
  }>;
}

/**
 * probeQueue reads a queue's properties and arguments over AMQP alone (the management API may not be
 * there): it declares the queue again with what it knows, and RabbitMQ names the first setting that
 * differs and its value, until none does. Each try is a channel of its own, which the refusal closes. A
 * queue that does not exist throws RabbitMQ's 404 from the passive check, and is never made.
 */
export async function probeQueue(model: QueueProber, queue: string): Promise<RabbitQueue> {
  const known: RabbitQueue = { durable: true, autoDelete: false, args: {} };
  for (let tries = 0; tries < 32; tries++) {
    const channel = await model.createChannel();
    channel.on("error", () => {});
    try {
      await channel.checkQueue(queue);
      await channel.assertQueue(queue, {
        durable: known.durable,
        autoDelete: known.autoDelete,
        exclusive: false,
        arguments: known.args,
      });
      await channel.close().catch(() => {});
      return known;
    } catch (error) {
      const m = INEQUIVALENT.exec(message(error));
      if (!m) throw error;
      const [, arg, value, type, plain] = m;
      if (arg === "durable") known.durable = plain === "true";
      else if (arg === "auto_delete") known.autoDelete = plain === "true";
      else if (type === "longstr" || type === "shortstr") known.args[arg!] = value;
      else if (type === "bool") known.args[arg!] = value === "true";
      else if (type !== undefined && /int|long|short|byte/.test(type)) known.args[arg!] = Number(value);
      else throw new Error(`cannot read the queue's ${arg}: ${message(error)}`, { cause: error });
    }
  }
  throw new Error(`cannot read the arguments of queue ${queue}: RabbitMQ named more than 32`);
}

/** PAUSES are why a consumer stops consuming, as inbox_consumer_pauses_total's reason label says it. */
export const PAUSES = [
  "consumer_deleted",
  "stream_missing",
  "queue_missing",
  "cancelled",
  "permission",
  "connection",
  "refused",
] as const;

/** Pause is one of PAUSES. */
export type Pause = (typeof PAUSES)[number];

/** pauseOf classes an error a broker's client threw by the pause it means. */
export function pauseOf(error: unknown): Pause {
  const text = message(error).toLowerCase();
  const code = (error as { code?: unknown } | null)?.code;
  if (/consumer deleted|consumer not found/.test(text)) return "consumer_deleted";
  if (/stream not found/.test(text)) return "stream_missing";
  if (code === 404 || /not[_-]found - no queue/.test(text)) return "queue_missing";
  if (code === 403 || /permission|authorization|access[_-]refused/.test(text)) return "permission";
  return "connection";
}

/** HealthOptions configures a Health. */
export interface HealthOptions {
  /** The source's name, for the log lines. */
  source: string;
  log: (line: string) => void;
  /** The clock, in ms. */
  now: () => number;
  /** Taking nothing for longer than this while the broker holds messages for it is starved. */
  starvedAfterMs: number;
  /** How long a pause waits before it tries again, for its line. */
  retryMs: number;
  /** The messages its broker holds for it, as it last said. */
  lag: () => number;
}

/** STATE_CODES are inbox_consumer_state's values: 0 consuming, 1 paused (or starting), 2 starved, 3 refused. */
export const STATE_CODES = { consuming: 0, paused: 1, starved: 2, refused: 3 } as const;

/**
 * Health is one source's consumer as its operator sees it: consuming, paused (and why), starved, or refused.
 * Each change is one log line, and each pause is counted by its reason; taking a message says it is alive.
 */
export class Health {
  state: "starting" | "consuming" | "paused" | "refused" = "starting";
  reason?: Pause;
  why = "starting";
  since: number;
  lastTaken: number;
  starved = false;
  readonly pauses = new Map<Pause, number>();
  readonly reasons = PAUSES;
  /** first resolves with the first state it reaches: true when it consumes, else the line that says why not. */
  readonly first: Promise<true | string>;
  private settleFirst!: (state: true | string) => void;
  private readonly o: HealthOptions;

  constructor(options: HealthOptions) {
    this.o = options;
    this.since = this.lastTaken = options.now();
    this.first = new Promise((resolve) => (this.settleFirst = resolve));
  }

  /** consuming says the consumer has (again) a stream or queue, settings it accepts, and a subscription. */
  consuming(): void {
    const now = this.o.now();
    if (this.state === "paused" || this.state === "refused")
      this.o.log(
        `consume ${this.o.source}: consuming again, after ${((now - this.since) / 1000).toFixed(1)} s of: ${this.why}`,
      );
    if (this.state !== "consuming") {
      this.since = this.lastTaken = now;
      this.starved = false;
    }
    this.state = "consuming";
    this.settleFirst(true);
  }

  /**
   * paused says the consumer stopped, why in one clause; the same pause said again (each retry) is neither
   * logged nor counted again. A refusal ("refused") is a pause that waits for a person.
   */
  paused(reason: Pause, why: string): void {
    const same = (this.state === "paused" || this.state === "refused") && this.reason === reason && this.why === why;
    if (!same) {
      this.pauses.set(reason, (this.pauses.get(reason) ?? 0) + 1);
      // A refusal's line is already the setting and its fix; a pause says it tries again.
      this.o.log(
        reason === "refused"
          ? `consume ${this.o.source}: refused: ${why}`
          : `consume ${this.o.source}: paused: ${why}; trying again every ${this.o.retryMs / 1000} s`,
      );
      if (this.state === "consuming" || this.state === "starting") this.since = this.o.now();
    }
    this.state = reason === "refused" ? "refused" : "paused";
    this.reason = reason;
    this.why = why;
    this.starved = false;
    this.settleFirst(why);
  }

  /** took says a message arrived: the consumer is alive. */
  took(): void {
    this.lastTaken = this.o.now();
    if (this.starved) this.review();
  }

  /** review looks again at whether a consuming consumer is starved, and logs the change in one line. */
  review(): void {
    const starved =
      this.state === "consuming" && this.o.lag() > 0 && this.o.now() - this.lastTaken > this.o.starvedAfterMs;
    if (starved !== this.starved)
      this.o.log(
        starved
          ? `consume ${this.o.source}: starved: ${this.starvedWhy()}`
          : `consume ${this.o.source}: taking messages again`,
      );
    this.starved = starved;
  }

  /** code is inbox_consumer_state's value now (STATE_CODES). */
  code(): number {
    this.review();
    if (this.state === "consuming") return this.starved ? STATE_CODES.starved : STATE_CODES.consuming;
    return this.state === "refused" ? STATE_CODES.refused : STATE_CODES.paused;
  }

  /** ready is true while the consumer consumes and is not starved, else why not, for /readyz. */
  ready(): true | string {
    const code = this.code();
    if (code === STATE_CODES.consuming) return true;
    if (code === STATE_CODES.starved) return `${this.o.source}: starved: ${this.starvedWhy()}`;
    return `${this.o.source}: ${this.state === "starting" ? "not consuming yet" : `${this.state}: ${this.why}`}`;
  }

  private starvedWhy(): string {
    return `has taken nothing for ${Math.round((this.o.now() - this.lastTaken) / 1000)} s while its broker holds ${this.o.lag()} messages for it (another client holding them, or a consumer that no longer delivers)`;
  }
}

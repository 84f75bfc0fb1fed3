// forwarding/forwarder.ts: the worker's forwarding. One lease lane (lease/lane.ts) per destination, each with its own
// claims, its own requests in flight and its own breaker, so a destination that fails or hangs holds up only itself.
// worker.ts runs it beside the handler when the sources file names destinations:
//   INBOX_SOURCES=sources.json npx tsx worker.ts
// See docs/forwarding.md for the model, the answer table and the breaker.

import { DEFAULTS } from "../defaults.ts";
import { announce, httpSender, type OperatorEvent, type SendResult, type Sender } from "./forward.ts";
import { label, message, type Log } from "../log.ts";
import type { Metrics } from "../metrics.ts";
import { redactor, secretsOf, type Redactor, type Secret } from "../redact.ts";
import type { Destination, Forwarding, Route } from "../routing/routes.ts";
import { Batcher } from "../lease/batcher.ts";
import { realClock, type Clock } from "../lease/clock.ts";
import { Lane, type LaneView, type Running } from "../lease/lane.ts";
import type { LaneEvent, Settled, Settlement } from "../lease/settler.ts";
import { AheadSizing } from "../lease/sizing.ts";
import type { BreakerChange, BreakerPolicy, Inbox, Lease, Tally, Try } from "../store.ts";
import { sqlstate } from "../errors.ts";
import { startProcess, type Process } from "../traces.ts";
import { type Runner, TransformError, transformInput, Transforms, type Shaped } from "./transform.ts";

/** ForwarderOptions configures forward(); every number has a default in DEFAULTS. */
export interface ForwarderOptions {
  inbox: Inbox;
  forwarding: Forwarding;
  /** Each source's routes, for what a 4xx means on its way to a destination. @default none: a 4xx retries */
  routes?: ReadonlyMap<string, readonly Route[]>;
  /** The folder a transform's relative path is taken from: the sources file's. @default the working directory */
  transformBase?: string;
  /** The transforms' processes, when the caller keeps them between runs (transformBase is then theirs). @default processes of its own, stopped when forward returns */
  transforms?: Transforms;
  /** Senders for destinations that are not HTTP (brokers), by destination name. @default none */
  senders?: ReadonlyMap<string, Sender>;
  /** Drain what is due, then return. @default false */
  once?: boolean;
  /** @default DEFAULTS.leaseMs */
  leaseMs?: number;
  /** @default DEFAULTS.pollMinMs */
  pollMinMs?: number;
  /** @default DEFAULTS.pollMaxMs */
  pollMaxMs?: number;
  /** @default DEFAULTS.tallyEveryMs */
  tallyEveryMs?: number;
  /** @default DEFAULTS.heldPollMs */
  heldPollMs?: number;
  /** Abort to stop: no more claims; forwards in flight finish, or are cut off and released after shutdownGraceMs. */
  signal?: AbortSignal;
  /** @default DEFAULTS.shutdownGraceMs */
  shutdownGraceMs?: number;
  /** @default console.error */
  log?: Log;
  metrics?: Metrics;
  /** The counters to count into. @default fresh ones */
  stats?: ForwardStats;
  /** Every secret to redact: the destinations', the operator's, and the sources' and brokers' besides (redact.ts secretsOf()). @default secretsOf(forwarding) */
  secrets?: readonly Secret[];
  /**
   * Whether a failed try's error is redacted before it is stored, logged, traced or announced. Only the
   * tests turn it off, to show that without it the secrets an answer echoes get through. @default true
   */
  redact?: boolean;
  /** The clock the lanes read and set their timers on; the tests move a fake one. @default realClock */
  clock?: Clock;
  /** The time of day, in ms since the epoch, for when each try started (the attempt log). @default Date.now */
  now?: () => number;
}

/** ForwardStats counts what the forwarder did. */
export interface ForwardStats {
  done: number;
  retried: number;
  failed: number;
  released: number;
  lost: number;
}

// A destination with "breaker": false still tallies (its failure rate and last error are shown) but never opens.
const NEVER: BreakerPolicy = {
  failures: Number.MAX_SAFE_INTEGER,
  rate: 2,
  minTries: Number.MAX_SAFE_INTEGER,
  windowMs: DEFAULTS.breakerWindowMs,
  coolDownMs: 0,
};

/** forward runs one lane per destination until the signal aborts (or, once, until nothing is due). */
export async function forward(options: ForwarderOptions): Promise<ForwardStats> {
  const { forwarding } = options;
  const log: Log = options.log ?? ((line: string) => console.error(line));
  const stats: ForwardStats = options.stats ?? { done: 0, retried: 0, failed: 0, released: 0, lost: 0 };
  const senders = new Map<string, Sender>();
  // Compiled once per destination, its own secrets naming themselves first; used only on a failed try.
  const known = options.redact === false ? [] : (options.secrets ?? secretsOf(forwarding));
  const redactors = new Map([...forwarding.destinations.keys()].map((name) => [name, redactor(known, { mine: name })]));
  for (const d of forwarding.destinations.values()) {
    const sender =
      d.kind === "http" ? httpSender(d, { redactor: redactors.get(d.name)! }) : options.senders?.get(d.name);
    if (!sender)
      throw new TypeError(
        `forward: no sender for destination ${d.name} (type ${d.kind === "broker" ? d.type : "http"})`,
      );
    senders.set(d.name, sender);
  }
  const say = (event: OperatorEvent, line: string, level: "info" | "warn" | "error") => {
    log(line, { level, event: event.type, ...event.data });
    if (forwarding.operator) {
      void announce(forwarding.operator, event).then((r) => r === true || log(r, { level: "warn", event: event.type }));
    }
  };
  // One process per transform module, shared by the lanes that use it (transform.ts).
  const transforms =
    options.transforms ??
    new Transforms(options.transformBase ?? ".", { log: (line) => log(line, { level: "error" }) });
  try {
    await Promise.all(
      [...forwarding.destinations.values()].map((destination) =>
        new DestinationLane({
          destination,
          sender: senders.get(destination.name)!,
          redactor: redactors.get(destination.name)!,
          options,
          stats,
          log,
          say,
          transforms,
        }).run(),
      ),
    );
  } finally {
    if (!options.transforms) await transforms.close();
    await Promise.all(
      [...senders.entries()]
        .filter(([name]) => forwarding.destinations.get(name)?.kind === "http")
        .map(([, s]) => s.close()),
    );
  }
  return stats;
}

// What a source's route to a destination says: whether a 4xx is final, and the transform (its route's,
// else the destination's, else none) with its process.
interface RouteHere {
  permanent4xx: boolean;
  transform?: { transformer: Runner; timeoutMs: number; module: string };
}

/**
 * Forwarded is one forward's settlement (lease/settler.ts), with what the try came to for the lane's report
 * (`tried`): what the destination (or the broker) answered, or what stood in for an answer when nothing was
 * sent. What the attempt log keeps of it (its timing, its answer's status, headers and first bytes) is the
 * settlement's own `attempt`, which the settler writes with it.
 */
// A lease given back before anything was sent (its destination paused while its transform ran) tried nothing.
type Forwarded = Settlement & { tried?: Tried };
interface Tried {
  /** The sender's SendResult; a transform's failure is a retry, a transform that took the delivery away a done. */
  answer: SendResult;
  /** The transform said this destination does not take this delivery: nothing sent. */
  skipped: boolean;
  /** The transform failed: nothing sent, and nothing said of the destination. */
  transformFailed: boolean;
}

/** DestinationLaneParts are what one destination's lane is built from. */
interface DestinationLaneParts {
  destination: Destination;
  sender: Sender;
  redactor: Redactor;
  options: ForwarderOptions;
  stats: ForwardStats;
  log: Log;
  say: (event: OperatorEvent, line: string, level: "info" | "warn" | "error") => void;
  transforms: Transforms;
}

// DestinationLane forwards one destination's deliveries: a lease lane (lease/lane.ts) whose executor
// forwards and whose listener reports, and the destination's share of the breaker. It claims only what its
// in-flight limit has room for, so a slow destination holds its own leases and nobody else's.
class DestinationLane {
  readonly lane: Lane<Forwarded>;
  private readonly p: DestinationLaneParts;
  private readonly name: string;
  private readonly clock: Clock;
  private readonly policy: BreakerPolicy;
  private readonly here = new Map<string, RouteHere>();
  // Each started lease's span, ended once its settlement is written or known (traces.ts).
  private readonly spans = new Map<Lease, Process>();
  // Successes are gathered and added to the shared breaker once per tallyEveryMs; a failure goes at once,
  // with what was gathered before it, so the shared count of failures in a row stays in order. One tally
  // is written at a time, and the next takes everything gathered until it starts: a burst of failures (a
  // destination gone down with a lane's worth in flight) is one or two writes, not one each.
  private gathered: Tally = { done: 0, failed: 0 };
  private tallying: Promise<void> = Promise.resolve();
  private next: Promise<void> | undefined;
  // The pause read after a transform (pausedNow): the one on its way, and the one queued to start after it.
  private pauseRead: Promise<boolean> | undefined;
  private pauseReadNext: Promise<boolean> | undefined;

  constructor(parts: DestinationLaneParts) {
    this.p = parts;
    const { destination, options } = parts;
    const { inbox } = options;
    this.name = destination.name;
    this.clock = options.clock ?? realClock;
    this.policy = destination.breaker === false ? NEVER : destination.breaker;
    const max = destination.maxInFlight;
    // A destination with a rate is claimed at most a second's worth ahead: its tokens, not its claims, pace it.
    const most = destination.rate
      ? Math.max(2 * max, Math.ceil(destination.rate.perSecond))
      : Math.max(8 * max, DEFAULTS.claimBatch);
    const sizing = new AheadSizing(max, most);
    this.lane = new Lane<Forwarded>({
      inbox,
      execute: this.execute,
      sizing,
      batcher: this.batcher(inbox, sizing),
      listener: this.report,
      // A failed try keeps its slot until the breaker has counted it: the next forward must not go out to a
      // destination that just opened.
      placeUntil: "settled",
      clock: this.clock,
      concurrency: max,
      destination: this.name,
      heldPollMs: options.heldPollMs ?? DEFAULTS.heldPollMs,
      leaseMs: options.leaseMs,
      pollMinMs: options.pollMinMs,
      pollMaxMs: options.pollMaxMs,
      shutdownGraceMs: options.shutdownGraceMs,
      once: options.once,
      signal: options.signal,
      // Each wave of forwards starts only once the destination is known not paused and, with a rate, the
      // wave's tokens are taken: at the moment they go out, not when they were claimed (lanes claim ahead,
      // and forwards taken at claim time bunched at the destination). On SQLite each ask is a read
      // transaction of its own, about 20 µs of locking, so the slots freed in one turn ask once.
      permit: (want) => inbox.permit(this.name, want, destination.rate),
      // A forward cut off by a stop ends once its request has, and its retry goes back unspent.
      cutOff: "wait",
      drained: () => this.tally(),
    });
  }

  // batcher is how this lane's done marks go out. With the next claim, or once a claim's worth has
  // gathered, or when nothing else is at the destination, or once the first has waited four times as long
  // as a claim takes (at least pollMax): every commit costs a sync to disk (on SQLite one that holds the
  // event loop), so it should serve many forwards, and the marks must not wait long either. Slots waiting
  // for their wave's permit are not "nothing at the destination": the forwards answered in one turn all
  // free their slots before the next wave starts, and each such moment committed its marks.
  // On PostgreSQL a claim commits in a transaction of its own beside the marks, so they gain nothing by
  // waiting for it: they go out at once, and the commit queue still gathers every mark of one event-loop
  // turn into one statement. A SIGKILLed worker then leaves fewer forwards answered but not marked, each
  // of which is sent again (docs/forwarding.md, "Duplicates after a crash"). One batch of them is in
  // flight at a time, though: those answered while it commits go out together once it has, rather than
  // each turn's few in a transaction of their own (every one a flush of the WAL).
  private batcher(inbox: Inbox, sizing: AheadSizing): Batcher {
    const pollMax = this.p.options.pollMaxMs ?? DEFAULTS.pollMaxMs;
    const eager = inbox.backend === "postgres";
    return new Batcher({
      inbox,
      clock: this.clock,
      oneAtATime: eager,
      ...(eager
        ? {}
        : {
            hold: (count: number, ageMs: number, view: LaneView) =>
              count < sizing.ahead &&
              (view.running > 0 || view.gated) &&
              ageMs < Math.max(pollMax, 4 * sizing.claimTook),
          }),
      wake: () => this.lane.wake("marks"),
    });
  }

  /** run forwards until the lane stops, tallying the breaker on the clock meanwhile. */
  async run(): Promise<void> {
    const stopTicker = this.clock.every(this.p.options.tallyEveryMs ?? DEFAULTS.tallyEveryMs, () => void this.tally());
    try {
      await this.lane.start();
    } finally {
      stopTicker();
    }
  }

  private tally(extra?: Partial<Tally>): Promise<void> {
    const { gathered } = this;
    const error = extra?.error ?? gathered.error;
    const probe = extra?.probe ?? gathered.probe;
    this.gathered = {
      done: gathered.done,
      failed: gathered.failed + (extra?.failed ?? 0),
      ...(error ? { error } : {}),
      ...(probe ? { probe } : {}),
    };
    this.next ??= this.tallying = this.tallying.then(() => {
      this.next = undefined;
      const t = this.gathered;
      this.gathered = { done: 0, failed: 0 };
      if (t.done === 0 && t.failed === 0 && !t.probe) return;
      return this.p.options.inbox.tally(this.name, t, this.policy).then(
        (change) => void (change && this.announceChange(change)),
        (error: unknown) =>
          this.p.log(`${this.name}: could not tally the breaker: ${message(error)}`, {
            level: "warn",
            destination: this.name,
          }),
      );
    });
    return this.next;
  }

  private announceChange(change: BreakerChange): void {
    const { name, policy } = this;
    this.lane.hold(change.change === "opened");
    if (change.change !== "opened") {
      // What waited behind the breaker is due now, whatever a claim already out found.
      this.lane.wake("due");
      this.p.say(
        { type: "destination.closed", data: { destination: name } },
        `${name}: breaker closed, the probe got through; forwarding again`,
        "info",
      );
      return;
    }
    const why =
      change.failures >= policy.failures
        ? `${change.failures} failures in a row`
        : `${Math.round((change.rate ?? 0) * 100)}% of tries failed`;
    this.p.say(
      {
        type: "destination.opened",
        data: {
          destination: name,
          failures: change.failures,
          failureRate: change.rate,
          error: change.error,
          retryAt: change.retryAt,
        },
      },
      `${name}: breaker open after ${why} (last: ${change.error ?? "?"}); its deliveries wait, no attempt spent, until a probe at ${new Date(change.retryAt!).toISOString()}`,
      "error",
    );
  }

  // routeHere looks a source's route here up once per source rather than at every forward.
  private routeHere(source: string): RouteHere {
    let found = this.here.get(source);
    if (!found) {
      const route = this.p.options.routes?.get(source)?.find((r) => r.to === this.name);
      const setting = route?.transform ?? this.p.destination.transform;
      found = {
        permanent4xx: route?.permanent4xx ?? false,
        ...(setting
          ? {
              transform: {
                transformer: this.p.transforms.get(setting),
                timeoutMs: setting.timeoutMs,
                module: setting.module,
              },
            }
          : {}),
      };
      this.here.set(source, found);
    }
    return found;
  }

  // execute is the lane's executor: one try, in a span of the delivery's trace (traces.ts) that the
  // report ends once the try's settlement is written or known.
  private execute = (lease: Lease, { signal }: Running): Promise<Forwarded> => {
    const span = startProcess(lease, this.name);
    this.spans.set(lease, span);
    return span.run(() => this.attempt(lease, signal, span));
  };

  // pausedNow reads the destination's pause in a read that starts after it is called: the forwards whose
  // transforms return while one is on its way share the next, so a wave of them costs a read or two, not one
  // each (a read that started earlier could miss a pause committed since).
  private pausedNow(): Promise<boolean> {
    if (this.pauseReadNext) return this.pauseReadNext;
    if (!this.pauseRead) return this.readPause();
    this.pauseReadNext = this.pauseRead
      .catch(() => {})
      .then(() => {
        this.pauseReadNext = undefined;
        return this.readPause();
      });
    return this.pauseReadNext;
  }

  private readPause(): Promise<boolean> {
    const read = this.p.options.inbox.permit(this.name, 1).then((permit) => permit.paused);
    this.pauseRead = read;
    const clear = () => {
      if (this.pauseRead === read) this.pauseRead = undefined;
    };
    read.then(clear, clear);
    return read;
  }

  // attempt transforms the delivery and sends it, and says what that came to; it writes nothing.
  private async attempt(lease: Lease, signal: AbortSignal, span: Process): Promise<Forwarded> {
    // The destination joins the trace as this try's child: the span's traceparent, else the stored one.
    const traced = span.traceparent === undefined ? lease : { ...lease, traceparent: span.traceparent };
    // A transform reshapes this try in its process; what it cannot do fails the try, which is retried like any
    // other, but it says nothing of the destination, so the breaker does not count it.
    const { permanent4xx, transform: setting } = this.routeHere(lease.source);
    const now = this.p.options.now ?? Date.now;
    const startedAt = now();
    let shaped: Shaped | null | undefined;
    let answer: SendResult | undefined;
    if (setting) {
      try {
        shaped = await setting.transformer.run(transformInput(lease, this.name), setting.timeoutMs);
      } catch (error) {
        answer = {
          kind: "retry",
          error: error instanceof TransformError ? error.message : `transform ${setting.module}: ${message(error)}`,
        };
      }
    }
    const transformFailed = answer !== undefined;
    // The wave's permit said the destination was not paused before the transform ran, which may take up to
    // its timeout: a pause committed meanwhile must still stop the send, so the lease goes back unsent.
    if (setting && shaped !== null && !transformFailed && (await this.pausedNow())) return { kind: "released" };
    if (answer === undefined && shaped === null) {
      // The transform said this destination does not take this delivery: done, nothing sent.
      answer = { kind: "done" };
    } else if (answer === undefined) {
      const sent = shaped ? { ...traced, body: shaped.body, contentType: shaped.contentType } : traced;
      answer = await this.p.sender.send(sent, { signal, permanent4xx, ...(shaped ? { headers: shaped.headers } : {}) });
    }
    // Before the error is stored, tallied, logged, traced or announced: a failed answer (or a transform's
    // error, which may quote the delivery's headers) may echo a secret.
    if (answer.kind !== "done") answer = { ...answer, error: this.p.redactor.redact(answer.error) };
    const tried = { answer, skipped: shaped === null, transformFailed };
    // The try as its attempt log keeps it: the answer, already redacted by the sender, where one came.
    const { reply } = answer;
    const attempt: Try = {
      startedAt,
      ms: now() - startedAt,
      ...(reply ? { status: reply.status, headers: reply.headers, body: reply.body } : {}),
    };
    if (answer.kind === "done") return { kind: "done", attempt, tried };
    if (answer.kind === "gone") return { kind: "held", error: answer.error, tried };
    if (answer.kind === "failed") return { kind: "failed", error: answer.error, attempt, tried };
    return {
      kind: "retry",
      error: answer.error,
      ...(answer.afterMs === undefined ? {} : { afterMs: answer.afterMs }),
      attempt,
      tried,
    };
  }

  /** report is the lane's listener: each event counted, measured, traced, tallied and said. */
  private report = (event: LaneEvent<Forwarded>): void | Promise<void> => {
    const { name } = this;
    const { log, options } = this.p;
    switch (event.type) {
      case "settled":
        return this.settled(event);
      case "claimed":
        options.metrics?.claimed(event.lease);
        return;
      case "set aside":
        // Set aside by a claim, as their last attempt's lease ran out: the worker that held them crashed or hung.
        for (const d of event.deliveries) {
          this.p.stats.failed++;
          options.metrics?.failed(d);
          this.p.say(
            { type: "delivery.set_aside", data: { ...d } },
            `${label(d)} → ${name} set aside after ${d.attempts} attempts: ${d.error}`,
            "error",
          );
        }
        return;
      case "claim failed":
        options.metrics?.dbError("forward", event.error);
        if (event.first)
          log(`${name}: could not claim (${message(event.error)}); trying again`, {
            level: "error",
            destination: name,
          });
        return;
      case "claiming again":
        return log(`${name}: claiming again`, { destination: name });
      case "extend failed":
        options.metrics?.dbError("forward", event.error);
        log(`${label(event.lease)} → ${name}: could not extend the lease: ${message(event.error)}`, {
          level: "warn",
          destination: name,
          sqlstate: sqlstate(event.error),
        });
        return;
      case "write failed":
        options.metrics?.dbError("forward", event.error);
        if (event.tries === 1)
          log(`${name}: could not ${event.what} (${message(event.error)}); trying again`, {
            level: "warn",
            destination: name,
            sqlstate: sqlstate(event.error),
          });
        return;
      case "permit failed":
        log(`${name}: could not ask for a permit (${message(event.error)}); trying again`, {
          level: "warn",
          destination: name,
        });
        return;
    }
  };

  // settled counts, traces, tallies and says what became of one forward. What it returns is awaited before
  // the forward's slot frees, so a failure's tally has said whether the breaker opened.
  private settled(event: Settled<Forwarded>): void | Promise<void> {
    const { lease, settlement: s, result } = event;
    const span = this.spans.get(lease);
    this.spans.delete(lease);
    const tried = "tried" in s ? s.tried : undefined;
    if (tried) this.p.options.metrics?.forwarded(this.name, tried.answer.kind, event.ran ?? 0);
    if (result === "unsettled") return this.unsettled(event, span);
    // Given back: not started, cut off by a stop, or held behind a destination that said it is gone.
    if (s.kind === "released" || s.kind === "held" || (s.kind === "retry" && event.cutOff)) {
      span?.end("released", s.kind === "held" ? s.error : undefined);
      if (result === "released") this.p.stats.released++;
      if (s.kind === "held" && event.paused)
        this.p.say(
          { type: "destination.paused", data: { destination: this.name, reason: s.error } },
          `${this.name}: paused: ${s.error}; its deliveries wait until \`inbox.ts resume ${this.name}\``,
          "error",
        );
      return;
    }
    if (s.kind === "done" && (result === "done" || result === "lost")) return this.done(event, span, tried);
    return this.failed(event, span, tried);
  }

  // done says what became of a forward that was answered, or skipped by its transform: done with the
  // others of its batch, most often in the next claim's commit, or lost meanwhile.
  private done(event: Settled<Forwarded>, span: Process | undefined, tried: Tried | undefined): void | Promise<void> {
    const { name } = this;
    const { lease } = event;
    const skipped = tried?.skipped ?? false;
    if (event.result === "lost") {
      span?.end("lost");
      this.p.stats.lost++;
      this.p.log(
        `${label(lease)} → ${name}: forwarded, but the lease was lost meanwhile; another worker forwards it again (the webhook-id is the same)`,
        { level: "warn", ...this.fields(lease) },
      );
      return;
    }
    span?.end("done");
    this.p.stats.done++;
    if (!skipped) this.gathered.done++;
    const say = () =>
      this.p.log(`${label(lease)} → ${name} ${skipped ? "done: skipped by its transform, nothing sent" : "done"}`, {
        ...this.fields(lease),
        status: "done",
      });
    if (lease.probe && !skipped) return this.tally({ probe: "done" }).then(say);
    say();
  }

  // failed says what a recorded failure came to (lost, set aside, or to be retried), once the breaker has
  // counted it: the try's own failure, or (a done whose mark the store refused) the store's.
  private async failed(event: Settled<Forwarded>, span: Process | undefined, tried: Tried | undefined): Promise<void> {
    const { name } = this;
    const { stats, log, options } = this.p;
    const { lease, settlement: s, result } = event;
    const fields = this.fields(lease);
    const error = event.error ?? "";
    span?.end(result === "lost" ? "lost" : result === "failed" ? "failed" : "retry", error);
    // A try this worker cut off itself, its lease lost to a takeover (its event loop stalled past the lease),
    // says nothing of the destination either: counted, ten of them opened a healthy destination for every
    // worker, for a whole cool-down, whenever a loaded machine made the workers lose their leases.
    const cutOff = s.kind === "retry" && event.aborted;
    // A permanent 4xx is the destination answering: its breaker counts it as up.
    if (s.kind === "failed") this.gathered.done++;
    else if (s.kind === "retry" && !tried?.transformFailed && !cutOff)
      await this.tally({ failed: 1, error, ...(lease.probe ? { probe: "failed" as const } : {}) });
    // A probe must still end, or the breaker waits on it: it ends as not proven, and the next probe tries again.
    else if (lease.probe) await this.tally({ probe: "failed", error });
    if (result === "lost") {
      stats.lost++;
      log(`${label(lease)} → ${name} failed, but the lease was already lost: ${error}`, { level: "warn", ...fields });
    } else if (result === "failed") {
      stats.failed++;
      options.metrics?.failed(lease);
      this.p.say(
        { type: "delivery.set_aside", data: { ...fields, error } },
        `${label(lease)} → ${name} set aside${s.kind === "failed" ? " (permanent)" : ` after ${lease.attempts} attempts`}: ${error}`,
        "error",
      );
    } else {
      stats.retried++;
      options.metrics?.retried(lease);
      log(
        `${label(lease)} → ${name} failed (attempt ${lease.attempts}), retrying at ${new Date(event.retryAt!).toISOString()}: ${error}`,
        { level: "warn", ...fields, status: "received", retryAt: event.retryAt },
      );
    }
  }

  // unsettled says that what a forward came to could not be written: its lease runs out, and it goes again.
  private unsettled(event: Settled<Forwarded>, span: Process | undefined): void {
    const { lease, settlement: s } = event;
    const why = message(event.unsettled);
    span?.end("retry", why);
    if (s.kind === "released" && !event.cutOff)
      this.p.log(`${label(lease)} → ${this.name}: could not release (${why}); it goes again when its lease expires`, {
        level: "warn",
        destination: this.name,
      });
    else
      this.p.log(
        `${label(lease)} → ${this.name}: could not record the outcome (${why}); it goes again when its lease expires`,
        { level: "error", ...this.fields(lease) },
      );
  }

  // fields are a forward's log fields.
  private fields(lease: Lease) {
    return { source: lease.source, id: lease.id, destination: this.name, attempts: lease.attempts };
  }
}

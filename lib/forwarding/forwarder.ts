// forwarding/forwarder.ts: the worker's forwarding. One lease lane (lease/lane.ts) per destination, each with its own
// claims, its own requests in flight and its own breaker, so a destination that fails or hangs holds up only itself.
// worker.ts runs it beside the handler when the sources file names destinations:
//   INBOX_SOURCES=sources.json npx tsx worker.ts
// See docs/forwarding.md for the model, the answer table and the breaker.

import { DEFAULTS } from "../defaults.ts";
import { announce, httpSender, type OperatorEvent, type Outcome, type Sender } from "./forward.ts";
import { label, message, type Log } from "../log.ts";
import type { Metrics } from "../metrics.ts";
import { redactor, secretsOf, type Redactor, type Secret } from "../redact.ts";
import type { Destination, Forwarding, Route } from "../routing/routes.ts";
import { Batcher } from "../lease/batcher.ts";
import { realClock, type Clock } from "../lease/clock.ts";
import { Lane, type LaneReport, type LaneView, type Running } from "../lease/lane.ts";
import { AheadSizing } from "../lease/sizing.ts";
import type { BreakerChange, BreakerPolicy, Failure, Inbox, Lease, SetAside, Tally } from "../store.ts";
import { sqlstate } from "../errors.ts";
import { startProcess, type Process } from "../traces.ts";
import { TransformError, transformInput, Transforms, type Shaped, type Transformer } from "./transform.ts";

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
}

/** ForwardStats counts what the forwarder did. */
export interface ForwardStats {
  done: number;
  retried: number;
  failed: number;
  held: number;
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
  const stats: ForwardStats = options.stats ?? { done: 0, retried: 0, failed: 0, held: 0, lost: 0 };
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
  transform?: { transformer: Transformer; timeoutMs: number; module: string };
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
// forwards, and the destination's share of the breaker. It claims only what its in-flight limit has room
// for, so a slow destination holds its own leases and nobody else's.
class DestinationLane implements LaneReport {
  readonly releasing = "release a lease";
  readonly lane: Lane;
  private readonly batcher: Batcher;
  private readonly p: DestinationLaneParts;
  private readonly name: string;
  private readonly clock: Clock;
  private readonly policy: BreakerPolicy;
  private readonly here = new Map<string, RouteHere>();
  // Successes are gathered and added to the shared breaker once per tallyEveryMs; a failure goes at once,
  // with what was gathered before it, so the shared count of failures in a row stays in order. One tally
  // is written at a time, and the next takes everything gathered until it starts: a burst of failures (a
  // destination gone down with a lane's worth in flight) is one or two writes, not one each.
  private gathered: Tally = { done: 0, failed: 0 };
  private tallying: Promise<void> = Promise.resolve();
  private next: Promise<void> | undefined;

  constructor(parts: DestinationLaneParts) {
    this.p = parts;
    const { destination, options } = parts;
    const { inbox } = options;
    this.name = destination.name;
    this.clock = options.clock ?? realClock;
    this.policy = destination.breaker === false ? NEVER : destination.breaker;
    const pollMax = options.pollMaxMs ?? DEFAULTS.pollMaxMs;
    const max = destination.maxInFlight;
    // A destination with a rate is claimed at most a second's worth ahead: its tokens, not its claims, pace it.
    const most = destination.rate
      ? Math.max(2 * max, Math.ceil(destination.rate.perSecond))
      : Math.max(8 * max, DEFAULTS.claimBatch);
    const sizing = new AheadSizing(max, most);
    // Done marks go out with the next claim, or once a claim's worth has gathered, or when nothing else is
    // at the destination, or once the first has waited four times as long as a claim takes (at least
    // pollMax): every commit costs a sync to disk (on SQLite one that holds the event loop), so it should
    // serve many forwards, and the marks must not wait long either. Slots waiting for their wave's permit
    // are not "nothing at the destination": the forwards answered in one turn all free their slots before
    // the next wave starts, and each such moment committed its marks.
    // On PostgreSQL a claim commits in a transaction of its own beside the marks, so they gain nothing by
    // waiting for it: they go out at once, and the commit queue still gathers every mark of one event-loop
    // turn into one statement. A SIGKILLed worker then leaves fewer forwards answered but not marked, each
    // of which is sent again (docs/forwarding.md, "Duplicates after a crash"). One batch of them is in
    // flight at a time, though: those answered while it commits go out together once it has, rather than
    // each turn's few in a transaction of their own (every one a flush of the WAL).
    const eager = inbox.backend === "postgres";
    const batcher = (this.batcher = new Batcher({
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
      onAdded: () => this.lane.poke(),
      onSettled: () => this.lane.poke(),
    }));
    this.lane = new Lane({
      inbox,
      execute: this.execute,
      sizing,
      batcher,
      report: this,
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
      permit: (want) =>
        this.lane
          .persist("ask for a permit", () => inbox.permit(this.name, want, destination.rate))
          .catch((error: unknown) => {
            this.p.log(`${this.name}: could not ask for a permit (${message(error)}); trying again`, {
              level: "warn",
              destination: this.name,
            });
            return undefined;
          }),
      // A forward cut off by a stop releases its own lease (attempt()), once its request has ended.
      cutOff: "wait",
      drained: () => this.tally(),
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
      this.lane.due();
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
                transformer: this.p.transforms.get(setting.module),
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

  // execute is the lane's executor: one try, a span of the delivery's trace (traces.ts), ended once its
  // outcome is committed or known.
  private execute = async (lease: Lease, running: Running): Promise<void> => {
    const span = startProcess(lease, this.name);
    try {
      await span.run(() => this.attempt(lease, running, span));
    } finally {
      running.free();
      span.end("lost");
    }
  };

  private async attempt(lease: Lease, running: Running, span: Process): Promise<void> {
    const started = this.clock.now();
    // The destination joins the trace as this try's child: the span's traceparent, else the stored one.
    const traced = span.traceparent === undefined ? lease : { ...lease, traceparent: span.traceparent };
    // A transform reshapes this try in its process; what it cannot do fails the try, which is retried like any
    // other, but it says nothing of the destination, so the breaker does not count it.
    const { permanent4xx, transform: setting } = this.routeHere(lease.source);
    let shaped: Shaped | null | undefined;
    let transformFailed = false;
    let outcome: Outcome;
    if (setting) {
      try {
        shaped = await setting.transformer.run(transformInput(lease, this.name), setting.timeoutMs);
      } catch (error) {
        transformFailed = true;
        outcome = {
          kind: "retry",
          error: error instanceof TransformError ? error.message : `transform ${setting.module}: ${message(error)}`,
        };
      }
    }
    if (transformFailed) {
      outcome = outcome!;
    } else if (shaped === null) {
      // The transform said this destination does not take this delivery: done, nothing sent.
      outcome = { kind: "done" };
    } else {
      const sent = shaped ? { ...traced, body: shaped.body, contentType: shaped.contentType } : traced;
      outcome = await this.p.sender.send(sent, {
        signal: running.signal,
        permanent4xx,
        ...(shaped ? { headers: shaped.headers } : {}),
      });
    }
    // Before the error is stored, tallied, logged, traced or announced: a failed answer (or a transform's
    // error, which may quote the delivery's headers) may echo a secret.
    if (outcome.kind !== "done") outcome = { ...outcome, error: this.p.redactor.redact(outcome.error) };
    // The request slot is free once the destination has answered and, for a failure, once the breaker has
    // counted it: the next forward must not go out to a destination that just opened.
    if (outcome.kind === "done") running.free();
    this.p.options.metrics?.forwarded(this.name, outcome.kind, this.clock.now() - started);
    try {
      await this.settle(lease, running, span, outcome, { skipped: shaped === null, transformFailed });
    } catch (error) {
      span.end("retry", message(error));
      this.p.log(
        `${label(lease)} → ${this.name}: could not record the outcome (${message(error)}); it goes again when its lease expires`,
        { level: "error", source: lease.source, id: lease.id, destination: this.name, attempts: lease.attempts },
      );
    }
  }

  // settle writes a try's outcome: its done mark, its failure, or its lease given back.
  private async settle(
    lease: Lease,
    { signal, lane }: Running,
    span: Process,
    outcome: Outcome,
    { skipped, transformFailed }: { skipped: boolean; transformFailed: boolean },
  ): Promise<void> {
    const { inbox } = this.p.options;
    const { name } = this;
    // Cut off by a stopping worker: back to the queue as it was, no attempt spent.
    if (outcome.kind === "retry" && signal.aborted && lane.isStopping) {
      span.end("released");
      if (await lane.persist("release a lease", () => inbox.release(lease))) this.p.stats.held++;
      return;
    }
    if (outcome.kind === "done") return this.done(lease, lane, span, skipped);
    if (outcome.kind === "gone") {
      // The destination said it is gone: it is paused, and this delivery waits with it, its attempt given back.
      // Paused before the lease goes back, so that no claim finds the delivery due and the destination open.
      lane.hold(true);
      span.end("released", outcome.error);
      const paused = await lane.persist("pause", () => inbox.pause(name, outcome.error));
      if (await lane.persist("release a lease", () => inbox.release(lease))) this.p.stats.held++;
      if (paused) {
        this.p.say(
          { type: "destination.paused", data: { destination: name, reason: outcome.error } },
          `${name}: paused: ${outcome.error}; its deliveries wait until \`inbox.ts resume ${name}\``,
          "error",
        );
      }
      return;
    }
    const failure = await lane.persist("record a failure", () =>
      inbox.fail(
        lease,
        outcome.error,
        outcome.kind === "failed"
          ? { permanent: true }
          : outcome.afterMs !== undefined
            ? { retryAfterMs: outcome.afterMs }
            : {},
      ),
    );
    span.end(failure === undefined ? "lost" : failure.status === "failed" ? "failed" : "retry", outcome.error);
    // A try this worker cut off itself, its lease lost to a takeover (its event loop stalled past the lease),
    // says nothing of the destination either: counted, ten of them opened a healthy destination for every
    // worker, for a whole cool-down, whenever a loaded machine made the workers lose their leases.
    const cutOff = outcome.kind === "retry" && signal.aborted;
    // A permanent 4xx is the destination answering: its breaker counts it as up.
    if (outcome.kind === "failed") this.gathered.done++;
    else if (!transformFailed && !cutOff)
      await this.tally({ failed: 1, error: outcome.error, ...(lease.probe ? { probe: "failed" as const } : {}) });
    // A probe must still end, or the breaker waits on it: it ends as not proven, and the next probe tries again.
    else if (lease.probe) await this.tally({ probe: "failed", error: outcome.error });
    this.failed(lease, outcome, failure);
  }

  // done sends the done mark with the others gathered since (the lane's batcher), most often with the next
  // claim: one commit for many forwards, not one each.
  private async done(lease: Lease, lane: Lane, span: Process, skipped: boolean): Promise<void> {
    const { name } = this;
    const fields = { source: lease.source, id: lease.id, destination: name, attempts: lease.attempts };
    const held = await lane.persist("write a done mark", () => this.batcher.add(lease).then((sent) => sent.finished));
    span.end(held ? "done" : "lost");
    if (!held) {
      this.p.stats.lost++;
      this.p.log(
        `${label(lease)} → ${name}: forwarded, but the lease was lost meanwhile; another worker forwards it again (the webhook-id is the same)`,
        { level: "warn", ...fields },
      );
      return;
    }
    this.p.stats.done++;
    if (!skipped) this.gathered.done++;
    if (lease.probe && !skipped) await this.tally({ probe: "done" });
    this.p.log(`${label(lease)} → ${name} ${skipped ? "done: skipped by its transform, nothing sent" : "done"}`, {
      ...fields,
      status: "done",
    });
  }

  // failed says what a recorded failure came to: lost, set aside, or to be retried.
  private failed(lease: Lease, outcome: Outcome & { error: string }, failure: Failure | undefined): void {
    const { name } = this;
    const { stats, log, options } = this.p;
    const fields = { source: lease.source, id: lease.id, destination: name, attempts: lease.attempts };
    if (failure === undefined) {
      stats.lost++;
      log(`${label(lease)} → ${name} failed, but the lease was already lost: ${outcome.error}`, {
        level: "warn",
        ...fields,
      });
    } else if (failure.status === "failed") {
      stats.failed++;
      options.metrics?.failed(lease);
      this.p.say(
        {
          type: "delivery.set_aside",
          data: {
            source: lease.source,
            id: lease.id,
            destination: name,
            attempts: lease.attempts,
            error: outcome.error,
          },
        },
        `${label(lease)} → ${name} set aside${outcome.kind === "failed" ? " (permanent)" : ` after ${lease.attempts} attempts`}: ${outcome.error}`,
        "error",
      );
    } else {
      stats.retried++;
      options.metrics?.retried(lease);
      log(
        `${label(lease)} → ${name} failed (attempt ${lease.attempts}), retrying at ${new Date(failure.retryAt).toISOString()}: ${outcome.error}`,
        { level: "warn", ...fields, status: "received", retryAt: failure.retryAt },
      );
    }
  }

  dbError(error: unknown): void {
    this.p.options.metrics?.dbError("forward", error);
  }

  retrying(what: string, error: unknown): void {
    this.p.log(`${this.name}: could not ${what} (${message(error)}); trying again`, {
      level: "warn",
      destination: this.name,
      sqlstate: sqlstate(error),
    });
  }

  claimFailing(error: unknown): void {
    this.p.log(`${this.name}: could not claim (${message(error)}); trying again`, {
      level: "error",
      destination: this.name,
    });
  }

  claimingAgain(): void {
    this.p.log(`${this.name}: claiming again`, { destination: this.name });
  }

  claimed(lease: Lease): void {
    this.p.options.metrics?.claimed(lease);
  }

  // Set aside by a claim, as their last attempt's lease ran out: the worker that held them crashed or hung.
  setAside(list: SetAside[]): void {
    for (const d of list) {
      this.p.stats.failed++;
      this.p.options.metrics?.failed(d);
      this.p.say(
        { type: "delivery.set_aside", data: { ...d } },
        `${label(d)} → ${this.name} set aside after ${d.attempts} attempts: ${d.error}`,
        "error",
      );
    }
  }

  extendFailed(lease: Lease, error: unknown): void {
    this.p.log(`${label(lease)} → ${this.name}: could not extend the lease: ${message(error)}`, {
      level: "warn",
      destination: this.name,
      sqlstate: sqlstate(error),
    });
  }

  released(): void {
    this.p.stats.held++;
  }

  releaseFailed(lease: Lease, error: unknown): void {
    this.p.log(
      `${label(lease)} → ${this.name}: could not release (${message(error)}); it goes again when its lease expires`,
      { level: "warn", destination: this.name },
    );
  }
}

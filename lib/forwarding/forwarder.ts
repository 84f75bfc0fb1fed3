// forwarding/forwarder.ts: the worker's forwarding loop. One lane per destination, each with its own claims, its own
// requests in flight and its own breaker, so a destination that fails or hangs holds up only itself.
// worker.ts runs it beside the handler when the sources file names destinations:
//   INBOX_SOURCES=sources.json npx tsx worker.ts
// See docs/forwarding.md for the model, the answer table and the breaker.

import { DEFAULTS } from "../defaults.ts";
import { announce, httpSender, type OperatorEvent, type Outcome, type Sender } from "./forward.ts";
import { label, message, type Log } from "../log.ts";
import type { Metrics } from "../metrics.ts";
import { redactor, secretsOf, type Redactor, type Secret } from "../redact.ts";
import type { Destination, Forwarding, Route } from "../routing/routes.ts";
import type { BreakerChange, BreakerPolicy, Inbox, Lease, SetAside, Tally } from "../store.ts";
import { again, sqlstate } from "../errors.ts";
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
  /** The transforms' threads, when the caller keeps them between runs (transformBase is then theirs). @default threads of its own, stopped when forward returns */
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
  // One thread per transform module, shared by the lanes that use it (transform.ts).
  const transforms = options.transforms ?? new Transforms(options.transformBase ?? ".");
  try {
    await Promise.all(
      [...forwarding.destinations.values()].map((d) =>
        lane(d, senders.get(d.name)!, redactors.get(d.name)!, options, stats, log, say, transforms),
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

// lane forwards one destination's deliveries: it claims only what its in-flight limit has room for, so a
// slow destination holds its own leases and nobody else's.
async function lane(
  destination: Destination,
  sender: Sender,
  { redact }: Redactor,
  options: ForwarderOptions,
  stats: ForwardStats,
  log: Log,
  say: (event: OperatorEvent, line: string, level: "info" | "warn" | "error") => void,
  transforms: Transforms,
): Promise<void> {
  const { inbox, metrics } = options;
  const name = destination.name;
  const leaseMs = options.leaseMs ?? DEFAULTS.leaseMs;
  const pollMin = options.pollMinMs ?? DEFAULTS.pollMinMs;
  const pollMax = options.pollMaxMs ?? DEFAULTS.pollMaxMs;
  const heldPoll = Math.max(pollMax, options.heldPollMs ?? DEFAULTS.heldPollMs);
  const policy = destination.breaker === false ? NEVER : destination.breaker;
  const stop = options.signal;
  const active = new Map<Lease, AbortController>();
  let wake: () => void = () => {};
  const pause = (ms: number) =>
    new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, ms);
      wake = () => {
        clearTimeout(timer);
        resolve();
      };
    });
  stop?.addEventListener("abort", () => wake(), { once: true });
  // persist runs one of the lane's writes through again(): a database error that passes (a deadlock, a
  // dropped connection, a server restarting) is counted, logged once, and the write goes again, for as
  // long as a lease lasts. Meanwhile the lease stays active, so the heartbeat keeps it.
  const persist = <T>(what: string, write: () => Promise<T>): Promise<T> =>
    again(write, {
      forMs: leaseMs,
      minMs: pollMin,
      maxMs: 4 * pollMax,
      onError: (error, tries) => {
        metrics?.dbError("forward", error);
        if (tries === 1)
          log(`${name}: could not ${what} (${message(error)}); trying again`, {
            level: "warn",
            destination: name,
            sqlstate: sqlstate(error),
          });
      },
    });
  // giveBack releases a lease unsent, its attempt given back; one it cannot release runs out instead.
  const giveBack = (lease: Lease): Promise<void> =>
    persist("release a lease", () => inbox.release(lease))
      .then(
        (released) => void (released && stats.held++),
        (error: unknown) =>
          log(
            `${label(lease)} → ${name}: could not release (${message(error)}); it goes again when its lease expires`,
            { level: "warn", destination: name },
          ),
      )
      .finally(() => active.delete(lease));
  // Set aside by a claim, as their last attempt's lease ran out: the worker that held them crashed or hung.
  const gaveUp = (setAside: SetAside[]) => {
    for (const d of setAside) {
      stats.failed++;
      metrics?.failed(d);
      say(
        { type: "delivery.set_aside", data: { ...d } },
        `${label(d)} → ${name} set aside after ${d.attempts} attempts: ${d.error}`,
        "error",
      );
    }
  };
  // New deliveries (PostgreSQL's NOTIFY) wake a lane at once, unless its destination is open or paused.
  const unwake = inbox.onWake(() => holding || wake());

  // Successes are gathered and added to the shared breaker once per tallyEveryMs; a failure goes at once,
  // with what was gathered before it, so the shared count of failures in a row stays in order. One tally
  // is written at a time, and the next takes everything gathered until it starts: a burst of failures (a
  // destination gone down with a lane's worth in flight) is one or two writes, not one each.
  let gathered: Tally = { done: 0, failed: 0 };
  let tallying: Promise<void> = Promise.resolve();
  let next: Promise<void> | undefined;
  const tally = (extra?: Partial<Tally>): Promise<void> => {
    const error = extra?.error ?? gathered.error;
    const probe = extra?.probe ?? gathered.probe;
    gathered = {
      done: gathered.done,
      failed: gathered.failed + (extra?.failed ?? 0),
      ...(error ? { error } : {}),
      ...(probe ? { probe } : {}),
    };
    next ??= tallying = tallying.then(() => {
      next = undefined;
      const t = gathered;
      gathered = { done: 0, failed: 0 };
      if (t.done === 0 && t.failed === 0 && !t.probe) return;
      return inbox.tally(name, t, policy).then(
        (change) => void (change && announceChange(change)),
        (error: unknown) =>
          log(`${name}: could not tally the breaker: ${message(error)}`, { level: "warn", destination: name }),
      );
    });
    return next;
  };
  const announceChange = (change: BreakerChange) => {
    hold(change.change === "opened");
    if (change.change === "opened") {
      const why =
        change.failures >= policy.failures
          ? `${change.failures} failures in a row`
          : `${Math.round((change.rate ?? 0) * 100)}% of tries failed`;
      say(
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
    } else {
      say(
        { type: "destination.closed", data: { destination: name } },
        `${name}: breaker closed, the probe got through; forwarding again`,
        "info",
      );
    }
  };
  const ticker = setInterval(() => void tally(), options.tallyEveryMs ?? DEFAULTS.tallyEveryMs);
  const heartbeat = setInterval(
    () => {
      for (const [lease, controller] of active) {
        inbox.extend(lease, leaseMs).then(
          (held) => {
            if (!held && !controller.signal.aborted) controller.abort(new Error("the lease was lost"));
          },
          (error: unknown) => {
            metrics?.dbError("forward", error);
            log(`${label(lease)} → ${name}: could not extend the lease: ${message(error)}`, {
              level: "warn",
              destination: name,
              sqlstate: sqlstate(error),
            });
          },
        );
      }
    },
    Math.max(1, Math.floor(leaseMs / 3)),
  );

  // Forwards answered 2xx whose done mark is not yet sent; the loop sends them together.
  const answered: { lease: Lease; resolve: (held: boolean) => void; reject: (error: unknown) => void }[] = [];
  // Set when this lane saw its destination open or pause; a claim begun after that which gets leases
  // clears it (one begun before may have read the destination's row before it changed).
  let holding = false;
  let heldAt = 0;
  const hold = (on: boolean) => {
    holding = on;
    if (on) heldAt = performance.now();
  };
  // Claimed leases waiting for one of the lane's maxInFlight request slots, and requests at the destination.
  const queued: Lease[] = [];
  let sending = 0;
  // Claim ahead: a claim goes out when fewer than half of `ahead` leases wait for a slot, and takes enough
  // for `ahead` to wait again, so one claim (one transaction, with the done marks gathered since) serves
  // many forwards and the slots never wait for a claim. `ahead` is at least two lanes' worth (every slot
  // may free up while a claim commits) and doubles, up to `most`, when the lane ran dry while a claim was
  // out (a PostgreSQL claim takes round trips and a commit) or when claims took more than a quarter of the
  // lane's time (each is a sync to disk, on SQLite one that holds the event loop); it halves again when
  // they take less than a sixteenth.
  const max = destination.maxInFlight;
  // A destination with a rate is claimed at most a second's worth ahead: its tokens, not its claims, pace it.
  const most = destination.rate
    ? Math.max(2 * max, Math.ceil(destination.rate.perSecond))
    : Math.max(8 * max, DEFAULTS.claimBatch);
  let ahead = 2 * max;
  let claiming = false;
  let starved = false;
  let lastClaimAt = 0;
  const adjust = (took: number, cycle: number, full: boolean) => {
    if (full && (starved || took > cycle / 4)) ahead = Math.min(most, 2 * ahead);
    else if (!starved && took < cycle / 16) ahead = Math.max(2 * max, Math.floor(ahead / 2));
  };
  // Each wave of forwards starts only once permit() has said the destination is not paused and, with a
  // rate, has taken the wave's tokens: at the moment they go out, not when they were claimed (lanes claim
  // ahead, and forwards taken at claim time bunched at the destination). One permit is asked at a time;
  // slots that free up meanwhile join the next wave.
  // gate is the permit being asked, or the timer of the next ask; either way, send() waits for it.
  let gate: "asking" | NodeJS.Timeout | undefined;
  const later = (ms: number) => {
    gate = setTimeout(() => {
      gate = undefined;
      send();
    }, ms);
  };
  const send = () => {
    // Leases claimed before the destination opened or paused go back untouched, their attempt given back.
    if (holding) for (const lease of queued.splice(0)) void giveBack(lease);
    const want = Math.min(max - sending, queued.length);
    if (claiming && queued.length === 0 && sending < max) starved = true;
    if (want <= 0 || gate !== undefined || stop?.aborted) return;
    // The permit is asked at the end of this turn of the event loop, so that every slot freed in it (answers
    // come in together) joins one wave: one read for them all rather than one each. On SQLite each was a
    // read transaction of its own, about 20 µs of locking, asked for nearly every forward.
    gate = "asking";
    setImmediate(ask);
  };
  const ask = () => {
    const want = Math.min(max - sending, queued.length);
    if (want <= 0 || holding || stop?.aborted) {
      gate = undefined;
      send();
      return;
    }
    persist("ask for a permit", () => inbox.permit(name, want, destination.rate)).then(
      (permit) => {
        gate = undefined;
        if (permit.paused) hold(true);
        for (let i = 0; i < permit.granted && queued.length > 0 && !holding && !stop?.aborted; i++)
          start(queued.shift()!);
        if (permit.granted < want && !permit.paused) later(permit.waitMs);
        send();
      },
      (error: unknown) => {
        gate = undefined;
        log(`${name}: could not ask for a permit (${message(error)}); trying again`, {
          level: "warn",
          destination: name,
        });
        later(pollMax);
      },
    );
  };
  const start = (lease: Lease) => {
    sending++;
    // The slot is freed once, when the destination has answered (a success) or the outcome is written.
    let freed = false;
    const free = () => {
      if (freed) return;
      freed = true;
      sending--;
      send();
    };
    // one() frees the slot itself, at the latest when it ends.
    void one(lease, active.get(lease)!, free).finally(() => {
      active.delete(lease);
      wake();
    });
  };
  // Done marks go out with the next claim, or once a claim's worth has gathered, or when nothing else is
  // at the destination, or once the first has waited four times as long as a claim takes (at least
  // pollMax): every commit costs a sync to disk (on SQLite one that holds the event loop), so it should
  // serve many forwards, and the marks must not wait long either.
  let answeredAt = 0;
  let claimTook = 0;
  // On PostgreSQL a claim commits in a transaction of its own beside the marks, so they gain nothing by
  // waiting for it: they go out at once, and the commit queue still gathers every mark of one event-loop
  // turn into one statement. A SIGKILLed worker then leaves fewer forwards answered but not marked, each
  // of which is sent again (docs/forwarding.md, "Duplicates after a crash").
  // One batch of them is in flight at a time, though: those answered while it commits go out together once
  // it has, rather than each turn's few in a transaction of their own (every one a flush of the WAL).
  const eager = inbox.backend === "postgres";
  let marking = false;
  const markDone = (now: boolean) => {
    if (answered.length === 0) return;
    // Slots waiting for their wave's permit are not "nothing at the destination": the forwards answered in
    // one turn all free their slots before the next wave starts, and each such moment committed its marks.
    const busy = sending > 0 || gate !== undefined;
    if (
      !now &&
      !eager &&
      answered.length < ahead &&
      busy &&
      performance.now() - answeredAt < Math.max(pollMax, 4 * claimTook)
    )
      return;
    if (!now && eager && marking) return;
    const batch = answered.splice(0);
    let left = batch.length;
    marking = true;
    for (const a of batch) {
      inbox
        .finish(a.lease)
        .then(a.resolve, a.reject)
        .finally(() => {
          if (--left > 0) return;
          marking = false;
          wake();
        });
    }
  };
  // What a source's route here says, looked up once per source rather than at every forward: whether a 4xx
  // is final, and the transform (its route's, else the destination's, else none) with its thread.
  const here = new Map<
    string,
    { permanent4xx: boolean; transform?: { thread: Transformer; timeoutMs: number; module: string } }
  >();
  const routeHere = (source: string) => {
    let found = here.get(source);
    if (!found) {
      const route = options.routes?.get(source)?.find((r) => r.to === name);
      const setting = route?.transform ?? destination.transform;
      found = {
        permanent4xx: route?.permanent4xx ?? false,
        ...(setting
          ? {
              transform: {
                thread: transforms.get(setting.module),
                timeoutMs: setting.timeoutMs,
                module: setting.module,
              },
            }
          : {}),
      };
      here.set(source, found);
    }
    return found;
  };

  async function one(lease: Lease, controller: AbortController, free: () => void): Promise<void> {
    // Each try is a span of the delivery's trace (traces.ts), ended once its outcome is committed or known.
    const span = startProcess(lease, name);
    try {
      await span.run(() => attempt(lease, controller, free, span));
    } finally {
      free();
      span.end("lost");
    }
  }

  async function attempt(lease: Lease, controller: AbortController, free: () => void, span: Process): Promise<void> {
    const fields = { source: lease.source, id: lease.id, destination: name, attempts: lease.attempts };
    const started = performance.now();
    // The destination joins the trace as this try's child: the span's traceparent, else the stored one.
    const traced = span.traceparent === undefined ? lease : { ...lease, traceparent: span.traceparent };
    // A transform reshapes this try in its thread; what it cannot do fails the try, which is retried like any
    // other, but it says nothing of the destination, so the breaker does not count it.
    const { permanent4xx, transform: setting } = routeHere(lease.source);
    let shaped: Shaped | null | undefined;
    let transformFailed = false;
    let outcome: Outcome;
    if (setting) {
      try {
        shaped = await setting.thread.run(transformInput(lease, name), setting.timeoutMs);
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
      outcome = await sender.send(sent, {
        signal: controller.signal,
        permanent4xx,
        ...(shaped ? { headers: shaped.headers } : {}),
      });
    }
    const skipped = shaped === null;
    // Before the error is stored, tallied, logged, traced or announced: a failed answer (or a transform's
    // error, which may quote the delivery's headers) may echo a secret.
    if (outcome.kind !== "done") outcome = { ...outcome, error: redact(outcome.error) };
    // The request slot is free once the destination has answered and, for a failure, once the breaker has
    // counted it: the next forward must not go out to a destination that just opened.
    if (outcome.kind === "done") free();
    metrics?.forwarded(name, outcome.kind, performance.now() - started);
    try {
      // Cut off by a stopping worker: back to the queue as it was, no attempt spent.
      if (outcome.kind === "retry" && controller.signal.aborted && stop?.aborted) {
        span.end("released");
        if (await persist("release a lease", () => inbox.release(lease))) stats.held++;
        return;
      }
      if (outcome.kind === "done") {
        // The done mark waits to go out with the others gathered since (see markDone), most often with the
        // next claim: one commit for many forwards, not one each.
        const held = await persist(
          "write a done mark",
          () =>
            new Promise<boolean>((resolve, reject) => {
              if (answered.length === 0) answeredAt = performance.now();
              answered.push({ lease, resolve, reject });
              wake();
            }),
        );
        span.end(held ? "done" : "lost");
        if (held) {
          stats.done++;
          if (!skipped) gathered.done++;
          if (lease.probe && !skipped) await tally({ probe: "done" });
          log(`${label(lease)} → ${name} ${skipped ? "done: skipped by its transform, nothing sent" : "done"}`, {
            ...fields,
            status: "done",
          });
        } else {
          stats.lost++;
          log(
            `${label(lease)} → ${name}: forwarded, but the lease was lost meanwhile; another worker forwards it again (the webhook-id is the same)`,
            { level: "warn", ...fields },
          );
        }
        return;
      }
      if (outcome.kind === "gone") {
        // The destination said it is gone: it is paused, and this delivery waits with it, its attempt given back.
        // Paused before the lease goes back, so that no claim finds the delivery due and the destination open.
        hold(true);
        span.end("released", outcome.error);
        const paused = await persist("pause", () => inbox.pause(name, outcome.error));
        if (await persist("release a lease", () => inbox.release(lease))) stats.held++;
        if (paused) {
          say(
            { type: "destination.paused", data: { destination: name, reason: outcome.error } },
            `${name}: paused: ${outcome.error}; its deliveries wait until \`inbox.ts resume ${name}\``,
            "error",
          );
        }
        return;
      }
      const failure = await persist("record a failure", () =>
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
      const cutOff = outcome.kind === "retry" && controller.signal.aborted;
      // A permanent 4xx is the destination answering: its breaker counts it as up.
      if (outcome.kind === "failed") gathered.done++;
      else if (!transformFailed && !cutOff)
        await tally({ failed: 1, error: outcome.error, ...(lease.probe ? { probe: "failed" as const } : {}) });
      // A probe must still end, or the breaker waits on it: it ends as not proven, and the next probe tries again.
      else if (lease.probe) await tally({ probe: "failed", error: outcome.error });
      if (failure === undefined) {
        stats.lost++;
        log(`${label(lease)} → ${name} failed, but the lease was already lost: ${outcome.error}`, {
          level: "warn",
          ...fields,
        });
      } else if (failure.status === "failed") {
        stats.failed++;
        metrics?.failed(lease);
        say(
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
        metrics?.retried(lease);
        log(
          `${label(lease)} → ${name} failed (attempt ${lease.attempts}), retrying at ${new Date(failure.retryAt).toISOString()}: ${outcome.error}`,
          { level: "warn", ...fields, status: "received", retryAt: failure.retryAt },
        );
      }
    } catch (error) {
      span.end("retry", message(error));
      log(
        `${label(lease)} → ${name}: could not record the outcome (${message(error)}); it goes again when its lease expires`,
        { level: "error", ...fields },
      );
    }
  }

  try {
    let delay = pollMin;
    let claimFailing = false;
    while (!stop?.aborted) {
      send();
      // A lease whose request is over takes no room: the claim goes out with its done mark, in the same
      // transaction on SQLite and beside it on PostgreSQL, rather than in a commit of its own after it.
      const held = queued.length + sending;
      const room = ahead + max - held;
      const worth = held === 0 || queued.length < ahead / 2;
      let leases: Lease[] = [];
      const claimedAt = performance.now();
      markDone(worth);
      if (worth) {
        try {
          claiming = true;
          starved = false;
          leases = await inbox.claimBatch(room, leaseMs, { destination: name, onSetAside: gaveUp });
          claiming = false;
          claimTook = performance.now() - claimedAt;
          adjust(claimTook, claimedAt - lastClaimAt, leases.length === room);
          lastClaimAt = claimedAt;
          if (claimFailing) log(`${name}: claiming again`, { destination: name });
          claimFailing = false;
        } catch (error) {
          claiming = false;
          metrics?.dbError("forward", error);
          if (options.once) throw error;
          if (!claimFailing)
            log(`${name}: could not claim (${message(error)}); trying again`, { level: "error", destination: name });
          claimFailing = true;
          await pause(pollMax);
          continue;
        }
      }
      if (leases.length > 0 && claimedAt > heldAt) hold(false);
      for (const lease of leases) {
        active.set(lease, new AbortController());
        metrics?.claimed(lease);
        queued.push(lease);
      }
      send();
      if (leases.length > 0) {
        delay = pollMin;
        continue;
      }
      if (options.once && active.size === 0) break;
      await pause(holding ? heldPoll : worth ? delay : pollMax);
      if (worth) delay = Math.min(pollMax, Math.max(1, delay * 2));
    }
    // Leases not yet sent go straight back; forwards in flight get the grace period, and what outlives it
    // is cut off and released. Done marks keep going out meanwhile.
    await Promise.all(queued.splice(0).map(giveBack));
    const deadline = Date.now() + (options.shutdownGraceMs ?? DEFAULTS.shutdownGraceMs);
    while (active.size > 0 && Date.now() < deadline) {
      markDone(true);
      await pause(pollMax);
    }
    for (const controller of active.values()) controller.abort(new Error("the worker is stopping"));
    while (active.size > 0) {
      markDone(true);
      await pause(pollMax);
    }
    await tally();
  } finally {
    clearInterval(ticker);
    clearInterval(heartbeat);
    if (gate !== "asking") clearTimeout(gate);
    unwake();
  }
}

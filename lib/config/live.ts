// config/live.ts: a worker's forwarding, swapped for a new configuration while the worker runs. Each
// version runs as a generation of lanes (forwarding/forwarder.ts forward()); a new version is checked
// whole first (its secrets, its transforms loaded, its broker clients), then the old generation stops as
// at shutdown (leases not started go back, forwards in flight finish) and the new one starts.

import { missingClient, brokerSender } from "../brokers.ts";
import type { Sender } from "../forwarding/forward.ts";
import { checkTransforms, Transforms, type TransformLimits } from "../forwarding/transform.ts";
import { message } from "../log.ts";
import type { StoredConfig } from "../store.ts";
import { type Host, type Loaded, loadVersion, transformDrift } from "./config.ts";

/** Prepared is a configuration checked whole and ready to run: its parts, its transforms' threads loaded, its brokers' senders. */
export interface Prepared {
  version: number;
  loaded: Loaded;
  transforms: Transforms | undefined;
  senders: Map<string, Sender>;
}

/** Start runs one generation's lanes until its signal aborts (worker.ts calls forward()). */
export type Start = (prepared: Prepared, signal: AbortSignal) => Promise<unknown>;

/**
 * prepare checks a stored configuration as a worker would run it: the trust rule on the parts the API wrote,
 * every secret read (the environment's, the store's opened; a source's signing secret only where it is set:
 * the worker verifies none, and redacts those it knows), each transform the same as applied
 * (transformDrift) and loaded, each broker's client installed. It returns the reason it cannot be run, or the
 * Prepared parts (whose threads letGo() lets go of).
 */
export async function prepare(
  config: Pick<StoredConfig, "version" | "document" | "transforms"> & Partial<Pick<StoredConfig, "trust" | "way">>,
  host: Host,
  base: string,
  limits: TransformLimits = {},
): Promise<Prepared | string> {
  let loaded: Loaded;
  try {
    // The worker's checks: a source's signing secret only where it is set (config.ts, SecretChecks).
    loaded = await loadVersion(config, host, { verify: false });
  } catch (error) {
    return message(error);
  }
  const drift = transformDrift(config.transforms, base);
  if (drift) return drift;
  for (const [name, broker] of loaded.brokers) {
    const missing = await missingClient(broker.type, name);
    if (missing !== undefined) return missing;
  }
  // Each module's process is checked against the hash applied whenever it starts, a respawn included.
  const transforms =
    loaded.uses.length > 0 ? new Transforms(base, { ...limits, applied: config.transforms }) : undefined;
  const wrong = transforms ? await checkTransforms(loaded.uses, transforms) : undefined;
  if (wrong) {
    await transforms?.close();
    return wrong;
  }
  const senders = new Map<string, Sender>();
  for (const [name, broker] of loaded.brokers) senders.set(name, brokerSender(broker));
  return { version: config.version, loaded, transforms, senders };
}

/** unconfigured is what a worker runs on an inbox with no configuration: the handler alone, no destinations. */
export function unconfigured(): Prepared {
  return {
    version: 0,
    loaded: {
      sources: new Map(),
      routes: new Map(),
      forwarding: { destinations: new Map() },
      brokers: new Map(),
      secrets: [],
      uses: [],
    },
    transforms: undefined,
    senders: new Map(),
  };
}

/** letGo lets go of what a Prepared holds: its transforms' threads and its brokers' connections. */
export async function letGo(prepared: Prepared): Promise<void> {
  await Promise.all([...[...prepared.senders.values()].map((s) => s.close()), prepared.transforms?.close()]);
}

/** LiveForwarding runs one generation of forwarding lanes at a time, and swaps it for the next. */
export class LiveForwarding {
  private readonly start: Start;
  private readonly stop: AbortSignal;
  private running: { prepared: Prepared; controller: AbortController; done: Promise<void> } | undefined;
  private readonly all: Promise<void>[] = [];
  private readonly once: boolean;

  /** once: each generation drains what is due and ends, as worker.ts --once does. */
  constructor(start: Start, stop: AbortSignal, once = false) {
    this.start = start;
    this.stop = stop;
    this.once = once;
  }

  /** version is the configuration version the lanes run now, or undefined before the first. */
  get version(): number | undefined {
    return this.running?.prepared.version;
  }

  /**
   * run stops the generation running (no more claims from now; what waits goes back; what is in flight
   * finishes), and starts one for prepared, whose lanes claim beside the old ones' last forwards: a lease
   * is held by one of them only, so none is lost or sent twice.
   */
  run(prepared: Prepared): void {
    const old = this.running;
    old?.controller.abort();
    const controller = new AbortController();
    const signal = AbortSignal.any([this.stop, controller.signal]);
    const done = (async () => {
      try {
        if (prepared.loaded.forwarding.destinations.size > 0) await this.start(prepared, signal);
        else if (!this.once)
          await new Promise<void>((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
      } finally {
        await letGo(prepared);
      }
    })();
    this.running = { prepared, controller, done };
    this.all.push(done);
  }

  /** finished settles once every generation has stopped (after the stop signal), rejecting if one failed. */
  async finished(): Promise<void> {
    let seen = 0;
    while (seen < this.all.length) {
      const now = this.all.length;
      await Promise.all(this.all.slice(seen));
      seen = now;
    }
  }
}

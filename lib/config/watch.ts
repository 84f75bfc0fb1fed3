// config/watch.ts: how a running receiver or worker learns of a configuration applied elsewhere, or of a
// secret of the store set or deleted (its values open again). On PostgreSQL the commit's NOTIFY ("config")
// wakes it at once; on both backends a read of both versions on a timer (DEFAULTS.configCheckMs) catches what
// a dropped LISTEN connection missed. Time is the clock given. See docs/config.md.

import { DEFAULTS } from "../defaults.ts";
import type { Clock } from "../lease/clock.ts";
import { message } from "../log.ts";
import type { Inbox, StoredConfig } from "../store.ts";

/** WatchOptions configures watchConfig(). */
export interface WatchOptions {
  clock: Clock;
  /** The version the caller runs now (0: none). */
  version: number;
  /**
   * Called with each newer version, one at a time, and with the version in force again when the secrets
   * changed (why says which); a throw is logged and the version is tried again at the next check.
   */
  onChange: (config: StoredConfig, why: "config" | "secrets") => Promise<void> | void;
  /** Told of a check that failed (a lost server): the caller keeps what it runs. */
  onError: (why: string) => void;
  /** @default DEFAULTS.configCheckMs */
  everyMs?: number;
}

/** watchConfig checks for a newer configuration on a timer and at every "config" NOTIFY; returns how to stop. */
export function watchConfig(inbox: Inbox, options: WatchOptions): () => void {
  let known = options.version;
  // The secrets' count of changes when watching began; undefined until first read.
  let secrets: number | undefined;
  let busy: Promise<void> | undefined;
  let again = false;
  let stopped = false;
  const check = (): void => {
    if (stopped) return;
    if (busy) {
      again = true;
      return;
    }
    busy = (async () => {
      try {
        const [version, sealed] = await Promise.all([inbox.configVersion(), inbox.secretsVersion()]);
        secrets ??= sealed;
        const reopen = sealed !== secrets;
        if ((version <= known && !reopen) || stopped) return;
        const config = await inbox.readConfig();
        if (!config || (config.version <= known && !reopen)) return;
        await options.onChange(config, config.version > known ? "config" : "secrets");
        known = config.version;
        secrets = sealed;
      } catch (error) {
        options.onError(message(error));
      }
    })().finally(() => {
      busy = undefined;
      if (again) {
        again = false;
        check();
      }
    });
  };
  // Read now, not at the first tick: a secret changed in between would otherwise go unseen.
  inbox.secretsVersion().then(
    (v) => void (secrets ??= v),
    () => {},
  );
  const stopTimer = options.clock.every(options.everyMs ?? DEFAULTS.configCheckMs, check);
  const stopWake = inbox.onWake((payload) => payload === "config" && check());
  return () => {
    stopped = true;
    stopTimer();
    stopWake();
  };
}

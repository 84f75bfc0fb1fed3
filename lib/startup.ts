// startup.ts: what every script does as it starts and stops, written once beneath them: the sources file read
// and checked, the SQLite file's start-up check and running mark, the configuration taken from the database
// (the file applied to it first) and watched, with SIGHUP to apply the file again, and the stop signals. A
// step that cannot go on throws a StartupError with its one line and exit code, which the script's main()
// catches once. receiver.ts, worker.ts, consumer.ts and admin.ts start through it. Not run on its own.

import { readFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import {
  applyText,
  type FileApply,
  type Host,
  hostOf,
  loadConfig,
  type Loaded,
  parseDocument,
  reapplyFile,
  type SecretChecks,
  secretNames,
  valuesFor,
} from "./config/config.ts";
import { watchConfig } from "./config/watch.ts";
import { spokenAs } from "./format.ts";
import { realClock } from "./lease/clock.ts";
import { message } from "./log.ts";
import { damagedButForced, damagedLine, running, startupCheck } from "./sqlite/backup.ts";
import type { Inbox, InboxOptions, StoredConfig } from "./store.ts";

/**
 * StartupError stops a script with one line and an exit code: 2 for a mistake in its options, its sources or
 * its file (a restart cannot mend those, and systemd's RestartPreventExitStatus=2 stops it trying), 1 for a
 * runtime failure (a database it cannot reach, a port it cannot listen on).
 */
export class StartupError extends Error {
  override name = "StartupError";
  readonly code: 1 | 2;

  constructor(line: string, code: 1 | 2 = 2) {
    super(line);
    this.code = code;
  }
}

/** Say writes one line of a script's own (start-up, shutdown), in its log format. */
export type Say = (line: string, level?: "info" | "warn" | "error", fields?: Record<string, unknown>) => void;

/** Door is what a script hands down of inbox.ts, as lib/cli/ is handed it: no arrow runs back up to the door. */
export interface Door {
  connect(target: string, options?: InboxOptions): Promise<Inbox>;
  isPostgresUrl(target: string): boolean;
}

/** StartupOptions say which script is starting, how it speaks, and what it opens its database with. */
export interface StartupOptions {
  /** Its name, as its lines begin: "receiver", "worker", "consumer", "admin". */
  script: string;
  /** The argv its main() was given, for how its lines name the commands (format.ts spokenAs). */
  argv: readonly string[];
  say: Say;
  door: Door;
  /** Its environment: where `env:NAME` references are read; only an entry point reads it. */
  env: NodeJS.ProcessEnv;
  /** The file its --secrets-key-file names, the key to the secret store. @default INBOX_SECRETS_KEY */
  keyFile?: string | undefined;
  /** The ports it listens on, which no destination the API wrote may reach. @default none */
  ownPorts?: readonly number[];
}

/**
 * SourcesFile is a sources file read: its text, as it is applied, and what it says, checked whole; or, where
 * it names a secret of the store (secret:NAME), undefined until the inbox it is read from is open (loaded()).
 */
export interface SourcesFile {
  path: string;
  text: string;
  parsed: unknown;
  loaded: Loaded | undefined;
  /** The file's folder, where its relative transform paths start. */
  base: string;
}

/** Startup is one script's start and stop. */
export class Startup {
  /**
   * What this process brings to a configuration (config/config.ts): its environment, the operator's policy,
   * the secret store's key, and its inbox once open.
   */
  readonly host: Host;
  private readonly o: StartupOptions;
  // Removes this process's running mark beside a SQLite file, at its clean close.
  private unmark: () => void = () => {};

  /** A Startup reads the key and the policy its environment hands the configuration; one it cannot read stops start-up. */
  constructor(options: StartupOptions) {
    this.o = options;
    try {
      this.host = hostOf(options.env, {
        ...(options.keyFile === undefined ? {} : { keyFile: options.keyFile }),
        ...(options.ownPorts ? { ownPorts: options.ownPorts } : {}),
      });
    } catch (error) {
      throw new StartupError(`${options.script}: ${message(error)}`);
    }
  }

  /**
   * readSources reads the sources file and checks it whole, as config apply does, before the database is
   * opened, so that a mistake stops start-up with one line and nothing created; a file that names a secret
   * of the store is checked once the inbox is open (loaded()). What is read is what this script needs
   * (config/config.ts SecretChecks): with resolve false the destinations' secrets are checked for their shape
   * only, and only the sources' secrets of the store are opened. No line quotes the file's text: it may hold
   * a secret.
   */
  readSources(path: string, checks: SecretChecks): SourcesFile {
    const { script } = this.o;
    let text: string;
    let parsed: unknown;
    try {
      text = readFileSync(path, "utf8");
      parsed = parseDocument(text);
    } catch (error) {
      throw new StartupError(`${script}: cannot read the sources file ${path}: ${message(error)}`);
    }
    const file: SourcesFile = { path, text, parsed, loaded: undefined, base: dirname(resolve(path)) };
    if (secretNames(parsed, { sourcesOnly: checks.resolve === false }).length > 0) return file;
    try {
      return { ...file, loaded: loadConfig(parsed, this.host.env, checks) };
    } catch (error) {
      throw new StartupError(`${script}: ${path}: ${message(error)}`);
    }
  }

  /** loaded is a sources file checked whole, its secrets of the store opened from the inbox, once it is open. */
  async loaded(file: SourcesFile, checks: SecretChecks): Promise<Loaded> {
    if (file.loaded) return file.loaded;
    try {
      const values = await valuesFor(this.host, file.parsed, { sourcesOnly: checks.resolve === false });
      return loadConfig(file.parsed, values, checks);
    } catch (error) {
      throw new StartupError(`${this.o.script}: ${file.path}: ${message(error)}`);
    }
  }

  /**
   * open opens the database: on SQLite, after the start-up check when it is due (an unclean stop, or a day
   * since the last; it reads every page), before any port opens, since a delivery acked into a damaged file
   * may never be read back; then leaves this process's running mark beside the file until close().
   */
  async open(path: string, o: { skipCheck?: boolean; force?: boolean; connect?: InboxOptions } = {}): Promise<Inbox> {
    const { script, argv, say, door } = this.o;
    const sqlite = !door.isPostgresUrl(path);
    const damaged = o.skipCheck || !sqlite ? undefined : startupCheck(path).problem;
    if (damaged !== undefined && !o.force) throw new StartupError(spokenAs(argv)(damagedLine(script, path, damaged)));
    if (damaged !== undefined) say(spokenAs(argv)(damagedButForced(script, path, damaged)), "warn");
    const inbox = await this.database(() => door.connect(path, o.connect));
    // Removed at the clean close: left behind, it tells the next start-up check of an unclean stop.
    if (sqlite) this.unmark = running(path);
    // The secret store's values are read from it from now on.
    this.host.inbox = inbox;
    return inbox;
  }

  /** database runs a step on the database; one that fails stops start-up, exit 1. A StartupError goes as it is. */
  async database<T>(step: () => Promise<T>): Promise<T> {
    try {
      return await step();
    } catch (error) {
      if (error instanceof StartupError) throw error;
      throw new StartupError(`${this.o.script}: cannot use the database: ${message(error)}`, 1);
    }
  }

  /**
   * configure applies the sources file, if given, to the database (the configuration lives there:
   * docs/config.md), checked as this script needs it, and returns what the database then holds, or undefined
   * where it holds none. Applied again at each start, so a file changed while the script was down is taken up.
   */
  async configure(
    inbox: Inbox,
    file: SourcesFile | undefined,
    checks: SecretChecks,
  ): Promise<{ stored: StoredConfig | undefined; changes: string[] }> {
    let changes: string[] = [];
    if (file) {
      try {
        ({ changes } = await applyText(inbox, file.text, this.host, file.base, this.by("start", checks)));
      } catch (error) {
        throw new StartupError(`${this.o.script}: ${file.path}: ${message(error)}`);
      }
    }
    return { stored: await this.database(() => inbox.readConfig()), changes };
  }

  /**
   * watch takes up each configuration applied while the script runs (config/watch.ts: the commit's NOTIFY,
   * and a read of the version on a timer), through take(), which says its own line; and applies the
   * sources file again at SIGHUP, checked as at start. It returns how to stop both.
   */
  watch(
    inbox: Inbox,
    o: {
      version: number;
      sourcesFile: string | undefined;
      checks: SecretChecks;
      take: (config: StoredConfig) => Promise<void>;
    },
  ): () => void {
    const { script, say } = this.o;
    const unwatch = watchConfig(inbox, {
      clock: realClock,
      version: o.version,
      onChange: o.take,
      onError: (why) => say(`${script}: could not read the configuration's version (${why}); trying again`, "warn"),
    });
    const file = o.sourcesFile;
    const hangup = () =>
      void (file === undefined
        ? say("SIGHUP: no --sources file to apply again; nothing changed")
        : reapplyFile(inbox, file, this.host, this.by("sighup", o.checks)).then(({ line, error }) =>
            say(`SIGHUP: ${line}`, error ? "error" : "info"),
          ));
    process.on("SIGHUP", hangup);
    return () => {
      unwatch();
      process.off("SIGHUP", hangup);
    };
  }

  // by names this script as who applies its file, at its start or its SIGHUP, for the version and the audit log.
  private by(when: "start" | "sighup", checks: SecretChecks): FileApply {
    const { script } = this.o;
    return {
      actor: when === "start" ? `${script}.ts --sources` : `${script}.ts SIGHUP`,
      who: `${when}:${script}.ts`,
      ...checks,
    };
  }

  /** stopped settles with the name of the first SIGTERM or SIGINT; those after it are ignored. */
  stopped(): Promise<"SIGTERM" | "SIGINT"> {
    return new Promise((settle) => {
      const ignore = () => {};
      const on = (signal: "SIGTERM" | "SIGINT") => () => {
        // Still listened for, so that a second Ctrl-C during the drain does not kill the process.
        process.off("SIGTERM", term).off("SIGINT", int).on("SIGTERM", ignore).on("SIGINT", ignore);
        settle(signal);
      };
      const [term, int] = [on("SIGTERM"), on("SIGINT")];
      process.on("SIGTERM", term).on("SIGINT", int);
    });
  }

  /** close is the clean close's last step: the running mark goes, so the next start need not check the file. */
  close(): void {
    this.unmark();
    this.unmark = () => {};
  }
}

// lib/cli/command.ts: what every command of the operator's CLI (inbox.ts) is built from: the program,
// opening the --db inbox (refusing a path that is no inbox), the options and arguments several commands
// share, and the three kinds of error that end a command with one line and its exit code.
// A command is a function of a Cli that adds itself to cli.program; inbox.ts lists them in order.

import { existsSync } from "node:fs";
import { type Command, InvalidArgumentError } from "commander";
import { type Host, hostOf } from "../config/config.ts";
import { DEFAULTS } from "../defaults.ts";
import { parseDuration, parseWhen } from "../format.ts";
import { bodyWordsOf, parseBodyJson } from "../search.ts";
import { isInbox } from "../sqlite/schema.ts";
import { type Delivery, type Filter, type Inbox, type InboxOptions, STATUSES, type Status } from "../store.ts";

/** UsageError is a mistake on the command line: one line on stderr, exit 2. */
export class UsageError extends Error {}
/** NotFound is a lookup that matched nothing: one line on stderr, exit 1. */
export class NotFound extends Error {}
/** Refused is an operation that would not be safe now (a restore over a database in use): one line, exit 1. */
export class Refused extends Error {}

/** Cli is what a command is given: the program to add itself to, the way to the inbox, and the shared options. */
export interface Cli {
  program: Command;
  /** connect opens any target as inbox.ts's connect() does, creating a new one. */
  connect: (target: string) => Promise<Inbox>;
  /** target is the database a command's --db names, else INBOX_DB, else DEFAULTS.db. */
  target: (opts: { db?: string }) => string;
  /** requireInbox refuses a SQLite path that is no inbox yet. */
  requireInbox: (path: string) => void;
  /** isPostgresUrl tells a PostgreSQL URL from a SQLite path, as inbox.ts does. */
  isPostgresUrl: (target: string) => boolean;
  /** openTarget opens an inbox that must already exist, with the options given (the defaults if none). */
  openTarget: (path: string, options?: InboxOptions) => Promise<Inbox>;
  /** open opens the inbox a command's --db names, which must already exist, with the options given. */
  open: (opts: { db?: string }, options?: InboxOptions) => Promise<Inbox>;
  /** sqliteOnly refuses a command that is for SQLite on a postgres:// URL, saying what to use there. */
  sqliteOnly: (what: string, db: string) => void;
  /** withDb adds --db to a command. */
  withDb: (command: Command) => Command;
  /** withFilters adds the filter options every bulk command takes. */
  withFilters: (command: Command) => Command;
  /** positive parses a whole number of 1 or more. */
  positive: (value: string) => number;
  /** status parses a delivery's status. */
  status: (value: string) => Status;
  /** duration parses an age such as 7d. */
  duration: (value: string) => number;
  /** who names the person at the keyboard in the audit log: `cli:USER`. */
  who: () => string;
  /** withKey adds --secrets-key-file to a command: the key that opens (or seals) the secret store's values. */
  withKey: (command: Command) => Command;
  /** host is what the operator hands a configuration here (config/config.ts hostOf), with the inbox; a bad key is a UsageError. */
  host: (opts: { secretsKeyFile?: string }, inbox?: Inbox) => Host;
}

/** commandLine builds the Cli the commands share over program, with connect() and isPostgresUrl() from inbox.ts. */
export function commandLine(
  program: Command,
  door: {
    connect: (target: string, options?: InboxOptions) => Promise<Inbox>;
    isPostgresUrl: (target: string) => boolean;
  },
): Cli {
  const { connect, isPostgresUrl } = door;
  const positive = (value: string) => {
    const n = Number(value);
    if (!Number.isInteger(n) || n < 1) throw new InvalidArgumentError("expected a whole number of 1 or more.");
    return n;
  };
  const status = (value: string) => {
    if (!(STATUSES as readonly string[]).includes(value))
      throw new InvalidArgumentError(`expected one of ${STATUSES.join(", ")}.`);
    return value as Status;
  };
  const withDb = (command: Command) =>
    command.option("--db <path|url>", `database file, or a postgres:// URL (default: INBOX_DB, else ${DEFAULTS.db})`);
  // The command's own --db, else the one given before the command (inbox.ts --db X status).
  const target = (opts: { db?: string }) =>
    opts.db ?? program.opts<{ db?: string }>().db ?? process.env.INBOX_DB ?? DEFAULTS.db;
  // requireInbox refuses a SQLite path that is no inbox yet. Looking must not create: a typo in --db would
  // otherwise show an empty, healthy inbox. Nor convert: opening another program's database would switch
  // it to WAL and add our tables.
  const requireInbox = (path: string) => {
    if (!existsSync(path))
      throw new NotFound(`No inbox database at ${path} (use --db or INBOX_DB; inbox.ts init creates one).`);
    if (!isInbox(path))
      throw new NotFound(`${path} is not an inbox database: it has tables, but no deliveries (use --db or INBOX_DB).`);
  };
  const openTarget = async (path: string, options?: InboxOptions) => {
    if (!isPostgresUrl(path)) requireInbox(path);
    return connect(path, options);
  };
  const open = (opts: { db?: string }, options?: InboxOptions) => openTarget(target(opts), options);
  const sqliteOnly = (what: string, db: string) => {
    if (isPostgresUrl(db)) {
      throw new UsageError(
        `${what} is for a SQLite inbox; on PostgreSQL use pg_basebackup or pg_dump, and inbox.ts copy to move (docs/production.md).`,
      );
    }
  };
  const duration = (value: string) => {
    const ms = parseDuration(value);
    if (ms === undefined) throw new InvalidArgumentError("expected an age such as 30m, 12h, 7d or 2w.");
    return ms;
  };
  const when = (value: string) => {
    const ms = parseWhen(value, Date.now());
    if (ms === undefined)
      throw new InvalidArgumentError("expected an ISO date (2026-01-05, 2026-01-05T12:00:00Z) or an age ago (2h, 3d).");
    return ms;
  };
  // checked turns a parser that throws a TypeError into an option's, which commander reports as a usage error.
  const checked = (parse: (text: string) => unknown) => (value: string) => {
    try {
      parse(value);
    } catch (error) {
      throw new InvalidArgumentError(`${(error as Error).message.replace(/^\w+: /, "")}.`);
    }
    return value;
  };
  const withFilters = (command: Command) =>
    command
      .option("--source <name>", "only this source")
      .option("--type <type>", "only this event type")
      .option("--since <when>", "received at or after: an ISO date, or an age ago (2h, 3d)", when)
      .option("--until <when>", "received before: an ISO date, or an age ago", when)
      .option("--error-match <text>", "whose last error contains this text (any case)")
      .option(
        "--body-json <json>",
        'whose JSON body contains this JSON, through an index: \'{"data":{"object":{"customer":"cus_123"}}}\'',
        checked(parseBodyJson),
      )
      .option(
        "--body-words <words>",
        "whose JSON body holds each of these words in a string, number or boolean, through an index",
        checked(bodyWordsOf),
      )
      .option(
        "--body-contains <text>",
        "whose body contains this text; no index serves it, so list reads the last day's bodies unless --since is given",
      )
      .option("--destination <name>", 'only the rows going to this destination (the handler is "handler")');
  const who = () => `cli:${process.env.USER ?? process.env.LOGNAME ?? "unknown"}`;
  const withKey = (command: Command) =>
    command.option(
      "--secrets-key-file <file>",
      "the key that opens and seals the secret store's values, instead of INBOX_SECRETS_KEY",
    );
  const host = (opts: { secretsKeyFile?: string }, inbox?: Inbox) => {
    try {
      return hostOf(process.env, {
        ...(opts.secretsKeyFile === undefined ? {} : { keyFile: opts.secretsKeyFile }),
        ...(inbox ? { inbox } : {}),
      });
    } catch (error) {
      throw new UsageError(`${(error as Error).message}.`);
    }
  };
  return {
    program,
    connect,
    who,
    withKey,
    host,
    target,
    requireInbox,
    isPostgresUrl,
    openTarget,
    open,
    sqliteOnly,
    withDb,
    withFilters,
    positive,
    status,
    duration,
  };
}

/**
 * findRows finds one delivery by ID, with a row per route: --source settles it when two sources share an
 * ID, and --destination picks one route's row.
 */
export async function findRows(
  inbox: Inbox,
  id: string,
  source: string | undefined,
  destination?: string,
): Promise<Delivery[]> {
  const found = (await inbox.find(id, source)).filter(
    (d) => destination === undefined || d.destination === destination,
  );
  if (found.length === 0)
    throw new NotFound(
      `No delivery with ID ${id}${source ? ` in source ${source}` : ""}${destination ? ` for destination ${destination}` : ""}.`,
    );
  const sources = [...new Set(found.map((d) => d.source))];
  if (sources.length > 1) throw new UsageError(`ID ${id} exists in sources ${sources.join(", ")}; pass --source.`);
  return found;
}

/** CliFilters are the filter options every bulk command takes. */
export interface CliFilters {
  source?: string;
  type?: string;
  since?: number;
  until?: number;
  errorMatch?: string;
  bodyJson?: string;
  bodyWords?: string;
  bodyContains?: string;
  destination?: string;
}

/** filterOf turns the filter options given into the store's Filter. */
export function filterOf(opts: CliFilters): Filter {
  const filter: Filter = {};
  if (opts.destination !== undefined) filter.destination = opts.destination;
  if (opts.source !== undefined) filter.source = opts.source;
  if (opts.type !== undefined) filter.type = opts.type;
  if (opts.since !== undefined) filter.since = opts.since;
  if (opts.until !== undefined) filter.until = opts.until;
  if (opts.errorMatch !== undefined) filter.errorMatch = opts.errorMatch;
  if (opts.bodyJson !== undefined) filter.bodyJson = opts.bodyJson;
  if (opts.bodyWords !== undefined) filter.bodyWords = opts.bodyWords;
  if (opts.bodyContains !== undefined) filter.bodyContains = opts.bodyContains;
  return filter;
}

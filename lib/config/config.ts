// config/config.ts: the configuration kept in the inbox's database. A sources file is checked whole by the
// code that loads one at start-up (config/sources.ts loadSources, routing/routes.ts loadDestinations,
// brokers.ts), its transforms hashed, its difference from the version in force shown, and then swapped in
// by one applyConfig() transaction. See docs/config.md.

import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { dirname, isAbsolute, resolve, sep } from "node:path";
import { parseBrokerDestination, type BrokerDestination } from "../brokers.ts";
import { checkSecrets } from "../forwarding/forward.ts";
import { checkCode } from "../forwarding/transform.ts";
import { loadSources, type Source } from "./sources.ts";
import type { Reach } from "../reach.ts";
import { secretsOf, type Secret } from "../redact.ts";
import { referencesIn, type Values, withSecrets } from "../references.ts";
import { loadDestinations, type Forwarding, type Route } from "../routing/routes.ts";
import { destinationNames, REMOVED } from "../rows.ts";
import { DEFAULTS } from "../defaults.ts";
import { type Keyring, openSecrets, readKeyring } from "../secrets.ts";
import type { Audit, ConfigApplied, Inbox, StoredConfig, TransformCode, Way } from "../store.ts";
import {
  canonical,
  checkDocument,
  inTheClear,
  partsOf,
  type Policy,
  policyFrom,
  type Trust,
  trustOf,
} from "./trust.ts";

/** Loaded is a configuration as the scripts use it: sources, their routes, destinations, brokers, secrets and transforms. */
export interface Loaded {
  sources: Map<string, Source>;
  routes: Map<string, readonly Route[]>;
  forwarding: Forwarding;
  brokers: Map<string, BrokerDestination>;
  /** Every secret the document names, for redact.ts. */
  secrets: Secret[];
  /** Each use of a transform, and where the document names it: a module's path (run in a process when process), or code (then module is its `code:` name). */
  uses: { module: string; code?: string; process?: boolean; where: string }[];
}

/** Env is where `env:NAME` references are read from (and `secret:NAME`, once opened: references.ts). */
export type Env = Values;

/**
 * Host is what a process brings to a configuration: its environment, the operator's Policy for what the API's
 * parts may reach, and the key and the inbox to open the store's secrets with (none before the inbox is open).
 */
export interface Host {
  env: Env;
  policy: Policy;
  keyring?: Keyring;
  inbox?: Inbox;
}

/**
 * hostOf builds a script's Host from what its entry point read: its environment (INBOX_API_ENV,
 * INBOX_API_DESTINATIONS_ALLOW, INBOX_SECRETS_KEY, PORT), the key file its flag names, and the ports it listens
 * on, which join the receiver's and the page's among those no API-written destination reaches. A value that
 * cannot be read is a TypeError of one line.
 */
export function hostOf(
  env: Env,
  options: { keyFile?: string; ownPorts?: readonly number[]; inbox?: Inbox } = {},
): Host {
  const ports = [DEFAULTS.port, DEFAULTS.adminPort, ...(options.ownPorts ?? [])];
  if (env.PORT !== undefined && /^\d+$/.test(env.PORT)) ports.push(Number(env.PORT));
  const keyring = readKeyring({ file: options.keyFile, value: env.INBOX_SECRETS_KEY });
  return {
    env,
    policy: policyFrom(
      env,
      ports.filter((p) => p > 0),
    ),
    ...(keyring ? { keyring } : {}),
    ...(options.inbox ? { inbox: options.inbox } : {}),
  };
}

/**
 * secretNames lists the secrets of the store a document names (secret:NAME), each once; with sourcesOnly,
 * those its sources name, all that a receiver reads.
 */
export function secretNames(parsed: unknown, options: { sourcesOnly?: boolean } = {}): string[] {
  const parts = [...partsOf(parsed)].filter(([part]) => !options.sourcesOnly || part.startsWith("source "));
  const names = parts.flatMap(([, value]) =>
    referencesIn(value).flatMap(({ ref }) => (ref.kind === "secret" ? [ref.name] : [])),
  );
  return [...new Set(names)];
}

/**
 * valuesFor is where a document's references are read from in this process: its environment, and the
 * secrets it names (with sourcesOnly, its sources), opened. A secret this process cannot open (no key,
 * another key) is a TypeError of one line naming it; one the store does not hold is left for its setting to
 * say it is not set.
 */
export async function valuesFor(host: Host, parsed: unknown, options: { sourcesOnly?: boolean } = {}): Promise<Env> {
  const names = secretNames(parsed, options);
  if (names.length === 0 || !host.inbox) return host.env;
  return withSecrets(host.env, await openSecrets(host.inbox, names, host.keyring));
}

/** secretUsers names the parts of a document that read a secret of the store: `destination app`, `source st`. */
export function secretUsers(document: string, name: string): string[] {
  return [...partsOf(JSON.parse(document) as unknown)]
    .filter(([, value]) => referencesIn(value).some(({ ref }) => ref.kind === "secret" && ref.name === name))
    .map(([part]) => part);
}

/** trustIn is a stored version's Trust, every part named: its own entry, else the version's way. */
export function trustIn(parsed: unknown, stored: { trust?: Trust; way?: Way }): Trust {
  const out: Trust = {};
  for (const part of partsOf(parsed).keys()) out[part] = stored.trust?.[part] ?? stored.way ?? "operator";
  return out;
}

/**
 * loadVersion loads a stored version as the process that runs it: the trust rule checked on the parts the
 * API wrote (lib/config/trust.ts), the secrets it names opened, then loadConfig, each destination the API
 * set held to the Policy's reach. It throws a TypeError naming the first mistake.
 */
export async function loadVersion(
  config: Pick<StoredConfig, "document"> & Partial<Pick<StoredConfig, "trust" | "way">>,
  host: Host,
  options: SecretChecks = {},
): Promise<Loaded> {
  const parsed = parseDocument(config.document);
  const trust = trustIn(parsed, config);
  // Without resolve (the receiver) only the sources are read: only they are held to the rule, and opened.
  const sourcesOnly = options.resolve === false;
  await checkDocument(parsed, trust, host.policy, { addresses: "unhooked", sourcesOnly });
  const values = await valuesFor(host, parsed, { sourcesOnly });
  return loadConfig(parsed, values, { ...options, trust, reach: host.policy.reach });
}

/**
 * SecretChecks says which of a document's secrets are read from the environment, by who reads it: the
 * receiver verifies signatures but forwards nothing (resolve false), the worker forwards but verifies
 * nothing (verify false), the CLI and the API check both.
 */
export interface SecretChecks {
  /** Read every destination's secret, not only check its shape. @default true */
  resolve?: boolean;
  /** Read every source's signing secret; false: only those whose variable is set. @default true */
  verify?: boolean;
}

/**
 * parseDocument parses a sources file's text. Its error says where the JSON broke but quotes none of the
 * text, which may hold a secret (as readSourcesFile's).
 */
export function parseDocument(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch (error) {
    throw new Error(`not valid JSON${/ at position \d+/.exec((error as Error).message)?.[0] ?? ""}`);
  }
}

/** readDocument reads a sources file: its text, as it will be stored, and its JSON. */
export function readDocument(path: string): { text: string; parsed: unknown } {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (error) {
    throw new Error(`cannot read ${path}: ${(error as Error).message}`);
  }
  if (text.trim() === "") throw new Error(`${path} is empty`);
  try {
    return { text, parsed: parseDocument(text) };
  } catch (error) {
    throw new Error(`${path}: ${(error as Error).message}`);
  }
}

/**
 * loadConfig checks a parsed document whole, as the receiver and worker check a sources file at start-up,
 * and throws a TypeError naming the mistake (never a secret). With resolve false the destinations' secrets
 * are only checked for their shape (the receiver's and the CLI's case); the sources' are read, and with
 * verify false (the worker's case: it verifies no signature) only those whose variable is set. With trust
 * and reach, each HTTP destination (and $operator) the API wrote is held to reach at its connections.
 */
export function loadConfig(
  parsed: unknown,
  env: Env,
  options: SecretChecks & { trust?: Trust; reach?: Reach } = {},
): Loaded {
  const resolveSecrets = options.resolve ?? true;
  const sources = loadSources(parsed, env, { verify: options.verify ?? true });
  const brokers = new Map<string, BrokerDestination>();
  const forwarding = loadDestinations(parsed, env, {
    resolve: resolveSecrets,
    brokerCheck: (name, settings, where) =>
      void brokers.set(name, parseBrokerDestination(name, settings, where, env, resolveSecrets)),
  });
  if (resolveSecrets)
    for (const d of forwarding.destinations.values())
      if (d.kind === "http") checkSecrets(d.secrets, `destination ${JSON.stringify(d.name)}`);
  const { trust, reach } = options;
  if (trust && reach) {
    for (const d of forwarding.destinations.values())
      if (d.kind === "http" && trust[`destination ${d.name}`] === "api") d.reach = reach;
    if (forwarding.operator && trust.$operator === "api") forwarding.operator.reach = reach;
  }
  const list = [...sources.values()];
  const routes = new Map(list.map((s) => [s.name, s.routes ?? []]));
  const uses = [
    ...[...routes].flatMap(([source, rs]) =>
      rs
        .filter((r) => r.transform)
        .map((r) => ({
          module: r.transform!.module,
          ...(r.transform!.code === undefined ? {} : { code: r.transform!.code }),
          ...(r.transform!.process ? { process: true } : {}),
          where: `source ${JSON.stringify(source)}: route to ${r.to}`,
        })),
    ),
    ...[...forwarding.destinations.values()]
      .filter((d) => d.transform)
      .map((d) => ({
        module: d.transform!.module,
        ...(d.transform!.code === undefined ? {} : { code: d.transform!.code }),
        ...(d.transform!.process ? { process: true } : {}),
        where: `destination ${JSON.stringify(d.name)}`,
      })),
  ];
  const secrets = resolveSecrets ? secretsOf(forwarding, { sources: list, brokers: brokers.values() }) : [];
  return { sources, routes, forwarding, brokers, secrets, uses };
}

// hashTransforms keeps the code and SHA-256 of each transform a configuration uses: code the document holds as
// it is, a module read from base, which it must lie under (a path is the operator's file, beside the sources file).
function hashTransforms(uses: Loaded["uses"], base: string): Record<string, TransformCode> {
  const out: Record<string, TransformCode> = {};
  for (const { module, code: given, where } of uses) {
    if (out[module]) continue;
    let code: string;
    if (given !== undefined) code = given;
    else {
      const path = modulePath(module, base);
      if (path === undefined)
        throw new TypeError(
          `${where}: transform ${module} is outside the configuration's folder ${resolve(base)}; a module path is the operator's file, kept beside the sources file (or write {"code": "…"})`,
        );
      try {
        code = readFileSync(path, "utf8");
      } catch (error) {
        // A TypeError, as loadConfig's are: a path that names no module is a mistake in the document.
        throw new TypeError(`${where}: cannot read transform ${module}: ${(error as Error).message}`);
      }
    }
    out[module] = { sha256: createHash("sha256").update(code).digest("hex"), code };
  }
  return out;
}

/** modulePath is where a transform module lies: its path taken from base, or undefined when that is outside base. */
export function modulePath(module: string, base: string): string | undefined {
  const root = resolve(base);
  const path = isAbsolute(module) ? resolve(module) : resolve(root, module);
  return path.startsWith(root.endsWith(sep) ? root : root + sep) ? path : undefined;
}

/**
 * transformDrift says which transform module on this host is not the one applied (its SHA-256 differs, or
 * it cannot be read), or undefined when every one matches: a host runs only the version the database names.
 * Code the configuration holds cannot drift: every host reads it from the same row.
 */
export function transformDrift(stored: Record<string, TransformCode>, base: string): string | undefined {
  for (const [module, { sha256 }] of Object.entries(stored)) {
    if (module.startsWith("code:")) continue;
    let here: string;
    try {
      here = createHash("sha256")
        .update(readFileSync(isAbsolute(module) ? module : resolve(base, module)))
        .digest("hex");
    } catch (error) {
      return `transform ${module} cannot be read here: ${(error as Error).message}`;
    }
    if (here !== sha256)
      return `transform ${module} here (sha256 ${here.slice(0, 12)}) is not the one applied (sha256 ${sha256.slice(0, 12)})`;
  }
  return undefined;
}

// sections names a document's parts the difference is told by (each source, each destination, $operator),
// each as canonical JSON, so a file saved in another order is no change.
function sections(parsed: unknown): Map<string, string> {
  return new Map([...partsOf(parsed)].map(([part, value]) => [part, canonical(value)]));
}

/**
 * fieldChanges says what a change did to each part, down to the field, for the audit log:
 * `~ destination app: url http://a → http://b; headers.x-token env:A → secret:B`. A value that may be a
 * secret (one written in the clear, a header's, a URL's password) is never shown: only that it changed.
 */
export function fieldChanges(old: unknown, next: unknown): string[] {
  const before = partsOf(old);
  const after = partsOf(next);
  const lines: string[] = [];
  for (const [part, value] of after) {
    if (!before.has(part)) lines.push(`+ ${part}`);
    else if (canonical(before.get(part)) !== canonical(value)) {
      const was = leaves(before.get(part));
      const now = leaves(value);
      const fields = [...new Set([...was.keys(), ...now.keys()])]
        .filter((k) => was.get(k)?.raw !== now.get(k)?.raw)
        .map((k) => `${k} ${was.get(k)?.shown ?? "(none)"} → ${now.get(k)?.shown ?? "(none)"}`);
      lines.push(`~ ${part}: ${fields.join("; ")}`);
    }
  }
  for (const part of before.keys()) if (!after.has(part)) lines.push(`- ${part}`);
  return lines;
}

// leaves flattens a part's settings to the path of each value: the value, to compare, and what the audit log
// may show of it.
function leaves(
  value: unknown,
  path: string[] = [],
  out = new Map<string, { raw: string; shown: string }>(),
): Map<string, { raw: string; shown: string }> {
  if (typeof value === "object" && value !== null) {
    for (const [k, v] of Object.entries(value)) {
      const here = [...path, k];
      const raw = JSON.stringify(v) ?? "null";
      if (inTheClear(k, v)) out.set(here.join("."), { raw, shown: "(a secret, not shown)" });
      else if (path.at(-1) === "headers" && typeof v === "string" && !/^(env|secret):/.test(v))
        out.set(here.join("."), { raw, shown: "(a value, not shown)" });
      else leaves(v, here, out);
    }
    return out;
  }
  const shown = typeof value === "string" ? value : (JSON.stringify(value) ?? "null");
  out.set(path.join("."), {
    raw: JSON.stringify(value) ?? "null",
    shown: shown.length > 120 ? `${shown.slice(0, 117)}…` : shown,
  });
  return out;
}

// diffConfig lists what a new document changes, a line each: `+ destination b`, `- source old`,
// `~ destination a`, `~ transform ./t.ts (sha256 … → …)`. It names parts, never their values (secrets).
function diffConfig(
  old: { parsed: unknown; transforms: Record<string, TransformCode> } | undefined,
  next: { parsed: unknown; transforms: Record<string, TransformCode> },
): string[] {
  const before = sections(old?.parsed);
  const after = sections(next.parsed);
  const lines: string[] = [];
  for (const [name, value] of after)
    if (!before.has(name)) lines.push(`+ ${name}`);
    else if (before.get(name) !== value) lines.push(`~ ${name}`);
  for (const name of before.keys()) if (!after.has(name)) lines.push(`- ${name}`);
  const was = old?.transforms ?? {};
  for (const [module, { sha256 }] of Object.entries(next.transforms)) {
    const prior = was[module]?.sha256;
    if (prior === undefined) lines.push(`+ transform ${module} (sha256 ${sha256.slice(0, 12)})`);
    else if (prior !== sha256)
      lines.push(`~ transform ${module} (sha256 ${prior.slice(0, 12)} → ${sha256.slice(0, 12)})`);
  }
  for (const module of Object.keys(was)) if (!next.transforms[module]) lines.push(`- transform ${module}`);
  return lines;
}

// fieldLines is what the audit log says a change did: fieldChanges' lines, and diffConfig's of the transforms.
function fieldLines(was: unknown, parsed: unknown, changes: string[]): string[] {
  return [...fieldChanges(was, parsed), ...changes.filter((line) => / transform /.test(line))];
}

/**
 * versionChanges says what a stored version changed from another (undefined: from nothing), as the audit log
 * says a change: each part down to the field, each transform by its SHA-256, never a secret's value. The
 * history on the page and through the API shows it.
 */
export function versionChanges(
  before: Pick<StoredConfig, "document" | "transforms"> | undefined,
  after: Pick<StoredConfig, "document" | "transforms">,
): string[] {
  const was = before ? parseDocument(before.document) : undefined;
  const parsed = parseDocument(after.document);
  const old = before ? { parsed: was, transforms: before.transforms } : undefined;
  return fieldLines(was, parsed, diffConfig(old, { parsed, transforms: after.transforms }));
}

/** Plan is a checked document beside the version in force: what applying it would change. */
export interface Plan {
  text: string;
  loaded: Loaded;
  transforms: Record<string, TransformCode>;
  current: StoredConfig | undefined;
  /** diffConfig's lines; none when the document is the one in force. */
  changes: string[];
  /** fieldChanges' lines: what the audit log says it changed, down to the field. */
  fields: string[];
  /** Which way it came, and whose hand wrote each part (trust.ts). */
  way: Way;
  trust: Trust;
  /**
   * Destinations the document leaves out, with the rows that wait for each: those it removes now, and
   * (now false) those an earlier version removed that rows still wait for, which only --cancel-waiting touches.
   */
  removed: { destination: string; waiting: number; now: boolean }[];
}

/**
 * plan checks a document whole, as it came (way), and compares it with the version in force. It throws,
 * changing nothing, if anything in it is wrong: first the trust rule on the parts the API wrote (a name it
 * may not read is refused before anything reads it), then every part as a script checks it at start-up. base
 * is the folder its transforms' relative paths start from (the file's). With resolve (the CLI's, the API's
 * and the worker's) every destination secret is read and checked as the worker checks it; without (the
 * receiver's), only its shape, the destinations' secrets being the worker's. With verify false (the worker's,
 * which verifies no signature) a source's signing secret is read only where its variable is set.
 */
export async function plan(
  inbox: Inbox,
  text: string,
  host: Host,
  base: string,
  options: { way: Way } & SecretChecks,
): Promise<Plan> {
  const parsed = parseDocument(text);
  const current = await inbox.readConfig();
  const was = current ? (JSON.parse(current.document) as unknown) : undefined;
  const trust = trustOf(
    parsed,
    options.way,
    current && { parsed: was, trust: trustIn(was, current), way: current.way },
  );
  await checkDocument(parsed, trust, host.policy, { addresses: "all" });
  const loaded = loadConfig(
    parsed,
    await valuesFor({ ...host, inbox }, parsed, { sourcesOnly: options.resolve === false }),
    {
      resolve: options.resolve ?? true,
      verify: options.verify ?? true,
      trust,
      reach: host.policy.reach,
    },
  );
  const transforms = hashTransforms(loaded.uses, base);
  // Code must compile and define a transform in the sandbox, or the change is refused whole: a version a
  // worker cannot take up never reaches one.
  const wrong = await checkCode(
    loaded.uses.map((u) => (u.process || u.code !== undefined ? u : { ...u, code: transforms[u.module]!.code })),
  );
  if (wrong) throw new TypeError(wrong);
  const old = current ? { parsed: was, transforms: current.transforms } : undefined;
  const changes = diffConfig(old, { parsed, transforms });
  const fields = fieldLines(was, parsed, changes);
  // Gone: what the version in force names and this one does not, and what an earlier version removed
  // that rows still wait for (so --cancel-waiting can let them go later).
  const states = await inbox.destinations();
  const named = new Set(destinationNames(current?.document ?? "{}"));
  const gone = new Set(named);
  for (const d of states) if (d.pausedReason?.startsWith(REMOVED) && d.waiting + d.processing > 0) gone.add(d.name);
  for (const name of loaded.forwarding.destinations.keys()) gone.delete(name);
  const removed = [...gone].map((destination) => {
    const s = states.find((d) => d.name === destination);
    return { destination, waiting: (s?.waiting ?? 0) + (s?.processing ?? 0), now: named.has(destination) };
  });
  return { text, loaded, transforms, current, changes, fields, way: options.way, trust, removed };
}

/** auditTarget is what the audit log says a plan changes: the versions, and each part down to the field. */
export function auditTarget(p: Plan, what = "configuration"): string {
  const was = p.current?.version ?? 0;
  return `${what}: version ${was + 1} (was ${was}): ${p.fields.join("; ") || "no change"}`;
}

/**
 * apply swaps a plan's document in, in one transaction with its audit entry (when given), unless another
 * version was applied since it was made.
 */
export function apply(
  inbox: Inbox,
  p: Plan,
  options: { actor: string; cancelWaiting?: boolean; audit?: Audit },
): Promise<ConfigApplied> {
  return inbox.applyConfig(p.text, {
    actor: options.actor,
    way: p.way,
    trust: p.trust,
    expectedVersion: p.current?.version ?? 0,
    transforms: p.transforms,
    removed: p.removed.filter((r) => r.now || options.cancelWaiting).map((r) => r.destination),
    cancelWaiting: options.cancelWaiting ?? false,
    ...(options.audit ? { audit: options.audit, parts: p.changes.length } : {}),
  });
}

/** refusedLine says why applyConfig() refused, in a line for the operator. */
export function refusedLine(result: Exclude<ConfigApplied, { applied: true }>): string {
  if (result.reason === "version")
    return `another configuration (version ${result.version}) was applied meanwhile; nothing changed, look again and retry`;
  const list = result.waiting.map((w) => `${w.n} for ${w.destination}`).join(", ");
  return `deliveries still wait for a destination this removes (${list}); nothing changed. Let them finish, or pass --cancel-waiting to set them aside as failed`;
}

/** FileApply names who applies a file, for the version (actor) and the audit log (who: `start:SCRIPT`, `sighup:SCRIPT`). */
export interface FileApply {
  actor: string;
  who: string;
  /** Read and check the destinations' secrets (the worker), or their shape only (the receiver). @default true */
  resolve?: boolean;
  /** Read every source's signing secret; false (the worker): only those whose variable is set. @default true */
  verify?: boolean;
}

/**
 * applyText applies a sources file's text as the scripts do at start and on SIGHUP, the operator's way:
 * checked whole, then swapped in with its audit entry, planned again if another version lands meanwhile. It
 * returns the version in force and what changed (nothing when the text is the one in force), or throws why it
 * was refused, nothing changed.
 */
export async function applyText(
  inbox: Inbox,
  text: string,
  host: Host,
  base: string,
  by: FileApply,
): Promise<{ version: number; changes: string[] }> {
  for (let tries = 0; tries < 5; tries++) {
    const p = await plan(inbox, text, host, base, { way: "operator", resolve: by.resolve ?? true, verify: by.verify });
    if (p.changes.length === 0) return { version: p.current?.version ?? 0, changes: [] };
    const audit = { who: by.who, operation: "config apply", target: auditTarget(p) };
    const result = await apply(inbox, p, { actor: by.actor, audit });
    if (result.applied) return { version: result.version, changes: p.changes };
    if (result.reason === "waiting") throw new Error(refusedLine(result));
  }
  throw new Error("other configurations kept being applied meanwhile; nothing changed");
}

/**
 * reapplyFile applies a sources file again (a script's SIGHUP): a file that is missing, empty, half
 * written or wrong changes nothing. It returns the line to log, and whether that line is an error.
 */
export async function reapplyFile(
  inbox: Inbox,
  path: string,
  host: Host,
  by: FileApply,
): Promise<{ line: string; error: boolean }> {
  try {
    const { text } = readDocument(path);
    const applied = await applyText(inbox, text, host, dirname(resolve(path)), by);
    return applied.changes.length === 0
      ? { line: `${path}: no change from configuration version ${applied.version}`, error: false }
      : {
          line: `${path} applied as configuration version ${applied.version}: ${applied.changes.join(", ")}`,
          error: false,
        };
  } catch (error) {
    const why = (error as Error).message;
    const line = why.startsWith(path) ? why : `${path}: ${why}`;
    return { line: /nothing changed/.test(line) ? line : `${line}; nothing changed`, error: true };
  }
}

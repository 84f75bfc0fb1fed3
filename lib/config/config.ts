// config/config.ts: the configuration kept in the inbox's database. A sources file is checked whole by the
// code that loads one at start-up (providers.ts loadSources, routing/routes.ts loadDestinations,
// brokers.ts), its transforms hashed, its difference from the version in force shown, and then swapped in
// by one applyConfig() transaction. See docs/config.md.

import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { dirname, isAbsolute, resolve } from "node:path";
import { parseBrokerDestination, type BrokerDestination } from "../brokers.ts";
import { checkSecrets } from "../forwarding/forward.ts";
import { loadSources, type Source } from "../providers.ts";
import { secretsOf, type Secret } from "../redact.ts";
import { loadDestinations, type Forwarding, type Route } from "../routing/routes.ts";
import { destinationNames, REMOVED } from "../rows.ts";
import type { ConfigApplied, Inbox, StoredConfig, TransformCode } from "../store.ts";

/** Loaded is a configuration as the scripts use it: sources, their routes, destinations, brokers, secrets and transforms. */
export interface Loaded {
  sources: Map<string, Source>;
  routes: Map<string, readonly Route[]>;
  forwarding: Forwarding;
  brokers: Map<string, BrokerDestination>;
  /** Every secret the document names, for redact.ts. */
  secrets: Secret[];
  /** Each use of a transform module, and where the document names it. */
  uses: { module: string; where: string }[];
}

/** Env is where `env:NAME` references are read from. */
export type Env = Readonly<Record<string, string | undefined>>;

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
 * verify false (the worker's case: it verifies no signature) only those whose variable is set.
 */
export function loadConfig(parsed: unknown, env: Env, options: SecretChecks = {}): Loaded {
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
  const list = [...sources.values()];
  const routes = new Map(list.map((s) => [s.name, s.routes ?? []]));
  const uses = [
    ...[...routes].flatMap(([source, rs]) =>
      rs
        .filter((r) => r.transform)
        .map((r) => ({ module: r.transform!.module, where: `source ${JSON.stringify(source)}: route to ${r.to}` })),
    ),
    ...[...forwarding.destinations.values()]
      .filter((d) => d.transform)
      .map((d) => ({ module: d.transform!.module, where: `destination ${JSON.stringify(d.name)}` })),
  ];
  const secrets = resolveSecrets ? secretsOf(forwarding, { sources: list, brokers: brokers.values() }) : [];
  return { sources, routes, forwarding, brokers, secrets, uses };
}

// hashTransforms reads each transform module a configuration uses, from base, and keeps its code and SHA-256.
function hashTransforms(uses: Loaded["uses"], base: string): Record<string, TransformCode> {
  const out: Record<string, TransformCode> = {};
  for (const { module, where } of uses) {
    if (out[module]) continue;
    let code: string;
    try {
      code = readFileSync(isAbsolute(module) ? module : resolve(base, module), "utf8");
    } catch (error) {
      // A TypeError, as loadConfig's are: a path that names no module is a mistake in the document.
      throw new TypeError(`${where}: cannot read transform ${module}: ${(error as Error).message}`);
    }
    out[module] = { sha256: createHash("sha256").update(code).digest("hex"), code };
  }
  return out;
}

/**
 * transformDrift says which transform module on this host is not the one applied (its SHA-256 differs, or
 * it cannot be read), or undefined when every one matches: a host runs only the version the database names.
 */
export function transformDrift(stored: Record<string, TransformCode>, base: string): string | undefined {
  for (const [module, { sha256 }] of Object.entries(stored)) {
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

// sections names a document's parts the difference is told by: each source, each destination, $operator.
function sections(parsed: unknown): Map<string, string> {
  const out = new Map<string, string>();
  if (typeof parsed !== "object" || parsed === null) return out;
  for (const [key, value] of Object.entries(parsed)) {
    if (key === "$destinations" && typeof value === "object" && value !== null)
      for (const [name, d] of Object.entries(value)) out.set(`destination ${name}`, canonical(d));
    else out.set(key.startsWith("$") ? key : `source ${key}`, canonical(value));
  }
  return out;
}

// canonical is a JSON text with its keys sorted, so a file saved in another order is no change.
function canonical(value: unknown): string {
  return JSON.stringify(value, (_key, v: unknown) =>
    typeof v === "object" && v !== null && !Array.isArray(v)
      ? Object.fromEntries(Object.entries(v).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)))
      : v,
  );
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

/** Plan is a checked document beside the version in force: what applying it would change. */
export interface Plan {
  text: string;
  loaded: Loaded;
  transforms: Record<string, TransformCode>;
  current: StoredConfig | undefined;
  /** diffConfig's lines; none when the document is the one in force. */
  changes: string[];
  /**
   * Destinations the document leaves out, with the rows that wait for each: those it removes now, and
   * (now false) those an earlier version removed that rows still wait for, which only --cancel-waiting touches.
   */
  removed: { destination: string; waiting: number; now: boolean }[];
}

/**
 * plan checks a document whole and compares it with the version in force. It throws, changing nothing, if
 * anything in it is wrong. base is the folder its transforms' relative paths start from (the file's). checks
 * says which secrets are read from env (SecretChecks): all of them for the CLI and the API.
 */
export async function plan(
  inbox: Inbox,
  text: string,
  env: Env,
  base: string,
  checks: SecretChecks = {},
): Promise<Plan> {
  const parsed = parseDocument(text);
  const loaded = loadConfig(parsed, env, checks);
  const transforms = hashTransforms(loaded.uses, base);
  const current = await inbox.readConfig();
  const old = current ? { parsed: JSON.parse(current.document) as unknown, transforms: current.transforms } : undefined;
  const changes = diffConfig(old, { parsed, transforms });
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
  return { text, loaded, transforms, current, changes, removed };
}

/** apply swaps a plan's document in, in one transaction, unless another version was applied since it was made. */
export function apply(
  inbox: Inbox,
  p: Plan,
  options: { actor: string; cancelWaiting?: boolean },
): Promise<ConfigApplied> {
  return inbox.applyConfig(p.text, {
    actor: options.actor,
    expectedVersion: p.current?.version ?? 0,
    transforms: p.transforms,
    removed: p.removed.filter((r) => r.now || options.cancelWaiting).map((r) => r.destination),
    cancelWaiting: options.cancelWaiting ?? false,
  });
}

/** refusedLine says why applyConfig() refused, in a line for the operator. */
export function refusedLine(result: Exclude<ConfigApplied, { applied: true }>): string {
  if (result.reason === "version")
    return `another configuration (version ${result.version}) was applied meanwhile; nothing changed, look again and retry`;
  const list = result.waiting.map((w) => `${w.n} for ${w.destination}`).join(", ");
  return `deliveries still wait for a destination this removes (${list}); nothing changed. Let them finish, or pass --cancel-waiting to set them aside as failed`;
}

/**
 * applyText applies a sources file's text as the scripts do at start and on SIGHUP: checked whole, then
 * swapped in, planned again if another version lands meanwhile. It returns the version in force and what
 * changed (nothing when the text is the one in force), or throws why it was refused, nothing changed.
 */
export async function applyText(
  inbox: Inbox,
  text: string,
  env: Env,
  base: string,
  actor: string,
  checks: SecretChecks = {},
): Promise<{ version: number; changes: string[] }> {
  for (let tries = 0; tries < 5; tries++) {
    const p = await plan(inbox, text, env, base, checks);
    if (p.changes.length === 0) return { version: p.current?.version ?? 0, changes: [] };
    const result = await apply(inbox, p, { actor });
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
  env: Env,
  actor: string,
  checks: SecretChecks = {},
): Promise<{ line: string; error: boolean }> {
  try {
    const { text } = readDocument(path);
    const applied = await applyText(inbox, text, env, dirname(resolve(path)), actor, checks);
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

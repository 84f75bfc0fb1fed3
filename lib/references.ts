// references.ts: a secret written in a sources file is a reference, never its value: `env:NAME` (the
// environment of the process that reads it) or `secret:NAME` (the inbox's own secret store, lib/secrets.ts).
// This is where both are told apart and read, for every setting that takes one (providers.ts, routing/routes.ts,
// brokers.ts, consume.ts, reconcile/config.ts), so that each says the same thing and none says a value.
// Not run on its own.

/**
 * Values is where a process reads references from: its environment, and under `secret:NAME` keys the
 * secrets it could open (withSecrets()). An environment variable's name never holds a ":", so the two
 * cannot meet.
 */
export type Values = Readonly<Record<string, string | undefined>>;

/** Reference is what a reference names: an environment variable, or a secret of the store. */
export interface Reference {
  kind: "env" | "secret";
  name: string;
}

/** SECRET_NAME is what a secret of the store may be called: one plain word, as a destination is. */
export const SECRET_NAME = /^[A-Za-z0-9._~-]{1,128}$/;

/** plainName says whether a name is one plain word that no path confuses with another: not "." or "..". */
export function plainName(name: string, pattern: RegExp): boolean {
  return pattern.test(name) && name !== "." && name !== "..";
}

/** referenceOf reads a setting's text as a reference, or undefined when it is a value written as it is. */
export function referenceOf(text: string): Reference | undefined {
  if (text.startsWith("env:")) return { kind: "env", name: text.slice(4) };
  if (text.startsWith("secret:")) return { kind: "secret", name: text.slice(7) };
  return undefined;
}

/** isReference says whether a setting's text is a reference (env:NAME or secret:NAME). */
export function isReference(text: string): boolean {
  return referenceOf(text) !== undefined;
}

/** spoken names a reference in a message: "the environment variable X", "the secret X". */
export function spoken(ref: Reference): string {
  return ref.kind === "env" ? `the environment variable ${ref.name}` : `the secret ${ref.name}`;
}

/**
 * checkReference throws a TypeError, starting with where, if a reference's name is not one its kind can
 * have: an environment variable's is a C identifier, a secret's one plain word (SECRET_NAME).
 */
export function checkReference(ref: Reference, where: string): void {
  const ok = ref.kind === "env" ? /^[A-Za-z_][A-Za-z0-9_]*$/.test(ref.name) : plainName(ref.name, SECRET_NAME);
  if (!ok)
    throw new TypeError(
      `${where}: expected ${ref.kind === "env" ? "env:NAME" : "secret:NAME"}, got an empty or odd name`,
    );
}

/**
 * readReference reads what a setting's text stands for: a reference's value from values, or the text itself
 * when it is none. It throws a TypeError starting with where when a reference names nothing set, saying
 * which, never a value. With resolve false it only checks the reference's shape and returns "".
 */
export function readReference(text: string, values: Values, where: string, resolve = true): string {
  const ref = referenceOf(text);
  if (ref === undefined) return text;
  checkReference(ref, where);
  if (!resolve) return "";
  const value = values[keyOf(ref)] ?? "";
  if (value === "") throw new TypeError(`${where} reads ${spoken(ref)}, which is not set`);
  return value;
}

/** keyOf is where values keeps a reference's value: an environment variable under its name, a secret under secret:NAME. */
export function keyOf(ref: Reference): string {
  return ref.kind === "env" ? ref.name : `secret:${ref.name}`;
}

/** withSecrets adds the secrets a process opened to its environment, as readReference reads them. */
export function withSecrets(env: Values, secrets: ReadonlyMap<string, string>): Values {
  if (secrets.size === 0) return env;
  const out: Record<string, string | undefined> = { ...env };
  for (const [name, value] of secrets) out[`secret:${name}`] = value;
  return out;
}

/**
 * referencesIn lists every reference a setting's value holds, with the path of keys to it, anywhere inside
 * it but under a route's "filter" (whose strings are values a delivery is compared with, not settings).
 */
export function referencesIn(value: unknown, path: readonly string[] = []): { ref: Reference; path: string[] }[] {
  if (typeof value === "string") {
    const ref = referenceOf(value);
    return ref ? [{ ref, path: [...path] }] : [];
  }
  if (Array.isArray(value)) return value.flatMap((v, i) => referencesIn(v, [...path, String(i)]));
  if (typeof value === "object" && value !== null)
    return Object.entries(value).flatMap(([k, v]) => (k === "filter" ? [] : referencesIn(v, [...path, k])));
  return [];
}

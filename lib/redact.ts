// redact.ts: keeps every secret the worker knows out of what is kept or shown. secretsOf() lists them (each
// destination's and the operator's signing secrets, bearer, basic pair and headers from the environment, each
// source's secrets, a broker's password or token), redactor() compiles them once into one RegExp, and
// redact() replaces each, plain or in the forms an answer echoes it in, with a marker naming it:
// `[redacted: app bearer]`. The forwarder runs it on a failed try's error before it is stored, logged,
// traced or announced; admin.ts on what it shows. Not run on its own. See docs/forwarding.md.
//   const { redact } = redactor(secretsOf(forwarding, { sources }));  redact("401: Bearer tok_live_123456")

import type { BrokerDestination as Broker } from "./brokers.ts";
import type { Source } from "./providers.ts";
import type { Forwarding } from "./routing/routes.ts";
import type { Attempt } from "./store.ts";

/** Secret is one value never to be kept or shown, the name its marker gives it, and whose it is. */
export interface Secret {
  value: string;
  /** What the marker says it was: `app bearer`, `source stripe secret`. */
  name: string;
  /** The destination (or `$operator`, or `source NAME`) it belongs to. */
  owner: string;
}

/** Redactor is a compiled list of secrets. */
export interface Redactor {
  /**
   * redact returns text with each secret replaced by its marker; text without one comes back as it was.
   * With keep, only the first keep characters are kept, and a secret that starts before the cut is
   * replaced whole, so no part of one is kept.
   */
  redact(text: string, keep?: number): string;
  /** reach is the most characters a secret's longest form can take: read this far past a cut to see it whole. */
  reach: number;
}

/**
 * SHORTEST is the fewest characters a value needs to be redacted on its own: shorter values would blank
 * ordinary words. They are still redacted inside the longer forms (a basic pair, its base64).
 */
export const SHORTEST = 6;

// One encoded character of any of these forms is at most this long: %F0%9F%98%80, \ud83d\ude00, &#x0001f600;.
const WIDEST = 12;

/**
 * secretsOf lists every secret of a sources file as the worker reads it: the destinations' and the
 * operator's, and, where given, the sources' and the brokers' (parsed by brokers.ts), each with its forms
 * (a Standard Webhooks secret with and without `whsec_`, a basic pair, its base64 and base64url, its
 * password alone). A header written in the file, not read from the environment, is not a secret.
 */
export function secretsOf(
  forwarding?: Forwarding,
  more: { sources?: Iterable<Source>; brokers?: Iterable<Broker> } = {},
): Secret[] {
  const out: Secret[] = [];
  const add = (owner: string, name: string, ...values: string[]) => {
    for (const value of values) if (value !== "") out.push({ value, name, owner });
  };
  const signing = (owner: string, secrets: readonly string[]) =>
    secrets.forEach((s, i) => {
      add(
        owner,
        `${owner} secret${secrets.length > 1 ? ` #${i + 1}` : ""}`,
        s,
        ...(s.startsWith("whsec_") ? [s.slice(6)] : []),
      );
    });
  const headers = (owner: string, all: Record<string, string>, secret: readonly string[] | undefined) => {
    for (const [header, value] of Object.entries(all)) {
      if (secret !== undefined && !secret.includes(header)) continue;
      const credential = header === "authorization" ? /^(Bearer|Basic)\s+(.+)$/i.exec(value) : null;
      if (credential?.[1]?.toLowerCase() === "bearer") add(owner, `${owner} bearer`, credential[2]!);
      else if (credential) {
        const pair = Buffer.from(credential[2]!, "base64").toString("utf8");
        const encoded = Buffer.from(pair).toString("base64");
        add(
          owner,
          `${owner} basic`,
          encoded,
          encoded.replace(/=+$/, ""),
          Buffer.from(pair).toString("base64url"),
          pair,
          pair.slice(pair.indexOf(":") + 1),
        );
      } else add(owner, `${owner} header ${header}`, value);
    }
  };
  for (const d of forwarding?.destinations.values() ?? []) {
    if (d.kind !== "http") continue;
    signing(d.name, d.secrets);
    headers(d.name, d.headers, d.secretHeaders);
  }
  if (forwarding?.operator) {
    signing("$operator", forwarding.operator.secrets);
    headers("$operator", forwarding.operator.headers, forwarding.operator.secretHeaders);
  }
  for (const s of more.sources ?? []) {
    const owner = `source ${s.name}`;
    s.secrets.forEach((key, i) => {
      const name = `${owner} secret${s.secrets.length > 1 ? ` #${i + 1}` : ""}`;
      const b64 = key.toString("base64");
      // A Standard Webhooks key is kept decoded; the secret as written is whsec_ and its base64.
      if (s.provider === "standard") add(owner, name, `whsec_${b64}`, b64);
      else {
        const text = key.toString("utf8");
        add(owner, name, Buffer.from(text, "utf8").equals(key) ? text : b64);
      }
    });
    // The API credential reconcile reads with (docs/reconcile.md): a Stripe key, a GitHub token or app key.
    for (const value of s.reconcile?.credentials ?? []) {
      add(owner, `${owner} reconcile credential`, value);
      // A PEM key is shown a line at a time as often as whole: each of its base64 lines is a secret too.
      for (const line of value.split(/\r?\n/))
        if (line.length >= 40 && !line.startsWith("-----")) add(owner, `${owner} reconcile credential`, line);
    }
  }
  for (const b of more.brokers ?? []) {
    if (b.type === "nats") {
      if (b.pass !== undefined) add(b.name, `${b.name} pass`, b.pass);
      if (b.token !== undefined) add(b.name, `${b.name} token`, b.token);
    }
    // A server's URL may carry a password of its own (amqp://user:password@host, nats://user:password@host).
    for (const url of b.type === "nats" ? b.servers : [b.url]) add(b.name, `${b.name} password`, passwordOf(url));
  }
  return out;
}

/**
 * redactor compiles secrets into one RegExp, once (at start-up: the forwarder makes one per destination).
 * A value shorter than SHORTEST is left out; the longest values are tried first; a value listed twice
 * keeps the name of its first listing, or of mine's (a destination's own secrets name themselves). Each
 * character outside [A-Za-z0-9_~-] may also come percent-encoded (either case), as + for a space,
 * JSON-escaped (\/, \", \uXXXX) or HTML-escaped (&#47;, &#x2f;, &amp;), in any mix.
 */
export function redactor(secrets: readonly Secret[], options: { mine?: string } = {}): Redactor {
  const ordered =
    options.mine === undefined
      ? secrets
      : [...secrets.filter((s) => s.owner === options.mine), ...secrets.filter((s) => s.owner !== options.mine)];
  const named = new Map<string, string>();
  for (const s of ordered) if ([...s.value].length >= SHORTEST && !named.has(s.value)) named.set(s.value, s.name);
  const values = [...named.keys()].sort((a, b) => b.length - a.length);
  if (values.length === 0)
    return { redact: (text, keep = Infinity) => (text.length > keep ? text.slice(0, keep) : text), reach: 0 };
  const markers = values.map((v) => `[redacted: ${named.get(v)}]`);
  const pattern = new RegExp(values.map((v) => `(${[...v].map(forms).join("")})`).join("|"), "g");
  return {
    reach: WIDEST * Math.max(...values.map((v) => [...v].length)),
    redact(text, keep = Infinity) {
      pattern.lastIndex = 0;
      let out = "";
      let last = 0;
      for (let m = pattern.exec(text); m !== null && m.index < keep; m = pattern.exec(text)) {
        out += text.slice(last, m.index) + markers[m.indexOf(m[0], 1) - 1];
        last = m.index + m[0].length;
      }
      if (last === 0 && text.length <= keep) return text;
      return out + text.slice(last, Math.max(last, keep));
    },
  };
}

// passwordOf is the password in a URL, decoded; "" if it has none or is no URL.
function passwordOf(url: string): string {
  try {
    return decodeURIComponent(new URL(url).password);
  } catch {
    return "";
  }
}

const UNRESERVED = /^[A-Za-z0-9_~-]$/;
const NAMED: Record<string, string> = { "&": "amp", "<": "lt", ">": "gt", '"': "quot", "'": "apos", "/": "sol" };
const JSON_ESCAPED: Record<string, string> = { "/": "\\\\/", '"': '\\\\"', "\\": "\\\\\\\\" };

// hex writes n in hex, each letter as [Aa], so %2f and %2F (or &#x2F; and &#x2f;) both match.
const hex = (n: number, width: number) =>
  [...n.toString(16).toUpperCase().padStart(width, "0")]
    .map((d) => (/[A-F]/.test(d) ? `[${d}${d.toLowerCase()}]` : d))
    .join("");

// forms is the pattern of one character of a secret: itself, or any of the ways an echo may have encoded it.
function forms(c: string): string {
  if (UNRESERVED.test(c)) return c;
  const code = c.codePointAt(0)!;
  const ways = [
    c.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&"),
    [...Buffer.from(c, "utf8")].map((b) => `%${hex(b, 2)}`).join(""),
    `&#0{0,3}${code};`,
    `&#[xX]0{0,3}${hex(code, 1)};`,
  ];
  if (c === " ") ways.push("\\+");
  if (NAMED[c]) ways.push(`&${NAMED[c]};`);
  if (JSON_ESCAPED[c]) ways.push(JSON_ESCAPED[c]);
  if (code <= 0xffff) ways.push(`\\\\u${hex(code, 4)}`);
  return `(?:${ways.join("|")})`;
}

/**
 * redactAttempt runs redact over what a kept try says (its error, its answer's headers and body) before it is
 * shown: the worker redacted it with the secrets it knew then, and a reader redacts again with today's.
 */
export function redactAttempt(a: Attempt, redact: (text: string) => string): Attempt {
  return {
    ...a,
    error: a.error === null ? null : redact(a.error),
    headers: a.headers === null ? null : Object.fromEntries(Object.entries(a.headers).map(([k, v]) => [k, redact(v)])),
    body: a.body === null ? null : redact(a.body),
  };
}

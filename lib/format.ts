// format.ts: how the operator's CLI reads and writes for people. Ages and dates on the command line
// (parseDuration, parseWhen); ages, dates and sizes in its output; a delivery as JSON; and the JSON Lines
// of `inbox.ts export` and `import` (exportLine, importLine); and how every script's help names the commands
// and its --version (spokenAs, speakTo, packageVersion). Not run on its own.

import { existsSync, readFileSync } from "node:fs";
import { DEFAULTS } from "./defaults.ts";
import { ORIGINS, STATUSES, type Delivery, type Status } from "./store.ts";
import { sha256 } from "./rows.ts";

/** age writes a span of ms as people say it: 45s, 12m, 5h, 3d. */
export function age(ms: number): string {
  const s = Math.round(ms / 1000);
  if (s < 120) return `${s}s`;
  if (s < 7200) return `${Math.round(s / 60)}m`;
  return s < 172800 ? `${Math.round(s / 3600)}h` : `${Math.round(s / 86400)}d`;
}

/** iso writes a time in ms as an ISO date, or "-" for none. */
export function iso(ms: number | null): string {
  return ms === null ? "-" : new Date(ms).toISOString();
}

/** utc shows a time as UTC to the second, or – for none: the operator page's way, and its filters' descriptions. */
export function utc(ms: number | null): string {
  return ms === null
    ? "–"
    : new Date(ms)
        .toISOString()
        .replace("T", " ")
        .replace(/\.\d+Z$/, "Z");
}

/** utf8Text is a body as text when it is UTF-8 that reads back to the same bytes, else null. */
export function utf8Text(body: Buffer): string | null {
  const text = new TextDecoder("utf-8", { fatal: false }).decode(body);
  return Buffer.from(text, "utf8").equals(body) ? text : null;
}

/** bodyForPeople is a body as text where it is UTF-8, else as base64, said so. */
export function bodyForPeople(body: Buffer): string {
  return utf8Text(body) ?? `(not UTF-8; base64) ${body.toString("base64")}`;
}

/** deliveryJson is a delivery for --json: its size always, its body (as text and base64) only when asked. */
export function deliveryJson(d: Delivery, withBody: boolean): Record<string, unknown> {
  const { body, ...rest } = d;
  if (!withBody) return { ...rest, bodyBytes: body.length };
  return { ...rest, bodyBytes: body.length, body: utf8Text(body), bodyBase64: body.toString("base64") };
}

const UNITS: Record<string, number> = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000, w: 604_800_000 };

/** parseDuration reads an age such as 90s, 30m, 12h, 7d or 2w as ms, or returns undefined. */
export function parseDuration(text: string): number | undefined {
  const match = /^(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)$/.exec(text.trim());
  return match ? Math.round(Number(match[1]) * UNITS[match[2]!]!) : undefined;
}

/** parseWhen reads an ISO date, or an age meaning that long before now, as ms since the epoch; else undefined. */
export function parseWhen(text: string, now: number): number | undefined {
  const ago = parseDuration(text);
  if (ago !== undefined) return now - ago;
  // Only what looks like a date: Date.parse would also take "1" or "March".
  if (!/^\d{4}-\d{2}-\d{2}/.test(text.trim())) return undefined;
  const ms = Date.parse(text.trim());
  return Number.isNaN(ms) ? undefined : ms;
}

/** bytes writes a size as people read it: 512 B, 1.5 KB, 3.2 MB, 1.05 GB. */
export function bytes(n: number): string {
  if (n < 1024) return `${n} B`;
  if (n < 1024 ** 2) return `${(n / 1024).toFixed(1)} KB`;
  if (n < 1024 ** 3) return `${(n / 1024 ** 2).toFixed(1)} MB`;
  return `${(n / 1024 ** 3).toFixed(2)} GB`;
}

/** ExportLine is one line of `inbox.ts export`: a delivery's every field, its body as base64 and, where it is UTF-8, as text. */
export type ExportLine = Omit<Delivery, "body"> & { bodyBytes: number; body: string | null; bodyBase64: string };

/** exportLine turns a delivery into its line of an export. */
export function exportLine(d: Delivery): ExportLine {
  const { body, ...rest } = d;
  // ignoreBOM keeps a leading BOM in the text, so the text alone is also every byte of the body.
  const text = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true }).decode(body);
  return {
    ...rest,
    bodyBytes: body.length,
    body: Buffer.from(text, "utf8").equals(body) ? text : null,
    bodyBase64: body.toString("base64"),
  };
}

// importHeaders checks the provider headers of an export line: a name to a list of values.
function importHeaders(value: unknown): Delivery["headers"] {
  if (
    typeof value !== "object" ||
    value === null ||
    Array.isArray(value) ||
    Object.values(value).some((v) => !Array.isArray(v) || v.some((x) => typeof x !== "string"))
  ) {
    throw new TypeError(`expected headers to map names to lists of strings, got ${JSON.stringify(value)}`);
  }
  return value as Delivery["headers"];
}

/** importLine reads a line of an export back into a delivery, checking its fields and its body against the hash. */
export function importLine(line: unknown): Delivery {
  if (line === null || typeof line !== "object" || Array.isArray(line))
    throw new TypeError(`expected a JSON object, got ${JSON.stringify(line)}`);
  const o = line as Record<string, unknown>;
  // Typed never, so each field takes the type its slot in Delivery asks for; the checks here make it so.
  const need = (key: string, kind: "string" | "number", nullable = false): never => {
    const v = o[key];
    if ((v === null || v === undefined) && nullable) return null as never;
    if (typeof v !== kind || (kind === "number" && !Number.isFinite(v)))
      throw new TypeError(`expected ${key} to be a ${kind}${nullable ? " or null" : ""}, got ${JSON.stringify(v)}`);
    return v as never;
  };
  const status: Status = need("status", "string");
  if (!STATUSES.includes(status))
    throw new TypeError(`expected status to be one of ${STATUSES.join(", ")}, got ${JSON.stringify(status)}`);
  const base64: string = need("bodyBase64", "string");
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(base64)) throw new TypeError("expected bodyBase64 to be base64");
  const body = Buffer.from(base64, "base64");
  const d: Delivery = {
    source: need("source", "string"),
    id: need("id", "string"),
    body,
    bodySha256: need("bodySha256", "string"),
    contentType: need("contentType", "string", true),
    eventType: need("eventType", "string", true),
    providerTime: need("providerTime", "number", true),
    receivedAt: need("receivedAt", "number"),
    status,
    attempts: need("attempts", "number"),
    availableAt: need("availableAt", "number"),
    leasedUntil: need("leasedUntil", "number", true),
    error: need("error", "string", true),
    conflicts: need("conflicts", "number"),
    finishedAt: need("finishedAt", "number", true),
    replays: o.replays === undefined ? 0 : need("replays", "number"),
    purgedAt: need("purgedAt", "number", true),
    orderKey: need("orderKey", "string", true),
    eventTime: need("eventTime", "number", true),
    newerId: need("newerId", "string", true),
    // An export from before destinations holds the handler's rows only.
    destination: o.destination === undefined ? DEFAULTS.destination : need("destination", "string"),
    route: o.route === undefined ? 0 : need("route", "number"),
    headers: o.headers == null ? null : importHeaders(o.headers),
    traceparent: need("traceparent", "string", true),
    // An export from before reconcile holds webhooks only.
    origin: o.origin === undefined ? "webhook" : need("origin", "string"),
  };
  if (!ORIGINS.includes(d.origin))
    throw new TypeError(`expected origin to be one of ${ORIGINS.join(", ")}, got ${JSON.stringify(d.origin)}`);
  // Only a settled delivery can be a tombstone: a waiting one with no body would reach a handler.
  if (d.purgedAt !== null && d.status !== "done" && d.status !== "failed") {
    throw new TypeError(`expected a tombstone (purgedAt set) to be done or failed, got ${d.status}`);
  }
  // A tombstone's body is gone on purpose; any other body must be the one its hash names.
  if (d.purgedAt === null && sha256(body) !== d.bodySha256)
    throw new TypeError(`the body of ${d.source}/${d.id} does not match its sha256`);
  return d;
}

// The scripts the package's command runs by name (cli.ts): their help speaks of `webhook-inbox NAME` there.
const PACKAGED = "receiver|worker|consumer|inbox|admin";

/**
 * spokenAs is how a script's help and messages name the commands, for the way argv says it was started:
 * through the package's command (dist/cli.js, the `webhook-inbox` bin, or cli.ts) `npx tsx inbox.ts status`
 * becomes `npx webhook-inbox inbox status` and `Usage: admin.ts` `Usage: webhook-inbox admin`; run as
 * the script itself, in the clone, the text is left as written.
 */
export function spokenAs(argv: readonly string[]): (text: string) => string {
  const started = (argv[1] ?? "").replace(/\\/g, "/").split("/").at(-1) ?? "";
  if (!/^(cli\.[cm]?[jt]s|webhook-inbox)$/.test(started)) return (text) => text;
  return (text) =>
    text
      .replace(new RegExp(`npx tsx (${PACKAGED})\\.ts`, "g"), "npx webhook-inbox $1")
      .replace(new RegExp(`(?<![\\w/.-])(${PACKAGED})\\.ts\\b`, "g"), "webhook-inbox $1");
}

/** packageVersion is the version in the package's own package.json, found from this file up (clone or dist/). */
export function packageVersion(): string {
  for (let dir = new URL(".", import.meta.url); ; dir = new URL("..", dir)) {
    const file = new URL("package.json", dir);
    if (existsSync(file)) {
      const manifest = JSON.parse(readFileSync(file, "utf8")) as { name?: string; version?: string };
      if (manifest.name === "webhook-inbox" && manifest.version) return manifest.version;
    }
    if (dir.pathname === "/") return "unknown";
  }
}

/** Speaking is the part of a commander program that speakTo() sets: its --version, and where its help goes. */
export interface Speaking {
  version(version: string): unknown;
  configureOutput(output: { writeOut: (text: string) => void }): unknown;
}

/** speakTo gives a script's program --version, and help that names the commands as spokenAs(argv) says. */
export function speakTo(program: Speaking, argv: readonly string[]): void {
  const speak = spokenAs(argv);
  program.version(packageVersion());
  program.configureOutput({ writeOut: (text) => void process.stdout.write(speak(text)) });
}

// lib/cli/reads.ts: the CLI's commands that look and change nothing: status, list, show, preview and
// destinations. Each is a function of the Cli (lib/cli/command.ts) that adds itself to the program.

import { dirname, resolve } from "node:path";
import { brokerLines } from "../consume.ts";
import { DEFAULTS } from "../defaults.ts";
import { age, bodyForPeople, bytes, deliveryJson, iso, utf8Text } from "../format.ts";
import { label, message } from "../log.ts";
import { loadSources, readSourcesFile } from "../config/sources.ts";
import { type Attempt, type InboxStatus, STATUSES, type Status } from "../store.ts";
import { REMOVED } from "../rows.ts";
import { boundBodyContains } from "../search.ts";
import { type Cli, type CliFilters, filterOf, findRows, NotFound, UsageError } from "./command.ts";

/** status counts deliveries per status, and lists failures, the oldest wait, conflicts, ordering and what is kept. */
export function status(c: Cli): void {
  const { withDb, open } = c;
  withDb(c.program.command("status"))
    .description("count deliveries per status; list failures, the oldest wait and conflicting duplicates")
    .option("--json", "print JSON")
    .option("--sources <file>", "also ask each broker source's broker how far behind its consumer is")
    .action(async (opts: { db?: string; json?: boolean; sources?: string }) => {
      const inbox = await open(opts);
      try {
        const s = await inbox.status();
        const kept = await inbox.kept();
        const consumed = opts.sources
          ? await brokerLines(loadSources(readSourcesFile(opts.sources), process.env).values())
          : undefined;
        if (opts.json)
          return void console.log(JSON.stringify({ ...s, kept, ...(consumed ? { brokers: consumed } : {}) }, null, 2));
        for (const b of consumed ?? [])
          console.log(
            `broker source ${b.source} (${b.from}): ${b.said}${b.problem ? `; unhealthy: ${b.problem}` : ""}`,
          );
        for (const name of STATUSES) if (s.counts[name] > 0) console.log(`${name.padEnd(11)}${s.counts[name]}`);
        if (STATUSES.every((name) => s.counts[name] === 0)) console.log("(the inbox is empty)");
        for (const f of s.failed) {
          const tries = f.attempts === 1 ? "1 attempt" : `${f.attempts} attempts`;
          console.log(
            `  failed: ${label(f)}${f.eventType ? ` (${f.eventType})` : ""} after ${tries}: ${f.error ?? "(no error recorded)"}`,
          );
        }
        // The article's single unsigned source has nothing to break down; several sources or typed events do.
        if (s.sources.some((x) => x.source !== DEFAULTS.source || x.eventType !== null)) {
          console.log("by source and type:");
          const width = (f: (x: InboxStatus["sources"][number]) => string) =>
            Math.max(...s.sources.map((x) => f(x).length)) + 2;
          const [sw, tw] = [width((x) => x.source), width((x) => x.eventType ?? "-")];
          for (const x of s.sources) {
            const counts = STATUSES.filter((name) => x.counts[name] > 0)
              .map((name) => `${name} ${x.counts[name]}`)
              .join(", ");
            console.log(`  ${x.source.padEnd(sw)}${(x.eventType ?? "-").padEnd(tw)}${counts}`);
          }
        }
        if (s.oldestWaitingMs !== null) console.log(`oldest waiting: ${age(s.oldestWaitingMs)}`);
        // What waits for a destination the configuration took out is never left in silence (lib/config/).
        for (const d of await inbox.destinations())
          if (d.pausedReason?.startsWith(REMOVED) && d.waiting + d.processing > 0)
            console.log(
              `waiting for a removed destination: ${d.name}, ${d.waiting + d.processing} ${d.waiting + d.processing === 1 ? "delivery" : "deliveries"} (${d.pausedReason}); bring it back with config apply, or let them go with config apply FILE --cancel-waiting`,
            );
        if (s.conflicts.deliveries > 0) {
          console.log(
            `conflicts: ${s.conflicts.deliveries} deliveries had ${s.conflicts.copies} duplicates with a different body (the first copy was kept)`,
          );
        }
        const o = s.ordering;
        if (o.keys > 0 || o.stale > 0 || o.passed > 0) {
          const plural = (n: number, one: string, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;
          console.log(
            `ordered: ${plural(o.keys, "key")} with work, ${plural(o.heldKeys, "key")} held up, ` +
              `${plural(o.stale, "stale delivery", "stale deliveries")} handed over, ${plural(o.passed, "set-aside delivery", "set-aside deliveries")} passed by later ones`,
          );
          for (const h of o.held) {
            const why =
              h.reason === "retry"
                ? `waits for ${h.headId} to be retried at ${iso(h.retryAt)} (attempt ${h.attempts + 1})`
                : `is blocked by ${h.headId}, set aside as failed on a strict key (retry it to go on)`;
            console.log(
              `  held: ${label({ source: h.source, id: h.orderKey })} ${why}; ${h.waiting} waiting: ${h.error ?? "(no error recorded)"}`,
            );
          }
          if (o.heldKeys > o.held.length) console.log(`  … and ${o.heldKeys - o.held.length} more held keys`);
        }
        // How much is kept, so an operator sees retention at work (or that the file predates it).
        if (STATUSES.every((name) => s.counts[name] === 0)) return;
        const oldest = (t: number | null) => (t === null ? "" : `, oldest ${iso(t)}`);
        console.log(
          `kept: ${kept.bodies.count} with their body (${bytes(kept.bodies.bytes)}${oldest(kept.bodies.oldest)}); ${kept.tombstones.count} tombstones${oldest(kept.tombstones.oldest)}`,
        );
        const free = kept.freeBytes ? `, ${bytes(kept.freeBytes)} of it free for reuse` : "";
        const shrink =
          kept.autoVacuum === "none"
            ? " (made before retention: run `purge --vacuum` once so purges can shrink it)"
            : "";
        console.log(`on disk: ${bytes(kept.fileBytes)}${free}${shrink}`);
      } finally {
        await inbox.close();
      }
    });
}

/** list prints deliveries newest first, of one status or source. */
export function list(c: Cli): void {
  const { withDb, withFilters, open, positive, status } = c;
  // The filters retry, replay and export take, so a list shows what one of them would then act on.
  withFilters(withDb(c.program.command("list")))
    .description("list deliveries, newest first")
    .option("--status <status>", `only this status (${STATUSES.join(", ")})`, status)
    .option("--limit <n>", "at most this many", positive, 20)
    .option("--json", "print JSON")
    .action(async (opts: CliFilters & { db?: string; status?: Status; limit: number; json?: boolean }) => {
      const inbox = await open(opts);
      try {
        const { filter, since } = boundBodyContains(
          { ...filterOf(opts), ...(opts.status ? { status: opts.status } : {}) },
          Date.now(),
        );
        // On stderr, so that --json stays one document.
        if (since !== undefined)
          console.error(
            `--body-contains reads every body, so it searched those received since ${iso(since)}; pass --since to look further back, or --body-json or --body-words, which an index serves.`,
          );
        const rows = await inbox.search(filter, { limit: opts.limit });
        if (opts.json)
          return void console.log(
            JSON.stringify(
              rows.map((d) => deliveryJson(d, false)),
              null,
              2,
            ),
          );
        if (rows.length === 0) return void console.log("(no deliveries)");
        // The destination shows once any row goes elsewhere than the handler; the handler's alone reads as before.
        const routed = rows.some((d) => d.destination !== DEFAULTS.destination);
        console.log(
          ["source", "id", "status", "attempts", "type", "received", "error", ...(routed ? ["destination"] : [])].join(
            "\t",
          ),
        );
        for (const d of rows) {
          console.log(
            [
              d.source,
              d.id,
              d.status,
              d.attempts,
              d.eventType ?? "-",
              iso(d.receivedAt),
              d.error ?? "",
              ...(routed ? [d.destination || "-"] : []),
            ].join("\t"),
          );
        }
      } finally {
        await inbox.close();
      }
    });
}

/** show prints one delivery: its metadata, last error and body. */
export function show(c: Cli): void {
  const { withDb, open } = c;
  withDb(c.program.command("show <id>"))
    .description(
      "print one delivery: its metadata, every try (when, how long, the answer's status, headers and first bytes, or its error), and its body",
    )
    .option("--source <name>", "the delivery's source, when IDs clash")
    .option("--destination <name>", "only its row for this destination")
    .option("--json", "print JSON (the body as text when it is UTF-8, and always as base64)")
    .action(async (id: string, opts: { db?: string; source?: string; destination?: string; json?: boolean }) => {
      const inbox = await open(opts);
      try {
        const all = await findRows(inbox, id, opts.source, opts.destination);
        const d = all[0]!;
        // Every try, not only the last error: a retry that failed differently, or what a good one answered, is the story.
        const tries = await Promise.all(all.map((x) => inbox.attempts(x)));
        if (opts.json) {
          const json = all.map((x, i) => ({ ...deliveryJson(x, true), tries: tries[i] }));
          return void console.log(JSON.stringify(all.length === 1 ? json[0] : json, null, 2));
        }
        const tried = tries
          .flat()
          .sort((a, b) => a.startedAt - b.startedAt)
          .map((t) => sayTry(t, all.length > 1).join(`\n${" ".repeat(16)}`));
        if (all.length > 1) {
          // One delivery, several routes: each destination's row has its own status, attempts and error.
          console.log(
            `routes        ${all.map((x) => `${x.destination} ${x.status} (${x.attempts} attempts)${x.error ? `: ${x.error}` : ""}`).join("\n              ")}`,
          );
        }
        const lines: [string, unknown][] = [
          ["source", d.source],
          ["id", d.id],
          ["destination", d.destination || "(none: no route chose it)"],
          ["status", d.status],
          ["attempts", d.attempts],
          ["type", d.eventType ?? "-"],
          // A fetched one is API JSON with no signature (docs/reconcile.md).
          ["origin", d.origin === "reconcile" ? "reconcile (fetched from the provider's API)" : d.origin],
          ["content type", d.contentType ?? "-"],
          ["received", iso(d.receivedAt)],
          ["provider time", iso(d.providerTime)],
          ["due", d.status === "received" ? iso(d.availableAt) : "-"],
          ["leased until", iso(d.leasedUntil)],
          ["finished", iso(d.finishedAt)],
          ["conflicts", d.conflicts],
          ["sha256", d.bodySha256],
          ...(d.orderKey === null
            ? []
            : ([
                ["order key", d.orderKey],
                ["event time", iso(d.eventTime)],
                ["stale", d.newerId === null ? "no" : `yes, handled after ${d.newerId}`],
              ] as [string, unknown][])),
          // The trace to look up in the tracing UI (docs/observability.md#traces), where one was recorded.
          ...(d.traceparent === null ? [] : ([["traceparent", d.traceparent]] as [string, unknown][])),
          ["error", d.error ?? "-"],
          ["tries", tried.length === 0 ? "-" : tried.join(`\n${" ".repeat(14)}`)],
          ["body", `${d.body.length} bytes`],
        ];
        for (const [k, v] of lines) console.log(`${k.padEnd(14)}${v}`);
        console.log(bodyForPeople(d.body));
      } finally {
        await inbox.close();
      }
    });
}

// sayTry is one try of `show`, a line and then its answer's: when, where, how long, what came back; the
// answer's headers and first bytes (each kept redacted) below it, the body on one line, its breaks shown.
function sayTry(t: Attempt, where: boolean): string[] {
  const said = t.error ?? (t.status === null ? "ok" : `HTTP ${t.status}`);
  const lines = [
    `#${t.attempt}${where ? ` ${t.destination}` : ""} ${iso(t.startedAt)} ${t.ms === null ? "-" : `${t.ms} ms`} ${said}`,
  ];
  if (t.headers !== null)
    lines.push(
      `headers: ${Object.entries(t.headers)
        .map(([k, v]) => `${k}: ${v}`)
        .join("; ")}`,
    );
  if (t.body !== null && t.body !== "") lines.push(`body: ${JSON.stringify(t.body)}`);
  return lines;
}

/** preview shows the routes a stored delivery's filters choose now, and each destination's request; nothing is sent. */
export function preview(c: Cli): void {
  const { withDb, open } = c;
  withDb(c.program.command("preview <id>"))
    .description(
      "show which routes a stored delivery's filters choose now, and the exact request each destination would get (its transform run); nothing is sent",
    )
    .option("--source <name>", "the delivery's source, when IDs clash")
    .option("--to <destination>", "only this destination, whether its routes chose it or not")
    .option(
      "--sources <file>",
      "a sources file to try before applying it (default: INBOX_SOURCES, else the configuration in force in the database)",
    )
    .option("--json", "print JSON (each body as text when it is UTF-8, and always as base64)")
    .action(
      async (id: string, opts: { db?: string; source?: string; to?: string; sources?: string; json?: boolean }) => {
        const sourcesFile = opts.sources ?? process.env.INBOX_SOURCES;
        let config: unknown;
        if (sourcesFile !== undefined) {
          try {
            config = readSourcesFile(sourcesFile);
          } catch (error) {
            throw new UsageError(`${sourcesFile}: ${message(error)}`);
          }
        }
        const inbox = await open(opts);
        try {
          const rows = await findRows(inbox, id, opts.source);
          // Without a file, the configuration in force, as the page's preview and the API's read it; a
          // transform's relative path then starts from the working folder, as the page's does.
          const stored = sourcesFile === undefined ? await inbox.readConfig() : undefined;
          if (sourcesFile === undefined && stored === undefined)
            throw new NotFound(
              "No configuration in this inbox to preview against: pass --sources FILE, or apply one (config apply FILE).",
            );
          const against = stored ? `configuration version ${stored.version}` : sourcesFile!;
          const { preview, routeLine } = await import("../forwarding/preview.ts");
          let seen: Awaited<ReturnType<typeof preview>>;
          try {
            seen = await preview(rows, stored ? (JSON.parse(stored.document) as unknown) : config, {
              base: sourcesFile ? dirname(resolve(sourcesFile)) : process.cwd(),
              ...(opts.to ? { to: opts.to } : {}),
            });
          } catch (error) {
            throw new UsageError(`${against}: ${message(error)}`);
          }
          if (opts.json) {
            const body = (b: Buffer | undefined) =>
              b === undefined
                ? {}
                : {
                    body: utf8Text(b),
                    bodyBase64: b.toString("base64"),
                  };
            return void console.log(
              JSON.stringify(
                { ...seen, requests: seen.requests.map(({ body: b, ...r }) => ({ ...r, ...body(b) })) },
                null,
                2,
              ),
            );
          }
          const d = rows[0]!;
          console.log(
            `${label(d)}${d.eventType ? ` (${d.eventType})` : ""}, received ${iso(d.receivedAt)}; nothing is sent`,
          );
          console.log(`routes now    ${seen.routes.map(routeLine).join("; ") || "(none)"}`);
          console.log(`stored rows   ${rows.map((x) => `${x.destination || "(none)"} ${x.status}`).join("; ")}`);
          for (const note of seen.notes) console.log(`note          ${note}`);
          for (const r of seen.requests) {
            console.log("");
            if (r.kind === "handler")
              console.log(`→ ${r.destination}: the worker's handler runs it; nothing goes over the network`);
            else if (r.error) console.log(`→ ${r.destination}: the try would fail: ${r.error}`);
            else if (r.skipped)
              console.log(
                `→ ${r.destination}: skipped, its transform returned null; the row would be done, nothing sent`,
              );
            else {
              console.log(`→ ${r.destination}: ${r.kind === "http" ? `POST ${r.url}` : "publish to its broker"}`);
              for (const [name, value] of Object.entries(r.headers ?? {})) console.log(`${name}: ${value}`);
              console.log("");
              console.log(bodyForPeople(r.body!));
            }
          }
        } finally {
          await inbox.close();
        }
      },
    );
}

/** destinations lists each destination's state, what waits for it, its failure rate and last error. */
export function destinations(c: Cli): void {
  const { withDb, open } = c;
  withDb(c.program.command("destinations"))
    .description(
      "list each destination: closed (forwarding), open (its breaker) or paused, what waits for it, its recent failure rate and last error",
    )
    .option("--json", "print JSON")
    .action(async (opts: { db?: string; json?: boolean }) => {
      const inbox = await open(opts);
      try {
        const all = await inbox.destinations();
        if (opts.json) return void console.log(JSON.stringify(all, null, 2));
        console.log(
          ["destination", "state", "waiting", "processing", "failed", "failure rate", "last error"].join("\t"),
        );
        for (const d of all) {
          const state =
            d.state === "paused"
              ? `paused (${d.pausedReason ?? "?"})`
              : d.state === "open"
                ? `open (${d.probing ? "probing" : `probe at ${iso(d.retryAt)}`})`
                : "closed";
          const rate = d.failureRate === null ? "-" : `${Math.round(d.failureRate * 100)}%`;
          console.log(
            [
              d.name,
              state,
              d.waiting,
              d.processing,
              d.failed,
              rate,
              d.lastError ? `${iso(d.lastErrorAt)} ${d.lastError}` : "-",
            ].join("\t"),
          );
        }
      } finally {
        await inbox.close();
      }
    });
}

/** audit lists the audit log, newest first: every change, by every way in, with who made it and what it changed. */
export function audit(c: Cli): void {
  const { withDb, open, positive } = c;
  withDb(c.program.command("audit"))
    .description(
      "list the audit log, newest first: each change by the API (key:ID), the page (page:…), this CLI (cli:USER), a script's file at start (start:…) or SIGHUP (sighup:…)",
    )
    .option("--limit <n>", "how many entries", positive, 50)
    .option("--before <seq>", "entries before this one (the first column), for the next page", positive)
    .option("--json", "print JSON")
    .action(async (opts: { db?: string; limit: number; before?: number; json?: boolean }) => {
      const inbox = await open(opts);
      try {
        const entries = await inbox.auditLog({
          limit: opts.limit,
          ...(opts.before === undefined ? {} : { before: opts.before }),
        });
        if (opts.json) return void console.log(JSON.stringify(entries));
        if (entries.length === 0) return void console.log("The audit log is empty.");
        for (const e of entries)
          console.log(`${e.seq}  ${iso(e.at)}  ${e.who}  ${e.operation}  count=${e.count}  ${e.target}`);
      } finally {
        await inbox.close();
      }
    });
}

// lib/cli/reconcile.ts: the CLI's `reconcile`: fetch back from Stripe's and GitHub's own APIs what they
// never delivered (lib/reconcile/), once, or every --every as a long-running process. Each source of the
// sources file with a "reconcile" setting is asked in turn; one summary line each. docs/reconcile.md.
//   npx tsx inbox.ts reconcile --sources sources.json --since 3d --dry-run

import { DEFAULTS } from "../defaults.ts";
import { message, progress } from "../log.ts";
import { valuesFor } from "../config/config.ts";
import { loadSources, readSourcesFile, type Source } from "../config/sources.ts";
import { githubLister, judgeGithub } from "../reconcile/github.ts";
import { type Lister, ReconcileFailed, reconcile, summaryLine, type Verdict } from "../reconcile/loop.ts";
import { judgeStripe, stripeLister } from "../reconcile/stripe.ts";
import { redactor, secretsOf } from "../redact.ts";
import type { Inbox } from "../store.ts";
import { type Cli, UsageError } from "./command.ts";

/** ReconcileRun is one pass over the sources, as the command and its --every mode run it. */
export interface ReconcileRun {
  inbox: Inbox;
  sources: Source[];
  sinceMs: number;
  dryRun: boolean;
  /** Where the summary lines and the missing ids go. */
  out: (line: string) => void;
  /** Where waits and a failed source's line go. */
  err: { write(text: string): unknown; isTTY?: boolean };
  now: () => number;
  sleep: (ms: number) => Promise<void>;
  /** Aborted to stop after the event in flight. */
  signal?: AbortSignal;
}

/** listerOf builds the provider's Lister and its judge of a failed call for a source's reconcile setting. */
export async function listerOf(
  source: Source,
  now: () => number,
): Promise<{ list: Lister; judge: (e: unknown) => Verdict }> {
  const settings = source.reconcile;
  if (settings?.provider === "stripe") return { list: await stripeLister(settings), judge: judgeStripe };
  if (settings?.provider === "github") return { list: await githubLister(settings), judge: judgeGithub(now) };
  throw new UsageError(`Source ${source.name} has no "reconcile" setting (docs/reconcile.md).`);
}

/**
 * reconcileOnce asks each source in turn and prints its summary line; a source whose provider keeps
 * failing prints one line, redacted, and the others still run. It returns the failed sources' lines.
 */
export async function reconcileOnce(run: ReconcileRun): Promise<string[]> {
  const { redact } = redactor(secretsOf(undefined, { sources: run.sources }));
  const failed: string[] = [];
  for (const source of run.sources) {
    const line = progressLine(run.err, source.name);
    try {
      const { list, judge } = await listerOf(source, run.now);
      const tally = await reconcile(source, list, judge, {
        inbox: run.inbox,
        now: run.now,
        sleep: run.sleep,
        dryRun: run.dryRun,
        sinceMs: run.sinceMs,
        redact,
        ...(run.signal ? { signal: run.signal } : {}),
        log: (text) => (line.bar ? line.bar.write(`${text}\n`) : void run.err.write(`${text}\n`)),
        onEvent: (t) => (line.tally = t),
      });
      line.bar?.stop();
      for (const id of tally.missing) run.out(`missing ${source.name}/${id}`);
      run.out(summaryLine(source.name, tally, run.dryRun));
    } catch (error) {
      line.bar?.stop();
      if (error instanceof UsageError) throw error;
      const text = redact(
        error instanceof ReconcileFailed ? error.message : `reconcile ${source.name}: ${message(error)}`,
      );
      failed.push(text.split("\n")[0]!);
      run.err.write(`${failed.at(-1)}\n`);
    }
  }
  return failed;
}

// progressLine is a source's live line on a terminal: how many seen, and what became of them.
function progressLine(stream: ReconcileRun["err"], name: string) {
  const state: { tally?: { seen: number; already: number; fetched: number; redelivered: number; missing: string[] } } =
    {};
  const bar = progress(stream, () => {
    const t = state.tally;
    return {
      done: t?.seen ?? 0,
      total: 0,
      extra: `${name}: ${t?.already ?? 0} already there, ${t?.fetched ?? 0} fetched, ${t?.redelivered ?? 0} redeliveries, ${t?.missing.length ?? 0} missing`,
    };
  });
  return Object.assign(state, { bar });
}

/** reconcileCommand adds `reconcile [--source NAME] [--since DURATION] [--dry-run] [--every DURATION]`. */
export function reconcileCommand(c: Cli): void {
  const { withDb, withKey, open } = c;
  withKey(withDb(c.program.command("reconcile")))
    .description(
      "fetch back from Stripe's and GitHub's APIs what they never delivered, for each source with a \"reconcile\" setting; stored under the webhook's own ID, so nothing is stored or handled twice",
    )
    .option("--sources <file>", "the sources file (default: INBOX_SOURCES)")
    .option("--source <name>", "only this source")
    .option("--since <age>", `how far back to look (default: ${DEFAULTS.reconcileSinceMs / 86_400_000}d)`, c.duration)
    .option("--dry-run", "list what is missing; store and ask for nothing")
    .option(
      "--every <age>",
      "keep running: reconcile again this long after each pass (e.g. 15m), until stopped",
      c.duration,
    )
    .action(
      async (opts: {
        db?: string;
        sources?: string;
        source?: string;
        since?: number;
        dryRun?: boolean;
        every?: number;
        secretsKeyFile?: string;
      }) => {
        const every = opts.every;
        const file = opts.sources ?? process.env.INBOX_SOURCES;
        if (!file) throw new UsageError("reconcile needs the sources file: --sources FILE or INBOX_SOURCES.");
        let parsed: unknown;
        try {
          parsed = readSourcesFile(file);
        } catch (error) {
          throw new UsageError(`${file}: ${message(error)}`);
        }
        // Opened first: a credential may be a secret of the store (secret:NAME), opened with the operator's key.
        const host = c.host(opts);
        const inbox = await open(opts);
        let sources: Source[];
        try {
          let all: Source[];
          try {
            const values = await valuesFor({ ...host, inbox }, parsed);
            all = [...loadSources(parsed, values, { reconcile: true }).values()];
          } catch (error) {
            throw new UsageError(`${file}: ${message(error)}`);
          }
          sources = all.filter((s) => (opts.source ? s.name === opts.source : s.reconcile !== undefined));
          if (opts.source && sources.length === 0) throw new UsageError(`No source ${opts.source} in ${file}.`);
          if (opts.source && !sources[0]!.reconcile)
            throw new UsageError(`Source ${opts.source} has no "reconcile" setting (docs/reconcile.md).`);
          if (sources.length === 0)
            throw new UsageError(`No source in ${file} has a "reconcile" setting (docs/reconcile.md).`);
        } catch (error) {
          await inbox.close();
          throw error;
        }
        const stop = new AbortController();
        const onSignal = () => stop.abort();
        process.once("SIGINT", onSignal).once("SIGTERM", onSignal);
        try {
          const run: ReconcileRun = {
            inbox,
            sources,
            sinceMs: opts.since ?? DEFAULTS.reconcileSinceMs,
            dryRun: opts.dryRun ?? false,
            out: (line) => console.log(line),
            err: process.stderr,
            now: Date.now,
            sleep: (ms) => wait(ms, stop.signal),
            signal: stop.signal,
          };
          for (;;) {
            const failed = await reconcileOnce(run);
            // Stopped (SIGINT, SIGTERM): after the event in flight, its summary printed; the next run goes on.
            if (stop.signal.aborted) {
              if (every === undefined && failed.length > 0) process.exitCode = 1;
              return;
            }
            // Once: a failed source (its line printed already) fails the command, exit 1. Every: a passing
            // fault waits for the next pass.
            if (every === undefined) {
              if (failed.length > 0) process.exitCode = 1;
              return;
            }
            await wait(every, stop.signal);
            if (stop.signal.aborted) return;
          }
        } finally {
          process.off("SIGINT", onSignal).off("SIGTERM", onSignal);
          await inbox.close();
        }
      },
    );
}

// wait sleeps ms, or less when signal aborts (a stopping --every).
function wait(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    }
    signal.addEventListener("abort", done);
  });
}

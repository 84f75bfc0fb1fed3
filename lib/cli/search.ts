// lib/cli/search.ts: `inbox.ts search enable|disable|status`, the body search index's switch
// (docs/operations.md#searching-bodies). The index is off in a new or upgraded inbox, as it costs indexing every
// body; enable turns it on and indexes the rows already stored, a batch per transaction, printing its progress;
// run again after an interruption, it carries on. Both are in the audit log.

import { DEFAULTS } from "../defaults.ts";
import { iso } from "../format.ts";
import type { SearchStatus } from "../store.ts";
import { type Cli, UsageError } from "./command.ts";

/** search adds `search enable|disable|status`: one command, so its --help says every option. */
export function search(c: Cli): void {
  const { withDb, open, positive } = c;
  withDb(c.program.command("search <action>"))
    .description(
      "the body search index (bodyJson, bodyWords): enable (turn it on, then index the rows already stored in batches), disable (turn it off and empty it), or status",
    )
    .option("--batch <n>", `rows per backfill transaction (default ${DEFAULTS.searchBackfillBatch})`, positive)
    .option("--json", "print JSON (status)")
    .addHelpText(
      "after",
      `
Off by default: with it on, every body stored is indexed after its ack, by the worker's tick or by the next
search, which catches up first (docs/performance.md says what that costs on each backend). enable holds off
writers for one batch at a time; stopped midway, run it again to carry on. Until its backfill is done the
search forms answer that it is not ready. body contains needs no index.

Examples:
  npx tsx inbox.ts search enable
  npx tsx inbox.ts search status --json
  npx tsx inbox.ts search disable`,
    )
    .action(async (action: string, opts: { db?: string; batch?: number; json?: boolean }) => {
      if (!["enable", "disable", "status"].includes(action))
        throw new UsageError(`search: expected enable, disable or status; got ${JSON.stringify(action)}.`);
      const inbox = await open(opts);
      try {
        if (action === "status") {
          const s = await inbox.searchStatus();
          console.log(opts.json === true ? JSON.stringify(s) : describe(s));
          return;
        }
        const audit = { who: c.who(), operation: `search ${action}`, target: "search index" };
        if (action === "disable") {
          const was = await inbox.disableSearch(audit);
          console.log(was ? "search index disabled and emptied" : "search index was already off");
          return;
        }
        const started = Date.now();
        let shown = 0;
        const s = await inbox.enableSearch({
          audit,
          ...(opts.batch !== undefined ? { batch: opts.batch } : {}),
          // A line every few seconds at most, on stderr, so stdout is the outcome alone.
          onBatch: (now) => {
            if (Date.now() - shown < 5_000) return;
            shown = Date.now();
            console.error(`search enable: ${now.backfilled} of ${now.toBackfill} rows read`);
          },
        });
        console.log(`${describe(s)} (${((Date.now() - started) / 1000).toFixed(1)} s)`);
      } finally {
        await inbox.close();
      }
    });
}

// describe says the status in a line.
function describe(s: SearchStatus): string {
  if (!s.enabled) return `search index: off${s.changedAt === null ? "" : ` since ${iso(s.changedAt)}`}`;
  const since = s.changedAt === null ? "" : ` since ${iso(s.changedAt)}`;
  return s.ready
    ? `search index: on${since}, ${s.backfilled} rows stored before it backfilled, ${s.pending} stored since waiting to be indexed`
    : `search index: on${since}, backfill at ${s.backfilled} of ${s.toBackfill} rows (run search enable to carry on)`;
}

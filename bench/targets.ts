// bench/targets.ts: the databases the inbox's own rows run on. SQLite always; PostgreSQL as well when
// BENCH_POSTGRES is on (the default when the server answers) and the entry points accept a postgres://
// URL for --db. Each run gets a fresh file or database (or schema), removed afterwards.
//   BENCH_POSTGRES=0 npm run bench -- ingest        # SQLite only (BENCH_SQLITE=0: PostgreSQL only)
//   BENCH_INBOX_DB_URL=postgres://127.0.0.1:5432/test?schema=bench_inbox npm run bench -- worker   # a schema per run

import { spawnSync } from "node:child_process";
import { join } from "node:path";
import pg from "pg";
import { ROOT } from "./common.ts";
import { freshDatabase, pgReachable } from "./peers/pgdb.ts";

/** InboxTarget is one database the inbox's rows run on. */
export interface InboxTarget {
  /** "SQLite" or "PostgreSQL", for the row labels. */
  name: string;
  /** fresh returns a new, empty --db value for one run, and how to remove it. */
  fresh: (dir: string, label: string) => Promise<{ db: string; drop: () => Promise<void> }>;
}

/**
 * INBOX_PG_URL, when set, is where the PostgreSQL rows put the inbox, each run in a schema of its own.
 * Unset, each run gets a database of its own on BENCH_PG_URL, as the peers do: another database's open
 * transactions then hold back neither its vacuum nor the index entries its scans may mark dead.
 */
const INBOX_PG_URL = process.env.BENCH_INBOX_DB_URL;

const sqlite: InboxTarget = {
  name: "SQLite",
  fresh: async (dir, label) => ({ db: join(dir, `${label}.db`), drop: async () => {} }),
};

const postgres: InboxTarget = {
  name: "PostgreSQL",
  fresh: async (_dir, label) => {
    if (INBOX_PG_URL === undefined) {
      const db = await freshDatabase(`bench_inbox_${label}`.toLowerCase().replace(/[^a-z0-9_]/g, "_"));
      return { db: `${db.url}?schema=inbox`, drop: db.drop };
    }
    const url = new URL(INBOX_PG_URL);
    const schema = `${url.searchParams.get("schema") ?? "bench_inbox"}_${label}`.replace(/[^a-z0-9_]/g, "_");
    url.searchParams.set("schema", schema);
    const admin = async (sql: string) => {
      const u = new URL(url);
      u.search = "";
      const client = new pg.Client({ connectionString: u.toString() });
      await client.connect();
      try {
        await client.query(sql);
      } finally {
        await client.end();
      }
    };
    await admin(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
    await admin(`CREATE SCHEMA ${schema}`);
    return { db: url.toString(), drop: () => admin(`DROP SCHEMA IF EXISTS ${schema} CASCADE`) };
  },
};

/**
 * postgresSupport says whether this checkout's entry points take a postgres:// --db: until the backend
 * lands they treat a URL as a file name, so the rows would measure nothing. Their --help says which.
 */
function postgresSupport(): string | undefined {
  for (const script of ["receiver.ts", "worker.ts"]) {
    const help = spawnSync(process.execPath, ["--import", "tsx", join(ROOT, script), "--help"], {
      cwd: ROOT,
      encoding: "utf8",
    });
    if (!/postgres/i.test(`${help.stdout}${help.stderr}`))
      return `${script} --help does not mention postgres, so its --db would take the URL for a file name`;
  }
  return undefined;
}

let targets: Promise<InboxTarget[]> | undefined;

/** inboxTargets lists the inbox's databases for this run, saying once why PostgreSQL is left out. */
export function inboxTargets(): Promise<InboxTarget[]> {
  return (targets ??= (async () => {
    const wanted = process.env.BENCH_POSTGRES;
    if (wanted === "0") return [sqlite];
    if (wanted === undefined && !(await pgReachable())) return [sqlite];
    const missing = postgresSupport();
    if (missing) {
      console.log(`bench: inbox on PostgreSQL skipped: ${missing}`);
      return [sqlite];
    }
    // BENCH_SQLITE=0 measures PostgreSQL alone, as a rerun of its rows after a change to its backend.
    return process.env.BENCH_SQLITE === "0" ? [postgres] : [sqlite, postgres];
  })());
}

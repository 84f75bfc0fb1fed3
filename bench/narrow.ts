// bench/narrow.ts: what a state change costs PostgreSQL with the body in the row and without it
// (docs/table.md#bodies-apart). Two tables shaped as delivery_rows, with its primary key and the claim's partial
// index, one carrying a Stripe-sized body of about 1 KB inline, the other an empty one (its body apart); each
// gets BENCH_NARROW_ROWS (100,000) rows, then the claim's update (status, available_at) and the done mark's
// (status, finished_at) of every row, in batches of 256 as the worker sends them, alternating between the two
// tables for BENCH_ROUNDS (3) rounds. Prints the medians, their ratio and the WAL each wrote.
// The same question on SQLite: an inbox file filled with BENCH_NARROW_ROWS due deliveries, each with that body
// (as JSON; kept apart since SQLite's bodies apart, as store() keeps it) or one of 2 bytes (in its row), drained by
// the worker itself (its claims and done marks, a handler that does nothing), alternating, in a process of its own
// per round so each round's bytes written (/proc's wchar: the WAL and its checkpoints) are its alone. The 2-byte
// body is the floor: apart, a claim still reads each body. Run in a checkout from before bodies apart, the same
// bench measures the body in the row.
//   npm run bench -- narrow          BENCH_SQLITE=0 (PostgreSQL only), BENCH_POSTGRES=0 (SQLite only)

import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import pg from "pg";
import { f, fillBacklog, knob, ROOT, tempDir } from "./common.ts";
import { freshDatabase, pgReachable } from "./peers/pgdb.ts";

const ROWS = knob("BENCH_NARROW_ROWS", 100_000);
const ROUNDS = knob("BENCH_ROUNDS", 3);
const BATCH = 256;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

/** Kind is a round's body: about 1 KB in the row, or (nearly) none there. */
type Kind = "inline" | "apart";
/** Round is what one round measured: its time, and the bytes it wrote (PostgreSQL's WAL, or SQLite's writes). */
interface Round {
  ms: number;
  bytes: number;
}

// rounds measures each kind ROUNDS times, the first of each round alternating, prints each, and returns the medians.
async function rounds(
  label: string,
  bytes: string,
  measure: (kind: Kind) => Promise<Round>,
  names: Record<Kind, string> = { inline: "inline", apart: "apart" },
): Promise<Record<Kind, Round>> {
  const results: Record<Kind, Round[]> = { inline: [], apart: [] };
  for (let r = 0; r < ROUNDS; r++) {
    for (const kind of r % 2 === 0 ? (["inline", "apart"] as const) : (["apart", "inline"] as const)) {
      const one = await measure(kind);
      results[kind].push(one);
      console.log(
        `  ${label}round ${r + 1} body ${names[kind].padEnd(6)} ${f(one.ms)} ms, ${bytes} ${f(one.bytes / ROWS)} B a delivery`,
      );
    }
  }
  const mid = (kind: Kind) => ({
    ms: median(results[kind].map((x) => x.ms)),
    bytes: median(results[kind].map((x) => x.bytes)),
  });
  return { inline: mid("inline"), apart: mid("apart") };
}

// round fills the table afresh and times both updates of every row, batch by batch; it returns ms and WAL bytes.
async function round(client: pg.Client, table: string, inline: boolean): Promise<Round> {
  await client.query(`DROP TABLE IF EXISTS ${table}`);
  await client.query(`CREATE TABLE ${table} (
    source text NOT NULL, id text NOT NULL, route smallint NOT NULL DEFAULT 0, body bytea NOT NULL,
    body_sha256 text NOT NULL, status text NOT NULL, attempts integer NOT NULL DEFAULT 0, available_at bigint NOT NULL,
    received_at bigint NOT NULL, finished_at bigint, lease_token text, PRIMARY KEY (source, id, route))`);
  await client.query(`CREATE INDEX ${table}_due ON ${table} (available_at) WHERE status IN ('received', 'processing')`);
  await client.query(`CREATE INDEX ${table}_received ON ${table} (received_at)`);
  await client.query(
    `INSERT INTO ${table} (source, id, body, body_sha256, status, available_at, received_at)
     SELECT 'default', 'evt_' || i, CASE WHEN $2 THEN convert_to(repeat('{"object":"charge","amount":' || i || '}', 32), 'UTF8') ELSE '\\x'::bytea END,
            md5(i::text) || md5(i::text), 'received', i, i
     FROM generate_series(1, $1::integer) AS i`,
    [ROWS, inline],
  );
  await client.query(`VACUUM (ANALYZE) ${table}`);
  const lsn = async () => (await client.query("SELECT pg_current_wal_lsn() AS l")).rows[0].l as string;
  const from = await lsn();
  const started = performance.now();
  for (let i = 1; i <= ROWS; i += BATCH) {
    const ids = Array.from({ length: Math.min(BATCH, ROWS - i + 1) }, (_, k) => `evt_${i + k}`);
    await client.query(
      `UPDATE ${table} SET status = 'processing', attempts = attempts + 1, available_at = available_at + 60000,
              lease_token = md5(id) WHERE source = 'default' AND id = ANY($1) AND route = 0`,
      [ids],
    );
    await client.query(
      `UPDATE ${table} SET status = 'done', finished_at = available_at, lease_token = NULL
        WHERE source = 'default' AND id = ANY($1) AND route = 0`,
      [ids],
    );
  }
  const ms = performance.now() - started;
  const { rows } = await client.query("SELECT pg_wal_lsn_diff($1, $2)::bigint AS b", [await lsn(), from]);
  return { ms, bytes: Number(rows[0].b) };
}

// The SQLite half's bodies: about 1 KB, as PostgreSQL's repeat() makes it but JSON (the worker parses what it
// hands a handler), or the least a worker takes.
const charge = (i: number) =>
  Buffer.from(`{"data":[${Array(32).fill(`{"object":"charge","amount":${i}}`).join(",")}]}`);
const least = Buffer.from("{}");

// written is how many bytes this process has handed to write() so far, its threads' included.
const written = () => Number(/^wchar: (\d+)$/m.exec(readFileSync("/proc/self/io", "utf8"))![1]);

// drainHere is one SQLite round's drain, in the child process this file is run as with "drain PATH KIND". The
// worker parses each body before its handler sees it; with 2-byte bodies the handler parses a 1 KB one itself,
// so both rounds parse the same JSON and differ only in what the rows carry.
async function drainHere(path: string, kind: string): Promise<void> {
  const [{ SqliteInbox }, { run }] = await Promise.all([import("../lib/sqlite/sqlite.ts"), import("../worker.ts")]);
  const inbox = new SqliteInbox(path);
  const text = charge(1).toString();
  const [from, started] = [written(), performance.now()];
  const stats = await run(kind === "apart" ? () => JSON.parse(text) : () => {}, { inbox, once: true, log: () => {} });
  await inbox.close();
  console.log(JSON.stringify({ ms: performance.now() - started, written: written() - from, ...stats }));
}

// sqliteHalf runs the SQLite rounds, each a fill and a drain in a process of its own, and returns its line.
async function sqliteHalf(): Promise<string> {
  const { inline, apart } = await rounds(
    "SQLite ",
    "written",
    async (kind) => {
      const { dir, cleanup } = tempDir();
      try {
        const path = join(dir, "inbox.db");
        fillBacklog(path, ROWS, "evt", kind === "inline" ? charge : () => least);
        const out = execFileSync(
          process.execPath,
          ["--import", "tsx", fileURLToPath(import.meta.url), "drain", path, kind],
          {
            cwd: ROOT,
            encoding: "utf8",
          },
        );
        const one = JSON.parse(out.trim().split("\n").at(-1)!) as { ms: number; written: number; done: number };
        if (one.done !== ROWS) throw new Error(`narrow: the SQLite drain did ${one.done} of ${ROWS}`);
        return { ms: one.ms, bytes: one.written };
      } finally {
        cleanup();
      }
    },
    // A body of about 1 KB, wherever store() keeps it, and one of 2 bytes.
    { inline: "1 KB", apart: "2 B" },
  );
  return (
    `narrow (SQLite): the worker's drain of ${f(ROWS)}, body of about 1 KB (where store() keeps it) ${f(inline.ms)} ms, of 2 bytes ${f(apart.ms)} ms: ` +
    `×${f(inline.ms / apart.ms, 2)} the time; written ${f(inline.bytes / ROWS)} against ${f(apart.bytes / ROWS)} B a delivery (medians of ${ROUNDS})`
  );
}

/** narrow runs the rounds on each backend and returns the summary lines. */
export async function narrow(): Promise<string> {
  const lines: string[] = [];
  if (process.env.BENCH_SQLITE !== "0") lines.push(await sqliteHalf());
  if (process.env.BENCH_POSTGRES !== "0") lines.push(await postgresHalf());
  return lines.join("\n");
}

// postgresHalf runs the PostgreSQL rounds on two tables shaped as delivery_rows and returns its line.
async function postgresHalf(): Promise<string> {
  if (!(await pgReachable())) return "narrow: skipped, PostgreSQL is not reachable at BENCH_PG_URL";
  const db = await freshDatabase("bench_narrow");
  const client = new pg.Client({ connectionString: db.url });
  await client.connect();
  try {
    const { inline, apart } = await rounds("", "WAL", (kind) => round(client, `narrow_${kind}`, kind === "inline"));
    return (
      `narrow: a claim and a done mark of ${f(ROWS)} rows, body of about 1 KB inline ${f(inline.ms)} ms, apart ${f(apart.ms)} ms: ` +
      `×${f(inline.ms / apart.ms, 2)} the time; WAL ${f(inline.bytes / ROWS)} against ${f(apart.bytes / ROWS)} B a delivery (medians of ${ROUNDS})`
    );
  } finally {
    await client.end();
    await db.drop();
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  if (process.argv[2] === "drain") await drainHere(process.argv[3]!, process.argv[4]!);
  else console.log(await narrow());
}

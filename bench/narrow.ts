// bench/narrow.ts: what a state change costs PostgreSQL with the body in the row and without it
// (docs/table.md#bodies-apart). Two tables shaped as delivery_rows, with its primary key and the claim's partial
// index, one carrying a Stripe-sized body of about 1 KB inline, the other an empty one (its body apart); each
// gets BENCH_NARROW_ROWS (100,000) rows, then the claim's update (status, available_at) and the done mark's
// (status, finished_at) of every row, in batches of 256 as the worker sends them, alternating between the two
// tables for BENCH_ROUNDS (3) rounds. Prints the medians, their ratio and the WAL each wrote.
//   npm run bench -- narrow

import { pathToFileURL } from "node:url";
import pg from "pg";
import { f, knob } from "./common.ts";
import { freshDatabase, pgReachable } from "./peers/pgdb.ts";

const ROWS = knob("BENCH_NARROW_ROWS", 100_000);
const ROUNDS = knob("BENCH_ROUNDS", 3);
const BATCH = 256;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

// round fills the table afresh and times both updates of every row, batch by batch; it returns ms and WAL bytes.
async function round(client: pg.Client, table: string, inline: boolean): Promise<{ ms: number; wal: number }> {
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
  return { ms, wal: Number(rows[0].b) };
}

/** narrow runs the rounds and returns the summary line. */
export async function narrow(): Promise<string> {
  if (!(await pgReachable())) return "narrow: skipped, PostgreSQL is not reachable at BENCH_PG_URL";
  const db = await freshDatabase("bench_narrow");
  const client = new pg.Client({ connectionString: db.url });
  await client.connect();
  try {
    const results = { inline: [] as { ms: number; wal: number }[], apart: [] as { ms: number; wal: number }[] };
    for (let r = 0; r < ROUNDS; r++) {
      for (const kind of r % 2 === 0 ? (["inline", "apart"] as const) : (["apart", "inline"] as const)) {
        const one = await round(client, `narrow_${kind}`, kind === "inline");
        results[kind].push(one);
        console.log(`  round ${r + 1} body ${kind.padEnd(6)} ${f(one.ms)} ms, WAL ${f(one.wal / ROWS)} B a delivery`);
      }
    }
    const [inline, apart] = [median(results.inline.map((x) => x.ms)), median(results.apart.map((x) => x.ms))];
    const [walIn, walApart] = [median(results.inline.map((x) => x.wal)), median(results.apart.map((x) => x.wal))];
    return (
      `narrow: a claim and a done mark of ${f(ROWS)} rows, body of about 1 KB inline ${f(inline)} ms, apart ${f(apart)} ms: ` +
      `×${f(inline / apart, 2)} the time; WAL ${f(walIn / ROWS)} against ${f(walApart / ROWS)} B a delivery (medians of ${ROUNDS})`
    );
  } finally {
    await client.end();
    await db.drop();
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) console.log(await narrow());

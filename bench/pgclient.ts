// bench/pgclient.ts: which PostgreSQL client should the inbox's PostgreSQL backend use? The same two
// transactions through `pg` (node-postgres) awaiting each query, `pg` with `pipeline: true`, and
// postgres.js, each from BENCH_PGCLIENT_CONNECTIONS (4) connections in a process of its own, on a fresh
// schema with synchronous_commit on. A (ingest): BEGIN, one 32-row INSERT … SELECT FROM unnest(…) ON
// CONFLICT DO NOTHING RETURNING id, COMMIT. B (drain): BEGIN, claim 128 rows (UPDATE … WHERE id IN
// (SELECT … FOR UPDATE SKIP LOCKED LIMIT 128) RETURNING *), 128 one-row payment INSERTs, one done UPDATE
// over unnest, COMMIT. Rows/s, and the client process's CPU per row; ratios against `pg` awaiting.
//   npm run bench -- pgclient          BENCH_PGCLIENT_SECONDS=5 BENCH_PGCLIENT_ROUNDS=1

import { spawn } from "node:child_process";
import { createHash, randomUUID } from "node:crypto";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import pg from "pg";
import postgres from "postgres";
import { ROOT, f, knob } from "./common.ts";
import { freshDatabase, pgReachable } from "./peers/pgdb.ts";

const SECONDS = knob("BENCH_PGCLIENT_SECONDS", 5);
const ROUNDS = knob("BENCH_PGCLIENT_ROUNDS", 1);
const CONNECTIONS = knob("BENCH_PGCLIENT_CONNECTIONS", 4);
const INGEST_ROWS = 32;
const CLAIM_ROWS = 128;

const CLIENTS = ["pg", "pg pipeline", "postgres.js"] as const;
type ClientName = (typeof CLIENTS)[number];
const WORKLOADS = ["ingest", "drain"] as const;
type Workload = (typeof WORKLOADS)[number];

/** Measured is what one child reports: rows written (A) or drained (B), wall time, its own CPU. */
interface Measured {
  rows: number;
  ms: number;
  cpuUs: number;
}

const SCHEMA = [
  `CREATE TABLE deliveries (
     id           bigserial PRIMARY KEY,
     source       text    NOT NULL,
     delivery_id  text    NOT NULL,
     body         bytea   NOT NULL,
     body_sha256  text    NOT NULL,
     received_at  bigint  NOT NULL,
     status       text    NOT NULL DEFAULT 'received',
     available_at bigint  NOT NULL,
     leased_until bigint,
     lease_token  text,
     attempts     integer NOT NULL DEFAULT 0,
     finished_at  bigint,
     UNIQUE (source, delivery_id))`,
  "CREATE INDEX deliveries_due ON deliveries (available_at) WHERE status = 'received'",
  `CREATE TABLE payments (source text NOT NULL, delivery_id text NOT NULL, customer text NOT NULL, amount numeric NOT NULL,
     PRIMARY KEY (source, delivery_id))`,
];

const INSERT = `INSERT INTO deliveries (source, delivery_id, body, body_sha256, received_at, available_at)
  SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::int8[], $6::int8[])
  ON CONFLICT DO NOTHING RETURNING id`;
const CLAIM = `UPDATE deliveries SET status = 'processing', leased_until = $1::int8 + 30000, lease_token = $2, attempts = attempts + 1
  WHERE id IN (SELECT id FROM deliveries WHERE status = 'received' AND available_at <= $1
               ORDER BY available_at LIMIT ${CLAIM_ROWS} FOR UPDATE SKIP LOCKED)
  RETURNING *`;
const PAY = "INSERT INTO payments (source, delivery_id, customer, amount) VALUES ($1, $2, $3, $4)";
const DONE = `UPDATE deliveries SET status = 'done', finished_at = $1, leased_until = NULL, lease_token = NULL
  FROM unnest($2::int8[]) AS d(id) WHERE deliveries.id = d.id`;

/** Claimed is the part of a claimed row the record-payment step reads. */
interface Claimed {
  id: string;
  source: string;
  delivery_id: string;
  body: Buffer;
}

const BODY = Buffer.from(JSON.stringify({ type: "payment.succeeded", customer: "Ann", amount: 5 }));
const DIGEST = createHash("sha256").update(BODY).digest("hex");

/** batch is one ingest transaction's parameters: INGEST_ROWS unique deliveries. */
function batch(prefix: string, n: number): unknown[] {
  const ids = Array.from({ length: INGEST_ROWS }, (_, i) => `${prefix}-${n}-${i}`);
  const now = Date.now();
  return [
    ids.map(() => "default"),
    ids,
    ids.map(() => BODY),
    ids.map(() => DIGEST),
    ids.map(() => now),
    ids.map(() => now),
  ];
}

function payments(rows: Claimed[]): [string, string, string, number][] {
  return rows.map((r) => {
    const event = JSON.parse(r.body.toString()) as { customer: string; amount: number };
    return [r.source, r.delivery_id, event.customer, event.amount];
  });
}

/** One transaction of a workload for one client; returns the rows it wrote or drained (0: nothing left). */
type Step = () => Promise<number>;

function pgSteps(
  url: string,
  pipeline: boolean,
  workload: Workload,
  prefix: string,
): { steps: Promise<Step[]>; end: () => Promise<void> } {
  const clients = Array.from({ length: CONNECTIONS }, () => new pg.Client({ connectionString: url, pipeline }));
  const q = (c: pg.Client, name: string, text: string, values?: unknown[]) => c.query({ name, text, values });
  const steps = Promise.all(
    clients.map(async (c, k): Promise<Step> => {
      await c.connect();
      let n = 0;
      if (workload === "ingest") {
        if (pipeline) {
          return async () => {
            const [, r] = await Promise.all([
              c.query("BEGIN"),
              q(c, "insert", INSERT, batch(`${prefix}${k}`, n++)),
              c.query("COMMIT"),
            ]);
            return r.rowCount ?? 0;
          };
        }
        return async () => {
          await c.query("BEGIN");
          const r = await q(c, "insert", INSERT, batch(`${prefix}${k}`, n++));
          await c.query("COMMIT");
          return r.rowCount ?? 0;
        };
      }
      return async () => {
        const now = Date.now();
        if (pipeline) void c.query("BEGIN");
        else await c.query("BEGIN");
        const rows = (await q(c, "claim", CLAIM, [now, randomUUID()])).rows as Claimed[];
        const pays = payments(rows);
        if (pipeline) {
          await Promise.all([
            ...pays.map((p) => q(c, "pay", PAY, p)),
            q(c, "done", DONE, [now, rows.map((r) => r.id)]),
            c.query("COMMIT"),
          ]);
        } else {
          for (const p of pays) await q(c, "pay", PAY, p);
          await q(c, "done", DONE, [now, rows.map((r) => r.id)]);
          await c.query("COMMIT");
        }
        return rows.length;
      };
    }),
  );
  return { steps, end: async () => void (await Promise.all(clients.map((c) => c.end()))) };
}

function postgresJsSteps(
  url: string,
  workload: Workload,
  prefix: string,
): { steps: Promise<Step[]>; end: () => Promise<void> } {
  const sql = postgres(url, { max: CONNECTIONS, onnotice: () => {} });
  // Each step is one sql.begin(): postgres.js sends the queries it is handed at once down one connection.
  const steps = Promise.resolve(
    Array.from({ length: CONNECTIONS }, (_, k): Step => {
      let n = 0;
      if (workload === "ingest") {
        return async () => {
          // postgres.js would take an array of Buffers for one bytea: each array says its element type.
          const params = batch(`${prefix}${k}`, n++).map((values, i) =>
            sql.array(values as never[], [25, 25, 17, 25, 20, 20][i]),
          );
          const [r] = await sql.begin((tx) => [tx.unsafe(INSERT, params, { prepare: true })]);
          return r!.count;
        };
      }
      return async () =>
        sql.begin(async (tx) => {
          const now = Date.now();
          const rows = (await tx.unsafe(CLAIM, [now, randomUUID()], { prepare: true })) as unknown as Claimed[];
          const pays = payments(rows);
          await Promise.all([
            ...pays.map((p) => tx.unsafe(PAY, p, { prepare: true })),
            tx.unsafe(
              DONE,
              [
                now,
                sql.array(
                  rows.map((r) => r.id),
                  20,
                ),
              ],
              { prepare: true },
            ),
          ]);
          return rows.length;
        });
    }),
  );
  return { steps, end: () => sql.end() };
}

/** measure runs in the child: CONNECTIONS loops of steps for SECONDS, or until a drain finds nothing. */
async function measure(client: ClientName, workload: Workload, url: string): Promise<Measured> {
  const prefix = `p${process.pid}-`;
  const { steps, end } =
    client === "postgres.js"
      ? postgresJsSteps(url, workload, prefix)
      : pgSteps(url, client === "pg pipeline", workload, prefix);
  const loops = await steps;
  // One warm-up step per connection prepares the statements before the clock starts.
  await Promise.all(loops.map((s) => s()));
  let rows = 0;
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  const until = t0 + SECONDS * 1000;
  await Promise.all(
    loops.map(async (step) => {
      while (performance.now() < until) {
        const got = await step();
        if (got === 0 && workload === "drain") return;
        rows += got;
      }
    }),
  );
  const ms = performance.now() - t0;
  const cpu = process.cpuUsage(cpu0);
  await end();
  return { rows, ms, cpuUs: cpu.user + cpu.system };
}

/** prepare makes the fresh database's tables, and for the drain a backlog larger than the run can drain. */
async function prepare(url: string, workload: Workload, backlog: number): Promise<void> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    await c.query("SHOW synchronous_commit").then((r) => {
      if ((r.rows[0] as { synchronous_commit: string }).synchronous_commit !== "on")
        throw new Error("pgclient: synchronous_commit is not on");
    });
    for (const statement of SCHEMA) await c.query(statement);
    if (workload === "drain") {
      await c.query(
        `INSERT INTO deliveries (source, delivery_id, body, body_sha256, received_at, available_at)
         SELECT 'default', 'bk_' || i,
                convert_to(json_build_object('type', 'payment.succeeded', 'customer', 'c' || (i % 1000), 'amount', i % 100 + 1)::text, 'UTF8'),
                'x', 0, i
         FROM generate_series(1, $1::int) AS i`,
        [backlog],
      );
      await c.query("VACUUM ANALYZE deliveries");
    }
  } finally {
    await c.end();
  }
}

async function child(client: ClientName, workload: Workload, url: string): Promise<Measured> {
  const p = spawn(
    process.execPath,
    ["--import", "tsx", join(ROOT, "bench/pgclient.ts"), "child", client, workload, url],
    {
      cwd: ROOT,
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
  let out = "";
  let err = "";
  p.stdout.on("data", (d: Buffer) => (out += d));
  p.stderr.on("data", (d: Buffer) => (err += d));
  const code = await new Promise<number | null>((resolve) => p.on("exit", resolve));
  if (code !== 0) throw new Error(`pgclient ${client} ${workload} exited with ${code}: ${err.slice(-800)}`);
  return JSON.parse(out.trim().split("\n").at(-1)!) as Measured;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

/** pgclient runs both workloads through every client and returns the summary line. */
export async function pgclient(): Promise<string> {
  if (!(await pgReachable())) return "pgclient: skipped, PostgreSQL is not reachable at BENCH_PG_URL";
  const got = new Map<string, { rate: number[]; cpu: number[] }>();
  console.log(
    `pgclient: ${CONNECTIONS} connections, ${SECONDS} s per run, ${ROUNDS} round(s), synchronous_commit on, fresh database per run`,
  );
  for (let round = 1; round <= ROUNDS; round++) {
    for (const workload of WORKLOADS) {
      for (const client of CLIENTS) {
        const db = await freshDatabase("bench_pgclient");
        try {
          await prepare(db.url, workload, 60_000 * SECONDS);
          const m = await child(client, workload, db.url);
          const key = `${workload}/${client}`;
          if (!got.has(key)) got.set(key, { rate: [], cpu: [] });
          got.get(key)!.rate.push((m.rows / m.ms) * 1000);
          got.get(key)!.cpu.push(m.cpuUs / m.rows);
          console.log(
            `  round ${round} ${workload.padEnd(6)} ${client.padEnd(12)} ${f((m.rows / m.ms) * 1000).padStart(7)} rows/s  client CPU ${f(m.cpuUs / m.rows, 1)} µs/row`,
          );
        } finally {
          await db.drop();
        }
      }
    }
  }
  const parts = WORKLOADS.map((workload) => {
    const base = got.get(`${workload}/pg`)!;
    return (
      `${workload === "ingest" ? `A ingest (${INGEST_ROWS}-row unnest insert per transaction)` : `B drain (claim ${CLAIM_ROWS}, ${CLAIM_ROWS} payment inserts, one done update)`}: ` +
      CLIENTS.map((client) => {
        const m = got.get(`${workload}/${client}`)!;
        return `${client} ${f(median(m.rate))} rows/s ×${f(median(m.rate) / median(base.rate), 2)} (${f(median(m.cpu), 1)} µs CPU/row)`;
      }).join(", ")
    );
  });
  return `pgclient (${CONNECTIONS} connections, median of ${ROUNDS}):\n  ${parts.join("\n  ")}`;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  if (process.argv[2] === "child") {
    const [client, workload, url] = process.argv.slice(3) as [ClientName, Workload, string];
    console.log(JSON.stringify(await measure(client, workload, url)));
  } else {
    console.log(await pgclient());
  }
}

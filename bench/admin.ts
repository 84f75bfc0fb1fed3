// bench/admin.ts: how fast the operator page answers with a million deliveries in the database: the
// overview, filtered lists, the next page, grouped failures and a bulk count, each as an HTTP request to
// admin.ts, against the 200 ms target and against the same requests on 1,000 deliveries (the baseline);
// beside them, the JSON API's lists and searches (lib/api/), with a key, p50, p95 and p99.
//   npm run bench -- admin                                  # SQLite, and PostgreSQL if it answers
//   BENCH_ADMIN_ROWS=200000 BENCH_ADMIN_REPEAT=9 npm run bench -- admin

import { request } from "node:http";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { createAdmin, listenAdmin } from "../admin.ts";
import { connect } from "../inbox.ts";
import { mintKey } from "../lib/api/keys.ts";
import { openDatabase } from "../lib/sqlite/schema.ts";
import { sha256 } from "../lib/rows.ts";
import { f, flushFill, knob, tempDir } from "./common.ts";

const ROWS = knob("BENCH_ADMIN_ROWS", 1_000_000);
const REPEAT = knob("BENCH_ADMIN_REPEAT", 15);
const TARGET_MS = 200;
const POSTGRES = process.env.INBOX_TEST_POSTGRES ?? "postgres://postgres@127.0.0.1:5432/test";
const SOURCES = ["stripe", "github", "shopify"];
const TYPES = ["charge.succeeded", "invoice.paid", "push", "pull_request", "orders/create", "customer.updated"];
const ERRORS = ["HTTP 502 from payments-api", "customer not found", "invalid amount: expected a positive integer"];

// What each delivery i is: mostly done, some failed or waiting, a week of arrivals a fraction of a second
// apart; each source sends two event types of its own. fillPostgres builds the same rows in SQL.
function shape(i: number, n: number, now: number) {
  const receivedAt = now - Math.round(((n - i) * 7 * 86_400_000) / n);
  const r = (i * 2654435761) % 1000;
  const status = r < 30 ? "failed" : r < 90 ? "received" : r < 95 ? "processing" : "done";
  return {
    source: SOURCES[i % 3]!,
    id: `evt_${i}`,
    type: TYPES[(i % 3) * 2 + (Math.floor(i / 3) % 2)]!,
    receivedAt,
    status,
    finishedAt: status === "done" || status === "failed" ? receivedAt + 1_500 : null,
    error: status === "failed" ? `${ERRORS[i % 3]} (attempt 5, ${i % 997} ms)` : null,
    body: Buffer.from(
      JSON.stringify({ id: `evt_${i}`, data: { customer: `cus_${i % 50_000}`, amount: (i % 9000) + 100 } }),
    ),
  };
}

/** fillSqlite writes n deliveries straight into the table in big transactions, as bench/common's fillBacklog does. */
export function fillSqlite(path: string, n: number, now: number): void {
  openDatabase(path).close();
  const db = new DatabaseSync(path);
  db.exec("PRAGMA synchronous = OFF"); // only while filling a throwaway bench database
  const insert = db.prepare(
    `INSERT INTO deliveries (source, id, body, body_sha256, content_type, event_type, received_at, status, attempts,
                             available_at, leased_until, lease_ms, error, finished_at)
     VALUES (?, ?, ?, ?, 'application/json', ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
  );
  for (let start = 0; start < n; start += 50_000) {
    db.exec("BEGIN");
    for (let i = start; i < Math.min(n, start + 50_000); i++) {
      const d = shape(i, n, now);
      const leased = d.status === "processing" ? now + 60_000 : null;
      insert.run(
        d.source,
        d.id,
        d.body,
        sha256(d.body),
        d.type,
        d.receivedAt,
        d.status,
        d.status === "received" ? 0 : 1,
        d.status === "received" ? d.receivedAt : now,
        leased,
        leased === null ? null : 60_000,
        d.error,
        d.finishedAt,
      );
    }
    db.exec("COMMIT");
  }
  db.exec("ANALYZE");
  db.exec("PRAGMA wal_checkpoint(TRUNCATE)");
  db.close();
  flushFill(path);
}

/** fillPostgres lets the server generate the rows (generate_series), the same shape as fillSqlite's. */
export async function fillPostgres(url: string, n: number, now: number): Promise<void> {
  const inbox = await connect(url);
  try {
    await inbox.query(
      `INSERT INTO deliveries (source, id, body, body_sha256, content_type, event_type, received_at, status, attempts,
                               available_at, leased_until, lease_ms, error, finished_at)
       SELECT (ARRAY['stripe','github','shopify'])[i % 3 + 1], 'evt_' || i, b, encode(sha256(b), 'hex'), 'application/json',
              (ARRAY['charge.succeeded','invoice.paid','push','pull_request','orders/create','customer.updated'])[(i % 3) * 2 + (i / 3) % 2 + 1],
              t, s, CASE WHEN s = 'received' THEN 0 ELSE 1 END, CASE WHEN s = 'received' THEN t ELSE ?::bigint END,
              CASE WHEN s = 'processing' THEN ?::bigint + 60000 END, CASE WHEN s = 'processing' THEN 60000 END,
              CASE WHEN s = 'failed' THEN (ARRAY['HTTP 502 from payments-api','customer not found','invalid amount: expected a positive integer'])[i % 3 + 1]
                                          || ' (attempt 5, ' || (i % 997) || ' ms)' END,
              CASE WHEN s IN ('done', 'failed') THEN t + 1500 END
       FROM (SELECT i, ?::bigint - ((?::bigint - i) * 604800000 / ?::bigint) AS t,
                    CASE WHEN (i * 2654435761) % 1000 < 30 THEN 'failed' WHEN (i * 2654435761) % 1000 < 90 THEN 'received'
                         WHEN (i * 2654435761) % 1000 < 95 THEN 'processing' ELSE 'done' END AS s,
                    convert_to('{"id":"evt_' || i || '","data":{"customer":"cus_' || (i % 50000) || '","amount":' || (i % 9000 + 100) || '}}', 'UTF8') AS b
             FROM generate_series(0::bigint, ?::bigint - 1) AS i) AS g`,
      now,
      now,
      now,
      n,
      n,
      n,
    );
    // What autovacuum does soon after a load like this one: statistics, and the visibility map index-only scans need.
    await inbox.query("VACUUM ANALYZE deliveries");
  } finally {
    await inbox.close();
  }
}

function get(url: string, headers: Record<string, string> = {}): Promise<{ ms: number; status: number }> {
  const started = performance.now();
  return new Promise((resolve, reject) => {
    request(url, { headers }, (res) => {
      res.resume().on("end", () => resolve({ ms: performance.now() - started, status: res.statusCode! }));
    })
      .on("error", reject)
      .end();
  });
}

const quantile = (xs: number[], q: number) =>
  [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(q * xs.length))]!;

// measure times each page REPEAT times (after one warm-up) on a running admin over target.
async function measure(target: string): Promise<Map<string, Timing>> {
  const inbox = await connect(target);
  const admin = createAdmin({ inbox, audit: () => {} });
  const url = await listenAdmin(admin, { host: "127.0.0.1", port: 0 });
  const results = new Map<string, Timing>();
  const made = mintKey({ scope: "read", name: "bench", now: Date.now() });
  await inbox.addApiKey(made.row);
  const bearer = { authorization: `Bearer ${made.key}` };
  try {
    // The cursor of a second page comes from the first page's own "older" link.
    const first = await new Promise<string>((resolve, reject) => {
      request(`${url}/deliveries?status=failed&source=stripe`, (res) => {
        let html = "";
        res
          .setEncoding("utf8")
          .on("data", (d) => (html += d))
          .on("end", () => resolve(html));
      })
        .on("error", reject)
        .end();
    });
    const next =
      /<a rel="next" href="([^"]+)"/.exec(first)?.[1]?.replaceAll("&#38;", "&") ??
      "/deliveries?status=failed&source=stripe";
    const pages: [string, string][] = [
      ["overview", "/"],
      ["overview, live refresh", "/?fragment=overview"],
      ["list, newest", "/deliveries"],
      ["list, failed from stripe", "/deliveries?status=failed&source=stripe"],
      ["list, its next page", next],
      [
        "list, github push last day",
        `/deliveries?source=github&type=push&since=${new Date(Date.now() - 86_400_000).toISOString().slice(0, 16)}`,
      ],
      ["list, error contains", "/deliveries?status=failed&error=payments-api"],
      ["list, exact ID", "/deliveries?id=evt_4242"],
      ["list, body contains (rare)", "/deliveries?q=cus_42424"],
      ["failures grouped", "/failures"],
      ["bulk count, failed from stripe", "/bulk?action=retry&source=stripe"],
    ];
    // The API's page of 50, as the page's, and its next page from its own cursor.
    const api = "/api/v1/deliveries?limit=50";
    const firstApi = await new Promise<string>((resolve, reject) => {
      request(`${url}${api}&status=failed&source=stripe`, { headers: bearer }, (res) => {
        let text = "";
        res
          .setEncoding("utf8")
          .on("data", (d) => (text += d))
          .on("end", () => resolve(text));
      })
        .on("error", reject)
        .end();
    });
    const after = (JSON.parse(firstApi) as { next: string | null }).next;
    pages.push(
      ["api: list, newest", api],
      ["api: list, failed from stripe", `${api}&status=failed&source=stripe`],
      ["api: list, its next page", `${api}&status=failed&source=stripe${after ? `&after=${after}` : ""}`],
      ["api: search, github push last day", `${api}&source=github&type=push&since=${Date.now() - 86_400_000}`],
      ["api: search, error contains", `${api}&status=failed&error=payments-api`],
      ["api: search, exact ID", `${api}&id=evt_4242`],
      ["api: search, body contains (rare)", `${api}&body=cus_42424`],
      ["api: status counts", "/api/v1/status"],
    );
    for (const [name, path] of pages) {
      const headers = path.startsWith("/api/") ? bearer : {};
      const warm = await get(`${url}${path}`, headers);
      if (warm.status !== 200) throw new Error(`${path}: HTTP ${warm.status}`);
      const ms: number[] = [];
      for (let i = 0; i < REPEAT; i++) ms.push((await get(`${url}${path}`, headers)).ms);
      results.set(name, { p50: quantile(ms, 0.5), p95: quantile(ms, 0.95), p99: quantile(ms, 0.99) });
    }
  } finally {
    admin.server.close();
    await inbox.close();
  }
  return results;
}

// Timing is one request's figures over REPEAT tries: with the default 15, the p99 is the slowest.
interface Timing {
  p50: number;
  p95: number;
  p99: number;
}

function report(backend: string, big: Map<string, Timing>, small: Map<string, Timing>): number {
  console.log(`  ${backend}: ${ROWS.toLocaleString("en")} deliveries (baseline: 1,000), ${REPEAT} requests each`);
  let misses = 0;
  for (const [name, r] of big) {
    const base = small.get(name)!;
    const ok = r.p50 < TARGET_MS;
    if (!ok) misses++;
    console.log(
      `    ${name.padEnd(36)} p50 ${f(r.p50, 1).padStart(7)} ms  p95 ${f(r.p95, 1).padStart(7)} ms  p99 ${f(r.p99, 1).padStart(7)} ms  ×${f(r.p50 / base.p50, 1).padStart(5)} of 1k  ${ok ? "under" : "OVER"} ${TARGET_MS} ms`,
    );
  }
  return misses;
}

/** admin is the benchmark run by bench/run.ts: one summary line. */
export async function admin(): Promise<string> {
  const now = Date.now();
  const dir = tempDir();
  const summary: string[] = [];
  try {
    console.log(`admin: the operator page with ${ROWS.toLocaleString("en")} deliveries; target p50 < ${TARGET_MS} ms`);
    let started = performance.now();
    fillSqlite(join(dir.dir, "big.db"), ROWS, now);
    fillSqlite(join(dir.dir, "small.db"), 1_000, now);
    console.log(`  filled SQLite in ${f((performance.now() - started) / 1000, 1)} s`);
    const misses = report("sqlite", await measure(join(dir.dir, "big.db")), await measure(join(dir.dir, "small.db")));
    summary.push(`sqlite ${misses === 0 ? "all under" : `${misses} over`} ${TARGET_MS} ms`);

    const pg = await import("pg");
    const probe = new pg.default.Client({ connectionString: POSTGRES, connectionTimeoutMillis: 3_000 });
    let reachable = true;
    try {
      await probe.connect();
    } catch {
      reachable = false;
    } finally {
      await probe.end().catch(() => {});
    }
    if (!reachable) {
      console.log(`  postgres: skipped, no server at ${POSTGRES}`);
    } else {
      const schema = `bench_admin_${process.pid}`;
      const big = new URL(POSTGRES);
      big.searchParams.set("schema", `${schema}_big`);
      const small = new URL(POSTGRES);
      small.searchParams.set("schema", `${schema}_small`);
      try {
        started = performance.now();
        await fillPostgres(big.toString(), ROWS, now);
        await fillPostgres(small.toString(), 1_000, now);
        console.log(`  filled PostgreSQL in ${f((performance.now() - started) / 1000, 1)} s`);
        const pgMisses = report("postgres", await measure(big.toString()), await measure(small.toString()));
        summary.push(`postgres ${pgMisses === 0 ? "all under" : `${pgMisses} over`} ${TARGET_MS} ms`);
      } finally {
        const client = new pg.default.Client({ connectionString: POSTGRES });
        await client.connect();
        await client.query(
          `DROP SCHEMA IF EXISTS ${schema}_big CASCADE; DROP SCHEMA IF EXISTS ${schema}_small CASCADE`,
        );
        await client.end();
      }
    }
  } finally {
    dir.cleanup();
  }
  return `admin     ${ROWS.toLocaleString("en")} deliveries: ${summary.join(", ")} (p50 per page)`;
}

if (import.meta.url === `file://${process.argv[1]}`) console.log(await admin());

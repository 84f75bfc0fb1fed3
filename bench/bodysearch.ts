// bench/bodysearch.ts: searching bodies through the search indexes (lib/search.ts) against the old body
// contains that reads every body, in the same run, on an inbox of BENCH_BODY_SEARCH_ROWS (20,000; the issue's
// goals are at ten million) Stripe- and GitHub-shaped deliveries filled through restore(), each backend's bulk
// path. Prints p50/p99 of a list by source, status and time, a JSON containment, a word search, and body
// contains with and without a day's bound, each over BENCH_BODY_SEARCH_QUERIES (200) needles, with the ratios;
// the migration's cost; search enable's backfill; what store() pays with the index on, indexed after the ack
// against main's triggers that indexed in it, in the same run; their size; EXPLAIN showing the index used; and on
// PostgreSQL pg_trgm beside full-text search for the same words. SQLite always; PostgreSQL unless
// BENCH_POSTGRES=0 or none answers. Warm cache only: the bench may not drop the machine's page cache.
//   npm run bench -- bodysearch        BENCH_BODY_SEARCH_ROWS=1000000 npm run bench -- bodysearch

import { join } from "node:path";
import { connect } from "../inbox.ts";
import { DEFAULTS } from "../lib/defaults.ts";
import { toPg } from "../lib/postgres/commit.ts";
import { MIGRATIONS as SQLITE_MIGRATIONS } from "../lib/sqlite/schema.ts";
import { sha256 } from "../lib/rows.ts";
import { SearchTooBroad } from "../lib/search.ts";
import { filterSql } from "../lib/sql.ts";
import type { Delivery, Filter, Inbox } from "../lib/store.ts";
import { f, knob, tempDir } from "./common.ts";
import { PG_URL, freshDatabase, pgReachable } from "./peers/pgdb.ts";

const ROWS = knob("BENCH_BODY_SEARCH_ROWS", 20_000);
const QUERIES = knob("BENCH_BODY_SEARCH_QUERIES", 200);
// The forms that read many rows whatever the index: a tenth of the needles each.
const slow = (name: string) => name.endsWith(", all") || name.includes("common");

/** Out takes the bench's lines, printing each as it comes, so a long run shows what it has measured so far. */
interface Out {
  push(...lines: string[]): void;
}
const CUSTOMERS = 5_000;
const REPOS = 200;
const DAY = 86_400_000;
// Thirty days of deliveries, the newest now, so that a day's bound holds a thirtieth of them.
const NOW = Date.now();
const SPAN = 30 * DAY;
// Past ROWS (the deliveries restored after the upgrade) the times start again, so that the last day holds a thirtieth.
const at = (i: number) => NOW - SPAN + Math.floor(((i % ROWS) * SPAN) / ROWS);

// A small deterministic generator, so both backends hold the same bodies and a rerun the same needles.
function random(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const ALPHA = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
const token = (r: () => number, n: number) => Array.from({ length: n }, () => ALPHA[Math.floor(r() * 62)]).join("");
const WORDS =
  "fix add update remove refactor retry queue worker inbox webhook ledger invoice payment handler timeout test docs bump release merge".split(
    " ",
  );
const customer = (k: number) => `cus_${token(random(k + 1), 14)}`;
const repo = (k: number) => `octo-org/service-${k}`;
const charge = (i: number) => `ch_${token(random(i * 7 + 3), 24)}`;

// stripe is an invoice.paid or charge.succeeded event as Stripe sends it, cut to its usual keys (~1.6 KB).
function stripe(i: number, r: () => number): object {
  const cus = customer(Math.floor(r() * CUSTOMERS));
  const created = Math.floor(at(i) / 1000);
  const amount = Math.floor(r() * 100_000);
  return {
    id: `evt_${token(r, 24)}`,
    object: "event",
    api_version: "2024-06-20",
    created,
    type: i % 4 === 0 ? "charge.succeeded" : "invoice.paid",
    livemode: false,
    pending_webhooks: 1,
    request: { id: `req_${token(r, 14)}`, idempotency_key: token(r, 32) },
    data: {
      object: {
        id: i % 4 === 0 ? charge(i) : `in_${token(r, 24)}`,
        object: i % 4 === 0 ? "charge" : "invoice",
        amount,
        amount_paid: amount,
        currency: "usd",
        customer: cus,
        customer_email: `${cus.slice(4, 10).toLowerCase()}@example.com`,
        charge: charge(i),
        paid: true,
        status: "paid",
        billing_reason: "subscription_cycle",
        subscription: `sub_${token(r, 24)}`,
        hosted_invoice_url: `https://invoice.stripe.com/i/acct_1M2/test_${token(r, 40)}`,
        lines: {
          object: "list",
          data: [
            {
              id: `il_${token(r, 24)}`,
              amount,
              description: `1 × Gold plan (at $${(amount / 100).toFixed(2)} / month)`,
              price: { id: `price_${token(r, 24)}`, product: `prod_${token(r, 14)}`, unit_amount: amount },
              period: { start: created - 2_592_000, end: created },
            },
          ],
        },
        metadata: { order_id: `ord_${i}`, plan: "gold" },
      },
    },
  };
}

// github is a push as GitHub sends it, cut to its usual keys (~2 KB).
function github(i: number, r: () => number): object {
  const name = repo(Math.floor(r() * REPOS));
  const commits = Array.from({ length: 1 + Math.floor(r() * 3) }, () => ({
    id: token(r, 40).toLowerCase(),
    message: Array.from({ length: 4 + Math.floor(r() * 6) }, () => WORDS[Math.floor(r() * WORDS.length)]).join(" "),
    timestamp: new Date(at(i)).toISOString(),
    url: `https://github.com/${name}/commit/${token(r, 40).toLowerCase()}`,
    author: { name: "Mona Lisa Octocat", email: "mona@example.com", username: "octocat" },
    added: [],
    removed: [],
    modified: ["lib/queue.ts"],
  }));
  return {
    ref: "refs/heads/main",
    before: token(r, 40).toLowerCase(),
    after: commits.at(-1)!.id,
    repository: {
      id: 1_000_000 + i,
      name: name.split("/")[1],
      full_name: name,
      private: false,
      owner: { login: "octo-org", id: 583231 },
      html_url: `https://github.com/${name}`,
      default_branch: "main",
    },
    pusher: { name: "octocat", email: "mona@example.com" },
    sender: { login: "octocat", id: 583231, type: "User" },
    commits,
    head_commit: commits.at(-1),
  };
}

// delivery i: two thirds Stripe, a third GitHub; 90% done, 5% failed, 5% waiting.
function delivery(i: number): Delivery {
  const r = random(i * 2 + 1);
  const source = i % 3 === 2 ? "github" : "stripe";
  const bytes = Buffer.from(JSON.stringify(source === "stripe" ? stripe(i, r) : github(i, r)));
  const status = i % 20 === 0 ? "failed" : i % 20 === 1 ? "received" : "done";
  const received = at(i);
  return {
    source,
    id: `${source}_${i}`,
    body: bytes,
    bodySha256: sha256(bytes),
    contentType: "application/json",
    eventType: source === "github" ? "push" : i % 4 === 0 ? "charge.succeeded" : "invoice.paid",
    providerTime: null,
    receivedAt: received,
    status,
    attempts: status === "received" ? 0 : 1,
    availableAt: received,
    leasedUntil: null,
    error: status === "failed" ? "HTTP 500 from the ledger" : null,
    conflicts: 0,
    finishedAt: status === "received" ? null : received + 50,
    replays: 0,
    purgedAt: null,
    orderKey: null,
    eventTime: null,
    newerId: null,
    destination: DEFAULTS.destination,
    route: 0,
    headers: null,
    traceparent: null,
    origin: "webhook",
  };
}

// fill restores deliveries from..to-1 through restore(), 2,000 a call, and returns how long it took in ms.
async function fill(inbox: Inbox, from: number, to: number): Promise<number> {
  const started = performance.now();
  for (let start = from; start < to; start += 2_000) {
    const batch: Delivery[] = [];
    for (let i = start; i < Math.min(to, start + 2_000); i++) batch.push(delivery(i));
    await inbox.restore(batch);
  }
  return performance.now() - started;
}

// The deliveries restored last, once without the search index and once with it: what indexing costs a store.
const EXTRA = Math.max(2_000, Math.min(20_000, Math.floor(ROWS / 10)));

// UNMIGRATE takes an inbox back to the schema before search, so that opening it again runs the migrations over
// the rows already there, as an upgrade would: the bench times that open, then enableSearch()'s backfill. Search's
// migration is found by what it makes, so that one added after it (which the open runs again) moves nothing.
const SEARCH = {
  sqlite: SQLITE_MIGRATIONS.findIndex((m) => m.includes("CREATE VIRTUAL TABLE deliveries_search")),
};
const UNMIGRATE = {
  sqlite: [
    "DROP TRIGGER IF EXISTS deliveries_search_update",
    "DROP TRIGGER IF EXISTS deliveries_search_delete",
    "DROP TABLE deliveries_search",
    "DROP TABLE search_state",
    `PRAGMA user_version = ${SEARCH.sqlite}`,
  ],
  // Not on PostgreSQL any more: the hot queue and history's migration came after search's, and a rewind past
  // search runs it again over the partitions it made. An inbox with the index off is filled instead (its
  // search tables empty, no trigger on delivery_rows: what a store pays is the same), and the migrations' own
  // time is not timed there; search enable's backfill still is.
  postgres: [] as string[],
};

// IN_THE_ACK is the index kept as main kept it before search moved after the ack: triggers that index each body
// in the store's own transaction (the SQL of lib/sqlite/searching.ts and lib/postgres/searching.ts then), put in
// place of this branch's for one side of the run and taken out after, so both ways are measured on one inbox.
// SQLite's indexed every row it stored: the index's place is moved past them after (AFTER_IN_THE_ACK).
const IN_THE_ACK = {
  sqlite: [
    `CREATE TRIGGER bench_search_in_the_ack AFTER INSERT ON delivery_rows
     BEGIN
       INSERT INTO deliveries_search (rowid, words) SELECT new.rowid,
         (SELECT group_concat(CASE type WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' ELSE value END, ' ')
            FROM json_tree(CAST(b.body AS TEXT)) WHERE type IN ('text', 'integer', 'real', 'true', 'false'))
         FROM (SELECT CASE WHEN new.body_seq IS NULL THEN new.body
                           ELSE (SELECT body FROM delivery_bodies WHERE seq = new.body_seq) END AS body) b
        WHERE length(b.body) <= 65536 AND json_valid(CAST(b.body AS TEXT));
     END`,
  ],
  postgres: [
    "DROP TRIGGER deliveries_search_insert ON delivery_rows",
    `CREATE TRIGGER bench_search_in_the_ack AFTER INSERT ON delivery_rows
       FOR EACH ROW WHEN (NEW.route = 0 AND octet_length(NEW.body) > 0) EXECUTE FUNCTION inbox_search_sync()`,
    `CREATE TRIGGER bench_search_in_the_ack_body AFTER INSERT ON delivery_bodies
       FOR EACH ROW WHEN (NEW.route = 0) EXECUTE FUNCTION inbox_search_sync()`,
  ],
};
const AFTER_IN_THE_ACK = {
  sqlite: [
    "DROP TRIGGER bench_search_in_the_ack",
    "UPDATE search_state SET done_rowid = (SELECT max(rowid) FROM deliveries)",
  ],
  postgres: [
    "DROP TRIGGER bench_search_in_the_ack ON delivery_rows",
    "DROP TRIGGER bench_search_in_the_ack_body ON delivery_bodies",
    `CREATE TRIGGER deliveries_search_insert AFTER INSERT ON delivery_rows
       REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION inbox_search_queue()`,
  ],
};

// The deliveries store() takes, with and without the index: as a receiver takes them, 512 in flight.
const STORES = 4_096;

// stored runs STORES store() calls of new deliveries (IDs under prefix), 512 at once, and returns the ms they took.
async function stored(inbox: Inbox, prefix: string): Promise<number> {
  const started = performance.now();
  for (let start = 0; start < STORES; start += 512) {
    const batch = [];
    for (let i = start; i < start + 512; i++) {
      const d = delivery(i);
      batch.push(inbox.store({ source: d.source, id: `${prefix}_${d.id}`, body: d.body, eventType: d.eventType }));
    }
    await Promise.all(batch);
  }
  return performance.now() - started;
}

// caughtUp runs indexSearch() until none is left, as the worker's tick does, and returns the ms it took.
async function caughtUp(inbox: Inbox): Promise<number> {
  const started = performance.now();
  while ((await inbox.indexSearch(DEFAULTS.searchIndexBatch)) === DEFAULTS.searchIndexBatch);
  return performance.now() - started;
}

// storedBeside runs stored() while a second inbox on the same target (a worker's, in a process of its own in
// production) indexes without a pause, the worst its tick can do (DEFAULTS.searchIndexEveryMs apart, it does less),
// then catches up what is left; it returns the stores' ms, and the ms from their end until the index had caught up.
async function storedBeside(inbox: Inbox, worker: Inbox, prefix: string): Promise<{ ms: number; lagMs: number }> {
  let done = false;
  const ticking = (async () => {
    while (!done) {
      await caughtUp(worker);
      await new Promise((resolve) => setImmediate(resolve));
    }
  })();
  const ms = await stored(inbox, prefix);
  const ended = performance.now();
  done = true;
  await ticking;
  await caughtUp(worker);
  return { ms, lagMs: performance.now() - ended };
}

// The rounds alternated() runs, each side once a round, so that no side has the warmer cache or the smaller table.
const ROUNDS = 3;

interface Ways {
  off: number;
  after: number;
  inTheAck: number;
  indexing: number;
}

// alternated times store() ROUNDS times on each of three sides of one inbox with the index on, in turn: off (the
// index switched off for the side: SQLite's flag, PostgreSQL's queue trigger dropped), on and indexed after the
// ack (then the catch-up that indexes what it stored, timed), and on and indexed in the ack (IN_THE_ACK, main's
// triggers). It returns each round's ms and each side's median.
async function alternated(inbox: Inbox): Promise<{ rounds: Ways[]; medians: Ways }> {
  const OFF = {
    sqlite: ["UPDATE search_state SET enabled = 0"],
    postgres: ["DROP TRIGGER deliveries_search_insert ON delivery_rows"],
  };
  const ON = {
    sqlite: ["UPDATE search_state SET enabled = 1"],
    postgres: [
      `CREATE TRIGGER deliveries_search_insert AFTER INSERT ON delivery_rows
         REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION inbox_search_queue()`,
    ],
  };
  const rounds: Ways[] = [];
  for (let round = 0; round < ROUNDS; round++) {
    for (const sql of OFF[inbox.backend]) await inbox.query(sql);
    const off = await stored(inbox, `off${round}`);
    for (const sql of ON[inbox.backend]) await inbox.query(sql);
    // What was stored while off is indexed now, so that the sides after start with nothing waiting.
    await caughtUp(inbox);
    const after = await stored(inbox, `after${round}`);
    const indexing = await caughtUp(inbox);
    for (const sql of IN_THE_ACK[inbox.backend]) await inbox.query(sql);
    const inTheAck = await stored(inbox, `ack${round}`);
    for (const sql of AFTER_IN_THE_ACK[inbox.backend]) await inbox.query(sql);
    rounds.push({ off, after, inTheAck, indexing });
  }
  const median = (pick: (w: Ways) => number) => rounds.map(pick).sort((a, b) => a - b)[Math.floor(ROUNDS / 2)]!;
  return {
    rounds,
    medians: {
      off: median((w) => w.off),
      after: median((w) => w.after),
      inTheAck: median((w) => w.inTheAck),
      indexing: median((w) => w.indexing),
    },
  };
}

// upgrade fills ROWS deliveries without the search migration, the last EXTRA of them timed, then opens the
// inbox again, timing the migration (the index off: an empty table), then enableSearch(), timing its backfill
// and its longest batch (what a writer may wait), and restores EXTRA more (then indexes them); then store() on
// three sides alternated (alternated()), and with a worker indexing beside the stores. On PostgreSQL store() and
// its indexing are timed again with fastupdate off on both GIN indexes, beside the default's pending list.
async function upgrade(target: string): Promise<{ inbox: Inbox; lines: string[] }> {
  const old = await connect(target);
  for (const sql of UNMIGRATE[old.backend]) await old.query(sql);
  const fillMs = await fill(old, 0, ROWS - EXTRA);
  const without = await fill(old, ROWS - EXTRA, ROWS);
  const storedWithout = await stored(old, "a");
  if (old.backend === "postgres") await old.query("VACUUM ANALYZE deliveries");
  await old.close();
  let started = performance.now();
  const inbox = await connect(target);
  const migrated = performance.now() - started;
  const offAgain = await stored(inbox, "o");
  started = performance.now();
  let last = started;
  let longest = 0;
  const status = await inbox.enableSearch({
    onBatch: () => {
      const now = performance.now();
      longest = Math.max(longest, now - last);
      last = now;
    },
  });
  const backfill = performance.now() - started;
  const withIndex = await fill(inbox, ROWS, ROWS + EXTRA);
  const restoredCaughtUp = await caughtUp(inbox);
  const ways = await alternated(inbox);
  const worker = await connect(target);
  const beside = await storedBeside(inbox, worker, "d").finally(() => worker.close());
  const us = (ms: number, n: number) => f((ms * 1000) / n, 0);
  const rate = (ms: number) => `${f((STORES / ms) * 1000)}/s`;
  const { off, after, inTheAck, indexing } = ways.medians;
  const lines = [
    `${inbox.backend}, ${ROWS + EXTRA} deliveries (${ROWS - EXTRA} filled through restore() in ${f(fillMs / 1000, 1)} s):`,
    inbox.backend === "postgres"
      ? "  the search migrations on opening: not timed on PostgreSQL (filled with the index off; no rewind past the hot queue's migration)"
      : `  the search migrations on opening an inbox of ${ROWS + STORES} deliveries (the index off: an empty table): ${f(migrated / 1000, 2)} s`,
    `  store() with the index off after the migrations: ${rate(offAgain)} (×${f(storedWithout / offAgain, 2)} of before them)`,
    `  search enable's backfill of ${status.backfilled} rows, ${DEFAULTS.searchBackfillBatch} a transaction: ${f(backfill / 1000, 1)} s ` +
      `(${f(backfill / 1000 / (status.backfilled / 1e6), 0)} s a million), its longest batch ${f(longest, 0)} ms`,
    `  ingest through restore(), ${EXTRA} deliveries: ${f((EXTRA / without) * 1000)}/s without the search index, ` +
      `${f((EXTRA / withIndex) * 1000)}/s with it, after the ack (×${f(without / withIndex, 2)}); indexing them after: ` +
      `${f(restoredCaughtUp / 1000, 2)} s (${us(restoredCaughtUp, EXTRA)} µs a row)`,
    `  store(), the receiver's own path, ${STORES} deliveries 512 at once, ${ROUNDS} rounds of three sides alternated, medians:`,
    `    index off ${rate(off)}; on, indexed after the ack ${rate(after)} (×${f(off / after, 2)}); ` +
      `on, indexed in the ack as main did ${rate(inTheAck)} (×${f(off / inTheAck, 2)})`,
    `    rounds, after the ack ×${ways.rounds.map((r) => f(r.off / r.after, 2)).join(", ×")}; ` +
      `in the ack ×${ways.rounds.map((r) => f(r.off / r.inTheAck, 2)).join(", ×")}`,
    `    indexing the ${STORES} stored after the ack, indexSearch() until none is left: ${f(indexing / 1000, 2)} s ` +
      `(${us(indexing, STORES)} µs a row); store and index together ${rate(after + indexing)} (×${f(off / (after + indexing), 2)})`,
    `  store() after the ack, a worker indexing beside it without a pause (a second inbox in this process): ` +
      `${rate(beside.ms)} (×${f(off / beside.ms, 2)} of off's median); caught up ${f(beside.lagMs, 0)} ms after the last ack`,
  ];
  if (inbox.backend === "postgres") {
    for (const index of ["deliveries_search_json", "deliveries_search_words"])
      await inbox.query(`ALTER INDEX ${index} SET (fastupdate = off)`);
    const storedNoPending = await stored(inbox, "e");
    const indexedNoPending = await caughtUp(inbox);
    lines.push(
      `  store() after the ack with fastupdate = off on the GIN indexes: ${rate(storedNoPending)}; indexing those after: ` +
        `${f(indexedNoPending / 1000, 2)} s (${us(indexedNoPending, STORES)} µs a row, against ${us(indexing, STORES)} with the pending list)`,
    );
    for (const index of ["deliveries_search_json", "deliveries_search_words"])
      await inbox.query(`ALTER INDEX ${index} RESET (fastupdate)`);
  }
  return { inbox, lines };
}

interface Timing {
  p50: number;
  p99: number;
  /** Searches refused at the search's time bound (SearchTooBroad), each timed as long as it ran. */
  refused: number;
}

// search runs one search as the page and the API ask for it, and says whether its bound refused it: at a
// million, body contains over every day passes the bound (DEFAULTS.searchTimeoutMs), and the bench goes on.
async function search(inbox: Inbox, filter: Filter): Promise<boolean> {
  try {
    await inbox.search(filter, { limit: 50 });
    return false;
  } catch (error) {
    if (error instanceof SearchTooBroad) return true;
    throw error;
  }
}

// timed runs one search per needle, newest-first pages of 50 as the page and the API ask, after one warm-up pass.
async function timed(inbox: Inbox, filters: Filter[]): Promise<Timing> {
  for (const filter of filters.slice(0, 5)) await search(inbox, filter);
  const ms: number[] = [];
  let refused = 0;
  for (const filter of filters) {
    const started = performance.now();
    if (await search(inbox, filter)) refused++;
    ms.push(performance.now() - started);
  }
  ms.sort((a, b) => a - b);
  const pick = (q: number) => ms[Math.min(ms.length - 1, Math.floor(q * ms.length))]!;
  return { p50: pick(0.5), p99: pick(0.99), refused };
}

// The needles, the same on both backends: the k-th of each kind.
const needles = (n: number, make: (k: number, r: () => number) => Filter): Filter[] => {
  const r = random(99);
  return Array.from({ length: n }, (_, k) => make(k, r));
};
const FORMS: [string, (k: number, r: () => number) => Filter][] = [
  [
    "list by source, status, hour",
    (_k, r) => {
      const since = NOW - Math.floor(r() * SPAN);
      return { source: r() < 0.5 ? "stripe" : "github", status: "done", since, until: since + 3_600_000 };
    },
  ],
  [
    "bodyJson customer",
    (_k, r) => ({
      bodyJson: JSON.stringify({ data: { object: { customer: customer(Math.floor(r() * CUSTOMERS)) } } }),
    }),
  ],
  [
    "bodyJson repository",
    (_k, r) => ({ bodyJson: JSON.stringify({ repository: { full_name: repo(Math.floor(r() * REPOS)) } }) }),
  ],
  ["bodyWords charge ID", (_k, r) => ({ bodyWords: charge(4 * Math.floor((r() * ROWS) / 4)) })],
  ["bodyWords customer", (_k, r) => ({ bodyWords: customer(Math.floor(r() * CUSTOMERS)) })],
  [
    "bodyWords two common words",
    (_k, r) => ({
      bodyWords: `${WORDS[Math.floor(r() * WORDS.length)]} ${WORDS[Math.floor(r() * WORDS.length)]}`,
    }),
  ],
  [
    "bodyContains charge ID, a day",
    (_k, r) => ({ bodyContains: charge(4 * Math.floor((r() * ROWS) / 4)), since: NOW - DAY }),
  ],
  ["bodyContains charge ID, all", (_k, r) => ({ bodyContains: charge(4 * Math.floor((r() * ROWS) / 4)) })],
];

async function measure(inbox: Inbox, out: Out): Promise<void> {
  const results = new Map<string, Timing>();
  for (const [name, make] of FORMS) {
    // Scanning every body, or every body with a common word, is slow: a tenth of the needles tell its p99.
    const n = slow(name) ? Math.max(10, Math.floor(QUERIES / 10)) : QUERIES;
    const t = await timed(inbox, needles(n, make));
    results.set(name, t);
    out.push(
      `  ${name.padEnd(32)} p50 ${f(t.p50, 1).padStart(8)} ms   p99 ${f(t.p99, 1).padStart(8)} ms   (${n} searches${t.refused ? `, ${t.refused} refused at the bound` : ""})`,
    );
  }
  const base = results.get("bodyContains charge ID, all")!;
  for (const name of ["bodyJson customer", "bodyWords charge ID", "bodyWords customer"]) {
    out.push(
      `  ${`${name} against bodyContains, all`.padEnd(48)} p99 ×${f(base.p99 / results.get(name)!.p99, 0)} faster`,
    );
  }
}

// plan explains one search as search() runs it, first page of 50.
async function plan(inbox: Inbox, filter: Filter): Promise<string> {
  const pg = inbox.backend === "postgres";
  const { where, params } = filterSql(filter, inbox.backend);
  const sql = `SELECT * FROM deliveries WHERE ${where} ORDER BY received_at DESC, source DESC, id DESC, route DESC LIMIT 50`;
  if (pg) {
    const rows = await inbox.query(
      toPg(`EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, SUMMARY OFF) ${sql}`),
      ...params,
    );
    return rows.map((r) => `    ${r["QUERY PLAN"]}`).join("\n");
  }
  const rows = await inbox.query(`EXPLAIN QUERY PLAN ${sql}`, ...params);
  return rows.map((r) => `    ${r.detail}`).join("\n");
}

async function onSqlite(dir: string, out: Out): Promise<void> {
  const { inbox, lines } = await upgrade(join(dir, "bodysearch.db"));
  try {
    await inbox.query("ANALYZE");
    const bytes = async (sql: string) => Number((await inbox.query(sql))[0]?.b ?? 0) / 2 ** 20;
    out.push(
      ...lines,
      `  sizes: the FTS5 index ${f(await bytes("SELECT sum(pgsize) AS b FROM dbstat WHERE name LIKE 'deliveries_search%'"))} MiB ` +
        `of the file's ${f(await bytes("SELECT page_count * page_size AS b FROM pragma_page_count(), pragma_page_size()"))} MiB`,
    );
    await measure(inbox, out);
    out.push(
      "  EXPLAIN QUERY PLAN, bodyJson customer:",
      await plan(inbox, needles(1, FORMS[1]![1])[0]!),
      "  EXPLAIN QUERY PLAN, bodyWords customer:",
      await plan(inbox, needles(1, FORMS[4]![1])[0]!),
      "  EXPLAIN QUERY PLAN, list by source, status, hour:",
      await plan(inbox, needles(1, FORMS[0]![1])[0]!),
    );
  } finally {
    await inbox.close();
  }
}

// BENCH_BODY_SEARCH_REUSE=1 measures again the PostgreSQL inbox an interrupted run left filled and upgraded
// (its fill, migration and ingest lines are that run's), and leaves it: DROP DATABASE bench_bodysearch after.
// BENCH_BODY_SEARCH_KEEP=1 leaves the database a run filled, for REUSE or EXPLAIN by hand, the same way.
const REUSE = process.env.BENCH_BODY_SEARCH_REUSE === "1";
const KEEP = REUSE || process.env.BENCH_BODY_SEARCH_KEEP === "1";

async function onPostgres(out: Out): Promise<void> {
  const fresh = REUSE ? undefined : await freshDatabase("bench_bodysearch");
  const db = {
    url: fresh?.url ?? new URL("/bench_bodysearch", PG_URL).toString(),
    drop: KEEP ? async () => {} : fresh!.drop,
  };
  try {
    const { inbox, lines } = REUSE
      ? { inbox: await connect(`${db.url}?schema=inbox`), lines: ["postgres, the inbox an interrupted run left:"] }
      : await upgrade(`${db.url}?schema=inbox`);
    try {
      await inbox.query("VACUUM ANALYZE deliveries");
      await inbox.query("VACUUM ANALYZE deliveries_search");
      // A partitioned table holds no bytes of its own (pg_total_relation_size gives it 0): its partitions' are summed.
      const size = async (name: string) =>
        Number(
          (
            await inbox.query(
              `SELECT coalesce((SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree(?::regclass)),
                               pg_total_relation_size(?::regclass)) AS b`,
              name,
              name,
            )
          )[0]!.b,
        );
      const mib = async (name: string) => f((await size(name)) / 2 ** 20);
      // deliveries is a view over delivery_rows and delivery_bodies, whose partitions hold the bytes.
      const bodiesBytes = async () =>
        Number(
          (
            await inbox.query(
              "SELECT coalesce(sum(pg_total_relation_size(relid)), 0) AS b FROM pg_partition_tree('delivery_bodies')",
            )
          )[0]!.b,
        );
      out.push(
        ...lines,
        `  sizes: delivery_rows, delivery_keys and delivery_bodies ${f(((await size("delivery_rows")) + (await size("delivery_keys")) + (await bodiesBytes())) / 2 ** 20)} MiB with their indexes and TOAST; deliveries_search ${await mib("deliveries_search")} MiB, ` +
          `of which deliveries_search_json ${await mib("deliveries_search_json")} MiB and deliveries_search_words ${await mib("deliveries_search_words")} MiB`,
      );
      await measure(inbox, out);
      out.push(
        "  EXPLAIN ANALYZE, bodyJson customer:",
        await plan(inbox, needles(1, FORMS[1]![1])[0]!),
        "  EXPLAIN ANALYZE, bodyWords customer:",
        await plan(inbox, needles(1, FORMS[4]![1])[0]!),
        "  EXPLAIN ANALYZE, list by source, status, hour:",
        await plan(inbox, needles(1, FORMS[0]![1])[0]!),
      );
      if (process.env.BENCH_BODY_SEARCH_TRGM !== "0") await trigrams(inbox, out, size);
    } finally {
      await inbox.close();
    }
  } finally {
    await db.drop();
  }
}

// trigrams builds pg_trgm's GIN index over the same JSON text and times the same word searches through it
// (ILIKE '%word%'), beside the full-text index the inbox uses; skipped, and said, when the extension is not there.
async function trigrams(inbox: Inbox, out: Out, size: (name: string) => Promise<number>): Promise<void> {
  try {
    await inbox.query("CREATE EXTENSION IF NOT EXISTS pg_trgm");
  } catch (error) {
    out.push(`  pg_trgm: not measured, CREATE EXTENSION failed: ${(error as Error).message}`);
    return;
  }
  const started = performance.now();
  await inbox.query("CREATE INDEX deliveries_search_trgm ON deliveries_search USING gin ((doc::text) gin_trgm_ops)");
  await inbox.query("ANALYZE deliveries_search");
  out.push(
    `  pg_trgm beside it: deliveries_search_trgm built in ${f((performance.now() - started) / 1000, 1)} s, ${f((await size("deliveries_search_trgm")) / 2 ** 20)} MiB`,
  );
  const escape = (w: string) => w.replace(/[\\%_]/g, "\\$&");
  for (const [name, make] of FORMS.filter(([n]) => n.startsWith("bodyWords"))) {
    const words = needles(slow(name) ? Math.max(10, Math.floor(QUERIES / 10)) : QUERIES, make).map((f) =>
      (f.bodyWords ?? "").split(" "),
    );
    const ms: number[] = [];
    for (const [k, ws] of words.entries()) {
      const started = performance.now();
      await inbox.query(
        `SELECT * FROM deliveries WHERE (source, id) IN
           (SELECT source, id FROM deliveries_search WHERE ${ws.map(() => "doc::text ILIKE ?").join(" AND ")})
         ORDER BY received_at DESC, source DESC, id DESC, route DESC LIMIT 50`,
        ...ws.map((w) => `%${escape(w)}%`),
      );
      if (k >= 5) ms.push(performance.now() - started);
    }
    ms.sort((a, b) => a - b);
    const p = (q: number) => ms[Math.min(ms.length - 1, Math.floor(q * ms.length))]!;
    out.push(
      `  ${`${name}, pg_trgm ILIKE`.padEnd(32)} p50 ${f(p(0.5), 1).padStart(8)} ms   p99 ${f(p(0.99), 1).padStart(8)} ms`,
    );
  }
}

/** bodysearch fills both backends, measures and returns the one-line summary. */
export async function bodysearch(): Promise<string> {
  const { dir, cleanup } = tempDir();
  const out: Out = { push: (...lines) => console.log(lines.join("\n")) };
  try {
    if (process.env.BENCH_BODY_SEARCH_SQLITE !== "0") await onSqlite(dir, out);
    if (process.env.BENCH_POSTGRES !== "0" && (await pgReachable())) await onPostgres(out);
    else console.log("postgres: not reachable (or BENCH_POSTGRES=0), left out");
  } finally {
    cleanup();
  }
  return `bodysearch: ${ROWS} deliveries (see the lines above)`;
}

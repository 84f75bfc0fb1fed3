// postgres/store.ts: how new deliveries are stored on PostgreSQL, a batch at a time inside the commit queue's
// transaction (postgres/commit.ts): storeOnce(), the one statement that stores a plain batch in one round trip,
// and storeAll(), which stores in key order and tells every copy of a key already stored a duplicate, or a
// conflict when its body differs. Held by PostgresInbox, whose committer hands it each batch's stores.

import type pg from "pg";
import { DEFAULTS } from "../defaults.ts";
import { conflicts } from "../rows.ts";
import { NO_DESTINATION, type Stored } from "../store.ts";
import { NOW, type Op } from "./commit.ts";
import { enterKeys } from "./order-keys.ts";
import { bodyKept } from "./periods.ts";

// concatenated puts a batch's bodies in one buffer, with each body's 1-based offset and length for
// substring(): pg sends a Buffer parameter as binary, where an array of them goes as a text literal with
// every body hex-encoded, which the server then parses back. A body given more than once (a delivery's
// rows for its other routes) is sent once, each row pointing at it.
function concatenated(bodies: Uint8Array[]): { all: Buffer; offsets: number[]; lengths: number[] } {
  const offsets: number[] = [];
  const lengths: number[] = [];
  const parts: Uint8Array[] = [];
  const placed = new Map<Uint8Array, number>();
  let at = 1;
  for (const body of bodies) {
    let offset = placed.get(body);
    if (offset === undefined) {
      placed.set(body, (offset = at));
      parts.push(body);
      at += body.byteLength;
    }
    offsets.push(offset);
    lengths.push(body.byteLength);
  }
  return { all: Buffer.concat(parts), offsets, lengths };
}

// byKey sorts a batch's deliveries by (source, id), the one order every transaction takes their rows in.
function byKey<T extends { source: string; incoming: { id: string } }>(ops: T[]): T[] {
  return ops.sort((a, b) =>
    a.source < b.source
      ? -1
      : a.source > b.source
        ? 1
        : a.incoming.id < b.incoming.id
          ? -1
          : a.incoming.id > b.incoming.id
            ? 1
            : 0,
  );
}

/** StoresQueue is what PostgresStores needs of its inbox: the clock, NOTIFY, named plans. */
export interface StoresQueue {
  pinned: (() => number) | undefined;
  /** notify wakes listening workers at commit. */
  notify(client: pg.PoolClient, added: number): void;
  prepared(text: string, values: unknown[]): pg.QueryConfig;
}

/** PostgresStores is the store path of a PostgresInbox: a batch's new deliveries written, its copies told apart. */
export class PostgresStores {
  private readonly queue: StoresQueue;

  constructor(queue: StoresQueue) {
    this.queue = queue;
  }

  // now is the time every statement takes as $1 (NOW): the pinned clock, else null and the database's own.
  private now(): number | null {
    return this.queue.pinned ? this.queue.pinned() : null;
  }

  // storeOnce is the one statement that stores a whole batch when nothing need follow it in the transaction:
  // every delivery with one route at most, no order key, and its (source, id) once in the batch. The
  // committer then sends BEGIN, it and COMMIT in one write, one round trip a batch (postgres/commit.ts);
  // the rows it returns are the stored ones, and the copies it skipped go through storeAll after.
  storeOnce(ops: Extract<Op, { kind: "store" }>[]): pg.QueryConfig | undefined {
    const keys = new Set<string>();
    for (const op of ops) {
      if (op.routes.length > 1 || op.incoming.orderKey != null) return undefined;
      const k = `${op.source}\u0000${op.incoming.id}`;
      if (keys.has(k)) return undefined;
      keys.add(k);
    }
    const place = new Map(ops.map((op, i) => [op, i]));
    return this.storeStatement(
      byKey([...ops]).map((op) => ({ op, route: 0 })),
      place,
    );
  }

  // storeStatement inserts the given routes of a batch's deliveries. Ordered rows take their arrival order
  // from one sequence value per batch plus their place in it (place: each op's place in the batch).
  private storeStatement(
    list: { op: Extract<Op, { kind: "store" }>; route: number }[],
    place: Map<Op, number>,
  ): pg.QueryConfig {
    const none = (x: { op: Extract<Op, { kind: "store" }> }) => x.op.routes.length === 0;
    const bodies = concatenated(list.map((x) => x.op.incoming.body));
    return this.queue.prepared(
      `WITH u AS (
         SELECT * FROM unnest($2::text[], $3::text[], $4::integer[], $5::text[], $6::text[], $7::text[], $8::bigint[], $9::text[], $10::bigint[],
                              $11::integer[], $12::smallint[], $13::text[], $14::text[], $15::text[], $16::text[], $17::integer[], $19::text[])
                AS u(s, i, bo, h, ct, et, pt, ok, ev, n, ro, de, hd, tp, st, bl, og)),
       -- The key first: delivery_rows is partitioned and has no unique key to arbitrate on
       -- (docs/table.md#hot-and-cold); only the keys new here get a row.
       k AS (
         INSERT INTO delivery_keys (source, id, route, received_at) SELECT s, i, ro, ${NOW} FROM u
         ON CONFLICT (source, id, route) DO NOTHING
         RETURNING source, id, route),
       r AS (
         INSERT INTO delivery_rows (source, id, body, body_sha256, content_type, event_type, provider_time, received_at, status, available_at,
                                    order_key, event_time, arrival, route, destination, headers, traceparent, finished_at, origin)
         SELECT s, i, CASE WHEN bl <= $20 THEN substring($18::bytea FROM bo FOR bl) ELSE '\\x'::bytea END, h, ct, et, pt, ${NOW}, st, ${NOW}, ok, CASE WHEN ok IS NULL THEN ev ELSE coalesce(ev, ${NOW}) END,
                CASE WHEN ok IS NULL THEN NULL ELSE (SELECT nextval('deliveries_arrival')) * 1000000 + n END, ro, de, hd, tp,
                CASE WHEN st = 'done' THEN ${NOW} END, og
         FROM u JOIN k ON k.source = u.s AND k.id = u.i AND k.route = u.ro
         RETURNING source, id, route, destination, order_key, event_time, arrival, available_at, received_at),
       -- The body of each row stored, in its own table past DEFAULTS.inlineBodyBytes (docs/table.md#bodies-apart).
       -- From the new keys, as r's rows are, not from r: the planner takes r for one row, and joined it to u
       -- in a nested loop, a batch's rows times its rows compared (128 × 128 at a batch of 128), a third more
       -- of PostgreSQL's CPU a store.
       b AS (
         INSERT INTO delivery_bodies (source, id, route, received_at, body)
         SELECT u.s, u.i, u.ro, ${NOW}, substring($18::bytea FROM u.bo FOR u.bl)
         FROM u JOIN k ON k.source = u.s AND k.id = u.i AND k.route = u.ro WHERE u.bl > $20)
       SELECT * FROM r`,
      [
        this.now(),
        list.map((x) => x.op.source),
        list.map((x) => x.op.incoming.id),
        bodies.offsets,
        list.map((x) => x.op.digest),
        list.map((x) => x.op.incoming.contentType ?? null),
        list.map((x) => x.op.incoming.eventType ?? null),
        list.map((x) => x.op.incoming.providerTime ?? null),
        list.map((x) => (none(x) ? null : x.op.order.key)),
        list.map((x) => x.op.order.eventTime),
        list.map((x) => place.get(x.op)! * 16 + x.route),
        list.map((x) => x.route),
        list.map((x) => x.op.routes[x.route] ?? NO_DESTINATION),
        list.map((x) => (x.op.incoming.headers ? JSON.stringify(x.op.incoming.headers) : null)),
        list.map((x) => x.op.incoming.traceparent ?? null),
        list.map((x) => (none(x) ? "done" : "received")),
        bodies.lengths,
        bodies.all,
        list.map((x) => x.op.incoming.origin ?? "webhook"),
        DEFAULTS.inlineBodyBytes,
      ],
    );
  }

  // storeAll inserts a batch's deliveries, in key order so that two receivers' batches take their row locks
  // in the same order and cannot deadlock: first each delivery's route 0 in one statement, which decides
  // what is new, then the other routes of the new ones. The first copy of a key is stored; every other is a
  // duplicate, or a conflict when its body's hash differs from the stored one.
  async storeAll(client: pg.PoolClient, ops: Extract<Op, { kind: "store" }>[]): Promise<Map<Op, Stored>> {
    const key = (op: { source: string; incoming: { id: string } }) => `${op.source}\u0000${op.incoming.id}`;
    const firsts = new Map<string, (typeof ops)[number]>();
    for (const op of ops) if (!firsts.has(key(op))) firsts.set(key(op), op);
    const rows = byKey([...firsts.values()]);
    const place = new Map(ops.map((op, i) => [op, i]));
    const insert = (list: { op: (typeof ops)[number]; route: number }[]) =>
      client.query(this.storeStatement(list, place));
    const inserted = await insert(rows.map((op) => ({ op, route: 0 })));
    const stored = new Set(inserted.rows.map((r) => `${r.source}\u0000${r.id}`));
    const more = rows
      .filter((op) => stored.has(key(op)))
      .flatMap((op) => op.routes.slice(1).map((_, i) => ({ op, route: i + 1 })));
    const all = more.length === 0 ? inserted.rows : [...inserted.rows, ...(await insert(more)).rows];
    const ordered = all.filter((r) => r.order_key !== null);
    if (ordered.length > 0) {
      const strict = new Map(rows.map((op) => [key(op), op.order.strict]));
      await enterKeys(
        client,
        ordered.map((r) => ({
          source: r.source,
          destination: r.destination,
          key: r.order_key,
          id: r.id,
          eventTime: r.event_time,
          seq: r.arrival,
          due: r.available_at,
          strict: strict.get(`${r.source}\u0000${r.id}`)!,
        })),
      );
    }
    const results = new Map<Op, Stored>();
    const others: typeof ops = [];
    for (const op of ops) {
      if (stored.has(key(op)) && firsts.get(key(op)) === op) results.set(op, "stored");
      else others.push(op);
    }
    if (others.length === 0) {
      this.queue.notify(client, stored.size);
      return results;
    }
    // FOR KEY SHARE writes a lock, so this COMMIT waits for the standby like any write: a copy stored by a
    // COMMIT whose wait was cancelled (committed here, perhaps not on the standby) is answered only once it
    // is there too. It blocks no update, only a delete (purge skips locked rows). It locks the key in
    // delivery_keys, which forget deletes with its row, not the row itself: a row moves between partitions at
    // a done mark or a replay, and locking one that a commit just moved fails with 40001, where a key stays put.
    // Its body is read only where it came from reconcile (rows.ts conflicts()), and as the view reads it: from the
    // row alone when it is kept there or is a tombstone's, whose body's row may wait for its day's release.
    // The row is found by its key and day (k.received_at), so only the hot partition and that day's are opened.
    const kept = await client.query(
      `SELECT r.source, r.id, r.body_sha256 AS sha256, r.origin,
              CASE WHEN r.origin <> 'reconcile' THEN NULL
                   WHEN octet_length(r.body) > 0 OR NOT (${bodyKept("r.")}) THEN r.body ELSE
                coalesce((SELECT b.body FROM delivery_bodies b
                           WHERE b.source = r.source AND b.id = r.id AND b.route = 0 AND b.received_at = r.received_at), r.body) END AS body
         FROM delivery_keys k JOIN delivery_rows r ON r.source = k.source AND r.id = k.id AND r.route = 0 AND r.received_at = k.received_at
        WHERE (k.source, k.id) IN (SELECT * FROM unnest($1::text[], $2::text[])) AND k.route = 0
       FOR KEY SHARE OF k`,
      [others.map((op) => op.source), others.map((op) => op.incoming.id)],
    );
    const keptRows = new Map(kept.rows.map((r) => [`${r.source}\u0000${r.id}`, r]));
    const conflicting = new Map<string, number>();
    for (const op of others) {
      const conflict = conflicts(
        keptRows.get(key(op)) ?? { sha256: "", origin: "", body: null },
        op.digest,
        op.incoming.body,
      );
      results.set(op, conflict ? "conflict" : "duplicate");
      if (conflict) conflicting.set(key(op), (conflicting.get(key(op)) ?? 0) + 1);
    }
    if (conflicting.size > 0) {
      const keys = [...conflicting.keys()].sort().map((k) => k.split("\u0000") as [string, string]);
      await client.query(
        `UPDATE delivery_rows d SET conflicts = d.conflicts + u.n
         FROM unnest($1::text[], $2::text[], $3::integer[]) AS u(s, i, n)
         JOIN delivery_keys k ON k.source = u.s AND k.id = u.i AND k.route = 0
         WHERE d.source = u.s AND d.id = u.i AND d.route = 0 AND d.received_at = k.received_at`,
        [keys.map((k) => k[0]), keys.map((k) => k[1]), keys.map((k) => conflicting.get(k.join("\u0000"))!)],
      );
    }
    this.queue.notify(client, stored.size);
    return results;
  }
}

// sqlite/order-keys.ts: the order keys' bookkeeping on SQLite, inside the transaction that moves a delivery:
// enterKey() puts a new delivery at its key's head, occupyKey() marks its key running once claimed,
// settleKey() moves a head on (settleRows() for an UPDATE's returned rows), rebuildKey() mends one after a
// copy. Each takes the connection's statements and no state, so the delivery's life (sqlite.ts) and the bulk
// writes (bulk.ts) share them.

import type { SQLInputValue, StatementSync } from "node:sqlite";
import type { Lease } from "../store.ts";

/** Statements compiles a statement once per connection (SqliteCommitter's sql()). */
export type Statements = (text: string) => StatementSync;

type Row = Record<string, SQLInputValue>;

/**
 * enterKey puts a newly stored delivery at its key's head (per destination) if the key is idle and it comes
 * first in event time (or the key had nothing waiting); a running or blocked key picks its next head when
 * it settles.
 */
export function enterKey(
  sql: Statements,
  source: string,
  destination: string,
  key: string,
  id: string,
  eventTime: number,
  seq: number,
  due: number,
  strict: boolean,
): void {
  sql(
    `INSERT INTO order_keys (source, destination, order_key, head_id, head_event_time, head_seq, due, strict)
     VALUES (?1, ?8, ?2, ?3, ?4, ?5, ?6, ?7)
     ON CONFLICT (source, destination, order_key) DO UPDATE SET
       strict = excluded.strict,
       head_id = CASE WHEN head_id IS NULL OR (due IS NOT NULL AND (?4, ?5) < (head_event_time, head_seq)) THEN ?3 ELSE head_id END,
       head_event_time = CASE WHEN head_id IS NULL OR (due IS NOT NULL AND (?4, ?5) < (head_event_time, head_seq)) THEN ?4 ELSE head_event_time END,
       head_seq = CASE WHEN head_id IS NULL OR (due IS NOT NULL AND (?4, ?5) < (head_event_time, head_seq)) THEN ?5 ELSE head_seq END,
       due = CASE WHEN head_id IS NULL OR (due IS NOT NULL AND (?4, ?5) < (head_event_time, head_seq)) THEN ?6 ELSE due END`,
  ).run(source, key, id, eventTime, seq, due, strict ? 1 : 0, destination);
}

/**
 * occupyKey marks a claimed head's key as running, and flags the lease stale if a newer event of its key
 * was already handled (by this destination).
 */
export function occupyKey(sql: Statements, lease: Lease, rowid: number): void {
  const key = sql(
    "UPDATE order_keys SET due = NULL WHERE source = ? AND destination = ? AND order_key = ? RETURNING last_event_time, last_id",
  ).get(lease.source, lease.destination, lease.orderKey) as
    | { last_event_time: number | null; last_id: string | null }
    | undefined;
  if (key?.last_event_time != null && key.last_event_time > lease.eventTime!) {
    sql("UPDATE delivery_rows SET newer_id = ? WHERE rowid = ?").run(key.last_id, rowid);
    lease.newerId = key.last_id;
  }
}

/**
 * settleKey moves a key's head to its first waiting delivery in event time, then arrival, after the
 * delivery `from` left the head (done, retried, released, set aside) or came back (retry). It leaves a
 * key alone while another delivery runs or blocks it, and a strict key blocked when `from` is set aside.
 */
export function settleKey(
  sql: Statements,
  source: string,
  destination: string,
  key: string,
  from: string,
  setAside: boolean,
  handledTime: number | null = null,
): void {
  sql(
    `UPDATE order_keys SET
       last_event_time = CASE WHEN ?5 IS NOT NULL AND (last_event_time IS NULL OR last_event_time <= ?5) THEN ?5 ELSE last_event_time END,
       last_id = CASE WHEN ?5 IS NOT NULL AND (last_event_time IS NULL OR last_event_time <= ?5) THEN ?3 ELSE last_id END,
       (head_id, head_event_time, head_seq, due) =
         (SELECT id, event_time, rowid, available_at FROM deliveries
          WHERE source = ?1 AND destination = ?6 AND order_key = ?2 AND status = 'received' ORDER BY event_time, rowid LIMIT 1)
     WHERE source = ?1 AND destination = ?6 AND order_key = ?2 AND (head_id IS NULL OR head_id = ?3 OR due IS NOT NULL) AND NOT (strict AND ?4)`,
  ).run(source, key, from, setAside ? 1 : 0, handledTime, destination);
}

/**
 * settleRows settles the keys of the ordered ones among deliveries whose rows an UPDATE … RETURNING gave
 * back (source, id, order_key, destination): each left its key's head, or came back to wait its turn.
 */
export function settleRows(sql: Statements, rows: readonly Row[], setAside: boolean): void {
  for (const r of rows)
    if (r.order_key !== null)
      settleKey(sql, r.source as string, r.destination as string, r.order_key as string, r.id as string, setAside);
}

/**
 * rebuildKey brings a key's head row up to date with its deliveries after a copy: the newest done event
 * is its last handled, a processing delivery runs it, else its first waiting one is the head. (The
 * strict setting is the source's, and comes back with its next delivery.)
 */
export function rebuildKey(sql: Statements, source: string, destination: string, key: string): void {
  sql(
    "INSERT INTO order_keys (source, destination, order_key) VALUES (?, ?, ?) ON CONFLICT (source, destination, order_key) DO NOTHING",
  ).run(source, destination, key);
  sql(
    `UPDATE order_keys SET (last_event_time, last_id) =
       (SELECT event_time, id FROM deliveries WHERE source = ?1 AND destination = ?3 AND order_key = ?2 AND status = 'done'
        ORDER BY event_time DESC, rowid DESC LIMIT 1)
     WHERE source = ?1 AND destination = ?3 AND order_key = ?2`,
  ).run(source, key, destination);
  const running = sql(
    "SELECT id, event_time, rowid FROM deliveries WHERE source = ? AND destination = ? AND order_key = ? AND status = 'processing' LIMIT 1",
  ).get(source, destination, key) as Row | undefined;
  if (running) {
    sql(
      "UPDATE order_keys SET head_id = ?, head_event_time = ?, head_seq = ?, due = NULL WHERE source = ? AND destination = ? AND order_key = ?",
    ).run(running.id, running.event_time, running.rowid, source, destination, key);
  } else {
    sql("UPDATE order_keys SET head_id = NULL, due = NULL WHERE source = ? AND destination = ? AND order_key = ?").run(
      source,
      destination,
      key,
    );
    settleKey(sql, source, destination, key, "", false);
  }
}

// sqlite/bodies.ts: where a SQLite delivery's body lives. One larger than inlineBodyBytes is kept apart, in
// delivery_bodies in the order stored, and its row in delivery_rows holds an empty body and the body's seq;
// a smaller one stays in its row (docs/table.md#bodies-apart); the view deliveries shows whichever is there.
// insertRow() writes a row with its body, as store() and restore do. Not run on its own.

import type { SQLInputValue } from "node:sqlite";
import { DEFAULTS } from "../defaults.ts";
import type { Statements } from "./order-keys.ts";

/**
 * insertRow inserts one delivery_rows row, `ON CONFLICT (source, id, route) DO NOTHING`, from its columns by name
 * (body among them), the body placed by its size. It answers the statement's result; a row that was not
 * inserted leaves no body behind.
 */
export function insertRow(
  sql: Statements,
  row: Record<string, SQLInputValue>,
): { changes: number | bigint; lastInsertRowid: number | bigint } {
  const body = row.body as Uint8Array;
  let seq: number | null = null;
  if (body.byteLength > DEFAULTS.inlineBodyBytes) {
    seq = Number(sql("INSERT INTO delivery_bodies (body) VALUES (?)").run(body).lastInsertRowid);
    row = { ...row, body: EMPTY };
  }
  const columns = Object.keys(row);
  const inserted = sql(
    `INSERT INTO delivery_rows (${columns.join(", ")}, body_seq) VALUES (${columns.map(() => "?").join(", ")}, ?)
     ON CONFLICT (source, id, route) DO NOTHING`,
  ).run(...Object.values(row), seq);
  // A duplicate: its body was the newest row of delivery_bodies, so taking it back leaves the table as it was.
  if (seq !== null && Number(inserted.changes) === 0) sql("DELETE FROM delivery_bodies WHERE seq = ?").run(seq);
  return inserted;
}

const EMPTY = new Uint8Array(0);

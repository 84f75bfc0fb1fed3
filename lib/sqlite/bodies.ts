// sqlite/bodies.ts: where a SQLite delivery's body lives. One larger than inlineBodyBytes is kept apart, in
// delivery_bodies in the order stored, and its row in delivery_rows holds an empty body and the body's seq;
// a smaller one stays in its row (docs/table.md#bodies-apart); the view deliveries shows whichever is there.
// rowInserter() makes the insert of a row with its body that store() and restore each hold. Not run on its own.

import type { SQLInputValue } from "node:sqlite";
import { DEFAULTS } from "../defaults.ts";
import type { Statements } from "./order-keys.ts";

/** Inserted is what an insert of a row answers: how many rows it wrote (0 or 1), and the new row's rowid. */
export interface Inserted {
  changes: number | bigint;
  lastInsertRowid: number | bigint;
}

/**
 * rowInserter makes an insert of one delivery_rows row, `ON CONFLICT (source, id, route) DO NOTHING`, from its
 * columns by name (body among them), the body placed by its size. Its SQL is made from the first row's columns,
 * so a caller holds one per shape of row it writes (an object literal: the same columns in the same order).
 * A row already there writes nothing: for a large body that is looked for first, so a copy never writes its body.
 */
export function rowInserter(): (sql: Statements, row: Record<string, SQLInputValue>) => Inserted {
  let text: string | undefined;
  return (sql, row) => {
    if (text === undefined) {
      const columns = Object.keys(row);
      text = `INSERT INTO delivery_rows (${columns.join(", ")}, body_seq) VALUES (${columns.map(() => "?").join(", ")}, ?)
              ON CONFLICT (source, id, route) DO NOTHING`;
    }
    const body = row.body as Uint8Array;
    if (body.byteLength <= DEFAULTS.inlineBodyBytes) return sql(text).run(...Object.values(row), null);
    if (
      sql("SELECT 1 FROM delivery_rows WHERE source = ? AND id = ? AND route = ?").get(row.source!, row.id!, row.route!)
    )
      return { changes: 0, lastInsertRowid: 0 };
    const seq = sql("INSERT INTO delivery_bodies (body) VALUES (?)").run(body).lastInsertRowid;
    return sql(text).run(...Object.values({ ...row, body: EMPTY }), seq);
  };
}

const EMPTY = new Uint8Array(0);

// postgres/order-keys.ts: the order keys' bookkeeping on PostgreSQL, inside the transaction that moves a delivery:
// enterKeys() puts new deliveries at their keys' heads, settleKeys() moves a head on once it leaves (and
// settleRows() for an UPDATE's returned rows), and rebuildKeys() brings heads up to date after a copy. Each takes the transaction's client and no state, so
// the delivery's life (postgres.ts) and the bulk actions (bulk.ts) share them.

import type pg from "pg";

/**
 * enterKeys puts newly stored deliveries at their keys' heads (per destination) where the key is idle and
 * they come first in event time (or it had nothing waiting); a running or blocked key picks its next head
 * when it settles. One row per key (the batch's earliest), in key order, so two receivers cannot deadlock.
 */
export async function enterKeys(
  client: pg.PoolClient,
  entries: {
    source: string;
    destination: string;
    key: string;
    id: string;
    eventTime: number;
    seq: number;
    due: number;
    strict: boolean;
  }[],
): Promise<void> {
  const name = (e: { source: string; destination: string; key: string }) =>
    `${e.source}\u0000${e.destination}\u0000${e.key}`;
  const first = new Map<string, (typeof entries)[number]>();
  for (const e of entries) {
    const seen = first.get(name(e));
    if (!seen || e.eventTime < seen.eventTime || (e.eventTime === seen.eventTime && e.seq < seen.seq))
      first.set(name(e), e);
  }
  const list = [...first.values()].sort((a, b) => (name(a) < name(b) ? -1 : name(a) > name(b) ? 1 : 0));
  const earlier =
    "o.head_id IS NULL OR (o.due IS NOT NULL AND (excluded.head_event_time, excluded.head_seq) < (o.head_event_time, o.head_seq))";
  await client.query(
    `INSERT INTO order_keys AS o (source, destination, order_key, head_id, head_event_time, head_seq, due, strict)
     SELECT * FROM unnest($1::text[], $8::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[], $7::boolean[])
     ON CONFLICT (source, destination, order_key) DO UPDATE SET
       strict = excluded.strict,
       head_id = CASE WHEN ${earlier} THEN excluded.head_id ELSE o.head_id END,
       head_event_time = CASE WHEN ${earlier} THEN excluded.head_event_time ELSE o.head_event_time END,
       head_seq = CASE WHEN ${earlier} THEN excluded.head_seq ELSE o.head_seq END,
       due = CASE WHEN ${earlier} THEN excluded.due ELSE o.due END`,
    [
      list.map((e) => e.source),
      list.map((e) => e.key),
      list.map((e) => e.id),
      list.map((e) => e.eventTime),
      list.map((e) => e.seq),
      list.map((e) => e.due),
      list.map((e) => e.strict),
      list.map((e) => e.destination),
    ],
  );
}

/**
 * settleRows settles the keys of the ordered ones among deliveries whose rows an UPDATE … RETURNING gave
 * back (source, id, order_key, destination): each left its key's head, or came back to wait its turn.
 */
export async function settleRows(
  client: pg.PoolClient,
  rows: readonly { source: string; id: string; order_key: string | null; destination: string }[],
  setAside: boolean,
): Promise<void> {
  const ordered = rows.filter((r) => r.order_key !== null);
  if (ordered.length === 0) return;
  await settleKeys(
    client,
    ordered.map((r) => ({ source: r.source, destination: r.destination, key: r.order_key!, from: r.id, setAside })),
  );
}

/**
 * settleKeys moves each key's head to its first waiting delivery in event time, then arrival, after the
 * delivery `from` left the head (done, retried, released, set aside) or came back (retry), and records
 * a handled delivery's event time as the key's newest. It leaves a key alone while another delivery runs
 * or blocks it, and a strict key blocked when `from` is set aside. The key rows are locked first, so
 * the head is read in a snapshot that includes every store that touched the key before.
 */
export async function settleKeys(
  client: pg.PoolClient,
  items: {
    source: string;
    destination: string;
    key: string;
    from: string;
    setAside: boolean;
    handledTime?: number | null;
  }[],
): Promise<void> {
  const name = (i: { source: string; destination: string; key: string }) =>
    `${i.source}\u0000${i.destination}\u0000${i.key}`;
  const byKey = new Map<string, (typeof items)[number]>();
  for (const item of items) if (!byKey.has(name(item)) || item.handledTime != null) byKey.set(name(item), item);
  const list = [...byKey.values()].sort((a, b) => (name(a) < name(b) ? -1 : name(a) > name(b) ? 1 : 0));
  const [sources, destinations, keys] = [
    list.map((i) => i.source),
    list.map((i) => i.destination),
    list.map((i) => i.key),
  ];
  await client.query(
    `SELECT 1 FROM order_keys WHERE (source, destination, order_key) IN (SELECT * FROM unnest($1::text[], $2::text[], $3::text[]))
     ORDER BY source COLLATE "C", destination COLLATE "C", order_key COLLATE "C" FOR UPDATE`,
    [sources, destinations, keys],
  );
  const newer = "u.ht IS NOT NULL AND (o.last_event_time IS NULL OR o.last_event_time <= u.ht)";
  await client.query(
    `UPDATE order_keys o SET
       last_event_time = CASE WHEN ${newer} THEN u.ht ELSE o.last_event_time END,
       last_id = CASE WHEN ${newer} THEN u.f ELSE o.last_id END,
       (head_id, head_event_time, head_seq, due) =
         (SELECT d.id, d.event_time, d.arrival, d.available_at FROM deliveries d
          WHERE d.source = o.source AND d.destination = o.destination AND d.order_key = o.order_key AND d.status = 'received'
          ORDER BY d.event_time, d.arrival LIMIT 1)
     FROM unnest($1::text[], $2::text[], $3::text[], $4::boolean[], $5::bigint[], $6::text[]) AS u(s, k, f, sa, ht, de)
     WHERE o.source = u.s AND o.destination = u.de AND o.order_key = u.k AND (o.head_id IS NULL OR o.head_id = u.f OR o.due IS NOT NULL)
       AND NOT (o.strict AND u.sa)`,
    [
      sources,
      keys,
      list.map((i) => i.from),
      list.map((i) => i.setAside),
      list.map((i) => i.handledTime ?? null),
      destinations,
    ],
  );
}

/**
 * rebuildKeys brings keys' head rows up to date with their deliveries after a copy: the newest done
 * event is the last handled, a processing delivery runs the key, else its first waiting one is the head.
 * (The strict setting is the source's, and comes back with the key's next delivery.)
 */
export async function rebuildKeys(client: pg.PoolClient, keys: [string, string, string][]): Promise<void> {
  const [sources, destinations, names] = [keys.map((k) => k[0]), keys.map((k) => k[1]), keys.map((k) => k[2])];
  await client.query(
    `INSERT INTO order_keys (source, destination, order_key) SELECT * FROM unnest($1::text[], $2::text[], $3::text[])
     ON CONFLICT (source, destination, order_key) DO NOTHING`,
    [sources, destinations, names],
  );
  await client.query(
    `UPDATE order_keys o SET
       (last_event_time, last_id) = (SELECT d.event_time, d.id FROM deliveries d
                                     WHERE d.source = o.source AND d.destination = o.destination AND d.order_key = o.order_key
                                     AND d.status = 'done' ORDER BY d.event_time DESC, d.arrival DESC LIMIT 1),
       (head_id, head_event_time, head_seq, due) = (
         SELECT d.id, d.event_time, d.arrival, CASE WHEN d.status = 'processing' THEN NULL ELSE d.available_at END
         FROM deliveries d WHERE d.source = o.source AND d.destination = o.destination AND d.order_key = o.order_key
                              AND d.status IN ('received', 'processing')
         ORDER BY d.status = 'processing' DESC, d.event_time, d.arrival LIMIT 1)
     FROM unnest($1::text[], $2::text[], $3::text[]) AS u(s, de, k) WHERE o.source = u.s AND o.destination = u.de AND o.order_key = u.k`,
    [sources, destinations, names],
  );
}

// postgres/records.ts: what a PostgresInbox keeps beside its deliveries: each applied version of the
// configuration (lib/config/) with the way it came, the API's keys (by hash alone), each POST's first answer
// under its Idempotency-Key, the secrets (sealed: lib/secrets.ts), and the audit log, which writeAudit() adds
// to inside whichever transaction makes the change. Held by PostgresInbox, as its reads and bulk writes are.

import type pg from "pg";
import { NOW, type Locks } from "./commit.ts";
import type { Pool } from "./pool.ts";
import type {
  ApiKey,
  ApplyConfigOptions,
  Audit,
  AuditEntry,
  ConfigApplied,
  Remembered,
  StoredConfig,
  StoredSecret,
} from "../store.ts";
import {
  changeOf,
  destinationNames,
  REMOVED,
  toApiKey,
  toAuditEntry,
  toConfig,
  toRemembered,
  toStoredSecret,
} from "../rows.ts";

/**
 * writeAudit writes a change's entry in the transaction that makes the change: its first write adds the
 * entry, a later one (the next batch of a bulk change) adds its count to it. A failure here (a full disk, a
 * trigger or a privilege that refuses) fails the change's own op, which is then not made. now is the
 * statements' $1 (NOW): the pinned clock, else null and the database's own.
 */
export async function writeAudit(
  client: pg.PoolClient,
  audit: Audit | undefined,
  count: number,
  now: number | null,
): Promise<void> {
  if (!audit) return;
  await client.query(
    `INSERT INTO audit AS a (at, who, operation, target, count, change) VALUES (${NOW}, $2, $3, $4, $5, $6)
     ON CONFLICT (change) DO UPDATE SET count = a.count + excluded.count`,
    [audit.at ?? now, audit.who, audit.operation, audit.target, count, changeOf(audit)],
  );
}

/** RecordsQueue is what PostgresRecords needs of its inbox: the pool, the clock, the commit queue, LISTEN's channel. */
export interface RecordsQueue {
  pool: Pool;
  pinned: (() => number) | undefined;
  /** other queues an op of its own in the next batch (PostgresCommitter's). */
  other(run: (client: pg.PoolClient) => Promise<unknown>, together?: boolean, locks?: Locks): Promise<unknown>;
  schema: string;
  channel(): string;
}

/** PostgresRecords is the configuration's versions, the API's keys and answers, and the audit log of a PostgresInbox. */
export class PostgresRecords {
  private readonly pool: Pool;
  private readonly o: RecordsQueue;

  constructor(o: RecordsQueue) {
    this.o = o;
    this.pool = o.pool;
  }

  // now is the time every statement takes as $1 (NOW): the pinned clock, else null and the database's own.
  private now(): number | null {
    return this.o.pinned ? this.o.pinned() : null;
  }

  /** addApiKey stores a key's hash, name and scope, never the key. */
  async addApiKey(key: ApiKey, audit?: Audit): Promise<void> {
    await this.o.other(async (client) => {
      await client.query(
        "INSERT INTO api_keys (id, name, scope, hash, created_at, revoked_at) VALUES ($1, $2, $3, $4, $5, $6)",
        [key.id, key.name, key.scope, key.hash, key.createdAt, key.revokedAt],
      );
      await writeAudit(client, audit, 1, this.now());
    });
  }

  /** apiKeys lists every key, oldest first. */
  async apiKeys(): Promise<ApiKey[]> {
    return (await this.pool.query("SELECT * FROM api_keys ORDER BY created_at, id")).rows.map(toApiKey);
  }

  /** apiKeyByHash finds a key by its SHA-256, through its unique index. */
  async apiKeyByHash(hash: string): Promise<ApiKey | undefined> {
    const { rows } = await this.pool.query("SELECT * FROM api_keys WHERE hash = $1", [hash]);
    return rows[0] ? toApiKey(rows[0]) : undefined;
  }

  /** revokeApiKey marks a live key revoked. */
  revokeApiKey(id: string, at: number, audit?: Audit): Promise<boolean> {
    return this.o.other(async (client) => {
      const { rowCount } = await client.query(
        "UPDATE api_keys SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL",
        [at, id],
      );
      await writeAudit(client, audit, rowCount ?? 0, this.now());
      return rowCount === 1;
    }) as Promise<boolean>;
  }

  /** remember keeps a POST's first answer; a live one already there wins. */
  // One statement (whose parts see one snapshot): drop the other expired records, insert or replace an expired
  // one of this key, else keep the live one; and return whichever stands.
  async remember(record: Remembered, expiredBefore: number): Promise<Remembered> {
    const { rows } = await this.pool.query(
      `WITH gone AS (DELETE FROM idempotency WHERE at < $6 AND key <> $1),
            mine AS (INSERT INTO idempotency AS i (key, request_hash, status, body, at) VALUES ($1, $2, $3, $4, $5)
                     ON CONFLICT (key) DO UPDATE SET request_hash = $2, status = $3, body = $4, at = $5 WHERE i.at < $6
                     RETURNING *)
       SELECT * FROM mine UNION ALL SELECT * FROM idempotency WHERE key = $1 AND NOT EXISTS (SELECT 1 FROM mine)`,
      [record.key, record.requestHash, record.status, record.body, record.at, expiredBefore],
      { retry: false },
    );
    return toRemembered(rows[0]);
  }

  /** recall finds the answer kept under an idempotency key since a time. */
  async recall(key: string, since: number): Promise<Remembered | undefined> {
    const { rows } = await this.pool.query("SELECT * FROM idempotency WHERE key = $1 AND at >= $2", [key, since]);
    return rows[0] ? toRemembered(rows[0]) : undefined;
  }

  /** addAudit appends an entry for a change that wrote nothing else. */
  async addAudit(entry: Omit<AuditEntry, "seq">): Promise<void> {
    await this.o.other((client) => writeAudit(client, entry, entry.count, this.now()));
  }

  /** auditCounts counts the entries by their actor's kind, the part of who before its first ":". */
  async auditCounts(): Promise<{ kind: string; n: number }[]> {
    const { rows } = await this.pool.query(
      "SELECT split_part(who, ':', 1) AS kind, count(*) AS n FROM audit GROUP BY 1 ORDER BY 1",
    );
    return rows.map((r: { kind: string; n: string }) => ({ kind: r.kind, n: Number(r.n) }));
  }

  /** auditLog lists the audit log newest first, a page at a time. */
  async auditLog(page: { before?: number; limit: number }): Promise<AuditEntry[]> {
    const { rows } = await this.pool.query("SELECT * FROM audit WHERE seq < $1 ORDER BY seq DESC LIMIT $2", [
      page.before ?? Number.MAX_SAFE_INTEGER,
      page.limit,
    ]);
    return rows.map(toAuditEntry);
  }

  /** readConfig reads the newest applied configuration, or undefined. */
  async readConfig(): Promise<StoredConfig | undefined> {
    const { rows } = await this.pool.query(
      "SELECT version, document, transforms, actor, applied_at, way, trust FROM inbox_config ORDER BY version DESC LIMIT 1",
    );
    return rows[0] && toConfig(rows[0]);
  }

  /** configVersion reads the version in force (0: none) through the primary key. */
  async configVersion(): Promise<number> {
    const { rows } = await this.pool.query("SELECT coalesce(max(version), 0) AS v FROM inbox_config");
    return Number(rows[0].v);
  }

  /** configHistory reads every applied version, oldest first. */
  async configHistory(): Promise<StoredConfig[]> {
    const { rows } = await this.pool.query(
      "SELECT version, document, transforms, actor, applied_at, way, trust FROM inbox_config ORDER BY version",
    );
    return rows.map(toConfig);
  }

  /** configVersions reads a page of versions, newest first, through the primary key. */
  async configVersions(page: { before?: number; limit: number }): Promise<StoredConfig[]> {
    const { rows } = await this.pool.query(
      "SELECT version, document, transforms, actor, applied_at, way, trust FROM inbox_config WHERE version < $1 ORDER BY version DESC LIMIT $2",
      [page.before ?? 2 ** 31 - 1, page.limit],
    );
    return rows.map(toConfig);
  }

  /** restoreConfig writes versions as they are, in one statement; those already there are skipped. */
  restoreConfig(versions: readonly StoredConfig[]): Promise<number> {
    return this.restoreRows(
      `INSERT INTO inbox_config (version, document, transforms, actor, applied_at, way, trust)
       SELECT * FROM unnest($1::integer[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::text[])
       ON CONFLICT DO NOTHING`,
      versions,
      [
        (v) => v.version,
        (v) => v.document,
        (v) => JSON.stringify(v.transforms),
        (v) => v.actor,
        (v) => v.appliedAt,
        (v) => v.way ?? "operator",
        (v) => JSON.stringify(v.trust ?? {}),
      ],
    );
  }

  /** restoreApiKeys writes keys as they are, in one statement; an ID or a hash already there is skipped. */
  restoreApiKeys(keys: readonly ApiKey[]): Promise<number> {
    return this.restoreRows(
      `INSERT INTO api_keys (id, name, scope, hash, created_at, revoked_at)
       SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[]) ON CONFLICT DO NOTHING`,
      keys,
      [(k) => k.id, (k) => k.name, (k) => k.scope, (k) => k.hash, (k) => k.createdAt, (k) => k.revokedAt],
    );
  }

  // restoreRows runs one INSERT … SELECT * FROM unnest(…) over the rows, a parameter per column, and counts what it wrote.
  private async restoreRows<T>(sql: string, rows: readonly T[], columns: ((row: T) => unknown)[]): Promise<number> {
    const { rowCount } = await this.pool.query(
      sql,
      columns.map((column) => rows.map(column)),
      { retry: false },
    );
    return rowCount ?? 0;
  }

  /**
   * restoreAudit writes entries with their seq (OVERRIDING the identity), then moves the identity past the
   * highest, so the next entry the API adds does not take a seq that is there; one already there is skipped.
   */
  restoreAudit(entries: readonly AuditEntry[]): Promise<number> {
    return this.o.other(async (client) => {
      const { rowCount } = await client.query(
        `INSERT INTO audit (seq, at, who, operation, target, count) OVERRIDING SYSTEM VALUE
         SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::integer[]) ON CONFLICT DO NOTHING`,
        [
          entries.map((e) => e.seq),
          entries.map((e) => e.at),
          entries.map((e) => e.who),
          entries.map((e) => e.operation),
          entries.map((e) => e.target),
          entries.map((e) => e.count),
        ],
      );
      await client.query(
        "SELECT setval(pg_get_serial_sequence('audit', 'seq'), max(seq)) FROM audit HAVING max(seq) IS NOT NULL",
      );
      return rowCount ?? 0;
    }) as Promise<number>;
  }

  /** applyConfig stores a new version under a lock, pausing what it removes and resuming what it brings back; its commit NOTIFYs. */
  applyConfig(document: string, options: ApplyConfigOptions): Promise<ConfigApplied> {
    const removed = [...(options.removed ?? [])];
    return this.o.other(async (client) => {
      await client.query("SELECT pg_advisory_xact_lock(hashtext($1))", [`webhook-inbox:config:${this.o.schema}`]);
      const current = Number((await client.query("SELECT coalesce(max(version), 0) AS v FROM inbox_config")).rows[0].v);
      if (options.expectedVersion !== undefined && options.expectedVersion !== current)
        return { applied: false, reason: "version", version: current };
      const version = current + 1;
      const { rows: waits } = await client.query(
        `SELECT destination, count(*) AS n FROM deliveries
          WHERE destination = ANY($1::text[]) AND status IN ('received', 'processing') GROUP BY destination`,
        [removed],
      );
      const waiting = waits.map((w: { destination: string; n: string }) => ({
        destination: w.destination,
        n: Number(w.n),
      }));
      if (waiting.length > 0 && !options.cancelWaiting) return { applied: false, reason: "waiting", waiting };
      let cancelled = 0;
      for (const destination of removed) {
        if (options.cancelWaiting)
          cancelled += (
            await client.query(
              `UPDATE delivery_rows SET status = 'failed', error = $2, finished_at = ${NOW} WHERE destination = $3 AND status = 'received'`,
              [
                this.now(),
                `cancelled: destination ${destination} removed by configuration version ${version}`,
                destination,
              ],
            )
          ).rowCount!;
        // Paused in the same commit: no forward to it starts from now on, whichever worker holds its leases.
        await client.query(
          `INSERT INTO destinations AS d (name, paused, paused_reason, changed_at) VALUES ($2, true, $3, ${NOW})
           ON CONFLICT (name) DO UPDATE SET paused = true, paused_reason = $3, changed_at = ${NOW}`,
          [this.now(), destination, `${REMOVED} (version ${version})`],
        );
      }
      // A destination brought back is let go again, unless a person paused it since.
      await client.query(
        `UPDATE destinations SET paused = false, paused_reason = NULL, changed_at = ${NOW}
          WHERE paused_reason LIKE $2 AND name = ANY($3::text[])`,
        [this.now(), `${REMOVED}%`, destinationNames(document).filter((n) => !removed.includes(n))],
      );
      await client.query(
        `INSERT INTO inbox_config (version, document, transforms, actor, applied_at, way, trust)
         VALUES ($2, $3, $4, $5, ${NOW}, $6, $7)`,
        [
          this.now(),
          version,
          document,
          JSON.stringify(options.transforms ?? {}),
          options.actor,
          options.way ?? "operator",
          JSON.stringify(options.trust ?? {}),
        ],
      );
      await writeAudit(client, options.audit, options.parts ?? 1, this.now());
      // Every receiver and worker listening takes the new version up at this commit.
      await client.query("SELECT pg_notify($1, 'config')", [this.o.channel()]);
      return { applied: true, version, cancelled };
    }) as Promise<ConfigApplied>;
  }

  /** setSecret stores a sealed secret in place of one of its name; its commit wakes the watchers. */
  setSecret(secret: StoredSecret, audit?: Audit): Promise<boolean> {
    return this.o.other(async (client) => {
      const { rows } = await client.query("SELECT 1 FROM secrets WHERE name = $1 FOR UPDATE", [secret.name]);
      await this.putOne(client, secret);
      await writeAudit(client, audit, 1, this.now());
      return rows.length === 0;
    }) as Promise<boolean>;
  }

  /** deleteSecret removes a secret; its commit wakes the watchers. */
  deleteSecret(name: string, audit?: Audit): Promise<boolean> {
    return this.o.other(async (client) => {
      const { rowCount } = await client.query("DELETE FROM secrets WHERE name = $1", [name]);
      if (rowCount) await this.changed(client);
      await writeAudit(client, audit, rowCount ?? 0, this.now());
      return rowCount === 1;
    }) as Promise<boolean>;
  }

  /** secrets reads every secret as kept, by name. */
  async secrets(): Promise<StoredSecret[]> {
    return (await this.pool.query("SELECT * FROM secrets ORDER BY name")).rows.map(toStoredSecret);
  }

  /** putSecrets writes secrets as they are, in one transaction. */
  putSecrets(secrets: readonly StoredSecret[], audit?: Audit): Promise<number> {
    return this.o.other(async (client) => {
      for (const secret of secrets) await this.putOne(client, secret);
      await writeAudit(client, audit, secrets.length, this.now());
      return secrets.length;
    }) as Promise<number>;
  }

  /** secretsVersion reads the count of the secrets' changes. */
  async secretsVersion(): Promise<number> {
    const { rows } = await this.pool.query("SELECT version FROM secrets_version");
    return Number(rows[0]?.version ?? 0);
  }

  // putOne writes one secret as it is, and counts the change.
  private async putOne(client: pg.PoolClient, secret: StoredSecret): Promise<void> {
    await client.query(
      `INSERT INTO secrets (name, sealed, set_at, set_by) VALUES ($1, $2, $3, $4)
       ON CONFLICT (name) DO UPDATE SET sealed = excluded.sealed, set_at = excluded.set_at, set_by = excluded.set_by`,
      [secret.name, secret.sealed, secret.setAt, secret.setBy],
    );
    await this.changed(client);
  }

  // changed counts a change of the secrets and, at its commit, wakes every listening receiver and worker,
  // which open them again ("config": the payload their configuration's watcher reads).
  private async changed(client: pg.PoolClient): Promise<void> {
    await client.query("UPDATE secrets_version SET version = version + 1");
    await client.query("SELECT pg_notify($1, 'config')", [this.o.channel()]);
  }
}

// sqlite/records.ts: what a SqliteInbox keeps beside its deliveries: each applied version of the configuration
// (lib/config/) with the way it came, the API's keys (by hash alone), each POST's first answer under its
// Idempotency-Key, the secrets (sealed: lib/secrets.ts), and the audit log, which writeAudit() adds to inside
// whichever transaction makes the change. Held by SqliteInbox, as its reads and bulk writes are.

import type { DatabaseSync, SQLInputValue } from "node:sqlite";
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
import { whole } from "./commit.ts";
import type { Statements } from "./order-keys.ts";

/**
 * writeAudit writes a change's entry in the transaction that makes the change: its first write adds the
 * entry, a later one (the next batch of a bulk change) adds its count to it. A failure here (a full disk, a
 * trigger that refuses) fails the change's own write, which is then not made.
 */
export function writeAudit(sql: Statements, audit: Audit | undefined, count: number, now: number): void {
  if (!audit) return;
  sql(
    `INSERT INTO audit (at, who, operation, target, count, change) VALUES (?, ?, ?, ?, ?, ?)
     ON CONFLICT (change) DO UPDATE SET count = count + excluded.count`,
  ).run(audit.at ?? now, audit.who, audit.operation, audit.target, count, changeOf(audit));
}

/** RecordsQueue is what SqliteRecords needs of its inbox: its statements, its clock and its commit queue. */
export interface RecordsQueue {
  sql: Statements;
  now: () => number;
  /** enqueue runs a write in the next group commit (SqliteCommitter's). */
  enqueue(run: (db: DatabaseSync, guarded: boolean) => unknown, partial?: boolean): Promise<unknown>;
}

/** SqliteRecords is the configuration's versions, the API's keys and answers, the secrets and the audit log of a SqliteInbox. */
export class SqliteRecords {
  private readonly sql: Statements;
  private readonly now: () => number;
  private readonly queue: RecordsQueue;

  constructor(queue: RecordsQueue) {
    this.queue = queue;
    this.sql = queue.sql;
    this.now = queue.now;
  }

  // atomic queues a write that commits whole with its audit entry, or not at all (whole()).
  private atomic<T>(run: () => T): Promise<T> {
    return this.queue.enqueue((db, guarded) => whole(db, guarded, run), true) as Promise<T>;
  }

  /** addApiKey stores a key's hash, name and scope. */
  async addApiKey(key: ApiKey, audit?: Audit): Promise<void> {
    await this.atomic(() => {
      this.sql("INSERT INTO api_keys (id, name, scope, hash, created_at, revoked_at) VALUES (?, ?, ?, ?, ?, ?)").run(
        key.id,
        key.name,
        key.scope,
        key.hash,
        key.createdAt,
        key.revokedAt,
      );
      writeAudit(this.sql, audit, 1, this.now());
    });
  }

  /** apiKeys lists every key, oldest first. */
  async apiKeys(): Promise<ApiKey[]> {
    return this.sql("SELECT * FROM api_keys ORDER BY created_at, id").all().map(toApiKey);
  }

  /** apiKeyByHash finds a key by its SHA-256, through its unique index. */
  async apiKeyByHash(hash: string): Promise<ApiKey | undefined> {
    const row = this.sql("SELECT * FROM api_keys WHERE hash = ?").get(hash);
    return row ? toApiKey(row) : undefined;
  }

  /** revokeApiKey marks a live key revoked. */
  revokeApiKey(id: string, at: number, audit?: Audit): Promise<boolean> {
    return this.atomic(() => {
      const changed = this.sql("UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL").run(
        at,
        id,
      ).changes;
      writeAudit(this.sql, audit, Number(changed), this.now());
      return changed === 1;
    });
  }

  /** remember keeps a POST's first answer, after dropping the expired ones; a live one already there wins. */
  remember(record: Remembered, expiredBefore: number): Promise<Remembered> {
    return this.queue.enqueue(() => {
      this.sql("DELETE FROM idempotency WHERE at < ?").run(expiredBefore);
      this.sql(
        "INSERT INTO idempotency (key, request_hash, status, body, at) VALUES (?, ?, ?, ?, ?) ON CONFLICT (key) DO NOTHING",
      ).run(record.key, record.requestHash, record.status, record.body, record.at);
      return toRemembered(this.sql("SELECT * FROM idempotency WHERE key = ?").get(record.key)!);
    }) as Promise<Remembered>;
  }

  /** recall finds a POST's kept answer. */
  async recall(key: string, since: number): Promise<Remembered | undefined> {
    const row = this.sql("SELECT * FROM idempotency WHERE key = ? AND at >= ?").get(key, since);
    return row ? toRemembered(row) : undefined;
  }

  /** addAudit appends an entry for a change that wrote nothing else. */
  async addAudit(entry: Omit<AuditEntry, "seq">): Promise<void> {
    await this.atomic(() => writeAudit(this.sql, entry, entry.count, this.now()));
  }

  /** auditLog reads the audit log newest first, by its sequence. */
  async auditLog(page: { before?: number; limit: number }): Promise<AuditEntry[]> {
    const rows = this.sql("SELECT * FROM audit WHERE seq < ? ORDER BY seq DESC LIMIT ?").all(
      page.before ?? Number.MAX_SAFE_INTEGER,
      page.limit,
    );
    return rows.map(toAuditEntry);
  }

  /** auditCounts counts the entries by their actor's kind, the part of who before its first ":". */
  async auditCounts(): Promise<{ kind: string; n: number }[]> {
    const rows = this.sql(
      `SELECT CASE WHEN instr(who, ':') > 0 THEN substr(who, 1, instr(who, ':') - 1) ELSE who END AS kind, count(*) AS n
       FROM audit GROUP BY kind ORDER BY kind`,
    ).all() as { kind: string; n: number }[];
    return rows.map((r) => ({ kind: r.kind, n: Number(r.n) }));
  }

  /** readConfig reads the newest applied configuration, or undefined. */
  async readConfig(): Promise<StoredConfig | undefined> {
    const row = this.sql(
      "SELECT version, document, transforms, actor, applied_at, way, trust FROM inbox_config ORDER BY version DESC LIMIT 1",
    ).get();
    return row && toConfig(row);
  }

  /** configHistory reads every applied version, oldest first. */
  async configHistory(): Promise<StoredConfig[]> {
    const rows = this.sql(
      "SELECT version, document, transforms, actor, applied_at, way, trust FROM inbox_config ORDER BY version",
    ).all() as Record<string, unknown>[];
    return rows.map(toConfig);
  }

  /** configVersions reads a page of versions, newest first, through the primary key. */
  async configVersions(page: { before?: number; limit: number }): Promise<StoredConfig[]> {
    const rows = this.sql(
      "SELECT version, document, transforms, actor, applied_at, way, trust FROM inbox_config WHERE version < ? ORDER BY version DESC LIMIT ?",
    ).all(page.before ?? Number.MAX_SAFE_INTEGER, page.limit) as Record<string, unknown>[];
    return rows.map(toConfig);
  }

  /** restoreConfig writes versions as they are, their way and trust with them, in one transaction; those already there are skipped. */
  restoreConfig(versions: readonly StoredConfig[]): Promise<number> {
    return this.restoreRows(
      "INSERT INTO inbox_config (version, document, transforms, actor, applied_at, way, trust) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
      versions,
      (v) => [
        v.version,
        v.document,
        JSON.stringify(v.transforms),
        v.actor,
        v.appliedAt,
        v.way ?? "operator",
        JSON.stringify(v.trust ?? {}),
      ],
    );
  }

  /** restoreApiKeys writes keys as they are, in one transaction; an ID or a hash already there is skipped. */
  restoreApiKeys(keys: readonly ApiKey[]): Promise<number> {
    return this.restoreRows(
      "INSERT INTO api_keys (id, name, scope, hash, created_at, revoked_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
      keys,
      (k) => [k.id, k.name, k.scope, k.hash, k.createdAt, k.revokedAt],
    );
  }

  /** restoreAudit writes entries with their seq, in one transaction; AUTOINCREMENT goes on from the highest. */
  restoreAudit(entries: readonly AuditEntry[]): Promise<number> {
    return this.restoreRows(
      "INSERT INTO audit (seq, at, who, operation, target, count) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
      entries,
      (e) => [e.seq, e.at, e.who, e.operation, e.target, e.count],
    );
  }

  // restoreRows runs one INSERT … ON CONFLICT DO NOTHING per row in one transaction, and counts what it wrote.
  private restoreRows<T>(sql: string, rows: readonly T[], values: (row: T) => SQLInputValue[]): Promise<number> {
    return this.queue.enqueue(() => {
      const insert = this.sql(sql);
      let n = 0;
      for (const row of rows) n += Number(insert.run(...values(row)).changes);
      return n;
    }, true) as Promise<number>;
  }

  /** configVersion reads the version in force (0: none) through the primary key. */
  async configVersion(): Promise<number> {
    const row = this.sql("SELECT max(version) AS v FROM inbox_config").get() as { v: number | null };
    return Number(row.v ?? 0);
  }

  /** applyConfig stores a new version, pausing what it removes and resuming what it brings back, in one transaction. */
  applyConfig(document: string, options: ApplyConfigOptions): Promise<ConfigApplied> {
    const removed = [...(options.removed ?? [])];
    return this.atomic((): ConfigApplied => {
      const current = Number(
        (this.sql("SELECT max(version) AS v FROM inbox_config").get() as { v: number | null }).v ?? 0,
      );
      if (options.expectedVersion !== undefined && options.expectedVersion !== current)
        return { applied: false, reason: "version", version: current };
      const version = current + 1;
      const now = this.now();
      let cancelled = 0;
      const waiting = removed
        .map((destination) => ({
          destination,
          n: Number(
            (
              this.sql(
                "SELECT count(*) AS n FROM deliveries WHERE destination = ? AND status IN ('received', 'processing')",
              ).get(destination) as { n: number }
            ).n,
          ),
        }))
        .filter((w) => w.n > 0);
      if (waiting.length > 0 && !options.cancelWaiting) return { applied: false, reason: "waiting", waiting };
      for (const destination of removed) {
        if (options.cancelWaiting)
          cancelled += Number(
            this.sql(
              "UPDATE delivery_rows SET status = 'failed', error = ?, finished_at = ? WHERE destination = ? AND status = 'received'",
            ).run(`cancelled: destination ${destination} removed by configuration version ${version}`, now, destination)
              .changes,
          );
        // Paused in the same commit: no forward to it starts from now on, whichever worker holds its leases.
        this.sql("INSERT INTO destinations (name) VALUES (?) ON CONFLICT (name) DO NOTHING").run(destination);
        this.sql("UPDATE destinations SET paused = 1, paused_reason = ?, changed_at = ? WHERE name = ?").run(
          `${REMOVED} (version ${version})`,
          now,
          destination,
        );
      }
      // A destination brought back is let go again, unless a person paused it since.
      this.sql(
        "UPDATE destinations SET paused = 0, paused_reason = NULL, changed_at = ? WHERE paused_reason LIKE ? AND name IN (SELECT value FROM json_each(?))",
      ).run(now, `${REMOVED}%`, JSON.stringify(destinationNames(document).filter((n) => !removed.includes(n))));
      this.sql(
        "INSERT INTO inbox_config (version, document, transforms, actor, applied_at, way, trust) VALUES (?, ?, ?, ?, ?, ?, ?)",
      ).run(
        version,
        document,
        JSON.stringify(options.transforms ?? {}),
        options.actor,
        now,
        options.way ?? "operator",
        JSON.stringify(options.trust ?? {}),
      );
      writeAudit(this.sql, options.audit, options.parts ?? 1, now);
      return { applied: true, version, cancelled };
    });
  }

  /** setSecret stores a sealed secret in place of one of its name, and counts a change of the secrets. */
  setSecret(secret: StoredSecret, audit?: Audit): Promise<boolean> {
    return this.atomic(() => {
      const existed = this.sql("SELECT 1 FROM secrets WHERE name = ?").get(secret.name) !== undefined;
      this.putOne(secret);
      writeAudit(this.sql, audit, 1, this.now());
      return !existed;
    });
  }

  /** deleteSecret removes a secret, and counts a change of the secrets when there was one. */
  deleteSecret(name: string, audit?: Audit): Promise<boolean> {
    return this.atomic(() => {
      const changed = Number(this.sql("DELETE FROM secrets WHERE name = ?").run(name).changes);
      if (changed > 0) this.sql("UPDATE secrets_version SET version = version + 1").run();
      writeAudit(this.sql, audit, changed, this.now());
      return changed === 1;
    });
  }

  /** secrets reads every secret as kept, by name. */
  async secrets(): Promise<StoredSecret[]> {
    return this.sql("SELECT * FROM secrets ORDER BY name").all().map(toStoredSecret);
  }

  /** putSecrets writes secrets as they are, in one transaction. */
  putSecrets(secrets: readonly StoredSecret[], audit?: Audit): Promise<number> {
    return this.atomic(() => {
      for (const secret of secrets) this.putOne(secret);
      writeAudit(this.sql, audit, secrets.length, this.now());
      return secrets.length;
    });
  }

  /** secretsVersion reads the count of the secrets' changes. */
  async secretsVersion(): Promise<number> {
    const row = this.sql("SELECT version FROM secrets_version").get() as { version: number } | undefined;
    return Number(row?.version ?? 0);
  }

  // putOne writes one secret as it is, and counts the change, so that running scripts open it again.
  private putOne(secret: StoredSecret): void {
    this.sql(
      `INSERT INTO secrets (name, sealed, set_at, set_by) VALUES (?, ?, ?, ?)
       ON CONFLICT (name) DO UPDATE SET sealed = excluded.sealed, set_at = excluded.set_at, set_by = excluded.set_by`,
    ).run(secret.name, secret.sealed, secret.setAt, secret.setBy);
    this.sql("UPDATE secrets_version SET version = version + 1").run();
  }
}

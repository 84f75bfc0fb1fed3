// postgres/pool.ts: the PostgreSQL backend's connections, below postgres.ts. It takes a URL with several
// hosts as libpq does (postgres://h1:5432,h2:5433/db?target_session_attrs=read-write), opens new connections
// on the host that takes writes, drops the ones that can no longer be trusted, and fails a COMMIT that may
// not have reached a synchronous standby. Not run on its own; postgres.ts opens one Pool per inbox.

import { userInfo } from "node:os";
import pg from "pg";
import type { NoticeMessage } from "pg-protocol/dist/messages.js";
import { message } from "../log.ts";

/** SessionAttrs is what a host must be to take the inbox's connections, as libpq's target_session_attrs says. */
export type SessionAttrs = "any" | "read-write" | "primary";

/** Target is a postgres:// URL taken apart: one plain URL per host for pg, and the inbox's own settings. */
export interface Target {
  /** host:port of each host, in the URL's order. */
  hosts: string[];
  /** One single-host URL per host, without the inbox's own parameters, for pg to connect with. */
  urls: string[];
  schema: string;
  /** ?listen=, when the URL gives it. */
  listen: boolean | undefined;
  attrs: SessionAttrs;
  /** The URL with its password hidden, for log lines and error messages. */
  redacted: string;
}

// The parameters that are the inbox's, not pg's or the server's.
const OWN = ["schema", "listen", "target_session_attrs"];
const ATTRS: readonly string[] = ["any", "read-write", "primary"];

// splitUrl takes a URL apart around its host list, which WHATWG's URL (and so pg) cannot read.
function splitUrl(url: string): { scheme: string; userinfo: string; hosts: string[]; rest: string } | undefined {
  const m = /^(postgres(?:ql)?:\/\/)([^/?#]*)(.*)$/is.exec(url);
  if (!m) return undefined;
  const authority = m[2]!;
  const at = authority.lastIndexOf("@");
  return {
    scheme: m[1]!,
    userinfo: authority.slice(0, at + 1),
    hosts: authority.slice(at + 1).split(","),
    rest: m[3]!,
  };
}

/** redact hides the password of a PostgreSQL URL, one host or several, so a target can go in a log line. */
export function redact(url: string): string {
  const parts = splitUrl(url);
  if (!parts) return "(a PostgreSQL URL that does not parse)";
  const colon = parts.userinfo.indexOf(":");
  const userinfo =
    colon >= 0 && colon < parts.userinfo.length - 2 ? `${parts.userinfo.slice(0, colon)}:***@` : parts.userinfo;
  return `${parts.scheme}${userinfo}${parts.hosts.join(",")}${parts.rest}`;
}

/**
 * parseTarget reads a postgres:// URL: its hosts, and the inbox's ?schema=, ?listen= and
 * ?target_session_attrs= (read-write by default when there are several hosts, as the inbox only writes).
 * A mistake throws a TypeError saying what was expected; the message never holds the password.
 */
export function parseTarget(url: string): Target {
  const redacted = redact(url);
  const parts = splitUrl(url);
  if (!parts || parts.hosts.some((h) => h === "" && parts.hosts.length > 1)) {
    throw new TypeError(
      `Inbox: expected postgres://[user[:password]@]host[:port][,host[:port]…]/database, got ${redacted}`,
    );
  }
  let urls: URL[];
  try {
    urls = parts.hosts.map((host) => new URL(`${parts.scheme}${parts.userinfo}${host}${parts.rest}`));
  } catch {
    throw new TypeError(
      `Inbox: expected postgres://[user[:password]@]host[:port][,host[:port]…]/database, got ${redacted}`,
    );
  }
  const params = urls[0]!.searchParams;
  const schema = params.get("schema") ?? "public";
  if (!/^[a-z_][a-z0-9_]{0,62}$/.test(schema)) {
    throw new TypeError(
      `Inbox: expected ?schema= to be a lower-case SQL name (letters, digits, _), got ${JSON.stringify(schema)}`,
    );
  }
  const listen = params.get("listen");
  if (listen !== null && listen !== "true" && listen !== "false") {
    throw new TypeError(`Inbox: expected ?listen= to be true or false, got ${JSON.stringify(listen)}`);
  }
  const attrs = params.get("target_session_attrs") ?? (urls.length > 1 ? "read-write" : "any");
  if (!ATTRS.includes(attrs)) {
    throw new TypeError(
      `Inbox: expected ?target_session_attrs= to be read-write, primary or any (the inbox writes), got ${JSON.stringify(attrs)}`,
    );
  }
  // pg's query_timeout gives up on a statement client-side, and on a pipelined connection it does so by
  // closing it: a COMMIT waiting for a synchronous standby would be abandoned, which the inbox never does.
  if (params.has("query_timeout")) {
    throw new TypeError(
      "Inbox: ?query_timeout= would abandon a COMMIT that waits for a standby; leave it out (statement_timeout never cancels a COMMIT)",
    );
  }
  // node-postgres lets a URL's options replace the config's own, so ?options= would drop the inbox's
  // synchronous_commit=on and search_path without a word: a 200 could then be lost to a crash.
  if (params.has("options")) {
    throw new TypeError(
      "Inbox: ?options= would replace the inbox's own settings (synchronous_commit=on, its schema); set server settings with ALTER ROLE … SET instead",
    );
  }
  for (const u of urls) {
    for (const name of OWN) u.searchParams.delete(name);
    // As libpq does: without a user in the URL or PGUSER, the operating system's user name (node-postgres
    // would use $USER, which a service manager or a child process may not set).
    if (!u.username && !process.env.PGUSER) u.username = userInfo().username;
  }
  return {
    hosts: urls.map((u) => u.host || "localhost"),
    urls: urls.map((u) => u.toString()),
    schema,
    listen: listen === null ? undefined : listen === "true",
    attrs: attrs as SessionAttrs,
    redacted,
  };
}

/**
 * UncertainCommit is a COMMIT that answered success with a warning: cancelled while it waited for a
 * synchronous standby, it is committed on this server but may be missing from the standby that a failover
 * promotes. Its deliveries are answered 503, so the sender keeps them and sends them again.
 */
export class UncertainCommit extends Error {}

/**
 * inOneWrite runs send(), which queues statements on the client, with the client's socket corked: what it
 * queues goes out in one write, as pg corks each extended-protocol statement's own messages, where each
 * statement would be a write (a system call, and a wake-up of the server process) of its own. pg's socket
 * is not part of its API: where it has no cork (another runtime's socket), they go out as writes of their
 * own, pipelined all the same.
 */
export function inOneWrite<T>(client: pg.ClientBase, send: () => T): T {
  const stream = (client as unknown as { connection?: { stream?: { cork?(): void; uncork?(): void } } }).connection
    ?.stream;
  stream?.cork?.();
  try {
    return send();
  } finally {
    stream?.uncork?.();
  }
}

/**
 * isConnectionLost says an error means the connection is gone, not that a statement was wrong: the server
 * ended the session (57P01 pg_terminate_backend, 57P02 a crash, 57P03 shutting down), the link failed
 * (08…), or the socket closed under it.
 */
export function isConnectionLost(error: unknown): boolean {
  const code = (error as { code?: unknown } | undefined)?.code;
  if (typeof code === "string") return /^(57P0[123]|08)/.test(code) || /^E[A-Z]+$/.test(code);
  return /connection terminated|not queryable|ECONNRESET|EPIPE/i.test(message(error));
}

/**
 * Isolation is how a transaction sees the others': READ COMMITTED, each statement a snapshot of its own, for
 * everything that writes; REPEATABLE READ READ ONLY for a read of several statements that must all see one
 * snapshot (a list read a day at a time, postgres/reads.ts).
 */
export type Isolation = "READ COMMITTED" | "REPEATABLE READ READ ONLY";

/** PoolOptions are what postgres.ts decides for every connection. */
export interface PoolOptions {
  size: number;
  connectTimeoutMs: number;
  applicationName: string;
  types: pg.CustomTypesConfig;
}

/**
 * Pool lends connections on the host that fits the target's session attributes. With ?listen=false it
 * assumes a pooler that lends a server connection per transaction (PgBouncer's transaction mode): no
 * session settings, so each transaction sets its own, and single statements run in a transaction too.
 */
export class Pool {
  /** pooled is true behind a per-transaction pooler (?listen=false): no session state, no named statements. */
  readonly pooled: boolean;
  private readonly pool: pg.Pool;
  private readonly target: Target;
  private readonly size: number;
  // The host new connections go to. It moves on, in the URL's order, when one fails to connect or no longer
  // fits; it never moves back on its own, so an old primary that comes back is not written to beside the new.
  private cursor = 0;
  // Connections handed back whole at least once: one of these may have been ended by the server while it
  // sat idle, and pg hears of it only when it is used again.
  private readonly used = new WeakSet<object>();

  constructor(target: Target, options: PoolOptions) {
    this.target = target;
    this.pooled = target.listen === false;
    this.size = options.size;
    const pool = this;
    const config: pg.PoolConfig = {
      max: options.size,
      connectionTimeoutMillis: options.connectTimeoutMs,
      // Names our connections in pg_stat_activity, so an operator (or the crash tests) can find and end
      // them; an application_name in the URL wins over this default.
      application_name: options.applicationName,
      // The claim's and the finish's statements, and a handler's writes, go out without waiting for
      // each other's answers: one round trip per batch rather than one per statement.
      pipeline: true,
      types: options.types,
      // Set here rather than inherited: a 200 must mean committed and flushed (synchronous_commit), and
      // no statement may run under a stricter isolation that fails claims with serialization errors.
      // A per-transaction pooler takes no startup options (PgBouncer 1.18 refuses them): begin() sets them.
      ...(this.pooled
        ? {}
        : {
            options: `-c search_path=${target.schema} -c synchronous_commit=on -c default_transaction_isolation=read\\ committed`,
          }),
      // Each new connection goes to the cursor's host; a URL with several hosts never reaches pg itself.
      Client: class extends pg.Client {
        readonly hostIndex: number;
        constructor(c: pg.ClientConfig) {
          const at = pool.cursor;
          super({ ...c, connectionString: target.urls[at] });
          this.hostIndex = at;
        }
        // A host that refuses or times out is left for the next; a wait for a free connection in a full
        // pool fails too, but says nothing about the host.
        override connect(): Promise<pg.Client>;
        override connect(callback: ((err: Error) => void) | ((err: null, c: pg.Client) => void)): void;
        override connect(
          callback?: ((err: Error) => void) | ((err: null, c: pg.Client) => void),
          // biome-ignore lint/suspicious/noConfusingVoidType: pg.Pool's own overload returns void when given a callback
        ): Promise<pg.Client> | void {
          if (!callback)
            return super.connect().catch((error: unknown) => Promise.reject((pool.moveOn(this.hostIndex), error)));
          const answer = callback as (err: Error | null, c?: pg.Client) => void;
          super.connect((error: Error | null) => {
            if (error) pool.moveOn(this.hostIndex);
            answer(error, this);
          });
        }
      } as unknown as new () => pg.ClientBase,
      onConnect: (client) => this.check(client as pg.ClientBase & { hostIndex: number }),
    };
    this.pool = new pg.Pool(config);
    // An idle connection that the server drops (a restart, pg_terminate_backend) is simply replaced; the
    // next query opens a new one.
    this.pool.on("error", () => {});
    // A dropped connection also emits "error" on its client, at times more than once and, pipelined, with
    // no query to hand it to; unheard, that event kills the process. The queries fail on their own, and
    // the pool replaces a client that is no longer queryable when it comes back.
    this.pool.on("connect", (client) => client.on("error", () => {}));
    // A connection dropped for answering read-only (a primary turned standby) says the host no longer fits.
    this.pool.on("release", (error: unknown, client: pg.PoolClient) => {
      if (error === undefined) this.used.add(client);
      else if (target.attrs !== "any" && (error as { code?: unknown }).code === "25006")
        this.moveOn((client as unknown as { hostIndex: number }).hostIndex);
    });
  }

  // check asks a new connection's server what it is, where the target says what it must be (libpq asks the
  // same: SHOW transaction_read_only for read-write, pg_is_in_recovery() for primary).
  private async check(client: pg.ClientBase & { hostIndex: number }): Promise<void> {
    if (this.target.attrs === "any") return;
    const { rows } = await client.query(
      "SELECT pg_is_in_recovery() AS recovery, current_setting('transaction_read_only') AS ro",
    );
    const fits = this.target.attrs === "primary" ? !rows[0].recovery : rows[0].ro === "off";
    if (fits) return;
    this.moveOn(client.hostIndex);
    const what = rows[0].recovery ? "a standby, in recovery" : "read-only";
    throw Object.assign(
      new Error(`${this.target.hosts[client.hostIndex]} is ${what} (target_session_attrs=${this.target.attrs})`),
      { code: "25006" },
    );
  }

  /** moveOn leaves host `from` for the next in the URL, unless another connection already has. */
  moveOn(from: number): void {
    if (this.cursor === from) this.cursor = (from + 1) % this.target.urls.length;
  }

  /**
   * connect lends a connection, trying each host at most once, in turn from the current one, each within
   * the connect timeout (per host, as libpq's connect_timeout). Fails with every host's reason.
   */
  async connect(): Promise<pg.PoolClient> {
    const reasons: string[] = [];
    let last: unknown;
    for (let tried = 0; tried < this.target.urls.length; tried++) {
      const at = this.cursor;
      try {
        return await this.pool.connect();
      } catch (error) {
        last = error;
        reasons.push(`${this.target.hosts[at]}: ${message(error)}`);
        // Unmoved, the host was not at fault (a full pool's wait ran out): another host would not help.
        if (this.cursor === at) throw error;
      }
    }
    if (this.target.urls.length === 1) throw last;
    throw Object.assign(new Error(`no host takes the inbox's connections (${reasons.join("; ")})`, { cause: last }), {
      code: (last as { code?: unknown }).code,
    });
  }

  /**
   * transaction lends a connection with a transaction begun on it. A connection the server ended while it
   * sat in the pool (a restart, a failover, pg_terminate_backend, an idle timeout) fails at BEGIN, before
   * anything of the caller's ran: it is dropped and BEGIN tried on another, so no caller fails for it.
   */
  async transaction(): Promise<pg.PoolClient> {
    for (let tries = 0; ; tries++) {
      const client = await this.connect();
      try {
        await this.begin(client);
        return client;
      } catch (error) {
        client.release(error instanceof Error ? error : new Error(message(error)));
        if (!this.used.has(client) || !isConnectionLost(error) || tries >= this.size) throw error;
      }
    }
  }

  /**
   * snapshot runs a read of several statements in one snapshot: a REPEATABLE READ READ ONLY transaction, its
   * BEGIN sent with run's first statement (the connection pipelines them), rolled back when run is done (a read
   * has nothing to keep). A connection lost on the way, which the server ended while it sat in the pool, is
   * dropped and the read run again on another, as query() does; any other error is run's, thrown once the
   * transaction is rolled back and the connection back in the pool (dropped if the rollback fails too).
   */
  async snapshot<T>(run: (client: pg.PoolClient) => Promise<T>): Promise<T> {
    for (let tries = 0; ; tries++) {
      const client = await this.connect();
      const [begun, ran] = await Promise.allSettled([this.begin(client, "REPEATABLE READ READ ONLY"), run(client)]);
      const failed = begun.status === "rejected" ? begun.reason : ran.status === "rejected" ? ran.reason : undefined;
      const rolledBack = await client.query("ROLLBACK").then(
        () => true,
        () => false,
      );
      if (failed === undefined && rolledBack) {
        client.release();
        return (ran as PromiseFulfilledResult<T>).value;
      }
      const error = failed ?? new Error("snapshot: the read's ROLLBACK failed");
      client.release(rolledBack ? undefined : error instanceof Error ? error : new Error(message(error)));
      if (!this.used.has(client) || !isConnectionLost(error) || tries >= this.size) throw error;
    }
  }

  /** begin opens a transaction (READ COMMITTED unless said) with the inbox's settings, set here when no session keeps them. */
  async begin(client: pg.PoolClient, isolation: Isolation = "READ COMMITTED"): Promise<void> {
    const begun = client.query(`BEGIN ISOLATION LEVEL ${isolation}`);
    if (!this.pooled) return void (await begun);
    // SET LOCAL: gone at the end of the transaction, before the pooler lends the connection on. A SET takes no
    // snapshot, where a SELECT of set_config() did: a snapshot's first statement must be able to lock before its
    // snapshot is taken (postgres/reads.ts). The schema is a plain lower-case name, checked by parseTarget.
    const set = client.query(`SET LOCAL search_path TO ${this.target.schema}; SET LOCAL synchronous_commit TO on`);
    await Promise.all([begun, set]);
  }

  /**
   * inOneTrip runs one statement in a transaction of its own, BEGIN, the statement and COMMIT written
   * together: one round trip instead of three, and still answered only after the COMMIT's. beside(client)
   * may queue more statements between the two (a NOTIFY). A connection the server ended while it sat in the
   * pool fails at BEGIN, before anything ran, and is dropped and tried on another, as in transaction().
   * A statement that fails throws its own error (the server then answered ROLLBACK to the COMMIT); a
   * COMMIT that fails or warns throws as commit() does.
   */
  async inOneTrip(statement: pg.QueryConfig, beside?: (client: pg.PoolClient) => void): Promise<pg.QueryResult> {
    for (let tries = 0; ; tries++) {
      const client = await this.connect();
      const [begun, done, committed] = inOneWrite(client, () => {
        const begun = this.begin(client);
        const done = client.query(statement);
        beside?.(client);
        return [begun, done, this.commit(client)] as const;
      });
      const [b, s, c] = await Promise.allSettled([begun, done, committed]);
      if (b.status === "rejected") {
        client.release(b.reason instanceof Error ? b.reason : new Error(message(b.reason)));
        if (!this.used.has(client) || !isConnectionLost(b.reason) || tries >= this.size) throw b.reason;
        continue;
      }
      // The statement's own error says more than the ROLLBACK that the COMMIT then met.
      const failed = s.status === "rejected" ? s.reason : c.status === "rejected" ? c.reason : undefined;
      if (failed === undefined) {
        client.release();
        return (s as PromiseFulfilledResult<pg.QueryResult>).value;
      }
      // Dropped, whatever failed: the error may say the host no longer fits (25006, a primary turned
      // standby), which the release hears; a bad row is rare enough to cost a new connection.
      client.release(failed instanceof Error ? failed : new Error(message(failed)));
      throw failed;
    }
  }

  /**
   * commit commits, and fails unless the server says COMMIT without a warning. A COMMIT whose wait for a
   * synchronous standby was cancelled (pg_cancel_backend, or the connection terminated while it waits)
   * answers success with a WARNING ("canceling wait for synchronous replication … already committed
   * locally, but might not have been replicated"); that is an UncertainCommit. Any WARNING counts, as the
   * text is in the server's language. A transaction that an unawaited statement aborted answers ROLLBACK.
   */
  async commit(client: pg.PoolClient): Promise<void> {
    const warnings: NoticeMessage[] = [];
    const heard = (notice: NoticeMessage) => {
      if (/^(01|57)/.test(notice.code ?? "")) warnings.push(notice);
    };
    client.on("notice", heard);
    let result: pg.QueryResult;
    try {
      result = await client.query("COMMIT");
    } finally {
      client.off("notice", heard);
    }
    if (warnings.length > 0) {
      const w = warnings[0]!;
      throw new UncertainCommit(
        `the COMMIT may not be on the standby: ${w.message}${w.detail ? ` (${w.detail})` : ""}`,
      );
    }
    if (result.command !== "COMMIT")
      throw new Error(`the transaction was rolled back (the server answered ${result.command} to COMMIT)`);
  }

  /**
   * query runs one statement on a connection of its own. Behind a per-transaction pooler it runs inside a
   * transaction, the only place its settings hold (so VACUUM and CREATE INDEX CONCURRENTLY need a direct URL).
   * The connection is dropped if it fails, whatever the reason. A statement that met a connection the
   * server had ended while idle runs again on another, unless retry is false: a write's COMMIT can be
   * answered, then the connection ended, before pg hears that it went through.
   */
  async query(
    text: string | pg.QueryConfig,
    values?: unknown[],
    options: { retry?: boolean } = {},
  ): Promise<pg.QueryResult> {
    for (let tries = 0; ; tries++) {
      const client = await this.connect();
      try {
        const result = await this.once(client, text, values);
        client.release();
        return result;
      } catch (error) {
        client.release(error instanceof Error ? error : new Error(message(error)));
        if (options.retry === false || !this.used.has(client) || !isConnectionLost(error) || tries >= this.size)
          throw error;
      }
    }
  }

  private async once(
    client: pg.PoolClient,
    text: string | pg.QueryConfig,
    values: unknown[] | undefined,
  ): Promise<pg.QueryResult> {
    const run = () => (typeof text === "string" ? client.query(text, values) : client.query(text));
    if (!this.pooled) return run();
    // BEGIN, the settings and the statement go out together; COMMIT after, so that a warning the
    // statement raises is not taken for the COMMIT's.
    const [begun, result] = await Promise.allSettled([this.begin(client), run()]);
    if (begun.status === "rejected") throw begun.reason;
    if (result.status === "rejected") throw result.reason;
    await this.commit(client);
    return result.value;
  }

  /** listener makes a client of its own (not from the pool), on the current host, for LISTEN. */
  listener(): pg.Client {
    const options = (this.pool as unknown as { options: pg.ClientConfig }).options;
    return new pg.Client({ ...options, connectionString: this.target.urls[this.cursor] });
  }

  end(): Promise<void> {
    return this.pool.end();
  }
}

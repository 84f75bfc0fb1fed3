// test/postgres-pool.test.ts: a PostgreSQL URL with several hosts (postgres/pool.ts): how it is read and
// shown, and that new connections find the host that takes writes, past one that is down or a standby; and a read
// of several statements in one snapshot (snapshot()).
// The standby is a private cluster pair (skipped in one line without PostgreSQL's server binaries).
//   npx node --import tsx --test test/postgres-pool.test.ts

import assert from "node:assert/strict";
import { createServer } from "node:net";
import { after, before, describe, it } from "node:test";
import { connect, type Inbox } from "../inbox.ts";
import pg from "pg";
import { parseTarget, Pool, redact } from "../lib/postgres/pool.ts";
import { freePort, freshSchema, POSTGRES, postgresSkip, privatePostgres, type PrivatePostgres } from "./helpers.ts";

const pgSkip = await postgresSkip();

describe("a URL with several hosts", () => {
  it("is read as libpq reads it: one URL per host, the inbox's own parameters apart, read-write by default", () => {
    const t = parseTarget("postgres://app:s3cret@h1:5432,h2:5433,[::1]/inbox?schema=billing&sslmode=disable");
    assert.deepEqual(t.hosts, ["h1:5432", "h2:5433", "[::1]"]);
    assert.deepEqual(t.urls, [
      "postgres://app:s3cret@h1:5432/inbox?sslmode=disable",
      "postgres://app:s3cret@h2:5433/inbox?sslmode=disable",
      "postgres://app:s3cret@[::1]/inbox?sslmode=disable",
    ]);
    assert.equal(t.schema, "billing");
    assert.equal(t.attrs, "read-write", "the inbox writes: with several hosts it wants the writable one");
    assert.equal(parseTarget("postgres://u@h1/db").attrs, "any", "one host is taken as it is, as before");
    assert.equal(parseTarget("postgres://u@h1,h2/db?target_session_attrs=primary").attrs, "primary");
    assert.equal(parseTarget("postgres://u@h1,h2/db?listen=false").listen, false);
  });

  it("shows its hosts with the password hidden", () => {
    assert.equal(
      redact("postgres://app:s3cret@h1:5432,h2:5433/inbox?schema=x"),
      "postgres://app:***@h1:5432,h2:5433/inbox?schema=x",
    );
    assert.equal(redact("postgres://app@h1,h2/inbox"), "postgres://app@h1,h2/inbox");
    assert.doesNotMatch(redact("postgresql://a:p%40ss@h/db"), /p%40ss/);
  });

  it("refuses what the inbox cannot do, in one line that never shows the password", () => {
    const refused = (url: string, pattern: RegExp) =>
      assert.throws(
        () => parseTarget(url),
        (e: Error) => e instanceof TypeError && pattern.test(e.message) && !e.message.includes("s3cret"),
      );
    refused(
      "postgres://u:s3cret@h1,h2/db?target_session_attrs=standby",
      /expected \?target_session_attrs= to be read-write, primary or any/,
    );
    refused("postgres://u:s3cret@h1,h2/db?target_session_attrs=prefer-standby", /the inbox writes/);
    refused("postgres://u:s3cret@h1,,h2/db", /expected postgres:\/\//);
    refused("postgres://u:s3cret@h1:port,h2/db", /expected postgres:\/\//);
    refused("postgres://u:s3cret@h1/db?query_timeout=5000", /query_timeout= would abandon a COMMIT/);
    refused(
      "postgres://u:s3cret@h1/db?options=-c%20synchronous_commit%3Doff",
      /options= would replace the inbox's own settings/,
    );
    refused("postgres://u:s3cret@h1,h2/db?schema=Bad-Name", /expected \?schema= to be a lower-case SQL name/);
  });

  it("stores past a first host that is down, and says both hosts in its target", { skip: pgSkip }, async () => {
    const fresh = await freshSchema("hosts_down");
    const up = new URL(fresh.url);
    const down = await freePort(); // nothing listens here
    const url = `postgres://${up.username}@127.0.0.1:${down},${up.host}${up.pathname}${up.search}`;
    const inbox = await connect(url);
    try {
      assert.equal(await inbox.store({ id: "evt_1", body: Buffer.from("{}") }), "stored");
      assert.equal((await inbox.find("evt_1")).length, 1);
      assert.equal(inbox.target, url);
    } finally {
      await inbox.close();
      await fresh.drop();
    }
  });

  it("stays on its host when a wait for a free connection runs out: that says nothing of the host", {
    skip: pgSkip,
  }, async () => {
    const up = new URL(POSTGRES);
    // The second host counts who knocks, and hangs up.
    let knocks = 0;
    const second = createServer((socket) => void (knocks++, socket.destroy()));
    await new Promise<void>((resolve) => second.listen(0, "127.0.0.1", resolve));
    const port = (second.address() as { port: number }).port;
    const pool = new Pool(parseTarget(`postgres://${up.username}@${up.host},127.0.0.1:${port}${up.pathname}`), {
      size: 1,
      connectTimeoutMs: 200,
      applicationName: "hosts-full-pool",
      types: pg.types,
    });
    const held = await pool.connect();
    try {
      const waited = await pool.connect().then(
        () => "a connection",
        (e: Error) => e.message,
      );
      held.release(new Error("dropped, so the next query opens a new connection"));
      assert.match(waited, /timeout/, "the one connection is taken");
      assert.doesNotMatch(waited, /no host/, "and no other host is tried for it");
      const [row] = (await pool.query("SELECT inet_server_port() AS port")).rows;
      assert.equal(row.port, Number(up.port || 5432));
      assert.equal(knocks, 0, "the new connection went to the first host, as before the wait");
    } finally {
      await pool.end();
      second.close();
    }
  });

  it("fails to open, with every host's reason, when none takes writes", { skip: pgSkip }, async () => {
    const [a, b] = [await freePort(), await freePort()];
    await assert.rejects(connect(`postgres://postgres@127.0.0.1:${a},127.0.0.1:${b}/test`), (e: Error) =>
      new RegExp(`127\\.0\\.0\\.1:${a}: .*ECONNREFUSED.*127\\.0\\.0\\.1:${b}: .*ECONNREFUSED`).test(e.message),
    );
  });
});

describe("snapshot()", () => {
  it("reads its statements in one snapshot, a commit between them unseen; a transaction as the writes take it sees it", {
    skip: pgSkip,
  }, async () => {
    const up = new URL(POSTGRES);
    const pool = new Pool(parseTarget(`postgres://${up.username}@${up.host}${up.pathname}`), {
      size: 2,
      connectTimeoutMs: 2_000,
      applicationName: "pool-snapshot",
      types: pg.types,
    });
    const table = `snapshot_${process.pid}`;
    try {
      await pool.query(`CREATE TABLE ${table} (n integer)`);
      // Two counts in one read, a row committed by another connection between them.
      const counts = (read: (run: (client: pg.PoolClient) => Promise<number[]>) => Promise<number[]>) =>
        read(async (client) => {
          const count = async () => Number((await client.query(`SELECT count(*) AS n FROM ${table}`)).rows[0].n);
          const first = await count();
          await pool.query(`INSERT INTO ${table} VALUES (1)`);
          return [first, await count()];
        });
      assert.deepEqual(await counts((run) => pool.snapshot(run)), [0, 0], "the second count is the first's moment");
      // The control: READ COMMITTED, each statement a snapshot of its own, sees the row.
      const committed = await counts(async (run) => {
        const client = await pool.transaction();
        try {
          return await run(client);
        } finally {
          await client.query("ROLLBACK");
          client.release();
        }
      });
      assert.deepEqual(committed, [1, 2]);
      await assert.rejects(
        pool.snapshot((client) => client.query(`INSERT INTO ${table} VALUES (2)`)),
        /read-only transaction/,
        "a snapshot only reads",
      );
      assert.equal(Number((await pool.query(`SELECT count(*) AS n FROM ${table}`)).rows[0].n), 2);
    } finally {
      await pool.query(`DROP TABLE IF EXISTS ${table}`);
      await pool.end();
    }
  });
});

describe("a URL that names a standby first", () => {
  let primary: PrivatePostgres | undefined;
  let standby: PrivatePostgres | undefined;
  let skip: string | false = false;
  const opened: Inbox[] = [];
  before(async () => {
    const made = await privatePostgres();
    if (typeof made === "string") return void (skip = made);
    primary = made;
    standby = await primary.standby();
  });
  after(async () => {
    for (const inbox of opened) await inbox.close();
    await standby?.destroy();
    await primary?.destroy();
  });
  const both = (query: string) =>
    `postgres://postgres@127.0.0.1:${standby!.port},127.0.0.1:${primary!.port}/postgres?schema=hosts${query}`;

  it("writes to the primary, the second host, with target_session_attrs=read-write (the default) or primary", async (t) => {
    if (skip) return t.skip(skip);
    for (const query of ["", "&target_session_attrs=primary"]) {
      const inbox = await connect(both(query));
      opened.push(inbox);
      assert.notEqual(await inbox.store({ id: `evt${query}`, body: Buffer.from("{}") }), undefined);
      const [server] = await inbox.query("SELECT inet_server_port() AS port, pg_is_in_recovery() AS recovery");
      assert.deepEqual([server!.port, server!.recovery], [primary!.port, false]);
    }
  });

  it("control: with target_session_attrs=any it takes the standby, which cannot take the schema", async (t) => {
    if (skip) return t.skip(skip);
    await assert.rejects(connect(both("&target_session_attrs=any")), /read-only transaction|recovery/);
  });
});

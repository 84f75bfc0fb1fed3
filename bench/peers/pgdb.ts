// bench/peers/pgdb.ts: a fresh PostgreSQL database per peer and run, dropped afterwards, on the
// server at BENCH_PG_URL (default postgres://postgres@127.0.0.1:5432), and whether that server answers.

import pg from "pg";

/** PG_URL is the server every PostgreSQL row uses; its `postgres` database administers the others. */
export const PG_URL = process.env.BENCH_PG_URL ?? "postgres://postgres@127.0.0.1:5432";

function url(database: string): string {
  const u = new URL(PG_URL);
  u.pathname = `/${database}`;
  return u.toString();
}

/** admin runs one statement on the administrative database. */
async function admin(sql: string): Promise<void> {
  const client = new pg.Client({ connectionString: url("postgres") });
  await client.connect();
  try {
    await client.query(sql);
  } finally {
    await client.end();
  }
}

/** pgReachable says whether the server answers within two seconds. */
export async function pgReachable(): Promise<boolean> {
  const client = new pg.Client({ connectionString: url("postgres"), connectionTimeoutMillis: 2000 });
  try {
    await client.connect();
    await client.query("SELECT 1");
    return true;
  } catch {
    return false;
  } finally {
    await client.end().catch(() => {});
  }
}

/** freshDatabase creates an empty database named name (dropping a leftover one) and returns its URL and its drop. */
export async function freshDatabase(name: string): Promise<{ url: string; drop: () => Promise<void> }> {
  if (!/^[a-z_][a-z0-9_]*$/.test(name)) throw new TypeError(`freshDatabase: expected a plain identifier, got ${name}`);
  await admin(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
  await admin(`CREATE DATABASE ${name}`);
  return { url: url(name), drop: () => admin(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`) };
}

import pg from "pg";
const url = "postgres://postgres@127.0.0.1:5432/test";
const admin = new pg.Client(url); await admin.connect();
let failed = 0;
const rounds = 40;
for (let i = 0; i < rounds; i++) {
  const app = `race-${process.pid}-${i}`;
  const pool = new pg.Pool({ connectionString: url, application_name: app, max: 4, pipeline: true });
  pool.on("error", () => {});
  pool.on("connect", (c) => c.on("error", () => {}));
  await Promise.all([1, 2, 3, 4].map(() => pool.query("SELECT pg_sleep(0.01)")));
  await admin.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", [app]);
  try { await pool.query("SELECT 1"); } catch (e) { failed++; if (failed < 3) console.log((e as any).code, (e as Error).message); }
  await pool.end().catch(() => {});
}
console.log(`failed ${failed}/${rounds}`);
await admin.end();

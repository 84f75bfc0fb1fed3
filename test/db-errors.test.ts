// test/db-errors.test.ts: a worker that meets database errors on PostgreSQL carries on. A trigger on the
// deliveries table makes the server answer every third write to a leased row (of the first 90)
// with a real `deadlock detected` (SQLSTATE 40P01): done marks, failures, releases and heartbeats. The
// worker (worker.ts, a child process, with its handler and a forwarding lane) must bring every delivery
// to both, forward none twice, count the errors by class in its metrics, and exit only on SIGTERM. The
// control, a lane with no retry (test/fixtures/bare-lane.ts), dies of the same errors.

import assert from "node:assert/strict";
import type { ChildProcess } from "node:child_process";
import { once } from "node:events";
import { writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import { join } from "node:path";
import { after, afterEach, beforeEach, describe, it } from "node:test";
import { connect } from "../inbox.ts";
import type { Inbox } from "../lib/store.ts";
import { freshSchema, postgresSkip, spawnScript, tempDir } from "./helpers.ts";

const skip = await postgresSkip();
const DELIVERIES = 40;
const SECRET = `whsec_${Buffer.from("db errors test").toString("base64")}`;

// inject makes every third write to a leased row (a done mark, a failure, a release, a heartbeat) fail
// with 40P01, for the first `upTo` of them. A sequence counts them: unlike a table, it does not roll back
// with the transaction the error aborts.
async function inject(inbox: Inbox, upTo: number): Promise<void> {
  await inbox.query("CREATE SEQUENCE fault_count");
  await inbox.query(`CREATE FUNCTION fault() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF OLD.status = 'processing' AND nextval('fault_count') % 3 = 0 AND currval('fault_count') <= ${upTo} THEN
        RAISE EXCEPTION 'deadlock detected (injected by the test)' USING ERRCODE = 'deadlock_detected';
      END IF;
      RETURN NEW;
    END $$`);
  await inbox.query("CREATE TRIGGER fault BEFORE UPDATE ON delivery_rows FOR EACH ROW EXECUTE FUNCTION fault()");
}

async function destination(): Promise<{ url: string; requests: string[]; server: Server }> {
  const requests: string[] = [];
  const server = createServer((req, res) => {
    req.resume().on("end", () => {
      requests.push(String(req.headers["webhook-id"]));
      res.writeHead(200).end();
    });
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  return { url: `http://127.0.0.1:${(server.address() as { port: number }).port}/`, requests, server };
}

describe("database errors on PostgreSQL", { skip }, () => {
  let schema: Awaited<ReturnType<typeof freshSchema>>;
  let inbox: Inbox;
  let app: Awaited<ReturnType<typeof destination>>;
  let child: ChildProcess | undefined;
  const dir = tempDir("inbox-db-errors-");
  after(dir.cleanup);
  beforeEach(async () => {
    schema = await freshSchema("dberrors");
    inbox = await connect(schema.url);
    app = await destination();
    for (let i = 0; i < DELIVERIES; i++) {
      await inbox.store({
        id: `evt_${i}`,
        body: Buffer.from(JSON.stringify({ customer: `c${i}`, amount: i })),
        destinations: ["handler", "app"],
      });
    }
  });
  afterEach(async () => {
    child?.kill("SIGKILL");
    app.server.closeAllConnections();
    app.server.close();
    await inbox.close();
    await schema.drop();
  });

  const until = async (what: () => Promise<boolean>, ms: number) => {
    const deadline = Date.now() + ms;
    while (Date.now() < deadline && !(await what())) await new Promise((resolve) => setTimeout(resolve, 50));
  };

  it("a worker rides out 40P01 on every kind of write: all handled and forwarded once each, the errors counted, no exit until SIGTERM", async () => {
    const sources = join(dir.dir, "sources.json");
    writeFileSync(
      sources,
      JSON.stringify({
        $destinations: { app: { url: app.url, secret: SECRET, maxInFlight: 4 } },
        default: { provider: "plain", routes: ["handler", "app"] },
      }),
    );
    await inject(inbox, 90);
    child = spawnScript("worker.ts", [
      "--db",
      schema.url,
      "--sources",
      sources,
      "--handler",
      "demo",
      "--lease",
      "5",
      "--metrics-port",
      "0",
      "--concurrency",
      "4",
      "--log-format",
      "json",
    ]);
    let stderr = "";
    child.stdout!.resume();
    child.stderr!.on("data", (d) => (stderr += d));
    let exited: number | null | undefined;
    child.on("exit", (code) => (exited = code));
    const open = async () =>
      Number((await inbox.query("SELECT count(*) AS n FROM deliveries WHERE status <> 'done'"))[0]!.n);
    await until(async () => exited !== undefined || (await open()) === 0, 60_000);
    assert.equal(exited, undefined, `the worker is still running (${stderr.slice(-2000)})`);
    assert.equal(await open(), 0, "every delivery is done at the handler and at app");
    const url = /Metrics on (http:\/\/[^\s"]+)/.exec(stderr)![1]!;
    const metrics = await (await fetch(url)).text();
    const count = (role: string) =>
      Number(new RegExp(`inbox_db_errors_total\\{role="${role}",class="40"\\} (\\d+)`).exec(metrics)?.[1] ?? 0);
    assert.ok(
      count("handler") > 0 && count("forward") > 0,
      `40P01s counted by both roles:\n${metrics
        .split("\n")
        .filter((l) => l.includes("db_errors"))
        .join("\n")}`,
    );
    assert.match(stderr, /deadlock detected \(injected by the test\)/, "and logged");
    const payments = Number((await inbox.query("SELECT count(*) AS n FROM payments"))[0]!.n);
    assert.equal(payments, DELIVERIES, "each payment recorded once");
    assert.equal(app.requests.length, DELIVERIES, "no forward sent twice: no lease ran out");
    assert.equal(new Set(app.requests).size, DELIVERIES);
    child.kill("SIGTERM");
    const [code] = await once(child, "exit");
    assert.equal(code, 0, "SIGTERM ends it cleanly");
    console.log(`# ${count("handler")} 40P01s in the handler loop, ${count("forward")} in the lane, ridden out`);
  });

  it("control: a lane with no retry on 40P01 dies of the same errors", async () => {
    await inject(inbox, 90);
    child = spawnScript("test/fixtures/bare-lane.ts", [schema.url, app.url]);
    let stderr = "";
    child.stdout!.resume();
    child.stderr!.on("data", (d) => (stderr += d));
    // The bound is cleared once the lane has exited: a timer left pending holds the file's process open to its end.
    let bound: NodeJS.Timeout | undefined;
    const [code] = (await Promise.race([
      once(child, "exit"),
      new Promise((resolve) => (bound = setTimeout(() => resolve([undefined]), 30_000))),
    ]).finally(() => clearTimeout(bound))) as [number | undefined];
    assert.ok(code !== undefined && code !== 0, `the bare lane exited (code ${code})`);
    assert.match(stderr, /deadlock detected/);
  });
});

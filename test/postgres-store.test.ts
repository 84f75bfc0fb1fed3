// test/postgres-store.test.ts: a batch of stores on PostgreSQL. A batch of new deliveries goes to the
// server in one write (BEGIN, its INSERT and COMMIT) and is answered after the COMMIT; what that one
// statement cannot settle (a copy of a stored delivery, a row that fails, a delivery with two routes)
// takes the transaction of old, and comes out as before. No timings: round trips are counted through a
// TCP proxy, outcomes read back from the table.
//   node --import tsx --test test/postgres-store.test.ts

import assert from "node:assert/strict";
import { createServer, connect as tcp, type Server, type Socket } from "node:net";
import { afterEach, beforeEach, describe, it } from "node:test";
import { connect } from "../inbox.ts";
import type { Inbox, Stored } from "../lib/store.ts";
import { freshSchema, postgresSkip } from "./helpers.ts";

const skip = await postgresSkip();
const body = (n: number) => Buffer.from(JSON.stringify({ customer: `c${n}`, amount: n }));

/**
 * Proxy stands between the inbox and PostgreSQL and counts round trips: each time a connection's client
 * writes after the server last answered, a new one begins. Pipelined messages written at once count once.
 */
interface Proxy {
  url: string;
  trips: () => number;
  close: () => Promise<void>;
}

async function proxy(target: string): Promise<Proxy> {
  const upstream = new URL(target);
  let trips = 0;
  const sockets: Socket[] = [];
  const server: Server = createServer((client) => {
    const up = tcp(Number(upstream.port || 5432), upstream.hostname);
    sockets.push(client, up);
    let answered = true;
    client.on("data", (chunk) => {
      if (answered) trips++;
      answered = false;
      up.write(chunk);
    });
    up.on("data", (chunk) => {
      answered = true;
      client.write(chunk);
    });
    const end = () => (client.destroy(), up.destroy());
    client.on("close", end).on("error", end);
    up.on("close", end).on("error", end);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const url = new URL(target);
  url.host = `127.0.0.1:${(server.address() as { port: number }).port}`;
  return {
    url: url.toString(),
    trips: () => trips,
    close: () => new Promise<void>((resolve) => (sockets.forEach((s) => s.destroy()), server.close(() => resolve()))),
  };
}

describe("store() on PostgreSQL, a batch at a time", { skip }, () => {
  let schema: Awaited<ReturnType<typeof freshSchema>>;
  let inbox: Inbox;
  let middle: Proxy | undefined;
  beforeEach(async () => {
    schema = await freshSchema("pgstore");
    middle = undefined;
  });
  afterEach(async () => {
    await inbox?.close();
    await middle?.close();
    await schema.drop();
  });
  // poison makes one ID impossible to store, as a bad row would be (in delivery_rows, the table under the
  // deliveries view: docs/table.md#bodies-apart).
  const poison = async (id: string) => {
    await inbox.query(`CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN IF NEW.id = '${id}' THEN RAISE EXCEPTION 'this row cannot be stored'; END IF; RETURN NEW; END $$`);
    await inbox.query("CREATE TRIGGER poison BEFORE INSERT ON delivery_rows FOR EACH ROW EXECUTE FUNCTION poison()");
  };
  const ids = async () =>
    (await inbox.query("SELECT id, route FROM deliveries ORDER BY id, route")).map(
      (r) => `${r.id as string}/${r.route as number}`,
    );

  it("sends a batch of new deliveries in one round trip, and answers each after the COMMIT", async () => {
    middle = await proxy(schema.url);
    inbox = await connect(middle.url);
    // The first batch opens the connection and prepares the statement; the second finds both ready.
    await Promise.all([1, 2].map((n) => inbox.store({ id: `warm_${n}`, body: body(n) })));
    const before = middle.trips();
    const outcomes = await Promise.all(
      Array.from({ length: 16 }, (_, n) => inbox.store({ id: `evt_${n}`, body: body(n) })),
    );
    assert.equal(middle.trips() - before, 1, "BEGIN, the INSERT and COMMIT went out together");
    assert.deepEqual(outcomes, Array(16).fill("stored"));
    assert.equal((await inbox.query("SELECT count(*)::int AS n FROM deliveries WHERE id LIKE 'evt_%'"))[0]!.n, 16);
  });

  it("control: a batch that the one statement cannot settle (a copy in it) takes the round trips of a transaction", async () => {
    middle = await proxy(schema.url);
    inbox = await connect(middle.url);
    await Promise.all([1, 2].map((n) => inbox.store({ id: `warm_${n}`, body: body(n) })));
    const before = middle.trips();
    const outcomes = await Promise.all([
      inbox.store({ id: "evt_1", body: body(1) }),
      inbox.store({ id: "evt_1", body: body(1) }),
    ]);
    assert.ok(middle.trips() - before > 1, `more than one round trip (${middle.trips() - before})`);
    assert.deepEqual(outcomes, ["stored", "duplicate"] satisfies Stored[]);
  });

  it("answers the copies of stored deliveries in a batch of new ones: duplicate, or conflict when the body differs", async () => {
    inbox = await connect(schema.url);
    await inbox.store({ id: "evt_old", body: body(1) });
    await inbox.store({ id: "evt_other", body: body(2) });
    const outcomes = await Promise.all([
      inbox.store({ id: "evt_a", body: body(3) }),
      inbox.store({ id: "evt_old", body: body(1) }),
      inbox.store({ id: "evt_other", body: body(99) }),
      inbox.store({ id: "evt_b", body: body(4) }),
    ]);
    assert.deepEqual(outcomes, ["stored", "duplicate", "conflict", "stored"] satisfies Stored[]);
    assert.deepEqual(await ids(), ["evt_a/0", "evt_b/0", "evt_old/0", "evt_other/0"]);
    const [other] = await inbox.find("evt_other");
    assert.equal(other!.conflicts, 1, "the conflict is counted on the stored copy");
  });

  it("commits the rest of a batch when one row fails, and rejects only that one", async () => {
    inbox = await connect(schema.url);
    await poison("evt_bad");
    const outcomes = await Promise.allSettled(
      ["evt_a", "evt_b", "evt_bad", "evt_c"].map((id, n) => inbox.store({ id, body: body(n) })),
    );
    assert.deepEqual(
      outcomes.map((o) => o.status),
      ["fulfilled", "fulfilled", "rejected", "fulfilled"],
    );
    assert.match(String((outcomes[2] as PromiseRejectedResult).reason), /this row cannot be stored/);
    assert.deepEqual(await ids(), ["evt_a/0", "evt_b/0", "evt_c/0"]);
  });

  it("control: without the bad row, the whole batch is stored", async () => {
    inbox = await connect(schema.url);
    await poison("evt_never_sent");
    const outcomes = await Promise.all(["evt_a", "evt_b", "evt_c"].map((id, n) => inbox.store({ id, body: body(n) })));
    assert.deepEqual(outcomes, ["stored", "stored", "stored"] satisfies Stored[]);
  });

  it("stores every route of a delivery with two beside new ones with one, all or none of each", async () => {
    inbox = await connect(schema.url);
    const outcomes = await Promise.all([
      inbox.store({ id: "evt_a", body: body(1) }),
      inbox.store({ id: "evt_two", body: body(2), destinations: ["billing", "crm"] }),
      inbox.store({ id: "evt_c", body: body(3) }),
    ]);
    assert.deepEqual(outcomes, ["stored", "stored", "stored"] satisfies Stored[]);
    assert.deepEqual(await ids(), ["evt_a/0", "evt_c/0", "evt_two/0", "evt_two/1"]);
  });
});

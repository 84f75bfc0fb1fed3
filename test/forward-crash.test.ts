// test/forward-crash.test.ts: the crash suite with forwarding, on both backends (PostgreSQL skipped in one
// line without one). Forwarding workers (test/fixtures/forward-worker.ts) are killed with SIGKILL while
// they forward to two real destinations, one failing half the time. Every delivery must reach each
// destination at least once; the destination's own dedup by webhook-id must show each exactly once; none
// lost; and each key's order must hold at each destination. A control without order keys shows the order
// check can fail.

import assert from "node:assert/strict";
import type { ChildProcess } from "node:child_process";
import { once } from "node:events";
import { writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import { join } from "node:path";
import { describe, it } from "node:test";
import { connect } from "../inbox.ts";
import { seeded, type Random } from "./chaos.ts";
import { backends, spawnScript, tempDir } from "./helpers.ts";

const seed = Number(process.env.CHAOS_SEED ?? Date.now() % 100_000);
const DELIVERIES = 160;
const KEYS = 8;
const SECRET = `whsec_${Buffer.from("crash test forwarding").toString("base64")}`;

/** Seen is what one destination saw: every request's webhook-id, and the ids it answered 2xx, in answer order. */
interface Seen {
  requests: string[];
  accepted: { id: string; key: string | undefined; time: number }[];
}

// destination answers each forward after a short random wait, failing a share of them with a 500.
async function destination(failRate: number, random: Random): Promise<{ url: string; seen: Seen; server: Server }> {
  const seen: Seen = { requests: [], accepted: [] };
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req
      .on("data", (c: Buffer) => chunks.push(c))
      .on("end", () => {
        const id = String(req.headers["webhook-id"]);
        seen.requests.push(id);
        setTimeout(() => {
          if (random() < failRate) return void res.writeHead(500).end("flaky");
          const event = JSON.parse(Buffer.concat(chunks).toString()) as { time: number };
          seen.accepted.push({ id, key: req.headers["inbox-order-key"] as string | undefined, time: event.time });
          res.writeHead(200).end();
        }, random() * 15);
      });
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  return { url: `http://127.0.0.1:${(server.address() as { port: number }).port}/`, seen, server };
}

/** outOfOrder lists the keys whose first acceptances, deduplicated by webhook-id, are not in event time. */
function outOfOrder(seen: Seen): string[] {
  const first = new Map<string, { key: string; time: number }>();
  for (const a of seen.accepted)
    if (!first.has(a.id)) first.set(a.id, { key: a.key ?? a.id.split(":")[1]!.slice(0, 4), time: a.time });
  const bad: string[] = [];
  const last = new Map<string, number>();
  for (const { key, time } of first.values()) {
    if ((last.get(key) ?? -Infinity) > time) bad.push(key);
    last.set(key, time);
  }
  return [...new Set(bad)];
}

async function scenario(target: string, dir: string, ordered: boolean, random: Random, deliveries = DELIVERIES) {
  const steady = await destination(0, random);
  const flaky = await destination(0.5, random);
  const workers = new Set<ChildProcess>();
  const inbox = await connect(target);
  try {
    const sources = join(dir, "sources.json");
    writeFileSync(
      sources,
      JSON.stringify({
        $destinations: {
          steady: { url: steady.url, secret: SECRET, maxInFlight: 4 },
          flaky: { url: flaky.url, secret: SECRET, maxInFlight: 4, breaker: { coolDown: 0.2, window: 2 } },
        },
      }),
    );
    // Event times shuffled against arrival, so order is the inbox's doing, not the arrival's.
    const times = Array.from({ length: deliveries }, (_, i) => i);
    for (let i = times.length - 1; i > 0; i--) {
      const j = Math.floor(random() * (i + 1));
      [times[i], times[j]] = [times[j]!, times[i]!];
    }
    await Promise.all(
      times.map((time, i) =>
        inbox.store({
          id: `key${i % KEYS}-d${String(i).padStart(4, "0")}`,
          body: Buffer.from(JSON.stringify({ time })),
          contentType: "application/json",
          destinations: ["steady", "flaky"],
          ...(ordered ? { orderKey: `key${i % KEYS}`, eventTime: 1_000_000 + time } : {}),
        }),
      ),
    );
    // A worker that exits by itself (not killed here) would stall the run: the test says which and why.
    const killed = new Set<ChildProcess>();
    const died: string[] = [];
    const spawn = () => {
      const child = spawnScript("test/fixtures/forward-worker.ts", [
        "--db",
        target,
        "--sources",
        sources,
        "--lease-ms",
        "500",
      ]);
      let stderr = "";
      child.stdout!.resume();
      child.stderr!.on("data", (chunk: Buffer) => void (stderr = (stderr + chunk.toString()).slice(-2000)));
      workers.add(child);
      child.on("exit", (code, signal) => {
        workers.delete(child);
        if (!killed.has(child)) died.push(`exit ${code ?? signal}: ${stderr.trim()}`);
      });
    };
    for (let i = 0; i < 3; i++) spawn();
    const accepted = (s: Seen) => new Set(s.accepted.map((a) => a.id)).size;
    const deadline = Date.now() + 40_000;
    let kills = 0;
    while (Date.now() < deadline && (accepted(steady.seen) < deliveries || accepted(flaky.seen) < deliveries)) {
      await new Promise((resolve) => setTimeout(resolve, 150 + random() * 350));
      if (kills < 12) {
        const victim = [...workers][Math.floor(random() * workers.size)];
        if (victim) {
          killed.add(victim);
          victim.kill("SIGKILL");
          kills++;
          spawn();
        }
      }
    }
    for (const child of workers) {
      killed.add(child);
      child.kill("SIGTERM");
    }
    while (workers.size > 0) await new Promise((resolve) => setTimeout(resolve, 50));
    const status = await inbox.query(
      "SELECT destination, status, count(*) AS n FROM deliveries GROUP BY destination, status ORDER BY destination, status",
    );
    // What each key of a stalled destination waits on, for the failure message.
    const keys = await inbox.query(
      `SELECT k.destination, k.order_key, k.head_id, k.due, d.status AS head_status, d.leased_until, d.attempts
       FROM order_keys k LEFT JOIN deliveries d ON d.source = k.source AND d.id = k.head_id AND d.destination = k.destination
       WHERE k.head_id IS NOT NULL ORDER BY k.destination, k.order_key`,
    );
    return { steady: steady.seen, flaky: flaky.seen, kills, status, died, keys };
  } finally {
    for (const child of workers) child.kill("SIGKILL");
    await inbox.close();
    steady.server.closeAllConnections();
    flaky.server.closeAllConnections();
    steady.server.close();
    flaky.server.close();
  }
}

for (const backend of await backends("fwdcrash")) {
  describe(`forwarding workers killed with SIGKILL on ${backend.name}`, { skip: backend.skip }, () => {
    it(`bring every delivery to both destinations, each exactly once by webhook-id, none lost, each key in order (seed ${seed})`, async () => {
      const { target, cleanup } = await backend.make();
      const dir = tempDir("inbox-forward-crash-");
      try {
        const r = await scenario(target, dir.dir, true, seeded(seed));
        for (const [name, seen] of [
          ["steady", r.steady],
          ["flaky", r.flaky],
        ] as const) {
          const ids = new Set(seen.accepted.map((a) => a.id));
          assert.equal(
            ids.size,
            DELIVERIES,
            `${name}: every delivery arrived (${JSON.stringify(r.status)}; workers that exited by themselves: ${JSON.stringify(r.died)}; keys waiting: ${JSON.stringify(r.keys)})`,
          );
          assert.deepEqual(outOfOrder(seen), [], `${name}: each key's deliveries were accepted in event time`);
          console.log(
            `# ${backend.name} ${name}: ${seen.requests.length} requests, ${seen.accepted.length - ids.size} duplicates the destination's dedup by webhook-id dropped`,
          );
        }
        assert.ok(r.flaky.requests.length > DELIVERIES, "the flaky destination failed some and got them again");
        assert.deepEqual(
          r.status.map((s) => [s.destination, s.status, Number(s.n)]),
          [
            ["flaky", "done", DELIVERIES],
            ["steady", "done", DELIVERIES],
          ],
        );
        assert.ok(r.kills > 0, "workers were killed");
        assert.deepEqual(r.died, [], "no worker exited by itself");
      } finally {
        dir.cleanup();
        await cleanup();
      }
    });

    it("control: without order keys, the same faults break the order the check looks for", async () => {
      const { target, cleanup } = await backend.make();
      const dir = tempDir("inbox-forward-crash-");
      try {
        const r = await scenario(target, dir.dir, false, seeded(seed), 80);
        assert.notDeepEqual(outOfOrder(r.flaky), [], "the order check sees disorder when nothing keeps order");
      } finally {
        dir.cleanup();
        await cleanup();
      }
    });
  });
}

// test/claim-race.test.ts: two claimers in two processes, on one database file, started together. Through
// the inbox neither ever gets a delivery the other has; the naive check-then-act claim (the control)
// hands the same delivery to both, which proves the harness can see double work when there is some.

import assert from "node:assert/strict";
import type { ChildProcess } from "node:child_process";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { after, before, describe, it } from "node:test";
import { SqliteInbox } from "../lib/sqlite/sqlite.ts";
import { spawnScript, tempDir } from "./helpers.ts";

const DELIVERIES = 60;

// The claimers are killed at the end if still running, so a failing race cannot hold this file open.
const children: ChildProcess[] = [];
after(() => {
  for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
});

// race stores the deliveries, starts two claimers, lets them go at the same moment and returns each
// one's list of claimed IDs.
async function race(path: string, mode: "inbox" | "naive"): Promise<string[][]> {
  const inbox = new SqliteInbox(path);
  await Promise.all(
    Array.from({ length: DELIVERIES }, (_, i) => inbox.store({ id: `evt_${i}`, body: Buffer.from("{}") })),
  );
  await inbox.close();
  const claimers = [0, 1].map(() => spawnScript("test/fixtures/claimer.ts", [path, mode, "10"]));
  children.push(...claimers);
  const outputs = claimers.map((child) => collect(child));
  await Promise.all(outputs.map((o) => o.ready));
  for (const child of claimers) child.kill("SIGUSR2");
  return Promise.all(outputs.map((o) => o.claimed));
}

function collect(child: ChildProcess): { ready: Promise<void>; claimed: Promise<string[]> } {
  let stderr = "";
  child.stderr!.on("data", (d) => (stderr += d));
  const lines: string[] = [];
  let onReady: () => void;
  const ready = new Promise<void>((resolve) => (onReady = resolve));
  createInterface({ input: child.stdout! }).on("line", (line) => {
    if (line === "ready") onReady();
    lines.push(line);
  });
  const claimed = new Promise<string[]>((resolve, reject) =>
    child.on("close", (code) => {
      if (code !== 0 || lines.at(-1) !== "finished") reject(new Error(`claimer exited with ${code}: ${stderr}`));
      else resolve(lines.filter((l) => l.startsWith("claimed ")).map((l) => l.slice("claimed ".length)));
    }),
  );
  return { ready, claimed };
}

const all = Array.from({ length: DELIVERIES }, (_, i) => `evt_${i}`).sort();

describe("claim() across processes", { timeout: 30_000 }, () => {
  const dir = tempDir();
  after(() => dir.cleanup());
  let inboxRun: string[][];
  let naiveRun: string[][];
  before(async () => {
    // Run one after the other: each needs both cores to itself to race for real.
    inboxRun = await race(join(dir.dir, "inbox.db"), "inbox");
    naiveRun = await race(join(dir.dir, "naive.db"), "naive");
  });

  it("never hands one delivery to two workers, and hands out every one", () => {
    const [a, b] = inboxRun as [string[], string[]];
    const both = a.filter((id) => b.includes(id));
    assert.deepEqual(both, [], "delivered to both claimers");
    assert.deepEqual([...a, ...b].sort(), all);
    // Both really took part; otherwise there was no race to lose.
    assert.ok(a.length > 0 && b.length > 0, `claims were ${a.length} and ${b.length}`);
  });

  it("control: the naive SELECT-then-UPDATE claim does the same work twice", () => {
    const [a, b] = naiveRun as [string[], string[]];
    const both = a.filter((id) => b.includes(id));
    assert.ok(both.length > 0, "the naive claimers never collided, so the test above proves nothing");
    assert.ok(a.length + b.length > DELIVERIES);
  });
});

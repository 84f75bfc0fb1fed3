// bench/retention-cost.ts: what retention costs the hot paths. Tombstones live in the deliveries rows, so
// store() is the same one INSERT as before; what it adds is three indexes: (received_at, source, id) for
// newest-first pages, maintained at every store, and the partial ones on kept and purged rows, touched
// at the done mark and by purge. This stores BENCH_COST_ROWS (50k) deliveries through SqliteInbox.store
// (group commits of 512, fsync each) and then claims and finishes them all, with the shipped schema and with
// those three indexes dropped, in alternating rounds (BENCH_COST_ROUNDS, 3), and prints the medians and ratios.
//   npx tsx bench/retention-cost.ts

import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { SqliteInbox } from "../lib/sqlite/sqlite.ts";
import { f, knob, tempDir } from "./common.ts";

const ROWS = knob("BENCH_COST_ROWS", 50_000);
const ROUNDS = knob("BENCH_COST_ROUNDS", 3);

async function once(path: string, withIndexes: boolean): Promise<{ store: number; finish: number }> {
  const inbox = new SqliteInbox(path);
  try {
    if (!withIndexes)
      for (const name of ["deliveries_received", "deliveries_kept", "deliveries_purged"])
        await inbox.query(`DROP INDEX ${name}`);
    const body = Buffer.from(JSON.stringify({ type: "payment.succeeded", customer: "Ann", amount: 5 }));
    let started = performance.now();
    for (let start = 0; start < ROWS; start += 512) {
      const group: Promise<unknown>[] = [];
      for (let i = start; i < Math.min(ROWS, start + 512); i++) group.push(inbox.store({ id: `evt_${i}`, body }));
      await Promise.all(group);
    }
    const store = ROWS / ((performance.now() - started) / 1000);
    started = performance.now();
    for (let leases = await inbox.claimBatch(512); leases.length > 0; leases = await inbox.claimBatch(512)) {
      await Promise.all(leases.map((lease) => inbox.finish(lease)));
    }
    const finish = ROWS / ((performance.now() - started) / 1000);
    return { store, finish };
  } finally {
    await inbox.close();
  }
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

/** retentionCost runs the alternating rounds and returns the one-line summary. */
export async function retentionCost(): Promise<string> {
  const { dir, cleanup } = tempDir();
  const shipped: { store: number; finish: number }[] = [];
  const without: { store: number; finish: number }[] = [];
  try {
    for (let round = 0; round < ROUNDS; round++) {
      shipped.push(await once(join(dir, `with-${round}.db`), true));
      without.push(await once(join(dir, `without-${round}.db`), false));
    }
  } finally {
    cleanup();
  }
  const [sw, sn] = [median(shipped.map((r) => r.store)), median(without.map((r) => r.store))];
  const [fw, fn] = [median(shipped.map((r) => r.finish)), median(without.map((r) => r.finish))];
  return (
    `retention cost: store ${f(sw)}/s with the retention indexes, ${f(sn)}/s without (×${f(sw / sn, 2)}) | ` +
    `claim+finish ${f(fw)}/s with, ${f(fn)}/s without (×${f(fw / fn, 2)}) | ${ROWS} deliveries, median of ${ROUNDS} alternating rounds`
  );
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) console.log(await retentionCost());

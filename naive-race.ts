// naive-race.ts: the race the inbox fixes. Two copies of one delivery arrive together; a handler that
// checks "seen?" before working and records it after does the work twice. Through the inbox (store,
// then claim) the same two copies do it once.
//   npx tsx naive-race.ts [--db-dir /tmp]

import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { setTimeout as sleep } from "node:timers/promises";
import { pathToFileURL } from "node:url";
import { speakTo } from "./lib/format.ts";
import { SqliteInbox } from "./lib/sqlite/sqlite.ts";

/** WORK_MS is how long the pretend work takes: long enough for the second copy to arrive meanwhile. */
export const WORK_MS = 200;

const times = (n: number) => `${n} ${n === 1 ? "time" : "times"}`;

/** naive handles each copy on its own connection: check, work, then record. Returns how often it worked. */
export async function naive(path: string, copies = 2): Promise<number> {
  const setup = new DatabaseSync(path);
  setup.exec("CREATE TABLE IF NOT EXISTS seen (id TEXT); DELETE FROM seen");
  setup.close();
  let work = 0;
  const handle = async (id: string) => {
    const db = new DatabaseSync(path, { timeout: 5_000 });
    try {
      if (db.prepare("SELECT 1 FROM seen WHERE id = ?").get(id)) return;
      await sleep(WORK_MS);
      work++;
      db.prepare("INSERT INTO seen VALUES (?)").run(id);
    } finally {
      db.close();
    }
  };
  await Promise.all(Array.from({ length: copies }, () => handle("evt_1")));
  return work;
}

/** inboxed stores each copy, then works only on what it could claim. Returns how often it worked. */
export async function inboxed(path: string, copies = 2): Promise<number> {
  let work = 0;
  const handle = async (id: string) => {
    const inbox = new SqliteInbox(path);
    try {
      await inbox.store({ id, body: Buffer.from('{"customer":"Maria Lopez","amount":24.99}') });
      const lease = await inbox.claim();
      if (!lease) return; // the other copy holds it
      await sleep(WORK_MS);
      if (await inbox.finish(lease)) work++;
    } finally {
      await inbox.close();
    }
  };
  await Promise.all(Array.from({ length: copies }, () => handle("evt_1")));
  return work;
}

async function main(argv: string[]): Promise<void> {
  const { Command } = await import("commander");
  const program = new Command("naive-race.ts")
    .description("Show two copies of one delivery doing the work twice, then once through the inbox.")
    .option("--db-dir <dir>", "where to put the two throwaway databases (default: a new temp folder)");
  speakTo(program, argv);
  program.exitOverride((error) => process.exit(error.exitCode === 0 ? 0 : 2));
  await program.parseAsync(argv);
  const given = program.opts<{ dbDir?: string }>().dbDir;
  const dir = given ?? mkdtempSync(join(tmpdir(), "naive-race-"));
  try {
    console.log(`Without the inbox: The work was done ${times(await naive(join(dir, "naive.db")))}`);
    console.log(`With the inbox:    The work was done ${times(await inboxed(join(dir, "inbox.db")))}`);
  } finally {
    if (!given) rmSync(dir, { recursive: true, force: true });
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) await main(process.argv);

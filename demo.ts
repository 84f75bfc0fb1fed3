// demo.ts: the article's whole story, end to end, on a throwaway database. Run it with `npm run demo`,
// or on PostgreSQL with `npm run demo -- --postgres postgres://127.0.0.1:5432/test` (a throwaway schema).
// It runs each script as you would by hand, prints what each one says, and leaves nothing running.

import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { connect } from "./inbox.ts";
import { speakTo } from "./lib/format.ts";
import { runnerName, scriptCommand, signalChild } from "./lib/runtime.ts";

const here = dirname(fileURLToPath(import.meta.url));
const runner = runnerName();

// Each script runs as a child on this very runtime, started as this one was: under tsx (`npm run demo`),
// Node's own type stripping, Deno or Bun.
function script(name: string, args: string[]): ChildProcess {
  const { command, args: all } = scriptCommand(join(here, name), args);
  return spawn(command, all, { cwd: here, stdio: ["ignore", "pipe", "pipe"] });
}

function show(child: ChildProcess, prefix = "  "): void {
  for (const stream of [child.stdout!, child.stderr!]) {
    createInterface({ input: stream }).on("line", (line) => console.log(`${prefix}${line}`));
  }
}

async function step(title: string, name: string, args: string[]): Promise<void> {
  console.log(`\n$ ${runner} ${name} ${args.join(" ")}`.trimEnd() + `\n  # ${title}`);
  const child = script(name, args);
  show(child);
  const code = await new Promise<number | null>((resolve) => child.on("close", resolve));
  if (code !== 0) throw new Error(`${name} exited with ${code}`);
}

// Like every script it answers --help, rather than run the whole story when asked what it does.
const { Command } = await import("commander");
const program = new Command("demo.ts")
  .description("Run the article's story end to end on a throwaway database, and leave nothing running.")
  .option("--postgres <url>", "run it on this PostgreSQL database instead, in a throwaway schema dropped afterwards")
  .addHelpText("after", "\nExamples:\n  npm run demo\n  npm run demo -- --postgres postgres://127.0.0.1:5432/test")
  .exitOverride((error) => process.exit(error.exitCode === 0 ? 0 : 2));
speakTo(program, process.argv);
await program.parseAsync(process.argv);
const { postgres } = program.opts<{ postgres?: string }>();

const dir = mkdtempSync(join(tmpdir(), "inbox-demo-"));
let db = join(dir, "inbox.db");
if (postgres) {
  const url = new URL(postgres);
  url.searchParams.set("schema", `inbox_demo_${process.pid}`);
  db = url.toString();
}
let receiver: ChildProcess | undefined;
try {
  await step("two copies of one delivery, handled at once", "naive-race.ts", []);

  console.log(
    `\n$ ${runner} receiver.ts --port 0 --db ${db} &\n  # the receiver, on a free port and a throwaway database`,
  );
  receiver = script("receiver.ts", ["--port", "0", "--db", db]);
  show(receiver, "  receiver| ");
  const url = await new Promise<string>((resolve, reject) => {
    createInterface({ input: receiver!.stdout! }).on("line", (line) => {
      const match = /^Listening on (http:\/\/\S+)/.exec(line);
      if (match) resolve(match[1]!);
    });
    receiver!.on("exit", (code) => reject(new Error(`the receiver exited with ${code} before listening`)));
  });

  await step("the provider sends evt_100 three times and evt_101 once", "send.ts", ["--url", url]);
  await step("the worker records each payment once", "worker.ts", ["--once", "--db", db]);
  await step("what the inbox holds now", "inbox.ts", ["status", "--db", db]);

  console.log("\n# stopping the receiver (SIGTERM): it finishes what is in flight and exits");
  const exited = new Promise<number | null>((resolve) => receiver!.on("exit", resolve));
  signalChild(receiver, "SIGTERM");
  const code = await exited;
  receiver = undefined;
  if (code !== 0) throw new Error(`the receiver exited with ${code}`);
  const check = await connect(db);
  const stored = await check.count({});
  const [{ payments }] = (await check.query("SELECT count(*) AS payments FROM payments")) as [{ payments: number }];
  if (postgres) await check.query(`DROP SCHEMA inbox_demo_${process.pid} CASCADE`);
  await check.close();
  console.log(`\nDone: 4 deliveries sent, ${stored} stored, ${payments} payments recorded, nothing left running.`);
} catch (error) {
  console.error(`\ndemo failed: ${error instanceof Error ? error.message : String(error)}`);
  process.exitCode = 1;
} finally {
  receiver?.kill("SIGKILL");
  rmSync(dir, { recursive: true, force: true });
}

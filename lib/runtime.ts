// runtime.ts: which JavaScript runtime runs the suite (Node 24, Deno 2 or Bun 1.4), and the one place that
// asks. Every role runs the same code on all three; what differs is how a script starts and stops a sibling
// script, whose SQLite a database was opened with, and whether a Node has node:sqlite at all (sqliteMissing()).
// Not run on its own; test/runtimes.test.ts runs the suite on each, and checks that no other file asks.

import type { ChildProcess } from "node:child_process";
import { isBuiltin } from "node:module";

/** RuntimeName names the three supported runtimes. */
export type RuntimeName = "node" | "deno" | "bun";

/** Runtime is the runtime this process runs on, and its version. */
export interface Runtime {
  name: RuntimeName;
  version: string;
}

/** RUNTIME is the runtime of this process. Deno and Bun both present themselves as a Node, so ask them first. */
export const RUNTIME: Runtime =
  process.versions.deno !== undefined
    ? { name: "deno", version: process.versions.deno }
    : process.versions.bun !== undefined
      ? { name: "bun", version: process.versions.bun }
      : { name: "node", version: process.versions.node };

/** describeRuntime is the runtime for people: "node 24.21.0". */
export function describeRuntime(runtime: Runtime = RUNTIME): string {
  return `${runtime.name} ${runtime.version}`;
}

// Node flags that load code before the script (tsx's loader among them): a child started without them
// could not read TypeScript the way its parent does.
const LOADER_FLAGS = ["--import", "--require", "-r", "--loader", "--experimental-loader"];

// This process's own loader flags, each once (Node's test runner hands a file both `--import=tsx` and
// `--import tsx`). Not configuration: how this very process was started, which its children repeat.
const LOADERS: readonly string[] = (() => {
  const found = new Set<string>();
  const execArgv = RUNTIME.name === "node" ? process.execArgv : [];
  for (let i = 0; i < execArgv.length; i++) {
    const flag = execArgv[i]!;
    const eq = flag.indexOf("=");
    const [name, value] = eq > 0 ? [flag.slice(0, eq), flag.slice(eq + 1)] : [flag, execArgv[i + 1]];
    if (!LOADER_FLAGS.includes(name) || value === undefined) continue;
    if (eq < 0) i++;
    found.add(`${name === "-r" ? "--require" : name}=${value}`);
  }
  return [...found];
})();

/**
 * scriptCommand is how to run a TypeScript file as a child process on a runtime: `deno run -A file`,
 * `bun file`, or `node file`. By default on this one, started as this process was (on Node, with this
 * process's loader flags: `--import tsx` under tsx, none under Node's own type stripping).
 */
export function scriptCommand(
  file: string,
  args: readonly string[] = [],
  on: { name: RuntimeName; binary: string } = { name: RUNTIME.name, binary: process.execPath },
): { command: string; args: string[] } {
  if (on.name === "deno") return { command: on.binary, args: ["run", "-A", file, ...args] };
  if (on.name === "bun") return { command: on.binary, args: [file, ...args] };
  const loaders = RUNTIME.name === "node" && on.binary === process.execPath ? LOADERS : [];
  return { command: on.binary, args: [...loaders, file, ...args] };
}

/** runnerName is how a person starts a script the way this process was: "npx tsx", "node", "deno run -A" or "bun". */
export function runnerName(): string {
  if (RUNTIME.name !== "node") return RUNTIME.name === "deno" ? "deno run -A" : "bun";
  return LOADERS.some((flag) => /tsx/.test(flag)) ? "npx tsx" : "node";
}

/**
 * signalChild sends a signal to a child process. Through process.kill, not child.kill: Deno's child.kill()
 * reports the signal it sent as the cause of the exit (code null) even when the child caught it and exited
 * 0 on its own, as the receiver does on SIGTERM; process.kill leaves the report to the system on all three.
 */
export function signalChild(child: ChildProcess, signal: NodeJS.Signals): void {
  if (child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return;
  try {
    process.kill(child.pid, signal);
  } catch (error) {
    // It exited between the check and the signal: nothing is left to stop.
    if ((error as NodeJS.ErrnoException).code !== "ESRCH") throw error;
  }
}

/** NODE_NEEDED is the Node major the package runs on: the first whose node:sqlite needs no flag. */
export const NODE_NEEDED = 24;

/**
 * sqliteMissing is the one line a script or an app stops with on a Node that has no node:sqlite (Node 20,
 * say), naming the Node it needs and how to get it, or undefined where node:sqlite is there. Deno and Bun
 * bring their own. The check is isBuiltin's, so it runs before anything imports node:sqlite: a static
 * import of it fails while the module graph links, with a stack trace, before any code could say why.
 */
export function sqliteMissing(runtime: Runtime = RUNTIME): string | undefined {
  if (runtime.name !== "node" || isBuiltin("node:sqlite")) return undefined;
  return `webhook-inbox needs Node ${NODE_NEEDED} (for node:sqlite); this is Node ${runtime.version}. Install it into your app with npm install --save-dev node@${NODE_NEEDED}, then run npx webhook-inbox … or npx node app.ts (docs/in-your-app.md#the-node-it-needs)`;
}

/** requireSqlite stops the process with sqliteMissing()'s one line and exit 2 on a Node without node:sqlite. */
export function requireSqlite(): void {
  const missing = sqliteMissing();
  if (missing === undefined) return;
  process.stderr.write(`${missing}\n`);
  process.exit(2);
}

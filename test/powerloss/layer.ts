// test/powerloss/layer.ts: builds the power-loss fault layer (powercutfs.c, a FUSE filesystem) and drives it:
// mount a backing folder, cut the power, mount it again. Used by test/powerloss-layer.test.ts, by the
// scenarios in test/powerloss/scenarios.ts, and so by `npm test` and `npm run torture -- powerloss`.
// Needs /dev/fuse, a C compiler and Debian's libfuse3-dev (apt-get install -y libfuse3-dev fuse3 pkg-config).

import { execFile, spawn, type ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, readFileSync, renameSync, mkdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { promisify } from "node:util";
import { ROOT, tempDir } from "../helpers.ts";

const run = promisify(execFile);
const SOURCE = join(ROOT, "test", "powerloss", "powercutfs.c");

/** CutOptions chooses how harsh a cut is: by default every page not yet synced is lost. */
export interface CutOptions {
  /** Each unsynced page (and size change) reaches the disk with this probability, as in a real cut. @default 0 */
  keep?: number;
  /** Seeds which pages survive, so a failing run can be replayed. @default 1 */
  seed?: number;
}

/** CutReport is what the layer says it did at a cut. */
export interface CutReport {
  droppedPages: number;
  keptPages: number;
  /** Namespace changes (creates, renames, unlinks) undone because no sync had made them durable. */
  undone: number;
  committed: number;
}

/** LayerStats is what the layer holds in memory right now, not yet durable. */
export interface LayerStats {
  dirtyFiles: number;
  dirtyPages: number;
  pendingNames: number;
  syncs: number;
}

let built: Promise<string> | undefined;

/** buildLayer compiles powercutfs.c once per version of its source, into a cache folder, and returns the program. */
export function buildLayer(): Promise<string> {
  built ??= (async () => {
    const source = readFileSync(SOURCE);
    const dir = join(tmpdir(), `inbox-powercutfs-${createHash("sha256").update(source).digest("hex").slice(0, 12)}`);
    const program = join(dir, "powercutfs");
    if (existsSync(program)) return program;
    mkdirSync(dir, { recursive: true });
    const flags = await run("pkg-config", ["--cflags", "--libs", "fuse3"]).then(
      (r) => r.stdout.trim().split(/\s+/),
      () => Promise.reject(new Error("no libfuse3 to build the layer with (pkg-config fuse3 failed)")),
    );
    // Built under a name of its own, then renamed: two test runs building at once never run a half-written file.
    const partial = `${program}.${process.pid}`;
    await run("cc", ["-std=gnu11", "-O2", "-Wall", "-o", partial, SOURCE, ...flags, "-lpthread"]).catch(
      (error: { stderr?: string; message: string }) =>
        Promise.reject(
          new Error(`cannot compile powercutfs.c: ${(error.stderr || error.message).trim().split("\n")[0]}`),
        ),
    );
    renameSync(partial, program);
    return program;
  })();
  return built;
}

let usable: Promise<string | false> | undefined;

/**
 * fuseSkip is false when the layer can be built and mounted here, else the reason, said once in one line.
 * With INBOX_REQUIRE_FUSE=1 (as .ci/run sets it) a missing piece fails the run instead.
 */
export function fuseSkip(): Promise<string | false> {
  usable ??= (async () => {
    let why: string | undefined;
    if (!existsSync("/dev/fuse")) why = "no /dev/fuse";
    else {
      try {
        await buildLayer();
        // Mounting may still be refused (a container without the right), so try once.
        const { dir, cleanup } = tempDir("inbox-fuse-probe-");
        try {
          const layer = await Layer.mount(join(dir, "backing"), join(dir, "mnt"));
          await layer.unmount();
        } finally {
          cleanup();
        }
      } catch (error) {
        why = (error instanceof Error ? error.message : String(error)).split("\n")[0];
      }
    }
    if (why === undefined) return false;
    if (process.env.INBOX_REQUIRE_FUSE === "1")
      throw new Error(`INBOX_REQUIRE_FUSE=1 but the power-loss layer cannot run: ${why}`);
    console.log(
      `# Power-loss tests skipped: ${why}; apt-get install -y libfuse3-dev fuse3 pkg-config (and /dev/fuse) to run them.`,
    );
    return why;
  })();
  return usable;
}

/**
 * Layer is the fault layer mounted on a folder, over a backing folder that plays the disk. A cut loses what
 * was not synced; powerCycle is a cut, an unmount (which empties the kernel's page cache) and a new mount.
 */
export class Layer {
  private daemon!: ChildProcess;
  private lines: string[] = [];
  private waiting: ((line: string) => void) | undefined;
  private exited!: Promise<void>;
  private stderr = "";

  /** The folder that plays the disk: what it holds survives a cut. */
  readonly backing: string;
  readonly mountpoint: string;

  private constructor(backing: string, mountpoint: string) {
    this.backing = backing;
    this.mountpoint = mountpoint;
  }

  /** mount starts the layer on mountpoint over backing (both made if missing) and waits until it serves. */
  static async mount(backing: string, mountpoint: string): Promise<Layer> {
    const layer = new Layer(backing, mountpoint);
    await layer.start();
    return layer;
  }

  private async start(): Promise<void> {
    mkdirSync(this.backing, { recursive: true });
    mkdirSync(this.mountpoint, { recursive: true });
    const program = await buildLayer();
    const daemon = spawn(program, [this.backing, this.mountpoint], { stdio: ["pipe", "pipe", "pipe"] });
    this.daemon = daemon;
    this.lines = [];
    this.stderr = "";
    daemon.stderr!.on("data", (d) => (this.stderr += d));
    this.exited = new Promise((resolve) => daemon.on("exit", () => resolve()));
    createInterface({ input: daemon.stdout! }).on("line", (line) => {
      const waiter = this.waiting;
      this.waiting = undefined;
      if (waiter) waiter(line);
      else this.lines.push(line);
    });
    const ready = await Promise.race([
      this.next(),
      this.exited.then(() => "exited"),
      sleep(15_000).then(() => "timed out"),
    ]);
    if (ready !== "ready") {
      daemon.kill("SIGKILL");
      await this.exited;
      throw new Error(
        `powercutfs did not mount ${this.mountpoint}: ${ready}: ${this.stderr.trim().split("\n").slice(-2).join(" / ")}`,
      );
    }
  }

  private next(): Promise<string> {
    const line = this.lines.shift();
    if (line !== undefined) return Promise.resolve(line);
    return new Promise((resolve) => (this.waiting = resolve));
  }

  private async ask(command: string, answer: string): Promise<Record<string, number>> {
    this.daemon.stdin!.write(`${command}\n`);
    const line = await Promise.race([this.next(), this.exited.then(() => "exited")]);
    if (!line.startsWith(`${answer} `)) throw new Error(`powercutfs: ${command}: ${line} ${this.stderr.trim()}`);
    return Object.fromEntries(
      line
        .split(" ")
        .slice(1)
        .map((kv) => {
          const [k, v] = kv.split("=");
          return [k!, Number(v)];
        }),
    );
  }

  /** cut is the power failing: what was not synced is lost, and every request fails until powerCycle. */
  async cut(options: CutOptions = {}): Promise<CutReport> {
    const keep = options.keep ?? 0;
    if (!(keep >= 0 && keep <= 1)) throw new TypeError(`cut: expected keep between 0 and 1, got ${keep}`);
    const r = await this.ask(keep > 0 ? `cut ${keep} ${options.seed ?? 1}` : "cut", "cut");
    return { droppedPages: r.dropped_pages!, keptPages: r.kept_pages!, undone: r.undone!, committed: r.committed! };
  }

  /** stats says what the layer holds that is not durable yet. */
  async stats(): Promise<LayerStats> {
    const r = await this.ask("stats", "stats");
    return { dirtyFiles: r.dirty_files!, dirtyPages: r.dirty_pages!, pendingNames: r.pending_names!, syncs: r.syncs! };
  }

  /**
   * unmount ends the daemon: a clean shutdown (everything durable) unless cut before. Whatever still has a
   * file open there keeps the old mount alive, detached, until it closes it.
   */
  async unmount(): Promise<void> {
    if (this.daemon.exitCode === null && this.daemon.signalCode === null) {
      this.daemon.stdin!.write("unmount\n");
      this.daemon.stdin!.end();
      const gone = await Promise.race([this.exited.then(() => true), sleep(10_000).then(() => false)]);
      if (!gone) {
        // Never leave a dead mount behind: detach it, then end the daemon.
        await run("umount", ["-l", this.mountpoint]).catch(() => {});
        this.daemon.kill("SIGKILL");
        await this.exited;
      }
    }
  }

  /** powerCycle cuts the power, unmounts and mounts again: the next reads see only what the disk kept. */
  async powerCycle(options: CutOptions = {}): Promise<CutReport> {
    const report = await this.cut(options);
    await this.unmount();
    await this.start();
    return report;
  }
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms).unref());

// bench/peers/redis.ts: a redis-server of the bench's own for the BullMQ rows, on a free port with a
// temporary folder, never the machine's shared Redis (which runs without persistence). The AOF is on,
// fsync'd at every write ("always", as durable as the inbox's synchronous=FULL) or once a second
// ("everysec", Redis's usual setting); no RDB snapshots.

import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

/** freePort asks the kernel for a port nobody listens on. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.on("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => resolve(typeof address === "object" && address ? address.port : 0));
    });
  });
}

/** startRedis starts a redis-server and resolves once it accepts connections, with its URL and its stop. */
export async function startRedis(
  appendfsync: "always" | "everysec",
): Promise<{ url: string; stop: () => Promise<void> }> {
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), "inbox-bench-redis-"));
  const child = spawn(
    "redis-server",
    [
      "--port",
      String(port),
      "--bind",
      "127.0.0.1",
      "--dir",
      dir,
      "--save",
      "",
      "--appendonly",
      "yes",
      "--appendfsync",
      appendfsync,
    ],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  let out = "";
  const exited = new Promise<void>((resolve) => child.on("exit", () => resolve()));
  await new Promise<void>((resolve, reject) => {
    child.stdout.on("data", (d: Buffer) => {
      out += d;
      if (out.includes("Ready to accept connections")) resolve();
    });
    child.on("error", (error) =>
      reject(new Error(`redis-server: ${error.message}; install it with apt-get install -y redis-server`)),
    );
    void exited.then(() => reject(new Error(`redis-server exited: ${out.slice(-500)}`)));
  });
  return {
    url: `redis://127.0.0.1:${port}`,
    stop: async () => {
      if (child.exitCode === null) child.kill("SIGTERM");
      await exited;
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

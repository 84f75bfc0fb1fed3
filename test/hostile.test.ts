// test/hostile.test.ts: malformed and hostile HTTP sent over raw sockets (node:net) to a real receiver on
// loopback. Each request must get the right answer and store nothing; slow clients must be cut off. Run on
// SQLite and on PostgreSQL (INBOX_TEST_POSTGRES; skipped in one line without one).

import assert from "node:assert/strict";
import type { AddressInfo } from "node:net";
import { connect, type Socket } from "node:net";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { connect as connectInbox } from "../inbox.ts";
import type { Inbox } from "../lib/store.ts";
import { createReceiver, type Receiver } from "../receiver.ts";
import { freshSchema, postgresSkip, tempDir } from "./helpers.ts";

const BACKENDS: {
  name: string;
  skip: string | false;
  make(): Promise<{ target: string; cleanup: () => Promise<void> }>;
}[] = [
  {
    name: "sqlite",
    skip: false,
    make: async () => {
      const dir = tempDir("inbox-hostile-");
      return { target: join(dir.dir, "hostile.db"), cleanup: async () => dir.cleanup() };
    },
  },
  {
    name: "postgres",
    skip: await postgresSkip(),
    make: async () => {
      const schema = await freshSchema("hostile");
      return { target: schema.url, cleanup: schema.drop };
    },
  },
];
let target: string;
let cleanup: () => Promise<void>;
let inbox: Inbox;
let receiver: Receiver;
let port: number;
const logLines: string[] = [];
const MAX_BODY = 1_000;

/** Exchange is what came back on a raw connection, and whether the server closed it. */
interface Exchange {
  status: number | undefined;
  text: string;
  closedByServer: boolean;
}

// open connects a raw socket and collects everything the server sends until it closes the connection.
function open(from?: string): { socket: Socket; done: Promise<Exchange>; connected: Promise<void> } {
  const socket = connect({ port, host: "127.0.0.1", ...(from ? { localAddress: from } : {}) });
  let text = "";
  socket.on("data", (d) => (text += d.toString("latin1")));
  const done = new Promise<Exchange>((resolve) => {
    socket.on("close", () => resolve({ status: statusOf(text), text, closedByServer: true }));
    socket.on("error", () => {});
  });
  const connected = new Promise<void>((resolve) => socket.once("connect", () => resolve()));
  return { socket, done, connected };
}

function statusOf(text: string): number | undefined {
  const m = /^HTTP\/1\.1 (\d{3})/.exec(text);
  return m ? Number(m[1]) : undefined;
}

// exchange writes a raw request and waits for the server's answer and its closing of the connection.
async function exchange(raw: string | Buffer): Promise<Exchange> {
  const { socket, done } = open();
  socket.write(raw);
  return done;
}

// firstAnswer writes a raw request and resolves at the first full status line, leaving the socket open.
async function firstAnswer(
  raw: string | Buffer,
): Promise<{ status: number; socket: Socket; closed: Promise<Exchange> }> {
  const { socket, done } = open();
  const status = new Promise<number>((resolve) => {
    let text = "";
    const onData = (d: Buffer) => {
      text += d.toString("latin1");
      const s = statusOf(text);
      if (s !== undefined) {
        socket.off("data", onData);
        resolve(s);
      }
    };
    socket.on("data", onData);
  });
  socket.write(raw);
  return { status: await status, socket, closed: done };
}

const count = async () => Number((await inbox.query("SELECT count(*) AS n FROM deliveries"))[0]!.n);
const post = (headers: string[], body = "") =>
  `POST / HTTP/1.1\r\nHost: 127.0.0.1\r\n${headers.map((h) => `${h}\r\n`).join("")}\r\n${body}`;

// logged waits for the receiver to log a line matching the pattern: proof it has finished with a request.
async function logged(pattern: RegExp): Promise<void> {
  while (!logLines.some((l) => pattern.test(l))) await new Promise((resolve) => setTimeout(resolve, 10));
}

// The same requests against both backends: what a receiver refuses must never reach either store.
for (const backend of BACKENDS) {
  describe(`hostile HTTP on ${backend.name}`, { skip: backend.skip }, () => {
    before(async () => {
      ({ target, cleanup } = await backend.make());
      // A line logged against the other backend must not pass for this one's in logged().
      logLines.length = 0;
      inbox = await connectInbox(target);
      receiver = createReceiver({
        inbox,
        maxBodyBytes: MAX_BODY,
        headersTimeoutMs: 300,
        requestTimeoutMs: 600,
        log: (line) => void logLines.push(line),
      });
      await new Promise<void>((resolve) => receiver.server.listen(0, "127.0.0.1", resolve));
      port = (receiver.server.address() as AddressInfo).port;
    });
    after(async () => {
      receiver.server.closeAllConnections();
      await receiver.close(0);
      await inbox.close();
      await cleanup();
    });

    describe("malformed requests over raw sockets", () => {
      it("refuses a repeated Content-Length with 400 and stores nothing", async () => {
        const before = await count();
        for (const lengths of [
          ["Content-Length: 2", "Content-Length: 2"],
          ["Content-Length: 2", "Content-Length: 3"],
        ]) {
          const r = await exchange(post(["X-Delivery-Id: dup-cl", ...lengths], "{}"));
          assert.equal(r.status, 400, r.text);
        }
        assert.equal(await count(), before);
      });

      it("refuses Content-Length together with Transfer-Encoding with 400 (request smuggling)", async () => {
        const before = await count();
        const r = await exchange(
          post(["X-Delivery-Id: cl-te", "Content-Length: 4", "Transfer-Encoding: chunked"], "2\r\n{}\r\n0\r\n\r\n"),
        );
        assert.equal(r.status, 400, r.text);
        assert.equal(await count(), before);
      });

      it("refuses a Content-Length that is not a number with 400", async () => {
        const before = await count();
        for (const value of ["abc", "12abc", "-1", "0x10", "1 2"]) {
          const r = await exchange(post(["X-Delivery-Id: nan-cl", `Content-Length: ${value}`], "{}"));
          assert.equal(r.status, 400, `${value}: ${r.text}`);
        }
        assert.equal(await count(), before);
      });

      it("answers a chunked body over the limit with 413 and closes the connection", async () => {
        const before = await count();
        const { socket, done } = open();
        socket.write(post(["X-Delivery-Id: too-big", "Transfer-Encoding: chunked"]));
        const chunk = "x".repeat(400);
        // Keep streaming chunks; the server must answer 413 and hang up rather than read on.
        const pump = setInterval(() => {
          if (socket.writable) socket.write(`${chunk.length.toString(16)}\r\n${chunk}\r\n`);
        }, 5);
        const r = await done;
        clearInterval(pump);
        assert.equal(r.status, 413, r.text);
        assert.ok(r.closedByServer);
        assert.equal(await count(), before);
        assert.equal((await inbox.find("too-big")).length, 0);
      });

      it("answers a declared body over the limit with 413 and closes the connection", async () => {
        const r = await exchange(post(["X-Delivery-Id: too-big-cl", `Content-Length: ${MAX_BODY + 1}`]));
        assert.equal(r.status, 413);
        assert.equal((await inbox.find("too-big-cl")).length, 0);
      });

      it("stores nothing of a body cut short, declared or chunked", async () => {
        const cutShort = () => logLines.filter((l) => /cut short/.test(l)).length;
        const seen = cutShort();
        for (const [id, headers, part] of [
          ["cut-short", ["Content-Length: 100"], '{"half":'],
          ["cut-short-chunked", ["Transfer-Encoding: chunked"], "a\r\n0123456789\r\n"],
        ] as const) {
          const { socket, done } = open();
          // Wait for the receiver to have read the part, so the hang-up comes in the middle of the body.
          const read = new Promise<void>((resolve) =>
            receiver.server.once("request", (req) => req.once("data", () => resolve())),
          );
          socket.write(post([`X-Delivery-Id: ${id}`, ...headers], part));
          await read;
          socket.destroy();
          await done;
        }
        await logged(/cut short/);
        while (cutShort() < seen + 2) await new Promise((resolve) => setTimeout(resolve, 10));
        await inbox.flush();
        assert.equal((await inbox.find("cut-short")).length, 0);
        assert.equal((await inbox.find("cut-short-chunked")).length, 0);
      });

      it("answers a 40 KB header with 431", async () => {
        const r = await exchange(
          post(["X-Delivery-Id: big-header", `X-Padding: ${"a".repeat(40 * 1024)}`, "Content-Length: 2"], "{}"),
        );
        assert.equal(r.status, 431, r.text.slice(0, 200));
        assert.equal((await inbox.find("big-header")).length, 0);
      });

      it("answers an empty, missing, repeated or over-long ID with 400", async () => {
        const before = await count();
        for (const headers of [
          ["X-Delivery-Id: "],
          [],
          ["X-Delivery-Id: a", "X-Delivery-Id: b"],
          [`X-Delivery-Id: ${"i".repeat(257)}`],
        ]) {
          const { status, socket } = await firstAnswer(post([...headers, "Content-Length: 2"], "{}"));
          socket.destroy();
          assert.equal(status, 400, headers.join(", "));
        }
        assert.equal(await count(), before);
      });

      it("answers every method but POST with 405", async () => {
        const before = await count();
        for (const method of ["GET", "PUT", "DELETE", "PATCH", "OPTIONS"]) {
          const { status, socket } = await firstAnswer(
            `${method} / HTTP/1.1\r\nHost: x\r\nX-Delivery-Id: m-${method}\r\nContent-Length: 2\r\n\r\n{}`,
          );
          socket.destroy();
          assert.equal(status, 405, method);
        }
        assert.equal(await count(), before);
      });

      it("stores bytes that are not UTF-8 byte-exact", async () => {
        const body = Buffer.from([
          0xff, 0xfe, 0x00, 0x80, 0xc3, 0x28, 0xed, 0xa0, 0x80, 0xf4, 0x90, 0x80, 0x80, 0x0d, 0x0a,
        ]);
        const { status, socket } = await firstAnswer(
          Buffer.concat([Buffer.from(post(["X-Delivery-Id: binary", `Content-Length: ${body.length}`])), body]),
        );
        socket.destroy();
        assert.equal(status, 200);
        const [stored] = await inbox.find("binary");
        assert.ok(stored);
        assert.deepEqual(Buffer.from(stored.body), body);
      });
    });

    describe("slow clients", () => {
      it("cuts off a client that trickles its headers", async () => {
        const { socket, done } = open();
        const header = post(["X-Delivery-Id: slow-headers", "Content-Length: 2"], "{}");
        let at = 0;
        // One byte every 50 ms would take seconds; the 300 ms headers timeout must end it long before.
        const drip = setInterval(() => {
          if (at < header.length && socket.writable) socket.write(header[at++]!);
        }, 50);
        const r = await done;
        clearInterval(drip);
        assert.ok(r.closedByServer);
        assert.ok(at < header.length, "the server hung up before the headers were complete");
        assert.equal((await inbox.find("slow-headers")).length, 0);
      });

      it("cuts off a client that trickles its body", async () => {
        const { socket, done } = open();
        socket.write(post(["X-Delivery-Id: slow-body", "Content-Length: 500"]));
        let sent = 0;
        const drip = setInterval(() => {
          if (sent < 500 && socket.writable) socket.write("x", () => sent++);
        }, 20);
        const r = await done;
        clearInterval(drip);
        assert.ok(sent < 500, "the server hung up before the body was complete");
        assert.ok(r.closedByServer);
        await inbox.flush();
        assert.equal((await inbox.find("slow-body")).length, 0);
      });

      it("answers a real delivery while hundreds of idle and half-sent sockets hang on", async () => {
        // From two addresses, so that each stays under the receiver's cap on connections per address.
        const idle = Array.from({ length: 300 }, (_, i) => {
          const c = open(`127.0.0.${2 + (i % 2)}`);
          // Half of them start a request and stall, the others never say a word.
          if (i % 2 === 0) c.socket.write("POST / HTTP/1.1\r\nHost: x\r\n");
          return c;
        });
        await Promise.all(idle.map((c) => c.connected));
        const res = await fetch(`http://127.0.0.1:${port}/`, {
          method: "POST",
          headers: { "x-delivery-id": "real" },
          body: "{}",
        });
        assert.equal(res.status, 200);
        assert.equal(await res.text(), "stored");
        for (const c of idle) c.socket.destroy();
        await Promise.all(idle.map((c) => c.done));
        assert.equal((await inbox.find("real")).length, 1);
      });
    });
  });
}

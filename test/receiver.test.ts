// test/receiver.test.ts: receiver.ts as a real process on a free port, spoken to over real sockets. Each
// answer it can give, with the database checked after every refusal: nothing of a refused request is
// stored. Raw sockets where fetch would not send what a hostile or broken sender does.

import assert from "node:assert/strict";
import type { ChildProcess } from "node:child_process";
import { createConnection } from "node:net";
import { createInterface } from "node:readline";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { after, before, describe, it } from "node:test";
import { SqliteInbox } from "../lib/sqlite/sqlite.ts";
import { createReceiver } from "../receiver.ts";
import { spawnScript, startReceiver, tempDir, type ReceiverProcess } from "./helpers.ts";

const MAX_BODY = 1_000;

// Every receiver a test starts is killed at the end, so a test that fails (or times out) waiting on one
// does not leave it running and hold this file's process open.
const children = new Set<ChildProcess>();
const track = <T extends ChildProcess | ReceiverProcess>(started: T): T => {
  children.add("child" in started ? started.child : started);
  return started;
};
after(() => {
  for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
});

interface RawResponse {
  status: number;
  headers: Record<string, string>;
  body: string;
}

// raw sends bytes on a fresh connection, part by part (awaiting each part's function first when one is
// given), and resolves with the first final response, or null if the server closed without one.
function raw(port: number, parts: (string | Buffer | (() => Promise<unknown>))[], options: { end?: boolean } = {}) {
  const socket = createConnection({ port, host: "127.0.0.1" });
  let data = Buffer.alloc(0);
  const interim: string[] = [];
  const response = new Promise<RawResponse | null>((resolve) => {
    const parse = () => {
      for (;;) {
        const head = data.indexOf("\r\n\r\n");
        if (head < 0) return;
        const lines = data.subarray(0, head).toString("latin1").split("\r\n");
        const status = Number(lines[0]!.split(" ")[1]);
        const headers = Object.fromEntries(
          lines.slice(1).map((l) => {
            const i = l.indexOf(":");
            return [l.slice(0, i).trim().toLowerCase(), l.slice(i + 1).trim()];
          }),
        );
        if (status === 100) {
          interim.push(lines[0]!);
          data = data.subarray(head + 4);
          continue;
        }
        const length = Number(headers["content-length"] ?? 0);
        if (data.length < head + 4 + length) return;
        resolve({ status, headers, body: data.subarray(head + 4, head + 4 + length).toString("utf8") });
        socket.destroy();
        return;
      }
    };
    socket.on("data", (chunk) => {
      data = Buffer.concat([data, chunk]);
      parse();
    });
    socket.on("close", () => resolve(null));
    socket.on("error", () => {}); // a reset after a refusal is expected; the answer (or null) says it all
  });
  const sent = (async () => {
    await new Promise((resolve) => socket.once("connect", resolve));
    for (const part of parts) {
      if (typeof part === "function") await part();
      else if (!socket.destroyed) socket.write(part);
    }
    if (options.end && !socket.destroyed) socket.end();
  })();
  return { response, sent, interim, socket };
}

// stored reads the database the way an operator would, on its own read-only connection.
function rows(path: string): { id: string; body: Buffer; conflicts: number; content_type: string | null }[] {
  const db = new DatabaseSync(path, { readOnly: true });
  try {
    return (
      db.prepare("SELECT id, body, conflicts, content_type FROM deliveries ORDER BY rowid").all() as Record<
        string,
        unknown
      >[]
    ).map((r) => ({
      id: r.id as string,
      body: Buffer.from(r.body as Uint8Array),
      conflicts: r.conflicts as number,
      content_type: r.content_type as string | null,
    }));
  } finally {
    db.close();
  }
}

describe("receiver.ts", { timeout: 30_000 }, () => {
  const dir = tempDir();
  const path = join(dir.dir, "inbox.db");
  let receiver: ReceiverProcess;
  before(async () => {
    receiver = track(await startReceiver(path, ["--max-body", String(MAX_BODY)]));
  });
  after(async () => {
    await receiver.stop();
    dir.cleanup();
  });

  const post = (id: string | undefined, body: BodyInit, init: RequestInit & { path?: string } = {}) =>
    fetch(new URL(init.path ?? "/", receiver.url), {
      method: "POST",
      body,
      ...init,
      headers: {
        "content-type": "application/json",
        ...(id === undefined ? {} : { "x-delivery-id": id }),
        ...init.headers,
      },
    });
  // refused asserts a request got the status and that the database did not change.
  const refused = async (status: number, request: () => Promise<Response | RawResponse | null>) => {
    const before = rows(path);
    const response = await request();
    assert.equal(response?.status, status);
    assert.deepEqual(rows(path), before, "a refused request changed the database");
    return response;
  };
  // logged waits for the receiver to log a line (after the first `since` characters of its log): its
  // stderr may arrive after the HTTP answer does.
  const logged = (re: RegExp, since = 0) =>
    new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        receiver.child.stderr!.off("data", check);
        reject(new Error(`the receiver never logged ${re}; it logged:\n${receiver.log()}`));
      }, 5_000);
      const check = () => {
        if (!re.test(receiver.log().slice(since))) return false;
        clearTimeout(timer);
        receiver.child.stderr!.off("data", check);
        resolve();
        return true;
      };
      if (!check()) receiver.child.stderr!.on("data", check);
    });

  it("prints the address it listens on, on the port the OS picked", () => {
    assert.match(receiver.url, /^http:\/\/127\.0\.0\.1:\d+$/);
    assert.notEqual(receiver.port, 0);
  });

  it("answers 200 stored for a new delivery, then 200 duplicate for each copy", async () => {
    const first = await post("evt_100", '{"customer":"Maria Lopez","amount":24.99}');
    assert.equal(first.status, 200);
    assert.equal(await first.text(), "stored");
    const copy = await post("evt_100", '{"customer":"Maria Lopez","amount":24.99}');
    assert.equal(copy.status, 200);
    assert.equal(await copy.text(), "duplicate");
    const stored = rows(path).filter((r) => r.id === "evt_100");
    assert.equal(stored.length, 1);
    assert.equal(stored[0]!.content_type, "application/json");
    await logged(/^stored evt_100$/m);
    await logged(/^duplicate evt_100$/m);
  });

  it("answers 200 duplicate to a copy with a different body, keeps the first and counts the conflict", async () => {
    await post("evt_c", '{"amount":1}');
    const other = await post("evt_c", '{"amount":2}');
    assert.equal(other.status, 200);
    assert.equal(await other.text(), "duplicate");
    const [row] = rows(path).filter((r) => r.id === "evt_c");
    assert.equal(row!.body.toString(), '{"amount":1}');
    assert.equal(row!.conflicts, 1);
  });

  it("stores the body byte-exact, bytes that are not valid UTF-8 included", async () => {
    const bytes = Buffer.concat([
      Buffer.from([0xff, 0xfe, 0x00, 0xc3, 0x28, 0x80]),
      Buffer.from(Array.from({ length: 256 }, (_, i) => i)),
    ]);
    const response = await post("evt_bin", bytes, { headers: { "content-type": "application/octet-stream" } });
    assert.equal(response.status, 200);
    assert.deepEqual(rows(path).find((r) => r.id === "evt_bin")!.body, bytes);
  });

  it("stores a chunked body whole", async () => {
    const chunks = ['{"customer":', '"Sam Okafor",', '"amount":12.5}'];
    const { response } = raw(receiver.port, [
      "POST / HTTP/1.1\r\nHost: x\r\nX-Delivery-Id: evt_chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
      ...chunks.map((c) => `${Buffer.byteLength(c).toString(16)}\r\n${c}\r\n`),
      "0\r\n\r\n",
    ]);
    assert.equal((await response)?.status, 200);
    assert.equal(
      rows(path)
        .find((r) => r.id === "evt_chunked")!
        .body.toString(),
      chunks.join(""),
    );
  });

  it("accepts a body of exactly the limit", async () => {
    assert.equal((await post("evt_at_limit", "x".repeat(MAX_BODY))).status, 200);
  });

  it("accepts an ID of exactly 256 characters", async () => {
    assert.equal((await post("a".repeat(256), "{}")).status, 200);
  });

  it("answers 400 to a missing, empty or over-long ID, and stores nothing", async () => {
    await refused(400, () => post(undefined, "{}"));
    await refused(400, () => post("", "{}"));
    await refused(400, () => post("b".repeat(257), "{}"));
    await refused(
      400,
      async () =>
        (
          await raw(receiver.port, [
            "POST / HTTP/1.1\r\nHost: x\r\nX-Delivery-Id: evt_a\r\nX-Delivery-Id: evt_b\r\nContent-Length: 2\r\n\r\n{}",
          ])
        ).response,
    );
    await logged(/^rejected: 400 missing X-Delivery-Id$/m);
    await logged(/^rejected: 400 delivery id longer than 256 characters$/m);
  });

  it("answers 404 to a path that is not a source, and stores nothing", async () => {
    const response = await refused(404, () => post("evt_404", "{}", { path: "/nope" }));
    assert.match(await (response as Response).text(), /no source at \/nope/);
  });

  it("answers 405 with Allow: POST to any other method, and stores nothing", async () => {
    const get = (await refused(405, () => fetch(receiver.url))) as Response;
    assert.equal(get.headers.get("allow"), "POST");
    const put = (await refused(405, () =>
      fetch(receiver.url, { method: "PUT", headers: { "x-delivery-id": "evt_put" }, body: "{}" }),
    )) as Response;
    assert.equal(put.headers.get("allow"), "POST");
  });

  it("answers 413 to a declared length over the limit, before reading the body, and stores nothing", async () => {
    const { response } = raw(receiver.port, [
      `POST / HTTP/1.1\r\nHost: x\r\nX-Delivery-Id: evt_big\r\nContent-Length: ${MAX_BODY + 1}\r\n\r\n`,
    ]);
    const answer = (await refused(413, () => response)) as RawResponse;
    assert.equal(answer.headers.connection, "close");
  });

  it("answers 413 to a chunked body that streams past the limit, and stores nothing", async () => {
    const chunk = "x".repeat(400);
    const { response } = raw(receiver.port, [
      "POST / HTTP/1.1\r\nHost: x\r\nX-Delivery-Id: evt_stream\r\nTransfer-Encoding: chunked\r\n\r\n",
      ...[1, 2, 3].map(() => `${(400).toString(16)}\r\n${chunk}\r\n`),
    ]);
    await refused(413, () => response);
    await logged(/^rejected: 413 body is over the 1000-byte limit$/m);
  });

  it("control: a chunked body just under the limit is stored", async () => {
    // Proves the refusal above is about the size, not about chunked bodies of this shape.
    const chunk = "x".repeat(400);
    const { response } = raw(receiver.port, [
      "POST / HTTP/1.1\r\nHost: x\r\nX-Delivery-Id: evt_stream_ok\r\nTransfer-Encoding: chunked\r\n\r\n",
      `${(400).toString(16)}\r\n${chunk}\r\n`,
      `${(400).toString(16)}\r\n${chunk}\r\n`,
      "0\r\n\r\n",
    ]);
    assert.equal((await response)?.status, 200);
    assert.equal(rows(path).find((r) => r.id === "evt_stream_ok")!.body.length, 800);
  });

  it("stores nothing of a chunked body cut off before its last chunk", async () => {
    const before = rows(path);
    const since = receiver.log().length;
    const { response } = raw(
      receiver.port,
      [
        "POST / HTTP/1.1\r\nHost: x\r\nX-Delivery-Id: evt_cut_chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
        '5\r\n{"a":\r\n',
      ],
      { end: true },
    );
    const answer = await response;
    assert.ok(answer === null || answer.status === 400, `answered ${answer?.status}`);
    await logged(/body cut short|evt_cut_chunked/, since);
    assert.match(receiver.log().slice(since), /^rejected: 400 body cut short after 5 bytes$/m);
    assert.deepEqual(rows(path), before);
  });

  it("stores nothing of a body cut short before its declared length", async () => {
    const before = rows(path);
    const since = receiver.log().length;
    const { response } = raw(
      receiver.port,
      ["POST / HTTP/1.1\r\nHost: x\r\nX-Delivery-Id: evt_cut\r\nContent-Length: 100\r\n\r\n", '{"customer":"Maria'],
      { end: true },
    );
    const answer = await response;
    assert.ok(answer === null || answer.status === 400, `answered ${answer?.status}`);
    // Wait for the receiver's verdict on it, whichever it is, then check it was the right one.
    await logged(/body cut short|evt_cut/, since);
    assert.match(receiver.log().slice(since), /^rejected: 400 body cut short after 18 bytes$/m);
    assert.deepEqual(rows(path), before);
  });

  it("answers 503 with Retry-After when the store fails, stores nothing, and takes the retry", async () => {
    // A trigger, added on a second connection, makes every insert fail the way a full disk would.
    const admin = new DatabaseSync(path);
    admin.exec(
      "CREATE TRIGGER refuse BEFORE INSERT ON delivery_rows BEGIN SELECT RAISE(ABORT, 'simulated: database or disk is full'); END",
    );
    try {
      const response = (await refused(503, () => post("evt_503", '{"amount":1}'))) as Response;
      assert.equal(response.headers.get("retry-after"), "5");
      await logged(/^rejected evt_503: 503 could not store: .*simulated: database or disk is full/m);
    } finally {
      admin.exec("DROP TRIGGER refuse");
      admin.close();
    }
    const retry = await post("evt_503", '{"amount":1}');
    assert.equal(await retry.text(), "stored");
  });

  it("answers GET /healthz with 200", async () => {
    const response = await fetch(new URL("/healthz", receiver.url));
    assert.equal(response.status, 200);
    assert.equal(await response.text(), "ok");
  });
});

describe("receiver.ts settings", { timeout: 30_000 }, () => {
  it("takes its port from PORT and its database from INBOX_DB", async () => {
    const dir = tempDir();
    const path = join(dir.dir, "from-env.db");
    const child = track(spawnScript("receiver.ts", [], { PORT: "0", INBOX_DB: path }));
    const exited = new Promise((resolve) => child.on("close", resolve));
    try {
      const url = await new Promise<string>((resolve) =>
        createInterface({ input: child.stdout! }).on("line", (line) => {
          const match = /^Listening on (http:\/\/127\.0\.0\.1:(\d+))$/.exec(line);
          if (match) resolve(match[1]!);
        }),
      );
      const response = await fetch(url, { method: "POST", headers: { "x-delivery-id": "evt_env" }, body: "{}" });
      assert.equal(await response.text(), "stored");
      assert.deepEqual(
        rows(path).map((r) => r.id),
        ["evt_env"],
      );
    } finally {
      child.kill("SIGTERM");
      await exited;
      dir.cleanup();
    }
  });
});

describe("createReceiver()", { timeout: 30_000 }, () => {
  it("answers 503 with Retry-After while the database is locked by another writer, and stores nothing", async () => {
    const dir = tempDir();
    const path = join(dir.dir, "inbox.db");
    const inbox = new SqliteInbox(path, { busyTimeoutMs: 0 });
    const lines: string[] = [];
    const { server, close } = createReceiver({ inbox, log: (l) => lines.push(l) });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const url = `http://127.0.0.1:${(server.address() as { port: number }).port}/`;
    const other = new DatabaseSync(path);
    try {
      other.exec("BEGIN IMMEDIATE");
      const response = await fetch(url, { method: "POST", headers: { "x-delivery-id": "evt_locked" }, body: "{}" });
      other.exec("ROLLBACK");
      assert.equal(response.status, 503);
      assert.equal(response.headers.get("retry-after"), "5");
      assert.match(lines.join("\n"), /rejected evt_locked: 503 could not store: .*database is locked/);
      assert.deepEqual(rows(path), []);
      // Control: the same request once the lock is gone is stored.
      const retry = await fetch(url, { method: "POST", headers: { "x-delivery-id": "evt_locked" }, body: "{}" });
      assert.equal(retry.status, 200);
      assert.equal(rows(path).length, 1);
    } finally {
      other.close();
      await close(1_000);
      await inbox.close();
      dir.cleanup();
    }
  });

  it("answers 503 with Retry-After past maxInFlight requests whose body is complete, and serves the one it holds", async () => {
    const dir = tempDir();
    const path = join(dir.dir, "inbox.db");
    const inbox = new SqliteInbox(path);
    // The first store waits until released: its request is complete and in flight, waiting on the store.
    let stored!: () => void;
    const storing = new Promise<void>((resolve) => (stored = resolve));
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    const store = inbox.store.bind(inbox);
    inbox.store = async (delivery) => {
      stored();
      await released;
      return store(delivery);
    };
    const { server, close } = createReceiver({ inbox, maxInFlight: 1, log: () => {} });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const port = (server.address() as { port: number }).port;
    let stalled: ReturnType<typeof raw>[] = [];
    try {
      // A sender that has sent only its headers, and one half its body, take no place.
      stalled = [
        raw(port, [
          "POST / HTTP/1.1\r\nHost: x\r\nX-Delivery-Id: evt_headers\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n",
          () => released,
        ]),
        raw(port, [
          "POST / HTTP/1.1\r\nHost: x\r\nX-Delivery-Id: evt_half\r\nContent-Length: 4\r\n\r\n{}",
          () => released,
        ]),
      ];
      const first = fetch(`http://127.0.0.1:${port}/`, {
        method: "POST",
        headers: { "x-delivery-id": "evt_first" },
        body: "{}",
      });
      // Were the stalled ones counted, the first would be answered 503 and never reach its store.
      const reached = await Promise.race([storing.then(() => "its store" as const), first.then((r) => r.status)]);
      assert.equal(reached, "its store", `the first was answered ${reached} before its store`);
      const second = await fetch(`http://127.0.0.1:${port}/`, {
        method: "POST",
        headers: { "x-delivery-id": "evt_second" },
        body: "{}",
      });
      assert.equal(second.status, 503);
      assert.ok(second.headers.get("retry-after"));
      // Its body was read, so its connection may carry the next request.
      assert.notEqual(second.headers.get("connection"), "close");
      release();
      assert.equal(await (await first).text(), "stored");
      assert.deepEqual(
        rows(path).map((r) => r.id),
        ["evt_first"],
      );
    } finally {
      release();
      for (const s of stalled) s.socket.destroy();
      await close(1_000);
      await inbox.close();
      dir.cleanup();
    }
  });

  it("answers 503 once its inbox is closed", async () => {
    const dir = tempDir();
    const inbox = new SqliteInbox(join(dir.dir, "inbox.db"));
    const { server, close } = createReceiver({ inbox, log: () => {} });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    await inbox.close();
    try {
      const port = (server.address() as { port: number }).port;
      const response = await fetch(`http://127.0.0.1:${port}/`, {
        method: "POST",
        headers: { "x-delivery-id": "evt_1" },
        body: "{}",
      });
      assert.equal(response.status, 503);
      assert.ok(response.headers.get("retry-after"));
    } finally {
      await close(1_000);
      dir.cleanup();
    }
  });
});

describe("receiver.ts on SIGTERM or SIGINT", { timeout: 30_000 }, () => {
  it("stops accepting, lets the request in flight finish and be stored, then exits 0", async () => {
    const dir = tempDir();
    const path = join(dir.dir, "inbox.db");
    const receiver = track(await startReceiver(path));
    try {
      const body = '{"customer":"Maria Lopez","amount":24.99}';
      let continued!: () => void;
      const headersRead = new Promise<void>((resolve) => (continued = resolve));
      const sigtermSeen = new Promise<void>((resolve) => {
        const check = () => /SIGTERM: finishing/.test(receiver.log()) && resolve();
        receiver.child.stderr!.on("data", check);
      });
      // Expect: 100-continue makes the server say when it has the headers: the request is then in flight.
      const request = raw(receiver.port, [
        `POST / HTTP/1.1\r\nHost: x\r\nX-Delivery-Id: evt_inflight\r\nExpect: 100-continue\r\nContent-Length: ${body.length}\r\n\r\n`,
        () => headersRead,
        async () => {
          receiver.child.kill("SIGTERM");
          await sigtermSeen;
          // No new connections once it is stopping.
          await assert.rejects(fetch(new URL("/healthz", receiver.url)));
        },
        body,
      ]);
      request.socket.on("data", (d) => d.toString().startsWith("HTTP/1.1 100") && continued());
      const answer = await request.response;
      assert.equal(answer?.status, 200);
      assert.equal(answer?.body, "stored");
      // Kept alive, the connection would hold the exit up until the client let go (5 s, or never).
      assert.equal(answer?.headers.connection, "close");
      assert.equal(await receiver.stop(), 0);
      assert.deepEqual(
        rows(path).map((r) => [r.id, r.body.toString()]),
        [["evt_inflight", body]],
      );
    } finally {
      await receiver.stop("SIGKILL");
      dir.cleanup();
    }
  });

  it("exits 0 on SIGINT too, closing the database", async () => {
    const dir = tempDir();
    const receiver = track(await startReceiver(join(dir.dir, "inbox.db")));
    try {
      assert.equal((await fetch(new URL("/healthz", receiver.url))).status, 200);
      const closed = new Promise((resolve) => receiver.child.on("close", resolve)); // its output read to the end
      assert.equal(await receiver.stop("SIGINT"), 0);
      await closed;
      assert.match(receiver.log(), /SIGINT: finishing the requests in flight/);
    } finally {
      dir.cleanup();
    }
  });
});

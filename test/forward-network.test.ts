// test/forward-network.test.ts: forwarding over the network's harder paths, on both backends: an HTTPS
// destination whose certificate a private CA signed (made here with openssl, for this run only), trusted
// through the destination's "ca" and refused as a TLS failure without it; and the connect timeout, apart
// from the answer's: a destination whose listening socket never accepts (its backlog full, offline) against
// one that accepts and never answers. Needs openssl (Debian's package); without it these are skipped with
// one line, and INBOX_REQUIRE_OPENSSL=1 (as .ci/run sets it) fails the run instead.

import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { createServer as createHttpServer, type IncomingHttpHeaders } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import { connect as connectTcp, type Socket } from "node:net";
import { after, afterEach, before, beforeEach, describe, it } from "node:test";
import { Webhook } from "standardwebhooks";
import { connect } from "../inbox.ts";
import { forward } from "../lib/forwarding/forwarder.ts";
import { loadDestinations, type Forwarding } from "../lib/routing/routes.ts";
import type { Inbox } from "../lib/store.ts";
import { backends, opensslSkip, type Pki, pki, tempDir } from "./helpers.ts";

const T0 = 1_700_000_000_000;
const SECRET = `whsec_${Buffer.from("the app's forwarding secret").toString("base64")}`;

/** Received is one request a destination got. */
interface Received {
  headers: IncomingHttpHeaders;
  body: Buffer;
}

const SKIP = opensslSkip();
const BACKENDS = await backends("fwnet");

for (const backend of BACKENDS) {
  describe(`forwarding over the network on ${backend.name}`, { skip: backend.skip }, () => {
    let files: { dir: string; cleanup: () => void };
    let certs: Pki | undefined;
    let target: string;
    let cleanup: () => Promise<void>;
    let inbox: Inbox;
    let closers: (() => Promise<void> | void)[];

    before(() => {
      files = tempDir();
      if (!SKIP) certs = pki(files.dir);
    });
    after(() => files.cleanup());
    beforeEach(async () => {
      ({ target, cleanup } = await backend.make());
      inbox = await connect(target, { now: () => T0, random: () => 0 });
      closers = [];
    });
    afterEach(async () => {
      for (const close of closers.reverse()) await close();
      await inbox.close();
      await cleanup();
    });

    // https serves with the private CA's certificate on a free port, keeping what it is sent.
    const https = async () => {
      const got: Received[] = [];
      const server = createHttpsServer({ key: certs!.key, cert: certs!.cert }, (req, res) => {
        const chunks: Buffer[] = [];
        req
          .on("data", (c: Buffer) => chunks.push(c))
          .on("end", () => {
            got.push({ headers: req.headers, body: Buffer.concat(chunks) });
            res.writeHead(204).end();
          });
      });
      const handshakes: string[] = [];
      server.on("tlsClientError", (error: Error) => handshakes.push(error.message));
      server.listen(0, "127.0.0.1");
      await once(server, "listening");
      closers.push(
        () =>
          new Promise<void>((resolve) => {
            server.closeAllConnections();
            server.close(() => resolve());
          }),
      );
      return { url: `https://127.0.0.1:${(server.address() as { port: number }).port}/hooks`, got, handshakes };
    };
    const config = (destinations: Record<string, Record<string, unknown>>): Forwarding =>
      loadDestinations({ $destinations: destinations }, {});
    const row = async (destination: string) =>
      (await inbox.query("SELECT status, attempts, error FROM deliveries WHERE destination = ?", destination))[0]!;

    it("forwards over HTTPS to a destination whose certificate a private CA signed, given as its ca", {
      skip: SKIP,
    }, async () => {
      const app = await https();
      const bodies = [Buffer.from('{"type":"invoice.paid","n":1}'), Buffer.from('{"type":"invoice.paid","n":2}')];
      for (const [i, b] of bodies.entries())
        await inbox.store({
          source: "stripe",
          id: `evt_${i}`,
          body: b,
          contentType: "application/json",
          destinations: ["app"],
        });
      const stats = await forward({
        inbox,
        forwarding: config({ app: { url: app.url, secret: SECRET, ca: certs!.caFile } }),
        once: true,
        log: () => {},
      });
      assert.equal(stats.done, 2);
      assert.deepEqual(app.got.map((r) => r.body.toString()).sort(), bodies.map(String));
      for (const r of app.got) new Webhook(SECRET).verify(r.body.toString(), r.headers as Record<string, string>);
      assert.equal((await row("app")).status, "done");
    });

    it("control: without the CA, or with a CA that signed nothing here, the same destination fails as a TLS failure and is sent nothing", {
      skip: SKIP,
    }, async () => {
      const app = await https();
      await inbox.store({ id: "evt_1", body: Buffer.from("{}"), destinations: ["bare", "stranger"] });
      const stats = await forward({
        inbox,
        forwarding: config({
          bare: { url: app.url, secret: SECRET },
          stranger: { url: app.url, secret: SECRET, ca: certs!.otherCaFile },
        }),
        once: true,
        log: () => {},
      });
      assert.equal(stats.done, 0);
      assert.equal(stats.retried, 2);
      for (const name of ["bare", "stranger"]) {
        const r = await row(name);
        assert.deepEqual([r.status, Number(r.attempts)], ["received", 1]);
        assert.match(
          String(r.error),
          new RegExp(`^${name}: TLS: [A-Z_]+: unable to (get local issuer certificate|verify the first certificate)`),
        );
      }
      assert.equal(app.got.length, 0, "no request got past the handshake");
      assert.equal(app.handshakes.length, 2, "the server saw both handshakes fail");
    });

    it("tells a destination that never accepts the connection (connectTimeout) from one that accepts and never answers (timeout)", async () => {
      // Never accepts: a child process listens with a backlog of one and blocks its own event loop, so
      // nothing ever takes a connection off the queue; once the queue is full, the kernel drops new ones.
      const silent: ChildProcess = spawn(
        process.execPath,
        [
          "-e",
          `
        const s = require("node:net").createServer();
        s.listen({ port: 0, host: "127.0.0.1", backlog: 1 }, () => {
          console.log(s.address().port);
          Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0);
        });`,
        ],
        { stdio: ["ignore", "pipe", "inherit"] },
      );
      closers.push(() => void silent.kill("SIGKILL"));
      const [line] = (await once(silent.stdout!, "data")) as [Buffer];
      const port = Number(String(line).trim());
      const fillers: Socket[] = [];
      closers.push(() => fillers.forEach((s) => s.destroy()));
      for (let full = false; !full; ) {
        const socket = connectTcp(port, "127.0.0.1");
        socket.on("error", () => {});
        fillers.push(socket);
        full = await Promise.race([
          once(socket, "connect").then(() => false),
          new Promise<boolean>((resolve) => setTimeout(() => resolve(true), 300)),
        ]);
      }
      // Accepts, reads, never answers.
      const hang = createHttpServer(() => {});
      hang.listen(0, "127.0.0.1");
      await once(hang, "listening");
      closers.push(
        () =>
          new Promise<void>((resolve) => {
            hang.closeAllConnections();
            hang.close(() => resolve());
          }),
      );
      await inbox.store({ id: "evt_1", body: Buffer.from("{}"), destinations: ["silent", "hang"] });
      // The same settings for both; undici checks a connect timeout about twice a second, so the answer's
      // timeout is set well past that.
      const times = { connectTimeout: 0.2, timeout: 2 };
      await forward({
        inbox,
        once: true,
        log: () => {},
        forwarding: config({
          silent: { url: `http://127.0.0.1:${port}/hooks`, secret: SECRET, ...times },
          hang: {
            url: `http://127.0.0.1:${(hang.address() as { port: number }).port}/hooks`,
            secret: SECRET,
            ...times,
          },
        }),
      });
      const s = await row("silent");
      assert.deepEqual([s.status, Number(s.attempts)], ["received", 1]);
      assert.match(String(s.error), /^silent: no connection within 200 ms \(UND_ERR_CONNECT_TIMEOUT\)$/);
      const h = await row("hang");
      assert.deepEqual([h.status, Number(h.attempts)], ["received", 1]);
      assert.match(String(h.error), /^hang did not answer within 2000 ms$/);
    });
  });
}

// test/reach.test.ts: lib/reach.ts, the addresses a destination set through the API may reach. Every
// spelling of an internal address the WHATWG parser knows is refused at apply and named by its range; a real
// forward through undici, to a real server on loopback, is refused on the address it would connect to (a
// literal, a name that resolves there, a name whose answer changes after the check), the server sent nothing,
// and the refusal does not count against the breaker. Each with its control: the same without the rule, or
// with the range allowed, reaches the server.
//   npx node --test test/reach.test.ts

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { httpSender } from "../lib/forwarding/forward.ts";
import { parseAllow, Reach } from "../lib/reach.ts";
import { loadDestinations, type HttpDestination } from "../lib/routing/routes.ts";
import type { Lease } from "../lib/store.ts";
import { destinationServer } from "./helpers.ts";

const SECRET = `whsec_${Buffer.from("reach's secret").toString("base64")}`;

// lease is a delivery as a lane hands it to a sender.
function lease(id: string): Lease {
  return {
    source: "st",
    id,
    body: Buffer.from("{}"),
    bodySha256: "",
    contentType: "application/json",
    eventType: null,
    providerTime: null,
    receivedAt: 0,
    status: "processing",
    attempts: 1,
    availableAt: 0,
    leasedUntil: 1,
    error: null,
    conflicts: 0,
    finishedAt: null,
    replays: 0,
    purgedAt: null,
    orderKey: null,
    eventTime: null,
    newerId: null,
    destination: "app",
    route: 0,
    headers: null,
    traceparent: null,
    origin: "webhook",
    token: "t",
  };
}

// destination loads one HTTP destination at url, held to reach when given.
function destination(url: string, reach?: Reach): HttpDestination {
  const d = loadDestinations({ $destinations: { app: { url, secret: SECRET } } }, {}).destinations.get(
    "app",
  ) as HttpDestination;
  return reach ? { ...d, reach } : d;
}

async function send(d: HttpDestination, id: string) {
  const sender = httpSender(d);
  try {
    return await sender.send(lease(id), { signal: new AbortController().signal, permanent4xx: false });
  } finally {
    await sender.close();
  }
}

describe("Reach.urlRefusal()", () => {
  const reach = new Reach();
  for (const [url, range] of [
    ["http://169.254.169.254/latest/meta-data", "link-local (169.254.0.0/16"],
    ["http://2852039166/", "link-local (169.254.0.0/16"],
    ["http://0251.0376.0251.0376/", "link-local (169.254.0.0/16"],
    ["http://0xa9fea9fe/", "link-local (169.254.0.0/16"],
    ["http://[::ffff:a9fe:a9fe]/", "link-local (169.254.0.0/16"],
    ["http://[::ffff:169.254.169.254]/", "link-local (169.254.0.0/16"],
    ["http://127.1:8000/", "loopback (127.0.0.0/8)"],
    ["http://[::1]/", "loopback (::1/128)"],
    ["http://0.0.0.0/", "this host (0.0.0.0/8)"],
    ["http://10.0.0.1/", "RFC 1918 (10.0.0.0/8)"],
    ["http://172.20.1.1/", "RFC 1918 (172.16.0.0/12)"],
    ["http://192.168.1.1/", "RFC 1918 (192.168.0.0/16)"],
    ["http://100.64.0.1/", "carrier-grade NAT (100.64.0.0/10)"],
    ["http://[fd00:ec2::254]/", "unique-local (fc00::/7)"],
    ["http://[fe80::1]/", "link-local (fe80::/10)"],
    ["http://[::127.0.0.1]/", "IPv4-compatible (::/96)"],
  ] as const) {
    it(`refuses ${url}, naming ${range}`, () => {
      const why = reach.urlRefusal(new URL(url));
      assert.ok(why?.includes(range), `${url}: ${why}`);
    });
  }

  it("lets public addresses and names by (the control)", () => {
    assert.equal(reach.urlRefusal(new URL("http://93.184.216.34/hooks")), undefined);
    assert.equal(reach.urlRefusal(new URL("http://[2606:2800:220:1:248:1893:25c8:1946]/")), undefined);
    assert.equal(reach.urlRefusal(new URL("https://app.example.com/hooks")), undefined, "a name waits for resolve()");
  });

  it("lets the ranges the operator allows by, except the inbox's own ports", () => {
    const allowed = new Reach({ allow: parseAllow("127.0.0.1/32, fd00::/8"), ownPorts: [8000, 8001] });
    assert.equal(allowed.urlRefusal(new URL("http://127.0.0.1:9999/")), undefined);
    assert.equal(allowed.urlRefusal(new URL("http://[::ffff:127.0.0.1]:9999/")), undefined, "its mapped form too");
    assert.equal(allowed.urlRefusal(new URL("http://[fd00::5]:9999/")), undefined);
    assert.match(allowed.urlRefusal(new URL("http://127.0.0.2:9999/"))!, /loopback .*allows 127\.0\.0\.1\/32/);
    assert.match(allowed.urlRefusal(new URL("http://127.0.0.1:8001/"))!, /port 8001 is one of the inbox's own/);
  });

  it("refuses a range that is not one, in one line", () => {
    assert.throws(() => parseAllow("127.0.0.1/33"), /INBOX_API_DESTINATIONS_ALLOW: expected ranges/);
    assert.throws(() => parseAllow("localhost"), /got "localhost"/);
  });
});

describe("a forward held to the rule", () => {
  it("is refused at 127.0.0.1 and sent nothing; without the rule (the control) it is sent", async () => {
    const dest = await destinationServer();
    try {
      const refused = await send(destination(`${dest.url}/x`, new Reach()), "evt_1");
      assert.equal(refused.kind, "failed", "set aside: retrying cannot reach it");
      assert.match((refused as { error: string }).error, /^app: refused: 127\.0\.0\.1 is loopback/);
      assert.equal(dest.got.length, 0);
      assert.equal((await send(destination(`${dest.url}/x`), "evt_2")).kind, "done");
      assert.deepEqual(
        dest.got.map((g) => g.id),
        ["evt_2"],
      );
    } finally {
      dest.server.close();
    }
  });

  it("is sent once the operator allows 127.0.0.1/32", async () => {
    const dest = await destinationServer();
    try {
      const reach = new Reach({ allow: parseAllow("127.0.0.1/32") });
      assert.equal((await send(destination(`${dest.url}/x`, reach), "evt_3")).kind, "done");
      assert.equal(dest.got.length, 1);
    } finally {
      dest.server.close();
    }
  });

  it("refuses a name that resolves to loopback (localhost), on the address it would connect to", async () => {
    const dest = await destinationServer();
    const port = new URL(dest.url).port;
    try {
      const refused = await send(destination(`http://localhost:${port}/x`, new Reach()), "evt_4");
      assert.equal(refused.kind, "failed");
      assert.match((refused as { error: string }).error, /refused: localhost resolves to .* loopback/);
      assert.equal(dest.got.length, 0);
      const allowed = new Reach({ allow: parseAllow("127.0.0.1/32,::1/128") });
      assert.equal((await send(destination(`http://localhost:${port}/x`, allowed), "evt_5")).kind, "done");
    } finally {
      dest.server.close();
    }
  });

  it("catches a name whose answer changes between the check at apply and the connection", async () => {
    const dest = await destinationServer();
    const port = new URL(dest.url).port;
    let asked = 0;
    // A name that answers a public address the first time (apply's check), then loopback (DNS rebinding).
    const resolver = async () => [{ address: asked++ === 0 ? "93.184.216.34" : "127.0.0.1", family: 4 }];
    try {
      const reach = new Reach({ resolver });
      const url = `http://rebind.test:${port}/x`;
      assert.equal(await reach.resolve(new URL(url)), undefined, "at apply it looked public");
      const refused = await send(destination(url, reach), "evt_6");
      assert.match((refused as { error: string }).error, /refused: rebind\.test resolves to 127\.0\.0\.1 is loopback/);
      assert.equal(dest.got.length, 0);
      // The control: with loopback allowed, the same name's answer is where the forward goes: the server.
      const allowed = new Reach({ resolver, allow: parseAllow("127.0.0.1/32") });
      assert.equal((await send(destination(url, allowed), "evt_7")).kind, "done");
      assert.deepEqual(
        dest.got.map((g) => g.id),
        ["evt_7"],
      );
    } finally {
      dest.server.close();
    }
  });
});

// test/sandbox.test.ts: the sandbox (lib/forwarding/sandbox.ts) runs transform code with nothing of the host in
// reach, within a time and a memory limit, its state bounded, under both contracts: the project's
// `export default (delivery) => …` and Hookdeck's `addHandler("transform", …)`. The control runs the same probe
// as an operator's module in a child process (transform.ts's Transformer), where it does reach the host.
//   NODE_COMPILE_CACHE=node_modules/.cache/node-compile npx node --test test/sandbox.test.ts

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { Sandbox } from "../lib/forwarding/sandbox.ts";
import { CodeTransformer, type TransformInput, Transformer, Transforms } from "../lib/forwarding/transform.ts";
import { runScript, tempDir, until } from "./helpers.ts";

const box = new Sandbox();
after(() => box.close());

function delivery(body: unknown, headers: Record<string, string> = {}): TransformInput {
  const text = typeof body === "string" ? body : JSON.stringify(body);
  return {
    id: "d1",
    source: "shop",
    destination: "app",
    eventType: "order.paid",
    attempt: 1,
    contentType: typeof body === "string" ? "text/plain" : "application/json",
    body: new TextEncoder().encode(text),
    json: undefined,
    headers: { "content-type": "application/json", ...headers },
    receivedAt: 1_700_000_000_000,
  };
}
const run = (code: string, input = delivery({ type: "order.paid", id: 7 }), timeoutMs = 1_000) =>
  new CodeTransformer(code, "t", box).run(input, timeoutMs);
const text = (b: Buffer) => b.toString("utf8");

// What the host would give away, each probe's answer a word: "none" when it could not.
const PROBE = `
export default async () => {
  const seen = [];
  try { const fs = await import("node:fs"); seen.push("file:" + fs.readFileSync("/etc/hostname", "utf8").length); } catch { seen.push("file:none"); }
  seen.push("env:" + (typeof process === "object" && process.env ? Object.keys(process.env).length : "none"));
  seen.push("net:" + (typeof fetch === "function" || typeof WebSocket === "function" ? "yes" : "none"));
  try { const cp = await import("node:child_process"); seen.push("spawn:" + typeof cp.spawn); } catch { seen.push("spawn:none"); }
  seen.push("timer:" + (typeof setTimeout === "function" ? "yes" : "none"));
  seen.push("require:" + (typeof require === "function" ? "yes" : "none"));
  return { body: seen.join(" ") };
};
`;

describe("Sandbox", () => {
  it("reaches no file, variable, connection, process or timer", async () => {
    const shaped = await run(PROBE);
    assert.equal(text(shaped!.body), "file:none env:none net:none spawn:none timer:none require:none");
  });

  it("control: the same probe as an operator's module in a child process reaches the host", async () => {
    const { dir, cleanup } = tempDir();
    writeFileSync(join(dir, "probe.mjs"), PROBE);
    const t = new Transformer(join(dir, "probe.mjs"));
    try {
      const got = text((await t.run(delivery({})))!.body);
      assert.match(got, /^file:\d+ env:\d+ net:yes spawn:function timer:yes/);
    } finally {
      await t.close();
      cleanup();
    }
  });

  it("carries only the code's top level from one call to the next, for at most contextCalls calls", async () => {
    const counter = `let n = 0; export default () => ({ body: String(++n) })`;
    const bodies = async (b: Sandbox, code: string, n: number) => {
      const got: string[] = [];
      for (let i = 0; i < n; i++) got.push(text((await new CodeTransformer(code, "t", b).run(delivery({})))!.body));
      return got;
    };
    const three = new Sandbox({ threads: 1, contextCalls: 3 });
    const many = new Sandbox({ threads: 1, contextCalls: 1_000 });
    try {
      assert.deepEqual(await bodies(three, counter, 7), ["1", "2", "3", "1", "2", "3", "1"]);
      // Control: with a larger bound the same counter goes on, so the reset above is the bound's.
      assert.deepEqual(await bodies(many, counter, 7), ["1", "2", "3", "4", "5", "6", "7"]);
    } finally {
      await three.close();
      await many.close();
    }
  });

  it("gives a call that follows one that threw or ran out of time a fresh context", async () => {
    const one = new Sandbox({ threads: 1, contextCalls: 1_000 });
    const code = `let n = 0; export default (d) => {
      n++;
      if (d.json.fail) throw new Error("failed at " + n);
      if (d.json.loop) for (;;) {}
      return { body: String(n) };
    }`;
    const go = (json: unknown) => new CodeTransformer(code, "t", one).run(delivery(json), 300);
    try {
      // Control: two clean calls share the context, so the counter would go on.
      assert.equal(text((await go({}))!.body), "1");
      assert.equal(text((await go({}))!.body), "2");
      await assert.rejects(go({ fail: true }), /threw Error: failed at 3/);
      assert.equal(text((await go({}))!.body), "1");
      assert.equal(text((await go({}))!.body), "2");
      await assert.rejects(go({ loop: true }), /ran past its 300 ms limit/);
      assert.equal(text((await go({}))!.body), "1");
    } finally {
      await one.close();
    }
  });

  it("lets no call change the builtins or the globals the next call sees", async () => {
    const one = new Sandbox({ threads: 1, contextCalls: 1_000 });
    // Hookdeck's scripts are sloppy JavaScript, where a refused assignment is silent; n is the script's own.
    const sloppy = `var n = 0;
addHandler("transform", (request) => {
  n++;
  const seen = n + ":" + typeof [].evil + "," + typeof globalThis.leak + "," + typeof JSON.mine + "," + typeof console.log;
  Array.prototype.evil = 1; globalThis.leak = 1; JSON.mine = 1; console.log = 5;
  request.body = seen;
  return request;
});`;
    // A module is strict, where the same assignment throws, and the call fails (which ends its context).
    const strict = `let n = 0; export default () => { n++; if (n === 1) { Object.prototype.polluted = 1; } return { body: n + ":" + typeof ({}).polluted }; }`;
    try {
      for (const want of ["1:undefined,undefined,undefined,function", "2:undefined,undefined,undefined,function"])
        assert.equal(text((await new CodeTransformer(sloppy, "t", one).run(delivery({})))!.body), want);
      await assert.rejects(new CodeTransformer(strict, "t", one).run(delivery({})), /threw TypeError/);
      // Its own objects can still have what their prototypes hold (an Error's subclass names itself).
      const named = `class Late extends Error { constructor(m) { super(m); this.name = "Late"; } }
export default () => { const o = {}; o.toString = () => "mine"; return { body: new Late("x").name + ":" + String(o) }; }`;
      assert.equal(text((await new CodeTransformer(named, "t", one).run(delivery({})))!.body), "Late:mine");
    } finally {
      await one.close();
    }
  });

  it("stops a loop at its time limit, with a line naming it, while another call goes on", async () => {
    const order: string[] = [];
    const loop = run(`export default () => { for (;;) {} }`, undefined, 1_500).then(
      () => order.push("loop returned"),
      (e: Error) => order.push(`loop: ${e.message}`),
    );
    await run(`export default () => ({ body: "ok" })`).then(() => order.push("other done"));
    await loop;
    assert.deepEqual(order, ["other done", "loop: transform t ran past its 1500 ms limit, so it was stopped"]);
  });

  it("stops a memory bomb at its memory limit, with a line naming it, and the next call runs", async () => {
    const small = new Sandbox({ memoryMb: 32, threads: 1 });
    try {
      for (const bomb of [
        `export default () => { const a = []; for (;;) a.push(new ArrayBuffer(1 << 20)); }`,
        `export default () => { const a = []; for (;;) a.push(new Uint8Array(1 << 20).fill(1)); }`,
      ]) {
        await assert.rejects(
          new CodeTransformer(bomb, "bomb", small).run(delivery({}), 20_000),
          /transform bomb ran out of memory: past its 32 MB limit, so it was stopped/,
        );
      }
      const next = await new CodeTransformer(`export default () => ({ body: "after" })`, "t", small).run(delivery({}));
      assert.equal(text(next!.body), "after");
    } finally {
      await small.close();
    }
  });

  it("says in one line why code cannot be used", async () => {
    assert.match((await box.check("export default (d) => {"))!, /^threw SyntaxError/);
    assert.match((await box.check("const x = 1;"))!, /^defines no transform/);
    assert.match((await box.check(`import fs from "node:fs"; export default () => ({})`))!, /^threw/);
    assert.equal(await box.check(`export default (d) => ({})`), undefined);
    assert.equal(await box.check(`addHandler("transform", (r) => r)`), undefined);
  });

  it("runs the project's contract: bytes, strings and JSON bodies, headers, skip", async () => {
    const json = await run(
      `export default (d) => ({ body: { id: d.id, type: d.json.type }, headers: { "x-app": "1" } })`,
    );
    assert.equal(text(json!.body), '{"id":"d1","type":"order.paid"}');
    assert.equal(json!.contentType, "application/json");
    assert.deepEqual(json!.headers, { "x-app": "1" });
    const bytes = await run(`export default (d) => ({ body: d.body.slice(0, 4) })`);
    assert.equal(text(bytes!.body), '{"ty');
    assert.equal(await run(`export default () => null`), null);
    // d.json is one object for the call, parsed once, as a module's process gives it.
    const once = await run(`export default (d) => { d.json.seen = 1; return { body: String(d.json.seen) }; }`);
    assert.equal(text(once!.body), "1");
    const same = await run(`export default () => ({})`);
    assert.equal(text(same!.body), '{"type":"order.paid","id":7}');
    await assert.rejects(run(`export default () => 5`), /transform t returned number; expected null/);
    await assert.rejects(
      run(`export default () => ({ headers: { host: "x" } })`),
      /transform t returned the header host/,
    );
  });
});

describe("Transforms", () => {
  it("runs a module file in the sandbox, TypeScript's types erased, unless its process is asked for", async () => {
    const { dir, cleanup } = tempDir();
    writeFileSync(
      join(dir, "where.ts"),
      `import type { Transform } from "webhook-inbox/transform";
const where: Transform = (d) => ({ body: typeof process === "undefined" ? "sandbox" : "process", headers: { "x-id": d.id } });
export default where;
`,
    );
    const all = new Transforms(dir);
    try {
      assert.equal(text((await all.get("./where.ts").run(delivery({})))!.body), "sandbox");
      assert.equal(text((await all.get({ module: "./where.ts", process: true }).run(delivery({})))!.body), "process");
    } finally {
      await all.close();
      cleanup();
    }
  });
});

// Two examples from Hookdeck's transformation docs (hookdeck.com/docs/transformations), as they are printed,
// and three more written to Hookdeck's contract for the scenarios those docs list: reshape the body into
// another service's format, drop what a destination does not take, and turn form data into JSON.
describe("Hookdeck's contract", () => {
  it("adds a header (Hookdeck's docs, overview)", async () => {
    const code = `addHandler('transform', (request, context) => {
  request.headers['example-header'] = 'Hello World';
  return request;
});`;
    const shaped = await run(code);
    assert.deepEqual(shaped!.headers, { "example-header": "Hello World" });
    assert.equal(text(shaped!.body), '{"type":"order.paid","id":7}', "the body is sent byte for byte");
  });

  it("copies the event's type to a header (Hookdeck's docs, creating one through the API)", async () => {
    const code = `addHandler("transform", (request, context) => { request.headers["x-event-type"] = request.body.type; return request; });`;
    const shaped = await run(code);
    assert.deepEqual(shaped!.headers, { "x-event-type": "order.paid" });
  });

  it("reshapes the body for another service, a JSON body sent as JSON", async () => {
    const code = `addHandler("transform", (request, context) => {
  request.body = { text: "Order " + request.body.id + " paid", source: context.source };
  return request;
});`;
    const shaped = await run(code);
    assert.equal(text(shaped!.body), '{"text":"Order 7 paid","source":"shop"}');
    assert.equal(shaped!.contentType, "application/json");
  });

  it("drops a delivery a destination does not take: null skips it", async () => {
    const code = `addHandler("transform", (request) => {
  if (request.body.type !== "order.refunded") return null;
  return request;
});`;
    assert.equal(await run(code), null);
  });

  it("turns form data, a raw string body, into JSON", async () => {
    const code = `addHandler("transform", (request) => {
  const fields = {};
  for (const pair of request.body.split("&")) {
    const [k, v] = pair.split("=");
    fields[decodeURIComponent(k)] = decodeURIComponent(v);
  }
  return { ...request, headers: { ...request.headers, "content-type": "application/json" }, body: fields };
});`;
    const shaped = await run(code, delivery("a=1&b=two%20words"));
    assert.equal(text(shaped!.body), '{"a":"1","b":"two words"}');
    assert.equal(shaped!.contentType, "application/json");
  });

  it("refuses a changed path, which this inbox cannot send", async () => {
    await assert.rejects(
      run(`addHandler("transform", (r) => { r.path = "/x"; return r; })`),
      /changed the request's path/,
    );
  });
});

// An operator's module, in its child process (asked for explicitly): the worker's secrets stay out of its
// environment, and what it spawns ends with it, detached or not.
describe("a module transform's process", () => {
  it("gets none of the worker's secrets, only what locates programs", async () => {
    const { dir, cleanup } = tempDir();
    writeFileSync(join(dir, "env.mjs"), `export default () => ({ body: Object.keys(process.env).sort().join(",") });`);
    process.env.SANDBOX_TEST_SECRET = "s3cret";
    const t = new Transformer(join(dir, "env.mjs"));
    try {
      const names = text((await t.run(delivery({})))!.body).split(",");
      assert.ok(!names.includes("SANDBOX_TEST_SECRET"), names.join(","));
      assert.ok(names.includes("PATH"), "the control: the child does see the names it is given");
      assert.ok(
        names.every((n) => ["PATH", "LANG", "LC_ALL", "TZ", "NODE_ENV", "TMPDIR"].includes(n)),
        names.join(","),
      );
    } finally {
      delete process.env.SANDBOX_TEST_SECRET;
      await t.close();
      cleanup();
    }
  });

  it("never runs a file swapped on disk since its version was applied, even when its process starts again", async () => {
    const { dir, cleanup } = tempDir();
    const file = join(dir, "t.mjs");
    const v1 = `export default (d) => { if (d.json.exit) process.exit(3); return { body: "v1" }; };`;
    writeFileSync(file, v1);
    const applied = { "./t.mjs": { sha256: createHash("sha256").update(v1).digest("hex") } };
    const t = new Transformer(file, "./t.mjs", { applied });
    // The control: the same swap under a Transformer given no hash runs the new code.
    const unchecked = new Transformer(file, "./t.mjs");
    const json = (v: unknown) => ({ ...delivery(v), json: v });
    try {
      assert.equal(text((await t.run(json({})))!.body), "v1");
      writeFileSync(file, `export default () => ({ body: "SWAPPED-CODE-NOT-APPLIED" });`);
      await assert.rejects(t.run(json({ exit: true })), /ended its process \(exit code 3\)/);
      await assert.rejects(t.run(json({})), /transform \.\/t\.mjs here \(sha256 [0-9a-f]{12}\) is not the one applied/);
      assert.equal(text((await unchecked.run(json({})))!.body), "SWAPPED-CODE-NOT-APPLIED");
    } finally {
      await t.close();
      await unchecked.close();
      cleanup();
    }
  });

  it("ends what it spawned, detached included, when it is stopped at its time limit", async () => {
    const { dir, cleanup } = tempDir();
    const pids = join(dir, "pids");
    writeFileSync(
      join(dir, "spawn.mjs"),
      `import { spawn } from "node:child_process";
import { writeFileSync } from "node:fs";
export default () => {
  const a = spawn("sleep", ["600"], { detached: true, stdio: "ignore" });
  const b = spawn("sleep", ["600"], { stdio: "ignore" });
  writeFileSync(${JSON.stringify(pids)}, a.pid + " " + b.pid);
  for (;;) {}
};`,
    );
    const t = new Transformer(join(dir, "spawn.mjs"));
    try {
      const ran = t.run(delivery({}), 3_000);
      await until("the transform spawned its two", () => existsSync(pids));
      const spawned = readFileSync(pids, "utf8").split(" ").map(Number);
      const alive = (pid: number) => {
        try {
          process.kill(pid, 0);
          return true;
        } catch {
          return false;
        }
      };
      assert.deepEqual(spawned.map(alive), [true, true], "the control: both run while the transform does");
      await assert.rejects(ran, /ran past its 3000 ms limit, so its process was stopped/);
      await until("both are gone", () => spawned.every((p) => !alive(p) || zombie(p)));
    } finally {
      await t.close();
      cleanup();
    }
  });
});

// zombie says whether a process has ended and waits for its parent to read it: it runs nothing any more.
function zombie(pid: number): boolean {
  try {
    return /^\d+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, "latin1"));
  } catch {
    return true;
  }
}

// Code in the configuration, through the CLI on a real SQLite file: applied, checked, dumped back unchanged.
describe("config apply and dump with transforms as code", () => {
  it("store the code in the version, hashed; dump gives it back and apply takes the dump unchanged; bad code or a path outside the folder is refused whole", async () => {
    const { dir, cleanup } = tempDir();
    const db = join(dir, "inbox.db");
    const cli = (...args: string[]) => runScript("inbox.ts", [...args, "--db", db]);
    const doc = (transform: unknown) =>
      `${JSON.stringify({
        $destinations: { app: { url: "http://127.0.0.1:9/x", secret: "env:APP_SECRET", transform } },
        shop: { provider: "plain", routes: [{ to: "app", transform: { code: `addHandler("transform", (r) => r);` } }] },
      })}\n`;
    try {
      assert.equal((await cli("init")).code, 0);
      const file = join(dir, "sources.json");
      writeFileSync(file, doc({ code: "export default (d) => ({ body: { id: d.id } });" }));
      const applied = await runScript("inbox.ts", ["config", "apply", file, "--db", db], { APP_SECRET: "whsec_eA==" });
      assert.equal(applied.code, 0, applied.stderr);
      assert.match(applied.stdout, /\+ transform code:[0-9a-f]{12} \(sha256 [0-9a-f]{12}\)/);
      const dumped = await cli("config", "dump");
      assert.equal(dumped.stdout, readFileSync(file, "utf8"), "dump gives back the document as applied");
      writeFileSync(join(dir, "dumped.json"), dumped.stdout);
      const again = await runScript("inbox.ts", ["config", "apply", join(dir, "dumped.json"), "--db", db], {
        APP_SECRET: "whsec_eA==",
      });
      assert.equal(again.code, 0, again.stderr);
      assert.match(again.stdout, /No change from version 1/);
      for (const [transform, why] of [
        [{ code: "export default (d) => {" }, /destination "app": transform code:[0-9a-f]{12} threw SyntaxError/],
        [{ code: "const x = 1;" }, /transform code:[0-9a-f]{12} defines no transform/],
        ["/etc/hostname.mjs", /transform \/etc\/hostname\.mjs is outside the configuration's folder/],
      ] as const) {
        writeFileSync(file, doc(transform));
        const refused = await runScript("inbox.ts", ["config", "apply", file, "--db", db], {
          APP_SECRET: "whsec_eA==",
        });
        assert.equal(refused.code, 2, refused.stdout);
        assert.match(refused.stderr, why);
        assert.equal(refused.stderr.trim().split("\n").length, 1, refused.stderr);
      }
      assert.equal((await cli("config", "dump")).stdout, dumped.stdout, "nothing changed");
    } finally {
      cleanup();
    }
  });
});

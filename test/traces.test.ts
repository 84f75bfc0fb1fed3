// test/traces.test.ts: each delivery's trace (traces.ts), with the SDK's in-memory exporter, on SQLite and on
// PostgreSQL: the receiver's span honours an incoming traceparent and is stored with the delivery; the worker's
// span per attempt continues it, in this process and across real receiver and worker processes; no span holds a
// body or a secret. First, with no SDK registered, nothing is traced and nothing is stored.
//   npx node --import tsx --test test/traces.test.ts

import assert from "node:assert/strict";
import { createHmac } from "node:crypto";
import { once } from "node:events";
import { createServer } from "node:http";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { SpanKind, SpanStatusCode, trace } from "@opentelemetry/api";
import type { InMemorySpanExporter } from "@opentelemetry/sdk-trace";
import { exportLine, importLine } from "../lib/format.ts";
import { createWebhooks, type WebhookRequest } from "../lib/receiver.ts";
import { connect } from "../inbox.ts";
import { loadSources } from "../lib/config/sources.ts";
import { PermanentError, type Inbox } from "../lib/store.ts";
import { forward } from "../lib/forwarding/forwarder.ts";
import { loadDestinations } from "../lib/routing/routes.ts";
import { run, type Job } from "../worker.ts";
import { installSdk, spanJson, type SpanJson } from "./fixtures/otel.ts";
import { backends, ROOT, runScript, startReceiver } from "./helpers.ts";

const SECRET = "whsec_trace_test_5e2d1c0b9a8f7e6d5c4b3a29";
const FORWARD_SECRET = `whsec_${Buffer.from("the app's forwarding secret").toString("base64")}`;
const SENDER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736";
const SENDER_SPAN = "00f067aa0ba902b7";
const SENDER = `00-${SENDER_TRACE}-${SENDER_SPAN}-01`;
const W3C = /^00-([0-9a-f]{32})-([0-9a-f]{16})-0[01]$/;
const quiet = () => {};

// stripeRequest is a signed Stripe delivery; its body carries a marker that no span may repeat.
function stripeRequest(id: string, traceparent?: string): { headers: Record<string, string>; body: string } {
  const body = JSON.stringify({ id, type: "charge.succeeded", customer: "cus_BODY_MARKER_7731", amount: 42 });
  const t = Math.floor(Date.now() / 1000);
  const signature = `t=${t},v1=${createHmac("sha256", SECRET).update(`${t}.${body}`).digest("hex")}`;
  return {
    headers: {
      "content-type": "application/json",
      "stripe-signature": signature,
      ...(traceparent ? { traceparent } : {}),
    },
    body,
  };
}

function request(r: { headers: Record<string, string>; body: string }): WebhookRequest {
  return {
    method: "POST",
    url: "/stripe",
    headers: Object.fromEntries(Object.entries(r.headers).map(([k, v]) => [k, [v]])),
    read: async () => Buffer.from(r.body),
  };
}

const sources = loadSources({ stripe: { provider: "stripe", secret: SECRET } }, {});

// Nothing of the body, the signature or the secret on any span, in any attribute, status or event.
function assertClean(spans: readonly SpanJson[], r: { headers: Record<string, string> }): void {
  const text = JSON.stringify(spans);
  for (const secret of [SECRET, FORWARD_SECRET, "cus_BODY_MARKER_7731", r.headers["stripe-signature"]!, "v1="])
    assert.ok(!text.includes(secret), `no span holds ${secret}`);
}

const all = await backends("traces");

describe("with no SDK registered", () => {
  for (const backend of all) {
    it(`stores no trace context and hands the handler none, but passes a stored one through (${backend.name})`, {
      skip: backend.skip,
    }, async () => {
      const { target, cleanup } = await backend.make();
      const inbox = await connect(target);
      try {
        const handler = createWebhooks({ inbox, sources, log: quiet });
        assert.equal((await handler.answer(request(stripeRequest("evt_untraced", SENDER)))).status, 200);
        assert.equal((await inbox.find("evt_untraced"))[0]!.traceparent, null, "an untraced receiver stores nothing");
        await inbox.store({ source: "stripe", id: "evt_stored", body: Buffer.from("{}"), traceparent: SENDER });
        const seen = new Map<string, string | undefined>();
        await run((job) => void seen.set(job.delivery.id, job.traceparent), { inbox, once: true, log: quiet });
        assert.deepEqual(Object.fromEntries(seen), { evt_untraced: undefined, evt_stored: SENDER });
      } finally {
        await inbox.close();
        await cleanup();
      }
    });
  }
});

describe("with an SDK registered", () => {
  let exporter: InMemorySpanExporter;
  before(() => {
    exporter = installSdk();
  });
  const finished = () => exporter.getFinishedSpans().map(spanJson);

  for (const backend of all) {
    describe(`on ${backend.name}`, { skip: backend.skip }, () => {
      let inbox: Inbox;
      let cleanup: () => Promise<void>;
      before(async () => {
        const made = await backend.make();
        cleanup = made.cleanup;
        // Retries due at once, so that one drain sees a failed attempt and the next.
        inbox = await connect(made.target, { retryDelayMs: 0 });
      });
      after(async () => {
        await inbox.close();
        await cleanup();
      });

      it("opens a span per request, a child of the sender's traceparent, and stores its own with the delivery", async () => {
        exporter.reset();
        const r = stripeRequest("evt_a", SENDER);
        assert.equal((await createWebhooks({ inbox, sources, log: quiet }).answer(request(r))).status, 200);
        const [span] = finished();
        assert.deepEqual(
          [span!.name, span!.kind, span!.traceId, span!.parentSpanId],
          ["receive stripe", SpanKind.SERVER, SENDER_TRACE, SENDER_SPAN],
        );
        assert.deepEqual(span!.attributes, {
          "http.response.status_code": 200,
          "inbox.source": "stripe",
          "inbox.delivery.id": "evt_a",
          "inbox.result": "stored",
        });
        assert.equal((await inbox.find("evt_a"))[0]!.traceparent, `00-${SENDER_TRACE}-${span!.spanId}-01`);
        assertClean(finished(), r);
      });

      it("starts a new trace for a request with no traceparent, and marks a refused one without storing it", async () => {
        exporter.reset();
        const handler = createWebhooks({ inbox, sources, log: quiet });
        await handler.answer(request(stripeRequest("evt_b")));
        const forged = stripeRequest("evt_forged", SENDER);
        forged.headers["stripe-signature"] = forged.headers["stripe-signature"]!.replace(
          /v1=\w+/,
          `v1=${"0".repeat(64)}`,
        );
        assert.equal((await handler.answer(request(forged))).status, 401);
        const [fresh, refused] = finished();
        assert.equal(fresh!.parentSpanId, null);
        assert.equal((await inbox.find("evt_b"))[0]!.traceparent, `00-${fresh!.traceId}-${fresh!.spanId}-01`);
        assert.deepEqual(refused!.attributes, { "http.response.status_code": 401, "inbox.source": "stripe" });
        assert.equal(refused!.status.code, SpanStatusCode.UNSET, "a 4xx is the sender's mistake, not the server's");
        assert.deepEqual(await inbox.find("evt_forged"), []);
        assertClean(finished(), forged);
      });

      it("continues the trace in a span per attempt, ending at retry, done or failed, and hands the handler its traceparent", async () => {
        exporter.reset();
        const handler = createWebhooks({ inbox, sources, log: quiet });
        const r = stripeRequest("evt_c", SENDER);
        await handler.answer(request(r));
        await handler.answer(request(stripeRequest("evt_d", SENDER)));
        const receive = Object.fromEntries(finished().map((s) => [s.attributes["inbox.delivery.id"], s]));
        exporter.reset();
        const handed: Record<string, string[]> = {};
        const tracer = trace.getTracer("the app's handler");
        const work = (job: Job) => {
          (handed[job.delivery.id] ??= []).push(job.traceparent!);
          // A span the handler opens itself is the attempt's child, through the active context.
          tracer.startSpan("forward").end();
          if (job.delivery.id === "evt_d") throw new PermanentError("the destination said 422");
          if (job.delivery.attempts === 1) throw new Error("the destination timed out");
        };
        await run(work, { inbox, once: true, log: quiet });
        const spans = finished();
        const attempts = spans.filter((s) => s.kind === SpanKind.CONSUMER);
        const c = attempts.filter((s) => s.attributes["inbox.delivery.id"] === "evt_c");
        const d = attempts.filter((s) => s.attributes["inbox.delivery.id"] === "evt_d");
        assert.deepEqual(
          c.map((s) => [s.name, s.attributes["inbox.attempt"], s.attributes["inbox.outcome"], s.status.code]),
          [
            ["process stripe", 1, "retry", SpanStatusCode.ERROR],
            ["process stripe", 2, "done", SpanStatusCode.UNSET],
          ],
        );
        assert.equal(c[0]!.status.message, "the destination timed out");
        assert.deepEqual(
          d.map((s) => [s.attributes["inbox.outcome"], s.status.code, s.status.message]),
          [["failed", SpanStatusCode.ERROR, "the destination said 422"]],
        );
        for (const s of [...c, ...d]) {
          const parent = receive[s.attributes["inbox.delivery.id"] as string]!;
          assert.deepEqual(
            [s.traceId, s.parentSpanId],
            [SENDER_TRACE, parent.spanId],
            "each attempt is a child of the span that received it",
          );
        }
        assert.deepEqual(
          handed.evt_c,
          c.map((s) => `00-${s.traceId}-${s.spanId}-01`),
          "job.traceparent is the attempt's own span",
        );
        const forwards = spans.filter((s) => s.name === "forward");
        for (const s of [...c, ...d])
          assert.equal(
            forwards.filter((f) => f.parentSpanId === s.spanId).length,
            1,
            "the handler's span is the attempt's child",
          );
        assert.equal(forwards.length, attempts.length, "(the drain also ran the earlier tests' deliveries)");
        assertClean(spans, r);
      });

      it("continues the trace in each forward to a destination, which gets that try's traceparent", async () => {
        exporter.reset();
        const seen: string[] = [];
        // A real destination on a free port: the first try fails (503), the second is taken.
        const app = createServer((req, res) => {
          seen.push(String(req.headers.traceparent));
          req.resume();
          req.on("end", () => {
            res.writeHead(seen.length === 1 ? 503 : 200);
            res.end();
          });
        });
        app.listen(0, "127.0.0.1");
        await once(app, "listening");
        try {
          const url = `http://127.0.0.1:${(app.address() as { port: number }).port}/hooks`;
          const config = {
            $destinations: { app: { url, secret: FORWARD_SECRET, breaker: false } },
            stripe: { provider: "stripe", secret: SECRET, routes: ["app"] },
          };
          const r = stripeRequest("evt_f", SENDER);
          assert.equal(
            (await createWebhooks({ inbox, sources: loadSources(config, {}), log: quiet }).answer(request(r))).status,
            200,
          );
          const [receive] = finished();
          await forward({ inbox, forwarding: loadDestinations(config, {}), once: true, log: quiet });
          const tries = finished().filter((x) => x.attributes["inbox.destination"] === "app");
          assert.deepEqual(
            tries.map((x) => [x.name, x.attributes["inbox.attempt"], x.attributes["inbox.outcome"]]),
            [
              ["process stripe", 1, "retry"],
              ["process stripe", 2, "done"],
            ],
          );
          for (const x of tries)
            assert.deepEqual(
              [x.traceId, x.parentSpanId],
              [SENDER_TRACE, receive!.spanId],
              "each try is a child of the span that received it",
            );
          assert.deepEqual(
            seen,
            tries.map((x) => `00-${x.traceId}-${x.spanId}-01`),
            "the destination joins the trace under each try",
          );
          assertClean(finished(), r);
        } finally {
          app.closeAllConnections();
          await new Promise((resolve) => app.close(resolve));
        }
      });

      it("keeps the trace context through page() and restore() and through export and import", async () => {
        await inbox.store({ source: "stripe", id: "evt_moved", body: Buffer.from("{}"), traceparent: SENDER });
        const moved = (await inbox.page(undefined, 1000)).find((d) => d.id === "evt_moved")!;
        assert.equal(moved.traceparent, SENDER);
        assert.equal(importLine(JSON.parse(JSON.stringify(exportLine(moved)))).traceparent, SENDER);
        const { traceparent, ...before } = exportLine(moved);
        assert.equal(
          importLine(JSON.parse(JSON.stringify(before))).traceparent,
          null,
          "an export from before traces imports as untraced",
        );
        const dir = mkdtempSync(join(tmpdir(), "inbox-traces-"));
        const other = await connect(join(dir, "copy.db"));
        try {
          assert.equal(await other.restore([moved]), 1);
          assert.equal((await other.find("evt_moved"))[0]!.traceparent, SENDER);
        } finally {
          await other.close();
          rmSync(dir, { recursive: true, force: true });
        }
        assert.equal(typeof traceparent, "string");
      });
    });
  }
});

describe("across real receiver and worker processes, each with its SDK", () => {
  for (const backend of all) {
    it(`parents the worker's span on the receiver's through the stored context (${backend.name})`, {
      skip: backend.skip,
    }, async () => {
      const dir = mkdtempSync(join(tmpdir(), "inbox-traces-"));
      const { target, cleanup } = await backend.make();
      try {
        writeFileSync(
          join(dir, "sources.json"),
          // Routes that name the handler: the worker runs this configuration from the database, with the
          // article's example named (a configuration that routes to the handler needs one named).
          JSON.stringify({ stripe: { provider: "stripe", secret: "env:STRIPE_SECRET", routes: ["handler"] } }),
        );
        // An app registers its SDK the same way: a module preloaded before the script.
        const traced = (file: string) => ({
          STRIPE_SECRET: SECRET,
          INBOX_TEST_SPANS: join(dir, file),
          NODE_OPTIONS: `--import=${join(ROOT, "test/fixtures/otel.ts")}`,
        });
        const receiver = await startReceiver(target, ["--sources", join(dir, "sources.json")], traced("receiver.json"));
        const r = stripeRequest("evt_x", SENDER);
        const answer = await fetch(`${receiver.url}/stripe`, { method: "POST", headers: r.headers, body: r.body });
        assert.equal(answer.status, 200, await answer.text());
        assert.equal(await receiver.stop(), 0);
        const worker = await runScript(
          "worker.ts",
          ["--once", "--db", target, "--handler", "demo"],
          traced("worker.json"),
        );
        assert.equal(worker.code, 0, worker.stderr);
        const received = JSON.parse(readFileSync(join(dir, "receiver.json"), "utf8")) as SpanJson[];
        const processed = JSON.parse(readFileSync(join(dir, "worker.json"), "utf8")) as SpanJson[];
        const receive = received.find((s) => s.name === "receive stripe")!;
        const [attempt] = processed.filter((s) => s.name === "process stripe");
        assert.deepEqual(
          [receive.traceId, receive.parentSpanId],
          [SENDER_TRACE, SENDER_SPAN],
          "the receiver honours the sender's traceparent",
        );
        assert.deepEqual(
          [attempt!.traceId, attempt!.parentSpanId],
          [SENDER_TRACE, receive.spanId],
          "the worker continues the receiver's span",
        );
        assert.equal(attempt!.attributes["inbox.outcome"], "done");
        const shown = await runScript("inbox.ts", ["show", "evt_x", "--db", target]);
        assert.match(
          shown.stdout,
          new RegExp(`^traceparent\\s+00-${SENDER_TRACE}-${receive.spanId}-01$`, "m"),
          "show prints the trace to look up",
        );
        assert.match(receive.spanId, /^[0-9a-f]{16}$/);
        assert.match(`00-${attempt!.traceId}-${attempt!.spanId}-01`, W3C);
        assertClean([...received, ...processed], r);
      } finally {
        await cleanup();
        rmSync(dir, { recursive: true, force: true });
      }
    });
  }
});

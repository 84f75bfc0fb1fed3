// traces.ts: each delivery's trace, through OpenTelemetry's API alone (@opentelemetry/api). The receiver
// (handler.ts) opens a span per request and stores its traceparent with the delivery; the worker (worker.ts)
// continues that trace in a span per attempt, and hands the handler a traceparent to send on. With no SDK
// registered every call here is a no-op; docs/traces.md shows how to register one. Not run on its own.

import {
  context,
  isSpanContextValid,
  propagation,
  ROOT_CONTEXT,
  SpanKind,
  SpanStatusCode,
  trace,
  type Context,
  type TextMapGetter,
} from "@opentelemetry/api";
import type { Headers } from "./store.ts";

// A ProxyTracer: it finds the SDK's tracer once one is registered, whenever that happens.
const tracer = trace.getTracer("webhook-inbox");

// Request headers as node:http's headersDistinct gives them, names in lower case, repeats kept apart.
const headerGetter: TextMapGetter<Headers> = {
  get: (carrier, key) => carrier[key],
  keys: (carrier) => Object.keys(carrier),
};

// traceparentOf writes a context's span as the registered propagator does (W3C Trace Context by default),
// keeping only the traceparent: that is what a delivery stores and a forward carries.
function traceparentOf(ctx: Context): string | null {
  const carrier: Record<string, string> = {};
  propagation.inject(ctx, carrier);
  return carrier.traceparent ?? null;
}

/** Receive is one request's span in the receiver, from its first byte to its answer. */
export interface Receive {
  /** The traceparent to store with the delivery, or null when nothing traces this request. */
  readonly traceparent: string | null;
  /** run calls fn with the span active, so that spans of instrumented libraries under it are its children. */
  run<T>(fn: () => T): T;
  /**
   * end closes the span with what the receiver answered. Only names go on it: the source, the delivery's
   * ID and what store() said; never the body, a header's value or a secret.
   */
  end(answer: { status: number; source?: string; id?: string; result?: string }): void;
}

/**
 * startReceive opens the span of one request. Its parent is the app's own HTTP server span where one is
 * active (auto-instrumentation), else the sender's traceparent header where it sends one.
 */
export function startReceive(headers: Headers): Receive {
  const active = context.active();
  const parent = trace.getSpan(active) ? active : propagation.extract(active, headers, headerGetter);
  const span = tracer.startSpan("receive", { kind: SpanKind.SERVER }, parent);
  // No SDK and no context to carry: no context to make, nothing to close (bench/traces.ts times this path).
  if (!span.isRecording() && !isSpanContextValid(span.spanContext())) return UNTRACED;
  const ctx = trace.setSpan(parent, span);
  const traceparent = isSpanContextValid(span.spanContext()) ? traceparentOf(ctx) : null;
  return {
    traceparent,
    run: (fn) => context.with(ctx, fn),
    end: ({ status, source, id, result }) => {
      if (!span.isRecording()) return span.end();
      // Low-cardinality names, as the semantic conventions ask: the source is configured, the ID is not.
      if (source !== undefined) span.updateName(`receive ${source}`);
      span.setAttributes({
        "http.response.status_code": status,
        ...(source === undefined ? {} : { "inbox.source": source }),
        ...(id === undefined ? {} : { "inbox.delivery.id": id }),
        ...(result === undefined ? {} : { "inbox.result": result }),
      });
      // A server span fails on 5xx only; a 4xx is the sender's mistake, answered as it should be.
      if (status >= 500) span.setStatus({ code: SpanStatusCode.ERROR, message: `answered ${status}` });
      span.end();
    },
  };
}

// UNTRACED stands for the span of a request that nothing traces.
const UNTRACED: Receive = { traceparent: null, run: (fn) => fn(), end: () => {} };

/** Ending is how one attempt at a delivery ended in the worker, as its span records it. */
export type Ending = "done" | "retry" | "failed" | "lost" | "released";

/** Process is one attempt's span in the worker, a child of the span that received the delivery. */
export interface Process {
  /**
   * The traceparent a handler sends on to its destination: this span's, else (no SDK in the worker) the
   * stored one passed through, so the destination still joins the sender's trace; undefined if neither.
   */
  readonly traceparent: string | undefined;
  /** run calls fn with the span active, so that a handler's instrumented calls are its children. */
  run<T>(fn: () => T): T;
  /** end closes the span when the attempt's outcome is committed (done, retry, failed) or known (lost, released). */
  end(outcome: Ending, error?: string): void;
}

/**
 * startProcess opens the span of one attempt, continuing the trace whose traceparent the delivery stored:
 * the handler's in worker.ts, or a forward's to a destination in forwarder.ts (named in inbox.destination).
 */
export function startProcess(
  d: { source: string; id: string; eventType: string | null; attempts: number; traceparent: string | null },
  destination?: string,
): Process {
  const parent =
    d.traceparent === null ? ROOT_CONTEXT : propagation.extract(ROOT_CONTEXT, { traceparent: d.traceparent });
  const span = tracer.startSpan(`process ${d.source}`, { kind: SpanKind.CONSUMER }, parent);
  if (!span.isRecording() && !isSpanContextValid(span.spanContext()))
    return { traceparent: d.traceparent ?? undefined, run: (fn) => fn(), end: () => {} };
  const ctx = trace.setSpan(parent, span);
  const own = isSpanContextValid(span.spanContext()) ? traceparentOf(ctx) : null;
  if (span.isRecording()) {
    span.setAttributes({
      "inbox.source": d.source,
      "inbox.delivery.id": d.id,
      ...(d.eventType === null ? {} : { "inbox.event_type": d.eventType }),
      "inbox.attempt": d.attempts,
      ...(destination === undefined ? {} : { "inbox.destination": destination }),
    });
  }
  let ended = false;
  return {
    traceparent: own ?? d.traceparent ?? undefined,
    run: (fn) => context.with(ctx, fn),
    end: (outcome, error) => {
      // The first outcome known is the one: a later "lost" from a clean-up changes nothing.
      if (ended) return;
      ended = true;
      if (!span.isRecording()) return span.end();
      span.setAttribute("inbox.outcome", outcome);
      // The handler's own words, as the worker logs them; the worker never puts the body in an error.
      if (outcome === "retry" || outcome === "failed")
        span.setStatus({ code: SpanStatusCode.ERROR, ...(error === undefined ? {} : { message: error }) });
      span.end();
    },
  };
}

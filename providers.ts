// providers.ts: how each sender signs its webhooks and where it puts the delivery ID. The receiver calls
// verify() on the raw bytes before anything is stored. Not run on its own; see receiver.ts --sources.

import { createHmac, timingSafeEqual } from "node:crypto";
import { DEFAULTS } from "./inbox.ts";

/** Provider names a signature scheme the receiver can check. */
export type Provider = "plain";
export const PROVIDERS: readonly Provider[] = ["plain"];

/** Source is one configured sender: its name (the URL path), its scheme and its secrets. */
export interface Source {
  name: string;
  provider: Provider;
  /** Any one of these verifies, which is how secrets are rotated. Empty means unsigned. */
  secrets: Buffer[];
  /** Seconds a signed timestamp may be off, for schemes that sign one. */
  toleranceS: number;
}

/** Headers are a request's headers with repeats kept apart, as node:http's headersDistinct gives them. */
export type Headers = Record<string, string[] | undefined>;

/** Verdict is verify()'s answer: a delivery to store, a reply to send instead, or a rejection. */
export type Verdict =
  | { kind: "delivery"; id: string; eventType: string | null; providerTime: number | null }
  | { kind: "reply"; status: number; contentType: string; body: string }
  | { kind: "reject"; status: 400 | 401; reason: string };

/** unsignedSource is the article's sender: one source, `default`, at `/`, reading X-Delivery-Id. */
export function unsignedSource(): Source {
  return { name: DEFAULTS.source, provider: "plain", secrets: [], toleranceS: 0 };
}

// one returns a header that must appear at most once; a repeat is how smuggled or confused requests look.
function one(headers: Headers, name: string): string | undefined | null {
  const values = headers[name];
  if (values === undefined) return undefined;
  return values.length === 1 ? values[0]! : null;
}

/** safeEqual compares two byte strings in constant time, checking the lengths first. */
export function safeEqual(a: Buffer, b: Buffer): boolean {
  return a.length === b.length && timingSafeEqual(a, b);
}

/** verify checks a request's signature on the raw body and finds its delivery ID. */
export function verify(source: Source, headers: Headers, body: Buffer, _nowMs: number): Verdict {
  switch (source.provider) {
    case "plain": {
      const id = one(headers, "x-delivery-id");
      if (id === null) return { kind: "reject", status: 400, reason: "X-Delivery-Id sent more than once" };
      if (source.secrets.length > 0) {
        const signature = one(headers, "x-signature");
        if (signature === null) return { kind: "reject", status: 401, reason: "X-Signature sent more than once" };
        if (!signature) return { kind: "reject", status: 401, reason: "missing X-Signature" };
        const match = /^sha256=([0-9a-f]{64})$/i.exec(signature);
        if (!match) return { kind: "reject", status: 401, reason: "X-Signature is not sha256=<hex>" };
        const given = Buffer.from(match[1]!, "hex");
        const ok = source.secrets.some((secret) => safeEqual(createHmac("sha256", secret).update(body).digest(), given));
        if (!ok) return { kind: "reject", status: 401, reason: "signature does not match" };
      }
      if (!id) return { kind: "reject", status: 400, reason: "missing delivery id" };
      return { kind: "delivery", id, eventType: null, providerTime: null };
    }
  }
}

// lib/admin/session.ts: who may look at the operator page and who may act. The page's token, or an API key, is
// exchanged at /login for an HttpOnly, SameSite=Strict cookie; each session has its scope (the token's is admin,
// a key's its own), its CSRF token and its one-time messages; without a token there is one implicit session,
// and only loopback may reach it.

import { createHash, createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import type { IncomingMessage } from "node:http";
import { isIP } from "node:net";
import type { ApiKey, Scope } from "../store.ts";

/** COOKIE is the name of the session's cookie. */
export const COOKIE = "inbox_admin";
/** SESSION_MS is how long a session lasts after login: a working day. */
export const SESSION_MS = 12 * 3_600_000;
// A bound on what a flood of logins can make the page remember; the oldest goes first.
const MAX_SESSIONS = 1_000;

/**
 * Session is one person's login: its id (the cookie), its CSRF token, the name the audit lines give it, and
 * what it may do: the page's token (and the implicit session of a page without one) acts as admin; an API
 * key's session as that key's scope, for as long as the key is not revoked (key, its SHA-256, is checked at
 * each request).
 */
export interface Session {
  id: string;
  csrf: string;
  who: string;
  expires: number;
  scope: Scope;
  /** The SHA-256 of the API key it logged in with, when it did. */
  key?: string;
}

/** Flash is a message shown once after an action, and a value shown with it that once alone (a new API key). */
export interface Flash {
  text: string;
  once?: string;
}

/** callerOf is who a session acts as, for the API's operations and the audit log: `page:session:Ab12Cd@10.0.0.7`. */
export function callerOf(s: Session): { who: string; scope: Scope } {
  return { who: `page:${s.who}`, scope: s.scope };
}

/** isLoopback tells whether an address (or host name) stays on this machine. */
export function isLoopback(host: string): boolean {
  const bare = host.replace(/^\[|\]$/g, "");
  if (bare === "localhost") return true;
  if (isIP(bare) === 4) return bare.startsWith("127.");
  return bare === "::1" || bare.toLowerCase() === "::ffff:127.0.0.1";
}

function digest(text: string): Buffer {
  return createHash("sha256").update(text).digest();
}

function cookies(req: IncomingMessage): Map<string, string> {
  const jar = new Map<string, string>();
  for (const part of (req.headers.cookie ?? "").split(";")) {
    const eq = part.indexOf("=");
    if (eq > 0) jar.set(part.slice(0, eq).trim(), part.slice(eq + 1).trim());
  }
  return jar;
}

/**
 * Sessions keeps the page's logins in memory, with the messages shown once after an action: a restart logs
 * everyone out, which is the safe way round for a page that acts on the queue.
 */
export class Sessions {
  /** guarded is true when a token guards the page; without one it trusts loopback alone. */
  readonly guarded: boolean;
  private readonly tokenDigest: Buffer | undefined;
  private readonly secret = randomBytes(32);
  private readonly now: () => number;
  private readonly live = new Map<string, Session>();
  // The messages this page issued after an action, by a random key in the redirect's ?flash=: a link can
  // only name one, never bring its own words, and each is shown once, to the session it was made for.
  private readonly flashes = new Map<string, { session: string; flash: Flash }>();
  // Without a token there is one implicit session, for whoever reaches loopback.
  private readonly local: Session;

  constructor(token: string | undefined, now: () => number) {
    this.tokenDigest = token ? digest(token) : undefined;
    this.guarded = this.tokenDigest !== undefined;
    this.now = now;
    this.local = { id: "local", csrf: this.csrfFor("local"), who: "local", expires: Infinity, scope: "admin" };
  }

  /** trusts tells whether a request may be answered at all: without a token, a Host that is not loopback means DNS rebinding. */
  trusts(req: IncomingMessage): boolean {
    return this.guarded || isLoopback((req.headers.host ?? "").replace(/:\d+$/, ""));
  }

  /** of finds the request's session: the implicit one, a bearer token's, or a live cookie's; undefined means log in first. */
  of(req: IncomingMessage): Session | undefined {
    if (!this.tokenDigest) return this.local;
    const bearer = /^Bearer (.+)$/.exec(req.headers.authorization ?? "")?.[1];
    if (bearer !== undefined && timingSafeEqual(digest(bearer), this.tokenDigest)) {
      return { id: "bearer", csrf: "", who: "bearer", expires: Infinity, scope: "admin" };
    }
    const id = cookies(req).get(COOKIE);
    const found = id === undefined ? undefined : this.live.get(id);
    if (!found) return undefined;
    if (found.expires <= this.now()) {
      this.live.delete(found.id);
      return undefined;
    }
    return found;
  }

  /** login starts an admin session for the one who gave the page's token, or returns undefined for a wrong one. */
  login(given: string, remote: string | undefined): Session | undefined {
    if (!this.tokenDigest || !timingSafeEqual(digest(given), this.tokenDigest)) return undefined;
    return this.start((id) => `session:${id.slice(0, 6)}@${remote}`, "admin");
  }

  /** loginKey starts a session for a live API key (found by its hash), with that key's scope: `key:ID@ADDRESS`. */
  loginKey(key: ApiKey, remote: string | undefined): Session | undefined {
    if (!this.tokenDigest || key.revokedAt !== null) return undefined;
    return this.start(() => `key:${key.id}@${remote}`, key.scope, key.hash);
  }

  private start(who: (id: string) => string, scope: Scope, key?: string): Session {
    const id = randomBytes(24).toString("base64url");
    if (this.live.size >= MAX_SESSIONS) this.live.delete(this.live.keys().next().value!);
    const session: Session = {
      id,
      csrf: this.csrfFor(id),
      who: who(id),
      expires: this.now() + SESSION_MS,
      scope,
      ...(key === undefined ? {} : { key }),
    };
    this.live.set(id, session);
    return session;
  }

  /** logout ends a session. */
  logout(s: Session): void {
    this.live.delete(s.id);
  }

  /** csrfMatches tells whether a form carries the session's CSRF token; a bearer token needs none. */
  csrfMatches(s: Session, given: string | null): boolean {
    if (s.id === "bearer") return true;
    const csrf = Buffer.from(given ?? "");
    const expected = Buffer.from(s.csrf);
    return csrf.length === expected.length && timingSafeEqual(csrf, expected);
  }

  /** flash keeps a message for the session's next page and returns the key its redirect names. */
  flash(s: Session, flash: Flash): string {
    const key = randomBytes(12).toString("base64url");
    if (this.flashes.size >= MAX_SESSIONS) this.flashes.delete(this.flashes.keys().next().value!);
    this.flashes.set(key, { session: s.id, flash });
    return key;
  }

  /** takeFlash returns the message a key names, once, and only to the session it was made for. */
  takeFlash(s: Session, key: string | null): Flash | null {
    const found = key === null ? undefined : this.flashes.get(key);
    if (!found || found.session !== s.id) return null;
    this.flashes.delete(key!);
    return found.flash;
  }

  private csrfFor(id: string): string {
    return createHmac("sha256", this.secret).update(id).digest("base64url");
  }
}

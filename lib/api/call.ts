// lib/api/call.ts: what each operation of the JSON API is handed and hands back, shared by the rooms that hold
// the operations (lib/api/api.ts: deliveries, destinations' state, the audit log; lib/api/config.ts: the
// configuration): the page's context, the request as its schemas checked it, the answer with what the audit
// log says of it, and ApiError, a refusal with its problem's extra members.

import type { Host } from "../config/config.ts";
import type { Preview } from "../forwarding/preview.ts";
import type { Announce } from "../operations/actions.ts";
import { HttpError } from "../operations/input.ts";
import type { Audit, Delivery, Inbox } from "../store.ts";

/** ApiContext is what the API reads from the page's server: the inbox, the clock, its settings and its redaction. */
export interface ApiContext {
  inbox: Inbox;
  now: () => number;
  redact: (text: string) => string;
  batchSize: number;
  readOnly: boolean;
  destinations: readonly string[];
  announce?: Announce;
  /** What a stored delivery would become now; to names one destination, chosen by the routes or not. */
  preview?: (rows: readonly Delivery[], options?: { to?: string }) => Promise<Preview>;
  /** Where the one audit line per change goes, beside the audit log in the store. */
  audit: (line: string) => void;
  /**
   * What the operator hands a configuration changed here (lib/config/config.ts Host): the environment its
   * allowed `env:NAME` references are read from, the Policy the API's parts are held to, and the key that
   * seals and opens the secret store's values (none: secrets cannot be set here).
   */
  host: Host;
  /** The folder a configuration's relative transform paths start from. */
  base: string;
}

/** Call is one request, checked: its operation's inputs as the schemas parsed them, and who sent it (`key:ID`). */
export interface Call {
  params: Record<string, unknown>;
  query: Record<string, unknown>;
  body: unknown;
  who: string;
  /** audit is this request's entry in the audit log, for the store call that makes its change (same transaction). */
  audit(target: string): Audit;
}

/** Answer is what an operation returns: its JSON, and for a change the one line the server's log says of it. */
export interface Answer {
  body: unknown;
  change?: { target: string; count: number };
}

/** Operate runs one operation of the API (and of the page, through Api.perform()). */
export type Operate = (ctx: ApiContext, call: Call) => Promise<Answer>;

/** ProblemMembers are what a problem may say beyond its detail: the fields that failed, the rows that wait. */
export interface ProblemMembers {
  errors?: { path: string; message: string }[];
  waiting?: { destination: string; n: number }[];
}

/** ApiError is a refusal with its status, its detail, and its problem's extra members. */
export class ApiError extends HttpError {
  readonly members: ProblemMembers;
  /** Headers the answer carries besides its own (a 503's Retry-After). */
  readonly headers: Record<string, string>;
  constructor(status: number, detail: string, members: ProblemMembers = {}, headers: Record<string, string> = {}) {
    super(status, detail);
    this.members = members;
    this.headers = headers;
  }
}

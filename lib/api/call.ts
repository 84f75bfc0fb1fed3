// lib/api/call.ts: what each operation of the JSON API is handed and hands back, shared by the rooms that hold
// the operations (lib/api/routes.ts: deliveries, destinations' state, the audit log; lib/api/config.ts: the
// configuration): the page's context, the request as its schemas checked it, the answer with what the audit
// log says of it, and ApiError, a refusal with its problem's extra members.

import type { Env } from "../config/config.ts";
import type { Preview } from "../forwarding/preview.ts";
import type { Announce } from "../operations/actions.ts";
import { HttpError } from "../operations/input.ts";
import type { Delivery, Inbox } from "../store.ts";

/** ApiContext is what the API reads from the page's server: the inbox, the clock, its settings and its redaction. */
export interface ApiContext {
  inbox: Inbox;
  now: () => number;
  redact: (text: string) => string;
  batchSize: number;
  readOnly: boolean;
  destinations: readonly string[];
  announce?: Announce;
  preview?: (rows: readonly Delivery[]) => Promise<Preview>;
  /** Where the one audit line per change goes, beside the audit log in the store. */
  audit: (line: string) => void;
  /** Where a configuration's `env:NAME` references are read from when it is checked, as `config apply` reads them. */
  env: Env;
  /** The folder a configuration's relative transform paths start from. */
  base: string;
}

/** Call is one request, checked: its operation's inputs as the schemas parsed them, and who sent it (`key:ID`). */
export interface Call {
  params: Record<string, unknown>;
  query: Record<string, unknown>;
  body: unknown;
  who: string;
}

/** Answer is what an operation returns: its JSON, and for a change what the audit log says of it. */
export interface Answer {
  body: unknown;
  change?: { target: string; count: number };
}

/** Handler runs one operation. */
export type Handler = (ctx: ApiContext, call: Call) => Promise<Answer>;

/** ProblemMembers are what a problem may say beyond its detail: the fields that failed, the rows that wait. */
export interface ProblemMembers {
  errors?: { path: string; message: string }[];
  waiting?: { destination: string; n: number }[];
}

/** ApiError is a refusal with its status, its detail, and its problem's extra members. */
export class ApiError extends HttpError {
  readonly members: ProblemMembers;
  constructor(status: number, detail: string, members: ProblemMembers = {}) {
    super(status, detail);
    this.members = members;
  }
}

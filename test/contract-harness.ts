// test/contract-harness.ts: what every file of the contract suite (test/contract-*.test.ts) shares, as
// River's riverdrivertest shares one harness across its files: the loop over both backends (a real SQLite
// file, and a fresh database on a real PostgreSQL, skipped in one line without one), an inbox opened on the
// pinned clock, and the constants. Not a test file itself; each area file calls contract() once.

import { afterEach, beforeEach, describe, it } from "node:test";
import { connect } from "../inbox.ts";
import type { Inbox, InboxOptions, SqlValue } from "../lib/store.ts";
import { backends, postgresSkip, T0, type TestBackend } from "./helpers.ts";

// T0, where the pinned clock starts each test, is helpers.ts's: the PostgreSQL target each test gets is a copy
// of an inbox opened at T0 (freshInbox()), its days already made.
export { T0 };

/** LEASE is the lease every claim in the suite asks for, in ms. */
export const LEASE = 60_000;

/** body is an event as the bytes of its JSON, as a provider sends it. */
export const body = (event: unknown): Buffer => Buffer.from(JSON.stringify(event));

/**
 * daysOpened runs EXPLAIN ANALYZE of a read of deliveries (PostgreSQL) under where, and counts the history's days
 * in its plan: those whose scan ran (a day pruned as the statement ran says "never executed"), and all of them.
 */
export async function daysOpened(
  inbox: Inbox,
  { where, params }: { where: string; params: SqlValue[] },
): Promise<{ ran: number; all: number }> {
  const plan = await inbox.query(
    `EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) SELECT source, id FROM deliveries WHERE ${where}`,
    ...params,
  );
  const lines = plan.map((r) => String(r["QUERY PLAN"]));
  const days = (pick: (line: string) => boolean) =>
    new Set(lines.filter(pick).flatMap((line) => /delivery_history_d\d{8}/.exec(line) ?? [])).size;
  return { ran: days((line) => !/never executed/.test(line)), all: days(() => true) };
}

/** pgSkip is false when the PostgreSQL server answers, else why the tests that need it are skipped. */
export const pgSkip = await postgresSkip();

// Both stores, each test on an empty target of its own.
const BACKENDS = await backends("contract");

/** Contract is one backend as a test of the suite sees it: fresh for each test, its clock pinned. */
export interface Contract {
  readonly backend: TestBackend;
  /** Where this test's deliveries live: a file in a temp folder, or a postgres:// URL with a fresh ?schema=. */
  readonly target: string;
  /** The pinned clock, in ms since the epoch: T0 when the test starts, moved on by the test alone. */
  t: number;
  /** Inboxes the test opened itself; each is closed after the test, before its target is removed. */
  readonly opened: Inbox[];
  /** open connects to the test's target on the pinned clock, with no jitter (random is 0). */
  open(options?: InboxOptions): Promise<Inbox>;
  /** another opens an inbox on a second empty target of the same backend, removed after the test. */
  another(options?: InboxOptions): Promise<Inbox>;
  /** row reads a delivery's row as the table holds it. */
  row(inbox: Inbox, id: string, source?: string): Promise<Record<string, unknown> | undefined>;
  /** onPostgres declares a test on PostgreSQL alone: a behaviour only it has, rather than one skipped on SQLite. */
  onPostgres(name: string, fn: () => Promise<void>): void;
}

/**
 * contract runs one area of the suite against each backend, under "the contract on sqlite" and "the
 * contract on postgres" (test/pgbouncer.test.ts runs the PostgreSQL half alone, by that name).
 */
export function contract(area: (c: Contract) => void): void {
  for (const backend of BACKENDS) {
    describe(`the contract on ${backend.name}`, { skip: backend.skip }, () => {
      let cleanups: (() => Promise<void>)[] = [];
      let opened: Inbox[] = [];
      let target = "";
      const c: Contract = {
        backend,
        get target() {
          return target;
        },
        t: T0,
        get opened() {
          return opened;
        },
        async open(options = {}) {
          const inbox = await connect(target, { now: () => c.t, random: () => 0, ...options });
          opened.push(inbox);
          return inbox;
        },
        async another(options = {}) {
          const made = await backend.make();
          cleanups.push(made.cleanup);
          const inbox = await connect(made.target, { now: () => c.t, random: () => 0, ...options });
          opened.push(inbox);
          return inbox;
        },
        async row(inbox, id, source = "default") {
          return (await inbox.query("SELECT * FROM deliveries WHERE source = ? AND id = ?", source, id))[0];
        },
        onPostgres(name, fn) {
          if (backend.name === "postgres") it(name, fn);
        },
      };
      beforeEach(async () => {
        const made = await backend.make();
        target = made.target;
        cleanups = [made.cleanup];
        opened = [];
        c.t = T0;
      });
      afterEach(async () => {
        for (const inbox of opened) await inbox.close();
        for (const cleanup of cleanups) await cleanup();
      });
      area(c);
    });
  }
}

// errors.ts: how a database error is told apart, the same on both backends: sqlstate() names its kind for
// logs and metrics, passing() says it goes away on its own (one list of SQLSTATE classes, PASSING_CLASSES),
// and again() runs a worker's write again while it meets one. Ground floor: it imports nothing.

/**
 * sqlstate names the kind of a database error for logs and metrics: PostgreSQL's SQLSTATE class (its first
 * two characters: 40 a deadlock or serialization failure, 08 a lost connection, 53 too many connections,
 * 57 a cancelled statement or a server shutting down), else a socket's code (ECONNRESET), else SQLite's
 * (SQLITE_BUSY), else "other". It looks through the causes a batch's error wraps.
 */
export function sqlstate(error: unknown): string {
  for (const e of causes(error)) {
    const code = (e as { code?: unknown }).code;
    // A socket's code first: EPIPE and EPERM are five characters too, and no SQLSTATE class starts with E.
    if (typeof code === "string" && /^E[A-Z]+$/.test(code)) return code;
    if (typeof code === "string" && /^[0-9A-Z]{5}$/.test(code)) return code.slice(0, 2);
    const errcode = (e as { errcode?: unknown }).errcode;
    if (typeof errcode === "number") return SQLITE_CODES[errcode & 0xff] ?? `SQLITE_${errcode & 0xff}`;
  }
  return "other";
}

// causes walks an error and the causes it wraps, five deep: a batch's error wraps the one its statement met.
// sqlstate(), passing() and moved() each read them; moved() asks for 40001 itself, as sqlstate() names only
// the class, 40, which a deadlock (40P01) shares.
function* causes(error: unknown): Generator<object> {
  for (let e = error, depth = 0; e instanceof Object && depth < 5; e = (e as { cause?: unknown }).cause, depth++)
    yield e;
}

const SQLITE_CODES: Record<number, string> = {
  5: "SQLITE_BUSY",
  6: "SQLITE_LOCKED",
  10: "SQLITE_IOERR",
  13: "SQLITE_FULL",
};

/**
 * passing says a database error is one that goes away on its own, so the write that met it may simply
 * go again: a deadlock or serialization failure (40), a lost connection (08, or one of SOCKET_CODES), too
 * many connections (53), a lock timeout (55P03), a cancelled statement or a server shutting down or
 * restarting (57), a system error on the server (58), a primary turned standby (25006), SQLite's lock held
 * too long (SQLITE_BUSY, SQLITE_LOCKED). A local I/O error (EIO, ENOSPC, EROFS) is not one: a failed
 * fdatasync, say, sticks until a restart.
 */
export function passing(error: unknown): boolean {
  for (const e of causes(error)) {
    // An error that knows it will come back as it is (a search past its bound) says so, whatever its cause.
    if ((e as { passing?: unknown }).passing === false) return false;
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && (passingSqlstate(code) || code === "55P03" || SOCKET_CODES.has(code))) return true;
    const errcode = (e as { errcode?: unknown }).errcode;
    if (typeof errcode === "number" && [5, 6].includes(errcode & 0xff)) return true;
    if (
      code === undefined &&
      errcode === undefined &&
      /connection terminated|not queryable|timeout exceeded when trying to connect/i.test(
        ((e as { message?: unknown }).message as string) ?? "",
      )
    )
      return true;
  }
  return false;
}

/**
 * moved says a database error is PostgreSQL's serialization failure (40001), which a READ COMMITTED
 * transaction meets when a row it would lock or change was moved to another partition of delivery_rows by a
 * transaction that committed meanwhile (a done mark, a retry, a replay: docs/table.md#hot-and-cold). The
 * statement, run again, reads afresh and finds the row where it went, or finds it no longer matches. It looks
 * through the causes a batch's error wraps; passing() says the same of it, with every class-40 error.
 */
export function moved(error: unknown): boolean {
  for (const e of causes(error)) if ((e as { code?: unknown }).code === "40001") return true;
  return false;
}

/** whileMoved runs a write, and runs it again while it fails because a row moved under it (moved()), tries times in all. */
export async function whileMoved<T>(write: () => Promise<T>, tries: number): Promise<T> {
  for (let n = 1; ; n++) {
    try {
      return await write();
    } catch (error) {
      if (!moved(error) || n >= tries) throw error;
    }
  }
}

/**
 * PASSING_CLASSES are the SQLSTATE classes of a server's errors that go away on their own: a lost
 * connection (08), a deadlock or serialization failure (40), too many connections (53), a cancelled
 * statement or a server shutting down (57), a system error on the server (58). passing() and the
 * PostgreSQL committer's batch errors both read this one list.
 */
export const PASSING_CLASSES: readonly string[] = ["08", "40", "53", "57", "58"];

/** passingSqlstate says a SQLSTATE is of one of PASSING_CLASSES, or is 25006, a primary turned standby. */
export function passingSqlstate(code: string): boolean {
  return PASSING_CLASSES.includes(code.slice(0, 2)) || code === "25006";
}

// The socket errors of a connection lost or not yet back (a restart, a failover, a network blip).
const SOCKET_CODES = new Set([
  "ECONNRESET",
  "ECONNREFUSED",
  "ECONNABORTED",
  "EPIPE",
  "ETIMEDOUT",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EHOSTDOWN",
  "ENETDOWN",
  "ENOTFOUND",
]);

/**
 * again runs one of a worker's writes and, while it fails with a passing error, runs it again after a
 * backoff (minMs, doubling up to maxMs) for up to forMs; onError hears of every passing failure first. A lease is
 * fenced by its token, so a done mark, a failure or a release written late still says only what this
 * worker did. Any other error, or one that outlasts forMs, is thrown. With `first`, the first try was the
 * caller's, and failed with that error.
 */
export function again<T>(
  write: () => Promise<T>,
  o: { forMs: number; minMs: number; maxMs: number; onError: (error: unknown, tries: number) => void },
  first?: { error: unknown },
): Promise<T> {
  const since = performance.now();
  const retry = async (failed: unknown): Promise<T> => {
    let error = failed;
    for (let wait = Math.max(1, o.minMs), tries = 1; ; wait = Math.min(o.maxMs, 2 * wait), tries++) {
      if (!passing(error)) throw error;
      o.onError(error, tries);
      if (performance.now() - since >= o.forMs) throw error;
      await new Promise((resolve) => setTimeout(resolve, wait));
      try {
        return await write();
      } catch (next) {
        error = next;
      }
    }
  };
  // A caller that made the first try itself (so that a write that succeeds settles in the very turn it
  // would without again()) hands its error over as `first`.
  return first ? retry(first.error) : write().then(undefined, retry);
}

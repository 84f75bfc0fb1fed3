// receiver.ts: the webhook receiver on node:http. It answers 200 only once the delivery is committed to
// disk, so the sender may forget it; anything it cannot store gets a status that makes the sender retry.
//   npx tsx receiver.ts [--port 8000] [--host 127.0.0.1] [--db inbox.db] [--sources sources.json]
// Then send it the article's deliveries with `npx tsx send.ts`.

import { readFileSync } from "node:fs";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { pathToFileURL } from "node:url";
import { DEFAULTS, connect, label, lineLog, message, type Inbox, type Stored } from "./inbox.ts";
import { orderOfRequest } from "./order.ts";
import { loadSources, unsignedSource, verify, type Source } from "./providers.ts";

/** ReceiverOptions configures createReceiver; every number has a default in DEFAULTS. */
export interface ReceiverOptions {
  inbox: Inbox;
  /** Sources by name, each served at POST /<name>. @default the unsigned `default` source at / */
  sources?: ReadonlyMap<string, Source>;
  /** @default DEFAULTS.maxBodyBytes */
  maxBodyBytes?: number;
  /** @default DEFAULTS.maxIdLength */
  maxIdLength?: number;
  /** @default DEFAULTS.maxInFlight */
  maxInFlight?: number;
  /** @default DEFAULTS.headersTimeoutMs */
  headersTimeoutMs?: number;
  /** @default DEFAULTS.requestTimeoutMs */
  requestTimeoutMs?: number;
  /** @default DEFAULTS.retryAfterS */
  retryAfterS?: number;
  /** Where the one line per delivery goes. @default console.error */
  log?: (line: string) => void;
  /** The clock for signature windows, in ms since the epoch. @default Date.now */
  now?: () => number;
}

/** Receiver is a running server plus the means to stop it without dropping a request. */
export interface Receiver {
  server: Server;
  /** close stops accepting, lets requests in flight finish (or cuts them after graceMs), then returns. */
  close(graceMs?: number): Promise<void>;
}

// Rejected is a request turned away before storing: the status and the reason for the log.
class Rejected extends Error {
  readonly status: number;
  readonly closeConnection: boolean;
  constructor(status: number, reason: string, closeConnection = false) {
    super(reason);
    this.status = status;
    this.closeConnection = closeConnection;
  }
}

/** createReceiver builds the HTTP server over an open inbox; call server.listen() to start it. */
export function createReceiver(options: ReceiverOptions): Receiver {
  const inbox = options.inbox;
  const maxBody = options.maxBodyBytes ?? DEFAULTS.maxBodyBytes;
  const maxIdLength = options.maxIdLength ?? DEFAULTS.maxIdLength;
  const maxInFlight = options.maxInFlight ?? DEFAULTS.maxInFlight;
  const retryAfter = String(options.retryAfterS ?? DEFAULTS.retryAfterS);
  const log = options.log ?? ((line: string) => console.error(line));
  const now = options.now ?? Date.now;
  const sources = options.sources ?? new Map([["", unsignedSource()]]);
  let inFlight = 0;
  let idle: (() => void) | undefined;
  let stopping = false;

  const reply = (res: ServerResponse, status: number, text: string, headers: Record<string, string> = {}) => {
    if (res.headersSent || res.destroyed) return;
    // Once stopping, each answer closes its connection: kept alive, it would hold the exit up for as long
    // as the client kept it, and carry more requests in meanwhile.
    const closing: Record<string, string> = stopping ? { connection: "close" } : {};
    res.writeHead(status, { "content-type": "text/plain; charset=utf-8", "content-length": Buffer.byteLength(text), ...closing, ...headers });
    res.end(text);
  };

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = (req.url ?? "/").split("?")[0]!;
    if (path === "/healthz" && (req.method === "GET" || req.method === "HEAD")) return reply(res, 200, "ok");
    const source = sources.get(path.replace(/^\/+|\/+$/g, ""));
    if (!source) throw new Rejected(404, `no source at ${path}`);
    if (req.method !== "POST") {
      res.setHeader("allow", "POST");
      throw new Rejected(405, `method ${req.method} not allowed`);
    }
    // Node's parser has already refused a repeated, non-numeric or conflicting Content-Length (400).
    const declared = req.headers["content-length"] === undefined ? undefined : Number(req.headers["content-length"]);
    if (declared !== undefined && declared > maxBody) throw new Rejected(413, `body of ${declared} bytes is over the ${maxBody}-byte limit`, true);

    const body = await readBody(req, maxBody);
    const verdict = verify(source, req.headersDistinct, body, now());
    // Named by source, so a log fed by several providers says whose signature failed.
    if (verdict.kind === "reject") throw new Rejected(verdict.status, source.name === DEFAULTS.source ? verdict.reason : `${source.name}: ${verdict.reason}`);
    if (verdict.kind === "reply") return reply(res, verdict.status, verdict.body, { "content-type": verdict.contentType });
    const id = verdict.id;
    if (id.length > maxIdLength) throw new Rejected(400, `delivery id longer than ${maxIdLength} characters`);

    let outcome: Stored;
    try {
      outcome = await inbox.store({
        source: source.name, id, body, contentType: req.headers["content-type"] ?? null,
        eventType: verdict.eventType, providerTime: verdict.providerTime,
        ...orderOfRequest(source.order, req.headersDistinct, body),
      });
    } catch (error) {
      // Not on disk, so the sender must keep it and try again.
      log(`rejected ${label({ source: source.name, id })}: 503 could not store: ${message(error)}`);
      return reply(res, 503, "try again later", { "retry-after": retryAfter });
    }
    log(`${outcome === "stored" ? "stored" : outcome === "conflict" ? "duplicate (conflict: the body differs; kept the first)" : "duplicate"} ${label({ source: source.name, id })}`);
    // Either way the delivery is safe on disk, so the provider is told to stop sending it.
    reply(res, 200, outcome === "stored" ? "stored" : "duplicate");
  }

  const server = createServer(
    {
      headersTimeout: options.headersTimeoutMs ?? DEFAULTS.headersTimeoutMs,
      requestTimeout: options.requestTimeoutMs ?? DEFAULTS.requestTimeoutMs,
      // Node checks the two timeouts above only this often; its default of 30 s lets slow clients linger.
      connectionsCheckingInterval: 1_000,
    },
    (req, res) => {
      if (inFlight >= maxInFlight) {
        log(`rejected: 503 over ${maxInFlight} requests in flight`);
        return reply(res, 503, "busy, try again later", { "retry-after": retryAfter, connection: "close" });
      }
      inFlight++;
      res.on("close", () => {
        if (--inFlight === 0) idle?.();
      });
      handle(req, res).catch((error: unknown) => {
        if (error instanceof Rejected) {
          if (error.status !== 404 || req.method === "POST") log(`rejected: ${error.status} ${error.message}`);
          reply(res, error.status, error.message, error.closeConnection ? { connection: "close" } : {});
          // The rest of a refused body must not be read as the next request: after the answer has gone
          // out, give the client a moment to read it, then drop the connection.
          if (error.closeConnection) {
            const socket = req.socket;
            res.on("finish", () => setTimeout(() => socket.destroy(), 1_000).unref());
          }
          return;
        }
        log(`rejected: ${message(error)}`);
        if (!res.headersSent && !req.destroyed) reply(res, 500, "internal error");
      });
    },
  );
  server.on("clientError", (error: NodeJS.ErrnoException, socket) => {
    const status = error.code === "HPE_HEADER_OVERFLOW" ? 431 : error.code === "ERR_HTTP_REQUEST_TIMEOUT" ? 408 : 400;
    log(`rejected: ${status} malformed request (${error.code ?? error.message})`);
    if (!socket.writable || (socket as { _httpMessage?: unknown })._httpMessage) return void socket.destroy();
    const text = status === 431 ? "Request Header Fields Too Large" : status === 408 ? "Request Timeout" : "Bad Request";
    socket.end(`HTTP/1.1 ${status} ${text}\r\nconnection: close\r\ncontent-length: 0\r\n\r\n`);
  });

  return {
    server,
    close: (graceMs = DEFAULTS.shutdownGraceMs) =>
      new Promise<void>((resolve) => {
        const done = () => {
          clearTimeout(timer);
          resolve();
        };
        const timer = setTimeout(() => server.closeAllConnections(), graceMs);
        stopping = true;
        server.close(() => (inFlight === 0 ? done() : (idle = done)));
        server.closeIdleConnections();
      }),
  };
}

// readBody reads the whole body, counting bytes as they arrive so a liar or a stream is cut at the limit,
// and fails if the client hangs up before the end: a fragment is never stored.
function readBody(req: IncomingMessage, maxBody: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const stop = (error: Rejected) => {
      req.off("data", onData).off("end", onEnd).off("close", onClose);
      req.pause();
      reject(error);
    };
    const onData = (chunk: Buffer) => {
      size += chunk.length;
      if (size > maxBody) return stop(new Rejected(413, `body is over the ${maxBody}-byte limit`, true));
      chunks.push(chunk);
    };
    const onEnd = () => {
      req.off("close", onClose);
      resolve(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, size));
    };
    const onClose = () => stop(new Rejected(400, `body cut short after ${size} bytes`, true));
    req.on("data", onData).on("end", onEnd).on("close", onClose);
  });
}

async function main(argv: string[]): Promise<void> {
  const { Command, InvalidArgumentError } = await import("commander");
  const whole = (min: number) => (value: string) => {
    const n = Number(value);
    if (!Number.isInteger(n) || n < min) throw new InvalidArgumentError(`expected a whole number of ${min} or more.`);
    return n;
  };
  const program = new Command("receiver.ts")
    .description("Receive webhooks and store each one durably before answering 200.")
    .option("--port <port>", `port to listen on; 0 picks a free one (default: PORT, else ${DEFAULTS.port})`, whole(0))
    .option("--host <address>", "address to listen on", DEFAULTS.host)
    .option("--db <path|url>", `database file, or a postgres:// URL (default: INBOX_DB, else ${DEFAULTS.db})`)
    .option("--max-body <bytes>", "largest body accepted, in bytes", whole(1), DEFAULTS.maxBodyBytes)
    .option("--max-in-flight <n>", "requests held at once before answering 503", whole(1), DEFAULTS.maxInFlight)
    .option("--sources <file>", "JSON file of signed sources, each served at POST /<name> (default: INBOX_SOURCES)")
    .option("--quiet", "don't log a line per delivery")
    .option("--inline-checkpoints", "copy the WAL into the database inside commits, as SQLite does by default, instead of on a thread of its own (slower acks; for comparison)")
    .addHelpText("after", `
Answers: 200 stored | 200 duplicate | 400 bad request | 401 bad signature | 404 unknown path | 405 not POST
         413 body too large | 431 headers too large | 503 could not store (Retry-After)

Sources file: {"stripe": {"provider": "stripe", "secret": "env:STRIPE_WEBHOOK_SECRET"},
               "github": {"provider": "github", "secret": ["old", "new"]}}
Providers: standard (and Svix), stripe, github, shopify, slack, plain. Without one, POST / is unsigned.

Examples:
  npx tsx receiver.ts
  PORT=9000 npx tsx receiver.ts --db /tmp/inbox.db
  curl -X POST -H 'X-Delivery-Id: evt_1' -d '{"customer":"Ann","amount":5}' http://127.0.0.1:8000/
  npx tsx receiver.ts --sources sources.json`)
    .showHelpAfterError("(run with --help for usage)");
  program.exitOverride((error) => process.exit(error.exitCode === 0 ? 0 : 2));
  await program.parseAsync(argv);
  const opts = program.opts<{ port?: number; host: string; db?: string; maxBody: number; maxInFlight: number; sources?: string; quiet?: boolean; inlineCheckpoints?: boolean }>();
  const envPort = process.env.PORT;
  const port = opts.port ?? (envPort === undefined ? DEFAULTS.port : Number(envPort));
  if (!Number.isInteger(port) || port < 0 || port > 65535) fatal(`PORT must be a port number, got ${envPort}`);

  // Sources are read before the database is opened: a mistake in them must not leave a fresh inbox.db behind.
  const sourcesFile = opts.sources ?? process.env.INBOX_SOURCES;
  let sources: Map<string, Source> | undefined;
  if (sourcesFile) {
    let parsed: unknown;
    try {
      parsed = JSON.parse(readFileSync(sourcesFile, "utf8"));
    } catch (error) {
      // V8 quotes a piece of the text in JSON errors, and that piece may hold a secret: keep only where.
      const why = error instanceof SyntaxError ? `not valid JSON${/ at position \d+.*$/.exec(error.message)?.[0] ?? ""}` : message(error);
      fatal(`receiver: cannot read the sources file ${sourcesFile}: ${why}`);
    }
    try {
      sources = loadSources(parsed, process.env);
    } catch (error) {
      fatal(`receiver: ${sourcesFile}: ${message(error)}`);
    }
  }

  const path = opts.db ?? process.env.INBOX_DB ?? DEFAULTS.db;
  let inbox: Inbox;
  try {
    // No ack waits behind a checkpoint, unless asked to (bench/latency compares the two).
    inbox = await connect(path, { backgroundCheckpoints: !opts.inlineCheckpoints });
  } catch (error) {
    return fatal(`receiver: cannot use the database: ${message(error)}`, 1);
  }
  if (!sources) {
    console.error("warning: deliveries are not verified; anyone who can reach this port can store one.");
  } else {
    for (const s of sources.values()) {
      const signed = s.secrets.length === 0 ? "NOT verified" : s.secrets.length === 1 ? "1 secret" : `${s.secrets.length} secrets`;
      console.error(`source ${s.name}: ${s.provider}, POST /${s.name}, ${signed}`);
      if (s.secrets.length === 0) console.error(`warning: source ${s.name} is not verified; anyone who can reach this port can store one.`);
    }
  }
  const { log, flush: flushLog } = lineLog();
  const receiver = createReceiver({
    inbox, sources, maxBodyBytes: opts.maxBody, maxInFlight: opts.maxInFlight, log: opts.quiet ? () => {} : log,
  });
  receiver.server.on("error", (error) => fatal(`receiver: cannot listen on ${opts.host}:${port}: ${message(error)}`, 1));
  receiver.server.listen(port, opts.host, () => {
    const address = receiver.server.address();
    const actual = typeof address === "object" && address ? address.port : port;
    console.log(`Listening on http://${opts.host}:${actual}`);
  });

  let stopping = false;
  const stop = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    flushLog();
    console.error(`${signal}: finishing the requests in flight, then stopping`);
    await receiver.close();
    await inbox.close();
    flushLog();
    process.exit(0);
  };
  process.on("SIGTERM", () => void stop("SIGTERM"));
  process.on("SIGINT", () => void stop("SIGINT"));
}

// fatal stops start-up with one line: exit 2 for a mistake in the options or sources, 1 for a runtime failure.
function fatal(line: string, code: 1 | 2 = 2): never {
  console.error(line);
  process.exit(code);
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) await main(process.argv);

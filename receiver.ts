// receiver.ts: the webhook receiver on node:http. It answers 200 only once the delivery is committed to
// disk, so the sender may forget it; anything it cannot store gets a status that makes the sender retry.
//   npx tsx receiver.ts [--port 8000] [--host 127.0.0.1] [--db inbox.db] [--sources sources.json]
// Then send it the article's deliveries with `npx tsx send.ts`.

import { readFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import { pathToFileURL } from "node:url";
import { DEFAULTS, connect, lineLog, message, type Inbox } from "./inbox.ts";
import { createHandler } from "./handler.ts";
import { loadSources, type Source } from "./providers.ts";

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

/** createReceiver builds the HTTP server over an open inbox; call server.listen() to start it. */
export function createReceiver(options: ReceiverOptions): Receiver {
  const log = options.log ?? ((line: string) => console.error(line));
  let stopping = false;
  // The same handler that apps mount (handler.ts), so the standalone receiver has no code path of its own.
  const webhooks = createHandler({ ...options, log, closing: () => stopping });

  const server = createServer(
    {
      headersTimeout: options.headersTimeoutMs ?? DEFAULTS.headersTimeoutMs,
      requestTimeout: options.requestTimeoutMs ?? DEFAULTS.requestTimeoutMs,
      // Node checks the two timeouts above only this often; its default of 30 s lets slow clients linger.
      connectionsCheckingInterval: 1_000,
    },
    (req, res) => {
      if ((req.url ?? "/").split("?")[0] === "/healthz" && (req.method === "GET" || req.method === "HEAD")) {
        res.writeHead(200, { "content-type": "text/plain; charset=utf-8", "content-length": 2, ...(stopping ? { connection: "close" } : {}) });
        return void res.end("ok");
      }
      webhooks.node(req, res);
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
        server.close(() => void webhooks.idle().then(done));
        server.closeIdleConnections();
      }),
  };
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
Providers: standard (and Svix), stripe, github, shopify, slack, paddle, linear, square, twilio, zoom,
           intercom, plain, and hmac (a scheme declared in the file; see the README). Without one, POST / is unsigned.

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

// receiver.ts: the webhook receiver on node:http. It answers 200 only once the delivery is committed to
// disk, so the sender may forget it; anything it cannot store gets a status that makes the sender retry.
//   npx tsx receiver.ts [--port 8000] [--host 127.0.0.1] [--db inbox.db] [--sources sources.json]
// Then send it the article's deliveries with `npx tsx send.ts`.

import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { Socket } from "node:net";
import { pathToFileURL } from "node:url";
import { connect, isPostgresUrl } from "./inbox.ts";
import { DEFAULTS } from "./lib/defaults.ts";
import { speakTo } from "./lib/format.ts";
import { jsonLine, lineLog, LOG_FORMATS, message, silent, type Log, type LogFormat } from "./lib/log.ts";
import type { Inbox } from "./lib/store.ts";
import { createWebhooks } from "./lib/receiver.ts";
import { Metrics, NO_SOURCE, Readiness, route } from "./lib/metrics.ts";
import type { Source } from "./lib/providers.ts";
import { loadVersion } from "./lib/config/config.ts";
import { Startup, StartupError } from "./lib/startup.ts";

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
  /** @default DEFAULTS.bodyTimeoutMs */
  bodyTimeoutMs?: number;
  /** @default DEFAULTS.minBodyRate */
  minBodyRate?: number;
  /**
   * node:http's cap on a whole request, behind the handler's own pace: it also ends bodies the handler does
   * not read (a 404's). @default headersTimeoutMs + bodyTimeoutMs + maxBodyBytes / minBodyRate, in ms
   */
  requestTimeoutMs?: number;
  /** @default DEFAULTS.maxConnectionsPerIp */
  maxConnectionsPerIp?: number;
  /** @default DEFAULTS.clientIpHeader (none: the TCP peer's address) */
  clientIpHeader?: string;
  /** Count requests against maxInFlight from their headers, as before (for comparison). @default false */
  inFlightFromHeaders?: boolean;
  /** @default DEFAULTS.retryAfterS */
  retryAfterS?: number;
  /** Where the one line per delivery goes; the fields are for the JSON format. @default console.error */
  log?: Log;
  /** The clock for signature windows, in ms since the epoch. @default Date.now */
  now?: () => number;
  /** Counts every answer and serves GET /metrics; without it, neither. @default none */
  metrics?: Metrics;
}

/** Receiver is a running server plus the means to stop it without dropping a request. */
export interface Receiver {
  server: Server;
  /** close stops accepting, lets requests in flight finish (or cuts them after graceMs), then returns. /readyz fails from its first moment. */
  close(graceMs?: number): Promise<void>;
  /** readiness is what /readyz answers with. */
  readiness: Readiness;
  /** setSources serves these sources from the next request on (undefined: the default source). */
  setSources(sources: ReadonlyMap<string, Source> | undefined): void;
}

/** createReceiver builds the HTTP server over an open inbox; call server.listen() to start it. */
export function createReceiver(options: ReceiverOptions): Receiver {
  const log: Log = options.log ?? ((line: string) => console.error(line));
  const metrics = options.metrics;
  let stopping = false;
  // The same handler that apps mount (handler.ts), so the standalone receiver has no code path of its own.
  const webhooks = createWebhooks({ ...options, log, closing: () => stopping });
  const readiness = new Readiness(options.inbox, { stopping: () => stopping });
  metrics?.reportReadiness(readiness);

  const headersTimeout = options.headersTimeoutMs ?? DEFAULTS.headersTimeoutMs;
  const longestBody =
    (options.bodyTimeoutMs ?? DEFAULTS.bodyTimeoutMs) +
    Math.ceil(((options.maxBodyBytes ?? DEFAULTS.maxBodyBytes) * 1000) / (options.minBodyRate ?? DEFAULTS.minBodyRate));
  const perAddress = limitPerAddress(
    options.maxConnectionsPerIp ?? DEFAULTS.maxConnectionsPerIp,
    options.clientIpHeader ?? DEFAULTS.clientIpHeader,
    log,
  );
  const server = createServer(
    {
      headersTimeout: headersTimeout,
      // Scaled to --max-body, so a larger limit is not cut short by a fixed timeout.
      requestTimeout: options.requestTimeoutMs ?? headersTimeout + longestBody,
      // Node checks the two timeouts above only this often; its default of 30 s lets slow clients linger.
      connectionsCheckingInterval: 1_000,
    },
    (req, res) => {
      // Probes and scrapes first, before the in-flight limit: an overloaded receiver is still alive.
      if (route(req, res, readiness, metrics)) return;
      if ((req.method === "GET" || req.method === "HEAD") && (req.url ?? "/").split("?")[0] === "/healthz") {
        res.writeHead(200, {
          "content-type": "text/plain; charset=utf-8",
          "content-length": 2,
          ...(stopping ? { connection: "close" } : {}),
        });
        return void res.end("ok");
      }
      if (!perAddress.admit(req, res)) {
        metrics?.observe(NO_SOURCE, "unavailable", undefined, 503);
        res.writeHead(503, {
          "content-type": "text/plain; charset=utf-8",
          "retry-after": String(options.retryAfterS ?? DEFAULTS.retryAfterS),
          connection: "close",
        });
        return void res.end("too many requests from one address, try again later");
      }
      webhooks.node(req, res);
    },
  );
  perAddress.watch(server);
  server.on("clientError", (error: NodeJS.ErrnoException, socket) => {
    const status = error.code === "HPE_HEADER_OVERFLOW" ? 431 : error.code === "ERR_HTTP_REQUEST_TIMEOUT" ? 408 : 400;
    metrics?.observe(NO_SOURCE, "rejected", undefined, status);
    log(`rejected: ${status} malformed request (${error.code ?? error.message})`, { level: "warn", status });
    if (!socket.writable || (socket as { _httpMessage?: unknown })._httpMessage) return void socket.destroy();
    const text =
      status === 431 ? "Request Header Fields Too Large" : status === 408 ? "Request Timeout" : "Bad Request";
    socket.end(`HTTP/1.1 ${status} ${text}\r\nconnection: close\r\ncontent-length: 0\r\n\r\n`);
    // node:http allows half-open sockets, so end() waits for the client's own FIN, which a client that never
    // reads never sends: its socket would stay open. It gets the moment send() gives a refusal, then goes.
    setTimeout(() => socket.destroy(), 1_000).unref();
  });

  return {
    server,
    readiness,
    setSources: (sources) => webhooks.setSources(sources),
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

/**
 * limitPerAddress caps what one client address holds open. Without a header, connections are counted as
 * they are accepted, so idle sockets and ones stalled mid-headers count too, and one past the cap is closed
 * before a byte is read: it costs the receiver nothing. Behind a trusted proxy every connection is the
 * proxy's, so the count moves to requests, from their headers until their answer, by the address in the
 * proxy's header; one past the cap is answered 503. Refusals are logged at most once a second.
 */
function limitPerAddress(
  max: number,
  header: string,
  log: Log,
): { watch(server: Server): void; admit(req: IncomingMessage, res: ServerResponse): boolean } {
  if (!Number.isInteger(max) || max < 1)
    throw new TypeError(`createReceiver: expected maxConnectionsPerIp to be a whole number of 1 or more, got ${max}`);
  const name = header.toLowerCase();
  const open = new Map<string, number>();
  let refused = 0;
  let lastLog = -Infinity;
  const take = (address: string): boolean => {
    const n = open.get(address) ?? 0;
    if (n < max) {
      open.set(address, n + 1);
      return true;
    }
    refused++;
    const now = performance.now();
    if (now - lastLog >= 1_000) {
      lastLog = now;
      log(
        `rejected: ${refused} ${name ? "request" : "connection"}(s) over ${max} from one address, the last from ${address}`,
        { level: "warn", address, refused },
      );
      refused = 0;
    }
    return false;
  };
  const give = (address: string) => {
    const n = open.get(address)! - 1;
    if (n === 0) open.delete(address);
    else open.set(address, n);
  };
  return {
    watch: (server) => {
      if (name) return;
      server.on("connection", (socket: Socket) => {
        const address = socket.remoteAddress ?? "";
        if (!take(address)) return void socket.destroy();
        socket.once("close", () => give(address));
      });
    },
    admit: (req, res) => {
      if (!name) return true;
      // The proxy appends the address it saw to what the client sent, so only the last value is its word.
      const value = req.headers[name];
      const last = (Array.isArray(value) ? value.join(",") : (value ?? "")).split(",").at(-1)!.trim();
      const address = last || (req.socket.remoteAddress ?? "");
      if (!take(address)) return false;
      res.once("close", () => give(address));
      return true;
    },
  };
}

// receiverProgram is the receiver's flags and --help, every flag checked as commander parses it.
async function receiverProgram() {
  const { Command, InvalidArgumentError } = await import("commander");
  const whole = (min: number) => (value: string) => {
    const n = Number(value);
    if (!Number.isInteger(n) || n < min) throw new InvalidArgumentError(`expected a whole number of ${min} or more.`);
    return n;
  };
  const logFormat = (value: string) => {
    if (!(LOG_FORMATS as readonly string[]).includes(value))
      throw new InvalidArgumentError(`expected ${LOG_FORMATS.join(" or ")}.`);
    return value as LogFormat;
  };
  return new Command("receiver.ts")
    .description("Receive webhooks and store each one durably before answering 200.")
    .option("--port <port>", `port to listen on; 0 picks a free one (default: PORT, else ${DEFAULTS.port})`, whole(0))
    .option("--host <address>", "address to listen on", DEFAULTS.host)
    .option("--db <path|url>", `database file, or a postgres:// URL (default: INBOX_DB, else ${DEFAULTS.db})`)
    .option("--max-body <bytes>", "largest body accepted, in bytes", whole(1), DEFAULTS.maxBodyBytes)
    .option(
      "--max-in-flight <n>",
      "requests whose body is complete, held at once before answering 503",
      whole(1),
      DEFAULTS.maxInFlight,
    )
    .option(
      "--headers-timeout <ms>",
      "milliseconds a client may take to send its headers",
      whole(1),
      DEFAULTS.headersTimeoutMs,
    )
    .option(
      "--body-timeout <ms>",
      "milliseconds a body may take before it must keep up --min-body-rate (then 408)",
      whole(1),
      DEFAULTS.bodyTimeoutMs,
    )
    .option(
      "--min-body-rate <bytes>",
      "bytes a second a body must average once --body-timeout has passed",
      whole(1),
      DEFAULTS.minBodyRate,
    )
    .option(
      "--max-connections-per-ip <n>",
      "connections one client address may hold open (behind --client-ip-header: requests)",
      whole(1),
      DEFAULTS.maxConnectionsPerIp,
    )
    .option(
      "--client-ip-header <name>",
      "header a trusted reverse proxy sets to the client's address (its last value counts); only when the port is reachable through the proxy alone",
    )
    .option(
      "--in-flight-from-headers",
      "count a request against --max-in-flight from its headers, as before, so senders stalled mid-body fill it (for comparison)",
    )
    .option("--sources <file>", "JSON file of signed sources, each served at POST /<name> (default: INBOX_SOURCES)")
    .option("--quiet", "don't log a line per delivery")
    .option(
      "--log-format <format>",
      `text, or json: one JSON object per line (${LOG_FORMATS.join(" or ")})`,
      logFormat,
      "text",
    )
    .option("--no-metrics", "don't count answers or serve GET /metrics (for comparison; /livez and /readyz stay)")
    .option(
      "--inline-checkpoints",
      "copy the WAL into the database inside commits, as SQLite does by default, instead of on a thread of its own (slower acks; for comparison)",
    )
    .option(
      "--skip-check",
      "SQLite: skip the start-up quick_check, even when it is due (it runs after an unclean stop, or once a day)",
    )
    .option(
      "--force",
      "SQLite: start on a file that fails the start-up quick_check, saying so (never checked per request)",
    )
    .option(
      "--sync-in-commit",
      "fsync inside each COMMIT, on the event loop (synchronous=FULL), instead of an fdatasync on a thread of its own before the acks (slower; for comparison)",
    )
    .option(
      "--secrets-key-file <file>",
      "the key that opens the secret store's values (a source's secret:NAME), instead of INBOX_SECRETS_KEY",
    )
    .addHelpText(
      "after",
      `
Answers: 200 stored | 200 duplicate | 400 bad request | 401 bad signature | 404 unknown path | 405 not POST
         408 body too slow | 413 body too large | 431 headers too large
         503 could not store, or over --max-in-flight or --max-connections-per-ip (Retry-After)

Sources file: {"stripe": {"provider": "stripe", "secret": "env:STRIPE_WEBHOOK_SECRET"},
               "github": {"provider": "github", "secret": ["old", "new"]}}
Providers: standard (and Svix), stripe, github, shopify, slack, paddle, linear, square, twilio, zoom,
           intercom, plain, and hmac (a scheme declared in the file; see docs/providers.md). Without one, POST / is unsigned.

Examples:
  npx tsx receiver.ts
  PORT=9000 npx tsx receiver.ts --db /tmp/inbox.db
  curl -X POST -H 'X-Delivery-Id: evt_1' -d '{"customer":"Ann","amount":5}' http://127.0.0.1:8000/
  npx tsx receiver.ts --sources sources.json
  curl http://127.0.0.1:8000/metrics     # Prometheus; /livez and /readyz for probes`,
    )
    .showHelpAfterError("(run with --help for usage)");
}

/** main runs the receiver as `receiver.ts` does, from a full argv (runtime, script, then its flags). */
export async function main(argv: string[]): Promise<void> {
  try {
    await serve(argv);
  } catch (error) {
    if (!(error instanceof StartupError)) throw error;
    say(error.message, "error");
    process.exit(error.code);
  }
  process.exit(0);
}

// serve starts the receiver and serves until SIGTERM or SIGINT, then drains: the requests in flight are answered.
async function serve(argv: string[]): Promise<void> {
  const program = await receiverProgram();
  speakTo(program, argv);
  program.exitOverride((error) => process.exit(error.exitCode === 0 ? 0 : 2));
  await program.parseAsync(argv);
  const opts = program.opts<{
    port?: number;
    host: string;
    db?: string;
    maxBody: number;
    maxInFlight: number;
    sources?: string;
    quiet?: boolean;
    headersTimeout: number;
    bodyTimeout: number;
    minBodyRate: number;
    maxConnectionsPerIp: number;
    clientIpHeader?: string;
    inFlightFromHeaders?: boolean;
    inlineCheckpoints?: boolean;
    syncInCommit?: boolean;
    logFormat: LogFormat;
    metrics: boolean;
    force?: boolean;
    skipCheck?: boolean;
    secretsKeyFile?: string;
  }>();
  format = opts.logFormat;
  const envPort = process.env.PORT;
  const port = opts.port ?? (envPort === undefined ? DEFAULTS.port : Number(envPort));
  if (!Number.isInteger(port) || port < 0 || port > 65535)
    throw new StartupError(`PORT must be a port number, got ${envPort}`);
  // What the operator hands the configuration (lib/config/trust.ts): the key to the secret store, and what a
  // part the API wrote may read.
  const startup = new Startup({
    script: "receiver",
    argv,
    say,
    door: { connect, isPostgresUrl },
    env: process.env,
    keyFile: opts.secretsKeyFile,
    ownPorts: [port],
  });

  // Sources are read before the database is opened: a mistake in them must not leave a fresh inbox.db behind.
  // The destinations are the worker's to reach, but a mistake in them stops the receiver too: its routes
  // send deliveries there. Their secrets are the worker's, so only their shape is checked.
  const sourcesFile = opts.sources ?? process.env.INBOX_SOURCES;
  const file = sourcesFile ? startup.readSources(sourcesFile, { resolve: false }) : undefined;
  let metrics: Metrics | undefined;
  // No ack waits behind a checkpoint, and the event loop never waits for the disk, unless asked to
  // (bench/ingest and bench/latency compare). Either way a 200 follows the fsync of its delivery.
  const inbox = await startup.open(opts.db ?? process.env.INBOX_DB ?? DEFAULTS.db, {
    skipCheck: opts.skipCheck,
    force: opts.force,
    connect: {
      backgroundCheckpoints: !opts.inlineCheckpoints,
      syncOffLoop: !opts.syncInCommit,
      pageCacheKb: DEFAULTS.receiverPageCacheKb,
      ...(opts.metrics ? { onCommit: (size: number, ms: number) => metrics?.commit(size, ms) } : {}),
    },
  });
  // What is served is what the database holds, the file applied to it first; the default source while it holds none.
  const { stored } = await startup.configure(inbox, file, { resolve: false });
  let sources: ReadonlyMap<string, Source> | undefined;
  try {
    if (stored) sources = (await loadVersion(stored, startup.host, { resolve: false })).sources;
  } catch (error) {
    throw new StartupError(`receiver: the configuration in the database: ${message(error)}`);
  }
  if (opts.metrics) metrics = new Metrics({ inbox });
  announce(sources);
  const { log, flush: flushLog } = lineLog(process.stderr, format);
  const receiver = createReceiver({
    inbox,
    sources,
    maxBodyBytes: opts.maxBody,
    maxInFlight: opts.maxInFlight,
    log: opts.quiet ? silent : log,
    metrics,
    headersTimeoutMs: opts.headersTimeout,
    bodyTimeoutMs: opts.bodyTimeout,
    minBodyRate: opts.minBodyRate,
    maxConnectionsPerIp: opts.maxConnectionsPerIp,
    clientIpHeader: opts.clientIpHeader ?? DEFAULTS.clientIpHeader,
    inFlightFromHeaders: opts.inFlightFromHeaders,
  });
  const stopped = startup.stopped();
  await new Promise<void>((listening, failed) => {
    const refused = (error: Error) =>
      failed(new StartupError(`receiver: cannot listen on ${opts.host}:${port}: ${message(error)}`, 1));
    receiver.server.once("error", refused).listen(port, opts.host, () => {
      receiver.server.off("error", refused);
      listening();
    });
  });
  const address = receiver.server.address();
  const url = `http://${opts.host}:${typeof address === "object" && address ? address.port : port}`;
  console.log(format === "json" ? jsonLine(`Listening on ${url}`, { url }) : `Listening on ${url}`);

  // A configuration applied while it runs is served from the next request on; SIGHUP applies the file again.
  const unwatch = startup.watch(inbox, {
    version: stored?.version ?? 0,
    sourcesFile,
    checks: { resolve: false },
    take: async (config) => {
      try {
        receiver.setSources((await loadVersion(config, startup.host, { resolve: false })).sources);
        say(`receiver: now serving configuration version ${config.version}`, "info", { configVersion: config.version });
      } catch (error) {
        say(`receiver: configuration version ${config.version} not taken up: ${message(error)}`, "error");
      }
    },
  });

  const signal = await stopped;
  unwatch();
  flushLog();
  say(`${signal}: finishing the requests in flight, then stopping`);
  await receiver.close();
  await inbox.close();
  startup.close();
  flushLog();
}

// announce says at start-up what each source is, and warns of every one that anyone may post to.
function announce(sources: ReadonlyMap<string, Source> | undefined): void {
  if (!sources) {
    say("warning: deliveries are not verified; anyone who can reach this port can store one.", "warn");
  } else {
    for (const s of sources.values()) {
      const signed =
        s.secrets.length === 0 ? "NOT verified" : s.secrets.length === 1 ? "1 secret" : `${s.secrets.length} secrets`;
      say(`source ${s.name}: ${s.provider}, POST /${s.name}, ${signed}`, "info", { source: s.name });
      if (s.secrets.length === 0)
        say(`warning: source ${s.name} is not verified; anyone who can reach this port can store one.`, "warn", {
          source: s.name,
        });
    }
  }
}

// The log format main() was given; the lines before it knows are text.
let format: LogFormat = "text";

// say writes one line of the receiver's own (start-up, shutdown) to stderr, in the log format.
function say(line: string, level: "info" | "warn" | "error" = "info", fields: Record<string, unknown> = {}): void {
  console.error(format === "json" ? jsonLine(line, { level, ...fields }) : line);
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) await main(process.argv);

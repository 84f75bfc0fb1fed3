// admin.ts: the operator page. See what failed, find a delivery, retry or replay it, one or all that match
// a filter; see each destination's state and pause or resume it, in a browser. Its own listener, never the
// receiver's port: loopback unless given a token.
//   npx tsx admin.ts --db inbox.db [--port 8001] [--host 127.0.0.1] [--admin-token env:ADMIN_TOKEN] [--read-only] [--sources sources.json]
// Plain server-rendered HTML and forms; admin.js (lib/admin/html.ts, served from /admin.js) only refreshes the overview.

import { dirname, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { connect, isPostgresUrl } from "./inbox.ts";
import { createAdmin, listenAdmin } from "./lib/admin/server.ts";
import { isLoopback } from "./lib/admin/session.ts";
import { DEFAULTS } from "./lib/defaults.ts";
import { announce } from "./lib/forwarding/forward.ts";
import { preview, previewGate } from "./lib/forwarding/preview.ts";
import { Sandbox } from "./lib/forwarding/sandbox.ts";
import { transformDrift } from "./lib/config/config.ts";
import { lineLog, message } from "./lib/log.ts";
import { brokerLines, type BrokerLine } from "./lib/consume.ts";
import { speakTo } from "./lib/format.ts";
import { loadSources, readSourcesFile, type Source } from "./lib/config/sources.ts";
import { secretsOf } from "./lib/redact.ts";
import { loadDestinations, type Forwarding } from "./lib/routing/routes.ts";
import { Startup, StartupError } from "./lib/startup.ts";
import type { Delivery } from "./lib/store.ts";

// The page as a library, as the package's export webhook-inbox/admin has always offered it; its rooms are in
// lib/admin/: the session (session.ts), the pages (pages.ts, html.ts), the actions (actions.ts), the routing (routes.ts).
export { normaliseError } from "./lib/operations/actions.ts";
export { escape } from "./lib/admin/html.ts";
export { filterFrom } from "./lib/operations/input.ts";
export { type Admin, type AdminOptions, createAdmin, listenAdmin } from "./lib/admin/server.ts";
export { isLoopback } from "./lib/admin/session.ts";

// ---- The entry point --------------------------------------------------------------------------------

/** main runs the operator page as `admin.ts` does, from a full argv (runtime, script, then its flags). */
export async function main(argv: string[]): Promise<void> {
  try {
    await serve(argv);
  } catch (error) {
    if (!(error instanceof StartupError)) throw error;
    console.error(error.message);
    process.exit(error.code);
  }
  process.exit(0);
}

// serve starts the page and serves it until SIGTERM or SIGINT.
async function serve(argv: string[]): Promise<void> {
  const { Command, InvalidArgumentError } = await import("commander");
  const whole = (value: string) => {
    const n = Number(value);
    if (!Number.isInteger(n) || n < 0 || n > 65535) throw new InvalidArgumentError("expected a port number.");
    return n;
  };
  const program = new Command("admin.ts")
    .description("The operator page: see, search, retry and replay deliveries in a browser.")
    .option("--db <path|url>", `database file, or a postgres:// URL (default: INBOX_DB, else ${DEFAULTS.db})`)
    .option("--port <port>", "port to listen on; 0 picks a free one", whole, DEFAULTS.adminPort)
    .option("--host <address>", "address to listen on; beyond loopback only with --admin-token", DEFAULTS.host)
    .option("--admin-token <token|env:NAME>", "the token exchanged for a session cookie (env:NAME reads it from $NAME)")
    .option("--read-only", "show everything, refuse every action")
    .option(
      "--sources <file>",
      "the sources file (as the worker's): pause and resume are told to its $operator URL, a delivery's page previews what it would send while the database has no configuration, no secret it names is ever shown, and relative transform paths start from its folder (default: INBOX_SOURCES)",
    )
    .option(
      "--secrets-key-file <file>",
      "the key that seals and opens the secret store's values (PUT /api/v1/secrets), instead of INBOX_SECRETS_KEY",
    )
    .addHelpText(
      "after",
      `
Examples:
  npx tsx admin.ts --db inbox.db
  ADMIN_TOKEN=$(openssl rand -hex 16) npx tsx admin.ts --admin-token env:ADMIN_TOKEN --host 0.0.0.0
  npx tsx admin.ts --db inbox.db --sources sources.json
  npx tsx admin.ts --db postgres://127.0.0.1:5432/test?schema=inbox --read-only`,
    )
    .showHelpAfterError("(run with --help for usage)");
  speakTo(program, argv);
  program.exitOverride((error) => process.exit(error.exitCode === 0 ? 0 : 2));
  await program.parseAsync(argv);
  const opts = program.opts<{
    db?: string;
    port: number;
    host: string;
    adminToken?: string;
    readOnly?: boolean;
    sources?: string;
    secretsKeyFile?: string;
  }>();
  let token = opts.adminToken;
  if (token?.startsWith("env:")) {
    const name = token.slice(4);
    token = process.env[name];
    if (!token) throw new StartupError(`admin: --admin-token env:${name}, but $${name} is empty or unset`);
  }
  if (!isLoopback(opts.host) && !token) {
    throw new StartupError(
      `admin: refusing to listen on ${opts.host} without --admin-token: the page must not be open beyond this machine`,
    );
  }
  // The sources file's secrets are read, as the worker reads them, only to keep them off the page.
  const sourcesFile = opts.sources ?? process.env.INBOX_SOURCES;
  let forwarding: Forwarding | undefined;
  let config: unknown;
  let brokers: (() => Promise<BrokerLine[]>) | undefined;
  if (sourcesFile) {
    try {
      config = readSourcesFile(sourcesFile);
      forwarding = loadDestinations(config, process.env);
      const withBroker = brokerSourcesOf(config);
      // Asked at most every few seconds, however often the overview refreshes.
      let last: { at: number; lines: Promise<BrokerLine[]> } | undefined;
      if (withBroker.length > 0)
        brokers = () => {
          if (!last || performance.now() - last.at > DEFAULTS.consumeLagEveryMs)
            last = { at: performance.now(), lines: brokerLines(withBroker) };
          return last.lines;
        };
    } catch (error) {
      throw new StartupError(`admin: ${sourcesFile}: ${message(error)}`);
    }
  }
  const target = opts.db ?? process.env.INBOX_DB ?? DEFAULTS.db;
  // What the operator hands a configuration changed through the API (lib/config/trust.ts): the names it may
  // read, where it may connect, and the key of the secret store; the inbox joins it once open.
  const startup = new Startup({
    script: "admin",
    argv,
    say: (line) => console.error(line),
    door: { connect, isPostgresUrl },
    env: process.env,
    keyFile: opts.secretsKeyFile,
    ownPorts: [opts.port],
  });
  const inbox = await startup.database(() => connect(target));
  const host = { ...startup.host, inbox };
  const { log, flush } = lineLog();
  const operator = forwarding?.operator;
  const base = sourcesFile ? dirname(resolve(sourcesFile)) : process.cwd();
  const sandbox = new Sandbox({ threads: DEFAULTS.previewsAtOnce });
  const gate = previewGate();
  const admin = createAdmin({
    inbox,
    token,
    readOnly: opts.readOnly,
    audit: log,
    hide: forwarding ? secretsOf(forwarding, { sources: knownSources(config) }) : [],
    destinations: [...(forwarding?.destinations.keys() ?? [])],
    // A configuration applied through the API is checked as `config apply` checks one, its own parts held to
    // the operator's rule: its secrets read from this environment and the store, its transforms from the
    // folder a worker reads them from.
    host,
    base,
    ...(brokers ? { brokers } : {}),
    ...(operator ? { announce: (event) => announce(operator, event) } : {}),
    // The configuration in force, which the API may have changed since start; the --sources file only while
    // none was ever applied.
    // Transforms run in one sandbox for all previews, a few at once (previewGate), so a read key cannot spend
    // this host; a module file changed since it was applied is not run.
    preview: (rows: readonly Delivery[], options: { to?: string } = {}) =>
      gate(async () => {
        const stored = await inbox.readConfig();
        const against = stored ? (JSON.parse(stored.document) as unknown) : config;
        if (against === undefined)
          throw new TypeError(
            "there is nothing to preview against: no configuration was applied to this inbox, and admin.ts has no --sources",
          );
        const applied = stored?.transforms ?? {};
        return preview(rows, against, {
          base,
          sandbox,
          drift: (m) => (applied[m] ? transformDrift({ [m]: applied[m] }, base) : undefined),
          ...options,
        });
      }),
  });
  const stopped = startup.stopped();
  let url: string;
  try {
    url = await listenAdmin(admin, { host: opts.host, port: opts.port, token });
  } catch (error) {
    throw new StartupError(`admin: cannot listen on ${opts.host}:${opts.port}: ${message(error)}`, 1);
  }
  console.log(
    `Operator page on ${url}${opts.readOnly ? " (read-only)" : ""}${token ? "" : " (no token: loopback only)"}`,
  );
  // Without a token any process on this host acts as the operator: fine on a laptop, not on a server.
  if (!token && beyondLaptop(process.env))
    console.error(
      "admin: warning: no --admin-token, so any process on this host that reaches the page acts as the operator through it; production units set one (docs/security.md)",
    );
  await stopped;
  admin.server.close();
  await sandbox.close();
  admin.server.closeAllConnections();
  await inbox.close();
  flush();
}

// beyondLaptop says whether this looks like a server rather than a developer's laptop: started by systemd,
// in a Kubernetes pod, or told it is production.
function beyondLaptop(env: NodeJS.ProcessEnv): boolean {
  return env.INVOCATION_ID !== undefined || env.KUBERNETES_SERVICE_HOST !== undefined || env.NODE_ENV === "production";
}

// knownSources are the sources file's sources with the signing secrets this environment has, for the page to
// hide: it verifies no signature, so a secret not set here must not stop it, and one that is set is hidden.
function knownSources(config: unknown): Source[] {
  try {
    return [...loadSources(config, process.env, { verify: false }).values()];
  } catch {
    return [];
  }
}

// brokerSourcesOf lists the sources file's broker sources: a file whose sources cannot be read shows none.
function brokerSourcesOf(config: unknown): Source[] {
  return knownSources(config).filter((s) => s.broker);
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) await main(process.argv);

// Try:
//   npx tsx demo.ts && npx tsx admin.ts          then open http://127.0.0.1:8001
//   npx tsx admin.ts --host 0.0.0.0              refused: no token
//   ADMIN_TOKEN=s3cret npx tsx admin.ts --admin-token env:ADMIN_TOKEN --read-only

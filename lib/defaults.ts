// defaults.ts: every default of the suite in one place, each documented where it is declared. Only the
// entry points (the scripts) read env and argv, falling back to these; nothing underneath reads either.
// Not run on its own.

/** DEFAULTS holds every default of the suite; the entry points read env and argv, nothing else does. */
export const DEFAULTS = {
  /** Database file, when neither --db nor INBOX_DB is given. @default "inbox.db" */
  db: "inbox.db",
  /** Source name of the article's single, unsigned sender. @default "default" */
  source: "default",
  /** The destination of every route not told otherwise: the TypeScript handler that worker.ts runs. @default "handler" */
  destination: "handler",
  /** Milliseconds a worker may hold a delivery before another may take it over. @default 60_000 */
  leaseMs: 60_000,
  /** Tries before a delivery is set aside as failed for a person to look at. @default 5 */
  maxAttempts: 5,
  /** Milliseconds before the first retry; each later retry waits twice as long. @default 2_000 */
  retryDelayMs: 2_000,
  /** Longest wait between two tries, whatever the doubling says. @default 3_600_000 */
  retryCapMs: 3_600_000,
  /** Up to this fraction is added at random to each backoff, so failed deliveries don't retry in step. @default 0.2 */
  retryJitter: 0.2,
  /** WAL pages after which a commit also checkpoints (see openDatabase). @default 4_000 */
  walAutocheckpointPages: 4_000,
  /** Milliseconds a writer waits for SQLite's lock before giving up with SQLITE_BUSY. @default 5_000 */
  busyTimeoutMs: 5_000,
  /**
   * The start-up quick_check of a SQLite file runs when its last one is older than this, or after an
   * unclean stop, not at every start: a cron `worker --once` would otherwise read every page every run.
   * @default 86_400_000 (a day)
   */
  fullCheckEveryMs: 86_400_000,
  /**
   * KiB of SQLite page cache for the receiver's connection, which only appends deliveries: a quarter of
   * the 16 MB the worker's claims want, and that much less memory held (bench/ingest prints the RSS). @default 4_000
   */
  receiverPageCacheKb: 4_000,
  /** Most deliveries or completions committed in one transaction. @default 512 */
  batchSize: 512,
  /** Longest delivery ID accepted, in characters. @default 256 */
  maxIdLength: 256,
  /** Largest body accepted, in bytes. @default 1_000_000 */
  maxBodyBytes: 1_000_000,
  /** Receiver port. @default 8000 */
  port: 8000,
  /** Receiver address; loopback unless told otherwise. @default "127.0.0.1" */
  host: "127.0.0.1",
  /**
   * Requests whose body is complete and whose store has not yet answered, past which the receiver answers
   * 503: it bounds what waits on the disk. A body still arriving does not count (the limits below bound
   * those), so senders that stall cannot fill it. @default 2_048
   */
  maxInFlight: 2_048,
  /**
   * Milliseconds a client may take to send its headers; node:http closes the connection past it (checked
   * once a second). Defends against slowloris: connections held open by headers that never end. @default 10_000
   */
  headersTimeoutMs: 10_000,
  /**
   * Milliseconds a body may take before it must keep up minBodyRate: the body must have arrived at
   * minBodyRate bytes a second after this grace, or it is answered 408 and its connection closed. So a whole
   * body of maxBodyBytes may take bodyTimeoutMs + maxBodyBytes / minBodyRate, and a sender that stalls
   * mid-body holds its connection a few seconds, not for as long as it likes. @default 5_000
   */
  bodyTimeoutMs: 5_000,
  /**
   * Bytes a second a body must average once bodyTimeoutMs has passed (Apache's mod_reqtimeout rule). A
   * provider in a datacenter sends a 1 MB body in well under a second; trickling it costs an attacker this
   * much bandwidth per connection held. @default 16_000
   */
  minBodyRate: 16_000,
  /**
   * Connections one client address may hold open at once; past it a new one is closed as it is accepted.
   * Defends against one host opening thousands of sockets (each is cheap to open and costs the receiver
   * memory until a timeout closes it). Providers deliver over a few dozen; the benchmarks over at most 128.
   * @default 256
   */
  maxConnectionsPerIp: 256,
  /**
   * The request header a trusted reverse proxy sets to the client's address (its last value is used, the
   * one the proxy appended), so that maxConnectionsPerIp counts the clients' requests rather than the
   * proxy's connections. Empty: the TCP peer's address. Set it only when the port is reachable through the
   * proxy alone, or anyone can pick their own address. @default ""
   */
  clientIpHeader: "",
  /** Seconds a rejected sender is asked to wait, in Retry-After. @default 5 */
  retryAfterS: 5,
  /** Seconds a signed timestamp may be off (Stripe: old) before a delivery counts as replayed. @default 300 */
  signatureToleranceS: 300,
  /** Handlers a worker runs at once. @default 8 */
  concurrency: 8,
  /** Most deliveries a worker claims in one transaction while its handlers are fast (see worker.ts). @default 256 */
  claimBatch: 256,
  /**
   * claimBatch on PostgreSQL, where a claim runs beside the handlers and each claim and each batch of done
   * marks is a transaction of several round trips: 512 spent 41–42 µs of the server's CPU a delivery
   * against 44–47 at 256 in a 200k drain, and drained 8–17% faster (docs/performance.md). @default 512
   */
  claimBatchPostgres: 512,
  /** Shortest and longest pause between claims when the queue is idle. @default 5, 50 */
  pollMinMs: 5,
  pollMaxMs: 50,
  /** Milliseconds a stopping worker lets work in flight finish before releasing it. @default 10_000 */
  shutdownGraceMs: 10_000,
  /**
   * PostgreSQL connections each process holds: group commits run on up to this many at once, and one
   * more listens for wake-ups. Ten hosts of two processes each stay well under max_connections (100).
   * @default 4
   */
  poolSize: 4,
  /**
   * PostgreSQL transactions of stores alone (a receiver's batches) in flight at once: two, so that one
   * batch's insert runs while the last one's COMMIT waits for its flush, and the COMMITs share flushes.
   * More, each smaller, cost more CPU per delivery on both sides and flushed no more at once.
   * @default 2
   */
  storeBatchesInFlight: 2,
  /**
   * On PostgreSQL a worker's claim starts where its last one ended in the due index, and from the start at
   * least this often, so that a delivery left behind (its row was locked by a claim that then rolled back)
   * waits no longer than this under a backlog that never runs dry. @default 2_000
   */
  claimFromStartMs: 2_000,
  /** Milliseconds to wait for a PostgreSQL connection before a store fails (and the receiver answers 503). @default 5_000 */
  connectTimeoutMs: 5_000,
  /** Shortest pause between two wake-up NOTIFYs from one process: NOTIFY takes a global lock at commit. @default 25 */
  notifyEveryMs: 25,
  /** Milliseconds a scrape of /metrics reuses the queue's gauges before reading them again. @default 5_000 */
  gaugeCacheMs: 5_000,
  /** Milliseconds /readyz reuses the store's last readiness probe. @default 1_000 */
  readyCacheMs: 1_000,
  /** Milliseconds a readiness probe may take before the store counts as unreachable. @default 1_000 */
  readyTimeoutMs: 1_000,
  /** Deliveries a bulk command (retry, replay, purge by name, export, import) touches per transaction, so none waits behind it long. @default 500 */
  bulkBatch: 500,
  /** Age after which purge drops the body of a done delivery, keeping its tombstone. @default 7 days */
  bodiesAfterMs: 7 * 86_400_000,
  /**
   * Age after which purge forgets a tombstone, and with it the ID: a copy that arrives later is stored as
   * new. Longer than any sender resends (Stripe 3 days, GitHub 3, GHES 7, Svix's manual resend at will).
   * @default 30 days
   */
  forgetAfterMs: 30 * 86_400_000,
  /**
   * Deliveries purge changes per transaction, so no ack waits long behind it: 100, not 500, as the
   * 500-row batches' commits (2 MB of WAL each) raised the ack p99 in bench/purge.ts. A batch of 100 holds
   * SQLite's write lock 2.5 ms at the median (inbox.ts purge and worker.ts --purge-every commit it without
   * an fsync in the lock: syncOffLoop).
   * @default 100
   */
  purgeBatch: 100,
  /**
   * After each batch, purge rests this many times as long as the batch took, leaving the write lock and
   * the disk to acks in between (bench/purge.ts measures the ack p99 with and without). On SQLite a day of a
   * million took 241–318 s at ×1, half of it resting, and the median window's ack p99 was still ×1.76 of
   * none with the machine quiet: one ack in nine meets a batch (its lock, then an fdatasync queued behind the
   * checkpoints of its pages), still one in twenty at ×4, and a p99 moves only once under 1% do, near ×30
   * (docs/operations.md#why-the-acks-slow-on-sqlite).
   * @default 1
   */
  purgeRest: 1,
  /**
   * PostgreSQL: the days ahead of today for which each body's partition is made, at open and at every purge,
   * so that a day's bodies land in a table purge can drop whole (docs/operations.md#retention-by-period);
   * bodies of a day with no partition go to the default one and are purged row by row. @default 3
   */
  periodsAhead: 3,
  /**
   * PostgreSQL: a body up to this many bytes stays in its delivery's row rather than delivery_bodies
   * (docs/table.md#bodies-apart). Under it, copying the body with each state change costs less than a second
   * table's insert and lookup: a row is about 250 bytes without it. @default 256
   */
  inlineBodyBytes: 256,
  /**
   * PostgreSQL: how long purge waits for the lock that releases a day of bodies (its DETACH) before it gives up
   * and tries again after a rest: a DETACH waiting on a transaction in flight holds up every store queued
   * behind it, 772 ms at the worst in bench/purge.ts before this bound. @default 100
   */
  periodLockMs: 100,
  /**
   * PostgreSQL: pages of a day's table a release reads at a time for its counts (the day's done rows, its bodies'
   * bytes), resting DEFAULTS.purgeRest times as long after each: 16 MB, a few milliseconds of a core, where the
   * day read in one go held a core and the disk for a quarter of a second at a million rows. @default 2048
   */
  releaseReadPages: 2048,
  /**
   * PostgreSQL: the statistics target of the ANALYZE a day's release runs of its finished times and statuses, a
   * sample of 300 rows a unit: 3,000 rows, where the default 100 read 30,000 at random, the release's slowest acks
   * after its DROP (docs/operations.md#what-the-acks-still-waited-for). @default 10
   */
  releaseStatisticsTarget: 10,
  /** PostgreSQL: how many times purge tries a day's release before leaving it to the next purge. @default 10 */
  periodLockTries: 10,
  /**
   * PostgreSQL: keys copied into delivery_keys per transaction by the upgrade's copy ahead of the split
   * (docs/table.md#the-upgrade). A delete of an old row waits for the batch that copied its key to commit, no
   * more; a store never waits for it. @default 50_000
   */
  keysCopyBatch: 50_000,
  /**
   * PostgreSQL: how long a host rests between two asks for the lock of the failed rows' index built ahead
   * (docs/table.md#built-ahead) while another host builds it. It asks, not waits: a statement waiting for the lock
   * is a transaction the other's CREATE INDEX CONCURRENTLY waits for, a deadlock. @default 100
   */
  indexAheadRestMs: 100,
  /**
   * PostgreSQL: how many times a claim, a bulk retry or replay's batch, or a purge's batch is run again when it
   * met a row that another transaction's commit had just moved between delivery_rows' partitions (SQLSTATE 40001,
   * docs/table.md#hot-and-cold); each run reads afresh, so a second one finds the row where it went. @default 5
   */
  movedTries: 5,
  /**
   * PostgreSQL: the first claim in a process that takes at least this many deliveries has the hot partition
   * analyzed, where it never was (docs/table.md#hot-and-cold): before autovacuum first analyzes it, the done
   * marks' plan took a fresh backlog for a row and compared every mark with every backlog row. @default 100
   */
  analyzeHotAt: 100,
  /**
   * PostgreSQL: how many UTC days a list (search() of rows, no body read) reads one statement each, newest first,
   * before it reads all that is older in one: a day's statement plans and opens that day's partition alone, where
   * one over every day read each day's index for its newest row (docs/performance.md#lists-at-ten-million). Two,
   * so that a list whose bound falls early in a day fills its page from the day before. @default 2
   */
  listDays: 2,
  /**
   * Free pages SQLite's incremental vacuum gives back to the file system per transaction (400 KB at 4 KB): 100,
   * not 1000, as a step that moves live pages from the file's end into the holes holds the write lock about
   * 40 µs a page, and the 1000-page steps held it up to 170 ms, each one an ack's stall (bench/purge.ts).
   * @default 100
   */
  vacuumStepPages: 100,
  /** Minutes between two purges of a worker started with --purge-every and no number. @default 60 */
  purgeEveryMinutes: 60,
  /** Deliveries search() returns when no limit is given. @default 50 */
  searchLimit: 50,
  /**
   * The largest body the search indexes hold (bodyJson, bodyWords), in bytes: a larger one, or one that is not
   * JSON, is found by its ID and metadata only. Fixed in each backend's search migration when it runs, so a new
   * value needs a new migration (test/search.test.ts holds the two together). @default 65_536
   */
  searchBodyBytes: 65_536,
  /**
   * How far back a list that looks for a substring of the body (bodyContains, which no index serves) reads when
   * it names no start (since): it reads every body in that window. @default 86_400_000 (a day)
   */
  bodyContainsWindowMs: 86_400_000,
  /**
   * PostgreSQL: the longest a body search (bodyJson, bodyWords, bodyContains) of search() or count() may run
   * before the server stops it (SET LOCAL statement_timeout) and it fails with SearchTooBroad. 10 s lets
   * through every search measured as one an operator means at ten million (a needle of one match at most
   * 152 ms cold; a repository's 33,000 pushes 2.5 s warm; a day of body contains 8.2 s warm) and stops a
   * search whose every word is common, which scanned for minutes (docs/performance.md#body-search-at-ten-million).
   * SQLite has no bound: node:sqlite cannot interrupt a statement. @default 10_000
   */
  searchTimeoutMs: 10_000,
  /**
   * PostgreSQL: a body search (bodyJson, bodyWords) with more matches than this walks back from its newest hour, a
   * window of hours or days a statement, until its page is full (lib/postgres/searchwalk.ts); one with fewer
   * reads its matches at once. Counting them rechecks up to one more than this, so it is about a page. @default 50
   */
  searchWalkAbove: 50,
  /**
   * On SQLite, a body search walks when its matches² pass the rows stored over this, and it has more than
   * searchWalkAbove (lib/sqlite/searchwalk.ts searchWalkAt()): a sort reads each match's row anywhere in the file,
   * a walk about rows / matches entries of the time index for each row it keeps. @default 4
   */
  searchWalkEntries: 4,
  /**
   * Rows per transaction when `inbox.ts search enable` indexes the rows already stored: writers wait for one
   * batch at most (tens of milliseconds on SQLite, docs/performance.md). @default 1_000
   */
  searchBackfillBatch: 1_000,
  /**
   * Rows per transaction when the body search index catches up with what was stored since (Inbox.indexSearch():
   * the worker's tick, and a search before it reads): a writer waits for one such batch at most. @default 1_000
   */
  searchIndexBatch: 1_000,
  /** Milliseconds between two of the worker's catch-ups of the body search index (worker.ts). @default 1_000 */
  searchIndexEveryMs: 1_000,
  /** The operator page's port (admin.ts), apart from the receiver's: providers reach one, people the other. @default 8001 */
  adminPort: 8001,
  /** Deliveries on one page of the operator page's list. @default 50 */
  adminPageSize: 50,
  /** Deliveries (or audit entries) on one page of the API's lists when the caller names no limit. @default 100 */
  apiPageSize: 100,
  /** The most a caller of the API may ask for on one page. @default 1_000 */
  apiMaxPage: 1_000,
  /** Milliseconds the API keeps a POST's first answer under its Idempotency-Key (at least 24 h). @default 86_400_000 */
  apiIdempotencyMs: 86_400_000,
  /** Milliseconds between two refreshes of the overview while its tab is in sight. @default 5_000 */
  adminRefreshMs: 5_000,
  /** Forwarding: milliseconds to open a connection to a destination. @default 5_000 */
  connectTimeoutForwardMs: 5_000,
  /** Forwarding: milliseconds a whole forward may take, answer included, before it counts as failed. @default 30_000 */
  forwardTimeoutMs: 30_000,
  /**
   * Filters: characters that one route filter's `$regex` tests may read of one delivery, all its strings
   * together; a delivery that would make it read more does not match that filter. `$regex` runs on RE2
   * (re2js), in time linear in what it reads, so this bounds one filter's regex work. @default 100_000
   */
  filterRegexChars: 100_000,
  /** Filters: largest body, in bytes, that a body filter parses; a larger one is, to filters, not JSON. @default 1_000_000 */
  filterBodyBytes: 1_000_000,
  /** Filters: deepest nesting of lists and objects a body filter parses; a deeper body is, to filters, not JSON. @default 64 */
  filterDepth: 64,
  /** Forwarding: milliseconds a transform may run for one forward before its process is killed and the try fails (a route's "transformTimeout"). @default 1_000 */
  transformTimeoutMs: 1_000,
  /** Forwarding: milliseconds a transform module may take to load in its process. @default 10_000 */
  transformLoadMs: 10_000,
  /** Forwarding: megabytes of V8 heap a transform's process may use (its --max-old-space-size); past it V8 ends the process and the try fails. @default 256 */
  transformHeapMb: 256,
  /** Forwarding: megabytes of memory in all (RSS: heap, Buffers, native) a transform's process may use before it is killed and the try fails (worker.ts --transform-memory). @default 512 */
  transformMemoryMb: 512,
  /** Forwarding: milliseconds between two looks at a transform process's memory (Linux's /proc). @default 25 */
  transformWatchMs: 25,
  /** Sandbox: megabytes of WebAssembly memory each sandbox thread's engine has, which holds all a call makes (objects, strings and ArrayBuffers alike); past it the call stops and the try fails. @default 64 */
  sandboxMemoryMb: 64,
  /** Sandbox: threads that run sandboxed transforms in one process, so one transform's loop holds one thread, never the event loop or the others. @default 2 */
  sandboxThreads: 2,
  /** Sandbox: milliseconds past a call's own time limit after which its thread is ended from outside, for a call stuck where QuickJS's interrupt is not asked. @default 1_000 */
  sandboxGraceMs: 1_000,
  /** Sandbox: calls one QuickJS context runs before it is made afresh: a transform's code is evaluated once per context, and what its module's top level holds carries from one call to the next for at most this many (a failed call ends its context at once). A context costs about 5 ms to make and lock (bench/sandbox.ts's fresh side), about 5 µs a call at 1,000 against 50 at 100. @default 1_000 */
  sandboxContextCalls: 1_000,
  /** Sandbox: contexts (one per transform code) each sandbox thread keeps between calls, the least recently used ended first. @default 4 */
  sandboxContextsKept: 4,
  /** Sandbox: largest transform code, in bytes, as Hookdeck allows. @default 5_000_000 */
  sandboxCodeBytes: 5_000_000,
  /** Sandbox: previews that run transforms at once on the page's host (admin.ts); past it a preview is answered 503 with Retry-After. @default 2 */
  previewsAtOnce: 2,
  /** Forwarding: requests one worker has in flight to one destination. @default 16 */
  forwardInFlight: 16,
  /** Forwarding: the first bytes of a failed answer kept with the try's error. @default 256 */
  answerBytes: 256,
  /** Forwarding: the first bytes of every answer's body kept in the delivery's attempt log (docs/forwarding.md#the-attempt-log). @default 4096 */
  attemptBodyBytes: 4096,
  /** The attempt log: tries kept per delivery and destination; the oldest go as new ones come. @default 20 */
  attemptsKept: 20,
  /** Breaker: failures in a row, by every worker, that open a destination. @default 10 */
  breakerFailures: 10,
  /** Breaker: or this share of failed tries in the window... @default 0.5 */
  breakerRate: 0.5,
  /** Breaker: ...with at least this many tries in it. @default 20 */
  breakerMinTries: 20,
  /** Breaker: the window's length. @default 60_000 */
  breakerWindowMs: 60_000,
  /** Breaker: how long an open destination waits before one delivery probes it. @default 30_000 */
  breakerCoolDownMs: 30_000,
  /** Milliseconds a worker gathers its destinations' successes before adding them to the shared breaker. @default 1_000 */
  tallyEveryMs: 1_000,
  /**
   * Forwarding: how often a lane whose destination it saw open or paused asks whether it may go again (a
   * probe due, a resume, another worker's probe that closed it); polling at pollMaxMs instead cost a
   * destination that is down a few percent of a worker's CPU. @default 1_000
   */
  heldPollMs: 1_000,
  /** Milliseconds a broker destination waits to connect, and for each PubAck or publisher confirm (brokers.ts). @default 5_000 */
  brokerTimeoutMs: 5_000,
  /** A NATS destination's server, when its settings give no url. @default "nats://127.0.0.1:4222" */
  natsUrl: "nats://127.0.0.1:4222",
  /** A RabbitMQ destination's server, when its settings give no url: RabbitMQ's own guest on this host. @default "amqp://guest:guest@127.0.0.1:5672" */
  rabbitmqUrl: "amqp://guest:guest@127.0.0.1:5672",
  /** Reconcile: how far back `inbox.ts reconcile` looks when no --since is given (Stripe keeps events 30 days, GitHub deliveries 3). @default 259_200_000 */
  reconcileSinceMs: 259_200_000,
  /** Reconcile: events or deliveries asked for per page (the most either API gives). @default 100 */
  reconcilePage: 100,
  /** Reconcile: tries of one API call, rate limits and outages included, before the run stops. @default 6 */
  reconcileTries: 6,
  /** Reconcile: the first wait after a failed call with no Retry-After; it doubles each try. @default 1_000 */
  reconcileBackoffMs: 1_000,
  /** Reconcile: the longest wait for one call, whatever the provider asks (a reset an hour off stops the run instead). @default 300_000 */
  reconcileMaxWaitMs: 300_000,
  /**
   * A broker source's messages delivered and not yet acknowledged, at most: a JetStream consumer's
   * max_ack_pending, a RabbitMQ channel's prefetch (consume.ts). Enough to fill a group commit or two. @default 512
   */
  consumePrefetch: 512,
  /**
   * Milliseconds a JetStream source's consumer, when consumer.ts creates it, waits for an ack before it
   * delivers a message again (ack_wait); a store that takes a third of it sends AckProgress. @default 30_000
   */
  consumeAckWaitMs: 30_000,
  /** Milliseconds a broker source waits before it connects again, and a message whose store failed is delivered again. @default 1_000 */
  consumeReconnectMs: 1_000,
  /**
   * Milliseconds between two reads of a broker source's lag (RabbitMQ's queue depth, JetStream's pending),
   * each also a check of its JetStream consumer's settings. @default 5_000
   */
  consumeLagEveryMs: 5_000,
  /**
   * Milliseconds a broker source may take nothing while its broker holds messages for it before it is
   * starved: unhealthy on /readyz, 2 in inbox_consumer_state (consumer.ts --starved-after). @default 300_000
   */
  consumeStarvedAfterMs: 300_000,
  /**
   * Milliseconds between a running receiver's or worker's reads of the configuration's version (lib/config/):
   * a change committed elsewhere is taken up within this and the time to load it, under the two seconds
   * promised. On PostgreSQL the commit's NOTIFY takes it up at once; the timer is for a dropped LISTEN. @default 1_000
   */
  configCheckMs: 1_000,
  /**
   * The runtime's timer limit: a setTimeout past 2^31 - 1 ms fires at once (Node clamps it to 1 ms), so no
   * duration a document sets may pass it. @default 2_147_483_647 (24.8 days)
   */
  maxTimerMs: 2_147_483_647,
  /**
   * The longest forward a destination may ask for ("timeout", "connectTimeout"): a forward holds its lease
   * meanwhile, renewed by the heartbeat, and a worker stopping waits for it. @default 900_000 (15 minutes)
   */
  maxForwardTimeoutMs: 900_000,
  /** The longest a transform may run for one forward ("transformTimeout"): it runs inside the forward's own time. @default 60_000 */
  maxTransformTimeoutMs: 60_000,
  /** The longest breaker window or cool-down a destination may set ("breaker.window", "breaker.coolDown"). @default 86_400_000 (a day) */
  maxBreakerMs: 86_400_000,
  /** The most a destination's breaker may count to ("breaker.failures", "breaker.minTries"). @default 1_000_000 */
  maxCount: 1_000_000,
  /** The highest rate (forwards a second) and burst a destination may set. @default 100_000 */
  maxRate: 100_000,
  /** The most forwards one worker may hold in flight to one destination ("maxInFlight"). @default 1_000 */
  maxForwardInFlight: 1_000,
  /** The widest a signed timestamp's tolerance may be set ("tolerance", seconds). @default 86_400 (a day) */
  maxToleranceS: 86_400,
  /** The longest a broker may take to connect or confirm ("timeoutMs" of a broker destination or source). @default 300_000 */
  maxBrokerTimeoutMs: 300_000,
  /** The longest ack wait a JetStream source may set ("ackWaitMs"). @default 43_200_000 (12 hours) */
  maxAckWaitMs: 43_200_000,
  /** The largest value a secret of the store may hold, in bytes (a PEM private key fits). @default 16_384 */
  maxSecretBytes: 16_384,
} as const;

// test/ops.test.ts: the operator's files in ops/ held to the code. The alert rules (ops/alerts.yml) pass
// promtool's check and their own unit tests (ops/alerts.test.yml), with a firing case and a control for
// every alert; the rules and the Grafana dashboard (ops/dashboard.json) name only metrics and labels that a
// real receiver.ts and worker.ts expose, on both backends, so a renamed metric fails here; and every
// dashboard query parses and returns series when Prometheus is fed those processes' own scrapes.
// promtool (Debian's prometheus package) is optional: without it its checks are skipped with one line,
// and INBOX_REQUIRE_PROMTOOL=1 (as .ci/run sets it) makes them mandatory.
//   npx node --import tsx --test test/ops.test.ts

import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { once } from "node:events";
import { readFileSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { parser } from "@prometheus-io/lezer-promql";
import parse from "parse-prometheus-text-format";
import { parse as parseYaml, stringify as yaml } from "yaml";
import { connect } from "../inbox.ts";
import { reasonOf } from "../lib/metrics.ts";
import { sign } from "../lib/providers.ts";
import { STATUSES } from "../lib/store.ts";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { connect as natsConnect } from "@nats-io/transport-node";
import { ROOT, backends, freePort, NATS, natsSkip, spawnScript, startReceiver, tempDir, until } from "./helpers.ts";

const ALERTS = join(ROOT, "ops", "alerts.yml");
const ALERT_TESTS = join(ROOT, "ops", "alerts.test.yml");
const DASHBOARD = join(ROOT, "ops", "dashboard.json");

/** PROMTOOL is the promtool the checks run: INBOX_PROMTOOL, else the one on PATH. */
const PROMTOOL = process.env.INBOX_PROMTOOL ?? "promtool";

// promtoolSkip is false when promtool runs, else the reason to skip, said once; required, it throws.
const promtoolSkip: string | false = (() => {
  const probe = spawnSync(PROMTOOL, ["--version"], { encoding: "utf8" });
  if (probe.status === 0) return false;
  const why = `no promtool (${PROMTOOL}: ${probe.error?.message ?? `exit ${probe.status}`})`;
  if (process.env.INBOX_REQUIRE_PROMTOOL === "1") throw new Error(`INBOX_REQUIRE_PROMTOOL=1 but ${why}`);
  console.log(`# promtool checks of ops/ skipped: ${why}; apt-get install -y prometheus to run them.`);
  return why;
})();

// Metrics the files may name that no inbox process exposes, each with why.
const FOREIGN_METRICS: ReadonlyMap<string, string> = new Map([
  ["up", "Prometheus's own, one per scrape target: 1 when the scrape worked"],
]);
// Labels Prometheus adds to every scraped series, and the histogram's bucket bound.
const TARGET_LABELS = new Set(["job", "instance", "le"]);
// Label values that come from a fixed list in the code, checked against it; and labels whose values are
// checked against those the workload's scrapes show (its forwards are done, retried and set aside).
const KNOWN_VALUES: ReadonlyMap<string, ReadonlySet<string>> = new Map([
  ["status", new Set<string>(STATUSES)],
  ["reason", new Set([400, 401, 404, 413].map(reasonOf))],
]);
const SEEN_VALUES = new Set(["outcome"]);
// Dashboard queries that return nothing in a healthy run, each with why: they show data only after a fault.
const QUIET_IN_A_HEALTHY_RUN: ReadonlyMap<string, string> = new Map([
  ["inbox_leases_lost_total", "only a handler that outlives its lease loses it"],
]);

async function promtool(args: string[], cwd = ROOT): Promise<{ code: number | null; out: string }> {
  const child = spawn(PROMTOOL, args, { cwd, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  child.stdout.on("data", (d) => (out += d));
  child.stderr.on("data", (d) => (out += d));
  const code = await new Promise<number | null>((resolve) => child.on("close", resolve));
  return { code, out };
}

// ---- PromQL: what an expression selects, read with the grammar of Prometheus's own UI ----

interface Selector {
  name: string;
  matchers: { label: string; op: string; value: string }[];
}

/** Uses is what one expression reads: its selectors, the labels it groups by, and its syntax errors. */
interface Uses {
  selectors: Selector[];
  grouping: string[];
  errors: string[];
}

function uses(expr: string): Uses {
  const out: Uses = { selectors: [], grouping: [], errors: [] };
  const text = (n: { from: number; to: number }) => expr.slice(n.from, n.to);
  parser.parse(expr).iterate({
    enter(node) {
      if (node.type.isError)
        out.errors.push(
          `syntax error at ${node.from}: ${JSON.stringify(expr.slice(Math.max(0, node.from - 20), node.to + 20))}`,
        );
      if (node.name === "GroupingLabels") {
        for (let c = node.node.firstChild; c; c = c.nextSibling) if (c.name === "LabelName") out.grouping.push(text(c));
      }
      if (node.name !== "VectorSelector") return;
      const selector: Selector = { name: "", matchers: [] };
      const name = node.node.getChild("Identifier");
      if (name) selector.name = text(name);
      for (const m of node.node.getChild("LabelMatchers")?.getChildren("UnquotedLabelMatcher") ?? []) {
        const label = m.getChild("LabelName");
        const op = m.getChild("MatchOp");
        const value = m.getChild("StringLiteral");
        if (label && op && value)
          selector.matchers.push({ label: text(label), op: text(op), value: text(value).slice(1, -1) });
      }
      if (!selector.name) out.errors.push(`a selector without a metric name: ${text(node)}`);
      out.selectors.push(selector);
    },
  });
  return out;
}

// ---- What a real receiver and worker expose ----

/** Exposed is what processes' /metrics showed: every series name PromQL can select, and the labels seen on each. */
interface Exposed {
  names: Set<string>;
  labels: Map<string, Set<string>>;
  /** Every value seen per label name, across all series. */
  values: Map<string, Set<string>>;
  /** Each scrape's samples as plain series (histograms as _bucket, _sum, _count), for promtool's input. */
  scrapes: { job: string; instance: string; series: Map<string, number> }[];
}

function expose(into: Exposed, job: string, instance: string, text: string): void {
  const families = parse(text);
  for (const f of families) {
    const names =
      f.type === "HISTOGRAM"
        ? ["_bucket", "_sum", "_count"].map((s) => f.name + s)
        : f.type === "SUMMARY"
          ? [f.name, `${f.name}_sum`, `${f.name}_count`]
          : [f.name];
    for (const n of names) into.names.add(n);
  }
  // Read again without TYPE and HELP, every sample line is a series of its own, labels and all.
  const plain = parse(
    text
      .split("\n")
      .filter((l) => !l.startsWith("#"))
      .join("\n"),
  );
  const series = new Map<string, number>();
  for (const f of plain) {
    into.names.add(f.name);
    const seen = into.labels.get(f.name) ?? new Set<string>();
    into.labels.set(f.name, seen);
    for (const m of f.metrics) {
      const labels = { ...m.labels, job, instance };
      for (const [l, v] of Object.entries(m.labels ?? {})) {
        seen.add(l);
        into.values.set(l, (into.values.get(l) ?? new Set()).add(v));
      }
      series.set(
        `${f.name}{${Object.entries(labels)
          .map(([k, v]) => `${k}=${JSON.stringify(v)}`)
          .join(", ")}}`,
        Number(m.value),
      );
    }
  }
  into.scrapes.push({ job, instance, series });
}

/**
 * problems lists what an expression names that the processes do not expose: a metric no scrape has (nor
 * a rule records, nor FOREIGN_METRICS), a label that the metric's series never carry, a value outside the
 * code's own list.
 */
function problems(expr: string, exposed: Exposed, recorded: ReadonlySet<string> = new Set()): string[] {
  const u = uses(expr);
  const out = [...u.errors];
  const labelsOf = (name: string) => exposed.labels.get(name);
  const all = new Set<string>();
  for (const s of u.selectors) {
    const known = exposed.names.has(s.name) || recorded.has(s.name) || FOREIGN_METRICS.has(s.name);
    if (!known) out.push(`${s.name}: no such metric in a real scrape`);
    const labels = labelsOf(s.name);
    for (const l of labels ?? []) all.add(l);
    for (const m of s.matchers) {
      if (labels && !TARGET_LABELS.has(m.label) && !labels.has(m.label))
        out.push(`${s.name}{${m.label}}: no such label on it in a real scrape`);
      const values =
        KNOWN_VALUES.get(m.label) ??
        (SEEN_VALUES.has(m.label) ? (exposed.values.get(m.label) ?? new Set<string>()) : undefined);
      if (!values) continue;
      // A plain alternation (a|b|c) is checked value by value; another regular expression is left alone.
      const alternatives =
        m.op === "=" || m.op === "!=" ? [m.value] : /^[\w|-]+$/.test(m.value) ? m.value.split("|") : [];
      for (const v of alternatives)
        if (!values.has(v))
          out.push(`${s.name}{${m.label}${m.op}"${m.value}"}: ${v} is not one of ${[...values].join(", ")}`);
    }
  }
  for (const g of u.grouping) {
    if (!TARGET_LABELS.has(g) && !all.has(g) && u.selectors.every((s) => labelsOf(s.name)))
      out.push(`by (${g}): no metric it reads carries that label`);
  }
  return out;
}

// ---- The files ----

interface RuleFile {
  groups: {
    name: string;
    rules: { alert?: string; record?: string; expr: string; labels?: Record<string, string> }[];
  }[];
}
interface AlertCase {
  eval_time: string;
  alertname: string;
  exp_alerts: { exp_labels?: Record<string, string> }[];
}
interface RuleTests {
  rule_files: string[];
  tests: { name: string; alert_rule_test?: AlertCase[]; promql_expr_test?: unknown[] }[];
}
interface Dashboard {
  uid: string;
  title: string;
  templating: { list: { name: string; type: string; query?: string | { query: string }; allValue?: string }[] };
  panels: {
    id: number;
    type: string;
    title: string;
    gridPos: Record<string, number>;
    datasource?: { uid: string };
    targets?: { refId: string; expr: string; datasource?: { uid: string } }[];
  }[];
}

const rules = (): RuleFile => parseYaml(readFileSync(ALERTS, "utf8")) as RuleFile;
const ruleTests = (): RuleTests => parseYaml(readFileSync(ALERT_TESTS, "utf8")) as RuleTests;
const dashboard = (): Dashboard => JSON.parse(readFileSync(DASHBOARD, "utf8")) as Dashboard;
const recordedBy = (file: RuleFile) =>
  new Set(file.groups.flatMap((g) => g.rules.flatMap((r) => (r.record ? [r.record] : []))));

/** An alert is one rule of ops/alerts.yml, named by its alertname and severity (one name may have two). */
const alertKey = (name: string, severity: string | undefined) => `${name}/${severity ?? "-"}`;

/** gaps lists what ops/alerts.test.yml leaves out: an alert no case expects to fire, one with no control, a case for no alert. */
function gaps(file: RuleFile, tests: RuleTests): string[] {
  const cases = tests.tests.flatMap((t) => t.alert_rule_test ?? []);
  const out: string[] = [];
  for (const r of file.groups.flatMap((g) => g.rules)) {
    if (!r.alert) continue;
    const mine = cases.filter((c) => c.alertname === r.alert);
    const fires = (c: AlertCase) => c.exp_alerts.some((a) => a.exp_labels?.severity === r.labels?.severity);
    if (!mine.some(fires)) out.push(`${alertKey(r.alert, r.labels?.severity)}: no case where it fires`);
    if (!mine.some((c) => !fires(c)))
      out.push(`${alertKey(r.alert, r.labels?.severity)}: no control where it must not fire`);
  }
  const names = new Set(file.groups.flatMap((g) => g.rules.flatMap((r) => (r.alert ? [r.alert] : []))));
  for (const c of cases)
    if (!names.has(c.alertname)) out.push(`${c.alertname}: tested at ${c.eval_time}, but no such alert`);
  return out;
}

// Grafana's own variables get the value a 1-minute scrape interval gives them; the dashboard's, their "All".
function interpolate(expr: string, board: Dashboard): string {
  const values = new Map<string, string>([
    ["__rate_interval", "4m"],
    ["__interval", "1m"],
    ["__range", "1h"],
  ]);
  for (const v of board.templating.list) values.set(v.name, v.allValue ?? ".*");
  return expr.replace(/\$\{(\w+)\}|\$(\w+)|\[\[(\w+)\]\]/g, (whole, a?: string, b?: string, c?: string) => {
    const value = values.get((a ?? b ?? c)!);
    if (value === undefined) throw new Error(`${whole}: no such dashboard variable`);
    return value;
  });
}

const queries = (board: Dashboard) =>
  board.panels.flatMap((p) =>
    (p.targets ?? []).map((t) => ({
      where: `panel ${p.id} "${p.title}" ${t.refId}`,
      key: `panel_${p.id}_${t.refId}`,
      expr: interpolate(t.expr, board),
    })),
  );

/** variableQueries are the dashboard's label_values(metric, label) lookups, as the metric and label they read. */
const variableQueries = (board: Dashboard) =>
  board.templating.list.flatMap((v) => {
    const q = typeof v.query === "string" ? v.query : v.query?.query;
    const m = q === undefined || v.type !== "query" ? null : /^label_values\((\w+),\s*(\w+)\)$/.exec(q);
    return m ? [{ name: v.name, metric: m[1]!, label: m[2]! }] : [];
  });

/** inputSeries is the scrapes as promtool's input series: each process's first scrape at 0m, its last held at 1m and 2m. */
function inputSeries(exposed: Exposed): { series: string; values: string }[] {
  const input = new Map<string, (number | undefined)[]>();
  const byProcess = new Map<string, Exposed["scrapes"]>();
  for (const s of exposed.scrapes)
    byProcess.set(`${s.job}/${s.instance}`, [...(byProcess.get(`${s.job}/${s.instance}`) ?? []), s]);
  for (const [, scrapes] of byProcess) {
    const first = scrapes[0]!;
    const last = scrapes[scrapes.length - 1]!;
    input.set(`up{job="${first.job}", instance="${first.instance}"}`, [1, 1, 1]);
    for (const [series, value] of last.series) input.set(series, [first.series.get(series), value, value]);
  }
  const values = (vs: (number | undefined)[]) =>
    vs.map((v) => (v === undefined ? "_" : Number.isNaN(v) ? "NaN" : String(v))).join(" ");
  return [...input].map(([series, vs]) => ({ series, values: values(vs) }));
}

/**
 * evaluate runs promtool test rules on the scrapes at 2m: each expression is checked as promtool checks a
 * rule (so it must parse), then expected to give exactly the samples listed.
 */
async function evaluate(
  dir: string,
  exposed: Exposed,
  cases: { expr: string; exp_samples: { labels: string; value: number }[] }[],
) {
  writeFileSync(
    join(dir, "queries.yml"),
    yaml({ groups: [{ name: "queries", rules: cases.map((c, i) => ({ record: `query:${i}`, expr: c.expr })) }] }),
  );
  writeFileSync(
    join(dir, "queries.test.yml"),
    yaml(
      {
        rule_files: ["queries.yml"],
        evaluation_interval: "1m",
        tests: [
          {
            interval: "1m",
            input_series: inputSeries(exposed),
            promql_expr_test: cases.map((c) => ({ ...c, eval_time: "2m" })),
          },
        ],
      },
      { lineWidth: 0 },
    ),
  );
  const check = await promtool(["check", "rules", "queries.yml"], dir);
  if (check.code !== 0) return check;
  return promtool(["test", "rules", "queries.test.yml"], dir);
}

/** dataCheck expects each query to return at least one series from the scrapes (count clamped to 1), or none for the quiet ones. */
function dataCheck(dir: string, list: { expr: string }[], exposed: Exposed, quiet: (expr: string) => boolean) {
  return evaluate(
    dir,
    exposed,
    list.map((q) => ({
      expr: `clamp_max(count(${q.expr}), 1)`,
      exp_samples: quiet(q.expr) ? [] : [{ labels: "{}", value: 1 }],
    })),
  );
}

const quietIn = (expr: string) => uses(expr).selectors.some((s) => QUIET_IN_A_HEALTHY_RUN.has(s.name));

// ---- The tests ----

describe("ops/alerts.yml", () => {
  it("has a firing case and a control for every alert in ops/alerts.test.yml, and tests no alert it lacks", () => {
    const file = rules();
    assert.deepEqual(ruleTests().rule_files, ["alerts.yml"]);
    assert.deepEqual(gaps(file, ruleTests()), []);
    const alerts = file.groups.flatMap((g) => g.rules.filter((r) => r.alert));
    assert.ok(alerts.length >= 10, `expected the alerts, found ${alerts.length}`);
    for (const r of alerts) assert.match(r.labels?.severity ?? "", /^(warning|critical)$/, `${r.alert}: severity`);
  });

  it("control: an alert with no control, one that never fires, and a case for no such alert are each caught", () => {
    const file = rules();
    const edit = (change: (c: AlertCase) => void) => {
      const tests = ruleTests();
      for (const c of tests.tests.flatMap((t) => t.alert_rule_test ?? []))
        if (c.alertname === "InboxNotReady") change(c);
      return gaps(file, tests);
    };
    assert.deepEqual(
      edit((c) => (c.exp_alerts = [{ exp_labels: { severity: "critical" } }])),
      ["InboxNotReady/critical: no control where it must not fire"],
    );
    assert.deepEqual(
      edit((c) => (c.exp_alerts = [])),
      ["InboxNotReady/critical: no case where it fires"],
    );
    assert.deepEqual(
      edit((c) => (c.alertname = "InboxNotRedy")),
      [
        "InboxNotReady/critical: no case where it fires",
        "InboxNotReady/critical: no control where it must not fire",
        "InboxNotRedy: tested at 4m, but no such alert",
        "InboxNotRedy: tested at 10m, but no such alert",
      ],
    );
  });

  it("passes promtool check rules", { skip: promtoolSkip }, async () => {
    const r = await promtool(["check", "rules", ALERTS]);
    assert.equal(r.code, 0, r.out);
    assert.match(r.out, /SUCCESS/);
  });

  it("passes its own unit tests: promtool test rules ops/alerts.test.yml", { skip: promtoolSkip }, async () => {
    const r = await promtool(["test", "rules", ALERT_TESTS]);
    assert.equal(r.code, 0, r.out);
  });

  it("control: each firing case fails promtool once its expectation is taken away (so each one really fires)", {
    skip: promtoolSkip,
  }, async () => {
    const { dir, cleanup } = tempDir("inbox-ops-");
    try {
      // One run of promtool over a copy of each test that keeps only one firing case, its expectation emptied.
      writeFileSync(join(dir, "alerts.yml"), readFileSync(ALERTS));
      const original = ruleTests();
      const mutants = original.tests.flatMap((t) =>
        (t.alert_rule_test ?? []).flatMap((c, j) => {
          if (!c.exp_alerts.length) return [];
          const name = `mutant ${c.alertname} at ${c.eval_time} (${t.name.slice(0, 40)})`;
          return [
            {
              ...t,
              name,
              promql_expr_test: undefined,
              alert_rule_test: [{ ...t.alert_rule_test![j]!, exp_alerts: [] }],
            },
          ];
        }),
      );
      assert.ok(mutants.length >= 14, `every firing case, found ${mutants.length}`);
      writeFileSync(join(dir, "mutants.test.yml"), yaml({ ...original, tests: mutants }));
      const r = await promtool(["test", "rules", "mutants.test.yml"], dir);
      assert.notEqual(r.code, 0, r.out);
      for (const m of mutants)
        assert.ok(r.out.includes(`name: ${m.name},`), `${m.name}: promtool passed without its expectation`);
    } finally {
      cleanup();
    }
  });
});

describe("ops/dashboard.json", () => {
  it("is a Grafana dashboard: one uid, panels with unique ids and places, every query on the chosen Prometheus", () => {
    const board = dashboard();
    assert.equal(board.uid, "webhook-inbox");
    assert.ok(board.templating.list.some((v) => v.name === "datasource" && v.type === "datasource"));
    const ids = board.panels.map((p) => p.id);
    assert.equal(new Set(ids).size, ids.length, "panel ids are unique");
    for (const p of board.panels) {
      for (const k of ["x", "y", "w", "h"]) assert.equal(typeof p.gridPos[k], "number", `panel ${p.id}: gridPos.${k}`);
      assert.ok(p.gridPos.x! + p.gridPos.w! <= 24, `panel ${p.id} fits the 24 columns`);
      if (p.type === "row") continue;
      assert.equal(p.datasource?.uid, "${datasource}", `panel ${p.id}: its datasource is the variable`);
      assert.ok(p.targets?.length, `panel ${p.id} "${p.title}" has queries`);
      const refs = p.targets!.map((t) => t.refId);
      assert.equal(new Set(refs).size, refs.length, `panel ${p.id}: refIds are unique`);
      for (const t of p.targets!)
        assert.equal(t.datasource?.uid, "${datasource}", `panel ${p.id} ${t.refId}: datasource`);
    }
    const cells = new Map<string, number>();
    for (const p of board.panels) {
      for (let x = p.gridPos.x!; x < p.gridPos.x! + p.gridPos.w!; x++) {
        for (let y = p.gridPos.y!; y < p.gridPos.y! + p.gridPos.h!; y++) {
          const other = cells.get(`${x},${y}`);
          assert.equal(other, undefined, `panels ${other} and ${p.id} overlap at ${x},${y}`);
          cells.set(`${x},${y}`, p.id);
        }
      }
    }
    const wanted = [
      "inbox_received_total",
      "inbox_ack_duration_seconds_bucket",
      "inbox_deliveries",
      "inbox_oldest_waiting_seconds",
      "inbox_handler_duration_seconds_bucket",
      "inbox_failures_total",
      "inbox_commit_batch_size_bucket",
      "inbox_forwards_total",
      "inbox_forward_duration_seconds_bucket",
      "inbox_destination_state",
    ];
    const read = new Set(queries(board).flatMap((q) => uses(q.expr).selectors.map((s) => s.name)));
    for (const name of wanted) assert.ok(read.has(name), `some panel shows ${name}`);
  });

  it("parses every query with promtool (wrapped as recording rules)", { skip: promtoolSkip }, async () => {
    const { dir, cleanup } = tempDir("inbox-ops-");
    try {
      const list = queries(dashboard());
      writeFileSync(
        join(dir, "queries.yml"),
        yaml({
          groups: [{ name: "dashboard", rules: list.map((q) => ({ record: `dashboard:${q.key}`, expr: q.expr })) }],
        }),
      );
      const r = await promtool(["check", "rules", "queries.yml"], dir);
      assert.equal(r.code, 0, r.out);
      assert.match(r.out, new RegExp(`SUCCESS: ${list.length} rules found`));
      // Control: the same check fails on a query that does not parse.
      writeFileSync(
        join(dir, "broken.yml"),
        yaml({
          groups: [{ name: "x", rules: [{ record: "x:y", expr: "sum by (le (rate(inbox_received_total[5m]))" }] }],
        }),
      );
      assert.notEqual((await promtool(["check", "rules", "broken.yml"], dir)).code, 0);
    } finally {
      cleanup();
    }
  });
});

for (const backend of await backends("ops")) {
  describe(`ops/ against a real receiver and worker on ${backend.name}`, { skip: backend.skip }, () => {
    const exposed: Exposed = { names: new Set(), labels: new Map(), values: new Map(), scrapes: [] };
    let cleanup: (() => Promise<void>) | undefined;

    // One small workload through the real scripts: stored, duplicate, refused and set-aside deliveries, one
    // taken over from a lease that ran out, and forwards to three destinations: one that answers 200, one
    // that answers 503 (its breaker opens at the first failure) and one paused. Each process is scraped
    // before the worker runs and after it has got through.
    before(async () => {
      const made = await backend.make();
      cleanup = made.cleanup;
      const { dir, cleanup: rmDir } = tempDir();
      const servers: Server[] = [];
      const serve = async (status: number) => {
        const server = createServer((req, res) => req.resume().on("end", () => res.writeHead(status).end())).listen(
          0,
          "127.0.0.1",
        );
        servers.push(server);
        await once(server, "listening");
        return `http://127.0.0.1:${(server.address() as { port: number }).port}/hooks`;
      };
      const secret = "ops-test-secret";
      const forwarding = `whsec_${Buffer.from("the app's forwarding secret").toString("base64")}`;
      const sources = join(dir, "sources.json");
      writeFileSync(
        sources,
        JSON.stringify({
          $destinations: {
            app: { url: await serve(200), secret: forwarding },
            down: { url: await serve(503), secret: forwarding, breaker: { failures: 1 } },
            held: { url: await serve(200), secret: forwarding },
          },
          shop: { provider: "plain", secret, routes: ["handler", "app", "down", "held"] },
          open: { provider: "plain" },
        }),
      );
      const receiver = await startReceiver(made.target, ["--sources", sources, "--quiet"]);
      const worker = { child: undefined as ReturnType<typeof spawnScript> | undefined };
      try {
        const post = async (source: string, id: string, event: unknown, key = "") => {
          const body = JSON.stringify(event);
          const headers = { ...(key ? sign("plain", key, { id, body, timestampS: 0 }) : {}), "x-delivery-id": id };
          return (await fetch(`${receiver.url}/${source}`, { method: "POST", headers, body })).status;
        };
        for (let i = 0; i < 3; i++)
          assert.equal(await post("shop", `s-${i}`, { customer: "Ann", amount: i }, secret), 200);
        assert.equal(await post("shop", "s-0", { customer: "Ann", amount: 0 }, secret), 200);
        assert.equal(await post("shop", "s-bad", {}, secret), 200);
        assert.equal(await post("shop", "forged", { customer: "Eve", amount: 1 }, "not-the-secret"), 401);
        assert.equal(await post("open", "o-1", { customer: "Bo", amount: 1 }), 200);
        const scrape = async (url: string) => {
          const res = await fetch(url);
          assert.equal(res.status, 200);
          return res.text();
        };
        expose(exposed, "webhook-inbox-receiver", "receiver", await scrape(`${receiver.url}/metrics`));
        const inbox = await connect(made.target);
        try {
          assert.ok(await inbox.claim(1), "a delivery to let its lease run out");
          assert.equal(await inbox.pause("held", "ops test"), true);
        } finally {
          await inbox.close();
        }

        worker.child = spawnScript("worker.ts", [
          "--db",
          made.target,
          "--sources",
          sources,
          "--handler",
          "demo",
          "--metrics-port",
          "0",
          "--quiet",
        ]);
        let stderr = "";
        const url = await new Promise<string>((resolve, reject) => {
          worker.child!.stderr!.on("data", (d) => {
            stderr += d;
            const m = /Metrics on (\S+)/.exec(stderr);
            if (m) resolve(m[1]!);
          });
          worker.child!.on("exit", (code) => reject(new Error(`worker exited with ${code}: ${stderr}`)));
        });
        expose(exposed, "webhook-inbox-worker", "worker", await scrape(url));
        // Through when the handler has tried all five (four recorded, one set aside), the app has all four of
        // shop's, and the failing destination's breaker shows open (the gauges are read every 5 s).
        const deadline = Date.now() + 60_000;
        for (;;) {
          const text = await scrape(url);
          const sum = (name: string, labels: Record<string, string> = {}) =>
            parse(text)
              .find((f) => f.name === name)
              ?.metrics.filter((m) => Object.entries(labels).every(([k, v]) => m.labels?.[k] === v))
              .reduce((n, m) => n + Number(m.value), 0) ?? 0;
          if (
            sum("inbox_failures_total") >= 1 &&
            sum("inbox_forwards_total", { destination: "app", outcome: "done" }) >= 4 &&
            sum("inbox_forwards_total", { destination: "down", outcome: "retry" }) >= 1 &&
            sum("inbox_destination_state", { destination: "down" }) === 1
          ) {
            expose(exposed, "webhook-inbox-worker", "worker", text);
            break;
          }
          if (Date.now() > deadline)
            throw new Error(
              `the worker did not get through: ${text
                .split("\n")
                .filter((l) => l.startsWith("inbox_"))
                .join("\n")}`,
            );
          await new Promise((resolve) => setTimeout(resolve, 100));
        }
        expose(exposed, "webhook-inbox-receiver", "receiver", await scrape(`${receiver.url}/metrics`));
        await consumerScrapes(made.target, dir, scrape);
      } finally {
        worker.child?.kill("SIGTERM");
        await receiver.stop();
        for (const server of servers) server.close();
        rmDir();
      }
    });
    after(async () => cleanup?.());

    // consumerScrapes runs consumer.ts on a JetStream source of a few messages (with no NATS here, on one
    // whose broker never answers: its metrics are the same, paused) and scrapes it before and after.
    async function consumerScrapes(target: string, dir: string, scrape: (url: string) => Promise<string>) {
      const nats = (await natsSkip()) === false;
      const stream = `OPS_${process.pid}_${backend.name}`;
      const nc = nats ? await natsConnect({ servers: NATS }) : undefined;
      const jsm = nc ? await jetstreamManager(nc) : undefined;
      const file = join(dir, "consumed.json");
      try {
        if (jsm) {
          await jsm.streams.add({ name: stream, subjects: [`ops.${process.pid}.${backend.name}`] });
          for (let i = 0; i < 3; i++) await jetstream(nc!).publish(`ops.${process.pid}.${backend.name}`, `{"i":${i}}`);
        }
        const url = nats ? NATS : `nats://127.0.0.1:${await freePort()}`;
        writeFileSync(file, JSON.stringify({ pay: { broker: { type: "nats", url, stream, consumer: "inbox" } } }));
        const port = await freePort();
        const child = spawnScript("consumer.ts", ["--db", target, "--sources", file, "--metrics-port", String(port)]);
        const ended = once(child, "close");
        try {
          const metrics = `http://127.0.0.1:${port}/metrics`;
          await until("consumer.ts serves its metrics", () =>
            scrape(metrics).then(
              () => true,
              () => false,
            ),
          );
          expose(exposed, "webhook-inbox-consumer", "consumer", await scrape(metrics));
          if (nats) await until("the three consumed", async () => /result="acked"} 3/.test(await scrape(metrics)));
          expose(exposed, "webhook-inbox-consumer", "consumer", await scrape(metrics));
        } finally {
          child.kill("SIGTERM");
          await ended;
        }
      } finally {
        await jsm?.streams.delete(stream).catch(() => {});
        await nc?.close();
      }
    }

    it("the rules name only metrics, labels and values the processes expose", () => {
      const file = rules();
      const recorded = recordedBy(file);
      const found = file.groups.flatMap((g) =>
        g.rules.flatMap((r) => problems(r.expr, exposed, recorded).map((p) => `${r.alert ?? r.record}: ${p}`)),
      );
      assert.deepEqual(found, []);
      for (const name of [
        "inbox_consumer_state",
        "inbox_consumer_pauses_total",
        "inbox_ready",
        "inbox_lease_takeovers_total",
        "inbox_failures_total",
        "inbox_deliveries",
        "inbox_oldest_waiting_seconds",
      ]) {
        assert.ok(exposed.names.has(name), `the workload shows ${name}`);
      }
    });

    it("the dashboard names only metrics, labels and values the processes expose, its variables included", () => {
      const board = dashboard();
      const found = queries(board).flatMap((q) => problems(q.expr, exposed).map((p) => `${q.where}: ${p}`));
      for (const v of variableQueries(board)) {
        if (!exposed.labels.get(v.metric)?.has(v.label))
          found.push(`$${v.name}: label_values(${v.metric}, ${v.label}) finds nothing in a real scrape`);
      }
      assert.deepEqual(found, []);
      assert.ok(variableQueries(board).length >= 1);
    });

    it("control: a renamed metric, a label it lacks and a status it never has are each caught", () => {
      assert.deepEqual(problems("sum(rate(inbox_recieved_total[5m]))", exposed), [
        "inbox_recieved_total: no such metric in a real scrape",
      ]);
      assert.deepEqual(problems('inbox_deliveries{state="received"}', exposed), [
        "inbox_deliveries{state}: no such label on it in a real scrape",
      ]);
      assert.deepEqual(problems('inbox_deliveries{status=~"received|waiting"}', exposed), [
        'inbox_deliveries{status=~"received|waiting"}: waiting is not one of received, processing, done, failed',
      ]);
      assert.deepEqual(problems("sum by (sauce) (inbox_deliveries)", exposed), [
        "by (sauce): no metric it reads carries that label",
      ]);
      assert.equal(problems("sum by (le (inbox_deliveries)", exposed).length > 0, true, "a syntax error");
    });

    it("the destination alerts pick out the open destination and the paused one from these scrapes (promtool)", {
      skip: promtoolSkip,
    }, async () => {
      const { dir, cleanup: rmDir } = tempDir("inbox-ops-");
      try {
        const expr = (alert: string) =>
          rules()
            .groups.flatMap((g) => g.rules)
            .find((r) => r.alert === alert)!.expr;
        const r = await evaluate(dir, exposed, [
          { expr: expr("InboxDestinationOpen"), exp_samples: [{ labels: '{destination="down"}', value: 1 }] },
          { expr: expr("InboxDestinationPaused"), exp_samples: [{ labels: '{destination="held"}', value: 2 }] },
          {
            expr: "max by (destination) (inbox_destination_state) == 0",
            exp_samples: ["app", "handler"].map((d) => ({ labels: `{destination="${d}"}`, value: 0 })),
          },
        ]);
        assert.equal(r.code, 0, r.out);
        // The dashboard's breaker panel names the same codes as the scrapes show them.
        const panel = dashboard().panels.find((p) =>
          p.targets?.some((t) => t.expr.includes("inbox_destination_state")),
        );
        const mapping = (
          panel as unknown as {
            fieldConfig: { defaults: { mappings: { options: Record<string, { text: string }> }[] } };
          }
        ).fieldConfig.defaults.mappings[0]!.options;
        const worker = exposed.scrapes.filter((x) => x.job === "webhook-inbox-worker").at(-1)!;
        for (const [destination, state] of [
          ["app", "closed"],
          ["down", "open"],
          ["held", "paused"],
        ]) {
          const code = worker.series.get(
            `inbox_destination_state{destination="${destination}", job="webhook-inbox-worker", instance="worker"}`,
          );
          assert.equal(mapping[String(code)]?.text, state, `${destination} shows ${code}`);
        }
        // Control: the same check fails when it expects the healthy destination to be the open one.
        const wrong = await evaluate(dir, exposed, [
          { expr: expr("InboxDestinationOpen"), exp_samples: [{ labels: '{destination="app"}', value: 1 }] },
        ]);
        assert.notEqual(wrong.code, 0);
      } finally {
        rmDir();
      }
    });

    it("every dashboard query returns series when Prometheus is fed these scrapes (promtool test rules)", {
      skip: promtoolSkip,
    }, async () => {
      const { dir, cleanup: rmDir } = tempDir("inbox-ops-");
      try {
        const list = queries(dashboard());
        const r = await dataCheck(dir, list, exposed, quietIn);
        assert.equal(r.code, 0, r.out);
        // Control: a query on a metric that is not there fails the same check.
        const broken = await dataCheck(
          dir,
          [...list, { expr: 'sum(rate(inbox_recieved_total{source=~".*"}[4m]))' }],
          exposed,
          quietIn,
        );
        assert.notEqual(broken.code, 0);
        assert.match(broken.out, /inbox_recieved_total/);
      } finally {
        rmDir();
      }
    });
  });
}

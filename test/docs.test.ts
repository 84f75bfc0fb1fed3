// test/docs.test.ts: docs that cannot drift. README.md and every page in docs/ are read as the code's
// users read them, and held to the code:
//   - every shell command that runs a script (npx tsx X.ts, tsx, node, deno run, bun, npx webhook-inbox
//     <script>, npm run demo --) names only flags that the script's --help lists (for inbox.ts, the
//     subcommand's help or the parent's), and only subcommands that exist; `npm run bench -- NAME`
//     names only benchmarks that bench/run.ts has;
//   - every ```ts snippet type-checks, strict, against the code, in one tsc run;
//   - every backticked file, DEFAULTS.key, --flag and name() exists, every relative link and #anchor
//     resolves, and docs/house.md's table of floors and imports is the code's own, with no circle;
//   - the README opens with the two set-up commands and stays under 250 lines, and every docs/ page opens
//     with its title and what it covers.
// Snippets: each ```ts (or ```typescript) block is a module of its own, written to test/.docs-snippets/
// (gitignored) with "./x.ts" imports pointed at the repository, and "webhook-inbox" / "webhook-inbox/x"
// mapped to ./inbox.ts / ./x.ts, so package-style imports check too. A fragment gets what it takes for
// granted in one of two ways: `after=NAME` in its info string puts the page's earlier ```ts id=NAME block
// before it, and an HTML comment right above the fence, <!-- ts-prelude … -->, holds hidden lines
// (imports, `const app = express()`) put before it. Only ```ts no-check opts out; the count is printed.
// The last describe runs the same checks on made-up markdown, so each check is shown to be able to fail.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join, normalize, posix, relative } from "node:path";
import { after, before, describe, it } from "node:test";
import { DEFAULTS } from "../lib/defaults.ts";
import { ROOT, runScript } from "./helpers.ts";

const SNIPPETS = join(ROOT, "test", ".docs-snippets");

// Names in backticks that are neither this code's exports nor Inbox methods, each with why it may be named.
const KNOWN_CALLS: ReadonlyMap<string, string> = new Map([
  ["next", "Express's next(), which the handler calls for a path that is not a source"],
  ["work", "pg-boss's work(), the peer's worker in the benchmarks"],
  ["inc", "prom-client's Counter.inc(), whose cost the metrics avoid"],
  ["observe", "prom-client's Histogram.observe(), whose cost the metrics avoid"],
  ["set_config", "PostgreSQL's own function, in the claim's SQL"],
  ["statement_timestamp", "PostgreSQL's own function: the one clock"],
  ["pg_notify", "PostgreSQL's own function: the wake-ups"],
]);
// Objects whose methods the docs call that are not this code's: their APIs are the packages' own.
const KNOWN_OBJECTS: ReadonlyMap<string, string> = new Map([
  ["express", "express.json() and express.raw(), the body parsers the handler must come before"],
]);
// What a lower-case name in the docs stands for, so `job.write()` is checked against the Job interface.
const INSTANCES: ReadonlyMap<string, string> = new Map([
  ["inbox", "Inbox"],
  ["job", "Job"],
  ["tx", "Tx"],
  ["webhooks", "Handler"],
]);
// Flags named in prose that belong to other programs, not to a script here.
const FOREIGN_FLAGS: ReadonlyMap<string, string> = new Map([
  ["--cpu-prof", "Node's own, for a CPU profile of the receiver"],
  ["--max-semi-space-size", "V8's, through NODE_OPTIONS, to cap the worker's young generation"],
  ["--dir", "redis-server's, which the benchmarks start"],
  ["--save", "redis-server's, which the benchmarks start"],
]);

// ---- Markdown: the pieces the checks read ----

/** Page is one markdown file: its path from the repository's root, and its text. */
interface Page {
  path: string;
  text: string;
}

interface Fence {
  line: number;
  lang: string;
  /** The words after the language: id=NAME, after=NAME, no-check. */
  info: string[];
  body: string;
  /** Hidden lines from a <!-- ts-prelude … --> comment right above the fence. */
  prelude: string;
}

interface Span {
  line: number;
  code: string;
}

interface Parsed {
  fences: Fence[];
  /** Inline code, with a table's \| read as |. */
  spans: Span[];
  /** Prose outside fences, comments and code spans blanked, for reading "`x` from `y.ts`" and links. */
  prose: string;
  links: { line: number; target: string }[];
  anchors: Set<string>;
}

const parsedPages = new Map<string, Parsed>();

// slug is GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens.
function slug(heading: string): string {
  const text = heading.replace(/`/g, "").replace(/!?\[([^\]]*)\]\([^)]*\)/g, "$1");
  return text
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{N}\s_-]/gu, "")
    .replace(/\s/g, "-");
}

function lineAt(text: string, offset: number): number {
  let line = 1;
  for (let i = 0; i < offset; i++) if (text.charCodeAt(i) === 10) line++;
  return line;
}

function parse(page: Page): Parsed {
  const cached = parsedPages.get(page.path + "\0" + page.text);
  if (cached) return cached;
  const lines = page.text.split("\n");
  const fences: Fence[] = [];
  const anchors = new Set<string>();
  const seen = new Map<string, number>();
  // prose keeps every line in place (blanked where it is not prose), so offsets map back to lines.
  const prose: string[] = [];
  let prelude: string | undefined;
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]!;
    const open = /^(\s*)(`{3,}|~{3,})\s*([\w+-]*)\s*(.*)$/.exec(line);
    if (open) {
      const close = new RegExp(`^\\s*${open[2]![0]}{${open[2]!.length},}\\s*$`);
      const start = i;
      const body: string[] = [];
      prose.push("");
      while (++i < lines.length && !close.test(lines[i]!)) {
        body.push(lines[i]!);
        prose.push("");
      }
      prose.push("");
      fences.push({
        line: start + 1,
        lang: open[3]!.toLowerCase(),
        info: open[4]!.split(/\s+/).filter(Boolean),
        body: body.join("\n"),
        prelude: prelude ?? "",
      });
      prelude = undefined;
      continue;
    }
    if (line.trimStart().startsWith("<!--")) {
      // A comment is not prose; a ts-prelude comment is kept for the fence that follows it.
      const comment: string[] = [line];
      prose.push("");
      while (!lines[i]!.includes("-->") && i + 1 < lines.length) {
        comment.push(lines[++i]!);
        prose.push("");
      }
      const text = comment
        .join("\n")
        .replace(/^\s*<!--/, "")
        .replace(/-->\s*$/, "");
      if (/^\s*ts-prelude\b/.test(text)) prelude = text.replace(/^\s*ts-prelude\b[^\n]*\n?/, "");
      continue;
    }
    if (line.trim() !== "") prelude = undefined;
    const heading = /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line);
    if (heading) {
      const base = slug(heading[1]!);
      const n = seen.get(base) ?? 0;
      seen.set(base, n + 1);
      anchors.add(n === 0 ? base : `${base}-${n}`);
    }
    prose.push(line);
  }
  const text = prose.join("\n");
  const spans: Span[] = [];
  let blanked = text;
  // Code spans never cross a blank line; a run of n backticks closes only on a run of n.
  for (const m of text.matchAll(/(?<!`)(`+)(?!`)([\s\S]*?[^`])\1(?!`)/g)) {
    if (/\n\s*\n/.test(m[2]!)) continue;
    spans.push({
      line: lineAt(text, m.index),
      code: m[2]!
        .replace(/\\\|/g, "|")
        .replace(/\s*\n\s*/g, " ")
        .trim(),
    });
    blanked =
      blanked.slice(0, m.index) + "`" + "\u0000".repeat(m[0].length - 2) + "`" + blanked.slice(m.index + m[0].length);
  }
  const links: Parsed["links"] = [];
  for (const m of blanked.matchAll(/!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)) {
    links.push({ line: lineAt(blanked, m.index), target: m[1]! });
  }
  const parsed = { fences, spans, prose: text, links, anchors };
  parsedPages.set(page.path + "\0" + page.text, parsed);
  return parsed;
}

// ---- Shell commands: which script each runs, and the flags it names ----

/** Command is one script run that a page shows: in a fenced shell block, or in inline code. */
interface Command {
  page: string;
  line: number;
  text: string;
  /** The script, from the repository's root: "worker.ts", "bench/search.ts"; or "npm run bench". */
  script: string;
  /** The subcommand, for inbox.ts. */
  sub?: string;
  flags: string[];
  /** The other words after the script (bench names, for npm run bench). */
  words: string[];
}

const SHELLS = new Set(["sh", "bash", "shell", "console", "zsh"]);
const RUNNERS = new Set(["npx", "tsx", "node", "deno", "bun", "npm"]);

// words splits a command line as a shell would, far enough to find scripts and flags: quotes, $( … ),
// ${ … } and \-escapes stay inside a word; a # starting a word ends the line; |, ||, &&, & and ; end a
// command; redirections and their targets are dropped.
function commandsOf(line: string): { word: string; quoted: boolean }[][] {
  const commands: { word: string; quoted: boolean }[][] = [[]];
  let word = "";
  let quoted = false;
  let started = false;
  let redirect = false;
  const end = () => {
    if (started && !redirect) commands[commands.length - 1]!.push({ word, quoted });
    if (started) redirect = false;
    word = "";
    quoted = false;
    started = false;
  };
  for (let i = 0; i < line.length; i++) {
    const c = line[i]!;
    if (/\s/.test(c)) {
      end();
    } else if (c === "#" && !started) {
      break;
    } else if (c === "\\" && i + 1 < line.length) {
      word += line[++i];
      started = true;
    } else if (c === "'" || c === '"') {
      const close = line.indexOf(c, i + 1);
      word += line.slice(i + 1, close < 0 ? line.length : close);
      i = close < 0 ? line.length : close;
      quoted = started = true;
    } else if (c === "$" && (line[i + 1] === "(" || line[i + 1] === "{")) {
      const [openC, closeC] = line[i + 1] === "(" ? ["(", ")"] : ["{", "}"];
      let depth = 0;
      let j = i + 1;
      for (; j < line.length; j++) {
        if (line[j] === openC) depth++;
        else if (line[j] === closeC && --depth === 0) break;
      }
      word += line.slice(i, j + 1);
      i = j;
      started = true;
    } else if (c === "|" || c === ";" || (c === "&" && line[i - 1] !== ">")) {
      end();
      if ((c === "|" || c === "&") && line[i + 1] === c) i++;
      commands.push([]);
    } else if (c === ">" || c === "<") {
      // 2>&1, > file, >> file: not the script's arguments.
      if (/^\d+$/.test(word)) {
        word = "";
        started = false;
      }
      end();
      while (line[i + 1] === ">" || line[i + 1] === "&") i++;
      if (/\d/.test(line[i + 1] ?? "")) {
        while (/\d/.test(line[i + 1] ?? "")) i++;
      } else {
        redirect = true;
      }
    } else {
      word += c;
      started = true;
    }
  }
  end();
  return commands.filter((c) => c.length > 0);
}

// flagsOf picks the --flags out of a command's words: --name, --name=value, and [--name …] in a synopsis.
function flagsOf(words: { word: string; quoted: boolean }[]): string[] {
  const flags: string[] = [];
  for (const { word, quoted } of words) {
    if (quoted) continue;
    const m = /^[[(]*(--[a-z0-9][a-z0-9-]*)/.exec(word);
    if (m) flags.push(m[1]!);
  }
  return flags;
}

// scriptRun says which script a command runs and with which words, or undefined when it runs none of them.
function scriptRun(
  words: { word: string; quoted: boolean }[],
  scripts: ReadonlySet<string>,
  inline: boolean,
): { script: string; rest: { word: string; quoted: boolean }[] } | undefined {
  let i = 0;
  while (i < words.length && /^[A-Za-z_][A-Za-z0-9_]*=/.test(words[i]!.word)) i++; // NAME=value before the command
  const w = (k: number) => words[k]?.word ?? "";
  const at = (k: number) => ({ script: normalize(w(k)).replace(/^\.\//, ""), rest: words.slice(k + 1) });
  const first = w(i);
  if (first === "npx" && w(i + 1) === "tsx") return /\.ts$/.test(w(i + 2)) ? at(i + 2) : undefined;
  if (first === "npx" && w(i + 1) === "webhook-inbox") {
    const name = w(i + 2);
    if (scripts.has(`${name}.ts`)) return { script: `${name}.ts`, rest: words.slice(i + 3) };
    return { script: "inbox.ts", rest: words.slice(i + 2) };
  }
  if (first === "npm" && w(i + 1) === "run" && (w(i + 2) === "demo" || w(i + 2) === "bench")) {
    const dashes = words.findIndex((x, k) => k > i + 2 && x.word === "--");
    const rest = dashes < 0 ? [] : words.slice(dashes + 1);
    return w(i + 2) === "demo" ? { script: "demo.ts", rest } : { script: "npm run bench", rest };
  }
  let k = -1;
  if (first === "tsx" || first === "bun") k = i + 1;
  if (first === "bun" && w(k) === "run") k++;
  if (first === "node" || (first === "npx" && w(i + 1) === "node")) k = first === "npx" ? i + 2 : i + 1;
  if (first === "deno" && w(i + 1) === "run") k = i + 2;
  if (k >= 0) {
    // The runtime's own flags come before the script; --import and -r take a value.
    while (k < words.length && w(k).startsWith("-")) k += /^(--import|--require|-r|--loader)$/.test(w(k)) ? 2 : 1;
    return /\.ts$/.test(w(k)) ? at(k) : undefined;
  }
  // In prose, `worker.ts --once` or `inbox.ts retry ID` is a command too, when it has arguments.
  if (inline && scripts.has(first) && words.length > i + 1) return at(i);
  return undefined;
}

/**
 * shownFiles are the files a page shows the reader how to write: a fence whose first line is `// NAME.ts`
 * (the README's first app's server.ts). The page's own, not the repository's: named or run, they need not exist here.
 */
function shownFiles(page: Page): Set<string> {
  return new Set(
    parse(page)
      .fences.map((f) => /^\/\/ ([\w./-]+\.ts)$/.exec(f.body.split("\n")[0]!)?.[1])
      .filter((name): name is string => name !== undefined),
  );
}

/** commandsIn finds every command in the pages that runs a script, with the flags it names. */
function commandsIn(pages: readonly Page[], scripts: ReadonlySet<string>, subcommands: ReadonlySet<string>): Command[] {
  const found: Command[] = [];
  const shown = new Map(pages.map((p) => [p.path, shownFiles(p)]));
  const add = (page: string, line: number, text: string, inline: boolean) => {
    for (const words of commandsOf(text)) {
      const run = scriptRun(words, scripts, inline);
      if (!run || shown.get(page)?.has(run.script)) continue;
      let sub: string | undefined;
      let rest = run.rest;
      if (run.script === "inbox.ts") {
        const first = rest.findIndex((x) => !x.word.startsWith("-") && !x.word.startsWith("["));
        if (first >= 0 && (first === 0 || subcommands.has(rest[first]!.word))) {
          sub = rest[first]!.word;
          rest = rest.slice(first + 1);
        }
      }
      found.push({
        page,
        line,
        text: text.trim(),
        script: run.script,
        sub,
        flags: flagsOf(rest),
        words: rest.filter((x) => !x.word.startsWith("-")).map((x) => x.word),
      });
    }
  };
  for (const page of pages) {
    const { fences, spans } = parse(page);
    for (const fence of fences) {
      if (!SHELLS.has(fence.lang)) continue;
      const lines = fence.body.split("\n");
      for (let i = 0; i < lines.length; i++) {
        let text = lines[i]!;
        const line = fence.line + 1 + i;
        if (fence.lang === "console") {
          if (!/^\s*\$ /.test(text)) continue; // output, not a command
          text = text.replace(/^\s*\$ /, "");
        }
        while (/\\\s*$/.test(text) && i + 1 < lines.length) text = text.replace(/\\\s*$/, " ") + lines[++i]!;
        add(page.path, line, text, false);
      }
    }
    for (const span of spans) {
      const words = commandsOf(span.code)[0] ?? [];
      const first = words.find((x) => !/^[A-Za-z_][A-Za-z0-9_]*=/.test(x.word))?.word ?? "";
      if (RUNNERS.has(first) || scripts.has(first)) add(page.path, span.line, span.code, true);
    }
  }
  return found;
}

/** helpKey names the --help a command is checked against: "worker.ts", or "inbox.ts retry". */
function helpKey(script: string, sub?: string): string {
  return sub ? `${script} ${sub}` : script;
}

/** declared reads the flags a commander --help declares under "Options:", not those its examples use. */
function declared(help: string): Set<string> {
  return new Set([...help.matchAll(/^ {2}(?:-\w, )?(--[a-z0-9][a-z0-9-]*)/gm)].map((m) => m[1]!));
}

/** checkCommands reports every flag a command names that its script's --help does not list. */
function checkCommands(
  commands: readonly Command[],
  helps: ReadonlyMap<string, string>,
  benches: ReadonlySet<string>,
): string[] {
  const problems: string[] = [];
  for (const c of commands) {
    const where = `${c.page}:${c.line}: \`${c.text}\``;
    if (c.script === "npm run bench") {
      for (const name of c.words)
        if (!benches.has(name)) problems.push(`${where}: npm run bench has no benchmark named ${name}`);
      continue;
    }
    if (!existsSync(join(ROOT, c.script))) {
      problems.push(`${where}: ${c.script} does not exist`);
      continue;
    }
    const parent = helps.get(c.script);
    if (parent === undefined) continue; // not a script with --help (bench/, test/): that it exists is enough
    if (c.sub !== undefined && !helps.has(helpKey(c.script, c.sub))) {
      problems.push(`${where}: ${c.script} has no command ${c.sub}`);
      continue;
    }
    const flags = declared(c.sub === undefined ? parent : `${helps.get(helpKey(c.script, c.sub))}\n${parent}`);
    for (const flag of c.flags) {
      if (!flags.has(flag)) problems.push(`${where}: ${flag} is not in \`${helpKey(c.script, c.sub)} --help\``);
    }
  }
  return problems;
}

// ---- The code: files, exports, members, imports ----

/** Code is what the name checks compare the docs with, read from the repository once. */
interface Code {
  /** The .ts files at the top and in lib/, each by its own name. */
  files: string[];
  /** Each file's exports, re-exports followed. */
  exports: Map<string, Set<string>>;
  /** Members of each exported interface and class: Inbox's store, claim, … */
  members: Map<string, Set<string>>;
  /** Each file's imports of the others. */
  imports: Map<string, Set<string>>;
  defaults: Set<string>;
  /** Every flag of every script's --help. */
  flags: Set<string>;
}

// importsOf lists the files of the house that file imports, each by its path from the top ("lib/store.ts",
// "lib/sqlite/schema.ts", "worker.ts"), static or dynamic: "../../worker.ts" from lib/sqlite/ is a script above.
function importsOf(text: string, file: string): Set<string> {
  const deps = new Set<string>();
  const add = (spec: string) => deps.add(posix.normalize(posix.join(posix.dirname(file), spec)));
  for (const m of text.matchAll(/^\s*(?:import|export)\b[^;]*?\bfrom\s+"(\.\.?\/[\w/.-]+\.ts)"/gm)) add(m[1]!);
  for (const m of text.matchAll(/\bimport\s*\(\s*"(\.\.?\/[\w/.-]+\.ts)"\s*\)|^\s*import\s+"(\.\.?\/[\w/.-]+\.ts)"/gm))
    add((m[1] ?? m[2])!);
  return deps;
}

/** houseFiles lists the .ts files at the top and under lib/, each by its path from the top. */
function houseFiles(): string[] {
  const lib = readdirSync(join(ROOT, "lib"), { recursive: true, encoding: "utf8" }).map(
    (f) => `lib/${f.replace(/\\/g, "/")}`,
  );
  return [...readdirSync(ROOT), ...lib].filter((f) => f.endsWith(".ts") && !f.endsWith(".d.ts")).sort();
}

function readCode(defaults: Record<string, unknown>, helps: ReadonlyMap<string, string>): Code {
  // The scripts at the top and the rooms under lib/, each known by its path from the top.
  const files = houseFiles();
  const source = new Map(files.map((f) => [f, readFileSync(join(ROOT, f), "utf8")]));
  const own = new Map<string, Set<string>>();
  const stars = new Map<string, string[]>();
  const members = new Map<string, Set<string>>();
  const imports = new Map<string, Set<string>>();
  for (const [file, text] of source) {
    const names = new Set<string>();
    for (const m of text.matchAll(
      /^export\s+(?:declare\s+)?(?:default\s+)?(?:async\s+)?(?:abstract\s+)?(?:function\*?|class|const|let|var|type|interface|enum)\s+([A-Za-z_$][\w$]*)/gm,
    ))
      names.add(m[1]!);
    for (const m of text.matchAll(/^export\s+(?:type\s+)?\{([^}]*)\}/gm)) {
      for (const part of m[1]!.split(",")) {
        const name = part
          .trim()
          .split(/\s+as\s+/)
          .pop()
          ?.replace(/^type\s+/, "");
        if (name) names.add(name);
      }
    }
    own.set(file, names);
    stars.set(
      file,
      [...text.matchAll(/^export\s+\*\s+from\s+"(\.\.?\/[\w/.-]+\.ts)"/gm)].map((m) =>
        posix.normalize(posix.join(posix.dirname(file), m[1]!)),
      ),
    );
    imports.set(file, importsOf(text, file));
    // Members: the lines one level inside each exported interface or class.
    const lines = text.split("\n");
    for (let i = 0; i < lines.length; i++) {
      const head = /^export\s+(?:abstract\s+)?(?:interface|class)\s+([A-Za-z_$][\w$]*)[^{]*\{\s*$/.exec(lines[i]!);
      if (!head) continue;
      const set = members.get(head[1]!) ?? new Set<string>();
      members.set(head[1]!, set);
      let depth = 1;
      for (i++; i < lines.length && depth > 0; i++) {
        const line = lines[i]!.replace(/\/\/.*$|\/\*.*?\*\/|"(?:\\.|[^"])*"|`(?:\\.|[^`])*`/g, "");
        if (depth === 1) {
          const m =
            /^\s+(?:(?:readonly|static|async|private|public|protected|get|set|override)\s+)*([A-Za-z_$][\w$]*)\??\s*[(:<=;]/.exec(
              line,
            );
          if (m && m[1] !== "constructor") set.add(m[1]!);
        }
        for (const c of line) depth += c === "{" ? 1 : c === "}" ? -1 : 0;
      }
      i--;
    }
  }
  const exports = new Map<string, Set<string>>();
  const resolve = (file: string, trail: Set<string>): Set<string> => {
    const all = new Set(own.get(file) ?? []);
    if (trail.has(file)) return all;
    trail.add(file);
    for (const from of stars.get(file) ?? []) for (const name of resolve(from, trail)) all.add(name);
    return all;
  };
  for (const file of files) exports.set(file, resolve(file, new Set()));
  const flags = new Set([...helps.values()].flatMap((help) => [...declared(help)]));
  return { files, exports, members, imports, defaults: new Set(Object.keys(defaults)), flags };
}

// fileRefs picks the repository's files out of inline code: x.ts, docs/x.md, bench/x, test/x.
function fileRefs(code: string): string[] {
  if (/^[a-z]+:\/\//i.test(code)) return [];
  const refs: string[] = [];
  for (const token of code.split(/[\s,;()]+/)) {
    if (token.includes("*") || token.includes("<") || /^[\w-]+:/.test(token)) continue;
    const path = token.replace(/^\.\//, "").replace(/[.:]+$/, "");
    if (/^(?:[\w.-]+\/)*[\w.-]+\.(?:ts|md)$/.test(path) && !path.startsWith("/")) refs.push(path);
    else if (/^(?:bench|test|docs)\/[\w./-]+$/.test(path)) refs.push(path);
  }
  return refs;
}

/** checkNames reports every file, DEFAULTS key, flag and name() a page names that the code does not have. */
function checkNames(pages: readonly Page[], code: Code, scripts: ReadonlySet<string>): string[] {
  const problems: string[] = [];
  const exported = new Set([...code.exports.values()].flatMap((s) => [...s]));
  const inbox = code.members.get("Inbox") ?? new Set();
  const isMember = (owner: string, name: string) => code.members.get(INSTANCES.get(owner) ?? owner)?.has(name) ?? false;
  for (const page of pages) {
    const { spans, prose } = parse(page);
    const shown = shownFiles(page);
    for (const { line, code: text } of spans) {
      const where = `${page.path}:${line}: \`${text}\``;
      for (const path of fileRefs(text)) {
        if (shown.has(path)) continue;
        if (!existsSync(join(ROOT, path)) && !existsSync(join(ROOT, `${path}.ts`)))
          problems.push(`${where}: ${path} does not exist`);
      }
      for (const m of text.matchAll(/\bDEFAULTS\.([A-Za-z_$][\w$]*)/g)) {
        if (!code.defaults.has(m[1]!)) problems.push(`${where}: DEFAULTS has no ${m[1]}`);
      }
      const words = commandsOf(text)[0] ?? [];
      const first = words.find((x) => !/^[A-Za-z_][A-Za-z0-9_]*=/.test(x.word))?.word ?? "";
      const isCommand = RUNNERS.has(first) || (scripts.has(first) && words.length > 1);
      if (!isCommand) {
        for (const m of text.matchAll(/(?:^|[\s[(|,=])(--[a-z0-9][a-z0-9-]*)/g)) {
          if (!code.flags.has(m[1]!) && !FOREIGN_FLAGS.has(m[1]!))
            problems.push(`${where}: ${m[1]} is in no script's --help`);
        }
      }
      const call = /^(?:new\s+|await\s+)?([A-Za-z_$][\w$]*(?:!?\.[A-Za-z_$][\w$]*)*)\(.*\)$/s.exec(text);
      if (call) {
        const parts = call[1]!.replace(/!/g, "").split(".");
        const name = parts[parts.length - 1]!;
        const known =
          parts.length === 1
            ? exported.has(name) || inbox.has(name) || KNOWN_CALLS.has(name)
            : isMember(parts[parts.length - 2]!, name) || KNOWN_OBJECTS.has(parts[0]!);
        if (!known) problems.push(`${where}: ${call[1]}() is exported by no file here, and is no Inbox method`);
      }
    }
    // "`sign(…)` from `providers.ts`", "`lineLog()` in `log.ts`": that file must export the name.
    for (const m of prose.matchAll(
      /`(?:new\s+)?([A-Za-z_$][\w$]*)(?:\([^`]*\))?`\s+(?:from|in)\s+`(?:\.\/)?([\w/-]+\.ts)`/g,
    )) {
      const names = code.exports.get(m[2]!) ?? code.exports.get(`lib/${m[2]}`) ?? uniqueByName(code, m[2]!);
      if (names && !names.has(m[1]!))
        problems.push(`${page.path}:${lineAt(prose, m.index)}: ${m[2]} does not export ${m[1]}`);
    }
  }
  return problems;
}

/** uniqueByName is the exports of the one file under lib/ whose own name is name, if exactly one has it. */
function uniqueByName(code: Code, name: string): Set<string> | undefined {
  const found = code.files.filter((f) => posix.basename(f) === name);
  return found.length === 1 ? code.exports.get(found[0]!) : undefined;
}

/** checkLinks reports relative links to files that do not exist, and #anchors to headings that do not. */
function checkLinks(pages: readonly Page[], readPage: (path: string) => Page | undefined): string[] {
  const problems: string[] = [];
  for (const page of pages) {
    for (const { line, target } of parse(page).links) {
      if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // https:, mailto:
      const [path, anchor] = target.split("#", 2) as [string, string | undefined];
      const file = path === "" ? page.path : normalize(join(dirname(page.path), decodeURIComponent(path)));
      if (path !== "" && !existsSync(join(ROOT, file)) && !readPage(file)) {
        problems.push(`${page.path}:${line}: link to ${target}: ${file} does not exist`);
        continue;
      }
      if (anchor === undefined || !file.endsWith(".md")) continue;
      const other = readPage(file);
      if (!other || !parse(other).anchors.has(anchor))
        problems.push(`${page.path}:${line}: link to ${target}: ${file} has no heading #${anchor}`);
    }
  }
  return problems;
}

/**
 * checkHouse reports where docs/house.md's table of floors and imports is not what the code imports, and
 * any import circle in the code.
 */
function checkHouse(page: Page, code: Code): string[] {
  const problems: string[] = [];
  const visit = (file: string, path: string[]): void => {
    if (path.includes(file)) {
      if (file === path[0]) problems.push(`import circle: ${[...path, file].join(" → ")}`);
      return;
    }
    for (const dep of code.imports.get(file) ?? []) visit(dep, [...path, file]);
  };
  for (const file of code.files) visit(file, []);
  const floors = ["ground", "backends", "roles", "connect", "scripts"];
  const rows = new Map<string, { line: number; floor: string; imports: Set<string> }>();
  page.text.split("\n").forEach((line, i) => {
    const cells = line.split("|").map((c) => c.trim());
    const file = /^`([\w/-]+\.ts)`$/.exec(cells[1] ?? "")?.[1];
    if (!file || cells.length < 6 || !floors.includes(cells[2]!)) return;
    rows.set(file, {
      line: i + 1,
      floor: cells[2]!,
      imports: new Set([...cells[4]!.matchAll(/`([\w/-]+\.ts)`/g)].map((m) => m[1]!)),
    });
  });
  for (const file of code.files)
    if (!rows.has(file)) problems.push(`${page.path}: ${file} is not in the house's table`);
  for (const [file, row] of rows) {
    const where = `${page.path}:${row.line}: ${file}`;
    const actual = code.imports.get(file);
    if (!actual) {
      problems.push(`${where} does not exist`);
      continue;
    }
    const missing = [...actual].filter((f) => !row.imports.has(f));
    const extra = [...row.imports].filter((f) => !actual.has(f));
    if (missing.length > 0) problems.push(`${where} also imports ${missing.join(", ")}`);
    if (extra.length > 0) problems.push(`${where} does not import ${extra.join(", ")}`);
    for (const dep of actual) {
      const to = rows.get(dep);
      if (to && floors.indexOf(to.floor) > floors.indexOf(row.floor))
        problems.push(`${where} (${row.floor}) imports ${dep} from a floor above (${to.floor})`);
    }
  }
  return problems;
}

// ---- Snippets: every ```ts block, type-checked in one tsc run ----

/** packagePaths maps each of the package's exports to its source, as an app's import resolves it once built. */
function packagePaths(up: string): Record<string, string[]> {
  const exports = (
    JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as {
      exports: Record<string, { types?: string } | string>;
    }
  ).exports;
  const paths: Record<string, string[]> = {};
  for (const [key, value] of Object.entries(exports)) {
    if (typeof value === "string" || !value.types) continue;
    paths[`webhook-inbox${key.slice(1)}`] = [
      `${up}/${value.types.replace(/^\.\/dist\//, "").replace(/\.d\.ts$/, ".ts")}`,
    ];
  }
  return paths;
}

interface SnippetReport {
  problems: string[];
  checked: number;
  optedOut: number;
}

/**
 * checkSnippets writes every ```ts snippet of each group of pages to its own folder under dir, runs tsc
 * once over all of them, and reports each group's errors against the page and line they came from.
 */
async function checkSnippets(groups: readonly (readonly Page[])[], dir: string): Promise<SnippetReport[]> {
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  const up = relative(dir, ROOT).replace(/\\/g, "/");
  writeFileSync(
    join(dir, "tsconfig.json"),
    JSON.stringify(
      {
        extends: `${up}/tsconfig.json`,
        compilerOptions: { noEmit: true, paths: packagePaths(up) },
        include: ["*/*.mts"],
      },
      null,
      2,
    ),
  );
  // Each generated line remembers where it came from, so an error points at the page.
  const origin = new Map<string, { group: number; page: string; lines: string[] }>();
  const reports: SnippetReport[] = groups.map(() => ({ problems: [], checked: 0, optedOut: 0 }));
  const pointAt = (text: string, depth: string) =>
    text.replace(
      /(\bfrom\s+|\bimport\s*\(\s*|^\s*import\s+)(["'])\.\/([^"']+)\2/gm,
      (_m, lead: string, q: string, path: string) => `${lead}${q}${depth}/${path}${q}`,
    );
  groups.forEach((pages, g) => {
    mkdirSync(join(dir, `g${g}`));
    const depth = `../${up}`;
    for (const page of pages) {
      const fences = parse(page).fences.filter((f) => f.lang === "ts" || f.lang === "typescript");
      const byId = new Map<string, Fence>();
      fences.forEach((fence, n) => {
        const id = fence.info.find((w) => w.startsWith("id="))?.slice(3);
        if (id) byId.set(id, fence);
        if (fence.info.includes("no-check")) {
          reports[g]!.optedOut++;
          return;
        }
        const parts: { text: string; from: (i: number) => string }[] = [];
        for (const name of fence.info.filter((w) => w.startsWith("after=")).map((w) => w.slice(6))) {
          const earlier = byId.get(name);
          if (!earlier) {
            reports[g]!.problems.push(
              `${page.path}:${fence.line}: after=${name}, but no earlier \`\`\`ts id=${name} on this page`,
            );
            continue;
          }
          parts.push({ text: earlier.body, from: (i) => `${page.path}:${earlier.line + 1 + i}` });
        }
        if (fence.prelude.trim() !== "")
          parts.push({
            text: fence.prelude,
            from: (i) => `${page.path}:${fence.line - 1} (its ts-prelude, line ${i + 1})`,
          });
        parts.push({ text: fence.body, from: (i) => `${page.path}:${fence.line + 1 + i}` });
        const lines: string[] = [];
        const from: string[] = [];
        for (const part of parts) {
          part.text.split("\n").forEach((text, i) => {
            lines.push(pointAt(text, depth));
            from.push(part.from(i));
          });
        }
        // export {} makes even a snippet without imports a module, so top-level await is allowed.
        lines.push("export {};");
        from.push(`${page.path}:${fence.line}`);
        // .mts, not .ts: the project's own tsc (test/**/*.ts) never picks up a snippet left behind.
        const file = `g${g}/${page.path.replace(/[^\w]+/g, "-")}-${n + 1}.mts`;
        writeFileSync(join(dir, file), lines.join("\n") + "\n");
        origin.set(file, { group: g, page: page.path, lines: from });
        reports[g]!.checked++;
      });
    }
  });
  if (origin.size === 0) return reports;
  const tsc = join(ROOT, "node_modules", "typescript", "bin", "tsc");
  const output = await new Promise<string>((resolve, reject) => {
    const child = spawn(process.execPath, [tsc, "-p", join(dir, "tsconfig.json"), "--pretty", "false"], { cwd: ROOT });
    let out = "";
    child.stdout.on("data", (d) => (out += d));
    child.stderr.on("data", (d) => (out += d));
    child.on("error", reject);
    child.on("close", () => resolve(out));
  });
  for (const line of output.split("\n")) {
    if (line.trim() === "" || /^\s/.test(line)) continue;
    const m = /^(.*?)\((\d+),(\d+)\): (error .*)$/.exec(line);
    const file = m ? relative(dir, join(ROOT, m[1]!)).replace(/\\/g, "/") : "";
    const known = origin.get(file);
    if (m && known) {
      reports[known.group]!.problems.push(`${known.lines[Number(m[2]) - 1] ?? known.page}: ${m[4]}`);
    } else {
      // An error outside the snippets (the code itself) fails every group: nothing was really checked.
      for (const report of reports) report.problems.push(`tsc: ${line}`);
    }
  }
  return reports;
}

// ---- The pages, the scripts' help, and the code, read once ----

function readPages(): Page[] {
  const paths = [
    "README.md",
    ...readdirSync(join(ROOT, "docs"))
      .filter((f) => f.endsWith(".md"))
      .sort()
      .map((f) => `docs/${f}`),
  ];
  return paths.map((path) => ({ path, text: readFileSync(join(ROOT, path), "utf8") }));
}

/** The scripts: top-level files with a commander program, so they answer --help. */
function readScripts(): Set<string> {
  const files = readdirSync(ROOT).filter((f) => f.endsWith(".ts"));
  return new Set(
    files.filter((f) => /\bimport\(\s*"commander"\s*\)|\bfrom\s+"commander"/.test(readFileSync(join(ROOT, f), "utf8"))),
  );
}

// collectHelps runs each script's --help once (and, for inbox.ts, each subcommand's that a command
// names), a few at a time.
async function collectHelps(
  scripts: ReadonlySet<string>,
  wanted: ReadonlySet<string>,
  done: ReadonlyMap<string, string>,
): Promise<Map<string, string>> {
  const helps = new Map(done);
  const keys = [...new Set([...scripts, ...wanted])].filter((key) => !done.has(key));
  const take = async (key: string) => {
    const [script, ...sub] = key.split(" ");
    if (!scripts.has(script!)) return;
    const result = await runScript(script!, [...sub, "--help"]);
    if (result.code === 0) helps.set(key, result.stdout);
  };
  const queue = [...keys];
  await Promise.all(
    Array.from({ length: 4 }, async () => {
      for (let key = queue.shift(); key !== undefined; key = queue.shift()) await take(key);
    }),
  );
  return helps;
}

// subcommandsOf reads the commands a commander --help lists under "Commands:".
function subcommandsOf(help: string): Set<string> {
  const block = /\nCommands:\n([\s\S]*?)(?:\n\S|$)/.exec(help)?.[1] ?? "";
  return new Set([...block.matchAll(/^\s{2}([a-z][\w-]*)/gm)].map((m) => m[1]!).filter((name) => name !== "help"));
}

async function benchNames(): Promise<Set<string>> {
  // bench/run.ts lists its benchmarks when asked for one that does not exist.
  const result = await runScript("bench/run.ts", ["no-such-benchmark"]);
  return new Set(/choose from (.*)$/m.exec(result.stderr)?.[1]?.split(/,\s*/) ?? []);
}

// ---- The made-up pages of the control ----

const CONTROL: Page[] = [
  {
    path: "docs/control-a.md",
    text: [
      "# Control",
      "",
      "```sh",
      "npx tsx worker.ts --once --no-such-flag      # a flag that does not exist",
      "npx tsx inbox.ts retyr evt_1                 # a subcommand that does not exist",
      "npx tsx inbox.ts purge --all-failed          # a flag of another subcommand",
      "npm run demo -- --sqlite                     # demo.ts has no --sqlite",
      "npx tsx gone.ts --port 1                     # a script that does not exist",
      "npm run bench -- ingest no-such-bench",
      "```",
      "",
      "Inline: `npx tsx receiver.ts --max-bodies 10`, and in prose `--forget-before`.",
      "Files: `gone.ts`, `bench/gone.ts`, `docs/gone.md`, and `inbox.ts` that is here.",
      "Defaults: `DEFAULTS.leaseMs` is here, `DEFAULTS.noSuchDefault` is not.",
      "Names: `createHandler()` is here, `createHandlers()` is not; `inbox.claimBatch()` is, `inbox.claimAll()` is not.",
      "The old layout: `loadSources` from `inbox.ts`.",
      "Links: [here](control-b.md#a-heading), [gone](gone.md), [no anchor](control-b.md#no-heading), [self](#control).",
      "",
      "```ts",
      'import { connect } from "./inbox.ts";',
      "const inbox = await connect(42); // a snippet that does not type-check",
      "```",
      "",
      "```ts no-check",
      "this is opted out",
      "```",
      "",
      "```ts after=missing",
      "const x = 1;",
      "```",
    ].join("\n"),
  },
  {
    path: "docs/control-b.md",
    text: "# Control B\n\n## A heading\n\n<!-- ts-prelude\nconst n = 1;\n-->\n```ts\nconst m: number = n;\n```\n",
  },
];

// ---- The tests ----

const pages = readPages();
const scripts = readScripts();
let helps: Map<string, string>;
let code: Code;
let commands: Command[];
let benches: Set<string>;
let snippets: Promise<SnippetReport[]>;
const readPage = (path: string) =>
  pages.find((p) => p.path === path) ??
  CONTROL.find((p) => p.path === path) ??
  (existsSync(join(ROOT, path)) && path.endsWith(".md")
    ? { path, text: readFileSync(join(ROOT, path), "utf8") }
    : undefined);

before(async () => {
  // tsc starts at once, beside the --help runs.
  snippets = checkSnippets([pages, CONTROL], SNIPPETS);
  snippets.catch(() => {});
  const parent = await runScript("inbox.ts", ["--help"]);
  const subs = subcommandsOf(parent.stdout);
  commands = commandsIn([...pages, ...CONTROL], scripts, subs);
  const wanted = new Set(
    commands.filter((c) => c.sub !== undefined && subs.has(c.sub)).map((c) => helpKey(c.script, c.sub)),
  );
  [helps, benches] = await Promise.all([
    collectHelps(scripts, wanted, new Map([["inbox.ts", parent.stdout]])),
    benchNames(),
  ]);
  code = readCode(DEFAULTS, helps);
});

after(() => rmSync(SNIPPETS, { recursive: true, force: true }));

const real = (c: Command) => !c.page.startsWith("docs/control-");
const report = (problems: readonly string[]) => `\n  ${problems.join("\n  ")}`;

describe("the README", () => {
  it("opens with the two set-up commands, npm run demo and npm test", () => {
    const first = parse(pages[0]!).fences[0]!;
    assert.equal(first.lang, "sh");
    assert.deepEqual(
      first.body.split("\n").map((l) => l.replace(/\s*#.*$/, "")),
      ["npm install && npm run demo", "npm test"],
    );
  });

  it("stays short: at most 250 lines", () => {
    assert.ok(pages[0]!.text.split("\n").length <= 250, `README.md is ${pages[0]!.text.split("\n").length} lines`);
  });
});

describe("the docs (README.md and docs/*.md)", () => {
  it("run scripts only with the subcommands and flags each script's --help lists", () => {
    const mine = commands.filter(real);
    const problems = checkCommands(mine, helps, benches);
    const flags = mine.reduce((n, c) => n + c.flags.length, 0);
    console.log(`# docs: ${mine.length} commands checked, ${flags} flags, against ${helps.size} --help texts`);
    assert.ok(mine.length > 20, "the commands were not found");
    assert.deepEqual(problems, [], report(problems));
  });

  it("hold TypeScript snippets that type-check against the code", async () => {
    const [mine] = await snippets;
    console.log(`# docs: ${mine!.checked} TypeScript snippets type-checked, ${mine!.optedOut} opted out with no-check`);
    assert.ok(mine!.checked > 5, "the snippets were not found");
    assert.deepEqual(mine!.problems, [], report(mine!.problems));
  });

  it("name only files, DEFAULTS, flags and exports that exist", () => {
    const problems = checkNames(pages, code, scripts);
    assert.deepEqual(problems, [], report(problems));
  });

  it("link only to files and headings that exist", () => {
    const problems = checkLinks(pages, readPage);
    assert.deepEqual(problems, [], report(problems));
  });

  it("draw the house as the code imports: every file on its floor, no import from a floor above, no circle", () => {
    const problems = checkHouse(readPage("docs/house.md")!, code);
    assert.deepEqual(problems, [], report(problems));
  });

  it("open each page with a heading and a line or two on what it covers and who it is for", () => {
    const problems = pages
      .filter((p) => p.path.startsWith("docs/"))
      .flatMap((p) => {
        const [title, blank, first] = p.text.split("\n");
        return /^# \S/.test(title ?? "") && blank === "" && /^[A-Z`*]/.test(first ?? "")
          ? []
          : [`${p.path}: opens with ${JSON.stringify(title)}`];
      });
    assert.deepEqual(problems, [], report(problems));
  });
});

describe("the docs checks (a control, on made-up pages)", () => {
  it("report a flag no --help lists, an unknown subcommand or script, and an unknown benchmark", () => {
    const problems = checkCommands(
      commands.filter((c) => !real(c)),
      helps,
      benches,
    ).join("\n");
    assert.match(problems, /--no-such-flag is not in `worker\.ts --help`/);
    assert.match(problems, /inbox\.ts has no command retyr/);
    assert.match(problems, /--all-failed is not in `inbox\.ts purge --help`/);
    assert.match(problems, /--sqlite is not in `demo\.ts --help`/);
    assert.match(problems, /gone\.ts does not exist/);
    assert.match(problems, /no benchmark named no-such-bench/);
    assert.match(problems, /--max-bodies is not in `receiver\.ts --help`/);
    assert.doesNotMatch(problems, /--once is not|named ingest\b/);
  });

  it("report a missing file, DEFAULTS key, export or flag, and nothing that is there", () => {
    const problems = checkNames(CONTROL, code, scripts).join("\n");
    for (const re of [
      /gone\.ts does not exist/,
      /bench\/gone\.ts does not exist/,
      /docs\/gone\.md does not exist/,
      /DEFAULTS has no noSuchDefault/,
      /createHandlers\(\) is exported by no file/,
      /inbox\.claimAll\(\) is exported by no file/,
      /inbox\.ts does not export loadSources/,
      /--forget-before is in no script's --help/,
    ]) {
      assert.match(problems, re);
    }
    assert.doesNotMatch(problems, /has no leaseMs|createHandler\(\) is|claimBatch\(\) is|: inbox\.ts does not exist/);
  });

  it("report a link to a missing file or heading, and pass the ones that resolve", () => {
    const problems = checkLinks(CONTROL, readPage).join("\n");
    assert.match(problems, /link to gone\.md: docs\/gone\.md does not exist/);
    assert.match(problems, /link to control-b\.md#no-heading: docs\/control-b\.md has no heading #no-heading/);
    assert.doesNotMatch(problems, /#a-heading|#control\b/);
  });

  it("report a snippet that does not type-check, count one opted out, and give a ts-prelude to the next", async () => {
    const [, control] = await snippets;
    const problems = control!.problems.join("\n");
    assert.match(problems, /docs\/control-a\.md:\d+: error TS2345/);
    assert.match(problems, /after=missing, but no earlier/);
    assert.doesNotMatch(problems, /control-b/);
    assert.equal(control!.optedOut, 1);
  });

  it("report a house table that misplaces a file's imports", () => {
    const house = readPage("docs/house.md")!;
    // order.ts up among the scripts, with an import it does not have.
    const moved = {
      path: house.path,
      text: house.text.replace(
        /^(\| `(?:lib\/)?order\.ts` \|) roles (\|.*\|) (.*?) \|$/m,
        "$1 scripts $2 $3, `worker.ts` |",
      ),
    };
    assert.notEqual(moved.text, house.text, "the control could not edit the house's table");
    const problems = checkHouse(moved, code).join("\n");
    assert.match(problems, /order\.ts does not import (?:.*, )?worker\.ts/);
    assert.match(problems, /providers\.ts \(roles\) imports lib\/order\.ts from a floor above \(scripts\)/);
  });

  it("read an import from lib/ up to a script, static or dynamic, as an arrow", () => {
    assert.deepEqual(
      [
        ...importsOf(
          'import { run } from "../../worker.ts";\nconst m = await import("../../inbox.ts");\nimport { x } from "../store.ts";',
          "lib/sqlite/sqlite.ts",
        ),
      ],
      ["worker.ts", "lib/store.ts", "inbox.ts"],
    );
  });

  it("report an import circle", () => {
    const imports = new Map(code.imports);
    imports.set("lib/order.ts", new Set([...imports.get("lib/order.ts")!, "lib/providers.ts"]));
    const problems = checkHouse(readPage("docs/house.md")!, { ...code, imports }).join("\n");
    assert.match(problems, /import circle: lib\/order\.ts → lib\/providers\.ts → lib\/order\.ts/);
  });
});

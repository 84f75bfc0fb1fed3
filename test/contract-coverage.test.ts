// test/contract-coverage.test.ts: the contract suite calls every Inbox method. It reads the members of the
// Inbox interface in lib/store.ts and fails, naming each, if none of the files test/contract-*.test.ts calls
// it (`.name(` or `.name?.(`; a readonly field is read, `.name`). No database: it reads the source alone.
//   npx node --import tsx --test test/contract-coverage.test.ts

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";
import { CONTRACT_FILES, ROOT } from "./helpers.ts";

/** Member is one member of an interface: a method, or a readonly field. */
interface Member {
  name: string;
  method: boolean;
}

// membersOf reads an exported interface's members from TypeScript source: the lines two spaces in, between
// its opening line and the closing brace in the first column (its doc comments skipped).
function membersOf(source: string, name: string): Member[] {
  const start = source.indexOf(`export interface ${name} {`);
  if (start < 0) throw new Error(`no export interface ${name} in the source`);
  const end = source.indexOf("\n}", start);
  const members: Member[] = [];
  for (const line of source.slice(start, end).split("\n").slice(1)) {
    const m = /^ {2}(readonly )?([A-Za-z_$][\w$]*)(\?)?\s*([(<:])/.exec(line);
    if (m) members.push({ name: m[2]!, method: m[4] !== ":" });
  }
  return members;
}

// code drops comments, so a method named in one is not taken for a call.
const code = (source: string): string => source.replace(/\/\*[\s\S]*?\*\//g, "").replace(/(^|[^:])\/\/.*$/gm, "$1");

// uncalled names the members that no test calls (a method) or reads (a field).
function uncalled(members: readonly Member[], tests: readonly string[]): string[] {
  const text = tests.map(code).join("\n");
  return members
    .filter(({ name, method }) => {
      const escaped = name.replace(/\$/g, "\\$");
      // suite.target is the harness's target, not an inbox's.
      return !new RegExp(method ? `\\.${escaped}(\\?\\.)?\\(` : `(?<!\\bsuite)\\.${escaped}\\b`).test(text);
    })
    .map(({ name, method }) => (method ? `${name}()` : name));
}

const read = (path: string) => readFileSync(join(ROOT, path), "utf8");

describe("the contract suite", () => {
  it("calls every member of the Inbox interface, on the files test/contract-*.test.ts", () => {
    const members = membersOf(read("lib/store.ts"), "Inbox");
    assert.ok(members.length >= 35, `read ${members.length} members of Inbox`);
    // This file aside: its control names members that a test would call.
    const tests = CONTRACT_FILES.filter((f) => f !== "test/contract-coverage.test.ts");
    assert.ok(tests.length >= 6, `read ${tests.join(", ")}`);
    assert.deepEqual(uncalled(members, tests.map(read)), [], "members of Inbox no contract test calls");
  });

  it("(control) names a member that no test calls, one only named in a comment, and a field read off the harness alone", () => {
    const made = `/** Made is a made-up contract. */
export interface Made {
  readonly backend: string;
  readonly target: string;
  /** store saves. */
  store(delivery: unknown): Promise<void>;
  claim<T>(n: number): Promise<T>;
  teleport(to: string): Promise<void>;
  whisper(): void;
}
export interface After {
  afterwards(): void;
}`;
    assert.deepEqual(membersOf(made, "Made"), [
      { name: "backend", method: false },
      { name: "target", method: false },
      { name: "store", method: true },
      { name: "claim", method: true },
      { name: "teleport", method: true },
      { name: "whisper", method: true },
    ]);
    const tests = [
      `const inbox = await open(suite.target);\nassert.equal(inbox.backend, "sqlite");\nawait inbox.store({});`,
      `await inbox.claim?.(1);\n// inbox.whisper() is for later\n/* and inbox.teleport("x") too */`,
    ];
    assert.deepEqual(uncalled(membersOf(made, "Made"), tests), ["target", "teleport()", "whisper()"]);
    assert.throws(() => membersOf(made, "Missing"), /no export interface Missing/);
  });
});

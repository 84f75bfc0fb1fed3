// test/repo.test.ts: the repository itself, as a clean clone sees it. A merge that commits its conflict
// markers breaks CI's first line (.ci/run) before any other test can say why, so this one says it first.
//   npx node --import tsx --test test/repo.test.ts

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";
import { ROOT } from "./helpers.ts";

// conflictMarkers lists the lines of text that git left as conflict markers, as "file:line".
export function conflictMarkers(files: { name: string; text: string }[]): string[] {
  const found: string[] = [];
  for (const { name, text } of files) {
    text.split("\n").forEach((line, i) => {
      if (/^(<{7}|>{7})( |$)/.test(line) || /^={7}$/.test(line)) found.push(`${name}:${i + 1}`);
    });
  }
  return found;
}

describe("the repository", () => {
  it("has no merge-conflict markers in any tracked text file", () => {
    const names = execFileSync("git", ["ls-files", "-z"], { cwd: ROOT, encoding: "utf8" }).split("\0").filter(Boolean);
    const files = names
      .map((name) => ({ name, bytes: readFileSync(join(ROOT, name)) }))
      .filter((f) => !f.bytes.includes(0))
      .map((f) => ({ name: f.name, text: f.bytes.toString("utf8") }));
    assert.ok(files.length > 50, `read ${files.length} tracked files`);
    assert.deepEqual(conflictMarkers(files), []);
  });

  it("finds the markers a conflicted merge leaves (the control)", () => {
    const text = ["a", "<<<<<<< HEAD", "ours", "=======", "theirs", ">>>>>>> main", "b"].join("\n");
    assert.deepEqual(conflictMarkers([{ name: ".ci/run", text }]), [".ci/run:2", ".ci/run:4", ".ci/run:6"]);
  });
});

// bench/regex.ts: what a filter's `$regex` costs on RE2 (re2js, linear time) against JavaScript's own
// backtracking RegExp, in the same run (docs/forwarding.md, "Bounds"). One test of an ordinary short string
// through a compiled filter, against the same pattern's RegExp.test() on the same string; then the bound: one
// filter reading its whole DEFAULTS.filterRegexChars budget of ordinary text.
//   npm run bench -- regex          BENCH_REGEX_TESTS=50000 npm run bench -- regex

import { DEFAULTS } from "../lib/defaults.ts";
import { compileFilter, filterInput } from "../lib/routing/filter.ts";
import { f, knob } from "./common.ts";

const TESTS = knob("BENCH_REGEX_TESTS", 200_000);
const PATTERN = "^(refund|charge)\\.[a-z_]+$";
const NAMES = ["charge.succeeded", "refund.updated", "invoice.paid", "customer.created"];

// perTest times fn over n calls and gives µs a call, the best of three passes (the first warms the JIT).
function perTest(n: number, fn: (i: number) => boolean): number {
  let best = Infinity;
  for (let pass = 0; pass < 3; pass++) {
    const started = performance.now();
    let hits = 0;
    for (let i = 0; i < n; i++) if (fn(i)) hits++;
    const took = ((performance.now() - started) * 1000) / n;
    if (hits === 0) throw new Error("regex bench: nothing matched; the bench measures nothing");
    best = Math.min(best, took);
  }
  return best;
}

const arrival = { source: "shop", eventType: null, body: Buffer.from("{}"), headers: {}, url: "/shop" };
const input = (name: string) => filterInput({ ...arrival, parsed: { name } });

/** regex prints RE2's µs a test against RegExp's, and the time one filter's whole budget takes. */
export async function regex(): Promise<string> {
  const filter = compileFilter({ body: { name: { $regex: PATTERN } } }, "bench");
  const inputs = NAMES.map(input);
  // The filter's own walk (the body's field, the budget) with an operator that costs next to nothing.
  const plain = compileFilter({ body: { name: { $startsWith: "c" } } }, "bench");
  const plainUs = perTest(TESTS, (i) => plain(inputs[i % inputs.length]!));
  const re2Us = perTest(TESTS, (i) => filter(inputs[i % inputs.length]!));
  const native = new RegExp(PATTERN);
  const nativeUs = perTest(TESTS, (i) => native.test(NAMES[i % NAMES.length]!));
  // The bound: one string of ordinary words just inside the budget, all of it read by the pattern (the
  // catastrophic one for RegExp, linear on RE2), so the time is what one filter may cost at most.
  const notes = "word ".repeat(Math.floor((DEFAULTS.filterRegexChars - 1) / 5)).trimEnd();
  const wide = compileFilter({ body: { notes: { $regex: "^(\\w+\\s?)*$" } } }, "bench");
  const boundMs = perTest(20, () => wide(filterInput({ ...arrival, parsed: { notes } })) || true) / 1000;
  const lines = [
    `regex: pattern ${PATTERN} on short event names, ${TESTS.toLocaleString("en")} tests a pass, best of 3`,
    `  RegExp.test (backtracking, not used)   ${f(nativeUs, 3)} µs a test`,
    `  filter with $regex on RE2 (re2js)      ${f(re2Us, 3)} µs a test = ${f(re2Us / nativeUs, 1)}x RegExp`,
    `  the same filter with $startsWith       ${f(plainUs, 3)} µs a test (the walk alone)`,
    `  one filter reading its whole budget (${DEFAULTS.filterRegexChars.toLocaleString("en")} characters of words): ${f(boundMs, 1)} ms`,
  ];
  for (const line of lines) console.log(line);
  return lines.join("\n");
}

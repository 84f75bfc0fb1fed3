// log.ts: what the scripts write for people and for log collectors: one line per delivery (text, or
// JSON in pino's shape), a live progress line on a terminal, and message() for anything thrown.
// Not run on its own.

import { DEFAULTS } from "./defaults.ts";

/** label names a delivery in logs: just its ID for the article's default source, else source/id. */
export function label(d: { source: string; id: string }): string {
  return d.source === DEFAULTS.source ? d.id : `${d.source}/${d.id}`;
}

/** LogFormat is how lineLog writes: the text lines people read, or one JSON object per line for a collector. */
export type LogFormat = "text" | "json";
export const LOG_FORMATS: readonly LogFormat[] = ["text", "json"];

/**
 * LogFields are what a JSON log line carries beside its message: which delivery, and where it ended up
 * (an HTTP status from the receiver, a delivery's status from the worker). Never a body or a secret.
 */
export interface LogFields {
  level?: "debug" | "info" | "warn" | "error";
  source?: string;
  id?: string;
  status?: number | string;
  [key: string]: unknown;
}

/** Log is one line for an entry point's log; fields go into the JSON format only. */
export type Log = (line: string, fields?: LogFields) => void;

/** silent is the Log that writes nothing (the receiver's --quiet): given it, a caller need not build the lines. */
export const silent: Log = () => {};

// pino's numeric levels, so a collector that reads pino reads these too.
const LEVELS = { debug: 20, info: 30, warn: 40, error: 50 } as const;

/** jsonLine is one log event in pino's shape: level, time (ms since the epoch), msg, then the fields. */
export function jsonLine(line: string, fields: LogFields = {}, time: number = Date.now()): string {
  const { level = "info", ...rest } = fields;
  return JSON.stringify({ level: LEVELS[level], time, msg: line, ...rest });
}

/**
 * lineLog returns a logger for an entry point's one line per delivery. A write to a pipe or a file is
 * synchronous, so the lines of one turn of the event loop go out in one write rather than one each:
 * under load that is a batch of deliveries per system call. Call flush before exiting. With format
 * "json" each line is one JSON object (jsonLine); the text format ignores the fields.
 */
export function lineLog(
  stream: { write(text: string): unknown } = process.stderr,
  format: LogFormat = "text",
): { log: Log; flush: () => void } {
  const lines: string[] = [];
  const flush = () => {
    if (lines.length > 0) stream.write(`${lines.splice(0).join("\n")}\n`);
  };
  const log: Log =
    format === "json"
      ? (line, fields) => void (lines.push(jsonLine(line, fields)) === 1 && setImmediate(flush))
      : (line) => void (lines.push(line) === 1 && setImmediate(flush));
  return { log, flush };
}

/** Progress is a live status line on a terminal: how far, how fast, how long still. */
export interface Progress {
  /** write puts text above the status line (log lines), which is drawn again below it. */
  write(text: string): void;
  /** stop clears the status line for good. */
  stop(): void;
}

/**
 * progress draws "done of total (percent), rate/s, time left" on one line of stream, redrawn every
 * everyMs (a total of 0: not known, so "done" alone), only if stream is a terminal: anything else (a pipe, a file, a log collector) gets nothing
 * extra, and progress returns undefined. read says how far the work is; extra adds to the line.
 */
export function progress(
  stream: { write(text: string): unknown; isTTY?: boolean },
  read: () => { done: number; total: number; extra?: string },
  options: { everyMs?: number; now?: () => number } = {},
): Progress | undefined {
  if (!stream.isTTY) return undefined;
  const now = options.now ?? (() => performance.now());
  const started = now();
  const line = () => {
    const { done, total, extra } = read();
    const seconds = Math.max(0.001, (now() - started) / 1000);
    const rate = done / seconds;
    const left = rate > 0 && total > done ? `, ${clock((total - done) / rate)} left` : "";
    const pct = total > 0 ? ` (${Math.min(100, Math.floor((100 * done) / total))}%)` : "";
    // A total of 0 is one not known (a provider's list has no count): how far, without "of".
    const of = total > 0 ? ` of ${total.toLocaleString("en-US")}` : "";
    return `${done.toLocaleString("en-US")}${of}${pct}, ${Math.round(rate).toLocaleString("en-US")}/s${left}${extra ? `, ${extra}` : ""}`;
  };
  // \r and erase-line: the status line is redrawn where it stands, and cleared before anything else prints.
  const draw = () => void stream.write(`\r\x1b[K${line()}`);
  draw();
  const timer = setInterval(draw, options.everyMs ?? 200);
  timer.unref();
  let stopped = false;
  return {
    write: (text) => {
      if (stopped) return void stream.write(text);
      stream.write(`\r\x1b[K${text}`);
      draw();
    },
    stop: () => {
      if (stopped) return;
      stopped = true;
      clearInterval(timer);
      stream.write("\r\x1b[K");
    },
  };
}

function clock(seconds: number): string {
  const s = Math.ceil(seconds);
  return s < 60
    ? `${s} s`
    : s < 3600
      ? `${Math.floor(s / 60)} min ${s % 60} s`
      : `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

/** message turns anything thrown into one line. */
export function message(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

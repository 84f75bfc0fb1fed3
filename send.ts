// send.ts: a sender, on undici, that replays the article's story: evt_100 three times (the provider
// retried) and evt_101 once. Point it at a running receiver:
//   npx tsx send.ts [--url http://127.0.0.1:8000]
// It prints "evt_100: stored", then "evt_100: duplicate", and so on.

import { pathToFileURL } from "node:url";
import { request } from "undici";
import { DEFAULTS, message } from "./inbox.ts";

/** Outgoing is one webhook to send: its delivery ID and its JSON event. */
export interface Outgoing {
  id: string;
  event: unknown;
}

/** STORY is the article's four deliveries; the repeats keep their ID, as a provider's retry would. */
export const STORY: readonly Outgoing[] = [
  { id: "evt_100", event: { customer: "Maria Lopez", amount: 24.99 } },
  { id: "evt_100", event: { customer: "Maria Lopez", amount: 24.99 } },
  { id: "evt_101", event: { customer: "Sam Okafor", amount: 12.5 } },
  { id: "evt_100", event: { customer: "Maria Lopez", amount: 24.99 } },
];

/** send posts one delivery and returns the receiver's status and answer. */
export async function send(url: string, delivery: Outgoing): Promise<{ status: number; text: string }> {
  const response = await request(url, {
    method: "POST",
    headers: { "content-type": "application/json", "x-delivery-id": delivery.id },
    body: JSON.stringify(delivery.event),
  });
  return { status: response.statusCode, text: (await response.body.text()).trim() };
}

async function main(argv: string[]): Promise<void> {
  const { Command } = await import("commander");
  const program = new Command("send.ts")
    .description("Send the article's deliveries, duplicates included, to a receiver.")
    .option("--url <url>", "the receiver's address", `http://${DEFAULTS.host}:${DEFAULTS.port}`)
    .addHelpText("after", `
Examples:
  npx tsx receiver.ts &    # in another terminal
  npx tsx send.ts
  npx tsx send.ts --url http://127.0.0.1:9000`)
    .showHelpAfterError("(run with --help for usage)");
  program.exitOverride((error) => process.exit(error.exitCode === 0 ? 0 : 2));
  await program.parseAsync(argv);
  const { url } = program.opts<{ url: string }>();
  try {
    new URL(url);
  } catch {
    console.error(`send: --url must be an address such as http://127.0.0.1:8000, got ${url}`);
    process.exit(2);
  }

  for (const delivery of STORY) {
    try {
      const { status, text } = await send(url, delivery);
      console.log(status === 200 ? `${delivery.id}: ${text}` : `${delivery.id}: ${status} ${text}`);
      if (status !== 200) process.exitCode = 1;
    } catch (error) {
      const refused = (error as { code?: string }).code === "ECONNREFUSED";
      console.error(refused
        ? `send: no receiver at ${url} (connection refused); start one with: npx tsx receiver.ts`
        : `send: ${delivery.id} could not be sent to ${url}: ${message(error)}`);
      process.exit(1);
    }
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) await main(process.argv);

// test/providers-postgres.test.ts: the providers' cases over real HTTP with the inbox on PostgreSQL. A
// representative subset of test/providers-http.test.ts (which runs them all on SQLite): for every provider a
// valid delivery is stored, a bad signature gets 401 and stores nothing, and a resend is a duplicate, all
// through receiver.ts --sources … --db postgres://… as a real process.
//   npx node --import tsx --test test/providers-postgres.test.ts

import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { connect } from "../inbox.ts";
import type { Inbox } from "../lib/store.ts";
import { sign, type Preset } from "../lib/providers.ts";
import { STANDARD, STRIPE_SECRET } from "./provider-fixtures.ts";
import { freshSchema, postgresSkip, startReceiver, tempDir, type ReceiverProcess } from "./helpers.ts";

const pgSkip = await postgresSkip();
// The big five and plain; every preset runs over HTTP on SQLite in providers-http.test.ts and mounts.test.ts.
const SECRETS: Partial<Record<Preset, string>> = {
  standard: STANDARD.secret,
  stripe: STRIPE_SECRET,
  github: "gh-secret",
  shopify: "shpss_secret",
  slack: "slack-signing-secret",
  plain: "plain-secret",
};
const PROVIDERS = Object.keys(SECRETS) as Preset[];

// A provider-shaped body with this ID and type, signed now: receiver.ts runs on the real clock.
function delivery(provider: Preset, id: string, type: string): { body: string; headers: Record<string, string> } {
  const body =
    provider === "stripe"
      ? JSON.stringify({ id, object: "event", type, data: { object: { amount: 5 } } })
      : provider === "slack"
        ? JSON.stringify({ type: "event_callback", event_id: id, event: { type } })
        : provider === "standard"
          ? JSON.stringify({ type, data: {} })
          : JSON.stringify({ n: 1 });
  const signed = sign(provider, SECRETS[provider]!, { id, body, timestampS: Date.now() / 1000, eventType: type });
  return { body, headers: { "content-type": "application/json", ...signed } };
}

describe("the providers over HTTP, on PostgreSQL", { skip: pgSkip }, () => {
  let schema: Awaited<ReturnType<typeof freshSchema>>;
  let dir: ReturnType<typeof tempDir>;
  let receiver: ReceiverProcess;
  let inbox: Inbox;
  const post = async (provider: Preset, d: { body: string; headers: Record<string, string> }) => {
    const res = await fetch(`${receiver.url}/${provider}`, { method: "POST", headers: d.headers, body: d.body });
    return { status: res.status, text: await res.text() };
  };

  before(async () => {
    schema = await freshSchema("providers");
    dir = tempDir("providers-pg-");
    const file = join(dir.dir, "sources.json");
    writeFileSync(
      file,
      JSON.stringify(Object.fromEntries(PROVIDERS.map((p) => [p, { provider: p, secret: SECRETS[p] }]))),
    );
    receiver = await startReceiver(schema.url, ["--sources", file]);
    inbox = await connect(schema.url);
  });
  after(async () => {
    await receiver?.stop();
    await inbox?.close();
    dir?.cleanup();
    await schema?.drop();
  });

  for (const provider of PROVIDERS) {
    it(`${provider}: stores a valid delivery, refuses a bad signature with 401, answers a resend duplicate`, async () => {
      const id = `${provider}-evt-1`;
      const good = delivery(provider, id, "payment.succeeded");
      assert.deepEqual(await post(provider, good), { status: 200, text: "stored" });

      const forged = delivery(provider, `${provider}-forged`, "payment.succeeded");
      forged.body = forged.body.replace("}", " }");
      const refused = await post(provider, forged);
      assert.equal(refused.status, 401, refused.text);

      assert.deepEqual(await post(provider, good), { status: 200, text: "duplicate" });
      const rows = await inbox.query("SELECT id, event_type FROM deliveries WHERE source = ? ORDER BY id", provider);
      assert.deepEqual(
        rows.map((r) => r.id),
        [id],
        "the forged one was not stored",
      );
      if (provider !== "plain" && provider !== "shopify") assert.equal(rows[0]!.event_type, "payment.succeeded");
    });
  }

  it("logs no secret", () => {
    for (const secret of Object.values(SECRETS)) assert.ok(!receiver.log().includes(secret), receiver.log());
  });
});

// test/brokers-suite.ts: the broker connections a describe() of the broker tests holds, opened in before()
// (so that a run which filters the suite out holds none open) and closed in after(), with what the suite
// made in the broker removed. Imported by the broker tests; not a test file of its own.

import { after, before } from "node:test";
import { jetstreamManager, type JetStreamManager } from "@nats-io/jetstream";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import amqp, { type Channel, type ChannelModel } from "amqplib";

/** JetStreamSuite is a suite's NATS connection; every stream named in `made` is deleted after it. */
export interface JetStreamSuite {
  nc: NatsConnection;
  jsm: JetStreamManager;
  made: string[];
}

export function jetStreamSuite(servers: string): JetStreamSuite {
  const suite = { made: [] as string[] } as JetStreamSuite;
  before(async () => {
    suite.nc = await connect({ servers });
    suite.jsm = await jetstreamManager(suite.nc);
  });
  after(async () => {
    for (const name of suite.made) await suite.jsm.streams.delete(name).catch(() => {});
    await suite.nc.close();
  });
  return suite;
}

/** RabbitSuite is a suite's RabbitMQ channel; its queue is deleted after it. */
export interface RabbitSuite {
  model: ChannelModel;
  channel: Channel;
}

export function rabbitSuite(url: string, queue: string): RabbitSuite {
  const suite = {} as RabbitSuite;
  before(async () => {
    suite.model = await amqp.connect(url);
    suite.channel = await suite.model.createChannel();
  });
  after(async () => {
    await suite.channel.deleteQueue(queue).catch(() => {});
    await suite.model.close();
  });
  return suite;
}

// kafkajs (a pure-JavaScript Kafka client with its own protocol code, unrelated to librdkafka)
// against the real strata binary: topic admin, an idempotent gzip producer, a consumer group of
// two members that shares the partitions and commits, and transactions (a committed and an
// aborted one, read back read_committed). Exits non-zero with a message on the first
// difference from what a Kafka broker answers.
//
//   node clients.js --bootstrap 127.0.0.1:9092 --topic name
'use strict';

const { Kafka, logLevel, CompressionTypes } = require('kafkajs');

const DEADLINE_MS = 60000;

function arg(name) {
  const at = process.argv.indexOf(`--${name}`);
  if (at < 0 || at + 1 >= process.argv.length) throw new Error(`--${name} is required`);
  return process.argv[at + 1];
}

function fail(message) {
  throw new Error(message);
}

// Resolves when `check()` is true, polling; rejects past the deadline with `what`.
async function waitFor(what, check) {
  const until = Date.now() + DEADLINE_MS;
  while (!(await check())) {
    if (Date.now() > until) fail(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function main() {
  const bootstrap = arg('bootstrap');
  const topic = arg('topic');
  const txTopic = `${topic}-tx`;
  const group = `${topic}-group`;
  const partitions = 3;
  const kafka = new Kafka({ clientId: 'strata-kafkajs-test', brokers: [bootstrap], logLevel: logLevel.NOTHING });

  const admin = kafka.admin();
  await admin.connect();
  const created = await admin.createTopics({
    topics: [{ topic, numPartitions: partitions }, { topic: txTopic, numPartitions: 1 }],
    waitForLeaders: true,
  });
  if (!created) fail('createTopics reported that the topics already existed');
  const metadata = await admin.fetchTopicMetadata({ topics: [topic] });
  const leaders = metadata.topics[0].partitions.map((p) => p.leader);
  if (leaders.length !== partitions || leaders.some((l) => l < 0)) fail(`leaders ${JSON.stringify(leaders)}`);

  // An idempotent producer, gzip batches, keys spread over the partitions.
  const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1 });
  await producer.connect();
  const records = 300;
  const sent = new Set();
  for (let round = 0; round < 3; round++) {
    const messages = [];
    for (let i = 0; i < records / 3; i++) {
      const value = `value-${round}-${i}`;
      sent.add(value);
      messages.push({ key: `key-${i}`, value });
    }
    await producer.send({ topic, messages, acks: -1, compression: CompressionTypes.GZIP });
  }
  const ends = await admin.fetchTopicOffsets(topic);
  const total = ends.reduce((sum, p) => sum + Number(p.high) - Number(p.low), 0);
  if (total !== records) fail(`the log ends add up to ${total} records, not ${records}`);

  // Two members of one group share the partitions; every record arrives once.
  const got = new Map();
  const owners = new Map();
  const members = [];
  for (let m = 0; m < 2; m++) {
    const consumer = kafka.consumer({ groupId: group, sessionTimeout: 10000, heartbeatInterval: 500 });
    await consumer.connect();
    await consumer.subscribe({ topic, fromBeginning: true });
    await consumer.run({
      autoCommit: true,
      autoCommitInterval: 100,
      eachMessage: async ({ partition, message }) => {
        const at = `${partition}@${message.offset}`;
        if (got.has(at)) fail(`${at} delivered twice`);
        got.set(at, message.value.toString());
        owners.set(partition, m);
      },
    });
    members.push(consumer);
  }
  await waitFor(`${records} records consumed by the group`, () => got.size === records);
  const values = new Set(got.values());
  if (values.size !== records || [...sent].some((v) => !values.has(v))) fail('the group received other values than were sent');
  // Auto-commit is asynchronous: wait until the group's committed offsets reach the log ends.
  await waitFor('the committed offsets to reach the log ends', async () => {
    const committed = await admin.fetchOffsets({ groupId: group, topics: [topic] });
    return committed[0].partitions.every((p) => {
      const end = ends.find((e) => e.partition === p.partition);
      return end && p.offset === end.high;
    });
  });
  const described = await admin.describeGroups([group]);
  const description = described.groups[0];
  if (description.state !== 'Stable' || description.members.length !== 2) {
    fail(`the group is ${description.state} with ${description.members.length} members, not Stable with 2`);
  }
  for (const consumer of members) await consumer.disconnect();

  // Transactions: one committed, one aborted, then one more committed as an end marker.
  const txProducer = kafka.producer({ transactionalId: `${topic}-txid`, maxInFlightRequests: 1, idempotent: true });
  await txProducer.connect();
  const transaction = async (label, commit) => {
    const tx = await txProducer.transaction();
    await tx.send({ topic: txTopic, messages: Array.from({ length: 10 }, (_, i) => ({ value: `${label}-${i}` })) });
    if (commit) await tx.commit();
    else await tx.abort();
  };
  await transaction('committed', true);
  await transaction('aborted', false);
  await transaction('end', true);
  const readCommitted = [];
  const reader = kafka.consumer({ groupId: `${group}-rc`, readUncommitted: false });
  await reader.connect();
  await reader.subscribe({ topic: txTopic, fromBeginning: true });
  await reader.run({ eachMessage: async ({ message }) => { readCommitted.push(message.value.toString()); } });
  await waitFor('the last committed transaction', () => readCommitted.includes('end-9'));
  const aborted = readCommitted.filter((v) => v.startsWith('aborted'));
  if (aborted.length) fail(`read_committed returned aborted records: ${aborted}`);
  if (readCommitted.length !== 20) fail(`read_committed returned ${readCommitted.length} records, not 20`);
  await reader.disconnect();
  await txProducer.disconnect();
  await producer.disconnect();

  await admin.deleteGroups([group, `${group}-rc`]);
  await admin.deleteTopics({ topics: [topic, txTopic] });
  await waitFor('the topics to be gone', async () => {
    const left = await admin.listTopics();
    return !left.includes(topic) && !left.includes(txTopic);
  });
  await admin.disconnect();
  console.log(`kafkajs: ${records} records over a 2-member group (partition owners ${JSON.stringify([...owners])}), offsets committed, transactions read_committed`);
}

main().then(
  () => process.exit(0),
  (e) => {
    console.error(`FAIL: ${e.stack || e}`);
    process.exit(1);
  },
);

"""aiokafka (asyncio, its own protocol code, unrelated to librdkafka) against the real strata
binary: topic admin, an idempotent gzip producer, a consumer group of two members sharing the
partitions with exact committed offsets, and transactions (a committed and an aborted one, read
back read_committed). Exits non-zero with a message on the first difference from what a Kafka
broker answers.

    python3 aiokafka_clients.py --bootstrap 127.0.0.1:9092 --topic name
"""

import argparse
import asyncio
import sys
import time

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import TopicPartition

DEADLINE_SECONDS = 60


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    args = parser.parse_args()
    topic, tx_topic = args.topic, f"{args.topic}-tx"
    group = f"{topic}-group"
    partitions, records = 3, 300
    deadline = time.monotonic() + DEADLINE_SECONDS

    admin = AIOKafkaAdminClient(bootstrap_servers=args.bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(topic, partitions, 1), NewTopic(tx_topic, 1, 1)])

    producer = AIOKafkaProducer(bootstrap_servers=args.bootstrap, enable_idempotence=True, compression_type="gzip")
    await producer.start()
    sent = set()
    for i in range(records):
        value = f"value-{i}".encode()
        sent.add(value)
        await producer.send(topic, key=f"key-{i % 100}".encode(), value=value)
    await producer.flush()
    await producer.stop()

    # Two members of one group; each record arrives once, and the commits are exact.
    members = [
        AIOKafkaConsumer(topic, bootstrap_servers=args.bootstrap, group_id=group,
                         auto_offset_reset="earliest", enable_auto_commit=False)
        for _ in range(2)
    ]
    for m in members:
        await m.start()
    got = {}
    while len(got) < records:
        if time.monotonic() > deadline:
            fail(f"the group received {len(got)} of {records} records")
        for m in members:
            batches = await m.getmany(timeout_ms=100)
            for tp, messages in batches.items():
                for msg in messages:
                    at = (tp.partition, msg.offset)
                    if at in got:
                        fail(f"{at} delivered twice")
                    got[at] = msg.value
            if batches:
                await m.commit()
    if set(got.values()) != sent:
        fail("the group received other values than were sent")
    ends = await members[0].end_offsets([TopicPartition(topic, p) for p in range(partitions)])
    committed = await admin.list_consumer_group_offsets(group)
    for tp, end in ends.items():
        if committed.get(tp) is None or committed[tp].offset != end:
            fail(f"{tp} committed {committed.get(tp)}, log end {end}")
    for m in members:
        await m.stop()

    # Transactions: one committed, one aborted, then one more committed as an end marker.
    tx = AIOKafkaProducer(bootstrap_servers=args.bootstrap, transactional_id=f"{topic}-txid")
    await tx.start()
    for label, commit in (("committed", True), ("aborted", False), ("end", True)):
        await tx.begin_transaction()
        for i in range(10):
            await tx.send(tx_topic, f"{label}-{i}".encode())
        if commit:
            await tx.commit_transaction()
        else:
            await tx.abort_transaction()
    await tx.stop()
    reader = AIOKafkaConsumer(tx_topic, bootstrap_servers=args.bootstrap, isolation_level="read_committed",
                              auto_offset_reset="earliest")
    await reader.start()
    values = []
    while b"end-9" not in values:
        if time.monotonic() > deadline:
            fail(f"read_committed returned {values}, never end-9")
        for messages in (await reader.getmany(timeout_ms=200)).values():
            values.extend(m.value for m in messages)
    await reader.stop()
    aborted = [v for v in values if v.startswith(b"aborted")]
    if aborted or len(values) != 20:
        fail(f"read_committed returned {len(values)} records, aborted ones {aborted}")

    await admin.delete_topics([topic, tx_topic])
    await admin.close()
    print(f"aiokafka: {records} records over a 2-member group with exact commits, transactions read_committed")


asyncio.run(main())

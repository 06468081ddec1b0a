#!/usr/bin/env python3
"""Round trip through a Strata broker with Python's confluent-kafka client.

Produces records with keys, headers (including a null-valued one) and gzip compression to
partition 0 of a topic, then consumes them back with an assign-only consumer (no group
membership, no commits) and compares everything. Exits 0 when every record came back once, in
order, unchanged; 1 with a message otherwise; 2 when confluent-kafka is not installed.

Run by tests/tests/other_clients.rs against the real binary:
    python3 tests/python/roundtrip.py --bootstrap 127.0.0.1:9092 --topic t
"""

import argparse
import sys
import time

try:
    from confluent_kafka import Consumer, Producer, TopicPartition
except ImportError as error:  # pragma: no cover - depends on the machine
    print(f"confluent-kafka is not installed ({error}); pip install confluent-kafka", file=sys.stderr)
    sys.exit(2)

RECORDS = 200
DEADLINE_SECONDS = 30.0


def expected_records():
    """Deterministic records: key, value and headers that identify their index."""
    records = []
    for i in range(RECORDS):
        key = None if i % 9 == 0 else f"key-{i}".encode()
        value = (f"value {i} " * (1 + i % 40)).encode()
        headers = [("index", str(i).encode()), ("nullable", None)]
        if i % 3 == 0:
            headers.append(("index", b"repeated key"))
        records.append((key, value, headers))
    return records


def produce(bootstrap, topic, records):
    """Produces all records and returns their offsets in send order."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": "gzip",
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": 30000,
        }
    )
    reports = {}

    def on_delivery(error, message, index):
        reports[index] = error if error is not None else message.offset()

    for index, (key, value, headers) in enumerate(records):
        producer.produce(
            topic,
            key=key,
            value=value,
            headers=headers,
            partition=0,
            on_delivery=lambda err, msg, index=index: on_delivery(err, msg, index),
        )
        producer.poll(0)
    left = producer.flush(DEADLINE_SECONDS)
    if left:
        fail(f"{left} records still undelivered after {DEADLINE_SECONDS}s")
    errors = {i: r for i, r in reports.items() if not isinstance(r, int)}
    if errors:
        fail(f"{len(errors)} deliveries failed, first: {sorted(errors.items())[0]}")
    return [reports[i] for i in range(len(records))]


def consume(bootstrap, topic, count):
    """Reads `count` records of partition 0 from offset 0, or fails at the deadline."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            # confluent-kafka requires a group.id; nothing joins or commits to it.
            "group.id": "strata-tests-python-assign-only",
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = []
    deadline = time.monotonic() + DEADLINE_SECONDS
    try:
        while len(got) < count:
            if time.monotonic() > deadline:
                fail(f"consumed {len(got)} of {count} records within {DEADLINE_SECONDS}s")
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                fail(f"consumer error after {len(got)} records: {message.error()}")
            got.append(message)
    finally:
        consumer.close()
    return got


def fail(why):
    print(f"python round trip FAILED: {why}", file=sys.stderr)
    sys.exit(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    args = parser.parse_args()

    records = expected_records()
    offsets = produce(args.bootstrap, args.topic, records)
    if offsets != list(range(len(records))):
        fail(f"acknowledged offsets are not 0..{len(records) - 1}: {offsets[:10]}...")

    messages = consume(args.bootstrap, args.topic, len(records))
    for index, (message, (key, value, headers)) in enumerate(zip(messages, records)):
        got = (message.offset(), message.key(), message.value(), message.headers() or [])
        want = (index, key, value, headers)
        if got != want:
            fail(f"record {index} differs:\n  got  {got!r:.300}\n  want {want!r:.300}")
    print(f"python round trip: {len(records)} records with keys, headers and gzip came back unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main())

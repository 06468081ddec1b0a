#!/usr/bin/env python3
"""Consumes many partitions through incremental fetch sessions (KIP-227) with kafka-python.

kafka-python 2.x keeps a fetch session per broker (librdkafka, and so confluent-kafka, has
none). The script creates a topic of many partitions, fills every partition, consumes it all
with an assign-only consumer, then produces in rounds to a few partitions at a time and
consumes each round, checking every record arrives exactly once and in order. It watches the
client's session handler: the broker must hand out a session, answer incremental fetches, and
list in them fewer partitions than the session holds (only those with something new).

Exits 0 on success; 1 with a message otherwise; 2 when kafka-python is not installed.

Run by tests/tests/other_clients.rs against the real binary:
    python3 tests/python/fetch_sessions.py --bootstrap 127.0.0.1:9092 --topic t
"""

import argparse
import sys
import time

try:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.consumer import fetcher
except ImportError as error:  # pragma: no cover - depends on the machine
    print(f"kafka-python is not installed ({error}); pip install kafka-python", file=sys.stderr)
    sys.exit(2)

PARTITIONS = 60
FIRST_FILL = 5
ROUNDS = 6
DEADLINE_SECONDS = 60.0


class Watch:
    """What the session handler saw: responses by kind and their sizes."""

    def __init__(self):
        self.full = 0
        self.incremental = 0
        self.incremental_partitions = []
        self.sessions = set()
        self.errors = []

    def install(self):
        original = fetcher.FetchSessionHandler.handle_response
        watch = self

        def handle_response(handler, response):
            incremental = not handler.next_metadata.is_full
            if response.error_code != 0:
                watch.errors.append(response.error_code)
            elif incremental:
                watch.incremental += 1
                listed = sum(len(partitions) for _, partitions in response.topics)
                watch.incremental_partitions.append((listed, len(handler.session_partitions)))
            else:
                watch.full += 1
            if response.session_id:
                watch.sessions.add(response.session_id)
            return original(handler, response)

        fetcher.FetchSessionHandler.handle_response = handle_response


def value(partition, index):
    return f"p{partition}-r{index}".encode()


def fail(message):
    print(message, file=sys.stderr)
    sys.exit(1)


def consume(consumer, expected, received):
    """Polls until every (partition, value) of `expected` arrived; records duplicates."""
    deadline = time.monotonic() + DEADLINE_SECONDS
    while sum(len(v) for v in received.values()) < expected:
        if time.monotonic() > deadline:
            got = sum(len(v) for v in received.values())
            fail(f"timed out: {got} of {expected} records consumed")
        for tp, messages in consumer.poll(timeout_ms=500).items():
            for message in messages:
                received.setdefault(tp.partition, []).append((message.offset, message.value))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    args = parser.parse_args()

    watch = Watch()
    watch.install()

    admin = KafkaAdminClient(bootstrap_servers=args.bootstrap, request_timeout_ms=30000)
    admin.create_topics([NewTopic(args.topic, PARTITIONS, 1)])
    admin.close()

    producer = KafkaProducer(bootstrap_servers=args.bootstrap, acks="all", linger_ms=5)
    sent = {p: [] for p in range(PARTITIONS)}

    def produce(partitions, count):
        for p in partitions:
            for _ in range(count):
                v = value(p, len(sent[p]))
                producer.send(args.topic, value=v, partition=p)
                sent[p].append(v)
        producer.flush(timeout=30)

    consumer = KafkaConsumer(
        bootstrap_servers=args.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=200,
    )
    consumer.assign([TopicPartition(args.topic, p) for p in range(PARTITIONS)])

    produce(range(PARTITIONS), FIRST_FILL)
    received = {}
    consume(consumer, PARTITIONS * FIRST_FILL, received)
    # Rounds that touch a few partitions each: incremental fetches must list those.
    for round_ in range(ROUNDS):
        touched = [(round_ * 7 + k * 11) % PARTITIONS for k in range(3)]
        produce(touched, 4)
        consume(consumer, sum(len(v) for v in sent.values()), received)
    # Nothing more may arrive: a quiet poll or two returns nothing.
    for _ in range(3):
        extra = consumer.poll(timeout_ms=300)
        if any(extra.values()):
            fail(f"records beyond those produced: {extra}")
    consumer.close()
    producer.close()

    for p in range(PARTITIONS):
        got = received.get(p, [])
        offsets = [offset for offset, _ in got]
        if offsets != list(range(len(sent[p]))):
            fail(f"partition {p}: offsets {offsets}, expected 0..{len(sent[p])}")
        if [v for _, v in got] != sent[p]:
            fail(f"partition {p}: values differ from those produced")

    print(
        f"full fetches {watch.full}, incremental {watch.incremental}, sessions {len(watch.sessions)}, "
        f"session errors {watch.errors}, incremental (listed, in session): "
        f"{watch.incremental_partitions[:10]}..."
    )
    if not watch.sessions:
        fail("the broker never created a fetch session")
    if watch.incremental == 0:
        fail("no incremental fetch was answered")
    if not any(listed < size for listed, size in watch.incremental_partitions):
        fail("no incremental answer left out a partition with nothing new")
    if watch.errors:
        fail(f"fetch session errors: {watch.errors}")
    print(f"OK: {sum(len(v) for v in sent.values())} records over {PARTITIONS} partitions")


if __name__ == "__main__":
    main()

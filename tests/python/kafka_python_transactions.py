#!/usr/bin/env python3
"""Transactions through kafka-python's own protocol code (not librdkafka), against Strata.

Checks:
- commit across 3 partitions: a read_committed consumer reads every record;
- abort across 3 partitions: read_committed never reads them, read_uncommitted does;
- a second producer with the same transactional_id fences the first: the first's next
  transactional call fails, the second commits;
- send_offsets_to_transaction: the group's committed offset moves with a committed
  transaction and not with an aborted one.

Exits 0 when every check passes, 1 with a message otherwise, 2 when kafka-python is missing.
Run by tests/tests/transactions.rs:
    python3 tests/python/kafka_python_transactions.py --bootstrap 127.0.0.1:9092 --topic t
"""

import argparse
import sys
import time
import uuid

try:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.errors import KafkaError
    from kafka.structs import OffsetAndMetadata
except ImportError as error:  # pragma: no cover - depends on the machine
    print(f"kafka-python is not installed ({error}); pip install kafka-python", file=sys.stderr)
    sys.exit(2)

TIMEOUT_SECONDS = 60.0


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def producer(bootstrap, txn_id):
    p = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id)
    p.init_transactions()
    return p


def read_all(bootstrap, topic, isolation, marker, partitions=3):
    """Every value of `topic` before `marker`, which a committed transaction put last in each
    partition: reading up to the markers (with a deadline) reads everything before them."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level=isolation,
        enable_auto_commit=False,
        group_id=None,
    )
    consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
    consumer.seek_to_beginning()
    values, ended = [], set()
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while len(ended) < partitions and time.monotonic() < deadline:
        for tp, records in consumer.poll(timeout_ms=500).items():
            for record in records:
                value = record.value.decode()
                if value == marker:
                    ended.add(tp.partition)
                elif tp.partition not in ended:
                    values.append(value)
    consumer.close()
    check(len(ended) == partitions, f"{isolation}: markers read in {sorted(ended)} only")
    return values


def end_markers(bootstrap, topic, partitions=3):
    marker = f"end-{uuid.uuid4().hex[:8]}"
    p = producer(bootstrap, f"marker-{marker}")
    p.begin_transaction()
    for partition in range(partitions):
        p.send(topic, value=marker.encode(), partition=partition)
    p.commit_transaction()
    p.close()
    return marker


def commit_and_abort(bootstrap, topic):
    p = producer(bootstrap, f"{topic}-kp")
    p.begin_transaction()
    for partition in range(3):
        p.send(topic, value=f"committed-{partition}".encode(), partition=partition)
    p.commit_transaction()
    p.begin_transaction()
    for partition in range(3):
        p.send(topic, value=f"aborted-{partition}".encode(), partition=partition)
    p.flush()
    p.abort_transaction()
    p.close()
    marker = end_markers(bootstrap, topic)
    committed = read_all(bootstrap, topic, "read_committed", marker)
    check(sorted(committed) == ["committed-0", "committed-1", "committed-2"],
          f"read_committed read {committed}")
    uncommitted = read_all(bootstrap, topic, "read_uncommitted", marker)
    check(sorted(v for v in uncommitted if v.startswith("aborted-")) ==
          ["aborted-0", "aborted-1", "aborted-2"], f"read_uncommitted read {uncommitted}")


def fencing(bootstrap, topic):
    first = producer(bootstrap, f"{topic}-fenced")
    first.begin_transaction()
    first.send(topic, value=b"zombie", partition=0)
    first.flush()
    second = producer(bootstrap, f"{topic}-fenced")
    fenced = False
    try:
        first.send(topic, value=b"zombie-2", partition=1)
        first.commit_transaction()
    except KafkaError as error:
        fenced = True
        print(f"first producer fenced: {type(error).__name__}", flush=True)
    check(fenced, "a fenced producer committed")
    second.begin_transaction()
    second.send(topic, value=b"successor", partition=0)
    second.commit_transaction()
    second.close()
    first.close(timeout=5)
    marker = end_markers(bootstrap, topic)
    values = read_all(bootstrap, topic, "read_committed", marker)
    check("successor" in values, f"the successor's record is missing: {values}")
    check(not any(v.startswith("zombie") for v in values), f"zombie records read: {values}")


def committed_offset(bootstrap, group, topic):
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                             enable_auto_commit=False)
    offset = consumer.committed(TopicPartition(topic, 0))
    consumer.close()
    return offset


def offsets_in_transactions(bootstrap, topic):
    group = f"{topic}-kp-group"
    p = producer(bootstrap, f"{topic}-offsets")
    tp = TopicPartition(topic, 0)
    for offset, commit in [(5, True), (9, False)]:
        p.begin_transaction()
        p.send(topic, value=f"with-offset-{offset}".encode(), partition=1)
        p.send_offsets_to_transaction({tp: OffsetAndMetadata(offset, "", -1)}, group)
        if commit:
            p.commit_transaction()
        else:
            # kafka-python 2.2 loops forever ("ProducerBatch ... is not in deque") when a
            # transaction is aborted while one of its batches is in flight: flush first.
            p.flush()
            p.abort_transaction()
        # The markers that make the offsets visible land right after EndTxn answers; wait
        # for them with a deadline.
        deadline = time.monotonic() + TIMEOUT_SECONDS
        while committed_offset(bootstrap, group, topic) != 5 and time.monotonic() < deadline:
            time.sleep(0.1)
        seen = committed_offset(bootstrap, group, topic)
        check(seen == 5, f"after {'commit' if commit else 'abort'} of offset {offset}: {seen}")
    p.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    args = parser.parse_args()
    commit_and_abort(args.bootstrap, args.topic)
    fencing(args.bootstrap, args.topic)
    offsets_in_transactions(args.bootstrap, args.topic)
    print("kafka-python transaction checks passed", flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Transactions end to end through confluent-kafka's transactional Producer and Consumers.

Checks, against Strata brokers (the coordinator and the partition side together):
- commit across 3 partitions: a read_committed consumer sees all the records;
- abort across 3 partitions: a read_committed consumer never sees them, read_uncommitted does;
- a second producer with the same transactional.id fences the first (its commit fails fatally);
- a transaction left open past transaction.timeout.ms is aborted by the coordinator: its
  records are never read committed, and records committed after it in the same partition
  become readable (the last stable offset moves past it only once it is aborted);
- consume-transform-produce: offsets sent in a transaction (send_offsets_to_transaction) are
  not the group's committed offsets until the transaction commits, and never if it aborts;
- a transaction committed while the coordinator's broker is killed (--kill-coordinator: the
  Rust side kills it when this script prints "KILL <port>" and answers on stdin) still
  completes: its records are all read committed.

Exits 0 when every check passes, 1 with a message otherwise, 2 when confluent-kafka is missing.
Run by tests/tests/transactions.rs against the real binary:
    python3 tests/python/transactions.py --bootstrap 127.0.0.1:9092 --topic t
"""

import argparse
import sys
import time
import uuid

try:
    from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
except ImportError as error:  # pragma: no cover - depends on the machine
    print(f"confluent-kafka is not installed ({error}); pip install confluent-kafka", file=sys.stderr)
    sys.exit(2)

TIMEOUT_SECONDS = 60.0


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def producer(bootstrap, txn_id, **extra):
    config = {"bootstrap.servers": bootstrap, "transactional.id": txn_id}
    config.update(extra)
    p = Producer(config)
    p.init_transactions(TIMEOUT_SECONDS)
    return p


def read_values(bootstrap, topic, isolation, until, partitions=3):
    """Reads every partition from the start until `until(values)` holds or the deadline; a
    condition with a deadline, not a sleep."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4()}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    values = []
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while time.monotonic() < deadline and not until(values):
        message = consumer.poll(0.2)
        if message is None or message.error():
            continue
        values.append(message.value().decode())
    consumer.close()
    return values


def drain(bootstrap, topic, isolation, marker, partitions=3):
    """Everything readable up to and including the records `marker-<partition>`, committed
    last into every partition, so that what is absent is really absent, not merely not read
    yet (a partition is read in order)."""
    wanted = {f"{marker}-{p}" for p in range(partitions)}
    return read_values(bootstrap, topic, isolation, lambda vs: wanted <= set(vs), partitions)


def commit_end_markers(bootstrap, topic, marker, partitions=3):
    p = producer(bootstrap, f"{topic}-{marker}")
    p.begin_transaction()
    for partition in range(partitions):
        p.produce(topic, value=f"{marker}-{partition}".encode(), partition=partition)
    p.commit_transaction(TIMEOUT_SECONDS)


def commit_and_abort(bootstrap, topic):
    p = producer(bootstrap, f"{topic}-tx")
    p.begin_transaction()
    for partition in range(3):
        p.produce(topic, value=f"committed-{partition}".encode(), partition=partition)
    p.commit_transaction(TIMEOUT_SECONDS)
    p.begin_transaction()
    for partition in range(3):
        p.produce(topic, value=f"aborted-{partition}".encode(), partition=partition)
    p.flush(TIMEOUT_SECONDS)
    p.abort_transaction(TIMEOUT_SECONDS)
    commit_end_markers(bootstrap, topic, "end")

    seen = drain(bootstrap, topic, "read_committed", "end")
    committed = sorted(v for v in seen if v.startswith("committed-"))
    check(committed == ["committed-0", "committed-1", "committed-2"], f"read_committed saw {seen}")
    check(not any(v.startswith("aborted-") for v in seen), f"read_committed saw aborted records: {seen}")
    everything = drain(bootstrap, topic, "read_uncommitted", "end")
    aborted = sorted(v for v in everything if v.startswith("aborted-"))
    check(aborted == ["aborted-0", "aborted-1", "aborted-2"], f"read_uncommitted saw {everything}")


def fencing(bootstrap, topic):
    first = producer(bootstrap, f"{topic}-fence")
    first.begin_transaction()
    first.produce(topic, value=b"zombie", partition=0)
    first.flush(TIMEOUT_SECONDS)
    # The newcomer aborts the zombie's open transaction and fences its epoch.
    second = producer(bootstrap, f"{topic}-fence")
    try:
        first.commit_transaction(TIMEOUT_SECONDS)
    except KafkaException as exception:
        error = exception.args[0]
        check(error.fatal(), f"the fenced producer's commit failed, but not fatally: {error}")
    else:
        fail("the first producer committed after a second one with its transactional.id started")
    second.begin_transaction()
    second.produce(topic, value=b"after-fence-0", partition=0)
    second.commit_transaction(TIMEOUT_SECONDS)
    seen = drain(bootstrap, topic, "read_committed", "after-fence", partitions=1)
    check("zombie" not in seen, f"the fenced producer's record was read committed: {seen}")


def timeout(bootstrap, topic):
    abandoned = producer(bootstrap, f"{topic}-abandoned", **{"transaction.timeout.ms": 2000})
    abandoned.begin_transaction()
    abandoned.produce(topic, value=b"abandoned", partition=0)
    abandoned.flush(TIMEOUT_SECONDS)
    # Another producer commits after it in the same partition: readable committed only once
    # the abandoned transaction is aborted, which only its timeout can do.
    other = producer(bootstrap, f"{topic}-other")
    other.begin_transaction()
    other.produce(topic, value=b"after-abandoned-0", partition=0)
    other.commit_transaction(TIMEOUT_SECONDS)
    seen = drain(bootstrap, topic, "read_committed", "after-abandoned", partitions=1)
    check("after-abandoned-0" in seen, f"the last stable offset never passed the abandoned transaction: {seen}")
    check("abandoned" not in seen, f"the timed-out transaction's record was read committed: {seen}")
    try:
        abandoned.commit_transaction(TIMEOUT_SECONDS)
    except KafkaException:
        pass
    else:
        fail("a transaction aborted on timeout committed")


def committed_offset(bootstrap, group, topic):
    # read_uncommitted: librdkafka then does not ask for stable offsets, so a pending
    # transactional commit shows as the previous committed offset instead of being retried.
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "isolation.level": "read_uncommitted",
        }
    )
    [tp] = c.committed([TopicPartition(topic, 0)], timeout=TIMEOUT_SECONDS)
    c.close()
    return tp.offset


def consume_transform_produce(bootstrap, topic):
    source, sink, group = f"{topic}-in", f"{topic}-out", f"{topic}-ctp"
    plain = Producer({"bootstrap.servers": bootstrap})
    for i in range(6):
        plain.produce(source, value=f"in-{i}".encode(), partition=0)
    plain.flush(TIMEOUT_SECONDS)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([TopicPartition(source, 0, 0)])
    p = producer(bootstrap, f"{topic}-ctp-tx")

    def process(n, commit):
        p.begin_transaction()
        got = 0
        deadline = time.monotonic() + TIMEOUT_SECONDS
        while got < n and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None or message.error():
                continue
            p.produce(sink, value=message.value().upper(), partition=0)
            got += 1
        check(got == n, f"consumed {got} of {n} input records")
        p.send_offsets_to_transaction(
            consumer.position(consumer.assignment()),
            consumer.consumer_group_metadata(),
            TIMEOUT_SECONDS,
        )
        before = committed_offset(bootstrap, group, source)
        check(before < 0 or before <= 3, f"offsets visible before the transaction ended: {before}")
        if commit:
            p.commit_transaction(TIMEOUT_SECONDS)
        else:
            p.abort_transaction(TIMEOUT_SECONDS)

    process(3, commit=True)
    # EndTxn answers once the commit is decided; the markers (and with them the offsets)
    # land right after, so wait for them with a deadline, as a require_stable fetch would.
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while committed_offset(bootstrap, group, source) != 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    seen = committed_offset(bootstrap, group, source)
    check(seen == 3, f"offsets of a committed transaction: {seen}")
    process(3, commit=False)
    check(
        committed_offset(bootstrap, group, source) == 3,
        f"offsets of an aborted transaction became visible: {committed_offset(bootstrap, group, source)}",
    )
    consumer.close()
    commit_end_markers(bootstrap, sink, "end", partitions=1)
    out = drain(bootstrap, sink, "read_committed", "end", partitions=1)
    check(out[:3] == ["IN-0", "IN-1", "IN-2"] and len(out) == 4, f"read_committed output {out}")


def kill_coordinator(bootstrap, topic):
    p = producer(bootstrap, f"{topic}-survivor")
    p.begin_transaction()
    for partition in range(3):
        p.produce(topic, value=f"survivor-{partition}".encode(), partition=partition)
    p.flush(TIMEOUT_SECONDS)
    print("KILL", flush=True)
    check(sys.stdin.readline().strip() == "KILLED", "the test harness did not kill the coordinator")
    # The producer finds the coordinator's shard on its new owner, which replayed it; the
    # transaction either commits there or was aborted, never half of each.
    committed = True
    try:
        p.commit_transaction(TIMEOUT_SECONDS)
    except KafkaException as exception:
        committed = False
        print(f"commit after the kill failed: {exception.args[0]}", file=sys.stderr)
    commit_end_markers(bootstrap, topic, "tail")
    seen = drain(bootstrap, topic, "read_committed", "tail")
    survivors = sorted(v for v in seen if v.startswith("survivor-"))
    if committed:
        check(survivors == ["survivor-0", "survivor-1", "survivor-2"], f"committed but read {seen}")
    else:
        check(survivors == [], f"not committed, yet read committed: {seen}")
    print(f"transaction across the kill: {'committed' if committed else 'aborted'}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--kill-coordinator", action="store_true")
    parser.add_argument("--commit-and-abort-only", action="store_true")
    args = parser.parse_args()
    if args.kill_coordinator:
        kill_coordinator(args.bootstrap, args.topic)
    elif args.commit_and_abort_only:
        commit_and_abort(args.bootstrap, args.topic)
    else:
        commit_and_abort(args.bootstrap, args.topic)
        fencing(args.bootstrap, args.topic + "-f")
        timeout(args.bootstrap, args.topic + "-t")
        consume_transform_produce(args.bootstrap, args.topic)
    print("transaction checks passed")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Transactions on a compacted topic: confluent-kafka's transactional producer writes committed
and aborted transactions over the same keys; the cleaner must keep exactly the latest committed
value of each key and remove every aborted record.

Checks, against a Strata broker with small segments (tests/tests/compaction.rs):
- before cleaning (the topic is created with a large min.compaction.lag.ms): read_committed
  sees, per key, the latest committed value and no aborted value; read_uncommitted still sees
  the aborted values;
- then min.compaction.lag.ms is set to 0 (IncrementalAlterConfigs) and the script waits, with
  a deadline, until a read_uncommitted read holds one record per key and no aborted record
  (the cleaner has covered the log);
- after cleaning, read_committed again sees exactly the latest committed value per key.

Exits 0 when every check passes, 1 with a message otherwise, 2 when confluent-kafka is missing.
    python3 tests/python/txn_compaction.py --bootstrap 127.0.0.1:9092 --topic t
"""

import argparse
import sys
import time
import uuid

try:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )
except ImportError as error:  # pragma: no cover - depends on the machine
    print(f"confluent-kafka is not installed ({error}); pip install confluent-kafka", file=sys.stderr)
    sys.exit(2)

TIMEOUT_SECONDS = 60.0
CLEANED_DEADLINE_SECONDS = 120.0
KEYS = 40
TRANSACTIONS = 12


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def committed(t):
    # Every third transaction aborts, the last one included, so some keys' latest write is
    # aborted and their latest committed value is an older one.
    return t % 3 != 2


def read_until(bootstrap, topic, isolation, end_key):
    """Every (key, value) of partition 0 in offset order, up to and including the record with
    key `end_key` (committed last, so what is absent is really absent)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4()}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    records = []
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is None or message.error():
            continue
        key = message.key().decode()
        records.append((key, message.value().decode()))
        if key == end_key:
            consumer.close()
            return records
    consumer.close()
    fail(f"{isolation}: {end_key} not read within {TIMEOUT_SECONDS}s; read {len(records)} records")


def commit_end(p, topic, end_key):
    p.begin_transaction()
    p.produce(topic, key=end_key.encode(), value=b"end", partition=0)
    p.commit_transaction(TIMEOUT_SECONDS)


def latest(records):
    out = {}
    for key, value in records:
        out[key] = value
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    args = parser.parse_args()
    bootstrap, topic = args.bootstrap, args.topic

    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-tx"})
    p.init_transactions(TIMEOUT_SECONDS)
    expect = {}
    for t in range(TRANSACTIONS):
        p.begin_transaction()
        for k in range(KEYS):
            kind = "committed" if committed(t) else "aborted"
            p.produce(topic, key=f"k{k}".encode(), value=f"{kind}-{t}".encode(), partition=0)
        if committed(t):
            p.commit_transaction(TIMEOUT_SECONDS)
            expect.update({f"k{k}": f"committed-{t}" for k in range(KEYS)})
        else:
            p.flush(TIMEOUT_SECONDS)
            p.abort_transaction(TIMEOUT_SECONDS)
    commit_end(p, topic, "end-1")
    expect["end-1"] = "end"

    seen = read_until(bootstrap, topic, "read_committed", "end-1")
    check(not any(v.startswith("aborted") for _, v in seen), "read_committed saw aborted records before cleaning")
    check(latest(seen) == expect, f"read_committed before cleaning: {latest(seen)} != {expect}")
    everything = read_until(bootstrap, topic, "read_uncommitted", "end-1")
    aborted = sum(1 for _, v in everything if v.startswith("aborted"))
    check(aborted == KEYS * (TRANSACTIONS // 3), f"read_uncommitted before cleaning saw {aborted} aborted records")

    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("min.compaction.lag.ms", "0", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(TIMEOUT_SECONDS)

    # Committed last, so every read up to it is complete; polled (a condition with a deadline)
    # until the cleaner has covered the log.
    commit_end(p, topic, "end-2")
    expect["end-2"] = "end"
    deadline = time.monotonic() + CLEANED_DEADLINE_SECONDS
    reads = 0
    while True:
        reads += 1
        everything = read_until(bootstrap, topic, "read_uncommitted", "end-2")
        keys = [k for k, _ in everything]
        if not any(v.startswith("aborted") for _, v in everything) and len(keys) == len(set(keys)):
            break
        if time.monotonic() > deadline:
            fail(f"not cleaned within {CLEANED_DEADLINE_SECONDS}s: {len(everything)} records read uncommitted")
    check(latest(everything) == expect, f"read_uncommitted after cleaning: {latest(everything)} != {expect}")

    seen = read_until(bootstrap, topic, "read_committed", "end-2")
    check(not any(v.startswith("aborted") for _, v in seen), "read_committed saw aborted records after cleaning")
    check(latest(seen) == expect, f"read_committed after cleaning: {latest(seen)} != {expect}")
    check(len(seen) == len(expect), f"read_committed after cleaning read {len(seen)} records for {len(expect)} keys")
    print(f"ok: {len(expect)} keys, cleaned after {reads} reads")


if __name__ == "__main__":
    main()

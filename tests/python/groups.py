#!/usr/bin/env python3
"""Consumer groups through a Strata broker with Python's confluent-kafka client.

Creates a 4-partition topic, subscribes two consumers in group "py-share" and one in group
"py-broadcast", waits until both groups are stable, produces keyed records, and checks:

- the two "py-share" members own disjoint, non-empty sets of partitions covering the topic and
  together receive every record exactly once, each only from its own partitions;
- the "py-broadcast" member receives every record exactly once;
- per key, sequence numbers strictly increase in every consumer's view;
- no member of "py-share" rebalances while consuming;
- after the final commits, OffsetFetch (committed()) returns each partition's end offset.

Commits are explicit and synchronous (enable.auto.commit false): on revocation, and at the end.
Exits 0 when everything holds, 1 with a message otherwise, 2 when confluent-kafka is missing.

Run by tests/tests/consumer_groups.rs against the real binary:
    python3 tests/python/groups.py --bootstrap 127.0.0.1:9092 --topic t
"""

import argparse
import sys
import time

try:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic
except ImportError as error:  # pragma: no cover - depends on the machine
    print(f"confluent-kafka is not installed ({error}); pip install confluent-kafka", file=sys.stderr)
    sys.exit(2)

PARTITIONS = 4
RECORDS = 4000
KEYS = 100
DEADLINE_SECONDS = 45.0


def fail(why):
    print(f"python groups FAILED: {why}", file=sys.stderr)
    sys.exit(1)


class Member:
    """One subscribed consumer and everything it saw."""

    def __init__(self, bootstrap, topic, group, name):
        self.name = name
        self.group = group
        self.topic = topic
        self.assignment = set()
        self.events = []
        self.got = []  # (partition, offset, key, seq)
        self.positions = {}
        self.errors = []
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "client.id": name,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 300,
                "fetch.wait.max.ms": 100,
            }
        )
        self.consumer.subscribe([topic], on_assign=self.on_assign, on_revoke=self.on_revoke)

    def on_assign(self, consumer, partitions):
        assigned = {p.partition for p in partitions}
        self.assignment |= assigned
        self.events.append(("assign", sorted(assigned)))

    def on_revoke(self, consumer, partitions):
        revoked = {p.partition for p in partitions}
        self.commit(revoked)
        self.assignment -= revoked
        for p in revoked:
            self.positions.pop(p, None)
        self.events.append(("revoke", sorted(revoked)))

    def commit(self, only=None):
        offsets = [
            TopicPartition(self.topic, p, o)
            for p, o in sorted(self.positions.items())
            if p in self.assignment and (only is None or p in only)
        ]
        if not offsets:
            return
        try:
            answer = self.consumer.commit(offsets=offsets, asynchronous=False)
        except Exception as error:  # KafkaException; the test reports it, it does not retry
            self.errors.append(f"commit {offsets}: {error}")
            return
        for tp in answer or []:
            if tp.error is not None:
                self.errors.append(f"commit {tp.partition}: {tp.error}")

    def poll(self):
        for message in self.consumer.consume(num_messages=500, timeout=0.05):
            if message.error():
                self.errors.append(f"consume: {message.error()}")
                continue
            value = message.value().decode()
            seq = int(value.split("=", 1)[1])
            self.got.append((message.partition(), message.offset(), message.key().decode(), seq))
            self.positions[message.partition()] = message.offset() + 1

    def distinct(self):
        return {(p, o) for p, o, _, _ in self.got}

    def describe(self):
        return (
            f"{self.name} ({self.group}): assignment {sorted(self.assignment)}, "
            f"{len(self.got)} records, events {self.events}, errors {self.errors}"
        )


def create_topic(bootstrap, topic):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])
    for name, future in futures.items():
        future.result(timeout=30)
    deadline = time.monotonic() + DEADLINE_SECONDS
    while True:
        metadata = admin.list_topics(topic, timeout=10)
        described = metadata.topics.get(topic)
        if described is not None and described.error is None and len(described.partitions) == PARTITIONS:
            return
        if time.monotonic() > deadline:
            fail(f"Metadata never listed {topic} with {PARTITIONS} partitions")
        time.sleep(0.05)


def poll_until(members, what, condition):
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            fail(f"timed out waiting until {what}:\n  " + "\n  ".join(m.describe() for m in members))
        for member in members:
            member.poll()


def produce(bootstrap, topic):
    """Produces RECORDS keyed records; returns {(partition, offset): seq}."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 30000,
        }
    )
    where = {}
    errors = []

    def on_delivery(error, message, seq):
        if error is not None:
            errors.append((seq, error))
        else:
            where[(message.partition(), message.offset())] = seq

    for seq in range(RECORDS):
        producer.produce(
            topic,
            key=f"k{seq % KEYS}".encode(),
            value=f"seq={seq}".encode(),
            on_delivery=lambda err, msg, seq=seq: on_delivery(err, msg, seq),
        )
        producer.poll(0)
    left = producer.flush(DEADLINE_SECONDS)
    if left or errors:
        fail(f"{left} records undelivered, errors {errors[:5]}")
    if len(where) != RECORDS:
        fail(f"{len(where)} distinct acknowledged positions for {RECORDS} records")
    return where


def check_exactly_once(group, members, expected):
    seen = {}
    for member in members:
        for p, o, key, seq in member.got:
            if (p, o) in seen:
                fail(f"{group}: {p}/{o} delivered to {seen[(p, o)]} and {member.name}")
            seen[(p, o)] = member.name
            if expected.get((p, o)) != seq:
                fail(f"{group}: {member.name} got seq {seq} at {p}/{o}, expected {expected.get((p, o))}")
    missing = sorted(set(expected) - set(seen))
    if missing:
        fail(f"{group}: {len(missing)} records never delivered, first {missing[:10]}")


def check_key_order(member):
    last = {}
    for p, o, key, seq in member.got:
        if key in last and seq <= last[key]:
            fail(f"{member.name}: key {key} went from seq {last[key]} to {seq} at {p}/{o}")
        last[key] = seq


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    args = parser.parse_args()
    started = time.monotonic()

    create_topic(args.bootstrap, args.topic)
    share = [Member(args.bootstrap, args.topic, "py-share", f"share-{i}") for i in range(2)]
    broadcast = Member(args.bootstrap, args.topic, "py-broadcast", "broadcast-0")
    members = share + [broadcast]
    everything = set(range(PARTITIONS))

    def stable():
        a, b = share[0].assignment, share[1].assignment
        return a and b and not (a & b) and (a | b) == everything and broadcast.assignment == everything

    poll_until(members, "both groups are stable", stable)
    assignments = [set(m.assignment) for m in share]
    marks = [len(m.events) for m in share]
    stable_after = time.monotonic() - started

    expected = produce(args.bootstrap, args.topic)
    poll_until(
        members,
        f"both groups received {RECORDS} records",
        lambda: len(share[0].distinct() | share[1].distinct()) >= RECORDS and len(broadcast.distinct()) >= RECORDS,
    )
    for member, mark in zip(share, marks):
        if len(member.events) != mark:
            fail(f"{member.name} rebalanced while consuming: {member.events[mark:]}")

    for member, owned in zip(share, assignments):
        partitions = {p for p, _, _, _ in member.got}
        if not partitions <= owned:
            fail(f"{member.name} received partitions {sorted(partitions)} but owns {sorted(owned)}")
    check_exactly_once("py-share", share, expected)
    check_exactly_once("py-broadcast", [broadcast], expected)
    for member in members:
        check_key_order(member)

    ends = {}
    for (p, o) in expected:
        ends[p] = max(ends.get(p, 0), o + 1)
    for member in members:
        member.commit()
        if member.errors:
            fail(member.describe())
    for member in members:
        answer = member.consumer.committed(
            [TopicPartition(args.topic, p) for p in sorted(member.assignment)], timeout=10
        )
        got = {tp.partition: tp.offset for tp in answer}
        want = {p: ends[p] for p in member.assignment}
        if got != want:
            fail(f"{member.name}: committed {got}, want {want}")
    for member in members:
        member.consumer.close()

    counts = [len(m.got) for m in share]
    print(
        f"python groups: stable after {stable_after:.1f}s; py-share split {counts} over "
        f"{[sorted(a) for a in assignments]}, py-broadcast got {len(broadcast.got)}; "
        f"{time.monotonic() - started:.1f}s in all"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

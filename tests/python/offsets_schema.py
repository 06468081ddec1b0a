#!/usr/bin/env python3
"""__consumer_offsets holds Kafka's own binary records (issue 14, item 4).

A confluent-kafka consumer joins a group (classic protocol) and commits offsets with
metadata; then a plain reader assigns every partition of __consumer_offsets and decodes each
record with Kafka's layout, written out here from Kafka's message JSON files, independently
of the broker's code:
- key: int16 version (the record type), then the key struct (int16-length strings);
- type 1, OffsetCommitKey (group, topic, partition) -> OffsetCommitValue v3
  (offset int64, leaderEpoch int32, metadata string, commitTimestamp int64);
- type 2, GroupMetadataKey (group) -> GroupMetadataValue v3 (protocolType, generation,
  protocol, leader, currentStateTimestamp, members with their subscription bytes).
Every record of the topic must decode; the group's last commits and its metadata must be there.

Exits 0 when every check passes, 1 with a message otherwise, 2 when confluent-kafka is missing.
Run by tests/tests/offsets_compaction.rs against the real binary:
    python3 tests/python/offsets_schema.py --bootstrap 127.0.0.1:9092 --topic t
"""

import argparse
import struct
import sys
import time
import uuid

try:
    from confluent_kafka import Consumer, Producer, TopicPartition
except ImportError as error:  # pragma: no cover - depends on the machine
    print(f"confluent-kafka is not installed ({error}); pip install confluent-kafka", file=sys.stderr)
    sys.exit(2)

TIMEOUT_SECONDS = 60.0
OFFSETS_TOPIC = "__consumer_offsets"


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


class Reader:
    def __init__(self, data):
        self.data = data
        self.at = 0

    def take(self, n):
        check(self.at + n <= len(self.data), f"truncated record at {self.at}: {self.data!r}")
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def i8(self):
        return struct.unpack(">b", self.take(1))[0]

    def i16(self):
        return struct.unpack(">h", self.take(2))[0]

    def i32(self):
        return struct.unpack(">i", self.take(4))[0]

    def i64(self):
        return struct.unpack(">q", self.take(8))[0]

    def string(self, nullable=False):
        n = self.i16()
        if n < 0:
            check(nullable, "null in a non-nullable string")
            return None
        return self.take(n).decode("utf-8")

    def bytes(self):
        n = self.i32()
        return b"" if n < 0 else self.take(n)

    def done(self):
        check(self.at == len(self.data), f"{len(self.data) - self.at} bytes left over")


def decode(key, value):
    """(type, key fields, value fields or None); fails on anything not in Kafka's layout
    (types 3-8 are KIP-848 records, decoded as far as their key only)."""
    k = Reader(key)
    kind = k.i16()
    if kind in (0, 1):
        fields = (k.string(), k.string(), k.i32())
        k.done()
        if value is None:
            return kind, fields, None
        v = Reader(value)
        version = v.i16()
        check(version == 3, f"OffsetCommitValue version {version}, Kafka 4 writes 3")
        out = {"offset": v.i64(), "leader_epoch": v.i32(), "metadata": v.string(), "timestamp": v.i64()}
        v.done()
        return kind, fields, out
    if kind == 2:
        fields = (k.string(),)
        k.done()
        if value is None:
            return kind, fields, None
        v = Reader(value)
        version = v.i16()
        check(version == 3, f"GroupMetadataValue version {version}, Kafka 4 writes 3")
        out = {
            "protocol_type": v.string(),
            "generation": v.i32(),
            "protocol": v.string(nullable=True),
            "leader": v.string(nullable=True),
            "current_state_timestamp": v.i64(),
            "members": [],
        }
        for _ in range(v.i32()):
            out["members"].append(
                {
                    "member_id": v.string(),
                    "group_instance_id": v.string(nullable=True),
                    "client_id": v.string(),
                    "client_host": v.string(),
                    "rebalance_timeout": v.i32(),
                    "session_timeout": v.i32(),
                    "subscription": v.bytes(),
                    "assignment": v.bytes(),
                }
            )
        v.done()
        return kind, fields, out
    check(3 <= kind <= 8 or kind == 1000, f"unknown record type {kind}")
    return kind, (k.string(),), value


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    args = parser.parse_args()
    group = f"schema-{uuid.uuid4()}"

    producer = Producer({"bootstrap.servers": args.bootstrap})
    for p in range(2):
        for i in range(3):
            producer.produce(args.topic, value=b"x", partition=p)
    check(producer.flush(TIMEOUT_SECONDS) == 0, "produce did not finish")

    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": group,
            "client.id": "schema-client",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([args.topic])
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while not consumer.assignment():
        check(time.monotonic() < deadline, "no assignment")
        consumer.poll(0.2)
    consumer.commit(
        offsets=[TopicPartition(args.topic, 0, 2, metadata="first"), TopicPartition(args.topic, 1, 3, metadata="second")],
        asynchronous=False,
    )
    consumer.commit(
        offsets=[TopicPartition(args.topic, 0, 3, metadata="first"), TopicPartition(args.topic, 1, 3, metadata="second")],
        asynchronous=False,
    )

    reader = Consumer({"bootstrap.servers": args.bootstrap, "group.id": f"reader-{uuid.uuid4()}", "enable.auto.commit": False})
    metadata = reader.list_topics(OFFSETS_TOPIC, timeout=TIMEOUT_SECONDS)
    partitions = list(metadata.topics[OFFSETS_TOPIC].partitions)
    ends = {}
    assignment = []
    for p in partitions:
        low, high = reader.get_watermark_offsets(TopicPartition(OFFSETS_TOPIC, p), timeout=TIMEOUT_SECONDS)
        if high > low:
            ends[p] = high
            assignment.append(TopicPartition(OFFSETS_TOPIC, p, low))
    reader.assign(assignment)
    offsets = {}
    group_metadata = None
    decoded = 0
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while ends:
        check(time.monotonic() < deadline, f"reading {OFFSETS_TOPIC} did not reach {ends}")
        message = reader.poll(0.5)
        if message is None:
            continue
        check(message.error() is None, f"reading {OFFSETS_TOPIC}: {message.error()}")
        kind, key, value = decode(message.key(), message.value())
        decoded += 1
        if kind == 1 and key[0] == group:
            offsets[(key[1], key[2])] = value
        if kind == 2 and key[0] == group:
            group_metadata = value
        if ends.get(message.partition()) == message.offset() + 1:
            del ends[message.partition()]

    # confluent-kafka 2.x sends the metadata string with its C terminator (the client's, not
    # the broker's doing: the broker stores what OffsetCommit carried).
    for value in offsets.values():
        value["metadata"] = value["metadata"].rstrip("\x00")
    check(offsets.get((args.topic, 0), {}).get("offset") == 3, f"partition 0: {offsets}")
    check(offsets[(args.topic, 0)]["metadata"] == "first", f"partition 0 metadata: {offsets}")
    check(offsets.get((args.topic, 1), {}).get("offset") == 3, f"partition 1: {offsets}")
    check(offsets[(args.topic, 1)]["metadata"] == "second", f"partition 1 metadata: {offsets}")
    check(group_metadata is not None, "no GroupMetadata record for the group")
    check(group_metadata["protocol_type"] == "consumer", f"protocol type: {group_metadata}")
    check(group_metadata["generation"] >= 1, f"generation: {group_metadata}")
    members = group_metadata["members"]
    check(len(members) == 1 and members[0]["client_id"] == "schema-client", f"members: {members}")
    check(group_metadata["leader"] == members[0]["member_id"], f"leader: {group_metadata}")
    consumer.close()
    reader.close()
    print(f"decoded {decoded} records of {OFFSETS_TOPIC} with Kafka's layout")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A compacted topic keeps exactly the latest value of each key, seen by confluent-kafka or
kafka-python (issue 14: "100k updates over 1k keys reads back exactly the latest value per
key").

The script creates a one-partition topic with cleanup.policy=compact and a low
min.cleanable.dirty.ratio, produces --updates records over --keys keys (update i sets key
i % keys to "value-i"), remembers the offset every update was acknowledged at, then reads the
partition from offset 0 to its end again and again, with a deadline, until it holds exactly
one record per key: the latest acknowledged one, at its offset. Every read must also see
offsets only ever increasing. The broker must run with small segments
(tests/tests/compaction.rs) so the data becomes cleanable within the test.

Exits 0 when the check passes, 1 with a message otherwise, 2 when the client is missing.
    python3 tests/python/compacted_topic.py --client kafka-python --bootstrap 127.0.0.1:9092 \
        --topic t --updates 100000 --keys 1000
"""

import argparse
import sys
import time

DEADLINE_SECONDS = 240.0


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def missing(client, error):
    print(f"{client} is not installed ({error}); pip install {client}", file=sys.stderr)
    sys.exit(2)


class Confluent:
    def __init__(self, bootstrap):
        try:
            import confluent_kafka  # noqa: F401
        except ImportError as error:  # pragma: no cover - depends on the machine
            missing("confluent-kafka", error)
        self.bootstrap = bootstrap

    def create(self, topic, configs):
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        futures = admin.create_topics([NewTopic(topic, 1, config=configs)])
        futures[topic].result(timeout=30)

    def produce(self, topic, records):
        from confluent_kafka import Producer

        producer = Producer(
            {"bootstrap.servers": self.bootstrap, "linger.ms": 5, "enable.idempotence": True}
        )
        offsets = {}
        errors = []

        def on_delivery(error, message, i):
            if error is not None:
                errors.append(error)
            else:
                offsets[i] = message.offset()

        for i, (key, value) in enumerate(records):
            while True:
                try:
                    producer.produce(
                        topic, key=key, value=value, partition=0,
                        on_delivery=lambda e, m, i=i: on_delivery(e, m, i),
                    )
                    break
                except BufferError:
                    producer.poll(0.1)
        remaining = producer.flush(60)
        if errors or remaining:
            fail(f"confluent-kafka: {len(errors)} delivery errors ({errors[:3]}), {remaining} unsent")
        return [offsets[i] for i in range(len(records))]

    def end_offset(self, topic):
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "compacted-reader"})
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        consumer.close()
        return high

    def read_all(self, topic, end):
        """(offset, key, value) of every record from offset 0 up to end - 1."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": "compacted-reader",
                "enable.auto.commit": False,
                "auto.offset.reset": "error",
            }
        )
        consumer.assign([TopicPartition(topic, 0, 0)])
        records = []
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is None:
                    continue
                if message.error():
                    fail(f"confluent-kafka read: {message.error()}")
                records.append((message.offset(), message.key(), message.value()))
                if message.offset() >= end - 1:
                    return records
            fail(f"confluent-kafka: read stopped at {records[-1:]} before offset {end - 1}")
        finally:
            consumer.close()


class KafkaPython:
    def __init__(self, bootstrap):
        try:
            import kafka  # noqa: F401
        except ImportError as error:  # pragma: no cover - depends on the machine
            missing("kafka-python", error)
        self.bootstrap = bootstrap

    def create(self, topic, configs):
        from kafka.admin import KafkaAdminClient, NewTopic

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap)
        admin.create_topics([NewTopic(topic, 1, 1, topic_configs=configs)])
        admin.close()

    def produce(self, topic, records):
        from kafka import KafkaProducer

        producer = KafkaProducer(
            bootstrap_servers=self.bootstrap, linger_ms=5, acks="all", batch_size=65536
        )
        futures = [producer.send(topic, key=k, value=v, partition=0) for k, v in records]
        producer.flush(60)
        offsets = [f.get(timeout=60).offset for f in futures]
        producer.close()
        return offsets

    def _consumer(self):
        from kafka import KafkaConsumer

        return KafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="none",
        )

    def end_offset(self, topic):
        from kafka import TopicPartition

        consumer = self._consumer()
        tp = TopicPartition(topic, 0)
        end = consumer.end_offsets([tp])[tp]
        consumer.close()
        return end

    def read_all(self, topic, end):
        from kafka import TopicPartition

        consumer = self._consumer()
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        records = []
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline:
                for batch in consumer.poll(timeout_ms=500).values():
                    for message in batch:
                        records.append((message.offset, message.key, message.value))
                        if message.offset >= end - 1:
                            return records
            fail(f"kafka-python: read stopped at {records[-1:]} before offset {end - 1}")
        finally:
            consumer.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--client", choices=["confluent-kafka", "kafka-python"], required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--updates", type=int, default=20000)
    parser.add_argument("--keys", type=int, default=1000)
    args = parser.parse_args()
    client = (Confluent if args.client == "confluent-kafka" else KafkaPython)(args.bootstrap)

    client.create(args.topic, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"})
    records = [
        (f"key-{i % args.keys}".encode(), f"value-{i}".encode()) for i in range(args.updates)
    ]
    started = time.monotonic()
    offsets = client.produce(args.topic, records)
    produced = time.monotonic() - started
    if sorted(offsets) != list(range(args.updates)):
        fail(f"acknowledged offsets are not 0..{args.updates - 1}")
    latest = {}
    for offset, (key, value) in zip(offsets, records):
        if key not in latest or latest[key][0] < offset:
            latest[key] = (offset, value)

    deadline = time.monotonic() + DEADLINE_SECONDS
    reads = 0
    while True:
        end = client.end_offset(args.topic)
        if end != args.updates:
            fail(f"end offset {end}, expected {args.updates}: offsets must not move")
        read = client.read_all(args.topic, end)
        reads += 1
        offsets_read = [o for o, _, _ in read]
        if any(b <= a for a, b in zip(offsets_read, offsets_read[1:])):
            fail(f"read {reads}: offsets went backwards or repeated")
        # Whatever is read, each key's last record read is its latest value: a read before
        # cleaning finishes sees more records, never an older last value.
        last = {}
        for offset, key, value in read:
            last[key] = (offset, value)
        if last != latest:
            wrong = [k for k in latest if last.get(k) != latest[k]][:3]
            fail(f"read {reads}: the last record of keys {wrong} is not their latest value")
        if len(read) == len(latest):
            break
        if time.monotonic() > deadline:
            fail(f"after {DEADLINE_SECONDS}s still {len(read)} records for {len(latest)} keys")
        time.sleep(0.5)
    print(
        f"{args.client}: {args.updates} updates over {args.keys} keys produced in {produced:.1f}s; "
        f"read back exactly the latest value of each key after {reads} reads "
        f"({time.monotonic() - started:.1f}s in all)"
    )


if __name__ == "__main__":
    main()

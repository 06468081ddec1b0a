#!/usr/bin/env python3
"""An exactly-once pipeline through confluent-kafka, and the checks of what it wrote.

Modes (run by tests/tests/transactions.rs against a real 3-broker cluster):
- `seed`: produces `--records` input records `rec-<i>` (key `k<i>`) over the input topic's
  partitions, idempotently.
- `run`: the pipeline. It reads the input read_committed from the offsets its transactional id
  committed, and per transaction produces `out:<value>` for up to `--per-txn` records to the
  output topic (keyed, so a transaction spans the output's partitions), sends the input offsets
  in the same transaction and commits. Each output record carries the headers `txn` (this
  incarnation and transaction number) and `txn-size` (how many records the transaction wrote).
  Mid-transaction (records produced, offsets not yet sent) it prints `CHECKPOINT <progress>` and
  waits for `GO` on stdin, so the harness can kill it or a broker, or move a partition, at that
  exact point. An abortable error aborts and rewinds to the committed offsets; any other exits 3
  (the harness starts a new incarnation, which fences this one and aborts its transaction). Exits 0 once the committed
  input offsets reach `--records`.
- `lso`: samples each output partition's last stable offset (ListOffsets, read_committed) until
  stdin closes and fails if one ever goes back.
- `verify`: commits an end marker to each output partition, reads the output read_committed up
  to the markers and checks every input record is there exactly once (no loss, no duplicate, no
  record of an aborted transaction) and every transaction is whole (no torn transaction).

Exits 0 when the mode's checks pass, 1 with a message otherwise, 2 when confluent-kafka is
missing, 3 from `run` on a fatal client error.
"""

import argparse
import os
import sys
import time
import uuid
from collections import Counter, defaultdict

try:
    from confluent_kafka import (
        Consumer,
        IsolationLevel,
        KafkaException,
        Producer,
        TopicPartition,
    )
    from confluent_kafka.admin import AdminClient, OffsetSpec
except ImportError as error:  # pragma: no cover - depends on the machine
    print(f"confluent-kafka is not installed ({error}); pip install confluent-kafka", file=sys.stderr)
    sys.exit(2)

TIMEOUT_SECONDS = 90.0


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def seed(args):
    producer = Producer({"bootstrap.servers": args.bootstrap, "enable.idempotence": True})
    for i in range(args.records):
        producer.produce(args.input, key=f"k{i}".encode(), value=f"rec-{i}".encode(),
                         partition=i % args.partitions)
        producer.poll(0)
    check(producer.flush(TIMEOUT_SECONDS) == 0, "input records left unsent")
    print(f"seeded {args.records}", flush=True)


def committed_positions(consumer, partitions):
    """The offsets the pipeline's transactions committed (0 where none yet)."""
    committed = consumer.committed(partitions, timeout=TIMEOUT_SECONDS)
    return [TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)) for tp in committed]


def run(args):
    incarnation = uuid.uuid4().hex[:8]
    partitions = [TopicPartition(args.input, p) for p in range(args.partitions)]
    consumer = Consumer({
        "bootstrap.servers": args.bootstrap,
        "group.id": args.group,
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    })
    producer = Producer({
        "bootstrap.servers": args.bootstrap,
        "transactional.id": args.txn_id,
        "transaction.timeout.ms": 30000,
        # Metadata every second (librdkafka's default is 5 minutes): a killed broker leaves
        # the producer's broker list as soon as Metadata stops listing it, so a coordinator
        # lookup after a broker's death meets librdkafka's handling of a broker it destroyed.
        "topic.metadata.refresh.interval.ms": 1000,
        # The test keeps stderr in a file and shows it only on failure.
        **({"debug": os.environ["STRATA_EOS_PIPELINE_DEBUG"]}
           if os.environ.get("STRATA_EOS_PIPELINE_DEBUG") else {}),
    })
    # Fences every earlier incarnation and aborts the transaction it left open.
    producer.init_transactions(TIMEOUT_SECONDS)
    # The next input offset per partition, kept here: librdkafka's position() stays unset for
    # a partition until a record of it arrives.
    positions = committed_positions(consumer, partitions)
    consumer.assign(positions)
    next_offset = {tp.partition: tp.offset for tp in positions}
    print(f"incarnation {incarnation} starts at {next_offset}", flush=True)

    def offsets():
        return [TopicPartition(args.input, p, o) for p, o in sorted(next_offset.items())]

    number = 0
    while True:
        progress = sum(next_offset.values())
        if progress >= args.records:
            break
        number += 1
        tag = f"{incarnation}:{number}".encode()
        batch = []
        deadline = time.monotonic() + TIMEOUT_SECONDS
        while len(batch) < args.per_txn and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                if batch:
                    break
                continue
            if message.error():
                print(f"consume error: {message.error()}", file=sys.stderr, flush=True)
                continue
            batch.append(message)
            next_offset[message.partition()] = message.offset() + 1
        check(batch, f"no input for {TIMEOUT_SECONDS}s at progress {progress}")
        try:
            producer.begin_transaction()
            for message in batch:
                producer.produce(
                    args.output,
                    key=message.key(),
                    value=b"out:" + message.value(),
                    headers=[("txn", tag), ("txn-size", str(len(batch)).encode())],
                )
            producer.flush(TIMEOUT_SECONDS)
            print(f"CHECKPOINT {progress}", flush=True)
            check(sys.stdin.readline().strip() == "GO", "the harness did not answer GO")
            producer.send_offsets_to_transaction(
                offsets(),
                consumer.consumer_group_metadata(),
                TIMEOUT_SECONDS,
            )
            producer.commit_transaction(TIMEOUT_SECONDS)
            print(f"COMMITTED {sum(next_offset.values())}", flush=True)
        except KafkaException as exception:
            error = exception.args[0]
            if not error.txn_requires_abort():
                # Fatal (fenced, say), or retriable where the call could be repeated: either
                # way a new incarnation starts over cleanly, fencing this one.
                print(f"FATAL {error}", flush=True)
                sys.exit(3)
            print(f"ABORT {error}", flush=True)
            producer.abort_transaction(TIMEOUT_SECONDS)
            # Everything read since the last commit is read again.
            committed = committed_positions(consumer, partitions)
            consumer.assign(committed)
            next_offset.update({tp.partition: tp.offset for tp in committed})
    consumer.close()
    print("DONE", flush=True)


def lso(args):
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    last = defaultdict(lambda: -1)
    samples = 0
    import select

    while True:
        ready, _, _ = select.select([sys.stdin], [], [], 0.1)
        if ready and sys.stdin.readline() == "":
            break
        request = {TopicPartition(args.output, p): OffsetSpec.latest() for p in range(args.partitions)}
        futures = admin.list_offsets(request, isolation_level=IsolationLevel.READ_COMMITTED,
                                     request_timeout=5)
        for tp, future in futures.items():
            try:
                offset = future.result().offset
            except KafkaException:
                # A broker being killed or a partition moving: no sample this round.
                continue
            if offset < 0:
                # librdkafka's "no offset" (-1001) when the leader it asked went away mid-call.
                continue
            check(offset >= last[tp.partition],
                  f"last stable offset of partition {tp.partition} went back: {last[tp.partition]} -> {offset}")
            last[tp.partition] = offset
            samples += 1
    check(samples > 0, "no last stable offset was ever read")
    print(f"LSO OK {samples} samples, last {dict(last)}", flush=True)


def verify(args):
    marker = f"end-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": args.bootstrap, "transactional.id": f"{args.txn_id}-verify"})
    producer.init_transactions(TIMEOUT_SECONDS)
    producer.begin_transaction()
    for p in range(args.partitions):
        producer.produce(args.output, value=marker.encode(), partition=p)
    producer.commit_transaction(TIMEOUT_SECONDS)

    consumer = Consumer({
        "bootstrap.servers": args.bootstrap,
        "group.id": f"verify-{uuid.uuid4()}",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
    })
    consumer.assign([TopicPartition(args.output, p, 0) for p in range(args.partitions)])
    values, txns, sizes = Counter(), Counter(), {}
    ended = set()
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while len(ended) < args.partitions and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None or message.error():
            continue
        value = message.value().decode()
        if value == marker:
            ended.add(message.partition())
            continue
        check(message.partition() not in ended, f"{value} after the end marker")
        values[value] += 1
        headers = dict(message.headers() or [])
        tag = headers.get("txn")
        txns[tag] += 1
        sizes[tag] = int(headers.get("txn-size", b"0"))
    consumer.close()
    check(len(ended) == args.partitions, f"end markers read in {sorted(ended)} only")
    expected = {f"out:rec-{i}" for i in range(args.records)}
    missing = sorted(expected - set(values))
    duplicated = sorted(v for v, n in values.items() if n > 1)
    unexpected = sorted(set(values) - expected)
    check(not missing, f"{len(missing)} input records never output, e.g. {missing[:5]}")
    check(not duplicated, f"{len(duplicated)} input records output twice, e.g. {duplicated[:5]}")
    check(not unexpected, f"unexpected output {unexpected[:5]}")
    torn = {tag: (n, sizes[tag]) for tag, n in txns.items() if n != sizes[tag]}
    check(not torn, f"torn transactions (read, written): {dict(list(torn.items())[:5])}")
    print(f"VERIFIED {sum(values.values())} records exactly once in {len(txns)} whole transactions",
          flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["seed", "run", "lso", "verify"])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", default="eos-in")
    parser.add_argument("--output", default="eos-out")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--records", type=int, default=1500)
    parser.add_argument("--per-txn", type=int, default=25)
    parser.add_argument("--group", default="eos-pipeline")
    parser.add_argument("--txn-id", default="eos-pipeline")
    args = parser.parse_args()
    {"seed": seed, "run": run, "lso": lso, "verify": verify}[args.mode](args)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Transactional produce: throughput and commit latency at 1, 10 and 100 records per
transaction (confluent-kafka's transactional Producer, one process, one transaction at a time,
as a consume-transform-produce application runs them).

Each size runs for `--seconds` on a fresh 3-partition topic: begin, produce the transaction's
records (100 bytes, keyed, so they spread over the partitions), commit; the commit latency is
the time from the last produce() to commit_transaction() returning: the records made durable
(flush(), reported on its own), then EndTxn, for which the coordinator makes its decision
durable and writes the markers. Prints one table row per size.

    python3 bench/scripts/transactions.py --bootstrap 127.0.0.1:9092 --sizes 1 10 100 --seconds 20
"""

import argparse
import os
import statistics
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def run(args, size):
    topic = f"txn-bench-{os.getpid()}-{size}-{int(time.time() * 1000)}"
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)
    producer = Producer({
        "bootstrap.servers": args.bootstrap,
        "transactional.id": f"{topic}-tx",
        "linger.ms": 1,
    })
    producer.init_transactions(30)
    value = b"x" * 100
    commits, flushes, records = [], [], 0
    started = time.monotonic()
    end = started + args.seconds
    n = 0
    while time.monotonic() < end:
        producer.begin_transaction()
        for _ in range(size):
            producer.produce(topic, key=str(n).encode(), value=value)
            n += 1
        before = time.monotonic()
        producer.flush(30)
        flushed = time.monotonic()
        producer.commit_transaction(30)
        commits.append(time.monotonic() - before)
        flushes.append(flushed - before)
        records += size
    elapsed = time.monotonic() - started
    return {
        "size": size,
        "transactions": len(commits),
        "records_per_s": records / elapsed,
        "txn_per_s": len(commits) / elapsed,
        "p50_ms": statistics.median(commits) * 1000,
        "p99_ms": percentile(commits, 0.99) * 1000,
        "max_ms": max(commits) * 1000,
        "flush_p50_ms": statistics.median(flushes) * 1000,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    print("| records/txn | transactions | records/s | txn/s | commit p50 ms | commit p99 ms | max ms "
          "| of which records durable, p50 ms |")
    print("|---|---|---|---|---|---|---|---|")
    for size in args.sizes:
        r = run(args, size)
        print(f"| {r['size']} | {r['transactions']:,} | {r['records_per_s']:,.0f} | {r['txn_per_s']:,.0f} "
              f"| {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['max_ms']:.1f} | {r['flush_p50_ms']:.1f} |",
              flush=True)


if __name__ == "__main__":
    main()

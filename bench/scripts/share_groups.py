#!/usr/bin/env python3
"""Share-group throughput: records per second acknowledged by C share consumers of one
partition (confluent-kafka's ShareConsumer, one process each, implicit acknowledgement: the
records of a poll are accepted by the next poll).

Produces N records (100 bytes) to a fresh one-partition topic first, then starts the
consumers and times from their start until the broker's /metrics counts N records accepted
(`strata_share_records_total{outcome="accepted"}`), so consumer start-up and group join are in
the time. The broker must run with `--share-auto-offset-reset earliest` and a metrics endpoint.

    python3 bench/scripts/share_groups.py --bootstrap 127.0.0.1:9092 \\
        --metrics http://127.0.0.1:9100/metrics --records 200000 --consumers 1 4 16
"""

import argparse
import multiprocessing
import os
import time
import urllib.request

from confluent_kafka import Producer, ShareConsumer
from confluent_kafka.admin import AdminClient, NewTopic


def accepted(metrics_url):
    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith('strata_share_records_total{outcome="accepted"}'):
            return int(float(line.split()[-1]))
    return 0


def consume(bootstrap, topic, group, stop):
    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group})
    c.subscribe([topic])
    while not stop.is_set():
        c.poll(0.2)
    c.commit_sync()
    c.close()


def run(args, consumers):
    topic = f"share-bench-{os.getpid()}-{consumers}-{int(time.time() * 1000)}"
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    p = Producer({"bootstrap.servers": args.bootstrap, "linger.ms": 5})
    value = b"x" * 100
    for _ in range(args.records):
        while True:
            try:
                p.produce(topic, value=value)
                break
            except BufferError:
                p.poll(0.05)
    p.flush(60)
    before = accepted(args.metrics)
    stop = multiprocessing.Event()
    started = time.monotonic()
    procs = [multiprocessing.Process(target=consume, args=(args.bootstrap, topic, topic, stop))
             for _ in range(consumers)]
    for proc in procs:
        proc.start()
    deadline = started + args.timeout
    done = 0
    while time.monotonic() < deadline:
        done = accepted(args.metrics) - before
        if done >= args.records:
            break
        time.sleep(0.05)
    elapsed = time.monotonic() - started
    stop.set()
    for proc in procs:
        proc.join(30)
    load = os.getloadavg()[0]
    print(f"consumers={consumers} records={args.records} accepted={done} "
          f"seconds={elapsed:.2f} records_per_s={done / elapsed:,.0f} load1={load:.2f}",
          flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--metrics", required=True)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--consumers", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    for c in args.consumers:
        run(args, c)


if __name__ == "__main__":
    main()

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

With `--rate R --seconds S` it measures end-to-end latency instead: C consumers join a fresh
topic first (and are seen to receive a warm-up record), then one producer sends R records a
second for S seconds (`linger.ms` 1, acks=all), each carrying its send time
(`time.time()`, one clock: everything runs on one machine); each consumer notes receive time
minus send time for every record it gets. Reported: p50, p99, p99.9 and max over all records,
and how many were received (each once, by one consumer).

    python3 bench/scripts/share_groups.py --bootstrap 127.0.0.1:9092 \\
        --metrics http://127.0.0.1:9100/metrics --rate 1000 --seconds 30 --consumers 1 4
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


def timed_consume(bootstrap, topic, group, stop, out):
    """Receives until `stop`, reporting (send time, receive time) of each record to `out`."""
    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "fetch.wait.max.ms": 100})
    c.subscribe([topic])
    seen = []
    reported = False
    while not stop.is_set():
        batch = c.poll(0.1)
        now = time.time()
        for m in list(batch or []):
            if m.error() is None and m.value().startswith(b"t="):
                seen.append((float(m.value()[2:].split(b";")[0]), now))
            elif m.error() is None:
                seen.append((None, now))
        # The first records at once (the warm-up waits for them), then in chunks.
        if len(seen) >= 500 or (seen and not reported):
            out.put(seen)
            seen = []
            reported = True
    out.put(seen)
    c.commit_sync()
    c.close()


def percentile(sorted_values, q):
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def latency(args, consumers):
    topic = f"share-latency-{os.getpid()}-{consumers}-{int(time.time() * 1000)}"
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    p = Producer({"bootstrap.servers": args.bootstrap, "linger.ms": 1, "acks": "all"})
    stop = multiprocessing.Event()
    out = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=timed_consume, args=(args.bootstrap, topic, topic, stop, out))
             for _ in range(consumers)]
    for proc in procs:
        proc.start()
    # Warm-up: records until one is received, so every consumer has joined and fetches.
    warm = 0
    got = []
    deadline = time.monotonic() + 60
    while not got and time.monotonic() < deadline:
        p.produce(topic, value=b"warm")
        p.flush(10)
        warm += 1
        try:
            got = out.get(timeout=1)
        except Exception:  # queue.Empty: nothing yet
            pass
    time.sleep(2)  # the other consumers' joins settle (not a measurement)
    padding = b";" + b"x" * max(0, args.size - 24)
    interval = 1.0 / args.rate
    sent = 0
    start = time.monotonic()
    end = start + args.seconds
    while True:
        due = start + sent * interval
        now = time.monotonic()
        if due >= end:
            break
        if now < due:
            time.sleep(due - now)
        p.produce(topic, value=b"t=%.6f" % time.time() + padding)
        p.poll(0)
        sent += 1
    p.flush(30)
    # Let the last records arrive, then stop the consumers.
    time.sleep(3)
    stop.set()
    samples = []
    finished = 0
    while finished < consumers:
        try:
            part = out.get(timeout=30)
        except Exception:
            break
        samples.extend(part)
        if not part:
            finished += 1
    for proc in procs:
        proc.join(30)
    ms = sorted((r - s) * 1000.0 for s, r in samples if s is not None)
    print(f"consumers={consumers} rate={args.rate}/s seconds={args.seconds} sent={sent} received={len(ms)} "
          f"p50={percentile(ms, 0.50):.1f}ms p99={percentile(ms, 0.99):.1f}ms "
          f"p99.9={percentile(ms, 0.999):.1f}ms max={ms[-1] if ms else float('nan'):.1f}ms "
          f"load1={os.getloadavg()[0]:.2f}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--metrics", required=True)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--consumers", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--rate", type=int, help="latency mode: records per second")
    parser.add_argument("--seconds", type=float, default=30, help="latency mode: how long to produce")
    parser.add_argument("--size", type=int, default=100, help="latency mode: record size in bytes")
    args = parser.parse_args()
    for c in args.consumers:
        if args.rate:
            latency(args, c)
        else:
            run(args, c)


if __name__ == "__main__":
    main()

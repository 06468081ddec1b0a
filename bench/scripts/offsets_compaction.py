#!/usr/bin/env python3
"""On-demand benchmark for issue 14, item 4: __consumer_offsets compacted by key.

Starts a `strata serve` on a fresh local directory, commits offsets for 100 groups
(--commits offset records in all: each commit carries --partitions partitions), and at every
--report-every records reports the records left in __consumer_offsets (what a shard load
replays) and the bytes under the storage directory's __consumer_offsets objects. Then it
SIGKILLs the broker, restarts it, and reports what the restarted broker's shard loads read
(from its `group coordinator shard loaded` lines) and how long start-up took, and checks
every group's committed offsets.

    python3 bench/scripts/offsets_compaction.py --strata target/release/strata --commits 1000000

Results go to docs/BENCHMARKS.md ("__consumer_offsets compaction").
"""

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

OFFSETS_TOPIC = "__consumer_offsets"
GROUPS = 100


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Broker:
    started = []

    def __init__(self, binary, data, port, config):
        self.binary, self.data, self.port, self.config = binary, data, port, config
        self.lines = []
        self.proc = None
        Broker.started.append(self)

    def start(self):
        started = time.monotonic()
        self.proc = subprocess.Popen(
            [self.binary, "serve", "--storage", f"file://{self.data}", "--listen", f"127.0.0.1:{self.port}",
             "--config", self.config],
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        ready = threading.Event()

        def pump():
            for line in self.proc.stderr:
                self.lines.append(line.rstrip())
                if "listening" in line:
                    ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(600):
            sys.exit("the broker did not start")
        return time.monotonic() - started

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def count_records(bootstrap):
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-reader", "enable.auto.commit": False})
    meta = reader.list_topics(OFFSETS_TOPIC, timeout=30)
    ends, assignment = {}, []
    for p in meta.topics[OFFSETS_TOPIC].partitions:
        low, high = reader.get_watermark_offsets(TopicPartition(OFFSETS_TOPIC, p), timeout=30)
        if high > low:
            ends[p] = high
            assignment.append(TopicPartition(OFFSETS_TOPIC, p, low))
    reader.assign(assignment)
    count = 0
    while ends:
        for m in reader.consume(10000, 1.0):
            # Records committed while reading are past the snapshot's end: not counted.
            if m.error() or m.partition() not in ends or m.offset() >= ends[m.partition()]:
                continue
            count += 1
            if ends[m.partition()] == m.offset() + 1:
                del ends[m.partition()]
    reader.close()
    return count


def offsets_bytes(data):
    """Bytes of partition data (segments, index chunks, manifests) and the write-ahead log.
    The benchmark's topic is never produced to, so this is __consumer_offsets (and an empty
    __transaction_state)."""
    total = 0
    for area in ("log", "wal"):
        for root, _, files in os.walk(os.path.join(data, area)):
            for f in files:
                try:
                    total += os.path.getsize(os.path.join(root, f))
                except FileNotFoundError:
                    pass  # deleted since the listing (the write-ahead log is freed as it goes)
    return total


def main():
    try:
        run()
    finally:
        for b in Broker.started:
            if b.proc and b.proc.poll() is None:
                b.kill()
            shutil.rmtree(b.data, ignore_errors=True)
            if os.path.exists(b.config):
                os.remove(b.config)


def run():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strata", required=True)
    parser.add_argument("--commits", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=10)
    parser.add_argument("--report-every", type=int, default=100_000)
    parser.add_argument("--threads", type=int, default=10)
    args = parser.parse_args()

    data = tempfile.mkdtemp(prefix="strata-offsets-bench-")
    config = data + ".toml"
    with open(config, "w") as f:
        f.write('[log]\nsegment_interval = "1s"\nsegment_bytes = "1MiB"\n')
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    broker = Broker(args.strata, data, port, config)
    broker.start()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("bench-offsets", args.partitions, 1)])["bench-offsets"].result(60)

    rounds = args.commits // (GROUPS * args.partitions)
    done = [0]
    lock = threading.Lock()

    def worker(groups):
        consumers = [Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{g}",
                               "enable.auto.commit": False}) for g in groups]
        for r in range(1, rounds + 1):
            for c in consumers:
                c.commit(offsets=[TopicPartition("bench-offsets", p, r * 10 + p)
                                  for p in range(args.partitions)], asynchronous=False)
                with lock:
                    done[0] += args.partitions

    started = time.monotonic()
    threads = [threading.Thread(target=worker, args=([g for g in range(GROUPS) if g % args.threads == t],))
               for t in range(args.threads)]
    for t in threads:
        t.start()
    next_report = args.report_every
    print("| offset records committed | records in __consumer_offsets | bytes under log/ and wal/ |")
    print("|---|---|---|")
    while any(t.is_alive() for t in threads):
        time.sleep(1)
        if done[0] >= next_report:
            print(f"| {done[0]:,} | {count_records(bootstrap):,} | {offsets_bytes(data):,} |", flush=True)
            next_report += args.report_every
    elapsed = time.monotonic() - started
    time.sleep(5)  # benchmark pacing, not synchronisation: lets the cleaner catch up before the last row
    print(f"| {done[0]:,} (end) | {count_records(bootstrap):,} | {offsets_bytes(data):,} |")
    print(f"\n{done[0]:,} offset records in {elapsed:.1f} s ({done[0] / elapsed:,.0f}/s)")

    before = len(broker.lines)
    broker.kill()
    startup = broker.start()
    while sum("group coordinator shard loaded" in l for l in broker.lines[before:]) < 8:
        time.sleep(0.1)
    read = sum(int(re.search(r"read=(\d+)", l).group(1))
               for l in broker.lines[before:] if "group coordinator shard loaded" in l)
    print(f"restart: {startup:.2f} s to listening, shard loads read {read:,} records")
    for g in range(GROUPS):
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{g}"})
        got = c.committed([TopicPartition("bench-offsets", p) for p in range(args.partitions)], timeout=30)
        for tp in got:
            if tp.offset != rounds * 10 + tp.partition:
                sys.exit(f"group {g} partition {tp.partition}: {tp.offset}")
        c.close()
    print("every group's committed offsets are exact")
    broker.kill()


if __name__ == "__main__":
    main()

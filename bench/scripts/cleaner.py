#!/usr/bin/env python3
"""On-demand benchmark of the key cleaner (issue 14): throughput, memory, produce latency.

Starts one `strata serve` (a fresh local directory, or --storage, e.g. a rados:// URL), fills
one compacted partition with --mb MiB of updates over --keys keys while cleaning is held back
(min.compaction.lag.ms of a day), waits until all of it is sealed into segments, then:

1. measures produce latency with the cleaner idle: a probe producer (acks=all, linger 0) sends
   --probe-rate records a second to another topic for --probe-seconds; p50/p99/max of the time
   from produce() to its delivery report;
2. lets the cleaner go (min.compaction.lag.ms=0 through IncrementalAlterConfigs) while the same
   probe runs, until the partition's dirty ratio (strata_log_dirty_ratio) is 0: the cleaning
   time, throughput = the segment bytes cleaned (half of strata_cleaner_bytes_read_total when
   one pass covered everything: it reads them twice, to map and to filter) / cleaning time,
   the cleaner's own counters, the broker's RSS before and its peak while cleaning (/proc,
   sampled every 20 ms), and the same latency figures.

The key map is `cleaner_dedupe_buffer_bytes` (--map, default the broker's 64MiB): fixed, so its
size is a setting, not a measurement; the RSS delta is what the whole pass costs (map, one
segment and its rewrite, buffers).

    python3 bench/scripts/cleaner.py --strata target/debug/strata --mb 256 --keys 100000
    python3 bench/scripts/cleaner.py --strata target/debug/strata --storage "$STRATA_TEST_RADOS_URL/bench1"

Results go to docs/BENCHMARKS.md ("Key cleaner").
"""

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from confluent_kafka import Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

TOPIC = "bench-compacted"
PROBE = "bench-probe"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Broker:
    def __init__(self, binary, storage, config):
        self.binary, self.storage, self.config = binary, storage, config
        self.port = free_port()
        self.lines = []
        self.proc = None
        self.metrics = None

    def start(self):
        self.proc = subprocess.Popen(
            [self.binary, "serve", "--storage", self.storage, "--listen", f"127.0.0.1:{self.port}",
             "--metrics-listen", "127.0.0.1:0", "--config", self.config],
            stderr=subprocess.STDOUT, stdout=subprocess.PIPE, text=True,
            env={k: v for k, v in os.environ.items() if not k.startswith("STRATA_")} | {"NO_COLOR": "1"})
        ready = threading.Event()

        def pump():
            for line in self.proc.stdout:
                self.lines.append(line.rstrip())
                if "metrics on " in line:
                    self.metrics = line.rsplit("metrics on ", 1)[1].split()[0]
                if "listening on" in line:
                    ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(120):
            sys.exit("the broker did not start:\n" + "\n".join(self.lines[-20:]))
        deadline = time.monotonic() + 30
        while self.metrics is None and time.monotonic() < deadline:
            time.sleep(0.05)

    def rss(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def metric(self, series):
        text = urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=10).read().decode()
        for line in text.splitlines():
            if line.startswith(series + " "):
                return float(line.split()[-1])
        return None

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


class Probe:
    """acks=all produce latency to a separate topic at a fixed rate."""

    def __init__(self, bootstrap, rate):
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all"})
        self.rate = rate

    def run(self, until):
        latencies = []

        def delivered(error, _message, sent):
            if error is None:
                latencies.append(time.monotonic() - sent)

        interval = 1.0 / self.rate
        next_send = time.monotonic()
        while not until():
            now = time.monotonic()
            if now >= next_send:
                self.producer.produce(PROBE, b"x" * 100, key=b"probe",
                                      on_delivery=lambda e, m, s=now: delivered(e, m, s))
                next_send += interval
            self.producer.poll(min(interval, max(0.0, next_send - time.monotonic())))
        self.producer.flush(60)
        return summary(latencies)


def summary(latencies):
    if not latencies:
        return "no deliveries"
    s = sorted(latencies)
    pick = lambda q: s[min(len(s) - 1, int(q * len(s)))] * 1000  # noqa: E731
    return f"n={len(s)} p50={pick(0.50):.1f} ms p99={pick(0.99):.1f} ms max={s[-1] * 1000:.1f} ms"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strata", required=True)
    parser.add_argument("--storage", help="storage URL (default: a fresh local directory)")
    parser.add_argument("--mb", type=int, default=256, help="MiB of updates to clean")
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--value-bytes", type=int, default=200)
    parser.add_argument("--map", default=None, help="cleaner_dedupe_buffer_bytes (default: the broker's)")
    parser.add_argument("--io-limit", default=None, help="cleaner_io_max_bytes_per_second")
    parser.add_argument("--probe-rate", type=int, default=200)
    parser.add_argument("--probe-seconds", type=float, default=15)
    args = parser.parse_args()

    data = tempfile.mkdtemp(prefix="strata-cleaner-bench-")
    storage = args.storage or f"file://{data}/store"
    config = os.path.join(data, "strata.toml")
    with open(config, "w") as f:
        f.write('[log]\nsegment_interval = "1s"\nsegment_bytes = "16MiB"\n')
        if args.map:
            f.write(f'cleaner_dedupe_buffer_bytes = "{args.map}"\n')
        if args.io_limit:
            f.write(f'cleaner_io_max_bytes_per_second = "{args.io_limit}"\n')
    broker = Broker(args.strata, storage, config)
    try:
        run(args, broker, storage)
    finally:
        broker.kill()
        shutil.rmtree(data, ignore_errors=True)


def run(args, broker, storage):
    broker.start()
    bootstrap = f"127.0.0.1:{broker.port}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    # A low dirty ratio, so that with a map smaller than the key set every pass is followed
    # by the next until the end (at Kafka's 0.5 the cleaner rightly stops once the part left
    # dirty is under half the partition, and the dirty ratio never reaches 0).
    held = {"cleanup.policy": "compact", "min.compaction.lag.ms": "86400000",
            "min.cleanable.dirty.ratio": "0.01"}
    for f in admin.create_topics([NewTopic(TOPIC, 1, 1, config=held), NewTopic(PROBE, 1, 1)]).values():
        f.result(60)

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20,
                         "queue.buffering.max.kbytes": 1 << 20})
    value = b"v" * args.value_bytes
    record = len(value) + 16
    count = args.mb * (1 << 20) // record
    started = time.monotonic()
    for i in range(count):
        while True:
            try:
                producer.produce(TOPIC, value, key=b"key-%08d" % (i % args.keys), partition=0)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(600):
        sys.exit("produce did not finish")
    produced = time.monotonic() - started
    # The cleaner only cleans segments: wait until the partition has some (its dirty ratio is
    # reported and 1), then give the rest of the tail a few segment intervals (benchmark
    # pacing, not synchronisation: a segment sealed later is cleaned by a later pass and
    # counted in the time and the pass count).
    series = f'strata_log_dirty_ratio{{topic="{TOPIC}",partition="0"}}'
    while broker.metric(series) != 1.0:
        time.sleep(0.1)
    time.sleep(5)
    print(f"storage {storage.split('?')[0]}; {count:,} updates over {args.keys:,} keys "
          f"({args.value_bytes} B values, {count * (args.value_bytes + 12) / (1 << 20):.0f} MiB of keys and "
          f"values) produced in {produced:.1f} s")

    idle = Probe(bootstrap, args.probe_rate)
    probe_end = time.monotonic() + args.probe_seconds
    print(f"produce latency, cleaner idle:    {idle.run(lambda: time.monotonic() >= probe_end)}")

    read0 = broker.metric("strata_cleaner_bytes_read_total") or 0
    written0 = broker.metric("strata_cleaner_bytes_written_total") or 0
    passes0 = broker.metric("strata_cleaner_passes_total") or 0
    rss0 = broker.rss()
    peak = [rss0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], broker.rss())
            time.sleep(0.02)

    def watch():
        while not done.is_set():
            finished = (broker.metric("strata_cleaner_passes_total") or 0) > passes0
            if finished and broker.metric(series) == 0.0:
                done.set()
                return
            time.sleep(0.1)

    threading.Thread(target=sample, daemon=True).start()
    resource = ConfigResource(ResourceType.TOPIC, TOPIC, incremental_configs=[
        ConfigEntry("min.compaction.lag.ms", "0", incremental_operation=AlterConfigOpType.SET)])
    cleaning_started = time.monotonic()
    for f in admin.incremental_alter_configs([resource]).values():
        f.result(60)
    threading.Thread(target=watch, daemon=True).start()
    busy = Probe(bootstrap, args.probe_rate)
    latency = busy.run(done.is_set)
    elapsed = time.monotonic() - cleaning_started
    read = broker.metric("strata_cleaner_bytes_read_total") - read0
    written = broker.metric("strata_cleaner_bytes_written_total") - written0
    passes = broker.metric("strata_cleaner_passes_total") - passes0
    print(f"produce latency, cleaner running: {latency}")
    if os.environ.get("CLEANER_BENCH_DEBUG"):
        text = urllib.request.urlopen(f"http://{broker.metrics}/metrics", timeout=10).read().decode()
        print("\n".join(l for l in text.splitlines() if "clean" in l or "dirty" in l))
        print("\n".join(l for l in broker.lines if "clean" in l)[-3000:])
    mib = 1 << 20
    # A pass reads its dirty segments twice (map, then filter); with a map holding every key
    # one pass covers the partition, so its input is half of what it read.
    source = read / 2 if passes == 1 else read
    print(f"cleaned in {elapsed:.1f} s: {passes:.0f} passes read {read / mib:.1f} MiB, wrote "
          f"{written / mib:.2f} MiB; input {source / mib:.1f} MiB "
          f"({'segment bytes' if passes == 1 else 'bytes read, several passes'}): "
          f"{source / mib / elapsed:.1f} MiB/s of input")
    print(f"RSS {rss0 / mib:.0f} MiB before, peak {peak[0] / mib:.0f} MiB while cleaning "
          f"(+{(peak[0] - rss0) / mib:.0f} MiB)")


if __name__ == "__main__":
    main()

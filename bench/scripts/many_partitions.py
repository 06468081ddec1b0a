#!/usr/bin/env python3
"""Many partitions (issue 19, item 2): what a broker costs per partition, and how long a
cluster takes to start and to take thousands of partitions over. Prints one table.

Phases, each against freshly spawned `strata serve` processes on a fresh file:// directory:

  single   one broker (not a cluster), one topic of --partitions partitions: RSS before the
           topic, after creating it (idle partitions), after producing --per-partition records
           to every partition at --rate records/s and consuming them all (touched partitions);
           idle CPU and storage requests/s (from the broker's /metrics) over --idle seconds;
           Metadata latency for all topics (librdkafka, --metadata-samples samples); start-up
           time (SIGTERM, restart, until Metadata shows every partition with a leader).
  takeover --brokers (default 2) cluster brokers, a topic of --partitions x brokers partitions
           (so each owns about --partitions), records to every partition, SIGKILL one owner,
           time until Metadata shows every partition led by a survivor. The lease period is
           part of that time (a dead owner is only known dead when its lease lapses).
  drain    --brokers cluster brokers as for takeover, then `strata broker drain` of the last one: time
           until Metadata shows every partition led by another broker, and the storage
           requests the receiving broker (broker 1) sent during the drain, by area (what the
           move watch costs while it awaits the drained partitions' handovers).

Python client: confluent-kafka (librdkafka). Example (release build):

    python3 bench/scripts/many_partitions.py --strata target/release/strata \\
        --partitions 10000 --phases single,takeover
"""

import argparse
import datetime
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def storage_requests(metrics_port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    total, by_area = 0.0, {}
    for line in text.splitlines():
        m = re.match(r'strata_storage_requests_total\{[^}]*\} (\S+)', line)
        if m:
            total += float(m.group(1))
        m = re.match(r'strata_storage_requests_by_area_total\{.*area="([^"]+)",op="([^"]+)"\} (\S+)', line)
        if m:
            key = f"{m.group(1)}/{m.group(2)}"
            by_area[key] = by_area.get(key, 0.0) + float(m.group(3))
    return total, by_area


class Broker:
    def __init__(self, args, storage, node_id=None, logdir=None, env=None):
        self.args, self.storage, self.node_id = args, storage, node_id
        self.port, self.metrics_port = free_port(), free_port()
        self.log = os.path.join(logdir, f"broker-{node_id or 0}.log")
        self.env = env or {}
        self.proc = None

    def start(self):
        cmd = [self.args.strata, "serve", "--storage", self.storage,
               "--listen", f"127.0.0.1:{self.port}",
               "--metrics-listen", f"127.0.0.1:{self.metrics_port}"]
        if self.node_id is not None:
            cmd += ["--cluster", "true", "--node-id", str(self.node_id)]
        env = dict(os.environ, **self.env)
        env.setdefault("RUST_LOG", "info")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=open(self.log, "a"), stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"broker exited, see {self.log}")
            try:
                storage_requests(self.metrics_port)
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise SystemExit(f"broker did not start, see {self.log}")

    @property
    def bootstrap(self):
        return f"127.0.0.1:{self.port}"

    def stop(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def leaders(bootstrap, topic, timeout=30):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    md = admin.list_topics(topic, timeout=timeout)
    t = md.topics.get(topic)
    if t is None or t.error is not None:
        return {}
    return {p: pm.leader for p, pm in t.partitions.items() if pm.error is None and pm.leader >= 0}


def wait_all_led(bootstrap, topic, n, deadline_s, exclude=None, poll=0.1):
    """Waits until Metadata shows all n partitions with a leader (not `exclude`)."""
    deadline = time.monotonic() + deadline_s
    last = {}
    while time.monotonic() < deadline:
        try:
            last = leaders(bootstrap, topic, timeout=10)
        except Exception:
            last = {}
        ok = [p for p, l in last.items() if l != exclude]
        if len(ok) == n:
            return last
        time.sleep(poll)
    raise SystemExit(f"only {len([1 for l in last.values() if l != exclude])}/{n} partitions led in time")


def create_topic(bootstrap, topic, n):
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 300000})
    try:
        admin.create_topics([NewTopic(topic, n, 1)], request_timeout=290, operation_timeout=290)[topic].result(600)
    except Exception as e:  # created, but not every partition led within the request's time
        if "was created" not in str(e):
            raise


def produce_all(bootstrap, topic, n, per_partition, rate):
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all",
                  "queue.buffering.max.messages": 1000000})
    value = b"x" * 100
    total = n * per_partition
    failed = []
    start = time.monotonic()
    for i in range(total):
        due = start + i / rate
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        while True:
            try:
                p.produce(topic, value=value, partition=i % n,
                          on_delivery=lambda err, _m: err and failed.append(err))
                break
            except BufferError:
                p.poll(0.01)
        if i % 1000 == 0:
            p.poll(0)
    p.flush(120)
    if failed:
        raise SystemExit(f"{len(failed)} records failed, e.g. {failed[0]}")
    return total, time.monotonic() - start


def consume_all(bootstrap, topic, n, expected):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-reader",
                  "enable.auto.commit": False, "fetch.queue.backoff.ms": 10})
    c.assign([TopicPartition(topic, p, 0) for p in range(n)])
    got, start = 0, time.monotonic()
    deadline = start + 300
    while got < expected and time.monotonic() < deadline:
        for m in c.consume(10000, 1.0):
            if m.error() is None:
                got += 1
    took = time.monotonic() - start
    c.close()
    if got < expected:
        raise SystemExit(f"consumed {got}/{expected}")
    return got, took


def metadata_latency(bootstrap, samples):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.list_topics(timeout=60)
    took = []
    for _ in range(samples):
        t = time.monotonic()
        md = admin.list_topics(timeout=60)
        took.append(time.monotonic() - t)
    parts = sum(len(t.partitions) for t in md.topics.values())
    return statistics.median(took), max(took), parts


def idle(broker, seconds):
    c0, (s0, a0) = cpu_seconds(broker.proc.pid), storage_requests(broker.metrics_port)
    time.sleep(seconds)  # the measurement window itself, not a synchronisation
    c1, (s1, a1) = cpu_seconds(broker.proc.pid), storage_requests(broker.metrics_port)
    areas = {k: (v - a0.get(k, 0.0)) / seconds for k, v in a1.items() if v - a0.get(k, 0.0) > 0}
    return (c1 - c0) / seconds * 100, (s1 - s0) / seconds, areas


def fmt_areas(areas, n=4):
    top = sorted(areas.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{k} {v:.1f}" for k, v in top)


def wait_log_sum(log, skip, marker, field, target, deadline):
    """Waits until the `field=N` values on `log`'s lines (after the first `skip`) that contain
    `marker` add up to `target`, or `deadline` passes; returns the sum and the lines read.
    Reads only what was appended since the last look: a takeover logs megabytes, and reading
    them all again every 50 ms took CPU from the broker being measured."""
    total, lines, partial = 0, [], ""
    with open(log, errors="replace") as f:
        for _ in range(skip):
            f.readline()
        while True:
            chunk = partial + f.read()
            complete = chunk.split("\n")
            partial = complete.pop()
            for line in complete:
                lines.append(line + "\n")
                if marker in line:
                    total += sum(int(m) for m in re.findall(rf"{field}=(\d+)", line))
            if total >= target or time.monotonic() >= deadline:
                return total, lines
            time.sleep(0.05)


TIMELINE = [("left", "broker left the view"), ("dead", "owner is dead; sealing"), ("sealed", "stream sealed"),
            ("claimed", ": claimed "), ("acquire", "took partitions over")]


def timeline(lines, since):
    """When the survivor's log lines of each takeover step came, in seconds after `since`
    (wall clock): the first and the last line of each kind."""
    seen = {}
    for line in lines:
        for name, marker in TIMELINE:
            if marker in line:
                try:
                    at = datetime.datetime.fromisoformat(line.split()[0].replace("Z", "+00:00")).timestamp()
                except ValueError:
                    continue
                first, _ = seen.get(name, (at, at))
                seen[name] = (first, at)
    return " ".join(f"{name} {seen[name][0] - since:.2f}/{seen[name][1] - since:.2f}"
                    for name, _ in TIMELINE if name in seen)


def took_over_line(log, skip=0):
    """The 'took partitions over' phase lines after the first `skip` lines, summed per phase."""
    phases = {}
    count = 0
    with open(log, errors="replace") as f:
        for line in f.readlines()[skip:]:
            if "took partitions over" in line:
                count += 1
                for name, ms in re.findall(r"(\w+)=([\d.]+)ms", line):
                    phases[name] = phases.get(name, 0.0) + float(ms)
    return count, phases


def single(args, rows, workdir):
    n = args.partitions
    data = tempfile.mkdtemp(prefix="single-", dir=workdir)
    b = Broker(args, f"file://{data}", logdir=workdir)
    b.start()
    try:
        topic = f"many-{n}"
        time.sleep(args.settle)  # let the broker's start-up work finish before the baseline
        base = rss_kib(b.proc.pid)
        t = time.monotonic()
        create_topic(b.bootstrap, topic, n)
        wait_all_led(b.bootstrap, topic, n, 300)
        rows.append(("single", "create topic, all partitions led", f"{time.monotonic() - t:.2f} s", f"{n} partitions"))
        time.sleep(args.settle)
        idle_rss = rss_kib(b.proc.pid)
        rows.append(("single", "RSS: before topic / idle partitions",
                     f"{base / 1024:.0f} / {idle_rss / 1024:.0f} MiB",
                     f"{(idle_rss - base) * 1024 / n:,.0f} B per idle partition"))
        cpu, req, areas = idle(b, args.idle)
        rows.append(("single", "idle CPU, storage requests", f"{cpu:.1f}% / {req:.1f}/s", fmt_areas(areas)))
        med, mx, parts = metadata_latency(b.bootstrap, args.metadata_samples)
        rows.append(("single", "Metadata (all topics)", f"p50 {med * 1e3:.1f} ms, max {mx * 1e3:.1f} ms", f"{parts} partitions in answer"))
        total, took = produce_all(b.bootstrap, topic, n, args.per_partition, args.rate)
        rows.append(("single", "produce to every partition", f"{total / took:,.0f} rec/s", f"{total} records, {took:.1f} s"))
        got, took = consume_all(b.bootstrap, topic, n, total)
        rows.append(("single", "consume every partition", f"{got / took:,.0f} rec/s", f"{got} records, {took:.1f} s"))
        touched = rss_kib(b.proc.pid)
        rows.append(("single", "RSS touched (cache holds the records)", f"{touched / 1024:.0f} MiB",
                     f"{(touched - base) * 1024 / n:,.0f} B per partition"))
        time.sleep(args.settle)
        cpu, req, areas = idle(b, args.idle)
        rows.append(("single", "idle CPU, storage requests (after)", f"{cpu:.1f}% / {req:.1f}/s", fmt_areas(areas)))
        b.stop()
        t = time.monotonic()
        b.start()
        listening = time.monotonic() - t
        wait_all_led(b.bootstrap, topic, n, 300, poll=0.05)
        rows.append(("single", "start-up: listening / all led", f"{listening:.2f} / {time.monotonic() - t:.2f} s", "after SIGTERM"))
        count, phases = took_over_line(b.log)
        rows.append(("single", "start-up takeover phases (log)", " ".join(f"{k}={v:.0f}ms" for k, v in phases.items()), f"{count} lines"))
    finally:
        b.stop()
        if not args.keep:
            shutil.rmtree(data, ignore_errors=True)


def start_cluster(brokers, n):
    """Starts `brokers`, creates a topic of n partitions and waits until every partition is
    led and every broker leads some (placement settles as brokers join). Returns the topic
    and its leaders."""
    for b in brokers:
        b.start()
    topic = f"many-{n}"
    create_topic(brokers[0].bootstrap, topic, n)
    led = wait_all_led(brokers[0].bootstrap, topic, n, 600)
    deadline = time.monotonic() + 300
    while len(set(led.values())) < len(brokers) and time.monotonic() < deadline:
        time.sleep(0.5)
        led = wait_all_led(brokers[0].bootstrap, topic, n, 600)
    return topic, led


def start_profile(args, broker):
    """With --profile, samples the broker's stacks (DWARF unwinding: release builds keep no
    frame pointers) while it takes over. Started before the kill, and waited on until it has
    attached, so the profile covers the takeover from its first step."""
    if not args.profile:
        return None
    perf = subprocess.Popen(["perf", "record", "-F", "199", "--call-graph", "dwarf,16384",
                             "-p", str(broker.proc.pid), "-o", args.profile, "--",
                             "sleep", str(args.profile_seconds)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # perf prints nothing on attaching; a second is ample for it to open its events.
    time.sleep(1)
    return perf


def takeover(args, rows, workdir):
    nb = args.brokers
    n = args.partitions * nb
    data = tempfile.mkdtemp(prefix="takeover-", dir=workdir)
    brokers = [Broker(args, f"file://{data}", node_id=i + 1, logdir=workdir) for i in range(nb)]
    try:
        t = time.monotonic()
        topic, led = start_cluster(brokers, n)
        rows.append((f"{nb} brokers", "create topic, all led", f"{time.monotonic() - t:.2f} s", f"{n} partitions"))
        time.sleep(args.settle)
        owned = {b.node_id: sum(1 for l in led.values() if l == b.node_id) for b in brokers}
        rss = [rss_kib(b.proc.pid) for b in brokers]
        rows.append((f"{nb} brokers", "RSS per broker (idle)", " / ".join(f"{r / 1024:.0f}" for r in rss) + " MiB",
                     "owned " + " / ".join(str(owned[b.node_id]) for b in brokers)))
        cpu, req, areas = idle(brokers[0], args.idle)
        rows.append((f"{nb} brokers", "broker 1 idle CPU, storage req", f"{cpu:.1f}% / {req:.1f}/s", fmt_areas(areas)))
        med, mx, parts = metadata_latency(brokers[0].bootstrap, args.metadata_samples)
        rows.append((f"{nb} brokers", "Metadata (all topics)", f"p50 {med * 1e3:.1f} ms, max {mx * 1e3:.1f} ms", f"{parts} partitions"))
        total, took = produce_all(brokers[0].bootstrap, topic, n, args.per_partition, args.rate)
        rows.append((f"{nb} brokers", "produce to every partition", f"{total / took:,.0f} rec/s", f"{total} records"))
        victim = brokers[-1]
        survivor = brokers[0]
        moved = owned[victim.node_id]
        lines_before = sum(1 for _ in open(survivor.log, errors="replace"))
        perf = start_profile(args, survivor)
        t = time.monotonic()
        killed_at = time.time()
        victim.stop(signal.SIGKILL)
        # The log serves a partition when its acquire returns ("took partitions over" lines,
        # summed), and Metadata names no leader for a partition its owner does not serve yet.
        # So watch the survivor's log first and ask Metadata only once it has acquired as many
        # as it lost: a Metadata of 20,000 partitions every 50 ms through the takeover costs
        # the client and the survivor a good part of a 2-core machine, and slowed what it
        # measured.
        deadline = time.monotonic() + 600
        served, lines = wait_log_sum(survivor.log, lines_before, "took partitions over",
                                     "partitions", moved, deadline)
        rows.append((f"{nb} brokers", "takeover after SIGKILL (all served)", f"{time.monotonic() - t:.2f} s",
                     f"{served} partitions acquired by the log"))
        wait_all_led(survivor.bootstrap, topic, n, 600, exclude=victim.node_id, poll=0.05)
        took = time.monotonic() - t
        lease = args.lease
        rows.append((f"{nb} brokers", "takeover after SIGKILL (all led)", f"{took:.2f} s",
                     f"{moved} partitions; includes the {lease} lease"))
        # Replayed tails are compacted behind serving ("compacted replayed tails" lines).
        # The acquires log how many they queued (replayed=N).
        queued = sum(int(m) for line in lines if "took partitions over" in line
                     for m in re.findall(r"replayed=(\d+)", line))
        compacted, lines = wait_log_sum(survivor.log, lines_before, "compacted replayed tails",
                                    "partitions", queued, deadline)
        rows.append((f"{nb} brokers", "replayed tails compacted (background)", f"{time.monotonic() - t:.2f} s",
                     f"{compacted} of {queued} queued"))
        count, phases = took_over_line(survivor.log, skip=lines_before)
        rows.append((f"{nb} brokers", "survivor's takeover phases (log)",
                     " ".join(f"{k}={v:.0f}ms" for k, v in phases.items()), f"{count} acquire calls"))
        rows.append((f"{nb} brokers", "timeline after SIGKILL (survivor's log)",
                     timeline(lines, killed_at), "first / last line of each kind, seconds"))
        if perf is not None:
            perf.wait()
            rows.append((f"{nb} brokers", "profile of the survivor", args.profile,
                         f"{args.profile_seconds:.0f} s from the SIGKILL; `perf report -i {args.profile}`"))
        got, ctook = consume_all(survivor.bootstrap, topic, n, total)
        rows.append((f"{nb} brokers", "consume all after takeover", f"{got / ctook:,.0f} rec/s", f"{got} records"))
    finally:
        for b in brokers:
            b.stop()
        if not args.keep:
            shutil.rmtree(data, ignore_errors=True)


def drain(args, rows, workdir):
    nb = args.brokers
    n = args.partitions * nb
    data = tempfile.mkdtemp(prefix="drain-", dir=workdir)
    brokers = [Broker(args, f"file://{data}", node_id=i + 1, logdir=workdir) for i in range(nb)]
    try:
        topic, led = start_cluster(brokers, n)
        total, _ = produce_all(brokers[0].bootstrap, topic, n, args.per_partition, args.rate)
        time.sleep(args.settle)  # let the produce's compaction settle before the baseline
        victim, receiver = brokers[-1], brokers[0]
        # Placement may still have been settling when the topic was first all led.
        led = wait_all_led(receiver.bootstrap, topic, n, 600)
        moved = sum(1 for l in led.values() if l == victim.node_id)
        c0, (s0, a0) = cpu_seconds(receiver.proc.pid), storage_requests(receiver.metrics_port)
        t = time.monotonic()
        subprocess.run([args.strata, "broker", "drain", str(victim.node_id), "--storage", f"file://{data}"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        released = time.monotonic() - t
        wait_all_led(receiver.bootstrap, topic, n, 600, exclude=victim.node_id, poll=0.05)
        took = time.monotonic() - t
        c1, (s1, a1) = cpu_seconds(receiver.proc.pid), storage_requests(receiver.metrics_port)
        areas = {k: v - a0.get(k, 0.0) for k, v in a1.items() if v - a0.get(k, 0.0) > 0}
        rows.append((f"{nb} brokers", "drain: released / all led elsewhere", f"{released:.2f} / {took:.2f} s",
                     f"{moved} partitions"))
        rows.append((f"{nb} brokers", "receiver's storage requests in the drain",
                     f"{s1 - s0:.0f} ({(s1 - s0) / took:.0f}/s), CPU {(c1 - c0) / took * 100:.0f}%",
                     "requests by area: " + fmt_areas(areas, 8)))
        time.sleep(args.settle)
        cpu, req, areas = idle(receiver, args.idle)
        rows.append((f"{nb} brokers", "receiver idle after the drain", f"{cpu:.1f}% / {req:.1f}/s", fmt_areas(areas)))
        got, ctook = consume_all(receiver.bootstrap, topic, n, total)
        rows.append((f"{nb} brokers", "consume all after the drain", f"{got / ctook:,.0f} rec/s", f"{got} records"))
    finally:
        for b in brokers:
            b.stop()
        if not args.keep:
            shutil.rmtree(data, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strata", default="target/release/strata")
    ap.add_argument("--partitions", type=int, default=10000)
    ap.add_argument("--brokers", type=int, default=2)
    ap.add_argument("--per-partition", type=int, default=2)
    ap.add_argument("--rate", type=float, default=5000)
    ap.add_argument("--idle", type=float, default=10)
    ap.add_argument("--settle", type=float, default=5)
    ap.add_argument("--metadata-samples", type=int, default=10)
    ap.add_argument("--lease", default="5 s (default lease_period)", help="label only: the lease the brokers run with")
    ap.add_argument("--phases", default="single,takeover")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--profile", default=None, metavar="FILE",
                    help="takeover: `perf record` the survivor from the SIGKILL for --profile-seconds into FILE")
    ap.add_argument("--profile-seconds", type=float, default=20)
    args = ap.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="many-partitions-")
    os.makedirs(workdir, exist_ok=True)
    rows = []
    print(f"strata={args.strata} cpus={os.cpu_count()} load={os.getloadavg()[0]:.2f} logs={workdir}", flush=True)
    try:
        for phase in args.phases.split(","):
            {"single": single, "takeover": takeover, "drain": drain}[phase](args, rows, workdir)
    finally:
        print(f"load after={os.getloadavg()[0]:.2f}")
        w = [max(len(r[i]) for r in rows) if rows else 0 for i in range(4)]
        for r in rows:
            print(" | ".join(c.ljust(w[i]) for i, c in enumerate(r)), flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Many connections (issue 19, item 3): broker memory per connection, and produce/fetch latency
of active connections while thousands of others stay open and idle. Prints one table.

Spawns one `strata serve` on a fresh file:// directory with `max_connections` and
`max_connections_per_ip` raised (the defaults, 4096 and 1024, would hold the extra connections
in the listen backlog / close them), creates a topic of --partitions partitions, then:

  1. opens --idle connections, each sending one ApiVersions (v0) and reading the answer, so the
     broker has read from every socket; RSS before/after -> bytes per idle connection;
  2. with those still open, opens --active connections that each loop: Produce v3 (acks=-1, one
     100-byte record in a v2 batch) to partition i mod P, then Fetch v4 at the offset the
     Produce returned; paced at --rate round trips per second per connection, for --duration
     seconds. Reports Produce and Fetch latency percentiles (request written -> answer read).

The client is raw asyncio (one Python process, one thread): at high rates its own scheduling
shows in the latency, so compare runs at the same rate, and see the bench CPU column.

    python3 bench/scripts/many_connections.py --strata target/release/strata \\
        --idle 10000 --active 1000 --rate 1 --duration 30
"""

import argparse
import asyncio
import os
import random
import resource
import shutil
import socket
import struct
import subprocess
import tempfile
import time

from confluent_kafka.admin import AdminClient, NewTopic

CLK_TCK = os.sysconf("SC_CLK_TCK")


def crc32c(data):
    table = crc32c.table
    crc = 0xFFFFFFFF
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


crc32c.table = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    crc32c.table.append(c)


def varint(n):
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def record_batch(value):
    now = int(time.time() * 1000)
    body = b"\x00" + varint(0) + varint(0) + varint(-1) + varint(len(value)) + value + varint(0)
    record = varint(len(body)) + body
    after_crc = struct.pack(">hiqqqhii", 0, 0, now, now, -1, -1, -1, 1) + record
    crc = crc32c(after_crc)
    rest = struct.pack(">ibI", -1, 2, crc) + after_crc
    return struct.pack(">qi", 0, len(rest)) + rest


def kstr(s):
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def request(api_key, version, corr, body):
    msg = struct.pack(">hhi", api_key, version, corr) + kstr("conn-bench") + body
    return struct.pack(">i", len(msg)) + msg


async def roundtrip(reader, writer, frame):
    writer.write(frame)
    await writer.drain()
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    return await reader.readexactly(size)


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


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


async def open_idle(port, n, conns):
    frame = request(18, 0, 1, b"")
    sem = asyncio.Semaphore(200)

    async def one():
        async with sem:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            await roundtrip(r, w, frame)
            conns.append((r, w))

    await asyncio.gather(*(one() for _ in range(n)))


async def active(port, idx, args, topic, batch, stats, stop_at):
    r, w = await asyncio.open_connection("127.0.0.1", port)
    partition = idx % args.partitions
    corr = 0
    period = 1.0 / args.rate
    next_at = time.monotonic() + random.random() * period
    while True:
        now = time.monotonic()
        if now >= stop_at:
            break
        if next_at > now:
            await asyncio.sleep(next_at - now)
        next_at += period
        corr += 1
        body = (struct.pack(">hhi", -1, -1, 30000) + struct.pack(">i", 1) + kstr(topic)
                + struct.pack(">iii", 1, partition, len(batch)) + batch)
        t = time.perf_counter()
        resp = await roundtrip(r, w, request(0, 3, corr, body))
        stats["produce"].append(time.perf_counter() - t)
        # correlation, 1 topic, name, 1 partition, index, error, base offset
        off = 4 + 4
        (nlen,) = struct.unpack_from(">h", resp, off)
        off += 2 + nlen + 4
        _, err, base = struct.unpack_from(">ihq", resp, off)
        if err != 0:
            stats["errors"] += 1
            continue
        corr += 1
        body = (struct.pack(">iiiib", -1, 500, 1, 1 << 20, 0) + struct.pack(">i", 1) + kstr(topic)
                + struct.pack(">iiqi", 1, partition, base, 1 << 20))
        t = time.perf_counter()
        resp = await roundtrip(r, w, request(1, 4, corr, body))
        stats["fetch"].append(time.perf_counter() - t)
        off = 4 + 4 + 4
        (nlen,) = struct.unpack_from(">h", resp, off)
        off += 2 + nlen + 4
        _, err = struct.unpack_from(">ih", resp, off)
        if err != 0:
            stats["errors"] += 1
    w.close()


async def run(args, broker, port):
    rows = []
    pid = broker.pid
    base = rss_kib(pid)
    idle_conns = []
    t = time.monotonic()
    await open_idle(port, args.idle, idle_conns)
    opened = time.monotonic() - t
    await asyncio.sleep(args.settle)  # a measurement pause, not a synchronisation
    with_idle = rss_kib(pid)
    rows.append(("idle connections open", f"{len(idle_conns)} in {opened:.1f} s",
                 f"RSS {base / 1024:.0f} -> {with_idle / 1024:.0f} MiB, "
                 f"{(with_idle - base) * 1024 / max(1, len(idle_conns)):,.0f} B per connection"))
    c0 = cpu_seconds(pid)
    await asyncio.sleep(args.settle)
    rows.append(("idle CPU with them open", f"{(cpu_seconds(pid) - c0) / args.settle * 100:.1f}%", ""))
    topic = args.topic
    batch = record_batch(b"x" * 100)
    stats = {"produce": [], "fetch": [], "errors": 0}
    stop_at = time.monotonic() + args.duration
    c0, b0, t0 = cpu_seconds(pid), cpu_seconds(os.getpid()), time.monotonic()
    tasks = [asyncio.create_task(active(port, i, args, topic, batch, stats, stop_at)) for i in range(args.active)]
    mid_rss = 0
    while not all(t.done() for t in tasks):
        await asyncio.sleep(0.5)
        mid_rss = max(mid_rss, rss_kib(pid))
    for t in tasks:
        t.result()
    el = time.monotonic() - t0
    bcpu = (cpu_seconds(pid) - c0) / el * 100
    ccpu = (cpu_seconds(os.getpid()) - b0) / el * 100
    for name in ("produce", "fetch"):
        xs = stats[name]
        rows.append((f"{name} latency ({args.active} active)",
                     f"p50 {pct(xs, 50) * 1e3:.2f} / p99 {pct(xs, 99) * 1e3:.2f} / max {max(xs) * 1e3:.1f} ms",
                     f"{len(xs)} requests, {len(xs) / el:,.0f}/s"))
    rows.append(("during the active phase", f"broker CPU {bcpu:.0f}%, bench CPU {ccpu:.0f}%",
                 f"peak RSS {mid_rss / 1024:.0f} MiB, errors {stats['errors']}"))
    for _, w in idle_conns:
        w.close()
    return rows


def raise_nofile():
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strata", default="target/release/strata")
    ap.add_argument("--idle", type=int, default=10000)
    ap.add_argument("--active", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=100)
    ap.add_argument("--rate", type=float, default=1.0, help="round trips per second per active connection")
    ap.add_argument("--duration", type=float, default=30)
    ap.add_argument("--settle", type=float, default=3)
    ap.add_argument("--topic", default="conn-bench")
    args = ap.parse_args()
    raise_nofile()
    need = args.idle + args.active + 100
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < need:
        raise SystemExit(f"RLIMIT_NOFILE hard limit {hard} < {need}")
    data = tempfile.mkdtemp(prefix="conn-bench-")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, STRATA_MAX_CONNECTIONS=str(need), STRATA_MAX_CONNECTIONS_PER_IP=str(need))
    log = open(os.path.join(data, "broker.log"), "w")
    broker = subprocess.Popen([args.strata, "serve", "--storage", f"file://{data}/store",
                               "--listen", f"127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT,
                              env=env, preexec_fn=raise_nofile)
    print(f"strata={args.strata} cpus={os.cpu_count()} load={os.getloadavg()[0]:.2f} "
          f"idle={args.idle} active={args.active} rate={args.rate}/s/conn", flush=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or broker.poll() is not None:
                    raise SystemExit("broker did not start")
                time.sleep(0.05)
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
        admin.create_topics([NewTopic(args.topic, args.partitions, 1)])[args.topic].result(60)
        del admin
        rows = asyncio.run(run(args, broker, port))
        print(f"load after={os.getloadavg()[0]:.2f}")
        w = [max(len(r[i]) for r in rows) for i in range(3)]
        for r in rows:
            print(" | ".join(c.ljust(w[i]) for i, c in enumerate(r)), flush=True)
    finally:
        broker.terminate()
        broker.wait(60)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Security's cost (issue 13): produce and consume throughput and end-to-end latency over
SASL_SSL (SCRAM-SHA-512, TLS) against PLAINTEXT on the same broker, and how many connections a
second a client sets up with SCRAM, with and without TLS. Prints one table per measure.

Starts one `strata serve` on a fresh file:// directory with three listeners — PLAINTEXT,
SASL_PLAINTEXT and SASL_SSL, on consecutive ports from --port — and a certificate for 127.0.0.1
signed by a throw-away CA (made with the `openssl` command), after creating the SCRAM user with
`strata users create`. Then, for each protocol:

  1. throughput: confluent-kafka produces --records records of --size bytes (linger.ms=5,
     acks=all) to a fresh topic of --partitions partitions as fast as it can (clock from the
     first produce() to the end of flush()), then one consumer, assigned every partition from
     the start (no group), reads them all (clock from assign to the last record);
  2. latency: a producer paced at --rate records/s for --seconds while a consumer in the same
     process reads the topic; each value carries its send time (the process's monotonic clock),
     so receive - send is the end-to-end latency; the first second is left out.

Connection set-up: kafka-python's BrokerConnection, one blocking connect after another for
--connect-seconds per listener: TCP, then (SASL_SSL) the TLS handshake, ApiVersions, then (SASL)
SaslHandshake and the SCRAM-SHA-512 exchange, until the connection is usable; then closed.

    python3 bench/scripts/sasl_ssl.py --strata target/release/strata
"""

import argparse
import os
import shutil
import socket
import statistics
import struct
import subprocess
import tempfile
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

USER, PASSWORD, MECHANISM = "bench", "bench-secret", "SCRAM-SHA-512"


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def certificates(directory):
    """A CA and a server certificate for 127.0.0.1/localhost (EC P-256), as the tests make."""
    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=bench-ca")
    openssl("req", "-new", *ec, "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=127.0.0.1")
    with open(os.path.join(directory, "server.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "server.ext")
    return {name: os.path.join(directory, name) for name in ("ca.pem", "server.pem", "server.key")}


def client_config(protocol, port, ca):
    config = {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": protocol}
    if protocol.startswith("SASL"):
        config.update({"sasl.mechanism": MECHANISM, "sasl.username": USER,
                       "sasl.password": PASSWORD})
    if protocol.endswith("SSL"):
        config["ssl.ca.location"] = ca
    return config


def throughput(args, protocol, port, ca):
    base = client_config(protocol, port, ca)
    topic = f"sec-bench-{protocol.lower()}-{os.getpid()}-{int(time.time() * 1000)}"
    admin = AdminClient(base)  # kept referenced until the topic exists
    admin.create_topics([NewTopic(topic, args.partitions, 1)])[topic].result(60)
    producer = Producer({**base, "linger.ms": 5, "acks": "all"})
    value = b"x" * args.size
    started = time.monotonic()
    for _ in range(args.records):
        while True:
            try:
                producer.produce(topic, value)
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(120) != 0:
        raise SystemExit(f"{protocol}: records left unsent")
    produce_s = time.monotonic() - started
    consumer = Consumer({**base, "group.id": topic, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    started = time.monotonic()
    # Assigned, not subscribed: no group join in the clock, as in the `throughput` benchmark.
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(args.partitions)])
    got = 0
    while got < args.records:
        batch = consumer.consume(10_000, 1.0)
        got += sum(1 for m in batch if m.error() is None)
        if time.monotonic() - started > 300:
            raise SystemExit(f"{protocol}: consumed {got} of {args.records} in 300 s")
    consume_s = time.monotonic() - started
    consumer.close()
    mb = args.records * args.size / 1e6
    return (args.records / produce_s, mb / produce_s, args.records / consume_s, mb / consume_s)


def latency(args, protocol, port, ca):
    base = client_config(protocol, port, ca)
    topic = f"sec-lat-{protocol.lower()}-{os.getpid()}-{int(time.time() * 1000)}"
    admin = AdminClient(base)  # kept referenced until the topic exists
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(60)
    consumer = Consumer({**base, "group.id": topic, "auto.offset.reset": "earliest",
                         "fetch.wait.max.ms": 100})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    producer = Producer({**base, "linger.ms": 0, "acks": "all"})
    latencies = []
    started = time.monotonic()
    total = int(args.rate * args.seconds)
    sent = 0
    while sent < total or len(latencies) < sent * 0.999:
        now = time.monotonic()
        while sent < total and now - started >= sent / args.rate:
            producer.produce(topic, struct.pack(">d", time.monotonic()) + b"x" * (args.size - 8))
            sent += 1
        producer.poll(0)
        for m in consumer.consume(1000, 0.001):
            if m.error() is None:
                (sent_at,) = struct.unpack(">d", m.value()[:8])
                latencies.append((sent_at - started, time.monotonic() - sent_at))
        if now - started > args.seconds + 60:
            raise SystemExit(f"{protocol}: {len(latencies)} of {sent} records back after 60 s")
    producer.flush(30)
    consumer.close()
    kept = [lat * 1000 for at, lat in latencies if at >= 1.0]
    return (statistics.median(kept), percentile(kept, 0.99), percentile(kept, 0.999), max(kept))


def connection_rate(args, protocol, port, ca):
    from kafka.conn import BrokerConnection
    import ssl

    config = {"security_protocol": protocol}
    if protocol.startswith("SASL"):
        config.update({"sasl_mechanism": MECHANISM, "sasl_plain_username": USER,
                       "sasl_plain_password": PASSWORD})
    if protocol.endswith("SSL"):
        context = ssl.create_default_context(cafile=ca)
        config["ssl_context"] = context
    count, times = 0, []
    end = time.monotonic() + args.connect_seconds
    while time.monotonic() < end:
        started = time.monotonic()
        connection = BrokerConnection("127.0.0.1", port, socket.AF_INET, **config)
        if not connection.connect_blocking(timeout=10):
            raise SystemExit(f"{protocol}: connection {count} failed")
        times.append(time.monotonic() - started)
        connection.close()
        count += 1
    return (count / args.connect_seconds, statistics.median(times) * 1000,
            percentile(times, 0.99) * 1000)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strata", default="target/release/strata")
    parser.add_argument("--port", type=int, default=19092)
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--connect-seconds", type=float, default=10.0)
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="strata-sec-bench-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}
    try:
        certs = certificates(work)
        storage = f"file://{work}/store"
        subprocess.run([args.strata, "users", "create", "--storage", storage, "--user", USER,
                        "--password", PASSWORD, "--mechanism", MECHANISM],
                       check=True, capture_output=True, env=env)
        ports = {"PLAINTEXT": args.port, "SASL_PLAINTEXT": args.port + 1,
                 "SASL_SSL": args.port + 2}
        listeners = ",".join(f"{p}://127.0.0.1:{port}" for p, port in ports.items())
        log = open(os.path.join(work, "broker.log"), "w")
        broker = subprocess.Popen(
            [args.strata, "serve", "--storage", storage, "--listeners", listeners,
             "--ssl-certificate", certs["server.pem"], "--ssl-key", certs["server.key"]],
            stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    socket.create_connection(("127.0.0.1", ports["SASL_SSL"]), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or broker.poll() is not None:
                        raise SystemExit(f"broker did not start; see {work}/broker.log")
                    time.sleep(0.05)
            print(f"strata={args.strata} cpus={os.cpu_count()} load={os.getloadavg()[0]:.2f} "
                  f"records={args.records} size={args.size} partitions={args.partitions}",
                  flush=True)
            print("\n| protocol | produce rec/s | produce MB/s | consume rec/s | consume MB/s |")
            print("|---|---|---|---|---|")
            for protocol in ("PLAINTEXT", "SASL_SSL"):
                r = throughput(args, protocol, ports[protocol], certs["ca.pem"])
                print(f"| {protocol} | {r[0]:,.0f} | {r[1]:.1f} | {r[2]:,.0f} | {r[3]:.1f} |",
                      flush=True)
            print(f"\n| protocol | e2e p50 ms | p99 ms | p99.9 ms | max ms |  (at {args.rate:.0f}/s)")
            print("|---|---|---|---|---|")
            for protocol in ("PLAINTEXT", "SASL_SSL"):
                r = latency(args, protocol, ports[protocol], certs["ca.pem"])
                print(f"| {protocol} | {r[0]:.1f} | {r[1]:.1f} | {r[2]:.1f} | {r[3]:.1f} |",
                      flush=True)
            print("\n| protocol | connections/s | set-up p50 ms | p99 ms |")
            print("|---|---|---|---|")
            for protocol in ("PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL"):
                r = connection_rate(args, protocol, ports[protocol], certs["ca.pem"])
                print(f"| {protocol} | {r[0]:,.0f} | {r[1]:.1f} | {r[2]:.1f} |", flush=True)
            print(f"load after={os.getloadavg()[0]:.2f}")
        finally:
            broker.terminate()
            broker.wait(60)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

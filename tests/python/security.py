#!/usr/bin/env python3
"""Authentication against a Strata broker with Python's confluent-kafka client.

Commands (all take --bootstrap, --protocol SASL_PLAINTEXT|SASL_SSL|SSL, --mechanism,
--user, --password and, for TLS, --ca; SSL with --cert/--key presents a client certificate):

  round-trip --topic T   produce 20 records and consume them back; exit 0 when all arrive
  refused                connect with these credentials; exit 0 when the client reports an
                         authentication failure (and nothing was produced), 1 otherwise
  login                  exit 0 when these credentials get a Metadata answer (printing the
                         brokers it lists as id=host:port), 1 when refused
  alter-user --new-user U --new-password P
                         create U (SCRAM-SHA-512) with AdminClient.alter_user_scram_credentials,
                         then check describe_user_scram_credentials lists it
  tls-refused            exit 0 when the client gets no Metadata answer and reports a TLS or
                         transport error (a refused client certificate), 1 otherwise
  served-cert            open a TLS connection (Python's ssl module, checked against --ca) and
                         print the SHA-256 of the certificate the broker serves
  hold                   open a TLS connection, send ApiVersions, print `served SHA256`, then
                         on each line of input send ApiVersions again on the same connection
                         and print `answered`; exit 0 at the end of input

Exits 2 when confluent-kafka is not installed. Run by tests/tests/security.rs.
"""

import argparse
import hashlib
import socket
import ssl
import struct
import sys
import time

try:
    from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )
except ImportError as error:  # pragma: no cover - depends on the machine
    print(f"confluent-kafka is not installed ({error}); pip install confluent-kafka", file=sys.stderr)
    sys.exit(2)

DEADLINE_SECONDS = 30.0


def config(args):
    conf = {"bootstrap.servers": args.bootstrap, "security.protocol": args.protocol}
    if args.protocol.startswith("SASL"):
        conf.update(
            {
                "sasl.mechanism": args.mechanism,
                "sasl.username": args.user,
                "sasl.password": args.password,
            }
        )
    if args.protocol in ("SSL", "SASL_SSL"):
        conf["ssl.ca.location"] = args.ca
        # The test certificate names 127.0.0.1 and localhost; check it.
        conf["ssl.endpoint.identification.algorithm"] = "https"
        if args.cert:
            conf["ssl.certificate.location"] = args.cert
            conf["ssl.key.location"] = args.key
    return conf


def round_trip(args):
    errors = []
    producer = Producer({**config(args), "error_cb": errors.append, "linger.ms": 5})
    values = [f"secure record {i}".encode() for i in range(20)]
    delivered = []
    for value in values:
        producer.produce(args.topic, value, partition=0, on_delivery=lambda e, m: delivered.append((e, m)))
    remaining = producer.flush(DEADLINE_SECONDS)
    if remaining or any(e is not None for e, _ in delivered) or len(delivered) != len(values):
        print(f"produce failed: {remaining} left, {delivered[:3]}, errors {errors}", file=sys.stderr)
        return 1
    consumer = Consumer({**config(args), "group.id": "security-test", "enable.auto.commit": False,
                         "error_cb": errors.append})
    consumer.assign([TopicPartition(args.topic, 0, 0)])
    got = []
    deadline = time.monotonic() + DEADLINE_SECONDS
    while len(got) < len(values) and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None:
            continue
        if message.error():
            print(f"consume error {message.error()}", file=sys.stderr)
            return 1
        got.append(message.value())
    consumer.close()
    if got != values:
        print(f"consumed {len(got)} of {len(values)}: {got[:3]}; errors {errors}", file=sys.stderr)
        return 1
    print(f"round trip of {len(values)} records as {args.user or 'certificate'} over {args.protocol}")
    return 0


def refused(args):
    errors = []
    admin = AdminClient({**config(args), "error_cb": errors.append})
    deadline = time.monotonic() + DEADLINE_SECONDS
    listed = None
    while time.monotonic() < deadline and not errors:
        try:
            listed = admin.list_topics(timeout=1)
            break
        except Exception:  # a timeout while the client reports its failure
            # Errors reach error_cb only from poll.
            admin.poll(0.1)
    if listed is not None:
        print("the broker answered Metadata to a client that should have been refused", file=sys.stderr)
        return 1
    authentication = [str(e) for e in errors if e.code() == KafkaError._AUTHENTICATION]
    if authentication:
        print(f"refused: {authentication[0]}")
        return 0
    print(f"no authentication error; errors {errors}", file=sys.stderr)
    return 1


def login(args):
    errors = []
    admin = AdminClient({**config(args), "error_cb": errors.append})
    deadline = time.monotonic() + DEADLINE_SECONDS
    while time.monotonic() < deadline and not errors:
        try:
            metadata = admin.list_topics(timeout=1)
            brokers = " ".join(
                f"{b.id}={b.host}:{b.port}" for b in sorted(metadata.brokers.values(), key=lambda b: b.id)
            )
            print(f"logged in as {args.user}; brokers {brokers}")
            return 0
        except Exception:  # a timeout while the client reports its failure
            admin.poll(0.1)
    print(f"not logged in: {errors}", file=sys.stderr)
    return 1


def alter_user(args):
    admin = AdminClient(config(args))
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
    upsertion = UserScramCredentialUpsertion(args.new_user, info, args.new_password.encode())
    for user, future in admin.alter_user_scram_credentials([upsertion]).items():
        future.result(timeout=DEADLINE_SECONDS)
    described = admin.describe_user_scram_credentials([args.new_user])
    description = described[args.new_user].result(timeout=DEADLINE_SECONDS)
    mechanisms = [c.mechanism for c in description.scram_credential_infos]
    if ScramMechanism.SCRAM_SHA_512 not in mechanisms:
        print(f"described {description}", file=sys.stderr)
        return 1
    print(f"created {args.new_user}: {description}")
    return 0


def tls_refused(args):
    errors = []
    admin = AdminClient({**config(args), "error_cb": errors.append})
    deadline = time.monotonic() + DEADLINE_SECONDS
    while time.monotonic() < deadline and not errors:
        try:
            admin.list_topics(timeout=1)
            print("the broker answered Metadata to a client that should have been refused", file=sys.stderr)
            return 1
        except Exception:  # a timeout while the client reports its failure
            admin.poll(0.1)
    codes = {KafkaError._SSL, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN}
    refusals = [str(e) for e in errors if e.code() in codes]
    if refusals:
        print(f"refused: {refusals[0]}")
        return 0
    print(f"no TLS or transport error; errors {errors}", file=sys.stderr)
    return 1


def tls_socket(args):
    host, port = args.bootstrap.rsplit(":", 1)
    context = ssl.create_default_context(cafile=args.ca)
    if args.cert:
        context.load_cert_chain(args.cert, args.key)
    raw = socket.create_connection((host, int(port)), timeout=DEADLINE_SECONDS)
    return context.wrap_socket(raw, server_hostname=host)


def served_cert(args):
    with tls_socket(args) as connection:
        print(hashlib.sha256(connection.getpeercert(binary_form=True)).hexdigest())
    return 0


def read_exactly(connection, size):
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed by the broker")
        data += chunk
    return data


def api_versions(connection, correlation_id):
    client_id = b"hold"
    body = struct.pack(">hhih", 18, 0, correlation_id, len(client_id)) + client_id
    connection.sendall(struct.pack(">i", len(body)) + body)
    (size,) = struct.unpack(">i", read_exactly(connection, 4))
    response = read_exactly(connection, size)
    got_id, error_code = struct.unpack(">ih", response[:6])
    if got_id != correlation_id or error_code != 0:
        raise RuntimeError(f"ApiVersions answered {got_id} {error_code}")


def hold(args):
    with tls_socket(args) as connection:
        api_versions(connection, 1)
        digest = hashlib.sha256(connection.getpeercert(binary_form=True)).hexdigest()
        print(f"served {digest}", flush=True)
        for i, _ in enumerate(sys.stdin):
            api_versions(connection, i + 2)
            print("answered", flush=True)
    return 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "command",
        choices=["round-trip", "refused", "login", "alter-user", "tls-refused", "served-cert", "hold"],
    )
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--protocol", default="SASL_PLAINTEXT")
    parser.add_argument("--mechanism", default="SCRAM-SHA-512")
    parser.add_argument("--user", default="")
    parser.add_argument("--password", default="")
    parser.add_argument("--ca")
    parser.add_argument("--cert")
    parser.add_argument("--key")
    parser.add_argument("--topic", default="secure")
    parser.add_argument("--new-user")
    parser.add_argument("--new-password")
    args = parser.parse_args()
    handlers = {
        "round-trip": round_trip,
        "refused": refused,
        "login": login,
        "alter-user": alter_user,
        "tls-refused": tls_refused,
        "served-cert": served_cert,
        "hold": hold,
    }
    sys.exit(handlers[args.command](args))


if __name__ == "__main__":
    main()

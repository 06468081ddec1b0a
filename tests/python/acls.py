#!/usr/bin/env python3
"""ACLs against a Strata broker with Python's confluent-kafka client, over SASL_PLAINTEXT.

Every command takes --bootstrap, --mechanism, --user and --password (the principal it acts as);
or --protocol SSL with --ca, --cert and --key, acting as the client certificate's principal.

  add-acl --principal P --resource topic|group --name N [--pattern literal|prefixed]
          --operation OP [--deny]
                      AdminClient.create_acls; exit 0 when created
  produce --topic T   produce one record to partition 0; exit 0 when delivered, 3 when refused
                      with TOPIC_AUTHORIZATION_FAILED, 1 otherwise
  consume --topic T --group G
                      join G subscribed to T and read T's first record; exit 0 when read, 3
                      when refused with GROUP_AUTHORIZATION_FAILED, 1 otherwise
  topics              print the topics Metadata lists, one per line

Exits 2 when confluent-kafka is not installed. Run by tests/tests/acls.rs.
"""

import argparse
import sys
import time

try:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )
except ImportError as error:  # pragma: no cover - depends on the machine
    print(f"confluent-kafka is not installed ({error}); pip install confluent-kafka", file=sys.stderr)
    sys.exit(2)

DEADLINE_SECONDS = 30.0
REFUSED = 3


def config(args):
    if args.protocol == "SSL":
        # The principal is the client certificate's, mapped by the broker's rules.
        return {
            "bootstrap.servers": args.bootstrap,
            "security.protocol": "SSL",
            "ssl.ca.location": args.ca,
            "ssl.certificate.location": args.cert,
            "ssl.key.location": args.key,
        }
    return {
        "bootstrap.servers": args.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": args.mechanism,
        "sasl.username": args.user,
        "sasl.password": args.password,
    }


def add_acl(args):
    admin = AdminClient(config(args))
    binding = AclBinding(
        ResourceType[args.resource.upper()],
        args.name,
        ResourcePatternType[args.pattern.upper()],
        args.principal,
        "*",
        AclOperation[args.operation.upper()],
        AclPermissionType.DENY if args.deny else AclPermissionType.ALLOW,
    )
    for _, future in admin.create_acls([binding]).items():
        future.result(timeout=DEADLINE_SECONDS)
    print(f"created {binding}")
    return 0


def described(error):
    """The error's name and text; confluent-kafka 2.16 cannot always map a broker's code to its
    enum (code() then raises), but name() and str() still tell."""
    try:
        return f"{error.name()} {error}"
    except Exception:  # noqa: BLE001 - the binding's own failure
        return str(error)


def produce(args):
    producer = Producer({**config(args), "message.timeout.ms": int(DEADLINE_SECONDS * 1000)})
    delivered = []
    producer.produce(args.topic, b"guarded", partition=0, on_delivery=lambda e, m: delivered.append(e))
    producer.flush(DEADLINE_SECONDS)
    if delivered == [None]:
        print(f"produced to {args.topic} as {args.user}")
        return 0
    if delivered and "TOPIC_AUTHORIZATION_FAILED" in described(delivered[0]):
        print(f"refused: {described(delivered[0])}")
        return REFUSED
    print(f"produce to {args.topic} as {args.user}: {[described(e) for e in delivered]}", file=sys.stderr)
    return 1


def consume(args):
    consumer = Consumer(
        {
            **config(args),
            "group.id": args.group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([args.topic])
    deadline = time.monotonic() + DEADLINE_SECONDS
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is None:
                print(f"read {message.value()!r} from {args.topic} in group {args.group}")
                return 0
            if "GROUP_AUTHORIZATION_FAILED" in described(error):
                print(f"refused: {described(error)}")
                return REFUSED
            print(f"consumer error {described(error)}", file=sys.stderr)
            return 1
    finally:
        consumer.close()
    print("nothing read before the deadline", file=sys.stderr)
    return 1


def topics(args):
    admin = AdminClient(config(args))
    metadata = admin.list_topics(timeout=DEADLINE_SECONDS)
    for name in sorted(metadata.topics):
        print(name)
    return 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["add-acl", "produce", "consume", "topics"])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--mechanism", default="SCRAM-SHA-512")
    parser.add_argument("--user", default="")
    parser.add_argument("--password", default="")
    parser.add_argument("--protocol", default="SASL_PLAINTEXT", choices=["SASL_PLAINTEXT", "SSL"])
    parser.add_argument("--ca")
    parser.add_argument("--cert")
    parser.add_argument("--key")
    parser.add_argument("--principal")
    parser.add_argument("--resource", default="topic")
    parser.add_argument("--name")
    parser.add_argument("--pattern", default="literal")
    parser.add_argument("--operation")
    parser.add_argument("--deny", action="store_true")
    parser.add_argument("--topic")
    parser.add_argument("--group")
    args = parser.parse_args()
    handlers = {"add-acl": add_acl, "produce": produce, "consume": consume, "topics": topics}
    sys.exit(handlers[args.command](args))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""SASL/OAUTHBEARER against a Strata broker with Python's confluent-kafka client, the tokens
signed here (RS256 or ES256) with keys made here by the `cryptography` package.

Commands:

  keys --dir D           make an RSA and an EC P-256 key (D/rsa.pem, D/ec.pem) and write their
                         public halves as a JWKS (D/jwks.json, key ids rsa-1 and ec-1)
  round-trip --bootstrap B --dir D --alg RS256|ES256 --sub S --topic T [--aud A] [--iss I]
                         produce 20 records and consume them back as S; exit 0 when all arrive
  refused --bootstrap B --dir D ... [--expires-in SECONDS]
                         exit 0 when the client reports an authentication failure and gets no
                         Metadata answer, 1 otherwise; --expires-in negative signs an expired
                         token (librdkafka is told it is still good, so it sends it)
  keep-producing --bootstrap B --dir D ... --lifetime SECONDS --records N
                         produce N records one at a time, each waiting for its delivery, with
                         tokens that expire after SECONDS, so that the client re-authenticates
                         on its connection as they run out (KIP-368); exit 0 when all arrive

Exits 2 when confluent-kafka or cryptography is not installed. Run by tests/tests/security.rs.
"""

import argparse
import base64
import json
import os
import sys
import time

try:
    from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
    from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
except ImportError as error:  # pragma: no cover - depends on the machine
    print(f"a Python package is missing ({error}); pip install confluent-kafka cryptography", file=sys.stderr)
    sys.exit(2)

DEADLINE_SECONDS = 30.0


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def integer_bytes(n, size=None):
    return n.to_bytes(size or (n.bit_length() + 7) // 8, "big")


def keys(args):
    os.makedirs(args.dir, exist_ok=True)
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    for name, key in (("rsa.pem", rsa_key), ("ec.pem", ec_key)):
        with open(os.path.join(args.dir, name), "wb") as f:
            f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    rsa_public = rsa_key.public_key().public_numbers()
    ec_public = ec_key.public_key().public_numbers()
    jwks = {"keys": [
        {"kty": "RSA", "kid": "rsa-1", "use": "sig", "alg": "RS256",
         "n": b64url(integer_bytes(rsa_public.n)), "e": b64url(integer_bytes(rsa_public.e))},
        {"kty": "EC", "kid": "ec-1", "use": "sig", "alg": "ES256", "crv": "P-256",
         "x": b64url(integer_bytes(ec_public.x, 32)), "y": b64url(integer_bytes(ec_public.y, 32))},
    ]}
    with open(os.path.join(args.dir, "jwks.json"), "w") as f:
        json.dump(jwks, f)
    print(f"keys in {args.dir}")
    return 0


def sign(args, expires_at):
    kid = "rsa-1" if args.alg == "RS256" else "ec-1"
    with open(os.path.join(args.dir, "rsa.pem" if args.alg == "RS256" else "ec.pem"), "rb") as f:
        key = serialization.load_pem_private_key(f.read(), password=None)
    header = {"alg": args.alg, "typ": "JWT", "kid": kid}
    now = int(time.time())
    claims = {"sub": args.sub, "iss": args.iss, "aud": args.aud, "iat": min(now, expires_at), "exp": expires_at}
    signing_input = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(claims).encode())}".encode()
    if args.alg == "RS256":
        signature = key.sign(signing_input, padding.PKCS1v15(), hashes.SHA256())
    else:
        r, s = decode_dss_signature(key.sign(signing_input, ec.ECDSA(hashes.SHA256())))
        signature = integer_bytes(r, 32) + integer_bytes(s, 32)
    return f"{signing_input.decode()}.{b64url(signature)}"


def config(args, errors, lifetime=None):
    def oauth_cb(_config):
        now = time.time()
        expires_at = int(now + (lifetime if lifetime is not None else args.expires_in))
        token = sign(args, expires_at)
        # What librdkafka is told: an expired token's real expiry would stop it sending one.
        told = now + lifetime if lifetime is not None else max(expires_at, now + 300)
        return token, told, args.sub, {}

    return {
        "bootstrap.servers": args.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "OAUTHBEARER",
        "oauth_cb": oauth_cb,
        "error_cb": errors.append,
    }


def round_trip(args):
    errors = []
    producer = Producer({**config(args, errors), "linger.ms": 5})
    values = [f"oauth record {i}".encode() for i in range(20)]
    delivered = []
    for value in values:
        producer.produce(args.topic, value, partition=0, on_delivery=lambda e, m: delivered.append((e, m)))
    remaining = producer.flush(DEADLINE_SECONDS)
    if remaining or any(e is not None for e, _ in delivered) or len(delivered) != len(values):
        print(f"produce failed: {remaining} left, {delivered[:3]}, errors {errors}", file=sys.stderr)
        return 1
    consumer = Consumer({**config(args, errors), "group.id": "oauth-test", "enable.auto.commit": False})
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
        print(f"consumed {len(got)} of {len(values)}; errors {errors}", file=sys.stderr)
        return 1
    print(f"round trip of {len(values)} records as {args.sub} with {args.alg}")
    return 0


def refused(args):
    errors = []
    admin = AdminClient(config(args, errors))
    deadline = time.monotonic() + DEADLINE_SECONDS
    while time.monotonic() < deadline and not errors:
        try:
            admin.list_topics(timeout=1)
            print("the broker answered Metadata to a client that should have been refused", file=sys.stderr)
            return 1
        except Exception:  # a timeout while the client reports its failure
            admin.poll(0.1)
    authentication = [str(e) for e in errors if e.code() == KafkaError._AUTHENTICATION]
    if authentication:
        print(f"refused: {authentication[0]}")
        return 0
    print(f"no authentication error; errors {errors}", file=sys.stderr)
    return 1


def keep_producing(args):
    errors = []
    producer = Producer(config(args, errors, lifetime=args.lifetime))
    for i in range(args.records):
        delivered = []
        producer.produce(args.topic, f"record {i}".encode(), partition=0,
                         on_delivery=lambda e, m: delivered.append(e))
        remaining = producer.flush(DEADLINE_SECONDS)
        if remaining or delivered != [None]:
            print(f"record {i} not delivered: {delivered}; errors {errors}", file=sys.stderr)
            return 1
        # Spread the records over several token lifetimes.
        time.sleep(args.pause)
    print(f"{args.records} records delivered over {args.records * args.pause:.1f}s; errors {errors}")
    return 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["keys", "round-trip", "refused", "keep-producing"])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--bootstrap")
    parser.add_argument("--alg", default="RS256", choices=["RS256", "ES256"])
    parser.add_argument("--sub", default="alice")
    parser.add_argument("--aud", default="strata")
    parser.add_argument("--iss", default="https://issuer.test")
    parser.add_argument("--expires-in", type=int, default=300)
    parser.add_argument("--topic", default="oauth")
    parser.add_argument("--lifetime", type=float, default=3.0)
    parser.add_argument("--records", type=int, default=10)
    parser.add_argument("--pause", type=float, default=1.0)
    args = parser.parse_args()
    handlers = {"keys": keys, "round-trip": round_trip, "refused": refused, "keep-producing": keep_producing}
    sys.exit(handlers[args.command](args))


if __name__ == "__main__":
    main()

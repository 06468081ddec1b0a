#!/usr/bin/env python3
"""The admin calls current tools make, through confluent-kafka's AdminClient.

Checks, against a Strata broker:
- describe_configs of the BROKER resource: Kafka's standard keys, filled from the broker's
  settings, with their source and read-only flag;
- describe_topics (topic id, partitions led by the broker), describe_cluster,
  list_consumer_group_offsets of an unknown group, list_offsets;
- create_acls: SECURITY_DISABLED, as a Kafka broker without an authorizer (describe_acls
  answers too: librdkafka reports no bindings);
- describe_user_scram_credentials: no users.
(Transactions have their own script, tests/python/transactions.py.)

Exits 0 when every check passes, 1 with a message otherwise, 2 when confluent-kafka is missing.
Run by tests/tests/other_clients.rs against the real binary:
    python3 tests/python/admin.py --bootstrap 127.0.0.1:9092 --port 9092 --topic t
"""

import argparse
import sys

try:
    from confluent_kafka import (
        ConsumerGroupTopicPartitions,
        KafkaError,
        KafkaException,
        TopicCollection,
        TopicPartition,
    )
    from confluent_kafka.admin import (
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ConfigResource,
        ConfigSource,
        NewTopic,
        OffsetSpec,
        ResourcePatternType,
        ResourceType,
    )
except ImportError as error:  # pragma: no cover - depends on the machine
    print(f"confluent-kafka is not installed ({error}); pip install confluent-kafka", file=sys.stderr)
    sys.exit(2)

# Every call gets this long; a broker that answers at once needs a fraction of it.
TIMEOUT_SECONDS = 30.0


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def broker_configs(admin, port, broker_id):
    resource = ConfigResource(ResourceType.BROKER, str(broker_id))
    configs = admin.describe_configs([resource], request_timeout=TIMEOUT_SECONDS)[resource].result(
        TIMEOUT_SECONDS
    )
    expected = {
        "advertised.listeners": (f"PLAINTEXT://127.0.0.1:{port}", ConfigSource.STATIC_BROKER_CONFIG),
        "node.id": (str(broker_id), ConfigSource.STATIC_BROKER_CONFIG),
        "broker.id": (str(broker_id), ConfigSource.STATIC_BROKER_CONFIG),
        "num.partitions": ("1", ConfigSource.DEFAULT_CONFIG),
        "default.replication.factor": ("1", ConfigSource.DEFAULT_CONFIG),
        "log.retention.ms": ("604800000", ConfigSource.DEFAULT_CONFIG),
        "log.retention.bytes": ("-1", ConfigSource.DEFAULT_CONFIG),
        "message.max.bytes": ("1048588", ConfigSource.DEFAULT_CONFIG),
        "offsets.topic.num.partitions": ("8", ConfigSource.DEFAULT_CONFIG),
        # The test broker is started with --group-initial-rebalance-delay 0s.
        "group.initial.rebalance.delay.ms": ("0", ConfigSource.STATIC_BROKER_CONFIG),
        "auto.create.topics.enable": ("true", ConfigSource.DEFAULT_CONFIG),
    }
    for key, (value, source) in expected.items():
        entry = configs.get(key)
        check(entry is not None, f"broker config {key} missing; got {sorted(configs)}")
        check(entry.value == value, f"{key} = {entry.value!r}, expected {value!r}")
        check(entry.source == source.value, f"{key} source {entry.source}, expected {source}")
        check(entry.is_read_only, f"{key} should be read-only")
    check("listeners" in configs and "log.dirs" in configs, "listeners / log.dirs missing")


def topics_and_offsets(admin, topic, broker_id):
    futures = admin.create_topics([NewTopic(topic, num_partitions=2)], request_timeout=TIMEOUT_SECONDS)
    futures[topic].result(TIMEOUT_SECONDS)
    described = admin.describe_topics(
        TopicCollection([topic]), request_timeout=TIMEOUT_SECONDS
    )[topic].result(TIMEOUT_SECONDS)
    check(str(described.topic_id) != "AAAAAAAAAAAAAAAAAAAAAA", "describe_topics: no topic id")
    check(len(described.partitions) == 2, f"describe_topics: {described.partitions}")
    for p in described.partitions:
        check(p.leader is not None and p.leader.id == broker_id, f"partition {p.id} leader {p.leader}")
    offsets = admin.list_offsets(
        {TopicPartition(topic, 0): OffsetSpec.latest()}, request_timeout=TIMEOUT_SECONDS
    )
    latest = offsets[TopicPartition(topic, 0)].result(TIMEOUT_SECONDS)
    check(latest.offset == 0, f"list_offsets latest {latest.offset}")
    groups = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions("no-such-group", [TopicPartition(topic, 0)])],
        request_timeout=TIMEOUT_SECONDS,
    )
    committed = groups["no-such-group"].result(TIMEOUT_SECONDS)
    check(
        [tp.offset for tp in committed.topic_partitions] == [-1001],
        f"list_consumer_group_offsets {committed.topic_partitions}",
    )


def expect_kafka_error(future, code, what):
    try:
        future.result(TIMEOUT_SECONDS)
    except KafkaException as error:
        got = error.args[0].code()
        check(got == code, f"{what}: {error}, expected {KafkaError(code).name()}")
        return
    fail(f"{what} succeeded; expected {KafkaError(code).name()}")


def acls_and_users(admin):
    acl_filter = AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
        AclOperation.ANY, AclPermissionType.ANY,
    )
    # librdkafka drops DescribeAcls' top-level error (SECURITY_DISABLED here, as from a Kafka
    # broker without an authorizer) and returns no bindings; what matters is that it answers.
    try:
        described = admin.describe_acls(acl_filter, request_timeout=TIMEOUT_SECONDS).result(
            TIMEOUT_SECONDS
        )
        check(described == [], f"describe_acls: {described}")
    except KafkaException as error:
        check(
            error.args[0].code() == KafkaError.SECURITY_DISABLED,
            f"describe_acls: {error}, expected SECURITY_DISABLED",
        )
    binding = AclBinding(
        ResourceType.TOPIC, "t", ResourcePatternType.LITERAL, "User:alice", "*",
        AclOperation.READ, AclPermissionType.ALLOW,
    )
    created = admin.create_acls([binding], request_timeout=TIMEOUT_SECONDS)
    expect_kafka_error(created[binding], KafkaError.SECURITY_DISABLED, "create_acls")
    users = admin.describe_user_scram_credentials(request_timeout=TIMEOUT_SECONDS).result(
        TIMEOUT_SECONDS
    )
    check(users == {}, f"describe_user_scram_credentials: {users}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--port", required=True, type=int)
    parser.add_argument("--topic", required=True)
    args = parser.parse_args()
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    # The broker's id is allocated when it joins (cluster mode is the default).
    cluster = admin.describe_cluster(request_timeout=TIMEOUT_SECONDS).result(TIMEOUT_SECONDS)
    check(len(cluster.nodes) == 1, f"describe_cluster nodes {cluster.nodes}")
    broker_id = cluster.nodes[0].id
    broker_configs(admin, args.port, broker_id)
    topics_and_offsets(admin, args.topic, broker_id)
    acls_and_users(admin)
    print("admin checks passed")


if __name__ == "__main__":
    main()

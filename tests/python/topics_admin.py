#!/usr/bin/env python3
"""Topic administration through confluent-kafka's AdminClient against a 3-broker Strata cluster.

Phases (run by tests/tests/topics_admin.rs, which moves a partition between them):
  create   replication factor 3, an explicit assignment [[2, 1, 3]], a factor of 4 refused;
           Metadata lists 3 replicas (leader first, all in sync) and broker 2 leads `pinned`.
  elect    `pinned` was moved to broker 3: a preferred election moves it back to broker 2,
           and a second one is not needed.
  configs  describe, alter and refuse topic configs.

Exits 0 on success, 1 with a message otherwise, 2 when confluent-kafka is not installed.
Every wait is a poll of a condition with a deadline.
"""

import argparse
import sys
import time

try:
    from confluent_kafka import ElectionType, KafkaError, KafkaException, TopicPartition
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ConfigSource,
        NewTopic,
        ResourceType,
    )
except ImportError as error:  # pragma: no cover - depends on the machine
    print(f"confluent-kafka is not installed ({error}); pip install confluent-kafka", file=sys.stderr)
    sys.exit(2)

DEADLINE_SECONDS = 30.0


def fail(message):
    print(message, file=sys.stderr)
    sys.exit(1)


def wait_for(what, condition):
    """Polls `condition` until it returns something truthy, or fails at the deadline."""
    deadline = time.monotonic() + DEADLINE_SECONDS
    last = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(0.1)
    fail(f"timed out waiting until {what}; last: {last!r}")


def partitions_of(admin, topic):
    """{partition: (leader, replicas, isrs)} once every partition has a leader, else None."""
    described = admin.list_topics(topic=topic, timeout=10).topics.get(topic)
    if described is None or described.error is not None or not described.partitions:
        return None
    out = {}
    for index, p in described.partitions.items():
        if p.leader < 0:
            return None
        out[index] = (p.leader, list(p.replicas), list(p.isrs))
    return out


def create(admin):
    futures = admin.create_topics(
        [
            NewTopic("rf3", num_partitions=2, replication_factor=3),
            NewTopic("pinned", num_partitions=1, replica_assignment=[[2, 1, 3]]),
            NewTopic("rf4", num_partitions=1, replication_factor=4),
        ],
        operation_timeout=20,
    )
    for name in ("rf3", "pinned"):
        futures[name].result()
    try:
        futures["rf4"].result()
        fail("replication factor 4 on 3 brokers was accepted")
    except KafkaException as error:
        if error.args[0].code() != KafkaError.INVALID_REPLICATION_FACTOR:
            fail(f"rf4: expected INVALID_REPLICATION_FACTOR, got {error}")

    rf3 = wait_for("rf3 has leaders", lambda: partitions_of(admin, "rf3"))
    for index, (leader, replicas, isrs) in rf3.items():
        if sorted(replicas) != [1, 2, 3] or replicas[0] != leader or isrs != replicas:
            fail(f"rf3-{index}: leader {leader}, replicas {replicas}, isrs {isrs}")
    pinned = wait_for(
        "broker 2 leads pinned",
        lambda: (lambda p: p if p and p[0][0] == 2 else None)(partitions_of(admin, "pinned")),
    )
    if pinned[0] != (2, [2, 1, 3], [2, 1, 3]):
        fail(f"pinned-0: {pinned[0]}")
    print(f"rf3 {rf3} pinned {pinned}")


def elect(admin):
    partition = TopicPartition("pinned", 0)
    moved = partitions_of(admin, "pinned")
    if not moved or moved[0][0] != 3:
        fail(f"pinned-0 should be led by broker 3 after the move: {moved}")
    result = admin.elect_leaders(ElectionType.PREFERRED, [partition]).result()
    errors = {(tp.topic, tp.partition): e for tp, e in result.items()}
    if errors != {("pinned", 0): None}:
        fail(f"preferred election: {errors}")
    wait_for(
        "broker 2 leads pinned again",
        lambda: (lambda p: p if p and p[0][0] == 2 else None)(partitions_of(admin, "pinned")),
    )
    result = admin.elect_leaders(ElectionType.PREFERRED, [partition]).result()
    errors = [e for e in result.values()]
    if len(errors) != 1 or errors[0] is None or errors[0].code() != KafkaError.ELECTION_NOT_NEEDED:
        fail(f"second election: expected ELECTION_NOT_NEEDED, got {errors}")
    print("elected broker 2; the second election was not needed")


def describe(admin, topic):
    resource = ConfigResource(ResourceType.TOPIC, topic)
    return admin.describe_configs([resource])[resource].result()


def alter(admin, topic, name, value):
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)],
    )
    return admin.incremental_alter_configs([resource])[resource]


def configs(admin):
    before = describe(admin, "rf3")
    for name in ("min.insync.replicas", "segment.bytes", "unclean.leader.election.enable", "compression.type"):
        if name not in before or not before[name].is_default:
            fail(f"{name} not described as a default: {before.get(name)}")
    if before["min.insync.replicas"].value != "1":
        fail(f"min.insync.replicas: {before['min.insync.replicas']}")
    alter(admin, "rf3", "min.insync.replicas", "2").result()
    after = describe(admin, "rf3")["min.insync.replicas"]
    if after.value != "2" or after.source not in (ConfigSource.DYNAMIC_TOPIC_CONFIG, ConfigSource.DYNAMIC_TOPIC_CONFIG.value):
        fail(f"min.insync.replicas after SET: {after.value} from source {after.source}")
    try:
        alter(admin, "rf3", "compression.type", "zstd").result()
        fail("compression.type=zstd was accepted")
    except KafkaException as error:
        if error.args[0].code() != KafkaError.INVALID_CONFIG or "recompress" not in str(error):
            fail(f"compression.type=zstd: expected INVALID_CONFIG saying why, got {error}")
    try:
        alter(admin, "rf3", "min.insync.replica", "2").result()
        fail("an unknown config was accepted")
    except KafkaException as error:
        if error.args[0].code() != KafkaError.INVALID_CONFIG:
            fail(f"unknown config: expected INVALID_CONFIG, got {error}")
    print("configs described, altered and refused")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("phase", choices=["create", "elect", "configs"])
    args = parser.parse_args()
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    {"create": create, "elect": elect, "configs": configs}[args.phase](admin)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""KIP-848 consumer groups (group.protocol=consumer) through a Strata broker with Python's
confluent-kafka client.

Scenarios (--scenario):
- share:  two members share a topic's partitions;
- five:   five members share them;
- added:  two members consume while records arrive, a third joins half-way;
- regex:  two members subscribe with a regex: they get every record of the matching topics,
          none of the others, and a matching topic created while they run;
- killed: three members, one in a child process that is SIGKILLed once it owns partitions;
          the broker's session timeout (a short one set by the test on the broker) hands its
          partitions to the other two;
- migrate: a rolling upgrade and back: two classic members (group.protocol=classic) consume;
          a consumer-protocol member joins, which converts the live group; the classic members
          are replaced one by one by consumer-protocol ones; then classic members join again and
          the consumer-protocol ones leave, which converts the group back to a classic one;
          records are produced in three parts along the way; the classic members use an eager
          assignor (range);
- migrate-cooperative: the same with classic members on the cooperative-sticky assignor, which
          keep what they still own when they rejoin and say so in their subscription;
- moved:  (the test creates the topic, 6 partitions) three members on a cluster consume the
          first half; then, while they keep polling,
          the commands given with --between run (the test moves the group's coordinator shard
          and a data partition to other brokers); then the second half is produced and
          consumed.

Every member commits synchronously after each batch it processes and when partitions are
revoked. Checks: members own disjoint partitions at all times they report; every record is
received (exactly once, except in "killed", where the killed member's uncommitted records are
received again, as at-least-once delivery allows); at the end the committed offset of every
partition is its end offset; ConsumerGroupDescribe reports a Stable consumer group.
Exits 0 when everything holds, 1 with a message otherwise, 2 when confluent-kafka is missing.

Run by tests/tests/consumer_groups.rs against the real binary:
    python3 tests/python/consumer_protocol.py --bootstrap 127.0.0.1:9092 --topic t --scenario share
"""

import argparse
import faulthandler
import json
import os
import signal
import subprocess
import sys
import time

try:
    from confluent_kafka import Consumer, Producer, TopicPartition, ConsumerGroupType
    from confluent_kafka.admin import AdminClient, NewTopic
except ImportError as error:  # pragma: no cover - depends on the machine
    print(f"confluent-kafka is not installed ({error}); pip install confluent-kafka", file=sys.stderr)
    sys.exit(2)

DEADLINE_SECONDS = 60.0

# A call that never returns (the script's own deadlines cannot fire) dumps every thread's stack
# to stderr before the test's 120 s limit kills the script, so a hang shows where it is.
faulthandler.dump_traceback_later(100, exit=True)


def fail(why):
    print(f"consumer protocol FAILED: {why}", file=sys.stderr, flush=True)
    # Not sys.exit: interpreter shutdown destroys the live consumers, and librdkafka's destroy
    # leaves the group and may wait on the broker, which would hide this failure behind the
    # test's own kill deadline.
    os._exit(1)


def consumer(bootstrap, group, name, protocol="consumer"):
    config = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "group.protocol": protocol,
        "client.id": name,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 100,
    }
    if protocol.startswith("classic"):
        # The broker's minimum session; heartbeats often enough to learn of a rebalance fast.
        config["group.protocol"] = "classic"
        config["session.timeout.ms"] = 6000
        config["heartbeat.interval.ms"] = 500
        if protocol == "classic-cooperative":
            # Incremental rebalancing: the member keeps what it still owns when it rejoins and
            # lists it in its subscription.
            config["partition.assignment.strategy"] = "cooperative-sticky"
    # librdkafka's own trace (e.g. STRATA_RDKAFKA_DEBUG=cgrp) when diagnosing a failure.
    if os.environ.get("STRATA_RDKAFKA_DEBUG"):
        config["debug"] = os.environ["STRATA_RDKAFKA_DEBUG"]
    return Consumer(config)


class Member:
    """One subscribed consumer and everything it saw."""

    def __init__(self, bootstrap, topic, group, name, subscription=None, protocol="consumer"):
        self.name = name
        self.topic = topic
        self.assignment = set()
        self.got = []  # (partition, offset)
        self.positions = {}
        self.errors = []
        self.revoked_log = []
        self.consumer = consumer(bootstrap, group, name, protocol)
        self.consumer.subscribe(subscription or [topic], on_assign=self.on_assign, on_revoke=self.on_revoke)

    def on_assign(self, consumer, partitions):
        self.assignment |= {p.partition for p in partitions}

    def on_revoke(self, consumer, partitions):
        revoked = {p.partition for p in partitions}
        self.revoked_log.append(sorted(revoked))
        self.commit(revoked)
        self.assignment -= revoked
        for p in revoked:
            self.positions.pop(p, None)

    def commit(self, only=None):
        offsets = [
            TopicPartition(self.topic, p, o)
            for p, o in sorted(self.positions.items())
            if p in self.assignment and (only is None or p in only)
        ]
        if not offsets:
            return
        try:
            answer = self.consumer.commit(offsets=offsets, asynchronous=False)
        except Exception as error:  # KafkaException; reported, never retried
            self.errors.append(f"commit {offsets}: {error}")
            return
        for tp in answer or []:
            if tp.error is not None:
                self.errors.append(f"commit {tp.partition}: {tp.error}")

    def poll(self):
        messages = self.consumer.consume(num_messages=200, timeout=0.05)
        for message in messages:
            if message.error():
                self.errors.append(f"consume: {message.error()}")
                continue
            self.got.append((message.partition(), message.offset()))
            self.positions[message.partition()] = message.offset() + 1
        if messages:
            self.commit()

    def reached(self, end):
        """Whether every owned partition is processed up to `end`. A partition whose previous
        owner processed and committed everything brings this member no records: librdkafka's
        position() stays unset until a record is consumed, so the group's committed offset
        (which only the owner moves) tells instead."""
        if not self.assignment:
            return False
        silent = [TopicPartition(self.topic, p) for p in self.assignment if p not in self.positions]
        committed = {}
        if silent:
            committed = {tp.partition: tp.offset for tp in self.consumer.committed(silent, timeout=10)}
        return all(self.positions.get(p, committed.get(p)) == end for p in self.assignment)

    def describe(self):
        try:
            fetching = {
                tp.partition: tp.offset
                for tp in self.consumer.position([TopicPartition(self.topic, p) for p in sorted(self.assignment)])
            }
        except Exception as error:  # a closed consumer, or the client's own error
            fetching = str(error)
        return (
            f"{self.name}: assignment {sorted(self.assignment)}, {len(self.got)} records, "
            f"processed up to {dict(sorted(self.positions.items()))}, fetch positions {fetching}, "
            f"errors {self.errors}"
        )


def create_topic(bootstrap, topic, partitions):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)]).values():
        future.result(timeout=30)
    deadline = time.monotonic() + DEADLINE_SECONDS
    while True:
        described = admin.list_topics(topic, timeout=10).topics.get(topic)
        if described is not None and described.error is None and len(described.partitions) == partitions:
            return admin
        if time.monotonic() > deadline:
            fail(f"Metadata never listed {topic} with {partitions} partitions")
        time.sleep(0.05)


def produce(bootstrap, topic, partitions, count, start=0):
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5})
    errors = []

    def delivered(error, message):
        if error is not None:
            errors.append(str(error))

    for seq in range(start, start + count):
        producer.produce(topic, value=f"seq={seq}".encode(), partition=seq % partitions, on_delivery=delivered)
        producer.poll(0)
    if producer.flush(30) != 0 or errors:
        fail(f"produce failed: {errors[:3]}")


def end_offsets(bootstrap, topic, partitions):
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe-end-offsets"})
    ends = {p: probe.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
    probe.close()
    return ends


def poll_until(members, what, condition):
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            fail(f"timed out waiting until {what}:\n  " + "\n  ".join(m.describe() for m in members))
        for member in members:
            member.poll()
        owned = [p for m in members for p in m.assignment]
        if len(owned) != len(set(owned)):
            fail("two members own one partition:\n  " + "\n  ".join(m.describe() for m in members))


def check_end(bootstrap, admin, topic, group, partitions, members, exactly_once, group_type=ConsumerGroupType.CONSUMER,
              received_by=None):
    ends = end_offsets(bootstrap, topic, partitions)
    total = sum(ends.values())
    received = [r for m in (received_by or members) for r in m.got]
    distinct = set(received)
    expected = {(p, o) for p, end in ends.items() for o in range(end)}
    if exactly_once and distinct != expected:
        fail(f"received {len(distinct)} distinct records of {total}")
    if not exactly_once:
        # The killed member received the start of its partitions; the rest must be a
        # contiguous run up to the end, picked up from its last commit.
        for p, end in ends.items():
            offsets = sorted({o for q, o in distinct if q == p})
            if not offsets or offsets[-1] != end - 1 or len(offsets) != end - offsets[0]:
                fail(f"partition {p}: survivors received a gap or stopped short of {end}")
    if exactly_once and len(received) != total:
        fail(f"{len(received) - total} records received twice")
    for m in received_by or members:
        if m.errors:
            fail(m.describe())
    # The group must report itself as the expected type, with every partition assigned.
    description = admin.describe_consumer_groups([group])[group].result(timeout=30)
    if description.type != group_type:
        fail(f"described type {description.type}, expected {group_type}")
    owned = sorted(p.partition for member in description.members for p in member.assignment.topic_partitions)
    if owned != list(range(partitions)):
        fail(f"ConsumerGroupDescribe assignment {owned}")
    probe = consumer(bootstrap, group, "checker")
    committed = probe.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
    probe.close()
    got = {tp.partition: tp.offset for tp in committed}
    if got != ends:
        fail(f"committed offsets {got} != end offsets {ends}")
    leave_and_close(members)
    return total


def leave_and_close(members):
    """Each member leaves the group and then closes. The leave is an unsubscribe served by
    this script's own polls, not close(): librdkafka 2.16 can hang in close() when a new
    assignment reaches the member just as close() starts (its assign event is left on the
    consumer queue that close() no longer serves; librdkafka issues #4527 and #4884). Closing
    members one after another makes that likely, since each leave hands partitions to those
    still open. Seen in a debug=cgrp trace on S3, where heartbeats are slower: "delegating
    incremental assign" 2 ms before "Closing consumer", then close() never returned. A member
    that has left owns nothing, so its close() has no rebalance to run."""
    for m in members:
        m.consumer.unsubscribe()
        deadline = time.monotonic() + DEADLINE_SECONDS
        while m.assignment:
            if time.monotonic() > deadline:
                fail(f"{m.name} still owns {sorted(m.assignment)} after unsubscribing")
            m.poll()
        m.consumer.close()


def scenario_share(args, count_members, partitions=8, records=4000):
    admin = create_topic(args.bootstrap, args.topic, partitions)
    produce(args.bootstrap, args.topic, partitions, records)
    group = f"{args.topic}-group"
    members = [Member(args.bootstrap, args.topic, group, f"m{i}") for i in range(count_members)]
    poll_until(
        members,
        "every record is received and every member owns partitions",
        lambda: len({r for m in members for r in m.got}) >= records and all(m.assignment for m in members),
    )
    for m in members:
        m.commit()
    return check_end(args.bootstrap, admin, args.topic, group, partitions, members, exactly_once=True)


def run_polling(members, commands):
    """Runs each command (a JSON list: argv) to completion while every member keeps polling, so
    the members live through whatever the command does to the cluster. STRATA_ variables are
    dropped from the command's environment: they are the test's, not the admin command's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}
    for command in commands:
        argv = json.loads(command)
        process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + DEADLINE_SECONDS
        while process.poll() is None:
            if time.monotonic() > deadline:
                process.kill()
                fail(f"{argv[1:3]} did not finish")
            for member in members:
                member.poll()
        output = process.stdout.read().strip()
        if process.returncode != 0:
            fail(f"{argv[1:]} failed ({process.returncode}): {output}")
        print(f"ran {' '.join(argv[1:4])}: {output.splitlines()[-1] if output else ''}", flush=True)


def scenario_moved(args, partitions=6, records=3000):
    # The test created the topic, so that it could pick move targets other than the owners.
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    group = f"{args.topic}-group"
    produce(args.bootstrap, args.topic, partitions, records // 2)
    members = [Member(args.bootstrap, args.topic, group, f"m{i}") for i in range(3)]
    poll_until(
        members,
        "the first half is received and every member owns partitions",
        lambda: len({r for m in members for r in m.got}) >= records // 2 and all(m.assignment for m in members),
    )
    before = {m.name: (set(m.assignment), len(m.revoked_log)) for m in members}
    run_polling(members, args.between)
    produce(args.bootstrap, args.topic, partitions, records - records // 2, start=records // 2)
    poll_until(
        members,
        "everything is received after the moves",
        lambda: len({r for m in members for r in m.got}) >= records and all(m.assignment for m in members),
    )
    # The new coordinator replayed the group: the members kept their partitions, with no
    # rebalance, as they would when a Kafka coordinator's leadership moves.
    for m in members:
        owned, revocations = before[m.name]
        if m.assignment != owned or m.revoked_log[revocations:]:
            fail(f"{m.name} owned {sorted(owned)} before the moves, {sorted(m.assignment)} after; "
                 f"revoked since: {m.revoked_log[revocations:]}")
    for m in members:
        m.commit()
    return check_end(args.bootstrap, admin, args.topic, group, partitions, members, exactly_once=True)


def scenario_added(args, partitions=6, records=3000):
    admin = create_topic(args.bootstrap, args.topic, partitions)
    group = f"{args.topic}-group"
    produce(args.bootstrap, args.topic, partitions, records // 2)
    members = [Member(args.bootstrap, args.topic, group, f"m{i}") for i in range(2)]
    poll_until(members, "the first half is received", lambda: len({r for m in members for r in m.got}) >= records // 2)
    members.append(Member(args.bootstrap, args.topic, group, "late"))
    produce(args.bootstrap, args.topic, partitions, records - records // 2, start=records // 2)
    poll_until(
        members,
        "everything is received and the late member owns partitions",
        lambda: len({r for m in members for r in m.got}) >= records and all(m.assignment for m in members),
    )
    for m in members:
        m.commit()
    return check_end(args.bootstrap, admin, args.topic, group, partitions, members, exactly_once=True)


def expect_type(admin, group, group_type, when):
    description = admin.describe_consumer_groups([group])[group].result(timeout=30)
    if description.type != group_type:
        fail(f"{when}: the group is described as {description.type}, not {group_type}")
    print(f"{when}: {description.type}, {len(description.members)} members", flush=True)


def leave(leaving, members):
    """`leaving` unsubscribes (its revocation commits what it processed) while every member
    keeps polling, then closes."""
    leaving.consumer.unsubscribe()
    deadline = time.monotonic() + DEADLINE_SECONDS
    while leaving.assignment:
        if time.monotonic() > deadline:
            fail(f"{leaving.name} still owns {sorted(leaving.assignment)} after unsubscribing")
        for m in members:
            m.poll()
    leaving.consumer.close()


def scenario_migrate(args, classic_protocol, partitions=6, records=3000):
    admin = create_topic(args.bootstrap, args.topic, partitions)
    group = f"{args.topic}-group"
    third = records // 3
    produce(args.bootstrap, args.topic, partitions, third)
    everyone = []

    def join(name, protocol):
        member = Member(args.bootstrap, args.topic, group, name, protocol=protocol)
        everyone.append(member)
        return member

    def received():
        return len({r for m in everyone for r in m.got})

    classic = [join(f"classic{i}", classic_protocol) for i in range(2)]
    poll_until(classic, "two classic members share the first third",
               lambda: received() >= third and all(m.assignment for m in classic))
    expect_type(admin, group, ConsumerGroupType.CLASSIC, "before the upgrade")

    # A consumer-protocol member joins the live classic group: it becomes a consumer group,
    # and the classic members keep consuming in it.
    members = classic + [join("modern0", "consumer")]
    poll_until(members, "the first consumer-protocol member owns partitions", lambda: all(m.assignment for m in members))
    expect_type(admin, group, ConsumerGroupType.CONSUMER, "after the first consumer-protocol member joined")
    # The classic members are replaced one by one, as a rolling restart would.
    for i, old in enumerate(classic):
        leave(old, members)
        members.remove(old)
        members.append(join(f"modern{i + 1}", "consumer"))
        poll_until(members, f"modern{i + 1} owns partitions", lambda: all(m.assignment for m in members))
    produce(args.bootstrap, args.topic, partitions, third, start=third)
    poll_until(members, "the second third is received", lambda: received() >= 2 * third)

    # And back: classic members join the consumer group, then the consumer-protocol members
    # leave; the last one's departure turns the group back into a classic group.
    back = [join(f"back{i}", classic_protocol) for i in range(2)]
    members += back
    poll_until(members, "the classic members own partitions in the consumer group", lambda: all(m.assignment for m in members))
    for old in [m for m in members if m not in back]:
        leave(old, members)
        members.remove(old)
    poll_until(back, "the classic members own every partition",
               lambda: sorted(p for m in back for p in m.assignment) == list(range(partitions)))
    expect_type(admin, group, ConsumerGroupType.CLASSIC, "after the last consumer-protocol member left")
    produce(args.bootstrap, args.topic, partitions, records - 2 * third, start=2 * third)
    poll_until(back, "everything is received", lambda: received() >= records)
    for m in back:
        m.commit()
    # Every member ever in the group, for the exactly-once check; only `back` is still open.
    check_end(args.bootstrap, admin, args.topic, group, partitions, back, exactly_once=True,
              group_type=ConsumerGroupType.CLASSIC, received_by=everyone)
    return records


def scenario_killed(args, partitions=6, records=3000):
    admin = create_topic(args.bootstrap, args.topic, partitions)
    group = f"{args.topic}-group"
    produce(args.bootstrap, args.topic, partitions, records)
    child = subprocess.Popen(
        [sys.executable, __file__, "--bootstrap", args.bootstrap, "--topic", args.topic, "--scenario", "child"],
        stdout=subprocess.PIPE,
        text=True,
    )
    # The child says "owned" once it owns partitions and has committed some progress.
    line = child.stdout.readline().strip()
    if line != "owned":
        fail(f"child member said {line!r}")
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    members = [Member(args.bootstrap, args.topic, group, f"m{i}") for i in range(2)]
    poll_until(
        members,
        "the survivors own every partition and received everything",
        lambda: sorted(p for m in members for p in m.assignment) == list(range(partitions))
        and all(m.reached(records // partitions) for m in members),
    )
    for m in members:
        m.commit()
    return check_end(args.bootstrap, admin, args.topic, group, partitions, members, exactly_once=False)


class RegexMember:
    """A member subscribed by regex: it records (topic, partition, offset) of what it gets and
    commits nothing (the checks are about which topics it is given)."""

    def __init__(self, bootstrap, group, name, regex):
        self.name = name
        self.got = set()
        self.owned = set()
        self.errors = []
        self.consumer = consumer(bootstrap, group, name)
        self.consumer.subscribe([regex], on_assign=self.on_assign, on_revoke=self.on_revoke)

    @property
    def assignment(self):
        return self.owned

    def on_assign(self, consumer, partitions):
        self.owned |= {(p.topic, p.partition) for p in partitions}

    def on_revoke(self, consumer, partitions):
        self.owned -= {(p.topic, p.partition) for p in partitions}

    def poll(self):
        for message in self.consumer.consume(num_messages=200, timeout=0.05):
            if message.error():
                self.errors.append(f"consume: {message.error()}")
                continue
            self.got.add((message.topic(), message.partition(), message.offset()))


def scenario_regex(args, partitions=2, records=200):
    base = args.topic
    matching = [f"{base}-in-1", f"{base}-in-2"]
    other = f"{base}-out"
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    for topic in matching + [other]:
        create_topic(args.bootstrap, topic, partitions)
        produce(args.bootstrap, topic, partitions, records)
    members = [RegexMember(args.bootstrap, f"{base}-group", f"r{i}", f"^{base}-in-.*") for i in range(2)]

    def wait_for(what, topics):
        expected = {(t, p, o) for t in topics for p in range(partitions) for o in range(records // partitions)}
        deadline = time.monotonic() + DEADLINE_SECONDS
        while True:
            got = set().union(*(m.got for m in members))
            if got >= expected:
                break
            if time.monotonic() > deadline:
                fail(f"timed out waiting until {what}: got {len(got & expected)} of {len(expected)}; "
                     + "; ".join(f"{m.name} owns {sorted(m.owned)} errors {m.errors}" for m in members))
            for m in members:
                m.poll()
        strays = {r for r in got if r[0] not in topics}
        if strays:
            fail(f"records of topics the regex does not match: {sorted(strays)[:5]}")
        for m in members:
            if m.errors:
                fail(f"{m.name}: {m.errors}")

    wait_for("the matching topics are consumed", matching)
    later = f"{base}-in-3"
    create_topic(args.bootstrap, later, partitions)
    produce(args.bootstrap, later, partitions, records)
    wait_for("a matching topic created later is consumed too", matching + [later])
    description = admin.describe_consumer_groups([f"{base}-group"])[f"{base}-group"].result(timeout=30)
    owned = sorted({(p.topic, p.partition) for m in description.members for p in m.assignment.topic_partitions})
    want = sorted((t, p) for t in matching + [later] for p in range(partitions))
    if owned != want:
        fail(f"ConsumerGroupDescribe assignment {owned}, want {want}")
    leave_and_close(members)
    return 3 * records


def static_member(args, index):
    member = Member(args.bootstrap, args.topic, f"{args.topic}-group", f"s{index}")
    member.consumer.close()  # replaced below: the instance id must be set before subscribing
    config = {
        "bootstrap.servers": args.bootstrap,
        "group.id": f"{args.topic}-group",
        "group.protocol": "consumer",
        "group.instance.id": f"instance-{index}",
        "client.id": f"s{index}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 100,
    }
    if os.environ.get("STRATA_RDKAFKA_DEBUG"):
        config["debug"] = os.environ["STRATA_RDKAFKA_DEBUG"]
    member.consumer = Consumer(config)
    member.revocations = []
    member.assignments = []
    original_assign, original_revoke = member.on_assign, member.on_revoke

    def on_assign(consumer, partitions):
        member.assignments.append(sorted(p.partition for p in partitions))
        original_assign(consumer, partitions)

    def on_revoke(consumer, partitions):
        member.revocations.append(sorted(p.partition for p in partitions))
        original_revoke(consumer, partitions)

    member.consumer.subscribe([args.topic], on_assign=on_assign, on_revoke=on_revoke)
    return member


def scenario_restart(args, phase, partitions=6, half=1500):
    """Phase a: two static members consume the first half and leave as static members (-2).
    The test then kills and restarts the broker. Phase b: the same instances come back, get
    the partitions they had without any revocation, and consume exactly the second half."""
    group = f"{args.topic}-group"
    if phase == "a":
        admin = create_topic(args.bootstrap, args.topic, partitions)
        produce(args.bootstrap, args.topic, partitions, half)
    else:
        admin = AdminClient({"bootstrap.servers": args.bootstrap})
        produce(args.bootstrap, args.topic, partitions, half, start=half)
    members = [static_member(args, i) for i in range(2)]
    want = half * (1 if phase == "a" else 2) // partitions
    # Each member must own its full share, not only the union of all partitions: the union can
    # be complete while a partition is still on its way from one member to the other (its new
    # owner waits for the old one to revoke it). A group left in that state in phase a resumes
    # in it in phase b and finishes the hand-over there, which is Kafka's behaviour too, but
    # would not show whether the restart itself caused a rebalance.
    poll_until(
        members,
        f"phase {phase}: both members own {partitions // len(members)} partitions and reached offset {want} everywhere",
        lambda: sorted(p for m in members for p in m.assignment) == list(range(partitions))
        and all(len(m.assignment) == partitions // len(members) for m in members)
        and all(m.reached(want) for m in members),
    )
    for m in members:
        m.commit()
    if phase == "b":
        for m in members:
            if m.revocations or len(m.assignments) != 1:
                fail(f"{m.name} rebalanced after coming back: assigned {m.assignments}, revoked {m.revocations}")
        received = [r for m in members for r in m.got]
        if sorted(received) != sorted((p, o) for p in range(partitions) for o in range(half // partitions, want)):
            fail(f"phase b received {len(received)} records, not exactly the second half")
        check_end(args.bootstrap, admin, args.topic, group, partitions, members, exactly_once=False)
        return 2 * half
    for m in members:
        m.consumer.close()  # a static member's close leaves with epoch -2
    return half


def child(args):
    member = Member(args.bootstrap, args.topic, f"{args.topic}-group", "doomed")
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not (member.assignment and member.got):
        if time.monotonic() > deadline:
            fail("child never owned partitions")
        member.poll()
    print("owned", flush=True)
    while True:  # until killed; keeps heartbeating through librdkafka's own thread
        time.sleep(1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--scenario", required=True, choices=["share", "five", "added", "regex", "killed", "moved", "migrate", "migrate-cooperative", "child", "restart-a", "restart-b"])
    parser.add_argument("--between", action="append", default=[], help="moved: a command to run between the halves, as a JSON argv list")
    args = parser.parse_args()
    started = time.monotonic()
    if args.scenario == "child":
        child(args)
        return
    total = {
        "share": lambda: scenario_share(args, 2),
        "five": lambda: scenario_share(args, 5, partitions=10, records=5000),
        "added": lambda: scenario_added(args),
        "regex": lambda: scenario_regex(args),
        "killed": lambda: scenario_killed(args),
        "moved": lambda: scenario_moved(args),
        "migrate": lambda: scenario_migrate(args, "classic"),
        "migrate-cooperative": lambda: scenario_migrate(args, "classic-cooperative"),
        "restart-a": lambda: scenario_restart(args, "a"),
        "restart-b": lambda: scenario_restart(args, "b"),
    }[args.scenario]()
    print(f"consumer protocol {args.scenario}: {total} records, committed offsets exact, {time.monotonic() - started:.1f}s")


if __name__ == "__main__":
    main()

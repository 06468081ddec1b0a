#!/usr/bin/env python3
"""Share groups (KIP-932, "queues for Kafka") through a Strata broker with confluent-kafka's
ShareConsumer (confluent-kafka 2.16, librdkafka's share consumer).

The broker is started by the test with `--share-auto-offset-reset earliest`, so records
produced before a consumer joins are delivered. Every consumer acknowledges explicitly
(`share.acknowledgement.mode=explicit`) and commits its acknowledgements with commit_sync().

Scenarios (--scenario), each on its own topic with one partition:
- six:      6 share consumers (threads, one consumer each) take records from one partition
            while they are produced; all 6 receive records and together accept every record
            exactly once;
- release:  a consumer RELEASEs what it got; another consumer gets exactly those records
            again (delivery count 2);
- killed:   a consumer in a child process acquires records and is SIGKILLed without
            acknowledging; another consumer gets those records after the lock duration (the
            test sets a short one on the broker);
- reject:   a consumer REJECTs some records and ACCEPTs the rest; another consumer, reading
            until a later marker record, never sees any of them;
- poison:   a consumer RELEASEs one record every time it gets it; after the delivery-count
            limit (3, set by the test) it is archived: a later marker arrives and the poison
            record never comes again;
- pubsub:   a consumer group (classic Consumer) and a share group read one topic: each sees
            every record;
- group-config: (on a broker with its defaults: share groups start at the latest offset, locks
            last 30 s, 5 deliveries) the group's own configs, set with IncrementalAlterConfigs
            on the GROUP resource as Kafka's share-consumer tests do:
            `share.auto.offset.reset=earliest` makes records produced before the group existed
            its own, `share.record.lock.duration.ms=2000` brings a killed consumer's records
            back long before the broker's 30 s lock would, and `share.delivery.count.limit=2`
            archives a poison record after its second delivery; DescribeConfigs reports them as
            GROUP_CONFIG; a value out of Kafka's bounds, unknown names, and a heartbeat interval
            not below the session timeout are refused with INVALID_CONFIG;
- by-duration: the group's `share.auto.offset.reset=by_duration:PT1H` (KIP-1106) on a
            partition of five records two hours old and five new ones: the group gets exactly
            the five new ones; a negative duration is refused;
- transactions: two share groups, `share.isolation.level` read_committed and read_uncommitted,
            read aborted, committed, interleaved and plain records and an open transaction:
            read_uncommitted gets every record once, read_committed every committed one once
            and never an aborted one, and nothing at or after the open transaction until it
            commits; transaction markers are never delivered to either (the test then checks
            both groups' backlog is empty: the broker archived the markers itself);
- moving:   (on a 2-broker cluster; --strata, --storage and --brokers name the binary, the
            storage and the broker ids) three consumers take records while the partition moves
            between the brokers four times, each in the middle of consumption; one consumer
            holds records across the first move. From the acknowledgement-commit callback,
            record by record: every accept confirmed exactly once, nothing delivered after its
            accept was confirmed, the held records' late accepts refused and the records
            delivered again;
- restart-a / restart-b: (the test kills and restarts the broker between them) restart-a
            produces 100 records and accepts offsets 0..49 only, then is SIGKILLed by itself
            (no close); restart-b must receive exactly offsets 50..99: no accepted record is
            delivered again after the broker restart.
Exits 0 when everything holds, 1 with a message otherwise, 2 when confluent-kafka is missing.

Run by tests/tests/share_groups.rs against the real binary:
    python3 tests/python/share_groups.py --bootstrap 127.0.0.1:9092 --topic t --scenario six
"""

import argparse
import faulthandler
import json
import os
import signal
import subprocess
import sys
import threading
import time

try:
    from confluent_kafka import AcknowledgeType, Consumer, KafkaError, KafkaException, Producer, ShareConsumer
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

DEADLINE_SECONDS = 60.0

faulthandler.dump_traceback_later(110, exit=True)


def fail(why):
    print(f"share groups FAILED: {why}", file=sys.stderr, flush=True)
    # Not sys.exit: destroying live consumers may wait on the broker and hide this failure.
    os._exit(1)


def deadline(seconds=DEADLINE_SECONDS):
    return time.monotonic() + seconds


def create_topic(bootstrap, topic):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)


def produce(bootstrap, topic, values):
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for v in values:
        producer.produce(topic, value=v.encode())
    if producer.flush(30) != 0:
        fail("produce did not finish")


def share_consumer(bootstrap, group, topic, **extra):
    config = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "share.acknowledgement.mode": "explicit",
    }
    config.update(extra)
    consumer = ShareConsumer(config)
    consumer.subscribe([topic])
    return consumer


def records(consumer, timeout=0.5):
    batch = consumer.poll(timeout)
    out = []
    for m in list(batch or []):
        if m.error():
            fail(f"consume error: {m.error()}")
        out.append(m)
    return out


def six(args):
    create_topic(args.bootstrap, args.topic)
    total = 600
    accepted = {}  # consumer index -> offsets
    lock = threading.Lock()
    done = threading.Event()
    errors = []

    def run(i):
        try:
            c = share_consumer(args.bootstrap, "six", args.topic, **{"max.poll.records": 5})
            mine = []
            end = deadline()
            while not done.is_set() and time.monotonic() < end:
                got = records(c)
                for m in got:
                    c.acknowledge(m, AcknowledgeType.ACCEPT)
                    mine.append(m.offset())
                if got:
                    c.commit_sync()
                    with lock:
                        accepted[i] = list(mine)
                        if sum(len(v) for v in accepted.values()) >= total:
                            done.set()
            c.close()
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(f"consumer {i}: {e!r}")
            done.set()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    # Produce while the consumers run, in small steps, so that every member is fetching.
    for start in range(0, total, 20):
        produce(args.bootstrap, args.topic, [f"r{n}" for n in range(start, start + 20)])
    for t in threads:
        t.join(DEADLINE_SECONDS + 30)
    if errors:
        fail("; ".join(errors))
    everything = sorted(o for v in accepted.values() for o in v)
    if everything != list(range(total)):
        dupes = len(everything) - len(set(everything))
        fail(f"accepted {len(everything)} records, {dupes} twice, {total - len(set(everything))} missing")
    counts = {i: len(accepted.get(i, [])) for i in range(6)}
    if any(n == 0 for n in counts.values()):
        fail(f"a consumer received nothing: {counts}")
    print(f"six: every record accepted once; per consumer {counts}")


def release(args):
    create_topic(args.bootstrap, args.topic)
    produce(args.bootstrap, args.topic, [f"r{n}" for n in range(10)])
    a = share_consumer(args.bootstrap, "release", args.topic)
    released = []
    end = deadline()
    while not released and time.monotonic() < end:
        for m in records(a):
            a.acknowledge(m, AcknowledgeType.RELEASE)
            released.append(m.offset())
    if not released:
        fail("the first consumer got nothing")
    a.commit_sync()
    b = share_consumer(args.bootstrap, "release", args.topic)
    again = {}
    end = deadline()
    while not set(released) <= set(again) and time.monotonic() < end:
        for m in records(b):
            b.acknowledge(m, AcknowledgeType.ACCEPT)
            again[m.offset()] = m.delivery_count()
        b.commit_sync()
    if not set(released) <= set(again):
        fail(f"released {released}, second consumer got {sorted(again)}")
    counts = {again[o] for o in released}
    if counts != {2}:
        fail(f"released records came back with delivery counts {counts}, not 2")
    b.close()
    a.close()
    print(f"release: {len(released)} released records delivered again (delivery count 2)")


def child_acquire(args):
    c = share_consumer(args.bootstrap, args.group, args.topic)
    end = deadline()
    while time.monotonic() < end:
        got = records(c)
        if got:
            print(json.dumps([m.offset() for m in got]), flush=True)
            # Holds the records, unacknowledged, until the parent kills this process.
            signal.pause()
    fail("the child got nothing")


def accept_until_received(consumer, wanted, end):
    """Accepts everything `consumer` gets until it has had every offset in `wanted` (or `end`
    passes); returns offset -> delivery count of what it got."""
    got = {}
    while not set(wanted) <= set(got) and time.monotonic() < end:
        for m in records(consumer):
            consumer.acknowledge(m, AcknowledgeType.ACCEPT)
            got[m.offset()] = m.delivery_count()
        consumer.commit_sync()
    return got


def acquire_in_a_killed_child(args, group):
    """A consumer of `group` in a child process acquires records and is SIGKILLed before it
    acknowledges them; returns their offsets."""
    child = subprocess.Popen(
        [sys.executable, __file__, "--bootstrap", args.bootstrap, "--topic", args.topic,
         "--scenario", "child-acquire", "--group", group],
        stdout=subprocess.PIPE, text=True)
    line = child.stdout.readline()
    child.send_signal(signal.SIGKILL)
    child.wait()
    if not line:
        fail("the child printed nothing")
    return json.loads(line)


def group_config(args):
    create_topic(args.bootstrap, args.topic)
    produce(args.bootstrap, args.topic, [f"g{n}" for n in range(10)])
    group = f"{args.topic}-configured"
    admin = AdminClient({"bootstrap.servers": args.bootstrap})

    def alter(*entries):
        return alter_group_configs(admin, group, *entries)

    configs = [("share.auto.offset.reset", "earliest"), ("share.record.lock.duration.ms", "2000"),
               ("share.delivery.count.limit", "2")]
    alter(*configs).result(30)
    resource = ConfigResource(ResourceType.GROUP, group)
    described = admin.describe_configs([resource])[resource].result(30)
    for name, value in configs:
        entry = described.get(name)
        # confluent-kafka gives the source as its number.
        if entry is None or entry.value != value or int(entry.source) != ConfigSource.GROUP_CONFIG.value:
            fail(f"DescribeConfigs reports {name} as {entry} (source {entry.source if entry else None})")
    # A value out of Kafka's bounds, an unknown name, and a heartbeat interval not below the
    # session timeout are refused.
    for entries in [[("share.delivery.count.limit", "11")], [("no.such.config", "1")],
                    [("share.session.timeout.ms", "5000"), ("share.heartbeat.interval.ms", "5000")]]:
        try:
            alter(*entries).result(30)
            fail(f"setting {entries} on a group was accepted")
        except KafkaException as error:
            if error.args[0].code() != KafkaError.INVALID_CONFIG:
                fail(f"setting {entries}: {error}")
    # The broker would start this group at the end of the partition; its config says the
    # beginning, so the child gets records produced before the group existed.
    held = acquire_in_a_killed_child(args, group)
    b = share_consumer(args.bootstrap, group, args.topic)
    # Within 20 s: the group's 2 s lock, not the broker's 30 s one, must have expired.
    got = accept_until_received(b, held, deadline(20))
    if not set(held) <= set(got):
        fail(f"the killed consumer held {held}; after 20 s the other had only {sorted(got)}")
    # The group's delivery-count limit (2), not the broker's (5), archives a poison record.
    release_until_archived(args, b, 2)
    b.close()
    print(f"group-config: earliest start, a 2 s lock and 2 deliveries per group; {len(held)} "
          "records came back")


def killed(args):
    create_topic(args.bootstrap, args.topic)
    produce(args.bootstrap, args.topic, [f"r{n}" for n in range(10)])
    held = acquire_in_a_killed_child(args, "killed")
    b = share_consumer(args.bootstrap, "killed", args.topic)
    got = accept_until_received(b, held, deadline())
    if not set(held) <= set(got):
        fail(f"the killed consumer held {held}; the other got {sorted(got)}")
    if any(got[o] < 2 for o in held):
        fail(f"redelivered records should have delivery count 2: {got}")
    b.close()
    print(f"killed: {len(held)} records held by a killed consumer were delivered again")


def reject(args):
    create_topic(args.bootstrap, args.topic)
    produce(args.bootstrap, args.topic, [f"r{n}" for n in range(10)])
    a = share_consumer(args.bootstrap, "reject", args.topic)
    seen = set()
    rejected = set()
    end = deadline()
    while len(seen) < 10 and time.monotonic() < end:
        for m in records(a):
            if m.offset() % 2 == 0:
                a.acknowledge(m, AcknowledgeType.REJECT)
                rejected.add(m.offset())
            else:
                a.acknowledge(m, AcknowledgeType.ACCEPT)
            seen.add(m.offset())
        a.commit_sync()
    if len(seen) < 10:
        fail(f"the first consumer saw only {sorted(seen)}")
    a.close()
    produce(args.bootstrap, args.topic, ["marker"])
    b = share_consumer(args.bootstrap, "reject", args.topic)
    got = []
    end = deadline()
    while 10 not in got and time.monotonic() < end:
        for m in records(b):
            b.acknowledge(m, AcknowledgeType.ACCEPT)
            got.append(m.offset())
        b.commit_sync()
    if got != [10]:
        fail(f"after rejecting {sorted(rejected)} the second consumer got {got}, not only the marker")
    b.close()
    print(f"reject: {len(rejected)} rejected records never delivered again")


def release_until_archived(args, consumer, limit):
    """Produces a poison record that `consumer` RELEASEs every time it gets it; after `limit`
    deliveries it must be archived: a later marker arrives and the poison never comes again.
    Anything else the consumer gets is accepted."""
    produce(args.bootstrap, args.topic, ["poison"])
    deliveries = []
    marker_sent = False
    marker_seen = False
    end = deadline()
    while not marker_seen and time.monotonic() < end:
        for m in records(consumer):
            if m.value() == b"poison":
                deliveries.append(m.delivery_count())
                consumer.acknowledge(m, AcknowledgeType.RELEASE)
            else:
                consumer.acknowledge(m, AcknowledgeType.ACCEPT)
                marker_seen |= m.value() == b"marker"
        consumer.commit_sync()
        if len(deliveries) >= limit and not marker_sent:
            produce(args.bootstrap, args.topic, ["marker"])
            marker_sent = True
    if not marker_seen:
        fail(f"marker never arrived; poison deliveries {deliveries}")
    if deliveries != list(range(1, limit + 1)):
        fail(f"poison record delivered with counts {deliveries}, expected 1..{limit}")


def poison(args):
    create_topic(args.bootstrap, args.topic)
    c = share_consumer(args.bootstrap, "poison", args.topic)
    release_until_archived(args, c, 3)
    c.close()
    print("poison: archived after 3 deliveries")


def alter_group_configs(admin, group, *entries):
    """IncrementalAlterConfigs SET on a GROUP resource; returns the future."""
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET) for name, value in entries
    ])
    return admin.incremental_alter_configs([resource])[resource]


def accept_values(consumer, wanted, end):
    """Accepts everything `consumer` gets until it has had every value in `wanted` (or `end`
    passes); returns every value received, in order, repeats included."""
    got = []
    while not set(wanted) <= set(got) and time.monotonic() < end:
        for m in records(consumer):
            consumer.acknowledge(m, AcknowledgeType.ACCEPT)
            got.append(m.value().decode())
        consumer.commit_sync()
    return got


def by_duration(args):
    create_topic(args.bootstrap, args.topic)
    now_ms = int(time.time() * 1000)
    producer = Producer({"bootstrap.servers": args.bootstrap, "linger.ms": 5})
    # Five records two hours old (their CreateTime), then five from now.
    for n in range(5):
        producer.produce(args.topic, value=f"old-{n}".encode(), timestamp=now_ms - 2 * 3600 * 1000)
    for n in range(5):
        producer.produce(args.topic, value=f"new-{n}".encode(), timestamp=now_ms)
    if producer.flush(30) != 0:
        fail("produce did not finish")
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    group = f"{args.topic}-last-hour"
    alter_group_configs(admin, group, ("share.auto.offset.reset", "by_duration:PT1H")).result(30)
    try:
        alter_group_configs(admin, group, ("share.auto.offset.reset", "by_duration:-PT1H")).result(30)
        fail("a negative duration was accepted")
    except KafkaException as error:
        if error.args[0].code() != KafkaError.INVALID_CONFIG:
            fail(f"a negative duration: {error}")
    c = share_consumer(args.bootstrap, group, args.topic)
    wanted = [f"new-{n}" for n in range(5)]
    got = accept_values(c, wanted, deadline())
    got += accept_values(c, ["never"], time.monotonic() + 1.0)
    if sorted(got) != wanted:
        fail(f"by_duration:PT1H got {sorted(got)}, wanted only {wanted}")
    c.close()
    print("by-duration: a group starting an hour back got the five recent records only")


def transactions(args):
    create_topic(args.bootstrap, args.topic)
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    committed_group, uncommitted_group = f"{args.topic}-committed", f"{args.topic}-uncommitted"
    for group, level in [(committed_group, "read_committed"), (uncommitted_group, "read_uncommitted")]:
        alter_group_configs(admin, group, ("share.isolation.level", level),
                            ("share.auto.offset.reset", "earliest")).result(30)
        resource = ConfigResource(ResourceType.GROUP, group)
        entry = admin.describe_configs([resource])[resource].result(30).get("share.isolation.level")
        if entry is None or entry.value != level:
            fail(f"DescribeConfigs reports share.isolation.level of {group} as {entry}")

    def txn_producer(name):
        p = Producer({"bootstrap.servers": args.bootstrap, "transactional.id": f"{args.topic}-{name}",
                      "linger.ms": 5})
        p.init_transactions(30)
        return p

    def values(prefix, n):
        return [f"{prefix}{k}" for k in range(n)]

    one, two = txn_producer("one"), txn_producer("two")
    # librdkafka's layout first: an aborted record and its marker, then five committed records
    # and theirs (offsets 0, 1, 2..6, 7).
    aborted, committed = values("aborted-", 1), values("committed-", 5)
    for batch, commit in [(aborted, False), (committed, True)]:
        one.begin_transaction()
        for v in batch:
            one.produce(args.topic, value=v.encode())
        # Written before the abort: an abort purges what the producer has not sent yet.
        one.flush(30)
        one.commit_transaction(30) if commit else one.abort_transaction(30)
    plain = values("plain-", 3)
    produce(args.bootstrap, args.topic, plain)
    # Two producers' transactions interleave; the first commits, the second aborts.
    first, second = values("first-", 4), values("second-", 4)
    one.begin_transaction()
    two.begin_transaction()
    for v in first:
        one.produce(args.topic, value=v.encode())
    for v in second:
        two.produce(args.topic, value=v.encode())
    one.flush(30)
    two.flush(30)
    one.commit_transaction(30)
    two.abort_transaction(30)
    # A transaction left open holds back everything after it from read_committed consumers.
    three = txn_producer("three")
    three.begin_transaction()
    three.produce(args.topic, value=b"open-0")
    three.flush(30)
    produce(args.bootstrap, args.topic, ["after-open"])

    visible = committed + plain + first
    hidden = aborted + second
    late = ["open-0", "after-open"]

    def once(got, wanted, who):
        repeats = sorted({v for v in got if got.count(v) > 1})
        if repeats or set(got) != set(wanted):
            fail(f"{who}: got {sorted(got)} (repeated {repeats}), wanted {sorted(wanted)}")

    uncommitted = share_consumer(args.bootstrap, uncommitted_group, args.topic)
    once(accept_values(uncommitted, visible + hidden + late, deadline()),
         visible + hidden + late, "read_uncommitted")
    reader = share_consumer(args.bootstrap, committed_group, args.topic)
    before = accept_values(reader, visible, deadline())
    # Everything up to the open transaction was delivered; nothing of it or after it may be,
    # and nothing aborted ever.
    before += accept_values(reader, ["never"], time.monotonic() + 1.0)
    once(before, visible, "read_committed before the open transaction ends")
    three.commit_transaction(30)
    after = accept_values(reader, late, deadline())
    once(before + after, visible + late, "read_committed")
    # The last marker came after read_uncommitted had everything: it is read (and archived by
    # the broker) without anything being delivered.
    extra = accept_values(uncommitted, ["never"], time.monotonic() + 1.0)
    if extra:
        fail(f"read_uncommitted got {extra} after the last commit")
    reader.close()
    uncommitted.close()
    print(f"transactions: read_committed got {len(visible) + len(late)} records, never the "
          f"{len(hidden)} aborted; read_uncommitted got all {len(visible) + len(hidden) + len(late)}")


def pubsub(args):
    create_topic(args.bootstrap, args.topic)
    total = 100
    produce(args.bootstrap, args.topic, [f"r{n}" for n in range(total)])
    classic = Consumer({"bootstrap.servers": args.bootstrap, "group.id": "pubsub-consumers",
                        "auto.offset.reset": "earliest"})
    classic.subscribe([args.topic])
    share = share_consumer(args.bootstrap, "pubsub-share", args.topic)
    from_classic, from_share = set(), set()
    end = deadline()
    while (len(from_classic) < total or len(from_share) < total) and time.monotonic() < end:
        m = classic.poll(0.1)
        if m is not None and not m.error():
            from_classic.add(m.offset())
        for m in records(share, 0.1):
            share.acknowledge(m, AcknowledgeType.ACCEPT)
            from_share.add(m.offset())
        share.commit_sync()
    if from_classic != set(range(total)) or from_share != set(range(total)):
        fail(f"consumer group saw {len(from_classic)}, share group {len(from_share)} of {total}")
    share.close()
    classic.close()
    print("pubsub: the consumer group and the share group each saw every record")


def moving(args):
    """Three share consumers take records while the partition moves between two brokers, in
    the middle of consumption, `MOVES` times. Every acknowledgement's outcome is taken from the
    client's acknowledgement-commit callback, record by record."""
    if not (args.strata and args.storage and args.brokers):
        fail("moving needs --strata, --storage and --brokers")
    brokers = [int(b) for b in args.brokers.split(",")]
    create_topic(args.bootstrap, args.topic)
    chunk, moves = 120, 4
    total = chunk * (moves + 1)
    lock = threading.Lock()
    progress = threading.Condition(lock)
    confirmed = {}      # offset -> how many accepts the broker confirmed (must end at 1 each)
    delivered = {}      # offset -> delivery counts seen, in order
    refused = set()     # offsets whose accept the broker refused (e.g. sent to the old owner)
    late = []           # offsets delivered after their accept was confirmed
    errors = []
    done = threading.Event()
    moved = threading.Event()
    held = []           # what the holder kept across the first move

    def on_ack(offsets, error):
        with progress:
            for tp, acked in offsets.items():
                for o in acked:
                    if error is None:
                        confirmed[o] = confirmed.get(o, 0) + 1
                    else:
                        refused.add(o)
            progress.notify_all()

    def consume(c, batch):
        with lock:
            for m in batch:
                if confirmed.get(m.offset()):
                    late.append(m.offset())
                delivered.setdefault(m.offset(), []).append(m.delivery_count())
        for m in batch:
            c.acknowledge(m, AcknowledgeType.ACCEPT)
        c.commit_sync()

    def accepted():
        return sum(1 for n in confirmed.values() if n > 0)

    def run(i):
        try:
            c = share_consumer(args.bootstrap, "moving", args.topic, **{"max.poll.records": 5})
            c.set_acknowledgement_commit_callback(on_ack)
            end = deadline(90)
            while not done.is_set() and time.monotonic() < end:
                got = records(c, 0.2)
                if i == 0 and got and not moved.is_set() and not held:
                    # The holder keeps its first records, unacknowledged, across the first
                    # move: the new owner must offer them again, and accepting them at the old
                    # owner must not be confirmed.
                    with progress:
                        held.extend(m.offset() for m in got)
                        progress.notify_all()
                    moved.wait(60)
                consume(c, got)
            c.close()
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(f"consumer {i}: {e!r}")
            done.set()

    def leader():
        admin = AdminClient({"bootstrap.servers": args.bootstrap})
        return admin.list_topics(args.topic, timeout=10).topics[args.topic].partitions[0].leader

    def move_to(target):
        env = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}
        started = time.monotonic()
        finished = subprocess.run(
            [args.strata, "partitions", "move", args.topic, "0", "--to", str(target),
             "--timeout", "20s", "--storage", args.storage],
            env=env, capture_output=True, text=True, timeout=60)
        if finished.returncode != 0:
            fail(f"strata partitions move to {target}: {finished.stderr.strip()}")
        return time.monotonic() - started, finished.stdout

    def move_away():
        """Moves the partition to another broker than its owner. The owner comes from
        metadata, which another broker may answer from a view a moment old (seen once in CI
        on S3 right after the topic was created): then the move names the broker that already
        owns it, the tool says so and nothing moves, and the partition goes to the other one."""
        owner = leader()
        first = next(b for b in brokers if b != owner)
        for target in [first] + [b for b in brokers if b != first]:
            took, said = move_to(target)
            if "is already on broker" not in said:
                return took
        fail(f"no move happened: {said.strip()}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    # The holder starts alone and the others only once it holds records: started together,
    # the other two could accept half the first chunk before the holder's first fetch, and
    # the first move would come with nothing held (seen once in CI on S3).
    threads[0].start()
    took = []
    for k in range(moves + 1):
        produce(args.bootstrap, args.topic, [f"r{n}" for n in range(k * chunk, (k + 1) * chunk)])
        if k == 0:
            with progress:
                if not progress.wait_for(lambda: held or errors, 60):
                    fail("the holder got nothing before the first move")
            for t in threads[1:]:
                t.start()
        if k == moves:
            break
        # Move once the group is half-way through this chunk: records are acquired, some
        # acknowledged, some not yet fetched.
        with progress:
            if not progress.wait_for(lambda: accepted() >= k * chunk + chunk // 2 or errors, 60):
                fail(f"before move {k + 1}: only {accepted()} records accepted")
        took.append(move_away())
        moved.set()
    with progress:
        progress.wait_for(lambda: accepted() >= total or errors, 60)
    done.set()
    for t in threads:
        t.join(60)
    if errors:
        fail("; ".join(errors))
    twice = sorted(o for o, n in confirmed.items() if n > 1)
    missing = sorted(set(range(total)) - {o for o, n in confirmed.items() if n > 0})
    if twice or missing or late:
        fail(f"accepts confirmed twice {twice[:20]}, never {missing[:20]}, "
             f"delivered after a confirmed accept {late[:20]}")
    if not held:
        fail("the holder got nothing before the first move")
    for o in held:
        if confirmed.get(o) != 1 or len(delivered.get(o, [])) < 2:
            fail(f"held offset {o}: confirmed {confirmed.get(o)}, deliveries {delivered.get(o)}")
    again = sorted(o for o, counts in delivered.items() if len(counts) > 1)
    print(f"moving: {total} records each accepted once across {moves} moves "
          f"({', '.join(f'{t * 1000:.0f} ms' for t in took)}); {len(refused)} accepts refused "
          f"and {len(again)} records delivered again (the holder's {len(held)} among them)",
          flush=True)


def restart_a(args):
    create_topic(args.bootstrap, args.topic)
    produce(args.bootstrap, args.topic, [f"r{n}" for n in range(100)])
    c = share_consumer(args.bootstrap, "restart", args.topic)
    accepted = set()
    end = deadline()
    while len(accepted) < 50 and time.monotonic() < end:
        for m in records(c):
            if m.offset() < 50:
                c.acknowledge(m, AcknowledgeType.ACCEPT)
                accepted.add(m.offset())
        c.commit_sync()
    if accepted != set(range(50)):
        fail(f"accepted {sorted(accepted)}")
    print("restart-a: accepted 0..49", flush=True)
    # No close: the broker is killed next, as if consumer and broker died together.
    os._exit(0)


def restart_b(args):
    c = share_consumer(args.bootstrap, "restart", args.topic)
    got = set()
    end = deadline()
    while len(got) < 50 and time.monotonic() < end:
        for m in records(c):
            if m.offset() < 50:
                fail(f"offset {m.offset()} was accepted before the restart and delivered again")
            c.acknowledge(m, AcknowledgeType.ACCEPT)
            got.add(m.offset())
        c.commit_sync()
    if got != set(range(50, 100)):
        fail(f"after the restart got {sorted(got)}")
    c.close()
    print("restart-b: only the 50 unacknowledged records were delivered after the restart")


SCENARIOS = {
    "six": six,
    "release": release,
    "killed": killed,
    "child-acquire": child_acquire,
    "reject": reject,
    "poison": poison,
    "pubsub": pubsub,
    "group-config": group_config,
    "transactions": transactions,
    "by-duration": by_duration,
    "moving": moving,
    "restart-a": restart_a,
    "restart-b": restart_b,
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    parser.add_argument("--group", default="killed", help="child-acquire: the share group to join")
    parser.add_argument("--strata", help="moving: the strata binary, for `strata partitions move`")
    parser.add_argument("--storage", help="moving: the cluster's storage URL")
    parser.add_argument("--brokers", help="moving: the cluster's broker ids, comma-separated")
    args = parser.parse_args()
    SCENARIOS[args.scenario](args)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

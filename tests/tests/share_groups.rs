//! Share groups (KIP-932) end to end: the real `strata` binary and confluent-kafka's
//! `ShareConsumer` (tests/python/share_groups.py, one scenario per test; the script checks
//! what each delivers and acknowledges and says what went wrong).

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(clippy::disallowed_methods)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use strata_tests::cluster::Cluster;
use strata_tests::command::run_with_deadline;
use strata_tests::{StrataOptions, StrataProcess};

/// Records start at the log start (records produced before the consumers join are theirs),
/// locks last 3 s (a killed consumer's records come back quickly), and a record is archived
/// after 3 deliveries. The classic group of the pub/sub case rebalances at once.
fn start_broker() -> StrataProcess {
    StrataProcess::start_with(StrataOptions::default().with_args([
        "--group-initial-rebalance-delay",
        "0s",
        "--share-auto-offset-reset",
        "earliest",
        "--group-share-record-lock-duration",
        "3s",
        "--group-share-delivery-count-limit",
        "3",
        "--metrics-listen",
        "127.0.0.1:0",
    ]))
}

fn run_scenario(broker: &StrataProcess, scenario: &str, topic: &str) {
    run_scenario_on(&broker.bootstrap(), scenario, topic);
}

fn run_scenario_on(bootstrap: &str, scenario: &str, topic: &str) {
    run_scenario_with(bootstrap, scenario, topic, &[]);
}

fn run_scenario_with(bootstrap: &str, scenario: &str, topic: &str, extra: &[&str]) {
    let started = Instant::now();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/share_groups.py");
    let mut command = Command::new("python3");
    command
        .arg(&script)
        .arg("--bootstrap")
        .arg(bootstrap)
        .arg("--topic")
        .arg(topic)
        .arg("--scenario")
        .arg(scenario)
        .args(extra);
    let finished = run_with_deadline(command, b"", Duration::from_secs(120));
    finished.assert_success("tests/python/share_groups.py");
    eprintln!(
        "{}share groups {scenario}: {:.1?}",
        finished.stdout,
        started.elapsed()
    );
}

/// Per-group configs on a broker left at its defaults (latest start, 30 s locks): the group's
/// `share.auto.offset.reset` and `share.record.lock.duration.ms` decide instead.
#[test]
fn a_share_groups_own_configs_set_its_start_and_its_lock_duration() {
    let broker = StrataProcess::start_with(
        StrataOptions::default().with_args(["--metrics-listen", "127.0.0.1:0"]),
    );
    run_scenario(&broker, "group-config", "share-group-config");
    // The killed consumer's records came back: the share partition's own series counts them
    // as redelivered, as the broker-wide one does (this broker served no other share group).
    let series = |outcome: &str| {
        format!(
            "strata_share_partition_records_total{{group=\"share-group-config-configured\",\
             topic=\"share-group-config\",partition=\"0\",outcome=\"{outcome}\"}}"
        )
    };
    let redelivered = broker.metric(&series("redelivered")).unwrap_or(0.0);
    assert!(redelivered >= 1.0, "redelivered {redelivered}");
    assert_eq!(
        broker.metric("strata_share_records_total{outcome=\"redelivered\"}"),
        Some(redelivered)
    );
    assert!(broker.metric(&series("accepted")).unwrap_or(0.0) >= redelivered);
}

/// Two brokers whose share groups start at the log start and lock records for 3 s.
fn share_cluster() -> Cluster {
    Cluster::start_with_env(
        2,
        "3s",
        "500ms",
        &[
            ("STRATA_SHARE_AUTO_OFFSET_RESET", "earliest"),
            ("STRATA_GROUP_SHARE_RECORD_LOCK_DURATION", "3s"),
        ],
    )
}

fn scenario(name: &str) {
    let broker = start_broker();
    run_scenario(&broker, name, &format!("share-{name}"));
}

/// `share.isolation.level` per group over aborted, committed, interleaved and open
/// transactions (the script checks what each group gets). Then both groups' backlog is empty:
/// every record accepted and every transaction marker archived by the broker, none left
/// waiting for an acknowledgement no client sends.
#[test]
fn share_groups_see_transactions_by_their_isolation_level_and_never_a_marker() {
    let broker = start_broker();
    run_scenario(&broker, "transactions", "share-txn");
    for level in ["committed", "uncommitted"] {
        let series = format!(
            "strata_share_partition_backlog{{group=\"share-txn-{level}\",topic=\"share-txn\",\
             partition=\"0\"}}"
        );
        assert_eq!(broker.metric(&series), Some(0.0), "{series}");
    }
}

#[test]
fn a_share_group_can_start_a_duration_back_in_time() {
    scenario("by-duration");
}

#[test]
fn six_share_consumers_on_one_partition_all_receive_and_accept_every_record_once() {
    scenario("six");
}

#[test]
fn records_a_consumer_releases_are_delivered_again() {
    scenario("release");
}

#[test]
fn records_of_a_killed_consumer_are_delivered_again_after_the_lock_duration() {
    scenario("killed");
}

#[test]
fn rejected_records_are_not_delivered_again() {
    scenario("reject");
}

#[test]
fn a_poison_record_is_archived_at_the_delivery_count_limit() {
    scenario("poison");
}

#[test]
fn a_consumer_group_and_a_share_group_on_one_topic_each_see_everything() {
    scenario("pubsub");
}

#[test]
fn acknowledgements_survive_a_broker_kill() {
    let mut broker = start_broker();
    run_scenario(&broker, "restart-a", "share-restart");
    broker.kill9();
    broker.restart();
    run_scenario(&broker, "restart-b", "share-restart");
}

/// Two brokers: half the records are accepted through the partition's first owner, the
/// partition moves to the other broker, and only the other half is delivered from there: the
/// share state moved with the partition (the records still acquired at the move come back at
/// once, acquisition not being stored). The share group's coordinator shard is wherever the
/// cluster placed it, often not with the partition.
#[test]
fn acknowledgements_move_with_the_partition_to_another_broker() {
    let cluster = share_cluster();
    let ids = cluster.all_ids();
    let bootstrap = cluster.bootstrap_of(&ids);
    run_scenario_on(&bootstrap, "restart-a", "share-moved");
    let owner =
        cluster.wait_for_leaders(ids[0], "share-moved", 1, &ids, "the topic has an owner")[&0];
    let target = *ids.iter().find(|&&id| id != owner).unwrap();
    eprintln!("share-moved/0 moves from broker {owner} to {target}");
    cluster.move_partition("share-moved", 0, target);
    run_scenario_on(&bootstrap, "restart-b", "share-moved");
}

/// Three share consumers take records while the partition moves between two brokers four
/// times, each move in the middle of consumption (half of a freshly produced chunk accepted),
/// one consumer holding records it acquired before the first move and acknowledging them
/// after it. The script follows every acknowledgement's outcome record by record (the client's
/// acknowledgement-commit callback): every record's accept is confirmed exactly once, no
/// record is delivered after its accept was confirmed, and the held records' late accepts are
/// refused and the records delivered again.
#[test]
fn moves_in_the_middle_of_consumption_lose_no_acknowledgement_and_redeliver_only_unacknowledged() {
    let cluster = share_cluster();
    let ids = cluster.all_ids();
    let brokers: Vec<String> = ids.iter().map(i32::to_string).collect();
    let binary = strata_tests::binary::strata_binary()
        .to_string_lossy()
        .into_owned();
    run_scenario_with(
        &cluster.bootstrap_of(&ids),
        "moving",
        "share-moving",
        &[
            "--strata",
            &binary,
            "--storage",
            cluster.storage.url(),
            "--brokers",
            &brokers.join(","),
        ],
    );
}

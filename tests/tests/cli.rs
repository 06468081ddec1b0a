//! The operator CLI as an operator runs it: the real `strata` binary's `topic`, `group`,
//! `produce`, `consume`, `cluster status` and `broker drain|undrain` commands against real
//! brokers, checking what `--json` prints (and that a librdkafka consumer's commits show up
//! as lag), plus the edges: a mistyped storage URL, draining the only broker.

// A failed expectation in a test is a panic; helpers here are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::Value;
use strata_tests::binary::strata_binary;
use strata_tests::clients::{base_config, TestContext};
use strata_tests::cluster::Cluster;
use strata_tests::command::{run_with_deadline, Finished};
use strata_tests::wait::{wait_until, DEADLINE};
use strata_tests::StrataProcess;

fn strata(args: &[&str], stdin: &[u8]) -> Finished {
    let mut command = Command::new(strata_binary());
    command.args(args);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("STRATA_") {
            command.env_remove(name);
        }
    }
    run_with_deadline(command, stdin, DEADLINE)
}

/// Runs a Kafka-protocol command against `bootstrap` with `--json`; it must succeed and print
/// one JSON document.
fn json(bootstrap: &str, args: &[&str]) -> Value {
    json_with_stdin(bootstrap, args, b"")
}

fn json_with_stdin(bootstrap: &str, args: &[&str], stdin: &[u8]) -> Value {
    let mut all = args.to_vec();
    all.extend(["--bootstrap-server", bootstrap, "--json"]);
    let finished = strata(&all, stdin);
    finished.assert_success(&format!("strata {}", args.join(" ")));
    serde_json::from_str(&finished.stdout).unwrap_or_else(|e| {
        panic!(
            "strata {} printed no JSON ({e}):\n{}",
            args.join(" "),
            finished.stdout
        )
    })
}

fn failure(args: &[&str]) -> Finished {
    let finished = strata(args, b"");
    assert!(
        !finished.status.success(),
        "strata {} succeeded but should have failed:\n{}",
        args.join(" "),
        finished.stdout
    );
    finished
}

fn partition<'a>(rows: &'a Value, topic: &str, partition: i64) -> &'a Value {
    rows.as_array()
        .unwrap()
        .iter()
        .find(|r| r["topic"] == topic && r["partition"] == partition)
        .unwrap_or_else(|| panic!("no {topic}-{partition} in {rows}"))
}

fn group_consumer(bootstrap: &str, group: &str) -> BaseConsumer<TestContext> {
    let mut config = base_config(bootstrap);
    config
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("session.timeout.ms", "6000")
        .set("auto.offset.reset", "earliest");
    config.create_with_context(TestContext).unwrap()
}

#[test]
fn topic_group_produce_and_consume_commands_against_a_running_broker() {
    let broker = StrataProcess::start();
    let b = broker.bootstrap();
    let b = b.as_str();

    let created = json(
        b,
        &[
            "topic",
            "create",
            "orders",
            "--partitions",
            "2",
            "--config",
            "retention.ms=3600000",
        ],
    );
    assert_eq!(created["partitions"], 2, "{created}");
    let listed = json(b, &["topic", "list"]);
    let orders = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "orders")
        .unwrap_or_else(|| panic!("orders not listed: {listed}"));
    assert_eq!(orders["partitions"], 2);
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["internal"] == false),
        "internal topics are listed only with --all: {listed}"
    );
    let described = json(b, &["topic", "describe", "orders"]);
    assert_eq!(described["partitions"].as_array().unwrap().len(), 2);
    assert_eq!(
        described["configs"]["retention.ms"]["value"], "3600000",
        "{described}"
    );
    assert_eq!(described["configs"]["retention.ms"]["source"], "topic");

    json(
        b,
        &[
            "topic",
            "alter-config",
            "orders",
            "--set",
            "retention.ms=7200000",
        ],
    );
    let described = json(b, &["topic", "describe", "orders"]);
    assert_eq!(
        described["configs"]["retention.ms"]["value"], "7200000",
        "{described}"
    );

    json(
        b,
        &["topic", "add-partitions", "orders", "--partitions", "3"],
    );
    let described = json(b, &["topic", "describe", "orders"]);
    assert_eq!(
        described["partitions"].as_array().unwrap().len(),
        3,
        "{described}"
    );

    let produced = json(
        b,
        &[
            "produce",
            "orders",
            "--partition",
            "1",
            "--value",
            "a",
            "--value",
            "b",
        ],
    );
    assert_eq!(
        (
            produced["first_offset"].as_i64(),
            produced["last_offset"].as_i64()
        ),
        (Some(0), Some(1))
    );
    // Lines of stdin, one record each.
    let produced = json_with_stdin(b, &["produce", "orders", "--partition", "1"], b"c\nd\n");
    assert_eq!(
        (
            produced["count"].as_i64(),
            produced["first_offset"].as_i64()
        ),
        (Some(2), Some(2))
    );
    let described = json(b, &["topic", "describe", "orders"]);
    let p1 = &described["partitions"].as_array().unwrap()[1];
    assert_eq!(
        (
            p1["log_start_offset"].as_i64(),
            p1["log_end_offset"].as_i64()
        ),
        (Some(0), Some(4))
    );

    let consumed = json(
        b,
        &[
            "consume",
            "orders",
            "--partition",
            "1",
            "--offset",
            "1",
            "--count",
            "3",
        ],
    );
    let values: Vec<&str> = consumed
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["value"].as_str().unwrap())
        .collect();
    assert_eq!(values, ["b", "c", "d"], "{consumed}");
    assert_eq!(consumed[0]["offset"], 1);

    // A librdkafka consumer commits offset 1 of partition 1 for group "billing".
    {
        let consumer = group_consumer(b, "billing");
        let mut offsets = TopicPartitionList::new();
        offsets
            .add_partition_offset("orders", 1, Offset::Offset(1))
            .unwrap();
        consumer.commit(&offsets, CommitMode::Sync).unwrap();
    }
    let groups = json(b, &["group", "list"]);
    assert!(
        groups
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["group"] == "billing"),
        "{groups}"
    );
    let lag = json(b, &["group", "lag", "billing"]);
    let row = partition(&lag["partitions"], "orders", 1);
    assert_eq!(
        (
            row["committed_offset"].as_i64(),
            row["log_end_offset"].as_i64(),
            row["lag"].as_i64()
        ),
        (Some(1), Some(4), Some(3)),
        "{lag}"
    );
    assert_eq!(lag["total_lag"], 3);

    // Without --execute nothing moves.
    let plan = json(
        b,
        &[
            "group",
            "reset-offsets",
            "billing",
            "--topic",
            "orders",
            "--to-latest",
        ],
    );
    assert_eq!(plan["executed"], false);
    assert_eq!(
        partition(&plan["partitions"], "orders", 1)["new_offset"],
        4,
        "{plan}"
    );
    assert_eq!(json(b, &["group", "lag", "billing"])["total_lag"], 3);
    json(
        b,
        &[
            "group",
            "reset-offsets",
            "billing",
            "--topic",
            "orders",
            "--shift-by",
            "-1",
            "--execute",
        ],
    );
    let lag = json(b, &["group", "lag", "billing"]);
    assert_eq!(
        partition(&lag["partitions"], "orders", 1)["committed_offset"],
        0,
        "{lag}"
    );
    json(
        b,
        &[
            "group",
            "reset-offsets",
            "billing",
            "--topic",
            "orders",
            "--to-latest",
            "--execute",
        ],
    );
    let lag = json(b, &["group", "lag", "billing"]);
    assert_eq!(
        partition(&lag["partitions"], "orders", 1)["lag"],
        0,
        "{lag}"
    );
    assert_eq!(
        partition(&lag["partitions"], "orders", 0)["log_end_offset"],
        0,
        "{lag}"
    );

    // A group with a live member is not reset, as Kafka's tool refuses.
    {
        let member = group_consumer(b, "live");
        member.subscribe(&["orders"]).unwrap();
        wait_until("the live group's member has partitions", DEADLINE, || {
            let _ = member.poll(Duration::from_millis(100));
            (member.assignment().map(|a| a.count()).unwrap_or(0) > 0).then_some(())
        });
        let refused = failure(&[
            "group",
            "reset-offsets",
            "live",
            "--topic",
            "orders",
            "--to-earliest",
            "--execute",
            "--bootstrap-server",
            b,
        ]);
        assert!(
            refused.stderr.contains("active member"),
            "{}",
            refused.stderr
        );
        let described = json(b, &["group", "describe", "live"]);
        assert_eq!(
            described["members"].as_array().unwrap().len(),
            1,
            "{described}"
        );
    }

    json(b, &["group", "delete", "billing"]);
    let groups = json(b, &["group", "list"]);
    assert!(
        !groups
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["group"] == "billing"),
        "{groups}"
    );
    json(b, &["topic", "delete", "orders"]);
    let listed = json(b, &["topic", "list"]);
    assert!(
        !listed
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "orders"),
        "{listed}"
    );

    // Errors that say what to do.
    let unknown = failure(&["topic", "describe", "orders", "--bootstrap-server", b]);
    assert!(
        unknown.stderr.contains("does not exist"),
        "{}",
        unknown.stderr
    );
    assert!(
        unknown.stderr.contains("strata topic list"),
        "{}",
        unknown.stderr
    );
}

#[test]
fn an_unreachable_bootstrap_server_is_an_error_that_names_the_flag() {
    // A port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let address = format!("127.0.0.1:{port}");
    let refused = failure(&["topic", "list", "--bootstrap-server", &address]);
    assert!(
        refused.stderr.contains("cannot connect"),
        "{}",
        refused.stderr
    );
    assert!(
        refused.stderr.contains("--bootstrap-server"),
        "{}",
        refused.stderr
    );
}

#[test]
fn admin_commands_refuse_a_storage_url_where_no_cluster_exists_and_create_nothing() {
    let scratch = tempfile::tempdir().unwrap();
    let missing = scratch.path().join("typo");
    let url = missing.to_str().unwrap();
    let file_url = format!("file://{url}");
    for args in [
        vec!["broker", "drain", "1", "--storage", url],
        vec!["broker", "undrain", "1", "--storage", url],
        vec![
            "partitions",
            "move",
            "my-topic",
            "0",
            "--to",
            "1",
            "--storage",
            url,
        ],
        vec!["cluster", "status", "--storage", &file_url],
    ] {
        let refused = failure(&args);
        assert!(
            refused.stderr.contains("no Strata cluster") && refused.stderr.contains("--storage"),
            "strata {}: {}",
            args.join(" "),
            refused.stderr
        );
        assert!(!missing.exists(), "strata {} created {url}", args.join(" "));
    }
    // An existing but empty directory is no cluster either.
    let empty = scratch.path().to_str().unwrap();
    let refused = failure(&["broker", "drain", "1", "--storage", empty]);
    assert!(
        refused.stderr.contains("no broker has registered"),
        "{}",
        refused.stderr
    );
}

#[test]
fn draining_the_only_broker_is_refused_and_undrain_cancels_a_drain() {
    let mut cluster = Cluster::start(1, "3s", "500ms");
    let refused = cluster.admin_command(&["broker", "drain", "1"]);
    assert!(
        !refused.status.success(),
        "draining the only broker was accepted"
    );
    assert!(refused.stderr.contains("leaderless"), "{}", refused.stderr);
    assert!(refused.stderr.contains("--force"), "{}", refused.stderr);

    cluster.add_broker(2, "3s", "500ms");
    cluster.wait_until_settled();
    let status = |cluster: &Cluster| -> Value {
        let finished = cluster.admin_command(&["cluster", "status", "--json"]);
        finished.assert_success("strata cluster status");
        serde_json::from_str(&finished.stdout).unwrap()
    };
    let broker = |status: &Value, id: i64| -> Value {
        status["brokers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("broker {id} not in {status}"))
    };
    let before = status(&cluster);
    assert_eq!(before["brokers"].as_array().unwrap().len(), 2, "{before}");
    let leases = before["partitions"].as_array().unwrap();
    assert!(
        leases
            .iter()
            .any(|p| p["topic"] == "__consumer_offsets" && p["state"] == "Active"),
        "{before}"
    );

    let drained = cluster.admin_command(&["broker", "drain", "1", "--timeout", "30s"]);
    drained.assert_success("strata broker drain 1");
    let during = status(&cluster);
    assert_eq!(broker(&during, 1)["draining"], true, "{during}");
    assert_eq!(broker(&during, 1)["partitions"], 0, "{during}");

    let undrained = cluster.admin_command(&["broker", "undrain", "1"]);
    undrained.assert_success("strata broker undrain 1");
    wait_until("broker 1 is no longer draining", DEADLINE, || {
        let now = status(&cluster);
        (broker(&now, 1)["draining"] == false).then_some(())
    });
    let again = cluster.admin_command(&["broker", "undrain", "1"]);
    assert!(
        !again.status.success(),
        "a second undrain found a request to cancel"
    );
    // Broker 1 can take partitions again: a move to it completes.
    cluster.move_partition("__consumer_offsets", 0, 1);
}

#[test]
fn serve_help_names_every_backend_and_the_log_settings_defaults() {
    let help = strata(&["serve", "--help"], b"");
    help.assert_success("strata serve --help");
    for needle in [
        "s3://",
        "rados://",
        "cache_bytes: memory for the shared tail cache [default: 256MiB]",
        "handover_timeout",
    ] {
        assert!(
            help.stdout.contains(needle),
            "serve --help lacks {needle:?}:\n{}",
            help.stdout
        );
    }
}

#[test]
fn completions_are_printed_for_bash_zsh_and_fish() {
    for shell in ["bash", "zsh", "fish"] {
        let script = strata(&["completions", shell], b"");
        script.assert_success(&format!("strata completions {shell}"));
        assert!(
            script.stdout.contains("reset-offsets") && script.stdout.contains("bootstrap-server"),
            "{shell} completions lack the subcommands"
        );
    }
}

/// Two brokers sent SIGTERM at the same moment each used to wait out its whole shutdown grace
/// for the other to take its partitions (which, draining too, never did). Now each sees that
/// no live broker is left to take them and leaves at once; what they acknowledged is served
/// again once brokers start.
#[test]
fn two_brokers_stopped_together_leave_at_once_and_lose_nothing() {
    // A grace far beyond the deadline below: only leaving early passes.
    let mut cluster = Cluster::start_with_env(2, "3s", "500ms", &[("STRATA_SHUTDOWN_GRACE", "5m")]);
    let bootstrap = cluster.bootstrap_of(&[1, 2]);
    let b = bootstrap.as_str();
    json(b, &["topic", "create", "together", "--partitions", "4"]);
    let leaders: Vec<i64> =
        wait_until("every partition of together has a leader", DEADLINE, || {
            let described = json(b, &["topic", "describe", "together"]);
            let leaders: Vec<i64> = described["partitions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["leader"].as_i64().unwrap())
                .collect();
            leaders.iter().all(|l| *l > 0).then_some(leaders)
        });
    eprintln!("leaders before the stop: {leaders:?}");
    for p in 0..4 {
        let value = format!("record-{p}");
        json(
            b,
            &[
                "produce",
                "together",
                "--partition",
                &p.to_string(),
                "--value",
                &value,
            ],
        );
    }

    for id in [1, 2] {
        cluster.broker(id).send_sigterm();
    }
    for id in [1, 2] {
        let status = cluster
            .broker(id)
            .wait_for_exit(Duration::from_secs(30))
            .unwrap_or_else(|| {
                panic!(
                    "broker {id} still running 30 s after SIGTERM (grace 5 m)\n{}",
                    cluster.broker(id).log_tail()
                )
            });
        assert!(status.success(), "broker {id} exited with {status}");
    }

    for id in [1, 2] {
        cluster.broker(id).restart();
    }
    for p in 0..4 {
        let expected = format!("record-{p}");
        wait_until(
            &format!("together-{p} serves its record again"),
            DEADLINE,
            || {
                let mut command = Command::new(strata_binary());
                command.args([
                    "consume",
                    "together",
                    "--partition",
                    &p.to_string(),
                    "--count",
                    "1",
                    "--timeout",
                    "2s",
                    "--json",
                    "--bootstrap-server",
                    b,
                ]);
                let finished = run_with_deadline(command, b"", DEADLINE);
                if !finished.status.success() {
                    return None;
                }
                let records: Value = serde_json::from_str(&finished.stdout).ok()?;
                (records[0]["value"] == expected.as_str()).then_some(())
            },
        );
    }
}

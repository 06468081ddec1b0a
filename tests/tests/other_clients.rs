//! Clients other than rdkafka against the same binary: kcat (librdkafka's command-line tool,
//! Debian package `kcat`), Python's confluent-kafka (tests/python/roundtrip.py),
//! kafka-python, which unlike librdkafka uses incremental fetch sessions
//! (tests/python/fetch_sessions.py), and two clients with protocol code of their own:
//! aiokafka (tests/python/aiokafka_clients.py) and kafkajs (tests/js/clients.js, its package
//! pinned in tests/js/package-lock.json). Each test fails, rather than skips, when its client is
//! missing: `.ci/run` installs them.

// A failed expectation in a test is a panic; helpers here are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use strata_tests::command::{is_installed, run_with_deadline};
use strata_tests::StrataProcess;

const CLIENT_DEADLINE: Duration = Duration::from_secs(60);

fn kcat(broker: &StrataProcess, args: &[&str]) -> Command {
    assert!(
        is_installed("kcat"),
        "kcat is not installed (Debian package kcat; .ci/run installs it)"
    );
    let mut command = Command::new("kcat");
    command.arg("-b").arg(broker.bootstrap()).args(args);
    command
}

/// Lines of the form key:value, some values with colons and spaces in them.
fn kcat_input() -> Vec<String> {
    (0..50)
        .map(|i| format!("key-{i}:value {i}: with a colon"))
        .collect()
}

#[test]
fn kcat_produces_lines_and_consumes_them_back_in_order() {
    let broker = StrataProcess::start();
    let topic = "kcat-lines";
    let lines = kcat_input();
    let input = lines.join("\n") + "\n";

    // -K: splits each line at the first colon into key and value.
    let produced = run_with_deadline(
        kcat(
            &broker,
            &["-P", "-t", topic, "-p", "0", "-K", ":", "-z", "snappy"],
        ),
        input.as_bytes(),
        CLIENT_DEADLINE,
    );
    produced.assert_success("kcat -P");

    let consumed = run_with_deadline(
        kcat(
            &broker,
            &[
                "-C",
                "-t",
                topic,
                "-p",
                "0",
                "-o",
                "beginning",
                "-e",
                "-f",
                "%o|%k:%s\n",
            ],
        ),
        b"",
        CLIENT_DEADLINE,
    );
    consumed.assert_success("kcat -C");
    let expected: Vec<String> = lines
        .iter()
        .enumerate()
        .map(|(offset, line)| format!("{offset}|{line}"))
        .collect();
    let got: Vec<&str> = consumed.stdout.lines().collect();
    assert_eq!(
        got, expected,
        "kcat -C output\n--- stderr ---\n{}",
        consumed.stderr
    );
}

#[test]
fn kcat_metadata_lists_the_topic_led_by_the_broker_it_asked() {
    let broker = StrataProcess::start();
    let topic = "kcat-metadata";
    run_with_deadline(
        kcat(&broker, &["-P", "-t", topic, "-p", "0"]),
        b"one record\n",
        CLIENT_DEADLINE,
    )
    .assert_success("kcat -P");

    let listed = run_with_deadline(
        kcat(&broker, &["-L", "-J", "-t", topic]),
        b"",
        CLIENT_DEADLINE,
    );
    listed.assert_success("kcat -L");
    let metadata: serde_json::Value = serde_json::from_str(&listed.stdout)
        .unwrap_or_else(|e| panic!("kcat -L -J printed invalid JSON ({e}):\n{}", listed.stdout));

    let brokers = metadata["brokers"].as_array().expect("brokers array");
    assert_eq!(brokers.len(), 1, "one broker in {metadata}");
    assert_eq!(
        brokers[0]["name"].as_str(),
        Some(broker.bootstrap().as_str()),
        "the advertised address is the one clients connected to"
    );
    let broker_id = brokers[0]["id"].as_i64().expect("broker id");

    let topics = metadata["topics"].as_array().expect("topics array");
    let described = topics
        .iter()
        .find(|t| t["topic"].as_str() == Some(topic))
        .unwrap_or_else(|| panic!("{topic} missing from {metadata}"));
    assert!(
        described.get("error").is_none(),
        "topic error in {described}"
    );
    let partitions = described["partitions"]
        .as_array()
        .expect("partitions array");
    assert!(
        !partitions.is_empty(),
        "{topic} has no partitions: {described}"
    );
    for partition in partitions {
        assert_eq!(
            partition["leader"].as_i64(),
            Some(broker_id),
            "leader of {partition}"
        );
    }
}

#[test]
fn python_confluent_kafka_round_trips_keys_headers_and_gzip_values() {
    let broker = StrataProcess::start();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/roundtrip.py");
    let mut command = Command::new("python3");
    command
        .arg(&script)
        .arg("--bootstrap")
        .arg(broker.bootstrap())
        .arg("--topic")
        .arg("python-round-trip");
    let finished = run_with_deadline(command, b"", CLIENT_DEADLINE);
    finished.assert_success("tests/python/roundtrip.py");
    eprintln!("{}", finished.stdout);
}

/// kafka-python consumes 60 partitions through one fetch session: the broker creates it, the
/// client's incremental fetches are answered with only the partitions that have new records,
/// and every record arrives once, in order.
#[test]
fn python_kafka_python_consumes_many_partitions_through_an_incremental_fetch_session() {
    let broker = StrataProcess::start();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/fetch_sessions.py");
    let mut command = Command::new("python3");
    command
        .arg(&script)
        .arg("--bootstrap")
        .arg(broker.bootstrap())
        .arg("--topic")
        .arg("python-fetch-sessions");
    let finished = run_with_deadline(command, b"", CLIENT_DEADLINE * 2);
    finished.assert_success("tests/python/fetch_sessions.py");
    eprintln!("{}", finished.stdout);
}

/// aiokafka: admin, an idempotent gzip producer, a 2-member group with exact commits, and a
/// committed and an aborted transaction read back read_committed.
#[test]
fn python_aiokafka_groups_commits_and_transactions() {
    let broker = StrataProcess::start();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/aiokafka_clients.py");
    let mut command = Command::new("python3");
    command
        .arg(&script)
        .arg("--bootstrap")
        .arg(broker.bootstrap())
        .arg("--topic")
        .arg("aiokafka");
    let finished = run_with_deadline(command, b"", CLIENT_DEADLINE * 2);
    finished.assert_success("tests/python/aiokafka_clients.py");
    eprintln!("{}", finished.stdout);
}

/// kafkajs: the same, through a client written in JavaScript with its own protocol code.
#[test]
fn kafkajs_groups_commits_and_transactions() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("js");
    assert!(
        is_installed("node") && dir.join("node_modules/kafkajs").is_dir(),
        "node and tests/js/node_modules are needed: `cd tests/js && npm ci` (.ci/run does it)"
    );
    let broker = StrataProcess::start();
    let mut command = Command::new("node");
    command
        .current_dir(&dir)
        .arg("clients.js")
        .arg("--bootstrap")
        .arg(broker.bootstrap())
        .arg("--topic")
        .arg("kafkajs");
    let finished = run_with_deadline(command, b"", CLIENT_DEADLINE * 2);
    finished.assert_success("tests/js/clients.js");
    eprintln!("{}", finished.stdout);
}

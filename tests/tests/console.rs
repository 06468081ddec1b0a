//! The web console in a real browser: headless Chromium (Debian's `chromium` and
//! `chromedriver`, driven by Selenium from tests/python/console.py) against a 3-broker
//! cluster. The page must show what the brokers hold — every broker, the owner of each
//! partition, a topic's records, a group's lag — and its controls must act: a topic created
//! from the form exists for Kafka clients, and a partition moved with its button is led by the
//! target broker in Metadata.

// A failed expectation in a test is a panic; helpers here are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rdkafka::producer::FutureRecord;
use serde_json::Value;
use strata_tests::clients::{create_topic, producer};
use strata_tests::cluster::Cluster;
use strata_tests::command::run_with_deadline;
use strata_tests::wait::{wait_until, DEADLINE};

const BROWSER_DEADLINE: Duration = Duration::from_secs(240);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_the_cluster_and_its_create_and_move_controls_act() {
    let mut cluster = Cluster::start_with_env(
        3,
        "3s",
        "500ms",
        &[("STRATA_CONSOLE_LISTEN", "127.0.0.1:0")],
    );
    let bootstrap = cluster.bootstrap_of(&[1, 2, 3]);
    let topic = "orders";
    create_topic(&bootstrap, topic, 3, &[]).await;
    let records = 30;
    let sender = producer(&bootstrap, &[]);
    for i in 0..records {
        let value = format!("order-{i}");
        sender
            .send(
                FutureRecord::<(), _>::to(topic)
                    .partition(i % 3)
                    .payload(&value),
                Duration::from_secs(30),
            )
            .await
            .unwrap_or_else(|(e, _)| panic!("produce: {e}"));
    }
    // A group that committed 4 records of each partition lags 30 - 12 = 18.
    let group = "billing";
    let reset = run_with_deadline(
        {
            let mut command = Command::new(strata_tests::binary::strata_binary());
            command.args([
                "group",
                "reset-offsets",
                group,
                "--topic",
                topic,
                "--to-offset",
                "4",
                "--execute",
                "--bootstrap-server",
                &bootstrap,
            ]);
            command
        },
        b"",
        DEADLINE,
    );
    reset.assert_success("strata group reset-offsets");

    let leaders = cluster.wait_for_leaders(1, topic, 3, &[1, 2, 3], "orders led by live brokers");
    let before = leaders[&0];
    let target = if before == 3 { 1 } else { before + 1 };
    let created = "made-in-the-console";

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/console.py");
    let mut command = Command::new("python3");
    command.arg(&script).args([
        "--url",
        &cluster.console_url(1),
        "--brokers",
        "1,2,3",
        "--topic",
        topic,
        "--records",
        &records.to_string(),
        "--group",
        group,
        "--lag",
        "18",
        "--create",
        created,
        "--move-partition",
        "0",
        "--to",
        &target.to_string(),
    ]);
    if let Ok(dir) = std::env::var("STRATA_CONSOLE_SCREENSHOTS") {
        command.args(["--screenshots", &dir]);
    }
    let finished = run_with_deadline(command, b"", BROWSER_DEADLINE);
    finished.assert_success("tests/python/console.py");
    let seen: Value = serde_json::from_str(
        finished
            .stdout
            .lines()
            .last()
            .expect("the script printed what it saw"),
    )
    .unwrap_or_else(|e| panic!("not JSON ({e}): {}", finished.stdout));
    assert_eq!(seen["owner_before"], before, "owner shown before the move");
    assert_eq!(seen["records"], records, "records shown for {topic}");
    assert_eq!(seen["lag"], 18, "lag shown for {group}");
    assert_eq!(
        seen["browser_errors"],
        serde_json::json!([]),
        "the page logged errors"
    );

    // The effects, seen by Kafka clients rather than by the page.
    wait_until(
        &format!("{topic}-0 led by broker {target}"),
        DEADLINE,
        || (cluster.metadata_from(2, Some(topic)).leaders.get(&0) == Some(&target)).then_some(()),
    );
    let made = cluster.wait_for_leaders(3, created, 2, &[1, 2, 3], "the created topic led");
    assert_eq!(made.len(), 2, "{created} has the 2 partitions asked for");
}

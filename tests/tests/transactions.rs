//! Transactions end to end: confluent-kafka's transactional producer and read_committed
//! consumers (tests/python/transactions.py) against the real binary — one broker for commit,
//! abort, fencing, timeouts and offsets sent in a transaction; three brokers with the transaction coordinator's broker
//! SIGKILLed mid-transaction.

// A failed expectation in a test is a panic; helpers here are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::FindCoordinatorRequest;
use kafka_protocol::protocol::StrBytes;
use strata_tests::clients::create_topic;
use strata_tests::cluster::Cluster;
use strata_tests::command::run_with_deadline;
use strata_tests::raw::RawConnection;
use strata_tests::wait::wait_until;
use strata_tests::StrataProcess;

const CLIENT_DEADLINE: Duration = Duration::from_secs(240);

fn script() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("python/transactions.py")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_transactions_commit_abort_fence_time_out_and_send_offsets() {
    // Timed-out transactions are looked for every 200 ms instead of every 10 s.
    let broker = StrataProcess::start_with(strata_tests::StrataOptions::default().with_args([
        "--group-initial-rebalance-delay",
        "0s",
        "--transaction-abort-timed-out-interval",
        "200ms",
    ]));
    for topic in ["txn", "txn-f", "txn-t"] {
        create_topic(&broker.bootstrap(), topic, 3, &[]).await;
    }
    for topic in ["txn-in", "txn-out"] {
        create_topic(&broker.bootstrap(), topic, 1, &[]).await;
    }
    let mut command = Command::new("python3");
    command
        .arg(script())
        .arg("--bootstrap")
        .arg(broker.bootstrap())
        .arg("--topic")
        .arg("txn");
    let finished = tokio::task::block_in_place(|| run_with_deadline(command, b"", CLIENT_DEADLINE));
    finished.assert_success("tests/python/transactions.py");
}

/// The broker coordinating `transactional_id`, asked of the broker at `addr`.
fn coordinator_of(addr: std::net::SocketAddr, transactional_id: &str) -> Option<i32> {
    let mut connection = RawConnection::connect(addr);
    let mut request = FindCoordinatorRequest::default();
    request.key = StrBytes::from_string(transactional_id.to_string());
    request.key_type = 1;
    let response = connection.request(3, &request);
    (response.error_code == 0).then_some(response.node_id.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_survives_the_sigkill_of_its_coordinators_broker() {
    let mut cluster = Cluster::start(3, "3s", "500ms");
    let ids = cluster.all_ids();
    let bootstrap = cluster.bootstrap_of(&ids);
    create_topic(&bootstrap, "survive", 3, &[]).await;
    tokio::task::block_in_place(|| {
        cluster.wait_for_leaders(1, "survive", 3, &ids, "every partition has an owner");
    });
    let asked = cluster.broker(ids[0]).addr();
    let coordinator = tokio::task::block_in_place(|| {
        wait_until(
            "a transaction coordinator for the id",
            Duration::from_secs(60),
            || coordinator_of(asked, "survive-survivor"),
        )
    });

    let mut child = Command::new("python3")
        .arg(script())
        .arg("--bootstrap")
        .arg(&bootstrap)
        .arg("--topic")
        .arg("survive")
        .arg("--kill-coordinator")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run python3");
    let stdout = child.stdout.take().unwrap();
    let (lines_tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let deadline = Instant::now() + CLIENT_DEADLINE;
    let mut output = Vec::new();
    let mut killed = false;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => {
                if line == "KILL" && !killed {
                    // Mid-transaction: records produced, not yet committed.
                    cluster.broker(coordinator).kill9();
                    killed = true;
                    let mut stdin = child.stdin.take().unwrap();
                    stdin.write_all(b"KILLED\n").unwrap();
                }
                output.push(line);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                panic!("the script did not finish in time; its output: {output:?}");
            }
        }
    }
    let status = child.wait().unwrap();
    assert!(killed, "the script never reached the kill: {output:?}");
    assert!(
        status.success(),
        "tests/python/transactions.py failed: {output:?}"
    );
    assert!(
        output.iter().any(|l| l == "transaction checks passed"),
        "{output:?}"
    );
    // Which of the two clean outcomes happened, for whoever reads the test log.
    eprintln!("{}", output.join("\n"));
}

/// KIP-890 part 1 across brokers: the owners of the data partitions verify each partition's
/// first transactional batch with the transaction coordinator, which for some of them is on
/// the other broker; confluent-kafka's commit and abort across 3 partitions still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_work_when_partition_owners_verify_with_a_remote_coordinator() {
    let mut cluster = Cluster::start(2, "3s", "500ms");
    let ids = cluster.all_ids();
    let bootstrap = cluster.bootstrap_of(&ids);
    create_topic(&bootstrap, "remote", 3, &[]).await;
    let leaders = tokio::task::block_in_place(|| {
        cluster.wait_for_leaders(ids[0], "remote", 3, &ids, "every partition has an owner")
    });
    let asked = cluster.broker(ids[0]).addr();
    let coordinator = tokio::task::block_in_place(|| {
        wait_until(
            "a transaction coordinator for the id",
            Duration::from_secs(60),
            || coordinator_of(asked, "remote-tx"),
        )
    });
    // Placement hashes the topic's random id, so all three partitions may land on the
    // coordinator's broker; then one is moved away, so some owner must ask over the network.
    if leaders.values().all(|leader| *leader == coordinator) {
        let other = *ids
            .iter()
            .find(|id| **id != coordinator)
            .expect("two brokers");
        tokio::task::block_in_place(|| cluster.move_partition("remote", 0, other));
    }
    let mut command = Command::new("python3");
    command
        .arg(script())
        .arg("--bootstrap")
        .arg(&bootstrap)
        .arg("--topic")
        .arg("remote")
        .arg("--commit-and-abort-only");
    let finished = tokio::task::block_in_place(|| run_with_deadline(command, b"", CLIENT_DEADLINE));
    finished.assert_success("tests/python/transactions.py --commit-and-abort-only");
}

//! Transactions end to end: confluent-kafka's transactional producer and read_committed
//! consumers (tests/python/transactions.py) against the real binary — one broker for commit,
//! abort, fencing, timeouts and offsets sent in a transaction; three brokers with the transaction coordinator's broker
//! SIGKILLed mid-transaction; and an exactly-once pipeline (tests/python/eos_pipeline.py) through
//! kills of itself and of brokers, and partition moves, checked record by record.

// A failed expectation in a test is a panic; helpers here are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::FindCoordinatorRequest;
use kafka_protocol::protocol::StrBytes;
use strata_tests::certs::Certificates;
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

/// The same contract through kafka-python's own protocol code: commit and abort across 3
/// partitions read with both isolation levels, fencing, and offsets sent in a transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_python_transactions_commit_abort_fence_and_send_offsets() {
    let broker = StrataProcess::start_with(
        strata_tests::StrataOptions::default().with_args(["--group-initial-rebalance-delay", "0s"]),
    );
    create_topic(&broker.bootstrap(), "kp-txn", 3, &[]).await;
    let mut command = Command::new("python3");
    command
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("python/kafka_python_transactions.py"))
        .arg("--bootstrap")
        .arg(broker.bootstrap())
        .arg("--topic")
        .arg("kp-txn");
    let finished = tokio::task::block_in_place(|| run_with_deadline(command, b"", CLIENT_DEADLINE));
    finished.assert_success("tests/python/kafka_python_transactions.py");
    assert!(
        finished.stdout.contains("transaction checks passed"),
        "{}",
        finished.stdout
    );
}

/// The broker coordinating `transactional_id`, asked of the broker at `addr`.
fn coordinator_of(addr: std::net::SocketAddr, transactional_id: &str) -> Option<i32> {
    find_coordinator(addr, transactional_id, 1)
}

/// The broker `addr` names as `group`'s coordinator, once it names one.
fn group_coordinator_of(addr: std::net::SocketAddr, group: &str) -> Option<i32> {
    find_coordinator(addr, group, 0)
}

/// `__transaction_state`'s partitions (the broker's default).
const TXN_SHARDS: i32 = 8;

/// The coordinator shard of `key` among `shards`: Kafka's `abs(key.hashCode()) % shards`, as
/// the broker computes it.
fn java_hash_shard(key: &str, shards: usize) -> i32 {
    let mut h: i32 = 0;
    for unit in key.encode_utf16() {
        h = h.wrapping_mul(31).wrapping_add(i32::from(unit));
    }
    ((h & 0x7fff_ffff) as usize % shards.max(1)) as i32
}

fn find_coordinator(addr: std::net::SocketAddr, key: &str, key_type: i8) -> Option<i32> {
    let mut connection = RawConnection::connect(addr);
    let mut request = FindCoordinatorRequest::default();
    request.key = StrBytes::from_string(key.to_string());
    request.key_type = key_type;
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

fn pipeline_script() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("python/eos_pipeline.py")
}

/// A running `eos_pipeline.py` process, its stdout read line by line. Its stderr (with
/// librdkafka's transaction-state debug log) goes to a file, shown only when the test fails:
/// a pipeline stalled past its own timeouts was seen twice in CI, with nothing client-side to
/// say which request it waited for.
struct Script {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
    stderr: tempfile::NamedTempFile,
}

/// Lines of the pipeline's stderr shown in a failure.
const STDERR_LINES_SHOWN: usize = 300;

impl Script {
    fn spawn(mode: &str, bootstrap: &str) -> Self {
        let stderr = tempfile::NamedTempFile::new().expect("a file for the pipeline's stderr");
        let mut child = Command::new("python3")
            .arg(pipeline_script())
            .arg(mode)
            .arg("--bootstrap")
            .arg(bootstrap)
            // librdkafka's debug contexts for the pipeline's producer: the transaction steps,
            // unless the caller asks for more (e.g. "eos,broker,protocol").
            .env(
                "STRATA_EOS_PIPELINE_DEBUG",
                std::env::var("STRATA_EOS_PIPELINE_DEBUG").unwrap_or_else(|_| "eos".into()),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(
                stderr.reopen().expect("reopen the pipeline's stderr file"),
            ))
            .spawn()
            .expect("run python3");
        let stdout = child.stdout.take().unwrap();
        let (lines_tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = lines_tx.send(line);
            }
        });
        Self {
            child,
            lines,
            stderr,
        }
    }

    /// The last lines the pipeline wrote to stderr.
    /// The last lines of the pipeline's stderr, for a failure message; the whole of it is
    /// copied next to the other temporary files and named in the message.
    fn stderr_tail(&self) -> String {
        let text = std::fs::read_to_string(self.stderr.path()).unwrap_or_default();
        let kept = std::env::temp_dir().join(format!(
            "strata-eos-pipeline-{}-{}.stderr",
            std::process::id(),
            self.child.id()
        ));
        let whole = match std::fs::write(&kept, &text) {
            Ok(()) => format!("(all of it: {})\n", kept.display()),
            Err(_) => String::new(),
        };
        let lines: Vec<&str> = text.lines().collect();
        format!(
            "{whole}{}",
            lines[lines.len().saturating_sub(STDERR_LINES_SHOWN)..].join("\n")
        )
    }

    fn say(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(format!("{line}\n").as_bytes()).unwrap();
        stdin.flush().unwrap();
    }
}

/// What the harness does to the pipeline, mid-transaction, once its input progress passes a
/// threshold.
#[derive(Debug, Clone, Copy)]
enum Disruption {
    KillPipeline,
    KillCoordinatorBroker,
    KillCoordinatorsBroker,
    MoveOutputPartition,
    KillOutputOwner,
    MoveInputPartition,
}

/// The exactly-once pipeline of issue 15: read an input topic, write a transformed record per
/// input record to an output topic, and commit the input offsets in the same transaction —
/// with the pipeline SIGKILLed twice, the transaction coordinator's broker SIGKILLed, then
/// the broker hosting both the transaction and the group coordinator (moved there first), then
/// an output partition's owner, and an output and an input partition moved, each in the middle
/// of a transaction (records written, offsets not yet sent). Afterwards the output holds every
/// input record exactly once, every transaction whole (read_committed), and the output's last
/// stable offsets, sampled throughout, never went back.
///
/// Each killed broker stays down until the next checkpoint, so the pipeline's next
/// transaction runs without it. That is what found librdkafka waiting forever on a group
/// coordinator that had died (see `departed_broker_listing` in docs/ARCHITECTURE.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exactly_once_pipeline_outputs_each_record_once_through_kills_and_moves() {
    pipeline_through(&[
        (150, Disruption::KillPipeline),
        (300, Disruption::KillCoordinatorBroker),
        (400, Disruption::KillCoordinatorsBroker),
        (500, Disruption::MoveOutputPartition),
        (700, Disruption::KillOutputOwner),
        (900, Disruption::KillPipeline),
        (1100, Disruption::MoveInputPartition),
    ])
    .await;
}

/// Runs the pipeline over 1,500 records on 3 brokers, carrying out `plan` (input progress,
/// disruption) at the pipeline's mid-transaction checkpoints, then checks the output.
async fn pipeline_through(plan: &[(i64, Disruption)]) {
    const RECORDS: i64 = 1500;
    const RESTARTS_ALLOWED: usize = 6;
    let mut cluster = Cluster::start(3, "3s", "500ms");
    let ids = cluster.all_ids();
    let bootstrap = cluster.bootstrap_of(&ids);
    for topic in ["eos-in", "eos-out"] {
        create_topic(&bootstrap, topic, 3, &[]).await;
    }
    tokio::task::block_in_place(|| {
        for topic in ["eos-in", "eos-out"] {
            cluster.wait_for_leaders(ids[0], topic, 3, &ids, "every partition has an owner");
        }
        let mut seed = Command::new("python3");
        seed.arg(pipeline_script())
            .arg("seed")
            .arg("--bootstrap")
            .arg(&bootstrap)
            .arg("--records")
            .arg(RECORDS.to_string());
        run_with_deadline(seed, b"", CLIENT_DEADLINE).assert_success("eos_pipeline.py seed");
    });

    tokio::task::block_in_place(|| {
        let mut lso = Script::spawn("lso", &bootstrap);
        let mut pipeline = Script::spawn("run", &bootstrap);
        let mut output = Vec::new();
        let mut done = Vec::new();
        let mut down: Option<i32> = None;
        let mut unplanned_restarts = 0;
        let deadline = Instant::now() + CLIENT_DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match pipeline.lines.recv_timeout(left) {
                Ok(line) => line,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = pipeline.child.wait().unwrap();
                    if status.success() {
                        break;
                    }
                    // A fatal client error: the application's answer is a new incarnation,
                    // which fences the old one. Bounded, and reported.
                    unplanned_restarts += 1;
                    assert!(
                        unplanned_restarts <= RESTARTS_ALLOWED,
                        "the pipeline failed {unplanned_restarts} times: {output:?}\n\
                         its stderr (last {STDERR_LINES_SHOWN} lines):\n{}",
                        pipeline.stderr_tail()
                    );
                    output.push(format!("(pipeline exited with {status}; restarted)"));
                    pipeline = Script::spawn("run", &bootstrap);
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = pipeline.child.kill();
                    panic!(
                        "the pipeline did not finish in time; its output: {output:?}\n\
                         its stderr (last {STDERR_LINES_SHOWN} lines):\n{}",
                        pipeline.stderr_tail()
                    );
                }
            };
            output.push(line.clone());
            let Some(progress) = line.strip_prefix("CHECKPOINT ") else {
                continue;
            };
            let progress: i64 = progress.parse().unwrap();
            // A broker killed at the previous checkpoint comes back now: a transaction has
            // run (or failed over) without it.
            if let Some(id) = down.take() {
                cluster.broker(id).restart();
            }
            let due = plan
                .get(done.len())
                .filter(|(threshold, _)| progress >= *threshold)
                .map(|(_, disruption)| *disruption);
            let Some(disruption) = due else {
                pipeline.say("GO");
                continue;
            };
            done.push(disruption);
            let live = ids.clone();
            let owner = |cluster: &Cluster, topic: &str, partition: i32| {
                cluster.wait_for_leaders(live[0], topic, 3, &live, "owners")[&partition]
            };
            match disruption {
                Disruption::KillPipeline => {
                    pipeline.child.kill().unwrap();
                    pipeline.child.wait().unwrap();
                    output.push(format!("(pipeline killed at {progress})"));
                    pipeline = Script::spawn("run", &bootstrap);
                    continue;
                }
                Disruption::KillCoordinatorBroker => {
                    let asked = cluster.broker(live[0]).addr();
                    let coordinator = wait_until(
                        "the pipeline's transaction coordinator",
                        Duration::from_secs(60),
                        || coordinator_of(asked, "eos-pipeline"),
                    );
                    cluster.broker(coordinator).kill9();
                    down = Some(coordinator);
                }
                Disruption::KillCoordinatorsBroker => {
                    // Both of the pipeline's coordinators on one broker, then that broker
                    // killed: librdkafka then finds the new transaction coordinator only
                    // after the dead broker left the membership, and starts its offset
                    // commit with the dead group coordinator still cached.
                    let asked = cluster.broker(live[0]).addr();
                    let group = wait_until(
                        "the pipeline's group coordinator",
                        Duration::from_secs(60),
                        || group_coordinator_of(asked, "eos-pipeline"),
                    );
                    let shards = cluster.wait_for_leaders(
                        live[0],
                        "__transaction_state",
                        TXN_SHARDS,
                        &live,
                        "every transaction coordinator shard has an owner",
                    );
                    assert_eq!(shards.len(), TXN_SHARDS as usize, "{shards:?}");
                    let shard = java_hash_shard("eos-pipeline", shards.len());
                    if shards.get(&shard) != Some(&group) {
                        cluster.move_partition("__transaction_state", shard, group);
                    }
                    wait_until(
                        "the transaction coordinator moves to the group coordinator's broker",
                        Duration::from_secs(60),
                        || (coordinator_of(asked, "eos-pipeline") == Some(group)).then_some(()),
                    );
                    cluster.broker(group).kill9();
                    down = Some(group);
                }
                Disruption::KillOutputOwner => {
                    let victim = owner(&cluster, "eos-out", 1);
                    cluster.broker(victim).kill9();
                    down = Some(victim);
                }
                Disruption::MoveOutputPartition | Disruption::MoveInputPartition => {
                    let (topic, partition) = match disruption {
                        Disruption::MoveOutputPartition => ("eos-out", 0),
                        _ => ("eos-in", 1),
                    };
                    let from = owner(&cluster, topic, partition);
                    let to = *live.iter().find(|id| **id != from).unwrap();
                    cluster.move_partition(topic, partition, to);
                }
            }
            output.push(format!("({disruption:?} at {progress})"));
            pipeline.say("GO");
        }
        assert_eq!(
            done.len(),
            plan.len(),
            "the pipeline finished before every disruption: {output:?}"
        );
        eprintln!("{}", output.join("\n"));
        if let Some(id) = down.take() {
            cluster.broker(id).restart();
        }

        drop(lso.child.stdin.take());
        let status = lso.child.wait().unwrap();
        let lso_output: Vec<String> = lso.lines.iter().collect();
        assert!(status.success(), "last stable offsets: {lso_output:?}");

        let mut verify = Command::new("python3");
        verify
            .arg(pipeline_script())
            .arg("verify")
            .arg("--bootstrap")
            .arg(&bootstrap)
            .arg("--records")
            .arg(RECORDS.to_string());
        let verified = run_with_deadline(verify, b"", CLIENT_DEADLINE);
        verified.assert_success("eos_pipeline.py verify");
        assert!(verified.stdout.contains("VERIFIED"), "{}", verified.stdout);
    });
}

/// Brokers whose inter-broker listener is SASL_PLAINTEXT log in to each other with their own
/// SCRAM user (`inter_broker_sasl_*`, the password from the environment) to send transaction
/// markers and KIP-890 checks: a transaction across partitions of both brokers commits and
/// aborts, and the receiving broker counts the brokers' logins. Before, a broker sent markers
/// only on PLAINTEXT and had no login.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brokers_send_each_other_markers_over_sasl_with_their_own_login() {
    let mut cluster = Cluster::start_with_env(
        2,
        "3s",
        "500ms",
        &[
            (
                "STRATA_LISTENERS",
                "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
            ),
            ("STRATA_INTER_BROKER_LISTENER_NAME", "SASL_PLAINTEXT"),
            ("STRATA_INTER_BROKER_SASL_MECHANISM", "SCRAM-SHA-512"),
            ("STRATA_INTER_BROKER_SASL_USERNAME", "broker"),
            ("STRATA_INTER_BROKER_SASL_PASSWORD", "broker-secret"),
        ],
    );
    cluster
        .admin_command(&[
            "users",
            "create",
            "--user",
            "broker",
            "--password",
            "broker-secret",
            "--mechanism",
            "SCRAM-SHA-512",
        ])
        .assert_success("strata users create --user broker");
    let scram_logins = |text: &str| {
        counter_sum(text, |l| {
            l.starts_with("strata_authentications_total{")
                && l.contains("SCRAM-SHA-512")
                && l.contains("result=\"success\"")
        })
    };
    commit_and_abort_across_brokers(&mut cluster, "sasl-markers", scram_logins, "SCRAM login")
        .await;
}

/// The sum of the /metrics series whose lines `wanted` accepts.
fn counter_sum(text: &str, wanted: impl Fn(&str) -> bool) -> f64 {
    text.lines()
        .filter(|l| wanted(l))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A transaction across `topic`'s 3 partitions commits and aborts (tests/python/transactions.py)
/// with at least one partition owned by a broker other than the coordinator's, so markers and
/// KIP-890 checks cross the inter-broker listener; `connections` counts, in a broker's
/// /metrics, what that listener's connections leave behind (`what`): none on the other broker
/// before the transaction, some after.
async fn commit_and_abort_across_brokers(
    cluster: &mut Cluster,
    topic: &str,
    connections: impl Fn(&str) -> f64,
    what: &str,
) {
    let ids = cluster.all_ids();
    let bootstrap = cluster.bootstrap_of(&ids);
    create_topic(&bootstrap, topic, 3, &[]).await;
    let leaders = tokio::task::block_in_place(|| {
        cluster.wait_for_leaders(ids[0], topic, 3, &ids, "every partition has an owner")
    });
    let asked = cluster.broker(ids[0]).addr();
    let transactional_id = format!("{topic}-tx");
    let coordinator = tokio::task::block_in_place(|| {
        wait_until(
            "a transaction coordinator for the id",
            Duration::from_secs(60),
            || coordinator_of(asked, &transactional_id),
        )
    });
    // Some partition must be owned by the other broker, for markers to cross the network.
    let other = *ids
        .iter()
        .find(|id| **id != coordinator)
        .expect("two brokers");
    if leaders.values().all(|leader| *leader == coordinator) {
        tokio::task::block_in_place(|| cluster.move_partition(topic, 0, other));
    }
    assert_eq!(
        connections(&cluster.metrics_text(other)),
        0.0,
        "no {what} before any transaction"
    );
    let mut command = Command::new("python3");
    command
        .arg(script())
        .arg("--bootstrap")
        .arg(&bootstrap)
        .arg("--topic")
        .arg(topic)
        .arg("--commit-and-abort-only");
    let finished = tokio::task::block_in_place(|| run_with_deadline(command, b"", CLIENT_DEADLINE));
    finished.assert_success("tests/python/transactions.py --commit-and-abort-only");
    assert!(
        connections(&cluster.metrics_text(other)) >= 1.0,
        "broker {other} saw no {what} from the coordinator's broker"
    );
}

/// Brokers whose inter-broker listener is SSL, with client certificates required, reach each
/// other over TLS with their own certificate (`ssl_certificate`, trusted through
/// `ssl_truststore`, as Kafka's brokers use their keystore and truststore): a transaction
/// across partitions of both brokers commits and aborts, and the receiving broker counts the
/// certificate logins. Every client of the test is on PLAINTEXT, so those are the brokers'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brokers_send_each_other_markers_over_tls_with_their_certificates() {
    let certs = Certificates::make();
    let path = |name: &str| certs.path(name).display().to_string();
    let (certificate, key, truststore) = (path("server.pem"), path("server.key"), path("ca.pem"));
    let mut cluster = Cluster::start_with_env(
        2,
        "3s",
        "500ms",
        &[
            (
                "STRATA_LISTENERS",
                "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
            ),
            ("STRATA_INTER_BROKER_LISTENER_NAME", "SSL"),
            ("STRATA_SSL_CERTIFICATE", &certificate),
            ("STRATA_SSL_KEY", &key),
            ("STRATA_SSL_TRUSTSTORE", &truststore),
            ("STRATA_SSL_CLIENT_AUTH", "required"),
        ],
    );
    let tls_logins = |text: &str| {
        counter_sum(text, |l| {
            l.starts_with("strata_authentications_total{")
                && l.contains("mechanism=\"TLS\"")
                && l.contains("result=\"success\"")
        })
    };
    commit_and_abort_across_brokers(
        &mut cluster,
        "tls-markers",
        tls_logins,
        "TLS client certificate",
    )
    .await;
}

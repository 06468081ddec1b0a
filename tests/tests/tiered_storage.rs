//! Tiered storage (`--wal-storage`): the write-ahead tier and the bulk tier on two storages,
//! driven by rdkafka against the real binary. Produce, compact into segments on the bulk tier,
//! consume from the beginning, SIGKILL the broker and let a second broker take over, SIGKILL
//! and restart that one: every acknowledged record must be read back at its offset.
//!
//! Where the tiers are: with `STRATA_TEST_WAL_STORAGE` and `STRATA_TEST_STORAGE` both set (CI:
//! a RADOS pool and radosgw S3), a namespace or prefix of each; otherwise two local
//! directories, a valid two-tier setup on one machine. With `STRATA_TEST_RGW_PID_FILE` set too
//! (the bulk tier is then radosgw), the bulk tier is also frozen with SIGSTOP while producing:
//! acknowledgements must continue, compaction must catch up after SIGCONT.

// A failed expectation in a test is a panic; helpers here are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use strata_tests::clients::{
    consume_exactly, create_topic, produce_all, producer, set_topic_configs, Acked,
};
use strata_tests::cluster::{BrokerHooks, Cluster};
use strata_tests::command::run_with_deadline;
use strata_tests::process::{unique_name, with_path_suffix};
use strata_tests::records::{assert_partitions_match, TestRecord};
use strata_tests::stream::ContinuousProducer;
use strata_tests::wait::{wait_until, DEADLINE};
use strata_tests::{StrataOptions, StrataProcess};
use tempfile::TempDir;

const PARTITIONS: i32 = 2;

/// Small segments, compacted quickly, so produced data reaches the bulk tier within a moment.
const FAST_SEGMENTS: &str = r#"
[log]
segment_interval = "100ms"
segment_bytes = "64KiB"
"#;

/// The two tiers' URLs, removed when dropped (RADOS namespaces; directories go with `dir`).
struct Tiers {
    dir: TempDir,
    wal: String,
    bulk: String,
}

impl Tiers {
    fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("strata-tiers-")
            .tempdir()
            .expect("create a temporary directory");
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let (wal, bulk) = match (var("STRATA_TEST_WAL_STORAGE"), var("STRATA_TEST_STORAGE")) {
            (Some(wal), Some(bulk)) => {
                let name = unique_name(dir.path());
                (
                    with_path_suffix(&wal, &name),
                    with_path_suffix(&bulk, &name),
                )
            }
            _ => (
                format!("file://{}", dir.path().join("wal").display()),
                format!("file://{}", dir.path().join("bulk").display()),
            ),
        };
        eprintln!("write-ahead tier {wal}, bulk tier {bulk}");
        Self { dir, wal, bulk }
    }

    /// The two directories when both tiers are local.
    fn local(&self) -> Option<(PathBuf, PathBuf)> {
        self.wal
            .starts_with("file://")
            .then(|| (self.dir.path().join("wal"), self.dir.path().join("bulk")))
    }

    fn broker(&self) -> StrataProcess {
        StrataProcess::start_with(
            StrataOptions::default()
                .with_storage_url(&self.bulk)
                .with_config(FAST_SEGMENTS)
                .with_args([
                    "--wal-storage",
                    self.wal.as_str(),
                    "--metrics-listen",
                    "127.0.0.1:0",
                ]),
        )
    }
}

impl Drop for Tiers {
    fn drop(&mut self) {
        strata_tests::cleanup::remove_test_objects(&self.wal);
        strata_tests::cleanup::remove_test_objects(&self.bulk);
    }
}

/// Broker's `/metrics` text.
fn metrics_text(broker: &StrataProcess) -> String {
    let line = broker
        .log_lines_containing("metrics on ")
        .pop()
        .expect("the broker logged its metrics address");
    let address = line
        .rsplit("metrics on ")
        .next()
        .and_then(|rest| rest.split_whitespace().next())
        .expect("an address")
        .to_string();
    let mut stream = std::net::TcpStream::connect(address).expect("connect to /metrics");
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    std::io::Write::write_all(
        &mut stream,
        b"GET /metrics HTTP/1.1\r\nHost: strata\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut stream, &mut text).unwrap();
    text
}

/// Record value size: what is produced is a floor for what compaction writes to the bulk tier.
const VALUE_BYTES: u64 = 300;

/// Bytes the bulk tier's stack wrote since the broker started (segments and index chunks).
fn bulk_bytes_in(broker: &StrataProcess) -> u64 {
    bulk_bytes_in_metrics(&metrics_text(broker))
}

/// The bulk tier's bytes written, summed from a `/metrics` text.
fn bulk_bytes_in_metrics(text: &str) -> u64 {
    text.lines()
        .filter(|l| {
            l.starts_with("strata_storage_bytes_total{")
                && l.contains("tier=\"bulk\"")
                && l.contains("direction=\"in\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

fn records(from: usize, count: usize) -> Vec<(Option<i32>, TestRecord)> {
    (from..from + count)
        .map(|i| {
            (
                Some((i % PARTITIONS as usize) as i32),
                TestRecord {
                    key: Some(format!("key-{i}").into_bytes()),
                    value: Some(vec![b'a' + (i % 26) as u8; VALUE_BYTES as usize]),
                    headers: Vec::new(),
                    timestamp: None,
                },
            )
        })
        .collect()
}

/// What was acknowledged, by partition in offset order, checked dense from 0.
fn by_partition(
    sent: &[(Option<i32>, TestRecord)],
    acked: &[Acked],
) -> BTreeMap<i32, Vec<TestRecord>> {
    let mut out: BTreeMap<i32, Vec<(i64, TestRecord)>> = BTreeMap::new();
    for ((_, record), ack) in sent.iter().zip(acked) {
        out.entry(ack.partition)
            .or_default()
            .push((ack.offset, record.clone()));
    }
    out.into_iter()
        .map(|(p, mut records)| {
            records.sort_by_key(|(offset, _)| *offset);
            (p, records.into_iter().map(|(_, r)| r).collect())
        })
        .collect()
}

async fn read_back_all(bootstrap: &str, topic: &str, expected: &BTreeMap<i32, Vec<TestRecord>>) {
    let total = expected.values().map(Vec::len).sum();
    let starts: Vec<(i32, i64)> = (0..PARTITIONS).map(|p| (p, 0)).collect();
    let got = consume_exactly(bootstrap, topic, &starts, total).await;
    assert_partitions_match(expected, &got, 0);
}

/// Every file under `root` (relative names), for checking what each local tier holds.
fn files_under(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_records_survive_compaction_to_the_bulk_tier_a_takeover_and_a_restart() {
    let tiers = Tiers::new();
    let mut first = tiers.broker();
    let topic = "tiered";
    create_topic(&first.bootstrap(), topic, PARTITIONS, &[]).await;

    let producer_a = producer(&first.bootstrap(), &[("linger.ms", "2")]);
    let mut sent = records(0, 3_000);
    let mut acked = produce_all(&producer_a, topic, &sent).await;
    drop(producer_a);
    // ~900 KB of values: compaction (every 100 ms) writes all of it to the bulk tier,
    // however the producer batched it.
    let produced = sent.len() as u64 * VALUE_BYTES;
    wait_until(
        "everything produced is compacted to the bulk tier",
        DEADLINE,
        || (bulk_bytes_in(&first) >= produced).then_some(()),
    );
    read_back_all(&first.bootstrap(), topic, &by_partition(&sent, &acked)).await;

    // Freeze the bulk tier (radosgw) if we may: acknowledgements wait only for the write-ahead
    // tier, so they continue; compaction retries and catches up once it thaws.
    if let Some(pid) = rgw_pid(&tiers) {
        let frozen = Frozen::stop(pid);
        let producer_b = producer(&first.bootstrap(), &[("linger.ms", "2")]);
        let more = records(sent.len(), 1_000);
        let more_acked = produce_all(&producer_b, topic, &more).await;
        drop(producer_b);
        eprintln!("1000 records acknowledged while the bulk tier was frozen");
        drop(frozen);
        let produced = (sent.len() + more.len()) as u64 * VALUE_BYTES;
        wait_until(
            "compaction catches up on the thawed bulk tier",
            DEADLINE,
            || (bulk_bytes_in(&first) >= produced).then_some(()),
        );
        sent.extend(more);
        acked.extend(more_acked);
    } else {
        eprintln!("bulk-tier freeze SKIPPED: needs STRATA_TEST_RGW_PID_FILE and an S3 bulk tier");
    }

    // SIGKILL, then a second broker (another process, same tiers) takes the partitions over
    // at once (the first is provably gone from this machine): it reads the segments from the
    // bulk tier and replays the first broker's uncompacted tail from the write-ahead tier.
    first.kill9();
    let mut second = tiers.broker();
    read_back_all(&second.bootstrap(), topic, &by_partition(&sent, &acked)).await;

    let producer_c = producer(&second.bootstrap(), &[("linger.ms", "2")]);
    let more = records(sent.len(), 500);
    let more_acked = produce_all(&producer_c, topic, &more).await;
    drop(producer_c);
    sent.extend(more);
    acked.extend(more_acked);
    second.kill9();
    second.restart();
    read_back_all(&second.bootstrap(), topic, &by_partition(&sent, &acked)).await;

    if let Some((wal_dir, bulk_dir)) = tiers.local() {
        // Objects only (`<key>@`; lock files are `<key>@lock`).
        let objects = |root: &Path| -> Vec<String> {
            files_under(root)
                .into_iter()
                .filter_map(|f| f.strip_suffix('@').map(str::to_string))
                .collect()
        };
        let compacted =
            |f: &String| f.starts_with("log/") && (f.contains("/seg/") || f.contains("/index/"));
        let on_wal = objects(&wal_dir);
        let on_bulk = objects(&bulk_dir);
        assert!(on_bulk.iter().any(|f| f.contains("/seg/")), "{on_bulk:?}");
        assert!(
            on_bulk.iter().all(compacted),
            "only segments and index chunks on the bulk tier: {on_bulk:?}"
        );
        assert!(
            !on_wal.iter().any(compacted),
            "no segment or index chunk on the write-ahead tier: {on_wal:?}"
        );
        assert!(on_wal.iter().any(|f| f.starts_with("wal/")), "{on_wal:?}");
        assert!(
            on_wal.iter().any(|f| f.ends_with("/manifest")),
            "{on_wal:?}"
        );
    }
}

/// radosgw's pid, when the bulk tier is S3 on a radosgw this test may freeze.
fn rgw_pid(tiers: &Tiers) -> Option<libc::pid_t> {
    if !tiers.bulk.starts_with("s3://") {
        return None;
    }
    let file = std::env::var("STRATA_TEST_RGW_PID_FILE").ok()?;
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

/// A stopped process, continued when dropped (also on a panic, so radosgw is never left frozen).
struct Frozen(libc::pid_t);

impl Frozen {
    fn stop(pid: libc::pid_t) -> Self {
        strata_tests::signals::stop(pid, "radosgw");
        Self(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // SAFETY: kill(2) with a valid signal number has no memory-safety preconditions.
        let rc = unsafe { libc::kill(self.0, libc::SIGCONT) };
        if rc != 0 {
            eprintln!(
                "SIGCONT to radosgw failed: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// In cluster mode a broker elsewhere that reaches the bulk tier must reach the write-ahead
/// tier too: a local-directory write-ahead tier under network bulk storage is refused at
/// start-up, before anything is opened.
#[test]
fn a_write_ahead_tier_other_brokers_cannot_reach_is_refused_in_cluster_mode() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    let mut command = Command::new(strata_tests::binary::strata_binary());
    command.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--storage",
        "s3://bucket/prefix?endpoint=http://127.0.0.1:9&allow_http=true",
        "--wal-storage",
        wal.to_str().unwrap(),
    ]);
    let finished = run_with_deadline(command, b"", Duration::from_secs(30));
    assert!(!finished.status.success(), "{finished:?}");
    assert!(
        finished.stderr.contains("wal_storage") && finished.stderr.contains("cluster"),
        "{}",
        finished.stderr
    );
    assert!(
        !wal.exists(),
        "refused before the write-ahead tier was opened"
    );
}

/// Partitions move between two brokers of a cluster whose storage has two tiers, while a
/// producer runs: a move hands over the manifest (write-ahead tier) and nothing else, the new
/// owner reads the old owner's segments from the bulk tier and its tail from the write-ahead
/// tier, and every acknowledged record is read back at its offset. The `strata` commands are
/// given `--wal-storage` as an operator copying the brokers' flags would.
///
/// The write-ahead tier: `STRATA_TEST_WAL_STORAGE` if set (CI: RADOS under radosgw S3);
/// otherwise a second location on the cluster's own backend (S3 under S3 in the S3 run, a
/// directory beside the cluster's directory locally), each a valid two-tier setup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_move_between_brokers_on_two_tiers_while_producing_and_lose_nothing() {
    let wal_dir = tempfile::tempdir().unwrap();
    let name = unique_name(wal_dir.path());
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let wal = match (var("STRATA_TEST_WAL_STORAGE"), var("STRATA_TEST_STORAGE")) {
        (Some(wal), _) => with_path_suffix(&wal, &name),
        (None, Some(shared)) => with_path_suffix(&shared, &format!("{name}-wal")),
        (None, None) => format!("file://{}", wal_dir.path().join("wal").display()),
    };
    let _wal_cleanup = RemoveObjects(wal.clone());
    eprintln!("write-ahead tier {wal}");
    let hooks = BrokerHooks {
        wal_storage: Some(wal.clone()),
        ..BrokerHooks::default()
    };
    let env = [
        ("STRATA_LOG_SEGMENT_INTERVAL", "100ms"),
        ("STRATA_LOG_SEGMENT_BYTES", "64KiB"),
    ];
    let mut cluster = Cluster::start_with_hooks(2, "3s", "500ms", &env, hooks);
    let ids = cluster.all_ids();
    let bootstrap = cluster.bootstrap_of(&ids);
    let topic = "tiered-moves";
    create_topic(&bootstrap, topic, PARTITIONS, &[]).await;
    let mut owners = tokio::task::block_in_place(|| {
        cluster.wait_for_leaders(1, topic, PARTITIONS, &ids, "every partition has an owner")
    });

    let producer = producer(
        &bootstrap,
        &[("linger.ms", "2"), ("enable.idempotence", "true")],
    );
    let stream = ContinuousProducer::start(producer, topic, PARTITIONS, 200, None);
    stream.wait_for_acked(1_000, DEADLINE).await;
    for round in 0..4 {
        let partition = round % PARTITIONS;
        let owner = owners[&partition];
        let target = ids.iter().copied().find(|&id| id != owner).unwrap();
        // Each move comes after compaction has put part of the partition on the bulk tier.
        let bulk_before: u64 = (1..=2).map(|id| bulk_in(&mut cluster, id)).sum();
        tokio::task::block_in_place(|| {
            wait_until("compaction writes to the bulk tier", DEADLINE, || {
                let now: u64 = (1..=2).map(|id| bulk_in(&mut cluster, id)).sum();
                (now > bulk_before).then_some(())
            })
        });
        let said = tokio::task::block_in_place(|| cluster.move_partition(topic, partition, target));
        eprintln!("move {round}: {said}");
        assert!(said.starts_with("moved"), "{said}");
        owners.insert(partition, target);
        let more = stream.acked() + 500;
        stream.wait_for_acked(more, DEADLINE).await;
    }
    let status = tokio::task::block_in_place(|| cluster.admin_command(&["cluster", "status"]));
    status.assert_success("strata cluster status --wal-storage");
    assert!(status.stdout.contains(topic), "{}", status.stdout);
    let outcomes = stream.finish().await;

    let mut sent = Vec::new();
    let mut acked = Vec::new();
    for outcome in outcomes {
        let ack = outcome
            .result
            .unwrap_or_else(|e| panic!("record {} failed: {e}", outcome.sequence));
        sent.push((Some(outcome.partition), outcome.record));
        acked.push(ack);
    }
    eprintln!("{} records acknowledged across 4 moves", acked.len());
    read_back_all(&bootstrap, topic, &by_partition(&sent, &acked)).await;
}

/// Bytes broker `id` wrote to the bulk tier.
fn bulk_in(cluster: &mut Cluster, id: i32) -> u64 {
    bulk_bytes_in_metrics(&cluster.metrics_text(id))
}

/// Removes a storage location's test objects when dropped.
struct RemoveObjects(String);

impl Drop for RemoveObjects {
    fn drop(&mut self) {
        strata_tests::cleanup::remove_test_objects(&self.0);
    }
}

/// A metric's value from a `/metrics` text (0 when absent).
fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0)
}

/// `local.retention.ms` (KIP-405's per-topic placement): a topic that asks for it keeps its
/// compacted segments on the write-ahead tier, readable and surviving a SIGKILL; once the
/// stay is lowered by AlterConfigs the tiering pass moves them to the bulk tier, and every
/// acknowledged record reads back at its offset before, during and after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_retention_holds_compacted_segments_on_the_write_ahead_tier_until_it_passes() {
    let tiers = Tiers::new();
    let mut broker = tiers.broker();
    let topic = "held";
    create_topic(
        &broker.bootstrap(),
        topic,
        PARTITIONS,
        &[("local.retention.ms", "3600000")],
    )
    .await;
    let producer_a = producer(&broker.bootstrap(), &[("linger.ms", "2")]);
    let mut sent = records(0, 2_000);
    let mut acked = produce_all(&producer_a, topic, &sent).await;
    drop(producer_a);
    let produced = sent.len() as u64 * VALUE_BYTES;
    wait_until(
        "everything produced is compacted onto the fast tier",
        DEADLINE,
        || {
            let text = metrics_text(&broker);
            (metric(&text, "strata_log_fast_tier_segment_bytes") >= produced).then_some(text)
        },
    );
    // Held, not moved: the gauge counts only segments the manifests place on the fast tier.
    assert_eq!(
        metric(&metrics_text(&broker), "strata_log_tiered_segments_total"),
        0
    );
    read_back_all(&broker.bootstrap(), topic, &by_partition(&sent, &acked)).await;
    if let Some((wal_dir, bulk_dir)) = tiers.local() {
        assert!(files_under(&wal_dir).iter().any(|f| f.contains("/hot/")));
        assert!(!files_under(&bulk_dir).iter().any(|f| f.contains("/seg/")));
    }

    // A SIGKILL and restart: the new incarnation reads the held segments from the fast tier.
    broker.kill9();
    broker.restart();
    read_back_all(&broker.bootstrap(), topic, &by_partition(&sent, &acked)).await;

    // Lower the stay to a second: the tiering pass moves everything held to the bulk tier,
    // while more records arrive.
    set_topic_configs(
        &broker.bootstrap(),
        topic,
        &[("local.retention.ms", "1000")],
    )
    .await;
    let producer_b = producer(&broker.bootstrap(), &[("linger.ms", "2")]);
    let more = records(sent.len(), 500);
    let more_acked = produce_all(&producer_b, topic, &more).await;
    drop(producer_b);
    sent.extend(more);
    acked.extend(more_acked);
    let all = sent.len() as u64 * VALUE_BYTES;
    wait_until(
        "every held segment moves to the bulk tier",
        DEADLINE,
        || {
            let text = metrics_text(&broker);
            (metric(&text, "strata_log_fast_tier_segments") == 0
                && metric(&text, "strata_log_tiered_bytes_total") >= all)
                .then_some(())
        },
    );
    read_back_all(&broker.bootstrap(), topic, &by_partition(&sent, &acked)).await;
    if let Some((wal_dir, bulk_dir)) = tiers.local() {
        // The collector or the swap removed the originals; the bulk tier has the segments.
        assert!(
            !files_under(&wal_dir)
                .iter()
                .any(|f| f.contains("/hot/") && f.ends_with('@')),
            "{:?}",
            files_under(&wal_dir)
        );
        assert!(files_under(&bulk_dir).iter().any(|f| f.contains("/seg/")));
    }
}

//! Several `strata serve --cluster true` brokers sharing one storage: starting them so that they
//! settle without fencing one another, asking each what it serves, moving partitions with the
//! `strata` admin commands. Used by the cluster tests and by the fault-injection harness.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{DescribeClusterRequest, MetadataRequest};

use crate::binary::strata_binary;
use crate::command::{run_with_deadline, Finished};
use crate::raw::{topic_name, RawConnection};
use crate::wait::{wait_until, DEADLINE};
use crate::{SharedStorage, StrataOptions, StrataProcess};

/// Partitions of `__consumer_offsets` every broker is started with.
pub const GROUP_SHARDS: i32 = 4;
pub const OFFSETS_TOPIC: &str = "__consumer_offsets";

/// Brokers 1..=n on one shared storage. Field order matters: the brokers are killed (dropped)
/// before the storage directory is removed.
pub struct Cluster {
    pub brokers: BTreeMap<i32, StrataProcess>,
    /// More environment for every broker (settings without a flag, e.g. the log's).
    broker_env: Vec<(String, String)>,
    hooks: BrokerHooks,
    pub storage: SharedStorage,
}

/// Given a broker's node id and the cluster's storage URL, the URL that broker is started with.
pub type StorageUrlOf = Box<dyn Fn(i32, &str) -> String + Send>;

/// How each broker is started differently from the others, now and on restarts.
#[derive(Default)]
pub struct BrokerHooks {
    /// Rewrites the shared storage URL for one broker (e.g. the fault-injection harness points
    /// each broker at its own proxy in front of the S3 endpoint); `None`: every broker uses it.
    pub storage_url_of: Option<StorageUrlOf>,
    /// The group id a broker's process runs under (its user stays the harness's), so that
    /// iptables' owner match can tell one broker's traffic from the others' (the harness cuts
    /// one broker off a RADOS cluster that way). `None`: the harness's own group.
    pub gid_of: Option<fn(i32) -> u32>,
    /// A write-ahead tier (`--wal-storage`) for every broker, the cluster storage then being
    /// the bulk tier; the admin commands get it too (the cluster's objects live there).
    pub wal_storage: Option<String>,
}

impl Cluster {
    /// Starts broker 1, lets it own every consumer-group shard and outlive the placement
    /// settle time (`min(lease, 2s)`), then starts the others, and waits until they have
    /// settled too and every broker lists every broker.
    ///
    /// Why not all at once: while no broker has settled, placement targets every live broker,
    /// and a broker whose membership view does not list a newcomer yet judges partitions the
    /// newcomer just claimed as held by a dead owner, seals the newcomer's stream at once
    /// (without waiting for a lease), and the newcomer exits fenced. That broker bug is what
    /// `brokers_started_together_do_not_fence_one_another` shows; the other tests are about
    /// moves and failures, so they start the cluster the way that avoids it.
    pub fn start(count: i32, lease: &str, heartbeat: &str) -> Self {
        Self::start_with_env(count, lease, heartbeat, &[])
    }

    /// [`start`](Self::start) with more environment for every broker, now and on restarts.
    pub fn start_with_env(count: i32, lease: &str, heartbeat: &str, env: &[(&str, &str)]) -> Self {
        Self::start_with_hooks(count, lease, heartbeat, env, BrokerHooks::default())
    }

    /// [`start_with_env`](Self::start_with_env), each broker started as `hooks` says (now and
    /// on restarts). Admin commands keep the unrewritten storage URL and the harness's group.
    pub fn start_with_hooks(
        count: i32,
        lease: &str,
        heartbeat: &str,
        env: &[(&str, &str)],
        hooks: BrokerHooks,
    ) -> Self {
        let settle = parse_millis(lease).min(Duration::from_secs(2)) + 2 * parse_millis(heartbeat);
        let mut cluster = Self::unsettled(1, lease, heartbeat, env, hooks);
        let first_started = Instant::now();
        cluster.wait_until_settled();
        wait_for_clock(
            "broker 1 has been live for the placement settle time",
            first_started + settle,
        );
        let others_started = Instant::now();
        for id in 2..=count {
            cluster.add_broker(id, lease, heartbeat);
        }
        wait_for_clock(
            "the other brokers have been live for the placement settle time",
            others_started + settle,
        );
        cluster.wait_until_settled();
        cluster
    }

    /// Starts brokers 1..=count back to back, without waiting for anything in between.
    pub fn start_unsettled(count: i32, lease: &str, heartbeat: &str) -> Self {
        Self::unsettled(count, lease, heartbeat, &[], BrokerHooks::default())
    }

    fn unsettled(
        count: i32,
        lease: &str,
        heartbeat: &str,
        env: &[(&str, &str)],
        hooks: BrokerHooks,
    ) -> Self {
        let storage = SharedStorage::new();
        eprintln!("cluster storage: {}", storage.url());
        let mut cluster = Self {
            brokers: BTreeMap::new(),
            broker_env: env
                .iter()
                .map(|(name, value)| (name.to_string(), value.to_string()))
                .collect(),
            hooks,
            storage,
        };
        for id in 1..=count {
            cluster.add_broker(id, lease, heartbeat);
        }
        cluster
    }

    pub fn add_broker(&mut self, id: i32, lease: &str, heartbeat: &str) {
        let url = match &self.hooks.storage_url_of {
            Some(url_of) => url_of(id, self.storage.url()),
            None => self.storage.url().to_string(),
        };
        let mut options = StrataOptions::default().with_storage_url(url).with_args([
            "--cluster".to_string(),
            "true".to_string(),
            "--node-id".to_string(),
            id.to_string(),
            "--lease-period".to_string(),
            lease.to_string(),
            "--heartbeat-interval".to_string(),
            heartbeat.to_string(),
            "--group-initial-rebalance-delay".to_string(),
            "0s".to_string(),
            "--group-shards".to_string(),
            GROUP_SHARDS.to_string(),
            "--metrics-listen".to_string(),
            "127.0.0.1:0".to_string(),
        ]);
        if let Some(wal) = &self.hooks.wal_storage {
            options
                .extra_args
                .extend(["--wal-storage".to_string(), wal.clone()]);
        }
        options.env.extend(self.broker_env.iter().cloned());
        options.gid = self.hooks.gid_of.map(|gid_of| gid_of(id));
        self.brokers.insert(id, StrataProcess::start_with(options));
    }

    /// Waits until every broker lists every broker and names an owner, one of them, for every
    /// consumer-group shard.
    pub fn wait_until_settled(&self) {
        let ids = self.all_ids();
        let all: BTreeSet<i32> = ids.iter().copied().collect();
        for &id in &ids {
            wait_until(
                &format!("broker {id} lists brokers {all:?} and owners of all group shards"),
                DEADLINE,
                || {
                    let view = self.metadata_from(id, Some(OFFSETS_TOPIC));
                    let owned = (0..GROUP_SHARDS)
                        .all(|p| view.leaders.get(&p).is_some_and(|l| all.contains(l)));
                    (view.brokers == all && owned).then_some(())
                },
            );
        }
    }

    pub fn broker(&mut self, id: i32) -> &mut StrataProcess {
        self.brokers.get_mut(&id).expect("no such broker")
    }

    /// `bootstrap.servers` naming the given brokers.
    pub fn bootstrap_of(&self, ids: &[i32]) -> String {
        ids.iter()
            .map(|id| self.brokers[id].bootstrap())
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn all_ids(&self) -> Vec<i32> {
        self.brokers.keys().copied().collect()
    }

    /// What broker `id` answers to Metadata (for `topic`, or for no topic), over a raw
    /// connection to that broker alone: no client library choosing which broker to ask.
    pub fn metadata_from(&self, id: i32, topic: Option<&str>) -> ClusterView {
        let mut connection = RawConnection::connect(self.brokers[&id].addr());
        let versions = connection.api_versions();
        let version = RawConnection::negotiate::<MetadataRequest>(&versions, 9);
        let request = MetadataRequest::default().with_topics(Some(
            topic
                .map(|t| vec![MetadataRequestTopic::default().with_name(Some(topic_name(t)))])
                .unwrap_or_default(),
        ));
        let response = connection.request(version, &request);
        let brokers = response.brokers.iter().map(|b| b.node_id.0).collect();
        let mut leaders = BTreeMap::new();
        for described in &response.topics {
            if described.error_code != 0 {
                continue;
            }
            for partition in &described.partitions {
                if partition.error_code == 0 {
                    leaders.insert(partition.partition_index, partition.leader_id.0);
                }
            }
        }
        ClusterView { brokers, leaders }
    }

    /// The live brokers broker `id` answers to DescribeCluster. Metadata lists more: brokers
    /// that left within `departed_broker_listing` stay there, leading nothing.
    pub fn live_brokers_from(&self, id: i32) -> BTreeSet<i32> {
        let mut connection = RawConnection::connect(self.brokers[&id].addr());
        let versions = connection.api_versions();
        let version = RawConnection::negotiate::<DescribeClusterRequest>(&versions, 1);
        let response = connection.request(version, &DescribeClusterRequest::default());
        response.brokers.iter().map(|b| b.broker_id.0).collect()
    }

    /// Waits until broker `asked` names a leader for each of `topic`'s `partitions` partitions,
    /// every one of them in `allowed`, and returns the leaders.
    pub fn wait_for_leaders(
        &self,
        asked: i32,
        topic: &str,
        partitions: i32,
        allowed: &[i32],
        what: &str,
    ) -> BTreeMap<i32, i32> {
        wait_until(what, DEADLINE, || {
            let view = self.metadata_from(asked, Some(topic));
            let complete = (0..partitions).all(|p| {
                view.leaders
                    .get(&p)
                    .is_some_and(|leader| allowed.contains(leader))
            });
            complete.then_some(view.leaders)
        })
    }

    /// Runs a `strata` admin command against this cluster's storage.
    /// One sample of broker `id`'s `/metrics` (the series named exactly, labels included).
    pub fn metric(&mut self, id: i32, series: &str) -> f64 {
        let text = self.metrics_text(id);
        let prefix = format!("{series} ");
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .unwrap_or_else(|| panic!("broker {id} reports no {series}"))
            .trim()
            .parse()
            .expect("a number")
    }

    /// Broker `id`'s whole `/metrics` answer (head and exposition text).
    /// The web console's URL of broker `id` (started with `STRATA_CONSOLE_LISTEN`), from its
    /// `console on <url>` log line.
    pub fn console_url(&mut self, id: i32) -> String {
        let line = self
            .broker(id)
            .log_lines_containing("console on ")
            .pop()
            .unwrap_or_else(|| panic!("broker {id} logged no console address"));
        line.rsplit("console on ")
            .next()
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("no URL in {line:?}"))
            .to_string()
    }

    pub fn metrics_text(&mut self, id: i32) -> String {
        let broker = self.broker(id);
        let line = broker
            .log_lines_containing("metrics on ")
            .pop()
            .unwrap_or_else(|| panic!("broker {id} logged no metrics address"));
        let address = line
            .rsplit("metrics on ")
            .next()
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("no address in {line:?}"));
        let mut stream = std::net::TcpStream::connect(address).expect("connect to /metrics");
        stream
            .set_read_timeout(Some(DEADLINE))
            .expect("read timeout");
        std::io::Write::write_all(
            &mut stream,
            b"GET /metrics HTTP/1.1\r\nHost: strata\r\nConnection: close\r\n\r\n",
        )
        .expect("send the request");
        let mut text = String::new();
        std::io::Read::read_to_string(&mut stream, &mut text).expect("read /metrics");
        text
    }

    /// `strata partitions move TOPIC PARTITION --to TARGET`, which must succeed; returns what it
    /// printed.
    pub fn move_partition(&self, topic: &str, partition: i32, target: i32) -> String {
        let (partition_text, target_text) = (partition.to_string(), target.to_string());
        let finished = self.admin_command(&[
            "partitions",
            "move",
            topic,
            &partition_text,
            "--to",
            &target_text,
            "--timeout",
            "20s",
        ]);
        finished.assert_success(&format!("strata partitions move {topic} {partition}"));
        finished.stdout.trim().to_string()
    }

    pub fn admin_command(&self, args: &[&str]) -> Finished {
        let mut command = Command::new(strata_binary());
        command.args(args).arg("--storage").arg(self.storage.url());
        if let Some(wal) = &self.hooks.wal_storage {
            command.arg("--wal-storage").arg(wal);
        }
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("STRATA_") {
                command.env_remove(name);
            }
        }
        command.env("NO_COLOR", "1");
        run_with_deadline(command, b"", DEADLINE)
    }

    /// Every broker's `acquired ...` and `handed over ...` lines, for the timing report.
    pub fn ownership_log(&self, topic: &str) -> Vec<String> {
        let mut lines = Vec::new();
        for (id, broker) in &self.brokers {
            for needle in ["acquired ", "handed over ", "sealing its stream", "fenced"] {
                for line in broker.log_lines_containing(needle) {
                    if line.contains(topic) || !needle.ends_with(' ') {
                        lines.push(format!("broker {id}: {}", short_log_line(&line)));
                    }
                }
            }
        }
        lines
    }
}

/// `"3s"` or `"500ms"`, as these tests write durations for the broker's flags.
pub fn parse_millis(text: &str) -> Duration {
    if let Some(ms) = text.strip_suffix("ms") {
        Duration::from_millis(ms.parse().expect("a duration in ms"))
    } else {
        let seconds = text.strip_suffix('s').expect("a duration in s or ms");
        Duration::from_secs(seconds.parse().expect("a duration in s"))
    }
}

/// Waits for a point in time, for conditions the brokers define by their own clocks (how long
/// a broker has been live) and that no request can observe.
pub fn wait_for_clock(what: &str, at: Instant) {
    wait_until(what, DEADLINE, || (Instant::now() >= at).then_some(()));
}

/// A log line without its timestamp-independent noise: the part from the level on.
pub fn short_log_line(line: &str) -> String {
    line.split_once("Z ")
        .map(|(time, rest)| {
            let clock = time.rsplit_once('T').map_or(time, |(_, c)| c);
            format!("{clock} {}", rest.trim())
        })
        .unwrap_or_else(|| line.to_string())
}

/// The "in N ms" figures of the brokers' log lines containing `needle` for `topic`.
pub fn reported_millis(cluster: &Cluster, needle: &str, topic: &str) -> Vec<u64> {
    let mut millis = Vec::new();
    for broker in cluster.brokers.values() {
        for line in broker.log_lines_containing(needle) {
            if !line.contains(&format!("{topic}-")) {
                continue;
            }
            if let Some(ms) = line
                .split_once(" in ")
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .and_then(|n| n.parse().ok())
            {
                millis.push(ms);
            }
        }
    }
    millis.sort_unstable();
    millis
}

pub fn describe_millis(millis: &[u64]) -> String {
    if millis.is_empty() {
        return "none".to_string();
    }
    let median = millis[millis.len() / 2];
    format!(
        "{} of them, min {} ms, median {median} ms, max {} ms",
        millis.len(),
        millis[0],
        millis[millis.len() - 1]
    )
}

#[derive(Debug)]
pub struct ClusterView {
    pub brokers: BTreeSet<i32>,
    /// partition -> leader, for partitions answered without error.
    pub leaders: BTreeMap<i32, i32>,
}

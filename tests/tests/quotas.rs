//! Client quotas end to end: set with `strata quotas`, enforced on a real librdkafka producer
//! (throttle_time_ms and muting), not on a client without a quota, and seen by every broker of
//! a cluster on shared storage. Also the metrics endpoint's bearer token.

// A failed expectation in a test is a panic; helpers here are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use kafka_protocol::messages::describe_client_quotas_request::ComponentData;
use kafka_protocol::messages::{DescribeClientQuotasRequest, MetadataRequest, ProduceRequest};
use kafka_protocol::protocol::StrBytes;
use rdkafka::producer::FutureRecord;
use strata_tests::batch::{encode_batch, BatchRecord, Codec};
use strata_tests::binary::strata_binary;
use strata_tests::clients::{create_topic, producer};
use strata_tests::cluster::Cluster;
use strata_tests::command::{run_with_deadline, Finished};
use strata_tests::process::http_get;
use strata_tests::raw::{produce_partition_response, produce_request, RawConnection};
use strata_tests::wait::{wait_until, DEADLINE};
use strata_tests::{StrataOptions, StrataProcess};

const QUOTA: f64 = 1024.0 * 1024.0;

fn strata(args: &[&str]) -> Finished {
    let mut command = Command::new(strata_binary());
    command.args(args);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("STRATA_") {
            command.env_remove(name);
        }
    }
    run_with_deadline(command, b"", DEADLINE)
}

/// The value of one series (labels included) in the broker's /metrics.
fn metric(broker: &StrataProcess, series: &str) -> f64 {
    broker
        .metric(series)
        .unwrap_or_else(|| panic!("no {series} in /metrics"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_over_its_quota_is_held_near_it_while_another_client_is_not_throttled() {
    // Three one-second samples: the rate (and so the first throttle) reacts after about two
    // seconds of traffic instead of Kafka's ten, so a few seconds of producing show it.
    let broker = StrataProcess::start_with(
        StrataOptions::default()
            .with_args(["--metrics-listen", "127.0.0.1:0"])
            .with_config("quota_window_num = 3\nquota_window_size = \"1s\"\n"),
    );
    let bootstrap = broker.bootstrap();
    create_topic(&bootstrap, "quoted", 1, &[]).await;
    strata(&[
        "quotas",
        "alter",
        "--client-id",
        "greedy",
        "--set",
        &format!("producer_byte_rate={QUOTA}"),
        "--bootstrap-server",
        &bootstrap,
    ])
    .assert_success("strata quotas alter");
    let described = strata(&[
        "quotas",
        "describe",
        "--client-id",
        "greedy",
        "--bootstrap-server",
        &bootstrap,
        "--json",
    ]);
    described.assert_success("strata quotas describe");
    let doc: serde_json::Value = serde_json::from_str(&described.stdout).unwrap();
    assert_eq!(doc[0]["values"]["producer_byte_rate"], QUOTA, "{doc}");
    assert_eq!(doc[0]["entity"][0]["entity_name"], "greedy", "{doc}");
    let defaults = strata(&[
        "quotas",
        "describe",
        "--client-id-default",
        "--bootstrap-server",
        &bootstrap,
        "--json",
    ]);
    defaults.assert_success("strata quotas describe --client-id-default");
    assert_eq!(defaults.stdout.trim(), "[]");

    // As fast as librdkafka goes, 64 KiB records, 32 in flight, for five seconds.
    let greedy = producer(&bootstrap, &[("client.id", "greedy"), ("linger.ms", "0")]);
    let value = vec![b'x'; 64 * 1024];
    let started = Instant::now();
    let mut inflight = FuturesUnordered::new();
    let mut acked = 0usize;
    while started.elapsed() < Duration::from_secs(5) {
        while inflight.len() < 32 {
            let greedy = greedy.clone();
            let value = value.clone();
            inflight.push(async move {
                greedy
                    .send(
                        FutureRecord::<(), [u8]>::to("quoted").payload(&value[..]),
                        Duration::from_secs(30),
                    )
                    .await
                    .map(|_| value.len())
            });
        }
        if let Some(done) = inflight.next().await {
            acked += done.map_err(|(e, _)| e).expect("a produce acknowledged");
        }
    }
    // Every send answered before the broker's counters are read: none may land after.
    while let Some(done) = inflight.next().await {
        acked += done.map_err(|(e, _)| e).expect("a produce acknowledged");
    }
    drop(greedy);
    let elapsed = started.elapsed().as_secs_f64();
    let achieved = acked as f64 / elapsed;
    eprintln!(
        "greedy: {acked} bytes acknowledged in {elapsed:.2}s: {:.0} KiB/s (quota {:.0} KiB/s)",
        achieved / 1024.0,
        QUOTA / 1024.0
    );
    assert!(achieved < 2.0 * QUOTA, "{achieved} B/s against {QUOTA}");
    assert!(acked > 0);
    let throttled = metric(
        &broker,
        "strata_quota_throttle_seconds_total{kind=\"produce\"}",
    );
    let responses = metric(
        &broker,
        "strata_quota_throttled_responses_total{kind=\"produce\"}",
    );
    assert!(
        throttled > 0.0 && responses > 0.0,
        "{throttled} s, {responses}"
    );

    // Another client id, with no quota: 16 MiB as fast as it is answered, never throttled.
    let mut other = RawConnection::connect(broker.addr());
    let versions = other.api_versions();
    let version = RawConnection::negotiate::<ProduceRequest>(&versions, 9);
    let batch = encode_batch(
        &[BatchRecord::new(b"k", &vec![b'y'; 512 * 1024])],
        0,
        Codec::None,
    );
    for _ in 0..32 {
        let response = other.request(version, &produce_request("quoted", 0, batch.clone()));
        assert_eq!(response.throttle_time_ms, 0);
        let partition = produce_partition_response(response, "quoted", 0);
        assert_eq!(partition.error_code, 0, "{partition:?}");
    }
    assert_eq!(
        metric(
            &broker,
            "strata_quota_throttled_responses_total{kind=\"produce\"}"
        ),
        responses,
        "only the greedy client was throttled"
    );
}

/// `request_percentage`: a client that keeps the broker busy past its share is answered with
/// `throttle_time_ms` and muted (Kafka's request quota), counted under kind="request"; a
/// client under no quota is never throttled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_its_request_time_quota_is_throttled_while_another_is_not() {
    let broker = StrataProcess::start_with(
        StrataOptions::default()
            .with_args(["--metrics-listen", "127.0.0.1:0"])
            // Throttles capped at 2 s, so the muted connection is read again well within the
            // raw client's read timeout.
            .with_config(
                "quota_window_num = 3\nquota_window_size = \"1s\"\nquota_max_throttle = \"2s\"\n",
            ),
    );
    let bootstrap = broker.bootstrap();
    create_topic(&bootstrap, "busy", 4, &[]).await;
    // Half a percent of one thread: 5 ms of handling per second. The raw connection below
    // names itself `strata-tests-raw`.
    strata(&[
        "quotas",
        "alter",
        "--client-id",
        "strata-tests-raw",
        "--set",
        "request_percentage=0.5",
        "--bootstrap-server",
        &bootstrap,
    ])
    .assert_success("strata quotas alter");
    let described = strata(&[
        "quotas",
        "describe",
        "--client-id",
        "strata-tests-raw",
        "--bootstrap-server",
        &bootstrap,
        "--json",
    ]);
    described.assert_success("strata quotas describe");
    let doc: serde_json::Value = serde_json::from_str(&described.stdout).unwrap();
    assert_eq!(doc[0]["values"]["request_percentage"], 0.5, "{doc}");

    // Metadata for every topic, each sent as soon as the last is answered, until one comes
    // back throttled. Quotas are read from storage on a change marker, so the first answers
    // may still be unthrottled.
    let mut busy = RawConnection::connect(broker.addr());
    let versions = busy.api_versions();
    let version = RawConnection::negotiate::<MetadataRequest>(&versions, 12);
    let deadline = Instant::now() + DEADLINE;
    let mut requests = 0u64;
    let throttle_ms = loop {
        let response = busy.request(version, &MetadataRequest::default().with_topics(None));
        requests += 1;
        assert!(
            response
                .topics
                .iter()
                .any(|t| t.name.as_ref().is_some_and(|n| n.as_str() == "busy")),
            "every topic is described"
        );
        if response.throttle_time_ms > 0 {
            break response.throttle_time_ms;
        }
        assert!(
            Instant::now() < deadline,
            "{requests} Metadata requests in {DEADLINE:?} and none throttled"
        );
    };
    eprintln!("throttled {throttle_ms} ms after {requests} Metadata requests");
    // Muted for the throttle: the next request is read only once it is over, and answered.
    let next = busy.request(version, &MetadataRequest::default().with_topics(None));
    assert!(next
        .topics
        .iter()
        .any(|t| t.name.as_ref().is_some_and(|n| n.as_str() == "busy")));
    drop(busy);
    let throttled = metric(
        &broker,
        "strata_quota_throttled_responses_total{kind=\"request\"}",
    );
    assert!(throttled >= 1.0, "{throttled} throttled responses counted");
    assert!(
        metric(
            &broker,
            "strata_quota_throttle_seconds_total{kind=\"request\"}"
        ) > 0.0
    );

    // Another client id, with no quota: as many produce and Metadata round trips, none
    // throttled.
    let calm = producer(&bootstrap, &[("client.id", "calm"), ("linger.ms", "0")]);
    for i in 0..200u32 {
        calm.send(
            FutureRecord::<(), [u8]>::to("busy").payload(&i.to_be_bytes()[..]),
            Duration::from_secs(30),
        )
        .await
        .map_err(|(e, _)| e)
        .expect("a produce acknowledged");
    }
    drop(calm);
    assert_eq!(
        metric(
            &broker,
            "strata_quota_throttled_responses_total{kind=\"request\"}"
        ),
        throttled,
        "only the busy client was throttled"
    );
}

#[test]
fn a_quota_altered_through_one_broker_is_applied_by_the_other() {
    let cluster = Cluster::start(2, "3s", "500ms");
    strata(&[
        "quotas",
        "alter",
        "--user",
        "alice",
        "--client-id-default",
        "--set",
        "consumer_byte_rate=2048",
        "--bootstrap-server",
        &cluster.bootstrap_of(&[1]),
    ])
    .assert_success("strata quotas alter through broker 1");
    let addr: SocketAddr = cluster.bootstrap_of(&[2]).parse().unwrap();
    let mut broker2 = RawConnection::connect(addr);
    let request =
        DescribeClientQuotasRequest::default().with_components(vec![ComponentData::default()
            .with_entity_type(StrBytes::from_static_str("user"))
            .with_match_type(0)
            .with_match(Some(StrBytes::from_static_str("alice")))]);
    let value = wait_until("broker 2 describes alice's quota", DEADLINE, || {
        let response = broker2.request(1, &request);
        assert_eq!(response.error_code, 0);
        let entry = response.entries?.into_iter().next()?;
        let parts: Vec<_> = entry
            .entity
            .iter()
            .map(|e| {
                (
                    e.entity_type.to_string(),
                    e.entity_name.as_ref().map(|n| n.to_string()),
                )
            })
            .collect();
        assert_eq!(
            parts,
            [
                ("client-id".to_string(), None),
                ("user".to_string(), Some("alice".to_string()))
            ]
        );
        entry.values.first().map(|v| (v.key.to_string(), v.value))
    });
    assert_eq!(value, ("consumer_byte_rate".to_string(), 2048.0));
}

#[test]
fn the_metrics_endpoint_wants_its_token_and_health_does_not() {
    let mut options = StrataOptions::default().with_args(["--metrics-listen", "127.0.0.1:0"]);
    options
        .env
        .push(("STRATA_METRICS_TOKEN".into(), "t0ken-of-the-test".into()));
    let broker = StrataProcess::start_with(options);
    let address = broker.metrics_address();
    let refused = http_get(address, "/metrics", "");
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
    let wrong = http_get(address, "/metrics", "Authorization: Bearer t0ken\r\n");
    assert!(wrong.starts_with("HTTP/1.1 401"), "{wrong}");
    let served = http_get(
        address,
        "/metrics",
        "Authorization: Bearer t0ken-of-the-test\r\n",
    );
    assert!(served.starts_with("HTTP/1.1 200"), "{served}");
    assert!(served.contains("strata_storage_requests_total"));
    let health = http_get(address, "/health", "");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
}

/// An over-quota Fetch as Kafka answers it, end to end: a fetch reads at most what the quota
/// allows over its window, one that would go over is answered with `throttle_time_ms` and
/// no partitions, and librdkafka, fetching under the same quota, still reads every record
/// (the bound keeps a large fetch from being over the quota on its own every time).
#[test]
fn an_over_quota_fetch_is_answered_empty_and_a_consumer_still_reads_everything() {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse, TopicName};
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::Message;

    // Three one-second windows: a fetch reads at most 2 × 256 KiB.
    let broker = StrataProcess::start_with(
        StrataOptions::default()
            .with_args(["--metrics-listen", "127.0.0.1:0"])
            .with_config("quota_window_num = 3\nquota_window_size = \"1s\"\n"),
    );
    let bootstrap = broker.bootstrap();
    let mut raw = RawConnection::connect(broker.addr());
    let batch = encode_batch(
        &[BatchRecord::new(b"k", &vec![b'z'; 128 * 1024])],
        0,
        Codec::None,
    );
    for _ in 0..8 {
        let response = raw.request(9, &produce_request("metered", 0, batch.clone()));
        let partition = produce_partition_response(response, "metered", 0);
        assert_eq!(partition.error_code, 0, "{partition:?}");
    }
    strata(&[
        "quotas",
        "alter",
        "--client-id-default",
        "--set",
        "consumer_byte_rate=262144",
        "--bootstrap-server",
        &bootstrap,
    ])
    .assert_success("strata quotas alter");

    let fetch = |raw: &mut RawConnection| -> FetchResponse {
        let request = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_bytes(50 << 20)
            .with_session_epoch(-1)
            .with_topics(vec![FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_static_str("metered")))
                .with_partitions(vec![FetchPartition::default()
                    .with_fetch_offset(0)
                    .with_current_leader_epoch(-1)
                    .with_log_start_offset(-1)
                    .with_partition_max_bytes(50 << 20)])]);
        raw.request(12, &request)
    };
    let first = fetch(&mut raw);
    let bytes: usize = first
        .responses
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| p.records.as_ref().map_or(0, |r| r.len()))
        .sum();
    assert!(
        bytes > 0 && bytes <= 3 * (128 * 1024 + 100),
        "a fetch reads at most the quota's window (512 KiB) but whole batches: {bytes}"
    );
    assert_eq!(first.throttle_time_ms, 0);
    let second = fetch(&mut raw);
    assert!(second.throttle_time_ms > 0, "{}", second.throttle_time_ms);
    assert!(second.responses.is_empty(), "over the quota: no partitions");

    let mut config = strata_tests::clients::base_config(&bootstrap);
    config
        .set("group.id", "metered-reader")
        .set("enable.auto.commit", "false");
    let consumer: BaseConsumer<strata_tests::clients::TestContext> = config
        .create_with_context(strata_tests::clients::TestContext)
        .unwrap();
    let mut offsets = rdkafka::TopicPartitionList::new();
    offsets
        .add_partition_offset("metered", 0, rdkafka::Offset::Beginning)
        .unwrap();
    consumer.assign(&offsets).unwrap();
    let mut read = 0;
    wait_until(
        "librdkafka reads all 8 records under the quota",
        DEADLINE,
        || {
            if let Some(message) = consumer.poll(Duration::from_millis(100)) {
                let message = message.expect("a record, not an error");
                assert_eq!(message.payload().map(<[u8]>::len), Some(128 * 1024));
                read += 1;
            }
            (read == 8).then_some(())
        },
    );
    assert!(
        metric(
            &broker,
            "strata_quota_throttled_responses_total{kind=\"fetch\"}"
        ) >= 1.0
    );
}

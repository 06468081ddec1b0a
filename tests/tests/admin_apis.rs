//! The admin APIs current tools call, against the real binary: confluent-kafka's AdminClient
//! (tests/python/admin.py), and, for the APIs librdkafka does not
//! send (it describes topics with Metadata and has no DescribeLogDirs), hand-built requests.

// A failed expectation in a test is a panic; helpers here are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::describe_topic_partitions_request::TopicRequest;
use kafka_protocol::messages::{
    DescribeClusterRequest, DescribeConfigsRequest, DescribeLogDirsRequest,
    DescribeTopicPartitionsRequest,
};
use kafka_protocol::protocol::StrBytes;
use strata_tests::batch::{self, BatchRecord, Codec};
use strata_tests::clients::create_topic;
use strata_tests::command::run_with_deadline;
use strata_tests::raw::{topic_name, RawConnection, PRODUCE_VERSION_CAP};
use strata_tests::records::now_ms;
use strata_tests::StrataProcess;

const CLIENT_DEADLINE: Duration = Duration::from_secs(120);

#[test]
fn python_admin_client_describes_the_broker() {
    let broker = StrataProcess::start_with(
        strata_tests::StrataOptions::default().with_args(["--group-initial-rebalance-delay", "0s"]),
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/admin.py");
    let mut command = Command::new("python3");
    command
        .arg(&script)
        .arg("--bootstrap")
        .arg(broker.bootstrap())
        .arg("--port")
        .arg(broker.addr().port().to_string())
        .arg("--topic")
        .arg("python-admin");
    let finished = run_with_deadline(command, b"", CLIENT_DEADLINE);
    finished.assert_success("tests/python/admin.py");
}

#[tokio::test]
async fn describe_log_dirs_and_topic_partitions_over_the_wire() {
    let broker = StrataProcess::start();
    create_topic(&broker.bootstrap(), "described", 3, &[]).await;
    let mut raw = RawConnection::connect(broker.addr());
    let records = batch::encode_batch(&[BatchRecord::new(b"k", b"v")], now_ms(), Codec::None);
    let produced = raw.produce(PRODUCE_VERSION_CAP, "described", 1, records.clone());
    assert_eq!(produced.error_code, 0);

    let cluster = raw.request(1, &DescribeClusterRequest::default());
    let me = cluster.brokers[0].broker_id.0;

    let mut all = DescribeLogDirsRequest::default();
    all.topics = None;
    let dirs = raw.request(4, &all);
    assert_eq!((dirs.error_code, dirs.results.len()), (0, 1));
    let dir = &dirs.results[0];
    let name = dir.log_dir.to_string();
    assert!(!name.contains('?') && !name.contains('@'), "{name}");
    if std::env::var("STRATA_TEST_STORAGE").map_or(true, |s| s.is_empty()) {
        assert_eq!(
            name,
            format!("file://{}", broker.data_dir().join("store").display())
        );
    }
    let topic = dir
        .topics
        .iter()
        .find(|t| t.name.0.as_str() == "described")
        .expect("the broker hosts the topic");
    let sizes: Vec<(i32, i64)> = topic
        .partitions
        .iter()
        .map(|p| (p.partition_index, p.partition_size))
        .collect();
    assert_eq!(sizes, [(0, 0), (1, records.len() as i64), (2, 0)]);

    let mut request = DescribeTopicPartitionsRequest::default();
    let mut wanted = TopicRequest::default();
    wanted.name = topic_name("described");
    request.topics = vec![wanted];
    request.response_partition_limit = 2;
    let first = raw.request(0, &request);
    let partitions: Vec<(i32, i32)> = first.topics[0]
        .partitions
        .iter()
        .map(|p| (p.partition_index, p.leader_id.0))
        .collect();
    assert_eq!(partitions, [(0, me), (1, me)]);
    let cursor = first.next_cursor.expect("a cursor to the third partition");
    assert_eq!(cursor.partition_index, 2);
    request.cursor = Some({
        let mut c = kafka_protocol::messages::describe_topic_partitions_request::Cursor::default();
        c.topic_name = cursor.topic_name;
        c.partition_index = cursor.partition_index;
        c
    });
    let rest = raw.request(0, &request);
    assert_eq!(rest.topics[0].partitions.len(), 1);
    assert!(rest.next_cursor.is_none());

    // The server fills `listeners` from the address it bound.
    let mut resource = DescribeConfigsResource::default();
    resource.resource_type = 4;
    resource.resource_name = StrBytes::from_string(me.to_string());
    resource.configuration_keys = Some(vec![StrBytes::from_static_str("listeners")]);
    let mut configs = DescribeConfigsRequest::default();
    configs.resources = vec![resource];
    let described = raw.request(4, &configs);
    let listeners = described.results[0].configs[0].value.clone().unwrap();
    assert_eq!(
        listeners.as_str(),
        format!("PLAINTEXT://{}", broker.bootstrap())
    );
}

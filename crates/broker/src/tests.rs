//! In-process tests: a broker on a memory store, driven over TCP with hand-built Kafka frames.
//! Real clients (librdkafka, Python, Java) are exercised by the end-to-end tests.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use strata_core::{BrokerId, SystemClock};
use strata_log::{LogConfig, LogManager};
use strata_storage::{MemoryStore, ObjectStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::handlers::topic_name;
use crate::{supported_apis, Broker, BrokerParts, BrokerSettings};

/// Bound on every wait in these tests: far above what any step needs, so hitting it means a
/// hang, not slowness.
const PATIENCE: Duration = Duration::from_secs(20);

struct TestBroker {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    served: JoinHandle<()>,
    log: Arc<LogManager>,
    store: Arc<dyn ObjectStore>,
    txn: Arc<crate::txn_coordinator::TxnCoordinator>,
}

async fn start_with(tweak: impl FnOnce(&mut BrokerSettings)) -> TestBroker {
    start_on(Arc::new(MemoryStore::new()), tweak).await
}

/// A broker on `store`, which may hold what an earlier broker left (a restart).
async fn start_on(
    store: Arc<dyn ObjectStore>,
    tweak: impl FnOnce(&mut BrokerSettings),
) -> TestBroker {
    let clock = SystemClock::shared();
    let log = LogManager::open(
        Arc::clone(&store),
        Arc::clone(&clock),
        LogConfig::default(),
        BrokerId(0),
    )
    .await
    .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut settings = BrokerSettings {
        advertised_port: addr.port(),
        // Tests do not wait for more members to arrive before the first rebalance completes.
        group_initial_rebalance_delay: Duration::ZERO,
        ..BrokerSettings::default()
    };
    tweak(&mut settings);
    let broker = Broker::open(BrokerParts {
        log: Arc::clone(&log),
        clock,
        settings,
        member_id_seed: rand_seed(),
    })
    .await
    .unwrap()
    .with_users(Arc::clone(&store))
    .with_share_state(Arc::clone(&store))
    .with_acls(Arc::clone(&store))
    .await
    .unwrap()
    .with_quotas(Arc::clone(&store));
    let txn = Arc::clone(&broker.txn);
    let (stop, stopped) = oneshot::channel::<()>();
    let served = tokio::spawn(Arc::new(broker).serve(listener, async {
        let _ = stopped.await;
    }));
    TestBroker {
        addr,
        stop: Some(stop),
        served,
        log,
        store,
        txn,
    }
}

/// A different seed for every broker of a test run, as production draws one from randomness:
/// a restarted broker must not hand out its predecessor's member ids.
fn rand_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(0x9E37_79B9, Ordering::Relaxed)
}

async fn start() -> TestBroker {
    start_with(|_| {}).await
}

impl TestBroker {
    async fn client(&self) -> Client {
        Client {
            stream: TcpStream::connect(self.addr).await.unwrap(),
            next_correlation: 1,
        }
    }

    async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(PATIENCE, self.served)
            .await
            .expect("serve returns after shutdown")
            .unwrap();
    }

    /// Stops the broker and its log as the server does, and hands back the store so that a
    /// new broker can be started on it.
    async fn stop_and_keep_store(self) -> Arc<dyn ObjectStore> {
        let log = Arc::clone(&self.log);
        let store = Arc::clone(&self.store);
        self.shutdown().await;
        log.shutdown().await.unwrap();
        store
    }
}

struct Client {
    stream: TcpStream,
    next_correlation: i32,
}

impl Client {
    /// Sends a request; returns its correlation id.
    async fn send<R: Encodable>(&mut self, key: ApiKey, version: i16, request: &R) -> i32 {
        let correlation_id = self.next_correlation;
        self.next_correlation += 1;
        let mut header = RequestHeader::default();
        header.request_api_key = key as i16;
        header.request_api_version = version;
        header.correlation_id = correlation_id;
        header.client_id = Some(StrBytes::from_static_str("broker-test"));
        let mut body = BytesMut::new();
        header
            .encode(&mut body, key.request_header_version(version))
            .unwrap();
        request.encode(&mut body, version).unwrap();
        self.send_raw(&body).await;
        correlation_id
    }

    async fn send_raw(&mut self, body: &[u8]) {
        let mut frame = BytesMut::with_capacity(4 + body.len());
        frame.put_i32(i32::try_from(body.len()).unwrap());
        frame.put_slice(body);
        self.stream.write_all(&frame).await.unwrap();
    }

    /// The next response frame, or None if the broker closed the connection.
    async fn recv_frame(&mut self) -> Option<Bytes> {
        let read = async {
            let mut len = [0u8; 4];
            self.stream.read_exact(&mut len).await.ok()?;
            let mut body = vec![0u8; usize::try_from(i32::from_be_bytes(len)).ok()?];
            self.stream.read_exact(&mut body).await.ok()?;
            Some(Bytes::from(body))
        };
        tokio::time::timeout(PATIENCE, read)
            .await
            .expect("a response or a close")
    }

    async fn recv<R: Decodable + HeaderVersion>(&mut self, version: i16) -> (i32, R) {
        let mut frame = self.recv_frame().await.expect("a response, not a close");
        let header = ResponseHeader::decode(&mut frame, R::header_version(version)).unwrap();
        let body = R::decode(&mut frame, version).unwrap();
        (header.correlation_id, body)
    }

    async fn call<Req: Encodable, Resp: Decodable + HeaderVersion>(
        &mut self,
        key: ApiKey,
        version: i16,
        request: &Req,
    ) -> Resp {
        let sent = self.send(key, version, request).await;
        let (got, response) = self.recv(version).await;
        assert_eq!(got, sent, "correlation id");
        response
    }
}

// --- request builders ---

fn zigzag_varint(out: &mut BytesMut, value: i64) {
    let mut v = ((value << 1) ^ (value >> 63)) as u64;
    while v >= 0x80 {
        out.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    out.put_u8(v as u8);
}

/// A magic-2 record batch of uncompressed records without keys.
pub(crate) fn record_batch(values: &[&[u8]], timestamp: i64) -> Bytes {
    producer_batch(values, timestamp, (-1, -1, -1))
}

/// [`record_batch`] from an idempotent producer: (producer id, epoch, base sequence).
pub(crate) fn producer_batch(
    values: &[&[u8]],
    timestamp: i64,
    (producer_id, epoch, base_sequence): (i64, i16, i32),
) -> Bytes {
    let mut records = BytesMut::new();
    for (i, value) in values.iter().enumerate() {
        let mut record = BytesMut::new();
        record.put_i8(0); // attributes
        zigzag_varint(&mut record, 0); // timestamp delta
        zigzag_varint(&mut record, i as i64); // offset delta
        zigzag_varint(&mut record, -1); // key: null
        zigzag_varint(&mut record, value.len() as i64);
        record.put_slice(value);
        zigzag_varint(&mut record, 0); // headers
        zigzag_varint(&mut records, record.len() as i64);
        records.put_slice(&record);
    }
    let mut after_crc = BytesMut::new();
    after_crc.put_i16(0); // attributes
    after_crc.put_i32(values.len() as i32 - 1); // last offset delta
    after_crc.put_i64(timestamp);
    after_crc.put_i64(timestamp);
    after_crc.put_i64(producer_id);
    after_crc.put_i16(epoch);
    after_crc.put_i32(base_sequence);
    after_crc.put_i32(values.len() as i32);
    after_crc.put_slice(&records);
    let mut batch = BytesMut::new();
    batch.put_i64(0); // base offset
    batch.put_i32((4 + 1 + 4 + after_crc.len()) as i32); // batch length
    batch.put_i32(-1); // partition leader epoch
    batch.put_i8(2); // magic
    batch.put_u32(crc32c::crc32c(&after_crc));
    batch.put_slice(&after_crc);
    batch.freeze()
}

fn metadata_request(topics: &[&str]) -> MetadataRequest {
    let mut request = MetadataRequest::default();
    request.topics = Some(
        topics
            .iter()
            .map(|t| {
                let mut topic = MetadataRequestTopic::default();
                topic.name = Some(topic_name(t));
                topic
            })
            .collect(),
    );
    request.allow_auto_topic_creation = true;
    request
}

fn produce_request(topic: &str, acks: i16, records: Bytes) -> ProduceRequest {
    let mut partition = PartitionProduceData::default();
    partition.index = 0;
    partition.records = Some(records);
    let mut t = TopicProduceData::default();
    t.name = topic_name(topic);
    t.partition_data = vec![partition];
    let mut request = ProduceRequest::default();
    request.acks = acks;
    request.timeout_ms = 10_000;
    request.topic_data = vec![t];
    request
}

fn fetch_request(topic: &str, offset: i64, max_wait_ms: i32, min_bytes: i32) -> FetchRequest {
    let mut partition = FetchPartition::default();
    partition.partition = 0;
    partition.fetch_offset = offset;
    partition.partition_max_bytes = 1 << 20;
    let mut t = FetchTopic::default();
    t.topic = topic_name(topic);
    t.partitions = vec![partition];
    let mut request = FetchRequest::default();
    request.replica_id = kafka_protocol::messages::BrokerId(-1);
    request.max_wait_ms = max_wait_ms;
    request.min_bytes = min_bytes;
    request.max_bytes = 50 << 20;
    request.session_epoch = -1;
    request.topics = vec![t];
    request
}

async fn create_topic(client: &mut Client, name: &str) -> uuid::Uuid {
    let metadata: MetadataResponse = client
        .call(ApiKey::Metadata, 12, &metadata_request(&[name]))
        .await;
    assert_eq!(metadata.topics[0].error_code, 0);
    metadata.topics[0].topic_id
}

// --- tests ---

mod acls;
mod admin;
mod cluster;
mod fetch_sessions;
mod groups;
pub(crate) mod held_listing;
mod quotas;
mod security;
mod share;
mod txn;

#[tokio::test]
async fn api_versions_of_an_unknown_version_answers_v0_with_the_supported_list() {
    let broker = start().await;
    let mut client = broker.client().await;
    // A future ApiVersions v99: flexible header v2, and a body we cannot know.
    let mut body = BytesMut::new();
    body.put_i16(ApiKey::ApiVersions as i16);
    body.put_i16(99);
    body.put_i32(7);
    body.put_i16(-1); // client id: null
    body.put_u8(0); // no tagged fields
    body.put_slice(b"\x00whatever-v99-carries");
    client.send_raw(&body).await;
    let mut frame = client.recv_frame().await.unwrap();
    let header = ResponseHeader::decode(&mut frame, 0).unwrap();
    assert_eq!(header.correlation_id, 7);
    let response = ApiVersionsResponse::decode(&mut frame, 0).unwrap();
    assert_eq!(response.error_code, 35);
    let produce = response
        .api_keys
        .iter()
        .find(|k| k.api_key == ApiKey::Produce as i16)
        .unwrap();
    assert_eq!((produce.min_version, produce.max_version), (3, 13));
    // The connection stays usable: the client retries with a version we support.
    let response: ApiVersionsResponse = client
        .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
        .await;
    assert_eq!(response.error_code, 0);
    assert_eq!(response.api_keys.len(), supported_apis().len());
    broker.shutdown().await;
}

#[tokio::test]
async fn acks_zero_produce_gets_no_response() {
    let broker = start().await;
    let mut client = broker.client().await;
    create_topic(&mut client, "fire-and-forget").await;
    let batch = record_batch(&[b"one"], 1_700_000_000_000);
    client
        .send(
            ApiKey::Produce,
            9,
            &produce_request("fire-and-forget", 0, batch),
        )
        .await;
    let next = client
        .send(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
        .await;
    let (got, _): (i32, ApiVersionsResponse) = client.recv(3).await;
    assert_eq!(got, next, "the first response is the ApiVersions one");
    // ... and the record was appended all the same.
    let fetch: FetchResponse = client
        .call(
            ApiKey::Fetch,
            11,
            &fetch_request("fire-and-forget", 0, 5_000, 1),
        )
        .await;
    let partition = &fetch.responses[0].partitions[0];
    assert_eq!(partition.error_code, 0);
    assert_eq!(partition.high_watermark, 1);
    broker.shutdown().await;
}

#[tokio::test]
async fn produced_batches_come_back_byte_for_byte_at_every_fetch_version() {
    let broker = start().await;
    let mut client = broker.client().await;
    let topic_id = create_topic(&mut client, "roundtrip").await;
    let mut sent = Vec::new();
    for (i, version) in (3..=13).enumerate() {
        let value = vec![b'a' + i as u8; 300 + i * 100];
        let batch = record_batch(&[&value, b"second"], 1_700_000_000_000 + i as i64);
        let mut request = produce_request("roundtrip", -1, batch.clone());
        if version >= 13 {
            request.topic_data[0].name = TopicName::default();
            request.topic_data[0].topic_id = topic_id;
        }
        let response: ProduceResponse = client.call(ApiKey::Produce, version, &request).await;
        let p = &response.responses[0].partition_responses[0];
        assert_eq!(p.error_code, 0, "produce v{version}: {:?}", p.error_message);
        assert_eq!(p.base_offset, 2 * i as i64, "produce v{version}");
        sent.push(batch);
    }
    for version in 4..=16 {
        let mut request = fetch_request("roundtrip", 0, 0, 0);
        if version >= 13 {
            request.topics[0].topic = TopicName::default();
            request.topics[0].topic_id = topic_id;
        }
        let response: FetchResponse = client.call(ApiKey::Fetch, version, &request).await;
        let p = &response.responses[0].partitions[0];
        assert_eq!(p.error_code, 0, "fetch v{version}");
        assert_eq!(p.high_watermark, 2 * sent.len() as i64);
        let mut records = p.records.clone().unwrap();
        for (i, batch) in sent.iter().enumerate() {
            let got = records.split_to(batch.len());
            assert_eq!(
                (&got[..8]).get_i64(),
                2 * i as i64,
                "fetch v{version}: base offset of batch {i}"
            );
            // Everything from the magic byte on is the producer's bytes (the CRC covers it).
            assert_eq!(got[16..], batch[16..], "fetch v{version}: batch {i}");
        }
        assert!(records.is_empty());
    }
    broker.shutdown().await;
}

#[tokio::test]
async fn a_long_poll_fetch_wakes_when_data_arrives() {
    let broker = start().await;
    let mut consumer = broker.client().await;
    let mut producer = broker.client().await;
    create_topic(&mut consumer, "wake").await;
    // Waits up to 60 s for one byte; the test's patience is 20 s, so only a wake-up passes.
    let sent = consumer
        .send(ApiKey::Fetch, 12, &fetch_request("wake", 0, 60_000, 1))
        .await;
    let response: ProduceResponse = producer
        .call(
            ApiKey::Produce,
            9,
            &produce_request("wake", 1, record_batch(&[b"hello"], 1)),
        )
        .await;
    assert_eq!(response.responses[0].partition_responses[0].error_code, 0);
    let (got, fetch): (i32, FetchResponse) = consumer.recv(12).await;
    assert_eq!(got, sent);
    assert!(!fetch.responses[0].partitions[0]
        .records
        .as_ref()
        .unwrap()
        .is_empty());
    broker.shutdown().await;
}

#[tokio::test]
async fn pipelined_responses_keep_request_order() {
    let broker = start().await;
    let mut client = broker.client().await;
    create_topic(&mut client, "ordered").await;
    // The fetch waits 300 ms for data that never comes; the ApiVersions behind it is instant.
    let first = client
        .send(ApiKey::Fetch, 11, &fetch_request("ordered", 0, 300, 1))
        .await;
    let second = client
        .send(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
        .await;
    let (got_first, _): (i32, FetchResponse) = client.recv(11).await;
    let (got_second, _): (i32, ApiVersionsResponse) = client.recv(3).await;
    assert_eq!((got_first, got_second), (first, second));
    broker.shutdown().await;
}

#[tokio::test]
async fn fetch_beyond_the_high_watermark_is_out_of_range() {
    let broker = start().await;
    let mut client = broker.client().await;
    create_topic(&mut client, "range").await;
    let fetch: FetchResponse = client
        .call(ApiKey::Fetch, 11, &fetch_request("range", 5, 100, 1))
        .await;
    assert_eq!(fetch.responses[0].partitions[0].error_code, 1);
    let fetch: FetchResponse = client
        .call(ApiKey::Fetch, 11, &fetch_request("missing", 0, 100, 1))
        .await;
    assert_eq!(fetch.responses[0].partitions[0].error_code, 3);
    broker.shutdown().await;
}

#[tokio::test]
async fn list_offsets_reports_earliest_and_latest() {
    let broker = start().await;
    let mut client = broker.client().await;
    create_topic(&mut client, "offsets").await;
    let _: ProduceResponse = client
        .call(
            ApiKey::Produce,
            9,
            &produce_request("offsets", -1, record_batch(&[b"a", b"b", b"c"], 1000)),
        )
        .await;
    for (timestamp, expected) in [(-2, 0), (-1, 3), (1000, 0), (5000, -1)] {
        let mut partition = ListOffsetsPartition::default();
        partition.partition_index = 0;
        partition.timestamp = timestamp;
        let mut topic = ListOffsetsTopic::default();
        topic.name = topic_name("offsets");
        topic.partitions = vec![partition];
        let mut request = ListOffsetsRequest::default();
        request.replica_id = kafka_protocol::messages::BrokerId(-1);
        request.topics = vec![topic];
        let response: ListOffsetsResponse = client.call(ApiKey::ListOffsets, 7, &request).await;
        let p = &response.topics[0].partitions[0];
        assert_eq!(
            (p.error_code, p.offset),
            (0, expected),
            "timestamp {timestamp}"
        );
    }
    broker.shutdown().await;
}

#[tokio::test]
async fn create_topics_refuses_replication_beyond_one_broker() {
    let broker = start().await;
    let mut client = broker.client().await;
    let topic = |name: &str, partitions: i32, rf: i16| {
        let mut t = CreatableTopic::default();
        t.name = topic_name(name);
        t.num_partitions = partitions;
        t.replication_factor = rf;
        t
    };
    let mut request = CreateTopicsRequest::default();
    request.timeout_ms = 5_000;
    request.topics = vec![
        topic("three-replicas", 1, 3),
        topic("defaults", -1, -1),
        topic("four", 4, 1),
        topic("bad/name", 1, 1),
    ];
    let response: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 7, &request).await;
    let codes: Vec<i16> = response.topics.iter().map(|t| t.error_code).collect();
    assert_eq!(codes, vec![38, 0, 0, 17]);
    assert_eq!(response.topics[2].num_partitions, 4);
    // Creating it again: TOPIC_ALREADY_EXISTS.
    request.topics = vec![topic("four", 4, 1)];
    let response: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 2, &request).await;
    assert_eq!(response.topics[0].error_code, 36);
    broker.shutdown().await;
}

#[tokio::test]
async fn every_advertised_version_of_metadata_and_api_versions_answers() {
    let broker = start().await;
    let mut client = broker.client().await;
    create_topic(&mut client, "versions").await;
    for version in 0..=12 {
        let mut request = metadata_request(&["versions"]);
        if version < 4 {
            request.allow_auto_topic_creation = true;
        }
        let response: MetadataResponse = client.call(ApiKey::Metadata, version, &request).await;
        assert_eq!(response.brokers.len(), 1, "metadata v{version}");
        assert_eq!(
            response.topics[0].partitions.len(),
            1,
            "metadata v{version}"
        );
    }
    for version in 0..=4 {
        let response: ApiVersionsResponse = client
            .call(ApiKey::ApiVersions, version, &ApiVersionsRequest::default())
            .await;
        assert_eq!(response.error_code, 0, "api versions v{version}");
    }
    broker.shutdown().await;
}

#[tokio::test]
async fn an_oversized_frame_closes_only_its_connection() {
    let broker = start_with(|s| s.max_request_bytes = 4096).await;
    let mut bad = broker.client().await;
    bad.stream
        .write_all(&(1_000_000i32).to_be_bytes())
        .await
        .unwrap();
    assert!(bad.recv_frame().await.is_none(), "closed");
    let mut good = broker.client().await;
    let response: ApiVersionsResponse = good
        .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
        .await;
    assert_eq!(response.error_code, 0);
    broker.shutdown().await;
}

#[tokio::test]
async fn unknown_api_keys_and_garbage_close_the_connection() {
    let broker = start().await;
    let mut client = broker.client().await;
    client.send_raw(&[0x7f, 0x00, 0, 0, 0, 0, 0, 1]).await;
    assert!(client.recv_frame().await.is_none());
    let mut client = broker.client().await;
    client.send_raw(&[0, 3]).await; // shorter than any request header
    assert!(client.recv_frame().await.is_none());
    // Metadata v1 whose topic array claims two billion entries.
    let mut client = broker.client().await;
    let mut body = BytesMut::new();
    body.put_i16(ApiKey::Metadata as i16);
    body.put_i16(1);
    body.put_i32(1);
    body.put_i16(-1);
    body.put_i32(i32::MAX);
    client.send_raw(&body).await;
    assert!(client.recv_frame().await.is_none());
    broker.shutdown().await;
}

#[tokio::test]
async fn shutdown_ends_long_polls_and_returns() {
    let broker = start().await;
    let mut client = broker.client().await;
    create_topic(&mut client, "stopping").await;
    let sent = client
        .send(ApiKey::Fetch, 12, &fetch_request("stopping", 0, 60_000, 1))
        .await;
    let stop = async {
        // Shutdown stops reading new requests, so the fetch must have been read first. There is
        // no signal for "read"; a pause is the honest way, and a too-short one fails loudly
        // (the fetch would never be answered) rather than passing by luck.
        tokio::time::sleep(Duration::from_millis(100)).await;
        broker.shutdown().await;
    };
    let read = async {
        let (got, _): (i32, FetchResponse) = client.recv(12).await;
        got
    };
    let ((), got) = tokio::join!(stop, read);
    assert_eq!(got, sent);
}

/// The newest catalog version in `store`: each catalog change writes the next one.
async fn catalog_version(store: &dyn ObjectStore) -> u64 {
    strata_layout::CatalogReader::new(store)
        .newest_version()
        .await
        .unwrap()
        .unwrap_or(0)
}

#[tokio::test]
async fn metadata_auto_creates_all_its_topics_in_one_catalog_change() {
    let broker = start().await;
    let mut client = broker.client().await;
    let before = catalog_version(broker.store.as_ref()).await;
    let names: Vec<String> = (0..50).map(|i| format!("auto-{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let response: MetadataResponse = client
        .call(ApiKey::Metadata, 12, &metadata_request(&names))
        .await;
    assert_eq!(response.topics.len(), 50);
    assert!(response.topics.iter().all(|t| t.error_code == 0));
    assert_eq!(
        broker.log.topics().len(),
        52,
        "50 topics, __consumer_offsets and __transaction_state"
    );
    // One change for the whole request, not one per topic (each rewrites the whole catalog).
    assert_eq!(catalog_version(broker.store.as_ref()).await, before + 1);
    broker.shutdown().await;
}

#[tokio::test]
async fn create_topics_creates_many_topics_in_one_catalog_change() {
    let broker = start().await;
    let mut client = broker.client().await;
    let before = catalog_version(broker.store.as_ref()).await;
    let mut request = CreateTopicsRequest::default();
    request.timeout_ms = 10_000;
    request.topics = (0..30)
        .map(|i| {
            let mut t = CreatableTopic::default();
            t.name = topic_name(&format!("made-{i}"));
            t.num_partitions = 2;
            t.replication_factor = -1;
            t
        })
        .collect();
    let response: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 7, &request).await;
    assert!(response.topics.iter().all(|t| t.error_code == 0));
    assert_eq!(catalog_version(broker.store.as_ref()).await, before + 1);
    // Asked again: every one already exists, and nothing is written.
    let response: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 7, &request).await;
    assert!(response.topics.iter().all(|t| t.error_code == 36));
    assert_eq!(catalog_version(broker.store.as_ref()).await, before + 1);
    broker.shutdown().await;
}

#[tokio::test]
async fn auto_creation_beyond_the_per_request_limit_is_deferred_with_a_retriable_error() {
    let broker = start_with(|s| {
        s.auto_create_topics_per_request = 10;
        s.auto_create_topics_per_second = 1000;
    })
    .await;
    let mut client = broker.client().await;
    let names: Vec<String> = (0..25).map(|i| format!("capped-{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let response: MetadataResponse = client
        .call(ApiKey::Metadata, 12, &metadata_request(&names))
        .await;
    let created = response.topics.iter().filter(|t| t.error_code == 0).count();
    let deferred = response.topics.iter().filter(|t| t.error_code == 5).count();
    assert_eq!(
        (created, deferred),
        (10, 15),
        "LEADER_NOT_AVAILABLE for the rest"
    );
    // The client retries, as it does on LEADER_NOT_AVAILABLE, and gets ten more each time.
    let response: MetadataResponse = client
        .call(ApiKey::Metadata, 12, &metadata_request(&names))
        .await;
    let created = response.topics.iter().filter(|t| t.error_code == 0).count();
    assert_eq!(created, 20);
    broker.shutdown().await;
}

#[tokio::test]
async fn auto_creation_beyond_the_per_second_limit_is_deferred() {
    let broker = start_with(|s| {
        s.auto_create_topics_per_request = 100;
        s.auto_create_topics_per_second = 5;
    })
    .await;
    let mut client = broker.client().await;
    let names: Vec<String> = (0..8).map(|i| format!("rated-{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let response: MetadataResponse = client
        .call(ApiKey::Metadata, 12, &metadata_request(&names))
        .await;
    let created = response.topics.iter().filter(|t| t.error_code == 0).count();
    let deferred = response.topics.iter().filter(|t| t.error_code == 5).count();
    assert_eq!((created, deferred), (5, 3));
    broker.shutdown().await;
}

/// Whether the broker closes `stream` (EOF or reset) within PATIENCE, reading and discarding
/// whatever it sends first.
async fn closed_by_broker(stream: &mut TcpStream) -> bool {
    let mut sink = [0u8; 1024];
    let closing = async {
        loop {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(PATIENCE, closing).await.is_ok()
}

#[tokio::test]
async fn a_request_trickling_in_is_cut_off_at_the_read_timeout() {
    let broker = start_with(|s| s.request_read_timeout = Duration::from_millis(300)).await;
    let mut stream = TcpStream::connect(broker.addr).await.unwrap();
    // The start of a frame, and then nothing more: the idle timeout (10 min) is not what ends it.
    stream.write_all(&[0, 0, 0, 40, 0, 3]).await.unwrap();
    assert!(closed_by_broker(&mut stream).await);
    // Other clients are served as before.
    let mut client = broker.client().await;
    let _: MetadataResponse = client
        .call(ApiKey::Metadata, 12, &metadata_request(&[]))
        .await;
    broker.shutdown().await;
}

#[tokio::test]
async fn an_idle_connection_is_closed_and_a_busy_one_is_not() {
    let broker = start_with(|s| s.connections_max_idle = Duration::from_millis(300)).await;
    let mut idle = TcpStream::connect(broker.addr).await.unwrap();
    assert!(closed_by_broker(&mut idle).await);
    broker.shutdown().await;
}

#[tokio::test]
async fn connections_beyond_the_per_address_limit_are_closed_at_once() {
    let broker = start_with(|s| s.max_connections_per_ip = 2).await;
    let mut first = broker.client().await;
    let _second = broker.client().await;
    let mut third = TcpStream::connect(broker.addr).await.unwrap();
    assert!(closed_by_broker(&mut third).await);
    let _: MetadataResponse = first
        .call(ApiKey::Metadata, 12, &metadata_request(&[]))
        .await;
    // A slot freed is a slot for the next connection.
    drop(first);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let mut next = broker.client().await;
        next.send(ApiKey::Metadata, 12, &metadata_request(&[]))
            .await;
        if next.recv_frame().await.is_some() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no slot freed");
    }
    broker.shutdown().await;
}

#[tokio::test]
async fn a_request_whose_decoded_size_exceeds_the_request_memory_is_refused_unread() {
    let broker = start_with(|s| s.queued_max_request_bytes = 1 << 20).await;
    let mut stream = TcpStream::connect(broker.addr).await.unwrap();
    // A Metadata v1 frame of 64 KiB announced: charged 96x, more than the whole budget.
    let mut header = BytesMut::new();
    header.put_i32(64 << 10);
    header.put_i16(ApiKey::Metadata as i16);
    header.put_i16(1);
    stream.write_all(&header).await.unwrap();
    assert!(closed_by_broker(&mut stream).await);
    // A small one is served.
    let mut client = broker.client().await;
    let _: MetadataResponse = client
        .call(ApiKey::Metadata, 12, &metadata_request(&[]))
        .await;
    broker.shutdown().await;
}

pub(super) fn creatable(name: &str, partitions: i32, rf: i16) -> CreatableTopic {
    let mut t = CreatableTopic::default();
    t.name = topic_name(name);
    t.num_partitions = partitions;
    t.replication_factor = rf;
    t
}

pub(super) fn assigned(name: &str, replicas: &[&[i32]]) -> CreatableTopic {
    let mut t = creatable(name, -1, -1);
    t.assignments = replicas
        .iter()
        .enumerate()
        .map(|(p, brokers)| {
            let mut a = kafka_protocol::messages::create_topics_request::CreatableReplicaAssignment::default();
            a.partition_index = p as i32;
            a.broker_ids = brokers.iter().map(|b| kafka_protocol::messages::BrokerId(*b)).collect();
            a
        })
        .collect();
    t
}

#[tokio::test]
async fn create_topics_stores_the_factor_and_assignments_and_checks_them_against_live_brokers() {
    let broker = start_with(|s| s.default_replication_factor = 2).await;
    let mut client = broker.client().await;
    let mut request = CreateTopicsRequest::default();
    request.timeout_ms = 5_000;
    request.topics = vec![
        assigned("mine", &[&[0], &[0]]),
        assigned("elsewhere", &[&[7]]),
        assigned("twice", &[&[0, 0]]),
        creatable("default-factor", 1, -1),
        creatable("one", 1, 1),
    ];
    let response: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 7, &request).await;
    let codes: Vec<i16> = response.topics.iter().map(|t| t.error_code).collect();
    assert_eq!(codes, vec![0, 39, 39, 38, 0]);
    let text = |i: usize| {
        response.topics[i]
            .error_message
            .as_ref()
            .unwrap()
            .to_string()
    };
    assert!(text(1).contains("broker 7"), "{}", text(1));
    assert!(
        text(3).contains("larger than the 1 live broker"),
        "{}",
        text(3)
    );
    assert_eq!(response.topics[0].num_partitions, 2);
    assert_eq!(response.topics[0].replication_factor, 1);
    let catalog = strata_layout::CatalogReader::new(broker.store.as_ref());
    let mine = catalog.topic("mine").await.unwrap().unwrap();
    assert_eq!(
        mine.assignments,
        std::collections::BTreeMap::from([(0, vec![0]), (1, vec![0])])
    );
    assert_eq!(mine.replication_factor, Some(1));
    let one = catalog.topic("one").await.unwrap().unwrap();
    assert_eq!(
        (one.replication_factor, one.assignments.len()),
        (Some(1), 0)
    );

    // CreatePartitions: one assignment per new partition, on live brokers.
    let partitions = |replicas: Vec<Vec<i32>>| {
        let mut t =
            kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic::default();
        t.name = topic_name("mine");
        t.count = 2 + replicas.len() as i32;
        t.assignments = Some(
            replicas
                .into_iter()
                .map(|brokers| {
                    let mut a = kafka_protocol::messages::create_partitions_request::CreatePartitionsAssignment::default();
                    a.broker_ids = brokers.into_iter().map(kafka_protocol::messages::BrokerId).collect();
                    a
                })
                .collect(),
        );
        let mut request = CreatePartitionsRequest::default();
        request.timeout_ms = 5_000;
        request.topics = vec![t];
        request
    };
    let response: CreatePartitionsResponse = client
        .call(ApiKey::CreatePartitions, 3, &partitions(vec![vec![3]]))
        .await;
    assert_eq!(response.results[0].error_code, 39);
    let response: CreatePartitionsResponse = client
        .call(ApiKey::CreatePartitions, 3, &partitions(vec![vec![0]]))
        .await;
    assert_eq!(response.results[0].error_code, 0);
    let mine = catalog.topic("mine").await.unwrap().unwrap();
    assert_eq!(
        (mine.partitions, mine.assignments.get(&2)),
        (3, Some(&vec![0]))
    );
    broker.shutdown().await;
}

#[tokio::test]
async fn topic_configs_come_from_the_table_accepted_refused_and_described() {
    let broker = start().await;
    let mut client = broker.client().await;
    let with = |name: &str, configs: &[(&str, &str)]| {
        let mut t = creatable(name, 1, -1);
        t.configs = configs
            .iter()
            .map(|(k, v)| {
                let mut c =
                    kafka_protocol::messages::create_topics_request::CreatableTopicConfig::default(
                    );
                c.name = StrBytes::from_string(k.to_string());
                c.value = Some(StrBytes::from_string(v.to_string()));
                c
            })
            .collect();
        t
    };
    let mut request = CreateTopicsRequest::default();
    request.timeout_ms = 5_000;
    request.topics = vec![
        with(
            "connect-offsets",
            &[
                ("min.insync.replicas", "2"),
                ("segment.bytes", "1048576"),
                ("cleanup.policy", "delete"),
            ],
        ),
        with("zstd", &[("compression.type", "zstd")]),
        with("shredded", &[("cleanup.policy", "shred")]),
        with("tiered", &[("remote.storage.enable", "true")]),
        with("typo", &[("min.insync.replica", "2")]),
        with(
            "compacted",
            &[
                ("cleanup.policy", "compact,delete"),
                ("min.cleanable.dirty.ratio", "0.1"),
            ],
        ),
        with(
            "lag-conflict",
            &[
                ("min.compaction.lag.ms", "10"),
                ("max.compaction.lag.ms", "5"),
            ],
        ),
    ];
    let response: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 7, &request).await;
    let codes: Vec<i16> = response.topics.iter().map(|t| t.error_code).collect();
    // remote.storage.enable=true is accepted: tiering is the broker's wal_storage setting.
    assert_eq!(codes, vec![0, 40, 40, 0, 40, 0, 40]);
    let text = |i: usize| {
        response.topics[i]
            .error_message
            .as_ref()
            .unwrap()
            .to_string()
    };
    assert!(text(1).contains("does not recompress"), "{}", text(1));
    assert!(text(2).contains("compact"), "{}", text(2));
    assert!(text(6).contains("min.compaction.lag.ms"), "{}", text(6));
    assert!(text(4).contains("unknown"), "{}", text(4));

    let mut resource =
        kafka_protocol::messages::describe_configs_request::DescribeConfigsResource::default();
    resource.resource_type = 2;
    resource.resource_name = StrBytes::from_static_str("connect-offsets");
    resource.configuration_keys = None;
    let mut describe = DescribeConfigsRequest::default();
    describe.resources = vec![resource];
    describe.include_documentation = true;
    let response: DescribeConfigsResponse =
        client.call(ApiKey::DescribeConfigs, 4, &describe).await;
    let configs = &response.results[0].configs;
    assert_eq!(configs.len(), strata_log::config_table::TOPIC_CONFIGS.len());
    let get = |name: &str| configs.iter().find(|c| c.name.as_str() == name).unwrap();
    let min_isr = get("min.insync.replicas");
    assert_eq!(
        (
            min_isr.value.as_ref().map(|v| v.as_str()),
            min_isr.config_source,
            min_isr.config_type
        ),
        (Some("2"), 1, 3)
    );
    let ratio = get("min.cleanable.dirty.ratio");
    assert_eq!(
        (
            ratio.value.as_ref().map(|v| v.as_str()),
            ratio.config_source,
            ratio.config_type
        ),
        (Some("0.5"), 5, 6)
    );
    let segment_ms = get("segment.ms");
    assert_eq!(
        (
            segment_ms.value.as_ref().map(|v| v.as_str()),
            segment_ms.config_source,
            segment_ms.config_type
        ),
        (Some("604800000"), 5, 5)
    );
    assert!(get("unclean.leader.election.enable")
        .documentation
        .is_some());
    broker.shutdown().await;
}

pub(super) fn elect_request(
    election_type: i8,
    topics: Option<Vec<(&str, Vec<i32>)>>,
) -> ElectLeadersRequest {
    let mut request = ElectLeadersRequest::default();
    request.election_type = election_type;
    request.timeout_ms = 5_000;
    request.topic_partitions = topics.map(|topics| {
        topics
            .into_iter()
            .map(|(name, partitions)| {
                let mut t =
                    kafka_protocol::messages::elect_leaders_request::TopicPartitions::default();
                t.topic = topic_name(name);
                t.partitions = partitions;
                t
            })
            .collect()
    });
    request
}

#[tokio::test]
async fn elect_leaders_alone_on_the_storage_is_never_needed() {
    let broker = start().await;
    let mut client = broker.client().await;
    create_topic(&mut client, "elected").await;
    for (version, election) in [(0, 0), (1, 0), (2, 0), (2, 1)] {
        let response: ElectLeadersResponse = client
            .call(
                ApiKey::ElectLeaders,
                version,
                &elect_request(election, Some(vec![("elected", vec![0, 5])])),
            )
            .await;
        let results = &response.replica_election_results[0].partition_result;
        let codes: Vec<i16> = results.iter().map(|r| r.error_code).collect();
        assert_eq!(codes, vec![84, 3], "v{version} type {election}");
    }
    // Every partition: none needed an election, so none is listed.
    let response: ElectLeadersResponse = client
        .call(ApiKey::ElectLeaders, 2, &elect_request(0, None))
        .await;
    assert_eq!(response.error_code, 0);
    assert!(response.replica_election_results.is_empty());
    broker.shutdown().await;
}

#[tokio::test]
async fn a_batch_refused_for_one_record_names_it_in_record_errors() {
    let broker = start().await;
    let mut client = broker.client().await;
    create_topic(&mut client, "kip-467").await;
    // Two records whose second says offset delta 0 again: the CRC is right (it is computed
    // over the bad bytes), so only the record walk objects.
    let good = record_batch(&[b"first", b"second"], 1_000);
    let mut bad = BytesMut::from(&good[..]);
    // The second record starts after the first (its length varint and 1 + 1 + 1 + 1 + 1 + 5 + 1
    // bytes); its offset delta follows its attributes and timestamp delta.
    let first_len = 1 + 1 + 1 + 1 + 1 + 5 + 1;
    let second_offset_delta = 61 + 1 + first_len + 1 + 1 + 1;
    assert_eq!(bad[second_offset_delta], 2, "zigzag 1");
    bad[second_offset_delta] = 0;
    let crc = crc32c::crc32c(&bad[21..]);
    bad[17..21].copy_from_slice(&crc.to_be_bytes());
    for v in [8, 9] {
        let response: ProduceResponse = client
            .call(
                ApiKey::Produce,
                v,
                &produce_request("kip-467", -1, bad.clone().freeze()),
            )
            .await;
        let p = &response.responses[0].partition_responses[0];
        assert_eq!(p.error_code, 87, "INVALID_RECORD");
        assert_eq!(p.record_errors.len(), 1, "v{v}: {p:?}");
        assert_eq!(p.record_errors[0].batch_index, 1);
        let why = p.record_errors[0]
            .batch_index_error_message
            .as_ref()
            .unwrap();
        assert!(why.contains("offset delta 0"), "{why}");
        assert!(
            p.error_message.as_ref().unwrap().contains("record 1"),
            "{p:?}"
        );
    }
    // A CRC mismatch fails the whole batch: a message, no record named.
    let mut corrupt = BytesMut::from(&good[..]);
    corrupt[17] ^= 0xff;
    let response: ProduceResponse = client
        .call(
            ApiKey::Produce,
            9,
            &produce_request("kip-467", -1, corrupt.freeze()),
        )
        .await;
    let p = &response.responses[0].partition_responses[0];
    assert_eq!(p.error_code, 2, "CORRUPT_MESSAGE");
    assert!(p.record_errors.is_empty());
    assert!(p.error_message.as_ref().unwrap().contains("CRC"), "{p:?}");
    broker.shutdown().await;
}

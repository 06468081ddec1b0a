//! The transaction coordinator over the wire: FindCoordinator for a transactional id,
//! InitProducerId, AddPartitionsToTxn, EndTxn, DescribeTransactions and ListTransactions, with
//! markers going to a recording [`MarkerWriter`] (the data-partition side is another branch's);
//! restarts on the same store replay `__transaction_state`.

use std::collections::BTreeSet;

use async_trait::async_trait;
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use strata_core::TopicPartition;
use strata_txn::MarkerJob;

use super::*;
use crate::txn_coordinator::MarkerWriter;

#[derive(Debug, Default)]
struct Recorded(std::sync::Mutex<Vec<MarkerJob>>);

#[async_trait]
impl MarkerWriter for Recorded {
    async fn write(
        &self,
        job: &MarkerJob,
        _coordinator_epoch: i32,
        _partitions: &BTreeSet<TopicPartition>,
    ) -> BTreeSet<TopicPartition> {
        self.0.lock().unwrap().push(job.clone());
        BTreeSet::new()
    }
}

/// Writes nothing: every attempt leaves every partition to retry.
#[derive(Debug, Default)]
struct Never;

#[async_trait]
impl MarkerWriter for Never {
    async fn write(
        &self,
        _job: &MarkerJob,
        _coordinator_epoch: i32,
        partitions: &BTreeSet<TopicPartition>,
    ) -> BTreeSet<TopicPartition> {
        partitions.clone()
    }
}

impl Recorded {
    fn jobs(&self) -> Vec<MarkerJob> {
        self.0.lock().unwrap().clone()
    }
}

fn s(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

async fn create_topic_with(client: &mut Client, name: &str, partitions: i32) {
    let mut topic = CreatableTopic::default();
    topic.name = topic_name(name);
    topic.num_partitions = partitions;
    topic.replication_factor = -1;
    let mut request = CreateTopicsRequest::default();
    request.topics = vec![topic];
    request.timeout_ms = 10_000;
    let response: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 7, &request).await;
    assert_eq!(response.topics[0].error_code, 0);
}

async fn init(client: &mut Client, v: i16, id: &str, timeout_ms: i32) -> InitProducerIdResponse {
    let mut request = InitProducerIdRequest::default();
    request.transactional_id = Some(TransactionalId(s(id)));
    request.transaction_timeout_ms = timeout_ms;
    request.producer_id = ProducerId(-1);
    request.producer_epoch = -1;
    client.call(ApiKey::InitProducerId, v, &request).await
}

async fn add(
    client: &mut Client,
    id: &str,
    pid: i64,
    epoch: i16,
    topic: &str,
    partitions: &[i32],
) -> Vec<i16> {
    let mut t = AddPartitionsToTxnTopic::default();
    t.name = topic_name(topic);
    t.partitions = partitions.to_vec();
    let mut request = AddPartitionsToTxnRequest::default();
    request.v3_and_below_transactional_id = TransactionalId(s(id));
    request.v3_and_below_producer_id = ProducerId(pid);
    request.v3_and_below_producer_epoch = epoch;
    request.v3_and_below_topics = vec![t];
    let response: AddPartitionsToTxnResponse =
        client.call(ApiKey::AddPartitionsToTxn, 3, &request).await;
    response
        .results_by_topic_v3_and_below
        .iter()
        .flat_map(|t| {
            t.results_by_partition
                .iter()
                .map(|p| p.partition_error_code)
        })
        .collect()
}

async fn end(client: &mut Client, v: i16, id: &str, pid: i64, epoch: i16, commit: bool) -> i16 {
    let mut request = EndTxnRequest::default();
    request.transactional_id = TransactionalId(s(id));
    request.producer_id = ProducerId(pid);
    request.producer_epoch = epoch;
    request.committed = commit;
    let response: EndTxnResponse = client.call(ApiKey::EndTxn, v, &request).await;
    response.error_code
}

async fn describe(
    client: &mut Client,
    id: &str,
) -> describe_transactions_response::TransactionState {
    let mut request = DescribeTransactionsRequest::default();
    request.transactional_ids = vec![TransactionalId(s(id))];
    let mut response: DescribeTransactionsResponse =
        client.call(ApiKey::DescribeTransactions, 0, &request).await;
    response.transaction_states.remove(0)
}

/// Asks DescribeTransactions until the transaction is in `state`, within PATIENCE.
async fn wait_for_state(
    client: &mut Client,
    id: &str,
    state: &str,
) -> describe_transactions_response::TransactionState {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let d = describe(client, id).await;
        if d.transaction_state.as_str() == state {
            return d;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{id} stayed {:?}, never {state}",
            d.transaction_state
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_commit_across_three_partitions_writes_markers_and_survives_a_restart() {
    let broker = start().await;
    let writer = Arc::new(Recorded::default());
    broker.txn.set_marker_writer(writer.clone());
    let mut client = broker.client().await;
    create_topic_with(&mut client, "out", 3).await;

    let mut request = FindCoordinatorRequest::default();
    request.key = s("tx");
    request.key_type = 1;
    let found: FindCoordinatorResponse = client.call(ApiKey::FindCoordinator, 3, &request).await;
    assert_eq!(found.error_code, 0);
    assert_eq!(found.port, i32::from(broker.addr.port()));

    let first = init(&mut client, 4, "tx", 60_000).await;
    assert_eq!(first.error_code, 0);
    assert_eq!(first.producer_epoch, 0);
    let pid = first.producer_id.0;
    assert!(pid >= 0);
    assert_eq!(
        add(&mut client, "tx", pid, 0, "out", &[0, 1, 2]).await,
        vec![0, 0, 0]
    );
    let d = describe(&mut client, "tx").await;
    assert_eq!(d.transaction_state.as_str(), "Ongoing");
    assert_eq!(d.topics[0].partitions, vec![0, 1, 2]);
    assert_eq!(d.transaction_timeout_ms, 60_000);
    assert_eq!(end(&mut client, 3, "tx", pid, 0, true).await, 0);
    wait_for_state(&mut client, "tx", "CompleteCommit").await;
    let jobs = writer.jobs();
    assert_eq!(jobs.len(), 1);
    assert!(jobs[0].commit);
    assert_eq!((jobs[0].producer_id, jobs[0].producer_epoch), (pid, 0));
    assert_eq!(jobs[0].partitions.len(), 3);
    // A retried commit is fine; aborting it now is not (INVALID_TXN_STATE).
    assert_eq!(end(&mut client, 3, "tx", pid, 0, true).await, 0);
    assert_eq!(end(&mut client, 3, "tx", pid, 0, false).await, 48);
    assert_eq!(
        broker
            .txn
            .stats
            .committed
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );

    // A second producer with the same id fences the first.
    let second = init(&mut client, 4, "tx", 60_000).await;
    assert_eq!((second.producer_id.0, second.producer_epoch), (pid, 1));
    assert_eq!(add(&mut client, "tx", pid, 0, "out", &[0]).await, vec![90]);
    assert_eq!(end(&mut client, 3, "tx", pid, 0, true).await, 90);
    // Clients older than PRODUCER_FENCED get INVALID_PRODUCER_EPOCH.
    assert_eq!(end(&mut client, 1, "tx", pid, 0, true).await, 47);

    let mut list = ListTransactionsRequest::default();
    list.state_filters = vec![s("Empty"), s("Bogus")];
    list.duration_filter = -1;
    let listed: ListTransactionsResponse = client.call(ApiKey::ListTransactions, 1, &list).await;
    assert_eq!(listed.unknown_state_filters, vec![s("Bogus")]);
    assert_eq!(listed.transaction_states.len(), 1);
    assert_eq!(listed.transaction_states[0].transactional_id.as_str(), "tx");

    // A broker started on the same storage replays __transaction_state.
    drop(client);
    let store = broker.stop_and_keep_store().await;
    let broker = start_on(store, |_| {}).await;
    let mut client = broker.client().await;
    let d = describe(&mut client, "tx").await;
    assert_eq!(d.transaction_state.as_str(), "Empty");
    assert_eq!((d.producer_id.0, d.producer_epoch), (pid, 1));
    let third = init(&mut client, 4, "tx", 60_000).await;
    assert_eq!((third.producer_id.0, third.producer_epoch), (pid, 2));
    broker.shutdown().await;
}

#[tokio::test]
async fn a_transaction_prepared_by_a_coordinator_that_stopped_is_completed_by_the_next() {
    // The markers of the first coordinator are never written.
    let broker = start().await;
    broker.txn.set_marker_writer(Arc::new(Never));
    let mut client = broker.client().await;
    create_topic_with(&mut client, "out", 2).await;
    let r = init(&mut client, 4, "tx", 60_000).await;
    let pid = r.producer_id.0;
    assert_eq!(
        add(&mut client, "tx", pid, 0, "out", &[0, 1]).await,
        vec![0, 0]
    );
    assert_eq!(end(&mut client, 3, "tx", pid, 0, false).await, 0);
    assert_eq!(
        describe(&mut client, "tx").await.transaction_state.as_str(),
        "PrepareAbort"
    );
    // Meanwhile the producer must wait for the abort to complete.
    assert_eq!(init(&mut client, 4, "tx", 60_000).await.error_code, 51);
    drop(client);
    let store = broker.stop_and_keep_store().await;

    let broker = start_on(store, |_| {}).await;
    let writer = Arc::new(Recorded::default());
    broker.txn.set_marker_writer(writer.clone());
    let mut client = broker.client().await;
    wait_for_state(&mut client, "tx", "CompleteAbort").await;
    let jobs = writer.jobs();
    assert_eq!(jobs.len(), 1);
    assert!(!jobs[0].commit);
    assert_eq!(jobs[0].partitions.len(), 2);
    broker.shutdown().await;
}

#[tokio::test]
async fn a_transaction_open_past_its_timeout_is_aborted_and_its_producer_fenced() {
    let broker = start_with(|s| {
        s.transaction_abort_timed_out_interval = Duration::from_millis(20);
    })
    .await;
    let writer = Arc::new(Recorded::default());
    broker.txn.set_marker_writer(writer.clone());
    let mut client = broker.client().await;
    create_topic_with(&mut client, "out", 1).await;
    let r = init(&mut client, 4, "tx", 100).await;
    let pid = r.producer_id.0;
    assert_eq!(add(&mut client, "tx", pid, 0, "out", &[0]).await, vec![0]);
    let d = wait_for_state(&mut client, "tx", "CompleteAbort").await;
    assert_eq!(d.producer_epoch, 1, "the abort fences the producer's epoch");
    assert!(!writer.jobs()[0].commit);
    assert_eq!(end(&mut client, 3, "tx", pid, 0, true).await, 90);
    let stats = &broker.txn.stats;
    assert_eq!(
        stats.timed_out.load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert_eq!(stats.aborted.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert_eq!(stats.open(), 0);
    broker.shutdown().await;
}

#[tokio::test]
async fn transactional_requests_are_refused_as_kafka_refuses_them() {
    let broker = start().await;
    let mut client = broker.client().await;
    create_topic_with(&mut client, "out", 1).await;
    // Above transaction_max_timeout (15 min): INVALID_TRANSACTION_TIMEOUT.
    assert_eq!(
        init(&mut client, 4, "tx", 15 * 60 * 1000 + 1)
            .await
            .error_code,
        50
    );
    // Unknown transactional id or producer id: INVALID_PRODUCER_ID_MAPPING.
    assert_eq!(
        add(&mut client, "nobody", 5, 0, "out", &[0]).await,
        vec![49]
    );
    assert_eq!(end(&mut client, 3, "nobody", 5, 0, true).await, 49);
    let r = init(&mut client, 4, "tx", 60_000).await;
    let pid = r.producer_id.0;
    // Nothing to end yet.
    assert_eq!(end(&mut client, 3, "tx", pid, 0, true).await, 48);
    // An unknown topic fails alone; the others are not attempted.
    let mut a = AddPartitionsToTxnTopic::default();
    a.name = topic_name("out");
    a.partitions = vec![0];
    let mut b = AddPartitionsToTxnTopic::default();
    b.name = topic_name("missing");
    b.partitions = vec![0];
    let mut request = AddPartitionsToTxnRequest::default();
    request.v3_and_below_transactional_id = TransactionalId(s("tx"));
    request.v3_and_below_producer_id = ProducerId(pid);
    request.v3_and_below_producer_epoch = 0;
    request.v3_and_below_topics = vec![a, b];
    let response: AddPartitionsToTxnResponse =
        client.call(ApiKey::AddPartitionsToTxn, 3, &request).await;
    let codes: Vec<(String, i16)> = response
        .results_by_topic_v3_and_below
        .iter()
        .map(|t| {
            (
                t.name.to_string(),
                t.results_by_partition[0].partition_error_code,
            )
        })
        .collect();
    assert_eq!(
        codes,
        vec![("out".to_string(), 55), ("missing".to_string(), 3)]
    );
    // Not found: TRANSACTIONAL_ID_NOT_FOUND.
    assert_eq!(describe(&mut client, "nobody").await.error_code, 105);
    // The transaction log is internal: clients cannot produce to it.
    let mut partition = PartitionProduceData::default();
    partition.index = 0;
    partition.records = Some(record_batch(&[b"x"], 0));
    let mut topic = TopicProduceData::default();
    topic.name = topic_name(crate::txn_coordinator::TXN_TOPIC);
    topic.partition_data = vec![partition];
    let mut produce = ProduceRequest::default();
    produce.acks = -1;
    produce.timeout_ms = 5000;
    produce.topic_data = vec![topic];
    let response: ProduceResponse = client.call(ApiKey::Produce, 9, &produce).await;
    assert_eq!(response.responses[0].partition_responses[0].error_code, 17);
    broker.shutdown().await;
}

/// A transactional produce of `value` to `out`/`partition` (producer `pid`, epoch 0, `seq`);
/// the partition's error code.
async fn txn_produce(client: &mut Client, pid: i64, partition: i32, seq: i32, value: &[u8]) -> i16 {
    let mut batch = BytesMut::from(&producer_batch(&[value], 0, (pid, 0, seq))[..]);
    batch[22] |= 0x10;
    let crc = crc32c::crc32c(&batch[21..]);
    batch[17..21].copy_from_slice(&crc.to_be_bytes());
    let mut p = PartitionProduceData::default();
    p.index = partition;
    p.records = Some(batch.freeze());
    let mut topic = TopicProduceData::default();
    topic.name = topic_name("out");
    topic.partition_data = vec![p];
    let mut produce = ProduceRequest::default();
    produce.transactional_id = Some(TransactionalId(s("tx")));
    produce.acks = -1;
    produce.timeout_ms = 5000;
    produce.topic_data = vec![topic];
    let response: ProduceResponse = client.call(ApiKey::Produce, 9, &produce).await;
    response.responses[0].partition_responses[0].error_code
}

#[tokio::test]
async fn a_transactional_produce_to_a_partition_not_in_the_transaction_is_refused() {
    let broker = start().await;
    broker.txn.set_marker_writer(Arc::new(Recorded::default()));
    let mut client = broker.client().await;
    create_topic_with(&mut client, "out", 2).await;
    let pid = init(&mut client, 4, "tx", 60_000).await.producer_id.0;
    // No transaction yet: the coordinator does not verify it (INVALID_TXN_STATE), nothing
    // is appended, so no transaction hangs open in the partition.
    assert_eq!(txn_produce(&mut client, pid, 0, 0, b"early").await, 48);
    assert_eq!(
        broker
            .log
            .watermarks(&TopicPartition::new("out", 0))
            .unwrap()
            .high
            .0,
        0
    );
    // Partition 0 added: accepted there; partition 1 was never added: refused.
    assert_eq!(add(&mut client, "tx", pid, 0, "out", &[0]).await, vec![0]);
    assert_eq!(txn_produce(&mut client, pid, 0, 0, b"a").await, 0);
    assert_eq!(txn_produce(&mut client, pid, 1, 0, b"b").await, 48);
    assert_eq!(
        broker
            .log
            .watermarks(&TopicPartition::new("out", 1))
            .unwrap()
            .high
            .0,
        0
    );
    // Later batches of the open transaction continue it.
    assert_eq!(txn_produce(&mut client, pid, 0, 1, b"c").await, 0);
    // A fenced epoch is INVALID_PRODUCER_EPOCH, what producers expect from produce.
    assert_eq!(init(&mut client, 4, "tx", 60_000).await.error_code, 51);
    wait_for_state(&mut client, "tx", "CompleteAbort").await;
    let again = init(&mut client, 4, "tx", 60_000).await;
    assert_eq!(again.error_code, 0);
    assert_eq!(txn_produce(&mut client, pid, 1, 0, b"zombie").await, 47);
    broker.shutdown().await;
}

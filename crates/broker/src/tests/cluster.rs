//! Cluster mode in process: brokers sharing one memory store, with short leases so handovers
//! and takeovers happen within a test's patience.

use std::collections::BTreeMap;

use kafka_protocol::messages::alter_partition_reassignments_request::{
    ReassignablePartition, ReassignableTopic,
};
use strata_core::TopicPartition;
use strata_log::Ownership as LogOwnership;

use super::*;
use crate::cluster::resource_name;
use crate::ClusterSettings;

const NOT_LEADER_OR_FOLLOWER: i16 = 6;

fn fast() -> ClusterSettings {
    ClusterSettings {
        lease_period: Duration::from_millis(600),
        heartbeat_interval: Duration::from_millis(100),
        ownership_interval: Duration::from_millis(50),
        move_watch_interval: Duration::from_millis(10),
        auto_rebalance: true,
        departed_broker_listing: ClusterSettings::default().departed_broker_listing,
    }
}

struct Member {
    id: i32,
    addr: SocketAddr,
    broker: Arc<Broker>,
    stop: Option<oneshot::Sender<()>>,
    served: Option<JoinHandle<()>>,
}

impl Member {
    async fn start(store: &Arc<dyn ObjectStore>, id: i32) -> Member {
        let clock = SystemClock::shared();
        let log = LogManager::open_with(
            Arc::clone(store),
            Arc::clone(&clock),
            LogConfig::default(),
            BrokerId(id),
            LogOwnership::Managed,
        )
        .await
        .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let settings = BrokerSettings {
            node_id: BrokerId(id),
            advertised_port: addr.port(),
            group_initial_rebalance_delay: Duration::ZERO,
            group_shards: 2,
            cluster: Some(fast()),
            ..BrokerSettings::default()
        };
        let broker = Broker::open_clustered(
            BrokerParts {
                log,
                clock,
                settings,
                member_id_seed: rand_seed(),
            },
            Arc::clone(store),
        )
        .await
        .unwrap();
        let broker = Arc::new(broker);
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(Arc::clone(&broker).serve(listener, async {
            let _ = stopped.await;
        }));
        Member {
            id,
            addr,
            broker,
            stop: Some(stop),
            served: Some(served),
        }
    }

    async fn client(&self) -> Client {
        Client {
            stream: TcpStream::connect(self.addr).await.unwrap(),
            next_correlation: 1,
        }
    }

    fn epoch(&self, tp: &TopicPartition) -> Option<u64> {
        self.broker.log.served_epoch(tp)
    }

    /// Dies as a crashed process would: no handover, no leaving, no more heartbeats.
    async fn crash(mut self) {
        if let Some(node) = self.broker.cluster() {
            node.halt().await;
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(served) = self.served.take() {
            let _ = tokio::time::timeout(PATIENCE, served).await;
        }
    }
}

/// Polls `done` until it returns Some, for at most PATIENCE.
async fn eventually<T>(what: &str, mut done: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(value) = done() {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn produce(client: &mut Client, topic: &str, value: &[u8]) -> i16 {
    let response: ProduceResponse = client
        .call(
            ApiKey::Produce,
            9,
            &produce_request(topic, -1, record_batch(&[value], 1_000)),
        )
        .await;
    response.responses[0].partition_responses[0].error_code
}

/// The values of every record of `topic`-0, fetched from offset 0 up to the high watermark
/// (one fetch may stop at a segment's end, as Kafka's may).
async fn fetch_all(client: &mut Client, topic: &str) -> Vec<Vec<u8>> {
    let mut values = Vec::new();
    let mut next = 0;
    loop {
        let response: FetchResponse = client
            .call(ApiKey::Fetch, 12, &fetch_request(topic, next, 0, 0))
            .await;
        let partition = &response.responses[0].partitions[0];
        assert_eq!(partition.error_code, 0, "fetch error");
        let mut bytes = partition.records.clone().unwrap_or_default();
        while bytes.len() > 12 {
            let length = (&bytes[8..12]).get_i32() as usize;
            let batch = bytes.split_to(12 + length);
            for (offset, record) in strata_wire::builder::read_records(&batch).unwrap() {
                if offset >= next {
                    values.push(record.value.map(|v| v.to_vec()).unwrap_or_default());
                    next = offset + 1;
                }
            }
        }
        if next >= partition.high_watermark {
            return values;
        }
    }
}

async fn create(member: &Member, topic: &str) -> TopicPartition {
    member
        .broker
        .log
        .create_topic(topic, Some(1), BTreeMap::new(), false)
        .await
        .unwrap();
    // As CreateTopics does: the other brokers re-read the catalog when a change is announced
    // (or at their forced full listing, every 30 rounds), not every round.
    if let Some(node) = member.broker.cluster() {
        node.announce_topology_change().await;
    }
    TopicPartition::new(topic, 0)
}

/// The `__consumer_offsets` partition holding `group`'s coordinator shard.
fn coordinator_shard(member: &Member, group: &str) -> TopicPartition {
    let shard_count = member
        .broker
        .log
        .topic(crate::coordinator::OFFSETS_TOPIC)
        .unwrap()
        .partitions;
    let shard = crate::coordinator::shard_of(group, shard_count as usize) as i32;
    TopicPartition::new(crate::coordinator::OFFSETS_TOPIC, shard)
}

/// The member serving `tp` and the other one, once one of them serves it.
async fn owner_and_other<'m>(
    a: &'m Member,
    b: &'m Member,
    tp: &TopicPartition,
) -> (&'m Member, &'m Member) {
    eventually(&format!("someone serves {tp}"), || {
        if a.epoch(tp).is_some() {
            Some((a, b))
        } else if b.epoch(tp).is_some() {
            Some((b, a))
        } else {
            None
        }
    })
    .await
}

/// Moves `topic`'s `partition` to broker `target` with AlterPartitionReassignments sent to
/// `client`, and checks it was accepted.
async fn reassign(client: &mut Client, topic: &str, partition: i32, target: i32) {
    let mut moved = ReassignablePartition::default();
    moved.partition_index = partition;
    moved.replicas = Some(vec![kafka_protocol::messages::BrokerId(target)]);
    let mut reassigned = ReassignableTopic::default();
    reassigned.name = topic_name(topic);
    reassigned.partitions = vec![moved];
    let mut request = AlterPartitionReassignmentsRequest::default();
    request.timeout_ms = 10_000;
    request.topics = vec![reassigned];
    let response: AlterPartitionReassignmentsResponse = client
        .call(ApiKey::AlterPartitionReassignments, 0, &request)
        .await;
    assert_eq!(response.error_code, 0);
    assert_eq!(response.responses[0].partitions[0].error_code, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_partition_serves_every_record_at_a_higher_epoch_on_its_new_owner() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let a = Member::start(&store, 1).await;
    let b = Member::start(&store, 2).await;
    let tp = create(&a, "moving").await;
    let (owner, other) = owner_and_other(&a, &b, &tp).await;
    let first_epoch = owner.epoch(&tp).unwrap();

    let mut to_owner = owner.client().await;
    for value in [b"one".as_slice(), b"two", b"three"] {
        assert_eq!(produce(&mut to_owner, "moving", value).await, 0);
    }

    // The non-owner's Metadata names both brokers and the owner at its epoch, once its
    // membership view and owner cache caught up (each refreshes on its own timer, so the
    // first answer may come before either has seen the other broker).
    let mut to_other = other.client().await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let metadata: MetadataResponse = to_other
            .call(ApiKey::Metadata, 12, &metadata_request(&["moving"]))
            .await;
        let p = &metadata.topics[0].partitions[0];
        if metadata.brokers.len() == 2 && p.leader_id.0 == owner.id {
            assert_eq!(p.leader_epoch as u64, first_epoch);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "metadata never named the owner"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Move it with AlterPartitionReassignments, sent to the broker that does not own it.
    let clock = SystemClock::shared();
    let started = clock.monotonic();
    reassign(&mut to_other, "moving", 0, other.id).await;

    let new_epoch = eventually("the target serves the partition", || other.epoch(&tp)).await;
    let handover = clock.monotonic() - started;
    assert!(new_epoch > first_epoch, "{new_epoch} > {first_epoch}");
    assert_eq!(owner.epoch(&tp), None, "one writer per partition");
    eprintln!("handover took {handover:?}");

    assert_eq!(
        fetch_all(&mut to_other, "moving").await,
        vec![b"one".to_vec(), b"two".to_vec(), b"three".to_vec()]
    );
    assert_eq!(produce(&mut to_other, "moving", b"four").await, 0);
    assert_eq!(
        produce(&mut to_owner, "moving", b"lost").await,
        NOT_LEADER_OR_FOLLOWER
    );
    assert_eq!(fetch_all(&mut to_other, "moving").await.len(), 4);

    // Nothing is in progress any more, once the cached ownership records caught up.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let listed: ListPartitionReassignmentsResponse = to_other
            .call(
                ApiKey::ListPartitionReassignments,
                0,
                &ListPartitionReassignmentsRequest::default(),
            )
            .await;
        assert_eq!(listed.error_code, 0);
        if listed.topics.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still listed: {:?}",
            listed.topics
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let resource = resource_name(other.broker.log.topic("moving").unwrap().id, 0);
    assert!(other
        .broker
        .cluster()
        .unwrap()
        .status()
        .serving
        .contains_key(&resource));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_brokers_partitions_are_taken_over_with_every_acknowledged_record() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let a = Member::start(&store, 1).await;
    let b = Member::start(&store, 2).await;
    let topics = ["t0", "t1", "t2", "t3"];
    let mut tps = Vec::new();
    for t in topics {
        tps.push(create(&a, t).await);
    }
    // Placement alone might put everything on b, and then killing a would prove nothing: pin
    // half the topics, and the group's coordinator shard, on a.
    let ownership = strata_cluster::Ownership::new(Arc::clone(&store));
    let shard_tp = coordinator_shard(&a, "some-group");
    let shard = shard_tp.partition;
    let offsets_id = a
        .broker
        .log
        .topic(crate::coordinator::OFFSETS_TOPIC)
        .unwrap()
        .id;
    for (topic, tp) in topics.iter().zip(&tps).take(2) {
        let id = a.broker.log.topic(topic).unwrap().id;
        ownership
            .set_placement_override(&resource_name(id, tp.partition), strata_core::BrokerId(1))
            .await
            .unwrap();
    }
    ownership
        .set_placement_override(&resource_name(offsets_id, shard), strata_core::BrokerId(1))
        .await
        .unwrap();
    eventually(
        "every partition is served, the pinned ones by broker 1",
        || {
            let all = tps
                .iter()
                .all(|tp| a.epoch(tp).is_some() || b.epoch(tp).is_some());
            let pinned =
                tps.iter().take(2).all(|tp| a.epoch(tp).is_some()) && a.epoch(&shard_tp).is_some();
            (all && pinned).then_some(())
        },
    )
    .await;
    // Everything is acknowledged by its owner before the crash. Placement may still be moving
    // an unpinned partition between the two (its old owner answers NOT_LEADER_OR_FOLLOWER
    // while it hands over): look the owner up again, as a client refreshing metadata would.
    for (topic, tp) in topics.iter().zip(&tps) {
        for i in 0..5 {
            let value = format!("{topic}-{i}");
            let deadline = tokio::time::Instant::now() + PATIENCE;
            loop {
                let owner = if a.epoch(tp).is_some() { &a } else { &b };
                let mut client = owner.client().await;
                match produce(&mut client, topic, value.as_bytes()).await {
                    0 => break,
                    6 if tokio::time::Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(10)).await
                    }
                    code => panic!("producing {value} to {tp}: error code {code}"),
                }
            }
        }
    }
    let a_held = tps.iter().filter(|tp| a.epoch(tp).is_some()).count();
    eprintln!("broker 1 held {a_held} of {} partitions", tps.len());
    assert!(a_held >= 2, "the failover must take something over");

    let clock = SystemClock::shared();
    let died = clock.monotonic();
    let a_port = a.addr.port();
    a.crash().await;
    eventually(
        "the survivor serves everything, the coordinator shard included",
        || {
            (tps.iter().all(|tp| b.epoch(tp).is_some()) && b.epoch(&shard_tp).is_some())
                .then_some(())
        },
    )
    .await;
    eprintln!("takeover took {:?}", clock.monotonic() - died);

    let mut client = b.client().await;
    for topic in topics {
        let expected: Vec<Vec<u8>> = (0..5)
            .map(|i| format!("{topic}-{i}").into_bytes())
            .collect();
        assert_eq!(fetch_all(&mut client, topic).await, expected, "{topic}");
    }
    // The coordinator shards moved too: group requests find a coordinator on the survivor.
    let mut request = FindCoordinatorRequest::default();
    request.key = StrBytes::from_static_str("some-group");
    let found: FindCoordinatorResponse = client.call(ApiKey::FindCoordinator, 3, &request).await;
    assert_eq!(found.error_code, 0);
    assert_eq!(found.node_id.0, 2);
    // Metadata still lists the dead broker (departed_broker_listing), at its old address, and
    // names it leader of nothing; DescribeCluster, for operators, lists the live one only.
    let metadata: MetadataResponse = client
        .call(ApiKey::Metadata, 12, &metadata_request(&topics))
        .await;
    let listed: Vec<(i32, i32)> = metadata
        .brokers
        .iter()
        .map(|b| (b.node_id.0, b.port))
        .collect();
    assert_eq!(
        listed,
        [(1, i32::from(a_port)), (2, i32::from(b.addr.port()))]
    );
    for topic in &metadata.topics {
        for p in &topic.partitions {
            assert_eq!(p.leader_id.0, 2, "{:?} {}", topic.name, p.partition_index);
        }
    }
    let described: kafka_protocol::messages::DescribeClusterResponse = client
        .call(
            ApiKey::DescribeCluster,
            1,
            &kafka_protocol::messages::DescribeClusterRequest::default(),
        )
        .await;
    let live: Vec<i32> = described.brokers.iter().map(|b| b.broker_id.0).collect();
    assert_eq!(live, [2]);
}

/// A broker whose lease was in doubt suspends its partitions (appends refused, the state kept)
/// and may then be asked to hand one over while its record still names it: placement moved
/// the partition meanwhile (another broker came back from a pause, say). The handover used to
/// find the partition not served and answer at once, so the runner released the ownership
/// record while the manifest still named this broker's stream as its unreleased writer; the
/// successor's takeover then sealed that stream, and this live broker, fenced, had to exit
/// (RELIABILITY.md, finding (a): seed 205 shows exactly this sequence).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handing_over_a_suspended_partition_releases_it_so_the_successor_seals_nothing() {
    use crate::coordinator::GroupCoordinator;
    use strata_cluster::{ResourceHost, StopReason};
    use strata_core::Epoch;
    use strata_log::Acks;

    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let clock = SystemClock::shared();
    let open = |id: i32| {
        LogManager::open_with(
            Arc::clone(&store),
            Arc::clone(&clock),
            LogConfig::default(),
            BrokerId(id),
            LogOwnership::Managed,
        )
    };
    let first = open(1).await.unwrap();
    let groups = GroupCoordinator::start(
        Arc::clone(&first),
        Arc::clone(&clock),
        BrokerSettings::default().group_config(),
        1,
        rand_seed(),
        false,
    )
    .await
    .unwrap();
    let topic = first
        .create_topic("suspended", Some(2), BTreeMap::new(), false)
        .await
        .unwrap();
    let host = crate::cluster::log_host(Arc::clone(&first), groups, Arc::clone(&clock));
    let (moving, staying) = (resource_name(topic.id, 0), resource_name(topic.id, 1));
    let (tp0, tp1) = (
        TopicPartition::new("suspended", 0),
        TopicPartition::new("suspended", 1),
    );
    host.start_serving(&moving, Epoch(1)).await.unwrap();
    host.start_serving(&staying, Epoch(1)).await.unwrap();
    let acks = Acks::Durable { timeout: PATIENCE };
    first
        .append(&tp0, record_batch(&[b"before"], 1_000), acks)
        .await
        .unwrap();

    // The lease scare, then the handover the controller asks for once the lease is back.
    host.stop_serving(&moving, StopReason::SelfLeaseExpired)
        .await
        .unwrap();
    host.stop_serving(&moving, StopReason::Handover)
        .await
        .unwrap();

    // The successor claims what the runner then marked Released (no fencing at that layer).
    let second = open(2).await.unwrap();
    second.refresh_catalog().await.unwrap();
    for (tp, result) in second
        .acquire(vec![("suspended".to_string(), 0, 2)])
        .await
        .unwrap()
    {
        result.unwrap_or_else(|e| panic!("{tp}: {e}"));
    }
    assert_eq!(second.watermarks(&tp0).unwrap().high.get(), 1);

    // The first broker is live and still serves its other partition.
    let appended = first
        .append(&tp1, record_batch(&[b"after"], 1_000), acks)
        .await;
    assert!(appended.is_ok(), "append after the handover: {appended:?}");
    assert!(
        !*first.fenced().borrow(),
        "the successor sealed the stream of a live broker"
    );
}

/// `strata broker drain` writes its request through `strata_cluster::admin`; the broker reads
/// it through the same definition and hands every partition over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_requested_offline_moves_every_partition_away() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let a = Member::start(&store, 1).await;
    let b = Member::start(&store, 2).await;
    let tp = create(&a, "drained").await;
    let resource = resource_name(a.broker.log.topic("drained").unwrap().id, tp.partition);
    strata_cluster::Ownership::new(Arc::clone(&store))
        .set_placement_override(&resource, BrokerId(1))
        .await
        .unwrap();
    eventually("broker 1 serves the partition", || {
        a.broker
            .cluster()?
            .status()
            .serving
            .contains_key(&resource)
            .then_some(())
    })
    .await;

    let incarnation = strata_cluster::admin::request_drain(store.as_ref(), BrokerId(1))
        .await
        .unwrap();
    eventually("broker 2 serves the drained partition", || {
        b.broker
            .cluster()?
            .status()
            .serving
            .contains_key(&resource)
            .then_some(())
    })
    .await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while strata_cluster::admin::partitions_held(Arc::clone(&store), BrokerId(1), incarnation)
        .await
        .unwrap()
        > 0
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "broker 1 still holds partitions"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Asks `client` for `topic`'s Metadata until `done` accepts it, for at most PATIENCE.
async fn metadata_until(
    client: &mut Client,
    topic: &str,
    what: &str,
    done: impl Fn(&MetadataResponse) -> bool,
) -> MetadataResponse {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let metadata: MetadataResponse = client
            .call(ApiKey::Metadata, 12, &metadata_request(&[topic]))
            .await;
        if done(&metadata) {
            return metadata;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out: {what}: {metadata:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn replicas_of(metadata: &MetadataResponse, partition: usize) -> (i32, Vec<i32>, Vec<i32>) {
    let p = &metadata.topics[0].partitions[partition];
    (
        p.leader_id.0,
        p.replica_nodes.iter().map(|b| b.0).collect(),
        p.isr_nodes.iter().map(|b| b.0).collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_factor_assignments_and_preferred_elections_on_three_brokers() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let a = Member::start(&store, 1).await;
    let _b = Member::start(&store, 2).await;
    let _c = Member::start(&store, 3).await;
    let mut client = a.client().await;
    // Factors are checked against the live brokers: wait until broker 1 sees all three.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let metadata: MetadataResponse = client
            .call(ApiKey::Metadata, 12, &metadata_request(&[]))
            .await;
        if metadata.brokers.len() == 3 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never saw 3 brokers"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut request = CreateTopicsRequest::default();
    request.timeout_ms = 10_000;
    request.topics = vec![
        creatable("rf3", 2, 3),
        super::assigned("pinned", &[&[2, 1, 3]]),
        creatable("rf4", 1, 4),
        super::assigned("nowhere", &[&[9, 1]]),
        super::assigned("uneven", &[&[1, 2], &[3]]),
    ];
    let response: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 7, &request).await;
    let codes: Vec<i16> = response.topics.iter().map(|t| t.error_code).collect();
    assert_eq!(codes, vec![0, 0, 38, 39, 39], "{response:?}");
    assert_eq!(response.topics[0].replication_factor, 3);

    // RF 3: three live brokers, the leader first, all in sync.
    let metadata = metadata_until(&mut client, "rf3", "rf3 led", |m| {
        m.topics[0].partitions.iter().all(|p| p.leader_id.0 > 0)
    })
    .await;
    for partition in 0..2 {
        let (leader, replicas, isr) = replicas_of(&metadata, partition);
        assert_eq!(replicas[0], leader);
        let mut sorted = replicas.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, vec![1, 2, 3]);
        assert_eq!(isr, replicas);
    }

    // The assignment's first replica leads, and the replicas are the assignment's.
    let led_by =
        |broker: i32| move |m: &MetadataResponse| m.topics[0].partitions[0].leader_id.0 == broker;
    let metadata = metadata_until(&mut client, "pinned", "broker 2 leads pinned", led_by(2)).await;
    assert_eq!(replicas_of(&metadata, 0), (2, vec![2, 1, 3], vec![2, 1, 3]));

    // Moved away by a reassignment, then back by a preferred election.
    reassign(&mut client, "pinned", 0, 3).await;
    let metadata = metadata_until(&mut client, "pinned", "broker 3 leads pinned", led_by(3)).await;
    assert_eq!(replicas_of(&metadata, 0).1, vec![3, 2, 1]);

    let elect = super::elect_request(0, Some(vec![("pinned", vec![0])]));
    let response: ElectLeadersResponse = client.call(ApiKey::ElectLeaders, 2, &elect).await;
    assert_eq!(
        response.replica_election_results[0].partition_result[0].error_code, 0,
        "{response:?}"
    );
    metadata_until(
        &mut client,
        "pinned",
        "broker 2 leads pinned again",
        led_by(2),
    )
    .await;
    let response: ElectLeadersResponse = client.call(ApiKey::ElectLeaders, 2, &elect).await;
    assert_eq!(
        response.replica_election_results[0].partition_result[0].error_code,
        84
    );

    // CreatePartitions with an assignment: the new partition's first replica leads it.
    let mut t =
        kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic::default();
    t.name = topic_name("pinned");
    t.count = 2;
    let mut a3 =
        kafka_protocol::messages::create_partitions_request::CreatePartitionsAssignment::default();
    a3.broker_ids = [3, 1, 2]
        .into_iter()
        .map(kafka_protocol::messages::BrokerId)
        .collect();
    t.assignments = Some(vec![a3]);
    let mut request = CreatePartitionsRequest::default();
    request.timeout_ms = 10_000;
    request.topics = vec![t];
    let response: CreatePartitionsResponse =
        client.call(ApiKey::CreatePartitions, 3, &request).await;
    assert_eq!(response.results[0].error_code, 0, "{response:?}");
    let metadata = metadata_until(&mut client, "pinned", "broker 3 leads pinned-1", |m| {
        m.topics[0]
            .partitions
            .get(1)
            .is_some_and(|p| p.leader_id.0 == 3)
    })
    .await;
    assert_eq!(replicas_of(&metadata, 1), (3, vec![3, 1, 2], vec![3, 1, 2]));
}

/// A group's coordinator shard handed over between two live brokers: FindCoordinator, asked
/// of either broker all the while, always names a broker, never COORDINATOR_NOT_AVAILABLE
/// (between release and claim the answer waits for the claim; the new owner answers
/// COORDINATOR_LOAD_IN_PROGRESS until its shard is loaded). librdkafka's generic coordinator
/// request gives up on that error after two retries and then waits for a broker connection to
/// change state, which no handover causes: `send_offsets_to_transaction` hung
/// (docs/RELIABILITY.md, the transactions pipeline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_coordinator_handed_over_is_always_found() {
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let a = Member::start(&store, 1).await;
    let b = Member::start(&store, 2).await;
    let group = "moving-group";
    let shard_tp = coordinator_shard(&a, group);
    let shard = shard_tp.partition;
    let mut answers: BTreeMap<(i16, i32), usize> = BTreeMap::new();
    // Back and forth a few times: each handover leaves the shard without an owner for a few
    // milliseconds here, and the lookups must land in that window to tell.
    for _ in 0..4 {
        let (_, other) = owner_and_other(&a, &b, &shard_tp).await;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let lookups: Vec<_> = [a.addr, b.addr]
            .into_iter()
            .map(|addr| {
                let stop = Arc::clone(&stop);
                tokio::spawn(async move {
                    let mut client = Client {
                        stream: TcpStream::connect(addr).await.unwrap(),
                        next_correlation: 1,
                    };
                    let mut seen = Vec::new();
                    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                        let mut request = FindCoordinatorRequest::default();
                        request.key = StrBytes::from_static_str(group);
                        let found: FindCoordinatorResponse =
                            client.call(ApiKey::FindCoordinator, 3, &request).await;
                        seen.push((found.error_code, found.node_id.0));
                    }
                    seen
                })
            })
            .collect();
        let mut to_other = other.client().await;
        reassign(
            &mut to_other,
            crate::coordinator::OFFSETS_TOPIC,
            shard,
            other.id,
        )
        .await;
        eventually("the target hosts the coordinator shard", || {
            other.broker.groups.hosts(group).then_some(())
        })
        .await;
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        for lookup in lookups {
            for answer in lookup.await.unwrap() {
                *answers.entry(answer).or_default() += 1;
            }
        }
    }
    eprintln!("FindCoordinator answers (error code, node) over 4 handovers: {answers:?}");
    let unavailable: usize = answers
        .iter()
        .filter(|((code, _), _)| *code != 0)
        .map(|(_, n)| n)
        .sum();
    assert_eq!(unavailable, 0, "answers without a coordinator: {answers:?}");
    assert!(answers.keys().all(|(_, node)| *node == 1 || *node == 2));
}

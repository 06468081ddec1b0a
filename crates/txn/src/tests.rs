use super::*;

const T0: i64 = 1_000_000;

fn tp(t: &str, p: i32) -> TopicPartition {
    TopicPartition::new(t, p)
}

fn parts(list: &[(&str, i32)]) -> BTreeSet<TopicPartition> {
    list.iter().map(|(t, p)| tp(t, *p)).collect()
}

/// A shard whose records are all made durable at once, kept for replay checks.
struct Harness {
    shard: TxnShard,
    log: Vec<TxnRecord>,
    responses: HashMap<u64, Response>,
    markers: Vec<MarkerJob>,
    completions: Vec<Completion>,
    next_token: u64,
    next_pid: i64,
    /// When false, records are handed out but not completed (the caller does it).
    auto_persist: bool,
    held: Vec<(PersistId, TxnRecord)>,
}

impl Harness {
    fn new() -> Self {
        Self {
            shard: TxnShard::replay(TxnConfig::default(), Vec::new()),
            log: Vec::new(),
            responses: HashMap::new(),
            markers: Vec::new(),
            completions: Vec::new(),
            next_token: 0,
            next_pid: 100,
            auto_persist: true,
            held: Vec::new(),
        }
    }

    fn run(&mut self, _now: i64, outputs: Vec<Output>) {
        let mut queue = outputs;
        while !queue.is_empty() {
            let mut next = Vec::new();
            for o in queue {
                match o {
                    Output::Respond { token, response } => {
                        self.responses.insert(token.0, response);
                    }
                    Output::Persist { id, record } => {
                        if self.auto_persist {
                            self.log.push(record);
                            next.extend(self.shard.persist_completed(id, Ok(())));
                        } else {
                            self.held.push((id, record));
                        }
                    }
                    Output::WriteMarkers(job) => self.markers.push(job),
                    Output::Completed(c) => self.completions.push(c),
                }
            }
            queue = next;
        }
    }

    fn token(&mut self) -> RequestToken {
        self.next_token += 1;
        RequestToken(self.next_token)
    }

    fn init(&mut self, now: i64, id: &str, pid: i64, epoch: i16) -> Result<(i64, i16), TxnError> {
        let token = self.token();
        self.next_pid += 1;
        let out = self.shard.handle_init_producer_id(
            now,
            token,
            InitProducerIdRequest {
                transactional_id: id.into(),
                timeout_ms: 60_000,
                producer_id: pid,
                producer_epoch: epoch,
                fresh_producer_id: self.next_pid,
            },
        );
        self.run(now, out);
        match self.responses.remove(&token.0) {
            Some(Response::InitProducerId(r)) => r,
            other => panic!("no InitProducerId answer: {other:?}"),
        }
    }

    fn add(
        &mut self,
        now: i64,
        id: &str,
        pe: (i64, i16),
        p: &[(&str, i32)],
    ) -> Result<(), TxnError> {
        let token = self.token();
        let out = self
            .shard
            .handle_add_partitions(now, token, id, pe.0, pe.1, parts(p));
        self.run(now, out);
        match self.responses.remove(&token.0) {
            Some(Response::AddPartitions(r)) => r,
            other => panic!("no AddPartitions answer: {other:?}"),
        }
    }

    fn end(&mut self, now: i64, id: &str, pe: (i64, i16), commit: bool) -> Result<(), TxnError> {
        let token = self.token();
        let out = self
            .shard
            .handle_end_txn(now, token, id, pe.0, pe.1, commit);
        self.run(now, out);
        match self.responses.remove(&token.0) {
            Some(Response::EndTxn(r)) => r,
            other => panic!("no EndTxn answer: {other:?}"),
        }
    }

    fn finish_markers(&mut self, now: i64) {
        for job in std::mem::take(&mut self.markers) {
            let out = self.shard.markers_written(now, &job);
            self.run(now, out);
        }
    }

    fn state(&self, id: &str) -> TxnState {
        self.shard
            .describe(id)
            .map(|d| d.state)
            .unwrap_or(TxnState::Dead)
    }
}

#[test]
fn a_new_transactional_id_gets_a_fresh_producer_id_at_epoch_zero_then_bumps() {
    let mut h = Harness::new();
    assert_eq!(h.init(T0, "tx", -1, -1), Ok((101, 0)));
    assert_eq!(h.state("tx"), TxnState::Empty);
    // A second producer with the same id (or a restart) bumps the epoch, same producer id.
    assert_eq!(h.init(T0, "tx", -1, -1), Ok((101, 1)));
    assert_eq!(h.log.len(), 2);
}

#[test]
fn commit_goes_through_prepare_markers_and_complete() {
    let mut h = Harness::new();
    let pe = h.init(T0, "tx", -1, -1).unwrap();
    assert_eq!(h.end(T0, "tx", pe, true), Err(TxnError::InvalidTxnState));
    h.add(T0, "tx", pe, &[("a", 0), ("a", 1)]).unwrap();
    assert_eq!(h.state("tx"), TxnState::Ongoing);
    h.add(T0 + 5, "tx", pe, &[("b", 2)]).unwrap();
    let d = h.shard.describe("tx").unwrap();
    assert_eq!(d.start_ms, T0);
    assert_eq!(d.partitions, parts(&[("a", 0), ("a", 1), ("b", 2)]));
    assert_eq!(h.end(T0 + 6, "tx", pe, true), Ok(()));
    assert_eq!(h.state("tx"), TxnState::PrepareCommit);
    assert_eq!(h.markers.len(), 1);
    assert!(h.markers[0].commit);
    assert_eq!(
        h.markers[0].partitions,
        parts(&[("a", 0), ("a", 1), ("b", 2)])
    );
    // While markers are out: adding, ending again, and re-initialising must wait.
    assert_eq!(
        h.add(T0, "tx", pe, &[("c", 0)]),
        Err(TxnError::ConcurrentTransactions)
    );
    assert_eq!(
        h.end(T0, "tx", pe, true),
        Err(TxnError::ConcurrentTransactions)
    );
    assert_eq!(h.end(T0, "tx", pe, false), Err(TxnError::InvalidTxnState));
    assert_eq!(
        h.init(T0, "tx", -1, -1),
        Err(TxnError::ConcurrentTransactions)
    );
    h.finish_markers(T0 + 7);
    assert_eq!(h.state("tx"), TxnState::CompleteCommit);
    assert_eq!(h.completions, vec![Completion::Committed]);
    assert!(h.shard.describe("tx").unwrap().partitions.is_empty());
    // A retried commit is fine, an abort of a committed transaction is not.
    assert_eq!(h.end(T0, "tx", pe, true), Ok(()));
    assert_eq!(h.end(T0, "tx", pe, false), Err(TxnError::InvalidTxnState));
    // The next transaction starts from CompleteCommit.
    h.add(T0 + 10, "tx", pe, &[("c", 0)]).unwrap();
    assert_eq!(h.shard.describe("tx").unwrap().start_ms, T0 + 10);
    assert_eq!(
        h.shard.describe("tx").unwrap().partitions,
        parts(&[("c", 0)])
    );
}

#[test]
fn abort_writes_abort_markers() {
    let mut h = Harness::new();
    let pe = h.init(T0, "tx", -1, -1).unwrap();
    h.add(T0, "tx", pe, &[("a", 0)]).unwrap();
    assert_eq!(h.end(T0, "tx", pe, false), Ok(()));
    assert_eq!(h.state("tx"), TxnState::PrepareAbort);
    assert!(!h.markers[0].commit);
    assert_eq!(
        h.end(T0, "tx", pe, false),
        Err(TxnError::ConcurrentTransactions)
    );
    assert_eq!(h.end(T0, "tx", pe, true), Err(TxnError::InvalidTxnState));
    h.finish_markers(T0);
    assert_eq!(h.state("tx"), TxnState::CompleteAbort);
    assert_eq!(h.end(T0, "tx", pe, false), Ok(()));
    assert_eq!(h.end(T0, "tx", pe, true), Err(TxnError::InvalidTxnState));
    assert_eq!(h.completions, vec![Completion::Aborted]);
}

#[test]
fn a_second_producer_fences_the_first_and_aborts_its_open_transaction() {
    let mut h = Harness::new();
    let old = h.init(T0, "tx", -1, -1).unwrap();
    h.add(T0, "tx", old, &[("a", 0)]).unwrap();
    // The newcomer's init fences and aborts first, and is told to retry.
    assert_eq!(
        h.init(T0, "tx", -1, -1),
        Err(TxnError::ConcurrentTransactions)
    );
    assert_eq!(h.state("tx"), TxnState::PrepareAbort);
    let job = h.markers[0].clone();
    assert!(!job.commit);
    assert_eq!(job.producer_epoch, old.1 + 1);
    // The fenced producer can no longer do anything.
    assert_eq!(h.end(T0, "tx", old, true), Err(TxnError::ProducerFenced));
    assert_eq!(
        h.add(T0, "tx", old, &[("b", 0)]),
        Err(TxnError::ProducerFenced)
    );
    assert_eq!(
        h.init(T0, "tx", -1, -1),
        Err(TxnError::ConcurrentTransactions)
    );
    h.finish_markers(T0);
    assert_eq!(h.state("tx"), TxnState::CompleteAbort);
    let new = h.init(T0, "tx", -1, -1).unwrap();
    assert_eq!(new, (old.0, old.1 + 2));
    assert_eq!(h.end(T0, "tx", old, false), Err(TxnError::ProducerFenced));
    // KIP-360: the old producer re-initialising with its stale epoch is fenced too.
    assert_eq!(
        h.init(T0, "tx", old.0, old.1),
        Err(TxnError::ProducerFenced)
    );
}

#[test]
fn kip360_bumps_the_epoch_of_the_named_producer_and_retries_get_the_same_answer() {
    let mut h = Harness::new();
    let pe = h.init(T0, "tx", -1, -1).unwrap();
    let bumped = h.init(T0, "tx", pe.0, pe.1).unwrap();
    assert_eq!(bumped, (pe.0, pe.1 + 1));
    // The answer was lost; the producer asks again with its old epoch.
    assert_eq!(h.init(T0, "tx", pe.0, pe.1), Ok(bumped));
    assert_eq!(
        h.init(T0, "tx", 9999, 0),
        Err(TxnError::InvalidProducerIdMapping)
    );
}

#[test]
fn an_exhausted_epoch_gets_a_new_producer_id() {
    let mut h = Harness::new();
    let record = TxnRecord {
        transactional_id: "tx".into(),
        value: Some(TxnValue {
            producer_id: 5,
            producer_epoch: i16::MAX - 1,
            timeout_ms: 1000,
            state: TxnState::CompleteCommit,
            partitions: BTreeSet::new(),
            last_update_ms: T0,
            start_ms: T0,
        }),
    };
    h.shard = TxnShard::replay(TxnConfig::default(), vec![record]);
    assert_eq!(h.init(T0, "tx", -1, -1), Ok((101, 0)));
}

#[test]
fn requests_are_checked_as_kafka_checks_them() {
    let mut h = Harness::new();
    let token = h.token();
    let out = h.shard.handle_init_producer_id(
        T0,
        token,
        InitProducerIdRequest {
            transactional_id: "tx".into(),
            timeout_ms: 15 * 60 * 1000 + 1,
            producer_id: -1,
            producer_epoch: -1,
            fresh_producer_id: 1,
        },
    );
    h.run(T0, out);
    assert_eq!(
        h.responses.remove(&token.0),
        Some(Response::InitProducerId(Err(
            TxnError::InvalidTransactionTimeout
        )))
    );
    assert_eq!(
        h.state("tx"),
        TxnState::Dead,
        "a refused init creates nothing"
    );
    assert_eq!(
        h.add(T0, "nope", (1, 0), &[("a", 0)]),
        Err(TxnError::InvalidProducerIdMapping)
    );
    let pe = h.init(T0, "tx", -1, -1).unwrap();
    assert_eq!(
        h.add(T0, "tx", (pe.0 + 1, pe.1), &[("a", 0)]),
        Err(TxnError::InvalidProducerIdMapping)
    );
    assert_eq!(
        h.add(T0, "tx", (pe.0, pe.1 + 1), &[("a", 0)]),
        Err(TxnError::ProducerFenced)
    );
    assert_eq!(
        h.add(T0, "", pe, &[("a", 0)]),
        Err(TxnError::InvalidRequest)
    );
    assert_eq!(
        h.shard.describe("nope"),
        Err(TxnError::TransactionalIdNotFound)
    );
}

#[test]
fn a_request_while_a_record_is_being_written_is_concurrent_and_a_failed_write_changes_nothing() {
    let mut h = Harness::new();
    let pe = h.init(T0, "tx", -1, -1).unwrap();
    h.auto_persist = false;
    let t1 = h.token();
    let out = h
        .shard
        .handle_add_partitions(T0, t1, "tx", pe.0, pe.1, parts(&[("a", 0)]));
    h.run(T0, out);
    assert!(
        h.responses.is_empty(),
        "answered before the record is durable"
    );
    let t2 = h.token();
    let out = h.shard.handle_end_txn(T0, t2, "tx", pe.0, pe.1, true);
    h.run(T0, out);
    assert_eq!(
        h.responses.remove(&t2.0),
        Some(Response::EndTxn(Err(TxnError::ConcurrentTransactions)))
    );
    let (id, _) = h.held.pop().unwrap();
    let out = h.shard.persist_completed(id, Err(TxnError::NotCoordinator));
    h.run(T0, out);
    assert_eq!(
        h.responses.remove(&t1.0),
        Some(Response::AddPartitions(Err(TxnError::NotCoordinator)))
    );
    assert_eq!(h.state("tx"), TxnState::Empty);
}

#[test]
fn a_transaction_open_past_its_timeout_is_aborted_and_its_producer_fenced() {
    let mut h = Harness::new();
    let pe = h.init(T0, "tx", -1, -1).unwrap();
    h.add(T0, "tx", pe, &[("a", 0)]).unwrap();
    let out = h.shard.tick(T0 + 60_000);
    h.run(T0 + 60_000, out);
    assert_eq!(h.state("tx"), TxnState::Ongoing, "not past its 60 s yet");
    let now = T0 + 60_001;
    let out = h.shard.tick(now);
    h.run(now, out);
    assert_eq!(
        h.state("tx"),
        TxnState::Ongoing,
        "the scan runs once per interval"
    );
    let now = T0 + 70_000;
    let out = h.shard.tick(now);
    h.run(now, out);
    assert_eq!(h.state("tx"), TxnState::PrepareAbort);
    assert_eq!(h.markers[0].producer_epoch, pe.1 + 1);
    h.finish_markers(now);
    assert_eq!(h.state("tx"), TxnState::CompleteAbort);
    assert_eq!(h.completions, vec![Completion::TimedOut]);
    assert_eq!(h.end(now, "tx", pe, true), Err(TxnError::ProducerFenced));
}

#[test]
fn an_idle_transactional_id_expires() {
    let mut h = Harness::new();
    h.init(T0, "tx", -1, -1).unwrap();
    let week = 7 * 24 * 3600 * 1000;
    let out = h.shard.tick(T0 + week);
    h.run(T0 + week, out);
    assert_eq!(h.state("tx"), TxnState::Empty);
    let out = h.shard.tick(T0 + week + 10_001);
    h.run(T0 + week + 10_001, out);
    assert_eq!(
        h.shard.describe("tx"),
        Err(TxnError::TransactionalIdNotFound)
    );
    assert_eq!(h.log.last().unwrap().value, None, "a tombstone is written");
    // Replaying the log, tombstone included, forgets it too.
    let replayed = TxnShard::replay(TxnConfig::default(), h.log.clone());
    assert!(replayed.ids().is_empty());
}

#[test]
fn replay_rebuilds_the_same_state_and_resumes_prepared_transactions() {
    let mut h = Harness::new();
    let a = h.init(T0, "a", -1, -1).unwrap();
    let b = h.init(T0, "b", -1, -1).unwrap();
    let c = h.init(T0, "c", -1, -1).unwrap();
    h.add(T0, "a", a, &[("x", 0), ("y", 1)]).unwrap();
    h.add(T0, "b", b, &[("x", 1)]).unwrap();
    h.add(T0, "c", c, &[("x", 2)]).unwrap();
    h.end(T0, "a", a, true).unwrap(); // prepared, markers never written
    h.end(T0, "c", c, false).unwrap();
    h.markers.retain(|j| j.transactional_id == "c");
    h.finish_markers(T0);
    // Each record round-trips Kafka's encoding, as it would through storage.
    let stored: Vec<TxnRecord> = h
        .log
        .iter()
        .map(|r| TxnRecord {
            transactional_id: crate::decode_key(&crate::encode_key(&r.transactional_id)).unwrap(),
            value: r
                .value
                .as_ref()
                .map(|v| crate::decode_value(&crate::encode_value(v)).unwrap()),
        })
        .collect();
    let replayed = TxnShard::replay(TxnConfig::default(), stored);
    for id in ["a", "b", "c"] {
        assert_eq!(replayed.describe(id), h.shard.describe(id), "{id}");
    }
    assert_eq!(replayed.open_count(), 2);
    assert_eq!(
        replayed.resume(),
        vec![Output::WriteMarkers(MarkerJob {
            transactional_id: "a".into(),
            producer_id: a.0,
            producer_epoch: a.1,
            commit: true,
            partitions: parts(&[("x", 0), ("y", 1)]),
        })]
    );
    // The new coordinator completes it like the old one would have.
    let mut h2 = Harness::new();
    h2.shard = replayed;
    let resumed = h2.shard.resume();
    h2.run(T0, resumed);
    h2.finish_markers(T0);
    assert_eq!(h2.state("a"), TxnState::CompleteCommit);
}

#[test]
fn verify_only_reports_membership_of_the_ongoing_transaction() {
    let mut h = Harness::new();
    let pe = h.init(T0, "tx", -1, -1).unwrap();
    h.add(T0, "tx", pe, &[("a", 0)]).unwrap();
    let r = h
        .shard
        .verify_partitions("tx", pe.0, pe.1, &[tp("a", 0), tp("a", 1)]);
    assert_eq!(
        r,
        vec![
            (tp("a", 0), Ok(())),
            (tp("a", 1), Err(TxnError::InvalidTxnState))
        ]
    );
    let r = h
        .shard
        .verify_partitions("tx", pe.0, pe.1 + 1, &[tp("a", 0)]);
    assert_eq!(r, vec![(tp("a", 0), Err(TxnError::ProducerFenced))]);
}

#[test]
fn list_filters_by_state_producer_and_duration() {
    let mut h = Harness::new();
    let a = h.init(T0, "a", -1, -1).unwrap();
    h.init(T0, "b", -1, -1).unwrap();
    h.add(T0, "a", a, &[("x", 0)]).unwrap();
    let all = h.shard.list(
        T0,
        &ListFilter {
            min_duration_ms: -1,
            ..Default::default()
        },
    );
    assert_eq!(all.len(), 2);
    let ongoing = h.shard.list(
        T0,
        &ListFilter {
            states: vec![TxnState::Ongoing],
            min_duration_ms: -1,
            ..Default::default()
        },
    );
    assert_eq!(ongoing, vec![("a".to_string(), a.0, TxnState::Ongoing)]);
    let long = h.shard.list(
        T0 + 500,
        &ListFilter {
            min_duration_ms: 1000,
            ..Default::default()
        },
    );
    assert!(long.is_empty());
    let long = h.shard.list(
        T0 + 1500,
        &ListFilter {
            min_duration_ms: 1000,
            ..Default::default()
        },
    );
    assert_eq!(long.len(), 1);
    assert_eq!(
        TxnState::from_name("PrepareCommit"),
        Some(TxnState::PrepareCommit)
    );
}

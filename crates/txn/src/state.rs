//! One shard's transactions and Kafka's transitions (TransactionCoordinator and
//! TransactionMetadata of Kafka 4, for clients at `transaction.version` < 2: the epoch is
//! bumped by InitProducerId and by fencing, not by every EndTxn).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use strata_core::TopicPartition;

use crate::error::TxnError;
use crate::record::{TxnRecord, TxnValue};

/// Kafka's `RecordBatch.NO_PRODUCER_EPOCH` / `NO_PRODUCER_ID`.
const NO_EPOCH: i16 = -1;
const NO_PRODUCER_ID: i64 = -1;

/// Kafka's TransactionState, with its codes in the log record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TxnState {
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
    Dead,
    PrepareEpochFence,
}

impl TxnState {
    pub fn code(self) -> i8 {
        match self {
            TxnState::Empty => 0,
            TxnState::Ongoing => 1,
            TxnState::PrepareCommit => 2,
            TxnState::PrepareAbort => 3,
            TxnState::CompleteCommit => 4,
            TxnState::CompleteAbort => 5,
            TxnState::Dead => 6,
            TxnState::PrepareEpochFence => 7,
        }
    }

    pub fn from_code(code: i8) -> Option<Self> {
        Some(match code {
            0 => TxnState::Empty,
            1 => TxnState::Ongoing,
            2 => TxnState::PrepareCommit,
            3 => TxnState::PrepareAbort,
            4 => TxnState::CompleteCommit,
            5 => TxnState::CompleteAbort,
            6 => TxnState::Dead,
            7 => TxnState::PrepareEpochFence,
            _ => return None,
        })
    }

    /// The name DescribeTransactions and ListTransactions use (Kafka's `stateName`).
    pub fn name(self) -> &'static str {
        match self {
            TxnState::Empty => "Empty",
            TxnState::Ongoing => "Ongoing",
            TxnState::PrepareCommit => "PrepareCommit",
            TxnState::PrepareAbort => "PrepareAbort",
            TxnState::CompleteCommit => "CompleteCommit",
            TxnState::CompleteAbort => "CompleteAbort",
            TxnState::Dead => "Dead",
            TxnState::PrepareEpochFence => "PrepareEpochFence",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        (0..8)
            .filter_map(Self::from_code)
            .find(|s| s.name() == name)
    }

    fn is_open(self) -> bool {
        matches!(
            self,
            TxnState::Ongoing | TxnState::PrepareCommit | TxnState::PrepareAbort
        )
    }
}

/// Limits from the broker's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnConfig {
    /// Kafka's `transaction.max.timeout.ms`: a larger requested timeout is refused.
    pub max_timeout_ms: i64,
    /// Kafka's `transactional.id.expiration.ms`: an idle, finished transactional id is
    /// forgotten after this long.
    pub expiration_ms: i64,
    /// Kafka's `transaction.abort.timed.out.transaction.cleanup.interval.ms`.
    pub abort_check_interval_ms: i64,
}

impl Default for TxnConfig {
    fn default() -> Self {
        Self {
            max_timeout_ms: 15 * 60 * 1000,
            expiration_ms: 7 * 24 * 3600 * 1000,
            abort_check_interval_ms: 10_000,
        }
    }
}

/// Identifies a request whose response may be held back until a record is durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestToken(pub u64);

/// Identifies one record handed out for persisting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PersistId(pub u64);

/// InitProducerId with a transactional id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitProducerIdRequest {
    pub transactional_id: String,
    pub timeout_ms: i32,
    /// KIP-360 (v3+): the producer's current id and epoch, or -1/-1.
    pub producer_id: i64,
    pub producer_epoch: i16,
    /// An unused producer id the caller allocated, taken when the transactional id needs a
    /// new one (first use, or epoch exhaustion). Allocation is IO, hence done outside.
    pub fresh_producer_id: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    InitProducerId(Result<(i64, i16), TxnError>),
    /// One answer for every partition of the request, as Kafka gives.
    AddPartitions(Result<(), TxnError>),
    EndTxn(Result<(), TxnError>),
}

/// Write the commit or abort markers of a prepared transaction into its partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkerJob {
    pub transactional_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub commit: bool,
    pub partitions: BTreeSet<TopicPartition>,
}

/// How a transaction ended, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    Committed,
    Aborted,
    TimedOut,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    Respond {
        token: RequestToken,
        response: Response,
    },
    /// Append `record` with acks=all and report with [`TxnShard::persist_completed`].
    Persist { id: PersistId, record: TxnRecord },
    /// Write markers and report with [`TxnShard::markers_written`]; never fails, only retries.
    WriteMarkers(MarkerJob),
    /// A transaction ended: its Complete record is durable.
    Completed(Completion),
}

/// What DescribeTransactions reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnDescription {
    pub transactional_id: String,
    pub state: TxnState,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub timeout_ms: i32,
    pub start_ms: i64,
    pub partitions: BTreeSet<TopicPartition>,
}

/// ListTransactions' filters (empty = any), and its duration filter (KIP-994; -1 = any).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListFilter {
    pub states: Vec<TxnState>,
    pub producer_ids: Vec<i64>,
    pub min_duration_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Meta {
    producer_id: i64,
    producer_epoch: i16,
    /// The epoch before the last bump, so a producer retrying InitProducerId after a lost
    /// answer gets the same epoch (not persisted, as in Kafka).
    last_producer_epoch: i16,
    timeout_ms: i32,
    state: TxnState,
    partitions: BTreeSet<TopicPartition>,
    start_ms: i64,
    last_update_ms: i64,
    /// Aborted by the coordinator on timeout, so counted as timed out, not aborted, when it
    /// completes (not persisted: a replayed one counts as aborted).
    timed_out: bool,
}

impl Meta {
    fn value(&self) -> TxnValue {
        TxnValue {
            producer_id: self.producer_id,
            producer_epoch: self.producer_epoch,
            timeout_ms: self.timeout_ms,
            state: self.state,
            partitions: self.partitions.clone(),
            last_update_ms: self.last_update_ms,
            start_ms: self.start_ms,
        }
    }

    fn from_value(v: TxnValue) -> Self {
        Self {
            producer_id: v.producer_id,
            producer_epoch: v.producer_epoch,
            last_producer_epoch: NO_EPOCH,
            timeout_ms: v.timeout_ms,
            state: v.state,
            partitions: v.partitions,
            start_ms: v.start_ms,
            last_update_ms: v.last_update_ms,
            timed_out: false,
        }
    }
}

/// What happens once a pending record is durable.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Then {
    Nothing,
    SendMarkers,
    Complete { commit: bool, timed_out: bool },
    Forget,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Pending {
    id: PersistId,
    /// The metadata the record carries, adopted once durable (None: removed).
    next: Option<Meta>,
    reply: Option<(RequestToken, Response)>,
    then: Then,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Txn {
    meta: Meta,
    pending: Option<Pending>,
}

fn exhausted(epoch: i16) -> bool {
    epoch >= i16::MAX - 1
}

/// The transactions of one `__transaction_state` partition.
#[derive(Debug)]
pub struct TxnShard {
    config: TxnConfig,
    txns: HashMap<String, Txn>,
    next_persist: u64,
    pending_ids: HashMap<PersistId, String>,
    next_abort_check_ms: i64,
}

impl TxnShard {
    /// Rebuilds a shard from its records in log order; the last record per id wins. The
    /// prepared transactions it finds come back from [`Self::resume`].
    pub fn replay(config: TxnConfig, records: impl IntoIterator<Item = TxnRecord>) -> Self {
        let mut txns = HashMap::new();
        for r in records {
            match r.value {
                Some(v) => {
                    txns.insert(
                        r.transactional_id,
                        Txn {
                            meta: Meta::from_value(v),
                            pending: None,
                        },
                    );
                }
                None => {
                    txns.remove(&r.transactional_id);
                }
            }
        }
        Self {
            config,
            txns,
            next_persist: 0,
            pending_ids: HashMap::new(),
            next_abort_check_ms: i64::MIN,
        }
    }

    /// The marker jobs of every transaction replay found prepared but not completed: the
    /// previous coordinator decided them, and may or may not have written their markers.
    pub fn resume(&self) -> Vec<Output> {
        let mut jobs: Vec<Output> = self
            .txns
            .iter()
            .filter(|(_, t)| {
                matches!(
                    t.meta.state,
                    TxnState::PrepareCommit | TxnState::PrepareAbort
                )
            })
            .map(|(id, t)| Output::WriteMarkers(marker_job(id, &t.meta)))
            .collect();
        jobs.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
        jobs
    }

    pub fn config(&self) -> &TxnConfig {
        &self.config
    }

    /// Transactions started and not yet completed (Ongoing or Prepare*).
    pub fn open_count(&self) -> usize {
        self.txns
            .values()
            .filter(|t| t.meta.state.is_open())
            .count()
    }

    fn persist(&mut self, transactional_id: &str, pending: Pending) -> Output {
        let record = TxnRecord {
            transactional_id: transactional_id.to_string(),
            value: pending.next.as_ref().map(Meta::value),
        };
        let id = pending.id;
        self.pending_ids.insert(id, transactional_id.to_string());
        if let Some(t) = self.txns.get_mut(transactional_id) {
            t.pending = Some(pending);
        }
        Output::Persist { id, record }
    }

    fn next_id(&mut self) -> PersistId {
        self.next_persist += 1;
        PersistId(self.next_persist)
    }

    pub fn handle_init_producer_id(
        &mut self,
        now_ms: i64,
        token: RequestToken,
        req: InitProducerIdRequest,
    ) -> Vec<Output> {
        let reply = |r: Result<(i64, i16), TxnError>| {
            vec![Output::Respond {
                token,
                response: Response::InitProducerId(r),
            }]
        };
        if req.transactional_id.is_empty() {
            return reply(Err(TxnError::InvalidRequest));
        }
        if req.timeout_ms <= 0 || i64::from(req.timeout_ms) > self.config.max_timeout_ms {
            return reply(Err(TxnError::InvalidTransactionTimeout));
        }
        let id = req.transactional_id.clone();
        if req.producer_id != NO_PRODUCER_ID && !self.txns.contains_key(&id) {
            return reply(Err(TxnError::InvalidProducerIdMapping));
        }
        let txn = self.txns.entry(id.clone()).or_insert_with(|| Txn {
            meta: Meta {
                producer_id: req.fresh_producer_id,
                producer_epoch: NO_EPOCH,
                last_producer_epoch: NO_EPOCH,
                timeout_ms: req.timeout_ms,
                state: TxnState::Empty,
                partitions: BTreeSet::new(),
                start_ms: -1,
                last_update_ms: now_ms,
                timed_out: false,
            },
            pending: None,
        });
        let meta = &txn.meta;
        // KIP-360: a producer that names its id must name this transactional id's.
        if req.producer_id != NO_PRODUCER_ID && req.producer_id != meta.producer_id {
            return reply(Err(TxnError::InvalidProducerIdMapping));
        }
        if txn.pending.is_some() {
            return reply(Err(TxnError::ConcurrentTransactions));
        }
        match meta.state {
            TxnState::PrepareCommit
            | TxnState::PrepareAbort
            | TxnState::PrepareEpochFence
            | TxnState::Dead => reply(Err(TxnError::ConcurrentTransactions)),
            TxnState::Ongoing => {
                // Fence the producer of the open transaction and abort it first; the new one
                // retries until the abort completes (Kafka answers CONCURRENT_TRANSACTIONS).
                let mut next = meta.clone();
                if !exhausted(next.producer_epoch) {
                    next.producer_epoch += 1;
                }
                next.state = TxnState::PrepareAbort;
                next.last_update_ms = now_ms;
                let pending = Pending {
                    id: self.next_id(),
                    next: Some(next),
                    reply: None,
                    then: Then::SendMarkers,
                };
                let mut out = vec![self.persist(&id, pending)];
                out.extend(reply(Err(TxnError::ConcurrentTransactions)));
                out
            }
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort => {
                let mut next = meta.clone();
                if exhausted(meta.producer_epoch) {
                    // The epoch cannot be bumped again: a new producer id starts at epoch 0.
                    next.producer_id = req.fresh_producer_id;
                    next.producer_epoch = 0;
                    next.last_producer_epoch = NO_EPOCH;
                } else if req.producer_epoch == NO_EPOCH
                    || meta.producer_epoch == NO_EPOCH
                    || req.producer_epoch == meta.producer_epoch
                {
                    next.last_producer_epoch = if req.producer_id == NO_PRODUCER_ID {
                        NO_EPOCH
                    } else {
                        meta.producer_epoch
                    };
                    next.producer_epoch = meta.producer_epoch.saturating_add(1).max(0);
                } else if req.producer_epoch == meta.last_producer_epoch {
                    // A retry whose answer was lost: the bump already happened.
                    return reply(Ok((meta.producer_id, meta.producer_epoch)));
                } else {
                    return reply(Err(TxnError::ProducerFenced));
                }
                next.timeout_ms = req.timeout_ms;
                next.state = TxnState::Empty;
                next.partitions.clear();
                next.start_ms = -1;
                next.last_update_ms = now_ms;
                let answer = (next.producer_id, next.producer_epoch);
                let pending = Pending {
                    id: self.next_id(),
                    next: Some(next),
                    reply: Some((token, Response::InitProducerId(Ok(answer)))),
                    then: Then::Nothing,
                };
                vec![self.persist(&id, pending)]
            }
        }
    }

    /// Checks shared by AddPartitionsToTxn and EndTxn (Kafka's order).
    fn check_producer(
        &self,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
    ) -> Result<&Txn, TxnError> {
        if transactional_id.is_empty() {
            return Err(TxnError::InvalidRequest);
        }
        let txn = self
            .txns
            .get(transactional_id)
            .ok_or(TxnError::InvalidProducerIdMapping)?;
        if txn.meta.producer_id != producer_id {
            return Err(TxnError::InvalidProducerIdMapping);
        }
        if txn.meta.producer_epoch != producer_epoch {
            return Err(TxnError::ProducerFenced);
        }
        if txn.pending.is_some() {
            return Err(TxnError::ConcurrentTransactions);
        }
        Ok(txn)
    }

    /// AddPartitionsToTxn (and AddOffsetsToTxn, which adds the group's offsets partition).
    pub fn handle_add_partitions(
        &mut self,
        now_ms: i64,
        token: RequestToken,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        partitions: BTreeSet<TopicPartition>,
    ) -> Vec<Output> {
        let reply = |r: Result<(), TxnError>| {
            vec![Output::Respond {
                token,
                response: Response::AddPartitions(r),
            }]
        };
        let txn = match self.check_producer(transactional_id, producer_id, producer_epoch) {
            Ok(t) => t,
            Err(e) => return reply(Err(e)),
        };
        let meta = &txn.meta;
        match meta.state {
            TxnState::PrepareCommit | TxnState::PrepareAbort | TxnState::PrepareEpochFence => {
                return reply(Err(TxnError::ConcurrentTransactions))
            }
            TxnState::Dead => return reply(Err(TxnError::InvalidTxnState)),
            TxnState::Ongoing if partitions.is_subset(&meta.partitions) => return reply(Ok(())),
            _ => {}
        }
        let mut next = meta.clone();
        if meta.state != TxnState::Ongoing {
            next.start_ms = now_ms;
            next.partitions.clear();
        }
        next.state = TxnState::Ongoing;
        next.partitions.extend(partitions);
        next.last_update_ms = now_ms;
        let pending = Pending {
            id: self.next_id(),
            next: Some(next),
            reply: Some((token, Response::AddPartitions(Ok(())))),
            then: Then::Nothing,
        };
        vec![self.persist(transactional_id, pending)]
    }

    /// AddPartitionsToTxn v4+ `verify_only` (KIP-890): whether each partition is part of the
    /// producer's ongoing transaction. No state changes.
    pub fn verify_partitions(
        &self,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        partitions: &[TopicPartition],
    ) -> Vec<(TopicPartition, Result<(), TxnError>)> {
        let checked = self
            .check_producer(transactional_id, producer_id, producer_epoch)
            .map(|t| &t.meta);
        partitions
            .iter()
            .map(|tp| {
                let r = match checked {
                    Err(e) => Err(e),
                    Ok(m) if m.state == TxnState::Ongoing && m.partitions.contains(tp) => Ok(()),
                    Ok(_) => Err(TxnError::InvalidTxnState),
                };
                (tp.clone(), r)
            })
            .collect()
    }

    pub fn handle_end_txn(
        &mut self,
        now_ms: i64,
        token: RequestToken,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
    ) -> Vec<Output> {
        let reply = |r: Result<(), TxnError>| {
            vec![Output::Respond {
                token,
                response: Response::EndTxn(r),
            }]
        };
        let txn = match self.check_producer(transactional_id, producer_id, producer_epoch) {
            Ok(t) => t,
            Err(e) => return reply(Err(e)),
        };
        let meta = &txn.meta;
        let same = |s: TxnState| {
            if commit {
                s == TxnState::CompleteCommit || s == TxnState::PrepareCommit
            } else {
                s == TxnState::CompleteAbort || s == TxnState::PrepareAbort
            }
        };
        match meta.state {
            TxnState::Ongoing => {}
            TxnState::CompleteCommit | TxnState::CompleteAbort if same(meta.state) => {
                // A retry of an EndTxn that completed.
                return reply(Ok(()));
            }
            TxnState::PrepareCommit | TxnState::PrepareAbort if same(meta.state) => {
                return reply(Err(TxnError::ConcurrentTransactions))
            }
            TxnState::PrepareEpochFence => return reply(Err(TxnError::ConcurrentTransactions)),
            _ => return reply(Err(TxnError::InvalidTxnState)),
        }
        let mut next = meta.clone();
        next.state = if commit {
            TxnState::PrepareCommit
        } else {
            TxnState::PrepareAbort
        };
        next.last_update_ms = now_ms;
        let pending = Pending {
            id: self.next_id(),
            next: Some(next),
            reply: Some((token, Response::EndTxn(Ok(())))),
            then: Then::SendMarkers,
        };
        vec![self.persist(transactional_id, pending)]
    }

    /// A record handed out by [`Output::Persist`] is durable (`Ok`) or was not written (the
    /// error the waiting request gets; the transition does not happen).
    pub fn persist_completed(
        &mut self,
        id: PersistId,
        outcome: Result<(), TxnError>,
    ) -> Vec<Output> {
        let Some(txn_id) = self.pending_ids.remove(&id) else {
            return Vec::new();
        };
        let Some(txn) = self.txns.get_mut(&txn_id) else {
            return Vec::new();
        };
        let Some(pending) = txn.pending.take() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if let Err(e) = outcome {
            if let Some((token, response)) = pending.reply {
                out.push(Output::Respond {
                    token,
                    response: with_error(response, e),
                });
            }
            // A transactional id whose very first record failed never existed.
            if txn.meta.producer_epoch == NO_EPOCH && txn.meta.state == TxnState::Empty {
                self.txns.remove(&txn_id);
            }
            // A Complete record that failed leaves the transaction prepared: send its markers
            // again (they are idempotent) and complete it after.
            if matches!(pending.then, Then::Complete { .. }) {
                out.extend(self.retry_prepared(&txn_id));
            }
            return out;
        }
        match pending.next {
            Some(meta) => txn.meta = meta,
            None => {
                self.txns.remove(&txn_id);
            }
        }
        if let Some((token, response)) = pending.reply {
            out.push(Output::Respond { token, response });
        }
        match pending.then {
            Then::Nothing | Then::Forget => {}
            Then::SendMarkers => {
                if let Some(txn) = self.txns.get(&txn_id) {
                    out.push(Output::WriteMarkers(marker_job(&txn_id, &txn.meta)));
                }
            }
            Then::Complete { commit, timed_out } => out.push(Output::Completed(if commit {
                Completion::Committed
            } else if timed_out {
                Completion::TimedOut
            } else {
                Completion::Aborted
            })),
        }
        out
    }

    /// Every marker of `job` is written: record the transaction complete. A job that no longer
    /// matches the transaction (already completed) is ignored.
    pub fn markers_written(&mut self, now_ms: i64, job: &MarkerJob) -> Vec<Output> {
        let Some(txn) = self.txns.get(&job.transactional_id) else {
            return Vec::new();
        };
        let meta = &txn.meta;
        let expected = if job.commit {
            TxnState::PrepareCommit
        } else {
            TxnState::PrepareAbort
        };
        if txn.pending.is_some()
            || meta.state != expected
            || meta.producer_id != job.producer_id
            || meta.producer_epoch != job.producer_epoch
        {
            return Vec::new();
        }
        let timed_out = meta.timed_out;
        let mut next = meta.clone();
        next.state = if job.commit {
            TxnState::CompleteCommit
        } else {
            TxnState::CompleteAbort
        };
        next.partitions.clear();
        next.last_update_ms = now_ms;
        next.timed_out = false;
        let pending = Pending {
            id: self.next_id(),
            next: Some(next),
            reply: None,
            then: Then::Complete {
                commit: job.commit,
                timed_out,
            },
        };
        vec![self.persist(&job.transactional_id, pending)]
    }

    fn retry_prepared(&self, transactional_id: &str) -> Vec<Output> {
        match self.txns.get(transactional_id) {
            Some(t)
                if t.pending.is_none()
                    && matches!(
                        t.meta.state,
                        TxnState::PrepareCommit | TxnState::PrepareAbort
                    ) =>
            {
                vec![Output::WriteMarkers(marker_job(transactional_id, &t.meta))]
            }
            _ => Vec::new(),
        }
    }

    /// When [`Self::tick`] next has something to do.
    pub fn next_deadline_ms(&self) -> i64 {
        if self.next_abort_check_ms == i64::MIN {
            return i64::MIN;
        }
        self.next_abort_check_ms
    }

    /// Aborts transactions open longer than their timeout (fencing their producer with an
    /// epoch bump, as Kafka) and forgets transactional ids idle past the expiration. Runs its
    /// scan once per `abort_check_interval_ms`.
    pub fn tick(&mut self, now_ms: i64) -> Vec<Output> {
        if now_ms < self.next_abort_check_ms {
            return Vec::new();
        }
        self.next_abort_check_ms = now_ms.saturating_add(self.config.abort_check_interval_ms);
        let mut timed_out: Vec<String> = Vec::new();
        let mut expired: Vec<String> = Vec::new();
        for (id, t) in &self.txns {
            if t.pending.is_some() {
                continue;
            }
            let m = &t.meta;
            if m.state == TxnState::Ongoing
                && now_ms > m.start_ms.saturating_add(i64::from(m.timeout_ms))
            {
                timed_out.push(id.clone());
            } else if matches!(
                m.state,
                TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort
            ) && now_ms > m.last_update_ms.saturating_add(self.config.expiration_ms)
            {
                expired.push(id.clone());
            }
        }
        timed_out.sort();
        expired.sort();
        let mut out = Vec::new();
        for id in timed_out {
            let Some(t) = self.txns.get(&id) else {
                continue;
            };
            let mut next = t.meta.clone();
            if !exhausted(next.producer_epoch) {
                next.producer_epoch += 1;
            }
            next.timed_out = true;
            next.state = TxnState::PrepareAbort;
            next.last_update_ms = now_ms;
            let pending = Pending {
                id: self.next_id(),
                next: Some(next),
                reply: None,
                then: Then::SendMarkers,
            };
            out.push(self.persist(&id, pending));
        }
        for id in expired {
            let pending = Pending {
                id: self.next_id(),
                next: None,
                reply: None,
                then: Then::Forget,
            };
            out.push(self.persist(&id, pending));
        }
        out
    }

    pub fn describe(&self, transactional_id: &str) -> Result<TxnDescription, TxnError> {
        let t = self
            .txns
            .get(transactional_id)
            .ok_or(TxnError::TransactionalIdNotFound)?;
        Ok(describe(transactional_id, &t.meta))
    }

    /// ListTransactions over this shard: (id, producer id, state), sorted by id.
    pub fn list(&self, now_ms: i64, filter: &ListFilter) -> Vec<(String, i64, TxnState)> {
        let mut out: Vec<(String, i64, TxnState)> = self
            .txns
            .iter()
            .filter(|(_, t)| {
                let m = &t.meta;
                (filter.states.is_empty() || filter.states.contains(&m.state))
                    && (filter.producer_ids.is_empty()
                        || filter.producer_ids.contains(&m.producer_id))
                    && (filter.min_duration_ms < 0
                        || (m.state.is_open()
                            && now_ms.saturating_sub(m.start_ms) >= filter.min_duration_ms))
            })
            .map(|(id, t)| (id.clone(), t.meta.producer_id, t.meta.state))
            .collect();
        out.sort();
        out
    }

    /// Every transactional id of the shard, for the broker's own iteration.
    pub fn ids(&self) -> BTreeMap<String, TxnState> {
        self.txns
            .iter()
            .map(|(k, t)| (k.clone(), t.meta.state))
            .collect()
    }
}

fn describe(id: &str, m: &Meta) -> TxnDescription {
    TxnDescription {
        transactional_id: id.to_string(),
        state: m.state,
        producer_id: m.producer_id,
        producer_epoch: m.producer_epoch,
        timeout_ms: m.timeout_ms,
        start_ms: m.start_ms,
        partitions: m.partitions.clone(),
    }
}

fn marker_job(id: &str, m: &Meta) -> MarkerJob {
    MarkerJob {
        transactional_id: id.to_string(),
        producer_id: m.producer_id,
        producer_epoch: m.producer_epoch,
        commit: m.state == TxnState::PrepareCommit,
        partitions: m.partitions.clone(),
    }
}

fn with_error(response: Response, e: TxnError) -> Response {
    match response {
        Response::InitProducerId(_) => Response::InitProducerId(Err(e)),
        Response::AddPartitions(_) => Response::AddPartitions(Err(e)),
        Response::EndTxn(_) => Response::EndTxn(Err(e)),
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;

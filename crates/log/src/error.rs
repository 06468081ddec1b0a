use strata_storage::StorageError;
use strata_wire::batch::BatchError;

pub type LogResult<T> = Result<T, LogError>;

/// Why a log operation failed. The broker maps each variant to exactly one Kafka error code.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("unknown topic or partition")]
    UnknownTopicOrPartition,
    #[error("topic {0} already exists")]
    TopicAlreadyExists(String),
    #[error("invalid topic name: {0}")]
    InvalidTopic(String),
    #[error("invalid partition count: {0}")]
    InvalidPartitions(String),
    #[error("invalid config: {0}")]
    InvalidConfig(String),
    #[error("invalid replica assignment: {0}")]
    InvalidReplicaAssignment(String),
    #[error("corrupt record batch: {0}")]
    CorruptMessage(#[from] BatchError),
    #[error("record batch of {size} bytes exceeds max.message.bytes {max}")]
    MessageTooLarge { size: usize, max: usize },
    #[error("offset {offset} out of range [{log_start}, {high_watermark}]")]
    OffsetOutOfRange {
        offset: i64,
        log_start: i64,
        high_watermark: i64,
    },
    #[error("out of order sequence for producer {producer_id}: expected {expected}, got {got}")]
    OutOfOrderSequence {
        producer_id: i64,
        expected: i32,
        got: i32,
    },
    #[error("producer {producer_id} epoch {got} is older than the current {current}")]
    InvalidProducerEpoch {
        producer_id: i64,
        got: i16,
        current: i16,
    },
    #[error("unknown producer id {0}")]
    UnknownProducerId(i64),
    #[error("invalid transaction state: {0}")]
    InvalidTxnState(String),
    #[error("marker for producer {producer_id} from coordinator epoch {got}, older than the last seen {current}")]
    TransactionCoordinatorFenced {
        producer_id: i64,
        got: i32,
        current: i32,
    },
    #[error("the partition keeps {max} aborted transactions (max_aborted_transactions): no new transaction is started until retention or DeleteRecords passes older ones")]
    TooManyAbortedTransactions { max: usize },
    #[error("invalid timestamp: {0}")]
    InvalidTimestamp(String),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
    #[error("this broker no longer owns the partition (fenced by a newer owner)")]
    Fenced,
    #[error("this broker does not serve the partition (another broker owns it)")]
    NotOwner,
    #[error("the append did not become durable within the request timeout")]
    Timeout,
    #[error("too many produce bytes in flight")]
    Backpressure,
    #[error("the partition's uncompacted tail is full ({batches} batches, {bytes} bytes; max_uncompacted_bytes {max_bytes}, max_uncompacted_batches {max_batches}): compaction is behind, retry later")]
    CompactionBehind {
        bytes: usize,
        batches: usize,
        max_bytes: usize,
        max_batches: usize,
    },
    #[error("log is shutting down")]
    ShuttingDown,
    #[error("stored data is corrupt: {0}")]
    CorruptStorage(String),
}

impl LogError {
    /// Whether a client retry may succeed (the broker turns these into retriable Kafka codes).
    pub fn is_retryable(&self) -> bool {
        match self {
            LogError::Storage(e) => e.is_retryable(),
            LogError::Timeout
            | LogError::Backpressure
            | LogError::CompactionBehind { .. }
            | LogError::ShuttingDown => true,
            LogError::Fenced | LogError::NotOwner => true,
            _ => false,
        }
    }
}

impl From<strata_layout::LayoutError> for LogError {
    fn from(e: strata_layout::LayoutError) -> Self {
        match e {
            strata_layout::LayoutError::Storage(e) => LogError::Storage(e),
            e => LogError::CorruptStorage(e.to_string()),
        }
    }
}

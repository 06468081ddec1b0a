//! The coordinator's refusals, each one Kafka error code (the broker's table maps them).

/// Why the coordinator refused a request; named after the Kafka code it becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TxnError {
    #[error("this broker is not the coordinator of the transactional id")]
    NotCoordinator,
    #[error("the coordinator is loading its transactions")]
    CoordinatorLoadInProgress,
    #[error("the coordinator could not write its decision")]
    CoordinatorNotAvailable,
    #[error("invalid request")]
    InvalidRequest,
    #[error("the transaction timeout is larger than transaction_max_timeout or not positive")]
    InvalidTransactionTimeout,
    #[error("the producer id does not match the transactional id's")]
    InvalidProducerIdMapping,
    #[error("a newer producer with the same transactional id has fenced this one")]
    ProducerFenced,
    #[error("the producer epoch is not the current one")]
    InvalidProducerEpoch,
    #[error("a previous operation of this transaction is still completing; retry")]
    ConcurrentTransactions,
    #[error("the transaction is not in a state that allows this")]
    InvalidTxnState,
    #[error("no such transactional id")]
    TransactionalIdNotFound,
}

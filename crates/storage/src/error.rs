use crate::ObjectKey;

pub type StorageResult<T> = Result<T, StorageError>;

/// What can go wrong talking to storage, by meaning rather than by backend.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The object does not exist.
    #[error("object {0} not found")]
    NotFound(ObjectKey),
    /// A create-only put found the object already there.
    #[error("object {0} already exists")]
    AlreadyExists(ObjectKey),
    /// A compare-and-swap found a different version than expected (or no object).
    #[error("object {0} changed since it was read (version mismatch)")]
    Precondition(ObjectKey),
    /// The storage asked us to slow down (S3 503 SlowDown, RADOS EBUSY…).
    #[error("storage throttled the request: {0}")]
    Throttled(String),
    /// No answer within the request timeout. The operation may or may not have happened.
    #[error("storage request timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// The storage is unreachable or failing; retrying later may succeed.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// The storage is out of space or over a quota (ENOSPC, EDQUOT, a full RADOS pool). The
    /// request was refused, not half-done, so it is not ambiguous. It clears only when someone
    /// frees space, which never happens within one request's retry budget: callers see it at
    /// once instead of after seconds of backoff, and decide themselves how to wait.
    #[error("storage full: {0}")]
    Full(String),
    /// A key or argument the backend cannot accept.
    #[error("invalid storage request: {0}")]
    Invalid(String),
    /// Anything else; not retried.
    #[error("storage error: {0}")]
    Other(String),
}

impl StorageError {
    /// Whether retrying the same request may succeed (later: see [`Self::is_worth_retrying_now`]).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            StorageError::Throttled(_)
                | StorageError::Timeout(_)
                | StorageError::Unavailable(_)
                | StorageError::Full(_)
        )
    }

    /// Whether a retry within the same request, after a backoff of milliseconds to seconds, is
    /// likely to succeed. A full storage is retryable but not this: it waits for an operator.
    pub fn is_worth_retrying_now(&self) -> bool {
        self.is_retryable() && !matches!(self, StorageError::Full(_))
    }

    /// Whether the outcome is unknown: the write may have landed even though we saw an error.
    pub fn is_ambiguous(&self) -> bool {
        matches!(
            self,
            StorageError::Timeout(_) | StorageError::Unavailable(_)
        )
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, StorageError::NotFound(_))
    }
}

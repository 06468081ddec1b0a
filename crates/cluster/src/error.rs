//! The one error type of the coordination layer.

use strata_core::BrokerId;
use strata_layout::LayoutError;
use strata_storage::StorageError;

use strata_layout::cluster::Incarnation;

pub type ClusterResult<T> = Result<T, ClusterError>;

/// What can go wrong while coordinating through storage.
///
/// Callers mostly need two answers, given by the classifiers: may the same request succeed if
/// tried again later ([`ClusterError::is_retryable`]), and has somebody else taken over what we
/// thought was ours, so that we must stop acting on it ([`ClusterError::is_fenced`]).
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The storage failed the request.
    #[error("storage: {0}")]
    Storage(#[from] StorageError),

    /// Another process registered this broker id and its heartbeat moved while we watched it:
    /// starting a second broker with the same id would confuse clients and placement.
    #[error(
        "broker id {broker} is in use by a live broker (incarnation {incarnation}, whose heartbeat \
         moved while we watched); refusing to start a second broker with the same id"
    )]
    BrokerIdInUse {
        broker: BrokerId,
        incarnation: Incarnation,
    },

    /// Our registration was replaced by another incarnation (we were judged dead, e.g. after a
    /// long pause) or removed by somebody else. This process must stop serving and restart.
    #[error("the registration of broker {broker} was taken over or removed; this process is considered dead")]
    RegistrationLost { broker: BrokerId },

    /// A compare-and-swap on an ownership record lost: somebody changed it since we read it.
    #[error("lost the race for {resource}: its ownership record changed since it was read")]
    Lost { resource: String },

    /// An operation that needs us to own the resource found another owner (or none).
    #[error("{resource} is not owned by this broker incarnation")]
    NotOwner { resource: String },

    /// The old writer of a stream kept winning the race for the next sequence number.
    #[error("could not seal stream {stream:08x} after {attempts} attempts: its writer keeps racing ahead")]
    SealContended { stream: u32, attempts: u32 },

    /// This broker's own write-ahead stream was sealed by another broker: everything it serves
    /// is being taken over, and it must restart as a new incarnation with a new stream.
    #[error("this broker's write-ahead stream was sealed by another broker; it must restart")]
    Fenced,

    /// An object we own the format of could not be decoded.
    #[error("corrupt object {key}: {reason}")]
    Corrupt { key: String, reason: String },

    /// The background task that carried out a request has stopped.
    #[error("the {0} task has stopped")]
    Stopped(&'static str),

    /// A caller passed something unusable (a resource name that is not a valid key, …).
    #[error("invalid request: {0}")]
    Invalid(String),
}

impl ClusterError {
    /// Whether trying the same request again later may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            ClusterError::Storage(e) => e.is_retryable(),
            ClusterError::SealContended { .. } => true,
            _ => false,
        }
    }

    /// Whether somebody else now owns what we acted for: stop serving it, do not retry.
    pub fn is_fenced(&self) -> bool {
        matches!(
            self,
            ClusterError::RegistrationLost { .. }
                | ClusterError::Lost { .. }
                | ClusterError::NotOwner { .. }
                | ClusterError::Fenced
        )
    }

    pub(crate) fn corrupt(key: impl ToString, reason: impl ToString) -> Self {
        ClusterError::Corrupt {
            key: key.to_string(),
            reason: reason.to_string(),
        }
    }
}

impl From<LayoutError> for ClusterError {
    fn from(e: LayoutError) -> Self {
        match e {
            LayoutError::Storage(e) => ClusterError::Storage(e),
            LayoutError::Corrupt { key, reason } => ClusterError::Corrupt { key, reason },
            LayoutError::UnsupportedSchema {
                key,
                found,
                supported,
            } => ClusterError::Corrupt {
                key,
                reason: format!(
                    "schema {found} was written by a newer Strata; this build reads up to {supported}"
                ),
            },
            e @ LayoutError::Encode { .. } => ClusterError::Invalid(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifiers_separate_transient_from_fenced() {
        let transient = ClusterError::Storage(StorageError::Unavailable("down".into()));
        assert!(transient.is_retryable() && !transient.is_fenced());
        let lost = ClusterError::Lost {
            resource: "t/0".into(),
        };
        assert!(lost.is_fenced() && !lost.is_retryable());
        assert!(ClusterError::Fenced.is_fenced());
        let corrupt = ClusterError::corrupt("k", "bad json");
        assert!(!corrupt.is_fenced() && !corrupt.is_retryable());
    }
}

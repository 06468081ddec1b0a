//! From `object_store` and HTTP outcomes to what they mean for Strata.
//!
//! `object_store` classifies 404, 409, 412 and 304 itself; everything else arrives as
//! `Error::Generic` wrapping its private retry error. Transport failures are recognised by the
//! public [`HttpError`] in the source chain; HTTP statuses only through the error text
//! ("status code: 503"), because the type that holds them is not exported.

use std::error::Error as StdError;
use std::time::Duration;

use object_store::client::{HttpError, HttpErrorKind};
use strata_storage::{ObjectKey, StorageError};

/// Which operation failed, because a status means different things for different verbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Create,
    Update,
    Read,
    List,
    Delete,
}

/// Maps a failed request. `elapsed` is how long the request took, reported for timeouts.
pub(crate) fn map_error(
    err: object_store::Error,
    op: Op,
    key: Option<&ObjectKey>,
    elapsed: Duration,
) -> StorageError {
    use object_store::Error as E;
    // Key-level meanings need a key; a listing that hits them (a missing bucket answers 404)
    // is a configuration problem, reported as such.
    let Some(key) = key else {
        return match err {
            E::Generic { source, .. } => classify_generic(source.as_ref(), elapsed),
            other => StorageError::Other(format!("listing failed: {other}")),
        };
    };
    let key = key.clone();
    match err {
        E::NotFound { .. } if op == Op::Update => StorageError::Precondition(key),
        E::NotFound { .. } => StorageError::NotFound(key),
        // S3 answers 409 ConditionalRequestConflict to an If-Match PUT racing another conditional
        // write on the same key. Nothing was written and a retry will either succeed or get 412,
        // so it is retryable but not ambiguous — Throttled is the meaning that says exactly that.
        E::AlreadyExists { source, .. } if op == Op::Update => StorageError::Throttled(format!(
            "conflicting concurrent conditional write (409), retry: {source}"
        )),
        E::AlreadyExists { .. } => StorageError::AlreadyExists(key),
        E::Precondition { .. } | E::NotModified { .. } => StorageError::Precondition(key),
        E::InvalidPath { source } => StorageError::Invalid(source.to_string()),
        err @ (E::NotSupported { .. }
        | E::NotImplemented { .. }
        | E::UnknownConfigurationKey { .. }) => StorageError::Invalid(err.to_string()),
        err @ (E::PermissionDenied { .. } | E::Unauthenticated { .. }) => {
            StorageError::Other(err.to_string())
        }
        E::Generic { source, .. } => classify_generic(source.as_ref(), elapsed),
        other => StorageError::Other(other.to_string()),
    }
}

fn classify_generic(source: &(dyn StdError + 'static), elapsed: Duration) -> StorageError {
    let text = error_chain_text(source);
    if let Some(kind) = transport_error_kind(source) {
        return match kind {
            HttpErrorKind::Timeout => StorageError::Timeout(elapsed),
            // Connect means the request never left; Request/Interrupted/Decode/Unknown mean it may
            // have been processed. Unavailable is retryable and ambiguous, which is right for all:
            // the retry wrapper treats an ambiguous put with the care it needs.
            _ => StorageError::Unavailable(text),
        };
    }
    match http_status(&text) {
        Some(429) | Some(503) => StorageError::Throttled(text),
        // S3 returns SlowDown inside 200/500 bodies too.
        _ if text.contains("SlowDown") => StorageError::Throttled(text),
        Some(408) => StorageError::Timeout(elapsed),
        Some(status) if (500..600).contains(&status) => StorageError::Unavailable(text),
        Some(416) => StorageError::Invalid(text),
        _ => StorageError::Other(text),
    }
}

fn transport_error_kind(source: &(dyn StdError + 'static)) -> Option<HttpErrorKind> {
    let mut current: Option<&(dyn StdError + 'static)> = Some(source);
    while let Some(err) = current {
        if let Some(http) = err.downcast_ref::<HttpError>() {
            return Some(http.kind());
        }
        current = err.source();
    }
    None
}

/// The whole chain in one line, because the outer layers often say only "Generic S3 error".
fn error_chain_text(source: &(dyn StdError + 'static)) -> String {
    let mut text = source.to_string();
    let mut current = source.source();
    while let Some(err) = current {
        let part = err.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        current = err.source();
    }
    text
}

/// A 500 the server sent: it has finished with the request, so what it stored can be inspected.
/// 502/504 come from proxies whose backend may still be working, and transport errors say
/// nothing about the server, so neither qualifies.
pub(crate) fn is_final_server_error(err: &object_store::Error) -> bool {
    match err {
        object_store::Error::Generic { source, .. } => {
            transport_error_kind(source.as_ref()).is_none()
                && http_status(&error_chain_text(source.as_ref())) == Some(500)
        }
        _ => false,
    }
}

/// Finds the status in object_store's "Server returned non-2xx status code: 503 Service ..." text.
pub(crate) fn http_status(text: &str) -> Option<u16> {
    let (_, after) = text.split_once("status code: ")?;
    let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_status_out_of_object_store_text() {
        let text = "Error performing PUT http://x/y in 2ms - Server returned non-2xx status \
                    code: 503 Service Unavailable: <Error><Code>SlowDown</Code></Error>";
        assert_eq!(http_status(text), Some(503));
        assert_eq!(http_status("no status here"), None);
    }

    #[test]
    fn status_meanings() {
        let generic = |text: &str| object_store::Error::Generic {
            store: "S3",
            source: text.to_string().into(),
        };
        let key = ObjectKey::new("a/b").unwrap();
        let map = |text: &str| map_error(generic(text), Op::Read, Some(&key), Duration::ZERO);
        assert!(matches!(
            map("status code: 503 Service Unavailable"),
            StorageError::Throttled(_)
        ));
        assert!(matches!(
            map("status code: 429 Too Many"),
            StorageError::Throttled(_)
        ));
        assert!(matches!(
            map("status code: 500 Internal"),
            StorageError::Unavailable(_)
        ));
        assert!(matches!(
            map("status code: 400 Bad Request"),
            StorageError::Other(_)
        ));
    }

    #[test]
    fn conflicts_mean_different_things_per_verb() {
        let key = ObjectKey::new("a/b").unwrap();
        let conflict = || object_store::Error::AlreadyExists {
            path: "a/b".into(),
            source: "409".to_string().into(),
        };
        let missing = || object_store::Error::NotFound {
            path: "a/b".into(),
            source: "404".to_string().into(),
        };
        let map = |err, op| map_error(err, op, Some(&key), Duration::ZERO);
        assert!(matches!(
            map(conflict(), Op::Create),
            StorageError::AlreadyExists(_)
        ));
        assert!(matches!(
            map(conflict(), Op::Update),
            StorageError::Throttled(_)
        ));
        assert!(matches!(
            map(missing(), Op::Update),
            StorageError::Precondition(_)
        ));
        assert!(matches!(
            map(missing(), Op::Read),
            StorageError::NotFound(_)
        ));
    }
}

//! Write-ahead stream registrations: `meta/streams/<stream:08x>`, one per broker incarnation,
//! created (create-only) by the log when it opens, before the stream writes anything.
//!
//! A registration lives until its stream is *retired*: sealed, with nothing below the seal but
//! hole markers. The garbage collector then deletes it, unless it is the highest registration,
//! which must stay because new ids are allocated above it. So the registrations listed are the
//! streams that may still hold data, and a start-up or a collector pass costs what the live
//! streams cost, not one request per broker start there ever was.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use strata_core::BrokerId;
use strata_storage::{ObjectKey, ObjectStore, PutMode, StorageError};

use crate::schema::{self, Schema};
use crate::LayoutResult;

pub const PREFIX: &str = "meta/streams/";

pub fn key(stream: u32) -> String {
    format!("{PREFIX}{stream:08x}")
}

/// The stream id of a listed registration key; None for anything else.
pub fn parse_key(key: &str) -> Option<u32> {
    u32::from_str_radix(key.strip_prefix(PREFIX)?, 16).ok()
}

/// The content of `meta/streams/<stream>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamRegistration {
    /// The broker (node id) whose incarnation writes the stream.
    pub broker: BrokerId,
    /// Wall time of the registration, for operators only.
    pub started_ms: i64,
}

impl Schema for StreamRegistration {
    const SCHEMA: u32 = 1;
    const WHAT: &'static str = "stream registration";
}

/// Claims a new stream id for `registration`'s broker: one above the highest registered,
/// create-only, so two brokers (or a broker and its restarted self) never share one.
pub async fn register(
    store: &dyn ObjectStore,
    registration: &StreamRegistration,
) -> LayoutResult<u32> {
    let mut candidate = match store.list(PREFIX).await?.last() {
        Some(meta) => parse_key(meta.key.as_str()).map_or(Some(1), |n| n.checked_add(1)),
        None => Some(1),
    }
    .ok_or_else(|| StorageError::Invalid("every write-ahead stream id is taken".into()))?;
    let body = schema::encode(registration)?;
    loop {
        let key = ObjectKey::new(key(candidate))?;
        match store.put(&key, body.clone(), PutMode::Create).await {
            Ok(_) => return Ok(candidate),
            Err(StorageError::AlreadyExists(_)) => {
                candidate = candidate.checked_add(1).ok_or_else(|| {
                    StorageError::Invalid("every write-ahead stream id is taken".into())
                })?;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The registered stream ids, ascending: every stream not yet retired, and the highest ever
/// registered. One listing, no reads.
pub async fn registered(store: &dyn ObjectStore) -> LayoutResult<Vec<u32>> {
    let mut streams: Vec<u32> = store
        .list(PREFIX)
        .await?
        .iter()
        .filter_map(|meta| parse_key(meta.key.as_str()))
        .collect();
    streams.sort_unstable();
    Ok(streams)
}

/// Deletes the registration of a retired `stream`, given the registered ids as listed
/// (ascending). Refuses (returns false) for the highest listed: ids are allocated above the
/// highest registration, so deleting it could hand its id out again. A higher one, once
/// listed, is never deleted before a still higher one exists, so the highest always stays.
/// Retiring twice (another broker's collector got there first) is not an error.
pub async fn retire(
    store: &dyn ObjectStore,
    stream: u32,
    registered: &[u32],
) -> LayoutResult<bool> {
    if registered.last().is_none_or(|&highest| stream >= highest) {
        return Ok(false);
    }
    match store.delete(&ObjectKey::new(key(stream))?).await {
        Ok(()) | Err(StorageError::NotFound(_)) => Ok(true),
        Err(e) => Err(e.into()),
    }
}

/// Decodes a registration read from `key`.
pub fn decode(key: &str, bytes: &[u8]) -> LayoutResult<StreamRegistration> {
    schema::decode(key, bytes)
}

/// The streams registered for `broker` (every incarnation's not yet retired), sorted.
pub async fn streams_of_broker(
    store: &dyn ObjectStore,
    broker: BrokerId,
) -> LayoutResult<Vec<u32>> {
    let mut streams = Vec::new();
    for meta in store.list(PREFIX).await? {
        let Some(stream) = parse_key(meta.key.as_str()) else {
            continue;
        };
        let bytes: Bytes = match store.get(&meta.key).await {
            Ok((bytes, _)) => bytes,
            Err(StorageError::NotFound(_)) => continue,
            Err(e) => return Err(e.into()),
        };
        if decode(meta.key.as_str(), &bytes)?.broker == broker {
            streams.push(stream);
        }
    }
    streams.sort_unstable();
    Ok(streams)
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_storage::MemoryStore;

    #[test]
    fn keys_round_trip() {
        assert_eq!(key(0x2a), "meta/streams/0000002a");
        assert_eq!(parse_key("meta/streams/0000002a"), Some(0x2a));
        assert_eq!(parse_key("meta/catalog/0000002a"), None);
    }

    #[test]
    fn a_registration_of_the_old_format_still_reads() {
        // Written by the log's untyped `json!` before this crate existed.
        let old = br#"{"broker":3,"started_ms":1700000000000}"#;
        assert_eq!(
            decode("meta/streams/00000001", old).unwrap(),
            StreamRegistration {
                broker: BrokerId(3),
                started_ms: 1_700_000_000_000
            }
        );
    }

    #[tokio::test]
    async fn registers_above_the_highest_and_finds_a_brokers_streams() {
        let store = MemoryStore::new();
        for broker in [1, 2, 1] {
            let registration = StreamRegistration {
                broker: BrokerId(broker),
                started_ms: 5,
            };
            register(&store, &registration).await.unwrap();
        }
        assert_eq!(
            streams_of_broker(&store, BrokerId(1)).await.unwrap(),
            [1, 3]
        );
        assert!(streams_of_broker(&store, BrokerId(5))
            .await
            .unwrap()
            .is_empty());
    }

    #[tokio::test]
    async fn retiring_deletes_any_registration_but_the_highest() {
        let store = MemoryStore::new();
        for broker in [1, 2, 3] {
            let registration = StreamRegistration {
                broker: BrokerId(broker),
                started_ms: 5,
            };
            register(&store, &registration).await.unwrap();
        }
        let listed = registered(&store).await.unwrap();
        assert_eq!(listed, [1, 2, 3]);
        assert!(!retire(&store, 3, &listed).await.unwrap());
        assert!(retire(&store, 1, &listed).await.unwrap());
        // Again, as a second collector would: already gone is fine.
        assert!(retire(&store, 1, &listed).await.unwrap());
        assert_eq!(registered(&store).await.unwrap(), [2, 3]);
        // The next id is still above the highest, whatever was retired below it.
        let id = register(
            &store,
            &StreamRegistration {
                broker: BrokerId(4),
                started_ms: 6,
            },
        )
        .await
        .unwrap();
        assert_eq!(id, 4);
        assert!(!retire(&store, 9, &[]).await.unwrap());
    }

    /// The old code added one to the highest id: a panic in a debug build, and in a release
    /// build stream 0, which manifests use for "no stream".
    #[tokio::test]
    async fn exhausted_stream_ids_are_an_error_not_stream_zero() {
        let store = MemoryStore::new();
        store
            .put(
                &ObjectKey::new(key(u32::MAX)).unwrap(),
                Bytes::from_static(br#"{"broker":1,"started_ms":0}"#),
                PutMode::Create,
            )
            .await
            .unwrap();
        let registration = StreamRegistration {
            broker: BrokerId(2),
            started_ms: 0,
        };
        assert!(matches!(
            register(&store, &registration).await,
            Err(crate::LayoutError::Storage(StorageError::Invalid(_)))
        ));
        assert_eq!(store.object_count(), 1);
    }
}

//! The storage layout: every object key and every stored schema the brokers write, defined
//! once. Other crates build keys, parse listed keys and encode or decode stored objects only
//! through this crate, so a change of layout is a change here and nowhere else.
//!
//! ```text
//! meta/catalog/<version:020>             topic catalog; version N+1 is written create-only
//! meta/streams/<stream:08x>              one per broker incarnation (write-ahead stream id)
//! meta/producer-ids/<block:020>          claimed blocks of idempotent producer ids (empty)
//! wal/<stream:08x>/<seq:020>             a group-commit object, or a seal / hole marker
//! log/<topic-id>/<p>/manifest            a partition's manifest (CAS)
//! log/<topic-id>/<p>/index/<chunk:020>   an index chunk
//! log/<topic-id>/<p>/seg/<base:020>-<stream:08x>   a compacted segment
//! cluster/brokers/<node id>              registration + heartbeat of one broker (CAS)
//! cluster/owners/<resource>              owner record of one resource (CAS)
//! cluster/placement/<resource>           an operator's explicit placement
//! cluster/placement-changes              rewritten after every placement override change
//! cluster/owners-changes                 rewritten after every owner record change (RADOS)
//! cluster/drain/<node id>                an operator's request that a broker drain
//! security/users/<hex of name>           a SCRAM user's salted credentials (CAS)
//! security/salt-key                      the key of unknown users' fake SCRAM salts
//! ```
//!
//! Stored JSON schemas carry a `schema` number ([`schema`]). Objects written before it existed
//! have none and read as schema 1, which is what they are; an object of a newer schema than
//! this build knows is refused ([`LayoutError::UnsupportedSchema`]) rather than half-read.
//!
//! What stays with its only user: the binary codecs of write-ahead objects and index chunks,
//! and the JSON of partition manifests (the log's offsets, index references and producer
//! state), the consumer-group records (records of `__consumer_offsets`, not objects), and the
//! cluster's own registration and owner-record schemas (read and written only by
//! `strata-cluster`, which versions them with [`schema`]).
//!
//! This crate knows only [`strata_core`] and [`strata_storage`].

pub mod catalog;
pub mod cluster;
mod error;
pub mod ids;
pub mod partition;
pub mod producer_ids;
pub mod schema;
pub mod streams;
pub mod users;
pub mod wal;

pub use catalog::{Catalog, CatalogReader, CatalogTopic, TopicSummary};
pub use error::{LayoutError, LayoutResult};
pub use ids::TopicId;

//! The transaction coordinator's [`MarkerWriter`] for a real broker: WriteTxnMarkers (v1) to
//! the current owner of each partition of a transaction, grouped by owner, over the Kafka
//! protocol (`strata-client`), as Kafka's coordinator sends them to partition leaders.
//!
//! Brokers reach each other on the inter-broker listener ([`inter_broker_listener`]), and
//! address every owner by that listener's name in the owner's registration. It is PLAINTEXT,
//! or SASL_PLAINTEXT with the broker's own login (`inter_broker_sasl_*`), whose principal
//! needs CLUSTER_ACTION as Kafka's broker principal does. TLS listeners cannot be: the brokers'
//! client speaks no TLS yet. A broker with no usable listener refuses transactions
//! (FindCoordinator for a transactional id, see `handlers/groups.rs`) rather than accept
//! transactions it could not finish.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Weak};

use async_trait::async_trait;
use kafka_protocol::messages::add_partitions_to_txn_request::{
    AddPartitionsToTxnTopic, AddPartitionsToTxnTransaction,
};
use kafka_protocol::messages::write_txn_markers_request::{
    WritableTxnMarker, WritableTxnMarkerTopic,
};
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, ProducerId, TransactionalId, WriteTxnMarkersRequest,
};
use kafka_protocol::protocol::StrBytes;
use strata_client::Connection;
use strata_core::TopicPartition;
use strata_txn::MarkerJob;
use tracing::{debug, warn};

use crate::errors::code;
use crate::handlers::topic_name;
use crate::server::Broker;
use crate::txn_coordinator::MarkerWriter;

/// Kafka 4 serves WriteTxnMarkers v1 only (v0 was removed).
const WRITE_TXN_MARKERS_VERSION: i16 = 1;
/// AddPartitionsToTxn's brokers' form, with `verify_only` (KIP-890 part 1).
const VERIFY_VERSION: i16 = 4;

pub(crate) struct BrokerMarkers {
    broker: Weak<Broker>,
    /// The name of the listener brokers reach each other on.
    listener: String,
    /// This broker's own address on that listener (a broker alone on its storage has no
    /// registration to read it from).
    own: (String, u16),
    /// TLS and login as that listener's protocol wants them.
    security: strata_client::Security,
    connections: tokio::sync::Mutex<HashMap<(String, u16), Connection>>,
}

/// The listener brokers reach each other on: the one `inter_broker_listener_name` names (if
/// this broker can use it), else the first PLAINTEXT listener, else the first one it can use:
/// SASL_PLAINTEXT with a login, SSL with TLS settings, SASL_SSL with both. The server refuses
/// to start with a name that cannot be used, so None here means "no such listener".
pub(crate) fn inter_broker_listener<'a>(
    settings: &crate::BrokerSettings,
    listeners: &[&'a crate::security::Listener],
) -> Option<&'a crate::security::Listener> {
    use crate::security::SecurityProtocol::{Plaintext, SaslPlaintext, SaslSsl, Ssl};
    let (login, tls) = (
        settings.inter_broker_sasl.is_some(),
        settings.inter_broker_tls.is_some(),
    );
    let usable = |info: &&crate::security::Listener| match info.protocol {
        Plaintext => true,
        SaslPlaintext => login,
        Ssl => tls,
        SaslSsl => login && tls,
    };
    match &settings.inter_broker_listener_name {
        Some(name) => listeners
            .iter()
            .copied()
            .find(|info| &info.name == name)
            .filter(usable),
        None => listeners
            .iter()
            .copied()
            .find(|info| info.protocol == Plaintext)
            .or_else(|| listeners.iter().copied().find(usable)),
    }
}

/// What a connection to `protocol` needs of the inter-broker settings.
pub(crate) fn inter_broker_security(
    settings: &crate::BrokerSettings,
    protocol: crate::security::SecurityProtocol,
) -> strata_client::Security {
    use crate::security::SecurityProtocol::{SaslPlaintext, SaslSsl, Ssl};
    strata_client::Security {
        tls: matches!(protocol, Ssl | SaslSsl)
            .then(|| settings.inter_broker_tls.clone())
            .flatten(),
        sasl: matches!(protocol, SaslPlaintext | SaslSsl)
            .then(|| settings.inter_broker_sasl.clone())
            .flatten(),
    }
}

impl std::fmt::Debug for BrokerMarkers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerMarkers")
            .field("listener", &self.listener)
            .field("own", &self.own)
            .finish_non_exhaustive()
    }
}

impl BrokerMarkers {
    pub(crate) fn new(
        broker: Weak<Broker>,
        listener: String,
        own: (String, u16),
        security: strata_client::Security,
    ) -> Self {
        Self {
            broker,
            listener,
            own,
            security,
            connections: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    /// Where the owner of `tp` is reached; None while the partition is between owners.
    fn owner_address(&self, broker: &Broker, tp: &TopicPartition) -> Option<(String, u16)> {
        let Some(node) = broker.cluster.as_deref() else {
            return Some(self.own.clone());
        };
        let topic = broker.log.topic(&tp.topic)?;
        let view = node.view();
        let (leader, _) = node.leader_of(&view, &node.owners(), topic.id, tp)?;
        if leader == broker.settings.node_id {
            return Some(self.own.clone());
        }
        view.members
            .get(&leader)
            .map(|m| m.registration.endpoint(&self.listener))
            .map(|(h, p)| (h.to_string(), p))
    }

    /// WriteTxnMarkers to another broker over the Kafka protocol, on a connection kept per
    /// owner.
    /// The broker hosting `transactional_id`'s coordinator shard, when it is another one.
    fn coordinator_address(
        &self,
        broker: &Broker,
        transactional_id: &str,
    ) -> Option<(String, u16)> {
        let node = broker.cluster.as_deref()?;
        let topic = broker.log.topic(crate::txn_coordinator::TXN_TOPIC)?;
        let shard = crate::txn_coordinator::shard_of(transactional_id, broker.txn.shard_count());
        let tp = TopicPartition::new(Arc::clone(&topic.name), i32::try_from(shard).ok()?);
        let view = node.view();
        let (leader, _) = node.leader_of(&view, &node.owners(), topic.id, &tp)?;
        if leader == broker.settings.node_id {
            return None;
        }
        view.members
            .get(&leader)
            .map(|m| m.registration.endpoint(&self.listener))
            .map(|(h, p)| (h.to_string(), p))
    }

    async fn send_remote<R: kafka_protocol::protocol::Request>(
        &self,
        broker: &Broker,
        addr: &(String, u16),
        version: i16,
        request: &R,
    ) -> Result<R::Response, strata_client::ClientError> {
        let mut connections = self.connections.lock().await;
        let key = addr.clone();
        if !connections.contains_key(&key) {
            let c = Connection::connect_as(
                &format!("{}:{}", addr.0, addr.1),
                Arc::clone(&broker.clock),
                broker.settings.txn_marker_timeout,
                &self.security,
            )
            .await?;
            connections.insert(key.clone(), c);
        }
        let Some(connection) = connections.get_mut(&key) else {
            return Err(strata_client::ClientError::NotFound(format!(
                "{}:{}",
                addr.0, addr.1
            )));
        };
        let answer = connection.request(version, request).await;
        if answer.is_err() {
            // The connection may be half-used: start afresh next time.
            connections.remove(&key);
        }
        answer
    }

    /// One WriteTxnMarkers to `addr`; answers the partitions that were not written.
    async fn send(
        &self,
        broker: &Broker,
        addr: &(String, u16),
        job: &MarkerJob,
        coordinator_epoch: i32,
        partitions: &[TopicPartition],
    ) -> Result<Vec<TopicPartition>, strata_client::ClientError> {
        let mut topics: Vec<WritableTxnMarkerTopic> = Vec::new();
        for tp in partitions {
            match topics.last_mut() {
                Some(t) if t.name.0.as_str() == &*tp.topic => {
                    t.partition_indexes.push(tp.partition)
                }
                _ => {
                    let mut t = WritableTxnMarkerTopic::default();
                    t.name = topic_name(&tp.topic);
                    t.partition_indexes = vec![tp.partition];
                    topics.push(t);
                }
            }
        }
        let mut marker = WritableTxnMarker::default();
        marker.producer_id = ProducerId(job.producer_id);
        marker.producer_epoch = job.producer_epoch;
        marker.transaction_result = job.commit;
        marker.coordinator_epoch = coordinator_epoch;
        marker.topics = topics;
        let mut request = WriteTxnMarkersRequest::default();
        request.markers = vec![marker];
        let response = if *addr == self.own {
            // Partitions served here: the partition side's in-process entry point, no socket.
            crate::handlers::txn_markers::write_markers(broker, request).await
        } else {
            self.send_remote(broker, addr, WRITE_TXN_MARKERS_VERSION, &request)
                .await?
        };
        let mut left = Vec::new();
        let mut answered = BTreeSet::new();
        for m in response.markers {
            for t in m.topics {
                for p in t.partitions {
                    let tp = TopicPartition::new(t.name.0.as_str(), p.partition_index);
                    answered.insert(tp.clone());
                    match p.error_code {
                        code::NONE => {}
                        // The partition has seen a newer epoch of this producer: our marker is
                        // obsolete, and the newer one ends whatever is open there.
                        code::INVALID_PRODUCER_EPOCH => {
                            debug!(partition = %tp, "marker for an older producer epoch; done")
                        }
                        // A deleted topic keeps no transaction open (Kafka drops it too).
                        code::UNKNOWN_TOPIC_OR_PARTITION
                            if broker.log.topic(&tp.topic).is_none() => {}
                        other => {
                            debug!(partition = %tp, code = other, "marker not written; will retry");
                            left.push(tp);
                        }
                    }
                }
            }
        }
        left.extend(
            partitions
                .iter()
                .filter(|tp| !answered.contains(*tp))
                .cloned(),
        );
        Ok(left)
    }
}

#[async_trait]
impl MarkerWriter for BrokerMarkers {
    async fn write(
        &self,
        job: &MarkerJob,
        coordinator_epoch: i32,
        partitions: &BTreeSet<TopicPartition>,
    ) -> BTreeSet<TopicPartition> {
        let Some(broker) = self.broker.upgrade() else {
            return partitions.clone();
        };
        let mut left = BTreeSet::new();
        let mut by_owner: BTreeMap<(String, u16), Vec<TopicPartition>> = BTreeMap::new();
        for tp in partitions {
            if broker.log.topic(&tp.topic).is_none() {
                // Deleted since it joined the transaction: nothing left to mark.
                continue;
            }
            match self.owner_address(&broker, tp) {
                Some(addr) => by_owner.entry(addr).or_default().push(tp.clone()),
                None => {
                    left.insert(tp.clone());
                }
            }
        }
        for (addr, tps) in by_owner {
            match self
                .send(&broker, &addr, job, coordinator_epoch, &tps)
                .await
            {
                Ok(failed) => left.extend(failed),
                Err(e) => {
                    warn!(owner = %format!("{}:{}", addr.0, addr.1), error = %e,
                        "sending transaction markers failed; will retry");
                    left.extend(tps);
                }
            }
        }
        left
    }

    async fn verify_remote(
        &self,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        partitions: &[TopicPartition],
    ) -> Vec<(TopicPartition, i16)> {
        let all = |error: i16| partitions.iter().map(|tp| (tp.clone(), error)).collect();
        let Some(broker) = self.broker.upgrade() else {
            return all(code::COORDINATOR_NOT_AVAILABLE);
        };
        let Some(addr) = self.coordinator_address(&broker, transactional_id) else {
            return all(code::NOT_COORDINATOR);
        };
        let mut topics: Vec<AddPartitionsToTxnTopic> = Vec::new();
        for tp in partitions {
            match topics.last_mut() {
                Some(t) if t.name.0.as_str() == &*tp.topic => t.partitions.push(tp.partition),
                _ => {
                    let mut t = AddPartitionsToTxnTopic::default();
                    t.name = topic_name(&tp.topic);
                    t.partitions = vec![tp.partition];
                    topics.push(t);
                }
            }
        }
        let mut txn = AddPartitionsToTxnTransaction::default();
        txn.transactional_id = TransactionalId(StrBytes::from_string(transactional_id.to_string()));
        txn.producer_id = ProducerId(producer_id);
        txn.producer_epoch = producer_epoch;
        txn.verify_only = true;
        txn.topics = topics;
        let mut request = AddPartitionsToTxnRequest::default();
        request.transactions = vec![txn];
        let response = match self
            .send_remote(&broker, &addr, VERIFY_VERSION, &request)
            .await
        {
            Ok(r) => r,
            Err(e) => {
                warn!(coordinator = %format!("{}:{}", addr.0, addr.1), error = %e,
                    "verifying a transactional produce with its coordinator failed");
                return all(code::NETWORK_EXCEPTION);
            }
        };
        if response.error_code != code::NONE {
            return all(response.error_code);
        }
        let mut answered: HashMap<TopicPartition, i16> = HashMap::new();
        for result in response.results_by_transaction {
            for t in result.topic_results {
                for p in t.results_by_partition {
                    answered.insert(
                        TopicPartition::new(t.name.0.as_str(), p.partition_index),
                        p.partition_error_code,
                    );
                }
            }
        }
        partitions
            .iter()
            .map(|tp| {
                let error = answered
                    .get(tp)
                    .copied()
                    .unwrap_or(code::UNKNOWN_SERVER_ERROR);
                (tp.clone(), error)
            })
            .collect()
    }
}

//! The broker object and its accept loop.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use strata_core::Clock;
use strata_log::{LogError, LogManager};
use strata_storage::ObjectStore;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Semaphore};
use tracing::{debug, info, warn};

use crate::cluster::{ClusterNode, ClusterStartError, Joined};
use crate::connection::Connection;
use crate::coordinator::GroupCoordinator;
use crate::fetch_sessions::{FetchSessionStats, FetchSessions};
use crate::limits::Limits;
use crate::quotas::{QuotaStore, Quotas, ThrottleStats};
use crate::security::{AclStore, AuthStats, Listener, Principal, SecurityError, UserStore};
use crate::traffic::Traffic;
use crate::txn_coordinator::TxnCoordinator;
use crate::BrokerSettings;

/// Everything a broker is built from: the log it serves, the clock, its settings, and the
/// seed of the group coordinator's member ids.
#[derive(Debug)]
pub struct BrokerParts {
    pub log: Arc<LogManager>,
    pub clock: Arc<dyn Clock>,
    pub settings: BrokerSettings,
    /// Seeds the member-id suffixes the group coordinator hands out. Draw it from real
    /// randomness in production: a restarted coordinator with the same seed would hand out the
    /// member ids of its previous incarnation again, and a client still holding one would be
    /// taken for a member it is not. Tests may fix it.
    pub member_id_seed: u64,
}

/// One Kafka broker front end over a [`LogManager`].
#[derive(Debug)]
pub struct Broker {
    pub(crate) log: Arc<LogManager>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) settings: BrokerSettings,
    pub(crate) groups: Arc<GroupCoordinator>,
    /// The transaction coordinator, sharded like the groups over `__transaction_state`.
    pub(crate) txn: Arc<TxnCoordinator>,
    /// Cluster mode: membership, ownership and the cluster view. None for a broker alone on
    /// its storage, which leads every partition.
    pub(crate) cluster: Option<Arc<ClusterNode>>,
    pub(crate) limits: Limits,
    /// Incremental fetch sessions (KIP-227), in this broker's memory only.
    pub(crate) fetch_sessions: FetchSessions,
    /// The SCRAM users in shared storage; None until [`Broker::with_users`] (a broker
    /// without them refuses every SASL login and the user APIs).
    pub(crate) users: Option<Arc<UserStore>>,
    pub(crate) auth_stats: AuthStats,
    /// Requests per API, bytes per topic, connections: for the metrics endpoint.
    pub(crate) traffic: Traffic,
    /// The ACLs, when `settings.authorizer` is set ([`Broker::with_acls`]); None lets every
    /// request through, as a Kafka broker without an authorizer does.
    pub(crate) acls: Option<Arc<AclStore>>,
    /// Client quotas and this broker's usage of them.
    pub(crate) quotas: Arc<Quotas>,
    /// Where quotas are stored; None until [`Broker::with_quotas`] (such a broker enforces
    /// none and refuses AlterClientQuotas).
    pub(crate) quota_store: Option<Arc<QuotaStore>>,
    /// Checks OAUTHBEARER tokens; None: the mechanism is refused.
    pub(crate) oauth: Option<Arc<crate::security::oauth::TokenValidator>>,
    /// Share groups (KIP-932): membership, share partitions, share sessions.
    pub(crate) share: Arc<crate::share::ShareState>,
    /// Seeds share member ids (not the group coordinator's seed: independent streams).
    share_seed: u64,
}

fn share_state(
    log: &Arc<LogManager>,
    clock: &Arc<dyn Clock>,
    settings: &BrokerSettings,
    seed: u64,
    store: Option<Arc<dyn ObjectStore>>,
) -> crate::share::ShareState {
    crate::share::ShareState::new(
        Arc::clone(log),
        Arc::clone(clock),
        settings.share_settings(),
        seed,
        store,
    )
}

fn fetch_sessions(parts: &BrokerParts) -> FetchSessions {
    // Not the member-id seed itself: the two streams of numbers stay independent.
    let seed = parts.member_id_seed.rotate_left(29) ^ 0x2545_f491_4f6c_dd1d;
    FetchSessions::new(parts.settings.fetch_session_limits(), seed)
}

/// Starts the transaction coordinator (creating `__transaction_state` on first start); a
/// broker alone on its storage hosts every shard at once.
async fn start_txn(parts: &BrokerParts, load_all: bool) -> Result<Arc<TxnCoordinator>, LogError> {
    TxnCoordinator::start(
        Arc::clone(&parts.log),
        Arc::clone(&parts.clock),
        parts.settings.txn_config(),
        parts.settings.txn_shards,
        parts.settings.offsets_commit_timeout,
        load_all,
    )
    .await
}

/// Pause after a failed accept (typically EMFILE): retrying at once would spin.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

impl Broker {
    /// Builds the broker and starts its group coordinator, which creates the internal
    /// `__consumer_offsets` topic on first start and otherwise replays it (so committed
    /// offsets and group membership survive restarts). Fails if that topic cannot be created
    /// or read.
    pub async fn open(parts: BrokerParts) -> Result<Self, LogError> {
        let groups = GroupCoordinator::start(
            Arc::clone(&parts.log),
            Arc::clone(&parts.clock),
            parts.settings.group_config(),
            parts.settings.group_shards,
            parts.member_id_seed,
            true,
        )
        .await?;
        let share_seed = parts.member_id_seed.rotate_left(43) ^ 0x9e37_79b9_7f4a_7c15;
        let txn = start_txn(&parts, true).await?;
        Ok(Self {
            fetch_sessions: fetch_sessions(&parts),
            share: Arc::new(share_state(
                &parts.log,
                &parts.clock,
                &parts.settings,
                share_seed,
                None,
            )),
            share_seed,
            quotas: Arc::new(Quotas::new(
                parts.settings.quota_settings(),
                Arc::clone(&parts.clock),
            )),
            limits: Limits::new(&parts.settings, Arc::clone(&parts.clock)),
            log: parts.log,
            clock: parts.clock,
            settings: parts.settings,
            groups,
            txn,
            cluster: None,
            users: None,
            auth_stats: AuthStats::default(),
            traffic: Traffic::default(),
            acls: None,
            quota_store: None,
            oauth: None,
        })
    }

    /// Builds a broker in cluster mode (`settings.cluster` must be set, the log opened with
    /// `Ownership::Managed`): starts the group coordinator without any shard, then joins the
    /// cluster on `store` under `settings.node_id`; partitions and coordinator shards arrive
    /// as ownership is acquired.
    pub async fn open_clustered(
        parts: BrokerParts,
        store: Arc<dyn ObjectStore>,
    ) -> Result<Self, ClusterStartError> {
        let cluster_settings = parts.settings.cluster.unwrap_or_default();
        let joined = ClusterNode::join(
            Arc::clone(&store),
            Arc::clone(&parts.clock),
            &cluster_settings,
            Some(parts.settings.node_id),
            (
                parts.settings.advertised_host.clone(),
                parts.settings.advertised_port,
            ),
            // Not the member-id seed itself: the two streams of numbers stay independent.
            parts.member_id_seed.rotate_left(17) ^ 0x5851_f42d_4c95_7f2d,
        )
        .await?;
        Self::open_joined(parts, store, joined).await
    }

    /// [`open_clustered`](Self::open_clustered) for a broker that has already joined (the
    /// server joins first when the cluster allocates its id, since the log is opened under
    /// it). `settings.node_id` must be the joined id.
    pub async fn open_joined(
        parts: BrokerParts,
        store: Arc<dyn ObjectStore>,
        joined: Joined,
    ) -> Result<Self, ClusterStartError> {
        let cluster_settings = parts.settings.cluster.unwrap_or_default();
        let groups = GroupCoordinator::start(
            Arc::clone(&parts.log),
            Arc::clone(&parts.clock),
            parts.settings.group_config(),
            parts.settings.group_shards,
            parts.member_id_seed,
            false,
        )
        .await?;
        let txn = start_txn(&parts, false).await?;
        let node = ClusterNode::start_joined(
            store,
            Arc::clone(&parts.clock),
            Arc::clone(&parts.log),
            Arc::clone(&groups),
            Arc::clone(&txn),
            joined,
            cluster_settings,
        )
        .await?;
        let share_seed = parts.member_id_seed.rotate_left(43) ^ 0x9e37_79b9_7f4a_7c15;
        Ok(Self {
            fetch_sessions: fetch_sessions(&parts),
            share: Arc::new(share_state(
                &parts.log,
                &parts.clock,
                &parts.settings,
                share_seed,
                None,
            )),
            share_seed,
            quotas: Arc::new(Quotas::new(
                parts.settings.quota_settings(),
                Arc::clone(&parts.clock),
            )),
            limits: Limits::new(&parts.settings, Arc::clone(&parts.clock)),
            log: parts.log,
            clock: parts.clock,
            settings: parts.settings,
            groups,
            txn,
            cluster: Some(node),
            users: None,
            auth_stats: AuthStats::default(),
            traffic: Traffic::default(),
            acls: None,
            quota_store: None,
            oauth: None,
        })
    }

    /// Checks OAUTHBEARER tokens with `validator` (without one, OAUTHBEARER is refused).
    pub fn with_oauth(mut self, validator: crate::security::oauth::TokenValidator) -> Self {
        self.oauth = Some(Arc::new(validator));
        self
    }

    /// Keeps SCRAM users in `store` (the cluster's storage), cached per the settings.
    /// Keeps share-partition state in `store` (without it, share state lives in memory only
    /// and dies with the broker).
    /// Per-group configs live there too; every broker polls their change marker each
    /// `quota_refresh_interval`, the refresh of the other dynamic settings clients make. Must
    /// be called within the tokio runtime.
    pub fn with_share_state(mut self, store: Arc<dyn ObjectStore>) -> Self {
        self.share = Arc::new(share_state(
            &self.log,
            &self.clock,
            &self.settings,
            self.share_seed,
            Some(store),
        ));
        tokio::spawn(crate::group_configs::GroupConfigs::watch(
            Arc::downgrade(&self.share.configs),
            Arc::clone(&self.clock),
            self.settings.quota_refresh_interval,
        ));
        self
    }

    /// Share-group state, for the metrics endpoint.
    pub fn share_state(&self) -> &Arc<crate::share::ShareState> {
        &self.share
    }

    pub fn with_users(mut self, store: Arc<dyn ObjectStore>) -> Self {
        self.users = Some(Arc::new(UserStore::new(
            store,
            Arc::clone(&self.clock),
            self.settings.sasl_user_cache_ttl,
            self.settings.sasl_user_cache_entries,
        )));
        self
    }

    /// Enforces the ACLs kept in `store` (the cluster's storage) if `settings.authorizer` is
    /// set: reads them once (a broker that cannot read them does not start: it would refuse
    /// everything), then polls for changes every `acl_refresh_interval`.
    pub async fn with_acls(mut self, store: Arc<dyn ObjectStore>) -> Result<Self, SecurityError> {
        let Some(config) = self.settings.authorizer.clone() else {
            return Ok(self);
        };
        let acls = Arc::new(AclStore::new(
            store,
            Arc::clone(&self.clock),
            config,
            self.settings.acl_refresh_interval,
        ));
        acls.reload().await?;
        acls.spawn_refresher();
        self.acls = Some(acls);
        Ok(self)
    }

    /// The ACL store, or SECURITY_DISABLED without an authorizer.
    pub(crate) fn acls(&self) -> Result<&AclStore, SecurityError> {
        self.acls
            .as_deref()
            .ok_or(SecurityError::AuthorizerDisabled)
    }

    /// Checks refused by the authorizer so far, by (resource type, operation).
    pub fn authorization_denied(&self) -> Vec<(&'static str, &'static str, u64)> {
        self.acls
            .as_ref()
            .map(|a| a.denied_snapshot())
            .unwrap_or_default()
    }

    /// Enforces the client quotas kept in `store` (the cluster's storage), watching them for
    /// changes made through any broker. Must be called within the tokio runtime.
    pub fn with_quotas(mut self, store: Arc<dyn ObjectStore>) -> Self {
        let quota_store = Arc::new(QuotaStore::new(store));
        tokio::spawn(
            Arc::clone(&quota_store).watch(Arc::downgrade(&self.quotas), Arc::clone(&self.clock)),
        );
        self.quota_store = Some(quota_store);
        self
    }

    /// Throttles handed out so far, for the metrics endpoint.
    pub fn throttle_stats(&self) -> &ThrottleStats {
        &self.quotas.stats
    }

    /// The user store, or why there is none.
    pub(crate) fn users(&self) -> Result<&UserStore, SecurityError> {
        self.users
            .as_deref()
            .ok_or(SecurityError::IllegalState("this broker has no user store"))
    }

    /// Authentication outcomes so far, for the metrics endpoint.
    pub fn auth_stats(&self) -> &AuthStats {
        &self.auth_stats
    }

    /// Requests, topic traffic and connections so far, for the metrics endpoint.
    pub fn traffic(&self) -> &Traffic {
        &self.traffic
    }

    /// The fetch session cache's counts, for the metrics endpoint.
    /// Group coordinator shard loads and the records they replayed.
    pub fn group_load_stats(&self) -> crate::coordinator::GroupLoadSnapshot {
        self.groups.stats.snapshot()
    }

    /// Transactions this broker coordinated: ended by result, and open now.
    pub fn txn_stats(&self) -> crate::txn_coordinator::TxnStatsSnapshot {
        self.txn.stats.snapshot()
    }

    pub fn fetch_session_stats(&self) -> FetchSessionStats {
        self.fetch_sessions.stats()
    }

    /// The cluster membership, in cluster mode.
    pub fn cluster(&self) -> Option<&Arc<ClusterNode>> {
        self.cluster.as_ref()
    }

    pub fn settings(&self) -> &BrokerSettings {
        &self.settings
    }

    pub fn log(&self) -> &Arc<LogManager> {
        &self.log
    }

    /// Serves Kafka clients on one PLAINTEXT `listener` advertising the settings' address.
    pub async fn serve(self: Arc<Self>, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        let info = Listener::plaintext(
            self.settings.advertised_host.clone(),
            self.settings.advertised_port,
        );
        self.serve_listeners(vec![(listener, info)], shutdown).await;
    }

    /// Serves Kafka clients on every listener until `shutdown` completes, then stops
    /// accepting, lets every connection finish the requests it has already read (long-poll
    /// fetches return early), closes them and returns. Connections still busy after
    /// [`BrokerSettings::shutdown_grace`] are abandoned (logged). The log itself is not shut
    /// down here: the caller does that once this returns. `max_connections` and
    /// `max_connections_per_ip` count the connections of all listeners together.
    pub async fn serve_listeners(
        self: Arc<Self>,
        listeners: Vec<(TcpListener, Listener)>,
        shutdown: impl Future<Output = ()>,
    ) {
        // Markers of transactions coordinated here go to partition owners on the inter-broker
        // listener (see txn_markers.rs for which listeners can be).
        let infos: Vec<&Listener> = listeners.iter().map(|(_, info)| info).collect();
        match crate::txn_markers::inter_broker_listener(&self.settings, &infos) {
            Some(info) => {
                let own = (info.advertised_host.clone(), info.advertised_port);
                let security =
                    crate::txn_markers::inter_broker_security(&self.settings, info.protocol);
                self.txn.set_default_marker_writer(Arc::new(
                    crate::txn_markers::BrokerMarkers::new(
                        Arc::downgrade(&self),
                        info.name.clone(),
                        own,
                        security,
                    ),
                ));
            }
            None => warn!(
                "no inter-broker listener (a PLAINTEXT one, SASL_PLAINTEXT with \
                 inter_broker_sasl_mechanism, SSL with ssl_certificate, or SASL_SSL with both): \
                 transactions are refused, since brokers could not send each other \
                 transaction markers"
            ),
        }
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        // Every connection task holds a clone of `done_tx`; when all are dropped, `recv` on
        // `done_rx` returns None: the tokio way of knowing every handler has finished.
        let (done_tx, mut done_rx) = mpsc::channel::<()>(1);
        let slots = Arc::new(Semaphore::new(self.settings.max_connections.max(1)));
        let accepting: Vec<_> = listeners
            .into_iter()
            .map(|(listener, info)| {
                tokio::spawn(Arc::clone(&self).accept_loop(
                    listener,
                    Arc::new(info),
                    Arc::clone(&slots),
                    shutdown_rx.clone(),
                    done_tx.clone(),
                ))
            })
            .collect();
        shutdown.await;
        let _ = shutdown_tx.send(true);
        for task in accepting {
            let _ = task.await;
        }
        info!("stopped accepting connections; finishing in-flight requests");
        drop(done_tx);
        let grace = self.settings.shutdown_grace;
        if strata_core::timeout(self.clock.as_ref(), grace, done_rx.recv())
            .await
            .is_err()
        {
            warn!(
                grace = ?self.settings.shutdown_grace,
                "connections still busy after the shutdown grace period; abandoning them"
            );
        }
    }

    /// Accepts connections on one listener until shutdown starts.
    async fn accept_loop(
        self: Arc<Self>,
        listener: TcpListener,
        info: Arc<Listener>,
        slots: Arc<Semaphore>,
        shutdown_rx: watch::Receiver<bool>,
        done_tx: mpsc::Sender<()>,
    ) {
        let mut stopping = shutdown_rx.clone();
        let shutdown = async move {
            let _ = stopping.wait_for(|stop| *stop).await;
        };
        tokio::pin!(shutdown);
        loop {
            // Take a slot before accepting: at the limit, new connections wait in the backlog.
            let permit = tokio::select! {
                _ = &mut shutdown => break,
                permit = Arc::clone(&slots).acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => break, // the semaphore is never closed; treat as shutdown
                },
            };
            let accepted = tokio::select! {
                _ = &mut shutdown => break,
                accepted = listener.accept() => accepted,
            };
            let (stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    warn!(error = %e, "accept failed");
                    tokio::select! {
                        _ = &mut shutdown => break,
                        _ = self.clock.sleep(ACCEPT_ERROR_BACKOFF) => continue,
                    }
                }
            };
            // Closed at once, as Kafka does: waiting would let one address hold accept slots.
            let Some(ip_slot) = self.limits.per_ip.admit(peer.ip()) else {
                debug!(%peer, limit = self.settings.max_connections_per_ip,
                    "too many connections from this address; closing the new one");
                drop(stream);
                continue;
            };
            // Kafka requests are small and latency-bound: never wait to coalesce segments.
            if let Err(e) = stream.set_nodelay(true) {
                debug!(%peer, error = %e, "could not set TCP_NODELAY");
            }
            let accepted_at = self.clock.monotonic();
            let mut connection = Connection::new(
                Arc::clone(&self),
                peer,
                shutdown_rx.clone(),
                Arc::clone(&info),
                accepted_at,
            );
            let done = done_tx.clone();
            let broker = Arc::clone(&self);
            let tls = info.tls.clone();
            let uses_sasl = info.protocol.uses_sasl();
            broker.traffic.connection_opened();
            tokio::spawn(async move {
                match tls {
                    None => {
                        let (reader, writer) = stream.into_split();
                        connection.run(reader, writer).await;
                    }
                    Some(context) => {
                        // The handshake counts against the authentication deadline: a
                        // client that never finishes one holds its slot only that long.
                        let limit = broker.settings.authentication_timeout;
                        match strata_core::timeout(
                            broker.clock.as_ref(),
                            limit,
                            context.acceptor().accept(stream),
                        )
                        .await
                        {
                            Ok(Ok(tls)) => {
                                let certificates = tls.get_ref().1.peer_certificates();
                                // On SASL_SSL the SASL login names the principal, as in
                                // Kafka: the certificate's subject is not mapped.
                                let principal = if uses_sasl {
                                    Some(Principal::anonymous())
                                } else {
                                    context.principal(certificates)
                                };
                                match principal {
                                    Some(principal) => {
                                        if certificates.is_some() {
                                            broker.auth_stats.record("TLS", "success");
                                        }
                                        connection.set_tls_principal(principal);
                                        let (reader, writer) = tokio::io::split(tls);
                                        connection.run(reader, writer).await;
                                    }
                                    None => {
                                        broker.auth_stats.record("TLS", "principal_mapping");
                                        warn!(%peer, "no ssl_principal_mapping_rules rule matches the client certificate's subject; closing");
                                    }
                                }
                            }
                            Ok(Err(e)) => {
                                broker.auth_stats.record("TLS", "tls_handshake");
                                debug!(%peer, error = %e, "TLS handshake failed; closing");
                            }
                            Err(_) => {
                                broker.auth_stats.record("TLS", "timeout");
                                debug!(%peer, "TLS handshake not done in time; closing");
                            }
                        }
                    }
                }
                broker.traffic.connection_closed();
                drop(ip_slot);
                drop(permit);
                drop(done);
            });
        }
        drop(listener);
    }
}

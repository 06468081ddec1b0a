//! A small Kafka client for the operator commands (`strata topic`, `group`, `produce`,
//! `consume`) and for the one request brokers send each other (the transaction
//! coordinator's WriteTxnMarkers): one request at a time over a tokio `TcpStream`, encoded
//! with the `kafka-protocol` codec the broker itself uses.
//!
//! Why not rdkafka: it links librdkafka (a C build the binary does not need otherwise) and
//! its admin API has no OffsetFetch-by-partition or "commit for an empty group" without a
//! consumer instance; the commands need only about fifteen request types, each sent once.
//! A crate of its own since the broker became its second user; it depends on nothing of
//! Strata's but the clock (and the wire codec).
//!
//! Every request names a fixed version that both Strata and Kafka 4.x accept; `ApiVersions`
//! on connect checks the broker supports it, so an old broker gets a clear refusal instead of
//! a decoding error.

// Tests may use real time (see clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiVersionsRequest, ApiVersionsResponse, DescribeClusterRequest, FindCoordinatorRequest,
    MetadataRequest, MetadataResponse, RequestHeader, ResponseHeader, SaslAuthenticateRequest,
    SaslHandshakeRequest, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use strata_core::Clock;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

mod sasl;
mod tls;
pub use sasl::{SaslCredentials, SaslMechanism};
pub use tls::{Tls, TlsFiles};

/// How connections secure themselves: TLS (SSL and SASL_SSL listeners) and a SASL login
/// (SASL_PLAINTEXT and SASL_SSL), each when given — Kafka's `security.protocol` in two parts.
#[derive(Debug, Clone, Default)]
pub struct Security {
    pub tls: Option<Tls>,
    pub sasl: Option<SaslCredentials>,
}

/// A connection's byte stream: TCP, or TLS over TCP.
trait ByteStream: AsyncRead + AsyncWrite + Unpin + Send + Sync {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + Sync> ByteStream for T {}

/// The largest response frame accepted: a Fetch answers at most the `max_bytes` asked for,
/// every other answer here is metadata, so anything larger is a framing error.
pub const MAX_RESPONSE_BYTES: usize = 256 << 20;

/// What went wrong talking to a broker.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(
        "cannot connect to {addr}: {error} (is a broker listening there? pass its address \
         with --bootstrap-server host:port)"
    )]
    // Not `source`: the message already says it, and anyhow would repeat it.
    Connect { addr: String, error: std::io::Error },
    #[error("no answer from {addr} within {after:?} (is it a Kafka broker?)")]
    Timeout { addr: String, after: Duration },
    #[error("connection to {addr} failed: {error}")]
    Io { addr: String, error: std::io::Error },
    #[error("{addr} sent something that is not a valid Kafka answer: {what}")]
    Protocol { addr: String, what: String },
    #[error("{addr} does not support {api} version {version} (it offers {min}..={max})")]
    Unsupported {
        addr: String,
        api: &'static str,
        version: i16,
        min: i16,
        max: i16,
    },
    #[error("{what}: {error}{}", message.as_deref().map(|m| format!(" ({m})")).unwrap_or_default())]
    Kafka {
        what: String,
        error: ResponseError,
        message: Option<String>,
    },
    #[error("{0}")]
    NotFound(String),
    #[error("logging in to {addr} with {mechanism} failed: {what}")]
    Authentication {
        addr: String,
        mechanism: &'static str,
        what: String,
    },
    #[error("TLS: {0}")]
    Tls(String),
}

pub type ClientResult<T> = Result<T, ClientError>;

/// Turns a response's error code into an error naming what was asked.
pub fn check(
    code: i16,
    what: impl FnOnce() -> String,
    message: Option<&StrBytes>,
) -> ClientResult<()> {
    match ResponseError::try_from_code(code) {
        None => Ok(()),
        Some(error) => Err(ClientError::Kafka {
            what: what(),
            error,
            message: message.map(|m| m.to_string()),
        }),
    }
}

pub fn name(text: &str) -> TopicName {
    TopicName(StrBytes::from_string(text.to_string()))
}

pub fn str_bytes(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

/// One connection to one broker.
pub struct Connection {
    addr: String,
    stream: Box<dyn ByteStream>,
    correlation_id: i32,
    versions: HashMap<i16, (i16, i16)>,
    clock: Arc<dyn Clock>,
    timeout: Duration,
}

impl Connection {
    pub async fn connect(
        addr: &str,
        clock: Arc<dyn Clock>,
        timeout: Duration,
    ) -> ClientResult<Self> {
        Self::connect_as(addr, clock, timeout, &Security::default()).await
    }

    /// [`Connection::connect`] with `security`: a TLS handshake and then a SASL login, each
    /// when given.
    pub async fn connect_as(
        addr: &str,
        clock: Arc<dyn Clock>,
        timeout: Duration,
        security: &Security,
    ) -> ClientResult<Self> {
        let connect = TcpStream::connect(addr);
        let stream = match strata_core::timeout(clock.as_ref(), timeout, connect).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => {
                return Err(ClientError::Connect {
                    addr: addr.to_string(),
                    error,
                })
            }
            Err(_) => {
                return Err(ClientError::Timeout {
                    addr: addr.to_string(),
                    after: timeout,
                })
            }
        };
        let _ = stream.set_nodelay(true);
        let stream: Box<dyn ByteStream> = match &security.tls {
            None => Box::new(stream),
            Some(tls) => {
                let handshake = tls.handshake(addr, stream);
                match strata_core::timeout(clock.as_ref(), timeout, handshake).await {
                    Ok(Ok(stream)) => Box::new(stream),
                    Ok(Err(e)) => return Err(e),
                    Err(_) => {
                        return Err(ClientError::Timeout {
                            addr: addr.to_string(),
                            after: timeout,
                        })
                    }
                }
            }
        };
        let mut connection = Self {
            addr: addr.to_string(),
            stream,
            correlation_id: 0,
            versions: HashMap::new(),
            clock,
            timeout,
        };
        // v0: every broker answers it, whatever it supports.
        let versions: ApiVersionsResponse =
            connection.send(0, &ApiVersionsRequest::default()).await?;
        check(
            versions.error_code,
            || format!("ApiVersions to {addr}"),
            None,
        )?;
        connection.versions = versions
            .api_keys
            .iter()
            .map(|k| (k.api_key, (k.min_version, k.max_version)))
            .collect();
        if let Some(credentials) = &security.sasl {
            connection.login(credentials).await?;
        }
        Ok(connection)
    }

    /// SaslHandshake v1 and SaslAuthenticate v2 until the mechanism is done.
    async fn login(&mut self, credentials: &SaslCredentials) -> ClientResult<()> {
        let mechanism = credentials.mechanism.name();
        let failed = |addr: &str, what: String| ClientError::Authentication {
            addr: addr.to_string(),
            mechanism,
            what,
        };
        let handshake = self
            .request(
                1,
                &SaslHandshakeRequest::default().with_mechanism(str_bytes(mechanism)),
            )
            .await?;
        if handshake.error_code != 0 {
            let offered: Vec<String> = handshake.mechanisms.iter().map(|m| m.to_string()).collect();
            return Err(failed(
                &self.addr,
                format!(
                    "the listener does not offer it (it offers: {})",
                    if offered.is_empty() {
                        "none".to_string()
                    } else {
                        offered.join(", ")
                    }
                ),
            ));
        }
        let mut exchange = sasl::Exchange::start(credentials).map_err(|e| failed(&self.addr, e))?;
        let mut message = exchange.first();
        // SCRAM takes two round trips and PLAIN one; a server asking for more is broken.
        for _ in 0..3 {
            let answer = self
                .request(
                    2,
                    &SaslAuthenticateRequest::default().with_auth_bytes(message.into()),
                )
                .await?;
            if answer.error_code != 0 {
                return Err(failed(
                    &self.addr,
                    answer
                        .error_message
                        .map(|m| m.to_string())
                        .unwrap_or_else(|| format!("error code {}", answer.error_code)),
                ));
            }
            match exchange
                .respond(&answer.auth_bytes)
                .map_err(|e| failed(&self.addr, e))?
            {
                Some(next) => message = next,
                None => return Ok(()),
            }
        }
        Err(failed(&self.addr, "the exchange did not end".into()))
    }

    /// Sends `request` as `version` (checked against what the broker offers) and reads the
    /// answer.
    pub async fn request<R: Request>(
        &mut self,
        version: i16,
        request: &R,
    ) -> ClientResult<R::Response> {
        let (min, max) = self.versions.get(&R::KEY).copied().unwrap_or((0, -1));
        if version < min || version > max {
            return Err(ClientError::Unsupported {
                addr: self.addr.clone(),
                api: api_name(R::KEY),
                version,
                min,
                max,
            });
        }
        self.send(version, request).await
    }

    async fn send<R: Request>(&mut self, version: i16, request: &R) -> ClientResult<R::Response> {
        self.correlation_id = self.correlation_id.wrapping_add(1);
        let correlation_id = self.correlation_id;
        let protocol = |what: String| ClientError::Protocol {
            addr: self.addr.clone(),
            what,
        };
        let mut message = BytesMut::from(&[0u8; 4][..]);
        RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(StrBytes::from_static_str("strata-cli")))
            .encode(&mut message, R::header_version(version))
            .map_err(|e| protocol(format!("encoding a request header: {e}")))?;
        request
            .encode(&mut message, version)
            .map_err(|e| protocol(format!("encoding {} v{version}: {e}", api_name(R::KEY))))?;
        let size = i32::try_from(message.len() - 4)
            .map_err(|_| protocol("request too large".to_string()))?;
        message[..4].copy_from_slice(&size.to_be_bytes());
        let addr = self.addr.clone();
        let exchange = async {
            self.stream.write_all(&message).await?;
            // TLS holds what the socket did not take until flushed (a no-op on plain TCP).
            self.stream.flush().await?;
            let size = self.stream.read_i32().await?;
            let size = usize::try_from(size)
                .ok()
                .filter(|s| *s <= MAX_RESPONSE_BYTES)
                .ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("response frame of {size} bytes"),
                    )
                })?;
            let mut body = vec![0u8; size];
            self.stream.read_exact(&mut body).await?;
            Ok::<_, std::io::Error>(body)
        };
        let body = match strata_core::timeout(self.clock.as_ref(), self.timeout, exchange).await {
            Ok(Ok(body)) => body,
            Ok(Err(error)) => return Err(ClientError::Io { addr, error }),
            Err(_) => {
                return Err(ClientError::Timeout {
                    addr,
                    after: self.timeout,
                })
            }
        };
        let protocol = |what: String| ClientError::Protocol {
            addr: self.addr.clone(),
            what,
        };
        let mut body = bytes::Bytes::from(body);
        let header = ResponseHeader::decode(&mut body, R::Response::header_version(version))
            .map_err(|e| protocol(format!("response header: {e}")))?;
        if header.correlation_id != correlation_id {
            return Err(protocol(format!(
                "correlation id {} for request {correlation_id}",
                header.correlation_id
            )));
        }
        let response = R::Response::decode(&mut body, version)
            .map_err(|e| protocol(format!("{} v{version} response: {e}", api_name(R::KEY))))?;
        if body.has_remaining() {
            return Err(protocol(format!(
                "{} bytes after the {} response",
                body.remaining(),
                api_name(R::KEY)
            )));
        }
        Ok(response)
    }
}

fn api_name(key: i16) -> &'static str {
    kafka_protocol::messages::ApiKey::try_from(key)
        .map(|k| match k {
            kafka_protocol::messages::ApiKey::Produce => "Produce",
            kafka_protocol::messages::ApiKey::Fetch => "Fetch",
            kafka_protocol::messages::ApiKey::ListOffsets => "ListOffsets",
            kafka_protocol::messages::ApiKey::Metadata => "Metadata",
            kafka_protocol::messages::ApiKey::OffsetCommit => "OffsetCommit",
            kafka_protocol::messages::ApiKey::OffsetFetch => "OffsetFetch",
            kafka_protocol::messages::ApiKey::FindCoordinator => "FindCoordinator",
            kafka_protocol::messages::ApiKey::DescribeGroups => "DescribeGroups",
            kafka_protocol::messages::ApiKey::ListGroups => "ListGroups",
            kafka_protocol::messages::ApiKey::CreateTopics => "CreateTopics",
            kafka_protocol::messages::ApiKey::DeleteTopics => "DeleteTopics",
            kafka_protocol::messages::ApiKey::DescribeConfigs => "DescribeConfigs",
            kafka_protocol::messages::ApiKey::CreatePartitions => "CreatePartitions",
            kafka_protocol::messages::ApiKey::DeleteGroups => "DeleteGroups",
            kafka_protocol::messages::ApiKey::IncrementalAlterConfigs => "IncrementalAlterConfigs",
            kafka_protocol::messages::ApiKey::DescribeClientQuotas => "DescribeClientQuotas",
            kafka_protocol::messages::ApiKey::AlterClientQuotas => "AlterClientQuotas",
            kafka_protocol::messages::ApiKey::ConsumerGroupDescribe => "ConsumerGroupDescribe",
            kafka_protocol::messages::ApiKey::ShareGroupDescribe => "ShareGroupDescribe",
            kafka_protocol::messages::ApiKey::SaslHandshake => "SaslHandshake",
            kafka_protocol::messages::ApiKey::SaslAuthenticate => "SaslAuthenticate",
            _ => "a Kafka API",
        })
        .unwrap_or("an unknown API")
}

/// The first wait between attempts at a retriable request, as Kafka's `retry.backoff.ms`.
const RETRY_BACKOFF: Duration = Duration::from_millis(100);
/// The longest wait between attempts, as Kafka's `retry.backoff.max.ms`.
const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Retries what the Kafka protocol calls retriable, as Kafka's own clients and tools do: a
/// partition being handed to another broker answers NOT_LEADER_OR_FOLLOWER for the few
/// milliseconds of the move, a coordinator shard loading answers COORDINATOR_LOAD_IN_PROGRESS.
/// Failing a command on those would make every operator script racy against moves. Attempts
/// stop at the client's request timeout, counted from [`Client::retry`].
pub struct Retry {
    clock: Arc<dyn Clock>,
    deadline: Duration,
    backoff: Duration,
}

impl Retry {
    /// Whether to try again after `error`: it is a Kafka error the protocol calls retriable
    /// and time remains. Waits the backoff first.
    pub async fn again(&mut self, error: &anyhow::Error) -> bool {
        self.again_if(error, ResponseError::is_retriable).await
    }

    /// As [`Retry::again`], for errors `retriable` accepts: a Produce retries only errors
    /// that say nothing was written, so a retry cannot store a record twice.
    pub async fn again_if(
        &mut self,
        error: &anyhow::Error,
        retriable: fn(&ResponseError) -> bool,
    ) -> bool {
        let worth = matches!(
            error.downcast_ref::<ClientError>(),
            Some(ClientError::Kafka { error, .. }) if retriable(error)
        );
        if !worth || self.clock.monotonic().saturating_add(self.backoff) >= self.deadline {
            return false;
        }
        self.clock.sleep(self.backoff).await;
        self.backoff = (self.backoff * 2).min(RETRY_BACKOFF_MAX);
        true
    }
}

/// The error for a partition Metadata shows without a leader: retriable, as in Kafka.
pub fn no_leader(topic: &str, partition: i32) -> ClientError {
    ClientError::Kafka {
        what: format!("{topic}-{partition} has no leader right now"),
        error: ResponseError::LeaderNotAvailable,
        message: None,
    }
}

/// Talks to a cluster: requests go to the bootstrap broker unless they must go to a
/// partition's leader or a group's coordinator, which are looked up and connected to once.
pub struct Client {
    bootstrap: Connection,
    clock: Arc<dyn Clock>,
    timeout: Duration,
    /// The login of every connection, when the listeners require one.
    security: Security,
    /// node id → address, from the last Metadata answer.
    addresses: HashMap<i32, String>,
    nodes: HashMap<i32, Connection>,
}

pub const METADATA_VERSION: i16 = 12;

impl Client {
    pub async fn connect(
        bootstrap: &str,
        clock: Arc<dyn Clock>,
        timeout: Duration,
    ) -> ClientResult<Self> {
        Self::connect_as(bootstrap, clock, timeout, Security::default()).await
    }

    /// [`Client::connect`], every connection secured with `security`.
    pub async fn connect_as(
        bootstrap: &str,
        clock: Arc<dyn Clock>,
        timeout: Duration,
        security: Security,
    ) -> ClientResult<Self> {
        // A comma-separated list, as Kafka's tools take: the first broker that answers.
        let mut last = None;
        let mut connection = None;
        for addr in bootstrap
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
        {
            match Connection::connect_as(addr, Arc::clone(&clock), timeout, &security).await {
                // A refused login or unusable TLS material is the same everywhere: do not try
                // the next broker.
                Err(e @ ClientError::Authentication { .. }) => return Err(e),
                Ok(c) => {
                    connection = Some(c);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let connection = match (connection, last) {
            (Some(c), _) => c,
            (None, Some(e)) => return Err(e),
            (None, None) => {
                return Err(ClientError::NotFound(
                    "--bootstrap-server is empty; give host:port".into(),
                ))
            }
        };
        Ok(Self {
            bootstrap: connection,
            clock,
            timeout,
            security,
            addresses: HashMap::new(),
            nodes: HashMap::new(),
        })
    }

    pub async fn request<R: Request>(
        &mut self,
        version: i16,
        request: &R,
    ) -> ClientResult<R::Response> {
        self.bootstrap.request(version, request).await
    }

    /// A retry budget of one request timeout, starting now.
    pub fn retry(&self) -> Retry {
        Retry {
            clock: Arc::clone(&self.clock),
            deadline: self.clock.monotonic().saturating_add(self.timeout),
            backoff: RETRY_BACKOFF,
        }
    }

    /// Metadata of `topics` (all topics when None); never creates a topic.
    pub async fn metadata(&mut self, topics: Option<&[String]>) -> ClientResult<MetadataResponse> {
        let request = MetadataRequest::default()
            .with_topics(topics.map(|names| {
                names
                    .iter()
                    .map(|n| MetadataRequestTopic::default().with_name(Some(name(n))))
                    .collect()
            }))
            .with_allow_auto_topic_creation(false);
        let response = self.bootstrap.request(METADATA_VERSION, &request).await?;
        for broker in &response.brokers {
            self.addresses
                .insert(broker.node_id.0, format!("{}:{}", broker.host, broker.port));
        }
        Ok(response)
    }

    /// The live brokers' ids, from DescribeCluster, for requests sent to every broker. Not
    /// Metadata's list: a Strata cluster keeps listing a broker that left there for a while
    /// (`departed_broker_listing`), and a request to it would only fail.
    pub async fn live_brokers(&mut self) -> ClientResult<Vec<i32>> {
        let response = self
            .bootstrap
            .request(0, &DescribeClusterRequest::default())
            .await?;
        check(
            response.error_code,
            || "describing the cluster".to_string(),
            response.error_message.as_ref(),
        )?;
        let mut ids = Vec::new();
        for broker in &response.brokers {
            self.addresses.insert(
                broker.broker_id.0,
                format!("{}:{}", broker.host, broker.port),
            );
            ids.push(broker.broker_id.0);
        }
        Ok(ids)
    }

    /// The connection to broker `node` (known from a Metadata answer).
    pub async fn node(&mut self, node: i32) -> ClientResult<&mut Connection> {
        if !self.nodes.contains_key(&node) {
            if !self.addresses.contains_key(&node) {
                self.metadata(Some(&[])).await?;
            }
            let addr = self.addresses.get(&node).cloned().ok_or_else(|| {
                ClientError::NotFound(format!("broker {node} is not in the cluster's metadata"))
            })?;
            let connection = Connection::connect_as(
                &addr,
                Arc::clone(&self.clock),
                self.timeout,
                &self.security,
            )
            .await?;
            self.nodes.insert(node, connection);
        }
        self.nodes
            .get_mut(&node)
            .ok_or_else(|| ClientError::NotFound(format!("broker {node}")))
    }

    /// The coordinator of consumer group `group`.
    pub async fn coordinator(&mut self, group: &str) -> ClientResult<&mut Connection> {
        let request = FindCoordinatorRequest::default()
            .with_key_type(0)
            .with_coordinator_keys(vec![str_bytes(group)]);
        let response = self.bootstrap.request(4, &request).await?;
        let coordinator = response
            .coordinators
            .first()
            .ok_or_else(|| ClientError::Protocol {
                addr: self.bootstrap.addr.clone(),
                what: "FindCoordinator answered no coordinator".into(),
            })?;
        check(
            coordinator.error_code,
            || format!("finding the coordinator of group {group:?}"),
            coordinator.error_message.as_ref(),
        )?;
        let node = coordinator.node_id.0;
        self.addresses
            .insert(node, format!("{}:{}", coordinator.host, coordinator.port));
        self.node(node).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_core::clock::ManualClock;

    /// Runs `attempt` to its end, moving the manual clock 10 ms whenever it waits.
    async fn advancing(
        clock: &ManualClock,
        attempt: impl std::future::Future<Output = bool>,
    ) -> bool {
        tokio::pin!(attempt);
        loop {
            tokio::select! {
                biased;
                answer = &mut attempt => return answer,
                () = tokio::task::yield_now() => clock.advance(Duration::from_millis(10)),
            }
        }
    }

    fn kafka(error: ResponseError) -> anyhow::Error {
        ClientError::Kafka {
            what: "asking".into(),
            error,
            message: None,
        }
        .into()
    }

    #[tokio::test]
    async fn retriable_answers_are_retried_with_doubling_waits_until_the_timeout() {
        let clock = Arc::new(ManualClock::new(0));
        let mut retry = Retry {
            clock: Arc::clone(&clock) as Arc<dyn Clock>,
            deadline: Duration::from_secs(1),
            backoff: RETRY_BACKOFF,
        };
        let moved = kafka(ResponseError::NotLeaderOrFollower);
        let mut waited_until = Vec::new();
        while advancing(&clock, retry.again(&moved)).await {
            waited_until.push(clock.monotonic().as_millis());
        }
        // 100, 200 and 400 ms fit in the second; the next 800 ms wait would not.
        assert_eq!(waited_until, vec![100, 300, 700]);
    }

    #[tokio::test]
    async fn answers_that_retrying_cannot_change_fail_at_once() {
        let clock = Arc::new(ManualClock::new(0));
        let mut retry = Retry {
            clock: Arc::clone(&clock) as Arc<dyn Clock>,
            deadline: Duration::from_secs(30),
            backoff: RETRY_BACKOFF,
        };
        assert!(
            !advancing(
                &clock,
                retry.again(&kafka(ResponseError::TopicAuthorizationFailed))
            )
            .await
        );
        assert!(!advancing(&clock, retry.again(&anyhow::anyhow!("not a Kafka answer"))).await);
        // A Produce timeout is retriable for Kafka but may have stored the records.
        let timed_out = kafka(ResponseError::RequestTimedOut);
        assert!(
            !advancing(
                &clock,
                retry.again_if(&timed_out, |e| matches!(
                    e,
                    ResponseError::NotLeaderOrFollower
                ))
            )
            .await
        );
        assert_eq!(clock.monotonic(), Duration::ZERO, "no attempt waited");
    }
}

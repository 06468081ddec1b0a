//! One connection's SASL state: SaslHandshake then SaslAuthenticate (v0–v2), or after a v0
//! handshake the unframed tokens of old clients, until the connection is authenticated.
//!
//! The connection runs these requests one at a time, in its own loop: a SASL exchange is a
//! conversation whose next step depends on the last, unlike the requests that follow.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, RequestKind, SaslAuthenticateResponse, SaslHandshakeResponse,
};
use kafka_protocol::protocol::{Encodable, HeaderVersion, StrBytes};
use strata_wire::frame::{parse_request_header, RequestApi};
use tracing::{debug, info, warn};

use super::oauth;
use super::scram::{self, Credential, Mechanism, ServerExchange};
use super::users::credential_of;
use super::{failure_reason, Principal, SecurityError};
use crate::api_versions;
use crate::dispatch::Reply;
use crate::errors::code;
use crate::framing::{encode_response, ResponseFrame};
use crate::server::Broker;

/// Kafka's words for a failed login, the same for a wrong password and an unknown user.
const FAILED: &str = "Authentication failed: Invalid username or password";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    Plain,
    Scram(Mechanism),
    OAuthBearer,
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Method::Plain => "PLAIN",
            Method::Scram(m) => m.name(),
            Method::OAuthBearer => "OAUTHBEARER",
        }
    }
}

#[derive(Debug)]
enum State {
    Handshake,
    /// `raw`: the handshake was v0, so tokens come without Kafka headers.
    Authenticate {
        method: Method,
        raw: bool,
    },
    ScramFinal {
        exchange: Box<ServerExchange>,
        raw: bool,
    },
    /// A refused token, answered with RFC 7628's error challenge: the client's `\x01`
    /// (or anything) ends the exchange with the failure.
    OAuthRefused {
        reason: String,
        raw: bool,
    },
    Done,
}

/// What the connection does with a frame that arrives before authentication.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Gate {
    /// ApiVersions: served as usual.
    Dispatch,
    /// Part of the SASL exchange: give it to [`Session::step`].
    Sasl,
    /// Anything else: close the connection, as Kafka does.
    Refuse,
}

/// The SASL side of one connection.
#[derive(Debug)]
pub(crate) struct Session {
    state: State,
    principal: Option<Arc<Principal>>,
    /// The mechanism of the last successful login: a re-authentication must use it.
    method: Option<Method>,
    /// When the session ends (monotonic), with `connections_max_reauth` set: a request
    /// other than a re-authentication after then closes the connection (KIP-368).
    expires_at: Option<std::time::Duration>,
    /// A new exchange on an authenticated connection: requests keep running as the
    /// current principal meanwhile, and the new login must be the same principal.
    reauthenticating: bool,
    /// The session's lifetime as told to the client (SaslAuthenticate v1+); 0: no limit.
    lifetime_ms: i64,
}

impl Session {
    /// A connection on a SASL listener, not yet authenticated.
    pub fn unauthenticated() -> Self {
        Self {
            state: State::Handshake,
            principal: None,
            method: None,
            expires_at: None,
            reauthenticating: false,
            lifetime_ms: 0,
        }
    }

    /// A connection on a listener without SASL: authenticated as `principal` from the start.
    pub fn authenticated(principal: Principal) -> Self {
        Self {
            state: State::Done,
            principal: Some(Arc::new(principal)),
            method: None,
            expires_at: None,
            reauthenticating: false,
            lifetime_ms: 0,
        }
    }

    /// When the session ends, if it does (KIP-368).
    pub fn expires_at(&self) -> Option<std::time::Duration> {
        self.expires_at
    }

    /// Whether `frame` starts a re-authentication (KIP-368): a SaslHandshake on a connection
    /// logged in through SASL while `connections_max_reauth` is set. If so, the session
    /// goes back to waiting for the exchange, keeping its principal until it completes.
    pub fn begin_reauthentication(&mut self, frame: &[u8]) -> bool {
        let handshake = frame.get(..2).map(|k| i16::from_be_bytes([k[0], k[1]]))
            == Some(ApiKey::SaslHandshake as i16);
        if !handshake || !self.is_done() || self.method.is_none() || self.expires_at.is_none() {
            return false;
        }
        self.state = State::Handshake;
        self.reauthenticating = true;
        true
    }

    /// Who the connection acts for, once authenticated.
    pub fn principal(&self) -> Option<&Arc<Principal>> {
        self.principal.as_ref()
    }

    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// Where a frame received before authentication goes.
    pub fn gate(&self, frame: &[u8]) -> Gate {
        if matches!(
            self.state,
            State::Authenticate { raw: true, .. }
                | State::ScramFinal { raw: true, .. }
                | State::OAuthRefused { raw: true, .. }
        ) {
            return Gate::Sasl;
        }
        let key = frame
            .get(..2)
            .map(|k| i16::from_be_bytes([k[0], k[1]]))
            .and_then(|k| ApiKey::try_from(k).ok());
        match key {
            Some(ApiKey::ApiVersions) => Gate::Dispatch,
            Some(ApiKey::SaslHandshake | ApiKey::SaslAuthenticate) => Gate::Sasl,
            // Requests pipelined around a re-authentication act for the principal that
            // is still logged in (its session's end is checked by the connection).
            _ if self.reauthenticating => Gate::Dispatch,
            _ => Gate::Refuse,
        }
    }

    /// Runs one step of the exchange. Returns the reply and whether to close the connection
    /// after it.
    pub async fn step(&mut self, broker: &Broker, frame: Bytes, peer: SocketAddr) -> (Reply, bool) {
        if let State::Authenticate { raw: true, .. }
        | State::ScramFinal { raw: true, .. }
        | State::OAuthRefused { raw: true, .. } = self.state
        {
            return match self.authenticate(broker, &frame, peer).await {
                Ok(token) => (raw_frame(token), false),
                Err(_) => (Reply::Close, true),
            };
        }
        let mut body = frame;
        let header = match parse_request_header(&mut body) {
            Ok(header) => header,
            Err(e) => {
                warn!(%peer, error = %e, "unreadable SASL request header; closing connection");
                return (Reply::Close, true);
            }
        };
        let served = api_versions::supported_versions_of(header.api_key)
            .is_some_and(|range| (range.min..=range.max).contains(&header.api_version));
        if !served || !matches!(header.api, RequestApi::Supported { .. }) {
            warn!(%peer, api_key = header.api_key, version = header.api_version,
                "SASL request version not supported; closing connection");
            return (Reply::Close, true);
        }
        let request = match strata_wire::decode_request(&header, &body) {
            Ok(request) => request,
            Err(e) => {
                warn!(%peer, error = %e, "undecodable SASL request; closing connection");
                broker.auth_stats.record("other", "malformed");
                return (Reply::Close, true);
            }
        };
        let (id, version) = (header.correlation_id, header.api_version);
        match request {
            RequestKind::SaslHandshake(r) => {
                let (response, close) = self.handshake(broker, r.mechanism.as_str(), version);
                (encode(id, version, &response), close)
            }
            RequestKind::SaslAuthenticate(r) => {
                let mut response = SaslAuthenticateResponse::default();
                let close = match self.authenticate(broker, &r.auth_bytes, peer).await {
                    Ok(token) => {
                        response.auth_bytes = token;
                        if version >= 1 && self.is_done() {
                            response.session_lifetime_ms = self.lifetime_ms;
                        }
                        false
                    }
                    Err(e) => {
                        response.error_code = match &e {
                            SecurityError::IllegalState(_) => code::ILLEGAL_SASL_STATE,
                            // A client must not retry a login against a store it cannot
                            // reach by reconnecting in a loop; it sees a failed login.
                            _ => code::SASL_AUTHENTICATION_FAILED,
                        };
                        response.error_message = Some(StrBytes::from_string(match e {
                            SecurityError::BadCredentials => FAILED.to_string(),
                            SecurityError::InvalidToken(_) => format!(
                                "Authentication failed: {}",
                                String::from_utf8_lossy(oauth::ERROR_CHALLENGE)
                            ),
                            SecurityError::Storage(_) | SecurityError::Contended(_) => {
                                "Authentication failed: the user store is unavailable".into()
                            }
                            other => format!("Authentication failed: {other}"),
                        }));
                        true
                    }
                };
                (encode(id, version, &response), close)
            }
            _ => (Reply::Close, true),
        }
    }

    fn handshake(
        &mut self,
        broker: &Broker,
        mechanism: &str,
        version: i16,
    ) -> (SaslHandshakeResponse, bool) {
        let enabled = &broker.settings.sasl_enabled_mechanisms;
        let mut response = SaslHandshakeResponse::default();
        response.mechanisms = enabled
            .iter()
            .map(|m| StrBytes::from_string(m.clone()))
            .collect();
        if !matches!(self.state, State::Handshake) {
            broker.auth_stats.record(mechanism, "illegal_state");
            response.error_code = code::ILLEGAL_SASL_STATE;
            return (response, true);
        }
        let method = if self.reauthenticating && self.method.is_some_and(|m| m.name() != mechanism)
        {
            // Kafka refuses to change mechanisms on a re-authentication.
            None
        } else if enabled.iter().any(|m| m == mechanism) {
            match mechanism {
                "PLAIN" => Some(Method::Plain),
                "OAUTHBEARER" if broker.oauth.is_some() => Some(Method::OAuthBearer),
                other => Mechanism::from_name(other).map(Method::Scram),
            }
        } else {
            None
        };
        match method {
            Some(method) => {
                self.state = State::Authenticate {
                    method,
                    raw: version == 0,
                };
                response.error_code = code::NONE;
                (response, false)
            }
            None => {
                broker.auth_stats.record(mechanism, "unsupported_mechanism");
                response.error_code = code::UNSUPPORTED_SASL_MECHANISM;
                (response, true)
            }
        }
    }

    /// One token of the exchange; the token to answer with, or why the login failed (counted).
    async fn authenticate(
        &mut self,
        broker: &Broker,
        token: &[u8],
        peer: SocketAddr,
    ) -> Result<Bytes, SecurityError> {
        let state = std::mem::replace(&mut self.state, State::Handshake);
        let (method, result) = match state {
            State::Authenticate { method, raw } => {
                let result = match method {
                    Method::Plain => plain(broker, token)
                        .await
                        .map(|user| (user, Bytes::new(), None)),
                    Method::OAuthBearer => match oauth_first(broker, token) {
                        Err(SecurityError::InvalidToken(reason)) => {
                            debug!(%peer, reason, "OAUTHBEARER token refused; sending the error challenge");
                            self.state = State::OAuthRefused { reason, raw };
                            return Ok(Bytes::from_static(oauth::ERROR_CHALLENGE));
                        }
                        other => other.map(|(user, expires)| (user, Bytes::new(), Some(expires))),
                    },
                    Method::Scram(mechanism) => match scram_first(broker, mechanism, token).await {
                        Ok(exchange) => {
                            let reply = Bytes::copy_from_slice(exchange.server_first());
                            self.state = State::ScramFinal {
                                exchange: Box::new(exchange),
                                raw,
                            };
                            return Ok(reply);
                        }
                        Err(e) => Err(e),
                    },
                };
                (method, result)
            }
            State::ScramFinal { exchange, .. } => {
                let result = exchange
                    .finish(token)
                    .map(|last| (exchange.user().to_string(), Bytes::from(last), None));
                (Method::Scram(exchange.mechanism()), result)
            }
            State::OAuthRefused { reason, .. } => (
                Method::OAuthBearer,
                Err(SecurityError::InvalidToken(reason)),
            ),
            State::Handshake | State::Done => {
                broker.auth_stats.record("other", "illegal_state");
                return Err(SecurityError::IllegalState(
                    "SaslAuthenticate before a successful SaslHandshake",
                ));
            }
        };
        let result = result.and_then(|(user, token, expires)| {
            let principal = Principal::user(user);
            // As Kafka: a re-authentication may not change who the connection is.
            match &self.principal {
                Some(current) if self.reauthenticating && **current != principal => {
                    Err(SecurityError::ReauthPrincipalChanged)
                }
                _ => Ok((principal, token, expires)),
            }
        });
        let name = method.name();
        match result {
            Ok((principal, token, expires)) => {
                broker.auth_stats.record(
                    name,
                    if self.reauthenticating {
                        "reauthenticated"
                    } else {
                        "success"
                    },
                );
                debug!(%peer, %principal, mechanism = name, "authenticated");
                self.principal = Some(Arc::new(principal));
                self.method = Some(method);
                self.reauthenticating = false;
                self.state = State::Done;
                self.start_session(broker, expires);
                Ok(token)
            }
            Err(e) => {
                broker.auth_stats.record(name, failure_reason(&e));
                info!(%peer, mechanism = name, error = %e, "authentication failed");
                Err(e)
            }
        }
    }

    /// Starts the session of a login that just succeeded: with `connections_max_reauth`
    /// set, it lasts that long, or until the credential expires if sooner (an OAUTHBEARER
    /// token's `exp`, in milliseconds since the epoch), as Kafka's does. Off (0): forever.
    fn start_session(&mut self, broker: &Broker, credential_expires_ms: Option<i64>) {
        let max = broker.settings.connections_max_reauth;
        if max.is_zero() {
            self.lifetime_ms = 0;
            self.expires_at = None;
            return;
        }
        let mut lifetime_ms = i64::try_from(max.as_millis()).unwrap_or(i64::MAX);
        if let Some(expires_ms) = credential_expires_ms {
            let left = expires_ms.saturating_sub(broker.clock.wall_millis()).max(0);
            lifetime_ms = lifetime_ms.min(left);
        }
        self.lifetime_ms = lifetime_ms;
        let lifetime = std::time::Duration::from_millis(u64::try_from(lifetime_ms).unwrap_or(0));
        self.expires_at = Some(broker.clock.monotonic().saturating_add(lifetime));
    }
}

/// An OAUTHBEARER client first message: the principal its token names and when the token
/// expires, or why not.
fn oauth_first(broker: &Broker, token: &[u8]) -> Result<(String, i64), SecurityError> {
    let validator = broker
        .oauth
        .as_deref()
        .ok_or(SecurityError::IllegalState("OAUTHBEARER is not configured"))?;
    let (authzid, token) = oauth::parse_client_first(token)?;
    let valid = validator
        .validate(&token)
        .map_err(|e| SecurityError::InvalidToken(e.0))?;
    // As Kafka: an authorization id, if given, must be the token's own principal.
    if authzid.is_some_and(|a| a != valid.principal) {
        return Err(SecurityError::InvalidToken(
            "authorization id differs from the token's principal".into(),
        ));
    }
    Ok((valid.principal, valid.expires_at_ms))
}

/// SASL/PLAIN (RFC 4616): `authzid NUL authcid NUL password`, checked against the user's
/// stored SCRAM credential (SHA-512 if it has one, else SHA-256).
async fn plain(broker: &Broker, token: &[u8]) -> Result<String, SecurityError> {
    let bad = |why: &str| SecurityError::BadSaslMessage(why.to_string());
    if token.len() > scram::MAX_MESSAGE_LEN {
        return Err(bad("message too long"));
    }
    let mut parts = token.split(|b| *b == 0);
    let (Some(authzid), Some(user), Some(password), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad(
            "PLAIN needs authzid, user and password separated by NUL",
        ));
    };
    let user = std::str::from_utf8(user).map_err(|_| bad("user name is not UTF-8"))?;
    if user.is_empty() {
        return Err(bad("empty user name"));
    }
    if !authzid.is_empty() && authzid != user.as_bytes() {
        return Err(bad("authorization id differs from the user name"));
    }
    let stored = broker.users()?.lookup(user).await?;
    let credential = stored.as_deref().and_then(|u| {
        credential_of(u, Mechanism::Sha512).or_else(|| credential_of(u, Mechanism::Sha256))
    });
    let known = credential.is_some();
    // An unknown user costs the same PBKDF2 as a known one, so timing does not tell them apart.
    let credential = match credential {
        Some(credential) => credential,
        None => Credential::fake(Mechanism::Sha512, user, &broker.users()?.secret().await?),
    };
    let password = password.to_vec();
    let verified = tokio::task::spawn_blocking(move || credential.verify_password(&password))
        .await
        .unwrap_or(false);
    if verified && known {
        Ok(user.to_string())
    } else {
        Err(SecurityError::BadCredentials)
    }
}

async fn scram_first(
    broker: &Broker,
    mechanism: Mechanism,
    token: &[u8],
) -> Result<ServerExchange, SecurityError> {
    let first = scram::parse_client_first(token)?;
    if first.token_auth {
        return Err(SecurityError::BadSaslMessage(
            "delegation tokens are not supported".into(),
        ));
    }
    let users = broker.users()?;
    let credential = users
        .lookup(&first.user)
        .await?
        .and_then(|u| credential_of(&u, mechanism));
    let fake = Credential::fake(mechanism, &first.user, &users.secret().await?);
    let nonce = super::random_nonce()?;
    Ok(ServerExchange::start(first, credential, fake, &nonce))
}

fn encode<R: Encodable + HeaderVersion>(correlation_id: i32, version: i16, response: &R) -> Reply {
    match encode_response(
        correlation_id,
        R::header_version(version),
        response,
        version,
    ) {
        Ok(frame) => Reply::Frame(frame),
        Err(_) => Reply::Close,
    }
}

/// A token of a v0 exchange: its length, then its bytes, no Kafka header.
fn raw_frame(token: Bytes) -> Reply {
    let mut prefix = BytesMut::with_capacity(4);
    prefix.put_i32(i32::try_from(token.len()).unwrap_or(i32::MAX));
    Reply::Frame(ResponseFrame {
        chunks: vec![prefix.freeze(), token],
    })
}

//! The web console (`console_listen`, off by default): three pages in one — the cluster's
//! brokers and who owns each partition, the topics with their offsets and configs, the groups
//! with their members and lag — and the actions an operator takes from them: create a topic,
//! move a partition, drain or undrain a broker.
//!
//! It owns no data and no logic of its own. Topics and groups come through the Kafka protocol
//! from this broker's own PLAINTEXT listener, with the same requests (and the same typed
//! answers) as `strata topic` and `strata group`; the cluster view and the move and drain
//! actions read and write the coordination objects in storage exactly as `strata cluster
//! status`, `strata partitions move` and `strata broker drain` do. So the console shows what a
//! client would see, and an action from the page is the same storage write as the command.
//!
//! Everything is served by the binary (the page, its script and style are compiled in): no
//! CDN, nothing fetched from elsewhere, so it works on an isolated network. The page polls
//! the JSON API every two seconds.
//!
//! Security: with `metrics_token` set, every `/api/` request needs `Authorization: Bearer
//! <token>` (the page asks for it once and keeps it for the tab); the settings refuse a
//! console beyond loopback without a token. Actions are POSTs of JSON, which a page of another
//! origin cannot send without a CORS preflight this server never grants. At most
//! [`MAX_CONCURRENT_API`] API requests run at once, each with its own short-lived connection
//! to the broker, so a stuck browser tab cannot load the broker.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use strata_cluster::admin;
use strata_core::{BrokerId, Clock};
use strata_storage::ObjectStore;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tracing::{info, warn};

use crate::cli::group::{describe_group_view, group_lag, group_summaries};
use crate::cli::topic::{create_topic, describe_topic, topic_summaries};
use crate::kafka_client::Client;

/// API requests served at once; more wait their turn.
pub const MAX_CONCURRENT_API: usize = 4;
/// Topics and groups the console describes; a cluster with more shows the first ones by
/// name and says how many it left out.
const MAX_LISTED: usize = 200;
/// How long one request to the broker may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const STYLE_CSS: &str = include_str!("assets/style.css");
const FAVICON_SVG: &str = include_str!("assets/favicon.svg");

/// How the console's users are authorised.
#[derive(Debug, Clone)]
pub enum Login {
    /// The metrics token (or nothing, on loopback without one); the console's Kafka client
    /// connects to a PLAINTEXT listener.
    Token(Option<Arc<str>>),
    /// Each request carries a user's name and password (HTTP Basic); the console's Kafka
    /// client logs in as that user with this mechanism on a SASL_PLAINTEXT listener, so the
    /// broker's ACLs decide what the user sees and may do, as for any admin client.
    Sasl(strata_client::SaslMechanism),
}

/// What the console needs of the broker it runs in.
pub struct Console {
    /// host:port of this broker's listener where the console is a Kafka client: PLAINTEXT
    /// with a token login, SASL_PLAINTEXT with a SASL one.
    pub bootstrap: String,
    pub store: Arc<dyn ObjectStore>,
    pub clock: Arc<dyn Clock>,
    pub node_id: i32,
    /// Cluster mode: moves and drains exist.
    pub cluster: bool,
    pub login: Login,
    busy: Semaphore,
}

/// Who a request is from: nobody in particular (token login), or a SASL user.
type Caller = Option<strata_client::SaslCredentials>;

impl Console {
    pub fn new(
        bootstrap: String,
        store: Arc<dyn ObjectStore>,
        clock: Arc<dyn Clock>,
        node_id: i32,
        cluster: bool,
        login: Login,
    ) -> Self {
        Self {
            bootstrap,
            store,
            clock,
            node_id,
            cluster,
            login,
            busy: Semaphore::new(MAX_CONCURRENT_API),
        }
    }

    /// A Kafka client of this broker, logged in as the caller when there is one. A refused
    /// login is the caller's (401), anything else the broker's (502).
    async fn client(&self, caller: &Caller) -> Result<Client, (StatusCode, Json<Value>)> {
        Client::connect_as(
            &self.bootstrap,
            Arc::clone(&self.clock),
            REQUEST_TIMEOUT,
            // Its own broker's PLAINTEXT or SASL_PLAINTEXT listener, on loopback: no TLS.
            strata_client::Security {
                tls: None,
                sasl: caller.clone(),
            },
        )
        .await
        .map_err(|e| match e {
            strata_client::ClientError::Authentication { .. } => (
                StatusCode::UNAUTHORIZED,
                Json(json!({ "error": e.to_string(), "login": "sasl" })),
            ),
            e => failed(StatusCode::BAD_GATEWAY, &e.into()),
        })
    }

    /// With a SASL login, asks the broker whether the caller may do what the storage writes
    /// of a move or a drain do: Kafka's ALTER on the CLUSTER, the right
    /// AlterPartitionReassignments needs. An empty reassignment is checked for exactly that
    /// and changes nothing.
    async fn authorize_cluster_alter(
        &self,
        caller: &Caller,
    ) -> Result<(), (StatusCode, Json<Value>)> {
        if caller.is_none() {
            return Ok(());
        }
        let mut client = self.client(caller).await?;
        let answer = client
            .request(
                0,
                &kafka_protocol::messages::AlterPartitionReassignmentsRequest::default(),
            )
            .await
            .map_err(|e| failed(StatusCode::BAD_GATEWAY, &e.into()))?;
        if answer.error_code != 0 {
            let user = caller.as_ref().map(|c| c.username.as_str()).unwrap_or("");
            return Err((
                StatusCode::FORBIDDEN,
                Json(json!({ "error": format!(
                    "User:{user} may not alter the cluster (moves and drains need ALTER on CLUSTER): error {}",
                    answer.error_code
                ) })),
            ));
        }
        Ok(())
    }
}

/// Serves the console on `listener` until the process ends.
pub async fn serve(listener: TcpListener, console: Arc<Console>) {
    let bound = listener.local_addr().ok();
    let app = Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/style.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE_CSS) }),
        )
        .route(
            "/favicon.svg",
            get(|| async { asset("image/svg+xml", FAVICON_SVG) }),
        )
        .route("/api/overview", get(overview))
        .route("/api/topics", get(topics).post(create))
        .route("/api/groups", get(groups))
        .route("/api/partitions/move", post(move_partition))
        .route("/api/brokers/drain", post(drain))
        .route("/api/brokers/undrain", post(undrain))
        .with_state(console);
    if let Err(e) = axum::serve(listener, app).await {
        warn!(error = %e, address = ?bound, "the console stopped serving");
    }
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            // The page runs only its own script and style: nothing injected can load more.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; frame-ancestors 'none'",
            ),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// An API answer: the value as JSON, or `{"error": "..."}` with a status that says whose fault.
type ApiResult = Result<Json<Value>, (StatusCode, Json<Value>)>;

fn failed(status: StatusCode, error: &anyhow::Error) -> (StatusCode, Json<Value>) {
    (status, Json(json!({ "error": format!("{error:#}") })))
}

/// Checks the bearer token (when one is set) and takes one of the API's slots.
async fn admit<'a>(
    console: &'a Console,
    headers: &HeaderMap,
) -> Result<(tokio::sync::SemaphorePermit<'a>, Caller), (StatusCode, Json<Value>)> {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let caller = match &console.login {
        Login::Token(None) => None,
        Login::Token(Some(token)) => {
            let given = authorization.and_then(|v| v.strip_prefix("Bearer "));
            if !given.is_some_and(|g| crate::http::same_secret(g.as_bytes(), token.as_bytes())) {
                return Err((
                    StatusCode::UNAUTHORIZED,
                    Json(json!({ "error": "this console needs the broker's metrics_token", "login": "token" })),
                ));
            }
            None
        }
        Login::Sasl(mechanism) => Some(basic_credentials(authorization, *mechanism).ok_or_else(|| {
            (
                StatusCode::UNAUTHORIZED,
                Json(json!({ "error": "this console needs a user name and password", "login": "sasl" })),
            )
        })?),
    };
    let slot = console.busy.acquire().await.map_err(|_| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "error": "the console is shutting down" })),
        )
    })?;
    Ok((slot, caller))
}

/// `Authorization: Basic base64(user:password)` as SASL credentials.
fn basic_credentials(
    authorization: Option<&str>,
    mechanism: strata_client::SaslMechanism,
) -> Option<strata_client::SaslCredentials> {
    use base64::Engine;
    let encoded = authorization?.strip_prefix("Basic ")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (username, password) = text.split_once(':')?;
    (!username.is_empty()).then(|| strata_client::SaslCredentials {
        mechanism,
        username: username.to_string(),
        password: password.to_string(),
    })
}

async fn overview(State(console): State<Arc<Console>>, headers: HeaderMap) -> ApiResult {
    let (_slot, caller) = admit(&console, &headers).await?;
    let unavailable = |e: anyhow::Error| failed(StatusCode::BAD_GATEWAY, &e);
    let cluster = if console.cluster {
        let mut status = crate::admin::cluster_status(&console.store)
            .await
            .map_err(unavailable)?;
        if caller.is_some() {
            // The owners come from storage, which knows every topic: show a user only the
            // topics the broker's Metadata shows them (DESCRIBE on the topic).
            let mut client = console.client(&caller).await?;
            let visible: std::collections::HashSet<String> = client
                .metadata(None)
                .await
                .map_err(|e| unavailable(e.into()))?
                .topics
                .iter()
                .filter_map(|t| t.name.as_ref().map(|n| n.to_string()))
                .collect();
            status
                .partitions
                .retain(|p| p.topic.as_ref().is_some_and(|t| visible.contains(t)));
        }
        Some(status)
    } else {
        None
    };
    Ok(Json(json!({
        "node_id": console.node_id,
        "mode": if console.cluster { "cluster" } else { "standalone" },
        "version": env!("CARGO_PKG_VERSION"),
        "cluster": cluster,
    })))
}

async fn topics(State(console): State<Arc<Console>>, headers: HeaderMap) -> ApiResult {
    let (_slot, caller) = admit(&console, &headers).await?;
    let unavailable = |e: anyhow::Error| failed(StatusCode::BAD_GATEWAY, &e);
    let mut client = console.client(&caller).await?;
    let all = topic_summaries(&mut client, false)
        .await
        .map_err(unavailable)?;
    let mut described = Vec::new();
    for topic in all.iter().take(MAX_LISTED) {
        match describe_topic(&mut client, &topic.name).await {
            Ok(d) => described.push(json!(d)),
            // Deleted between the listing and the describe, or moving: show what is known.
            Err(e) => described.push(json!({"name": topic.name, "error": format!("{e:#}")})),
        }
    }
    // Sizes are best effort: a broker that does not answer leaves its partitions unsized.
    let sizes = topic_sizes(&mut client).await.unwrap_or_default();
    for topic in &mut described {
        let size = topic["name"].as_str().and_then(|n| sizes.get(n)).copied();
        topic["size_bytes"] = json!(size);
    }
    Ok(Json(json!({
        "topics": described,
        "omitted": all.len().saturating_sub(MAX_LISTED),
    })))
}

/// Bytes stored per topic: DescribeLogDirs to every broker (each reports the partitions it
/// serves), summed.
async fn topic_sizes(
    client: &mut Client,
) -> anyhow::Result<std::collections::HashMap<String, i64>> {
    let mut sizes = std::collections::HashMap::new();
    // The live brokers: Metadata also lists brokers that left a moment ago.
    for broker in client.live_brokers().await? {
        let mut request = kafka_protocol::messages::DescribeLogDirsRequest::default();
        request.topics = None;
        let response = client.node(broker).await?.request(2, &request).await?;
        for dir in &response.results {
            for topic in &dir.topics {
                let total: i64 = topic.partitions.iter().map(|p| p.partition_size).sum();
                *sizes.entry(topic.name.to_string()).or_insert(0) += total;
            }
        }
    }
    Ok(sizes)
}

async fn groups(State(console): State<Arc<Console>>, headers: HeaderMap) -> ApiResult {
    let (_slot, caller) = admit(&console, &headers).await?;
    let unavailable = |e: anyhow::Error| failed(StatusCode::BAD_GATEWAY, &e);
    let mut client = console.client(&caller).await?;
    let all = group_summaries(&mut client).await.map_err(unavailable)?;
    let mut groups = Vec::new();
    for summary in all.iter().take(MAX_LISTED) {
        let description = describe_group_view(&mut client, &summary.group).await;
        let lag = group_lag(&mut client, &summary.group).await;
        groups.push(json!({
            "group": summary.group,
            "type": summary.kind,
            "state": summary.state,
            "members": description.as_ref().ok().and_then(|d| d.as_ref().map(|d| &d.members)),
            "lag": lag.as_ref().ok(),
            "error": description.err().or(lag.err()).map(|e| format!("{e:#}")),
        }));
    }
    Ok(Json(json!({
        "groups": groups,
        "omitted": all.len().saturating_sub(MAX_LISTED),
    })))
}

#[derive(Debug, Deserialize)]
struct CreateTopic {
    name: String,
    partitions: Option<i32>,
    replication_factor: Option<i16>,
    #[serde(default)]
    configs: std::collections::BTreeMap<String, String>,
}

async fn create(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Json(request): Json<CreateTopic>,
) -> ApiResult {
    let (_slot, caller) = admit(&console, &headers).await?;
    let mut client = console.client(&caller).await?;
    let configs: Vec<(String, String)> = request.configs.into_iter().collect();
    let created = create_topic(
        &mut client,
        request.name.trim(),
        request.partitions,
        request.replication_factor,
        &configs,
    )
    .await
    .map_err(|e| failed(StatusCode::BAD_REQUEST, &e))?;
    info!(topic = %created.name, partitions = created.partitions, "console: created a topic");
    Ok(Json(json!(created)))
}

#[derive(Debug, Deserialize)]
struct MovePartition {
    topic: String,
    partition: i32,
    broker: i32,
}

fn cluster_only(console: &Console) -> Result<(), (StatusCode, Json<Value>)> {
    if console.cluster {
        Ok(())
    } else {
        Err(failed(
            StatusCode::BAD_REQUEST,
            &anyhow::anyhow!(
                "a standalone broker serves every partition itself: nothing to move or drain"
            ),
        ))
    }
}

/// Writes the placement override and answers at once: the page shows the move completing as
/// the owner records change (what `strata partitions move` waits for).
async fn move_partition(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Json(request): Json<MovePartition>,
) -> ApiResult {
    let (_slot, caller) = admit(&console, &headers).await?;
    cluster_only(&console)?;
    console.authorize_cluster_alter(&caller).await?;
    crate::admin::request_move(
        &console.store,
        &request.topic,
        request.partition,
        BrokerId(request.broker),
    )
    .await
    .map_err(|e| failed(StatusCode::BAD_REQUEST, &e))?;
    info!(topic = %request.topic, partition = request.partition, broker = request.broker,
        "console: requested a partition move");
    Ok(Json(json!({"requested": true})))
}

#[derive(Debug, Deserialize)]
struct BrokerAction {
    broker: i32,
}

async fn drain(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Json(request): Json<BrokerAction>,
) -> ApiResult {
    let (_slot, caller) = admit(&console, &headers).await?;
    cluster_only(&console)?;
    console.authorize_cluster_alter(&caller).await?;
    // As `strata broker drain` without --force.
    let incarnation = crate::admin::request_drain(&console.store, BrokerId(request.broker), false)
        .await
        .map_err(|e| failed(StatusCode::BAD_REQUEST, &e))?;
    info!(broker = request.broker, %incarnation, "console: requested a drain");
    Ok(Json(
        json!({"requested": true, "incarnation": incarnation.to_string()}),
    ))
}

async fn undrain(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Json(request): Json<BrokerAction>,
) -> ApiResult {
    let (_slot, caller) = admit(&console, &headers).await?;
    cluster_only(&console)?;
    console.authorize_cluster_alter(&caller).await?;
    let cancelled = admin::cancel_drain(console.store.as_ref(), BrokerId(request.broker))
        .await
        .map_err(|e| failed(StatusCode::BAD_REQUEST, &e.into()))?;
    if !cancelled {
        return Err(failed(
            StatusCode::BAD_REQUEST,
            &anyhow::anyhow!("broker {} has no drain request to cancel", request.broker),
        ));
    }
    Ok(Json(json!({"cancelled": true})))
}

/// The address the console reaches this broker at: the first PLAINTEXT listener, on loopback
/// when it is bound to every interface.
pub fn own_bootstrap(bound: SocketAddr) -> String {
    let ip = if bound.ip().is_unspecified() {
        std::net::IpAddr::from([127, 0, 0, 1])
    } else {
        bound.ip()
    };
    SocketAddr::new(ip, bound.port()).to_string()
}

/// Binds `address` and reports where the console is.
pub async fn bind(address: SocketAddr) -> anyhow::Result<TcpListener> {
    let listener = TcpListener::bind(address)
        .await
        .with_context(|| format!("binding console_listen {address}"))?;
    let bound = listener
        .local_addr()
        .context("reading the bound console address")?;
    info!("console on http://{bound}/");
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use strata_core::SystemClock;
    use strata_storage::MemoryStore;

    use super::*;

    /// One HTTP/1.1 exchange over a plain socket: status line and body.
    fn exchange(addr: SocketAddr, request: String) -> (u16, String) {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        let status = answer
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap();
        let body = answer
            .split("\r\n\r\n")
            .nth(1)
            .unwrap_or_default()
            .to_string();
        (status, body)
    }

    fn get(path: &str, token: Option<&str>) -> String {
        let auth = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n")
    }

    fn post(path: &str, token: &str, body: &str) -> String {
        format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    }

    #[tokio::test]
    async fn the_page_is_open_but_the_api_needs_the_token_and_a_standalone_broker_refuses_moves() {
        let console = Console::new(
            "127.0.0.1:1".into(),
            Arc::new(MemoryStore::new()),
            SystemClock::shared(),
            7,
            false,
            Login::Token(Some(Arc::from("s3cret"))),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve(listener, Arc::new(console)));
        let answers = tokio::task::spawn_blocking(move || {
            vec![
                exchange(addr, get("/", None)),
                exchange(addr, get("/api/overview", None)),
                exchange(addr, get("/api/overview", Some("wrong"))),
                exchange(addr, get("/api/overview", Some("s3cret"))),
                exchange(
                    addr,
                    post(
                        "/api/partitions/move",
                        "s3cret",
                        r#"{"topic":"t","partition":0,"broker":2}"#,
                    ),
                ),
            ]
        })
        .await
        .unwrap();
        server.abort();
        assert_eq!(answers[0].0, 200);
        assert!(answers[0].1.contains("<title>Strata console</title>"));
        assert_eq!(answers[1].0, 401, "{:?}", answers[1]);
        assert_eq!(answers[2].0, 401, "{:?}", answers[2]);
        assert_eq!(answers[3].0, 200, "{:?}", answers[3]);
        let overview: Value = serde_json::from_str(&answers[3].1).unwrap();
        assert_eq!(overview["node_id"], 7);
        assert_eq!(overview["mode"], "standalone");
        assert_eq!(answers[4].0, 400, "{:?}", answers[4]);
        assert!(answers[4].1.contains("standalone"), "{:?}", answers[4]);
    }
}

//! The metrics and health endpoint: just enough HTTP/1.1 for a Prometheus scraper, a load
//! balancer's health check and curl. One request per connection (`Connection: close`), GET and
//! HEAD only, request head capped in size and time. A full HTTP stack would be a large dependency
//! for two read-only pages.
//!
//! - `GET /metrics`: [`crate::metrics`] in the text exposition format 0.0.4.
//! - `GET /health`: 200 `ok` while storage is healthy; 503 with the failure count and last error
//!   once [`UNHEALTHY_AFTER_FAILURES`] storage requests in a row have failed, or as many writes
//!   in a row (`storage unhealthy: writes failing (…; reads ok)`) even while reads succeed.
//!
//! With a token (`metrics_token` / `metrics_token_file`), `/metrics` needs
//! `Authorization: Bearer <token>` (401 otherwise). `/health` never does, so orchestrators'
//! probes keep working unchanged; without the token it says only `ok` or `storage unhealthy`,
//! not the storage's last error (which may name buckets, hosts or paths).

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::debug;

use crate::metrics::{MetricsSource, UNHEALTHY_AFTER_FAILURES};

/// Largest request line plus headers accepted. Scrapers send a few hundred bytes; anything near
/// this is not a scraper.
pub const MAX_REQUEST_HEAD: usize = 8 * 1024;

/// Bounds on the endpoint's connections (`metrics_max_connections`, `metrics_timeout`).
#[derive(Debug, Clone)]
pub struct HttpLimits {
    /// Connections served at once. At the limit, the connection that has waited longest for
    /// its request head is closed to make room for the new one.
    pub max_connections: usize,
    /// A client gets this long to send its request head, and again to take the response.
    pub timeout: Duration,
    /// The bearer token `/metrics` requires (and `/health` for its details); None serves
    /// both to anyone who can connect.
    pub token: Option<Arc<str>>,
}

/// A connection being served.
struct Served {
    task: tokio::task::JoinHandle<()>,
    /// Still waiting for the client's request head (nothing asked yet, nothing lost by closing).
    waiting: Arc<AtomicBool>,
}

/// Serves the endpoint on `listener` until the task is dropped or aborted. Every connection is
/// its own task, so a slow or idle client delays no one else. Idle clients cannot fill the
/// slots either: at the limit, the one that has waited longest without asking anything is
/// closed to make room (a scraper or health check asks at once, so it is never the oldest for
/// long); a newcomer is refused only when every slot is busy answering, which takes at most
/// `timeout` each.
pub async fn serve(listener: TcpListener, source: Arc<MetricsSource>, limits: HttpLimits) {
    let mut open: VecDeque<Served> = VecDeque::new();
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Typically out of file descriptors: pausing lets some close instead of spinning.
                debug!(%error, "metrics endpoint: accept failed");
                source.clock().sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        open.retain(|served| !served.task.is_finished());
        if open.len() >= limits.max_connections.max(1) {
            match open
                .iter()
                .position(|served| served.waiting.load(Ordering::Acquire))
            {
                Some(oldest_idle) => {
                    if let Some(evicted) = open.remove(oldest_idle) {
                        evicted.task.abort();
                        debug!(
                            "metrics endpoint: at the connection limit; closed the longest idle"
                        );
                    }
                }
                None => {
                    debug!(%peer, "metrics endpoint: every connection busy; refusing");
                    drop(stream);
                    continue;
                }
            }
        }
        let source = Arc::clone(&source);
        let waiting = Arc::new(AtomicBool::new(true));
        let flag = Arc::clone(&waiting);
        let timeout = limits.timeout;
        let token = limits.token.clone();
        let task = tokio::spawn(async move {
            if let Err(error) = handle(stream, &source, &flag, timeout, token.as_deref()).await {
                debug!(%peer, %error, "metrics endpoint: connection failed");
            }
        });
        open.push_back(Served { task, waiting });
    }
}

async fn handle(
    mut stream: TcpStream,
    source: &MetricsSource,
    waiting: &AtomicBool,
    timeout: Duration,
    token: Option<&str>,
) -> io::Result<()> {
    let head = match strata_core::timeout(source.clock(), timeout, read_head(&mut stream)).await {
        Ok(head) => head?,
        Err(_) => return Ok(()), // Too slow to ask: drop it without a word.
    };
    waiting.store(false, Ordering::Release);
    let response = match head {
        Head::Closed => return Ok(()),
        Head::TooLarge => Response::text(431, "request header too large\n"),
        Head::Complete(bytes) => respond(&bytes, source, token),
    };
    let bytes = response.to_bytes();
    let write = async {
        stream.write_all(&bytes).await?;
        stream.shutdown().await?;
        // Closing a socket with unread input makes the kernel send a reset, which can destroy
        // the response before the client reads it (here: after a too-large head). Reading to
        // the client's close, or a bounded amount, lets the response arrive.
        let mut sink = [0u8; 1024];
        let mut drained = 0;
        while drained < 64 * 1024 {
            match stream.read(&mut sink).await? {
                0 => break,
                n => drained += n,
            }
        }
        Ok::<(), io::Error>(())
    };
    match strata_core::timeout(source.clock(), timeout, write).await {
        Ok(result) => result,
        Err(_) => Ok(()),
    }
}

/// The request head: request line and headers up to the blank line.
#[derive(Debug, PartialEq, Eq)]
enum Head {
    Complete(Vec<u8>),
    TooLarge,
    /// The client went away before finishing its head.
    Closed,
}

async fn read_head(stream: &mut TcpStream) -> io::Result<Head> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(Head::Closed);
        }
        // Only the new bytes and the three before them can complete the terminator.
        let search_from = head.len().saturating_sub(3);
        head.extend_from_slice(&chunk[..n]);
        if let Some(end) = head_end(&head[search_from..]) {
            let end = search_from + end;
            if end > MAX_REQUEST_HEAD {
                return Ok(Head::TooLarge);
            }
            head.truncate(end);
            return Ok(Head::Complete(head));
        }
        // Three bytes over could still be the start of a terminator right at the limit.
        if head.len() > MAX_REQUEST_HEAD + 3 {
            return Ok(Head::TooLarge);
        }
    }
}

/// Where the blank line ending a head is: CRLF CRLF, or bare LF LF (which RFC 9112 asks servers
/// to tolerate). Returns the length of the head without the terminator.
fn head_end(bytes: &[u8]) -> Option<usize> {
    let crlf = bytes.windows(4).position(|w| w == b"\r\n\r\n");
    let lf = bytes.windows(2).position(|w| w == b"\n\n");
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The answer to a complete request head.
fn respond(head: &[u8], source: &MetricsSource, token: Option<&str>) -> Response {
    let Some(request) = Request::parse(head) else {
        return Response::text(400, "bad request\n");
    };
    let authorized = token.is_none_or(|token| {
        request
            .bearer
            .is_some_and(|given| same_secret(given.as_bytes(), token.as_bytes()))
    });
    if request.method != "GET" && request.method != "HEAD" {
        let mut response = Response::text(405, "only GET and HEAD\n");
        response.allow = true;
        return response;
    }
    let mut response = match request.path {
        "/metrics" if !authorized => {
            let mut response = Response::text(
                401,
                "unauthorized: send Authorization: Bearer <metrics_token>\n",
            );
            response.challenge = true;
            response
        }
        "/health" if !authorized => {
            if source.health().is_healthy(UNHEALTHY_AFTER_FAILURES) {
                Response::text(200, "ok\n")
            } else {
                Response::text(503, "storage unhealthy\n")
            }
        }
        "/metrics" => Response {
            content_type: "text/plain; version=0.0.4; charset=utf-8",
            ..Response::text(200, source.render())
        },
        "/health" => {
            let health = source.health();
            if health.is_healthy(UNHEALTHY_AFTER_FAILURES) {
                Response::text(200, "ok\n")
            } else if health.writes_failing(UNHEALTHY_AFTER_FAILURES) {
                // Reads may still succeed (a full disk): say so, since the broker still serves
                // consumers while refusing producers.
                let error = health
                    .last_write_error
                    .as_deref()
                    .unwrap_or("unknown error");
                let reads = if health.consecutive_failures < UNHEALTHY_AFTER_FAILURES {
                    "reads ok"
                } else {
                    "reads failing too"
                };
                Response::text(
                    503,
                    format!(
                        "storage unhealthy: writes failing ({} consecutive failed writes; {reads}); last write error: {error}\n",
                        health.consecutive_write_failures
                    ),
                )
            } else {
                let error = health.last_error.as_deref().unwrap_or("unknown error");
                Response::text(
                    503,
                    format!(
                        "storage unhealthy: {} consecutive failed requests; last error: {error}\n",
                        health.consecutive_failures
                    ),
                )
            }
        }
        _ => Response::text(404, "not found; try /metrics or /health\n"),
    };
    response.head_only = request.method == "HEAD";
    response
}

#[derive(Debug, PartialEq, Eq)]
struct Request<'a> {
    method: &'a str,
    /// The target without its query string.
    path: &'a str,
    /// The token of an `Authorization: Bearer` header.
    bearer: Option<&'a str>,
}

/// Compares a given token with the configured one in time that depends on their lengths only,
/// so a client cannot find the token byte by byte from how long refusals take.
pub(crate) fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    let mut diff = u8::from(given.len() != expected.len());
    for i in 0..given.len().max(expected.len()) {
        let a = given.get(i).copied().unwrap_or(0);
        let b = expected.get(i).copied().unwrap_or(0);
        diff |= a ^ b;
    }
    std::hint::black_box(diff) == 0
}

impl<'a> Request<'a> {
    /// Reads the request line, `METHOD SP target SP HTTP/1.x`, and the bearer token of an
    /// `Authorization` header (the only header anything here depends on).
    fn parse(head: &'a [u8]) -> Option<Self> {
        let line_end = head.iter().position(|b| *b == b'\n').unwrap_or(head.len());
        let line = std::str::from_utf8(&head[..line_end]).ok()?;
        let line = line.strip_suffix('\r').unwrap_or(line);
        let mut parts = line.split(' ');
        let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || method.is_empty() || !version.starts_with("HTTP/1.") {
            return None;
        }
        let path = target.split('?').next().unwrap_or(target);
        let bearer = head
            .get(line_end + 1..)
            .unwrap_or_default()
            .split(|b| *b == b'\n')
            .filter_map(|line| std::str::from_utf8(line).ok())
            .find_map(|line| {
                let (name, value) = line.split_once(':')?;
                if !name.trim().eq_ignore_ascii_case("authorization") {
                    return None;
                }
                let value = value.trim();
                let (scheme, token) = value.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            });
        Some(Self {
            method,
            path,
            bearer,
        })
    }
}

#[derive(Debug)]
struct Response {
    status: u16,
    content_type: &'static str,
    body: String,
    /// Answer HEAD: the headers of the GET, no body.
    head_only: bool,
    /// Add `Allow:` (405 answers must say what is allowed).
    allow: bool,
    /// Add `WWW-Authenticate: Bearer` (401 answers must say how to authenticate).
    challenge: bool,
}

impl Response {
    fn text(status: u16, body: impl Into<String>) -> Self {
        Self {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.into(),
            head_only: false,
            allow: false,
            challenge: false,
        }
    }

    fn to_bytes(&self) -> Vec<u8> {
        let reason = match self.status {
            200 => "OK",
            400 => "Bad Request",
            401 => "Unauthorized",
            404 => "Not Found",
            405 => "Method Not Allowed",
            431 => "Request Header Fields Too Large",
            503 => "Service Unavailable",
            _ => "",
        };
        let mut out = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\nCache-Control: no-store\r\n",
            self.status,
            self.content_type,
            self.body.len()
        );
        if self.allow {
            out.push_str("Allow: GET, HEAD\r\n");
        }
        if self.challenge {
            out.push_str("WWW-Authenticate: Bearer\r\n");
        }
        out.push_str("\r\n");
        let mut bytes = out.into_bytes();
        if !self.head_only {
            bytes.extend_from_slice(self.body.as_bytes());
        }
        bytes
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use strata_core::{BrokerId, Clock, SystemClock};
    use strata_log::{LogConfig, LogManager};
    use strata_storage::{MemoryStore, OpKind, StackConfig, StorageError, StorageStack};

    use super::*;

    const LIMITS: HttpLimits = HttpLimits {
        max_connections: 64,
        timeout: Duration::from_secs(5),
        token: None,
    };

    #[test]
    fn request_lines_parse() {
        assert_eq!(
            Request::parse(b"GET /metrics?x=1 HTTP/1.1\r\nHost: a"),
            Some(Request {
                method: "GET",
                path: "/metrics",
                bearer: None,
            })
        );
        assert_eq!(
            Request::parse(b"HEAD /health HTTP/1.0"),
            Some(Request {
                method: "HEAD",
                path: "/health",
                bearer: None,
            })
        );
        assert_eq!(Request::parse(b"GET /metrics"), None);
        assert_eq!(Request::parse(b"GET /metrics SPDY/3"), None);
        assert_eq!(Request::parse(b"GET  /metrics HTTP/1.1"), None);
        assert_eq!(Request::parse(b"\xff /metrics HTTP/1.1"), None);
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nA: b\r\n\r\nrest"), Some(20));
        assert_eq!(head_end(b"GET / HTTP/1.1\n\n"), Some(14));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n"), None);
    }

    /// Sends `request` with a blocking std socket (as an outside client would) and returns the
    /// status code, the headers and the body.
    fn fetch(addr: std::net::SocketAddr, request: &[u8]) -> (u16, String, String) {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream.write_all(request).unwrap();
        let mut response = Vec::new();
        // The server closes after one response, so end of stream is end of response.
        stream.read_to_end(&mut response).unwrap();
        let text = String::from_utf8(response).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .unwrap()
            .parse()
            .unwrap();
        if !request.starts_with(b"HEAD") {
            assert_eq!(length, body.len(), "Content-Length matches the body");
        }
        assert!(head.contains("\r\nConnection: close"));
        (status, head.to_string(), body.to_string())
    }

    fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String, String) {
        fetch(
            addr,
            format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes(),
        )
    }

    /// A memory store under the production wrapper stack, and the metrics source over it.
    fn memory_source() -> (Arc<dyn Clock>, StorageStack, Arc<MetricsSource>) {
        let clock: Arc<dyn Clock> = SystemClock::shared();
        let stack = StorageStack::build(
            Arc::new(MemoryStore::new()),
            &StackConfig::default(),
            Arc::clone(&clock),
        );
        let source = Arc::new(MetricsSource::new(
            stack.store.backend_name(),
            Arc::clone(&stack.metrics),
            Arc::clone(&stack.health),
            Arc::clone(&clock),
        ));
        (clock, stack, source)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn endpoint_serves_metrics_and_health_over_tcp() {
        let (clock, stack, source) = memory_source();
        // Opening the log and creating a topic write to storage, so the counters are not zero;
        // the log is attached only later, to see the endpoint without it first.
        let log = LogManager::open(
            Arc::clone(&stack.store),
            Arc::clone(&clock),
            LogConfig::default(),
            BrokerId(0),
        )
        .await
        .unwrap();
        log.create_topic("orders", Some(2), Default::default(), false)
            .await
            .unwrap();

        // Bound before the server task starts, so connecting needs no waiting: until the task
        // accepts, connections sit in the backlog.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve(listener, Arc::clone(&source), LIMITS));

        let (status, head, body) = tokio::task::spawn_blocking(move || get(addr, "/metrics"))
            .await
            .unwrap();
        assert_eq!(status, 200);
        assert!(head.contains("Content-Type: text/plain; version=0.0.4"));
        assert!(
            body.contains("strata_storage_requests_total{backend=\"memory\",op=\"put_create\"} ")
        );
        assert!(!body
            .contains("strata_storage_requests_total{backend=\"memory\",op=\"put_create\"} 0\n"));
        assert!(body.contains(
            "strata_storage_request_seconds_bucket{backend=\"memory\",op=\"get\",le=\"+Inf\"} "
        ));
        assert!(body.contains("strata_storage_requests_per_gb_ingested{backend=\"memory\"} "));
        assert!(!body.contains("strata_log_"), "no log attached yet");

        // With the log attached, its gauges appear.
        source.attach_log(Arc::clone(&log));
        let (status, _, body) = tokio::task::spawn_blocking(move || get(addr, "/metrics"))
            .await
            .unwrap();
        assert_eq!(status, 200);
        assert!(body.contains("strata_log_partitions_served 2\n"), "{body}");
        assert!(body.contains("strata_log_high_watermark{topic=\"orders\",partition=\"1\"} 0\n"));

        let (status, _, body) = tokio::task::spawn_blocking(move || get(addr, "/health"))
            .await
            .unwrap();
        assert_eq!((status, body.as_str()), (200, "ok\n"));

        for _ in 0..UNHEALTHY_AFTER_FAILURES {
            stack
                .health
                .record_failure(&StorageError::Unavailable("bucket on fire".into()));
        }
        let (status, _, body) = tokio::task::spawn_blocking(move || get(addr, "/health"))
            .await
            .unwrap();
        assert_eq!(status, 503);
        assert!(body.contains("3 consecutive"), "{body}");
        assert!(body.contains("bucket on fire"), "{body}");

        // A full disk: reads succeed between the failing writes, which used to reset the run
        // and keep /health at 200.
        for _ in 0..UNHEALTHY_AFTER_FAILURES {
            stack.health.record_op::<()>(
                OpKind::PutCreate,
                &Err(StorageError::Full("no space left on device".into())),
            );
            stack.health.record_op(OpKind::Get, &Ok(()));
        }
        let (status, _, body) = tokio::task::spawn_blocking(move || get(addr, "/health"))
            .await
            .unwrap();
        assert_eq!(status, 503, "{body}");
        assert!(body.contains("writes failing"), "{body}");
        assert!(body.contains("reads ok"), "{body}");
        assert!(body.contains("no space left on device"), "{body}");

        let (status, _, _) = tokio::task::spawn_blocking(move || get(addr, "/nope"))
            .await
            .unwrap();
        assert_eq!(status, 404);
        let (status, head, _) = tokio::task::spawn_blocking(move || {
            fetch(addr, b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
        })
        .await
        .unwrap();
        assert_eq!(status, 405);
        assert!(head.contains("Allow: GET, HEAD"));
        let (status, _, body) =
            tokio::task::spawn_blocking(move || fetch(addr, b"HEAD /health HTTP/1.1\r\n\r\n"))
                .await
                .unwrap();
        assert_eq!((status, body.as_str()), (503, ""));
        let (status, _, _) = tokio::task::spawn_blocking(move || {
            let mut request = b"GET /metrics HTTP/1.1\r\nX-Padding: ".to_vec();
            request.extend(vec![b'a'; MAX_REQUEST_HEAD + 100]);
            request.extend_from_slice(b"\r\n\r\n");
            fetch(addr, &request)
        })
        .await
        .unwrap();
        assert_eq!(status, 431);

        server.abort();
        log.shutdown().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_connections_do_not_delay_health() {
        let (_, _, source) = memory_source();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // Idle clients would be dropped after an hour: only making room can serve /health.
        let limits = HttpLimits {
            max_connections: 8,
            timeout: Duration::from_secs(3600),
            token: None,
        };
        let server = tokio::spawn(serve(listener, source, limits));
        let idle: Vec<std::net::TcpStream> = (0..40)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        // Far above the milliseconds an answer takes, and below the 10 s idle clients used to
        // hold every slot for.
        for _ in 0..3 {
            let answered = tokio::time::timeout(
                Duration::from_secs(5),
                tokio::task::spawn_blocking(move || get(addr, "/health")),
            )
            .await
            .expect("/health answered while idle connections are open")
            .unwrap();
            assert_eq!((answered.0, answered.2.as_str()), (200, "ok\n"));
        }
        drop(idle);
        server.abort();
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_token_guards_metrics_and_leaves_health_to_probes() {
        let (_, _, source) = memory_source();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = HttpLimits {
            token: Some(Arc::from("s3cret")),
            ..LIMITS
        };
        let server = tokio::spawn(serve(listener, source, limits));
        let ask = move |auth: &'static str| {
            tokio::task::spawn_blocking(move || {
                fetch(
                    addr,
                    format!("GET /metrics HTTP/1.1\r\nHost: t\r\n{auth}\r\n").as_bytes(),
                )
            })
        };
        let (status, head, _) = ask("").await.unwrap();
        assert_eq!(status, 401);
        assert!(head.contains("WWW-Authenticate: Bearer"), "{head}");
        assert_eq!(ask("Authorization: Bearer wrong\r\n").await.unwrap().0, 401);
        assert_eq!(ask("Authorization: Bearer s3cre\r\n").await.unwrap().0, 401);
        assert_eq!(ask("Authorization: Basic s3cret\r\n").await.unwrap().0, 401);
        let (status, _, body) = ask("authorization: bearer s3cret\r\n").await.unwrap();
        assert_eq!(status, 200);
        assert!(body.contains("strata_storage_requests_total"));
        let (status, _, body) = tokio::task::spawn_blocking(move || get(addr, "/health"))
            .await
            .unwrap();
        assert_eq!((status, body.as_str()), (200, "ok\n"));
        server.abort();
    }

    #[test]
    fn secrets_compare_equal_only_when_identical() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"ab", b"abc"));
        assert!(!same_secret(b"abc\0", b"abc"));
        assert!(!same_secret(b"", b"abc"));
    }
}

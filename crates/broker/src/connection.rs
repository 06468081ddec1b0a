//! One client connection: read request frames, run them concurrently, answer in request order.
//!
//! Kafka clients pipeline requests on a connection and match responses by order as much as by
//! correlation id, so responses must leave in the order requests arrived. Each request runs as
//! its own task (an append keeps running to completion even if the client goes away, and CRC
//! checks of large batches use every core); their handles sit in a `FuturesOrdered`, which
//! yields results in push order. The pipeline depth is bounded: at the limit we stop reading,
//! and TCP pushes back on the client.

use std::collections::VecDeque;
use std::future::Future;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use futures::stream::{FuturesOrdered, StreamExt};
use strata_core::Clock;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, error, warn};

use crate::dispatch::{self, Reply};
use crate::framing::ResponseFrame;
use crate::limits::MemoryCharge;
use crate::security::sasl::{Gate, Session};
use crate::security::{Listener, Principal};
use crate::server::Broker;
use strata_wire::frame::{try_split_frame, FrameError};

/// Smallest free space offered to a socket read.
const MIN_READ_SPACE: usize = 16 * 1024;
/// How many chunks one vectored write hands to the kernel.
const MAX_IOVECS: usize = 64;

pub(crate) struct Connection {
    broker: Arc<Broker>,
    peer: SocketAddr,
    shutdown: watch::Receiver<bool>,
    listener: Arc<Listener>,
    /// When the connection was accepted: authentication must be done within
    /// `authentication_timeout` of it.
    accepted: Duration,
    /// Who the client certificate says the client is (mTLS), on a TLS listener; SASL's
    /// identity replaces it on SASL_SSL, as in Kafka.
    tls_principal: Option<Principal>,
}

impl Connection {
    pub fn new(
        broker: Arc<Broker>,
        peer: SocketAddr,
        shutdown: watch::Receiver<bool>,
        listener: Arc<Listener>,
        accepted: Duration,
    ) -> Self {
        Self {
            broker,
            peer,
            shutdown,
            listener,
            accepted,
            tls_principal: None,
        }
    }

    pub fn set_tls_principal(&mut self, principal: Principal) {
        self.tls_principal = Some(principal);
    }

    /// Serves the connection read from `reader` and answered on `writer` (the two halves of
    /// a TCP or TLS stream) until either side closes it.
    pub async fn run<R, W>(mut self, mut reader: R, mut writer: W)
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        debug!(peer = %self.peer, listener = %self.listener.name, "connection opened");
        let mut sasl = if self.listener.protocol.uses_sasl() {
            Session::unauthenticated()
        } else {
            Session::authenticated(
                self.tls_principal
                    .take()
                    .unwrap_or_else(Principal::anonymous),
            )
        };
        // Until SASL completes, requests that reach dispatch (ApiVersions) act for nobody.
        let unauthenticated = Arc::new(Principal::anonymous());
        let auth_deadline = self
            .accepted
            .saturating_add(self.broker.settings.authentication_timeout);
        let settings = &self.broker.settings;
        let max_frame = settings.max_request_bytes;
        let depth = settings.max_inflight_requests_per_connection.max(1);
        let idle_timeout = settings.connections_max_idle;
        let read_timeout = settings.request_read_timeout;
        let mut buf = BytesMut::with_capacity(MIN_READ_SPACE);
        let mut inflight: FuturesOrdered<JoinHandle<Reply>> = FuturesOrdered::new();
        // Produce requests append in arrival order (see `ProduceTurn`).
        let mut produce_gate: Option<crate::produce_turn::Gate> = None;
        // False once the client closed its side, the broker is shutting down, or the input
        // became unusable: from then on we only answer what we already accepted.
        let mut reading = true;
        // The request memory held for the frame being received, taken when its size prefix
        // arrived and handed to its request task; or the wait for it, while the budget is
        // exhausted (the socket is not read meanwhile).
        let mut charge: Option<MemoryCharge> = None;
        let mut charging: Option<Pin<Box<dyn Future<Output = Option<MemoryCharge>> + Send>>> = None;
        // When the frame being received started arriving (or got its memory): it must be
        // complete within `read_timeout`.
        // Times on the broker's clock (monotonic).
        let clock = Arc::clone(&self.broker.clock);
        let mut frame_started: Option<Duration> = None;
        let mut last_active = clock.monotonic();
        // Until when the connection is not read, after a response over a client quota.
        let mut muted_until: Option<Duration> = None;

        loop {
            if *self.shutdown.borrow() {
                reading = false;
            }
            while reading && inflight.len() < depth && charging.is_none() && muted_until.is_none() {
                if charge.is_none() {
                    match frame_cost(&buf, max_frame) {
                        Ok(None) => break,
                        Ok(Some(cost)) => {
                            let memory = &self.broker.limits.memory;
                            if !memory.fits(cost) {
                                warn!(peer = %self.peer, cost,
                                    budget = self.broker.settings.queued_max_request_bytes,
                                    "request would need more than the whole request memory; closing connection");
                                reading = false;
                                break;
                            }
                            match memory.try_charge(cost) {
                                Some(granted) => charge = Some(granted),
                                None => {
                                    debug!(peer = %self.peer, cost, "request memory exhausted; pausing reads");
                                    charging = Some(Box::pin(memory.charge(cost)));
                                    break;
                                }
                            }
                        }
                        Err(e) => {
                            warn!(peer = %self.peer, error = %e, "bad request frame; closing connection");
                            reading = false;
                            break;
                        }
                    }
                }
                match try_split_frame(&mut buf, max_frame) {
                    Ok(Some(frame)) => {
                        if frame.len() > MIN_READ_SPACE {
                            // The rest of the buffer would keep the frame's whole allocation
                            // alive (uncharged) after the request is done: copy it out.
                            buf = BytesMut::from(&buf[..]);
                        }
                        frame_started = (!buf.is_empty()).then(|| clock.monotonic());
                        if sasl.begin_reauthentication(&frame) {
                            debug!(peer = %self.peer, "re-authentication started");
                        }
                        if !sasl.is_done() {
                            match sasl.gate(&frame) {
                                Gate::Dispatch => {}
                                Gate::Sasl => {
                                    let held = charge.take();
                                    let (reply, close) =
                                        sasl.step(&self.broker, frame, self.peer).await;
                                    drop(held);
                                    inflight.push_back(tokio::spawn(std::future::ready(reply)));
                                    if close {
                                        reading = false;
                                    }
                                    continue;
                                }
                                Gate::Refuse => {
                                    warn!(peer = %self.peer, listener = %self.listener.name,
                                        "request before authentication; closing connection");
                                    self.broker
                                        .auth_stats
                                        .record("other", "unauthenticated_request");
                                    charge = None;
                                    reading = false;
                                    break;
                                }
                            }
                        }
                        // KIP-368: past its session's end, a connection that has not logged in
                        // again is closed on its next request, as Kafka closes it.
                        if sasl
                            .expires_at()
                            .is_some_and(|end| clock.monotonic() >= end)
                        {
                            debug!(peer = %self.peer, "session expired without re-authentication; closing connection");
                            self.broker.auth_stats.record("other", "session_expired");
                            charge = None;
                            reading = false;
                            break;
                        }
                        let principal = match sasl.principal() {
                            Some(principal) => Arc::clone(principal),
                            None => Arc::clone(&unauthenticated),
                        };
                        let listener = Arc::clone(&self.listener);
                        let is_produce = frame.len() >= 2 && frame[0] == 0 && frame[1] == 0;
                        let turn = is_produce.then(|| {
                            let (turn, gate) = crate::ProduceTurn::new(produce_gate.take());
                            produce_gate = Some(gate);
                            turn
                        });
                        let held = charge.take();
                        let broker = Arc::clone(&self.broker);
                        let peer = self.peer;
                        let shutdown = self.shutdown.clone();
                        inflight.push_back(tokio::spawn(async move {
                            let reply = dispatch::handle_frame(
                                broker, frame, peer, shutdown, turn, principal, listener,
                            )
                            .await;
                            drop(held);
                            reply
                        }));
                    }
                    // Incomplete; try_split_frame has reserved room for the rest of the frame.
                    Ok(None) => break,
                    Err(e) => {
                        // Kafka closes the connection on an oversized or malformed frame; there
                        // is no correlation id to answer with. Earlier requests still get their
                        // answers first.
                        warn!(peer = %self.peer, error = %e, "bad request frame; closing connection");
                        reading = false;
                    }
                }
            }
            if !reading && inflight.is_empty() {
                break;
            }
            if buf.capacity() - buf.len() < MIN_READ_SPACE {
                buf.reserve(MIN_READ_SPACE);
            }
            // A frame in progress must complete in time (unless we are the ones holding it up,
            // waiting for memory); a connection with nothing in progress may idle this long.
            let mut deadline = if !buf.is_empty() {
                frame_started
                    .filter(|_| charging.is_none() && muted_until.is_none())
                    .map(|started| (started.saturating_add(read_timeout), Expiry::SlowRequest))
            } else if inflight.is_empty() {
                Some((last_active.saturating_add(idle_timeout), Expiry::Idle))
            } else {
                None
            };
            if !sasl.is_done() && deadline.is_none_or(|(at, _)| auth_deadline < at) {
                deadline = Some((auth_deadline, Expiry::Unauthenticated));
            }

            tokio::select! {
                // Answer first: it frees pipeline slots and keeps latency low.
                biased;
                Some(done) = inflight.next(), if !inflight.is_empty() => match done {
                    Ok(Reply::Frame(frame)) => {
                        if let Err(e) = write_frame(&mut writer, frame).await {
                            debug!(peer = %self.peer, error = %e, "write failed; closing");
                            break;
                        }
                        last_active = clock.monotonic();
                    }
                    Ok(Reply::Nothing) => last_active = clock.monotonic(),
                    Ok(Reply::Throttled { frame, mute }) => {
                        if let Some(frame) = frame {
                            if let Err(e) = write_frame(&mut writer, frame).await {
                                debug!(peer = %self.peer, error = %e, "write failed; closing");
                                break;
                            }
                        }
                        last_active = clock.monotonic();
                        let until = last_active.saturating_add(mute);
                        muted_until = Some(muted_until.map_or(until, |m| m.max(until)));
                    }
                    Ok(Reply::Close) => break,
                    Err(e) => {
                        error!(peer = %self.peer, error = %e, "request task failed; closing connection");
                        break;
                    }
                },
                granted = wait_for(&mut charging), if charging.is_some() => {
                    charging = None;
                    match granted {
                        Some(granted) => {
                            charge = Some(granted);
                            // The client was not the one slow: its clock starts now.
                            frame_started = Some(clock.monotonic());
                        }
                        None => reading = false,
                    }
                }
                _ = sleep_until_some(clock.as_ref(), muted_until.map(|at| (at, Expiry::Muted))), if muted_until.is_some() => {
                    muted_until = None;
                    // The client was held back by us: its request clocks restart now.
                    last_active = clock.monotonic();
                    if frame_started.is_some() {
                        frame_started = Some(last_active);
                    }
                }
                read = reader.read_buf(&mut buf), if reading && inflight.len() < depth && charging.is_none() && muted_until.is_none() => match read {
                    Ok(0) => {
                        if !buf.is_empty() {
                            debug!(peer = %self.peer, bytes = buf.len(), "connection closed mid-frame");
                        }
                        reading = false;
                    }
                    Ok(_) => {
                        last_active = clock.monotonic();
                        if frame_started.is_none() {
                            frame_started = Some(last_active);
                        }
                    }
                    Err(e) => {
                        debug!(peer = %self.peer, error = %e, "read failed; closing");
                        break;
                    }
                },
                _ = sleep_until_some(clock.as_ref(), deadline), if reading && deadline.is_some() => {
                    match deadline.map(|(_, why)| why) {
                        Some(Expiry::SlowRequest) => warn!(peer = %self.peer, timeout = ?read_timeout,
                            bytes = buf.len(), "request not received in time; closing connection"),
                        Some(Expiry::Unauthenticated) => {
                            self.broker.auth_stats.record("other", "timeout");
                            warn!(peer = %self.peer, timeout = ?self.broker.settings.authentication_timeout,
                                "not authenticated in time; closing connection");
                        }
                        _ => debug!(peer = %self.peer, timeout = ?idle_timeout, "idle; closing connection"),
                    }
                    reading = false;
                }
                changed = self.shutdown.changed(), if reading => {
                    if changed.is_err() || *self.shutdown.borrow() {
                        reading = false;
                    }
                }
            }
        }
        // Requests still running (after a write error or a Close) keep running to completion in
        // their own tasks; only their answers are dropped.
        let _ = writer.shutdown().await;
        debug!(peer = %self.peer, "connection closed");
    }
}

/// Why a connection's timer fired.
#[derive(Debug, Clone, Copy)]
enum Expiry {
    /// A request started arriving but did not complete within `request_read_timeout`.
    SlowRequest,
    /// Nothing in progress for `connections_max_idle`.
    Idle,
    /// SASL not completed within `authentication_timeout` of the connection's start.
    Unauthenticated,
    /// A quota throttle is over: the connection may be read again.
    Muted,
}

async fn sleep_until_some(clock: &dyn Clock, deadline: Option<(Duration, Expiry)>) {
    match deadline {
        Some((at, _)) => clock.sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn wait_for(
    charging: &mut Option<Pin<Box<dyn Future<Output = Option<MemoryCharge>> + Send>>>,
) -> Option<MemoryCharge> {
    match charging {
        Some(charging) => charging.await,
        None => std::future::pending().await,
    }
}

/// What the next frame in `buf` costs in request memory, once enough of it has arrived to
/// tell (its size prefix and api key); None before that. The size is checked against
/// `max_frame` here, before anything is reserved for the body.
fn frame_cost(buf: &[u8], max_frame: usize) -> Result<Option<usize>, FrameError> {
    let Some(prefix) = buf.get(..4) else {
        return Ok(None);
    };
    let declared = i32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
    let size = usize::try_from(declared).map_err(|_| FrameError::NegativeSize(declared))?;
    if size > max_frame {
        return Err(FrameError::TooLarge {
            size,
            max: max_frame,
        });
    }
    if size < 2 {
        // Too short to name an api; the header parser refuses it, at no cost.
        return Ok(Some(0));
    }
    let Some(key) = buf.get(4..6) else {
        return Ok(None);
    };
    let api_key = i16::from_be_bytes([key[0], key[1]]);
    Ok(Some(crate::limits::frame_charge(api_key, size)))
}

/// Writes one response frame with vectored writes, so record batches go to the kernel from
/// their own buffers, then flushes: a TLS stream keeps what the socket did not take in its own
/// buffer (tokio-rustls reports it written), and without the flush the end of a large
/// response waited there until the connection's next response pushed it out.
async fn write_frame<W: AsyncWrite + Unpin>(
    writer: &mut W,
    frame: ResponseFrame,
) -> std::io::Result<()> {
    let mut chunks: VecDeque<Bytes> = frame.chunks.into_iter().filter(|c| !c.is_empty()).collect();
    while !chunks.is_empty() {
        let slices: Vec<IoSlice<'_>> = chunks
            .iter()
            .take(MAX_IOVECS)
            .map(|c| IoSlice::new(c))
            .collect();
        let mut written = writer.write_vectored(&slices).await?;
        drop(slices);
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while written > 0 {
            let Some(front) = chunks.front_mut() else {
                break;
            };
            if written >= front.len() {
                written -= front.len();
                chunks.pop_front();
            } else {
                front.advance(written);
                written = 0;
            }
        }
    }
    writer.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn vectored_write_survives_partial_writes() {
        // A duplex pipe with a tiny buffer forces many short writes.
        let (mut client, mut server) = tokio::io::duplex(7);
        let frame = ResponseFrame {
            chunks: vec![
                Bytes::from_static(b"0123"),
                Bytes::new(),
                Bytes::from(vec![b'x'; 100]),
                Bytes::from_static(b"end"),
            ],
        };
        let expected: Vec<u8> = frame.chunks.iter().flat_map(|c| c.to_vec()).collect();
        let writer = tokio::spawn(async move {
            write_frame(&mut server, frame).await.unwrap();
        });
        let mut got = vec![0u8; expected.len()];
        client.read_exact(&mut got).await.unwrap();
        writer.await.unwrap();
        assert_eq!(got, expected);
    }

    /// A writer that holds bytes until flushed (as a TLS stream holds what the socket did not
    /// take) still delivers the whole frame, with no later write to push it out.
    #[tokio::test]
    async fn a_frame_is_flushed_through_a_buffering_writer() {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let mut buffered = tokio::io::BufWriter::with_capacity(1 << 12, server);
        let frame = ResponseFrame {
            chunks: vec![Bytes::from_static(b"head"), Bytes::from_static(b"tail")],
        };
        write_frame(&mut buffered, frame).await.unwrap();
        let mut got = [0u8; 8];
        // Nothing else is ever written: without the flush this read would wait forever.
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            client.read_exact(&mut got),
        )
        .await
        .expect("the frame reached the peer")
        .unwrap();
        assert_eq!(&got, b"headtail");
    }
}

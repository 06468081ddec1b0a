//! One client connection: read request frames, run them concurrently, answer in request order.
//!
//! Kafka clients pipeline requests on a connection and match responses by order as much as by
//! correlation id, so responses must leave in the order requests arrived. Each request runs as
//! its own task (an append keeps running to completion even if the client goes away, and CRC
//! checks of large batches use every core); their handles sit in a `FuturesOrdered`, which
//! yields results in push order. The pipeline depth is bounded: at the limit we stop reading,
//! and TCP pushes back on the client.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use futures::stream::{FuturesOrdered, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, error, warn};

use crate::dispatch::{self, Reply};
use crate::framing::ResponseFrame;
use crate::server::Broker;
use strata_wire::frame::try_split_frame;

/// Smallest free space offered to a socket read.
const MIN_READ_SPACE: usize = 16 * 1024;
/// How many chunks one vectored write hands to the kernel.
const MAX_IOVECS: usize = 64;

pub(crate) struct Connection {
    broker: Arc<Broker>,
    peer: SocketAddr,
    shutdown: watch::Receiver<bool>,
}

impl Connection {
    pub fn new(broker: Arc<Broker>, peer: SocketAddr, shutdown: watch::Receiver<bool>) -> Self {
        Self {
            broker,
            peer,
            shutdown,
        }
    }

    pub async fn run(mut self, stream: TcpStream) {
        debug!(peer = %self.peer, "connection opened");
        let (mut reader, mut writer) = stream.into_split();
        let max_frame = self.broker.settings.max_request_bytes;
        let depth = self
            .broker
            .settings
            .max_inflight_requests_per_connection
            .max(1);
        let mut buf = BytesMut::with_capacity(MIN_READ_SPACE);
        let mut inflight: FuturesOrdered<JoinHandle<Reply>> = FuturesOrdered::new();
        // Produce requests append in arrival order (see `ProduceTurn`).
        let produce_order = Arc::new(tokio::sync::watch::channel(0u64).0);
        let mut next_produce_ticket = 0u64;
        // False once the client closed its side, the broker is shutting down, or the input
        // became unusable: from then on we only answer what we already accepted.
        let mut reading = true;

        loop {
            if *self.shutdown.borrow() {
                reading = false;
            }
            while reading && inflight.len() < depth {
                match try_split_frame(&mut buf, max_frame) {
                    Ok(Some(frame)) => {
                        let is_produce = frame.len() >= 2 && frame[0] == 0 && frame[1] == 0;
                        let turn = is_produce.then(|| {
                            let ticket = next_produce_ticket;
                            next_produce_ticket += 1;
                            crate::ProduceTurn::new(ticket, Arc::clone(&produce_order))
                        });
                        inflight.push_back(tokio::spawn(dispatch::handle_frame(
                            Arc::clone(&self.broker),
                            frame,
                            self.peer,
                            self.shutdown.clone(),
                            turn,
                        )));
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

            tokio::select! {
                // Answer first: it frees pipeline slots and keeps latency low.
                biased;
                Some(done) = inflight.next(), if !inflight.is_empty() => match done {
                    Ok(Reply::Frame(frame)) => {
                        if let Err(e) = write_frame(&mut writer, frame).await {
                            debug!(peer = %self.peer, error = %e, "write failed; closing");
                            break;
                        }
                    }
                    Ok(Reply::Nothing) => {}
                    Ok(Reply::Close) => break,
                    Err(e) => {
                        error!(peer = %self.peer, error = %e, "request task failed; closing connection");
                        break;
                    }
                },
                read = reader.read_buf(&mut buf), if reading && inflight.len() < depth => match read {
                    Ok(0) => {
                        if !buf.is_empty() {
                            debug!(peer = %self.peer, bytes = buf.len(), "connection closed mid-frame");
                        }
                        reading = false;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        debug!(peer = %self.peer, error = %e, "read failed; closing");
                        break;
                    }
                },
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

/// Writes one response frame with vectored writes, so record batches go to the kernel from
/// their own buffers.
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
    Ok(())
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
}

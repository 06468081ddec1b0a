//! A raw Kafka connection over a blocking `TcpStream`: hand-built frames for bad-input tests,
//! and requests encoded with the `kafka-protocol` crate where a test needs to read the exact
//! error code or the exact record bytes the broker answers with.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::api_versions_request::ApiVersionsRequest;
use kafka_protocol::messages::api_versions_response::ApiVersionsResponse;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchRequest, FetchTopic};
use kafka_protocol::messages::fetch_response::PartitionData;
use kafka_protocol::messages::produce_request::{
    PartitionProduceData, ProduceRequest, TopicProduceData,
};
use kafka_protocol::messages::produce_response::PartitionProduceResponse;
use kafka_protocol::messages::{
    BrokerId, FetchResponse, ProduceResponse, RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Message, Request, StrBytes};

/// How long a raw read waits for the broker by default.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Responses in these tests are small; anything larger is a framing bug worth failing on.
const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// Newest versions this harness sends: Produce v13 and Fetch v13 name topics by id, which
/// would need a Metadata round trip first; the name-based versions are enough here.
pub const PRODUCE_VERSION_CAP: i16 = 12;
pub const FETCH_VERSION_CAP: i16 = 12;

/// What a read from the broker produced.
#[derive(Debug)]
pub enum ReadOutcome {
    /// A whole response frame, without its size prefix.
    Frame(Bytes),
    /// The broker closed (or reset) the connection.
    Closed,
    /// Nothing within the timeout.
    TimedOut,
}

pub struct RawConnection {
    stream: TcpStream,
    next_correlation_id: i32,
}

impl RawConnection {
    pub fn connect(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect_timeout(&addr, READ_TIMEOUT)
            .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
        stream.set_nodelay(true).expect("set TCP_NODELAY");
        Self {
            stream,
            next_correlation_id: 1,
        }
    }

    /// Writes raw bytes. Returns the error instead of panicking: writing to a broker that has
    /// already closed the connection is an expected outcome in bad-input tests.
    pub fn write_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)?;
        self.stream.flush()
    }

    /// Tells the broker no more bytes are coming (a half close).
    pub fn shutdown_write(&mut self) {
        // Fails only if the broker already reset the connection, which the read will show.
        let _ = self.stream.shutdown(Shutdown::Write);
    }

    /// Reads one response frame, or tells how the connection ended, within `timeout`.
    pub fn read_frame(&mut self, timeout: Duration) -> ReadOutcome {
        let deadline = Instant::now() + timeout;
        let mut size = [0u8; 4];
        match self.read_exact_until(&mut size, deadline) {
            Ok(true) => {}
            Ok(false) => return ReadOutcome::Closed,
            Err(e) if is_timeout(&e) => return ReadOutcome::TimedOut,
            Err(e) if is_reset(&e) => return ReadOutcome::Closed,
            Err(e) => panic!("read a frame size: {e}"),
        }
        let size = i32::from_be_bytes(size);
        let size = usize::try_from(size)
            .ok()
            .filter(|&s| s <= MAX_RESPONSE_BYTES)
            .unwrap_or_else(|| panic!("broker sent a frame size of {size}"));
        let mut body = vec![0u8; size];
        match self.read_exact_until(&mut body, deadline) {
            Ok(true) => ReadOutcome::Frame(Bytes::from(body)),
            Ok(false) => {
                panic!("broker closed the connection in the middle of a {size}-byte frame")
            }
            Err(e) if is_timeout(&e) => {
                panic!("broker stalled in the middle of a {size}-byte frame")
            }
            Err(e) => panic!("read a {size}-byte frame: {e}"),
        }
    }

    /// Fills `buf`; `Ok(false)` on a clean EOF before the first byte.
    fn read_exact_until(&mut self, buf: &mut [u8], deadline: Instant) -> io::Result<bool> {
        let mut filled = 0;
        while filled < buf.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            self.stream.set_read_timeout(Some(left))?;
            match self.stream.read(&mut buf[filled..]) {
                Ok(0) if filled == 0 => return Ok(false),
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Waits until the broker closes the connection, failing if it answers or stays silent.
    pub fn expect_closed(&mut self, what: &str, timeout: Duration) {
        match self.read_frame(timeout) {
            ReadOutcome::Closed => {}
            ReadOutcome::Frame(frame) => panic!(
                "after {what} the broker answered a {}-byte frame instead of closing",
                frame.len()
            ),
            ReadOutcome::TimedOut => {
                panic!("after {what} the broker neither answered nor closed within {timeout:?}")
            }
        }
    }

    /// Sends `request` as version `version`, returning its correlation id.
    pub fn send<R: Request>(&mut self, version: i16, request: &R) -> i32 {
        let correlation_id = self.next_correlation_id;
        self.next_correlation_id += 1;
        let frame = encode_request_frame(version, correlation_id, request);
        self.write_raw(&frame)
            .unwrap_or_else(|e| panic!("send API {} v{version}: {e}", R::KEY));
        correlation_id
    }

    /// Sends `request` and decodes its response; panics if the connection closes instead.
    pub fn request<R: Request>(&mut self, version: i16, request: &R) -> R::Response {
        let correlation_id = self.send(version, request);
        let frame = match self.read_frame(READ_TIMEOUT) {
            ReadOutcome::Frame(frame) => frame,
            other => panic!(
                "API {} v{version}: expected a response, got {other:?}",
                R::KEY
            ),
        };
        decode_response::<R>(version, correlation_id, frame)
    }

    /// ApiVersions v0, which every broker must answer: what the broker says it implements.
    pub fn api_versions(&mut self) -> ApiVersionsResponse {
        let response = self.request(0, &ApiVersionsRequest::default());
        assert_eq!(response.error_code, 0, "ApiVersions v0 answered an error");
        response
    }

    /// The newest version of `R` that both the broker (per `versions`) and this harness (up to
    /// `cap`) support; panics if there is none.
    pub fn negotiate<R: Request>(versions: &ApiVersionsResponse, cap: i16) -> i16 {
        let advertised = versions
            .api_keys
            .iter()
            .find(|k| k.api_key == R::KEY)
            .unwrap_or_else(|| panic!("the broker does not advertise API key {}", R::KEY));
        let max = advertised.max_version.min(cap).min(R::VERSIONS.max);
        let min = advertised.min_version.max(R::VERSIONS.min);
        assert!(
            min <= max,
            "no common version of API {}: broker {}..{}",
            R::KEY,
            advertised.min_version,
            advertised.max_version
        );
        max
    }

    /// Produces `records` (raw batch bytes) to one partition with acks=all.
    pub fn produce(
        &mut self,
        version: i16,
        topic: &str,
        partition: i32,
        records: Vec<u8>,
    ) -> PartitionProduceResponse {
        let response = self.request(version, &produce_request(topic, partition, records));
        produce_partition_response(response, topic, partition)
    }

    /// Fetches one partition from `offset`, not waiting for new data.
    pub fn fetch(
        &mut self,
        version: i16,
        topic: &str,
        partition: i32,
        offset: i64,
        max_bytes: i32,
    ) -> PartitionData {
        let request = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(0)
            .with_min_bytes(0)
            .with_max_bytes(max_bytes)
            .with_isolation_level(0)
            .with_session_id(0)
            .with_session_epoch(-1)
            .with_topics(vec![FetchTopic::default()
                .with_topic(topic_name(topic))
                .with_partitions(vec![FetchPartition::default()
                    .with_partition(partition)
                    .with_current_leader_epoch(-1)
                    .with_fetch_offset(offset)
                    .with_log_start_offset(-1)
                    .with_partition_max_bytes(max_bytes)])]);
        let response: FetchResponse = self.request(version, &request);
        assert_eq!(response.error_code, 0, "Fetch answered a top-level error");
        let topic_response = response
            .responses
            .into_iter()
            .find(|t| t.topic.0.as_str() == topic)
            .unwrap_or_else(|| panic!("Fetch response has no topic {topic}"));
        topic_response
            .partitions
            .into_iter()
            .find(|p| p.partition_index == partition)
            .unwrap_or_else(|| panic!("Fetch response has no partition {topic}/{partition}"))
    }
}

/// A Produce request with acks=all for one partition.
pub fn produce_request(topic: &str, partition: i32, records: Vec<u8>) -> ProduceRequest {
    ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(10_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(topic_name(topic))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(partition)
                .with_records(Some(Bytes::from(records)))])])
}

/// The answer for one partition in a Produce response; panics if it is missing.
pub fn produce_partition_response(
    response: ProduceResponse,
    topic: &str,
    partition: i32,
) -> PartitionProduceResponse {
    let topic_response = response
        .responses
        .into_iter()
        .find(|t| t.name.0.as_str() == topic)
        .unwrap_or_else(|| panic!("Produce response has no topic {topic}"));
    topic_response
        .partition_responses
        .into_iter()
        .find(|p| p.index == partition)
        .unwrap_or_else(|| panic!("Produce response has no partition {topic}/{partition}"))
}

pub fn topic_name(topic: &str) -> TopicName {
    TopicName(StrBytes::from_string(topic.to_string()))
}

/// A complete request frame: size prefix, header and body.
pub fn encode_request_frame<R: Request>(version: i16, correlation_id: i32, request: &R) -> Vec<u8> {
    let mut message = BytesMut::new();
    request_header(R::KEY, version, correlation_id)
        .encode(&mut message, R::header_version(version))
        .expect("encode the request header");
    request
        .encode(&mut message, version)
        .unwrap_or_else(|e| panic!("encode API {} v{version}: {e}", R::KEY));
    frame(&message)
}

pub fn request_header(api_key: i16, version: i16, correlation_id: i32) -> RequestHeader {
    RequestHeader::default()
        .with_request_api_key(api_key)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_static_str("strata-tests-raw")))
}

/// Prefixes `message` with its length, as every Kafka frame is.
pub fn frame(message: &[u8]) -> Vec<u8> {
    let mut framed = Vec::with_capacity(4 + message.len());
    framed.extend_from_slice(&(message.len() as i32).to_be_bytes());
    framed.extend_from_slice(message);
    framed
}

/// Decodes a response frame of `R` at `version`, checking the correlation id.
pub fn decode_response<R: Request>(version: i16, correlation_id: i32, frame: Bytes) -> R::Response {
    decode_response_as::<R::Response>(version, correlation_id, frame)
}

pub fn decode_response_as<T: Decodable + HeaderVersion + Message>(
    version: i16,
    correlation_id: i32,
    mut frame: Bytes,
) -> T {
    let header = ResponseHeader::decode(&mut frame, T::header_version(version))
        .expect("decode the response header");
    assert_eq!(
        header.correlation_id, correlation_id,
        "response correlation id"
    );
    T::decode(&mut frame, version).unwrap_or_else(|e| panic!("decode response v{version}: {e}"))
}

/// Encodes a request header at an arbitrary (possibly unsupported) version, followed by
/// `body`. `header_version` 1 is the classic header, 2 the flexible one with tagged fields.
pub fn encode_frame_with_header(
    api_key: i16,
    version: i16,
    correlation_id: i32,
    header_version: i16,
    body: &[u8],
) -> Vec<u8> {
    let mut message = BytesMut::new();
    request_header(api_key, version, correlation_id)
        .encode(&mut message, header_version)
        .expect("encode the request header");
    message.extend_from_slice(body);
    frame(&message)
}

fn is_timeout(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

fn is_reset(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
    )
}

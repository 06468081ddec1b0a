//! What an unauthenticated client can make the broker spend is bounded: memory for requests
//! (in flight and once decoded), connections and their time, the HTTP endpoint's attention,
//! and catalog writes for auto-created topics. Each test plays the client a tester found doing
//! damage, against the real binary.

// A failed expectation in a test is a panic; helpers here are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{ApiVersionsRequest, MetadataRequest};
use strata_tests::clients::assert_broker_serves_clients;
use strata_tests::raw::{encode_frame_with_header, topic_name, RawConnection, READ_TIMEOUT};
use strata_tests::wait::{wait_until, DEADLINE};
use strata_tests::{StrataOptions, StrataProcess};

const API_KEY_PRODUCE: i16 = 0;
const API_KEY_METADATA: i16 = 3;
const LEADER_NOT_AVAILABLE: i16 = 5;

fn mib(bytes: u64) -> u64 {
    bytes >> 20
}

/// A Metadata v1 frame naming `count` empty topic names: 2 bytes on the wire each, about 90
/// bytes of memory each once decoded and answered.
fn metadata_of_empty_names(count: usize) -> Vec<u8> {
    let mut body = Vec::with_capacity(4 + 2 * count);
    body.extend_from_slice(&i32::try_from(count).unwrap().to_be_bytes());
    body.resize(4 + 2 * count, 0);
    encode_frame_with_header(API_KEY_METADATA, 1, 1, 1, &body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metadata_request_of_empty_names_cannot_expand_into_gigabytes() {
    let mut broker = StrataProcess::start();
    let before = broker.proc_status_bytes("VmHWM");
    // 19 MiB on the wire: it used to take the broker to 1.75 GB resident.
    let frame = metadata_of_empty_names(10_000_000);
    let mut raw = RawConnection::connect(broker.addr());
    // The broker may close while we write (it refuses on the size alone); the read tells.
    let _ = raw.write_raw(&frame);
    match raw.read_frame(Duration::from_secs(120)) {
        strata_tests::raw::ReadOutcome::Closed => {}
        other => panic!("expected the connection closed, got {other:?}"),
    }
    let peak = broker.proc_status_bytes("VmHWM");
    eprintln!(
        "peak RSS before {} MiB, after a {} MiB Metadata of empty names {} MiB",
        mib(before),
        mib(frame.len() as u64),
        mib(peak)
    );
    assert!(
        peak < before + (300 << 20),
        "peak RSS grew from {} MiB to {} MiB",
        mib(before),
        mib(peak)
    );
    assert!(broker.is_running());
    assert_broker_serves_clients(&broker.bootstrap(), "after-empty-names").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_large_frames_are_held_to_the_request_memory() {
    let mut broker = StrataProcess::start();
    let before = broker.proc_status_bytes("VmHWM");
    const CONNECTIONS: usize = 8;
    const ANNOUNCED: usize = 90 << 20;
    const SENT: usize = 80 << 20;
    // Each announces a 90 MiB Produce and sends 80 MiB of it, then waits. With the default
    // 256 MiB of request memory, two are read; the others are not read at all until memory
    // frees, so their writes stall (the write timeout ends the attempt, not the test).
    let writers: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            let addr = broker.addr();
            std::thread::spawn(move || {
                let mut stream = TcpStream::connect(addr).unwrap();
                stream
                    .set_write_timeout(Some(Duration::from_secs(5)))
                    .unwrap();
                let mut head = i32::try_from(ANNOUNCED).unwrap().to_be_bytes().to_vec();
                head.extend_from_slice(&API_KEY_PRODUCE.to_be_bytes());
                head.extend_from_slice(&3i16.to_be_bytes());
                let chunk = vec![0u8; 1 << 20];
                let mut sent = 0usize;
                let mut write = || -> std::io::Result<()> {
                    stream.write_all(&head)?;
                    while sent < SENT {
                        stream.write_all(&chunk)?;
                        sent += chunk.len();
                    }
                    Ok(())
                };
                let _ = write();
                (stream, sent)
            })
        })
        .collect();
    let held: Vec<(TcpStream, usize)> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    let delivered: usize = held.iter().map(|(_, sent)| sent).sum();
    let peak = broker.proc_status_bytes("VmHWM");
    eprintln!(
        "{CONNECTIONS} connections sending {} MiB of {} MiB frames: {} MiB accepted by the socket, \
         peak RSS {} MiB (before {} MiB)",
        mib(SENT as u64),
        mib(ANNOUNCED as u64),
        mib(delivered as u64),
        mib(peak),
        mib(before)
    );
    assert!(
        peak < before + (320 << 20),
        "peak RSS grew from {} MiB to {} MiB",
        mib(before),
        mib(peak)
    );
    drop(held);
    assert!(broker.is_running());
    assert_broker_serves_clients(&broker.bootstrap(), "after-half-sent-frames").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_trickled_one_byte_at_a_time_is_cut_off() {
    let mut broker = StrataProcess::start_with(
        StrataOptions::default().with_args(["--request-read-timeout", "1s"]),
    );
    let addr = broker.addr();
    let mut stream = TcpStream::connect(addr).unwrap();
    // An ApiVersions request, one byte every 100 ms: never idle, never complete in time.
    let frame = strata_tests::raw::encode_request_frame(0, 1, &ApiVersionsRequest::default());
    let mut trickle = stream.try_clone().unwrap();
    let trickler = std::thread::spawn(move || {
        for byte in frame.iter().take(frame.len() - 1).cycle().take(600) {
            if trickle.write_all(&[*byte]).is_err() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100)); // pacing the attack, not a wait
        }
        false
    });
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut sink = [0u8; 64];
    let closed = matches!(stream.read(&mut sink), Ok(0) | Err(_));
    assert!(closed, "the broker kept a trickling connection open");
    assert!(
        trickler.join().unwrap(),
        "the trickle ran out before the broker cut it off"
    );
    assert_broker_serves_clients(&broker.bootstrap(), "after-slow-loris").await;
    assert!(broker.is_running());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_give_their_slots_back() {
    let broker = StrataProcess::start_with(StrataOptions::default().with_args([
        "--max-connections",
        "16",
        "--connections-max-idle",
        "1s",
    ]));
    // Every slot taken by a client that says nothing.
    let idle: Vec<TcpStream> = (0..16)
        .map(|_| TcpStream::connect(broker.addr()).unwrap())
        .collect();
    // A new client is served once the idle ones are closed (it waits in the backlog till then).
    let mut raw = RawConnection::connect(broker.addr());
    let versions = raw.api_versions();
    assert_eq!(versions.error_code, 0);
    drop(idle);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_per_address_limit_are_closed() {
    let broker = StrataProcess::start_with(
        StrataOptions::default().with_args(["--max-connections-per-ip", "4"]),
    );
    let mut open: Vec<RawConnection> = (0..4)
        .map(|_| RawConnection::connect(broker.addr()))
        .collect();
    for raw in &mut open {
        assert_eq!(raw.api_versions().error_code, 0);
    }
    let mut fifth = RawConnection::connect(broker.addr());
    fifth.expect_closed("a fifth connection from one address", READ_TIMEOUT);
    // Closing one frees its slot.
    drop(open.pop());
    wait_until("a slot is free again", DEADLINE, || {
        let mut next = RawConnection::connect(broker.addr());
        let _ = next.write_raw(&strata_tests::raw::encode_request_frame(
            0,
            1,
            &ApiVersionsRequest::default(),
        ));
        matches!(
            next.read_frame(READ_TIMEOUT),
            strata_tests::raw::ReadOutcome::Frame(_)
        )
        .then_some(())
    });
}

fn metrics_address(broker: &StrataProcess) -> SocketAddr {
    let line = wait_until("the broker logs its metrics address", DEADLINE, || {
        broker.log_lines_containing("metrics on ").pop()
    });
    line.rsplit("metrics on ")
        .next()
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|address| address.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_http_connections_do_not_delay_health() {
    let broker = StrataProcess::start_with(
        StrataOptions::default().with_args(["--metrics-listen", "127.0.0.1:0"]),
    );
    let address = metrics_address(&broker);
    // More idle connections than the endpoint serves at once (64 by default; 32 used to hold
    // it for 10 s).
    let idle: Vec<TcpStream> = (0..100)
        .map(|_| TcpStream::connect(address).unwrap())
        .collect();
    let mut stream = TcpStream::connect(address).unwrap();
    // Far above the milliseconds an answer takes, and below the 10 s idle clients used to hold
    // every slot for.
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: strata\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .expect("/health answered while idle connections are open");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    drop(idle);
}

/// The newest catalog version in a broker's local-directory storage.
fn catalog_version(broker: &StrataProcess) -> u64 {
    let dir = broker.data_dir().join("store/meta/catalog");
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("list {}: {e}", dir.display()))
        .filter_map(|entry| {
            let name = entry.ok()?.file_name();
            let name = name.to_str()?;
            // The local store appends a marker to every object's file name.
            let digits = name.split(|c: char| !c.is_ascii_digit()).next()?;
            digits.parse().ok()
        })
        .max()
        .unwrap_or(0)
}

fn metadata_naming(names: &[String]) -> MetadataRequest {
    let mut request = MetadataRequest::default();
    request.allow_auto_topic_creation = true;
    request.topics = Some(
        names
            .iter()
            .map(|name| {
                let mut topic = MetadataRequestTopic::default();
                topic.name = Some(topic_name(name));
                topic
            })
            .collect(),
    );
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metadata_request_naming_many_new_topics_writes_the_catalog_once() {
    if std::env::var("STRATA_TEST_STORAGE").is_ok_and(|s| !s.is_empty()) {
        eprintln!("counts catalog files in a local directory; skipped on other storage");
        return;
    }
    let broker = StrataProcess::start();
    let before = catalog_version(&broker);
    let names: Vec<String> = (0..1000).map(|i| format!("many-{i}")).collect();
    let mut raw = RawConnection::connect(broker.addr());
    let response = raw.request(12, &metadata_naming(&names));
    let created = response.topics.iter().filter(|t| t.error_code == 0).count();
    let deferred = response
        .topics
        .iter()
        .filter(|t| t.error_code == LEADER_NOT_AVAILABLE)
        .count();
    // The default limit is 100 topics per request; the rest are for the client's retry.
    assert_eq!((created, deferred), (100, 900));
    assert_eq!(
        catalog_version(&broker),
        before + 1,
        "one catalog write for the whole request"
    );
    // Retrying, as clients do on LEADER_NOT_AVAILABLE, creates the rest a request at a time
    // (within the per-second limit), still one catalog write per request.
    let total = wait_until("every topic is created", DEADLINE, || {
        let response = raw.request(12, &metadata_naming(&names));
        let created = response.topics.iter().filter(|t| t.error_code == 0).count();
        (created == names.len()).then_some(created)
    });
    assert_eq!(total, 1000);
    assert!(
        catalog_version(&broker) <= before + 10,
        "{} catalog writes for 1000 topics",
        catalog_version(&broker) - before
    );
}

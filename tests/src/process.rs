//! [`StrataProcess`]: one `strata serve` child process on a temporary data directory.
//!
//! The broker listens on port 0 and logs `listening on 127.0.0.1:PORT`; the harness reads that
//! line from the child's output to learn the port. A restart reuses the same data directory
//! *and* the same port, so clients that were connected before (a producer in the middle of a
//! stream, say) find the broker again by themselves, as they would after a real restart.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::binary::strata_binary;
use crate::wait::DEADLINE;

/// One HTTP/1.1 GET of `path` with extra header lines (each ending in CRLF); the whole answer.
pub fn http_get(address: SocketAddr, path: &str, headers: &str) -> String {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(address).expect("connect");
    stream
        .set_read_timeout(Some(DEADLINE))
        .expect("read timeout");
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: strata\r\n{headers}\r\n").as_bytes())
        .expect("send the request");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("read the answer");
    text
}

/// How many lines of broker output are kept to print when a test fails.
const LOG_LINES_KEPT: usize = 4000;
/// How many of those are printed.
const LOG_LINES_SHOWN: usize = 200;
/// The marker the broker prints once it accepts connections (the contract with crates/server).
const LISTENING_MARKER: &str = "listening on ";

/// Where the broker keeps its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageKind {
    /// `file:///<temp dir>`: survives restarts, which crash and restart tests need.
    Directory,
    /// `memory://`: nothing survives the process.
    Memory,
}

/// How to start the broker, beyond the defaults every test needs.
#[derive(Debug, Clone)]
pub struct StrataOptions {
    pub storage: StorageKind,
    /// Written to a file passed as `--config`, if set.
    pub config_toml: Option<String>,
    /// More `strata serve` arguments.
    pub extra_args: Vec<String>,
    /// More environment for the broker process.
    pub env: Vec<(String, String)>,
    /// A storage URL to use instead of one derived from `storage` (several brokers sharing
    /// one storage as a cluster: see [`SharedStorage`]).
    pub storage_url: Option<String>,
    /// The group id the broker process runs under (see [`crate::cluster::BrokerHooks`]).
    pub gid: Option<u32>,
}

impl Default for StrataOptions {
    fn default() -> Self {
        Self {
            storage: StorageKind::Directory,
            config_toml: None,
            extra_args: Vec::new(),
            env: Vec::new(),
            storage_url: None,
            gid: None,
        }
    }
}

impl StrataOptions {
    pub fn with_config(mut self, toml: &str) -> Self {
        self.config_toml = Some(toml.to_string());
        self
    }

    pub fn with_args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, args: I) -> Self {
        self.extra_args.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn with_storage(mut self, storage: StorageKind) -> Self {
        self.storage = storage;
        self
    }

    /// Uses exactly this `--storage` URL (overrides `storage`), e.g. [`SharedStorage::url`].
    pub fn with_storage_url(mut self, url: impl Into<String>) -> Self {
        self.storage_url = Some(url.into());
        self
    }
}

/// One storage location for several brokers (a cluster), removed when dropped if it is a
/// local directory.
///
/// Without `STRATA_TEST_STORAGE` it is `file:///<temp dir>/store`; with it, a prefix (S3) or
/// namespace (RADOS) under that URL named after the temporary directory, so the cluster tests
/// run on every backend CI has and never see another test's objects.
pub struct SharedStorage {
    dir: TempDir,
    url: String,
    keep: bool,
}

impl SharedStorage {
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("strata-shared-")
            .tempdir()
            .expect("create a temporary shared storage directory");
        let url = match std::env::var("STRATA_TEST_STORAGE") {
            Ok(base) if !base.is_empty() => with_path_suffix(&base, &unique_name(dir.path())),
            _ => format!("file://{}", dir.path().join("store").display()),
        };
        Self {
            dir,
            url,
            keep: false,
        }
    }

    /// Leaves the data in place when dropped, for inspection after a failure found by the
    /// fault-injection harness (which does not panic, so the usual keep-on-panic rule misses it).
    pub fn keep(&mut self) {
        self.keep = true;
        self.dir.disable_cleanup(true);
    }

    /// The URL every broker of the cluster (and the `strata` admin commands) gets as `--storage`.
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Default for SharedStorage {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for SharedStorage {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        crate::cleanup::remove_test_objects(&self.url);
    }
}

/// The file name of `dir` reduced to ASCII letters and digits: a prefix or namespace name
/// every backend accepts.
pub fn unique_name(dir: &Path) -> String {
    dir.file_name()
        .map(|n| {
            n.to_string_lossy()
                .replace(|c: char| !c.is_ascii_alphanumeric(), "")
        })
        .unwrap_or_default()
}

/// `scheme://authority[/path][?query]` with `/suffix` appended to the path.
pub fn with_path_suffix(base: &str, suffix: &str) -> String {
    match base.split_once('?') {
        Some((head, query)) => format!("{}/{suffix}?{query}", head.trim_end_matches('/')),
        None => format!("{}/{suffix}", base.trim_end_matches('/')),
    }
}

/// The broker's stdout and stderr, interleaved as read, kept for failure reports.
#[derive(Default)]
struct OutputLog {
    lines: std::collections::VecDeque<String>,
}

impl OutputLog {
    fn push(&mut self, line: String) {
        if self.lines.len() == LOG_LINES_KEPT {
            self.lines.pop_front();
        }
        self.lines.push_back(line);
    }

    fn tail(&self, count: usize) -> String {
        let skip = self.lines.len().saturating_sub(count);
        let mut text = String::new();
        for line in self.lines.iter().skip(skip) {
            text.push_str(line);
            text.push('\n');
        }
        text
    }
}

/// A running (or stopped, between a kill and a restart) `strata serve` process.
///
/// Dropping it kills the process and removes the data directory. When the drop happens because
/// a test is panicking, the tail of the broker's output is printed first.
pub struct StrataProcess {
    options: StrataOptions,
    data_dir: TempDir,
    config_file: Option<PathBuf>,
    child: Option<Child>,
    addr: SocketAddr,
    /// Starts of this broker so far, to tell runs apart in the output log.
    generation: u32,
    output: Arc<Mutex<OutputLog>>,
}

impl StrataProcess {
    /// Starts a broker with directory storage and default settings.
    pub fn start() -> Self {
        Self::start_with(StrataOptions::default())
    }

    /// Starts a broker on port 0 and waits until it says where it listens.
    pub fn start_with(options: StrataOptions) -> Self {
        let data_dir = tempfile::Builder::new()
            .prefix("strata-test-")
            .tempdir()
            .expect("create a temporary data directory");
        let config_file = options.config_toml.as_ref().map(|toml| {
            let path = data_dir.path().join("strata-test.toml");
            std::fs::write(&path, toml).expect("write the broker config file");
            path
        });
        let mut process = Self {
            options,
            data_dir,
            config_file,
            child: None,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            generation: 0,
            output: Arc::default(),
        };
        process.spawn_and_wait_for_listener();
        process
    }

    /// `host:port` for a client's `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        self.addr.to_string()
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The broker's data directory (the storage root for [`StorageKind::Directory`]).
    pub fn data_dir(&self) -> &Path {
        self.data_dir.path()
    }

    /// The process id of the running broker.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the broker is not running").id()
    }

    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => child.try_wait().expect("poll the broker process").is_none(),
            None => false,
        }
    }

    /// The broker's exit status if it has exited (it is reaped then), `None` while it runs.
    /// Panics if it was never started or was already reaped by [`kill9`](Self::kill9) or
    /// [`sigterm`](Self::sigterm).
    pub fn try_exit_status(&mut self) -> Option<ExitStatus> {
        let child = self
            .child
            .as_mut()
            .expect("try_exit_status: the broker was already reaped");
        let status = child.try_wait().expect("poll the broker process")?;
        self.note(&format!("harness: broker exited by itself: {status}"));
        Some(status)
    }

    /// Freezes the broker with SIGSTOP (as a long GC pause or a stalled VM would), and
    /// returns only once every one of its threads has stopped (see [`crate::signals`]).
    pub fn pause(&mut self) {
        crate::signals::stop(self.pid_t(), "the broker");
        self.note("harness: broker paused with SIGSTOP (every thread stopped)");
    }

    /// Lets a broker frozen by [`pause`](Self::pause) run again with SIGCONT.
    pub fn resume(&mut self) {
        crate::signals::resume(self.pid_t(), "the broker");
        self.note("harness: broker resumed with SIGCONT");
    }

    /// The pid for kill(2). The Child still holds it unreaped, so it names our broker.
    fn pid_t(&self) -> libc::pid_t {
        libc::pid_t::try_from(self.pid()).expect("pid fits pid_t")
    }

    /// The address of the broker's HTTP endpoint (`--metrics-listen`), from its log.
    pub fn metrics_address(&self) -> SocketAddr {
        let line = self
            .log_lines_containing("metrics on ")
            .pop()
            .expect("the broker logged its metrics address");
        line.rsplit("metrics on ")
            .next()
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|address| address.parse().ok())
            .unwrap_or_else(|| panic!("no address in {line:?}"))
    }

    /// The value of one series (labels included) on the broker's /metrics, None if absent.
    pub fn metric(&self, series: &str) -> Option<f64> {
        let text = http_get(self.metrics_address(), "/metrics", "");
        let prefix = format!("{series} ");
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .map(|v| v.trim().parse().expect("a number"))
    }

    /// Every kept line of the broker's output (the last few thousand) that contains `needle`.
    pub fn log_lines_containing(&self, needle: &str) -> Vec<String> {
        self.output
            .lock()
            .map(|log| {
                log.lines
                    .iter()
                    .filter(|line| line.contains(needle))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Kills the broker with SIGKILL (no chance to flush anything) and reaps it.
    pub fn kill9(&mut self) {
        let mut child = self.child.take().expect("kill9: the broker is not running");
        // An already-exited child makes kill() fail; wait() below still reaps it.
        let _ = child.kill();
        child.wait().expect("reap the killed broker");
        self.note("harness: broker killed with SIGKILL");
    }

    /// Sends SIGTERM and waits for the broker to exit, returning its exit status. Panics if it
    /// is still running after the deadline (it is then killed).
    pub fn sigterm(&mut self) -> ExitStatus {
        let mut child = self
            .child
            .take()
            .expect("sigterm: the broker is not running");
        let pid = libc::pid_t::try_from(child.id()).expect("pid fits pid_t");
        // SAFETY: kill(2) with a pid we spawned and have not reaped yet cannot hit another
        // process, and has no memory-safety preconditions.
        let sent = unsafe { libc::kill(pid, libc::SIGTERM) };
        assert_eq!(
            sent,
            0,
            "kill(SIGTERM) failed: {}",
            std::io::Error::last_os_error()
        );
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = child.try_wait().expect("poll the broker process") {
                self.note(&format!("harness: broker exited after SIGTERM: {status}"));
                return status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "the broker did not exit within {DEADLINE:?} of SIGTERM\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends SIGTERM and returns at once, so that several brokers can be stopped together;
    /// [`wait_for_exit`](Self::wait_for_exit) then reaps it.
    pub fn send_sigterm(&mut self) {
        // SAFETY: as in `sigterm`: a pid we spawned and have not reaped.
        let sent = unsafe { libc::kill(self.pid_t(), libc::SIGTERM) };
        assert_eq!(
            sent,
            0,
            "kill(SIGTERM) failed: {}",
            std::io::Error::last_os_error()
        );
        self.note("harness: SIGTERM sent");
    }

    /// Waits until the broker has exited and reaps it; `None` (it keeps running) if it has
    /// not within `timeout`.
    pub fn wait_for_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let child = self
                .child
                .as_mut()
                .expect("wait_for_exit: the broker is not running");
            if let Some(status) = child.try_wait().expect("poll the broker process") {
                self.child = None;
                self.note(&format!("harness: broker exited: {status}"));
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the broker again after [`kill9`](Self::kill9) or [`sigterm`](Self::sigterm), on
    /// the same data directory and the same port.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "restart: stop the broker first");
        self.spawn_and_wait_for_listener();
    }

    /// The tail of everything the broker printed, for failure messages.
    pub fn log_tail(&self) -> String {
        self.output
            .lock()
            .map(|log| log.tail(LOG_LINES_SHOWN))
            .unwrap_or_default()
    }

    /// A field of `/proc/<pid>/status` in bytes (`VmPeak`, `VmRSS`, `VmHWM`, ...).
    pub fn proc_status_bytes(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("read /proc/<pid>/status");
        let line = status
            .lines()
            .find(|l| l.starts_with(&format!("{field}:")))
            .unwrap_or_else(|| panic!("no {field} in /proc/<pid>/status"));
        let kib: u64 = line
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("cannot parse {line:?}"));
        kib * 1024
    }

    fn storage_url(&self) -> String {
        if let Some(url) = &self.options.storage_url {
            return url.clone();
        }
        match self.options.storage {
            // STRATA_TEST_STORAGE reruns every durable-storage test on another backend (CI
            // runs the suite on S3 and on RADOS too): each broker gets its own prefix (S3) or
            // namespace (RADOS) under that URL, named after its temporary directory, so a
            // restart finds its data again and tests never see each other's objects.
            StorageKind::Directory => match std::env::var("STRATA_TEST_STORAGE") {
                Ok(base) if !base.is_empty() => {
                    with_path_suffix(&base, &unique_name(self.data_dir.path()))
                }
                // The path is absolute, so this is file:///tmp/...
                _ => format!("file://{}", self.data_dir.path().join("store").display()),
            },
            StorageKind::Memory => "memory://".to_string(),
        }
    }

    fn note(&self, line: &str) {
        if let Ok(mut log) = self.output.lock() {
            log.push(line.to_string());
        }
    }

    fn spawn_and_wait_for_listener(&mut self) {
        self.generation += 1;
        let listen = self.addr.to_string();
        let mut command = Command::new(strata_binary());
        command
            .arg("serve")
            .arg("--listen")
            .arg(&listen)
            .arg("--storage")
            .arg(self.storage_url());
        if matches!(self.options.storage, StorageKind::Memory) {
            // Losing everything on exit is the point of these brokers.
            command.arg("--ephemeral-storage-ok");
        }
        if let Some(config) = &self.config_file {
            command.arg("--config").arg(config);
        }
        if let Some(gid) = self.options.gid {
            std::os::unix::process::CommandExt::gid(&mut command, gid);
        }
        // The listening line is logged at info; STRATA_TEST_LOG=debug shows more on failures.
        let log_filter = std::env::var("STRATA_TEST_LOG").unwrap_or_else(|_| "info".to_string());
        command.arg("--log-level").arg(log_filter);
        // Hermetic: settings a developer or CI exported for their own broker (STRATA_STORAGE,
        // STRATA_LOG_*, ...) must not leak into the tests' brokers.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("STRATA_") {
                command.env_remove(name);
            }
        }
        command
            .args(&self.options.extra_args)
            // Plain text: the listening line is parsed, and escape codes would get in the way.
            .env("NO_COLOR", "1")
            .envs(self.options.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        self.note(&format!(
            "harness: starting broker #{} with {command:?}",
            self.generation
        ));
        let mut child = command.spawn().expect("spawn the strata binary");
        let (found_tx, found_rx) = mpsc::channel();
        let label = format!("#{}", self.generation);
        forward_output(
            child.stdout.take(),
            format!("{label} out"),
            &self.output,
            found_tx.clone(),
        );
        forward_output(
            child.stderr.take(),
            format!("{label} err"),
            &self.output,
            found_tx,
        );
        self.child = Some(child);
        self.addr = self.wait_for_listening_line(&found_rx);
        self.note(&format!(
            "harness: broker #{} listens on {}",
            self.generation, self.addr
        ));
    }

    fn wait_for_listening_line(&mut self, found: &mpsc::Receiver<SocketAddr>) -> SocketAddr {
        let deadline = Instant::now() + DEADLINE;
        loop {
            match found.recv_timeout(Duration::from_millis(50)) {
                Ok(addr) => return addr,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                // Both output streams closed: the process is gone or about to be.
                Err(mpsc::RecvTimeoutError::Disconnected) => {}
            }
            let child = self.child.as_mut().expect("child was just spawned");
            if let Some(status) = child.try_wait().expect("poll the broker process") {
                self.child = None;
                panic!(
                    "the broker exited ({status}) before printing {LISTENING_MARKER:?}\n{}",
                    self.log_tail()
                );
            }
            if Instant::now() >= deadline {
                panic!(
                    "the broker printed no {LISTENING_MARKER:?}HOST:PORT line within {DEADLINE:?}\n{}",
                    self.log_tail()
                );
            }
        }
    }
}

impl Drop for StrataProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // A storage handed in (a cluster's SharedStorage) is cleaned up by its owner.
        if self.options.storage_url.is_none() {
            crate::cleanup::remove_test_objects(&self.storage_url());
        }
        if std::thread::panicking() {
            eprintln!(
                "---- strata broker output (last {LOG_LINES_SHOWN} lines, data dir {}) ----\n{}----",
                self.data_dir.path().display(),
                self.log_tail()
            );
        }
    }
}

/// Copies one output stream of the broker into the log, line by line, and reports the address
/// of the first listening line it sees.
fn forward_output<R: Read + Send + 'static>(
    stream: Option<R>,
    label: String,
    output: &Arc<Mutex<OutputLog>>,
    found: mpsc::Sender<SocketAddr>,
) {
    let Some(stream) = stream else { return };
    let output = Arc::clone(output);
    std::thread::spawn(move || {
        let mut reported = false;
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            if !reported {
                if let Some(addr) = parse_listening_addr(&line) {
                    reported = true;
                    // The receiver is gone once the harness stopped waiting; nothing to do.
                    let _ = found.send(addr);
                }
            }
            if let Ok(mut log) = output.lock() {
                log.push(format!("[{label}] {line}"));
            }
        }
    });
}

/// The address in a line containing `listening on HOST:PORT`, ignoring ANSI colour codes and
/// whatever punctuation or fields a log formatter puts after it.
pub fn parse_listening_addr(line: &str) -> Option<SocketAddr> {
    let plain = strip_ansi(line);
    let start = plain.find(LISTENING_MARKER)? + LISTENING_MARKER.len();
    let candidate: String = plain[start..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | ':' | '[' | ']'))
        .collect();
    candidate.trim_end_matches([':', '.']).parse().ok()
}

fn strip_ansi(line: &str) -> String {
    let mut plain = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI sequence: ESC [ params... final byte in '@'..='~'.
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) && c != '[' {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_line_is_parsed_from_plain_and_coloured_logs() {
        let expected: SocketAddr = "127.0.0.1:40123".parse().unwrap();
        for line in [
            "listening on 127.0.0.1:40123",
            "2026-11-29T10:00:00Z  INFO strata: listening on 127.0.0.1:40123",
            "\u{1b}[32m INFO\u{1b}[0m strata::serve: listening on 127.0.0.1:40123 node_id=1",
            "INFO listening on 127.0.0.1:40123, storage file:///tmp/x",
        ] {
            assert_eq!(parse_listening_addr(line), Some(expected), "{line}");
        }
        assert_eq!(parse_listening_addr("starting up"), None);
    }
}

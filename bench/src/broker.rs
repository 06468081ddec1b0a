//! Starting and stopping a `strata serve` child process for one benchmark run.
//!
//! The broker is started on port 0 so runs never collide with another broker on the machine; it
//! logs a line containing `listening on 127.0.0.1:PORT` once it accepts connections (the same
//! contract the end-to-end tests rely on), and that line is how we learn the port.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};

use crate::clock;

/// The marker the broker prints once it accepts connections.
const LISTENING_MARKER: &str = "listening on ";
/// How long a broker may take to start listening (recovery of a large local directory included).
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Broker output lines kept in memory to explain a failed start when no log file was asked for.
const OUTPUT_LINES_KEPT: usize = 50;

/// A running broker; dropping it kills the process.
pub struct SpawnedBroker {
    child: Child,
    bootstrap: String,
}

/// Where the broker's output goes: a file the user asked for, and always the last few lines.
struct OutputSink {
    file: Option<File>,
    tail: VecDeque<String>,
}

impl OutputSink {
    fn push(&mut self, line: &str) {
        if let Some(file) = &mut self.file {
            // Losing a log line is not worth failing a benchmark over.
            let _ = writeln!(file, "{line}");
        }
        if self.tail.len() == OUTPUT_LINES_KEPT {
            self.tail.pop_front();
        }
        self.tail.push_back(line.to_string());
    }
}

impl SpawnedBroker {
    /// Runs `<bin> serve --listen 127.0.0.1:0 --storage <storage> <extra_args...>` and waits until
    /// it says where it listens.
    pub fn start(
        bin: &Path,
        storage: &str,
        extra_args: &[String],
        env: &[(String, String)],
        log_file: Option<&Path>,
    ) -> Result<Self> {
        let file = log_file
            .map(|path| {
                File::create(path)
                    .with_context(|| format!("create broker log file {}", path.display()))
            })
            .transpose()?;
        // A benchmark broker's data is thrown away after the run anyway; memory:// must be
        // allowed explicitly, since it loses acknowledged records.
        let ephemeral: &[&str] = if storage.starts_with("memory://") {
            &["--ephemeral-storage-ok"]
        } else {
            &[]
        };
        let mut child = Command::new(bin)
            .arg("serve")
            .args(["--listen", "127.0.0.1:0", "--storage", storage])
            .args(ephemeral)
            .args(extra_args)
            // The listening line is parsed; colour codes would only get in the way.
            .env("NO_COLOR", "1")
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("start {}", bin.display()))?;

        let sink = Arc::new(Mutex::new(OutputSink {
            file,
            tail: VecDeque::new(),
        }));
        let (addr_tx, addr_rx) = mpsc::channel::<String>();
        // Both pipes are drained for the broker's whole life: a broker blocked on a full pipe
        // would be measured as a slow broker.
        if let Some(stdout) = child.stdout.take() {
            drain(stdout, Arc::clone(&sink), addr_tx.clone());
        }
        if let Some(stderr) = child.stderr.take() {
            drain(stderr, Arc::clone(&sink), addr_tx);
        }

        let deadline = clock::now() + START_TIMEOUT;
        let bootstrap = loop {
            match addr_rx.recv_timeout(Duration::from_millis(100)) {
                Ok(addr) => break addr,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    // Both pipes closed without the marker: the process is exiting.
                    let _ = child.wait();
                    bail!("the broker exited before listening:\n{}", tail(&sink));
                }
            }
            if let Ok(Some(status)) = child.try_wait() {
                bail!(
                    "the broker exited ({status}) before listening:\n{}",
                    tail(&sink)
                );
            }
            if clock::remaining(deadline).is_zero() {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "the broker did not log `{LISTENING_MARKER}ADDR` within {START_TIMEOUT:?}:\n{}",
                    tail(&sink)
                );
            }
        };
        Ok(Self { child, bootstrap })
    }

    /// `host:port` for `bootstrap.servers`.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for SpawnedBroker {
    fn drop(&mut self) {
        // Nothing the broker holds matters after the run (memory storage is gone anyway; a
        // local directory is the user's to keep or delete), so no graceful shutdown is needed.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The default broker binary: `strata` next to this executable, i.e. `target/release/strata`
/// when the benchmark itself was built with `cargo build --release`.
pub fn default_binary() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locate the strata-bench executable")?;
    let dir = exe
        .parent()
        .ok_or_else(|| anyhow!("{} has no parent directory", exe.display()))?;
    let bin = dir.join("strata");
    if !bin.exists() {
        bail!(
            "{} does not exist: build it with `cargo build --release -p strata` or pass --strata-bin",
            bin.display()
        );
    }
    Ok(bin)
}

fn tail(sink: &Mutex<OutputSink>) -> String {
    match sink.lock() {
        Ok(sink) => sink.tail.iter().fold(String::new(), |mut text, line| {
            text.push_str("  | ");
            text.push_str(line);
            text.push('\n');
            text
        }),
        Err(_) => String::new(),
    }
}

/// Reads `pipe` line by line on its own thread until the broker closes it, sending the address
/// from the first listening line.
fn drain(
    pipe: impl Read + Send + 'static,
    sink: Arc<Mutex<OutputSink>>,
    addr: mpsc::Sender<String>,
) {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut raw = Vec::new();
        let mut announced = false;
        loop {
            raw.clear();
            match reader.read_until(b'\n', &mut raw) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            // Log lines are text, but a stray invalid byte must not stop the draining.
            let line = strip_ansi(String::from_utf8_lossy(&raw).trim_end());
            if !announced {
                if let Some(found) = listening_address(&line) {
                    announced = true;
                    let _ = addr.send(found);
                }
            }
            if let Ok(mut sink) = sink.lock() {
                sink.push(&line);
            }
        }
    });
}

/// `127.0.0.1:PORT` from a line containing `listening on 127.0.0.1:PORT` (possibly followed by
/// more text, or quoted by a structured logger).
fn listening_address(line: &str) -> Option<String> {
    let start = line.find(LISTENING_MARKER)? + LISTENING_MARKER.len();
    let addr: String = line[start..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | ':' | '[' | ']' | '-'))
        .collect();
    addr.contains(':').then_some(addr)
}

/// Removes terminal colour sequences (`ESC [ ... letter`), in case the logger adds them even
/// to a pipe.
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_address_in_a_log_line() {
        let line = "2026-01-01T00:00:00Z  INFO strata: listening on 127.0.0.1:40123 node=0";
        assert_eq!(listening_address(line).as_deref(), Some("127.0.0.1:40123"));
        assert_eq!(listening_address("listening on nothing"), None);
    }

    #[test]
    fn strips_colour_codes() {
        let line = "\u{1b}[32m INFO\u{1b}[0m listening on \u{1b}[1m127.0.0.1:9\u{1b}[0m";
        assert_eq!(
            listening_address(&strip_ansi(line)).as_deref(),
            Some("127.0.0.1:9")
        );
    }
}

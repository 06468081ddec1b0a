//! Running external client programs (kcat, python3) with a deadline.

use std::io::{Read, Write};
use std::process::{Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What a finished command printed.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// Panics with the command's output unless it exited 0.
    pub fn assert_success(&self, what: &str) {
        assert!(
            self.status.success(),
            "{what} exited with {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
    }
}

/// Whether `program` can be run at all (it is on PATH).
pub fn is_installed(program: &str) -> bool {
    Command::new(program)
        .arg("-h")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Runs `command` with `stdin` as its input; panics (after killing it) if it has not exited
/// within `timeout`, showing what it printed so far.
pub fn run_with_deadline(mut command: Command, stdin: &[u8], timeout: Duration) -> Finished {
    let description = format!("{command:?}");
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {description}: {e}"));
    let input = stdin.to_vec();
    let mut child_stdin = child.stdin.take().expect("piped stdin");
    // Written from a thread so a child that does not read its input cannot block us; closing
    // it (the drop) is the end of input.
    let writer = std::thread::spawn(move || {
        let _ = child_stdin.write_all(&input);
    });
    let stdout = collect(child.stdout.take());
    let stderr = collect(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().expect("poll the child") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{description} did not finish within {timeout:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
                join(stdout),
                join(stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = writer.join();
    Finished {
        status,
        stdout: join(stdout),
        stderr: join(stderr),
    }
}

fn collect<R: Read + Send + 'static>(stream: Option<R>) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = Vec::new();
        if let Some(mut stream) = stream {
            let _ = stream.read_to_end(&mut text);
        }
        String::from_utf8_lossy(&text).into_owned()
    })
}

fn join(reader: JoinHandle<String>) -> String {
    reader.join().unwrap_or_default()
}

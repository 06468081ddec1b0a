//! The README's five-minute tour, run as written: the first `sh` block under "A five-minute
//! tour" is read from README.md and each command is run with bash, in order, so a tour that
//! stops working fails here instead of in a new user's terminal.
//!
//! What the test changes, and nothing else: the addresses and the directory become free ports
//! and a temporary directory; `strata` is this build's binary (first on PATH), so the build
//! line is skipped; a line ending in `&` starts a background broker the test waits for (until it
//! logs `listening on`) and stops at `kill %…`. After the lines that show something, the test
//! checks it: the lag the tour promises, the same lag in the console's API, and the partition
//! on its new owner after the move.

// A failed expectation in a test is a panic; helpers here are test code too.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Deadlines against real processes need the real clock.
#![allow(clippy::disallowed_methods)]

use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use strata_tests::binary::strata_binary;
use strata_tests::command::{is_installed, run_with_deadline, Finished};
use strata_tests::wait::{wait_until, DEADLINE};

const STEP_DEADLINE: Duration = Duration::from_secs(120);

/// The tour's commands: the first `sh` block after the heading, continuation lines joined,
/// comments and blank lines dropped.
fn tour_commands() -> Vec<String> {
    let readme = include_str!("../../README.md");
    let section = readme
        .split("\n## A five-minute tour\n")
        .nth(1)
        .expect("README has a 'A five-minute tour' section");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("the tour has a sh block");
    let mut commands = Vec::new();
    let mut pending = String::new();
    for line in block.lines() {
        if let Some(head) = line.strip_suffix('\\') {
            pending.push_str(head);
            continue;
        }
        pending.push_str(line);
        let command = std::mem::take(&mut pending);
        // A trailing comment explains the line to a reader; it is not part of the command.
        let command = match command.find("   #") {
            Some(at) => command[..at].trim_end().to_string(),
            None => command.trim().to_string(),
        };
        if !command.is_empty() && !command.starts_with('#') {
            commands.push(command);
        }
    }
    commands
}

/// A port nothing listens on now, on `host`.
fn free_port(host: &str) -> u16 {
    TcpListener::bind((host, 0))
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Background brokers, stopped when the test ends however it ends.
struct Background {
    children: Vec<(Child, std::path::PathBuf)>,
}

impl Background {
    fn stop(&mut self) {
        for (child, _) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.children.clear();
    }

    fn logs(&self) -> String {
        self.children
            .iter()
            .map(|(_, log)| std::fs::read_to_string(log).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n----\n")
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("brokers' output:\n{}", self.logs());
        }
        self.stop();
    }
}

/// GET `path` from the console at `address`, as JSON.
fn console_get(address: &str, path: &str) -> serde_json::Value {
    let mut stream = TcpStream::connect(address).expect("connect to the console");
    stream.set_read_timeout(Some(DEADLINE)).expect("timeout");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("read");
    let body = text
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no body in {text:?}"));
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

fn total_lag(output: &Finished) -> Option<i64> {
    output
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("total lag: "))
        .and_then(|n| n.trim().parse().ok())
}

#[test]
fn the_readme_tour_runs_as_written() {
    assert!(
        is_installed("kcat"),
        "the tour needs kcat (Debian package kcat)"
    );
    let binary = strata_binary();
    let bin_dir = binary.parent().expect("the binary's directory");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let storage = dir.path().join("tour");
    let broker1 = format!("127.0.0.1:{}", free_port("127.0.0.1"));
    let broker2 = format!("127.0.0.2:{}", free_port("127.0.0.2"));
    let console = format!("127.0.0.1:{}", free_port("127.0.0.1"));
    let rewrite = |command: &str| {
        command
            .replace("127.0.0.1:9092", &broker1)
            .replace("127.0.0.2:9092", &broker2)
            .replace("127.0.0.1:9300", &console)
            .replace("/tmp/strata-tour", &storage.display().to_string())
    };
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let shell = |command: &str| {
        let mut c = Command::new("bash");
        c.arg("-c").arg(command).current_dir(dir.path());
        // A developer's broker settings must not change what the tour does; the CLI finds
        // the tour's first broker as it would find 127.0.0.1:9092.
        for (key, _) in std::env::vars() {
            if key.starts_with("STRATA_") {
                c.env_remove(key);
            }
        }
        c.env("PATH", &path)
            .env("STRATA_BOOTSTRAP_SERVER", &broker1);
        c
    };

    let commands = tour_commands();
    assert!(
        commands.len() >= 8,
        "the tour looks cut short: {commands:?}"
    );
    let mut background = Background {
        children: Vec::new(),
    };
    let mut lag_checks = 0;
    for command in &commands {
        if command.starts_with("cargo build") {
            continue; // the test runs this build's binary
        }
        if command.starts_with("kill %") {
            background.stop();
            continue;
        }
        let command = rewrite(command);
        eprintln!("$ {command}");
        if let Some(foreground) = command.strip_suffix('&') {
            let log = dir
                .path()
                .join(format!("broker-{}.log", background.children.len() + 1));
            let out = File::create(&log).expect("a log file");
            let err = out.try_clone().expect("the log file again");
            let child = shell(&format!("exec {}", foreground.trim()))
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err)
                .spawn()
                .expect("start a broker");
            background.children.push((child, log.clone()));
            wait_until(&format!("`{foreground}` to listen"), DEADLINE, || {
                std::fs::read_to_string(&log)
                    .ok()
                    .filter(|text| text.contains("listening on"))
            });
            continue;
        }
        let finished = run_with_deadline(shell(&command), b"", STEP_DEADLINE);
        finished.assert_success(&command);
        eprint!("{}", finished.stdout);

        if command.starts_with("strata group lag tour-readers") {
            // The tour reads 40 of partition 0's 100 records, and the move in between
            // changes nothing about the group's position.
            assert_eq!(
                total_lag(&finished),
                Some(60),
                "the tour promises 60 records of lag:\n{}",
                finished.stdout
            );
            lag_checks += 1;
            // "shows the same lag under Groups": the console's data for that page.
            let groups = console_get(&console, "/api/groups");
            let tour = groups["groups"]
                .as_array()
                .and_then(|all| all.iter().find(|g| g["group"] == "tour-readers"))
                .unwrap_or_else(|| panic!("the console lists no tour-readers: {groups}"));
            assert_eq!(tour["lag"]["total_lag"], 60, "{tour}");
        }
        if command.starts_with("strata topic describe tour") {
            let described = run_with_deadline(
                shell("strata topic describe tour --json"),
                b"",
                STEP_DEADLINE,
            );
            described.assert_success("strata topic describe tour --json");
            let json: serde_json::Value =
                serde_json::from_str(&described.stdout).expect("describe --json is JSON");
            let partition0 = json["partitions"]
                .as_array()
                .and_then(|ps| ps.iter().find(|p| p["partition"] == 0))
                .unwrap_or_else(|| panic!("no partition 0 in {json}"));
            assert_eq!(partition0["leader"], 2, "moved to broker 2: {json}");
            assert_eq!(partition0["log_end_offset"], 100, "nothing lost: {json}");
        }
    }
    assert_eq!(
        lag_checks, 2,
        "the tour shows the lag before and after the move"
    );
    assert!(
        background.children.is_empty(),
        "the tour ends by stopping its brokers"
    );
    assert!(
        Path::new(&storage).is_dir(),
        "the brokers kept their data in the tour's directory"
    );
}

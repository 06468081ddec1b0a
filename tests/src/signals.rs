//! Freezing and thawing a process with SIGSTOP and SIGCONT, for tests that simulate a stalled
//! machine (a broker past its lease, a storage server that stops answering).
//!
//! `kill(pid, SIGSTOP)` returns before the process has stopped. For a process with several
//! threads the kernel only queues the signal and wakes *one* thread (usually the main thread);
//! the group stop begins when that thread gets a CPU and takes the signal, and only then are
//! the other threads told to stop. On a busy two-core machine that can take milliseconds, and
//! the other threads keep working meanwhile — a broker's tokio workers can read a request sent
//! "after" the SIGSTOP, write it to storage and acknowledge it once continued. A test that
//! reasons about what happens *while* the process is frozen must therefore wait until every
//! thread reports the stopped state, which [`stop`] does.

use std::path::Path;
use std::time::Duration;

use crate::wait::wait_until;

/// How long a SIGSTOP may take to stop every thread before the test gives up.
const STOP_DEADLINE: Duration = Duration::from_secs(10);

/// Sends SIGSTOP to `pid` and returns once every one of its threads is stopped.
pub fn stop(pid: libc::pid_t, what: &str) {
    send(pid, libc::SIGSTOP, "SIGSTOP", what);
    wait_until(
        &format!("every thread of {what} (pid {pid}) is stopped"),
        STOP_DEADLINE,
        || all_threads_stopped(pid).then_some(()),
    );
}

/// Sends SIGCONT to `pid`. Unlike SIGSTOP this takes effect for every thread before kill(2)
/// returns (the kernel wakes them all while queueing the signal), so there is nothing to wait
/// for.
pub fn resume(pid: libc::pid_t, what: &str) {
    send(pid, libc::SIGCONT, "SIGCONT", what);
}

fn send(pid: libc::pid_t, signal: libc::c_int, name: &str, what: &str) {
    // SAFETY: kill(2) with a valid signal number has no memory-safety preconditions; the
    // callers pass the pid of a child they have not reaped (or of a daemon they started), so
    // it cannot hit an unrelated process.
    let sent = unsafe { libc::kill(pid, signal) };
    assert_eq!(
        sent,
        0,
        "{name} to {what} (pid {pid}): {}",
        std::io::Error::last_os_error()
    );
}

/// Whether every thread of `pid` is in the stopped state (`T`), or already gone. A process
/// that has exited altogether counts as stopped: nothing of it runs any more.
fn all_threads_stopped(pid: libc::pid_t) -> bool {
    let tasks = Path::new("/proc").join(pid.to_string()).join("task");
    let Ok(entries) = std::fs::read_dir(&tasks) else {
        return true;
    };
    entries.flatten().all(|task| {
        // A thread that exited between the listing and this read runs no more either.
        std::fs::read_to_string(task.path().join("stat")).map_or(true, |stat| {
            matches!(thread_state(&stat), Some('T' | 'Z' | 'X'))
        })
    })
}

/// The state letter of a `/proc/<pid>/task/<tid>/stat` line. The command name in parentheses
/// may itself contain spaces and parentheses, so the state is found after the *last* `)`.
fn thread_state(stat: &str) -> Option<char> {
    let (_, after_name) = stat.rsplit_once(')')?;
    after_name.trim_start().chars().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_is_read_after_the_last_parenthesis_of_the_name() {
        assert_eq!(thread_state("42 (tokio-runtime-w) S 1 42 42"), Some('S'));
        assert_eq!(thread_state("42 (a) b) (c) T 1 42 42"), Some('T'));
        assert_eq!(thread_state("garbage"), None);
    }

    #[test]
    fn a_stopped_child_with_threads_is_seen_stopped_and_a_running_one_is_not() {
        // A real multi-threaded process: python with a few busy threads.
        let mut child = std::process::Command::new("python3")
            .args([
                "-c",
                "import threading\n\
                 def spin():\n    while True: pass\n\
                 for _ in range(3): threading.Thread(target=spin, daemon=True).start()\n\
                 threading.Event().wait()",
            ])
            .spawn()
            .expect("start python3");
        let pid = libc::pid_t::try_from(child.id()).expect("pid fits pid_t");
        wait_until("the child has four threads", STOP_DEADLINE, || {
            let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
            (tasks.count() >= 4).then_some(())
        });
        assert!(!all_threads_stopped(pid), "a running child is not stopped");
        stop(pid, "the test child");
        assert!(all_threads_stopped(pid));
        resume(pid, "the test child");
        wait_until("the child runs again", STOP_DEADLINE, || {
            (!all_threads_stopped(pid)).then_some(())
        });
        let _ = child.kill();
        child.wait().expect("reap the child");
    }
}

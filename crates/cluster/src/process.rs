//! Proving that an earlier incarnation's process is dead, so a broker restarted on the same
//! machine does not wait out its predecessor's lease.
//!
//! Liveness through storage alone can only ever *suspect* death: a registration that stopped
//! changing may belong to a paused process. That is why taking over a broker id normally waits
//! a whole lease. But the most common restart is the same broker on the same machine after a
//! crash (a supervisor restarting it), and there the operating system knows the answer: the
//! predecessor's process either still exists or it does not.
//!
//! Each registration records a [`ProcessIdentity`]: the kernel's boot id, the pid namespace,
//! the pid and the process start time. A newcomer that sees the same boot and namespace can
//! look the pid up: if no such process exists, or the pid now belongs to a process started at
//! another time (pid reuse), the predecessor is dead *for certain* and its registration may be
//! taken over at once. In any other case (another machine, another container, a machine that
//! rebooted, no `/proc`) nothing is proven and the lease decides, as before.
//!
//! Taking the registration over is not what fences the predecessor — sealing its write-ahead
//! stream is, and that stays as it is. The proof only removes the wait.

use std::fmt::Debug;

use serde::{Deserialize, Serialize};

/// Which process wrote a registration, in terms another process on the same machine can check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessIdentity {
    /// `/proc/sys/kernel/random/boot_id`: new on every boot, so pids are only compared within
    /// one boot of one machine.
    pub boot_id: String,
    /// `/proc/self/ns/pid` (e.g. `pid:[4026531836]`): pids mean something only inside their
    /// namespace; two containers on one machine share the boot id but not this.
    pub pid_namespace: String,
    pub pid: u32,
    /// Start time in clock ticks after boot (`/proc/<pid>/stat`, field 22), so a reused pid is
    /// not mistaken for the process that held it.
    pub start_ticks: u64,
}

/// The operating system's process table, as far as membership needs it. Injected, so the
/// simulation and unit tests decide what is provable.
pub trait ProcessTable: Send + Sync + Debug {
    /// Who we are, or None where that cannot be told (then nobody can prove our death).
    fn current(&self) -> Option<ProcessIdentity>;

    /// True only when `other` is certainly not running: same boot and pid namespace as us, and
    /// its pid is free or held by a process started at another time. False means unknown.
    fn is_gone(&self, other: &ProcessIdentity) -> bool;
}

/// Proves nothing: every takeover of an id waits a lease.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProcessTable;

impl ProcessTable for NoProcessTable {
    fn current(&self) -> Option<ProcessIdentity> {
        None
    }

    fn is_gone(&self, _other: &ProcessIdentity) -> bool {
        false
    }
}

/// The real process table, read from Linux's `/proc`. Elsewhere `current` is None.
#[derive(Debug, Clone, Copy, Default)]
pub struct OsProcessTable;

impl ProcessTable for OsProcessTable {
    fn current(&self) -> Option<ProcessIdentity> {
        let pid = std::process::id();
        Some(ProcessIdentity {
            boot_id: read_trimmed("/proc/sys/kernel/random/boot_id")?,
            pid_namespace: std::fs::read_link("/proc/self/ns/pid")
                .ok()?
                .to_string_lossy()
                .into_owned(),
            pid,
            start_ticks: start_ticks(pid)?,
        })
    }

    fn is_gone(&self, other: &ProcessIdentity) -> bool {
        let Some(me) = self.current() else {
            return false;
        };
        if me.boot_id != other.boot_id || me.pid_namespace != other.pid_namespace {
            return false;
        }
        if other.pid == me.pid {
            // Our own pid: the other is gone unless it is this very process (two incarnations
            // in one process, as in tests), which is alive by definition.
            return other.start_ticks != me.start_ticks;
        }
        match std::fs::read_to_string(format!("/proc/{}/stat", other.pid)) {
            Ok(stat) => match parse_stat(&stat) {
                // A zombie has exited (only its parent has not reaped it yet): it will never
                // write again.
                Some((state, ticks)) if ticks == other.start_ticks => matches!(state, 'Z' | 'X'),
                Some(_) => true,
                None => false,
            },
            // No such process. Any other error (permissions, a strange mount) proves nothing.
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        }
    }
}

fn read_trimmed(path: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

fn start_ticks(pid: u32) -> Option<u64> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?).map(|(_, t)| t)
}

/// The state (field 3) and start time (field 22) of `/proc/<pid>/stat`. The second field (the
/// command name, in parentheses) may itself contain spaces and parentheses, so counting starts
/// after the *last* `)`, where field 3 begins.
fn parse_stat(stat: &str) -> Option<(char, u64)> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ticks = fields.nth(22 - 4)?.parse().ok()?;
    Some((state, ticks))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_is_read_after_the_last_parenthesis() {
        let stat = "4242 (a (weird) name) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 777 20";
        assert_eq!(parse_stat(stat), Some(('S', 777)));
        assert_eq!(parse_stat("4242 (short) S 1 2"), None);
        assert_eq!(parse_stat("no parenthesis"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_is_alive_and_a_child_that_exited_is_gone() {
        let table = OsProcessTable;
        let me = table.current().expect("identity on linux");
        assert!(!table.is_gone(&me));

        let mut child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .expect("spawn sleep");
        let pid = child.id();
        let child_identity = ProcessIdentity {
            pid,
            start_ticks: start_ticks(pid).expect("child start time"),
            ..me.clone()
        };
        assert!(!table.is_gone(&child_identity));
        child.kill().expect("kill");
        child.wait().expect("wait");
        assert!(table.is_gone(&child_identity));

        // A live pid with another start time is a reused pid: the recorded process is gone.
        let reused = ProcessIdentity {
            start_ticks: me.start_ticks + 1,
            ..me.clone()
        };
        assert!(table.is_gone(&reused));

        // Another boot or another pid namespace proves nothing.
        let elsewhere = ProcessIdentity {
            boot_id: "another-boot".into(),
            ..child_identity.clone()
        };
        assert!(!table.is_gone(&elsewhere));
        let other_namespace = ProcessIdentity {
            pid_namespace: "pid:[1]".into(),
            ..child_identity
        };
        assert!(!table.is_gone(&other_namespace));
    }
}

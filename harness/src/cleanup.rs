//! What the faults change outside the harness's own processes (iptables rules, a mounted
//! tmpfs) and must be undone however the harness ends: by the owner's `Drop` on a normal exit or
//! a panic, and by [`on_signal`]'s handler on SIGINT/SIGTERM, where no destructor runs.

use std::path::PathBuf;
use std::sync::Mutex;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Undo {
    /// `iptables -D` of the DROP rule for this loopback port.
    DropRule(u16),
    /// `iptables -D` of this rule (chain first).
    Iptables(Vec<String>),
    Unmount(PathBuf),
}

impl Undo {
    /// Best effort: a failure is printed, since this runs while the harness is ending.
    pub fn run(&self) {
        let result = match self {
            Undo::DropRule(port) => crate::nemesis::iptables("-D", *port),
            Undo::Iptables(rule) => crate::storage::iptables_rule("-D", rule),
            Undo::Unmount(path) => unmount(path),
        };
        if let Err(error) = result {
            eprintln!("cleanup: {error}");
        }
    }
}

static PENDING: Mutex<Vec<Undo>> = Mutex::new(Vec::new());

pub fn register(undo: Undo) {
    if let Ok(mut pending) = PENDING.lock() {
        pending.push(undo);
    }
}

pub fn unregister(undo: &Undo) {
    if let Ok(mut pending) = PENDING.lock() {
        pending.retain(|u| u != undo);
    }
}

/// Undoes everything still registered, then exits 130, on the first SIGINT or SIGTERM.
pub fn on_signal(runtime: &tokio::runtime::Handle) {
    runtime.spawn(async {
        let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        else {
            return;
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        eprintln!("strata-harness: interrupted; undoing iptables rules and mounts");
        let pending = PENDING.lock().map(|p| p.clone()).unwrap_or_default();
        for undo in pending.iter().rev() {
            undo.run();
        }
        std::process::exit(130);
    });
}

fn unmount(path: &std::path::Path) -> Result<(), String> {
    let plain = std::process::Command::new("umount").arg(path).output();
    if matches!(&plain, Ok(out) if out.status.success()) {
        return Ok(());
    }
    // Busy (a broker still has a file open, e.g. after a Ctrl-C): detach it now, the kernel
    // frees it when the last file closes.
    let lazy = std::process::Command::new("umount")
        .arg("-l")
        .arg(path)
        .output()
        .map_err(|e| format!("cannot run umount: {e}"))?;
    if lazy.status.success() {
        Ok(())
    } else {
        Err(format!(
            "umount {}: {}",
            path.display(),
            String::from_utf8_lossy(&lazy.stderr).trim()
        ))
    }
}

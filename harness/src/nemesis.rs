//! The nemesis: one fault at a time, chosen by one seeded RNG, each healed before the next.
//!
//! The *choices* (which fault, which broker, which partition, how long) replay exactly from the
//! seed; the timing of the clients around them does not, which is why the history is kept.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use strata_tests::cluster::Cluster;
use strata_tests::wait::{wait_until, DEADLINE};

use crate::history::{Event, History};
use crate::storage::{iptables_rule, Mode, RadosCut, StorageProxy};
use crate::workload::MemberKiller;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// SIGKILL, down for half a lease to one and a half, restart on the same port: the
    /// restarted broker and the others (who judge it dead once its lease ran out) race to take
    /// its partitions over.
    Kill,
    /// SIGSTOP past the lease (the others fence it and take its partitions), then SIGCONT.
    Pause,
    /// SIGTERM (a clean shutdown) and restart.
    Restart,
    /// `strata partitions move` of a random partition to a random other broker.
    Move,
    /// `strata broker drain`, then SIGTERM and restart.
    Drain,
    /// Clients cut off from one broker (iptables DROP of packets to its port on loopback) for
    /// 1-3 leases. The broker still reaches the storage, so it keeps its lease and partitions:
    /// clients must wait, and nothing acknowledged may be lost. Opt-in (needs root and
    /// iptables); only the broker's own port is touched.
    Partition,
    /// The local storage (a tmpfs the harness mounted) filled up by a file for 1-3 leases, then
    /// the file is deleted: every broker's writes fail with ENOSPC meanwhile. Opt-in (root).
    Full,
    /// One broker loses the storage for 1-3 leases, the others do not: on S3 its storage proxy
    /// blackholes its connections, on RADOS iptables drops its traffic with the Ceph daemons
    /// (see [`crate::storage::RadosCut`]; needs root). Opt-in.
    StoragePartition,
    /// One broker's storage proxy delays every chunk by 50-300 ms for 1-3 leases. Opt-in, S3
    /// only.
    StorageSlow,
    /// One broker's storage proxy resets every connection, open or new, for 1-3 leases.
    /// Opt-in, S3 only.
    StorageErrors,
    /// A consumer-group member is destroyed without leaving the group (no LeaveGroup, no
    /// commit), as a crashed application would be, and a new member takes its place.
    ConsumerKill,
}

impl Fault {
    pub const ALL: [Fault; 11] = [
        Fault::Kill,
        Fault::Pause,
        Fault::Restart,
        Fault::Move,
        Fault::Drain,
        Fault::Partition,
        Fault::Full,
        Fault::StoragePartition,
        Fault::StorageSlow,
        Fault::StorageErrors,
        Fault::ConsumerKill,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Pause => "pause",
            Fault::Restart => "restart",
            Fault::Move => "move",
            Fault::Drain => "drain",
            Fault::Partition => "partition",
            Fault::Full => "full",
            Fault::StoragePartition => "storage-partition",
            Fault::StorageSlow => "storage-slow",
            Fault::StorageErrors => "storage-errors",
            Fault::ConsumerKill => "consumer-kill",
        }
    }

    /// Needs the S3 storage behind per-broker proxies.
    pub fn needs_proxies(self) -> bool {
        matches!(
            self,
            Fault::StoragePartition | Fault::StorageSlow | Fault::StorageErrors
        )
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|f| f.name() == text)
            .ok_or_else(|| {
                let known: Vec<&str> = Self::ALL.iter().map(|f| f.name()).collect();
                format!("unknown fault {text:?} (known: {})", known.join(", "))
            })
    }

    /// Relative frequency: the cheap, common faults more often than drains.
    fn weight(self) -> u32 {
        match self {
            Fault::Kill | Fault::Move => 3,
            Fault::Pause
            | Fault::Restart
            | Fault::Partition
            | Fault::Full
            | Fault::StoragePartition
            | Fault::StorageSlow
            | Fault::StorageErrors
            | Fault::ConsumerKill => 2,
            Fault::Drain => 1,
        }
    }
}

#[derive(Default, Clone, Copy)]
pub struct Tally {
    pub injected: usize,
    /// The fault's own command failed (a move or drain that timed out): reported, not an
    /// anomaly of the broker's guarantees.
    pub failed: usize,
    /// A paused broker that exited (fenced) after SIGCONT, or a broker that exited after this
    /// storage fault cut it off (found before the next fault).
    pub fenced: usize,
}

/// What the optional faults act on, beyond the cluster.
#[derive(Default)]
pub struct Targets {
    /// Each broker's storage proxy (S3 only).
    pub proxies: BTreeMap<i32, StorageProxy>,
    /// How to cut one broker off a RADOS cluster (`storage-partition` on RADOS only).
    pub rados_cut: Option<RadosCut>,
    /// The tmpfs the local storage lives on (`full` only).
    pub tmpfs: Option<PathBuf>,
    /// The consumer group's members.
    pub killer: Option<MemberKiller>,
    pub members: usize,
}

pub struct Nemesis {
    rng: StdRng,
    faults: Vec<Fault>,
    lease: Duration,
    topic: String,
    partitions: i32,
    targets: Targets,
    pub tally: BTreeMap<Fault, Tally>,
    /// Brokers that exited without being told to (outside a pause).
    pub unexpected_exits: Vec<String>,
    /// Per broker, the last storage fault it suffered in its current life and when that fault
    /// was healed (`full` hits every broker). A broker that lost the storage past its lease is
    /// fenced and exits, which is that fault's expected effect, not an unexpected exit; it
    /// often notices only after the fault healed and the next fault began, so the attribution
    /// cannot be to the latest fault alone (seeds 304 and 305 misreported four such exits).
    storage_faulted: BTreeMap<i32, (Fault, Instant)>,
    /// Brokers that did not come back, or a cluster that stopped answering: liveness failures.
    pub liveness: Vec<String>,
}

impl Nemesis {
    pub fn new(
        seed: u64,
        faults: Vec<Fault>,
        lease: Duration,
        topic: &str,
        partitions: i32,
        targets: Targets,
    ) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed),
            faults,
            lease,
            topic: topic.to_string(),
            partitions,
            targets,
            tally: BTreeMap::new(),
            unexpected_exits: Vec::new(),
            storage_faulted: BTreeMap::new(),
            liveness: Vec::new(),
        }
    }

    /// How long to leave the cluster alone before the next fault.
    pub fn next_gap(&mut self, mean: Duration) -> Duration {
        mean.mul_f64(self.rng.random_range(0.5..1.5))
    }

    /// Injects one fault and heals it.
    pub fn step(&mut self, cluster: &mut Cluster, history: &History) {
        self.revive_exited(cluster, history);
        if self.faults.is_empty() {
            return;
        }
        let total: u32 = self.faults.iter().map(|f| f.weight()).sum();
        let mut pick = self.rng.random_range(0..total);
        let mut fault = self.faults[0];
        for candidate in &self.faults {
            if pick < candidate.weight() {
                fault = *candidate;
                break;
            }
            pick -= candidate.weight();
        }
        let ids = cluster.all_ids();
        let victim = ids[self.rng.random_range(0..ids.len())];
        // Drawn whether used or not, so one fault's parameters never shift the next ones.
        let fraction: f64 = self.rng.random_range(0.0..1.0);
        let partition = self.rng.random_range(0..self.partitions);
        let target_pick = self.rng.random_range(0..ids.len().max(2) - 1);

        let member = usize::try_from(partition).unwrap_or(0) % self.targets.members.max(1);
        let detail = match fault {
            Fault::Move => format!("partition {partition}"),
            Fault::Full => "storage".to_string(),
            Fault::ConsumerKill => format!("member {member}"),
            _ => format!("broker {victim}"),
        };
        history.record(Event::Fault {
            kind: fault.name().to_string(),
            detail: detail.clone(),
        });
        self.tally.entry(fault).or_default().injected += 1;
        let lease = self.lease;
        let topic = self.topic.clone();
        let targets = &self.targets;
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| -> Result<String, String> {
            match fault {
                Fault::Kill => {
                    let broker = cluster.broker(victim);
                    broker.kill9();
                    let down = lease.mul_f64(0.5 + fraction);
                    std::thread::sleep(down);
                    broker.restart();
                    Ok(format!("down {} ms", down.as_millis()))
                }
                Fault::Pause => {
                    let frozen = lease.mul_f64(1.5 + 1.5 * fraction);
                    let broker = cluster.broker(victim);
                    broker.pause();
                    std::thread::sleep(frozen);
                    broker.resume();
                    // Fenced, it exits non-zero on its own; if it owned nothing it may live on.
                    let until = Instant::now() + 3 * lease;
                    let exited = wait_until(
                        "the resumed broker exits or the wait ends",
                        DEADLINE,
                        || match broker.try_exit_status() {
                            Some(status) => Some(Some(status)),
                            None => (Instant::now() >= until).then_some(None),
                        },
                    );
                    match exited {
                        Some(status) => {
                            broker.kill9();
                            broker.restart();
                            Ok(format!(
                                "frozen {} ms, exited after SIGCONT ({status}), restarted",
                                frozen.as_millis()
                            ))
                        }
                        None => Ok(format!(
                            "frozen {} ms, still running after SIGCONT",
                            frozen.as_millis()
                        )),
                    }
                }
                Fault::Restart => {
                    let broker = cluster.broker(victim);
                    let status = broker.sigterm();
                    broker.restart();
                    Ok(format!("exited {status} after SIGTERM"))
                }
                Fault::Move => {
                    let asked = ids[0];
                    let owner = cluster
                        .metadata_from(asked, Some(&topic))
                        .leaders
                        .get(&partition)
                        .copied()
                        .ok_or_else(|| format!("broker {asked} names no owner of {partition}"))?;
                    let others: Vec<i32> = ids.iter().copied().filter(|&i| i != owner).collect();
                    let target = others[target_pick % others.len()];
                    let (p, t) = (partition.to_string(), target.to_string());
                    let finished = cluster.admin_command(&[
                        "partitions",
                        "move",
                        &topic,
                        &p,
                        "--to",
                        &t,
                        "--timeout",
                        "20s",
                    ]);
                    if finished.status.success() {
                        Ok(finished.stdout.trim().to_string())
                    } else {
                        Err(format!(
                            "move {partition} from {owner} to {target}: {}",
                            finished.stderr.trim()
                        ))
                    }
                }
                Fault::Partition => {
                    let port = cluster.broker(victim).addr().port();
                    let held = lease.mul_f64(1.0 + 2.0 * fraction);
                    let rule = DropRule::insert(port)?;
                    std::thread::sleep(held);
                    rule.remove()?;
                    Ok(format!("port {port} dropped for {} ms", held.as_millis()))
                }
                Fault::Full => {
                    let dir = targets
                        .tmpfs
                        .as_deref()
                        .ok_or("the full fault needs the storage on the harness's tmpfs")?;
                    let held = lease.mul_f64(1.0 + 2.0 * fraction);
                    let (file, bytes) = crate::storage::fill(dir)?;
                    std::thread::sleep(held);
                    std::fs::remove_file(&file)
                        .map_err(|e| format!("remove {}: {e}", file.display()))?;
                    Ok(format!(
                        "filled with {} MiB for {} ms",
                        bytes >> 20,
                        held.as_millis()
                    ))
                }
                Fault::StoragePartition if targets.rados_cut.is_some() => {
                    let cut = targets.rados_cut.as_ref().ok_or("no RADOS cut")?;
                    let held = lease.mul_f64(1.0 + 2.0 * fraction);
                    let rules = cut.drop_rules(victim);
                    let remove = |rules: &[Vec<String>]| -> Result<(), String> {
                        let mut failed = Ok(());
                        for rule in rules {
                            crate::cleanup::unregister(&crate::cleanup::Undo::Iptables(
                                rule.clone(),
                            ));
                            if let Err(e) = iptables_rule("-D", rule) {
                                failed = Err(e);
                            }
                        }
                        failed
                    };
                    for (inserted, rule) in rules.iter().enumerate() {
                        if let Err(e) = iptables_rule("-I", rule) {
                            // Never leave half a cut behind.
                            let _ = remove(&rules[..inserted]);
                            return Err(e);
                        }
                        crate::cleanup::register(crate::cleanup::Undo::Iptables(rule.clone()));
                    }
                    std::thread::sleep(held);
                    remove(&rules)?;
                    Ok(format!(
                        "traffic with the Ceph daemons dropped for {} ms",
                        held.as_millis()
                    ))
                }
                Fault::StoragePartition | Fault::StorageSlow | Fault::StorageErrors => {
                    let proxy = targets
                        .proxies
                        .get(&victim)
                        .ok_or("storage faults need --storage s3://... (per-broker proxies)")?;
                    let held = lease.mul_f64(1.0 + 2.0 * fraction);
                    // The delay reuses the duration's draw, so no new draw shifts later faults.
                    let delay = Duration::from_millis(50 + (250.0 * fraction) as u64);
                    let (mode, what) = match fault {
                        Fault::StoragePartition => (Mode::Blackhole, "blackholed".to_string()),
                        Fault::StorageSlow => (
                            Mode::Slow(delay),
                            format!("delayed {} ms per chunk", delay.as_millis()),
                        ),
                        _ => (Mode::Reset, "reset".to_string()),
                    };
                    proxy.set(mode);
                    std::thread::sleep(held);
                    proxy.set(Mode::Forward);
                    Ok(format!(
                        "storage connections {what} for {} ms",
                        held.as_millis()
                    ))
                }
                Fault::ConsumerKill => {
                    let killer = targets
                        .killer
                        .as_ref()
                        .ok_or("no consumer group to kill members of")?;
                    killer.kill(member)
                }
                Fault::Drain => {
                    let id = victim.to_string();
                    let finished =
                        cluster.admin_command(&["broker", "drain", &id, "--timeout", "20s"]);
                    let broker = cluster.broker(victim);
                    let status = broker.sigterm();
                    broker.restart();
                    if finished.status.success() {
                        Ok(format!("drained, exited {status} after SIGTERM, restarted"))
                    } else {
                        Err(format!("drain {victim}: {}", finished.stderr.trim()))
                    }
                }
            }
        }));
        let healed = Instant::now();
        match fault {
            Fault::Full => {
                for id in &ids {
                    self.storage_faulted.insert(*id, (fault, healed));
                }
            }
            _ if fault.needs_proxies() => {
                self.storage_faulted.insert(victim, (fault, healed));
            }
            // A new incarnation: whatever storage fault its predecessor suffered is not its own.
            Fault::Kill | Fault::Restart | Fault::Drain => {
                self.storage_faulted.remove(&victim);
            }
            Fault::Pause if matches!(&outcome, Ok(Ok(done)) if done.contains("exited")) => {
                self.storage_faulted.remove(&victim);
            }
            _ => {}
        }
        let error = match outcome {
            Ok(Ok(done)) => {
                if fault == Fault::Pause && done.contains("exited") {
                    self.tally.entry(fault).or_default().fenced += 1;
                }
                history.record(Event::FaultDone {
                    kind: fault.name().to_string(),
                    detail: format!("{detail}: {done}"),
                    error: None,
                });
                return;
            }
            Ok(Err(failed)) => {
                self.tally.entry(fault).or_default().failed += 1;
                failed
            }
            Err(panic) => {
                let message = panic_message(&panic);
                self.liveness
                    .push(format!("{} {detail}: {message}", fault.name()));
                message
            }
        };
        history.record(Event::FaultDone {
            kind: fault.name().to_string(),
            detail,
            error: Some(error),
        });
    }

    /// Restarts every broker that has exited on its own (a fenced broker exits non-zero).
    pub fn revive_exited(&mut self, cluster: &mut Cluster, history: &History) {
        for id in cluster.all_ids() {
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
                let broker = cluster.broker(id);
                let status = broker.try_exit_status()?;
                // Why it exited, for the report: its last error line.
                let why = broker
                    .log_lines_containing("ERROR")
                    .pop()
                    .unwrap_or_default();
                broker.kill9();
                broker.restart();
                Some((status, why))
            }));
            match outcome {
                Ok(None) => {}
                Ok(Some((status, why))) => {
                    // Revived: a new incarnation from here on.
                    let faulted = self.storage_faulted.remove(&id);
                    if let Some((fault, healed)) = faulted {
                        if healed.elapsed() <= STORAGE_FAULT_AFTERMATH {
                            self.tally.entry(fault).or_default().fenced += 1;
                            history.record(Event::FaultDone {
                                kind: "revive".to_string(),
                                detail: format!(
                                    "broker {id} exited after losing the storage ({}, {status}); \
                                     restarted. Last error: {}",
                                    fault.name(),
                                    why.trim()
                                ),
                                error: None,
                            });
                            continue;
                        }
                    }
                    let text = format!(
                        "broker {id} exited on its own ({status}); restarted. Last error: {}",
                        why.trim()
                    );
                    history.record(Event::FaultDone {
                        kind: "revive".to_string(),
                        detail: text.clone(),
                        error: None,
                    });
                    self.unexpected_exits.push(text);
                }
                Err(panic) => self
                    .liveness
                    .push(format!("revive broker {id}: {}", panic_message(&panic))),
            }
        }
    }

    /// After the last fault: every broker runs and every partition has a live owner.
    pub fn heal(&mut self, cluster: &mut Cluster, history: &History) {
        // A broker cut off from the storage by the last faults finds out it was fenced only
        // once it reaches the storage again: give it the time a paused broker gets to exit,
        // so it is revived here rather than found dead by the liveness check (seed 304).
        let recent: Vec<i32> = self
            .storage_faulted
            .iter()
            .filter(|(_, (_, healed))| healed.elapsed() <= STORAGE_FAULT_AFTERMATH)
            .map(|(id, _)| *id)
            .collect();
        if !recent.is_empty() {
            let until = Instant::now() + 3 * self.lease;
            wait_until(
                "a storage-faulted broker exits or the wait ends",
                DEADLINE,
                || {
                    let exited = recent
                        .iter()
                        .any(|id| cluster.broker(*id).try_exit_status().is_some());
                    (exited || Instant::now() >= until).then_some(())
                },
            );
        }
        self.revive_exited(cluster, history);
        let ids = cluster.all_ids();
        let topic = self.topic.clone();
        let partitions = self.partitions;
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
            cluster.wait_for_leaders(
                ids[0],
                &topic,
                partitions,
                &ids,
                "every partition has a live owner after the faults",
            )
        }));
        if let Err(panic) = outcome {
            self.liveness
                .push(format!("heal: {}", panic_message(&panic)));
        }
    }
}

/// How long after a storage fault healed its broker's exit is still taken for the fault's
/// effect: the exit is noticed only at the next step, after the next gap and fault (a move may
/// take its whole 20 s timeout).
const STORAGE_FAULT_AFTERMATH: Duration = Duration::from_secs(30);

/// An iptables rule dropping every packet sent to `port` on loopback; removed when dropped, so
/// a panic between insert and remove cannot leave it behind.
struct DropRule {
    port: u16,
    removed: bool,
}

impl DropRule {
    fn insert(port: u16) -> Result<Self, String> {
        iptables("-I", port)?;
        crate::cleanup::register(crate::cleanup::Undo::DropRule(port));
        Ok(Self {
            port,
            removed: false,
        })
    }

    fn remove(mut self) -> Result<(), String> {
        self.removed = true;
        crate::cleanup::unregister(&crate::cleanup::Undo::DropRule(self.port));
        iptables("-D", self.port)
    }
}

impl Drop for DropRule {
    fn drop(&mut self) {
        if !self.removed {
            crate::cleanup::unregister(&crate::cleanup::Undo::DropRule(self.port));
            let _ = iptables("-D", self.port);
        }
    }
}

pub(crate) fn iptables(action: &str, port: u16) -> Result<(), String> {
    let rule = [
        "INPUT",
        "-i",
        "lo",
        "-p",
        "tcp",
        "--dport",
        &port.to_string(),
        "-j",
        "DROP",
    ];
    crate::storage::iptables_rule(action, &rule.map(String::from))
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    let text = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_string()))
        .unwrap_or_else(|| "panic".to_string());
    // The helpers append the broker's whole log tail; the first lines say what failed.
    text.lines().take(3).collect::<Vec<_>>().join(" / ")
}

//! What the machine was doing while a benchmark ran: load average and the CPU time used by the
//! benchmark process and by the broker process. On a 2-core machine shared with compilers the
//! numbers mean little without these, and per-process CPU shows which side is the bottleneck
//! (a client pegged at 100% of a core cannot push a broker any harder).

use std::time::Duration;

use serde::Serialize;

/// The 1, 5 and 15 minute load averages from `/proc/loadavg`, if readable (Linux only).
pub fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut fields = text.split_whitespace().map(str::parse::<f64>);
    Some([
        fields.next()?.ok()?,
        fields.next()?.ok()?,
        fields.next()?.ok()?,
    ])
}

/// Logical CPUs this process may run on.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// User + system CPU time consumed so far by process `pid` (all its threads), from
/// `/proc/<pid>/stat`. `None` if the process is gone or this is not Linux.
pub fn process_cpu_time(pid: u32) -> Option<Duration> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may itself contain spaces or ')', so
    // count fields from the last ')': state is field 3, utime field 14, stime field 15.
    let after_name = &text[text.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace().skip(14 - 3);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    let ticks_per_second = clock_ticks_per_second()?;
    Some(Duration::from_secs_f64(
        (utime + stime) as f64 / ticks_per_second as f64,
    ))
}

fn clock_ticks_per_second() -> Option<u64> {
    // SAFETY: sysconf has no preconditions; it only reads a system constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).ok().filter(|&t| t > 0)
}

/// CPU used by the benchmark and the broker during one phase, in percent of one core (200% =
/// both cores of a 2-core machine busy).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CpuUse {
    pub bench_percent: Option<f64>,
    pub broker_percent: Option<f64>,
}

/// CPU times at the start of a phase, to subtract at its end.
pub struct CpuMeter {
    broker_pid: Option<u32>,
    bench_start: Option<Duration>,
    broker_start: Option<Duration>,
}

impl CpuMeter {
    pub fn start(broker_pid: Option<u32>) -> Self {
        Self {
            broker_pid,
            bench_start: process_cpu_time(std::process::id()),
            broker_start: broker_pid.and_then(process_cpu_time),
        }
    }

    /// CPU used since `start`, over `elapsed` of wall time.
    pub fn finish(&self, elapsed: Duration) -> CpuUse {
        let percent = |start: Option<Duration>, pid: Option<u32>| -> Option<f64> {
            let end = process_cpu_time(pid?)?;
            let used = end.checked_sub(start?)?;
            let wall = elapsed.as_secs_f64();
            (wall > 0.0).then(|| 100.0 * used.as_secs_f64() / wall)
        };
        CpuUse {
            bench_percent: percent(self.bench_start, Some(std::process::id())),
            broker_percent: percent(self.broker_start, self.broker_pid),
        }
    }
}

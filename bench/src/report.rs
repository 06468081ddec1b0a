//! Results: latency summaries from histograms, the printed table, and the JSON document.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::system::CpuUse;

/// Largest latency a histogram holds exactly, in microseconds (one hour); larger samples are
/// clamped to it rather than dropped, so a stall still shows up as a huge maximum.
const MAX_LATENCY_US: u64 = 3_600_000_000;

/// A latency histogram in microseconds with 3 significant digits: 1 µs resolution below 1 ms,
/// 0.1% relative error above, in a few hundred KiB whatever the sample count.
pub fn new_histogram() -> Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).context("create a latency histogram")
}

/// Percentiles of one latency distribution, in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct LatencySummary {
    pub samples: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

impl LatencySummary {
    pub fn from_histogram(histogram: &Histogram<u64>) -> Option<Self> {
        if histogram.is_empty() {
            return None;
        }
        let ms = |micros: u64| micros as f64 / 1000.0;
        Some(Self {
            samples: histogram.len(),
            p50_ms: ms(histogram.value_at_quantile(0.50)),
            p99_ms: ms(histogram.value_at_quantile(0.99)),
            p999_ms: ms(histogram.value_at_quantile(0.999)),
            max_ms: ms(histogram.max()),
            mean_ms: histogram.mean() / 1000.0,
        })
    }
}

/// One measured phase (produce, consume, end-to-end).
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    pub name: String,
    /// Records that completed the phase (delivered, consumed, received).
    pub records: u64,
    /// Payload bytes of those records (keys, headers and batch overhead excluded).
    pub payload_bytes: u64,
    pub seconds: f64,
    pub records_per_second: f64,
    /// Payload megabytes (10^6 bytes) per second.
    pub megabytes_per_second: f64,
    /// Records that failed (delivery errors), or were expected and never arrived.
    pub failed: u64,
    pub latency: Option<LatencySummary>,
    pub cpu: CpuUse,
    /// Anything a reader needs to interpret the numbers.
    pub notes: Vec<String>,
}

impl Phase {
    pub fn new(
        name: &str,
        records: u64,
        record_size: usize,
        elapsed: Duration,
        cpu: CpuUse,
    ) -> Self {
        let seconds = elapsed.as_secs_f64();
        let payload_bytes = records.saturating_mul(record_size as u64);
        let per_second = |value: f64| if seconds > 0.0 { value / seconds } else { 0.0 };
        Self {
            name: name.to_string(),
            records,
            payload_bytes,
            seconds,
            records_per_second: per_second(records as f64),
            megabytes_per_second: per_second(payload_bytes as f64 / 1e6),
            failed: 0,
            latency: None,
            cpu,
            notes: Vec::new(),
        }
    }
}

/// Where the numbers came from.
#[derive(Debug, Clone, Serialize)]
pub struct Environment {
    pub cpus: usize,
    /// 1/5/15-minute load averages just before and just after the run.
    pub load_average_before: Option<[f64; 3]>,
    pub load_average_after: Option<[f64; 3]>,
    /// The broker measured (none for `disk`).
    pub bootstrap: Option<String>,
    /// Set when the benchmark started the broker itself.
    pub spawned_storage: Option<String>,
    pub broker_args: Vec<String>,
    pub broker_env: Vec<(String, String)>,
    pub client_config: Vec<(String, String)>,
    pub started_unix_seconds: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub benchmark: String,
    pub topic: Option<String>,
    pub settings: serde_json::Value,
    pub environment: Environment,
    pub phases: Vec<Phase>,
}

impl Report {
    /// The human-readable form.
    pub fn print_table(&self) {
        let env = &self.environment;
        println!();
        match &self.topic {
            Some(topic) => println!("strata-bench {} — topic {topic}", self.benchmark),
            None => println!("strata-bench {}", self.benchmark),
        }
        match (&env.bootstrap, &env.spawned_storage) {
            (Some(bootstrap), Some(storage)) => {
                let env_text: Vec<String> = env
                    .broker_env
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                println!(
                    "broker: spawned at {bootstrap} on {storage} {} {}",
                    env.broker_args.join(" "),
                    env_text.join(" ")
                );
            }
            (Some(bootstrap), None) => println!("broker: {bootstrap}"),
            (None, _) => {}
        }
        println!("settings: {}", settings_line(&self.settings));
        if !env.client_config.is_empty() {
            let extra: Vec<String> = env
                .client_config
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            println!("client overrides: {}", extra.join(" "));
        }
        println!(
            "machine: {} cpus, load average before {} / after {}",
            env.cpus,
            load_text(env.load_average_before),
            load_text(env.load_average_after)
        );
        println!();
        println!(
            "{:<22} {:>10} {:>8} {:>11} {:>7} {:>8} {:>8} {:>8} {:>8} {:>6} {:>6}",
            "phase",
            "records",
            "seconds",
            "records/s",
            "MB/s",
            "p50 ms",
            "p99 ms",
            "p99.9 ms",
            "max ms",
            "cpu:me",
            "broker"
        );
        for phase in &self.phases {
            let latency = |pick: fn(&LatencySummary) -> f64| {
                phase
                    .latency
                    .as_ref()
                    .map_or_else(|| "-".to_string(), |l| format!("{:.3}", pick(l)))
            };
            println!(
                "{:<22} {:>10} {:>8.3} {:>11} {:>7.1} {:>8} {:>8} {:>8} {:>8} {:>6} {:>6}",
                phase.name,
                phase.records,
                phase.seconds,
                thousands(phase.records_per_second),
                phase.megabytes_per_second,
                latency(|l| l.p50_ms),
                latency(|l| l.p99_ms),
                latency(|l| l.p999_ms),
                latency(|l| l.max_ms),
                percent_text(phase.cpu.bench_percent),
                percent_text(phase.cpu.broker_percent),
            );
        }
        for phase in &self.phases {
            if phase.failed > 0 {
                println!("{}: {} records FAILED or missing", phase.name, phase.failed);
            }
            for note in &phase.notes {
                println!("{}: {note}", phase.name);
            }
        }
        println!("(cpu = percent of one core over the phase; 100% = one core busy)");
    }

    /// Writes the JSON form to `path`, or to stdout for `-`.
    pub fn write_json(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).context("serialise the report")?;
        if path == Path::new("-") {
            let mut stdout = std::io::stdout().lock();
            writeln!(stdout, "{text}").context("write JSON to stdout")?;
        } else {
            std::fs::write(path, text + "\n")
                .with_context(|| format!("write {}", path.display()))?;
        }
        Ok(())
    }
}

/// `key=value` pairs of the settings object, flattened one level, for the table header.
fn settings_line(settings: &serde_json::Value) -> String {
    let mut parts = Vec::new();
    let mut push = |key: &str, value: &serde_json::Value| match value {
        serde_json::Value::Null => {}
        serde_json::Value::String(s) => parts.push(format!("{key}={s}")),
        other => parts.push(format!("{key}={other}")),
    };
    if let serde_json::Value::Object(map) = settings {
        for (key, value) in map {
            match value {
                serde_json::Value::Object(inner) => {
                    for (key, value) in inner {
                        push(key, value);
                    }
                }
                other => push(key, other),
            }
        }
    }
    parts.join(" ")
}

fn load_text(load: Option<[f64; 3]>) -> String {
    load.map_or_else(
        || "?".to_string(),
        |[one, five, fifteen]| format!("{one:.2} {five:.2} {fifteen:.2}"),
    )
}

fn percent_text(percent: Option<f64>) -> String {
    percent.map_or_else(|| "-".to_string(), |p| format!("{p:.0}%"))
}

/// 1234567.8 → "1,234,568".
fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(999.4), "999");
        assert_eq!(thousands(1000.0), "1,000");
        assert_eq!(thousands(1_234_567.8), "1,234,568");
    }

    #[test]
    fn percentiles_in_milliseconds() {
        let mut histogram = new_histogram().unwrap();
        for micros in 1..=1000 {
            histogram.record(micros).unwrap();
        }
        let summary = LatencySummary::from_histogram(&histogram).unwrap();
        assert_eq!(summary.samples, 1000);
        assert!((summary.p50_ms - 0.5).abs() < 0.001);
        assert!((summary.p99_ms - 0.99).abs() < 0.001);
        assert!((summary.max_ms - 1.0).abs() < 0.001);
        assert!(LatencySummary::from_histogram(&new_histogram().unwrap()).is_none());
    }
}

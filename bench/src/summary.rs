//! `summary`: the headline figures of a `bench/scripts/run-suite.sh` directory in one table,
//! and, given the directory of an earlier run (`--against`), how each moved.
//!
//! Runs repeated by the suite (`throughput-file-1`, `-2`, …) are one row: the median over the
//! repeats, with their range, because on a shared 2-core machine the spread says as much as
//! any one run. A change against the baseline is printed beside the figure; which direction is
//! worse depends on the column (fewer records a second, more milliseconds), and a change
//! within the two runs' combined spread is marked as such rather than called a regression.
//! Reads the JSON reports generically, so reports of older builds keep working. `--markdown`
//! prints every run and phase instead, as the Markdown tables of docs/BENCHMARKS.md.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;

use crate::cli::SummaryArgs;

pub fn run(args: &SummaryArgs) -> Result<()> {
    if args.markdown {
        println!("{}", markdown(&reports(&args.dir)?));
        return Ok(());
    }
    let now = load(&args.dir)?;
    anyhow::ensure!(
        !now.is_empty(),
        "no benchmark reports (*.json) in {}",
        args.dir.display()
    );
    let before = match &args.against {
        Some(dir) => Some(load(dir)?),
        None => None,
    };
    println!("{}", table(&now, before.as_ref()));
    Ok(())
}

/// Figures of one phase of one named run, over its repeats.
#[derive(Debug, Default, Clone, PartialEq)]
struct Figures {
    records_per_second: Vec<f64>,
    p50_ms: Vec<f64>,
    p99_ms: Vec<f64>,
}

/// (run name without its repeat number, phase name) → figures.
type Runs = BTreeMap<(String, String), Figures>;

/// Every report of `dir` by file name (without `.json`), sorted.
fn reports(dir: &Path) -> Result<BTreeMap<String, Value>> {
    let mut out = BTreeMap::new();
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("read the directory {}", dir.display()))?;
    for entry in entries {
        let path = entry?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        let text =
            std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
        let report: Value =
            serde_json::from_str(&text).with_context(|| format!("parse {}", path.display()))?;
        out.insert(stem.to_string(), report);
    }
    Ok(out)
}

fn load(dir: &Path) -> Result<Runs> {
    let mut runs = Runs::new();
    for (stem, report) in reports(dir)? {
        add_report(&mut runs, run_name(&stem), &report);
    }
    Ok(runs)
}

/// Every run's every phase as one Markdown table, the form docs/BENCHMARKS.md's tables take.
fn markdown(reports: &BTreeMap<String, Value>) -> String {
    let mut out = String::from(
        "| run | phase | records/s | MB/s | p50 ms | p99 ms | p99.9 ms | max ms | bench cpu \
         | broker cpu | load before |\n|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    let number = |value: Option<f64>, digits: usize| {
        value.map_or_else(|| "-".to_string(), |v| format!("{v:.digits$}"))
    };
    for (stem, report) in reports {
        let load = report
            .pointer("/environment/load_average_before/0")
            .and_then(Value::as_f64);
        for phase in report
            .get("phases")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let f = |pointer: &str| phase.pointer(pointer).and_then(Value::as_f64);
            out.push_str(&format!(
                "| {stem} | {} | {} | {} | {} | {} | {} | {} | {}% | {}% | {} |\n",
                phase.get("name").and_then(Value::as_str).unwrap_or("-"),
                number(f("/records_per_second"), 0),
                number(f("/megabytes_per_second"), 1),
                number(f("/latency/p50_ms"), 2),
                number(f("/latency/p99_ms"), 2),
                number(f("/latency/p999_ms"), 2),
                number(f("/latency/max_ms"), 2),
                number(f("/cpu/bench_percent"), 0),
                number(f("/cpu/broker_percent"), 0),
                number(load, 2),
            ));
        }
    }
    out
}

/// `throughput-file-2` → `throughput-file`: the suite numbers repeats from 1 (`REPEAT`, 3 by
/// default). Other trailing numbers are part of the name (`omb-file-20000`, a rate), so only a
/// small one is taken for a repeat.
fn run_name(stem: &str) -> &str {
    match stem.rsplit_once('-') {
        Some((name, n)) if n.parse::<u32>().is_ok_and(|n| (1..100).contains(&n)) => name,
        _ => stem,
    }
}

fn add_report(runs: &mut Runs, name: &str, report: &Value) {
    let Some(phases) = report.get("phases").and_then(Value::as_array) else {
        return;
    };
    for phase in phases {
        let Some(phase_name) = phase.get("name").and_then(Value::as_str) else {
            continue;
        };
        let figures = runs
            .entry((name.to_string(), phase_name.to_string()))
            .or_default();
        if let Some(rate) = phase.get("records_per_second").and_then(Value::as_f64) {
            figures.records_per_second.push(rate);
        }
        let latency = phase.get("latency");
        let pick = |key: &str| latency.and_then(|l| l.get(key)).and_then(Value::as_f64);
        if let (Some(p50), Some(p99)) = (pick("p50_ms"), pick("p99_ms")) {
            figures.p50_ms.push(p50);
            figures.p99_ms.push(p99);
        }
    }
}

/// Median and range of a set of runs.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Spread {
    median: f64,
    low: f64,
    high: f64,
}

fn spread(values: &[f64]) -> Option<Spread> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    Some(Spread {
        median,
        low: sorted[0],
        high: sorted[n - 1],
    })
}

/// Which way a figure gets worse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Worse {
    Lower,
    Higher,
}

/// One cell: the median (and range when repeated), then the change against the baseline.
fn cell(now: &[f64], before: Option<&[f64]>, worse: Worse, format: fn(f64) -> String) -> String {
    let Some(s) = spread(now) else {
        return "-".to_string();
    };
    let mut text = format(s.median);
    if now.len() > 1 {
        text.push_str(&format!(" ({}–{})", format(s.low), format(s.high)));
    }
    if let Some(b) = before.and_then(spread) {
        if b.median != 0.0 {
            let change = (s.median - b.median) / b.median * 100.0;
            // Ranges that overlap: the two builds are not told apart by these runs.
            let overlap = s.low <= b.high && b.low <= s.high;
            let worse_now = match worse {
                Worse::Lower => change < 0.0,
                Worse::Higher => change > 0.0,
            };
            let verdict = if overlap {
                "within spread"
            } else if worse_now {
                "WORSE"
            } else {
                "better"
            };
            text.push_str(&format!(" [{change:+.0}% {verdict}]"));
        }
    }
    text
}

fn rate(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

fn millis(v: f64) -> String {
    format!("{v:.2}")
}

fn table(now: &Runs, before: Option<&Runs>) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "{:<32} {:<12} {:<40} {:<40} {:<40}\n",
        "run", "phase", "records/s", "p50 ms", "p99 ms"
    ));
    for ((name, phase), figures) in now {
        let base = before.and_then(|b| b.get(&(name.clone(), phase.clone())));
        let rates = cell(
            &figures.records_per_second,
            base.map(|b| b.records_per_second.as_slice()),
            Worse::Lower,
            rate,
        );
        let p50 = cell(
            &figures.p50_ms,
            base.map(|b| b.p50_ms.as_slice()),
            Worse::Higher,
            millis,
        );
        let p99 = cell(
            &figures.p99_ms,
            base.map(|b| b.p99_ms.as_slice()),
            Worse::Higher,
            millis,
        );
        out.push_str(&format!(
            "{name:<32} {phase:<12} {rates:<40} {p50:<40} {p99:<40}\n"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// A phase: name, records a second, and (p50, p99) when it measured latency.
    type PhaseFigures<'a> = (&'a str, f64, Option<(f64, f64)>);

    fn report(phases: &[PhaseFigures<'_>]) -> Value {
        let phases: Vec<Value> = phases
            .iter()
            .map(|(name, rate, latency)| {
                let mut phase = serde_json::json!({ "name": name, "records_per_second": rate });
                if let Some((p50, p99)) = latency {
                    phase["latency"] = serde_json::json!({ "p50_ms": p50, "p99_ms": p99 });
                }
                phase
            })
            .collect();
        serde_json::json!({ "benchmark": "e2e", "phases": phases })
    }

    #[test]
    fn repeats_are_one_row_and_other_names_keep_their_digits() {
        assert_eq!(run_name("throughput-file-2"), "throughput-file");
        assert_eq!(run_name("e2e-file-linger5"), "e2e-file-linger5");
        assert_eq!(run_name("disk-4k"), "disk-4k");
        assert_eq!(run_name("omb-file-20000"), "omb-file-20000");
        assert_eq!(
            run_name("throughput-memory-beyond-cache"),
            "throughput-memory-beyond-cache"
        );
    }

    #[test]
    fn a_row_shows_the_median_and_range_and_a_move_beyond_the_spread() {
        let mut before = Runs::new();
        let mut now = Runs::new();
        for (p99, rate) in [(4.0, 1.9e6), (4.4, 2.0e6), (4.2, 2.1e6)] {
            add_report(
                &mut before,
                "e2e-file",
                &report(&[("end-to-end", rate, Some((2.0, p99)))]),
            );
        }
        for (p99, rate) in [(6.0, 1.95e6), (6.5, 2.05e6)] {
            add_report(
                &mut now,
                "e2e-file",
                &report(&[("end-to-end", rate, Some((2.1, p99)))]),
            );
        }
        let key = ("e2e-file".to_string(), "end-to-end".to_string());
        assert_eq!(now[&key].p99_ms, vec![6.0, 6.5]);
        let printed = table(&now, Some(&before));
        let row = printed.lines().nth(1).unwrap();
        assert!(
            row.contains("2.00M (1.95M–2.05M) [+0% within spread]"),
            "{row}"
        );
        assert!(row.contains("6.25 (6.00–6.50) [+49% WORSE]"), "{row}");
        // Lower latency is better, higher throughput is better.
        let printed = table(&before, Some(&now));
        let row = printed.lines().nth(1).unwrap();
        assert!(row.contains("4.20 (4.00–4.40) [-33% better]"), "{row}");
    }

    #[test]
    fn markdown_lists_every_run_and_phase() {
        let mut reports = BTreeMap::new();
        let mut e2e = report(&[("end-to-end", 10_000.0, Some((2.0, 4.5)))]);
        e2e["environment"] = serde_json::json!({ "load_average_before": [1.25, 1.0, 0.5] });
        reports.insert("e2e-file-linger1".to_string(), e2e);
        reports.insert("disk-4k".to_string(), report(&[("writes", 3049.0, None)]));
        let printed = markdown(&reports);
        let rows: Vec<&str> = printed.lines().collect();
        assert_eq!(rows.len(), 4, "{printed}");
        assert!(
            rows[2].starts_with("| disk-4k | writes | 3049 | - | - |"),
            "{printed}"
        );
        assert!(
            rows[3].starts_with("| e2e-file-linger1 | end-to-end | 10000 | - | 2.00 | 4.50 |"),
            "{printed}"
        );
        assert!(rows[3].ends_with("| 1.25 |"), "{printed}");
    }

    #[test]
    fn a_phase_without_latency_or_a_baseline_prints_plainly() {
        let mut now = Runs::new();
        add_report(&mut now, "disk-4k", &report(&[("writes", 3049.0, None)]));
        let printed = table(&now, None);
        let row = printed.lines().nth(1).unwrap();
        assert!(row.starts_with("disk-4k"), "{row}");
        assert!(row.contains("3.0k"), "{row}");
        assert!(!row.contains('['), "{row}");
        assert_eq!(spread(&[]), None);
        assert_eq!(
            spread(&[3.0, 1.0, 2.0, 10.0]),
            Some(Spread {
                median: 2.5,
                low: 1.0,
                high: 10.0
            })
        );
    }
}

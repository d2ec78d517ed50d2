//! `usnvme perf` results: the table (one row per device and core, then a Total row), the
//! latency percentiles and histogram, and the JSON file.
//!
//! # JSON schema (`--json FILE`)
//!
//! Close to `fio --output-format=json`, so that fio parsers and plotters read it:
//!
//! ```text
//! {
//!   "usnvme_version": "0.1.0",
//!   "options": { "queue_depth": 32, "io_size": 4096, "workload": "randread", "read_pct": 100,
//!                "time_s": 2, "warmup_s": 0, "io_count": null, "rate": null, "verify": false,
//!                "stripe": null },
//!   "jobs": [                                   // one per device and reactor core
//!     { "jobname": "sim:0@core3", "device": "sim:0", "core": 3,
//!       "elapsed_ms": 2000, "error": 0,         // failed I/Os in the measured window
//!       "failed_ios": 0,                        // failed I/Os over the whole run
//!       "aborted_ios": 0,                       // of those, aborted by a controller reset
//!       "removed": false,                       // the device was removed during the run
//!       "ios_after_reset": 5120,                // with --reset-after only
//!       "read":  Direction, "write": Direction }
//!   ],
//!   "total": { "jobname": "total", "elapsed_ms": ..., "error": ..., "failed_ios": ...,
//!              "aborted_ios": ..., "read": Direction, "write": Direction },
//!   "reset": { "after_s": 1.0,                  // with --reset-after only
//!              "controllers": [ { "device": "sim:0", "ok": true, "ms": 3 } ] }
//! }
//! ```
//!
//! A `Direction` is fio's per-direction object: `io_bytes`, `io_kbytes`, `bw_bytes` (B/s), `bw`
//! (KiB/s), `iops`, `runtime` (ms), `total_ios`, and `lat_ns` with `min`, `max`, `mean`,
//! `stddev`, `N` and `percentile` (`{"50.000000": ns, "90.000000": ns, "99.000000": ns,
//! "99.900000": ns, "99.990000": ns}`). With `-LL` each job also carries `read_buckets` /
//! `write_buckets`: `[{low_ns, high_ns, count, cumulative_percent}]`.
//!
//! The total's `io_bytes`, `total_ios`, `iops`, `bw_bytes` and `bw` are the sums over the jobs
//! (every job runs at once); its latencies are over every I/O of every job.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{json, Value};
use usnvme_engine::stats::{Direction, IoStats, OpKind, DEFAULT_PERCENTILES};

/// The measured result of one reactor on one device.
#[derive(Debug)]
pub struct Row {
    pub device: String,
    pub core: usize,
    pub stats: IoStats,
    pub elapsed: Duration,
    /// I/Os that failed over the whole run (warm-up and drain included), aborted ones too.
    pub failed: u64,
    /// Of those, I/Os a controller reset aborted.
    pub aborted: u64,
    /// I/Os completed after the controllers were reset (`--reset-after` only).
    pub after_reset: Option<u64>,
    /// The controller found gone under the device, if it was removed during the run.
    pub removed: Option<String>,
}

impl Row {
    pub fn name(&self) -> String {
        format!("{}@core{}", self.device, self.core)
    }

    fn iops(&self) -> f64 {
        self.stats.iops(OpKind::Read, self.elapsed) + self.stats.iops(OpKind::Write, self.elapsed)
    }

    fn mib_s(&self) -> f64 {
        self.stats.mib_per_s(OpKind::Read, self.elapsed)
            + self.stats.mib_per_s(OpKind::Write, self.elapsed)
    }
}

/// Every row's statistics merged (latencies over all I/Os).
pub fn merged(rows: &[Row]) -> IoStats {
    let mut total = IoStats::new();
    rows.iter().for_each(|r| total.merge(&r.stats));
    total
}

/// Average, min and max latency in µs over reads and writes together.
fn latency_us(s: &IoStats) -> (f64, f64, f64) {
    let (r, w) = (s.latency(OpKind::Read), s.latency(OpKind::Write));
    let n = r.count + w.count;
    if n == 0 {
        return (0.0, 0.0, 0.0);
    }
    let avg = (r.mean_ns * r.count as f64 + w.mean_ns * w.count as f64) / n as f64;
    let min = [&r, &w]
        .iter()
        .filter(|l| l.count > 0)
        .map(|l| l.min_ns)
        .min()
        .unwrap_or(0);
    let max = r.max_ns.max(w.max_ns);
    (avg / 1e3, min as f64 / 1e3, max as f64 / 1e3)
}

/// The results table; with `latency >= 1` the percentiles, with `>= 2` the histograms.
pub fn table(rows: &[Row], latency: u8) -> String {
    let width = rows
        .iter()
        .map(|r| r.name().len())
        .max()
        .unwrap_or(0)
        .max(8);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<width$} {:>12} {:>10} {:>10} {:>10} {:>10}",
        "Device", "IOPS", "MiB/s", "Avg(us)", "Min(us)", "Max(us)"
    );
    let line = |out: &mut String, name: &str, iops: f64, mib: f64, s: &IoStats| {
        let (avg, min, max) = latency_us(s);
        let _ = writeln!(
            out,
            "{name:<width$} {iops:>12.2} {mib:>10.2} {avg:>10.2} {min:>10.2} {max:>10.2}"
        );
    };
    for r in rows {
        line(&mut out, &r.name(), r.iops(), r.mib_s(), &r.stats);
    }
    let total = merged(rows);
    let iops: f64 = rows.iter().map(Row::iops).sum();
    let mib: f64 = rows.iter().map(Row::mib_s).sum();
    line(&mut out, "Total", iops, mib, &total);
    if latency >= 1 {
        out.push('\n');
        let _ = write!(out, "{:<width$} {:>5}", "Latency(us)", "");
        for p in DEFAULT_PERCENTILES {
            let _ = write!(out, " {:>10}", format!("p{p}"));
        }
        out.push('\n');
        let named = rows.iter().map(|r| (r.name(), &r.stats));
        for (name, s) in named.chain(std::iter::once(("Total".to_owned(), &total))) {
            for kind in [OpKind::Read, OpKind::Write] {
                let l = s.latency(kind);
                if l.count == 0 {
                    continue;
                }
                let _ = write!(out, "{name:<width$} {:>5}", kind.name());
                for (_, ns) in &l.percentiles {
                    let _ = write!(out, " {:>10.2}", *ns as f64 / 1e3);
                }
                out.push('\n');
            }
        }
    }
    if latency >= 2 {
        let named = rows.iter().map(|r| (r.name(), &r.stats));
        for (name, s) in named.chain(std::iter::once(("Total".to_owned(), &total))) {
            for kind in [OpKind::Read, OpKind::Write] {
                let buckets = s.buckets(kind);
                if buckets.is_empty() {
                    continue;
                }
                let _ = writeln!(out, "\nHistogram {name} {}:", kind.name());
                let _ = writeln!(out, "  {:>24} {:>12} {:>10}", "Range(us)", "I/Os", "Cum %");
                for b in buckets {
                    let range = format!(
                        "{:.3} - {:.3}",
                        b.low_ns as f64 / 1e3,
                        b.high_ns as f64 / 1e3
                    );
                    let _ = writeln!(
                        out,
                        "  {range:>24} {:>12} {:>9.4}%",
                        b.count, b.cumulative_percent
                    );
                }
            }
        }
    }
    out
}

/// One line per row that had failed I/Os or lost its device, under an `Errors:` heading; empty
/// when there is nothing to say.
pub fn errors(rows: &[Row]) -> String {
    let mut out = String::new();
    for r in rows {
        let mut parts = Vec::new();
        if let Some(gone) = &r.removed {
            let failed = r.failed - r.aborted;
            parts.push(format!(
                "removed during the run ({gone} is gone): {failed} I/O(s) failed (Host Pathing Error)"
            ));
        } else if r.failed > r.aborted {
            parts.push(format!("{} I/O(s) failed", r.failed - r.aborted));
        }
        if r.aborted > 0 {
            let mut text = format!(
                "{} I/O(s) aborted by a controller reset (Command Aborted By Host)",
                r.aborted
            );
            if let Some(after) = r.after_reset {
                let _ = write!(text, ", {after} completed after it");
            }
            parts.push(text);
        }
        if !parts.is_empty() {
            let _ = writeln!(out, "  {}: {}", r.name(), parts.join("; "));
        }
    }
    if out.is_empty() {
        return out;
    }
    format!("\nErrors:\n{out}")
}

fn direction(s: &IoStats, kind: OpKind, elapsed: Duration) -> Direction {
    s.direction(kind, elapsed, &DEFAULT_PERCENTILES)
}

fn job(name: &str, s: &IoStats, elapsed: Duration, latency: u8) -> Value {
    let mut v = json!({
        "jobname": name,
        "elapsed_ms": elapsed.as_millis() as u64,
        "error": s.errors(),
        "read": direction(s, OpKind::Read, elapsed),
        "write": direction(s, OpKind::Write, elapsed),
    });
    if latency >= 2 {
        v["read_buckets"] = json!(s.buckets(OpKind::Read));
        v["write_buckets"] = json!(s.buckets(OpKind::Write));
    }
    v
}

/// The JSON document (see the module documentation).
pub fn json(rows: &[Row], options: Value, latency: u8) -> Value {
    let jobs: Vec<Value> = rows
        .iter()
        .map(|r| {
            let mut v = job(&r.name(), &r.stats, r.elapsed, latency);
            v["device"] = json!(r.device);
            v["core"] = json!(r.core);
            v["failed_ios"] = json!(r.failed);
            v["aborted_ios"] = json!(r.aborted);
            v["removed"] = json!(r.removed.is_some());
            if let Some(after) = r.after_reset {
                v["ios_after_reset"] = json!(after);
            }
            v
        })
        .collect();
    let stats = merged(rows);
    let elapsed = rows.iter().map(|r| r.elapsed).max().unwrap_or_default();
    let mut total = job("total", &stats, elapsed, latency);
    total["failed_ios"] = json!(rows.iter().map(|r| r.failed).sum::<u64>());
    total["aborted_ios"] = json!(rows.iter().map(|r| r.aborted).sum::<u64>());
    // Jobs run side by side: rates add up.
    for (key, kind) in [("read", OpKind::Read), ("write", OpKind::Write)] {
        let sum = |f: &dyn Fn(&Direction) -> f64| -> f64 {
            rows.iter()
                .map(|r| f(&direction(&r.stats, kind, r.elapsed)))
                .sum()
        };
        total[key]["iops"] = json!(sum(&|d| d.iops));
        total[key]["bw_bytes"] = json!(sum(&|d| d.bw_bytes as f64) as u64);
        total[key]["bw"] = json!(sum(&|d| d.bw as f64) as u64);
    }
    json!({
        "usnvme_version": env!("CARGO_PKG_VERSION"),
        "options": options,
        "jobs": jobs,
        "total": total,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(device: &str, core: usize, reads: u64, writes: u64, lat_us: u64) -> Row {
        let mut stats = IoStats::new();
        for _ in 0..reads {
            stats.record(OpKind::Read, 4096, lat_us * 1000, true);
        }
        for _ in 0..writes {
            stats.record(OpKind::Write, 4096, 2 * lat_us * 1000, true);
        }
        Row {
            device: device.into(),
            core,
            stats,
            elapsed: Duration::from_secs(1),
            failed: 0,
            aborted: 0,
            after_reset: None,
            removed: None,
        }
    }

    #[test]
    fn latency_combines_reads_and_writes() {
        let r = row("sim:0", 0, 3, 1, 100);
        let (avg, min, max) = latency_us(&r.stats);
        assert!((avg - 125.0).abs() < 0.5, "{avg}");
        assert!(
            (min - 100.0).abs() < 0.5 && (max - 200.0).abs() < 0.5,
            "{min} {max}"
        );
    }

    #[test]
    fn totals_are_sums_and_rows_are_named_device_at_core() {
        let rows = [row("sim:0", 2, 100, 0, 10), row("sim:1", 3, 50, 50, 10)];
        let text = table(&rows, 1);
        assert!(
            text.contains("sim:0@core2") && text.contains("sim:1@core3"),
            "{text}"
        );
        let total = text
            .lines()
            .find(|l| l.starts_with("Total"))
            .expect("a Total row");
        assert!(total.contains("200.00"), "{total}");
        let doc = json(&rows, json!({}), 0);
        assert_eq!(doc["total"]["read"]["total_ios"], 150);
        assert_eq!(doc["total"]["write"]["total_ios"], 50);
        assert_eq!(doc["total"]["read"]["iops"], 150.0);
        assert_eq!(doc["jobs"][1]["jobname"], "sim:1@core3");
        assert_eq!(doc["jobs"][1]["removed"], false);
        assert!(errors(&rows).is_empty(), "nothing to report");
    }

    #[test]
    fn errors_name_the_removed_device_and_the_aborted_ios() {
        let mut gone = row("0000:05:00.0", 1, 10, 0, 10);
        gone.failed = 31;
        gone.removed = Some("0000:05:00.0".into());
        let mut reset = row("sim:1", 0, 10, 0, 10);
        (reset.failed, reset.aborted, reset.after_reset) = (12, 12, Some(3456));
        let fine = row("sim:2", 0, 10, 0, 10);
        let rows = [gone, reset, fine];
        let text = errors(&rows);
        assert!(text.starts_with("\nErrors:\n"), "{text}");
        assert!(
            text.contains("0000:05:00.0@core1: removed during the run (0000:05:00.0 is gone): 31 I/O(s) failed (Host Pathing Error)"),
            "{text}"
        );
        assert!(
            text.contains("sim:1@core0: 12 I/O(s) aborted by a controller reset (Command Aborted By Host), 3456 completed after it"),
            "{text}"
        );
        assert!(!text.contains("sim:2"), "{text}");
        let doc = json(&rows, json!({}), 0);
        assert_eq!(doc["jobs"][0]["removed"], true);
        assert_eq!(doc["jobs"][1]["ios_after_reset"], 3456);
        assert_eq!(doc["total"]["failed_ios"], 43);
        assert_eq!(doc["total"]["aborted_ios"], 12);
    }
}

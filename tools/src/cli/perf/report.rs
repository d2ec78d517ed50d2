//! `usnvme perf` results: the table (one row per device and core, then a Total row), the
//! latency percentiles and histogram, and the JSON file.
//!
//! # JSON schema (`--json FILE`)
//!
//! fio 3.x's `--output-format=json` for the fields fio's tools read (fio-plot charts it), with
//! usnvme's own fields beside them:
//!
//! ```text
//! {
//!   "fio version": "usnvme-0.1.0",              // who wrote it (fio writes "fio-3.33")
//!   "timestamp": 1796085125, "timestamp_ms": ..., "time": "Tue Dec  1 00:32:05 2026",  // UTC
//!   "global options": { "ioengine": "usnvme", "rw": "randread", "bs": "4k", "iodepth": "32",
//!                       "numjobs": "4", "runtime": "2", "time_based": "1" },
//!                       // also "rwmixread", "ramp_time", "number_ios" when given
//!   "usnvme_version": "0.1.0",
//!   "usnvme_notes": { "slat_ns": "not measured ...", ... },  // what differs from fio
//!   "options": { "queue_depth": 32, "io_size": 4096, "workload": "randread", "read_pct": 100,
//!                "time_s": 2, "warmup_s": 0, "io_count": null, "rate": null, "verify": false,
//!                "stripe": null, ... },
//!   "jobs": [                                   // one per device and reactor core
//!     { "jobname": "sim:0@core3", "groupid": 0,
//!       "job options": { "name": "sim:0@core3", "filename": "sim:0", "cpus_allowed": "3",
//!                        ...the global options },
//!       "device": "sim:0", "core": 3,
//!       "elapsed_ms": 2000, "job_runtime": 2000,
//!       "joined_ms": 1000,                      // a drive that joined the run: when, into
//!                                               // the window (its elapsed_ms counts from it)
//!       "longest_gap_us": 12,                   // longest stretch with I/O in flight and no
//!                                               // completion (a reactor held up, a stall)
//!       "error": 0,                             // failed I/Os in the measured window
//!       "failed_ios": 0,                        // failed I/Os over the whole run
//!       "aborted_ios": 0,                       // of those, aborted by a controller reset
//!       "removed": false,                       // the device was removed during the run
//!       "reconnects": 0,                        // times its NVMe/TCP queues reconnected
//!       "ios_after_reset": 5120,                // with --reset-after only
//!       "read": Direction, "write": Direction, "trim": Direction (all zero),
//!       "usr_cpu": 99.1, "sys_cpu": 0.8,        // its reactor's CPU time, % of the window
//!       "latency_ns": {"2": %, ...}, "latency_us": {...}, "latency_ms": {...} }
//!   ],
//!   "total": { "jobname": "total", "elapsed_ms": ..., "error": ..., "failed_ios": ...,
//!              "aborted_ios": ..., "reconnects": ..., "read": Direction, "write": Direction, ... },
//!   "reset": { "after_s": 1.0,                  // with --reset-after only
//!              "controllers": [ { "device": "sim:0", "ok": true, "ms": 3 } ] },
//!   "verified_blocks": 81920                    // with --verify: blocks read back and checked
//! }
//! ```
//!
//! A `Direction` is fio's per-direction object: `io_bytes`, `io_kbytes`, `bw_bytes` (B/s), `bw`
//! (KiB/s), `iops`, `runtime` (ms), `total_ios`, `short_ios` and `drop_ios` (0), `slat_ns` (all
//! zero: not measured), `clat_ns` and `lat_ns` (the same: `min`, `max`, `mean`, `stddev`, `N` and
//! `percentile`, `{"50.000000": ns, "90.000000": ns, "99.000000": ns, "99.900000": ns,
//! "99.990000": ns}`), then over the per-second samples of the measured window (whole seconds;
//! none with `--io-count`): `iops_min`, `iops_max`, `iops_mean`, `iops_stddev`, `iops_samples`,
//! `bw_min`, `bw_max`, `bw_mean`, `bw_dev` (KiB/s), `bw_samples` and `bw_agg` (this job's mean as
//! a percentage of all jobs' bandwidth). Standard deviations divide by n − 1, as fio's do.
//! `latency_ns` / `_us` / `_ms` are fio's latency distribution: the percentage of I/Os (reads and
//! writes) in each bin, a bin named by its upper end (`"250"` in `latency_us`: 100 to 250 µs),
//! from the latency histogram (all zero in a run that kept none).
//! With `-LL` each job also carries `read_buckets` / `write_buckets`: `[{low_ns, high_ns, count,
//! cumulative_percent}]`.
//!
//! The total's `io_bytes`, `total_ios`, `iops`, `bw_bytes` and `bw` are the sums over the jobs
//! (every job runs at once), and so are its per-second samples; its latencies are over every I/O
//! of every job.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{json, Map, Value};
use usnvme_engine::stats::{Direction, IoStats, LatencySummary, OpKind, DEFAULT_PERCENTILES};
use usnvme_tools::sweep::output::UtcTime;
use usnvme_tools::sweep::size_label;

/// The measured result of one reactor on one device.
#[derive(Debug)]
pub struct Row {
    pub device: String,
    pub core: usize,
    pub stats: IoStats,
    pub elapsed: Duration,
    /// Where it joined the measured window (a drive that joined the run), if it did.
    pub joined: Option<Duration>,
    /// Successful `[reads, writes]` in each second of the measured window (may run past it).
    pub per_second: Vec<[u64; 2]>,
    /// I/Os that failed over the whole run (warm-up and drain included), aborted ones too.
    pub failed: u64,
    /// Of those, I/Os a controller reset aborted.
    pub aborted: u64,
    /// I/Os completed after the controllers were reset (`--reset-after` only).
    pub after_reset: Option<u64>,
    /// What was found gone under the device during the run ("0000:05:00.0 is gone"), if anything.
    pub removed: Option<String>,
    /// Times its remote queues connected again (their unfinished I/Os were sent again).
    pub reconnects: u32,
    /// Its reactor's CPU time over the measured window, `[user, system]`.
    pub cpu: [Duration; 2],
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

/// One line per row that had failed I/Os, lost its device or reconnected to it, under an
/// `Errors:` heading; empty
/// when there is nothing to say.
pub fn errors(rows: &[Row]) -> String {
    let mut out = String::new();
    for r in rows {
        let mut parts = Vec::new();
        if let Some(gone) = &r.removed {
            let failed = r.failed - r.aborted;
            parts.push(format!(
                "removed during the run ({gone}): {failed} I/O(s) failed (Host Pathing Error)"
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
        if r.reconnects > 0 {
            parts.push(format!(
                "the target went away: reconnected {} time(s), unfinished I/Os sent again",
                r.reconnects
            ));
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

/// `[user, system]` CPU time in % of `elapsed` (0 for an empty window).
fn cpu_pct(cpu: [Duration; 2], elapsed: Duration) -> [f64; 2] {
    let window = elapsed.as_secs_f64();
    if window <= 0.0 {
        return [0.0; 2];
    }
    cpu.map(|t| 100.0 * t.as_secs_f64() / window)
}

/// What differs from fio in the fio fields, said in the file itself.
fn notes() -> Value {
    json!({
        "slat_ns": "not measured (submission is a write to a queue in user space): all zero",
        "clat_ns": "the same as lat_ns: from just before submission until the completion is reaped",
        "usr_cpu": "the user time of the job's reactor thread over the measured window, in % of it (a reactor's jobs share its figure; the total sums the reactors'); a reactor polls, so usr + sys is the share of its core it was given",
        "sys_cpu": "the same, system time",
        "iops_bw_samples": "one per whole second of the measured window (fio: every 500 ms)",
        "latency_distribution": "latency_ns/us/ms from the latency histogram's buckets (about 9 % wide), each counted in the bin of its middle; all zero in a run that kept no histogram",
        "numjobs": "the number of jobs: one per device and reactor core",
        "fio version": "written by usnvme, in fio 3.x's JSON format",
    })
}

/// min, max, mean and standard deviation (n − 1, as fio) of `samples`; all zero when empty.
fn sample_stats(samples: &[f64]) -> (f64, f64, f64, f64) {
    let n = samples.len() as f64;
    if samples.is_empty() {
        return (0.0, 0.0, 0.0, 0.0);
    }
    let min = samples.iter().copied().fold(f64::INFINITY, f64::min);
    let max = samples.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mean = samples.iter().sum::<f64>() / n;
    let dev = if samples.len() > 1 {
        let s: f64 = samples.iter().map(|x| (x - mean) * (x - mean)).sum();
        (s / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    (min, max, mean, dev)
}

/// fio's object for one direction: `d` with what fio adds, and the statistics of `ios_per_s`
/// (I/Os of this direction in each whole second). `group_bw_bytes`: all jobs' bandwidth (B/s),
/// for `bw_agg`.
fn fio_direction(d: &Direction, ios_per_s: &[u64], group_bw_bytes: f64) -> Value {
    // Every I/O of a run has the same size: bandwidth samples follow from the I/O counts.
    let bytes_per_io = d.io_bytes.checked_div(d.total_ios).unwrap_or(0);
    let iops: Vec<f64> = ios_per_s.iter().map(|&n| n as f64).collect();
    let kib: Vec<f64> = ios_per_s
        .iter()
        .map(|&n| (n * bytes_per_io) as f64 / 1024.0)
        .collect();
    let (iops_min, iops_max, iops_mean, iops_dev) = sample_stats(&iops);
    let (bw_min, bw_max, bw_mean, bw_dev) = sample_stats(&kib);
    // fio: this job's mean bandwidth as a share of the group's, at most 100 %
    let bw_agg = if kib.is_empty() {
        0.0
    } else if group_bw_bytes > 1024.0 {
        (bw_mean * 100.0 / (group_bw_bytes / 1024.0)).min(100.0)
    } else {
        100.0
    };
    let mut v = json!(d);
    v["short_ios"] = json!(0);
    v["drop_ios"] = json!(0);
    v["slat_ns"] = json!({"min": 0, "max": 0, "mean": 0.0, "stddev": 0.0, "N": 0});
    // lat_ns is all we time; fio tools read clat_ns (and its percentiles) most
    v["clat_ns"] = v["lat_ns"].clone();
    v["bw_min"] = json!(bw_min as u64);
    v["bw_max"] = json!(bw_max as u64);
    v["bw_agg"] = json!(bw_agg);
    v["bw_mean"] = json!(bw_mean);
    v["bw_dev"] = json!(bw_dev);
    v["bw_samples"] = json!(kib.len());
    v["iops_min"] = json!(iops_min as u64);
    v["iops_max"] = json!(iops_max as u64);
    v["iops_mean"] = json!(iops_mean);
    v["iops_stddev"] = json!(iops_dev);
    v["iops_samples"] = json!(iops.len());
    v
}

/// fio's `trim` object: no trims are issued.
fn no_trim() -> Value {
    let none = Direction {
        io_bytes: 0,
        io_kbytes: 0,
        bw_bytes: 0,
        bw: 0,
        iops: 0.0,
        runtime: 0,
        total_ios: 0,
        lat_ns: LatencySummary::default(),
    };
    fio_direction(&none, &[], 0.0)
}

/// Upper ends of fio's latency bins, in the bin's unit (`latency_ns`, `latency_us`, `latency_ms`).
const LATENCY_STEPS: [u64; 10] = [2, 4, 10, 20, 50, 100, 250, 500, 750, 1000];

/// fio's latency distribution of reads and writes together: `latency_ns`, `latency_us` and
/// `latency_ms`, the percentage of I/Os in each bin (below 0.01 % but not empty: 0.01, as fio).
fn latency_distribution(s: &IoStats) -> [(&'static str, Value); 3] {
    // [ns bins; us bins; ms bins, with 2000 and >=2000 ms at the end]
    let mut counts = [[0u64; 12]; 3];
    let mut total = 0u64;
    for kind in [OpKind::Read, OpKind::Write] {
        for b in s.buckets(kind) {
            let ns = b.low_ns + (b.high_ns - b.low_ns) / 2;
            let (unit, scale) = match ns {
                0..=999 => (0, 1),
                1_000..=999_999 => (1, 1_000),
                _ => (2, 1_000_000),
            };
            let step = LATENCY_STEPS.iter().position(|&t| ns < t * scale);
            let bin = match step {
                Some(i) => i,
                None if ns < 2_000 * scale => 10,
                None => 11,
            };
            counts[unit][bin] += b.count;
            total += b.count;
        }
    }
    let percent = |n: u64| {
        let p = if total == 0 {
            0.0
        } else {
            n as f64 * 100.0 / total as f64
        };
        if n > 0 && p < 0.01 {
            0.01
        } else {
            p
        }
    };
    let bins = |unit: usize, labels: &[&str]| -> Value {
        let map: Map<String, Value> = labels
            .iter()
            .zip(counts[unit])
            .map(|(label, n)| (label.to_string(), json!(percent(n))))
            .collect();
        Value::Object(map)
    };
    let steps: Vec<String> = LATENCY_STEPS.iter().map(u64::to_string).collect();
    let steps: Vec<&str> = steps.iter().map(String::as_str).collect();
    let ms: Vec<&str> = steps.iter().copied().chain(["2000", ">=2000"]).collect();
    [
        ("latency_ns", bins(0, &steps)),
        ("latency_us", bins(1, &steps)),
        ("latency_ms", bins(2, &ms)),
    ]
}

/// fio's options for these jobs, every value a string as fio writes them: what fio-plot and
/// fio's other tools read to know the workload. `bs`: the I/O size in bytes.
fn fio_options(options: &Value, numjobs: usize, bs: u64) -> Map<String, Value> {
    let text = |key: &str| match options.get(key) {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    let mut o = Map::new();
    o.insert("ioengine".into(), json!("usnvme"));
    let rw = text("workload");
    if let Some(rw) = &rw {
        o.insert("rw".into(), json!(rw));
    }
    if matches!(rw.as_deref(), Some("rw" | "randrw")) {
        if let Some(pct) = text("read_pct") {
            o.insert("rwmixread".into(), json!(pct));
        }
    }
    o.insert("bs".into(), json!(size_label(bs).to_lowercase()));
    if let Some(qd) = text("queue_depth") {
        o.insert("iodepth".into(), json!(qd));
    }
    o.insert("numjobs".into(), json!(numjobs.to_string()));
    if let Some(n) = text("io_count") {
        o.insert("number_ios".into(), json!(n));
    } else if let Some(t) = text("time_s") {
        o.insert("runtime".into(), json!(t));
        o.insert("time_based".into(), json!("1"));
    }
    if let Some(w) = text("warmup_s").filter(|w| w != "0") {
        o.insert("ramp_time".into(), json!(w));
    }
    o
}

/// `[reads, writes]` of each whole second a row measured: a second cut short (a run stopped
/// early, or the end of the window) would read as a dip, so it is left out.
fn full_seconds(r: &Row) -> &[[u64; 2]] {
    let whole = (r.elapsed.as_secs() as usize).min(r.per_second.len());
    &r.per_second[..whole]
}

/// One direction's I/O count per second, from `[reads, writes]`.
fn lane(seconds: &[[u64; 2]], kind: OpKind) -> Vec<u64> {
    let i = usize::from(kind == OpKind::Write);
    seconds.iter().map(|s| s[i]).collect()
}

/// The fields fio writes for a job (or the total): directions, latency distribution, CPU.
fn job(
    name: &str,
    s: &IoStats,
    elapsed: Duration,
    seconds: &[[u64; 2]],
    group_bw: [f64; 2],
    latency: u8,
) -> Value {
    let mut v = json!({
        "jobname": name,
        "groupid": 0,
        "elapsed_ms": elapsed.as_millis() as u64,
        "job_runtime": elapsed.as_millis() as u64,
        "error": s.errors(),
        "trim": no_trim(),
        "usr_cpu": 0.0,
        "sys_cpu": 0.0,
    });
    for (key, kind, group) in [
        ("read", OpKind::Read, group_bw[0]),
        ("write", OpKind::Write, group_bw[1]),
    ] {
        v[key] = fio_direction(&direction(s, kind, elapsed), &lane(seconds, kind), group);
    }
    for (key, bins) in latency_distribution(s) {
        v[key] = bins;
    }
    if latency >= 2 {
        v["read_buckets"] = json!(s.buckets(OpKind::Read));
        v["write_buckets"] = json!(s.buckets(OpKind::Write));
    }
    v
}

/// The JSON document (see the module documentation).
pub fn json(rows: &[Row], options: Value, latency: u8) -> Value {
    let stats = merged(rows);
    // Jobs run side by side: rates add up.
    let sum = |kind: OpKind, f: &dyn Fn(&Direction) -> f64| -> f64 {
        rows.iter()
            .map(|r| f(&direction(&r.stats, kind, r.elapsed)))
            .sum()
    };
    let group_bw = [OpKind::Read, OpKind::Write].map(|k| sum(k, &|d| d.bw_bytes as f64));
    // The I/O size: as given, else what the I/Os moved on average (all have one size).
    let bs = options
        .get("io_size")
        .and_then(Value::as_u64)
        .unwrap_or_else(|| {
            stats
                .total_bytes()
                .checked_div(stats.total_ios())
                .unwrap_or(0)
        });
    let global = fio_options(&options, rows.len(), bs);
    let jobs: Vec<Value> = rows
        .iter()
        .map(|r| {
            let name = r.name();
            let seconds = full_seconds(r);
            let mut v = job(&name, &r.stats, r.elapsed, seconds, group_bw, latency);
            let mut opts = Map::new();
            opts.insert("name".into(), json!(name));
            opts.insert("filename".into(), json!(r.device));
            opts.insert("cpus_allowed".into(), json!(r.core.to_string()));
            opts.extend(global.clone());
            v["job options"] = Value::Object(opts);
            v["device"] = json!(r.device);
            v["core"] = json!(r.core);
            if let Some(joined) = r.joined {
                v["joined_ms"] = json!(joined.as_millis() as u64);
            }
            v["longest_gap_us"] = json!(r.stats.longest_gap_ns() / 1000);
            v["failed_ios"] = json!(r.failed);
            v["aborted_ios"] = json!(r.aborted);
            v["removed"] = json!(r.removed.is_some());
            v["reconnects"] = json!(r.reconnects);
            let [usr, sys] = cpu_pct(r.cpu, r.elapsed);
            (v["usr_cpu"], v["sys_cpu"]) = (json!(usr), json!(sys));
            if let Some(after) = r.after_reset {
                v["ios_after_reset"] = json!(after);
            }
            v
        })
        .collect();
    // The total's samples: every job's, second by second.
    let longest = rows
        .iter()
        .map(|r| full_seconds(r).len())
        .max()
        .unwrap_or(0);
    let mut seconds = vec![[0u64; 2]; longest];
    for r in rows {
        for (t, s) in seconds.iter_mut().zip(full_seconds(r)) {
            t[0] += s[0];
            t[1] += s[1];
        }
    }
    let elapsed = rows.iter().map(|r| r.elapsed).max().unwrap_or_default();
    let mut total = job("total", &stats, elapsed, &seconds, group_bw, latency);
    // every reactor once: its devices' jobs share its CPU time
    let mut cores: Vec<&Row> = Vec::new();
    for r in rows {
        if !cores.iter().any(|c| c.core == r.core) {
            cores.push(r);
        }
    }
    let [usr, sys] = cores
        .iter()
        .map(|r| cpu_pct(r.cpu, r.elapsed))
        .fold([0.0; 2], |a, b| [a[0] + b[0], a[1] + b[1]]);
    (total["usr_cpu"], total["sys_cpu"]) = (json!(usr), json!(sys));
    total["failed_ios"] = json!(rows.iter().map(|r| r.failed).sum::<u64>());
    total["aborted_ios"] = json!(rows.iter().map(|r| r.aborted).sum::<u64>());
    total["reconnects"] = json!(rows.iter().map(|r| u64::from(r.reconnects)).sum::<u64>());
    for (key, kind) in [("read", OpKind::Read), ("write", OpKind::Write)] {
        total[key]["iops"] = json!(sum(kind, &|d| d.iops));
        total[key]["bw_bytes"] = json!(sum(kind, &|d| d.bw_bytes as f64) as u64);
        total[key]["bw"] = json!(sum(kind, &|d| d.bw as f64) as u64);
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    json!({
        "fio version": format!("usnvme-{}", env!("CARGO_PKG_VERSION")),
        "timestamp": now.as_secs(),
        "timestamp_ms": now.as_millis() as u64,
        "time": UtcTime::from_unix(now.as_secs()).ctime(),
        "global options": global,
        "usnvme_version": env!("CARGO_PKG_VERSION"),
        "usnvme_notes": notes(),
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
            joined: None,
            per_second: vec![[reads, writes]],
            failed: 0,
            aborted: 0,
            after_reset: None,
            removed: None,
            reconnects: 0,
            cpu: [Duration::ZERO; 2],
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

    /// A read-only row that ran 3 s at 15 µs, with `per_second` reads each second.
    fn sampled(device: &str, core: usize, per_second: &[u64]) -> Row {
        let total: u64 = per_second.iter().take(3).sum();
        let mut r = row(device, core, total, 0, 15);
        r.elapsed = Duration::from_secs(3);
        r.per_second = per_second.iter().map(|&n| [n, 0]).collect();
        r
    }

    #[test]
    fn cpu_is_each_reactors_share_of_the_window_and_the_total_counts_each_reactor_once() {
        let mut a = row("sim:0", 2, 10, 0, 10);
        a.cpu = [Duration::from_millis(900), Duration::from_millis(50)];
        // sim:1 on the same reactor: the same CPU time
        let mut b = row("sim:1", 2, 10, 0, 10);
        b.cpu = a.cpu;
        let mut c = row("sim:2", 3, 10, 0, 10);
        c.cpu = [Duration::from_millis(500), Duration::from_millis(250)];
        let doc = json(&[a, b, c], json!({}), 0);
        let pct = |v: &Value| v.as_f64().expect("a number");
        assert!((pct(&doc["jobs"][1]["usr_cpu"]) - 90.0).abs() < 1e-9);
        assert!((pct(&doc["jobs"][2]["sys_cpu"]) - 25.0).abs() < 1e-9);
        assert!((pct(&doc["total"]["usr_cpu"]) - 140.0).abs() < 1e-9);
        assert!((pct(&doc["total"]["sys_cpu"]) - 30.0).abs() < 1e-9);
    }

    #[test]
    fn json_is_fio_json_that_fio_plot_reads() {
        // the 4th second of sim:0 ran past the window: not a sample
        let rows = [
            sampled("sim:0", 2, &[100, 200, 300, 999]),
            sampled("sim:1", 3, &[50, 50, 50]),
        ];
        let options = json!({"queue_depth": 32, "io_size": 4096, "workload": "randread",
                             "read_pct": 100, "time_s": 3, "warmup_s": 0, "io_count": null});
        let doc = json(&rows, options, 0);
        // what fio-plot checks a file and its jobs by
        assert_eq!(
            doc["fio version"],
            format!("usnvme-{}", env!("CARGO_PKG_VERSION"))
        );
        assert!(doc["timestamp"].as_u64().is_some_and(|t| t > 1_700_000_000));
        let global = &doc["global options"];
        for (key, value) in [
            ("rw", "randread"),
            ("bs", "4k"),
            ("iodepth", "32"),
            ("numjobs", "2"),
            ("runtime", "3"),
        ] {
            assert_eq!(global[key], value, "{key}");
        }
        let job = &doc["jobs"][0];
        let opts = &job["job options"];
        assert_eq!(
            (&opts["rw"], &opts["bs"]),
            (&json!("randread"), &json!("4k"))
        );
        assert_eq!(
            (&opts["iodepth"], &opts["numjobs"]),
            (&json!("32"), &json!("2"))
        );
        assert_eq!(
            (&opts["filename"], &opts["cpus_allowed"]),
            (&json!("sim:0"), &json!("2"))
        );
        assert_eq!(
            (job["usr_cpu"].as_f64(), job["sys_cpu"].as_f64()),
            (Some(0.0), Some(0.0))
        );
        assert_eq!(job["trim"]["total_ios"], 0);
        // per-second samples: 100, 200 and 300 I/Os of 4 KiB
        let read = &job["read"];
        assert_eq!(read["iops_samples"], 3);
        assert_eq!(
            (&read["iops_min"], &read["iops_max"]),
            (&json!(100), &json!(300))
        );
        assert_eq!(read["iops_mean"], 200.0);
        assert_eq!(read["iops_stddev"], 100.0, "n - 1, as fio");
        assert_eq!(
            (&read["bw_min"], &read["bw_max"]),
            (&json!(400), &json!(1200))
        );
        assert_eq!(
            (&read["bw_mean"], &read["bw_dev"]),
            (&json!(800.0), &json!(400.0))
        );
        assert_eq!(read["bw_samples"], 3);
        // all jobs: 750 I/Os in 3 s of 4 KiB = 1000 KiB/s, of which this job's mean is 800
        assert!(read["bw_agg"]
            .as_f64()
            .is_some_and(|a| (a - 80.0).abs() < 1e-9));
        // submission latency is not measured: zero, and said so; clat is the latency timed
        let zero = json!({"min": 0, "max": 0, "mean": 0.0, "stddev": 0.0, "N": 0});
        assert_eq!(read["slat_ns"], zero);
        assert!(doc["usnvme_notes"]["slat_ns"]
            .as_str()
            .is_some_and(|n| n.contains("not measured")));
        assert_eq!(read["clat_ns"], read["lat_ns"]);
        assert_eq!(read["clat_ns"]["N"], 600);
        assert_eq!(
            read["clat_ns"]["percentile"]["99.000000"],
            read["lat_ns"]["percentile"]["99.000000"]
        );
        // fio's latency distribution: every I/O took 15 µs (bin 10-20 µs)
        assert_eq!(job["latency_us"]["20"], 100.0);
        assert_eq!(job["latency_us"]["10"], 0.0);
        assert_eq!(job["latency_ns"]["1000"], 0.0);
        assert_eq!(job["latency_ms"][">=2000"], 0.0);
        // the total's samples are the jobs' added second by second
        let total = &doc["total"]["read"];
        assert_eq!(
            (&total["iops_min"], &total["iops_max"]),
            (&json!(150), &json!(350))
        );
        assert_eq!(total["iops_mean"], 250.0);
        assert_eq!(doc["total"]["write"]["iops_samples"], 3);
        assert_eq!(doc["total"]["write"]["iops_max"], 0);
    }

    #[test]
    fn runs_without_whole_seconds_have_no_samples() {
        let mut r = row("sim:0", 0, 10, 0, 10);
        (r.elapsed, r.per_second) = (Duration::from_millis(900), vec![[10, 0]]);
        let options = json!({"queue_depth": 1, "io_size": 4096, "workload": "randrw",
                             "read_pct": 70, "io_count": 10, "warmup_s": 1});
        let doc = json(&[r], options, 0);
        let read = &doc["jobs"][0]["read"];
        assert_eq!(
            (&read["iops_samples"], &read["iops_stddev"]),
            (&json!(0), &json!(0.0))
        );
        assert_eq!((&read["bw_agg"], &read["bw_min"]), (&json!(0.0), &json!(0)));
        let global = &doc["global options"];
        assert_eq!(
            (&global["rwmixread"], &global["number_ios"]),
            (&json!("70"), &json!("10"))
        );
        assert_eq!(
            (&global["ramp_time"], &global["runtime"]),
            (&json!("1"), &Value::Null)
        );
    }

    #[test]
    fn errors_name_the_removed_device_and_the_aborted_ios() {
        let mut gone = row("0000:05:00.0", 1, 10, 0, 10);
        gone.failed = 31;
        gone.removed = Some("0000:05:00.0 is gone".into());
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

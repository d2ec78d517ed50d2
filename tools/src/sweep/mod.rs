//! `usnvme sweep`: the published-review matrix (block sizes × access patterns) in one command.
//!
//! This module is the reusable core: the plan and its parsers, the runner that walks the points
//! and reports progress, and (in [`output`] and [`chart`]) the table, CSV, JSON and SVG charts.
//! How one point is measured is up to the caller: [`run`] takes a closure that runs one point.
//!
//! `--latency-curve` (vdbench's iorate method) uses [`iorate_steps`] to derive the rate caps from a
//! measured peak, and [`chart::latency_curve`] to draw average and p99 latency against achieved IOPS.

pub mod chart;
pub mod output;

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

/// One access pattern of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Sequential read.
    Read,
    /// Sequential write.
    Write,
    /// Uniform random read.
    #[serde(rename = "randread")]
    RandRead,
    /// Uniform random write.
    #[serde(rename = "randwrite")]
    RandWrite,
}

impl Pattern {
    /// Every pattern, in the default sweep order.
    pub const ALL: [Pattern; 4] = [
        Pattern::Read,
        Pattern::Write,
        Pattern::RandRead,
        Pattern::RandWrite,
    ];

    /// The name used on the command line, in files and in charts (`fio`'s spelling).
    pub fn name(self) -> &'static str {
        match self {
            Pattern::Read => "read",
            Pattern::Write => "write",
            Pattern::RandRead => "randread",
            Pattern::RandWrite => "randwrite",
        }
    }

    /// Whether offsets are random (otherwise sequential).
    pub fn is_random(self) -> bool {
        matches!(self, Pattern::RandRead | Pattern::RandWrite)
    }

    /// Whether the pattern reads (otherwise it writes).
    pub fn is_read(self) -> bool {
        matches!(self, Pattern::Read | Pattern::RandRead)
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Pattern {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<Self> {
        let s = s.trim();
        Pattern::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s))
            .with_context(|| {
                format!(
                    "unknown pattern {s:?}: valid patterns are read, write, randread, randwrite"
                )
            })
    }
}

/// A size such as `4k`, `16K`, `1m`, `1MiB`, `512` (bytes) or `2g` (binary units).
pub fn parse_size(s: &str) -> anyhow::Result<u64> {
    usnvme_driver::parse_size(s).with_context(|| {
        format!("{s:?} is not a size: give bytes or a binary unit, e.g. 4k, 128k, 1m")
    })
}

/// Parse the value of `--sizes`: a comma-separated list of sizes (`4k,16k,1m`), each at least
/// 512 bytes and a multiple of 512, without repeats. The order given is kept.
pub fn parse_sizes(s: &str) -> anyhow::Result<Vec<u64>> {
    let mut sizes = Vec::new();
    for item in s.split(',') {
        let size = parse_size(item).with_context(|| format!("--sizes {s:?}"))?;
        if size == 0 || !size.is_multiple_of(512) {
            bail!(
                "--sizes {s:?}: {:?} is not a multiple of 512 bytes (valid: e.g. 4k,16k,128k,1m)",
                item.trim()
            );
        }
        if sizes.contains(&size) {
            bail!("--sizes {s:?}: {:?} is given twice", item.trim());
        }
        sizes.push(size);
    }
    Ok(sizes)
}

/// Parse the value of `--patterns`: a comma-separated list (`read,randwrite`) without repeats.
pub fn parse_patterns(s: &str) -> anyhow::Result<Vec<Pattern>> {
    let mut patterns = Vec::new();
    for item in s.split(',') {
        let p: Pattern = item.parse().with_context(|| format!("--patterns {s:?}"))?;
        if patterns.contains(&p) {
            bail!("--patterns {s:?}: {p} is given twice");
        }
        patterns.push(p);
    }
    Ok(patterns)
}

/// A short label for a block size: `512`, `4K`, `64K`, `1M`, `1536` (not a whole KiB), `12K`.
pub fn size_label(bytes: u64) -> String {
    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * 1024;
    const GIB: u64 = 1024 * 1024 * 1024;
    if bytes >= GIB && bytes.is_multiple_of(GIB) {
        format!("{}G", bytes / GIB)
    } else if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{}M", bytes / MIB)
    } else if bytes >= KIB && bytes.is_multiple_of(KIB) {
        format!("{}K", bytes / KIB)
    } else {
        bytes.to_string()
    }
}

/// One point of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Point {
    /// Access pattern.
    pub pattern: Pattern,
    /// I/O size in bytes.
    pub block_size: u64,
}

impl fmt::Display for Point {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.pattern, size_label(self.block_size))
    }
}

/// The sweep matrix and the time spent on each point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepPlan {
    /// I/O sizes in bytes; default: powers of two from 4 KiB to 1 MiB.
    pub block_sizes: Vec<u64>,
    /// Access patterns; default: read, write, randread, randwrite.
    pub patterns: Vec<Pattern>,
    /// Measured seconds per point (warm-up, if any, is the point runner's business).
    pub seconds_per_point: u64,
}

impl SweepPlan {
    /// The default block sizes: 4K, 8K, … 1M.
    pub fn default_block_sizes() -> Vec<u64> {
        (12..=20).map(|shift| 1u64 << shift).collect()
    }

    /// The points in run order: pattern by pattern (in the order given), each from the smallest
    /// block size to the largest. Keeping a pattern together means sequential runs stream through
    /// the drive once per pattern and writes are not interleaved with the reads they would disturb.
    pub fn points(&self) -> Vec<Point> {
        let mut sizes = self.block_sizes.clone();
        sizes.sort_unstable();
        sizes.dedup();
        self.patterns
            .iter()
            .flat_map(|&pattern| {
                sizes.iter().map(move |&block_size| Point {
                    pattern,
                    block_size,
                })
            })
            .collect()
    }

    /// Time the whole sweep takes when each point runs for `seconds_per_point`.
    pub fn estimated_duration(&self) -> Duration {
        Duration::from_secs(
            self.seconds_per_point
                .saturating_mul(self.points().len() as u64),
        )
    }
}

impl Default for SweepPlan {
    fn default() -> Self {
        SweepPlan {
            block_sizes: Self::default_block_sizes(),
            patterns: Pattern::ALL.to_vec(),
            seconds_per_point: 10,
        }
    }
}

/// What one point measured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PointResult {
    /// I/Os completed per second.
    pub iops: f64,
    /// Throughput in MiB/s (2^20 bytes per second).
    pub mib_per_s: f64,
    /// Mean completion latency in µs.
    pub lat_mean_us: f64,
    /// 99th percentile completion latency in µs.
    pub lat_p99_us: f64,
    /// I/Os that completed with an error.
    pub errors: u64,
}

impl PointResult {
    /// Throughput in GB/s (10^9 bytes per second), as drive data sheets quote it.
    pub fn gb_per_s(&self) -> f64 {
        self.mib_per_s * (1u64 << 20) as f64 / 1e9
    }
}

/// A point and what it measured: one row of the CSV, one element of the JSON array.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Access pattern.
    pub pattern: Pattern,
    /// I/O size in bytes.
    pub block_size: u64,
    /// I/Os completed per second.
    pub iops: f64,
    /// Throughput in MiB/s.
    pub mib_per_s: f64,
    /// Throughput in GB/s (10^9 bytes per second).
    pub gb_per_s: f64,
    /// Mean completion latency in µs.
    pub lat_mean_us: f64,
    /// 99th percentile completion latency in µs.
    pub lat_p99_us: f64,
    /// I/Os that completed with an error.
    pub errors: u64,
}

impl Record {
    /// Combine a point with its result.
    pub fn new(point: Point, result: PointResult) -> Self {
        Record {
            pattern: point.pattern,
            block_size: point.block_size,
            iops: result.iops,
            mib_per_s: result.mib_per_s,
            gb_per_s: result.gb_per_s(),
            lat_mean_us: result.lat_mean_us,
            lat_p99_us: result.lat_p99_us,
            errors: result.errors,
        }
    }

    /// The point this record measured.
    pub fn point(&self) -> Point {
        Point {
            pattern: self.pattern,
            block_size: self.block_size,
        }
    }
}

/// Run every point of `plan` in order with `run_point`, and return one record per point.
///
/// `progress(done, total, eta)` is called once before the first point (`done == 0`, `eta` from the
/// plan) and after each point; `eta` is then the mean time of the points run so far times the
/// points left. The first error stops the sweep and names the point.
pub fn run(
    plan: &SweepPlan,
    mut run_point: impl FnMut(&Point) -> anyhow::Result<PointResult>,
    mut progress: impl FnMut(usize, usize, Duration),
) -> anyhow::Result<Vec<Record>> {
    let points = plan.points();
    let total = points.len();
    let start = Instant::now();
    progress(0, total, plan.estimated_duration());
    let mut records = Vec::with_capacity(total);
    for (i, point) in points.iter().enumerate() {
        let result = run_point(point).with_context(|| format!("sweep point {point}"))?;
        records.push(Record::new(*point, result));
        let done = i + 1;
        let left = (total - done) as u32;
        let eta = start.elapsed() / done as u32 * left;
        progress(done, total, eta);
    }
    Ok(records)
}

/// The rate caps of vdbench's iorate method for a measured `peak_iops`: 10 %, 20 % … 100 % of the
/// peak (each at least 1 IOPS), then uncapped (`None`).
pub fn iorate_steps(peak_iops: u64) -> Vec<Option<u64>> {
    (1..=10u128)
        .map(|tenths| Some(((u128::from(peak_iops) * tenths / 10) as u64).max(1)))
        .chain(std::iter::once(None))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes() -> anyhow::Result<()> {
        assert_eq!(parse_sizes("4k,16K,1m")?, vec![4096, 16384, 1 << 20]);
        assert_eq!(parse_sizes(" 512 , 8KiB,2MB")?, vec![512, 8192, 2 << 20]);
        assert_eq!(parse_size("1g")?, 1 << 30);
        Ok(())
    }

    #[test]
    fn rejects_bad_sizes_naming_the_flag() {
        for bad in [
            "",
            "4k,",
            "k",
            "4x",
            "4k,4k",
            "1000",
            "0",
            "99999999999999999999k",
        ] {
            let err = format!("{:#}", parse_sizes(bad).expect_err(bad));
            assert!(err.contains("--sizes"), "{bad:?}: {err}");
        }
        let err = format!("{:#}", parse_sizes("4q").expect_err("4q"));
        assert!(err.contains("not a size"), "{err}");
        let err = format!("{:#}", parse_sizes("1000").expect_err("1000"));
        assert!(err.contains("multiple of 512"), "{err}");
    }

    #[test]
    fn parses_patterns() -> anyhow::Result<()> {
        assert_eq!(
            parse_patterns("read,randwrite")?,
            vec![Pattern::Read, Pattern::RandWrite]
        );
        assert_eq!(
            parse_patterns("RandRead, write")?,
            vec![Pattern::RandRead, Pattern::Write]
        );
        for p in Pattern::ALL {
            assert_eq!(p.name().parse::<Pattern>()?, p);
            assert_eq!(p.to_string(), p.name());
        }
        Ok(())
    }

    #[test]
    fn rejects_bad_patterns_listing_valid_ones() {
        for bad in ["", "rw", "read,", "read,read", "randrw"] {
            let err = format!("{:#}", parse_patterns(bad).expect_err(bad));
            assert!(err.contains("--patterns"), "{bad:?}: {err}");
        }
        let err = format!("{:#}", parse_patterns("rw").expect_err("rw"));
        assert!(err.contains("read, write, randread, randwrite"), "{err}");
    }

    #[test]
    fn labels_sizes() {
        assert_eq!(size_label(512), "512");
        assert_eq!(size_label(4096), "4K");
        assert_eq!(size_label(65536), "64K");
        assert_eq!(size_label(1 << 20), "1M");
        assert_eq!(size_label(1536), "1536");
        assert_eq!(size_label(12 << 10), "12K");
        assert_eq!(size_label(1 << 30), "1G");
    }

    #[test]
    fn default_plan_points_in_order() {
        let plan = SweepPlan::default();
        assert_eq!(
            plan.block_sizes,
            vec![
                4096,
                8192,
                16384,
                32768,
                65536,
                131072,
                262144,
                524288,
                1 << 20
            ]
        );
        let points = plan.points();
        assert_eq!(points.len(), 4 * 9);
        assert_eq!(
            points[0],
            Point {
                pattern: Pattern::Read,
                block_size: 4096
            }
        );
        assert_eq!(
            points[8],
            Point {
                pattern: Pattern::Read,
                block_size: 1 << 20
            }
        );
        assert_eq!(
            points[9],
            Point {
                pattern: Pattern::Write,
                block_size: 4096
            }
        );
        assert_eq!(points[35].pattern, Pattern::RandWrite);
        assert_eq!(
            plan.estimated_duration(),
            Duration::from_secs(36 * plan.seconds_per_point)
        );
    }

    #[test]
    fn points_sorted_by_size_within_given_pattern_order() -> anyhow::Result<()> {
        let plan = SweepPlan {
            block_sizes: parse_sizes("1m,4k,64k")?,
            patterns: parse_patterns("randwrite,read")?,
            seconds_per_point: 3,
        };
        let got: Vec<String> = plan.points().iter().map(|p| p.to_string()).collect();
        assert_eq!(
            got,
            [
                "randwrite 4K",
                "randwrite 64K",
                "randwrite 1M",
                "read 4K",
                "read 64K",
                "read 1M"
            ]
        );
        assert_eq!(plan.estimated_duration(), Duration::from_secs(18));
        Ok(())
    }

    #[test]
    fn runner_runs_each_point_once_and_reports_progress() -> anyhow::Result<()> {
        let plan = SweepPlan::default();
        let mut seen = Vec::new();
        let mut progress = Vec::new();
        let records = run(
            &plan,
            |p| {
                seen.push(*p);
                Ok(PointResult {
                    iops: 1000.0,
                    mib_per_s: 1000.0 * p.block_size as f64 / (1 << 20) as f64,
                    lat_mean_us: 10.0,
                    lat_p99_us: 20.0,
                    errors: 0,
                })
            },
            |done, total, _eta| progress.push((done, total)),
        )?;
        assert_eq!(seen, plan.points());
        assert_eq!(records.len(), 36);
        assert!(records.iter().zip(&seen).all(|(r, p)| r.point() == *p));
        let dones: Vec<usize> = progress.iter().map(|p| p.0).collect();
        assert_eq!(dones, (0..=36).collect::<Vec<_>>());
        assert!(progress.iter().all(|p| p.1 == 36));
        Ok(())
    }

    #[test]
    fn runner_stops_at_first_error_naming_the_point() {
        let plan = SweepPlan::default();
        let mut calls = 0;
        let err = run(
            &plan,
            |p| {
                calls += 1;
                if p.block_size == 16384 {
                    anyhow::bail!("device gone")
                }
                Ok(PointResult::default())
            },
            |_, _, _| {},
        )
        .expect_err("must fail");
        assert_eq!(calls, 3);
        let msg = format!("{err:#}");
        assert!(
            msg.contains("read 16K") && msg.contains("device gone"),
            "{msg}"
        );
    }

    #[test]
    fn gb_per_s_is_decimal() {
        let r = PointResult {
            mib_per_s: 1000.0,
            ..Default::default()
        };
        assert!((r.gb_per_s() - 1.048576).abs() < 1e-9);
    }

    #[test]
    fn iorate_steps_are_tenths_then_uncapped() {
        let steps = iorate_steps(1_000_000);
        assert_eq!(steps.len(), 11);
        assert_eq!(steps[0], Some(100_000));
        assert_eq!(steps[4], Some(500_000));
        assert_eq!(steps[9], Some(1_000_000));
        assert_eq!(steps[10], None);
        assert_eq!(iorate_steps(5)[0], Some(1));
        assert_eq!(iorate_steps(u64::MAX)[9], Some(u64::MAX));
    }
}

//! Results of a sweep as a text table, CSV, JSON and SVG charts, and the files they go to.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;

use super::chart::{self, RunInfo};
use super::{size_label, Pattern, Record};

/// File names written by [`write_files`] and [`write_latency_curve`] into the output directory.
pub const CSV_FILE: &str = "sweep.csv";
/// The JSON array of records.
pub const JSON_FILE: &str = "sweep.json";
/// Bandwidth against block size.
pub const BANDWIDTH_SVG: &str = "bandwidth.svg";
/// IOPS against block size.
pub const IOPS_SVG: &str = "iops.svg";
/// Latency against achieved IOPS (`--latency-curve`).
pub const LATENCY_SVG: &str = "latency.svg";

/// The CSV header line (without newline).
pub const CSV_HEADER: &str =
    "pattern,block_size,iops,mib_per_s,gb_per_s,lat_mean_us,lat_p99_us,errors";

/// Patterns in the order they first appear in `records`.
fn patterns_of(records: &[Record]) -> Vec<Pattern> {
    let mut ps = Vec::new();
    for r in records {
        if !ps.contains(&r.pattern) {
            ps.push(r.pattern);
        }
    }
    ps
}

/// The IOPS and GB/s table: one row per block size (ascending), and for each pattern an IOPS and a
/// GB/s column. A point that was not measured shows `-`.
pub fn table(records: &[Record]) -> String {
    let patterns = patterns_of(records);
    let mut sizes: Vec<u64> = records.iter().map(|r| r.block_size).collect();
    sizes.sort_unstable();
    sizes.dedup();

    let mut header = vec!["block size".to_string()];
    for p in &patterns {
        header.push(format!("{p} IOPS"));
        header.push(format!("{p} GB/s"));
    }
    let mut rows = vec![header];
    for &size in &sizes {
        let mut row = vec![size_label(size)];
        for &p in &patterns {
            match records
                .iter()
                .find(|r| r.pattern == p && r.block_size == size)
            {
                Some(r) => {
                    row.push(format!("{:.0}", r.iops));
                    row.push(format!("{:.2}", r.gb_per_s));
                }
                None => {
                    row.push("-".to_string());
                    row.push("-".to_string());
                }
            }
        }
        rows.push(row);
    }

    let columns = rows[0].len();
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c == 0 {
                let _ = write!(line, "{cell:<w$}", w = widths[c]);
            } else {
                let _ = write!(line, "  {cell:>w$}", w = widths[c]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// CSV: [`CSV_HEADER`], then one line per record in the order given.
pub fn csv(records: &[Record]) -> String {
    let mut out = String::from(CSV_HEADER);
    out.push('\n');
    for r in records {
        let _ = writeln!(
            out,
            "{},{},{:.1},{:.2},{:.4},{:.2},{:.2},{}",
            r.pattern,
            r.block_size,
            r.iops,
            r.mib_per_s,
            r.gb_per_s,
            r.lat_mean_us,
            r.lat_p99_us,
            r.errors
        );
    }
    out
}

/// JSON: a pretty-printed array of records, with the same fields as the CSV.
pub fn json(records: &[Record]) -> anyhow::Result<String> {
    let mut s = serde_json::to_string_pretty(records).context("encoding sweep results as JSON")?;
    s.push('\n');
    Ok(s)
}

/// `1h02m03s`, `4m05s`, `42s`: a compact duration for progress lines.
pub fn format_duration(d: Duration) -> String {
    let s = d.as_secs() + u64::from(d.subsec_millis() >= 500);
    let (h, m, s) = (s / 3600, s / 60 % 60, s % 60);
    if h > 0 {
        format!("{h}h{m:02}m{s:02}s")
    } else if m > 0 {
        format!("{m}m{s:02}s")
    } else {
        format!("{s}s")
    }
}

/// A calendar time in UTC (no time zone database needed, and the same on every machine).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UtcTime {
    pub year: u64,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    /// 0 = Sunday.
    pub weekday: u32,
}

impl UtcTime {
    /// The calendar time `secs` seconds after 1970-01-01 00:00 UTC.
    pub fn from_unix(secs: u64) -> UtcTime {
        let days = secs / 86_400;
        let in_day = secs % 86_400;
        // Days to a civil date, counting in 400-year eras from 0000-03-01 (so that the leap
        // day is the last day of its year).
        let z = days + 719_468;
        let era = z / 146_097;
        let doe = z % 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + u64::from(month <= 2);
        UtcTime {
            year,
            month,
            day,
            hour: (in_day / 3600) as u32,
            minute: (in_day / 60 % 60) as u32,
            second: (in_day % 60) as u32,
            // 1970-01-01 was a Thursday.
            weekday: ((days + 4) % 7) as u32,
        }
    }

    /// Now (a clock before 1970 reads as 1970).
    pub fn now() -> UtcTime {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        UtcTime::from_unix(secs)
    }

    /// `2026-12-01 00:32 UTC`.
    pub fn label(&self) -> String {
        format!(
            "{}-{:02}-{:02} {:02}:{:02} UTC",
            self.year, self.month, self.day, self.hour, self.minute
        )
    }

    /// C's `ctime` layout, as fio's JSON `time` has it: `Tue Dec  1 00:32:05 2026`.
    pub fn ctime(&self) -> String {
        const DAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
        const MONTHS: [&str; 12] = [
            "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
        ];
        let weekday = DAYS.get(self.weekday as usize).unwrap_or(&"?");
        let month = MONTHS
            .get((self.month as usize).wrapping_sub(1))
            .unwrap_or(&"?");
        format!(
            "{weekday} {month} {:>2} {:02}:{:02}:{:02} {}",
            self.day, self.hour, self.minute, self.second, self.year
        )
    }
}

/// One progress-bar line for the callback of [`run`](super::run), without newline, e.g.
/// `[########------------]  12/36 points  33%  3m20s left`. Redraw it with `\r` on a terminal.
pub fn progress_line(done: usize, total: usize, eta: Duration) -> String {
    const WIDTH: usize = 20;
    let frac = if total == 0 {
        1.0
    } else {
        done.min(total) as f64 / total as f64
    };
    let filled = (frac * WIDTH as f64).round() as usize;
    format!(
        "[{}{}] {done:>w$}/{total} points {:>3.0}%  {} left",
        "#".repeat(filled),
        "-".repeat(WIDTH - filled),
        frac * 100.0,
        format_duration(eta),
        w = total.to_string().len(),
    )
}

/// Paths of the files [`write_files`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepFiles {
    /// `sweep.csv`.
    pub csv: PathBuf,
    /// `sweep.json`.
    pub json: PathBuf,
    /// `bandwidth.svg`.
    pub bandwidth_svg: PathBuf,
    /// `iops.svg`.
    pub iops_svg: PathBuf,
}

fn write(dir: &Path, name: &str, contents: &str) -> anyhow::Result<PathBuf> {
    let path = dir.join(name);
    fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

fn ensure_dir(dir: &Path) -> anyhow::Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("creating output directory {}", dir.display()))
}

/// Write `sweep.csv`, `sweep.json`, `bandwidth.svg` and `iops.svg` into `dir` (created if missing);
/// the charts say what was measured (`info`).
pub fn write_files(dir: &Path, records: &[Record], info: &RunInfo) -> anyhow::Result<SweepFiles> {
    ensure_dir(dir)?;
    Ok(SweepFiles {
        csv: write(dir, CSV_FILE, &csv(records))?,
        json: write(dir, JSON_FILE, &json(records)?)?,
        bandwidth_svg: write(dir, BANDWIDTH_SVG, &chart::bandwidth_chart(records, info)?)?,
        iops_svg: write(dir, IOPS_SVG, &chart::iops_chart(records, info)?)?,
    })
}

/// Write the `--latency-curve` chart to `latency.svg` in `dir` (created if missing).
/// `points` are `(achieved_iops, mean_us, p99_us)`.
pub fn write_latency_curve(
    dir: &Path,
    points: &[(f64, f64, f64)],
    info: &RunInfo,
) -> anyhow::Result<PathBuf> {
    ensure_dir(dir)?;
    write(dir, LATENCY_SVG, &chart::latency_curve(points, info)?)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::sweep::{run, PointResult, SweepPlan};

    /// Fake results for the default plan: IOPS fall as the block size grows, bandwidth rises.
    pub(crate) fn fake_records() -> anyhow::Result<Vec<Record>> {
        run(
            &SweepPlan::default(),
            |p| {
                let iops = 4.0e9 / (p.block_size as f64 + 4096.0)
                    * if p.pattern.is_read() { 1.0 } else { 0.6 };
                Ok(PointResult {
                    iops,
                    mib_per_s: iops * p.block_size as f64 / (1u64 << 20) as f64,
                    lat_mean_us: 80.0,
                    lat_p99_us: 150.0,
                    errors: u64::from(p.pattern.is_random()),
                })
            },
            |_, _, _| {},
        )
    }

    #[test]
    fn table_has_a_row_per_size_and_columns_per_pattern() -> anyhow::Result<()> {
        let t = table(&fake_records()?);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 1 + 9, "{t}");
        for col in [
            "block size",
            "read IOPS",
            "read GB/s",
            "randwrite IOPS",
            "randwrite GB/s",
        ] {
            assert!(lines[0].contains(col), "{t}");
        }
        assert!(lines[1].starts_with("4K "), "{t}");
        assert!(lines[9].starts_with("1M "), "{t}");
        // 4 KiB read: 4e9 / 8192 = 488281 IOPS, 2.00 GB/s.
        assert!(
            lines[1].contains("488281") && lines[1].contains("2.00"),
            "{t}"
        );
        Ok(())
    }

    #[test]
    fn table_marks_missing_points() -> anyhow::Result<()> {
        let mut rs = fake_records()?;
        rs.retain(|r| !(r.pattern == Pattern::Write && r.block_size == 8192));
        let t = table(&rs);
        assert!(t.lines().nth(2).is_some_and(|l| l.contains(" -")), "{t}");
        assert_eq!(table(&[]), "block size\n");
        Ok(())
    }

    #[test]
    fn csv_has_header_and_a_line_per_point() -> anyhow::Result<()> {
        let c = csv(&fake_records()?);
        let lines: Vec<&str> = c.lines().collect();
        assert_eq!(lines.len(), 1 + 4 * 9);
        assert_eq!(lines[0], CSV_HEADER);
        assert!(lines[1].starts_with("read,4096,488281.2,"), "{}", lines[1]);
        assert!(lines[36].starts_with("randwrite,1048576,"), "{}", lines[36]);
        assert!(lines[36].ends_with(",80.00,150.00,1"), "{}", lines[36]);
        assert!(lines.iter().all(|l| l.split(',').count() == 8));
        Ok(())
    }

    #[test]
    fn json_parses_back() -> anyhow::Result<()> {
        let rs = fake_records()?;
        let text = json(&rs)?;
        let back: Vec<Record> = serde_json::from_str(&text)?;
        assert_eq!(back.len(), rs.len());
        for (b, r) in back.iter().zip(&rs) {
            assert_eq!((b.point(), b.errors), (r.point(), r.errors));
            assert!((b.iops - r.iops).abs() <= 1e-9 * r.iops);
            assert!((b.gb_per_s - r.gb_per_s).abs() <= 1e-9 * r.gb_per_s);
        }
        let v: serde_json::Value = serde_json::from_str(&text)?;
        assert_eq!(v[2]["pattern"], "read");
        assert_eq!(v[2]["block_size"], 16384);
        assert_eq!(v[20]["pattern"], "randread");
        assert!(v[0]["gb_per_s"]
            .as_f64()
            .is_some_and(|g| (g - 2.0).abs() < 1e-6));
        Ok(())
    }

    #[test]
    fn progress_lines() {
        assert_eq!(
            progress_line(0, 36, Duration::from_secs(360)),
            "[--------------------]  0/36 points   0%  6m00s left"
        );
        assert_eq!(
            progress_line(18, 36, Duration::from_millis(2500)),
            "[##########----------] 18/36 points  50%  3s left"
        );
        assert!(progress_line(36, 36, Duration::ZERO).starts_with("[####################] 36/36"));
        assert_eq!(format_duration(Duration::from_secs(3723)), "1h02m03s");
    }

    #[test]
    fn utc_calendar_times() {
        // what fio 3.33 printed for its JSON `timestamp` 1796085125 on a UTC machine
        let t = UtcTime::from_unix(1_796_085_125);
        assert_eq!(t.ctime(), "Tue Dec  1 00:32:05 2026");
        assert_eq!(t.label(), "2026-12-01 00:32 UTC");
        assert_eq!(UtcTime::from_unix(0).ctime(), "Thu Jan  1 00:00:00 1970");
        // a leap day, and the last second of a leap year
        assert_eq!(
            UtcTime::from_unix(951_782_400).label(),
            "2000-02-29 00:00 UTC"
        );
        assert_eq!(
            UtcTime::from_unix(1_735_689_599).ctime(),
            "Tue Dec 31 23:59:59 2024"
        );
        assert!(UtcTime::now().year >= 2024);
    }

    #[test]
    fn writes_all_files_with_fixed_names() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let out = dir.path().join("results");
        let info = chart::tests::run_info();
        let files = write_files(&out, &fake_records()?, &info)?;
        assert_eq!(files.csv, out.join("sweep.csv"));
        assert_eq!(files.json, out.join("sweep.json"));
        assert_eq!(files.bandwidth_svg, out.join("bandwidth.svg"));
        assert_eq!(files.iops_svg, out.join("iops.svg"));
        assert_eq!(fs::read_to_string(&files.csv)?.lines().count(), 37);
        for svg in [&files.bandwidth_svg, &files.iops_svg] {
            let s = fs::read_to_string(svg)?;
            assert!(s.starts_with("<svg"), "{}", svg.display());
            assert!(s.contains("randread") && s.contains("Block size"));
            assert!(s.contains("4 drives: sim:0-3"), "{}", svg.display());
        }
        let lat = write_latency_curve(&out, &[(1e5, 50.0, 90.0), (2e5, 60.0, 120.0)], &info)?;
        assert_eq!(lat, out.join("latency.svg"));
        assert!(fs::read_to_string(&lat)?.starts_with("<svg"));
        Ok(())
    }
}

//! SVG line charts for `usnvme sweep`, drawn with `plotters` (SVG backend only).
//!
//! Text is written as SVG `<text>` elements and sized with plotters' built-in estimate, so no system
//! font (nor fontconfig) is needed to draw; the viewer picks the font.
//!
//! Under each title a caption says what was measured, as fio-plot's subtitle does: a chart passed
//! around on its own still names the drives, queue depth, cores, time per point, date and version.

use anyhow::anyhow;
use plotters::prelude::*;
use usnvme_engine::topology::format_cpu_list;

use super::output::UtcTime;
use super::{size_label, Pattern, Record};

/// Chart width in pixels.
const WIDTH: u32 = 960;
/// Chart height in pixels.
const HEIGHT: u32 = 600;

/// Longest drive list in a caption, in characters: longer ones are cut (the count stays).
const MAX_DRIVES_TEXT: usize = 72;

/// What a sweep measured and when: the caption under each chart's title.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunInfo {
    /// The drives measured, by name (`sim:0`, `0000:01:00.0`).
    pub drives: Vec<String>,
    /// I/Os in flight per reactor core per device (`-q`).
    pub queue_depth: u32,
    /// The reactor cores.
    pub cores: Vec<usize>,
    /// Measured seconds per point (`-t`).
    pub seconds_per_point: u64,
    /// When the sweep ran, e.g. `2026-12-01 00:32 UTC`.
    pub date: String,
    /// The usnvme version that measured.
    pub version: String,
}

impl RunInfo {
    /// A run of this build, dated now.
    pub fn now(
        drives: Vec<String>,
        queue_depth: u32,
        cores: Vec<usize>,
        seconds_per_point: u64,
    ) -> RunInfo {
        RunInfo {
            drives,
            queue_depth,
            cores,
            seconds_per_point,
            date: UtcTime::now().label(),
            version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }

    /// The two caption lines: what was measured, then when and by which version.
    pub fn caption(&self) -> [String; 2] {
        let n = self.cores.len();
        let cores = if n == 1 { "core" } else { "cores" };
        [
            format!(
                "{} · QD {} per core per drive · {n} {cores}: {} · {} s per point",
                drives_label(&self.drives),
                self.queue_depth,
                format_cpu_list(&self.cores),
                self.seconds_per_point
            ),
            format!("{} · usnvme {}", self.date, self.version),
        ]
    }
}

/// `4 drives: sim:0-3`, `1 drive: 0000:01:00.0`: numbered names in a row become a range, and a
/// list too long for the chart is cut, saying how many names were left out.
fn drives_label(names: &[String]) -> String {
    // "sim:12" -> ("sim:", 12); a name without a trailing number stands alone
    let split = |name: &str| -> Option<(String, u64)> {
        let prefix = name.trim_end_matches(|c: char| c.is_ascii_digit());
        let number = name[prefix.len()..].parse().ok()?;
        Some((prefix.to_string(), number))
    };
    let mut items: Vec<String> = Vec::new();
    let mut run: Option<(String, u64, u64)> = None;
    let flush = |run: &mut Option<(String, u64, u64)>, items: &mut Vec<String>| {
        if let Some((prefix, first, last)) = run.take() {
            items.push(if first == last {
                format!("{prefix}{first}")
            } else {
                format!("{prefix}{first}-{last}")
            });
        }
    };
    for name in names {
        match (split(name), &mut run) {
            (Some((prefix, n)), Some((p, _, last))) if *p == prefix && n == *last + 1 => *last = n,
            (Some((prefix, n)), _) => {
                flush(&mut run, &mut items);
                run = Some((prefix, n, n));
            }
            (None, _) => {
                flush(&mut run, &mut items);
                items.push(name.clone());
            }
        }
    }
    flush(&mut run, &mut items);
    let mut list = String::new();
    for (i, item) in items.iter().enumerate() {
        if i > 0 && list.len() + item.len() + 2 > MAX_DRIVES_TEXT {
            list.push_str(&format!(" … (+{} more)", items.len() - i));
            break;
        }
        if i > 0 {
            list.push_str(", ");
        }
        list.push_str(item);
    }
    let noun = if names.len() == 1 { "drive" } else { "drives" };
    format!("{} {noun}: {list}", names.len())
}

/// One line of a chart.
struct Series {
    name: String,
    color: RGBColor,
    points: Vec<(f64, f64)>,
}

/// How the x axis is scaled and labelled.
#[derive(Clone, Copy)]
enum XAxis {
    /// x is log2(block size); labels read 4K, 64K, 1M.
    Log2Size,
    /// x is a plain quantity (IOPS); labels in K/M.
    Iops,
}

/// A stable colour per pattern (matplotlib's tab10), so every chart reads the same way.
fn pattern_color(p: Pattern) -> RGBColor {
    match p {
        Pattern::Read => RGBColor(31, 119, 180),
        Pattern::Write => RGBColor(255, 127, 14),
        Pattern::RandRead => RGBColor(44, 160, 44),
        Pattern::RandWrite => RGBColor(214, 39, 40),
    }
}

/// `1.5M`, `250K`, `12.5K`, `900`: compact IOPS labels.
fn iops_label(v: f64) -> String {
    let a = v.abs();
    let (x, unit) = if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e3 {
        (v / 1e3, "K")
    } else {
        (v, "")
    };
    let s = format!("{x:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s}{unit}")
}

/// Label for a tick of the log2 block-size axis: only whole powers of two get a label.
fn log2_label(v: f64) -> String {
    let r = v.round();
    if (v - r).abs() < 1e-6 && (0.0..63.0).contains(&r) {
        size_label(1u64 << r as u32)
    } else {
        String::new()
    }
}

/// Decimal places that keep y labels distinct for a range up to `max`.
fn decimals_for(max: f64) -> usize {
    if max < 1.0 {
        2
    } else if max < 10.0 {
        1
    } else {
        0
    }
}

/// One series per pattern present in `records`, in the default pattern order, with x = log2(block
/// size) and y from `y`, sorted by block size.
fn series_by_pattern(records: &[Record], y: impl Fn(&Record) -> f64) -> Vec<Series> {
    Pattern::ALL
        .into_iter()
        .filter_map(|p| {
            let mut rs: Vec<&Record> = records.iter().filter(|r| r.pattern == p).collect();
            if rs.is_empty() {
                return None;
            }
            rs.sort_by_key(|r| r.block_size);
            Some(Series {
                name: p.name().to_string(),
                color: pattern_color(p),
                points: rs
                    .iter()
                    .map(|r| ((r.block_size.max(1) as f64).log2(), y(r)))
                    .collect(),
            })
        })
        .collect()
}

/// Draw a line chart with markers and a legend (placed where the lines usually leave room), the
/// title and under it the caption of `info`; returns the SVG document.
#[allow(clippy::too_many_arguments)]
fn line_chart(
    title: &str,
    info: &RunInfo,
    x_desc: &str,
    y_desc: &str,
    x_axis: XAxis,
    y_is_iops: bool,
    legend: SeriesLabelPosition,
    series: &[Series],
) -> anyhow::Result<String> {
    let all = || series.iter().flat_map(|s| s.points.iter().copied());
    let finite = |v: &f64| v.is_finite();
    let x_min = all()
        .map(|p| p.0)
        .filter(finite)
        .fold(f64::INFINITY, f64::min);
    let x_max = all()
        .map(|p| p.0)
        .filter(finite)
        .fold(f64::NEG_INFINITY, f64::max);
    let y_max = all().map(|p| p.1).filter(finite).fold(0.0, f64::max);
    let (x_lo, x_hi, x_labels) = match x_axis {
        XAxis::Log2Size => {
            let (lo, hi) = if x_min.is_finite() {
                (x_min.floor(), x_max.ceil())
            } else {
                (12.0, 20.0)
            };
            let span = hi - lo;
            (lo - 0.25, hi + 0.25, span as usize + 1)
        }
        XAxis::Iops => {
            let hi = if x_max.is_finite() && x_max > 0.0 {
                x_max * 1.05
            } else {
                1.0
            };
            (0.0, hi, 10)
        }
    };
    let y_hi = if y_max > 0.0 { y_max * 1.1 } else { 1.0 };
    let y_decimals = decimals_for(y_hi);

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let mut area = root.titled(title, ("sans-serif", 24)).map_err(plot_err)?;
        let grey = RGBColor(80, 80, 80);
        for line in info.caption() {
            area = area
                .titled(&line, ("sans-serif", 15).into_font().color(&grey))
                .map_err(plot_err)?;
        }
        let mut chart = ChartBuilder::on(&area)
            .margin(16)
            .x_label_area_size(56)
            .y_label_area_size(88)
            .build_cartesian_2d(x_lo..x_hi, 0.0..y_hi)
            .map_err(plot_err)?;
        let x_fmt = |v: &f64| match x_axis {
            XAxis::Log2Size => log2_label(*v),
            XAxis::Iops => iops_label(*v),
        };
        let y_fmt = |v: &f64| {
            if y_is_iops {
                iops_label(*v)
            } else {
                format!("{v:.y_decimals$}")
            }
        };
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .x_labels(x_labels)
            .y_labels(10)
            .x_label_formatter(&x_fmt)
            .y_label_formatter(&y_fmt)
            .axis_desc_style(("sans-serif", 18))
            .label_style(("sans-serif", 14))
            .light_line_style(WHITE)
            .draw()
            .map_err(plot_err)?;
        for s in series {
            let color = s.color;
            let style = color.stroke_width(2);
            chart
                .draw_series(LineSeries::new(s.points.iter().copied(), style))
                .map_err(plot_err)?
                .label(s.name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(2))
                });
            chart
                .draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(plot_err)?;
        }
        chart
            .configure_series_labels()
            .position(legend)
            .label_font(("sans-serif", 16))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}

/// plotters' errors carry the backend error type; keep their message.
fn plot_err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("drawing chart: {e}")
}

/// Bandwidth (GB/s, 10^9 bytes per second) against block size, one line per pattern.
pub fn bandwidth_chart(records: &[Record], info: &RunInfo) -> anyhow::Result<String> {
    let series = series_by_pattern(records, |r| r.gb_per_s);
    line_chart(
        "Bandwidth vs block size",
        info,
        "Block size",
        "Bandwidth (GB/s)",
        XAxis::Log2Size,
        false,
        // Bandwidth rises with block size: the lower right is free.
        SeriesLabelPosition::LowerRight,
        &series,
    )
}

/// IOPS against block size, one line per pattern.
pub fn iops_chart(records: &[Record], info: &RunInfo) -> anyhow::Result<String> {
    let series = series_by_pattern(records, |r| r.iops);
    line_chart(
        "IOPS vs block size",
        info,
        "Block size",
        "IOPS",
        XAxis::Log2Size,
        true,
        // IOPS fall with block size: the upper right is free.
        SeriesLabelPosition::UpperRight,
        &series,
    )
}

/// The `--latency-curve` chart (vdbench's iorate method): average and p99 latency (µs) against
/// achieved IOPS. `points` are `(achieved_iops, mean_us, p99_us)`, in any order.
pub fn latency_curve(points: &[(f64, f64, f64)], info: &RunInfo) -> anyhow::Result<String> {
    let mut pts = points.to_vec();
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    let series = [
        Series {
            name: "average".to_string(),
            color: RGBColor(31, 119, 180),
            points: pts.iter().map(|p| (p.0, p.1)).collect(),
        },
        Series {
            name: "p99".to_string(),
            color: RGBColor(214, 39, 40),
            points: pts.iter().map(|p| (p.0, p.2)).collect(),
        },
    ];
    line_chart(
        "Latency vs IOPS",
        info,
        "Achieved IOPS",
        "Latency (µs)",
        XAxis::Iops,
        false,
        // Latency rises with load: the upper left is free.
        SeriesLabelPosition::UpperLeft,
        &series,
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::sweep::output::tests::fake_records;

    /// A sweep of 4 sim drives at QD 32 from cores 0 and 1, 10 s a point, on a fixed date.
    pub(crate) fn run_info() -> RunInfo {
        RunInfo {
            drives: (0..4).map(|i| format!("sim:{i}")).collect(),
            queue_depth: 32,
            cores: vec![0, 1],
            seconds_per_point: 10,
            date: "2026-12-01 00:32 UTC".into(),
            version: "0.1.0".into(),
        }
    }

    /// The contents of every `<text>` element, trimmed.
    fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| {
                let body = &t[t.find('>')? + 1..];
                Some(body[..body.find("</text>")?].trim().to_string())
            })
            .collect()
    }

    /// A whole SVG document whose text elements include each of `labels`.
    fn assert_svg(svg: &str, labels: &[&str]) {
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
        assert!(svg.trim_end().ends_with("</svg>"));
        let texts = texts(svg);
        for l in labels {
            assert!(texts.iter().any(|t| t == l), "no text {l:?} in {texts:?}");
        }
    }

    #[test]
    fn bandwidth_chart_has_series_axes_and_size_labels() -> anyhow::Result<()> {
        let svg = bandwidth_chart(&fake_records()?, &run_info())?;
        assert_svg(
            &svg,
            &[
                "Bandwidth vs block size",
                "Block size",
                "Bandwidth (GB/s)",
                "read",
                "write",
                "randread",
                "randwrite",
                "4K",
                "64K",
                "1M",
            ],
        );
        Ok(())
    }

    #[test]
    fn iops_chart_has_series_axes_and_size_labels() -> anyhow::Result<()> {
        let svg = iops_chart(&fake_records()?, &run_info())?;
        assert_svg(
            &svg,
            &[
                "IOPS vs block size",
                "Block size",
                "IOPS",
                "randread",
                "4K",
                "1M",
            ],
        );
        Ok(())
    }

    #[test]
    fn latency_curve_has_average_and_p99() -> anyhow::Result<()> {
        let pts: Vec<(f64, f64, f64)> = (1..=10)
            .map(|i| {
                let i = f64::from(i);
                (i * 1e5, 20.0 + i * i, 40.0 + 3.0 * i * i)
            })
            .collect();
        let svg = latency_curve(&pts, &run_info())?;
        assert_svg(
            &svg,
            &[
                "Latency vs IOPS",
                "Achieved IOPS",
                "Latency (µs)",
                "average",
                "p99",
                "1M",
            ],
        );
        Ok(())
    }

    #[test]
    fn empty_input_still_draws() -> anyhow::Result<()> {
        assert_svg(&bandwidth_chart(&[], &run_info())?, &["Block size"]);
        assert_svg(&latency_curve(&[], &run_info())?, &["Achieved IOPS"]);
        Ok(())
    }

    #[test]
    fn charts_say_what_was_measured_and_when() -> anyhow::Result<()> {
        let records = fake_records()?;
        let info = run_info();
        let caption = [
            "4 drives: sim:0-3 · QD 32 per core per drive · 2 cores: 0-1 · 10 s per point",
            "2026-12-01 00:32 UTC · usnvme 0.1.0",
        ];
        for svg in [
            bandwidth_chart(&records, &info)?,
            iops_chart(&records, &info)?,
            latency_curve(&[(1e5, 50.0, 90.0)], &info)?,
        ] {
            assert_svg(&svg, &caption);
        }
        // a run of this build is dated now and names its version
        let now = RunInfo::now(vec!["0000:01:00.0".into()], 1, vec![3], 2);
        let [what, when] = now.caption();
        assert_eq!(
            what,
            "1 drive: 0000:01:00.0 · QD 1 per core per drive · 1 core: 3 · 2 s per point"
        );
        assert!(when.ends_with(&format!(" UTC · usnvme {}", env!("CARGO_PKG_VERSION"))));
        assert!(when.starts_with("20"), "{when}");
        Ok(())
    }

    #[test]
    fn drive_lists_are_ranges_and_cut_to_fit() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            drives_label(&names(&["sim:0", "sim:1", "sim:2", "sim:5", "sim:6"])),
            "5 drives: sim:0-2, sim:5-6"
        );
        let bdfs: Vec<String> = (1..=24).map(|b| format!("0000:{b:02x}:00.0")).collect();
        let label = drives_label(&bdfs);
        assert!(
            label.starts_with("24 drives: 0000:01:00.0, 0000:02:00.0, "),
            "{label}"
        );
        assert!(label.ends_with(" more)"), "{label}");
        assert!(label.len() < MAX_DRIVES_TEXT + 40, "{label}");
        let all: Vec<String> = (0..24).map(|i| format!("sim:{i}")).collect();
        assert_eq!(drives_label(&all), "24 drives: sim:0-23");
    }

    #[test]
    fn labels() {
        assert_eq!(iops_label(1_500_000.0), "1.5M");
        assert_eq!(iops_label(250_000.0), "250K");
        assert_eq!(iops_label(900.0), "900");
        assert_eq!(iops_label(0.0), "0");
        assert_eq!(log2_label(12.0), "4K");
        assert_eq!(log2_label(20.0), "1M");
        assert_eq!(log2_label(12.5), "");
    }
}

//! SVG line charts for `usnvme sweep`, drawn with `plotters` (SVG backend only).
//!
//! Text is written as SVG `<text>` elements and sized with plotters' built-in estimate, so no system
//! font (nor fontconfig) is needed to draw; the viewer picks the font.

use anyhow::anyhow;
use plotters::prelude::*;

use super::{size_label, Pattern, Record};

/// Chart width in pixels.
const WIDTH: u32 = 960;
/// Chart height in pixels.
const HEIGHT: u32 = 600;

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

/// Draw a line chart with markers and a legend (placed where the lines usually leave room);
/// returns the SVG document.
fn line_chart(
    title: &str,
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
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 24))
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
pub fn bandwidth_chart(records: &[Record]) -> anyhow::Result<String> {
    let series = series_by_pattern(records, |r| r.gb_per_s);
    line_chart(
        "Bandwidth vs block size",
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
pub fn iops_chart(records: &[Record]) -> anyhow::Result<String> {
    let series = series_by_pattern(records, |r| r.iops);
    line_chart(
        "IOPS vs block size",
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
pub fn latency_curve(points: &[(f64, f64, f64)]) -> anyhow::Result<String> {
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
mod tests {
    use super::*;
    use crate::sweep::output::tests::fake_records;

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
        let svg = bandwidth_chart(&fake_records()?)?;
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
        let svg = iops_chart(&fake_records()?)?;
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
        let svg = latency_curve(&pts)?;
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
        assert_svg(&bandwidth_chart(&[])?, &["Block size"]);
        assert_svg(&latency_curve(&[])?, &["Achieved IOPS"]);
        Ok(())
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

//! The scaling section (`--only scale`): one `usnvme perf` process on 1, 2, 4, … of this
//! machine's cores against as many separate single-core processes, in three layouts (every core
//! on every one of 24 drives, one drive per core, a stripe over the 24), and `usnvme serve` on
//! 1, 2, 4, 8 reactors against `usnvme perf` on the cores left. Inline `sim:` null drives, 4 KiB
//! random reads: what is measured is the host side's cost and what it shares between cores.
//! The figures go into a table and a chart (`benchmarks/scaling.svg` beside the report).

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result};
use plotters::prelude::*;

use super::native::{list, start_serve, stop_serve, usnvme_perf};
use super::{code, open_section, Companions, Headlines, MISSING};

const DRIVES: u32 = 24;
const QD: u32 = 128;
/// Namespaces `serve` exports, and the initiator's depth on each.
const SERVE_NAMESPACES: u32 = 8;
const SERVE_QD: u32 = 32;

/// How the drives are laid out over the cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Every core has a queue pair on every one of the 24 drives.
    EveryDrive,
    /// Core k drives drive k alone, through one queue pair (`queues=1`).
    DrivePerCore,
    /// Every core on a stripe over the 24 drives.
    Stripe,
}

impl Layout {
    const ALL: [Layout; 3] = [Layout::EveryDrive, Layout::DrivePerCore, Layout::Stripe];

    fn name(self) -> &'static str {
        match self {
            Layout::EveryDrive => "every core on every drive (24)",
            Layout::DrivePerCore => "one drive per core",
            Layout::Stripe => "stripe over 24 drives",
        }
    }

    /// `usnvme perf`'s device arguments for `cores` cores in one process.
    fn devices(self, cores: usize) -> Vec<String> {
        let every = format!("sim:0-{}", DRIVES - 1);
        match self {
            Layout::EveryDrive => vec!["-r".into(), every],
            Layout::DrivePerCore => vec!["-r".into(), format!("sim:0-{},queues=1", cores - 1)],
            Layout::Stripe => vec!["-r".into(), every, "--stripe".into(), DRIVES.to_string()],
        }
    }

    /// The reference process on one core: the same layout as one core sees it.
    fn single(self) -> Vec<String> {
        match self {
            Layout::DrivePerCore => vec!["-r".into(), "sim:0,queues=1".into()],
            other => other.devices(1),
        }
    }
}

/// One layout on some cores.
#[derive(Debug, Clone)]
pub struct Row {
    pub layout: Layout,
    pub cores: usize,
    /// IOPS of the one process, and of as many separate single-core processes together.
    pub one: Result<f64, String>,
    pub separate: Result<f64, String>,
    pub command: String,
}

/// `serve` on some reactors.
#[derive(Debug, Clone)]
pub struct ServeRow {
    pub target_cores: usize,
    pub initiator_cores: Vec<u32>,
    pub iops: Result<f64, String>,
    pub command: String,
}

#[derive(Debug)]
pub struct ScaleResults {
    pub cores: usize,
    pub seconds: u32,
    pub rows: Vec<Row>,
    pub serve: Vec<ServeRow>,
}

/// 1, 2, 4, … up to `cores`, and `cores` itself.
fn core_counts(cores: usize) -> Vec<usize> {
    let mut counts: Vec<usize> = std::iter::successors(Some(1), |c| Some(c * 2))
        .take_while(|&c| c <= cores)
        .collect();
    if counts.last() != Some(&cores) {
        counts.push(cores);
    }
    counts
}

fn perf_args(devices: &[String], cores: &str, qd: u32, seconds: u32) -> Vec<String> {
    let mut args = vec!["perf".to_string()];
    args.extend(devices.iter().cloned());
    for (flag, value) in [
        ("-c", cores.to_string()),
        ("-q", qd.to_string()),
        ("-o", "4k".into()),
        ("-w", "randread".into()),
        ("-t", seconds.to_string()),
    ] {
        args.extend([flag.to_string(), value]);
    }
    args
}

pub fn run(usnvme: &Path, seconds: u32) -> Result<ScaleResults> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let work = crate::target_dir().join("bench-scale");
    std::fs::create_dir_all(&work)?;
    let mut rows = Vec::new();
    for n in core_counts(cores) {
        for layout in Layout::ALL {
            println!("bench: scale, {} on {n} core(s)", layout.name());
            let args = perf_args(&layout.devices(n), &format!("0-{}", n - 1), QD, seconds);
            let one = usnvme_perf(usnvme, &args, &work.join("one.json"), seconds);
            let separate = separate_processes(usnvme, layout, n, seconds, &work);
            rows.push(Row {
                layout,
                cores: n,
                one,
                separate,
                command: format!("usnvme {}", args.join(" ")),
            });
        }
    }
    let mut serve = Vec::new();
    for target_cores in [1usize, 2, 4, 8].into_iter().filter(|&t| t < cores) {
        println!("bench: scale, serve on {target_cores} reactor(s)");
        let target: Vec<u32> = (0..target_cores as u32).collect();
        let initiator: Vec<u32> = (target_cores as u32..cores as u32).collect();
        let devices = format!("sim:0-{}", SERVE_NAMESPACES - 1);
        let (child, _) = start_serve(usnvme, &devices, &target)?;
        let remote = vec!["-r".to_string(), super::native::serve_address()];
        let args = perf_args(&remote, &list(&initiator), SERVE_QD, seconds);
        let iops = usnvme_perf(usnvme, &args, &work.join("serve.json"), seconds);
        stop_serve(child);
        serve.push(ServeRow {
            target_cores,
            initiator_cores: initiator,
            iops,
            command: format!("usnvme {}", args.join(" ")),
        });
    }
    Ok(ScaleResults {
        cores,
        seconds,
        rows,
        serve,
    })
}

/// `n` single-core processes of `layout` at once, one per core; their IOPS together.
fn separate_processes(
    usnvme: &Path,
    layout: Layout,
    n: usize,
    seconds: u32,
    work: &Path,
) -> Result<f64, String> {
    let children: Vec<(Child, std::path::PathBuf)> = (0..n)
        .map(|k| {
            let json = work.join(format!("separate-{k}.json"));
            let _ = std::fs::remove_file(&json);
            let args = perf_args(&layout.single(), &k.to_string(), QD, seconds);
            Command::new("timeout")
                .arg((seconds + 60).to_string())
                .arg(usnvme)
                .args(&args)
                .arg("--json")
                .arg(&json)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .map(|c| (c, json))
                .map_err(|e| format!("usnvme perf: {e}"))
        })
        .collect::<Result<_, String>>()?;
    let mut total = 0.0;
    for (child, json) in children {
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        let figures = std::fs::read_to_string(&json)
            .ok()
            .and_then(|j| super::spdk::usnvme_figures(&j));
        match figures {
            Some(f) => total += f.iops,
            None => {
                return Err(super::spdk::first_error(&String::from_utf8_lossy(
                    &out.stderr,
                )))
            }
        }
    }
    Ok(total)
}

fn fmt(v: &Result<f64, String>) -> String {
    match v {
        Ok(iops) => format!("{:.2} M", iops / 1e6),
        Err(_) => "failed".into(),
    }
}

fn ratio(a: &Result<f64, String>, b: &Result<f64, String>) -> Option<f64> {
    match (a, b) {
        (Ok(a), Ok(b)) if *b > 0.0 => Some(a / b),
        _ => None,
    }
}

fn percent(r: Option<f64>) -> String {
    r.map_or("-".into(), |r| format!("{:.0} %", r * 100.0))
}

/// The section's heading.
pub const HEADING: &str = "Scaling over cores (host, `sim` null drives)";

/// The chart's file, in the report's companions.
const CHART: &str = "scaling.svg";

/// A row's efficiency: one process ÷ the separate processes; the stripe ÷ the every-drive
/// namespaces in one process.
fn efficiency(r: &ScaleResults, row: &Row) -> Option<f64> {
    match row.layout {
        Layout::Stripe => ratio(&row.one, &every_drive(r, row.cores)),
        _ => ratio(&row.one, &row.separate),
    }
}

/// The section's headline figures: each layout's efficiency on the most cores.
fn headlines(h: &mut Headlines, r: &ScaleResults) {
    for layout in Layout::ALL {
        let Some(row) = r.rows.iter().rev().find(|row| row.layout == layout) else {
            continue;
        };
        let against = match layout {
            Layout::Stripe => "the namespaces of every drive in one process",
            _ => "as many separate single-core processes",
        };
        h.add(
            HEADING,
            format!(
                "Efficiency on {} core{}, {}: one `usnvme perf` process ÷ {against}",
                row.cores,
                if row.cores == 1 { "" } else { "s" },
                layout.name()
            ),
            efficiency(r, row).map_or(MISSING.into(), |e| {
                format!("{} ({} IOPS)", percent(Some(e)), fmt(&row.one))
            }),
            code(&row.command),
        );
    }
}

pub fn section(
    m: &mut String,
    results: Option<&ScaleResults>,
    why_not: &str,
    companions: &Companions,
    h: &mut Headlines,
) -> Result<()> {
    let Some(r) = open_section(m, HEADING, results, why_not)? else {
        return Ok(());
    };
    headlines(h, r);
    writeln!(
        m,
        "On this machine's {} cores: one `usnvme perf` process on the first N cores against N \
         separate single-core processes run at once (the reference: nothing shared between \
         them but the machine), {} s per run, 4 KiB random reads, QD {QD} per device, inline \
         `sim:` null drives. *Efficiency*: one process / separate processes; for the stripe, \
         the stripe / every-drive namespaces in one process. Chart: {}.\n",
        r.cores,
        r.seconds,
        companions.link(CHART)
    )?;
    writeln!(
        m,
        "| layout | cores | one process | per core | separate processes | efficiency |\n\
         |---|---:|---:|---:|---:|---:|"
    )?;
    for row in &r.rows {
        let per_core = row
            .one
            .as_ref()
            .map(|i| i / row.cores as f64)
            .map_err(Clone::clone);
        let efficiency = efficiency(r, row);
        writeln!(
            m,
            "| {} | {} | {} | {} | {} | {} |",
            row.layout.name(),
            row.cores,
            fmt(&row.one),
            fmt(&per_core),
            fmt(&row.separate),
            percent(efficiency)
        )?;
    }
    if !r.serve.is_empty() {
        writeln!(
            m,
            "\n`usnvme serve` on the first N cores ({SERVE_NAMESPACES} null namespaces, \
             `--idle poll`) against `usnvme perf` on the cores left (QD {SERVE_QD} per \
             namespace, over loopback); per-core efficiency against one reactor.\n\n\
             | reactors | initiator cores | IOPS | per reactor | efficiency |\n\
             |---:|---|---:|---:|---:|"
        )?;
        let per = |s: &ServeRow| s.iops.as_ref().ok().map(|i| i / s.target_cores as f64);
        let base = r.serve.first().and_then(per);
        for s in &r.serve {
            let efficiency = per(s).zip(base).map(|(p, b)| p / b);
            writeln!(
                m,
                "| {} | {} | {} | {} | {} |",
                s.target_cores,
                list(&s.initiator_cores),
                fmt(&s.iops),
                per(s).map_or("-".into(), |p| format!("{:.2} M", p / 1e6)),
                percent(efficiency)
            )?;
        }
    }
    let failures: Vec<String> = r
        .rows
        .iter()
        .flat_map(|row| [&row.one, &row.separate].map(|v| (row.command.clone(), v)))
        .chain(r.serve.iter().map(|s| (s.command.clone(), &s.iops)))
        .filter_map(|(c, v)| v.as_ref().err().map(|e| format!("- `{c}`: {e}")))
        .collect();
    if !failures.is_empty() {
        writeln!(m, "\nFailed runs:\n\n{}", failures.join("\n"))?;
    }
    writeln!(m, "\nCommands (the largest core count of each):\n")?;
    for layout in Layout::ALL {
        if let Some(row) = r.rows.iter().rev().find(|row| row.layout == layout) {
            writeln!(m, "- `{}`", row.command)?;
        }
    }
    if let Some(s) = r.serve.last() {
        let target: Vec<u32> = (0..s.target_cores as u32).collect();
        writeln!(m, "- `{}` (serve on cores {})", s.command, list(&target))?;
    }
    chart_svg(r, &companions.path(CHART)?)
}

fn every_drive(r: &ScaleResults, cores: usize) -> Result<f64, String> {
    r.rows
        .iter()
        .find(|row| row.layout == Layout::EveryDrive && row.cores == cores)
        .map_or(Err("not run".into()), |row| row.one.clone())
}

/// Efficiency over cores, a line per layout (and serve's per-reactor efficiency).
fn chart_svg(r: &ScaleResults, path: &Path) -> Result<()> {
    let root = SVGBackend::new(path, (720, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let max_cores = r.cores.max(2) as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption("usnvme: efficiency over cores", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(48)
        .build_cartesian_2d(1f64..max_cores, 0f64..110f64)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_desc("cores")
        .y_desc("efficiency (%)")
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Layout::ALL
        .iter()
        .map(|&layout| {
            let points = r
                .rows
                .iter()
                .filter(|row| row.layout == layout)
                .filter_map(|row| Some((row.cores as f64, efficiency(r, row)? * 100.0)))
                .collect();
            (layout.name().to_string(), points)
        })
        .collect();
    let base = r
        .serve
        .first()
        .and_then(|s| s.iops.as_ref().ok().map(|i| i / s.target_cores as f64));
    let serve_points: Vec<(f64, f64)> = r
        .serve
        .iter()
        .filter_map(|s| {
            let per = s.iops.as_ref().ok()? / s.target_cores as f64;
            Some((s.target_cores as f64, per / base? * 100.0))
        })
        .collect();
    series.push(("serve, per reactor".into(), serve_points));
    for (i, (name, points)) in series.into_iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    root.present().context("writing the chart")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_counts_double_up_to_the_machine() {
        assert_eq!(core_counts(1), [1]);
        assert_eq!(core_counts(2), [1, 2]);
        assert_eq!(core_counts(6), [1, 2, 4, 6]);
        assert_eq!(core_counts(16), [1, 2, 4, 8, 16]);
    }

    #[test]
    fn a_stripe_is_measured_against_the_namespaces_in_one_process() {
        let row = |layout, one: f64, separate: f64| Row {
            layout,
            cores: 2,
            one: Ok(one),
            separate: Ok(separate),
            command: String::new(),
        };
        let r = ScaleResults {
            cores: 2,
            seconds: 1,
            rows: vec![
                row(Layout::EveryDrive, 8e6, 10e6),
                row(Layout::Stripe, 6e6, 7e6),
            ],
            serve: Vec::new(),
        };
        let mut m = String::new();
        let (companions, mut h) = (Companions::for_test("scale"), Headlines::new(String::new()));
        section(&mut m, Some(&r), "", &companions, &mut h).expect("section");
        assert!(m.contains("| 80 % |"), "{m}");
        assert!(m.contains("| 75 % |"), "the stripe against 8 M: {m}");
        assert!(
            m.contains("Chart: [benchmarks/scaling.svg](benchmarks/scaling.svg)."),
            "{m}"
        );
        assert!(companions.read("scaling.svg").contains("<svg"));
        companions.remove();
        let t = h.table();
        assert!(
            t.contains(
                "| Efficiency on 2 cores, every core on every drive (24): one `usnvme perf` \
                 process ÷ as many separate single-core processes | 80 % (8.00 M IOPS) |"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "| Efficiency on 2 cores, stripe over 24 drives: one `usnvme perf` process ÷ the \
                 namespaces of every drive in one process | 75 % (6.00 M IOPS) |"
            ),
            "{t}"
        );
    }
}

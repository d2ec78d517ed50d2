//! `usnvme sweep`: the published-review matrix — block sizes × patterns, a fixed time per
//! point — on one perf session (the drives are attached once), with a table, CSV, JSON and SVG
//! charts. `--latency-curve`: vdbench's iorate method for the `-w`/`-o` workload — the peak,
//! then 10 % … 100 % of it and uncapped — charting average and p99 latency against the IOPS
//! achieved.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use usnvme_driver::pci::Sysfs;
use usnvme_engine::stats::{IoStats, OpKind};
use usnvme_tools::sweep::chart::RunInfo;
use usnvme_tools::sweep::{self, output, Pattern, PointResult, Record, SweepPlan};

use crate::perf::{self, usage, Row, Session};

/// The perf flags (queue depth, time per point, cores, devices, stripes), plus:
#[derive(Debug, clap::Args)]
#[group(skip)]
pub struct Args {
    #[command(flatten)]
    pub perf: perf::Args,
    /// Block sizes, e.g. 4k,16k,1m (default: powers of two from 4K to 1M).
    #[arg(long)]
    pub sizes: Option<String>,
    /// Patterns: read, write, randread, randwrite (default: all four).
    #[arg(long)]
    pub patterns: Option<String>,
    /// Folder for sweep.csv, sweep.json and the SVG charts.
    #[arg(long, default_value = "usnvme-sweep")]
    pub out: PathBuf,
    /// Instead of the matrix: latency against IOPS for the -w/-o workload (vdbench iorate).
    #[arg(long)]
    pub latency_curve: bool,
}

pub fn main(sysfs: &Sysfs, args: &Args, out: &mut dyn Write) -> Result<()> {
    let result = run(sysfs, args, out);
    perf::exit_on_usage(&result, out);
    result
}

fn run(sysfs: &Sysfs, args: &Args, out: &mut dyn Write) -> Result<()> {
    let block_sizes = match &args.sizes {
        Some(s) => sweep::parse_sizes(s).map_err(|e| usage(format!("{e:#}")))?,
        None => SweepPlan::default_block_sizes(),
    };
    let patterns = match &args.patterns {
        Some(p) => sweep::parse_patterns(p).map_err(|e| usage(format!("{e:#}")))?,
        None => Pattern::ALL.to_vec(),
    };
    let plan = SweepPlan {
        block_sizes,
        patterns,
        seconds_per_point: args.perf.time,
    };
    if args.perf.reset_after.is_some() || args.perf.remove.is_some() {
        return Err(usage(
            "--reset-after: a perf option (a sweep runs many measurements)",
        ));
    }
    let largest = plan.block_sizes.iter().copied().max().unwrap_or(4096);
    // every point reports its p99
    let session = Session::open(sysfs, &args.perf, Some(largest), true)?;
    if args.latency_curve {
        return latency_curve(&session, args, out);
    }
    for &size in &plan.block_sizes {
        session.check_io_size(size, &format!("{size} (--sizes)"))?;
    }
    writeln!(
        out,
        "sweep: {} points, about {} s",
        plan.points().len(),
        plan.estimated_duration().as_secs()
    )?;
    // a redrawn line only where a person watches; else one line per point, for logs
    let tty = usnvme_tools::progress::wanted();
    // The points measured so far, for a sweep that Ctrl-C stops: its partial results are kept.
    let measured = std::cell::RefCell::new(Vec::new());
    let result = sweep::run(
        &plan,
        |point| {
            if crate::signals::received().is_some() {
                anyhow::bail!("interrupted");
            }
            let mut p = session.settings.run.clone();
            p.io_size = point.block_size;
            p.random = point.pattern.is_random();
            p.read_pct = if point.pattern.is_read() { 100 } else { 0 };
            let m = session.measure(&p, None, false, None)?;
            m.verdict()?;
            let result = point_result(&m.rows, point.pattern.is_read());
            // a point that Ctrl-C cut short is not a full point: left out
            if crate::signals::received().is_none() {
                measured.borrow_mut().push(Record::new(*point, result));
            }
            Ok(result)
        },
        |done, total, eta| {
            let line = output::progress_line(done, total, eta);
            if tty {
                eprint!("\r{line}");
            } else {
                eprintln!("{line}");
            }
        },
    );
    if tty {
        eprintln!();
    }
    let records = match result {
        Ok(records) => records,
        Err(e) if crate::signals::received().is_none() => return Err(e),
        // Interrupted: the points measured so far; `main` exits 130 / 143.
        Err(_) => measured.into_inner(),
    };
    if records.is_empty() {
        return Ok(());
    }
    out.write_all(output::table(&records).as_bytes())?;
    let files = output::write_files(&args.out, &records, &run_info(&session, args))?;
    writeln!(out, "results: {}", files.csv.display())?;
    writeln!(out, "         {}", files.json.display())?;
    writeln!(out, "charts:  {}", files.bandwidth_svg.display())?;
    writeln!(out, "         {}", files.iops_svg.display())?;
    Ok(())
}

/// vdbench's iorate method on the `-w`/`-o` workload.
fn latency_curve(session: &Session, args: &Args, out: &mut dyn Write) -> Result<()> {
    let run = session.settings.run.clone();
    let read = run.read_pct >= 50;
    let peak = point_result(&session.measure(&run, None, false, None)?.rows, read);
    writeln!(out, "peak: {:.0} IOPS", peak.iops)?;
    writeln!(
        out,
        "{:>10} {:>12} {:>12} {:>12}",
        "target", "IOPS", "avg(us)", "p99(us)"
    )?;
    let mut points = Vec::new();
    for step in sweep::iorate_steps(peak.iops as u64) {
        if crate::signals::received().is_some() {
            anyhow::bail!("interrupted");
        }
        let m = session.measure(&run, step, false, None)?;
        m.verdict()?;
        let r = point_result(&m.rows, read);
        let target = step.map_or("max".to_string(), |s| s.to_string());
        writeln!(
            out,
            "{target:>10} {:>12.0} {:>12.1} {:>12.1}",
            r.iops, r.lat_mean_us, r.lat_p99_us
        )?;
        points.push((r.iops, r.lat_mean_us, r.lat_p99_us));
    }
    let chart = output::write_latency_curve(&args.out, &points, &run_info(session, args))?;
    writeln!(out, "chart: {}", chart.display())?;
    Ok(())
}

/// What the charts' captions say: the session's drives and cores, the queue depth and the time
/// per point, dated now.
fn run_info(session: &Session, args: &Args) -> RunInfo {
    let drives = session.engine.drives().iter();
    let reactors = session.engine.placement().reactors.iter();
    RunInfo::now(
        drives.map(|d| d.controller.name().to_string()).collect(),
        args.perf.depth,
        reactors.map(|r| r.cpu).collect(),
        args.perf.time,
    )
}

/// The totals of one measurement: IOPS and MiB/s summed over rows, latency over all I/Os.
fn point_result(rows: &[Row], read: bool) -> PointResult {
    let kind = if read { OpKind::Read } else { OpKind::Write };
    let mut all = IoStats::new();
    let (mut iops, mut mib) = (0.0, 0.0);
    for r in rows {
        all.merge(&r.stats);
        iops += r.stats.iops(kind, r.elapsed);
        mib += r.stats.mib_per_s(kind, r.elapsed);
    }
    let lat = all.latency_at(kind, &[99.0]);
    let p99 = lat.percentiles.first().map_or(0, |&(_, ns)| ns);
    PointResult {
        iops,
        mib_per_s: mib,
        lat_mean_us: lat.mean_ns / 1e3,
        lat_p99_us: p99 as f64 / 1e3,
        errors: all.errors(),
    }
}

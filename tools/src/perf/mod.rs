//! `usnvme perf`: an I/O benchmark with `spdk_nvme_perf`'s flags, on the engine's reactors.
//!
//! Flow: check the flags (a bad one: one line naming it, exit 2, no drive opened), attach the
//! drives, check what depends on them (queue depth, I/O size; still no I/O), build the block
//! devices (namespaces, or stripes of them), run the [`workload::Workload`] job on every reactor
//! that serves them, and print the table (and the JSON file). Ctrl-C / SIGTERM stops the I/O;
//! the partial results are printed and `main` exits 130 / 143.
//!
//! Reliability: `--reset-after S` resets every controller once while I/O runs (the I/Os it aborts
//! are counted, not failures; the run checks that I/O resumed on every device); a device removed
//! during the run (hot removal) fails its I/Os, the others run to the end, and the run exits 1
//! naming it.

mod report;
pub(crate) mod sweep;
mod workload;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::json;
use usnvme_driver::pci::{Driver, Sysfs};
use usnvme_driver::vfio::VfioError;
use usnvme_driver::{Controller, ControllerOptions, DeviceSpec, Opener};
use usnvme_engine::topology::{format_cpu_list, parse_cores, Topology};
use usnvme_engine::{
    attach, BlockDevice, ChannelOptions, Engine, EngineOptions, NamespaceDevice, Share,
    StripeDevice,
};

use crate::signals;
use report::Row;
use workload::{Plan, Region, Workload};

/// The largest I/O the block layer is asked to split, per drive of a stripe.
const MAX_SPLIT: u64 = 2 << 20;

/// Measure I/O performance: IOPS, bandwidth and latency per drive and core.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Queue depth: I/Os in flight per reactor per device.
    #[arg(short = 'q', long = "queue-depth", default_value_t = 32)]
    depth: u32,
    /// I/O size in bytes: 4096, 4k, 128K, 1M.
    #[arg(short = 'o', long = "io-size", default_value = "4k")]
    io_size: String,
    /// Pattern: read, write, randread, randwrite, rw, randrw.
    #[arg(short = 'w', long = "workload", default_value = "randread")]
    workload: String,
    /// Percentage of reads for rw and randrw (0-100).
    #[arg(short = 'M', long = "rwmixread", default_value_t = 50)]
    read_pct: u32,
    /// Seconds to measure (after the warm-up).
    #[arg(short = 't', long = "time", default_value_t = 10)]
    time: u64,
    /// Warm-up seconds: I/O runs but is not counted.
    #[arg(short = 'a', long = "warmup", default_value_t = 0)]
    warmup: u64,
    /// Reactor cores: a list (0,2-3), bracketed list ([0-3]) or hex mask (0xF). Default: all.
    #[arg(short = 'c', long = "cores")]
    cores: Option<String>,
    /// Device: a BDF (0000:01:00.0) or sim:N[-M][,options]; repeatable. Default: every NVMe
    /// controller bound to vfio-pci.
    #[arg(short = 'r', long = "device")]
    devices: Vec<String>,
    /// Latency percentiles (p50 … p99.99); -LL adds the histogram. Without it, latency is
    /// mean, min and max (recording a histogram per I/O costs more than the rest).
    #[arg(short = 'L', action = clap::ArgAction::Count)]
    latency: u8,
    /// Stop after N I/Os per reactor per device (warm-up included) instead of after -t.
    #[arg(long = "io-count", value_name = "N")]
    io_count: Option<u64>,
    /// Write the results as JSON (fio-like) to FILE.
    #[arg(long = "json", value_name = "FILE")]
    json: Option<PathBuf>,
    /// Run on stripes (RAID 0) of N drives each, chunk size default 128K: N or N:CHUNK.
    #[arg(long = "stripe", value_name = "N[:CHUNK]")]
    stripe: Option<String>,
    /// Cap the rate at this many IOPS in total.
    #[arg(long = "rate", value_name = "IOPS")]
    rate: Option<u64>,
    /// Stamp every written block (offset, seed, checksum) and check every block read.
    #[arg(long = "verify")]
    verify: bool,
    /// Debug: every write after the first N per device carries a bad checksum in its first block.
    #[arg(long = "corrupt-after", value_name = "N", hide = true)]
    corrupt_after: Option<u64>,
    /// Namespace to run on, on every drive (default: every active namespace).
    #[arg(short = 'n', long = "namespace", value_name = "NSID")]
    namespace: Option<u32>,
    /// Where the I/O region of each device starts, in bytes (4k, 1G, ...), like fio's --offset.
    #[arg(long = "offset", value_name = "BYTES")]
    offset: Option<String>,
    /// How many bytes the I/O region spans (default: to the end of the device), like fio's --size.
    #[arg(long = "size", value_name = "BYTES")]
    size: Option<String>,
    /// Reset every controller once, S seconds into the measurement, while I/O runs. The I/Os
    /// the reset aborts are counted, not failures; the run fails if I/O does not resume.
    #[arg(long = "reset-after", value_name = "S")]
    reset_after: Option<f64>,
    /// Seed of the --verify stamps (default: from the process ID). A read run given an earlier
    /// run's seed (its JSON `options.seed`) checks the blocks that run wrote.
    #[arg(long = "seed", value_name = "N")]
    seed: Option<u64>,
    /// Use the controllers' shadow doorbells (Doorbell Buffer Config) where offered: only
    /// emulated controllers offer them; under software emulation (QEMU without KVM) they cost
    /// more than the doorbell writes they save, under a hypervisor with KVM they save VM exits.
    #[arg(long = "shadow-doorbells")]
    shadow_doorbells: bool,
    /// Debug: surprise-remove a simulated drive S seconds into the measurement (sim:N@S).
    #[arg(long = "remove", value_name = "DEVICE@S", hide = true)]
    remove: Option<String>,
}

/// A bad flag: `main` prints it on one line and exits 2, and no I/O was issued.
#[derive(Debug)]
pub struct Usage(pub String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

pub(crate) fn usage(msg: impl Into<String>) -> anyhow::Error {
    Usage(msg.into()).into()
}

/// Runs the benchmark; a [`Usage`] error has been printed and exits the process with status 2
/// (after every drive was closed).
pub fn main(sysfs: &Sysfs, args: &Args, out: &mut dyn Write) -> Result<()> {
    let result = run(sysfs, args, out);
    exit_on_usage(&result, out);
    result
}

/// A usage error: print it on one line and exit 2 (everything the run owned is dropped by now,
/// so the controllers are shut down).
pub(crate) fn exit_on_usage(result: &Result<()>, out: &mut dyn Write) {
    if let Err(e) = result {
        if let Some(Usage(msg)) = e.downcast_ref::<Usage>() {
            let _ = out.flush();
            eprintln!("usnvme: error: {msg}");
            std::process::exit(2);
        }
    }
}

/// The checked flags.
#[derive(Debug)]
pub(crate) struct Settings {
    pub(crate) plan: Plan,
    cores: Vec<usize>,
    specs: Vec<DeviceSpec>,
    stripe: Option<(usize, u64)>,
    namespace: Option<u32>,
    /// `--offset` and `--size` in bytes, each with the text given (for errors).
    offset: Option<(u64, String)>,
    size: Option<(u64, String)>,
    reset_after: Option<Duration>,
    /// `--remove`: the simulated drive and when.
    remove: Option<(String, Duration)>,
}

/// Seconds as given on the command line (`1`, `2.5`), positive and finite.
fn parse_seconds(s: f64) -> Option<Duration> {
    (s.is_finite() && s > 0.0 && s < 1e9).then(|| Duration::from_secs_f64(s))
}

/// Checks everything that does not need the drives.
fn settings(args: &Args, topology: &Topology) -> Result<Settings> {
    if args.depth == 0 {
        return Err(usage("-q 0: the queue depth must be at least 1"));
    }
    let io_size = usnvme_driver::parse_size(&args.io_size)
        .filter(|&s| s > 0)
        .ok_or_else(|| {
            usage(format!(
                "-o {}: not an I/O size; give bytes like 4096, 4k, 128K or 1M",
                args.io_size
            ))
        })?;
    let (random, read_pct) = match args.workload.as_str() {
        "read" => (false, 100),
        "write" => (false, 0),
        "randread" => (true, 100),
        "randwrite" => (true, 0),
        "rw" => (false, args.read_pct),
        "randrw" => (true, args.read_pct),
        w => {
            return Err(usage(format!(
                "-w {w}: unknown pattern; valid: read, write, randread, randwrite, rw, randrw"
            )))
        }
    };
    if args.read_pct > 100 {
        return Err(usage(format!(
            "-M {}: the read percentage must be 0-100",
            args.read_pct
        )));
    }
    if args.time == 0 {
        return Err(usage("-t 0: the run time must be at least 1 second"));
    }
    if args.io_count == Some(0) {
        return Err(usage("--io-count 0: give at least 1 I/O"));
    }
    if args.rate == Some(0) {
        return Err(usage("--rate 0: give a rate of at least 1 IOPS"));
    }
    let cores = match &args.cores {
        None => Vec::new(),
        Some(c) => {
            let cores = parse_cores(c).map_err(|e| usage(format!("-c: {e}")))?;
            if let Some(bad) = cores.iter().find(|&&c| !topology.is_allowed(c)) {
                return Err(usage(format!(
                    "-c {c}: core {bad} does not exist or is not allowed; allowed cores: {}",
                    format_cpu_list(&topology.allowed)
                )));
            }
            cores
        }
    };
    let mut specs: Vec<DeviceSpec> = Vec::new();
    for given in &args.devices {
        let spec: DeviceSpec = given
            .parse()
            .map_err(|e| usage(format!("-r {given}: {e}")))?;
        // A drive that keeps no data reads back nothing: every check would cry wolf. (A real
        // drive keeps data.)
        if let DeviceSpec::Sim(sim) = &spec {
            if args.verify && !sim.keeps_data() {
                return Err(usage(format!(
                    "--verify: -r {given} keeps no data (sim backend=null: reads move none); give it backend=ram, e.g. -r {given},backend=ram"
                )));
            }
        }
        for drive in spec.drives() {
            if specs.contains(&drive) {
                return Err(usage(format!(
                    "-r {given}: {drive} is given twice; name each device once"
                )));
            }
            specs.push(drive);
        }
    }
    let stripe = match &args.stripe {
        None => None,
        Some(s) => {
            let bad = || {
                usage(format!(
                    "--stripe {s}: expected N or N:CHUNK, e.g. 12 or 12:128K (N >= 1)"
                ))
            };
            let (n, chunk) = s.split_once(':').unwrap_or((s, "128K"));
            let n: usize = n.parse().ok().filter(|&n| n > 0).ok_or_else(bad)?;
            let chunk = usnvme_driver::parse_size(chunk)
                .filter(|&c| c > 0)
                .ok_or_else(bad)?;
            Some((n, chunk))
        }
    };
    let width = stripe.map_or(1, |(n, _)| n as u64);
    if io_size > MAX_SPLIT * width {
        return Err(usage(format!(
            "-o {}: at most {} bytes ({} MiB per drive of a device)",
            args.io_size,
            MAX_SPLIT * width,
            MAX_SPLIT >> 20
        )));
    }
    if args.corrupt_after.is_some() && !args.verify {
        return Err(usage("--corrupt-after needs --verify"));
    }
    if args.seed.is_some() && !args.verify {
        return Err(usage("--seed needs --verify"));
    }
    if args.namespace == Some(0) {
        return Err(usage("-n 0: namespace IDs start at 1"));
    }
    let bytes = |flag: &str, given: &Option<String>| -> Result<Option<(u64, String)>> {
        match given {
            None => Ok(None),
            Some(g) => usnvme_driver::parse_size(g)
                .map(|b| Some((b, g.clone())))
                .ok_or_else(|| {
                    usage(format!(
                        "{flag} {g}: not a size; give bytes like 4096, 4k, 128M or 1G"
                    ))
                }),
        }
    };
    let offset = bytes("--offset", &args.offset)?;
    let size = bytes("--size", &args.size)?;
    if let Some((0, given)) = &size {
        return Err(usage(format!("--size {given}: give at least one I/O")));
    }
    let reset_after = match args.reset_after {
        None => None,
        Some(s) => {
            let after = parse_seconds(s).ok_or_else(|| {
                usage(format!(
                    "--reset-after {s}: give the seconds into the measurement, e.g. 2 or 1.5"
                ))
            })?;
            if args.io_count.is_none() && after >= Duration::from_secs(args.time) {
                return Err(usage(format!(
                    "--reset-after {s}: the run measures {} s; reset inside it",
                    args.time
                )));
            }
            Some(after)
        }
    };
    let remove = match &args.remove {
        None => None,
        Some(r) => {
            let bad = || {
                usage(format!(
                    "--remove {r}: expected sim:N@SECONDS, e.g. sim:2@1.5"
                ))
            };
            let (device, at) = r.rsplit_once('@').ok_or_else(bad)?;
            let at = at
                .parse::<f64>()
                .ok()
                .and_then(parse_seconds)
                .ok_or_else(bad)?;
            match device.parse::<DeviceSpec>() {
                Ok(DeviceSpec::Sim(sim)) if sim.drives.len() == 1 => {
                    Some((format!("sim:{}", sim.drives[0]), at))
                }
                _ => return Err(bad()),
            }
        }
    };
    let plan = Plan {
        io_size,
        depth: args.depth as usize,
        random,
        read_pct,
        warmup: Duration::from_secs(args.warmup),
        duration: args
            .io_count
            .is_none()
            .then(|| Duration::from_secs(args.time)),
        io_count: args.io_count,
        rate: None,
        verify: args.verify,
        corrupt_after: args.corrupt_after,
        seed: args.seed.unwrap_or(std::process::id() as u64 ^ 0x5eed),
        reset_done: None,
    };
    Ok(Settings {
        plan,
        cores,
        specs,
        stripe,
        namespace: args.namespace,
        offset,
        size,
        reset_after,
        remove,
    })
}

/// Every NVMe controller bound to vfio-pci, or a usage error for a PCI device given that is not.
fn targets(sysfs: &Sysfs, given: &[DeviceSpec]) -> Result<Vec<DeviceSpec>> {
    for spec in given {
        if let DeviceSpec::Pci(addr) = spec {
            if let Ok(dev) = sysfs.device(*addr) {
                if dev.driver != Driver::VfioPci {
                    return Err(usage(format!(
                        "-r {addr}: bound to {}, not vfio-pci: run `usnvme setup bind {addr}`",
                        dev.driver
                    )));
                }
            }
        }
    }
    crate::open::targets(sysfs, given)
}

fn run(sysfs: &Sysfs, args: &Args, out: &mut dyn Write) -> Result<()> {
    // percentiles with -L, as spdk_nvme_perf
    let session = Session::open(sysfs, args, None, args.latency > 0)?;
    let plan = session.settings.plan.clone();
    let cores = session.engine.placement().reactors.len();
    let length = match plan.duration {
        Some(d) => format!("for {} s", d.as_secs()),
        None => format!("{} I/Os per device and core", plan.io_count.unwrap_or(0)),
    };
    eprintln!(
        "usnvme perf: {} device(s) on {cores} core(s): measuring {length}",
        session.devices.len()
    );
    let m = session.measure(&plan, args.rate, true)?;
    out.write_all(report::table(&m.rows, args.latency).as_bytes())?;
    out.write_all(report::errors(&m.rows).as_bytes())?;
    if let Some(line) = m.reset_line() {
        writeln!(out, "\n{line}")?;
    }
    out.flush()?;
    if let Some(path) = &args.json {
        let options = json!({
            "queue_depth": args.depth, "io_size": plan.io_size, "workload": args.workload,
            "read_pct": plan.read_pct, "time_s": args.time, "warmup_s": args.warmup,
            "io_count": args.io_count, "rate": args.rate, "verify": args.verify,
            "stripe": args.stripe, "namespace": args.namespace, "offset": args.offset,
            "size": args.size, "reset_after_s": args.reset_after, "seed": plan.seed,
        });
        let mut doc = report::json(&m.rows, options, args.latency);
        if let Some(reset) = m.reset_json() {
            doc["reset"] = reset;
        }
        let text = serde_json::to_string_pretty(&doc)?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if args.verify && plan.read_pct > 0 && m.checked == 0 {
        eprintln!(
            "usnvme: warning: --verify checked no block: none read back carried a stamp \
             (write first, in the same run; a sim drive keeps data only with backend=ram)"
        );
    }
    m.check()
}

/// Attached drives, the engine and the block devices, ready to measure one plan after another
/// (`perf` measures one; `sweep` many).
pub(crate) struct Session {
    pub(crate) settings: Settings,
    engine: Engine,
    devices: Vec<Arc<dyn BlockDevice>>,
    /// Each device's I/O region (`--offset`, `--size`).
    spans: Vec<Region>,
    names: Vec<String>,
    /// Keeps the simulated controllers reachable (`--remove`).
    opener: Opener,
}

/// One controller's reset (`--reset-after`).
#[derive(Debug)]
pub(crate) struct ResetOutcome {
    device: String,
    result: std::result::Result<Duration, String>,
}

/// What one measurement gave.
pub(crate) struct Measured {
    pub(crate) rows: Vec<Row>,
    failures: Vec<String>,
    mismatches: Vec<String>,
    checked: u64,
    /// When the controllers were reset, into the measurement, and how each reset went.
    reset: Option<(Duration, Vec<ResetOutcome>)>,
    /// Whether the run asked for a reset (then aborted I/Os are expected).
    reset_asked: bool,
    /// Whether the run measured a time (not an I/O count).
    timed: bool,
}

impl Measured {
    /// Reports data mismatches, removed devices, failed I/O and failed resets as errors (one
    /// line each).
    pub(crate) fn check(&self) -> Result<()> {
        for m in &self.mismatches {
            eprintln!("usnvme: verify: {m}");
        }
        let mut problems: Vec<anyhow::Error> = Vec::new();
        let removed: Vec<&Row> = self.rows.iter().filter(|r| r.removed.is_some()).collect();
        let names: BTreeSet<&str> = removed.iter().map(|r| r.device.as_str()).collect();
        if !names.is_empty() {
            let failed: u64 = removed.iter().map(|r| r.failed - r.aborted).sum();
            let devices: BTreeSet<&str> = self.rows.iter().map(|r| r.device.as_str()).collect();
            let names: Vec<&str> = names.into_iter().collect();
            let others = match devices.len() - names.len() {
                0 => String::new(),
                n => format!("; the other {n} device(s) ran to the end"),
            };
            problems.push(anyhow::anyhow!(
                "{} removed during the run: {failed} I/O(s) failed (Host Pathing Error){others}",
                names.join(", "),
            ));
        }
        if let Some(first) = self.failures.first() {
            // the same failure on every drive and core says it once
            let more = self.failures.len() - 1;
            let tail = if more > 0 {
                format!(" (and {more} more like it)")
            } else {
                String::new()
            };
            problems.push(anyhow::anyhow!("I/O failed: {first}{tail}"));
        }
        let aborted: u64 = self.rows.iter().map(|r| r.aborted).sum();
        if aborted > 0 && !self.reset_asked {
            problems.push(anyhow::anyhow!(
                "{aborted} I/O(s) aborted by a controller reset (Command Aborted By Host): a command timed out or a controller failed (see the log: RUST_LOG=warn)"
            ));
        }
        if let Some((_, outcomes)) = &self.reset {
            for o in outcomes {
                if let Err(e) = &o.result {
                    problems.push(anyhow::anyhow!("{}: reset failed: {e}", o.device));
                }
            }
            // I/O must resume after the reset on every device that is still there.
            if self.timed {
                for r in self.rows.iter().filter(|r| r.removed.is_none()) {
                    if r.after_reset == Some(0) {
                        problems.push(anyhow::anyhow!(
                            "{}: no I/O completed after the reset",
                            r.name()
                        ));
                    }
                }
            }
        }
        if !self.mismatches.is_empty() {
            problems.push(anyhow::anyhow!(
                "verify: data mismatches found (listed above)"
            ));
        }
        match problems.len() {
            0 => Ok(()),
            1 => Err(problems.remove(0)),
            _ => Err(crate::open::Failures(problems).into()),
        }
    }

    /// "Reset: 4 controller(s) 1.0 s into the measurement, in 3 ms at most; ..." (with
    /// `--reset-after`).
    fn reset_line(&self) -> Option<String> {
        if !self.reset_asked {
            return None;
        }
        let Some((at, outcomes)) = &self.reset else {
            return Some("Reset: none (the run ended before --reset-after)".into());
        };
        let ok: Vec<Duration> = outcomes
            .iter()
            .filter_map(|o| o.result.clone().ok())
            .collect();
        let slowest = ok.iter().max().copied().unwrap_or_default();
        let after: u64 = self.rows.iter().filter_map(|r| r.after_reset).sum();
        let aborted: u64 = self.rows.iter().map(|r| r.aborted).sum();
        Some(format!(
            "Reset: {} of {} controller(s) {:.1} s into the measurement, in {:.1} ms at most; {aborted} I/O(s) aborted, {after} completed after it",
            ok.len(),
            outcomes.len(),
            at.as_secs_f64(),
            slowest.as_secs_f64() * 1e3
        ))
    }

    fn reset_json(&self) -> Option<serde_json::Value> {
        let (at, outcomes) = self.reset.as_ref()?;
        let controllers: Vec<serde_json::Value> = outcomes
            .iter()
            .map(|o| match &o.result {
                Ok(d) => json!({"device": o.device, "ok": true, "ms": d.as_millis() as u64}),
                Err(e) => json!({"device": o.device, "ok": false, "error": e}),
            })
            .collect();
        Some(json!({"after_s": at.as_secs_f64(), "controllers": controllers}))
    }
}

impl Session {
    /// Checks the flags, attaches the drives and builds the devices. `max_io_size`: the largest
    /// I/O the session will run (default: `-o`), which sizes the queues. `histograms`: latency
    /// percentiles, which cost more per I/O than all the other statistics.
    pub(crate) fn open(
        sysfs: &Sysfs,
        args: &Args,
        max_io_size: Option<u64>,
        histograms: bool,
    ) -> Result<Session> {
        let topology =
            Topology::from_sysfs(sysfs.root()).context("cannot read the CPU topology")?;
        let settings = settings(args, &topology)?;
        let targets = targets(sysfs, &settings.specs)?;
        if targets.is_empty() {
            anyhow::bail!("{}", crate::open::NO_CONTROLLERS);
        }
        let opener = Opener::new(sysfs.root().join("sys"));
        if let Some((name, _)) = &settings.remove {
            if !settings
                .specs
                .iter()
                .flat_map(DeviceSpec::drives)
                .any(|d| &d.to_string() == name)
            {
                return Err(usage(format!(
                    "--remove {name}: not one of the drives given with -r"
                )));
            }
        }
        let mut drives = Vec::new();
        let options = ControllerOptions {
            shadow_doorbells: args.shadow_doorbells,
            ..ControllerOptions::default()
        };
        for attached in attach(&opener, sysfs, &targets, &options) {
            match attached {
                Ok(d) => drives.push(d),
                Err(e) => {
                    if matches!(
                        *e.error,
                        usnvme_driver::Error::Vfio(VfioError::NotVfio { .. })
                    ) {
                        return Err(usage(format!("-r {e}")));
                    }
                    // Most of the driver's errors name the drive already (and the owner of one
                    // in use): not twice.
                    if e.error.to_string().starts_with(&e.drive) {
                        return Err((*e.error).into());
                    }
                    return Err(e.into());
                }
            }
        }
        let io_size = max_io_size.unwrap_or(settings.plan.io_size);
        // A queue holds MQES+1 entries, one always empty: at most MQES commands in flight.
        let granted = drives
            .iter()
            .map(|d| u32::from(d.controller.cap().mqes()))
            .min()
            .unwrap_or(0);
        if args.depth > granted {
            return Err(usage(format!(
                "-q {}: the drives grant a queue depth of at most {granted} (valid: 1-{granted})",
                args.depth
            )));
        }
        let engine = Engine::new(
            topology,
            drives,
            EngineOptions {
                cores: settings.cores.clone(),
                // -q I/Os of -o bytes per queue pair: the engine sizes each drive's rings
                channel: ChannelOptions {
                    depth: args.depth.min(u32::from(u16::MAX)) as u16,
                    io_size: Some(io_size),
                    latency_histograms: histograms,
                    ..ChannelOptions::default()
                },
                ..EngineOptions::default()
            },
        )?;
        let devices = devices(&engine, settings.stripe, settings.namespace)?;
        let spans = spans(&devices, &settings)?;
        check_io_size(&devices, &spans, io_size, &format!("-o {}", args.io_size))?;
        // Said once, before any I/O: drives served by fewer cores than placed, and why.
        for l in engine.assign(&devices)?.limited {
            let name = &devices[l.device].info().name;
            let device = if *name == l.drive {
                String::new()
            } else {
                format!("{name} ")
            };
            eprintln!(
                "usnvme: {} granted {} I/O queue pair(s): {device}served from core(s) {} only, not {}",
                l.drive,
                l.granted,
                format_cpu_list(&l.cpus),
                format_cpu_list(&l.placed_cpus)
            );
        }
        let names = devices.iter().map(|d| d.info().name.clone()).collect();
        Ok(Session {
            settings,
            engine,
            devices,
            spans,
            names,
            opener,
        })
    }

    /// Checks an I/O size against every device (as `-o` is checked).
    pub(crate) fn check_io_size(&self, io_size: u64, given: &str) -> Result<()> {
        check_io_size(&self.devices, &self.spans, io_size, given)
    }

    /// Runs `plan` on every reactor, capped at `rate` IOPS in total, and collects its rows.
    /// `live`: the one-line progress on a terminal.
    pub(crate) fn measure(&self, plan: &Plan, rate: Option<u64>, live: bool) -> Result<Measured> {
        let assignment = self.engine.assign(&self.devices)?;
        let pairs: usize = assignment.serving.iter().map(Vec::len).sum();
        let mut job_plan = plan.clone();
        job_plan.rate = rate.map(|r| r as f64 / pairs.max(1) as f64);
        let reset_done = self
            .settings
            .reset_after
            .map(|_| Arc::new(AtomicBool::new(false)));
        job_plan.reset_done = reset_done.clone();
        let spans = self.spans.clone();
        let io_size = plan.io_size;
        let run = self.engine.start(self.devices.clone(), move |info| {
            let mine = info
                .devices
                .iter()
                .zip(&info.shares)
                .map(|(&d, &share)| region(spans[d], share, io_size))
                .collect();
            Workload::new(job_plan.clone(), mine)
        })?;
        // The reactors start their jobs as `start` returns: the measurement begins after the
        // warm-up from now.
        let measure_from = Instant::now() + plan.warmup;
        // Side actions at a time into the measurement; dropping `cancel` ends those not yet due.
        let (cancel, cancelled) = mpsc::channel::<()>();
        let resetter = match (self.settings.reset_after, reset_done) {
            (Some(after), Some(done)) => {
                let controllers: Vec<Controller> = self
                    .engine
                    .drives()
                    .iter()
                    .map(|d| d.controller.clone())
                    .collect();
                let at = measure_from + after;
                Some(std::thread::spawn(move || {
                    reset_all(&controllers, at, &cancelled, &done).map(|o| (after, o))
                }))
            }
            _ => None,
        };
        let (cancel_remove, remove_cancelled) = mpsc::channel::<()>();
        let remover = self.settings.remove.as_ref().and_then(|(name, after)| {
            let sim = self.opener.sim_controller(name)?;
            let at = measure_from + *after;
            Some(std::thread::spawn(move || {
                if wait_until(at, &remove_cancelled) {
                    sim.remove();
                }
            }))
        });
        watch(&run, live);
        drop((cancel, cancel_remove));
        let reset = resetter.and_then(|t| t.join().ok().flatten());
        if let Some(t) = remover {
            let _ = t.join();
        }
        let results = run.wait()?;
        let mut m = Measured {
            rows: Vec::new(),
            failures: Vec::new(),
            mismatches: Vec::new(),
            checked: 0,
            reset,
            reset_asked: self.settings.reset_after.is_some(),
            timed: plan.duration.is_some(),
        };
        for r in results {
            for d in r.output {
                m.checked += d.checked;
                let device = self.names[d.device].clone();
                if let Some(e) = &d.error {
                    m.failures.push(format!("{device}@core{}: {e}", r.info.cpu));
                }
                for x in &d.mismatches {
                    m.mismatches
                        .push(format!("{device}: LBA {}: {}", x.lba, x.what));
                }
                if d.more_mismatches > 0 {
                    m.mismatches
                        .push(format!("{device}: {} more mismatches", d.more_mismatches));
                }
                m.rows.push(Row {
                    device,
                    core: r.info.cpu,
                    stats: d.stats,
                    elapsed: d.elapsed,
                    per_second: d.per_second,
                    failed: d.failed,
                    aborted: d.aborted,
                    after_reset: m.reset.as_ref().map(|_| d.after_reset),
                    removed: d.removed,
                });
            }
        }
        Ok(m)
    }
}

/// Waits until `at`; false if cancelled first.
fn wait_until(at: Instant, cancelled: &mpsc::Receiver<()>) -> bool {
    matches!(
        cancelled.recv_timeout(at.saturating_duration_since(Instant::now())),
        Err(RecvTimeoutError::Timeout)
    )
}

/// At `at` (unless cancelled first), resets every controller at once, then sets `done`.
fn reset_all(
    controllers: &[Controller],
    at: Instant,
    cancelled: &mpsc::Receiver<()>,
    done: &AtomicBool,
) -> Option<Vec<ResetOutcome>> {
    if !wait_until(at, cancelled) {
        return None;
    }
    let outcomes = std::thread::scope(|scope| {
        let threads: Vec<_> = controllers
            .iter()
            .map(|c| {
                scope.spawn(move || {
                    let started = Instant::now();
                    c.reset()
                        .map(|()| started.elapsed())
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        threads
            .into_iter()
            .zip(controllers)
            .map(|(t, c)| ResetOutcome {
                device: c.name().to_string(),
                result: t
                    .join()
                    .unwrap_or_else(|_| Err("the thread resetting it panicked".into())),
            })
            .collect()
    });
    done.store(true, Ordering::Relaxed);
    Some(outcomes)
}

/// The run's block devices: every namespace (or namespace `nsid` of every drive), or stripes
/// of `n` of them.
fn devices(
    engine: &Engine,
    stripe: Option<(usize, u64)>,
    nsid: Option<u32>,
) -> Result<Vec<Arc<dyn BlockDevice>>> {
    let namespaces = match nsid {
        None => engine.namespaces(),
        Some(nsid) => {
            let mut chosen: Vec<Arc<dyn BlockDevice>> = Vec::new();
            for (i, d) in engine.drives().iter().enumerate() {
                let ns = NamespaceDevice::new(d.controller.clone(), nsid, i)
                    .map_err(|e| usage(format!("-n {nsid}: {e}")))?;
                chosen.push(Arc::new(ns));
            }
            chosen
        }
    };
    let devices: Vec<Arc<dyn BlockDevice>> = match stripe {
        None => namespaces,
        Some((n, chunk)) => {
            if !namespaces.len().is_multiple_of(n) {
                return Err(usage(format!(
                    "--stripe {n}: {} namespaces do not make stripes of {n}; give a divisor of {}",
                    namespaces.len(),
                    namespaces.len()
                )));
            }
            let mut stripes: Vec<Arc<dyn BlockDevice>> = Vec::new();
            for (i, members) in namespaces.chunks(n).enumerate() {
                let s = StripeDevice::new(&format!("stripe{i}"), members.to_vec(), chunk)
                    .map_err(|e| usage(format!("--stripe: {e}")))?;
                stripes.push(Arc::new(s));
            }
            stripes
        }
    };
    Ok(devices)
}

/// Each device's I/O region: `--offset` (default 0) and `--size` (default: to the end). An
/// offset beyond a device's capacity, or a region past its end, is a usage error naming the
/// device: nothing has been written yet.
fn spans(devices: &[Arc<dyn BlockDevice>], settings: &Settings) -> Result<Vec<Region>> {
    let mut spans = Vec::with_capacity(devices.len());
    for d in devices {
        let info = d.info();
        let (start, len) = match (&settings.offset, &settings.size) {
            (None, None) => (0, info.size_bytes),
            (offset, size) => {
                let start = offset.as_ref().map_or(0, |(o, _)| *o);
                if let Some((_, given)) = offset {
                    if start >= info.size_bytes {
                        return Err(usage(format!(
                            "--offset {given}: beyond the end of {} ({} bytes); give an offset below its capacity",
                            info.name, info.size_bytes
                        )));
                    }
                    if !start.is_multiple_of(u64::from(info.block_size)) {
                        return Err(usage(format!(
                            "--offset {given}: not a multiple of the {}-byte block size of {}",
                            info.block_size, info.name
                        )));
                    }
                }
                let len = size.as_ref().map_or(info.size_bytes - start, |(s, _)| *s);
                if let Some((_, given)) = size {
                    if start
                        .checked_add(len)
                        .is_none_or(|end| end > info.size_bytes)
                    {
                        return Err(usage(format!(
                            "--size {given}: past the end of {} ({} bytes) from offset {start}",
                            info.name, info.size_bytes
                        )));
                    }
                }
                (start, len)
            }
        };
        spans.push(Region { start, len });
    }
    Ok(spans)
}

/// `given`: the flag and value the size came from, e.g. `-o 4k`.
fn check_io_size(
    devices: &[Arc<dyn BlockDevice>],
    spans: &[Region],
    io_size: u64,
    given: &str,
) -> Result<()> {
    for (d, span) in devices.iter().zip(spans) {
        let info = d.info();
        if !io_size.is_multiple_of(u64::from(info.block_size)) || io_size > info.size_bytes {
            return Err(usage(format!(
                "{given}: {} needs a multiple of its {}-byte block size, at most {} bytes",
                info.name, info.block_size, info.size_bytes
            )));
        }
        if io_size > span.len {
            return Err(usage(format!(
                "{given}: larger than the {}-byte region of {} (--size)",
                span.len, info.name
            )));
        }
    }
    Ok(())
}

/// A reactor's region of a device's span: the `share.index`-th of `share.of` equal parts, in
/// whole I/Os (at least one I/O each).
fn region(span: Region, share: Share, io_size: u64) -> Region {
    let ios = span.len / io_size;
    let per = (ios / share.of.max(1) as u64).max(1);
    let first = (share.index as u64 * per).min(ios.saturating_sub(1));
    Region {
        start: span.start + first * io_size,
        len: per * io_size,
    }
}

/// Waits for the run: stops it on Ctrl-C / SIGTERM, shows progress where a person watches
/// (see `progress::wanted`).
fn watch(run: &usnvme_engine::Run<Vec<workload::DeviceResult>>, live: bool) {
    let tty = live && usnvme_tools::progress::wanted();
    let mut last = (Instant::now(), 0u64, 0u64);
    let mut next_progress = Instant::now() + Duration::from_secs(1);
    while !run.is_finished() {
        if signals::received().is_some() {
            run.stop();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        if tty && Instant::now() >= next_progress {
            next_progress += Duration::from_secs(1);
            let snaps = run.stats();
            let total = usnvme_engine::stats::Snapshot::aggregate(&snaps).total();
            let (ios, bytes) = (total.total_ios(), total.total_bytes());
            let dt = last.0.elapsed().as_secs_f64().max(1e-3);
            eprint!(
                "\r{:>12.0} IOPS {:>8.2} GB/s   ",
                ios.saturating_sub(last.1) as f64 / dt,
                bytes.saturating_sub(last.2) as f64 / dt / 1e9
            );
            last = (Instant::now(), ios, bytes);
        }
    }
    if tty {
        eprint!("\r{:60}\r", "");
    }
}

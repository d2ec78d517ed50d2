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

mod hotplug;
mod metadata;
mod regions;
mod report;
mod session;
mod settings;
mod watch;
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
use usnvme_driver::pci::uevent::UeventSocket;
use usnvme_driver::pci::{Driver, Sysfs};
use usnvme_driver::protection::PiChecks;
use usnvme_driver::vfio::VfioError;
use usnvme_driver::{Controller, ControllerOptions, DeviceSpec, Opener};
use usnvme_engine::block::remote::RemoteSubsystem;
use usnvme_engine::block::DmaTarget;
use usnvme_engine::fabric::address::TcpAddress;
use usnvme_engine::topology::{format_cpu_list, parse_cores, Topology};
use usnvme_engine::transport::{ControllerLink, ReconnectPolicy};
use usnvme_engine::Run;
use usnvme_engine::{
    attach, BlockDevice, ChannelOptions, Drive, Engine, EngineOptions, NamespaceDevice, PiMode,
    Share, StripeDevice,
};
use usnvme_hugepages::{IovaSpace, NoIommu, PageSize};

use crate::remote::{RemoteArgs, Target};
use crate::signals;
use regions::{check_io_size, region, spans};
pub(crate) use regions::{devices, namespaces, stripes};
pub(crate) use report::Row;
pub(crate) use session::Session;
pub(crate) use settings::Settings;
use settings::{addition, positive_size, removal, seconds, settings, size, Pattern};
pub(crate) use settings::{stripe, Given};
use watch::watch;
use workload::{Region, RunSpec, Workload};

/// The largest I/O the block layer is asked to split, per drive of a stripe.
const MAX_SPLIT: u64 = 2 << 20;

/// Measure I/O performance: IOPS, bandwidth and latency per drive and core.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Queue depth: I/Os in flight per reactor per device.
    #[arg(short = 'q', long = "queue-depth", default_value_t = 32,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) depth: u32,
    /// I/O size in bytes: 4096, 4k, 128K, 1M.
    #[arg(short = 'o', long = "io-size", default_value = "4k", value_parser = positive_size)]
    io_size: Given<u64>,
    /// Access pattern (rw and randrw mix reads and writes by -M).
    #[arg(short = 'w', long = "workload", value_enum, default_value_t = Pattern::Randread)]
    workload: Pattern,
    /// Percentage of reads for rw and randrw (0-100).
    #[arg(short = 'M', long = "rwmixread", default_value_t = 50,
          value_parser = clap::value_parser!(u32).range(0..=100))]
    read_pct: u32,
    /// Seconds to measure (after the warm-up).
    #[arg(short = 't', long = "time", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) time: u64,
    /// Warm-up seconds: I/O runs but is not counted.
    #[arg(short = 'a', long = "warmup", default_value_t = 0)]
    warmup: u64,
    /// Reactor cores: a list (0,2-3), bracketed list ([0-3]) or hex mask (0xF). Default: all.
    #[arg(short = 'c', long = "cores")]
    cores: Option<String>,
    /// Device: a BDF (0000:01:00.0), sim:N[-M][,options], or a remote NVMe/TCP subsystem
    /// (tcp://ADDR[:PORT]/NQN, or an SPDK transport ID such as 'trtype:TCP traddr:ADDR
    /// trsvcid:PORT subnqn:NQN'); repeatable. Default: every NVMe controller bound to vfio-pci.
    #[arg(short = 'r', long = "device")]
    devices: Vec<String>,
    /// Latency percentiles (p50 … p99.99); -LL adds the histogram. Without it, latency is
    /// mean, min and max (recording a histogram per I/O costs more than the rest).
    #[arg(short = 'L', action = clap::ArgAction::Count)]
    latency: u8,
    /// Stop after N I/Os per reactor per device (warm-up included) instead of after -t.
    #[arg(long = "io-count", value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    io_count: Option<u64>,
    /// Write the results as JSON (fio-like) to FILE.
    #[arg(long = "json", value_name = "FILE")]
    json: Option<PathBuf>,
    /// Run on stripes (RAID 0) of N drives each, chunk size default 128K: N or N:CHUNK.
    #[arg(long = "stripe", value_name = "N[:CHUNK]", value_parser = stripe)]
    stripe: Option<Given<(usize, u64)>>,
    /// Cap the rate at this many IOPS in total.
    #[arg(long = "rate", value_name = "IOPS", value_parser = clap::value_parser!(u64).range(1..))]
    rate: Option<u64>,
    /// Stamp every written block (offset, seed, checksum) and check every block read.
    #[arg(long = "verify")]
    verify: bool,
    /// Debug: every write after the first N per device carries a bad checksum in its first block.
    #[arg(
        long = "corrupt-after",
        value_name = "N",
        hide = true,
        requires = "verify"
    )]
    corrupt_after: Option<u64>,
    /// Drive namespaces formatted with metadata and protection information, as SPDK's perf -e:
    /// PRACT=1 (the drive inserts the PI on writes, checks and strips it on reads) or PRACT=0
    /// (perf makes and checks it in software, DIF or DIX), PRCHK=GUARD|REFTAG|APPTAG (what the
    /// drive checks). Without it such namespaces are left out.
    #[arg(short = 'e', long = "pi", value_name = "PRACT=0|1[,PRCHK=…]", value_parser = settings::pi_mode)]
    pi: Option<PiMode>,
    /// Namespace to run on, on every drive (default: every active namespace).
    #[arg(short = 'n', long = "namespace", value_name = "NSID",
          value_parser = clap::value_parser!(u32).range(1..))]
    namespace: Option<u32>,
    /// Where the I/O region of each device starts, in bytes (4k, 1G, ...), like fio's --offset.
    #[arg(long = "offset", value_name = "BYTES", value_parser = size)]
    offset: Option<Given<u64>>,
    /// How many bytes the I/O region spans (default: to the end of the device), like fio's --size.
    #[arg(long = "size", value_name = "BYTES", value_parser = positive_size)]
    size: Option<Given<u64>>,
    /// Reset every controller once, S seconds into the measurement, while I/O runs. The I/Os
    /// the reset aborts are counted, not failures; the run fails if I/O does not resume.
    #[arg(long = "reset-after", value_name = "S", value_parser = seconds)]
    pub(crate) reset_after: Option<f64>,
    /// Seed of the --verify stamps (default: from the process ID). A read run given an earlier
    /// run's seed (its JSON `options.seed`) checks the blocks that run wrote.
    #[arg(long = "seed", value_name = "N", requires = "verify")]
    seed: Option<u64>,
    /// Use the controllers' shadow doorbells (Doorbell Buffer Config) where offered: only
    /// emulated controllers offer them; under software emulation (QEMU without KVM) they cost
    /// more than the doorbell writes they save, under a hypervisor with KVM they save VM exits.
    #[arg(long = "shadow-doorbells")]
    shadow_doorbells: bool,
    /// The drives' queue pairs raise interrupts (MSI-X through VFIO) and a reactor whose turn
    /// completed nothing sleeps until one: the latency and CPU of an interrupt-driven
    /// application (a polled run keeps its cores busy; local drives only).
    #[arg(long = "interrupts")]
    pub(crate) interrupts: bool,
    /// Keep Alive Timeout asked of NVMe/TCP targets, in seconds (a Keep Alive goes every third
    /// of it); 0: none (the target never gives up on a silent host).
    #[arg(long = "keep-alive-tmo", value_name = "S", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(0..=3600))]
    keep_alive_tmo: u32,
    /// Seconds between attempts to reconnect to an NVMe/TCP target that went away (its
    /// unfinished I/Os are kept and sent again once reconnected), as Linux's host has it.
    #[arg(long = "reconnect-delay", value_name = "S", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(1..=3600))]
    reconnect_delay: u32,
    /// Seconds after losing an NVMe/TCP target before giving up on it (its I/Os then fail as
    /// from a removed drive); 0: give up at once, -1: never, as Linux's host has it.
    #[arg(long = "ctrl-loss-tmo", value_name = "S", default_value_t = 600,
          allow_negative_numbers = true,
          value_parser = clap::value_parser!(i32).range(-1..=86400))]
    ctrl_loss_tmo: i32,
    #[command(flatten)]
    remote: RemoteArgs,
    /// Debug: surprise-remove a simulated drive S seconds into the measurement (sim:N@S).
    #[arg(long = "remove", value_name = "DEVICE@S", hide = true, value_parser = removal)]
    pub(crate) remove: Option<(String, f64)>,
    /// Drives bound to vfio-pci during the run (a drive hot added, then `usnvme setup bind`)
    /// join it: their namespaces (or -n's) on the reactors of their NUMA node, each reactor on
    /// its share of the span (--offset, --size); their rows count from when they joined.
    #[arg(long)]
    pub(crate) hotplug: bool,
    /// Debug: a simulated drive joins the run S seconds into the measurement, as with
    /// --hotplug (sim:N[,options]@S).
    #[arg(long = "add", value_name = "DEVICE@S", hide = true, value_parser = addition)]
    pub(crate) add: Option<(DeviceSpec, f64)>,
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
    let run = session.settings.run.clone();
    let cores = session.engine.placement().reactors.len();
    for line in session.engine.placement_by_node() {
        eprintln!("usnvme perf: {line}");
    }
    let mut length = match run.duration {
        Some(d) => format!("for {} s", d.as_secs()),
        None => format!("{} I/Os per device and core", run.io_count.unwrap_or(0)),
    };
    if args.warmup > 0 {
        // the table is the steady state: what the warm-up did is not in it
        length += &format!(" after a {} s warm-up (not counted)", args.warmup);
    }
    let announce = format!(
        "usnvme perf: {} device(s) on {cores} core(s): measuring {length}",
        session.devices.len()
    );
    let m = session.measure(&run, args.rate, true, Some(&announce))?;
    out.write_all(report::table(&m.rows, args.latency).as_bytes())?;
    out.write_all(report::errors(&m.rows).as_bytes())?;
    if let Some(line) = m.reset_line() {
        writeln!(out, "\n{line}")?;
    }
    out.flush()?;
    if let Some(path) = &args.json {
        let options = json!({
            "queue_depth": args.depth, "io_size": run.io_size, "workload": args.workload,
            "read_pct": run.read_pct, "time_s": args.time, "warmup_s": args.warmup,
            "io_count": args.io_count, "rate": args.rate, "verify": args.verify,
            "stripe": args.stripe, "namespace": args.namespace, "offset": args.offset,
            "size": args.size, "reset_after_s": args.reset_after, "seed": run.seed,
        });
        let mut doc = report::json(&m.rows, options, args.latency);
        if let Some(reset) = m.reset_json() {
            doc["reset"] = reset;
        }
        if args.verify {
            // blocks read back that carried a stamp and were checked
            doc["verified_blocks"] = json!(m.checked);
        }
        let text = serde_json::to_string_pretty(&doc)?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if args.verify && run.read_pct > 0 && m.checked == 0 {
        eprintln!(
            "usnvme: warning: --verify checked no block: none read back carried a stamp \
             (write first, in the same run; a sim drive keeps data only with backend=ram)"
        );
    }
    m.verdict()
}

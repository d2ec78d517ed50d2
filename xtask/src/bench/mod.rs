//! `cargo xtask bench`: the driver's, the engine's and `usnvme perf`'s cost per I/O on `sim`
//! (host), usnvme against the kernel's path side by side in one VM boot, `usnvme serve` against
//! the kernel's nvmet-tcp under the same NVMe/TCP initiator in another, and, given a
//! `spdk_nvme_perf` binary, against SPDK in a third; writes BENCHMARKS.md: a table of headline
//! figures first, then the sections, whose guest scripts, `usnvme serve` logs and chart go into
//! `benchmarks/` beside it ([`Companions`]). Benchmarks report figures; they never fail on one.

mod fabric;
mod fio;
mod host;
mod native;
mod rdma;
mod scale;
mod spdk;
mod vm;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::cmd;
use fabric::FabricResults;
use host::{example, Split};
use spdk::SpdkResults;
use vm::{Tool, VmResults};

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Skip the VM sections (host figures only).
    #[arg(long)]
    no_vm: bool,
    /// Run only this section: host (callgrind and native on `sim`), vm (side by side with the
    /// kernel), fabric (usnvme serve against the kernel's nvmet-tcp), spdk (same boot as
    /// SPDK; needs --spdk), fio (fio with usnvme's engine against usnvme perf) or
    /// fabric-native (NVMe/TCP on this machine's cores: serve against SPDK's nvmf_tgt, perf
    /// against spdk_nvme_perf; needs --spdk-target and --spdk-perf) or scale (one process on
    /// 1, 2, 4, … cores against separate processes; serve on 1, 2, 4, 8 reactors) or
    /// fabric-rdma (usnvme perf against the kernel's nvme-rdma host in front of nvmet-rdma, and
    /// usnvme serve against nvmet-rdma behind that host, on soft-RoCE: functional figures).
    #[arg(long, value_enum, value_name = "SECTION")]
    only: Option<Section>,
    /// Fewer I/Os, a single VM case, shorter and fewer SPDK rounds: checks that everything runs.
    #[arg(long)]
    quick: bool,
    /// Seconds per VM run of the side by side with the kernel.
    #[arg(long, default_value_t = 4)]
    seconds: u32,
    /// Seconds per run of the fabric sections (default 10, fabric-rdma 5; 3 with --quick).
    #[arg(long, value_name = "S")]
    fabric_seconds: Option<u32>,
    /// A `spdk_nvme_perf` binary: run issue 13's workloads with it and with usnvme perf in one
    /// boot (it is copied onto the guest's work share).
    #[arg(long, value_name = "PATH")]
    spdk: Option<PathBuf>,
    /// SPDK's fio plugin (`build/fio/spdk_nvme` of an SPDK tree configured `--with-fio` on the
    /// installed fio's source, `target/fio/src/`): the fio section runs it beside the engine.
    #[arg(long, value_name = "PATH")]
    spdk_fio: Option<PathBuf>,
    /// SPDK's `nvmf_tgt` (its `scripts/rpc.py` is found in the same tree, or give
    /// --spdk-rpc): the fabric-native section runs it beside `usnvme serve`.
    #[arg(long, value_name = "PATH", requires = "spdk_perf")]
    spdk_target: Option<PathBuf>,
    /// SPDK's `spdk_nvme_perf` (NVMe/TCP initiator): the fabric-native section runs it beside
    /// `usnvme perf`.
    #[arg(long, value_name = "PATH", requires = "spdk_target")]
    spdk_perf: Option<PathBuf>,
    /// SPDK's `scripts/rpc.py`, where it is not in nvmf_tgt's tree.
    #[arg(long, value_name = "PATH")]
    spdk_rpc: Option<PathBuf>,
    /// Seconds per run (-t) of the SPDK comparison (default 10; 3 with --quick).
    #[arg(long, value_name = "S")]
    spdk_seconds: Option<u32>,
    /// Run only these host benchmarks (by key: driver-1, driver-24, engine-1, engine-24,
    /// engine-stripe, perf-1, perf-24, perf-stripe; repeatable): a quicker way to measure one.
    #[arg(long, value_name = "KEY")]
    case: Vec<String>,
    /// Where to write the report (default: BENCHMARKS.md in the workspace root); the files it
    /// links go into `benchmarks/` beside it.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Section {
    Host,
    Vm,
    Fabric,
    Spdk,
    Fio,
    FabricNative,
    Scale,
    FabricRdma,
}

/// One host benchmark: what ran and what it measured.
struct HostRow {
    key: &'static str,
    label: &'static str,
    command: String,
    iops: f64,
    split: Split,
    /// The functions of ours that cost the most per I/O (profiled cases only).
    functions: Vec<host::FunctionCost>,
    line: String,
}

/// The host section's figures.
struct HostResults {
    rows: Vec<HostRow>,
    cycles: Option<f64>,
    scale: Vec<(&'static str, String, host::Native)>,
}

/// A host case: `program` with `args`, whose `{ios}` is the I/O count of each of `devices`
/// devices (the benchmark examples take the total: one).
struct HostCase {
    key: &'static str,
    label: &'static str,
    program: &'static str,
    args: Vec<String>,
    devices: u64,
    /// Keep its per-function inclusive profile for the report.
    profile: bool,
}

pub fn run(args: BenchArgs) -> Result<()> {
    let root = crate::workspace_root();
    let provenance = Provenance::now();
    let only = |s: Section| args.only.is_none_or(|o| o == s);
    let (run_host, run_vm) = (only(Section::Host), !args.no_vm && only(Section::Vm));
    let spdk_binary = match &args.spdk {
        Some(p) if !p.is_file() => bail!("--spdk {}: no such file", p.display()),
        Some(p) => Some(std::fs::canonicalize(p)?),
        None if args.only == Some(Section::Spdk) => {
            bail!("--only spdk needs --spdk PATH (a spdk_nvme_perf binary)")
        }
        None => None,
    };
    let run_spdk = !args.no_vm && only(Section::Spdk) && spdk_binary.is_some();
    let run_fabric = !args.no_vm && only(Section::Fabric);
    let run_rdma = !args.no_vm && only(Section::FabricRdma);
    let run_fio = !args.no_vm && only(Section::Fio);
    let run_scale = only(Section::Scale);
    let native_spdk = match (&args.spdk_target, &args.spdk_perf) {
        (Some(t), Some(p)) => Some(native::Spdk::find(t, p, args.spdk_rpc.as_deref())?),
        _ if args.only == Some(Section::FabricNative) => bail!(
            "--only fabric-native needs --spdk-target PATH/nvmf_tgt --spdk-perf PATH/spdk_nvme_perf"
        ),
        _ => None,
    };
    let spdk_fio = match &args.spdk_fio {
        Some(p) if !p.is_file() => bail!("--spdk-fio {}: no such file", p.display()),
        Some(p) => Some(std::fs::canonicalize(p)?),
        None => None,
    };
    cmd::run(
        "bench: build (release)",
        Command::new("cargo")
            .args([
                "build",
                "--release",
                "-p",
                "usnvme-tools",
                "--bin",
                "usnvme",
            ])
            .args(crate::FEATURES)
            .args(["-p", "usnvme-driver", "--example", "null_bench"])
            .args(["-p", "usnvme-engine", "--example", "engine_bench"])
            .current_dir(&root),
        "fix the build errors above",
    )?;
    let usnvme = crate::target_dir().join("release/usnvme");
    let host = if run_host {
        Some(host_section(&args, &usnvme)?)
    } else {
        None
    };
    let vm = if run_vm {
        println!("bench: VM side by side (one boot, 12 drives on nvme, 12 on vfio-pci)");
        Some(vm::side_by_side(&usnvme, args.quick, args.seconds)?)
    } else {
        None
    };
    let fabric = if run_fabric {
        println!(
            "bench: fabric (one boot: the kernel's nvme-tcp initiator and fio against usnvme \
             serve and nvmet-tcp)"
        );
        let seconds = args
            .fabric_seconds
            .unwrap_or(if args.quick { 3 } else { 10 });
        Some(fabric::same_boot(
            &usnvme,
            spdk_binary.as_deref(),
            args.quick,
            seconds,
        )?)
    } else {
        None
    };
    let rdma = if run_rdma {
        println!(
            "bench: fabric over RDMA (one boot: usnvme perf and the kernel's nvme-rdma host with \
             fio against nvmet-rdma, that host and fio against usnvme serve, on soft-RoCE)"
        );
        let seconds = args
            .fabric_seconds
            .unwrap_or(if args.quick { 3 } else { 5 });
        Some(rdma::same_boot(&usnvme, args.quick, seconds)?)
    } else {
        None
    };
    let spdk = match (&spdk_binary, run_spdk) {
        (Some(binary), true) => {
            println!("bench: same boot as SPDK ({})", binary.display());
            let seconds = args.spdk_seconds.unwrap_or(if args.quick { 3 } else { 10 });
            let rounds = if args.quick { 2 } else { 3 };
            Some(spdk::same_boot(&usnvme, binary, seconds, rounds)?)
        }
        _ => None,
    };
    let fio = if run_fio {
        println!("bench: fio with usnvme's engine against usnvme perf (one boot)");
        let engine = crate::fio_engine::build(&Default::default())?;
        let seconds = args.spdk_seconds.unwrap_or(if args.quick { 3 } else { 10 });
        let rounds = if args.quick { 1 } else { 3 };
        Some(fio::same_boot(
            &usnvme,
            &engine,
            spdk_fio.as_deref(),
            seconds,
            rounds,
        )?)
    } else {
        None
    };
    let scale = if run_scale {
        println!("bench: scaling over this machine's cores");
        Some(scale::run(&usnvme, args.seconds)?)
    } else {
        None
    };
    let native = match &native_spdk {
        Some(spdk) if only(Section::FabricNative) => {
            println!(
                "bench: NVMe/TCP natively (serve against nvmf_tgt, perf against spdk_nvme_perf)"
            );
            let seconds = args
                .fabric_seconds
                .unwrap_or(if args.quick { 3 } else { 10 });
            Some(native::run(
                &usnvme,
                spdk,
                seconds,
                native::rounds(args.quick),
            )?)
        }
        _ => None,
    };
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| root.join("BENCHMARKS.md"));
    let results = Results {
        host,
        vm,
        fabric,
        rdma,
        spdk,
        fio,
        native,
        scale,
    };
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&out, report(&results, &args, &provenance, &out)?)?;
    println!("bench: wrote {}", out.display());
    Ok(())
}

/// What the sections measured; `None`: the section did not run.
struct Results {
    host: Option<HostResults>,
    vm: Option<VmResults>,
    fabric: Option<FabricResults>,
    rdma: Option<rdma::RdmaResults>,
    spdk: Option<SpdkResults>,
    fio: Option<fio::FioResults>,
    native: Option<native::NativeResults>,
    scale: Option<scale::ScaleResults>,
}

fn host_section(args: &BenchArgs, usnvme: &std::path::Path) -> Result<HostResults> {
    let (native_ios, callgrind_ios, runs) = if args.quick {
        (200_000u64, 20_000u64, 1)
    } else {
        (20_000_000, 100_000, 3)
    };
    let engine_bench = example("engine_bench");
    let s = |v: &[&str]| -> Vec<String> { v.iter().map(|x| x.to_string()).collect() };
    // usnvme perf with its defaults but for the flags that make it a benchmark of the software
    // (timeouts, statistics and the progress line stay on)
    let perf = |drives: &str, extra: &[&str]| -> Vec<String> {
        let mut a = s(&["perf", "-r"]);
        a.push(format!("sim:{drives},backend=null,mode=inline,size=1T"));
        a.extend(s(&[
            "-c",
            "0",
            "-o",
            "4k",
            "-w",
            "randread",
            "--io-count",
            "{ios}",
        ]));
        a.extend(s(extra));
        a
    };
    let case = |key, label, program, args, devices| HostCase {
        key,
        label,
        program,
        args,
        devices,
        // where the instructions of the whole `usnvme perf` path go, function by function
        profile: key == "perf-1",
    };
    let cases = [
        case(
            "driver-1",
            "driver, 1 drive, QD 128",
            "null_bench",
            s(&["1", "128", "{ios}"]),
            1,
        ),
        case(
            "driver-24",
            "driver, 24 drives, QD 128 each",
            "null_bench",
            s(&["24", "128", "{ios}"]),
            1,
        ),
        case(
            "engine-1",
            "engine, namespace, 1 drive, QD 128",
            "engine_bench",
            s(&["namespace", "1", "128", "{ios}", "0"]),
            1,
        ),
        case(
            "engine-24",
            "engine, namespaces, 24 drives, QD 128 each",
            "engine_bench",
            s(&["namespace", "24", "128", "{ios}", "0"]),
            1,
        ),
        case(
            "engine-stripe",
            "engine, stripe over 24 drives, QD 3072",
            "engine_bench",
            s(&["stripe", "24", "3072", "{ios}", "0"]),
            1,
        ),
        case(
            "perf-1",
            "usnvme perf, 1 drive, QD 128",
            "usnvme",
            perf("0", &["-q", "128"]),
            1,
        ),
        // QD 32 per drive for both 24-drive rows: perf's default, and as deep as a stripe may go
        // (its -q is bounded by one drive's queue)
        case(
            "perf-24",
            "usnvme perf, 24 namespaces, QD 32 each",
            "usnvme",
            perf("0-23", &["-q", "32"]),
            24,
        ),
        case(
            "perf-stripe",
            "usnvme perf, stripe over 24 drives, QD 768",
            "usnvme",
            perf("0-23", &["-q", "768", "--stripe", "24"]),
            1,
        ),
    ];
    if let Some(unknown) = args
        .case
        .iter()
        .find(|k| !cases.iter().any(|c| c.key == k.as_str()))
    {
        bail!("--case {unknown}: no such host benchmark");
    }
    let mut rows = Vec::new();
    for c in cases
        .iter()
        .filter(|c| args.case.is_empty() || args.case.iter().any(|k| k == c.key))
    {
        println!("bench: {}", c.label);
        let program = if c.program == "usnvme" {
            usnvme.to_path_buf()
        } else {
            example(c.program)
        };
        let native_args = host::with_ios(&c.args, native_ios / c.devices);
        let native = host::native(&program, &native_args, runs)?;
        let measured = host::callgrind(
            &program,
            &c.args,
            callgrind_ios / c.devices,
            c.devices,
            c.key,
            c.profile,
        )?;
        rows.push(HostRow {
            key: c.key,
            label: c.label,
            command: format!("{} {}", c.program, native_args.join(" ")),
            iops: native.iops,
            split: measured.split,
            functions: measured.functions,
            line: native.line,
        });
    }
    let cycles = host::cycles(
        &example("null_bench"),
        &s(&["1", "128", "{ios}"]),
        callgrind_ios * 10,
    )?;
    let mut scale = Vec::new();
    for cores in ["0", "0-1"] {
        println!("bench: engine on 24 drives, cores {cores}");
        let a = s(&["namespace", "24", "128", &native_ios.to_string(), cores]);
        let native = host::native(&engine_bench, &a, runs)?;
        scale.push((cores, format!("engine_bench {}", a.join(" ")), native));
    }
    Ok(HostResults {
        rows,
        cycles,
        scale,
    })
}

/// Writes a benchmark's guest script into `out` (the work share the guest sees) and returns
/// the arguments of a boot that runs it.
fn guest_script(out: &std::path::Path, body: &str) -> Result<crate::vm::run::RunArgs> {
    let script = out.join("bench.sh");
    std::fs::write(&script, body)?;
    Ok(bench_boot(vec![
        "/bin/sh".into(),
        script.display().to_string(),
    ]))
}

/// A benchmark's boot running `program`: multi-threaded TCG (a host thread per vCPU: on 24
/// drives from two cores, 24 % more than one thread for both) with x2APIC, which keeps that mode's
/// lost-interrupt hang away (issue 22's reproducer under two busy threads: 5 of 5 boots passed
/// with x2APIC, while without it a boot hung). `USNVME_VM_TCG_THREADS` still chooses; vm-test
/// stays single-threaded, and the hang watchdog stays on.
pub fn bench_boot(program: Vec<String>) -> crate::vm::run::RunArgs {
    let mut args = crate::vm::run::RunArgs::for_program(program);
    if std::env::var_os("USNVME_VM_TCG_THREADS").is_none() {
        args.tcg_threads = crate::vm::qemu::TcgThreads::Multi;
        args.x2apic = true;
    }
    args
}

fn git(args: &[&str]) -> String {
    Command::new("git")
        .args(args)
        .current_dir(crate::workspace_root())
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cpu}, {cores} cores, Linux {}", kernel.trim())
}

fn millions(iops: f64) -> String {
    format!("{:.2} M", iops / 1e6)
}

/// Where and when a run measured: the same for every figure of one run.
struct Provenance {
    /// When the run started (UTC).
    date: String,
    machine: String,
    /// The commit, and whether the tree had uncommitted changes.
    commit: String,
}

impl Provenance {
    fn now() -> Provenance {
        let date = Command::new("date")
            .args(["-u", "+%Y-%m-%d %H:%M UTC"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        let dirty = if git(&["status", "--porcelain"]).is_empty() {
            ""
        } else {
            " (with uncommitted changes)"
        };
        Provenance {
            date,
            machine: machine(),
            commit: format!("{}{dirty}", git(&["rev-parse", "--short", "HEAD"])),
        }
    }
}

/// A section's name on the command line (`--only NAME`).
fn section_name(section: Section) -> String {
    use clap::ValueEnum as _;
    section
        .to_possible_value()
        .map_or_else(String::new, |v| v.get_name().to_string())
}

/// The flags of a run that a section's rerun needs too: `--quick` and the programs given.
fn common_flags(args: &BenchArgs) -> String {
    let mut flags = String::new();
    if args.quick {
        flags.push_str(" --quick");
    }
    if args.spdk.is_some() {
        flags.push_str(" --spdk PATH");
    }
    if args.spdk_fio.is_some() {
        flags.push_str(" --spdk-fio PATH");
    }
    if args.spdk_target.is_some() {
        flags.push_str(" --spdk-target PATH --spdk-perf PATH");
    }
    flags
}

/// Starts section `heading`: its results, or `None` once it said it did not run (`why_not`).
fn open_section<'a, T>(
    m: &mut String,
    heading: &str,
    results: Option<&'a T>,
    why_not: &str,
) -> Result<Option<&'a T>> {
    writeln!(m, "\n## {heading}\n")?;
    if results.is_none() {
        writeln!(m, "Not run ({why_not}).")?;
    }
    Ok(results)
}

/// Markdown's code span.
fn code(text: &str) -> String {
    format!("`{text}`")
}

/// A headline's value where the section ran but the figure is missing.
const MISSING: &str = "no figure (a run failed; see the section)";

/// A median ratio as a headline's value.
fn times(ratio: Option<f64>) -> String {
    ratio.map_or(MISSING.into(), |x| format!("{x:.2} ×"))
}

/// `a` ÷ `b` with both IOPS, as a headline's value.
fn versus(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!(
            "{:.2} × ({:.1} k against {:.1} k IOPS)",
            a / b,
            a / 1e3,
            b / 1e3
        ),
        _ => MISSING.into(),
    }
}

/// The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .flat_map(char::to_lowercase)
        .collect()
}

/// The files a report links, in a folder `benchmarks/` beside it: guest scripts, `usnvme
/// serve`'s logs, the scaling chart. Only the sections that ran write theirs.
struct Companions {
    dir: PathBuf,
    /// The folder as the report's links name it (relative to the report).
    link: String,
}

impl Companions {
    const FOLDER: &'static str = "benchmarks";

    /// The folder beside the report `report`.
    fn beside(report: &Path) -> Companions {
        Companions {
            dir: report.parent().unwrap_or(Path::new("")).join(Self::FOLDER),
            link: Self::FOLDER.into(),
        }
    }

    /// Where the file `name` goes (the folder is made).
    fn path(&self, name: &str) -> Result<PathBuf> {
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("bench: making {}", self.dir.display()))?;
        Ok(self.dir.join(name))
    }

    /// The Markdown link from the report to `name`.
    fn link(&self, name: &str) -> String {
        let target = format!("{}/{name}", self.link);
        format!("[{target}]({target})")
    }

    /// Writes `body` into `name`; its Markdown link.
    fn file(&self, name: &str, body: &str) -> Result<String> {
        let path = self.path(name)?;
        std::fs::write(&path, body)
            .with_context(|| format!("bench: writing {}", path.display()))?;
        Ok(self.link(name))
    }
}

/// One key figure for the report's first page.
struct Headline {
    /// The heading of the section it comes from.
    section: &'static str,
    figure: String,
    value: String,
    /// Markdown: the command line that produced it, or how to rerun its section.
    command: String,
}

/// The headline figures the sections that ran give, in the order they give them.
struct Headlines {
    rows: Vec<Headline>,
    /// `common_flags` of this run.
    flags: String,
}

impl Headlines {
    fn new(flags: String) -> Headlines {
        Headlines {
            rows: Vec::new(),
            flags,
        }
    }

    /// A figure of the section headed `section`; `command` is Markdown.
    fn add(
        &mut self,
        section: &'static str,
        figure: impl Into<String>,
        value: impl Into<String>,
        command: impl Into<String>,
    ) {
        self.rows.push(Headline {
            section,
            figure: figure.into(),
            value: value.into(),
            command: command.into(),
        });
    }

    /// The command that runs `section` again, as a code span, where no single program's
    /// command line gives a figure.
    fn rerun(&self, section: Section) -> String {
        code(&format!(
            "cargo xtask bench --only {}{}",
            section_name(section),
            self.flags
        ))
    }

    fn render(&self, m: &mut String, p: &Provenance) -> std::fmt::Result {
        writeln!(
            m,
            "## Headline figures\n\nEvery figure below is from this one run: machine {}, commit \
             {}, date {}. Each links to the section that says how it was measured.\n",
            p.machine, p.commit, p.date
        )?;
        if self.rows.is_empty() {
            return writeln!(m, "None: no section that gives one ran.\n");
        }
        writeln!(
            m,
            "| Figure | Value | Command | Section |\n|---|---|---|---|"
        )?;
        let cell = |text: &str| text.replace('|', "\\|");
        for r in &self.rows {
            // the link names the section by its heading's first words
            let short = r.section.split([':', '(']).next().unwrap_or_default();
            writeln!(
                m,
                "| {} | {} | {} | [{}](#{}) |",
                cell(&r.figure),
                cell(&r.value),
                cell(&r.command),
                short.trim(),
                anchor(r.section)
            )?;
        }
        writeln!(m)
    }
}

/// The report: the run's title lines, the headline figures, then every section.
fn report(r: &Results, args: &BenchArgs, p: &Provenance, out: &Path) -> Result<String> {
    let companions = Companions::beside(out);
    let mut headlines = Headlines::new(common_flags(args));
    let h = &mut headlines;
    let mut body = String::new();
    let m = &mut body;
    let why_not_vm = if args.no_vm { "`--no-vm`" } else { "`--only`" };
    match &r.host {
        Some(host) => host_report(m, host, args, h)?,
        None => writeln!(m, "## {HOST}\n\nNot run (`--only`).\n")?,
    }
    match &r.vm {
        Some(vm) => vm_section(m, vm, args, &companions, h)?,
        None => writeln!(m, "\n## {VM}\n\nNot run ({why_not_vm}).")?,
    }
    fabric::section(m, r.fabric.as_ref(), why_not_vm, &companions, h)?;
    rdma::section(m, r.rdma.as_ref(), why_not_vm, &companions, h, p)?;
    if r.spdk.is_none() && args.spdk.is_some() {
        writeln!(m, "\n## {}\n\nNot run ({why_not_vm}).", spdk::HEADING)?;
    } else {
        spdk::section(m, r.spdk.as_ref(), &companions, h)?;
    }
    fio::section(m, r.fio.as_ref(), why_not_vm, &companions, h)?;
    let why_not_native = if args.spdk_target.is_some() {
        "`--only`"
    } else {
        "no SPDK given"
    };
    native::section(m, r.native.as_ref(), why_not_native, h)?;
    scale::section(m, r.scale.as_ref(), "`--only`", &companions, h)?;
    let mut flags = String::new();
    if args.no_vm {
        flags.push_str(" --no-vm");
    }
    if let Some(o) = args.only {
        flags.push_str(&format!(" --only {}", section_name(o)));
    }
    flags.push_str(&common_flags(args));
    let mut report = String::new();
    writeln!(report, "# Benchmarks\n")?;
    writeln!(
        report,
        "Written by `cargo xtask bench{flags}` on {}.\n\n- Machine: {}\n- Commit: {}\n- \
         Programs: `driver/examples/null_bench.rs`, `engine/examples/engine_bench.rs` and \
         `usnvme perf` (release build) on `sim`; `usnvme perf`, fio, `usnvme serve`, nvmet-tcp, \
         nvmet-rdma and `spdk_nvme_perf` in the VM test bed.\n",
        p.date, p.machine, p.commit,
    )?;
    headlines.render(&mut report, p)?;
    report.push_str(&body);
    Ok(report)
}

/// The host section's heading.
const HOST: &str = "Cost per I/O (host, `sim` null backend, inline mode)";
/// The VM section's heading.
const VM: &str = "VM side by side (one boot: 12 drives on the kernel's nvme, 12 on vfio-pci)";

fn host_report(
    m: &mut String,
    h: &HostResults,
    args: &BenchArgs,
    headlines: &mut Headlines,
) -> Result<()> {
    let rows = &h.rows;
    let row = |key: &str| rows.iter().find(|r| r.key == key);
    if let Some(p) = row("perf-1") {
        headlines.add(
            HOST,
            "Instructions per 4 KiB read, the whole `usnvme perf` path less the simulated \
             controller (callgrind; 1 `sim` null drive, QD 128)",
            format!("{:.0} (driver {:.0})", p.split.host_side(), p.split.driver),
            code(&p.command),
        );
        headlines.add(
            HOST,
            "IOPS on one core, `usnvme perf`, 1 `sim` null drive, QD 128 (the simulated \
             controller on the same core)",
            millions(p.iops),
            code(&p.command),
        );
    }
    writeln!(
        m,
        "## {HOST}\n\n\
         4 KiB random reads, one thread (one reactor on core 0), with production settings: \
         command timeouts on (30 s), and `usnvme perf` with its default flags otherwise \
         (statistics, latency stamps, progress line). The inline `sim` controller runs inside \
         the doorbell writes, on the same core, so its cost is counted apart. *Instructions per \
         I/O* come from `valgrind --tool=callgrind --dump-instr=no`: two runs of N and 2N I/Os, \
         the difference divided by N, so set-up cancels (and one-time lazy statics such as the \
         TSC calibration, which spins for a wall-clock time, are left out). They are split by \
         where the code lives, not by function names: each instruction is charged to the crate \
         whose source line it comes from (the line tables follow inlining, so driver code that \
         LTO inlined into the engine still counts as the driver's), and code of the standard \
         library and dependencies that runs out of line (vm-memory lookups, clock reads, \
         memcpy) is charged to its callers, in proportion to their calls' inclusive cost. \
         *Driver*: `usnvme_driver` but its `sim` module, and `usnvme_hugepages`; *engine + \
         block layer*: `usnvme_engine`; *perf workload*: `usnvme_tools` and the `usnvme` \
         binary; *sim controller*: `usnvme_driver::sim`; *rest*: the example's own loop and \
         library code no code of ours called. IOPS are the median of {} native runs and include \
         the simulated controller's work.\n",
        if args.quick { 1 } else { 3 }
    )?;
    writeln!(
        m,
        "| benchmark | IOPS (1 core) | instructions / I/O | driver | engine + block layer | perf workload | sim controller | rest |\n|---|---:|---:|---:|---:|---:|---:|---:|"
    )?;
    for r in rows {
        let p = &r.split;
        writeln!(
            m,
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
            r.label,
            millions(r.iops),
            p.total,
            p.driver,
            p.engine,
            p.perf,
            p.sim,
            p.rest
        )?;
    }
    writeln!(m)?;
    if let (Some(d), Some(p)) = (row("driver-1"), row("perf-1")) {
        writeln!(
            m,
            "- Driver: **{:.0} instructions per 4 KiB read** under the bare loop (null_bench), \
             **{:.0}** under `usnvme perf` (goal ≤ 150).",
            d.split.driver, p.split.driver
        )?;
    }
    if let Some(p) = row("perf-1") {
        let s = &p.split;
        writeln!(
            m,
            "- The whole `usnvme perf` path with default flags, less the simulated controller: \
             **{:.0} instructions per I/O** (goal ≤ 400): driver {:.0}, engine and block layer \
             {:.0}, perf's workload {:.0}, rest {:.0}.",
            s.host_side(),
            s.driver,
            s.engine,
            s.perf,
            s.rest
        )?;
    }
    if let (Some(st), Some(ns)) = (row("perf-stripe"), row("perf-24")) {
        writeln!(
            m,
            "- A 24-drive stripe costs **{:.2} ×** 24 namespaces per I/O under `usnvme perf` \
             (goal ≤ 1.3 ×; less the simulated controller: {:.0} against {:.0} instructions).",
            st.split.host_side() / ns.split.host_side(),
            st.split.host_side(),
            ns.split.host_side()
        )?;
    }
    if let (Some(st), Some(ns)) = (row("engine-stripe"), row("engine-24")) {
        writeln!(
            m,
            "- Through the engine alone (engine_bench, QD 128 per drive): the stripe costs \
             {:.2} × the namespaces ({:.0} against {:.0}).",
            st.split.host_side() / ns.split.host_side(),
            st.split.host_side(),
            ns.split.host_side()
        )?;
    }
    if let Some(first) = row("driver-1") {
        let s = &first.split;
        writeln!(
            m,
            "- Driver + simulated controller on one core: **{}** IOPS (goal ≥ 15 M for the \
             driver; the simulated controller runs on the same core and costs {:.0} instructions \
             per I/O, {:.0} % of the total).",
            millions(first.iops),
            s.sim,
            100.0 * s.sim / s.total,
        )?;
        if let Some(engine) = row("engine-1") {
            writeln!(
                m,
                "- The engine (channels, latency stamps, statistics, block layer) costs {:.0} \
                 instructions per I/O: {:.0} % of the driver's cost (goal ≤ 30 %).",
                engine.split.engine,
                100.0 * engine.split.engine / s.driver.max(1.0)
            )?;
        }
    }
    match h.cycles {
        Some(c) => writeln!(m, "- Cycles per I/O (`perf stat`, driver + sim): {c:.0}.")?,
        None => writeln!(
            m,
            "- Cycles per I/O: not measured — `perf stat` has no cycle counter on this machine."
        )?,
    }
    for r in rows.iter().filter(|r| !r.functions.is_empty()) {
        functions_report(m, r)?;
    }
    let qp = row("driver-1").map(|r| {
        let n = host::Native {
            iops: 0.0,
            line: r.line.clone(),
        };
        (n.value("qp_dma_bytes"), n.value("qp_host_bytes"))
    });
    writeln!(
        m,
        "\nCommands (examples from `target/release/examples/`, `usnvme` from `target/release/`; \
         callgrind ran the same with a smaller `{{ios}}`):\n"
    )?;
    for r in rows {
        writeln!(m, "- `{}` → `{}`", r.command, r.line)?;
    }
    writeln!(m, "\n## Scale\n")?;
    writeln!(
        m,
        "| engine on 24 `sim` null drives, QD 128 each | IOPS |\n|---|---:|"
    )?;
    for (cores, command, n) in &h.scale {
        writeln!(
            m,
            "| {} core{} (`{command}`) | {} |",
            if *cores == "0" { 1 } else { 2 },
            if *cores == "0" { "" } else { "s" },
            millions(n.iops)
        )?;
    }
    if let Some((Some(dma), Some(host))) = qp {
        writeln!(
            m,
            "\n- Memory per queue pair (depth 129, MDTS 512 KiB): {:.0} KiB of DMA memory (SQ, CQ \
             and a PRP-list slot per command) and {:.1} KiB of host memory (trackers).",
            dma / 1024.0,
            host / 1024.0
        )?;
    }
    if let Some(a) = h.scale.first().and_then(|(_, _, n)| n.value("attach_ms")) {
        writeln!(
            m,
            "- Attach of 24 `sim` controllers (in parallel): {a:.1} ms."
        )?;
    }
    Ok(())
}

/// The functions of ours that cost `r` the most per I/O, inclusive.
fn functions_report(m: &mut String, r: &HostRow) -> Result<()> {
    writeln!(
        m,
        "\n### Where the instructions go: {}\n\n\
         The {} functions of ours that cost the most per I/O, from the same two callgrind runs \
         (`callgrind_annotate --inclusive=yes`, the difference divided by the I/O count). \
         *Inclusive*: everything the function ran, what it called included (the simulated \
         controller too, inside the doorbell writes); *own*: its own instructions, with what \
         LTO inlined into it. With LTO most of the path is inlined into few functions: the \
         table above splits the same instructions by the crate of their source lines.\n",
        r.label,
        r.functions.len()
    )?;
    writeln!(
        m,
        "| function | part | inclusive / I/O | own / I/O |\n|---|---|---:|---:|"
    )?;
    for f in &r.functions {
        writeln!(
            m,
            "| `{}` | {} | {:.1} | {:.1} |",
            f.symbol.replace('|', "\\|"),
            f.part.name(),
            f.inclusive,
            f.own
        )?;
    }
    Ok(())
}

fn vm_section(
    m: &mut String,
    vm: &VmResults,
    args: &BenchArgs,
    companions: &Companions,
    headlines: &mut Headlines,
) -> Result<()> {
    let script = companions.file("vm.sh", &vm.script)?;
    let get = |t| vm::lookup(vm, t, 32, 1, 1);
    headlines.add(
        VM,
        "`usnvme perf` ÷ fio with io_uring on the kernel's nvme driver, IOPS, 4 KiB randread \
         QD 32, 1 drive, 1 core (VM under TCG: only the ratio counts)",
        versus(get(Tool::Usnvme), get(Tool::FioIoUring)),
        format!("{} (guest script: {script})", headlines.rerun(Section::Vm)),
    );
    writeln!(
        m,
        "\n## {VM}\n\n\
         QEMU's emulated NVMe under software emulation (TCG, 2 vCPUs): an emulation ceiling, \
         not a hardware figure; only the ratios mean something. 4 KiB random reads, {} s per \
         run after 1 s of warm-up; QD is per drive per core for both (fio gets `iodepth = QD × \
         drives` per job and one job per core). Polled io_uring uses the nvme driver's poll \
         queues (`poll_queues=2`). With 2 cores, both vCPUs poll while QEMU emulates the \
         drives in a third thread: on a host with only 2 cores that oversubscribes it, so the \
         2-core rows measure the host more than the drivers.\n",
        args.seconds
    )?;
    if vm.exit_code != 0 {
        writeln!(
            m,
            "**The guest exited {} before every case had run; missing cases show as \"failed\".**\n",
            vm.exit_code
        )?;
    }
    if let Some(a) = vm.attach_12_s {
        writeln!(
            m,
            "Attach (bring-up + Identify) of 12 emulated controllers in the guest: {a:.2} s.\n"
        )?;
    }
    writeln!(
        m,
        "| drives | cores | QD | usnvme | fio io_uring | fio io_uring polled | usnvme ÷ io_uring | usnvme ÷ polled |\n|---:|---:|---:|---:|---:|---:|---:|---:|"
    )?;
    let mut keys: Vec<(u32, u32, u32)> = vm
        .cells
        .iter()
        .map(|(c, _)| (c.drives, c.cores, c.qd))
        .collect();
    keys.dedup();
    let k = |v: Option<f64>| v.map_or("failed".into(), |x| format!("{:.1} k", x / 1e3));
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.1} ×", a / b),
        _ => "–".into(),
    };
    for (drives, cores, qd) in keys {
        let get = |t| vm::lookup(vm, t, qd, cores, drives);
        let (u, f, p) = (
            get(Tool::Usnvme),
            get(Tool::FioIoUring),
            get(Tool::FioIoUringPolled),
        );
        writeln!(
            m,
            "| {drives} | {cores} | {qd} | {} | {} | {} | {} | {} |",
            k(u),
            k(f),
            k(p),
            ratio(u, f),
            ratio(u, p)
        )?;
    }
    writeln!(
        m,
        "\nFor reference (issue 7): SPDK's `spdk_nvme_perf` reached about 270 k IOPS at QD 32 on \
         one core and one drive in this test bed; the kernel path about 10 k.\n\n\
         The guest script (run by `cargo xtask bench` through `cargo xtask vm-run \
         --kernel-nvme 12`): {script}."
    )?;
    Ok(())
}

#[cfg(test)]
impl Companions {
    /// The companions of a report in a folder of its own under the temporary directory.
    fn for_test(name: &str) -> Companions {
        let dir = std::env::temp_dir().join(format!("usnvme-bench-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Companions::beside(&dir.join("BENCHMARKS.md"))
    }

    /// The file `name` as written.
    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(name)).unwrap_or_default()
    }

    /// Removes the report's folder.
    fn remove(self) {
        if let Some(report_dir) = self.dir.parent() {
            let _ = std::fs::remove_dir_all(report_dir);
        }
    }
}

#[cfg(test)]
impl Headlines {
    /// The headline table alone, under a made-up machine.
    fn table(&self) -> String {
        let p = Provenance {
            date: "2030-01-01 00:00 UTC".into(),
            machine: "M".into(),
            commit: "C".into(),
        };
        let mut m = String::new();
        self.render(&mut m, &p).expect("rendered");
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn args(flags: &[&str]) -> BenchArgs {
        Cli::parse_from(std::iter::once("bench").chain(flags.iter().copied())).bench
    }

    #[test]
    fn benchmarks_boot_multi_threaded_with_x2apic_unless_told_otherwise() {
        if std::env::var_os("USNVME_VM_TCG_THREADS").is_some() {
            return; // the user's choice stands (checked by the branch below when unset)
        }
        let args = bench_boot(vec!["/bin/true".into()]);
        assert_eq!(args.tcg_threads, crate::vm::qemu::TcgThreads::Multi);
        assert!(args.x2apic);
        // vm-test's boots keep the default: one thread
        let plain = crate::vm::run::RunArgs::for_program(vec!["/bin/true".into()]);
        assert_eq!(plain.tcg_threads, crate::vm::qemu::TcgThreads::Single);
    }

    #[test]
    fn anchors_are_the_ones_github_gives_headings() {
        assert_eq!(
            anchor(HOST),
            "cost-per-io-host-sim-null-backend-inline-mode"
        );
        assert_eq!(anchor(spdk::HEADING), "same-boot-as-spdks-spdk_nvme_perf");
        assert_eq!(
            anchor(fabric::HEADING),
            "fabric-nvmetcp-targets-and-initiators-one-boot-on-loopback"
        );
    }

    #[test]
    fn the_headline_table_gives_each_figure_its_value_command_and_section() {
        let mut h = Headlines::new(common_flags(&args(&["--quick", "--spdk", "/x"])));
        assert!(h
            .table()
            .ends_with("None: no section that gives one ran.\n\n"));
        h.add(
            HOST,
            "IOPS on one core",
            "10.33 M",
            code("usnvme perf -q 128"),
        );
        let rerun = h.rerun(Section::FabricNative);
        h.add(
            native::HEADING,
            "serve ÷ nvmf_tgt",
            "1.20 ×",
            format!("{rerun} (a | b)"),
        );
        let t = h.table();
        assert!(
            t.starts_with(
                "## Headline figures\n\nEvery figure below is from this one run: machine M, \
                 commit C, date 2030-01-01 00:00 UTC."
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "| Figure | Value | Command | Section |\n|---|---|---|---|\n\
                 | IOPS on one core | 10.33 M | `usnvme perf -q 128` | \
                 [Cost per I/O](#cost-per-io-host-sim-null-backend-inline-mode) |\n\
                 | serve ÷ nvmf_tgt | 1.20 × | `cargo xtask bench --only fabric-native --quick \
                 --spdk PATH` (a \\| b) | [NVMe/TCP natively](#nvmetcp-natively-serve-against-\
                 nvmf_tgt-perf-against-spdk_nvme_perf) |\n"
            ),
            "{t}"
        );
    }

    #[test]
    fn companions_go_into_a_folder_beside_the_report_and_are_linked_relatively() {
        let elsewhere = Companions::beside(Path::new("/tmp/x.md"));
        assert_eq!(elsewhere.dir, Path::new("/tmp/benchmarks"));
        assert_eq!(
            Companions::beside(Path::new("x.md")).dir,
            Path::new("benchmarks")
        );
        let c = Companions::for_test("companions");
        let link = c.file("vm.sh", "echo hello\n").expect("written");
        assert_eq!(link, "[benchmarks/vm.sh](benchmarks/vm.sh)");
        let report_dir = c.dir.parent().expect("the report's folder").to_path_buf();
        assert_eq!(
            std::fs::read_to_string(report_dir.join("benchmarks/vm.sh")).expect("the file"),
            "echo hello\n"
        );
        assert_eq!(
            c.path("scaling.svg").expect("a path"),
            report_dir.join("benchmarks/scaling.svg")
        );
        c.remove();
    }

    #[test]
    fn the_report_puts_the_headlines_first_and_the_vm_script_in_a_file() {
        let case = |tool, qd| vm::Case {
            tool,
            qd,
            cores: 1,
            drives: 1,
        };
        let vm = VmResults {
            cells: vec![
                (case(Tool::Usnvme, 32), Some(120_000.0)),
                (case(Tool::FioIoUring, 32), Some(10_000.0)),
                (case(Tool::FioIoUringPolled, 32), None),
            ],
            script: "echo the guest script\n".into(),
            ..Default::default()
        };
        let results = Results {
            host: None,
            vm: Some(vm),
            fabric: None,
            rdma: None,
            spdk: None,
            fio: None,
            native: None,
            scale: None,
        };
        let p = Provenance {
            date: "D".into(),
            machine: "M".into(),
            commit: "C".into(),
        };
        let c = Companions::for_test("report");
        let out = c.dir.parent().expect("a folder").join("BENCHMARKS.md");
        let m = report(&results, &args(&["--only", "vm", "--quick"]), &p, &out).expect("report");
        assert!(
            m.starts_with("# Benchmarks\n\nWritten by `cargo xtask bench --only vm --quick` on D."),
            "{m}"
        );
        assert!(
            m.contains(
                "| `usnvme perf` ÷ fio with io_uring on the kernel's nvme driver, IOPS, 4 KiB \
                 randread QD 32, 1 drive, 1 core (VM under TCG: only the ratio counts) | 12.00 × \
                 (120.0 k against 10.0 k IOPS) | `cargo xtask bench --only vm --quick` (guest \
                 script: [benchmarks/vm.sh](benchmarks/vm.sh)) | [VM side by side](#vm-side-by-\
                 side-one-boot-12-drives-on-the-kernels-nvme-12-on-vfio-pci) |"
            ),
            "{m}"
        );
        let (headlines, sections) = (m.find("## Headline figures"), m.find("## VM side by side"));
        assert!(
            headlines.expect("headlines") < sections.expect("the VM section"),
            "{m}"
        );
        assert!(
            m.contains(
                "The guest script (run by `cargo xtask bench` through `cargo xtask vm-run \
                 --kernel-nvme 12`): [benchmarks/vm.sh](benchmarks/vm.sh)."
            ),
            "{m}"
        );
        assert!(!m.contains("```sh"), "no script in the report: {m}");
        assert_eq!(c.read("vm.sh"), "echo the guest script\n");
        assert!(
            m.contains("## Scaling over cores (host, `sim` null drives)\n\nNot run (`--only`).")
        );
        assert!(
            !c.dir.join("scaling.svg").exists(),
            "only the sections that ran write"
        );
        c.remove();
    }
}

//! `cargo xtask bench`: the driver's, the engine's and `usnvme perf`'s cost per I/O on `sim`
//! (host), usnvme against the kernel's path side by side in one VM boot, `usnvme serve` against
//! the kernel's nvmet-tcp under the same NVMe/TCP initiator in another, and, given a
//! `spdk_nvme_perf` binary, against SPDK in a third; writes BENCHMARKS.md. Benchmarks report
//! figures; they never fail on one.

mod fabric;
mod fio;
mod host;
mod native;
mod scale;
mod spdk;
mod vm;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Result};

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
    /// 1, 2, 4, … cores against separate processes; serve on 1, 2, 4, 8 reactors).
    #[arg(long, value_enum, value_name = "SECTION")]
    only: Option<Section>,
    /// Fewer I/Os, a single VM case, shorter and fewer SPDK rounds: checks that everything runs.
    #[arg(long)]
    quick: bool,
    /// Seconds per VM run of the side by side with the kernel.
    #[arg(long, default_value_t = 4)]
    seconds: u32,
    /// Seconds per run of the fabric section (default 10; 3 with --quick).
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
    /// Where to write the report (default: BENCHMARKS.md in the workspace root).
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
            let rounds = if args.quick { 1 } else { 3 };
            Some(native::run(&usnvme, spdk, seconds, rounds)?)
        }
        _ => None,
    };
    let mut report = report(
        host.as_ref(),
        vm.as_ref(),
        fabric.as_ref(),
        spdk.as_ref(),
        &args,
    )?;
    fio::section(
        &mut report,
        fio.as_ref(),
        if args.no_vm { "`--no-vm`" } else { "`--only`" },
    )?;
    native::section(
        &mut report,
        native.as_ref(),
        if native_spdk.is_some() {
            "`--only`"
        } else {
            "no SPDK given"
        },
    )?;
    let out = args.out.unwrap_or_else(|| root.join("BENCHMARKS.md"));
    scale::section(
        &mut report,
        scale.as_ref(),
        &out.with_file_name("scaling.svg"),
        "`--only`",
    )?;
    std::fs::write(&out, report)?;
    println!("bench: wrote {}", out.display());
    Ok(())
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
    Ok(crate::vm::run::RunArgs::for_program(vec![
        "/bin/sh".into(),
        script.display().to_string(),
    ]))
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

fn report(
    host: Option<&HostResults>,
    vm: Option<&VmResults>,
    fabric: Option<&FabricResults>,
    spdk: Option<&SpdkResults>,
    args: &BenchArgs,
) -> Result<String> {
    let mut m = String::new();
    let dirty = if git(&["status", "--porcelain"]).is_empty() {
        ""
    } else {
        " (with uncommitted changes)"
    };
    let mut flags = String::new();
    if args.quick {
        flags.push_str(" --quick");
    }
    if args.no_vm {
        flags.push_str(" --no-vm");
    }
    if let Some(o) = args.only {
        flags.push_str(&format!(" --only {}", format!("{o:?}").to_lowercase()));
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
    writeln!(m, "# Benchmarks\n")?;
    writeln!(
        m,
        "Written by `cargo xtask bench{flags}` on {}.\n\n- Machine: {}\n- Commit: {}{dirty}\n- \
         Programs: `driver/examples/null_bench.rs`, `engine/examples/engine_bench.rs` and \
         `usnvme perf` (release build) on `sim`; `usnvme perf`, fio, `usnvme serve`, nvmet-tcp and \
         `spdk_nvme_perf` in the VM test bed.\n",
        git(&["log", "-1", "--format=%cd", "--date=iso"]),
        machine(),
        git(&["rev-parse", "--short", "HEAD"]),
    )?;
    match host {
        Some(h) => host_report(&mut m, h, args)?,
        None => writeln!(
            m,
            "## Cost per I/O (host, `sim` null backend, inline mode)\n\nNot run (`--only`).\n"
        )?,
    }
    match vm {
        Some(vm) => vm_section(&mut m, vm, args)?,
        None => writeln!(
            m,
            "\n## VM side by side (one boot: 12 drives on the kernel's nvme, 12 on vfio-pci)\n\n\
             Not run (`{}`).",
            if args.no_vm { "--no-vm" } else { "--only" }
        )?,
    }
    fabric::section(
        &mut m,
        fabric,
        if args.no_vm { "`--no-vm`" } else { "`--only`" },
    )?;
    if spdk.is_none() && args.spdk.is_some() {
        writeln!(
            m,
            "\n## Same boot as SPDK's spdk_nvme_perf\n\nNot run (`{}`).",
            if args.no_vm { "--no-vm" } else { "--only" }
        )?;
    } else {
        spdk::section(&mut m, spdk)?;
    }
    Ok(m)
}

fn host_report(m: &mut String, h: &HostResults, args: &BenchArgs) -> Result<()> {
    let rows = &h.rows;
    let row = |key: &str| rows.iter().find(|r| r.key == key);
    writeln!(
        m,
        "## Cost per I/O (host, `sim` null backend, inline mode)\n\n\
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

fn vm_section(m: &mut String, vm: &VmResults, args: &BenchArgs) -> Result<()> {
    writeln!(
        m,
        "\n## VM side by side (one boot: 12 drives on the kernel's nvme, 12 on vfio-pci)\n\n\
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
         --kernel-nvme 12`):\n\n```sh\n{}```",
        vm.script
    )?;
    Ok(())
}

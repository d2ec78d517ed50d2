//! `cargo xtask bench`: the driver's and the engine's cost per I/O on `sim` (host), and usnvme
//! against the kernel's path side by side in one VM boot; writes BENCHMARKS.md. Benchmarks
//! report figures; they never fail on one.

mod host;
mod vm;

use std::fmt::Write as _;
use std::process::Command;

use anyhow::Result;

use crate::cmd;
use host::{example, Split};
use vm::{Tool, VmResults};

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Skip the VM side-by-side comparison (host figures only).
    #[arg(long)]
    no_vm: bool,
    /// Fewer I/Os and a single VM case: checks that everything runs.
    #[arg(long)]
    quick: bool,
    /// Seconds per VM run.
    #[arg(long, default_value_t = 4)]
    seconds: u32,
    /// Where to write the report (default: BENCHMARKS.md in the workspace root).
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

/// One host benchmark: what ran and what it measured.
struct HostRow {
    label: String,
    command: String,
    iops: f64,
    split: Split,
    line: String,
}

pub fn run(args: BenchArgs) -> Result<()> {
    let root = crate::workspace_root();
    cmd::run(
        "bench: build (release)",
        Command::new("cargo")
            .args(["build", "--release", "-p", "usnvme-tools"])
            .args(["-p", "usnvme-driver", "--example", "null_bench"])
            .args(["-p", "usnvme-engine", "--example", "engine_bench"])
            .current_dir(&root),
        "fix the build errors above",
    )?;
    let (native_ios, callgrind_ios, runs) = if args.quick {
        (200_000u64, 20_000u64, 1)
    } else {
        (20_000_000, 100_000, 3)
    };
    let null_bench = example("null_bench");
    let engine_bench = example("engine_bench");
    let s = |v: &[&str]| -> Vec<String> { v.iter().map(|x| x.to_string()).collect() };

    // (label, program, arguments; `{ios}` stands for the I/O count)
    let cases = [
        (
            "driver, 1 drive, QD 128",
            "null_bench",
            s(&["1", "128", "{ios}"]),
        ),
        (
            "driver, 24 drives, QD 128 each",
            "null_bench",
            s(&["24", "128", "{ios}"]),
        ),
        (
            "engine, namespace, 1 drive, QD 128",
            "engine_bench",
            s(&["namespace", "1", "128", "{ios}", "0"]),
        ),
        (
            "engine, namespaces, 24 drives, QD 128 each",
            "engine_bench",
            s(&["namespace", "24", "128", "{ios}", "0"]),
        ),
        (
            "engine, stripe over 24 drives, QD 3072",
            "engine_bench",
            s(&["stripe", "24", "3072", "{ios}", "0"]),
        ),
    ];
    let mut rows = Vec::new();
    for (label, program, a) in &cases {
        println!("bench: {label}");
        let native_args = host::with_ios(a, native_ios);
        let native = host::native(&example(program), &native_args, runs)?;
        let split = host::callgrind(&example(program), a, callgrind_ios)?;
        rows.push(HostRow {
            label: label.to_string(),
            command: format!("{program} {}", native_args.join(" ")),
            iops: native.iops,
            split,
            line: native.line,
        });
    }
    let cycles = host::cycles(&null_bench, &s(&["1", "128", "{ios}"]), callgrind_ios * 10)?;
    let mut scale = Vec::new();
    for cores in ["0", "0-1"] {
        println!("bench: engine on 24 drives, cores {cores}");
        let a = s(&["namespace", "24", "128", &native_ios.to_string(), cores]);
        let native = host::native(&engine_bench, &a, runs)?;
        scale.push((cores, format!("engine_bench {}", a.join(" ")), native));
    }
    let vm = if args.no_vm {
        None
    } else {
        println!("bench: VM side by side (one boot, 12 drives on nvme, 12 on vfio-pci)");
        let usnvme = crate::target_dir().join("release/usnvme");
        Some(vm::side_by_side(&usnvme, args.quick, args.seconds)?)
    };
    let report = report(&rows, cycles, &scale, vm.as_ref(), &args)?;
    let out = args.out.unwrap_or_else(|| root.join("BENCHMARKS.md"));
    std::fs::write(&out, report)?;
    println!("bench: wrote {}", out.display());
    Ok(())
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
    rows: &[HostRow],
    cycles: Option<f64>,
    scale: &[(&str, String, host::Native)],
    vm: Option<&VmResults>,
    args: &BenchArgs,
) -> Result<String> {
    let mut m = String::new();
    let dirty = if git(&["status", "--porcelain"]).is_empty() {
        ""
    } else {
        " (with uncommitted changes)"
    };
    writeln!(m, "# Benchmarks\n")?;
    writeln!(
        m,
        "Written by `cargo xtask bench{}` on {}.\n\n- Machine: {}\n- Commit: {}{dirty}\n- \
         Programs: `driver/examples/null_bench.rs`, `engine/examples/engine_bench.rs` (release \
         build), `usnvme perf` and fio in the VM test bed.\n",
        if args.quick { " --quick" } else { "" },
        git(&["log", "-1", "--format=%cd", "--date=iso"]),
        machine(),
        git(&["rev-parse", "--short", "HEAD"]),
    )?;
    writeln!(
        m,
        "## Driver and engine cost per I/O (host, `sim` null backend, inline mode)\n\n\
         4 KiB random reads, one thread. The inline `sim` controller runs inside the doorbell \
         write, so its cost is counted apart: *instructions per I/O* come from `valgrind \
         --tool=callgrind` (two runs of N and 2N I/Os, difference divided by N, so set-up \
         cancels), split by inclusive cost into the simulated controller (its register writes) \
         and everything else; for null_bench, *driver* is the inclusive cost of \
         `QueuePair::read` + `QueuePair::poll` minus the controller. IOPS are the median of {} \
         native runs and include the simulated controller's work.\n",
        if args.quick { 1 } else { 3 }
    )?;
    writeln!(
        m,
        "| benchmark | IOPS (1 core) | instructions / I/O | driver | engine + block layer | sim controller | rest (loop) |\n|---|---:|---:|---:|---:|---:|---:|"
    )?;
    let driver_only = rows.first().and_then(|r| r.split.driver);
    let driver_with_loop = rows.first().map(|r| r.split.host_side());
    for r in rows {
        let (driver, engine, rest) = match r.split.driver {
            Some(d) => (
                format!("{d:.0}"),
                "–".to_string(),
                format!("{:.0}", r.split.host_side() - d),
            ),
            None => (
                "–".into(),
                // the engine row's host side minus the bare driver loop's
                driver_with_loop
                    .map(|d| format!("{:.0}", r.split.host_side() - d))
                    .unwrap_or_default(),
                "–".into(),
            ),
        };
        writeln!(
            m,
            "| {} | {} | {:.0} | {driver} | {engine} | {:.0} | {rest} |",
            r.label,
            millions(r.iops),
            r.split.total,
            r.split.sim
        )?;
    }
    writeln!(m)?;
    if let (Some(d), Some(first)) = (driver_only, rows.first()) {
        writeln!(
            m,
            "- Driver: **{d:.0} instructions per 4 KiB read** (submit + completion; goal ≤ 150).\n\
             - Driver + simulated controller on one core: **{}** IOPS (goal ≥ 15 M for the driver; \
             the simulated controller runs on the same core and costs {:.0} instructions per I/O, \
             {:.0} % of the total). At the same instructions per cycle, the driver alone would \
             run at about {} IOPS per core.",
            millions(first.iops),
            first.split.sim,
            100.0 * first.split.sim / first.split.total,
            millions(first.iops * first.split.total / d),
        )?;
        if let Some(engine) = rows.iter().find(|r| r.label.contains("namespace, 1 drive")) {
            let added = engine.split.host_side() - first.split.host_side();
            writeln!(
                m,
                "- The engine (channels, latency stamps, statistics, block layer) adds {added:.0} \
                 instructions per I/O to the bare driver loop: {:.0} % of the driver's cost \
                 (goal ≤ 30 %).",
                100.0 * added / d
            )?;
        }
    }
    match cycles {
        Some(c) => writeln!(m, "- Cycles per I/O (`perf stat`, driver + sim): {c:.0}.")?,
        None => writeln!(
            m,
            "- Cycles per I/O: not measured — `perf stat` has no cycle counter on this machine."
        )?,
    }
    let qp = rows.first().map(|r| {
        let n = host::Native {
            iops: 0.0,
            line: r.line.clone(),
        };
        (n.value("qp_dma_bytes"), n.value("qp_host_bytes"))
    });
    writeln!(m, "\nCommands (from `target/release/examples/`):\n")?;
    for r in rows {
        writeln!(m, "- `{}` → `{}`", r.command, r.line)?;
    }
    writeln!(m, "\n## Scale\n")?;
    writeln!(
        m,
        "| engine on 24 `sim` null drives, QD 128 each | IOPS |\n|---|---:|"
    )?;
    for (cores, command, n) in scale {
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
    if let Some(a) = scale.first().and_then(|(_, _, n)| n.value("attach_ms")) {
        writeln!(
            m,
            "- Attach of 24 `sim` controllers (in parallel): {a:.1} ms."
        )?;
    }
    if let Some(vm) = vm {
        vm_section(&mut m, vm, args)?;
    }
    Ok(m)
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

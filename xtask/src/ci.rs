//! `cargo xtask ci` (what CI runs) and `cargo xtask demo` (the README's main job).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::apt;
use crate::cmd::{self, sh_quote};
use crate::vm::run::{self, RunArgs};

/// fmt, clippy with warnings denied, the workspace tests, fio-plot on `perf --json`, a short
/// fuzzing run, then the VM tests.
pub fn run() -> Result<()> {
    let root = crate::workspace_root();
    let started = Instant::now();
    // what cargo needs besides Rust (the `rdma` feature's libclang, verbs and rdma_cm headers)
    crate::vm::setup::install_build_packages()?;
    let steps: [(&str, &[&str], &str); 3] = [
        (
            "ci: cargo fmt --check",
            &["fmt", "--all", "--", "--check"],
            "run `cargo fmt --all`",
        ),
        (
            "ci: cargo clippy",
            &[
                "clippy",
                "--workspace",
                "--all-targets",
                crate::FEATURES[0],
                crate::FEATURES[1],
                "--",
                "-D",
                "warnings",
            ],
            "fix the clippy findings above",
        ),
        (
            "ci: cargo test",
            &[
                "test",
                "--workspace",
                crate::FEATURES[0],
                crate::FEATURES[1],
            ],
            "fix the failing tests above",
        ),
    ];
    for (step, args, fix) in steps {
        let t = Instant::now();
        eprintln!("{step}");
        cmd::run(
            step,
            Command::new("cargo").args(args).current_dir(&root),
            fix,
        )?;
        eprintln!("{step}: ok in {:.0} s", t.elapsed().as_secs_f64());
    }
    fio_plot_check()?;
    fio_engine_step(&root)?;
    fuzz_step(&root)?;
    let t = Instant::now();
    eprintln!("ci: cargo xtask vm-test");
    crate::vm::test::run(crate::vm::test::VmTestArgs {
        filter: None,
        guest_only: false,
        harness_only: false,
    })?;
    eprintln!("ci: vm-test ok in {:.0} s", t.elapsed().as_secs_f64());
    eprintln!("ci: all green in {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// `ci: the fio engine`: builds it for the installed fio (and one for a fio that does not exist,
/// which must be refused), then runs the fio suites that need no VM (`tests/tests/fio_sim.rs`,
/// against `usnvme serve` for the remote jobs).
fn fio_engine_step(root: &Path) -> Result<()> {
    let step = "ci: the fio engine on sim drives";
    let t = Instant::now();
    eprintln!("{step}");
    let engine = crate::fio_engine::build(&Default::default())?;
    let other = crate::target_dir().join("fio/other-version/libusnvme_fio.so");
    crate::fio_engine::compile(&engine.source, "fio-0.0-not-installed", &other)?;
    // the engine for the installed fio again: the variant left its own build behind
    let engine = crate::fio_engine::build(&Default::default())?;
    cmd::run(
        step,
        Command::new("cargo")
            .args(["test", "-p", "usnvme-tests", "--test", "fio_sim"])
            .args(crate::FEATURES)
            .args(["--", "--ignored"])
            .env("USNVME_FIO_ENGINE", &engine.library)
            // built by the fio-plot step: the remote subsystem's target
            .env("USNVME_BIN", crate::target_dir().join("debug/usnvme"))
            .env("USNVME_FIO_ENGINE_OTHER_VERSION", &other)
            .current_dir(root),
        "fix the failing tests above (tools/fio)",
    )?;
    eprintln!("{step}: ok in {:.0} s", t.elapsed().as_secs_f64());
    Ok(())
}

/// fio-plot and its direct dependencies, at the versions this check was written against.
const FIO_PLOT_PINS: [&str; 7] = [
    "fio-plot==1.1.21",
    "matplotlib==3.11.2",
    "numpy==2.4.6",
    "Pillow==13.0.0",
    "pyan3==2.9.0",
    "pyparsing==3.3.3",
    "rich==15.0.0",
];

/// Debian's Python: the one `apt-get install python3-venv` gives `venv`.
const PYTHON: &str = "/usr/bin/python3";

/// `ci: fio-plot reads perf --json`: `usnvme perf --json` on sim drives, charted by fio-plot (the
/// tool fio results are usually charted with), in its I/O-and-latency bar mode (`-l`) and its
/// latency histogram mode (`-H`); each must write a PNG. Also `cargo xtask fio-plot-check`.
pub fn fio_plot_check() -> Result<()> {
    let step = "ci: fio-plot reads perf --json";
    let t = Instant::now();
    eprintln!("{step}");
    let fio_plot = fio_plot_venv()?;
    let root = crate::workspace_root();
    cmd::run(
        "ci: fio-plot: build usnvme",
        Command::new("cargo")
            .args(["build", "-p", "usnvme-tools"])
            .args(crate::FEATURES)
            .current_dir(&root),
        "fix the build errors above",
    )?;
    let usnvme = crate::target_dir().join("debug/usnvme");
    let dir = crate::target_dir().join("fio-plot-check");
    let _ = std::fs::remove_dir_all(&dir);
    // fio-plot reads every .json of a folder: the perf file alone goes in `json/`
    let json_dir = dir.join("json");
    std::fs::create_dir_all(&json_dir)
        .with_context(|| format!("{step}: cannot create {}", json_dir.display()))?;
    let perf_json = dir.join("perf.json");
    cmd::run(
        "ci: fio-plot: usnvme perf --json",
        Command::new(&usnvme)
            // -L: percentiles and the latency histogram behind fio's latency distribution
            .args(["perf", "-r", "sim:0-1", "-t", "3", "-L", "--json"])
            .arg(&perf_json)
            .current_dir(&root),
        "fix `usnvme perf` (tools/src/cli/perf)",
    )?;
    let text = std::fs::read_to_string(&perf_json)
        .with_context(|| format!("{step}: cannot read {}", perf_json.display()))?;
    let doc: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{step}: {} is not JSON", perf_json.display()))?;
    // What fio-plot selects files by: the pattern, the queue depth and the job count.
    let option = |key: &str| -> Result<String> {
        match doc["global options"][key].as_str() {
            Some(v) => Ok(v.to_string()),
            None => bail!(
                "{step}: {} has no fio `global options`.{key}. Fix: tools/src/cli/perf/report.rs",
                perf_json.display()
            ),
        }
    };
    let (rw, iodepth, numjobs) = (option("rw")?, option("iodepth")?, option("numjobs")?);
    // fio-plot's file naming (as its bench-fio writes them)
    let name = format!("{rw}-iodepth-{iodepth}-numjobs-{numjobs}.json");
    std::fs::copy(&perf_json, json_dir.join(&name))
        .with_context(|| format!("{step}: cannot copy {}", perf_json.display()))?;
    let mut charts = Vec::new();
    for (mode, file) in [("-l", "iops-latency.png"), ("-H", "latency-histogram.png")] {
        let png = dir.join(file);
        cmd::run(
            &format!("{step}: fio-plot {mode}"),
            Command::new(&fio_plot)
                .arg("-i")
                .arg(&json_dir)
                .args(["-T", "usnvme perf sim:0-1", mode, "-d", &iodepth])
                .args(["-n", &numjobs, "-r", &rw, "-o"])
                .arg(&png)
                // no display: draw to files
                .env("MPLBACKEND", "Agg"),
            "fio-plot did not take `usnvme perf --json` as fio JSON (its messages are above): fix tools/src/cli/perf/report.rs",
        )?;
        let head = std::fs::read(&png).unwrap_or_default();
        if !head.starts_with(b"\x89PNG") {
            bail!(
                "{step}: fio-plot {mode} wrote no image at {}: it did not chart `usnvme perf --json` (its messages are above). Fix: tools/src/cli/perf/report.rs",
                png.display()
            );
        }
        charts.push(png);
    }
    eprintln!(
        "{step}: ok in {:.0} s: {}",
        t.elapsed().as_secs_f64(),
        charts
            .iter()
            .map(|c| c.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

/// The fio-plot command of a virtualenv under target/, made once (again when the pins change).
fn fio_plot_venv() -> Result<PathBuf> {
    let venv = crate::target_dir().join("fio-plot-venv");
    let fio_plot = venv.join("bin/fio-plot");
    let stamp = venv.join("usnvme-pins.txt");
    let pins = FIO_PLOT_PINS.join("\n");
    if fio_plot.exists() && std::fs::read_to_string(&stamp).ok().as_deref() == Some(&pins) {
        return Ok(fio_plot);
    }
    python_venv()?;
    cmd::run(
        "ci: fio-plot: create the virtualenv",
        Command::new(PYTHON)
            .args(["-m", "venv", "--clear"])
            .arg(&venv),
        "apt-get install python3-venv",
    )?;
    cmd::run(
        "ci: fio-plot: pip install",
        Command::new(venv.join("bin/pip"))
            .args(["install", "-q", "--disable-pip-version-check"])
            .args(FIO_PLOT_PINS),
        "check that PyPI is reachable (pip's messages are above)",
    )?;
    std::fs::write(&stamp, pins).with_context(|| format!("cannot write {}", stamp.display()))?;
    Ok(fio_plot)
}

/// Debian's python3 with `venv` (Debian ships `ensurepip`, which `venv` needs, in python3-venv):
/// installed with apt when missing.
fn python_venv() -> Result<()> {
    let has_venv = || {
        Path::new(PYTHON).exists()
            && Command::new(PYTHON)
                .args(["-c", "import ensurepip, venv"])
                .output()
                .is_ok_and(|o| o.status.success())
    };
    if has_venv() {
        return Ok(());
    }
    eprintln!("ci: fio-plot: installing python3-venv");
    apt::install("ci: fio-plot", &["python3", "python3-venv"], None)?;
    if !has_venv() {
        bail!("ci: fio-plot: {PYTHON} still has no venv after installing python3-venv. Fix: apt-get install --reinstall python3-venv");
    }
    Ok(())
}

/// Seconds of fuzzing per target in CI.
const CI_FUZZ_SECONDS: u64 = 20;

/// The fuzzing entry points (`--features fuzzing`): clippy, their unit tests on handcrafted
/// inputs, then a short libFuzzer run of every target.
fn fuzz_step(root: &std::path::Path) -> Result<()> {
    let t = Instant::now();
    eprintln!("ci: fuzzing: entry points, then {CI_FUZZ_SECONDS} s per target");
    let driver = ["-p", "usnvme-driver", "--features", "fuzzing"];
    cmd::run(
        "ci: clippy --features fuzzing",
        Command::new("cargo")
            .arg("clippy")
            .args(driver)
            .args(["--all-targets", "--", "-D", "warnings"])
            .current_dir(root),
        "fix the clippy findings above",
    )?;
    cmd::run(
        "ci: fuzzing entry point tests",
        Command::new("cargo")
            .arg("test")
            .args(driver)
            .args(["--lib", "fuzzing"])
            .current_dir(root),
        "fix the failing tests above",
    )?;
    crate::fuzz::run(&crate::fuzz::FuzzArgs {
        seconds: CI_FUZZ_SECONDS,
        targets: Vec::new(),
    })?;
    eprintln!("ci: fuzzing ok in {:.0} s", t.elapsed().as_secs_f64());
    Ok(())
}

/// The README's main job: boots the test bed with 24 drives, lists them, runs `usnvme perf`
/// 4 KiB random read on all of them from the engine's default placement, then a short sweep,
/// and says where the JSON, CSV and SVG files are.
/// The demo perf's warm-up: the first run after the guest boots meets the emulator's start-up
/// (each drive's first I/Os); with 1 s, drives' worst latencies still climbed with their place
/// on the core, 81 ms to 273 ms; after 3 s every drive of a core shows the same one-off stall.
const DEMO_WARMUP_S: u32 = 3;

pub fn demo() -> Result<ExitCode> {
    let root = crate::workspace_root();
    cmd::run(
        "demo: build usnvme (release)",
        Command::new("cargo")
            .args(["build", "--release", "-p", "usnvme-tools"])
            .args(crate::FEATURES)
            .current_dir(&root),
        "fix the build errors above",
    )?;
    let usnvme = sh_quote(
        &crate::target_dir()
            .join("release/usnvme")
            .display()
            .to_string(),
    );
    // on the work share: the guest writes there, the host reads it afterwards
    let out = crate::vm::vm_dir().join("work/demo");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out)?;
    let o = sh_quote(&out.display().to_string());
    let script = format!(
        "set -e\n\
         {usnvme} list\n\
         echo; echo '== usnvme perf: 4 KiB random read, QD 32, every drive, 10 s after a {DEMO_WARMUP_S} s warm-up'\n\
         {usnvme} perf -q 32 -o 4k -w randread -t 10 -a {DEMO_WARMUP_S} -L --json {o}/perf.json\n\
         echo; echo '== usnvme sweep: 4K-1M x read, write, randread, randwrite, QD 4, 2 s a point'\n\
         {usnvme} sweep -q 4 -t 2 --sizes 4k,16k,64k,256k,1m --out {o}\n"
    );
    // two NUMA nodes, a drive's queue pairs on its own node's core: the engine's placement
    let args = RunArgs {
        numa_nodes: 2,
        ..RunArgs::for_program(vec!["/bin/sh".into(), "-c".into(), script])
    };
    let exit_code = run::run(&args)?;
    if exit_code == 0 {
        println!("\ndemo: results in {}:", out.display());
        for f in [
            "perf.json",
            "sweep.csv",
            "sweep.json",
            "bandwidth.svg",
            "iops.svg",
        ] {
            println!("  {}", out.join(f).display());
        }
        println!("(throughput inside the emulator is an emulation ceiling, not a hardware figure)");
    }
    Ok(ExitCode::from(exit_code))
}

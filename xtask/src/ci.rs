//! `cargo xtask ci` (what CI runs) and `cargo xtask demo` (the README's main job).

use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::Result;

use crate::cmd::{self, sh_quote};
use crate::vm::run::{self, RunArgs};

/// fmt, clippy with warnings denied, the workspace tests, a short fuzzing run, then the VM tests.
pub fn run() -> Result<()> {
    let root = crate::workspace_root();
    let started = Instant::now();
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
                "--",
                "-D",
                "warnings",
            ],
            "fix the clippy findings above",
        ),
        (
            "ci: cargo test",
            &["test", "--workspace"],
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
pub fn demo() -> Result<ExitCode> {
    let root = crate::workspace_root();
    cmd::run(
        "demo: build usnvme (release)",
        Command::new("cargo")
            .args(["build", "--release", "-p", "usnvme-tools"])
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
         echo; echo '== usnvme perf: 4 KiB random read, QD 32, every drive, 10 s'\n\
         {usnvme} perf -q 32 -o 4k -w randread -t 10 -a 1 -L --json {o}/perf.json\n\
         echo; echo '== usnvme sweep: 4K-1M x read, write, randread, randwrite, QD 4, 2 s a point'\n\
         {usnvme} sweep -q 4 -t 2 --sizes 4k,16k,64k,256k,1m --out {o}\n"
    );
    let args = RunArgs::for_program(vec!["/bin/sh".into(), "-c".into(), script]);
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

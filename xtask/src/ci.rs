//! `cargo xtask ci` (what CI runs) and `cargo xtask demo` (the README's main job).

use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::Result;

use crate::cmd;
use crate::vm::run::{self, RunArgs};

/// fmt, clippy with warnings denied, the workspace tests, then the VM tests.
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

/// Boots the test bed with 24 drives and runs `usnvme` on all of them.
pub fn demo() -> Result<ExitCode> {
    let root = crate::workspace_root();
    cmd::run(
        "demo: build usnvme (release)",
        Command::new("cargo")
            .args(["build", "--release", "-p", "usnvme-tools"])
            .current_dir(&root),
        "fix the build errors above",
    )?;
    let usnvme = crate::target_dir().join("release/usnvme");
    let args = RunArgs::for_program(vec![usnvme.display().to_string(), "list".into()]);
    let exit_code = run::run(&args)?;
    Ok(ExitCode::from(exit_code))
}

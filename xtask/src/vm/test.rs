//! `cargo xtask vm-test`: the harness's own tests (host side, one boot each), then every VM test
//! suite of the `usnvme-tests` crate in one boot on 24 file-backed drives.
//!
//! VM tests are `#[ignore = "VM: ..."]` tests: `cargo test` on the host skips them, the guest runs
//! them with `--ignored`, one at a time (they share the drives).

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Result};
use clap::Args;

use super::qemu::Backend;
use super::run::{self, RunArgs};
use super::{setup, vm_dir};
use crate::cmd::{self, sh_quote};

#[derive(Args, Debug)]
pub struct VmTestArgs {
    /// Run only tests whose name contains this.
    pub filter: Option<String>,
    /// Only the guest suites (skip the harness's own boots).
    #[arg(long)]
    pub guest_only: bool,
    /// Only the harness's own tests.
    #[arg(long, conflicts_with = "guest_only")]
    pub harness_only: bool,
}

/// The guest suites' drives: 24, file-backed, 512 B and 4 KiB logical blocks alternating.
pub const SUITE_DRIVES: usize = 24;

pub fn run(args: VmTestArgs) -> Result<()> {
    setup::ensure()?;
    let root = crate::workspace_root();
    cmd::run(
        "vm-test: build the programs the VM runs",
        Command::new("cargo")
            .args([
                "build",
                "-p",
                "usnvme-tools",
                "-p",
                "usnvme-tests",
                "--bins",
            ])
            .current_dir(&root),
        "fix the build errors above",
    )?;
    if !args.guest_only {
        eprintln!("vm-test: the harness's own tests (one boot each)");
        let mut c = Command::new("cargo");
        c.args([
            "test",
            "-p",
            "xtask",
            "--test",
            "vm_run",
            "--",
            "--ignored",
            "--test-threads=1",
        ]);
        if let Some(f) = &args.filter {
            c.arg(f);
        }
        cmd::run(
            "vm-test: harness tests",
            c.current_dir(&root),
            "see the failing test's output above",
        )?;
    }
    if !args.harness_only {
        guest_suites(args.filter.as_deref())?;
    }
    Ok(())
}

fn guest_suites(filter: Option<&str>) -> Result<()> {
    let root = crate::workspace_root();
    let json = cmd::output(
        "vm-test: build the VM test suites",
        Command::new("cargo")
            .args([
                "test",
                "-p",
                "usnvme-tests",
                "--no-run",
                "--message-format=json",
            ])
            .current_dir(&root),
        "fix the build errors (run `cargo test -p usnvme-tests --no-run` to see them)",
    )?;
    let suites = test_executables(&json);
    if suites.is_empty() {
        bail!("vm-test: cargo built no test executables for usnvme-tests");
    }
    let work = vm_dir().join("work");
    std::fs::create_dir_all(&work)?;
    let script = work.join("vm-test-suites.sh");
    let mut s = String::from("# written by cargo xtask vm-test\nfailed=0; passed=0\n");
    for exe in &suites {
        let name = exe
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut line = format!(
            "{} --ignored --test-threads=1",
            sh_quote(&exe.display().to_string())
        );
        if let Some(f) = filter {
            line += &format!(" {}", sh_quote(f));
        }
        s += &format!("echo \"=== {name}\"\nif {line}; then passed=$((passed+1)); else failed=$((failed+1)); fi\n");
    }
    s += "echo \"vm-test: suites: $passed passed, $failed failed\"\n[ $failed = 0 ]\n";
    std::fs::write(&script, s)?;

    let disk_dir = vm_dir().join("test-disks");
    let _ = std::fs::remove_dir_all(&disk_dir);
    let usnvme = crate::target_dir().join("debug/usnvme");
    let args = RunArgs {
        drives: SUITE_DRIVES,
        backend: Backend::File,
        disk_size: 1 << 30,
        logical_block_size: vec![512, 4096],
        kernel_nvme: None,
        nvme_opts: None,
        numa_nodes: 1,
        hugepages: 1 << 30,
        cpus: 2,
        mem: 4 << 30,
        timeout: 1800,
        qmp: None,
        allow_dma_faults: false,
        keep_disks: true,
        disk_dir: Some(disk_dir.clone()),
        env: vec![
            format!("USNVME_BIN={}", usnvme.display()),
            format!("USNVME_VM_DISK_DIR={}", disk_dir.display()),
        ],
        program: vec!["/bin/sh".into(), script.display().to_string()],
    };
    eprintln!(
        "vm-test: {} suite(s) in one boot on {SUITE_DRIVES} drives",
        suites.len()
    );
    let exit_code = run::run(&args)?;
    if exit_code != 0 {
        bail!(
            "vm-test: the VM test suites failed (vm-run exit code {})",
            exit_code
        );
    }
    eprintln!(
        "vm-test: all VM test suites passed; images kept in {}",
        disk_dir.display()
    );
    Ok(())
}

/// Test executables from `cargo test --no-run --message-format=json`.
fn test_executables(json: &str) -> Vec<PathBuf> {
    json.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        // integration-test targets only: the lib and bin unit tests of usnvme-tests run on the host
        .filter(|v| v["reason"] == "compiler-artifact" && v["profile"]["test"] == true)
        .filter(|v| {
            v["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "test"))
        })
        .filter_map(|v| v["executable"].as_str().map(PathBuf::from))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::test_executables;

    #[test]
    fn picks_test_executables_from_cargo_json() {
        let json = r#"{"reason":"compiler-artifact","target":{"kind":["test"]},"profile":{"test":true},"executable":"/t/debug/deps/vm_list-1"}
{"reason":"compiler-artifact","target":{"kind":["lib"]},"profile":{"test":true},"executable":"/t/debug/deps/usnvme_tests-1"}
{"reason":"compiler-artifact","target":{"kind":["bin"]},"profile":{"test":false},"executable":"/t/debug/usnvme"}
{"reason":"compiler-artifact","target":{"kind":["test"]},"profile":{"test":true},"executable":null}
{"reason":"build-finished","success":true}"#;
        let exes = test_executables(json);
        assert_eq!(exes.len(), 1);
        assert!(exes[0].ends_with("vm_list-1"));
    }
}

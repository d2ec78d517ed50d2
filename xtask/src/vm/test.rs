//! `cargo xtask vm-test`: the harness's own tests (host side, one boot each), then every VM test
//! suite of the `usnvme-tests` crate in one boot on 24 file-backed drives.
//!
//! VM tests are `#[ignore = "VM: ..."]` tests: `cargo test` on the host skips them, the guest runs
//! them with `--ignored`, one at a time (they share the drives).

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
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

/// Packages whose `#[ignore = "VM: ..."]` tests (integration and unit) run in the guest.
const SUITE_PACKAGES: &[&str] = &[
    "usnvme-hugepages",
    "usnvme-driver",
    "usnvme-engine",
    "usnvme-tests",
];

/// The guest suites' drives: 24, file-backed, on two NUMA nodes: 0-11 on node 0 with 512 B
/// blocks, 12-23 on node 1 with 4 KiB.
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
            .args(["test", "--no-run", "--message-format=json"])
            .args(SUITE_PACKAGES.iter().flat_map(|p| ["-p", p]))
            .current_dir(&root),
        "fix the build errors (run `cargo test -p usnvme-tests --no-run` to see them)",
    )?;
    let mut suites = test_executables(&json);
    if suites.is_empty() {
        bail!("vm-test: cargo built no test executables for usnvme-tests");
    }
    // A fixed order, and the suites whose writes the host checks in the images afterwards
    // last: other suites (perf --verify, the engine) write all over the drives.
    suites.sort_by_key(|p| {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        (
            CHECKED_ON_HOST
                .iter()
                .any(|s| name.starts_with(&format!("{s}-"))),
            name,
        )
    });
    // A filter naming a suite (e.g. `vm_driver`) runs that whole suite; else it filters tests.
    let suite_name = |p: &PathBuf| {
        p.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let mut filter = filter;
    if let Some(f) = filter {
        if suites
            .iter()
            .any(|s| suite_name(s).starts_with(&format!("{f}-")))
        {
            suites.retain(|s| suite_name(s).starts_with(&format!("{f}-")));
            filter = None;
        }
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
            "{} --ignored --test-threads=1 --color never",
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
    let expectations = work.join(EXPECTATIONS);
    let _ = std::fs::remove_file(&expectations);
    let usnvme = crate::target_dir().join("debug/usnvme");
    let args = RunArgs {
        backend: Backend::File,
        numa_nodes: 2,
        logical_block_size: vec![512, 4096],
        timeout: 1800,
        keep_disks: true,
        disk_dir: Some(disk_dir.clone()),
        env: vec![
            format!("USNVME_BIN={}", usnvme.display()),
            format!("USNVME_VM_DISK_DIR={}", disk_dir.display()),
        ],
        ..RunArgs::for_program(vec!["/bin/sh".into(), script.display().to_string()])
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
    let checked = check_images(&expectations, &disk_dir)?;
    eprintln!(
        "vm-test: all VM test suites passed; {checked} writes found intact in the image files on the host ({})",
        disk_dir.display()
    );
    Ok(())
}

/// Suites that record writes for the host to check (`usnvme_tests::expect_on_host`).
const CHECKED_ON_HOST: &[&str] = &["vm_driver"];

/// Written by the guest tests (`usnvme_tests::expect_on_host`): `IMAGE OFFSET LEN FNV1A64` per line.
const EXPECTATIONS: &str = "expect-images.txt";

/// Checks, on the host, that each write a guest test recorded is in the drive's image file.
fn check_images(expectations: &Path, disk_dir: &Path) -> Result<usize> {
    let Ok(text) = std::fs::read_to_string(expectations) else {
        return Ok(0);
    };
    let mut checked = 0;
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let parsed = match f.as_slice() {
            [image, offset, len, hash] => offset
                .parse::<u64>()
                .ok()
                .zip(len.parse::<usize>().ok())
                .zip(u64::from_str_radix(hash, 16).ok())
                .map(|((o, l), h)| (*image, o, l, h)),
            _ => None,
        };
        let Some((image, offset, len, hash)) = parsed else {
            bail!(
                "vm-test: malformed expectation line {line:?} in {}",
                expectations.display()
            );
        };
        let path = disk_dir.join(image);
        let mut data = vec![0u8; len];
        let mut file = std::fs::File::open(&path)
            .with_context(|| format!("vm-test: opening {}", path.display()))?;
        file.seek(SeekFrom::Start(offset))?;
        file.read_exact(&mut data)
            .with_context(|| format!("vm-test: reading {} at {offset}", path.display()))?;
        if fnv1a64(&data) != hash {
            bail!(
                "vm-test: {image}: the {len} bytes at offset {offset} are not what the guest wrote"
            );
        }
        checked += 1;
    }
    Ok(checked)
}

/// FNV-1a 64, as `usnvme_tests::fnv1a64` computes it in the guest.
fn fnv1a64(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Test executables from `cargo test --no-run --message-format=json`.
fn test_executables(json: &str) -> Vec<PathBuf> {
    json.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        // integration tests and library unit tests (bins hold no VM tests)
        .filter(|v| v["reason"] == "compiler-artifact" && v["profile"]["test"] == true)
        .filter(|v| {
            let kinds = v["target"]["kind"].as_array();
            kinds.is_some_and(|k| k.iter().any(|k| k == "test" || k == "lib"))
        })
        .filter_map(|v| v["executable"].as_str().map(PathBuf::from))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::test_executables;

    #[test]
    fn finds_what_the_guest_wrote_in_the_image_and_refuses_anything_else() {
        let dir = std::env::temp_dir().join(format!("usnvme-images-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut image = vec![0u8; 8192];
        image[4096..4100].copy_from_slice(b"data");
        std::fs::write(dir.join("nvme3.img"), &image).unwrap();
        let exp = dir.join("expect.txt");
        std::fs::write(
            &exp,
            format!("nvme3.img 4096 4 {:016x}\n", super::fnv1a64(b"data")),
        )
        .unwrap();
        assert_eq!(super::check_images(&exp, &dir).unwrap(), 1);
        std::fs::write(
            &exp,
            format!("nvme3.img 0 4 {:016x}\n", super::fnv1a64(b"data")),
        )
        .unwrap();
        assert!(super::check_images(&exp, &dir).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn picks_test_executables_from_cargo_json() {
        let json = r#"{"reason":"compiler-artifact","target":{"kind":["test"]},"profile":{"test":true},"executable":"/t/debug/deps/vm_list-1"}
{"reason":"compiler-artifact","target":{"kind":["lib"]},"profile":{"test":true},"executable":"/t/debug/deps/usnvme_hugepages-1"}
{"reason":"compiler-artifact","target":{"kind":["bin"]},"profile":{"test":false},"executable":"/t/debug/usnvme"}
{"reason":"compiler-artifact","target":{"kind":["test"]},"profile":{"test":true},"executable":null}
{"reason":"build-finished","success":true}"#;
        let exes = test_executables(json);
        assert_eq!(exes.len(), 2);
        assert!(exes[0].ends_with("vm_list-1"));
        assert!(exes[1].ends_with("usnvme_hugepages-1"));
    }
}

//! Helpers shared by the cross-crate and VM test suites.
//!
//! VM tests are marked `#[ignore = "VM: ..."]`: plain `cargo test` skips them, and
//! `cargo xtask vm-test` runs them with `--ignored` inside the test-bed guest, where the
//! environment describes the drives (`USNVME_VM_*`, set by `cargo xtask vm-run`).

use std::path::PathBuf;

/// The test bed as `cargo xtask vm-run` describes it to the guest.
#[derive(Debug, Clone)]
pub struct VmBed {
    pub drives: usize,
    pub kernel_drives: usize,
    pub numa_nodes: usize,
    pub logical_block_sizes: Vec<u32>,
    /// The `usnvme` binary built for the run.
    pub usnvme: PathBuf,
}

impl VmBed {
    /// Reads the environment; panics (failing the test) outside the test bed.
    pub fn from_env() -> VmBed {
        let var = |k: &str| {
            std::env::var(k).unwrap_or_else(|_| {
                panic!("{k} is not set: run VM tests with `cargo xtask vm-test`")
            })
        };
        let num = |k: &str| {
            var(k)
                .parse::<usize>()
                .unwrap_or_else(|_| panic!("{k} is not a number"))
        };
        VmBed {
            drives: num("USNVME_VM_DRIVES"),
            kernel_drives: num("USNVME_VM_KERNEL_DRIVES"),
            numa_nodes: num("USNVME_VM_NUMA_NODES"),
            logical_block_sizes: var("USNVME_VM_LOGICAL_BLOCK_SIZES")
                .split(',')
                .map(|s| s.parse().unwrap_or_else(|_| panic!("bad block size {s}")))
                .collect(),
            usnvme: PathBuf::from(var("USNVME_BIN")),
        }
    }

    /// Runs `usnvme ARGS` and returns its output.
    pub fn usnvme(&self, args: &[&str]) -> std::process::Output {
        std::process::Command::new(&self.usnvme)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.usnvme.display()))
    }
}

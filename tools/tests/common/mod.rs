//! Helpers shared by the tests that run the `usnvme` binary on a fake sysfs tree.

use std::path::Path;
use std::process::{Command, Output};

/// Runs `usnvme args` with `root` as its sysfs/procfs root.
pub fn usnvme(root: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_usnvme"))
        .args(args)
        .env("USNVME_SYSFS_ROOT", root)
        .env_remove("RUST_LOG")
        .output()
        .expect("run usnvme")
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

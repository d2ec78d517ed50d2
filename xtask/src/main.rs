//! `cargo xtask`: the VM test bed, the test suites, CI, benchmarks and the demo.

mod apt;
mod bench;
mod ci;
mod cmd;
mod fio_engine;
mod fuzz;
mod vm;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::OnceLock;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "usnvme's build, test and VM tasks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install QEMU, busybox and fio, fetch the guest kernel and build the initramfs (idempotent;
    /// never removes or downgrades a package).
    VmSetup(vm::setup::SetupArgs),
    /// vm-setup on a fresh Debian 12 chroot holding backports' qemu-utils: QEMU installed once,
    /// nothing removed (root; downloads about 150 MB).
    VmSetupCheck,
    /// Boot the test-bed guest, run PROGRAM in it on drives bound to vfio-pci, exit with its exit code.
    VmRun(Box<vm::run::RunArgs>),
    /// Build the VM test suites and run them all in one boot, plus the harness's own tests.
    VmTest(vm::test::VmTestArgs),
    /// The main job: the test bed with 24 emulated drives and `usnvme` on all of them.
    Demo,
    /// Benchmarks: cost per I/O on sim (driver, engine, usnvme perf), usnvme vs the kernel and vs spdk_nvme_perf (--spdk) in the VM; writes BENCHMARKS.md.
    Bench(bench::BenchArgs),
    /// Everything CI checks: fmt, clippy, the workspace tests, the VM tests.
    Ci,
    /// Run the cargo-fuzz targets of driver/fuzz (installs cargo-fuzz if missing).
    Fuzz(fuzz::FuzzArgs),
    /// Build usnvme's fio ioengine (target/fio/libusnvme_fio.so) against the installed fio's own version (fetches its source).
    FioEngine(fio_engine::FioEngineArgs),
    /// CI's fio-plot step alone: fio-plot (cached venv) must chart a sim run's `perf --json`.
    FioPlotCheck,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // (host packages alone need no tree: vm-setup-check runs that in a chroot)
    let packages_only = matches!(&cli.command, Command::VmSetup(a) if a.packages_only);
    if find_workspace().is_none() && !packages_only {
        eprintln!(
            "xtask: error: cannot find the usnvme workspace (a Cargo.toml with [workspace] and \
             xtask/Cargo.toml) above the current folder or {}. Fix: run `cargo xtask` inside a \
             clone of the repository",
            std::env::current_exe()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|_| "this program".into())
        );
        return ExitCode::FAILURE;
    }
    let result = match cli.command {
        Command::VmSetup(args) => vm::setup::run(&args).map(|_| ExitCode::SUCCESS),
        Command::VmSetupCheck => vm::setup_check::run().map(|_| ExitCode::SUCCESS),
        Command::VmRun(args) => vm::run::main(*args),
        Command::VmTest(args) => vm::test::run(args).map(|_| ExitCode::SUCCESS),
        Command::Demo => ci::demo(),
        Command::Bench(args) => bench::run(args).map(|_| ExitCode::SUCCESS),
        Command::Ci => ci::run().map(|_| ExitCode::SUCCESS),
        Command::Fuzz(args) => fuzz::run(&args).map(|_| ExitCode::SUCCESS),
        Command::FioEngine(args) => fio_engine::run(&args).map(|_| ExitCode::SUCCESS),
        Command::FioPlotCheck => ci::fio_plot_check().map(|_| ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root, found at run time: a built tree that is moved or copied (a clone under
/// /tmp, a CI cache) must use its own location, not the one it was compiled in.
/// The features every cargo build xtask runs turns on (one set, so that builds share their
/// artifacts): NVMe/RDMA, whose build packages xtask installs.
pub const FEATURES: [&str; 2] = ["--features", "usnvme-engine/rdma"];

pub fn workspace_root() -> PathBuf {
    // `main` refuses to run without one; "." only for code reached otherwise (unit tests).
    find_workspace().unwrap_or_else(|| PathBuf::from("."))
}

/// The workspace above, in order: `CARGO_MANIFEST_DIR` (set by `cargo run`, so `cargo xtask`
/// finds its own tree even with a shared CARGO_TARGET_DIR), this executable (`target/debug/xtask`
/// run directly), the current folder.
fn find_workspace() -> Option<PathBuf> {
    static ROOT: OnceLock<Option<PathBuf>> = OnceLock::new();
    ROOT.get_or_init(|| {
        let starts = [
            std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from),
            std::env::current_exe().ok(),
            std::env::current_dir().ok(),
        ];
        workspace_above(starts.iter().flatten())
    })
    .clone()
}

/// The first folder at or above one of `starts` that is this workspace.
fn workspace_above<'a>(starts: impl IntoIterator<Item = &'a PathBuf>) -> Option<PathBuf> {
    starts.into_iter().find_map(|start| {
        start
            .ancestors()
            .find(|dir| is_workspace(dir))
            .map(Path::to_path_buf)
    })
}

/// A Cargo.toml with `[workspace]` (members have none) and an xtask crate next to it (so that
/// an unrelated project around the current folder is passed over).
fn is_workspace(dir: &Path) -> bool {
    dir.join("xtask/Cargo.toml").is_file()
        && std::fs::read_to_string(dir.join("Cargo.toml"))
            .is_ok_and(|s| s.lines().any(|l| l.trim() == "[workspace]"))
}

/// Where the build puts things; respects CARGO_TARGET_DIR.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

#[cfg(test)]
mod tests {
    use super::workspace_above;

    #[test]
    fn finds_the_workspace_where_the_tree_is_now() {
        let tree = std::env::temp_dir().join(format!("usnvme-moved-tree-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tree);
        let exe_dir = tree.join("target/debug");
        let member = tree.join("xtask");
        std::fs::create_dir_all(&exe_dir).expect("mkdir");
        std::fs::create_dir_all(&member).expect("mkdir");
        std::fs::write(
            tree.join("Cargo.toml"),
            "[workspace]\nmembers = [\"xtask\"]\n",
        )
        .expect("write");
        std::fs::write(member.join("Cargo.toml"), "[package]\nname = \"xtask\"\n").expect("write");
        let elsewhere = std::env::temp_dir().join("no-such-usnvme-tree/deeper");

        // from the executable, from the member crate (cargo's CARGO_MANIFEST_DIR), from the root
        for start in [exe_dir.join("xtask"), member.clone(), tree.clone()] {
            assert_eq!(workspace_above([&start]), Some(tree.clone()), "{start:?}");
        }
        // the first start that is in a workspace wins; a folder in none is skipped
        assert_eq!(workspace_above([&elsewhere, &exe_dir]), Some(tree.clone()));
        assert_eq!(workspace_above([&elsewhere]), None);
        // a Cargo.toml without [workspace] (a member, another project) is not the root
        std::fs::write(tree.join("Cargo.toml"), "[package]\nname = \"x\"\n").expect("write");
        assert_eq!(workspace_above([&exe_dir]), None);
        let _ = std::fs::remove_dir_all(&tree);
    }
}

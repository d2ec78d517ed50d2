//! `cargo xtask`: the VM test bed, the test suites, CI, benchmarks and the demo.

mod bench;
mod ci;
mod cmd;
mod fuzz;
mod vm;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "usnvme's build, test and VM tasks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install QEMU, busybox and fio, fetch the guest kernel and build the initramfs (idempotent).
    VmSetup,
    /// Boot the test-bed guest, run PROGRAM in it on drives bound to vfio-pci, exit with its exit code.
    VmRun(vm::run::RunArgs),
    /// Build the VM test suites and run them all in one boot, plus the harness's own tests.
    VmTest(vm::test::VmTestArgs),
    /// The main job: the test bed with 24 emulated drives and `usnvme` on all of them.
    Demo,
    /// Benchmarks: driver and engine cost per I/O on sim, usnvme vs the kernel in the VM; writes BENCHMARKS.md.
    Bench(bench::BenchArgs),
    /// Everything CI checks: fmt, clippy, the workspace tests, the VM tests.
    Ci,
    /// Run the cargo-fuzz targets of driver/fuzz (installs cargo-fuzz if missing).
    Fuzz(fuzz::FuzzArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::VmSetup => vm::setup::run().map(|_| ExitCode::SUCCESS),
        Command::VmRun(args) => vm::run::main(args),
        Command::VmTest(args) => vm::test::run(args).map(|_| ExitCode::SUCCESS),
        Command::Demo => ci::demo(),
        Command::Bench(args) => bench::run(args).map(|_| ExitCode::SUCCESS),
        Command::Ci => ci::run().map(|_| ExitCode::SUCCESS),
        Command::Fuzz(args) => fuzz::run(&args).map(|_| ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root (xtask lives one level below it).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// Where the build puts things; respects CARGO_TARGET_DIR.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

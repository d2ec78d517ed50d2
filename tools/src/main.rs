//! `usnvme`: the command line of the usnvme userspace NVMe driver.
//!
//! Each command lives in its own module (`list.rs`, ...) with an `Args` struct (clap derive) and a
//! `run` function; `main` parses, dispatches, and turns errors into `usnvme: error: ...` and exit
//! status 1 (clap's usage errors exit 2).

mod list;

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use usnvme_driver::pci::Sysfs;

/// Hidden override of the directory under which `sys/` and `proc/` are read, for tests on a fake
/// tree. Not a user-facing option.
const SYSFS_ROOT_ENV: &str = "USNVME_SYSFS_ROOT";

/// Userspace polled-mode NVMe driver over VFIO: set up, inspect and benchmark NVMe drives.
#[derive(Debug, Parser)]
#[command(name = "usnvme", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List the NVMe controllers: driver, NUMA node, IOMMU group, PCIe link, block devices.
    List(list::Args),
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        // `usnvme list | head`: the reader went away, which is not our failure.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("usnvme: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let sysfs = sysfs();
    let mut stdout = io::stdout().lock();
    match cli.command {
        Command::List(args) => list::run(&sysfs, &args, &mut stdout)?,
    }
    stdout.flush()?;
    Ok(())
}

/// The sysfs/procfs view: `/`, or the root named by `USNVME_SYSFS_ROOT`.
fn sysfs() -> Sysfs {
    match std::env::var_os(SYSFS_ROOT_ENV).filter(|root| !root.is_empty()) {
        Some(root) => {
            let root = PathBuf::from(root);
            log::debug!("reading sysfs and procfs under {}", root.display());
            Sysfs::with_root(root)
        }
        None => Sysfs::new(),
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
    })
}

//! `usnvme`: the command line of the usnvme userspace NVMe driver.
//!
//! The binary's modules live here, under `src/cli/`; `src/` itself holds the library pieces
//! the binary and xtask share (progress lines, the sweep matrix, its table and charts). Each
//! command lives in its own module (`list.rs`, ...) with an `Args` struct (clap derive) and a
//! `run` function; `main` parses, dispatches, and turns errors into `usnvme: error: ...` and exit
//! status 1 (clap's usage errors exit 2).

mod discover;
mod firmware;
mod format;
mod format_nvm;
mod health;
mod hotplug;
mod identify;
mod list;
mod maintenance;
mod namespace;
mod open;
mod perf;
mod remote;
mod serve;
mod setup;
mod signals;
mod sweep;
mod target;
mod usage;

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use usnvme_driver::pci::Sysfs;

/// Hidden override of the directory under which `sys/`, `proc/` and `etc/` (the host NQN) are
/// read, for tests on a fake tree. Not a user-facing option.
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
    /// Set up drives for usnvme: status, bind to vfio-pci, reset to nvme, reserve hugepages.
    Setup(setup::Args),
    /// List the NVMe controllers: driver, NUMA node, IOMMU group, PCIe link, block devices.
    List(list::Args),
    /// Identify controllers and namespaces: model, serial, firmware, features, LBA formats.
    Identify(identify::Args),
    /// List what an NVMe/TCP target offers (its Discovery Log Page).
    Discover(discover::Args),
    /// SMART / Health of controllers: temperature, wear, spare, errors, PCIe link, and a verdict.
    Health(health::Args),
    /// Format namespaces (Format NVM): block size, metadata, protection information, erase.
    Format(format_nvm::Args),
    /// Sanitize drives (block or crypto erase), following its progress to the end.
    Sanitize(maintenance::SanitizeArgs),
    /// Run a device self-test (short or extended), following its progress; or abort one.
    SelfTest(maintenance::SelfTestArgs),
    /// Firmware update: download an image, commit it to a slot.
    #[command(subcommand)]
    Fw(firmware::Args),
    /// Namespace management: list, create, attach, detach, delete.
    #[command(subcommand)]
    Ns(namespace::Args),
    /// Measure I/O performance (spdk_nvme_perf's flags): IOPS, MiB/s and latency per drive and core.
    Perf(perf::Args),
    /// Export drives and stripes over NVMe/TCP to hosts running the Linux initiator.
    Serve(serve::Args),
    /// Sweep block sizes × patterns (read, write, randread, randwrite): table, CSV, JSON, SVG charts.
    Sweep(sweep::Args),
    /// Change a running target (subsystems, namespaces, hosts, listeners, ANA) and save it.
    Target(target::Args),
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // A bad flag: one line naming it, exit 2, as the commands' own usage errors.
        Err(e) if e.use_stderr() => {
            eprintln!("usnvme: {}", one_line(&e));
            return ExitCode::from(2);
        }
        Err(e) => e.exit(), // --help, --version
    };
    if let Err(e) = signals::install() {
        log::warn!("cannot install the Ctrl-C handler: {e}");
    }
    let result = run(cli);
    if let Some(signal) = signals::received() {
        eprintln!(
            "usnvme: interrupted by {}; the controllers were shut down",
            signals::name(signal)
        );
        return ExitCode::from(signals::exit_status(signal));
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // `usnvme list | head`: the reader went away, which is not our failure.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            match e.downcast_ref::<open::Failures>() {
                // One line per controller that failed (the others were reported).
                Some(open::Failures(failures)) => {
                    for failure in failures {
                        eprintln!("usnvme: error: {}", error_text(failure));
                    }
                }
                None => eprintln!("usnvme: error: {}", error_text(&e)),
            }
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let sysfs = sysfs();
    let mut stdout = io::stdout().lock();
    let result = match cli.command {
        Command::Setup(args) => setup::run(&sysfs, &args, &mut stdout),
        Command::List(args) => list::run(&sysfs, &args, &mut stdout),
        Command::Identify(args) => identify::run(&sysfs, &args, &mut stdout),
        Command::Discover(args) => discover::run(&sysfs, &args, &mut stdout),
        Command::Health(args) => health::run(&sysfs, &args, &mut stdout),
        Command::Format(args) => format_nvm::main(&sysfs, &args, &mut stdout),
        Command::Sanitize(args) => maintenance::sanitize(&sysfs, &args, &mut stdout),
        Command::SelfTest(args) => maintenance::self_test(&sysfs, &args, &mut stdout),
        Command::Fw(args) => firmware::main(&sysfs, &args, &mut stdout),
        Command::Ns(args) => namespace::main(&sysfs, &args, &mut stdout),
        Command::Perf(args) => perf::main(&sysfs, &args, &mut stdout),
        Command::Serve(args) => serve::main(&sysfs, &args, &mut stdout),
        Command::Sweep(args) => sweep::main(&sysfs, &args, &mut stdout),
        Command::Target(args) => target::main(&args, &mut stdout),
    };
    // What was reported goes out before the errors about the rest.
    let flushed = stdout.flush();
    result?;
    Ok(flushed?)
}

/// clap's error on one line: its message and hints without the usage block clap adds
/// (`--help` shows that).
fn one_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let kept: Vec<&str> = text
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Usage:"))
        .filter(|l| !l.is_empty() && !l.starts_with("For more information"))
        .collect();
    kept.join(" ")
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

/// The error and its causes, `: `-separated, like `{e:#}`, but without a cause whose text is
/// already there: errors that print their source in their own message (as the VFIO ones do)
/// would otherwise say the same thing two or three times.
fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let cause = cause.to_string();
        if text.contains(&cause) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&cause);
    }
    text
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error that prints its source in its own message, and also returns it as its source.
    #[derive(Debug)]
    struct Repeats(io::Error);

    impl std::fmt::Display for Repeats {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "cannot open the container: {}", self.0)
        }
    }

    impl std::error::Error for Repeats {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn error_text_says_each_cause_once() {
        let e = anyhow::Error::new(Repeats(io::Error::other("no such file")));
        assert_eq!(
            format!("{e:#}"),
            "cannot open the container: no such file: no such file"
        );
        assert_eq!(error_text(&e), "cannot open the container: no such file");
        let e = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_text(&e), "outer: inner");
    }
}

//! `usnvme sanitize` and `usnvme self-test` on drives bound to vfio-pci: each starts the
//! operation, then follows its log page (Sanitize Status, Device Self-test) until it ends,
//! saying how far it is, and reports how it ended. A drive without the operation is refused by
//! name; a drive another process holds is refused when it is opened.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use usnvme_driver::pci::Sysfs;
use usnvme_driver::spec::identify::Oacs;
use usnvme_driver::spec::log::{
    SanitizeState, SanitizeStatus, SelfTestStatus, SANITIZE_LOG_BYTES, SELF_TEST_LOG_BYTES,
};
use usnvme_driver::spec::{AdminOpcode, LogPageId, Sqe};
use usnvme_driver::{Controller, DeviceSpec};

use crate::open;
use crate::perf::{exit_on_usage, usage};

/// How often the log page is read while an operation runs.
const POLL: Duration = Duration::from_millis(100);
/// Longest a sanitize or an extended self-test is followed: hours on large drives.
const LONGEST: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SanitizeAction {
    /// Block Erase: the media's blocks erased.
    BlockErase,
    /// Crypto Erase: the media encryption key changed.
    CryptoErase,
    /// Exit Failure Mode: after a failed sanitize, use the drive again.
    ExitFailure,
}

#[derive(Debug, clap::Args)]
pub struct SanitizeArgs {
    /// Drives: PCI addresses (0000:01:00.0) or simulated ones (sim:0).
    #[arg(value_name = "DEVICE", required = true)]
    devices: Vec<DeviceSpec>,
    #[arg(long, value_enum)]
    action: SanitizeAction,
    /// Yes, destroy every block of every namespace of the drives.
    #[arg(long)]
    yes: bool,
}

#[derive(Debug, clap::Args)]
pub struct SelfTestArgs {
    /// Drives: PCI addresses (0000:01:00.0) or simulated ones (sim:0).
    #[arg(value_name = "DEVICE", required = true)]
    devices: Vec<DeviceSpec>,
    /// The extended self-test (default: the short one).
    #[arg(long, conflicts_with = "abort")]
    extended: bool,
    /// Abort the self-test under way.
    #[arg(long)]
    abort: bool,
}

/// Sanitizes; without `--yes` a usage error is printed and the process exits 2.
pub fn sanitize(sysfs: &Sysfs, args: &SanitizeArgs, out: &mut dyn Write) -> Result<()> {
    if !args.yes && args.action != SanitizeAction::ExitFailure {
        let drives: Vec<String> = args.devices.iter().map(|d| d.to_string()).collect();
        let refused = Err(usage(format!(
            "sanitize destroys every block of every namespace of {}: add --yes to go ahead",
            drives.join(", ")
        )));
        exit_on_usage(&refused, out);
        return refused;
    }
    open::each_line(sysfs, &args.devices, out, |ctrl| {
        run_sanitize(ctrl, args.action)
    })
}

pub fn self_test(sysfs: &Sysfs, args: &SelfTestArgs, out: &mut dyn Write) -> Result<()> {
    open::each_line(sysfs, &args.devices, out, |ctrl| run_self_test(ctrl, args))
}

/// Reads log page `lid` every [`POLL`] until `done` says the operation ended (or [`LONGEST`]);
/// prints its progress (percent from `percent`) on standard error as it moves by a tenth.
fn follow<T>(
    ctrl: &Controller,
    what: &str,
    lid: LogPageId,
    len: usize,
    parse: impl Fn(&[u8]) -> Option<T>,
    percent: impl Fn(&T) -> Option<u32>,
) -> Result<T> {
    let started = Instant::now();
    let mut shown = None;
    loop {
        let log = ctrl.log_page(lid, u32::MAX, len)?;
        let Some(status) = parse(&log) else {
            bail!("{}: the {} log is too short", ctrl.name(), lid.name());
        };
        let Some(p) = percent(&status) else {
            return Ok(status);
        };
        if shown.is_none_or(|s| p >= s + 10) {
            eprintln!("usnvme: {}: {what}: {p} %", ctrl.name());
            shown = Some(p);
        }
        if started.elapsed() > LONGEST {
            bail!(
                "{}: {what} still runs after {} h",
                ctrl.name(),
                LONGEST.as_secs() / 3600
            );
        }
        if crate::signals::received().is_some() {
            bail!(
                "{}: interrupted: the {what} goes on in the drive",
                ctrl.name()
            );
        }
        std::thread::sleep(POLL);
    }
}

fn run_sanitize(ctrl: &Controller, action: SanitizeAction) -> Result<String> {
    let name = ctrl.name();
    let sanicap = ctrl.identify().sanicap;
    let (sanact, supported, what) = match action {
        SanitizeAction::BlockErase => (2, sanicap & 0b010 != 0, "block erase"),
        SanitizeAction::CryptoErase => (4, sanicap & 0b001 != 0, "crypto erase"),
        SanitizeAction::ExitFailure => (1, sanicap & 0b011 != 0, "exit failure mode"),
    };
    if !supported {
        bail!("{name}: the controller does not support a {what} sanitize (SANICAP {sanicap:#x})");
    }
    let mut sqe = Sqe::new(AdminOpcode::Sanitize as u8);
    sqe.cdw10 = sanact;
    ctrl.admin(sqe)?;
    if action == SanitizeAction::ExitFailure {
        return Ok(format!("{name}: out of sanitize failure mode"));
    }
    let status = follow(
        ctrl,
        "sanitize",
        LogPageId::SanitizeStatus,
        SANITIZE_LOG_BYTES,
        SanitizeStatus::from_slice,
        |s| (s.state == SanitizeState::InProgress).then(|| u32::from(s.progress) * 100 / 65536),
    )?;
    match status.state {
        SanitizeState::Completed | SanitizeState::CompletedNoDeallocate => {
            Ok(format!("{name}: sanitize ({what}) completed"))
        }
        SanitizeState::Failed => bail!(
            "{name}: the sanitize failed: the drive takes no I/O until `usnvme sanitize {name} --action exit-failure`"
        ),
        other => bail!("{name}: the sanitize log says {other:?} after the command"),
    }
}

fn run_self_test(ctrl: &Controller, args: &SelfTestArgs) -> Result<String> {
    let name = ctrl.name();
    if !ctrl.identify().oacs().contains(Oacs::DEVICE_SELF_TEST) {
        bail!("{name}: the controller does not support Device Self-test (OACS bit 4 is clear)");
    }
    let (code, what) = match (args.abort, args.extended) {
        (true, _) => (0xf, "abort"),
        (false, true) => (2, "extended self-test"),
        (false, false) => (1, "short self-test"),
    };
    let mut sqe = Sqe::new(AdminOpcode::DeviceSelfTest as u8);
    sqe.nsid = u32::MAX;
    sqe.cdw10 = code;
    ctrl.admin(sqe)?;
    if args.abort {
        return Ok(format!("{name}: self-test aborted"));
    }
    let status = follow(
        ctrl,
        what,
        LogPageId::DeviceSelfTest,
        SELF_TEST_LOG_BYTES,
        SelfTestStatus::from_slice,
        |s| (s.running != 0).then_some(u32::from(s.percent)),
    )?;
    match status.newest {
        Some((c, 0)) if c == code as u8 => Ok(format!("{name}: {what} completed without error")),
        Some((c, result)) if c == code as u8 => bail!(
            "{name}: {what} ended with result {result} ({})",
            self_test_result(result)
        ),
        _ => bail!("{name}: the self-test log has no result of the {what}"),
    }
}

/// A self-test result code's meaning.
fn self_test_result(result: u8) -> &'static str {
    match result {
        1 => "aborted by a Device Self-test command",
        2 => "aborted by a controller reset",
        3 => "aborted by a namespace removal",
        4 => "aborted by a Format NVM command",
        5 => "a fatal error or unknown test error",
        6 => "completed with a failed segment, which is not known",
        7 => "completed with one or more failed segments",
        8 => "aborted for an unknown reason",
        9 => "aborted by a sanitize",
        _ => "reserved",
    }
}

//! `usnvme fw download|commit`: a firmware image into a drive bound to vfio-pci (Firmware Image
//! Download, in parts as the drive's update granularity allows), and a slot committed (Firmware
//! Commit). `usnvme identify` shows the slots. A drive without firmware update is refused by
//! name; a drive another process holds is refused when it is opened.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use usnvme_driver::pci::Sysfs;
use usnvme_driver::spec::identify::Oacs;
use usnvme_driver::spec::{AdminOpcode, Sqe, Status};
use usnvme_driver::{Controller, DeviceSpec, Error};

use crate::open;

/// The most one Firmware Image Download carries here (the admin queue's data buffer).
const MAX_PART: usize = 16 << 10;

#[derive(Debug, clap::Subcommand)]
pub enum Args {
    /// Send a firmware image to the drives (it runs only once committed).
    Download {
        #[arg(value_name = "DEVICE", required = true)]
        devices: Vec<DeviceSpec>,
        /// The image file.
        #[arg(long)]
        file: PathBuf,
    },
    /// Commit the image downloaded (or one already in a slot) to a firmware slot.
    Commit {
        #[arg(value_name = "DEVICE", required = true)]
        devices: Vec<DeviceSpec>,
        /// The slot (1-7; default: the drive chooses).
        #[arg(long, value_parser = clap::value_parser!(u8).range(1..=7))]
        slot: Option<u8>,
        #[arg(long, value_enum)]
        action: CommitAction,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CommitAction {
    /// Put the image in the slot; run it only when activated.
    Replace,
    /// Put the image in the slot and run it from the next controller reset.
    ReplaceActivate,
    /// Run the image already in the slot from the next controller reset.
    Activate,
    /// Put the image in the slot and run it now, without a reset.
    ReplaceActivateNow,
}

pub fn main(sysfs: &Sysfs, args: &Args, out: &mut dyn Write) -> Result<()> {
    match args {
        Args::Download { devices, file } => {
            let image = std::fs::read(file)
                .with_context(|| format!("cannot read the image {}", file.display()))?;
            if image.is_empty() {
                bail!("{}: the image is empty", file.display());
            }
            open::each_line(sysfs, devices, out, |ctrl| download(ctrl, &image))
        }
        Args::Commit {
            devices,
            slot,
            action,
        } => open::each_line(sysfs, devices, out, |ctrl| commit(ctrl, *slot, *action)),
    }
}

fn supports_update(ctrl: &Controller) -> Result<()> {
    if !ctrl.identify().oacs().contains(Oacs::FIRMWARE) {
        bail!(
            "{}: the controller does not support firmware update (OACS bit 2 is clear)",
            ctrl.name()
        );
    }
    Ok(())
}

/// The image in parts of the drive's update granularity (FWUG, 4 KiB units; 0 unknown, FFh
/// none) within what one command carries.
fn download(ctrl: &Controller, image: &[u8]) -> Result<String> {
    supports_update(ctrl)?;
    let largest = (ctrl.max_transfer() as usize).min(MAX_PART);
    let part = match ctrl.identify().fwug {
        0 | 0xff => largest,
        units => {
            let granule = usize::from(units) * 4096;
            if granule > largest {
                bail!(
                    "{}: the drive updates firmware in {granule}-byte parts, more than one command carries here ({largest})",
                    ctrl.name()
                );
            }
            largest / granule * granule
        }
    };
    // whole dwords: the last part padded with zeroes
    let mut padded = image.to_vec();
    padded.resize(image.len().div_ceil(4) * 4, 0);
    for (i, chunk) in padded.chunks(part).enumerate() {
        let mut sqe = Sqe::new(AdminOpcode::FirmwareDownload as u8);
        sqe.cdw10 = (chunk.len() / 4 - 1) as u32;
        sqe.cdw11 = (i * part / 4) as u32;
        ctrl.admin_write(sqe, chunk)?;
    }
    Ok(format!(
        "{}: {} bytes of firmware downloaded; commit it with `usnvme fw commit {} --action ...`",
        ctrl.name(),
        image.len(),
        ctrl.name()
    ))
}

fn commit(ctrl: &Controller, slot: Option<u8>, action: CommitAction) -> Result<String> {
    supports_update(ctrl)?;
    let ca = match action {
        CommitAction::Replace => 0,
        CommitAction::ReplaceActivate => 1,
        CommitAction::Activate => 2,
        CommitAction::ReplaceActivateNow => 3,
    };
    let mut sqe = Sqe::new(AdminOpcode::FirmwareCommit as u8);
    sqe.cdw10 = u32::from(slot.unwrap_or(0)) | ca << 3;
    let name = ctrl.name();
    let when = match ctrl.admin(sqe) {
        Ok(_) => match action {
            CommitAction::Replace => "in its slot, not running",
            CommitAction::ReplaceActivate | CommitAction::Activate => {
                "running from the next controller reset (`usnvme setup reset`, or a power cycle)"
            }
            CommitAction::ReplaceActivateNow => "running now",
        },
        Err(Error::Command { status, .. })
            if [
                Status::FW_NEEDS_CONVENTIONAL_RESET,
                Status::FW_NEEDS_SUBSYSTEM_RESET,
                Status::FW_NEEDS_CONTROLLER_RESET,
            ]
            .contains(&status.code()) =>
        {
            "committed; it runs after the reset the drive asks for"
        }
        Err(e) => return Err(e.into()),
    };
    let log = ctrl.firmware_log()?;
    Ok(format!(
        "{name}: firmware committed ({when}); running slot {}, next reset slot {}",
        log.active_slot(),
        log.next_reset_slot()
            .map_or("unchanged".to_owned(), |s| s.to_string())
    ))
}

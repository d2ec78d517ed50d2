//! `usnvme ns list|create|attach|detach|delete`: namespace management on drives bound to
//! vfio-pci (nvme-cli cannot reach them there). A namespace is created detached, at the ID the
//! drive chooses, in the LBA format with the data and metadata sizes asked for; attach makes it
//! active on this controller (then perf and serve see it) or on others of the NVM subsystem
//! (`--controller`: the other port of a dual-port drive), detach makes it inactive without
//! touching its data, delete destroys it (only with `--yes`). A drive without namespace
//! management is refused by name; a drive another process holds is refused when it is opened.

use std::io::Write;

use anyhow::{anyhow, bail, Result};
use usnvme_driver::pci::Sysfs;
use usnvme_driver::spec::command::Cns;
use usnvme_driver::spec::identify::{ControllerList, Oacs};
use usnvme_driver::spec::{IdentifyNamespace, NamespaceList, Sqe};
use usnvme_driver::{Controller, DeviceSpec};

use crate::format_nvm::LbaFormatArgs;
use crate::open;
use crate::perf::{exit_on_usage, usage};

#[derive(Debug, clap::Subcommand)]
pub enum Args {
    /// The namespaces the drives have allocated, attached or not, and the capacity left.
    List {
        #[arg(value_name = "DEVICE", required = true)]
        devices: Vec<DeviceSpec>,
    },
    /// Create a namespace (detached): its size and LBA format.
    Create {
        #[arg(value_name = "DEVICE", required = true)]
        devices: Vec<DeviceSpec>,
        /// Its size in bytes, e.g. 1G (a whole number of blocks).
        #[arg(long, value_parser = parse_size)]
        size: u64,
        #[command(flatten)]
        format: LbaFormatArgs,
        /// Private to one controller (default: may be shared by the subsystem's controllers).
        #[arg(long)]
        private: bool,
    },
    /// Attach a namespace to this controller (or those given): it becomes active.
    Attach(Attachment),
    /// Detach a namespace from this controller (or those given): it becomes inactive, its data
    /// kept.
    Detach(Attachment),
    /// Delete a namespace: its data is destroyed.
    Delete {
        #[command(flatten)]
        which: Which,
        /// Yes, destroy every block of the namespace.
        #[arg(long)]
        yes: bool,
    },
}

#[derive(Debug, clap::Args)]
pub struct Which {
    #[arg(value_name = "DEVICE", required = true)]
    devices: Vec<DeviceSpec>,
    /// The namespace.
    #[arg(short = 'n', long = "namespace", value_name = "NSID", required = true,
          value_parser = clap::value_parser!(u32).range(1..0xffff_ffff))]
    nsid: u32,
}

#[derive(Debug, clap::Args)]
pub struct Attachment {
    #[command(flatten)]
    which: Which,
    /// The controller, by its ID in the NVM subsystem (`usnvme identify` shows it), e.g. the
    /// other port of a dual-port drive (repeatable). Default: the controller named.
    #[arg(long = "controller", value_name = "CNTLID",
          value_parser = clap::value_parser!(u16).range(0..0xfff0))]
    controllers: Vec<u16>,
}

fn parse_size(s: &str) -> Result<u64, String> {
    usnvme_driver::parse_size(s)
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{s:?} is not a size: a number of bytes, e.g. 512M or 1G"))
}

/// Runs a namespace command; a [`usage`] error has been printed and exits the process with
/// status 2.
pub fn main(sysfs: &Sysfs, args: &Args, out: &mut dyn Write) -> Result<()> {
    let result = run(sysfs, args, out);
    exit_on_usage(&result, out);
    result
}

fn run(sysfs: &Sysfs, args: &Args, out: &mut dyn Write) -> Result<()> {
    match args {
        Args::List { devices } => open::each_line(sysfs, devices, out, list),
        Args::Create {
            devices,
            size,
            format,
            private,
        } => {
            format.check()?;
            let block_size = format.block_size;
            if block_size == 0 || size % block_size != 0 {
                return Err(usage(format!(
                    "--size {size}: not a whole number of {block_size}-byte blocks"
                )));
            }
            open::each_line(sysfs, devices, out, |ctrl| {
                create(ctrl, format, size / block_size, !private)
            })
        }
        Args::Attach(a) => open::each_line(sysfs, &a.which.devices, out, |c| attach(c, a, true)),
        Args::Detach(a) => open::each_line(sysfs, &a.which.devices, out, |c| attach(c, a, false)),
        Args::Delete { which, yes } => {
            if !yes {
                let drives: Vec<String> = which.devices.iter().map(|d| d.to_string()).collect();
                return Err(usage(format!(
                    "deleting destroys every block of namespace {} of {}: add --yes to go ahead",
                    which.nsid,
                    drives.join(", ")
                )));
            }
            open::each_line(sysfs, &which.devices, out, |ctrl| delete(ctrl, which.nsid))
        }
    }
}

fn supports_management(ctrl: &Controller) -> Result<()> {
    if !ctrl.identify().oacs().contains(Oacs::NS_MANAGEMENT) {
        bail!(
            "{}: the controller does not support namespace management (OACS bit 3 is clear)",
            ctrl.name()
        );
    }
    Ok(())
}

/// Identify data of `cns` for `nsid`.
fn identify(ctrl: &Controller, cns: Cns, nsid: u32) -> Result<Vec<u8>> {
    Ok(ctrl.admin_read(Sqe::identify(cns, nsid), 4096)?.1)
}

fn ids(ctrl: &Controller, cns: Cns) -> Result<Vec<u32>> {
    let page = identify(ctrl, cns, 0)?;
    let list = NamespaceList::from_slice(&page)
        .ok_or_else(|| anyhow!("{}: a short namespace list", ctrl.name()))?;
    Ok(list.iter().collect())
}

/// `4096 B + 64 B metadata (extended LBA), protection information type 3`.
pub fn describe(id: &IdentifyNamespace) -> String {
    let mut s = format!(
        "{} blocks of {} B",
        id.nsze,
        id.lba_size_bytes().unwrap_or(0)
    );
    if id.metadata_size() > 0 {
        s += &format!(" + {} B metadata", id.metadata_size());
        if id.metadata_extended() {
            s += " (extended LBA)";
        }
    }
    if id.dps & 7 != 0 {
        s += &format!(", protection information type {}", id.dps & 7);
    }
    s
}

fn list(ctrl: &Controller) -> Result<String> {
    supports_management(ctrl)?;
    let name = ctrl.name();
    let active = ids(ctrl, Cns::ActiveNamespaceList)?;
    let mut lines = Vec::new();
    for nsid in ids(ctrl, Cns::AllocatedNamespaceList)? {
        let page = identify(ctrl, Cns::AllocatedNamespace, nsid)?;
        let id = IdentifyNamespace::from_slice(&page)
            .ok_or_else(|| anyhow!("{name}: namespace {nsid}: no Identify data"))?;
        let state = if active.contains(&nsid) {
            "attached"
        } else {
            "detached"
        };
        lines.push(format!(
            "{name}: namespace {nsid}: {state}, {}",
            describe(&id)
        ));
    }
    let page = identify(ctrl, Cns::Controller, 0)?;
    let (total, free) = match usnvme_driver::spec::IdentifyController::from_slice(&page) {
        Some(id) => (
            u128::from_le_bytes(id.tnvmcap),
            u128::from_le_bytes(id.unvmcap),
        ),
        None => bail!("{name}: no Identify Controller data"),
    };
    let capacity = match total {
        0 => "the drive reports no NVM capacity".to_owned(),
        _ => format!("{} MiB of {} MiB unallocated", free >> 20, total >> 20),
    };
    lines.push(format!(
        "{name}: {} namespaces allocated; {capacity}",
        lines.len()
    ));
    Ok(lines.join("\n"))
}

/// Creates a namespace of `blocks` blocks in `format`, shared by the subsystem's controllers
/// or not.
fn create(ctrl: &Controller, format: &LbaFormatArgs, blocks: u64, shared: bool) -> Result<String> {
    supports_management(ctrl)?;
    let name = ctrl.name();
    // the formats a namespace may be created with: the common Identify Namespace's, or those
    // an active namespace lists where the drive has no common one (QEMU)
    let common = identify(ctrl, Cns::Namespace, u32::MAX)
        .ok()
        .and_then(|page| IdentifyNamespace::from_slice(&page))
        .filter(|id| id.lbaf[0].data_size().is_some())
        .or_else(|| ctrl.namespaces().first().map(|ns| *ns.identify))
        .ok_or_else(|| anyhow!("{name}: the drive lists no LBA format to create a namespace in"))?;
    let index = format.index_in(name, &common)? as u8;
    let mut id = IdentifyNamespace::zeroed();
    (id.nsze, id.ncap) = (blocks, blocks);
    id.flbas = (index & 0xf) | u8::from(format.extended) << 4 | ((index >> 4) & 3) << 5;
    id.dps = format.pi | u8::from(format.pi_first) << 3;
    id.nmic = u8::from(shared);
    let nsid = ctrl.admin_write(Sqe::namespace_create(), id.as_bytes())?;
    let page = identify(ctrl, Cns::AllocatedNamespace, nsid)?;
    let made = IdentifyNamespace::from_slice(&page)
        .ok_or_else(|| anyhow!("{name}: namespace {nsid}: no Identify data"))?;
    Ok(format!(
        "{name}: namespace {nsid} created (detached): {}; attach it with `usnvme ns attach {name} -n {nsid}`",
        describe(&made)
    ))
}

/// Attaches `nsid` to (or detaches it from) this controller.
fn attach(ctrl: &Controller, a: &Attachment, attach: bool) -> Result<String> {
    supports_management(ctrl)?;
    let nsid = a.which.nsid;
    let (list, whose) = match &a.controllers[..] {
        [] => (
            ControllerList::from_ids([ctrl.identify().cntlid]),
            String::new(),
        ),
        ids => {
            let ids: Vec<String> = ids.iter().map(u16::to_string).collect();
            let whose = format!(" (controller {})", ids.join(", "));
            (
                ControllerList::from_ids(a.controllers.iter().copied()),
                whose,
            )
        }
    };
    ctrl.admin_write(Sqe::namespace_attachment(nsid, attach), list.as_bytes())?;
    let done = if attach { "attached" } else { "detached" };
    Ok(format!("{}: namespace {nsid} {done}{whose}", ctrl.name()))
}

fn delete(ctrl: &Controller, nsid: u32) -> Result<String> {
    supports_management(ctrl)?;
    ctrl.admin(Sqe::namespace_delete(nsid))?;
    Ok(format!("{}: namespace {nsid} deleted", ctrl.name()))
}

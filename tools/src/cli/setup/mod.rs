//! `usnvme setup`: what SPDK's `setup.sh` does, with more care.
//!
//! Every decision is made first, as a [`plan::Plan`] computed from sysfs and procfs under the
//! root (`/`, or a fake tree in tests): which drives move, which are refused and why, which
//! files get which values. Then the plan is carried out by writing sysfs files
//! (`driver_override`, `driver/unbind`, `drivers_probe`, `nr_hugepages`) and, on the real root
//! only, running `modprobe` and `mount`. A refusal or a bad argument is found while planning, so
//! it leaves every drive as it was; `--dry-run` prints the plan and stops there. A second run
//! finds nothing to do.

mod hugepages;
mod iommu;
mod plan;

use std::fs;
use std::io::Write;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use usnvme_driver::pci::Sysfs;

use self::hugepages::Request;
use self::iommu::IommuState;
use self::plan::{Host, Plan, Target};
use crate::format::Fields;

/// Arguments of `usnvme setup`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Drives holding a mounted file system, active swap, an LVM / md / dm holder or the \
root file system are refused, and so are drives whose IOMMU group holds other devices in use. \
Named drives are refused before anything changes; `all` leaves such drives as they are and says \
why. Needs root, except for `status` and --dry-run."
)]
pub struct Args {
    #[command(subcommand)]
    pub action: Option<Action>,
    /// Reserve hugepages: SIZE[,node=N][,size=2M|1G], e.g. 2G, 4G,node=1, 8G,size=1G (repeatable);
    /// sets the pool to SIZE and mounts hugetlbfs at /dev/hugepages if nothing is mounted.
    #[arg(long, global = true, value_name = "SIZE[,node=N][,size=1G]")]
    pub hugepages: Vec<Request>,
    /// Print what would be done, change nothing.
    #[arg(long, global = true)]
    pub dry_run: bool,
}

/// What `setup` does with the drives (default: `status`).
#[derive(Debug, clap::Subcommand)]
pub enum Action {
    /// The drives (as `usnvme list` shows them), IOMMU, vfio-pci, hugepages, memlock limit.
    Status,
    /// Bind drives to vfio-pci (loads the module, checks the IOMMU and the drives' use).
    Bind(Drives),
    /// Give drives back to the kernel nvme driver.
    Reset(Drives),
}

/// The drives of `bind` and `reset`.
#[derive(Debug, clap::Args)]
pub struct Drives {
    /// PCI addresses (0000:01:00.0 or 01:00.0), or `all` for every NVMe controller.
    #[arg(value_name = "BDF|all", required = true)]
    pub drives: Vec<Target>,
}

/// Runs `usnvme setup`.
pub fn run(sysfs: &Sysfs, args: &Args, out: &mut dyn Write) -> Result<()> {
    let root = sysfs.root();
    let mut plan = Plan {
        items: hugepages::plan(root, &args.hugepages)?,
        warnings: Vec::new(),
    };
    match &args.action {
        None | Some(Action::Status) => {}
        Some(Action::Bind(drives)) => {
            let all = is_all(drives);
            let controllers = plan::resolve(sysfs, &drives.drives)?;
            let iommu = IommuState::read(root);
            plan.items
                .extend(plan::bind(sysfs, &controllers, all, &iommu)?);
            plan.warnings = hugepages::warnings(root, &args.hugepages);
        }
        Some(Action::Reset(drives)) => {
            let all = is_all(drives);
            let controllers = plan::resolve(sysfs, &drives.drives)?;
            plan.items.extend(plan::reset(sysfs, &controllers, all)?);
        }
    }
    for warning in &plan.warnings {
        eprintln!("usnvme: warning: {warning}");
    }
    if args.dry_run {
        write!(out, "{plan}")?;
        if plan.changes_anything() {
            writeln!(out, "dry run: nothing was changed")?;
        }
    } else {
        if plan.changes_anything() {
            check_root(root, args)?;
        }
        let host = Host::new(root);
        for item in &plan.items {
            host.execute(item, out)?;
        }
    }
    if matches!(args.action, None | Some(Action::Status)) {
        if !plan.items.is_empty() {
            writeln!(out)?;
        }
        status(sysfs, out)?;
    }
    Ok(())
}

/// Whether the drives are `all`; `all` among addresses is a usage error (exit status 2).
fn is_all(drives: &Drives) -> bool {
    let all = drives.drives.contains(&Target::All);
    if all && drives.drives.len() > 1 {
        // nothing was done yet: a usage error as clap's own (see `main`)
        eprintln!("usnvme: error: `all` stands alone: name drives by address, or say `all`");
        std::process::exit(2);
    }
    all
}

/// Fails unless the effective user is root (on a fake tree, as its `proc/self/status` says).
fn check_root(root: &Path, args: &Args) -> Result<()> {
    let path = root.join("proc/self/status");
    let status = fs::read_to_string(&path).with_context(|| {
        format!(
            "cannot tell whether this is root: cannot read {}",
            path.display()
        )
    })?;
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .ok_or_else(|| {
            anyhow!(
                "cannot tell whether this is root: no Uid line in {}",
                path.display()
            )
        })?;
    if euid != "0" {
        let what = match &args.action {
            Some(Action::Bind(_)) => "setup bind",
            Some(Action::Reset(_)) => "setup reset",
            None | Some(Action::Status) => "setup --hugepages",
        };
        bail!("usnvme {what} needs root (it writes to /sys): run it with sudo, or add --dry-run to see what it would do");
    }
    Ok(())
}

/// `setup status`: the list table, then the system's side.
fn status(sysfs: &Sysfs, out: &mut dyn Write) -> Result<()> {
    crate::list::run(sysfs, &crate::list::Args { json: false }, out)?;
    let root = sysfs.root();
    let mut fields = Fields::new();
    fields.field(0, "IOMMU", IommuState::read(root).describe());
    let vfio = if root.join("sys/bus/pci/drivers/vfio-pci").is_dir() {
        "loaded"
    } else {
        "not loaded (`usnvme setup bind` loads it)"
    };
    fields.field(0, "vfio-pci", vfio);
    for (key, value) in hugepages::status(root) {
        fields.field(0, key, value);
    }
    writeln!(out)?;
    write!(out, "{}", fields.render())?;
    Ok(())
}

//! The plan of `usnvme setup`: what to change, computed from sysfs and procfs under a root, and
//! how to carry it out. Planning reads only; every refusal is found here, before anything is
//! written.

use std::collections::BTreeSet;
use std::fmt;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{anyhow, bail, Result};
use usnvme_driver::lock;
use usnvme_driver::pci::{Driver, NvmeControllerInfo, PciAddress, Sysfs};

use super::iommu::IommuState;
use crate::usage::{BlockDeviceInfo, UsageScan};

/// One change, in the terms of the shell command that does the same by hand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// `modprobe MODULE`.
    Modprobe(&'static str),
    /// `echo VALUE > /FILE`: `file` is relative to the root.
    Write { file: PathBuf, value: String },
    /// A check after the writes: the device at `device` (its sysfs directory, relative to the
    /// root) is bound to `driver`. Only on the real root, where the kernel acts on the writes.
    ExpectDriver { device: PathBuf, driver: Driver },
    /// A check after a write to `nr_hugepages`: the kernel reserved `count` pages.
    ExpectHugepages { file: PathBuf, count: u64 },
    /// `mount -t hugetlbfs nodev TARGET`.
    MountHugetlbfs(&'static str),
}

impl Step {
    /// The command line that does this step by hand; `None` for checks.
    fn command_line(&self) -> Option<String> {
        match self {
            Step::Modprobe(module) => Some(format!("modprobe {module}")),
            Step::Write { file, value } if value.is_empty() => {
                Some(format!("echo > /{}", file.display()))
            }
            Step::Write { file, value } => Some(format!("echo {value} > /{}", file.display())),
            Step::MountHugetlbfs(target) => Some(format!("mount -t hugetlbfs nodev {target}")),
            Step::ExpectDriver { .. } | Step::ExpectHugepages { .. } => None,
        }
    }
}

/// A drive, a hugepage pool, or a module: what happens to it (`steps`), or why nothing does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// One line: `0000:01:00.0: nvme -> vfio-pci`, `0000:02:00.0: already on vfio-pci`.
    pub title: String,
    pub steps: Vec<Step>,
}

impl Item {
    pub fn new(title: impl Into<String>, steps: Vec<Step>) -> Self {
        Self {
            title: title.into(),
            steps,
        }
    }
}

/// Everything `setup` will do, in order, and what it warns about.
#[derive(Debug, Default)]
pub struct Plan {
    pub items: Vec<Item>,
    pub warnings: Vec<String>,
}

impl Plan {
    /// Whether carrying it out changes anything.
    pub fn changes_anything(&self) -> bool {
        self.items.iter().any(|item| !item.steps.is_empty())
    }
}

impl fmt::Display for Plan {
    /// The items, each followed by the commands that do it by hand, indented.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for item in &self.items {
            writeln!(f, "{}", item.title)?;
            for line in item.steps.iter().filter_map(Step::command_line) {
                writeln!(f, "  {line}")?;
            }
        }
        Ok(())
    }
}

/// Where the plan is carried out: the real system (modules are loaded, file systems mounted, and
/// the drivers that the kernel bound are checked), or a fake tree, where only files are written.
#[derive(Debug, Clone)]
pub struct Host {
    pub root: PathBuf,
    /// Whether `root` is `/`, the running kernel's sysfs and procfs.
    pub real: bool,
}

impl Host {
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_owned(),
            real: root == Path::new("/"),
        }
    }

    /// Carries out `item`, printing its title first. Stops at the first failed step: the
    /// error says which step and what state that leaves.
    pub fn execute(&self, item: &Item, out: &mut dyn Write) -> Result<()> {
        writeln!(out, "{}", item.title)?;
        for step in &item.steps {
            self.step(step).map_err(|e| {
                let what = step
                    .command_line()
                    .map_or_else(String::new, |c| format!("`{c}`: "));
                anyhow!(
                    "{}: {what}{e}; see `dmesg`, and `usnvme setup status` for where things stand",
                    subject(&item.title)
                )
            })?;
        }
        Ok(())
    }

    fn step(&self, step: &Step) -> Result<()> {
        match step {
            Step::Modprobe(module) => self.command("modprobe", &[module]),
            Step::MountHugetlbfs(target) => {
                if self.real {
                    fs::create_dir_all(target)?;
                }
                self.command("mount", &["-t", "hugetlbfs", "nodev", target])
            }
            Step::Write { file, value } => {
                // No `create`: a sysfs file that is not there is an error, not a new file.
                let mut f = fs::OpenOptions::new()
                    .write(true)
                    .truncate(true)
                    .open(self.root.join(file))?;
                // One write call: sysfs takes the value in one piece.
                f.write_all(format!("{value}\n").as_bytes())?;
                Ok(())
            }
            Step::ExpectDriver { device, driver } => {
                if !self.real {
                    return Ok(());
                }
                let now = driver_of(&self.root.join(device));
                if now != *driver {
                    bail!("the kernel left it on {now}, not {driver}");
                }
                Ok(())
            }
            Step::ExpectHugepages { file, count } => {
                let got = read_count(&self.root.join(file))?;
                if got < *count {
                    bail!(
                        "asked for {count} hugepages, the kernel reserved {got}: memory is short or \
                         fragmented; free some (e.g. `echo 3 > /proc/sys/vm/drop_caches`) and retry, \
                         or reserve them at boot (`hugepages={count}` on the kernel command line)"
                    );
                }
                Ok(())
            }
        }
    }

    /// Runs `program args` on the real system; on a fake tree, only the plan records it.
    fn command(&self, program: &str, args: &[&str]) -> Result<()> {
        if !self.real {
            return Ok(());
        }
        let output = Command::new(program)
            .args(args)
            .output()
            .map_err(|e| anyhow!("cannot run {program}: {e}"))?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            bail!(
                "{program} failed ({}): {}",
                output.status,
                stderr.lines().next().unwrap_or("no message")
            );
        }
        Ok(())
    }
}

/// `0000:01:00.0` from `0000:01:00.0: nvme -> vfio-pci`.
fn subject(title: &str) -> &str {
    title.split_once(": ").map_or(title, |(subject, _)| subject)
}

// ---------------------------------------------------------------------------------------------
// Which drives
// ---------------------------------------------------------------------------------------------

/// The drives named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    All,
    Address(PciAddress),
}

impl std::str::FromStr for Target {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "all" {
            return Ok(Target::All);
        }
        s.parse().map(Target::Address).map_err(|e| e.to_string())
    }
}

/// The controllers `targets` name: all of them, or each named one (every name that is not an
/// NVMe controller is an error, reported together).
pub fn resolve(sysfs: &Sysfs, targets: &[Target]) -> Result<Vec<NvmeControllerInfo>> {
    if targets.contains(&Target::All) {
        let all = sysfs.list_nvme_controllers()?;
        if all.is_empty() {
            bail!("no NVMe controllers found (see `lspci -d ::0108`): nothing to do");
        }
        return Ok(all);
    }
    let addresses: BTreeSet<PciAddress> = targets
        .iter()
        .filter_map(|t| match t {
            Target::Address(a) => Some(*a),
            Target::All => None,
        })
        .collect();
    let mut found = Vec::new();
    let mut failures = Vec::new();
    for address in addresses {
        match sysfs.device(address) {
            Ok(c) => found.push(c),
            Err(e) => failures.push(anyhow::Error::new(e)),
        }
    }
    refuse(failures)?;
    Ok(found)
}

/// An error holding every refusal (one line each), or `Ok` if there is none.
fn refuse(mut failures: Vec<anyhow::Error>) -> Result<()> {
    match failures.pop() {
        None => Ok(()),
        Some(only) if failures.is_empty() => Err(only),
        Some(last) => {
            failures.push(last);
            Err(crate::open::Failures(failures).into())
        }
    }
}

// ---------------------------------------------------------------------------------------------
// bind and reset
// ---------------------------------------------------------------------------------------------

/// The steps that move the device at `address` from `from` to `to`.
fn rebind_steps(sysfs: &Sysfs, address: PciAddress, from: &Driver, to: &Driver) -> Vec<Step> {
    let dir = rel(sysfs, &sysfs.pci_device_path(address));
    // `nvme` takes no override: clearing it lets the kernel match the device by its class.
    let wanted = match to {
        Driver::Nvme => "",
        other => other.name().unwrap_or_default(),
    };
    let now =
        fs::read_to_string(sysfs.root().join(&dir).join("driver_override")).unwrap_or_default();
    let set = match now.trim() {
        "(null)" => "",
        other => other,
    };
    let mut steps = Vec::new();
    if set != wanted {
        steps.push(Step::Write {
            file: dir.join("driver_override"),
            value: wanted.to_owned(),
        });
    }
    if *from != Driver::None {
        steps.push(Step::Write {
            file: dir.join("driver/unbind"),
            value: address.to_string(),
        });
    }
    steps.push(Step::Write {
        file: PathBuf::from("sys/bus/pci/drivers_probe"),
        value: address.to_string(),
    });
    steps.push(Step::ExpectDriver {
        device: dir,
        driver: to.clone(),
    });
    steps
}

/// `modprobe` of the driver's module when its sysfs directory is missing.
fn load_driver(sysfs: &Sysfs, module: &'static str) -> Option<Item> {
    let dir = sysfs.root().join("sys/bus/pci/drivers").join(module);
    (!dir.is_dir()).then(|| {
        Item::new(
            format!("{module}: not loaded"),
            vec![Step::Modprobe(module)],
        )
    })
}

/// `bind`: each drive onto vfio-pci, unless something uses it or its IOMMU group cannot go
/// whole to VFIO.
pub fn bind(
    sysfs: &Sysfs,
    controllers: &[NvmeControllerInfo],
    all: bool,
    iommu: &IommuState,
) -> Result<Vec<Item>> {
    let pending: Vec<&NvmeControllerInfo> = controllers
        .iter()
        .filter(|c| c.driver != Driver::VfioPci)
        .collect();
    if !pending.is_empty() && !iommu.is_on() {
        bail!("{}", iommu.off_error());
    }
    // One scan of the block devices, mounts and swap for all the drives.
    let usage = UsageScan::new(sysfs.root());
    let mut reasons: Vec<(PciAddress, String)> = pending
        .iter()
        .map(|c| {
            let blocks = usage.block_devices_of(&sysfs.pci_device_path(c.address));
            (c.address, uses(sysfs.root(), &blocks))
        })
        .filter(|(_, uses)| !uses.is_empty())
        .map(|(a, uses)| (a, uses.join("; ")))
        .collect();
    // Whole groups only: every other device of the group must be VFIO-safe already, or be a
    // drive that this same plan binds.
    let binding: BTreeSet<PciAddress> = pending
        .iter()
        .map(|c| c.address)
        .filter(|a| !reasons.iter().any(|(r, _)| r == a))
        .collect();
    for c in pending.iter().filter(|c| binding.contains(&c.address)) {
        if let Some(reason) = group_problem(sysfs, c, &binding) {
            reasons.push((c.address, reason));
        }
    }
    moves(sysfs, controllers, &Driver::VfioPci, &reasons, all)
}

/// `reset`: each drive back to the kernel `nvme` driver, unless a usnvme process owns it (its
/// owner lock names it, as a second usnvme process is told) or a process has its VFIO group open
/// (unbinding would block until it lets go).
pub fn reset(sysfs: &Sysfs, controllers: &[NvmeControllerInfo], all: bool) -> Result<Vec<Item>> {
    let mut reasons: Vec<(PciAddress, String)> = Vec::new();
    let lock_dirs = lock::lock_dirs(sysfs.root());
    for c in controllers.iter().filter(|c| c.driver != Driver::Nvme) {
        if let Some(owner) = lock::holder(&lock_dirs, c.address) {
            reasons.push((c.address, format!("in use by {owner}: stop it first")));
            continue;
        }
        let Some(group) = c.iommu_group else { continue };
        let users = vfio_users(sysfs.root(), group);
        if !users.is_empty() {
            let users = users.join(", ");
            reasons.push((
                c.address,
                format!("{users} has /dev/vfio/{group} open: stop it first"),
            ));
        }
    }
    moves(sysfs, controllers, &Driver::Nvme, &reasons, all)
}

/// The items that move `controllers` to `to`, but for those with a reason not to. Named drives
/// (`all` false) with a reason are refused, all together, before anything changes; with `all`,
/// they are left as they are, and the plan says why.
fn moves(
    sysfs: &Sysfs,
    controllers: &[NvmeControllerInfo],
    to: &Driver,
    reasons: &[(PciAddress, String)],
    all: bool,
) -> Result<Vec<Item>> {
    if !all {
        refuse(
            reasons
                .iter()
                .map(|(a, reason)| anyhow!("refusing {a}: {reason}"))
                .collect(),
        )?;
    }
    let reason = |a: PciAddress| reasons.iter().find(|(r, _)| *r == a).map(|(_, why)| why);
    let moving = controllers
        .iter()
        .any(|c| c.driver != *to && reason(c.address).is_none());
    let module = if *to == Driver::Nvme {
        "nvme"
    } else {
        "vfio-pci"
    };
    let mut items: Vec<Item> = Vec::new();
    if moving {
        items.extend(load_driver(sysfs, module));
    }
    for c in controllers {
        let title = |what: String| format!("{}: {what}", c.address);
        items.push(if c.driver == *to {
            Item::new(title(format!("already on {to}")), Vec::new())
        } else if let Some(why) = reason(c.address) {
            Item::new(title(format!("left on {}: {why}", c.driver)), Vec::new())
        } else {
            let steps = rebind_steps(sysfs, c.address, &c.driver, to);
            Item::new(title(format!("{} -> {to}", c.driver)), steps)
        });
    }
    Ok(items)
}

// ---------------------------------------------------------------------------------------------
// What stops a drive from moving
// ---------------------------------------------------------------------------------------------

/// What uses a drive's block devices `blocks`, each with what to do about it; empty if nothing
/// does.
fn uses(root: &Path, blocks: &[BlockDeviceInfo]) -> Vec<String> {
    let swaps = swap_paths(root);
    let mut uses = Vec::new();
    for b in blocks {
        let name = &b.name;
        if b.mounted_at.iter().any(|m| m == "/") {
            uses.push(format!(
                "{name} holds the root file system: it is the system disk, leave it on nvme"
            ));
        }
        let mounts: Vec<&str> = b
            .mounted_at
            .iter()
            .map(String::as_str)
            .filter(|m| *m != "/")
            .collect();
        if let Some(first) = mounts.first() {
            uses.push(format!(
                "{name} is mounted at {}: unmount it first (umount {first})",
                mounts.join(", ")
            ));
        }
        if b.swap {
            let paths: Vec<&str> = swaps
                .iter()
                .filter(|p| {
                    device_names(b)
                        .iter()
                        .any(|n| p.rsplit('/').next() == Some(n))
                })
                .map(String::as_str)
                .collect();
            let what = if paths.is_empty() {
                "the device listed in /proc/swaps".to_owned()
            } else {
                paths.join(" ")
            };
            uses.push(format!(
                "{name} is active swap: turn it off first (swapoff {what})"
            ));
        }
        for holder in &b.holders {
            let (what, fix) = describe_holder(root, holder);
            uses.push(format!("{name} is held by {what}: {fix}"));
        }
    }
    uses
}

/// The disk and its partitions.
fn device_names(b: &BlockDeviceInfo) -> Vec<&str> {
    std::iter::once(b.name.as_str())
        .chain(b.partitions.iter().map(String::as_str))
        .collect()
}

/// The swap areas of `proc/swaps`, as listed (`/dev/nvme0n1p2`).
fn swap_paths(root: &Path) -> Vec<String> {
    let text = fs::read_to_string(root.join("proc/swaps")).unwrap_or_default();
    text.lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// What the holder `name` (`dm-0`, `md0`) is, and how to let go of the disk.
fn describe_holder(root: &Path, name: &str) -> (String, String) {
    if name.starts_with("md") {
        return (
            format!("md RAID {name}"),
            format!("stop it first (mdadm --stop /dev/{name})"),
        );
    }
    let dm = root.join("sys/block").join(name).join("dm");
    let read = |file: &str| {
        fs::read_to_string(dm.join(file))
            .ok()
            .map(|s| s.trim().to_owned())
    };
    match (read("uuid"), read("name")) {
        (Some(uuid), Some(dm_name)) if uuid.starts_with("LVM-") => (
            format!("LVM volume {dm_name} ({name})"),
            "deactivate its volume group first (vgchange -an VG)".to_owned(),
        ),
        (Some(uuid), Some(dm_name)) if uuid.starts_with("CRYPT-") => (
            format!("dm-crypt volume {dm_name} ({name})"),
            format!("close it first (cryptsetup close {dm_name})"),
        ),
        (_, Some(dm_name)) => (
            format!("device-mapper device {dm_name} ({name})"),
            format!("remove it first (dmsetup remove {dm_name})"),
        ),
        _ => (
            name.to_owned(),
            "stop what uses it first (see `lsblk`)".to_owned(),
        ),
    }
}

/// Why the drive's IOMMU group cannot go whole to VFIO if `binding` are bound; `None` if it can.
fn group_problem(
    sysfs: &Sysfs,
    c: &NvmeControllerInfo,
    binding: &BTreeSet<PciAddress>,
) -> Option<String> {
    let Some(group) = c.iommu_group else {
        return Some(
            "it has no IOMMU group (no IOMMU translates its DMA), so VFIO cannot take it".into(),
        );
    };
    let others: Vec<String> = c
        .iommu_group_blockers
        .iter()
        .filter(|b| {
            !b.device
                .parse::<PciAddress>()
                .is_ok_and(|a| binding.contains(&a))
        })
        .map(|b| {
            let is_nvme = b
                .device
                .parse()
                .is_ok_and(|a: PciAddress| sysfs.device(a).is_ok());
            if is_nvme {
                format!(
                    "NVMe controller {} (on {}): bind it too",
                    b.device, b.driver
                )
            } else {
                format!(
                    "{} on {}, which usnvme does not unbind: put the drive in a slot with its \
                     own group (ACS)",
                    b.device, b.driver
                )
            }
        })
        .collect();
    (!others.is_empty()).then(|| {
        format!(
            "VFIO takes whole IOMMU groups and group {group} also holds {}",
            others.join(", and ")
        )
    })
}

/// The processes that have `/dev/vfio/GROUP` open, as `usnvme (pid 1234)`.
fn vfio_users(root: &Path, group: u32) -> Vec<String> {
    let wanted = PathBuf::from(format!("/dev/vfio/{group}"));
    let Ok(procs) = fs::read_dir(root.join("proc")) else {
        return Vec::new();
    };
    let mut users = Vec::new();
    for entry in procs.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        // Other users' processes cannot be read without root: they are skipped.
        let Ok(fds) = fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        if fds
            .flatten()
            .any(|fd| fs::read_link(fd.path()).is_ok_and(|t| t == wanted))
        {
            let comm = fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            users.push(format!("{} (pid {pid})", comm.trim()));
        }
    }
    users.sort();
    users
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// `path` relative to the root of `sysfs`.
fn rel(sysfs: &Sysfs, path: &Path) -> PathBuf {
    path.strip_prefix(sysfs.root())
        .map_or_else(|_| path.to_owned(), Path::to_owned)
}

fn driver_of(device_dir: &Path) -> Driver {
    fs::read_link(device_dir.join("driver"))
        .ok()
        .and_then(|t| t.file_name()?.to_str().map(Driver::from_name))
        .unwrap_or(Driver::None)
}

/// A number in a sysfs file.
pub fn read_count(path: &Path) -> Result<u64> {
    let text =
        fs::read_to_string(path).map_err(|e| anyhow!("cannot read {}: {e}", path.display()))?;
    text.trim()
        .parse()
        .map_err(|_| anyhow!("{} holds {:?}, not a number", path.display(), text.trim()))
}

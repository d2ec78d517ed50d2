//! PCI discovery through sysfs.
//!
//! Finds the NVMe controllers (PCI class `0x0108xx`) and, for each, what `usnvme list` shows and
//! what `usnvme setup` checks before it rebinds a drive: the driver it is bound to, its NUMA node,
//! its IOMMU group and whether VFIO can use that group, and its PCIe link. (Which kernel block
//! devices sit on a controller bound to `nvme`, and whether they are in use, is the tools' concern:
//! `usnvme list` and `usnvme setup` find them under [`Sysfs::pci_device_path`].)
//!
//! Everything is read under a root directory (`/` by default), so tests run on a fake tree (the
//! `fake` module, behind the `fake-sysfs` feature). Only the PCI device list is essential: any
//! other attribute that is missing, unreadable or odd (QEMU's emulated devices report some unusual
//! values) degrades to `None`/unknown instead of failing the listing.

#[cfg(any(test, feature = "fake-sysfs"))]
pub mod fake;
pub mod uevent;

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Serialize, Serializer};

/// The PCI base class and subclass of NVM Express controllers (mass storage, non-volatile memory),
/// i.e. the `class` attribute shifted right by 8 (the low byte is the programming interface).
pub const NVME_CLASS: u32 = 0x0108;

/// Classes of PCI-to-PCI bridges (normal and semi-transparent): they do no DMA of their own, so
/// VFIO accepts them in a group whatever they are bound to.
const BRIDGE_CLASSES: [u32; 2] = [0x0604, 0x0609];

// ---------------------------------------------------------------------------------------------
// PCI addresses
// ---------------------------------------------------------------------------------------------

/// A PCI function address, `domain:bus:device.function`, e.g. `0000:01:00.0`.
///
/// Parses the full form and the short `01:00.0` form (domain 0); displays the full form, as sysfs
/// names devices. Orders by domain, bus, device, function. Serializes as its string form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress {
    domain: u32,
    bus: u8,
    device: u8,
    function: u8,
}

impl PciAddress {
    /// An address from its parts; `None` if `device > 0x1f` or `function > 7`.
    pub const fn new(domain: u32, bus: u8, device: u8, function: u8) -> Option<Self> {
        if device > 0x1f || function > 7 {
            return None;
        }
        Some(Self {
            domain,
            bus,
            device,
            function,
        })
    }

    /// The PCI domain (segment); above `0xffff` for devices behind Intel VMD.
    pub const fn domain(&self) -> u32 {
        self.domain
    }

    /// The bus number.
    pub const fn bus(&self) -> u8 {
        self.bus
    }

    /// The device number, `0..=0x1f`.
    pub const fn device(&self) -> u8 {
        self.device
    }

    /// The function number, `0..=7`.
    pub const fn function(&self) -> u8 {
        self.function
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

/// Why a string is not a PCI address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid PCI address {input:?}: {reason}; expected DDDD:BB:DD.F (like 0000:01:00.0) or BB:DD.F (like 01:00.0)"
)]
pub struct AddressParseError {
    input: String,
    reason: &'static str,
}

impl AddressParseError {
    /// The string that failed to parse.
    pub fn input(&self) -> &str {
        &self.input
    }

    /// What is wrong with it.
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

/// Parses `digits` as hexadecimal if it has between `min` and `max` hex digits (no sign, no `0x`).
fn parse_hex_field(digits: &str, min: usize, max: usize) -> Option<u32> {
    if digits.len() < min || digits.len() > max || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(digits, 16).ok()
}

impl FromStr for PciAddress {
    type Err = AddressParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason| AddressParseError {
            input: s.to_owned(),
            reason,
        };
        let (rest, function) = s
            .rsplit_once('.')
            .ok_or_else(|| err("the `.function` part is missing"))?;
        let fields: Vec<&str> = rest.split(':').collect();
        let (domain, bus, device) = match fields[..] {
            [bus, device] => ("0", bus, device),
            [domain, bus, device] => (domain, bus, device),
            _ => return Err(err("expected 2 or 3 `:`-separated fields before the `.`")),
        };
        let domain = parse_hex_field(domain, 1, 8)
            .ok_or_else(|| err("the domain must be 1 to 8 hex digits"))?;
        let bus = parse_hex_field(bus, 2, 2)
            .and_then(|b| u8::try_from(b).ok())
            .ok_or_else(|| err("the bus must be 2 hex digits"))?;
        let device = parse_hex_field(device, 2, 2)
            .and_then(|d| u8::try_from(d).ok())
            .filter(|&d| d <= 0x1f)
            .ok_or_else(|| err("the device must be 2 hex digits, 00 to 1f"))?;
        let function = parse_hex_field(function, 1, 1)
            .and_then(|f| u8::try_from(f).ok())
            .filter(|&f| f <= 7)
            .ok_or_else(|| err("the function must be 1 digit, 0 to 7"))?;
        Ok(Self {
            domain,
            bus,
            device,
            function,
        })
    }
}

impl Serialize for PciAddress {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

// ---------------------------------------------------------------------------------------------
// What sysfs tells about a controller
// ---------------------------------------------------------------------------------------------

/// The kernel driver a PCI device is bound to (the basename of its `driver` symlink).
///
/// Displays and serializes as the driver's name (`"nvme"`, `"vfio-pci"`, ...); an unbound device
/// displays as `none` and serializes as `null`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Driver {
    /// The kernel NVMe driver: the drive's namespaces are block devices.
    Nvme,
    /// `vfio-pci`: the drive is ready for this userspace driver.
    VfioPci,
    /// Bound to no driver.
    None,
    /// Any other driver (`pci-stub`, `uio_pci_generic`, a VFIO variant driver, ...).
    Other(String),
}

impl Driver {
    /// The driver called `name` in sysfs.
    pub fn from_name(name: &str) -> Self {
        match name {
            "nvme" => Self::Nvme,
            "vfio-pci" => Self::VfioPci,
            "" => Self::None,
            other => Self::Other(other.to_owned()),
        }
    }

    /// The driver's name as sysfs spells it; `None` when unbound.
    pub fn name(&self) -> Option<&str> {
        match self {
            Self::Nvme => Some("nvme"),
            Self::VfioPci => Some("vfio-pci"),
            Self::None => None,
            Self::Other(name) => Some(name),
        }
    }

    /// Whether a device bound to this driver lets VFIO use its IOMMU group: VFIO drivers,
    /// `pci-stub`, `pcieport` (it claims no DMA) or no driver at all.
    fn leaves_group_viable(&self) -> bool {
        match self {
            Self::VfioPci | Self::None => true,
            Self::Nvme => false,
            Self::Other(name) => name == "pci-stub" || name == "pcieport" || name.contains("vfio"),
        }
    }
}

impl fmt::Display for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name().unwrap_or("none"))
    }
}

impl Serialize for Driver {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.name().serialize(serializer)
    }
}

/// One end of a PCIe link's state: speed and width, each unknown when sysfs lacks it or reports
/// something unusable (`Unknown`, width 0, no PCIe capability).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LinkState {
    /// Transfer rate per lane in GT/s (2.5, 5, 8, 16, 32, 64).
    pub speed_gts: Option<f64>,
    /// Number of lanes.
    pub width: Option<u32>,
}

impl LinkState {
    /// Parses sysfs's `*_link_speed` (e.g. `32.0 GT/s PCIe`, `8 GT/s`, `Unknown`) and
    /// `*_link_width` (e.g. `4`) values.
    pub fn from_sysfs(speed: Option<&str>, width: Option<&str>) -> Self {
        Self {
            speed_gts: speed.and_then(parse_link_speed),
            width: width.and_then(parse_link_width),
        }
    }

    /// Whether neither speed nor width is known.
    pub fn is_unknown(&self) -> bool {
        self.speed_gts.is_none() && self.width.is_none()
    }
}

fn parse_link_speed(s: &str) -> Option<f64> {
    let mut words = s.split_whitespace();
    let speed: f64 = words.next()?.parse().ok()?;
    (words.next() == Some("GT/s") && speed.is_finite() && speed > 0.0).then_some(speed)
}

fn parse_link_width(s: &str) -> Option<u32> {
    // The widths PCIe defines; QEMU and odd firmware may report 0 or garbage.
    s.trim()
        .parse()
        .ok()
        .filter(|w| [1, 2, 4, 8, 12, 16, 32].contains(w))
}

impl fmt::Display for LinkState {
    /// `32 GT/s x4`; `32 GT/s` or `x4` when half is unknown; `-` when all is.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.speed_gts, self.width) {
            (Some(speed), Some(width)) => write!(f, "{speed} GT/s x{width}"),
            (Some(speed), None) => write!(f, "{speed} GT/s"),
            (None, Some(width)) => write!(f, "x{width}"),
            (None, None) => f.write_str("-"),
        }
    }
}

/// A controller's PCIe link: what it trained to and what it is capable of.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LinkInfo {
    /// `current_link_speed` and `current_link_width`.
    pub current: LinkState,
    /// `max_link_speed` and `max_link_width`.
    pub max: LinkState,
}

impl LinkInfo {
    /// Whether the link trained below what the device can do (a Gen5 drive in a Gen4 slot, a
    /// x4 drive on 2 lanes): known only when both ends are.
    pub fn is_downgraded(&self) -> bool {
        let below =
            |cur: Option<f64>, max: Option<f64>| matches!((cur, max), (Some(c), Some(m)) if c < m);
        below(self.current.speed_gts, self.max.speed_gts)
            || below(
                self.current.width.map(f64::from),
                self.max.width.map(f64::from),
            )
    }
}

impl fmt::Display for LinkInfo {
    /// `32 GT/s x4 / 32 GT/s x4` (current / max); `-` when nothing is known.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.current.is_unknown() && self.max.is_unknown() {
            return f.write_str("-");
        }
        write!(f, "{} / {}", self.current, self.max)
    }
}

/// Another device in a controller's IOMMU group that keeps VFIO from using the group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupBlocker {
    /// Its sysfs name: a PCI address for PCI devices.
    pub device: String,
    /// The driver it is bound to.
    pub driver: Driver,
}

impl fmt::Display for GroupBlocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on {}", self.device, self.driver)
    }
}

/// Everything discovery knows about one NVMe controller.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NvmeControllerInfo {
    /// Its PCI address.
    pub address: PciAddress,
    /// The 24-bit class code, `0x0108xx`.
    pub class: u32,
    /// PCI vendor ID (`1b36` for QEMU).
    pub vendor_id: Option<u16>,
    /// PCI device ID (`0010` for QEMU's NVMe).
    pub device_id: Option<u16>,
    /// PCI subsystem vendor ID.
    pub subsystem_vendor_id: Option<u16>,
    /// PCI subsystem device ID.
    pub subsystem_device_id: Option<u16>,
    /// The driver it is bound to.
    pub driver: Driver,
    /// Its NUMA node; `None` when the platform does not say (sysfs `-1`).
    pub numa_node: Option<u32>,
    /// Its IOMMU group; `None` without an IOMMU.
    pub iommu_group: Option<u32>,
    /// Whether VFIO can use the group once this controller is bound to `vfio-pci` (it may be
    /// already): every *other* device in it is a bridge, unbound, or bound to `vfio-pci`,
    /// `pci-stub` or `pcieport`. The controller's own driver is in [`Self::driver`]. `false`
    /// without a group.
    pub iommu_group_viable: bool,
    /// The other devices of the group that make it not viable.
    pub iommu_group_blockers: Vec<GroupBlocker>,
    /// Its PCIe link.
    pub link: LinkInfo,
}

/// Errors of PCI discovery.
#[derive(Debug, thiserror::Error)]
pub enum PciError {
    /// No device with this address.
    #[error("no PCI device at {0} (run `usnvme list` to see the NVMe controllers)")]
    NoDevice(PciAddress),
    /// The device is something else than an NVMe controller.
    #[error("{address} is not an NVMe controller (class {class:#08x}); run `usnvme list` to see the NVMe controllers")]
    NotNvme {
        /// The device.
        address: PciAddress,
        /// Its class code.
        class: u32,
    },
    /// A file or directory that discovery needs could not be read.
    #[error("cannot read {}: {source} (is sysfs mounted at /sys, and readable by this user?)", path.display())]
    Io {
        /// What could not be read.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A file that discovery needs holds something unexpected.
    #[error("unexpected contents {value:?} in {}: expected a hex number like 0x010802", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What it holds.
        value: String,
    },
}

// ---------------------------------------------------------------------------------------------
// Reading sysfs
// ---------------------------------------------------------------------------------------------

/// A view of sysfs and procfs under a root directory (`/` normally, a fake tree in tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sysfs {
    root: PathBuf,
}

impl Default for Sysfs {
    fn default() -> Self {
        Self::new()
    }
}

impl Sysfs {
    /// The real sysfs and procfs, under `/`.
    pub fn new() -> Self {
        Self::with_root("/")
    }

    /// Reads `sys/...` and `proc/...` under `root` instead of `/`.
    pub fn with_root(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The sysfs directory of the PCI device at `address` (`<root>/sys/bus/pci/devices/<address>`).
    pub fn pci_device_path(&self, address: PciAddress) -> PathBuf {
        self.pci_devices_dir().join(address.to_string())
    }

    fn pci_devices_dir(&self) -> PathBuf {
        self.root.join("sys/bus/pci/devices")
    }

    /// Every NVMe controller (class `0x0108xx`), sorted by address. A system without a PCI bus
    /// has none; devices whose class cannot be read are skipped (and logged).
    pub fn list_nvme_controllers(&self) -> Result<Vec<NvmeControllerInfo>, PciError> {
        let dir = self.pci_devices_dir();
        let io_err = |source| PciError::Io {
            path: dir.clone(),
            source,
        };
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                log::debug!("{} does not exist: no PCI devices", dir.display());
                return Ok(Vec::new());
            }
            Err(e) => return Err(io_err(e)),
        };
        let mut found = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io_err)?;
            let name = entry.file_name();
            let Some(address) = name.to_str().and_then(|n| n.parse::<PciAddress>().ok()) else {
                log::debug!(
                    "skipping {:?} in {}: not a PCI address",
                    name,
                    dir.display()
                );
                continue;
            };
            match attr(&entry.path(), "class").as_deref().and_then(parse_hex) {
                Some(class) if is_nvme_class(class) => found.push((address, class)),
                Some(_) => {}
                None => log::warn!("skipping PCI device {address}: cannot read its class"),
            }
        }
        found.sort_unstable();
        Ok(found
            .into_iter()
            .map(|(address, class)| self.describe(address, class))
            .collect())
    }

    /// The NVMe controller at `address`: an error if there is no device there or it is not an
    /// NVMe controller.
    pub fn device(&self, address: PciAddress) -> Result<NvmeControllerInfo, PciError> {
        let dir = self.pci_device_path(address);
        if fs::symlink_metadata(&dir).is_err() {
            return Err(PciError::NoDevice(address));
        }
        let class_path = dir.join("class");
        let value = read_attr(&class_path).map_err(|source| PciError::Io {
            path: class_path.clone(),
            source,
        })?;
        let class = parse_hex(&value).ok_or(PciError::Invalid {
            path: class_path,
            value,
        })?;
        if !is_nvme_class(class) {
            return Err(PciError::NotNvme { address, class });
        }
        Ok(self.describe(address, class))
    }

    fn describe(&self, address: PciAddress, class: u32) -> NvmeControllerInfo {
        let dir = self.pci_device_path(address);
        let hex16 = |name| {
            attr(&dir, name)
                .as_deref()
                .and_then(parse_hex)
                .and_then(|v| u16::try_from(v).ok())
        };
        let iommu_group = link_name(&dir.join("iommu_group")).and_then(|n| n.parse().ok());
        let (iommu_group_viable, iommu_group_blockers) = match iommu_group {
            Some(group) => group_blockers(&dir.join("iommu_group/devices"), address, group),
            None => (false, Vec::new()),
        };
        let link_state = |which| {
            LinkState::from_sysfs(
                attr(&dir, &format!("{which}_link_speed")).as_deref(),
                attr(&dir, &format!("{which}_link_width")).as_deref(),
            )
        };
        NvmeControllerInfo {
            address,
            class,
            vendor_id: hex16("vendor"),
            device_id: hex16("device"),
            subsystem_vendor_id: hex16("subsystem_vendor"),
            subsystem_device_id: hex16("subsystem_device"),
            driver: driver_of(&dir),
            numa_node: attr(&dir, "numa_node").as_deref().and_then(parse_numa_node),
            iommu_group,
            iommu_group_viable,
            iommu_group_blockers,
            link: LinkInfo {
                current: link_state("current"),
                max: link_state("max"),
            },
        }
    }
}

fn is_nvme_class(class: u32) -> bool {
    class >> 8 == NVME_CLASS
}

/// Reads a sysfs attribute, trimmed.
fn read_attr(path: &Path) -> io::Result<String> {
    fs::read_to_string(path).map(|s| s.trim().to_owned())
}

/// An optional attribute of the sysfs directory `dir`, trimmed: `None` if missing or unreadable.
pub fn attr(dir: &Path, name: &str) -> Option<String> {
    let path = dir.join(name);
    match read_attr(&path) {
        Ok(value) => Some(value),
        Err(e) => {
            if e.kind() != io::ErrorKind::NotFound {
                log::debug!("cannot read {}: {e}", path.display());
            }
            None
        }
    }
}

/// Parses `0x010802`-style hex (the `0x` is optional).
pub(crate) fn parse_hex(s: &str) -> Option<u32> {
    let digits = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    parse_hex_field(digits, 1, 8)
}

fn parse_numa_node(s: &str) -> Option<u32> {
    // `-1`: the platform did not say (no SRAT/_PXM, or a single node).
    s.parse::<i64>().ok().and_then(|n| u32::try_from(n).ok())
}

/// The basename of the symlink at `path` (a device's `driver`, `iommu_group`).
pub(crate) fn link_name(path: &Path) -> Option<String> {
    let target = fs::read_link(path).ok()?;
    target.file_name()?.to_str().map(str::to_owned)
}

fn driver_of(device_dir: &Path) -> Driver {
    link_name(&device_dir.join("driver")).map_or(Driver::None, |name| Driver::from_name(&name))
}

/// The names of the entries of `dir`, in natural order (`nvme0n2` before `nvme0n10`); empty if
/// it cannot be read.
pub fn dir_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = match fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str().map(str::to_owned))
            .collect(),
        Err(_) => Vec::new(),
    };
    names.sort_by(|a, b| natural_cmp(a, b));
    names
}

/// Whether VFIO can use the group (see [`NvmeControllerInfo::iommu_group_viable`]), and the
/// other devices in `devices_dir` that prevent it.
fn group_blockers(devices_dir: &Path, me: PciAddress, group: u32) -> (bool, Vec<GroupBlocker>) {
    if let Err(e) = fs::read_dir(devices_dir) {
        log::warn!(
            "cannot read the members of IOMMU group {group} ({}): {e}",
            devices_dir.display()
        );
        return (false, Vec::new());
    }
    let blockers: Vec<GroupBlocker> = dir_names(devices_dir)
        .into_iter()
        .filter(|name| name.parse::<PciAddress>().ok() != Some(me))
        .filter_map(|name| {
            let dir = devices_dir.join(&name);
            let class = attr(&dir, "class").as_deref().and_then(parse_hex);
            let is_bridge = class.is_some_and(|c| BRIDGE_CLASSES.contains(&(c >> 8)));
            let driver = driver_of(&dir);
            (!is_bridge && !driver.leaves_group_viable()).then_some(GroupBlocker {
                device: name,
                driver,
            })
        })
        .collect();
    (blockers.is_empty(), blockers)
}

/// Compares strings with embedded numbers numerically: `nvme0n2` < `nvme0n10`.
pub fn natural_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    fn chunks(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = 0;
        let bytes = s.as_bytes();
        for i in 1..=bytes.len() {
            if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
                out.push((bytes[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    let key = |s| {
        chunks(s)
            .into_iter()
            .map(|(digits, c)| {
                if digits {
                    (c.trim_start_matches('0').len(), c)
                } else {
                    (0, c)
                }
            })
            .collect::<Vec<_>>()
    };
    key(a).cmp(&key(b)).then_with(|| a.cmp(b))
}

#[cfg(test)]
mod tests {
    use super::fake::FakeSysfs;
    use super::*;

    fn addr(s: &str) -> PciAddress {
        s.parse().expect("valid address")
    }

    #[test]
    fn address_parse_display_order() {
        assert_eq!(addr("0000:01:00.0").to_string(), "0000:01:00.0");
        assert_eq!(addr("01:00.0"), addr("0000:01:00.0"));
        assert_eq!(addr("10000:e1:1f.7").to_string(), "10000:e1:1f.7");
        assert_eq!(
            addr("0000:AB:0c.3"),
            PciAddress::new(0, 0xab, 0x0c, 3).expect("valid")
        );
        assert!(addr("0000:01:00.1") < addr("0000:02:00.0"));
        assert!(addr("0000:ff:00.0") < addr("0001:00:00.0"));
        assert!(PciAddress::new(0, 0, 0x20, 0).is_none());
    }

    #[test]
    fn address_errors_say_what_is_wrong() {
        for (input, reason) in [
            ("", "`.function`"),
            ("0000:01:00", "`.function`"),
            ("0000:01:00.8", "function"),
            ("0000:01:20.0", "device"),
            ("0000:1:00.0", "bus"),
            ("0000:0g:00.0", "bus"),
            ("x:01:00.0", "domain"),
            ("0:0:01:00.0", "fields"),
            ("01.0", "fields"),
            ("0000:01:+0.0", "device"),
        ] {
            let err = input.parse::<PciAddress>().expect_err(input);
            assert!(err.reason().contains(reason), "{input}: {err}");
            let msg = err.to_string();
            assert!(
                msg.contains(&format!("{input:?}")) && msg.contains("0000:01:00.0"),
                "{msg}"
            );
        }
    }

    #[test]
    fn lists_only_nvme_controllers_sorted() {
        let fake = FakeSysfs::new();
        fake.add_nvme_controller("0000:03:00.0");
        fake.add_nvme_controller("0000:01:00.0");
        fake.add_pci_device("0000:00:1f.2", 0x010601, 0x8086, 0x2922); // AHCI
        fake.add_pci_device("0000:00:02.0", 0x030000, 0x1234, 0x1111); // VGA
        fake.add_pci_device("0000:02:00.0", 0x010800, 0x1234, 0x5678); // NVMHCI prog-if
        fake.add_pci_device("0000:04:00.0", 0x010802, 0x1234, 0x5678)
            .attr("class", "garbage");
        fake.mkdir("sys/bus/pci/devices/not-an-address");
        let list = fake.sysfs().list_nvme_controllers().expect("list");
        let addrs: Vec<String> = list.iter().map(|c| c.address.to_string()).collect();
        assert_eq!(addrs, ["0000:01:00.0", "0000:02:00.0", "0000:03:00.0"]);
        let c = &list[0];
        assert_eq!(
            (c.class, c.vendor_id, c.device_id),
            (0x010802, Some(0x1b36), Some(0x0010))
        );
        assert_eq!((c.subsystem_vendor_id, c.subsystem_device_id), (None, None));
        assert_eq!(c.driver, Driver::None);
        assert_eq!(
            (c.numa_node, c.iommu_group, c.iommu_group_viable),
            (None, None, false)
        );
        assert_eq!(c.link, LinkInfo::default());
    }

    #[test]
    fn no_pci_bus_means_no_controllers() {
        let fake = FakeSysfs::new();
        assert!(fake
            .sysfs()
            .list_nvme_controllers()
            .expect("list")
            .is_empty());
    }

    #[test]
    fn unreadable_pci_dir_is_an_error() {
        let fake = FakeSysfs::new();
        fake.write("sys/bus/pci/devices", "not a directory");
        let err = fake.sysfs().list_nvme_controllers().expect_err("not a dir");
        assert!(err.to_string().contains("sys/bus/pci/devices"), "{err}");
    }

    #[test]
    fn driver_symlink_kinds() {
        let fake = FakeSysfs::new();
        fake.add_nvme_controller("0000:01:00.0").bind("nvme");
        fake.add_nvme_controller("0000:02:00.0").bind("vfio-pci");
        fake.add_nvme_controller("0000:03:00.0");
        fake.add_nvme_controller("0000:04:00.0")
            .bind("uio_pci_generic");
        let list = fake.sysfs().list_nvme_controllers().expect("list");
        let drivers: Vec<Driver> = list.into_iter().map(|c| c.driver).collect();
        assert_eq!(
            drivers,
            [
                Driver::Nvme,
                Driver::VfioPci,
                Driver::None,
                Driver::Other("uio_pci_generic".into())
            ]
        );
        assert_eq!(Driver::None.to_string(), "none");
        assert_eq!(Driver::from_name("vfio-pci"), Driver::VfioPci);
        assert_eq!(Driver::Other("pci-stub".into()).name(), Some("pci-stub"));
    }

    #[test]
    fn numa_node_minus_one_is_unknown() {
        let fake = FakeSysfs::new();
        fake.add_nvme_controller("0000:01:00.0").numa_node("-1");
        fake.add_nvme_controller("0000:02:00.0").numa_node("1");
        fake.add_nvme_controller("0000:03:00.0").numa_node("bogus");
        fake.add_nvme_controller("0000:04:00.0");
        let list = fake.sysfs().list_nvme_controllers().expect("list");
        let nodes: Vec<Option<u32>> = list.iter().map(|c| c.numa_node).collect();
        assert_eq!(nodes, [None, Some(1), None, None]);
    }

    #[test]
    fn iommu_group_viability() {
        let fake = FakeSysfs::new();
        // Group 1: the controller, a bridge on pcieport, an unbound function, a pci-stub one.
        fake.add_nvme_controller("0000:01:00.0")
            .bind("vfio-pci")
            .iommu_group(1);
        fake.add_pci_device("0000:00:01.0", 0x060400, 0x8086, 0x1234)
            .bind("pcieport")
            .iommu_group(1);
        fake.add_pci_device("0000:01:00.1", 0x058000, 0x8086, 0x1234)
            .iommu_group(1);
        fake.add_pci_device("0000:01:00.2", 0x058000, 0x8086, 0x1234)
            .bind("pci-stub")
            .iommu_group(1);
        // Group 2: the controller (still on nvme) shares it with a NIC on e1000e.
        fake.add_nvme_controller("0000:02:00.0")
            .bind("nvme")
            .iommu_group(2);
        fake.add_pci_device("0000:02:00.1", 0x020000, 0x8086, 0x10d3)
            .bind("e1000e")
            .iommu_group(2);
        // Group 3: alone, on nvme: viable once rebound.
        fake.add_nvme_controller("0000:03:00.0")
            .bind("nvme")
            .iommu_group(3);
        // Group 4: two controllers, the other one still on nvme.
        fake.add_nvme_controller("0000:04:00.0")
            .bind("vfio-pci")
            .iommu_group(4);
        fake.add_nvme_controller("0000:04:00.1")
            .bind("nvme")
            .iommu_group(4);

        let list = fake.sysfs().list_nvme_controllers().expect("list");
        let by = |a: &str| list.iter().find(|c| c.address == addr(a)).expect("listed");
        let c1 = by("0000:01:00.0");
        assert_eq!((c1.iommu_group, c1.iommu_group_viable), (Some(1), true));
        assert!(c1.iommu_group_blockers.is_empty());
        let c2 = by("0000:02:00.0");
        assert_eq!((c2.iommu_group, c2.iommu_group_viable), (Some(2), false));
        assert_eq!(
            c2.iommu_group_blockers,
            [GroupBlocker {
                device: "0000:02:00.1".into(),
                driver: Driver::Other("e1000e".into())
            }]
        );
        assert_eq!(
            c2.iommu_group_blockers[0].to_string(),
            "0000:02:00.1 on e1000e"
        );
        assert_eq!(
            (
                by("0000:03:00.0").iommu_group,
                by("0000:03:00.0").iommu_group_viable
            ),
            (Some(3), true)
        );
        let c4 = by("0000:04:00.0");
        assert!(!c4.iommu_group_viable);
        assert_eq!(c4.iommu_group_blockers[0].device, "0000:04:00.1");
        assert_eq!(c4.iommu_group_blockers[0].driver, Driver::Nvme);
    }

    #[test]
    fn link_parsing_and_display() {
        let s = |speed, width| LinkState::from_sysfs(Some(speed), Some(width));
        assert_eq!(
            s("32.0 GT/s PCIe", "4"),
            LinkState {
                speed_gts: Some(32.0),
                width: Some(4)
            }
        );
        assert_eq!(s("2.5 GT/s PCIe", "1").to_string(), "2.5 GT/s x1");
        assert_eq!(s("8 GT/s", "16").to_string(), "8 GT/s x16");
        assert_eq!(s("Unknown", "0"), LinkState::default());
        assert_eq!(s("Unknown speed", "255").to_string(), "-");
        assert_eq!(s("32.0 GT/s PCIe", "").to_string(), "32 GT/s");
        assert_eq!(s("", "4").to_string(), "x4");
        assert_eq!(s("NaN GT/s", "4").speed_gts, None);
        assert_eq!(s("5.0 MT/s", "4").speed_gts, None);
        assert_eq!(LinkState::from_sysfs(None, None), LinkState::default());

        let fake = FakeSysfs::new();
        fake.add_nvme_controller("0000:01:00.0")
            .link("32.0 GT/s PCIe", "4", "32.0 GT/s PCIe", "4");
        fake.add_nvme_controller("0000:02:00.0")
            .link("16.0 GT/s PCIe", "4", "32.0 GT/s PCIe", "4");
        fake.add_nvme_controller("0000:03:00.0")
            .link("Unknown", "0", "Unknown", "0");
        fake.add_nvme_controller("0000:04:00.0"); // no PCIe capability: no attributes
        let list = fake.sysfs().list_nvme_controllers().expect("list");
        let shown: Vec<String> = list.iter().map(|c| c.link.to_string()).collect();
        assert_eq!(
            shown,
            [
                "32 GT/s x4 / 32 GT/s x4",
                "16 GT/s x4 / 32 GT/s x4",
                "-",
                "-"
            ]
        );
        let downgraded: Vec<bool> = list.iter().map(|c| c.link.is_downgraded()).collect();
        assert_eq!(downgraded, [false, true, false, false]);
    }

    #[test]
    fn device_by_address() {
        let fake = FakeSysfs::new();
        fake.add_nvme_controller("0000:01:00.0")
            .bind("vfio-pci")
            .numa_node("0");
        fake.add_pci_device("0000:00:02.0", 0x030000, 0x1234, 0x1111);
        let sysfs = fake.sysfs();
        let c = sysfs.device(addr("01:00.0")).expect("found");
        assert_eq!(
            (c.address, c.driver, c.numa_node),
            (addr("0000:01:00.0"), Driver::VfioPci, Some(0))
        );
        let err = sysfs.device(addr("0000:05:00.0")).expect_err("absent");
        assert!(matches!(err, PciError::NoDevice(_)));
        assert_eq!(
            err.to_string(),
            "no PCI device at 0000:05:00.0 (run `usnvme list` to see the NVMe controllers)"
        );
        let err = sysfs.device(addr("0000:00:02.0")).expect_err("not nvme");
        assert!(matches!(
            err,
            PciError::NotNvme {
                class: 0x030000,
                ..
            }
        ));
        assert!(
            err.to_string()
                .starts_with("0000:00:02.0 is not an NVMe controller (class 0x030000)"),
            "{err}"
        );
    }

    #[test]
    fn helpers() {
        assert_eq!(parse_hex("0x010802"), Some(0x010802));
        assert_eq!(parse_hex("0x"), None);
        assert_eq!(parse_hex("-0x1"), None);
        let mut v = vec!["nvme0n10", "nvme0n2", "nvme1n1", "nvme0n1", "sda"];
        v.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(v, ["nvme0n1", "nvme0n2", "nvme0n10", "nvme1n1", "sda"]);
    }
}

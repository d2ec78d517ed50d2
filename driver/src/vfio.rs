//! VFIO: one container for the whole process (so every drive shares one IOVA space and a buffer
//! can go to any drive), PCI functions bound to `vfio-pci`, their config space and BAR0.
//! The container and its DMA mappings come from `vfio-ioctls`. Groups and devices are opened
//! here, each file owned by one object and closed once: a group (shared by its open devices)
//! when the last of them is closed. vfio-ioctls' `VfioDevice` cannot be let go of after a hot
//! removal: its drop closes the device file, which lets the removal go on, then finds the group
//! again through the device's sysfs node (which may be gone by then: it unwraps, a panic) and
//! asks to detach it from the container, which the kernel has already done as the group's last
//! device went away (`vfio_device_remove_group`; seen on the test VM's 6.1): on that EINVAL it
//! keeps the group's file open for the process's lifetime.
//! Also here: the ioctl vfio-ioctls lacks (the IOMMU's valid IOVA ranges), and the one it
//! offers only as a method of its `VfioDevice` (`enable_irq`: wiring the device's request
//! interrupt, and its MSI-X vectors when a queue pair wants interrupts, to eventfds).
//!
//! Around each device:
//! - its owner lock (`lock.rs`), taken before the device is touched;
//! - its BAR0 in a process-wide table that [`disable_all_for_exit`] walks from a signal handler;
//! - a thread that waits for the kernel to ask for the device back (VFIO's request interrupt:
//!   hot removal, or an unbind): the device is then disabled, its BAR0 reads all ones from then
//!   on, and it is closed (its file, so that the removal can complete, then its group) and its
//!   lock let go. The controller's queue pairs see a removed device and fail their commands
//!   ("Host Pathing Error").

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::eventfd::{EfdFlags, EventFd};
use parking_lot::Mutex;

use crate::pci::{attr, link_name, parse_hex};
use usnvme_hugepages::{DmaMapper, IovaSpace, MapError};
use vfio_ioctls::VfioContainer;

use crate::lock::{LockError, OwnerLock};
use crate::mmio::Bar;
use crate::pci::PciAddress;
use crate::regs::{interrupt_eventfd, Interrupts, Registers};
use crate::spec::registers::reg;
use crate::spec::{Cap, Cc, Csts};

/// VFIO region indices of a PCI device.
const BAR0_REGION: u32 = 0;
const CONFIG_REGION: u32 = 7;

/// VFIO ioctls (`_IO(';', 100 + n)`) and their values.
const VFIO_SET_IOMMU: libc::c_ulong = 0x3b66;
const VFIO_GROUP_GET_STATUS: libc::c_ulong = 0x3b67;
const VFIO_GROUP_SET_CONTAINER: libc::c_ulong = 0x3b68;
const VFIO_GROUP_GET_DEVICE_FD: libc::c_ulong = 0x3b6a;
const VFIO_DEVICE_GET_REGION_INFO: libc::c_ulong = 0x3b6c;
const VFIO_DEVICE_GET_IRQ_INFO: libc::c_ulong = 0x3b6d;
const VFIO_DEVICE_SET_IRQS: libc::c_ulong = 0x3b6e;
const VFIO_IOMMU_GET_INFO: libc::c_ulong = 0x3b70;
const VFIO_TYPE1V2_IOMMU: libc::c_ulong = 3;
const VFIO_GROUP_FLAGS_VIABLE: u32 = 1;
/// Interrupt indices of a PCI device, and `vfio_irq_set` flags.
const VFIO_PCI_MSIX_IRQ_INDEX: u32 = 2;
const VFIO_PCI_REQ_IRQ_INDEX: u32 = 4;
const VFIO_IRQ_SET_DATA_EVENTFD: u32 = 1 << 2;
const VFIO_IRQ_SET_ACTION_TRIGGER: u32 = 1 << 5;
/// The largest MSI-X table PCI allows.
const MSIX_MAX_VECTORS: u32 = 2048;

/// PCI config space: command register bits, capability list.
const PCI_COMMAND: u64 = 0x04;
const CMD_MEMORY_SPACE: u16 = 1 << 1;
const CMD_BUS_MASTER: u16 = 1 << 2;
const CMD_INTX_DISABLE: u16 = 1 << 10;
const PCI_STATUS: u64 = 0x06;
const STATUS_CAP_LIST: u16 = 1 << 4;
const PCI_CAP_PTR: u64 = 0x34;
const CAP_ID_EXP: u8 = 0x10;

/// Without an IOVA range report, stay inside what every IOMMU takes (39 bits) and above 4 GiB.
const FALLBACK_IOVA: std::ops::Range<u64> = (1 << 32)..(1 << 39);

#[derive(Debug, thiserror::Error)]
pub enum VfioError {
    #[error("{addr}: no such PCI device (run `usnvme list` to see the NVMe controllers)")]
    NoDevice { addr: PciAddress },
    #[error("{addr} is not an NVMe controller (class {class:#08x}): usnvme drives NVMe controllers only")]
    NotNvme { addr: PciAddress, class: u32 },
    #[error("{addr} is bound to {driver}, not vfio-pci: run `usnvme setup bind {addr}`")]
    NotVfio { addr: PciAddress, driver: String },
    #[error("{addr} has no IOMMU group: enable the IOMMU (intel_iommu=on or amd_iommu=on on the kernel command line)")]
    NoIommuGroup { addr: PciAddress },
    #[error("{addr} is in IOMMU group {group}, which has devices not bound to vfio-pci: bind the whole group (`usnvme setup bind`)")]
    GroupNotViable { addr: PciAddress, group: String },
    #[error("cannot open /dev/vfio/vfio (load vfio-pci and run as root)")]
    Container(#[source] vfio_ioctls::VfioError),
    #[error(
        "{addr}: cannot open the VFIO device; is another process using it? ({what}: {source})"
    )]
    Device {
        addr: PciAddress,
        what: String,
        source: std::io::Error,
    },
    #[error("{addr}: BAR0 is {size} bytes, too small for an NVMe controller")]
    SmallBar { addr: PciAddress, size: u64 },
    #[error("{addr}: mapping BAR0 failed: {source}")]
    MapBar {
        addr: PciAddress,
        source: std::io::Error,
    },
    #[error(transparent)]
    Lock(#[from] LockError),
}

/// The process's VFIO container and the IOVA space every device opened through it shares.
pub struct Vfio {
    container: Arc<VfioContainer>,
    /// The groups attached to the container, by number, while a device of theirs is open; the
    /// lock also keeps attachments (and the container's IOMMU set-up) one at a time.
    groups: Mutex<HashMap<u32, Weak<Group>>>,
    space: OnceLock<Arc<IovaSpace>>,
    sysfs: PathBuf,
}

/// An IOMMU group attached to the container. Closing its file (when its last open device is
/// closed) detaches it, unless the removal of its last device did already.
#[derive(Debug)]
struct Group {
    file: File,
}

impl std::fmt::Debug for Vfio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vfio").field("sysfs", &self.sysfs).finish()
    }
}

impl Vfio {
    /// Opens the container; `sysfs` is normally `/sys`.
    pub fn new(sysfs: impl Into<PathBuf>) -> Result<Arc<Vfio>, VfioError> {
        let container = VfioContainer::new(None).map_err(VfioError::Container)?;
        Ok(Arc::new(Vfio {
            container: Arc::new(container),
            groups: Mutex::new(HashMap::new()),
            space: OnceLock::new(),
            sysfs: sysfs.into(),
        }))
    }

    /// Opens a PCI function bound to vfio-pci: memory space and bus mastering on, INTx off,
    /// BAR0 mapped.
    pub fn open(self: &Arc<Self>, addr: PciAddress) -> Result<VfioPciDevice, VfioError> {
        let dev_path = self.sysfs.join("bus/pci/devices").join(addr.to_string());
        if !dev_path.exists() {
            return Err(VfioError::NoDevice { addr });
        }
        let class = attr(&dev_path, "class")
            .as_deref()
            .and_then(parse_hex)
            .unwrap_or(0);
        if class >> 8 != 0x0108 {
            return Err(VfioError::NotNvme { addr, class });
        }
        let driver = link_name(&dev_path.join("driver")).unwrap_or_else(|| "no driver".into());
        if driver != "vfio-pci" {
            return Err(VfioError::NotVfio { addr, driver });
        }
        let Some(group_id) = link_name(&dev_path.join("iommu_group")) else {
            return Err(VfioError::NoIommuGroup { addr });
        };
        // One owner per drive: before the device is touched.
        let lock = OwnerLock::acquire(addr)?;
        let group = self.attach_group(addr, &group_id)?;
        let failed = |what: &str| {
            let what = what.to_string();
            move |source| VfioError::Device { addr, what, source }
        };
        let device = open_device(&group, addr).map_err(failed("VFIO_GROUP_GET_DEVICE_FD"))?;
        let (bar0_offset, size) =
            region_info(&device, BAR0_REGION).map_err(failed("BAR0 region info"))?;
        let (config, _) =
            region_info(&device, CONFIG_REGION).map_err(failed("config region info"))?;
        if size < 0x2000 {
            return Err(VfioError::SmallBar { addr, size });
        }
        let bar0 = Arc::new(
            Bar::map(&device, bar0_offset, size as usize)
                .map_err(|source| VfioError::MapBar { addr, source })?,
        );
        let request = request_eventfd(&device)
            .map_err(|e| log::info!("{addr}: no device request interrupt ({e}): hot removal waits for the controller to be dropped"))
            .ok();
        let shared = Arc::new(DeviceShared {
            addr,
            bar0: bar0.clone(),
            open: Mutex::new(Some(OpenDevice {
                device,
                config,
                _group: group,
                _lock: lock,
            })),
            request,
            closing: AtomicBool::new(false),
            removed: AtomicBool::new(false),
        });
        let watcher = shared.request.as_ref().and_then(|_| {
            let watched = shared.clone();
            std::thread::Builder::new()
                .name(format!("vfio-req {addr}"))
                .spawn(move || watched.wait_for_request())
                .map_err(|e| {
                    log::warn!("{addr}: cannot start the thread that watches for hot removal: {e}")
                })
                .ok()
        });
        let dev = VfioPciDevice {
            addr,
            live_slot: register_live(&bar0),
            bar0,
            shared,
            watcher,
            closing: None,
            _vfio: self.clone(),
        };
        let cmd = dev.config_read16(PCI_COMMAND);
        dev.config_write16(
            PCI_COMMAND,
            cmd | CMD_MEMORY_SPACE | CMD_BUS_MASTER | CMD_INTX_DISABLE,
        );
        Ok(dev)
    }

    /// The group numbered `id` (as its sysfs name says), attached to the container: the one
    /// already open, or opened now (then the first group gives the container its IOMMU).
    fn attach_group(&self, addr: PciAddress, id: &str) -> Result<Arc<Group>, VfioError> {
        let number: u32 = id.parse().map_err(|_| VfioError::NoIommuGroup { addr })?;
        let mut groups = self.groups.lock();
        if let Some(group) = groups.get(&number).and_then(Weak::upgrade) {
            return Ok(group);
        }
        let path = format!("/dev/vfio/{number}");
        let failed = |what: &str| {
            let what = what.to_string();
            move |source| VfioError::Device { addr, what, source }
        };
        let file = File::options()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(failed(&path))?;
        // struct vfio_group_status: argsz, flags
        let mut status = [8u32, 0];
        // SAFETY: the buffer is the kernel's 8-byte struct, argsz says so; the fd is the group's.
        let rc =
            unsafe { libc::ioctl(file.as_raw_fd(), VFIO_GROUP_GET_STATUS, status.as_mut_ptr()) };
        if rc != 0 {
            return Err(failed("VFIO_GROUP_GET_STATUS")(
                std::io::Error::last_os_error(),
            ));
        }
        if status[1] & VFIO_GROUP_FLAGS_VIABLE == 0 {
            return Err(VfioError::GroupNotViable {
                addr,
                group: id.to_string(),
            });
        }
        let container: libc::c_int = self.container.as_raw_fd();
        // SAFETY: the kernel reads one int (the container's descriptor) from the pointer.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), VFIO_GROUP_SET_CONTAINER, &container) };
        if rc != 0 {
            return Err(failed("VFIO_GROUP_SET_CONTAINER")(
                std::io::Error::last_os_error(),
            ));
        }
        // The IOMMU comes with the first group (again if the last one left meanwhile).
        if !has_iommu(&*self.container) {
            // SAFETY: the argument is a plain value; the fd is the container's.
            let rc = unsafe { libc::ioctl(container, VFIO_SET_IOMMU, VFIO_TYPE1V2_IOMMU) };
            if rc != 0 {
                // (the group file closes on the way out, which detaches it)
                return Err(failed("VFIO_SET_IOMMU")(std::io::Error::last_os_error()));
            }
        }
        let group = Arc::new(Group { file });
        groups.insert(number, Arc::downgrade(&group));
        Ok(group)
    }

    /// The IOVA space of this container, created when first asked for (after a device is open,
    /// so that the IOMMU type is set and its valid ranges can be read).
    pub fn iova_space(self: &Arc<Self>) -> Arc<IovaSpace> {
        self.space
            .get_or_init(|| {
                IovaSpace::new(Arc::new(VfioMapper {
                    container: self.container.clone(),
                }))
            })
            .clone()
    }
}

/// The device `addr` of `group`, opened.
fn open_device(group: &Group, addr: PciAddress) -> std::io::Result<File> {
    let name = std::ffi::CString::new(addr.to_string()).map_err(std::io::Error::other)?;
    // SAFETY: the kernel reads the NUL-terminated name; the fd is the group's.
    let fd = unsafe {
        libc::ioctl(
            group.file.as_raw_fd(),
            VFIO_GROUP_GET_DEVICE_FD,
            name.as_ptr(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just created for this call, owned by nothing else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Where region `index` of `device` is in its file, and its size.
fn region_info(device: &File, index: u32) -> std::io::Result<(u64, u64)> {
    /// `struct vfio_region_info`.
    #[repr(C)]
    struct RegionInfo {
        argsz: u32,
        flags: u32,
        index: u32,
        cap_offset: u32,
        size: u64,
        offset: u64,
    }
    let mut info = RegionInfo {
        argsz: std::mem::size_of::<RegionInfo>() as u32,
        flags: 0,
        index,
        cap_offset: 0,
        size: 0,
        offset: 0,
    };
    // SAFETY: the argument is the kernel's struct, argsz bytes long, which it reads and fills
    // in; the fd is the device's.
    let rc = unsafe { libc::ioctl(device.as_raw_fd(), VFIO_DEVICE_GET_REGION_INFO, &mut info) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((info.offset, info.size))
}

/// Maps host memory into the container's IOMMU domain.
struct VfioMapper {
    container: Arc<VfioContainer>,
}

impl std::fmt::Debug for VfioMapper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("VfioMapper")
    }
}

impl DmaMapper for VfioMapper {
    unsafe fn map(&self, iova: u64, host: *mut u8, len: usize) -> Result<(), MapError> {
        // SAFETY: the caller guarantees [host, host + len) stays valid until unmapped, which is
        // what vfio_dma_map requires; the memory is only accessed volatile meanwhile.
        unsafe { self.container.vfio_dma_map(iova, len, host) }.map_err(|e| MapError::Map {
            iova,
            len: len as u64,
            source: std::io::Error::other(e),
        })
    }

    fn unmap(&self, iova: u64, len: usize) -> Result<(), MapError> {
        match self.container.vfio_dma_unmap(iova, len) {
            Ok(()) => Ok(()),
            // The last group left the container (its last device was dropped or removed): the
            // kernel released the IOMMU, and every mapping with it.
            Err(_) if !has_iommu(&*self.container) => Ok(()),
            Err(e) => Err(MapError::Unmap {
                iova,
                len: len as u64,
                source: std::io::Error::other(e),
            }),
        }
    }

    fn iova_ranges(&self) -> Vec<std::ops::Range<u64>> {
        match iommu_iova_ranges(&*self.container) {
            Some(ranges) if !ranges.is_empty() => ranges,
            _ => {
                log::warn!("VFIO reports no IOVA ranges; using {FALLBACK_IOVA:#x?}");
                vec![FALLBACK_IOVA]
            }
        }
    }
}

/// Whether the container has an IOMMU: from its first group's attachment to the last one's
/// leaving.
fn has_iommu(container: &impl AsRawFd) -> bool {
    // argsz, flags, iova_pgsizes, cap_offset, pad: the kernel's minimum
    let mut info = [0u64; 3];
    info[0] = 24;
    // SAFETY: the buffer is 24 writable bytes, aligned for the kernel's struct, and argsz says
    // so; the fd is a valid container.
    unsafe {
        libc::ioctl(
            container.as_raw_fd(),
            VFIO_IOMMU_GET_INFO,
            info.as_mut_ptr(),
        ) == 0
    }
}

/// VFIO_IOMMU_GET_INFO's IOVA range capability: where the IOMMU accepts mappings.
fn iommu_iova_ranges(container: &impl AsRawFd) -> Option<Vec<std::ops::Range<u64>>> {
    const INFO_CAPS: u32 = 1 << 1;
    const CAP_IOVA_RANGE: u16 = 1;
    const HEADER: usize = 24; // argsz, flags, iova_pgsizes, cap_offset, pad
    let mut buf = vec![0u64; 512]; // 4 KiB, u64-aligned
    let bytes = buf.len() * 8;
    let argsz = u32::try_from(bytes).ok()?;
    buf[0] = argsz as u64; // argsz (low half), flags (high half) = 0
                           // SAFETY: the buffer is `argsz` bytes, writable and aligned for the kernel's struct; the
                           // kernel writes at most argsz bytes; the fd is a valid container.
    let rc = unsafe { libc::ioctl(container.as_raw_fd(), VFIO_IOMMU_GET_INFO, buf.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    let raw: Vec<u8> = buf.iter().flat_map(|w| w.to_le_bytes()).collect();
    let u16_at = |o: usize| raw.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| {
        raw.get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |o: usize| {
        raw.get(o..o + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    };
    if u32_at(4)? & INFO_CAPS == 0 {
        return None;
    }
    let mut offset = u32_at(16)? as usize;
    while offset >= HEADER && offset < bytes {
        if u16_at(offset)? == CAP_IOVA_RANGE {
            let count = u32_at(offset + 8)? as usize;
            let ranges = (0..count)
                .map(|i| {
                    let at = offset + 16 + i * 16;
                    Some(u64_at(at)?..u64_at(at + 8)?.saturating_add(1)) // end is inclusive
                })
                .collect::<Option<Vec<_>>>()?;
            return Some(ranges);
        }
        offset = u32_at(offset + 4)? as usize;
    }
    None
}

/// The kernel's request interrupt of `device` on a new eventfd: the kernel signals it when it
/// wants the device back (hot removal, unbind) and waits until the device file is closed.
fn request_eventfd(device: &File) -> std::io::Result<EventFd> {
    let fd = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC)?;
    set_irq_eventfds(device, VFIO_PCI_REQ_IRQ_INDEX, &[fd.as_raw_fd()])?;
    Ok(fd)
}

/// How many interrupts of `index` the device has (VFIO_DEVICE_GET_IRQ_INFO): for MSI-X, its
/// table size.
fn irq_count(device: &File, index: u32) -> std::io::Result<u32> {
    /// `struct vfio_irq_info`.
    #[repr(C)]
    struct IrqInfo {
        argsz: u32,
        flags: u32,
        index: u32,
        count: u32,
    }
    let mut info = IrqInfo {
        argsz: std::mem::size_of::<IrqInfo>() as u32,
        flags: 0,
        index,
        count: 0,
    };
    // SAFETY: the argument is the kernel's struct, argsz bytes long, which it reads and fills
    // in; the fd is the device's.
    let rc = unsafe { libc::ioctl(device.as_raw_fd(), VFIO_DEVICE_GET_IRQ_INFO, &mut info) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(info.count)
}

/// Triggers `fds[i]` on interrupt `i` of `index` (VFIO_DEVICE_SET_IRQS, starting at 0). For
/// MSI-X this enables that many vectors, re-programming every one.
fn set_irq_eventfds(device: &File, index: u32, fds: &[RawFd]) -> std::io::Result<()> {
    // `struct vfio_irq_set`: argsz, flags, index, start, count, then `count` i32 eventfds
    const HEADER: usize = 5;
    let count = u32::try_from(fds.len()).map_err(|_| std::io::ErrorKind::InvalidInput)?;
    let argsz =
        u32::try_from((HEADER + fds.len()) * 4).map_err(|_| std::io::ErrorKind::InvalidInput)?;
    let flags = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER;
    let mut set: Vec<u32> = Vec::with_capacity(HEADER + fds.len());
    set.extend([argsz, flags, index, 0, count]);
    // (the kernel reads the fds back as i32)
    set.extend(fds.iter().map(|&fd| fd as u32));
    // SAFETY: the argument is a complete vfio_irq_set with its `count` eventfds, argsz bytes
    // long, which the kernel only reads; the device descriptor is valid.
    let rc = unsafe { libc::ioctl(device.as_raw_fd(), VFIO_DEVICE_SET_IRQS, set.as_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The device's MSI-X vectors, through VFIO: the kernel takes each vector's interrupt and
/// signals its eventfd. (Given back to the kernel, the device has none: its file is closed,
/// which frees them.)
impl Interrupts for DeviceShared {
    fn vectors(&self) -> u16 {
        let Some(open) = &*self.open.lock() else {
            return 0;
        };
        match irq_count(&open.device, VFIO_PCI_MSIX_IRQ_INDEX) {
            Ok(n) => n.min(MSIX_MAX_VECTORS) as u16,
            Err(e) => {
                log::info!("{}: no MSI-X interrupt information: {e}", self.addr);
                0
            }
        }
    }

    fn enable(&self, count: u16) -> std::io::Result<Vec<Arc<EventFd>>> {
        let open = self.open.lock();
        let Some(open) = &*open else {
            return Err(std::io::ErrorKind::NotConnected.into());
        };
        let fds = (0..count)
            .map(|_| interrupt_eventfd().map(Arc::new))
            .collect::<std::io::Result<Vec<_>>>()?;
        let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
        set_irq_eventfds(&open.device, VFIO_PCI_MSIX_IRQ_INDEX, &raw)?;
        log::info!("{}: MSI-X enabled: {count} vectors", self.addr);
        Ok(fds)
    }
}

/// What a device and the thread watching for its removal share.
struct DeviceShared {
    addr: PciAddress,
    bar0: Arc<Bar>,
    /// The open device and its owner lock; None once given back to the kernel.
    open: Mutex<Option<OpenDevice>>,
    /// The request interrupt's eventfd (None where the kernel offers none).
    request: Option<EventFd>,
    /// Set when the device is closed normally: the watcher then just ends.
    closing: AtomicBool,
    removed: AtomicBool,
}

impl std::fmt::Debug for DeviceShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceShared")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// Closed in this order: the device file (which a removal waits for), its group (if no other
/// device of the group is open), the owner lock.
struct OpenDevice {
    device: File,
    /// Where the config space is in the device file.
    config: u64,
    _group: Arc<Group>,
    _lock: OwnerLock,
}

impl DeviceShared {
    /// The watcher thread: waits for the request interrupt (or for `closing`).
    fn wait_for_request(&self) {
        let Some(fd) = &self.request else {
            return;
        };
        loop {
            match fd.read() {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    log::warn!("{}: waiting for device requests: {e}", self.addr);
                    return;
                }
            }
            if self.closing.load(Ordering::Acquire) {
                return;
            }
            self.give_back();
            return;
        }
    }

    /// The kernel wants the device (hot removal, unbind): stop it, make its registers read all
    /// ones, close its file. Every later register access sees a removed device.
    fn give_back(&self) {
        let mut open = self.open.lock();
        let Some(device) = open.take() else {
            return;
        };
        log::warn!(
            "{}: the kernel asks for the device back (hot removal or unbind): disabling it and letting go",
            self.addr
        );
        disable_for_release(self.addr, &*self.bar0);
        if let Err(e) = self.bar0.detach() {
            log::error!(
                "{}: cannot detach BAR0 ({e}): the device stays open until its controller is dropped",
                self.addr
            );
            *open = Some(device);
            return;
        }
        self.removed.store(true, Ordering::Release);
        // No mapping of the device file is left (BAR0 was just detached): closing it lets the
        // removal go on.
        drop(device);
        log::warn!("{}: released to the kernel", self.addr);
    }
}

/// CC.EN = 0 and a bounded wait for CSTS.RDY = 0, so that the device does no more DMA before it
/// is released (a device already gone reads all ones: nothing to wait for).
fn disable_for_release(addr: PciAddress, regs: &dyn Registers) {
    let csts = Csts(regs.read32(reg::CSTS));
    if csts.0 == u32::MAX {
        return;
    }
    let limit = Duration::from_millis(Cap(regs.read64(reg::CAP)).to_ms().clamp(500, 10_000));
    let cc = Cc(regs.read32(reg::CC));
    regs.write32(reg::CC, cc.with_en(false).0);
    let started = Instant::now();
    loop {
        let csts = Csts(regs.read32(reg::CSTS));
        if csts.0 == u32::MAX || !csts.rdy() {
            return;
        }
        if started.elapsed() > limit {
            log::warn!("{addr}: still ready {limit:?} after CC.EN = 0; releasing it anyway");
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Most VFIO devices [`disable_all_for_exit`] knows of at once.
const MAX_LIVE: usize = 256;

/// BAR0 of every open VFIO device. A slot is taken by a swap to null, by whoever needs the
/// pointer last: the device's drop (then the mapping is unmapped) or the signal handler (then the
/// process exits): never both.
static LIVE: [AtomicPtr<Bar>; MAX_LIVE] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_LIVE];

fn register_live(bar: &Arc<Bar>) -> Option<usize> {
    let ptr = Arc::as_ptr(bar).cast_mut();
    let slot = LIVE.iter().position(|s| {
        s.compare_exchange(
            std::ptr::null_mut(),
            ptr,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_ok()
    });
    if slot.is_none() {
        log::warn!("more than {MAX_LIVE} VFIO devices: a second Ctrl-C will not disable the rest");
    }
    slot
}

fn unregister_live(slot: usize, bar: &Arc<Bar>) {
    let ptr = Arc::as_ptr(bar).cast_mut();
    let taken = LIVE[slot].compare_exchange(
        ptr,
        std::ptr::null_mut(),
        Ordering::AcqRel,
        Ordering::Acquire,
    );
    if taken.is_err() {
        // The exit path took this BAR: it writes CC and ends the process; the mapping must stay
        // until then.
        loop {
            std::thread::park();
        }
    }
}

/// Disables (CC.EN = 0) the controller of every VFIO device this process has open, for a process
/// about to `_exit` without shutting them down (a second Ctrl-C). Async-signal-safe: atomic swaps
/// and one volatile MMIO store per device, nothing else. Devices dropped afterwards wait for the
/// exit instead of unmapping their BAR under this function.
pub fn disable_all_for_exit() -> usize {
    let mut disabled = 0;
    for slot in &LIVE {
        let ptr = slot.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if ptr.is_null() {
            continue;
        }
        // SAFETY: a non-null slot points to a live Bar: its device's drop clears the slot before
        // the Bar can be dropped, and once this swap took the pointer, that drop waits forever
        // instead (see `unregister_live`).
        let bar = unsafe { &*ptr };
        bar.write32(reg::CC, 0);
        disabled += 1;
    }
    disabled
}

/// A PCI function opened through VFIO, with BAR0 mapped and bus mastering on.
pub struct VfioPciDevice {
    addr: PciAddress,
    // Field order is drop order: BAR0 is unmapped (its last two references: here and in
    // `shared`) before the device file is closed; the mapping holds the file open otherwise, and
    // the group cannot leave the container.
    bar0: Arc<Bar>,
    shared: Arc<DeviceShared>,
    watcher: Option<JoinHandle<()>>,
    live_slot: Option<usize>,
    /// The open device, moved here by `drop` to be closed after BAR0 is unmapped.
    closing: Option<OpenDevice>,
    _vfio: Arc<Vfio>,
}

impl Drop for VfioPciDevice {
    fn drop(&mut self) {
        if let Some(slot) = self.live_slot {
            unregister_live(slot, &self.bar0);
        }
        self.shared.closing.store(true, Ordering::Release);
        if let (Some(fd), Some(watcher)) = (&self.shared.request, self.watcher.take()) {
            if fd.write(1).is_ok() {
                let _ = watcher.join();
            }
        }
        // Closed with the fields, after BAR0: the device file (and with it the request
        // interrupt), then the owner lock.
        self.closing = self.shared.open.lock().take();
    }
}

impl std::fmt::Debug for VfioPciDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VfioPciDevice")
            .field("addr", &self.addr)
            .field("bar0", &self.bar0)
            .finish()
    }
}

/// PCIe link status read from the device's own config space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PcieLink {
    /// Link speed in GT/s x10 (25 = 2.5 GT/s) and width in lanes, current and maximum.
    pub speed_gts_x10: u32,
    pub width: u32,
    pub max_speed_gts_x10: u32,
    pub max_width: u32,
}

impl std::fmt::Display for PcieLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let gts = |x10: u32| {
            if x10.is_multiple_of(10) {
                format!("{}", x10 / 10)
            } else {
                format!("{}.{}", x10 / 10, x10 % 10)
            }
        };
        write!(f, "{} GT/s x{}", gts(self.speed_gts_x10), self.width)?;
        if (self.speed_gts_x10, self.width) != (self.max_speed_gts_x10, self.max_width) {
            write!(
                f,
                " (max {} GT/s x{})",
                gts(self.max_speed_gts_x10),
                self.max_width
            )?;
        }
        Ok(())
    }
}

impl VfioPciDevice {
    pub fn addr(&self) -> PciAddress {
        self.addr
    }

    pub fn bar0(&self) -> &Arc<Bar> {
        &self.bar0
    }

    /// The device's MSI-X vectors (enabled only when asked: see [`Interrupts`]).
    pub fn interrupts(&self) -> Arc<dyn Interrupts> {
        self.shared.clone()
    }

    /// Whether the device was given back to the kernel (hot removal): its registers and config
    /// space read all ones from then on.
    pub fn is_removed(&self) -> bool {
        self.shared.removed.load(Ordering::Acquire)
    }

    /// Reads config space into `buf` (all ones once the device is given back).
    fn config_read(&self, buf: &mut [u8], offset: u64) {
        let read = match &*self.shared.open.lock() {
            Some(open) => open.device.read_exact_at(buf, open.config + offset),
            None => Err(std::io::ErrorKind::NotConnected.into()),
        };
        if read.is_err() {
            buf.fill(0xff); // as a removed device reads
        }
    }

    pub fn config_read8(&self, offset: u64) -> u8 {
        let mut b = [0u8; 1];
        self.config_read(&mut b, offset);
        b[0]
    }

    pub fn config_read16(&self, offset: u64) -> u16 {
        let mut b = [0u8; 2];
        self.config_read(&mut b, offset);
        u16::from_le_bytes(b)
    }

    pub fn config_write16(&self, offset: u64, value: u16) {
        if let Some(open) = &*self.shared.open.lock() {
            if let Err(e) = open
                .device
                .write_all_at(&value.to_le_bytes(), open.config + offset)
            {
                log::warn!("{}: config space write at {offset:#x}: {e}", self.addr);
            }
        }
    }

    fn config_read32(&self, offset: u64) -> u32 {
        let mut b = [0u8; 4];
        self.config_read(&mut b, offset);
        u32::from_le_bytes(b)
    }

    /// The PCIe link from the PCI Express capability (Link Capabilities / Link Status).
    pub fn pcie_link(&self) -> Option<PcieLink> {
        if self.config_read16(PCI_STATUS) & STATUS_CAP_LIST == 0 {
            return None;
        }
        let mut ptr = self.config_read8(PCI_CAP_PTR) & !3;
        for _ in 0..48 {
            if ptr < 0x40 {
                return None;
            }
            if self.config_read8(ptr as u64) == CAP_ID_EXP {
                let caps = self.config_read32(ptr as u64 + 0x0c);
                let status = self.config_read16(ptr as u64 + 0x12);
                return Some(PcieLink {
                    speed_gts_x10: speed_x10(status as u32 & 0xf),
                    width: (status as u32 >> 4) & 0x3f,
                    max_speed_gts_x10: speed_x10(caps & 0xf),
                    max_width: (caps >> 4) & 0x3f,
                });
            }
            ptr = self.config_read8(ptr as u64 + 1) & !3;
        }
        None
    }
}

/// Link speed encoding (Link Capabilities / Status) to GT/s x10.
fn speed_x10(code: u32) -> u32 {
    match code {
        1 => 25,
        2 => 50,
        3 => 80,
        4 => 160,
        5 => 320,
        6 => 640,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_reads_like_lspci() {
        let gen5 = PcieLink {
            speed_gts_x10: 320,
            width: 4,
            max_speed_gts_x10: 320,
            max_width: 4,
        };
        assert_eq!(gen5.to_string(), "32 GT/s x4");
        let slow = PcieLink {
            speed_gts_x10: 25,
            width: 1,
            max_speed_gts_x10: 80,
            max_width: 4,
        };
        assert_eq!(slow.to_string(), "2.5 GT/s x1 (max 8 GT/s x4)");
        assert_eq!(speed_x10(4), 160);
    }

    #[test]
    fn the_exit_path_disables_every_live_bar_once() {
        let path = std::env::temp_dir().join(format!("usnvme-live-bar-{}", std::process::id()));
        std::fs::write(&path, vec![0u8; 8192]).expect("a file to map");
        let file = std::fs::File::options()
            .read(true)
            .write(true)
            .open(&path)
            .expect("open");
        let bar = Arc::new(Bar::map(&file, 0, 8192).expect("map"));
        bar.write32(reg::CC, 0x46_0001); // enabled
        let slot = register_live(&bar).expect("a slot");
        assert!(disable_all_for_exit() >= 1);
        assert_eq!(bar.read32(reg::CC), 0, "CC.EN cleared");
        assert!(LIVE[slot].load(Ordering::Acquire).is_null(), "taken once");
        // (unregistering now would wait for the exit: the slot is gone, as the protocol says)
        let _ = std::fs::remove_file(&path);
    }
}

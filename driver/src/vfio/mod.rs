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
//!
//! Here: the errors and the container; groups in `group`, devices in `device`, their config
//! space in `config`, DMA mapping in `dma`, interrupts in `irq`, the exit path in `live`.

mod config;
mod device;
mod dma;
mod group;
mod irq;
mod live;

pub use config::PcieLink;
pub use device::VfioPciDevice;
pub use live::disable_all_for_exit;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::Mutex;
use usnvme_hugepages::IovaSpace;
use vfio_ioctls::VfioContainer;

use crate::lock::LockError;
use crate::pci::PciAddress;

use group::Group;

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
}

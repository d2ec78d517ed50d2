//! VFIO: one container for the whole process (so every drive shares one IOVA space and a buffer
//! can go to any drive), PCI functions bound to `vfio-pci`, their config space and BAR0.
//! Group, container and device handling come from `vfio-ioctls`; the one ioctl it lacks (the
//! IOMMU's valid IOVA ranges) is here.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use usnvme_hugepages::{DmaMapper, IovaSpace, MapError};
use vfio_ioctls::{VfioContainer, VfioDevice, VfioOps};

use crate::mmio::Bar;
use crate::pci::PciAddress;

/// VFIO region indices of a PCI device.
const BAR0_REGION: u32 = 0;
const CONFIG_REGION: u32 = 7;

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
    #[error("{addr}: cannot open the VFIO device; is another process using it? ({source})")]
    Device {
        addr: PciAddress,
        source: vfio_ioctls::VfioError,
    },
    #[error("{addr}: BAR0 is {size} bytes, too small for an NVMe controller")]
    SmallBar { addr: PciAddress, size: u64 },
    #[error("{addr}: mapping BAR0 failed: {source}")]
    MapBar {
        addr: PciAddress,
        source: std::io::Error,
    },
}

/// The process's VFIO container and the IOVA space every device opened through it shares.
pub struct Vfio {
    container: Arc<VfioContainer>,
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
        let class = std::fs::read_to_string(dev_path.join("class"))
            .ok()
            .and_then(|c| u32::from_str_radix(c.trim().trim_start_matches("0x"), 16).ok())
            .unwrap_or(0);
        if class >> 8 != 0x0108 {
            return Err(VfioError::NotNvme { addr, class });
        }
        let driver = link_name(&dev_path.join("driver")).unwrap_or_else(|| "no driver".into());
        if driver != "vfio-pci" {
            return Err(VfioError::NotVfio { addr, driver });
        }
        let Some(group) = link_name(&dev_path.join("iommu_group")) else {
            return Err(VfioError::NoIommuGroup { addr });
        };
        let ops: Arc<dyn VfioOps> = self.container.clone();
        let device = VfioDevice::new(&dev_path, ops, false).map_err(|source| match source {
            vfio_ioctls::VfioError::GroupViable => VfioError::GroupNotViable { addr, group },
            source => VfioError::Device { addr, source },
        })?;
        let size = device.get_region_size(BAR0_REGION);
        if size < 0x2000 {
            return Err(VfioError::SmallBar { addr, size });
        }
        let bar0 = Bar::map(
            &device,
            device.get_region_offset(BAR0_REGION),
            size as usize,
        )
        .map_err(|source| VfioError::MapBar { addr, source })?;
        let dev = VfioPciDevice {
            addr,
            bar0: Arc::new(bar0),
            device,
            _vfio: self.clone(),
        };
        let cmd = dev.config_read16(PCI_COMMAND);
        dev.config_write16(
            PCI_COMMAND,
            cmd | CMD_MEMORY_SPACE | CMD_BUS_MASTER | CMD_INTX_DISABLE,
        );
        Ok(dev)
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
        self.container
            .vfio_dma_unmap(iova, len)
            .map_err(|e| MapError::Unmap {
                iova,
                len: len as u64,
                source: std::io::Error::other(e),
            })
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

/// VFIO_IOMMU_GET_INFO's IOVA range capability: where the IOMMU accepts mappings.
fn iommu_iova_ranges(container: &impl AsRawFd) -> Option<Vec<std::ops::Range<u64>>> {
    const VFIO_IOMMU_GET_INFO: libc::c_ulong = 0x3b70; // _IO(';', 100 + 12)
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

/// A PCI function opened through VFIO, with BAR0 mapped and bus mastering on.
pub struct VfioPciDevice {
    addr: PciAddress,
    bar0: Arc<Bar>,
    device: VfioDevice,
    _vfio: Arc<Vfio>,
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

    pub fn config_read8(&self, offset: u64) -> u8 {
        let mut b = [0u8; 1];
        self.device.region_read(CONFIG_REGION, &mut b, offset);
        b[0]
    }

    pub fn config_read16(&self, offset: u64) -> u16 {
        let mut b = [0u8; 2];
        self.device.region_read(CONFIG_REGION, &mut b, offset);
        u16::from_le_bytes(b)
    }

    pub fn config_write16(&self, offset: u64, value: u16) {
        self.device
            .region_write(CONFIG_REGION, &value.to_le_bytes(), offset);
    }

    fn config_read32(&self, offset: u64) -> u32 {
        let mut b = [0u8; 4];
        self.device.region_read(CONFIG_REGION, &mut b, offset);
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

fn link_name(link: &Path) -> Option<String> {
    std::fs::read_link(link)
        .ok()
        .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
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
}

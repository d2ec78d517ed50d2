//! One PCI function bound to `vfio-pci`: its container and group (through `vfio-ioctls`), its
//! config space, and BAR0.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use vfio_ioctls::{VfioContainer, VfioDevice, VfioOps};

use crate::mmio::Bar;

/// VFIO region indices of a PCI device.
const BAR0_REGION: u32 = 0;
const CONFIG_REGION: u32 = 7;

/// PCI config space command register and its bits.
const PCI_COMMAND: u64 = 0x04;
const CMD_MEMORY_SPACE: u16 = 1 << 1;
const CMD_BUS_MASTER: u16 = 1 << 2;
const CMD_INTX_DISABLE: u16 = 1 << 10;

#[derive(Debug, thiserror::Error)]
pub enum VfioError {
    #[error("{addr}: no such PCI device (run `usnvme list` to see the NVMe controllers)")]
    NoDevice { addr: String },
    #[error("{addr} is bound to {driver}, not vfio-pci: run `usnvme setup bind {addr}`")]
    NotVfio { addr: String, driver: String },
    #[error("{addr} is in IOMMU group {group}, which has other devices not bound to vfio-pci: bind the whole group")]
    GroupNotViable { addr: String, group: String },
    #[error("{addr}: /dev/vfio/vfio cannot be opened (is the vfio-pci module loaded, and are you root?): {source}")]
    Container {
        addr: String,
        source: vfio_ioctls::VfioError,
    },
    #[error("{addr}: cannot open the VFIO device (is another process using it?): {source}")]
    Device {
        addr: String,
        source: vfio_ioctls::VfioError,
    },
    #[error("{addr}: BAR0 is {size} bytes, too small for an NVMe controller")]
    SmallBar { addr: String, size: u64 },
    #[error("{addr}: mapping BAR0 failed: {source}")]
    MapBar {
        addr: String,
        source: std::io::Error,
    },
}

/// A PCI function opened through VFIO, with BAR0 mapped and bus mastering on.
pub struct VfioPciDevice {
    addr: String,
    bar0: Bar,
    device: VfioDevice,
    container: Arc<VfioContainer>,
}

impl std::fmt::Debug for VfioPciDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VfioPciDevice")
            .field("addr", &self.addr)
            .field("bar0", &self.bar0)
            .finish()
    }
}

impl VfioPciDevice {
    /// Opens `addr` (e.g. `0000:01:00.0`) under `sysfs` (normally `/sys`).
    pub fn open(sysfs: &Path, addr: &str) -> Result<Self, VfioError> {
        let dev_path = sysfs.join("bus/pci/devices").join(addr);
        if !dev_path.exists() {
            return Err(VfioError::NoDevice { addr: addr.into() });
        }
        let driver = link_name(&dev_path.join("driver")).unwrap_or_else(|| "no driver".into());
        if driver != "vfio-pci" {
            return Err(VfioError::NotVfio {
                addr: addr.into(),
                driver,
            });
        }
        let container =
            VfioContainer::new(None)
                .map(Arc::new)
                .map_err(|source| VfioError::Container {
                    addr: addr.into(),
                    source,
                })?;
        let ops: Arc<dyn VfioOps> = container.clone();
        let device = VfioDevice::new(&dev_path, ops, false).map_err(|source| match source {
            vfio_ioctls::VfioError::GroupViable => VfioError::GroupNotViable {
                addr: addr.into(),
                group: link_name(&dev_path.join("iommu_group")).unwrap_or_else(|| "?".into()),
            },
            source => VfioError::Device {
                addr: addr.into(),
                source,
            },
        })?;
        let size = device.get_region_size(BAR0_REGION);
        if size < 0x2000 {
            return Err(VfioError::SmallBar {
                addr: addr.into(),
                size,
            });
        }
        let bar0 = Bar::map(
            &device,
            device.get_region_offset(BAR0_REGION),
            size as usize,
        )
        .map_err(|source| VfioError::MapBar {
            addr: addr.into(),
            source,
        })?;
        let this = VfioPciDevice {
            addr: addr.into(),
            bar0,
            device,
            container,
        };
        let cmd = this.config_read16(PCI_COMMAND);
        this.config_write16(
            PCI_COMMAND,
            cmd | CMD_MEMORY_SPACE | CMD_BUS_MASTER | CMD_INTX_DISABLE,
        );
        Ok(this)
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    pub fn bar0(&self) -> &Bar {
        &self.bar0
    }

    pub fn container(&self) -> &Arc<VfioContainer> {
        &self.container
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
}

fn link_name(link: &Path) -> Option<String> {
    std::fs::read_link(link)
        .ok()
        .and_then(|t: PathBuf| t.file_name().map(|n| n.to_string_lossy().into_owned()))
}

//! The VM test bed: a QEMU guest with emulated NVMe controllers behind an emulated Intel IOMMU,
//! bound to vfio-pci, running host-built programs over virtio-9p.

pub mod hotplug;
pub mod initramfs;
pub mod kmod;
pub mod namespaces;
pub mod qemu;
pub mod run;
pub mod setup;
pub mod setup_check;
pub mod test;
pub mod trace;
pub mod watchdog;

use std::path::PathBuf;

/// Everything the test bed caches lives here, under `target/`.
pub fn vm_dir() -> PathBuf {
    crate::target_dir().join("vm")
}

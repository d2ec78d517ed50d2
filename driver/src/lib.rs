//! usnvme-driver: a userspace, polled-mode NVMe driver over VFIO.
//!
//! Layers, bottom up: `pci` (sysfs discovery), `vfio` (container, group, device, BAR0),
//! `spec` (the NVMe data structures), then the controller and its queue pairs.

pub mod mmio;
pub mod pci;
pub mod spec;
pub mod vfio;

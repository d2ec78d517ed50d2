//! usnvme-driver: a userspace, polled-mode NVMe driver over VFIO.
//!
//! Layers, bottom up: `pci` (sysfs discovery), `vfio` (container, group, device, BAR0),
//! `spec` (the NVMe data structures), then the controller and its queue pairs.

pub mod controller;
pub mod device;
pub mod error;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod lock;
pub mod mmio;
pub mod pci;
pub mod prp;
pub mod queue;
pub mod regs;
pub mod sim;
pub mod spec;
pub mod vfio;

pub use controller::{Controller, ControllerOptions, Namespace, QueuePairOptions};
pub use device::{DeviceSpec, Opener};
pub use error::{Error, SubmitError};
pub use queue::{Completion, IoBuffer, QueuePair, QueueStats};

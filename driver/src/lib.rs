//! usnvme-driver: a userspace, polled-mode NVMe driver over VFIO.
//!
//! Layers, bottom up: `pci` (sysfs discovery), `vfio` (container, group, device, BAR0),
//! `spec` (the NVMe data structures), then the controller and its queue pairs.

pub mod bringup;
pub mod controller;
pub mod device;
pub mod error;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod lock;
pub mod mmio;
pub mod namespaces;
pub mod pci;
pub mod protection;
pub mod prp;
pub mod queue;
pub mod regs;
pub mod sim;
pub mod spec;
pub mod vfio;

pub use controller::{
    Controller, ControllerOptions, Namespace, NamespaceChanges, QueuePairOptions,
};
pub use device::{DeviceSpec, Opener};
pub use error::{Error, SubmitError};
pub use queue::{Completion, IoBuffer, MetadataIo, QueuePair, QueueStats};

/// A size as people write it: bytes (`4096`), or with a binary unit, case-insensitive, with or
/// without `B`/`iB` (`4k`, `128K`, `1M`, `512MiB`, `2G`, `1T`). The one parser of every tool's
/// sizes (perf, sweep, setup hugepages, sim specs); `None` when it is not one.
pub fn parse_size(s: &str) -> Option<u64> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(s.trim())
        .ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_parse_with_binary_units_whatever_their_case() {
        for (text, bytes) in [
            ("4096", 4096),
            ("4k", 4096),
            ("128K", 128 << 10),
            ("1M", 1 << 20),
            ("1MiB", 1 << 20),
            ("512mb", 512 << 20),
            (" 2G ", 2 << 30),
            ("1T", 1 << 40),
        ] {
            assert_eq!(super::parse_size(text), Some(bytes), "{text:?}");
        }
        for bad in ["4x", "", "k", "-1", "99999999999T"] {
            assert_eq!(super::parse_size(bad), None, "{bad:?}");
        }
    }
}

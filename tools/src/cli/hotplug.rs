//! Drives bound to vfio-pci while a command runs (a drive hot added, then `usnvme setup bind`,
//! or one handed over): the one watcher `perf --hotplug` and `serve` use. It reads the
//! kernel's device events and brings each NVMe controller bound there up; what becomes of it
//! is the command's. A drive removed and bound again is a new controller, brought up again.

use std::time::Duration;

use usnvme_driver::pci::uevent::{PciEvent, UeventSocket};
use usnvme_driver::pci::PciAddress;
use usnvme_driver::{Controller, ControllerOptions, DeviceSpec, Opener};

/// How long [`Binds::next`] waits for an event: the watcher looks at its stop flag (and the
/// command at its drives) at least this often.
pub const LOOK_EVERY: Duration = Duration::from_millis(200);

/// The kernel's device events, and the controllers they brought.
#[derive(Debug)]
pub struct Binds {
    events: UeventSocket,
}

/// A controller bound to vfio-pci: brought up, or why it could not be.
#[derive(Debug)]
pub enum Bound {
    Up(DeviceSpec, Controller),
    Failed(PciAddress, String),
}

impl Binds {
    pub fn new(events: UeventSocket) -> Binds {
        Binds { events }
    }

    /// Waits at most [`LOOK_EVERY`] for an NVMe controller bound to vfio-pci that `known`
    /// does not have (one it serves now), and brings it up. `Ok(None)`: none came; an error:
    /// the events cannot be read any more (the caller says so and watches no more).
    pub fn next(
        &mut self,
        opener: &Opener,
        known: impl Fn(PciAddress) -> bool,
    ) -> std::io::Result<Option<Bound>> {
        let addr = match self.events.next(LOOK_EVERY)? {
            Some(PciEvent::BoundToVfio(addr)) => addr,
            _ => return Ok(None),
        };
        if known(addr) {
            return Ok(None);
        }
        let spec = DeviceSpec::Pci(addr);
        Ok(Some(
            match opener.open(&spec, ControllerOptions::default()) {
                Ok(mut opened) if !opened.is_empty() => Bound::Up(spec, opened.remove(0)),
                Ok(_) => Bound::Failed(addr, "no controller there".into()),
                Err(e) => Bound::Failed(addr, format!("cannot be brought up: {e}")),
            },
        ))
    }
}

//! The controller's registers as the driver sees them: BAR0 of a real device, or the register page
//! of the software controller (`sim`). Everything above this cannot tell them apart.

/// 32-bit register access. 64-bit registers are two 32-bit accesses, low dword first, which every
/// controller must accept. A removed device reads as all ones; the driver checks for that.
pub trait Registers: Send + Sync + std::fmt::Debug {
    fn read32(&self, offset: usize) -> u32;
    fn write32(&self, offset: usize, value: u32);

    /// The mapped BAR behind these registers, if they are one: doorbells are then written
    /// straight to their address, found once (see `mmio::Doorbell`).
    fn as_bar(&self) -> Option<&crate::mmio::Bar> {
        None
    }

    fn read64(&self, offset: usize) -> u64 {
        let lo = self.read32(offset) as u64;
        let hi = self.read32(offset + 4) as u64;
        lo | (hi << 32)
    }

    fn write64(&self, offset: usize, value: u64) {
        self.write32(offset, value as u32);
        self.write32(offset + 4, (value >> 32) as u32);
    }
}

/// The controller's MSI-X interrupts as the driver sees them: VFIO's (the kernel signals an
/// eventfd per vector), or the software controller's (`sim` signals them itself). Everything
/// above cannot tell them apart. The driver keeps its queues polled unless a queue pair is asked
/// for with interrupts; only then are vectors enabled.
pub trait Interrupts: Send + Sync + std::fmt::Debug {
    /// MSI-X vectors the function has (its table size; 0: no MSI-X).
    fn vectors(&self) -> u16;

    /// Enables MSI-X with vectors `0..count`, each raising an eventfd of its own (made by
    /// [`interrupt_eventfd`]), handed back in vector order. Enabling re-programs every vector
    /// (VFIO's rule): the driver does it once, for every vector its queues can use.
    fn enable(
        &self,
        count: u16,
    ) -> std::io::Result<Vec<std::sync::Arc<nix::sys::eventfd::EventFd>>>;
}

/// An eventfd for one interrupt vector: non-blocking, so that clearing it never waits.
pub fn interrupt_eventfd() -> std::io::Result<nix::sys::eventfd::EventFd> {
    use nix::sys::eventfd::{EfdFlags, EventFd};
    Ok(EventFd::from_value_and_flags(
        0,
        EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK,
    )?)
}

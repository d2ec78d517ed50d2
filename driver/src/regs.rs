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

//! BAR0 mapped into our address space: bounds-checked volatile register access.
//! The only place the driver dereferences device memory.

use std::os::fd::AsRawFd;
use std::ptr::NonNull;

/// A memory-mapped PCI BAR. Accesses are volatile, naturally aligned and bounds-checked.
#[derive(Debug)]
pub struct Bar {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain device memory with no thread affinity; the owner decides sharing.
unsafe impl Send for Bar {}
// SAFETY: all access is by volatile reads/writes of single registers; concurrent register access is
// the device's concern, and no Rust references into the mapping are ever created.
unsafe impl Sync for Bar {}

/// An access outside the BAR or misaligned: a driver bug, reported instead of touching memory.
#[derive(Debug, thiserror::Error)]
#[error("register access at offset {offset:#x} (width {width}) outside BAR of {len:#x} bytes or misaligned")]
pub struct OutOfBounds {
    pub offset: usize,
    pub width: usize,
    pub len: usize,
}

impl Bar {
    /// Maps `len` bytes of `fd` at `offset` (a VFIO region) read-write and shared.
    pub fn map(fd: &impl AsRawFd, offset: u64, len: usize) -> std::io::Result<Bar> {
        let offset = libc::off_t::try_from(offset)
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        // SAFETY: a fresh mapping chosen by the kernel (addr NULL) aliases no Rust object; the fd is
        // valid for the call; failure is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let base = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::Other))?;
        Ok(Bar { base, len })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check(&self, offset: usize, width: usize) -> Result<*mut u8, OutOfBounds> {
        let ok =
            offset % width == 0 && offset.checked_add(width).is_some_and(|end| end <= self.len);
        if !ok {
            return Err(OutOfBounds {
                offset,
                width,
                len: self.len,
            });
        }
        // In bounds: `offset + width <= len`, so the pointer stays inside the mapping.
        Ok(self.base.as_ptr().wrapping_add(offset))
    }

    pub fn read32(&self, offset: usize) -> Result<u32, OutOfBounds> {
        let p = self.check(offset, 4)?;
        // SAFETY: `check` proved p is 4-aligned and inside the live mapping; volatile for MMIO.
        Ok(unsafe { p.cast::<u32>().read_volatile() })
    }

    pub fn write32(&self, offset: usize, value: u32) -> Result<(), OutOfBounds> {
        let p = self.check(offset, 4)?;
        // SAFETY: as in read32.
        unsafe { p.cast::<u32>().write_volatile(value) };
        Ok(())
    }

    /// 64-bit registers (CAP, ASQ, ACQ) as two 32-bit accesses, low first, which every
    /// controller must accept (the spec allows it; some reject 64-bit MMIO).
    pub fn read64(&self, offset: usize) -> Result<u64, OutOfBounds> {
        self.check(offset, 8)?;
        let lo = self.read32(offset)? as u64;
        let hi = self.read32(offset + 4)? as u64;
        Ok(lo | (hi << 32))
    }

    pub fn write64(&self, offset: usize, value: u64) -> Result<(), OutOfBounds> {
        self.check(offset, 8)?;
        self.write32(offset, value as u32)?;
        self.write32(offset + 4, (value >> 32) as u32)
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        // SAFETY: base/len are exactly the mapping made in `map`, and no references into it exist.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

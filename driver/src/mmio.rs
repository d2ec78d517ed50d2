//! BAR0 mapped into our address space: bounds-checked volatile register access.
//! The only place the driver dereferences device memory.

use std::os::fd::AsRawFd;
use std::ptr::NonNull;

use crate::regs::Registers;

/// A memory-mapped PCI BAR. Accesses are volatile, naturally aligned and bounds-checked.
#[derive(Debug)]
pub struct Bar {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is device memory with no thread affinity; it is only accessed through
// volatile reads and writes of single registers, never through Rust references.
unsafe impl Send for Bar {}
// SAFETY: as above; concurrent register access is the device's concern.
unsafe impl Sync for Bar {}

impl Bar {
    /// Maps `len` bytes of `fd` at `offset` (a VFIO region) read-write and shared.
    pub fn map(fd: &impl AsRawFd, offset: u64, len: usize) -> std::io::Result<Bar> {
        let offset = libc::off_t::try_from(offset).map_err(|_| std::io::ErrorKind::InvalidInput)?;
        // SAFETY: a fresh mapping chosen by the kernel (addr NULL) aliases no Rust object; the fd is
        // valid for the call; failure is checked below.
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
        let base = NonNull::new(ptr.cast::<u8>()).ok_or(std::io::ErrorKind::AddrNotAvailable)?;
        Ok(Bar { base, len })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The register's address, if `offset` is 4-aligned and inside the BAR.
    fn register(&self, offset: usize) -> Option<*mut u32> {
        let inside =
            offset.is_multiple_of(4) && offset.checked_add(4).is_some_and(|end| end <= self.len);
        inside.then(|| self.base.as_ptr().wrapping_add(offset).cast::<u32>())
    }
}

impl Registers for Bar {
    fn read32(&self, offset: usize) -> u32 {
        let Some(p) = self.register(offset) else {
            debug_assert!(
                false,
                "register read at {offset:#x} outside BAR0 ({:#x} bytes)",
                self.len
            );
            log::error!(
                "register read at {offset:#x} outside BAR0 ({:#x} bytes)",
                self.len
            );
            return u32::MAX;
        };
        // SAFETY: `register` proved p is 4-aligned and inside the live mapping; volatile for MMIO.
        unsafe { p.read_volatile() }
    }

    fn write32(&self, offset: usize, value: u32) {
        let Some(p) = self.register(offset) else {
            debug_assert!(
                false,
                "register write at {offset:#x} outside BAR0 ({:#x} bytes)",
                self.len
            );
            log::error!(
                "register write at {offset:#x} outside BAR0 ({:#x} bytes)",
                self.len
            );
            return;
        };
        // SAFETY: as in read32.
        unsafe { p.write_volatile(value) }
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        // SAFETY: base/len are exactly the mapping made in `map`, and no references into it exist.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

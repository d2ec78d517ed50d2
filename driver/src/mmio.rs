//! BAR0 mapped into our address space: bounds-checked volatile register access.
//! The only place the driver dereferences device memory.

use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::Arc;

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

    /// Replaces the mapping in place with private memory in which every byte is 0xff: from now
    /// on registers read all ones, as a removed PCIe device's do, and writes go nowhere. The
    /// replacement is one `mremap` (the page tables change under the mmap lock), so a thread
    /// using the registers meanwhile sees either the device or all ones, never a hole. Used when
    /// the device is handed back to the kernel (hot removal) while controller handles live on:
    /// the mapping no longer holds the VFIO device file open.
    pub fn detach(&self) -> std::io::Result<()> {
        // SAFETY: a fresh anonymous mapping chosen by the kernel; failure is checked below.
        let fresh = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                self.len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if fresh == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fresh` is a private mapping of `len` bytes that nothing else knows of yet.
        unsafe { std::ptr::write_bytes(fresh.cast::<u8>(), 0xff, self.len) };
        // SAFETY: moves our own fresh mapping over the BAR's range, which this Bar owns; accesses
        // to that range are volatile register accesses that are valid on either mapping.
        let moved = unsafe {
            libc::mremap(
                fresh,
                self.len,
                self.len,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                self.base.as_ptr().cast::<libc::c_void>(),
            )
        };
        if moved == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            // SAFETY: the fresh mapping was not moved: unmap it, the BAR stays as it was.
            unsafe { libc::munmap(fresh, self.len) };
            return Err(e);
        }
        Ok(())
    }

    /// The register's address, if `offset` is 4-aligned and inside the BAR.
    fn register(&self, offset: usize) -> Option<*mut u32> {
        let inside =
            offset.is_multiple_of(4) && offset.checked_add(4).is_some_and(|end| end <= self.len);
        inside.then(|| self.base.as_ptr().wrapping_add(offset).cast::<u32>())
    }
}

impl Registers for Bar {
    fn as_bar(&self) -> Option<&Bar> {
        Some(self)
    }

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

/// One doorbell register, found once when its queue is created: on a mapped BAR its address
/// (bounds-checked here, once), so that ringing it is one volatile store; otherwise (`sim`, test
/// registers) through `Registers::write32`.
#[derive(Debug, Clone)]
pub(crate) struct Doorbell {
    /// Keeps the BAR (and so `direct`'s mapping) alive.
    regs: Arc<dyn Registers>,
    offset: usize,
    direct: Option<NonNull<u32>>,
}

// SAFETY: `direct` points into the BAR mapping that `regs` owns and keeps alive; the doorbell
// moves between threads with its queue pair, and register writes have no thread affinity.
unsafe impl Send for Doorbell {}

impl Doorbell {
    pub fn new(regs: Arc<dyn Registers>, offset: usize) -> Doorbell {
        let direct = regs
            .as_bar()
            .and_then(|bar| bar.register(offset))
            .and_then(NonNull::new);
        Doorbell {
            regs,
            offset,
            direct,
        }
    }

    #[inline]
    pub fn write(&self, value: u32) {
        match self.direct {
            // SAFETY: `Bar::register` checked that the 4-byte register lies inside the BAR and is
            // aligned; the mapping lives as long as `regs` (a detached BAR keeps its range mapped).
            Some(p) => unsafe { p.as_ptr().write_volatile(value) },
            None => self.regs.write32(self.offset, value),
        }
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        // SAFETY: base/len are exactly the mapping made in `map`, and no references into it exist.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_detached_bar_reads_all_ones_and_takes_writes() {
        let path = std::env::temp_dir().join(format!("usnvme-bar-{}", std::process::id()));
        std::fs::write(&path, vec![0u8; 8192]).expect("a file to map");
        let file = std::fs::File::options()
            .read(true)
            .write(true)
            .open(&path)
            .expect("open");
        let bar = Bar::map(&file, 0, 8192).expect("map");
        bar.write32(0x14, 0x46_0001);
        assert_eq!(bar.read32(0x14), 0x46_0001);
        bar.detach().expect("detach");
        assert_eq!(bar.read32(0x1c), u32::MAX);
        assert_eq!(bar.read32(0x1ffc), u32::MAX);
        bar.write32(0x1000, 7); // a doorbell write after removal goes nowhere harmful
        drop(bar);
        // the file kept what was written before the detach, and nothing after
        let data = std::fs::read(&path).expect("read");
        assert_eq!(&data[0x14..0x18], &0x46_0001u32.to_le_bytes());
        assert_eq!(&data[0x1000..0x1004], &[0u8; 4]);
        let _ = std::fs::remove_file(&path);
    }
}

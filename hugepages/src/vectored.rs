//! Vectored socket I/O straight into and out of DMA memory: `readv`/`writev` over
//! [`VolatileSlice`]s, so a network target moves data between a socket and the buffers the
//! drives use without a copy (and without ever borrowing DMA memory as `&[u8]`).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use vm_memory::VolatileSlice;

/// Most parts one call passes to the kernel (the rest wait for the next call): enough for a
/// queue's worth of read completions (header, data, response) in one `writev`.
pub const MAX_PARTS: usize = 64;

/// Parts most calls pass (a header and a buffer, a buffer and the receive buffer): their
/// iovecs go in an array this long, so that a call does not clear a whole [`MAX_PARTS`] one.
const FEW_PARTS: usize = 4;

const NO_IOVEC: libc::iovec = libc::iovec {
    iov_base: std::ptr::null_mut(),
    iov_len: 0,
};

/// Calls `f` with the iovecs of (at most [`MAX_PARTS`] of) `parts`.
fn with_iovecs<R>(parts: &[VolatileSlice<'_>], f: impl FnOnce(&[libc::iovec]) -> R) -> R {
    fn fill<'a>(iov: &'a mut [libc::iovec], parts: &[VolatileSlice<'_>]) -> &'a [libc::iovec] {
        for (v, p) in iov.iter_mut().zip(parts) {
            *v = libc::iovec {
                iov_base: p.ptr_guard_mut().as_ptr().cast(),
                iov_len: p.len(),
            };
        }
        &iov[..parts.len().min(iov.len())]
    }
    if parts.len() <= FEW_PARTS {
        f(fill(&mut [NO_IOVEC; FEW_PARTS], parts))
    } else {
        f(fill(&mut [NO_IOVEC; MAX_PARTS], parts))
    }
}

/// One `readv(2)` from `fd` into `parts`, in order; the bytes read (0: end of stream).
pub fn readv_volatile(fd: BorrowedFd<'_>, parts: &[VolatileSlice<'_>]) -> io::Result<usize> {
    // SAFETY: each iovec describes the memory of one live VolatileSlice (valid for writes of
    // its length for as long as `parts` is borrowed, which outlasts the call; without
    // vm-memory's xen feature its pointer guard only carries the pointer); the kernel writes
    // only into them; `fd` is a valid descriptor (BorrowedFd).
    let r = with_iovecs(parts, |iov| unsafe {
        libc::readv(fd.as_raw_fd(), iov.as_ptr(), iov.len() as libc::c_int)
    });
    usize::try_from(r).map_err(|_| io::Error::last_os_error())
}

/// One `writev(2)` of `parts`, in order, to `fd`; the bytes written.
pub fn writev_volatile(fd: BorrowedFd<'_>, parts: &[VolatileSlice<'_>]) -> io::Result<usize> {
    // SAFETY: each iovec describes the memory of one live VolatileSlice (valid for reads of
    // its length while `parts` is borrowed, which outlasts the call); the kernel only reads
    // them; `fd` is a valid descriptor (BorrowedFd).
    let r = with_iovecs(parts, |iov| unsafe {
        libc::writev(fd.as_raw_fd(), iov.as_ptr(), iov.len() as libc::c_int)
    });
    usize::try_from(r).map_err(|_| io::Error::last_os_error())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn gathers_and_scatters_in_order() {
        let (a, mut b) = UnixStream::pair().expect("pair");
        let (mut x, mut y) = ([1u8, 2, 3], [4u8, 5]);
        let parts = [
            VolatileSlice::from(&mut x[..]),
            VolatileSlice::from(&mut y[..]),
        ];
        assert_eq!(writev_volatile(a.as_fd(), &parts).expect("writev"), 5);
        let mut got = [0u8; 5];
        b.read_exact(&mut got).expect("read");
        assert_eq!(got, [1, 2, 3, 4, 5]);
        b.write_all(&[9, 8, 7, 6]).expect("write");
        let (mut p, mut q) = ([0u8; 1], [0u8; 8]);
        let parts = [
            VolatileSlice::from(&mut p[..]),
            VolatileSlice::from(&mut q[..]),
        ];
        assert_eq!(readv_volatile(a.as_fd(), &parts).expect("readv"), 4);
        assert_eq!((p, &q[..3]), ([9], &[8u8, 7, 6][..]));
    }
}

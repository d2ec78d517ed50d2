//! Interrupts on eventfds: the kernel's request interrupt (it wants the device back) and the
//! device's MSI-X vectors, wired with VFIO_DEVICE_SET_IRQS.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use nix::sys::eventfd::{EfdFlags, EventFd};

use crate::regs::{interrupt_eventfd, Interrupts};

use super::device::DeviceShared;
use super::{
    MSIX_MAX_VECTORS, VFIO_DEVICE_GET_IRQ_INFO, VFIO_DEVICE_SET_IRQS, VFIO_IRQ_SET_ACTION_TRIGGER,
    VFIO_IRQ_SET_DATA_EVENTFD, VFIO_PCI_MSIX_IRQ_INDEX, VFIO_PCI_REQ_IRQ_INDEX,
};

/// The kernel's request interrupt of `device` on a new eventfd: the kernel signals it when it
/// wants the device back (hot removal, unbind) and waits until the device file is closed.
pub(super) fn request_eventfd(device: &File) -> std::io::Result<EventFd> {
    let fd = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC)?;
    set_irq_eventfds(device, VFIO_PCI_REQ_IRQ_INDEX, &[fd.as_raw_fd()])?;
    Ok(fd)
}

/// How many interrupts of `index` the device has (VFIO_DEVICE_GET_IRQ_INFO): for MSI-X, its
/// table size.
fn irq_count(device: &File, index: u32) -> std::io::Result<u32> {
    /// `struct vfio_irq_info`.
    #[repr(C)]
    struct IrqInfo {
        argsz: u32,
        flags: u32,
        index: u32,
        count: u32,
    }
    let mut info = IrqInfo {
        argsz: std::mem::size_of::<IrqInfo>() as u32,
        flags: 0,
        index,
        count: 0,
    };
    // SAFETY: the argument is the kernel's struct, argsz bytes long, which it reads and fills
    // in; the fd is the device's.
    let rc = unsafe { libc::ioctl(device.as_raw_fd(), VFIO_DEVICE_GET_IRQ_INFO, &mut info) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(info.count)
}

/// Triggers `fds[i]` on interrupt `i` of `index` (VFIO_DEVICE_SET_IRQS, starting at 0). For
/// MSI-X this enables that many vectors, re-programming every one.
fn set_irq_eventfds(device: &File, index: u32, fds: &[RawFd]) -> std::io::Result<()> {
    // `struct vfio_irq_set`: argsz, flags, index, start, count, then `count` i32 eventfds
    const HEADER: usize = 5;
    let count = u32::try_from(fds.len()).map_err(|_| std::io::ErrorKind::InvalidInput)?;
    let argsz =
        u32::try_from((HEADER + fds.len()) * 4).map_err(|_| std::io::ErrorKind::InvalidInput)?;
    let flags = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER;
    let mut set: Vec<u32> = Vec::with_capacity(HEADER + fds.len());
    set.extend([argsz, flags, index, 0, count]);
    // (the kernel reads the fds back as i32)
    set.extend(fds.iter().map(|&fd| fd as u32));
    // SAFETY: the argument is a complete vfio_irq_set with its `count` eventfds, argsz bytes
    // long, which the kernel only reads; the device descriptor is valid.
    let rc = unsafe { libc::ioctl(device.as_raw_fd(), VFIO_DEVICE_SET_IRQS, set.as_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The device's MSI-X vectors, through VFIO: the kernel takes each vector's interrupt and
/// signals its eventfd. (Given back to the kernel, the device has none: its file is closed,
/// which frees them.)
impl Interrupts for DeviceShared {
    fn vectors(&self) -> u16 {
        let Some(open) = &*self.open.lock() else {
            return 0;
        };
        match irq_count(&open.device, VFIO_PCI_MSIX_IRQ_INDEX) {
            Ok(n) => n.min(MSIX_MAX_VECTORS) as u16,
            Err(e) => {
                log::info!("{}: no MSI-X interrupt information: {e}", self.addr);
                0
            }
        }
    }

    fn enable(&self, count: u16) -> std::io::Result<Vec<Arc<EventFd>>> {
        let open = self.open.lock();
        let Some(open) = &*open else {
            return Err(std::io::ErrorKind::NotConnected.into());
        };
        let fds = (0..count)
            .map(|_| interrupt_eventfd().map(Arc::new))
            .collect::<std::io::Result<Vec<_>>>()?;
        let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
        set_irq_eventfds(&open.device, VFIO_PCI_MSIX_IRQ_INDEX, &raw)?;
        log::info!("{}: MSI-X enabled: {count} vectors", self.addr);
        Ok(fds)
    }
}

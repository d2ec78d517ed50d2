//! IOMMU groups attached to the container (the first gives it its IOMMU), and the ioctls that
//! open a device of a group and find its regions (BAR0, config space) in the device file.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::{Arc, Weak};

use crate::pci::PciAddress;

use super::dma::has_iommu;
use super::{
    Vfio, VfioError, VFIO_DEVICE_GET_REGION_INFO, VFIO_GROUP_FLAGS_VIABLE,
    VFIO_GROUP_GET_DEVICE_FD, VFIO_GROUP_GET_STATUS, VFIO_GROUP_SET_CONTAINER, VFIO_SET_IOMMU,
    VFIO_TYPE1V2_IOMMU,
};

/// An IOMMU group attached to the container. Closing its file (when its last open device is
/// closed) detaches it, unless the removal of its last device did already.
#[derive(Debug)]
pub(super) struct Group {
    file: File,
}

impl Vfio {
    /// The group numbered `id` (as its sysfs name says), attached to the container: the one
    /// already open, or opened now (then the first group gives the container its IOMMU).
    pub(super) fn attach_group(&self, addr: PciAddress, id: &str) -> Result<Arc<Group>, VfioError> {
        let number: u32 = id.parse().map_err(|_| VfioError::NoIommuGroup { addr })?;
        let mut groups = self.groups.lock();
        if let Some(group) = groups.get(&number).and_then(Weak::upgrade) {
            return Ok(group);
        }
        let path = format!("/dev/vfio/{number}");
        let failed = |what: &str| {
            let what = what.to_string();
            move |source| VfioError::Device { addr, what, source }
        };
        let file = File::options()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(failed(&path))?;
        // struct vfio_group_status: argsz, flags
        let mut status = [8u32, 0];
        // SAFETY: the buffer is the kernel's 8-byte struct, argsz says so; the fd is the group's.
        let rc =
            unsafe { libc::ioctl(file.as_raw_fd(), VFIO_GROUP_GET_STATUS, status.as_mut_ptr()) };
        if rc != 0 {
            return Err(failed("VFIO_GROUP_GET_STATUS")(
                std::io::Error::last_os_error(),
            ));
        }
        if status[1] & VFIO_GROUP_FLAGS_VIABLE == 0 {
            return Err(VfioError::GroupNotViable {
                addr,
                group: id.to_string(),
            });
        }
        let container: libc::c_int = self.container.as_raw_fd();
        // SAFETY: the kernel reads one int (the container's descriptor) from the pointer.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), VFIO_GROUP_SET_CONTAINER, &container) };
        if rc != 0 {
            return Err(failed("VFIO_GROUP_SET_CONTAINER")(
                std::io::Error::last_os_error(),
            ));
        }
        // The IOMMU comes with the first group (again if the last one left meanwhile).
        if !has_iommu(&*self.container) {
            // SAFETY: the argument is a plain value; the fd is the container's.
            let rc = unsafe { libc::ioctl(container, VFIO_SET_IOMMU, VFIO_TYPE1V2_IOMMU) };
            if rc != 0 {
                // (the group file closes on the way out, which detaches it)
                return Err(failed("VFIO_SET_IOMMU")(std::io::Error::last_os_error()));
            }
        }
        let group = Arc::new(Group { file });
        groups.insert(number, Arc::downgrade(&group));
        Ok(group)
    }
}

/// The device `addr` of `group`, opened.
pub(super) fn open_device(group: &Group, addr: PciAddress) -> std::io::Result<File> {
    let name = std::ffi::CString::new(addr.to_string()).map_err(std::io::Error::other)?;
    // SAFETY: the kernel reads the NUL-terminated name; the fd is the group's.
    let fd = unsafe {
        libc::ioctl(
            group.file.as_raw_fd(),
            VFIO_GROUP_GET_DEVICE_FD,
            name.as_ptr(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just created for this call, owned by nothing else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Where region `index` of `device` is in its file, and its size.
pub(super) fn region_info(device: &File, index: u32) -> std::io::Result<(u64, u64)> {
    /// `struct vfio_region_info`.
    #[repr(C)]
    struct RegionInfo {
        argsz: u32,
        flags: u32,
        index: u32,
        cap_offset: u32,
        size: u64,
        offset: u64,
    }
    let mut info = RegionInfo {
        argsz: std::mem::size_of::<RegionInfo>() as u32,
        flags: 0,
        index,
        cap_offset: 0,
        size: 0,
        offset: 0,
    };
    // SAFETY: the argument is the kernel's struct, argsz bytes long, which it reads and fills
    // in; the fd is the device's.
    let rc = unsafe { libc::ioctl(device.as_raw_fd(), VFIO_DEVICE_GET_REGION_INFO, &mut info) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((info.offset, info.size))
}

//! DMA mapping: the container's IOVA space, host memory mapped into its IOMMU domain, and the
//! IOVA ranges the IOMMU accepts (VFIO_IOMMU_GET_INFO, which vfio-ioctls lacks).

use std::os::fd::AsRawFd;
use std::sync::Arc;

use usnvme_hugepages::{DmaMapper, IovaSpace, MapError};
use vfio_ioctls::VfioContainer;

use super::{Vfio, FALLBACK_IOVA, VFIO_IOMMU_GET_INFO};

impl Vfio {
    /// The IOVA space of this container, created when first asked for (after a device is open,
    /// so that the IOMMU type is set and its valid ranges can be read).
    pub fn iova_space(self: &Arc<Self>) -> Arc<IovaSpace> {
        self.space
            .get_or_init(|| {
                IovaSpace::new(Arc::new(VfioMapper {
                    container: self.container.clone(),
                }))
            })
            .clone()
    }
}

/// Maps host memory into the container's IOMMU domain.
struct VfioMapper {
    container: Arc<VfioContainer>,
}

impl std::fmt::Debug for VfioMapper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("VfioMapper")
    }
}

impl DmaMapper for VfioMapper {
    unsafe fn map(&self, iova: u64, host: *mut u8, len: usize) -> Result<(), MapError> {
        // SAFETY: the caller guarantees [host, host + len) stays valid until unmapped, which is
        // what vfio_dma_map requires; the memory is only accessed volatile meanwhile.
        unsafe { self.container.vfio_dma_map(iova, len, host) }.map_err(|e| MapError::Map {
            iova,
            len: len as u64,
            source: std::io::Error::other(e),
        })
    }

    fn unmap(&self, iova: u64, len: usize) -> Result<(), MapError> {
        match self.container.vfio_dma_unmap(iova, len) {
            Ok(()) => Ok(()),
            // The last group left the container (its last device was dropped or removed): the
            // kernel released the IOMMU, and every mapping with it.
            Err(_) if !has_iommu(&*self.container) => Ok(()),
            Err(e) => Err(MapError::Unmap {
                iova,
                len: len as u64,
                source: std::io::Error::other(e),
            }),
        }
    }

    fn iova_ranges(&self) -> Vec<std::ops::Range<u64>> {
        match iommu_iova_ranges(&*self.container) {
            Some(ranges) if !ranges.is_empty() => ranges,
            _ => {
                log::warn!("VFIO reports no IOVA ranges; using {FALLBACK_IOVA:#x?}");
                vec![FALLBACK_IOVA]
            }
        }
    }
}

/// Whether the container has an IOMMU: from its first group's attachment to the last one's
/// leaving.
pub(super) fn has_iommu(container: &impl AsRawFd) -> bool {
    // argsz, flags, iova_pgsizes, cap_offset, pad: the kernel's minimum
    let mut info = [0u64; 3];
    info[0] = 24;
    // SAFETY: the buffer is 24 writable bytes, aligned for the kernel's struct, and argsz says
    // so; the fd is a valid container.
    unsafe {
        libc::ioctl(
            container.as_raw_fd(),
            VFIO_IOMMU_GET_INFO,
            info.as_mut_ptr(),
        ) == 0
    }
}

/// VFIO_IOMMU_GET_INFO's IOVA range capability: where the IOMMU accepts mappings.
fn iommu_iova_ranges(container: &impl AsRawFd) -> Option<Vec<std::ops::Range<u64>>> {
    const INFO_CAPS: u32 = 1 << 1;
    const CAP_IOVA_RANGE: u16 = 1;
    const HEADER: usize = 24; // argsz, flags, iova_pgsizes, cap_offset, pad
    let mut buf = vec![0u64; 512]; // 4 KiB, u64-aligned
    let bytes = buf.len() * 8;
    let argsz = u32::try_from(bytes).ok()?;
    buf[0] = argsz as u64; // argsz (low half), flags (high half) = 0
                           // SAFETY: the buffer is `argsz` bytes, writable and aligned for the kernel's struct; the
                           // kernel writes at most argsz bytes; the fd is a valid container.
    let rc = unsafe { libc::ioctl(container.as_raw_fd(), VFIO_IOMMU_GET_INFO, buf.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    let raw: Vec<u8> = buf.iter().flat_map(|w| w.to_le_bytes()).collect();
    let u16_at = |o: usize| raw.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| {
        raw.get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |o: usize| {
        raw.get(o..o + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    };
    if u32_at(4)? & INFO_CAPS == 0 {
        return None;
    }
    let mut offset = u32_at(16)? as usize;
    while offset >= HEADER && offset < bytes {
        if u16_at(offset)? == CAP_IOVA_RANGE {
            let count = u32_at(offset + 8)? as usize;
            let ranges = (0..count)
                .map(|i| {
                    let at = offset + 16 + i * 16;
                    Some(u64_at(at)?..u64_at(at + 8)?.saturating_add(1)) // end is inclusive
                })
                .collect::<Option<Vec<_>>>()?;
            return Some(ranges);
        }
        offset = u32_at(offset + 4)? as usize;
    }
    None
}

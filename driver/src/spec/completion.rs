//! Completion queue entries (NVMe Base 2.0, section 4.2.1).

use core::mem::offset_of;
use zerocopy::{FromBytes, Immutable, IntoBytes};

use super::status::Status;

/// A 16-byte completion queue entry.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, FromBytes, IntoBytes, Immutable)]
pub struct Cqe {
    /// Dword 0: command specific result.
    pub dw0: u32,
    /// Dword 1: command specific result.
    pub dw1: u32,
    /// SQ Head Pointer: how far the controller has consumed the submission queue.
    pub sqhd: u16,
    /// SQ Identifier of the command.
    pub sqid: u16,
    /// Command Identifier.
    pub cid: u16,
    /// Phase Tag (bit 0) and Status Field (bits 15:1); see [`Cqe::status`].
    pub status: u16,
}

const _: () = {
    assert!(offset_of!(Cqe, sqhd) == 8);
    assert!(offset_of!(Cqe, sqid) == 10);
    assert!(offset_of!(Cqe, cid) == 12);
    assert!(offset_of!(Cqe, status) == 14);
};

impl Cqe {
    /// An entry as a controller posts it.
    pub const fn new(dw0: u32, sqhd: u16, sqid: u16, cid: u16, status: Status, phase: bool) -> Cqe {
        Cqe {
            dw0,
            dw1: 0,
            sqhd,
            sqid,
            cid,
            status: status.to_word(phase),
        }
    }

    /// Phase Tag: the entry is new when it differs from the value of the previous pass.
    pub const fn phase(&self) -> bool {
        self.status & 1 != 0
    }

    /// The decoded Status Field.
    pub const fn status(&self) -> Status {
        Status::from_word(self.status)
    }
}

pod!(Cqe = 16);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_and_accessors() {
        let cqe = Cqe::new(0x1234, 5, 1, 42, Status::LBA_OUT_OF_RANGE.with_dnr(), true);
        let bytes = cqe.as_bytes();
        assert_eq!(&bytes[0..4], &[0x34, 0x12, 0, 0]);
        assert_eq!(&bytes[8..10], &[5, 0]);
        assert_eq!(&bytes[10..12], &[1, 0]);
        assert_eq!(&bytes[12..14], &[42, 0]);
        // Status word: DNR (15) | SC 0x80 << 1 | phase.
        assert_eq!(&bytes[14..16], &0x8101u16.to_le_bytes());
        let back = Cqe::from_bytes(bytes);
        assert!(back.phase());
        assert_eq!(back.status().code(), Status::LBA_OUT_OF_RANGE);
        assert!(back.status().dnr());
        let ok = Cqe::new(0, 0, 0, 0, Status::SUCCESS, false);
        assert!(!ok.phase() && ok.status().is_success());
    }
}

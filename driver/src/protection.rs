//! End-to-end data protection (NVM Command Set 1.0, section 5.3; T10 PI): the protection
//! information (PI) tuple a namespace formatted with it keeps in each block's metadata, how its
//! guard is computed, and the checks a drive (or the host, in software) makes on it.
//!
//! A tuple is 8 bytes with a 16-bit guard (CRC-16/T10-DIF, a 16-bit application tag, a 32-bit
//! reference tag) or 16 bytes with a 64-bit guard (CRC-64/NVME, a 16-bit application tag, a
//! 48-bit reference tag: no storage tag), big-endian, in the first or the last bytes of the
//! metadata. The guard covers the block's data and, when the tuple is last, the metadata bytes
//! before it. Type 1 and 2 reference tags count up by one per block from the command's; type 3
//! keeps the command's for every block. A tuple whose application tag is all ones (and, for
//! type 3, its reference tag too) is not checked: what a drive holds in never-written blocks.
//! The CRCs are the `crc` crate's catalogue entries, checked against the published test vectors.

use crc::{Crc, CRC_16_T10_DIF, CRC_64_NVME};

use crate::spec::Status;

static CRC16: Crc<u16> = Crc::<u16>::new(&CRC_16_T10_DIF);
static CRC64: Crc<u64> = Crc::<u64>::new(&CRC_64_NVME);

/// End-to-end protection type (Identify Namespace DPS bits 2:0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum PiType {
    Type1,
    Type2,
    Type3,
}

/// The guard's width (the Protection Information Format of the LBA format).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Guard {
    /// 16-bit guard, CRC-16/T10-DIF: an 8-byte tuple.
    Crc16,
    /// 64-bit guard, CRC-64/NVME: a 16-byte tuple.
    Crc64,
}

/// How a namespace's blocks carry protection information.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PiFormat {
    pub pi_type: PiType,
    pub guard: Guard,
    /// The tuple is in the first bytes of the metadata (DPS bit 3), else in the last.
    pub first: bool,
}

/// Which fields of each tuple the drive checks (PRCHK), and the host in software.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PiChecks {
    pub guard: bool,
    pub app_tag: bool,
    pub ref_tag: bool,
}

impl PiChecks {
    pub const ALL: PiChecks = PiChecks {
        guard: true,
        app_tag: true,
        ref_tag: true,
    };
    pub const NONE: PiChecks = PiChecks {
        guard: false,
        app_tag: false,
        ref_tag: false,
    };
}

/// What a read or write on a namespace with protection information asks of the drive: PRACT
/// (the drive inserts the tuples on writes and strips them on reads), PRCHK, and the expected
/// initial reference tag, application tag and mask (CDW14/CDW3, CDW15).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PiFields {
    pub action: bool,
    pub checks: PiChecks,
    pub ref_tag: u64,
    pub app_tag: u16,
    pub app_mask: u16,
}

/// PRINFO (CDW12 bits 29:26): PRACT, then PRCHK guard, application tag, reference tag.
const PRACT: u32 = 1 << 29;
const PRCHK_GUARD: u32 = 1 << 28;
const PRCHK_APP: u32 = 1 << 27;
const PRCHK_REF: u32 = 1 << 26;

impl PiFields {
    /// CDW12's PRINFO bits.
    pub fn cdw12(&self) -> u32 {
        let bit = |on: bool, b: u32| if on { b } else { 0 };
        bit(self.action, PRACT)
            | bit(self.checks.guard, PRCHK_GUARD)
            | bit(self.checks.app_tag, PRCHK_APP)
            | bit(self.checks.ref_tag, PRCHK_REF)
    }

    /// From a command's CDW12 (PRINFO), CDW14 and CDW3 (reference tag), CDW15 (tags).
    pub fn from_command(cdw12: u32, cdw14: u32, cdw3: u32, cdw15: u32, guard: Guard) -> Self {
        let high = match guard {
            Guard::Crc16 => 0,
            Guard::Crc64 => u64::from(cdw3 & 0xffff) << 32,
        };
        PiFields {
            action: cdw12 & PRACT != 0,
            checks: PiChecks {
                guard: cdw12 & PRCHK_GUARD != 0,
                app_tag: cdw12 & PRCHK_APP != 0,
                ref_tag: cdw12 & PRCHK_REF != 0,
            },
            ref_tag: high | u64::from(cdw14),
            app_tag: cdw15 as u16,
            app_mask: (cdw15 >> 16) as u16,
        }
    }
}

/// One tuple's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuple {
    pub guard: u64,
    pub app_tag: u16,
    pub ref_tag: u64,
}

/// Why a block failed its check: the field, what it held and what was expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PiError {
    #[error("guard {found:#x}, the data's is {computed:#x}")]
    Guard { found: u64, computed: u64 },
    #[error("application tag {found:#06x}, expected {expected:#06x} under mask {mask:#06x}")]
    AppTag {
        found: u16,
        expected: u16,
        mask: u16,
    },
    #[error("reference tag {found:#x}, expected {expected:#x}")]
    RefTag { found: u64, expected: u64 },
}

impl PiError {
    /// The status a drive completes the command with.
    pub fn status(&self) -> Status {
        match self {
            PiError::Guard { .. } => Status::GUARD_CHECK_ERROR,
            PiError::AppTag { .. } => Status::APPLICATION_TAG_CHECK_ERROR,
            PiError::RefTag { .. } => Status::REFERENCE_TAG_CHECK_ERROR,
        }
    }
}

impl PiFormat {
    /// Bytes of one tuple.
    pub const fn tuple_size(&self) -> usize {
        match self.guard {
            Guard::Crc16 => 8,
            Guard::Crc64 => 16,
        }
    }

    /// Where the tuple starts in metadata of `metadata_size` bytes (None: it does not fit).
    pub fn offset(&self, metadata_size: usize) -> Option<usize> {
        match metadata_size.checked_sub(self.tuple_size()) {
            Some(_) if self.first => Some(0),
            last => last,
        }
    }

    /// The checks a drive takes on this type: all but the reference tag's on type 3, whose
    /// tag is the host's own (a drive answers a reference tag check there with "Invalid
    /// Protection Information").
    pub fn allowed(&self, checks: PiChecks) -> PiChecks {
        PiChecks {
            ref_tag: checks.ref_tag && self.pi_type != PiType::Type3,
            ..checks
        }
    }

    /// The largest reference tag, and the mask of a block's LBA that type 1 expects in it.
    pub const fn ref_tag_mask(&self) -> u64 {
        match self.guard {
            Guard::Crc16 => u32::MAX as u64,
            Guard::Crc64 => (1 << 48) - 1,
        }
    }

    /// The reference tag of the block `index` blocks after the one tagged `first`.
    pub fn ref_tag_at(&self, first: u64, index: u64) -> u64 {
        match self.pi_type {
            PiType::Type3 => first,
            PiType::Type1 | PiType::Type2 => first.wrapping_add(index) & self.ref_tag_mask(),
        }
    }

    /// The guard of a block: its data, then the metadata before the tuple.
    pub fn guard_of(&self, data: &[u8], metadata_before: &[u8]) -> u64 {
        match self.guard {
            Guard::Crc16 => {
                let mut d = CRC16.digest();
                d.update(data);
                d.update(metadata_before);
                u64::from(d.finalize())
            }
            Guard::Crc64 => {
                let mut d = CRC64.digest();
                d.update(data);
                d.update(metadata_before);
                d.finalize()
            }
        }
    }

    /// Reads the tuple at the start of `bytes` (at least [`tuple_size`](Self::tuple_size)).
    pub fn read_tuple(&self, bytes: &[u8]) -> Option<Tuple> {
        let be = |range: std::ops::Range<usize>| {
            bytes
                .get(range)
                .map(|b| b.iter().fold(0u64, |acc, &x| (acc << 8) | u64::from(x)))
        };
        Some(match self.guard {
            Guard::Crc16 => Tuple {
                guard: be(0..2)?,
                app_tag: be(2..4)? as u16,
                ref_tag: be(4..8)?,
            },
            Guard::Crc64 => Tuple {
                guard: be(0..8)?,
                app_tag: be(8..10)? as u16,
                ref_tag: be(10..16)?,
            },
        })
    }

    /// Writes `tuple` at the start of `bytes`; false when they are too short.
    pub fn write_tuple(&self, tuple: Tuple, bytes: &mut [u8]) -> bool {
        let (guard_len, ref_len) = match self.guard {
            Guard::Crc16 => (2, 4),
            Guard::Crc64 => (8, 6),
        };
        let Some(out) = bytes.get_mut(..self.tuple_size()) else {
            return false;
        };
        let mut at = 0;
        for (value, len) in [
            (tuple.guard, guard_len),
            (u64::from(tuple.app_tag), 2),
            (tuple.ref_tag, ref_len),
        ] {
            for i in 0..len {
                out[at + i] = (value >> (8 * (len - 1 - i))) as u8;
            }
            at += len;
        }
        true
    }

    /// Fills in the tuple of one block: `metadata` is the block's whole metadata.
    pub fn generate(&self, data: &[u8], metadata: &mut [u8], ref_tag: u64, app_tag: u16) {
        let Some(at) = self.offset(metadata.len()) else {
            return;
        };
        let guard = self.guard_of(data, &metadata[..if self.first { 0 } else { at }]);
        let tuple = Tuple {
            guard,
            app_tag,
            ref_tag: ref_tag & self.ref_tag_mask(),
        };
        self.write_tuple(tuple, &mut metadata[at..]);
    }

    /// Whether a tuple escapes every check: application tag all ones (types 1 and 2), and the
    /// reference tag all ones too (type 3).
    pub fn unchecked(&self, tuple: &Tuple) -> bool {
        tuple.app_tag == 0xffff
            && (self.pi_type != PiType::Type3 || tuple.ref_tag == self.ref_tag_mask())
    }

    /// Checks one block's tuple as a drive does with PRCHK `checks`, the expected reference
    /// tag `ref_tag` (already advanced to this block), application tag and mask.
    pub fn check(
        &self,
        data: &[u8],
        metadata: &[u8],
        fields: &PiFields,
        ref_tag: u64,
    ) -> Result<(), PiError> {
        let Some(at) = self.offset(metadata.len()) else {
            return Ok(());
        };
        let Some(tuple) = self.read_tuple(&metadata[at..]) else {
            return Ok(());
        };
        if self.unchecked(&tuple) {
            return Ok(());
        }
        let checks = fields.checks;
        if checks.guard {
            let computed = self.guard_of(data, &metadata[..if self.first { 0 } else { at }]);
            if computed != tuple.guard {
                return Err(PiError::Guard {
                    found: tuple.guard,
                    computed,
                });
            }
        }
        if checks.app_tag && (tuple.app_tag & fields.app_mask) != (fields.app_tag & fields.app_mask)
        {
            return Err(PiError::AppTag {
                found: tuple.app_tag,
                expected: fields.app_tag,
                mask: fields.app_mask,
            });
        }
        let expected = ref_tag & self.ref_tag_mask();
        if checks.ref_tag && tuple.ref_tag != expected {
            return Err(PiError::RefTag {
                found: tuple.ref_tag,
                expected,
            });
        }
        Ok(())
    }
}

/// How a namespace's blocks carry metadata: bytes per block, where they travel (after each
/// block's data in the data buffer, "extended LBA", else in a buffer of their own at MPTR), and
/// the protection information in them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct MetadataFormat {
    pub size: u16,
    pub extended: bool,
    pub protection: Option<PiFormat>,
}

impl MetadataFormat {
    /// Whether a command with PRACT `action` moves no metadata: the drive inserts and strips a
    /// tuple that is all the metadata there is.
    pub fn stripped(&self, action: bool) -> bool {
        action
            && self
                .protection
                .is_some_and(|pi| pi.tuple_size() == usize::from(self.size))
    }

    /// Bytes per block in the data buffer of a command (PRACT `action`) on blocks of
    /// `block_size` bytes, and in its separate metadata buffer (0: none).
    pub fn bytes_per_block(&self, block_size: u32, action: bool) -> (u64, u64) {
        let moved = if self.stripped(action) {
            0
        } else {
            u64::from(self.size)
        };
        match self.extended {
            true => (u64::from(block_size) + moved, 0),
            false => (u64::from(block_size), moved),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T1_16: PiFormat = PiFormat {
        pi_type: PiType::Type1,
        guard: Guard::Crc16,
        first: false,
    };
    const T3_64: PiFormat = PiFormat {
        pi_type: PiType::Type3,
        guard: Guard::Crc64,
        first: false,
    };

    #[test]
    fn guards_match_the_published_test_vectors() {
        // CRC catalogue check values ("123456789")
        assert_eq!(T1_16.guard_of(b"123456789", &[]), 0xd0db);
        assert_eq!(T3_64.guard_of(b"123456789", &[]), 0xae8b_1486_0a79_9888);
        // NVM Command Set: 16-bit guard over 32 bytes
        let inc32: Vec<u8> = (0..32).collect();
        assert_eq!(T1_16.guard_of(&[0; 32], &[]), 0x0000);
        assert_eq!(T1_16.guard_of(&[0xff; 32], &[]), 0xa293);
        assert_eq!(T1_16.guard_of(&inc32, &[]), 0x0224);
        // NVM Command Set: 64-bit guard over 4 KiB
        let inc: Vec<u8> = (0..4096).map(|i| i as u8).collect();
        let dec: Vec<u8> = (0..4096).map(|i| 0xff - i as u8).collect();
        assert_eq!(T3_64.guard_of(&[0; 4096], &[]), 0x6482_d367_eb22_b64e);
        assert_eq!(T3_64.guard_of(&[0xff; 4096], &[]), 0xc0dd_ba73_02ec_a3ac);
        assert_eq!(T3_64.guard_of(&inc, &[]), 0x3e72_9f5f_6750_449c);
        assert_eq!(T3_64.guard_of(&dec, &[]), 0x9a2d_f64b_8e9e_517e);
        // data then metadata is one CRC, as if contiguous
        assert_eq!(
            T3_64.guard_of(&inc[..4000], &inc[4000..]),
            0x3e72_9f5f_6750_449c
        );
    }

    #[test]
    fn tuples_are_big_endian_at_the_start_or_end_of_the_metadata() {
        let mut md = [0u8; 16];
        T1_16.generate(&[0; 512], &mut md, 0x0102_0304, 0xabcd);
        assert_eq!(&md[..8], &[0; 8], "a 16-byte metadata keeps its tuple last");
        assert_eq!(&md[8..], &[0, 0, 0xab, 0xcd, 1, 2, 3, 4]);
        let first = PiFormat {
            first: true,
            ..T1_16
        };
        let mut md = [0u8; 8];
        first.generate(&[0xff; 32], &mut md, 7, 0);
        assert_eq!(md, [0xa2, 0x93, 0, 0, 0, 0, 0, 7]);
        let mut md = [0u8; 64];
        T3_64.generate(&[0; 4096], &mut md, 0x1122_3344_5566, 0x0102);
        let tuple = T3_64.read_tuple(&md[48..]).expect("16 bytes");
        assert_eq!(tuple.ref_tag, 0x1122_3344_5566);
        assert_eq!(&md[56..], &[1, 2, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66]);
        // the guard covers the metadata before a last tuple
        assert_ne!(tuple.guard, 0x6482_d367_eb22_b64e);
        assert_eq!(tuple.guard, T3_64.guard_of(&[0; 4096], &[0; 48]));
    }

    #[test]
    fn checks_name_the_field_that_differs_and_skip_escaped_tuples() {
        let data = vec![0x5a; 512];
        let mut md = [0u8; 8];
        T1_16.generate(&data, &mut md, 100, 0x0a0b);
        let fields = PiFields {
            checks: PiChecks::ALL,
            app_tag: 0x0a0b,
            app_mask: 0xffff,
            ..PiFields::default()
        };
        assert_eq!(T1_16.check(&data, &md, &fields, 100), Ok(()));
        let wrong_ref = T1_16.check(&data, &md, &fields, 101);
        assert_eq!(
            wrong_ref,
            Err(PiError::RefTag {
                found: 100,
                expected: 101
            })
        );
        assert_eq!(
            wrong_ref.map_err(|e| e.status()),
            Err(Status::REFERENCE_TAG_CHECK_ERROR)
        );
        let other_app = PiFields {
            app_tag: 0x0a0c,
            ..fields
        };
        assert!(matches!(
            T1_16.check(&data, &md, &other_app, 100),
            Err(PiError::AppTag { .. })
        ));
        let masked = PiFields {
            app_mask: 0xff00,
            ..other_app
        };
        assert_eq!(T1_16.check(&data, &md, &masked, 100), Ok(()));
        let mut flipped = data.clone();
        flipped[300] ^= 1;
        let guard = T1_16.check(&flipped, &md, &fields, 100);
        assert_eq!(
            guard.map_err(|e| e.status()),
            Err(Status::GUARD_CHECK_ERROR)
        );
        let no_guard = PiFields {
            checks: PiChecks {
                guard: false,
                ..PiChecks::ALL
            },
            ..fields
        };
        assert_eq!(T1_16.check(&flipped, &md, &no_guard, 100), Ok(()));
        // never-written blocks: all ones escape every check
        assert_eq!(T1_16.check(&flipped, &[0xff; 8], &fields, 5), Ok(()));
        assert_eq!(T3_64.check(&data, &[0xff; 16], &fields, 5), Ok(()));
        let mut t3 = [0xff; 16];
        t3[15] = 0; // type 3 escapes only with the reference tag all ones too
        assert!(T3_64.check(&data, &t3, &fields, 5).is_err());
    }

    #[test]
    fn reference_tags_count_per_block_except_type_3_and_wrap_at_their_width() {
        assert_eq!(T1_16.ref_tag_at(u32::MAX as u64, 1), 0, "32 bits wrap");
        let t1_64 = PiFormat {
            pi_type: PiType::Type1,
            ..T3_64
        };
        assert_eq!(t1_64.ref_tag_at(u32::MAX as u64, 1), 1 << 32, "48 bits");
        assert_eq!(t1_64.ref_tag_at((1 << 48) - 1, 1), 0);
        assert_eq!(T3_64.ref_tag_at(9, 5), 9);
    }

    #[test]
    fn prinfo_and_tags_round_trip_through_the_command_dwords() {
        let fields = PiFields {
            action: true,
            checks: PiChecks {
                guard: true,
                app_tag: false,
                ref_tag: true,
            },
            ref_tag: 0x1234_5678_9abc,
            app_tag: 0x1111,
            app_mask: 0xf0f0,
        };
        let cdw12 = fields.cdw12();
        assert_eq!(cdw12, 0b1101 << 26);
        let cdw15 = u32::from(fields.app_tag) | u32::from(fields.app_mask) << 16;
        let back = PiFields::from_command(cdw12, 0x5678_9abc, 0x1234, cdw15, Guard::Crc64);
        assert_eq!(back, fields);
        let short = PiFields::from_command(cdw12, 0x5678_9abc, 0x1234, cdw15, Guard::Crc16);
        assert_eq!(short.ref_tag, 0x5678_9abc);
    }

    #[test]
    fn what_travels_where_per_format_and_pract() {
        let pi8 = MetadataFormat {
            size: 8,
            extended: true,
            protection: Some(T1_16),
        };
        assert_eq!(pi8.bytes_per_block(512, false), (520, 0));
        assert_eq!(pi8.bytes_per_block(512, true), (512, 0), "stripped");
        let dix = MetadataFormat {
            extended: false,
            ..pi8
        };
        assert_eq!(dix.bytes_per_block(512, false), (512, 8));
        assert_eq!(dix.bytes_per_block(512, true), (512, 0));
        let pi64 = MetadataFormat {
            size: 64,
            extended: true,
            protection: Some(T3_64),
        };
        assert_eq!(
            pi64.bytes_per_block(4096, true),
            (4160, 0),
            "more than the tuple"
        );
        let plain = MetadataFormat {
            size: 16,
            extended: false,
            protection: None,
        };
        assert_eq!(plain.bytes_per_block(4096, true), (4096, 16));
    }
}

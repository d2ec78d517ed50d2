//! The block stamp of `usnvme perf --verify`: the one definition that perf (which writes and
//! checks it) and `cargo xtask vm-test` (which checks it in the drives' image files after the
//! VM suites) share. A crate of its own so that xtask needs nothing of the driver stack.
//!
//! Every byte of a stamped block follows from its byte offset on the device and the run's seed,
//! as with fio's `verify=crc32c`, so a transfer that loses, tears or misplaces any part of a
//! block is caught, not only one that spoils its first bytes. Little-endian:
//!
//! | bytes  | what                                                                |
//! |--------|---------------------------------------------------------------------|
//! | 0..8   | [`MAGIC`]                                                           |
//! | 8..16  | the block's byte offset on the device perf wrote                    |
//! | 16..24 | the run's seed                                                      |
//! | 24..28 | the block's length in bytes                                         |
//! | 28..32 | CRC32C of every other byte of the block                             |
//! | 32..   | fill: a splitmix64 stream keyed by offset and seed, 8 bytes a word   |
//!
//! A reader [`poison`]s each block of its buffer before a read: a read that completes but brings
//! no data (QEMU's NVMe does so when its DMA hits an unmapped IOVA) leaves the poison there,
//! which no drive holds by itself (unwritten blocks read as zeroes) and which is no stamp.

use std::fmt;

/// The first 8 bytes of a stamped block. (`USNVPERF` marked the 32-byte stamps of earlier
/// builds: a new magic makes those "not written by this run" rather than corrupt.)
pub const MAGIC: [u8; 8] = *b"USNVPRF2";
/// The header's length: the fill starts after it.
pub const HEADER: usize = 32;
/// The word a reader fills its buffer with before a read.
pub const POISON: [u8; 8] = *b"USNVPOIS";

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(GOLDEN);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The little-endian word at byte `at` (the caller checked the length).
fn word(block: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&block[at..at + 8]);
    u64::from_le_bytes(w)
}

/// The little-endian 32-bit word at byte `at` (the caller checked the length).
fn word32(block: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&block[at..at + 4]);
    u32::from_le_bytes(w)
}

/// CRC32C of the block without its checksum field.
fn crc(block: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&block[..28]), &block[HEADER..])
}

/// Stamps `block`, the block at byte `offset` of its device, for run `seed`. A block shorter
/// than the header is left alone (no NVMe block is: 512 bytes at least).
pub fn stamp(block: &mut [u8], offset: u64, seed: u64) {
    let Ok(len) = u32::try_from(block.len()) else {
        return;
    };
    if block.len() < HEADER {
        return;
    }
    let key = splitmix(offset ^ splitmix(seed ^ u64::from_le_bytes(MAGIC)));
    for (i, chunk) in block[HEADER..].chunks_mut(8).enumerate() {
        // splitmix64 in counter form: word i is the ith output of the stream keyed `key`
        let w = splitmix(key.wrapping_add((i as u64).wrapping_mul(GOLDEN)));
        chunk.copy_from_slice(&w.to_le_bytes()[..chunk.len()]);
    }
    block[..8].copy_from_slice(&MAGIC);
    block[8..16].copy_from_slice(&offset.to_le_bytes());
    block[16..24].copy_from_slice(&seed.to_le_bytes());
    block[24..28].copy_from_slice(&len.to_le_bytes());
    let sum = crc(block);
    block[28..32].copy_from_slice(&sum.to_le_bytes());
}

/// Fills `block` with [`POISON`].
pub fn poison(block: &mut [u8]) {
    for chunk in block.chunks_mut(8) {
        chunk.copy_from_slice(&POISON[..chunk.len()]);
    }
}

/// Bytes of `block` that still hold the poison (whole words, as [`poison`] wrote them).
fn poisoned(block: &[u8]) -> usize {
    block
        .chunks(8)
        .filter(|c| *c == &POISON[..c.len()])
        .map(<[u8]>::len)
        .sum()
}

/// What a stamp's header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub offset: u64,
    pub seed: u64,
    /// The length of the block it was written for.
    pub len: u32,
}

/// The header `block` starts with, if it starts with [`MAGIC`] and holds a whole header (its
/// checksum unchecked: see [`check`]).
pub fn header(block: &[u8]) -> Option<Header> {
    if block.len() < HEADER || block[..8] != MAGIC {
        return None;
    }
    Some(Header {
        offset: word(block, 8),
        seed: word(block, 16),
        len: word32(block, 24),
    })
}

/// What a block read back holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The run's stamp for this offset, every byte as written.
    Intact,
    /// Not written by this run: zeroes, another run's stamp, anything else. Nothing to check.
    NotThisRun,
    /// Starts with the reader's poison: `poisoned` bytes of the `len`-byte block never arrived.
    Unread { poisoned: usize, len: usize },
    /// The run's intact stamp of the block at another byte offset (a misdirected write or read).
    Misplaced { offset: u64 },
    /// The run's stamp, but `bad` of `len` bytes differ from what was written, the first at byte
    /// `first`; `poisoned` of them still hold the reader's poison.
    Damaged {
        first: usize,
        bad: usize,
        poisoned: usize,
        len: usize,
    },
}

impl Verdict {
    /// Whether the block was one this run wrote (so it counts as checked).
    pub fn checked(&self) -> bool {
        *self != Verdict::NotThisRun
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Verdict::Intact => f.write_str("intact"),
            Verdict::NotThisRun => f.write_str("not written by this run"),
            Verdict::Unread { poisoned, len } if poisoned == len => {
                f.write_str("read brought no data (buffer still poisoned)")
            }
            Verdict::Unread { poisoned, len } => write!(
                f,
                "read brought only part of the block ({poisoned} of {len} bytes still poisoned)"
            ),
            Verdict::Misplaced { offset } => write!(f, "holds the block of byte offset {offset}"),
            Verdict::Damaged {
                first,
                bad,
                poisoned,
                len,
            } => {
                write!(
                    f,
                    "{bad} of {len} bytes differ from what was written, the first at byte {first}"
                )?;
                if poisoned > 0 {
                    write!(
                        f,
                        " ({poisoned} still poisoned: that part of the read brought no data)"
                    )?;
                }
                Ok(())
            }
        }
    }
}

/// Checks `block`, read from byte `at` of its device, against run `seed`'s stamp.
pub fn check(block: &[u8], at: u64, seed: u64) -> Verdict {
    let len = block.len();
    if block.starts_with(&POISON) {
        return Verdict::Unread {
            poisoned: poisoned(block),
            len,
        };
    }
    let Some(h) = header(block) else {
        return Verdict::NotThisRun;
    };
    if h.seed != seed {
        return Verdict::NotThisRun;
    }
    if h.len as usize == len && word32(block, 28) == crc(block) {
        return if h.offset == at {
            Verdict::Intact
        } else {
            Verdict::Misplaced { offset: h.offset }
        };
    }
    // Which bytes are wrong: against the block it should be, or the one its header names (a
    // misplaced block that is damaged too), whichever it is closer to. Only on a failure.
    let mut want = vec![0u8; len];
    let mut best: Option<(usize, usize)> = None;
    for offset in [at, h.offset] {
        stamp(&mut want, offset, seed);
        let (mut first, mut bad) = (None, 0);
        for (i, (got, wanted)) in block.iter().zip(&want).enumerate() {
            if got != wanted {
                first.get_or_insert(i);
                bad += 1;
            }
        }
        let first = first.unwrap_or(0);
        if best.is_none_or(|(_, b)| bad < b) {
            best = Some((first, bad));
        }
    }
    let (first, bad) = best.unwrap_or((0, 0));
    Verdict::Damaged {
        first,
        bad,
        poisoned: poisoned(block),
        len,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamped(len: usize, offset: u64, seed: u64) -> Vec<u8> {
        let mut b = vec![0u8; len];
        stamp(&mut b, offset, seed);
        b
    }

    #[test]
    fn a_stamped_block_checks_intact_and_every_byte_depends_on_offset_and_seed() {
        for len in [512, 4096] {
            let b = stamped(len, 8192, 7);
            assert_eq!(check(&b, 8192, 7), Verdict::Intact);
            assert_eq!(&b[..8], b"USNVPRF2");
            let other = stamped(len, 8192 + len as u64, 7);
            let reseeded = stamped(len, 8192, 8);
            // the fill differs almost everywhere (a byte may agree by chance)
            for o in [&other, &reseeded] {
                let same = b[HEADER..].iter().zip(&o[HEADER..]).filter(|(a, c)| a == c);
                assert!(same.count() < len / 64, "fill depends on offset and seed");
            }
            assert_eq!(
                header(&b),
                Some(Header {
                    offset: 8192,
                    seed: 7,
                    len: len as u32
                })
            );
        }
    }

    #[test]
    fn one_byte_anywhere_is_caught_and_located() {
        let b = stamped(4096, 0, 1);
        for at in [9, 30, 32, 2048, 4095] {
            let mut bad = b.clone();
            bad[at] ^= 0x20;
            assert_eq!(
                check(&bad, 0, 1),
                Verdict::Damaged {
                    first: at,
                    bad: 1,
                    poisoned: 0,
                    len: 4096
                },
                "byte {at}"
            );
        }
    }

    #[test]
    fn other_runs_zeroes_and_poison_are_told_apart() {
        let b = stamped(512, 512, 3);
        assert_eq!(check(&b, 512, 4), Verdict::NotThisRun);
        assert_eq!(check(&[0u8; 512], 512, 3), Verdict::NotThisRun);
        assert_eq!(check(&[0xffu8; 512], 512, 3), Verdict::NotThisRun);
        assert_eq!(check(&b, 1024, 3), Verdict::Misplaced { offset: 512 });
        let mut p = vec![0u8; 512];
        poison(&mut p);
        assert!(header(&p).is_none(), "the poison is no stamp");
        let v = check(&p, 512, 3);
        assert_eq!(
            v,
            Verdict::Unread {
                poisoned: 512,
                len: 512
            }
        );
        assert_eq!(
            v.to_string(),
            "read brought no data (buffer still poisoned)"
        );
        // the first half arrived, the rest did not
        let mut torn = b.clone();
        poison(&mut torn[256..]);
        let v = check(&torn, 512, 3);
        assert!(
            matches!(
                v,
                Verdict::Damaged {
                    first: 256,
                    bad: 250..=256, // (a fill byte may match the poison by chance)
                    poisoned: 256,
                    ..
                }
            ),
            "{v:?}"
        );
        assert!(v.to_string().contains("still poisoned"), "{v}");
    }

    #[test]
    fn a_misplaced_block_that_is_also_damaged_is_located_within_itself() {
        let mut b = stamped(4096, 4096, 5);
        b[1000] ^= 1;
        assert_eq!(
            check(&b, 8192, 5),
            Verdict::Damaged {
                first: 1000,
                bad: 1,
                poisoned: 0,
                len: 4096
            }
        );
    }
}

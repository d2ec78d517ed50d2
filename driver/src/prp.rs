//! Data pointers: PRP1/PRP2/PRP lists and SGL data blocks for an IOVA-contiguous buffer, following
//! the spec's rules: PRP1 may start mid-page (dword aligned), every later entry is page aligned,
//! PRP2 is the second page when the transfer touches exactly two, else a list pointer.

/// The memory page size the driver programs (CC.MPS = 0).
pub const PAGE: u64 = 4096;

/// How the data pointer of one command looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrpLayout {
    /// PRP1 alone (PRP2 = 0).
    One { prp1: u64 },
    /// PRP1 and the second page in PRP2.
    Two { prp1: u64, prp2: u64 },
    /// PRP1, then `entries` page addresses starting at `first_entry`, in a list that PRP2 points to.
    List {
        prp1: u64,
        first_entry: u64,
        entries: u32,
    },
}

/// The layout for `len` bytes at `iova` (len > 0, iova dword aligned).
pub fn layout(iova: u64, len: u32) -> PrpLayout {
    let first_page_bytes = PAGE - (iova % PAGE);
    if len as u64 <= first_page_bytes {
        return PrpLayout::One { prp1: iova };
    }
    let next_page = iova - (iova % PAGE) + PAGE;
    let rest = len as u64 - first_page_bytes;
    let pages = rest.div_ceil(PAGE) as u32;
    if pages == 1 {
        PrpLayout::Two {
            prp1: iova,
            prp2: next_page,
        }
    } else {
        PrpLayout::List {
            prp1: iova,
            first_entry: next_page,
            entries: pages,
        }
    }
}

/// Pages touched by `len` bytes at `iova`: the number of PRP entries in all.
pub fn pages(iova: u64, len: u32) -> u64 {
    let start = iova - (iova % PAGE);
    (iova + len as u64).div_ceil(PAGE) - start / PAGE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_page_or_less_is_prp1_alone() {
        assert_eq!(layout(0x10_0000, 4096), PrpLayout::One { prp1: 0x10_0000 });
        assert_eq!(layout(0x10_0200, 512), PrpLayout::One { prp1: 0x10_0200 });
        assert_eq!(layout(0x10_0e00, 512), PrpLayout::One { prp1: 0x10_0e00 });
    }

    #[test]
    fn two_pages_put_the_second_in_prp2() {
        assert_eq!(
            layout(0x10_0000, 8192),
            PrpLayout::Two {
                prp1: 0x10_0000,
                prp2: 0x10_1000
            }
        );
        // mid-page start spilling into the next page
        assert_eq!(
            layout(0x10_0e00, 1024),
            PrpLayout::Two {
                prp1: 0x10_0e00,
                prp2: 0x10_1000
            }
        );
    }

    #[test]
    fn more_pages_need_a_list_of_page_aligned_entries() {
        assert_eq!(
            layout(0x10_0000, 128 * 1024),
            PrpLayout::List {
                prp1: 0x10_0000,
                first_entry: 0x10_1000,
                entries: 31
            }
        );
        // 8 KiB starting mid-page touches three pages
        assert_eq!(
            layout(0x10_0200, 8192),
            PrpLayout::List {
                prp1: 0x10_0200,
                first_entry: 0x10_1000,
                entries: 2
            }
        );
        assert_eq!(pages(0x10_0200, 8192), 3);
        assert_eq!(pages(0x10_0000, 512 * 1024), 128);
    }
}

//! First-fit IOVA allocation over the ranges an IOMMU accepts.

use std::collections::BTreeMap;
use std::ops::Range;

/// A range given to [`IovaAllocator::free`] that it did not hand out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "IOVA range {iova:#x}+{len:#x} was not allocated (double free, or outside the IOVA ranges)"
)]
pub struct IovaError {
    pub iova: u64,
    pub len: u64,
}

/// Hands out IOVA ranges from a set of valid ranges: first fit, power-of-two alignment, never
/// address 0 (so that a zero IOVA is always a bug the IOMMU catches). Setup path only: O(free ranges).
#[derive(Debug, Clone)]
pub struct IovaAllocator {
    /// Valid ranges, sorted, disjoint, not touching, without 0.
    ranges: Vec<Range<u64>>,
    /// Free ranges: start -> end (exclusive); disjoint and never adjacent (always merged).
    free: BTreeMap<u64, u64>,
}

impl IovaAllocator {
    /// An allocator over `ranges` (any order; overlapping or empty ranges are fine).
    pub fn new(ranges: &[Range<u64>]) -> IovaAllocator {
        let mut sorted: Vec<Range<u64>> = ranges
            .iter()
            .map(|r| r.start.max(1)..r.end)
            .filter(|r| r.start < r.end)
            .collect();
        sorted.sort_by_key(|r| r.start);
        let mut merged: Vec<Range<u64>> = Vec::with_capacity(sorted.len());
        for r in sorted {
            match merged.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        let free = merged.iter().map(|r| (r.start, r.end)).collect();
        IovaAllocator {
            ranges: merged,
            free,
        }
    }

    /// The valid ranges, normalised (sorted, merged, without address 0).
    pub fn ranges(&self) -> &[Range<u64>] {
        &self.ranges
    }

    /// The free ranges now, sorted.
    pub fn free_ranges(&self) -> Vec<Range<u64>> {
        self.free.iter().map(|(&s, &e)| s..e).collect()
    }

    /// Total free bytes.
    pub fn free_bytes(&self) -> u64 {
        self.free.iter().map(|(s, e)| e - s).sum()
    }

    /// The lowest `align`-aligned range of `len` bytes that is free, or `None` when none is (or
    /// `len` is 0, or `align` is not a power of two). Never returns 0.
    pub fn alloc(&mut self, len: u64, align: u64) -> Option<u64> {
        if len == 0 || !align.is_power_of_two() {
            return None;
        }
        let (start, end, iova) = self.free.iter().find_map(|(&start, &end)| {
            let iova = start.checked_next_multiple_of(align)?;
            (iova.checked_add(len)? <= end).then_some((start, end, iova))
        })?;
        self.free.remove(&start);
        if start < iova {
            self.free.insert(start, iova);
        }
        if iova + len < end {
            self.free.insert(iova + len, end);
        }
        Some(iova)
    }

    /// Returns `[iova, iova+len)` to the free ranges, merging it with its neighbours. Fails, changing
    /// nothing, unless the whole range is allocated and inside the valid ranges.
    pub fn free(&mut self, iova: u64, len: u64) -> Result<(), IovaError> {
        let err = IovaError { iova, len };
        let end = iova.checked_add(len).ok_or(err.clone())?;
        if len == 0 || !self.ranges.iter().any(|r| r.start <= iova && end <= r.end) {
            return Err(err);
        }
        let before = self.free.range(..end).next_back().map(|(&s, &e)| (s, e));
        if before.is_some_and(|(_, e)| e > iova) {
            return Err(err); // overlaps a free range: double free
        }
        let (mut start, mut stop) = (iova, end);
        if let Some((s, e)) = before.filter(|&(_, e)| e == iova) {
            self.free.remove(&s);
            start = s;
            debug_assert_eq!(e, iova);
        }
        if let Some(e) = self.free.remove(&end) {
            stop = e;
        }
        self.free.insert(start, stop);
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::single_range_in_vec_init)] // IOVA ranges, not a range of values
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn first_fit_aligned_and_never_zero() {
        let mut a = IovaAllocator::new(&[0..0x10000]);
        assert_eq!(a.ranges(), &[1..0x10000]);
        assert_eq!(a.alloc(0x1000, 0x1000), Some(0x1000));
        assert_eq!(a.alloc(0x10, 1), Some(1));
        assert_eq!(a.alloc(0x2000, 0x2000), Some(0x2000));
        assert_eq!(a.alloc(0x1000, 0x1000), Some(0x4000));
        assert_eq!(a.alloc(0, 1), None);
        assert_eq!(a.alloc(1, 3), None);
        assert_eq!(a.alloc(0x10000, 1), None);
    }

    #[test]
    fn free_merges_neighbours_and_rejects_bad_frees() {
        let mut a = IovaAllocator::new(&[0x1000..0x5000]);
        let x = a.alloc(0x1000, 0x1000).expect("x");
        let y = a.alloc(0x1000, 0x1000).expect("y");
        let z = a.alloc(0x1000, 0x1000).expect("z");
        assert_eq!(a.free_ranges(), vec![0x4000..0x5000]);
        a.free(y, 0x1000).expect("free y");
        assert_eq!(a.free_ranges(), vec![0x2000..0x3000, 0x4000..0x5000]);
        assert!(a.free(y, 0x1000).is_err(), "double free");
        assert!(a.free(0x1800, 0x1000).is_err(), "overlaps free space");
        assert!(a.free(0x5000, 0x1000).is_err(), "outside the ranges");
        a.free(z, 0x1000).expect("free z merges both sides");
        assert_eq!(a.free_ranges(), vec![0x2000..0x5000]);
        a.free(x, 0x1000).expect("free x");
        assert_eq!(a.free_ranges(), vec![0x1000..0x5000]);
    }

    #[test]
    fn spans_several_ranges() {
        let mut a = IovaAllocator::new(&[0x8000..0x9000, 0x1000..0x2000, 0x1800..0x3000]);
        assert_eq!(a.ranges(), &[0x1000..0x3000, 0x8000..0x9000]);
        assert_eq!(a.alloc(0x2000, 0x1000), Some(0x1000));
        assert_eq!(a.alloc(0x1000, 0x1000), Some(0x8000));
        assert_eq!(a.alloc(1, 1), None);
        assert!(
            a.free(0x2800, 0x6000).is_err(),
            "crosses a gap between ranges"
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc { len: u64, align_log2: u32 },
        Free(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1u64..0x40_0000, 0u32..22).prop_map(|(len, align_log2)| Op::Alloc { len, align_log2 }),
            any::<usize>().prop_map(Op::Free),
        ]
    }

    proptest! {
        #[test]
        fn random_alloc_free_sequences(ops in proptest::collection::vec(op(), 1..200)) {
            let ranges = [0..0x100_0000, 0x400_0000..0x480_0000, 0x1_0000_0000..0x1_0100_0000];
            let mut a = IovaAllocator::new(&ranges);
            let valid = a.ranges().to_vec();
            let total = a.free_bytes();
            let mut live: Vec<(u64, u64)> = Vec::new();
            for op in ops {
                match op {
                    Op::Alloc { len, align_log2 } => {
                        let align = 1u64 << align_log2;
                        if let Some(iova) = a.alloc(len, align) {
                            prop_assert!(iova != 0);
                            prop_assert_eq!(iova % align, 0);
                            prop_assert!(valid.iter().any(|r| r.start <= iova && iova + len <= r.end));
                            for &(s, l) in &live {
                                prop_assert!(iova + len <= s || s + l <= iova, "overlap");
                            }
                            live.push((iova, len));
                        }
                    }
                    Op::Free(i) if !live.is_empty() => {
                        let (s, l) = live.swap_remove(i % live.len());
                        prop_assert!(a.free(s, l).is_ok());
                        prop_assert!(a.free(s, l).is_err());
                    }
                    Op::Free(_) => {}
                }
                let used: u64 = live.iter().map(|&(_, l)| l).sum();
                prop_assert_eq!(a.free_bytes() + used, total);
            }
            for (s, l) in live {
                prop_assert!(a.free(s, l).is_ok());
            }
            prop_assert_eq!(a.free_ranges(), valid);
        }
    }
}

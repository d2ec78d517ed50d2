//! I/Os split into parts (at MDTS, or across a stripe's drives), each completed once when all
//! of its parts are done: a fixed slab of parent I/Os, indexed by the token the parts carry.
//! Allocated up front; nothing on the I/O path allocates.

use std::sync::Arc;

use usnvme_driver::spec::Status;

use super::{BlockError, Failure, Finished};

#[derive(Debug, Clone, Default)]
struct Parent {
    token: u64,
    remaining: u32,
    failure: Option<Failure>,
    submitted_ns: u64,
    bytes: u64,
}

#[derive(Debug)]
pub(crate) struct SplitIos {
    parents: Box<[Parent]>,
    free: Vec<u32>,
}

impl SplitIos {
    pub fn new(capacity: usize) -> SplitIos {
        SplitIos {
            parents: vec![Parent::default(); capacity].into_boxed_slice(),
            free: (0..capacity as u32).rev().collect(),
        }
    }

    #[cfg(test)]
    fn has_room(&self) -> bool {
        !self.free.is_empty()
    }

    /// A parent for an I/O of `parts` parts moving `bytes`, submitted at `now_ns`; its index
    /// is the token of every part.
    pub fn start(&mut self, token: u64, parts: u32, bytes: u64, now_ns: u64) -> Option<u64> {
        let index = self.free.pop()?;
        self.parents[index as usize] = Parent {
            token,
            remaining: parts,
            failure: None,
            submitted_ns: now_ns,
            bytes,
        };
        Some(index as u64)
    }

    /// Queues an I/O of `parts` commands that completes once, as `token`, when every part has:
    /// `submit(i, part_token)` queues part `i` with the token its completion carries (`mark`
    /// and the parent's index). The caller made sure there is room for every part. A part
    /// the layer below refuses: the first refuses the whole I/O (nothing was queued); a later
    /// one fails the parts left, and the I/O completes with an error once the queued ones have.
    #[allow(clippy::too_many_arguments)]
    pub fn submit(
        &mut self,
        device: &Arc<str>,
        token: u64,
        parts: usize,
        bytes: u64,
        now_ns: u64,
        mark: u64,
        mut submit: impl FnMut(usize, u64) -> Result<(), BlockError>,
    ) -> Result<(), BlockError> {
        let Some(parent) = self.start(token, parts as u32, bytes, now_ns) else {
            return Err(BlockError::busy(device, parts));
        };
        for part in 0..parts {
            let Err(err) = submit(part, mark | parent) else {
                continue;
            };
            if part == 0 {
                let _ = self.parts_done(parent, parts as u32, None);
                return Err(err);
            }
            let failed = Failure {
                device: device.clone(),
                status: Status::INTERNAL_ERROR,
            };
            let _ = self.parts_done(parent, (parts - part) as u32, Some(failed));
            log::error!("{err}: I/O partly submitted; it will complete with an error");
            return Ok(());
        }
        Ok(())
    }

    /// One part finished (`failure`: how, if it failed); the whole I/O when it was the last.
    /// The first failure wins.
    pub fn part_done(&mut self, index: u64, failure: Option<Failure>) -> Option<Finished> {
        self.parts_done(index, 1, failure)
    }

    /// `n` parts finished (or were never submitted), failed with `failure` if it is some.
    pub fn parts_done(&mut self, index: u64, n: u32, failure: Option<Failure>) -> Option<Finished> {
        let parent = self.parents.get_mut(index as usize)?;
        if parent.remaining == 0 {
            log::error!("completion for I/O slot {index}, which has no parts left: ignored");
            return None;
        }
        if parent.failure.is_none() {
            parent.failure = failure;
        }
        parent.remaining = parent.remaining.saturating_sub(n);
        if parent.remaining > 0 {
            return None;
        }
        self.free.push(index as u32);
        Some(Finished {
            token: parent.token,
            failure: parent.failure.take(),
            submitted_ns: parent.submitted_ns,
            bytes: parent.bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use usnvme_driver::spec::Status;

    use super::*;
    use crate::block::IoError;

    #[test]
    fn completes_once_when_every_part_is_done_with_the_first_error() {
        let mut g = SplitIos::new(2);
        let a = g.start(100, 3, 12288, 5).unwrap();
        let b = g.start(200, 1, 4096, 6).unwrap();
        assert!(g.start(300, 1, 4096, 7).is_none(), "full");
        let err = Failure {
            device: Arc::from("d1"),
            status: Status::LBA_OUT_OF_RANGE,
        };
        assert_eq!(g.part_done(a, None), None);
        assert_eq!(g.part_done(a, Some(err.clone())), None);
        assert_eq!(
            g.part_done(b, None),
            Some(Finished {
                token: 200,
                failure: None,
                submitted_ns: 6,
                bytes: 4096
            })
        );
        let other = Failure {
            device: Arc::from("d2"),
            status: Status::INTERNAL_ERROR,
        };
        let done = g.part_done(a, Some(other)).expect("the last part");
        assert_eq!(
            done,
            Finished {
                token: 100,
                failure: Some(err),
                submitted_ns: 5,
                bytes: 12288
            }
        );
        // the error of its kind, naming the device it failed on
        assert_eq!(
            done.result(),
            Err(IoError::Device {
                device: Arc::from("d1"),
                status: Status::LBA_OUT_OF_RANGE
            })
        );
        assert!(g.has_room());
        assert_eq!(g.part_done(a, None), None, "a stray completion is ignored");
    }

    #[test]
    fn a_refused_first_part_refuses_the_io_and_a_later_one_fails_it() {
        let device: Arc<str> = Arc::from("d1");
        let refused = || BlockError::busy(&Arc::from("d1"), 1);
        let mut g = SplitIos::new(1);
        // the first part refused: nothing queued, the I/O refused, its slot free again
        let mut queued = Vec::new();
        let r = g.submit(&device, 7, 4, 4096, 0, 1 << 61, |i, t| {
            if i == 0 {
                return Err(refused());
            }
            queued.push(t);
            Ok(())
        });
        assert!(matches!(r, Err(BlockError::Busy { .. })), "{r:?}");
        assert!(queued.is_empty());
        assert!(g.has_room());
        // the third of four refused: two queued, the I/O fails once they complete
        let r = g.submit(&device, 8, 4, 4096, 3, 1 << 61, |i, t| {
            if i == 2 {
                return Err(refused());
            }
            queued.push(t);
            Ok(())
        });
        assert_eq!(r, Ok(()));
        assert_eq!(queued.len(), 2);
        assert!(queued.iter().all(|t| t & (1 << 61) != 0), "{queued:?}");
        let index = queued[0] & !(1 << 61);
        assert_eq!(g.part_done(index, None), None);
        let done = g.part_done(index, None).expect("the I/O completes");
        assert_eq!((done.token, done.submitted_ns), (8, 3));
        assert_eq!(
            done.result().map_err(|e| (e.status(), e.device().clone())),
            Err((Status::INTERNAL_ERROR, device))
        );
    }
}

//! Doorbells and completions: `flush` rings the SQ tail, `poll` reaps the CQ by phase tag and
//! tells the controller the CQ head; with shadow doorbells, MMIO only when EventIdx asks.

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use usnvme_hugepages::DmaRegion;

use crate::mmio::Doorbell;
use crate::regs::Registers;

use super::ring::ShadowEntry;
use super::{Completion, QueuePair};

/// Where the doorbells of this queue are: the MMIO registers, and the shadow doorbell /
/// EventIdx entries when Doorbell Buffer Config is on. Found once, when the queue is created.
#[derive(Debug)]
pub(crate) struct Doorbells {
    sq_tail: Doorbell,
    cq_head: Doorbell,
    shadow: Option<ShadowDoorbells>,
}

#[derive(Debug)]
struct ShadowDoorbells {
    sq_tail: ShadowEntry,
    cq_head: ShadowEntry,
    /// Write MMIO always, also keep the shadow current (the admin queue).
    always_mmio: bool,
}

impl Doorbells {
    /// The registers at byte offsets `sq_tail` and `cq_head` of `regs`.
    pub fn new(
        regs: &Arc<dyn Registers>,
        sq_tail: usize,
        cq_head: usize,
        shadow: Option<Shadow>,
    ) -> Doorbells {
        Doorbells {
            sq_tail: Doorbell::new(regs.clone(), sq_tail),
            cq_head: Doorbell::new(regs.clone(), cq_head),
            shadow: shadow.map(|s| ShadowDoorbells {
                sq_tail: ShadowEntry::new(s.pages.clone(), s.sq_tail, s.eventidx),
                cq_head: ShadowEntry::new(s.pages, s.cq_head, s.eventidx),
                always_mmio: s.always_mmio,
            }),
        }
    }
}

/// Shadow doorbell page and EventIdx page (one region of two pages) and this queue's offsets.
#[derive(Debug, Clone)]
pub(crate) struct Shadow {
    pub pages: Arc<DmaRegion>,
    pub sq_tail: usize,
    pub cq_head: usize,
    /// Offset of the EventIdx page in `pages`.
    pub eventidx: usize,
    /// Write MMIO always, also keep the shadow current (the admin queue).
    pub always_mmio: bool,
}

impl QueuePair {
    /// The count of fetched commands an SQ head of `sqhd` means, if it lies between the last
    /// head and the tail.
    #[inline]
    fn fetched_after(&self, sqhd: u16) -> Option<u32> {
        if sqhd >= self.depth {
            return None;
        }
        // ring distance from the last head, without a division
        let ahead = if sqhd >= self.sq_head {
            (sqhd - self.sq_head) as u32
        } else {
            sqhd as u32 + self.depth as u32 - self.sq_head as u32
        };
        let fetched = self.sq_fetched.wrapping_add(ahead);
        (self.sq_written.wrapping_sub(fetched) as i32 >= 0).then_some(fetched)
    }

    /// CQ entries consumed since the controller was last told the head.
    #[inline]
    fn cq_unacknowledged(&self) -> u16 {
        if self.cq_head >= self.cq_head_rung {
            self.cq_head - self.cq_head_rung
        } else {
            self.cq_head + self.depth - self.cq_head_rung
        }
    }

    /// Rings the SQ tail doorbell if commands were queued since the last time.
    pub fn flush(&mut self) {
        // After a controller reset the queues are gone until `poll` re-creates them.
        if self.sq_tail != self.sq_tail_rung && !self.lost_queues() {
            // SQEs must be visible in memory before the controller hears of them.
            fence(Ordering::Release);
            let (old, new) = (self.sq_tail_rung, self.sq_tail);
            let shadow = self
                .doorbells
                .shadow
                .as_ref()
                .map(|s| (&s.sq_tail, s.always_mmio));
            if ring(&self.doorbells.sq_tail, shadow, old, new) {
                self.stats.sq_doorbells += 1;
            }
            self.sq_tail_rung = new;
        }
    }

    /// Rings queued commands, then hands every available completion (at most one ring's worth)
    /// to `on_completion`. Returns how many completed.
    pub fn poll(&mut self, mut on_completion: impl FnMut(Completion)) -> usize {
        if self.lost_queues() {
            self.reconnect(&mut on_completion);
            if self.lost_queues() {
                // Re-creating the queues takes one admin command per poll, whose completion
                // raises no I/O vector: an owner asleep until an interrupt must come back.
                if self.recreating() {
                    self.raise_interrupt();
                }
                return 0; // a reset is under way: no doorbells, nothing to reap
            }
        }
        self.flush();
        let mut done = 0usize;
        let mut consumed = false;
        // Never more than one ring's worth per poll, so the head cannot lap the controller.
        for _ in 0..self.depth {
            // Phase first; the rest of the entry only after it is known to be new.
            let Some(cqe) = self.rings.new_cqe(self.cq_head, self.cq_phase) else {
                break;
            };
            self.cq_head += 1;
            if self.cq_head == self.depth {
                self.cq_head = 0;
                self.cq_phase = !self.cq_phase;
            }
            consumed = true;
            let cid = cqe.cid;
            // The SQ head a completion reports does not move back and not past the tail, and
            // lies past the command (a controller fetches a command before completing it). A
            // late copy of an older completion whose id was reused since fails the last test.
            let fetched = self.fetched_after(cqe.sqhd);
            let known = self.trackers.get(cid as usize).is_some_and(|t| {
                t.busy && fetched.is_some_and(|f| f.wrapping_sub(t.sq_position) as i32 > 0)
            });
            if !known {
                self.stats.garbage += 1;
                log::error!(
                    "queue {}: completion for command id {cid} (sqhd {}) that is not in flight: ignored",
                    self.qid,
                    cqe.sqhd
                );
                continue;
            }
            self.sq_head = cqe.sqhd;
            self.sq_fetched = fetched.unwrap_or(self.sq_fetched);
            let tracker = &mut self.trackers[cid as usize];
            tracker.busy = false;
            let t = *tracker;
            self.free_cids.push(cid);
            self.in_flight -= 1;
            self.stats.completed += 1;
            done += 1;
            on_completion(Completion {
                token: t.token,
                status: cqe.status,
                dw0: cqe.dw0,
                submitted_ns: t.started_ns,
                bytes: t.bytes,
            });
        }
        if self.in_flight == 0 {
            // every command written has completed, so the controller fetched them all
            (self.sq_head, self.sq_fetched) = (self.sq_tail, self.sq_written);
        }
        // The controller is told the head once it ran `cq_slack` entries ahead of what it was
        // told: until then the controller still has room for every command that can be in
        // flight (see `ring_entries`).
        if consumed && self.cq_unacknowledged() >= self.cq_slack {
            let shadow = self
                .doorbells
                .shadow
                .as_ref()
                .map(|s| (&s.cq_head, s.always_mmio));
            if ring(
                &self.doorbells.cq_head,
                shadow,
                self.cq_head_rung,
                self.cq_head,
            ) {
                self.stats.cq_doorbells += 1;
            }
            self.cq_head_rung = self.cq_head;
        }
        if self.timeout_ns > 0 {
            self.polls += 1;
            if self.polls >= self.timeout_check_polls {
                self.polls = 0;
                self.check_timeouts(&mut on_completion);
            }
        }
        done
    }
}

/// Writes a doorbell: the shadow entry and, when the EventIdx rule says the controller waits for
/// it (or the queue always uses MMIO), the register. Returns whether MMIO was written.
fn ring(mmio: &Doorbell, shadow: Option<(&ShadowEntry, bool)>, old: u16, new: u16) -> bool {
    if let Some((entry, always_mmio)) = shadow {
        if entry.write(new as u32) && !always_mmio {
            // The shadow value must be visible before we read the controller's EventIdx.
            fence(Ordering::SeqCst);
            if !need_event(entry.event_idx() as u16, new, old) {
                return false;
            }
        }
    }
    mmio.write(new as u32);
    true
}

/// The EventIdx rule: ring when the controller's event index lies in [old, new).
/// u16 arithmetic also holds when the index wraps at the queue depth.
fn need_event(event_idx: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event_idx).wrapping_sub(1) < new.wrapping_sub(old)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_idx_rule_rings_only_when_the_controller_waits_in_the_range() {
        // controller waits for index 5; we move the tail from 3 to 7: ring
        assert!(need_event(5, 7, 3));
        // it already saw up to 7; moving 7 -> 9: no ring
        assert!(!need_event(9, 9, 7));
        assert!(!need_event(2, 9, 7));
        // wrap at depth 16: old 14 -> new 2; event 15 is inside [14, 2) circularly
        assert!(need_event(15, 2, 14));
        assert!(need_event(0, 2, 14));
        assert!(!need_event(5, 2, 14));
    }
}

//! Fault injection: which commands a fault hits, and what happens to them.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::spec::{IoOpcode, Sqe, Status};

/// Which commands a fault hits. Every field that is set must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultWhen {
    /// The command's opcode (admin or I/O, as `qid` says).
    pub opcode: Option<u8>,
    /// Commands whose blocks overlap this LBA range (Read, Write, Write Zeroes, Compare,
    /// Verify); commands without LBAs never match.
    pub lba: Option<Range<u64>>,
    /// Start at the nth command (1-based) that matches the other fields, counted from injection.
    pub nth: Option<u64>,
    /// The submission queue: `Some(0)` for admin commands. `None`: any I/O queue (never the
    /// admin queue, whose opcodes overlap the I/O ones).
    pub qid: Option<u16>,
}

impl FaultWhen {
    /// Every I/O command.
    pub fn any_io() -> FaultWhen {
        FaultWhen::default()
    }

    /// I/O commands with this opcode (e.g. `IoOpcode::Read as u8`).
    pub fn opcode(opcode: u8) -> FaultWhen {
        FaultWhen {
            opcode: Some(opcode),
            ..FaultWhen::default()
        }
    }

    /// Admin commands with this opcode.
    pub fn admin(opcode: u8) -> FaultWhen {
        FaultWhen {
            opcode: Some(opcode),
            qid: Some(0),
            ..FaultWhen::default()
        }
    }

    /// Every admin command.
    pub fn any_admin() -> FaultWhen {
        FaultWhen {
            qid: Some(0),
            ..FaultWhen::default()
        }
    }

    pub fn with_lba(mut self, lba: Range<u64>) -> FaultWhen {
        self.lba = Some(lba);
        self
    }

    pub fn with_nth(mut self, nth: u64) -> FaultWhen {
        self.nth = Some(nth);
        self
    }

    pub fn with_qid(mut self, qid: u16) -> FaultWhen {
        self.qid = Some(qid);
        self
    }

    fn matches(&self, qid: u16, sqe: &Sqe) -> bool {
        match self.qid {
            Some(q) if q != qid => return false,
            None if qid == 0 => return false,
            _ => {}
        }
        if self.opcode.is_some_and(|op| op != sqe.opcode()) {
            return false;
        }
        if let Some(range) = &self.lba {
            let has_lbas = qid != 0
                && matches!(
                    IoOpcode::from_raw(sqe.opcode()),
                    Some(
                        IoOpcode::Read
                            | IoOpcode::Write
                            | IoOpcode::WriteZeroes
                            | IoOpcode::Compare
                            | IoOpcode::Verify
                    )
                );
            let (start, end) = (sqe.slba(), sqe.slba().saturating_add(sqe.blocks() as u64));
            if !has_lbas || start >= range.end || end <= range.start {
                return false;
            }
        }
        true
    }
}

/// What happens to a command a fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// Completes with this status instead of executing (and logs an Error Information entry).
    Fail(Status),
    /// Executes and completes this much later. Threaded mode: on time. Inline mode: at the first
    /// doorbell of its queue pair after the time has passed. Abort finds it meanwhile.
    Delay(Duration),
    /// Executes and completes only when the test says so ([`super::SimController::release`]):
    /// a test waits for events, not time. Abort finds it meanwhile.
    Hold,
    /// Never completes: the controller forgot it (Abort does not find it; only a reset helps).
    Drop,
    /// The controller fails: CSTS.CFS set; nothing is processed until a reset (CC.EN 1 -> 0).
    Fatal,
    /// Surprise removal: registers read all ones from now on, writes are ignored, nothing
    /// completes.
    Remove,
    /// Executes, but its completion carries a command id that is not in flight.
    UnknownCid,
    /// Executes and is completed twice.
    Duplicate,
    /// A write executes one block after its LBA and completes successfully: silent corruption.
    MisdirectWrite,
    /// A read executes and completes successfully, but the byte in the middle of its first block
    /// reaches the host flipped: silent corruption in transfer.
    CorruptRead,
    /// A read completes successfully without moving any data into the host's buffer, as QEMU's
    /// NVMe does when its DMA hits an unmapped IOVA.
    ReadNoData,
    /// Executes normally, then the controller raises this asynchronous event (a drive that
    /// heats up under the load, say).
    RaiseEvent(super::AsyncEventSpec),
}

/// A fault: `action` on up to `times` commands that match `when` (0: every one, forever).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub when: FaultWhen,
    pub action: FaultAction,
    pub times: u32,
}

impl Fault {
    /// Hits the first command that matches.
    pub fn new(when: FaultWhen, action: FaultAction) -> Fault {
        Fault {
            when,
            action,
            times: 1,
        }
    }

    pub fn times(mut self, times: u32) -> Fault {
        self.times = times;
        self
    }
}

#[derive(Debug)]
struct Armed {
    fault: Fault,
    matched: u64,
    fired: u32,
}

/// The faults armed on one controller.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    armed: Mutex<Vec<Armed>>,
    /// How many are armed: commands skip the lock while none is.
    count: AtomicUsize,
}

impl Faults {
    pub fn inject(&self, fault: Fault) {
        let mut armed = self.armed.lock();
        armed.push(Armed {
            fault,
            matched: 0,
            fired: 0,
        });
        self.count.store(armed.len(), Ordering::Release);
    }

    pub fn clear(&self) {
        let mut armed = self.armed.lock();
        armed.clear();
        self.count.store(0, Ordering::Release);
    }

    pub fn armed(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// The action for a command fetched from queue `qid`, if a fault hits it.
    pub fn check(&self, qid: u16, sqe: &Sqe) -> Option<FaultAction> {
        if self.count.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut armed = self.armed.lock();
        let index = armed.iter_mut().position(|a| {
            if !a.fault.when.matches(qid, sqe) {
                return false;
            }
            a.matched += 1;
            a.matched >= a.fault.when.nth.unwrap_or(1)
        })?;
        let hit = &mut armed[index];
        hit.fired += 1;
        let action = hit.fault.action;
        if hit.fault.times != 0 && hit.fired >= hit.fault.times {
            armed.remove(index);
            self.count.store(armed.len(), Ordering::Release);
        }
        Some(action)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nth_times_and_queue_selection() {
        let faults = Faults::default();
        faults.inject(
            Fault::new(
                FaultWhen::opcode(IoOpcode::Read as u8).with_nth(2),
                FaultAction::Drop,
            )
            .times(2),
        );
        let read = Sqe::read(1, 10, 1);
        assert_eq!(faults.check(0, &read), None, "admin queue not matched");
        assert_eq!(faults.check(1, &Sqe::write(1, 10, 1)), None);
        assert_eq!(faults.check(1, &read), None, "first match passes");
        assert_eq!(faults.check(2, &read), Some(FaultAction::Drop));
        assert_eq!(faults.check(1, &read), Some(FaultAction::Drop));
        assert_eq!(faults.check(1, &read), None, "spent after two");
        assert_eq!(faults.armed(), 0);

        faults.inject(Fault::new(
            FaultWhen::any_io().with_lba(100..108),
            FaultAction::Duplicate,
        ));
        assert_eq!(faults.check(1, &Sqe::read(1, 92, 8)), None);
        assert_eq!(faults.check(1, &Sqe::flush(1)), None);
        assert_eq!(
            faults.check(1, &Sqe::write(1, 96, 8)),
            Some(FaultAction::Duplicate)
        );

        faults.inject(Fault::new(FaultWhen::admin(0x06), FaultAction::Fatal).times(0));
        for _ in 0..3 {
            assert_eq!(
                faults.check(0, &Sqe::new(0x06)),
                Some(FaultAction::Fatal),
                "forever"
            );
        }
        faults.clear();
        assert_eq!(faults.check(0, &Sqe::new(0x06)), None);
    }
}

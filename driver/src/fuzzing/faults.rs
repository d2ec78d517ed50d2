//! The `sim_faults` target: I/O, injected faults, resets and polls against a RAM-backed `sim`
//! drive, checked against a model of the disk.
//!
//! The input: a header (inline or threaded sim, block size, queue depth, SGLs, shadow doorbells),
//! then steps. The invariants:
//! - every submitted command is handed back exactly once, with a success or an error status
//!   (timeouts, aborts and resets included), within a deadline: no hang;
//! - `in_flight` always equals the commands not yet handed back;
//! - a queue pair reports `Dead` only when the device was removed or admin commands were made to
//!   fail; otherwise, once the faults are cleared, it works again;
//! - what was written and not overwritten reads back equal: each block is known (its last write
//!   completed successfully with no other write to it in flight) or unknown (a failed, aborted
//!   or overlapping write); reads of known blocks are compared byte for byte;
//! - a command past the end of the namespace never succeeds;
//! - the controller never sees a DMA address that is not mapped.
//!
//! Faults that make the controller lie (a completion under a wrong command id, twice, a write
//! landing one block off, a "success" for a command it did not run) taint the run: from the
//! moment one is armed until a reset after it was cleared (only a reset guarantees that no late
//! copy of a completion and no held command comes back), nothing read is checked and whatever a
//! command may have touched becomes unknown.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use usnvme_hugepages::{BufferPool, DmaBuffer, PageSize};

use super::Input;
use crate::controller::{Controller, ControllerOptions, QueuePairOptions};
use crate::sim::{
    Backend, Fault, FaultAction, FaultWhen, SimConfig, SimController, SimMode, SimNamespace,
};
use crate::spec::{AdminOpcode, IoOpcode, Status};
use crate::{Completion, IoBuffer, QueuePair, SubmitError};

const NSID: u32 = 1;
/// Namespace size in blocks: small, so that commands overlap.
const BLOCKS: u64 = 64;
const MAX_BLOCKS: u32 = 8;
const MAX_STEPS: usize = 64;
/// The queue pair's command timeout: a lost command is aborted after it, reset after two.
const TIMEOUT: Duration = Duration::from_millis(10);
/// No command may stay in flight longer than this.
const DEADLINE: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
    Zeroes,
    Deallocate,
    Flush,
}

impl Kind {
    fn mutates(self) -> bool {
        matches!(self, Kind::Write | Kind::Zeroes | Kind::Deallocate)
    }
}

#[derive(Debug)]
struct Cmd {
    kind: Kind,
    lba: u64,
    blocks: u32,
    /// The data a write carries (0: zeroes).
    serial: u64,
    buf: Option<DmaBuffer>,
    /// Submitted while the run was tainted.
    tainted: bool,
    taint_generation: u64,
    /// Each block's epoch at submission (reads).
    epochs: Vec<u64>,
}

impl Cmd {
    /// The blocks of the namespace the command addresses.
    fn range(&self) -> std::ops::Range<u64> {
        self.lba.min(BLOCKS)..(self.lba + self.blocks as u64).min(BLOCKS)
    }

    fn out_of_range(&self) -> bool {
        self.kind != Kind::Flush && self.lba + self.blocks as u64 > BLOCKS
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    /// Holds the data of this write serial (0: zeroes).
    Known(u64),
    Unknown,
}

/// The model of the disk: what each block holds, and what changes it.
#[derive(Debug)]
struct Disk {
    blocks: Vec<Block>,
    /// Bumped whenever a mutating command starts or ends on the block.
    epoch: Vec<u64>,
    writers: Vec<u32>,
    /// Two mutating commands were in flight on the block at once: their order is unknown.
    conflicted: Vec<bool>,
}

impl Disk {
    fn new() -> Disk {
        let n = BLOCKS as usize;
        Disk {
            blocks: vec![Block::Known(0); n],
            epoch: vec![0; n],
            writers: vec![0; n],
            conflicted: vec![false; n],
        }
    }

    fn begin(&mut self, range: std::ops::Range<u64>) {
        for b in range.map(|b| b as usize) {
            if self.writers[b] > 0 {
                self.conflicted[b] = true;
            }
            self.writers[b] += 1;
            self.epoch[b] += 1;
            self.blocks[b] = Block::Unknown;
        }
    }

    /// A mutating command ended: the blocks hold `data` if it is known.
    fn end(&mut self, range: std::ops::Range<u64>, data: Option<u64>) {
        for b in range.map(|b| b as usize) {
            self.writers[b] -= 1;
            self.epoch[b] += 1;
            self.blocks[b] = match data {
                Some(serial) if !self.conflicted[b] => Block::Known(serial),
                _ => Block::Unknown,
            };
            if self.writers[b] == 0 {
                self.conflicted[b] = false;
            }
        }
    }

    fn forget(&mut self, range: std::ops::Range<u64>) {
        for b in range.map(|b| b as usize) {
            self.epoch[b] += 1;
            self.blocks[b] = Block::Unknown;
        }
    }
}

/// The bytes of block `lba` written by write `serial` (zeroes for serial 0).
fn pattern(serial: u64, lba: u64, block_size: usize) -> Vec<u8> {
    if serial == 0 {
        return vec![0; block_size];
    }
    (0..block_size / 8)
        .flat_map(|i| {
            (serial.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (lba << 32) ^ i as u64).to_le_bytes()
        })
        .collect()
}

/// What a run did (the unit tests look at it).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Report {
    pub submitted: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub blocks_checked: u64,
    pub faults: u64,
    pub resets: u64,
    pub unusable: bool,
}

struct Harness {
    sim: Arc<SimController>,
    ctrl: Controller,
    qp: QueuePair,
    pool: BufferPool,
    block_size: usize,
    disk: Disk,
    cmds: HashMap<u64, Cmd>,
    next_token: u64,
    next_serial: u64,
    /// A lying fault is armed.
    lies_armed: bool,
    /// A lying fault was armed and its effects may not be over.
    tainted: bool,
    taint_generation: u64,
    removal_injected: bool,
    admin_faults: bool,
    unusable: bool,
    /// The status of the last command handed back.
    last: Option<(u64, Status)>,
    /// Print each step, fault and completion (`USNVME_FUZZ_TRACE=1`, to read a crashing input).
    trace: bool,
    report: Report,
}

pub(super) fn run(data: &[u8]) -> Report {
    let mut input = Input::new(data);
    let mut h = Harness::new(&mut input);
    for _ in 0..MAX_STEPS {
        if input.is_empty() {
            break;
        }
        h.step(&mut input);
    }
    h.finish();
    h.report
}

impl Harness {
    fn new(input: &mut Input) -> Harness {
        let flags = input.u8();
        let block_size: u32 = if flags & 4 != 0 { 4096 } else { 512 };
        let mode = if flags & 1 != 0 {
            SimMode::Threaded {
                latency: Duration::from_micros(input.u8() as u64),
                out_of_order: flags & 2 != 0,
            }
        } else {
            SimMode::Inline
        };
        let depth = 2 + input.below(15) as u16;
        let config = SimConfig {
            namespaces: vec![SimNamespace {
                block_size,
                blocks: BLOCKS,
                metadata: crate::protection::MetadataFormat::default(),
            }],
            backend: Backend::Ram,
            mode,
            ..SimConfig::default()
        };
        let options = ControllerOptions {
            io_queues: 2,
            admin_depth: 8,
            admin_timeout: Duration::from_millis(100),
            shadow_doorbells: flags & 16 == 0,
            sgl: flags & 8 != 0,
            page: PageSize::Small4K,
            node: None,
        };
        let space = crate::sim::iova_space();
        let sim = SimController::new(config, space.clone());
        let ctrl = match Controller::init(
            "sim:fuzz".into(),
            sim.clone(),
            Some(sim.clone()),
            space,
            None,
            None,
            options,
        ) {
            Ok(ctrl) => ctrl,
            Err(e) => panic!("a healthy sim does not come up: {e}"),
        };
        let qp = match ctrl.create_queue_pair(QueuePairOptions {
            depth,
            node: None,
            timeout: Some(TIMEOUT),
            // acknowledges every CQ head, checks timeouts on every poll, re-created with IEN
            interrupts: flags & 32 != 0,
        }) {
            Ok(qp) => qp,
            Err(e) => panic!("no queue pair on a healthy sim: {e}"),
        };
        let size = MAX_BLOCKS as usize * block_size as usize;
        let pool = BufferPool::new(
            ctrl.iova_space(),
            size,
            depth as usize + 1,
            PageSize::Small4K,
            None,
        )
        .expect("fuzzing: DMA buffers");
        Harness {
            sim,
            ctrl,
            qp,
            pool,
            block_size: block_size as usize,
            disk: Disk::new(),
            cmds: HashMap::new(),
            next_token: 1,
            next_serial: 1,
            lies_armed: false,
            tainted: false,
            taint_generation: 0,
            removal_injected: false,
            admin_faults: false,
            unusable: false,
            last: None,
            trace: std::env::var_os("USNVME_FUZZ_TRACE").is_some(),
            report: Report::default(),
        }
    }

    fn step(&mut self, input: &mut Input) {
        if self.trace {
            eprintln!(
                "[{} in flight, tainted {}] step {:?}",
                self.cmds.len(),
                self.tainted,
                input.clone().bytes(12)
            );
        }
        let io = |input: &mut Input| {
            let lba = input.below(BLOCKS as u32 + 4) as u64;
            (lba, 1 + input.below(MAX_BLOCKS))
        };
        match input.u8() % 16 {
            0..=2 => {
                let (lba, n) = io(input);
                self.submit(Kind::Write, lba, n);
            }
            3..=5 => {
                let (lba, n) = io(input);
                self.submit(Kind::Read, lba, n);
            }
            6 => {
                let (lba, n) = io(input);
                self.submit(Kind::Zeroes, lba, n);
            }
            7 => {
                let (lba, n) = io(input);
                self.submit(Kind::Deallocate, lba, n);
            }
            8 => self.submit(Kind::Flush, 0, 1),
            9 | 10 => self.inject(input),
            11 => {
                for _ in 0..1 + input.below(4) {
                    self.poll();
                }
            }
            12 => self.reset(),
            13 => {
                self.sim.clear_faults();
                self.lies_armed = false;
            }
            14 => self.wait(Duration::from_millis(input.below(20) as u64)),
            _ => {
                for _ in 0..input.below(8) {
                    let kind = if input.bool() {
                        Kind::Write
                    } else {
                        Kind::Read
                    };
                    let (lba, n) = io(input);
                    self.submit(kind, lba, n);
                }
                self.poll();
            }
        }
    }

    fn submit(&mut self, kind: Kind, lba: u64, blocks: u32) {
        let token = self.next_token;
        self.next_token += 1;
        let serial = match kind {
            Kind::Write => {
                self.next_serial += 1;
                self.next_serial
            }
            _ => 0,
        };
        let buf = if matches!(kind, Kind::Read | Kind::Write) {
            let Some(buf) = self.pool.alloc() else {
                self.poll();
                return;
            };
            for i in 0..blocks as u64 {
                let data = match kind {
                    Kind::Write => pattern(serial, lba + i, self.block_size),
                    _ => vec![0xa5; self.block_size],
                };
                buf.write_from(&data, i as usize * self.block_size)
                    .expect("the buffer holds MAX_BLOCKS blocks");
            }
            Some(buf)
        } else {
            None
        };
        let io = buf.as_ref().map(|b| IoBuffer {
            iova: b.iova(),
            len: blocks * self.block_size as u32,
        });
        if self.trace {
            eprintln!("  submit {kind:?} {lba}+{blocks} (token {token})");
        }
        let qp = &mut self.qp;
        let result = match (kind, io) {
            (Kind::Read, Some(io)) => qp.read(NSID, lba, io, token),
            (Kind::Write, Some(io)) => qp.write(NSID, lba, io, token),
            (Kind::Zeroes, _) => qp.write_zeroes(NSID, lba, blocks, token),
            (Kind::Deallocate, _) => qp.deallocate(NSID, lba, blocks, token),
            _ => qp.flush_cache(NSID, token),
        };
        let cmd = Cmd {
            kind,
            lba,
            blocks,
            serial,
            buf,
            tainted: self.tainted,
            taint_generation: self.taint_generation,
            epochs: Vec::new(),
        };
        match result {
            Ok(()) => {
                let mut cmd = cmd;
                if kind.mutates() {
                    self.disk.begin(cmd.range());
                }
                if kind == Kind::Read {
                    cmd.epochs = cmd.range().map(|b| self.disk.epoch[b as usize]).collect();
                }
                self.cmds.insert(token, cmd);
                self.report.submitted += 1;
            }
            Err(e) => {
                let past_the_end = cmd.out_of_range();
                if let Some(buf) = cmd.buf {
                    let _ = self.pool.free(buf);
                }
                match e {
                    SubmitError::QueueFull { .. } => {
                        assert!(!self.cmds.is_empty(), "QueueFull with nothing in flight");
                        self.poll();
                    }
                    SubmitError::Dead => {
                        assert!(
                            self.cmds.is_empty(),
                            "the queue pair is unusable with {} command(s) never handed back",
                            self.cmds.len()
                        );
                        self.unusable = true;
                    }
                    // the driver checks reads and writes against the namespace itself
                    SubmitError::LbaRange { .. } => {
                        assert!(past_the_end, "{kind:?} {lba}+{blocks} refused: {e}");
                        self.report.failed += 1;
                    }
                    e => panic!("{kind:?} of {blocks} block(s) at {lba} refused: {e}"),
                }
            }
        }
        assert_eq!(self.qp.in_flight() as usize, self.cmds.len(), "in_flight");
    }

    fn inject(&mut self, input: &mut Input) {
        let pick = input.u8();
        let admin = pick >= 0xc0;
        let mut when = if admin {
            const OPS: [AdminOpcode; 8] = [
                AdminOpcode::Abort,
                AdminOpcode::CreateIoCq,
                AdminOpcode::CreateIoSq,
                AdminOpcode::DeleteIoSq,
                AdminOpcode::DeleteIoCq,
                AdminOpcode::SetFeatures,
                AdminOpcode::DoorbellBufferConfig,
                AdminOpcode::GetLogPage,
            ];
            FaultWhen::admin(OPS[pick as usize % OPS.len()] as u8)
        } else {
            let op = [
                None,
                Some(IoOpcode::Read),
                Some(IoOpcode::Write),
                Some(IoOpcode::Flush),
                Some(IoOpcode::WriteZeroes),
                Some(IoOpcode::DatasetManagement),
            ][pick as usize % 6];
            let mut when = op.map_or_else(FaultWhen::any_io, |op| FaultWhen::opcode(op as u8));
            if input.u8() < 64 {
                let start = input.below(BLOCKS as u32) as u64;
                when = when.with_lba(start..start + 1 + input.below(8) as u64);
            }
            when
        };
        when = when.with_nth(1 + input.below(4) as u64);
        let action = match input.u8() % 16 {
            0..=3 => FaultAction::Fail(status(input)),
            4 | 5 => FaultAction::Delay(Duration::from_millis(input.below(30) as u64)),
            6 => FaultAction::Drop,
            7 => FaultAction::Fatal,
            8 if input.u8() < 48 => FaultAction::Remove,
            9 => FaultAction::UnknownCid,
            10 => FaultAction::Duplicate,
            11 => FaultAction::MisdirectWrite,
            _ => FaultAction::Delay(Duration::from_micros(input.u8() as u64 * 10)),
        };
        let lie = match action {
            FaultAction::UnknownCid | FaultAction::Duplicate | FaultAction::MisdirectWrite => true,
            FaultAction::Fail(status) => status.is_success(),
            _ => false,
        };
        if lie {
            self.lies_armed = true;
            self.tainted = true;
            self.taint_generation += 1;
        }
        self.removal_injected |= action == FaultAction::Remove;
        self.admin_faults |= admin;
        self.report.faults += 1;
        let fault = Fault {
            when,
            action,
            times: input.below(4),
        };
        if self.trace {
            eprintln!("  inject {fault:?}");
        }
        self.sim.inject(fault);
    }

    fn reset(&mut self) {
        if self.trace {
            eprintln!("  reset");
        }
        self.report.resets += 1;
        match self.ctrl.reset() {
            // the controller forgot everything: no late copy or lost command can come back
            Ok(()) if !self.lies_armed => {
                self.tainted = false;
                self.taint_generation += 1;
            }
            Ok(()) => {}
            Err(e) => assert!(
                self.removal_injected || self.admin_faults,
                "a reset failed with no removal or admin fault: {e}"
            ),
        }
    }

    fn poll(&mut self) {
        let mut done: Vec<Completion> = Vec::new();
        self.qp.poll(|c| done.push(c));
        for c in done {
            self.complete(c);
        }
        assert_eq!(self.qp.in_flight() as usize, self.cmds.len(), "in_flight");
    }

    fn complete(&mut self, c: Completion) {
        let Some(cmd) = self.cmds.remove(&c.token) else {
            panic!(
                "token {} handed back but not in flight (twice, or never submitted): {}",
                c.token, c.status
            );
        };
        self.last = Some((c.token, c.status));
        if self.trace {
            eprintln!(
                "  completed {:?} {}+{}: {}",
                cmd.kind, cmd.lba, cmd.blocks, c.status
            );
        }
        let ok = c.status.is_success();
        let suspect = cmd.tainted || self.tainted || cmd.taint_generation != self.taint_generation;
        if ok {
            self.report.succeeded += 1;
        } else {
            self.report.failed += 1;
        }
        assert!(
            !(ok && cmd.out_of_range()) || suspect,
            "{:?} of {} block(s) at {} past the end succeeded",
            cmd.kind,
            cmd.blocks,
            cmd.lba
        );
        if cmd.kind.mutates() {
            let data = (ok && !suspect).then_some(cmd.serial);
            self.disk.end(cmd.range(), data);
            if suspect {
                // one block off (a misdirected write), or anything (a misdirected DSM range)
                let end = (cmd.lba + cmd.blocks as u64 + 1).min(BLOCKS);
                match cmd.kind {
                    Kind::Deallocate => self.disk.forget(0..BLOCKS),
                    _ => self.disk.forget(cmd.lba.min(BLOCKS)..end),
                }
            }
        }
        if cmd.kind == Kind::Read && ok && !suspect {
            self.check_read(&cmd);
        }
        if let Some(buf) = cmd.buf {
            let _ = self.pool.free(buf);
        }
    }

    fn check_read(&mut self, cmd: &Cmd) {
        let Some(buf) = &cmd.buf else {
            return;
        };
        for (i, lba) in cmd.range().enumerate() {
            let Block::Known(serial) = self.disk.blocks[lba as usize] else {
                continue;
            };
            if self.disk.epoch[lba as usize] != cmd.epochs[i] {
                continue;
            }
            let mut got = vec![0u8; self.block_size];
            buf.read_into(&mut got, i * self.block_size)
                .expect("the buffer holds the blocks read");
            let want = pattern(serial, lba, self.block_size);
            assert!(
                got == want,
                "block {lba} read back {}, the model says {} (write serial {serial})",
                describe(&got),
                describe(&want)
            );
            self.report.blocks_checked += 1;
        }
    }

    /// Polls for `time` (commands time out, delayed ones come back).
    fn wait(&mut self, time: Duration) {
        let started = Instant::now();
        while started.elapsed() < time {
            self.poll();
            std::thread::sleep(Duration::from_micros(200));
        }
        self.poll();
    }

    /// Polls until nothing is in flight; a command still there after the deadline is a hang.
    fn drain(&mut self) {
        let started = Instant::now();
        let mut spins = 0u32;
        while !self.cmds.is_empty() {
            self.poll();
            spins += 1;
            if spins.is_multiple_of(64) {
                assert!(
                    started.elapsed() < DEADLINE,
                    "{} command(s) never handed back: {:?}",
                    self.cmds.len(),
                    self.cmds
                        .values()
                        .map(|c| (c.kind, c.lba))
                        .collect::<Vec<_>>()
                );
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }

    /// Submits one command and waits for it: its status, or None when the queue pair refuses
    /// it (unusable). A command that timed out (aborted, or lost in a reset) is tried again: under
    /// load a healthy command may take longer than the short timeout.
    fn one(&mut self, kind: Kind, lba: u64, blocks: u32) -> Option<Status> {
        let mut status = None;
        for _ in 0..3 {
            let token = self.next_token;
            let submitted = self.report.submitted;
            self.submit(kind, lba, blocks);
            if self.report.submitted == submitted {
                return None;
            }
            self.drain();
            status = self.last.filter(|(t, _)| *t == token).map(|(_, s)| s);
            let timed_out = status.is_some_and(|s| {
                matches!(s.code(), Status::ABORT_REQUESTED | Status::ABORTED_BY_HOST)
            });
            if !timed_out {
                break;
            }
        }
        status
    }

    /// Everything comes back; with the faults cleared the queue pair works again (or the device
    /// is gone), and every known block reads back as the model says.
    fn finish(&mut self) {
        self.drain();
        self.sim.clear_faults();
        self.lies_armed = false;
        if self.tainted {
            // what a lying controller may still hold or post (a late copy of a completion, a
            // command completed early under a copy that it still runs) goes only with a reset
            self.reset();
        }
        let mut works = false;
        for _ in 0..3 {
            match self.one(Kind::Flush, 0, 1) {
                Some(status) if status.is_success() => {
                    works = true;
                    break;
                }
                Some(_) => {}
                None => break,
            }
        }
        self.report.unusable = self.unusable;
        if !works || self.tainted {
            assert!(
                self.removal_injected || self.admin_faults,
                "the queue pair does not work again after the faults were cleared (unusable: {}, \
                 tainted: {})",
                self.unusable,
                self.tainted
            );
            return;
        }
        let mut lba = 0;
        while lba < BLOCKS {
            let n = MAX_BLOCKS.min((BLOCKS - lba) as u32);
            match self.one(Kind::Read, lba, n) {
                Some(status) if status.is_success() => {}
                other => assert!(
                    self.removal_injected || self.admin_faults,
                    "reading back blocks {lba}..{}: {other:?}",
                    lba + n as u64
                ),
            }
            lba += n as u64;
        }
        if !self.admin_faults {
            assert_eq!(self.sim.dma_faults(), 0, "DMA to unmapped memory");
        }
    }
}

/// A fault status: mostly errors by name, sometimes any field (success included: a lie).
fn status(input: &mut Input) -> Status {
    const STATUSES: [Status; 8] = [
        Status::WRITE_FAULT,
        Status::UNRECOVERED_READ_ERROR,
        Status::INTERNAL_ERROR,
        Status::NAMESPACE_NOT_READY,
        Status::DATA_TRANSFER_ERROR,
        Status::ABORTED_POWER_LOSS,
        Status::INVALID_FIELD,
        Status::HOST_PATHING_ERROR,
    ];
    match input.u8() {
        n @ 0..=239 => STATUSES[n as usize % STATUSES.len()],
        _ => Status::from_field(input.u16()),
    }
}

/// The first bytes of a block, for messages.
fn describe(block: &[u8]) -> String {
    let head: Vec<String> = block.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("[{} ...]", head.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inline sim, 512-byte blocks, depth 8.
    const HEADER: [u8; 2] = [0, 6];

    fn input(steps: &[&[u8]]) -> Vec<u8> {
        let mut data = HEADER.to_vec();
        for s in steps {
            data.extend_from_slice(s);
        }
        data
    }

    /// Write or read `n` + 1 blocks at `lba`.
    fn write(lba: u8, n: u8) -> [u8; 3] {
        [0, lba, n]
    }
    fn read(lba: u8, n: u8) -> [u8; 3] {
        [3, lba, n]
    }
    const POLL: &[u8] = &[11, 0];

    #[test]
    fn writes_read_back_and_out_of_range_fails() {
        let report = run(&input(&[
            &write(4, 3),
            POLL,
            &read(4, 3),
            POLL,
            &write(62, 3), // past the end
            POLL,
        ]));
        assert_eq!(report.failed, 1);
        // the driver refused the write before any of it reached the drive: 62 and 63 are known
        assert_eq!(report.blocks_checked, 4 + BLOCKS, "{report:?}");
    }

    /// A fault: `action` selector byte (see `inject`), on the first matching I/O, once.
    fn fault(opcode_pick: u8, action: u8, extra: u8) -> Vec<u8> {
        // pick, lba filter (none), nth, action, [status / delay / removal], times
        let mut v = vec![9, opcode_pick, 0xff, 0, action];
        if matches!(action % 16, 0..=5 | 8) {
            v.push(extra);
        }
        v.push(1);
        v
    }

    #[test]
    fn failed_dropped_and_fatal_commands_each_come_back_once() {
        for action in [0u8, 4, 6, 7] {
            let report = run(&input(&[
                &write(0, 7),
                POLL,
                &fault(2, action, 0),
                &write(0, 0),
                POLL,
                &read(0, 7),
                POLL,
            ]));
            assert_eq!(
                report.succeeded + report.failed,
                report.submitted,
                "action {action}: {report:?}"
            );
            assert!(!report.unusable);
        }
    }

    #[test]
    fn lies_are_survived_and_a_removal_ends_in_dead() {
        for action in [9u8, 10, 11] {
            let report = run(&input(&[
                &fault(2, action, 0),
                &write(8, 1),
                POLL,
                &read(8, 1),
                POLL,
            ]));
            assert!(!report.unusable, "action {action}");
        }
        let report = run(&input(&[&fault(0, 8, 0), &write(8, 1), POLL, &read(8, 1)]));
        assert!(report.unusable, "{report:?}");
    }

    #[test]
    fn threaded_sim_with_resets() {
        let mut data = vec![0b0111, 20, 3];
        for i in 0..8u8 {
            data.extend_from_slice(&write(i * 4, 3));
            data.extend_from_slice(&[12]); // reset
            data.extend_from_slice(&read(i * 4, 3));
        }
        let report = run(&data);
        assert_eq!(report.resets, 8);
        assert_eq!(report.succeeded + report.failed, report.submitted);
    }

    #[test]
    #[should_panic(expected = "read back")]
    fn the_model_catches_corruption() {
        // a misdirected write the model is not told about
        let data = input(&[&write(8, 1)]);
        let mut input = Input::new(&data);
        let mut h = Harness::new(&mut input);
        h.sim.inject(Fault::new(
            FaultWhen::opcode(IoOpcode::Write as u8),
            FaultAction::MisdirectWrite,
        ));
        h.step(&mut input);
        h.drain();
        h.finish();
    }

    /// Found by the fuzzer. A depth-2 queue pair: a write whose completion the controller posts
    /// twice. The CQ (2 entries) holds one, so the copy is posted after the CQ head doorbell,
    /// when the write's command id already belongs to the next command (a flush): the copy
    /// completes the flush before it ran, the flush's own completion is then garbage, and the
    /// copy's stale SQ head leaves the driver's SQ head one past its tail: with nothing in
    /// flight, every later submission is QueueFull, forever.
    #[test]
    fn a_duplicated_completion_does_not_wedge_a_small_queue_pair() {
        // inline, 512 B, depth 2 | Duplicate on the next write | write 0+1 | poll | flush | poll
        run(&[0, 0, 9, 2, 0xff, 0, 10, 1, 0, 0, 0, 11, 0, 8, 11, 0]);
    }

    /// The same copy, with a status: it is taken for the next command that reuses the id.
    #[test]
    fn a_late_duplicate_is_not_taken_for_the_next_command() {
        let data = [0u8, 0];
        let mut input = Input::new(&data);
        let mut h = Harness::new(&mut input);
        h.sim.inject(Fault::new(
            FaultWhen::opcode(IoOpcode::WriteZeroes as u8),
            FaultAction::Duplicate,
        ));
        // past the end (Write Zeroes' range is the controller's to check): LBA Out of Range, twice
        h.submit(Kind::Zeroes, BLOCKS, 1);
        h.drain();
        h.submit(Kind::Flush, 0, 1);
        h.drain();
        let flush = h.last.map(|(_, status)| status.code());
        assert_eq!(
            flush,
            Some(Status::SUCCESS),
            "the flush got the write zeroes' status"
        );
    }
}

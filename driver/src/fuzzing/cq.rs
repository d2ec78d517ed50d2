//! The `completions` target: a queue pair (the driver's own, built as `Controller` builds one)
//! over DMA memory whose completion queue the fuzzer writes, with no controller behind it. A model
//! of the rings says what every poll must hand back.
//!
//! The input: a header (depth, SGLs or PRPs, shadow doorbells), then steps: submit commands of
//! every kind (valid or not), post completion entries (raw bytes, or plausible ones naming
//! commands in flight with a fuzzed SQ head and status), poll, ring, write EventIdx values. At
//! the end every command still in flight gets an honest completion, and the queue pair must take
//! a new command.
//!
//! The model's rules, for each entry a poll consumes:
//! - an entry that names no command in flight must be counted as garbage, never handed back;
//! - an entry for a command in flight whose SQ head is honest (within what an honest controller
//!   could report: past the command's slot, not past the tail, not behind an earlier honest
//!   head) must be handed back with that command's token, status and dword 0;
//! - other entries for commands in flight (impossible SQ heads) may go either way.
//!
//! While every accepted SQ head was honest ("trust"), `QueueFull` must come exactly when the ring
//! or the command ids are full; whatever the heads were, a queue pair with nothing in flight must
//! accept a command.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use usnvme_hugepages::{DmaRegion, IovaMemory, IovaSpace, Memory, PageSize};
use vm_memory::{Bytes, GuestAddress};

use super::Input;
use crate::prp::{self, PAGE};
use crate::queue::{Doorbells, Layout, NamespaceGeometry, QueuePair, QueueSetup, Shadow};
use crate::regs::Registers;
use crate::spec::{Cqe, DsmRange, IoOpcode, Sqe, Status};
use crate::{Completion, IoBuffer, SubmitError};

/// Queue 1's doorbells with CAP.DSTRD 0.
const SQ_DOORBELL: usize = 0x1008;
const CQ_DOORBELL: usize = 0x100c;
/// Shadow doorbell entries of queue 1 (the EventIdx page follows the shadow page).
const SHADOW_SQ: usize = 8;
const SHADOW_CQ: usize = 12;
const NEVER: u32 = u32::MAX;
const NSID: u32 = 1;
const BLOCK: u32 = 512;
const BLOCKS: u64 = 1 << 20;
const MAX_TRANSFER: u64 = 64 << 10;
const MAX_STEPS: usize = 1024;
/// IOVAs the fuzzer picks stay below 2^52 (IOMMUs have at most 57 address bits; the driver
/// computes page addresses past the buffer).
const IOVA_BITS: u64 = (1 << 52) - 1;

/// The registers of a controller that is not there: the queue's two doorbells, recorded.
#[derive(Debug)]
struct Recorded {
    sq_tail: AtomicU32,
    cq_head: AtomicU32,
}

impl Registers for Recorded {
    fn read32(&self, _offset: usize) -> u32 {
        0
    }

    fn write32(&self, offset: usize, value: u32) {
        match offset {
            SQ_DOORBELL => self.sq_tail.store(value, Ordering::Relaxed),
            CQ_DOORBELL => self.cq_head.store(value, Ordering::Relaxed),
            _ => panic!("the queue pair wrote register {offset:#x} ({value:#x})"),
        }
    }
}

/// What a run did (the unit tests look at it).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Report {
    pub submitted: u64,
    pub refused: u64,
    pub queue_full: u64,
    pub completed: u64,
    pub garbage: u64,
    pub polls: u64,
}

/// A command in flight: its token and its absolute position in the SQ.
#[derive(Debug, Clone, Copy)]
struct Outstanding {
    token: u64,
    slot: u64,
}

/// A command to submit, with what the driver must make of it.
#[derive(Debug, Clone, Copy)]
enum Cmd {
    Flush { nsid: u32 },
    Read { nsid: u32, slba: u64, buf: IoBuffer },
    Write { nsid: u32, slba: u64, buf: IoBuffer },
    Zeroes { nsid: u32, slba: u64, blocks: u32 },
    Deallocate { nsid: u32, slba: u64, blocks: u32 },
    Raw { opcode: u8, buf: Option<IoBuffer> },
}

struct Harness {
    qp: QueuePair,
    regs: Arc<Recorded>,
    mem: Arc<IovaMemory>,
    sq: u64,
    cq: u64,
    /// IOVA of the shadow doorbell page, and whether MMIO is written always.
    shadow: Option<(u64, bool)>,
    use_sgl: bool,
    depth: u16,
    /// Command ids (at most `depth - 1`): with fewer, the CQ head may run ahead of its doorbell.
    commands: u16,
    slot_entries: u64,
    busy: BTreeMap<u16, Outstanding>,
    /// Commands ever submitted (the SQ tail, not wrapped).
    tail: u64,
    /// The SQ head of the last honest completion (not wrapped).
    dev_head: u64,
    /// Every SQ head the driver accepted was honest: its head is `dev_head`.
    trust: bool,
    head: u16,
    phase: bool,
    /// What the CQ ring holds (only the harness writes it).
    ring: Vec<Cqe>,
    /// Entries posted after the head since the last poll.
    ahead: u16,
    next_token: u64,
    report: Report,
    /// Keeps the shadow pages mapped.
    _shadow_pages: Option<Arc<DmaRegion>>,
}

fn map(space: &Arc<IovaSpace>, len: usize) -> DmaRegion {
    let memory = Memory::allocate(len, PageSize::Small4K, None)
        .expect("fuzzing: 4 KiB pages for a queue pair");
    space
        .map(memory)
        .expect("fuzzing: an IOVA for a queue pair")
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
        let depth = 2 + input.below(63) as u16;
        let flags = input.u8();
        let use_sgl = flags & 1 != 0;
        let shadow_on = flags & 2 != 0;
        let always_mmio = flags & 4 != 0;
        // fewer command ids than ring entries: the CQ head doorbell is written lazily
        let commands = if flags & 8 != 0 {
            (depth / 2).max(1)
        } else {
            depth - 1
        };
        let space = crate::sim::iova_space();
        let layout = Layout::new(depth, commands, MAX_TRANSFER / PAGE + 1);
        let memory = map(&space, layout.bytes);
        let (sq, cq) = (memory.iova_of(layout.sq), memory.iova_of(layout.cq));
        let shadow_pages = shadow_on.then(|| Arc::new(map(&space, 2 * PAGE as usize)));
        let regs = Arc::new(Recorded {
            sq_tail: AtomicU32::new(NEVER),
            cq_head: AtomicU32::new(NEVER),
        });
        let shadow = shadow_pages.as_ref().map(|pages| Shadow {
            pages: pages.clone(),
            sq_tail: SHADOW_SQ,
            cq_head: SHADOW_CQ,
            eventidx: PAGE as usize,
            always_mmio,
        });
        let qp = QueuePair::new(QueueSetup {
            qid: 1,
            layout,
            memory,
            doorbells: Doorbells::new(
                &(regs.clone() as Arc<dyn Registers>),
                SQ_DOORBELL,
                CQ_DOORBELL,
                shadow,
            ),
            namespaces: Arc::from(vec![NamespaceGeometry {
                nsid: NSID,
                block_size: BLOCK,
                blocks: BLOCKS,
                metadata: crate::protection::MetadataFormat::default(),
            }]),
            max_transfer: MAX_TRANSFER,
            use_sgl,
            timeout: None,
            generation: 0,
            created: true,
            owner: None,
            interrupt: None,
        });
        Harness {
            qp,
            regs,
            mem: space.memory(),
            sq,
            cq,
            shadow: shadow_pages.as_ref().map(|p| (p.iova(), always_mmio)),
            use_sgl,
            depth,
            commands,
            slot_entries: layout.slot_entries(),
            busy: BTreeMap::new(),
            tail: 0,
            dev_head: 0,
            trust: true,
            head: 0,
            phase: true,
            ring: vec![Cqe::default(); depth as usize],
            ahead: 0,
            next_token: 1,
            report: Report::default(),
            _shadow_pages: shadow_pages,
        }
    }

    fn step(&mut self, input: &mut Input) {
        match input.u8() % 16 {
            0 => self.submit(Cmd::Flush { nsid: nsid(input) }),
            1 | 2 => {
                let (nsid, slba, buf) = (nsid(input), input.u64(), buffer(input));
                self.submit(Cmd::Read { nsid, slba, buf })
            }
            3 => {
                let (nsid, slba, buf) = (nsid(input), input.u64(), buffer(input));
                self.submit(Cmd::Write { nsid, slba, buf })
            }
            4 => {
                let (nsid, slba, blocks) = (nsid(input), input.u64(), blocks(input));
                self.submit(Cmd::Zeroes { nsid, slba, blocks })
            }
            5 => {
                let (nsid, slba, blocks) = (nsid(input), input.u64(), blocks(input));
                self.submit(Cmd::Deallocate { nsid, slba, blocks })
            }
            6 => {
                let opcode = input.u8();
                let buf = input.bool().then(|| buffer(input));
                self.submit(Cmd::Raw { opcode, buf })
            }
            7..=9 => self.post_plausible(input),
            10 => self.post_raw(input),
            11 | 12 => self.poll(),
            13 => self.flush(),
            14 => self.event_idx(input),
            _ => {
                // a burst: several plausible completions, then a poll
                for _ in 0..input.below(self.depth as u32 + 1) {
                    self.post_plausible(input);
                }
                self.poll();
            }
        }
    }

    /// Whether the driver must accept `cmd` (given room in the queue).
    fn valid(&self, cmd: &Cmd) -> bool {
        let data_ok = |buf: &IoBuffer| {
            buf.len > 0
                && buf.iova.is_multiple_of(4)
                && buf.len as u64 <= MAX_TRANSFER
                && (self.use_sgl || prp::pages(buf.iova, buf.len) - 1 <= self.slot_entries)
        };
        match cmd {
            Cmd::Flush { nsid } => *nsid == NSID,
            // reads and writes are checked against the namespace's range too
            Cmd::Read { nsid, slba, buf } | Cmd::Write { nsid, slba, buf } => {
                let blocks = u64::from(buf.len / BLOCK);
                *nsid == NSID
                    && buf.len.is_multiple_of(BLOCK)
                    && data_ok(buf)
                    && slba.checked_add(blocks).is_some_and(|end| end <= BLOCKS)
            }
            Cmd::Zeroes { nsid, blocks, .. } => *nsid == NSID && (1..=65536).contains(blocks),
            Cmd::Deallocate { nsid, blocks, .. } => *nsid == NSID && *blocks > 0,
            Cmd::Raw { buf, .. } => buf.as_ref().is_none_or(data_ok),
        }
    }

    fn submit(&mut self, cmd: Cmd) {
        let token = self.next_token;
        self.next_token += 1;
        let valid = self.valid(&cmd);
        let qp = &mut self.qp;
        let result = match cmd {
            Cmd::Flush { nsid } => qp.flush_cache(nsid, token),
            Cmd::Read { nsid, slba, buf } => qp.read(nsid, slba, buf, token),
            Cmd::Write { nsid, slba, buf } => qp.write(nsid, slba, buf, token),
            Cmd::Zeroes { nsid, slba, blocks } => qp.write_zeroes(nsid, slba, blocks, token),
            Cmd::Deallocate { nsid, slba, blocks } => qp.deallocate(nsid, slba, blocks, token),
            Cmd::Raw { opcode, buf: None } => qp.submit(Sqe::new(opcode), token),
            Cmd::Raw {
                opcode,
                buf: Some(buf),
            } => qp.submit_data(Sqe::new(opcode), buf, token),
        };
        let room = self.busy.len() < self.commands as usize
            && self.tail - self.dev_head < self.depth as u64 - 1;
        match result {
            Ok(()) => {
                assert!(valid, "{cmd:?} accepted");
                if self.trust {
                    assert!(room, "{cmd:?} accepted into a full SQ: it overwrites a command the controller has not fetched");
                }
                self.accepted(&cmd, token);
            }
            Err(SubmitError::QueueFull { .. }) => {
                assert!(
                    !self.busy.is_empty(),
                    "QueueFull with nothing in flight: the queue pair is wedged ({cmd:?})"
                );
                if self.trust && valid {
                    assert!(
                        !room,
                        "QueueFull although the SQ has room ({} in flight, depth {})",
                        self.busy.len(),
                        self.depth
                    );
                }
                self.report.queue_full += 1;
            }
            Err(SubmitError::Dead) => panic!("the queue pair died without a controller"),
            Err(e) => {
                assert!(!valid, "{cmd:?} refused: {e}");
                self.report.refused += 1;
            }
        }
        assert_eq!(self.qp.in_flight() as usize, self.busy.len());
    }

    /// Checks the SQE the driver wrote for `cmd` and records the command as in flight.
    fn accepted(&mut self, cmd: &Cmd, token: u64) {
        let depth = self.depth as u64;
        let slot = self.tail % depth;
        let sqe: Sqe = self
            .mem
            .read_obj(GuestAddress(self.sq + slot * 64))
            .expect("the SQ ring is mapped");
        let cid = sqe.cid();
        assert!(
            cid < self.commands,
            "command id {cid} with {} ids",
            self.commands
        );
        assert!(
            !self.busy.contains_key(&cid),
            "command id {cid} handed out while in flight"
        );
        let (opcode, data) = match *cmd {
            Cmd::Flush { nsid } => {
                assert_eq!(sqe.nsid, nsid);
                (IoOpcode::Flush as u8, None)
            }
            Cmd::Read { slba, buf, .. } | Cmd::Write { slba, buf, .. } => {
                assert_eq!(sqe.slba(), slba);
                assert_eq!(sqe.blocks(), buf.len / BLOCK);
                let op = if matches!(cmd, Cmd::Read { .. }) {
                    IoOpcode::Read
                } else {
                    IoOpcode::Write
                };
                (op as u8, Some(buf))
            }
            Cmd::Zeroes { slba, blocks, .. } => {
                assert_eq!((sqe.slba(), sqe.blocks()), (slba, blocks));
                (IoOpcode::WriteZeroes as u8, None)
            }
            Cmd::Deallocate { slba, blocks, .. } => {
                let range: DsmRange = self
                    .mem
                    .read_obj(GuestAddress(sqe.prp1))
                    .expect("the DSM range lies in the queue's memory");
                assert_eq!(range, DsmRange::new(slba, blocks));
                (IoOpcode::DatasetManagement as u8, None)
            }
            Cmd::Raw { opcode, buf } => (opcode, buf),
        };
        assert_eq!(sqe.opcode(), opcode, "{cmd:?}");
        if let Some(buf) = data {
            self.check_data_pointer(&sqe, buf);
        }
        self.busy.insert(
            cid,
            Outstanding {
                token,
                slot: self.tail,
            },
        );
        self.tail += 1;
        self.report.submitted += 1;
    }

    /// PRPs: PRP1 the buffer, PRP2 the second page or a list of every later page; with SGLs,
    /// a transfer of more than two pages is one data block of the buffer instead of a list.
    fn check_data_pointer(&self, sqe: &Sqe, buf: IoBuffer) {
        if self.use_sgl && prp::pages(buf.iova, buf.len) > 2 {
            assert_eq!(sqe.psdt(), 1);
            let sgl = sqe.sgl();
            assert_eq!((sgl.address, sgl.length), (buf.iova, buf.len));
            return;
        }
        assert_eq!(sqe.psdt(), 0);
        assert_eq!(sqe.prp1, buf.iova);
        let first_page = buf.iova - buf.iova % PAGE;
        match prp::pages(buf.iova, buf.len) {
            1 => assert_eq!(sqe.prp2, 0),
            2 => assert_eq!(sqe.prp2, first_page + PAGE),
            pages => {
                let list = sqe.prp2;
                assert!(
                    list.is_multiple_of(8) && list % PAGE + (pages - 1) * 8 <= PAGE,
                    "PRP list at {list:#x} ({} entries) crosses a page",
                    pages - 1
                );
                for i in 0..pages - 1 {
                    let entry: u64 = self
                        .mem
                        .read_obj(GuestAddress(list + i * 8))
                        .expect("the PRP list lies in the queue's memory");
                    assert_eq!(entry, first_page + (i + 1) * PAGE, "PRP list entry {i}");
                }
            }
        }
    }

    fn write_cqe(&mut self, index: u16, cqe: Cqe) {
        self.mem
            .write_obj(cqe, GuestAddress(self.cq + index as u64 * 16))
            .expect("the CQ ring is mapped");
        self.ring[index as usize] = cqe;
    }

    /// The ring index `offset` entries after the head, and the phase a new entry there has.
    fn position(&self, offset: u16) -> (u16, bool) {
        let at = self.head as u32 + offset as u32;
        let wrapped = at >= self.depth as u32;
        ((at % self.depth as u32) as u16, self.phase ^ wrapped)
    }

    /// A completion entry as a controller would post it, mostly for a command in flight.
    fn post_plausible(&mut self, input: &mut Input) {
        let (index, phase) = self.position(self.ahead.min(self.depth - 1));
        self.ahead = (self.ahead + 1).min(self.depth - 1);
        let pick = input.u8();
        let known: Vec<u16> = self.busy.keys().copied().collect();
        let cid = match known.get(pick as usize % known.len().max(1)) {
            Some(&cid) if pick < 224 => cid,
            _ => input.u16() % (self.depth + 2),
        };
        let tail = (self.tail % self.depth as u64) as u16;
        let sqhd = match input.u8() % 8 {
            0..=4 => tail,
            5 => self.busy.get(&cid).map_or(tail, |o| {
                ((o.slot + 1 + input.u8() as u64) % self.depth as u64) as u16
            }),
            6 => input.u16() % self.depth,
            _ => input.u16(),
        };
        let status = match input.u8() {
            0..=199 => Status::SUCCESS,
            _ => Status::from_field(input.u16()),
        };
        let cqe = Cqe::new(input.u32(), sqhd, 1, cid, status, phase);
        self.write_cqe(index, cqe);
    }

    /// An entry of raw bytes anywhere in the ring.
    fn post_raw(&mut self, input: &mut Input) {
        let (index, _) = self.position(input.u16() % self.depth);
        let cqe = Cqe::from_bytes(&super::padded::<16>(input.bytes(16)));
        self.write_cqe(index, cqe);
    }

    /// A controller's EventIdx for the SQ or the CQ (with shadow doorbells).
    fn event_idx(&mut self, input: &mut Input) {
        let Some((pages, _)) = self.shadow else {
            return;
        };
        let entry = if input.bool() { SHADOW_SQ } else { SHADOW_CQ };
        let value = input.u32();
        self.mem
            .write_obj(value, GuestAddress(pages + PAGE + entry as u64))
            .expect("the EventIdx page is mapped");
    }

    fn flush(&mut self) {
        self.qp.flush();
        self.check_sq_doorbell();
    }

    /// The absolute SQ position an honest controller reporting `sqhd` would be at, if there is one.
    fn honest_head(&self, sqhd: u16) -> Option<u64> {
        if !self.trust || sqhd >= self.depth {
            return None;
        }
        let depth = self.depth as u64;
        let ahead = (sqhd as u64 + depth - self.dev_head % depth) % depth;
        let head = self.dev_head + ahead;
        (head <= self.tail).then_some(head)
    }

    fn poll(&mut self) {
        let before = self.qp.stats();
        let mut got: Vec<Completion> = Vec::new();
        let returned = self.qp.poll(|c| got.push(c));
        let after = self.qp.stats();
        self.report.polls += 1;
        assert_eq!(returned, got.len(), "poll's count");
        let completed = after.completed - before.completed;
        let garbage = after.garbage - before.garbage;
        assert_eq!(completed, got.len() as u64, "stats.completed");
        let consumed = completed + garbage;
        assert!(
            consumed <= self.depth as u64,
            "{consumed} entries in one poll"
        );
        let (first, _) = self.position(0);
        if self.ring[first as usize].phase() == self.phase {
            assert!(consumed > 0, "a new entry at the CQ head was left there");
        }
        let (mut cursor, mut counted_garbage) = (0usize, 0u64);
        for _ in 0..consumed {
            let cqe = self.ring[self.head as usize];
            assert_eq!(
                cqe.phase(),
                self.phase,
                "entry {} consumed with an old phase tag",
                self.head
            );
            self.head += 1;
            if self.head == self.depth {
                (self.head, self.phase) = (0, !self.phase);
            }
            let Some(&o) = self.busy.get(&cqe.cid) else {
                counted_garbage += 1;
                continue;
            };
            let tail = (self.tail % self.depth as u64) as u16;
            let honest = self.honest_head(cqe.sqhd).filter(|&h| h > o.slot);
            let everything_fetched = cqe.sqhd == tail;
            let expected = (o.token, cqe.status(), cqe.dw0);
            let handed_back = got
                .get(cursor)
                .is_some_and(|c: &Completion| (c.token, c.status, c.dw0) == expected);
            if honest.is_some() || everything_fetched {
                assert!(
                    handed_back,
                    "completion {cqe:?} for token {} not handed back (got {:?})",
                    o.token,
                    got.get(cursor)
                );
            }
            if !handed_back {
                counted_garbage += 1;
                continue;
            }
            cursor += 1;
            self.busy.remove(&cqe.cid);
            match honest {
                Some(h) => self.dev_head = h,
                None if everything_fetched => (self.dev_head, self.trust) = (self.tail, true),
                None => self.trust = false,
            }
        }
        assert_eq!(
            cursor,
            got.len(),
            "completions handed back that no entry explains: {:?}",
            &got[cursor.min(got.len())..]
        );
        assert_eq!(counted_garbage, garbage, "stats.garbage");
        assert_eq!(self.qp.in_flight() as usize, self.busy.len(), "in_flight");
        self.report.completed += completed;
        self.report.garbage += garbage;
        self.ahead = 0;
        self.check_sq_doorbell();
        if consumed > 0 {
            self.check_cq_doorbell();
        }
    }

    fn shadow_value(&self, entry: usize) -> Option<u32> {
        let (pages, _) = self.shadow?;
        Some(
            self.mem
                .read_obj(GuestAddress(pages + entry as u64))
                .expect("the shadow page is mapped"),
        )
    }

    /// After a flush: the SQ tail doorbell (shadow, or MMIO) says the tail; MMIO stays in the ring.
    fn check_sq_doorbell(&self) {
        let tail = (self.tail % self.depth as u64) as u32;
        let mmio = self.regs.sq_tail.load(Ordering::Relaxed);
        let always_mmio = self.shadow.is_none_or(|(_, always)| always);
        if let Some(shadow) = self.shadow_value(SHADOW_SQ) {
            assert!(
                self.tail == 0 || shadow == tail,
                "shadow SQ tail {shadow}, tail {tail}"
            );
        }
        if always_mmio && self.tail > 0 {
            assert_eq!(mmio, tail, "SQ tail doorbell");
        }
        assert!(
            mmio == NEVER || mmio < self.depth as u32,
            "SQ tail doorbell {mmio}"
        );
    }

    /// After a poll that consumed entries: the CQ head doorbell (shadow, or MMIO) may lag the
    /// head by fewer entries than the ring has beyond the command ids, so that the controller
    /// always has room to post a completion for every command in flight.
    fn check_cq_doorbell(&self) {
        let head = self.head as u32;
        let mmio = self.regs.cq_head.load(Ordering::Relaxed);
        let always_mmio = self.shadow.is_none_or(|(_, always)| always);
        let spare = u32::from(self.depth - 1 - self.commands);
        let lag = |told: u32| {
            (head + u32::from(self.depth) - told % u32::from(self.depth)) % u32::from(self.depth)
        };
        if let Some(shadow) = self.shadow_value(SHADOW_CQ) {
            let lag = lag(shadow);
            assert!(
                lag == 0 || lag < spare,
                "shadow CQ head {shadow}, head {head}"
            );
        }
        if always_mmio {
            let told = if mmio == NEVER { 0 } else { mmio };
            let lag = lag(told);
            assert!(
                lag == 0 || lag < spare,
                "CQ head doorbell {mmio}, head {head}"
            );
        }
        assert!(
            mmio == NEVER || mmio < self.depth as u32,
            "CQ head doorbell {mmio}"
        );
    }

    /// Honest completions for whatever is still in flight; then the queue pair must take and
    /// complete a new command.
    fn finish(&mut self) {
        for round in 0..2 {
            for _ in 0..2 * self.depth as usize + 2 {
                let Some((&cid, _)) = self.busy.iter().next() else {
                    break;
                };
                let (index, phase) = self.position(0);
                let tail = (self.tail % self.depth as u64) as u16;
                self.write_cqe(index, Cqe::new(0, tail, 1, cid, Status::SUCCESS, phase));
                self.poll();
            }
            assert!(
                self.busy.is_empty(),
                "commands still in flight after honest completions: {:?}",
                self.busy
            );
            if round == 0 {
                let submitted = self.report.submitted;
                self.submit(Cmd::Flush { nsid: NSID });
                assert_eq!(
                    self.report.submitted,
                    submitted + 1,
                    "an idle queue pair refused a command"
                );
            }
        }
    }
}

fn nsid(input: &mut Input) -> u32 {
    match input.u8() {
        0..=247 => NSID,
        248 => 0,
        249 => 2,
        250 => u32::MAX,
        _ => input.u32(),
    }
}

fn blocks(input: &mut Input) -> u32 {
    match input.u8() {
        0..=239 => 1 + input.u8() as u32,
        240 => 0,
        241 => 65536,
        242 => 65537,
        _ => input.u32(),
    }
}

/// A data buffer: usually whole blocks at a dword-aligned IOVA, sometimes anything.
fn buffer(input: &mut Input) -> IoBuffer {
    let kind = input.u8();
    let iova = match kind & 3 {
        0 | 1 => 0x10_0000 + (input.u32() as u64 & !3),
        2 => input.u64() & IOVA_BITS & !3,
        _ => input.u64() & IOVA_BITS,
    };
    let len = match kind >> 2 {
        0..=47 => BLOCK * (1 + input.below(128)),
        48..=55 => input.u16() as u32,
        _ => input.u32(),
    };
    IoBuffer { iova, len }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Header: depth 8 (2 + 6), PRPs, MMIO doorbells.
    const HEADER: [u8; 2] = [6, 0];

    fn input(steps: &[&[u8]]) -> Vec<u8> {
        let mut data = HEADER.to_vec();
        for s in steps {
            data.extend_from_slice(s);
        }
        data
    }

    /// A flush of namespace 1.
    const FLUSH: &[u8] = &[0, 0];
    /// A plausible completion for the first command in flight, SQ head = tail, success.
    const COMPLETE_FIRST: &[u8] = &[7, 0, 0, 0, 0, 0, 0, 0];
    const POLL: &[u8] = &[11];

    /// A raw entry at offset `k` from the head: cid, sqhd, status word (phase in bit 0).
    fn raw(k: u16, cid: u16, sqhd: u16, status: u16) -> Vec<u8> {
        let mut v = vec![10];
        v.extend_from_slice(&k.to_le_bytes());
        let cqe = Cqe {
            dw0: 0,
            dw1: 0,
            sqhd,
            sqid: 1,
            cid,
            status,
        };
        v.extend_from_slice(cqe.as_bytes());
        v
    }

    #[test]
    fn submits_complete_once_and_unknown_ids_are_garbage() {
        let report = run(&input(&[
            FLUSH,
            FLUSH,
            COMPLETE_FIRST,
            POLL,
            &raw(0, 6, 2, 1),
            POLL,
        ]));
        // two flushes, one honest completion, one entry naming command id 6 (never used):
        // garbage; the second flush completes in `finish`, which then submits one more
        assert_eq!(report.submitted, 3);
        assert_eq!(report.garbage, 1);
        assert_eq!(report.completed, 3);
    }

    #[test]
    fn a_duplicate_completion_is_garbage_not_a_second_completion() {
        // the flush gets command id 0; its completion is posted twice
        let dup = raw(1, 0, 1, 1);
        let report = run(&input(&[FLUSH, &raw(0, 0, 1, 1), &dup, POLL]));
        assert_eq!((report.completed, report.garbage), (2, 1));
    }

    #[test]
    fn entries_with_an_old_phase_are_not_consumed() {
        let report = run(&input(&[FLUSH, &raw(0, 0, 1, 0), POLL]));
        assert_eq!(report.garbage, 0);
        assert_eq!(
            report.completed, 2,
            "completed in finish, not by the stale entry"
        );
    }

    #[test]
    fn every_command_kind_and_bad_arguments() {
        let read = [
            1u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* buffer */ 0, 0x10, 0, 0, 0, 7,
        ];
        let misaligned = [3u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 1, 0, 0, 0, 0, 0, 0, 0, 0];
        let zeroes = [4u8, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 9];
        let zero_blocks = [4u8, 0, 5, 0, 0, 0, 0, 0, 0, 0, 240];
        let dealloc = [5u8, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 9];
        let bad_ns = [0u8, 249];
        let raw_data = [6u8, 0x7f, 1, 0, 0, 0, 0x20, 0, 0];
        let report = run(&input(&[
            &read,
            &misaligned,
            &zeroes,
            &zero_blocks,
            &dealloc,
            &bad_ns,
            &raw_data,
            POLL,
        ]));
        assert_eq!(report.refused, 3);
        assert_eq!(report.submitted, 5);
        assert_eq!(report.completed, 5);
    }

    #[test]
    fn sgls_shadow_doorbells_and_a_full_queue() {
        // depth 4 (3 commands at most), SGLs, shadow doorbells with EventIdx
        let mut data = vec![2, 0b011];
        for _ in 0..5 {
            data.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        }
        data.extend_from_slice(&[14, 1, 3, 0, 0, 0]);
        data.extend_from_slice(&[15, 3, 0, 0, 0, 0]); // a burst of 3
        let report = run(&data);
        assert_eq!(report.queue_full, 2);
        assert_eq!(report.submitted, 4);
    }

    /// A harness after one flush (command id 0, token 1) was submitted.
    fn one_flush() -> Harness {
        let data = input(&[FLUSH]);
        let mut input = Input::new(&data);
        let mut h = Harness::new(&mut input);
        h.step(&mut input);
        h
    }

    #[test]
    #[should_panic(expected = "not handed back")]
    fn the_model_catches_a_completion_that_is_not_handed_back() {
        // The driver completes the flush behind the model's back; the model still has it in
        // flight, so the next honest entry for it must be handed back, and is not.
        let mut h = one_flush();
        let (index, phase) = h.position(0);
        h.write_cqe(index, Cqe::new(0, 1, 1, 0, Status::SUCCESS, phase));
        h.qp.poll(|_| {});
        h.head = 1;
        let (index, phase) = h.position(0);
        h.write_cqe(index, Cqe::new(0, 1, 1, 0, Status::SUCCESS, phase));
        h.poll();
    }

    #[test]
    #[should_panic(expected = "no entry explains")]
    fn the_model_catches_a_completion_handed_back_twice() {
        // The model forgets the flush is in flight: its completion must then be garbage, and
        // the driver handing it back is caught as a completion no entry explains.
        let mut h = one_flush();
        h.busy.clear();
        let (index, phase) = h.position(0);
        h.write_cqe(index, Cqe::new(0, 1, 1, 0, Status::SUCCESS, phase));
        h.poll();
    }

    /// Found by the fuzzer: a completion whose SQ head says the controller fetched nothing
    /// (sqhd 0 for the command in slot 0, depth 2) leaves the driver's SQ head one past its tail
    /// once nothing is in flight: every later submission is refused as QueueFull, forever.
    /// Input: depth 2, one flush, one plausible completion with sqhd 0.
    #[test]
    fn an_impossible_sq_head_does_not_wedge_an_idle_queue_pair() {
        run(&[
            0x00, 0x04, 0x00, 0x00, 0x3f, 0xf4, 0x7f, 0xa5, 0xb1, 0xcb, 0x80, 0xff, 0xff,
        ]);
    }
}

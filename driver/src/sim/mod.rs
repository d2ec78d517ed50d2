//! `sim`: a strict software NVMe controller.
//!
//! It speaks the protocol of hardware: registers (CAP, VS, CC, CSTS, AQA, ASQ, ACQ, doorbells)
//! behind the same [`Registers`] trait as BAR0, queues and data in DMA memory addressed by IOVA.
//! Every address it is given goes through a snapshot of the [`IovaSpace`] taken per batch of
//! commands, so it reaches only what is mapped, as behind an IOMMU; anything else is a DMA fault
//! (Data Transfer Error). It checks what QEMU's NVMe checks, and more, answering each violation
//! the way the specification says: an error status with an Error Information log entry, a refused
//! doorbell write, or CSTS.CFS.
//!
//! - Inline mode: a doorbell write runs the queue's new commands at once, in the writing thread.
//! - Threaded mode: a controller thread fetches I/O commands and completes them after a latency,
//!   optionally out of order. Admin commands always run inline.
//!
//! Interrupts: an MSI-X table of [`SimConfig::msix_vectors`] vectors, enabled through
//! [`Interrupts`] as VFIO enables a device's (each vector an eventfd, made by the sim). A CQ
//! created with IEN signals its vector's eventfd whenever completions are posted to it (as
//! QEMU's controller sends a message per batch it posts); Create I/O CQ refuses a vector beyond
//! the table, or other than 0 while MSI-X is off, with "Invalid Interrupt Vector".
//!
//! Faults ([`Fault`]) make chosen commands fail, complete late, twice, never or only when a test
//! releases them, or the controller fail (CSTS.CFS) or disappear (registers read all ones).
//!
//! Shadow doorbells (Doorbell Buffer Config, I/O queues only): a queue's shadow entries are
//! trusted once the host has rung its MMIO doorbell after the queue was created (EventIdx starts
//! at 0, so a host following the EventIdx rule does); the SQ EventIdx is then kept at the tail
//! processed, so the host rings MMIO once per batch; CQ heads are read from the shadow when the
//! CQ looks full.
//!
//! Files: this one (configuration, registers, bring-up and reset, doorbells), `queue` (rings and
//! the command engine), `admin`, `io` (I/O commands, PRPs, SGLs), `backend`, `fault`, `spec`
//! (`sim:` addresses).

mod admin;
mod backend;
mod dma;
mod fault;
mod firmware;
mod io;
mod maintenance;
mod namespaces;
mod queue;
mod spec;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use nix::sys::eventfd::EventFd;
use parking_lot::{Mutex, RwLock};
use usnvme_hugepages::{IovaSpace, NoIommu, PageSize};
use vm_memory::{Bytes, GuestAddress};

pub use backend::Backend;
pub use fault::{Fault, FaultAction, FaultWhen};
pub use spec::{SimSpec, SimSpecError};

use crate::controller::{Controller, ControllerOptions};
use crate::error::Error;
use crate::protection::MetadataFormat;
use crate::regs::{interrupt_eventfd, Interrupts, Registers};
use crate::spec::registers::{reg, ShutdownStatus};
use crate::spec::{Cap, Cc, Csts, ErrorLogEntry, IdentifyController, Status};
use backend::Store;
use fault::Faults;
use queue::{Cq, Sq, SQE_BYTES};

pub(crate) use usnvme_hugepages::IovaMemory;

/// An asynchronous event the sim raises ([`SimController::raise_event`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEventSpec {
    /// Asynchronous Event Type (0 error, 1 SMART / health, 2 notice, ...).
    pub kind: u8,
    /// Asynchronous Event Information.
    pub info: u8,
    /// The log page that clears it.
    pub log_page: u8,
    /// SMART critical warning bits it sets (SMART / health events).
    pub critical_warning: u8,
}

impl AsyncEventSpec {
    /// A SMART / health event: `info` 0 reliability, 1 temperature, 2 spare, with its
    /// Critical Warning bit.
    pub const fn smart(info: u8) -> AsyncEventSpec {
        AsyncEventSpec {
            kind: 1,
            info,
            log_page: 2,
            critical_warning: match info {
                0 => 0b100,
                1 => 0b10,
                _ => 0b1,
            },
        }
    }

    fn dw0(&self) -> u32 {
        u32::from(self.kind & 7) | u32::from(self.info) << 8 | u32::from(self.log_page) << 16
    }
}

/// One namespace: its block size (512 or 4096 bytes) and number of blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimNamespace {
    pub block_size: u32,
    pub blocks: u64,
    /// Metadata bytes per block, where they travel and the protection information in them
    /// (`ms=`, `mset=`, `pi=`, `pil=`, `pif=`): moved, kept, inserted, stripped and checked
    /// as PRINFO asks, as QEMU's controller does.
    pub metadata: MetadataFormat,
}

/// How the controller runs commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SimMode {
    /// A doorbell write runs the commands at once, in the writing thread: deterministic.
    #[default]
    Inline,
    /// A controller thread completes I/O commands `latency` after it fetched them, in random
    /// order among those due when `out_of_order`.
    Threaded {
        latency: Duration,
        out_of_order: bool,
    },
}

/// The simulated controller's geometry and features. `Default` is like QEMU's `-device nvme`:
/// one 1 GiB namespace of 512-byte blocks, MQES 2047, MDTS 7, 64 I/O queue pairs, SGLs and
/// Doorbell Buffer Config supported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimConfig {
    /// Namespaces 1, 2, ... in this order.
    pub namespaces: Vec<SimNamespace>,
    pub backend: Backend,
    /// CAP.MQES: the largest I/O queue, in entries, 0's based (1 ..= 65535).
    pub mqes: u16,
    /// Identify MDTS: the largest transfer is `4 KiB << mdts` (0: no limit).
    pub mdts: u8,
    /// I/O queue pairs granted at most (1 ..= 65535).
    pub io_queues: u16,
    /// MSI-X vectors (the table size, 0 ..= 2048; QEMU's `msix_qsize`).
    pub msix_vectors: u16,
    /// SGLs for I/O commands (Identify SGLS).
    pub sgl: bool,
    /// Doorbell Buffer Config (OACS bit 8).
    pub doorbell_buffer: bool,
    /// CAP.TO, in 500 ms units.
    pub timeout: u8,
    /// CAP.DSTRD: doorbells are `4 << dstrd` bytes apart (0 ..= 15).
    pub dstrd: u8,
    pub serial: String,
    pub model: String,
    pub firmware: String,
    pub mode: SimMode,
    /// From the Nth write (1-based) on, every write silently lands one block after its LBA:
    /// misdirected writes, the corruption a data check must catch.
    pub misdirect_write: Option<u64>,
    /// Faults armed at power-on (the `corrupt=N` and `nodata=N` options of a `sim:` address).
    pub faults: Vec<Fault>,
    /// CSTS.RDY comes this long after CC.EN 0 -> 1, as a real controller's does: a reset takes
    /// time (0: at once).
    pub ready_delay: Duration,
    /// How long a sanitize or a device self-test runs after its command completed.
    pub maintenance_time: Duration,
    /// Events that happened before power-on (`warn=`): reported to the first Asynchronous
    /// Event Requests, their SMART bits set from the start.
    pub events: Vec<AsyncEventSpec>,
    /// NVM capacity no namespace holds at power-on, in bytes (`spare=`): room for Namespace
    /// Management to create namespaces in.
    pub spare_capacity: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            namespaces: vec![SimNamespace {
                block_size: 512,
                blocks: (1 << 30) / 512,
                metadata: MetadataFormat::default(),
            }],
            backend: Backend::Null,
            mqes: 2047,
            mdts: 7,
            io_queues: 64,
            msix_vectors: 65,
            sgl: true,
            doorbell_buffer: true,
            timeout: 20,
            dstrd: 0,
            serial: "sim0".into(),
            model: "usnvme sim".into(),
            firmware: "1.0".into(),
            mode: SimMode::Inline,
            misdirect_write: None,
            faults: Vec::new(),
            ready_delay: Duration::ZERO,
            maintenance_time: Duration::from_millis(300),
            events: Vec::new(),
            spare_capacity: 0,
        }
    }
}

impl SimConfig {
    /// Why this configuration cannot be simulated, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.namespaces.is_empty() || self.namespaces.len() > 1024 {
            return Err(format!("{} namespaces: 1 to 1024", self.namespaces.len()));
        }
        for (i, ns) in self.namespaces.iter().enumerate() {
            if !ns.block_size.is_power_of_two() || !(512..=65536).contains(&ns.block_size) {
                return Err(format!(
                    "namespace {}: block size {} is not a power of two from 512 to 65536",
                    i + 1,
                    ns.block_size
                ));
            }
            if ns.blocks == 0 || ns.blocks.checked_mul(ns.block_size as u64).is_none() {
                return Err(format!("namespace {}: {} blocks", i + 1, ns.blocks));
            }
        }
        if self.mqes == 0 {
            return Err("MQES 0: queues need at least 2 entries".into());
        }
        if self.io_queues == 0 || self.io_queues == u16::MAX {
            return Err(format!("{} I/O queues: 1 to 65534", self.io_queues));
        }
        if self.msix_vectors > 2048 {
            return Err(format!("{} MSI-X vectors: 0 to 2048", self.msix_vectors));
        }
        if self.mdts > 20 || self.dstrd > 15 {
            return Err(format!(
                "MDTS {} (0 to 20) or DSTRD {} (0 to 15) out of range",
                self.mdts, self.dstrd
            ));
        }
        Ok(())
    }

    /// Total NVM capacity in bytes: the configured namespaces and the spare.
    fn capacity(&self) -> u128 {
        let namespaces: u128 = self
            .namespaces
            .iter()
            .map(|n| u128::from(n.blocks) * u128::from(n.block_size))
            .sum();
        namespaces + u128::from(self.spare_capacity)
    }

    /// The largest transfer in bytes for a memory page of `page` bytes.
    fn max_transfer(&self, page: u64) -> u64 {
        match self.mdts {
            0 => u64::MAX,
            m => page << m,
        }
    }

    fn threaded(&self) -> bool {
        matches!(self.mode, SimMode::Threaded { .. })
    }
}

/// A software NVMe controller. Hand it to [`Controller::init`] as its registers.
pub struct SimController {
    inner: Arc<Inner>,
}

impl fmt::Debug for SimController {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimController")
            .field("serial", &self.inner.config.serial)
            .field("csts", &Csts(self.inner.csts.load(Ordering::Acquire)))
            .field("removed", &self.inner.removed.load(Ordering::Acquire))
            .field("commands", &self.commands())
            .finish_non_exhaustive()
    }
}

/// Event counters.
#[derive(Debug, Default)]
struct Counters {
    commands: AtomicU64,
    completions: AtomicU64,
    dma_faults: AtomicU64,
    invalid_doorbells: AtomicU64,
    reads: AtomicU64,
    writes: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
}

#[derive(Debug, Default)]
struct RegFile {
    cc: u32,
    aqa: u32,
    asq: u64,
    acq: u64,
}

/// The newest Error Information entries (ELPE + 1 of them).
#[derive(Debug, Default)]
struct ErrorLog {
    count: u64,
    entries: std::collections::VecDeque<ErrorLogEntry>,
}

const ERROR_LOG_ENTRIES: usize = 64;

pub(crate) struct Inner {
    config: SimConfig,
    space: Arc<IovaSpace>,
    cap: Cap,
    identify: Box<IdentifyController>,
    regs: Mutex<RegFile>,
    csts: AtomicU32,
    /// When CSTS.RDY is due after an enable (`SimConfig::ready_delay`).
    ready_at: Mutex<Option<Instant>>,
    removed: AtomicBool,
    running: RwLock<Option<Arc<Running>>>,
    /// Each queue ID's doorbell: what a write to it reaches (a copy of the running state's
    /// table entry, kept by the admin commands that change the table), on a cache line of its
    /// own, so that queue pairs on many cores share no lock per doorbell, as hardware's don't.
    doorbells: Box<[CachePadded<RwLock<Option<QueueDoorbell>>>]>,
    /// The namespaces allocated and attached (Namespace Management and Attachment change them).
    namespaces: RwLock<namespaces::NamespaceTable>,
    /// Each namespace ID's data.
    stores: Vec<Store>,
    /// Each namespace's metadata, `metadata.size` bytes per block, kept inverted so that what
    /// was never written reads as all ones: the tuples of a fresh drive, which escape checks.
    metadata_stores: Vec<Store>,
    /// Sanitize and self-test under way, and their outcomes.
    maintenance: maintenance::Maintenance,
    /// The firmware slots, and an image being downloaded.
    firmware: firmware::Firmware,
    /// Asynchronous events no request was outstanding for (CQE dword 0 each), and the SMART
    /// log's critical warning bits raised.
    pending_events: Mutex<Vec<u32>>,
    critical_warning: AtomicU8,
    faults: Faults,
    errors: Mutex<ErrorLog>,
    counters: Counters,
    /// The MSI-X table: each enabled vector's eventfd (empty: MSI-X off). A PCI function's
    /// state: a controller reset keeps it.
    msix: Mutex<Vec<Arc<EventFd>>>,
}

/// What a queue ID's doorbell reaches while the controller runs.
struct QueueDoorbell {
    run: Arc<Running>,
    sq: Option<Arc<Mutex<Sq>>>,
    cq: Option<Arc<Mutex<Cq>>>,
    shadow: Option<ShadowBuf>,
}

/// Where Doorbell Buffer Config put the shadow doorbells and EventIdx entries.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ShadowBuf {
    dbs: u64,
    eis: u64,
}

/// The queues, indexed by queue id (0: admin).
pub(crate) struct Table {
    sqs: Vec<Option<Arc<Mutex<Sq>>>>,
    cqs: Vec<Option<Arc<Mutex<Cq>>>>,
    shadow: Option<ShadowBuf>,
}

pub(crate) struct Features {
    /// I/O submission and completion queues granted (Set Features, Number of Queues).
    nsq: u16,
    ncq: u16,
    values: [u32; 16],
    /// Asynchronous Event Requests held: their command ids.
    async_events: Vec<u16>,
}

/// The state of an enabled controller; a reset drops it whole.
pub(crate) struct Running {
    page: u64,
    table: RwLock<Table>,
    features: Mutex<Features>,
    shutdown: AtomicBool,
    stop: AtomicBool,
    worker: Mutex<Option<JoinHandle<()>>>,
    waker: OnceLock<Thread>,
}

impl Running {
    fn wake(&self) {
        if let Some(t) = self.waker.get() {
            t.unpark();
        }
    }
}

/// What a command's execution produced.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outcome {
    status: Status,
    dw0: u32,
    /// For the Error Information entry: the LBA, and the byte of the command at fault.
    lba: u64,
    byte: Option<u16>,
    /// No completion now (Asynchronous Event Request).
    hold: bool,
}

impl Outcome {
    fn ok(dw0: u32) -> Outcome {
        Outcome {
            status: Status::SUCCESS,
            dw0,
            lba: 0,
            byte: None,
            hold: false,
        }
    }

    /// A failure that would fail again: DNR set.
    fn fail(status: Status) -> Outcome {
        Outcome::status(status.with_dnr())
    }

    /// A failure with the status exactly as given.
    fn status(status: Status) -> Outcome {
        Outcome {
            status,
            ..Outcome::ok(0)
        }
    }

    fn at(mut self, byte: u16) -> Outcome {
        self.byte = Some(byte);
        self
    }

    fn lba(mut self, lba: u64) -> Outcome {
        self.lba = lba;
        self
    }
}

/// What the commands of one batch share.
pub(crate) struct Ctx<'a> {
    inner: &'a Inner,
    run: &'a Running,
    mem: &'a IovaMemory,
    shadow: Option<ShadowBuf>,
    now: Instant,
}

impl Ctx<'_> {
    fn stride(&self) -> u64 {
        4 << self.inner.config.dstrd
    }

    fn shadow_entry(&self, qid: u16, cq: bool) -> Option<(GuestAddress, GuestAddress)> {
        let s = self.shadow?;
        let off = (2 * qid as u64 + cq as u64) * self.stride();
        Some((GuestAddress(s.dbs + off), GuestAddress(s.eis + off)))
    }

    fn read_shadow(&self, qid: u16, cq: bool) -> Option<u32> {
        let (db, _) = self.shadow_entry(qid, cq)?;
        match self.mem.load::<u32>(db, Ordering::Acquire) {
            Ok(v) => Some(v),
            Err(_) => {
                self.inner.dma_fault(db.0, "shadow doorbell");
                None
            }
        }
    }

    fn write_event_idx(&self, qid: u16, cq: bool, value: u16) {
        if let Some((_, ei)) = self.shadow_entry(qid, cq) {
            if self.mem.store(value as u32, ei, Ordering::Release).is_err() {
                self.inner.dma_fault(ei.0, "EventIdx");
            }
        }
    }

    /// Refreshes a CQ's head from its shadow doorbell and posts what waited for room.
    fn refresh_cq(&self, cq: &mut Cq) {
        if cq.qid != 0 {
            if let Some(v) = self.read_shadow(cq.qid, true) {
                if cq.shadow.take(v) {
                    if let Err(e) = cq.set_head(v) {
                        self.inner
                            .invalid_doorbell(&format!("shadow doorbell: {e}"));
                    }
                }
            }
        }
        if let Err(e) = cq.drain(self.mem) {
            self.inner.cq_fault(e.0);
        }
    }
}

impl SimController {
    /// A controller (disabled, as after power-on) whose DMA goes through `space`.
    ///
    /// Panics if `config` is impossible (see [`SimConfig::check`]).
    pub fn new(config: SimConfig, space: Arc<IovaSpace>) -> Arc<SimController> {
        if let Err(e) = config.check() {
            panic!("sim: impossible configuration: {e}");
        }
        let doorbells = (0..=config.io_queues)
            .map(|_| CachePadded::new(RwLock::new(None)))
            .collect();
        let cap = Cap(config.mqes as u64
            | 1 << 16 // CQR: queues must be physically contiguous
            | (config.timeout as u64) << 24
            | (config.dstrd as u64) << 32
            | 1 << 37 // CSS: NVM command set
            | 4 << 52); // MPSMAX: 64 KiB pages
        let identify = Box::new(admin::identify_controller(&config));
        let table = namespaces::NamespaceTable::new(&config.namespaces);
        let stores = table
            .slots
            .iter()
            .map(|_| Store::new(config.backend))
            .collect();
        let metadata_stores = table
            .slots
            .iter()
            .map(|_| Store::new(config.backend))
            .collect();
        let misdirect = config.misdirect_write;
        let maintenance_time = config.maintenance_time;
        let firmware = firmware::Firmware::new(&config.firmware);
        let startup_events = config.events.clone();
        let faults = config.faults.clone();
        let sim = Arc::new(SimController {
            inner: Arc::new(Inner {
                config,
                space,
                cap,
                identify,
                regs: Mutex::default(),
                csts: AtomicU32::new(0),
                ready_at: Mutex::new(None),
                removed: AtomicBool::new(false),
                running: RwLock::new(None),
                doorbells,
                namespaces: RwLock::new(table),
                stores,
                metadata_stores,
                maintenance: maintenance::Maintenance::new(maintenance_time),
                firmware,
                pending_events: Mutex::new(
                    startup_events.iter().map(AsyncEventSpec::dw0).collect(),
                ),
                critical_warning: AtomicU8::new(
                    startup_events
                        .iter()
                        .fold(0, |bits, e| bits | e.critical_warning),
                ),
                faults: Faults::default(),
                errors: Mutex::default(),
                counters: Counters::default(),
                msix: Mutex::new(Vec::new()),
            }),
        });
        if let Some(n) = misdirect {
            let write = FaultWhen::opcode(crate::spec::IoOpcode::Write as u8).with_nth(n);
            sim.inject(Fault::new(write, FaultAction::MisdirectWrite).times(0));
        }
        for fault in faults {
            sim.inject(fault);
        }
        sim
    }

    pub fn config(&self) -> &SimConfig {
        &self.inner.config
    }

    /// Arms a fault; it applies to commands fetched from now on.
    pub fn inject(&self, fault: Fault) {
        self.inner.faults.inject(fault);
    }

    /// Disarms every fault.
    pub fn clear_faults(&self) {
        self.inner.faults.clear();
    }

    /// Faults still armed.
    pub fn faults_armed(&self) -> usize {
        self.inner.faults.armed()
    }

    /// Surprise removal: from now on registers read all ones, writes are ignored and nothing
    /// completes.
    pub fn remove(&self) {
        log::warn!("{}: surprise removal", self.inner.config.serial);
        self.inner.removed.store(true, Ordering::Release);
    }

    /// A fatal controller error: CSTS.CFS, nothing processed until a reset (CC.EN 1 -> 0).
    pub fn set_fatal(&self) {
        self.inner.fatal("set_fatal()");
    }

    /// Commands fetched, admin and I/O.
    pub fn commands(&self) -> u64 {
        self.inner.counters.commands.load(Ordering::Relaxed)
    }

    /// Completion entries posted (a duplicate counts twice).
    pub fn completions(&self) -> u64 {
        self.inner.counters.completions.load(Ordering::Relaxed)
    }

    /// Accesses to IOVAs that are not mapped (an IOMMU would have faulted).
    pub fn dma_faults(&self) -> u64 {
        self.inner.counters.dma_faults.load(Ordering::Relaxed)
    }

    /// Doorbell writes refused: beyond the queue, moving back, past what was posted, or for a
    /// queue that does not exist.
    pub fn invalid_doorbells(&self) -> u64 {
        self.inner
            .counters
            .invalid_doorbells
            .load(Ordering::Relaxed)
    }

    /// The Error Information log, newest first.
    pub fn error_log(&self) -> Vec<ErrorLogEntry> {
        self.inner.errors.lock().entries.iter().copied().collect()
    }

    /// I/O submission and completion queues that exist now.
    pub fn io_queues(&self) -> (usize, usize) {
        let running = self.inner.running.read();
        let Some(run) = running.as_ref() else {
            return (0, 0);
        };
        let t = run.table.read();
        (live(&t.sqs), live(&t.cqs))
    }

    /// Command ids the controller holds on SQ `qid` without having completed them: pending
    /// (threaded latency, delay faults) or dropped; not the Asynchronous Event Requests it
    /// keeps until an event ([`SimController::async_events_held`]).
    pub fn held(&self, qid: u16) -> Vec<u16> {
        let running = self.inner.running.read();
        let Some(run) = running.as_ref() else {
            return Vec::new();
        };
        let sq = run.table.read().sqs.get(qid as usize).cloned().flatten();
        let events = run.features.lock().async_events.clone();
        sq.map_or_else(Vec::new, |sq| {
            let sq = sq.lock();
            (0..=u16::MAX)
                .filter(|&c| sq.inflight.contains(c) && !(qid == 0 && events.contains(&c)))
                .collect()
        })
    }

    /// Asynchronous Event Requests the controller holds.
    pub fn async_events_held(&self) -> usize {
        let running = self.inner.running.read();
        running
            .as_ref()
            .map_or(0, |run| run.features.lock().async_events.len())
    }

    /// Executes and completes, now and in this thread, the commands a [`FaultAction::Hold`]
    /// holds on SQ `qid` (0: the admin queue); returns their opcodes, in fetch order.
    pub fn release(&self, qid: u16) -> Vec<u8> {
        let inner = &self.inner;
        let running = inner.running.read();
        let Some(run) = running.as_ref() else {
            return Vec::new();
        };
        let (sq, shadow) = {
            let t = run.table.read();
            (t.sqs.get(qid as usize).cloned().flatten(), t.shadow)
        };
        let Some(sq) = sq else {
            return Vec::new();
        };
        let mem = inner.space.memory();
        let ctx = inner.ctx(run, &mem, shadow);
        let mut sq = sq.lock();
        let mut held: Vec<_> = sq
            .pending
            .iter_mut()
            .filter(|p| p.action == Some(FaultAction::Hold))
            .collect();
        held.sort_unstable_by_key(|p| p.seq);
        let opcodes = held
            .into_iter()
            .map(|p| {
                (p.due, p.action) = (ctx.now, None);
                p.sqe.opcode()
            })
            .collect();
        if !sq.deleted {
            inner.run_due(&ctx, &mut sq);
        }
        opcodes
    }

    /// An asynchronous event: completes a held Asynchronous Event Request with CQE dword 0
    /// `type | info << 8 | log_page << 16`, or keeps it for the next one (as a controller keeps
    /// an event no request was outstanding for). `SmartHealth` events also set `critical_warning`
    /// bits in the SMART log.
    pub fn raise_event(&self, event: AsyncEventSpec) {
        let inner = &self.inner;
        inner.note_event(event);
        let running = inner.running.read();
        let Some(run) = running.as_ref() else {
            return;
        };
        let (sq, shadow) = {
            let t = run.table.read();
            (t.sqs.first().cloned().flatten(), t.shadow)
        };
        let Some(sq) = sq else {
            return;
        };
        let mem = inner.space.memory();
        let ctx = inner.ctx(run, &mem, shadow);
        inner.deliver_events(&ctx, &mut sq.lock());
    }

    /// How long a sanitize or self-test runs from now on (one under way too): a test ends one
    /// when it chooses.
    pub fn set_maintenance_time(&self, took: Duration) {
        self.inner.maintenance.set_time(took);
    }

    /// Overwrites bytes of namespace `nsid`'s data at byte `offset` in the ram backend, behind
    /// the host's back (a test's corruption of the medium); false without such a namespace.
    pub fn overwrite_data(&self, nsid: u32, offset: u64, bytes: &[u8]) -> bool {
        let store = nsid
            .checked_sub(1)
            .and_then(|i| self.inner.stores.get(i as usize));
        store.inspect(|s| s.write(offset, bytes)).is_some()
    }

    /// 4 KiB chunks of data the ram backend holds for namespace `nsid`.
    pub fn stored_chunks(&self, nsid: u32) -> usize {
        nsid.checked_sub(1)
            .and_then(|i| self.inner.stores.get(i as usize))
            .map_or(0, Store::chunks)
    }
}

/// The sim's MSI-X table: enabling makes one eventfd per vector, as VFIO takes them.
impl Interrupts for SimController {
    fn vectors(&self) -> u16 {
        self.inner.config.msix_vectors
    }

    fn enable(&self, count: u16) -> std::io::Result<Vec<Arc<EventFd>>> {
        if count == 0 || count > self.inner.config.msix_vectors {
            // as VFIO refuses more vectors than the table has
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        let fds = (0..count)
            .map(|_| interrupt_eventfd().map(Arc::new))
            .collect::<std::io::Result<Vec<_>>>()?;
        *self.inner.msix.lock() = fds.clone();
        Ok(fds)
    }
}

impl Drop for SimController {
    fn drop(&mut self) {
        self.inner.reset();
    }
}

impl Registers for SimController {
    fn read32(&self, offset: usize) -> u32 {
        let inner = &self.inner;
        if inner.removed.load(Ordering::Acquire) {
            return u32::MAX;
        }
        let regs = || inner.regs.lock();
        match offset {
            reg::CAP => inner.cap.0 as u32,
            o if o == reg::CAP + 4 => (inner.cap.0 >> 32) as u32,
            reg::VS => 0x0001_0400,
            reg::CC => regs().cc,
            reg::CSTS => {
                let mut ready_at = inner.ready_at.lock();
                if ready_at.is_some_and(|at| Instant::now() >= at) {
                    *ready_at = None;
                    let csts = Csts(inner.csts.load(Ordering::Acquire));
                    inner.csts.store(csts.with_rdy(true).0, Ordering::Release);
                }
                inner.csts.load(Ordering::Acquire)
            }
            reg::AQA => regs().aqa,
            reg::ASQ => regs().asq as u32,
            o if o == reg::ASQ + 4 => (regs().asq >> 32) as u32,
            reg::ACQ => regs().acq as u32,
            o if o == reg::ACQ + 4 => (regs().acq >> 32) as u32,
            _ => 0,
        }
    }

    fn write32(&self, offset: usize, value: u32) {
        let inner = &self.inner;
        if inner.removed.load(Ordering::Acquire) {
            return;
        }
        if offset >= reg::DOORBELLS {
            inner.doorbell(offset, value);
            return;
        }
        let mut regs = inner.regs.lock();
        let enabled = Cc(regs.cc).en();
        let set_low = |r: &mut u64| *r = (*r & !0xffff_ffff) | value as u64;
        let set_high = |r: &mut u64| *r = (*r & 0xffff_ffff) | (value as u64) << 32;
        match offset {
            reg::CC => inner.write_cc(&mut regs, value),
            o if (reg::AQA..reg::ACQ + 8).contains(&o) && enabled => {
                log::warn!("sim: admin queue registers written while enabled: ignored")
            }
            reg::AQA => regs.aqa = value,
            reg::ASQ => set_low(&mut regs.asq),
            o if o == reg::ASQ + 4 => set_high(&mut regs.asq),
            reg::ACQ => set_low(&mut regs.acq),
            o if o == reg::ACQ + 4 => set_high(&mut regs.acq),
            _ => {} // read-only or unimplemented: ignored, as hardware does
        }
    }
}

impl Inner {
    /// Keeps `event` for the next Asynchronous Event Request; sets its SMART warning bits.
    fn note_event(&self, event: AsyncEventSpec) {
        if event.critical_warning != 0 {
            self.critical_warning
                .fetch_or(event.critical_warning, Ordering::Relaxed);
        }
        self.pending_events.lock().push(event.dw0());
    }

    /// Completes held Asynchronous Event Requests on the admin queue `sq` with the events
    /// waiting, oldest first.
    fn deliver_events(&self, ctx: &Ctx, sq: &mut Sq) {
        loop {
            let mut pending = self.pending_events.lock();
            let mut features = ctx.run.features.lock();
            if pending.is_empty() {
                return;
            }
            let Some(cid) = features.async_events.pop() else {
                return;
            };
            let dw0 = pending.remove(0);
            drop((pending, features));
            let mut sqe = crate::spec::Sqe::async_event_request();
            sqe.set_cid(cid);
            self.finish(ctx, sq, &sqe, Outcome::ok(dw0), None);
        }
    }

    /// Raises `event` while an I/O queue is being processed: delivered at once unless the
    /// admin queue is busy (never waited for here, against the lock order), else by the next
    /// admin command.
    fn raise_event_while_busy(&self, ctx: &Ctx, event: AsyncEventSpec) {
        self.note_event(event);
        let Some(admin) = ctx.run.table.read().sqs.first().cloned().flatten() else {
            return;
        };
        if let Some(mut sq) = admin.try_lock() {
            self.deliver_events(ctx, &mut sq);
        };
    }

    fn halted(&self, run: &Running) -> bool {
        Csts(self.csts.load(Ordering::Acquire)).cfs()
            || self.removed.load(Ordering::Acquire)
            || run.shutdown.load(Ordering::Acquire)
    }

    fn fatal(&self, why: &str) {
        log::error!(
            "{}: controller fatal status (CSTS.CFS): {why}",
            self.config.serial
        );
        self.csts
            .fetch_or(Csts(0).with_cfs(true).0, Ordering::AcqRel);
    }

    fn dma_fault(&self, iova: u64, what: &str) {
        log::warn!(
            "{}: DMA fault: {what} at IOVA {iova:#x} is not mapped",
            self.config.serial
        );
        self.counters.dma_faults.fetch_add(1, Ordering::Relaxed);
    }

    fn cq_fault(&self, iova: u64) {
        self.dma_fault(iova, "completion queue entry");
        self.fatal("a completion could not be posted");
    }

    fn invalid_doorbell(&self, why: &str) {
        log::warn!(
            "{}: invalid doorbell write ignored: {why}",
            self.config.serial
        );
        self.counters
            .invalid_doorbells
            .fetch_add(1, Ordering::Relaxed);
    }

    fn log_error(&self, sqid: u16, cid: u16, nsid: u32, out: &Outcome) {
        let mut log = self.errors.lock();
        log.count += 1;
        let mut e = ErrorLogEntry::zeroed();
        e.error_count = log.count;
        e.sqid = sqid;
        e.cid = cid;
        e.status_field = out.status.to_word(false);
        e.parameter_error_location = out.byte.unwrap_or(0xffff);
        e.lba = out.lba;
        e.nsid = nsid;
        if log.entries.len() == ERROR_LOG_ENTRIES {
            log.entries.pop_back();
        }
        log.entries.push_front(e);
    }

    /// CC written: enable, reset, shutdown.
    fn write_cc(self: &Arc<Self>, regs: &mut RegFile, value: u32) {
        let (old, new) = (Cc(regs.cc), Cc(value));
        regs.cc = value;
        if old.en() && !new.en() {
            self.reset();
            let shst = Csts(self.csts.load(Ordering::Acquire)).shst();
            let keep = if new.shn() != Cc::SHN_NONE {
                shst
            } else {
                ShutdownStatus::Normal
            };
            self.csts
                .store(Csts(0).with_shst(keep).0, Ordering::Release);
            return;
        }
        if !old.en() && new.en() {
            self.firmware.on_reset();
            match self.enable(regs, new) {
                Ok(run) => {
                    self.start_worker(&run);
                    *self.running.write() = Some(run.clone());
                    self.publish_doorbells(&run, 0..1);
                    if self.config.ready_delay.is_zero() {
                        self.csts.store(Csts(0).with_rdy(true).0, Ordering::Release);
                    } else {
                        *self.ready_at.lock() = Some(Instant::now() + self.config.ready_delay);
                    }
                }
                Err(why) => self.fatal(&format!("enable refused: {why}")),
            }
        }
        if new.en() && new.shn() != Cc::SHN_NONE && old.shn() == Cc::SHN_NONE {
            if let Some(run) = self.running.read().as_ref() {
                run.shutdown.store(true, Ordering::Release);
            }
            let csts = Csts(self.csts.load(Ordering::Acquire));
            self.csts.store(
                csts.with_shst(ShutdownStatus::Complete).0,
                Ordering::Release,
            );
        }
        if new.shn() == Cc::SHN_NONE && old.shn() != Cc::SHN_NONE {
            let csts = Csts(self.csts.load(Ordering::Acquire));
            self.csts
                .store(csts.with_shst(ShutdownStatus::Normal).0, Ordering::Release);
        }
    }

    /// CC.EN 0 -> 1: checks the configuration and the admin queues, builds the running state.
    fn enable(&self, regs: &RegFile, cc: Cc) -> Result<Arc<Running>, String> {
        let cap = self.cap;
        if cc.css() != Cc::CSS_NVM {
            return Err(format!("CC.CSS {} is not the NVM command set", cc.css()));
        }
        if cc.mps() < cap.mpsmin() || cc.mps() > cap.mpsmax() {
            return Err(format!(
                "CC.MPS {} outside CAP.MPSMIN {} .. MPSMAX {}",
                cc.mps(),
                cap.mpsmin(),
                cap.mpsmax()
            ));
        }
        if cc.iosqes() != 6 || cc.iocqes() != 4 {
            return Err(format!(
                "CC.IOSQES {} / IOCQES {}: entries are 64 and 16 bytes (6 and 4)",
                cc.iosqes(),
                cc.iocqes()
            ));
        }
        if cc.ams() != Cc::AMS_ROUND_ROBIN {
            return Err(format!("CC.AMS {} is not supported", cc.ams()));
        }
        let page = cc.page_size();
        let aqa = crate::spec::Aqa(regs.aqa);
        if aqa.sq_entries() < 2 || aqa.cq_entries() < 2 {
            return Err(format!(
                "AQA: admin queues of {} / {} entries (at least 2)",
                aqa.sq_entries(),
                aqa.cq_entries()
            ));
        }
        for (name, addr) in [("ASQ", regs.asq), ("ACQ", regs.acq)] {
            if addr == 0 || addr % page != 0 {
                return Err(format!(
                    "{name} {addr:#x} is not aligned to the {page}-byte memory page"
                ));
            }
        }
        let mem = self.space.memory();
        let sq_bytes = aqa.sq_entries() as usize * SQE_BYTES as usize;
        let cq_bytes = aqa.cq_entries() as usize * queue::CQE_BYTES as usize;
        for (name, addr, len) in [("ASQ", regs.asq, sq_bytes), ("ACQ", regs.acq, cq_bytes)] {
            if !vm_memory::GuestMemoryBackend::check_range(&*mem, GuestAddress(addr), len) {
                self.dma_fault(addr, name);
                return Err(format!("{name} {addr:#x} + {len:#x} is not mapped"));
            }
        }
        let n = self.config.io_queues as usize + 1;
        let mut table = Table {
            sqs: vec![None; n],
            cqs: vec![None; n],
            shadow: None,
        };
        let acq = Arc::new(Mutex::new(Cq::new(0, regs.acq, aqa.cq_entries())));
        table.sqs[0] = Some(Arc::new(Mutex::new(Sq::new(
            0,
            regs.asq,
            aqa.sq_entries(),
            0,
            acq.clone(),
        ))));
        table.cqs[0] = Some(acq);
        let mut values = [0u32; 16];
        values[0x04] = 343; // temperature threshold: 70 °C
        values[0x06] = 1; // volatile write cache enabled
        let run = Arc::new(Running {
            page,
            table: RwLock::new(table),
            features: Mutex::new(Features {
                nsq: self.config.io_queues,
                ncq: self.config.io_queues,
                values,
                async_events: Vec::new(),
            }),
            shutdown: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            worker: Mutex::new(None),
            waker: OnceLock::new(),
        });
        Ok(run)
    }

    /// Controller reset: stops the controller thread, forgets every queue and command.
    fn reset(&self) {
        *self.ready_at.lock() = None;
        let run = self.running.write().take();
        // (after the running state's lock is let go: a doorbell being handled holds its slot)
        for slot in self.doorbells.iter() {
            *slot.write() = None;
        }
        if let Some(run) = run {
            run.stop.store(true, Ordering::Release);
            run.wake();
            if let Some(worker) = run.worker.lock().take() {
                if worker.join().is_err() {
                    log::error!("{}: controller thread panicked", self.config.serial);
                }
            }
        }
    }

    /// Copies the running state's queue table into the doorbells of `qids`: at enable, and
    /// after an admin command changed the table, before its completion (a host rings only the
    /// queues it was told exist). The table's lock is let go before a doorbell's is taken.
    fn publish_doorbells(&self, run: &Arc<Running>, qids: std::ops::Range<usize>) {
        let entries: Vec<(usize, QueueDoorbell)> = {
            let t = run.table.read();
            qids.map(|q| {
                let doorbell = QueueDoorbell {
                    run: run.clone(),
                    sq: t.sqs.get(q).cloned().flatten(),
                    cq: t.cqs.get(q).cloned().flatten(),
                    shadow: t.shadow,
                };
                (q, doorbell)
            })
            .collect()
        };
        for (q, doorbell) in entries {
            if let Some(slot) = self.doorbells.get(q) {
                *slot.write() = Some(doorbell);
            }
        }
    }

    /// An admin command changed the I/O queues or their shadow doorbells: their doorbells
    /// follow (unless a reset took the running state meanwhile).
    pub(super) fn io_queues_changed(&self, run: &Running) {
        let current = self.running.read().clone();
        if let Some(current) = current.filter(|r| std::ptr::eq(&**r, run)) {
            self.publish_doorbells(&current, 1..self.doorbells.len());
        }
    }

    /// Starts the controller thread of threaded mode.
    fn start_worker(self: &Arc<Self>, run: &Arc<Running>) {
        let mut worker = run.worker.lock();
        if worker.is_some() || !self.config.threaded() {
            return;
        }
        let (inner, r) = (self.clone(), run.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("{}-ctrl", self.config.serial))
            .spawn(move || inner.worker(&r));
        match spawned {
            Ok(handle) => {
                let _ = run.waker.set(handle.thread().clone());
                *worker = Some(handle);
            }
            Err(e) => self.fatal(&format!("cannot start the controller thread: {e}")),
        }
    }

    /// A doorbell register written.
    fn doorbell(&self, offset: usize, value: u32) {
        let stride = 4usize << self.config.dstrd;
        let rel = offset - reg::DOORBELLS;
        let (qid, is_cq) = (rel / stride / 2, rel / stride % 2 == 1);
        let Some(slot) = self
            .doorbells
            .get(qid)
            .filter(|_| rel.is_multiple_of(stride))
        else {
            self.invalid_doorbell(&format!("no doorbell at {offset:#x}"));
            return;
        };
        let slot = slot.read();
        let Some(QueueDoorbell {
            run,
            sq,
            cq,
            shadow,
        }) = slot.as_ref()
        else {
            self.invalid_doorbell(&format!("doorbell {offset:#x} while disabled"));
            return;
        };
        let (run, shadow) = (&**run, *shadow);
        if self.halted(run) {
            return;
        }
        let qid = qid as u16;
        let threaded = self.config.threaded() && qid != 0;
        if is_cq {
            let Some(cq) = cq else {
                self.invalid_doorbell(&format!("CQ {qid} does not exist"));
                return;
            };
            {
                let mut cq = cq.lock();
                if let Err(e) = cq.set_head(value) {
                    self.invalid_doorbell(&e);
                    return;
                }
                cq.shadow.rung(value);
            }
            if threaded {
                run.wake();
                return;
            }
            // (the queue pair's view of the IOVA space, taken before the CQ's lock: the SQ's
            // lock comes first wherever both are held)
            let mut view = sq
                .as_ref()
                .and_then(|sq| sq.lock().view.take())
                .unwrap_or_else(|| self.space.view());
            let mem = self.space.refresh(&mut view);
            let ctx = self.ctx(run, mem, shadow);
            if let Err(e) = cq.lock().drain(mem) {
                self.cq_fault(e.0);
            }
            // inline: a delayed completion of this queue pair may be due
            if let Some(sq) = sq {
                let mut sq = sq.lock();
                if !sq.deleted && sq.cqid == qid {
                    self.run_due(&ctx, &mut sq);
                }
                sq.view = Some(view);
            }
            return;
        }
        let Some(sq) = sq else {
            self.invalid_doorbell(&format!("SQ {qid} does not exist"));
            return;
        };
        let mut sq = sq.lock();
        if sq.deleted {
            self.invalid_doorbell(&format!("SQ {qid} was deleted"));
            return;
        }
        if let Err(e) = sq.set_tail(value) {
            self.invalid_doorbell(&e);
            return;
        }
        sq.shadow.rung(value);
        if threaded {
            drop(sq);
            run.wake();
            return;
        }
        let mut view = sq.view.take().unwrap_or_else(|| self.space.view());
        let ctx = self.ctx(run, self.space.refresh(&mut view), shadow);
        self.run_sq(&ctx, &mut sq);
        self.run_due(&ctx, &mut sq);
        if qid != 0 {
            // ring MMIO for the next batch: the host rings when EventIdx lies in [old, new)
            ctx.write_event_idx(qid, false, sq.tail);
        }
        sq.view = Some(view);
    }

    fn ctx<'a>(
        &'a self,
        run: &'a Running,
        mem: &'a IovaMemory,
        shadow: Option<ShadowBuf>,
    ) -> Ctx<'a> {
        Ctx {
            inner: self,
            run,
            mem,
            shadow,
            now: Instant::now(),
        }
    }
}

/// I/O queues in a table (entry 0 is the admin queue).
fn live<T>(queues: &[Option<T>]) -> usize {
    queues.iter().skip(1).flatten().count()
}

/// The process-wide IOVA space of simulated drives: one `NoIommu` space shared by all of them,
/// so that a buffer can go to any, as with one VFIO container.
pub fn iova_space() -> Arc<IovaSpace> {
    static SPACE: OnceLock<Arc<IovaSpace>> = OnceLock::new();
    SPACE
        .get_or_init(|| IovaSpace::new(Arc::new(NoIommu)))
        .clone()
}

/// Creates the drives of `spec` (each a fresh controller with serial `sim{N}`) and brings each
/// up as `sim:N` with `options` (on 4 KiB pages).
pub fn open(spec: &SimSpec, options: ControllerOptions) -> Result<Vec<Controller>, Error> {
    Ok(open_with_handles(spec, options)?
        .into_iter()
        .map(|(c, _)| c)
        .collect())
}

/// Like [`open`], also handing back each drive's [`SimController`] (to inject faults).
pub fn open_with_handles(
    spec: &SimSpec,
    options: ControllerOptions,
) -> Result<Vec<(Controller, Arc<SimController>)>, Error> {
    let space = iova_space();
    spec.drives
        .iter()
        .map(|&n| {
            let config = SimConfig {
                serial: format!("sim{n}"),
                ..spec.config.clone()
            };
            let sim = SimController::new(config, space.clone());
            let ctrl = Controller::init(
                format!("sim:{n}"),
                sim.clone(),
                Some(sim.clone()),
                space.clone(),
                None,
                None,
                ControllerOptions {
                    page: PageSize::Small4K,
                    ..options.clone()
                },
            )?;
            Ok((ctrl, sim))
        })
        .collect()
}

//! A controller: bring-up as the spec says, the admin queue, identify, features, log pages,
//! I/O queue pair creation, and shutdown on drop.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::eventfd::EventFd;
use parking_lot::Mutex;
use usnvme_hugepages::{DmaRegion, IovaSpace, Memory, PageSize};
use vm_memory::Bytes;

use crate::bringup::{
    self, AdminCommand, AdminPath, Data, Failed, Fault, Faults, Reg, RegisterAccess,
};
use crate::error::{Error, SubmitError};
use crate::namespaces::NamespaceSet;
use crate::pci::PciAddress;
use crate::prp::PAGE;
use crate::queue::{
    ring_entries, Doorbells, Interrupt, IoBuffer, Layout, QueueOwner, QueuePair, QueueSetup,
    Release, Shadow, Ticket,
};
use crate::regs::{Interrupts, Registers};
use crate::spec::command::{FeatureId, QueuePriority};
use crate::spec::identify::{Oacs, SglSupport};
use crate::spec::log::LogPageId;
use crate::spec::registers::{cq_head_doorbell, reg, sq_tail_doorbell};
use crate::spec::{
    AdminOpcode, Aqa, Cap, Cc, Csts, ErrorLogEntry, FirmwareSlotLog, IdentifyController, SmartLog,
    Sqe, Status, Vs,
};
use crate::vfio::{PcieLink, Vfio, VfioPciDevice};

pub use crate::namespaces::{Namespace, NamespaceChanges};

/// The largest transfer the driver issues in one command, whatever MDTS allows: one PRP-list
/// page of entries.
/// Admin data buffer: the largest page the driver reads or writes (Identify: 4 KiB).
const ADMIN_DATA: usize = 16 << 10;

/// How to bring a controller up.
#[derive(Debug, Clone)]
pub struct ControllerOptions {
    /// I/O queue pairs to ask for (Set Features Number of Queues); the controller may grant fewer.
    pub io_queues: u16,
    pub admin_depth: u16,
    /// How long an admin command may take.
    pub admin_timeout: Duration,
    /// Use Doorbell Buffer Config when the controller offers it (OACS bit 8). Off by default:
    /// only emulated controllers offer it, and under QEMU's software emulation (the test bed)
    /// keeping the shadow entries and EventIdx costs more than the MMIO writes it saves
    /// (4 KiB random reads, one boot: 98-114 k IOPS with it, 134-147 k without). Under a
    /// hypervisor where a doorbell write is a VM exit, turn it on.
    pub shadow_doorbells: bool,
    /// Describe a transfer that would need a PRP list with one SGL data block instead, where
    /// the controller supports SGLs: the controller then maps one contiguous range rather than
    /// fetching a list and a page at a time (128 KiB reads under QEMU: 28-34 k IOPS with PRP
    /// lists, 62-71 k with SGLs). Transfers of one or two pages keep PRP1/PRP2.
    pub sgl: bool,
    /// Page size of the driver's DMA memory: 2 MiB hugepages for devices; 4 KiB for `sim`.
    pub page: PageSize,
    /// NUMA node of the admin memory (None: anywhere).
    pub node: Option<u32>,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        ControllerOptions {
            io_queues: 64,
            admin_depth: 32,
            admin_timeout: Duration::from_secs(10),
            shadow_doorbells: false,
            sgl: true,
            page: PageSize::Huge2M,
            node: None,
        }
    }
}

/// Options of one I/O queue pair.
#[derive(Debug, Clone, Copy)]
pub struct QueuePairOptions {
    /// Queue depth: at most depth - 1 commands in flight (capped by CAP.MQES). The rings are
    /// larger where the controller allows (see `ring_entries` in `queue`).
    pub depth: u16,
    /// NUMA node of the rings and PRP lists (None: the controller's default).
    pub node: Option<u32>,
    /// A command older than this is aborted; if it is still there after another timeout, the
    /// controller is reset (None: never, e.g. for benchmarks that must not read the clock).
    pub timeout: Option<Duration>,
    /// The CQ raises an MSI-X interrupt when the controller posts to it (IEN, on vector qid),
    /// so that its owner can sleep until one comes ([`QueuePair::interrupt`]). MSI-X is enabled
    /// with the first such queue pair; without one the controller's interrupts stay off. Needs
    /// a vector of its own: refused (by name) where the device has fewer vectors than queues.
    pub interrupts: bool,
}

impl Default for QueuePairOptions {
    fn default() -> Self {
        QueuePairOptions {
            depth: 256,
            node: None,
            timeout: Some(Duration::from_secs(30)),
            interrupts: false,
        }
    }
}

/// A controller, shared by the threads that own its queue pairs.
#[derive(Clone)]
pub struct Controller {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("name", &self.shared.name)
            .finish()
    }
}

struct Shared {
    name: String,
    regs: Arc<dyn Registers>,
    /// The device's MSI-X vectors (None: it has no interrupts the driver can take).
    interrupts: Option<Arc<dyn Interrupts>>,
    /// Each vector's eventfd, once the first interrupt-driven queue pair enabled MSI-X.
    msix: Mutex<Option<Vec<Arc<EventFd>>>>,
    space: Arc<IovaSpace>,
    cap: Cap,
    version: Vs,
    identify: Box<IdentifyController>,
    /// The active namespaces as last read: at bring-up, or again after one changed.
    namespaces: Mutex<NamespaceSet>,
    max_transfer: u64,
    granted: u16,
    sgl: bool,
    admin: Mutex<Admin>,
    /// Deletions handed over while the admin lock was busy (a queue pair's drop never waits for
    /// it): taken up by the next admin poller.
    handoff: Mutex<Vec<Deletion>>,
    qids: Mutex<Vec<bool>>,
    /// Even: the controller is ready, odd: a reset is under way. Counts half-resets since
    /// bring-up; queue pairs compare it once per poll.
    generation: AtomicU64,
    /// The last reset failed: the queue pairs fail what they hold and take nothing more.
    failed: AtomicBool,
    ready_timeout: Duration,
    shadow: Option<Arc<DmaRegion>>,
    options: ControllerOptions,
    link: Option<PcieLink>,
    _device: Option<VfioPciDevice>,
}

struct Admin {
    queue: QueuePair,
    data: DmaRegion,
    next_token: u64,
    /// Commands someone will ask the result of: `execute`'s own, and the tickets of commands
    /// submitted without waiting. Whoever polls the admin queue files their completions here.
    waiting: Vec<Waiting>,
    /// Dropped queue pairs' queues being deleted, advanced whenever the admin queue is polled.
    deletions: Vec<Deletion>,
    /// The Asynchronous Event Request outstanding (never timed out), and the events it brought
    /// that nobody has taken yet (at most [`KEPT_EVENTS`]).
    async_event: Option<Ticket>,
    events: Vec<AsyncEvent>,
}

/// Events kept for [`Controller::events`] at most: with this many untaken, no request is sent
/// until they are taken (an event storm cannot keep the admin queue busy).
const KEPT_EVENTS: usize = 64;

/// An asynchronous event a controller reported (NVMe Base 2.0, 5.2): its type, information
/// and the log page that tells more (read by the driver, which clears the event).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    pub kind: u8,
    pub info: u8,
    pub log_page: u8,
}

impl AsyncEvent {
    fn from_dw0(dw0: u32) -> AsyncEvent {
        AsyncEvent {
            kind: (dw0 & 7) as u8,
            info: (dw0 >> 8) as u8,
            log_page: (dw0 >> 16) as u8,
        }
    }

    /// A SMART / health status event (a critical warning).
    pub fn is_smart(&self) -> bool {
        self.kind == 1
    }

    /// The Namespace Attribute Changed notice: a namespace was attached, detached, formatted
    /// or resized ([`Controller::rescan_namespaces`] tells which).
    pub fn is_namespace_change(&self) -> bool {
        (self.kind, self.info) == (2, 0)
    }

    /// The completion's dword 0 that reports this event.
    pub fn dw0(&self) -> u32 {
        u32::from(self.kind) | u32::from(self.info) << 8 | u32::from(self.log_page) << 16
    }
}

impl std::fmt::Display for AsyncEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match (self.kind, self.info) {
            (0, _) => "an error status",
            (1, 0) => "SMART / health: NVM subsystem reliability",
            (1, 1) => "SMART / health: temperature threshold",
            (1, 2) => "SMART / health: spare below threshold",
            (1, _) => "SMART / health",
            (2, 0) => "notice: namespace attribute changed",
            (2, 1) => "notice: firmware activation starting",
            (2, 2) => "notice: telemetry log changed",
            (2, 3) => "notice: asymmetric namespace access change",
            (2, _) => "notice",
            (6, _) => "I/O command set specific",
            (7, _) => "vendor specific",
            _ => "reserved",
        };
        write!(
            f,
            "{what} (type {}, information {:#04x}, log page {:#04x})",
            self.kind, self.info, self.log_page
        )
    }
}

/// An admin command submitted, and its outcome once it is known.
struct Waiting {
    ticket: Ticket,
    /// Never times out (the Asynchronous Event Request, answered when something happens).
    untimed: bool,
    command: &'static str,
    submitted: Instant,
    outcome: Option<Outcome>,
}

#[derive(Debug, Clone, Copy)]
enum Outcome {
    Done { status: Status, dw0: u32 },
    TimedOut,
}

/// A dropped queue pair's queues, deleted without anyone waiting: the SQ first, then the CQ (the
/// spec's order), after the creation command it may have left outstanding. Its queue id is given
/// back only when they are gone, so no new queue pair can take it meanwhile.
#[derive(Debug)]
struct Deletion {
    qid: u16,
    /// The command to wait for before deleting (an outstanding Create I/O CQ or SQ).
    after: Option<Ticket>,
    sq: bool,
    cq: bool,
    /// The Delete I/O SQ or CQ under way.
    sent: Option<Ticket>,
    /// A deletion timed out: the queue id stays taken until a reset clears every queue.
    stuck: bool,
}

impl Controller {
    /// Opens the controller at `addr` (bound to vfio-pci) and brings it up.
    pub fn open(
        vfio: &Arc<Vfio>,
        addr: PciAddress,
        options: ControllerOptions,
    ) -> Result<Controller, Error> {
        let device = vfio.open(addr)?;
        let regs: Arc<dyn Registers> = device.bar0().clone();
        let link = device.pcie_link();
        Controller::init(
            addr.to_string(),
            regs,
            Some(device.interrupts()),
            vfio.iova_space(),
            Some(device),
            link,
            options,
        )
    }

    /// Brings up the controller behind `regs`, with DMA memory mapped in `space`; `interrupts`
    /// are its MSI-X vectors (for queue pairs that want them). `device` keeps a VFIO device open
    /// for the controller's lifetime.
    pub fn init(
        name: String,
        regs: Arc<dyn Registers>,
        interrupts: Option<Arc<dyn Interrupts>>,
        space: Arc<IovaSpace>,
        device: Option<VfioPciDevice>,
        link: Option<PcieLink>,
        options: ControllerOptions,
    ) -> Result<Controller, Error> {
        let (cap, version) = bringup::read_cap_vs(&mut Mmio::new(&name, &*regs))?;
        if !cap.css_nvm() {
            return Err(Error::Unsupported {
                device: name,
                what: "the NVM command set (CAP.CSS)".into(),
            });
        }
        if cap.min_page_size() > PAGE || cap.max_page_size() < PAGE {
            return Err(Error::Unsupported {
                device: name,
                what: format!(
                    "4 KiB memory pages (CAP.MPSMIN {} / MPSMAX {} bytes)",
                    cap.min_page_size(),
                    cap.max_page_size()
                ),
            });
        }
        let ready_timeout = bringup::ready_timeout(cap);
        disable(&name, &*regs, ready_timeout)?;

        // Admin queue.
        let depth = options.admin_depth.clamp(
            2,
            cap.max_queue_entries().min(Aqa::MAX_ENTRIES as u32) as u16,
        );
        // the admin queue tells the controller its CQ head after every poll (no spare entries)
        let layout = Layout::new(depth, depth - 1, 2);
        let memory = map(&name, &space, layout.bytes, &options, options.node)?;
        let data = map(&name, &space, ADMIN_DATA, &options, options.node)?;
        let admin_queue = QueuePair::new(QueueSetup {
            qid: 0,
            layout,
            memory,
            doorbells: Doorbells::new(
                &regs,
                sq_tail_doorbell(0, cap.dstrd()),
                cq_head_doorbell(0, cap.dstrd()),
                None,
            ),
            namespaces: Arc::from(Vec::new()),
            max_transfer: ADMIN_DATA as u64,
            use_sgl: false,
            timeout: None,
            generation: 0,
            owner: None,
            // polled: admin completions raise vector 0 once MSI-X is on, nobody waits for it
            interrupt: None,
        });
        // Whatever fails from here on leaves the controller disabled, not half configured.
        let mut guard = DisableOnError {
            name: &name,
            regs: &*regs,
            timeout: ready_timeout,
            armed: true,
        };
        enable(&name, &*regs, &admin_queue, ready_timeout)?;
        let mut admin = Admin::new(admin_queue, data);

        let mut path = AdminAccess {
            name: &name,
            regs: &*regs,
            admin: &mut admin,
            timeout: options.admin_timeout,
        };
        let identify = bringup::identify_controller(&mut path)?;
        let max_transfer = bringup::max_transfer(cap, &identify);
        let sgl = options.sgl
            && !matches!(
                identify.sgl_support(),
                SglSupport::Unsupported | SglSupport::Reserved
            );
        if options.sgl && !sgl {
            log::info!("{name}: no SGL support: PRP lists for transfers of more than two pages");
        }
        let namespaces = NamespaceSet::new(bringup::namespaces(&mut path, &name, identify.nn)?);

        // I/O queues: use what is granted.
        let granted = bringup::set_number_of_queues(&mut path, options.io_queues)?.pairs;

        // Shadow doorbells: page 0 holds the doorbells, page 1 the EventIdx values.
        let mut shadow = None;
        let entry_bytes = 2 * cap.doorbell_stride() * (granted as usize + 1);
        if options.shadow_doorbells
            && identify.oacs().contains(Oacs::DOORBELL_BUFFER_CONFIG)
            && entry_bytes <= PAGE as usize
        {
            let pages = map(&name, &space, 2 * PAGE as usize, &options, options.node)?;
            let sqe = Sqe::doorbell_buffer_config(pages.iova(), pages.iova_of(PAGE as usize));
            match path
                .admin
                .execute(&name, &*regs, sqe, Data::None, options.admin_timeout)
            {
                Ok(_) => shadow = Some(Arc::new(pages)),
                Err(e) => {
                    log::warn!("{name}: Doorbell Buffer Config failed, using MMIO doorbells: {e}")
                }
            }
        }
        path.admin
            .arm_async_events(&name, &*regs, options.admin_timeout);
        log::info!(
            "{name}: NVMe {version}, {} namespace(s), {granted} I/O queues, MDTS {max_transfer} bytes, shadow doorbells {}",
            namespaces.list.len(),
            if shadow.is_some() { "on" } else { "off" }
        );
        guard.armed = false;
        drop(guard);
        let shared = Shared {
            name,
            regs,
            interrupts,
            msix: Mutex::new(None),
            space,
            cap,
            version,
            identify,
            namespaces: Mutex::new(namespaces),
            max_transfer,
            granted,
            sgl,
            admin: Mutex::new(admin),
            handoff: Mutex::new(Vec::new()),
            qids: Mutex::new(vec![false; granted as usize + 1]),
            generation: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            ready_timeout,
            shadow,
            options,
            link,
            _device: device,
        };
        Ok(Controller {
            shared: Arc::new(shared),
        })
    }

    /// The BDF, or `sim:N`.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    pub fn cap(&self) -> Cap {
        self.shared.cap
    }

    pub fn version(&self) -> Vs {
        self.shared.version
    }

    pub fn identify(&self) -> &IdentifyController {
        &self.shared.identify
    }

    /// The active namespaces (as last read: see [`Controller::rescan_namespaces`]).
    pub fn namespaces(&self) -> Arc<[Namespace]> {
        self.shared.namespaces.lock().list.clone()
    }

    pub fn namespace(&self, nsid: u32) -> Result<Namespace, Error> {
        let namespaces = self.namespaces();
        let found = namespaces.iter().find(|n| n.nsid == nsid);
        found.cloned().ok_or_else(|| Error::NoNamespace {
            device: self.shared.name.clone(),
            nsid,
            active: namespaces.iter().map(|n| n.nsid).collect(),
        })
    }

    /// Reads the active namespaces again (after a Namespace Attribute Changed notice: one was
    /// attached, detached, formatted or resized, perhaps by another controller of the NVM
    /// subsystem) and says what changed. Queue pairs created from now on know the namespaces
    /// as they are now; older ones keep those they were created with (the controller refuses
    /// I/O to a namespace no longer attached, by status).
    pub fn rescan_namespaces(&self) -> Result<NamespaceChanges, Error> {
        let s = &self.shared;
        let found = self.with_admin(|a| bringup::namespaces(a, &s.name, s.identify.nn))?;
        let mut set = s.namespaces.lock();
        let changes = NamespaceChanges::between(&set.list, &found);
        *set = NamespaceSet::new(found);
        Ok(changes)
    }

    /// Largest transfer of one command in bytes (MDTS, capped by the driver).
    pub fn max_transfer(&self) -> u64 {
        self.shared.max_transfer
    }

    /// I/O queue pairs the controller granted.
    pub fn io_queues_granted(&self) -> u16 {
        self.shared.granted
    }

    pub fn shadow_doorbells(&self) -> bool {
        self.shared.shadow.is_some()
    }

    pub fn uses_sgl(&self) -> bool {
        self.shared.sgl
    }

    pub fn pcie_link(&self) -> Option<PcieLink> {
        self.shared.link
    }

    /// The IOVA space the controller's DMA memory lives in (buffers for its I/O come from here).
    pub fn iova_space(&self) -> &Arc<IovaSpace> {
        &self.shared.space
    }

    /// The page size of the controller's DMA memory (hugepages for devices, 4 KiB for `sim`):
    /// buffers for its I/O should use the same.
    pub fn page_size(&self) -> PageSize {
        self.shared.options.page
    }

    /// Creates an I/O queue pair for the calling thread.
    pub fn create_queue_pair(&self, opts: QueuePairOptions) -> Result<QueuePair, Error> {
        let s = &self.shared;
        let depth = opts
            .depth
            .clamp(2, s.cap.max_queue_entries().min(u16::MAX as u32) as u16);
        // Deletions that finished give their ids back first. The id of a deletion still under
        // way is not taken again; only when every id is taken are those waited for.
        s.progress(&mut s.admin.lock());
        let qid = match s.take_qid() {
            Some(qid) => qid,
            None => {
                s.finish_deletions();
                s.take_qid().ok_or_else(|| Error::NoQueue {
                    device: s.name.clone(),
                    granted: s.granted,
                })?
            }
        };
        let release = |s: &Shared| s.qids.lock()[qid as usize] = false;
        let interrupt = match opts.interrupts.then(|| s.interrupt_for(qid)).transpose() {
            Ok(i) => i,
            Err(e) => {
                release(s);
                return Err(e);
            }
        };
        let max_entries = s.cap.max_queue_entries().min(u16::MAX as u32) as u16;
        let layout = Layout::new(
            ring_entries(depth, max_entries),
            depth - 1,
            s.max_transfer / PAGE + 1,
        );
        let node = opts.node.or(s.options.node);
        let memory = match map(&s.name, &s.space, layout.bytes, &s.options, node) {
            Ok(m) => m,
            Err(e) => {
                release(s);
                return Err(e);
            }
        };
        // A queue id used before may have left shadow doorbell and EventIdx values behind; the
        // controller must see this queue start from zero (a reset clears all of them).
        if let Some(pages) = &s.shadow {
            let stride = s.cap.doorbell_stride();
            for entry in [2 * qid as usize * stride, (2 * qid as usize + 1) * stride] {
                for offset in [entry, PAGE as usize + entry] {
                    if pages
                        .slice(offset, 4)
                        .and_then(|p| p.write_obj(0u32, 0))
                        .is_err()
                    {
                        release(s);
                        return Err(invalid(&s.name, "shadow doorbell page"));
                    }
                }
            }
        }
        // The generation before creating: a reset racing with us makes the queue pair reconnect.
        let generation = self.generation();
        let (sq_iova, cq_iova) = (memory.iova_of(layout.sq), memory.iova_of(layout.cq));
        let vector = interrupt.as_ref().map(|i| i.vector);
        if let Err(e) = self.create_queues(qid, layout.depth, sq_iova, cq_iova, vector) {
            release(s);
            return Err(e);
        }
        let stride = s.cap.doorbell_stride();
        let shadow = s.shadow.as_ref().map(|pages| Shadow {
            pages: pages.clone(),
            sq_tail: 2 * qid as usize * stride,
            cq_head: (2 * qid as usize + 1) * stride,
            eventidx: PAGE as usize,
            always_mmio: false,
        });
        Ok(QueuePair::new(QueueSetup {
            qid,
            layout,
            memory,
            doorbells: Doorbells::new(
                &s.regs,
                sq_tail_doorbell(qid, s.cap.dstrd()),
                cq_head_doorbell(qid, s.cap.dstrd()),
                shadow,
            ),
            namespaces: s.namespaces.lock().geometry.clone(),
            max_transfer: s.max_transfer,
            use_sgl: s.sgl,
            timeout: opts.timeout,
            generation,
            owner: Some(Arc::new(self.clone())),
            interrupt,
        }))
    }

    /// Creates I/O completion queue `qid` (raising MSI-X `vector`, if one is given) and its
    /// submission queue on the controller.
    pub(crate) fn create_queues(
        &self,
        qid: u16,
        depth: u16,
        sq_iova: u64,
        cq_iova: u64,
        vector: Option<u16>,
    ) -> Result<(), Error> {
        self.admin(Sqe::create_io_cq_with(qid, depth as u32, cq_iova, vector))?;
        let sq = Sqe::create_io_sq(qid, depth as u32, sq_iova, qid, QueuePriority::Urgent);
        if let Err(e) = self.admin(sq) {
            let _ = self.admin(Sqe::delete_io_cq(qid));
            return Err(e);
        }
        Ok(())
    }

    /// Sees the I/O queue deletions under way through (at most the admin timeout): what a
    /// thread that dropped its queue pairs does when its run is over, so that none is left
    /// for the next admin user (a deletion parked while another thread held the admin queue).
    pub fn finish_deletions(&self) {
        self.shared.finish_deletions();
    }

    /// A queue pair is done with `qid`: its queues are deleted as `release` says, without
    /// waiting (see `Deletion`); the id is free again once they are gone.
    pub(crate) fn release_queue(&self, qid: u16, release: Release) {
        let s = &self.shared;
        if !release.delete_sq && !release.delete_cq {
            if let Some(t) = release.after {
                self.forget_admin(t);
            }
            s.free_qid(qid);
            return;
        }
        let d = Deletion {
            qid,
            after: release.after,
            sq: release.delete_sq,
            cq: release.delete_cq,
            sent: None,
            stuck: false,
        };
        match s.admin.try_lock() {
            Some(mut admin) => {
                admin.deletions.push(d);
                s.progress(&mut admin);
            }
            None => s.handoff.lock().push(d),
        }
    }

    /// Submits an admin command without waiting for it: the reactor's way (re-creating queues,
    /// aborting). `Ok(None)` when another thread holds the admin queue right now, it is full, or
    /// the controller has left `generation` (a reset voids what was submitted before it): try
    /// again later. The outcome comes from [`Controller::admin_result`].
    pub(crate) fn submit_admin(&self, sqe: Sqe, generation: u64) -> Result<Option<Ticket>, Error> {
        let s = &self.shared;
        let Some(mut admin) = s.admin.try_lock() else {
            return Ok(None);
        };
        // A reset ends only under this lock: checked here, the command is voided by the reset
        // the caller will notice, or the controller is still at `generation`.
        if self.generation() != generation {
            return Ok(None);
        }
        admin.submit(&s.name, sqe)
    }

    /// The outcome of the command of `ticket`, once known: CQE dword 0, or why it failed (a
    /// ticket voided by a reset fails with "Command Aborted By Host"). Polls the admin queue once
    /// unless another thread holds it (that thread files the completion then). Never waits.
    pub(crate) fn admin_result(&self, ticket: Ticket) -> Option<Result<u32, Error>> {
        let s = &self.shared;
        let mut admin = s.admin.try_lock()?;
        s.progress(&mut admin);
        let command = admin
            .waiting
            .iter()
            .find(|w| w.ticket == ticket)
            .map_or("admin command", |w| w.command);
        let failed = |status| Error::Command {
            device: s.name.clone(),
            command,
            status,
        };
        match admin.take(ticket) {
            Ok(None) => None,
            Ok(Some(Outcome::Done { status, dw0 })) if status.is_success() => Some(Ok(dw0)),
            Ok(Some(Outcome::Done { status, .. })) => Some(Err(failed(status))),
            Ok(Some(Outcome::TimedOut)) => Some(Err(Error::Timeout {
                device: s.name.clone(),
                what: command.into(),
                after: s.options.admin_timeout,
            })),
            Err(()) => Some(Err(failed(Status::ABORTED_BY_HOST))),
        }
    }

    /// Nobody will ask for the outcome of `ticket`. (If the admin lock is busy, `expire` drops
    /// it later.)
    pub(crate) fn forget_admin(&self, ticket: Ticket) {
        if let Some(mut admin) = self.shared.admin.try_lock() {
            admin.forget(ticket);
        }
    }

    /// Even while the controller is ready, odd while a reset is under way; it changes with
    /// every reset. Queue pairs compare it once per poll.
    pub fn generation(&self) -> u64 {
        self.shared.generation.load(Ordering::Acquire)
    }

    /// Resets completed since bring-up (each turns the generation odd, then even).
    pub fn resets(&self) -> u64 {
        self.generation() / 2
    }

    /// Whether the last reset failed (the controller is unusable).
    pub fn failed(&self) -> bool {
        self.shared.failed.load(Ordering::Acquire)
    }

    /// Marks a reset as under way (the generation turns odd) unless one already is; returns
    /// whether this call did. From then on queue pairs ring no doorbells and wait.
    fn begin_reset(&self) -> bool {
        self.shared
            .generation
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |g| {
                (g % 2 == 0).then_some(g + 1)
            })
            .is_ok()
    }

    /// Starts a reset and returns at once (a reactor that found a stuck command must not wait
    /// seconds for CAP.TO): the reset runs on a thread of its own; the queue pairs of every
    /// reactor stop using their queues now and re-create them on their first poll after it.
    pub fn start_reset(&self) {
        if !self.begin_reset() {
            return; // one is under way already
        }
        let ctrl = self.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("reset {}", self.shared.name))
            .spawn(move || {
                if let Err(e) = ctrl.run_reset() {
                    log::error!("{}: reset failed: {e}", ctrl.name());
                }
            });
        if let Err(e) = spawned {
            log::error!(
                "{}: no thread for the reset ({e}): resetting here",
                self.shared.name
            );
            if let Err(e) = self.run_reset() {
                log::error!("{}: reset failed: {e}", self.shared.name);
            }
        }
    }

    /// Resets the controller and waits for it (after a fatal status, a command that an abort
    /// did not end, or on request): disable, bring the admin queue up again, renegotiate queues
    /// and shadow doorbells. Every queue pair then fails its commands in flight with "Command
    /// Aborted By Host" and re-creates its queues on its next poll.
    pub fn reset(&self) -> Result<(), Error> {
        self.begin_reset();
        self.run_reset()
    }

    /// The reset itself, under the admin lock; the generation is odd throughout and even after,
    /// also when it fails (then `failed` is set and the queue pairs give up).
    fn run_reset(&self) -> Result<(), Error> {
        let s = &self.shared;
        let mut admin = s.admin.lock();
        // (a reset asked for after the previous one ended: odd again)
        self.begin_reset();
        // Every queue and command goes with the reset: tickets are void, deletions are done.
        admin.waiting.clear();
        let handed = std::mem::take(&mut *s.handoff.lock());
        for d in admin.deletions.drain(..).chain(handed) {
            s.free_qid(d.qid);
        }
        let result = self.reset_steps(&mut admin);
        s.failed.store(result.is_err(), Ordering::Release);
        s.generation.fetch_add(1, Ordering::AcqRel);
        // Owners asleep until an interrupt learn of the reset on their next poll: wake them.
        s.raise_interrupts();
        result
    }

    fn reset_steps(&self, admin: &mut Admin) -> Result<(), Error> {
        let s = &self.shared;
        log::warn!("{}: resetting the controller", s.name);
        let regs = &*s.regs;
        disable(&s.name, regs, s.ready_timeout)?;
        admin.queue.fail_all(Status::ABORTED_BY_HOST, &mut |_| {});
        admin.queue.reset_rings();
        enable(&s.name, regs, &admin.queue, s.ready_timeout)?;
        let mut path = AdminAccess {
            name: &s.name,
            regs,
            admin: &mut *admin,
            timeout: s.options.admin_timeout,
        };
        let granted = bringup::set_number_of_queues(&mut path, s.options.io_queues)?;
        let pairs = granted.submission.min(granted.completion);
        if pairs < s.granted as u32 {
            log::warn!(
                "{}: after the reset only {pairs} I/O queues are granted",
                s.name
            );
        }
        if let Some(pages) = &s.shadow {
            let zeroes = vec![0u8; pages.len()];
            pages
                .slice(0, zeroes.len())
                .and_then(|p| p.write_slice(&zeroes, 0))
                .map_err(|_| invalid(&s.name, "shadow doorbells"))?;
            let sqe = Sqe::doorbell_buffer_config(pages.iova(), pages.iova_of(PAGE as usize));
            admin.execute(&s.name, regs, sqe, Data::None, s.options.admin_timeout)?;
        }
        admin.arm_async_events(&s.name, regs, s.options.admin_timeout);
        Ok(())
    }

    /// Runs one admin command without data; returns CQE dword 0.
    pub fn admin(&self, sqe: Sqe) -> Result<u32, Error> {
        self.admin_waiting(sqe, self.shared.options.admin_timeout)
    }

    /// Runs one admin command without data that may take up to `timeout` (Format NVM, a
    /// sanitize); returns CQE dword 0.
    pub fn admin_waiting(&self, sqe: Sqe, timeout: Duration) -> Result<u32, Error> {
        let s = &self.shared;
        let mut admin = s.admin.lock();
        let result = admin.execute(&s.name, &*s.regs, sqe, Data::None, timeout);
        s.progress(&mut admin);
        result
    }

    /// Runs one admin command that sends `data` (at most 16 KiB) to the controller; returns
    /// CQE dword 0.
    pub fn admin_write(&self, sqe: Sqe, data: &[u8]) -> Result<u32, Error> {
        let s = &self.shared;
        let mut admin = s.admin.lock();
        let result = admin.execute(
            &s.name,
            &*s.regs,
            sqe,
            Data::ToController(data),
            s.options.admin_timeout,
        );
        s.progress(&mut admin);
        result
    }

    /// Runs one admin command that reads `len` bytes (at most 16 KiB) from the controller.
    pub fn admin_read(&self, sqe: Sqe, len: usize) -> Result<(u32, Vec<u8>), Error> {
        let s = &self.shared;
        let mut buf = vec![0u8; len];
        let mut admin = s.admin.lock();
        let result = admin.execute(
            &s.name,
            &*s.regs,
            sqe,
            Data::FromController(&mut buf),
            s.options.admin_timeout,
        );
        s.progress(&mut admin);
        Ok((result?, buf))
    }

    /// Runs `job` on the admin queue (as the shared controller logic sees it), then moves the
    /// queue deletions on.
    fn with_admin<T>(
        &self,
        job: impl FnOnce(&mut AdminAccess<'_>) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let s = &self.shared;
        let mut admin = s.admin.lock();
        let result = job(&mut AdminAccess {
            name: &s.name,
            regs: &*s.regs,
            admin: &mut admin,
            timeout: s.options.admin_timeout,
        });
        s.progress(&mut admin);
        result
    }

    /// The asynchronous events the controller reported since the last call (each also logged
    /// as it came); the log page of each is read, which clears it (the controller then reports
    /// the next of its kind).
    pub fn events(&self) -> Vec<AsyncEvent> {
        let events = {
            let s = &self.shared;
            let mut admin = s.admin.lock();
            s.progress(&mut admin);
            if admin.events.len() >= KEPT_EVENTS && admin.async_event.is_none() {
                let aer = Sqe::async_event_request();
                admin.async_event = admin.submit(&s.name, aer).ok().flatten();
            }
            std::mem::take(&mut admin.events)
        };
        for e in &events {
            let read = Sqe::get_log_page_raw(e.log_page, u32::MAX, 512, 0);
            if let Err(err) = self.admin_read(read, 512) {
                log::debug!(
                    "{}: log page {:#04x} of {e}: {err}",
                    self.name(),
                    e.log_page
                );
            }
        }
        events
    }

    /// A log page of `len` bytes (namespace 0xffffffff for controller-wide ones).
    pub fn log_page(&self, lid: LogPageId, nsid: u32, len: usize) -> Result<Vec<u8>, Error> {
        self.with_admin(|a| bringup::log_page(a, "Get Log Page", lid, nsid, len))
    }

    /// SMART / Health Information, controller wide.
    pub fn smart_log(&self) -> Result<SmartLog, Error> {
        self.with_admin(|a| bringup::smart_log(a))
    }

    /// The newest `count` Error Information entries (fewer if the controller keeps fewer).
    pub fn error_log(&self, count: usize) -> Result<Vec<ErrorLogEntry>, Error> {
        let elpe = self.shared.identify.elpe;
        self.with_admin(|a| bringup::error_log(a, elpe, count))
    }

    pub fn firmware_log(&self) -> Result<FirmwareSlotLog, Error> {
        self.with_admin(|a| bringup::firmware_log(a))
    }

    /// Keep Alive (a PCIe controller needs none; for a controller that sets KAS anyway).
    pub fn keep_alive(&self) -> Result<(), Error> {
        self.with_admin(|a| bringup::keep_alive(a))
    }

    /// Asks the controller to abort command `cid` on submission queue `sqid`. Returns whether it
    /// was aborted (CQE dword 0 bit 0 clear).
    pub fn abort(&self, sqid: u16, cid: u16) -> Result<bool, Error> {
        Ok(self.admin(Sqe::abort(sqid, cid))? & 1 == 0)
    }

    /// CSTS now (all ones when the device is gone).
    pub fn status(&self) -> Csts {
        Csts(self.shared.regs.read32(reg::CSTS))
    }

    /// Whether the device is gone (surprise removal, or handed back to the kernel): its
    /// registers read all ones.
    pub fn is_removed(&self) -> bool {
        self.status().removed()
    }
}

/// The controller as its I/O queue pairs see it (each holds one, for its cold paths).
impl QueueOwner for Controller {
    fn name(&self) -> &str {
        Controller::name(self)
    }
    fn generation(&self) -> u64 {
        Controller::generation(self)
    }
    fn failed(&self) -> bool {
        Controller::failed(self)
    }
    fn status(&self) -> Csts {
        Controller::status(self)
    }
    fn start_reset(&self) {
        Controller::start_reset(self)
    }
    fn submit_admin(&self, sqe: Sqe, generation: u64) -> Result<Option<Ticket>, Error> {
        Controller::submit_admin(self, sqe, generation)
    }
    fn admin_result(&self, ticket: Ticket) -> Option<Result<u32, Error>> {
        Controller::admin_result(self, ticket)
    }
    fn forget_admin(&self, ticket: Ticket) {
        Controller::forget_admin(self, ticket)
    }
    fn release_queue(&self, qid: u16, release: Release) {
        Controller::release_queue(self, qid, release)
    }
}

/// Disables a controller whose bring-up failed after it was enabled.
struct DisableOnError<'a> {
    name: &'a str,
    regs: &'a dyn Registers,
    timeout: Duration,
    armed: bool,
}

impl Drop for DisableOnError<'_> {
    fn drop(&mut self) {
        if self.armed {
            if let Err(e) = disable(self.name, self.regs, self.timeout) {
                log::warn!("{}: disabling after a failed bring-up: {e}", self.name);
            }
        }
    }
}

impl Admin {
    fn new(queue: QueuePair, data: DmaRegion) -> Admin {
        let depth = queue.depth() as usize;
        Admin {
            queue,
            data,
            next_token: 0,
            waiting: Vec::with_capacity(depth),
            deletions: Vec::new(),
            async_event: None,
            events: Vec::new(),
        }
    }

    /// Queues `sqe` (no data) and rings the doorbell; its outcome will be filed under the ticket
    /// returned. `Ok(None)`: the admin queue is full, try again later.
    fn submit(&mut self, name: &str, sqe: Sqe) -> Result<Option<Ticket>, Error> {
        let ticket = self.next_token;
        match self.queue.submit(sqe, ticket) {
            Ok(()) => {}
            Err(SubmitError::QueueFull { .. }) => return Ok(None),
            Err(e) => {
                return Err(Error::Invalid {
                    device: name.into(),
                    what: format!("{}: {e}", command_name(&sqe)),
                })
            }
        }
        self.next_token += 1;
        self.waiting.push(Waiting {
            ticket,
            untimed: sqe.opcode() == AdminOpcode::AsyncEventRequest as u8,
            command: command_name(&sqe),
            submitted: Instant::now(),
            outcome: None,
        });
        self.queue.flush();
        Ok(Some(ticket))
    }

    /// Enables the events usnvme reports (Asynchronous Event Configuration: SMART critical
    /// warnings, namespace attribute notices) and sends the first Asynchronous Event Request.
    fn arm_async_events(&mut self, name: &str, regs: &dyn Registers, timeout: Duration) {
        let config = Sqe::set_features(FeatureId::AsyncEventConfiguration, 0x1ff);
        if let Err(e) = self.execute(name, regs, config, Data::None, timeout) {
            log::info!("{name}: Asynchronous Event Configuration refused ({e}): the controller's default events only");
        }
        let aer = Sqe::async_event_request();
        self.async_event = self.submit(name, aer).ok().flatten();
    }

    /// Keeps an Asynchronous Event Request outstanding: files the event the last one brought
    /// and sends the next (its log page is read by [`Controller::events`], which clears it).
    /// One that failed is not sent again (the controller takes none, or is going away); a
    /// reset voids it.
    fn keep_async_event(&mut self, name: &str) {
        let outcome = match self.async_event {
            None => return,
            Some(t) => self.take(t),
        };
        match outcome {
            Ok(None) => return, // nothing happened yet
            Ok(Some(Outcome::Done { status, dw0 })) if status.is_success() => {
                let event = AsyncEvent::from_dw0(dw0);
                log::warn!("{name}: asynchronous event: {event}");
                self.events.push(event);
                if self.events.len() >= KEPT_EVENTS {
                    // a storm: no request until someone takes these (`Controller::events`)
                    self.async_event = None;
                    return;
                }
            }
            other => {
                log::debug!("{name}: Asynchronous Event Request ended: {other:?}");
                self.async_event = None;
                return;
            }
        }
        self.async_event = self.submit(name, Sqe::async_event_request()).ok().flatten();
    }

    /// Polls the admin queue once, filing the completions of the commands waited for; returns
    /// how many completed. Others (a late one whose `execute` gave up) are dropped.
    fn poll_once(&mut self) -> usize {
        let waiting = &mut self.waiting;
        self.queue.poll(|c| {
            if let Some(w) = waiting.iter_mut().find(|w| w.ticket == c.token) {
                w.outcome = Some(Outcome::Done {
                    status: c.status,
                    dw0: c.dw0,
                });
            }
        })
    }

    /// The outcome of `ticket` if it is known, and forgets it then. `Err(())`: no such ticket (a
    /// reset voided it, or it was forgotten).
    fn take(&mut self, ticket: Ticket) -> Result<Option<Outcome>, ()> {
        let i = self
            .waiting
            .iter()
            .position(|w| w.ticket == ticket)
            .ok_or(())?;
        if self.waiting[i].outcome.is_none() {
            return Ok(None);
        }
        Ok(self.waiting.swap_remove(i).outcome)
    }

    fn forget(&mut self, ticket: Ticket) {
        self.waiting.retain(|w| w.ticket != ticket);
    }

    /// Commands older than `timeout` become timed out; outcomes nobody came for in four
    /// timeouts are dropped (their queue pair went away while the lock was busy).
    fn expire(&mut self, timeout: Duration) {
        if self.waiting.is_empty() {
            return;
        }
        let now = Instant::now();
        self.waiting.retain_mut(|w| {
            let age = now.saturating_duration_since(w.submitted);
            if w.untimed {
                return true;
            }
            if w.outcome.is_none() && age > timeout {
                w.outcome = Some(Outcome::TimedOut);
            }
            age <= timeout.saturating_mul(4)
        });
    }

    /// Moves deletion `d` on as far as it goes without waiting; true when it is done.
    fn advance(&mut self, name: &str, d: &mut Deletion) -> bool {
        loop {
            if d.stuck {
                return false;
            }
            if let Some(t) = d.after {
                match self.take(t) {
                    Ok(None) => return false,
                    _ => d.after = None,
                }
            }
            if let Some(t) = d.sent {
                match self.take(t) {
                    Ok(None) => return false,
                    Ok(Some(Outcome::TimedOut)) => {
                        log::error!(
                            "{name}: deleting I/O queue {}: no completion: its id stays taken until a reset",
                            d.qid
                        );
                        d.stuck = true;
                        return false;
                    }
                    // Invalid Queue Identifier: the creation it followed had failed
                    Ok(Some(Outcome::Done { status, .. }))
                        if !status.is_success() && status.code() != Status::INVALID_QID =>
                    {
                        log::warn!("{name}: deleting I/O queue {}: {status}", d.qid)
                    }
                    _ => {}
                }
                d.sent = None;
            }
            let sqe = match (d.sq, d.cq) {
                (true, _) => Sqe::delete_io_sq(d.qid),
                (false, true) => Sqe::delete_io_cq(d.qid),
                (false, false) => return true,
            };
            match self.submit(name, sqe) {
                Ok(Some(t)) => {
                    d.sent = Some(t);
                    if d.sq {
                        d.sq = false;
                    } else {
                        d.cq = false;
                    }
                }
                Ok(None) => return false,
                Err(e) => {
                    // the admin queue is unusable: the controller is gone or failed
                    log::warn!("{name}: deleting I/O queue {}: {e}", d.qid);
                    return true;
                }
            }
        }
    }

    /// Submits `sqe` and polls for its completion. `data`: a buffer and whether it goes to the
    /// controller; it travels through the admin data region.
    fn execute(
        &mut self,
        name: &str,
        regs: &dyn Registers,
        sqe: Sqe,
        data: Data<'_>,
        timeout: Duration,
    ) -> Result<u32, Error> {
        let command = command_name(&sqe);
        let ticket = self.next_token;
        self.next_token += 1;
        let len = match &data {
            Data::None => None,
            Data::FromController(buf) => Some(buf.len()),
            Data::ToController(buf) => {
                self.data
                    .slice(0, buf.len())
                    .and_then(|s| s.write_slice(buf, 0))
                    .map_err(|_| invalid(name, "admin data"))?;
                Some(buf.len())
            }
        };
        let submitted = match len {
            Some(len) => {
                let buffer = IoBuffer {
                    iova: self.data.iova(),
                    len: len as u32,
                };
                self.queue.submit_data(sqe, buffer, ticket)
            }
            None => self.queue.submit(sqe, ticket),
        };
        submitted.map_err(|e| Error::Invalid {
            device: name.into(),
            what: format!("{command}: {e}"),
        })?;
        let started = Instant::now();
        self.waiting.push(Waiting {
            ticket,
            untimed: false,
            command,
            submitted: started,
            outcome: None,
        });
        let result = self.wait(name, regs, ticket, command, started, timeout);
        let (status, dw0) = match result {
            Ok(done) => done,
            Err(e) => {
                self.forget(ticket);
                return Err(e);
            }
        };
        if !status.is_success() {
            return Err(Error::Command {
                device: name.into(),
                command,
                status,
            });
        }
        if let Data::FromController(buf) = data {
            let slice = self
                .data
                .slice(0, buf.len())
                .map_err(|_| invalid(name, "admin data"))?;
            slice
                .read_slice(buf, 0)
                .map_err(|_| invalid(name, "admin data"))?;
        }
        Ok(dw0)
    }

    /// Polls until `ticket` completes (filing other tickets' completions on the way).
    fn wait(
        &mut self,
        name: &str,
        regs: &dyn Registers,
        ticket: Ticket,
        command: &'static str,
        started: Instant,
        timeout: Duration,
    ) -> Result<(Status, u32), Error> {
        let mut spins = 0u32;
        loop {
            self.poll_once();
            if let Ok(Some(Outcome::Done { status, dw0 })) = self.take(ticket) {
                return Ok((status, dw0));
            }
            spins += 1;
            if spins.is_multiple_of(64) {
                let csts = Csts(regs.read32(reg::CSTS));
                if csts.removed() {
                    self.queue.make_unusable();
                    return Err(Error::Gone {
                        device: name.into(),
                    });
                }
                if csts.cfs() {
                    return Err(Error::Fatal {
                        device: name.into(),
                        during: command.into(),
                    });
                }
                if !csts.rdy() {
                    return Err(Error::NotReady {
                        device: name.into(),
                        during: command.into(),
                    });
                }
                if started.elapsed() > timeout {
                    return Err(Error::Timeout {
                        device: name.into(),
                        what: command.into(),
                        after: timeout,
                    });
                }
                std::thread::sleep(Duration::from_micros(50));
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

fn command_name(sqe: &Sqe) -> &'static str {
    bringup::opcode_name(sqe)
}

fn invalid(name: &str, what: &str) -> Error {
    Error::Invalid {
        device: name.into(),
        what: format!("short or malformed {what}"),
    }
}

fn map(
    name: &str,
    space: &Arc<IovaSpace>,
    len: usize,
    options: &ControllerOptions,
    node: Option<u32>,
) -> Result<DmaRegion, Error> {
    let memory = Memory::allocate(len, options.page, node).map_err(|source| Error::Memory {
        device: name.into(),
        source,
    })?;
    space.map(memory).map_err(|source| Error::Map {
        device: name.into(),
        source,
    })
}

/// Programs the admin queue (AQA, ASQ, ACQ), then enables the controller as every transport
/// does ([`bringup::enable`]: the host's configuration, CC.EN, CSTS.RDY within CAP.TO).
fn enable(
    name: &str,
    regs: &dyn Registers,
    admin: &QueuePair,
    timeout: Duration,
) -> Result<(), Error> {
    regs.write32(reg::AQA, Aqa::new(admin.depth(), admin.depth()).0);
    regs.write64(reg::ASQ, admin.sq_iova());
    regs.write64(reg::ACQ, admin.cq_iova());
    bringup::enable(
        &mut Mmio::new(name, regs),
        bringup::host_configuration(),
        timeout,
    )
    .map(|_| ())
}

/// CC.EN = 0 and wait for CSTS.RDY = 0 ([`bringup::disable`]).
fn disable(name: &str, regs: &dyn Registers, timeout: Duration) -> Result<(), Error> {
    bringup::disable(&mut Mmio::new(name, regs), timeout)
}

/// The shared controller logic's faults, as the driver's errors.
fn pcie_fault(name: &str, fault: Fault) -> Error {
    let device = name.to_owned();
    match fault {
        Fault::Gone => Error::Gone { device },
        Fault::Fatal { during } => Error::Fatal {
            device,
            during: during.into(),
        },
        Fault::ReadyTimeout { during, after, .. } => Error::Timeout {
            device,
            what: format!("controller {during} (CSTS.RDY)"),
            after,
        },
        Fault::ShutdownTimeout { after } => Error::Timeout {
            device,
            what: "shutdown (CSTS.SHST)".into(),
            after,
        },
        Fault::Status { opcode, status, .. } => Error::Command {
            device,
            command: opcode,
            status,
        },
        Fault::Malformed { data, .. } => invalid(name, data),
    }
}

/// The controller's registers over MMIO, for the shared logic: they cannot fail, but a device
/// that is gone reads all ones (the logic checks CAP and CSTS for it).
struct Mmio<'a> {
    name: &'a str,
    regs: &'a dyn Registers,
}

impl<'a> Mmio<'a> {
    fn new(name: &'a str, regs: &'a dyn Registers) -> Mmio<'a> {
        Mmio { name, regs }
    }
}

impl Faults for Mmio<'_> {
    type Error = Error;
    fn fault(&self, fault: Fault) -> Error {
        pcie_fault(self.name, fault)
    }
}

impl RegisterAccess for Mmio<'_> {
    fn read(&mut self, reg: Reg, _during: &'static str) -> Result<u64, Error> {
        Ok(match reg.eight_bytes() {
            true => self.regs.read64(reg.offset()),
            false => u64::from(self.regs.read32(reg.offset())),
        })
    }

    fn write(&mut self, reg: Reg, value: u64, _during: &'static str) -> Result<(), Error> {
        match reg.eight_bytes() {
            true => self.regs.write64(reg.offset(), value),
            false => self.regs.write32(reg.offset(), value as u32),
        }
        Ok(())
    }

    fn poll_interval(&self) -> Duration {
        Duration::from_micros(200)
    }
}

/// The admin queue in DMA memory, polled, for the shared logic (the lock held).
struct AdminAccess<'a> {
    name: &'a str,
    regs: &'a dyn Registers,
    admin: &'a mut Admin,
    timeout: Duration,
}

impl Faults for AdminAccess<'_> {
    type Error = Error;
    fn fault(&self, fault: Fault) -> Error {
        pcie_fault(self.name, fault)
    }
}

impl AdminPath for AdminAccess<'_> {
    fn admin(&mut self, command: AdminCommand<'_>) -> Result<u32, Failed<Error>> {
        self.admin
            .execute(
                self.name,
                self.regs,
                command.sqe,
                command.data,
                self.timeout,
            )
            .map_err(|e| match e {
                Error::Command { status, .. } => Failed::Status(status),
                e => Failed::Transport(e),
            })
    }
}

impl Shared {
    /// The lowest free I/O queue id, marked taken.
    fn take_qid(&self) -> Option<u16> {
        let mut qids = self.qids.lock();
        let qid = qids.iter().skip(1).position(|used| !used)? + 1;
        qids[qid] = true;
        Some(qid as u16)
    }

    /// The interrupt of I/O queue `qid`: its MSI-X vector and that vector's eventfd. MSI-X is
    /// enabled on the first call, with every vector the queue pairs can use at once (VFIO
    /// re-programs all of them whenever it is enabled). Vector 0 is the admin queue's, which
    /// stays polled; I/O queue `qid` takes vector `qid` while there are enough, else queues
    /// share the I/O vectors round robin (as controllers with fewer vectors than queues are
    /// used). Owners of queues on one vector each wake on its interrupt: they watch it
    /// edge-triggered and never read it (reading it empty would eat the others' wake-ups).
    fn interrupt_for(&self, qid: u16) -> Result<Interrupt, Error> {
        let unavailable = |what: String| Error::Unsupported {
            device: self.name.clone(),
            what,
        };
        let mut msix = self.msix.lock();
        if msix.is_none() {
            let Some(device) = &self.interrupts else {
                return Err(unavailable("interrupts (no MSI-X here)".into()));
            };
            // no more than the queue pairs there can be: one per granted queue, and one per
            // CPU this process may use (a thread per CPU holds one): the system's vectors are
            // few (24 drives of 65 vectors each exhaust a 2-CPU machine's)
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            let threads = u16::try_from(cpus).unwrap_or(u16::MAX);
            let count = device
                .vectors()
                .min(self.granted.min(threads).saturating_add(1));
            if count < 2 {
                return Err(unavailable(format!(
                    "interrupts for I/O queues ({count} MSI-X vectors)"
                )));
            }
            let fds = device.enable(count).map_err(|e| {
                unavailable(format!("MSI-X interrupts (enabling {count} vectors: {e})"))
            })?;
            *msix = Some(fds);
        }
        let fds = msix.as_deref().unwrap_or_default();
        let io_vectors = fds.len().saturating_sub(1);
        if qid == 0 || io_vectors == 0 {
            return Err(unavailable(format!("an interrupt for queue {qid}")));
        }
        let vector = 1 + (usize::from(qid) - 1) % io_vectors;
        Ok(Interrupt {
            vector: vector as u16,
            fd: fds[vector].clone(),
        })
    }

    /// Raises every I/O queue's vector, as if completions had come (MSI-X survives a controller
    /// reset; the queue pairs on them poll, fail what they held and re-create their queues).
    fn raise_interrupts(&self) {
        if let Some(fds) = &*self.msix.lock() {
            for fd in fds.iter().skip(1) {
                // only fails when the counter would overflow: it is raised then
                let _ = fd.write(1);
            }
        }
    }

    fn free_qid(&self, qid: u16) {
        if let Some(used) = self.qids.lock().get_mut(qid as usize) {
            *used = false;
        }
    }

    /// Polls the admin queue and moves the deletions on until nothing moves. Never waits.
    fn progress(&self, admin: &mut Admin) {
        admin.deletions.append(&mut self.handoff.lock());
        let mut deletions = std::mem::take(&mut admin.deletions);
        loop {
            let completed = admin.poll_once();
            admin.expire(self.options.admin_timeout);
            admin.keep_async_event(&self.name);
            let before = (admin.next_token, deletions.len());
            deletions.retain_mut(|d| {
                let done = admin.advance(&self.name, d);
                if done {
                    self.free_qid(d.qid);
                }
                !done
            });
            if completed == 0 && (admin.next_token, deletions.len()) == before {
                break;
            }
        }
        admin.deletions = deletions;
    }

    /// Waits for the deletions under way (at most the admin timeout, and not for a controller
    /// that failed or is gone): before a queue id is chosen, and before shutdown.
    fn finish_deletions(&self) {
        let mut admin = self.admin.lock();
        let started = Instant::now();
        loop {
            self.progress(&mut admin);
            if admin.deletions.iter().all(|d| d.stuck) {
                return;
            }
            let csts = Csts(self.regs.read32(reg::CSTS));
            if csts.removed() || csts.cfs() || started.elapsed() > self.options.admin_timeout {
                log::warn!("{}: I/O queue deletions left unfinished", self.name);
                return;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

impl Drop for Shared {
    /// Normal shutdown (CC.SHN, wait for SHST complete), then disable. DMA memory is unmapped
    /// when the regions drop, after the controller has stopped using it.
    fn drop(&mut self) {
        let regs = &*self.regs;
        let csts = Csts(regs.read32(reg::CSTS));
        if csts.removed() {
            log::warn!("{}: device gone; nothing to shut down", self.name);
            return;
        }
        let cc = Cc(regs.read32(reg::CC));
        if cc.en() && !csts.cfs() {
            // the queues of queue pairs dropped lately, before the controller shuts down
            self.finish_deletions();
            let limit = Duration::from_millis(self.cap.to_ms().clamp(1000, 10_000));
            if let Err(e) = bringup::shutdown(&mut Mmio::new(&self.name, regs), cc, limit) {
                log::warn!("{e}");
            }
        }
        if let Err(e) = disable(&self.name, regs, bringup::ready_timeout(self.cap)) {
            log::warn!("{}: disabling after shutdown: {e}", self.name);
        }
    }
}

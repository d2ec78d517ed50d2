//! A controller: bring-up as the spec says, the admin queue, identify, features, log pages,
//! I/O queue pair creation, and shutdown on drop. Here: the type, its options and accessors,
//! bring-up and shutdown; the admin queue, commands, queue pairs and reset in the submodules.

mod admin;
mod commands;
mod queues;
mod registers;
mod reset;

pub use crate::namespaces::{Namespace, NamespaceChanges};
pub use admin::AsyncEvent;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::eventfd::EventFd;
use parking_lot::Mutex;
use usnvme_hugepages::{DmaRegion, IovaSpace, Memory, PageSize};

use crate::bringup::{self, Data};
use crate::error::Error;
use crate::namespaces::NamespaceSet;
use crate::pci::PciAddress;
use crate::prp::PAGE;
use crate::queue::{Doorbells, Layout, QueueOwner, QueuePair, QueueSetup, Release, Ticket};
use crate::regs::{Interrupts, Registers};
use crate::spec::identify::{Oacs, SglSupport};
use crate::spec::registers::{cq_head_doorbell, reg, sq_tail_doorbell};
use crate::spec::{Aqa, Cap, Cc, Csts, IdentifyController, Sqe, Vs};
use crate::vfio::{PcieLink, Vfio, VfioPciDevice};

use admin::Admin;
use queues::Deletion;
use registers::{disable, enable, AdminAccess, Mmio};

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
    /// The CQ raises an MSI-X interrupt when the controller posts to it (IEN), so that its
    /// owner can sleep until one comes ([`QueuePair::interrupt`]). MSI-X is enabled with the
    /// first such queue pair; without one the controller's interrupts stay off. Where the
    /// device has fewer I/O vectors than queues, queue pairs share them (round robin).
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
            created: true,
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

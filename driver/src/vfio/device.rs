//! An open PCI function: opening it (owner lock, group, BAR0, bus mastering), and letting it
//! go: closed when dropped, or given back to the kernel when it asks (hot removal, unbind).

use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::eventfd::EventFd;
use parking_lot::Mutex;

use crate::lock::OwnerLock;
use crate::mmio::Bar;
use crate::pci::{attr, link_name, parse_hex, PciAddress};
use crate::regs::{Interrupts, Registers};
use crate::spec::registers::reg;
use crate::spec::{Cap, Cc, Csts};

use super::group::{open_device, region_info, Group};
use super::irq::request_eventfd;
use super::live::{register_live, unregister_live};
use super::{
    Vfio, VfioError, BAR0_REGION, CMD_BUS_MASTER, CMD_INTX_DISABLE, CMD_MEMORY_SPACE,
    CONFIG_REGION, PCI_COMMAND,
};

impl Vfio {
    /// Opens a PCI function bound to vfio-pci: memory space and bus mastering on, INTx off,
    /// BAR0 mapped.
    pub fn open(self: &Arc<Self>, addr: PciAddress) -> Result<VfioPciDevice, VfioError> {
        let dev_path = self.sysfs.join("bus/pci/devices").join(addr.to_string());
        if !dev_path.exists() {
            return Err(VfioError::NoDevice { addr });
        }
        let class = attr(&dev_path, "class")
            .as_deref()
            .and_then(parse_hex)
            .unwrap_or(0);
        if class >> 8 != 0x0108 {
            return Err(VfioError::NotNvme { addr, class });
        }
        let driver = link_name(&dev_path.join("driver")).unwrap_or_else(|| "no driver".into());
        if driver != "vfio-pci" {
            return Err(VfioError::NotVfio { addr, driver });
        }
        let Some(group_id) = link_name(&dev_path.join("iommu_group")) else {
            return Err(VfioError::NoIommuGroup { addr });
        };
        // One owner per drive: before the device is touched.
        let lock = OwnerLock::acquire(addr)?;
        let group = self.attach_group(addr, &group_id)?;
        let failed = |what: &str| {
            let what = what.to_string();
            move |source| VfioError::Device { addr, what, source }
        };
        let device = open_device(&group, addr).map_err(failed("VFIO_GROUP_GET_DEVICE_FD"))?;
        let (bar0_offset, size) =
            region_info(&device, BAR0_REGION).map_err(failed("BAR0 region info"))?;
        let (config, _) =
            region_info(&device, CONFIG_REGION).map_err(failed("config region info"))?;
        if size < 0x2000 {
            return Err(VfioError::SmallBar { addr, size });
        }
        let bar0 = Arc::new(
            Bar::map(&device, bar0_offset, size as usize)
                .map_err(|source| VfioError::MapBar { addr, source })?,
        );
        let request = request_eventfd(&device)
            .map_err(|e| log::info!("{addr}: no device request interrupt ({e}): hot removal waits for the controller to be dropped"))
            .ok();
        let shared = Arc::new(DeviceShared {
            addr,
            bar0: bar0.clone(),
            open: Mutex::new(Some(OpenDevice {
                device,
                config,
                _group: group,
                _lock: lock,
            })),
            request,
            closing: AtomicBool::new(false),
            removed: AtomicBool::new(false),
        });
        let watcher = shared.request.as_ref().and_then(|_| {
            let watched = shared.clone();
            std::thread::Builder::new()
                .name(format!("vfio-req {addr}"))
                .spawn(move || watched.wait_for_request())
                .map_err(|e| {
                    log::warn!("{addr}: cannot start the thread that watches for hot removal: {e}")
                })
                .ok()
        });
        let dev = VfioPciDevice {
            addr,
            live_slot: register_live(&bar0),
            bar0,
            shared,
            watcher,
            closing: None,
            _vfio: self.clone(),
        };
        let cmd = dev.config_read16(PCI_COMMAND);
        dev.config_write16(
            PCI_COMMAND,
            cmd | CMD_MEMORY_SPACE | CMD_BUS_MASTER | CMD_INTX_DISABLE,
        );
        Ok(dev)
    }
}

/// What a device and the thread watching for its removal share.
pub(super) struct DeviceShared {
    pub(super) addr: PciAddress,
    bar0: Arc<Bar>,
    /// The open device and its owner lock; None once given back to the kernel.
    pub(super) open: Mutex<Option<OpenDevice>>,
    /// The request interrupt's eventfd (None where the kernel offers none).
    request: Option<EventFd>,
    /// Set when the device is closed normally: the watcher then just ends.
    closing: AtomicBool,
    removed: AtomicBool,
}

impl std::fmt::Debug for DeviceShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceShared")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// Closed in this order: the device file (which a removal waits for), its group (if no other
/// device of the group is open), the owner lock.
pub(super) struct OpenDevice {
    pub(super) device: File,
    /// Where the config space is in the device file.
    pub(super) config: u64,
    _group: Arc<Group>,
    _lock: OwnerLock,
}

impl DeviceShared {
    /// The watcher thread: waits for the request interrupt (or for `closing`).
    fn wait_for_request(&self) {
        let Some(fd) = &self.request else {
            return;
        };
        loop {
            match fd.read() {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    log::warn!("{}: waiting for device requests: {e}", self.addr);
                    return;
                }
            }
            if self.closing.load(Ordering::Acquire) {
                return;
            }
            self.give_back();
            return;
        }
    }

    /// The kernel wants the device (hot removal, unbind): stop it, make its registers read all
    /// ones, close its file. Every later register access sees a removed device.
    fn give_back(&self) {
        let mut open = self.open.lock();
        let Some(device) = open.take() else {
            return;
        };
        log::warn!(
            "{}: the kernel asks for the device back (hot removal or unbind): disabling it and letting go",
            self.addr
        );
        disable_for_release(self.addr, &*self.bar0);
        if let Err(e) = self.bar0.detach() {
            log::error!(
                "{}: cannot detach BAR0 ({e}): the device stays open until its controller is dropped",
                self.addr
            );
            *open = Some(device);
            return;
        }
        self.removed.store(true, Ordering::Release);
        // No mapping of the device file is left (BAR0 was just detached): closing it lets the
        // removal go on.
        drop(device);
        log::warn!("{}: released to the kernel", self.addr);
    }
}

/// CC.EN = 0 and a bounded wait for CSTS.RDY = 0, so that the device does no more DMA before it
/// is released (a device already gone reads all ones: nothing to wait for).
fn disable_for_release(addr: PciAddress, regs: &dyn Registers) {
    let csts = Csts(regs.read32(reg::CSTS));
    if csts.0 == u32::MAX {
        return;
    }
    let limit = Duration::from_millis(Cap(regs.read64(reg::CAP)).to_ms().clamp(500, 10_000));
    let cc = Cc(regs.read32(reg::CC));
    regs.write32(reg::CC, cc.with_en(false).0);
    let started = Instant::now();
    loop {
        let csts = Csts(regs.read32(reg::CSTS));
        if csts.0 == u32::MAX || !csts.rdy() {
            return;
        }
        if started.elapsed() > limit {
            log::warn!("{addr}: still ready {limit:?} after CC.EN = 0; releasing it anyway");
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A PCI function opened through VFIO, with BAR0 mapped and bus mastering on.
pub struct VfioPciDevice {
    pub(super) addr: PciAddress,
    // Field order is drop order: BAR0 is unmapped (its last two references: here and in
    // `shared`) before the device file is closed; the mapping holds the file open otherwise, and
    // the group cannot leave the container.
    bar0: Arc<Bar>,
    pub(super) shared: Arc<DeviceShared>,
    watcher: Option<JoinHandle<()>>,
    live_slot: Option<usize>,
    /// The open device, moved here by `drop` to be closed after BAR0 is unmapped.
    closing: Option<OpenDevice>,
    _vfio: Arc<Vfio>,
}

impl Drop for VfioPciDevice {
    fn drop(&mut self) {
        if let Some(slot) = self.live_slot {
            unregister_live(slot, &self.bar0);
        }
        self.shared.closing.store(true, Ordering::Release);
        if let (Some(fd), Some(watcher)) = (&self.shared.request, self.watcher.take()) {
            if fd.write(1).is_ok() {
                let _ = watcher.join();
            }
        }
        // Closed with the fields, after BAR0: the device file (and with it the request
        // interrupt), then the owner lock.
        self.closing = self.shared.open.lock().take();
    }
}

impl std::fmt::Debug for VfioPciDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VfioPciDevice")
            .field("addr", &self.addr)
            .field("bar0", &self.bar0)
            .finish()
    }
}

impl VfioPciDevice {
    pub fn addr(&self) -> PciAddress {
        self.addr
    }

    pub fn bar0(&self) -> &Arc<Bar> {
        &self.bar0
    }

    /// The device's MSI-X vectors (enabled only when asked: see [`Interrupts`]).
    pub fn interrupts(&self) -> Arc<dyn Interrupts> {
        self.shared.clone()
    }

    /// Whether the device was given back to the kernel (hot removal): its registers and config
    /// space read all ones from then on.
    pub fn is_removed(&self) -> bool {
        self.shared.removed.load(Ordering::Acquire)
    }
}

//! `usnvme serve`'s drives while it runs: a thread watches the kernel's device events and the
//! drives. An NVMe controller bound to vfio-pci (a drive hot added, then `usnvme setup bind`,
//! or a drive handed over while the target runs) is brought up and each of its namespaces
//! becomes the next namespace of the subsystem (the lowest free ID); a drive that goes away
//! (hot removed or unbound: the kernel asks for it back through VFIO, the driver lets it go and
//! its registers read all ones) takes its namespaces (and a stripe it is in) with it. The
//! thread also takes the drives' asynchronous events: a SMART / health warning is passed on to
//! the hosts, and a drive's Namespace Attribute Changed notice (a namespace attached, detached
//! or formatted, perhaps through another controller of a dual-port drive) has its namespaces
//! read again and the subsystem's follow. Connected hosts are told each time (see
//! `usnvme_engine::fabric::export::namespaces`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use usnvme_driver::pci::PciAddress;
use usnvme_driver::{Controller, DeviceSpec, Opener};
use usnvme_engine::fabric::export::live::{LiveTarget, NewDevice, Rescan};
use usnvme_engine::fabric::export::registry::Registry;
use usnvme_engine::{drive_namespaces, BlockDevice, NamespaceDevice};

use super::{exportable, not_exportable, EXPORTED_PI};
use crate::hotplug::{Binds, Bound, LOOK_EVERY};

/// How often the drives' asynchronous events are taken (a look at every drive's admin queue:
/// with 24 drives in the test bed's guest, every 200 ms cost the idle target 0.7 % of a core).
const EVENTS_EVERY: Duration = Duration::from_secs(1);

/// One drive under the target.
#[derive(Debug)]
struct ServedDrive {
    spec: DeviceSpec,
    /// The engine's index of the drive.
    index: usize,
    controller: Controller,
    /// The reactors' devices on it (its namespaces, or the stripes it is in).
    devices: Vec<usize>,
    removed: bool,
}

/// The drives under the target, shared by the watcher, the SMART reader and the events'
/// pass-on.
#[derive(Debug, Clone, Default)]
pub(super) struct Drives(Arc<Mutex<Vec<ServedDrive>>>);

impl Drives {
    /// Drive `index` exported, on `devices` (indices into the reactors' devices).
    pub(super) fn add(
        &self,
        spec: DeviceSpec,
        index: usize,
        controller: Controller,
        devices: Vec<usize>,
    ) {
        self.0.lock().push(ServedDrive {
            spec,
            index,
            controller,
            devices,
            removed: false,
        });
    }

    /// The controllers of the drives still there.
    pub(super) fn controllers(&self) -> Vec<Controller> {
        let drives = self.0.lock();
        let live = drives.iter().filter(|d| !d.removed);
        live.map(|d| d.controller.clone()).collect()
    }

    /// The drives still there, each with its engine index.
    fn live(&self) -> Vec<(usize, Controller)> {
        let drives = self.0.lock();
        let live = drives.iter().filter(|d| !d.removed);
        live.map(|d| (d.index, d.controller.clone())).collect()
    }

    /// More devices on drive `index` (its namespaces exported since).
    fn add_devices(&self, index: usize, devices: impl IntoIterator<Item = usize>) {
        if let Some(d) = self.0.lock().iter_mut().find(|d| d.index == index) {
            d.devices.extend(devices);
        }
    }

    fn serves(&self, addr: PciAddress) -> bool {
        let spec = DeviceSpec::Pci(addr);
        self.0.lock().iter().any(|d| !d.removed && d.spec == spec)
    }

    /// Marks the drives found gone since the last look; the devices they were under.
    fn newly_removed(&self) -> Vec<(String, Vec<usize>)> {
        let mut drives = self.0.lock();
        let gone = drives
            .iter_mut()
            .filter(|d| !d.removed && d.controller.is_removed());
        gone.map(|d| {
            d.removed = true;
            (d.spec.to_string(), d.devices.clone())
        })
        .collect()
    }
}

/// The watcher's thread, stopped and joined when dropped.
#[derive(Debug)]
pub(super) struct Watcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What the watcher needs to bring a new drive up and export it.
pub(super) struct Inserts {
    /// The drives bound to vfio-pci (an insert).
    pub(super) binds: Binds,
    pub(super) opener: Arc<Opener>,
    /// The first engine index free for a new drive.
    pub(super) next_drive: usize,
    /// A device already exported: a new one must share its DMA space (the reactors' buffers
    /// are mapped there).
    pub(super) like: Arc<dyn BlockDevice>,
}

/// Starts watching: removals and the drives' events always, inserts with `inserts`.
pub(super) fn watch(
    drives: Drives,
    live: Arc<LiveTarget>,
    registry: Arc<Registry>,
    inserts: Option<Inserts>,
) -> std::io::Result<Watcher> {
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let thread = std::thread::Builder::new()
        .name("usnvme-hotplug".into())
        .spawn(move || {
            let mut inserts = inserts;
            let mut events_taken = Instant::now();
            while !stopped.load(Ordering::Acquire) {
                match inserts.as_mut() {
                    Some(i) => match i.binds.next(&i.opener, |addr| drives.serves(addr)) {
                        Ok(Some(Bound::Up(spec, controller))) => {
                            i.insert(spec, controller, &drives, &live);
                        }
                        Ok(Some(Bound::Failed(addr, why))) => {
                            eprintln!("usnvme: warning: {addr} was bound to vfio-pci but {why}; not exported");
                        }
                        Ok(None) => {}
                        Err(e) => {
                            eprintln!("usnvme: warning: watching the kernel's device events: {e}: drives bound to vfio-pci from now on are not exported");
                            inserts = None;
                        }
                    },
                    None => std::thread::sleep(LOOK_EVERY),
                }
                for (drive, devices) in drives.newly_removed() {
                    for ns in live.remove(&devices) {
                        eprintln!(
                            "usnvme: {drive} is gone: namespace {} ({}) removed",
                            ns.nsid, ns.name
                        );
                    }
                }
                if events_taken.elapsed() >= EVENTS_EVERY {
                    take_events(&drives, &live, &registry);
                    events_taken = Instant::now();
                }
            }
        })?;
    Ok(Watcher {
        stop,
        thread: Some(thread),
    })
}

/// The drives' asynchronous events: a SMART / health warning is passed on to every connected
/// host (the SMART log the hosts read is the drives' own, aggregated); a namespace change has
/// the drive's namespaces read again.
fn take_events(drives: &Drives, live: &LiveTarget, registry: &Registry) {
    for (index, controller) in drives.live() {
        for event in controller.events() {
            let name = controller.name();
            if event.is_smart() {
                let hosts = registry.raise_event(event.dw0());
                log::info!("{name}: {event}: passed on to {hosts} host controller(s)");
            } else if event.is_namespace_change() {
                log::info!("{name}: {event}: reading its namespaces again");
                let _ = rescan(drives, index, &controller, live);
            } else {
                log::info!("{name}: {event}: not passed on to the hosts");
            }
        }
    }
}

/// The drive the reactors' device `device` is a namespace of (not a stripe), and its controller.
pub(super) fn drive_of(drives: &Drives, device: usize) -> Option<(usize, Controller)> {
    let all = drives.0.lock();
    let on = all
        .iter()
        .filter(|d| !d.removed && d.devices.contains(&device));
    on.map(|d| (d.index, d.controller.clone())).next()
}

/// Drive `index`'s namespaces changed: the subsystem's follow them, and what happened is said
/// (and returned).
pub(super) fn rescan(
    drives: &Drives,
    index: usize,
    controller: &Controller,
    live: &LiveTarget,
) -> Result<Rescan, String> {
    let name = controller.name();
    let export = |nsid| {
        let device = NamespaceDevice::with_pi(controller.clone(), nsid, index, Some(EXPORTED_PI))
            .map_err(|e| e.to_string())?;
        let device: Arc<dyn BlockDevice> = Arc::new(device);
        match not_exportable(device.as_ref()) {
            Some(why) => Err(why),
            None => Ok(device),
        }
    };
    let rescan = match live.rescan_drive(index, controller, export) {
        Ok(rescan) => rescan,
        Err(why) => {
            eprintln!("usnvme: warning: {name}: its namespaces changed, but {why}; the target goes on exporting what it did");
            return Err(why);
        }
    };
    for ns in &rescan.removed {
        eprintln!(
            "usnvme: {name}: namespace {} ({}) removed: the drive's namespace was detached, deleted or changed",
            ns.nsid, ns.name
        );
    }
    for ns in &rescan.added {
        eprintln!(
            "usnvme: {name}: exported as namespace {} ({}, {} blocks of {} bytes)",
            ns.nsid, ns.name, ns.blocks, ns.block_size
        );
    }
    for why in &rescan.left {
        eprintln!("usnvme: warning: {name}: {why}");
    }
    drives.add_devices(index, rescan.added.iter().map(|ns| ns.device));
    Ok(rescan)
}

impl Inserts {
    /// Exports the namespaces of the controller just bound to vfio-pci (`spec`, brought up);
    /// what goes wrong is said, and the target runs on without it.
    fn insert(
        &mut self,
        spec: DeviceSpec,
        controller: Controller,
        drives: &Drives,
        live: &LiveTarget,
    ) {
        let addr = spec.clone();
        let namespaces = exportable(drive_namespaces(
            self.next_drive,
            &controller,
            Some(EXPORTED_PI),
        ));
        let like = self.like.dma().space;
        if namespaces
            .iter()
            .any(|d| !Arc::ptr_eq(&d.dma().space, &like))
        {
            eprintln!("usnvme: warning: {addr}: not exported: its DMA space is not the other drives' (simulated and vfio-pci drives cannot be served together)");
            return;
        }
        if namespaces.is_empty() {
            eprintln!(
                "usnvme: warning: {addr}: bound to vfio-pci, but it has no namespace to export"
            );
            return;
        }
        let new = namespaces
            .into_iter()
            .map(|device| NewDevice {
                device,
                controllers: vec![controller.clone()],
            })
            .collect();
        match live.add(new) {
            Ok(added) => {
                for ns in &added {
                    eprintln!(
                        "usnvme: {addr} bound to vfio-pci: exported as namespace {} ({}, {} blocks of {} bytes)",
                        ns.nsid, ns.name, ns.blocks, ns.block_size
                    );
                }
                let devices = added.iter().map(|ns| ns.device).collect();
                drives.add(spec, self.next_drive, controller, devices);
                self.next_drive += 1;
            }
            Err(why) => eprintln!("usnvme: warning: {addr}: not exported: {why}"),
        }
    }
}

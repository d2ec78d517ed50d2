//! `usnvme serve`'s drives while it runs: a thread watches the kernel's device events and the
//! drives. An NVMe controller bound to vfio-pci (a drive hot added, then `usnvme setup bind`,
//! or a drive handed over while the target runs) is brought up and each of its namespaces
//! becomes the next namespace of the subsystem (the lowest free ID); a drive that goes away
//! (hot removed or unbound: the kernel asks for it back through VFIO, the driver lets it go and
//! its registers read all ones) takes its namespaces (and a stripe it is in) with it. Connected
//! hosts are told each time (see `usnvme_engine::fabric::export::namespaces`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;
use usnvme_driver::pci::uevent::{PciEvent, UeventSocket};
use usnvme_driver::pci::PciAddress;
use usnvme_driver::{Controller, ControllerOptions, DeviceSpec, Opener};
use usnvme_engine::fabric::export::namespaces::{LiveNamespaces, NewDevice};
use usnvme_engine::{drive_namespaces, BlockDevice};

use super::{exportable, nguid, EXPORTED_PI};

/// How often the drives are looked at for removal (and the stop flag), at most.
const LOOK_EVERY: Duration = Duration::from_millis(200);

/// One drive under the target.
#[derive(Debug)]
struct ServedDrive {
    spec: DeviceSpec,
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
    /// A drive exported at start, on `devices` (indices into the reactors' devices).
    pub(super) fn add(&self, spec: DeviceSpec, controller: Controller, devices: Vec<usize>) {
        self.0.lock().push(ServedDrive {
            spec,
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
    /// The kernel's device events (a vfio-pci bind of an NVMe function is an insert).
    pub(super) events: UeventSocket,
    pub(super) opener: Arc<Opener>,
    /// The first engine index free for a new drive.
    pub(super) next_drive: usize,
    /// A device already exported: a new one must share its DMA space (the reactors' buffers
    /// are mapped there).
    pub(super) like: Arc<dyn BlockDevice>,
}

/// Starts watching: removals always, inserts with `inserts`.
pub(super) fn watch(
    drives: Drives,
    live: Arc<LiveNamespaces>,
    inserts: Option<Inserts>,
) -> std::io::Result<Watcher> {
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let thread = std::thread::Builder::new()
        .name("usnvme-hotplug".into())
        .spawn(move || {
            let mut inserts = inserts;
            while !stopped.load(Ordering::Acquire) {
                match inserts.as_mut() {
                    Some(i) => match i.events.next(LOOK_EVERY) {
                        Ok(Some(PciEvent::BoundToVfio(addr))) if !drives.serves(addr) => {
                            i.insert(addr, &drives, &live);
                        }
                        Ok(_) => {}
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
            }
        })?;
    Ok(Watcher {
        stop,
        thread: Some(thread),
    })
}

impl Inserts {
    /// Brings up the controller just bound to vfio-pci at `addr` and exports its namespaces;
    /// what goes wrong is said, and the target runs on without it.
    fn insert(&mut self, addr: PciAddress, drives: &Drives, live: &LiveNamespaces) {
        let spec = DeviceSpec::Pci(addr);
        let controller = match self.opener.open(&spec, ControllerOptions::default()) {
            Ok(mut opened) if !opened.is_empty() => opened.remove(0),
            Ok(_) => return,
            Err(e) => {
                eprintln!("usnvme: warning: {addr} was bound to vfio-pci but cannot be brought up: {e}; not exported");
                return;
            }
        };
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
        let nqn = live.subsystem().nqn.clone();
        match live.add(new, |name| nguid(&nqn, name)) {
            Ok(added) => {
                for ns in &added {
                    eprintln!(
                        "usnvme: {addr} bound to vfio-pci: exported as namespace {} ({}, {} blocks of {} bytes)",
                        ns.nsid, ns.name, ns.blocks, ns.block_size
                    );
                }
                let devices = added.iter().map(|ns| ns.device).collect();
                drives.add(spec, controller, devices);
                self.next_drive += 1;
            }
            Err(why) => eprintln!("usnvme: warning: {addr}: not exported: {why}"),
        }
    }
}

//! The subsystem's namespaces while the target runs: a drive bound to vfio-pci (hot added, or
//! handed over with `usnvme setup bind`) becomes a namespace, a drive removed takes its
//! namespaces with it, and a drive whose own namespaces change (attached, detached, formatted,
//! perhaps by another controller of its NVM subsystem) has them rescanned.
//!
//! A change is made on every reactor before the hosts hear of it: each reactor opens its
//! channels to an added device (or lets a removed one go) and gives its connections the new
//! subsystem, between two turns; once all have, every connected host controller gets a
//! Namespace Attribute Changed event and the Changed Namespace List log names the namespaces,
//! so that the Linux host rescans without reconnecting. No lock on the I/O path: each
//! connection keeps its own `Arc` of the subsystem, swapped by its reactor.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use usnvme_driver::Controller;

use super::registry::Registry;
use super::server::Inbox;
use super::{ExportedNamespace, SubsystemInfo, MAX_NAMESPACES};
use crate::block::BlockDevice;

/// How long a change waits for each reactor (opening a device's queues takes milliseconds; a
/// reactor that is stopping may not answer at all).
const REACTOR_ANSWER: Duration = Duration::from_secs(30);

/// A device to export, with the controllers under it (whose removal takes it away).
#[derive(Debug, Clone)]
pub struct NewDevice {
    pub device: Arc<dyn BlockDevice>,
    pub controllers: Vec<Controller>,
}

/// One change, as each reactor applies it.
#[derive(Debug)]
pub struct NamespaceChange {
    /// The subsystem after the change.
    pub subsystem: Arc<SubsystemInfo>,
    /// Devices to open channels to, by the index the new namespaces name (the next ones).
    pub added: Vec<(usize, NewDevice)>,
    /// Devices no namespace uses any more: their channels go once nothing is in flight.
    pub removed: Vec<usize>,
    /// Where the reactor says it applied the change (or why it could not open a device).
    pub done: crossbeam_channel::Sender<Result<(), String>>,
}

/// The namespaces of a running target, and the reactors that serve them.
#[derive(Debug)]
pub struct LiveNamespaces {
    state: Mutex<State>,
    inboxes: Vec<Inbox>,
    registry: Arc<Registry>,
}

#[derive(Debug)]
struct State {
    subsystem: Arc<SubsystemInfo>,
    /// What each device the reactors know of is on, by index (the next added one takes the
    /// next index).
    devices: Vec<DeviceOrigin>,
}

/// What a device is on: its drives, and the namespace when it is one namespace of one drive.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DeviceOrigin {
    drives: Vec<usize>,
    nsid: Option<u32>,
}

impl DeviceOrigin {
    fn of(device: &dyn BlockDevice) -> DeviceOrigin {
        DeviceOrigin {
            drives: device.drives(),
            nsid: device.local_nsid(),
        }
    }

    /// Whether this is namespace `nsid` of drive `drive` alone.
    fn is(&self, drive: usize, nsid: u32) -> bool {
        self.drives == [drive] && self.nsid == Some(nsid)
    }
}

/// What a rescan of one drive's namespaces did to the subsystem.
#[derive(Debug, Default)]
pub struct Rescan {
    /// Namespaces taken away (the drive's namespace was detached, deleted or changed shape).
    pub removed: Vec<ExportedNamespace>,
    /// Namespaces exported (attached, or in their new shape).
    pub added: Vec<ExportedNamespace>,
    /// The drive's namespaces that changed but are left as they were, each with why (in a
    /// stripe, which keeps its shape; or not exportable).
    pub left: Vec<String>,
}

impl LiveNamespaces {
    /// `subsystem`'s namespaces use `devices`, the devices of the reactors behind `inboxes`.
    pub fn new(
        subsystem: Arc<SubsystemInfo>,
        devices: &[Arc<dyn BlockDevice>],
        inboxes: Vec<Inbox>,
        registry: Arc<Registry>,
    ) -> LiveNamespaces {
        let devices = devices
            .iter()
            .map(|d| DeviceOrigin::of(d.as_ref()))
            .collect();
        LiveNamespaces {
            state: Mutex::new(State { subsystem, devices }),
            inboxes,
            registry,
        }
    }

    /// The subsystem as it is now.
    pub fn subsystem(&self) -> Arc<SubsystemInfo> {
        self.state.lock().subsystem.clone()
    }

    /// Exports `devices` as new namespaces (the lowest free IDs; `nguid` gives each its NGUID
    /// from its name): every reactor opens its channels to them, then the hosts are told.
    /// If a reactor cannot open one, none is exported, and the error says why.
    pub fn add(
        &self,
        devices: Vec<NewDevice>,
        nguid: impl Fn(&str) -> [u8; 16],
    ) -> Result<Vec<ExportedNamespace>, String> {
        let mut state = self.state.lock();
        let mut namespaces = state.subsystem.namespaces.clone();
        let mut added = Vec::new();
        let mut exported = Vec::new();
        for new in devices {
            let nsid = (1..=MAX_NAMESPACES)
                .find(|id| namespaces.iter().all(|ns| ns.nsid != *id))
                .ok_or_else(|| format!("every namespace ID up to {MAX_NAMESPACES} is taken"))?;
            let index = state.devices.len() + added.len();
            let ns = ExportedNamespace::of(nsid, index, new.device.as_ref(), &nguid);
            namespaces.push(ns.clone());
            exported.push(ns);
            added.push((index, new));
        }
        namespaces.sort_by_key(|ns| ns.nsid);
        let indices: Vec<usize> = added.iter().map(|(i, _)| *i).collect();
        let subsystem = Arc::new(SubsystemInfo {
            namespaces,
            ..(*state.subsystem).clone()
        });
        // the reactors know of the devices now, whether they could open them or not
        let origins = added
            .iter()
            .map(|(_, new)| DeviceOrigin::of(new.device.as_ref()));
        state.devices.extend(origins);
        if let Err(why) = self.apply(subsystem.clone(), added, Vec::new()) {
            // every reactor has the devices in its list: let them go again
            let unchanged = state.subsystem.clone();
            let _ = self.apply(unchanged, Vec::new(), indices);
            return Err(why);
        }
        state.subsystem = subsystem;
        let nsids: Vec<u32> = exported.iter().map(|ns| ns.nsid).collect();
        self.registry.namespaces_changed(&nsids);
        Ok(exported)
    }

    /// Takes away the namespaces on any of `devices` (those of a removed drive): new commands
    /// to them are refused at once on every reactor, then the hosts are told. The namespaces
    /// removed.
    pub fn remove(&self, devices: &[usize]) -> Vec<ExportedNamespace> {
        let mut state = self.state.lock();
        let (gone, kept): (Vec<_>, Vec<_>) = state
            .subsystem
            .namespaces
            .iter()
            .cloned()
            .partition(|ns| devices.contains(&ns.device));
        if gone.is_empty() {
            return gone;
        }
        let subsystem = Arc::new(SubsystemInfo {
            namespaces: kept,
            ..(*state.subsystem).clone()
        });
        let removed: Vec<usize> = gone.iter().map(|ns| ns.device).collect();
        for &device in &removed {
            if let Some(origin) = state.devices.get_mut(device) {
                // on nothing any more: a namespace with its ID attached again is a new device
                *origin = DeviceOrigin {
                    drives: Vec::new(),
                    nsid: None,
                };
            }
        }
        if let Err(why) = self.apply(subsystem.clone(), Vec::new(), removed) {
            log::warn!("taking namespaces away: {why}");
        }
        state.subsystem = subsystem;
        let nsids: Vec<u32> = gone.iter().map(|ns| ns.nsid).collect();
        self.registry.namespaces_changed(&nsids);
        gone
    }

    /// Drive `drive`'s namespaces changed (its controller, `controller`, raised Namespace
    /// Attribute Changed): reads them again. Those detached or deleted are taken away, those
    /// attached are exported, those formatted or resized are taken away and exported again in
    /// their new shape; `export` makes a namespace's device (or says why it is not exported),
    /// `nguid` its NGUID. A namespace in a stripe is left as it was.
    pub fn rescan_drive(
        &self,
        drive: usize,
        controller: &Controller,
        export: impl Fn(u32) -> Result<Arc<dyn BlockDevice>, String>,
        nguid: impl Fn(&str) -> [u8; 16],
    ) -> Result<Rescan, String> {
        let changes = controller
            .rescan_namespaces()
            .map_err(|e| format!("reading the namespaces again: {e}"))?;
        let mut rescan = Rescan::default();
        let (mut gone, mut new) = (Vec::new(), changes.added.clone());
        {
            let state = self.state.lock();
            let in_stripe = state
                .devices
                .iter()
                .any(|o| o.nsid.is_none() && o.drives.contains(&drive));
            for &nsid in changes.removed.iter().chain(&changes.changed) {
                let changed = changes.changed.contains(&nsid);
                let plain = state.devices.iter().position(|o| o.is(drive, nsid));
                match plain {
                    Some(device) => gone.push(device),
                    None if in_stripe => {
                        rescan.left.push(format!("namespace {nsid} changed: it is in a stripe, which keeps its shape (restart the target to export the new one)"));
                        continue;
                    }
                    None => {}
                }
                if changed {
                    new.push(nsid);
                }
            }
        }
        if !gone.is_empty() {
            rescan.removed = self.remove(&gone);
        }
        let mut devices = Vec::new();
        for nsid in new {
            match export(nsid) {
                Ok(device) => devices.push(NewDevice {
                    device,
                    controllers: vec![controller.clone()],
                }),
                Err(why) => rescan.left.push(format!("namespace {nsid}: {why}")),
            }
        }
        if !devices.is_empty() {
            rescan.added = self.add(devices, nguid)?;
        }
        Ok(rescan)
    }

    /// Has every reactor apply a change, and waits for each (the first failure is returned).
    fn apply(
        &self,
        subsystem: Arc<SubsystemInfo>,
        added: Vec<(usize, NewDevice)>,
        removed: Vec<usize>,
    ) -> Result<(), String> {
        let (done, answers) = crossbeam_channel::unbounded();
        for inbox in &self.inboxes {
            inbox.change(NamespaceChange {
                subsystem: subsystem.clone(),
                added: added.clone(),
                removed: removed.clone(),
                done: done.clone(),
            });
        }
        drop(done);
        let mut result = Ok(());
        for _ in &self.inboxes {
            let answer = answers
                .recv_timeout(REACTOR_ANSWER)
                .map_err(|_| "a reactor did not answer (is the target stopping?)".to_string())
                .and_then(|r| r);
            if let Err(why) = answer {
                result = result.and(Err(why));
            }
        }
        result
    }
}

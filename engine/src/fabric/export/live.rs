//! The target while it runs: its NVM subsystems, their namespaces and hosts, changed by the
//! operator (`usnvme target …`, a reloaded configuration) or by the drives (a drive bound to
//! vfio-pci, hot added or handed over with `usnvme setup bind`, becomes namespaces of the first
//! subsystem; a drive removed takes its namespaces with it; a drive whose own namespaces change
//! has them rescanned).
//!
//! A change is made on every reactor before the hosts hear of it: each reactor opens its
//! channels to an added device (or lets a removed one go) and gives its connections the new
//! subsystems, between two turns; once all have, the connected host controllers of the
//! subsystem changed get a Namespace Attribute Changed event and the Changed Namespace List log
//! names the namespaces, so that the Linux host rescans without reconnecting; the discovery
//! controllers get a Discovery Log Change when the subsystems or their hosts change. No lock on
//! the I/O path: each connection keeps its own `Arc` of the subsystems, swapped by its reactor.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use usnvme_driver::Controller;

use super::registry::Registry;
use super::server::Inbox;
use super::{
    ExportedNamespace, SubsystemInfo, Subsystems, ANA_GROUPS, DISCOVERY_NQN, MAX_NAMESPACES,
};
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
pub struct TargetChange {
    /// The subsystems after the change.
    pub subsystems: Arc<Subsystems>,
    /// Devices to open channels to, by the index the new namespaces name (the next ones).
    pub added: Vec<(usize, NewDevice)>,
    /// Devices no namespace uses any more: their channels go once nothing is in flight.
    pub removed: Vec<usize>,
    /// Where the reactor says it applied the change (or why it could not open a device).
    pub done: crossbeam_channel::Sender<Result<(), String>>,
}

/// The subsystems of a running target, the devices its namespaces may use, and the reactors
/// that serve them.
#[derive(Debug)]
pub struct LiveTarget {
    state: Mutex<State>,
    inboxes: Vec<Inbox>,
    registry: Arc<Registry>,
}

#[derive(Debug)]
struct State {
    subsystems: Arc<Subsystems>,
    /// Every device the reactors know of, by index (the next added one takes the next index).
    devices: Vec<KnownDevice>,
}

/// A device the reactors have channels to: what it is on, and the device itself while it is
/// there (None once its drive went away).
#[derive(Debug, Clone)]
struct KnownDevice {
    name: String,
    device: Option<Arc<dyn BlockDevice>>,
    origin: DeviceOrigin,
}

impl KnownDevice {
    fn of(device: &Arc<dyn BlockDevice>) -> KnownDevice {
        KnownDevice {
            name: device.info().name.clone(),
            device: Some(device.clone()),
            origin: DeviceOrigin::of(device.as_ref()),
        }
    }
}

/// A device of the target as the operator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceView {
    /// The reactors' index of it (what namespaces name).
    pub index: usize,
    pub name: String,
    /// Its size in bytes, and whether its drive is still there.
    pub bytes: u64,
    pub present: bool,
    /// The subsystem and namespace ID it is exported as, if it is.
    pub exported_as: Option<(String, u32)>,
}

/// What the operator asks of a namespace to export: the device (by name or index), and the
/// identity to give it (what is not given is chosen: the lowest free NSID, NGUID and UUID
/// derived from the subsystem and device names, ANA group 1).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceRequest {
    /// A device's name; None: the first present device no namespace uses.
    pub device: Option<String>,
    pub nsid: Option<u32>,
    pub uuid: Option<[u8; 16]>,
    pub nguid: Option<[u8; 16]>,
    /// Its ANA group; None: group 1.
    pub ana_group: Option<u32>,
}

/// What the operator asks of a new subsystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubsystemRequest {
    pub nqn: String,
    /// Serial number and model; None: derived from the NQN, and "usnvme".
    pub serial: Option<String>,
    pub model: Option<String>,
    /// Host NQNs that may connect; None: any host.
    pub allowed_hosts: Option<Vec<String>>,
    /// The IDs of the ports it is reached through; None: every port.
    pub ports: Option<Vec<u16>>,
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

impl LiveTarget {
    /// `subsystems`' namespaces use `devices`, the devices of the reactors behind `inboxes`.
    pub fn new(
        subsystems: Arc<Subsystems>,
        devices: &[Arc<dyn BlockDevice>],
        inboxes: Vec<Inbox>,
        registry: Arc<Registry>,
    ) -> LiveTarget {
        LiveTarget {
            state: Mutex::new(State {
                subsystems,
                devices: devices.iter().map(KnownDevice::of).collect(),
            }),
            inboxes,
            registry,
        }
    }

    /// The subsystems as they are now.
    pub fn subsystems(&self) -> Arc<Subsystems> {
        self.state.lock().subsystems.clone()
    }

    /// The devices the target has, and what each is exported as.
    pub fn devices(&self) -> Vec<DeviceView> {
        let state = self.state.lock();
        let views = state
            .devices
            .iter()
            .enumerate()
            .map(|(index, d)| DeviceView {
                index,
                name: d.name.clone(),
                bytes: d.device.as_ref().map_or(0, |d| d.info().size_bytes),
                present: d.device.is_some(),
                exported_as: self.exported_as(&state, index),
            });
        views.collect()
    }

    /// Adds subsystem `request` (no namespaces yet); the discovery controllers are told.
    pub fn add_subsystem(&self, request: SubsystemRequest) -> Result<Arc<SubsystemInfo>, String> {
        let mut state = self.state.lock();
        let nqn = request.nqn;
        if nqn == DISCOVERY_NQN || state.subsystems.find(&nqn).is_some() {
            return Err(format!("subsystem {nqn} exists already"));
        }
        if state.subsystems.list.len() >= MAX_SUBSYSTEMS {
            return Err(format!(
                "the target has {MAX_SUBSYSTEMS} subsystems, the most it serves"
            ));
        }
        let sub = Arc::new(SubsystemInfo {
            serial: request.serial.unwrap_or_else(|| super::serial_of(&nqn)),
            model: request.model.unwrap_or_else(|| "usnvme".into()),
            allowed_hosts: request.allowed_hosts,
            ports: request.ports,
            nqn,
            ..(*state.subsystems.base).clone()
        });
        let mut list = state.subsystems.list.clone();
        list.push(sub.clone());
        self.change_subsystems(&mut state, list, true)?;
        Ok(sub)
    }

    /// Removes subsystem `nqn`: its controllers go away at once (their hosts' commands end
    /// with their connections), its namespaces' devices are free for others; the discovery
    /// controllers are told.
    pub fn remove_subsystem(&self, nqn: &str) -> Result<Arc<SubsystemInfo>, String> {
        let mut state = self.state.lock();
        let gone = find(&state.subsystems, nqn)?.clone();
        self.registry.subsystem_removed(nqn);
        let list = state.subsystems.list.iter().filter(|s| s.nqn != nqn);
        let list = list.cloned().collect();
        let applied = self.change_subsystems(&mut state, list, true);
        // and any a Connect made before its reactor had the change
        self.registry.subsystem_removed(nqn);
        applied.map(|()| gone)
    }

    /// Lets `hosts` (None: any host) connect to subsystem `nqn` from now on (connected hosts
    /// stay, as nvmet's); the discovery controllers are told.
    pub fn set_hosts(&self, nqn: &str, hosts: Option<Vec<String>>) -> Result<(), String> {
        let mut state = self.state.lock();
        let sub = find(&state.subsystems, nqn)?;
        let changed = Arc::new(SubsystemInfo {
            allowed_hosts: hosts,
            ..(**sub).clone()
        });
        let list = replaced(&state.subsystems, changed);
        self.change_subsystems(&mut state, list, true)
    }

    /// Makes subsystem `nqn` reached through ports `ports` (IDs; None: every port) from now on
    /// (connected hosts stay); the discovery controllers are told.
    pub fn set_ports(&self, nqn: &str, ports: Option<Vec<u16>>) -> Result<(), String> {
        let mut state = self.state.lock();
        let sub = find(&state.subsystems, nqn)?;
        let changed = Arc::new(SubsystemInfo {
            ports,
            ..(**sub).clone()
        });
        let list = replaced(&state.subsystems, changed);
        self.change_subsystems(&mut state, list, true)
    }

    /// Exports a device as a namespace of subsystem `nqn`, with the identity asked for; its
    /// hosts are told.
    pub fn export(
        &self,
        nqn: &str,
        request: NamespaceRequest,
    ) -> Result<ExportedNamespace, String> {
        let mut state = self.state.lock();
        let sub = find(&state.subsystems, nqn)?.clone();
        let present = |d: &KnownDevice| d.device.is_some();
        let index = match &request.device {
            Some(name) => {
                let index = state
                    .devices
                    .iter()
                    .rposition(|d| &d.name == name && present(d))
                    .ok_or_else(|| {
                        let names: Vec<&str> = state.devices.iter().filter(|d| present(d)).map(|d| d.name.as_str()).collect();
                        format!("the target has no device {name} (it has {})", names.join(", "))
                    })?;
                if let Some((other, nsid)) = self.exported_as(&state, index) {
                    return Err(format!("{name} is namespace {nsid} of {other} already (one namespace per device)"));
                }
                index
            }
            None => (0..state.devices.len())
                .find(|&i| present(&state.devices[i]) && self.exported_as(&state, i).is_none())
                .ok_or("every device of the target is exported already: name one with --device, or start the target with more")?,
        };
        let Some(device) = state.devices[index].device.clone() else {
            return Err("the device went away".into());
        };
        let taken = |nsid: u32| sub.namespaces.iter().any(|ns| ns.nsid == nsid);
        let nsid = match request.nsid {
            Some(0) => return Err("namespace ID 0 is not one: give 1 or more".into()),
            Some(nsid) if nsid > MAX_NAMESPACES => {
                return Err(format!(
                    "namespace ID {nsid} is beyond the {MAX_NAMESPACES} the target serves"
                ))
            }
            Some(nsid) if taken(nsid) => return Err(format!("{nqn} has namespace {nsid} already")),
            Some(nsid) => nsid,
            None => (1..=MAX_NAMESPACES)
                .find(|&id| !taken(id))
                .ok_or_else(|| format!("every namespace ID up to {MAX_NAMESPACES} is taken"))?,
        };
        let mut ns = ExportedNamespace::of(nsid, index, device.as_ref(), nqn);
        if let Some(nguid) = request.nguid {
            ns.nguid = nguid;
            ns.uuid = super::uuid_of_nguid(&nguid);
        }
        if let Some(uuid) = request.uuid {
            ns.uuid = uuid;
        }
        match request.ana_group {
            Some(group) if group == 0 || group > ANA_GROUPS => {
                return Err(format!("ANA group {group}: give 1 to {ANA_GROUPS}"))
            }
            Some(group) => ns.ana_group = group,
            None => {}
        }
        if let Some(other) = sub
            .namespaces
            .iter()
            .find(|o| o.uuid == ns.uuid || o.nguid == ns.nguid)
        {
            return Err(format!(
                "namespace {} of {nqn} has that UUID or NGUID already (hosts require them unique)",
                other.nsid
            ));
        }
        let mut namespaces = sub.namespaces.clone();
        namespaces.push(ns.clone());
        namespaces.sort_by_key(|ns| ns.nsid);
        let changed = Arc::new(SubsystemInfo {
            namespaces,
            ..(*sub).clone()
        });
        let list = replaced(&state.subsystems, changed);
        self.change_subsystems(&mut state, list, false)?;
        self.registry.namespaces_changed(nqn, &[nsid]);
        Ok(ns)
    }

    /// Takes namespace `nsid` away from subsystem `nqn`: new commands to it are refused
    /// ("Invalid Namespace or Format") on every reactor, those in flight complete, and the hosts
    /// are told. Its device stays, free to export again.
    pub fn unexport(&self, nqn: &str, nsid: u32) -> Result<ExportedNamespace, String> {
        let mut state = self.state.lock();
        let sub = find(&state.subsystems, nqn)?.clone();
        let (gone, kept): (Vec<_>, Vec<_>) = sub
            .namespaces
            .iter()
            .cloned()
            .partition(|ns| ns.nsid == nsid);
        let Some(gone) = gone.into_iter().next() else {
            return Err(format!("{nqn} has no namespace {nsid}"));
        };
        let changed = Arc::new(SubsystemInfo {
            namespaces: kept,
            ..(*sub).clone()
        });
        let list = replaced(&state.subsystems, changed);
        self.change_subsystems(&mut state, list, false)?;
        self.registry.namespaces_changed(nqn, &[nsid]);
        Ok(gone)
    }

    /// The subsystem and namespace ID device `index` is exported as.
    fn exported_as(&self, state: &State, index: usize) -> Option<(String, u32)> {
        state.subsystems.list.iter().find_map(|s| {
            let ns = s.namespaces.iter().find(|ns| ns.device == index)?;
            Some((s.nqn.clone(), ns.nsid))
        })
    }

    /// Gives every reactor `list` as the subsystems (the discovery log's generation moves on
    /// when `discovery` says it changed, and its controllers are told).
    fn change_subsystems(
        &self,
        state: &mut State,
        list: Vec<Arc<SubsystemInfo>>,
        discovery: bool,
    ) -> Result<(), String> {
        let subsystems = Arc::new(Subsystems {
            base: state.subsystems.base.clone(),
            list,
            generation: state.subsystems.generation + u64::from(discovery),
        });
        let applied = self.apply(subsystems.clone(), Vec::new(), Vec::new());
        // (a reactor that did not answer is stopping: the change stands for the others)
        state.subsystems = subsystems;
        if discovery {
            self.registry.discovery_changed();
        }
        applied
    }

    /// Drive devices `devices` came: the reactors open their channels, and each becomes the
    /// next namespace of the first subsystem (the lowest free ID; with no subsystem, a device
    /// the operator may export). If a reactor cannot open one, none is added, and the error
    /// says why.
    pub fn add(&self, devices: Vec<NewDevice>) -> Result<Vec<ExportedNamespace>, String> {
        self.add_devices(devices, true)
    }

    /// [`Self::add`]; the devices exported into the first subsystem only if `into_first`.
    fn add_devices(
        &self,
        devices: Vec<NewDevice>,
        into_first: bool,
    ) -> Result<Vec<ExportedNamespace>, String> {
        let mut state = self.state.lock();
        let first = into_first
            .then(|| state.subsystems.list.first().cloned())
            .flatten();
        let mut namespaces = first
            .as_ref()
            .map_or_else(Vec::new, |s| s.namespaces.clone());
        let mut added = Vec::new();
        let mut exported = Vec::new();
        for new in devices {
            let index = state.devices.len() + added.len();
            if let Some(sub) = &first {
                let nsid = (1..=MAX_NAMESPACES)
                    .find(|id| namespaces.iter().all(|ns| ns.nsid != *id))
                    .ok_or_else(|| format!("every namespace ID up to {MAX_NAMESPACES} is taken"))?;
                let ns = ExportedNamespace::of(nsid, index, new.device.as_ref(), &sub.nqn);
                namespaces.push(ns.clone());
                exported.push(ns);
            }
            added.push((index, new));
        }
        namespaces.sort_by_key(|ns| ns.nsid);
        let indices: Vec<usize> = added.iter().map(|(i, _)| *i).collect();
        let list = match &first {
            Some(sub) => replaced(
                &state.subsystems,
                Arc::new(SubsystemInfo {
                    namespaces,
                    ..(**sub).clone()
                }),
            ),
            None => state.subsystems.list.clone(),
        };
        let subsystems = Arc::new(Subsystems {
            list,
            ..(*state.subsystems).clone()
        });
        // the reactors know of the devices now, whether they could open them or not
        let known = added.iter().map(|(_, new)| KnownDevice::of(&new.device));
        state.devices.extend(known);
        if let Err(why) = self.apply(subsystems.clone(), added, Vec::new()) {
            // every reactor has the devices in its list: let them go again
            let unchanged = state.subsystems.clone();
            let _ = self.apply(unchanged, Vec::new(), indices.clone());
            for i in indices {
                forget(&mut state.devices[i]);
            }
            return Err(why);
        }
        state.subsystems = subsystems;
        if let Some(sub) = &first {
            let nsids: Vec<u32> = exported.iter().map(|ns| ns.nsid).collect();
            self.registry.namespaces_changed(&sub.nqn, &nsids);
        }
        Ok(exported)
    }

    /// Takes away the namespaces on any of `devices` (those of a removed drive), in every
    /// subsystem: new commands to them are refused at once on every reactor, then the hosts are
    /// told. The namespaces removed.
    pub fn remove(&self, devices: &[usize]) -> Vec<ExportedNamespace> {
        let mut state = self.state.lock();
        let mut gone_all = Vec::new();
        let mut list = Vec::new();
        let mut told = Vec::new();
        for sub in &state.subsystems.list {
            let (gone, kept): (Vec<_>, Vec<_>) = sub
                .namespaces
                .iter()
                .cloned()
                .partition(|ns| devices.contains(&ns.device));
            if gone.is_empty() {
                list.push(sub.clone());
                continue;
            }
            told.push((
                sub.nqn.clone(),
                gone.iter().map(|ns| ns.nsid).collect::<Vec<_>>(),
            ));
            gone_all.extend(gone);
            list.push(Arc::new(SubsystemInfo {
                namespaces: kept,
                ..(**sub).clone()
            }));
        }
        for &device in devices {
            if let Some(known) = state.devices.get_mut(device) {
                // on nothing any more: a namespace with its ID attached again is a new device
                forget(known);
            }
        }
        let subsystems = Arc::new(Subsystems {
            list,
            ..(*state.subsystems).clone()
        });
        if let Err(why) = self.apply(subsystems.clone(), Vec::new(), devices.to_vec()) {
            log::warn!("taking namespaces away: {why}");
        }
        state.subsystems = subsystems;
        for (nqn, nsids) in told {
            self.registry.namespaces_changed(&nqn, &nsids);
        }
        gone_all
    }

    /// Drive `drive`'s namespaces changed (its controller, `controller`, raised Namespace
    /// Attribute Changed, or the operator says so): reads them again. Those detached or deleted
    /// are taken away, those attached are exported (into the first subsystem), those formatted
    /// or resized are taken away and exported again in their new shape, where they were and as
    /// what (subsystem, NSID, UUID, NGUID, ANA group); `export` makes a namespace's device (or
    /// says why it is not exported). A namespace in a stripe is left as it was.
    pub fn rescan_drive(
        &self,
        drive: usize,
        controller: &Controller,
        export: impl Fn(u32) -> Result<Arc<dyn BlockDevice>, String>,
    ) -> Result<Rescan, String> {
        let changes = controller
            .rescan_namespaces()
            .map_err(|e| format!("reading the namespaces again: {e}"))?;
        let mut rescan = Rescan::default();
        let (mut gone, mut new) = (Vec::new(), changes.added.clone());
        // what each namespace that changes shape was exported as, to be it again
        let mut was = Vec::new();
        {
            let state = self.state.lock();
            let origins = || state.devices.iter().map(|d| &d.origin);
            let in_stripe = origins().any(|o| o.nsid.is_none() && o.drives.contains(&drive));
            for &nsid in changes.removed.iter().chain(&changes.changed) {
                let changed = changes.changed.contains(&nsid);
                let plain = origins().position(|o| o.is(drive, nsid));
                match plain {
                    Some(device) => {
                        gone.push(device);
                        if let (true, Some((nqn, _))) = (changed, self.exported_as(&state, device))
                        {
                            let sub = state.subsystems.find(&nqn).cloned();
                            let ns = sub.and_then(|s| {
                                s.namespaces.iter().find(|n| n.device == device).cloned()
                            });
                            was.extend(ns.map(|ns| (nsid, nqn, ns)));
                        }
                    }
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
            let device = match export(nsid) {
                Ok(device) => NewDevice {
                    device,
                    controllers: vec![controller.clone()],
                },
                Err(why) => {
                    rescan.left.push(format!("namespace {nsid}: {why}"));
                    continue;
                }
            };
            let Some((_, nqn, ns)) = was.iter().find(|(n, _, _)| *n == nsid) else {
                devices.push(device);
                continue;
            };
            let name = device.device.info().name.clone();
            self.add_devices(vec![device], false)?;
            let request = NamespaceRequest {
                device: Some(name),
                nsid: Some(ns.nsid),
                uuid: Some(ns.uuid),
                nguid: Some(ns.nguid),
                ana_group: Some(ns.ana_group),
            };
            rescan.added.push(self.export(nqn, request)?);
        }
        if !devices.is_empty() {
            rescan.added.extend(self.add(devices)?);
        }
        Ok(rescan)
    }

    /// Has every reactor apply a change, and waits for each (the first failure is returned).
    fn apply(
        &self,
        subsystems: Arc<Subsystems>,
        added: Vec<(usize, NewDevice)>,
        removed: Vec<usize>,
    ) -> Result<(), String> {
        let (done, answers) = crossbeam_channel::unbounded();
        for inbox in &self.inboxes {
            inbox.change(TargetChange {
                subsystems: subsystems.clone(),
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

/// Subsystems a target serves at most (each is a few lines of the discovery log).
pub const MAX_SUBSYSTEMS: usize = 1024;

/// Subsystem `nqn` of `subsystems`, or an error naming it.
fn find<'a>(subsystems: &'a Subsystems, nqn: &str) -> Result<&'a Arc<SubsystemInfo>, String> {
    subsystems.find(nqn).ok_or_else(|| {
        format!("the target has no subsystem {nqn}: `usnvme target status` lists them")
    })
}

/// The subsystems with `changed` in place of the one of its NQN.
fn replaced(subsystems: &Subsystems, changed: Arc<SubsystemInfo>) -> Vec<Arc<SubsystemInfo>> {
    let each = subsystems.list.iter();
    each.map(|s| {
        if s.nqn == changed.nqn {
            changed.clone()
        } else {
            s.clone()
        }
    })
    .collect()
}

/// A device whose drive went: on nothing any more (a namespace with its ID attached again is a
/// new device).
fn forget(known: &mut KnownDevice) {
    known.device = None;
    known.origin = DeviceOrigin {
        drives: Vec::new(),
        nsid: None,
    };
}

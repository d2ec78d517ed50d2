//! The target's controllers: created by an admin queue's Connect (dynamic controller IDs),
//! found by the I/O queues' Connects, gone when their admin queue closes or their subsystem is
//! removed. Only Connect, connection teardown and changes of the target take its lock; no
//! command on an established queue does. (Who may connect to which subsystem is in
//! [`super::Subsystems`], which each connection has.)

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use usnvme_driver::spec::Status;

use super::ANA_GROUPS;

/// Controller IDs handed out: 1 ..= 0xFFEF (0xFFFF asks for a dynamic one).
const FIRST_CNTLID: u16 = 1;
const LAST_CNTLID: u16 = 0xffef;

/// The controllers that exist, and each port's Asymmetric Namespace Access state.
#[derive(Debug)]
pub struct Registry {
    controllers: Mutex<Controllers>,
    /// By (port ID - 1) × ANA_GROUPS + group ID - 1: the state of each ANA group as the
    /// controllers reached through that port see it. Read by every I/O command (a relaxed
    /// load), changed at run time.
    ana: Box<[AtomicU8]>,
    /// ANA state changes so far (the ANA log's change count).
    ana_changes: AtomicU64,
    /// Keep Alive commands answered so far, over every controller.
    keep_alives: AtomicU64,
}

/// Ports (listeners) whose ANA state is kept; the rest are optimized.
pub const MAX_PORTS: usize = 32;

/// A port's Asymmetric Namespace Access state (NVMe Base 2.0, 8.1.1): how the hosts that
/// reach the namespaces through it may use that path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnaState {
    Optimized = 1,
    NonOptimized = 2,
    /// I/O is refused "Asymmetric Access Inaccessible": the host goes another way.
    Inaccessible = 3,
}

impl AnaState {
    fn from_u8(v: u8) -> AnaState {
        match v {
            2 => AnaState::NonOptimized,
            3 => AnaState::Inaccessible,
            _ => AnaState::Optimized,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            AnaState::Optimized => "optimized",
            AnaState::NonOptimized => "non-optimized",
            AnaState::Inaccessible => "inaccessible",
        }
    }
}

impl std::str::FromStr for AnaState {
    type Err = String;

    fn from_str(s: &str) -> Result<AnaState, String> {
        match s {
            "optimized" => Ok(AnaState::Optimized),
            "non-optimized" => Ok(AnaState::NonOptimized),
            "inaccessible" => Ok(AnaState::Inaccessible),
            _ => Err(format!(
                "{s:?} is not an ANA state: optimized, non-optimized or inaccessible"
            )),
        }
    }
}

#[derive(Debug, Default)]
struct Controllers {
    by_id: HashMap<u16, Arc<Controller>>,
    next: u16,
    /// Controllers created since the start.
    created: u64,
}

/// One controller (an association of a host with the subsystem, or with discovery).
#[derive(Debug)]
pub struct Controller {
    cntlid: u16,
    host_nqn: String,
    /// The subsystem it is a controller of (the discovery NQN for a discovery controller).
    subnqn: String,
    discovery: bool,
    /// CSTS.RDY: I/O queues may connect only to an enabled controller.
    ready: AtomicBool,
    /// Its admin queue closed (keep-alive expiry, disconnect, protocol error): its I/O queues
    /// close too.
    gone: AtomicBool,
    /// Timer ticks at which one of its I/O queues had taken new commands since the last: the
    /// Keep Alive timer is traffic based (CTRATT.TBKAS), so I/O keeps the association alive.
    /// Counted once per tick, never per command.
    io_traffic: AtomicU64,
    /// Asynchronous events for the host (CQE dword 0 each), oldest first, until one of its
    /// Asynchronous Event Requests takes it; `has_events` says there are some without the lock.
    events: Mutex<Vec<u32>>,
    has_events: AtomicBool,
    /// The Changed Namespace List log: IDs of namespaces added or removed since the host last
    /// read it (more than the log holds: it says "too many" and the host scans them all).
    changed: Mutex<Vec<u32>>,
}

/// Asynchronous event "Discovery Log Page Change": a notice (type 2, information F0h) whose
/// log page is the discovery log (70h).
pub const DISCOVERY_LOG_CHANGED: u32 = 2 | 0xf0 << 8 | 0x70 << 16;

/// Events kept for a controller at most (more are dropped: its host is not taking them).
const EVENTS_KEPT: usize = 16;

/// Namespace IDs the Changed Namespace List log holds (4 KiB).
pub const CHANGED_LIST_ENTRIES: usize = 1024;

/// Asynchronous event "Namespace Attribute Changed": a notice (type 2, information 0) whose
/// log page is the Changed Namespace List (04h).
pub const NAMESPACE_ATTRIBUTE_CHANGED: u32 = 2 | 0x04 << 16;

impl Controller {
    pub fn cntlid(&self) -> u16 {
        self.cntlid
    }

    pub fn host_nqn(&self) -> &str {
        &self.host_nqn
    }

    pub fn subnqn(&self) -> &str {
        &self.subnqn
    }

    pub fn discovery(&self) -> bool {
        self.discovery
    }

    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    pub fn gone(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }

    pub(crate) fn go_away(&self) {
        self.gone.store(true, Ordering::Release);
    }

    /// An I/O queue of this controller took commands since its last tick.
    pub(crate) fn note_io_traffic(&self) {
        self.io_traffic.fetch_add(1, Ordering::Relaxed);
    }

    /// Changes whenever an I/O queue notes traffic.
    pub(crate) fn io_traffic(&self) -> u64 {
        self.io_traffic.load(Ordering::Relaxed)
    }

    /// Keeps event `dw0` for the host (not twice: one waiting already stands for both).
    fn raise_event(&self, dw0: u32) {
        let mut events = self.events.lock();
        if !events.contains(&dw0) && events.len() < EVENTS_KEPT {
            events.push(dw0);
        }
        self.has_events.store(true, Ordering::Release);
    }

    /// Notes namespaces `nsids` as changed; the host is told (a Namespace Attribute Changed
    /// event) only if the list was empty: until it reads the log, one notice stands for all.
    fn namespaces_changed(&self, nsids: &[u32]) {
        let mut changed = self.changed.lock();
        let first = changed.is_empty();
        for &nsid in nsids {
            if !changed.contains(&nsid) && changed.len() <= CHANGED_LIST_ENTRIES {
                changed.push(nsid);
            }
        }
        drop(changed);
        if first {
            self.raise_event(NAMESPACE_ATTRIBUTE_CHANGED);
        }
    }

    /// The Changed Namespace List log as it is now: the namespace IDs, ascending, or
    /// `[0xFFFFFFFF]` when more changed than the log holds.
    pub fn changed_namespaces(&self) -> Vec<u32> {
        let mut list = self.changed.lock().clone();
        if list.len() > CHANGED_LIST_ENTRIES {
            return vec![u32::MAX];
        }
        list.sort_unstable();
        list
    }

    /// The host read the log (without Retain Asynchronous Event): what it saw is cleared, and
    /// the next change is notified again (at once, for one that came while it read).
    pub fn clear_changed_namespaces(&self, seen: &[u32]) {
        let mut changed = self.changed.lock();
        if seen == [u32::MAX] {
            changed.clear();
        } else {
            changed.retain(|nsid| !seen.contains(nsid));
        }
        let left = !changed.is_empty();
        drop(changed);
        if left {
            self.raise_event(NAMESPACE_ATTRIBUTE_CHANGED);
        }
    }

    /// The oldest event waiting that `enabled` (the host's Asynchronous Event Configuration)
    /// lets through; those it does not are dropped. Cheap when none waits.
    pub(crate) fn take_event(&self, enabled: impl Fn(u32) -> bool) -> Option<u32> {
        if !self.has_events.load(Ordering::Acquire) {
            return None;
        }
        let mut events = self.events.lock();
        events.retain(|&dw0| enabled(dw0));
        let first = (!events.is_empty()).then(|| events.remove(0));
        self.has_events.store(!events.is_empty(), Ordering::Release);
        first
    }
}

impl Default for Registry {
    fn default() -> Registry {
        Registry::new()
    }
}

impl Registry {
    pub fn new() -> Registry {
        Registry {
            controllers: Mutex::new(Controllers {
                by_id: HashMap::new(),
                next: FIRST_CNTLID,
                created: 0,
            }),
            ana: (0..MAX_PORTS * ANA_GROUPS as usize)
                .map(|_| AtomicU8::new(AnaState::Optimized as u8))
                .collect(),
            ana_changes: AtomicU64::new(0),
            keep_alives: AtomicU64::new(0),
        }
    }

    pub(crate) fn note_keep_alive(&self) {
        self.keep_alives.fetch_add(1, Ordering::Relaxed);
    }

    /// Keep Alive commands answered so far (a host on a traffic-based controller sends none
    /// while its I/O flows).
    pub fn keep_alives(&self) -> u64 {
        self.keep_alives.load(Ordering::Relaxed)
    }

    /// Where the state of group `group` at port `port_id` is kept (both 1-based).
    fn ana_slot(&self, port_id: u16, group: u32) -> Option<&AtomicU8> {
        let port = usize::from(port_id).checked_sub(1)?;
        let group = (group as usize)
            .checked_sub(1)
            .filter(|&g| g < ANA_GROUPS as usize)?;
        self.ana.get(port * ANA_GROUPS as usize + group)
    }

    /// The ANA state of group `group` at port `port_id` (others are optimized).
    pub fn ana_state(&self, port_id: u16, group: u32) -> AnaState {
        self.ana_slot(port_id, group)
            .map_or(AnaState::Optimized, |s| {
                AnaState::from_u8(s.load(Ordering::Relaxed))
            })
    }

    /// Every group's state at port `port_id`, and the changes so far: what its controllers'
    /// ANA logs report.
    pub fn ana_view(&self, port_id: u16) -> super::admin::AnaView {
        let mut view = super::admin::AnaView::all(AnaState::Optimized, self.ana_changes());
        for (group, state) in (1..).zip(view.states.iter_mut()) {
            *state = self.ana_state(port_id, group);
        }
        view
    }

    /// ANA state changes so far.
    pub fn ana_changes(&self) -> u64 {
        self.ana_changes.load(Ordering::Acquire)
    }

    /// Puts group `group` (None: every group) at port `port_id` in `state`; on a change,
    /// counts it and raises the Asymmetric Namespace Access Change notice on every controller
    /// (each reads its ANA log again). False when nothing changed or there is no such port
    /// or group.
    pub fn set_ana_state(&self, port_id: u16, group: Option<u32>, state: AnaState) -> bool {
        let groups = match group {
            Some(g) => g..=g,
            None => 1..=ANA_GROUPS,
        };
        let mut changed = false;
        for g in groups {
            if let Some(slot) = self.ana_slot(port_id, g) {
                changed |= slot.swap(state as u8, Ordering::AcqRel) != state as u8;
            }
        }
        if !changed {
            return false;
        }
        self.ana_changes.fetch_add(1, Ordering::AcqRel);
        // notice (type 2), ANA change (information 3), log page 0Ch
        self.raise_event(2 | 3 << 8 | 0x0c << 16);
        true
    }

    /// A new controller of subsystem `subnqn` (the discovery one: `discovery`) for host
    /// `host_nqn`, with the next free ID; "Connect Controller Busy" when all are taken.
    pub fn create(
        &self,
        subnqn: &str,
        host_nqn: &str,
        discovery: bool,
    ) -> Result<Arc<Controller>, Status> {
        let mut c = self.controllers.lock();
        c.by_id.retain(|_, ctrl| !ctrl.gone());
        let span = usize::from(LAST_CNTLID - FIRST_CNTLID) + 1;
        for _ in 0..span {
            let id = c.next;
            c.next = if id == LAST_CNTLID {
                FIRST_CNTLID
            } else {
                id + 1
            };
            if c.by_id.contains_key(&id) {
                continue;
            }
            let controller = Arc::new(Controller {
                cntlid: id,
                host_nqn: host_nqn.to_string(),
                subnqn: subnqn.to_string(),
                discovery,
                ready: AtomicBool::new(false),
                gone: AtomicBool::new(false),
                io_traffic: AtomicU64::new(0),
                events: Mutex::new(Vec::new()),
                has_events: AtomicBool::new(false),
                changed: Mutex::new(Vec::new()),
            });
            c.by_id.insert(id, controller.clone());
            c.created += 1;
            return Ok(controller);
        }
        Err(Status::CONNECT_CONTROLLER_BUSY)
    }

    /// The live controller `cntlid` of host `host_nqn`.
    pub fn find(&self, cntlid: u16, host_nqn: &str) -> Option<Arc<Controller>> {
        let c = self.controllers.lock();
        c.by_id
            .get(&cntlid)
            .filter(|ctrl| !ctrl.gone() && ctrl.host_nqn == host_nqn)
            .cloned()
    }

    /// Controllers created since the start.
    pub fn created(&self) -> u64 {
        self.controllers.lock().created
    }

    /// Passes asynchronous event `dw0` (CQE dword 0) on to every live I/O controller; how
    /// many got it.
    pub fn raise_event(&self, dw0: u32) -> usize {
        let c = self.controllers.lock();
        let live = c
            .by_id
            .values()
            .filter(|ctrl| !ctrl.gone() && !ctrl.discovery);
        live.map(|ctrl| ctrl.raise_event(dw0)).count()
    }

    /// Namespaces `nsids` of subsystem `subnqn` were added or removed: every live controller
    /// of it lists them in its Changed Namespace List log and tells its host; how many
    /// controllers were told.
    pub fn namespaces_changed(&self, subnqn: &str, nsids: &[u32]) -> usize {
        let c = self.controllers.lock();
        let live = c
            .by_id
            .values()
            .filter(|ctrl| !ctrl.gone() && !ctrl.discovery && ctrl.subnqn == subnqn);
        live.map(|ctrl| ctrl.namespaces_changed(nsids)).count()
    }

    /// The discovery log changed (a subsystem added or removed, the hosts of one changed):
    /// every live discovery controller tells its host (a persistent discovery controller then
    /// reads the log again); how many were told.
    pub fn discovery_changed(&self) -> usize {
        let c = self.controllers.lock();
        let live = c
            .by_id
            .values()
            .filter(|ctrl| !ctrl.gone() && ctrl.discovery);
        live.map(|ctrl| ctrl.raise_event(DISCOVERY_LOG_CHANGED))
            .count()
    }

    /// Subsystem `subnqn` was removed: its controllers go away (their connections close, and
    /// the hosts' commands in flight end with them); how many went.
    pub fn subsystem_removed(&self, subnqn: &str) -> usize {
        let c = self.controllers.lock();
        let gone = c
            .by_id
            .values()
            .filter(|ctrl| !ctrl.gone() && ctrl.subnqn == subnqn);
        gone.map(|ctrl| ctrl.go_away()).count()
    }

    /// Controllers alive now.
    pub fn live(&self) -> usize {
        let c = self.controllers.lock();
        c.by_id.values().filter(|ctrl| !ctrl.gone()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::super::DISCOVERY_NQN;
    use super::*;

    #[test]
    fn a_subsystems_changes_and_removal_reach_its_controllers_only() {
        let r = Registry::new();
        let a = r.create("nqn.a", "h", false).expect("a");
        let b = r.create("nqn.b", "h", false).expect("b");
        let discovery = r.create(DISCOVERY_NQN, "h", true).expect("discovery");
        assert_eq!(r.namespaces_changed("nqn.a", &[1]), 1);
        assert_eq!(a.changed_namespaces(), [1]);
        assert!(b.changed_namespaces().is_empty(), "another subsystem's");
        assert_eq!(b.take_event(|_| true), None);
        assert_eq!(r.discovery_changed(), 1);
        assert_eq!(discovery.take_event(|_| true), Some(DISCOVERY_LOG_CHANGED));
        assert_eq!(a.take_event(|_| true), Some(NAMESPACE_ATTRIBUTE_CHANGED));
        assert_eq!(
            a.take_event(|_| true),
            None,
            "no discovery notice on an I/O controller"
        );
        assert_eq!(r.subsystem_removed("nqn.a"), 1);
        assert!(a.gone() && !b.gone() && !discovery.gone());
        assert!(r.find(a.cntlid(), "h").is_none());
        assert!(r.find(b.cntlid(), "h").is_some());
    }

    #[test]
    fn ids_are_dynamic_and_io_queues_find_only_their_hosts_live_controller() {
        let r = Registry::new();
        let a = r
            .create("nqn.s", "nqn.host-a", false)
            .expect("a controller");
        let b = r.create("nqn.s", "nqn.host-a", false).expect("another");
        assert_ne!(a.cntlid(), b.cntlid());
        assert!(r.find(a.cntlid(), "nqn.host-a").is_some());
        assert!(
            r.find(a.cntlid(), "nqn.host-b").is_none(),
            "another host's controller"
        );
        a.go_away();
        assert!(
            r.find(a.cntlid(), "nqn.host-a").is_none(),
            "a controller that went away"
        );
        assert_eq!(r.live(), 1);
    }

    #[test]
    fn events_reach_every_live_io_controller_once_and_as_its_host_enabled_them() {
        let r = Registry::new();
        let (a, b) = (
            r.create("nqn.s", "h", false).expect("a"),
            r.create("nqn.s", "h", false).expect("b"),
        );
        let discovery = r.create(DISCOVERY_NQN, "h", true).expect("discovery");
        b.go_away();
        let temperature = 1 | 1 << 8 | 2 << 16;
        let spare = 1 | 2 << 8 | 2 << 16;
        assert_eq!(
            r.raise_event(temperature),
            1,
            "only a: b went away, discovery has none"
        );
        assert_eq!(r.raise_event(temperature), 1);
        r.raise_event(spare);
        assert_eq!(discovery.take_event(|_| true), None);
        assert_eq!(b.take_event(|_| true), None);
        // the same event twice waits once; one the host did not enable is dropped
        assert_eq!(a.take_event(|dw0| dw0 != temperature), Some(spare));
        assert_eq!(a.take_event(|_| true), None);
    }

    #[test]
    fn namespace_changes_are_listed_per_controller_and_notified_once_until_the_log_is_read() {
        let r = Registry::new();
        let a = r.create("nqn.s", "h", false).expect("a");
        assert_eq!(r.namespaces_changed("nqn.s", &[3]), 1);
        assert_eq!(r.namespaces_changed("nqn.s", &[2, 3]), 1);
        assert_eq!(a.changed_namespaces(), [2, 3]);
        // one notice for both changes: the second came before the host read the log
        assert_eq!(a.take_event(|_| true), Some(NAMESPACE_ATTRIBUTE_CHANGED));
        assert_eq!(a.take_event(|_| true), None);
        // a change between the host's read and its clear stays listed, and is notified then
        let seen = a.changed_namespaces();
        r.namespaces_changed("nqn.s", &[7]);
        assert_eq!(a.take_event(|_| true), None, "not while the host reads");
        a.clear_changed_namespaces(&seen);
        assert_eq!(a.changed_namespaces(), [7]);
        assert_eq!(a.take_event(|_| true), Some(NAMESPACE_ATTRIBUTE_CHANGED));
        a.clear_changed_namespaces(&[7]);
        assert!(a.changed_namespaces().is_empty());
        assert_eq!(a.take_event(|_| true), None);
        // once read, the next change is notified again
        r.namespaces_changed("nqn.s", &[4]);
        assert_eq!(a.take_event(|_| true), Some(NAMESPACE_ATTRIBUTE_CHANGED));
        a.clear_changed_namespaces(&[4]);
        // more than the log holds: "too many" (FFFFFFFFh alone), then cleared whole
        let many: Vec<u32> = (1..=CHANGED_LIST_ENTRIES as u32 + 1).collect();
        r.namespaces_changed("nqn.s", &many);
        assert_eq!(a.changed_namespaces(), [u32::MAX]);
        a.clear_changed_namespaces(&[u32::MAX]);
        assert!(a.changed_namespaces().is_empty());
    }
}

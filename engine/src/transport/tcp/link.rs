//! A remote controller's association as its I/O queues and its controller thread share it:
//! which association is current (a generation, bumped at each reconnect), whether it is live,
//! down (being reconnected) or lost for good, and how many times it was reconnected.
//!
//! An I/O queue reads the generation once per poll (one atomic load) and does anything more
//! only when it changed or its own connection ended: then it reports the association down
//! ([`ControllerLink::report_down`]), keeps its unfinished I/Os, and waits for the next
//! generation (it connects to the new controller and sends them again) or the loss (it fails
//! them). The controller thread ([`crate::block::remote`]) reconnects as the
//! [`ReconnectPolicy`] says, as Linux's host does (`reconnect_delay`, `ctrl_loss_tmo`).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// The generation of a controller given up for good.
const LOST: u64 = u64::MAX;

/// A path's Asymmetric Namespace Access state, as the ANA log and path statuses give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnaState {
    Optimized,
    NonOptimized,
    Inaccessible,
    PersistentLoss,
    Change,
}

impl AnaState {
    /// From the ANA log's state field (unknown values: optimized, as a controller without
    /// ANA is).
    pub fn from_log(state: u8) -> AnaState {
        match state & 0xf {
            2 => AnaState::NonOptimized,
            3 => AnaState::Inaccessible,
            4 => AnaState::PersistentLoss,
            0xf => AnaState::Change,
            _ => AnaState::Optimized,
        }
    }

    /// What a path-related status (SCT 3) says of the path, if anything.
    pub fn from_status(status: usnvme_driver::spec::Status) -> Option<AnaState> {
        use usnvme_driver::spec::Status;
        match status {
            Status::ANA_INACCESSIBLE => Some(AnaState::Inaccessible),
            Status::ANA_PERSISTENT_LOSS => Some(AnaState::PersistentLoss),
            Status::ANA_TRANSITION => Some(AnaState::Change),
            _ => None,
        }
    }

    /// Whether I/O goes this way: optimized first, non-optimized when no path is.
    pub fn usable(self) -> bool {
        matches!(self, AnaState::Optimized | AnaState::NonOptimized)
    }

    fn code(self) -> u8 {
        match self {
            AnaState::Optimized => 1,
            AnaState::NonOptimized => 2,
            AnaState::Inaccessible => 3,
            AnaState::PersistentLoss => 4,
            AnaState::Change => 0xf,
        }
    }
}

/// When and for how long a lost connection is tried again (Linux's `reconnect_delay` and
/// `ctrl_loss_tmo`, with its defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconnectPolicy {
    /// Between two attempts (the first too: a restarting target needs a moment).
    pub delay: Duration,
    /// How long after the loss attempts go on; `None`: for ever. `Some(0)`: no attempt, the
    /// controller's I/O fails at once.
    pub give_up_after: Option<Duration>,
}

impl Default for ReconnectPolicy {
    fn default() -> Self {
        ReconnectPolicy {
            delay: Duration::from_secs(10),
            give_up_after: Some(Duration::from_secs(600)),
        }
    }
}

impl ReconnectPolicy {
    /// No reconnecting: a lost connection fails the controller's I/O at once.
    pub const NEVER: ReconnectPolicy = ReconnectPolicy {
        delay: Duration::ZERO,
        give_up_after: Some(Duration::ZERO),
    };

    /// The policy from Linux's options in seconds: `reconnect_delay`, and `ctrl_loss_tmo`
    /// (0: give up at once, negative: never).
    pub fn from_secs(reconnect_delay: u32, ctrl_loss_tmo: i32) -> ReconnectPolicy {
        ReconnectPolicy {
            delay: Duration::from_secs(u64::from(reconnect_delay)),
            give_up_after: u64::try_from(ctrl_loss_tmo).ok().map(Duration::from_secs),
        }
    }

    /// How many attempts before giving up, as Linux counts them (`ctrl_loss_tmo` over
    /// `reconnect_delay`, rounded up); `None`: no limit.
    pub fn attempts(&self) -> Option<u64> {
        self.give_up_after.map(|limit| {
            let delay = self.delay.as_millis().max(1);
            limit.as_millis().div_ceil(delay).min(u128::from(u64::MAX)) as u64
        })
    }
}

/// Where the association stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkState {
    /// Connected: the controller ID I/O queues connect to.
    Live { cntlid: u16 },
    /// Lost, being reconnected (why).
    Down { why: String },
    /// Given up (why): every I/O to it fails.
    Lost { why: String },
}

/// The shared state of one remote controller's association.
#[derive(Debug)]
pub struct ControllerLink {
    /// The controller's name in messages (`tcp://ADDR:PORT/NQN`).
    name: String,
    generation: AtomicU64,
    state: Mutex<Shared>,
    /// Wakes the controller thread: an association reported down, or stop.
    wake: Condvar,
    reconnects: AtomicU32,
    /// The path's ANA state ([`AnaState`]'s log code).
    ana: AtomicU8,
    /// An I/O queue saw completions since the controller thread last looked: on a controller
    /// with traffic-based Keep Alive, that period needs no Keep Alive.
    traffic: AtomicBool,
}

/// What the lock guards.
#[derive(Debug)]
struct Shared {
    state: LinkState,
    /// The controller thread is told to stop.
    stopping: bool,
    /// No more reconnecting (why): the owner is ending (Ctrl-C); a loss is final.
    final_loss: Option<String>,
}

/// What the controller thread woke up for.
#[derive(Debug, PartialEq, Eq)]
pub enum Wake {
    /// Its period passed (time for a Keep Alive).
    Period,
    /// The association is down (a queue reported it): reconnect.
    Down,
    Stop,
}

impl ControllerLink {
    /// A live association with controller `cntlid` of `name`, generation 1.
    pub fn new(name: String, cntlid: u16) -> ControllerLink {
        ControllerLink {
            name,
            generation: AtomicU64::new(1),
            state: Mutex::new(Shared {
                state: LinkState::Live { cntlid },
                stopping: false,
                final_loss: None,
            }),
            wake: Condvar::new(),
            reconnects: AtomicU32::new(0),
            ana: AtomicU8::new(1),
            traffic: AtomicBool::new(false),
        }
    }

    /// An I/O queue's poll completed commands. A load, and a store only the first time in a
    /// period: the cache line is written once per Keep Alive period, not per I/O.
    #[inline]
    pub fn note_traffic(&self) {
        if !self.traffic.load(Ordering::Relaxed) {
            self.traffic.store(true, Ordering::Relaxed);
        }
    }

    /// Whether I/O completed since the last call.
    pub fn take_traffic(&self) -> bool {
        self.traffic.swap(false, Ordering::Relaxed)
    }

    /// The current association (changes at each reconnect, and when given up).
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Where the association stands now.
    pub fn state(&self) -> LinkState {
        self.state.lock().state.clone()
    }

    /// Why the controller was given up, once it was.
    pub fn lost(&self) -> Option<String> {
        match self.state() {
            LinkState::Lost { why } => Some(why),
            _ => None,
        }
    }

    /// The path's ANA state, as last read or learned from a status.
    #[inline]
    pub fn ana(&self) -> AnaState {
        AnaState::from_log(self.ana.load(Ordering::Relaxed))
    }

    /// Sets the path's ANA state; whether it changed.
    pub fn set_ana(&self, state: AnaState) -> bool {
        self.ana.swap(state.code(), Ordering::Relaxed) != state.code()
    }

    /// How many times the association was made again.
    pub fn reconnects(&self) -> u32 {
        self.reconnects.load(Ordering::Relaxed)
    }

    /// A connection of association `generation` ended (`why`): if that is still the live
    /// one, it is down and the controller thread reconnects. (Reports of an older association,
    /// or while already down, change nothing.)
    pub fn report_down(&self, generation: u64, why: &str) {
        let mut shared = self.state.lock();
        if generation != self.generation() || !matches!(shared.state, LinkState::Live { .. }) {
            return;
        }
        if let Some(end) = &shared.final_loss {
            let why = format!("{why} ({end}: not reconnecting)");
            self.lose(&mut shared, why);
            return;
        }
        log::warn!("{}: connection lost ({why}): reconnecting", self.name);
        shared.state = LinkState::Down {
            why: why.to_owned(),
        };
        self.wake.notify_all();
    }

    /// The controller thread: waits at most `period` (for ever when `None`) for the
    /// association to go down, or for stop.
    pub fn wait(&self, period: Option<Duration>) -> Wake {
        let deadline = period.map(|p| Instant::now() + p);
        let mut shared = self.state.lock();
        loop {
            if shared.stopping {
                return Wake::Stop;
            }
            if matches!(shared.state, LinkState::Down { .. }) {
                return Wake::Down;
            }
            match deadline {
                Some(at) => {
                    if self.wake.wait_until(&mut shared, at).timed_out() {
                        return if shared.stopping {
                            Wake::Stop
                        } else {
                            Wake::Period
                        };
                    }
                }
                None => self.wake.wait(&mut shared),
            }
        }
    }

    /// Sleeps `d` between reconnect attempts; false if told to stop, or given up, meanwhile.
    pub fn sleep(&self, d: Duration) -> bool {
        let at = Instant::now() + d;
        let mut shared = self.state.lock();
        let over = |s: &Shared| s.stopping || matches!(s.state, LinkState::Lost { .. });
        while !over(&shared) {
            if self.wake.wait_until(&mut shared, at).timed_out() {
                break;
            }
        }
        !over(&shared)
    }

    /// The controller thread made a new association with controller `cntlid`: the queues
    /// connect to it and send their unfinished I/Os again. False if it was given up meanwhile
    /// (the new controller is not used).
    pub fn reconnected(&self, cntlid: u16) -> bool {
        let mut shared = self.state.lock();
        if matches!(shared.state, LinkState::Lost { .. }) {
            return false;
        }
        shared.state = LinkState::Live { cntlid };
        self.reconnects.fetch_add(1, Ordering::Relaxed);
        self.generation.fetch_add(1, Ordering::Release);
        true
    }

    /// The controller thread gave up (`why`): every queue fails its I/O.
    pub fn give_up(&self, why: String) {
        let mut shared = self.state.lock();
        self.lose(&mut shared, why);
    }

    /// No more reconnecting (the owner ends, `why`): a controller being reconnected is given
    /// up now, one lost later at once.
    pub fn stop_reconnecting(&self, why: &str) {
        let mut shared = self.state.lock();
        shared.final_loss = Some(why.to_owned());
        if let LinkState::Down { why: lost, .. } = &shared.state {
            let why = format!("{lost} ({why}: not reconnecting)");
            self.lose(&mut shared, why);
        }
    }

    fn lose(&self, shared: &mut Shared, why: String) {
        shared.state = LinkState::Lost { why };
        self.generation.store(LOST, Ordering::Release);
        self.wake.notify_all();
    }

    /// Tells the controller thread to stop.
    pub fn stop(&self) {
        self.state.lock().stopping = true;
        self.wake.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_of_the_live_association_takes_it_down_once_and_a_reconnect_makes_the_next() {
        let link = ControllerLink::new("t".into(), 7);
        assert_eq!(link.wait(Some(Duration::from_millis(1))), Wake::Period);
        link.report_down(0, "an old one");
        assert_eq!(link.state(), LinkState::Live { cntlid: 7 });
        link.report_down(1, "closed");
        assert!(matches!(link.state(), LinkState::Down { why, .. } if why == "closed"));
        link.report_down(1, "again");
        assert!(matches!(link.state(), LinkState::Down { why, .. } if why == "closed"));
        assert_eq!(link.wait(None), Wake::Down);
        link.reconnected(9);
        assert_eq!(
            (link.generation(), link.state(), link.reconnects()),
            (2, LinkState::Live { cntlid: 9 }, 1)
        );
        link.give_up("gone".into());
        assert_eq!(link.lost().as_deref(), Some("gone"));
        assert_eq!(link.generation(), LOST);
        assert!(!link.reconnected(3), "a controller given up stays so");
        assert!(
            !link.sleep(Duration::from_secs(60)),
            "no attempt after giving up"
        );
        link.stop();
        assert_eq!(link.wait(None), Wake::Stop);
        assert!(!link.sleep(Duration::from_secs(60)));
    }

    #[test]
    fn once_told_to_stop_reconnecting_a_loss_is_final() {
        let link = ControllerLink::new("t".into(), 1);
        link.report_down(1, "closed");
        link.stop_reconnecting("interrupted");
        assert_eq!(
            link.lost().as_deref(),
            Some("closed (interrupted: not reconnecting)")
        );
        let live = ControllerLink::new("t".into(), 1);
        live.stop_reconnecting("interrupted");
        assert_eq!(live.state(), LinkState::Live { cntlid: 1 });
        live.report_down(1, "reset");
        assert_eq!(
            live.lost().as_deref(),
            Some("reset (interrupted: not reconnecting)")
        );
    }

    #[test]
    fn the_policy_counts_attempts_as_linux_does() {
        assert_eq!(ReconnectPolicy::default().attempts(), Some(60));
        assert_eq!(ReconnectPolicy::NEVER.attempts(), Some(0));
        let policy = |delay, limit: Option<u64>| ReconnectPolicy {
            delay: Duration::from_secs(delay),
            give_up_after: limit.map(Duration::from_secs),
        };
        assert_eq!(policy(10, None).attempts(), None);
        assert_eq!(policy(10, Some(5)).attempts(), Some(1));
        assert_eq!(policy(2, Some(5)).attempts(), Some(3));
    }
}

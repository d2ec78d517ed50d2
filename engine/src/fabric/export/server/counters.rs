//! The target's live figures, and each reactor's busy clock that feeds them in batches.

use std::sync::atomic::{AtomicU64, Ordering};

/// Live figures for the status line.
#[derive(Debug, Default)]
pub struct Counters {
    pub connections: AtomicU64,
    pub commands: AtomicU64,
    /// Bytes sent to hosts.
    pub bytes: AtomicU64,
    /// DMA buffers held by commands now (0 when nothing is in flight: none leaked).
    pub buffers_in_use: AtomicU64,
    /// Commands that could not start when they came (no DMA buffer free, or no room in their
    /// device's queue) and waited for it, so far.
    pub commands_waited: AtomicU64,
    /// Write data that was read ahead with a header and copied into a DMA buffer, over the
    /// connections closed so far (the rest went straight from the socket into the buffers).
    pub data_copied: AtomicU64,
    /// Reactor time, summed over the reactors, and the part of it spent in turns that did
    /// work (bytes arrived, commands completed, responses went out): a polling reactor owns
    /// its core whole, but this is the share of it the target needed.
    pub reactor_ns: AtomicU64,
    pub reactor_busy_ns: AtomicU64,
    /// CPU time the reactor threads used (user and system): what sleeping saves.
    pub reactor_cpu_ns: AtomicU64,
}

/// How much reactor time a job gathers before it adds it to the shared counters (one shared
/// write per reactor every few milliseconds, not one per turn).
const PUBLISH_NS: u64 = 10_000_000;

/// One reactor's busy and total time since it last published them.
#[derive(Debug, Default)]
pub(super) struct BusyClock {
    /// The reactor's clock at the previous turn, and whether that turn did work.
    pub(super) last_turn_ns: Option<u64>,
    last_busy: bool,
    total_ns: u64,
    busy_ns: u64,
    /// The thread's CPU time when last published.
    pub(super) cpu_ns: u64,
}

/// CPU time (user and system) of the calling thread, in nanoseconds.
pub(super) fn thread_cpu_ns() -> u64 {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_THREAD).map_or(0, |u| {
        let ns = |t: nix::sys::time::TimeVal| {
            t.tv_sec() as u64 * 1_000_000_000 + t.tv_usec() as u64 * 1000
        };
        ns(u.user_time()) + ns(u.system_time())
    })
}

impl BusyClock {
    /// Charges the time since the previous turn to that turn; `busy`: this turn did work.
    pub(super) fn turn(&mut self, now_ns: u64, busy: bool, counters: &Counters) {
        if let Some(last) = self.last_turn_ns {
            let spent = now_ns.saturating_sub(last);
            self.total_ns += spent;
            if self.last_busy {
                self.busy_ns += spent;
            }
        }
        self.last_turn_ns = Some(now_ns);
        self.last_busy = busy;
        if self.total_ns >= PUBLISH_NS {
            self.publish(counters);
        }
    }

    pub(super) fn publish(&mut self, counters: &Counters) {
        counters
            .reactor_ns
            .fetch_add(std::mem::take(&mut self.total_ns), Ordering::Relaxed);
        counters
            .reactor_busy_ns
            .fetch_add(std::mem::take(&mut self.busy_ns), Ordering::Relaxed);
        let cpu = thread_cpu_ns();
        counters
            .reactor_cpu_ns
            .fetch_add(cpu.saturating_sub(self.cpu_ns), Ordering::Relaxed);
        self.cpu_ns = cpu;
    }
}

#[cfg(test)]
mod tests {
    use super::{BusyClock, Counters, PUBLISH_NS};
    use std::sync::atomic::Ordering;

    #[test]
    fn a_turns_time_is_busy_only_when_it_did_work_and_is_published_in_batches() {
        let counters = Counters::default();
        let mut clock = BusyClock::default();
        let ms = 1_000_000;
        // turns at 0, 1, 2, 3 ms: the first and third did work
        clock.turn(0, true, &counters);
        clock.turn(ms, false, &counters);
        clock.turn(2 * ms, true, &counters);
        clock.turn(3 * ms, false, &counters);
        // under PUBLISH_NS gathered: nothing shared yet
        assert_eq!(counters.reactor_ns.load(Ordering::Relaxed), 0);
        // a long idle stretch crosses the batch: published, 2 ms of 3 + 20 busy
        clock.turn(3 * ms + 2 * PUBLISH_NS, false, &counters);
        assert_eq!(
            counters.reactor_ns.load(Ordering::Relaxed),
            3 * ms + 2 * PUBLISH_NS
        );
        assert_eq!(counters.reactor_busy_ns.load(Ordering::Relaxed), 2 * ms);
        // what is left is published at the end
        clock.turn(3 * ms + 2 * PUBLISH_NS + ms, true, &counters);
        clock.publish(&counters);
        assert_eq!(
            counters.reactor_ns.load(Ordering::Relaxed),
            4 * ms + 2 * PUBLISH_NS
        );
        assert_eq!(counters.reactor_busy_ns.load(Ordering::Relaxed), 2 * ms);
    }
}

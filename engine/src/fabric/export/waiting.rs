//! Commands that cannot start when they come — no DMA buffer free, no room in their device's
//! queue — wait here, in arrival order, and start when room comes: a host's I/O is never
//! refused for want of the target's resources (a host may have as many commands outstanding as
//! its queues' sizes let it; only what it sends beyond them is refused, as a protocol error).
//!
//! One [`Waiting`] per reactor (and one in the memory backend of the tests and the fuzzer). A
//! connection asks for a buffer or submits; when the backend says "not now" the connection
//! keeps the command in its slot and the backend queues a [`Waiter`]. After completions come
//! back (which free buffers and device room) the owner runs a retry pass: each waiter in order
//! is offered to its connection again ([`Connection::resume`](super::connection::Connection)).
//!
//! The [`Gate`] keeps the order per resource: once a waiter found no buffer, later commands do
//! not take one ahead of it (they queue behind), and likewise per device for queue room; a
//! waiter for another device, or one that already holds its buffer, goes on. Nothing here
//! allocates per command: the queue's capacity grows when connections are accepted.

use std::collections::VecDeque;

/// One command waiting: the connection it belongs to (the owner's key: a reactor's connection
/// slot) and its token there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiter {
    pub conn: u32,
    pub token: u16,
}

/// Which resources have commands waiting for them: a new command does not take what an older
/// one waits for.
#[derive(Debug, Default)]
pub struct Gate {
    /// A waiter found no DMA buffer: of the usual size (0), or a large one (1).
    buffers_short: [bool; 2],
    /// Per device: a waiter found its queue full.
    full: Vec<bool>,
    /// Something was released or completed since the last retry pass: worth one.
    freed: bool,
}

impl Gate {
    /// Whether a command may take a buffer (a `large` one, or one of the usual size) now:
    /// none waits for one of that kind.
    pub fn buffers_open(&self, large: bool) -> bool {
        !self.buffers_short[usize::from(large)]
    }

    /// No buffer of the kind was free: later commands for one queue behind this one.
    pub fn no_buffer(&mut self, large: bool) {
        self.buffers_short[usize::from(large)] = true;
    }

    /// Whether a command may be submitted to `device` now (none waits for its room).
    pub fn room_open(&self, device: usize) -> bool {
        !self.full.get(device).copied().unwrap_or(false)
    }

    /// `device`'s queue was full: later commands for it queue behind this one.
    pub fn no_room(&mut self, device: usize) {
        if let Some(full) = self.full.get_mut(device) {
            *full = true;
        }
    }

    /// A buffer was released, or a device completed commands: waiters may start now.
    pub fn freed(&mut self) {
        self.freed = true;
    }
}

/// The waiting commands of one reactor, in arrival order, and their [`Gate`].
#[derive(Debug, Default)]
pub struct Waiting {
    queue: VecDeque<Waiter>,
    pub gate: Gate,
    /// Commands that had to wait, since the owner last took the count.
    waited: u64,
}

impl Waiting {
    /// Room for `commands` waiters in all (the commands the connections can have in flight
    /// together) and the gate for `devices` devices; allocates only when they grow (a
    /// connection accepted, a device added), never per command.
    pub fn size_for(&mut self, commands: usize, devices: usize) {
        if self.queue.capacity() < commands {
            self.queue.reserve(commands - self.queue.len());
        }
        if self.gate.full.len() < devices {
            self.gate.full.resize(devices, false);
        }
    }

    /// Command `token` of connection `conn` waits.
    pub fn push(&mut self, conn: u32, token: u16) {
        self.waited += 1;
        self.queue.push_back(Waiter { conn, token });
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Commands that had to wait since the last call.
    pub fn take_waited(&mut self) -> u64 {
        std::mem::take(&mut self.waited)
    }

    /// Connection `conn` is gone: its waiters go too (its slot may be another's next).
    pub fn forget(&mut self, conn: u32) {
        self.queue.retain(|w| w.conn != conn);
    }

    /// Starts a retry pass when there are waiters and something was freed since the last one,
    /// or nothing is in flight (`idle`: nothing will free anything, and the gate may be closed
    /// by waiters gone meanwhile, their connection closed): the gate opens (every resource is
    /// tried anew, in order) and the waiters are handed out to be offered to their
    /// connections, in order; [`Waiting::end_retry`] takes back those that still wait.
    /// Meanwhile the backend may queue new waiters here as usual.
    pub fn begin_retry(&mut self, idle: bool) -> Option<VecDeque<Waiter>> {
        if self.queue.is_empty() || !(std::mem::take(&mut self.gate.freed) || idle) {
            return None;
        }
        self.gate.buffers_short = [false; 2];
        self.gate.full.fill(false);
        Some(std::mem::take(&mut self.queue))
    }

    /// Ends a retry pass: `still` (the waiters that could not start, in their order) go first,
    /// then any queued during the pass.
    pub fn end_retry(&mut self, mut still: VecDeque<Waiter>) {
        still.append(&mut self.queue);
        self.queue = still;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_pass_keeps_the_order_of_those_still_waiting_and_closes_the_gate_behind_them() {
        let mut waiting = Waiting::default();
        waiting.size_for(8, 2);
        for token in 0..4 {
            waiting.push(0, token);
        }
        assert_eq!(waiting.take_waited(), 4);
        assert!(waiting.begin_retry(false).is_none(), "nothing freed yet");
        waiting.gate.freed();
        let mut queue = waiting.begin_retry(false).expect("a pass");
        // tokens 0 and 2 start; 1 finds no large buffer, 3 no room on device 1
        queue.retain(|w| match w.token {
            1 => {
                waiting.gate.no_buffer(true);
                true
            }
            3 => {
                waiting.gate.no_room(1);
                true
            }
            _ => false,
        });
        waiting.push(5, 9); // queued during the pass: after those still waiting
        waiting.end_retry(queue);
        let order: Vec<u16> = waiting.queue.iter().map(|w| w.token).collect();
        assert_eq!(order, [1, 3, 9]);
        assert!(!waiting.gate.buffers_open(true));
        assert!(
            waiting.gate.buffers_open(false),
            "one waiting for a large buffer holds up no small one"
        );
        assert!(!waiting.gate.room_open(1));
        assert!(waiting.gate.room_open(0));
        // the next pass opens the gate again; with nothing in flight, one runs unasked
        let queue = waiting.begin_retry(true).expect("a pass when idle");
        assert!(waiting.gate.buffers_open(true) && waiting.gate.room_open(1));
        waiting.end_retry(queue);
        waiting.forget(5);
        assert_eq!(waiting.len(), 2);
    }
}

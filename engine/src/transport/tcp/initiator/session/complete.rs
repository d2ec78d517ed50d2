//! Completions (held back while a command's data is still being sent), the command timeout,
//! and the end of the queue: what is in flight then fails with the reason.

use usnvme_driver::spec::Status;

use usnvme_driver::IoBuffer;

use super::{Completion, Dir, Failure, IoNamespace, IoShape, Phase, Session, Slot, Unfinished};

impl Session {
    /// Command `index` completed with `status`: to the handler, unless its data is still
    /// being sent (then once it is).
    pub(super) fn complete(
        &mut self,
        index: u16,
        status: Status,
        dw: [u32; 2],
        on_done: &mut impl FnMut(Completion),
    ) {
        let s = &mut self.slots[index as usize];
        s.dw = dw;
        let result = if !status.is_success() {
            Err(Failure::Status(status))
        } else if s.corrupt {
            Err(Failure::DataDigest)
        } else {
            Ok(())
        };
        if s.unsent > 0 {
            if s.deferred.is_none() {
                s.deferred = Some(result);
                self.deferred += 1;
            }
            return;
        }
        self.finish(index, result, on_done);
    }

    fn finish(
        &mut self,
        index: u16,
        result: Result<(), Failure>,
        on_done: &mut impl FnMut(Completion),
    ) {
        let s = self.slots[index as usize];
        self.slots[index as usize] = Slot {
            generation: s.generation,
            ..Slot::default()
        };
        self.free.push(index);
        self.in_flight -= 1;
        if let (Some(rerouted), Err(Failure::Status(status)), Some(io)) =
            (&mut self.rerouted, result, s.io)
        {
            if status.sct() == 3 && rerouted.len() < rerouted.capacity() {
                rerouted.push((unfinished(&s, io), status));
                return;
            }
        }
        on_done(Completion {
            token: s.token,
            nsid: s.nsid,
            result,
            submitted_ns: s.since_ns,
            bytes: if s.dir == Dir::None { 0 } else { s.len },
            dw0: s.dw[0],
            dw1: s.dw[1],
        });
    }

    /// Delivers the completions that waited for their data to be sent, and once the queue
    /// ended, fails everything in flight (nothing is sent from the buffers any more).
    pub fn deliver(&mut self, on_done: &mut impl FnMut(Completion)) {
        if let Some(reason) = self.ended {
            // (the slots' `unsent` go with the slots, just below)
            self.tx.clear(|_| {});
            self.deferred = 0;
            for index in 0..self.slots.len() as u16 {
                let s = self.slots[index as usize];
                let result = match s.deferred {
                    Some(r) => r,
                    // kept for `take_unfinished`
                    None if self.keep_unfinished && s.io.is_some() => continue,
                    None if s.timed_out => Err(Failure::TimedOut),
                    None => Err(reason),
                };
                if s.busy {
                    self.finish(index, result, on_done);
                }
            }
            return;
        }
        if self.deferred == 0 {
            return;
        }
        for index in 0..self.slots.len() as u16 {
            let s = self.slots[index as usize];
            if let (true, 0, Some(result)) = (s.busy, s.unsent, s.deferred) {
                self.deferred -= 1;
                self.finish(index, result, on_done);
            }
        }
    }

    /// When the queue ends, keep its unfinished I/Os (those the target did not complete) for
    /// [`Session::take_unfinished`] instead of failing them: the owner sends them again on a
    /// new connection.
    pub fn keep_unfinished(&mut self, keep: bool) {
        self.keep_unfinished = keep;
    }

    /// Once the queue ended: hands over every I/O it had not finished (see
    /// [`Session::keep_unfinished`]); they are no longer in flight here.
    pub fn take_unfinished(&mut self, mut take: impl FnMut(Unfinished)) {
        if self.ended.is_none() {
            return;
        }
        for index in 0..self.slots.len() {
            let s = self.slots[index];
            let (true, None, Some(io)) = (s.busy, s.deferred, s.io) else {
                continue;
            };
            self.slots[index] = Slot {
                generation: s.generation,
                ..Slot::default()
            };
            self.free.push(index as u16);
            self.in_flight -= 1;
            take(unfinished(&s, io));
        }
    }

    /// Keep I/Os the target refuses for a path-related reason (SCT 3) for
    /// [`Session::take_rerouted`] instead of completing them: the owner has other paths.
    pub fn reroute_path_errors(&mut self) {
        self.rerouted = Some(Vec::with_capacity(self.slots.len()));
    }

    /// The I/Os kept by [`Session::reroute_path_errors`] since the last call, with the
    /// status each was refused with.
    pub fn take_rerouted(&mut self, mut take: impl FnMut(Unfinished, Status)) {
        if let Some(rerouted) = &mut self.rerouted {
            for (u, status) in rerouted.drain(..) {
                take(u, status);
            }
        }
    }

    /// Ends the queue if a command outlived the timeout (checked a few times per timeout).
    pub fn check_timeouts(&mut self) {
        let now = self.now_ns;
        if self.in_flight == 0 || now < self.next_timeout_check || self.ended.is_some() {
            return;
        }
        let timeout = self.params.timeout_ns.max(1);
        self.next_timeout_check = now.saturating_add((timeout / 4).max(1_000_000));
        let mut late = false;
        for s in self.slots.iter_mut() {
            if s.busy && s.deferred.is_none() && now.saturating_sub(s.submitted_ns) > timeout {
                s.timed_out = true;
                late = true;
            }
        }
        if late {
            log::log!(
                self.log_level(),
                "NVMe/TCP queue {}: a command timed out: closing the queue",
                self.params.qid
            );
            self.end(Failure::Aborted);
        }
    }

    /// The owner closes the queue: what is in flight fails as aborted on the next
    /// [`Session::deliver`].
    pub fn close(&mut self) {
        self.end(Failure::Aborted);
    }

    /// The connection is gone (a socket error).
    pub fn peer_gone(&mut self) {
        self.end(Failure::Closed);
    }

    /// How loud the queue's own failures are: an I/O queue's go to many I/Os and are logged;
    /// an admin queue's client reports each to its caller, so they are only debug output.
    pub(super) fn log_level(&self) -> log::Level {
        if self.params.qid == 0 {
            log::Level::Debug
        } else {
            log::Level::Warn
        }
    }

    pub(super) fn end(&mut self, reason: Failure) {
        if self.ended.is_none() {
            self.ended = Some(reason);
            self.phase = Phase::Ended;
        }
    }
}

/// What it takes to send slot `s`'s I/O again.
fn unfinished(s: &Slot, io: IoShape) -> Unfinished {
    Unfinished {
        ns: IoNamespace {
            nsid: s.nsid,
            block_size: io.block_size,
        },
        op: io.op,
        slba: io.slba,
        blocks: io.blocks,
        buf: io.op.has_data().then_some(IoBuffer {
            iova: s.iova,
            len: s.len,
        }),
        token: s.token,
        since_ns: s.since_ns,
    }
}

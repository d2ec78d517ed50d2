//! How a connection ends: a shutdown (CC.SHN) flushes the drives first; the timers close a
//! connection without its ICReq, with a PDU stalled half received, without Keep Alive, or of a
//! controller gone; a protocol error sends a C2HTermReq; the host goes away or the target
//! stops. Commands not yet with the backend are dropped, the others drain.

use std::time::{Duration, Instant};

use usnvme_driver::spec::Status;

use super::rdma::RdmaOp;
use super::transmit::Sending;
use super::{Backend, Connection, Phase, Role, Slot};
use crate::block::Op;
use crate::fabric::framing::Buffers;
use crate::fabric::pdu::{self, FatalError, PduType};

/// A connection that has not sent its ICReq this long after it opened is closed (a port
/// scanner, a stuck host): it holds buffers another host could use.
pub const ICREQ_TIMEOUT: Duration = Duration::from_secs(10);
/// A PDU left half received this long is a stalled host: the connection is closed. The Keep
/// Alive timeout the host set on its admin queue, where known, else this.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(15);

impl Connection {
    /// Timers: an admin queue whose host showed no sign of life (an admin command, or I/O on
    /// any of its controller's queues: traffic-based Keep Alive) within twice KATO ends its
    /// association; an I/O queue of a controller that went away ends too; SMART answers are
    /// collected. Call every few milliseconds.
    pub fn tick(&mut self, now: Instant, backend: &mut dyn Backend) {
        self.poll_smart(backend);
        self.deliver_events();
        let sq_taken = self.sq_taken;
        let why = self.stalled(now).or_else(|| match &mut self.role {
            Role::Admin { controller, .. } if controller.gone() => Some(format!(
                "controller {} went away (its subsystem was removed)",
                controller.cntlid()
            )),
            Role::Admin {
                features,
                controller,
                last_keep_alive,
                io_traffic_seen,
                ..
            } => {
                let traffic = controller.io_traffic();
                if traffic != *io_traffic_seen {
                    (*io_traffic_seen, *last_keep_alive) = (traffic, now);
                }
                let kato = Duration::from_millis(features.keep_alive_ms().into());
                (!kato.is_zero() && now.saturating_duration_since(*last_keep_alive) > 2 * kato)
                    .then(|| format!("no Keep Alive nor I/O within {} ms", 2 * kato.as_millis()))
            }
            Role::Io { controller, .. } if controller.gone() => {
                Some(format!("controller {} went away", controller.cntlid()))
            }
            Role::Io {
                controller,
                taken_at_tick,
                ..
            } => {
                if *taken_at_tick != sq_taken {
                    *taken_at_tick = sq_taken;
                    controller.note_io_traffic();
                }
                None
            }
            Role::None => None,
        });
        if let Some(why) = why {
            if self.closed.is_none() {
                log::warn!("{}: {why}: closing", self.peer);
            }
            self.close(why, backend);
        }
    }

    /// Why the connection is to close for a host that stopped sending: no ICReq within
    /// [`ICREQ_TIMEOUT`] of opening, or a PDU half received and nothing more for the stall
    /// timeout. (Between PDUs a host may be quiet for as long as it likes: Keep Alive
    /// watches that.)
    fn stalled(&mut self, now: Instant) -> Option<String> {
        let opened = *self.opened.get_or_insert(now);
        if self.phase == Phase::AwaitIcReq && now.saturating_duration_since(opened) > ICREQ_TIMEOUT
        {
            return Some(format!("no ICReq within {} s", ICREQ_TIMEOUT.as_secs()));
        }
        let received = self.rx.received();
        let (count, since) = *self.progress.get_or_insert((received, now));
        if count != received {
            self.progress = Some((received, now));
            return None;
        }
        let quiet = now.saturating_duration_since(since);
        let mid_pdu = self.rx.mid_pdu();
        let limit = match &self.role {
            Role::Admin { features, .. } if features.keep_alive_ms() > 0 => {
                Duration::from_millis(features.keep_alive_ms().into())
            }
            _ => STALL_TIMEOUT,
        };
        (mid_pdu && self.phase != Phase::Closing && quiet > limit).then(|| {
            format!(
                "a PDU half received and nothing more for {} ms",
                quiet.as_millis()
            )
        })
    }

    pub(super) fn shutting_down(&self) -> bool {
        matches!(&self.role, Role::Admin { registers, .. } if registers.shutdown_requested())
    }

    /// A shutdown (CC.SHN) flushes the drives' volatile write caches: a Flush to every
    /// exported namespace, as one command of this queue's (its parts count down as for a
    /// Dataset Management); CSTS.SHST reports shutdown complete when all are done.
    pub(super) fn flush_for_shutdown(&mut self, backend: &mut dyn Backend) {
        let Role::Admin {
            registers,
            controller,
            ..
        } = &mut self.role
        else {
            return;
        };
        let started = self.slots.iter().any(|s| s.busy && s.shutdown_flush);
        if !registers.shutting_down() || started {
            return;
        }
        let count = self.subsystem.namespaces.len();
        let token = self.slots.iter().position(|s| !s.busy);
        let (Some(token), false, 1..) = (token, controller.discovery(), count) else {
            registers.shutdown_complete(); // nothing to flush (or no slot: cannot happen)
            return;
        };
        self.slots[token] = Slot {
            busy: true,
            op: Some(Op::Flush),
            parts: count as u16,
            pending: count as u16,
            shutdown_flush: true,
            ..Slot::default()
        };
        self.in_flight += 1;
        self.advance(token as u16, backend);
    }

    /// The target stops: held events complete, the connection closes once drained.
    pub fn shut_down(&mut self, backend: &mut dyn Backend) {
        self.complete_events(Status::ABORT_REQUESTED);
        self.close("the target is shutting down".into(), backend);
    }

    pub(super) fn close(&mut self, why: String, backend: &mut dyn Backend) {
        if self.closed.is_some() {
            return;
        }
        self.phase = Phase::Closing;
        self.closed = Some(why);
        // over RDMA the queue pair disconnects (its work requests then flush)
        self.push_rdma(RdmaOp::Disconnect);
        if let Role::Admin { controller, .. } = &self.role {
            controller.go_away();
        }
        // Commands not yet handed to the backend are dropped now (also those waiting for a
        // buffer or room; their places in the backend's queue lapse), the parts not started
        // of those that were are given up, the others drain.
        for token in 0..self.slots.len() {
            let s = self.slots[token];
            if !s.busy {
                continue;
            }
            if !s.submitted {
                if s.buffered {
                    backend.release(token as u16);
                }
                self.slots[token] = Slot::default();
                self.in_flight -= 1;
            } else if s.started < s.parts {
                self.slots[token].waiting = false;
                self.fail_unstarted(token as u16, Status::ABORTED_SQ_DELETION, backend);
            }
        }
    }

    pub(super) fn terminate(&mut self, error: FatalError, backend: &mut dyn Backend) {
        log::warn!(
            "{}: closing the connection: {error} (FES {}, FEI {})",
            self.peer,
            error.fes(),
            error.fei()
        );
        // (over RDMA there is no TermReq: the close below disconnects)
        if !self.is_rdma() {
            let bad = pdu::offending(self.rx.pending());
            let term = pdu::TermReq::new(PduType::C2HTermReq, &error, bad);
            self.tx.push(term.as_slice());
        }
        self.rx.reset();
        self.close(format!("protocol error: {error}"), backend);
    }

    /// The host went away (connection reset, EOF): nothing more is sent; what the backend
    /// holds is drained as it completes.
    pub fn peer_gone(&mut self, why: &str, backend: &mut dyn Backend) {
        self.close(why.to_string(), backend);
        let mut sending = Sending {
            slots: &mut self.slots,
            in_flight: &mut self.in_flight,
            backend,
        };
        self.tx.clear(|token| sending.sent(token));
    }
}

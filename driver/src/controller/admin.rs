//! The admin queue engine: commands submitted and waited for (or filed under a ticket for
//! whoever asks later), timeouts, and the Asynchronous Event Requests kept outstanding.

use std::time::{Duration, Instant};

use usnvme_hugepages::DmaRegion;
use vm_memory::Bytes;

use crate::bringup::{self, Data};
use crate::error::{Error, SubmitError};
use crate::queue::{IoBuffer, QueuePair, Ticket};
use crate::regs::Registers;
use crate::spec::command::FeatureId;
use crate::spec::registers::reg;
use crate::spec::{AdminOpcode, Csts, Sqe, Status};

use super::queues::Deletion;
use super::{invalid, Shared};

pub(super) struct Admin {
    pub(super) queue: QueuePair,
    data: DmaRegion,
    next_token: u64,
    /// Commands someone will ask the result of: `execute`'s own, and the tickets of commands
    /// submitted without waiting. Whoever polls the admin queue files their completions here.
    pub(super) waiting: Vec<Waiting>,
    /// Dropped queue pairs' queues being deleted, advanced whenever the admin queue is polled.
    pub(super) deletions: Vec<Deletion>,
    /// The Asynchronous Event Request outstanding (never timed out), and the events it brought
    /// that nobody has taken yet (at most [`KEPT_EVENTS`]).
    pub(super) async_event: Option<Ticket>,
    pub(super) events: Vec<AsyncEvent>,
}

/// Events kept for [`Controller::events`] at most: with this many untaken, no request is sent
/// until they are taken (an event storm cannot keep the admin queue busy).
///
/// [`Controller::events`]: super::Controller::events
pub(super) const KEPT_EVENTS: usize = 64;

/// An asynchronous event a controller reported (NVMe Base 2.0, 5.2): its type, information
/// and the log page that tells more (read by the driver, which clears the event).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    pub kind: u8,
    pub info: u8,
    pub log_page: u8,
}

impl AsyncEvent {
    fn from_dw0(dw0: u32) -> AsyncEvent {
        AsyncEvent {
            kind: (dw0 & 7) as u8,
            info: (dw0 >> 8) as u8,
            log_page: (dw0 >> 16) as u8,
        }
    }

    /// A SMART / health status event (a critical warning).
    pub fn is_smart(&self) -> bool {
        self.kind == 1
    }

    /// The Namespace Attribute Changed notice: a namespace was attached, detached, formatted
    /// or resized ([`Controller::rescan_namespaces`] tells which).
    ///
    /// [`Controller::rescan_namespaces`]: super::Controller::rescan_namespaces
    pub fn is_namespace_change(&self) -> bool {
        (self.kind, self.info) == (2, 0)
    }

    /// The completion's dword 0 that reports this event.
    pub fn dw0(&self) -> u32 {
        u32::from(self.kind) | u32::from(self.info) << 8 | u32::from(self.log_page) << 16
    }
}

impl std::fmt::Display for AsyncEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match (self.kind, self.info) {
            (0, _) => "an error status",
            (1, 0) => "SMART / health: NVM subsystem reliability",
            (1, 1) => "SMART / health: temperature threshold",
            (1, 2) => "SMART / health: spare below threshold",
            (1, _) => "SMART / health",
            (2, 0) => "notice: namespace attribute changed",
            (2, 1) => "notice: firmware activation starting",
            (2, 2) => "notice: telemetry log changed",
            (2, 3) => "notice: asymmetric namespace access change",
            (2, _) => "notice",
            (6, _) => "I/O command set specific",
            (7, _) => "vendor specific",
            _ => "reserved",
        };
        write!(
            f,
            "{what} (type {}, information {:#04x}, log page {:#04x})",
            self.kind, self.info, self.log_page
        )
    }
}

/// An admin command submitted, and its outcome once it is known.
pub(super) struct Waiting {
    pub(super) ticket: Ticket,
    /// Never times out (the Asynchronous Event Request, answered when something happens).
    untimed: bool,
    pub(super) command: &'static str,
    submitted: Instant,
    outcome: Option<Outcome>,
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Outcome {
    Done { status: Status, dw0: u32 },
    TimedOut,
}

impl Admin {
    pub(super) fn new(queue: QueuePair, data: DmaRegion) -> Admin {
        let depth = queue.depth() as usize;
        Admin {
            queue,
            data,
            next_token: 0,
            waiting: Vec::with_capacity(depth),
            deletions: Vec::new(),
            async_event: None,
            events: Vec::new(),
        }
    }

    /// Queues `sqe` (no data) and rings the doorbell; its outcome will be filed under the ticket
    /// returned. `Ok(None)`: the admin queue is full, try again later.
    pub(super) fn submit(&mut self, name: &str, sqe: Sqe) -> Result<Option<Ticket>, Error> {
        let ticket = self.next_token;
        match self.queue.submit(sqe, ticket) {
            Ok(()) => {}
            Err(SubmitError::QueueFull { .. }) => return Ok(None),
            Err(e) => {
                return Err(Error::Invalid {
                    device: name.into(),
                    what: format!("{}: {e}", command_name(&sqe)),
                })
            }
        }
        self.next_token += 1;
        self.waiting.push(Waiting {
            ticket,
            untimed: sqe.opcode() == AdminOpcode::AsyncEventRequest as u8,
            command: command_name(&sqe),
            submitted: Instant::now(),
            outcome: None,
        });
        self.queue.flush();
        Ok(Some(ticket))
    }

    /// Enables the events usnvme reports (Asynchronous Event Configuration: SMART critical
    /// warnings, namespace attribute notices) and sends the first Asynchronous Event Request.
    pub(super) fn arm_async_events(&mut self, name: &str, regs: &dyn Registers, timeout: Duration) {
        let config = Sqe::set_features(FeatureId::AsyncEventConfiguration, 0x1ff);
        if let Err(e) = self.execute(name, regs, config, Data::None, timeout) {
            log::info!("{name}: Asynchronous Event Configuration refused ({e}): the controller's default events only");
        }
        let aer = Sqe::async_event_request();
        self.async_event = self.submit(name, aer).ok().flatten();
    }

    /// Keeps an Asynchronous Event Request outstanding: files the event the last one brought
    /// and sends the next (its log page is read by [`Controller::events`], which clears it).
    /// One that failed is not sent again (the controller takes none, or is going away); a
    /// reset voids it.
    ///
    /// [`Controller::events`]: super::Controller::events
    fn keep_async_event(&mut self, name: &str) {
        let outcome = match self.async_event {
            None => return,
            Some(t) => self.take(t),
        };
        match outcome {
            Ok(None) => return, // nothing happened yet
            Ok(Some(Outcome::Done { status, dw0 })) if status.is_success() => {
                let event = AsyncEvent::from_dw0(dw0);
                log::warn!("{name}: asynchronous event: {event}");
                self.events.push(event);
                if self.events.len() >= KEPT_EVENTS {
                    // a storm: no request until someone takes these (`Controller::events`)
                    self.async_event = None;
                    return;
                }
            }
            other => {
                log::debug!("{name}: Asynchronous Event Request ended: {other:?}");
                self.async_event = None;
                return;
            }
        }
        self.async_event = self.submit(name, Sqe::async_event_request()).ok().flatten();
    }

    /// Polls the admin queue once, filing the completions of the commands waited for; returns
    /// how many completed. Others (a late one whose `execute` gave up) are dropped.
    fn poll_once(&mut self) -> usize {
        let waiting = &mut self.waiting;
        self.queue.poll(|c| {
            if let Some(w) = waiting.iter_mut().find(|w| w.ticket == c.token) {
                w.outcome = Some(Outcome::Done {
                    status: c.status,
                    dw0: c.dw0,
                });
            }
        })
    }

    /// The outcome of `ticket` if it is known, and forgets it then. `Err(())`: no such ticket (a
    /// reset voided it, or it was forgotten).
    pub(super) fn take(&mut self, ticket: Ticket) -> Result<Option<Outcome>, ()> {
        let i = self
            .waiting
            .iter()
            .position(|w| w.ticket == ticket)
            .ok_or(())?;
        if self.waiting[i].outcome.is_none() {
            return Ok(None);
        }
        Ok(self.waiting.swap_remove(i).outcome)
    }

    pub(super) fn forget(&mut self, ticket: Ticket) {
        self.waiting.retain(|w| w.ticket != ticket);
    }

    /// Commands older than `timeout` become timed out; outcomes nobody came for in four
    /// timeouts are dropped (their queue pair went away while the lock was busy).
    fn expire(&mut self, timeout: Duration) {
        if self.waiting.is_empty() {
            return;
        }
        let now = Instant::now();
        self.waiting.retain_mut(|w| {
            let age = now.saturating_duration_since(w.submitted);
            if w.untimed {
                return true;
            }
            if w.outcome.is_none() && age > timeout {
                w.outcome = Some(Outcome::TimedOut);
            }
            age <= timeout.saturating_mul(4)
        });
    }

    /// Submits `sqe` and polls for its completion. `data`: a buffer and whether it goes to the
    /// controller; it travels through the admin data region.
    pub(super) fn execute(
        &mut self,
        name: &str,
        regs: &dyn Registers,
        sqe: Sqe,
        data: Data<'_>,
        timeout: Duration,
    ) -> Result<u32, Error> {
        let command = command_name(&sqe);
        let ticket = self.next_token;
        self.next_token += 1;
        let len = match &data {
            Data::None => None,
            Data::FromController(buf) => Some(buf.len()),
            Data::ToController(buf) => {
                self.data
                    .slice(0, buf.len())
                    .and_then(|s| s.write_slice(buf, 0))
                    .map_err(|_| invalid(name, "admin data"))?;
                Some(buf.len())
            }
        };
        let submitted = match len {
            Some(len) => {
                let buffer = IoBuffer {
                    iova: self.data.iova(),
                    len: len as u32,
                };
                self.queue.submit_data(sqe, buffer, ticket)
            }
            None => self.queue.submit(sqe, ticket),
        };
        submitted.map_err(|e| Error::Invalid {
            device: name.into(),
            what: format!("{command}: {e}"),
        })?;
        let started = Instant::now();
        self.waiting.push(Waiting {
            ticket,
            untimed: false,
            command,
            submitted: started,
            outcome: None,
        });
        let result = self.wait(name, regs, ticket, command, started, timeout);
        let (status, dw0) = match result {
            Ok(done) => done,
            Err(e) => {
                self.forget(ticket);
                return Err(e);
            }
        };
        if !status.is_success() {
            return Err(Error::Command {
                device: name.into(),
                command,
                status,
            });
        }
        if let Data::FromController(buf) = data {
            let slice = self
                .data
                .slice(0, buf.len())
                .map_err(|_| invalid(name, "admin data"))?;
            slice
                .read_slice(buf, 0)
                .map_err(|_| invalid(name, "admin data"))?;
        }
        Ok(dw0)
    }

    /// Polls until `ticket` completes (filing other tickets' completions on the way).
    fn wait(
        &mut self,
        name: &str,
        regs: &dyn Registers,
        ticket: Ticket,
        command: &'static str,
        started: Instant,
        timeout: Duration,
    ) -> Result<(Status, u32), Error> {
        let mut spins = 0u32;
        loop {
            self.poll_once();
            if let Ok(Some(Outcome::Done { status, dw0 })) = self.take(ticket) {
                return Ok((status, dw0));
            }
            spins += 1;
            if spins.is_multiple_of(64) {
                let csts = Csts(regs.read32(reg::CSTS));
                if csts.removed() {
                    self.queue.make_unusable();
                    return Err(Error::Gone {
                        device: name.into(),
                    });
                }
                if csts.cfs() {
                    return Err(Error::Fatal {
                        device: name.into(),
                        during: command.into(),
                    });
                }
                if !csts.rdy() {
                    return Err(Error::NotReady {
                        device: name.into(),
                        during: command.into(),
                    });
                }
                if started.elapsed() > timeout {
                    return Err(Error::Timeout {
                        device: name.into(),
                        what: command.into(),
                        after: timeout,
                    });
                }
                std::thread::sleep(Duration::from_micros(50));
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

fn command_name(sqe: &Sqe) -> &'static str {
    bringup::opcode_name(sqe)
}

impl Shared {
    /// Polls the admin queue and moves the deletions on until nothing moves. Never waits.
    pub(super) fn progress(&self, admin: &mut Admin) {
        admin.deletions.append(&mut self.handoff.lock());
        let mut deletions = std::mem::take(&mut admin.deletions);
        loop {
            let completed = admin.poll_once();
            admin.expire(self.options.admin_timeout);
            admin.keep_async_event(&self.name);
            let before = (admin.next_token, deletions.len());
            deletions.retain_mut(|d| {
                let done = admin.advance(&self.name, d);
                if done {
                    self.free_qid(d.qid);
                }
                !done
            });
            if completed == 0 && (admin.next_token, deletions.len()) == before {
                break;
            }
        }
        admin.deletions = deletions;
    }
}

//! The admin queue's commands: Keep Alive and Asynchronous Event Requests are the connection's
//! own; the rest is answered by `export::admin`, SMART once the drives' answer is there.

use std::time::Instant;

use usnvme_driver::spec::fabrics::SGL_TRANSPORT;
use usnvme_driver::spec::log::LogPageId;
use usnvme_driver::spec::{SmartLog, Sqe, Status};

use super::super::admin;
use super::super::registry::Controller;
use super::super::{Listener, Subsystems};
use super::rdma::{Keyed, RdmaOp};
use super::{Backend, Connection, Role};
use crate::fabric::pdu::FatalError;

/// Admin opcodes handled by the connection itself (the rest go to [`admin`]).
const ASYNC_EVENT_REQUEST: u8 = 0x0c;
const KEEP_ALIVE: u8 = 0x18;
const GET_LOG_PAGE: u8 = 0x02;

/// Get Log Page CDW10 bit 15: Retain Asynchronous Event (the log is read, not cleared).
const RETAIN_ASYNC_EVENT: u32 = 1 << 15;

/// Whether `sqe` reads the Changed Namespace List log.
fn reads_changed_namespaces(sqe: &Sqe, opcode: u8) -> bool {
    opcode == GET_LOG_PAGE && sqe.cdw10 as u8 == LogPageId::ChangedNamespaceList as u8
}

/// The NVM subsystems a discovery controller's host may connect to (what its discovery log
/// lists); none for an I/O controller.
fn open_to<'a>(
    subsystems: &'a Subsystems,
    controller: &Controller,
    port: &Listener,
) -> Vec<&'a str> {
    if controller.discovery() {
        subsystems.open_to(controller.host_nqn(), port.port_id)
    } else {
        Vec::new()
    }
}

/// How a discovery controller's host reads the discovery log: at the port it came in on, with
/// the NVM subsystems `open` to it. None for an I/O controller.
fn discovery_asker<'a>(
    port: &'a Listener,
    subsystems: &Subsystems,
    open: &'a [&'a str],
    controller: &Controller,
) -> Option<admin::DiscoveryAsker<'a>> {
    controller.discovery().then_some(admin::DiscoveryAsker {
        port,
        subsystems: open,
        generation: subsystems.generation,
    })
}

impl Connection {
    pub(super) fn on_admin(
        &mut self,
        sqe: &Sqe,
        cid: u16,
        opcode: u8,
        backend: &mut dyn Backend,
    ) -> Result<(), FatalError> {
        let Role::Admin {
            controller,
            features,
            registers,
            events,
            smart_waiting,
            last_keep_alive,
            ..
        } = &mut self.role
        else {
            return Ok(());
        };
        // Until the host enables the controller (CC.EN, then CSTS.RDY) only Fabrics commands
        // are served.
        if !registers.ready() {
            self.respond(cid, 0, Status::COMMAND_SEQUENCE_ERROR);
            return Ok(());
        }
        let cntlid = controller.cntlid();
        // Any admin command shows the host is there (the Keep Alive timer is traffic based, I/O
        // counts too: see `tick`); the association ends only after twice KATO without one, so
        // a host that sends its Keep Alive every KATO is never cut off by scheduling jitter.
        *last_keep_alive = Instant::now();
        // SMART comes from the drives, which take milliseconds: the command waits for the
        // backend's answer (see `poll_smart`) while the reactor serves everything else.
        let mut wants_smart = false;
        // the log as it is now; what the host saw is cleared once it is answered
        let changed = if reads_changed_namespaces(sqe, opcode) {
            controller.changed_namespaces()
        } else {
            Vec::new()
        };
        let open = open_to(&self.subsystems, controller, &self.port);
        let result: Result<(u32, usize), Status> = match opcode {
            KEEP_ALIVE => {
                self.registry.note_keep_alive();
                Ok((0, 0))
            }
            ASYNC_EVENT_REQUEST => {
                if events.len() >= admin::ASYNC_EVENT_LIMIT {
                    Err(Status::AER_LIMIT_EXCEEDED)
                } else {
                    events.push(cid); // (preallocated: ASYNC_EVENT_LIMIT entries)
                    return Ok(()); // held until an event, or the controller goes away
                }
            }
            _ => admin::execute(
                &self.subsystem,
                admin::Asked {
                    cntlid,
                    discovery: discovery_asker(&self.port, &self.subsystems, &open, controller),
                    ana: self.registry.ana_view(self.port.port_id),
                    changed_namespaces: &changed,
                    keyed_sgls: self.rdma.is_some(),
                },
                features,
                sqe,
                &mut || {
                    wants_smart = true;
                    SmartLog::zeroed()
                },
                &mut self.admin_data,
            ),
        };
        if wants_smart && result.is_ok() {
            // (the command passed every check; its answer is built again with the drives').
            // It waits, however many do: one place per entry of the queue, preallocated.
            if smart_waiting.len() == smart_waiting.capacity() {
                return Err(FatalError::Sequence(
                    "more commands in flight than queue entries",
                ));
            }
            smart_waiting.push(*sqe);
            self.poll_smart(backend);
            return Ok(());
        }
        if result.is_ok() && !changed.is_empty() && sqe.cdw10 & RETAIN_ASYNC_EVENT == 0 {
            controller.clear_changed_namespaces(&changed);
        }
        self.answer_admin(cid, sqe, result);
        Ok(())
    }

    /// Sends an admin command's answer built in the admin buffer, or its status.
    fn answer_admin(&mut self, cid: u16, sqe: &Sqe, result: Result<(u32, usize), Status>) {
        match result {
            Ok((dw0, 0)) => self.respond(cid, dw0, Status::SUCCESS),
            Ok((dw0, len)) if self.is_rdma() => {
                // RDMA WRITE of a copy to the host's keyed buffer (as much as fits there)
                let remote = Keyed::of(&sqe.sgl()).filter(|k| k.length > 0);
                let Some(remote) = remote else {
                    self.respond(cid, 0, Status::DATA_SGL_LENGTH_INVALID.with_dnr());
                    return;
                };
                let data = self.admin_data[..len.min(remote.length as usize)].to_vec();
                self.push_rdma(RdmaOp::AdminData { data, remote });
                self.respond(cid, dw0, Status::SUCCESS);
            }
            Ok((dw0, len)) => {
                // The data goes in one C2HData PDU, to the buffer the host's SGL describes (a
                // transport data block): as much of it as fits there. A host that describes
                // none gets none (a PDU of no data is malformed: SPDK's host stalls on it).
                let sgl = sqe.sgl();
                if sgl.identifier != SGL_TRANSPORT || sgl.length == 0 {
                    self.respond(cid, 0, Status::DATA_SGL_LENGTH_INVALID.with_dnr());
                    return;
                }
                self.send_admin_data(cid, len.min(sgl.length as usize));
                self.respond(cid, dw0, Status::SUCCESS);
            }
            Err(status) => self.respond(cid, 0, status),
        }
    }

    /// Asks the drives for SMART while Get Log Page commands wait for it (again, where the
    /// backend could not take the request), and answers them once the answer is there.
    pub(super) fn poll_smart(&mut self, backend: &mut dyn Backend) {
        let Role::Admin {
            smart_waiting,
            smart_asked,
            ..
        } = &mut self.role
        else {
            return;
        };
        if smart_waiting.is_empty() || self.closed.is_some() {
            return;
        }
        if !*smart_asked {
            *smart_asked = backend.smart_request();
            return;
        }
        let Some(log) = backend.smart_answer() else {
            return;
        };
        *smart_asked = false;
        while let Role::Admin {
            smart_waiting,
            features,
            controller,
            ..
        } = &mut self.role
        {
            let Some(sqe) = smart_waiting.pop() else {
                break;
            };
            let cntlid = controller.cntlid();
            let open = open_to(&self.subsystems, controller, &self.port);
            let result = admin::execute(
                &self.subsystem,
                admin::Asked {
                    cntlid,
                    discovery: discovery_asker(&self.port, &self.subsystems, &open, controller),
                    ana: self.registry.ana_view(self.port.port_id),
                    changed_namespaces: &[],
                    keyed_sgls: self.rdma.is_some(),
                },
                features,
                &sqe,
                &mut || log,
                &mut self.admin_data,
            );
            self.answer_admin(sqe.cid(), &sqe, result);
        }
    }

    /// Completes a held Asynchronous Event Request with an event the drives raised (see
    /// [`Registry::raise_event`]), if the host enabled it and one is held.
    pub(super) fn deliver_events(&mut self) {
        let Role::Admin {
            controller,
            features,
            events,
            registers,
            ..
        } = &mut self.role
        else {
            return;
        };
        // (none once the host announced a shutdown: it has ended its requests itself)
        if events.is_empty() || self.closed.is_some() || registers.shutdown_requested() {
            return;
        }
        let aec = features.async_event_config();
        let Some(dw0) = controller.take_event(|dw0| admin::event_enabled(aec, dw0)) else {
            return;
        };
        if let Some(cid) = events.pop() {
            self.respond(cid, dw0, Status::SUCCESS);
        }
    }

    pub(super) fn complete_events(&mut self, status: Status) {
        while let Role::Admin { events, .. } = &mut self.role {
            let Some(cid) = events.pop() else {
                break;
            };
            self.respond(cid, 0, status);
        }
    }
}

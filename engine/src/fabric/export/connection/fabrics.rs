//! ICReq and the Fabrics commands: Connect (which makes the connection an admin queue, creating
//! a controller, or an I/O queue of one), Property Get/Set, Disconnect.

use std::time::Instant;

use usnvme_driver::spec::fabrics::{
    ConnectCommand, ConnectData, ConnectResponse, CATTR_DISABLE_SQ_FLOW, CNTLID_DYNAMIC,
    DISCOVERY_NQN,
};
use usnvme_driver::spec::{Sqe, Status};

use super::super::admin::{self, FabricsCommand, Features};
use super::{Backend, Connection, Holding, Phase, Role};
use crate::fabric::pdu::{FatalError, IcReq, IcResp, PFV_1_0};

impl Connection {
    pub(super) fn on_ic_req(&mut self) -> Result<(), FatalError> {
        let req = IcReq::parse(self.rx.pending())?;
        self.digests = req.digests;
        self.host_alignment = req.hpda;
        self.phase = Phase::Ready;
        let resp = IcResp {
            pfv: PFV_1_0,
            cpda: 0,
            digests: req.digests,
            maxh2cdata: self.limits.maxh2cdata,
        };
        self.tx.push(&resp.encode());
        Ok(())
    }

    pub(super) fn on_fabrics(
        &mut self,
        sqe: &Sqe,
        cid: u16,
        data: std::ops::Range<usize>,
        backend: &mut dyn Backend,
    ) -> Result<(), FatalError> {
        let command = match FabricsCommand::from_sqe(sqe) {
            Ok(c) => c,
            Err(status) => {
                self.respond(cid, 0, status);
                return Ok(());
            }
        };
        match command {
            FabricsCommand::Connect(connect) => {
                let bytes = &self.rx.pending()[data];
                match admin::connect_data(bytes).and_then(|d| self.connect(&connect, &d)) {
                    Ok(cntlid) => {
                        let response = ConnectResponse { cntlid, authreq: 0 };
                        self.respond(cid, response.dw0(), Status::SUCCESS);
                    }
                    Err(status) => self.respond(cid, 0, status),
                }
            }
            FabricsCommand::PropertyGet(get) => {
                let value = match &self.role {
                    Role::Admin { registers, .. } => registers.property_get(get.offset, get.size),
                    _ => Err(Status::COMMAND_SEQUENCE_ERROR),
                };
                match value {
                    Ok(v) => self.respond_property(cid, get.size, v),
                    Err(status) => self.respond(cid, 0, status),
                }
            }
            FabricsCommand::PropertySet(set) => {
                let result = match &mut self.role {
                    Role::Admin {
                        registers,
                        controller,
                        ..
                    } => {
                        let r = registers.property_set(set.offset, set.size, set.value);
                        controller.set_ready(registers.ready());
                        r
                    }
                    _ => Err(Status::COMMAND_SEQUENCE_ERROR),
                };
                let status = result.err().unwrap_or(Status::SUCCESS);
                self.respond(cid, 0, status);
                // (held Asynchronous Event Requests are not answered: hosts end them
                // themselves, and SPDK's reuses their command IDs for the shutdown's own
                // commands, so a late answer would name a command it no longer has)
                if self.shutting_down() {
                    self.flush_for_shutdown(backend);
                }
            }
            FabricsCommand::Disconnect => {
                self.respond(cid, 0, Status::SUCCESS);
                self.close("the host disconnected".into(), backend);
            }
        }
        Ok(())
    }

    /// Checks a Connect and makes this connection an admin or I/O queue; the controller ID.
    fn connect(&mut self, connect: &ConnectCommand, data: &ConnectData) -> Result<u16, Status> {
        let (subnqn, hostnqn) = admin::connect_nqns(data)?;
        if !matches!(self.role, Role::None) {
            return Err(Status::COMMAND_SEQUENCE_ERROR);
        }
        // any host may ask the discovery controller what it may connect to
        let discovery = subnqn == DISCOVERY_NQN;
        let subsystem = if discovery {
            self.subsystems.base.clone()
        } else {
            let found = self.subsystems.find(subnqn);
            let Some(subsystem) = found.filter(|s| s.on_port(self.port.port_id)) else {
                log::warn!(
                    "{}: Connect to unknown subsystem {subnqn:?} (at port {}) refused",
                    self.peer,
                    self.port.address
                );
                return Err(Status::CONNECT_INVALID_PARAMETERS);
            };
            subsystem.clone()
        };
        if !subsystem.host_allowed(hostnqn) {
            log::warn!(
                "{}: host {hostnqn} is not allowed to connect to {subnqn}: Connect refused",
                self.peer
            );
            return Err(Status::CONNECT_INVALID_HOST);
        }
        self.subsystem = subsystem;
        let entries = connect.entries();
        if connect.sqsize == 0 || entries > u32::from(self.subsystem.queue_entries) {
            log::warn!(
                "{}: Connect of queue {} with {entries} entries refused: 2 to {} are served",
                self.peer,
                connect.qid,
                self.subsystem.queue_entries
            );
            return Err(Status::CONNECT_INVALID_PARAMETERS);
        }
        // (set before the Connect's own response, which reports the head past it)
        self.sq_entries = entries;
        self.sq_flow = connect.cattr & CATTR_DISABLE_SQ_FLOW == 0;
        if connect.qid == 0 {
            if data.cntlid != CNTLID_DYNAMIC {
                log::warn!(
                    "{}: Connect of an admin queue to controller {} refused: only a new one \
                     (FFFFh, dynamic) is served",
                    self.peer,
                    data.cntlid
                );
                return Err(Status::CONNECT_INVALID_PARAMETERS);
            }
            let controller = self.registry.create(subnqn, hostnqn, discovery)?;
            let cntlid = controller.cntlid();
            let mut features = Features::new(&self.subsystem);
            features.set_keep_alive_ms(connect.kato);
            self.role = Role::Admin {
                controller,
                features,
                registers: admin::ControllerRegisters::new(&self.subsystem, discovery),
                events: Vec::with_capacity(admin::ASYNC_EVENT_LIMIT),
                // as many as the queue has entries: a read of SMART waits, never refused
                smart_waiting: Vec::with_capacity(entries as usize),
                smart_asked: false,
                last_keep_alive: Instant::now(),
                io_traffic_seen: 0,
            };
            log::info!(
                "{}: host {hostnqn} connected (controller {cntlid}{}, {})",
                self.peer,
                if discovery { ", discovery" } else { "" },
                self.digests
            );
            return Ok(cntlid);
        }
        let controller = self
            .registry
            .find(data.cntlid, hostnqn)
            .filter(|c| c.subnqn() == subnqn)
            .ok_or(Status::CONNECT_INVALID_PARAMETERS)?;
        if controller.discovery() || !controller.ready() || connect.qid > self.subsystem.io_queues {
            return Err(Status::CONNECT_INVALID_PARAMETERS);
        }
        let cntlid = controller.cntlid();
        self.holding = Holding::new(self.slots.len(), self.subsystem.in_capsule_bytes);
        self.role = Role::Io {
            controller,
            qid: connect.qid,
            taken_at_tick: 0,
        };
        Ok(cntlid)
    }
}

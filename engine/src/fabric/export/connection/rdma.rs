//! The connection over NVMe/RDMA: the same commands, controllers and data paths as over
//! NVMe/TCP, carried by RDMA operations instead of PDUs. The transport (`server`'s RDMA side)
//! hands each received capsule in as a command capsule ([`Connection::receive_capsule`]) and
//! carries out what the connection asks of it ([`RdmaOp`], taken by
//! [`Connection::take_rdma_ops`]): a response is a SEND of its CQE; a write's data not in the
//! capsule is an RDMA READ from the host's keyed buffer into the command's DMA buffer (where
//! NVMe/TCP sends an R2T); a read's data is an RDMA WRITE from the buffer to the host's (where
//! NVMe/TCP sends C2HData); an admin command's data is an RDMA WRITE of a copy. The transport
//! tells the connection when a READ placed the data ([`Connection::rdma_read_done`]) and when
//! a WRITE from a command's buffer is over ([`Connection::rdma_written`]), which frees it.
//!
//! There is no ICReq: a connection is ready when the CM connects it, and has no digests.

use std::collections::VecDeque;

use usnvme_driver::spec::{Cqe, SglDescriptor};

use super::{Backend, Connection, Phase};
use crate::fabric::pdu::{PduType, CAPSULE_CMD_HEADER};

/// What the connection asks of its queue pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RdmaOp {
    /// SEND this response.
    Respond(Cqe),
    /// RDMA WRITE these bytes (an admin command's data) to the host's buffer.
    AdminData { data: Vec<u8>, remote: Keyed },
    /// RDMA READ the host's buffer into command `token`'s buffer (`len` bytes), then
    /// [`Connection::rdma_read_done`].
    Read { token: u16, len: u32, remote: Keyed },
    /// RDMA WRITE `len` bytes of command `token`'s buffer to the host's, then
    /// [`Connection::rdma_written`].
    Write { token: u16, len: u32, remote: Keyed },
    /// The connection is over: disconnect.
    Disconnect,
}

/// A host buffer a Keyed SGL Data Block names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Keyed {
    pub address: u64,
    pub length: u32,
    pub key: u32,
}

impl Keyed {
    /// The keyed buffer of `sgl` (None for another descriptor).
    pub fn of(sgl: &SglDescriptor) -> Option<Keyed> {
        let (length, key) = sgl.keyed_parts()?;
        Some(Keyed {
            address: sgl.address,
            length,
            key,
        })
    }
}

/// A connection's RDMA side: what it asked for and the transport has not taken yet.
#[derive(Debug)]
pub(super) struct RdmaLink {
    pub(super) ops: VecDeque<RdmaOp>,
}

impl Connection {
    /// A connection for an NVMe/RDMA queue pair (ready at once: there is no ICReq).
    pub fn rdma(mut self) -> Connection {
        let entries = self.slots.len();
        self.phase = Phase::Ready;
        self.rdma = Some(RdmaLink {
            // a response and a data transfer per command, and a few more
            ops: VecDeque::with_capacity(2 * entries + 8),
        });
        self
    }

    /// Whether this is an NVMe/RDMA connection.
    pub fn is_rdma(&self) -> bool {
        self.rdma.is_some()
    }

    /// A command capsule received on the queue pair: `capsule` is [`CAPSULE_CMD_HEADER`]
    /// bytes of room, the 64-byte SQE, then its in-capsule data (the transport writes the
    /// room in front of what it received, so that the capsule goes in as NVMe/TCP's would,
    /// through the same checks and with its in-capsule data straight into a buffer).
    pub fn receive_capsule(&mut self, capsule: &mut [u8], backend: &mut dyn Backend) {
        let header = CAPSULE_CMD_HEADER - 64;
        if capsule.len() < CAPSULE_CMD_HEADER {
            return;
        }
        let data = capsule.len() - CAPSULE_CMD_HEADER;
        let plen = capsule.len() as u32;
        capsule[0] = PduType::CapsuleCmd as u8;
        capsule[1] = 0;
        capsule[2] = CAPSULE_CMD_HEADER as u8;
        capsule[3] = if data > 0 {
            CAPSULE_CMD_HEADER as u8
        } else {
            0
        };
        capsule[4..header].copy_from_slice(&plen.to_le_bytes());
        self.receive(capsule, backend);
    }

    /// Hands what the connection asks of the queue pair, in order.
    pub fn take_rdma_ops(&mut self, mut take: impl FnMut(RdmaOp)) {
        if let Some(link) = &mut self.rdma {
            while let Some(op) = link.ops.pop_front() {
                take(op);
            }
        }
    }

    /// The RDMA READ of command `token`'s data is done (`ok`: it succeeded): the command goes
    /// on to the drives (or fails).
    pub fn rdma_read_done(&mut self, token: u16, ok: bool, backend: &mut dyn Backend) {
        let Some(slot) = self.slots.get_mut(token as usize) else {
            return;
        };
        if !slot.busy || slot.submitted {
            return;
        }
        if !ok {
            self.finish(
                token,
                usnvme_driver::spec::Status::DATA_TRANSFER_ERROR,
                backend,
            );
            return;
        }
        slot.received = slot.len;
        self.advance(token, backend);
    }

    /// The RDMA WRITE from command `token`'s buffer is over (done, or flushed with the
    /// connection): the buffer and the slot are free.
    pub fn rdma_written(&mut self, token: u16, backend: &mut dyn Backend) {
        if self
            .slots
            .get(token as usize)
            .is_some_and(|s| s.busy && s.sending)
        {
            backend.release(token);
            self.slots[token as usize] = super::Slot::default();
            self.in_flight -= 1;
        }
    }

    pub(super) fn push_rdma(&mut self, op: RdmaOp) -> bool {
        match &mut self.rdma {
            Some(link) => {
                link.ops.push_back(op);
                true
            }
            None => false,
        }
    }
}

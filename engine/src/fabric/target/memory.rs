//! A [`Backend`] over memory, for the connection's tests and its fuzz target: namespaces are
//! byte vectors, every I/O completes on the next [`MemoryBackend::complete_all`].

use std::sync::Arc;
use std::time::Instant;

use usnvme_driver::spec::{SmartLog, Status};

use super::connection::{Backend, Connection, ConnectionLimits};
use super::registry::Registry;
use super::{ExportedNamespace, Listener, SubsystemInfo};
use crate::block::Op;

/// Namespaces in memory and the commands handed to them.
#[derive(Debug)]
pub struct MemoryBackend {
    pub namespaces: Vec<Vec<u8>>,
    buffers: Vec<Option<Vec<u8>>>,
    submitted: Vec<(u16, Result<(), Status>)>,
    max_buffer: usize,
}

impl MemoryBackend {
    pub fn new(sub: &SubsystemInfo) -> MemoryBackend {
        MemoryBackend {
            namespaces: sub
                .namespaces
                .iter()
                .map(|n| vec![0; (n.blocks * u64::from(n.block_size)) as usize])
                .collect(),
            buffers: vec![None; sub.queue_entries as usize],
            submitted: Vec::new(),
            max_buffer: sub.max_transfer as usize,
        }
    }

    /// Commands whose buffer is still held.
    pub fn buffers_held(&self) -> usize {
        self.buffers.iter().filter(|b| b.is_some()).count()
    }

    /// Completes everything submitted so far.
    pub fn complete_all(&mut self, conn: &mut Connection) {
        for (token, result) in std::mem::take(&mut self.submitted) {
            conn.complete(token, result, self);
        }
    }
}

impl Backend for MemoryBackend {
    fn reserve(&mut self, token: u16, len: usize) -> bool {
        match self.buffers.get_mut(token as usize) {
            Some(b) if len <= self.max_buffer => {
                *b = Some(vec![0; len]);
                true
            }
            _ => false,
        }
    }

    fn fill(&mut self, token: u16, offset: usize, bytes: &[u8]) {
        if let Some(Some(b)) = self.buffers.get_mut(token as usize) {
            if let Some(dst) = b.get_mut(offset..offset + bytes.len()) {
                dst.copy_from_slice(bytes);
            }
        }
    }

    fn submit(
        &mut self,
        token: u16,
        ns: usize,
        op: Op,
        offset: u64,
        len: u64,
    ) -> Result<(), Status> {
        let disk = self
            .namespaces
            .get_mut(ns)
            .ok_or(Status::INVALID_NAMESPACE)?;
        let range = offset as usize..(offset + len) as usize;
        if range.end > disk.len() {
            return Err(Status::LBA_OUT_OF_RANGE);
        }
        let buffer = self
            .buffers
            .get_mut(token as usize)
            .and_then(Option::as_mut);
        match (op, buffer) {
            (Op::Read, Some(b)) => b[..range.len()].copy_from_slice(&disk[range]),
            (Op::Write, Some(b)) => disk[range.clone()].copy_from_slice(&b[..range.len()]),
            (Op::WriteZeroes | Op::Deallocate, _) => disk[range].fill(0),
            (Op::Flush, _) => {}
            _ => return Err(Status::INTERNAL_ERROR),
        }
        self.submitted.push((token, Ok(())));
        Ok(())
    }

    fn copy_out(&mut self, token: u16, offset: usize, dst: &mut [u8]) {
        if let Some(Some(b)) = self.buffers.get(token as usize) {
            if let Some(src) = b.get(offset..offset + dst.len()) {
                dst.copy_from_slice(src);
            }
        }
    }

    fn release(&mut self, token: u16) {
        if let Some(b) = self.buffers.get_mut(token as usize) {
            *b = None;
        }
    }

    fn smart(&mut self) -> SmartLog {
        SmartLog::zeroed()
    }
}

/// A subsystem of `namespaces` namespaces of 1 MiB (512-byte blocks), for tests.
pub fn test_subsystem(namespaces: u32) -> SubsystemInfo {
    SubsystemInfo {
        nqn: "nqn.2024-01.io.usnvme:test".into(),
        serial: "usnvme-test".into(),
        model: "usnvme".into(),
        firmware: "0.1.0".into(),
        namespaces: (1..=namespaces)
            .map(|nsid| ExportedNamespace {
                nsid,
                name: format!("mem:{nsid}"),
                block_size: 512,
                blocks: 2048,
                nguid: [nsid as u8; 16],
            })
            .collect(),
        listeners: vec![Listener {
            address: ([127, 0, 0, 1], 4420).into(),
            port_id: 1,
        }],
        in_capsule_bytes: 8192,
        max_transfer: 128 << 10,
        queue_entries: 32,
        io_queues: 4,
    }
}

/// The fuzz target's body: `bytes` from a host, fed in pieces of the sizes its first bytes
/// choose, I/O completed between pieces. Must never panic, and what the connection holds
/// stays bounded.
pub fn fuzz_connection(bytes: &[u8]) {
    let sub = Arc::new(test_subsystem(2));
    let mut backend = MemoryBackend::new(&sub);
    let mut conn = Connection::new(
        sub.clone(),
        Arc::new(Registry::new(None)),
        ConnectionLimits { maxh2cdata: 16384 },
        "fuzz".into(),
    );
    let (sizes, mut rest) = bytes.split_at(bytes.len().min(4));
    let mut turn = 0usize;
    while !rest.is_empty() {
        let size = 1 + *sizes.get(turn % sizes.len().max(1)).unwrap_or(&255) as usize * 8;
        let (piece, after) = rest.split_at(rest.len().min(size));
        conn.receive(piece, &mut backend);
        backend.complete_all(&mut conn);
        conn.tick(Instant::now(), &mut backend);
        let out = conn.outgoing().len();
        conn.sent(out);
        rest = after;
        turn += 1;
    }
    conn.peer_gone("the fuzzer ended", &mut backend);
    backend.complete_all(&mut conn);
    assert_eq!(backend.buffers_held(), 0, "every buffer came back");
    assert!(conn.finished().is_some(), "a closed connection drains");
}

//! A [`Backend`] over memory, for the connection's tests and its fuzz target: namespaces are
//! byte vectors, command buffers live in one anonymous mapping (reached through volatile
//! slices, as DMA buffers are), every I/O completes on the next
//! [`MemoryBackend::complete_all`]. Buffers and the "device queue" can be made scarce, so
//! that commands wait as they do on a reactor.

use usnvme_driver::spec::{SmartLog, Status};
use vm_memory::mmap::MmapRegion;
use vm_memory::{VolatileMemory, VolatileSlice};

use super::connection::{Backend, Connection, Refused, Request};
use super::waiting::Waiting;
use super::{ExportedNamespace, Listener, SubsystemInfo};
use crate::block::Op;

/// Namespaces in memory and the commands handed to them.
#[derive(Debug)]
pub struct MemoryBackend {
    pub namespaces: Vec<Vec<u8>>,
    /// One buffer of `max_buffer` bytes per command slot; `held` says which are taken.
    buffers: MmapRegion,
    held: Vec<bool>,
    submitted: Vec<(u16, Result<(), Status>)>,
    max_buffer: usize,
    /// The SMART log the drives give, and whether its answer is held back (a slow drive).
    pub smart: SmartLog,
    pub smart_held: bool,
    /// SMART requests not answered yet.
    pub smart_asked: u32,
    /// Flushes submitted, per namespace.
    pub flushes: Vec<u32>,
    /// Most buffers held at once, and most requests submitted and not completed: beyond
    /// them commands wait (by default one buffer per slot and no limit).
    pub buffer_limit: usize,
    pub queue_limit: usize,
    waiting: Waiting,
}

impl MemoryBackend {
    pub fn new(sub: &SubsystemInfo) -> MemoryBackend {
        let slots = sub.queue_entries as usize;
        let max_buffer = sub.max_transfer as usize;
        MemoryBackend {
            namespaces: sub
                .namespaces
                .iter()
                .map(|n| vec![0; (n.blocks * u64::from(n.block_size)) as usize])
                .collect(),
            // pages are only touched when used, so a big mapping costs little
            buffers: MmapRegion::new(slots * max_buffer).expect("an anonymous mapping"),
            held: vec![false; slots],
            submitted: Vec::with_capacity(slots),
            max_buffer,
            smart: SmartLog::zeroed(),
            smart_held: false,
            smart_asked: 0,
            flushes: vec![0; sub.namespaces.len()],
            buffer_limit: slots,
            queue_limit: usize::MAX,
            waiting: {
                let mut waiting = Waiting::default();
                waiting.size_for(slots, sub.namespaces.len());
                waiting
            },
        }
    }

    /// Commands waiting for a buffer or room now.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Commands whose buffer is still held.
    pub fn buffers_held(&self) -> usize {
        self.held.iter().filter(|&&h| h).count()
    }

    /// Completes everything submitted so far, then moves on the commands that waited, in
    /// order, as the reactor does after completions.
    pub fn complete_all(&mut self, conn: &mut Connection) {
        // (the vector is reused: no allocation per command here either)
        let mut done = std::mem::take(&mut self.submitted);
        let idle = done.is_empty();
        if !idle {
            self.waiting.gate.freed();
        }
        for (token, result) in done.drain(..) {
            conn.complete(token, result, self);
        }
        if self.submitted.is_empty() {
            self.submitted = done;
        }
        if let Some(mut queue) = self.waiting.begin_retry(idle) {
            queue.retain(|w| !conn.resume(w.token, self));
            self.waiting.end_retry(queue);
        }
    }
}

impl Backend for MemoryBackend {
    fn reserve(&mut self, token: u16, len: usize) -> bool {
        let held = self.buffers_held();
        let open = self.waiting.gate.buffers_open(false);
        match self.held.get_mut(token as usize) {
            Some(true) => true,
            Some(h) if len <= self.max_buffer => {
                if !open || held >= self.buffer_limit {
                    self.waiting.gate.no_buffer(false);
                    return false;
                }
                *h = true;
                true
            }
            _ => false,
        }
    }

    fn buffer(&self, token: u16) -> Option<VolatileSlice<'_>> {
        held_buffer(&self.buffers, &self.held, self.max_buffer, token)
    }

    fn submit(&mut self, token: u16, request: Request) -> Result<(), Refused> {
        let ns = request.device;
        if !self.waiting.gate.room_open(ns) || self.submitted.len() >= self.queue_limit {
            self.waiting.gate.no_room(ns);
            return Err(Refused::Busy);
        }
        let disk_len = self
            .namespaces
            .get(ns)
            .ok_or(Refused::Failed(Status::INVALID_NAMESPACE))?
            .len();
        let range = request.offset as usize..(request.offset + request.len) as usize;
        if range.end > disk_len {
            return Err(Refused::Failed(Status::LBA_OUT_OF_RANGE));
        }
        let buffer = held_buffer(&self.buffers, &self.held, self.max_buffer, token)
            .and_then(|b| b.subslice(0, range.len()).ok());
        let disk = &mut self.namespaces[ns];
        match (request.op, buffer) {
            (Op::Read, Some(b)) => b.copy_from(&disk[range]),
            (Op::Write, Some(b)) => {
                b.copy_to(&mut disk[range]);
            }
            (Op::WriteZeroes | Op::Deallocate, _) => disk[range].fill(0),
            (Op::Flush, _) => self.flushes[ns] += 1,
            _ => return Err(Refused::Failed(Status::INTERNAL_ERROR)),
        };
        self.submitted.push((token, Ok(())));
        Ok(())
    }

    fn wait(&mut self, token: u16) {
        self.waiting.push(0, token);
    }

    fn release(&mut self, token: u16) {
        if let Some(h) = self.held.get_mut(token as usize) {
            if std::mem::take(h) {
                self.waiting.gate.freed();
            }
        }
    }

    fn smart_request(&mut self) -> bool {
        self.smart_asked += 1;
        true
    }

    fn smart_answer(&mut self) -> Option<SmartLog> {
        if self.smart_asked == 0 || self.smart_held {
            return None;
        }
        self.smart_asked -= 1;
        Some(self.smart)
    }
}

/// Slot `token`'s buffer, if it is held.
fn held_buffer<'a>(
    buffers: &'a MmapRegion,
    held: &[bool],
    size: usize,
    token: u16,
) -> Option<VolatileSlice<'a>> {
    if !held.get(token as usize).copied().unwrap_or(false) {
        return None;
    }
    buffers.get_slice(token as usize * size, size).ok()
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
                uuid: super::uuid_of_nguid(&[nsid as u8; 16]),
                ana_group: super::DEFAULT_ANA_GROUP,
                device: nsid as usize - 1,
            })
            .collect(),
        listeners: vec![Listener {
            address: ([127, 0, 0, 1], 4420).into(),
            port_id: 1,
            transport: crate::fabric::address::Transport::Tcp,
        }],
        in_capsule_bytes: 8192,
        max_transfer: 128 << 10,
        queue_entries: 32,
        io_queues: 4,
        allowed_hosts: None,
        ports: None,
    }
}

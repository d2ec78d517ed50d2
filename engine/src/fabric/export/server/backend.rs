//! A connection's view of the reactor: the block devices its commands go to, the DMA
//! buffers they use, the SMART reader; and the NVMe statuses of the devices' errors.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use usnvme_driver::spec::{SmartLog, Status};
use usnvme_driver::IoBuffer;
use usnvme_hugepages::{BufferPool, DmaBuffer};
use vm_memory::VolatileSlice;

use super::smart::{SmartService, SmartSlot};
use super::{Conn, Link, Shared, TOKEN_BITS};
use crate::block::BlockError;
use crate::engine::DeviceChannel;
use crate::fabric::export::connection::{Backend, Connection, Refused, Request};
use crate::fabric::export::waiting::Waiting;

/// A reactor's DMA buffers for its commands' data: many of the usual size, and a few of the
/// largest transfer the target lets in for the commands beyond it (the usual ones are that
/// size where it is not larger).
pub(super) struct Pools {
    pub usual: BufferPool,
    pub large: Option<BufferPool>,
}

impl Pools {
    /// The pool for a buffer of `len` bytes, and whether it is the large one.
    fn for_len(&mut self, len: usize) -> (&mut BufferPool, bool) {
        match &mut self.large {
            Some(large) if len > self.usual.buffer_size() => (large, true),
            _ => (&mut self.usual, false),
        }
    }
}

/// A connection's view of the reactor: its channels and buffers.
pub(super) struct ReactorBackend<'a> {
    devices: &'a mut [DeviceChannel],
    pools: &'a mut Pools,
    buffers: &'a mut [Option<DmaBuffer>],
    slot: usize,
    waiting: &'a mut Waiting,
    smart: &'a SmartService,
    smart_slot: &'a Arc<SmartSlot>,
    smart_asked: &'a mut bool,
    in_use: &'a AtomicU64,
}

impl<'a> ReactorBackend<'a> {
    pub(super) fn new(
        devices: &'a mut [DeviceChannel],
        pools: &'a mut Pools,
        c: &'a mut Conn,
        slot: usize,
        shared: &'a Shared,
        waiting: &'a mut Waiting,
    ) -> (&'a mut Connection, &'a mut Link, Self) {
        let backend = ReactorBackend {
            devices,
            pools,
            buffers: &mut c.buffers,
            slot,
            waiting,
            smart: &shared.smart,
            smart_slot: &c.smart,
            smart_asked: &mut c.smart_asked,
            in_use: &shared.counters.buffers_in_use,
        };
        (&mut c.conn, &mut c.link, backend)
    }
}

impl Backend for ReactorBackend<'_> {
    fn reserve(&mut self, token: u16, len: usize) -> bool {
        let Some(entry) = self.buffers.get_mut(token as usize) else {
            return false;
        };
        if entry.is_none() {
            let (pool, large) = self.pools.for_len(len);
            // (never larger: the largest buffers are of the largest transfer let in)
            debug_assert!(len <= pool.buffer_size());
            // none taken ahead of a command that waits for one of its kind
            if !self.waiting.gate.buffers_open(large) {
                return false;
            }
            *entry = pool.alloc();
            match entry {
                Some(_) => {
                    self.in_use.fetch_add(1, Ordering::Relaxed);
                }
                None => self.waiting.gate.no_buffer(large),
            }
        }
        entry.is_some()
    }

    fn buffer(&self, token: u16) -> Option<VolatileSlice<'_>> {
        self.buffers
            .get(token as usize)?
            .as_ref()
            .map(DmaBuffer::as_volatile_slice)
    }

    fn submit(&mut self, token: u16, request: Request) -> Result<(), Refused> {
        let Request { op, len, .. } = request;
        // none submitted ahead of a command that waits for room on the same device
        if !self.waiting.gate.room_open(request.device) {
            return Err(Refused::Busy);
        }
        let buf = match self.buffers.get(token as usize) {
            Some(Some(b)) if op.has_data() => Some(IoBuffer {
                iova: b.iova(),
                len: len as u32,
            }),
            _ => None,
        };
        let engine_token = ((self.slot as u64) << TOKEN_BITS) | u64::from(token);
        let device = self
            .devices
            .get_mut(request.device)
            .ok_or(Refused::Failed(Status::INVALID_NAMESPACE))?;
        let Err(e) = device.submit(op, request.offset, len, buf, engine_token) else {
            return Ok(());
        };
        if let BlockError::Busy { needed, .. } = e {
            // Room comes as the reactor's I/O completes; with none in flight, a command of
            // several parts that finds no room never will (more parts than the queue holds).
            let idle = self.devices.iter().all(|d| d.in_flight() == 0);
            if needed < 2 || !idle {
                self.waiting.gate.no_room(request.device);
                return Err(Refused::Busy);
            }
            log::error!("{e}, and nothing in flight frees any: the command fails");
            return Err(Refused::Failed(Status::INTERNAL_ERROR));
        }
        log::warn!("{e}");
        Err(Refused::Failed(refusal_status(&e)))
    }

    fn wait(&mut self, token: u16) {
        self.waiting.push(self.slot as u32, token);
    }

    fn release(&mut self, token: u16) {
        if let Some(entry) = self.buffers.get_mut(token as usize) {
            if let Some(b) = entry.take() {
                self.in_use.fetch_sub(1, Ordering::Relaxed);
                let _ = self.pools.for_len(b.len()).0.free(b);
                self.waiting.gate.freed();
            }
        }
    }

    fn smart_request(&mut self) -> bool {
        if !*self.smart_asked {
            *self.smart_asked = self.smart.request(self.smart_slot);
        }
        *self.smart_asked
    }

    fn smart_answer(&mut self) -> Option<SmartLog> {
        if !*self.smart_asked {
            return None;
        }
        let answer = self.smart_slot.answer.lock().take();
        *self.smart_asked = answer.is_none();
        answer
    }
}

/// The NVMe status of a block device's refusal to take a request (other than for want of
/// room, which waits).
pub(super) fn refusal_status(e: &BlockError) -> Status {
    use usnvme_driver::SubmitError;
    match e {
        BlockError::OutOfRange { .. } => Status::LBA_OUT_OF_RANGE,
        BlockError::Submit {
            source: SubmitError::InvalidNamespace { .. },
            ..
        } => Status::INVALID_NAMESPACE,
        // the device is gone or failed (a hot-removed drive, a target given up)
        BlockError::Submit {
            source: SubmitError::Dead,
            ..
        } => Status::NAMESPACE_NOT_READY,
        _ => Status::INTERNAL_ERROR,
    }
}

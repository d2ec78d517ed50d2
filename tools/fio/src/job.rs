//! One fio job (a thread) as the engine sees it: its own I/O queues on the controllers of its
//! files (one per controller, shared by its namespaces, on the job's NUMA node), fio's I/O
//! buffers in DMA memory those controllers reach, and the completions fio has not collected.
//! Nothing here allocates, locks or makes a system call per I/O.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use usnvme_driver::IoBuffer;
use usnvme_engine::block::DmaTarget;
use usnvme_engine::topology::Topology;
use usnvme_engine::transport::Queues;
use usnvme_engine::{BlockDevice, BlockError, Channel, ChannelOptions, Op};
use usnvme_hugepages::{DmaRegion, Memory};

thread_local! {
    /// Why this thread's last I/O failed, for fio's `errdetails` (which is given only the I/O).
    static LAST_FAILURE: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Why the last I/O that failed on this thread failed.
pub fn last_failure() -> String {
    LAST_FAILURE.with(|f| f.borrow().clone())
}

fn fail(why: String) {
    LAST_FAILURE.with(|f| *f.borrow_mut() = why);
}

/// A finished I/O: fio's token, and whether it failed (why: [`last_failure`]).
/// As C sees it: `struct usnvme_done { uint64_t token; bool failed; }`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Done {
    pub token: u64,
    pub failed: bool,
}

/// How `queue` went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queued {
    Queued,
    /// No room until completions are collected.
    Busy,
    /// Refused (why: [`last_failure`]).
    Refused,
}

#[derive(Debug)]
pub struct Job {
    /// One per fio file, in fio's order.
    channels: Vec<Channel>,
    dma: DmaTarget,
    node: Option<u32>,
    /// fio's I/O buffers (`iomem_alloc`).
    buffers: Option<DmaRegion>,
    /// Finished, not yet handed to fio; never more than the job's depth.
    done: VecDeque<Done>,
    /// What the last [`Job::reap`] handed up.
    events: Vec<Done>,
    /// Ring doorbells at [`Job::commit`], not at the next [`Job::reap`] (see there).
    ring_on_commit: bool,
}

impl Job {
    /// Queues for `devices` (the job's files), each holding `depth` I/Os of up to `max_io`
    /// bytes, on the NUMA node of the CPU the job runs on. `ring_on_commit`: for jobs that pace
    /// themselves (see [`Job::commit`]).
    pub fn new(
        devices: &[Arc<dyn BlockDevice>],
        depth: u32,
        max_io: u64,
        ring_on_commit: bool,
    ) -> Result<Job, String> {
        let first = devices.first().ok_or("the job has no files")?;
        let dma = first.dma();
        if let Some(other) = devices
            .iter()
            .find(|d| !Arc::ptr_eq(&d.dma().space, &dma.space))
        {
            return Err(format!(
                "{} and {} cannot share one job's I/O buffers (simulated drives and drives on \
                 vfio-pci have DMA memory of their own): put them in separate jobs",
                first.info().name,
                other.info().name
            ));
        }
        let node = nix::sched::sched_getcpu().ok().and_then(|cpu| {
            Topology::from_sysfs("/".as_ref())
                .ok()
                .and_then(|t| t.node_of(cpu))
        });
        let options = ChannelOptions {
            depth: depth.clamp(1, u32::from(u16::MAX)) as u16,
            io_size: Some(max_io.max(1)),
            node,
            ..ChannelOptions::default()
        };
        let mut queues = Queues::new();
        let channels = devices
            .iter()
            .map(|d| {
                d.channel(&mut queues, &options)
                    .map_err(|e| format!("{}: {e}", d.info().name))
            })
            .collect::<Result<Vec<_>, _>>()?;
        drop(queues);
        Ok(Job {
            channels: channels.into_iter().map(Channel::settle).collect(),
            dma,
            node,
            buffers: None,
            done: VecDeque::with_capacity(depth as usize + 1),
            events: Vec::with_capacity(depth as usize + 1),
            ring_on_commit,
        })
    }

    /// fio's I/O buffers: `len` bytes the job's controllers can reach.
    pub fn alloc_buffers(&mut self, len: usize) -> Result<*mut u8, String> {
        let memory = Memory::allocate(len.max(1), self.dma.page, self.node)
            .map_err(|e| format!("I/O buffers of {len} bytes: {e}"))?;
        let region = self
            .dma
            .space
            .map(memory)
            .map_err(|e| format!("I/O buffers of {len} bytes: {e}"))?;
        let start = region.as_ptr();
        self.buffers = Some(region);
        Ok(start)
    }

    pub fn free_buffers(&mut self) {
        self.buffers = None;
    }

    /// Queues `op` on file `file` (`len` bytes at `offset`, from or into `buf`, one of fio's
    /// buffers) as I/O `token`. Doorbells ring at [`Job::commit`] or [`Job::reap`].
    #[inline]
    pub fn queue(
        &mut self,
        file: usize,
        op: Op,
        offset: u64,
        len: u64,
        buf: *const u8,
        token: u64,
    ) -> Queued {
        let Some(channel) = self.channels.get_mut(file) else {
            fail(format!("no file {file} in this job"));
            return Queued::Refused;
        };
        let io = if op.has_data() {
            match buffer(self.buffers.as_ref(), buf, len) {
                Some(io) => Some(io),
                None => {
                    fail(format!(
                        "the I/O buffer at {buf:p} ({len} bytes) is not in the engine's DMA memory"
                    ));
                    return Queued::Refused;
                }
            }
        } else {
            None
        };
        match channel.submit(op, offset, len, io, token) {
            Ok(()) => Queued::Queued,
            Err(BlockError::Busy { .. }) => Queued::Busy,
            Err(e) => {
                fail(e.to_string());
                Queued::Refused
            }
        }
    }

    /// fio's commit, after every I/O it queues by default (`iodepth_batch=1`). A doorbell per
    /// I/O is an MMIO write per I/O, so, as SPDK delays submissions, the doorbells ring when fio
    /// next collects completions ([`Job::reap`]), which it always does before it waits for
    /// anything. Only a job that paces itself (`rate`, `thinktime`) may sleep between the two:
    /// its doorbells ring here.
    pub fn commit(&mut self) {
        if self.ring_on_commit {
            for c in &mut self.channels {
                c.flush();
            }
        }
    }

    /// Rings the doorbells of what was queued, collects finished I/Os until at least `min` are
    /// there, `timeout` passed or nothing is in flight, and hands up to `max` of them; the rest
    /// wait for the next call.
    pub fn reap(&mut self, min: usize, max: usize, timeout: Option<Duration>) -> &[Done] {
        // fio never has more in flight than its depth, the capacity: no allocation here
        let max = max.min(self.events.capacity());
        let want = min.min(max);
        let mut deadline = None;
        loop {
            let done = &mut self.done;
            for c in &mut self.channels {
                c.poll(|f| {
                    let failed = f.failure.is_some();
                    if let Some(failure) = f.failure {
                        fail(failure.error().to_string());
                    }
                    done.push_back(Done {
                        token: f.token,
                        failed,
                    });
                });
            }
            if self.done.len() >= want {
                break;
            }
            if let Some(t) = timeout {
                // the clock only when waiting: a reap that finds enough reads none
                let at = *deadline.get_or_insert_with(|| Instant::now() + t);
                if Instant::now() >= at {
                    break;
                }
            }
            if !self.channels.iter().any(Channel::busy) {
                break; // nothing in flight: nothing to wait for
            }
        }
        let n = self.done.len().min(max);
        self.events.clear();
        self.events.extend(self.done.drain(..n));
        &self.events
    }
}

/// `len` bytes at `buf` as the device sees them, when they are inside `region`.
#[inline]
fn buffer(region: Option<&DmaRegion>, buf: *const u8, len: u64) -> Option<IoBuffer> {
    let region = region?;
    let offset = (buf as usize).checked_sub(region.as_ptr() as usize)?;
    let end = offset.checked_add(usize::try_from(len).ok()?)?;
    if end > region.len() {
        return None;
    }
    Some(IoBuffer {
        iova: region.iova_of(offset),
        len: u32::try_from(len).ok()?,
    })
}

//! A reactor's path to one device: submission, polling, statistics, stall probes.

use std::os::fd::BorrowedFd;

use super::reactor::ReactorClock;
use super::*;

/// With I/O in flight and nothing completing for this long, a channel reads its controllers'
/// status register (at most this often) to tell a removed device from a slow one.
const STALL_PROBE: Duration = Duration::from_millis(500);
const STALL_PROBE_NS: u64 = STALL_PROBE.as_nanos() as u64;

/// One reactor's path to one device: the device's channel, with statistics.
///
/// An I/O's token goes down with its op kind in the top bits (see [`MAX_TOKEN`]) and comes
/// back from the driver's tracker with its submission stamp: no table here. The clock is the
/// reactor's, read at most once per channel visit: at the first completion of a poll, or at
/// the first submission when nothing completed (not per I/O).
///
/// A device that disappears (surprise removal, or given back to the kernel: its registers read
/// all ones) completes nothing. When a channel has I/O in flight and nothing completed for
/// [`STALL_PROBE`], it checks its controllers; if one is gone, every I/O in flight completes
/// with "Host Pathing Error", the channel's queue pairs are dropped and later submissions fail:
/// the reactor goes on with its other devices. (The queue pairs would fail those I/Os
/// themselves, but only after their command timeout.)
pub struct DeviceChannel {
    /// Index of the device in the run's list.
    pub device: usize,
    pub info: BlockInfo,
    pub(super) name: Arc<str>,
    pub(super) dma: DmaTarget,
    pub(super) node: Option<u32>,
    pub(super) channel: Channel,
    pub(super) stats: IoStats,
    pub(super) in_flight: usize,
    /// The controllers under the device (one for a namespace, the members' for a stripe).
    pub(super) controllers: Vec<Controller>,
    pub(super) clock: ReactorClock,
    /// The reactor's clock this turn, or at this channel's last completions (nanoseconds).
    pub(super) now_ns: u64,
    /// `now_ns` was read during this channel's visit (completions came, or I/O was submitted):
    /// what is submitted next is stamped with it, not with the turn's start, which lies
    /// before every earlier channel's work in the turn.
    pub(super) fresh: bool,
    /// The last completion, or the submission that made the channel busy.
    pub(super) last_progress_ns: u64,
    /// The last stall probe.
    pub(super) last_probe_ns: u64,
    /// What was found gone ("0000:05:00.0 is gone", "the target is gone: …"), if anything.
    pub(super) removed: Option<Arc<str>>,
}

impl std::fmt::Debug for DeviceChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceChannel")
            .field("device", &self.device)
            .field("in_flight", &self.in_flight)
            .finish()
    }
}

/// Where the op kind sits in the tokens the block layer carries (see [`MAX_TOKEN`]).
const KIND_SHIFT: u32 = 62;
/// The op kind of each value of a token's top two bits (`kind as u64` put it there): a
/// lookup, not a chain of tests, per completion.
const KIND_OF_TAG: [OpKind; 4] = [OpKind::Read, OpKind::Write, OpKind::Other, OpKind::Other];

impl DeviceChannel {
    pub(super) fn new(
        index: usize,
        device: &Arc<dyn BlockDevice>,
        channel: Channel,
        controllers: Vec<Controller>,
        node: Option<u32>,
        clock: &ReactorClock,
        options: &ChannelOptions,
    ) -> DeviceChannel {
        DeviceChannel {
            device: index,
            info: device.info().clone(),
            name: Arc::from(device.info().name.as_str()),
            dma: device.dma(),
            node,
            channel,
            stats: IoStats::with_histograms(options.latency_histograms),
            in_flight: 0,
            controllers,
            clock: clock.clone(),
            now_ns: 0,
            fresh: false,
            last_progress_ns: 0,
            last_probe_ns: 0,
            removed: None,
        }
    }

    /// Lets the device go while the reactor runs (it was removed, or is no longer used): its
    /// queue pairs are dropped and every later submission is refused. Only with nothing in
    /// flight (false, and nothing done, otherwise): the device may still be writing into the
    /// buffers of what is.
    pub fn close(&mut self, why: &str) -> bool {
        if self.in_flight > 0 {
            return false;
        }
        if !matches!(self.channel, Channel::Gone(_)) {
            self.channel = Channel::Gone(Arc::from(format!("{}: {why}", self.name)));
        }
        self.removed.get_or_insert_with(|| Arc::from(why));
        true
    }

    /// Queues an I/O (see [`Channel::submit`]); `token` (at most [`MAX_TOKEN`]) comes back
    /// with its completion. Doorbells ring on [`DeviceChannel::flush`] or the next poll.
    #[inline]
    pub fn submit(
        &mut self,
        op: Op,
        offset: u64,
        len: u64,
        buf: Option<IoBuffer>,
        token: u64,
    ) -> Result<(), BlockError> {
        if token > MAX_TOKEN {
            return Err(BlockError::Token {
                device: self.name.clone(),
                token,
            });
        }
        let kind = match op {
            Op::Read => OpKind::Read,
            Op::Write => OpKind::Write,
            _ => OpKind::Other,
        };
        if !self.fresh {
            self.set_now(self.clock.now_ns());
            self.fresh = true;
        }
        if let Err(e) =
            self.channel
                .submit(op, offset, len, buf, token | (kind as u64) << KIND_SHIFT)
        {
            self.note_ended();
            return Err(e);
        }
        if self.in_flight == 0 {
            self.last_progress_ns = self.now_ns; // the channel was idle: the stall clock starts
        }
        self.in_flight += 1;
        Ok(())
    }

    /// Rings the doorbells of what was queued since the last poll or flush.
    #[inline]
    pub fn flush(&mut self) {
        self.channel.flush();
    }

    /// Rings queued I/O and hands finished ones to `on_complete`; records their statistics.
    /// The clock is read again when the first completion comes: a completion stamped with the
    /// turn's time, read before it arrived, would report less than the device took. What is
    /// submitted after it carries that time too. One read per batch, not per I/O.
    #[inline]
    pub fn poll(&mut self, mut on_complete: impl FnMut(IoCompletion)) -> usize {
        let (stats, clock) = (&mut self.stats, &self.clock);
        let mut now = None;
        // inlined into the queue pair's loop, with `record`: no call per I/O
        let done = self.channel.poll(
            #[inline(always)]
            |f| {
                let now = *now.get_or_insert_with(|| clock.now_ns());
                record(stats, now, f, &mut on_complete)
            },
        );
        self.in_flight -= done.min(self.in_flight);
        if let Some(now) = now {
            self.set_now(now);
            self.fresh = true;
            self.stats
                .note_gap(now.saturating_sub(self.last_progress_ns));
            self.last_progress_ns = now;
            self.note_ended();
            return done;
        }
        let now = self.now_ns;
        if self.in_flight > 0
            && now.saturating_sub(self.last_progress_ns) >= STALL_PROBE_NS
            && now.saturating_sub(self.last_probe_ns) >= STALL_PROBE_NS
        {
            self.last_probe_ns = now;
            return self.probe(on_complete);
        }
        done
    }

    /// A remote target has no registers to probe: its queue tells it is gone (checked when
    /// completions come, and when a submission is refused).
    #[cold]
    fn note_ended(&mut self) {
        if self.controllers.is_empty() && self.removed.is_none() {
            if let Some(why) = self.channel.ended() {
                log::error!("{}: {why}: no more I/O to it", self.name);
                self.removed = Some(Arc::from(format!("the target is gone: {why}")));
            }
        }
    }

    /// The reactor's clock for this turn.
    #[inline]
    pub(super) fn set_now(&mut self, now_ns: u64) {
        self.now_ns = now_ns;
        self.channel.set_now(now_ns);
    }

    /// Checks the controllers of a stalled channel; fails everything in flight if one was removed.
    #[cold]
    fn probe(&mut self, mut on_complete: impl FnMut(IoCompletion)) -> usize {
        let Some(removed) = self.controllers.iter().find(|c| c.is_removed()) else {
            return 0;
        };
        log::error!(
            "{}: {} is gone (its registers read all ones): failing {} I/O(s) in flight; no more I/O to it",
            self.name,
            removed.name(),
            self.in_flight
        );
        self.removed = Some(Arc::from(format!("{} is gone", removed.name())));
        let (stats, now) = (&mut self.stats, self.now_ns);
        // The queue pairs go (their queues cannot be deleted on a removed device).
        let failed = self
            .channel
            .abandon(|f| record(stats, now, f, &mut on_complete));
        self.in_flight = 0;
        failed
    }

    /// What was found gone under this device ("0000:05:00.0 is gone", "the target is gone:
    /// …"), if anything: the channel takes no more I/O.
    pub fn removed(&self) -> Option<&str> {
        self.removed.as_deref()
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Whether the device's queue is shared with other devices of the reactor (see
    /// [`Channel::shares_queue`]).
    pub fn shares_queue(&self) -> bool {
        self.channel.shares_queue()
    }

    /// How many times the remote queues under this device reconnected (a target that went
    /// away and came back within the reconnect policy).
    pub fn reconnects(&self) -> u32 {
        self.channel.reconnects()
    }

    /// The eventfds of this device's local queue pairs, made with
    /// [`ChannelOptions::interrupts`]: each is raised when its drive posts a completion. Empty
    /// without interrupts and for a remote device (its queues are sockets). It allocates: for
    /// set-up.
    ///
    /// The reactor watches them (see [`ReactorContext::wait`]): edge-triggered, never read, so
    /// that queue pairs sharing an MSI-X vector, on one reactor or several, each wake; after a
    /// wait it polls every channel (not only those whose descriptor fired: channels on one
    /// queue take each other's completions). A wait needs a timeout (the stall probe's 500 ms or
    /// less): a removed drive raises nothing, and command timeouts are checked by polls. Each
    /// descriptor is the channel's own (channels on one queue each have one, all raised
    /// together): the reactor stops watching them before the channel is let go of
    /// ([`ReactorContext::let_go`]).
    pub fn interrupts(&self) -> Vec<BorrowedFd<'_>> {
        let mut fds = Vec::new();
        self.channel.interrupts(&mut fds);
        fds
    }

    /// Whether another I/O can be queued now (it may still need more commands than are free).
    pub fn has_room(&self) -> bool {
        self.channel.free_commands() > 0
    }

    /// This device's statistics on this reactor, since the start or the last reset.
    pub fn stats(&self) -> &IoStats {
        &self.stats
    }

    /// Starts the statistics afresh (e.g. at the end of a warm-up).
    pub fn reset_stats(&mut self) {
        self.stats.reset();
    }

    /// Buffers for this device's I/O, in its DMA space and on the reactor's node.
    pub fn buffer_pool(&self, buffer_size: usize, count: usize) -> Result<BufferPool, PoolError> {
        BufferPool::new(
            &self.dma.space,
            buffer_size,
            count,
            self.dma.page,
            self.node,
        )
    }
}

/// Records a finished I/O (latency on the reactor's clock) and hands it to the job.
#[inline(always)]
fn record(
    stats: &mut IoStats,
    now_ns: u64,
    f: Finished,
    on_complete: &mut impl FnMut(IoCompletion),
) {
    let kind = KIND_OF_TAG[(f.token >> KIND_SHIFT) as usize];
    let latency = now_ns.saturating_sub(f.submitted_ns);
    stats.record(kind, f.bytes, latency, f.failure.is_none());
    on_complete(IoCompletion {
        token: f.token & MAX_TOKEN,
        failure: f.failure,
    });
}

#[cfg(test)]
mod tests {
    use usnvme_hugepages::DmaBuffer;

    use super::*;
    use crate::topology::Topology;

    /// Reads `total` times on every device, 4 in flight on each, and sleeps in the reactor's
    /// wait, on the devices' interrupts, whenever a turn completed nothing.
    struct Sleeper {
        total: u64,
        buffers: Vec<(BufferPool, DmaBuffer)>,
        submitted: Vec<u64>,
        completed: Vec<u64>,
        sleeps: u64,
        registered: usize,
    }

    impl Job for Sleeper {
        /// Completions per device, sleeps, descriptors registered.
        type Output = (Vec<u64>, u64, usize);

        fn prepare(&mut self, ctx: &mut ReactorContext) -> Result<(), String> {
            for d in &ctx.devices {
                self.registered += d.interrupts().len();
                let mut pool = d.buffer_pool(4096, 1).map_err(|e| e.to_string())?;
                let buf = pool.alloc().ok_or("no DMA buffer")?;
                self.buffers.push((pool, buf));
            }
            self.submitted = vec![0; ctx.devices.len()];
            self.completed = vec![0; ctx.devices.len()];
            Ok(())
        }

        fn turn(&mut self, ctx: &mut ReactorContext) -> bool {
            let mut finished = 0;
            for (i, d) in ctx.devices.iter_mut().enumerate() {
                // (the reads land in one buffer: only their completions count)
                let io = IoBuffer {
                    iova: self.buffers[i].1.iova(),
                    len: 4096,
                };
                while self.submitted[i] < self.total && d.in_flight() < 4 && d.has_room() {
                    let lba = self.submitted[i] % 64 * 4096;
                    d.submit(Op::Read, lba, 4096, Some(io), self.submitted[i])
                        .expect("submitted");
                    self.submitted[i] += 1;
                }
                let completed = &mut self.completed[i];
                finished += d.poll(|c| {
                    assert_eq!(c.result(), Ok(()));
                    *completed += 1;
                });
            }
            let busy = ctx.devices.iter().any(|d| d.in_flight() > 0);
            if finished == 0 && busy {
                let mut interrupts = 0;
                ctx.wait(Duration::from_secs(10), |token| {
                    interrupts += usize::from(token == crate::engine::INTERRUPT);
                });
                assert!(
                    interrupts > 0,
                    "no interrupt within 10 s: {:?}",
                    self.completed
                );
                self.sleeps += 1;
            }
            busy || self.submitted.iter().any(|&s| s < self.total)
        }

        fn finish(mut self, _ctx: &mut ReactorContext) -> Self::Output {
            for (mut pool, buf) in self.buffers.drain(..) {
                pool.free(buf).expect("own");
            }
            (self.completed, self.sleeps, self.registered)
        }
    }

    #[test]
    fn a_reactor_sleeps_on_its_drives_interrupts_until_every_io_completed() {
        // sim:0's two namespaces share the reactor's queue to it
        let core = Topology::from_sysfs("/".as_ref())
            .expect("topology")
            .allowed[0];
        let interrupts = ChannelOptions {
            interrupts: true,
            ..ChannelOptions::default()
        };
        let engine = super::super::tests::sim_engine_with(
            &[
                "sim:0,ns=2,mode=threaded,latency=1ms",
                "sim:1,mode=threaded,latency=1ms",
            ],
            &[core],
            interrupts,
        );
        let run = engine
            .start(engine.namespaces(), |_| Sleeper {
                total: 200,
                buffers: Vec::new(),
                submitted: Vec::new(),
                completed: Vec::new(),
                sleeps: 0,
                registered: 0,
            })
            .expect("started");
        let results = run.wait().expect("the run ends");
        let (completed, sleeps, registered) = &results[0].output;
        assert_eq!(completed, &[200, 200, 200], "every read completed");
        assert!(*sleeps > 0, "1 ms per read: the reactor slept");
        assert_eq!(*registered, 3, "one descriptor per namespace channel");
    }
}

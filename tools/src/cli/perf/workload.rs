//! The perf job: on each reactor, for each device it serves, keep `depth` I/Os in flight.
//!
//! Sequential patterns walk the reactor's own region of the device (the device split evenly
//! between the reactors that serve it); random ones pick aligned offsets in that region with a
//! PRNG (fastrand) seeded per reactor and device. Every in-flight I/O owns one slot (its DMA
//! buffer, op and offset), prepared before any reactor starts; the slot's index is the I/O's
//! token all the way to the driver, and nothing is allocated per I/O. Each turn visits each
//! device once: completions first, then their slots refilled at once, then one doorbell, so a
//! slot never waits a turn idle. Statistics are the engine's (reset when the warm-up ends,
//! taken when the measured time ends), on the reactor's clock, read once per turn.
//!
//! `--verify`: every block written carries `usnvme_stamp`'s stamp (every byte of it follows from
//! the block's offset and the run's seed); every read buffer is poisoned first, so that a read
//! that completes but brings no data shows; every block read back is checked whole.
//!
//! `--pi`: on a namespace driven with its metadata, each block's data sits where
//! [`BufferLayout`] says, and perf makes and checks the protection information the drive does
//! not insert (`metadata`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use usnvme_driver::IoBuffer;
use usnvme_engine::block::IoError;
use usnvme_engine::engine::DeviceChannel;
use usnvme_engine::stats::{IoStats, OpKind};
use usnvme_engine::{IoCompletion, Job, Op, ReactorContext, Share};
use usnvme_hugepages::{BufferPool, DmaBuffer};

use super::metadata::BufferLayout;

/// What one measurement runs, the same on every reactor: I/O size, depth, pattern, how long,
/// stamps.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub io_size: u64,
    pub depth: usize,
    pub random: bool,
    /// Percentage of reads (100: reads only, 0: writes only).
    pub read_pct: u32,
    pub warmup: Duration,
    /// Measured time after the warm-up; `None` with `io_count`.
    pub duration: Option<Duration>,
    /// Stop after this many I/Os submitted per reactor per device (warm-up included).
    pub io_count: Option<u64>,
    /// IOPS of each reactor on each device it serves.
    pub rate: Option<f64>,
    pub verify: bool,
    /// Debug: every write after this many carries a bad checksum in its first block.
    pub corrupt_after: Option<u64>,
    pub seed: u64,
    /// Set once the controllers were reset (`--reset-after`): completions after it are counted.
    pub reset_done: Option<Arc<AtomicBool>>,
    /// The spans of the devices added while the run goes on (`--hotplug`), by device index.
    pub added_spans: Arc<parking_lot::Mutex<std::collections::HashMap<usize, Region>>>,
    /// `--interrupts`: a turn that completed nothing sleeps until a drive's interrupt.
    pub interrupts: bool,
}

/// Where this reactor works on one device: `[start, start + len)`, in bytes.
#[derive(Debug, Clone, Copy)]
pub struct Region {
    pub start: u64,
    pub len: u64,
}

/// A verify failure: a block read back that is not what this run wrote there.
#[derive(Debug, Clone)]
pub struct Mismatch {
    pub lba: u64,
    pub what: String,
}

/// What a reactor hands back for one device.
#[derive(Debug)]
pub struct DeviceResult {
    pub device: usize,
    pub stats: IoStats,
    /// The measured window, and where a device that joined the run did into it.
    pub elapsed: Duration,
    pub joined: Option<Duration>,
    /// Successful `[reads, writes]` completed in each whole second of the measured window, by
    /// seconds since its start (fio's IOPS and bandwidth samples); empty with `--io-count`.
    pub per_second: Vec<[u64; 2]>,
    pub mismatches: Vec<Mismatch>,
    /// Mismatches beyond those kept.
    pub more_mismatches: u64,
    /// Blocks read back whose stamp was checked (`--verify`).
    pub checked: u64,
    /// I/Os that failed, over the whole run (warm-up and drain included), aborted ones too.
    pub failed: u64,
    /// Of those, I/Os a controller reset aborted ("Command Aborted By Host").
    pub aborted: u64,
    /// I/Os that completed successfully after the reset (`--reset-after`).
    pub after_reset: u64,
    /// What was found gone under this device ("0000:05:00.0 is gone"), if anything.
    pub removed: Option<String>,
    /// Times its remote queues connected again.
    pub reconnects: u32,
    /// The first I/O that failed other than by a reset or a removal, or a setup failure.
    pub error: Option<String>,
    /// The reactor's CPU time over the measured window, `[user, system]` (shared by the
    /// devices it serves).
    pub cpu: [Duration; 2],
}

/// The longest sleep on the drives' interrupts (`--interrupts`): the stall probe and the
/// command timeouts are checked by polls.
const SLEEP_AT_MOST: Duration = Duration::from_millis(100);

/// Most mismatches kept per device (the rest are only counted).
const KEEP_MISMATCHES: usize = 16;

/// One I/O in flight: its index is the I/O's token.
struct Slot {
    buf: DmaBuffer,
    /// The I/O's op and offset, kept for `--verify` and `--pi` only.
    op: Op,
    offset: u64,
}

struct DevState {
    region: Region,
    /// When the device joined the run (the reactor's clock; zero: at the start).
    since: Duration,
    pool: BufferPool,
    slots: Vec<Slot>,
    free: Vec<usize>,
    /// The engine's statistics as the measured time ended (time mode).
    measured: Option<IoStats>,
    /// Successful `[reads, writes]` so far at the end of each whole second of the measured
    /// window (sized at setup); `DeviceResult::per_second` is their differences.
    seconds: Vec<[u64; 2]>,
    seconds_marked: usize,
    rng: fastrand::Rng,
    cursor: u64,
    issued: u64,
    writes: u64,
    tokens: f64,
    refilled: Duration,
    last_completion: Duration,
    mismatches: Vec<Mismatch>,
    more_mismatches: u64,
    checked: u64,
    failed: u64,
    aborted: u64,
    after_reset: u64,
    /// "Host Pathing Error" failures: the device's removal, unless it is still there.
    pathing_error: Option<String>,
    /// The device takes no more I/O (removed, or a submission failed for good).
    stopped: bool,
    error: Option<String>,
    /// The device's name (a stripe's, whose LBAs a failure names).
    name: String,
    /// The buffer bytes of an I/O.
    io_bytes: u32,
    /// Ops and offsets are kept in the slots (`--verify`, `--pi`), and the blocks stamped,
    /// checked, protected as `tracked` says.
    track: bool,
    tracked: Tracked,
}

/// What the tracked I/Os of a device need: where each block's data and metadata sit in a
/// buffer, and blocks to work in (DMA memory is only copied, never borrowed).
struct Tracked {
    layout: BufferLayout,
    /// `--verify`: one block to stamp or check in, and one block of poison; empty otherwise.
    block: Vec<u8>,
    poison: Vec<u8>,
    /// PRACT=0: one block's data and metadata, to make and check tuples in; empty otherwise.
    pi_data: Vec<u8>,
    pi_metadata: Vec<u8>,
}

impl Drop for DevState {
    /// Gives the buffers back, so that the pool can unmap its memory.
    fn drop(&mut self) {
        for slot in self.slots.drain(..) {
            let _ = self.pool.free(slot.buf);
        }
    }
}

/// The job (one per reactor).
pub struct Workload {
    run: RunSpec,
    /// This reactor's region of each device it serves, in `ReactorInfo::devices` order.
    regions: Vec<Region>,
    states: Vec<DevState>,
    /// The reactor's clock at the first turn, and at the last.
    started: Option<Duration>,
    last_turn: Duration,
    /// The warm-up is over: the engine's statistics were reset.
    measuring: bool,
    /// The reactor thread's CPU time `[user, system]` as the measured window began, and as it
    /// ended.
    cpu_from: [Duration; 2],
    cpu_to: Option<[Duration; 2]>,
}

impl std::fmt::Debug for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workload").field("run", &self.run).finish()
    }
}

impl Workload {
    pub fn new(run: RunSpec, regions: Vec<Region>) -> Self {
        Workload {
            run,
            regions,
            states: Vec::new(),
            started: None,
            last_turn: Duration::ZERO,
            measuring: false,
            cpu_from: [Duration::ZERO; 2],
            cpu_to: None,
        }
    }

    /// With `--interrupts`: sleeps in the reactor's wait until a device's interrupt (at most
    /// [`SLEEP_AT_MOST`]).
    fn sleep(&self, ctx: &mut ReactorContext) {
        if self.run.interrupts {
            ctx.wait(SLEEP_AT_MOST, |_| {});
        }
    }

    /// Buffers and slots for every device: done once, before the clock starts.
    fn setup(&mut self, ctx: &mut ReactorContext) -> Result<(), String> {
        for (i, dev) in ctx.devices.iter().enumerate() {
            let region = self.regions.get(i).copied().ok_or("no region")?;
            self.add_state(dev, region, ctx.info.index, Duration::ZERO)?;
        }
        Ok(())
    }

    /// Buffers, slots and counters for device `dev`, whose `region` this reactor (`reactor`)
    /// works on from `since` on (its reactor's clock; zero: from the start).
    fn add_state(
        &mut self,
        dev: &DeviceChannel,
        region: Region,
        reactor: usize,
        since: Duration,
    ) -> Result<(), String> {
        let layout = BufferLayout::of(&dev.info);
        let io_bytes = dev.info.buffer_bytes(self.run.io_size);
        let mut pool = dev
            .buffer_pool(pool_buffer_size(io_bytes), self.run.depth)
            .map_err(|e| format!("{}: DMA buffers: {e}", dev.info.name))?;
        let mut slots = Vec::with_capacity(self.run.depth);
        for _ in 0..self.run.depth {
            let buf = pool
                .alloc()
                .ok_or_else(|| format!("{}: DMA buffer pool ran out", dev.info.name))?;
            buf.fill(0);
            slots.push(Slot {
                buf,
                op: Op::Read,
                offset: 0,
            });
        }
        let seed = self.run.seed ^ ((reactor as u64) << 32) ^ dev.device as u64;
        let block_len = if self.run.verify {
            dev.info.block_size as usize
        } else {
            0
        };
        let mut poison = vec![0u8; block_len];
        usnvme_stamp::poison(&mut poison);
        let seconds = self.run.duration.map_or(0, |d| d.as_secs() as usize);
        self.states.push(DevState {
            region,
            since,
            pool,
            slots,
            free: (0..self.run.depth).rev().collect(),
            measured: None,
            seconds: vec![[0; 2]; seconds],
            seconds_marked: 0,
            rng: fastrand::Rng::with_seed(seed),
            cursor: 0,
            issued: 0,
            writes: 0,
            tokens: 1.0,
            refilled: Duration::ZERO,
            last_completion: Duration::ZERO,
            mismatches: Vec::with_capacity(KEEP_MISMATCHES),
            more_mismatches: 0,
            checked: 0,
            failed: 0,
            aborted: 0,
            after_reset: 0,
            pathing_error: None,
            stopped: false,
            error: None,
            name: dev.info.name.clone(),
            io_bytes: io_bytes as u32,
            track: self.run.verify || dev.info.protection.is_some(),
            tracked: Tracked {
                layout,
                block: vec![0u8; block_len],
                poison,
                pi_data: vec![0u8; layout.scratch_bytes().min(1) * layout.block],
                pi_metadata: vec![0u8; layout.scratch_bytes()],
            },
        });
        Ok(())
    }
}

impl Job for Workload {
    type Output = Vec<DeviceResult>;

    /// Buffers and slots before any reactor starts: the clock starts with the first turn.
    fn prepare(&mut self, ctx: &mut ReactorContext) -> Result<(), String> {
        self.setup(ctx)
    }

    /// A drive added while the run goes on (`--hotplug`): this reactor's share of the span
    /// the session gave it, from now on.
    fn device_added(&mut self, ctx: &mut ReactorContext, share: Share) -> Result<(), String> {
        let dev = ctx.devices.last().ok_or("no device")?;
        if self.states.len() + 1 != ctx.devices.len() {
            return Err(format!(
                "{}: out of step with the reactor's devices",
                dev.info.name
            ));
        }
        let span = self.run.added_spans.lock().get(&dev.device).copied();
        let span = span.ok_or_else(|| format!("{}: no span given", dev.info.name))?;
        let region = super::regions::region(span, share, self.run.io_size);
        self.add_state(dev, region, ctx.info.index, ctx.now())
    }

    fn turn(&mut self, ctx: &mut ReactorContext) -> bool {
        let now = ctx.now();
        let started = *self.started.get_or_insert(now);
        self.last_turn = now;
        let measure_from = started + self.run.warmup;
        let deadline = self.run.duration.map(|d| measure_from + d);
        let time_up = deadline.is_some_and(|d| now >= d);
        if !self.measuring && now >= measure_from {
            // the warm-up is over: count from here
            ctx.devices.iter_mut().for_each(|d| d.reset_stats());
            self.measuring = true;
            self.cpu_from = thread_cpu();
        }
        if time_up && self.cpu_to.is_none() {
            self.cpu_to = Some(thread_cpu());
        }
        let mut busy = false;
        // whether this turn completed or submitted anything (free slots changed)
        let mut worked = false;
        for (dev, st) in ctx.devices.iter_mut().zip(&mut self.states) {
            let free = st.free.len();
            reap(&self.run, dev, st, now);
            worked |= st.free.len() != free;
            if self.measuring && st.measured.is_none() {
                mark_seconds(dev, st, now.saturating_sub(measure_from));
                if time_up {
                    // the measured time is over: what completes from now on is not counted
                    st.measured = Some(dev.stats().clone());
                }
            }
            if dev.removed().is_some() {
                st.stopped = true;
            }
            let count_done = self.run.io_count.is_some_and(|n| st.issued >= n);
            // A dead device (removed, or refusing I/O for good) gets no more: a reactor whose
            // devices are all dead ends its job.
            let stop = time_up || count_done || st.stopped;
            if !stop {
                let free = st.free.len();
                submit_some(&self.run, dev, st, now);
                dev.flush();
                worked |= st.free.len() != free;
            }
            busy |= !stop || dev.in_flight() > 0;
        }
        if busy && !worked && ctx.devices.iter().any(|d| d.in_flight() > 0) {
            self.sleep(ctx);
        }
        busy
    }

    fn finish(self, ctx: &mut ReactorContext) -> Vec<DeviceResult> {
        let started = self.started.unwrap_or(self.last_turn);
        let measure_from = started + self.run.warmup;
        let deadline = self.run.duration.map(|d| measure_from + d);
        let measuring = self.measuring;
        let cpu = match (measuring, self.cpu_to) {
            (false, _) => [Duration::ZERO; 2],
            (true, to) => {
                let to = to.unwrap_or_else(thread_cpu);
                [0, 1].map(|i| to[i].saturating_sub(self.cpu_from[i]))
            }
        };
        ctx.devices
            .iter()
            .zip(self.states)
            .map(|(dev, mut st)| {
                // Time mode: up to the deadline (or the stop); I/O count: up to the last completion.
                let end = match deadline {
                    Some(d) => self.last_turn.min(d),
                    None => st.last_completion,
                };
                let stats = match (st.measured.take(), measuring) {
                    (Some(s), _) => s,
                    (None, true) => dev.stats().clone(),
                    (None, false) => IoStats::with_histograms(false),
                };
                let mut before = [0; 2];
                let per_second = st.seconds[..st.seconds_marked]
                    .iter()
                    .map(|&now| {
                        let n = [now[0] - before[0], now[1] - before[1]];
                        before = now;
                        n
                    })
                    .collect();
                DeviceResult {
                    device: dev.device,
                    stats,
                    elapsed: end.saturating_sub(measure_from.max(st.since)),
                    joined: (st.since > measure_from).then(|| st.since - measure_from),
                    per_second,
                    mismatches: std::mem::take(&mut st.mismatches),
                    more_mismatches: st.more_mismatches,
                    checked: st.checked,
                    failed: st.failed,
                    aborted: st.aborted,
                    after_reset: st.after_reset,
                    removed: dev.removed().map(str::to_owned),
                    reconnects: dev.reconnects(),
                    error: st.error.take(),
                    cpu,
                }
            })
            .collect()
    }
}

/// This thread's CPU time, `[user, system]` (twice a run: not per I/O).
fn thread_cpu() -> [Duration; 2] {
    use nix::sys::resource::{getrusage, UsageWho};
    let Ok(usage) = getrusage(UsageWho::RUSAGE_THREAD) else {
        return [Duration::ZERO; 2];
    };
    [usage.user_time(), usage.system_time()].map(|t| {
        Duration::from_secs(t.tv_sec().max(0) as u64)
            + Duration::from_micros(t.tv_usec().max(0) as u64)
    })
}

/// Notes the reads and writes done by the end of each whole second passed (`into`: time into
/// the measured window): once per second, not per I/O.
fn mark_seconds(dev: &DeviceChannel, st: &mut DevState, into: Duration) {
    let passed = (into.as_secs() as usize).min(st.seconds.len());
    while st.seconds_marked < passed {
        let s = dev.stats();
        st.seconds[st.seconds_marked] = [s.ios(OpKind::Read), s.ios(OpKind::Write)];
        st.seconds_marked += 1;
    }
}

/// Fills the free slots, as many as `--io-count` and the rate allow.
// Not inlined into `turn`: on its own, the loop keeps more in registers (fewer instructions per
// I/O).
#[inline(never)]
fn submit_some(run: &RunSpec, dev: &mut DeviceChannel, st: &mut DevState, now: Duration) {
    // How many this call may submit, reckoned once rather than per I/O.
    let free = st.free.len();
    let mut budget = free as u64;
    if let Some(n) = run.io_count {
        budget = budget.min(n.saturating_sub(st.issued));
    }
    if let Some(rate) = run.rate {
        let dt = now.saturating_sub(st.refilled).as_secs_f64();
        st.refilled = now;
        // The bucket holds a tenth of a second (at least one queue's worth): a reactor that was
        // descheduled catches up, so the average holds; fractions carry over.
        let burst = (rate / 10.0).max(run.depth as f64);
        st.tokens = (st.tokens + dt * rate).min(burst);
        // a token per I/O (never negative: only whole ones are spent)
        budget = budget.min(st.tokens as u64);
    }
    let blocks = (st.region.len / run.io_size).max(1);
    // the budget is at most the free slots: spent, this many are left
    let keep = free - budget as usize;
    while st.free.len() > keep {
        let Some(slot) = st.free.pop() else {
            break;
        };
        let op = match run.read_pct {
            100.. => Op::Read,
            0 => Op::Write,
            pct if st.rng.u32(..100) < pct => Op::Read,
            _ => Op::Write,
        };
        // (a sequential run moves on only once the I/O is submitted: one refused for now, by
        // a full queue or a reconnecting target, is tried again, no block is skipped)
        let index = if run.random {
            st.rng.u64(..blocks)
        } else {
            st.cursor
        };
        let offset = st.region.start + index * run.io_size;
        let s = &mut st.slots[slot];
        if st.track {
            let corrupt = run.corrupt_after.is_some_and(|n| st.writes >= n);
            st.tracked.prepare(run, s, op, offset, corrupt);
        }
        let io = IoBuffer {
            iova: s.buf.iova(),
            len: st.io_bytes,
        };
        match dev.submit(op, offset, run.io_size, Some(io), slot as u64) {
            Ok(()) => {
                if op == Op::Write {
                    st.writes += 1;
                }
                if !run.random {
                    st.cursor = if index + 1 == blocks { 0 } else { index + 1 };
                }
            }
            Err(e) => {
                // not submitted: the slot stays free
                st.free.push(slot);
                // Busy: the queue is full for now; anything else is for good
                if !matches!(e, usnvme_engine::BlockError::Busy { .. }) {
                    if dev.removed().is_none() {
                        st.error.get_or_insert_with(|| e.to_string());
                    }
                    // A device that refuses I/O for good gets no more.
                    st.stopped = true;
                }
                break;
            }
        }
    }
    let submitted = (free - st.free.len()) as u64;
    st.issued += submitted;
    if run.rate.is_some() {
        st.tokens -= submitted as f64;
    }
}

/// Polls the device and accounts for what completed (the engine records the statistics).
fn reap(run: &RunSpec, dev: &mut DeviceChannel, st: &mut DevState, now: Duration) {
    let dev_block_size = dev.info.block_size;
    let reset_done = run
        .reset_done
        .as_ref()
        .is_some_and(|r| r.load(Ordering::Relaxed));
    // counted per I/O, added to `after_reset` once per poll
    let mut succeeded = 0;
    // inlined into the engine's completion loop: no call per I/O
    let done = dev.poll(
        #[inline(always)]
        |c: IoCompletion| {
            let Some(s) = st.slots.get(c.token as usize) else {
                return;
            };
            match &c.result() {
                Ok(()) => {
                    succeeded += 1;
                    if st.track && s.op == Op::Read {
                        st.checked += st.tracked.check_read(
                            run,
                            s,
                            &mut st.mismatches,
                            &mut st.more_mismatches,
                        );
                    }
                }
                Err(e) => {
                    st.failed += 1;
                    match e {
                        IoError::AbortedByReset { .. } => st.aborted += 1,
                        IoError::Removed { .. } => {
                            st.pathing_error.get_or_insert_with(|| e.to_string());
                        }
                        IoError::TimedOut { .. } | IoError::Device { .. } => {
                            st.error.get_or_insert_with(|| {
                                if !st.track {
                                    return e.to_string();
                                }
                                // which blocks: an end-to-end error names the I/O's LBAs
                                let bs = u64::from(dev_block_size);
                                let lba = s.offset / bs;
                                let last = lba + run.io_size / bs - 1;
                                format!("{e} ({:?} of {} LBAs {lba}..={last})", s.op, st.name)
                            });
                        }
                    }
                }
            }
            st.free.push(c.token as usize);
        },
    );
    if reset_done {
        st.after_reset += succeeded;
    }
    if done > 0 {
        st.last_completion = now;
        // the device is gone: the report says so once, not per I/O; else it is an error
        if dev.removed().is_none() {
            if let Some(e) = st.pathing_error.take() {
                st.error.get_or_insert(e);
            }
        }
    }
}

impl Tracked {
    /// Before slot `s` goes out as `op` at byte `offset`: what its read is checked against;
    /// a write's blocks stamped (`--verify`, the first corrupt with `corrupt`) and protected
    /// (PRACT=0), a read's poisoned (`--verify`).
    #[inline(never)]
    fn prepare(&mut self, run: &RunSpec, s: &mut Slot, op: Op, offset: u64, corrupt: bool) {
        (s.op, s.offset) = (op, offset);
        let stride = self.layout.stride;
        if run.verify {
            if op == Op::Write {
                stamp(&s.buf, offset, run, corrupt, &mut self.block, stride);
            } else {
                // a read that brings nothing must not pass for what the buffer held before
                poison(&s.buf, run.io_size, &self.poison, stride);
            }
        }
        if op == Op::Write && !self.pi_metadata.is_empty() {
            let bs = self.layout.block as u64;
            let blocks = (run.io_size / bs) as usize;
            let (data, metadata) = (&mut self.pi_data, &mut self.pi_metadata);
            self.layout
                .protect(&s.buf, offset / bs, blocks, data, metadata);
        }
    }

    /// After slot `s`'s read: its stamps (`--verify`) and tuples (PRACT=0) checked, the
    /// mismatches kept; how many blocks' stamps were checked.
    #[inline(never)]
    fn check_read(
        &mut self,
        run: &RunSpec,
        s: &Slot,
        kept: &mut Vec<Mismatch>,
        more: &mut u64,
    ) -> u64 {
        let checked = if run.verify {
            verify_block(run, s, &mut self.block, self.layout.stride, kept, more)
        } else {
            0
        };
        if !self.pi_metadata.is_empty() {
            let bs = self.layout.block as u64;
            let scratch = (&mut self.pi_data[..], &mut self.pi_metadata[..]);
            self.layout.check(
                &s.buf,
                s.offset / bs,
                (run.io_size / bs) as usize,
                scratch,
                kept,
                more,
            );
        }
        checked
    }
}

/// Stamps every block of `buf`, meant for byte `offset`, through `block` (one block long);
/// block `b`'s data is at `b * stride` in the buffer. `corrupt` (`--corrupt-after`): the first
/// block's checksum is wrong.
fn stamp(
    buf: &DmaBuffer,
    offset: u64,
    run: &RunSpec,
    corrupt: bool,
    block: &mut [u8],
    stride: usize,
) {
    let bs = block.len() as u64;
    for b in 0..run.io_size / bs.max(1) {
        usnvme_stamp::stamp(block, offset + b * bs, run.seed);
        if corrupt && b == 0 {
            block[usnvme_stamp::HEADER - 1] ^= 1; // the last byte of the checksum
        }
        // The buffer holds the I/O's blocks: this cannot fail.
        let _ = buf.write_from(block, b as usize * stride);
    }
}

/// Poisons the data of every block of the first `len` data bytes of `buf` with `poison` (one
/// block of it; block `b`'s data at `b * stride`).
fn poison(buf: &DmaBuffer, len: u64, poison: &[u8], stride: usize) {
    let bs = poison.len() as u64;
    for b in 0..len / bs.max(1) {
        // The buffer holds the I/O's blocks: this cannot fail.
        let _ = buf.write_from(poison, b as usize * stride);
    }
}

/// Keeps a mismatch at `lba` (the first few; the rest are counted).
pub(super) fn keep(kept: &mut Vec<Mismatch>, more: &mut u64, lba: u64, what: String) {
    if kept.len() < KEEP_MISMATCHES {
        kept.push(Mismatch { lba, what });
    } else {
        *more += 1;
    }
}

/// Checks every block a read brought in, through `block` (one block long); returns how many
/// this run had written (or that the read left poisoned).
fn verify_block(
    run: &RunSpec,
    s: &Slot,
    block: &mut [u8],
    stride: usize,
    kept: &mut Vec<Mismatch>,
    more: &mut u64,
) -> u64 {
    let bs = block.len() as u64;
    let mut checked = 0;
    for b in 0..run.io_size / bs.max(1) {
        let at = s.offset + b * bs;
        if s.buf.read_into(block, b as usize * stride).is_err() {
            continue;
        }
        // A block never written in this run reads as zeroes, or as what an earlier run (another
        // seed) left there: nothing to check.
        let verdict = usnvme_stamp::check(block, at, run.seed);
        if !verdict.checked() {
            continue;
        }
        checked += 1;
        let what = match verdict {
            usnvme_stamp::Verdict::Intact => continue,
            usnvme_stamp::Verdict::Unread { .. } => verdict.to_string(),
            _ => format!("{verdict} (seed {:#x})", run.seed),
        };
        keep(kept, more, at / bs, what);
    }
    checked
}

/// The smallest buffer size a pool offers (a power of two up to 4 KiB, else whole 4 KiB pages)
/// that holds an I/O of `io_size` buffer bytes.
fn pool_buffer_size(io_size: u64) -> usize {
    let size = if io_size <= 4096 {
        io_size.next_power_of_two().max(512)
    } else {
        io_size.div_ceil(4096) * 4096
    };
    size as usize
}

#[cfg(test)]
mod pool_size_tests {
    use super::pool_buffer_size;

    #[test]
    fn every_io_size_gets_a_buffer_a_pool_can_make() {
        assert_eq!(pool_buffer_size(512), 512);
        assert_eq!(pool_buffer_size(3072), 4096);
        assert_eq!(pool_buffer_size(4096), 4096);
        assert_eq!(pool_buffer_size(6144), 8192);
        assert_eq!(pool_buffer_size(1 << 20), 1 << 20);
    }
}

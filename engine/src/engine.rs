//! The engine: attach drives in parallel, place them on reactor cores by NUMA node, and run a
//! job on one pinned polling thread per core. Control (stats, stop) travels on crossbeam
//! channels; the data path never leaves its reactor.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam::channel::{bounded, unbounded, Receiver, Sender};
use usnvme_driver::pci::Sysfs;
use usnvme_driver::{Controller, ControllerOptions, DeviceSpec, IoBuffer, Opener};
use usnvme_hugepages::{BufferPool, PoolError};

use crate::block::{
    BlockDevice, BlockError, BlockInfo, Channel, ChannelOptions, DmaTarget, Finished, IoCompletion,
    NamespaceDevice, Op, MAX_TOKEN,
};
use crate::placement::{self, Placement, PlacementError, Policy};
use crate::stats::{IoStats, OpKind, Snapshot};
use crate::topology::{pin_current_thread, Topology};

/// A drive the engine attached: its controller and NUMA node.
#[derive(Debug, Clone)]
pub struct Drive {
    pub spec: DeviceSpec,
    pub controller: Controller,
    /// None: unknown (`numa_node` -1, or a simulated drive).
    pub node: Option<u32>,
}

/// A drive that did not come up.
#[derive(Debug, thiserror::Error)]
#[error("{drive}: {error}")]
pub struct AttachError {
    /// The drive's address (`0000:01:00.0`, `sim:3`).
    pub drive: String,
    pub error: Box<usnvme_driver::Error>,
}

/// Brings up every drive of `specs` at once (one thread each: a controller's bring-up waits on
/// the device, so 24 of them in a row would take 24 times as long). Results in drive order.
pub fn attach(
    opener: &Opener,
    sysfs: &Sysfs,
    specs: &[DeviceSpec],
    options: &ControllerOptions,
) -> Vec<Result<Drive, AttachError>> {
    let drives: Vec<DeviceSpec> = specs.iter().flat_map(DeviceSpec::drives).collect();
    std::thread::scope(|scope| {
        let threads: Vec<_> = drives
            .iter()
            .map(|spec| {
                scope.spawn(move || {
                    let fail = |error| AttachError {
                        drive: spec.to_string(),
                        error: Box::new(error),
                    };
                    let controller = opener.open(spec, options.clone()).map_err(fail)?.remove(0);
                    let node = match spec {
                        DeviceSpec::Pci(addr) => sysfs.device(*addr).ok().and_then(|d| d.numa_node),
                        DeviceSpec::Sim(_) => None,
                    };
                    Ok(Drive {
                        spec: spec.clone(),
                        controller,
                        node,
                    })
                })
            })
            .collect();
        threads
            .into_iter()
            .zip(&drives)
            .map(|(t, spec)| {
                t.join().unwrap_or_else(|_| {
                    Err(AttachError {
                        drive: spec.to_string(),
                        error: Box::new(usnvme_driver::Error::Invalid {
                            device: spec.to_string(),
                            what: "the thread bringing it up panicked".into(),
                        }),
                    })
                })
            })
            .collect()
    })
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Placement(#[from] PlacementError),
    #[error("no drives to run on")]
    NoDrives,
    #[error("no block devices to run on")]
    NoDevices,
    #[error("reactor on core {cpu}: {what}")]
    Reactor { cpu: usize, what: String },
    #[error(
        "{device}: no I/O queue left on {drive}: the controller granted {granted} I/O queue \
         pair(s) and the devices before it use them all (run fewer devices or namespaces on it)"
    )]
    NoQueue {
        device: String,
        drive: String,
        granted: u16,
    },
}

/// How the engine runs.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Reactor cores; empty: every CPU this process may use.
    pub cores: Vec<usize>,
    pub policy: Policy,
    /// Queue depth and timeouts of every channel.
    pub channel: ChannelOptions,
    /// Put each reactor's queue pairs and buffers on its own NUMA node.
    pub numa_memory: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            cores: Vec::new(),
            policy: Policy::Local,
            channel: ChannelOptions::default(),
            numa_memory: true,
        }
    }
}

/// Attached drives and where they are served.
#[derive(Debug)]
pub struct Engine {
    topology: Topology,
    drives: Vec<Drive>,
    placement: Placement,
    options: EngineOptions,
}

/// What a reactor is, for the job it runs.
#[derive(Debug, Clone)]
pub struct ReactorInfo {
    pub index: usize,
    pub cpu: usize,
    pub node: Option<u32>,
    /// Where its queue pairs and buffers are allocated (its node, with `numa_memory`).
    pub memory_node: Option<u32>,
    /// The run's devices this reactor serves (indices into the list given to `start`).
    pub devices: Vec<usize>,
    /// For each of `devices`: which of the reactors serving that device this one is, so that a
    /// job can split the device between them.
    pub shares: Vec<Share>,
}

/// A reactor's place among the reactors that serve one device: the `index`-th of `of`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    pub index: usize,
    pub of: usize,
}

/// Which reactors serve each device of a run (see [`Engine::assign`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// Per device (in the order given): the reactors serving it, as indices into
    /// `placement().reactors`, ascending.
    pub serving: Vec<Vec<usize>>,
    /// Devices served by fewer reactors than the placement would give them, because a
    /// controller under them granted fewer I/O queue pairs.
    pub limited: Vec<QueueLimited>,
}

/// A device served by fewer reactors than placed, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueLimited {
    pub device: usize,
    /// The drive whose queues ran out, and how many it granted.
    pub drive: String,
    pub granted: u16,
    /// The CPUs that serve the device, and those the placement had chosen.
    pub cpus: Vec<usize>,
    pub placed_cpus: Vec<usize>,
}

/// Work a reactor does: `turn` is called in a loop on the reactor's thread.
pub trait Job: Send + 'static {
    type Output: Send + 'static;
    /// Set-up before any I/O (buffers, per-device state): every reactor prepares its job, and
    /// only when all are ready does any of them start turning, so that no I/O is timed while
    /// another reactor is still setting up.
    fn prepare(&mut self, _ctx: &mut ReactorContext) -> Result<(), String> {
        Ok(())
    }
    /// One pass: submit and poll on the reactor's channels. False when the job is done.
    fn turn(&mut self, ctx: &mut ReactorContext) -> bool;
    /// After the loop and after every channel drained.
    fn finish(self, ctx: &mut ReactorContext) -> Self::Output;
}

impl Engine {
    pub fn new(
        topology: Topology,
        drives: Vec<Drive>,
        options: EngineOptions,
    ) -> Result<Engine, EngineError> {
        if drives.is_empty() {
            return Err(EngineError::NoDrives);
        }
        let cores = if options.cores.is_empty() {
            topology.allowed.clone()
        } else {
            options.cores.clone()
        };
        let nodes: Vec<Option<u32>> = drives.iter().map(|d| d.node).collect();
        let placement = placement::place(&topology, &cores, &nodes, options.policy)?;
        for remote in &placement.remote {
            log::warn!(
                "{}: on node {} but served from remote cores {:?}",
                drives[remote.drive].spec,
                remote.drive_node,
                remote.served_from
            );
        }
        Ok(Engine {
            topology,
            drives,
            placement,
            options,
        })
    }

    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    pub fn drives(&self) -> &[Drive] {
        &self.drives
    }

    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// Every namespace of every drive as a block device, in drive order.
    pub fn namespaces(&self) -> Vec<Arc<dyn BlockDevice>> {
        let mut devices: Vec<Arc<dyn BlockDevice>> = Vec::new();
        for (i, d) in self.drives.iter().enumerate() {
            for ns in d.controller.namespaces() {
                match NamespaceDevice::new(d.controller.clone(), ns.nsid, i) {
                    Ok(dev) => devices.push(Arc::new(dev)),
                    Err(e) => log::warn!("{}: namespace {} skipped: {e}", d.spec, ns.nsid),
                }
            }
        }
        devices
    }

    /// The reactors the placement gives `device`: those that serve all of its drives; else
    /// those that serve any; else all.
    fn placed(&self, device: &dyn BlockDevice) -> Vec<usize> {
        let drives = device.drives();
        let reactors = &self.placement.reactors;
        let all: Vec<usize> = (0..reactors.len())
            .filter(|&r| drives.iter().all(|d| reactors[r].drives.contains(d)))
            .collect();
        if !all.is_empty() {
            return all;
        }
        let any: Vec<usize> = (0..reactors.len())
            .filter(|&r| drives.iter().any(|d| reactors[r].drives.contains(d)))
            .collect();
        if !any.is_empty() {
            return any;
        }
        (0..reactors.len()).collect()
    }

    /// Which reactors serve each of `devices`. Every reactor serving a device owns one I/O queue
    /// pair on each drive under it, so a drive whose controller granted fewer queue pairs than
    /// the placement would use is served by as many reactors as it has queues: those with the
    /// fewest devices so far, so that such drives spread over the cores. Everyone else keeps
    /// the placement's reactors. The same devices always get the same answer.
    pub fn assign(&self, devices: &[Arc<dyn BlockDevice>]) -> Result<Assignment, EngineError> {
        let mut left: Vec<u16> = self
            .drives
            .iter()
            .map(|d| d.controller.io_queues_granted())
            .collect();
        let mut load = vec![0usize; self.placement.reactors.len()];
        let mut serving = Vec::with_capacity(devices.len());
        let mut limited = Vec::new();
        for (i, dev) in devices.iter().enumerate() {
            let drives = dev.drives();
            let mut placed = self.placed(dev.as_ref());
            let mut by_load = placed.clone();
            by_load.sort_by_key(|&r| load[r]);
            let mut chosen = Vec::with_capacity(placed.len());
            for r in by_load {
                if drives.iter().all(|&d| left.get(d).is_some_and(|&q| q > 0)) {
                    drives.iter().for_each(|&d| left[d] -= 1);
                    load[r] += 1;
                    chosen.push(r);
                }
            }
            chosen.sort_unstable();
            if chosen.len() < placed.len() {
                let short = drives
                    .iter()
                    .copied()
                    .find(|&d| left.get(d).is_none_or(|&q| q == 0))
                    .and_then(|d| self.drives.get(d));
                let (drive, granted) = short.map_or((String::new(), 0), |d| {
                    (d.spec.to_string(), d.controller.io_queues_granted())
                });
                if chosen.is_empty() {
                    return Err(EngineError::NoQueue {
                        device: dev.info().name.clone(),
                        drive,
                        granted,
                    });
                }
                let cpu = |r: &usize| self.placement.reactors[*r].cpu;
                placed.sort_unstable();
                limited.push(QueueLimited {
                    device: i,
                    drive,
                    granted,
                    cpus: chosen.iter().map(cpu).collect(),
                    placed_cpus: placed.iter().map(cpu).collect(),
                });
            }
            serving.push(chosen);
        }
        Ok(Assignment { serving, limited })
    }

    /// Starts `make_job` on every reactor that serves one of `devices`, each pinned to its core
    /// with its own channels. Returns once every reactor is set up (or one failed).
    pub fn start<J, F>(
        &self,
        devices: Vec<Arc<dyn BlockDevice>>,
        make_job: F,
    ) -> Result<Run<J::Output>, EngineError>
    where
        J: Job,
        F: Fn(&ReactorInfo) -> J + Send + Sync + 'static,
    {
        if devices.is_empty() {
            return Err(EngineError::NoDevices);
        }
        let assignment = self.assign(&devices)?;
        let mut per_reactor: Vec<Vec<(usize, Share)>> =
            vec![Vec::new(); self.placement.reactors.len()];
        for (i, serving) in assignment.serving.iter().enumerate() {
            for (index, &r) in serving.iter().enumerate() {
                let share = Share {
                    index,
                    of: serving.len(),
                };
                per_reactor[r].push((i, share));
            }
        }
        let devices: Arc<[Arc<dyn BlockDevice>]> = Arc::from(devices);
        let controllers: Arc<[Controller]> =
            self.drives.iter().map(|d| d.controller.clone()).collect();
        let make_job = Arc::new(make_job);
        let (ready_tx, ready_rx) = unbounded();
        let mut reactors = Vec::new();
        for (index, (plan, served)) in self.placement.reactors.iter().zip(per_reactor).enumerate() {
            if served.is_empty() {
                continue;
            }
            let memory_node = if self.options.numa_memory {
                plan.node
            } else {
                None
            };
            let info = ReactorInfo {
                index,
                cpu: plan.cpu,
                node: plan.node,
                memory_node,
                devices: served.iter().map(|&(d, _)| d).collect(),
                shares: served.iter().map(|&(_, s)| s).collect(),
            };
            let (control_tx, control_rx) = unbounded();
            let (reply_tx, reply_rx) = bounded(1);
            let setup = Setup {
                info: info.clone(),
                devices: devices.clone(),
                controllers: controllers.clone(),
                channel: ChannelOptions {
                    node: memory_node,
                    ..self.options.channel
                },
            };
            let (ready, make_job) = (ready_tx.clone(), make_job.clone());
            let thread = std::thread::Builder::new()
                .name(format!("reactor {}", plan.cpu))
                .spawn(move || reactor(setup, make_job.as_ref(), ready, control_rx, reply_tx))
                .map_err(|e| EngineError::Reactor {
                    cpu: plan.cpu,
                    what: format!("cannot start its thread: {e}"),
                })?;
            reactors.push(ReactorHandle {
                info,
                control: control_tx,
                replies: reply_rx,
                thread,
            });
        }
        let run = Run { reactors };
        for _ in 0..run.reactors.len() {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    run.stop();
                    let _ = run.wait();
                    return Err(e);
                }
                Err(_) => break,
            }
        }
        // Every reactor is set up: they start their I/O together.
        for r in &run.reactors {
            let _ = r.control.send(Control::Start);
        }
        Ok(run)
    }
}

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
    name: Arc<str>,
    dma: DmaTarget,
    node: Option<u32>,
    channel: Channel,
    stats: IoStats,
    in_flight: usize,
    /// The controllers under the device (one for a namespace, the members' for a stripe).
    controllers: Vec<Controller>,
    clock: ReactorClock,
    /// The reactor's clock this turn, or at this channel's last completions (nanoseconds).
    now_ns: u64,
    /// `now_ns` was read during this channel's visit (completions came, or I/O was submitted):
    /// what is submitted next is stamped with it, not with the turn's start, which lies
    /// before every earlier channel's work in the turn.
    fresh: bool,
    /// The last completion, or the submission that made the channel busy.
    last_progress_ns: u64,
    /// The last stall probe.
    last_probe_ns: u64,
    /// The controller found gone, if one was.
    gone: Option<Arc<str>>,
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

impl DeviceChannel {
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
        self.channel
            .submit(op, offset, len, buf, token | (kind as u64) << KIND_SHIFT)?;
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
        let done = self.channel.poll(|f| {
            let now = *now.get_or_insert_with(|| clock.now_ns());
            record(stats, now, f, &mut on_complete)
        });
        self.in_flight -= done.min(self.in_flight);
        if let Some(now) = now {
            self.set_now(now);
            self.fresh = true;
            self.last_progress_ns = now;
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

    /// The reactor's clock for this turn.
    #[inline]
    fn set_now(&mut self, now_ns: u64) {
        self.now_ns = now_ns;
        self.channel.set_now(now_ns);
    }

    /// Checks the controllers of a stalled channel; fails everything in flight if one is gone.
    #[cold]
    fn probe(&mut self, mut on_complete: impl FnMut(IoCompletion)) -> usize {
        let Some(gone) = self
            .controllers
            .iter()
            .find(|c| c.is_removed())
            .map(|c| Arc::<str>::from(c.name()))
        else {
            return 0;
        };
        log::error!(
            "{}: {gone} is gone (its registers read all ones): failing {} I/O(s) in flight; no more I/O to it",
            self.name,
            self.in_flight
        );
        self.gone = Some(gone);
        let (stats, now) = (&mut self.stats, self.now_ns);
        // The queue pairs go (their queues cannot be deleted on a removed device).
        let failed = self
            .channel
            .abandon(|f| record(stats, now, f, &mut on_complete));
        self.in_flight = 0;
        failed
    }

    /// The controller under this device that was found gone (removed), if any: the channel
    /// takes no more I/O.
    pub fn gone(&self) -> Option<&str> {
        self.gone.as_deref()
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight
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
#[inline]
fn record(
    stats: &mut IoStats,
    now_ns: u64,
    f: Finished,
    on_complete: &mut impl FnMut(IoCompletion),
) {
    let kind = match f.token >> KIND_SHIFT {
        0 => OpKind::Read,
        1 => OpKind::Write,
        _ => OpKind::Other,
    };
    let latency = now_ns.saturating_sub(f.submitted_ns);
    stats.record(kind, f.bytes, latency, f.result.is_ok());
    on_complete(IoCompletion {
        token: f.token & MAX_TOKEN,
        result: f.result,
    });
}

/// What a job sees of its reactor.
#[derive(Debug)]
pub struct ReactorContext {
    pub info: ReactorInfo,
    /// One per device this reactor serves, in `info.devices` order.
    pub devices: Vec<DeviceChannel>,
    started: Instant,
    clock: ReactorClock,
    /// The clock this turn, in nanoseconds since the reactor was set up.
    now_ns: u64,
}

/// A reactor's clock: the TSC where it is usable (quanta, calibrated once per process), in
/// nanoseconds since the reactor was set up.
#[derive(Debug, Clone)]
struct ReactorClock {
    clock: quanta::Clock,
    base: u64,
}

impl ReactorClock {
    fn new() -> Self {
        let clock = quanta::Clock::new();
        let base = clock.raw();
        ReactorClock { clock, base }
    }

    #[inline]
    fn now_ns(&self) -> u64 {
        self.clock.delta_as_nanos(self.base, self.clock.raw())
    }
}

impl ReactorContext {
    /// Time since the reactor started its job.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// The reactor's clock this turn (read once per turn, before the job's `turn`): what the
    /// channels stamp I/Os with. Comparable with itself only.
    #[inline]
    pub fn now(&self) -> Duration {
        Duration::from_nanos(self.now_ns)
    }

    /// Reads the clock (once per turn) and gives it to every channel.
    #[inline]
    fn tick(&mut self) {
        let now = self.clock.now_ns();
        self.now_ns = now;
        for d in &mut self.devices {
            d.set_now(now);
            d.fresh = false;
        }
    }

    fn snapshot(&self) -> Snapshot {
        let mut s = Snapshot::new(self.elapsed());
        for d in &self.devices {
            s.add(d.device, &d.stats);
        }
        s
    }

    /// Polls until nothing is in flight (completions go nowhere) or `limit` passes.
    fn drain(&mut self, limit: Duration) {
        let started = Instant::now();
        while self.devices.iter().any(|d| d.in_flight() > 0) && started.elapsed() < limit {
            self.tick();
            for d in &mut self.devices {
                d.poll(|_| {});
            }
        }
    }
}

struct Setup {
    info: ReactorInfo,
    devices: Arc<[Arc<dyn BlockDevice>]>,
    /// Every drive's controller, by the engine's drive index.
    controllers: Arc<[Controller]>,
    channel: ChannelOptions,
}

enum Control {
    /// Every reactor is ready: start turning the job.
    Start,
    Stats,
    Stop,
}

/// How often (in turns) a reactor looks at its control channel.
const CONTROL_EVERY: u32 = 256;

/// The reactor thread: pin, set up channels, run the job, answer control messages, drain,
/// finish. Channels (and so queue pairs) are dropped at the end: their queues are deleted.
fn reactor<J: Job>(
    setup: Setup,
    make_job: &(dyn Fn(&ReactorInfo) -> J + Send + Sync),
    ready: Sender<Result<(), EngineError>>,
    control: Receiver<Control>,
    replies: Sender<Snapshot>,
) -> Option<(J::Output, Snapshot)> {
    let cpu = setup.info.cpu;
    if let Err(e) = pin_current_thread(cpu) {
        log::warn!("reactor: cannot pin to core {cpu}: {e}");
    }
    let clock = ReactorClock::new();
    let mut devices = Vec::new();
    for &i in &setup.info.devices {
        let device = &setup.devices[i];
        let channel = match device.channel(&setup.channel) {
            Ok(c) => c,
            Err(e) => {
                let what = format!("{}: {e}", device.info().name);
                let _ = ready.send(Err(EngineError::Reactor { cpu, what }));
                return None;
            }
        };
        let controllers = device
            .drives()
            .iter()
            .filter_map(|&d| setup.controllers.get(d).cloned())
            .collect();
        devices.push(DeviceChannel {
            device: i,
            info: device.info().clone(),
            name: Arc::from(device.info().name.as_str()),
            dma: device.dma(),
            node: setup.info.memory_node,
            channel,
            stats: IoStats::with_histograms(setup.channel.latency_histograms),
            in_flight: 0,
            controllers,
            clock: clock.clone(),
            now_ns: 0,
            fresh: false,
            last_progress_ns: 0,
            last_probe_ns: 0,
            gone: None,
        });
    }
    let mut job = make_job(&setup.info);
    let mut ctx = ReactorContext {
        info: setup.info,
        devices,
        started: Instant::now(),
        clock,
        now_ns: 0,
    };
    ctx.tick();
    if let Err(what) = job.prepare(&mut ctx) {
        let _ = ready.send(Err(EngineError::Reactor { cpu, what }));
        return None;
    }
    let _ = ready.send(Ok(()));
    // Wait for every other reactor (an error elsewhere stops this one before any I/O).
    let mut stop = false;
    loop {
        match control.recv() {
            Ok(Control::Start) => break,
            Ok(Control::Stats) => {
                let _ = replies.send(ctx.snapshot());
            }
            Ok(Control::Stop) | Err(_) => {
                stop = true;
                break;
            }
        }
    }
    ctx.started = Instant::now();
    let mut turns = 0u32;
    while !stop {
        ctx.tick();
        let more = job.turn(&mut ctx);
        turns = turns.wrapping_add(1);
        if !more || turns.is_multiple_of(CONTROL_EVERY) {
            stop = !more;
            while let Ok(msg) = control.try_recv() {
                match msg {
                    Control::Stats => {
                        let _ = replies.send(ctx.snapshot());
                    }
                    Control::Stop => stop = true,
                    Control::Start => {}
                }
            }
        }
    }
    let limit = setup
        .channel
        .timeout
        .map_or(Duration::from_secs(60), |t| t * 3);
    ctx.drain(limit);
    let snapshot = ctx.snapshot();
    let output = job.finish(&mut ctx);
    Some((output, snapshot))
}

#[derive(Debug)]
struct ReactorHandle<O> {
    info: ReactorInfo,
    control: Sender<Control>,
    replies: Receiver<Snapshot>,
    thread: JoinHandle<Option<(O, Snapshot)>>,
}

/// A job running on the reactors.
#[derive(Debug)]
pub struct Run<O> {
    reactors: Vec<ReactorHandle<O>>,
}

/// What one reactor returned.
#[derive(Debug)]
pub struct ReactorResult<O> {
    pub info: ReactorInfo,
    pub output: O,
    pub stats: Snapshot,
}

impl<O> Run<O> {
    pub fn reactors(&self) -> Vec<ReactorInfo> {
        self.reactors.iter().map(|r| r.info.clone()).collect()
    }

    /// Each running reactor's statistics so far (a reactor that finished has none to give).
    pub fn stats(&self) -> Vec<Snapshot> {
        self.reactors
            .iter()
            .filter(|r| !r.thread.is_finished() && r.control.send(Control::Stats).is_ok())
            .filter_map(|r| r.replies.recv_timeout(Duration::from_secs(2)).ok())
            .collect()
    }

    /// Asks every reactor to stop: it stops submitting, drains, and finishes its job.
    pub fn stop(&self) {
        for r in &self.reactors {
            let _ = r.control.send(Control::Stop);
        }
    }

    pub fn is_finished(&self) -> bool {
        self.reactors.iter().all(|r| r.thread.is_finished())
    }

    /// Waits for every reactor.
    pub fn wait(self) -> Result<Vec<ReactorResult<O>>, EngineError> {
        let mut results = Vec::new();
        let mut failure = None;
        for r in self.reactors {
            let cpu = r.info.cpu;
            match r.thread.join() {
                Ok(Some((output, stats))) => results.push(ReactorResult {
                    info: r.info,
                    output,
                    stats,
                }),
                Ok(None) => {}
                Err(_) => {
                    failure = Some(EngineError::Reactor {
                        cpu,
                        what: "its job panicked".into(),
                    })
                }
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(results),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Topology;
    use crate::{IoError, StripeDevice};

    /// Keeps 4 reads in flight on every device for `for_`; counts what completed how.
    struct Reads {
        until: Instant,
        pools: Vec<(BufferPool, Vec<usnvme_hugepages::DmaBuffer>)>,
        /// Per device: successes, "Host Pathing Error" failures, other failures.
        counts: Vec<(u64, u64, u64)>,
    }

    impl Job for Reads {
        type Output = Vec<(u64, u64, u64, Option<String>)>;

        fn turn(&mut self, ctx: &mut ReactorContext) -> bool {
            if self.pools.is_empty() {
                for d in &ctx.devices {
                    let mut pool = d.buffer_pool(4096, 4).expect("DMA buffers");
                    let bufs = (0..4).map(|_| pool.alloc().expect("a buffer")).collect();
                    self.pools.push((pool, bufs));
                    self.counts.push((0, 0, 0));
                }
            }
            let running = Instant::now() < self.until;
            for (i, d) in ctx.devices.iter_mut().enumerate() {
                while running && d.in_flight() < 4 && d.has_room() {
                    let slot = d.in_flight();
                    let buf = &self.pools[i].1[slot];
                    let io = IoBuffer {
                        iova: buf.iova(),
                        len: 4096,
                    };
                    if d.submit(Op::Read, 0, 4096, Some(io), slot as u64).is_err() {
                        break;
                    }
                }
                let counts = &mut self.counts[i];
                d.poll(|c| match &c.result {
                    Ok(()) => counts.0 += 1,
                    Err(IoError::Removed { .. }) => counts.1 += 1,
                    Err(_) => counts.2 += 1,
                });
            }
            running || ctx.devices.iter().any(|d| d.in_flight() > 0)
        }

        fn finish(mut self, ctx: &mut ReactorContext) -> Self::Output {
            for (pool, bufs) in &mut self.pools {
                for b in bufs.drain(..) {
                    let _ = pool.free(b);
                }
            }
            ctx.devices
                .iter()
                .zip(&self.counts)
                .map(|(d, &(ok, gone, other))| (ok, gone, other, d.gone().map(str::to_owned)))
                .collect()
        }
    }

    #[test]
    fn a_removed_drive_fails_its_ios_and_the_run_goes_on_with_the_others() {
        let opener = Opener::new("/nonexistent");
        let specs: Vec<DeviceSpec> = vec!["sim:0-1,mode=threaded,latency=50us"
            .parse()
            .expect("a sim spec")];
        let drives = attach(
            &opener,
            &Sysfs::new(),
            &specs,
            &ControllerOptions::default(),
        )
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .expect("attached");
        let topology = Topology::from_sysfs("/".as_ref()).expect("topology");
        let core = topology.allowed[0];
        let engine = Engine::new(
            topology,
            drives,
            EngineOptions {
                cores: vec![core],
                channel: ChannelOptions {
                    // far beyond the test: the engine must notice the removal by itself
                    timeout: Some(Duration::from_secs(120)),
                    ..ChannelOptions::default()
                },
                ..EngineOptions::default()
            },
        )
        .expect("engine");
        let until = Instant::now() + Duration::from_secs(2);
        let started = Instant::now();
        let run = engine
            .start(engine.namespaces(), move |_| Reads {
                until,
                pools: Vec::new(),
                counts: Vec::new(),
            })
            .expect("started");
        std::thread::sleep(Duration::from_millis(500));
        opener.sim_controller("sim:1").expect("sim:1").remove();
        let results = run.wait().expect("the run ends");
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "took {:?}",
            started.elapsed()
        );
        let out = &results[0].output;
        let (ok0, gone0, other0, removed0) = &out[0];
        assert!(*ok0 > 0 && *gone0 == 0 && *other0 == 0, "{out:?}");
        assert_eq!(removed0, &None);
        let (ok1, gone1, other1, removed1) = &out[1];
        assert!(*ok1 > 0, "sim:1 ran before its removal: {out:?}");
        assert!(*gone1 > 0 && *other1 == 0, "{out:?}");
        assert_eq!(removed1.as_deref(), Some("sim:1"));
    }

    fn sim_engine(specs: &[&str], cores: &[usize]) -> Engine {
        let opener = Opener::new("/nonexistent");
        let specs: Vec<DeviceSpec> = specs
            .iter()
            .map(|s| s.parse().expect("a sim spec"))
            .collect();
        let drives = attach(
            &opener,
            &Sysfs::new(),
            &specs,
            &ControllerOptions::default(),
        )
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .expect("attached");
        Engine::new(
            Topology::new(vec![], cores.to_vec()),
            drives,
            EngineOptions {
                cores: cores.to_vec(),
                ..EngineOptions::default()
            },
        )
        .expect("engine")
    }

    #[test]
    fn drives_with_fewer_queues_than_cores_are_spread_within_what_they_granted() {
        let engine = sim_engine(&["sim:0-3,queues=1", "sim:4", "sim:5-6,queues=1"], &[0, 1]);
        let mut devices = engine.namespaces();
        let members = devices.split_off(5);
        let stripe = StripeDevice::new("stripe0", members, 128 << 10).expect("stripe");
        devices.push(Arc::new(stripe));
        let a = engine.assign(&devices).expect("assigned");
        // one queue each: alternately on the two cores; sim:4 keeps both; the stripe of two
        // one-queue drives gets one core, the less loaded
        let expected: [&[usize]; 6] = [&[0], &[1], &[0], &[1], &[0, 1], &[0]];
        assert_eq!(a.serving, expected);
        let limited: Vec<(usize, &str, u16, &[usize])> = a
            .limited
            .iter()
            .map(|l| (l.device, l.drive.as_str(), l.granted, l.cpus.as_slice()))
            .collect();
        let expected: [(usize, &str, u16, &[usize]); 5] = [
            (0, "sim:0", 1, &[0]),
            (1, "sim:1", 1, &[1]),
            (2, "sim:2", 1, &[0]),
            (3, "sim:3", 1, &[1]),
            (5, "sim:5", 1, &[0]),
        ];
        assert_eq!(limited, expected);
        assert!(a.limited.iter().all(|l| l.placed_cpus == [0, 1]));
        // the same devices, the same answer (perf splits regions by it before starting)
        assert_eq!(engine.assign(&devices).expect("assigned"), a);
        // a second namespace device on a one-queue drive has none left
        let twice = vec![devices[0].clone(), devices[0].clone()];
        let err = engine.assign(&twice).expect_err("no queue left");
        assert!(
            matches!(err, EngineError::NoQueue { granted: 1, .. }),
            "{err}"
        );
    }

    /// Records when it finished preparing and when it first turned.
    struct Stamps {
        slow: bool,
        prepared: Option<Instant>,
        first_turn: Option<Instant>,
    }

    impl Job for Stamps {
        type Output = (Instant, Instant);

        fn prepare(&mut self, _ctx: &mut ReactorContext) -> Result<(), String> {
            if self.slow {
                // a reactor whose set-up takes long (buffers, queue creation on a busy drive)
                std::thread::sleep(Duration::from_millis(300));
            }
            self.prepared = Some(Instant::now());
            Ok(())
        }

        fn turn(&mut self, _ctx: &mut ReactorContext) -> bool {
            self.first_turn.get_or_insert_with(Instant::now);
            false
        }

        fn finish(self, _ctx: &mut ReactorContext) -> Self::Output {
            let never = Instant::now();
            (
                self.prepared.unwrap_or(never),
                self.first_turn.unwrap_or(never),
            )
        }
    }

    #[test]
    fn no_reactor_starts_its_io_before_every_reactor_is_set_up() {
        let topology = Topology::from_sysfs("/".as_ref()).expect("topology");
        let cores: Vec<usize> = topology.allowed.iter().copied().take(2).collect();
        let engine = sim_engine(&["sim:0-1"], &cores);
        let run = engine
            .start(engine.namespaces(), |info| Stamps {
                slow: info.index == 0,
                prepared: None,
                first_turn: None,
            })
            .expect("started");
        let results = run.wait().expect("ran");
        assert_eq!(results.len(), cores.len());
        let last_prepared = results.iter().map(|r| r.output.0).max().expect("a reactor");
        for r in &results {
            assert!(
                r.output.1 >= last_prepared,
                "reactor {} turned before the slow one was ready",
                r.info.index
            );
        }
    }

    /// Submits one read to each device, the second a second after the first (as if the first
    /// device's submissions had taken that long), and waits for both.
    struct LateSecond {
        pool: Option<(BufferPool, usnvme_hugepages::DmaBuffer)>,
        submitted: bool,
    }

    impl Job for LateSecond {
        type Output = Vec<u64>;

        fn prepare(&mut self, ctx: &mut ReactorContext) -> Result<(), String> {
            let mut pool = ctx.devices[0]
                .buffer_pool(4096, 1)
                .map_err(|e| e.to_string())?;
            let buf = pool.alloc().ok_or("no buffer")?;
            self.pool = Some((pool, buf));
            Ok(())
        }

        fn turn(&mut self, ctx: &mut ReactorContext) -> bool {
            let Some((_, buf)) = &self.pool else {
                return false;
            };
            if !self.submitted {
                self.submitted = true;
                for (i, d) in ctx.devices.iter_mut().enumerate() {
                    if i > 0 {
                        std::thread::sleep(Duration::from_secs(1));
                    }
                    let io = IoBuffer {
                        iova: buf.iova(),
                        len: 4096,
                    };
                    d.submit(Op::Read, 0, 4096, Some(io), i as u64)
                        .expect("submitted");
                    d.flush();
                }
            }
            for d in &mut ctx.devices {
                d.poll(|c| assert!(c.result.is_ok()));
            }
            ctx.devices.iter().any(|d| d.in_flight() > 0)
        }

        fn finish(mut self, ctx: &mut ReactorContext) -> Self::Output {
            if let Some((mut pool, buf)) = self.pool.take() {
                let _ = pool.free(buf);
            }
            ctx.devices
                .iter()
                .map(|d| d.stats().latency(OpKind::Read).max_ns)
                .collect()
        }
    }

    #[test]
    fn an_io_is_timed_from_its_submission_not_from_the_turns_start() {
        let topology = Topology::from_sysfs("/".as_ref()).expect("topology");
        let core = topology.allowed[0];
        let engine = sim_engine(&["sim:0-1,mode=threaded,latency=50us"], &[core]);
        let run = engine
            .start(engine.namespaces(), |_| LateSecond {
                pool: None,
                submitted: false,
            })
            .expect("started");
        let max = &run.wait().expect("ran")[0].output;
        // A drive of 50 us: the second read must not be charged the second spent before it.
        assert!(max.iter().all(|&ns| ns > 0), "{max:?}");
        assert!(max[1] < 900_000_000, "the second read took {} ns", max[1]);
    }
}

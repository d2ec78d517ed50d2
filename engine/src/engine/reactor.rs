//! The reactor thread: its context (channels, clock), control messages, the turn loop.

use std::os::fd::BorrowedFd;

use super::wait::Wait;
use super::*;

/// What a job sees of its reactor.
#[derive(Debug)]
pub struct ReactorContext {
    pub info: ReactorInfo,
    /// One per device this reactor serves, in `info.devices` order.
    pub devices: Vec<DeviceChannel>,
    /// How many I/O queues the channels use: one per controller.
    queue_count: usize,
    /// How channels are made, on the reactor's memory node (devices added while the reactor
    /// runs get the same).
    channel_options: ChannelOptions,
    started: Instant,
    clock: ReactorClock,
    /// The clock this turn, in nanoseconds since the reactor was set up.
    now_ns: u64,
    /// Its one wait: the devices' interrupts and what the job watches.
    wait: Wait,
}

/// A reactor's clock: the TSC where it is usable (quanta, calibrated once per process), in
/// nanoseconds since the reactor was set up.
#[derive(Debug, Clone)]
pub(super) struct ReactorClock {
    clock: quanta::Clock,
    base: u64,
}

impl ReactorClock {
    pub(super) fn new() -> Self {
        let clock = quanta::Clock::new();
        let base = clock.raw();
        ReactorClock { clock, base }
    }

    #[inline]
    pub(super) fn now_ns(&self) -> u64 {
        self.clock.delta_as_nanos(self.base, self.clock.raw())
    }
}

impl ReactorContext {
    /// How many I/O queues the reactor holds: one per controller it reaches.
    pub fn queue_count(&self) -> usize {
        self.queue_count
    }

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

    /// Waits at most `timeout` for a device's interrupt or news on what the job watches, and
    /// hands each token that has some to `on` ([`INTERRUPT`](super::INTERRUPT) for an
    /// interrupt); returns how
    /// many. A zero timeout only looks.
    pub fn wait(&mut self, timeout: Duration, on: impl FnMut(u64)) -> usize {
        self.wait.wait(timeout, on)
    }

    /// Watches `fd` for input (a socket, an eventfd), reported by [`ReactorContext::wait`] as
    /// `token` (below [`INTERRUPT`](super::INTERRUPT)) while there is some.
    pub fn watch(&self, fd: BorrowedFd<'_>, token: u64) -> std::io::Result<()> {
        self.wait.watch(fd, token)
    }

    pub fn unwatch(&self, fd: BorrowedFd<'_>) {
        self.wait.unwatch(fd);
    }

    /// Lets device `i` go while the reactor runs (see [`DeviceChannel::close`]): false, and
    /// nothing done, while it has I/O in flight.
    pub fn let_go(&mut self, i: usize, why: &str) -> bool {
        let Some(d) = self.devices.get(i) else {
            return true;
        };
        if d.in_flight() > 0 {
            return false;
        }
        let (before, rest) = self.devices.split_at(i);
        let others: Vec<&DeviceChannel> = before.iter().chain(&rest[1..]).collect();
        self.wait.unwatch_interrupts(d, &others);
        self.devices[i].close(why)
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

    /// Adds `device` (index `index` of the run's devices, on `controllers`) to this reactor
    /// while it runs, without waiting: its local queue pairs are had at once, on the reactor's
    /// memory node, and create their queues on the controller over their first polls (I/O
    /// submitted meanwhile goes out once they exist; see `Queues::while_running`). A remote
    /// device's queue still connects here. The device becomes the last of
    /// [`ReactorContext::devices`], even when its queues cannot be had: then it is there as a
    /// gone device (every submission refused), so that every reactor's list stays in step, and
    /// the error says why.
    pub fn add_device(
        &mut self,
        index: usize,
        device: &Arc<dyn BlockDevice>,
        controllers: Vec<Controller>,
    ) -> Result<(), String> {
        let mut queues = Queues::while_running();
        let opened = device.channel(&mut queues, &self.channel_options);
        self.queue_count += queues.len();
        // released before the channel settles: a queue only it uses becomes its own
        queues.release();
        let (channel, result) = match opened {
            Ok(channel) => (channel.settle(), Ok(())),
            Err(e) => {
                let why = format!("{}: {e}", device.info().name);
                (Channel::Gone(Arc::from(why.as_str())), Err(why))
            }
        };
        let mut added = DeviceChannel::new(
            index,
            device,
            channel,
            controllers,
            self.info.memory_node,
            &self.clock,
            &self.channel_options,
        );
        added.set_now(self.now_ns);
        let watched = self.wait.watch_interrupts(&added);
        self.devices.push(added);
        result.and(watched)
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

pub(super) struct Setup {
    pub(super) info: ReactorInfo,
    pub(super) devices: Arc<[Arc<dyn BlockDevice>]>,
    /// Every drive's controller, by the engine's drive index.
    pub(super) controllers: Arc<[Controller]>,
    pub(super) channel: ChannelOptions,
}

pub(super) enum Control {
    /// Every reactor is ready: start turning the job.
    Start,
    Stats,
    Stop,
    /// A device added while the job runs (see [`Run::add_device`]).
    Add(Box<Added>),
}

/// A device for a running reactor: the run's device `index`, on `controllers`, this reactor's
/// `share` of it; the answer goes to `done`.
pub(super) struct Added {
    pub(super) index: usize,
    pub(super) device: Arc<dyn BlockDevice>,
    pub(super) controllers: Vec<Controller>,
    pub(super) share: Share,
    pub(super) done: Sender<Result<(), String>>,
}

impl Added {
    /// Opens the device on this reactor and hands it to the job; says how that went.
    fn apply<J: Job>(self, ctx: &mut ReactorContext, job: &mut J) {
        let result = ctx
            .add_device(self.index, &self.device, self.controllers)
            .and_then(|()| job.device_added(ctx, self.share));
        let _ = self.done.send(result);
    }
}

/// How often (in turns) a reactor looks at its control channel.
const CONTROL_EVERY: u32 = 256;

/// The reactor thread: pin, set up channels, run the job, answer control messages, drain,
/// finish. Channels (and so queue pairs) are dropped at the end: their queues are deleted.
pub(super) fn reactor<J: Job>(
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
    // the reactor's I/O queues, one per controller: its channels share them
    let mut queues = Queues::new();
    // each device's channel, and why it is gone if it went before it had one
    let mut channels = Vec::with_capacity(setup.info.devices.len());
    for &i in &setup.info.devices {
        let device = &setup.devices[i];
        match device.channel(&mut queues, &setup.channel) {
            Ok(c) => channels.push((c, None)),
            // removed while the run was set up: it fails alone, as one removed while it runs
            Err(e @ usnvme_driver::Error::Gone { .. }) => {
                log::error!("{}: {e}: no I/O to it", device.info().name);
                let why = format!("{} is gone", device.info().name);
                channels.push((Channel::Gone(Arc::from(e.to_string())), Some(why)));
            }
            Err(e) => {
                let what = format!("{}: {e}", device.info().name);
                let _ = ready.send(Err(EngineError::Reactor { cpu, what }));
                return None;
            }
        }
    }
    let queue_count = queues.len();
    queues.release();
    let mut devices = Vec::with_capacity(channels.len());
    for (&i, (channel, gone)) in setup.info.devices.iter().zip(channels) {
        let device = &setup.devices[i];
        let controllers = device
            .drives()
            .iter()
            .filter_map(|&d| setup.controllers.get(d).cloned())
            .collect();
        let mut added = DeviceChannel::new(
            i,
            device,
            channel.settle(),
            controllers,
            setup.info.memory_node,
            &clock,
            &setup.channel,
        );
        if let Some(why) = gone {
            added.close(&why);
        }
        devices.push(added);
    }
    let wait = Wait::new()
        .map_err(|e| format!("epoll: {e}"))
        .and_then(|w| {
            devices.iter().try_for_each(|d| w.watch_interrupts(d))?;
            Ok(w)
        });
    let wait = match wait {
        Ok(w) => w,
        Err(what) => {
            let _ = ready.send(Err(EngineError::Reactor { cpu, what }));
            return None;
        }
    };
    let mut job = make_job(&setup.info);
    let mut ctx = ReactorContext {
        info: setup.info,
        devices,
        queue_count,
        channel_options: setup.channel,
        started: Instant::now(),
        clock,
        now_ns: 0,
        wait,
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
            Ok(Control::Add(added)) => added.apply(&mut ctx, &mut job),
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
                    Control::Add(added) => added.apply(&mut ctx, &mut job),
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
    // The channels go: their queue pairs hand their queues to the controllers to delete. The
    // run is over, so the reactor may wait for that now (none is left behind for later).
    let mut drives: Vec<usize> = ctx
        .info
        .devices
        .iter()
        .flat_map(|&i| setup.devices[i].drives())
        .collect();
    drives.sort_unstable();
    drives.dedup(); // a drive's namespaces share its queue: once each
    drop(ctx);
    for c in drives.iter().filter_map(|&d| setup.controllers.get(d)) {
        c.finish_deletions();
    }
    Some((output, snapshot))
}

//! The engine: attach drives in parallel, place them on reactor cores by NUMA node, and run a
//! job on one pinned polling thread per core. Control (stats, stop) travels on crossbeam
//! channels; the data path never leaves its reactor.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, unbounded, Receiver, Sender};
use usnvme_driver::pci::Sysfs;
use usnvme_driver::{Controller, ControllerOptions, DeviceSpec, IoBuffer, Opener};
use usnvme_hugepages::{BufferPool, PoolError};

use crate::block::{
    BlockDevice, BlockError, BlockInfo, Channel, ChannelOptions, DmaTarget, Finished, IoCompletion,
    NamespaceDevice, Op, PiMode, MAX_TOKEN,
};
use crate::placement::{self, Placement, PlacementError, Policy};
use crate::stats::{IoStats, OpKind, Snapshot};
use crate::topology::{pin_current_thread, Topology};
use crate::transport::Queues;

mod attach;
mod channel;
mod reactor;
mod run;
mod wait;

pub use attach::{attach, AttachError, Drive};
pub use channel::DeviceChannel;
pub use reactor::ReactorContext;
use reactor::{reactor, Added, Control, Setup};
use run::ReactorHandle;
pub use run::{ReactorResult, Run};
pub use wait::INTERRUPT;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Placement(#[from] PlacementError),
    #[error("no block devices to run on")]
    NoDevices,
    #[error("reactor on core {cpu}: {what}")]
    Reactor { cpu: usize, what: String },
    #[error(
        "{device}: no I/O queue left on {drive}: the controller granted {granted} I/O queue \
         pair(s) and the reactors serving the devices before it use them all (run fewer cores \
         or devices on it)"
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

/// Every namespace of drive `index` (whose controller is `controller`) as a block device,
/// those formatted with metadata driven as `pi` says (left out with a warning without it).
pub fn drive_namespaces(
    index: usize,
    controller: &Controller,
    pi: Option<PiMode>,
) -> Vec<Arc<dyn BlockDevice>> {
    let mut devices: Vec<Arc<dyn BlockDevice>> = Vec::new();
    for ns in controller.namespaces().iter() {
        match NamespaceDevice::with_pi(controller.clone(), ns.nsid, index, pi) {
            Ok(dev) => devices.push(Arc::new(dev)),
            Err(e) => log::warn!("{}: namespace {} skipped: {e}", controller.name(), ns.nsid),
        }
    }
    devices
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
    /// A device was added while the job runs ([`Run::add_device`]): the last of
    /// `ctx.devices`, of which this reactor has `share`. An error leaves it unused here.
    fn device_added(&mut self, _ctx: &mut ReactorContext, _share: Share) -> Result<(), String> {
        Err("this job takes no device while it runs".into())
    }
    /// After the loop and after every channel drained.
    fn finish(self, ctx: &mut ReactorContext) -> Self::Output;
}

impl Engine {
    pub fn new(
        topology: Topology,
        drives: Vec<Drive>,
        options: EngineOptions,
    ) -> Result<Engine, EngineError> {
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

    /// Each NUMA node's selected cores and drives, and the cores their queue pairs are on (see
    /// [`Placement::by_node`]); empty when no drive's node is known.
    pub fn placement_by_node(&self) -> Vec<String> {
        let names: Vec<String> = self.drives.iter().map(|d| d.spec.to_string()).collect();
        let nodes: Vec<Option<u32>> = self.drives.iter().map(|d| d.node).collect();
        self.placement.by_node(&names, &nodes)
    }

    /// Every namespace of every drive as a block device, in drive order; those formatted with
    /// metadata are left out, with a warning naming them.
    pub fn namespaces(&self) -> Vec<Arc<dyn BlockDevice>> {
        self.namespaces_with_pi(None)
    }

    /// Every namespace of every drive as a block device, those formatted with metadata driven
    /// as `pi` says (left out with a warning without it).
    pub fn namespaces_with_pi(&self, pi: Option<PiMode>) -> Vec<Arc<dyn BlockDevice>> {
        let drives = self.drives.iter().enumerate();
        drives
            .flat_map(|(i, d)| drive_namespaces(i, &d.controller, pi))
            .collect()
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
    /// pair on each drive under it (shared by the drive's namespaces on that reactor), so a
    /// drive whose controller granted fewer queue pairs than the placement would use is served
    /// by as many reactors as it has queues: those that have a queue on it already, then those
    /// with the fewest devices so far, so that such drives spread over the cores. Everyone
    /// else keeps the placement's reactors. The same devices always get the same answer.
    pub fn assign(&self, devices: &[Arc<dyn BlockDevice>]) -> Result<Assignment, EngineError> {
        let mut left: Vec<u16> = self
            .drives
            .iter()
            .map(|d| d.controller.io_queues_granted())
            .collect();
        let mut load = vec![0usize; self.placement.reactors.len()];
        // the drives each reactor has a queue on
        let mut queues: Vec<Vec<usize>> = vec![Vec::new(); self.placement.reactors.len()];
        let mut serving = Vec::with_capacity(devices.len());
        let mut limited = Vec::new();
        for (i, dev) in devices.iter().enumerate() {
            let drives = dev.drives();
            let mut placed = self.placed(dev.as_ref());
            let mut by_load = placed.clone();
            let has_all =
                |r: usize, queues: &[Vec<usize>]| drives.iter().all(|d| queues[r].contains(d));
            by_load.sort_by_key(|&r| (!has_all(r, &queues), load[r]));
            let mut chosen = Vec::with_capacity(placed.len());
            for r in by_load {
                let new: Vec<usize> = drives
                    .iter()
                    .copied()
                    .filter(|d| !queues[r].contains(d))
                    .collect();
                if new.iter().all(|&d| left.get(d).is_some_and(|&q| q > 0)) {
                    for &d in &new {
                        left[d] -= 1;
                        queues[r].push(d);
                    }
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
                d.poll(|c| match &c.result() {
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
                .map(|(d, &(ok, gone, other))| (ok, gone, other, d.removed().map(str::to_owned)))
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
        // sim:1 completes I/O, then goes
        let sim1 = opener.sim_controller("sim:1").expect("sim:1");
        while sim1.completions() < 100 {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "no I/O on sim:1"
            );
            std::thread::yield_now();
        }
        sim1.remove();
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
        assert_eq!(removed1.as_deref(), Some("sim:1 is gone"));
    }

    fn sim_engine(specs: &[&str], cores: &[usize]) -> Engine {
        sim_engine_with(specs, cores, ChannelOptions::default())
    }

    /// An engine on simulated drives `specs`, its reactors on `cores`, its channels `channel`.
    pub(super) fn sim_engine_with(
        specs: &[&str],
        cores: &[usize],
        channel: ChannelOptions,
    ) -> Engine {
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
                channel,
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
        // a namespace of each of two one-queue drives takes their queues on different cores:
        // a stripe over both then has no core with a queue on each
        let namespaces = engine.namespaces();
        let (a5, a6) = (namespaces[5].clone(), namespaces[6].clone());
        let stripe = StripeDevice::new("stripe1", vec![a5.clone(), a6.clone()], 128 << 10);
        let all: Vec<Arc<dyn BlockDevice>> = vec![a5, a6, Arc::new(stripe.expect("stripe"))];
        let err = engine.assign(&all).expect_err("no queue left");
        assert!(
            matches!(err, EngineError::NoQueue { granted: 1, .. }),
            "{err}"
        );
    }

    #[test]
    fn a_namespace_with_metadata_is_no_block_device() {
        let engine = sim_engine(&["sim:0,ms=8", "sim:1"], &[0]);
        let devices = engine.namespaces();
        let names: Vec<&str> = devices.iter().map(|d| d.info().name.as_str()).collect();
        assert_eq!(names, ["sim:1"]);
        let err =
            NamespaceDevice::new(engine.drives()[0].controller.clone(), 1, 0).expect_err("refused");
        let err = err.to_string();
        assert!(err.starts_with("sim:0: "), "{err}");
        assert!(
            err.contains("namespace 1 is formatted with 8 bytes of metadata"),
            "{err}"
        );
    }

    #[test]
    fn the_namespaces_of_a_drive_share_its_queue_on_each_core() {
        // one queue pair granted: its four namespaces all go to one core, through one queue
        let engine = sim_engine(&["sim:0,ns=4,queues=1", "sim:1,ns=4"], &[0, 1]);
        let devices = engine.namespaces();
        assert_eq!(devices.len(), 8);
        let a = engine.assign(&devices).expect("assigned");
        let expected: [&[usize]; 8] = [&[0], &[0], &[0], &[0], &[0, 1], &[0, 1], &[0, 1], &[0, 1]];
        assert_eq!(a.serving, expected);
        assert!(
            a.limited.iter().all(|l| l.drive == "sim:0"),
            "{:?}",
            a.limited
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
                d.poll(|c| assert!(c.result().is_ok()));
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

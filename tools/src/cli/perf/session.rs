//! A session: attached drives, the engine and the block devices, measuring one run after another.

use super::*;

/// NVMe/TCP and RDMA I/O queues asked of a remote controller for each reactor (what it
/// grants is used as needed; a reactor shares a queue among its namespaces past it).
const QUEUES_PER_REACTOR: usize = 16;

/// Attached drives, the engine and the block devices, ready to measure one run after another
/// (`perf` measures one; `sweep` many).
pub(crate) struct Session {
    pub(crate) settings: Settings,
    pub(crate) engine: Engine,
    pub(super) devices: Vec<Arc<dyn BlockDevice>>,
    /// Each device's I/O region (`--offset`, `--size`).
    pub(super) spans: Vec<Region>,
    pub(super) names: Vec<String>,
    /// Keeps the simulated controllers reachable (`--remove`).
    pub(super) opener: Opener,
    /// The remote controllers' associations: told not to reconnect any more on Ctrl-C.
    pub(super) links: Vec<Arc<ControllerLink>>,
}

/// One controller's reset (`--reset-after`).
#[derive(Debug)]
pub(crate) struct ResetOutcome {
    pub(super) device: String,
    pub(super) result: std::result::Result<Duration, String>,
}

/// What one measurement gave.
pub(crate) struct Measured {
    pub(crate) rows: Vec<Row>,
    pub(super) failures: Vec<String>,
    pub(super) mismatches: Vec<String>,
    pub(super) checked: u64,
    /// When the controllers were reset, into the measurement, and how each reset went.
    pub(super) reset: Option<(Duration, Vec<ResetOutcome>)>,
    /// Whether the run asked for a reset (then aborted I/Os are expected).
    pub(super) reset_asked: bool,
    /// Whether the run measured a time (not an I/O count).
    pub(super) timed: bool,
}

impl Measured {
    /// Reports data mismatches, removed devices, failed I/O and failed resets as errors (one
    /// line each).
    pub(crate) fn verdict(&self) -> Result<()> {
        for m in &self.mismatches {
            eprintln!("usnvme: verify: {m}");
        }
        let mut problems: Vec<anyhow::Error> = Vec::new();
        let removed: Vec<&Row> = self.rows.iter().filter(|r| r.removed.is_some()).collect();
        let names: BTreeSet<&str> = removed.iter().map(|r| r.device.as_str()).collect();
        if !names.is_empty() {
            let failed: u64 = removed.iter().map(|r| r.failed - r.aborted).sum();
            let devices: BTreeSet<&str> = self.rows.iter().map(|r| r.device.as_str()).collect();
            let names: Vec<&str> = names.into_iter().collect();
            let others = match devices.len() - names.len() {
                0 => String::new(),
                n => format!("; the other {n} device(s) ran to the end"),
            };
            problems.push(anyhow::anyhow!(
                "{} removed during the run: {failed} I/O(s) failed (Host Pathing Error){others}",
                names.join(", "),
            ));
        }
        if let Some(first) = self.failures.first() {
            // the same failure on every drive and core says it once
            let more = self.failures.len() - 1;
            let tail = if more > 0 {
                format!(" (and {more} more like it)")
            } else {
                String::new()
            };
            problems.push(anyhow::anyhow!("I/O failed: {first}{tail}"));
        }
        let aborted: u64 = self.rows.iter().map(|r| r.aborted).sum();
        if aborted > 0 && !self.reset_asked {
            problems.push(anyhow::anyhow!(
                "{aborted} I/O(s) aborted by a controller reset (Command Aborted By Host): a command timed out or a controller failed (see the log: RUST_LOG=warn)"
            ));
        }
        if let Some((_, outcomes)) = &self.reset {
            for o in outcomes {
                if let Err(e) = &o.result {
                    problems.push(anyhow::anyhow!("{}: reset failed: {e}", o.device));
                }
            }
            // I/O must resume after the reset on every device that is still there.
            if self.timed {
                for r in self.rows.iter().filter(|r| r.removed.is_none()) {
                    if r.after_reset == Some(0) {
                        problems.push(anyhow::anyhow!(
                            "{}: no I/O completed after the reset",
                            r.name()
                        ));
                    }
                }
            }
        }
        if !self.mismatches.is_empty() {
            problems.push(anyhow::anyhow!(
                "verify: data mismatches found (listed above)"
            ));
        }
        match problems.len() {
            0 => Ok(()),
            1 => Err(problems.remove(0)),
            _ => Err(crate::open::Failures(problems).into()),
        }
    }

    /// "Reset: 4 controller(s) 1.0 s into the measurement, in 3 ms at most; ..." (with
    /// `--reset-after`).
    pub(super) fn reset_line(&self) -> Option<String> {
        if !self.reset_asked {
            return None;
        }
        let Some((at, outcomes)) = &self.reset else {
            return Some("Reset: none (the run ended before --reset-after)".into());
        };
        let ok: Vec<Duration> = outcomes
            .iter()
            .filter_map(|o| o.result.clone().ok())
            .collect();
        let slowest = ok.iter().max().copied().unwrap_or_default();
        let after: u64 = self.rows.iter().filter_map(|r| r.after_reset).sum();
        let aborted: u64 = self.rows.iter().map(|r| r.aborted).sum();
        Some(format!(
            "Reset: {} of {} controller(s) {:.1} s into the measurement, in {:.1} ms at most; {aborted} I/O(s) aborted, {after} completed after it",
            ok.len(),
            outcomes.len(),
            at.as_secs_f64(),
            slowest.as_secs_f64() * 1e3
        ))
    }

    pub(super) fn reset_json(&self) -> Option<serde_json::Value> {
        let (at, outcomes) = self.reset.as_ref()?;
        let controllers: Vec<serde_json::Value> = outcomes
            .iter()
            .map(|o| match &o.result {
                Ok(d) => json!({"device": o.device, "ok": true, "ms": d.as_millis() as u64}),
                Err(e) => json!({"device": o.device, "ok": false, "error": e}),
            })
            .collect();
        Some(json!({"after_s": at.as_secs_f64(), "controllers": controllers}))
    }
}

impl Session {
    /// Checks the flags, attaches the drives and builds the devices. `max_io_size`: the largest
    /// I/O the session will run (default: `-o`), which sizes the queues. `histograms`: latency
    /// percentiles, which cost more per I/O than all the other statistics.
    pub(crate) fn open(
        sysfs: &Sysfs,
        args: &Args,
        max_io_size: Option<u64>,
        histograms: bool,
    ) -> Result<Session> {
        let topology =
            Topology::from_sysfs(sysfs.root()).context("cannot read the CPU topology")?;
        let settings = settings(args, &topology)?;
        // remote subsystems alone: no local drive is taken by default
        let targets = if settings.specs.is_empty() && !settings.remotes.is_empty() {
            Vec::new()
        } else {
            targets(sysfs, &settings.specs)?
        };
        if targets.is_empty() && settings.remotes.is_empty() {
            anyhow::bail!("{}", crate::open::NO_CONTROLLERS);
        }
        let opener = Opener::new(sysfs.root().join("sys"));
        if let Some((name, _)) = &settings.remove {
            if !settings
                .specs
                .iter()
                .flat_map(DeviceSpec::drives)
                .any(|d| &d.to_string() == name)
            {
                return Err(usage(format!(
                    "--remove {name}: not one of the drives given with -r"
                )));
            }
        }
        let mut drives = Vec::new();
        let options = ControllerOptions {
            shadow_doorbells: args.shadow_doorbells,
            ..ControllerOptions::default()
        };
        for attached in attach(&opener, sysfs, &targets, &options) {
            match attached {
                Ok(d) => drives.push(d),
                Err(e) => {
                    if matches!(
                        *e.error,
                        usnvme_driver::Error::Vfio(VfioError::NotVfio { .. })
                    ) {
                        return Err(usage(format!("-r {e}")));
                    }
                    // Most of the driver's errors name the drive already (and the owner of one
                    // in use): not twice.
                    if e.error.to_string().starts_with(&e.drive) {
                        return Err((*e.error).into());
                    }
                    return Err(e.into());
                }
            }
        }
        let reactors = if settings.cores.is_empty() {
            topology.allowed.len()
        } else {
            settings.cores.len()
        };
        let remotes = attach_remotes(sysfs, args, &settings, &drives, reactors)?;
        let io_size = max_io_size.unwrap_or(settings.run.io_size);
        // A queue holds MQES+1 entries, one always empty: at most MQES commands in flight.
        let granted = drives
            .iter()
            .map(|d| u32::from(d.controller.cap().mqes()))
            .chain(remotes.iter().map(RemoteSubsystem::max_depth))
            .min()
            .unwrap_or(0);
        if args.depth > granted {
            return Err(usage(format!(
                "-q {}: the drives grant a queue depth of at most {granted} (valid: 1-{granted})",
                args.depth
            )));
        }
        let engine = Engine::new(
            topology,
            drives,
            EngineOptions {
                cores: settings.cores.clone(),
                // -q I/Os of -o bytes per queue pair: the engine sizes each drive's rings
                channel: ChannelOptions {
                    depth: args.depth.min(u32::from(u16::MAX)) as u16,
                    io_size: Some(io_size),
                    latency_histograms: histograms,
                    interrupts: args.interrupts,
                    ..ChannelOptions::default()
                },
                ..EngineOptions::default()
            },
        )?;
        let devices = devices(
            &engine,
            &remotes,
            settings.stripe,
            settings.namespace,
            settings.pi,
        )?;
        let spans = spans(&devices, &settings)?;
        check_io_size(&devices, &spans, io_size, &format!("-o {}", args.io_size))?;
        // Said once, before any I/O: drives served by fewer cores than placed, and why.
        for l in engine.assign(&devices)?.limited {
            let name = &devices[l.device].info().name;
            let device = if *name == l.drive {
                String::new()
            } else {
                format!("{name} ")
            };
            eprintln!(
                "usnvme: {} granted {} I/O queue pair(s): {device}served from core(s) {} only, not {}",
                l.drive,
                l.granted,
                format_cpu_list(&l.cpus),
                format_cpu_list(&l.placed_cpus)
            );
        }
        let names = devices.iter().map(|d| d.info().name.clone()).collect();
        let links = remotes.iter().flat_map(RemoteSubsystem::links).collect();
        Ok(Session {
            settings,
            engine,
            devices,
            spans,
            names,
            opener,
            links,
        })
    }

    /// Checks an I/O size against every device (as `-o` is checked).
    pub(crate) fn check_io_size(&self, io_size: u64, given: &str) -> Result<()> {
        check_io_size(&self.devices, &self.spans, io_size, given)
    }

    /// Runs `spec` on every reactor, capped at `rate` IOPS in total, and collects its rows.
    /// `live`: the one-line progress on a terminal. `announce`: a line for standard error once
    /// every reactor has its queues and runs (what a test or a person waits for to act on a
    /// run under way).
    pub(crate) fn measure(
        &self,
        spec: &RunSpec,
        rate: Option<u64>,
        live: bool,
        announce: Option<&str>,
    ) -> Result<Measured> {
        let assignment = self.engine.assign(&self.devices)?;
        let pairs: usize = assignment.serving.iter().map(Vec::len).sum();
        let mut job_spec = spec.clone();
        job_spec.rate = rate.map(|r| r as f64 / pairs.max(1) as f64);
        let reset_done = self
            .settings
            .reset_after
            .map(|_| Arc::new(AtomicBool::new(false)));
        job_spec.reset_done = reset_done.clone();
        let spans = self.spans.clone();
        let io_size = spec.io_size;
        let run = self.engine.start(self.devices.clone(), move |info| {
            let mine = info
                .devices
                .iter()
                .zip(&info.shares)
                .map(|(&d, &share)| region(spans[d], share, io_size))
                .collect();
            Workload::new(job_spec.clone(), mine)
        })?;
        // The reactors start their jobs as `start` returns: the measurement begins after the
        // warm-up from now.
        let measure_from = Instant::now() + spec.warmup;
        if let Some(line) = announce {
            eprintln!("{line}");
        }
        // Side actions at a time into the measurement; dropping `cancel` ends those not yet due.
        let (cancel, cancelled) = mpsc::channel::<()>();
        let controllers: Vec<Controller> = self
            .engine
            .drives()
            .iter()
            .map(|d| d.controller.clone())
            .collect();
        let resetter = match (self.settings.reset_after, reset_done) {
            (Some(after), Some(done)) => {
                let controllers = controllers.clone();
                let at = measure_from + after;
                Some(std::thread::spawn(move || {
                    reset_all(&controllers, at, &cancelled, &done).map(|o| (after, o))
                }))
            }
            _ => None,
        };
        let (cancel_remove, remove_cancelled) = mpsc::channel::<()>();
        let remover = self.settings.remove.as_ref().and_then(|(name, after)| {
            let sim = self.opener.sim_controller(name)?;
            let at = measure_from + *after;
            Some(std::thread::spawn(move || {
                if wait_until(at, &remove_cancelled) {
                    sim.remove();
                }
            }))
        });
        // drives that join the run while it goes on (`--hotplug`, and the debug `--add`)
        let joined = hotplug::Joined::default();
        let added_spans = spec.added_spans.clone();
        let stop_joining = AtomicBool::new(false);
        let uevents = match self.settings.hotplug.then(UeventSocket::open) {
            Some(Err(e)) => {
                eprintln!("usnvme perf: warning: --hotplug: cannot watch the kernel's device events ({e}): no drive joins the run");
                None
            }
            Some(Ok(socket)) => Some(socket),
            None => None,
        };
        std::thread::scope(|scope| {
            let (run, joined, spans, stop) = (&run, &joined, &*added_spans, &stop_joining);
            if let Some(events) = uevents {
                let binds = crate::hotplug::Binds::new(events);
                scope.spawn(move || hotplug::watch_inserts(self, run, binds, joined, spans, stop));
            }
            if let Some((device, after)) = &self.settings.add {
                let at = measure_from + *after;
                scope.spawn(move || {
                    while Instant::now() < at {
                        if stop.load(Ordering::Acquire) {
                            return;
                        }
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    if let Err(why) = self.join(run, device, joined, spans) {
                        eprintln!("usnvme perf: warning: --add {device}: {why}");
                    }
                });
            }
            watch(run, live, &controllers, &self.links);
            stop.store(true, Ordering::Release);
        });
        drop((cancel, cancel_remove));
        let reset = resetter.and_then(|t| t.join().ok().flatten());
        if let Some(t) = remover {
            let _ = t.join();
        }
        let results = run.wait()?;
        let mut m = Measured {
            rows: Vec::new(),
            failures: Vec::new(),
            mismatches: Vec::new(),
            checked: 0,
            reset,
            reset_asked: self.settings.reset_after.is_some(),
            timed: spec.duration.is_some(),
        };
        let names = joined.names(&self.names);
        for r in results {
            for d in r.output {
                m.checked += d.checked;
                let device = names[d.device].clone();
                if let Some(e) = &d.error {
                    m.failures.push(format!("{device}@core{}: {e}", r.info.cpu));
                }
                for x in &d.mismatches {
                    m.mismatches
                        .push(format!("{device}: LBA {}: {}", x.lba, x.what));
                }
                if d.more_mismatches > 0 {
                    m.mismatches
                        .push(format!("{device}: {} more mismatches", d.more_mismatches));
                }
                m.rows.push(Row {
                    device,
                    core: r.info.cpu,
                    stats: d.stats,
                    elapsed: d.elapsed,
                    joined: d.joined,
                    per_second: d.per_second,
                    failed: d.failed,
                    aborted: d.aborted,
                    after_reset: m.reset.as_ref().map(|_| d.after_reset),
                    removed: d.removed,
                    reconnects: d.reconnects,
                    cpu: d.cpu,
                });
            }
        }
        Ok(m)
    }
}

/// Connects to every remote subsystem given (`-r tcp://…`; addresses of one subsystem NQN are
/// paths to it), asking each controller for an I/O queue per reactor (its namespaces share
/// it). Their I/O buffers are the local drives' (a stripe may mix both), or ordinary memory
/// when there are none: no device reads them but the socket.
fn attach_remotes(
    sysfs: &Sysfs,
    args: &Args,
    settings: &Settings,
    drives: &[Drive],
    reactors: usize,
) -> Result<Vec<RemoteSubsystem>> {
    if settings.remotes.is_empty() {
        return Ok(Vec::new());
    }
    let mut host = args.remote.host_options(sysfs.root())?;
    host.kato_ms = args.keep_alive_tmo.saturating_mul(1000);
    let policy = ReconnectPolicy::from_secs(args.reconnect_delay, args.ctrl_loss_tmo);
    let dma = match drives.first() {
        Some(d) => DmaTarget {
            space: d.controller.iova_space().clone(),
            page: d.controller.page_size(),
        },
        None => DmaTarget {
            space: IovaSpace::new(Arc::new(NoIommu)),
            page: PageSize::Small4K,
        },
    };
    // a reactor takes one queue per controller, or more where the controller's queues are
    // too small for the depth of every namespace it exports (SPDK's perf: one per namespace)
    let wanted = (reactors.max(1) * QUEUES_PER_REACTOR).min(usize::from(u16::MAX - 1)) as u16;
    // addresses of one subsystem NQN are paths to it, as Linux's native multipath has them
    let mut subsystems: Vec<Vec<TcpAddress>> = Vec::new();
    for addr in &settings.remotes {
        match subsystems.iter_mut().find(|s| s[0].subnqn == addr.subnqn) {
            Some(paths) => paths.push(addr.clone()),
            None => subsystems.push(vec![addr.clone()]),
        }
    }
    subsystems
        .iter()
        .map(|paths| {
            if paths.len() > 1 {
                let list: Vec<String> = paths.iter().map(|p| p.addr.to_string()).collect();
                eprintln!(
                    "usnvme perf: {}: {} paths ({}): I/O goes to every optimized one",
                    paths[0].subnqn.as_deref().unwrap_or_default(),
                    paths.len(),
                    list.join(", ")
                );
            }
            RemoteSubsystem::attach_paths(paths, &host, policy, wanted, dma.clone())
                .map_err(|e| crate::remote::explain(e, &paths[0]))
        })
        .collect()
}

/// Waits until `at`; false if cancelled first.
fn wait_until(at: Instant, cancelled: &mpsc::Receiver<()>) -> bool {
    matches!(
        cancelled.recv_timeout(at.saturating_duration_since(Instant::now())),
        Err(RecvTimeoutError::Timeout)
    )
}

/// At `at` (unless cancelled first), resets every controller at once, then sets `done`.
fn reset_all(
    controllers: &[Controller],
    at: Instant,
    cancelled: &mpsc::Receiver<()>,
    done: &AtomicBool,
) -> Option<Vec<ResetOutcome>> {
    if !wait_until(at, cancelled) {
        return None;
    }
    let outcomes = std::thread::scope(|scope| {
        let threads: Vec<_> = controllers
            .iter()
            .map(|c| {
                scope.spawn(move || {
                    let started = Instant::now();
                    c.reset()
                        .map(|()| started.elapsed())
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        threads
            .into_iter()
            .zip(controllers)
            .map(|(t, c)| ResetOutcome {
                device: c.name().to_string(),
                result: t
                    .join()
                    .unwrap_or_else(|_| Err("the thread resetting it panicked".into())),
            })
            .collect()
    });
    done.store(true, Ordering::Relaxed);
    Some(outcomes)
}

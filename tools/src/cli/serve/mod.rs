//! `usnvme serve`: export the engine's block devices (namespaces of drives on vfio-pci, `sim:`
//! drives, stripes) as the namespaces of one NVM subsystem over NVMe/TCP, with the discovery
//! subsystem on the same listeners, to hosts running the stock Linux initiator
//! (`nvme discover`, `nvme connect -t tcp`).
//!
//! The listeners are polled here; each accepted connection goes to one reactor, round robin,
//! which owns it from then on (`usnvme_engine::fabric::export::server`). Drives come and go
//! while it runs ([`hotplug`]). Ctrl-C / SIGTERM: stop accepting, complete what is in flight,
//! close the connections, shut the controllers down, exit 130 / 143.

mod config;
mod control;
mod hotplug;

use std::io::{ErrorKind, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use parking_lot::Mutex;
use usnvme_driver::pci::uevent::UeventSocket;
use usnvme_driver::pci::Sysfs;
use usnvme_driver::protection::PiChecks;
use usnvme_driver::spec::fabrics::check_nqn;
use usnvme_driver::spec::SmartLog;
use usnvme_driver::{ControllerOptions, DeviceSpec, Opener};
use usnvme_engine::fabric::address::Transport;
use usnvme_engine::fabric::export::admin::aggregate_smart;
use usnvme_engine::fabric::export::connection::ConnectionLimits;
use usnvme_engine::fabric::export::live::LiveTarget;
use usnvme_engine::fabric::export::registry::{AnaState, Registry};
use usnvme_engine::fabric::export::server::{
    Counters, IdleMode, Inbox, Incoming, RdmaListener, ReactorBuffers, ServeJob, Shared,
    SmartService,
};
use usnvme_engine::fabric::export::{
    ExportedNamespace, Listener, SubsystemInfo, Subsystems, DISCOVERY_NQN,
};
use usnvme_engine::placement::Policy;
use usnvme_engine::topology::{parse_cores, Topology};
use usnvme_engine::{attach, BlockDevice, ChannelOptions, Engine, EngineOptions, PiMode};

use crate::perf::{stripe, usage, Given};
pub use config::TargetConfig;
use config::{PortConfig, SubsystemConfig};
pub use control::{request as control_request, DEFAULT_SOCKET};

/// Largest transfer of one command (MDTS): 1 MiB, so that a host's 512 KiB or 1 MiB I/O is one
/// command (nvmet sets no limit; Linux's own cap for NVMe/TCP is larger); serve splits at its
/// drives' limits itself.
const MAX_TRANSFER: u32 = 1 << 20;
/// The usual size of a reactor's DMA buffers, and the I/O size its channels are sized for:
/// 128 KiB, as most drives' largest transfer.
const USUAL_TRANSFER: u32 = 128 << 10;
/// In-capsule data a command may carry: 8 KiB (a 4 KiB or 8 KiB write needs no R2T).
const IN_CAPSULE: u32 = 8192;
/// Entries of each queue, MAXCMD.
const QUEUE_ENTRIES: u16 = 128;
/// Most data in one H2CData PDU.
const MAXH2CDATA: u32 = 128 << 10;
/// DMA buffers each reactor keeps for its connections' commands: 256 of the usual size (32
/// MiB) and 16 of MAX_TRANSFER for those beyond it (16 MiB); more commands wait for them.
const BUFFERS_PER_REACTOR: ReactorBuffers = ReactorBuffers {
    size: USUAL_TRANSFER as usize,
    count: 256,
    large: 16,
};

/// Export drives and stripes over NVMe/TCP.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The target as a JSON file: drives, ports, subsystems with their hosts and namespaces
    /// (the README gives its schema; `usnvme target save` writes one). Read again on SIGHUP,
    /// and what changed is applied while the target runs. Instead of -r, --stripe, -c,
    /// --listen, --nqn and the host flags.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["devices", "stripe", "cores", "listen", "nqn", "allow_host", "allow_any_host"])]
    config: Option<std::path::PathBuf>,
    /// The control socket `usnvme target` talks to (JSON-RPC 2.0, owner only). Default with
    /// --config: /run/usnvme/target.sock; without, none unless given.
    #[arg(long, value_name = "PATH")]
    control: Option<std::path::PathBuf>,
    /// Device: a BDF (0000:01:00.0) or sim:N[-M][,options]; repeatable. Default: every NVMe
    /// controller bound to vfio-pci, now and later (see --hotplug). A drive removed or
    /// unbound while the target runs takes its namespaces (and a stripe it is in) away.
    #[arg(short = 'r', long = "device")]
    devices: Vec<String>,
    /// Export NVMe controllers bound to vfio-pci while the target runs (a drive hot added,
    /// then `usnvme setup bind`), each namespace as the next namespace of the subsystem (not
    /// in a stripe), also when -r names the drives of the start. The default without -r.
    #[arg(long)]
    hotplug: bool,
    /// Export stripes (RAID 0) of N drives each, chunk size default 128K: N or N:CHUNK.
    #[arg(long = "stripe", value_name = "N[:CHUNK]", value_parser = stripe)]
    stripe: Option<Given<(usize, u64)>>,
    /// Reactor cores: a list (0,2-3), bracketed list ([0-3]) or hex mask (0xF). Default: all.
    #[arg(short = 'c', long = "cores")]
    cores: Option<String>,
    /// Where to listen (repeatable): ADDR:PORT for NVMe/TCP, rdma:ADDR:PORT for NVMe/RDMA
    /// (the address of an RDMA device: `rdma link` lists them). Default: 127.0.0.1:4420.
    #[arg(long = "listen", value_name = "[rdma:]ADDR:PORT", value_parser = parse_listen)]
    listen: Vec<(Transport, SocketAddr)>,
    /// The subsystem's NQN (default: derived from the host name).
    #[arg(long = "nqn", value_name = "NQN")]
    nqn: Option<String>,
    /// A host NQN that may connect (repeatable).
    #[arg(
        long = "allow-host",
        value_name = "HOSTNQN",
        conflicts_with = "allow_any_host"
    )]
    allow_host: Vec<String>,
    /// Any host may connect.
    #[arg(long = "allow-any-host")]
    allow_any_host: bool,
    /// Most TCP connections open at once (each queue of each host is one; each holds a few
    /// hundred KiB of buffers): the next is refused, with a warning naming it.
    #[arg(
        long = "max-connections",
        value_name = "N",
        default_value_t = 1024,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    max_connections: u64,
    /// Write the target's status (subsystem, namespaces, listeners, hosts, connections,
    /// controllers, commands, bytes sent, DMA buffers in use, reactor busy and CPU time) as JSON to
    /// FILE, every second (see --json-status-every) and at exit.
    #[arg(long = "json-status", value_name = "FILE")]
    json_status: Option<std::path::PathBuf>,
    /// How often --json-status rewrites its file, in seconds (0.01 to 3600).
    #[arg(
        long = "json-status-every",
        value_name = "S",
        default_value = "1",
        value_parser = status_interval,
        requires = "json_status"
    )]
    json_status_every: Duration,
    /// What a reactor does with no work: `adaptive` polls while there is work and sleeps on
    /// its sockets after 2 ms without (nothing in flight); `interrupt` has the drives raise an
    /// interrupt per completion (MSI-X through VFIO) and sleeps whenever a turn finds nothing
    /// to do, I/O in flight or not (the least CPU); `poll` polls on, a whole core per reactor
    /// (the lowest latency for a host's first command after a pause).
    #[arg(long, value_enum, default_value_t = Idle::Adaptive)]
    idle: Idle,
    /// Asymmetric Namespace Access: a file of `ADDR:PORT STATE` lines (a --listen address,
    /// then optimized, non-optimized or inaccessible), read at start and again whenever it
    /// changes (looked at every second). Hosts connected through a port see its state in the
    /// ANA log, are told of each change, and find I/O refused through an inaccessible one;
    /// Linux's native multipath then sends it another way. Ports not named are optimized.
    #[arg(long = "ana-state-file", value_name = "FILE")]
    ana_state_file: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Idle {
    Adaptive,
    Interrupt,
    Poll,
}

/// `--json-status-every`: seconds, 0.01 to 3600.
fn status_interval(s: &str) -> std::result::Result<Duration, String> {
    s.parse::<f64>()
        .ok()
        .filter(|v| (0.01..=3600.0).contains(v))
        .map(Duration::from_secs_f64)
        .ok_or_else(|| "give seconds from 0.01 to 3600, e.g. 1 or 0.1".into())
}

pub fn main(sysfs: &Sysfs, args: &Args, out: &mut dyn Write) -> Result<()> {
    let result = run(sysfs, args, out);
    crate::perf::exit_on_usage(&result, out);
    result
}

fn run(sysfs: &Sysfs, args: &Args, out: &mut dyn Write) -> Result<()> {
    let config = match &args.config {
        Some(path) => TargetConfig::read(path).map_err(|e| usage(format!("--config {e}")))?,
        None => config_of_flags(sysfs, args)?,
    };
    let topology = Topology::from_sysfs(sysfs.root()).context("cannot read the CPU topology")?;
    let cores = match &config.cores {
        None => Vec::new(),
        Some(c) => parse_cores(c).map_err(|e| usage(format!("cores {c}: {e}")))?,
    };
    let stripe = match &config.stripe {
        None => None,
        Some(s) => Some(
            stripe(s)
                .map_err(|e| usage(format!("stripe {s}: {e}")))?
                .value,
        ),
    };
    let mut specs = Vec::new();
    for given in &config.devices {
        let spec: DeviceSpec = given
            .parse()
            .map_err(|e| usage(format!("device {given}: {e}")))?;
        specs.push(spec);
    }
    // Listen first: a port in use is refused before any drive is touched.
    let mut listeners = Vec::new();
    for (i, port) in config.ports.iter().enumerate() {
        listeners.push(listen(
            port.transport().map_err(usage)?,
            port.address,
            i as u16 + 1,
        )?);
    }
    // Drives bound to vfio-pci later are exported too: their events are watched from before
    // the drives are listed, so that none falls between. (Not under a test's sysfs tree: the
    // events are this machine's.)
    let watch_inserts =
        (specs.is_empty() || args.hotplug) && sysfs.root() == std::path::Path::new("/");
    let uevents = match watch_inserts.then(UeventSocket::open) {
        Some(Err(e)) => {
            eprintln!("usnvme: warning: cannot watch the kernel's device events ({e}): drives bound to vfio-pci while the target runs will not be exported");
            None
        }
        Some(Ok(socket)) => Some(socket),
        None => None,
    };
    let targets = crate::open::targets(sysfs, &specs)?;
    if targets.is_empty() {
        anyhow::bail!("{}", crate::open::NO_CONTROLLERS);
    }
    let opener = Arc::new(Opener::new(sysfs.root().join("sys")));
    let mut drives = Vec::new();
    for attached in attach(&opener, sysfs, &targets, &ControllerOptions::default()) {
        drives.push(attached?);
    }
    let engine = Engine::new(
        topology,
        drives,
        EngineOptions {
            cores,
            // every reactor reaches every device: a connection may use any namespace
            policy: Policy::AllToAll,
            channel: ChannelOptions {
                depth: QUEUE_ENTRIES,
                io_size: Some(u64::from(USUAL_TRANSFER)),
                interrupts: args.idle == Idle::Interrupt,
                ..ChannelOptions::default()
            },
            ..EngineOptions::default()
        },
    )?;
    let namespaces = crate::perf::namespaces(&engine, &[], None, Some(EXPORTED_PI))?;
    let devices = crate::perf::stripes(exportable(namespaces), stripe)?;
    let served = hotplug::Drives::default();
    for (i, drive) in engine.drives().iter().enumerate() {
        let on_it = (0..devices.len()).filter(|&k| devices[k].drives().contains(&i));
        served.add(
            drive.spec.clone(),
            i,
            drive.controller.clone(),
            on_it.collect(),
        );
    }
    let base = SubsystemInfo {
        nqn: DISCOVERY_NQN.into(),
        namespaces: Vec::new(),
        listeners: listeners.iter().map(|(_, l)| l.clone()).collect(),
        serial: String::new(),
        model: "usnvme".into(),
        firmware: env!("CARGO_PKG_VERSION").chars().take(8).collect(),
        in_capsule_bytes: IN_CAPSULE,
        max_transfer: MAX_TRANSFER,
        queue_entries: QUEUE_ENTRIES,
        io_queues: engine.placement().reactors.len().max(1) as u16 * 8,
        allowed_hosts: None,
        ports: None,
    };
    let mut list = Vec::new();
    for sub in &config.subsystems {
        // port IDs are 1, 2, … in the config's order
        let ports = config.ports_of(&sub.nqn).map(|addresses| {
            let id = |a: &SocketAddr| config.ports.iter().position(|p| p.address == *a);
            addresses
                .iter()
                .filter_map(id)
                .map(|i| i as u16 + 1)
                .collect()
        });
        let every_device = args.config.is_none();
        list.push(Arc::new(subsystem_of(
            sub,
            &base,
            &devices,
            every_device,
            ports,
        )));
    }
    let subsystems = Arc::new(Subsystems {
        base: Arc::new(base),
        list,
        generation: 1,
    });
    warn_of_open_doors(&subsystems, &listeners);
    let stop = Arc::new(AtomicBool::new(false));
    let counters = Arc::new(Counters::default());
    let smart_drives = served.clone();
    let registry = Arc::new(Registry::new());
    for (port, (_, listener)) in config.ports.iter().zip(&listeners) {
        control::set_ana_states(&registry, listener.port_id, port).map_err(usage)?;
    }
    let shared = Shared {
        subsystems: subsystems.clone(),
        registry: registry.clone(),
        limits: ConnectionLimits {
            maxh2cdata: MAXH2CDATA,
        },
        // on a thread of its own: a drive's admin queue takes milliseconds
        smart: SmartService::start(move || {
            let logs: Vec<SmartLog> = smart_drives
                .controllers()
                .iter()
                .filter_map(|c| c.smart_log().ok())
                .collect();
            aggregate_smart(&logs)
        })?,
        idle: match args.idle {
            Idle::Adaptive => IdleMode::Adaptive,
            Idle::Interrupt => IdleMode::Interrupt,
            Idle::Poll => IdleMode::Poll,
        },
        stop: stop.clone(),
        counters: counters.clone(),
    };
    let smart = shared.smart.clone();
    let reactors = engine.placement().reactors.len();
    let inboxes = (0..reactors)
        .map(|_| Inbox::new())
        .collect::<std::io::Result<Vec<Inbox>>>()?;
    let job_inboxes = inboxes.clone();
    let job_shared = shared.clone();
    let first_device = devices.first().cloned();
    let exported = devices.clone();
    let run = engine.start(devices, move |info| {
        let inbox = job_inboxes[info.index].clone();
        ServeJob::new(job_shared.clone(), inbox, BUFFERS_PER_REACTOR)
    })?;
    let live = Arc::new(LiveTarget::new(
        subsystems,
        &exported,
        inboxes.clone(),
        registry.clone(),
    ));
    for sub in &config.subsystems {
        for ns in &sub.namespaces {
            let request = ns.request().map_err(usage)?;
            live.export(&sub.nqn, request)
                .map_err(|e| usage(format!("--config: subsystem {}: {e}", sub.nqn)))?;
        }
    }
    let inserts = uevents
        .zip(first_device)
        .map(|(events, like)| hotplug::Inserts {
            binds: crate::hotplug::Binds::new(events),
            opener: opener.clone(),
            next_drive: engine.drives().len(),
            like,
        });
    let watcher = hotplug::watch(served.clone(), live.clone(), registry.clone(), inserts)?;
    let listeners = Arc::new(Mutex::new(listeners));
    let reloads = Arc::new(Reloads::default());
    let status = {
        let reloads = reloads.clone();
        let (live, listeners, registry) = (live.clone(), listeners.clone(), registry.clone());
        let counters = counters.clone();
        move || {
            let mut status = status_json(&live, &listeners.lock(), &counters, &registry, &smart);
            status["config_reloads"] = reloads.applied.load(Ordering::Relaxed).into();
            status["config_reloads_failed"] = reloads.failed.load(Ordering::Relaxed).into();
            status
        }
    };
    let operator = Arc::new(control::Operator {
        live: live.clone(),
        registry: registry.clone(),
        listeners: listeners.clone(),
        start: control::StartOptions {
            devices: config.devices.clone(),
            stripe: config.stripe.clone(),
            cores: config.cores.clone(),
        },
        drives: served.clone(),
        status: Box::new(status.clone()),
    });
    let control_path = args.control.clone().or_else(|| {
        args.config
            .is_some()
            .then(|| std::path::PathBuf::from(control::DEFAULT_SOCKET))
    });
    let control = match &control_path {
        Some(path) => Some(control::serve(path, operator.clone(), stop.clone())?),
        None => None,
    };
    if let Some(path) = &args.json_status {
        write_status(path, &status())?;
    }
    let hangups = crate::signals::hangups()?;
    let mut ana_file = AnaFile::default();
    if let Some(path) = &args.ana_state_file {
        ana_file.apply(path, &ports(&listeners.lock()), &registry);
    }
    print_exports(
        out,
        &live.subsystems(),
        &listeners.lock(),
        control_path.as_deref(),
    )?;
    // the listeners and the control socket answer: systemd's Type=notify may go on
    notify_ready();
    let tty = usnvme_tools::progress::wanted();
    let mut next = 0usize;
    let mut last_line = Instant::now();
    let mut last_status = Instant::now();
    let (mut last_commands, mut last_bytes) = (0u64, 0u64);
    while crate::signals::received().is_none() && !run.is_finished() {
        let accepted = accept_hosts(
            &listeners.lock(),
            &inboxes,
            &counters,
            &mut next,
            args.max_connections,
            QUEUE_ENTRIES,
        );
        if hangups.swap(false, Ordering::AcqRel) {
            reload(args.config.as_deref(), &operator, &reloads);
        }
        if let Some(path) = &args.json_status {
            if last_status.elapsed() >= args.json_status_every {
                write_status(path, &status())?;
                last_status = Instant::now();
            }
        }
        if last_line.elapsed() >= Duration::from_secs(1) {
            if let Some(path) = &args.ana_state_file {
                ana_file.apply(path, &ports(&listeners.lock()), &registry);
            }
            let commands = counters.commands.load(Ordering::Relaxed);
            let bytes = counters.bytes.load(Ordering::Relaxed);
            let secs = last_line.elapsed().as_secs_f64();
            if tty {
                eprint!(
                    "\r{} connection(s), {:.0} IOPS, {:.1} MiB/s sent   ",
                    counters.connections.load(Ordering::Relaxed),
                    (commands - last_commands) as f64 / secs,
                    (bytes - last_bytes) as f64 / secs / (1 << 20) as f64
                );
            }
            (last_commands, last_bytes) = (commands, bytes);
            last_line = Instant::now();
        }
        if !accepted {
            // the status line (on a terminal) and the ANA state file are seen to every second
            let mut at_most = Duration::from_secs(1);
            if tty {
                at_most = Duration::from_millis(100);
            }
            if args.json_status.is_some() {
                at_most = at_most.min(args.json_status_every);
            }
            // (a listener added meanwhile is polled from the next wait on)
            let fds = listener_fds(&listeners.lock());
            wait_for_hosts(&fds, at_most);
        }
    }
    if tty {
        eprintln!();
    }
    // no change of the target from here on (one under way waits for the reactors: they still
    // run)
    drop(control);
    drop(watcher);
    stop.store(true, Ordering::Release);
    inboxes.iter().for_each(Inbox::wake);
    listeners.lock().clear();
    run.wait()?;
    if let Some(path) = &args.json_status {
        write_status(path, &status())?;
    }
    Ok(())
}

/// The config the flags stand for: one subsystem, every device a namespace of it (in the
/// order they come).
fn config_of_flags(sysfs: &Sysfs, args: &Args) -> Result<TargetConfig> {
    let nqn = match &args.nqn {
        Some(n) => {
            check_nqn(n).map_err(|e| usage(format!("--nqn: {e}")))?;
            n.clone()
        }
        None => usnvme_engine::fabric::export::default_nqn(sysfs.root()),
    };
    for host in &args.allow_host {
        check_nqn(host).map_err(|e| usage(format!("--allow-host: {e}")))?;
    }
    let listen = if args.listen.is_empty() {
        vec![(Transport::Tcp, DEFAULT_LISTEN.parse()?)]
    } else {
        args.listen.clone()
    };
    Ok(TargetConfig {
        devices: args.devices.clone(),
        stripe: args.stripe.as_ref().map(|s| s.text.clone()),
        cores: args.cores.clone(),
        ports: listen
            .into_iter()
            .map(|(transport, address)| PortConfig {
                transport: transport.scheme().into(),
                address,
                ana_state: AnaState::Optimized.name().into(),
                ana_groups: Default::default(),
                subsystems: None,
            })
            .collect(),
        subsystems: vec![SubsystemConfig {
            nqn,
            serial: None,
            model: None,
            allow_any_host: args.allow_any_host,
            hosts: args.allow_host.clone(),
            namespaces: Vec::new(),
        }],
    })
}

/// Subsystem `sub` of the config, on the target described by `base`, reached through `ports`
/// (IDs; None: every port): every device one of its
/// namespaces when `every_device` (the flags' form); else none yet (the config's are exported
/// once the reactors run: [`LiveTarget::export`]).
fn subsystem_of(
    sub: &SubsystemConfig,
    base: &SubsystemInfo,
    devices: &[Arc<dyn BlockDevice>],
    every_device: bool,
    ports: Option<Vec<u16>>,
) -> SubsystemInfo {
    let every = devices.iter().enumerate().filter(|_| every_device);
    let namespaces =
        every.map(|(i, d)| ExportedNamespace::of(i as u32 + 1, i, d.as_ref(), &sub.nqn));
    SubsystemInfo {
        serial: sub
            .serial
            .clone()
            .unwrap_or_else(|| usnvme_engine::fabric::export::serial_of(&sub.nqn)),
        model: sub.model.clone().unwrap_or_else(|| "usnvme".into()),
        allowed_hosts: sub.allowed_hosts(),
        ports,
        nqn: sub.nqn.clone(),
        namespaces: namespaces.collect(),
        ..base.clone()
    }
}

/// `--listen`: `ADDR:PORT` (NVMe/TCP), `tcp:ADDR:PORT` or `rdma:ADDR:PORT`.
pub fn parse_listen(s: &str) -> std::result::Result<(Transport, SocketAddr), String> {
    let (transport, address) = match s.split_once(':') {
        Some((t, rest)) if t.eq_ignore_ascii_case("rdma") => (Transport::Rdma, rest),
        Some((t, rest)) if t.eq_ignore_ascii_case("tcp") => (Transport::Tcp, rest),
        _ => (Transport::Tcp, s),
    };
    let address = address.parse().map_err(|_| {
        format!("{s:?} is not [rdma:]ADDR:PORT (examples: 127.0.0.1:4420, rdma:192.0.2.1:4420, [::1]:4420)")
    })?;
    Ok((transport, address))
}

/// A port's socket: a TCP listener, or the RDMA CM listening.
pub enum PortSocket {
    Tcp(TcpListener),
    Rdma(RdmaListener),
}

/// A listener on `address` over `transport`, port `port_id`; a port in use (or, for RDMA, an
/// address of no RDMA device) is refused by name.
fn listen(
    transport: Transport,
    address: SocketAddr,
    port_id: u16,
) -> Result<(PortSocket, Listener)> {
    if transport == Transport::Rdma {
        let l = RdmaListener::bind(address, port_id).map_err(|e| {
            usage(format!(
                "listen on rdma:{address}: cannot listen there: {e}"
            ))
        })?;
        let port = l.port().clone();
        return Ok((PortSocket::Rdma(l), port));
    }
    let l = TcpListener::bind(address)
        .map_err(|e| usage(format!("listen on {address}: cannot listen there: {e}")))?;
    l.set_nonblocking(true)?;
    let address = l.local_addr()?;
    Ok((
        PortSocket::Tcp(l),
        Listener {
            address,
            port_id,
            transport: Transport::Tcp,
        },
    ))
}

/// Warns of subsystems no host can reach, or any host can, beyond this machine.
fn warn_of_open_doors(subsystems: &Subsystems, listeners: &[(PortSocket, Listener)]) {
    let loopback_only = listeners.iter().all(|(_, l)| l.address.ip().is_loopback());
    if loopback_only {
        return;
    }
    for sub in &subsystems.list {
        match &sub.allowed_hosts {
            Some(hosts) if hosts.is_empty() => eprintln!(
                "usnvme: warning: {}: listening beyond this machine with no --allow-host: no host can connect",
                sub.nqn
            ),
            None => eprintln!(
                "usnvme: warning: {}: listening beyond this machine and any host may connect",
                sub.nqn
            ),
            Some(_) => {}
        }
    }
}

/// Takes the hosts knocking on `listeners`, each connection to the next reactor; whether any
/// came.
fn accept_hosts(
    listeners: &[(PortSocket, Listener)],
    inboxes: &[Inbox],
    counters: &Counters,
    next: &mut usize,
    max_connections: u64,
    max_entries: u16,
) -> bool {
    let mut accepted = false;
    for (socket, listener) in listeners {
        let l = match socket {
            PortSocket::Tcp(l) => l,
            PortSocket::Rdma(r) => {
                accepted |= r.accept(max_entries, inboxes, next);
                continue;
            }
        };
        match l.accept() {
            Ok((stream, peer)) => {
                accepted = true;
                // open, and accepted but not yet taken by a reactor
                let open = counters.connections.load(Ordering::Relaxed)
                    + inboxes.iter().map(|s| s.len() as u64).sum::<u64>();
                if open >= max_connections {
                    log::warn!(
                        "{peer}: refused: {open} connections are open (--max-connections {max_connections})"
                    );
                    drop(stream);
                    continue;
                }
                log::info!("{peer}: connected");
                inboxes[*next % inboxes.len()].send(Incoming {
                    stream,
                    peer: peer.to_string(),
                    port_id: listener.port_id,
                });
                *next += 1;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => log::warn!(
                "accepting on {}: {e}",
                l.local_addr()
                    .map_or_else(|_| "?".into(), |a| a.to_string())
            ),
        }
    }
    accepted
}

/// SIGHUP: reads `--config` again and applies what changed; a config that cannot be read or
/// applied is logged, and the target runs on as it was (the changes made before the failure
/// stand).
fn reload(config: Option<&std::path::Path>, operator: &control::Operator, reloads: &Reloads) {
    let Some(path) = config else {
        log::warn!("SIGHUP: serve was started without --config: nothing to read again");
        return;
    };
    let applied = TargetConfig::read(path).and_then(|new| operator.apply_config(&new));
    let counter = if applied.is_ok() {
        &reloads.applied
    } else {
        &reloads.failed
    };
    counter.fetch_add(1, Ordering::Relaxed);
    match applied {
        Ok(changes) if changes.is_empty() => {
            log::info!("SIGHUP: {}: nothing changed", path.display())
        }
        Ok(changes) => {
            for change in changes {
                log::info!("SIGHUP: {change}");
            }
        }
        Err(e) => log::error!("SIGHUP: {e}; the target runs on"),
    }
}

/// SIGHUPs taken: configs applied, and those that could not be read or applied (the status
/// says both).
#[derive(Debug, Default)]
struct Reloads {
    applied: std::sync::atomic::AtomicU64,
    failed: std::sync::atomic::AtomicU64,
}

/// `path` with `suffix` added to its name (`status.json` → `status.json.tmp`: two files of one
/// folder never share it, as they would with the extension replaced).
pub fn beside(path: &std::path::Path, suffix: &str) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    name.into()
}

/// Tells systemd (Type=notify) that the target is ready, when it runs under it.
fn notify_ready() {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    // "@name": an abstract socket
    let bytes = path.as_bytes();
    let sent = match bytes.strip_prefix(b"@") {
        Some(name) => SocketAddr::from_abstract_name(name),
        None => SocketAddr::from_pathname(&path),
    }
    .and_then(|address| UnixDatagram::unbound()?.send_to_addr(b"READY=1", &address));
    if let Err(e) = sent {
        log::warn!("cannot tell systemd the target is ready ({e})");
    }
}

/// The `--ana-state-file` as last applied (its modification time).
#[derive(Debug, Default)]
struct AnaFile {
    seen: Option<std::time::SystemTime>,
}

impl AnaFile {
    /// Reads `path` if it changed since the last time and puts each port named in its state;
    /// a bad line is logged with what is wrong and changes nothing.
    fn apply(&mut self, path: &std::path::Path, listeners: &[Listener], registry: &Registry) {
        let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        if modified.is_none() || modified == self.seen {
            return;
        }
        self.seen = modified;
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) => {
                log::warn!("--ana-state-file {}: {e}", path.display());
                return;
            }
        };
        for line in text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            match parse_ana_line(line, listeners) {
                Ok((port, state)) => {
                    if registry.set_ana_state(port.port_id, None, state) {
                        log::info!("{}: ANA state {}", port.address, state.name());
                    }
                }
                Err(e) => log::warn!("--ana-state-file {}: {line:?}: {e}", path.display()),
            }
        }
    }
}

/// `ADDR:PORT STATE`: the listener and its new state.
fn parse_ana_line<'a>(
    line: &str,
    listeners: &'a [Listener],
) -> std::result::Result<(&'a Listener, AnaState), String> {
    let (addr, state) = line
        .split_once(char::is_whitespace)
        .ok_or("expected ADDR:PORT STATE, e.g. 127.0.0.1:4421 inaccessible")?;
    let addr: SocketAddr = addr
        .parse()
        .map_err(|_| format!("{addr:?} is not an ADDR:PORT"))?;
    let port = listeners
        .iter()
        .find(|l| l.address == addr)
        .ok_or_else(|| format!("{addr} is not a --listen address"))?;
    Ok((port, state.trim().parse()?))
}

/// The default listener.
const DEFAULT_LISTEN: &str = "127.0.0.1:4420";

/// The ports (listeners) as the target describes them.
fn ports(listeners: &[(PortSocket, Listener)]) -> Vec<Listener> {
    listeners.iter().map(|(_, l)| l.clone()).collect()
}

/// The listeners' descriptors to wait on (copies: the list may change while the wait goes on).
fn listener_fds(listeners: &[(PortSocket, Listener)]) -> Vec<std::os::fd::OwnedFd> {
    use std::os::fd::AsFd;
    listeners
        .iter()
        .filter_map(|(s, _)| match s {
            PortSocket::Tcp(l) => l.as_fd().try_clone_to_owned().ok(),
            PortSocket::Rdma(r) => r.as_fd().try_clone_to_owned().ok(),
        })
        .collect()
}

/// Waits until a listener has a host knocking, at most `at_most` (a signal ends the wait at
/// once).
fn wait_for_hosts(listeners: &[std::os::fd::OwnedFd], at_most: Duration) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let mut fds: Vec<PollFd> = listeners
        .iter()
        .map(|l| PollFd::new(l.as_fd(), PollFlags::POLLIN))
        .collect();
    let ms = at_most.as_millis().clamp(1, 1000) as u16;
    let _ = poll(&mut fds, PollTimeout::from(ms));
}

/// CPU time (user and system) this process used so far.
fn process_cpu_seconds() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_SELF).map_or(0.0, |u| {
        let s = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
        s(u.user_time()) + s(u.system_time())
    })
}

fn status_json(
    live: &LiveTarget,
    listeners: &[(PortSocket, Listener)],
    counters: &Counters,
    registry: &Registry,
    smart: &SmartService,
) -> serde_json::Value {
    let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    let subsystems = live.subsystems();
    let subsystem_json = |s: &SubsystemInfo| {
        serde_json::json!({
            "nqn": s.nqn, "serial": s.serial, "model": s.model,
            "allowed_hosts": s.allowed_hosts, "port_ids": s.ports,
            "namespaces": s.namespaces.iter().map(|n| serde_json::json!({
                "nsid": n.nsid, "device": n.name, "block_size": n.block_size, "blocks": n.blocks,
                "uuid": config::uuid_text(&n.uuid),
                "nguid": config::nguid_text(&n.nguid),
                "ana_group": n.ana_group,
            })).collect::<Vec<_>>(),
        })
    };
    let first = subsystems.list.first().map(|s| subsystem_json(s));
    let first = first.unwrap_or_else(|| serde_json::json!({}));
    serde_json::json!({
        // the first subsystem's, as before there were several
        "subsystem": first["nqn"],
        "namespaces": first["namespaces"],
        "allowed_hosts": first["allowed_hosts"],
        "subsystems": subsystems.list.iter().map(|s| subsystem_json(s)).collect::<Vec<_>>(),
        "devices": live.devices().iter().map(|d| serde_json::json!({
            "name": d.name, "bytes": d.bytes, "present": d.present,
            "exported_as": d.exported_as.as_ref().map(|(nqn, nsid)| serde_json::json!({"nqn": nqn, "nsid": nsid})),
        })).collect::<Vec<_>>(),
        // (as --listen takes them: NVMe/RDMA's named)
        "listeners": listeners.iter().map(|(_, l)| match l.transport {
            Transport::Tcp => l.address.to_string(),
            Transport::Rdma => format!("rdma:{}", l.address),
        }).collect::<Vec<_>>(),
        "ana_states": listeners.iter().map(|(_, l)| (l.address.to_string(),
            serde_json::json!(registry.ana_state(l.port_id, 1).name()))).collect::<serde_json::Map<_, _>>(),
        "connections": load(&counters.connections),
        "controllers": registry.live(),
        "controllers_created": registry.created(),
        "commands": load(&counters.commands),
        "bytes_sent": load(&counters.bytes),
        "buffers_in_use": load(&counters.buffers_in_use),
        "commands_waited": load(&counters.commands_waited),
        "data_copied": load(&counters.data_copied),
        "smart_reads_pending": smart.pending(),
        // summed over the reactors; busy: in turns that did work (the rest is polling)
        "reactor_seconds": load(&counters.reactor_ns) as f64 / 1e9,
        "reactor_busy_seconds": load(&counters.reactor_busy_ns) as f64 / 1e9,
        // CPU time the reactor threads used, and the whole process (both user and system)
        "reactor_cpu_seconds": load(&counters.reactor_cpu_ns) as f64 / 1e9,
        "process_cpu_seconds": process_cpu_seconds(),
    })
}

/// Replaces `path` whole (a reader never sees half a document).
fn write_status(path: &std::path::Path, status: &serde_json::Value) -> Result<()> {
    let tmp = beside(path, ".tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(status)? + "\n")
        .and_then(|()| std::fs::rename(&tmp, path))
        .with_context(|| format!("--json-status {}: cannot write it", path.display()))
}

/// How a namespace formatted with protection information is exported: NVMe/TCP carries no
/// metadata to the Linux host, so the drive inserts the PI on writes and checks and strips it
/// on reads (PRACT=1), checking the guard and the reference tag; the host sees plain blocks.
const EXPORTED_PI: PiMode = PiMode {
    action: true,
    checks: PiChecks {
        guard: true,
        app_tag: false,
        ref_tag: true,
    },
    app_tag: 0,
};

/// The namespaces that can be exported: those whose metadata, if any, the drive inserts and
/// strips; the others (metadata that would have to travel) are left out by name.
fn exportable(namespaces: Vec<Arc<dyn BlockDevice>>) -> Vec<Arc<dyn BlockDevice>> {
    let exported = |d: &Arc<dyn BlockDevice>| match not_exportable(d.as_ref()) {
        Some(why) => {
            eprintln!("usnvme: warning: {why}");
            false
        }
        None => true,
    };
    namespaces.into_iter().filter(exported).collect()
}

/// Why `device` cannot be exported, if it cannot: metadata that would travel with its data.
fn not_exportable(device: &dyn BlockDevice) -> Option<String> {
    let info = device.info();
    let block = u64::from(info.block_size);
    let metadata = info.buffer_bytes(block) - block;
    (metadata > 0).then(|| format!("{}: not exported: its metadata ({metadata} bytes per block) would have to travel with the data, which NVMe/TCP does not carry to the host; format it without metadata, or with protection information alone", info.name))
}

/// What the target serves, ending with the line `hosts: …` (scripts and tests wait for it:
/// the target is ready).
fn print_exports(
    out: &mut dyn Write,
    subsystems: &Subsystems,
    listeners: &[(PortSocket, Listener)],
    control: Option<&std::path::Path>,
) -> Result<()> {
    for s in &subsystems.list {
        writeln!(out, "subsystem {}", s.nqn)?;
        for ns in &s.namespaces {
            writeln!(out, "  {}", namespace_line(ns))?;
        }
        if subsystems.list.len() > 1 {
            writeln!(out, "  hosts: {}", hosts_text(s.allowed_hosts.as_deref()))?;
        }
    }
    for (_, l) in listeners {
        writeln!(
            out,
            "listening on {} ({}), discovery on the same port",
            l.address,
            l.transport.scheme()
        )?;
    }
    if let Some(path) = control {
        writeln!(out, "control socket {} (usnvme target)", path.display())?;
    }
    match subsystems.list.as_slice() {
        [] => writeln!(
            out,
            "hosts: none yet (no subsystem: add one with `usnvme target subsystem add`)"
        )?,
        [one] => writeln!(out, "hosts: {}", hosts_text(one.allowed_hosts.as_deref()))?,
        _ => writeln!(out, "hosts: each subsystem's, as above")?,
    }
    out.flush()?;
    Ok(())
}

fn hosts_text(allowed: Option<&[String]>) -> String {
    match allowed {
        None => "any".into(),
        Some([]) => "none allowed (give --allow-host or --allow-any-host)".into(),
        Some(hosts) => hosts.join(", "),
    }
}

/// `namespace N: DEVICE (… blocks of … bytes, … GiB), uuid U`.
fn namespace_line(ns: &ExportedNamespace) -> String {
    format!(
        "namespace {}: {} ({} blocks of {} bytes, {:.1} GiB), uuid {}",
        ns.nsid,
        ns.name,
        ns.blocks,
        ns.block_size,
        (ns.blocks * u64::from(ns.block_size)) as f64 / (1u64 << 30) as f64,
        config::uuid_text(&ns.uuid)
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn two_status_files_of_one_folder_are_written_through_two_temporary_files() {
        let (a, b) = (
            std::path::Path::new("/tmp/status.json-1"),
            std::path::Path::new("/tmp/status.json-2"),
        );
        assert_eq!(
            super::beside(a, ".tmp"),
            std::path::Path::new("/tmp/status.json-1.tmp")
        );
        assert_ne!(super::beside(a, ".tmp"), super::beside(b, ".tmp"));
    }
}

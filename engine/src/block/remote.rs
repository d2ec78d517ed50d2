//! A remote NVMe/TCP subsystem attached for I/O: its controller enabled and identified over
//! the admin queue, as many I/O queues asked for as the run needs, its namespaces as block
//! devices ([`NamespaceDevice`]s on its [`RemoteQueues`]: each reactor connects one I/O queue
//! to it, which the namespaces share), and a keep-alive thread when a KATO was asked for.
//!
//! The admin queue is blocking and belongs to this module: after attaching, only the
//! controller thread uses it. It sends the Keep Alives (when a KATO was asked for) and
//! reconnects, as Linux's host does: when a Keep Alive fails or an I/O queue's connection
//! ends, the association is down ([`ControllerLink`]); every `reconnect_delay` the thread
//! connects a new admin queue, enables and identifies the controller (its namespaces must be
//! those it had), and the I/O queues connect to it and send again what they had not finished.
//! After `ctrl_loss_tmo` it gives up: the I/Os fail as from a removed drive, and the reason
//! is reported. The controller is shut down (CC.SHN) when the last of its devices goes.

use std::fmt;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use usnvme_driver::spec::identify::CTRATT_TBKAS;

use crate::block::{BlockDevice, DmaTarget, NamespaceDevice};
use crate::fabric::address::TcpAddress;
use crate::transport::tcp::initiator::HostOptions;
use crate::transport::tcp::link::{LinkState, Wake};
use crate::transport::tcp::queues::RemotePath;
use crate::transport::{ControllerLink, QueueIds, QueueNamespace, ReconnectPolicy, RemoteQueues};
use crate::transport::{RemoteController, RemoteError};

/// How often the ANA state of a controller that reports it is read.
const ANA_PERIOD: Duration = Duration::from_secs(1);

/// A remote subsystem, attached: what its controllers said, and its namespaces.
#[derive(Debug)]
pub struct RemoteSubsystem {
    address: TcpAddress,
    /// How to reach its I/O queues.
    queues: RemoteQueues,
    /// Its active namespaces.
    namespaces: Vec<QueueNamespace>,
    /// The most commands in flight on one of its I/O queues (CAP.MQES).
    max_depth: u32,
    controllers: Arc<Vec<ControllerThread>>,
}

/// The thread that keeps a controller alive and reconnects it; dropping this stops the
/// thread, which shuts the controller down.
struct ControllerThread {
    link: Arc<ControllerLink>,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for ControllerThread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControllerThread").finish_non_exhaustive()
    }
}

impl Drop for ControllerThread {
    fn drop(&mut self) {
        self.link.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One controller, enabled and identified.
struct Attached {
    ctrl: RemoteController,
    granted: u16,
    namespaces: Vec<QueueNamespace>,
    max_transfer: u32,
    in_capsule: u32,
    mqes: u16,
    /// It reports ANA (CMIC bit 3): its state is read, and read again every period.
    ana: bool,
    /// Its Keep Alive timer is traffic based (CTRATT.TBKAS): completed I/O keeps the
    /// association alive, and a Keep Alive is sent only in a period without any.
    traffic_keeps_alive: bool,
}

impl Attached {
    fn new(address: &TcpAddress, host: &HostOptions, io_queues: u16) -> Result<Self, RemoteError> {
        let subnqn = address.subnqn.clone().unwrap_or_default();
        let mut ctrl = RemoteController::connect(address.addr, &subnqn, host)?;
        let id = ctrl.identify_controller()?;
        let granted = ctrl.set_io_queues(io_queues)?;
        let namespaces: Vec<QueueNamespace> = ctrl
            .namespaces(id.nn)?
            .iter()
            .map(|ns| QueueNamespace::plain(ns.nsid, ns.block_size, ns.blocks))
            .collect();
        let cap = ctrl.cap();
        let max_transfer = usnvme_driver::bringup::max_transfer(cap, &id) as u32;
        if host.kato_ms > 0 {
            // a Keep Alive not answered within KATO: the association is down
            ctrl.set_command_timeout(Duration::from_millis(u64::from(host.kato_ms)));
        }
        Ok(Attached {
            ctrl,
            granted,
            namespaces,
            max_transfer,
            // IOCCSZ counts 16-byte units, the 64-byte command included
            in_capsule: (id.ioccsz.saturating_mul(16)).saturating_sub(64),
            mqes: cap.mqes(),
            ana: id.cmic & 8 != 0,
            traffic_keeps_alive: id.ctratt & CTRATT_TBKAS != 0,
        })
    }
}

impl RemoteSubsystem {
    /// Connects to the subsystem at `address` (which names its NQN): see
    /// [`RemoteSubsystem::attach_paths`].
    pub fn attach(
        address: &TcpAddress,
        host: &HostOptions,
        policy: ReconnectPolicy,
        io_queues: u16,
        dma: DmaTarget,
    ) -> Result<RemoteSubsystem, RemoteError> {
        Self::attach_paths(std::slice::from_ref(address), host, policy, io_queues, dma)
    }

    /// Connects to the subsystem at each of `paths` (addresses of one subsystem NQN): enables
    /// and identifies a controller on each (their namespaces must be the same) and asks each
    /// for `io_queues` I/O queues. `host.kato_ms` above 0 sends a Keep Alive every third of
    /// it; a lost association is made again as `policy` says. I/O buffers come from `dma`.
    pub fn attach_paths(
        paths: &[TcpAddress],
        host: &HostOptions,
        policy: ReconnectPolicy,
        io_queues: u16,
        dma: DmaTarget,
    ) -> Result<RemoteSubsystem, RemoteError> {
        let Some(address) = paths.first() else {
            return Err(RemoteError::Malformed {
                during: "attach",
                what: "no address",
            });
        };
        if paths.iter().any(|p| p.transport != address.transport) {
            return Err(RemoteError::Malformed {
                during: "attach",
                what: "the paths of one subsystem are all over one transport (TCP or RDMA)",
            });
        }
        let host = &HostOptions {
            transport: address.transport,
            ..host.clone()
        };
        let subnqn = address.subnqn.clone().unwrap_or_default();
        let mut attached = Vec::with_capacity(paths.len());
        for path in paths {
            let a = Attached::new(path, host, io_queues)?;
            if attached
                .first()
                .is_some_and(|first: &Attached| first.namespaces != a.namespaces)
            {
                return Err(RemoteError::Malformed {
                    during: "attach",
                    what: "two addresses of one subsystem NQN show different namespaces: \
                           they are not two paths to one subsystem",
                });
            }
            attached.push(a);
        }
        let namespaces = attached[0].namespaces.clone();
        let mut remote_paths = Vec::with_capacity(attached.len());
        let mut controllers = Vec::with_capacity(attached.len());
        for (a, path) in attached.iter_mut().zip(paths) {
            let link = Arc::new(ControllerLink::new(path.to_string(), a.ctrl.cntlid()));
            if a.ana {
                link.set_ana(a.ctrl.ana_state()?);
            }
            remote_paths.push(RemotePath {
                addr: path.addr,
                qids: Arc::new(QueueIds::new(a.granted)),
                link: link.clone(),
            });
        }
        let queues = RemoteQueues {
            name: address.to_string(),
            subnqn: subnqn.clone(),
            host: HostOptions {
                kato_ms: 0,
                ..host.clone()
            },
            in_capsule: attached.iter().map(|a| a.in_capsule).min().unwrap_or(0),
            max_transfer: attached.iter().map(|a| a.max_transfer).min().unwrap_or(0),
            max_entries: attached
                .iter()
                .map(|a| a.mqes.saturating_add(1))
                .min()
                .unwrap_or(2),
            namespaces: 1, // set to those the run uses by `devices`
            dma,
            paths: remote_paths,
        };
        let max_depth = attached
            .iter()
            .map(|a| u32::from(a.mqes))
            .min()
            .unwrap_or(0);
        for ((a, path), rp) in attached.into_iter().zip(paths).zip(&queues.paths) {
            let again = Reconnect {
                address: path.clone(),
                host: host.clone(),
                policy,
                io_queues,
                granted: a.granted,
                namespaces: namespaces.clone(),
                ana: a.ana,
                traffic_keeps_alive: a.traffic_keeps_alive,
                link: rp.link.clone(),
            };
            let ctrl = a.ctrl;
            let thread = std::thread::Builder::new()
                .name("usnvme-controller".into())
                .spawn(move || again.run(ctrl))
                .map_err(RemoteError::Thread)?;
            controllers.push(ControllerThread {
                link: rp.link.clone(),
                thread: Some(thread),
            });
        }
        Ok(RemoteSubsystem {
            address: address.clone(),
            queues,
            namespaces,
            max_depth,
            controllers: Arc::new(controllers),
        })
    }

    pub fn address(&self) -> &TcpAddress {
        &self.address
    }

    /// The most I/Os one queue can have in flight (CAP.MQES).
    pub fn max_depth(&self) -> u32 {
        self.max_depth
    }

    /// Its controllers' associations (one per path): for [`ControllerLink::stop_reconnecting`].
    pub fn links(&self) -> Vec<Arc<ControllerLink>> {
        self.queues.paths.iter().map(|p| p.link.clone()).collect()
    }

    /// The active namespace IDs.
    pub fn nsids(&self) -> Vec<u32> {
        self.namespaces.iter().map(|ns| ns.nsid).collect()
    }

    /// Its namespaces (only `nsid`, when given) as block devices; each keeps the controller.
    /// `None` when it has no namespace `nsid`.
    pub fn devices(&self, nsid: Option<u32>) -> Option<Vec<Arc<dyn BlockDevice>>> {
        let chosen: Vec<QueueNamespace> = self
            .namespaces
            .iter()
            .filter(|ns| nsid.is_none_or(|wanted| wanted == ns.nsid))
            .copied()
            .collect();
        // a reactor's queue to the controller holds commands for each of them
        let queues = Arc::new(RemoteQueues {
            namespaces: chosen.len().min(usize::from(u16::MAX)) as u16,
            ..self.queues.clone()
        });
        let single = self.namespaces.len() == 1;
        let devices: Vec<Arc<dyn BlockDevice>> = chosen
            .into_iter()
            .map(|ns| {
                let name = if single {
                    self.address.to_string()
                } else {
                    format!("{}/ns{}", self.address, ns.nsid)
                };
                let keep: Box<dyn fmt::Debug + Send + Sync> = Box::new(self.controllers.clone());
                let device = NamespaceDevice::remote(name, queues.clone(), ns, Some(keep));
                Arc::new(device) as Arc<dyn BlockDevice>
            })
            .collect();
        (nsid.is_none() || !devices.is_empty()).then_some(devices)
    }
}

/// What the controller thread needs to make the association again.
struct Reconnect {
    /// The path's address (which names the subsystem).
    address: TcpAddress,
    host: HostOptions,
    policy: ReconnectPolicy,
    io_queues: u16,
    /// The I/O queues the first association granted (the queues' IDs).
    granted: u16,
    /// The namespaces the devices were made of: a new association must have them unchanged.
    namespaces: Vec<QueueNamespace>,
    /// The controller reports ANA: its state is read again every period.
    ana: bool,
    /// Its Keep Alive timer is traffic based: no Keep Alive after a period with I/O.
    traffic_keeps_alive: bool,
    link: Arc<ControllerLink>,
}

impl Reconnect {
    /// The controller thread: a Keep Alive every third of the KATO (if any); when the
    /// association goes down, reconnects; stops when told, shutting the controller down.
    fn run(self, ctrl: RemoteController) {
        // a Keep Alive every third of the KATO; the ANA state read at least every second
        let keep_alive = (self.host.kato_ms > 0)
            .then(|| Duration::from_millis(u64::from(self.host.kato_ms) / 3))
            .map(|p| p.max(Duration::from_millis(10)));
        let period = match (keep_alive, self.ana) {
            (Some(p), true) => Some(p.min(ANA_PERIOD)),
            (None, true) => Some(ANA_PERIOD),
            (p, false) => p,
        };
        let mut ctrl = Some(ctrl);
        loop {
            match self.link.wait(period) {
                Wake::Stop => return, // `ctrl` is shut down as it drops
                Wake::Period => {
                    let Some(c) = ctrl.as_mut() else { continue };
                    // the admin queue's failure, named by what failed
                    let ana = match self.ana {
                        true => c
                            .ana_state()
                            .map(Some)
                            .map_err(|e| format!("ANA log read: {e}")),
                        false => Ok(None),
                    };
                    let checked = ana.and_then(|state| {
                        if let Some(state) = state.filter(|s| self.link.set_ana(*s)) {
                            log::info!("{}: ANA state {state:?}", self.address);
                        }
                        // (the flag is taken every period, so that an idle one sends)
                        let io_flowed = self.link.take_traffic();
                        if self.host.kato_ms == 0 || (self.traffic_keeps_alive && io_flowed) {
                            return Ok(());
                        }
                        c.keep_alive().map_err(|e| format!("Keep Alive: {e}"))
                    });
                    if let Err(e) = checked {
                        let why = format!("keep-alive lost ({e})");
                        log::error!("{}: {why}", self.address);
                        self.link.report_down(self.link.generation(), &why);
                    }
                }
                Wake::Down => {
                    if let Some(old) = ctrl.take() {
                        old.abandon();
                    }
                    match self.again() {
                        Some(new) => ctrl = Some(new),
                        None => return,
                    }
                }
            }
        }
    }

    /// Attempts the association every `reconnect_delay` until one succeeds (then the queues
    /// follow), the policy's attempts are spent (then it gives up), or stop.
    fn again(&self) -> Option<RemoteController> {
        let LinkState::Down { why, .. } = self.link.state() else {
            return None;
        };
        let mut tried = 0;
        loop {
            if self.policy.attempts().is_some_and(|most| tried >= most) {
                let why = match tried {
                    0 => why,
                    n => format!("{why}; no reconnect in {n} attempt(s)"),
                };
                log::error!("{}: {why}: giving up", self.address);
                self.link.give_up(why);
                return None;
            }
            if !self.link.sleep(self.policy.delay) {
                return None;
            }
            tried += 1;
            match self.connect() {
                Ok(mut ctrl) => {
                    if self.ana {
                        match ctrl.ana_state() {
                            Ok(state) => {
                                self.link.set_ana(state);
                            }
                            Err(e) => {
                                log::warn!("{}: reconnect attempt {tried}: {e}", self.address);
                                continue;
                            }
                        }
                    }
                    if !self.link.reconnected(ctrl.cntlid()) {
                        return None; // given up meanwhile: `ctrl` is shut down as it drops
                    }
                    log::info!(
                        "{}: reconnected (controller {}, attempt {tried})",
                        self.address,
                        ctrl.cntlid()
                    );
                    return Some(ctrl);
                }
                Err(e) => log::warn!("{}: reconnect attempt {tried}: {e}", self.address),
            }
        }
    }

    /// A new admin queue, the controller enabled, as many I/O queues as before, the same
    /// namespaces.
    fn connect(&self) -> Result<RemoteController, String> {
        let a =
            Attached::new(&self.address, &self.host, self.io_queues).map_err(|e| e.to_string())?;
        if a.granted < self.granted {
            return Err(format!(
                "it grants {} I/O queues, {} before",
                a.granted, self.granted
            ));
        }
        for before in &self.namespaces {
            let nsid = before.nsid;
            match a.namespaces.iter().find(|now| now.nsid == nsid) {
                None => return Err(format!("namespace {nsid} is gone")),
                Some(now) if now != before => {
                    return Err(format!(
                        "namespace {nsid} changed: {} blocks of {} bytes, {} of {} before",
                        now.blocks, now.block_size, before.blocks, before.block_size
                    ))
                }
                Some(_) => {}
            }
        }
        Ok(a.ctrl)
    }
}

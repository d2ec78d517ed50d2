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
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::address::TcpAddress;
use super::initiator::HostOptions;
use crate::block::{BlockDevice, DmaTarget, NamespaceDevice};
use crate::transport::tcp::link::{LinkState, Wake};
use crate::transport::{ControllerLink, QueueIds, ReconnectPolicy, RemoteQueues};
use crate::transport::{RemoteController, RemoteError};

/// The largest transfer when the controller sets no limit (MDTS 0): I/Os beyond it are split.
const NO_LIMIT_TRANSFER: u32 = 1 << 20;

/// A remote subsystem, attached: what its controller said, and its namespaces.
#[derive(Debug)]
pub struct RemoteSubsystem {
    address: TcpAddress,
    /// How to reach its I/O queues.
    queues: RemoteQueues,
    /// Its active namespaces: NSID, block size, blocks.
    namespaces: Vec<(u32, u32, u64)>,
    /// The most commands in flight on one of its I/O queues (CAP.MQES).
    max_depth: u32,
    controller: Arc<ControllerThread>,
}

/// The thread that keeps the controller alive and reconnects it; dropping this stops the
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

impl RemoteSubsystem {
    /// Connects to the subsystem at `address` (which names its NQN), enables and identifies
    /// its controller and asks for `io_queues` I/O queues. `host.kato_ms` above 0 sends a
    /// Keep Alive every third of it; a lost association is made again as `policy` says. I/O
    /// buffers come from `dma`.
    pub fn attach(
        address: &TcpAddress,
        host: &HostOptions,
        policy: ReconnectPolicy,
        io_queues: u16,
        dma: DmaTarget,
    ) -> Result<RemoteSubsystem, RemoteError> {
        let subnqn = address.subnqn.clone().unwrap_or_default();
        let mut ctrl = RemoteController::connect(address.addr, &subnqn, host)?;
        let id = ctrl.identify_controller()?;
        let granted = ctrl.set_io_queues(io_queues)?;
        let namespaces: Vec<(u32, u32, u64)> = ctrl
            .namespaces(id.nn)?
            .iter()
            .map(|ns| (ns.nsid, ns.block_size, ns.blocks))
            .collect();
        let cap = ctrl.cap();
        // MDTS: a power of two of the smallest memory page (CAP.MPSMIN)
        let page = 4096u64 << cap.mpsmin();
        let max_transfer = match id.mdts {
            0 => NO_LIMIT_TRANSFER,
            m => (page << m.min(20)).min(u64::from(NO_LIMIT_TRANSFER)) as u32,
        };
        // IOCCSZ counts 16-byte units, the 64-byte command included
        let in_capsule = (id.ioccsz.saturating_mul(16)).saturating_sub(64);
        let link = Arc::new(ControllerLink::new(ctrl.cntlid()));
        let queues = RemoteQueues {
            name: address.to_string(),
            addr: address.addr,
            subnqn: subnqn.clone(),
            host: HostOptions {
                kato_ms: 0,
                ..host.clone()
            },
            in_capsule,
            max_transfer,
            max_entries: cap.mqes().saturating_add(1),
            qids: Arc::new(QueueIds::new(granted)),
            namespaces: 1, // set to those the run uses by `devices`
            link: link.clone(),
            dma,
        };
        if host.kato_ms > 0 {
            // a Keep Alive not answered within KATO: the association is down
            ctrl.set_command_timeout(Duration::from_millis(u64::from(host.kato_ms)));
        }
        let again = Reconnect {
            name: address.to_string(),
            addr: address.addr,
            subnqn,
            host: host.clone(),
            policy,
            io_queues,
            granted,
            namespaces: namespaces.clone(),
            link: link.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("usnvme-controller".into())
            .spawn(move || again.run(ctrl))
            .map_err(RemoteError::Thread)?;
        Ok(RemoteSubsystem {
            address: address.clone(),
            queues,
            namespaces,
            max_depth: u32::from(cap.mqes()),
            controller: Arc::new(ControllerThread {
                link,
                thread: Some(thread),
            }),
        })
    }

    pub fn address(&self) -> &TcpAddress {
        &self.address
    }

    /// The most I/Os one queue can have in flight (CAP.MQES).
    pub fn max_depth(&self) -> u32 {
        self.max_depth
    }

    /// The active namespace IDs.
    pub fn nsids(&self) -> Vec<u32> {
        self.namespaces.iter().map(|&(nsid, ..)| nsid).collect()
    }

    /// Its namespaces (only `nsid`, when given) as block devices; each keeps the controller.
    /// `None` when it has no namespace `nsid`.
    pub fn devices(&self, nsid: Option<u32>) -> Option<Vec<Arc<dyn BlockDevice>>> {
        let chosen: Vec<&(u32, u32, u64)> = self
            .namespaces
            .iter()
            .filter(|(n, ..)| nsid.is_none_or(|wanted| wanted == *n))
            .collect();
        // a reactor's queue to the controller holds commands for each of them
        let queues = Arc::new(RemoteQueues {
            namespaces: chosen.len().min(usize::from(u16::MAX)) as u16,
            ..self.queues.clone()
        });
        let single = self.namespaces.len() == 1;
        let devices: Vec<Arc<dyn BlockDevice>> = chosen
            .into_iter()
            .map(|&(nsid, block_size, blocks)| {
                let name = if single {
                    self.address.to_string()
                } else {
                    format!("{}/ns{nsid}", self.address)
                };
                let keep: Box<dyn fmt::Debug + Send + Sync> = Box::new(self.controller.clone());
                let device = NamespaceDevice::remote(
                    name,
                    queues.clone(),
                    nsid,
                    block_size,
                    blocks,
                    Some(keep),
                );
                Arc::new(device) as Arc<dyn BlockDevice>
            })
            .collect();
        (nsid.is_none() || !devices.is_empty()).then_some(devices)
    }
}

/// What the controller thread needs to make the association again.
struct Reconnect {
    name: String,
    addr: SocketAddr,
    subnqn: String,
    host: HostOptions,
    policy: ReconnectPolicy,
    io_queues: u16,
    /// The I/O queues the first association granted (the queues' IDs).
    granted: u16,
    /// The namespaces the devices were made of: a new association must have them unchanged.
    namespaces: Vec<(u32, u32, u64)>,
    link: Arc<ControllerLink>,
}

impl Reconnect {
    /// The controller thread: a Keep Alive every third of the KATO (if any); when the
    /// association goes down, reconnects; stops when told, shutting the controller down.
    fn run(self, ctrl: RemoteController) {
        let period = (self.host.kato_ms > 0)
            .then(|| Duration::from_millis(u64::from(self.host.kato_ms) / 3))
            .map(|p| p.max(Duration::from_millis(10)));
        let mut ctrl = Some(ctrl);
        loop {
            match self.link.wait(period) {
                Wake::Stop => return, // `ctrl` is shut down as it drops
                Wake::Period => {
                    if let Some(Err(e)) = ctrl.as_mut().map(|c| c.keep_alive()) {
                        let why = format!("keep-alive lost ({e})");
                        log::error!("{}: {why}", self.name);
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
                log::error!("{}: {why}: giving up", self.name);
                self.link.give_up(why);
                return None;
            }
            if !self.link.sleep(self.policy.delay) {
                return None;
            }
            tried += 1;
            match self.connect() {
                Ok(ctrl) => {
                    log::info!(
                        "{}: reconnected (controller {}, attempt {tried})",
                        self.name,
                        ctrl.cntlid()
                    );
                    self.link.reconnected(ctrl.cntlid());
                    return Some(ctrl);
                }
                Err(e) => log::warn!("{}: reconnect attempt {tried}: {e}", self.name),
            }
        }
    }

    /// A new admin queue, the controller enabled, as many I/O queues as before, the same
    /// namespaces.
    fn connect(&self) -> Result<RemoteController, String> {
        let mut ctrl = RemoteController::connect(self.addr, &self.subnqn, &self.host)
            .map_err(|e| e.to_string())?;
        let id = ctrl.identify_controller().map_err(|e| e.to_string())?;
        let granted = ctrl
            .set_io_queues(self.io_queues)
            .map_err(|e| e.to_string())?;
        if granted < self.granted {
            return Err(format!(
                "it grants {granted} I/O queues, {} before",
                self.granted
            ));
        }
        let now = ctrl.namespaces(id.nn).map_err(|e| e.to_string())?;
        for &(nsid, block_size, blocks) in &self.namespaces {
            match now.iter().find(|n| n.nsid == nsid) {
                None => return Err(format!("namespace {nsid} is gone")),
                Some(n) if (n.block_size, n.blocks) != (block_size, blocks) => {
                    return Err(format!(
                        "namespace {nsid} changed: {} blocks of {} bytes, {blocks} of \
                         {block_size} before",
                        n.blocks, n.block_size
                    ))
                }
                Some(_) => {}
            }
        }
        if self.host.kato_ms > 0 {
            ctrl.set_command_timeout(Duration::from_millis(u64::from(self.host.kato_ms)));
        }
        Ok(ctrl)
    }
}

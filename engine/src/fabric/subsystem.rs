//! A remote NVMe/TCP subsystem attached for I/O: its controller enabled and identified over
//! the admin queue, as many I/O queues asked for as the run needs, its namespaces as block
//! devices ([`NamespaceDevice`]s on its [`RemoteQueues`]: each reactor connects one I/O queue
//! to it, which the namespaces share), and a keep-alive thread when a KATO was asked for.
//!
//! The admin queue is blocking and belongs to this module: after attaching, only the
//! keep-alive thread uses it. When a Keep Alive fails, the controller is lost: every I/O queue
//! of it ends at its next poll (its I/Os fail as from a removed drive), and the reason is
//! reported. The controller is shut down (CC.SHN) when the last of its devices goes.

use std::fmt;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;

use super::address::TcpAddress;
use super::initiator::HostOptions;
use crate::block::{BlockDevice, DmaTarget, NamespaceDevice};
use crate::transport::{QueueIds, RemoteQueues};
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
    controller: Arc<KeptAlive>,
}

/// The controller, and the thread keeping it alive; dropping it stops the thread, then shuts
/// the controller down.
struct KeptAlive {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    /// Dropped last: the shutdown (CC.SHN) goes after the keep-alive thread ended.
    _controller: Arc<Mutex<RemoteController>>,
}

impl fmt::Debug for KeptAlive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeptAlive").finish_non_exhaustive()
    }
}

impl Drop for KeptAlive {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl RemoteSubsystem {
    /// Connects to the subsystem at `address` (which names its NQN), enables and identifies
    /// its controller and asks for `io_queues` I/O queues. `host.kato_ms` above 0 starts the
    /// keep-alive thread (a Keep Alive every third of it). I/O buffers come from `dma`.
    pub fn attach(
        address: &TcpAddress,
        host: &HostOptions,
        io_queues: u16,
        dma: DmaTarget,
    ) -> Result<RemoteSubsystem, RemoteError> {
        let subnqn = address.subnqn.clone().unwrap_or_default();
        let mut ctrl = RemoteController::connect(address.addr, &subnqn, host)?;
        let id = ctrl.identify_controller()?;
        let granted = ctrl.set_io_queues(io_queues)?;
        let namespaces = ctrl.namespaces(id.nn)?;
        let cap = ctrl.cap();
        // MDTS: a power of two of the smallest memory page (CAP.MPSMIN)
        let page = 4096u64 << cap.mpsmin();
        let max_transfer = match id.mdts {
            0 => NO_LIMIT_TRANSFER,
            m => (page << m.min(20)).min(u64::from(NO_LIMIT_TRANSFER)) as u32,
        };
        // IOCCSZ counts 16-byte units, the 64-byte command included
        let in_capsule = (id.ioccsz.saturating_mul(16)).saturating_sub(64);
        let lost = Arc::new(OnceLock::new());
        let queues = RemoteQueues {
            name: address.to_string(),
            addr: address.addr,
            subnqn: subnqn.clone(),
            cntlid: ctrl.cntlid(),
            host: HostOptions {
                kato_ms: 0,
                ..host.clone()
            },
            in_capsule,
            max_transfer,
            max_entries: cap.mqes().saturating_add(1),
            qids: Arc::new(QueueIds::new(granted)),
            namespaces: 1, // set to those the run uses by `devices`
            lost: lost.clone(),
            dma,
        };
        let namespaces = namespaces
            .iter()
            .map(|ns| (ns.nsid, ns.block_size, ns.blocks))
            .collect();
        let controller = Arc::new(Mutex::new(ctrl));
        let (stop, thread) = match host.kato_ms {
            0 => (None, None),
            kato => {
                // a Keep Alive not answered within KATO: the controller is lost
                controller
                    .lock()
                    .set_command_timeout(Duration::from_millis(u64::from(kato)));
                let (tx, rx) = mpsc::channel();
                let period =
                    Duration::from_millis(u64::from(kato) / 3).max(Duration::from_millis(10));
                let (c, name) = (controller.clone(), address.to_string());
                let thread = std::thread::Builder::new()
                    .name("usnvme-keepalive".into())
                    .spawn(move || keep_alive(&c, period, &rx, &lost, &name))
                    .map_err(RemoteError::Thread)?;
                (Some(tx), Some(thread))
            }
        };
        Ok(RemoteSubsystem {
            address: address.clone(),
            queues,
            namespaces,
            max_depth: u32::from(cap.mqes()),
            controller: Arc::new(KeptAlive {
                stop,
                thread,
                _controller: controller,
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

/// Sends a Keep Alive every `period` until told to stop; the first that fails marks the
/// controller `lost`, with why.
fn keep_alive(
    ctrl: &Mutex<RemoteController>,
    period: Duration,
    stop: &mpsc::Receiver<()>,
    lost: &OnceLock<String>,
    name: &str,
) {
    while let Err(RecvTimeoutError::Timeout) = stop.recv_timeout(period) {
        if let Err(e) = ctrl.lock().keep_alive() {
            let why = format!("keep-alive lost ({e})");
            log::error!("{name}: {why}");
            let _ = lost.set(why);
            return;
        }
    }
}

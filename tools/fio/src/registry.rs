//! The controllers of one fio process. fio runs each job (`thread=1`) on its own thread in one
//! process, and a drive on vfio-pci can be opened once per process: the jobs share each
//! controller, attached the first time a job names it, and each job makes its own I/O queues on
//! it ([`crate::job`]). The last job to finish shuts the controllers down.
//!
//! A remote subsystem is attached once per host identity and DMA space that jobs ask for it
//! with: jobs with other engine options (`hostnqn=`, digests, timeouts) get an association of
//! their own, and a job that mixes it with local drives one whose I/O buffers are in the local
//! drives' IOVA space (the transport reads and writes them through that space).

use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;
use usnvme_driver::pci::Sysfs;
use usnvme_driver::{Controller, ControllerOptions, DeviceSpec, Opener};
use usnvme_engine::block::remote::RemoteSubsystem;
use usnvme_engine::block::DmaTarget;
use usnvme_engine::fabric::address::TcpAddress;
use usnvme_engine::fabric::identity::host_identity_or;
use usnvme_engine::fabric::pdu::Digests;
use usnvme_engine::transport::tcp::HostOptions;
use usnvme_engine::transport::{DeviceName, ReconnectPolicy};
use usnvme_engine::{BlockDevice, NamespaceDevice};
use usnvme_hugepages::{IovaSpace, NoIommu, PageSize};

use crate::name::FileName;

/// I/O queues asked of a remote controller: one per job that uses it, as many as it grants.
const REMOTE_IO_QUEUES: u16 = 64;

static ATTACHED: Mutex<Option<Attached>> = Mutex::new(None);

/// A remote subsystem and its namespaces as block devices (made once: a job's namespaces of
/// one subsystem share its queue to it).
struct Remote {
    address: TcpAddress,
    host: RemoteHost,
    space: Arc<IovaSpace>,
    subsystem: RemoteSubsystem,
    devices: Vec<Arc<dyn BlockDevice>>,
}

/// How a job's remote subsystems are reached: the engine's options of the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteHost {
    /// Host NQN; `None`: this machine's (`/etc/nvme/hostnqn`, else one from the machine ID).
    pub nqn: Option<String>,
    pub digests: Digests,
    /// Keep Alive Timeout asked of the target; 0: none.
    pub keep_alive_tmo_s: u32,
    pub reconnect: ReconnectPolicy,
}

/// As Linux's host (and `usnvme perf`) has them: a 5 s Keep Alive, reconnects every 10 s for
/// 600 s.
impl Default for RemoteHost {
    fn default() -> Self {
        RemoteHost {
            nqn: None,
            digests: Digests::default(),
            keep_alive_tmo_s: 5,
            reconnect: ReconnectPolicy::default(),
        }
    }
}

impl RemoteHost {
    /// The transport's options: this host's identity, its digests and Keep Alive.
    fn options(&self) -> Result<HostOptions, String> {
        let (host_nqn, host_id) = host_identity_or(self.nqn.as_deref(), Path::new("/"))?;
        Ok(HostOptions {
            host_nqn,
            host_id,
            digests: self.digests,
            kato_ms: self.keep_alive_tmo_s.saturating_mul(1000),
            ..HostOptions::default()
        })
    }
}

/// What this process attached.
struct Attached {
    opener: Opener,
    sysfs: Sysfs,
    /// Local controllers; the index is the engine's drive number (queues are shared by it).
    local: Vec<(DeviceSpec, Controller)>,
    remote: Vec<Remote>,
    /// I/O buffers of jobs with remote subsystems only: ordinary memory, read and written only
    /// by the socket.
    remote_dma: DmaTarget,
    /// Jobs that opened files and have not finished.
    jobs: usize,
}

/// The block devices of a job's files (fio's names, in order), attaching what no job has yet;
/// counts the job in until [`release`]. Remote subsystems are reached as `host` says.
pub fn open(names: &[String], host: &RemoteHost) -> Result<Vec<Arc<dyn BlockDevice>>, String> {
    let files: Vec<FileName> = names.iter().map(|n| n.parse()).collect::<Result<_, _>>()?;
    let mut guard = ATTACHED.lock();
    let attached = guard.get_or_insert_with(|| Attached {
        opener: Opener::new("/sys"),
        sysfs: Sysfs::new(),
        local: Vec::new(),
        remote: Vec::new(),
        remote_dma: DmaTarget {
            space: IovaSpace::new(Arc::new(NoIommu)),
            page: PageSize::Small4K,
        },
        jobs: 0,
    });
    let dma = attached.attach(&files, host)?;
    let devices = files
        .iter()
        .zip(names)
        .map(|(f, name)| {
            attached
                .device(f, host, &dma.space)
                .map_err(|e| format!("{name}: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    attached.jobs += 1;
    Ok(devices)
}

/// A job that [`open`]ed its files finished: the last one shuts every controller down.
pub fn release() {
    let last = {
        let mut guard = ATTACHED.lock();
        match guard.as_mut() {
            Some(a) if a.jobs > 1 => {
                a.jobs -= 1;
                None
            }
            _ => guard.take(),
        }
    };
    // outside the lock: shutting controllers down waits on them
    drop(last);
}

impl Attached {
    /// Attaches the controllers of `files` not attached yet: local ones all at once, then
    /// remote ones in the DMA space of the job's first local drive (else memory of their
    /// own), which it returns.
    fn attach(&mut self, files: &[FileName], host: &RemoteHost) -> Result<DmaTarget, String> {
        let mut specs: Vec<DeviceSpec> = Vec::new();
        for f in files {
            if let DeviceName::Local(spec) = &f.controller {
                if !specs.contains(spec) && !self.local.iter().any(|(s, _)| s == spec) {
                    specs.push(spec.clone());
                }
            }
        }
        let options = ControllerOptions::default();
        for drive in usnvme_engine::attach(&self.opener, &self.sysfs, &specs, &options) {
            let drive = drive.map_err(|e| e.to_string())?;
            self.local.push((drive.spec, drive.controller));
        }
        let first_local = files.iter().find_map(|f| match &f.controller {
            DeviceName::Local(spec) => self.local.iter().find(|(s, _)| s == spec),
            DeviceName::Remote(_) => None,
        });
        let dma = match first_local {
            Some((_, controller)) => DmaTarget {
                space: controller.iova_space().clone(),
                page: controller.page_size(),
            },
            None => self.remote_dma.clone(),
        };
        for f in files {
            if let DeviceName::Remote(address) = &f.controller {
                if self.remote(address, host, &dma.space).is_none() {
                    let subsystem = RemoteSubsystem::attach(
                        address,
                        &host.options()?,
                        host.reconnect,
                        REMOTE_IO_QUEUES,
                        dma.clone(),
                    )
                    .map_err(|e| format!("{address}: {e}"))?;
                    let devices = subsystem.devices(None).unwrap_or_default();
                    self.remote.push(Remote {
                        address: address.clone(),
                        host: host.clone(),
                        space: dma.space.clone(),
                        subsystem,
                        devices,
                    });
                }
            }
        }
        Ok(dma)
    }

    /// Remote subsystem `address` as attached for `host` in `space`.
    fn remote(
        &self,
        address: &TcpAddress,
        host: &RemoteHost,
        space: &Arc<IovaSpace>,
    ) -> Option<&Remote> {
        self.remote
            .iter()
            .find(|r| r.address == *address && r.host == *host && Arc::ptr_eq(&r.space, space))
    }

    /// The namespace `file` names, on its attached controller (a remote one as attached for
    /// `host` in `space`).
    fn device(
        &self,
        file: &FileName,
        host: &RemoteHost,
        space: &Arc<IovaSpace>,
    ) -> Result<Arc<dyn BlockDevice>, String> {
        match &file.controller {
            DeviceName::Local(spec) => {
                let (drive, ctrl) = self
                    .local
                    .iter()
                    .enumerate()
                    .find_map(|(i, (s, c))| (s == spec).then_some((i, c)))
                    .ok_or_else(|| format!("{spec} is not attached"))?;
                let nsids: Vec<u32> = ctrl.namespaces().iter().map(|n| n.nsid).collect();
                let nsid = choose(file.nsid, &nsids)?;
                let device =
                    NamespaceDevice::new(ctrl.clone(), nsid, drive).map_err(|e| e.to_string())?;
                Ok(Arc::new(device))
            }
            DeviceName::Remote(address) => {
                let remote = self
                    .remote(address, host, space)
                    .ok_or_else(|| format!("{address} is not attached"))?;
                let nsids = remote.subsystem.nsids();
                let nsid = choose(file.nsid, &nsids)?;
                let index = nsids.iter().position(|&n| n == nsid);
                index
                    .and_then(|i| remote.devices.get(i).cloned())
                    .ok_or_else(|| format!("{address} has no namespace {nsid}"))
            }
        }
    }
}

/// The namespace a file means: the one named, which must exist, else the controller's only one.
fn choose(wanted: Option<u32>, nsids: &[u32]) -> Result<u32, String> {
    let list = || {
        nsids
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    match (wanted, nsids) {
        (_, []) => Err("the controller has no active namespace".into()),
        (Some(n), _) if nsids.contains(&n) => Ok(n),
        (Some(n), _) => Err(format!(
            "namespace {n} is not active (its namespaces: {})",
            list()
        )),
        (None, [one]) => Ok(*one),
        (None, _) => Err(format!(
            "the controller has namespaces {}: choose one with ' ns=N' after its name",
            list()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::choose;

    #[test]
    fn a_file_without_ns_means_the_only_namespace() {
        assert_eq!(choose(None, &[1]), Ok(1));
        assert_eq!(choose(Some(3), &[1, 3]), Ok(3));
        let several = choose(None, &[1, 2]).expect_err("ambiguous");
        assert!(several.contains("namespaces 1, 2: choose one"), "{several}");
        let absent = choose(Some(4), &[1, 2]).expect_err("absent");
        assert!(absent.contains("namespace 4 is not active"), "{absent}");
        assert!(choose(None, &[]).is_err());
    }
}

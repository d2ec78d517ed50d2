//! `perf --hotplug`: a drive bound to vfio-pci while the run goes on (a drive hot added, then
//! `usnvme setup bind`) joins it: brought up, its namespaces (or namespace `-n`) added to the
//! reactors of its NUMA node (every reactor where its node is unknown), each reactor working
//! on its share of the namespace's span (`--offset`, `--size`) from then on. Its rows in the
//! report count from when it joined. (A drive removed during the run is the engine's: its I/Os
//! fail and the run goes on with the others.)

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use super::workload::DeviceResult;
use super::*;
use crate::hotplug::{Binds, Bound};

/// The drives that joined the run, and the devices they added.
#[derive(Debug, Default)]
pub(super) struct Joined {
    /// Kept until the run is over (their queue pairs are in the reactors).
    controllers: Mutex<Vec<Controller>>,
    /// The names of the devices added, by device index from the session's count on.
    names: Mutex<Vec<String>>,
}

impl Joined {
    /// Every device's name: the session's, then those that joined.
    pub(super) fn names(&self, session: &[String]) -> Vec<String> {
        let mut names = session.to_vec();
        names.extend(self.names.lock().iter().cloned());
        names
    }
}

impl Session {
    /// Brings up drive `spec` and adds its namespaces to `run` (see [`Session::join_up`]).
    pub(super) fn join(
        &self,
        run: &Run<Vec<DeviceResult>>,
        spec: &DeviceSpec,
        joined: &Joined,
        added_spans: &Mutex<std::collections::HashMap<usize, Region>>,
    ) -> std::result::Result<(), String> {
        let controller = self
            .opener
            .open(spec, ControllerOptions::default())
            .map_err(|e| format!("cannot be brought up: {e}"))?
            .into_iter()
            .next()
            .ok_or("no controller")?;
        self.join_up(run, spec, controller, joined, added_spans)
    }

    /// Adds the namespaces of drive `spec`, brought up as `controller`, to `run`; what went
    /// wrong, if anything.
    pub(super) fn join_up(
        &self,
        run: &Run<Vec<DeviceResult>>,
        spec: &DeviceSpec,
        controller: Controller,
        joined: &Joined,
        added_spans: &Mutex<std::collections::HashMap<usize, Region>>,
    ) -> std::result::Result<(), String> {
        let drive_index = self.engine.drives().len() + joined.controllers.lock().len();
        joined.controllers.lock().push(controller.clone());
        let pi = self.settings.pi;
        let namespaces = match self.settings.namespace {
            None => usnvme_engine::drive_namespaces(drive_index, &controller, pi),
            Some(nsid) => {
                let ns = NamespaceDevice::with_pi(controller.clone(), nsid, drive_index, pi)
                    .map_err(|e| format!("-n {nsid}: {e}"))?;
                vec![Arc::new(ns) as Arc<dyn BlockDevice>]
            }
        };
        // the reactors' buffers are in the first device's DMA space: the drive must share it
        let like = self.devices.first().map(|d| d.dma().space);
        let node = match spec {
            DeviceSpec::Pci(addr) => Sysfs::new().device(*addr).ok().and_then(|d| d.numa_node),
            DeviceSpec::Sim(_) => None,
        };
        let reactors = run.reactors();
        let mut serving: Vec<usize> = (0..reactors.len())
            .filter(|&r| node.is_some() && reactors[r].node == node)
            .collect();
        if serving.is_empty() {
            serving = (0..reactors.len()).collect();
        }
        for device in namespaces {
            let name = device.info().name.clone();
            if like
                .as_ref()
                .is_some_and(|l| !Arc::ptr_eq(l, &device.dma().space))
            {
                return Err(format!(
                    "{name}: its DMA space is not the other devices' (simulated, remote and vfio-pci drives cannot join each other's runs)"
                ));
            }
            let span = spans(std::slice::from_ref(&device), &self.settings)
                .map_err(|e| format!("{e:#}"))?[0];
            let index = self.names.len() + joined.names.lock().len();
            added_spans.lock().insert(index, span);
            run.add_device(index, &device, std::slice::from_ref(&controller), &serving)?;
            joined.names.lock().push(name.clone());
            let cpus: Vec<String> = serving
                .iter()
                .map(|&r| reactors[r].cpu.to_string())
                .collect();
            eprintln!(
                "usnvme perf: {name} joined the run, on core(s) {}",
                cpus.join(",")
            );
        }
        Ok(())
    }
}

/// Watches the kernel's device events until `stop`: each NVMe controller bound to vfio-pci
/// that the run does not have joins it.
pub(super) fn watch_inserts(
    session: &Session,
    run: &Run<Vec<DeviceResult>>,
    mut binds: Binds,
    joined: &Joined,
    added_spans: &Mutex<std::collections::HashMap<usize, Region>>,
    stop: &AtomicBool,
) {
    let in_run = |addr| {
        let spec = DeviceSpec::Pci(addr);
        session.engine.drives().iter().any(|d| d.spec == spec)
    };
    while !stop.load(Ordering::Acquire) {
        let why = match binds.next(&session.opener, in_run) {
            Ok(None) => continue,
            Ok(Some(Bound::Up(spec, controller))) => {
                match session.join_up(run, &spec, controller, joined, added_spans) {
                    Ok(()) => continue,
                    Err(why) => {
                        format!("{spec} was bound to vfio-pci but does not join the run: {why}")
                    }
                }
            }
            Ok(Some(Bound::Failed(addr, why))) => {
                format!("{addr} was bound to vfio-pci but does not join the run: {why}")
            }
            Err(e) => {
                eprintln!("usnvme perf: warning: watching the kernel's device events: {e}: no more drives join the run");
                return;
            }
        };
        eprintln!("usnvme perf: warning: {why}");
    }
}

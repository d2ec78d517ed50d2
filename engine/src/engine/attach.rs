//! Bringing drives up: every controller at once, each on its own thread.

use super::*;

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

//! What `identify` and `health` share: which controllers to open (the BDFs and remote NVMe/TCP
//! subsystems given, or every NVMe controller bound to vfio-pci), opening them all at once, a
//! report from each, and the report printed as text or JSON. A controller that fails does not stop the others; every failure is
//! reported and the command exits 1.

use std::fmt;
use std::io::Write;

use anyhow::{Context, Result};
use serde::Serialize;
use usnvme_driver::pci::{Driver, Sysfs};
use usnvme_driver::{Controller, ControllerOptions, DeviceSpec, Opener};
use usnvme_engine::engine::AttachError;
use usnvme_engine::fabric::address::TcpAddress;
use usnvme_engine::transport::tcp::HostOptions;
use usnvme_engine::transport::{Controller as AnyController, ControllerError};
use usnvme_engine::Drive;

use crate::remote::{with_controller, RemoteArgs, Target};

/// Printed (on standard output for text, standard error with `--json`) when no BDF is given and
/// no NVMe controller is bound to vfio-pci. Not an error: there is nothing to report.
pub const NO_CONTROLLERS: &str = "no NVMe controllers are bound to vfio-pci: bind them with \
     `usnvme setup bind` (`usnvme list` shows every NVMe controller and its driver)";

/// Some controllers failed; each error names its controller. `main` prints one
/// `usnvme: error:` line per failure.
#[derive(Debug)]
pub struct Failures(pub Vec<anyhow::Error>);

impl fmt::Display for Failures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lines: Vec<String> = self.0.iter().map(|e| format!("{e:#}")).collect();
        f.write_str(&lines.join("\n"))
    }
}

impl std::error::Error for Failures {}

/// The drives a command reports on, and how.
#[derive(Debug, clap::Args)]
pub struct Targets {
    /// Drives: PCI addresses (0000:01:00.0 or 01:00.0), simulated ones (sim:0-3), or remote
    /// NVMe/TCP subsystems (tcp://ADDR:PORT/NQN, or an SPDK transport ID such as 'trtype:TCP
    /// traddr:ADDR trsvcid:PORT subnqn:NQN'); default: every NVMe controller bound to vfio-pci.
    #[arg(value_name = "DEVICE")]
    pub devices: Vec<Target>,
    /// Print a JSON array, one object per controller, instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// The drives to open, one spec each: those given (in order, `sim:` ranges split, without
/// repeats), or every NVMe controller bound to vfio-pci when none is given.
pub fn targets(sysfs: &Sysfs, given: &[DeviceSpec]) -> Result<Vec<DeviceSpec>> {
    if !given.is_empty() {
        let mut targets: Vec<DeviceSpec> = Vec::with_capacity(given.len());
        for drive in given.iter().flat_map(DeviceSpec::drives) {
            if !targets.contains(&drive) {
                targets.push(drive);
            }
        }
        return Ok(targets);
    }
    let controllers = sysfs
        .list_nvme_controllers()
        .context("cannot list the NVMe controllers")?;
    Ok(controllers
        .into_iter()
        .filter(|c| c.driver == Driver::VfioPci)
        .map(|c| DeviceSpec::Pci(c.address))
        .collect())
}

/// Brings up every controller in `targets` at once (the engine's `attach`), runs `job` on each
/// on its own thread, and shuts each down as its thread ends (shutdown waits on the controller,
/// up to seconds on real drives). Results come back in the order of `targets`.
pub fn each<T: Send>(
    sysfs: &Sysfs,
    targets: &[DeviceSpec],
    job: impl Fn(&Controller) -> Result<T> + Sync,
) -> Result<Vec<Result<T>>> {
    let opener = Opener::new(sysfs.root().join("sys"));
    let attached = usnvme_engine::attach(&opener, sysfs, targets, &ControllerOptions::default());
    let job = &job;
    let run = move |drive: Result<Drive, AttachError>| -> Result<T> {
        // The driver's errors name the controller and the fix (bind it, reserve hugepages, ...).
        let drive = drive.map_err(|e| anyhow::Error::new(*e.error))?;
        if crate::signals::received().is_some() {
            anyhow::bail!("{}: skipped: interrupted", drive.spec);
        }
        job(&drive.controller)
        // `drive` drops here: queues deleted, CC.SHN shutdown, DMA unmapped.
    };
    Ok(std::thread::scope(|scope| {
        let threads: Vec<_> = attached
            .into_iter()
            .zip(targets)
            .map(|(drive, addr)| {
                std::thread::Builder::new()
                    .name(format!("usnvme {addr}"))
                    .spawn_scoped(scope, move || run(drive))
            })
            .collect();
        threads
            .into_iter()
            .zip(targets)
            .map(|(thread, addr)| match thread {
                Ok(thread) => thread.join().unwrap_or_else(|_| {
                    Err(anyhow::anyhow!("{addr}: the thread serving it panicked"))
                }),
                Err(e) => {
                    Err(anyhow::Error::new(e).context(format!("{addr}: cannot start a thread")))
                }
            })
            .collect()
    }))
}

/// `job` on every drive of `devices` at once (see [`each`]): the line each returns printed on
/// `out`, in order, then the failures as [`Failures`].
pub fn each_line(
    sysfs: &Sysfs,
    devices: &[DeviceSpec],
    out: &mut dyn Write,
    job: impl Fn(&Controller) -> Result<String> + Sync,
) -> Result<()> {
    let mut failures = Vec::new();
    for result in each(sysfs, &targets(sysfs, devices)?, job)? {
        match result {
            Ok(line) => writeln!(out, "{line}")?,
            Err(e) => failures.push(e),
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(Failures(failures).into())
    }
}

/// The targets given, in order, without repeats (`sim:` ranges split); every NVMe controller
/// bound to vfio-pci when none is given.
pub fn all_targets(sysfs: &Sysfs, given: &[Target]) -> Result<Vec<Target>> {
    if given.is_empty() {
        return Ok(targets(sysfs, &[])?
            .into_iter()
            .map(Target::Local)
            .collect());
    }
    let mut all: Vec<Target> = Vec::with_capacity(given.len());
    for target in given {
        for t in target.drives() {
            if !all.contains(&t) {
                all.push(t);
            }
        }
    }
    Ok(all)
}

/// The whole of `identify` and `health`: a report (`job`) from every target controller, local
/// or remote (each on its own connection, shut down after), printed on `out` as text
/// (`render`, one block per controller, a blank line between) or as a JSON array, in the order
/// the targets were given.
pub fn report<T: Serialize + Send>(
    sysfs: &Sysfs,
    args: &Targets,
    out: &mut dyn Write,
    job: impl Fn(&mut AnyController<'_>) -> Result<T, ControllerError> + Sync,
    render: impl Fn(&T) -> String,
) -> Result<()> {
    let json = args.json;
    let targets = all_targets(sysfs, &args.devices)?;
    if targets.is_empty() {
        let text = if json {
            eprintln!("usnvme: {NO_CONTROLLERS}");
            "[]\n".to_owned()
        } else {
            format!("{NO_CONTROLLERS}\n")
        };
        return out
            .write_all(text.as_bytes())
            .context("cannot write to standard output");
    }
    let local: Vec<DeviceSpec> = targets.iter().filter_map(Target::local).cloned().collect();
    let remotes: Vec<&TcpAddress> = targets.iter().filter_map(Target::remote).collect();
    // who this host is matters only to remote targets (and may fail: no host NQN)
    let opts = if remotes.is_empty() {
        HostOptions::default()
    } else {
        args.remote.host_options(sysfs.root())?
    };
    let job = &job;
    let (mut local_results, mut remote_results) = std::thread::scope(|scope| {
        let threads: Vec<_> = remotes
            .iter()
            .map(|&addr| {
                let opts = &opts;
                std::thread::Builder::new()
                    .name(format!("usnvme {addr}"))
                    .spawn_scoped(scope, move || {
                        with_controller(addr, opts, |ctrl| {
                            job(&mut AnyController::Tcp {
                                ctrl,
                                address: addr,
                            })
                        })
                    })
            })
            .collect();
        let local_results = if local.is_empty() {
            Ok(Vec::new())
        } else {
            each(sysfs, &local, |c| Ok(job(&mut AnyController::Pcie(c))?))
        };
        let remote_results: Vec<Result<T>> = threads
            .into_iter()
            .zip(&remotes)
            .map(|(thread, addr)| match thread {
                Ok(thread) => thread.join().unwrap_or_else(|_| {
                    Err(anyhow::anyhow!("{addr}: the thread serving it panicked"))
                }),
                Err(e) => {
                    Err(anyhow::Error::new(e).context(format!("{addr}: cannot start a thread")))
                }
            })
            .collect();
        local_results.map(|l| (l.into_iter(), remote_results.into_iter()))
    })?;
    let mut reports = Vec::new();
    let mut failures = Vec::new();
    for target in &targets {
        let result = match target {
            Target::Local(_) => local_results.next(),
            Target::Remote(_) => remote_results.next(),
        };
        match result {
            Some(Ok(report)) => reports.push(report),
            Some(Err(e)) => failures.push(e),
            None => failures.push(anyhow::anyhow!("{target}: no result")),
        }
    }
    let text = if json {
        let mut text =
            serde_json::to_string_pretty(&reports).context("cannot encode the report as JSON")?;
        text.push('\n');
        text
    } else {
        let blocks: Vec<String> = reports.iter().map(render).collect();
        blocks.join("\n")
    };
    out.write_all(text.as_bytes())
        .context("cannot write to standard output")?;
    if failures.is_empty() {
        Ok(())
    } else {
        Err(Failures(failures).into())
    }
}

#[cfg(test)]
mod tests {
    use usnvme_driver::pci::fake::FakeSysfs;

    use super::*;

    fn addr(s: &str) -> DeviceSpec {
        s.parse().expect("a drive address")
    }

    #[test]
    fn targets_are_the_given_ones_or_every_vfio_controller() {
        let fake = FakeSysfs::new();
        fake.add_pci_device("0000:01:00.0", 0x010802, 0x1b36, 0x0010)
            .bind("vfio-pci");
        fake.add_pci_device("0000:02:00.0", 0x010802, 0x1b36, 0x0010)
            .bind("nvme");
        fake.add_pci_device("0000:03:00.0", 0x010802, 0x1b36, 0x0010)
            .bind("vfio-pci");
        let sysfs = fake.sysfs();
        assert_eq!(
            targets(&sysfs, &[]).expect("targets"),
            [addr("01:00.0"), addr("03:00.0")]
        );
        assert_eq!(
            targets(&sysfs, &[addr("02:00.0"), addr("01:00.0"), addr("02:00.0")]).expect("targets"),
            [addr("02:00.0"), addr("01:00.0")]
        );
    }

    #[test]
    fn remote_targets_keep_their_place_without_repeats() {
        let fake = FakeSysfs::new();
        let t = |s: &str| -> Target { s.parse().expect("a target") };
        let remote = "tcp://127.0.0.1:4420/nqn.2024-01.io.usnvme:a";
        let given = [
            t("sim:0-1"),
            t(remote),
            t("sim:1"),
            t("trtype:TCP traddr:127.0.0.1 subnqn:nqn.2024-01.io.usnvme:a"),
        ];
        let all = all_targets(&fake.sysfs(), &given).expect("targets");
        assert_eq!(all, [t("sim:0"), t("sim:1"), t(remote)]);
    }

    #[test]
    fn no_controller_on_vfio_is_not_an_error_and_says_what_to_do() {
        let fake = FakeSysfs::new();
        fake.add_pci_device("0000:02:00.0", 0x010802, 0x1b36, 0x0010)
            .bind("nvme");
        let mut out = Vec::new();
        let job = |_: &mut AnyController<'_>| -> Result<u32, ControllerError> {
            unreachable!("nothing to open")
        };
        let mut args = Targets {
            devices: Vec::new(),
            json: false,
            remote: RemoteArgs::default(),
        };
        report(&fake.sysfs(), &args, &mut out, job, |_| String::new()).expect("no error");
        let text = String::from_utf8(out).expect("UTF-8");
        assert!(text.contains("usnvme setup bind"), "{text}");
        assert!(text.contains("usnvme list"), "{text}");

        let mut out = Vec::new();
        args.json = true;
        report(&fake.sysfs(), &args, &mut out, job, |_| String::new()).expect("no error");
        assert_eq!(out, b"[]\n");
    }

    #[test]
    fn failures_display_one_line_each() {
        let f = Failures(vec![
            anyhow::anyhow!("0000:01:00.0: gone"),
            anyhow::anyhow!("cause").context("0000:02:00.0: failed"),
        ]);
        assert_eq!(
            f.to_string(),
            "0000:01:00.0: gone\n0000:02:00.0: failed: cause"
        );
    }
}

//! What `identify` and `health` share: which controllers to open (the BDFs given, or every NVMe
//! controller bound to vfio-pci), opening them all at once, a report from each, and the report
//! printed as text or JSON. A controller that fails does not stop the others; every failure is
//! reported and the command exits 1.

use std::fmt;
use std::io::Write;

use anyhow::{Context, Result};
use serde::Serialize;
use usnvme_driver::pci::{Driver, Sysfs};
use usnvme_driver::{Controller, ControllerOptions, DeviceSpec, Opener};
use usnvme_engine::engine::AttachError;
use usnvme_engine::Drive;

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
    /// Drives: PCI addresses (0000:01:00.0 or 01:00.0) or simulated ones (sim:0-3); default:
    /// every NVMe controller bound to vfio-pci.
    #[arg(value_name = "DEVICE")]
    pub devices: Vec<DeviceSpec>,
    /// Print a JSON array, one object per controller, instead of text.
    #[arg(long)]
    pub json: bool,
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

/// The whole of `identify` and `health`: a report from every target controller, printed on `out`
/// as text (`render`, one block per controller, a blank line between) or as a JSON array.
pub fn report<T: Serialize + Send>(
    sysfs: &Sysfs,
    given: &[DeviceSpec],
    json: bool,
    out: &mut dyn Write,
    job: impl Fn(&Controller) -> Result<T> + Sync,
    render: impl Fn(&T) -> String,
) -> Result<()> {
    let targets = targets(sysfs, given)?;
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
    let mut reports = Vec::new();
    let mut failures = Vec::new();
    for result in each(sysfs, &targets, job)? {
        match result {
            Ok(report) => reports.push(report),
            Err(e) => failures.push(e),
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
    fn no_controller_on_vfio_is_not_an_error_and_says_what_to_do() {
        let fake = FakeSysfs::new();
        fake.add_pci_device("0000:02:00.0", 0x010802, 0x1b36, 0x0010)
            .bind("nvme");
        let mut out = Vec::new();
        let job = |_: &Controller| -> Result<u32> { unreachable!("nothing to open") };
        report(&fake.sysfs(), &[], false, &mut out, job, |_| String::new()).expect("no error");
        let text = String::from_utf8(out).expect("UTF-8");
        assert!(text.contains("usnvme setup bind"), "{text}");
        assert!(text.contains("usnvme list"), "{text}");

        let mut out = Vec::new();
        report(&fake.sysfs(), &[], true, &mut out, job, |_| String::new()).expect("no error");
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

//! NVMe drives hot-plugged into the running test bed at a VM test's request.
//!
//! The guest has two empty PCIe root ports, N = 0 and 1. A test writes `USNVME-VM: hotplug add N`
//! or `del N` on the console; `cargo xtask vm-run` reads it there and answers through QEMU's
//! monitor, as an operator's hot plug: `add` puts a 256 MiB NVMe controller (serial
//! `usnvme-hotN`) into port N, `del` takes it out (`device_del`; the guest ejects it, then QEMU
//! drops it). Nothing binds the new controller but the kernel's nvme driver, when loaded.
//! What went wrong on the host side is on vm-run's stderr (`vm-run: hotplug: ...`).

use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

const PCI_DEVICES: &str = "/sys/bus/pci/devices";
/// How often the guest's PCI bus is looked at while waiting.
pub const POLL: Duration = Duration::from_millis(50);
/// How long a drive may take to appear (an emulated guest under a busy host is slow).
pub const LIMIT: Duration = Duration::from_secs(60);

/// Hot-adds drive `n` (0 or 1) and waits until its PCI function is on the guest's bus; returns
/// its address (BDF, e.g. `0000:01:00.0`). Panics when it has not come within [`LIMIT`].
pub fn add_drive(n: usize) -> String {
    let before = nvme_functions();
    request(&format!("add {n}"));
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some(new) = nvme_functions().difference(&before).next() {
            return new.clone();
        }
        assert!(
            Instant::now() < deadline,
            "hot-added drive {n} never appeared under {PCI_DEVICES} within {} s (vm-run's \
             stderr says what the host did: `vm-run: hotplug: ...`)",
            LIMIT.as_secs()
        );
        std::thread::sleep(POLL);
    }
}

/// Asks for drive `n`, at `bdf` (what [`add_drive`] returned), to be hot-removed, and returns at
/// once: the guest ejects it a moment later (the caller waits for what it expects). A drive a
/// program holds open through vfio-pci goes only once that program lets it go: the kernel waits
/// for it (vfio-pci relays the request to its device-request eventfd, if it set one).
pub fn remove_drive(n: usize, bdf: &str) {
    assert!(
        Path::new(PCI_DEVICES).join(bdf).exists(),
        "drive {n}: no PCI function {bdf} to remove"
    );
    request(&format!("del {n}"));
}

/// The NVMe controllers (class 0x010802) on the guest's PCI bus, by address.
fn nvme_functions() -> BTreeSet<String> {
    let entries =
        std::fs::read_dir(PCI_DEVICES).unwrap_or_else(|e| panic!("cannot list {PCI_DEVICES}: {e}"));
    entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            std::fs::read_to_string(e.path().join("class")).is_ok_and(|c| c.trim() == "0x010802")
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Writes a hot-plug request where vm-run reads it: the console itself (cargo's test harness
/// captures the test's stdout).
fn request(what: &str) {
    // On a line of its own: the console may be in the middle of the harness's `test NAME ... `.
    let line = format!("\nUSNVME-VM: hotplug {what}\n");
    let written = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/console")
        .and_then(|mut console| console.write_all(line.as_bytes()));
    if let Err(e) = written {
        panic!("cannot ask vm-run for `hotplug {what}` on /dev/console: {e}");
    }
}

//! NVMe drives hot-plugged into the running test bed at a VM test's request.
//!
//! The guest has two empty PCIe root ports, N = 0 and 1. A test writes `USNVME-VM: hotplug add N`,
//! `port N K` or `del N` on the console; `cargo xtask vm-run` reads it there and answers through
//! QEMU's monitor, as an operator's hot plug: `add` puts a 256 MiB NVMe controller (serial
//! `usnvme-hotN`) into port N, `port` a second controller of bed drive K's subsystem, `del` takes
//! it out (`device_del`; the guest ejects it, then QEMU
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
    add(&format!("add {n}"))
}

/// Hot-adds a second controller of bed drive `k`'s NVM subsystem (the other port of a
/// dual-port drive: drive `k`'s serial, its shared namespaces) as `n` (0 or 1), like
/// [`add_drive`]; [`remove_drive`] takes it out.
pub fn add_port(n: usize, k: usize) -> String {
    add(&format!("port {n} {k}"))
}

/// Asks for `what` and waits for the new NVMe function; its address.
fn add(what: &str) -> String {
    let before = nvme_functions();
    request(what);
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some(new) = nvme_functions().difference(&before).next() {
            return new.clone();
        }
        assert!(
            Instant::now() < deadline,
            "`hotplug {what}`: no new NVMe function under {PCI_DEVICES} within {} s (vm-run's \
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

/// Hot-removes drive (or port) `n` at `bdf` when the test ends, passed or not, if it is still
/// there, and waits (at most [`LIMIT`]) until it is gone: the next test must not find it.
#[derive(Debug)]
pub struct RemoveOnDrop(pub usize, pub String);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let dir = Path::new(PCI_DEVICES).join(&self.1);
        if !dir.exists() {
            return;
        }
        request(&format!("del {}", self.0));
        let deadline = Instant::now() + LIMIT;
        while dir.exists() && Instant::now() < deadline {
            std::thread::sleep(POLL);
        }
        if dir.exists() {
            eprintln!(
                "hot-plugged {} still on the bus {} s after its removal was asked",
                self.1,
                LIMIT.as_secs()
            );
        }
    }
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

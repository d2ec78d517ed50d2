//! `usnvme setup` on the test bed, on one drive (serial `usnvme21`): refused while usnvme perf
//! owns it; back to the kernel `nvme` driver, where its namespace becomes a block device;
//! refused while that block device is active swap; then onto vfio-pci again, where a second
//! bind does nothing. The suites share the drives, so the drive ends where it started, on
//! vfio-pci, even if the test fails.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use usnvme_tests::VmBed;

const SERIAL: &str = "usnvme21";

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `usnvme ARGS`, which must succeed; returns its standard output.
fn ok(bed: &VmBed, args: &[&str]) -> String {
    let out = bed.usnvme(args);
    assert!(
        out.status.success(),
        "usnvme {}: {}\n{}{}",
        args.join(" "),
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The driver the device at `dir` is bound to.
fn driver(dir: &Path) -> String {
    std::fs::read_link(dir.join("driver"))
        .ok()
        .and_then(|t| Some(t.file_name()?.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "none".to_owned())
}

/// The address of the drive with serial `serial` (drives on vfio-pci only).
fn address_of(bed: &VmBed, serial: &str) -> String {
    let list: Vec<Value> =
        serde_json::from_str(&ok(bed, &["identify", "--json"])).expect("a JSON array");
    list.iter()
        .find(|c| c["serial"].as_str().map(str::trim) == Some(serial))
        .and_then(|c| c["address"].as_str())
        .unwrap_or_else(|| panic!("no drive with serial {serial} on vfio-pci"))
        .to_owned()
}

/// The block devices `usnvme list` shows on the drive.
fn block_devices(bed: &VmBed, address: &str) -> Vec<String> {
    let list: Vec<Value> = serde_json::from_str(&ok(bed, &["list", "--json"])).expect("JSON");
    list.iter()
        .filter(|c| c["address"] == address)
        .flat_map(|c| c["block_devices"].as_array().cloned().unwrap_or_default())
        .filter_map(|b| b["name"].as_str().map(str::to_owned))
        .collect()
}

/// Runs a busybox applet (the guest's userland), which must succeed.
fn busybox(args: &[&str]) {
    let out: Output = Command::new("busybox")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run busybox: {e}"));
    assert!(
        out.status.success(),
        "busybox {}: {}",
        args.join(" "),
        text(&out.stderr)
    );
}

/// The test bed loads the kernel nvme driver only when it leaves drives on it, and the guest
/// has no modprobe (that `usnvme setup` would run): load it from the initramfs, as its /init
/// does. The other drives keep their vfio-pci driver_override, so it claims none of them.
fn load_nvme_driver() {
    if Path::new("/sys/bus/pci/drivers/nvme").is_dir() {
        return;
    }
    let mods = Path::new("/proc/1/root/mods");
    for module in ["nvme-core.ko", "nvme.ko"] {
        // nvme-core is loaded already: the guest's NVMe/TCP modules need it
        if module == "nvme-core.ko" && Path::new("/sys/module/nvme_core").is_dir() {
            continue;
        }
        let path = mods.join(module);
        busybox(&["insmod", &path.to_string_lossy()]);
    }
}

/// Puts the drive back on vfio-pci when the test ends, passed or not.
struct Restore<'a> {
    bed: &'a VmBed,
    address: String,
    swap: Option<PathBuf>,
}

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        if let Some(swap) = self.swap.take() {
            let _ = Command::new("busybox")
                .args(["swapoff", &swap.to_string_lossy()])
                .output();
        }
        let _ = self.bed.usnvme(&["setup", "bind", &self.address]);
    }
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn reset_to_nvme_refuse_while_in_use_and_bind_back() {
    let bed = VmBed::from_env();
    let address = address_of(&bed, SERIAL);
    let dir = PathBuf::from("/sys/bus/pci/devices").join(&address);
    assert_eq!(driver(&dir), "vfio-pci");
    load_nvme_driver();
    let mut restore = Restore {
        bed: &bed,
        address: address.clone(),
        swap: None,
    };

    // A dry run prints the plan and leaves the drive where it is.
    let plan = ok(&bed, &["setup", "reset", &address, "--dry-run"]);
    assert!(
        plan.contains(&format!("{address}: vfio-pci -> nvme\n"))
            && plan.contains(&format!("  echo {address} > /sys/bus/pci/drivers_probe\n"))
            && plan.ends_with("dry run: nothing was changed\n"),
        "{plan}"
    );
    assert_eq!(driver(&dir), "vfio-pci");

    // Back to the kernel: the namespace shows up as a block device (asynchronously).
    let out = ok(&bed, &["setup", "reset", &address]);
    assert_eq!(out, format!("{address}: vfio-pci -> nvme\n"));
    assert_eq!(driver(&dir), "nvme");
    // (a hang guard: the kernel probes a drive in a second or two, under emulation too)
    let deadline = Instant::now() + Duration::from_secs(60);
    let disk = loop {
        if let Some(disk) = block_devices(&bed, &address).into_iter().next() {
            break disk;
        }
        assert!(
            Instant::now() < deadline,
            "no block device on {address} 60 s after it went to nvme"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let dev = PathBuf::from("/dev").join(&disk);
    assert_eq!(
        ok(&bed, &["setup", "reset", &address]),
        format!("{address}: already on nvme\n")
    );

    // In use as swap: bind refuses, says which, and leaves the drive on nvme.
    busybox(&["mkswap", &dev.to_string_lossy()]);
    busybox(&["swapon", &dev.to_string_lossy()]);
    restore.swap = Some(dev.clone());
    let out = bed.usnvme(&["setup", "bind", &address]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "usnvme: error: refusing {address}: {disk} is active swap: turn it off first (swapoff {})",
            dev.display()
        )),
        "{err}"
    );
    assert_eq!(driver(&dir), "nvme");
    busybox(&["swapoff", &dev.to_string_lossy()]);
    restore.swap = None;

    // Onto vfio-pci again; a second bind, and a dry run, change nothing.
    let out = ok(&bed, &["setup", "bind", &address]);
    assert_eq!(out, format!("{address}: nvme -> vfio-pci\n"));
    assert_eq!(driver(&dir), "vfio-pci");
    assert!(block_devices(&bed, &address).is_empty());
    let again = format!("{address}: already on vfio-pci\n");
    assert_eq!(ok(&bed, &["setup", "bind", &address]), again);
    assert_eq!(ok(&bed, &["setup", "bind", &address, "--dry-run"]), again);
    assert_eq!(driver(&dir), "vfio-pci");
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn reset_is_refused_naming_the_perf_that_owns_the_drive() {
    let bed = VmBed::from_env();
    let address = address_of(&bed, SERIAL);
    let dir = PathBuf::from("/sys/bus/pci/devices").join(&address);
    // If reset went through anyway, the drive goes back to vfio-pci.
    let _restore = Restore {
        bed: &bed,
        address: address.clone(),
        swap: None,
    };
    let mut perf = Command::new(&bed.usnvme)
        .args(["perf", "-r", &address, "-q", "1", "-t", "30"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bed.usnvme.display()));
    // Once perf measures, it holds the drive's lock and its VFIO group.
    let mut stderr = perf.stderr.take().expect("piped");
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    while !text(&seen).contains("measuring") {
        match stderr.read(&mut byte) {
            Ok(1) => seen.push(byte[0]),
            _ => panic!("perf ended before measuring:\n{}", text(&seen)),
        }
    }
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));

    let out = bed.usnvme(&["setup", "reset", &address]);
    // Ctrl-C: perf shuts its controller down on the way out.
    let _ = Command::new("kill")
        .args(["-INT", &perf.id().to_string()])
        .status();
    let _ = perf.wait();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "usnvme: error: refusing {address}: in use by usnvme PID {} (usnvme perf -r {address} -q 1 -t 30): stop it first",
            perf.id()
        )),
        "{err}"
    );
    assert_eq!(driver(&dir), "vfio-pci");
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn status_shows_the_iommu_vfio_and_hugepages() {
    let bed = VmBed::from_env();
    let out = ok(&bed, &["setup", "status"]);
    assert!(
        out.contains(&format!("{} NVMe controllers:", bed.drives)),
        "{out}"
    );
    for line in [
        "IOMMU:      on (dmar0, ",
        "vfio-pci:   loaded",
        "hugepages:  ",
    ] {
        assert!(out.contains(line), "no {line:?} in:\n{out}");
    }
    assert!(!out.contains("none reserved"), "{out}");
}

//! Helpers shared by the cross-crate and VM test suites.
//!
//! VM tests are marked `#[ignore = "VM: ..."]`: plain `cargo test` skips them, and
//! `cargo xtask vm-test` runs them with `--ignored` inside the test-bed guest, where the
//! environment describes the drives (`USNVME_VM_*`, set by `cargo xtask vm-run`).

use std::path::PathBuf;

pub mod fio;
pub mod hotplug;
pub mod kernel_host;
pub mod rdma;
pub mod verify;

/// The test bed as `cargo xtask vm-run` describes it to the guest.
#[derive(Debug, Clone)]
pub struct VmBed {
    pub drives: usize,
    pub kernel_drives: usize,
    pub numa_nodes: usize,
    pub logical_block_sizes: Vec<u32>,
    /// The `usnvme` binary built for the run.
    pub usnvme: PathBuf,
}

impl VmBed {
    /// Reads the environment; panics (failing the test) outside the test bed.
    pub fn from_env() -> VmBed {
        let var = |k: &str| {
            std::env::var(k).unwrap_or_else(|_| {
                panic!("{k} is not set: run VM tests with `cargo xtask vm-test`")
            })
        };
        let num = |k: &str| {
            var(k)
                .parse::<usize>()
                .unwrap_or_else(|_| panic!("{k} is not a number"))
        };
        VmBed {
            drives: num("USNVME_VM_DRIVES"),
            kernel_drives: num("USNVME_VM_KERNEL_DRIVES"),
            numa_nodes: num("USNVME_VM_NUMA_NODES"),
            logical_block_sizes: var("USNVME_VM_LOGICAL_BLOCK_SIZES")
                .split(',')
                .map(|s| s.parse().unwrap_or_else(|_| panic!("bad block size {s}")))
                .collect(),
            usnvme: PathBuf::from(var("USNVME_BIN")),
        }
    }

    /// The logical block size of drive `k` (serial `usnvme{k}`): vm-run spreads the sizes over
    /// the drives in order.
    pub fn block_size_of(&self, k: usize) -> u32 {
        let sizes = &self.logical_block_sizes;
        sizes[(k * sizes.len() / self.drives.max(1)).min(sizes.len() - 1)]
    }

    /// Runs `usnvme ARGS` and returns its output.
    pub fn usnvme(&self, args: &[&str]) -> std::process::Output {
        std::process::Command::new(&self.usnvme)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.usnvme.display()))
    }
}

/// Deterministic test data: `len` bytes that differ for every `seed` and position.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut data = vec![0u8; len];
    fastrand::Rng::with_seed(seed).fill(&mut data);
    data
}

/// FNV-1a 64: the checksum the host-side image check (`cargo xtask vm-test`) recomputes.
pub fn fnv1a64(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Records what a VM test wrote, so that after the guest exits the host can check the bytes in
/// the drive's image file. One line per write: `IMAGE OFFSET LEN FNV1A64`.
pub fn expect_on_host(drive: usize, byte_offset: u64, data: &[u8]) {
    use std::io::Write;
    let Ok(run) = std::env::var("USNVME_VM_WORK") else {
        return;
    };
    let path = PathBuf::from(run).join("expect-images.txt");
    let line = format!(
        "nvme{drive}.img {byte_offset} {} {:016x}\n",
        data.len(),
        fnv1a64(data)
    );
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        panic!("cannot record expectations in {}: {e}", path.display());
    }
}

/// Records, for the host's check of the image files after the guest exits, that `usnvme perf
/// --verify` (run `seed`) wrote into `[start, start + len)` of drive `drive`'s image, in blocks of
/// `block_size` bytes: every block there (`all`) or some of them. The host checks that those
/// blocks carry perf's verify stamp with that seed, their own offset and a valid checksum. One
/// line per range in `expect-stamps.txt`: `IMAGE START LEN BLOCK_SIZE SEED all|some`.
pub fn expect_stamps_on_host(
    drive: usize,
    start: u64,
    len: u64,
    block_size: u32,
    seed: u64,
    all: bool,
) {
    use std::io::Write;
    let Ok(run) = std::env::var("USNVME_VM_WORK") else {
        return;
    };
    let path = PathBuf::from(run).join("expect-stamps.txt");
    let mode = if all { "all" } else { "some" };
    let line = format!("nvme{drive}.img {start} {len} {block_size} {seed} {mode}\n");
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        panic!("cannot record expectations in {}: {e}", path.display());
    }
}

/// The drive index of a test-bed controller, from its serial number (`usnvme{k}`).
pub fn drive_index(serial: &str) -> Option<usize> {
    serial.trim().strip_prefix("usnvme")?.parse().ok()
}

/// Every NVMe controller bound to vfio-pci, by address.
pub fn vfio_controllers() -> Vec<usnvme_driver::pci::PciAddress> {
    let sysfs = usnvme_driver::pci::Sysfs::new();
    let mut list: Vec<_> = sysfs
        .list_nvme_controllers()
        .unwrap_or_else(|e| panic!("listing controllers: {e}"))
        .into_iter()
        .filter(|c| c.driver == usnvme_driver::pci::Driver::VfioPci)
        .map(|c| c.address)
        .collect();
    list.sort();
    list
}

/// Interrupts the guest took so far from the MSI-X vectors programs enabled through vfio-pci
/// (`/proc/interrupts`; a program's lines go when it lets its vectors go).
pub fn vfio_msix_interrupts() -> u64 {
    let table = std::fs::read_to_string("/proc/interrupts").expect("/proc/interrupts");
    table
        .lines()
        .filter(|l| l.contains("vfio-msix"))
        .flat_map(|l| {
            let counts = l.split_whitespace().skip(1);
            counts.map_while(|w| w.parse::<u64>().ok())
        })
        .sum()
}

/// A process killed when the test ends, passed or not: a target or fio left running would hold
/// its drives and ports under the next tests.
#[derive(Debug)]
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends signal `name` (INT, TERM) and waits until the process has taken it (it is no longer
/// pending in /proc/PID/status): two signals sent this way are two, never merged into one.
pub fn signal(child: &std::process::Child, name: &str) {
    let sent = std::process::Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success());
    let bit = match name {
        "HUP" => 1u64,
        "INT" => 1u64 << 1,
        "TERM" => 1u64 << 14,
        other => panic!("signal {other}: not used by these tests"),
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", child.id())) else {
            return; // gone: it took the signal
        };
        let pending = status
            .lines()
            .filter(|l| l.starts_with("SigPnd:") || l.starts_with("ShdPnd:"))
            .filter_map(|l| u64::from_str_radix(l.split_whitespace().nth(1)?, 16).ok())
            .fold(0, |all, p| all | p);
        if pending & bit == 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "SIG{name} pending for 10 s"
        );
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_differ_by_seed_and_are_repeatable() {
        assert_eq!(pattern(7, 64), pattern(7, 64));
        assert_ne!(pattern(7, 64), pattern(8, 64));
        assert_ne!(pattern(7, 4096)[..2048], pattern(7, 4096)[2048..]);
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(drive_index("usnvme17  "), Some(17));
        assert_eq!(drive_index("other"), None);
    }
}

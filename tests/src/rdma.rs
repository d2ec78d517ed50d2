//! RDMA in the test bed: soft-RoCE (`rdma_rxe`) on a netdev of the guest's own, for the VM suites
//! that run NVMe over RDMA (the kernel's nvme-rdma host and nvmet-rdma target, usnvme's own).
//!
//! The guest's /init (`xtask/src/vm/guest-init.sh`) loads the RDMA modules and gives
//! [`RDMA_NETDEV`], a `dummy` device, the link-local [`RDMA_ADDRESS`]. A dummy device has no wire:
//! nothing sent on it leaves the guest, and rxe hands what goes to its own address straight back
//! to itself. [`rdma_address`] adds the rxe device [`RDMA_DEVICE`] on it, once, and waits until
//! it is usable.

use std::net::Ipv4Addr;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The netdev rxe runs on (made by /init: `insmod dummy.ko numdummies=1`).
pub const RDMA_NETDEV: &str = "dummy0";
/// The soft-RoCE device [`rdma_address`] adds on [`RDMA_NETDEV`].
pub const RDMA_DEVICE: &str = "rxe0";
/// [`RDMA_NETDEV`]'s address (set by /init), which rxe serves: link-local, on a device with no
/// wire.
pub const RDMA_ADDRESS: &str = "169.254.77.1";
/// iproute2's `rdma` (installed on the host by `cargo xtask vm-setup`; the guest runs the host's
/// root).
pub const RDMA: &str = "/usr/bin/rdma";

/// The address rxe serves in the guest, for an RDMA listener or connection (rdma_cm resolves it
/// to [`RDMA_DEVICE`]), with soft-RoCE up: adds [`RDMA_DEVICE`] on [`RDMA_NETDEV`] unless it is
/// there, then waits (bounded) until its port is active with the address's RoCE v2 GID. Panics,
/// with the kernel's log, where it cannot.
pub fn rdma_address() -> &'static str {
    let netdev = Path::new("/sys/class/net").join(RDMA_NETDEV);
    assert!(
        netdev.is_dir(),
        "no {RDMA_NETDEV}: the guest's /init makes it (dummy.ko) and gives it {RDMA_ADDRESS}"
    );
    let device = device_dir();
    if !device.is_dir() {
        let out = Command::new(RDMA)
            .args(["link", "add", RDMA_DEVICE, "type", "rxe", "netdev"])
            .arg(RDMA_NETDEV)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {RDMA} (iproute2): {e}"));
        // another test may have added it in the meantime: only its absence is an error
        assert!(
            device.is_dir(),
            "rdma link add {RDMA_DEVICE} type rxe netdev {RDMA_NETDEV} ({}): {}{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            kernel_log()
        );
    }
    let gid = roce_gid(RDMA_ADDRESS.parse().unwrap_or(Ipv4Addr::UNSPECIFIED));
    let port = device.join("ports/1");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let state = read(&port.join("state"));
        let gids = gids(&port);
        if state.ends_with("ACTIVE") && gids.contains(&gid) {
            return RDMA_ADDRESS;
        }
        assert!(
            Instant::now() < deadline,
            "after 30 s {RDMA_DEVICE} port 1 is {state:?} with GIDs {gids:?}, not ACTIVE with \
             {gid} ({RDMA_ADDRESS}): is {RDMA_ADDRESS} on {RDMA_NETDEV}?\n{}",
            kernel_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `/sys/class/infiniband/rxe0`.
pub fn device_dir() -> PathBuf {
    Path::new("/sys/class/infiniband").join(RDMA_DEVICE)
}

/// Counter `name` of [`RDMA_DEVICE`]'s port (`hw_counters`: rxe's `sent_pkts`, `rcvd_pkts`, …).
pub fn counter(name: &str) -> u64 {
    let path = device_dir().join("ports/1/hw_counters").join(name);
    read(&path)
        .parse()
        .unwrap_or_else(|_| panic!("{} is not a number", path.display()))
}

/// The RoCE v2 GID of an IPv4 address, as sysfs writes it: `0000:…:ffff:a9fe:4d01`.
pub fn roce_gid(address: Ipv4Addr) -> String {
    let [a, b, c, d] = address.octets();
    format!("0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}")
}

/// The non-zero GIDs of a port.
fn gids(port: &Path) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir(port.join("gids"))
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .map(|e| read(&e.path()))
        .filter(|g| g.bytes().any(|b| b != b'0' && b != b':'))
        .collect();
    found.sort();
    found
}

/// A sysfs attribute, trimmed; empty when it cannot be read.
fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The last lines of the kernel's log, for a failure message: what rxe, rdma_cm, nvme-rdma and
/// nvmet-rdma said.
pub fn kernel_log() -> String {
    const LINES: usize = 80;
    for (program, args) in [("dmesg", &[][..]), ("busybox", &["dmesg"][..])] {
        if let Ok(out) = Command::new(program).args(args).output() {
            if out.status.success() {
                let text = String::from_utf8_lossy(&out.stdout);
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(LINES)..].join("\n");
                return format!("kernel log (last {LINES} lines):\n{tail}");
            }
        }
    }
    "kernel log: dmesg cannot be run".to_string()
}

/// Runs `f`; where it panics, panics again with `what`, its message and the kernel's log.
pub fn or_kernel_log<T>(what: &str, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(payload) => {
            let message = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied());
            match message {
                Some(m) => panic!("{what}: {m}\n{}", kernel_log()),
                None => resume_unwind(payload),
            }
        }
    }
}

/// The kernel's NVMe over RDMA target (nvmet-rdma) under configfs: subsystem `nqn` allowing any
/// host, with namespace 1 on a file on the guest's /tmp (tmpfs, which has no O_DIRECT in 6.1:
/// nvmet's buffered I/O), on an RDMA port. Removed (in reverse order) when dropped, the test
/// passed or not.
#[derive(Debug)]
pub struct NvmetRdma {
    pub subsystem: PathBuf,
    pub port: PathBuf,
    pub file: PathBuf,
    nqn: String,
}

/// nvmet's configfs root (the guest's /init mounts configfs).
pub const NVMET: &str = "/sys/kernel/config/nvmet";

impl NvmetRdma {
    /// Subsystem `nqn`, namespace 1 of `bytes` on a new file, on port `port_id` (configfs name:
    /// any number no other test uses) listening on `address`:`trsvcid`.
    pub fn on_file(nqn: &str, bytes: u64, port_id: u32, address: &str, trsvcid: u16) -> Self {
        let root = Path::new(NVMET);
        assert!(
            root.is_dir() && Path::new("/sys/module/nvmet_rdma").is_dir(),
            "no nvmet-rdma: the guest's /init loads nvmet.ko and nvmet-rdma.ko and mounts configfs"
        );
        let file = std::env::temp_dir().join(format!("nvmet-rdma-{port_id}.img"));
        let t = NvmetRdma {
            subsystem: root.join("subsystems").join(nqn),
            port: root.join("ports").join(port_id.to_string()),
            file,
            nqn: nqn.to_string(),
        };
        // a step that fails panics, and `t` tears down what the steps before it made
        std::fs::File::create(&t.file)
            .and_then(|f| f.set_len(bytes))
            .unwrap_or_else(|e| panic!("creating {}: {e}", t.file.display()));
        let mkdir = |dir: &Path| {
            std::fs::create_dir(dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()))
        };
        mkdir(&t.subsystem);
        write_attr(&t.subsystem, "attr_allow_any_host", "1");
        let ns = t.subsystem.join("namespaces/1");
        mkdir(&ns);
        write_attr(&ns, "device_path", &t.file.display().to_string());
        write_attr(&ns, "buffered_io", "1");
        write_attr(&ns, "enable", "1");
        mkdir(&t.port);
        for (name, value) in [
            ("addr_trtype", "rdma"),
            ("addr_adrfam", "ipv4"),
            ("addr_traddr", address),
            ("addr_trsvcid", &trsvcid.to_string()),
        ] {
            write_attr(&t.port, name, value);
        }
        // the port listens (rdma_cm binds the address to rxe) when its first subsystem is linked
        let link = t.port.join("subsystems").join(nqn);
        std::os::unix::fs::symlink(&t.subsystem, &link).unwrap_or_else(|e| {
            panic!(
                "ln -s {} {} (nvmet-rdma listens on {address}:{trsvcid}): {e}",
                t.subsystem.display(),
                link.display()
            )
        });
        t
    }

    /// What is left of it under configfs (nothing, once dropped).
    pub fn left_in_configfs(&self) -> Vec<PathBuf> {
        [&self.port, &self.subsystem]
            .into_iter()
            .filter(|p| p.exists())
            .cloned()
            .collect()
    }
}

fn write_attr(dir: &Path, name: &str, value: &str) {
    let path = dir.join(name);
    std::fs::write(&path, value)
        .unwrap_or_else(|e| panic!("echo {value} > {}: {e}", path.display()));
}

impl Drop for NvmetRdma {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.port.join("subsystems").join(&self.nqn));
        let _ = std::fs::remove_dir(&self.port);
        let ns = self.subsystem.join("namespaces/1");
        let _ = std::fs::write(ns.join("enable"), "0");
        let _ = std::fs::remove_dir(&ns);
        let _ = std::fs::remove_dir(&self.subsystem);
        let _ = std::fs::remove_file(&self.file);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guest_init_gives_the_netdev_the_address_rxe_serves() {
        let init = include_str!("../../xtask/src/vm/guest-init.sh");
        let line = format!("ifconfig {RDMA_NETDEV} {RDMA_ADDRESS} netmask");
        assert!(init.contains(&line), "guest-init.sh has no `{line}`");
        assert!(init.contains("insmod /mods/dummy.ko numdummies=1"));
    }

    #[test]
    fn the_roce_gid_of_an_ipv4_address_is_its_v4_mapped_ipv6_address() {
        assert_eq!(
            roce_gid(Ipv4Addr::new(169, 254, 77, 1)),
            "0000:0000:0000:0000:0000:ffff:a9fe:4d01"
        );
        assert_eq!(
            roce_gid(RDMA_ADDRESS.parse().expect("an IPv4 address")),
            roce_gid(Ipv4Addr::new(169, 254, 77, 1))
        );
    }
}

//! The guest kernel as an NVMe/TCP host of `usnvme serve` (nvme-cli's connect, the kernel's
//! block devices of a subsystem), for the VM suites that test serve against it.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::VmBed;

/// nvme-cli and fio, installed on the host by `cargo xtask vm-setup` (the guest runs in the host's
/// root, where /usr/sbin may not be on the PATH).
pub const NVME: &str = "/usr/sbin/nvme";
pub const FIO: &str = "/usr/bin/fio";
/// The host NQN the kernel connects as, and serve allows.
pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:75736e76-6d65-4000-8000-766d66616272";

/// Runs `program ARGS`, which must succeed; its standard output and error.
pub fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{program} {args:?}: {text}");
    text
}

/// A namespace `usnvme serve` said it exports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exported {
    pub nsid: u32,
    /// The device behind it (a PCI address and namespace, `stripe0`).
    pub name: String,
    pub bytes: u64,
    /// Its UUID, as serve prints it (hyphenated, lower case), which the kernel's `uuid` and
    /// `wwid` (`uuid.…`) show.
    pub uuid: String,
}

/// `usnvme serve` of subsystem `nqn` on `addresses`, allowing [`HOSTNQN`], running; the
/// namespaces it printed.
pub fn serve(
    bed: &VmBed,
    nqn: &str,
    addresses: &[String],
    extra: &[&str],
) -> (Child, Vec<Exported>) {
    let mut args = vec!["--nqn", nqn, "--allow-host", HOSTNQN];
    args.extend_from_slice(extra);
    for a in addresses {
        args.extend(["-r", a.as_str()]);
    }
    serve_with(bed, &args)
}

/// `usnvme serve ARGS` running; the namespaces it printed.
pub fn serve_with(bed: &VmBed, args: &[&str]) -> (Child, Vec<Exported>) {
    let mut child = Command::new(&bed.usnvme)
        .arg("serve")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("usnvme serve runs");
    let stdout = child.stdout.take().expect("piped");
    let mut namespaces = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("a line");
        // "  namespace 3: 0000:01:00.0 (2097152 blocks of 512 bytes, 1.0 GiB), uuid 8c1f…"
        if let Some(rest) = line.trim().strip_prefix("namespace ") {
            let (nsid, rest) = rest.split_once(": ").expect("NSID: name");
            let (name, rest) = rest.split_once(" (").expect("name (size)");
            let (size, uuid) = rest.split_once("), uuid ").expect("(size), uuid UUID");
            let mut words = size.split_whitespace();
            let blocks: u64 = words.next().and_then(|w| w.parse().ok()).expect("blocks");
            let bs: u64 = words
                .nth(2)
                .and_then(|w| w.parse().ok())
                .expect("block size");
            namespaces.push(Exported {
                nsid: nsid.parse().expect("NSID"),
                name: name.to_string(),
                bytes: blocks * bs,
                uuid: uuid.to_string(),
            });
        }
        if line.starts_with("hosts:") {
            break;
        }
    }
    (child, namespaces)
}

/// Disconnects the kernel from the subsystem when the test ends, passed or not: a kernel left
/// connected to a stopped target would retry for ten minutes under the other suites.
#[derive(Debug)]
pub struct Connected(String);

impl Connected {
    /// `nvme connect` to subsystem `nqn` on 127.0.0.1:4420 as [`HOSTNQN`].
    pub fn new(nqn: &str, extra: &[&str]) -> Connected {
        Connected::to_port(nqn, 4420, extra)
    }

    /// `nvme connect` to subsystem `nqn` on 127.0.0.1:`port` as [`HOSTNQN`] (again to
    /// another port: a second path).
    pub fn to_port(nqn: &str, port: u16, extra: &[&str]) -> Connected {
        Connected::over("tcp", "127.0.0.1", port, nqn, extra)
    }

    /// `nvme connect -t TRANSPORT` (`tcp`, `rdma`) to subsystem `nqn` at `address`:`port` as
    /// [`HOSTNQN`].
    pub fn over(transport: &str, address: &str, port: u16, nqn: &str, extra: &[&str]) -> Connected {
        let port = port.to_string();
        let mut connect = vec![
            "connect",
            "-t",
            transport,
            "-n",
            nqn,
            "-a",
            address,
            "-s",
            &port,
            "--hostnqn",
            HOSTNQN,
        ];
        connect.extend_from_slice(extra);
        run(NVME, &connect);
        Connected(nqn.to_string())
    }
}

impl Drop for Connected {
    fn drop(&mut self) {
        let _ = Command::new(NVME)
            .args(["disconnect", "-n", &self.0])
            .output();
    }
}

/// The kernel's block devices of subsystem `nqn`, by NSID, once all `count` are there.
pub fn kernel_namespaces(nqn: &str, count: usize) -> HashMap<u32, PathBuf> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut found = HashMap::new();
        for subsys in std::fs::read_dir("/sys/class/nvme-subsystem")
            .into_iter()
            .flatten()
        {
            let dir = subsys.expect("an entry").path();
            let found_nqn = std::fs::read_to_string(dir.join("subsysnqn")).unwrap_or_default();
            if found_nqn.trim() != nqn {
                continue;
            }
            for entry in std::fs::read_dir(&dir).into_iter().flatten() {
                let name = entry
                    .expect("an entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned();
                // heads (nvme1n3), not controllers (nvme1), path devices (nvme1c1n3) or the
                // generic character devices (ng1n3)
                let Some((ctrl, nsid)) = name.strip_prefix("nvme").and_then(|r| r.split_once('n'))
                else {
                    continue;
                };
                if !ctrl.bytes().all(|b| b.is_ascii_digit()) {
                    continue;
                }
                if let Ok(nsid) = nsid.parse() {
                    found.insert(nsid, PathBuf::from("/dev").join(&name));
                }
            }
        }
        if found.len() == count && found.values().all(|p| p.exists()) {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "after 60 s the kernel shows {} of {count} namespaces: {found:?}",
            found.len()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub fn block_bytes(dev: &Path) -> u64 {
    let sectors: u64 = sysfs_block(dev, "size").parse().expect("a number");
    sectors * 512
}

/// Attribute `attr` of block device `dev` (`/sys/class/block/NAME/ATTR`), trimmed.
pub fn sysfs_block(dev: &Path, attr: &str) -> String {
    let name = dev
        .file_name()
        .expect("a name")
        .to_string_lossy()
        .into_owned();
    let path = format!("/sys/class/block/{name}/{attr}");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .trim()
        .to_string()
}

/// fio writes `size` of `dev` at random and verifies it.
pub fn fio_verifies(dev: &Path, size: &str) {
    fio_verifies_at(dev, 0, size)
}

/// fio writes `size` of `dev` from byte `offset` at random and verifies it.
pub fn fio_verifies_at(dev: &Path, offset: u64, size: &str) {
    let out = run(
        FIO,
        &[
            "--name=verify",
            &format!("--filename={}", dev.display()),
            "--ioengine=io_uring",
            "--direct=1",
            "--rw=randwrite",
            "--bsrange=4k-128k",
            &format!("--offset={offset}"),
            &format!("--size={size}"),
            "--iodepth=8",
            "--verify=crc32c",
            "--do_verify=1",
        ],
    );
    assert!(!out.contains("verify: bad"), "{out}");
}

//! `usnvme serve` on the bed's vfio drives, reached by the guest kernel's own NVMe/TCP
//! initiator (`nvme discover`, `nvme connect -t tcp` from nvme-cli): the namespaces appear as
//! kernel block devices of the right sizes, nvme-cli's identify and SMART commands answer,
//! fio's verified writes and reads pass with digests off and on, and what the kernel wrote is
//! found at the right offsets of the right drives' images by the host afterwards.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use usnvme_tests::{drive_index, expect_on_host, pattern, signal, vfio_controllers, VmBed};

/// nvme-cli and fio, installed on the host by `cargo xtask vm-setup` (the guest runs in the host's
/// root, where /usr/sbin may not be on the PATH).
const NVME: &str = "/usr/sbin/nvme";
const FIO: &str = "/usr/bin/fio";
const NQN: &str = "nqn.2024-01.io.usnvme:vm-fabric";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:75736e76-6d65-4000-8000-766d66616272";
/// Drives exported.
const EXPORTED: usize = 12;
/// Where fio works on each namespace, and where the image-checked pattern goes: above what the
/// other suites' checked writes use (vm_driver writes from LBA 8 on).
const FIO_OFFSET: u64 = 256 << 20;
const FIO_SIZE: u64 = 16 << 20;
const CHECKED_OFFSET: u64 = 768 << 20;
const CHECKED_LEN: usize = 64 << 10;

fn run(program: &str, args: &[&str]) -> String {
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

/// `usnvme serve` running, and the namespaces it printed: (NSID, PCI address, bytes).
fn serve(bed: &VmBed, addresses: &[String], extra: &[&str]) -> (Child, Vec<(u32, String, u64)>) {
    let mut args = vec!["serve", "--nqn", NQN, "--allow-host", HOSTNQN];
    args.extend_from_slice(extra);
    for a in addresses {
        args.extend(["-r", a.as_str()]);
    }
    let mut child = Command::new(&bed.usnvme)
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("usnvme serve runs");
    let stdout = child.stdout.take().expect("piped");
    let mut namespaces = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("a line");
        // "  namespace 3: 0000:01:00.0 (2097152 blocks of 512 bytes, 1.0 GiB)"
        if let Some(rest) = line.trim().strip_prefix("namespace ") {
            let (nsid, rest) = rest.split_once(": ").expect("NSID: name");
            let (name, rest) = rest.split_once(" (").expect("name (size)");
            let mut words = rest.split_whitespace();
            let blocks: u64 = words.next().and_then(|w| w.parse().ok()).expect("blocks");
            let bs: u64 = words
                .nth(2)
                .and_then(|w| w.parse().ok())
                .expect("block size");
            namespaces.push((nsid.parse().expect("NSID"), name.to_string(), blocks * bs));
        }
        if line.starts_with("hosts:") {
            break;
        }
    }
    (child, namespaces)
}

/// Disconnects the kernel from the subsystem when the test ends, passed or not: a kernel left
/// connected to a stopped target would retry for ten minutes under the other suites.
struct Connected;

impl Connected {
    fn new(extra: &[&str]) -> Connected {
        let mut connect = vec![
            "connect",
            "-t",
            "tcp",
            "-n",
            NQN,
            "-a",
            "127.0.0.1",
            "-s",
            "4420",
            "--hostnqn",
            HOSTNQN,
        ];
        connect.extend_from_slice(extra);
        run(NVME, &connect);
        Connected
    }
}

impl Drop for Connected {
    fn drop(&mut self) {
        let _ = Command::new(NVME).args(["disconnect", "-n", NQN]).output();
    }
}

/// The kernel's block devices of our subsystem, by NSID, once all `count` are there.
fn kernel_namespaces(count: usize) -> HashMap<u32, PathBuf> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut found = HashMap::new();
        for subsys in std::fs::read_dir("/sys/class/nvme-subsystem")
            .into_iter()
            .flatten()
        {
            let dir = subsys.expect("an entry").path();
            let nqn = std::fs::read_to_string(dir.join("subsysnqn")).unwrap_or_default();
            if nqn.trim() != NQN {
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

fn block_bytes(dev: &Path) -> u64 {
    let name = dev
        .file_name()
        .expect("a name")
        .to_string_lossy()
        .into_owned();
    let path = format!("/sys/class/block/{name}/size");
    let sectors: u64 = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .trim()
        .parse()
        .expect("a number");
    sectors * 512
}

/// The kernel's controller device (`/dev/nvme1`) of our subsystem.
fn kernel_controller() -> String {
    for entry in std::fs::read_dir("/sys/class/nvme").expect("/sys/class/nvme") {
        let path = entry.expect("an entry").path();
        let nqn = std::fs::read_to_string(path.join("subsysnqn")).unwrap_or_default();
        if nqn.trim() == NQN {
            let name = path
                .file_name()
                .expect("a name")
                .to_string_lossy()
                .into_owned();
            return format!("/dev/{name}");
        }
    }
    panic!("no kernel controller of {NQN}");
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn the_linux_initiator_reads_back_what_it_wrote_through_usnvme_serve() {
    let bed = VmBed::from_env();
    let addresses: Vec<String> = vfio_controllers()
        .iter()
        .take(EXPORTED)
        .map(|a| a.to_string())
        .collect();
    assert_eq!(
        addresses.len(),
        EXPORTED,
        "the bed has {EXPORTED} vfio drives"
    );
    // each drive's index in the bed (its image file), from its serial number
    let identify: Vec<serde_json::Value> =
        serde_json::from_slice(&bed.usnvme(&["identify", "--json"]).stdout).expect("JSON");
    let index_of: HashMap<String, usize> = identify
        .iter()
        .filter_map(|c| {
            let address = c["address"].as_str()?.to_string();
            Some((address, drive_index(c["serial"].as_str()?)?))
        })
        .collect();

    let (mut target, namespaces) = serve(&bed, &addresses, &[]);
    assert_eq!(namespaces.len(), EXPORTED, "{namespaces:?}");

    let discovered = run(
        NVME,
        &[
            "discover",
            "-t",
            "tcp",
            "-a",
            "127.0.0.1",
            "-s",
            "4420",
            "--hostnqn",
            HOSTNQN,
        ],
    );
    assert!(discovered.contains(NQN), "{discovered}");

    for digests in [&[][..], &["--hdr-digest", "--data-digest"]] {
        let connected = Connected::new(digests);
        let devices = kernel_namespaces(EXPORTED);
        for (nsid, name, bytes) in &namespaces {
            let dev = &devices[nsid];
            assert_eq!(block_bytes(dev), *bytes, "{name} as {}", dev.display());
        }
        let ctrl = kernel_controller();
        let id = run(NVME, &["id-ctrl", &ctrl]);
        assert!(id.contains(NQN), "{id}");
        run(NVME, &["id-ns", &devices[&1].display().to_string()]);
        let smart = run(NVME, &["smart-log", &ctrl]);
        assert!(smart.contains("host_read_commands"), "{smart}");

        // fio's own verification, random and sequential, 4 KiB to 1 MiB, on every namespace
        let mut fio: Vec<String> = [
            "--ioengine=io_uring",
            "--direct=1",
            "--verify=crc32c",
            "--do_verify=1",
            "--iodepth=8",
            &format!("--offset={FIO_OFFSET}"),
            &format!("--size={FIO_SIZE}"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for (nsid, dev) in &devices {
            let (rw, bs) = if nsid % 2 == 0 {
                ("randwrite", "--bsrange=4k-1m")
            } else {
                ("write", "--bs=1m")
            };
            fio.extend([
                format!("--name=ns{nsid}"),
                format!("--filename={}", dev.display()),
                format!("--rw={rw}"),
                bs.to_string(),
            ]);
        }
        let fio_args: Vec<&str> = fio.iter().map(String::as_str).collect();
        let out = run(FIO, &fio_args);
        assert!(!out.contains("verify: bad"), "{out}");

        // a pattern per drive, which the host finds in its image after the run
        for (nsid, name, _) in &namespaces {
            let address = name.split('/').next().unwrap_or(name); // "BDF" or "BDF/nsN"
            let k = index_of[address];
            let data = pattern(0xfab0 + k as u64, CHECKED_LEN);
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(&devices[nsid])
                .expect("the block device opens");
            file.write_all_at(&data, CHECKED_OFFSET).expect("written");
            file.sync_all().expect("synced");
            expect_on_host(k, CHECKED_OFFSET, &data);
        }
        drop(connected);
    }
    signal(&target, "TERM");
    let status = target.wait().expect("serve exits");
    assert_eq!(status.code(), Some(143));
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn a_stripe_of_twelve_drives_is_one_namespace_the_kernel_verifies() {
    let bed = VmBed::from_env();
    let addresses: Vec<String> = vfio_controllers()
        .iter()
        .skip(EXPORTED)
        .take(EXPORTED)
        .map(|a| a.to_string())
        .collect();
    assert_eq!(
        addresses.len(),
        EXPORTED,
        "the bed has {} vfio drives",
        2 * EXPORTED
    );
    let (mut target, namespaces) = serve(&bed, &addresses, &["--stripe", "12:128K"]);
    let [(nsid, name, bytes)] = &namespaces[..] else {
        panic!("one stripe: {namespaces:?}");
    };
    assert_eq!(name, "stripe0");
    let connected = Connected::new(&[]);
    let devices = kernel_namespaces(1);
    let dev = devices[nsid].display().to_string();
    assert_eq!(block_bytes(&devices[nsid]), *bytes);
    // across chunk and drive boundaries: 4k-1m random writes over 64 MiB, each verified
    let out = run(
        FIO,
        &[
            "--name=stripe",
            &format!("--filename={dev}"),
            "--ioengine=io_uring",
            "--direct=1",
            "--rw=randwrite",
            "--bsrange=4k-1m",
            "--iodepth=16",
            "--verify=crc32c",
            "--do_verify=1",
            &format!("--offset={FIO_OFFSET}"),
            "--size=64M",
        ],
    );
    assert!(!out.contains("verify: bad"), "{out}");
    drop(connected);
    signal(&target, "TERM");
    assert_eq!(target.wait().expect("serve exits").code(), Some(143));
}

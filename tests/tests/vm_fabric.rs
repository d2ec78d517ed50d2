//! `usnvme serve` on the bed's vfio drives, reached by the guest kernel's own NVMe/TCP
//! initiator (`nvme discover`, `nvme connect -t tcp` from nvme-cli): the namespaces appear as
//! kernel block devices of the right sizes, nvme-cli's identify and SMART commands answer,
//! fio's verified writes and reads pass with digests off and on, and what the kernel wrote is
//! found at the right offsets of the right drives' images by the host afterwards.

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use usnvme_tests::kernel_host::{
    block_bytes, fio_verifies_at, kernel_namespaces, run, serve, serve_with, sysfs_block,
    Connected, Exported, FIO, HOSTNQN, NVME,
};
use usnvme_tests::{
    drive_index, expect_on_host, expect_stamps_on_host, pattern, signal, vfio_controllers,
    vfio_msix_interrupts, KillOnDrop, VmBed,
};

const NQN: &str = "nqn.2024-01.io.usnvme:vm-fabric";
const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// Drives exported.
const EXPORTED: usize = 12;
/// Where fio works on each namespace, and where the image-checked pattern goes: above what the
/// other suites' checked writes use (vm_driver writes from LBA 8 on).
const FIO_OFFSET: u64 = 256 << 20;
const FIO_SIZE: u64 = 16 << 20;
const CHECKED_OFFSET: u64 = 768 << 20;
const CHECKED_LEN: usize = 64 << 10;

/// The kernel's controller devices (`/dev/nvme1`) of subsystem `nqn`.
fn kernel_controllers(nqn: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/sys/class/nvme").expect("/sys/class/nvme") {
        let path = entry.expect("an entry").path();
        let subsys = std::fs::read_to_string(path.join("subsysnqn")).unwrap_or_default();
        if subsys.trim() == nqn {
            let name = path
                .file_name()
                .expect("a name")
                .to_string_lossy()
                .into_owned();
            found.push(format!("/dev/{name}"));
        }
    }
    found
}

/// The kernel's one controller device of subsystem `nqn`.
fn kernel_controller(nqn: &str) -> String {
    match &kernel_controllers(nqn)[..] {
        [one] => one.clone(),
        other => panic!(
            "the kernel has {} controllers of {nqn}: {other:?}",
            other.len()
        ),
    }
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

    let (mut target, namespaces) = serve(&bed, NQN, &addresses, &[]);
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
        let connected = Connected::new(NQN, digests);
        let devices = kernel_namespaces(NQN, EXPORTED);
        for ns in &namespaces {
            let dev = &devices[&ns.nsid];
            assert_eq!(
                block_bytes(dev),
                ns.bytes,
                "{} as {}",
                ns.name,
                dev.display()
            );
            // named by its UUID, as nvmet's namespaces are (not by the NGUID: `eui.…`)
            let wwid = sysfs_block(dev, "wwid");
            assert_eq!(wwid, format!("uuid.{}", ns.uuid), "{}", ns.name);
            // MDTS 1 MiB: the host sends a 512 KiB or 1 MiB I/O as one command
            let max_kb: u64 = sysfs_block(dev, "queue/max_hw_sectors_kb")
                .parse()
                .expect("a number");
            assert!(max_kb >= 1024, "{}: max_hw_sectors_kb {max_kb}", ns.name);
        }
        let ctrl = kernel_controller(NQN);
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
        for Exported { nsid, name, .. } in &namespaces {
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
    let (mut target, namespaces) = serve(&bed, NQN, &addresses, &["--stripe", "12:128K"]);
    let [Exported {
        nsid, name, bytes, ..
    }] = &namespaces[..]
    else {
        panic!("one stripe: {namespaces:?}");
    };
    assert_eq!(name, "stripe0");
    let connected = Connected::new(NQN, &[]);
    let devices = kernel_namespaces(NQN, 1);
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

/// The kernel's NVMe/TCP target (nvmet-tcp) for `usnvme perf -r tcp://…`: its subsystem, host,
/// namespace and port under configfs.
const NVMET: &str = "/sys/kernel/config/nvmet";
const NVMET_NQN: &str = "nqn.2024-01.io.usnvme:vm-fabric-nvmet";
/// The host the subsystem allows, and one it does not.
const NVMET_HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:75736e76-6d65-4000-8000-6e766d657431";
const OTHER_HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:75736e76-6d65-4000-8000-6e766d657432";
/// Not 4420, where `usnvme serve` listens in the tests above; the port's configfs name is any
/// number not taken.
const NVMET_PORT: u16 = 4431;
const NVMET_PORT_ID: u32 = 31;
/// The drive exported (4 KiB blocks, node 1); vm_setup moves usnvme21 the same way.
const NVMET_SERIAL: &str = "usnvme23";
/// Where perf writes and reads on it: clear of the writes the host checks in this drive's image
/// (vm_driver's from LBA 8 to 2 MiB, vm_reliability's stamps from 896 MiB), of fio's region
/// above and of vm_reliability's unchecked reset run at 512 MiB.
const PERF_OFFSET: u64 = 576 << 20;
const PERF_SIZE: u64 = 8 << 20;
/// The random mix with digests gets its own region, so that its stamps (another seed) leave the
/// first region's stamps whole.
const MIX_OFFSET: u64 = 592 << 20;
const MIX_SIZE: u64 = 4 << 20;

/// The test bed loads the kernel nvme driver only when it leaves drives on it, and the guest
/// has no modprobe: load it from the initramfs, as its /init does (as vm_setup does). The other
/// drives keep their vfio-pci driver_override, so it claims none of them.
fn load_nvme_driver() {
    if Path::new("/sys/bus/pci/drivers/nvme").is_dir() {
        return;
    }
    for module in ["nvme-core.ko", "nvme.ko"] {
        if module == "nvme-core.ko" && Path::new("/sys/module/nvme_core").is_dir() {
            continue;
        }
        let path = format!("/proc/1/root/mods/{module}");
        run("busybox", &["insmod", &path]);
    }
}

/// Puts the drive back on vfio-pci when the test ends, passed or not: the suites share drives.
struct OnVfio<'a> {
    bed: &'a VmBed,
    address: String,
}

impl Drop for OnVfio<'_> {
    fn drop(&mut self) {
        let _ = self.bed.usnvme(&["setup", "bind", &self.address]);
    }
}

/// Moves the drive at `address` to the kernel's nvme driver; returns the guard that puts it
/// back on vfio-pci and its block device.
fn on_kernel_nvme<'a>(bed: &'a VmBed, address: &str) -> (OnVfio<'a>, PathBuf) {
    load_nvme_driver();
    let on_vfio = OnVfio {
        bed,
        address: address.to_owned(),
    };
    let (code, stdout, stderr) = usnvme(bed, &["setup", "reset", address]);
    assert_eq!(code, Some(0), "setup reset {address}: {stdout}{stderr}");
    // (a hang guard: the kernel probes a drive in a second or two, under emulation too)
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let list: Vec<serde_json::Value> =
            serde_json::from_slice(&bed.usnvme(&["list", "--json"]).stdout).expect("JSON");
        let disk = list
            .iter()
            .filter(|c| c["address"] == address)
            .flat_map(|c| c["block_devices"].as_array().cloned().unwrap_or_default())
            .find_map(|b| b["name"].as_str().map(str::to_owned));
        if let Some(disk) = disk {
            return (on_vfio, PathBuf::from("/dev").join(disk));
        }
        assert!(
            Instant::now() < deadline,
            "no block device on {address} 60 s after it went to nvme"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The PCI address of the bed's drive with serial number `serial`, on vfio-pci.
fn address_of(bed: &VmBed, serial: &str) -> String {
    let identify: Vec<serde_json::Value> =
        serde_json::from_slice(&bed.usnvme(&["identify", "--json"]).stdout).expect("JSON");
    identify
        .iter()
        .find(|c| c["serial"].as_str().map(str::trim) == Some(serial))
        .and_then(|c| c["address"].as_str())
        .unwrap_or_else(|| panic!("no drive with serial {serial} on vfio-pci"))
        .to_owned()
}

/// The nvmet-tcp configuration, removed (in reverse order) when the test ends, passed or not,
/// so that the drive's block device is free to go back to vfio-pci.
struct Nvmet {
    subsystem: PathBuf,
    host: PathBuf,
    port: PathBuf,
}

fn write_attr(dir: &Path, name: &str, value: &str) {
    let path = dir.join(name);
    std::fs::write(&path, value)
        .unwrap_or_else(|e| panic!("echo {value} > {}: {e}", path.display()));
}

impl Nvmet {
    /// Subsystem NVMET_NQN with namespace 1 on `dev`, allowing NVMET_HOSTNQN only, on a TCP port
    /// on loopback.
    fn new(dev: &Path) -> Nvmet {
        let root = Path::new(NVMET);
        assert!(
            root.is_dir() && Path::new("/sys/module/nvmet_tcp").is_dir(),
            "no nvmet-tcp: the guest's /init loads nvmet.ko and nvmet-tcp.ko and mounts configfs"
        );
        let t = Nvmet {
            subsystem: root.join("subsystems").join(NVMET_NQN),
            host: root.join("hosts").join(NVMET_HOSTNQN),
            port: root.join("ports").join(NVMET_PORT_ID.to_string()),
        };
        let mkdir = |dir: &Path| {
            std::fs::create_dir(dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()))
        };
        let symlink = |target: &Path, link: &Path| {
            std::os::unix::fs::symlink(target, link)
                .unwrap_or_else(|e| panic!("ln -s {} {}: {e}", target.display(), link.display()))
        };
        // a step that fails panics, and `t` tears down what the steps before it made
        mkdir(&t.subsystem);
        write_attr(&t.subsystem, "attr_allow_any_host", "0");
        mkdir(&t.host);
        symlink(
            &t.host,
            &t.subsystem.join("allowed_hosts").join(NVMET_HOSTNQN),
        );
        let ns = t.subsystem.join("namespaces/1");
        mkdir(&ns);
        write_attr(&ns, "device_path", &dev.display().to_string());
        write_attr(&ns, "enable", "1");
        mkdir(&t.port);
        for (name, value) in [
            ("addr_trtype", "tcp"),
            ("addr_adrfam", "ipv4"),
            ("addr_traddr", "127.0.0.1"),
            ("addr_trsvcid", &NVMET_PORT.to_string()),
        ] {
            write_attr(&t.port, name, value);
        }
        symlink(&t.subsystem, &t.port.join("subsystems").join(NVMET_NQN));
        t
    }
}

impl Drop for Nvmet {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.port.join("subsystems").join(NVMET_NQN));
        let _ = std::fs::remove_dir(&self.port);
        let ns = self.subsystem.join("namespaces/1");
        let _ = std::fs::write(ns.join("enable"), "0");
        let _ = std::fs::remove_dir(&ns);
        let _ = std::fs::remove_file(self.subsystem.join("allowed_hosts").join(NVMET_HOSTNQN));
        let _ = std::fs::remove_dir(&self.subsystem);
        let _ = std::fs::remove_dir(&self.host);
    }
}

/// `usnvme ARGS`: its exit code, standard output and standard error.
fn usnvme(bed: &VmBed, args: &[&str]) -> (Option<i32>, String, String) {
    let out = bed.usnvme(args);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `usnvme perf -r tcp://…/NVMET_NQN` with `args`, which must exit 0; returns its JSON report.
fn perf_nvmet(bed: &VmBed, tag: &str, args: &[&str]) -> serde_json::Value {
    let json = std::env::temp_dir().join(format!("perf-nvmet-{tag}.json"));
    let target = format!("tcp://127.0.0.1:{NVMET_PORT}/{NVMET_NQN}");
    let mut all = vec![
        "perf",
        "-r",
        &target,
        "--hostnqn",
        NVMET_HOSTNQN,
        "-c",
        "0",
        "--json",
        json.to_str().expect("utf-8"),
    ];
    all.extend_from_slice(args);
    let (code, stdout, stderr) = usnvme(bed, &all);
    assert_eq!(code, Some(0), "usnvme {all:?}\n{stdout}\n{stderr}");
    // a read pass that found no block of the seed's run would pass without checking anything
    assert!(!stderr.contains("checked no block"), "{all:?}: {stderr}");
    let text = std::fs::read_to_string(&json).expect("perf wrote its JSON");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("perf's JSON parses");
    let total = &doc["total"];
    assert_eq!(total["error"], 0, "{all:?}: {total:#}");
    assert_eq!(total["failed_ios"], 0, "{all:?}: {total:#}");
    doc
}

fn total_ios(doc: &serde_json::Value, dir: &str) -> u64 {
    doc["total"][dir]["total_ios"]
        .as_u64()
        .unwrap_or_else(|| panic!("no total.{dir}.total_ios in {doc:#}"))
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn usnvme_perf_verifies_through_the_kernels_nvmet_tcp_target() {
    let bed = VmBed::from_env();
    // the drive's address, from its serial (its image is nvme23.img)
    let address = address_of(&bed, NVMET_SERIAL);
    let drive = drive_index(NVMET_SERIAL).expect("a bed serial");
    let block_size = bed.block_size_of(drive);
    assert_eq!(block_size, 4096, "drives 12-23 have 4 KiB blocks");

    // onto the kernel nvme driver, whose block device nvmet exports
    let (on_vfio, dev) = on_kernel_nvme(&bed, &address);

    // declared after the drive's guard: dropped first, freeing the block device
    let nvmet = Nvmet::new(&dev);
    let seed = 0x6e76_6d65_7431u64;
    let (offset, size) = (PERF_OFFSET.to_string(), PERF_SIZE.to_string());
    // One reactor, 128 KiB writes (beyond nvmet's in-capsule size: R2T and H2CData), exactly as
    // many as cover the region once: every block of it carries this run's stamp.
    // Then read back with the same seed: every block checked (a mismatch exits 1).
    let ios = PERF_SIZE / (128 << 10);
    let (count, seed_text) = (ios.to_string(), seed.to_string());
    for (pattern, other) in [("write", "read"), ("read", "write")] {
        let args = [
            "-w",
            pattern,
            "-o",
            "128k",
            "-q",
            "8",
            "--io-count",
            &count,
            "--offset",
            &offset,
            "--size",
            &size,
            "--verify",
            "--seed",
            &seed_text,
        ];
        let run = perf_nvmet(&bed, pattern, &args);
        assert_eq!(total_ios(&run, pattern), ios, "{pattern}");
        assert_eq!(total_ios(&run, other), 0, "{pattern}");
        if pattern == "write" {
            // nvmet writes the bdev with direct bios: a flush makes the drive (QEMU) write
            // its image
            std::fs::File::open(&dev)
                .and_then(|f| f.sync_all())
                .unwrap_or_else(|e| panic!("flushing {}: {e}", dev.display()));
            expect_stamps_on_host(drive, PERF_OFFSET, PERF_SIZE, block_size, seed, true);
        }
    }

    // With header and data digests: random 4 KiB reads of the same blocks, and a random mix in
    // a region of its own (in-capsule writes).
    let randread = perf_nvmet(
        &bed,
        "randread-digests",
        &[
            "-w",
            "randread",
            "-o",
            "4k",
            "-q",
            "16",
            "-t",
            "2",
            "--offset",
            &offset,
            "--size",
            &size,
            "--hdr-digest",
            "--data-digest",
            "--verify",
            "--seed",
            &seed.to_string(),
        ],
    );
    assert!(total_ios(&randread, "read") > 0, "{randread:#}");
    let mix_seed = seed + 1;
    let mix = perf_nvmet(
        &bed,
        "randrw-digests",
        &[
            "-w",
            "randrw",
            "-o",
            "4k",
            "-q",
            "16",
            "-t",
            "2",
            "--offset",
            &MIX_OFFSET.to_string(),
            "--size",
            &MIX_SIZE.to_string(),
            "--hdr-digest",
            "--data-digest",
            "--verify",
            "--seed",
            &mix_seed.to_string(),
        ],
    );
    assert!(
        total_ios(&mix, "read") > 0 && total_ios(&mix, "write") > 0,
        "{mix:#}"
    );
    std::fs::File::open(&dev)
        .and_then(|f| f.sync_all())
        .unwrap_or_else(|e| panic!("flushing {}: {e}", dev.display()));
    expect_stamps_on_host(drive, MIX_OFFSET, MIX_SIZE, block_size, mix_seed, false);

    // What the target refuses, each said on one line: a subsystem it does not have, a host the
    // subsystem does not allow.
    let wrong = format!("tcp://127.0.0.1:{NVMET_PORT}/nqn.2024-01.io.usnvme:wrong");
    let (code, _, stderr) = usnvme(
        &bed,
        &["perf", "-r", &wrong, "--hostnqn", NVMET_HOSTNQN, "-t", "1"],
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("unknown NQN"), "{stderr}");
    let right = format!("tcp://127.0.0.1:{NVMET_PORT}/{NVMET_NQN}");
    let (code, _, stderr) = usnvme(
        &bed,
        &["perf", "-r", &right, "--hostnqn", OTHER_HOSTNQN, "-t", "1"],
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("host not allowed") && stderr.contains(OTHER_HOSTNQN),
        "{stderr}"
    );

    // The teardown the guards do on failure, here checked: nothing of ours left in configfs,
    // the drive back on vfio-pci for the suites after this one.
    let ours = [
        nvmet.port.clone(),
        nvmet.subsystem.clone(),
        nvmet.host.clone(),
    ];
    drop(nvmet);
    for dir in &ours {
        assert!(
            !dir.exists(),
            "{} is left after the teardown",
            dir.display()
        );
    }
    drop(on_vfio);
    assert!(
        vfio_controllers().iter().any(|a| a.to_string() == address),
        "{address} is not back on vfio-pci"
    );
}

/// Where the connect-all test's fio works on each namespace: apart from what the other tests
/// of this suite write (and check) there.
const CONNECT_ALL_OFFSET: u64 = 640 << 20;
const CONNECT_ALL_SIZE: u64 = 8 << 20;

/// `nvme ARGS -o json`, parsed.
fn nvme_json(args: &[&str]) -> serde_json::Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    let text = run(NVME, &all);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("nvme {all:?}: {e}: {text}"))
}

/// Disconnects every fabrics controller when the test ends, passed or not.
struct AllConnected;

impl Drop for AllConnected {
    fn drop(&mut self) {
        let _ = Command::new(NVME).arg("disconnect-all").output();
    }
}

/// What a new user of NVMe/TCP runs (issue 23): `nvme discover` and `nvme connect-all`
/// against `usnvme serve` and against the kernel's nvmet-tcp in one boot, with digests off and
/// on; fio verifies through every namespace attached; `nvme list-subsys`, `id-ctrl` and
/// `smart-log` answer; and the fields a host reads agree, target against target (nvmet is the
/// reference). `nvme disconnect-all` leaves nothing connected.
#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn nvme_connect_all_attaches_usnvme_serve_and_nvmet_alike() {
    let bed = VmBed::from_env();
    let address = address_of(&bed, NVMET_SERIAL);
    let (on_vfio, dev) = on_kernel_nvme(&bed, &address);
    let nvmet = Nvmet::new(&dev);
    let exported: Vec<String> = vfio_controllers()
        .iter()
        .take(2)
        .map(|a| a.to_string())
        .collect();
    let (mut target, namespaces) = serve(&bed, NQN, &exported, &[]);
    assert_eq!(namespaces.len(), 2, "{namespaces:?}");
    let nvmet_port = NVMET_PORT.to_string();
    // (subsystem, port, host allowed there, namespaces)
    let targets = [
        (NQN, "4420", HOSTNQN, 2),
        (NVMET_NQN, nvmet_port.as_str(), NVMET_HOSTNQN, 1),
    ];

    // The discovery logs, field by field: what libnvme decides from (treq: whether to ask for
    // TLS; subtype: which records to connect) must read the same.
    let logs: Vec<serde_json::Value> = targets
        .iter()
        .map(|(_, port, host, _)| {
            nvme_json(&[
                "discover",
                "-t",
                "tcp",
                "-a",
                "127.0.0.1",
                "-s",
                port,
                "--hostnqn",
                host,
            ])
        })
        .collect();
    let records: Vec<&Vec<serde_json::Value>> = logs
        .iter()
        .map(|l| l["records"].as_array().expect("records"))
        .collect();
    assert_eq!(records[0].len(), records[1].len(), "{logs:#?}");
    for (ours, theirs) in records[0].iter().zip(records[1].iter()) {
        for field in [
            "trtype", "adrfam", "subtype", "treq", "traddr", "eflags", "sectype",
        ] {
            assert_eq!(
                ours[field], theirs[field],
                "discovery log {field}: usnvme serve vs nvmet\n{logs:#?}"
            );
        }
    }
    assert_eq!(records[0][0]["subnqn"], DISCOVERY_NQN, "{logs:#?}");
    assert_eq!(records[0][1]["subnqn"], NQN, "{logs:#?}");

    let mut id_ctrls = Vec::new();
    for digests in [&[][..], &["--hdr-digest", "--data-digest"]] {
        for (nqn, port, host, count) in targets {
            let connected = AllConnected;
            let mut args = vec![
                "connect-all",
                "-t",
                "tcp",
                "-a",
                "127.0.0.1",
                "-s",
                port,
                "--hostnqn",
                host,
            ];
            args.extend_from_slice(digests);
            run(NVME, &args);
            let devices = kernel_namespaces(nqn, count);
            let ctrl = kernel_controller(nqn);

            let subsystems = nvme_json(&["list-subsys"]).to_string();
            assert!(
                subsystems.contains(nqn)
                    && subsystems.contains("tcp")
                    && subsystems.contains("live"),
                "{nqn} is not a live tcp path in nvme list-subsys: {subsystems}"
            );
            if digests.is_empty() {
                id_ctrls.push(nvme_json(&["id-ctrl", &ctrl]));
            }
            let smart = nvme_json(&["smart-log", &ctrl]);
            assert!(
                smart.get("critical_warning").is_some() && smart.get("data_units_read").is_some(),
                "{smart:#}"
            );

            // fio's own verification through every namespace the kernel attached
            let mut fio: Vec<String> = [
                "--ioengine=io_uring",
                "--direct=1",
                "--verify=crc32c",
                "--do_verify=1",
                "--iodepth=8",
                "--rw=randwrite",
                "--bsrange=4k-128k",
                &format!("--offset={CONNECT_ALL_OFFSET}"),
                &format!("--size={CONNECT_ALL_SIZE}"),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            for (nsid, dev) in &devices {
                fio.extend([
                    format!("--name=ns{nsid}"),
                    format!("--filename={}", dev.display()),
                ]);
            }
            let fio_args: Vec<&str> = fio.iter().map(String::as_str).collect();
            let out = run(FIO, &fio_args);
            assert!(!out.contains("verify: bad"), "{nqn} {digests:?}: {out}");

            run(NVME, &["disconnect-all"]);
            assert!(
                kernel_controllers(nqn).is_empty(),
                "{nqn} still connected after nvme disconnect-all"
            );
            drop(connected);
        }
    }

    // Identify Controller: the fields the Linux host checks or sizes itself by, target against
    // target (what nvmet sets them to, and why, in drivers/nvme/target/admin-cmd.c).
    let (ours, theirs) = (&id_ctrls[0], &id_ctrls[1]);
    for field in [
        "cntrltype", // 1: an I/O controller
        "icdoff",    // in-capsule data right after the SQE
        "iorcsz",    // 16-byte responses
        "fcatt",     // the dynamic controller model
        "msdbd",     // one SGL descriptor per command
    ] {
        assert_eq!(
            ours[field], theirs[field],
            "id-ctrl {field}: usnvme serve vs nvmet\n{ours:#}\n{theirs:#}"
        );
    }
    for (name, id) in [("usnvme serve", ours), ("nvmet", theirs)] {
        let sgls = id["sgls"].as_u64().unwrap_or(0);
        assert_eq!(sgls & 1, 1, "{name}: SGLs supported: {id:#}");
        assert!(
            id["kas"].as_u64() > Some(0),
            "{name}: a Keep Alive granularity"
        );
        assert!(id["maxcmd"].as_u64() > Some(0), "{name}: MAXCMD");
        assert!(
            id["ver"].as_u64() >= Some(0x10300),
            "{name}: NVMe 1.3 or later"
        );
    }
    assert_eq!(ours["subnqn"], NQN);
    assert_eq!(theirs["subnqn"], NVMET_NQN);

    signal(&target, "TERM");
    let status = target.wait().expect("serve exits");
    assert_eq!(status.code(), Some(143));
    drop(nvmet);
    drop(on_vfio);
}

/// The multipath test's subsystem, drive and region (clear of the other tests' checked ones).
const MULTIPATH_NQN: &str = "nqn.2024-01.io.usnvme:vm-fabric-multipath";
const MULTIPATH_DRIVE: usize = 2;
const MULTIPATH_OFFSET: u64 = 640 << 20;
const MULTIPATH_SIZE: &str = "96M";

/// The kernel's path devices of subsystem `nqn` (`nvme3c4n1`), each with its controller's
/// port (trsvcid).
fn kernel_paths(nqn: &str) -> Vec<(String, String)> {
    let mut paths = Vec::new();
    for ctrl in kernel_controllers(nqn) {
        let name = ctrl.trim_start_matches("/dev/");
        let dir = Path::new("/sys/class/nvme").join(name);
        let address = std::fs::read_to_string(dir.join("address")).unwrap_or_default();
        let port = address
            .split(',')
            .find_map(|kv| kv.trim().strip_prefix("trsvcid="))
            .unwrap_or_default()
            .to_string();
        for entry in std::fs::read_dir(&dir).into_iter().flatten() {
            let path = entry
                .expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned();
            if path.starts_with("nvme") && path.contains('c') && path.ends_with("n1") {
                paths.push((path, port.clone()));
            }
        }
    }
    paths.sort();
    paths
}

/// A path device's sysfs attribute.
fn path_attr(path: &str, attr: &str) -> String {
    std::fs::read_to_string(Path::new("/sys/block").join(path).join(attr))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Reads and writes completed through a path device so far.
fn path_ios(path: &str) -> u64 {
    let stat = path_attr(path, "stat");
    let fields: Vec<u64> = stat
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    fields.first().copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0)
}

/// Waits (at most 60 s) until `done`.
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "after 60 s still not {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn linux_multipath_sees_both_ports_and_moves_io_off_one_made_inaccessible() {
    let bed = VmBed::from_env();
    let address = vfio_controllers()[MULTIPATH_DRIVE].to_string();
    let states = std::env::temp_dir().join("usnvme-vm-ana-states");
    std::fs::write(&states, "").expect("state file");
    let states_arg = states.display().to_string();
    let (mut target, namespaces) = serve(
        &bed,
        MULTIPATH_NQN,
        &[address],
        &[
            "--listen",
            "127.0.0.1:4420",
            "--listen",
            "127.0.0.1:4421",
            "--ana-state-file",
            &states_arg,
        ],
    );
    assert_eq!(namespaces.len(), 1, "{namespaces:?}");
    let first = Connected::to_port(MULTIPATH_NQN, 4420, &[]);
    let second = Connected::to_port(MULTIPATH_NQN, 4421, &[]);
    let head = kernel_namespaces(MULTIPATH_NQN, 1)[&1]
        .display()
        .to_string();
    // one subsystem, one head, two live optimized paths
    wait_until("two paths", || kernel_paths(MULTIPATH_NQN).len() == 2);
    let paths = kernel_paths(MULTIPATH_NQN);
    for (path, _) in &paths {
        assert_eq!(path_attr(path, "ana_state"), "optimized", "{paths:?}");
    }
    let subsys = run(NVME, &["list-subsys"]);
    assert!(
        subsys.contains("trsvcid=4420")
            && subsys.contains("trsvcid=4421")
            && subsys.matches("live").count() >= 2,
        "{subsys}"
    );
    // fio writes and verifies through the head; once I/O flows on a path, that path's port
    // becomes inaccessible: the rest goes the other way, nothing lost
    let fio = Command::new(FIO)
        .args([
            "--name=multipath",
            &format!("--filename={head}"),
            "--ioengine=io_uring",
            "--direct=1",
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=8",
            "--verify=crc32c",
            "--do_verify=1",
            &format!("--offset={MULTIPATH_OFFSET}"),
            &format!("--size={MULTIPATH_SIZE}"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fio runs");
    let before: Vec<u64> = paths.iter().map(|(p, _)| path_ios(p)).collect();
    wait_until("I/O on a path", || {
        paths
            .iter()
            .zip(&before)
            .any(|((p, _), b)| path_ios(p) > *b)
    });
    let busy = paths
        .iter()
        .zip(&before)
        .position(|((p, _), b)| path_ios(p) > *b)
        .expect("a busy path");
    let (off, other) = (&paths[busy], &paths[1 - busy]);
    let other_before = path_ios(&other.0);
    std::fs::write(&states, format!("127.0.0.1:{} inaccessible\n", off.1)).expect("state file");
    wait_until("the kernel sees the path inaccessible", || {
        path_attr(&off.0, "ana_state") == "inaccessible"
    });
    let out = fio.wait_with_output().expect("fio ends");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && !text.contains("verify: bad"),
        "{text}"
    );
    assert!(
        path_ios(&other.0) > other_before,
        "the other path took the I/O: {paths:?}"
    );
    drop((first, second));
    signal(&target, "TERM");
    assert_eq!(target.wait().expect("serve exits").code(), Some(143));
    let _ = std::fs::remove_file(&states);
}

/// The reconnect test's subsystem, drive and region (clear of the other tests' checked ones).
const RECONNECT_NQN: &str = "nqn.2024-01.io.usnvme:vm-fabric-reconnect";
const RECONNECT_DRIVE: usize = 3;
const RECONNECT_OFFSET: &str = "640M";
/// 1024 I/Os of 4 KiB: every block of the region once.
const RECONNECT_SIZE: u64 = 4 << 20;

/// `usnvme perf` over NVMe/TCP on the reconnect test's region: a pass of `workload` over
/// every block of it once, verified with one seed, reconnecting after 1 s for up to 60 s.
fn reconnecting_perf(bed: &VmBed, workload: &str, json: &Path, extra: &[&str]) -> Command {
    let target = format!("tcp://127.0.0.1:4420/{RECONNECT_NQN}");
    let mut cmd = Command::new(&bed.usnvme);
    cmd.args([
        "perf",
        "-r",
        &target,
        "--hostnqn",
        HOSTNQN,
        "-c",
        "1",
        "-w",
        workload,
    ])
    .args([
        "--verify", "--seed", "21", "-o", "4k", "-q", "8", "--offset",
    ])
    .args([RECONNECT_OFFSET, "--size", "4M", "--io-count", "1024"])
    .args(["--reconnect-delay", "1", "--ctrl-loss-tmo", "60", "--json"])
    .arg(json)
    .args(extra)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    cmd
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn usnvme_perf_over_tcp_runs_on_when_its_target_is_killed_and_restarted() {
    let bed = VmBed::from_env();
    let address = vfio_controllers()[RECONNECT_DRIVE].to_string();
    let status = std::env::temp_dir().join("usnvme-vm-reconnect-status.json");
    let status_arg = status.display().to_string();
    let serve_args = [
        "-c",
        "0",
        "--json-status",
        &status_arg,
        "--json-status-every",
        "0.1",
    ];
    let (mut target, namespaces) = serve(
        &bed,
        RECONNECT_NQN,
        std::slice::from_ref(&address),
        &serve_args,
    );
    assert_eq!(namespaces.len(), 1, "{namespaces:?}");
    let json = std::env::temp_dir().join("perf-reconnect.json");
    // the write pass, slowed to ~10 s (100 IOPS) so the target can die in the middle of it
    let perf = reconnecting_perf(&bed, "write", &json, &["--rate", "100"])
        .spawn()
        .expect("usnvme perf runs");
    wait_until("perf's writes flowing through serve", || {
        std::fs::read(&status)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .is_some_and(|s| s["commands"].as_u64() >= Some(50))
    });
    target.kill().expect("SIGKILL"); // no clean shutdown: the host sees its connections reset
    target.wait().expect("serve ends");
    let (mut target, _) = serve(&bed, RECONNECT_NQN, &[address], &serve_args);
    let out = perf.wait_with_output().expect("perf ends");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("perf's JSON")).expect("JSON");
    let total = &doc["total"];
    assert_eq!(total["failed_ios"], 0, "{text}");
    assert_eq!(total["reconnects"], 1, "{text}");
    assert_eq!(total_ios(&doc, "write"), 1024, "{text}");
    assert!(text.contains("reconnected 1 time(s)"), "{text}");

    // every block of the region reads back as written: none lost in the reconnect (it would
    // read as zeroes, unchecked), none misplaced (a mismatch)
    let out = reconnecting_perf(&bed, "read", &json, &[])
        .output()
        .expect("usnvme perf runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("perf's JSON")).expect("JSON");
    // the bed's drives have QEMU's 512-byte blocks
    assert_eq!(doc["verified_blocks"], RECONNECT_SIZE / 512, "{text}");
    signal(&target, "TERM");
    assert_eq!(target.wait().expect("serve exits").code(), Some(143));
    let _ = std::fs::remove_file(&status);
}

const INTERRUPT_NQN: &str = "nqn.2024-01.io.usnvme:vm-fabric-interrupt";
const INTERRUPT_DRIVE: usize = 7;
const INTERRUPT_OFFSET: u64 = 704 << 20;

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn serve_on_interrupts_sleeps_while_the_drive_works_and_fio_verifies() {
    let bed = VmBed::from_env();
    let address = vfio_controllers()[INTERRUPT_DRIVE].to_string();
    let status = std::env::temp_dir().join("usnvme-vm-interrupt-status.json");
    let status_arg = status.display().to_string();
    let serve_args = [
        "-c",
        "0",
        "--idle",
        "interrupt",
        "--json-status",
        &status_arg,
        "--json-status-every",
        "0.1",
    ];
    let (target, namespaces) = serve(&bed, INTERRUPT_NQN, &[address], &serve_args);
    let mut target = KillOnDrop(target);
    assert_eq!(namespaces.len(), 1, "{namespaces:?}");
    let read_status = || -> serde_json::Value {
        let bytes = std::fs::read(&status).expect("serve's status");
        serde_json::from_slice(&bytes).expect("serve's status is JSON")
    };
    let connected = Connected::new(INTERRUPT_NQN, &[]);
    let dev = kernel_namespaces(INTERRUPT_NQN, 1)[&1].clone();
    let (before, interrupts_before) = (read_status(), vfio_msix_interrupts());
    // one I/O at a time: the reactor has I/O in flight nearly all along
    let out = run(
        FIO,
        &[
            "--name=interrupt",
            &format!("--filename={}", dev.display()),
            "--ioengine=io_uring",
            "--direct=1",
            "--rw=randwrite",
            "--bs=4k",
            &format!("--offset={INTERRUPT_OFFSET}"),
            "--size=4m",
            "--iodepth=1",
            "--verify=crc32c",
            "--do_verify=1",
        ],
    );
    assert!(!out.contains("verify: bad"), "{out}");
    let (after, interrupts_after) = (read_status(), vfio_msix_interrupts());
    let delta = |key: &str| {
        after[key].as_f64().expect("a figure") - before[key].as_f64().expect("a figure")
    };
    let (cpu, time) = (delta("reactor_cpu_seconds"), delta("reactor_seconds"));
    println!(
        "interrupt mode, fio QD 1 through the kernel host: {} commands, the reactor used {cpu:.2} s of CPU in {time:.2} s; {} MSI-X interrupts",
        delta("commands"),
        interrupts_after - interrupts_before
    );
    assert!(
        interrupts_after > interrupts_before,
        "the drive raised no MSI-X interrupt"
    );
    // a polling reactor is on the CPU all the time; this one does the TCP work of each I/O
    // (about half its time in the bed's emulator) and sleeps while the drive works
    assert!(cpu < time * 0.8, "{cpu} s of CPU in {time} s: {after}");
    drop(connected);
    signal(&target.0, "INT");
    assert_eq!(target.0.wait().expect("serve ends").code(), Some(130));
}

const KEEP_ALIVE_NQN: &str = "nqn.2024-01.io.usnvme:vm-fabric-keep-alive";
const KEEP_ALIVE_DRIVE: usize = 8;
const KEEP_ALIVE_OFFSET: u64 = 720 << 20;

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn a_kernel_host_whose_keep_alive_comes_late_is_kept_while_its_io_flows() {
    let bed = VmBed::from_env();
    let address = vfio_controllers()[KEEP_ALIVE_DRIVE].to_string();
    let (target, namespaces) = serve(&bed, KEEP_ALIVE_NQN, &[address], &[]);
    let mut target = KillOnDrop(target);
    assert_eq!(namespaces.len(), 1, "{namespaces:?}");
    // KATO 1 s, the shortest there is. The target's Keep Alive timer is traffic based
    // (CTRATT.TBKAS), so the kernel sends no Keep Alive in a period its I/O completed in, and
    // the emulated drive's slow I/O and the emulator's busy admin path make any it sends late:
    // the I/O alone must keep the association.
    let connected = Connected::new(KEEP_ALIVE_NQN, &["--keep-alive-tmo=1"]);
    let dev = kernel_namespaces(KEEP_ALIVE_NQN, 1)[&1].clone();
    let ctrl = kernel_controller(KEEP_ALIVE_NQN);
    let sysfs = Path::new("/sys/class/nvme").join(ctrl.trim_start_matches("/dev/"));
    let attr = |name: &str| {
        std::fs::read_to_string(sysfs.join(name))
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    let id = run(NVME, &["id-ctrl", &ctrl, "--output-format=json"]);
    let ctratt = serde_json::from_str::<serde_json::Value>(&id).expect("id-ctrl JSON")["ctratt"]
        .as_u64()
        .expect("ctratt");
    assert_ne!(ctratt & (1 << 6), 0, "the target advertises TBKAS: {id}");
    let cntlid = attr("cntlid");
    // 20 s of verified random writes and reads, many Keep Alive timeouts long
    let out = run(
        FIO,
        &[
            "--name=keep-alive",
            &format!("--filename={}", dev.display()),
            "--ioengine=io_uring",
            "--direct=1",
            "--rw=randrw",
            "--bs=4k",
            &format!("--offset={KEEP_ALIVE_OFFSET}"),
            "--size=16m",
            "--iodepth=16",
            "--time_based",
            "--runtime=20",
            "--verify=crc32c",
            "--verify_backlog=256",
        ],
    );
    assert!(!out.contains("verify: bad"), "{out}");
    // never dropped: the same controller (a reconnect gets a new ID), still live
    assert_eq!(attr("state"), "live");
    assert_eq!(attr("cntlid"), cntlid, "the kernel host was reconnected");
    drop(connected);
    signal(&target.0, "INT");
    assert_eq!(target.0.wait().expect("serve ends").code(), Some(130));
}

const CONFIGURED_NQN: &str = "nqn.2024-01.io.usnvme:vm-configured";

/// fio's verified random writes on `dev` (in the fabric suites' region): `runs` of it, one
/// after another, until `done` is set (at least one).
fn fio_until(
    dev: PathBuf,
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    started: std::sync::mpsc::Sender<()>,
) -> usize {
    let mut runs = 0;
    loop {
        fio_verifies_at(&dev, FIO_OFFSET, &FIO_SIZE.to_string());
        runs += 1;
        let _ = started.send(());
        if done.load(std::sync::atomic::Ordering::Acquire) {
            return runs;
        }
    }
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn a_configured_target_changes_under_a_kernel_host_running_fio_and_is_the_same_after_save_and_restart(
) {
    let bed = VmBed::from_env();
    let addresses: Vec<String> = vfio_controllers()
        .iter()
        .take(2)
        .map(|a| a.to_string())
        .collect();
    let config = serde_json::json!({
        "devices": addresses,
        "ports": [{"address": "127.0.0.1:4420"}],
        "subsystems": [{"nqn": CONFIGURED_NQN, "hosts": [HOSTNQN],
                        "namespaces": [{"nsid": 1, "device": addresses[0]}]}]
    });
    let config_file = std::env::temp_dir().join("vm-configured.json");
    std::fs::write(&config_file, config.to_string()).expect("the config written");
    let (control, file) = (
        "/tmp/vm-configured.sock",
        config_file.to_str().expect("UTF-8"),
    );
    let target_args = ["--config", file, "--control", control];
    let (target, exported) = serve_with(&bed, &target_args);
    let mut target = KillOnDrop(target);
    assert_eq!(exported.len(), 1, "{exported:?}");
    let usnvme_target = |args: &[&str]| {
        let mut all = vec!["target", "--socket", control];
        all.extend_from_slice(args);
        let out = bed.usnvme(&all);
        assert!(
            out.status.success(),
            "usnvme target {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let connected = Connected::new(CONFIGURED_NQN, &["--reconnect-delay=1"]);
    let one = kernel_namespaces(CONFIGURED_NQN, 1)[&1].clone();
    let wwid = sysfs_block(&one, "wwid");
    assert_eq!(wwid, format!("uuid.{}", exported[0].uuid));

    // fio verifies on namespace 1 the whole time the subsystem changes
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (started, first_run) = std::sync::mpsc::channel();
    let fio = {
        let (dev, done) = (one.clone(), done.clone());
        std::thread::spawn(move || fio_until(dev, done, started))
    };
    let _ = first_run.recv_timeout(Duration::from_secs(300));
    // a namespace added: the kernel makes its block device without a reconnect
    let added_at = Instant::now();
    let added = usnvme_target(&[
        "namespace",
        "add",
        CONFIGURED_NQN,
        "--device",
        &addresses[1],
    ]);
    assert!(added.starts_with("namespace 2 of"), "{added}");
    let two = kernel_namespaces(CONFIGURED_NQN, 2)[&2].clone();
    let seen_after = added_at.elapsed();
    eprintln!(
        "the kernel host saw namespace 2 {} ms after it was added",
        seen_after.as_millis()
    );
    let data = pattern(0xc0f1, 64 << 10);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&two)
        .expect("opens");
    file.write_all_at(&data, CHECKED_OFFSET).expect("written");
    file.sync_all().expect("synced");
    drop(file);
    // and removed: its block device goes, namespace 1's fio runs on
    let removed_at = Instant::now();
    usnvme_target(&["namespace", "remove", CONFIGURED_NQN, "2"]);
    wait_until("namespace 2 gone from the kernel", || !two.exists());
    eprintln!(
        "the kernel host dropped namespace 2 {} ms after it was removed",
        removed_at.elapsed().as_millis()
    );
    done.store(true, std::sync::atomic::Ordering::Release);
    let runs = fio.join().expect("fio verified every run");
    eprintln!("{runs} verified fio runs on namespace 1 across the changes");

    // saved, the target restarted with it: the kernel reconnects to the same namespace (its
    // head device and wwid as before) and its I/O goes on
    let saved = std::env::temp_dir().join("vm-configured-saved.json");
    usnvme_target(&["save", saved.to_str().expect("UTF-8")]);
    signal(&target.0, "TERM");
    assert_eq!(target.0.wait().expect("serve exits").code(), Some(143));
    let restart_args = [
        "--config",
        saved.to_str().expect("UTF-8"),
        "--control",
        control,
    ];
    let (again, _) = serve_with(&bed, &restart_args);
    target = KillOnDrop(again);
    wait_until("the kernel's controller live again", || {
        kernel_controllers(CONFIGURED_NQN).iter().any(|c| {
            let name = c.trim_start_matches("/dev/");
            std::fs::read_to_string(format!("/sys/class/nvme/{name}/state"))
                .is_ok_and(|s| s.trim() == "live")
        })
    });
    assert!(one.exists(), "the same head device");
    assert_eq!(sysfs_block(&one, "wwid"), wwid);
    let (started, _) = std::sync::mpsc::channel();
    let once = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    assert_eq!(fio_until(one.clone(), once, started), 1);
    // what was written through namespace 2 is on its drive, exported again by a restart
    usnvme_target(&[
        "namespace",
        "add",
        CONFIGURED_NQN,
        "--device",
        &addresses[1],
        "--nsid",
        "2",
    ]);
    let two = kernel_namespaces(CONFIGURED_NQN, 2)[&2].clone();
    let mut back = vec![0u8; data.len()];
    std::fs::File::open(&two)
        .expect("opens")
        .read_exact_at(&mut back, CHECKED_OFFSET)
        .expect("read");
    assert!(back == data, "namespace 2's data is still on its drive");
    drop(connected);
    signal(&target.0, "TERM");
    assert_eq!(target.0.wait().expect("serve exits").code(), Some(143));
}

//! NVMe over RDMA in the guest, on soft-RoCE (`rdma_rxe` on a dummy netdev, `usnvme_tests::rdma`):
//! the Linux kernel's own NVMe/RDMA host (nvme-rdma, through nvme-cli) against its own target
//! (nvmet-rdma, configured over configfs), the bed's RDMA baseline before usnvme's own host and
//! target meet either of them.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use usnvme_tests::kernel_host::{
    block_bytes, fio_verifies, kernel_namespaces, run, Connected, HOSTNQN, NVME,
};
use usnvme_tests::rdma::{counter, or_kernel_log, rdma_address, NvmetRdma, RDMA_DEVICE};

const NQN: &str = "nqn.2024-01.io.usnvme:vm-rdma-nvmet";
/// The port's configfs name: a number no other suite's nvmet port uses (vm_fabric: 31).
const PORT_ID: u32 = 41;
/// NVMe/RDMA's registered port.
const TRSVCID: u16 = 4420;
/// The namespace (a file on the guest's tmpfs) and how much of it fio writes and verifies.
const NAMESPACE_BYTES: u64 = 64 << 20;
const FIO_BYTES: u64 = 32 << 20;

/// The kernel's controllers (`nvme1`) of subsystem `nqn`, from `/sys/class/nvme`.
fn kernel_controllers(nqn: &str) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir("/sys/class/nvme")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| {
            std::fs::read_to_string(e.path().join("subsysnqn")).is_ok_and(|n| n.trim() == nqn)
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    found
}

fn controller_attr(ctrl: &str, attr: &str) -> String {
    let path = format!("/sys/class/nvme/{ctrl}/{attr}");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .trim()
        .to_string()
}

/// `nvme discover -t rdma` of `address`:TRSVCID, as JSON (nvme-cli's standard output only).
fn discover(address: &str) -> serde_json::Value {
    let port = TRSVCID.to_string();
    let args = [
        "discover",
        "-t",
        "rdma",
        "-a",
        address,
        "-s",
        &port,
        "--hostnqn",
        HOSTNQN,
        "-o",
        "json",
    ];
    let out = Command::new(NVME)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {NVME}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "nvme {args:?} ({}): {stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("nvme {args:?}: {e}: {stdout}"))
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn the_kernels_nvme_rdma_host_verifies_fio_through_its_nvmet_rdma_target_on_soft_roce() {
    let address = rdma_address();
    let target = or_kernel_log("nvmet-rdma port", || {
        NvmetRdma::on_file(NQN, NAMESPACE_BYTES, PORT_ID, address, TRSVCID)
    });

    // The discovery controller, over RDMA too, lists the subsystem at the rxe address.
    let log = or_kernel_log("nvme discover -t rdma", || discover(address));
    let records = log["records"].as_array().cloned().unwrap_or_default();
    let entry = records
        .iter()
        .find(|r| r["subnqn"] == NQN)
        .unwrap_or_else(|| panic!("the discovery log has no {NQN}: {log:#}"));
    assert_eq!(entry["trtype"], "rdma", "{entry:#}");
    assert_eq!(entry["adrfam"], "ipv4", "{entry:#}");
    assert_eq!(
        entry["traddr"].as_str().map(str::trim),
        Some(address),
        "{entry:#}"
    );
    assert_eq!(
        entry["trsvcid"].as_str().map(str::trim),
        Some(TRSVCID.to_string().as_str()),
        "{entry:#}"
    );

    let sent = counter("sent_pkts");
    let received = counter("rcvd_pkts");
    let connected = or_kernel_log("nvme connect -t rdma", || {
        Connected::over("rdma", address, TRSVCID, NQN, &[])
    });
    let controllers = kernel_controllers(NQN);
    assert_eq!(controllers.len(), 1, "{controllers:?}");
    let ctrl = &controllers[0];
    assert_eq!(controller_attr(ctrl, "transport"), "rdma");
    let ctrl_address = controller_attr(ctrl, "address");
    assert!(
        ctrl_address.contains(&format!("traddr={address}"))
            && ctrl_address.contains(&format!("trsvcid={TRSVCID}")),
        "{ctrl}: {ctrl_address}"
    );
    let namespaces = or_kernel_log("the namespace over RDMA", || kernel_namespaces(NQN, 1));
    let dev = &namespaces[&1];
    assert_eq!(block_bytes(dev), NAMESPACE_BYTES, "{}", dev.display());

    or_kernel_log("fio --verify=crc32c over nvme-rdma", || {
        fio_verifies(dev, &format!("{}M", FIO_BYTES >> 20))
    });

    // What fio wrote and read back went through rxe: at least twice FIO_BYTES in packets of at
    // most 4 KiB (RoCE's largest MTU), each one sent and received (looped back by rxe).
    let (sent, received) = (counter("sent_pkts") - sent, counter("rcvd_pkts") - received);
    let least = 2 * FIO_BYTES / 4096;
    assert!(
        sent >= least && received >= least,
        "{RDMA_DEVICE} sent {sent} and received {received} packets while fio moved {} MiB: \
         at least {least} each expected",
        (2 * FIO_BYTES) >> 20
    );

    let out = run(NVME, &["disconnect", "-n", NQN]);
    assert!(out.contains("disconnected 1 controller"), "{out}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !kernel_controllers(NQN).is_empty() {
        assert!(
            Instant::now() < deadline,
            "60 s after nvme disconnect the kernel still has {:?}",
            kernel_controllers(NQN)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(connected);

    let file = target.file.clone();
    let configured = [target.port.clone(), target.subsystem.clone()];
    drop(target);
    for path in configured.iter().chain([&file]) {
        assert!(!path.exists(), "{} is left", path.display());
    }
    assert!(Path::new("/sys/kernel/config/nvmet/ports").is_dir());
    eprintln!(
        "nvme-rdma over {RDMA_DEVICE}: fio {} MiB verified ({sent} packets sent, {received} \
         received)",
        FIO_BYTES >> 20
    );
}

/// usnvme's own NVMe/RDMA host against the kernel's target: its own subsystem and port, apart
/// from the kernel host's test above.
const HOST_NQN_SUBSYSTEM: &str = "nqn.2024-01.io.usnvme:vm-rdma-usnvme-host";
const HOST_PORT_ID: u32 = 42;
const HOST_TRSVCID: u16 = 4421;

/// `usnvme ARGS`, which must exit 0: its standard output.
fn usnvme_ok(bed: &usnvme_tests::VmBed, args: &[&str]) -> String {
    let out = bed.usnvme(args);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success(),
        "usnvme {args:?} ({}): {stdout}{stderr}\n{}",
        out.status,
        usnvme_tests::rdma::kernel_log()
    );
    stdout
}

/// `usnvme perf -r TARGET ARGS --json`, which must exit 0 with no failed I/O and every block
/// it read checked: its report.
fn perf_over_rdma(
    bed: &usnvme_tests::VmBed,
    target: &str,
    tag: &str,
    args: &[&str],
) -> serde_json::Value {
    let json = std::env::temp_dir().join(format!("perf-rdma-{tag}.json"));
    let mut all = vec![
        "perf",
        "-r",
        target,
        "-c",
        "0",
        "--json",
        json.to_str().expect("utf-8"),
    ];
    all.extend_from_slice(args);
    let out = bed.usnvme(&all);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "usnvme {all:?} ({}): {stderr}\n{}",
        out.status,
        usnvme_tests::rdma::kernel_log()
    );
    assert!(!stderr.contains("checked no block"), "{all:?}: {stderr}");
    let text = std::fs::read_to_string(&json).expect("perf wrote its JSON");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("perf's JSON parses");
    assert_eq!(doc["total"]["error"], 0, "{all:?}: {doc:#}");
    assert_eq!(doc["total"]["failed_ios"], 0, "{all:?}: {doc:#}");
    doc
}

fn total_ios(doc: &serde_json::Value, dir: &str) -> u64 {
    doc["total"][dir]["total_ios"]
        .as_u64()
        .unwrap_or_else(|| panic!("no total.{dir}.total_ios in {doc:#}"))
}

/// `usnvme perf` over RDMA on `target`'s `namespaces`: 128 KiB writes of each one's first `size`
/// bytes, every block once (keyed: the target reads them), then read back (the target writes
/// them) and checked with the same `seed`.
fn write_then_read_back(
    bed: &usnvme_tests::VmBed,
    target: &str,
    tag: &str,
    namespaces: u64,
    size: u64,
    seed: u64,
) {
    // (--io-count is per device: each namespace's region once)
    let per_namespace = size / (128 << 10);
    let ios = namespaces * per_namespace;
    let (count, seed, size) = (
        per_namespace.to_string(),
        seed.to_string(),
        size.to_string(),
    );
    for (pattern, other) in [("write", "read"), ("read", "write")] {
        let run = perf_over_rdma(
            bed,
            target,
            &format!("{tag}-{pattern}"),
            &[
                "-w",
                pattern,
                "-o",
                "128k",
                "-q",
                "8",
                "--io-count",
                &count,
                "--size",
                &size,
                "--verify",
                "--seed",
                &seed,
            ],
        );
        assert_eq!(total_ios(&run, pattern), ios, "{pattern}");
        assert_eq!(total_ios(&run, other), 0, "{pattern}");
    }
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn usnvme_perf_verifies_over_rdma_through_the_kernels_nvmet_rdma_target() {
    let bed = usnvme_tests::VmBed::from_env();
    let address = rdma_address();
    let nvmet = or_kernel_log("nvmet-rdma port", || {
        NvmetRdma::on_file(
            HOST_NQN_SUBSYSTEM,
            NAMESPACE_BYTES,
            HOST_PORT_ID,
            address,
            HOST_TRSVCID,
        )
    });
    let target = format!("rdma://{address}:{HOST_TRSVCID}/{HOST_NQN_SUBSYSTEM}");

    // identify over RDMA: the kernel target's controller and its 64 MiB namespace
    let identify = usnvme_ok(&bed, &["identify", &target]);
    assert!(
        identify.contains("Model:                  Linux"),
        "{identify}"
    );
    assert!(identify.contains("16384 blocks of 4096 B"), "{identify}");
    assert!(identify.contains("NVMe/RDMA to"), "{identify}");

    // health over RDMA: the controller's SMART log
    let health = usnvme_ok(&bed, &["health", &target]);
    assert!(health.contains(&target), "{health}");

    // discover over RDMA lists what nvme-cli's discover lists, field by field
    assert_eq!(discovers_alike(&bed, address, HOST_TRSVCID), 2);

    // 128 KiB writes (keyed: the target reads them), each block once, then read back (the
    // target writes them) and checked; then 4 KiB random reads and writes on two reactors
    // (writes in the capsule)
    let seed = 0x7264_6d61u64;
    let size: u64 = 16 << 20;
    write_then_read_back(&bed, &target, "nvmet", 1, size, seed);
    let size_text = size.to_string();
    // the blocks in the target's file carry the run's stamps: an independent check of what
    // the target read from this host's memory
    let file = std::fs::read(&nvmet.file).expect("the namespace's file");
    let mut want = vec![0u8; 4096];
    for offset in (0..size).step_by(4096) {
        usnvme_stamp::stamp(&mut want, offset, seed);
        let at = offset as usize;
        assert!(
            file[at..at + 4096] == want[..],
            "block at {offset} of {} is not what perf wrote",
            nvmet.file.display()
        );
    }
    let mix = perf_over_rdma(
        &bed,
        &target,
        "randrw",
        &[
            "-w", "randrw", "-o", "4k", "-q", "16", "-t", "2", "--offset", &size_text, "--size",
            &size_text, "--verify", "--seed", "7",
        ],
    );
    assert!(
        total_ios(&mix, "read") > 0 && total_ios(&mix, "write") > 0,
        "{mix:#}"
    );

    // a subsystem the target does not have: refused by name, on one line
    let wrong = format!("rdma://{address}:{HOST_TRSVCID}/nqn.2024-01.io.usnvme:wrong");
    let out = bed.usnvme(&["perf", "-r", &wrong, "-t", "1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("unknown NQN"), "{stderr}");
    // nothing listens on this port: said, not hung
    let nobody = format!("rdma://{address}:4499/{HOST_NQN_SUBSYSTEM}");
    let out = bed.usnvme(&["perf", "-r", &nobody, "-t", "1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("rejected"), "{stderr}");
    drop(nvmet);
}

const RECONNECT_NQN: &str = "nqn.2024-01.io.usnvme:vm-rdma-reconnect";
const RECONNECT_PORT_ID: u32 = 43;
const RECONNECT_TRSVCID: u16 = 4422;

/// `usnvme perf` over RDMA on the reconnect test's namespace: `workload` over its first 4 MiB,
/// each 4 KiB block once, verified with one seed, reconnecting after 1 s for up to 60 s.
fn reconnecting_perf(
    bed: &usnvme_tests::VmBed,
    target: &str,
    workload: &str,
    json: &Path,
    extra: &[&str],
) -> Command {
    let mut cmd = Command::new(&bed.usnvme);
    cmd.args(["perf", "-r", target, "-c", "1", "-w", workload])
        .args(["--verify", "--seed", "22", "-o", "4k", "-q", "8"])
        .args(["--size", "4M", "--io-count", "1024"])
        .args(["--reconnect-delay", "1", "--ctrl-loss-tmo", "60", "--json"])
        .arg(json)
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    cmd
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn usnvme_perf_over_rdma_runs_on_when_its_target_drops_the_port_and_brings_it_back() {
    use std::io::BufRead;

    let bed = usnvme_tests::VmBed::from_env();
    let address = rdma_address();
    let nvmet = or_kernel_log("nvmet-rdma port", || {
        NvmetRdma::on_file(
            RECONNECT_NQN,
            NAMESPACE_BYTES,
            RECONNECT_PORT_ID,
            address,
            RECONNECT_TRSVCID,
        )
    });
    let target = format!("rdma://{address}:{RECONNECT_TRSVCID}/{RECONNECT_NQN}");
    let json = std::env::temp_dir().join("perf-rdma-reconnect.json");
    // the write pass, slowed to ~10 s (100 IOPS) so the port can go in the middle of it
    let mut perf = reconnecting_perf(&bed, &target, "write", &json, &["--rate", "100"])
        .spawn()
        .expect("usnvme perf runs");
    // perf's log, line by line, as it comes: the test acts on what it says
    let stderr = perf.stderr.take().expect("piped");
    let (tx, lines) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let mut log = Vec::new();
    let wait_for = |what: &str, log: &mut Vec<String>| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line.contains(what);
                    log.push(line);
                    if found {
                        return;
                    }
                }
                Err(_) => panic!(
                    "perf never said {what:?}: {log:#?}\n{}",
                    usnvme_tests::rdma::kernel_log()
                ),
            }
        }
    };
    // I/O flows: packets through rxe beyond the connection's set-up
    let start = counter("rcvd_pkts");
    let deadline = Instant::now() + Duration::from_secs(60);
    while counter("rcvd_pkts") < start + 400 {
        assert!(
            Instant::now() < deadline,
            "no I/O through {RDMA_DEVICE} in 60 s"
        );
        std::thread::yield_now();
    }
    // the port goes: nvmet deletes the controllers on it; perf sees its connections end
    let link = nvmet.port.join("subsystems").join(RECONNECT_NQN);
    std::fs::remove_file(&link).unwrap_or_else(|e| panic!("rm {}: {e}", link.display()));
    wait_for("connection lost", &mut log);
    // and comes back
    std::os::unix::fs::symlink(&nvmet.subsystem, &link)
        .unwrap_or_else(|e| panic!("ln -s {}: {e}", link.display()));
    let out = perf.wait_with_output().expect("perf ends");
    reader.join().expect("the reader");
    log.extend(lines.try_iter());
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), log.join("\n"));
    assert!(out.status.success(), "{text}");
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("perf's JSON")).expect("JSON");
    let total = &doc["total"];
    assert_eq!(total["failed_ios"], 0, "{text}");
    assert_eq!(total["reconnects"], 1, "{text}");
    assert_eq!(total_ios(&doc, "write"), 1024, "{text}");

    // every block reads back as written: none lost in the reconnect, none misplaced
    let out = reconnecting_perf(&bed, &target, "read", &json, &[])
        .output()
        .expect("usnvme perf runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("perf's JSON")).expect("JSON");
    assert_eq!(doc["verified_blocks"], 1024, "{text}");
    drop(nvmet);
}

const FIO_NQN: &str = "nqn.2024-01.io.usnvme:vm-rdma-fio";
const FIO_PORT_ID: u32 = 44;
const FIO_TRSVCID: u16 = 4423;

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn fio_job_files_run_through_the_engine_over_rdma_on_the_kernels_target() {
    let address = rdma_address();
    let _nvmet = or_kernel_log("nvmet-rdma port", || {
        NvmetRdma::on_file(FIO_NQN, NAMESPACE_BYTES, FIO_PORT_ID, address, FIO_TRSVCID)
    });
    // the engine's file names in both forms (fio splits at unescaped ':')
    let nqn = FIO_NQN.replace(':', "\\:");
    let short = format!("rdma\\://{address}\\:{FIO_TRSVCID}/{nqn}");
    let spdk =
        format!("trtype=RDMA adrfam=IPv4 traddr={address} trsvcid={FIO_TRSVCID} subnqn={nqn}");
    for (name, file) in [("short", short), ("spdk", spdk)] {
        let job = format!(
            "[global]\nioengine=external:{}\nthread=1\nbs=4k\noffset=0\n",
            usnvme_tests::fio::engine().display()
        ) + &usnvme_tests::fio::three_jobs(&file, "4m");
        let dir = std::env::temp_dir().join(format!("fio-rdma-{name}"));
        let run = or_kernel_log("fio through the engine over RDMA", || {
            usnvme_tests::fio::run(&dir, name, &job, &[])
        });
        usnvme_tests::fio::assert_three_jobs(&run, 4 << 20);
    }
}

/// usnvme serve over RDMA: its subsystem, its RDMA port.
const SERVE_NQN: &str = "nqn.2024-01.io.usnvme:vm-rdma-serve";
const SERVE_TRSVCID: u16 = 4430;

/// `usnvme serve` of `devices` as [`SERVE_NQN`] on `rdma:ADDR:PORT` (and `extra`),
/// allowing any host, running; its namespaces.
fn serve_over_rdma(
    bed: &usnvme_tests::VmBed,
    address: &str,
    port: u16,
    devices: &[&str],
    extra: &[&str],
) -> (
    std::process::Child,
    Vec<usnvme_tests::kernel_host::Exported>,
) {
    let listen = format!("rdma:{address}:{port}");
    let mut args = vec![
        "--nqn",
        SERVE_NQN,
        "--listen",
        listen.as_str(),
        "--allow-any-host",
    ];
    args.extend_from_slice(extra);
    for d in devices {
        args.extend(["-r", d]);
    }
    let (child, namespaces) = usnvme_tests::kernel_host::serve_with(bed, &args);
    assert!(!namespaces.is_empty(), "serve over RDMA exported nothing");
    (child, namespaces)
}

/// `usnvme discover` and `nvme discover -t rdma` of `address`:`port` list the same records,
/// field by field (nvme-cli's JSON fields, the RDMA ones included).
fn discovers_alike(bed: &usnvme_tests::VmBed, address: &str, port: u16) -> usize {
    let ours = usnvme_ok(
        bed,
        &["discover", &format!("rdma://{address}:{port}"), "--json"],
    );
    let ours: serde_json::Value = serde_json::from_str(&ours).expect("discover --json parses");
    let port = port.to_string();
    let theirs = run(
        NVME,
        &[
            "discover",
            "-t",
            "rdma",
            "-a",
            address,
            "-s",
            &port,
            "--hostnqn",
            HOSTNQN,
            "-o",
            "json",
        ],
    );
    let theirs: serde_json::Value = serde_json::from_str(&theirs).expect("nvme discover parses");
    let records = |doc: &serde_json::Value| doc["records"].as_array().cloned().unwrap_or_default();
    let (ours_records, theirs_records) = (records(&ours), records(&theirs));
    assert_eq!(
        ours_records.len(),
        theirs_records.len(),
        "{ours:#}\n{theirs:#}"
    );
    for (o, t) in ours_records.iter().zip(&theirs_records) {
        for field in [
            "trtype",
            "adrfam",
            "subtype",
            "treq",
            "portid",
            "trsvcid",
            "subnqn",
            "traddr",
            "rdma_prtype",
            "rdma_qptype",
            "rdma_cms",
            "rdma_pkey",
        ] {
            let trimmed = |v: &serde_json::Value| match v.as_str() {
                Some(s) => serde_json::Value::from(s.trim()),
                None => v.clone(),
            };
            assert_eq!(
                trimmed(&o[field]),
                trimmed(&t[field]),
                "{field}: {o:#}\n{t:#}"
            );
        }
    }
    ours_records.len()
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn the_kernels_nvme_rdma_host_and_usnvme_perf_verify_through_usnvme_serve_over_rdma() {
    let bed = usnvme_tests::VmBed::from_env();
    let address = rdma_address();
    let (mut serve, namespaces) = serve_over_rdma(
        &bed,
        address,
        SERVE_TRSVCID,
        &["sim:0-1,backend=ram,size=64M,bs=4096"],
        &[],
    );
    assert_eq!(namespaces.len(), 2, "{namespaces:?}");
    // the discovery log over RDMA, as nvme-cli reads it and as we do
    assert_eq!(discovers_alike(&bed, address, SERVE_TRSVCID), 2);

    // the kernel's host: connect-all through the discovery controller, fio verifies every
    // namespace, disconnect
    let port = SERVE_TRSVCID.to_string();
    or_kernel_log("nvme connect-all -t rdma", || {
        run(
            NVME,
            &[
                "connect-all",
                "-t",
                "rdma",
                "-a",
                address,
                "-s",
                &port,
                "--hostnqn",
                HOSTNQN,
            ],
        )
    });
    let devices = or_kernel_log("the namespaces over RDMA", || {
        kernel_namespaces(SERVE_NQN, namespaces.len())
    });
    for ns in &namespaces {
        let dev = &devices[&ns.nsid];
        assert_eq!(block_bytes(dev), ns.bytes, "{}", dev.display());
        or_kernel_log("fio --verify=crc32c over nvme-rdma to serve", || {
            fio_verifies(dev, "8M")
        });
    }
    let out = run(NVME, &["disconnect", "-n", SERVE_NQN]);
    assert!(out.contains("disconnected 1 controller"), "{out}");

    // usnvme perf over RDMA: 128 KiB writes (keyed: serve reads them), each block once, then
    // read back (serve writes them) and checked; then a random 4 KiB mix (in-capsule writes)
    let target = format!("rdma://{address}:{SERVE_TRSVCID}/{SERVE_NQN}");
    let size: u64 = 16 << 20;
    write_then_read_back(&bed, &target, "serve", 2, size, 31);
    let size_text = size.to_string();
    let mix = perf_over_rdma(
        &bed,
        &target,
        "serve-randrw",
        &[
            "-w", "randrw", "-o", "4k", "-q", "16", "-t", "2", "--offset", &size_text, "--size",
            &size_text, "--verify", "--seed", "32",
        ],
    );
    assert!(
        total_ios(&mix, "read") > 0 && total_ios(&mix, "write") > 0,
        "{mix:#}"
    );
    // (SIGINT: serve shuts the controllers down and says it was interrupted, 128 + 2)
    usnvme_tests::signal(&serve, "INT");
    assert_eq!(serve.wait().expect("serve ends").code(), Some(130));
}

/// Where the reconnect test writes on its drive (none of the other suites' regions).
const SERVE_RECONNECT_DRIVE: usize = 5;
const SERVE_RECONNECT_OFFSET: &str = "960M";
const SERVE_RECONNECT_TRSVCID: u16 = 4431;

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn usnvme_perf_over_rdma_runs_on_when_serve_is_killed_and_restarted() {
    use std::io::BufRead;

    let bed = usnvme_tests::VmBed::from_env();
    let address = rdma_address();
    let drive = usnvme_tests::vfio_controllers()[SERVE_RECONNECT_DRIVE].to_string();
    let (mut serve, _) = serve_over_rdma(
        &bed,
        address,
        SERVE_RECONNECT_TRSVCID,
        &[drive.as_str()],
        &[],
    );
    let target = format!("rdma://{address}:{SERVE_RECONNECT_TRSVCID}/{SERVE_NQN}");
    let json = std::env::temp_dir().join("perf-rdma-serve-reconnect.json");
    let offset = ["--offset", SERVE_RECONNECT_OFFSET];
    let mut perf = reconnecting_perf(
        &bed,
        &target,
        "write",
        &json,
        &[&["--rate", "100"][..], &offset].concat(),
    )
    .spawn()
    .expect("usnvme perf runs");
    let stderr = perf.stderr.take().expect("piped");
    let (tx, lines) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    // I/O flows: packets through rxe beyond the connection's set-up
    let start = counter("rcvd_pkts");
    let deadline = Instant::now() + Duration::from_secs(60);
    while counter("rcvd_pkts") < start + 400 {
        assert!(
            Instant::now() < deadline,
            "no I/O through {RDMA_DEVICE} in 60 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    serve.kill().expect("SIGKILL"); // no clean shutdown: the host sees its connections go
    serve.wait().expect("serve ends");
    let mut log = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let line = lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("perf never said the connection was lost: {log:#?}"));
        let lost = line.contains("connection lost");
        log.push(line);
        if lost {
            break;
        }
    }
    let (mut serve, _) = serve_over_rdma(
        &bed,
        address,
        SERVE_RECONNECT_TRSVCID,
        &[drive.as_str()],
        &[],
    );
    let out = perf.wait_with_output().expect("perf ends");
    reader.join().expect("the reader");
    log.extend(lines.try_iter());
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), log.join("\n"));
    assert!(out.status.success(), "{text}");
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("perf's JSON")).expect("JSON");
    assert_eq!(doc["total"]["failed_ios"], 0, "{text}");
    assert!(doc["total"]["reconnects"].as_u64() >= Some(1), "{text}");
    assert_eq!(total_ios(&doc, "write"), 1024, "{text}");
    // every block reads back as written: none lost in the reconnect, none misplaced
    let out = reconnecting_perf(&bed, &target, "read", &json, &offset)
        .output()
        .expect("usnvme perf runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("perf's JSON")).expect("JSON");
    // the bed's drives have 512-byte blocks (0-11) or 4 KiB ones (12-23): 4 MiB either way
    let verified = doc["verified_blocks"].as_u64().unwrap_or(0);
    assert!(verified == 8192 || verified == 1024, "{text}");
    usnvme_tests::signal(&serve, "INT");
    assert_eq!(serve.wait().expect("serve ends").code(), Some(130));
}

const REJECT_TRSVCID: u16 = 4432;

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn connect_requests_over_rdma_with_bad_queue_sizes_are_rejected_by_name_and_serve_goes_on() {
    use std::sync::Arc;
    use usnvme_engine::fabric::address::Transport;
    use usnvme_engine::transport::fabric_queue::FabricQueue;
    use usnvme_engine::transport::tcp::initiator::queue::Buffers;
    use usnvme_engine::transport::tcp::initiator::{HostOptions, QueueParams};
    use usnvme_hugepages::IovaMemory;
    use vm_memory::GuestAddress;

    let bed = usnvme_tests::VmBed::from_env();
    let address = rdma_address();
    let (mut serve, _) = serve_over_rdma(
        &bed,
        address,
        REJECT_TRSVCID,
        &["sim:0,backend=ram,size=16M"],
        &[],
    );
    let addr = format!("{address}:{REJECT_TRSVCID}")
        .parse()
        .expect("an address");
    let host = HostOptions {
        transport: Transport::Rdma,
        ..HostOptions::default()
    };
    let mem =
        Arc::new(IovaMemory::from_ranges(&[(GuestAddress(0x1000), 1 << 16)]).expect("memory"));
    // an admin queue of 64 entries (at most 32), an I/O queue of 1024 (serve takes 128): the
    // CM's private data says so, and the target rejects them with the reason
    for (qid, entries) in [(0u16, 64u16), (1, 1024)] {
        let params = QueueParams {
            subnqn: SERVE_NQN.into(),
            qid,
            cntlid: 0xffff,
            entries,
            nsid: 1,
            block_size: 512,
            in_capsule: 0,
            max_transfer: 4096,
            timeout_ns: 10_000_000_000,
        };
        let err = FabricQueue::connect(addr, params, &host, Buffers::Memory(mem.clone()))
            .expect_err("a queue too large");
        assert!(
            err.to_string()
                .contains("rejected the connection: invalid host submission queue size"),
            "queue {qid} of {entries}: {err}"
        );
    }
    // and serve goes on serving
    let target = format!("rdma://{address}:{REJECT_TRSVCID}/{SERVE_NQN}");
    let run = perf_over_rdma(
        &bed,
        &target,
        "after-rejects",
        &[
            "-w", "randrw", "-o", "4k", "-q", "4", "-t", "1", "--verify", "--seed", "41",
        ],
    );
    assert!(total_ios(&run, "write") > 0, "{run:#}");
    usnvme_tests::signal(&serve, "INT");
    assert_eq!(serve.wait().expect("serve ends").code(), Some(130));
}

const MALFORMED_TRSVCID: u16 = 4433;

/// Malformed capsules sent over RDMA to serve, each raw ([`rdma::IoQueue::submit_raw`]): a
/// command the target can answer gets its error status by name and its connection goes on; a
/// capsule that breaks the transport (cut short, in-capsule data the SGL does not describe,
/// more than a receive buffer holds, a key that opens nothing) ends its connection, never with
/// a success; and serve goes on serving.
#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn malformed_capsules_over_rdma_get_errors_or_end_their_connection_and_serve_goes_on() {
    use std::sync::Arc;
    use usnvme_driver::spec::{SglDescriptor, Sqe, Status};
    use usnvme_driver::IoBuffer;
    use usnvme_engine::fabric::address::Transport;
    use usnvme_engine::transport::fabric_queue::FabricQueue;
    use usnvme_engine::transport::tcp::initiator::queue::Buffers;
    use usnvme_engine::transport::tcp::initiator::{Completion, Failure, HostOptions, QueueParams};
    use usnvme_engine::transport::RemoteController;
    use usnvme_hugepages::IovaMemory;
    use vm_memory::{Bytes, GuestAddress};

    const BASE: u64 = 0x10_0000;
    let bed = usnvme_tests::VmBed::from_env();
    let address = rdma_address();
    let (mut serve, _) = serve_over_rdma(
        &bed,
        address,
        MALFORMED_TRSVCID,
        &["sim:0,backend=ram,size=16M,bs=4096"],
        &[],
    );
    let addr = format!("{address}:{MALFORMED_TRSVCID}")
        .parse()
        .expect("an address");
    let host = HostOptions {
        transport: Transport::Rdma,
        ..HostOptions::default()
    };
    let mut ctrl = RemoteController::connect(addr, SERVE_NQN, &host).expect("the controller");
    assert!(ctrl.set_io_queues(8).expect("Number of Queues") >= 5);
    let mem = Arc::new(IovaMemory::from_ranges(&[(GuestAddress(BASE), 1 << 20)]).expect("memory"));
    let queue = |qid: u16| {
        let params = QueueParams {
            subnqn: SERVE_NQN.into(),
            qid,
            cntlid: ctrl.cntlid(),
            entries: 32,
            nsid: 1,
            block_size: 4096,
            in_capsule: 8192,
            max_transfer: 128 << 10,
            timeout_ns: 30_000_000_000,
        };
        match FabricQueue::connect(addr, params, &host, Buffers::Memory(mem.clone())) {
            Ok(FabricQueue::Rdma(q)) => q,
            other => panic!("queue {qid} over RDMA: {other:?}"),
        }
    };
    let buf = |at: u64, len: u32| {
        Some(IoBuffer {
            iova: BASE + at,
            len,
        })
    };
    // The completion of the command with `token`, or None once the queue ended without one.
    let outcome = |q: &mut usnvme_engine::transport::rdma::IoQueue, token: u64| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let mut got: Option<Completion> = None;
            q.poll(|c| {
                if c.token == token {
                    got = Some(c);
                }
            });
            if got.is_some() || q.ended().is_some() {
                return got;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "neither an answer nor the end of the connection in 60 s"
            );
            let _ = q.wait(std::time::Duration::from_millis(100));
        }
    };
    let with_sgl = |mut sqe: Sqe, sgl: SglDescriptor| {
        sqe.set_sgl(sgl);
        sqe
    };

    // answered with an error status, the connection going on
    let mut q = queue(1);
    let key = 0u32;
    let mut unknown = Sqe::new(0x7e);
    unknown.nsid = 1;
    let answered = [
        (
            "an unknown opcode",
            with_sgl(unknown, SglDescriptor::keyed(0, 0, key)),
            Status::INVALID_OPCODE,
        ),
        (
            "a Write whose SGL is a plain Data Block",
            with_sgl(Sqe::write(1, 0, 1), SglDescriptor::data_block(BASE, 4096)),
            Status::DATA_SGL_LENGTH_INVALID,
        ),
        (
            "a Read whose keyed SGL is longer than its blocks",
            with_sgl(Sqe::read(1, 0, 1), SglDescriptor::keyed(BASE, 8192, key)),
            Status::DATA_SGL_LENGTH_INVALID,
        ),
        (
            "a Read past the namespace's end",
            with_sgl(
                Sqe::read(1, 1 << 40, 1),
                SglDescriptor::keyed(BASE, 4096, key),
            ),
            Status::LBA_OUT_OF_RANGE,
        ),
        (
            "a Read of a namespace that is not there",
            with_sgl(Sqe::read(99, 0, 1), SglDescriptor::keyed(BASE, 4096, key)),
            Status::INVALID_NAMESPACE,
        ),
    ];
    for (token, (what, sqe, status)) in answered.into_iter().enumerate() {
        q.submit_raw(sqe, 64, None, token as u64).expect("sent");
        let c = outcome(&mut q, token as u64).unwrap_or_else(|| panic!("{what}: no answer"));
        match c.result {
            Err(Failure::Status(s)) if s.code() == status => {}
            other => panic!("{what}: {other:?}, not {status}"),
        }
    }
    // and the connection goes on: a block written and read back
    let block: Vec<u8> = (0..4096u32).map(|i| (i * 13 + 5) as u8).collect();
    mem.write_slice(&block, GuestAddress(BASE)).expect("memory");
    let ns = usnvme_engine::transport::tcp::initiator::IoNamespace {
        nsid: 1,
        block_size: 4096,
    };
    for (token, op, at) in [
        (100, usnvme_engine::transport::Op::Write, 0),
        (101, usnvme_engine::transport::Op::Read, 0x10000),
    ] {
        q.submit_to(ns, op, 7, 1, buf(at, 4096), token)
            .expect("submitted");
        let c = outcome(&mut q, token).expect("an answer");
        assert!(c.result.is_ok(), "{op:?} after the errors: {:?}", c.result);
    }
    let mut read = vec![0u8; 4096];
    mem.read_slice(&mut read, GuestAddress(BASE + 0x10000))
        .expect("memory");
    assert!(read == block, "the block read back is not the one written");

    // the transport broken: each ends its own connection, none succeeds
    let broken: [(&str, Sqe, u32, Option<IoBuffer>); 4] = [
        ("a capsule cut to 32 bytes", Sqe::flush(1), 32, None),
        (
            "in-capsule data the SGL does not describe (512 bytes for 4096)",
            with_sgl(Sqe::write(1, 0, 1), SglDescriptor::in_capsule(4096)),
            64 + 512,
            buf(0, 512),
        ),
        (
            "more in-capsule data than a receive buffer holds (64 KiB)",
            with_sgl(Sqe::write(1, 0, 16), SglDescriptor::in_capsule(64 << 10)),
            64 + (64 << 10),
            buf(0, 64 << 10),
        ),
        (
            "a Write whose keyed SGL's key opens nothing",
            with_sgl(
                Sqe::write(1, 0, 1),
                SglDescriptor::keyed(BASE, 4096, 0xdead_beef),
            ),
            64,
            None,
        ),
    ];
    for (i, (what, sqe, len, data)) in broken.into_iter().enumerate() {
        let mut q = queue(2 + i as u16);
        q.submit_raw(sqe, len, data, 7).expect("sent");
        match outcome(&mut q, 7) {
            None => {}
            Some(c) => assert!(c.result.is_err(), "{what}: it succeeded"),
        }
        // (an answer by status may come before the end; the connection ends either way)
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while q.ended().is_none() {
            q.poll(|_| {});
            let _ = q.wait(std::time::Duration::from_millis(100));
            assert!(
                std::time::Instant::now() < deadline,
                "{what}: the connection did not end"
            );
        }
    }
    drop(q);
    drop(ctrl);
    // and serve goes on serving
    let target = format!("rdma://{address}:{MALFORMED_TRSVCID}/{SERVE_NQN}");
    let run = perf_over_rdma(
        &bed,
        &target,
        "after-malformed",
        &[
            "-w", "randrw", "-o", "4k", "-q", "8", "-t", "1", "--verify", "--seed", "43",
        ],
    );
    assert!(total_ios(&run, "write") > 0, "{run:#}");
    usnvme_tests::signal(&serve, "INT");
    assert_eq!(serve.wait().expect("serve ends").code(), Some(130));
}

const CONTROL_TRSVCID: u16 = 4434;

/// An NVMe/RDMA port added to a running serve through its control socket (`usnvme target
/// listener add rdma:ADDR:PORT`) takes hosts at once: `target status` names it, perf verifies
/// through it; removed, it takes no new connection, and serve serves on.
#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn an_rdma_port_added_and_removed_through_the_control_socket() {
    use usnvme_engine::fabric::address::Transport;
    use usnvme_engine::transport::tcp::initiator::HostOptions;
    use usnvme_engine::transport::RemoteController;

    let bed = usnvme_tests::VmBed::from_env();
    let address = rdma_address();
    let control = "/tmp/vm-rdma-control.sock";
    let (mut serve, _) = usnvme_tests::kernel_host::serve_with(
        &bed,
        &[
            "--nqn",
            SERVE_NQN,
            "--listen",
            "127.0.0.1:4434",
            "--allow-any-host",
            "--control",
            control,
            "-r",
            "sim:0,backend=ram,size=16M",
        ],
    );
    let target = |args: &[&str]| {
        let mut all = vec!["target", "--socket", control];
        all.extend_from_slice(args);
        usnvme_ok(&bed, &all)
    };
    let port = format!("rdma:{address}:{CONTROL_TRSVCID}");
    let added = target(&["listener", "add", &port]);
    assert!(added.contains(&format!("listening on {port}")), "{added}");
    let status: serde_json::Value =
        serde_json::from_str(&target(&["status"])).expect("status JSON");
    let listeners = status["listeners"].as_array().cloned().unwrap_or_default();
    assert!(
        listeners.iter().any(|l| l.as_str() == Some(port.as_str())),
        "{listeners:?}"
    );
    let url = format!("rdma://{address}:{CONTROL_TRSVCID}/{SERVE_NQN}");
    let run = perf_over_rdma(
        &bed,
        &url,
        "control-added",
        &[
            "-w", "randrw", "-o", "4k", "-q", "8", "-t", "1", "--verify", "--seed", "47",
        ],
    );
    assert!(total_ios(&run, "write") > 0, "{run:#}");
    target(&[
        "listener",
        "remove",
        &format!("{address}:{CONTROL_TRSVCID}"),
    ]);
    let host = HostOptions {
        transport: Transport::Rdma,
        timeout: std::time::Duration::from_secs(10),
        ..HostOptions::default()
    };
    let addr = format!("{address}:{CONTROL_TRSVCID}")
        .parse()
        .expect("an address");
    let refused = RemoteController::connect(addr, SERVE_NQN, &host)
        .expect_err("a port removed takes no connection");
    assert!(
        refused.to_string().contains("rejected") || refused.to_string().contains("listening"),
        "{refused}"
    );
    usnvme_tests::signal(&serve, "INT");
    assert_eq!(serve.wait().expect("serve ends").code(), Some(130));
}

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
    let started = Instant::now();
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

    let t = Instant::now();
    or_kernel_log("fio --verify=crc32c over nvme-rdma", || {
        fio_verifies(dev, &format!("{}M", FIO_BYTES >> 20))
    });
    let fio_s = t.elapsed().as_secs_f64();

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
        "nvme-rdma over {RDMA_DEVICE}: fio {} MiB verified in {fio_s:.1} s ({sent} packets sent, \
         {received} received); the test took {:.1} s",
        FIO_BYTES >> 20,
        started.elapsed().as_secs_f64()
    );
}

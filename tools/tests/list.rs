//! `usnvme list` run as a process against fake sysfs trees (`USNVME_SYSFS_ROOT`).

use serde_json::Value;
use usnvme_driver::pci::fake::FakeSysfs;

mod common;
use common::{stderr, stdout, usnvme};

/// Two QEMU NVMe controllers: one on vfio-pci, alone in its IOMMU group on a Gen5 x4 link; one
/// on the kernel driver, sharing its group with a NIC, with an unknown link and namespaces in use.
fn two_controllers() -> FakeSysfs {
    let fake = FakeSysfs::new();
    fake.add_pci_device("0000:01:00.0", 0x010802, 0x1b36, 0x0010)
        .bind("vfio-pci")
        .numa_node("0")
        .iommu_group(12)
        .link("32.0 GT/s PCIe", "4", "32.0 GT/s PCIe", "4");
    fake.add_pci_device("0000:02:00.0", 0x010802, 0x1b36, 0x0010)
        .bind("nvme")
        .numa_node("-1")
        .iommu_group(13)
        .link("Unknown", "0", "Unknown", "0")
        .namespace("nvme0", "nvme0n1", 8_388_608, "259:0")
        .namespace("nvme0", "nvme0n2", 2048, "259:1");
    fake.add_pci_device("0000:02:00.1", 0x020000, 0x8086, 0x10d3)
        .bind("e1000e")
        .iommu_group(13);
    fake.add_pci_device("0000:00:02.0", 0x030000, 0x1234, 0x1111);
    fake.add_partition("nvme0n1", "nvme0n1p1", "259:2");
    fake.add_partition("nvme0n1", "nvme0n1p2", "259:3");
    fake.add_holder("nvme0n1/nvme0n1p2", "dm-0");
    fake.write(
        "proc/self/mounts",
        "proc /proc proc rw 0 0\n/dev/nvme0n1p1 /data ext4 rw 0 0\n",
    );
    fake.write(
        "proc/swaps",
        "Filename\tType\tSize\tUsed\tPriority\n/dev/nvme0n2 partition 1020 0 -2\n",
    );
    fake
}

#[test]
fn table() {
    let fake = two_controllers();
    let out = usnvme(fake.root(), &["list"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stderr(&out), "");
    let expected = [
        "BDF           VID:DID    DRIVER    NUMA  IOMMU GROUP                             LINK (CURRENT / MAX)     BLOCK DEVICES",
        "0000:01:00.0  1b36:0010  vfio-pci  0     12 viable                               32 GT/s x4 / 32 GT/s x4  -",
        "0000:02:00.0  1b36:0010  nvme      -     13 not viable (0000:02:00.1 on e1000e)  -                        nvme0n1 (mounted at /data) (holders: dm-0), nvme0n2 (in use: swap)",
        "2 NVMe controllers: 1 on vfio-pci, 1 on nvme, 0 unbound",
    ];
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines, expected, "{text}");
    // Columns line up: each header starts where its cells do.
    for header in ["DRIVER", "NUMA", "IOMMU GROUP", "LINK", "BLOCK DEVICES"] {
        let at = lines[0].find(header).expect(header);
        assert_eq!(&lines[1][at - 2..at], "  ", "{header}: {text}");
        assert_ne!(&lines[1][at..=at], " ", "{header}: {text}");
    }
}

#[test]
fn json() {
    let fake = two_controllers();
    let out = usnvme(fake.root(), &["list", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let json: Value = serde_json::from_str(&stdout(&out)).expect("valid JSON");
    let list = json.as_array().expect("an array");
    assert_eq!(list.len(), 2);

    let c = &list[0];
    assert_eq!(c["address"], "0000:01:00.0");
    assert_eq!(c["class"], 0x010802);
    assert_eq!(c["vendor_id"], 0x1b36);
    assert_eq!(c["device_id"], 0x0010);
    assert_eq!(c["subsystem_vendor_id"], Value::Null);
    assert_eq!(c["driver"], "vfio-pci");
    assert_eq!(c["numa_node"], 0);
    assert_eq!(c["iommu_group"], 12);
    assert_eq!(c["iommu_group_viable"], true);
    assert_eq!(c["iommu_group_blockers"], serde_json::json!([]));
    assert_eq!(c["link"]["current"]["speed_gts"], 32.0);
    assert_eq!(c["link"]["current"]["width"], 4);
    assert_eq!(c["link"]["max"]["speed_gts"], 32.0);
    assert_eq!(c["block_devices"], serde_json::json!([]));

    let c = &list[1];
    assert_eq!(c["address"], "0000:02:00.0");
    assert_eq!(c["driver"], "nvme");
    assert_eq!(c["numa_node"], Value::Null);
    assert_eq!(c["iommu_group"], 13);
    assert_eq!(c["iommu_group_viable"], false);
    assert_eq!(
        c["iommu_group_blockers"],
        serde_json::json!([{ "device": "0000:02:00.1", "driver": "e1000e" }])
    );
    assert_eq!(c["link"]["current"]["speed_gts"], Value::Null);
    assert_eq!(c["link"]["max"]["width"], Value::Null);
    let blocks = c["block_devices"].as_array().expect("block devices");
    assert_eq!(blocks.len(), 2);
    assert_eq!(blocks[0]["name"], "nvme0n1");
    assert_eq!(blocks[0]["size_bytes"], 8_388_608_u64 * 512);
    assert_eq!(
        blocks[0]["partitions"],
        serde_json::json!(["nvme0n1p1", "nvme0n1p2"])
    );
    assert_eq!(blocks[0]["mounted_at"], serde_json::json!(["/data"]));
    assert_eq!(blocks[0]["swap"], false);
    assert_eq!(blocks[0]["holders"], serde_json::json!(["dm-0"]));
    assert_eq!(blocks[1]["name"], "nvme0n2");
    assert_eq!(blocks[1]["swap"], true);
}

#[test]
fn empty_root() {
    let fake = FakeSysfs::new();
    let out = usnvme(fake.root(), &["list"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout(&out), "no NVMe controllers found\n");
    let out = usnvme(fake.root(), &["list", "--json"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout(&out).trim(), "[]");
}

#[test]
fn errors_exit_1_and_usage_errors_exit_2() {
    let fake = FakeSysfs::new();
    fake.write("sys/bus/pci/devices", "not a directory");
    let out = usnvme(fake.root(), &["list"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = stderr(&out);
    assert!(
        err.starts_with("usnvme: error: cannot list the NVMe controllers: cannot read "),
        "{err}"
    );
    assert!(err.contains("sys/bus/pci/devices"), "{err}");
    assert_eq!(stdout(&out), "");

    let out = usnvme(fake.root(), &["frobnicate"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let out = usnvme(fake.root(), &["list", "--bogus"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

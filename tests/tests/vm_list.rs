//! `usnvme list` on the test bed: every emulated controller, on vfio-pci, each in its own group.

use std::collections::HashSet;

use usnvme_tests::VmBed;

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn list_shows_every_drive_on_vfio_in_its_own_viable_group() {
    let bed = VmBed::from_env();
    let out = bed.usnvme(&["list", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let controllers: Vec<serde_json::Value> =
        serde_json::from_slice(&out.stdout).expect("JSON array");
    assert_eq!(controllers.len(), bed.drives);
    let mut groups = HashSet::new();
    for c in &controllers {
        assert_eq!(c["driver"], "vfio-pci", "{c:#}");
        assert_eq!(c["vendor_id"], 0x1b36, "QEMU's NVMe is 1b36:0010: {c:#}");
        assert_eq!(c["device_id"], 0x0010, "{c:#}");
        assert_eq!(c["iommu_group_viable"], true, "{c:#}");
        let group = c["iommu_group"].as_u64().expect("an IOMMU group");
        assert!(groups.insert(group), "group {group} holds two controllers");
    }
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn list_table_summarises_the_drivers() {
    let bed = VmBed::from_env();
    let out = bed.usnvme(&["list"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    assert!(
        table.contains(&format!(
            "{} NVMe controllers: {} on vfio-pci",
            bed.drives,
            bed.drives - bed.kernel_drives
        )),
        "{table}"
    );
    assert_eq!(
        table.matches("vfio-pci").count(),
        bed.drives - bed.kernel_drives + 1,
        "{table}"
    );
}

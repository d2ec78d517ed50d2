//! `usnvme identify` and `usnvme health` on the test bed's emulated drives.

use std::collections::HashSet;

use serde_json::Value;
use usnvme_tests::{drive_index, VmBed};

/// Runs `usnvme ARGS`, which must succeed, and returns its standard output.
fn stdout_of(bed: &VmBed, args: &[&str]) -> String {
    let out = bed.usnvme(args);
    assert!(
        out.status.success(),
        "usnvme {}: {}\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

fn json_array(bed: &VmBed, args: &[&str]) -> Vec<Value> {
    let text = stdout_of(bed, args);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not a JSON array ({e}):\n{text}"))
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn identify_json_describes_every_drive_and_its_namespace() {
    let bed = VmBed::from_env();
    let controllers = json_array(&bed, &["identify", "--json"]);
    assert_eq!(controllers.len(), bed.drives - bed.kernel_drives);
    let mut seen = HashSet::new();
    for c in &controllers {
        assert_eq!(c["model"], "QEMU NVMe Ctrl", "{c:#}");
        let serial = c["serial"].as_str().expect("a serial");
        let k = drive_index(serial).unwrap_or_else(|| panic!("serial {serial:?}"));
        assert!(seen.insert(k), "drive {k} twice");
        assert_eq!(c["vendor_id"], 0x1b36, "{c:#}");
        assert!(c["nvme_version"].as_str().is_some_and(|v| v.contains('.')));
        assert!(
            c["io_queue_pairs"].as_u64().is_some_and(|n| n >= 1),
            "{c:#}"
        );
        assert!(c["max_transfer_bytes"].as_u64().is_some_and(|n| n >= 4096));
        assert!(c["oacs"].is_array() && c["oncs"].is_array(), "{c:#}");
        assert!(c["shadow_doorbells"].is_boolean(), "{c:#}");

        let namespaces = c["namespaces"].as_array().expect("namespaces");
        assert_eq!(namespaces.len(), 1, "{c:#}");
        let ns = &namespaces[0];
        let block_size = bed.block_size_of(k);
        let formats = ns["lba_formats"].as_array().expect("LBA formats");
        let in_use: Vec<&Value> = formats.iter().filter(|f| f["in_use"] == true).collect();
        assert_eq!(in_use.len(), 1, "one format in use: {ns:#}");
        assert_eq!(in_use[0]["data_size"], block_size, "drive {k}: {ns:#}");
        assert_eq!(ns["block_size"], block_size, "drive {k}");
        assert_eq!(ns["capacity_bytes"], 1u64 << 30, "drive {k}");
        assert_eq!(
            ns["blocks"].as_u64(),
            Some((1u64 << 30) / u64::from(block_size))
        );
        assert!(ns["utilization_blocks"].as_u64() <= ns["blocks"].as_u64());
    }
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn identify_text_names_every_serial() {
    let bed = VmBed::from_env();
    let text = stdout_of(&bed, &["identify"]);
    let serials: HashSet<&str> = text
        .lines()
        .filter_map(|line| line.trim().strip_prefix("Serial:"))
        .map(str::trim)
        .collect();
    for k in bed.kernel_drives..bed.drives {
        assert!(
            serials.contains(format!("usnvme{k}").as_str()),
            "no usnvme{k} in:\n{text}"
        );
    }
    assert!(text.contains("QEMU NVMe Ctrl"), "{text}");
    assert!(text.contains("(in use)"), "{text}");
    // One BDF: that controller only.
    let first = text.lines().next().expect("a first line").trim();
    let one = stdout_of(&bed, &["identify", first]);
    assert!(one.starts_with(&format!("{first}\n")), "{one}");
    assert_eq!(one.matches("Serial:").count(), 1, "{one}");
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn health_json_reports_a_healthy_drive_with_its_link() {
    let bed = VmBed::from_env();
    let drives = json_array(&bed, &["health", "--json"]);
    assert_eq!(drives.len(), bed.drives - bed.kernel_drives);
    for h in &drives {
        let celsius = h["temperature_celsius"].as_i64().expect("a temperature");
        assert!((-20..=100).contains(&celsius), "{h:#}");
        assert_eq!(h["percentage_used"], 0, "{h:#}");
        let spare = h["available_spare"].as_u64().expect("spare");
        let threshold = h["available_spare_threshold"].as_u64().expect("threshold");
        assert!(spare >= threshold, "{h:#}");
        assert_eq!(h["available_spare_below_threshold"], false, "{h:#}");
        assert_eq!(h["critical_warnings"], serde_json::json!([]), "{h:#}");
        assert_eq!(h["verdict"], "OK", "{h:#}");
        assert!(h["pcie_link"]["current"].is_string(), "{h:#}");
        assert!(h["pcie_link"]["max"].is_string(), "{h:#}");
        assert!(h["power_on_hours"].is_u64(), "{h:#}");
        assert!(h["bytes_written"].is_u64(), "{h:#}");
    }
    let text = stdout_of(&bed, &["health"]);
    assert_eq!(
        text.matches("Health:").count(),
        bed.drives - bed.kernel_drives,
        "{text}"
    );
    assert!(text.contains(" °C"), "{text}");
    assert!(text.contains("PCIe link:"), "{text}");
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn a_missing_controller_is_an_error_that_says_what_to_do() {
    let bed = VmBed::from_env();
    for command in ["identify", "health"] {
        let out = bed.usnvme(&[command, "0000:7f:1f.7"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{command}: {stderr}");
        assert!(stderr.starts_with("usnvme: error: "), "{stderr}");
        assert!(stderr.contains("0000:7f:1f.7"), "{stderr}");
        assert!(stderr.contains("usnvme list"), "{stderr}");
    }
    // The others are still reported, and the command still fails.
    let first = json_array(&bed, &["identify", "--json"])[0]["address"]
        .as_str()
        .expect("an address")
        .to_owned();
    let out = bed.usnvme(&["identify", "--json", &first, "0000:7f:1f.7"]);
    assert_eq!(out.status.code(), Some(1));
    let reported: Vec<Value> = serde_json::from_slice(&out.stdout).expect("JSON array");
    assert_eq!(reported.len(), 1);
    assert_eq!(reported[0]["address"], first.as_str());
    // A malformed BDF is a usage error.
    let out = bed.usnvme(&["health", "not-a-bdf"]);
    assert_eq!(out.status.code(), Some(2));
}

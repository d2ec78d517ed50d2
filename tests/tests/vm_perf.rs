//! `usnvme perf` and `usnvme sweep` on the test bed's 24 file-backed drives.

use std::collections::BTreeMap;

use usnvme_tests::{vfio_msix_interrupts, VmBed};

fn run(bed: &VmBed, args: &[&str]) -> (String, String) {
    let out = bed.usnvme(args);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "usnvme {args:?}\n{stdout}\n{stderr}");
    (stdout, stderr)
}

/// Each vfio drive's Host Read Commands and Host Write Commands, from its own SMART log: the
/// emulated controller counts every command it completes, independently of usnvme's counters.
fn smart_commands(bed: &VmBed) -> BTreeMap<String, (u64, u64)> {
    let (stdout, _) = run(bed, &["health", "--json"]);
    let reports: Vec<serde_json::Value> = serde_json::from_str(&stdout).expect("health JSON");
    reports
        .iter()
        .map(|r| {
            let count = |key: &str| r[key].as_u64().unwrap_or_else(|| panic!("{key}: {r}"));
            let address = r["address"].as_str().expect("address").to_string();
            (
                address,
                (count("host_read_commands"), count("host_write_commands")),
            )
        })
        .collect()
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn perf_verifies_every_drive_and_its_counts_match_the_drives_own() {
    let bed = VmBed::from_env();
    let json = std::env::temp_dir().join("perf-24.json");
    let path = json.to_str().expect("utf-8");
    let before = smart_commands(&bed);
    let depth = 4;
    let (table, _) = run(
        &bed,
        &[
            "perf", "-q", "4", "-o", "4k", "-w", "randrw", "-M", "50", "-t", "2", "--verify", "-L",
            "--json", path,
        ],
    );
    let after = smart_commands(&bed);
    // a job per drive and core serving it: with two NUMA nodes, each drive has one core
    let rows = bed.drives * (3 - bed.numa_nodes);
    assert!(
        table.contains("Total") && table.contains("p99.99"),
        "{table}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parses");
    let jobs = v["jobs"].as_array().expect("jobs");
    assert_eq!(jobs.len(), rows);
    // Per drive, the I/Os perf counted against the commands the drive says it completed: as
    // many, plus at most those still in flight when the measurement ended (completed after it,
    // not counted); none counted that the drive did not do.
    assert_eq!(before.len(), bed.drives - bed.kernel_drives, "{before:?}");
    for (address, (reads_before, writes_before)) in &before {
        let mine: Vec<&serde_json::Value> = jobs
            .iter()
            .filter(|j| j["job options"]["filename"] == address.as_str())
            .collect();
        assert!(!mine.is_empty(), "no job ran on {address}");
        let counted = |dir: &str| -> u64 {
            mine.iter()
                .map(|j| j[dir]["total_ios"].as_u64().expect("total_ios"))
                .sum()
        };
        let (reads_after, writes_after) = after[address];
        let in_flight = (depth * mine.len()) as u64;
        for (dir, counted, done) in [
            ("read", counted("read"), reads_after - reads_before),
            ("write", counted("write"), writes_after - writes_before),
        ] {
            assert!(
                counted > 0 && counted <= done && done <= counted + in_flight,
                "{address}: perf counted {counted} {dir}s, the drive completed {done}"
            );
        }
    }
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn perf_verifies_two_stripes_of_twelve() {
    let bed = VmBed::from_env();
    let (table, _) = run(
        &bed,
        &[
            "perf", "--stripe", "12", "-q", "16", "-o", "64k", "-w", "randrw", "-t", "3",
            "--verify",
        ],
    );
    assert!(
        table.contains("stripe0") && table.contains("stripe1"),
        "{table}"
    );
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn a_short_sweep_writes_csv_json_and_svg() {
    let bed = VmBed::from_env();
    let dir = std::env::temp_dir().join("sweep");
    let d = dir.to_str().expect("utf-8");
    let (table, _) = run(
        &bed,
        &[
            "sweep",
            "-q",
            "8",
            "-t",
            "1",
            "--sizes",
            "4k,64k",
            "--patterns",
            "randread,write",
            "--out",
            d,
        ],
    );
    assert!(table.contains("randread IOPS"), "{table}");
    let csv = std::fs::read_to_string(dir.join("sweep.csv")).expect("csv");
    assert_eq!(csv.lines().count(), 1 + 4, "{csv}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("sweep.json")).expect("json"))
            .expect("parses");
    assert_eq!(json.as_array().map(Vec::len), Some(4));
    for chart in ["bandwidth.svg", "iops.svg"] {
        assert!(std::fs::read_to_string(dir.join(chart))
            .expect("svg")
            .starts_with("<svg"));
    }
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn perf_with_interrupts_verifies_every_drive_woken_by_its_msix_vectors() {
    let bed = VmBed::from_env();
    let json = std::env::temp_dir().join("perf-interrupts.json");
    let path = json.to_str().expect("utf-8");
    let before = vfio_msix_interrupts();
    let mut perf = std::process::Command::new(&bed.usnvme)
        .args([
            "perf",
            "-q",
            "1",
            "-o",
            "4k",
            "-w",
            "randrw",
            "-t",
            "2",
            "--verify",
            "--interrupts",
            "--json",
            path,
        ])
        .spawn()
        .expect("usnvme perf runs");
    // perf's vectors leave /proc/interrupts with it: the count as last seen while it ran
    let mut raised = 0;
    let status = loop {
        raised = raised.max(vfio_msix_interrupts().saturating_sub(before));
        if let Some(status) = perf.try_wait().expect("perf's status") {
            break status;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(status.success(), "perf: {status}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parses");
    let mut ios = 0;
    for job in v["jobs"].as_array().expect("jobs") {
        assert_eq!(job["failed_ios"], 0, "{job:#}");
        ios += job["read"]["total_ios"].as_u64().expect("reads")
            + job["write"]["total_ios"].as_u64().expect("writes");
    }
    println!("perf --interrupts on every drive, QD 1: {ios} I/Os, {raised} MSI-X interrupts");
    // at QD 1 every completion raises its vector: at least half as many as I/Os measured
    assert!(
        ios > 0 && raised >= ios / 2,
        "{ios} I/Os measured, {raised} interrupts"
    );
}

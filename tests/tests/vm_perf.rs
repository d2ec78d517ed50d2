//! `usnvme perf` and `usnvme sweep` on the test bed's 24 file-backed drives.

use usnvme_tests::VmBed;

fn run(bed: &VmBed, args: &[&str]) -> (String, String) {
    let out = bed.usnvme(args);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "usnvme {args:?}\n{stdout}\n{stderr}");
    (stdout, stderr)
}

fn total_iops(json: &serde_json::Value, dir: &str) -> f64 {
    json["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| j[dir]["iops"].as_f64().unwrap_or(0.0))
        .sum()
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn perf_verifies_every_drive_and_its_json_adds_up() {
    let bed = VmBed::from_env();
    let json = std::env::temp_dir().join("perf-24.json");
    let path = json.to_str().expect("utf-8");
    let (table, _) = run(
        &bed,
        &[
            "perf", "-q", "4", "-o", "4k", "-w", "randrw", "-M", "50", "-t", "2", "--verify", "-L",
            "--json", path,
        ],
    );
    // a job per drive and core serving it: with two NUMA nodes, each drive has one core
    let rows = bed.drives * (3 - bed.numa_nodes);
    assert!(
        table.contains("Total") && table.contains("p99.99"),
        "{table}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parses");
    let jobs = v["jobs"].as_array().expect("jobs").len();
    assert_eq!(jobs, rows);
    for dir in ["read", "write"] {
        let sum = total_iops(&v, dir);
        let total = v["total"][dir]["iops"].as_f64().expect("total iops");
        assert!(
            sum > 0.0 && (sum - total).abs() <= total * 1e-6 + 1.0,
            "{dir}: rows {sum} vs total {total}"
        );
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

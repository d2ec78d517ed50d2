//! `usnvme perf` run as a process on simulated drives: no root, no VFIO, a second or two each.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use usnvme_driver::pci::fake::FakeSysfs;

fn usnvme(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_usnvme"))
        .arg("perf")
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("usnvme runs")
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn json_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("usnvme-perf-{}-{name}.json", std::process::id()))
}

/// Runs perf with `--json` and returns the document.
fn perf_json(name: &str, args: &[&str]) -> Value {
    let path = json_path(name);
    let path_str = path.to_str().expect("UTF-8 temp path");
    let mut all = args.to_vec();
    all.extend(["--json", path_str]);
    let out = usnvme(&all);
    assert!(out.status.success(), "{}", text(&out));
    let doc = std::fs::read(&path).expect("the JSON file");
    let _ = std::fs::remove_file(&path);
    serde_json::from_slice(&doc).expect("JSON")
}

fn f(v: &Value) -> f64 {
    v.as_f64().expect("a number")
}

#[test]
fn bad_input_exits_2_naming_the_flag_before_any_io() {
    let cases: &[(&[&str], &str)] = &[
        (&["-q", "0"], "-q 0"),
        (&["-q", "100000"], "-q 100000"),
        (&["-q", "300", "-r", "sim:1,mqes=255"], "-q 300"),
        (&["-o", "4097"], "-o 4097"),
        (&["-o", "4x"], "-o 4x"),
        (&["-o", "3M"], "-o 3M"),
        (&["-w", "rw", "-M", "101"], "-M 101"),
        (&["-w", "sideways"], "-w sideways"),
        (&["-c", "4095"], "-c 4095"),
        (&["-c", "0xZ"], "-c"),
        (&["-c", "1-0"], "-c"),
        (&["-r", "sim:0"], "sim:0 is given twice"),
        (&["-t", "0"], "-t 0"),
        (&["--stripe", "x"], "--stripe x"),
        (&["--stripe", "3"], "--stripe 3"),
    ];
    for (args, flag) in cases {
        let mut all = vec!["-r", "sim:0", "-t", "1"];
        if args.contains(&"-t") {
            all.truncate(2);
        }
        all.extend_from_slice(args);
        let out = usnvme(&all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(
            stderr.contains(flag),
            "{args:?} should name {flag}: {stderr}"
        );
        assert_eq!(
            stderr.trim().lines().count(),
            1,
            "{args:?}: one line: {stderr}"
        );
        assert!(
            out.stdout.is_empty(),
            "{args:?}: no results: {}",
            text(&out)
        );
    }
}

#[test]
fn a_drive_not_on_vfio_is_a_usage_error() {
    let fake = FakeSysfs::new();
    fake.add_pci_device("0000:02:00.0", 0x010802, 0x1b36, 0x0010)
        .bind("nvme");
    fake.write("sys/devices/system/cpu/online", "0-1\n");
    fake.write(
        "proc/self/status",
        "Name:\tusnvme\nCpus_allowed_list:\t0-1\n",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_usnvme"))
        .args(["perf", "-r", "0000:02:00.0", "-t", "1"])
        .env("USNVME_SYSFS_ROOT", fake.root())
        .env_remove("RUST_LOG")
        .output()
        .expect("usnvme runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        stderr.contains("-r 0000:02:00.0") && stderr.contains("vfio-pci"),
        "{stderr}"
    );
}

#[test]
fn the_table_has_a_row_per_device_and_core_and_a_total() {
    let out = usnvme(&["-r", "sim:0-1", "-c", "0", "-q", "8", "-t", "1", "-LL"]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for needle in ["sim:0@core0", "sim:1@core0", "Total", "p99.99", "Histogram"] {
        assert!(stdout.contains(needle), "{needle}: {stdout}");
    }
}

#[test]
fn json_totals_are_the_sums_of_the_jobs() {
    let doc = perf_json(
        "sums",
        &[
            "-r", "sim:0-2", "-w", "randrw", "-M", "70", "-q", "8", "-t", "1", "-o", "8k",
        ],
    );
    let jobs = doc["jobs"].as_array().expect("jobs");
    assert!(jobs.len() >= 3, "{doc:#}");
    for dir in ["read", "write"] {
        let total = &doc["total"][dir];
        for key in ["io_bytes", "total_ios"] {
            let sum: u64 = jobs
                .iter()
                .map(|j| j[dir][key].as_u64().expect("u64"))
                .sum();
            assert_eq!(total[key].as_u64(), Some(sum), "{dir}.{key}: {doc:#}");
        }
        let iops: f64 = jobs.iter().map(|j| f(&j[dir]["iops"])).sum();
        assert!(
            (f(&total["iops"]) - iops).abs() <= 1e-6 * iops.max(1.0),
            "{doc:#}"
        );
        assert!(
            total["lat_ns"]["percentile"]["99.990000"].is_u64(),
            "{doc:#}"
        );
    }
    let (r, w) = (
        f(&doc["total"]["read"]["total_ios"]),
        f(&doc["total"]["write"]["total_ios"]),
    );
    assert!(r > w && w > 0.0, "a 70 % read mix: {r} reads, {w} writes");
    assert!(jobs[0]["jobname"].as_str().expect("name").contains("@core"));
}

#[test]
fn percentiles_of_a_known_latency_come_out_right() {
    let doc = perf_json(
        "latency",
        &[
            "-r",
            "sim:0,mode=threaded,latency=200us",
            "-c",
            "0",
            "-q",
            "1",
            "-t",
            "1",
            "-L",
        ],
    );
    let lat = &doc["total"]["read"]["lat_ns"];
    let min = lat["min"].as_u64().expect("min");
    let p50 = lat["percentile"]["50.000000"].as_u64().expect("p50");
    assert!(min >= 200_000, "no I/O is faster than the drive: {lat:#}");
    let mean = lat["mean"].as_f64().expect("mean");
    assert!(mean >= 200_000.0, "{lat:#}");
    // Upper bounds would be timing assertions (the simulator's thread wakes late on a busy
    // machine): check the shape instead — the percentiles are ordered and the median and max lie
    // at or above the drive's latency.
    let pct = |k: &str| lat["percentile"][k].as_u64().expect(k);
    let (p90, p99, max) = (
        pct("90.000000"),
        pct("99.000000"),
        lat["max"].as_u64().expect("max"),
    );
    assert!(
        200_000 <= p50 && p50 <= p90 && p90 <= p99 && p99 <= max,
        "{lat:#}"
    );
}

#[test]
fn rate_holds_within_a_few_percent() {
    let doc = perf_json(
        "rate",
        &[
            "-r", "sim:0-1", "-c", "0", "-q", "16", "-t", "2", "--rate", "3000",
        ],
    );
    let iops = f(&doc["total"]["read"]["iops"]);
    // never above the cap (a few percent for the token bucket's start); the lower bound is loose
    // so that a loaded machine does not fail a test about pacing
    assert!(
        (3000.0 * 0.75..=3000.0 * 1.05).contains(&iops),
        "{iops} IOPS"
    );
}

#[test]
fn io_count_stops_after_n_ios_per_device() {
    let doc = perf_json(
        "count",
        &["-r", "sim:0-1", "-c", "0", "-q", "8", "--io-count", "500"],
    );
    for job in doc["jobs"].as_array().expect("jobs") {
        assert_eq!(job["read"]["total_ios"].as_u64(), Some(500), "{job:#}");
    }
}

#[test]
fn warm_up_is_not_counted() {
    let doc = perf_json(
        "warmup",
        &["-r", "sim:0", "-c", "0", "-q", "4", "-t", "1", "-a", "1"],
    );
    let ms = doc["total"]["elapsed_ms"].as_u64().expect("elapsed");
    assert!((900..=1100).contains(&ms), "measured {ms} ms of a 1 s run");
}

#[test]
fn verify_passes_on_a_ram_drive_and_catches_a_corruption() {
    let args = [
        "-r",
        "sim:0-1,backend=ram,size=4M",
        "-w",
        "randrw",
        "-q",
        "8",
        "-t",
        "1",
        "--verify",
    ];
    let out = usnvme(&args);
    assert!(out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("checked no block"), "{stderr}");
    let mut bad = args.to_vec();
    bad.extend(["--corrupt-after", "50"]);
    let out = usnvme(&bad);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        stderr.contains("verify: sim:") && stderr.contains("LBA"),
        "{stderr}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("Total"));
}

#[test]
fn two_stripes_of_twelve_run() {
    let doc = perf_json(
        "stripe",
        &[
            "-r", "sim:0-23", "--stripe", "12", "-o", "128k", "-q", "4", "-t", "1",
        ],
    );
    let jobs = doc["jobs"].as_array().expect("jobs");
    let names: Vec<&str> = jobs.iter().filter_map(|j| j["device"].as_str()).collect();
    assert!(
        names.contains(&"stripe0") && names.contains(&"stripe1"),
        "{names:?}"
    );
    assert!(doc["total"]["read"]["total_ios"].as_u64() > Some(0));
}

#[test]
fn sigterm_stops_the_run_and_prints_partial_results() {
    let child = Command::new(env!("CARGO_BIN_EXE_usnvme"))
        .args(["perf", "-r", "sim:0", "-c", "0", "-q", "4", "-t", "30"])
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("usnvme runs");
    std::thread::sleep(Duration::from_millis(1500));
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let out = child.wait_with_output().expect("usnvme exits");
    assert_eq!(out.status.code(), Some(143), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Total"),
        "{}",
        text(&out)
    );
}

#[test]
fn verify_catches_writes_the_simulated_drive_misdirects() {
    let out = usnvme(&[
        "-r",
        "sim:0,backend=ram,size=1M,misdirect=20",
        "-w",
        "randrw",
        "-M",
        "50",
        "-q",
        "4",
        "-o",
        "4k",
        "-t",
        "1",
        "--verify",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("usnvme: verify: sim:0: LBA")
            && err.contains("holds the block of byte offset"),
        "{err}"
    );
    // the same run without the fault is clean
    let out = usnvme(&[
        "-r",
        "sim:0,backend=ram,size=1M",
        "-w",
        "randrw",
        "-M",
        "50",
        "-q",
        "4",
        "-o",
        "4k",
        "-t",
        "1",
        "--verify",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

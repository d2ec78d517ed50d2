//! `usnvme sweep` on simulated drives: the matrix, its files, the latency curve, bad flags.

use std::process::Command;

fn usnvme(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_usnvme"))
        .args(args)
        .output()
        .expect("usnvme runs")
}

fn out_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("usnvme-sweep-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn a_small_sweep_writes_its_table_csv_json_and_charts() {
    let dir = out_dir("matrix");
    let d = dir.to_str().expect("utf-8 path");
    let out = usnvme(&[
        "sweep",
        "-r",
        "sim:0-1",
        "-q",
        "4",
        "-t",
        "1",
        "--sizes",
        "4k,64k",
        "--patterns",
        "read,randwrite",
        "--out",
        d,
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("block size") && stdout.contains("randwrite IOPS"),
        "{stdout}"
    );
    let csv = std::fs::read_to_string(dir.join("sweep.csv")).expect("sweep.csv");
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 1 + 4, "{csv}");
    assert!(lines[0].starts_with("pattern,block_size,iops"));
    for line in &lines[1..] {
        let iops: f64 = line
            .split(',')
            .nth(2)
            .and_then(|v| v.parse().ok())
            .expect("iops");
        assert!(iops > 0.0, "{line}");
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("sweep.json")).expect("json"))
            .expect("parses");
    assert_eq!(json.as_array().map(Vec::len), Some(4));
    for chart in ["bandwidth.svg", "iops.svg"] {
        let svg = std::fs::read_to_string(dir.join(chart)).expect("chart");
        assert!(
            svg.starts_with("<svg") && svg.contains("randwrite") && svg.contains("64K"),
            "{chart}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_latency_curve_runs_the_peak_then_ten_steps_and_uncapped() {
    let dir = out_dir("curve");
    let d = dir.to_str().expect("utf-8 path");
    let out = usnvme(&[
        "sweep",
        "-r",
        "sim:0",
        "-q",
        "4",
        "-t",
        "1",
        "-w",
        "randread",
        "--latency-curve",
        "--out",
        d,
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("peak:"), "{stdout}");
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.trim_start().starts_with(char::is_numeric)
                || l.trim_start().starts_with("max"))
            .count(),
        11,
        "{stdout}"
    );
    assert!(std::fs::read_to_string(dir.join("latency.svg"))
        .expect("chart")
        .starts_with("<svg"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_sweep_flags_exit_2_naming_the_flag() {
    for (args, flag) in [
        (
            &["sweep", "-r", "sim:0", "--sizes", "4k,1000"][..],
            "--sizes",
        ),
        (
            &["sweep", "-r", "sim:0", "--patterns", "rw"][..],
            "--patterns",
        ),
        (
            &["sweep", "-r", "sim:0,bs=4096", "--sizes", "512"][..],
            "-o",
        ),
    ] {
        let out = usnvme(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(flag), "{args:?}: {err}");
    }
}

#[test]
fn a_sweep_with_pi_runs_every_point_on_a_pi_drive_with_its_checks() {
    let dir = out_dir("pi");
    let d = dir.to_str().expect("utf-8 path");
    let out = usnvme(&[
        "sweep",
        "-r",
        "sim:0,ms=8,pi=1,mset=1,backend=ram,size=16M",
        "--pi",
        "PRACT=0,PRCHK=GUARD|REFTAG|APPTAG",
        "-q",
        "4",
        "-t",
        "1",
        "--sizes",
        "4k,64k",
        "--patterns",
        "randwrite,randread",
        "--verify",
        "--out",
        d,
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("4K") && stdout.contains("64K"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

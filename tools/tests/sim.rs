//! The tools on simulated drives: no root, no VFIO, no VM.

use std::process::Command;

fn usnvme(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_usnvme"))
        .args(args)
        .output()
        .expect("usnvme runs")
}

#[test]
fn identify_describes_simulated_drives_like_real_ones() {
    let out = usnvme(&["identify", "--json", "sim:0-3,bs=4096,size=64M"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let drives: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("JSON array");
    assert_eq!(drives.len(), 4);
    for (i, d) in drives.iter().enumerate() {
        assert_eq!(d["serial"], format!("sim{i}"), "{d:#}");
        let ns = &d["namespaces"][0];
        assert_eq!(ns["capacity_bytes"], 64 << 20, "{ns:#}");
    }
    let text = usnvme(&["identify", "sim:2"]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("Serial:                 sim2"));
}

#[test]
fn health_of_a_simulated_drive_is_ok() {
    let out = usnvme(&["health", "sim:0"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("Health:") && text.contains("OK"), "{text}");
}

#[test]
fn a_bad_sim_address_is_a_usage_error_naming_the_valid_options() {
    let out = usnvme(&["identify", "sim:0,colour=blue"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown sim option `colour`") && err.contains("backend=null|ram"),
        "{err}"
    );
}

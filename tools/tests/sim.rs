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

#[test]
fn identify_reports_metadata_and_protection_information_as_the_format_has_them() {
    let out = usnvme(&[
        "identify",
        "--json",
        "sim:0,bs=4096,ms=64,mset=1,pi=3,pif=2",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let drives: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("JSON array");
    let ns = &drives[0]["namespaces"][0];
    assert_eq!(
        (
            &ns["metadata_size"],
            &ns["metadata_extended"],
            &ns["protection"]
        ),
        (
            &serde_json::json!(64),
            &serde_json::json!(true),
            &serde_json::json!({"type": 3, "guard_bits": 64, "location": "last"})
        ),
        "{ns:#}"
    );
    let text = usnvme(&["identify", "sim:0,ms=8,pi=1"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("8 B per block, in a buffer apart")
            && text.contains("type 1, 16-bit guard, in the last bytes of the metadata"),
        "{text}"
    );
}

#[test]
fn format_asks_for_yes_and_names_what_it_cannot_do() {
    let out = usnvme(&["format", "sim:0", "--block-size", "4096"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("destroys every block of every namespace of sim:0: add --yes"),
        "{err}"
    );
    let out = usnvme(&[
        "format",
        "sim:0",
        "--block-size",
        "512",
        "--pi",
        "1",
        "--yes",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("at least 8 bytes of metadata"), "{err}");
    // the simulated controller has no Format NVM (QEMU's does: the VM suite formats for real)
    let out = usnvme(&["format", "sim:0", "--block-size", "4096", "--yes"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("sim:0: the controller does not support Format NVM"),
        "{err}"
    );
}

#[test]
fn self_test_and_sanitize_follow_their_progress_to_the_end() {
    let out = usnvme(&["self-test", "sim:0-1", "--extended"]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    for d in ["sim:0", "sim:1"] {
        assert!(
            stdout.contains(&format!("{d}: extended self-test completed without error")),
            "{stdout}"
        );
        assert!(
            stderr.contains(&format!("{d}: extended self-test: 0 %")),
            "{stderr}"
        );
    }
    let out = usnvme(&["sanitize", "sim:0", "--action", "block-erase"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("add --yes"), "{err}");
    let out = usnvme(&["sanitize", "sim:0", "--action", "crypto-erase", "--yes"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("sim:0: sanitize (crypto erase) completed")
    );
}

#[test]
fn firmware_slots_are_shown_and_an_image_is_downloaded_and_committed_by_name() {
    let out = usnvme(&["identify", "--json", "sim:0"]);
    let drives: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("JSON array");
    assert_eq!(
        drives[0]["firmware_slots"],
        serde_json::json!({"active_slot": 1, "next_reset_slot": null,
                           "revisions": ["1.0", null], "slot1_read_only": true})
    );
    let image = std::env::temp_dir().join(format!("usnvme-fw-{}.bin", std::process::id()));
    std::fs::write(&image, b"SIMFW002 and the rest of the image").expect("image");
    let path = image.to_str().expect("UTF-8");
    let out = usnvme(&["fw", "download", "sim:0", "--file", path]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("sim:0: 34 bytes of firmware downloaded"));
    let _ = std::fs::remove_file(&image);
    // each usnvme process brings its own sim up: here slot 1's image is made to run again,
    // and a commit with no image downloaded is refused by its status
    let out = usnvme(&[
        "fw", "commit", "sim:0", "--slot", "1", "--action", "activate",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("running slot 1, next reset slot 1"),
        "{stdout}"
    );
    let out = usnvme(&["fw", "commit", "sim:0", "--action", "replace"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("Firmware Commit failed: Invalid Firmware Image"),
        "{err}"
    );
}

#[test]
fn health_reports_the_events_a_drive_raised_and_its_warning() {
    let out = usnvme(&["health", "sim:0,warn=temperature"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("Health:                      WARNING: critical warning: temperature")
            && text.contains(
                "Asynchronous events:         SMART / health: temperature threshold (type 1, information 0x01, log page 0x02)"
            ),
        "{text}"
    );
    // and logged as it came
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("sim:0: asynchronous event: SMART / health: temperature threshold"));
    let out = usnvme(&["health", "sim:0,warn=hot"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("reliability, temperature or spare"));
}

#[test]
fn namespaces_are_listed_created_attached_detached_and_deleted_by_name() {
    let text = |out: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let out = usnvme(&["ns", "list", "sim:0,size=64M,spare=64M"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("sim:0: namespace 1: attached, 131072 blocks of 512 B")
            && text(&out).contains("sim:0: 1 namespaces allocated; 64 MiB of 128 MiB unallocated"),
        "{}",
        text(&out)
    );
    // each usnvme process brings its own sim up: one command per process
    let out = usnvme(&[
        "ns",
        "create",
        "sim:0,size=64M,spare=64M",
        "--size",
        "32M",
        "--block-size",
        "4096",
        "--metadata",
        "8",
        "--pi",
        "1",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("sim:0: namespace 2 created (detached): 8192 blocks of 4096 B + 8 B metadata, protection information type 1"),
        "{}",
        text(&out)
    );
    let out = usnvme(&[
        "ns",
        "create",
        "sim:0",
        "--size",
        "32M",
        "--block-size",
        "512",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("Namespace Insufficient Capacity"),
        "{}",
        text(&out)
    );
    let out = usnvme(&[
        "ns",
        "create",
        "sim:0,spare=1G",
        "--size",
        "32M",
        "--block-size",
        "2048",
    ]);
    assert!(
        text(&out).contains(
            "no LBA format of 2048 B data + 0 B metadata; this drive offers 512+0, 512+8"
        ),
        "{}",
        text(&out)
    );
    let out = usnvme(&["ns", "attach", "sim:0", "-n", "1"]);
    assert!(
        text(&out).contains("Namespace Already Attached"),
        "{}",
        text(&out)
    );
    // another controller of the subsystem by its ID: the sim's has one, controller 1
    let out = usnvme(&["ns", "detach", "sim:0", "-n", "1", "--controller", "9"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("Controller List Invalid"),
        "{}",
        text(&out)
    );
    let out = usnvme(&["ns", "detach", "sim:0", "-n", "1", "--controller", "1"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("sim:0: namespace 1 detached (controller 1)"),
        "{}",
        text(&out)
    );
    let out = usnvme(&["ns", "delete", "sim:0", "-n", "1"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("add --yes"), "{}", text(&out));
    let out = usnvme(&["ns", "delete", "sim:0", "-n", "1", "--yes"]);
    assert!(
        text(&out).contains("sim:0: namespace 1 deleted"),
        "{}",
        text(&out)
    );
    let out = usnvme(&["ns", "delete", "sim:0", "-n", "7", "--yes"]);
    assert!(
        text(&out).contains("Invalid Namespace or Format"),
        "{}",
        text(&out)
    );
}

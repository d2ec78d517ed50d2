//! Live progress (a line redrawn with `\r`) only where a person watches a terminal: `usnvme perf`
//! and `usnvme sweep` run under a pseudo-terminal (util-linux `script`) on simulated drives, with
//! and without `USNVME_PROGRESS=0` (what `cargo xtask vm-run` sets) and `CI`.

use std::process::Command;

/// Runs `usnvme ARGS` on a pseudo-terminal with `env` added (and `CI`, `USNVME_PROGRESS` removed
/// first); returns what the terminal showed.
fn on_a_terminal(args: &[&str], env: &[(&str, &str)]) -> String {
    let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let line: Vec<String> = std::iter::once(env!("CARGO_BIN_EXE_usnvme"))
        .chain(args.iter().copied())
        .map(quote)
        .collect();
    let mut cmd = Command::new("script");
    // -q: no banner, -e: the child's exit code, -f: flush as it comes; no typescript file
    cmd.args(["-qefc", &line.join(" "), "/dev/null"])
        .env_remove("CI")
        .env_remove("USNVME_PROGRESS")
        .env_remove("RUST_LOG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd
        .output()
        .expect("`script` (util-linux) runs: apt-get install util-linux");
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{args:?} {env:?}: {:?}\n{shown}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    shown
}

/// The terminal turns every `\n` into `\r\n`; a `\r` on its own redraws the line.
fn redraws(shown: &str) -> Vec<&str> {
    shown
        .split('\r')
        .skip(1)
        .filter(|rest| !rest.starts_with('\n'))
        .collect()
}

const PERF: &[&str] = &["perf", "-r", "sim:0", "-q", "4", "-t", "3"];

#[test]
fn perf_draws_progress_on_a_terminal() {
    let shown = on_a_terminal(PERF, &[]);
    assert!(
        redraws(&shown).iter().any(|l| l.contains(" IOPS ")),
        "no live progress line:\n{shown:?}"
    );
}

#[test]
fn perf_draws_no_progress_when_told_it_is_logged() {
    let shown = on_a_terminal(PERF, &[("USNVME_PROGRESS", "0")]);
    assert!(redraws(&shown).is_empty(), "progress in a log:\n{shown:?}");
    assert!(shown.contains("Total"), "the results are there:\n{shown}");
}

#[test]
fn perf_draws_no_progress_in_ci() {
    let shown = on_a_terminal(PERF, &[("CI", "true")]);
    assert!(redraws(&shown).is_empty(), "progress in CI:\n{shown:?}");
}

#[test]
fn sweep_redraws_only_where_a_person_watches() {
    let dir = std::env::temp_dir().join(format!("usnvme-progress-{}", std::process::id()));
    let d = dir.to_str().expect("UTF-8 temp path");
    let args = [
        "sweep",
        "-r",
        "sim:0",
        "-t",
        "1",
        "--sizes",
        "4k",
        "--patterns",
        "read",
        "--out",
        d,
    ];
    let watched = on_a_terminal(&args, &[]);
    assert!(
        redraws(&watched).iter().any(|l| l.contains("points")),
        "no live progress line:\n{watched:?}"
    );
    let logged = on_a_terminal(&args, &[("USNVME_PROGRESS", "0")]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        redraws(&logged).is_empty(),
        "progress in a log:\n{logged:?}"
    );
    // a log still says how far the sweep is, one line per point
    assert!(logged.contains("1/1 points"), "{logged}");
}

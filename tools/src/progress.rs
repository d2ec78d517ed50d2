//! Whether to draw live progress (a line redrawn with `\r`): only where a person watches a
//! terminal. A terminal that is really a log (the test-bed guest's console, a CI job's pseudo
//! terminal) says so through the environment.

use std::io::IsTerminal;

/// `USNVME_PROGRESS=0` turns live progress off even on a terminal; `cargo xtask vm-run` sets it
/// for the programs it runs, whose console output is a log.
pub const ENV: &str = "USNVME_PROGRESS";

/// Live progress on stderr: only on a terminal, not with `USNVME_PROGRESS=0`, not in CI (`CI` set).
pub fn wanted() -> bool {
    decide(
        std::io::stderr().is_terminal(),
        std::env::var(ENV).ok().as_deref(),
        std::env::var("CI").ok().as_deref(),
    )
}

/// The rule of [`wanted`], on its inputs.
fn decide(terminal: bool, progress: Option<&str>, ci: Option<&str>) -> bool {
    // CI services set CI=true (some CI=1); an empty or "false" value is no CI.
    let in_ci = ci.is_some_and(|v| !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false"));
    terminal && progress != Some("0") && !in_ci
}

#[cfg(test)]
mod tests {
    use super::decide;

    #[test]
    fn only_on_a_terminal_that_nobody_said_is_a_log() {
        assert!(decide(true, None, None));
        assert!(!decide(false, None, None));
        assert!(!decide(true, Some("0"), None));
        assert!(decide(true, Some("1"), None));
        assert!(!decide(true, None, Some("true")));
        assert!(!decide(true, Some("1"), Some("1")));
        assert!(decide(true, None, Some("")));
        assert!(decide(true, None, Some("false")));
    }
}

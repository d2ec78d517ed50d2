//! Running host commands with errors that name the step and the fix.

use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

/// Runs `cmd`, inheriting output; fails naming `step` and `fix` when it cannot start or fails.
pub fn run(step: &str, cmd: &mut Command, fix: &str) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("{step}: cannot start {:?}. Fix: {fix}", cmd.get_program()))?;
    if !status.success() {
        bail!("{step}: {:?} failed ({status}). Fix: {fix}", cmd_line(cmd));
    }
    Ok(())
}

/// Runs `cmd` and returns its stdout; stderr is shown on failure.
pub fn output(step: &str, cmd: &mut Command, fix: &str) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("{step}: cannot start {:?}. Fix: {fix}", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{step}: {} failed ({}):\n{}\nFix: {fix}",
            cmd_line(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `program arg arg`, for messages.
pub fn cmd_line(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Quotes `s` for a POSIX shell.
pub fn sh_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+=:,@%".contains(&b))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::sh_quote;

    #[test]
    fn sh_quote_leaves_plain_words_and_quotes_the_rest() {
        assert_eq!(sh_quote("/usr/bin/usnvme"), "/usr/bin/usnvme");
        assert_eq!(sh_quote("a b"), "'a b'");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
        assert_eq!(sh_quote(""), "''");
        assert_eq!(sh_quote("$(reboot)"), "'$(reboot)'");
    }
}

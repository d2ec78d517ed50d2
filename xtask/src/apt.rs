//! Installing host packages with apt, the one way every xtask command does it: never removing
//! or downgrading what the machine has (`--no-remove`; no `--allow-downgrades`, so apt refuses
//! a downgrade under `-y`), the package lists refreshed once when an install fails on stale
//! ones, and a release's candidates looked at before anything is installed.

use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::cmd;

/// The fix every apt failure suggests.
const FIX: &str =
    "run as root on Debian with the package archive reachable, or install them by hand";

/// Installs `packages` (from `release`, e.g. `bookworm-backports`, when given), keeping every
/// package the machine has: where apt would have to remove or downgrade one, it stops and
/// this fails, naming the step.
pub fn install(step: &str, packages: &[&str], release: Option<&str>) -> Result<()> {
    let attempt = || {
        let mut apt = Command::new("apt-get");
        apt.args([
            "install",
            "-y",
            "-q",
            "--no-install-recommends",
            "--no-remove",
        ]);
        if let Some(release) = release {
            apt.args(["-t", release]);
        }
        apt.args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
    };
    if attempt().is_ok_and(|s| s.success()) {
        return Ok(());
    }
    update(step)?;
    let status = attempt().with_context(|| format!("{step}: cannot run apt-get. Fix: {FIX}"))?;
    if !status.success() {
        bail!(
            "{step}: apt-get install {} failed ({status}): apt refuses to remove or downgrade \
             a package to make room (see its message above). Fix: {FIX}",
            packages.join(" ")
        );
    }
    Ok(())
}

/// `apt-get update`.
pub fn update(step: &str) -> Result<()> {
    cmd::run(
        &format!("{step}: apt-get update"),
        Command::new("apt-get").args(["update", "-q"]),
        FIX,
    )
}

/// The version apt would install of `package` now (its `Candidate:`); `None` when it knows none.
pub fn candidate(package: &str) -> Result<Option<String>> {
    let policy = cmd::output(
        "apt-cache policy",
        Command::new("apt-cache").args(["policy", package]),
        FIX,
    )?;
    Ok(candidate_in(&policy).map(str::to_string))
}

/// Those of `packages` that dpkg does not have installed (`dpkg-query`; a package dpkg has never
/// heard of is not installed either).
pub fn not_installed<'a>(packages: &[&'a str]) -> Result<Vec<&'a str>> {
    // exits 1 when it knows some package not at all, after listing the others
    let out = Command::new("dpkg-query")
        .arg("-W")
        .arg("-f=${Package} ${db:Status-Abbrev}\n")
        .args(packages)
        .output()
        .with_context(|| format!("cannot run dpkg-query. Fix: {FIX}"))?;
    let listed = String::from_utf8_lossy(&out.stdout);
    Ok(packages
        .iter()
        .copied()
        .filter(|p| !installed_in(&listed, p))
        .collect())
}

/// Whether `dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n'` output shows `package`
/// installed (`ii`).
fn installed_in(listed: &str, package: &str) -> bool {
    listed.lines().any(|l| {
        let mut words = l.split_whitespace();
        words.next() == Some(package) && words.next().is_some_and(|s| s.starts_with("ii"))
    })
}

/// The candidate in `apt-cache policy` output.
fn candidate_in(policy: &str) -> Option<&str> {
    policy
        .lines()
        .find_map(|l| l.trim().strip_prefix("Candidate:"))
        .map(str::trim)
        .filter(|v| *v != "(none)")
}

/// The upstream major version of a Debian version: 10 of `1:10.0.2+ds-2+deb13u1~bpo12+1`.
pub fn upstream_major(version: &str) -> Option<u32> {
    let upstream = version.split_once(':').map_or(version, |(_, v)| v);
    upstream.split(['.', '+', '-', '~']).next()?.parse().ok()
}

/// This machine's Debian release (`bookworm`), from `/etc/os-release`; `None` elsewhere.
pub fn debian_codename() -> Option<String> {
    let os = std::fs::read_to_string("/etc/os-release").ok()?;
    let field = |k: &str| {
        os.lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.trim_matches('"').to_string())
    };
    (field("ID=").as_deref() == Some("debian"))
        .then(|| field("VERSION_CODENAME="))
        .flatten()
}

/// Writes apt source file `path` (`why`: a comment saying what it is for) for `suites` of
/// Debian's archive (`types`: `deb` or `deb-src`), then updates the lists.
pub fn add_source(step: &str, path: &str, why: &str, types: &str, suites: &str) -> Result<()> {
    std::fs::write(
        path,
        format!(
            "# written by cargo xtask: {why}\nTypes: {types}\nURIs: http://deb.debian.org/debian\n\
             Suites: {suites}\nComponents: main\n\
             Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
        ),
    )
    .with_context(|| format!("{step}: writing {path}. Fix: run as root"))?;
    update(step)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_package_is_installed_where_dpkg_query_says_ii() {
        let listed = "libibverbs1 ii \nrdma-core rc \nlibclang-dev iU \n";
        assert!(installed_in(listed, "libibverbs1"));
        assert!(
            !installed_in(listed, "rdma-core"),
            "removed, config files left"
        );
        assert!(
            !installed_in(listed, "libclang-dev"),
            "unpacked, not configured"
        );
        assert!(!installed_in(listed, "librdmacm1"), "unknown to dpkg");
        assert!(
            !installed_in(listed, "libibverbs"),
            "a prefix is another package"
        );
    }

    #[test]
    fn the_candidate_and_its_major_version_come_from_apt_cache_policy() {
        let policy = "qemu-utils:\n  Installed: 1:10.0.2+ds-2+deb13u1~bpo12+1\n  \
                      Candidate: 1:7.2+dfsg-7+deb12u18+b3\n  Version table:\n";
        let candidate = candidate_in(policy).expect("a candidate");
        assert_eq!(candidate, "1:7.2+dfsg-7+deb12u18+b3");
        assert_eq!(upstream_major(candidate), Some(7));
        assert_eq!(upstream_major("1:10.0.2+ds-2+deb13u1~bpo12+1"), Some(10));
        assert_eq!(upstream_major("3.33-3"), Some(3));
        assert_eq!(
            candidate_in("foo:\n  Installed: (none)\n  Candidate: (none)\n"),
            None
        );
        assert_eq!(candidate_in(""), None);
    }
}

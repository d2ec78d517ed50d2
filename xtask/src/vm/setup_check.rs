//! `cargo xtask vm-setup-check`: `vm-setup` on a machine state that once went wrong, checked.
//! A fresh Debian 12 (a debootstrap chroot under `target/setup-check/`, the bootstrap cached)
//! is given backports' `qemu-utils` 10, as a user's machine had it; then this program's own
//! `vm-setup --packages-only` runs in it. It must install QEMU 10 once, remove and downgrade
//! nothing (apt's history says), and leave `qemu-img` answering. Needs root and Debian's
//! archive; not part of `cargo xtask ci` (it downloads some 150 MB, more since vm-setup installs
//! the RDMA build packages, libclang among them).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};

use crate::{apt, cmd};

const STEP: &str = "vm-setup-check";
const MIRROR: &str = "http://deb.debian.org/debian";

pub fn run() -> Result<()> {
    let dir = crate::target_dir().join("setup-check");
    let base = bootstrapped(&dir)?;
    let root = dir.join("root");
    unmount_leftovers(&root)?;
    if root.exists() {
        std::fs::remove_dir_all(&root)
            .with_context(|| format!("{STEP}: removing {}", root.display()))?;
    }
    std::fs::create_dir_all(&root)?;
    cmd::run(
        &format!("{STEP}: a fresh Debian 12"),
        Command::new("tar")
            .arg("-xf")
            .arg(&base)
            .arg("-C")
            .arg(&root),
        "delete target/setup-check and run it again",
    )?;
    let _mounts = Mounts::new(&root)?;
    std::fs::copy("/etc/resolv.conf", root.join("etc/resolv.conf"))?;

    eprintln!("{STEP}: the user's machine: qemu-utils from bookworm-backports");
    in_root(
        &root,
        "backports' qemu-utils",
        &format!(
            "echo 'deb {MIRROR} bookworm-backports main' > /etc/apt/sources.list.d/backports.list \
             && apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
             --no-install-recommends -t bookworm-backports qemu-utils"
        ),
    )?;
    let before = qemu_img_version(&root)?;
    let history = root.join("var/log/apt/history.log");
    let logged = std::fs::read_to_string(&history).unwrap_or_default().len();

    eprintln!("{STEP}: cargo xtask vm-setup --packages-only in it");
    let xtask = std::env::current_exe().context("this program's path")?;
    std::fs::copy(&xtask, root.join("usr/local/bin/xtask"))?;
    in_root(&root, "vm-setup", "xtask vm-setup --packages-only")?;

    let after = qemu_img_version(&root)?;
    ensure!(
        after == before,
        "{STEP}: qemu-img was {before:?} and is {after:?} after vm-setup"
    );
    let history = std::fs::read_to_string(&history).unwrap_or_default();
    let setup = history.get(logged..).unwrap_or("");
    let installs = setup
        .lines()
        .filter(|l| l.starts_with("Install:") && l.contains("qemu-system-x86:"))
        .count();
    ensure!(
        installs == 1,
        "{STEP}: apt installed qemu-system-x86 {installs} times:\n{setup}"
    );
    if let Some(line) = setup.lines().find(|l| {
        ["Remove:", "Purge:", "Downgrade:"]
            .iter()
            .any(|w| l.starts_with(w))
    }) {
        bail!("{STEP}: vm-setup made apt change what the machine had: {line}");
    }
    let qemu = in_root_output(&root, "qemu-system-x86_64 --version")?;
    println!(
        "{STEP}: ok: qemu-utils kept ({after}), QEMU installed once ({}), nothing removed or \
         downgraded",
        qemu.lines().next().unwrap_or("").trim()
    );
    Ok(())
}

/// A minimal Debian 12, made once and kept as a tarball in `dir`.
fn bootstrapped(dir: &Path) -> Result<PathBuf> {
    let tarball = dir.join("bookworm-minbase.tar");
    if tarball.exists() {
        return Ok(tarball);
    }
    if !Path::new("/usr/sbin/debootstrap").exists() {
        apt::install(STEP, &["debootstrap"], None)?;
    }
    let staging = dir.join("bootstrap");
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging)?;
    eprintln!(
        "{STEP}: debootstrap bookworm (once; cached in {})",
        tarball.display()
    );
    cmd::run(
        &format!("{STEP}: debootstrap"),
        Command::new("debootstrap")
            .args(["--variant=minbase", "bookworm"])
            .arg(&staging)
            .arg(MIRROR),
        "run as root with Debian's archive reachable",
    )?;
    let partial = tarball.with_extension("partial");
    cmd::run(
        &format!("{STEP}: keep the bootstrap"),
        Command::new("tar")
            .arg("-cf")
            .arg(&partial)
            .arg("-C")
            .arg(&staging)
            .arg("."),
        "check the free space under target/",
    )?;
    std::fs::rename(&partial, &tarball)?;
    let _ = std::fs::remove_dir_all(&staging);
    Ok(tarball)
}

/// `sh -c script` in the chroot.
fn in_root(root: &Path, what: &str, script: &str) -> Result<()> {
    cmd::run(
        &format!("{STEP}: {what}"),
        Command::new("chroot")
            .arg(root)
            .args(["sh", "-c", script])
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"),
        "see apt's message above",
    )
}

fn in_root_output(root: &Path, script: &str) -> Result<String> {
    cmd::output(
        STEP,
        Command::new("chroot")
            .arg(root)
            .args(["sh", "-c", script])
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"),
        "see the message above",
    )
}

/// `qemu-img --version`'s first line in the chroot.
fn qemu_img_version(root: &Path) -> Result<String> {
    let out = in_root_output(root, "qemu-img --version")?;
    Ok(out.lines().next().unwrap_or("").trim().to_string())
}

/// Unmounts what a run stopped midway left mounted in `root`: deleting the folder must never
/// reach the machine's /dev through a bind mount.
fn unmount_leftovers(root: &Path) -> Result<()> {
    let mounted = || {
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        let root = root.to_string_lossy().into_owned();
        mounts
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1))
            .any(|at| at.starts_with(&root))
    };
    if mounted() {
        for what in ["proc", "dev"] {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(root.join(what))
                .status();
        }
    }
    ensure!(
        !mounted(),
        "{STEP}: something is still mounted under {}. Fix: unmount it (see /proc/mounts)",
        root.display()
    );
    Ok(())
}

/// /proc and /dev in the chroot (apt's maintainer scripts use them), unmounted when dropped.
struct Mounts(Vec<PathBuf>);

impl Mounts {
    fn new(root: &Path) -> Result<Mounts> {
        let mut mounts = Mounts(Vec::new());
        for (what, args) in [
            ("proc", &["-t", "proc", "proc"][..]),
            ("dev", &["--bind", "/dev"]),
        ] {
            let at = root.join(what);
            cmd::run(
                &format!("{STEP}: mount {what}"),
                Command::new("mount").args(args).arg(&at),
                "run as root",
            )?;
            mounts.0.push(at);
        }
        Ok(mounts)
    }
}

impl Drop for Mounts {
    fn drop(&mut self) {
        for at in self.0.iter().rev() {
            let _ = Command::new("umount").arg("-l").arg(at).status();
        }
    }
}

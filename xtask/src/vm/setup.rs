//! `cargo xtask vm-setup`: host packages, the Debian guest kernel, and the initramfs, cached under
//! `target/vm/`. Idempotent: a second call checks and does nothing.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use super::{initramfs, kmod, vm_dir};
use crate::{apt, cmd};

/// Host packages the test bed needs besides QEMU ([`ensure_qemu`]), with the file that shows
/// each is installed.
const PACKAGES: &[(&str, &str)] = &[
    ("busybox-static", "/bin/busybox"),
    ("fio", "/usr/bin/fio"),
    // the kernel's NVMe over Fabrics tooling, run in the guest against `usnvme serve`
    ("nvme-cli", "/usr/sbin/nvme"),
];

/// Host packages for NVMe over RDMA on soft-RoCE in the guest, which runs the host's root:
/// libibverbs with its providers (rxe's among them), librdmacm, `ibv_devices` and friends, and
/// iproute2's `rdma`, which adds the rxe device. Checked with dpkg: their files' paths carry the
/// architecture or the provider ABI.
const RDMA_PACKAGES: &[&str] = &[
    "libibverbs1",
    "librdmacm1",
    "ibverbs-providers",
    "ibverbs-utils",
    "iproute2",
];

/// What the workspace builds with besides Rust: the `rdma` feature's `rdma-sys` runs bindgen
/// (libclang) on the verbs and rdma_cm headers, which it finds with pkg-config. Checked with dpkg
/// (`libclang-dev` is a dependency package with no file of its own).
pub const BUILD_PACKAGES: &[&str] = &[
    "libibverbs-dev",
    "librdmacm-dev",
    "libclang-dev",
    "pkg-config",
];

/// The oldest QEMU the bed runs on. QEMU 7.2 (Debian 12's own) segfaults under the guest suites'
/// load (NVMe behind the emulated Intel IOMMU, multi-threaded TCG): CI lost whole runs to it.
const MIN_QEMU_MAJOR: u32 = 10;

/// Where Debian 12 gets a QEMU that new: its backports suite.
const BACKPORTS_SOURCES: &str = "/etc/apt/sources.list.d/usnvme-bookworm-backports.sources";

/// Firmware: qboot boots fastest; SeaBIOS is needed to enumerate `pxb-pcie` expander buses (NUMA).
pub const QBOOT: &str = "/usr/share/qemu/qboot.rom";
pub const SEABIOS: &str = "/usr/share/seabios/bios-256k.bin";

/// What a boot needs, all present.
#[derive(Debug, Clone)]
pub struct Assets {
    pub vmlinux: PathBuf,
    pub initramfs: PathBuf,
    pub kernel_release: String,
}

#[derive(Debug, Default, clap::Args)]
pub struct SetupArgs {
    /// Install the host packages (QEMU, busybox, fio, nvme-cli, RDMA user space and the
    /// workspace's build dependencies) only: no guest kernel, no initramfs (needs no clone of
    /// the repository).
    #[arg(long)]
    pub packages_only: bool,
}

/// The command: set up, say what was done.
pub fn run(args: &SetupArgs) -> Result<()> {
    if args.packages_only {
        let changed = install_host_packages()?;
        println!(
            "vm-setup: host packages {}",
            if changed {
                "installed"
            } else {
                "already there, nothing to do"
            }
        );
        return Ok(());
    }
    let (assets, changed) = ensure()?;
    if changed {
        println!(
            "vm-setup: ready: guest kernel {} ({}), initramfs {}",
            assets.kernel_release,
            assets.vmlinux.display(),
            assets.initramfs.display()
        );
    } else {
        println!(
            "vm-setup: already set up, nothing to do (guest kernel {})",
            assets.kernel_release
        );
    }
    Ok(())
}

/// Makes sure everything is installed and built; returns the assets and whether anything changed.
pub fn ensure() -> Result<(Assets, bool)> {
    let mut changed = install_host_packages()?;
    let dir = vm_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;

    let deb = kernel_deb(&dir.join("cache"))?;
    let kernel_dir = dir.join("kernel");
    let stamp_kernel = kernel_dir.join(".from");
    let deb_name = deb
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if std::fs::read_to_string(&stamp_kernel).ok().as_deref() != Some(deb_name.as_str()) {
        eprintln!("vm-setup: extracting {deb_name}");
        let _ = std::fs::remove_dir_all(&kernel_dir);
        cmd::run(
            "vm-setup: extract the guest kernel",
            Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&kernel_dir),
            "dpkg-deb comes with dpkg on Debian; delete the cached .deb under target/vm/cache if it is damaged",
        )?;
        std::fs::write(&stamp_kernel, &deb_name)?;
        changed = true;
    }
    let release = kernel_release(&kernel_dir)?;

    let vmlinux = dir.join("vmlinux");
    let vmlinux_stamp = dir.join("vmlinux.from");
    if !vmlinux.exists()
        || std::fs::read_to_string(&vmlinux_stamp).ok().as_deref() != Some(release.as_str())
    {
        eprintln!("vm-setup: unpacking vmlinux (raw ELF, boots through PVH)");
        extract_vmlinux(
            &kernel_dir.join(format!("boot/vmlinuz-{release}")),
            &vmlinux,
        )?;
        std::fs::write(&vmlinux_stamp, &release)?;
        changed = true;
    }

    // The initramfs depends on the kernel, the init script and busybox: rebuild when any changes.
    let initramfs = dir.join("initramfs.cpio.gz");
    let initramfs_stamp = dir.join("initramfs.from");
    let busybox = Path::new("/bin/busybox");
    let busybox_len = std::fs::metadata(busybox).map(|m| m.len()).unwrap_or(0);
    let want = format!(
        "{release}\n{busybox_len}\n{}\n{}",
        kmod::WANTED.join(" "),
        initramfs::INIT_SCRIPT
    );
    if !initramfs.exists()
        || std::fs::read_to_string(&initramfs_stamp).ok().as_deref() != Some(want.as_str())
    {
        eprintln!("vm-setup: building the initramfs");
        let modules_dir = kernel_dir.join("lib/modules").join(&release);
        let index = kmod::index(&modules_dir.join("kernel"))
            .context("vm-setup: index the guest kernel modules")?;
        let builtin =
            std::fs::read_to_string(modules_dir.join("modules.builtin")).unwrap_or_default();
        let modules = kmod::load_order(&index, &builtin)
            .context("vm-setup: resolve the guest kernel modules")?;
        let applets = cmd::output(
            "vm-setup: list busybox applets",
            Command::new(busybox).arg("--list"),
            "reinstall busybox-static: apt-get install --reinstall busybox-static",
        )?;
        let applets: Vec<String> = applets.lines().map(str::to_string).collect();
        let tmp = initramfs.with_extension("tmp");
        initramfs::build(&tmp, busybox, &applets, &modules)
            .context("vm-setup: build the initramfs")?;
        std::fs::rename(&tmp, &initramfs)?;
        std::fs::write(&initramfs_stamp, want)?;
        changed = true;
    }
    Ok((
        Assets {
            vmlinux,
            initramfs,
            kernel_release: release,
        },
        changed,
    ))
}

/// QEMU and the other host packages, installed where missing; whether anything was.
fn install_host_packages() -> Result<bool> {
    let qemu = ensure_qemu()?;
    Ok(install_packages()? | qemu)
}

/// Installs the missing host packages with apt (never removing or downgrading one).
fn install_packages() -> Result<bool> {
    let mut missing: Vec<&str> = PACKAGES
        .iter()
        .filter(|(_, file)| !Path::new(file).exists())
        .map(|(p, _)| *p)
        .collect();
    let by_dpkg = [RDMA_PACKAGES, BUILD_PACKAGES].concat();
    missing.extend(apt::not_installed(&by_dpkg)?);
    if missing.is_empty() {
        return Ok(false);
    }
    eprintln!("vm-setup: installing {}", missing.join(" "));
    apt::install("vm-setup: host packages", &missing, None)?;
    if let Some((pkg, file)) = PACKAGES.iter().find(|(_, f)| !Path::new(f).exists()) {
        bail!("vm-setup: {pkg} is installed but {file} is missing. Fix: apt-get install --reinstall {pkg}");
    }
    still_missing("vm-setup: host packages", &by_dpkg)?;
    Ok(true)
}

/// The workspace's build dependencies ([`BUILD_PACKAGES`]), installed with apt where missing
/// (`cargo xtask ci`, before it builds); whether any was.
pub fn install_build_packages() -> Result<bool> {
    let step = "ci: build dependencies";
    let missing = apt::not_installed(BUILD_PACKAGES)?;
    if missing.is_empty() {
        return Ok(false);
    }
    eprintln!("{step}: installing {}", missing.join(" "));
    apt::install(step, &missing, None)?;
    still_missing(step, BUILD_PACKAGES)?;
    Ok(true)
}

/// Fails, naming them, where any of `packages` is still not installed after apt said it was done.
fn still_missing(step: &str, packages: &[&str]) -> Result<()> {
    let missing = apt::not_installed(packages)?;
    if !missing.is_empty() {
        bail!(
            "{step}: {} still not installed after apt-get install. Fix: apt-get install {}",
            missing.join(" "),
            missing.join(" ")
        );
    }
    Ok(())
}

/// Makes sure qemu-system-x86_64 is QEMU `MIN_QEMU_MAJOR` or newer, installing it once from
/// where apt has one that new: the release's own, else (Debian 12) bookworm-backports. The
/// candidates are looked at first: installing Debian 12's QEMU 7.2 and then backports' made apt
/// remove a qemu-utils 10 the machine had, and downloaded QEMU twice.
fn ensure_qemu() -> Result<bool> {
    let step = "vm-setup: QEMU";
    let installed = || {
        Command::new("qemu-system-x86_64")
            .arg("--version")
            .output()
            .ok()
            .and_then(|out| qemu_major(&String::from_utf8_lossy(&out.stdout)))
    };
    let found = installed();
    if found.is_some_and(|major| major >= MIN_QEMU_MAJOR) {
        return Ok(false);
    }
    let fix = format!(
        "install QEMU {MIN_QEMU_MAJOR} or newer as qemu-system-x86_64 (Debian 12: \
         apt-get install -t bookworm-backports qemu-system-x86, with bookworm-backports in apt's sources)"
    );
    let mut candidate = apt::candidate("qemu-system-x86")?;
    if candidate.is_none() {
        apt::update(step)?;
        candidate = apt::candidate("qemu-system-x86")?;
    }
    let release = match candidate.as_deref().and_then(apt::upstream_major) {
        Some(major) if major >= MIN_QEMU_MAJOR => None,
        _ if apt::debian_codename().as_deref() == Some("bookworm") => {
            if !Path::new(BACKPORTS_SOURCES).exists() {
                apt::add_source(
                    step,
                    BACKPORTS_SOURCES,
                    "QEMU for usnvme's test bed",
                    "deb",
                    "bookworm-backports",
                )?;
            }
            Some("bookworm-backports")
        }
        _ => bail!(
            "{step}: apt's QEMU is {} and the test bed needs {MIN_QEMU_MAJOR} or newer (7.2 \
             crashes under its load). Fix: {fix}",
            candidate.as_deref().unwrap_or("none")
        ),
    };
    match found {
        Some(old) => eprintln!(
            "vm-setup: QEMU {old} is too old: installing QEMU from {}",
            release.unwrap_or("the release")
        ),
        None => eprintln!(
            "vm-setup: installing QEMU from {}",
            release.unwrap_or("the release")
        ),
    }
    apt::install(step, &["qemu-system-x86"], release)?;
    match installed() {
        Some(major) if major >= MIN_QEMU_MAJOR => Ok(true),
        other => bail!(
            "{step}: QEMU is {} after installing it. Fix: {fix}",
            other.map_or("unknown".to_string(), |m| m.to_string())
        ),
    }
}

/// 7 from "QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b2)".
fn qemu_major(version: &str) -> Option<u32> {
    version
        .lines()
        .next()?
        .split_whitespace()
        .skip_while(|w| *w != "version")
        .nth(1)?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// The guest kernel package: the cached .deb if there is one (old ABIs leave the archive), else the
/// one `linux-image-amd64` depends on now, downloaded into the cache.
fn kernel_deb(cache: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(cache)?;
    if let Some(deb) = cached_kernel_deb(cache)? {
        return Ok(deb);
    }
    let fix = "run `apt-get update` as root with the Debian archive reachable";
    let depends = |step| {
        cmd::output(
            step,
            Command::new("apt-cache").args(["depends", "linux-image-amd64"]),
            fix,
        )
    };
    let mut pkg = kernel_package_name(&depends("vm-setup: find the guest kernel package")?);
    if pkg.is_none() {
        apt::update("vm-setup: the guest kernel")?;
        pkg = kernel_package_name(&depends("vm-setup: find the guest kernel package")?);
    }
    let Some(pkg) = pkg else {
        bail!("vm-setup: linux-image-amd64 depends on no linux-image package. Fix: {fix}");
    };
    eprintln!("vm-setup: downloading {pkg}");
    cmd::output(
        "vm-setup: download the guest kernel",
        Command::new("apt-get")
            .arg("download")
            .arg(&pkg)
            .current_dir(cache),
        fix,
    )?;
    cached_kernel_deb(cache)?.with_context(|| {
        format!(
            "vm-setup: apt-get download {pkg} left no .deb in {}",
            cache.display()
        )
    })
}

fn cached_kernel_deb(cache: &Path) -> Result<Option<PathBuf>> {
    let mut debs: Vec<PathBuf> = std::fs::read_dir(cache)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("linux-image-") && n.ends_with(".deb"))
        })
        .collect();
    debs.sort();
    Ok(debs.pop())
}

/// `linux-image-6.1.0-57-amd64` from `apt-cache depends linux-image-amd64`.
fn kernel_package_name(depends: &str) -> Option<String> {
    depends
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|p| p.starts_with("linux-image-") && !p.contains('<'))
        .map(str::to_string)
}

/// The one release under `lib/modules` of the extracted package.
fn kernel_release(kernel_dir: &Path) -> Result<String> {
    let modules = kernel_dir.join("lib/modules");
    let mut releases: Vec<String> = std::fs::read_dir(&modules)
        .with_context(|| {
            format!(
                "vm-setup: {} is missing; delete target/vm and run again",
                modules.display()
            )
        })?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    releases.sort();
    releases
        .pop()
        .with_context(|| format!("vm-setup: no kernel release in {}", modules.display()))
}

/// A bzImage's payload is an xz stream (CONFIG_KERNEL_XZ); the raw ELF inside boots via PVH,
/// skipping the guest's own decompressor (seconds under emulation).
fn extract_vmlinux(vmlinuz: &Path, out: &Path) -> Result<()> {
    let image = std::fs::read(vmlinuz)
        .with_context(|| format!("vm-setup: reading {}", vmlinuz.display()))?;
    let magic = b"\xfd7zXZ\x00";
    let start = image
        .windows(magic.len())
        .position(|w| w == magic)
        .with_context(|| {
            format!(
                "vm-setup: {} has no xz payload; this kernel is not supported",
                vmlinuz.display()
            )
        })?;
    let elf = decode_one_xz_stream(&image[start..])
        .with_context(|| format!("vm-setup: unpacking {}", vmlinuz.display()))?;
    if !elf.starts_with(b"\x7fELF") {
        bail!(
            "vm-setup: the payload of {} is not an ELF kernel",
            vmlinuz.display()
        );
    }
    let tmp = out.with_extension("tmp");
    std::fs::write(&tmp, &elf)?;
    std::fs::rename(&tmp, out)?;
    Ok(())
}

/// Decodes the first xz stream of `input` (with the x86 BCJ filter the kernel uses), ignoring what
/// follows it (the kernel's own size trailer).
fn decode_one_xz_stream(input: &[u8]) -> Result<Vec<u8>> {
    let mut stream = xz2::stream::Stream::new_stream_decoder(u64::MAX, 0)?;
    let mut out = Vec::with_capacity(input.len() * 4);
    loop {
        if out.capacity() - out.len() < (1 << 20) {
            out.reserve(16 << 20);
        }
        let consumed = stream.total_in() as usize;
        match stream.process_vec(
            &input[consumed.min(input.len())..],
            &mut out,
            xz2::stream::Action::Run,
        )? {
            xz2::stream::Status::StreamEnd => return Ok(out),
            _ if stream.total_in() as usize >= input.len() && out.capacity() > out.len() => {
                bail!("the xz stream ends early")
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{kernel_package_name, qemu_major};

    #[test]
    fn reads_the_major_version_from_qemu_version_output() {
        assert_eq!(
            qemu_major("QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b2)\nCopyright"),
            Some(7)
        );
        assert_eq!(
            qemu_major("QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)"),
            Some(10)
        );
        assert_eq!(qemu_major("something else"), None);
    }

    #[test]
    fn finds_the_kernel_package_in_apt_cache_output() {
        let out = "linux-image-amd64\n  Depends: linux-image-6.1.0-57-amd64\n";
        assert_eq!(
            kernel_package_name(out).as_deref(),
            Some("linux-image-6.1.0-57-amd64")
        );
        assert_eq!(kernel_package_name("linux-image-amd64\n"), None);
    }
}

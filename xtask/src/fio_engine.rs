//! `cargo xtask fio-engine`: usnvme's fio ioengine (`tools/fio`) for the fio installed here.
//!
//! fio's engine interface is its version's `struct ioengine_ops` and the structures an engine
//! reads (`thread_data`, `fio_file`, `io_u`): they change with most releases, and fio has no
//! stable ABI. So the engine's C shim is compiled against the headers of the installed fio's
//! exact version: this gets the distribution's source package of that version (Debian: `apt-get
//! source`, with deb-src enabled if it is not), configures it as the distribution does, checks
//! its version against `fio --version`, and builds `libusnvme_fio.so`, which refuses to run
//! under any other fio. Everything is cached under `target/fio/`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::{apt, cmd};

#[derive(Args, Debug, Default)]
pub struct FioEngineArgs {
    /// Build against this configured fio source tree (a fio built from source) instead of the
    /// installed fio's distribution source.
    #[arg(long, value_name = "DIR")]
    pub fio_source: Option<PathBuf>,
}

/// A built engine and what it is for.
#[derive(Debug, Clone)]
pub struct Engine {
    /// `target/fio/libusnvme_fio.so`.
    pub library: PathBuf,
    /// `fio-3.33`: the only fio that will load it.
    pub fio_version: String,
    /// FIO_IOOPS_VERSION of its headers.
    pub ops_version: u32,
    /// The configured fio source tree it was built against.
    pub source: PathBuf,
}

/// The fio the engine is for.
const FIO: &str = "fio";
/// Where Debian enables source packages for `apt-get source` when its sources have none.
const DEB_SRC_SOURCES: &str = "/etc/apt/sources.list.d/usnvme-deb-src.sources";

pub fn run(args: &FioEngineArgs) -> Result<()> {
    let engine = build(args)?;
    let dir = engine.library.parent().unwrap_or(Path::new("."));
    println!(
        "fio-engine: {} for {} (ioengine ops version {})\n  \
         fio --thread --ioengine=external:{} --filename=0000.01.00.0 ...\n  \
         LD_LIBRARY_PATH={} fio --thread --ioengine=usnvme ...",
        engine.library.display(),
        engine.fio_version,
        engine.ops_version,
        engine.library.display(),
        dir.display()
    );
    Ok(())
}

/// Builds (or finds up to date) the engine for the installed fio.
pub fn build(args: &FioEngineArgs) -> Result<Engine> {
    let installed = installed_fio()?;
    let source = match &args.fio_source {
        Some(dir) => configured(dir)?,
        None => distribution_source(&installed)?,
    };
    let source_version = source_version(&source)?;
    if source_version != installed {
        bail!(
            "fio-engine: the fio source in {} is {source_version}, but the installed fio is \
             {installed}: the engine must be built from the installed version's own headers. Fix: \
             give --fio-source the source tree of {installed}, or install {source_version}",
            source.display()
        );
    }
    let ops_version = ops_version(&source)?;
    let out = crate::target_dir().join("fio/libusnvme_fio.so");
    compile(&source, &installed, &out)?;
    Ok(Engine {
        library: out,
        fio_version: installed,
        ops_version,
        source,
    })
}

/// Builds the engine from `source` (configured) into `out`, accepting only fio `accept` (the
/// tests build one for a fio that does not exist, to see it refused).
pub fn compile(source: &Path, accept: &str, out: &Path) -> Result<()> {
    let root = crate::workspace_root();
    cmd::run(
        "fio-engine: build libusnvme_fio.so",
        Command::new("cargo")
            .args(["build", "--release", "-p", "usnvme-fio"])
            .args(crate::FEATURES)
            .env("USNVME_FIO_SOURCE", source)
            .env("USNVME_FIO_VERSION", accept)
            .current_dir(&root),
        "fix the build errors above (tools/fio)",
    )?;
    let built = crate::target_dir().join("release/libusnvme_fio.so");
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    // copy to a new file, then rename: a fio that has the old one loaded keeps it intact
    let tmp = out.with_extension("so.tmp");
    std::fs::copy(&built, &tmp).with_context(|| {
        format!(
            "fio-engine: copying {} to {}",
            built.display(),
            tmp.display()
        )
    })?;
    std::fs::rename(&tmp, out).with_context(|| format!("fio-engine: writing {}", out.display()))?;
    // `ioengine=usnvme` finds the engine through dlopen's search path (LD_LIBRARY_PATH)
    let by_name = out.with_file_name("usnvme");
    let _ = std::fs::remove_file(&by_name);
    std::os::unix::fs::symlink(out.file_name().unwrap_or_default(), &by_name)
        .with_context(|| format!("fio-engine: linking {}", by_name.display()))?;
    Ok(())
}

/// `fio-3.33`, from `fio --version`; installs Debian's fio when there is none.
fn installed_fio() -> Result<String> {
    let version = || {
        Command::new(FIO)
            .arg("--version")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    if let Some(v) = version() {
        return Ok(v);
    }
    eprintln!("fio-engine: installing fio");
    apt_install(&["fio"])?;
    version().context("fio-engine: `fio --version` fails after installing fio. Fix: apt-get install --reinstall fio")
}

/// The installed fio's Debian source, unpacked (Debian's patches applied) and configured as
/// Debian configures it, under `target/fio/src/`.
fn distribution_source(installed: &str) -> Result<PathBuf> {
    let fix = "install fio from Debian's packages, or build fio from source and pass its tree with --fio-source";
    let fio_path = which(FIO).context("fio-engine: fio is not on PATH")?;
    let owner = cmd::output(
        "fio-engine: which package installed fio",
        Command::new("dpkg-query").arg("-S").arg(&fio_path),
        fix,
    )?;
    let package = owner.split(':').next().unwrap_or("").trim().to_string();
    let fields = cmd::output(
        "fio-engine: fio's package",
        Command::new("dpkg-query")
            .args(["-W", "-f", "${source:Package} ${source:Version}"])
            .arg(&package),
        fix,
    )?;
    let (source_package, source_version) = fields
        .trim()
        .split_once(' ')
        .with_context(|| format!("fio-engine: dpkg-query said {fields:?} for {package}"))?;
    let base = crate::target_dir().join("fio/src");
    let tree = base.join(format!("{source_package}-{source_version}"));
    if tree.join("config-host.h").exists() {
        return Ok(tree);
    }
    eprintln!(
        "fio-engine: getting the source of {installed}: Debian's {source_package} {source_version}"
    );
    let cache = crate::target_dir().join("fio/cache");
    std::fs::create_dir_all(&cache)?;
    let wanted = format!("{source_package}={source_version}");
    let download = || {
        Command::new("apt-get")
            .args(["source", "--download-only", "-q"])
            .arg(&wanted)
            .current_dir(&cache)
            .status()
            .is_ok_and(|s| s.success())
    };
    if !download() {
        enable_deb_src()?;
        if !download() {
            bail!(
                "fio-engine: `apt-get source {wanted}` failed even with deb-src enabled. Fix: \
                 check that the Debian archive is reachable, or pass --fio-source"
            );
        }
    }
    if which("dpkg-source").is_none() {
        apt_install(&["dpkg-dev"])?;
    }
    let dsc = std::fs::read_dir(&cache)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name().and_then(|n| n.to_str())
                == Some(&format!(
                    "{source_package}_{}.dsc",
                    // the epoch is not in file names
                    source_version
                        .split_once(':')
                        .map_or(source_version, |(_, v)| v)
                ))
        })
        .with_context(|| format!("fio-engine: no .dsc for {wanted} in {}", cache.display()))?;
    let _ = std::fs::remove_dir_all(&tree);
    std::fs::create_dir_all(&base)?;
    cmd::run(
        "fio-engine: unpack fio's source",
        Command::new("dpkg-source").arg("-x").arg(&dsc).arg(&tree),
        "delete target/fio and run again",
    )?;
    configured(&tree)
}

/// `dir`, configured (fio's `./configure`, as Debian runs it, when it has no config-host.h).
fn configured(dir: &Path) -> Result<PathBuf> {
    if !dir.join("ioengines.h").exists() {
        bail!(
            "fio-engine: {} is not a fio source tree (no ioengines.h)",
            dir.display()
        );
    }
    if !dir.join("config-host.h").exists() {
        // Debian's flags less --enable-gfio / --enable-libnbd, which only add engines and need
        // their libraries: the structures the shim reads do not depend on them.
        cmd::output(
            "fio-engine: configure fio's source",
            Command::new("./configure")
                .args(["--disable-native", "--prefix=/usr"])
                .current_dir(dir),
            "see configure's output above; gcc and make must be installed",
        )?;
    }
    Ok(dir.to_path_buf())
}

/// `fio-3.33`: the version a fio source tree builds (its `version` file, or FIO-VERSION-GEN's
/// default).
fn source_version(dir: &Path) -> Result<String> {
    if let Ok(v) = std::fs::read_to_string(dir.join("version")) {
        return Ok(v.trim().to_string());
    }
    let gen = std::fs::read_to_string(dir.join("FIO-VERSION-GEN"))
        .with_context(|| format!("fio-engine: reading {}/FIO-VERSION-GEN", dir.display()))?;
    gen.lines()
        .find_map(|l| l.strip_prefix("DEF_VER="))
        .map(|v| v.trim().to_string())
        .with_context(|| {
            format!(
                "fio-engine: no DEF_VER in {}/FIO-VERSION-GEN",
                dir.display()
            )
        })
}

/// FIO_IOOPS_VERSION of a fio source tree.
pub fn ops_version(dir: &Path) -> Result<u32> {
    let header = std::fs::read_to_string(dir.join("ioengines.h"))
        .with_context(|| format!("fio-engine: reading {}/ioengines.h", dir.display()))?;
    header
        .lines()
        .find_map(|l| {
            l.strip_prefix("#define FIO_IOOPS_VERSION")
                .and_then(|v| v.trim().parse().ok())
        })
        .with_context(|| {
            format!(
                "fio-engine: no FIO_IOOPS_VERSION in {}/ioengines.h",
                dir.display()
            )
        })
}

/// Adds deb-src entries for this Debian release and updates apt's lists.
fn enable_deb_src() -> Result<()> {
    let fix = "enable source packages (deb-src) for your distribution in apt's sources and run \
               `apt-get update`, or pass --fio-source";
    let Some(codename) = apt::debian_codename() else {
        bail!("fio-engine: apt has no source packages enabled. Fix: {fix}");
    };
    eprintln!("fio-engine: enabling Debian's source packages ({DEB_SRC_SOURCES})");
    apt::add_source(
        "fio-engine: deb-src",
        DEB_SRC_SOURCES,
        "fio's source for usnvme's fio engine",
        "deb-src",
        &format!("{codename} {codename}-updates"),
    )
}

fn apt_install(packages: &[&str]) -> Result<()> {
    apt::install(
        &format!("fio-engine: apt-get install {}", packages.join(" ")),
        packages,
        None,
    )
}

/// The path of `program` on PATH.
fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}

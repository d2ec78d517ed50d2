//! The guest's initramfs: busybox, our `/init`, and kernel modules, as a gzip'd cpio (newc) archive.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use flate2::{write::GzEncoder, Compression};

/// The guest's `/init`.
pub const INIT_SCRIPT: &str = include_str!("guest-init.sh");

/// One archive member.
enum Member {
    Dir,
    File { data: Vec<u8>, executable: bool },
    Symlink(String),
}

/// Builds the archive at `out`: `busybox` (a static binary), `/init`, and `modules` (in load order).
pub fn build(out: &Path, busybox: &Path, applets: &[String], modules: &[PathBuf]) -> Result<()> {
    let mut members: Vec<(String, Member)> = Vec::new();
    for dir in [
        "bin", "sbin", "dev", "proc", "sys", "tmp", "host", "mods", "etc", "root",
    ] {
        members.push((dir.to_string(), Member::Dir));
    }
    let busybox_data =
        std::fs::read(busybox).with_context(|| format!("reading {}", busybox.display()))?;
    members.push((
        "bin/busybox".into(),
        Member::File {
            data: busybox_data,
            executable: true,
        },
    ));
    for applet in applets
        .iter()
        .filter(|a| a.as_str() != "busybox" && !a.contains('/'))
    {
        members.push((format!("bin/{applet}"), Member::Symlink("busybox".into())));
    }
    members.push((
        "init".into(),
        Member::File {
            data: INIT_SCRIPT.as_bytes().to_vec(),
            executable: true,
        },
    ));
    let mut order = String::new();
    for module in modules {
        let name = module
            .file_name()
            .and_then(|n| n.to_str())
            .context("module path without a file name")?
            .trim_end_matches(".xz")
            .to_string();
        let data = super::kmod::read_module(module)?;
        members.push((
            format!("mods/{name}"),
            Member::File {
                data,
                executable: false,
            },
        ));
        order.push_str(&name);
        order.push('\n');
    }
    members.push((
        "mods/order".into(),
        Member::File {
            data: order.into_bytes(),
            executable: false,
        },
    ));

    let file = std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let gz = GzEncoder::new(std::io::BufWriter::new(file), Compression::fast());
    let gz = write_cpio(members, gz)?;
    gz.finish()?.flush()?;
    Ok(())
}

fn write_cpio<W: Write>(members: Vec<(String, Member)>, out: W) -> Result<W> {
    const DIR: u32 = 0o040755;
    const SYMLINK: u32 = 0o120777;
    let inputs = members.into_iter().enumerate().map(|(i, (name, member))| {
        let builder = cpio::NewcBuilder::new(&name).ino(i as u32 + 1).nlink(1);
        let (builder, data) = match member {
            Member::Dir => (builder.mode(DIR).nlink(2), Vec::new()),
            Member::File { data, executable } => (
                builder.mode(if executable { 0o100755 } else { 0o100644 }),
                data,
            ),
            Member::Symlink(target) => (builder.mode(SYMLINK), target.into_bytes()),
        };
        (builder, std::io::Cursor::new(data))
    });
    Ok(cpio::write_cpio(inputs, out)?)
}

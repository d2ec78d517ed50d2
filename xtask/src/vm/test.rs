//! `cargo xtask vm-test`: the harness's own tests (host side, one boot each), then every VM test
//! suite of the `usnvme-tests` crate in one boot on 24 file-backed drives, but those that need
//! drives formatted with protection information, which get a boot of their own.
//!
//! VM tests are `#[ignore = "VM: ..."]` tests: `cargo test` on the host skips them, the guest runs
//! them with `--ignored`, one at a time (they share the drives).

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::Args;

use super::qemu::Backend;
use super::run::{self, RunArgs};
use super::{setup, vm_dir};
use crate::cmd::{self, sh_quote};

#[derive(Args, Debug)]
pub struct VmTestArgs {
    /// Run only tests whose name contains this.
    pub filter: Option<String>,
    /// Only the guest suites (skip the harness's own boots).
    #[arg(long)]
    pub guest_only: bool,
    /// Only the harness's own tests.
    #[arg(long, conflicts_with = "guest_only")]
    pub harness_only: bool,
}

/// Packages whose `#[ignore = "VM: ..."]` tests (integration and unit) run in the guest.
const SUITE_PACKAGES: &[&str] = &[
    "usnvme-hugepages",
    "usnvme-driver",
    "usnvme-engine",
    "usnvme-tests",
];

/// The guest suites' drives: 24, file-backed, on two NUMA nodes: 0-11 on node 0 with 512 B
/// blocks, 12-23 on node 1 with 4 KiB.
pub const SUITE_DRIVES: usize = 24;

pub fn run(args: VmTestArgs) -> Result<()> {
    setup::ensure()?;
    let root = crate::workspace_root();
    cmd::run(
        "vm-test: build the programs the VM runs",
        Command::new("cargo")
            .args([
                "build",
                "-p",
                "usnvme-tools",
                "-p",
                "usnvme-tests",
                "--bins",
            ])
            .args(crate::FEATURES)
            .current_dir(&root),
        "fix the build errors above",
    )?;
    if !args.guest_only {
        eprintln!("vm-test: the harness's own tests (one boot each)");
        let mut c = Command::new("cargo");
        c.args([
            "test",
            "-p",
            "xtask",
            "--test",
            "vm_run",
            "--",
            "--ignored",
            "--test-threads=1",
        ]);
        if let Some(f) = &args.filter {
            c.arg(f);
        }
        cmd::run(
            "vm-test: harness tests",
            c.current_dir(&root),
            "see the failing test's output above",
        )?;
    }
    if !args.harness_only {
        guest_suites(args.filter.as_deref())?;
    }
    Ok(())
}

/// Suites that run on the protection bed, not the main one.
const PROTECTION_SUITES: &[&str] = &["vm_protection"];
/// The protection bed: 2 file-backed drives, each with a plain namespace, one formatted 512+8
/// with PI type 1 (metadata apart), one 4096+64 with PI type 3, a 64-bit guard, extended LBAs,
/// and a 4096-byte one allocated in the drive's subsystem but detached (namespace attachment).
const PROTECTION_DRIVES: usize = 2;
const PROTECTION_NAMESPACES: &[&str] = &[
    "bs=512,size=64M",
    "bs=512,ms=8,pi=1,size=64M",
    "bs=4096,ms=64,mset=1,pi=3,pif=2,size=64M",
    "bs=4096,size=32M,detached=1",
];
/// The block of drive 0's namespace 2 whose data the host corrupts in the image file before the
/// boot (behind the drive's back: its PI no longer matches); the suite expects a guard error
/// there (`USNVME_VM_CORRUPTED_LBA`).
const CORRUPTED_LBA: u64 = 77;

/// Boots the guest suites may take: the first, and one more for each time the guest dies or
/// hangs (each resumes at the suite it was in).
const MAX_BOOTS: usize = 3;

/// Written by the suite script on the work share: `start NAME IMAGE_BYTES STAMP_BYTES` before a
/// suite (the sizes of the two expectation files then) and `end NAME RC` after it.
const PROGRESS: &str = "vm-test-progress.txt";

/// What a boot's progress file says: the suites it finished, with their exit codes, and the
/// expectation files' sizes when the suite it was in began.
#[derive(Debug, Default, PartialEq)]
struct Progress {
    ended: Vec<(String, i32)>,
    started: Option<(String, u64, u64)>,
}

fn read_progress(text: &str) -> Progress {
    let mut p = Progress::default();
    for line in text.lines() {
        match line.split_whitespace().collect::<Vec<_>>().as_slice() {
            ["start", name, images, stamps] => {
                p.started = Some((
                    name.to_string(),
                    images.parse().unwrap_or(0),
                    stamps.parse().unwrap_or(0),
                ));
            }
            ["end", name, rc] => {
                p.ended.push((name.to_string(), rc.parse().unwrap_or(-1)));
                p.started = None;
            }
            _ => {}
        }
    }
    p
}

fn guest_suites(filter: Option<&str>) -> Result<()> {
    let root = crate::workspace_root();
    let json = cmd::output(
        "vm-test: build the VM test suites",
        Command::new("cargo")
            .args(["test", "--no-run", "--message-format=json"])
            .args(SUITE_PACKAGES.iter().flat_map(|p| ["-p", p]))
            .args(crate::FEATURES)
            .current_dir(&root),
        "fix the build errors (run `cargo test -p usnvme-tests --no-run` to see them)",
    )?;
    let mut suites = test_executables(&json);
    // host-only suites (`#[ignore]`d for another reason): cargo xtask ci runs them on the host
    suites.retain(|p| {
        let name = suite_name(p);
        !HOST_ONLY.iter().any(|s| name.starts_with(&format!("{s}-")))
    });
    if suites.is_empty() {
        bail!("vm-test: cargo built no test executables for usnvme-tests");
    }
    // A fixed order, and the suites whose writes the host checks in the images afterwards
    // last: other suites (perf --verify, the engine) write all over the drives.
    suites.sort_by_key(|p| {
        let name = suite_name(p);
        (
            CHECKED_ON_HOST
                .iter()
                .any(|s| name.starts_with(&format!("{s}-"))),
            name,
        )
    });
    // A filter naming a suite (e.g. `vm_driver`) runs that whole suite; else it filters tests.
    let mut filter = filter;
    if let Some(f) = filter {
        if suites
            .iter()
            .any(|s| suite_name(s).starts_with(&format!("{f}-")))
        {
            suites.retain(|s| suite_name(s).starts_with(&format!("{f}-")));
            filter = None;
        }
    }
    let (protection, suites): (Vec<PathBuf>, Vec<PathBuf>) = suites.into_iter().partition(|s| {
        PROTECTION_SUITES
            .iter()
            .any(|p| suite_name(s).starts_with(&format!("{p}-")))
    });
    if !suites.is_empty() {
        main_bed(&suites, filter)?;
    }
    if !protection.is_empty() {
        protection_bed(&protection, filter)?;
    }
    Ok(())
}

fn suite_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The suite script's line that runs suite executable `exe` (with the test filter, if any).
fn suite_command(exe: &Path, filter: Option<&str>) -> String {
    let mut line = format!(
        "{} --ignored --test-threads=1 --color never",
        sh_quote(&exe.display().to_string())
    );
    if let Some(f) = filter {
        line += &format!(" {}", sh_quote(f));
    }
    line
}

/// The protection suites in one boot of the protection bed.
fn protection_bed(suites: &[PathBuf], filter: Option<&str>) -> Result<()> {
    let work = vm_dir().join("work");
    std::fs::create_dir_all(&work)?;
    let script = work.join("vm-test-protection.sh");
    let mut s = String::from("# written by cargo xtask vm-test\nfailed=0\n");
    for exe in suites {
        s += &format!(
            "echo \"=== {}\"\n{} || failed=$((failed+1))\n",
            suite_name(exe),
            suite_command(exe, filter)
        );
    }
    s += "[ $failed = 0 ]\n";
    std::fs::write(&script, s)?;
    let disk_dir = vm_dir().join("test-disks-protection");
    let _ = std::fs::remove_dir_all(&disk_dir);
    let usnvme = crate::target_dir().join("debug/usnvme");
    let args = RunArgs {
        drives: PROTECTION_DRIVES,
        backend: Backend::File,
        namespaces: PROTECTION_NAMESPACES
            .iter()
            .map(|spec| spec.parse().map_err(anyhow::Error::msg))
            .collect::<Result<_>>()?,
        timeout: 600,
        hang_after: 120,
        keep_disks: true,
        disk_dir: Some(disk_dir.clone()),
        env: vec![
            format!("USNVME_BIN={}", usnvme.display()),
            format!("USNVME_VM_DISK_DIR={}", disk_dir.display()),
            format!("USNVME_VM_CORRUPTED_LBA={CORRUPTED_LBA}"),
        ],
        ..RunArgs::for_program(vec!["/bin/sh".into(), script.display().to_string()])
    };
    // the image vm-run keeps (its size is right): sparse, one byte of the block's data set
    let config = args.config()?;
    let (image, size) = config
        .images()
        .into_iter()
        .find(|(path, _)| path.ends_with("nvme0n2.img"))
        .context("vm-test: the protection bed has no image nvme0n2.img")?;
    std::fs::create_dir_all(&disk_dir)?;
    let file = std::fs::File::create(&image)
        .with_context(|| format!("vm-test: creating {}", image.display()))?;
    file.set_len(size)?;
    file.write_all_at(&[0x5a], CORRUPTED_LBA * 512 + 100)?;
    eprintln!(
        "vm-test: {} suite(s) in one boot on {PROTECTION_DRIVES} drives formatted with protection information",
        suites.len()
    );
    match run::run(&args)? {
        0 => Ok(()),
        code => bail!("vm-test: the protection bed's suites failed (vm-run exit code {code}; the output is above)"),
    }
}

/// The suites on the main bed: 24 drives, resumed in a new boot where the guest dies or hangs,
/// and what they wrote checked in the image files afterwards.
fn main_bed(suites: &[PathBuf], filter: Option<&str>) -> Result<()> {
    let names: Vec<String> = suites.iter().map(|s| suite_name(s)).collect();
    let work = vm_dir().join("work");
    std::fs::create_dir_all(&work)?;
    let script = work.join("vm-test-suites.sh");
    let progress = work.join(PROGRESS);
    let disk_dir = vm_dir().join("test-disks");
    let _ = std::fs::remove_dir_all(&disk_dir);
    let expectations = work.join(EXPECTATIONS);
    let _ = std::fs::remove_file(&expectations);
    let stamp_expectations = work.join(STAMP_EXPECTATIONS);
    let _ = std::fs::remove_file(&stamp_expectations);
    let usnvme = crate::target_dir().join("debug/usnvme");
    let fio_engine = crate::fio_engine::build(&Default::default())?;
    let args = RunArgs {
        backend: Backend::File,
        numa_nodes: 2,
        logical_block_size: vec![512, 4096],
        // The suites take 8 minutes on QEMU 10 (13 under load).
        timeout: 1000,
        // A guest idle this long mid-suite is hung (the suites' waits are seconds at most).
        hang_after: 120,
        keep_disks: true,
        disk_dir: Some(disk_dir.clone()),
        env: vec![
            format!("USNVME_BIN={}", usnvme.display()),
            format!("USNVME_FIO_ENGINE={}", fio_engine.library.display()),
            format!("USNVME_VM_DISK_DIR={}", disk_dir.display()),
        ],
        ..RunArgs::for_program(vec!["/bin/sh".into(), script.display().to_string()])
    };
    // Suites that ended with a failure, over every boot.
    let mut failed: Vec<String> = Vec::new();
    let mut from = 0;
    for boot in 1..=MAX_BOOTS {
        let mut s = String::from("# written by cargo xtask vm-test\nfailed=0\n");
        let size = |f: &Path| {
            format!(
                "$(cat {} 2>/dev/null | wc -c)",
                sh_quote(&f.display().to_string())
            )
        };
        let log = sh_quote(&progress.display().to_string());
        for (exe, name) in suites.iter().zip(&names).skip(from) {
            let line = suite_command(exe, filter);
            s += &format!(
                "echo \"start {name} {} {}\" >> {log}\necho \"=== {name}\"\n{line}\nrc=$?\necho \"end {name} $rc\" >> {log}\n[ $rc = 0 ] || failed=$((failed+1))\n",
                size(&expectations),
                size(&stamp_expectations),
            );
        }
        s += "[ $failed = 0 ]\n";
        std::fs::write(&script, s)?;
        let _ = std::fs::remove_file(&progress);
        eprintln!(
            "vm-test: {} suite(s) in one boot on {SUITE_DRIVES} drives",
            suites.len() - from
        );
        let exit_code = run::run(&args)?;
        let boot_progress = read_progress(&std::fs::read_to_string(&progress).unwrap_or_default());
        failed.extend(
            boot_progress
                .ended
                .iter()
                .filter(|(_, rc)| *rc != 0)
                .map(|(name, _)| name.clone()),
        );
        if ![run::EXIT_VM_FAILED, run::EXIT_TIMEOUT, run::EXIT_HUNG].contains(&exit_code) {
            if exit_code != 0 && failed.is_empty() {
                bail!("vm-test: the VM test suites failed (vm-run exit code {exit_code})");
            }
            break;
        }
        // The guest died or hung in a suite: the suites it finished stand, the one it was in
        // runs again in a new boot on the same images, with what that suite had recorded for
        // the host's image check dropped (it is recorded again).
        if boot == MAX_BOOTS {
            bail!(
                "vm-test: the guest died or hung {MAX_BOOTS} times (vm-run exit code {exit_code}; the reason is above)"
            );
        }
        from += boot_progress.ended.len();
        if let Some((name, images, stamps)) = &boot_progress.started {
            truncate(&expectations, *images)?;
            truncate(&stamp_expectations, *stamps)?;
            eprintln!(
                "vm-test: the guest died or hung in {name} (vm-run exit code {exit_code}; the reason is above): \
                 running the suites from {name} on in a new boot"
            );
        } else {
            eprintln!(
                "vm-test: the guest died or hung before a suite began (vm-run exit code {exit_code}): booting again"
            );
        }
    }
    if !failed.is_empty() {
        bail!("vm-test: VM test suites failed: {}", failed.join(", "));
    }
    let checked = check_images(&expectations, &disk_dir)?;
    let ranges = check_stamp_ranges(&stamp_expectations, &disk_dir)?;
    let scan = scan_stamps(&disk_dir)?;
    eprintln!(
        "vm-test: all VM test suites passed; {checked} writes found intact in the image files on the host ({}); \
         {} blocks perf --verify stamped in {} images are intact to the last byte; \
         {ranges} ranges perf wrote hold its stamps at their own offsets",
        disk_dir.display(),
        scan.stamps,
        scan.images
    );
    Ok(())
}

/// Cuts `file` back to its first `len` bytes (a file that is not there stays so).
fn truncate(file: &Path, len: u64) -> Result<()> {
    match std::fs::OpenOptions::new().write(true).open(file) {
        Ok(f) => f
            .set_len(len)
            .with_context(|| format!("vm-test: truncating {}", file.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("vm-test: opening {}", file.display())),
    }
}

/// Written by the guest tests (`usnvme_tests::expect_stamps_on_host`):
/// `IMAGE START LEN BLOCK_SIZE SEED all|some` per line.
const STAMP_EXPECTATIONS: &str = "expect-stamps.txt";

/// Checks a block perf stamped, at byte `at` of its image, against its own header: the stamp's
/// offset is perf's device offset (a stripe's where a stripe was written), so only the ranges
/// the guest recorded say which offset to expect. `Ok(None)`: no stamp starts there. An error:
/// a stamp whose bytes are not all as written (every byte of the block is checked), or perf's
/// read poison, which no write may carry.
fn stamp_at(block: &[u8], at: u64) -> Result<Option<usnvme_stamp::Header>> {
    if block.starts_with(&usnvme_stamp::POISON) {
        bail!(
            "the block at byte {at} holds perf's read poison: a read buffer was written unstamped"
        );
    }
    let Some(h) = usnvme_stamp::header(block) else {
        return Ok(None);
    };
    let len = h.len as usize;
    if len != block.len() {
        bail!(
            "the block at byte {at} carries a stamp for a {len}-byte block, not {} bytes (offset {}, seed {:#x})",
            block.len(),
            h.offset,
            h.seed
        );
    }
    match usnvme_stamp::check(block, h.offset, h.seed) {
        usnvme_stamp::Verdict::Intact => Ok(Some(h)),
        v => bail!(
            "the block at byte {at}: {v} (offset {}, seed {:#x})",
            h.offset,
            h.seed
        ),
    }
}

/// The block lengths perf stamps: an NVMe block size (the sim's are 512 to 64 KiB).
fn stamp_len_plausible(len: u32) -> bool {
    len.is_power_of_two() && (512..=65536).contains(&len)
}

/// Checks each range the guest recorded: every block there carries the run's stamp (`all`), or
/// at least one does and every stamp there is right (`some`).
fn check_stamp_ranges(expectations: &Path, disk_dir: &Path) -> Result<usize> {
    let Ok(text) = std::fs::read_to_string(expectations) else {
        return Ok(0);
    };
    let mut checked = 0;
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let parsed = match f.as_slice() {
            [image, start, len, bs, seed, mode @ ("all" | "some")] => (|| {
                Some((
                    *image,
                    start.parse::<u64>().ok()?,
                    len.parse::<u64>().ok()?,
                    bs.parse::<u32>()
                        .ok()
                        .filter(|b| stamp_len_plausible(*b))
                        .map(u64::from)?,
                    seed.parse::<u64>().ok()?,
                    *mode == "all",
                ))
            })(),
            _ => None,
        };
        let Some((image, start, len, bs, seed, all)) = parsed else {
            bail!(
                "vm-test: malformed stamp expectation {line:?} in {}",
                expectations.display()
            );
        };
        let path = disk_dir.join(image);
        let mut file = std::fs::File::open(&path)
            .with_context(|| format!("vm-test: opening {}", path.display()))?;
        file.seek(SeekFrom::Start(start))?;
        let mut data = vec![0u8; usize::try_from(len)?];
        file.read_exact(&mut data)
            .with_context(|| format!("vm-test: reading {} at {start}", path.display()))?;
        let mut found = 0u64;
        for (i, block) in data.chunks(bs as usize).enumerate() {
            let at = start + i as u64 * bs;
            match usnvme_stamp::check(block, at, seed) {
                usnvme_stamp::Verdict::Intact => found += 1,
                usnvme_stamp::Verdict::Misplaced { offset } => bail!(
                    "vm-test: {image}: the block at byte {at} holds the block of byte {offset} (seed {seed:#x}): a misdirected write"
                ),
                // (blocks an earlier run stamped, and this one did not reach)
                usnvme_stamp::Verdict::NotThisRun if all => bail!(
                    "vm-test: {image}: the block at byte {at} does not carry the stamp of the perf run (seed {seed:#x}) that wrote all of [{start}, {})",
                    start + len
                ),
                usnvme_stamp::Verdict::NotThisRun => {}
                usnvme_stamp::Verdict::Unread { .. } => bail!(
                    "vm-test: {image}: the block at byte {at} holds perf's read poison: a read buffer was written unstamped"
                ),
                v @ usnvme_stamp::Verdict::Damaged { .. } => bail!(
                    "vm-test: {image}: the block at byte {at}: {v} (seed {seed:#x})"
                ),
            }
        }
        if found == 0 {
            bail!(
                "vm-test: {image}: no block of [{start}, {}) carries the stamp of the perf run (seed {seed:#x}) that wrote there",
                start + len
            );
        }
        checked += 1;
    }
    Ok(checked)
}

/// What [`scan_stamps`] found.
#[derive(Debug, Default, PartialEq, Eq)]
struct StampScan {
    images: usize,
    stamps: u64,
}

/// Every perf stamp in every image (`*.img`) of `disk_dir`, looked for at every 512-byte boundary
/// of the data the sparse images hold: every byte of each stamped block must be as perf wrote it
/// (a torn or corrupted block fails), and no block may hold perf's read poison. Whether a stamp
/// sits at its own offset is for the recorded ranges to say: stripes stamp their own offsets.
fn scan_stamps(disk_dir: &Path) -> Result<StampScan> {
    let mut scan = StampScan::default();
    let Ok(entries) = std::fs::read_dir(disk_dir) else {
        return Ok(scan);
    };
    let mut images: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "img"))
        .collect();
    images.sort();
    for path in images {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut file = std::fs::File::open(&path)
            .with_context(|| format!("vm-test: opening {}", path.display()))?;
        for (start, end) in data_extents(&file)? {
            file.seek(SeekFrom::Start(start))?;
            let mut at = start;
            let mut chunk = vec![0u8; 1 << 20];
            while at < end {
                let n = usize::try_from((end - at).min(chunk.len() as u64))?;
                file.read_exact(&mut chunk[..n])
                    .with_context(|| format!("vm-test: reading {} at {at}", path.display()))?;
                for i in (0..n).step_by(512) {
                    let pos = at + i as u64;
                    let here = &chunk[i..n];
                    let whole;
                    let block = match usnvme_stamp::header(here) {
                        Some(h) if !stamp_len_plausible(h.len) => bail!(
                            "vm-test: {name}: the block at byte {pos} carries a stamp with an impossible length {} (offset {}, seed {:#x})",
                            h.len,
                            h.offset,
                            h.seed
                        ),
                        Some(h) if h.len as usize > here.len() => {
                            // the block runs past this chunk: read it whole
                            let mut b = vec![0u8; h.len as usize];
                            file.read_exact_at(&mut b, pos).with_context(|| {
                                format!("vm-test: {name}: a stamp cut short at byte {pos}")
                            })?;
                            whole = b;
                            &whole[..]
                        }
                        Some(h) => &here[..h.len as usize],
                        None => &here[..here.len().min(512)],
                    };
                    if stamp_at(block, pos)
                        .with_context(|| format!("vm-test: {name}"))?
                        .is_some()
                    {
                        scan.stamps += 1;
                    }
                }
                at += n as u64;
            }
        }
        scan.images += 1;
    }
    Ok(scan)
}

/// The data extents of a sparse file, 512-byte aligned (SEEK_DATA / SEEK_HOLE).
fn data_extents(file: &std::fs::File) -> Result<Vec<(u64, u64)>> {
    use nix::unistd::{lseek, Whence};
    let size = file.metadata()?.len();
    let mut extents = Vec::new();
    let mut at: u64 = 0;
    while at < size {
        let Ok(data) = lseek(file, at as i64, Whence::SeekData) else {
            break; // ENXIO: no data past `at`
        };
        let hole = lseek(file, data, Whence::SeekHole).unwrap_or(size as i64);
        let (start, end) = (data as u64 / 512 * 512, (hole.max(data) as u64).min(size));
        if end <= start {
            break;
        }
        extents.push((start, end));
        at = end;
    }
    Ok(extents)
}

/// Suites that record writes for the host to check (`usnvme_tests::expect_on_host`).
const CHECKED_ON_HOST: &[&str] = &["vm_driver", "vm_fabric"];

/// Suites of ignored tests that run on the host only (`cargo xtask ci`'s fio step).
const HOST_ONLY: &[&str] = &["fio_sim"];

/// Written by the guest tests (`usnvme_tests::expect_on_host`): `IMAGE OFFSET LEN FNV1A64` per line.
const EXPECTATIONS: &str = "expect-images.txt";

/// Checks, on the host, that each write a guest test recorded is in the drive's image file.
fn check_images(expectations: &Path, disk_dir: &Path) -> Result<usize> {
    let Ok(text) = std::fs::read_to_string(expectations) else {
        return Ok(0);
    };
    let mut checked = 0;
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let parsed = match f.as_slice() {
            [image, offset, len, hash] => offset
                .parse::<u64>()
                .ok()
                .zip(len.parse::<usize>().ok())
                .zip(u64::from_str_radix(hash, 16).ok())
                .map(|((o, l), h)| (*image, o, l, h)),
            _ => None,
        };
        let Some((image, offset, len, hash)) = parsed else {
            bail!(
                "vm-test: malformed expectation line {line:?} in {}",
                expectations.display()
            );
        };
        let path = disk_dir.join(image);
        let mut data = vec![0u8; len];
        let mut file = std::fs::File::open(&path)
            .with_context(|| format!("vm-test: opening {}", path.display()))?;
        file.seek(SeekFrom::Start(offset))?;
        file.read_exact(&mut data)
            .with_context(|| format!("vm-test: reading {} at {offset}", path.display()))?;
        if fnv1a64(&data) != hash {
            bail!(
                "vm-test: {image}: the {len} bytes at offset {offset} are not what the guest wrote"
            );
        }
        checked += 1;
    }
    Ok(checked)
}

/// FNV-1a 64, as `usnvme_tests::fnv1a64` computes it in the guest.
fn fnv1a64(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Test executables from `cargo test --no-run --message-format=json`.
fn test_executables(json: &str) -> Vec<PathBuf> {
    json.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        // integration tests and library unit tests (bins hold no VM tests)
        .filter(|v| v["reason"] == "compiler-artifact" && v["profile"]["test"] == true)
        .filter(|v| {
            let kinds = v["target"]["kind"].as_array();
            kinds.is_some_and(|k| k.iter().any(|k| k == "test" || k == "lib"))
        })
        .filter_map(|v| v["executable"].as_str().map(PathBuf::from))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{read_progress, test_executables, truncate, Progress};

    #[test]
    fn progress_names_the_suites_ended_and_the_one_the_guest_was_in() {
        let p = read_progress(
            "start vm_a-1 0 0\nend vm_a-1 0\nstart vm_b-2 10 20\nend vm_b-2 101\nstart vm_c-3 30 40\n",
        );
        assert_eq!(
            p,
            Progress {
                ended: vec![("vm_a-1".into(), 0), ("vm_b-2".into(), 101)],
                started: Some(("vm_c-3".into(), 30, 40)),
            }
        );
        // a boot that ended cleanly: nothing started and unfinished; a torn last line is ignored
        let p = read_progress("start vm_a-1 0 0\nend vm_a-1 0\nsta");
        assert_eq!(p.started, None);
        assert_eq!(p.ended.len(), 1);
        let f = std::env::temp_dir().join(format!("usnvme-trunc-{}", std::process::id()));
        std::fs::write(&f, b"0123456789").unwrap();
        truncate(&f, 4).unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"0123");
        std::fs::remove_file(&f).unwrap();
        truncate(&f, 0).unwrap();
        assert!(!f.exists());
    }

    #[test]
    fn finds_what_the_guest_wrote_in_the_image_and_refuses_anything_else() {
        let dir = std::env::temp_dir().join(format!("usnvme-images-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut image = vec![0u8; 8192];
        image[4096..4100].copy_from_slice(b"data");
        std::fs::write(dir.join("nvme3.img"), &image).unwrap();
        let exp = dir.join("expect.txt");
        std::fs::write(
            &exp,
            format!("nvme3.img 4096 4 {:016x}\n", super::fnv1a64(b"data")),
        )
        .unwrap();
        assert_eq!(super::check_images(&exp, &dir).unwrap(), 1);
        std::fs::write(
            &exp,
            format!("nvme3.img 0 4 {:016x}\n", super::fnv1a64(b"data")),
        )
        .unwrap();
        assert!(super::check_images(&exp, &dir).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A block stamped as perf stamps it.
    fn stamp(at: u64, seed: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        usnvme_stamp::stamp(&mut b, at, seed);
        b
    }

    #[test]
    fn perf_stamps_are_found_and_a_wrong_one_is_named() {
        let dir = std::env::temp_dir().join(format!("usnvme-stamps-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // 4 KiB blocks at 1 MiB: the first four stamped by run 7, then one of run 9
        let mut image = vec![0u8; 2 << 20];
        let put = |image: &mut Vec<u8>, at: usize, offset: u64, seed: u64| {
            image[at..at + 4096].copy_from_slice(&stamp(offset, seed, 4096));
        };
        for b in 0..4 {
            let at = (1 << 20) + b * 4096;
            put(&mut image, at, at as u64, 7);
        }
        let at = (1 << 20) + 4 * 4096;
        put(&mut image, at, at as u64, 9);
        // and a 512-byte block of run 9 at the very end of the image
        let end = image.len() - 512;
        image[end..].copy_from_slice(&stamp(end as u64, 9, 512));
        std::fs::write(dir.join("nvme2.img"), &image).unwrap();
        let scan = super::scan_stamps(&dir).unwrap();
        assert_eq!(
            scan,
            super::StampScan {
                images: 1,
                stamps: 6
            }
        );

        let exp = dir.join("stamps.txt");
        let line = |start: u64, len: u64, seed: u64, mode: &str| {
            format!("nvme2.img {start} {len} 4096 {seed} {mode}\n")
        };
        std::fs::write(&exp, line(1 << 20, 16384, 7, "all")).unwrap();
        assert_eq!(super::check_stamp_ranges(&exp, &dir).unwrap(), 1);
        std::fs::write(&exp, line(1 << 20, 20480, 7, "all")).unwrap();
        assert!(
            super::check_stamp_ranges(&exp, &dir).is_err(),
            "one is run 9's"
        );
        std::fs::write(&exp, line(1 << 20, 32768, 9, "some")).unwrap();
        assert_eq!(super::check_stamp_ranges(&exp, &dir).unwrap(), 1);
        std::fs::write(&exp, line(0, 4096, 9, "some")).unwrap();
        assert!(super::check_stamp_ranges(&exp, &dir).is_err(), "none there");

        // a misdirected write: the block of 1 MiB + 4 KiB lands one block further
        let at = (1 << 20) + 8 * 4096;
        put(&mut image, at, (1 << 20) + 4096, 7);
        std::fs::write(dir.join("nvme2.img"), &image).unwrap();
        std::fs::write(&exp, line(1 << 20, 65536, 7, "some")).unwrap();
        let e = super::check_stamp_ranges(&exp, &dir).unwrap_err();
        assert!(
            format!("{e:#}").contains("nvme2.img") && format!("{e:#}").contains("misdirected"),
            "{e:#}"
        );
        // one byte corrupted in the middle of a stamped block, past its header: both checks
        // read every byte
        image[at + 2048] ^= 1;
        std::fs::write(dir.join("nvme2.img"), &image).unwrap();
        let e = super::scan_stamps(&dir).unwrap_err();
        let text = format!("{e:#}");
        assert!(
            text.contains("nvme2.img") && text.contains("the first at byte 2048"),
            "{text}"
        );
        let e = super::check_stamp_ranges(&exp, &dir).unwrap_err();
        assert!(format!("{e:#}").contains("differ"), "{e:#}");
        // perf's read poison written to a drive
        put(&mut image, at, at as u64, 7);
        for w in image[1 << 20..(1 << 20) + 4096].chunks_mut(8) {
            w.copy_from_slice(&usnvme_stamp::POISON);
        }
        std::fs::write(dir.join("nvme2.img"), &image).unwrap();
        let e = super::scan_stamps(&dir).unwrap_err();
        assert!(format!("{e:#}").contains("read poison"), "{e:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn picks_test_executables_from_cargo_json() {
        let json = r#"{"reason":"compiler-artifact","target":{"kind":["test"]},"profile":{"test":true},"executable":"/t/debug/deps/vm_list-1"}
{"reason":"compiler-artifact","target":{"kind":["lib"]},"profile":{"test":true},"executable":"/t/debug/deps/usnvme_hugepages-1"}
{"reason":"compiler-artifact","target":{"kind":["bin"]},"profile":{"test":false},"executable":"/t/debug/usnvme"}
{"reason":"compiler-artifact","target":{"kind":["test"]},"profile":{"test":true},"executable":null}
{"reason":"build-finished","success":true}"#;
        let exes = test_executables(json);
        assert_eq!(exes.len(), 2);
        assert!(exes[0].ends_with("vm_list-1"));
        assert!(exes[1].ends_with("usnvme_hugepages-1"));
    }
}

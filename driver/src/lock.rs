//! One owner per drive: before a PCI function is opened through VFIO, its owner takes an
//! exclusive `flock` on a lock file named after the function (`/run/usnvme/0000:01:00.0.lock`)
//! and writes its PID and command line into it. A second process gets an error that names the
//! owner instead of a controller reset under the first one's feet. The lock is held for the
//! controller's lifetime and dies with the process (however it ends); lock files are never
//! removed (unlinking a file another process is about to lock would let two owners in).
//!
//! Where: `/run/usnvme` (root's tmpfs, emptied at boot). Where it cannot be created (no root, a
//! read-only /run), `$TMPDIR/usnvme-locks`. VFIO itself needs root or a `/dev/vfio` group owned by
//! the user, so processes that can open the same drive make the same choice; VFIO's own refusal
//! (EBUSY on a group in use) remains the backstop.

use std::fs::{File, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::pci::PciAddress;

/// The preferred folder of the lock files.
pub const LOCK_DIR: &str = "/run/usnvme";

/// The fallback folder's name, in the temporary directory.
const FALLBACK_DIR: &str = "usnvme-locks";

/// Why a drive's lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("{addr} is in use by {owner}: stop it first")]
    InUse { addr: PciAddress, owner: String },
    #[error("{addr}: cannot take the lock {}: {source}", path.display())]
    Io {
        addr: PciAddress,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A drive's lock, held until dropped.
#[derive(Debug)]
pub struct OwnerLock {
    file: File,
    path: PathBuf,
}

impl OwnerLock {
    /// Takes the lock of `addr` in the default folder (see the module documentation).
    pub fn acquire(addr: PciAddress) -> Result<OwnerLock, LockError> {
        OwnerLock::acquire_in(&lock_dir(), addr)
    }

    /// Takes the lock of `addr` in `dir` (created if missing).
    pub fn acquire_in(dir: &Path, addr: PciAddress) -> Result<OwnerLock, LockError> {
        let path = dir.join(format!("{addr}.lock"));
        let io = |source| LockError::Io {
            addr,
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let mut file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(LockError::InUse {
                    addr,
                    owner: owner_of(&mut file),
                })
            }
            Err(TryLockError::Error(e)) => return Err(io(e)),
        }
        let line = format!("{} {}\n", std::process::id(), command_line());
        file.set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)))
            .and_then(|_| file.write_all(line.as_bytes()))
            .map_err(io)?;
        Ok(OwnerLock { file, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for OwnerLock {
    /// Empties the file (no stale PID is left to read), then the lock goes with the descriptor.
    fn drop(&mut self) {
        let _ = self.file.set_len(0);
    }
}

/// `/run/usnvme` if it exists or can be made, else a folder in the temporary directory.
fn lock_dir() -> PathBuf {
    let run = PathBuf::from(LOCK_DIR);
    if std::fs::create_dir_all(&run).is_ok() && writable(&run) {
        return run;
    }
    std::env::temp_dir().join(FALLBACK_DIR)
}

/// The folders where drives' locks may be, under `root` (`/`, or a fake tree in tests): the
/// preferred one, then the fallback of processes that cannot write it.
pub fn lock_dirs(root: &Path) -> [PathBuf; 2] {
    let tmp = std::env::temp_dir();
    let tmp = tmp.strip_prefix("/").unwrap_or(&tmp);
    [
        root.join(LOCK_DIR.trim_start_matches('/')),
        root.join(tmp).join(FALLBACK_DIR),
    ]
}

/// Who holds the lock of `addr` in one of `dirs` now, as "usnvme PID 1234 (usnvme perf -t 5)";
/// None if nobody holds it, or if its holder wrote no PID. Creates nothing and writes nothing.
///
/// Whether the lock is held is asked of the kernel (a file's text outlives a killed owner): a
/// shared lock is tried and, if granted, let go at once. An owner that starts in that instant
/// is refused as if the drive were in use; running it again works.
pub fn holder(dirs: &[PathBuf], addr: PciAddress) -> Option<String> {
    for dir in dirs {
        let Ok(mut file) = File::open(dir.join(format!("{addr}.lock"))) else {
            continue;
        };
        match file.try_lock_shared() {
            // free: closing the file lets go of the shared lock
            Ok(()) | Err(TryLockError::Error(_)) => continue,
            Err(TryLockError::WouldBlock) => return read_owner(&mut file),
        }
    }
    None
}

fn writable(dir: &Path) -> bool {
    nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK).is_ok()
}

/// "usnvme PID 1234 (usnvme perf -t 5)", from what the owner wrote in the lock file.
fn owner_of(file: &mut File) -> String {
    read_owner(file).unwrap_or_else(|| "another process (its PID is not in the lock file)".into())
}

/// The owner as the held lock `file` names it. The owner writes its line right after locking: a
/// reader that comes in between retries briefly.
fn read_owner(file: &mut File) -> Option<String> {
    for _ in 0..50 {
        let mut text = String::new();
        let read = file
            .seek(SeekFrom::Start(0))
            .and_then(|_| file.read_to_string(&mut text));
        if read.is_ok() {
            if let Some(owner) = describe(&text) {
                return Some(owner);
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// The owner as the lock file's line `PID COMMAND LINE` describes it.
fn describe(text: &str) -> Option<String> {
    let line = text.lines().next()?;
    let (pid, cmdline) = line.split_once(' ').unwrap_or((line, ""));
    let pid: u32 = pid.parse().ok()?;
    let program = cmdline
        .split_whitespace()
        .next()
        .and_then(|p| Path::new(p).file_name())
        .map_or_else(|| "process".into(), |p| p.to_string_lossy().into_owned());
    let mut notes: Vec<&str> = Vec::new();
    if !cmdline.trim().is_empty() {
        notes.push(cmdline.trim());
    }
    if pid == std::process::id() {
        notes.push("this process");
    }
    if notes.is_empty() {
        return Some(format!("{program} PID {pid}"));
    }
    Some(format!("{program} PID {pid} ({})", notes.join(", ")))
}

/// This process's command line, arguments separated by spaces (the program by its file name).
fn command_line() -> String {
    let mut args = std::env::args_os().map(|a| a.to_string_lossy().into_owned());
    let program = args
        .next()
        .map(|p| {
            Path::new(&p)
                .file_name()
                .map_or(p.clone(), |n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "?".into());
    let line: Vec<String> = std::iter::once(program).chain(args).collect();
    line.join(" ").replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("usnvme-lock-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_second_owner_is_refused_with_the_first_ones_pid_until_it_lets_go() {
        let dir = temp_dir("second");
        let addr: PciAddress = "0000:01:00.0".parse().expect("address");
        let first = OwnerLock::acquire_in(&dir, addr).expect("the first owner");
        assert_eq!(first.path(), dir.join("0000:01:00.0.lock"));
        let text = std::fs::read_to_string(first.path()).expect("lock file");
        assert!(
            text.starts_with(&format!("{} ", std::process::id())),
            "{text}"
        );

        // flock locks open files, not processes: a second open in this process conflicts too.
        let e = OwnerLock::acquire_in(&dir, addr).expect_err("in use");
        let msg = e.to_string();
        assert!(matches!(e, LockError::InUse { .. }), "{msg}");
        assert!(
            msg.starts_with("0000:01:00.0 is in use by ")
                && msg.contains(&format!("PID {}", std::process::id()))
                && msg.contains("this process")
                && msg.ends_with("stop it first"),
            "{msg}"
        );
        // another drive is free
        let other = OwnerLock::acquire_in(&dir, "0000:02:00.0".parse().expect("address"));
        assert!(other.is_ok());

        drop(first);
        let again = OwnerLock::acquire_in(&dir, addr).expect("free once dropped");
        drop(again);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_holder_is_named_only_while_the_lock_is_held() {
        let dir = temp_dir("holder");
        let dirs = [temp_dir("holder-none"), dir.clone()];
        let addr: PciAddress = "0000:04:00.0".parse().expect("address");
        assert_eq!(holder(&dirs, addr), None, "no lock file");
        assert!(!dirs[0].exists(), "looking creates nothing");

        let lock = OwnerLock::acquire_in(&dir, addr).expect("the owner");
        let owner = holder(&dirs, addr).expect("held");
        assert!(
            owner.contains(&format!("PID {}", std::process::id())),
            "{owner}"
        );
        assert!(
            OwnerLock::acquire_in(&dir, addr).is_err(),
            "still its owner's"
        );

        // A killed owner leaves its line behind, but not its lock.
        drop(lock);
        std::fs::write(dir.join("0000:04:00.0.lock"), "4242 usnvme perf\n").expect("write");
        assert_eq!(holder(&dirs, addr), None);
        let again = OwnerLock::acquire_in(&dir, addr).expect("free");
        drop(again);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn lock_folders_are_found_under_the_root() {
        let [run, tmp] = lock_dirs(Path::new("/fake"));
        assert_eq!(run, Path::new("/fake/run/usnvme"));
        assert!(
            tmp.starts_with("/fake") && tmp.ends_with("usnvme-locks"),
            "{}",
            tmp.display()
        );
        assert_eq!(lock_dirs(Path::new("/"))[0], Path::new(LOCK_DIR));
    }

    #[test]
    fn the_owner_is_described_from_the_lock_file() {
        assert_eq!(
            describe("1234 usnvme perf -t 5 -r 01:00.0\n").as_deref(),
            Some("usnvme PID 1234 (usnvme perf -t 5 -r 01:00.0)")
        );
        assert_eq!(describe("").as_deref(), None);
        assert_eq!(describe("x y").as_deref(), None);
        assert_eq!(
            describe("77").as_deref(),
            Some("process PID 77"),
            "no command line"
        );
    }

    #[test]
    fn a_folder_that_cannot_be_made_is_an_error_naming_the_drive_and_path() {
        let file = temp_dir("file");
        std::fs::write(&file, b"").expect("a plain file");
        let e = OwnerLock::acquire_in(&file.join("sub"), "0000:03:00.0".parse().expect("addr"))
            .expect_err("not a folder");
        let msg = e.to_string();
        assert!(
            msg.starts_with("0000:03:00.0: cannot take the lock") && msg.contains("sub"),
            "{msg}"
        );
        let _ = std::fs::remove_file(&file);
    }
}

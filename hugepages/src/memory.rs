//! Pinned DMA memory: an anonymous mapping of 2 MiB / 1 GiB hugepages (or locked 4 KiB pages for the
//! software controller), bound to a NUMA node, populated, locked and verified page by page.
//!
//! The mapping itself is created and unmapped by vm-memory's [`MmapRegion`] (an owned region), so the
//! same `Arc<MmapRegion>` backs both [`Memory`] and the IOVA address space: a snapshot of the address
//! space keeps the pages mapped in this process for as long as it lives. The only `unsafe` left here
//! is the memory-policy and locking syscalls on that mapping.

use std::ffi::c_void;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;

use nix::errno::Errno;
use nix::sys::mman::{madvise, mlock, MmapAdvise};
use nix::sys::resource::{getrlimit, Resource, RLIM_INFINITY};

use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::MmapRegion;

/// The page size backing a [`Memory`] region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PageSize {
    /// 2 MiB hugepages from the kernel's hugetlb pool.
    Huge2M,
    /// 1 GiB hugepages from the kernel's hugetlb pool.
    Huge1G,
    /// Ordinary locked 4 KiB pages: for tests and the software controller only (the kernel may
    /// migrate them, so real devices get hugepages).
    Small4K,
}

impl PageSize {
    /// The page size in bytes.
    pub const fn bytes(self) -> usize {
        match self {
            PageSize::Small4K => 4 << 10,
            PageSize::Huge2M => 2 << 20,
            PageSize::Huge1G => 1 << 30,
        }
    }

    /// Whether these pages come from the hugetlb pool.
    pub const fn is_huge(self) -> bool {
        !matches!(self, PageSize::Small4K)
    }

    /// The name of this size's directory in sysfs, e.g. `hugepages-2048kB`.
    pub fn sysfs_dir(self) -> String {
        format!("hugepages-{}kB", self.bytes() >> 10)
    }

    fn mmap_flags(self) -> i32 {
        let base = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        match self {
            PageSize::Small4K => base,
            PageSize::Huge2M => base | libc::MAP_HUGETLB | libc::MAP_HUGE_2MB,
            PageSize::Huge1G => base | libc::MAP_HUGETLB | libc::MAP_HUGE_1GB,
        }
    }
}

impl fmt::Display for PageSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PageSize::Small4K => "4K",
            PageSize::Huge2M => "2M",
            PageSize::Huge1G => "1G",
        })
    }
}

/// Why DMA memory could not be allocated. Each message says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("cannot allocate an empty DMA region")]
    Empty,
    #[error("NUMA node {node} does not exist (see /sys/devices/system/node)")]
    NoSuchNode { node: u32 },
    #[error("the kernel offers no {page} hugepages{}: 1G pages need CPU support (pdpe1gb) and `hugepagesz=1G` on the kernel command line", on_node(*.node))]
    UnsupportedPageSize { page: PageSize, node: Option<u32> },
    #[error("{}", not_enough_message(*.needed, *.free, *.total, *.node, *.page))]
    NotEnoughHugepages {
        needed: u64,
        free: u64,
        /// The pool size now (`nr_hugepages`), to compute the fix.
        total: u64,
        node: Option<u32>,
        page: PageSize,
    },
    #[error("cannot lock {len} bytes of DMA memory: RLIMIT_MEMLOCK is {}; run `ulimit -l unlimited` (or set memlock in /etc/security/limits.conf) or run as root ({source})", limit.map_or("unlimited".to_string(), |l| format!("{l} bytes")))]
    MemlockLimit {
        len: usize,
        limit: Option<u64>,
        source: io::Error,
    },
    #[error("{op} of {len} bytes of {page} pages{} failed: {source}", on_node(*.node))]
    Syscall {
        op: &'static str,
        len: usize,
        page: PageSize,
        node: Option<u32>,
        source: io::Error,
    },
    #[error("page {index} of a DMA region bound to node {expected} is {}", page_status(*.status))]
    WrongNode {
        index: usize,
        expected: u32,
        status: i32,
    },
    #[error("cannot read {path}: {source}")]
    Sysfs { path: PathBuf, source: io::Error },
}

fn on_node(node: Option<u32>) -> String {
    node.map_or(String::new(), |n| format!(" on node {n}"))
}

fn page_status(status: i32) -> String {
    if status >= 0 {
        format!("on node {status}")
    } else {
        format!("not resident ({})", io::Error::from_raw_os_error(-status))
    }
}

fn not_enough_message(
    needed: u64,
    free: u64,
    total: u64,
    node: Option<u32>,
    page: PageSize,
) -> String {
    let target = total + needed.saturating_sub(free);
    let bytes = target * page.bytes() as u64;
    let amount = if bytes.is_multiple_of(1 << 30) {
        format!("{}G", bytes >> 30)
    } else {
        format!("{}M", bytes >> 20)
    };
    let size = if page == PageSize::Huge1G {
        ",size=1G"
    } else {
        ""
    };
    let (node_arg, sysfs) = match node {
        Some(n) => (
            format!(",node={n}"),
            format!("/sys/devices/system/node/node{n}/hugepages"),
        ),
        None => (String::new(), "/sys/kernel/mm/hugepages".to_string()),
    };
    format!(
        "not enough {page} hugepages{}: need {needed}, {free} free; run `usnvme setup --hugepages {amount}{size}{node_arg}` (or echo {target} > {sysfs}/{}/nr_hugepages)",
        on_node(node),
        page.sysfs_dir(),
    )
}

/// One mmap'd, populated, locked region of DMA memory; unmapped when the last reference to its
/// mapping goes (the [`Memory`] itself and any address-space snapshot holding it).
#[derive(Debug)]
pub struct Memory {
    region: Arc<MmapRegion>,
    page: PageSize,
    node: Option<u32>,
}

impl Memory {
    /// Allocates `len` bytes (rounded up to the page size) of `page`-sized pages, on `node` if given.
    ///
    /// Steps: check the hugetlb pool in sysfs (fails early with the fix); mmap; bind to the node
    /// (`mbind`, before any page is touched); populate (`MADV_POPULATE_WRITE`, which reports pool
    /// exhaustion as an error instead of a SIGBUS); `mlock`; verify each page's node (`move_pages`).
    pub fn allocate(len: usize, page: PageSize, node: Option<u32>) -> Result<Memory, MemoryError> {
        allocate_in(Path::new("/sys"), len, page, node)
    }

    /// The first byte of the region.
    pub fn as_ptr(&self) -> *mut u8 {
        self.region.as_ptr()
    }

    /// The length in bytes, a multiple of the page size.
    pub fn len(&self) -> usize {
        self.region.size()
    }

    /// Always false: an empty region cannot be allocated.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn page_size(&self) -> PageSize {
        self.page
    }

    /// The NUMA node every page was verified to be on, or `None` when no node was requested.
    pub fn node(&self) -> Option<u32> {
        self.node
    }

    /// The mapping, shared with the IOVA address space.
    pub(crate) fn mmap_region(&self) -> &Arc<MmapRegion> {
        &self.region
    }

    /// Never unmaps this memory: for pages that a device may still reach.
    pub(crate) fn leak(&self) {
        std::mem::forget(Arc::clone(&self.region));
    }
}

/// [`Memory::allocate`] with an injectable sysfs root (tests use a fake tree).
pub(crate) fn allocate_in(
    sysfs: &Path,
    len: usize,
    page: PageSize,
    node: Option<u32>,
) -> Result<Memory, MemoryError> {
    let sys_err = |op, source| MemoryError::Syscall {
        op,
        len,
        page,
        node,
        source,
    };
    if len == 0 {
        return Err(MemoryError::Empty);
    }
    let len = len
        .checked_next_multiple_of(page.bytes())
        .ok_or_else(|| sys_err("rounding", io::Error::from_raw_os_error(libc::EOVERFLOW)))?;
    if let Some(n) = node {
        if !sysfs.join(format!("devices/system/node/node{n}")).is_dir() {
            return Err(MemoryError::NoSuchNode { node: n });
        }
    }
    if page.is_huge() {
        check_hugepages(sysfs, (len / page.bytes()) as u64, page, node)?;
    }
    // No MAP_NORESERVE: hugetlb reserves the pages at mmap time, so a short global pool fails here
    // with ENOMEM rather than later. No MAP_POPULATE: the pages must be bound to the node first.
    let region = MmapRegionBuilder::new(len)
        .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
        .with_mmap_flags(page.mmap_flags())
        .with_hugetlbfs(page.is_huge())
        .build()
        .map_err(|e| match e {
            vm_memory::mmap::MmapRegionError::Mmap(source) => sys_err("mmap", source),
            other => sys_err("mmap", io::Error::other(other.to_string())),
        })?;
    let ptr = region.as_ptr();
    // The child of a fork must never share (or copy-on-write) pages a device writes.
    let start = NonNull::new(ptr.cast::<c_void>())
        .ok_or_else(|| sys_err("mmap", io::Error::other("a null mapping")))?;
    // SAFETY: [ptr, ptr+len) is the mapping just created; MADV_DONTFORK changes no contents.
    unsafe { madvise(start, len, MmapAdvise::MADV_DONTFORK) }
        .map_err(|e| sys_err("madvise(MADV_DONTFORK)", e.into()))?;
    if let Some(n) = node {
        mbind(ptr, len, n).map_err(|e| sys_err("mbind", e))?;
    }
    populate(start, len, page).map_err(|e| sys_err("populate", e))?;
    // SAFETY: locking the pages of a mapping we own has no effect on memory safety.
    if let Err(errno) = unsafe { mlock(start, len) } {
        return Err(match errno {
            Errno::EPERM | Errno::ENOMEM => MemoryError::MemlockLimit {
                len,
                limit: memlock_limit(),
                source: errno.into(),
            },
            _ => sys_err("mlock", errno.into()),
        });
    }
    if let Some(n) = node {
        verify_node(ptr, len, page, n)?;
    }
    log::debug!(
        "allocated {len} bytes of {page} pages{} at {ptr:p}",
        on_node(node)
    );
    Ok(Memory {
        region: Arc::new(region),
        page,
        node,
    })
}

fn mbind(ptr: *mut u8, len: usize, node: u32) -> io::Result<()> {
    let bits = libc::c_ulong::BITS as usize;
    let mut mask = vec![0 as libc::c_ulong; node as usize / bits + 1];
    mask[node as usize / bits] |= 1 << (node as usize % bits);
    // The kernel reads maxnode - 1 bits (a historical off-by-one that libnuma also compensates for).
    let maxnode = (mask.len() * bits + 1) as libc::c_ulong;
    const MPOL_MF_STRICT: libc::c_uint = 1;
    // SAFETY: [ptr, ptr+len) is our own mapping; `mask` outlives the call and holds maxnode - 1 bits.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            ptr,
            len,
            libc::MPOL_BIND,
            mask.as_ptr(),
            maxnode,
            MPOL_MF_STRICT,
        )
    };
    syscall_result(ret)
}

/// A raw `syscall`'s return value as a result (the ones nix has no wrapper for).
fn syscall_result(ret: libc::c_long) -> io::Result<()> {
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn populate(start: NonNull<c_void>, len: usize, page: PageSize) -> io::Result<()> {
    let ptr = start.as_ptr().cast::<u8>();
    // SAFETY: [ptr, ptr+len) is our own writable mapping; populating writes no data.
    match unsafe { madvise(start, len, MmapAdvise::MADV_POPULATE_WRITE) } {
        Err(Errno::EINVAL) => {
            // Kernels before 5.14: touch each page. A hugetlb pool emptied since the sysfs check
            // would raise SIGBUS here, which MADV_POPULATE_WRITE reports as an error instead.
            log::warn!(
                "MADV_POPULATE_WRITE unsupported; touching {} pages",
                len / page.bytes()
            );
            for offset in (0..len).step_by(page.bytes()) {
                // SAFETY: offset < len, inside our writable mapping, which nothing else references yet.
                unsafe { ptr.wrapping_add(offset).write_volatile(0) };
            }
            Ok(())
        }
        other => other.map_err(io::Error::from),
    }
}

fn memlock_limit() -> Option<u64> {
    let (soft, _hard) = getrlimit(Resource::RLIMIT_MEMLOCK).ok()?;
    (soft != RLIM_INFINITY).then_some(soft)
}

fn verify_node(ptr: *mut u8, len: usize, page: PageSize, node: u32) -> Result<(), MemoryError> {
    let pages: Vec<*mut libc::c_void> = (0..len)
        .step_by(page.bytes())
        .map(|o| ptr.wrapping_add(o).cast())
        .collect();
    let mut status = vec![i32::MIN; pages.len()];
    // SAFETY: with nodes = NULL, move_pages only reports each page's node into `status`, which has
    // one entry per address in `pages`; both outlive the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            0,
            pages.len() as libc::c_ulong,
            pages.as_ptr(),
            std::ptr::null::<libc::c_int>(),
            status.as_mut_ptr(),
            0,
        )
    };
    syscall_result(ret).map_err(|source| MemoryError::Syscall {
        op: "move_pages",
        len,
        page,
        node: Some(node),
        source,
    })?;
    match status.iter().position(|&s| s != node as i32) {
        Some(index) => Err(MemoryError::WrongNode {
            index,
            expected: node,
            status: status[index],
        }),
        None => Ok(()),
    }
}

fn read_count(path: &Path) -> Result<u64, MemoryError> {
    let text = std::fs::read_to_string(path).map_err(|source| MemoryError::Sysfs {
        path: path.to_owned(),
        source,
    })?;
    text.trim().parse().map_err(|e| MemoryError::Sysfs {
        path: path.to_owned(),
        source: io::Error::new(io::ErrorKind::InvalidData, e),
    })
}

/// The hugepage pool directory for `page` on `node` (or the global pool).
fn pool_dir(sysfs: &Path, page: PageSize, node: Option<u32>) -> PathBuf {
    match node {
        Some(n) => sysfs.join(format!("devices/system/node/node{n}/hugepages")),
        None => sysfs.join("kernel/mm/hugepages"),
    }
    .join(page.sysfs_dir())
}

/// Fails with [`MemoryError::NotEnoughHugepages`] unless `needed` pages are free on `node`.
pub(crate) fn check_hugepages(
    sysfs: &Path,
    needed: u64,
    page: PageSize,
    node: Option<u32>,
) -> Result<(), MemoryError> {
    let dir = pool_dir(sysfs, page, node);
    if !dir.is_dir() {
        return Err(MemoryError::UnsupportedPageSize { page, node });
    }
    let total = read_count(&dir.join("nr_hugepages"))?;
    let mut free = read_count(&dir.join("free_hugepages"))?;
    // Pages reserved by other mappings but not yet faulted in still count as free; the kernel
    // reports reservations globally only.
    let global = pool_dir(sysfs, page, None);
    if let Ok(resv) = read_count(&global.join("resv_hugepages")) {
        let global_free = read_count(&global.join("free_hugepages"))?;
        free = free.min(global_free.saturating_sub(resv));
    }
    if free < needed {
        return Err(MemoryError::NotEnoughHugepages {
            needed,
            free,
            total,
            node,
            page,
        });
    }
    Ok(())
}

/// One hugepage pool: `node` is `None` for the global pool of a machine without NUMA in sysfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeHugepages {
    pub node: Option<u32>,
    pub size: PageSize,
    pub total: u64,
    pub free: u64,
}

/// Every hugepage pool under `sysfs_root` (normally `/sys`), per NUMA node, sorted by node then size.
/// Pools that cannot be read are left out.
pub fn hugepage_status(sysfs_root: &Path) -> Vec<NodeHugepages> {
    let mut nodes: Vec<Option<u32>> = std::fs::read_dir(sysfs_root.join("devices/system/node"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("node")?.parse().ok())
        .map(Some)
        .collect();
    if nodes.is_empty() {
        nodes.push(None);
    }
    nodes.sort();
    let mut pools = Vec::new();
    for node in nodes {
        for size in [PageSize::Huge2M, PageSize::Huge1G] {
            let dir = pool_dir(sysfs_root, size, node);
            if let (Ok(total), Ok(free)) = (
                read_count(&dir.join("nr_hugepages")),
                read_count(&dir.join("free_hugepages")),
            ) {
                pools.push(NodeHugepages {
                    node,
                    size,
                    total,
                    free,
                });
            }
        }
    }
    pools
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, VolatileMemory};

    /// A fake sysfs tree, removed on drop.
    struct FakeSysfs(PathBuf);

    impl FakeSysfs {
        fn new() -> FakeSysfs {
            static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let root =
                std::env::temp_dir().join(format!("usnvme-hugepages-{}-{n}", std::process::id()));
            FakeSysfs(root)
        }

        /// A pool: `node` None is the global one.
        fn pool(
            self,
            node: Option<u32>,
            page: PageSize,
            total: u64,
            free: u64,
            resv: Option<u64>,
        ) -> Self {
            let dir = pool_dir(&self.0, page, node);
            std::fs::create_dir_all(&dir).expect("mkdir");
            std::fs::write(dir.join("nr_hugepages"), format!("{total}\n")).expect("write");
            std::fs::write(dir.join("free_hugepages"), format!("{free}\n")).expect("write");
            if let Some(resv) = resv {
                std::fs::write(dir.join("resv_hugepages"), format!("{resv}\n")).expect("write");
            }
            self
        }
    }

    impl Drop for FakeSysfs {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn write_read(memory: &Memory) {
        let slice = memory
            .mmap_region()
            .get_slice(0, memory.len())
            .expect("slice");
        slice
            .write_slice(b"usnvme", memory.len() - 6)
            .expect("write");
        let mut back = [0u8; 6];
        slice.read_slice(&mut back, memory.len() - 6).expect("read");
        assert_eq!(&back, b"usnvme");
    }

    #[test]
    fn small_pages_without_node() {
        let memory = Memory::allocate(5000, PageSize::Small4K, None).expect("allocate");
        assert_eq!(memory.len(), 8192);
        assert_eq!(memory.page_size(), PageSize::Small4K);
        assert_eq!(memory.node(), None);
        assert_eq!(memory.as_ptr() as usize % 4096, 0);
        write_read(&memory);
    }

    #[test]
    fn small_pages_bound_and_verified_on_node0() {
        let result = Memory::allocate(64 << 10, PageSize::Small4K, Some(0));
        if Path::new("/sys/devices/system/node/node0").is_dir() {
            let memory = result.expect("allocate on node 0");
            assert_eq!(memory.node(), Some(0));
            write_read(&memory);
        } else {
            assert!(
                matches!(result, Err(MemoryError::NoSuchNode { node: 0 })),
                "{result:?}"
            );
        }
    }

    #[test]
    fn rejects_empty_and_unknown_nodes() {
        assert!(matches!(
            Memory::allocate(0, PageSize::Small4K, None),
            Err(MemoryError::Empty)
        ));
        let err = Memory::allocate(4096, PageSize::Small4K, Some(4095)).expect_err("node 4095");
        assert!(
            matches!(err, MemoryError::NoSuchNode { node: 4095 }),
            "{err}"
        );
    }

    #[test]
    fn real_sysfs_too_few_hugepages_fails_early_with_the_fix() {
        let node = Path::new("/sys/devices/system/node/node0")
            .is_dir()
            .then_some(0);
        let free = hugepage_status(Path::new("/sys"))
            .iter()
            .find(|p| p.node == node && p.size == PageSize::Huge2M)
            .map_or(0, |p| p.free);
        let len = (free as usize + 1) * PageSize::Huge2M.bytes();
        let err = Memory::allocate(len, PageSize::Huge2M, node).expect_err("more than free");
        assert!(
            matches!(
                err,
                MemoryError::NotEnoughHugepages {
                    page: PageSize::Huge2M,
                    ..
                }
            ),
            "{err}"
        );
        let msg = err.to_string();
        assert!(msg.contains("usnvme setup --hugepages"), "{msg}");
        if let Some(n) = node {
            assert!(msg.contains(&format!("on node {n}")), "{msg}");
        }
    }

    #[test]
    fn fake_sysfs_not_enough_on_node1() {
        let sys = FakeSysfs::new()
            .pool(Some(0), PageSize::Huge2M, 512, 512, None)
            .pool(Some(1), PageSize::Huge2M, 1, 1, None)
            .pool(None, PageSize::Huge2M, 513, 513, Some(0));
        let err =
            allocate_in(&sys.0, 3 << 20, PageSize::Huge2M, Some(1)).expect_err("needs 2, 1 free");
        match &err {
            MemoryError::NotEnoughHugepages {
                needed: 2,
                free: 1,
                total: 1,
                node: Some(1),
                page: PageSize::Huge2M,
            } => {}
            other => panic!("{other:?}"),
        }
        let msg = err.to_string();
        assert!(msg.contains("on node 1: need 2, 1 free"), "{msg}");
        assert!(
            msg.contains("run `usnvme setup --hugepages 4M,node=1`"),
            "{msg}"
        );
        assert!(
            msg.contains(
                "echo 2 > /sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages"
            ),
            "{msg}"
        );
        // Node 0 has enough: the check passes (the real mmap is not attempted on a fake tree).
        check_hugepages(&sys.0, 512, PageSize::Huge2M, Some(0)).expect("enough on node 0");
    }

    #[test]
    fn fake_sysfs_reservations_and_1g_pages() {
        let sys = FakeSysfs::new()
            .pool(Some(0), PageSize::Huge2M, 8, 8, None)
            .pool(None, PageSize::Huge2M, 8, 8, Some(6))
            .pool(None, PageSize::Huge1G, 2, 0, Some(0));
        let err =
            check_hugepages(&sys.0, 4, PageSize::Huge2M, Some(0)).expect_err("6 of 8 reserved");
        assert!(
            matches!(err, MemoryError::NotEnoughHugepages { free: 2, .. }),
            "{err}"
        );
        let err = check_hugepages(&sys.0, 1, PageSize::Huge1G, None).expect_err("none free");
        assert!(err.to_string().contains("--hugepages 3G,size=1G`"), "{err}");
        assert!(
            err.to_string()
                .contains("echo 3 > /sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages"),
            "{err}"
        );
        let err = check_hugepages(&sys.0, 1, PageSize::Huge1G, Some(0))
            .expect_err("no 1G pool on node 0");
        assert!(
            matches!(err, MemoryError::UnsupportedPageSize { node: Some(0), .. }),
            "{err}"
        );
    }

    #[test]
    fn status_lists_pools_per_node() {
        let sys = FakeSysfs::new()
            .pool(Some(1), PageSize::Huge2M, 4, 3, None)
            .pool(Some(0), PageSize::Huge1G, 1, 1, None)
            .pool(Some(0), PageSize::Huge2M, 2, 0, None);
        let status = hugepage_status(&sys.0);
        let row = |node, size, total, free| NodeHugepages {
            node: Some(node),
            size,
            total,
            free,
        };
        assert_eq!(
            status,
            vec![
                row(0, PageSize::Huge2M, 2, 0),
                row(0, PageSize::Huge1G, 1, 1),
                row(1, PageSize::Huge2M, 4, 3)
            ]
        );
        let flat = FakeSysfs::new().pool(None, PageSize::Huge2M, 5, 5, Some(0));
        let want = NodeHugepages {
            node: None,
            size: PageSize::Huge2M,
            total: 5,
            free: 5,
        };
        assert_eq!(hugepage_status(&flat.0), vec![want]);
    }
}

//! `--hugepages SIZE[,node=N][,size=1G]`: the hugepage pools to reserve, the hugetlbfs mount, and
//! the locked-memory limit that using them takes.

use std::fs;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::{bail, Result};
use usnvme_hugepages::{hugepage_status, PageSize};

use super::plan::{read_count, Item, Step};
use crate::format::iec_bytes;

/// Where `setup` mounts hugetlbfs when nothing is mounted, as SPDK does.
pub const HUGETLBFS_MOUNT: &str = "/dev/hugepages";

/// One pool to size: `bytes` of `page` pages on `node` (`None`: the kernel spreads them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub bytes: u64,
    pub node: Option<u32>,
    pub page: PageSize,
}

impl Request {
    /// The number of pages.
    fn count(&self) -> u64 {
        self.bytes / self.page.bytes() as u64
    }

    /// The pool's `nr_hugepages`, relative to the root.
    fn file(&self) -> PathBuf {
        pool_dir(self.node, self.page).join("nr_hugepages")
    }

    fn name(&self) -> String {
        match self.node {
            Some(n) => format!("hugepages on node {n}"),
            None => "hugepages".to_owned(),
        }
    }
}

fn pool_dir(node: Option<u32>, page: PageSize) -> PathBuf {
    let base = match node {
        Some(n) => format!("sys/devices/system/node/node{n}/hugepages"),
        None => "sys/kernel/mm/hugepages".to_owned(),
    };
    PathBuf::from(base).join(page.sysfs_dir())
}

impl FromStr for Request {
    type Err = String;

    /// `2G`, `512M`, `4G,node=1`, `8G,size=1G` (1 GiB pages), `0` (release the pool).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s.split(',');
        let bytes = parse_size(parts.next().unwrap_or_default())?;
        let mut request = Request {
            bytes,
            node: None,
            page: PageSize::Huge2M,
        };
        for part in parts {
            match part.split_once('=') {
                Some(("node", n)) => {
                    let node = n
                        .parse()
                        .map_err(|_| format!("node={n}: not a node number"))?;
                    request.node = Some(node);
                }
                Some(("size", "2M")) => request.page = PageSize::Huge2M,
                Some(("size", "1G")) => request.page = PageSize::Huge1G,
                Some(("size", other)) => {
                    return Err(format!("size={other}: the page size is 2M or 1G"))
                }
                _ => return Err(format!("{part:?}: expected node=N or size=2M|1G")),
            }
        }
        if !bytes.is_multiple_of(request.page.bytes() as u64) {
            return Err(format!("not a whole number of {} pages", request.page));
        }
        Ok(request)
    }
}

/// `512M`, `2G`, `1T`, or `0` (whole pages are checked by the caller).
fn parse_size(s: &str) -> Result<u64, String> {
    usnvme_driver::parse_size(s)
        .ok_or_else(|| format!("{s:?}: expected a size like 512M, 2G or 1T"))
}

/// The items that size the requested pools (one per pool; the last request for a pool wins),
/// then mount hugetlbfs if nothing is mounted. An error names a node or page size this machine
/// does not have.
pub fn plan(root: &Path, requests: &[Request]) -> Result<Vec<Item>> {
    let mut items = Vec::new();
    for (i, r) in requests.iter().enumerate() {
        if requests[i + 1..]
            .iter()
            .any(|later| (later.node, later.page) == (r.node, r.page))
        {
            continue;
        }
        if let Some(n) = r.node {
            let dir = root.join(format!("sys/devices/system/node/node{n}"));
            if !dir.is_dir() {
                bail!(
                    "--hugepages: NUMA node {n} does not exist (this machine has {})",
                    nodes(root)
                );
            }
        }
        let file = r.file();
        if !root.join(&file).exists() {
            bail!(
                "--hugepages: the kernel offers no {} hugepages (no /{}): {}",
                r.page,
                file.display(),
                if r.page == PageSize::Huge1G {
                    "1G pages need CPU support (pdpe1gb); use size=2M"
                } else {
                    "the kernel needs CONFIG_HUGETLBFS"
                }
            );
        }
        let now = read_count(&root.join(&file))?;
        let count = r.count();
        let item = if now == count {
            Item::new(
                format!("{}: already {count} × {}", r.name(), r.page),
                Vec::new(),
            )
        } else {
            Item::new(
                format!("{}: {now} -> {count} × {}", r.name(), r.page),
                vec![
                    Step::Write {
                        file: file.clone(),
                        value: count.to_string(),
                    },
                    Step::ExpectHugepages { file, count },
                ],
            )
        };
        items.push(item);
    }
    if !requests.is_empty() && hugetlbfs_mount(root).is_none() {
        items.push(Item::new(
            format!("hugetlbfs: not mounted -> {HUGETLBFS_MOUNT}"),
            vec![Step::MountHugetlbfs(HUGETLBFS_MOUNT)],
        ));
    }
    Ok(items)
}

/// `nodes 0, 1` or `no NUMA nodes in sysfs`.
fn nodes(root: &Path) -> String {
    let mut nodes: Vec<u32> = fs::read_dir(root.join("sys/devices/system/node"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("node")?.parse().ok())
        .collect();
    nodes.sort_unstable();
    if nodes.is_empty() {
        return "no NUMA nodes in sysfs: leave out node=".to_owned();
    }
    let list: Vec<String> = nodes.iter().map(u32::to_string).collect();
    format!("node {}", list.join(", "))
}

/// Where hugetlbfs is mounted, from `proc/self/mounts`.
pub fn hugetlbfs_mount(root: &Path) -> Option<String> {
    let mounts = fs::read_to_string(root.join("proc/self/mounts")).unwrap_or_default();
    mounts.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.get(2) == Some(&"hugetlbfs")).then(|| fields.get(1).map(|t| (*t).to_owned()))?
    })
}

/// The bytes of hugepages reserved once `requests` are carried out.
pub fn reserved_bytes(root: &Path, requests: &[Request]) -> u64 {
    let pools = hugepage_status(&root.join("sys"));
    let per_node = pools.iter().any(|p| p.node.is_some());
    let mut bytes: u64 = pools
        .iter()
        .filter(|p| {
            !requests
                .iter()
                .any(|r| r.page == p.size && (r.node == p.node || (r.node.is_none() && per_node)))
        })
        .map(|p| p.total * p.size.bytes() as u64)
        .sum();
    bytes += requests.iter().map(|r| r.bytes).sum::<u64>();
    bytes
}

/// RLIMIT_MEMLOCK's soft limit in bytes from `proc/self/limits` (what getrlimit says, without
/// libc), `u64::MAX` if unlimited; `None` if unknown.
pub fn memlock_limit(root: &Path) -> Option<u64> {
    let limits = fs::read_to_string(root.join("proc/self/limits")).ok()?;
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max locked memory"))?;
    match line["Max locked memory".len()..]
        .split_whitespace()
        .next()?
    {
        "unlimited" => Some(u64::MAX),
        soft => soft.parse().ok(),
    }
}

/// The warnings for `bind`: no hugepages at all, or a memlock limit below them.
pub fn warnings(root: &Path, requests: &[Request]) -> Vec<String> {
    let reserved = reserved_bytes(root, requests);
    if reserved == 0 {
        return vec![
            "no hugepages are reserved and usnvme needs them for DMA memory: run `usnvme setup --hugepages 2G` (add ,node=N per NUMA node of the drives)".to_owned(),
        ];
    }
    match memlock_limit(root) {
        Some(limit) if limit < reserved => vec![format!(
            "RLIMIT_MEMLOCK is {}, below the {} of hugepages: usnvme run by a user other than root \
             cannot lock them; run `ulimit -l unlimited` in that shell (or set memlock in \
             /etc/security/limits.conf)",
            iec_bytes(limit.into()),
            iec_bytes(reserved.into())
        )],
        _ => Vec::new(),
    }
}

/// The `hugepages`, `hugetlbfs` and `memlock` lines of `setup status`.
pub fn status(root: &Path) -> Vec<(&'static str, String)> {
    let pools: Vec<String> = hugepage_status(&root.join("sys"))
        .iter()
        .filter(|p| p.total > 0)
        .map(|p| {
            let node = p.node.map_or_else(String::new, |n| format!("node {n}: "));
            format!("{node}{} × {} ({} free)", p.total, p.size, p.free)
        })
        .collect();
    let pools = if pools.is_empty() {
        "none reserved: run `usnvme setup --hugepages 2G`".to_owned()
    } else {
        pools.join(", ")
    };
    let mount = hugetlbfs_mount(root).unwrap_or_else(|| "not mounted".to_owned());
    let reserved = reserved_bytes(root, &[]);
    let memlock = match memlock_limit(root) {
        Some(limit) if limit < reserved => format!(
            "{}, below the {} of hugepages: a non-root usnvme needs `ulimit -l unlimited`",
            iec_bytes(limit.into()),
            iec_bytes(reserved.into())
        ),
        Some(u64::MAX) => "unlimited".to_owned(),
        Some(limit) => iec_bytes(limit.into()),
        None => "unknown (cannot read /proc/self/limits)".to_owned(),
    };
    vec![
        ("hugepages", pools),
        ("hugetlbfs", mount),
        ("memlock", memlock),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse() {
        let r = |s: &str| s.parse::<Request>();
        assert_eq!(
            r("2G"),
            Ok(Request {
                bytes: 2 << 30,
                node: None,
                page: PageSize::Huge2M
            })
        );
        assert_eq!(
            r("4G,node=1").map(|r| (r.count(), r.node)),
            Ok((2048, Some(1)))
        );
        assert_eq!(
            r("8G,size=1G,node=0").map(|r| (r.count(), r.page)),
            Ok((8, PageSize::Huge1G))
        );
        assert_eq!(r("0").map(|r| r.count()), Ok(0));
        assert_eq!(r("512m").map(|r| r.count()), Ok(256));
        for (bad, why) in [
            ("2", "not a whole number of 2M pages"),
            ("G", "expected a size"),
            ("3M", "not a whole number of 2M pages"),
            ("1G,size=1G,node=x", "not a node number"),
            ("2G,size=4K", "2M or 1G"),
            ("2G,nodes=1", "expected node=N"),
            ("99999999999T", "expected a size"),
        ] {
            let err = r(bad).expect_err(bad);
            assert!(err.contains(why), "{bad}: {err}");
        }
    }
}

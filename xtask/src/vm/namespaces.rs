//! `vm-run --ns SPEC`: the namespaces every controller gets, as QEMU's `nvme-ns` devices (QEMU
//! 10 takes metadata and protection information only there, not on `nvme`). A SPEC is
//! `key=value` pairs: `bs=512|4096`, `size=SIZE` (default: the disk size shared by the
//! namespaces), `ms=0|8|16|64` metadata bytes per block, `mset=0|1` (1: extended LBAs, the
//! metadata after each block's data; 0: a separate buffer), `pi=0|1|2|3` (end-to-end protection
//! type), `pil=0|1` (the PI in the first or last bytes of the metadata), `pif=0|2` (16- or
//! 64-bit guard), `detached=0|1` (1: allocated in the controller's NVM subsystem but attached
//! to no controller, for namespace attachment; every controller then gets an `nvme-subsys`).
//! Every malformed SPEC is refused before anything boots, with what to write.

use std::str::FromStr;

use anyhow::{bail, Result};

/// One namespace of each controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NsSpec {
    pub block_size: Option<u32>,
    pub size: Option<u64>,
    pub ms: u16,
    pub mset: bool,
    pub pi: u8,
    pub pil: bool,
    pub pif: u8,
    pub detached: bool,
}

const EXAMPLE: &str = "e.g. --ns bs=512,ms=8,pi=1 or --ns bs=4096,ms=64,mset=1,pi=3,size=256M";

impl FromStr for NsSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<NsSpec, String> {
        let mut ns = NsSpec {
            block_size: None,
            size: None,
            ms: 0,
            mset: false,
            pi: 0,
            pil: false,
            pif: 0,
            detached: false,
        };
        for pair in s.split(',').filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("--ns {s}: {pair:?} is not key=value ({EXAMPLE})"))?;
            let bad = |expected: &str| format!("--ns {s}: {key}={value}: expected {expected}");
            let flag = || match value {
                "0" => Ok(false),
                "1" => Ok(true),
                _ => Err(bad("0 or 1")),
            };
            match key {
                "bs" => {
                    ns.block_size = Some(match value {
                        "512" => 512,
                        "4096" | "4k" | "4K" => 4096,
                        _ => return Err(bad("512 or 4096")),
                    })
                }
                "size" => {
                    ns.size = Some(
                        super::run::parse_size(value).map_err(|_| bad("a size such as 256M"))?,
                    )
                }
                "ms" => {
                    ns.ms = match value {
                        "0" => 0,
                        "8" => 8,
                        "16" => 16,
                        "64" => 64,
                        _ => return Err(bad("0, 8, 16 or 64")),
                    }
                }
                "mset" => ns.mset = flag()?,
                "pi" => {
                    ns.pi = value
                        .parse()
                        .ok()
                        .filter(|p| *p <= 3)
                        .ok_or_else(|| bad("0, 1, 2 or 3"))?
                }
                "pil" => ns.pil = flag()?,
                "detached" => ns.detached = flag()?,
                "pif" => {
                    ns.pif = match value {
                        "0" => 0,
                        "2" => 2,
                        _ => return Err(bad("0 (16-bit guard) or 2 (64-bit guard)")),
                    }
                }
                _ => {
                    return Err(format!(
                    "--ns {s}: unknown key {key:?}: bs, size, ms, mset, pi, pil, pif, detached ({EXAMPLE})"
                ))
                }
            }
        }
        // the protection information is 8 bytes (16-bit guard) or 16 (64-bit), inside the metadata
        let pi_bytes = if ns.pif == 2 { 16 } else { 8 };
        if ns.pi > 0 && ns.ms < pi_bytes {
            return Err(format!(
                "--ns {s}: pi={} needs ms={pi_bytes} or more (the protection information lives in the metadata)",
                ns.pi
            ));
        }
        if ns.pi == 0 && (ns.pil || ns.pif != 0) {
            return Err(format!("--ns {s}: pil and pif need pi=1, 2 or 3"));
        }
        Ok(ns)
    }
}

impl NsSpec {
    /// `nvme-ns` properties beyond the drive, bus and NSID.
    pub fn qemu_props(&self, block_size: u32) -> String {
        let mut p = format!("logical_block_size={block_size},physical_block_size={block_size}");
        if self.ms > 0 {
            p += &format!(",ms={},mset={}", self.ms, u8::from(self.mset));
        }
        if self.pi > 0 {
            p += &format!(
                ",pi={},pil={},pif={}",
                self.pi,
                u8::from(self.pil),
                self.pif
            );
        }
        if self.detached {
            p += ",detached=on";
        }
        p
    }
}

/// The size of each of `specs` on a disk of `disk_size` bytes: its own, or an equal share of
/// what the others leave (whole MiB), a multiple of `block_size`.
pub fn sizes(
    specs: &[NsSpec],
    disk_size: u64,
    block_size: impl Fn(&NsSpec) -> u32,
) -> Result<Vec<u64>> {
    let fixed: u64 = specs.iter().filter_map(|s| s.size).sum();
    let open = specs.iter().filter(|s| s.size.is_none()).count() as u64;
    if fixed > disk_size || (open > 0 && disk_size - fixed < open << 20) {
        bail!(
            "--ns: the namespaces' sizes ({} MiB given) leave too little of --disk-size {} MiB for the others",
            fixed >> 20,
            disk_size >> 20
        );
    }
    let share = (disk_size - fixed).checked_div(open).unwrap_or(0) & !((1 << 20) - 1);
    specs
        .iter()
        .map(|s| {
            let size = s.size.unwrap_or(share);
            let bs = u64::from(block_size(s));
            if size == 0 || size % bs != 0 {
                bail!("--ns size={size}: a multiple of the {bs}-byte block size, above 0");
            }
            Ok(size)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_metadata_and_protection_as_qemu_names_them() {
        let ns: NsSpec = "bs=512,ms=8,pi=1".parse().expect("valid");
        assert_eq!(
            ns.qemu_props(512),
            "logical_block_size=512,physical_block_size=512,ms=8,mset=0,pi=1,pil=0,pif=0"
        );
        let big: NsSpec = "bs=4096,ms=64,mset=1,pi=3,pif=2,size=256M"
            .parse()
            .expect("valid");
        assert_eq!(big.size, Some(256 << 20));
        assert!(big
            .qemu_props(4096)
            .ends_with("ms=64,mset=1,pi=3,pil=0,pif=2"));
        let plain: NsSpec = "".parse().expect("all defaults");
        assert_eq!(
            plain.qemu_props(512),
            "logical_block_size=512,physical_block_size=512"
        );
    }

    #[test]
    fn refuses_what_qemu_or_the_spec_would_and_says_what_to_write() {
        let err = |s: &str| s.parse::<NsSpec>().expect_err(s);
        assert!(err("pi=1").contains("needs ms=8"));
        assert!(err("ms=8,pi=1,pif=2").contains("needs ms=16"));
        assert!(err("bs=1000").contains("512 or 4096"));
        assert!(err("ms=12").contains("0, 8, 16 or 64"));
        assert!(err("pil=1").contains("need pi=1, 2 or 3"));
        assert!(err("color=red").contains("unknown key"));
        assert!(err("bs").contains("not key=value"));
    }

    #[test]
    fn namespaces_without_a_size_share_what_the_others_leave() {
        let specs: Vec<NsSpec> = ["size=256M", "", ""]
            .iter()
            .map(|s| s.parse().expect("valid"))
            .collect();
        let got = sizes(&specs, 1 << 30, |_| 4096).expect("fits");
        assert_eq!(got, [256 << 20, 384 << 20, 384 << 20]);
        assert!(sizes(&specs, 256 << 20, |_| 512).is_err());
    }
}

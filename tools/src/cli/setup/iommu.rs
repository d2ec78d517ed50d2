//! Whether the IOMMU is on, and if not, which kernel argument turns it on on this CPU.

use std::fs;
use std::path::Path;

/// The IOMMU as sysfs and procfs show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IommuState {
    /// Entries of `/sys/kernel/iommu_groups`: none when the IOMMU is off.
    pub groups: usize,
    /// The IOMMU units of `/sys/class/iommu` (`dmar0`, `ivhd0`).
    pub units: Vec<String>,
    /// `GenuineIntel`, `AuthenticAMD`, ... from `/proc/cpuinfo`; empty if unknown.
    pub cpu_vendor: String,
    /// `/proc/cmdline`.
    pub cmdline: String,
}

impl IommuState {
    pub fn read(root: &Path) -> Self {
        let names = |dir: &str| -> Vec<String> {
            let mut names: Vec<String> = fs::read_dir(root.join(dir))
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                .collect();
            names.sort();
            names
        };
        let cpuinfo = fs::read_to_string(root.join("proc/cpuinfo")).unwrap_or_default();
        let cpu_vendor = cpuinfo
            .lines()
            .find_map(|line| {
                let (key, value) = line.split_once(':')?;
                (key.trim() == "vendor_id").then(|| value.trim().to_owned())
            })
            .unwrap_or_default();
        Self {
            groups: names("sys/kernel/iommu_groups").len(),
            units: names("sys/class/iommu"),
            cpu_vendor,
            cmdline: fs::read_to_string(root.join("proc/cmdline"))
                .unwrap_or_default()
                .trim()
                .to_owned(),
        }
    }

    /// VFIO needs IOMMU groups; the kernel creates them only with the IOMMU on.
    pub fn is_on(&self) -> bool {
        self.groups > 0
    }

    /// The kernel arguments that turn the IOMMU on for this CPU's vendor, quoted, and the
    /// firmware setting it also needs.
    fn enable(&self) -> (&'static str, &'static str) {
        match self.cpu_vendor.as_str() {
            "GenuineIntel" => ("`intel_iommu=on iommu=pt`", "VT-d"),
            "AuthenticAMD" | "HygonGenuine" => ("`amd_iommu=on iommu=pt`", "AMD-Vi (IOMMU)"),
            _ => (
                "`intel_iommu=on iommu=pt` (Intel) or `amd_iommu=on iommu=pt` (AMD)",
                "the IOMMU (VT-d / AMD-Vi)",
            ),
        }
    }

    /// The one-line error for an IOMMU that is off: what to add to the kernel command line, or,
    /// when it is there already, what to enable in the firmware.
    pub fn off_error(&self) -> String {
        let (args, firmware) = self.enable();
        let on_cmdline = ["intel_iommu=on", "amd_iommu=on"]
            .into_iter()
            .find(|arg| self.cmdline.split_whitespace().any(|w| w == *arg));
        let fix = match on_cmdline {
            Some(arg) => format!(
                "the kernel command line has {arg}, so enable {firmware} in the firmware (BIOS) setup"
            ),
            None => format!(
                "add {args} to the kernel command line (GRUB_CMDLINE_LINUX in /etc/default/grub, \
                 then update-grub), enable {firmware} in the firmware setup, and reboot"
            ),
        };
        format!(
            "the IOMMU is off (/sys/kernel/iommu_groups is empty) and VFIO needs it: {fix}; usnvme \
             does not use vfio's unsafe no-IOMMU mode (vfio.enable_unsafe_noiommu_mode=1)"
        )
    }

    /// For `setup status`: `on (dmar0, 24 groups)` or why it is off.
    pub fn describe(&self) -> String {
        if self.is_on() {
            let units = if self.units.is_empty() {
                String::new()
            } else {
                format!("{}, ", self.units.join(", "))
            };
            format!("on ({units}{} groups)", self.groups)
        } else {
            let (args, _) = self.enable();
            format!("off: add {args} to the kernel command line and reboot")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(vendor: &str, cmdline: &str, groups: usize) -> IommuState {
        IommuState {
            groups,
            units: Vec::new(),
            cpu_vendor: vendor.into(),
            cmdline: cmdline.into(),
        }
    }

    #[test]
    fn names_the_kernel_argument_for_the_cpu() {
        let intel = state("GenuineIntel", "ro quiet", 0).off_error();
        assert!(intel.contains("add `intel_iommu=on iommu=pt`"), "{intel}");
        assert!(
            intel.contains("vfio.enable_unsafe_noiommu_mode=1"),
            "{intel}"
        );
        let amd = state("AuthenticAMD", "ro", 0).off_error();
        assert!(
            amd.contains("add `amd_iommu=on iommu=pt`") && amd.contains("AMD-Vi"),
            "{amd}"
        );
        let other = state("", "", 0).off_error();
        assert!(
            other.contains("intel_iommu=on") && other.contains("amd_iommu=on"),
            "{other}"
        );
        // Asked for on the command line, yet off: the firmware is the culprit.
        let firmware = state("GenuineIntel", "ro intel_iommu=on", 0).off_error();
        assert!(
            firmware.contains("has intel_iommu=on, so enable VT-d in the firmware"),
            "{firmware}"
        );
        assert!(!firmware.contains("add `"), "{firmware}");
        assert_eq!(state("GenuineIntel", "", 3).describe(), "on (3 groups)");
    }
}

//! A device's PCI config space, read and written through VFIO, and the PCIe link status from
//! its PCI Express capability.

use std::os::unix::fs::FileExt;

use super::device::VfioPciDevice;
use super::{CAP_ID_EXP, PCI_CAP_PTR, PCI_STATUS, STATUS_CAP_LIST};

/// PCIe link status read from the device's own config space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PcieLink {
    /// Link speed in GT/s x10 (25 = 2.5 GT/s) and width in lanes, current and maximum.
    pub speed_gts_x10: u32,
    pub width: u32,
    pub max_speed_gts_x10: u32,
    pub max_width: u32,
}

impl std::fmt::Display for PcieLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let gts = |x10: u32| {
            if x10.is_multiple_of(10) {
                format!("{}", x10 / 10)
            } else {
                format!("{}.{}", x10 / 10, x10 % 10)
            }
        };
        write!(f, "{} GT/s x{}", gts(self.speed_gts_x10), self.width)?;
        if (self.speed_gts_x10, self.width) != (self.max_speed_gts_x10, self.max_width) {
            write!(
                f,
                " (max {} GT/s x{})",
                gts(self.max_speed_gts_x10),
                self.max_width
            )?;
        }
        Ok(())
    }
}

impl VfioPciDevice {
    /// Reads config space into `buf` (all ones once the device is given back).
    fn config_read(&self, buf: &mut [u8], offset: u64) {
        let read = match &*self.shared.open.lock() {
            Some(open) => open.device.read_exact_at(buf, open.config + offset),
            None => Err(std::io::ErrorKind::NotConnected.into()),
        };
        if read.is_err() {
            buf.fill(0xff); // as a removed device reads
        }
    }

    pub fn config_read8(&self, offset: u64) -> u8 {
        let mut b = [0u8; 1];
        self.config_read(&mut b, offset);
        b[0]
    }

    pub fn config_read16(&self, offset: u64) -> u16 {
        let mut b = [0u8; 2];
        self.config_read(&mut b, offset);
        u16::from_le_bytes(b)
    }

    pub fn config_write16(&self, offset: u64, value: u16) {
        if let Some(open) = &*self.shared.open.lock() {
            if let Err(e) = open
                .device
                .write_all_at(&value.to_le_bytes(), open.config + offset)
            {
                log::warn!("{}: config space write at {offset:#x}: {e}", self.addr);
            }
        }
    }

    fn config_read32(&self, offset: u64) -> u32 {
        let mut b = [0u8; 4];
        self.config_read(&mut b, offset);
        u32::from_le_bytes(b)
    }

    /// The PCIe link from the PCI Express capability (Link Capabilities / Link Status).
    pub fn pcie_link(&self) -> Option<PcieLink> {
        if self.config_read16(PCI_STATUS) & STATUS_CAP_LIST == 0 {
            return None;
        }
        let mut ptr = self.config_read8(PCI_CAP_PTR) & !3;
        for _ in 0..48 {
            if ptr < 0x40 {
                return None;
            }
            if self.config_read8(ptr as u64) == CAP_ID_EXP {
                let caps = self.config_read32(ptr as u64 + 0x0c);
                let status = self.config_read16(ptr as u64 + 0x12);
                return Some(PcieLink {
                    speed_gts_x10: speed_x10(status as u32 & 0xf),
                    width: (status as u32 >> 4) & 0x3f,
                    max_speed_gts_x10: speed_x10(caps & 0xf),
                    max_width: (caps >> 4) & 0x3f,
                });
            }
            ptr = self.config_read8(ptr as u64 + 1) & !3;
        }
        None
    }
}

/// Link speed encoding (Link Capabilities / Status) to GT/s x10.
fn speed_x10(code: u32) -> u32 {
    match code {
        1 => 25,
        2 => 50,
        3 => 80,
        4 => 160,
        5 => 320,
        6 => 640,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_reads_like_lspci() {
        let gen5 = PcieLink {
            speed_gts_x10: 320,
            width: 4,
            max_speed_gts_x10: 320,
            max_width: 4,
        };
        assert_eq!(gen5.to_string(), "32 GT/s x4");
        let slow = PcieLink {
            speed_gts_x10: 25,
            width: 1,
            max_speed_gts_x10: 80,
            max_width: 4,
        };
        assert_eq!(slow.to_string(), "2.5 GT/s x1 (max 8 GT/s x4)");
        assert_eq!(speed_x10(4), 160);
    }
}

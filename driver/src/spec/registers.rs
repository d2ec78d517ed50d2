//! Controller registers in BAR0 (NVMe Base 2.0, section 3.1.4) and typed views of their fields.

use core::fmt;

/// Register offsets in BAR0.
pub mod reg {
    pub const CAP: usize = 0x00; // Controller Capabilities (64 bit)
    pub const VS: usize = 0x08; // Version
    pub const INTMS: usize = 0x0c; // Interrupt Mask Set
    pub const INTMC: usize = 0x10; // Interrupt Mask Clear
    pub const CC: usize = 0x14; // Controller Configuration
    pub const CSTS: usize = 0x1c; // Controller Status
    pub const NSSR: usize = 0x20; // NVM Subsystem Reset
    pub const AQA: usize = 0x24; // Admin Queue Attributes
    pub const ASQ: usize = 0x28; // Admin Submission Queue Base Address (64 bit)
    pub const ACQ: usize = 0x30; // Admin Completion Queue Base Address (64 bit)
    pub const CMBLOC: usize = 0x38; // Controller Memory Buffer Location
    pub const CMBSZ: usize = 0x3c; // Controller Memory Buffer Size
    pub const CRTO: usize = 0x68; // Controller Ready Timeouts
    pub const DOORBELLS: usize = 0x1000; // SQ 0 tail doorbell; see sq_tail_doorbell()
}

/// Value written to NSSR to start an NVM subsystem reset ("NVMe" in ASCII).
pub const NSSR_RESET: u32 = 0x4e56_4d65;

const fn field64(value: u64, shift: u32, width: u32) -> u64 {
    (value >> shift) & ((1 << width) - 1)
}

const fn field32(value: u32, shift: u32, width: u32) -> u32 {
    (value >> shift) & ((1 << width) - 1)
}

const fn set32(value: u32, shift: u32, width: u32, field: u32) -> u32 {
    let mask = ((1 << width) - 1) << shift;
    (value & !mask) | ((field << shift) & mask)
}

/// Byte offset in BAR0 of the Submission Queue `qid` Tail doorbell; `dstrd` is CAP.DSTRD.
///
/// The shadow doorbell and EventIdx buffers of Doorbell Buffer Config use the same layout,
/// relative to their base: subtract [`reg::DOORBELLS`].
pub const fn sq_tail_doorbell(qid: u16, dstrd: u8) -> usize {
    reg::DOORBELLS + (2 * qid as usize) * (4 << dstrd)
}

/// Byte offset in BAR0 of the Completion Queue `qid` Head doorbell; `dstrd` is CAP.DSTRD.
pub const fn cq_head_doorbell(qid: u16, dstrd: u8) -> usize {
    reg::DOORBELLS + (2 * qid as usize + 1) * (4 << dstrd)
}

/// Controller Capabilities (CAP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cap(pub u64);

impl Cap {
    /// Maximum Queue Entries Supported, 0's based as in the specification.
    pub const fn mqes(self) -> u16 {
        field64(self.0, 0, 16) as u16
    }

    /// The largest number of entries an I/O queue may have (MQES + 1).
    pub const fn max_queue_entries(self) -> u32 {
        self.mqes() as u32 + 1
    }

    /// Contiguous Queues Required.
    pub const fn cqr(self) -> bool {
        field64(self.0, 16, 1) != 0
    }

    /// Arbitration Mechanism Supported: bit 0 weighted round robin with urgent priority class,
    /// bit 1 vendor specific.
    pub const fn ams(self) -> u8 {
        field64(self.0, 17, 2) as u8
    }

    /// Timeout, in 500 ms units, for CSTS.RDY to follow CC.EN.
    pub const fn to(self) -> u8 {
        field64(self.0, 24, 8) as u8
    }

    /// Timeout for CSTS.RDY to follow CC.EN, in milliseconds.
    pub const fn to_ms(self) -> u64 {
        self.to() as u64 * 500
    }

    /// Doorbell Stride: doorbells are `4 << dstrd` bytes apart.
    pub const fn dstrd(self) -> u8 {
        field64(self.0, 32, 4) as u8
    }

    /// Distance between doorbells in bytes.
    pub const fn doorbell_stride(self) -> usize {
        4 << self.dstrd()
    }

    /// NVM Subsystem Reset Supported.
    pub const fn nssrs(self) -> bool {
        field64(self.0, 36, 1) != 0
    }

    /// Command Sets Supported, the raw 8-bit field.
    pub const fn css(self) -> u8 {
        field64(self.0, 37, 8) as u8
    }

    /// The NVM command set is supported (CSS bit 0).
    pub const fn css_nvm(self) -> bool {
        self.css() & 0x01 != 0
    }

    /// One or more I/O command sets are supported and selectable with CC.CSS = 110b (bit 6).
    pub const fn css_io_command_sets(self) -> bool {
        self.css() & 0x40 != 0
    }

    /// Only the Admin command set is supported (CSS bit 7), or CC.CSS = 111b is allowed.
    pub const fn css_admin_only(self) -> bool {
        self.css() & 0x80 != 0
    }

    /// Boot Partition Support.
    pub const fn bps(self) -> bool {
        field64(self.0, 45, 1) != 0
    }

    /// Memory Page Size Minimum: the smallest page is `2 ^ (12 + mpsmin)` bytes.
    pub const fn mpsmin(self) -> u8 {
        field64(self.0, 48, 4) as u8
    }

    /// Memory Page Size Maximum: the largest page is `2 ^ (12 + mpsmax)` bytes.
    pub const fn mpsmax(self) -> u8 {
        field64(self.0, 52, 4) as u8
    }

    /// The smallest memory page size the controller supports, in bytes.
    pub const fn min_page_size(self) -> u64 {
        1 << (12 + self.mpsmin())
    }

    /// The largest memory page size the controller supports, in bytes.
    pub const fn max_page_size(self) -> u64 {
        1 << (12 + self.mpsmax())
    }

    /// Persistent Memory Region Supported.
    pub const fn pmrs(self) -> bool {
        field64(self.0, 56, 1) != 0
    }

    /// Controller Memory Buffer Supported.
    pub const fn cmbs(self) -> bool {
        field64(self.0, 57, 1) != 0
    }

    /// Controller Ready Modes Supported: bit 0 with media (CRWMS), bit 1 independent of media
    /// (CRIMS).
    pub const fn crms(self) -> u8 {
        field64(self.0, 59, 2) as u8
    }
}

/// Controller Configuration (CC), built with `with_*` and read back by the field getters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cc(pub u32);

impl Cc {
    /// CC.CSS: the NVM command set.
    pub const CSS_NVM: u8 = 0b000;
    /// CC.CSS: all I/O command sets that CAP.CSS reports.
    pub const CSS_ALL_IO: u8 = 0b110;
    /// CC.CSS: Admin command set only.
    pub const CSS_ADMIN_ONLY: u8 = 0b111;
    /// CC.AMS: round robin.
    pub const AMS_ROUND_ROBIN: u8 = 0b000;
    /// CC.AMS: weighted round robin with urgent priority class.
    pub const AMS_WEIGHTED_ROUND_ROBIN: u8 = 0b001;
    /// CC.SHN: no notification.
    pub const SHN_NONE: u8 = 0b00;
    /// CC.SHN: normal shutdown notification.
    pub const SHN_NORMAL: u8 = 0b01;
    /// CC.SHN: abrupt shutdown notification.
    pub const SHN_ABRUPT: u8 = 0b10;

    /// All fields zero: disabled, NVM command set, 4 KiB pages, round robin.
    pub const fn new() -> Cc {
        Cc(0)
    }

    /// Enable (EN).
    pub const fn with_en(self, en: bool) -> Cc {
        Cc(set32(self.0, 0, 1, en as u32))
    }

    /// I/O Command Set Selected (CSS, one of the `CSS_*` values).
    pub const fn with_css(self, css: u8) -> Cc {
        Cc(set32(self.0, 4, 3, css as u32))
    }

    /// Memory Page Size: the host page size is `2 ^ (12 + mps)` bytes.
    pub const fn with_mps(self, mps: u8) -> Cc {
        Cc(set32(self.0, 7, 4, mps as u32))
    }

    /// Arbitration Mechanism Selected (one of the `AMS_*` values).
    pub const fn with_ams(self, ams: u8) -> Cc {
        Cc(set32(self.0, 11, 3, ams as u32))
    }

    /// Shutdown Notification (one of the `SHN_*` values).
    pub const fn with_shn(self, shn: u8) -> Cc {
        Cc(set32(self.0, 14, 2, shn as u32))
    }

    /// I/O Submission Queue Entry Size, log2 of bytes (6 for 64-byte entries).
    pub const fn with_iosqes(self, iosqes: u8) -> Cc {
        Cc(set32(self.0, 16, 4, iosqes as u32))
    }

    /// I/O Completion Queue Entry Size, log2 of bytes (4 for 16-byte entries).
    pub const fn with_iocqes(self, iocqes: u8) -> Cc {
        Cc(set32(self.0, 20, 4, iocqes as u32))
    }

    /// Enable.
    pub const fn en(self) -> bool {
        field32(self.0, 0, 1) != 0
    }

    /// I/O Command Set Selected.
    pub const fn css(self) -> u8 {
        field32(self.0, 4, 3) as u8
    }

    /// Memory Page Size (log2 of bytes, minus 12).
    pub const fn mps(self) -> u8 {
        field32(self.0, 7, 4) as u8
    }

    /// The host memory page size in bytes.
    pub const fn page_size(self) -> u64 {
        1 << (12 + self.mps())
    }

    /// Arbitration Mechanism Selected.
    pub const fn ams(self) -> u8 {
        field32(self.0, 11, 3) as u8
    }

    /// Shutdown Notification.
    pub const fn shn(self) -> u8 {
        field32(self.0, 14, 2) as u8
    }

    /// I/O Submission Queue Entry Size (log2 of bytes).
    pub const fn iosqes(self) -> u8 {
        field32(self.0, 16, 4) as u8
    }

    /// I/O Completion Queue Entry Size (log2 of bytes).
    pub const fn iocqes(self) -> u8 {
        field32(self.0, 20, 4) as u8
    }
}

/// CSTS.SHST: where a shutdown stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownStatus {
    /// Normal operation, no shutdown requested.
    Normal,
    /// Shutdown processing occurring.
    Occurring,
    /// Shutdown processing complete.
    Complete,
    /// The reserved value 11b.
    Reserved,
}

/// Controller Status (CSTS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Csts(pub u32);

impl Csts {
    /// The device is gone: a removed PCIe function reads all ones.
    pub const fn removed(self) -> bool {
        self.0 == u32::MAX
    }

    /// Ready.
    pub const fn rdy(self) -> bool {
        field32(self.0, 0, 1) != 0
    }

    /// Controller Fatal Status.
    pub const fn cfs(self) -> bool {
        field32(self.0, 1, 1) != 0
    }

    /// Shutdown Status.
    pub const fn shst(self) -> ShutdownStatus {
        match field32(self.0, 2, 2) {
            0 => ShutdownStatus::Normal,
            1 => ShutdownStatus::Occurring,
            2 => ShutdownStatus::Complete,
            _ => ShutdownStatus::Reserved,
        }
    }

    /// NVM Subsystem Reset Occurred.
    pub const fn nssro(self) -> bool {
        field32(self.0, 4, 1) != 0
    }

    /// Processing Paused.
    pub const fn pp(self) -> bool {
        field32(self.0, 5, 1) != 0
    }

    /// Sets Ready (for a software controller).
    pub const fn with_rdy(self, rdy: bool) -> Csts {
        Csts(set32(self.0, 0, 1, rdy as u32))
    }

    /// Sets Controller Fatal Status.
    pub const fn with_cfs(self, cfs: bool) -> Csts {
        Csts(set32(self.0, 1, 1, cfs as u32))
    }

    /// Sets Shutdown Status.
    pub const fn with_shst(self, shst: ShutdownStatus) -> Csts {
        let value = match shst {
            ShutdownStatus::Normal => 0,
            ShutdownStatus::Occurring => 1,
            ShutdownStatus::Complete => 2,
            ShutdownStatus::Reserved => 3,
        };
        Csts(set32(self.0, 2, 2, value))
    }
}

/// Version (VS); also the VER field of Identify Controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Vs(pub u32);

impl Vs {
    /// Encodes a version.
    pub const fn new(major: u16, minor: u8, tertiary: u8) -> Vs {
        Vs(((major as u32) << 16) | ((minor as u32) << 8) | tertiary as u32)
    }

    /// Major Version Number.
    pub const fn major(self) -> u16 {
        (self.0 >> 16) as u16
    }

    /// Minor Version Number.
    pub const fn minor(self) -> u8 {
        (self.0 >> 8) as u8
    }

    /// Tertiary Version Number.
    pub const fn tertiary(self) -> u8 {
        self.0 as u8
    }
}

impl fmt::Display for Vs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major(), self.minor(), self.tertiary())
    }
}

/// Admin Queue Attributes (AQA): admin queue sizes, stored 0's based.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Aqa(pub u32);

impl Aqa {
    /// Largest admin queue, in entries.
    pub const MAX_ENTRIES: u16 = 4096;

    /// Encodes admin queue sizes given in entries (2 ..= 4096 each).
    pub const fn new(sq_entries: u16, cq_entries: u16) -> Aqa {
        let asqs = sq_entries.saturating_sub(1) as u32 & 0xfff;
        let acqs = cq_entries.saturating_sub(1) as u32 & 0xfff;
        Aqa((acqs << 16) | asqs)
    }

    /// Admin Submission Queue size in entries.
    pub const fn sq_entries(self) -> u16 {
        field32(self.0, 0, 12) as u16 + 1
    }

    /// Admin Completion Queue size in entries.
    pub const fn cq_entries(self) -> u16 {
        field32(self.0, 16, 12) as u16 + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CAP of a QEMU 8.x `-device nvme` without subsystem: MQES 0x7ff, CQR, TO 15, CSS NVM +
    /// I/O command sets + admin only, MPSMAX 4, CRMS 11b.
    const QEMU_CAP: u64 = 0x1840_1820_0f01_07ff;

    #[test]
    fn cap_decodes_qemu_value() {
        let cap = Cap(QEMU_CAP);
        assert_eq!(cap.mqes(), 2047);
        assert_eq!(cap.max_queue_entries(), 2048);
        assert!(cap.cqr());
        assert_eq!(cap.ams(), 0);
        assert_eq!(cap.to(), 15);
        assert_eq!(cap.to_ms(), 7500);
        assert_eq!(cap.dstrd(), 0);
        assert_eq!(cap.doorbell_stride(), 4);
        assert!(!cap.nssrs());
        assert!(cap.css_nvm() && cap.css_io_command_sets() && cap.css_admin_only());
        assert!(!cap.bps() && !cap.pmrs() && !cap.cmbs());
        assert_eq!(cap.mpsmin(), 0);
        assert_eq!(cap.min_page_size(), 4096);
        assert_eq!(cap.mpsmax(), 4);
        assert_eq!(cap.max_page_size(), 65536);
        assert_eq!(cap.crms(), 0b11);
    }

    #[test]
    fn cc_builder_round_trips() {
        let cc = Cc::new()
            .with_en(true)
            .with_css(Cc::CSS_NVM)
            .with_mps(0)
            .with_ams(Cc::AMS_ROUND_ROBIN)
            .with_iosqes(6)
            .with_iocqes(4);
        assert_eq!(cc.0, 0x0046_0001);
        assert!(cc.en());
        assert_eq!(cc.page_size(), 4096);
        let cc = cc
            .with_shn(Cc::SHN_NORMAL)
            .with_css(Cc::CSS_ALL_IO)
            .with_mps(4);
        assert_eq!(
            (cc.shn(), cc.css(), cc.mps(), cc.iosqes(), cc.iocqes()),
            (1, 6, 4, 6, 4)
        );
        assert_eq!(cc.with_en(false).0 & 1, 0);
    }

    #[test]
    fn csts_fields() {
        let csts = Csts(0b1_0101);
        assert!(csts.rdy() && !csts.cfs() && csts.nssro() && !csts.pp());
        assert_eq!(csts.shst(), ShutdownStatus::Occurring);
        assert_eq!(Csts(0x8).shst(), ShutdownStatus::Complete);
        let built = Csts::default()
            .with_rdy(true)
            .with_shst(ShutdownStatus::Complete);
        assert_eq!(built.0, 0b1001);
        assert!(built.with_cfs(true).cfs());
    }

    #[test]
    fn version_and_aqa() {
        assert_eq!(Vs(0x0001_0400).to_string(), "1.4.0");
        assert_eq!(Vs::new(2, 0, 1).to_string(), "2.0.1");
        assert!(Vs::new(1, 4, 0) < Vs::new(2, 0, 0));
        let aqa = Aqa::new(32, 64);
        assert_eq!(aqa.0, 0x003f_001f);
        assert_eq!((aqa.sq_entries(), aqa.cq_entries()), (32, 64));
        assert_eq!(Aqa::new(4096, 4096).cq_entries(), 4096);
    }

    #[test]
    fn doorbell_offsets() {
        assert_eq!(sq_tail_doorbell(0, 0), 0x1000);
        assert_eq!(cq_head_doorbell(0, 0), 0x1004);
        assert_eq!(sq_tail_doorbell(1, 0), 0x1008);
        assert_eq!(cq_head_doorbell(1, 0), 0x100c);
        assert_eq!(sq_tail_doorbell(1, 1), 0x1010);
        assert_eq!(cq_head_doorbell(1, 1), 0x1018);
        assert_eq!(cq_head_doorbell(u16::MAX, 15), 0x1000 + 131_071 * (4 << 15));
    }
}

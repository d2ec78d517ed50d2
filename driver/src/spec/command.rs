//! Submission queue entries (NVMe Base 2.0, section 4.2) and builders for the commands the
//! driver sends. Builders leave the command identifier and data pointer at zero: the queue pair
//! fills them in when it submits (except where the address is a command parameter, as for queue
//! creation).

use core::mem::offset_of;
use zerocopy::{FromBytes, Immutable, IntoBytes};

use super::log::LogPageId;

spec_enum! {
    /// Admin command opcodes (NVMe Base 2.0, figure 138).
    pub enum AdminOpcode: u8 {
        DeleteIoSq = 0x00 => "Delete I/O Submission Queue",
        CreateIoSq = 0x01 => "Create I/O Submission Queue",
        GetLogPage = 0x02 => "Get Log Page",
        DeleteIoCq = 0x04 => "Delete I/O Completion Queue",
        CreateIoCq = 0x05 => "Create I/O Completion Queue",
        Identify = 0x06 => "Identify",
        Abort = 0x08 => "Abort",
        SetFeatures = 0x09 => "Set Features",
        GetFeatures = 0x0a => "Get Features",
        AsyncEventRequest = 0x0c => "Asynchronous Event Request",
        NamespaceManagement = 0x0d => "Namespace Management",
        FirmwareCommit = 0x10 => "Firmware Commit",
        FirmwareDownload = 0x11 => "Firmware Image Download",
        DeviceSelfTest = 0x14 => "Device Self-test",
        NamespaceAttachment = 0x15 => "Namespace Attachment",
        KeepAlive = 0x18 => "Keep Alive",
        DirectiveSend = 0x19 => "Directive Send",
        DirectiveReceive = 0x1a => "Directive Receive",
        VirtualizationManagement = 0x1c => "Virtualization Management",
        NvmeMiSend = 0x1d => "NVMe-MI Send",
        NvmeMiReceive = 0x1e => "NVMe-MI Receive",
        CapacityManagement = 0x20 => "Capacity Management",
        Lockdown = 0x24 => "Lockdown",
        DoorbellBufferConfig = 0x7c => "Doorbell Buffer Config",
        FabricsCommands = 0x7f => "Fabrics Commands",
        FormatNvm = 0x80 => "Format NVM",
        SecuritySend = 0x81 => "Security Send",
        SecurityReceive = 0x82 => "Security Receive",
        Sanitize = 0x84 => "Sanitize",
        GetLbaStatus = 0x86 => "Get LBA Status",
    }
}

spec_enum! {
    /// NVM command set I/O opcodes (NVM Command Set 1.0, figure 18).
    pub enum IoOpcode: u8 {
        Flush = 0x00 => "Flush",
        Write = 0x01 => "Write",
        Read = 0x02 => "Read",
        WriteUncorrectable = 0x04 => "Write Uncorrectable",
        Compare = 0x05 => "Compare",
        WriteZeroes = 0x08 => "Write Zeroes",
        DatasetManagement = 0x09 => "Dataset Management",
        Verify = 0x0c => "Verify",
        ReservationRegister = 0x0d => "Reservation Register",
        ReservationReport = 0x0e => "Reservation Report",
        ReservationAcquire = 0x11 => "Reservation Acquire",
        ReservationRelease = 0x15 => "Reservation Release",
        Copy = 0x19 => "Copy",
    }
}

spec_enum! {
    /// Controller or Namespace Structure (CNS) values of Identify.
    pub enum Cns: u8 {
        Namespace = 0x00 => "Identify Namespace",
        Controller = 0x01 => "Identify Controller",
        ActiveNamespaceList = 0x02 => "Active Namespace ID list",
        NamespaceDescriptorList = 0x03 => "Namespace Identification Descriptor list",
        NvmNamespace = 0x05 => "I/O Command Set specific Identify Namespace (NVM)",
        AllocatedNamespaceList = 0x10 => "Allocated Namespace ID list",
        AllocatedNamespace = 0x11 => "Identify Namespace of an allocated namespace",
        NamespaceControllerList = 0x12 => "Controller list attached to a namespace",
        ControllerList = 0x13 => "Controller list of the subsystem",
    }
}

spec_enum! {
    /// Feature Identifiers of Get/Set Features (NVMe Base 2.0, figure 317).
    pub enum FeatureId: u8 {
        Arbitration = 0x01 => "Arbitration",
        PowerManagement = 0x02 => "Power Management",
        LbaRangeType = 0x03 => "LBA Range Type",
        TemperatureThreshold = 0x04 => "Temperature Threshold",
        ErrorRecovery = 0x05 => "Error Recovery",
        VolatileWriteCache = 0x06 => "Volatile Write Cache",
        NumberOfQueues = 0x07 => "Number of Queues",
        InterruptCoalescing = 0x08 => "Interrupt Coalescing",
        InterruptVectorConfiguration = 0x09 => "Interrupt Vector Configuration",
        WriteAtomicityNormal = 0x0a => "Write Atomicity Normal",
        AsyncEventConfiguration = 0x0b => "Asynchronous Event Configuration",
        AutonomousPowerStateTransition = 0x0c => "Autonomous Power State Transition",
        HostMemoryBuffer = 0x0d => "Host Memory Buffer",
        Timestamp = 0x0e => "Timestamp",
        KeepAliveTimer = 0x0f => "Keep Alive Timer",
    }
}

/// Select (SEL) of Get Features: which value to return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FeatureSelect {
    /// The current value.
    Current = 0,
    /// The default value.
    Default = 1,
    /// The saved value.
    Saved = 2,
    /// Whether the feature is saveable, namespace specific and changeable.
    SupportedCapabilities = 3,
}

/// Queue Priority of Create I/O Submission Queue (used with weighted round robin arbitration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum QueuePriority {
    /// Urgent.
    Urgent = 0,
    /// High.
    High = 1,
    /// Medium.
    Medium = 2,
    /// Low.
    Low = 3,
}

/// Which way a command moves data, from the two low bits of its opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataTransfer {
    /// No data.
    None,
    /// Host to controller (a write).
    HostToController,
    /// Controller to host (a read).
    ControllerToHost,
    /// Both directions.
    Bidirectional,
}

impl DataTransfer {
    /// The direction that `opcode` implies (admin and NVM I/O opcodes alike).
    pub const fn of(opcode: u8) -> DataTransfer {
        match opcode & 3 {
            0 => DataTransfer::None,
            1 => DataTransfer::HostToController,
            2 => DataTransfer::ControllerToHost,
            _ => DataTransfer::Bidirectional,
        }
    }
}

/// CDW0.PSDT: PRPs are used for the data transfer.
pub const PSDT_PRP: u8 = 0b00;
/// CDW0.PSDT: SGLs are used; MPTR is the address of a contiguous metadata buffer.
pub const PSDT_SGL: u8 = 0b01;
/// CDW0.PSDT: SGLs are used; MPTR is the address of an SGL segment for the metadata.
pub const PSDT_SGL_METADATA_SGL: u8 = 0b10;

/// CDW0.FUSE: the first command of a fused operation.
pub const FUSE_FIRST: u8 = 0b01;
/// CDW0.FUSE: the second command of a fused operation.
pub const FUSE_SECOND: u8 = 0b10;

/// CDW12 bit of Read, Write, Compare and Write Zeroes: Force Unit Access.
pub const CDW12_FUA: u32 = 1 << 30;
/// CDW12 bit of Write Zeroes: deallocate the blocks (DEAC).
pub const CDW12_DEAC: u32 = 1 << 25;
/// CDW11 of Dataset Management: Attribute – Deallocate (AD).
pub const DSM_DEALLOCATE: u32 = 1 << 2;
/// Blocks one I/O command carries at most: its NLB (CDW12 bits 15:0) counts them less one.
pub const MAX_BLOCKS_PER_COMMAND: u64 = 1 << 16;

/// A 64-byte submission queue entry.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, FromBytes, IntoBytes, Immutable)]
pub struct Sqe {
    /// Command Dword 0: opcode (7:0), FUSE (9:8), PSDT (15:14), command identifier (31:16).
    pub cdw0: u32,
    /// Namespace Identifier.
    pub nsid: u32,
    /// Command Dword 2 (command specific).
    pub cdw2: u32,
    /// Command Dword 3 (command specific).
    pub cdw3: u32,
    /// Metadata Pointer.
    pub mptr: u64,
    /// Data Pointer, first half: PRP Entry 1, or bytes 0..8 of an SGL descriptor.
    pub prp1: u64,
    /// Data Pointer, second half: PRP Entry 2, or bytes 8..16 of an SGL descriptor.
    pub prp2: u64,
    /// Command Dword 10.
    pub cdw10: u32,
    /// Command Dword 11.
    pub cdw11: u32,
    /// Command Dword 12.
    pub cdw12: u32,
    /// Command Dword 13.
    pub cdw13: u32,
    /// Command Dword 14.
    pub cdw14: u32,
    /// Command Dword 15.
    pub cdw15: u32,
}

const _: () = {
    assert!(offset_of!(Sqe, nsid) == 4);
    assert!(offset_of!(Sqe, mptr) == 16);
    assert!(offset_of!(Sqe, prp1) == 24);
    assert!(offset_of!(Sqe, prp2) == 32);
    assert!(offset_of!(Sqe, cdw10) == 40);
    assert!(offset_of!(Sqe, cdw15) == 60);
};

/// Encodes a 1-based count (of entries, blocks, ranges) into its 0's based field.
const fn zero_based(count: u32) -> u32 {
    count.saturating_sub(1)
}

impl Sqe {
    /// An entry with only the opcode set.
    pub const fn new(opcode: u8) -> Sqe {
        Sqe {
            cdw0: opcode as u32,
            nsid: 0,
            cdw2: 0,
            cdw3: 0,
            mptr: 0,
            prp1: 0,
            prp2: 0,
            cdw10: 0,
            cdw11: 0,
            cdw12: 0,
            cdw13: 0,
            cdw14: 0,
            cdw15: 0,
        }
    }

    /// Opcode.
    pub const fn opcode(&self) -> u8 {
        self.cdw0 as u8
    }

    /// Fused Operation.
    pub const fn fuse(&self) -> u8 {
        ((self.cdw0 >> 8) & 3) as u8
    }

    /// PRP or SGL for Data Transfer.
    pub const fn psdt(&self) -> u8 {
        ((self.cdw0 >> 14) & 3) as u8
    }

    /// Command Identifier.
    pub const fn cid(&self) -> u16 {
        (self.cdw0 >> 16) as u16
    }

    /// Sets the Command Identifier.
    pub fn set_cid(&mut self, cid: u16) {
        self.cdw0 = (self.cdw0 & 0xffff) | ((cid as u32) << 16);
    }

    /// Sets the Fused Operation field.
    pub fn set_fuse(&mut self, fuse: u8) {
        self.cdw0 = (self.cdw0 & !(3 << 8)) | (((fuse & 3) as u32) << 8);
    }

    /// Sets PRP or SGL for Data Transfer.
    pub fn set_psdt(&mut self, psdt: u8) {
        self.cdw0 = (self.cdw0 & !(3 << 14)) | (((psdt & 3) as u32) << 14);
    }

    /// Puts an SGL descriptor in the data pointer and selects SGLs (PSDT 01b).
    pub fn set_sgl(&mut self, sgl: SglDescriptor) {
        [self.prp1, self.prp2] = sgl.to_dwords();
        self.set_psdt(PSDT_SGL);
    }

    /// The data pointer read as an SGL descriptor.
    pub const fn sgl(&self) -> SglDescriptor {
        SglDescriptor::from_dwords([self.prp1, self.prp2])
    }

    /// Starting LBA of an NVM I/O command (CDW10, CDW11).
    pub const fn slba(&self) -> u64 {
        ((self.cdw11 as u64) << 32) | self.cdw10 as u64
    }

    /// Number of logical blocks of an NVM I/O command (CDW12 NLB + 1).
    pub const fn blocks(&self) -> u32 {
        (self.cdw12 & 0xffff) + 1
    }

    /// Identify: `nsid` is the namespace for [`Cns::Namespace`], or the ID after which the
    /// [`Cns::ActiveNamespaceList`] starts; the data is one 4 KiB page.
    pub const fn identify(cns: Cns, nsid: u32) -> Sqe {
        let mut sqe = Sqe::new(AdminOpcode::Identify as u8);
        sqe.nsid = nsid;
        sqe.cdw10 = cns as u32;
        sqe
    }

    /// Create I/O Completion Queue of `entries` entries (2 ..= 65536) at `iova`, physically
    /// contiguous, interrupts disabled (polled).
    pub const fn create_io_cq(qid: u16, entries: u32, iova: u64) -> Sqe {
        let mut sqe = Sqe::new(AdminOpcode::CreateIoCq as u8);
        sqe.prp1 = iova;
        sqe.cdw10 = (zero_based(entries) << 16) | qid as u32;
        sqe.cdw11 = 1; // PC = 1, IEN = 0, IV = 0
        sqe
    }

    /// Create I/O Completion Queue as [`Sqe::create_io_cq`], with interrupts enabled on MSI-X
    /// vector `vector` where one is given (IEN = 1, IV = `vector`), else polled.
    pub const fn create_io_cq_with(qid: u16, entries: u32, iova: u64, vector: Option<u16>) -> Sqe {
        let mut sqe = Sqe::create_io_cq(qid, entries, iova);
        if let Some(iv) = vector {
            sqe.cdw11 |= 1 << 1 | (iv as u32) << 16;
        }
        sqe
    }

    /// Create I/O Submission Queue of `entries` entries (2 ..= 65536) at `iova`, physically
    /// contiguous, completing into `cqid`.
    pub const fn create_io_sq(
        qid: u16,
        entries: u32,
        iova: u64,
        cqid: u16,
        priority: QueuePriority,
    ) -> Sqe {
        let mut sqe = Sqe::new(AdminOpcode::CreateIoSq as u8);
        sqe.prp1 = iova;
        sqe.cdw10 = (zero_based(entries) << 16) | qid as u32;
        sqe.cdw11 = ((cqid as u32) << 16) | ((priority as u32) << 1) | 1; // PC = 1
        sqe
    }

    /// Delete I/O Submission Queue.
    pub const fn delete_io_sq(qid: u16) -> Sqe {
        let mut sqe = Sqe::new(AdminOpcode::DeleteIoSq as u8);
        sqe.cdw10 = qid as u32;
        sqe
    }

    /// Delete I/O Completion Queue.
    pub const fn delete_io_cq(qid: u16) -> Sqe {
        let mut sqe = Sqe::new(AdminOpcode::DeleteIoCq as u8);
        sqe.cdw10 = qid as u32;
        sqe
    }

    /// Set Features with the feature's CDW11 value (not saved across resets).
    pub const fn set_features(fid: FeatureId, cdw11: u32) -> Sqe {
        let mut sqe = Sqe::new(AdminOpcode::SetFeatures as u8);
        sqe.cdw10 = fid as u32;
        sqe.cdw11 = cdw11;
        sqe
    }

    /// Set Features – Number of Queues: request `sq` I/O submission and `cq` I/O completion
    /// queues (1 ..= 65535 each). Decode the answer with [`num_queues_allocated`].
    pub const fn set_num_queues(sq: u32, cq: u32) -> Sqe {
        Sqe::set_features(
            FeatureId::NumberOfQueues,
            (zero_based(cq) << 16) | (zero_based(sq) & 0xffff),
        )
    }

    /// Get Features; the value comes back in the CQE's DW0.
    pub const fn get_features(fid: FeatureId, select: FeatureSelect) -> Sqe {
        let mut sqe = Sqe::new(AdminOpcode::GetFeatures as u8);
        sqe.cdw10 = ((select as u32) << 8) | fid as u32;
        sqe
    }

    /// Get Log Page: `len` bytes (a multiple of 4, at least 4) from byte `offset` of log `lid`.
    /// Use `nsid` 0xffff_ffff for controller-wide SMART data.
    pub const fn get_log_page(lid: LogPageId, nsid: u32, len: u32, offset: u64) -> Sqe {
        Sqe::get_log_page_raw(lid as u8, nsid, len, offset)
    }

    /// Get Log Page for any log identifier, vendor specific ones included.
    pub const fn get_log_page_raw(lid: u8, nsid: u32, len: u32, offset: u64) -> Sqe {
        let numd = zero_based(len / 4);
        let mut sqe = Sqe::new(AdminOpcode::GetLogPage as u8);
        sqe.nsid = nsid;
        sqe.cdw10 = ((numd & 0xffff) << 16) | lid as u32; // NUMDL
        sqe.cdw11 = numd >> 16; // NUMDU
        sqe.cdw12 = offset as u32; // LPOL
        sqe.cdw13 = (offset >> 32) as u32; // LPOU
        sqe
    }

    /// Abort the command `cid` on submission queue `sqid`.
    pub const fn abort(sqid: u16, cid: u16) -> Sqe {
        let mut sqe = Sqe::new(AdminOpcode::Abort as u8);
        sqe.cdw10 = ((cid as u32) << 16) | sqid as u32;
        sqe
    }

    /// Asynchronous Event Request.
    /// Namespace Management, Create: the data is an Identify Namespace structure of which the
    /// controller reads NSZE, NCAP, FLBAS, DPS and NMIC; dword 0 of the completion is the new
    /// namespace's ID.
    pub const fn namespace_create() -> Sqe {
        Sqe::new(AdminOpcode::NamespaceManagement as u8)
    }

    /// Namespace Management, Delete of namespace `nsid` (FFFFFFFFh: every one).
    pub const fn namespace_delete(nsid: u32) -> Sqe {
        let mut s = Sqe::new(AdminOpcode::NamespaceManagement as u8);
        s.nsid = nsid;
        s.cdw10 = 1;
        s
    }

    /// Namespace Attachment of `nsid` to (or detachment from) the controllers of the data, a
    /// [`ControllerList`](super::identify::ControllerList).
    pub const fn namespace_attachment(nsid: u32, attach: bool) -> Sqe {
        let mut s = Sqe::new(AdminOpcode::NamespaceAttachment as u8);
        s.nsid = nsid;
        s.cdw10 = if attach { 0 } else { 1 };
        s
    }

    pub const fn async_event_request() -> Sqe {
        Sqe::new(AdminOpcode::AsyncEventRequest as u8)
    }

    /// Doorbell Buffer Config: `shadow` and `eventidx` are page-aligned buffers laid out like
    /// the doorbell registers.
    pub const fn doorbell_buffer_config(shadow: u64, eventidx: u64) -> Sqe {
        let mut sqe = Sqe::new(AdminOpcode::DoorbellBufferConfig as u8);
        sqe.prp1 = shadow;
        sqe.prp2 = eventidx;
        sqe
    }

    /// An NVM command on `blocks` blocks (1 ..= 65536) from `slba`.
    const fn lba_range(opcode: IoOpcode, nsid: u32, slba: u64, blocks: u32) -> Sqe {
        let mut sqe = Sqe::new(opcode as u8);
        sqe.nsid = nsid;
        sqe.cdw10 = slba as u32;
        sqe.cdw11 = (slba >> 32) as u32;
        sqe.cdw12 = zero_based(blocks) & 0xffff;
        sqe
    }

    /// Read `blocks` blocks (1 ..= 65536) from `slba`.
    pub const fn read(nsid: u32, slba: u64, blocks: u32) -> Sqe {
        Sqe::lba_range(IoOpcode::Read, nsid, slba, blocks)
    }

    /// Write `blocks` blocks (1 ..= 65536) at `slba`.
    pub const fn write(nsid: u32, slba: u64, blocks: u32) -> Sqe {
        Sqe::lba_range(IoOpcode::Write, nsid, slba, blocks)
    }

    /// Compare `blocks` blocks (1 ..= 65536) at `slba` with the data buffer.
    pub const fn compare(nsid: u32, slba: u64, blocks: u32) -> Sqe {
        Sqe::lba_range(IoOpcode::Compare, nsid, slba, blocks)
    }

    /// Write Zeroes to `blocks` blocks (1 ..= 65536) at `slba`; no data transfer.
    pub const fn write_zeroes(nsid: u32, slba: u64, blocks: u32) -> Sqe {
        Sqe::lba_range(IoOpcode::WriteZeroes, nsid, slba, blocks)
    }

    /// Flush the volatile write cache of namespace `nsid`.
    pub const fn flush(nsid: u32) -> Sqe {
        let mut sqe = Sqe::new(IoOpcode::Flush as u8);
        sqe.nsid = nsid;
        sqe
    }

    /// Dataset Management over `ranges` [`DsmRange`]s (1 ..= 256) in the data buffer;
    /// `deallocate` sets the AD attribute (trim).
    pub const fn dataset_management(nsid: u32, ranges: u32, deallocate: bool) -> Sqe {
        let mut sqe = Sqe::new(IoOpcode::DatasetManagement as u8);
        sqe.nsid = nsid;
        sqe.cdw10 = zero_based(ranges) & 0xff;
        sqe.cdw11 = if deallocate { DSM_DEALLOCATE } else { 0 };
        sqe
    }
}

/// Decodes the CQE DW0 of Set Features – Number of Queues: the numbers of I/O submission and
/// completion queues allocated (1's based).
pub const fn num_queues_allocated(dw0: u32) -> (u32, u32) {
    ((dw0 & 0xffff) + 1, (dw0 >> 16) + 1)
}

/// A Dataset Management range (NVM Command Set 1.0, figure 39).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, FromBytes, IntoBytes, Immutable)]
pub struct DsmRange {
    /// Context Attributes.
    pub attributes: u32,
    /// Length in logical blocks (1's based).
    pub blocks: u32,
    /// Starting LBA.
    pub slba: u64,
}

const _: () = {
    assert!(offset_of!(DsmRange, blocks) == 4);
    assert!(offset_of!(DsmRange, slba) == 8);
};

impl DsmRange {
    /// A range of `blocks` blocks from `slba`, no context attributes.
    pub const fn new(slba: u64, blocks: u32) -> DsmRange {
        DsmRange {
            attributes: 0,
            blocks,
            slba,
        }
    }
}

/// SGL descriptor type: Data Block.
pub const SGL_DATA_BLOCK: u8 = 0x0;
/// SGL descriptor type: Bit Bucket.
pub const SGL_BIT_BUCKET: u8 = 0x1;
/// SGL descriptor type: Segment.
pub const SGL_SEGMENT: u8 = 0x2;
/// SGL descriptor type: Last Segment.
pub const SGL_LAST_SEGMENT: u8 = 0x3;

/// A 16-byte Scatter Gather List descriptor (NVMe Base 2.0, section 4.1.2).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, FromBytes, IntoBytes, Immutable)]
pub struct SglDescriptor {
    /// Address (of the data, or of the next segment).
    pub address: u64,
    /// Length in bytes (of the data, or of the next segment).
    pub length: u32,
    rsvd12: [u8; 3],
    /// SGL Identifier: descriptor type (7:4) and subtype (3:0).
    pub identifier: u8,
}

const _: () = {
    assert!(offset_of!(SglDescriptor, length) == 8);
    assert!(offset_of!(SglDescriptor, identifier) == 15);
};

impl SglDescriptor {
    /// A descriptor of type `kind` (subtype 0: address).
    pub const fn new(kind: u8, address: u64, length: u32) -> SglDescriptor {
        SglDescriptor {
            address,
            length,
            rsvd12: [0; 3],
            identifier: kind << 4,
        }
    }

    /// A Data Block descriptor: `length` bytes at `address`.
    pub const fn data_block(address: u64, length: u32) -> SglDescriptor {
        SglDescriptor::new(SGL_DATA_BLOCK, address, length)
    }

    /// A Segment descriptor: the next segment, `length` bytes of descriptors at `address`.
    pub const fn segment(address: u64, length: u32) -> SglDescriptor {
        SglDescriptor::new(SGL_SEGMENT, address, length)
    }

    /// A Last Segment descriptor: the final segment of descriptors.
    pub const fn last_segment(address: u64, length: u32) -> SglDescriptor {
        SglDescriptor::new(SGL_LAST_SEGMENT, address, length)
    }

    /// SGL Descriptor Type.
    pub const fn kind(&self) -> u8 {
        self.identifier >> 4
    }

    /// SGL Descriptor Sub Type.
    pub const fn subtype(&self) -> u8 {
        self.identifier & 0xf
    }

    /// The descriptor as the two little-endian quadwords of an SQE data pointer.
    pub const fn to_dwords(self) -> [u64; 2] {
        let [a, b, c] = self.rsvd12;
        let high =
            (a as u64) << 32 | (b as u64) << 40 | (c as u64) << 48 | (self.identifier as u64) << 56;
        [self.address, self.length as u64 | high]
    }

    /// The descriptor held in an SQE data pointer.
    pub const fn from_dwords(dptr: [u64; 2]) -> SglDescriptor {
        let high = dptr[1];
        SglDescriptor {
            address: dptr[0],
            length: high as u32,
            rsvd12: [(high >> 32) as u8, (high >> 40) as u8, (high >> 48) as u8],
            identifier: (high >> 56) as u8,
        }
    }
}

pod!(Sqe = 64, DsmRange = 16, SglDescriptor = 16);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_puts_fields_in_the_right_dwords() {
        let mut sqe = Sqe::read(1, 0x1_0000_0002, 8);
        sqe.set_cid(0xbeef);
        assert_eq!(sqe.opcode(), 0x02);
        assert_eq!(sqe.cid(), 0xbeef);
        assert_eq!(sqe.cdw0, 0xbeef_0002);
        assert_eq!((sqe.nsid, sqe.cdw10, sqe.cdw11, sqe.cdw12), (1, 2, 1, 7));
        assert_eq!((sqe.slba(), sqe.blocks()), (0x1_0000_0002, 8));
        let bytes = sqe.as_bytes();
        assert_eq!(bytes[0], 0x02);
        assert_eq!(&bytes[2..4], &[0xef, 0xbe]);
        assert_eq!(&bytes[40..44], &[2, 0, 0, 0]);
        assert_eq!(&bytes[44..48], &[1, 0, 0, 0]);
        assert_eq!(&bytes[48..52], &[7, 0, 0, 0]);
        assert_eq!(Sqe::write(1, 0, 65536).cdw12, 0xffff);
        assert_eq!(Sqe::write(1, 0, 1).opcode(), IoOpcode::Write as u8);
    }

    #[test]
    fn admin_builders() {
        let id = Sqe::identify(Cns::Controller, 0);
        assert_eq!((id.opcode(), id.cdw10), (0x06, 1));
        let list = Sqe::identify(Cns::ActiveNamespaceList, 0);
        assert_eq!(list.cdw10, 2);

        let cq = Sqe::create_io_cq(3, 1024, 0x20_0000);
        assert_eq!(
            (cq.opcode(), cq.prp1, cq.cdw10, cq.cdw11),
            (0x05, 0x20_0000, 0x03ff_0003, 1)
        );
        // IEN (bit 1) and IV (bits 31:16) only with a vector
        assert_eq!(Sqe::create_io_cq_with(3, 1024, 0x20_0000, None).cdw11, 1);
        let irq = Sqe::create_io_cq_with(3, 1024, 0x20_0000, Some(5));
        assert_eq!((irq.cdw10, irq.cdw11), (0x03ff_0003, 0x0005_0003));
        let sq = Sqe::create_io_sq(3, 1024, 0x30_0000, 3, QueuePriority::Medium);
        assert_eq!(
            (sq.opcode(), sq.prp1, sq.cdw10, sq.cdw11),
            (0x01, 0x30_0000, 0x03ff_0003, 0x0003_0005)
        );
        assert_eq!(
            (Sqe::delete_io_sq(3).opcode(), Sqe::delete_io_sq(3).cdw10),
            (0x00, 3)
        );
        assert_eq!(
            (Sqe::delete_io_cq(3).opcode(), Sqe::delete_io_cq(3).cdw10),
            (0x04, 3)
        );

        let nq = Sqe::set_num_queues(8, 4);
        assert_eq!((nq.opcode(), nq.cdw10, nq.cdw11), (0x09, 0x07, 0x0003_0007));
        assert_eq!(num_queues_allocated(0x003f_003f), (64, 64));
        let gf = Sqe::get_features(FeatureId::VolatileWriteCache, FeatureSelect::Saved);
        assert_eq!((gf.opcode(), gf.cdw10), (0x0a, 0x0206));

        let log = Sqe::get_log_page(LogPageId::SmartHealth, u32::MAX, 512, 0);
        assert_eq!(
            (log.opcode(), log.nsid, log.cdw10, log.cdw11),
            (0x02, u32::MAX, 0x007f_0002, 0)
        );
        let big = Sqe::get_log_page(LogPageId::ErrorInformation, 0, 0x40_0000, 0x1_0000_1000);
        assert_eq!((big.cdw10 >> 16, big.cdw11), (0xffff, 0xf));
        assert_eq!((big.cdw12, big.cdw13), (0x1000, 1));

        let abort = Sqe::abort(2, 0x1234);
        assert_eq!((abort.opcode(), abort.cdw10), (0x08, 0x1234_0002));
        let dbbuf = Sqe::doorbell_buffer_config(0x1000, 0x2000);
        assert_eq!(
            (dbbuf.opcode(), dbbuf.prp1, dbbuf.prp2),
            (0x7c, 0x1000, 0x2000)
        );
    }

    #[test]
    fn io_builders() {
        let wz = Sqe::write_zeroes(1, 10, 4);
        assert_eq!((wz.opcode(), wz.cdw10, wz.cdw12), (0x08, 10, 3));
        assert_eq!((Sqe::flush(1).opcode(), Sqe::flush(1).nsid), (0x00, 1));
        let dsm = Sqe::dataset_management(1, 256, true);
        assert_eq!((dsm.opcode(), dsm.cdw10, dsm.cdw11), (0x09, 0xff, 1 << 2));
        let range = DsmRange::new(0x1_0000_0000, 16);
        assert_eq!(range.as_bytes()[4..8], [16, 0, 0, 0]);
        assert_eq!(range.as_bytes()[8..16], [0, 0, 0, 0, 1, 0, 0, 0]);
    }

    #[test]
    fn sgl_descriptor_in_sqe() {
        let desc = SglDescriptor::last_segment(0xdead_b000, 32);
        assert_eq!(desc.as_bytes()[15], 0x30);
        assert_eq!((desc.kind(), desc.subtype()), (SGL_LAST_SEGMENT, 0));
        let mut sqe = Sqe::read(1, 0, 1);
        sqe.set_sgl(desc);
        assert_eq!(sqe.psdt(), PSDT_SGL);
        assert_eq!(sqe.sgl(), desc);
        assert_eq!(&sqe.as_bytes()[24..40], desc.as_bytes());
        assert_eq!(
            SglDescriptor::data_block(0x1000, 4096).kind(),
            SGL_DATA_BLOCK
        );
        assert_eq!(SglDescriptor::segment(0x1000, 64).identifier, 0x20);
    }

    #[test]
    fn opcode_names_and_fields() {
        assert_eq!(IoOpcode::Read.name(), "Read");
        assert_eq!(
            AdminOpcode::CreateIoSq.name(),
            "Create I/O Submission Queue"
        );
        assert_eq!(
            AdminOpcode::from_raw(0x7c),
            Some(AdminOpcode::DoorbellBufferConfig)
        );
        assert_eq!(AdminOpcode::from_raw(0x03), None);
        assert_eq!(u8::from(IoOpcode::DatasetManagement), 0x09);
        assert_eq!(
            DataTransfer::of(IoOpcode::Write as u8),
            DataTransfer::HostToController
        );
        assert_eq!(
            DataTransfer::of(AdminOpcode::Identify as u8),
            DataTransfer::ControllerToHost
        );
        let mut sqe = Sqe::new(0x01);
        sqe.set_fuse(FUSE_SECOND);
        sqe.set_cid(5);
        assert_eq!((sqe.fuse(), sqe.cid(), sqe.opcode()), (2, 5, 1));
    }
}

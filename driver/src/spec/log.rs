//! Log pages (NVMe Base 2.0, section 5.16.1).

use core::mem::offset_of;
use zerocopy::{FromBytes, Immutable, IntoBytes};

use super::ascii_field;
use super::status::Status;

spec_enum! {
    /// Log Page Identifiers of Get Log Page (NVMe Base 2.0, figure 202).
    pub enum LogPageId: u8 {
        ErrorInformation = 0x01 => "Error Information",
        SmartHealth = 0x02 => "SMART / Health Information",
        FirmwareSlot = 0x03 => "Firmware Slot Information",
        ChangedNamespaceList = 0x04 => "Changed Namespace List",
        CommandsSupportedAndEffects = 0x05 => "Commands Supported and Effects",
        DeviceSelfTest = 0x06 => "Device Self-test",
        TelemetryHostInitiated = 0x07 => "Telemetry Host-Initiated",
        TelemetryControllerInitiated = 0x08 => "Telemetry Controller-Initiated",
        EnduranceGroupInformation = 0x09 => "Endurance Group Information",
        PredictableLatencyPerNvmSet = 0x0a => "Predictable Latency Per NVM Set",
        PredictableLatencyEventAggregate = 0x0b => "Predictable Latency Event Aggregate",
        AsymmetricNamespaceAccess = 0x0c => "Asymmetric Namespace Access",
        PersistentEventLog = 0x0d => "Persistent Event Log",
        EnduranceGroupEventAggregate = 0x0f => "Endurance Group Event Aggregate",
        MediaUnitStatus = 0x10 => "Media Unit Status",
        SupportedCapacityConfigurationList = 0x11 => "Supported Capacity Configuration List",
        FeatureIdentifiersSupportedAndEffects = 0x12 => "Feature Identifiers Supported and Effects",
        NvmeMiCommandsSupportedAndEffects = 0x13 => "NVMe-MI Commands Supported and Effects",
        CommandAndFeatureLockdown = 0x14 => "Command and Feature Lockdown",
        BootPartition = 0x15 => "Boot Partition",
        RotationalMediaInformation = 0x16 => "Rotational Media Information",
        Discovery = 0x70 => "Discovery",
        ReservationNotification = 0x80 => "Reservation Notification",
        SanitizeStatus = 0x81 => "Sanitize Status",
    }
}

spec_flags! {
    /// Critical Warning bits of the SMART / Health Information log.
    pub struct CriticalWarning(u8) {
        AVAILABLE_SPARE = 0 => "available spare below threshold",
        TEMPERATURE = 1 => "temperature",
        RELIABILITY_DEGRADED = 2 => "reliability degraded",
        READ_ONLY = 3 => "read-only",
        VOLATILE_BACKUP_FAILED = 4 => "volatile memory backup failed",
        PMR_READ_ONLY = 5 => "persistent memory region read-only",
    }
}

/// SMART / Health Information log (LID 02h), 512 bytes. The 128-bit counters are stored as
/// little-endian byte arrays; the accessors of the same name decode them.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable)]
pub struct SmartLog {
    pub critical_warning: u8,           // see CriticalWarning
    pub composite_temperature: [u8; 2], // kelvin, u16 at an odd offset
    pub available_spare: u8,            // percent
    pub available_spare_threshold: u8,  // percent
    pub percentage_used: u8,            // may exceed 100
    pub endurance_group_summary: u8,
    rsvd7: [u8; 25],
    pub data_units_read: [u8; 16],    // thousands of 512-byte units
    pub data_units_written: [u8; 16], // thousands of 512-byte units
    pub host_read_commands: [u8; 16],
    pub host_write_commands: [u8; 16],
    pub controller_busy_time: [u8; 16], // minutes
    pub power_cycles: [u8; 16],
    pub power_on_hours: [u8; 16],
    pub unsafe_shutdowns: [u8; 16],
    pub media_errors: [u8; 16],         // media and data integrity errors
    pub error_log_entries: [u8; 16],    // error information log entries, lifetime
    pub warning_temperature_time: u32,  // minutes
    pub critical_temperature_time: u32, // minutes
    pub temperature_sensors: [u16; 8],  // kelvin, 0 if not implemented
    pub thermal_transition_counts: [u32; 2], // thermal management temperature 1 and 2
    pub thermal_total_times: [u32; 2],  // seconds at thermal management temperature 1 and 2
    rsvd232: [u8; 280],
}

const _: () = {
    assert!(offset_of!(SmartLog, composite_temperature) == 1);
    assert!(offset_of!(SmartLog, endurance_group_summary) == 6);
    assert!(offset_of!(SmartLog, data_units_read) == 32);
    assert!(offset_of!(SmartLog, power_on_hours) == 128);
    assert!(offset_of!(SmartLog, error_log_entries) == 176);
    assert!(offset_of!(SmartLog, warning_temperature_time) == 192);
    assert!(offset_of!(SmartLog, temperature_sensors) == 200);
    assert!(offset_of!(SmartLog, thermal_transition_counts) == 216);
    assert!(offset_of!(SmartLog, thermal_total_times) == 224);
};

/// Kelvin to degrees Celsius, saturating: above 33040 K (a broken sensor, or 0xffff for "no
/// reading") an `i16` cannot hold the value, and a wrapped one would read as a cold drive.
const fn kelvin_to_celsius(kelvin: u16) -> i16 {
    let celsius = kelvin as i32 - 273;
    if celsius > i16::MAX as i32 {
        i16::MAX
    } else {
        celsius as i16
    }
}

impl SmartLog {
    /// Critical Warning flags.
    pub const fn critical_warnings(&self) -> CriticalWarning {
        CriticalWarning(self.critical_warning)
    }

    /// Composite Temperature in kelvin.
    pub const fn temperature_kelvin(&self) -> u16 {
        u16::from_le_bytes(self.composite_temperature)
    }

    /// Composite Temperature in degrees Celsius.
    pub const fn temperature_celsius(&self) -> i16 {
        kelvin_to_celsius(self.temperature_kelvin())
    }

    /// Temperature Sensor `index` (1..=8) in degrees Celsius, if implemented.
    pub fn sensor_celsius(&self, index: usize) -> Option<i16> {
        let kelvin = *self.temperature_sensors.get(index.checked_sub(1)?)?;
        (kelvin != 0).then(|| kelvin_to_celsius(kelvin))
    }

    /// Data Units Read (thousands of 512-byte units).
    pub const fn data_units_read(&self) -> u128 {
        u128::from_le_bytes(self.data_units_read)
    }

    /// Data Units Written (thousands of 512-byte units).
    pub const fn data_units_written(&self) -> u128 {
        u128::from_le_bytes(self.data_units_written)
    }

    /// Bytes read by the host, from Data Units Read (rounded up by the controller).
    pub const fn bytes_read(&self) -> u128 {
        self.data_units_read().saturating_mul(512_000)
    }

    /// Bytes written by the host, from Data Units Written.
    pub const fn bytes_written(&self) -> u128 {
        self.data_units_written().saturating_mul(512_000)
    }

    /// Host Read Commands.
    pub const fn host_read_commands(&self) -> u128 {
        u128::from_le_bytes(self.host_read_commands)
    }

    /// Host Write Commands.
    pub const fn host_write_commands(&self) -> u128 {
        u128::from_le_bytes(self.host_write_commands)
    }

    /// Controller Busy Time, minutes.
    pub const fn controller_busy_time(&self) -> u128 {
        u128::from_le_bytes(self.controller_busy_time)
    }

    /// Power Cycles.
    pub const fn power_cycles(&self) -> u128 {
        u128::from_le_bytes(self.power_cycles)
    }

    /// Power On Hours.
    pub const fn power_on_hours(&self) -> u128 {
        u128::from_le_bytes(self.power_on_hours)
    }

    /// Unsafe Shutdowns.
    pub const fn unsafe_shutdowns(&self) -> u128 {
        u128::from_le_bytes(self.unsafe_shutdowns)
    }

    /// Media and Data Integrity Errors.
    pub const fn media_errors(&self) -> u128 {
        u128::from_le_bytes(self.media_errors)
    }

    /// Number of Error Information Log Entries.
    pub const fn error_log_entries(&self) -> u128 {
        u128::from_le_bytes(self.error_log_entries)
    }
}

/// An Error Information log entry (LID 01h), 64 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable)]
pub struct ErrorLogEntry {
    pub error_count: u64, // unique and increasing; 0 marks an unused entry
    pub sqid: u16,
    pub cid: u16,
    pub status_field: u16, // status field (15:1) and phase tag (0) of the completion
    pub parameter_error_location: u16, // byte (7:0) and bit (10:8); 0xffff if none
    pub lba: u64,
    pub nsid: u32,
    pub vendor_info_available: u8, // a log page ID, or 0
    pub trtype: u8,                // transport type, for transport errors
    rsvd30: [u8; 2],
    pub command_specific: u64,
    pub transport_specific: u16,
    rsvd42: [u8; 22],
}

const _: () = {
    assert!(offset_of!(ErrorLogEntry, status_field) == 12);
    assert!(offset_of!(ErrorLogEntry, lba) == 16);
    assert!(offset_of!(ErrorLogEntry, nsid) == 24);
    assert!(offset_of!(ErrorLogEntry, trtype) == 29);
    assert!(offset_of!(ErrorLogEntry, command_specific) == 32);
    assert!(offset_of!(ErrorLogEntry, transport_specific) == 40);
};

impl ErrorLogEntry {
    /// Whether the entry is unused.
    pub const fn is_empty(&self) -> bool {
        self.error_count == 0
    }

    /// The status the failed command completed with.
    pub const fn status(&self) -> Status {
        Status::from_word(self.status_field)
    }

    /// Byte and bit in the command where the error is, if the controller says.
    pub const fn parameter_error(&self) -> Option<(u8, u8)> {
        match self.parameter_error_location {
            0xffff => None,
            loc => Some((loc as u8, ((loc >> 8) & 7) as u8)),
        }
    }
}

/// What the Sanitize Status log (LID 81h) says, as far as usnvme reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SanitizeStatus {
    /// SPROG: progress of the sanitize under way, in 65536ths (65535 when none is).
    pub progress: u16,
    /// SSTAT bits 2:0: the most recent sanitize's state.
    pub state: SanitizeState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SanitizeState {
    Never,
    Completed,
    InProgress,
    Failed,
    /// Completed, without deallocating the media (No-Deallocate).
    CompletedNoDeallocate,
    Reserved(u8),
}

/// Sanitize log bytes: SPROG then SSTAT, little-endian.
pub const SANITIZE_LOG_BYTES: usize = 512;

impl SanitizeStatus {
    pub fn from_slice(bytes: &[u8]) -> Option<SanitizeStatus> {
        let word = |at: usize| Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?));
        let state = match word(2)? & 7 {
            0 => SanitizeState::Never,
            1 => SanitizeState::Completed,
            2 => SanitizeState::InProgress,
            3 => SanitizeState::Failed,
            4 => SanitizeState::CompletedNoDeallocate,
            other => SanitizeState::Reserved(other as u8),
        };
        Some(SanitizeStatus {
            progress: word(0)?,
            state,
        })
    }

    /// The log's first bytes for a state and progress.
    pub fn to_bytes(progress: u16, state: u8) -> [u8; 4] {
        let [a, b] = progress.to_le_bytes();
        [a, b, state, 0]
    }
}

/// What the Device Self-test log (LID 06h) says: the test under way, and the newest result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SelfTestStatus {
    /// The test under way (1 short, 2 extended), 0 when none is, and how far it is, in percent.
    pub running: u8,
    pub percent: u8,
    /// The newest result: the test's code and its result (0 completed without error, 1 aborted
    /// by a Device Self-test command, 2 aborted by a reset, ..., 7 failed); None without one.
    pub newest: Option<(u8, u8)>,
}

/// Device Self-test log bytes: 4 then 20 results of 28.
pub const SELF_TEST_LOG_BYTES: usize = 564;

impl SelfTestStatus {
    pub fn from_slice(bytes: &[u8]) -> Option<SelfTestStatus> {
        let status = *bytes.get(4)?;
        Some(SelfTestStatus {
            running: *bytes.first()? & 0xf,
            percent: *bytes.get(1)? & 0x7f,
            // result 0xF marks an unused entry
            newest: (status & 0xf != 0xf).then_some((status >> 4, status & 0xf)),
        })
    }
}

/// Firmware Slot Information log (LID 03h), 512 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable)]
pub struct FirmwareSlotLog {
    pub afi: u8, // Active Firmware Info: active slot (2:0), slot activated at next reset (6:4)
    rsvd1: [u8; 7],
    pub frs: [[u8; 8]; 7], // Firmware Revision for Slot 1..7 (ASCII; all zero for an empty slot)
    rsvd64: [u8; 448],
}

const _: () = assert!(offset_of!(FirmwareSlotLog, frs) == 8);

impl FirmwareSlotLog {
    /// The slot (1..=7) of the running firmware.
    pub const fn active_slot(&self) -> u8 {
        self.afi & 7
    }

    /// The slot to be activated at the next controller reset, if one is set.
    pub const fn next_reset_slot(&self) -> Option<u8> {
        match (self.afi >> 4) & 7 {
            0 => None,
            slot => Some(slot),
        }
    }

    /// The firmware revision in `slot` (1..=7), if the slot holds one.
    pub fn revision(&self, slot: u8) -> Option<String> {
        let frs = self.frs.get(usize::from(slot).checked_sub(1)?)?;
        frs.iter().any(|&b| b != 0).then(|| ascii_field(frs))
    }

    /// `(slot, revision)` for every filled slot.
    pub fn revisions(&self) -> impl Iterator<Item = (u8, String)> + '_ {
        (1..=7).filter_map(|slot| Some((slot, self.revision(slot)?)))
    }
}

pod!(SmartLog = 512, ErrorLogEntry = 64, FirmwareSlotLog = 512);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smart_temperature_counters_and_warnings() {
        let mut bytes = [0u8; 512];
        bytes[0] = 0b10_0101;
        bytes[1..3].copy_from_slice(&310u16.to_le_bytes()); // 37 °C
        bytes[3] = 100;
        bytes[5] = 3;
        bytes[32..48].copy_from_slice(&((1u128 << 64) + 5).to_le_bytes());
        bytes[48..64].copy_from_slice(&1000u128.to_le_bytes());
        bytes[128..144].copy_from_slice(&12345u128.to_le_bytes());
        bytes[200..202].copy_from_slice(&263u16.to_le_bytes()); // -10 °C
        let log = SmartLog::from_bytes(&bytes);
        assert_eq!(log.temperature_kelvin(), 310);
        assert_eq!(log.temperature_celsius(), 37);
        assert_eq!(log.sensor_celsius(1), Some(-10));
        assert_eq!(log.sensor_celsius(2), None);
        assert_eq!(log.sensor_celsius(0), None);
        assert_eq!(log.sensor_celsius(9), None);
        let mut hot = log;
        hot.composite_temperature = 0xffffu16.to_le_bytes();
        assert_eq!(
            hot.temperature_celsius(),
            i16::MAX,
            "saturates, does not wrap"
        );
        assert_eq!(log.data_units_read(), (1 << 64) + 5);
        assert_eq!(log.data_units_written(), 1000);
        assert_eq!(log.bytes_written(), 512_000_000);
        assert_eq!(log.power_on_hours(), 12345);
        assert_eq!((log.available_spare, log.percentage_used), (100, 3));
        let warnings = log.critical_warnings();
        assert!(
            warnings.contains(CriticalWarning::AVAILABLE_SPARE | CriticalWarning::PMR_READ_ONLY)
        );
        assert_eq!(
            warnings.names().collect::<Vec<_>>(),
            [
                "available spare below threshold",
                "reliability degraded",
                "persistent memory region read-only"
            ]
        );
        assert_eq!(log.as_bytes(), &bytes);
    }

    #[test]
    fn error_log_entry_fields() {
        let mut entry = ErrorLogEntry::zeroed();
        assert!(entry.is_empty());
        entry.error_count = 3;
        entry.status_field = Status::INVALID_FIELD.with_dnr().to_word(true);
        entry.parameter_error_location = 0x0328; // byte 40, bit 3
        entry.lba = 0x10;
        let bytes = entry.as_bytes();
        assert_eq!(&bytes[12..14], &entry.status_field.to_le_bytes());
        assert_eq!(bytes[16], 0x10);
        assert_eq!(entry.status().code(), Status::INVALID_FIELD);
        assert!(entry.status().dnr());
        assert_eq!(entry.parameter_error(), Some((40, 3)));
        entry.parameter_error_location = 0xffff;
        assert_eq!(entry.parameter_error(), None);
    }

    #[test]
    fn firmware_slots() {
        let mut bytes = [0u8; 512];
        bytes[0] = 0x21; // active slot 1, slot 2 at next reset
        bytes[8..16].copy_from_slice(b"1.0     ");
        bytes[16..24].copy_from_slice(b"1.1\0\0\0\0\0");
        let log = FirmwareSlotLog::from_bytes(&bytes);
        assert_eq!(log.active_slot(), 1);
        assert_eq!(log.next_reset_slot(), Some(2));
        assert_eq!(log.revision(1).as_deref(), Some("1.0"));
        assert_eq!(log.revision(3), None);
        assert_eq!(log.revision(0), None);
        assert_eq!(
            log.revisions().collect::<Vec<_>>(),
            [(1, "1.0".into()), (2, "1.1".into())]
        );
        assert_eq!(LogPageId::SmartHealth.name(), "SMART / Health Information");
        assert_eq!(LogPageId::from_raw(0x03), Some(LogPageId::FirmwareSlot));
    }

    #[test]
    fn sanitize_and_self_test_logs_read_their_fields() {
        let mut log = [0u8; 8];
        log[..4].copy_from_slice(&SanitizeStatus::to_bytes(0x8000, 2));
        assert_eq!(
            SanitizeStatus::from_slice(&log),
            Some(SanitizeStatus {
                progress: 0x8000,
                state: SanitizeState::InProgress
            })
        );
        assert_eq!(SanitizeStatus::from_slice(&log[..3]), None);
        let mut st = [0u8; SELF_TEST_LOG_BYTES];
        st[..5].copy_from_slice(&[1, 42, 0, 0, 0x2f]);
        assert_eq!(
            SelfTestStatus::from_slice(&st),
            Some(SelfTestStatus {
                running: 1,
                percent: 42,
                newest: None
            })
        );
        st[4] = 0x21; // extended, aborted by a Device Self-test command
        assert_eq!(
            SelfTestStatus::from_slice(&st).and_then(|s| s.newest),
            Some((2, 1))
        );
    }
}

//! Set/Get Features: Number of Queues, Keep Alive Timer, Asynchronous Event Configuration, and
//! the Volatile Write Cache (reported enabled, not changeable).

use usnvme_driver::spec::command::FeatureId;
use usnvme_driver::spec::{Sqe, Status};

use super::super::SubsystemInfo;
use super::{FEATURE_NOT_CHANGEABLE, FEATURE_NOT_SAVEABLE, INVALID_FIELD};

/// Set Features CDW10 bit 31: save the value across resets (nothing is saveable).
const FEATURE_SAVE: u32 = 1 << 31;
/// Get Features with SEL 3: bit 2 of DW0 says the feature is changeable.
const FEATURE_CHANGEABLE: u32 = 1 << 2;
/// Asynchronous Event Configuration bits a host may enable: the SMART / Health critical
/// warnings (7:0), which the drives raise and `serve` passes on, the Namespace Attribute (8)
/// and Asymmetric Namespace Access Change (11) notices, and, on a discovery controller, the
/// Discovery Log Page Change notice (31).
const AEC_SUPPORTED: u32 = 0xff | 1 << 8 | 1 << 11 | 1 << 31;

const FID_VOLATILE_WRITE_CACHE: u8 = FeatureId::VolatileWriteCache as u8;
const FID_NUMBER_OF_QUEUES: u8 = FeatureId::NumberOfQueues as u8;
pub(super) const FID_ASYNC_EVENT_CONFIGURATION: u8 = FeatureId::AsyncEventConfiguration as u8;
pub(super) const FID_KEEP_ALIVE_TIMER: u8 = FeatureId::KeepAliveTimer as u8;

/// The features of one controller, as Set/Get Features see them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// The most I/O queues of each kind Number of Queues grants.
    io_queues: u16,
    /// I/O submission and completion queues granted (not 0's based).
    queues: (u16, u16),
    keep_alive_ms: u32,
    async_events: u32,
}

/// Number of Queues DW0: submission queues (15:0) and completion queues (31:16), 0's based.
fn queues_dw0((sq, cq): (u16, u16)) -> u32 {
    u32::from(sq.saturating_sub(1)) | (u32::from(cq.saturating_sub(1)) << 16)
}

/// Asynchronous Event Configuration after Connect: every SMART / health critical warning
/// (bits 4:0), the namespace attribute notices (bit 8: namespaces added and removed) and the
/// ANA change notices (bit 11).
const DEFAULT_EVENTS: u32 = 0x1f | 1 << 8 | 1 << 11;

impl Features {
    /// A new controller's features: all of `sub`'s I/O queues until the host asks for fewer,
    /// no keep-alive timeout, the drives' SMART critical warnings and ANA changes enabled as
    /// asynchronous events (the Linux host enables only the notices OAES lists: without this
    /// it would never hear of a failing drive).
    pub fn new(sub: &SubsystemInfo) -> Features {
        let io_queues = sub.io_queues.max(1);
        Features {
            io_queues,
            queues: (io_queues, io_queues),
            keep_alive_ms: 0,
            async_events: DEFAULT_EVENTS,
        }
    }

    /// Set Features (FID in CDW10 bits 7:0, value in CDW11); the completion's DW0.
    pub fn set_feature(&mut self, sqe: &Sqe) -> Result<u32, Status> {
        if sqe.cdw10 & FEATURE_SAVE != 0 {
            return Err(FEATURE_NOT_SAVEABLE);
        }
        match sqe.cdw10 as u8 {
            FID_NUMBER_OF_QUEUES => {
                // NSQR (15:0) and NCQR (31:16), 0's based; 65535 would ask for 65536
                let (nsqr, ncqr) = (sqe.cdw11 & 0xffff, sqe.cdw11 >> 16);
                if nsqr == 0xffff || ncqr == 0xffff {
                    return Err(INVALID_FIELD);
                }
                let grant = |requested: u32| (requested + 1).min(u32::from(self.io_queues)) as u16;
                self.queues = (grant(nsqr), grant(ncqr));
                Ok(queues_dw0(self.queues))
            }
            FID_KEEP_ALIVE_TIMER => {
                self.keep_alive_ms = sqe.cdw11;
                Ok(0)
            }
            FID_ASYNC_EVENT_CONFIGURATION => {
                if sqe.cdw11 & !AEC_SUPPORTED != 0 {
                    return Err(INVALID_FIELD);
                }
                self.async_events = sqe.cdw11;
                Ok(0)
            }
            // the drives' caches stay as they are
            FID_VOLATILE_WRITE_CACHE => Err(FEATURE_NOT_CHANGEABLE),
            _ => Err(INVALID_FIELD),
        }
    }

    /// Get Features (FID in CDW10 bits 7:0, SEL in 10:8); the completion's DW0.
    pub fn get_feature(&self, sqe: &Sqe) -> Result<u32, Status> {
        let (current, default, changeable) = match sqe.cdw10 as u8 {
            FID_NUMBER_OF_QUEUES => (
                queues_dw0(self.queues),
                queues_dw0((self.io_queues, self.io_queues)),
                true,
            ),
            FID_KEEP_ALIVE_TIMER => (self.keep_alive_ms, 0, true),
            FID_ASYNC_EVENT_CONFIGURATION => (self.async_events, DEFAULT_EVENTS, true),
            FID_VOLATILE_WRITE_CACHE => (1, 1, false), // enabled
            _ => return Err(INVALID_FIELD),
        };
        match (sqe.cdw10 >> 8) & 7 {
            0 => Ok(current),
            // nothing is saveable: the saved value is the default
            1 | 2 => Ok(default),
            3 if changeable => Ok(FEATURE_CHANGEABLE),
            3 => Ok(0),
            _ => Err(INVALID_FIELD),
        }
    }

    /// I/O submission and completion queues granted.
    pub fn io_queues_granted(&self) -> (u16, u16) {
        self.queues
    }

    /// Keep Alive Timeout, milliseconds (0: none).
    pub fn keep_alive_ms(&self) -> u32 {
        self.keep_alive_ms
    }

    /// Records the KATO a Connect gave, so Get Features reports it.
    pub fn set_keep_alive_ms(&mut self, ms: u32) {
        self.keep_alive_ms = ms;
    }

    /// Asynchronous Event Configuration the host set.
    pub fn async_event_config(&self) -> u32 {
        self.async_events
    }
}

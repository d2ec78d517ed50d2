//! The controller logic both transports share, written once: the CC/CSTS state machine
//! (enable and wait for CSTS.RDY within CAP.TO, a fatal status, disable, shutdown and wait for
//! CSTS.SHST) and the admin commands every controller runs the same way (Identify Controller,
//! the namespaces, Set Features Number of Queues, Get Log Page SMART / Error / Firmware, Keep
//! Alive).
//!
//! It stands on two small abstractions a transport implements:
//! - [`RegisterAccess`]: CAP, VS, CC and CSTS read and written. Over PCIe these are MMIO
//!   accesses that cannot fail, but a removed device reads all ones; over Fabrics they are
//!   Property Get / Set commands on the admin queue, which fail with the transport's error.
//! - [`AdminPath`]: one admin command with optional data, polled to completion within the
//!   transport's timeout; it gives CQE dword 0, or fails by kind ([`Failed`]: a status the
//!   controller completed it with, or the transport's error).
//!
//! Errors stay the transport's own: the logic reports what went wrong as a [`Fault`] and the
//! transport words it ([`Faults::fault`]), so the PCIe controller keeps its `Error` and the
//! NVMe/TCP one its `RemoteError`, each with the messages users and tests know.

use std::time::{Duration, Instant};

use crate::namespaces::{self, IdentifyFailure, Namespace};
use crate::spec::command::{num_queues_allocated, Cns};
use crate::spec::log::LogPageId;
use crate::spec::registers::{reg, ShutdownStatus};
use crate::spec::{
    AdminOpcode, Cap, Cc, Csts, ErrorLogEntry, FirmwareSlotLog, IdentifyController, SmartLog, Sqe,
    Status, Vs,
};

/// What the shared logic found wrong, for the transport to word as its own error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// The registers read all ones: the device is gone.
    Gone,
    /// CSTS.CFS while enabling (`during` names the step).
    Fatal { during: &'static str },
    /// CSTS.RDY did not become `ready` within `after` (CAP.TO).
    ReadyTimeout {
        during: &'static str,
        ready: bool,
        after: Duration,
    },
    /// CSTS.SHST did not report the shutdown complete within `after`.
    ShutdownTimeout { after: Duration },
    /// An admin command completed with an error status. `command` is what the logic calls it
    /// ("Identify Controller"), `opcode` the opcode's name ("Identify").
    Status {
        command: &'static str,
        opcode: &'static str,
        status: Status,
    },
    /// The data of `command` is too short or malformed; `data` names it ("SMART log").
    Malformed {
        command: &'static str,
        data: &'static str,
    },
}

/// How a transport words a [`Fault`] as its own error.
pub trait Faults {
    type Error;
    fn fault(&self, fault: Fault) -> Self::Error;
}

/// A controller register the shared logic uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reg {
    /// Controller Capabilities, 8 bytes.
    Cap,
    /// Version, 4 bytes.
    Vs,
    /// Controller Configuration, 4 bytes.
    Cc,
    /// Controller Status, 4 bytes.
    Csts,
}

impl Reg {
    /// Its offset (the Fabrics property offset is the same).
    pub const fn offset(self) -> usize {
        match self {
            Reg::Cap => reg::CAP,
            Reg::Vs => reg::VS,
            Reg::Cc => reg::CC,
            Reg::Csts => reg::CSTS,
        }
    }

    /// Whether it is 8 bytes wide.
    pub const fn eight_bytes(self) -> bool {
        matches!(self, Reg::Cap)
    }
}

/// Register access: MMIO, or Property Get / Set. `during` names the step for the transport's
/// error ("CAP", "CC.EN", "CSTS.RDY", "CSTS.SHST", "CC.SHN", "CC.EN = 0", "CC", "CSTS").
pub trait RegisterAccess: Faults {
    /// The register's value (4-byte registers in the low half).
    fn read(&mut self, reg: Reg, during: &'static str) -> Result<u64, Self::Error>;
    fn write(&mut self, reg: Reg, value: u64, during: &'static str) -> Result<(), Self::Error>;

    /// Between two reads of CSTS while waiting for it to change.
    fn poll_interval(&self) -> Duration;

    /// The clock timeouts are measured by (a test's may be virtual).
    fn now(&self) -> Instant {
        Instant::now()
    }

    /// Waits `interval` before CSTS is read again.
    fn pause(&mut self, interval: Duration) {
        std::thread::sleep(interval)
    }
}

/// The data of an admin command.
#[derive(Debug)]
pub enum Data<'a> {
    None,
    /// Filled from the controller.
    FromController(&'a mut [u8]),
    /// Sent to the controller.
    ToController(&'a [u8]),
}

/// One admin command: `name` says what it is in errors ("Identify Controller").
#[derive(Debug)]
pub struct AdminCommand<'a> {
    pub name: &'static str,
    pub sqe: Sqe,
    pub data: Data<'a>,
}

/// Why an admin command failed, by kind.
#[derive(Debug)]
pub enum Failed<E> {
    /// The controller completed it with this (error) status.
    Status(Status),
    /// It did not complete: timed out, the connection or the device is gone, the controller
    /// failed... in the transport's words.
    Transport(E),
}

/// The admin queue of a transport, polled: runs one command to completion (within the
/// transport's admin timeout) and gives CQE dword 0.
pub trait AdminPath: Faults {
    fn admin(&mut self, command: AdminCommand<'_>) -> Result<u32, Failed<Self::Error>>;
}

/// The configuration the host enables controllers with: the NVM command set, 4 KiB memory
/// pages, round robin arbitration, 64-byte SQEs and 16-byte CQEs (CC.EN clear).
pub const fn host_configuration() -> Cc {
    Cc::new()
        .with_iocqes(4)
        .with_iosqes(6)
        .with_mps(0)
        .with_css(Cc::CSS_NVM)
        .with_ams(0)
}

/// The most one command moves, whatever the controller allows (larger I/Os are split): the
/// limit of every transport's queues.
pub const MAX_TRANSFER: u64 = 2 << 20;

/// The largest transfer of one command to a controller: its MDTS (a power of two of CAP's
/// minimum memory page size), at most [`MAX_TRANSFER`], which is the limit also where it sets
/// none (MDTS 0).
pub fn max_transfer(cap: Cap, id: &IdentifyController) -> u64 {
    let min_page = 4096u64 << cap.mpsmin();
    id.mdts_bytes(min_page)
        .map_or(MAX_TRANSFER, |m| m.min(MAX_TRANSFER))
}

/// How long CSTS.RDY may take to change: CAP.TO (500 ms units), at least 500 ms.
pub fn ready_timeout(cap: Cap) -> Duration {
    Duration::from_millis(cap.to_ms().max(500))
}

/// CAP and VS; a device whose CAP reads all ones is gone.
pub fn read_cap_vs<R: RegisterAccess + ?Sized>(r: &mut R) -> Result<(Cap, Vs), R::Error> {
    let cap = Cap(r.read(Reg::Cap, "CAP")?);
    if cap.0 == u64::MAX {
        return Err(r.fault(Fault::Gone));
    }
    let vs = Vs(r.read(Reg::Vs, "VS")? as u32);
    Ok((cap, vs))
}

fn csts<R: RegisterAccess + ?Sized>(r: &mut R, during: &'static str) -> Result<Csts, R::Error> {
    let csts = Csts(r.read(Reg::Csts, during)? as u32);
    if csts.removed() {
        return Err(r.fault(Fault::Gone));
    }
    Ok(csts)
}

/// Waits for CSTS.RDY to become `ready` (within `timeout`); while enabling, CSTS.CFS fails
/// at once. `during` names the step ("enable", "disable").
pub fn wait_ready<R: RegisterAccess + ?Sized>(
    r: &mut R,
    ready: bool,
    timeout: Duration,
    during: &'static str,
) -> Result<(), R::Error> {
    let started = r.now();
    loop {
        let csts = csts(r, "CSTS.RDY")?;
        if ready && csts.cfs() {
            return Err(r.fault(Fault::Fatal { during }));
        }
        if csts.rdy() == ready {
            return Ok(());
        }
        if r.now().saturating_duration_since(started) > timeout {
            return Err(r.fault(Fault::ReadyTimeout {
                during,
                ready,
                after: timeout,
            }));
        }
        let interval = r.poll_interval();
        r.pause(interval);
    }
}

/// Writes `cc` with CC.EN set and waits for CSTS.RDY (within `timeout`, CAP.TO); gives the
/// CC written. (Over PCIe the admin queue's registers come first: AQA, ASQ, ACQ.)
pub fn enable<R: RegisterAccess + ?Sized>(
    r: &mut R,
    cc: Cc,
    timeout: Duration,
) -> Result<Cc, R::Error> {
    let cc = cc.with_en(true);
    r.write(Reg::Cc, u64::from(cc.0), "CC.EN")?;
    wait_ready(r, true, timeout, "enable")?;
    Ok(cc)
}

/// CC.EN = 0 and wait for CSTS.RDY = 0, after letting a controller that is still becoming
/// ready finish, as the spec asks.
pub fn disable<R: RegisterAccess + ?Sized>(r: &mut R, timeout: Duration) -> Result<(), R::Error> {
    let cc = Cc(r.read(Reg::Cc, "CC")? as u32);
    let csts = csts(r, "CSTS")?;
    if cc.en() && !csts.rdy() && !csts.cfs() {
        let _ = wait_ready(r, true, timeout, "enable (before reset)");
    }
    if cc.en() || csts.rdy() {
        r.write(Reg::Cc, u64::from(cc.with_en(false).0), "CC.EN = 0")?;
    }
    wait_ready(r, false, timeout, "disable")
}

/// Normal shutdown: `cc` (the controller's CC) with CC.SHN normal, then CSTS.SHST complete
/// within `limit`.
pub fn shutdown<R: RegisterAccess + ?Sized>(
    r: &mut R,
    cc: Cc,
    limit: Duration,
) -> Result<(), R::Error> {
    r.write(Reg::Cc, u64::from(cc.with_shn(Cc::SHN_NORMAL).0), "CC.SHN")?;
    let started = r.now();
    loop {
        if csts(r, "CSTS.SHST")?.shst() == ShutdownStatus::Complete {
            return Ok(());
        }
        if r.now().saturating_duration_since(started) > limit {
            return Err(r.fault(Fault::ShutdownTimeout { after: limit }));
        }
        let interval = r.poll_interval();
        r.pause(interval);
    }
}

/// The name of an admin opcode, as errors say it.
pub fn opcode_name(sqe: &Sqe) -> &'static str {
    AdminOpcode::from_raw(sqe.opcode())
        .map(|o| o.name())
        .unwrap_or("admin command")
}

/// Runs `command`; a status other than success becomes the transport's error.
pub fn run<A: AdminPath + ?Sized>(a: &mut A, command: AdminCommand<'_>) -> Result<u32, A::Error> {
    let (name, opcode) = (command.name, opcode_name(&command.sqe));
    a.admin(command).map_err(|e| match e {
        Failed::Status(status) => a.fault(Fault::Status {
            command: name,
            opcode,
            status,
        }),
        Failed::Transport(e) => e,
    })
}

/// Runs `sqe`, which returns `len` bytes, and gives them.
fn read_data<A: AdminPath + ?Sized>(
    a: &mut A,
    name: &'static str,
    sqe: Sqe,
    len: usize,
) -> Result<Vec<u8>, A::Error> {
    let mut buf = vec![0u8; len];
    run(
        a,
        AdminCommand {
            name,
            sqe,
            data: Data::FromController(&mut buf),
        },
    )?;
    Ok(buf)
}

/// Identify Controller.
pub fn identify_controller<A: AdminPath + ?Sized>(
    a: &mut A,
) -> Result<Box<IdentifyController>, A::Error> {
    const NAME: &str = "Identify Controller";
    let buf = read_data(
        a,
        NAME,
        Sqe::identify(Cns::Controller, 0),
        IdentifyController::SIZE,
    )?;
    IdentifyController::from_slice(&buf)
        .map(Box::new)
        .ok_or_else(|| {
            a.fault(Fault::Malformed {
                command: NAME,
                data: "identify data",
            })
        })
}

/// The active namespaces with a usable LBA format (`nn`: NN of Identify Controller), read the
/// same way on every transport ([`namespaces::scan`]). `name` names the controller in logs.
pub fn namespaces<A: AdminPath + ?Sized>(
    a: &mut A,
    name: &str,
    nn: u32,
) -> Result<Vec<Namespace>, A::Error> {
    namespaces::scan(name, nn, |sqe, buf| {
        let command = AdminCommand {
            name: "Identify",
            sqe,
            data: Data::FromController(buf),
        };
        match a.admin(command) {
            Ok(_) => Ok(()),
            Err(Failed::Status(status)) => Err(IdentifyFailure::Status(a.fault(Fault::Status {
                command: "Identify",
                opcode: "Identify",
                status,
            }))),
            Err(Failed::Transport(e)) => Err(IdentifyFailure::Transport(e)),
        }
    })
}

/// I/O queues as Set Features Number of Queues granted them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuesGranted {
    /// Submission queues allocated (NSQA + 1).
    pub submission: u32,
    /// Completion queues allocated (NCQA + 1).
    pub completion: u32,
    /// The queue pairs to use: the fewer of both, at most as many as asked for.
    pub pairs: u16,
}

/// Set Features Number of Queues: asks for `wanted` I/O queue pairs (1 to 65534).
pub fn set_number_of_queues<A: AdminPath + ?Sized>(
    a: &mut A,
    wanted: u16,
) -> Result<QueuesGranted, A::Error> {
    let asked = u32::from(wanted.clamp(1, u16::MAX - 1));
    let dw0 = run(
        a,
        AdminCommand {
            name: "Set Features Number of Queues",
            sqe: Sqe::set_num_queues(asked, asked),
            data: Data::None,
        },
    )?;
    let (submission, completion) = num_queues_allocated(dw0);
    Ok(QueuesGranted {
        submission,
        completion,
        pairs: submission.min(completion).min(asked) as u16,
    })
}

/// Keep Alive: the host is still there (within KATO).
pub fn keep_alive<A: AdminPath + ?Sized>(a: &mut A) -> Result<(), A::Error> {
    run(
        a,
        AdminCommand {
            name: "Keep Alive",
            sqe: Sqe::new(AdminOpcode::KeepAlive as u8),
            data: Data::None,
        },
    )
    .map(|_| ())
}

/// Log page `lid` of `len` bytes (namespace FFFFFFFFh for controller-wide ones).
pub fn log_page<A: AdminPath + ?Sized>(
    a: &mut A,
    name: &'static str,
    lid: LogPageId,
    nsid: u32,
    len: usize,
) -> Result<Vec<u8>, A::Error> {
    read_data(a, name, Sqe::get_log_page(lid, nsid, len as u32, 0), len)
}

/// SMART / Health Information of the whole controller.
pub fn smart_log<A: AdminPath + ?Sized>(a: &mut A) -> Result<SmartLog, A::Error> {
    const NAME: &str = "Get Log Page SMART / Health";
    let raw = log_page(a, NAME, LogPageId::SmartHealth, u32::MAX, SmartLog::SIZE)?;
    SmartLog::from_slice(&raw).ok_or_else(|| {
        a.fault(Fault::Malformed {
            command: NAME,
            data: "SMART log",
        })
    })
}

/// The newest `count` Error Information entries, of the `elpe` + 1 the controller keeps
/// (Identify Controller ELPE); empty entries left out.
pub fn error_log<A: AdminPath + ?Sized>(
    a: &mut A,
    elpe: u8,
    count: usize,
) -> Result<Vec<ErrorLogEntry>, A::Error> {
    let entries = count.clamp(1, 1 + elpe as usize);
    let raw = log_page(
        a,
        "Get Log Page Error Information",
        LogPageId::ErrorInformation,
        u32::MAX,
        entries * ErrorLogEntry::SIZE,
    )?;
    Ok(raw
        .chunks_exact(ErrorLogEntry::SIZE)
        .filter_map(ErrorLogEntry::from_slice)
        .filter(|e| !e.is_empty())
        .collect())
}

/// The Firmware Slot Information log.
pub fn firmware_log<A: AdminPath + ?Sized>(a: &mut A) -> Result<FirmwareSlotLog, A::Error> {
    const NAME: &str = "Get Log Page Firmware Slot Information";
    let raw = log_page(
        a,
        NAME,
        LogPageId::FirmwareSlot,
        u32::MAX,
        FirmwareSlotLog::SIZE,
    )?;
    FirmwareSlotLog::from_slice(&raw).ok_or_else(|| {
        a.fault(Fault::Malformed {
            command: NAME,
            data: "firmware slot log",
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A controller behind fake registers and a fake admin queue, on a virtual clock: `pause`
    /// moves the clock on, nothing sleeps.
    #[derive(Debug)]
    struct Fake {
        cap: Cap,
        cc: Cc,
        csts: Csts,
        /// CSTS.RDY follows CC.EN after this many CSTS reads (None: never).
        ready_after: Option<u32>,
        /// CSTS.SHST reports complete this many CSTS reads after CC.SHN (None: never).
        shutdown_after: Option<u32>,
        /// CSTS.CFS comes up with CC.EN.
        fatal_on_enable: bool,
        /// Register accesses fail from now on (a lost connection).
        lost: bool,
        reads_since_change: u32,
        writes: Vec<(Reg, u64, &'static str)>,
        commands: Vec<(&'static str, u8)>,
        /// How an admin command ends: dword 0, a status, or a transport error.
        answer: Result<u32, Failed<Oops>>,
        data: Vec<u8>,
        start: Instant,
        clock: Duration,
    }

    /// The fake's own error: what the transport would say.
    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Oops {
        Fault(Fault),
        Lost(&'static str),
    }

    impl Fake {
        fn new(to_500ms: u64) -> Fake {
            Fake {
                cap: Cap(to_500ms << 24 | 31),
                cc: Cc::new(),
                csts: Csts(0),
                ready_after: Some(3),
                shutdown_after: Some(2),
                fatal_on_enable: false,
                lost: false,
                reads_since_change: 0,
                writes: Vec::new(),
                commands: Vec::new(),
                answer: Ok(0),
                data: Vec::new(),
                start: Instant::now(),
                clock: Duration::ZERO,
            }
        }
    }

    impl Faults for Fake {
        type Error = Oops;
        fn fault(&self, fault: Fault) -> Oops {
            Oops::Fault(fault)
        }
    }

    impl RegisterAccess for Fake {
        fn read(&mut self, reg: Reg, during: &'static str) -> Result<u64, Oops> {
            if self.lost {
                return Err(Oops::Lost(during));
            }
            Ok(match reg {
                Reg::Cap => self.cap.0,
                Reg::Vs => u64::from(Vs::new(1, 4, 0).0),
                Reg::Cc => u64::from(self.cc.0),
                Reg::Csts => {
                    self.reads_since_change += 1;
                    let n = self.reads_since_change;
                    if self.csts.removed() {
                        return Ok(u64::from(u32::MAX));
                    }
                    let mut csts = self.csts;
                    if self.cc.en() && self.fatal_on_enable {
                        csts = csts.with_cfs(true);
                    } else if self.ready_after.is_some_and(|after| n >= after) {
                        csts = csts.with_rdy(self.cc.en());
                    }
                    if self.cc.shn() != 0 && self.shutdown_after.is_some_and(|after| n >= after) {
                        csts = csts.with_shst(ShutdownStatus::Complete);
                    }
                    self.csts = csts;
                    u64::from(csts.0)
                }
            })
        }

        fn write(&mut self, reg: Reg, value: u64, during: &'static str) -> Result<(), Oops> {
            if self.lost {
                return Err(Oops::Lost(during));
            }
            self.writes.push((reg, value, during));
            if reg == Reg::Cc {
                self.cc = Cc(value as u32);
                self.reads_since_change = 0;
            }
            Ok(())
        }

        fn poll_interval(&self) -> Duration {
            Duration::from_millis(10)
        }

        fn now(&self) -> Instant {
            self.start + self.clock
        }

        fn pause(&mut self, interval: Duration) {
            self.clock += interval;
        }
    }

    impl AdminPath for Fake {
        fn admin(&mut self, command: AdminCommand<'_>) -> Result<u32, Failed<Oops>> {
            self.commands.push((command.name, command.sqe.opcode()));
            if let Data::FromController(buf) = command.data {
                let n = buf.len().min(self.data.len());
                buf[..n].copy_from_slice(&self.data[..n]);
            }
            match &self.answer {
                Ok(dw0) => Ok(*dw0),
                Err(Failed::Status(s)) => Err(Failed::Status(*s)),
                Err(Failed::Transport(e)) => Err(Failed::Transport(e.clone())),
            }
        }
    }

    #[test]
    fn enable_writes_the_configuration_and_waits_for_ready() {
        let mut f = Fake::new(2);
        let (cap, vs) = read_cap_vs(&mut f).expect("CAP and VS");
        assert_eq!((cap.to_ms(), vs), (1000, Vs::new(1, 4, 0)));
        let cc = enable(&mut f, host_configuration(), ready_timeout(cap)).expect("enabled");
        assert!(cc.en());
        assert_eq!(cc.css(), Cc::CSS_NVM);
        assert_eq!((cc.iosqes(), cc.iocqes(), cc.mps()), (6, 4, 0));
        assert_eq!(f.writes, vec![(Reg::Cc, u64::from(cc.0), "CC.EN")]);
        assert!(f.csts.rdy());
        // ready on the third read of CSTS: two pauses in between
        assert_eq!(f.clock, Duration::from_millis(20));
    }

    #[test]
    fn enable_fails_as_fatal_when_csts_cfs_is_set() {
        let mut f = Fake::new(2);
        f.fatal_on_enable = true;
        let err = enable(&mut f, host_configuration(), Duration::from_secs(1)).expect_err("CFS");
        assert_eq!(err, Oops::Fault(Fault::Fatal { during: "enable" }));
        // at once, not after CAP.TO
        assert_eq!(f.clock, Duration::ZERO);
    }

    #[test]
    fn enable_times_out_by_cap_to_when_ready_never_comes() {
        let mut f = Fake::new(4); // CAP.TO: 2 s
        f.ready_after = None;
        let timeout = ready_timeout(f.cap);
        assert_eq!(timeout, Duration::from_secs(2));
        let err = enable(&mut f, host_configuration(), timeout).expect_err("never ready");
        assert_eq!(
            err,
            Oops::Fault(Fault::ReadyTimeout {
                during: "enable",
                ready: true,
                after: Duration::from_secs(2)
            })
        );
        // it waited CAP.TO, and not much longer (one poll interval)
        assert!(f.clock > timeout, "{:?}", f.clock);
        assert!(f.clock <= timeout + f.poll_interval(), "{:?}", f.clock);
    }

    #[test]
    fn a_cap_to_of_zero_still_gives_half_a_second() {
        assert_eq!(ready_timeout(Cap(0)), Duration::from_millis(500));
        assert_eq!(ready_timeout(Cap(20 << 24)), Duration::from_secs(10));
    }

    #[test]
    fn registers_reading_all_ones_mean_the_device_is_gone() {
        let mut f = Fake::new(2);
        f.cap = Cap(u64::MAX);
        assert_eq!(read_cap_vs(&mut f), Err(Oops::Fault(Fault::Gone)));
        let mut f = Fake::new(2);
        f.csts = Csts(u32::MAX);
        assert_eq!(
            enable(&mut f, host_configuration(), Duration::from_secs(1)),
            Err(Oops::Fault(Fault::Gone))
        );
        assert_eq!(
            disable(&mut f, Duration::from_secs(1)),
            Err(Oops::Fault(Fault::Gone))
        );
    }

    #[test]
    fn a_register_access_that_fails_gives_the_transport_error_of_its_step() {
        let mut f = Fake::new(2);
        f.lost = true;
        assert_eq!(read_cap_vs(&mut f), Err(Oops::Lost("CAP")));
        assert_eq!(
            enable(&mut f, host_configuration(), Duration::from_secs(1)),
            Err(Oops::Lost("CC.EN"))
        );
        assert_eq!(
            shutdown(&mut f, Cc::new().with_en(true), Duration::from_secs(1)),
            Err(Oops::Lost("CC.SHN"))
        );
    }

    #[test]
    fn disable_clears_en_and_waits_for_ready_to_clear() {
        let mut f = Fake::new(2);
        enable(&mut f, host_configuration(), Duration::from_secs(1)).expect("enabled");
        disable(&mut f, Duration::from_secs(1)).expect("disabled");
        assert!(!f.cc.en());
        assert!(!f.csts.rdy());
        assert_eq!(f.writes.last().map(|w| w.2), Some("CC.EN = 0"));
        // a disabled controller: nothing written
        let writes = f.writes.len();
        disable(&mut f, Duration::from_secs(1)).expect("still disabled");
        assert_eq!(f.writes.len(), writes);
        // RDY that never clears: a timeout naming disable
        enable(&mut f, host_configuration(), Duration::from_secs(1)).expect("enabled");
        f.ready_after = None;
        assert_eq!(
            disable(&mut f, Duration::from_secs(1)),
            Err(Oops::Fault(Fault::ReadyTimeout {
                during: "disable",
                ready: false,
                after: Duration::from_secs(1)
            }))
        );
    }

    #[test]
    fn shutdown_waits_for_shst_complete() {
        let mut f = Fake::new(2);
        let cc = enable(&mut f, host_configuration(), Duration::from_secs(1)).expect("enabled");
        f.shutdown_after = Some(5);
        let before = f.clock;
        shutdown(&mut f, cc, Duration::from_secs(1)).expect("shut down");
        assert_eq!(f.csts.shst(), ShutdownStatus::Complete);
        assert_eq!(f.cc.shn(), Cc::SHN_NORMAL);
        assert!(f.cc.en(), "CC.EN stays as it was");
        // complete on the fifth read of CSTS: four pauses in between
        assert_eq!(f.clock - before, Duration::from_millis(40));
    }

    #[test]
    fn shutdown_that_never_completes_times_out() {
        let mut f = Fake::new(2);
        let cc = enable(&mut f, host_configuration(), Duration::from_secs(1)).expect("enabled");
        f.shutdown_after = None;
        let limit = Duration::from_millis(300);
        assert_eq!(
            shutdown(&mut f, cc, limit),
            Err(Oops::Fault(Fault::ShutdownTimeout { after: limit }))
        );
        assert!(f.clock >= limit);
    }

    #[test]
    fn number_of_queues_decodes_what_is_granted() {
        let mut f = Fake::new(2);
        // NSQA 7 (8 SQs), NCQA 3 (4 CQs): 4 pairs
        f.answer = Ok(3 << 16 | 7);
        let granted = set_number_of_queues(&mut f, 16).expect("granted");
        assert_eq!(
            granted,
            QueuesGranted {
                submission: 8,
                completion: 4,
                pairs: 4
            }
        );
        assert_eq!(f.commands, vec![("Set Features Number of Queues", 0x09)]);
        // more than asked for: only those asked for are used
        f.answer = Ok(63 << 16 | 63);
        assert_eq!(set_number_of_queues(&mut f, 2).expect("granted").pairs, 2);
        // 0 asks for one
        assert_eq!(set_number_of_queues(&mut f, 0).expect("granted").pairs, 1);
    }

    #[test]
    fn admin_failures_keep_their_kind() {
        let mut f = Fake::new(2);
        f.answer = Err(Failed::Status(Status::INVALID_FIELD));
        assert_eq!(
            keep_alive(&mut f),
            Err(Oops::Fault(Fault::Status {
                command: "Keep Alive",
                opcode: "Keep Alive",
                status: Status::INVALID_FIELD
            }))
        );
        assert_eq!(
            identify_controller(&mut f).map(|_| ()),
            Err(Oops::Fault(Fault::Status {
                command: "Identify Controller",
                opcode: "Identify",
                status: Status::INVALID_FIELD
            }))
        );
        f.answer = Err(Failed::Transport(Oops::Lost("the wire")));
        assert_eq!(smart_log(&mut f).map(|_| ()), Err(Oops::Lost("the wire")));
        assert_eq!(
            namespaces(&mut f, "fake", 1).map(|_| ()),
            Err(Oops::Lost("the wire"))
        );
    }

    #[test]
    fn log_pages_and_identify_parse_their_data() {
        let mut f = Fake::new(2);
        let mut smart = vec![0u8; SmartLog::SIZE];
        smart[1..3].copy_from_slice(&300u16.to_le_bytes()); // composite temperature, kelvin
        f.data = smart;
        assert_eq!(
            smart_log(&mut f).expect("SMART").composite_temperature,
            300u16.to_le_bytes()
        );
        let (name, opcode) = f.commands[0];
        assert_eq!((name, opcode), ("Get Log Page SMART / Health", 0x02));

        let mut id = vec![0u8; IdentifyController::SIZE];
        id[516..520].copy_from_slice(&7u32.to_le_bytes()); // NN
        f.data = id;
        assert_eq!(identify_controller(&mut f).expect("identify").nn, 7);

        // an error log of 4 entries, one of them filled
        let mut errors = vec![0u8; 4 * ErrorLogEntry::SIZE];
        errors[ErrorLogEntry::SIZE] = 9; // error count of the second
        f.data = errors;
        f.commands.clear();
        let entries = error_log(&mut f, 3, 10).expect("error log");
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].error_count, 9);
        assert_eq!(f.commands[0].0, "Get Log Page Error Information");
    }
}

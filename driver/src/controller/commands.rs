//! The controller's admin commands as its users run them (raw, with data, log pages, events,
//! abort), and the ticketed submit / result / forget its queue pairs use for their cold paths.

use std::time::Duration;

use crate::bringup::{self, Data};
use crate::error::Error;
use crate::queue::Ticket;
use crate::spec::log::LogPageId;
use crate::spec::{ErrorLogEntry, FirmwareSlotLog, SmartLog, Sqe, Status};

use super::admin::{AsyncEvent, Outcome, KEPT_EVENTS};
use super::registers::AdminAccess;
use super::Controller;

impl Controller {
    /// Submits an admin command without waiting for it: the reactor's way (re-creating queues,
    /// aborting). `Ok(None)` when another thread holds the admin queue right now, it is full, or
    /// the controller has left `generation` (a reset voids what was submitted before it): try
    /// again later. The outcome comes from [`Controller::admin_result`].
    pub(crate) fn submit_admin(&self, sqe: Sqe, generation: u64) -> Result<Option<Ticket>, Error> {
        let s = &self.shared;
        let Some(mut admin) = s.admin.try_lock() else {
            return Ok(None);
        };
        // A reset ends only under this lock: checked here, the command is voided by the reset
        // the caller will notice, or the controller is still at `generation`.
        if self.generation() != generation {
            return Ok(None);
        }
        admin.submit(&s.name, sqe)
    }

    /// The outcome of the command of `ticket`, once known: CQE dword 0, or why it failed (a
    /// ticket voided by a reset fails with "Command Aborted By Host"). Polls the admin queue once
    /// unless another thread holds it (that thread files the completion then). Never waits.
    pub(crate) fn admin_result(&self, ticket: Ticket) -> Option<Result<u32, Error>> {
        let s = &self.shared;
        let mut admin = s.admin.try_lock()?;
        s.progress(&mut admin);
        let command = admin
            .waiting
            .iter()
            .find(|w| w.ticket == ticket)
            .map_or("admin command", |w| w.command);
        let failed = |status| Error::Command {
            device: s.name.clone(),
            command,
            status,
        };
        match admin.take(ticket) {
            Ok(None) => None,
            Ok(Some(Outcome::Done { status, dw0 })) if status.is_success() => Some(Ok(dw0)),
            Ok(Some(Outcome::Done { status, .. })) => Some(Err(failed(status))),
            Ok(Some(Outcome::TimedOut)) => Some(Err(Error::Timeout {
                device: s.name.clone(),
                what: command.into(),
                after: s.options.admin_timeout,
            })),
            Err(()) => Some(Err(failed(Status::ABORTED_BY_HOST))),
        }
    }

    /// Nobody will ask for the outcome of `ticket`. (If the admin lock is busy, `expire` drops
    /// it later.)
    pub(crate) fn forget_admin(&self, ticket: Ticket) {
        if let Some(mut admin) = self.shared.admin.try_lock() {
            admin.forget(ticket);
        }
    }

    /// Runs one admin command without data; returns CQE dword 0.
    pub fn admin(&self, sqe: Sqe) -> Result<u32, Error> {
        self.admin_waiting(sqe, self.shared.options.admin_timeout)
    }

    /// Runs one admin command without data that may take up to `timeout` (Format NVM, a
    /// sanitize); returns CQE dword 0.
    pub fn admin_waiting(&self, sqe: Sqe, timeout: Duration) -> Result<u32, Error> {
        let s = &self.shared;
        let mut admin = s.admin.lock();
        let result = admin.execute(&s.name, &*s.regs, sqe, Data::None, timeout);
        s.progress(&mut admin);
        result
    }

    /// Runs one admin command that sends `data` (at most 16 KiB) to the controller; returns
    /// CQE dword 0.
    pub fn admin_write(&self, sqe: Sqe, data: &[u8]) -> Result<u32, Error> {
        let s = &self.shared;
        let mut admin = s.admin.lock();
        let result = admin.execute(
            &s.name,
            &*s.regs,
            sqe,
            Data::ToController(data),
            s.options.admin_timeout,
        );
        s.progress(&mut admin);
        result
    }

    /// Runs one admin command that reads `len` bytes (at most 16 KiB) from the controller.
    pub fn admin_read(&self, sqe: Sqe, len: usize) -> Result<(u32, Vec<u8>), Error> {
        let s = &self.shared;
        let mut buf = vec![0u8; len];
        let mut admin = s.admin.lock();
        let result = admin.execute(
            &s.name,
            &*s.regs,
            sqe,
            Data::FromController(&mut buf),
            s.options.admin_timeout,
        );
        s.progress(&mut admin);
        Ok((result?, buf))
    }

    /// Runs `job` on the admin queue (as the shared controller logic sees it), then moves the
    /// queue deletions on.
    pub(super) fn with_admin<T>(
        &self,
        job: impl FnOnce(&mut AdminAccess<'_>) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let s = &self.shared;
        let mut admin = s.admin.lock();
        let result = job(&mut AdminAccess {
            name: &s.name,
            regs: &*s.regs,
            admin: &mut admin,
            timeout: s.options.admin_timeout,
        });
        s.progress(&mut admin);
        result
    }

    /// The asynchronous events the controller reported since the last call (each also logged
    /// as it came); the log page of each is read, which clears it (the controller then reports
    /// the next of its kind).
    pub fn events(&self) -> Vec<AsyncEvent> {
        let events = {
            let s = &self.shared;
            let mut admin = s.admin.lock();
            s.progress(&mut admin);
            if admin.events.len() >= KEPT_EVENTS && admin.async_event.is_none() {
                let aer = Sqe::async_event_request();
                admin.async_event = admin.submit(&s.name, aer).ok().flatten();
            }
            std::mem::take(&mut admin.events)
        };
        for e in &events {
            let read = Sqe::get_log_page_raw(e.log_page, u32::MAX, 512, 0);
            if let Err(err) = self.admin_read(read, 512) {
                log::debug!(
                    "{}: log page {:#04x} of {e}: {err}",
                    self.name(),
                    e.log_page
                );
            }
        }
        events
    }

    /// A log page of `len` bytes (namespace 0xffffffff for controller-wide ones).
    pub fn log_page(&self, lid: LogPageId, nsid: u32, len: usize) -> Result<Vec<u8>, Error> {
        self.with_admin(|a| bringup::log_page(a, "Get Log Page", lid, nsid, len))
    }

    /// SMART / Health Information, controller wide.
    pub fn smart_log(&self) -> Result<SmartLog, Error> {
        self.with_admin(|a| bringup::smart_log(a))
    }

    /// The newest `count` Error Information entries (fewer if the controller keeps fewer).
    pub fn error_log(&self, count: usize) -> Result<Vec<ErrorLogEntry>, Error> {
        let elpe = self.shared.identify.elpe;
        self.with_admin(|a| bringup::error_log(a, elpe, count))
    }

    pub fn firmware_log(&self) -> Result<FirmwareSlotLog, Error> {
        self.with_admin(|a| bringup::firmware_log(a))
    }

    /// Keep Alive (a PCIe controller needs none; for a controller that sets KAS anyway).
    pub fn keep_alive(&self) -> Result<(), Error> {
        self.with_admin(|a| bringup::keep_alive(a))
    }

    /// Asks the controller to abort command `cid` on submission queue `sqid`. Returns whether it
    /// was aborted (CQE dword 0 bit 0 clear).
    pub fn abort(&self, sqid: u16, cid: u16) -> Result<bool, Error> {
        Ok(self.admin(Sqe::abort(sqid, cid))? & 1 == 0)
    }
}

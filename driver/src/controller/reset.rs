//! Controller reset: started from a queue pair's reactor (on a thread of its own) or waited
//! for; it voids every queue and command, then brings the admin queue up again.

use std::sync::atomic::Ordering;

use vm_memory::Bytes;

use crate::bringup::{self, Data};
use crate::error::Error;
use crate::prp::PAGE;
use crate::spec::{Sqe, Status};

use super::admin::Admin;
use super::registers::{disable, enable, AdminAccess};
use super::{invalid, Controller};

impl Controller {
    /// Marks a reset as under way (the generation turns odd) unless one already is; returns
    /// whether this call did. From then on queue pairs ring no doorbells and wait.
    fn begin_reset(&self) -> bool {
        self.shared
            .generation
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |g| {
                (g % 2 == 0).then_some(g + 1)
            })
            .is_ok()
    }

    /// Starts a reset and returns at once (a reactor that found a stuck command must not wait
    /// seconds for CAP.TO): the reset runs on a thread of its own; the queue pairs of every
    /// reactor stop using their queues now and re-create them on their first poll after it.
    pub fn start_reset(&self) {
        if !self.begin_reset() {
            return; // one is under way already
        }
        let ctrl = self.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("reset {}", self.shared.name))
            .spawn(move || {
                if let Err(e) = ctrl.run_reset() {
                    log::error!("{}: reset failed: {e}", ctrl.name());
                }
            });
        if let Err(e) = spawned {
            log::error!(
                "{}: no thread for the reset ({e}): resetting here",
                self.shared.name
            );
            if let Err(e) = self.run_reset() {
                log::error!("{}: reset failed: {e}", self.shared.name);
            }
        }
    }

    /// Resets the controller and waits for it (after a fatal status, a command that an abort
    /// did not end, or on request): disable, bring the admin queue up again, renegotiate queues
    /// and shadow doorbells. Every queue pair then fails its commands in flight with "Command
    /// Aborted By Host" and re-creates its queues on its next poll.
    pub fn reset(&self) -> Result<(), Error> {
        self.begin_reset();
        self.run_reset()
    }

    /// The reset itself, under the admin lock; the generation is odd throughout and even after,
    /// also when it fails (then `failed` is set and the queue pairs give up).
    fn run_reset(&self) -> Result<(), Error> {
        let s = &self.shared;
        let mut admin = s.admin.lock();
        // (a reset asked for after the previous one ended: odd again)
        self.begin_reset();
        // Every queue and command goes with the reset: tickets are void, deletions are done.
        admin.waiting.clear();
        let handed = std::mem::take(&mut *s.handoff.lock());
        for d in admin.deletions.drain(..).chain(handed) {
            s.free_qid(d.qid);
        }
        let result = self.reset_steps(&mut admin);
        s.failed.store(result.is_err(), Ordering::Release);
        s.generation.fetch_add(1, Ordering::AcqRel);
        // Owners asleep until an interrupt learn of the reset on their next poll: wake them.
        s.raise_interrupts();
        result
    }

    fn reset_steps(&self, admin: &mut Admin) -> Result<(), Error> {
        let s = &self.shared;
        log::warn!("{}: resetting the controller", s.name);
        let regs = &*s.regs;
        disable(&s.name, regs, s.ready_timeout)?;
        admin.queue.fail_all(Status::ABORTED_BY_HOST, &mut |_| {});
        admin.queue.reset_rings();
        enable(&s.name, regs, &admin.queue, s.ready_timeout)?;
        let mut path = AdminAccess {
            name: &s.name,
            regs,
            admin: &mut *admin,
            timeout: s.options.admin_timeout,
        };
        let granted = bringup::set_number_of_queues(&mut path, s.options.io_queues)?;
        let pairs = granted.submission.min(granted.completion);
        if pairs < s.granted as u32 {
            log::warn!(
                "{}: after the reset only {pairs} I/O queues are granted",
                s.name
            );
        }
        if let Some(pages) = &s.shadow {
            let zeroes = vec![0u8; pages.len()];
            pages
                .slice(0, zeroes.len())
                .and_then(|p| p.write_slice(&zeroes, 0))
                .map_err(|_| invalid(&s.name, "shadow doorbells"))?;
            let sqe = Sqe::doorbell_buffer_config(pages.iova(), pages.iova_of(PAGE as usize));
            admin.execute(&s.name, regs, sqe, Data::None, s.options.admin_timeout)?;
        }
        admin.arm_async_events(&s.name, regs, s.options.admin_timeout);
        Ok(())
    }
}

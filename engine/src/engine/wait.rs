//! The reactor's one wait: an epoll set of its devices' interrupts and of what its job watches
//! (sockets, eventfds). A job that has nothing to do calls [`ReactorContext::wait`] (polling,
//! adaptive and interrupt-driven jobs alike); perf, serve and the tests' jobs have no epoll of
//! their own.
//!
//! Interrupts are watched edge-triggered and never read: each MSI-X interrupt wakes every
//! reactor whose queue pair is on that vector once. A controller with fewer vectors than queue
//! pairs puts several on one vector, perhaps of several reactors; a reactor that read the
//! shared eventfd empty would eat the others' wake-ups. A wake-up that finds none of its own
//! completions costs one turn. What a job watches is level-triggered: a socket left with bytes
//! unread is reported again.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};

use super::DeviceChannel;

/// The token [`ReactorContext::wait`](super::ReactorContext::wait) reports a device's
/// interrupt with (a job's tokens are its own,
/// below this).
pub const INTERRUPT: u64 = u64::MAX;

/// Events taken per wait (more are taken at the next).
const EVENTS: usize = 256;

/// A reactor's epoll set and the buffer its events come into.
#[derive(Debug)]
pub struct Wait {
    epoll: Epoll,
    events: Vec<EpollEvent>,
}

impl Wait {
    pub fn new() -> std::io::Result<Wait> {
        Ok(Wait {
            epoll: Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?,
            events: vec![EpollEvent::empty(); EVENTS],
        })
    }

    /// Watches device `d`'s interrupts (none unless its queue pairs raise them; one a
    /// controller's namespaces share is watched once).
    pub fn watch_interrupts(&self, d: &DeviceChannel) -> Result<(), String> {
        let edge = EpollEvent::new(EpollFlags::EPOLLIN | EpollFlags::EPOLLET, INTERRUPT);
        for fd in d.interrupts() {
            match self.epoll.add(fd, edge) {
                Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
                Err(e) => return Err(format!("{}: cannot watch its interrupt: {e}", d.info.name)),
            }
        }
        Ok(())
    }

    /// Stops watching device `d`'s interrupts but those `others` still use (it is let go of).
    pub fn unwatch_interrupts(&self, d: &DeviceChannel, others: &[&DeviceChannel]) {
        let in_use: Vec<i32> = others
            .iter()
            .flat_map(|o| o.interrupts())
            .map(|fd| fd.as_raw_fd())
            .collect();
        for fd in d.interrupts() {
            if !in_use.contains(&fd.as_raw_fd()) {
                let _ = self.epoll.delete(fd);
            }
        }
    }

    /// Watches `fd` for input, reported as `token` while there is some.
    pub fn watch(&self, fd: BorrowedFd<'_>, token: u64) -> std::io::Result<()> {
        let interest = EpollEvent::new(EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP, token);
        self.epoll.add(fd, interest).map_err(std::io::Error::from)
    }

    pub fn unwatch(&self, fd: BorrowedFd<'_>) {
        let _ = self.epoll.delete(fd);
    }

    /// Waits at most `timeout` (zero: only looks) for news, and hands each token that has some
    /// to `on`; returns how many there were.
    pub fn wait(&mut self, timeout: Duration, mut on: impl FnMut(u64)) -> usize {
        let timeout = EpollTimeout::try_from(timeout).unwrap_or(EpollTimeout::MAX);
        let n = self.epoll.wait(&mut self.events, timeout).unwrap_or(0);
        for event in &self.events[..n] {
            on(event.data());
        }
        n
    }
}

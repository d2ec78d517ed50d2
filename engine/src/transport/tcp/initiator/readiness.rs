//! Which of a thread's NVMe/TCP queue sockets have something to read, found with one
//! `epoll_wait` per turn for all of them: a reactor with eight queues to a target would
//! otherwise ask each socket with a `readv` every turn, most of them answering "nothing yet"
//! (SPDK's posix socket group does the same with its `epoll_wait`).
//!
//! A queue joins its polling thread's watch on its first turn there ([`Watched::join`]) and
//! asks [`Watched::readable`] before it reads: the first question of a turn (the turn named
//! by the owner's clock reading) waits on the thread's epoll without a timeout, level
//! triggered, so a socket left with bytes in it is reported again the next turn; a queue that
//! asks twice in one turn (polled in a loop) gets a new wait, so it never waits on a stale
//! answer. Where anything is off (no epoll, a queue polled from another thread than it joined
//! on), the answer is "readable": the queue reads as it would without the watch.

use std::cell::RefCell;
use std::os::fd::{AsFd, BorrowedFd};
use std::thread::{self, ThreadId};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};

thread_local! {
    static WATCH: RefCell<Watch> = const { RefCell::new(Watch::new()) };
}

/// A thread's sockets, by slot.
#[derive(Debug)]
struct Watch {
    epoll: Option<Epoll>,
    /// None: a free slot.
    slots: Vec<Option<Slot>>,
    /// Sockets in the watch.
    members: usize,
    /// As many as there are slots: one wait reports every socket.
    events: Vec<EpollEvent>,
    /// The turn the last wait was for.
    turn: Option<u64>,
}

/// One socket in the watch.
#[derive(Debug, Clone, Copy)]
struct Slot {
    /// Reported readable by the last wait, and not yet asked about.
    ready: bool,
    /// The turn it last asked in.
    asked: Option<u64>,
}

impl Watch {
    const fn new() -> Watch {
        Watch {
            epoll: None,
            slots: Vec::new(),
            members: 0,
            events: Vec::new(),
            turn: None,
        }
    }

    /// One wait, no timeout: marks the sockets that have something.
    fn wait(&mut self) {
        let Some(epoll) = &self.epoll else {
            return;
        };
        match epoll.wait(&mut self.events, EpollTimeout::ZERO) {
            Ok(n) => {
                for e in &self.events[..n] {
                    if let Some(Some(slot)) = self.slots.get_mut(e.data() as usize) {
                        slot.ready = true;
                    }
                }
            }
            // (interrupted, or worse: every socket is asked, as without the watch)
            Err(_) => self.slots.iter_mut().flatten().for_each(|s| s.ready = true),
        }
    }
}

/// A socket's place in the watch of the thread it joined on.
#[derive(Debug)]
pub struct Watched {
    slot: usize,
    thread: ThreadId,
}

impl Watched {
    /// Adds `fd` to this thread's watch; None where epoll refuses it (the queue then reads
    /// every turn).
    pub fn join(fd: BorrowedFd<'_>) -> Option<Watched> {
        WATCH.with(|w| {
            let mut w = w.borrow_mut();
            if w.epoll.is_none() {
                w.epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).ok();
            }
            let slot = w.slots.iter().position(Option::is_none);
            let slot = slot.unwrap_or(w.slots.len());
            let interest = EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP;
            w.epoll
                .as_ref()?
                .add(fd, EpollEvent::new(interest, slot as u64))
                .ok()?;
            // (asked once whatever the next wait says: bytes may have come before it joined)
            let new = Some(Slot {
                ready: true,
                asked: None,
            });
            if slot == w.slots.len() {
                w.slots.push(new);
                w.events.push(EpollEvent::empty());
            } else {
                w.slots[slot] = new;
            }
            w.members += 1;
            Some(Watched {
                slot,
                thread: thread::current().id(),
            })
        })
    }

    /// Whether the socket may have something to read in turn `turn` (the owner's clock
    /// reading for it). Each answer "yes" is given once per wait. A queue that asks again in
    /// the same turn (its owner polls it in a loop) gets a new wait: the turn's first answer
    /// is never the last one it gets.
    pub fn readable(&self, turn: u64) -> bool {
        if thread::current().id() != self.thread {
            return true;
        }
        WATCH.with(|w| {
            let mut w = w.borrow_mut();
            if w.members < 2 {
                // alone: a read asks as much as a wait would
                return true;
            }
            let Some(Some(slot)) = w.slots.get(self.slot).copied() else {
                return true;
            };
            if w.turn != Some(turn) || slot.asked == Some(turn) {
                w.turn = Some(turn);
                w.wait();
            }
            let Some(Some(slot)) = w.slots.get_mut(self.slot) else {
                return true;
            };
            slot.asked = Some(turn);
            std::mem::take(&mut slot.ready)
        })
    }

    /// Leaves the watch (before the socket closes); from another thread, the socket's closing
    /// takes it out of that thread's epoll, and its slot stays taken.
    pub fn leave(self, fd: impl AsFd) {
        if thread::current().id() != self.thread {
            return;
        }
        WATCH.with(|w| {
            let mut w = w.borrow_mut();
            if let Some(epoll) = &w.epoll {
                let _ = epoll.delete(fd);
            }
            if let Some(slot) = w.slots.get_mut(self.slot) {
                if slot.take().is_some() {
                    w.members -= 1;
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_socket_is_readable_in_the_turns_it_has_bytes_and_only_then() {
        let (mut near, far) = UnixStream::pair().expect("pair");
        let (_near2, far2) = UnixStream::pair().expect("pair");
        let a = Watched::join(far.as_fd()).expect("joined");
        let b = Watched::join(far2.as_fd()).expect("joined");
        // (a new member is asked once, whatever the wait said)
        assert!(a.readable(1) && b.readable(1));
        assert!(!a.readable(2) && !b.readable(2), "nothing sent yet");
        near.write_all(b"x").expect("write");
        assert!(!b.readable(3), "the other socket has nothing");
        assert!(a.readable(3), "the turn's wait sees the byte");
        assert!(a.readable(4), "unread bytes are reported again");
        let (mut near3, far3) = UnixStream::pair().expect("pair");
        let d = Watched::join(far3.as_fd()).expect("joined");
        assert!(d.readable(5), "new: asked once whatever the wait said");
        assert!(
            !b.readable(5),
            "another socket in the same turn: that turn's wait"
        );
        assert!(
            !d.readable(5),
            "asked again in its turn: a new wait, nothing there"
        );
        near3.write_all(b"y").expect("write");
        assert!(
            d.readable(5),
            "asked again in its turn: the new wait sees the byte"
        );
        d.leave(far3.as_fd());
        a.leave(far.as_fd());
        let c = Watched::join(far.as_fd()).expect("joined again");
        assert!(
            c.readable(5) && c.readable(6),
            "the slot is reused, the byte still there"
        );
        c.leave(far.as_fd());
        b.leave(far2.as_fd());
    }

    #[test]
    fn a_lone_socket_and_another_thread_always_read() {
        let (_near, far) = UnixStream::pair().expect("pair");
        let watched = Watched::join(far.as_fd()).expect("joined");
        assert!(watched.readable(1) && watched.readable(2), "alone: no wait");
        let (_near2, far2) = UnixStream::pair().expect("pair");
        let other = Watched::join(far2.as_fd()).expect("joined");
        assert!(watched.readable(3));
        assert!(!watched.readable(4), "two: the wait decides");
        let watched = std::thread::spawn(move || {
            assert!(watched.readable(3), "not this thread's watch: read");
            watched
        })
        .join()
        .expect("the thread");
        watched.leave(far.as_fd());
        other.leave(far2.as_fd());
    }
}

//! The kernel's device events (uevents, on a `NETLINK_KOBJECT_UEVENT` socket): how a running
//! target learns that an NVMe controller was bound to vfio-pci (a drive hot added, or handed
//! over with `usnvme setup bind`) or let go by it.
//!
//! Only the kernel's own messages are read (multicast group 1: `ACTION@DEVPATH`, then
//! `KEY=VALUE` fields, each ended by a NUL), not udev's re-broadcasts.

use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    bind, recv, socket, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType,
};

use super::{PciAddress, NVME_CLASS};

/// The kernel's multicast group of uevents.
const KERNEL_GROUP: u32 = 1;
/// The longest uevent message (the kernel's UEVENT_BUFFER_SIZE).
const MESSAGE_BYTES: usize = 2048;

/// What happened to a PCI function, as far as a target cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PciEvent {
    /// An NVMe controller was bound to vfio-pci: it can be opened now.
    BoundToVfio(PciAddress),
    /// A function was unbound from its driver or removed.
    Gone(PciAddress),
}

/// A PCI uevent as a [`PciEvent`]; None for anything else (other subsystems, other drivers,
/// other classes, `add`, `change`, malformed messages).
pub fn parse(message: &[u8]) -> Option<PciEvent> {
    let mut fields = message.split(|&b| b == 0).skip(1); // `ACTION@DEVPATH` first
    let (mut action, mut subsystem, mut driver, mut class, mut slot) =
        (None, None, None, None, None);
    for field in fields.by_ref() {
        let Ok(field) = std::str::from_utf8(field) else {
            continue;
        };
        let Some((key, value)) = field.split_once('=') else {
            continue;
        };
        match key {
            "ACTION" => action = Some(value),
            "SUBSYSTEM" => subsystem = Some(value),
            "DRIVER" => driver = Some(value),
            "PCI_CLASS" => class = u32::from_str_radix(value, 16).ok(),
            "PCI_SLOT_NAME" => slot = value.parse::<PciAddress>().ok(),
            _ => {}
        }
    }
    if subsystem != Some("pci") {
        return None;
    }
    let slot = slot?;
    match action? {
        "bind" if driver == Some("vfio-pci") && class? >> 8 == NVME_CLASS => {
            Some(PciEvent::BoundToVfio(slot))
        }
        "unbind" | "remove" => Some(PciEvent::Gone(slot)),
        _ => None,
    }
}

/// A socket on the kernel's uevents.
#[derive(Debug)]
pub struct UeventSocket {
    fd: OwnedFd,
    buffer: Vec<u8>,
}

impl UeventSocket {
    /// Opens the socket (root, or CAP_NET_ADMIN on some kernels). Events from then on are
    /// seen; those before are not (list sysfs after opening it, not before).
    pub fn open() -> std::io::Result<UeventSocket> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            SockProtocol::NetlinkKObjectUEvent,
        )?;
        bind(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &NetlinkAddr::new(0, KERNEL_GROUP),
        )?;
        Ok(UeventSocket {
            fd,
            buffer: vec![0; MESSAGE_BYTES],
        })
    }

    /// The next PCI event, waiting for it at most `at_most`; None when none came (other
    /// uevents are read and skipped).
    pub fn next(&mut self, at_most: Duration) -> std::io::Result<Option<PciEvent>> {
        let deadline = std::time::Instant::now() + at_most;
        loop {
            match recv(
                std::os::fd::AsRawFd::as_raw_fd(&self.fd),
                &mut self.buffer,
                MsgFlags::empty(),
            ) {
                Ok(n) => match parse(&self.buffer[..n]) {
                    Some(event) => return Ok(Some(event)),
                    None => continue,
                },
                Err(nix::errno::Errno::EAGAIN) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                // the kernel dropped messages for us (a burst): the caller looks at sysfs anyway
                Err(nix::errno::Errno::ENOBUFS) => continue,
                Err(e) => return Err(e.into()),
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let ms = u16::try_from(left.as_millis().max(1)).unwrap_or(u16::MAX);
            let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(fields: &[&str]) -> Vec<u8> {
        let mut m = b"bind@/devices/pci0000:00/0000:00:02.0/0000:01:00.0".to_vec();
        for f in fields {
            m.push(0);
            m.extend_from_slice(f.as_bytes());
        }
        m.push(0);
        m
    }

    #[test]
    fn an_nvme_function_bound_to_vfio_pci_is_an_insert_and_an_unbind_or_remove_a_removal() {
        let addr: PciAddress = "0000:01:00.0".parse().expect("an address");
        let bind = |driver: &str, class: &str| {
            message(&[
                "ACTION=bind",
                "DEVPATH=/devices/pci0000:00/0000:00:02.0/0000:01:00.0",
                "SUBSYSTEM=pci",
                &format!("DRIVER={driver}"),
                &format!("PCI_CLASS={class}"),
                "PCI_ID=1B36:0010",
                "PCI_SLOT_NAME=0000:01:00.0",
                "SEQNUM=2211",
            ])
        };
        assert_eq!(
            parse(&bind("vfio-pci", "10802")),
            Some(PciEvent::BoundToVfio(addr))
        );
        // the kernel's nvme driver, or a network card on vfio-pci: not ours
        assert_eq!(parse(&bind("nvme", "10802")), None);
        assert_eq!(parse(&bind("vfio-pci", "20000")), None);
        for action in ["unbind", "remove"] {
            let gone = message(&[
                &format!("ACTION={action}"),
                "SUBSYSTEM=pci",
                "PCI_SLOT_NAME=0000:01:00.0",
            ]);
            assert_eq!(parse(&gone), Some(PciEvent::Gone(addr)), "{action}");
        }
        // other subsystems, other actions, and what is not a uevent at all
        let block = message(&[
            "ACTION=remove",
            "SUBSYSTEM=block",
            "PCI_SLOT_NAME=0000:01:00.0",
        ]);
        assert_eq!(parse(&block), None);
        let add = message(&["ACTION=add", "SUBSYSTEM=pci", "PCI_SLOT_NAME=0000:01:00.0"]);
        assert_eq!(parse(&add), None);
        let no_slot = message(&["ACTION=unbind", "SUBSYSTEM=pci"]);
        assert_eq!(parse(&no_slot), None);
        assert_eq!(parse(b""), None);
        assert_eq!(parse(&[0xff; 64]), None);
    }
}

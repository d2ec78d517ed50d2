//! NVMe specification types: controller registers, submission and completion queue entries,
//! status codes, Identify data structures and log pages.
//!
//! Source: NVM Express Base Specification 2.0 and NVM Command Set Specification 1.0. Field names
//! are the specification's mnemonics in lower case, so a reader can look them up.
//!
//! Every structure that travels through memory between host and controller is a `#[repr(C)]`
//! struct of integers and byte arrays whose size and key offsets are asserted at compile time.
//! None has padding, so each is plain old data ([`Pod`]): it is read from and written to bytes
//! with `from_bytes` / `as_bytes`, and implements `vm_memory::ByteValued` so rings can be
//! accessed with `read_obj` / `write_obj`. NVMe is little-endian and the structs hold native
//! integers, so this module builds only for little-endian targets (x86_64, aarch64).

#[cfg(target_endian = "big")]
compile_error!("usnvme spec types assume a little-endian host, as NVMe data structures are");

/// For `#[repr(C)]` structs that derive zerocopy's `FromBytes`, `IntoBytes` and `Immutable`
/// (which prove at compile time that any bytes form a valid value and that no byte is padding,
/// so a `bool` field or a gap between fields does not compile): asserts their size, marks them
/// `vm_memory::ByteValued` and gives each `SIZE`, `from_bytes`, `from_slice`, `as_bytes` and
/// `zeroed`.
macro_rules! pod {
    ($($ty:ident = $size:literal),* $(,)?) => {$(
        const _: () = assert!(core::mem::size_of::<$ty>() == $size);

        // SAFETY: any bytes form a valid `$ty` and no byte of one is padding: `from_bytes` and
        // `as_bytes` below compile only because its zerocopy derives prove exactly that.
        unsafe impl vm_memory::ByteValued for $ty {}

        impl $ty {
            /// Size of the structure on the wire, in bytes.
            pub const SIZE: usize = $size;

            /// Decodes the structure from its little-endian wire representation.
            pub fn from_bytes(bytes: &[u8; $size]) -> Self {
                zerocopy::transmute!(*bytes)
            }

            /// Like [`Self::from_bytes`], for a slice; `None` unless it is exactly `SIZE` bytes.
            pub fn from_slice(bytes: &[u8]) -> Option<Self> {
                <&[u8; $size]>::try_from(bytes).ok().map(Self::from_bytes)
            }

            /// The wire representation of the structure.
            pub fn as_bytes(&self) -> &[u8; $size] {
                zerocopy::transmute_ref!(self)
            }

            /// An all-zero value (every reserved field zero, as the specification wants).
            pub fn zeroed() -> Self {
                Self::from_bytes(&[0; $size])
            }
        }
    )*};
}

/// A `#[repr($repr)]` enum of specification code points with `from_raw`, `name` (the
/// specification's name) and `From<Enum> for $repr`.
macro_rules! spec_enum {
    ($(#[$meta:meta])* pub enum $name:ident: $repr:ident {
        $($(#[$vmeta:meta])* $variant:ident = $value:literal => $text:literal,)*
    }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr($repr)]
        pub enum $name {
            $($(#[$vmeta])* #[doc = $text] $variant = $value,)*
        }

        impl $name {
            /// Decodes a raw value; `None` for values this crate does not name.
            pub const fn from_raw(value: $repr) -> Option<Self> {
                match value {
                    $($value => Some(Self::$variant),)*
                    _ => None,
                }
            }

            /// The name the NVMe specification gives this value.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => $text,)*
                }
            }
        }

        impl From<$name> for $repr {
            fn from(value: $name) -> $repr {
                value as $repr
            }
        }

        impl core::fmt::Display for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

/// A bit-flag newtype with one constant per flag and `contains` / `names`.
macro_rules! spec_flags {
    ($(#[$meta:meta])* pub struct $name:ident($repr:ty) {
        $($flag:ident = $bit:literal => $text:literal,)*
    }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name(pub $repr);

        impl $name {
            $(#[doc = $text] pub const $flag: $repr = 1 << $bit;)*
            const NAMES: &'static [($repr, &'static str)] = &[$((1 << $bit, $text),)*];

            /// Whether every bit of `flags` is set.
            pub const fn contains(self, flags: $repr) -> bool {
                self.0 & flags == flags
            }

            /// Names of the flags that are set, in bit order.
            pub fn names(self) -> impl Iterator<Item = &'static str> {
                Self::NAMES.iter().filter(move |(bit, _)| self.0 & bit != 0).map(|(_, name)| *name)
            }
        }
    };
}

pub mod command;
pub mod completion;
pub mod fabrics;
pub mod identify;
pub mod log;
pub mod rdma;
pub mod registers;
pub mod status;

pub use command::{AdminOpcode, DsmRange, IoOpcode, SglDescriptor, Sqe};
pub use completion::Cqe;
pub use fabrics::{
    ConnectCommand, ConnectData, ConnectResponse, DiscoveryLogEntry, DiscoveryLogHeader,
    FabricsType, PropertyCommand, PropertySize,
};
pub use identify::{IdentifyController, IdentifyNamespace, LbaFormat, NamespaceList};
pub use log::{ErrorLogEntry, FirmwareSlotLog, LogPageId, SmartLog};
pub use registers::{Aqa, Cap, Cc, Csts, Vs};
pub use status::{Status, StatusCodeType};

/// Decodes a fixed-width ASCII field: non-printable bytes become `?`, NULs and surrounding
/// spaces are dropped.
pub(crate) fn ascii_field(bytes: &[u8]) -> String {
    let text: String = bytes
        .iter()
        .map(|&b| match b {
            0 => ' ',
            0x20..=0x7e => char::from(b),
            _ => '?',
        })
        .collect();
    text.trim().to_owned()
}

/// Writes `text` into a fixed-width ASCII field, space-padded and truncated to fit;
/// non-ASCII characters become `?`.
pub fn put_ascii(field: &mut [u8], text: &str) {
    let mut chars = text.chars().map(|c| {
        if c.is_ascii() && !c.is_ascii_control() {
            c as u8
        } else {
            b'?'
        }
    });
    for byte in field.iter_mut() {
        *byte = chars.next().unwrap_or(b' ');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ascii_fields_trim_and_replace() {
        assert_eq!(ascii_field(b"  S123 \0\0"), "S123");
        assert_eq!(ascii_field(b"A\xffB\x01 "), "A?B?");
        let mut field = [0u8; 6];
        put_ascii(&mut field, "QEMU\u{e9}");
        assert_eq!(&field, b"QEMU? ");
        put_ascii(&mut field, "longer than six");
        assert_eq!(&field, b"longer");
    }

    #[test]
    fn pod_round_trip_and_slice_length() {
        let mut sqe = Sqe::read(1, 0x1234, 8);
        sqe.set_cid(7);
        let copy = Sqe::from_bytes(sqe.as_bytes());
        assert_eq!(copy, sqe);
        assert_eq!(Sqe::from_slice(&sqe.as_bytes()[..63]), None);
        assert_eq!(Sqe::from_slice(sqe.as_bytes()), Some(sqe));
        assert_eq!(Cqe::zeroed(), Cqe::default());
    }
}

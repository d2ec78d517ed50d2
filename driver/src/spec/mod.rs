//! NVMe specification types.

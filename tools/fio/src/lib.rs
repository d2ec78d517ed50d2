//! usnvme as a fio ioengine (`ioengine=external:…/libusnvme_fio.so`, `thread=1`).
//!
//! Two halves: `shim.c`, compiled against the headers of the fio that loads the engine
//! (`cargo xtask fio-engine` fetches that exact version's source), fills in fio's
//! `struct ioengine_ops` and reads what the engine needs from fio's structures; and this crate,
//! which sees none of fio's structures, behind the narrow C interface of [`ffi`]:
//!
//! - [`name`]: fio file names: drives, remote subsystems, SPDK's transport IDs, namespaces.
//! - [`registry`]: the process's controllers, attached once and shared by the jobs.
//! - [`job`]: one fio job (thread): its own I/O queues, fio's buffers in DMA memory, completions.

pub mod ffi;
pub mod job;
pub mod name;
pub mod registry;

//! What the engine's allocation tests share: a global allocator that counts the allocations
//! of each thread ([`counting`]: a test binary that includes this module has it), and host PDUs
//! built by hand ([`pdus`]).

mod counting;
pub mod pdus;

pub use counting::{allocations, assert_counting};

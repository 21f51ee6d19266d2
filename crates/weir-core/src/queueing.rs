//! The multi-level queues and what drains them: one bounded lock-free
//! queue per class ([`queue`]), the token buckets whose rates the
//! allocator sets ([`token_bucket`]), batches taken out most urgent class
//! first within each bucket ([`drain`]), and the queues sized to fit a
//! memory limit ([`memory`]).

pub mod drain;
pub mod memory;
pub mod queue;
pub mod token_bucket;

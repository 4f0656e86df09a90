//! The transports every backend runs on, each with the same file set where it applies
//! (`mod.rs`, `protocol.rs`, `engine.rs`, ...):
//!
//! - `shm`: shared memory between the ranks of one host: the segment, the step machine
//!   that schedules every collective through it (sans-IO), the engine that drives that
//!   machine with `comm::progress`'s wait policy, and per-pair slots for `send`/`recv`.

pub(crate) mod shm;

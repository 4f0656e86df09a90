//! MLX's ring algorithm, shared by the backends that run it over TCP (MLX's ring, and the
//! native wire's large all-reduce): the schedule that fixes which bytes go where step by
//! step (the wire contract with MLX), the lanes that walk it as a
//! [`Machine`](super::machine::Machine) without I/O, and the page-aligned buffers the
//! reductions land in.
//!
//! - [`schedule`]: the wire contract as pure arithmetic;
//! - [`protocol`]: the lanes of each collective as a state machine without I/O;
//! - [`staging`]: page-aligned receive and partial-sum buffers, mapped before data moves;
//! - `sim` (tests): P ranks over byte queues with random chunking and cuts.

pub(crate) mod protocol;
pub(crate) mod schedule;
#[cfg(test)]
mod sim;
pub(crate) mod staging;

//! The GPU backend: driver objects, the host half of the ABI and the rings, and manifolds.

pub(crate) mod abi;
pub(crate) mod arena;
pub mod baseline;
pub(crate) mod driver;
pub(crate) mod exit;
pub(crate) mod graphs;
pub(crate) mod launched;
pub(crate) mod manifold;
pub(crate) mod plan;
pub(crate) mod queue;
#[cfg(all(test, loom))]
mod queue_loom;
pub(crate) mod signals;
pub(crate) mod watcher;
pub(crate) mod working;

pub(crate) use driver::Device;
pub(crate) use launched::Launcher;
pub(crate) use manifold::Manifold;
pub(crate) use queue::{Cell, Failure};
pub(crate) use working::WorkingMemory;

//! fedsel: federated learning built around client selection.
//!
//! The round loop lives in [`engine`]; each selection strategy is one file
//! under [`select`], each availability model one file under [`availability`].
//! See `DESIGN.md` at the repository root for how the strategies plug in.

pub mod aggregate;
pub mod availability;
pub mod bench;
pub mod checkpoint;
pub mod config;
pub mod data;
pub mod diagnostics;
pub mod digest;
pub mod engine;
pub mod error;
pub mod fuzzing;
pub mod ledger;
pub mod model;
pub mod output;
pub mod partition;
pub mod plot;
pub mod report;
pub mod rng;
pub mod select;
pub mod sspp;
pub mod summary;
pub mod sweep;
pub mod train;

/// The crate version, recorded in every output.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

//! fedsel: federated learning built around client selection.
//!
//! This is the core library: everything a run needs. Sweeps, reports and plots are in
//! the `fedsel-workbench` crate, the command line in `fedsel-cli`.
//!
//! The round loop lives in [`engine`]; each selection strategy is one file
//! under [`select`], each availability model one file under [`availability`].
//! See `DESIGN.md` at the repository root for how the strategies plug in.

pub mod aggregate;
pub mod availability;
pub mod bench;
pub mod checkpoint;
pub mod config;
pub mod cpu;
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
pub mod rng;
pub mod select;
pub mod sspp;
pub mod summary;
pub mod system;
pub mod tensorboard;
pub mod train;
pub mod validate;

/// The crate version, recorded in every output.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit this library was built from, `+dirty` appended when the workspace's
/// sources (crates, examples, the manifests) had uncommitted changes then, or `unknown`
/// for a build outside a git checkout (build.rs). Every `summary.json` records it, so that
/// a row names the code that made it without a hand-typed commit.
pub fn build_commit() -> String {
    let commit = env!("FEDSEL_GIT_COMMIT");
    match (commit.is_empty(), env!("FEDSEL_GIT_DIRTY") == "true") {
        (true, _) => "unknown".into(),
        (false, true) => format!("{commit}+dirty"),
        (false, false) => commit.into(),
    }
}

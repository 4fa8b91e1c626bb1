//! The workbench's own errors: what only a comparison of runs can get wrong, beside the core
//! library's errors (files, configs), which it passes on unchanged.

use std::path::PathBuf;

/// A config key whose value differs between the runs of a comparison: each value, with the
/// first run that has it.
#[derive(Debug, Clone, PartialEq)]
pub struct Difference {
    /// The dotted config key (`dataset.kind`).
    pub key: String,
    /// Each value (`-` where a run's config lacks the key) and the first run that has it.
    pub values: Vec<(String, PathBuf)>,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let values: Vec<String> = self
            .values
            .iter()
            .map(|(v, dir)| format!("{v} (`{}`)", dir.display()))
            .collect();
        write!(f, "`{}` is {}", self.key, values.join(" or "))
    }
}

/// A run named for a report but left out of it, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct LeftOut {
    /// The run's directory.
    pub dir: PathBuf,
    /// Why it was left out.
    pub why: String,
}

impl std::fmt::Display for LeftOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}`: {}", self.dir.display(), self.why)
    }
}

fn joined<T: std::fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(T::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Any failure of a sweep, report or plot.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The runs of a comparison are of different tasks (dataset, partition, model, targets):
    /// pairing them by seed, or their targets in one column, would mean nothing. The message
    /// names no option: the CLI adds its own.
    #[error(
        "the runs are not of one task, so their results cannot be paired: {}",
        joined(differences)
    )]
    MixedTasks {
        /// The task keys that differ, with their values.
        differences: Vec<Difference>,
    },
    /// Every run named was left out (truncated), so nothing is left to report.
    #[error("no run left to report: {}", joined(left_out))]
    NothingLeft {
        /// The runs left out, and why.
        left_out: Vec<LeftOut>,
    },
    /// An error of the core library (a file, a config).
    #[error(transparent)]
    Core(#[from] fedsel::error::Error),
}

impl From<fedsel::error::ConfigError> for Error {
    fn from(e: fedsel::error::ConfigError) -> Self {
        Error::Core(e.into())
    }
}

/// Result alias of the workbench's comparisons.
pub type Result<T, E = Error> = std::result::Result<T, E>;

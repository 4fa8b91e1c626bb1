//! Typed errors of the library. Each names the key, file or value it is about.

use std::path::PathBuf;

/// A configuration that cannot be run.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The TOML text could not be parsed.
    #[error("{source_name}: {message}")]
    Parse {
        /// The file (or `--set`) the text came from.
        source_name: String,
        /// The parser's message, which includes the key path.
        message: String,
    },
    /// A key holds a value outside its allowed range.
    #[error("config key `{key}`: {reason}")]
    Invalid {
        /// Dotted path of the offending key.
        key: String,
        /// What is wrong and what is allowed.
        reason: String,
    },
    /// A `--set` override was malformed.
    #[error("--set `{0}`: expected key=value with a dotted key")]
    BadOverride(String),
}

impl ConfigError {
    /// Shorthand for [`ConfigError::Invalid`].
    pub fn invalid(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Invalid {
            key: key.into(),
            reason: reason.into(),
        }
    }
}

/// A dataset file that is missing, truncated or corrupt.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The file does not exist or cannot be read.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        error: std::io::Error,
    },
    /// The file exists but its contents are not what the format requires.
    #[error("{path}: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What was expected and what was found.
        reason: String,
    },
    /// The dataset needs files the user has to supply.
    #[error("{dataset}: files not found under {dir}: {missing}. {hint}")]
    Missing {
        /// Dataset name.
        dataset: String,
        /// Directory searched.
        dir: PathBuf,
        /// Names of the missing files.
        missing: String,
        /// How to obtain them.
        hint: String,
    },
}

impl DataError {
    /// Shorthand for [`DataError::Corrupt`].
    pub fn corrupt(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Self::Corrupt {
            path: path.into(),
            reason: reason.into(),
        }
    }
}

/// A partition that cannot be built from the data it was given.
#[derive(Debug, thiserror::Error)]
#[error("partition `{kind}`: {reason}")]
pub struct PartitionError {
    /// The partition kind.
    pub kind: &'static str,
    /// Why it failed.
    pub reason: String,
}

/// A checkpoint that cannot be resumed from.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The run directory holds no checkpoint.
    #[error("{dir}: no checkpoint found; was the run started with checkpoint_every = 0?")]
    Missing {
        /// The checkpoint directory looked for.
        dir: PathBuf,
    },
    /// A checkpoint file exists but cannot be read.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        error: std::io::Error,
    },
    /// A checkpoint file does not hold what was written: damaged on disk, edited, or
    /// written by a fedsel that stored no checksums. Resuming from it would silently
    /// continue another run, so it is refused.
    #[error("{path}: corrupt checkpoint: {reason}")]
    Corrupt {
        /// The file at fault.
        path: PathBuf,
        /// What does not match.
        reason: String,
    },
}

/// Any failure of a run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// See [`ConfigError`].
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// See [`DataError`].
    #[error(transparent)]
    Data(#[from] DataError),
    /// See [`PartitionError`].
    #[error(transparent)]
    Partition(#[from] PartitionError),
    /// See [`CheckpointError`].
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// Writing results failed.
    #[error("{path}: {error}")]
    Output {
        /// The file being written.
        path: PathBuf,
        /// The underlying error. Not a `source` (thiserror's name for the error chain): the
        /// message already shows it, and anyhow would print a source a second time.
        error: std::io::Error,
    },
    /// A run would write into a directory that already holds files of another run. The
    /// message names no option: the CLI and the Python package each add their own.
    #[error("{}: already holds a run", dir.display())]
    RunExists {
        /// The output directory.
        dir: PathBuf,
    },
    /// Another live `fedsel sweep` holds the output directory's lock.
    #[error(
        "{}: another sweep is running into this directory ({holder}); wait for it, or use another --out",
        dir.display()
    )]
    SweepLocked {
        /// The sweep's output directory.
        dir: PathBuf,
        /// What the lock file says about its holder (process id and start time).
        holder: String,
    },
    /// A figure could not be drawn.
    #[error("{path}: {reason}")]
    Plot {
        /// The figure file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A selector could not make its choice.
    #[error("selector `{selector}` in round {round}: {reason}")]
    Selection {
        /// Selector name.
        selector: String,
        /// Round index.
        round: usize,
        /// Why.
        reason: String,
    },
    /// A client's answer to a selector's request that no selector can use: a value that is
    /// not finite, or an answer of the wrong shape. In a simulation it means the model
    /// diverged; from Python, the query object returned it; a Flower strategy drops such a
    /// node before its answer reaches the selector.
    #[error(
        "selector `{selector}` in round {round}: client {client}'s {what} is unusable: {reason}"
    )]
    Report {
        /// Selector name.
        selector: String,
        /// Round index.
        round: usize,
        /// The client whose answer it is.
        client: usize,
        /// What was asked for (`held-out loss`, `update`, ...).
        what: String,
        /// What is wrong with it, with the value.
        reason: String,
    },
    /// The caller asked the run to stop (Ctrl-C, SIGTERM); the rounds before
    /// `round` are written and readable.
    #[error("interrupted after round {round}; the rounds so far are written")]
    Interrupted {
        /// The last round finished.
        round: usize,
    },
    /// The global model stopped being finite.
    #[error(
        "round {round}: the global model is no longer finite ({what}); lower the learning rate"
    )]
    Diverged {
        /// Round index.
        round: usize,
        /// Which quantity was non-finite.
        what: String,
    },
}

/// Result alias of the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A CSV reader over `bytes` whose header must be `header` (cells trimmed); otherwise an
/// error naming the file `path` and the header found (the availability trace, device
/// profiles).
pub(crate) fn csv_with_header<'b>(
    path: &std::path::Path,
    bytes: &'b [u8],
    header: &[&str],
) -> std::result::Result<csv::Reader<&'b [u8]>, DataError> {
    let mut reader = csv::Reader::from_reader(bytes);
    let found = reader
        .headers()
        .map_err(|e| DataError::corrupt(path, format!("unreadable header: {e}")))?;
    if found.iter().map(str::trim).ne(header.iter().copied()) {
        return Err(DataError::corrupt(
            path,
            format!(
                "the header must be `{}`, found `{}`",
                header.join(","),
                found.iter().collect::<Vec<_>>().join(",")
            ),
        ));
    }
    Ok(reader)
}

/// Reads a whole file, naming it on failure (the data loaders and the availability trace).
pub(crate) fn read_file(path: &std::path::Path) -> std::result::Result<Vec<u8>, DataError> {
    std::fs::read(path).map_err(|error| DataError::Io {
        path: path.to_path_buf(),
        error,
    })
}

//! Where dataset files are looked for.
//!
//! Precedence: the `--data-dir` flag, then the config's `data_dir`, then the
//! `FEDSEL_DATA` variable, then a per-user default. The layout under the
//! directory follows `../shared/data`, so `FEDSEL_DATA=../shared/data` works.

use std::path::PathBuf;

/// Environment variable naming the data directory.
pub const ENV_VAR: &str = "FEDSEL_DATA";

/// The data directory to use.
pub fn data_dir(flag: Option<PathBuf>, config: Option<PathBuf>) -> PathBuf {
    flag.or(config)
        .or_else(|| std::env::var_os(ENV_VAR).map(PathBuf::from))
        .unwrap_or_else(default_dir)
}

/// `$XDG_DATA_HOME/fedsel`, else `~/.local/share/fedsel`, else `./data`.
pub fn default_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_DATA_HOME") {
        return PathBuf::from(x).join("fedsel");
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".local/share/fedsel"),
        None => PathBuf::from("data"),
    }
}

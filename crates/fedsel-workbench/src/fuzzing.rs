//! The fuzz entry point of the sweep parser. Sweeps live in this crate, so their target
//! does too; the other parsers' entry points are in [`fedsel::fuzzing`], and
//! `tests/fuzz_corpus.rs` replays both lists.

use std::path::Path;

use fedsel::error::Result;
use fedsel::fuzzing::{Target, lossy_all};

use crate::sweep::Sweep;

/// This crate's fuzz targets by name; `fuzz/fuzz_targets/<name>.rs` and
/// `fuzz/corpus/<name>/` go with each.
pub const TARGETS: &[(&str, Target)] = &[("sweep", sweep)];

/// A sweep file, then NUL and the text of the config its `base` key names (if any), then
/// NUL-separated overrides, as `fedsel sweep --set` passes them.
pub fn sweep(data: &[u8]) -> Result<()> {
    let mut parts = data.split(|&b| b == 0);
    let text = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let base = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let overrides = lossy_all(parts);
    Sweep::from_toml_str(&text, "fuzz-input", Path::new("dir"), &overrides, |_| {
        Ok(base)
    })?;
    Ok(())
}

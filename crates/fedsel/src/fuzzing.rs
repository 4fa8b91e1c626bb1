//! Entry points of the fuzz targets under `fuzz/`, one per parser of untrusted input.
//!
//! The sweep parser's entry point is in `fedsel-workbench`, beside sweeps.
//! The cargo-fuzz targets are one-line calls of these functions, and
//! `crates/fedsel-workbench/tests/fuzz_corpus.rs` replays the stored corpora through the same
//! [`TARGETS`] on stable, so what CI checks is exactly what was fuzzed. Each
//! function hands arbitrary bytes to the parser production uses and returns its
//! verdict: an error is a correct answer to bad input, while a panic, a hang or
//! an unbounded allocation is a bug. Inputs that hold several files separate
//! them with a NUL byte, which none of the text formats can contain.

use std::path::Path;

use crate::availability::trace::Trace;
use crate::checkpoint;
use crate::config::Config;
use crate::data::builder::DatasetBuilder;
use crate::data::cifar::{self, V10, V100};
use crate::data::fmnist::{self, Split};
use crate::data::shakespeare::{self, ShakespeareSpec};
use crate::data::{flgo, leaf};
use crate::error::Result;

/// A fuzz entry point.
pub type Target = fn(&[u8]) -> Result<()>;

/// Every fuzz target by name; `fuzz/fuzz_targets/<name>.rs` and `fuzz/corpus/<name>/` go with it.
pub const TARGETS: &[(&str, Target)] = &[
    ("config", config),
    ("idx", idx),
    ("cifar", cifar),
    ("trace", trace),
    ("checkpoint", checkpoint),
    ("shakespeare", shakespeare),
    ("leaf", leaf),
    ("flgo", flgo),
    ("fedscale_devices", fedscale_devices),
    ("fedscale_behave", fedscale_behave),
    ("device_csv", device_csv),
];

/// Clients a fuzzed device or behave file is read for: more than most inputs' entries,
/// so the cyclic mapping is exercised.
const DEVICE_CLIENTS: usize = 7;

/// FedScale's pickled `client_device_capacity` (plain Python values, NumPy scalars and
/// arrays) read for [`DEVICE_CLIENTS`] clients; every profile read must be finite and > 0.
pub fn fedscale_devices(data: &[u8]) -> Result<()> {
    let profiles = crate::system::fedscale::parse_devices(input_path(), data, DEVICE_CLIENTS)?;
    assert_eq!(profiles.len(), DEVICE_CLIENTS);
    for p in &profiles {
        assert!(p.compute_ms_per_sample.is_finite() && p.compute_ms_per_sample > 0.0);
        assert!(p.bandwidth_kbps.is_finite() && p.bandwidth_kbps > 0.0);
    }
    Ok(())
}

/// FedScale's pickled `client_behave_trace` read for [`DEVICE_CLIENTS`] clients.
pub fn fedscale_behave(data: &[u8]) -> Result<()> {
    let traces = crate::system::fedscale::parse_behave(input_path(), data, DEVICE_CLIENTS)?;
    assert_eq!(traces.len(), DEVICE_CLIENTS);
    Ok(())
}

/// A device CSV (`[system] kind = "csv"`) read for [`DEVICE_CLIENTS`] clients.
pub fn device_csv(data: &[u8]) -> Result<()> {
    let profiles = crate::system::profile::parse_csv(input_path(), data, DEVICE_CLIENTS)?;
    assert_eq!(profiles.len(), DEVICE_CLIENTS);
    Ok(())
}

/// Clients of the partition a fuzzed trace is checked against.
const TRACE_CLIENTS: usize = 100;

/// The path errors name.
fn input_path() -> &'static Path {
    Path::new("fuzz-input")
}

/// Splits `data` at its first NUL byte.
fn split_nul(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}

/// A config file, then NUL-separated `--set key=value` overrides, as `fedsel run` reads
/// them. A config that loads must also reload from its resolved form (the text `--resume`
/// reads back) with the same hash, or a resume would refuse its own checkpoint.
///
/// Text is decoded lossily: the file reader refuses invalid UTF-8 before parsing, so
/// replacing it only lets more mutations reach the parser.
pub fn config(data: &[u8]) -> Result<()> {
    let mut parts = data.split(|&b| b == 0);
    let text = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let overrides = lossy_all(parts);
    let config = Config::from_file_text(&text, "fuzz-input", Path::new("dir"), &overrides)?;
    let again = Config::from_toml_str(&config.to_resolved_toml(), "resolved", &[])
        .unwrap_or_else(|e| panic!("a loaded config's resolved form does not reload: {e}"));
    assert_eq!(
        again.hash(),
        config.hash(),
        "reloading the resolved config changes its hash"
    );
    Ok(())
}

/// Decodes NUL-separated overrides lossily, as [`config`] reads them (the sweep target of
/// `fedsel-workbench` reads its overrides the same way).
pub fn lossy_all<'a>(parts: impl Iterator<Item = &'a [u8]>) -> Vec<String> {
    parts
        .map(|o| String::from_utf8_lossy(o).into_owned())
        .collect()
}

/// A little-endian `u32` n, then n bytes of an image file and the rest a label file,
/// each raw or gzip-compressed IDX, parsed as the Fashion-MNIST test split (checksums
/// off: no mutation keeps them). The test split's 10 000 blank images gzip to a few
/// KB, so a seed can carry a complete split and the fuzzer reaches every check.
pub fn idx(data: &[u8]) -> Result<()> {
    let (len, rest) = data.split_at(data.len().min(4));
    let mut n = [0; 4];
    n[..len.len()].copy_from_slice(len);
    let (images, labels) = rest.split_at((u32::from_le_bytes(n) as usize).min(rest.len()));
    fmnist::parse_split(
        Split::Test,
        (Path::new("images"), images),
        (Path::new("labels"), labels),
        false,
        crate::config::FmnistNormalize::default(),
    )?;
    Ok(())
}

/// One CIFAR batch file, decoded as CIFAR-10 and as CIFAR-100 records.
pub fn cifar(data: &[u8]) -> Result<()> {
    let (mut labels, mut values) = (Vec::new(), Vec::new());
    let ten = cifar::parse_records(input_path(), data, &V10, &mut labels, &mut values);
    let hundred = cifar::parse_records(input_path(), data, &V100, &mut labels, &mut values);
    ten.or(hundred)?;
    Ok(())
}

/// An availability trace CSV, checked against a partition of [`TRACE_CLIENTS`] clients,
/// then replayed for one cycle and a round past it.
pub fn trace(data: &[u8]) -> Result<()> {
    use crate::availability::Availability;
    let trace = Trace::parse(input_path(), data, TRACE_CLIENTS)?;
    for t in [0, trace.len() - 1, trace.len()] {
        assert!(trace.active(t).iter().all(|&k| k < TRACE_CLIENTS));
    }
    Ok(())
}

/// A checkpoint's `state.json`, then NUL, then its `tensors.bin`.
pub fn checkpoint(data: &[u8]) -> Result<()> {
    let (state, tensors) = split_nul(data);
    checkpoint::from_bytes(input_path(), state, tensors)?;
    Ok(())
}

/// The Gutenberg complete works, parsed into roles and cut into training windows.
pub fn shakespeare(data: &[u8]) -> Result<()> {
    let roles = shakespeare::roles_from_bytes(input_path(), data)?;
    let spec = ShakespeareSpec {
        train_fraction: 0.9,
        min_samples: 0,
        max_clients: 0,
        max_samples_per_client: 0,
        seed: 1,
    };
    let federated = shakespeare::from_roles(&roles, &spec);
    let users = federated.users.expect("Shakespeare has natural users");
    assert!(users.len() <= roles.len());
    assert_eq!(
        users.iter().map(Vec::len).sum::<usize>(),
        federated.train.len()
    );
    Ok(())
}

/// One LEAF data file (`train/*.json` or `test/*.json`). The users' example ranges it
/// returns must tile the examples read, in order.
pub fn leaf(data: &[u8]) -> Result<()> {
    let mut examples = DatasetBuilder::default();
    let users = leaf::parse_file(input_path(), data, &mut examples)?;
    let mut next = 0;
    for (_, range) in users {
        assert_eq!(
            range.start, next,
            "a user's examples do not follow the last user's"
        );
        next = range.end;
    }
    assert_eq!(next, examples.len(), "examples read outside every user");
    Ok(())
}

/// An FLGo / easyFL `data.json` of a task that stores its examples (an index task needs a
/// dataset to point into and is refused without one). Every client's examples must lie in
/// the training set.
pub fn flgo(data: &[u8]) -> Result<()> {
    let task = flgo::parse(input_path(), data, &flgo::FlgoSpec::default(), None)?;
    let n = task.train.len();
    let users = task.users.expect("a task has clients");
    let held = task.user_holdout.unwrap_or_default();
    assert!(users.iter().chain(&held).flatten().all(|&i| i < n));
    Ok(())
}

//! Resumable checkpoints of a single run.
//!
//! A checkpoint holds everything a run needs to continue exactly as if it had
//! not stopped: the global model, the server optimizer's moments, each
//! client's persistent optimizer state, the selector's learned state, the
//! cost ledger and the summary so far. Random streams need no saving: every
//! draw is keyed by (seed, purpose, round, client), so round t draws the same
//! numbers whether or not the run was interrupted before it.
//!
//! On disk, `checkpoint/state.json` holds the metadata and `tensors.bin` the
//! f32 arrays (little-endian, lengths in the metadata). A checkpoint is
//! written to `checkpoint.tmp/` and renamed into place, so a crash while
//! writing leaves the previous checkpoint intact.
//!
//! `state.json` also records two SHA-256 checksums: of `tensors.bin`, and of
//! the metadata itself (its compact JSON: version, next round, config hash,
//! array lengths, client step counts, selector state and summary). Plausible
//! but wrong weights would otherwise resume without complaint and end in
//! different results, indistinguishable from a real run; with the checksums
//! any changed byte is refused as a corrupt checkpoint, naming the file. A
//! checkpoint written before the checksums existed is refused the same way
//! (the error names the missing `tensors_sha256` field): it cannot be told
//! apart from a damaged one, so such a run has to start over.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::digest::sha256_hex;
use crate::error::{CheckpointError, Error, Result};
use crate::summary::RunSummary;
use crate::system::inflight::InFlight;
use crate::train::OptimizerState;

const STATE: &str = "state.json";
const TENSORS: &str = "tensors.bin";

/// The state of a run between two rounds.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// The first round still to run.
    pub next_round: usize,
    /// [`Config::hash`](crate::config::Config::hash) of the run's config.
    pub config_hash: String,
    /// Global parameters.
    pub global: Vec<f32>,
    /// Server Adam moments (empty unless FedAdam).
    pub server_m: Vec<f32>,
    /// Server Adam second moments.
    pub server_v: Vec<f32>,
    /// Each client's persistent optimizer state.
    pub client_states: Vec<Option<OptimizerState>>,
    /// The selector's [`save`](crate::select::Selector::save)d state.
    pub selector: serde_json::Value,
    /// Summary and ledger so far; `wall_s` is the time already spent.
    pub summary: RunSummary,
    /// The updates in flight: late ones waiting to be folded, FedBuff's clients training
    /// (empty for a synchronous run).
    pub in_flight: InFlight,
}

/// The contents of `state.json`.
#[derive(Serialize, Deserialize)]
struct State {
    /// SHA-256 of `tensors.bin`; first, so that a checkpoint without checksums is
    /// reported as missing this field.
    tensors_sha256: String,
    /// SHA-256 of `meta` serialized as compact JSON, so that whitespace does not count
    /// but every value does (floats round-trip exactly: serde_json's `float_roundtrip`).
    meta_sha256: String,
    meta: Meta,
}

#[derive(Serialize, Deserialize)]
struct Meta {
    version: String,
    next_round: usize,
    config_hash: String,
    /// Length of each array in `tensors.bin`, in order.
    lengths: Vec<usize>,
    /// Step count of each client's state, `None` when it has none.
    client_steps: Vec<Option<u64>>,
    selector: serde_json::Value,
    summary: RunSummary,
    /// The book's times and ids; its models follow the client states in `tensors.bin`.
    /// Left out when empty, so that a synchronous run's checkpoint reads as before.
    #[serde(default, skip_serializing_if = "InFlight::is_empty")]
    in_flight: InFlight,
}

impl Meta {
    fn sha256(&self) -> String {
        sha256_hex(&serde_json::to_vec(self).expect("metadata serializes"))
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Output {
        path: path.to_path_buf(),
        error: source,
    }
}

fn corrupt(path: PathBuf, reason: impl Into<String>) -> CheckpointError {
    CheckpointError::Corrupt {
        path,
        reason: reason.into(),
    }
}

/// Directory of the checkpoint inside a run directory.
pub fn dir(run_dir: &Path) -> PathBuf {
    run_dir.join("checkpoint")
}

/// Writes `cp` into `run_dir/checkpoint`, replacing the previous one atomically.
pub fn save(run_dir: &Path, cp: &Checkpoint) -> Result<()> {
    let tmp = run_dir.join("checkpoint.tmp");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    let mut arrays: Vec<&[f32]> = vec![&cp.global, &cp.server_m, &cp.server_v];
    for s in cp.client_states.iter().flatten() {
        arrays.push(&s.m);
        arrays.push(&s.v);
    }
    arrays.extend(cp.in_flight.arrays());
    let mut bytes = Vec::with_capacity(arrays.iter().map(|a| a.len() * 4).sum());
    for a in &arrays {
        bytes.extend(a.iter().flat_map(|x| x.to_le_bytes()));
    }
    let meta = Meta {
        version: crate::VERSION.into(),
        next_round: cp.next_round,
        config_hash: cp.config_hash.clone(),
        lengths: arrays.iter().map(|a| a.len()).collect(),
        client_steps: cp
            .client_states
            .iter()
            .map(|s| s.as_ref().map(|s| s.step))
            .collect(),
        selector: cp.selector.clone(),
        summary: cp.summary.clone(),
        in_flight: cp.in_flight.times(),
    };
    let state = State {
        tensors_sha256: sha256_hex(&bytes),
        meta_sha256: meta.sha256(),
        meta,
    };
    let bin = tmp.join(TENSORS);
    std::fs::write(&bin, bytes).map_err(io(&bin))?;
    let json = tmp.join(STATE);
    std::fs::write(
        &json,
        serde_json::to_vec_pretty(&state).expect("metadata serializes"),
    )
    .map_err(io(&json))?;
    let dest = dir(run_dir);
    let old = run_dir.join("checkpoint.old");
    if dest.exists() {
        if old.exists() {
            std::fs::remove_dir_all(&old).map_err(io(&old))?;
        }
        std::fs::rename(&dest, &old).map_err(io(&dest))?;
    }
    std::fs::rename(&tmp, &dest).map_err(io(&dest))?;
    if old.exists() {
        std::fs::remove_dir_all(&old).map_err(io(&old))?;
    }
    Ok(())
}

/// Reads the latest checkpoint of `run_dir` (falling back to the one a crash mid-rename left aside).
pub fn load(run_dir: &Path) -> Result<Checkpoint> {
    let d = [dir(run_dir), run_dir.join("checkpoint.old")]
        .into_iter()
        .find(|d| d.join(STATE).is_file())
        .ok_or_else(|| CheckpointError::Missing { dir: dir(run_dir) })?;
    let read = |name: &str| {
        let path = d.join(name);
        std::fs::read(&path).map_err(|source| CheckpointError::Io {
            path,
            error: source,
        })
    };
    Ok(from_bytes(&d, &read(STATE)?, &read(TENSORS)?)?)
}

/// Decodes a checkpoint from the contents of its two files; [`load`] reads them from
/// `dir`, which errors name. Every inconsistency between the files, and any byte that
/// differs from what [`save`] wrote, is a [`CheckpointError::Corrupt`], never a panic:
/// the sizes are checked before anything is allocated from them.
pub fn from_bytes(dir: &Path, state: &[u8], tensors: &[u8]) -> Result<Checkpoint, CheckpointError> {
    let json = dir.join(STATE);
    let bin = dir.join(TENSORS);
    let State {
        tensors_sha256,
        meta_sha256,
        meta,
    } = serde_json::from_slice(state).map_err(|e| corrupt(json.clone(), e.to_string()))?;
    let arrays = 3 + 2 * meta.client_steps.iter().flatten().count() + meta.in_flight.array_count();
    if meta.lengths.len() != arrays {
        return Err(corrupt(
            json,
            format!(
                "lists {} arrays, the client states and updates in flight need {arrays}",
                meta.lengths.len()
            ),
        ));
    }
    let bytes = meta
        .lengths
        .iter()
        .try_fold(0usize, |sum, &n| sum.checked_add(n.checked_mul(4)?))
        .ok_or_else(|| corrupt(json.clone(), "array lengths overflow"))?;
    if tensors.len() != bytes {
        return Err(corrupt(
            bin,
            format!("{} bytes, {STATE} promises {bytes}", tensors.len()),
        ));
    }
    let got = meta.sha256();
    if got != meta_sha256 {
        return Err(corrupt(
            json,
            format!("SHA-256 of the metadata is {got}, the checksum recorded is {meta_sha256}"),
        ));
    }
    let got = sha256_hex(tensors);
    if got != tensors_sha256 {
        return Err(corrupt(
            bin,
            format!("SHA-256 is {got}, the checksum recorded in {STATE} is {tensors_sha256}"),
        ));
    }
    let mut rest = tensors;
    let mut next = |n: usize| {
        let (head, tail) = rest.split_at(4 * n);
        rest = tail;
        head.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect::<Vec<f32>>()
    };
    let mut lengths = meta.lengths.iter().copied();
    let mut array = || next(lengths.next().expect("one length per array, checked"));
    let global = array();
    let server_m = array();
    let server_v = array();
    let client_states = meta
        .client_steps
        .iter()
        .map(|step| {
            step.map(|step| OptimizerState {
                step,
                m: array(),
                v: array(),
            })
        })
        .collect();
    let mut in_flight = meta.in_flight;
    in_flight.refill(&mut array);
    Ok(Checkpoint {
        next_round: meta.next_round,
        config_hash: meta.config_hash,
        global,
        server_m,
        server_v,
        client_states,
        selector: meta.selector,
        summary: meta.summary,
        in_flight,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::Ledger;

    /// A checkpoint whose floats are not short decimals, so that any lossy step shows.
    fn sample() -> Checkpoint {
        let wave = |n: usize, scale: f32| -> Vec<f32> {
            (0..n).map(|i| (i as f32 * 0.37).sin() * scale).collect()
        };
        Checkpoint {
            next_round: 15,
            config_hash: "0123abcd".into(),
            global: wave(600, 0.1),
            server_m: wave(600, 0.01),
            server_v: wave(600, 1e-4),
            client_states: vec![
                Some(OptimizerState {
                    step: 7,
                    m: wave(600, 0.02),
                    v: Vec::new(),
                }),
                None,
                Some(OptimizerState {
                    step: 3,
                    m: wave(600, 0.03),
                    v: wave(600, 1e-5),
                }),
            ],
            selector: serde_json::json!({ "losses": [0.1 + 0.2, 1.0 / 3.0, 2.5e-300], "round": 14 }),
            summary: RunSummary {
                strategy: "md".into(),
                seed: 1,
                rounds: 15,
                final_acc: Some(0.812_345_678_901_234_5),
                final_loss: Some(std::f64::consts::LN_10),
                best_acc: Some(0.9),
                best_acc_round: 12,
                best_loss: None,
                rounds_to_target: vec![(0.5, Some(4)), (0.95, None)],
                diverged_at: None,
                wall_s: 12.345_678_901_234,
                cost: Ledger {
                    broadcasts: 150,
                    ..Ledger::default()
                },
                version: crate::VERSION.into(),
                cpu: "avx2+fma".into(),
                commit: "0123abc".into(),
                clock: Some(crate::summary::ClockSummary {
                    clock_s: 0.1 + 0.2,
                    time_to_target_s: vec![(0.5, Some(1.0 / 3.0)), (0.95, None)],
                    wasted_trainings: 7,
                    rounds_without_updates: 2,
                }),
            },
            in_flight: InFlight::default(),
        }
    }

    /// [`sample`] with a late update and a FedBuff flight in its book.
    fn sample_in_flight() -> Checkpoint {
        use crate::system::inflight::{Flying, LateUpdate};
        use crate::system::round::Flight;
        let mut cp = sample();
        cp.in_flight.late.push(LateUpdate {
            client: 2,
            origin: 13,
            arrival_s: 0.1 + 0.7,
            params: (0..600).map(|i| (i as f32 * 0.11).cos()).collect(),
            weight: Some(1.0 / 3.0),
        });
        cp.in_flight.flights.push(Flight {
            id: 9,
            version: 14,
            start_s: 1.0 / 7.0,
            arrival_s: 2.0 / 3.0,
        });
        cp.in_flight.flying.insert(
            9,
            Flying {
                client: 0,
                delta: (0..600).map(|i| (i as f32 * 0.23).sin() * 1e-3).collect(),
                loss: 0.1 + 0.2,
                weight: None,
                report: Some(vec![0.5, 1.0 / 9.0]),
            },
        );
        cp.in_flight.next_flight = 10;
        cp
    }

    fn corrupt_file(err: Error) -> (PathBuf, String) {
        let message = err.to_string();
        match err {
            Error::Checkpoint(CheckpointError::Corrupt { path, .. }) => (path, message),
            other => panic!("expected a corrupt checkpoint, got {other:?}"),
        }
    }

    #[test]
    fn an_untouched_checkpoint_loads_equal_even_reformatted() {
        let run = tempfile::tempdir().unwrap();
        let cp = sample();
        save(run.path(), &cp).unwrap();
        assert_eq!(load(run.path()).unwrap(), cp);
        // Whitespace is not part of the metadata checksum.
        let json = dir(run.path()).join(STATE);
        let state: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        std::fs::write(&json, serde_json::to_vec(&state).unwrap()).unwrap();
        assert_eq!(load(run.path()).unwrap(), cp);
    }

    #[test]
    fn the_updates_in_flight_round_trip_and_an_empty_book_is_left_out() {
        let run = tempfile::tempdir().unwrap();
        let cp = sample_in_flight();
        save(run.path(), &cp).unwrap();
        assert_eq!(load(run.path()).unwrap(), cp);
        let bin = std::fs::read(dir(run.path()).join(TENSORS)).unwrap();
        // The model and server moments (1,800 floats), the client states (1,800), then the
        // late model and the flying delta (600 each).
        assert_eq!(bin.len(), 4 * (1_800 + 1_800 + 1_200));
        save(run.path(), &sample()).unwrap();
        let json = std::fs::read_to_string(dir(run.path()).join(STATE)).unwrap();
        assert!(!json.contains("in_flight"), "{json}");
    }

    #[test]
    fn plausible_weights_written_over_tensors_are_refused_as_corrupt() {
        let run = tempfile::tempdir().unwrap();
        save(run.path(), &sample()).unwrap();
        let bin = dir(run.path()).join(TENSORS);
        let mut bytes = std::fs::read(&bin).unwrap();
        // 200 weights of the global model, each moved by 1%: still finite and in range.
        for c in bytes[400..1200].chunks_exact_mut(4) {
            let x = f32::from_le_bytes(c.try_into().unwrap());
            c.copy_from_slice(&(x * 1.01 + 1e-3).to_le_bytes());
        }
        std::fs::write(&bin, bytes).unwrap();
        let (path, message) = corrupt_file(load(run.path()).unwrap_err());
        assert_eq!(path, bin);
        assert!(
            message.contains("corrupt checkpoint") && message.contains("SHA-256"),
            "{message}"
        );
    }

    #[test]
    fn an_edited_round_in_the_metadata_is_refused_as_corrupt() {
        let run = tempfile::tempdir().unwrap();
        save(run.path(), &sample()).unwrap();
        let json = dir(run.path()).join(STATE);
        let text = std::fs::read_to_string(&json).unwrap();
        assert!(text.contains("\"next_round\": 15"));
        std::fs::write(
            &json,
            text.replace("\"next_round\": 15", "\"next_round\": 5"),
        )
        .unwrap();
        let (path, message) = corrupt_file(load(run.path()).unwrap_err());
        assert_eq!(path, json);
        assert!(message.contains("SHA-256 of the metadata"), "{message}");
    }

    #[test]
    fn a_checkpoint_without_checksums_names_the_missing_field() {
        let run = tempfile::tempdir().unwrap();
        save(run.path(), &sample()).unwrap();
        let json = dir(run.path()).join(STATE);
        let state: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        // The layout before checksums: the metadata alone.
        std::fs::write(&json, serde_json::to_vec_pretty(&state["meta"]).unwrap()).unwrap();
        let (path, message) = corrupt_file(load(run.path()).unwrap_err());
        assert_eq!(path, json);
        assert!(
            message.contains("missing field `tensors_sha256`"),
            "{message}"
        );
    }

    #[test]
    fn sizes_that_disagree_or_overflow_are_refused_before_reading_floats() {
        let run = tempfile::tempdir().unwrap();
        save(run.path(), &sample()).unwrap();
        let d = dir(run.path());
        let state = std::fs::read(d.join(STATE)).unwrap();
        let tensors = std::fs::read(d.join(TENSORS)).unwrap();
        let err = from_bytes(&d, &state, &tensors[..tensors.len() - 4]).unwrap_err();
        assert!(
            matches!(&err, CheckpointError::Corrupt { path, .. } if path.ends_with(TENSORS)),
            "{err}"
        );
        let mut value: serde_json::Value = serde_json::from_slice(&state).unwrap();
        value["meta"]["lengths"][0] = serde_json::json!(usize::MAX / 2);
        let err = from_bytes(&d, &serde_json::to_vec(&value).unwrap(), &tensors).unwrap_err();
        assert!(err.to_string().contains("overflow"), "{err}");
        value["meta"]["lengths"] = serde_json::json!([600, 600]);
        let err = from_bytes(&d, &serde_json::to_vec(&value).unwrap(), &tensors).unwrap_err();
        assert!(err.to_string().contains("lists 2 arrays"), "{err}");
    }

    #[test]
    fn a_missing_checkpoint_says_so() {
        let run = tempfile::tempdir().unwrap();
        let err = load(run.path()).unwrap_err();
        assert!(
            matches!(&err, Error::Checkpoint(CheckpointError::Missing { .. })),
            "{err}"
        );
    }
}

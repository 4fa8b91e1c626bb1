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

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::engine::RunSummary;
use crate::error::{Error, Result};
use crate::train::OptimizerState;

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
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Output {
        path: path.to_path_buf(),
        source,
    }
}

fn corrupt(path: &Path, reason: impl Into<String>) -> Error {
    Error::Output {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, reason.into()),
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
    let mut bytes = Vec::with_capacity(arrays.iter().map(|a| a.len() * 4).sum());
    for a in &arrays {
        bytes.extend(a.iter().flat_map(|x| x.to_le_bytes()));
    }
    let bin = tmp.join("tensors.bin");
    std::fs::write(&bin, bytes).map_err(io(&bin))?;
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
    };
    let json = tmp.join("state.json");
    std::fs::write(
        &json,
        serde_json::to_vec_pretty(&meta).expect("metadata serializes"),
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
        .find(|d| d.join("state.json").is_file())
        .ok_or_else(|| {
            corrupt(
                &dir(run_dir),
                "no checkpoint found; was the run started with checkpoint_every = 0?",
            )
        })?;
    let json = d.join("state.json");
    let meta: Meta = serde_json::from_slice(&std::fs::read(&json).map_err(io(&json))?)
        .map_err(|e| corrupt(&json, e.to_string()))?;
    let bin = d.join("tensors.bin");
    let bytes = std::fs::read(&bin).map_err(io(&bin))?;
    let total: usize = meta.lengths.iter().sum();
    if bytes.len() != total * 4 {
        return Err(corrupt(
            &bin,
            format!("{} bytes, the metadata promises {}", bytes.len(), total * 4),
        ));
    }
    let mut floats = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")));
    let mut arrays = meta
        .lengths
        .iter()
        .map(|&n| floats.by_ref().take(n).collect::<Vec<f32>>());
    let mut next = || {
        arrays
            .next()
            .ok_or_else(|| corrupt(&json, "fewer arrays than states"))
    };
    let global = next()?;
    let server_m = next()?;
    let server_v = next()?;
    let mut client_states = Vec::with_capacity(meta.client_steps.len());
    for step in &meta.client_steps {
        client_states.push(match step {
            Some(step) => Some(OptimizerState {
                step: *step,
                m: next()?,
                v: next()?,
            }),
            None => None,
        });
    }
    Ok(Checkpoint {
        next_round: meta.next_round,
        config_hash: meta.config_hash,
        global,
        server_m,
        server_v,
        client_states,
        selector: meta.selector,
        summary: meta.summary,
    })
}

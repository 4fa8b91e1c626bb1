//! Sweeps: a base config crossed with axes, one run per cell.
//!
//! A sweep file names a base config (a file, inline keys, or both) and axes.
//! Every cell of the grid is one run in its own directory, named by a label
//! and a hash of its resolved config. A cell counts as finished only once its
//! `summary.json` says so (written last, atomically), so a sweep killed at any
//! moment and started again reruns only the cells that did not finish, each
//! from its last checkpoint when it has one.
//!
//! ```toml
//! name = "quickstart"
//! base = "base.toml"          # optional, relative to the sweep file
//! baseline = "uniform"        # strategy that relative columns compare against
//! [config]                    # optional inline keys, applied after `base`
//! rounds = 100
//! [axes]
//! strategy = ["uniform", "md"]                 # selection.strategy
//! seed = [1, 2, 3]
//! partition = [{ kind = "iid" }]               # partition.scheme
//! availability = [{ kind = "always" }]         # availability
//! set = { "train.lr" = [0.01, 0.1] }           # any key
//! [[axes.case]]                                # settings: keys that change together
//! label = "2spc-m5"
//! set = { "partition.scheme" = { kind = "shards", shards_per_client = 2 }, "selection.clients_per_round" = 5 }
//! [[axes.method]]                              # strategies that need more than one key
//! label = "fedprox"
//! set = { "selection.strategy" = "md", "train.prox_mu" = 0.01 }
//! ```
//!
//! Case settings form the outermost axis; reports group cells by every axis
//! except strategy (or method) and seed, and name each method by its label.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::Deserialize;

use crate::config::Config;
use crate::engine::{self, Experiment};
use crate::error::{ConfigError, Error, Result};
use crate::output::RunWriter;

/// The `[axes]` table.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AxesFile {
    #[serde(default)]
    strategy: Vec<toml::Value>,
    #[serde(default)]
    seed: Vec<toml::Value>,
    #[serde(default)]
    partition: Vec<toml::Value>,
    #[serde(default)]
    availability: Vec<toml::Value>,
    #[serde(default)]
    set: toml::Table,
    #[serde(default)]
    case: Vec<CaseFile>,
    #[serde(default)]
    method: Vec<CaseFile>,
}

/// One `[[axes.case]]`: a named bundle of keys that change together (a paper's "setting").
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct CaseFile {
    label: String,
    set: toml::Table,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct SweepFile {
    name: String,
    #[serde(default)]
    base: Option<PathBuf>,
    #[serde(default)]
    baseline: Option<String>,
    #[serde(default)]
    config: toml::Table,
    #[serde(default)]
    axes: AxesFile,
}

/// One axis: a config key and the values it takes.
#[derive(Debug, Clone, PartialEq)]
pub struct Axis {
    /// Short name used in labels and reports.
    pub label: String,
    /// Values, in order.
    pub values: Vec<AxisValue>,
}

/// One value of an axis: the keys it sets, and how it is named.
#[derive(Debug, Clone, PartialEq)]
pub struct AxisValue {
    /// Name in cell labels and reports.
    pub label: String,
    /// `key=value` overrides, in TOML syntax.
    pub overrides: Vec<String>,
}

impl AxisValue {
    fn single(axis: &str, key: &str, v: &toml::Value) -> Self {
        let label = if axis == "seed" {
            format!("s{v}")
        } else {
            value_label(v)
        };
        Self {
            label,
            overrides: vec![format!("{key}={v}")],
        }
    }
}

/// A parsed sweep.
#[derive(Debug, Clone)]
pub struct Sweep {
    /// Sweep name.
    pub name: String,
    /// Strategy the reports compare against.
    pub baseline: Option<String>,
    /// The base config as TOML text.
    pub base_text: String,
    /// The axes, outermost first.
    pub axes: Vec<Axis>,
}

/// One cell of the grid.
#[derive(Debug, Clone)]
pub struct Cell {
    /// Human-readable label, e.g. `uniform-s1`.
    pub label: String,
    /// (axis, value) names that make up the label.
    pub parts: Vec<(String, String)>,
    /// The resolved config.
    pub config: Config,
    /// Directory name: label plus a hash of the resolved config.
    pub dir_name: String,
}

/// Short readable form of an axis value for labels.
pub fn value_label(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        toml::Value::Table(t) => {
            let mut parts: Vec<String> = Vec::new();
            if let Some(k) = t.get("kind") {
                parts.push(value_label(k));
            }
            parts.extend(
                t.iter()
                    .filter(|(k, _)| *k != "kind")
                    .map(|(_, v)| value_label(v)),
            );
            parts.join("_")
        }
        toml::Value::Array(a) => a.iter().map(value_label).collect::<Vec<_>>().join("_"),
        other => other.to_string(),
    }
}

impl Sweep {
    /// Reads a sweep file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Parse {
            source_name: name.clone(),
            message: e.to_string(),
        })?;
        let file: SweepFile =
            toml::from_str(&text).map_err(|e: toml::de::Error| ConfigError::Parse {
                source_name: name.clone(),
                message: e.to_string(),
            })?;
        let mut base: toml::Table = match &file.base {
            Some(b) => {
                let p = path.parent().unwrap_or(Path::new(".")).join(b);
                let t = std::fs::read_to_string(&p).map_err(|e| ConfigError::Parse {
                    source_name: p.display().to_string(),
                    message: e.to_string(),
                })?;
                t.parse().map_err(|e: toml::de::Error| ConfigError::Parse {
                    source_name: p.display().to_string(),
                    message: e.to_string(),
                })?
            }
            None => toml::Table::new(),
        };
        merge(&mut base, file.config);
        let mut axes = Vec::new();
        let a = file.axes;
        for (label, named) in [("setting", a.case), ("method", a.method)] {
            if !named.is_empty() {
                let values = named
                    .into_iter()
                    .map(|c| AxisValue {
                        label: c.label,
                        overrides: c.set.iter().map(|(k, v)| format!("{k}={v}")).collect(),
                    })
                    .collect();
                axes.push(Axis {
                    label: label.into(),
                    values,
                });
            }
        }
        for (key, label, values) in [
            ("selection.strategy", "strategy", a.strategy),
            ("seed", "seed", a.seed),
            ("partition.scheme", "partition", a.partition),
            ("availability", "availability", a.availability),
        ] {
            if !values.is_empty() {
                let values = values
                    .iter()
                    .map(|v| AxisValue::single(label, key, v))
                    .collect();
                axes.push(Axis {
                    label: label.into(),
                    values,
                });
            }
        }
        for (key, v) in a.set {
            let values = match v {
                toml::Value::Array(values) if !values.is_empty() => values,
                _ => {
                    return Err(ConfigError::invalid(
                        format!("axes.set.\"{key}\""),
                        "must be a non-empty list of values",
                    ));
                }
            };
            let label = key.rsplit('.').next().unwrap_or(&key).to_string();
            let values = values
                .iter()
                .map(|v| AxisValue::single(&label, &key, v))
                .collect();
            axes.push(Axis { label, values });
        }
        let sweep = Self {
            name: file.name,
            baseline: file.baseline,
            base_text: toml::to_string(&base).expect("a table serializes"),
            axes,
        };
        sweep.cells()?;
        Ok(sweep)
    }

    /// Every cell of the grid, resolved and validated, in grid order (last axis fastest).
    pub fn cells(&self) -> Result<Vec<Cell>, ConfigError> {
        let mut combos: Vec<Vec<usize>> = vec![Vec::new()];
        for axis in &self.axes {
            combos = combos
                .into_iter()
                .flat_map(|c| (0..axis.values.len()).map(move |i| [c.clone(), vec![i]].concat()))
                .collect();
        }
        combos
            .into_iter()
            .map(|combo| {
                let chosen: Vec<(&Axis, &AxisValue)> = combo
                    .iter()
                    .zip(&self.axes)
                    .map(|(&i, a)| (a, &a.values[i]))
                    .collect();
                let overrides: Vec<String> = chosen
                    .iter()
                    .flat_map(|(_, v)| v.overrides.iter().cloned())
                    .collect();
                let mut config = Config::from_toml_str(&self.base_text, &self.name, &overrides)?;
                let parts: Vec<(String, String)> = chosen
                    .iter()
                    .map(|(a, v)| (a.label.clone(), v.label.clone()))
                    .collect();
                let label = if parts.is_empty() {
                    "run".to_string()
                } else {
                    parts
                        .iter()
                        .map(|p| p.1.as_str())
                        .collect::<Vec<_>>()
                        .join("-")
                };
                config.name = format!("{}-{label}", self.name);
                let dir_name = format!("{}-{}", sanitize(&label), &config.hash()[..12]);
                Ok(Cell {
                    label,
                    parts,
                    config,
                    dir_name,
                })
            })
            .collect()
    }
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Deep-merges `over` into `base` (tables merge, everything else replaces).
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// Whether a cell directory holds a finished run.
pub fn is_finished(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("summary.json"))
        .ok()
        .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
        .is_some_and(|v| v["status"] == "finished")
}

/// How a sweep run went.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepOutcome {
    /// Cells in the grid.
    pub total: usize,
    /// Cells already finished before this invocation.
    pub skipped: usize,
    /// Cells run to completion now.
    pub ran: usize,
    /// Cells that failed, with their errors.
    pub failed: Vec<(String, String)>,
}

/// Receives sweep progress.
pub trait SweepProgress: Sync {
    /// A cell finished (or failed) and `done` of `total` are now settled.
    fn cell_done(&self, label: &str, done: usize, total: usize, ok: bool);
}

/// Runs every unfinished cell of `sweep` under `out/cells/`, `jobs` at a time,
/// each on `threads` rayon threads, loading data from `data_dir`.
pub fn run(
    sweep: &Sweep,
    out: &Path,
    data_dir: &Path,
    jobs: usize,
    threads: usize,
    progress: &dyn SweepProgress,
) -> Result<SweepOutcome> {
    let cells = sweep.cells()?;
    let cells_dir = out.join("cells");
    std::fs::create_dir_all(&cells_dir).map_err(|source| Error::Output {
        path: cells_dir.clone(),
        source,
    })?;
    write_index(sweep, &cells, out)?;
    let todo: Vec<&Cell> = cells
        .iter()
        .filter(|c| !is_finished(&cells_dir.join(&c.dir_name)))
        .collect();
    let outcome = Mutex::new(SweepOutcome {
        total: cells.len(),
        skipped: cells.len() - todo.len(),
        ..SweepOutcome::default()
    });
    let next = AtomicUsize::new(0);
    let settled = AtomicUsize::new(cells.len() - todo.len());
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1).min(todo.len().max(1)) {
            s.spawn(|| {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads.max(1))
                    .build()
                    .expect("a thread pool");
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(cell) = todo.get(i) else { break };
                    let dir = cells_dir.join(&cell.dir_name);
                    let result = pool.install(|| run_cell(cell, &dir, data_dir));
                    let done = settled.fetch_add(1, Ordering::SeqCst) + 1;
                    let mut o = outcome.lock().expect("no panics while holding the lock");
                    match result {
                        Ok(()) => o.ran += 1,
                        Err(e) => o.failed.push((cell.label.clone(), e.to_string())),
                    }
                    progress.cell_done(
                        &cell.label,
                        done,
                        cells.len(),
                        o.failed.last().is_none_or(|f| f.0 != cell.label),
                    );
                }
            });
        }
    });
    Ok(outcome.into_inner().expect("threads joined"))
}

/// The sweep's index, `sweep.json`: which cell directory holds which strategy, seed and setting.
fn write_index(sweep: &Sweep, cells: &[Cell], out: &Path) -> Result<()> {
    let entries: Vec<serde_json::Value> = cells
        .iter()
        .map(|c| {
            let setting: Vec<String> = c
                .parts
                .iter()
                .filter(|(axis, _)| !matches!(axis.as_str(), "strategy" | "method" | "seed"))
                .map(|(axis, v)| {
                    if axis == "setting" {
                        v.clone()
                    } else {
                        format!("{axis}={v}")
                    }
                })
                .collect();
            serde_json::json!({
                "dir": c.dir_name,
                "label": c.label,
                "strategy": c
                    .parts
                    .iter()
                    .find(|(axis, _)| axis == "method")
                    .map_or(c.config.selection.strategy.clone(), |(_, v)| v.clone()),
                "seed": c.config.seed,
                "setting": if setting.is_empty() { "all".to_string() } else { setting.join(",") },
                "targets": c.config.targets,
            })
        })
        .collect();
    let index = serde_json::json!({ "name": sweep.name, "baseline": sweep.baseline, "version": crate::VERSION, "cells": entries });
    let path = out.join("sweep.json");
    std::fs::write(&path, serde_json::to_string_pretty(&index).expect("json"))
        .map_err(|source| Error::Output { path, source })
}

/// Runs one cell into `dir`: continues it from its checkpoint when an earlier attempt left
/// one for this exact config, and otherwise starts over, discarding any half-written files.
fn run_cell(cell: &Cell, dir: &Path, data_dir: &Path) -> Result<()> {
    let exp = Experiment::prepare(cell.config.clone(), data_dir)?;
    for w in cell.config.warnings(exp.clients.len()) {
        tracing::warn!(cell = %cell.label, "{w}");
    }
    let checkpoint = crate::checkpoint::load(dir)
        .ok()
        .filter(|cp| cp.config_hash == cell.config.hash());
    let (writer, result) = match checkpoint {
        Some(cp) => {
            let mut w = RunWriter::resume(dir, cp.next_round)?;
            let r = engine::resume(&exp, &mut w, cp);
            (w, r)
        }
        None => {
            if dir.exists() {
                std::fs::remove_dir_all(dir).map_err(|source| Error::Output {
                    path: dir.to_path_buf(),
                    source,
                })?;
            }
            let mut w = RunWriter::create(dir, &exp.config)?;
            let r = engine::run(&exp, &mut w);
            (w, r)
        }
    };
    match result {
        Ok(summary) => writer.finish(&summary),
        Err(e) => {
            writer.fail(&e, 0)?;
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_labels_and_hashes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.toml");
        std::fs::write(
            &path,
            "name = \"t\"\n[config]\nrounds = 3\n[axes]\nstrategy = [\"uniform\", \"md\"]\nseed = [1, 2]\nset = { \"train.lr\" = [0.1, 0.2] }\n",
        )
        .unwrap();
        let sweep = Sweep::load(&path).unwrap();
        let cells = sweep.cells().unwrap();
        assert_eq!(cells.len(), 8);
        assert_eq!(cells[0].label, "uniform-s1-0.1");
        assert_eq!(cells[7].label, "md-s2-0.2");
        assert_eq!(cells[7].config.train.lr, 0.2);
        assert_eq!(cells[7].config.rounds, 3);
        let mut dirs: Vec<&str> = cells.iter().map(|c| c.dir_name.as_str()).collect();
        dirs.sort();
        dirs.dedup();
        assert_eq!(dirs.len(), 8, "every cell has its own directory");
        // Hashes are stable across loads.
        assert_eq!(
            Sweep::load(&path).unwrap().cells().unwrap()[3].dir_name,
            cells[3].dir_name
        );
    }

    #[test]
    fn cases_set_several_keys_together() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.toml");
        std::fs::write(
            &path,
            "name = \"t\"\n[axes]\nseed = [1, 2]\n[[axes.case]]\nlabel = \"a-1\"\nset = { \"partition.clients\" = 10, targets = [0.5] }\n[[axes.case]]\nlabel = \"b\"\nset = { \"partition.scheme\" = { kind = \"iid\" }, \"selection.clients_per_round\" = 3 }\n",
        )
        .unwrap();
        let cells = Sweep::load(&path).unwrap().cells().unwrap();
        assert_eq!(
            cells.iter().map(|c| c.label.as_str()).collect::<Vec<_>>(),
            ["a-1-s1", "a-1-s2", "b-s1", "b-s2"]
        );
        assert_eq!(
            (
                cells[0].config.partition.clients,
                cells[0].config.targets.clone()
            ),
            (10, vec![0.5])
        );
        assert_eq!(cells[3].config.selection.clients_per_round, 3);
        assert_eq!(cells[3].config.seed, 2);
        // A label with a dash stays one setting.
        assert_eq!(
            cells[0].parts[0],
            ("setting".to_string(), "a-1".to_string())
        );
    }

    #[test]
    fn a_bad_axis_value_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.toml");
        std::fs::write(
            &path,
            "name = \"t\"\n[axes]\nset = { \"train.lr\" = [-1.0] }\n",
        )
        .unwrap();
        let err = Sweep::load(&path).unwrap_err().to_string();
        assert!(err.contains("train.lr"), "{err}");
    }
}

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
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use serde::Deserialize;

use fedsel::config::Config;
use fedsel::engine::{self, Experiment};
use fedsel::error::{ConfigError, Error, Result};
use fedsel::output::RunWriter;

/// The `[axes]` table.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AxesFile {
    strategy: Option<Vec<toml::Value>>,
    seed: Option<Vec<toml::Value>>,
    partition: Option<Vec<toml::Value>>,
    availability: Option<Vec<toml::Value>>,
    #[serde(default)]
    set: toml::Table,
    case: Option<Vec<CaseFile>>,
    method: Option<Vec<CaseFile>>,
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
    /// The resolved config's hash, computed once: shards rank cells by it and a cell's
    /// checkpoint must carry it.
    pub hash: String,
}

impl Cell {
    /// The method the reports name this cell by: its `[[axes.method]]` label, else its
    /// strategy.
    pub fn method(&self) -> String {
        self.parts
            .iter()
            .find(|(axis, _)| axis == "method")
            .map_or(self.config.selection.strategy.clone(), |(_, v)| v.clone())
    }
}

/// Short readable form of an axis value for labels.
pub fn value_label(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        // A round policy (`system.round`): the policy, then its parameters, a duration in
        // seconds (a key ending in `_s`) with its unit: "overcommit-0.3", "deadline-30s".
        toml::Value::Table(t) if t.contains_key("policy") => std::iter::once(&t["policy"])
            .map(value_label)
            .chain(t.iter().filter(|(k, _)| *k != "policy").map(|(k, v)| {
                let unit = if k.ends_with("_s") { "s" } else { "" };
                format!("{}{unit}", value_label(v))
            }))
            .collect::<Vec<_>>()
            .join("-"),
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

/// The most cells a sweep may have. Axes multiply, so a short file can describe a grid
/// whose enumeration alone would fill memory (26 two-valued axes make 2²⁶ cells); the
/// largest shipped sweep has 150 cells, and each cell is a whole training run.
const MAX_CELLS: usize = 10_000;

impl Sweep {
    /// Reads a sweep file; `overrides` (`key=value`, as `fedsel run --set`) apply to every
    /// cell, after the base and `[config]` and before the axes.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self, ConfigError> {
        let read = |p: &Path| {
            std::fs::read_to_string(p).map_err(|e| ConfigError::Parse {
                source_name: p.display().to_string(),
                message: e.to_string(),
            })
        };
        let text = read(path)?;
        let here = path.parent().unwrap_or(Path::new(""));
        Self::from_toml_str(&text, &path.display().to_string(), here, overrides, read)
    }

    /// Parses the text of a sweep file as [`Sweep::load`] does: `name` names it in errors,
    /// relative paths in it are relative to `here`, and `read_base` returns the text of the
    /// base config at the path its `base` key gives.
    pub fn from_toml_str(
        text: &str,
        name: &str,
        here: &Path,
        overrides: &[String],
        read_base: impl FnOnce(&Path) -> Result<String, ConfigError>,
    ) -> Result<Self, ConfigError> {
        let file: SweepFile =
            toml::from_str(text).map_err(|e: toml::de::Error| ConfigError::Parse {
                source_name: name.into(),
                message: e.to_string(),
            })?;
        let mut base: toml::Table = match &file.base {
            Some(b) => {
                let p = here.join(b);
                let base_name = p.display().to_string();
                let t = read_base(&p)?;
                let mut table = fedsel::config::parse_toml(&t, &base_name)?;
                fedsel::config::anchor_paths(&mut table, p.parent().unwrap_or(Path::new("")));
                Config::read_keys(table.clone(), &base_name)?;
                table
            }
            None => toml::Table::new(),
        };
        let mut inline = file.config;
        fedsel::config::anchor_paths(&mut inline, here);
        merge(&mut base, inline);
        for o in overrides {
            fedsel::config::apply_override(&mut base, o)?;
        }
        let mut axes = Vec::new();
        let a = file.axes;
        for (label, named) in [("setting", a.case), ("method", a.method)] {
            if let Some(named) = named {
                if named.is_empty() {
                    return Err(ConfigError::invalid(
                        format!("axes.{}", if label == "setting" { "case" } else { label }),
                        "is empty; give it at least one entry or leave it out",
                    ));
                }
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
            if let Some(values) = values {
                if values.is_empty() {
                    return Err(ConfigError::invalid(
                        format!("axes.{label}"),
                        "is empty; give it at least one value or leave it out",
                    ));
                }
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
        let cells = sweep.cells()?;
        let mut dirs = std::collections::HashMap::new();
        for c in &cells {
            if let Some(first) = dirs.insert(c.dir_name.clone(), c.label.clone()) {
                return Err(ConfigError::invalid(
                    "axes",
                    format!(
                        "cells `{first}` and `{}` resolve to the same config (a repeated axis value, such as a seed listed twice)",
                        c.label
                    ),
                ));
            }
        }
        if let Some(b) = &sweep.baseline {
            let methods: Vec<String> = cells.iter().map(Cell::method).collect();
            if !methods.contains(b) {
                let mut known = methods;
                known.sort();
                known.dedup();
                return Err(ConfigError::invalid(
                    "baseline",
                    format!("`{b}` is none of the sweep's methods: {}", known.join(", ")),
                ));
            }
        }
        Ok(sweep)
    }

    /// Every cell of the grid, resolved and validated, in grid order (last axis fastest).
    pub fn cells(&self) -> Result<Vec<Cell>, ConfigError> {
        let size = self
            .axes
            .iter()
            .try_fold(1usize, |n, a| n.checked_mul(a.values.len()))
            .filter(|&n| n <= MAX_CELLS)
            .ok_or_else(|| {
                ConfigError::invalid(
                    "axes",
                    format!(
                        "the grid has more than {MAX_CELLS} cells ({} axes of {} values)",
                        self.axes.len(),
                        self.axes
                            .iter()
                            .map(|a| a.values.len().to_string())
                            .collect::<Vec<_>>()
                            .join(" × ")
                    ),
                )
            })?;
        let mut combos: Vec<Vec<usize>> = Vec::with_capacity(size);
        combos.push(Vec::new());
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
                let hash = config.hash();
                let dir_name = format!("{}-{}", sanitize(&label), &hash[..12]);
                Ok(Cell {
                    label,
                    parts,
                    config,
                    dir_name,
                    hash,
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

/// One of N disjoint parts of a sweep's grid, for array jobs (`--shard I/N`): several
/// processes, on one machine or many, each run their part into one shared output directory.
///
/// The cells are ranked by the hash of their resolved config and dealt out in turn: part I
/// holds ranks r with r mod N = I - 1. Parts differ in size by at most one cell, and
/// because the hash order ignores the grid's layout, a part does not end up holding one
/// value of one axis (methods, settings and seeds differ in cost), as dealing in grid order
/// does when the innermost axis has N values. The split depends only on
/// the sweep file and its `--set`s, so every shard computes the same one; per-cell locks
/// keep a cell from running twice even if two shards were started from different files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    index: usize,
    count: usize,
}

impl Shard {
    /// The whole grid, one part.
    pub const ALL: Self = Self { index: 1, count: 1 };

    /// Part `index` (1-based) of `count`.
    pub fn new(index: usize, count: usize) -> std::result::Result<Self, ConfigError> {
        if count == 0 || index == 0 || index > count {
            return Err(ConfigError::invalid(
                "--shard",
                format!("{index}/{count} names no part: use I/N with 1 <= I <= N"),
            ));
        }
        Ok(Self { index, count })
    }

    /// This part's cells of the grid `cells`, in grid order.
    pub fn part<'a>(&self, cells: &'a [Cell]) -> Vec<&'a Cell> {
        let mut by_hash: Vec<usize> = (0..cells.len()).collect();
        by_hash.sort_by(|&a, &b| cells[a].hash.cmp(&cells[b].hash).then(a.cmp(&b)));
        let mut mine: Vec<usize> = by_hash
            .into_iter()
            .enumerate()
            .filter(|(rank, _)| rank % self.count == self.index - 1)
            .map(|(_, i)| i)
            .collect();
        mine.sort_unstable();
        mine.into_iter().map(|i| &cells[i]).collect()
    }

    /// The file whose lock this part's sweep holds: one per part, so parts run side by side.
    fn lock_file(&self) -> String {
        if self.count == 1 {
            "sweep.lock".into()
        } else {
            format!("sweep.shard-{}-of-{}.lock", self.index, self.count)
        }
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl std::str::FromStr for Shard {
    type Err = ConfigError;

    fn from_str(s: &str) -> std::result::Result<Self, ConfigError> {
        let bad = || ConfigError::invalid("--shard", format!("`{s}` is not I/N (e.g. 2/8)"));
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let i = i.trim().parse().map_err(|_| bad())?;
        let n = n.trim().parse().map_err(|_| bad())?;
        Self::new(i, n)
    }
}

/// An OS advisory lock (`flock`) on a file, released when dropped. The kernel releases it
/// when its process dies however it dies: a lock file left behind by a dead process is not
/// locked, and the next one takes it over. The file names its holder, for the message a
/// second process prints.
#[derive(Debug)]
pub struct SweepLock {
    file: std::fs::File,
    /// The holder a stale lock file named, when this lock took one over.
    pub took_over: Option<String>,
}

impl SweepLock {
    /// Takes the lock of `out` for the whole grid (creating the directory), or fails with
    /// [`Error::SweepLocked`] while a live process holds it.
    pub fn acquire(out: &Path) -> Result<Self> {
        Self::acquire_shard(out, Shard::ALL)
    }

    /// Takes the lock of one part of the grid in `out`: parts lock separately, so shards
    /// of one sweep run side by side while a second process for the same part is refused.
    pub fn acquire_shard(out: &Path, shard: Shard) -> Result<Self> {
        let path = out.join(shard.lock_file());
        let io = |source| Error::Output {
            path: path.clone(),
            error: source,
        };
        std::fs::create_dir_all(out).map_err(io)?;
        Self::try_file(&path)?.ok_or_else(|| Error::SweepLocked {
            dir: out.to_path_buf(),
            holder: std::fs::read_to_string(&path)
                .unwrap_or_default()
                .trim()
                .to_string(),
        })
    }

    /// Takes the lock of `path`, or `None` while a live process holds it.
    fn try_file(path: &Path) -> Result<Option<Self>> {
        use std::io::{Read, Seek, Write};
        let io = |source| Error::Output {
            path: path.to_path_buf(),
            error: source,
        };
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
            Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
        }
        let mut holder = String::new();
        file.read_to_string(&mut holder).map_err(io)?;
        let took_over = Some(holder.trim().to_string()).filter(|h| !h.is_empty());
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        write!(file, "pid {} since unix time {stamp}", std::process::id()).map_err(io)?;
        file.flush().map_err(io)?;
        Ok(Some(Self { file, took_over }))
    }
}

impl Drop for SweepLock {
    /// Empties the file, so the next process sees a clean release rather than a stale lock.
    /// The file itself stays: removing it could let two processes lock two different files.
    fn drop(&mut self) {
        let _ = self.file.set_len(0);
    }
}

/// How a sweep run went.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepOutcome {
    /// Cells in the grid.
    pub total: usize,
    /// Cells in this run's part of the grid (all of them unless sharded).
    pub shard_cells: usize,
    /// Cells of this part already finished before this invocation (or by another process
    /// while it ran).
    pub skipped: usize,
    /// Cells run to completion now.
    pub ran: usize,
    /// Cells another process (a shard started twice, a Ray task) was running, left to it.
    pub busy: usize,
    /// Cells that failed, with their errors.
    pub failed: Vec<(String, String)>,
    /// Labels of the grid's cells, in any part, that are not finished once this run ends:
    /// the report covers the whole grid only when this is empty.
    pub unfinished: Vec<String>,
    /// The config or data error that stopped the sweep (see [`run`]'s `keep_going`), as
    /// the first cell to fail with it gave it; `None` when the sweep ran every cell.
    pub stopped: Option<String>,
    /// Cells of this part never started because the sweep stopped.
    pub not_run: usize,
}

/// Receives sweep progress.
pub trait SweepProgress: Sync {
    /// A cell finished (or failed) and `done` of `total` are now settled.
    fn cell_done(&self, label: &str, done: usize, total: usize, ok: bool);
}

/// What became of one cell handed to [`run_cell`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CellRun {
    /// It was already finished; nothing ran.
    AlreadyFinished,
    /// It ran to completion now.
    Ran,
    /// Another live process holds its lock and is running it.
    Busy,
}

/// Resolves the grid and writes the sweep's index (`sweep.json`) and `cells/` under `out`;
/// every process that runs cells of this sweep calls it first, and all write the same index.
pub fn prepare(sweep: &Sweep, out: &Path) -> Result<Vec<Cell>> {
    let cells = sweep.cells()?;
    let cells_dir = out.join("cells");
    std::fs::create_dir_all(&cells_dir).map_err(|source| Error::Output {
        path: cells_dir.clone(),
        error: source,
    })?;
    write_index(sweep, &cells, out)?;
    Ok(cells)
}

/// Runs every unfinished cell of `shard`'s part of `sweep` under `out/cells/`, `jobs` at a
/// time, each on `threads` rayon threads, loading data from `data_dir`.
///
/// Unless `keep_going`, a sweep stops starting cells when the first two cells it runs (in
/// the order they end; cells found finished or busy do not count) both fail with the same
/// config, data or partition error, compared with each cell's label and directory name
/// taken out: a missing dataset or a bad key fails every cell alike, and running the
/// rest would only repeat the error. Cells already running finish.
#[allow(clippy::too_many_arguments)]
pub fn run(
    sweep: &Sweep,
    out: &Path,
    data_dir: &Path,
    shard: Shard,
    jobs: usize,
    threads: usize,
    keep_going: bool,
    progress: &dyn SweepProgress,
) -> Result<SweepOutcome> {
    let lock = SweepLock::acquire_shard(out, shard)?;
    if let Some(holder) = &lock.took_over {
        tracing::warn!(
            "{}: took over a stale lock left by a sweep that is no longer running ({holder})",
            out.display()
        );
    }
    let cells = prepare(sweep, out)?;
    let cells_dir = out.join("cells");
    let mine = shard.part(&cells);
    let todo: Vec<&Cell> = mine
        .iter()
        .copied()
        .filter(|c| !is_finished(&cells_dir.join(&c.dir_name)))
        .collect();
    let outcome = Mutex::new(SweepOutcome {
        total: cells.len(),
        shard_cells: mine.len(),
        skipped: mine.len() - todo.len(),
        ..SweepOutcome::default()
    });
    let next = AtomicUsize::new(0);
    let settled = AtomicUsize::new(mine.len() - todo.len());
    // The first two cells run, each as its error when it failed with one that would fail
    // the other cells alike, with the cell's own names taken out.
    let first = Mutex::new(Vec::<Option<String>>::with_capacity(2));
    let halt = AtomicBool::new(false);
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1).min(todo.len().max(1)) {
            s.spawn(|| {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads.max(1))
                    .build()
                    .expect("a thread pool");
                loop {
                    if halt.load(Ordering::SeqCst) {
                        break;
                    }
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(cell) = todo.get(i) else { break };
                    let result = pool.install(|| run_cell(cell, out, data_dir));
                    if !keep_going && matches!(result, Ok(CellRun::Ran) | Err(_)) {
                        let mut seen = first.lock().expect("no panics while holding the lock");
                        if seen.len() < 2 {
                            seen.push(result.as_ref().err().and_then(|e| shared_error(e, cell)));
                            if let [Some(a), Some(b)] = seen.as_slice()
                                && a == b
                            {
                                halt.store(true, Ordering::SeqCst);
                            }
                        }
                    }
                    let done = settled.fetch_add(1, Ordering::SeqCst) + 1;
                    let mut o = outcome.lock().expect("no panics while holding the lock");
                    let ok = match result {
                        Ok(CellRun::Ran) => {
                            o.ran += 1;
                            true
                        }
                        Ok(CellRun::AlreadyFinished) => {
                            o.skipped += 1;
                            true
                        }
                        Ok(CellRun::Busy) => {
                            o.busy += 1;
                            true
                        }
                        Err(e) => {
                            o.failed.push((cell.label.clone(), e.to_string()));
                            false
                        }
                    };
                    progress.cell_done(&cell.label, done, mine.len(), ok);
                }
            });
        }
    });
    drop(lock);
    let mut outcome = outcome.into_inner().expect("threads joined");
    if halt.into_inner() {
        outcome.stopped = outcome.failed.first().map(|(_, e)| e.clone());
        outcome.not_run = todo.len() - next.into_inner().min(todo.len());
    }
    outcome.unfinished = cells
        .iter()
        .filter(|c| !is_finished(&cells_dir.join(&c.dir_name)))
        .map(|c| c.label.clone())
        .collect();
    Ok(outcome)
}

/// `error`'s text without `cell`'s label and directory name, when it is of a kind that
/// every cell of a sweep meets alike (a config, data or partition error); `None` otherwise.
fn shared_error(error: &Error, cell: &Cell) -> Option<String> {
    matches!(
        error,
        Error::Config(_) | Error::Data(_) | Error::Partition(_)
    )
    .then(|| {
        error
            .to_string()
            .replace(&cell.dir_name, "<cell>")
            .replace(&cell.label, "<cell>")
    })
}

/// Runs one cell of a prepared sweep (see [`prepare`]) into `out/cells/`, under a lock of
/// its own (`cells/DIR.lock`), so that shards, Ray tasks or a second sweep never run the
/// same cell at once: a cell another live process holds is left to it ([`CellRun::Busy`]).
/// The cell continues from its checkpoint when an earlier attempt left one for this exact
/// config, and otherwise starts over, discarding any half-written files.
pub fn run_cell(cell: &Cell, out: &Path, data_dir: &Path) -> Result<CellRun> {
    let cells_dir = out.join("cells");
    let Some(_lock) = SweepLock::try_file(&cells_dir.join(format!("{}.lock", cell.dir_name)))?
    else {
        return Ok(CellRun::Busy);
    };
    let dir = cells_dir.join(&cell.dir_name);
    // Checked under the lock: another process may have finished it since it was listed.
    if is_finished(&dir) {
        return Ok(CellRun::AlreadyFinished);
    }
    let exp = Experiment::prepare(cell.config.clone(), data_dir)?;
    for w in cell.config.warnings(exp.clients.len()) {
        tracing::warn!(cell = %cell.label, "{w}");
    }
    let checkpoint = fedsel::checkpoint::load(&dir)
        .ok()
        .filter(|cp| cp.config_hash == cell.hash);
    // Each cell's trackers get a directory of their own, named as the cell's, recorded
    // absolute in the cell's resolved config so that a report written later, from any
    // working directory, links it.
    let mut config = exp.config.clone();
    if let Some(base) = &config.output.tensorboard {
        let tb = base.join(&cell.dir_name);
        config.output.tensorboard =
            Some(std::path::absolute(&tb).map_err(|source| Error::Output {
                path: tb.clone(),
                error: source,
            })?);
    }
    let (writer, result) = match checkpoint {
        Some(cp) => {
            // Refused before the rows after the checkpoint are dropped, so they stay.
            engine::check_resume(&exp, &cp)?;
            let mut w = RunWriter::resume(&dir, cp.next_round)?.with_trackers(&config)?;
            let r = engine::resume(&exp, &mut w, cp);
            (w, r)
        }
        None => {
            if dir.exists() {
                std::fs::remove_dir_all(&dir).map_err(|source| Error::Output {
                    path: dir.clone(),
                    error: source,
                })?;
            }
            let mut w = RunWriter::create(&dir, &config)?;
            let r = engine::run(&exp, &mut w);
            (w, r)
        }
    };
    match result {
        Ok(summary) => writer.finish(&summary).map(|()| CellRun::Ran),
        Err(e) => {
            let done = std::fs::read_to_string(dir.join("metrics.csv"))
                .map_or(0, |m| m.lines().count().saturating_sub(1));
            writer.fail(&e, done)?;
            Err(e)
        }
    }
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
                "strategy": c.method(),
                "seed": c.config.seed,
                "setting": if setting.is_empty() { "all".to_string() } else { setting.join(",") },
                "targets": c.config.targets,
            })
        })
        .collect();
    let index = serde_json::json!({ "name": sweep.name, "baseline": sweep.baseline, "version": fedsel::VERSION, "cells": entries });
    // Shards write the same index side by side: each writes its own temporary file and
    // renames it into place, so a reader never sees a half-written index.
    let path = out.join("sweep.json");
    let tmp = out.join(format!(".sweep.json.{}", std::process::id()));
    std::fs::write(&tmp, serde_json::to_string_pretty(&index).expect("json"))
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|source| Error::Output {
            path,
            error: source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by reading `cells` while fuzzing the sweep parser, and confirmed with the
    /// fuzz target, which timed out on this 600-byte file: 2²⁶ cells.
    #[test]
    fn a_grid_past_the_cell_limit_is_refused_before_it_is_enumerated() {
        let keys: Vec<String> = (0..26).map(|i| format!("\"k{i}\" = [1, 2]")).collect();
        let text = format!("name = \"t\"\n[axes]\nset = {{ {} }}\n", keys.join(", "));
        let err = Sweep::from_toml_str(&text, "s.toml", Path::new(""), &[], |_| {
            unreachable!("no base")
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("more than 10000 cells"), "{err}");
    }

    #[test]
    fn grid_labels_and_hashes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.toml");
        std::fs::write(
            &path,
            "name = \"t\"\n[config]\nrounds = 3\n[axes]\nstrategy = [\"uniform\", \"md\"]\nseed = [1, 2]\nset = { \"train.lr\" = [0.1, 0.2] }\n",
        )
        .unwrap();
        let sweep = Sweep::load(&path, &[]).unwrap();
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
            Sweep::load(&path, &[]).unwrap().cells().unwrap()[3].dir_name,
            cells[3].dir_name
        );
    }

    /// Device profiles and round policies are plain axes: `system.kind` a string, and
    /// `system.round` a table whose label reads as the policy and its parameter, seconds
    /// marked; each cell's config carries the value.
    #[test]
    fn device_profiles_and_round_policies_are_axes_with_readable_labels() {
        use fedsel::system::{RoundPolicy, SystemKind};
        let text = "name = \"t\"\n[axes]\nseed = [1]\nset = { \"system.kind\" = [\"lognormal\"], \"system.round\" = [{ policy = \"wait_all\" }, { policy = \"overcommit\", overcommit = 0.3 }, { policy = \"deadline\", deadline_s = 30 }] }\n";
        let sweep =
            Sweep::from_toml_str(text, "t", Path::new(""), &[], |_| unreachable!()).unwrap();
        let cells = sweep.cells().unwrap();
        let labels: Vec<&str> = cells.iter().map(|c| c.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "s1-lognormal-wait_all",
                "s1-lognormal-overcommit-0.3",
                "s1-lognormal-deadline-30s"
            ]
        );
        let system = |i: usize| cells[i].config.system.clone().unwrap();
        assert_eq!(system(0).kind, SystemKind::Lognormal);
        assert_eq!(system(1).round, RoundPolicy::Overcommit { overcommit: 0.3 });
        assert_eq!(system(2).round, RoundPolicy::Deadline { deadline_s: 30.0 });
        assert_eq!(cells[2].parts[2], ("round".into(), "deadline-30s".into()));
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
        let cells = Sweep::load(&path, &[]).unwrap().cells().unwrap();
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
        let err = Sweep::load(&path, &[]).unwrap_err().to_string();
        assert!(err.contains("train.lr"), "{err}");
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// Item 8 of the reliability issue: mistakes that used to be dropped silently.
    #[test]
    fn sweep_mistakes_are_errors_that_name_them() {
        let dir = tempfile::tempdir().unwrap();
        let err = |text: &str| {
            let p = write(dir.path(), "s.toml", text);
            Sweep::load(&p, &[]).unwrap_err().to_string()
        };
        let e = err("name = \"t\"\n[axes]\nseed = []\nstrategy = [\"uniform\"]\n");
        assert!(e.contains("axes.seed") && e.contains("empty"), "{e}");
        let e = err("name = \"t\"\n[axes]\nseed = [1]\nmethod = []\n");
        assert!(e.contains("axes.method") && e.contains("empty"), "{e}");
        let e =
            err("name = \"t\"\nbaseline = \"unifrom\"\n[axes]\nstrategy = [\"uniform\", \"md\"]\n");
        assert!(e.contains("unifrom") && e.contains("md, uniform"), "{e}");
        let e = err("name = \"t\"\n[axes]\nseed = [1, 2, 1]\n");
        assert!(e.contains("s1") && e.contains("same config"), "{e}");
        // A method label is a valid baseline.
        let p = write(
            dir.path(),
            "ok.toml",
            "name = \"t\"\nbaseline = \"prox\"\n[axes]\nseed = [1]\n[[axes.method]]\nlabel = \"prox\"\nset = { \"train.prox_mu\" = 0.01 }\n",
        );
        Sweep::load(&p, &[]).unwrap();
        // An unknown key in the base file names the base file.
        write(dir.path(), "base.toml", "rounds = 3\n[train]\nlrr = 0.1\n");
        let e = err("name = \"t\"\nbase = \"base.toml\"\n[axes]\nseed = [1]\n");
        assert!(e.contains("base.toml") && e.contains("lrr"), "{e}");
    }

    #[test]
    fn set_overrides_every_cell_before_the_axes() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            dir.path(),
            "s.toml",
            "name = \"t\"\n[config]\nrounds = 50\n[axes]\nseed = [1, 2]\nset = { \"train.lr\" = [0.1, 0.2] }\n",
        );
        let plain = Sweep::load(&p, &[]).unwrap().cells().unwrap();
        let short = Sweep::load(&p, &["rounds=5".into(), "train.lr=9.0".into()])
            .unwrap()
            .cells()
            .unwrap();
        assert!(short.iter().all(|c| c.config.rounds == 5));
        // The axis still wins over --set, and the directories change with the config.
        assert_eq!(short[1].config.train.lr, 0.2);
        assert!(
            plain
                .iter()
                .zip(&short)
                .all(|(a, b)| a.dir_name != b.dir_name)
        );
        let e = Sweep::load(&p, &["train.lrr=1".into()]).unwrap_err();
        assert!(e.to_string().contains("lrr"), "{e}");
    }

    /// A trace named in a base file is found from the base file's directory, whatever the
    /// working directory, as is one named in the sweep's own `[config]`.
    #[test]
    fn trace_paths_are_relative_to_the_file_that_names_them() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("configs");
        std::fs::create_dir(&sub).unwrap();
        write(
            &sub,
            "base.toml",
            "rounds = 3\navailability = { kind = \"trace\", trace = \"avail.csv\" }\n",
        );
        let p = write(
            &sub,
            "s.toml",
            "name = \"t\"\nbase = \"base.toml\"\n[axes]\nseed = [1]\n",
        );
        let trace_of = |c: &Config| match &c.availability {
            fedsel::config::AvailabilityConfig::Trace(t) => t.trace.clone(),
            other => panic!("{other:?}"),
        };
        let first_cell = |p: &Path| {
            Sweep::load(p, &[]).unwrap().cells().unwrap()[0]
                .config
                .clone()
        };
        assert_eq!(trace_of(&first_cell(&p)), sub.join("avail.csv"));
        let p = write(
            &sub,
            "inline.toml",
            "name = \"t\"\n[config]\navailability = { kind = \"trace\", trace = \"t.csv\" }\n[axes]\nseed = [1]\n",
        );
        assert_eq!(trace_of(&first_cell(&p)), sub.join("t.csv"));
        let c = Config::load(Some(&sub.join("base.toml")), &[]).unwrap();
        assert_eq!(trace_of(&c), sub.join("avail.csv"));
    }

    #[test]
    fn shards_are_disjoint_cover_the_grid_and_bad_ones_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.toml");
        std::fs::write(
            &path,
            "name = \"t\"\n[axes]\nstrategy = [\"uniform\", \"md\"]\nseed = [1, 2, 3, 4, 5]\n",
        )
        .unwrap();
        let cells = Sweep::load(&path, &[]).unwrap().cells().unwrap();
        let parts: Vec<Shard> = (1..=3).map(|i| format!("{i}/3").parse().unwrap()).collect();
        let mut seen: Vec<&str> = Vec::new();
        for p in &parts {
            let part = p.part(&cells);
            // 10 cells in 3 parts: 4, 3, 3.
            assert!((3..=4).contains(&part.len()), "{}", part.len());
            seen.extend(part.iter().map(|c| c.label.as_str()));
        }
        seen.sort_unstable();
        let mut all: Vec<&str> = cells.iter().map(|c| c.label.as_str()).collect();
        all.sort_unstable();
        assert_eq!(seen, all, "the parts are disjoint and cover the grid");
        assert_eq!(Shard::ALL.part(&cells).len(), cells.len());
        assert_eq!(
            " 2 / 3 ".trim().parse::<Shard>().unwrap().to_string(),
            "2/3"
        );
        for bad in ["0/3", "4/3", "1/0", "2", "a/b", "-1/2"] {
            let e = bad.parse::<Shard>().unwrap_err().to_string();
            assert!(e.contains("--shard"), "{bad}: {e}");
        }
        // Parts lock separately; the same part twice is refused.
        let one = SweepLock::acquire_shard(dir.path(), parts[0]).unwrap();
        let _two = SweepLock::acquire_shard(dir.path(), parts[1]).unwrap();
        assert!(SweepLock::acquire_shard(dir.path(), parts[0]).is_err());
        drop(one);
        assert!(SweepLock::acquire_shard(dir.path(), parts[0]).is_ok());
    }

    #[test]
    fn a_locked_sweep_directory_is_refused_and_a_stale_lock_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let held = SweepLock::acquire(&out).unwrap();
        assert_eq!(held.took_over, None);
        let e = SweepLock::acquire(&out).unwrap_err().to_string();
        assert!(
            e.contains("another sweep is running")
                && e.contains(&format!("pid {}", std::process::id())),
            "{e}"
        );
        drop(held);
        // A clean release leaves nothing to take over.
        assert_eq!(SweepLock::acquire(&out).unwrap().took_over, None);
        // A lock file whose process died without releasing it: unlocked, but not empty.
        std::fs::write(out.join("sweep.lock"), "pid 4242 since unix time 1").unwrap();
        let again = SweepLock::acquire(&out).unwrap();
        assert_eq!(
            again.took_over.as_deref(),
            Some("pid 4242 since unix time 1")
        );
    }

    struct Silent;
    impl SweepProgress for Silent {
        fn cell_done(&self, _: &str, _: usize, _: usize, _: bool) {}
    }

    /// Runs the sweep file `text` with one job into a fresh directory, loading data from
    /// an empty directory (so Fashion-MNIST and CIFAR-10 are missing).
    fn run_in_empty(text: &str, keep_going: bool) -> SweepOutcome {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "s.toml", text);
        let sweep = Sweep::load(&path, &[]).unwrap();
        let empty = dir.path().join("no-data");
        std::fs::create_dir(&empty).unwrap();
        run(
            &sweep,
            &dir.path().join("out"),
            &empty,
            Shard::ALL,
            1,
            1,
            keep_going,
            &Silent,
        )
        .unwrap()
    }

    const MISSING_FMNIST: &str = "name = \"t\"\n[config]\nrounds = 2\ndataset = { kind = \"fmnist\" }\n[axes]\nseed = [1, 2, 3, 4]\n";

    #[test]
    fn the_first_two_cells_failing_alike_stop_the_sweep_unless_keep_going() {
        let stopped = run_in_empty(MISSING_FMNIST, false);
        assert_eq!((stopped.ran, stopped.not_run), (0, 2));
        assert_eq!(
            stopped
                .failed
                .iter()
                .map(|(l, _)| l.as_str())
                .collect::<Vec<_>>(),
            ["s1", "s2"]
        );
        let why = stopped.stopped.as_deref().expect("the sweep stopped");
        assert!(why.contains("fmnist") && why.contains("not found"), "{why}");
        assert_eq!(why, stopped.failed[0].1);
        assert_eq!(stopped.unfinished.len(), 4);
        let all = run_in_empty(MISSING_FMNIST, true);
        assert_eq!((all.failed.len(), all.not_run, all.stopped), (4, 0, None));
    }

    #[test]
    fn different_errors_or_a_success_among_the_first_two_cells_run_on() {
        let case = |label: &str, kind: &str| {
            format!(
                "[[axes.case]]\nlabel = \"{label}\"\nset = {{ \"dataset.kind\" = \"{kind}\" }}\n"
            )
        };
        let head = "name = \"t\"\n[config]\nrounds = 2\n";
        // Two different datasets missing: their errors differ.
        let differ = run_in_empty(
            &[
                head,
                &case("f", "fmnist"),
                &case("c", "cifar10"),
                &case("g", "fmnist"),
            ]
            .concat(),
            false,
        );
        assert_eq!(
            (differ.failed.len(), differ.not_run, differ.stopped),
            (3, 0, None)
        );
        // The second cell runs: the third fails as the first did, but is not among the
        // first two.
        let success = run_in_empty(
            &[
                head,
                &case("f", "fmnist"),
                &case("s", "synthetic"),
                &case("g", "fmnist"),
            ]
            .concat(),
            false,
        );
        assert_eq!(
            (success.ran, success.failed.len(), success.stopped),
            (1, 2, None)
        );
    }

    #[test]
    fn errors_that_differ_only_by_the_cells_names_are_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            dir.path(),
            "s.toml",
            "name = \"t\"\n[axes]\nseed = [1, 2]\n",
        );
        let cells = Sweep::load(&path, &[]).unwrap().cells().unwrap();
        let own = |c: &Cell| {
            Error::from(ConfigError::invalid(
                "dataset.path",
                format!("{}/{}: no such file", c.dir_name, c.label),
            ))
        };
        let (a, b) = (&cells[0], &cells[1]);
        assert_ne!(own(a).to_string(), own(b).to_string());
        assert_eq!(shared_error(&own(a), a), shared_error(&own(b), b));
        assert!(shared_error(&own(a), a).is_some());
        let run_error = Error::Interrupted { round: 3 };
        assert_eq!(shared_error(&run_error, a), None);
    }
}

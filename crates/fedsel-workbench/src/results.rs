//! The per-seed results behind `docs/results.md`: collected from sweeps into CSV files under
//! `results/`, judged against the paper's values by [`crate::verdict`], rendered into the
//! page's generated blocks, and checked.
//!
//! A results directory holds (`results/README.md` documents the columns):
//! - `*.csv` except `paper.csv`: one row per (cell, seed), [`Row`];
//! - `paper.csv`: one row per cell the paper reports, [`PaperRow`]; these are the planned
//!   comparisons a section's counts are out of;
//! - `sections.toml`: per section, the code paths its runs depend on and notes
//!   ([`SectionInfo`]).
//!
//! - `claims/*.toml`: the papers' headline claims, each tested by a paired comparison over a
//!   section's rows ([`claims`]).
//!
//! A page holds each section's generated text between `<!-- results:NAME begin -->` and
//! `<!-- results:NAME end -->`. [`render`] rewrites those blocks from the CSVs; [`check`] says
//! where the page no longer matches them, or where a section's code paths changed after the
//! commit that ran it without a note saying why that does not matter.

use std::collections::{BTreeMap, BTreeSet};

use std::path::{Path, PathBuf};

use fedsel::config::Config;

use fedsel::error::{ConfigError, Error, Result};

use serde::{Deserialize, Serialize};

use crate::stats::Obs;

use crate::verdict::{self, Judgement, MarginSource, Verdict};

mod check;
pub mod claims;
mod collect;
mod history;
pub mod registration;
mod render;

pub use check::*;
pub use collect::*;
pub use history::*;
pub use render::*;

/// The file of paper values in a results directory.
pub const PAPER_FILE: &str = "paper.csv";

/// The file naming each section's code paths.
pub const SECTIONS_FILE: &str = "sections.toml";

/// The metrics `collect` reads from a run's `summary.json`.
pub const METRICS: [&str; 6] = [
    "rounds_to_target",
    "time_to_target_s",
    "final_acc",
    "final_loss",
    "best_acc",
    "best_loss",
];

/// The file of FedGS's graph diagnostic in a run's directory.
pub const GRAPH_FILE: &str = "fedgs_graph.csv";

/// The metrics `collect` reads from [`GRAPH_FILE`] of a FedGS run with
/// `selection.fedgs.graph_quality`: FedGS Table 3's edge measure of the run's constructed
/// graph against the oracle, which the paper reports at each graph's best ε. `edge_f1` is
/// the largest F1 over the file's rows (counted with the authors' diagonal),
/// `edge_precision` and `edge_recall` are the precision and recall of that row (the
/// smallest ε on a tie), and `edge_f1_offdiag` is the largest F1 over pairs i < j only.
pub const GRAPH_METRICS: [&str; 4] = [
    "edge_f1",
    "edge_precision",
    "edge_recall",
    "edge_f1_offdiag",
];

/// One seed's value of one cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// The page's section (a block name).
    pub section: String,
    /// The paper's table (or figure).
    pub table: String,
    /// The table's setting (column group): a partition, availability mode, target.
    pub setting: String,
    /// The method (arm).
    pub method: String,
    /// The metric.
    pub metric: String,
    /// The run's seed.
    pub seed: u64,
    /// The value; for a censored seed, the bound (the rounds it ran).
    pub value: f64,
    /// Whether `value` is only a lower bound (a target never reached).
    pub censored: bool,
    /// Whether the arm was planned before the results were seen; an unplanned arm explains
    /// and is never counted.
    pub planned: bool,
    /// The command that ran it.
    pub command: String,
    /// The commit the command ran at.
    pub commit: String,
    /// The hash of the run's resolved config ([`Config::hash`]).
    pub config_hash: String,
}

/// The paper's value of one cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PaperRow {
    /// The page's section.
    pub section: String,
    /// The paper's table.
    pub table: String,
    /// The setting.
    pub setting: String,
    /// The method.
    pub method: String,
    /// The metric.
    pub metric: String,
    /// The paper's mean; empty where the paper gives none (N/A).
    pub mean: Option<f64>,
    /// The paper's std, if given.
    pub std: Option<f64>,
    /// The paper's seed count, if given.
    pub n: Option<usize>,
    /// Where in the paper: page, table, row.
    pub source: String,
}

/// What `sections.toml` says of one section.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SectionInfo {
    /// Code paths (relative to the repository root) whose change after a row's commit may
    /// change its result.
    #[serde(default)]
    pub paths: Vec<String>,
    /// Why changes to those paths since the rows' commits leave the results valid.
    #[serde(default)]
    pub notes: Option<String>,
    /// The last commit whose changes to `paths` the `notes` account for. A note vouches for
    /// what its writer saw, not for what comes after: a later change is a problem again
    /// until the notes say why it leaves the results standing and this moves. Notes without
    /// it leave the section unchecked, which [`check`] reports.
    #[serde(default)]
    pub notes_through: Option<String>,
    /// Methods whose rows here no longer match the current code (a change the notes cannot
    /// vouch for) and await a rerun: shown, but no claim's verdict on them is counted.
    #[serde(default)]
    pub not_current: Vec<String>,
}

/// A cell: (section, table, setting, method, metric).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CellKey {
    /// Section.
    pub section: String,
    /// Table.
    pub table: String,
    /// Setting.
    pub setting: String,
    /// Method.
    pub method: String,
    /// Metric.
    pub metric: String,
}

impl Row {
    /// The row's cell.
    pub fn key(&self) -> CellKey {
        CellKey {
            section: self.section.clone(),
            table: self.table.clone(),
            setting: self.setting.clone(),
            method: self.method.clone(),
            metric: self.metric.clone(),
        }
    }
}

impl PaperRow {
    /// The row's cell.
    pub fn key(&self) -> CellKey {
        CellKey {
            section: self.section.clone(),
            table: self.table.clone(),
            setting: self.setting.clone(),
            method: self.method.clone(),
            metric: self.metric.clone(),
        }
    }
}

fn bad(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Output {
        path: path.to_path_buf(),
        error: std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()),
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |error| Error::Output {
        path: path.to_path_buf(),
        error,
    }
}

fn read_csv<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Vec<T>> {
    let mut r = csv::Reader::from_path(path).map_err(|e| bad(path, e))?;
    r.deserialize()
        .map(|x| x.map_err(|e| bad(path, e)))
        .collect()
}

/// A results directory, read and validated.
#[derive(Debug, Clone, Default)]
pub struct Data {
    /// Every per-seed row, files in name order.
    pub rows: Vec<Row>,
    /// The paper values, in file order.
    pub paper: Vec<PaperRow>,
    /// `sections.toml`.
    pub sections: BTreeMap<String, SectionInfo>,
    /// `claims/*.toml`, checked against the rows.
    pub claims: Vec<claims::ClaimSpec>,
}

impl Data {
    /// Every section that has rows or paper values.
    pub fn section_names(&self) -> BTreeSet<String> {
        self.rows
            .iter()
            .map(|r| r.section.clone())
            .chain(self.paper.iter().map(|p| p.section.clone()))
            .collect()
    }
}

/// Reads a results directory: every `*.csv` (rows), `paper.csv`, `sections.toml` and
/// `claims/*.toml` (all three may be absent). Errors name the file and what is wrong: a value
/// that is not finite, a (cell, seed) recorded twice, a cell the paper file gives twice, a
/// section named like the claims block, a claim that is incomplete or names what the rows
/// lack ([`claims::load`]).
pub fn load(dir: &Path) -> Result<Data> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|x| x == "csv")
                && p.file_name().is_some_and(|n| n != PAPER_FILE)
        })
        .collect();
    files.sort();
    let mut data = Data::default();
    let mut seen: BTreeMap<(CellKey, u64), PathBuf> = BTreeMap::new();
    for f in &files {
        for r in read_csv::<Row>(f)? {
            if !r.value.is_finite() {
                return Err(bad(
                    f,
                    format!("seed {} of {:?}: value {}", r.seed, r.key(), r.value),
                ));
            }
            if r.section == claims::BLOCK {
                return Err(bad(
                    f,
                    format!("section `{}` is the name of the claims block", r.section),
                ));
            }
            if let Some(other) = seen.insert((r.key(), r.seed), f.clone()) {
                return Err(bad(
                    f,
                    format!(
                        "seed {} of {:?} is also in {}: one result is recorded once",
                        r.seed,
                        r.key(),
                        other.display()
                    ),
                ));
            }
            data.rows.push(r);
        }
    }
    let paper = dir.join(PAPER_FILE);
    if paper.is_file() {
        let mut keys = BTreeSet::new();
        for p in read_csv::<PaperRow>(&paper)? {
            if p.section == claims::BLOCK {
                return Err(bad(
                    &paper,
                    format!("section `{}` is the name of the claims block", p.section),
                ));
            }
            if !keys.insert(p.key()) {
                return Err(bad(&paper, format!("{:?} is given twice", p.key())));
            }
            let finite = p.mean.is_none_or(f64::is_finite)
                && p.std.is_none_or(|s| s.is_finite() && s >= 0.0);
            if !finite {
                return Err(bad(
                    &paper,
                    format!("{:?}: mean and std must be finite, std ≥ 0", p.key()),
                ));
            }
            data.paper.push(p);
        }
    }
    let sections = dir.join(SECTIONS_FILE);
    if sections.is_file() {
        let text = std::fs::read_to_string(&sections).map_err(io(&sections))?;
        data.sections = toml::from_str(&text).map_err(|e| bad(&sections, e))?;
    }
    data.claims = claims::load(dir, &data.rows, &data.paper)?;
    Ok(data)
}

fn num(metric: &str, x: f64) -> String {
    if metric.starts_with("rounds") || metric.starts_with("time") {
        format!("{x:.1}")
    } else {
        format!("{x:.4}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(metric: &str, target: Option<f64>) -> CollectArgs {
        CollectArgs {
            section: "s".into(),
            table: "t".into(),
            metric: metric.into(),
            target,
            command: "c".into(),
            commit: Some("abc".into()),
            unplanned: Vec::new(),
        }
    }

    /// Three ε rows whose F1 peaks twice (0.8 at ε = 0.01 and 0.1): the first peak's precision
    /// and recall are read; the F1 without the diagonal peaks at its own row.
    #[test]
    fn edge_metrics_take_the_best_epsilon_of_the_graph_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(GRAPH_FILE);
        std::fs::write(
            &path,
            "graph,edges,pairs,epsilon,built_edges,oracle_edges,matched,precision,recall,f1,precision_offdiag,recall_offdiag,f1_offdiag\n\
             Update,5,6,0,5,3,3,0.7,0.9,0.7875,0.6,1,0.75\n\
             Update,5,6,0.01,4,3,2,0.75,0.857143,0.8,0.5,0.666667,0.571429\n\
             Update,5,6,0.1,3,3,2,0.9,0.72,0.8,0.666667,0.666667,0.666667\n",
        )
        .unwrap();
        let v = |m| graph_metric(&path, m).unwrap();
        assert_eq!(
            (
                v("edge_f1"),
                v("edge_precision"),
                v("edge_recall"),
                v("edge_f1_offdiag")
            ),
            (0.8, 0.75, 0.857143, 0.75)
        );
        // A run without the diagnostic writes no F1: the error names the file and the key.
        std::fs::write(&path, "graph,edges,pairs\nUpdate,5,6\n").unwrap();
        let err = graph_metric(&path, "edge_f1").unwrap_err().to_string();
        assert!(
            err.contains(GRAPH_FILE)
                && err.contains("no column `f1`")
                && err.contains("graph_quality"),
            "{err}"
        );
    }

    /// A clock run that reached 0.5 after 812.5 virtual seconds and never 0.7, in 40
    /// rounds and 1,930.25 s: reached targets read as they are, a missed one is censored at
    /// the run's last round or clock reading.
    #[test]
    fn times_to_target_are_read_and_censored_at_the_last_clock_reading() {
        let s = serde_json::json!({
            "rounds": 40,
            "clock_s": 1930.25,
            "rounds_to_target": [[0.5, 12], [0.7, null]],
            "time_to_target_s": [[0.5, 812.5], [0.7, null]],
        });
        let p = Path::new("run/summary.json");
        let v = |m, t| metric_value(&s, p, &args(m, Some(t))).unwrap();
        assert_eq!(v("time_to_target_s", 0.5), (812.5, false));
        assert_eq!(v("time_to_target_s", 0.7), (1930.25, true));
        assert_eq!(v("rounds_to_target", 0.5), (12.0, false));
        assert_eq!(v("rounds_to_target", 0.7), (40.0, true));
        let clockless = serde_json::json!({
            "rounds": 40,
            "time_to_target_s": [[0.7, null]],
        });
        let err = metric_value(&clockless, p, &args("time_to_target_s", None))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("run/summary.json") && err.contains("clock_s"),
            "{err}"
        );
    }
}

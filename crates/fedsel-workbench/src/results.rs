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
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use fedsel::config::Config;
use fedsel::error::{ConfigError, Error, Result};
use serde::{Deserialize, Serialize};

use crate::stats::Obs;
use crate::verdict::{self, Judgement, MarginSource, Verdict};

pub mod claims;
pub mod registration;

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

/// What `collect` needs besides the sweep.
#[derive(Debug, Clone)]
pub struct CollectArgs {
    /// The page's section.
    pub section: String,
    /// The paper's table.
    pub table: String,
    /// One of [`METRICS`].
    pub metric: String,
    /// For `rounds_to_target` and `time_to_target_s`: which target, when a run has several.
    pub target: Option<f64>,
    /// The command that ran the sweep (runs do not record it).
    pub command: String,
    /// The commit the sweep ran at. By default the one its runs record (`summary.json`'s
    /// `commit`, the binary's build); given, it must agree with them. Needed only for runs
    /// written before fedsel recorded it.
    pub commit: Option<String>,
    /// Methods added after the comparison was planned.
    pub unplanned: Vec<String>,
}

/// What `collect` did.
#[derive(Debug, Clone, PartialEq)]
pub struct Collected {
    /// The file the rows went into.
    pub file: PathBuf,
    /// Rows added.
    pub added: usize,
    /// Cells of the sweep left out because they have not finished.
    pub unfinished: Vec<String>,
}

#[derive(Deserialize)]
struct IndexCell {
    dir: String,
    label: String,
    strategy: String,
    setting: String,
}

#[derive(Deserialize)]
struct Index {
    cells: Vec<IndexCell>,
}

/// The commit a run's row records: the one its build wrote into `summary.json`, checked
/// against `given` (the `--commit` flag; either may be an abbreviation of the other), or
/// `given` for a run that records none (written before fedsel recorded it, or built outside
/// git). A planned row refuses a run whose build had uncommitted changes, or that builds of
/// several commits ran (resumed by another): no commit names its code.
fn row_commit(
    summary: &serde_json::Value,
    path: &Path,
    given: Option<&str>,
    planned: bool,
    held: &dyn Fn(&str) -> bool,
) -> Result<String> {
    let recorded: Vec<&str> = summary["commit"]
        .as_str()
        .unwrap_or("")
        .split(", ")
        .filter(|c| !c.is_empty() && *c != "unknown")
        .collect();
    let Some(&first) = recorded.first() else {
        return given.map(str::to_string).ok_or_else(|| {
            bad(
                path,
                "records no commit (written before fedsel recorded the build, or built outside git): give --commit",
            )
        });
    };
    if planned {
        if let Some(dirty) = recorded.iter().find(|c| c.ends_with("+dirty")) {
            return Err(bad(
                path,
                format!(
                    "was run by a build with uncommitted changes ({dirty}): no commit names its code, so its rows cannot be counted; commit, rebuild and rerun it, or collect its method with --unplanned"
                ),
            ));
        }
        if recorded.len() > 1 {
            return Err(bad(
                path,
                format!(
                    "was run by builds of several commits ({}), resumed by another binary: its rows mix two codes; rerun it with one, or collect its method with --unplanned",
                    recorded.join(", ")
                ),
            ));
        }
    }
    let bare = first.trim_end_matches("+dirty");
    if !held(bare) {
        // fedsel installed from its own repository runs a user's code (a Python selector)
        // for a results directory of another: the row names that repository's commit.
        return given.map(str::to_string).ok_or_else(|| {
            bad(
                path,
                format!(
                    "was run by fedsel built at {first}, a commit the results directory's repository does not hold (fedsel installed from its own checkout): give --commit, the commit of this repository the runs belong to"
                ),
            )
        });
    }
    if let Some(g) = given
        && (g.is_empty() || !(bare.starts_with(g) || g.starts_with(bare)))
    {
        return Err(bad(
            path,
            format!("was run at commit {first}, not at --commit {g}"),
        ));
    }
    Ok(first.to_string())
}

/// `fedsel results collect`: reads the finished cells of the sweep in `sweep_dir` and adds
/// one row per cell (its seed's value of `args.metric`) to `results_dir/SECTION.csv`. A row
/// for a (cell, seed) the file already holds is refused: one result is recorded once.
pub fn collect(sweep_dir: &Path, results_dir: &Path, args: &CollectArgs) -> Result<Collected> {
    let from_graph = GRAPH_METRICS.contains(&args.metric.as_str());
    if !from_graph && !METRICS.contains(&args.metric.as_str()) {
        return Err(ConfigError::invalid(
            "--metric",
            format!(
                "`{}`: expected one of {}, {}",
                args.metric,
                METRICS.join(", "),
                GRAPH_METRICS.join(", ")
            ),
        )
        .into());
    }
    for (name, v) in [
        ("--section", &args.section),
        ("--table", &args.table),
        ("--command", &args.command),
    ] {
        if v.trim().is_empty() {
            return Err(ConfigError::invalid(name, "must not be empty").into());
        }
    }
    if args.section == claims::BLOCK {
        return Err(ConfigError::invalid(
            "--section",
            format!(
                "`{}` names the page's block of claims; pick another name",
                args.section
            ),
        )
        .into());
    }
    if args
        .section
        .contains(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
    {
        return Err(ConfigError::invalid(
            "--section",
            format!(
                "`{}`: a section names a file and a block; use letters, digits, - and _",
                args.section
            ),
        )
        .into());
    }
    let index_path = sweep_dir.join("sweep.json");
    let text = std::fs::read_to_string(&index_path).map_err(io(&index_path))?;
    let index: Index = serde_json::from_str(&text).map_err(|e| bad(&index_path, e))?;
    // Whether the results directory's repository holds a commit (every commit is held
    // where the directory is in no repository: nothing to check it against).
    let repo = results_dir
        .ancestors()
        .find(|d| d.is_dir())
        .and_then(|d| git(d, &["rev-parse", "--show-toplevel"]).ok())
        .map(|r| PathBuf::from(r.trim()));
    let held = |c: &str| {
        repo.as_ref()
            .is_none_or(|r| git(r, &["cat-file", "-e", &format!("{c}^{{commit}}")]).is_ok())
    };
    let mut new = Vec::new();
    let mut unfinished = Vec::new();
    for cell in &index.cells {
        let dir = sweep_dir.join("cells").join(&cell.dir);
        if !crate::sweep::is_finished(&dir) {
            unfinished.push(cell.label.clone());
            continue;
        }
        let summary_path = dir.join("summary.json");
        let text = std::fs::read_to_string(&summary_path).map_err(io(&summary_path))?;
        let summary: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(&summary_path, e))?;
        let seed = summary["seed"]
            .as_u64()
            .ok_or_else(|| bad(&summary_path, "no `seed`"))?;
        let (value, censored) = if from_graph {
            (graph_metric(&dir.join(GRAPH_FILE), &args.metric)?, false)
        } else {
            metric_value(&summary, &summary_path, args)?
        };
        let planned = !args.unplanned.contains(&cell.strategy);
        let commit = row_commit(
            &summary,
            &summary_path,
            args.commit.as_deref(),
            planned,
            &held,
        )?;
        let cfg_path = dir.join("config.resolved.toml");
        let cfg_text = std::fs::read_to_string(&cfg_path).map_err(io(&cfg_path))?;
        let config = Config::from_toml_str(&cfg_text, &cfg_path.display().to_string(), &[])?;
        new.push(Row {
            section: args.section.clone(),
            table: args.table.clone(),
            setting: cell.setting.clone(),
            method: cell.strategy.clone(),
            metric: args.metric.clone(),
            seed,
            value,
            censored,
            planned,
            command: args.command.clone(),
            commit,
            config_hash: config.hash(),
        });
    }
    let file = results_dir.join(format!("{}.csv", args.section));
    let mut rows: Vec<Row> = if file.is_file() {
        read_csv(&file)?
    } else {
        Vec::new()
    };
    let mut seen: BTreeSet<(CellKey, u64)> = rows.iter().map(|r| (r.key(), r.seed)).collect();
    for r in &new {
        if !seen.insert((r.key(), r.seed)) {
            return Err(bad(
                &file,
                format!(
                    "already holds seed {} of {} / {} / {} / {}: one result is recorded once",
                    r.seed, r.table, r.setting, r.method, r.metric
                ),
            ));
        }
    }
    let added = new.len();
    rows.extend(new);
    std::fs::create_dir_all(results_dir).map_err(io(results_dir))?;
    let tmp = results_dir.join(format!(".{}.csv.tmp", args.section));
    {
        let mut w = csv::Writer::from_path(&tmp).map_err(|e| bad(&tmp, e))?;
        for r in &rows {
            w.serialize(r).map_err(|e| bad(&tmp, e))?;
        }
        w.flush().map_err(io(&tmp))?;
    }
    std::fs::rename(&tmp, &file).map_err(io(&file))?;
    Ok(Collected {
        file,
        added,
        unfinished,
    })
}

/// The value of `args.metric` in a run's summary, and whether it is censored: a target
/// never reached counts at the run's last round (`rounds_to_target`) or its last clock
/// reading (`time_to_target_s`, virtual seconds).
fn metric_value(
    summary: &serde_json::Value,
    path: &Path,
    args: &CollectArgs,
) -> Result<(f64, bool)> {
    let (censor_key, on_clock) = match args.metric.as_str() {
        "rounds_to_target" => ("rounds", false),
        "time_to_target_s" => ("clock_s", true),
        _ => ("", false),
    };
    if censor_key.is_empty() {
        return summary[&args.metric]
            .as_f64()
            .map(|v| (v, false))
            .ok_or_else(|| bad(path, format!("no value of `{}`", args.metric)));
    }
    let entries: Vec<(f64, Option<f64>)> = serde_json::from_value(summary[&args.metric].clone())
        .map_err(|e| bad(path, format!("`{}`: {e}", args.metric)))?;
    let targets: Vec<f64> = entries.iter().map(|e| e.0).collect();
    let entry = match args.target {
        Some(t) => entries
            .iter()
            .find(|e| (e.0 - t).abs() < 1e-9)
            .ok_or_else(|| {
                ConfigError::invalid(
                    "--target",
                    format!("{t}: {} has targets {targets:?}", path.display()),
                )
            })?,
        None if entries.len() == 1 => &entries[0],
        None => {
            return Err(ConfigError::invalid(
                "--target",
                format!(
                    "{} has targets {targets:?}: name the one to collect",
                    path.display()
                ),
            )
            .into());
        }
    };
    match entry.1 {
        Some(v) => Ok((v, false)),
        None => summary[censor_key]
            .as_f64()
            .map(|v| (v, true))
            .ok_or_else(|| {
                let why = if on_clock {
                    " (a run without `[system]`?)"
                } else {
                    ""
                };
                bad(path, format!("no `{censor_key}`{why}"))
            }),
    }
}

/// The value of one of [`GRAPH_METRICS`] in a run's [`GRAPH_FILE`], one row per ε. Errors
/// name the file, and the column a run without the diagnostic lacks.
fn graph_metric(path: &Path, metric: &str) -> Result<f64> {
    let hint = "(edge metrics need FedGS runs with selection.fedgs.graph_quality = true)";
    let mut r = csv::Reader::from_path(path).map_err(|e| bad(path, format!("{e} {hint}")))?;
    let headers = r.headers().map_err(|e| bad(path, e))?.clone();
    let column = |name: &str| {
        headers
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| bad(path, format!("no column `{name}` {hint}")))
    };
    let cols = [
        column("f1")?,
        column("precision")?,
        column("recall")?,
        column("f1_offdiag")?,
    ];
    let mut rows: Vec<[f64; 4]> = Vec::new();
    for record in r.records() {
        let record = record.map_err(|e| bad(path, e))?;
        let mut row = [0.0; 4];
        for (x, &c) in row.iter_mut().zip(&cols) {
            let text = record.get(c).unwrap_or_default();
            *x = text
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite())
                .ok_or_else(|| bad(path, format!("`{}`: not a number: `{text}`", &headers[c])))?;
        }
        rows.push(row);
    }
    let first_best = |i: usize| {
        rows.iter()
            .copied()
            .reduce(|best, row| if row[i] > best[i] { row } else { best })
            .ok_or_else(|| bad(path, "no rows"))
    };
    Ok(match metric {
        "edge_f1" => first_best(0)?[0],
        "edge_precision" => first_best(0)?[1],
        "edge_recall" => first_best(0)?[2],
        _ => first_best(3)?[3],
    })
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

/// What a table row says of a cell with no verdict of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    /// Judged by the rule.
    Judged(Verdict),
    /// The paper gives the cell no value (N/A).
    NoPaperValue,
    /// Planned, but no row yet.
    NotRun,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Judged(v) => v.label(),
            Status::NoPaperValue => "no paper value",
            Status::NotRun => "not run",
        }
    }
}

fn num(metric: &str, x: f64) -> String {
    if metric.starts_with("rounds") || metric.starts_with("time") {
        format!("{x:.1}")
    } else {
        format!("{x:.4}")
    }
}

/// The seeds of one cell as observations, in seed order.
fn observations(rows: &[&Row]) -> Vec<Obs> {
    let mut rs = rows.to_vec();
    rs.sort_by_key(|r| r.seed);
    rs.iter()
        .map(|r| {
            if r.censored {
                Obs::Above(r.value)
            } else {
                Obs::Value(r.value)
            }
        })
        .collect()
}

/// The judgement of one cell's rows against its paper row (`None` when it has no paper
/// value), with the margin's description.
fn judge_cell(
    rows: &[&Row],
    paper: Option<&PaperRow>,
    all_paper: &[PaperRow],
) -> (Option<Judgement>, String) {
    let obs = observations(rows);
    let Some((p, mean)) = paper.and_then(|p| p.mean.map(|m| (p, m))) else {
        return (None, "—".into());
    };
    let others: Vec<f64> = all_paper
        .iter()
        .filter(|o| {
            o.section == p.section
                && o.table == p.table
                && o.setting == p.setting
                && o.metric == p.metric
                && o.method != p.method
        })
        .filter_map(|o| o.mean)
        .collect();
    let m = verdict::margin(mean, p.std, &others);
    let text = match m {
        Some(m) => format!(
            "{} ({})",
            num(&p.metric, m.value),
            match m.source {
                MarginSource::PaperStd => "paper's std",
                MarginSource::HalfNearestGap => "½ nearest gap",
            }
        ),
        None => "—".into(),
    };
    let j = (!obs.is_empty()).then(|| verdict::judge(&obs, mean, m));
    (j, text)
}

fn ours(metric: &str, rows: &[&Row]) -> String {
    if rows.is_empty() {
        return "—".into();
    }
    let obs = observations(rows);
    let j = verdict::judge(&obs, 0.0, None);
    if j.censored > 0 {
        let at = rows
            .iter()
            .filter(|r| r.censored)
            .map(|r| r.value)
            .fold(f64::INFINITY, f64::min);
        format!(
            "≥ {} ({} of {} censored at {})",
            num(metric, j.mean),
            j.censored,
            j.n,
            num(metric, at)
        )
    } else {
        match j.interval {
            Some((lo, hi)) => format!(
                "{} [{}, {}]",
                num(metric, j.mean),
                num(metric, lo),
                num(metric, hi)
            ),
            None => num(metric, j.mean),
        }
    }
}

fn paper_text(p: Option<&PaperRow>) -> String {
    match p {
        None => "—".into(),
        Some(p) => {
            let mut s = match p.mean {
                Some(m) => num(&p.metric, m),
                None => "N/A".into(),
            };
            if let Some(sd) = p.std {
                let _ = write!(s, " ± {}", num(&p.metric, sd));
            }
            if let Some(n) = p.n {
                let _ = write!(s, ", {n} seeds");
            }
            s
        }
    }
}

const HEADER: &str = "| table | setting | method | metric | seeds | ours: mean [95 % t-interval] | paper | margin | verdict | paper's source |\n|---|---|---|---|---|---|---|---|---|---|\n";

fn table_row(
    out: &mut String,
    key: &CellKey,
    rows: &[&Row],
    paper: Option<&PaperRow>,
    status: Status,
    margin: &str,
) {
    let _ = writeln!(
        out,
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        key.table,
        key.setting,
        key.method,
        key.metric,
        rows.len(),
        ours(&key.metric, rows),
        paper_text(paper),
        margin,
        status.label(),
        paper.map_or("—", |p| p.source.as_str()),
    );
}

/// The generated text of every section with rows or paper values: its verdict table over
/// the planned cells (those in `paper.csv`), the counts computed from it, the unplanned arms
/// and the cells without a paper value below it (shown, never counted), and where the rows
/// came from; and, when the directory has claims and `history` can date them, the `claims`
/// block ([`claims::render`]). Errors name a claim whose values cannot be tested.
pub fn render(
    data: &Data,
    history: Option<&dyn registration::History>,
) -> Result<BTreeMap<String, String>> {
    let mut by_cell: BTreeMap<CellKey, Vec<&Row>> = BTreeMap::new();
    for r in &data.rows {
        by_cell.entry(r.key()).or_default().push(r);
    }
    let paper_of: BTreeMap<CellKey, &PaperRow> = data.paper.iter().map(|p| (p.key(), p)).collect();
    let mut out = BTreeMap::new();
    for section in data.section_names() {
        let mut planned_table = String::new();
        let mut counts: BTreeMap<Status, usize> = BTreeMap::new();
        let mut planned_cells = 0;
        for p in data.paper.iter().filter(|p| p.section == section) {
            let key = p.key();
            let rows: Vec<&Row> = by_cell
                .get(&key)
                .map(|v| v.iter().copied().filter(|r| r.planned).collect())
                .unwrap_or_default();
            let (j, margin) = judge_cell(&rows, Some(p), &data.paper);
            let status = match (p.mean, j) {
                (None, _) => Status::NoPaperValue,
                (Some(_), None) => Status::NotRun,
                (Some(_), Some(j)) => Status::Judged(j.verdict),
            };
            planned_cells += 1;
            *counts.entry(status).or_default() += 1;
            table_row(&mut planned_table, &key, &rows, Some(p), status, &margin);
        }
        let mut unplanned = String::new();
        let mut unpaired = String::new();
        for (key, rows) in by_cell.iter().filter(|(k, _)| k.section == section) {
            let paper = paper_of.get(key).copied();
            let extra: Vec<&Row> = rows.iter().copied().filter(|r| !r.planned).collect();
            if !extra.is_empty() {
                let (j, margin) = judge_cell(&extra, paper, &data.paper);
                let status = j.map_or(Status::NoPaperValue, |j| Status::Judged(j.verdict));
                table_row(&mut unplanned, key, &extra, paper, status, &margin);
            }
            let planned: Vec<&Row> = rows.iter().copied().filter(|r| r.planned).collect();
            if paper.is_none() && !planned.is_empty() {
                table_row(
                    &mut unpaired,
                    key,
                    &planned,
                    None,
                    Status::NoPaperValue,
                    "—",
                );
            }
        }
        let mut s = String::new();
        let _ = writeln!(
            s,
            "_Generated by `fedsel results render` from the per-seed rows and `paper.csv` of the results directory; the rule is in docs/reproducing.md. Do not edit by hand._\n"
        );
        let mut parts: Vec<String> = Verdict::ALL
            .iter()
            .map(|&v| Status::Judged(v))
            .chain([Status::NoPaperValue, Status::NotRun])
            .map(|st| format!("{} {}", counts.get(&st).copied().unwrap_or(0), st.label()))
            .collect();
        let last = parts.pop().unwrap_or_default();
        if planned_cells > 0 {
            let _ = writeln!(
                s,
                "**Counts** (computed): {}, {last}, of {planned_cells} planned cells.\n",
                parts.join(", ")
            );
        } else {
            let _ = writeln!(
                s,
                "No paper value is filed for this section's cells, so none is judged against the paper; they are our per-seed results, summarised:\n"
            );
        }
        if planned_cells > 0 {
            s.push_str(HEADER);
            s.push_str(&planned_table);
            s.push('\n');
        }
        if !unplanned.is_empty() {
            s.push_str(
                "Arms added after the comparison was planned (they explain; never counted):\n\n",
            );
            s.push_str(HEADER);
            s.push_str(&unplanned);
            s.push('\n');
        }
        if !unpaired.is_empty() {
            if planned_cells > 0 {
                s.push_str("Cells the paper does not report (never counted):\n\n");
            }
            s.push_str(HEADER);
            s.push_str(&unpaired);
            s.push('\n');
        }
        let rows: Vec<&Row> = data.rows.iter().filter(|r| r.section == section).collect();
        if !rows.is_empty() {
            let commits: BTreeSet<&str> = rows.iter().map(|r| r.commit.as_str()).collect();
            let commands: BTreeSet<&str> = rows.iter().map(|r| r.command.as_str()).collect();
            let _ = writeln!(
                s,
                "{} rows (config hashes in the CSV); commit {}; {}.",
                rows.len(),
                commits
                    .into_iter()
                    .map(|c| format!("`{c}`"))
                    .collect::<Vec<_>>()
                    .join(", "),
                commands
                    .into_iter()
                    .map(|c| format!("`{c}`"))
                    .collect::<Vec<_>>()
                    .join("; ")
            );
        }
        out.insert(section, s);
    }
    if let (false, Some(h)) = (data.claims.is_empty(), history) {
        let prov = registration::provenance(&data.claims, &data.rows, h);
        out.insert(
            claims::BLOCK.to_string(),
            claims::render(&data.claims, &data.rows, &prov, &data.sections)?,
        );
    }
    Ok(out)
}

fn begin(name: &str) -> String {
    format!("<!-- results:{name} begin -->")
}

fn end(name: &str) -> String {
    format!("<!-- results:{name} end -->")
}

/// The generated blocks of a page: name → byte range of the text between its markers.
/// Errors name a marker that is unmatched, nested or repeated.
fn blocks(doc: &str, path: &Path) -> Result<BTreeMap<String, std::ops::Range<usize>>> {
    let mut out = BTreeMap::new();
    let mut open: Option<(String, usize)> = None;
    let mut pos = 0;
    for line in doc.split_inclusive('\n') {
        let t = line.trim();
        let marker = t
            .strip_prefix("<!-- results:")
            .and_then(|r| r.strip_suffix(" -->"));
        match (marker.and_then(|m| m.rsplit_once(' ')), &open) {
            (Some((name, "begin")), None) => open = Some((name.to_string(), pos + line.len())),
            (Some((name, "end")), Some((o, start))) if name == o => {
                if out.insert(name.to_string(), *start..pos).is_some() {
                    return Err(bad(path, format!("block `{name}` appears twice")));
                }
                open = None;
            }
            (Some((name, kind)), _) => {
                return Err(bad(
                    path,
                    format!(
                        "marker `{kind}` of `{name}` where {}",
                        open.as_ref()
                            .map_or("no block is open".to_string(), |(o, _)| format!(
                                "block `{o}` is open"
                            ))
                    ),
                ));
            }
            (None, _) => {}
        }
        pos += line.len();
    }
    match open {
        Some((name, _)) => Err(bad(path, format!("block `{name}` has no end marker"))),
        None => Ok(out),
    }
}

/// What [`render_doc`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// Blocks rewritten in place.
    pub updated: Vec<String>,
    /// Sections the page had no block for, appended at its end.
    pub appended: Vec<String>,
    /// Why the claims block was left as it was: the history cannot date the claims.
    pub claims_kept: Option<String>,
}

/// The repository holding a results directory, through git: what [`registration::provenance`]
/// asks of its history.
pub struct Git {
    root: PathBuf,
    claims: PathBuf,
}

impl Git {
    /// The repository holding `dir`; `Err` says why its history cannot date the claims: no
    /// git, no repository, or a shallow clone (whose oldest commit would pass for the one
    /// that added every claim).
    pub fn open(dir: &Path) -> std::result::Result<Git, String> {
        let root = git(dir, &["rev-parse", "--show-toplevel"]).map_err(|e| e.to_string())?;
        let root =
            std::fs::canonicalize(root.trim()).map_err(|e| format!("{}: {e}", root.trim()))?;
        let shallow =
            git(&root, &["rev-parse", "--is-shallow-repository"]).map_err(|e| e.to_string())?;
        if shallow.trim() == "true" {
            return Err(format!(
                "{} is a shallow clone: fetch its whole history (`git fetch --unshallow`)",
                root.display()
            ));
        }
        let claims = std::fs::canonicalize(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .join(claims::CLAIMS_DIR);
        Ok(Git { root, claims })
    }

    /// `path` (inside the checkout) as `commit` had it; `None` where it had no such file.
    fn show(&self, commit: &str, path: &str) -> Option<String> {
        git(&self.root, &["show", &format!("{commit}:{path}")]).ok()
    }
}

impl registration::History for Git {
    fn first_adding(&self, needle: &str) -> std::result::Result<Option<String>, String> {
        let path = self.claims.to_string_lossy();
        let out = git(
            &self.root,
            &[
                "log",
                "--format=%H",
                "--reverse",
                "-S",
                needle,
                "--",
                path.as_ref(),
            ],
        )
        .map_err(|e| e.to_string())?;
        Ok(out.lines().next().map(str::to_string))
    }

    fn versions(&self, file: &Path) -> std::result::Result<Vec<(String, Option<String>)>, String> {
        let file = std::fs::canonicalize(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let inside = file
            .strip_prefix(&self.root)
            .map_err(|_| format!("{} is outside {}", file.display(), self.root.display()))?
            .to_string_lossy()
            .into_owned();
        let commits = git(
            &self.root,
            &["log", "--format=%H", "--reverse", "--", &inside],
        )
        .map_err(|e| e.to_string())?;
        Ok(commits
            .lines()
            .map(|c| (c.to_string(), self.show(c, &inside)))
            .collect())
    }

    fn file_at(&self, commit: &str, path: &str) -> Option<String> {
        self.show(commit, path)
    }

    fn first_recorded(&self) -> std::result::Result<BTreeMap<String, String>, String> {
        let results = self
            .claims
            .parent()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        let log = git(
            &self.root,
            &[
                "log",
                "-p",
                "--reverse",
                "--format=commit %H",
                "--",
                &results,
            ],
        )
        .map_err(|e| e.to_string())?;
        let mut first = BTreeMap::new();
        let mut commit = "";
        for line in log.lines() {
            if let Some(c) = line.strip_prefix("commit ") {
                commit = c;
            } else if let Some(row) = line.strip_prefix('+') {
                let hash = row.rsplit(',').next().unwrap_or("");
                if hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                    first
                        .entry(hash.to_string())
                        .or_insert_with(|| commit.to_string());
                }
            }
        }
        Ok(first)
    }

    fn changed(
        &self,
        since: &str,
        commit: &str,
        paths: &[String],
    ) -> std::result::Result<Vec<String>, String> {
        let range = format!("{since}..{commit}");
        let mut args = vec!["log", "--format=", "--name-only", range.as_str(), "--"];
        args.extend(paths.iter().map(String::as_str));
        let out = git(&self.root, &args).map_err(|e| e.to_string())?;
        let changed: BTreeSet<String> = out
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
        Ok(changed.into_iter().collect())
    }

    fn is_ancestor(&self, ancestor: &str, commit: &str) -> std::result::Result<bool, String> {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(&self.root)
            .args(["merge-base", "--is-ancestor", ancestor, commit])
            .output()
            .map_err(|e| format!("git: {e}"))?;
        match out.status.code() {
            Some(0) => Ok(true),
            Some(1) => Ok(false),
            _ => Err(format!(
                "git merge-base --is-ancestor {ancestor} {commit}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )),
        }
    }
}

/// `fedsel results render`: rewrites every generated block of the page `doc` from the
/// results directory `dir`, and appends a block for each section the page lacks (move it
/// where it belongs; later renders keep it there); a page that does not exist is made. Without a history that can date the
/// claims ([`Git::open`]) the claims block is left as it was, and [`Rendered`] says why.
pub fn render_doc(dir: &Path, doc: &Path) -> Result<Rendered> {
    let data = load(dir)?;
    let history = Git::open(dir);
    let claims_kept = match (&history, data.claims.is_empty()) {
        (Err(why), false) => Some(why.clone()),
        _ => None,
    };
    let rendered = render(
        &data,
        history
            .as_ref()
            .ok()
            .map(|g| g as &dyn registration::History),
    )?;
    // A page not written yet (a user's first results directory) starts as a title; the
    // blocks are appended below it.
    let text = match std::fs::read_to_string(doc) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "# Results\n".to_string(),
        read => read.map_err(io(doc))?,
    };
    let found = blocks(&text, doc)?;
    let mut ranges: Vec<(&String, &std::ops::Range<usize>)> = found.iter().collect();
    ranges.sort_by_key(|(_, r)| r.start);
    let mut new = String::with_capacity(text.len());
    let mut at = 0;
    let mut updated = Vec::new();
    for (name, range) in ranges {
        new.push_str(&text[at..range.start]);
        match rendered.get(name) {
            Some(body) => {
                new.push_str(body);
                updated.push(name.clone());
            }
            None if name == claims::BLOCK && claims_kept.is_some() => {
                new.push_str(&text[range.clone()]);
            }
            None => {
                return Err(bad(
                    doc,
                    format!(
                        "block `{name}` names a section with no rows or paper values in {}",
                        dir.display()
                    ),
                ));
            }
        }
        at = range.end;
    }
    new.push_str(&text[at..]);
    let mut appended = Vec::new();
    for (name, body) in &rendered {
        if !found.contains_key(name) {
            if !new.ends_with('\n') {
                new.push('\n');
            }
            let _ = write!(new, "\n{}\n{body}{}\n", begin(name), end(name));
            appended.push(name.clone());
        }
    }
    std::fs::write(doc, new).map_err(io(doc))?;
    Ok(Rendered {
        updated,
        appended,
        claims_kept,
    })
}

/// What [`check`] found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Checked {
    /// Every problem that should stop CI, each a sentence naming the section.
    pub problems: Vec<String>,
    /// What a reader should know and CI need not stop for: each post-hoc claim, and why the
    /// claims block could not be checked when the history cannot date the claims.
    pub notes: Vec<String>,
}

/// `fedsel results check`: no problem when the page `doc` matches what [`render`] makes of
/// `dir`, every section with rows has a block and names its code paths in `sections.toml`,
/// and no code path changed after a row's commit without notes that account for it
/// ([`SectionInfo::notes_through`]; notes without it leave their section unchecked, and a
/// note says so). Code-path changes and the
/// claims' provenance are asked of git in the repository that holds `dir`; the notes name
/// each post-hoc claim ([`registration::post_hoc_notes`]). Without a history that can date the
/// claims the claims block is not compared, and a note says why (never a problem: a shallow
/// clone cannot tell).
pub fn check(dir: &Path, doc: &Path) -> Result<Checked> {
    let data = load(dir)?;
    let history = Git::open(dir);
    let mut notes = Vec::new();
    match &history {
        Ok(h) => {
            let prov = registration::provenance(&data.claims, &data.rows, h);
            notes.extend(registration::post_hoc_notes(&data.claims, &prov));
        }
        Err(why) if !data.claims.is_empty() => notes.push(format!(
            "the claims block was not checked: their provenance needs the repository's history ({why})"
        )),
        Err(_) => {}
    }
    let rendered = render(
        &data,
        history
            .as_ref()
            .ok()
            .map(|g| g as &dyn registration::History),
    )?;
    let text = std::fs::read_to_string(doc).map_err(io(doc))?;
    let found = blocks(&text, doc)?;
    let mut problems = Vec::new();
    let unchecked_claims = history.is_err() && !data.claims.is_empty();
    for (name, range) in &found {
        match rendered.get(name) {
            None if unchecked_claims && name == claims::BLOCK => {}
            None => problems.push(format!(
                "{}: block `{name}` names a section with no rows or paper values in {}",
                doc.display(),
                dir.display()
            )),
            Some(body) if body != &text[range.clone()] => problems.push(format!(
                "{}: block `{name}` no longer matches its CSVs; run `fedsel results render`",
                doc.display()
            )),
            Some(_) => {}
        }
    }
    for name in rendered.keys().filter(|n| !found.contains_key(*n)) {
        problems.push(format!(
            "{}: section `{name}` has no block; run `fedsel results render`",
            doc.display()
        ));
    }
    let mut commits: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for r in &data.rows {
        commits.entry(&r.section).or_default().insert(&r.commit);
    }
    let mut top: Option<PathBuf> = None;
    for (section, commits) in commits {
        let Some(info) = data.sections.get(section) else {
            problems.push(format!(
                "{}: section `{section}` names no code paths (give it `paths`)",
                dir.join(SECTIONS_FILE).display()
            ));
            continue;
        };
        let noted = info.notes.as_deref().is_some_and(|n| !n.trim().is_empty());
        let through = info.notes_through.as_deref();
        match (noted, through) {
            (false, Some(t)) => {
                problems.push(format!(
                    "section `{section}`: `notes_through = \"{t}\"` in {SECTIONS_FILE} without `notes` to vouch"
                ));
                continue;
            }
            (true, None) => {
                notes.push(format!(
                    "section `{section}`: its `notes` name no `notes_through` commit, so changes to its code paths are not checked"
                ));
                continue;
            }
            _ => {}
        }
        if info.paths.is_empty() {
            continue;
        }
        let root = match &top {
            Some(t) => t.clone(),
            None => {
                let t = git(dir, &["rev-parse", "--show-toplevel"])?;
                let t = PathBuf::from(t.trim());
                top = Some(t.clone());
                t
            }
        };
        if let Some(t) = through
            && let Err(e) = git(
                &root,
                &[
                    "rev-parse",
                    "--verify",
                    "--quiet",
                    &format!("{t}^{{commit}}"),
                ],
            )
        {
            problems.push(format!(
                "section `{section}`: `notes_through = \"{t}\"` in {SECTIONS_FILE} is no commit of this history: {e}"
            ));
            continue;
        }
        for commit in commits {
            // The changes after the rows' commit that the notes do not cover.
            let mut args = vec!["log".to_string(), "--format=%h".into(), "HEAD".into()];
            args.push(format!("^{commit}"));
            args.extend(through.map(|t| format!("^{t}")));
            args.push("--".into());
            args.extend(info.paths.iter().cloned());
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            match git(&root, &args) {
                Ok(out) if out.trim().is_empty() => {}
                Ok(out) => {
                    let changed = out.split_whitespace().collect::<Vec<_>>().join(", ");
                    problems.push(match through {
                        None => format!(
                            "section `{section}`: its code paths changed after commit {commit} (in {changed}) and `notes` in {SECTIONS_FILE} does not say why the results stand"
                        ),
                        Some(t) => format!(
                            "section `{section}`: its code paths changed after commit {commit} and after {t}, the last its `notes` account for (in {changed}): say in `notes` why the results stand, then move `notes_through`"
                        ),
                    });
                }
                Err(e) => problems.push(format!("section `{section}`: commit {commit}: {e}")),
            }
        }
    }
    Ok(Checked { problems, notes })
}

/// Runs git in `dir` and returns its standard output; an error carries git's message.
fn git(dir: &Path, args: &[&str]) -> Result<String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .map_err(io(dir))?;
    if !out.status.success() {
        return Err(bad(
            dir,
            format!(
                "git {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
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

//! `fedsel report DIR...`: paper-style tables from a sweep's finished cells, or from any
//! set of run directories grouped into arms ([`crate::arms`]).
//!
//! Writes `report.md` (or, `--format latex`, `report.tex`) and one CSV per table:
//! - `rounds_to_target.csv`: rounds to each target accuracy over seeds (FedCor Table 1);
//! - `time_to_target.csv`, for runs on the virtual clock (`[system]`): virtual seconds and
//!   hours to each target over seeds (Oort's and FedScale's time to accuracy);
//! - `best_final.csv`: best and final test accuracy and loss, with the relative
//!   change of final accuracy and loss against the baseline strategy (FedGS
//!   Table 2, F3AST Tables 2–3);
//! - `speedup.csv`: rounds to the first target with speedup over the baseline,
//!   plus extra communication and computation per round from the cost ledger
//!   (HiCS-FL Table 1);
//! - `selection_stats.csv`: per-client selection counts and their variance
//!   (FedGS fairness, Fig. 4);
//! - `client_accuracy.csv`: the spread of the clients' own accuracies at the last
//!   evaluation, p10 / p50 / p90 and the worst 10 % (LEAF, FedScale; how AFL and q-FFL are
//!   judged), for runs whose `metrics.csv` has it.
//!
//! Every metric aggregated over seeds in the first three tables shows mean ± std, median,
//! a seeded bootstrap 95 % CI of the mean and, for rounds to a target, the seeds that
//! reached it, plus a paired comparison with the baseline over shared seeds; how censored
//! seeds (never reaching a target) enter each of these is set out in [`crate::stats`] and
//! repeated at the head of `report.md`. A CSV keeps the columns of earlier releases first
//! (`_mean` and `_std`, empty when a seed never reached the target) and appends the new ones:
//! `_median`, `_ci_lo`, `_ci_hi`, `_reached`, `_mean_lb` and the paired `_paired_n`,
//! `_paired_above`, `_paired_below`, `_paired_diff`, `_p`.

use std::collections::BTreeMap;

use std::fmt::Write as _;

use std::path::Path;

use serde::Deserialize;

use fedsel::error::{ConfigError, Error, Result};

use fedsel::ledger::Ledger;

use crate::stats::{self, Median, Obs, Paired, SeedStats, Test, mean_std};

use crate::timeline::HOUR_S;

mod cells;
mod figures;
mod read;
mod tables;
#[cfg(test)]
mod tests;
mod trackers;

use cells::*;
use figures::*;
pub use read::f3ast_weight_mean;
use read::*;
use tables::*;
use trackers::*;

#[derive(Debug, Clone, Deserialize)]
struct IndexCell {
    dir: String,
    label: String,
    strategy: String,
    setting: String,
    targets: Vec<f64>,
}

#[derive(Debug, Clone, Deserialize)]
struct Index {
    name: String,
    baseline: Option<String>,
    cells: Vec<IndexCell>,
}

#[derive(Debug, Clone, Deserialize)]
struct Summary {
    seed: u64,
    final_acc: f64,
    final_loss: f64,
    best_acc: f64,
    best_loss: f64,
    rounds: usize,
    rounds_to_target: Vec<(f64, Option<usize>)>,
    cost: Ledger,
    /// Virtual seconds at the end of the run, for a run on the virtual clock (`[system]`).
    #[serde(default)]
    clock_s: Option<f64>,
    /// Virtual seconds to each target, beside `rounds_to_target`, for a run on the clock.
    #[serde(default)]
    time_to_target_s: Option<Vec<(f64, Option<f64>)>>,
}

/// One metric of a run's summary.
type Pick = fn(&Summary) -> f64;

/// Strategy (with its first-appearance rank) → its runs over seeds.
type ByStrategy = BTreeMap<(usize, String), Vec<Run>>;

/// The clients' accuracy spread of one evaluation: p10, p50, p90 and the worst 10 %, in
/// the order of [`fedsel::output::CLIENT_ACC_COLUMNS`].
type ClientSpread = [f64; 4];

/// What the report reads from a run's `metrics.csv`.
struct Metrics {
    /// (round, test accuracy, test loss) of every evaluated round.
    curve: Vec<(f64, f64, f64)>,
    /// The spread at the last evaluation that measured it.
    clients: Option<ClientSpread>,
    /// (virtual seconds at the round's end, test accuracy) of every evaluated round, for a
    /// run on the virtual clock.
    timed: Option<Vec<(f64, f64)>>,
}

/// One finished cell with what the tables need.
struct Run {
    summary: Summary,
    /// Selection count of each client.
    counts: Vec<usize>,
    /// (round, test accuracy, test loss) of every evaluated round.
    curve: Vec<(f64, f64, f64)>,
    /// The clients' accuracy spread at the last evaluation that measured it (p10, p50, p90,
    /// worst 10 %); `None` for a run written before `metrics.csv` had it.
    clients: Option<ClientSpread>,
    /// (virtual seconds, test accuracy) of every evaluated round; `None` without a clock.
    timed: Option<Vec<(f64, f64)>>,
    /// The cell directory (for its availability record).
    dir: std::path::PathBuf,
}

fn bad(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Output {
        path: path.to_path_buf(),
        error: std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()),
    }
}

/// One table entry: markdown shows it for reading, the CSV keeps it as numbers.
#[derive(Debug, Clone, PartialEq)]
enum V {
    Text(String),
    /// A number shown with this many decimals.
    Num(f64, usize),
    /// A ratio: "2.15x" in markdown, 2.15 in the CSV.
    Times(f64),
    /// Mean ± std over seeds.
    MeanStd(f64, f64, usize),
    /// A metric over seeds with this many decimals; `censorable` metrics (rounds to a
    /// target) also show how many seeds reached.
    Stat {
        stats: SeedStats,
        digits: usize,
        censorable: bool,
        /// Decimals of a censoring bound ("> 200" rounds, "> 0.031" hours).
        bound_digits: usize,
    },
    /// A paired comparison with the baseline, differences with this many decimals.
    Paired(Paired, usize),
    /// The baseline's own comparison with itself: "(baseline)", empty CSV fields.
    Baseline,
    /// No value: "N/A" in markdown, empty CSV fields.
    Na,
}

/// What a column holds, which decides its CSV fields.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// One field.
    Plain,
    /// Mean ± std: `_mean` and `_std`.
    MeanStd,
    /// Statistics over seeds: `_mean` and `_std` (or, `single`, the mean alone under the
    /// column's own name and `_std` among the new fields), then the new `_median`, `_ci_lo`,
    /// `_ci_hi` and, for a censorable metric, `_reached` and `_mean_lb`.
    Stat { censorable: bool, single: bool },
    /// A paired comparison with the baseline, all new fields: `_paired_n`, `_paired_above`,
    /// `_paired_below`, `_paired_diff` and `_p`.
    Paired,
}

/// A table column: its markdown title, the stem of its CSV field names, and its kind.
#[derive(Debug, Clone)]
struct Col {
    title: String,
    csv: String,
    kind: Kind,
    /// All its CSV fields are new ones (written after the fields of earlier releases).
    new: bool,
}

/// A table: columns and rows, written both as CSV and markdown.
struct Table {
    title: String,
    file: &'static str,
    columns: Vec<Col>,
    rows: Vec<Vec<V>>,
}

/// What a report is written as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `report.md`, with figures.
    Markdown,
    /// `report.tex`: the tables as LaTeX `table` floats for a paper, without figures.
    Latex,
}

impl Format {
    /// The report's file name in this format.
    pub fn file_name(self) -> &'static str {
        match self {
            Format::Markdown => "report.md",
            Format::Latex => "report.tex",
        }
    }
}

impl std::str::FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "markdown" => Ok(Format::Markdown),
            "latex" => Ok(Format::Latex),
            other => Err(format!(
                "`{other}` is not a report format: use markdown or latex"
            )),
        }
    }
}

/// The runs a report is drawn from, grouped, and how to introduce them.
struct Gathered {
    /// The report's heading and what it says of the runs read and left out (markdown).
    intro: String,
    /// Setting → arm → runs over seeds, in first-appearance order.
    groups: BTreeMap<(usize, String), ByStrategy>,
    /// The arm every other one is compared with.
    baseline: Option<String>,
    /// The first run's targets.
    targets: Vec<f64>,
    /// Whether every run has those targets (else the columns are numbered).
    shared_targets: bool,
    /// The most targets of any run.
    n_targets: usize,
    /// The title of the column naming each arm: a sweep's arms are its strategies.
    arm: &'static str,
    /// (cell label or run directory, absolute TensorBoard directory) of every run that
    /// wrote event files, in the order the runs were read.
    trackers: Vec<(String, std::path::PathBuf)>,
}

fn check_smooth(smooth: Option<usize>) -> Result<()> {
    if let Some(w) = smooth
        && (w < 3 || w.is_multiple_of(2))
    {
        return Err(ConfigError::invalid(
            "--smooth",
            format!("{w} is not a Savitzky–Golay window: use an odd number of rounds, at least 3"),
        )
        .into());
    }
    Ok(())
}

/// Writes `report.md` and the table CSVs for the sweep in `dir`; returns the report text.
///
/// `smooth` applies Savitzky–Golay smoothing of that window to the curves in the figures.
pub fn write(dir: &Path, smooth: Option<usize>) -> Result<String> {
    check_smooth(smooth)?;
    render(&gather_sweep(dir)?, dir, smooth, Format::Markdown)
}

/// `fedsel report DIR...`: the report of one sweep directory, or the comparison of any
/// set of run directories (see [`crate::arms`]). A sweep's report goes into the sweep's
/// directory unless `out` names another; a comparison's into `out`, by default `report` in
/// the working directory, which may not be a run's or a sweep's own directory. Returns the
/// file written and its text.
///
/// Run directories of different tasks ([`crate::arms::TASK`]) are refused
/// ([`crate::error::Error::MixedTasks`]) unless `allow_mixed`; a run that is not whole is
/// left out, with a warning and a line in the report.
pub fn report(
    dirs: &[std::path::PathBuf],
    out: Option<&Path>,
    smooth: Option<usize>,
    format: Format,
    allow_mixed: bool,
) -> crate::error::Result<(std::path::PathBuf, String)> {
    check_smooth(smooth)?;
    let (gathered, out) = match dirs {
        [] => {
            return Err(
                ConfigError::invalid("DIR", "name a sweep directory or run directories").into(),
            );
        }
        [dir] if dir.join("sweep.json").is_file() => {
            let out = out.unwrap_or(dir.as_path()).to_path_buf();
            (gather_sweep(dir)?, out)
        }
        _ => {
            let out = out.map_or_else(|| std::path::PathBuf::from("report"), Path::to_path_buf);
            crate::arms::check_out(&out, dirs)?;
            (gather_runs(dirs, allow_mixed)?, out)
        }
    };
    std::fs::create_dir_all(&out).map_err(|source| Error::Output {
        path: out.clone(),
        error: source,
    })?;
    let text = render(&gathered, &out, smooth, format)?;
    Ok((out.join(format.file_name()), text))
}

/// Writes the tables' CSVs and the report in `format` into `out`; returns its text.
fn render(g: &Gathered, out: &Path, smooth: Option<usize>, format: Format) -> Result<String> {
    let tables = tables(g)?;
    for t in &tables {
        t.write_csv(out)?;
    }
    let text = match format {
        Format::Latex => tables.iter().map(Table::latex).collect::<String>(),
        Format::Markdown => {
            let mut md = g.intro.clone();
            let _ = writeln!(
                md,
                "**Statistics over seeds.** Each entry is mean ± std, then the median, the 95 % percentile-bootstrap CI of the mean ({} resamples over seeds, fixed seed, so the report is reproducible) and, for rounds to a target, how many seeds reached it. A seed that never reaches a target within its R rounds is censored: it is kept, never dropped, and counts as \"> R\". The mean over only the seeds that reached would be biased low, so with a censored seed the mean is shown as a lower bound \"≥ x\" (censored seeds counted as R) without std or CI, and the median as \"> R\" once half the seeds or more are censored. Columns \"vs {}\" pair each strategy with the baseline over the seeds both ran in the setting: Δ is the median of the paired differences (strategy − baseline), ↑/↓ count the seeds where the strategy's value is above/below the baseline's, and p is two-sided and exact: the sign test for rounds to a target (censoring keeps each pair's sign; both censored is a tie; Δ is N/A where censored pairs could move it), the Wilcoxon signed-rank test for accuracy and loss. With n seeds no p can be below 2/2ⁿ (0.25 for 3 seeds, 0.0625 for 5).\n",
                stats::RESAMPLES,
                g.baseline.as_deref().unwrap_or("-")
            );
            if tables.iter().any(|t| t.file == "time_to_target.csv") {
                md.push_str("\n**Time to a target** is the virtual clock (`[system]`) at the end of the round that first reached it, the round counted in the rounds-to-target table. A seed that never reaches a target is censored at its own run's final clock, and the seeds' clocks differ: the median is exact only when no censored seed's clock stopped below it, otherwise it is shown as \"median > x\", the median with every censored seed at its final clock; the sign test counts a pair whose order censoring hides as a tie.\n");
            }
            for t in &tables {
                md.push_str(&t.markdown());
            }
            md.push_str("Extra communication per round counts broadcasts, uploads and scalar reports beyond the two messages of each training client; extra computation counts client evaluations, one-step gradients, discarded probe trainings and the extra trainings a strategy adds to a round (FedGP). Per-client accuracy is the simulator's measurement, not a strategy's: it costs no client anything in the ledger.\n");
            md.push_str("\n## Figures\n\n");
            match crate::plot::ensure_font() {
                Ok(()) => {
                    for ((_, setting), strategies) in &g.groups {
                        md.push_str(&figures(out, setting, strategies, smooth)?);
                    }
                }
                Err(why) => md.push_str(&format!("Figures skipped: {why}.\n")),
            }
            md.push_str(&trackers_section(&g.trackers, out)?);
            md
        }
    };
    let path = out.join(format.file_name());
    std::fs::write(&path, &text).map_err(|source| Error::Output {
        path,
        error: source,
    })?;
    Ok(text)
}

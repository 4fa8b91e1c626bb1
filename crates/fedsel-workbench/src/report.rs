//! `fedsel report DIR`: paper-style tables from a sweep's finished cells.
//!
//! Writes `report.md` and one CSV per table:
//! - `rounds_to_target.csv`: mean ± std over seeds of the rounds to each target
//!   accuracy, "N/A" when any seed misses (FedCor Table 1);
//! - `best_final.csv`: best and final test accuracy and loss, with the relative
//!   change of final accuracy and loss against the baseline strategy (FedGS
//!   Table 2, F3AST Tables 2–3);
//! - `speedup.csv`: rounds to the first target with speedup over the baseline,
//!   plus extra communication and computation per round from the cost ledger
//!   (HiCS-FL Table 1);
//! - `selection_stats.csv`: per-client selection counts and their variance
//!   (FedGS fairness, Fig. 4).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Deserialize;

use fedsel::error::{ConfigError, Error, Result};
use fedsel::ledger::Ledger;

#[derive(Debug, Clone, Deserialize)]
struct IndexCell {
    dir: String,
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
}

/// Strategy (with its first-appearance rank) → its runs over seeds.
type ByStrategy = BTreeMap<(usize, String), Vec<Run>>;

/// One finished cell with what the tables need.
struct Run {
    summary: Summary,
    /// Selection count of each client.
    counts: Vec<usize>,
    /// (round, test accuracy, test loss) of every evaluated round.
    curve: Vec<(f64, f64, f64)>,
    /// The cell directory (for its availability record).
    dir: std::path::PathBuf,
}

fn bad(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Output {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()),
    }
}

/// The evaluated rounds of a run's `metrics.csv`.
fn curve(path: &Path) -> Result<Vec<(f64, f64, f64)>> {
    let mut r = csv::Reader::from_path(path).map_err(|e| bad(path, e))?;
    let mut out = Vec::new();
    for row in r.records() {
        let row = row.map_err(|e| bad(path, e))?;
        if let (Ok(t), Ok(a), Ok(l)) = (
            row[0].parse::<f64>(),
            row[1].parse::<f64>(),
            row[2].parse::<f64>(),
        ) {
            out.push((t + 1.0, a, l));
        }
    }
    Ok(out)
}

/// The available clients of the first `max_rounds` rounds of a run.
fn availability(path: &Path, max_rounds: usize) -> Result<Vec<Vec<usize>>> {
    let mut r = csv::Reader::from_path(path).map_err(|e| bad(path, e))?;
    let mut out = Vec::new();
    for row in r.records().take(max_rounds) {
        let row = row.map_err(|e| bad(path, e))?;
        out.push(
            row[1]
                .split_whitespace()
                .map(|k| k.parse::<usize>().map_err(|e| bad(path, e)))
                .collect::<Result<_>>()?,
        );
    }
    Ok(out)
}

/// Mean and std over runs at each round present in all of them, optionally smoothed.
fn band(
    runs: &[Run],
    pick: fn(&(f64, f64, f64)) -> f64,
    smooth: Option<usize>,
) -> Result<Vec<(f64, f64, f64)>> {
    let len = runs.iter().map(|r| r.curve.len()).min().unwrap_or(0);
    if let Some(w) = smooth
        && w > len
    {
        return Err(ConfigError::invalid(
            "--smooth",
            format!("a window of {w} is longer than the {len} evaluated rounds of the runs"),
        )
        .into());
    }
    let mut pts: Vec<(f64, f64, f64)> = (0..len)
        .map(|i| {
            let v: Vec<f64> = runs.iter().map(|r| pick(&r.curve[i])).collect();
            let (m, s) = mean_std(&v);
            (runs[0].curve[i].0, m, s)
        })
        .collect();
    if let Some(w) = smooth {
        let m = crate::plot::savitzky_golay(&pts.iter().map(|p| p.1).collect::<Vec<_>>(), w);
        let s = crate::plot::savitzky_golay(&pts.iter().map(|p| p.2).collect::<Vec<_>>(), w);
        for ((p, m), s) in pts.iter_mut().zip(m).zip(s) {
            p.1 = m;
            p.2 = s.max(0.0);
        }
    }
    Ok(pts)
}

fn slug(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The fraction of rounds in which each client was selected, sorted from most to least
/// often selected, averaged over runs rank by rank. It lies in [0, 1] (MD sampling, which
/// may pick a client twice in one round, could in principle exceed 1).
fn ranked_frequencies(runs: &[Run]) -> Vec<f64> {
    let n = runs.iter().map(|r| r.counts.len()).max().unwrap_or(0);
    let mut mean = vec![0.0; n];
    for r in runs {
        let mut f: Vec<f64> = (0..n)
            .map(|k| r.counts.get(k).copied().unwrap_or(0) as f64 / r.summary.rounds.max(1) as f64)
            .collect();
        f.sort_by(|a, b| b.total_cmp(a));
        for (m, x) in mean.iter_mut().zip(f) {
            *m += x / runs.len() as f64;
        }
    }
    mean
}

/// Draws every figure of one setting into `dir/plots`; returns the markdown that shows them.
fn figures(
    dir: &Path,
    setting: &str,
    strategies: &ByStrategy,
    smooth: Option<usize>,
) -> Result<String> {
    use crate::plot::{Curve, Series};
    let plots = dir.join("plots");
    std::fs::create_dir_all(&plots).map_err(|source| Error::Output {
        path: plots.clone(),
        source,
    })?;
    let stem = |kind: &str| plots.join(format!("{}-{kind}", slug(setting)));
    let smoothed = smooth.map_or(String::new(), |w| format!(", Savitzky-Golay window {w}"));
    let curves = |pick: fn(&(f64, f64, f64)) -> f64| -> Result<Vec<Curve>> {
        strategies
            .iter()
            .map(|((_, s), runs)| {
                Ok(Curve {
                    label: format!("{s} (n={})", runs.len()),
                    points: band(runs, pick, smooth)?,
                })
            })
            .collect()
    };
    crate::plot::curves(
        &stem("accuracy"),
        &format!("{setting}: test accuracy (mean ± std{smoothed})"),
        "test accuracy",
        &curves(|p| p.1)?,
        (0.0, 1.0),
    )?;
    crate::plot::curves(
        &stem("loss"),
        &format!("{setting}: test loss (mean ± std{smoothed})"),
        "test loss",
        &curves(|p| p.2)?,
        (0.0, f64::INFINITY),
    )?;
    // Client k of one seed is not client k of another (the partition is seeded), so each
    // run's frequencies are sorted first and averaged rank by rank.
    let series: Vec<Series> = strategies
        .iter()
        .map(|((_, s), runs)| Series {
            label: s.clone(),
            values: ranked_frequencies(runs),
        })
        .collect();
    let per_round: Vec<f64> = strategies
        .values()
        .flatten()
        .map(|r| r.counts.iter().sum::<usize>() as f64 / r.summary.rounds.max(1) as f64)
        .collect();
    let clients = strategies
        .values()
        .flatten()
        .map(|r| r.counts.len())
        .max()
        .unwrap_or(1)
        .max(1);
    // The level every client would have under equal shares, drawn only when every method
    // selects as many clients per round (HiCS-FL's code protocol, say, takes more).
    let (k, k_spread) = mean_std(&per_round);
    let uniform =
        (k_spread < 1e-9 * k.max(1.0)).then_some((k / clients as f64, "every client alike (K/N)"));
    crate::plot::rank_profile(
        &stem("selection"),
        &format!("{setting}: how often each client is selected, by rank"),
        "fraction of rounds selected",
        &series,
        uniform,
    )?;
    let first = strategies
        .values()
        .next()
        .and_then(|r| r.first())
        .expect("a group has at least one run");
    let shown = 200;
    let avail = availability(&first.dir.join("availability.csv"), shown)?;
    let clients = avail
        .iter()
        .flatten()
        .max()
        .map_or(0, |m| m + 1)
        .max(first.counts.len());
    crate::plot::raster(
        &stem("availability"),
        &format!(
            "{setting}: available clients (first {} rounds, seed {})",
            avail.len(),
            first.summary.seed
        ),
        clients,
        &avail,
    )?;
    let name = |kind: &str| format!("plots/{}-{kind}.png", slug(setting));
    Ok(format!(
        "### {setting}\n\n![accuracy]({})\n![loss]({})\n![selection frequency]({})\n![availability]({})\n\nThe accuracy and loss axes fit the rounds after the first tenth of the run; earlier rounds leave the frame. The selection figure sorts each run's clients from most to least often selected and averages rank by rank over seeds. SVG versions sit beside each PNG.\n\n",
        name("accuracy"),
        name("loss"),
        name("selection"),
        name("availability")
    ))
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Output {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| Error::Output {
        path: path.to_path_buf(),
        source: std::io::Error::other(e),
    })
}

fn counts(path: &Path, clients: usize) -> Result<Vec<usize>> {
    let mut c = vec![0; clients];
    let mut r = csv::Reader::from_path(path).map_err(|e| Error::Output {
        path: path.to_path_buf(),
        source: std::io::Error::other(e),
    })?;
    for row in r.records() {
        let row = row.map_err(|e| Error::Output {
            path: path.to_path_buf(),
            source: std::io::Error::other(e),
        })?;
        let k: usize = row[1].parse().map_err(|e| Error::Output {
            path: path.to_path_buf(),
            source: std::io::Error::other(e),
        })?;
        if k >= c.len() {
            c.resize(k + 1, 0);
        }
        c[k] += 1;
    }
    Ok(c)
}

/// Rounds each run needed to reach target `ti`; `None` if any run missed it.
fn rounds_to(runs: &[Run], ti: usize) -> Option<Vec<f64>> {
    runs.iter()
        .map(|r| {
            r.summary
                .rounds_to_target
                .get(ti)
                .and_then(|t| t.1)
                .map(|x| x as f64)
        })
        .collect()
}

fn pct(t: f64) -> String {
    format!("{:.0}%", t * 100.0)
}

fn mean_std(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let m = xs.iter().sum::<f64>() / n;
    let v = if xs.len() > 1 {
        xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (m, v.sqrt())
}

/// FedGS's solver record of a run (`fedgs_solver.csv`): (rounds proven optimal, rounds,
/// summed gap, summed mean selected distance), or `None` for other strategies.
fn solver_record(dir: &Path) -> Result<Option<(usize, usize, f64, f64)>> {
    let path = dir.join("fedgs_solver.csv");
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).map_err(|e| bad(&path, e))?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or("").split(',').collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .ok_or_else(|| bad(&path, format!("no `{name}` column")))
    };
    let (gap, proven, spread) = (col("gap")?, col("proven")?, col("mean_distance")?);
    let mut out = (0, 0, 0.0, 0.0);
    for line in lines {
        let f: Vec<&str> = line.split(',').collect();
        let num = |i: usize| -> Result<f64> {
            f.get(i)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| bad(&path, format!("bad row `{line}`")))
        };
        out.0 += usize::from(f.get(proven) == Some(&"true"));
        out.1 += 1;
        out.2 += num(gap)?;
        out.3 += num(spread)?;
    }
    Ok(Some(out))
}

/// The mean over rounds of Σ_S of F3AST's aggregation weights in a run directory
/// (`f3ast_weights.csv`), or `None` for other strategies. About 1 means the aggregate is
/// not inflated (F3AST under protocol `code`); about K under `paper` early in a run.
pub fn f3ast_weight_mean(dir: &Path) -> Result<Option<f64>> {
    let path = dir.join("f3ast_weights.csv");
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).map_err(|e| bad(&path, e))?;
    let sums = text
        .lines()
        .skip(1)
        .map(|l| {
            l.rsplit(',')
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .ok_or_else(|| bad(&path, format!("bad row `{l}`")))
        })
        .collect::<Result<Vec<f64>>>()?;
    Ok((!sums.is_empty()).then(|| sums.iter().sum::<f64>() / sums.len() as f64))
}

/// A table of one row per (setting, method) from the method's runs; methods for which
/// `row` gives `None` (runs of another strategy) get no row.
fn per_method(
    title: &str,
    file: &'static str,
    columns: &[&str],
    groups: &BTreeMap<(usize, String), ByStrategy>,
    row: impl Fn(&[Run]) -> Result<Option<Vec<V>>>,
) -> Result<Table> {
    let mut table = Table {
        title: title.into(),
        file,
        header: ["setting", "strategy"]
            .iter()
            .chain(columns)
            .map(|s| s.to_string())
            .collect(),
        rows: Vec::new(),
    };
    for ((_, setting), strategies) in groups {
        for ((_, strategy), runs) in strategies {
            if let Some(cells) = row(runs)? {
                table.rows.push(
                    [V::text(setting), V::text(strategy)]
                        .into_iter()
                        .chain(cells)
                        .collect(),
                );
            }
        }
    }
    Ok(table)
}

/// One table entry: markdown shows it for reading, the CSV keeps it as numbers.
#[derive(Debug, Clone, PartialEq)]
enum V {
    Text(String),
    /// A number shown with this many decimals.
    Num(f64, usize),
    /// A ratio: "2.15x" in markdown, 2.15 in the CSV.
    Times(f64),
    /// Mean ± std over seeds: one markdown column, `_mean` and `_std` CSV columns.
    MeanStd(f64, f64, usize),
    /// No value: "N/A" in markdown, an empty CSV field.
    Na,
}

impl V {
    fn text(s: impl Into<String>) -> Self {
        V::Text(s.into())
    }

    fn markdown(&self) -> String {
        match self {
            V::Text(s) => s.clone(),
            V::Num(x, d) => format!("{x:.d$}"),
            V::Times(x) => format!("{x:.2}x"),
            V::MeanStd(m, s, d) => format!("{m:.d$} ± {s:.d$}"),
            V::Na => "N/A".into(),
        }
    }

    /// The CSV fields of this entry in a column of `width` fields (2 for mean-std columns).
    fn csv(&self, width: usize) -> Vec<String> {
        let mut out = match self {
            V::Text(s) => vec![s.clone()],
            V::Num(x, d) => vec![format!("{x:.d$}")],
            V::Times(x) => vec![format!("{x:.4}")],
            V::MeanStd(m, s, d) => vec![format!("{m:.d$}"), format!("{s:.d$}")],
            V::Na => vec![],
        };
        out.resize(width, String::new());
        out
    }
}

fn pm(xs: &[f64], digits: usize) -> V {
    let (m, s) = mean_std(xs);
    V::MeanStd(m, s, digits)
}

/// A table: header and rows, written both as CSV and markdown.
struct Table {
    title: String,
    file: &'static str,
    header: Vec<String>,
    rows: Vec<Vec<V>>,
}

impl Table {
    fn markdown(&self) -> String {
        let mut s = format!(
            "## {}\n\n| {} |\n|{}\n",
            self.title,
            self.header.join(" | "),
            "---|".repeat(self.header.len())
        );
        for r in &self.rows {
            let cells: Vec<String> = r.iter().map(V::markdown).collect();
            let _ = writeln!(s, "| {} |", cells.join(" | "));
        }
        s.push('\n');
        s
    }

    /// The CSV: a column holding mean ± std anywhere becomes `<name>_mean` and `<name>_std`,
    /// so every field is one number (or text, or empty for N/A).
    fn csv(&self) -> Vec<Vec<String>> {
        let widths: Vec<usize> = (0..self.header.len())
            .map(|c| {
                let pair = self
                    .rows
                    .iter()
                    .any(|r| matches!(r.get(c), Some(V::MeanStd(..))));
                if pair { 2 } else { 1 }
            })
            .collect();
        let name = |h: &str| h.replace(' ', "_");
        let header = self
            .header
            .iter()
            .zip(&widths)
            .flat_map(|(h, &w)| match w {
                2 => vec![format!("{}_mean", name(h)), format!("{}_std", name(h))],
                _ => vec![name(h)],
            })
            .collect();
        std::iter::once(header)
            .chain(
                self.rows
                    .iter()
                    .map(|r| r.iter().zip(&widths).flat_map(|(v, &w)| v.csv(w)).collect()),
            )
            .collect()
    }

    fn write_csv(&self, dir: &Path) -> Result<()> {
        let path = dir.join(self.file);
        let err = |e: csv::Error| Error::Output {
            path: path.clone(),
            source: std::io::Error::other(e),
        };
        let mut w = csv::Writer::from_path(&path).map_err(err)?;
        for r in self.csv() {
            w.write_record(&r).map_err(err)?;
        }
        w.flush().map_err(|source| Error::Output {
            path: path.clone(),
            source,
        })
    }
}

/// Writes `report.md` and the table CSVs for the sweep in `dir`; returns the report text.
///
/// `smooth` applies Savitzky–Golay smoothing of that window to the curves in the figures.
pub fn write(dir: &Path, smooth: Option<usize>) -> Result<String> {
    if let Some(w) = smooth
        && (w < 3 || w.is_multiple_of(2))
    {
        return Err(ConfigError::invalid(
            "--smooth",
            format!("{w} is not a Savitzky–Golay window: use an odd number of rounds, at least 3"),
        )
        .into());
    }
    if !dir.join("sweep.json").is_file() {
        return Err(Error::Output {
            path: dir.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "not a sweep directory: it has no sweep.json (`fedsel sweep` writes one; a single run's results are its metrics.csv and summary.json)",
            ),
        });
    }
    let index: Index = read_json(&dir.join("sweep.json"))?;
    // setting → strategy → runs (seeds), in first-appearance order.
    let mut groups: BTreeMap<(usize, String), ByStrategy> = BTreeMap::new();
    let mut setting_order: Vec<String> = Vec::new();
    let mut strategy_order: Vec<String> = Vec::new();
    let mut missing = 0;
    // Settings may have their own targets (FedCor: 69 / 62 / 64 %): then the columns are
    // numbered and each entry names its target.
    let targets = index
        .cells
        .first()
        .map(|c| c.targets.clone())
        .unwrap_or_default();
    let shared_targets = index.cells.iter().all(|c| c.targets == targets);
    let n_targets = index
        .cells
        .iter()
        .map(|c| c.targets.len())
        .max()
        .unwrap_or(0);
    // A finished cell whose files are damaged (truncated, edited) is left out and named, so
    // one bad cell never keeps the rest of the sweep from being reported.
    let mut unreadable: Vec<(String, String)> = Vec::new();
    for cell in &index.cells {
        let cdir = dir.join("cells").join(&cell.dir);
        if !crate::sweep::is_finished(&cdir) {
            missing += 1;
            continue;
        }
        let read = || -> Result<_> {
            let summary: Summary = read_json(&cdir.join("summary.json"))?;
            let counts = counts(&cdir.join("selections.csv"), 0)?;
            let curve = curve(&cdir.join("metrics.csv"))?;
            if curve.is_empty() {
                return Err(bad(&cdir.join("metrics.csv"), "no evaluated round"));
            }
            Ok((summary, counts, curve))
        };
        let (summary, counts, curve) = match read() {
            Ok(x) => x,
            Err(e) => {
                unreadable.push((cell.dir.clone(), e.to_string()));
                continue;
            }
        };
        let si = setting_order
            .iter()
            .position(|s| s == &cell.setting)
            .unwrap_or_else(|| {
                setting_order.push(cell.setting.clone());
                setting_order.len() - 1
            });
        let ti = strategy_order
            .iter()
            .position(|s| s == &cell.strategy)
            .unwrap_or_else(|| {
                strategy_order.push(cell.strategy.clone());
                strategy_order.len() - 1
            });
        groups
            .entry((si, cell.setting.clone()))
            .or_default()
            .entry((ti, cell.strategy.clone()))
            .or_default()
            .push(Run {
                summary,
                counts,
                curve,
                dir: cdir.clone(),
            });
    }
    let baseline = index
        .baseline
        .clone()
        .or_else(|| strategy_order.first().cloned());

    let mut rtt = Table {
        title: "Rounds to target accuracy (mean ± std over seeds; N/A if any seed misses)".into(),
        file: "rounds_to_target.csv",
        header: ["setting", "strategy", "seeds"]
            .iter()
            .map(|s| s.to_string())
            .chain((0..n_targets).map(|i| match shared_targets {
                true => pct(targets[i]),
                false => format!("target {}", i + 1),
            }))
            .chain((!shared_targets).then(|| "targets".to_string()))
            .collect(),
        rows: Vec::new(),
    };
    let mut bf = Table {
        title: format!(
            "Best and final test accuracy and loss (Δ vs {})",
            baseline.as_deref().unwrap_or("-")
        ),
        file: "best_final.csv",
        header: [
            "setting",
            "strategy",
            "best_acc",
            "final_acc",
            "best_loss",
            "final_loss",
            "final_acc_change_%",
            "final_loss_change_%",
        ]
        .map(String::from)
        .to_vec(),
        rows: Vec::new(),
    };
    let mut sp = Table {
        title: format!(
            "Rounds to the first target with speedup vs {}, and extra cost per round",
            baseline.as_deref().unwrap_or("-")
        ),
        file: "speedup.csv",
        header: [
            "setting",
            "strategy",
            "rounds_to_first_target",
            "speedup",
            "extra_comm_per_round",
            "extra_comp_per_round",
        ]
        .map(String::from)
        .to_vec(),
        rows: Vec::new(),
    };
    let mut sel = Table {
        title: "Selection counts per client (mean over seeds)".into(),
        file: "selection_stats.csv",
        header: [
            "setting",
            "strategy",
            "count_variance",
            "min_count",
            "max_count",
            "never_selected",
        ]
        .map(String::from)
        .to_vec(),
        rows: Vec::new(),
    };
    for ((_, setting), strategies) in &groups {
        let mean_rounds = |runs: &[Run]| rounds_to(runs, 0).map(|v| mean_std(&v).0);
        let base_runs = strategies
            .iter()
            .find(|((_, s), _)| Some(s) == baseline.as_ref())
            .map(|(_, r)| r);
        let base_final = base_runs.map(|r| {
            let acc: Vec<f64> = r.iter().map(|x| x.summary.final_acc).collect();
            let loss: Vec<f64> = r.iter().map(|x| x.summary.final_loss).collect();
            (mean_std(&acc).0, mean_std(&loss).0)
        });
        let base_rounds = base_runs.and_then(|r| mean_rounds(r));
        for ((_, strategy), runs) in strategies {
            let f =
                |g: fn(&Summary) -> f64| runs.iter().map(|r| g(&r.summary)).collect::<Vec<f64>>();
            let mut row = vec![
                V::text(setting),
                V::text(strategy),
                V::Num(runs.len() as f64, 0),
            ];
            for ti in 0..n_targets {
                row.push(rounds_to(runs, ti).map_or(V::Na, |v| pm(&v, 1)));
            }
            if !shared_targets {
                let targets: Vec<String> = runs[0]
                    .summary
                    .rounds_to_target
                    .iter()
                    .map(|t| pct(t.0))
                    .collect();
                row.push(V::text(targets.join(" ")));
            }
            rtt.rows.push(row);
            let (fa, fl) = (
                mean_std(&f(|s| s.final_acc)).0,
                mean_std(&f(|s| s.final_loss)).0,
            );
            let change =
                |x: f64, b: Option<f64>| b.map_or(V::Na, |b| V::Num(100.0 * (x - b) / b, 2));
            bf.rows.push(vec![
                V::text(setting),
                V::text(strategy),
                pm(&f(|s| s.best_acc), 4),
                pm(&f(|s| s.final_acc), 4),
                pm(&f(|s| s.best_loss), 4),
                pm(&f(|s| s.final_loss), 4),
                change(fa, base_final.map(|b| b.0)),
                change(fl, base_final.map(|b| b.1)),
            ]);
            let rounds: f64 = runs.iter().map(|r| r.summary.rounds as f64).sum();
            let extra_comm: f64 = runs
                .iter()
                .map(|r| {
                    (r.summary.cost.broadcasts
                        + r.summary.cost.uploads
                        + r.summary.cost.scalar_reports
                        + r.summary.cost.protocol_messages) as f64
                        - 2.0 * r.summary.cost.trainings as f64
                })
                .sum::<f64>()
                / rounds;
            let extra_comp: f64 = runs
                .iter()
                .map(|r| {
                    (r.summary.cost.evaluations
                        + r.summary.cost.gradients
                        + r.summary.cost.probe_trainings
                        + r.summary.cost.extra_trainings) as f64
                })
                .sum::<f64>()
                / rounds;
            let mr = mean_rounds(runs);
            sp.rows.push(vec![
                V::text(setting),
                V::text(strategy),
                mr.map_or(V::Na, |m| V::Num(m, 1)),
                match (mr, base_rounds) {
                    (Some(m), Some(b)) => V::Times(b / m),
                    _ => V::Na,
                },
                V::Num(extra_comm, 2),
                V::Num(extra_comp, 2),
            ]);
            let n = runs.iter().map(|r| r.counts.len()).max().unwrap_or(0);
            let stats: Vec<(f64, f64, f64, f64)> = runs
                .iter()
                .map(|r| {
                    let c: Vec<f64> = (0..n)
                        .map(|k| r.counts.get(k).copied().unwrap_or(0) as f64)
                        .collect();
                    let s = mean_std(&c).1;
                    let min = c.iter().cloned().fold(f64::INFINITY, f64::min);
                    let max = c.iter().cloned().fold(0.0, f64::max);
                    (
                        s * s,
                        min,
                        max,
                        c.iter().filter(|&&x| x == 0.0).count() as f64,
                    )
                })
                .collect();
            let avg = |g: fn(&(f64, f64, f64, f64)) -> f64| {
                stats.iter().map(g).sum::<f64>() / stats.len() as f64
            };
            sel.rows.push(vec![
                V::text(setting),
                V::text(strategy),
                V::Num(avg(|s| s.0), 2),
                V::Num(avg(|s| s.1), 1),
                V::Num(avg(|s| s.2), 1),
                V::Num(avg(|s| s.3), 1),
            ]);
        }
    }
    let mut md = format!(
        "# Report: {}\n\nfedsel {}; {} cells, {} finished{}.\nBaseline strategy: {}.\n\n",
        index.name,
        fedsel::VERSION,
        index.cells.len(),
        index.cells.len() - missing,
        if missing > 0 {
            format!(", **{missing} not finished (left out)**")
        } else {
            String::new()
        },
        baseline.as_deref().unwrap_or("-")
    );
    if !unreadable.is_empty() {
        let _ = writeln!(
            md,
            "**{} finished cells could not be read and are left out:**\n",
            unreadable.len()
        );
        for (cell, why) in &unreadable {
            let _ = writeln!(md, "- `{cell}`: {why}");
        }
        md.push('\n');
    }
    let solver = per_method(
        "FedGS solver: rounds proven optimal, mean gap to the upper bound, mean graph distance among the selected",
        "fedgs_solver_summary.csv",
        &[
            "rounds proven",
            "rounds",
            "mean gap",
            "mean selected distance",
        ],
        &groups,
        |runs| {
            let mut total = (0, 0, 0.0, 0.0);
            for r in runs {
                if let Some(x) = solver_record(&r.dir)? {
                    total = (total.0 + x.0, total.1 + x.1, total.2 + x.2, total.3 + x.3);
                }
            }
            Ok((total.1 > 0).then(|| {
                vec![
                    V::Num(total.0 as f64, 0),
                    V::Num(total.1 as f64, 0),
                    V::Num(total.2 / total.1 as f64, 6),
                    V::Num(total.3 / total.1 as f64, 4),
                ]
            }))
        },
    )?;
    let weights = per_method(
        "F3AST: mean over rounds of the sum of each round's aggregation weights",
        "f3ast_weights_summary.csv",
        &["mean weight sum"],
        &groups,
        |runs| {
            let means = runs
                .iter()
                .map(|r| f3ast_weight_mean(&r.dir))
                .collect::<Result<Vec<_>>>()?;
            let means: Vec<f64> = means.into_iter().flatten().collect();
            Ok((!means.is_empty()).then(|| vec![pm(&means, 4)]))
        },
    )?;
    let optional = ["fedgs_solver_summary.csv", "f3ast_weights_summary.csv"];
    let tables: Vec<&Table> = [&rtt, &bf, &sp, &sel, &solver, &weights]
        .into_iter()
        .filter(|t| !t.rows.is_empty() || !optional.contains(&t.file))
        .collect();
    for t in tables {
        t.write_csv(dir)?;
        md.push_str(&t.markdown());
    }
    md.push_str("Extra communication per round counts broadcasts, uploads and scalar reports beyond the two messages of each training client; extra computation counts client evaluations, one-step gradients, discarded probe trainings and the extra trainings a strategy adds to a round (FedGP).\n");
    md.push_str("\n## Figures\n\n");
    match crate::plot::ensure_font() {
        Ok(()) => {
            for ((_, setting), strategies) in &groups {
                md.push_str(&figures(dir, setting, strategies, smooth)?);
            }
        }
        Err(why) => md.push_str(&format!("Figures skipped: {why}.\n")),
    }
    let path = dir.join("report.md");
    std::fs::write(&path, &md).map_err(|source| Error::Output { path, source })?;
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(counts: Vec<usize>, rounds: usize) -> Run {
        Run {
            summary: Summary {
                seed: 1,
                final_acc: 0.0,
                final_loss: 0.0,
                best_acc: 0.0,
                best_loss: 0.0,
                rounds,
                rounds_to_target: Vec::new(),
                cost: Ledger::default(),
            },
            counts,
            curve: Vec::new(),
            dir: std::path::PathBuf::new(),
        }
    }

    /// Two seeds that favour different client ids have the same profile: one client
    /// always selected, one half the time, one never. Averaging by id would show a flat
    /// 0.5 for all three.
    #[test]
    fn selection_frequencies_are_averaged_by_rank_not_by_id() {
        let runs = [run(vec![10, 0, 5], 10), run(vec![0, 10, 5], 10)];
        assert_eq!(ranked_frequencies(&runs), vec![1.0, 0.5, 0.0]);
    }

    /// Mean ± std columns split into two numeric CSV columns; N/A is an empty field;
    /// a ratio loses its "x".
    #[test]
    fn csv_fields_are_numbers() {
        let t = Table {
            title: String::new(),
            file: "t.csv",
            header: vec!["strategy".into(), "rounds".into(), "speedup".into()],
            rows: vec![
                vec![V::text("a"), V::MeanStd(18.7, 1.5, 1), V::Times(2.15)],
                vec![V::text("b"), V::Na, V::Na],
            ],
        };
        assert_eq!(
            t.csv(),
            vec![
                vec!["strategy", "rounds_mean", "rounds_std", "speedup"],
                vec!["a", "18.7", "1.5", "2.1500"],
                vec!["b", "", "", ""],
            ]
        );
        assert!(t.markdown().contains("| a | 18.7 ± 1.5 | 2.15x |"));
        assert!(t.markdown().contains("| b | N/A | N/A |"));
    }
}

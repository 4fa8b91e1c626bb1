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

/// The evaluated rounds of a run's `metrics.csv`, and the last per-client accuracy spread
/// in it. Columns are found by name: later releases append columns.
fn read_metrics(path: &Path) -> Result<Metrics> {
    let mut r = csv::Reader::from_path(path).map_err(|e| bad(path, e))?;
    let header = r.headers().map_err(|e| bad(path, e))?.clone();
    let col = |name: &str| header.iter().position(|h| h == name);
    let (round, acc, loss) = match (col("round"), col("test_acc"), col("test_loss")) {
        (Some(t), Some(a), Some(l)) => (t, a, l),
        _ => return Err(bad(path, "no round, test_acc and test_loss columns")),
    };
    let spread: Option<Vec<usize>> = fedsel::output::CLIENT_ACC_COLUMNS
        .iter()
        .map(|c| col(c))
        .collect();
    let clock = col("clock_s");
    let mut out = Vec::new();
    let mut timed = clock.map(|_| Vec::new());
    let mut last = None;
    for row in r.records() {
        let row = row.map_err(|e| bad(path, e))?;
        let num = |i: usize| row.get(i).and_then(|v| v.parse::<f64>().ok());
        if let (Some(t), Some(a), Some(l)) = (num(round), num(acc), num(loss)) {
            out.push((t + 1.0, a, l));
            if let (Some(c), Some(timed)) = (clock, timed.as_mut()) {
                let s = num(c).ok_or_else(|| {
                    bad(
                        path,
                        format!("round {t}: clock_s is not a number of seconds"),
                    )
                })?;
                timed.push((s, a));
            }
        }
        if let Some(s) = spread
            .as_ref()
            .and_then(|cols| cols.iter().map(|&i| num(i)).collect::<Option<Vec<f64>>>())
        {
            last = Some([s[0], s[1], s[2], s[3]]);
        }
    }
    Ok(Metrics {
        curve: out,
        clients: last,
        timed,
    })
}

/// More clients than any run of `availability.csv` holds (a hundred million).
const MAX_CLIENTS: usize = 100_000_000;

/// The available clients of the first `max_rounds` rounds of a run, from
/// `availability.csv` as `id_ranges` writes them (and as plain id lists, which older runs
/// hold).
fn availability(path: &Path, max_rounds: usize) -> Result<Vec<Vec<usize>>> {
    let mut r = csv::Reader::from_path(path).map_err(|e| bad(path, e))?;
    let mut out = Vec::new();
    for row in r.records().take(max_rounds) {
        let row = row.map_err(|e| bad(path, e))?;
        let mut ids = Vec::new();
        for token in row[1].split_whitespace() {
            let id = |k: &str| k.parse::<usize>().map_err(|e| bad(path, e));
            match token.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (id(a)?, id(b)?);
                    // A run no partition could hold is a corrupt file, not a reason to
                    // allocate it.
                    if b < a || b - a >= MAX_CLIENTS {
                        return Err(bad(path, format!("`{token}` is not a run of client ids")));
                    }
                    ids.extend(a..=b);
                }
                None => ids.push(id(token)?),
            }
        }
        out.push(ids);
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
        error: source,
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
    let timed = match time_clocks(strategies) {
        Some(arms) => {
            crate::plot::timeline(
                &stem("accuracy-time"),
                &format!("{setting}: test accuracy on the virtual clock"),
                &crate::timeline::timeline(&arms),
            )?;
            format!(
                "![accuracy over virtual time]({})\n\nThe virtual-time figure shows every run as a thin line over its own run, from its first evaluation to its end: its accuracy at each time is that of its last evaluation so far. The thick line and band are the mean ± std over the seeds of an arm that have been evaluated and still run, drawn only where at least half of the arm's seeds do (the mean steps where a seed ends, as the seeds averaged change); a circle marks each arm's median time to each target (the table's median) on a dashed line at the target's accuracy, hollow where the median is only a lower bound. The x axis reaches the end of the longest run. Not smoothed.\n\n",
                name("accuracy-time")
            )
        }
        None => String::new(),
    };
    Ok(format!(
        "### {setting}\n\n![accuracy]({})\n![loss]({})\n![selection frequency]({})\n![availability]({})\n\nThe accuracy and loss axes fit the rounds after the first tenth of the run; earlier rounds leave the frame. The selection figure sorts each run's clients from most to least often selected and averages rank by rank over seeds. SVG versions sit beside each PNG.\n\n{timed}",
        name("accuracy"),
        name("loss"),
        name("selection"),
        name("availability")
    ))
}

/// The seeds of each arm of a setting on the virtual clock, for the accuracy-over-time
/// figure ([`crate::timeline`]); `None` when no run of the setting has a clock. An arm with a
/// run without one (or without an evaluation) gets no curve.
fn time_clocks(strategies: &ByStrategy) -> Option<Vec<crate::timeline::ArmClocks>> {
    let arms: Vec<crate::timeline::ArmClocks> = strategies
        .iter()
        .filter_map(|((_, s), runs)| {
            let seeds = runs
                .iter()
                .map(|r| {
                    let evals = r.timed.clone().filter(|t| !t.is_empty())?;
                    let last = evals[evals.len() - 1].0;
                    Some(crate::timeline::SeedClock {
                        end_s: r.summary.clock_s.map_or(last, |c| c.max(last)),
                        to_target: r.summary.time_to_target_s.clone().unwrap_or_default(),
                        evals,
                    })
                })
                .collect::<Option<Vec<_>>>()?;
            Some(crate::timeline::ArmClocks {
                label: format!("{s} (n={})", runs.len()),
                seeds,
            })
        })
        .collect();
    (!arms.is_empty()).then_some(arms)
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Output {
        path: path.to_path_buf(),
        error: source,
    })?;
    serde_json::from_str(&text).map_err(|e| Error::Output {
        path: path.to_path_buf(),
        error: std::io::Error::other(e),
    })
}

fn counts(path: &Path, clients: usize) -> Result<Vec<usize>> {
    let mut c = vec![0; clients];
    let mut r = csv::Reader::from_path(path).map_err(|e| Error::Output {
        path: path.to_path_buf(),
        error: std::io::Error::other(e),
    })?;
    for row in r.records() {
        let row = row.map_err(|e| Error::Output {
            path: path.to_path_buf(),
            error: std::io::Error::other(e),
        })?;
        let k: usize = row[1].parse().map_err(|e| Error::Output {
            path: path.to_path_buf(),
            error: std::io::Error::other(e),
        })?;
        if k >= c.len() {
            c.resize(k + 1, 0);
        }
        c[k] += 1;
    }
    Ok(c)
}

/// A run's rounds to target `ti`: the round it first reached it, or censored at the run's
/// rounds; `None` when the run has no such target.
fn rounds_obs(r: &Run, ti: usize) -> Option<Obs> {
    r.summary.rounds_to_target.get(ti).map(|t| {
        t.1.map_or(Obs::Above(r.summary.rounds as f64), |x| {
            Obs::Value(x as f64)
        })
    })
}

/// A run's virtual time to target `ti` in units of `unit` seconds: the clock at the end of
/// the round that first reached it, or censored at the run's final clock; `None` for a run
/// without a clock or without such a target.
fn time_obs(r: &Run, ti: usize, unit: f64) -> Option<Obs> {
    let end = r.summary.clock_s?;
    let t = r.summary.time_to_target_s.as_ref()?.get(ti)?;
    Some(t.1.map_or(Obs::Above(end / unit), |x| Obs::Value(x / unit)))
}

/// The statistics over seeds of one metric of the runs; N/A when a run lacks it.
fn stat(runs: &[Run], get: impl Fn(&Run) -> Option<Obs>, censorable: bool, digits: usize) -> V {
    bounded_stat(runs, get, censorable, digits, 0)
}

/// [`stat`] with the censoring bounds shown with `bound_digits` decimals (hours to a target
/// are censored at a fraction of an hour; rounds at a whole number).
fn bounded_stat(
    runs: &[Run],
    get: impl Fn(&Run) -> Option<Obs>,
    censorable: bool,
    digits: usize,
    bound_digits: usize,
) -> V {
    runs.iter()
        .map(get)
        .collect::<Option<Vec<Obs>>>()
        .map_or(V::Na, |obs| V::Stat {
            stats: stats::seed_stats(&obs),
            digits,
            censorable,
            bound_digits,
        })
}

/// The paired comparison of one metric of `runs` with the baseline's runs `base` of the
/// same setting; N/A when the setting has no baseline runs or a run lacks the metric.
fn compare(
    runs: &[Run],
    base: Option<&[Run]>,
    is_base: bool,
    get: impl Fn(&Run) -> Option<Obs>,
    test: Test,
    digits: usize,
) -> V {
    if is_base {
        return V::Baseline;
    }
    let pick = |rs: &[Run]| {
        rs.iter()
            .map(|r| get(r).map(|o| (r.summary.seed, o)))
            .collect::<Option<Vec<_>>>()
    };
    match (pick(runs), base.and_then(pick)) {
        (Some(a), Some(b)) => V::Paired(stats::paired(&a, &b, test), digits),
        _ => V::Na,
    }
}

/// A run's targets, as the column that names them when a group's runs do not share theirs.
fn targets_cell(run: &Run) -> V {
    let targets: Vec<String> = run
        .summary
        .rounds_to_target
        .iter()
        .map(|t| pct(t.0))
        .collect();
    V::text(targets.join(" "))
}

fn pct(t: f64) -> String {
    format!("{:.0}%", t * 100.0)
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
    columns: Vec<Col>,
    g: &Gathered,
    row: impl Fn(&[Run]) -> Result<Option<Vec<V>>>,
) -> Result<Table> {
    let mut table = Table {
        title: title.into(),
        file,
        columns: [Col::plain("setting"), Col::plain(g.arm)]
            .into_iter()
            .chain(columns)
            .collect(),
        rows: Vec::new(),
    };
    for ((_, setting), strategies) in &g.groups {
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

/// A p-value for reading.
fn p_text(p: Option<f64>) -> String {
    match p {
        None => "p N/A".into(),
        Some(p) if p < 0.001 => "p < 0.001".into(),
        Some(p) => format!("p = {p:.3}"),
    }
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
            V::Stat {
                stats: s,
                digits: d,
                censorable,
                bound_digits: b,
            } => {
                let reached = format!("{}/{}", s.reached, s.n);
                if let (0, Some(r)) = (s.reached, s.censored_at) {
                    return format!("> {r:.b$} ({reached})");
                }
                let head = match s.mean_std {
                    Some((m, sd)) => format!("{m:.d$} ± {sd:.d$}"),
                    None => format!("≥ {:.d$}", s.mean_lb),
                };
                let mut parts = vec![match s.median {
                    Median::Value(m) => format!("median {m:.d$}"),
                    Median::Above(r) => format!("median > {r:.b$}"),
                }];
                if let Some((lo, hi)) = s.ci {
                    parts.push(format!("CI {lo:.d$}–{hi:.d$}"));
                }
                if *censorable {
                    parts.push(reached);
                }
                format!("{head} ({})", parts.join(", "))
            }
            V::Paired(p, d) => {
                if p.n == 0 {
                    return "no shared seeds".into();
                }
                let diff = p
                    .median_diff
                    .map_or("Δ N/A".into(), |x| format!("Δ {x:+.d$}"));
                format!(
                    "{diff}, {} ({}↑ {}↓ of {})",
                    p_text(p.p),
                    p.above,
                    p.below,
                    p.n
                )
            }
            V::Baseline => "(baseline)".into(),
            V::Na => "N/A".into(),
        }
    }

    /// The entry for a printed table: statistics over seeds without median and CI, paired
    /// comparisons without the seed counts.
    fn short(&self) -> String {
        match self {
            V::Stat {
                stats: s,
                digits: d,
                censorable,
                bound_digits: b,
            } => {
                let reached = format!("{}/{}", s.reached, s.n);
                let head = match (s.reached, s.censored_at, s.mean_std) {
                    (0, Some(r), _) => format!("> {r:.b$}"),
                    (_, _, Some((m, sd))) => format!("{m:.d$} ± {sd:.d$}"),
                    _ => format!("≥ {:.d$}", s.mean_lb),
                };
                match censorable {
                    true => format!("{head} ({reached})"),
                    false => head,
                }
            }
            V::Paired(p, d) if p.n > 0 => {
                let diff = p
                    .median_diff
                    .map_or("Δ N/A".into(), |x| format!("Δ {x:+.d$}"));
                format!("{diff}, {}", p_text(p.p))
            }
            other => other.markdown(),
        }
    }

    /// The CSV fields of this entry, one for each of its column's [`Col::fields`].
    fn csv(&self, col: &Col) -> Vec<String> {
        let num = |x: f64, d: usize| format!("{x:.d$}");
        let mut out = match self {
            V::Text(s) => vec![s.clone()],
            V::Num(x, d) => vec![num(*x, *d)],
            V::Times(x) => vec![num(*x, 4)],
            V::MeanStd(m, s, d) => vec![num(*m, *d), num(*s, *d)],
            V::Stat {
                stats: s,
                digits: d,
                ..
            } => {
                let opt = |x: Option<f64>| x.map_or(String::new(), |x| num(x, *d));
                vec![
                    opt(s.mean_std.map(|m| m.0)),
                    opt(s.mean_std.map(|m| m.1)),
                    opt(match s.median {
                        Median::Value(m) => Some(m),
                        Median::Above(_) => None,
                    }),
                    opt(s.ci.map(|c| c.0)),
                    opt(s.ci.map(|c| c.1)),
                    s.reached.to_string(),
                    num(s.mean_lb, *d),
                ]
            }
            V::Paired(p, d) => vec![
                p.n.to_string(),
                p.above.to_string(),
                p.below.to_string(),
                p.median_diff.map_or(String::new(), |x| num(x, *d)),
                p.p.map_or(String::new(), |p| num(p, 6)),
            ],
            V::Baseline | V::Na => vec![],
        };
        out.resize(col.fields().len(), String::new());
        out
    }
}

/// `s` as LaTeX text: the ten special characters escaped, and the few non-ASCII signs the
/// report prints written as commands, so that the table compiles without any package or
/// input encoding. Other non-ASCII passes through.
fn latex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\textbackslash{}"),
            '{' | '}' | '_' | '%' | '&' | '#' | '$' => {
                out.push('\\');
                out.push(c);
            }
            '~' => out.push_str("\\textasciitilde{}"),
            '^' => out.push_str("\\textasciicircum{}"),
            '<' => out.push_str("\\textless{}"),
            '>' => out.push_str("\\textgreater{}"),
            '|' => out.push_str("\\textbar{}"),
            '±' => out.push_str("$\\pm$"),
            '≥' => out.push_str("$\\geq$"),
            '≤' => out.push_str("$\\leq$"),
            'Δ' => out.push_str("$\\Delta$"),
            '↑' => out.push_str("$\\uparrow$"),
            '↓' => out.push_str("$\\downarrow$"),
            '−' => out.push_str("$-$"),
            '–' => out.push_str("--"),
            '—' => out.push_str("---"),
            'ⁿ' => out.push_str("$^n$"),
            _ => out.push(c),
        }
    }
    out
}

fn pm(xs: &[f64], digits: usize) -> V {
    let (m, s) = mean_std(xs);
    V::MeanStd(m, s, digits)
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

impl Col {
    fn new(title: impl Into<String>, kind: Kind) -> Self {
        let title = title.into();
        Col {
            csv: title.replace(' ', "_"),
            title,
            kind,
            new: false,
        }
    }

    fn plain(title: &str) -> Self {
        Col::new(title, Kind::Plain)
    }

    /// A column of paired comparisons for the metric whose CSV stem is `csv`.
    fn paired(title: impl Into<String>, csv: &str) -> Self {
        Col {
            csv: csv.into(),
            ..Col::new(title, Kind::Paired)
        }
    }

    /// Its CSV field names, each with whether it is new.
    fn fields(&self) -> Vec<(String, bool)> {
        let f = |suffix: &str, new: bool| (format!("{}{suffix}", self.csv), new || self.new);
        match self.kind {
            Kind::Plain => vec![f("", false)],
            Kind::MeanStd => vec![f("_mean", false), f("_std", false)],
            Kind::Stat { censorable, single } => {
                let mut v = match single {
                    true => vec![f("", false), f("_std", true)],
                    false => vec![f("_mean", false), f("_std", false)],
                };
                v.extend(["_median", "_ci_lo", "_ci_hi"].map(|s| f(s, true)));
                if censorable {
                    v.extend(["_reached", "_mean_lb"].map(|s| f(s, true)));
                }
                v
            }
            Kind::Paired => [
                "_paired_n",
                "_paired_above",
                "_paired_below",
                "_paired_diff",
                "_p",
            ]
            .map(|s| f(s, true))
            .to_vec(),
        }
    }
}

/// A table: columns and rows, written both as CSV and markdown.
struct Table {
    title: String,
    file: &'static str,
    columns: Vec<Col>,
    rows: Vec<Vec<V>>,
}

impl Table {
    fn markdown(&self) -> String {
        let titles: Vec<&str> = self.columns.iter().map(|c| c.title.as_str()).collect();
        let mut s = format!(
            "## {}\n\n| {} |\n|{}\n",
            self.title,
            titles.join(" | "),
            "---|".repeat(titles.len())
        );
        for r in &self.rows {
            let cells: Vec<String> = r.iter().map(V::markdown).collect();
            let _ = writeln!(s, "| {} |", cells.join(" | "));
        }
        s.push('\n');
        s
    }

    /// The table as a LaTeX float: `table` around a `tabular` with `\hline` rules (no
    /// package needed), every cell escaped; statistics over seeds show their head (mean ±
    /// std, or the bound) and comparisons Δ and p, the rest staying in the CSV.
    fn latex(&self) -> String {
        let row = |cells: Vec<String>| format!("{} \\\\\n", cells.join(" & "));
        let mut s = format!(
            "\\begin{{table}}[htbp]\n\\centering\n\\caption{{{}}}\n\\label{{tab:{}}}\n\\begin{{tabular}}{{{}}}\n\\hline\n",
            latex_escape(&self.title),
            self.file.trim_end_matches(".csv").replace('_', "-"),
            "l".repeat(self.columns.len())
        );
        s.push_str(&row(self
            .columns
            .iter()
            .map(|c| latex_escape(&c.title))
            .collect()));
        s.push_str("\\hline\n");
        for r in &self.rows {
            s.push_str(&row(r.iter().map(|v| latex_escape(&v.short())).collect()));
        }
        s.push_str("\\hline\n\\end{tabular}\n\\end{table}\n\n");
        s
    }

    /// The CSV: every field is one number (or text, or empty for N/A). The fields of earlier
    /// releases come first, in their old order, and the new ones (median, CI, paired
    /// comparison) after them, so a reader going by name or by position still finds the old
    /// columns.
    fn csv(&self) -> Vec<Vec<String>> {
        let flags: Vec<bool> = self
            .columns
            .iter()
            .flat_map(|c| c.fields().into_iter().map(|f| f.1))
            .collect();
        let order = |fields: Vec<String>| -> Vec<String> {
            let (old, new): (Vec<_>, Vec<_>) = fields.into_iter().zip(&flags).partition(|x| !x.1);
            old.into_iter().chain(new).map(|x| x.0).collect()
        };
        let header = self
            .columns
            .iter()
            .flat_map(|c| c.fields().into_iter().map(|f| f.0))
            .collect();
        std::iter::once(order(header))
            .chain(self.rows.iter().map(|r| {
                order(
                    r.iter()
                        .zip(&self.columns)
                        .flat_map(|(v, c)| v.csv(c))
                        .collect(),
                )
            }))
            .collect()
    }

    fn write_csv(&self, dir: &Path) -> Result<()> {
        let path = dir.join(self.file);
        let err = |e: csv::Error| Error::Output {
            path: path.clone(),
            error: std::io::Error::other(e),
        };
        let mut w = csv::Writer::from_path(&path).map_err(err)?;
        for r in self.csv() {
            w.write_record(&r).map_err(err)?;
        }
        w.flush().map_err(|source| Error::Output {
            path: path.clone(),
            error: source,
        })
    }
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

/// Reads the finished cells of the sweep in `dir`, naming the cells left out.
fn gather_sweep(dir: &Path) -> Result<Gathered> {
    if !dir.join("sweep.json").is_file() {
        return Err(Error::Output {
            path: dir.to_path_buf(),
            error: std::io::Error::new(
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
    let mut missing: Vec<&str> = Vec::new();
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
    // A finished cell that is not whole (its metrics cut short) or whose files are damaged
    // is left out and named, so one bad cell never keeps the rest of the sweep from being
    // reported.
    let mut left_out: Vec<(String, String)> = Vec::new();
    let mut trackers = Vec::new();
    for cell in &index.cells {
        let cdir = dir.join("cells").join(&cell.dir);
        // A cell still running or cut short has event files worth watching too.
        if let Some(t) = tracker_dir(&cdir)? {
            trackers.push((cell.label.clone(), t));
        }
        if !crate::sweep::is_finished(&cdir) {
            missing.push(&cell.label);
            continue;
        }
        let read = || -> Result<_> {
            if let Some(why) = crate::arms::truncation(&cdir)? {
                return Err(bad(&cdir, why));
            }
            let summary: Summary = read_json(&cdir.join("summary.json"))?;
            let counts = counts(&cdir.join("selections.csv"), 0)?;
            let Metrics {
                curve,
                clients,
                timed,
            } = read_metrics(&cdir.join("metrics.csv"))?;
            if curve.is_empty() {
                return Err(bad(&cdir.join("metrics.csv"), "no evaluated round"));
            }
            Ok((summary, counts, curve, clients, timed))
        };
        let (summary, counts, curve, clients, timed) = match read() {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("left out of the report: {e}");
                left_out.push((cell.dir.clone(), e.to_string()));
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
                clients,
                timed,
                dir: cdir.clone(),
            });
    }
    let baseline = index
        .baseline
        .clone()
        .or_else(|| strategy_order.first().cloned());
    let mut md = format!(
        "# Report: {}\n\nfedsel {}; {} cells, {} finished{}.\nBaseline strategy: {}.\n\n",
        index.name,
        fedsel::VERSION,
        index.cells.len(),
        index.cells.len() - missing.len(),
        if missing.is_empty() {
            String::new()
        } else {
            format!(
                ", **{} not finished (left out): {}**",
                missing.len(),
                missing.join(", ")
            )
        },
        baseline.as_deref().unwrap_or("-")
    );
    if !left_out.is_empty() {
        let _ = writeln!(
            md,
            "**Finished cells left out, not whole or not readable ({}):**\n",
            left_out.len()
        );
        for (cell, why) in &left_out {
            let _ = writeln!(md, "- `{cell}`: {why}");
        }
        md.push('\n');
    }
    Ok(Gathered {
        intro: md,
        groups,
        baseline,
        targets,
        shared_targets,
        n_targets,
        arm: "strategy",
        trackers,
    })
}

/// Reads plain run directories and groups them into arms (see [`crate::arms`]), warning of
/// each run left out.
fn gather_runs(dirs: &[std::path::PathBuf], allow_mixed: bool) -> crate::error::Result<Gathered> {
    let crate::arms::Arms {
        arms,
        left_out,
        mixed,
    } = crate::arms::arms(dirs, allow_mixed)?;
    let mut strategies: ByStrategy = BTreeMap::new();
    let n_runs: usize = arms.iter().map(|a| a.dirs.len()).sum();
    let mut md = format!(
        "# Report: {n_runs} runs in {} arms\n\nfedsel {}. Runs whose resolved configs differ only by seed form one arm; an arm is named by the keys in which it differs from the others (keys not compared: {}). Baseline arm: {}.\n\n",
        arms.len(),
        fedsel::VERSION,
        crate::arms::IGNORED.join(", "),
        arms[0].label
    );
    if !left_out.is_empty() {
        let _ = writeln!(
            md,
            "**Runs left out, not being whole ({}):**\n",
            left_out.len()
        );
        for l in &left_out {
            tracing::warn!("left out of the report: {l}");
            let _ = writeln!(md, "- {l}");
        }
        md.push('\n');
    }
    if !mixed.is_empty() {
        let differences: Vec<String> = mixed.iter().map(ToString::to_string).collect();
        let _ = writeln!(
            md,
            "**The arms are of different tasks, compared side by side as asked:** {}. Their seeds are paired all the same, and targets that differ share numbered columns.\n",
            differences.join("; ")
        );
    }
    let mut targets: Vec<Vec<f64>> = Vec::new();
    let mut trackers = Vec::new();
    for (i, arm) in arms.iter().enumerate() {
        let mut runs = Vec::new();
        for dir in &arm.dirs {
            if let Some(t) = tracker_dir(dir)? {
                trackers.push((dir.display().to_string(), t));
            }
            let summary: Summary = read_json(&dir.join("summary.json"))?;
            let counts = counts(&dir.join("selections.csv"), 0)?;
            let Metrics {
                curve,
                clients,
                timed,
            } = read_metrics(&dir.join("metrics.csv"))?;
            if curve.is_empty() {
                return Err(bad(&dir.join("metrics.csv"), "no evaluated round").into());
            }
            targets.push(summary.rounds_to_target.iter().map(|t| t.0).collect());
            runs.push(Run {
                summary,
                counts,
                curve,
                clients,
                timed,
                dir: dir.clone(),
            });
        }
        let seeds: Vec<String> = runs
            .iter()
            .map(|r| format!("`{}` (seed {})", r.dir.display(), r.summary.seed))
            .collect();
        let _ = writeln!(md, "- **{}**: {}", arm.label, seeds.join(", "));
        strategies.insert((i, arm.label.clone()), runs);
    }
    md.push('\n');
    Ok(Gathered {
        intro: md,
        baseline: Some(arms[0].label.clone()),
        shared_targets: targets.iter().all(|t| *t == targets[0]),
        n_targets: targets.iter().map(Vec::len).max().unwrap_or(0),
        targets: targets.swap_remove(0),
        groups: BTreeMap::from([((0, "all".to_string()), strategies)]),
        arm: "arm",
        trackers,
    })
}

/// Every table of a report; the strategy-specific ones only where their strategy ran, the
/// per-client accuracy only where some run measured it.
fn tables(g: &Gathered) -> Result<Vec<Table>> {
    let baseline = &g.baseline;
    let (targets, shared_targets, n_targets) = (&g.targets, g.shared_targets, g.n_targets);
    let base_name = baseline.as_deref().unwrap_or("-");
    let vs = |what: &str| format!("{what} vs {base_name}");
    let target_titles: Vec<String> = (0..n_targets)
        .map(|i| match shared_targets {
            true => pct(targets[i]),
            false => format!("target {}", i + 1),
        })
        .collect();
    let rounds_kind = Kind::Stat {
        censorable: true,
        single: false,
    };
    let mut rtt = Table {
        title: format!(
            "Rounds to target accuracy over seeds: mean ± std (≥ a lower bound when a seed never reached it), median, 95 % CI, seeds reached; paired sign test vs {base_name}"
        ),
        file: "rounds_to_target.csv",
        columns: ["setting", g.arm, "seeds"]
            .map(Col::plain)
            .into_iter()
            .chain(target_titles.iter().flat_map(|t| {
                let stat = Col::new(t.as_str(), rounds_kind);
                let paired = Col::paired(vs(t), &stat.csv);
                [stat, paired]
            }))
            .chain((!shared_targets).then(|| Col::plain("targets")))
            .collect(),
        rows: Vec::new(),
    };
    let metrics: [(&str, Pick); 4] = [
        ("best_acc", |s| s.best_acc),
        ("final_acc", |s| s.final_acc),
        ("best_loss", |s| s.best_loss),
        ("final_loss", |s| s.final_loss),
    ];
    let metric_kind = Kind::Stat {
        censorable: false,
        single: false,
    };
    let mut bf = Table {
        title: format!(
            "Best and final test accuracy and loss over seeds: mean ± std (median, 95 % CI); paired Wilcoxon signed-rank test and Δ vs {base_name}"
        ),
        file: "best_final.csv",
        columns: [Col::plain("setting"), Col::plain(g.arm)]
            .into_iter()
            .chain(
                metrics.iter().flat_map(|(name, _)| {
                    [Col::new(*name, metric_kind), Col::paired(vs(name), name)]
                }),
            )
            .chain(["final_acc_change_%", "final_loss_change_%"].map(Col::plain))
            .collect(),
        rows: Vec::new(),
    };
    let mut sp = Table {
        title: format!(
            "Rounds to the first target with speedup vs {base_name} (ratio of means, and of medians), and extra cost per round"
        ),
        file: "speedup.csv",
        columns: vec![
            Col::plain("setting"),
            Col::plain(g.arm),
            Col::new(
                "rounds_to_first_target",
                Kind::Stat {
                    censorable: true,
                    single: true,
                },
            ),
            Col::paired(vs("rounds_to_first_target"), "rounds_to_first_target"),
            Col::plain("speedup"),
            Col {
                csv: "speedup_median".into(),
                new: true,
                ..Col::plain("speedup (median)")
            },
            Col::plain("extra_comm_per_round"),
            Col::plain("extra_comp_per_round"),
        ],
        rows: Vec::new(),
    };
    let mut sel = Table {
        title: "Selection counts per client (mean over seeds)".into(),
        file: "selection_stats.csv",
        columns: [
            "setting",
            g.arm,
            "count_variance",
            "min_count",
            "max_count",
            "never_selected",
        ]
        .map(Col::plain)
        .to_vec(),
        rows: Vec::new(),
    };
    for ((_, setting), strategies) in &g.groups {
        let first_target = |runs: &[Run]| {
            runs.iter()
                .map(|r| rounds_obs(r, 0))
                .collect::<Option<Vec<Obs>>>()
                .map(|obs| stats::seed_stats(&obs))
        };
        let base_runs = strategies
            .iter()
            .find(|((_, s), _)| Some(s) == baseline.as_ref())
            .map(|(_, r)| r.as_slice());
        let base_final = base_runs.map(|r| {
            let acc: Vec<f64> = r.iter().map(|x| x.summary.final_acc).collect();
            let loss: Vec<f64> = r.iter().map(|x| x.summary.final_loss).collect();
            (mean_std(&acc).0, mean_std(&loss).0)
        });
        let base_rounds = base_runs.and_then(first_target);
        for ((_, strategy), runs) in strategies {
            let is_base = Some(strategy) == baseline.as_ref();
            let f =
                |g: fn(&Summary) -> f64| runs.iter().map(|r| g(&r.summary)).collect::<Vec<f64>>();
            let mut row = vec![
                V::text(setting),
                V::text(strategy),
                V::Num(runs.len() as f64, 0),
            ];
            for ti in 0..n_targets {
                let get = |r: &Run| rounds_obs(r, ti);
                row.push(stat(runs, get, true, 1));
                row.push(compare(runs, base_runs, is_base, get, Test::Sign, 1));
            }
            if !shared_targets {
                row.push(targets_cell(&runs[0]));
            }
            rtt.rows.push(row);
            let (fa, fl) = (
                mean_std(&f(|s| s.final_acc)).0,
                mean_std(&f(|s| s.final_loss)).0,
            );
            let change =
                |x: f64, b: Option<f64>| b.map_or(V::Na, |b| V::Num(100.0 * (x - b) / b, 2));
            let mut row = vec![V::text(setting), V::text(strategy)];
            for (_, g) in metrics {
                let get = |r: &Run| Some(Obs::Value(g(&r.summary)));
                row.push(stat(runs, get, false, 4));
                row.push(compare(runs, base_runs, is_base, get, Test::Wilcoxon, 4));
            }
            row.push(change(fa, base_final.map(|b| b.0)));
            row.push(change(fl, base_final.map(|b| b.1)));
            bf.rows.push(row);
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
            let first = first_target(runs);
            let mean = |s: &Option<SeedStats>| s.as_ref().and_then(|s| s.mean_std).map(|m| m.0);
            let med = |s: &Option<SeedStats>| match s.as_ref().map(|s| s.median) {
                Some(Median::Value(m)) => Some(m),
                _ => None,
            };
            let ratio = |b: Option<f64>, m: Option<f64>| match (b, m) {
                (Some(b), Some(m)) => V::Times(b / m),
                _ => V::Na,
            };
            let get = |r: &Run| rounds_obs(r, 0);
            sp.rows.push(vec![
                V::text(setting),
                V::text(strategy),
                stat(runs, get, true, 1),
                compare(runs, base_runs, is_base, get, Test::Sign, 1),
                ratio(mean(&base_rounds), mean(&first)),
                ratio(med(&base_rounds), med(&first)),
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
    let fairness = client_accuracy_table(g, &vs);
    let time = time_table(g, &target_titles, &vs);
    let solver = per_method(
        "FedGS solver: rounds proven optimal, mean gap to the upper bound, mean graph distance among the selected",
        "fedgs_solver_summary.csv",
        [
            "rounds proven",
            "rounds",
            "mean gap",
            "mean selected distance",
        ]
        .map(Col::plain)
        .to_vec(),
        g,
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
        vec![Col::new("mean weight sum", Kind::MeanStd)],
        g,
        |runs| {
            let means = runs
                .iter()
                .map(|r| f3ast_weight_mean(&r.dir))
                .collect::<Result<Vec<_>>>()?;
            let means: Vec<f64> = means.into_iter().flatten().collect();
            Ok((!means.is_empty()).then(|| vec![pm(&means, 4)]))
        },
    )?;
    let optional = [
        "time_to_target.csv",
        "fedgs_solver_summary.csv",
        "f3ast_weights_summary.csv",
        "client_accuracy.csv",
    ];
    Ok([rtt, time, bf, sp, sel, fairness, solver, weights]
        .into_iter()
        .filter(|t| !t.rows.is_empty() || !optional.contains(&t.file))
        .collect())
}

/// Virtual time to each target over seeds, in seconds and in hours, with the statistics and
/// the paired sign test of the rounds-to-target table; no rows unless some run kept a clock
/// (`[system]`), and N/A for an arm whose runs did not.
fn time_table(g: &Gathered, target_titles: &[String], vs: &dyn Fn(&str) -> String) -> Table {
    let kind = Kind::Stat {
        censorable: true,
        single: false,
    };
    let col = |title: String, csv: String| Col {
        csv,
        ..Col::new(title, kind)
    };
    let mut table = Table {
        title: format!(
            "Time to target accuracy on the virtual clock over seeds, in seconds and hours: mean ± std (≥ a lower bound when a seed never reached it), median, 95 % CI, seeds reached; paired sign test of the seconds vs {}",
            g.baseline.as_deref().unwrap_or("-")
        ),
        file: "time_to_target.csv",
        columns: ["setting", g.arm, "seeds"]
            .map(Col::plain)
            .into_iter()
            .chain(target_titles.iter().flat_map(|t| {
                let secs = col(format!("{t} (s)"), format!("{t}_s"));
                let paired = Col::paired(vs(&secs.title), &secs.csv);
                [secs, col(format!("{t} (h)"), format!("{t}_h")), paired]
            }))
            .chain((!g.shared_targets).then(|| Col::plain("targets")))
            .collect(),
        rows: Vec::new(),
    };
    let timed = |r: &Run| r.summary.time_to_target_s.is_some() && r.summary.clock_s.is_some();
    if !g
        .groups
        .values()
        .flat_map(|s| s.values())
        .flatten()
        .any(timed)
    {
        return table;
    }
    for ((_, setting), strategies) in &g.groups {
        let base = strategies
            .iter()
            .find(|((_, s), _)| Some(s) == g.baseline.as_ref())
            .map(|(_, r)| r.as_slice());
        for ((_, arm), runs) in strategies {
            let is_base = Some(arm) == g.baseline.as_ref();
            let mut row = vec![V::text(setting), V::text(arm), V::Num(runs.len() as f64, 0)];
            for ti in 0..target_titles.len() {
                let secs = |r: &Run| time_obs(r, ti, 1.0);
                row.push(bounded_stat(runs, secs, true, 1, 0));
                row.push(bounded_stat(runs, |r| time_obs(r, ti, HOUR_S), true, 3, 3));
                row.push(compare(runs, base, is_base, secs, Test::Sign, 1));
            }
            if !g.shared_targets {
                row.push(targets_cell(&runs[0]));
            }
            table.rows.push(row);
        }
    }
    table
}

/// The clients' accuracy spread at each run's last evaluation, over seeds, with the paired
/// comparison against the baseline; a row for each arm whose runs all measured it.
fn client_accuracy_table(g: &Gathered, vs: &dyn Fn(&str) -> String) -> Table {
    let kind = Kind::Stat {
        censorable: false,
        single: false,
    };
    let names = fedsel::output::CLIENT_ACC_COLUMNS;
    let mut table = Table {
        title: format!(
            "Per-client accuracy at the last evaluation, each client on its own held-out data: 10th, 50th and 90th percentile and the mean of the worst 10 % of clients, over seeds (median, 95 % CI); paired Wilcoxon signed-rank test and Δ vs {}",
            g.baseline.as_deref().unwrap_or("-")
        ),
        file: "client_accuracy.csv",
        columns: [Col::plain("setting"), Col::plain(g.arm)]
            .into_iter()
            .chain(
                names
                    .iter()
                    .flat_map(|n| [Col::new(*n, kind), Col::paired(vs(n), n)]),
            )
            .collect(),
        rows: Vec::new(),
    };
    for ((_, setting), strategies) in &g.groups {
        let base = strategies
            .iter()
            .find(|((_, s), _)| Some(s) == g.baseline.as_ref())
            .map(|(_, r)| r.as_slice());
        for ((_, arm), runs) in strategies {
            if runs.iter().any(|r| r.clients.is_none()) {
                continue;
            }
            let mut row = vec![V::text(setting), V::text(arm)];
            for i in 0..names.len() {
                let get = |r: &Run| r.clients.map(|c| Obs::Value(c[i]));
                let is_base = Some(arm) == g.baseline.as_ref();
                row.push(stat(runs, get, false, 4));
                row.push(compare(runs, base, is_base, get, Test::Wilcoxon, 4));
            }
            table.rows.push(row);
        }
    }
    table
}

/// The TensorBoard directory the run in `dir` wrote its event files to: its resolved
/// config's `[output] tensorboard` (a sweep records each cell's own, absolute); `None`
/// when the run asked for none or never started. A path recorded relative is taken as
/// relative to the working directory, as the run took it.
fn tracker_dir(dir: &Path) -> Result<Option<std::path::PathBuf>> {
    let path = dir.join("config.resolved.toml");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(Error::Output {
                path,
                error: source,
            });
        }
    };
    let table: toml::Table = text.parse().map_err(|e| bad(&path, e))?;
    let Some(tb) = table
        .get("output")
        .and_then(|o| o.get("tensorboard"))
        .and_then(toml::Value::as_str)
    else {
        return Ok(None);
    };
    std::path::absolute(tb)
        .map(Some)
        .map_err(|source| Error::Output {
            path,
            error: source,
        })
}

/// The report's section linking each run's TensorBoard directory: a link relative to
/// `out`, the report's directory, where the events lie inside it (so the link survives
/// moving the whole directory), else the absolute path. Empty when no run wrote events.
fn trackers_section(trackers: &[(String, std::path::PathBuf)], out: &Path) -> Result<String> {
    let Some((_, first)) = trackers.first() else {
        return Ok(String::new());
    };
    let out = std::path::absolute(out).map_err(|source| Error::Output {
        path: out.to_path_buf(),
        error: source,
    })?;
    let mut md = String::from("\n## TensorBoard\n\nEach run's event files");
    // A sweep's cells share one parent: TensorBoard shows them side by side from there.
    if let Some(parent) = first.parent()
        && trackers.iter().all(|(_, t)| t.parent() == Some(parent))
    {
        let _ = write!(md, " (`tensorboard --logdir {}`)", parent.display());
    }
    md.push_str(":\n\n");
    for (label, dir) in trackers {
        let shown = match dir.strip_prefix(&out) {
            Ok(rel) => {
                let parts: Vec<String> = rel
                    .components()
                    .map(|c| url_escape(&c.as_os_str().to_string_lossy()))
                    .collect();
                format!("[{}]({})", rel.display(), parts.join("/"))
            }
            Err(_) => format!("`{}`", dir.display()),
        };
        let missing = if dir.is_dir() { "" } else { " (not found)" };
        let _ = writeln!(md, "- `{label}`: {shown}{missing}");
    }
    Ok(md)
}

/// `s` with every byte outside RFC 3986's unreserved characters percent-encoded, so that
/// a path with spaces or parentheses stays one Markdown link target.
fn url_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
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
                clock_s: None,
                time_to_target_s: None,
            },
            counts,
            curve: Vec::new(),
            clients: None,
            timed: None,
            dir: std::path::PathBuf::new(),
        }
    }

    /// A tracker path with a space and parentheses stays one link target; one that is
    /// gone is named as such; without a shared parent there is no `--logdir` to offer.
    #[test]
    fn tracker_links_are_escaped_and_missing_directories_named() {
        let out = tempfile::tempdir().unwrap();
        let there = out.path().join("tb (a)").join("c 1");
        std::fs::create_dir_all(&there).unwrap();
        let gone = out.path().join("tb2").join("c2");
        let md = trackers_section(
            &[("a".into(), there), ("b".into(), gone.clone())],
            out.path(),
        )
        .unwrap();
        assert_eq!(
            md,
            "\n## TensorBoard\n\nEach run's event files:\n\n- `a`: [tb (a)/c 1](tb%20%28a%29/c%201)\n- `b`: [tb2/c2](tb2/c2) (not found)\n"
        );
        assert_eq!(trackers_section(&[], out.path()).unwrap(), "");
    }

    /// Two seeds that favour different client ids have the same profile: one client
    /// always selected, one half the time, one never. Averaging by id would show a flat
    /// 0.5 for all three.
    #[test]
    fn selection_frequencies_are_averaged_by_rank_not_by_id() {
        let runs = [run(vec![10, 0, 5], 10), run(vec![0, 10, 5], 10)];
        assert_eq!(ranked_frequencies(&runs), vec![1.0, 0.5, 0.0]);
    }

    /// A run of `seed` that reached the one target (60 %) at `reached` of its 200 rounds,
    /// with final accuracy `acc`.
    fn seed_run(seed: u64, reached: Option<usize>, acc: f64) -> Run {
        let mut r = run(vec![], 200);
        r.summary.seed = seed;
        r.summary.rounds_to_target = vec![(0.6, reached)];
        r.summary.final_acc = acc;
        r
    }

    fn rounds_cell(reached: &[Option<usize>]) -> String {
        let runs: Vec<Run> = (0..)
            .zip(reached)
            .map(|(s, &r)| seed_run(s, r, 0.0))
            .collect();
        stat(&runs, |r| rounds_obs(r, 0), true, 1).markdown()
    }

    /// A seed that never reaches the target is kept: the mean becomes a lower bound with the
    /// censored seeds at R = 200, the median stays exact while fewer than half are censored,
    /// and the count of seeds that reached is shown.
    #[test]
    fn censored_seeds_are_kept_in_rounds_to_target() {
        let s = Some;
        assert_eq!(
            rounds_cell(&[s(10), s(30), None, s(20), None]),
            "≥ 92.0 (median 30.0, 3/5)"
        );
        assert_eq!(
            rounds_cell(&[s(10), None, None, s(20), None]),
            "≥ 126.0 (median > 200, 2/5)"
        );
        assert_eq!(rounds_cell(&[None, None]), "> 200 (0/2)");
        let all = rounds_cell(&[s(10), s(20), s(30), s(40), s(50)]);
        assert!(
            all.starts_with("30.0 ± 15.8 (median 30.0, CI ") && all.ends_with(", 5/5)"),
            "{all}"
        );
        assert_eq!(rounds_cell(&[s(2)]), "2.0 ± 0.0 (median 2.0, 1/1)");
    }

    /// Seeds pair by seed, not by position. Rounds: seed 1–4 faster or tied, seed 5 censored
    /// against a baseline that reached (above); both censored (seed 3) is a tie: sign test
    /// with 1 above and 3 below, p = 2·5/16. Accuracy: differences 0.125, 0.25, 0.25, all
    /// positive, Wilcoxon p = 2/8, median 0.25.
    #[test]
    fn strategies_are_compared_with_the_baseline_seed_by_seed() {
        let base: Vec<Run> = [(1, Some(20), 0.5), (2, Some(40), 0.25), (3, None, 0.75)]
            .into_iter()
            .chain([(4, Some(30), 0.0), (5, Some(60), 0.0)])
            .map(|(s, r, a)| seed_run(s, r, a))
            .collect();
        let runs: Vec<Run> = [
            (5, None, 0.0),
            (4, Some(20), 0.0),
            (3, None, 1.0),
            (2, Some(30), 0.5),
            (1, Some(10), 0.625),
        ]
        .into_iter()
        .map(|(s, r, a)| seed_run(s, r, a))
        .collect();
        let rounds = |r: &Run| rounds_obs(r, 0);
        let v = compare(&runs, Some(&base), false, rounds, Test::Sign, 1);
        assert_eq!(v.markdown(), "Δ N/A, p = 0.625 (1↑ 3↓ of 5)");
        assert_eq!(
            v.csv(&Col::paired("x", "60%")),
            vec!["5", "1", "3", "", "0.625000"]
        );
        assert_eq!(
            compare(&runs, Some(&base), true, rounds, Test::Sign, 1),
            V::Baseline
        );
        assert_eq!(compare(&runs, None, false, rounds, Test::Sign, 1), V::Na);
        let acc = |r: &Run| Some(Obs::Value(r.summary.final_acc));
        let v = compare(&runs[2..], Some(&base[..3]), false, acc, Test::Wilcoxon, 4);
        assert_eq!(v.markdown(), "Δ +0.2500, p = 0.250 (3↑ 0↓ of 3)");
    }

    /// The old fields keep their place; the median, CI, seeds reached and the paired
    /// comparison come after them, and every field is a number or empty.
    #[test]
    fn new_statistics_columns_come_after_the_old_ones() {
        let runs: Vec<Run> = [Some(10), Some(30), None, Some(20), None]
            .into_iter()
            .zip(1..)
            .map(|(r, s)| seed_run(s, r, 0.0))
            .collect();
        let stat_col = Col::new(
            "60%",
            Kind::Stat {
                censorable: true,
                single: false,
            },
        );
        let t = Table {
            title: String::new(),
            file: "t.csv",
            columns: vec![
                Col::plain("strategy"),
                Col::paired("60% vs a", &stat_col.csv),
                stat_col,
                Col::plain("seeds"),
            ],
            rows: vec![vec![
                V::text("b"),
                compare(
                    &runs,
                    Some(&runs),
                    false,
                    |r| rounds_obs(r, 0),
                    Test::Sign,
                    1,
                ),
                stat(&runs, |r| rounds_obs(r, 0), true, 1),
                V::Num(5.0, 0),
            ]],
        };
        assert_eq!(
            t.csv(),
            vec![
                vec![
                    "strategy",
                    "60%_mean",
                    "60%_std",
                    "seeds",
                    "60%_paired_n",
                    "60%_paired_above",
                    "60%_paired_below",
                    "60%_paired_diff",
                    "60%_p",
                    "60%_median",
                    "60%_ci_lo",
                    "60%_ci_hi",
                    "60%_reached",
                    "60%_mean_lb",
                ],
                vec![
                    "b", "", "", "5", "5", "0", "0", "", "", "30.0", "", "", "3", "92.0"
                ],
            ]
        );
    }

    /// Each of LaTeX's ten special characters is escaped, and the report's signs become
    /// commands.
    #[test]
    fn latex_escapes_every_special_character() {
        assert_eq!(
            latex_escape(r"a_b%c&d#e$f{g}h~i^j\k"),
            r"a\_b\%c\&d\#e\$f\{g\}h\textasciitilde{}i\textasciicircum{}j\textbackslash{}k"
        );
        assert_eq!(
            latex_escape("0.5 ± 0.1, ≥ 3, Δ +1"),
            r"0.5 $\pm$ 0.1, $\geq$ 3, $\Delta$ +1"
        );
    }

    /// Mean ± std columns split into two numeric CSV columns; N/A is an empty field;
    /// a ratio loses its "x".
    #[test]
    fn csv_fields_are_numbers() {
        let t = Table {
            title: String::new(),
            file: "t.csv",
            columns: vec![
                Col::plain("strategy"),
                Col::new("rounds", Kind::MeanStd),
                Col::plain("speedup"),
            ],
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

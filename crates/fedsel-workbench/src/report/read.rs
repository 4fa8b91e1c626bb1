//! What a sweep or a set of run directories left on disk, read into the report's runs:
//! summaries, metrics, selection counts, availability, FedGS's solver and F3AST's weights.
//! It parses files and checks them; it computes no statistic and writes nothing.

use std::fmt::Write as _;

use super::*;

/// The evaluated rounds of a run's `metrics.csv`, and the last per-client accuracy spread
/// in it. Columns are found by name: later releases append columns.
pub(super) fn read_metrics(path: &Path) -> Result<Metrics> {
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
pub(super) const MAX_CLIENTS: usize = 100_000_000;

/// The available clients of the first `max_rounds` rounds of a run, from
/// `availability.csv` as `id_ranges` writes them (and as plain id lists, which older runs
/// hold).
pub(super) fn availability(path: &Path, max_rounds: usize) -> Result<Vec<Vec<usize>>> {
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

pub(super) fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Output {
        path: path.to_path_buf(),
        error: source,
    })?;
    serde_json::from_str(&text).map_err(|e| Error::Output {
        path: path.to_path_buf(),
        error: std::io::Error::other(e),
    })
}

pub(super) fn counts(path: &Path, clients: usize) -> Result<Vec<usize>> {
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

/// FedGS's solver record of a run (`fedgs_solver.csv`): (rounds proven optimal, rounds,
/// summed gap, summed mean selected distance), or `None` for other strategies.
pub(super) fn solver_record(dir: &Path) -> Result<Option<(usize, usize, f64, f64)>> {
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

/// Reads the finished cells of the sweep in `dir`, naming the cells left out.
pub(super) fn gather_sweep(dir: &Path) -> Result<Gathered> {
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
pub(super) fn gather_runs(
    dirs: &[std::path::PathBuf],
    allow_mixed: bool,
) -> crate::error::Result<Gathered> {
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

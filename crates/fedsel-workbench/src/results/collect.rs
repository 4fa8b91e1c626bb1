//! `fedsel results collect`: a sweep's finished cells as per-seed rows of a section, with the
//! command and the commit the runs record. It reads runs and appends rows; it judges nothing.

use super::*;

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
pub(super) struct IndexCell {
    dir: String,
    label: String,
    strategy: String,
    setting: String,
}

#[derive(Deserialize)]
pub(super) struct Index {
    cells: Vec<IndexCell>,
}

/// The commit a run's row records: the one its build wrote into `summary.json`, checked
/// against `given` (the `--commit` flag; either may be an abbreviation of the other), or
/// `given` for a run that records none (written before fedsel recorded it, or built outside
/// git). A planned row refuses a run whose build had uncommitted changes, or that builds of
/// several commits ran (resumed by another): no commit names its code.
pub(super) fn row_commit(
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
pub(super) fn metric_value(
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
pub(super) fn graph_metric(path: &Path, metric: &str) -> Result<f64> {
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

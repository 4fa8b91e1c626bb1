//! The report's tables from the gathered runs: rounds and time to each target, best and
//! final values, speed-ups and the ledger, selection statistics, the clients' accuracy spread.
//! It computes statistics ([`crate::stats`]); what it reads of a run beyond the gathered
//! runs, FedGS's solver and F3AST's weight records, it reads through `read`; it writes no file.

use super::*;

/// A run's rounds to target `ti`: the round it first reached it, or censored at the run's
/// rounds; `None` when the run has no such target.
pub(super) fn rounds_obs(r: &Run, ti: usize) -> Option<Obs> {
    r.summary.rounds_to_target.get(ti).map(|t| {
        t.1.map_or(Obs::Above(r.summary.rounds as f64), |x| {
            Obs::Value(x as f64)
        })
    })
}

/// A run's virtual time to target `ti` in units of `unit` seconds: the clock at the end of
/// the round that first reached it, or censored at the run's final clock; `None` for a run
/// without a clock or without such a target.
pub(super) fn time_obs(r: &Run, ti: usize, unit: f64) -> Option<Obs> {
    let end = r.summary.clock_s?;
    let t = r.summary.time_to_target_s.as_ref()?.get(ti)?;
    Some(t.1.map_or(Obs::Above(end / unit), |x| Obs::Value(x / unit)))
}

/// The statistics over seeds of one metric of the runs; N/A when a run lacks it.
pub(super) fn stat(
    runs: &[Run],
    get: impl Fn(&Run) -> Option<Obs>,
    censorable: bool,
    digits: usize,
) -> V {
    bounded_stat(runs, get, censorable, digits, 0)
}

/// [`stat`] with the censoring bounds shown with `bound_digits` decimals (hours to a target
/// are censored at a fraction of an hour; rounds at a whole number).
pub(super) fn bounded_stat(
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
pub(super) fn compare(
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
pub(super) fn targets_cell(run: &Run) -> V {
    let targets: Vec<String> = run
        .summary
        .rounds_to_target
        .iter()
        .map(|t| pct(t.0))
        .collect();
    V::text(targets.join(" "))
}

pub(super) fn pct(t: f64) -> String {
    format!("{:.0}%", t * 100.0)
}

/// A table of one row per (setting, method) from the method's runs; methods for which
/// `row` gives `None` (runs of another strategy) get no row.
pub(super) fn per_method(
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

/// Every table of a report; the strategy-specific ones only where their strategy ran, the
/// per-client accuracy only where some run measured it.
pub(super) fn tables(g: &Gathered) -> Result<Vec<Table>> {
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
pub(super) fn time_table(
    g: &Gathered,
    target_titles: &[String],
    vs: &dyn Fn(&str) -> String,
) -> Table {
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
pub(super) fn client_accuracy_table(g: &Gathered, vs: &dyn Fn(&str) -> String) -> Table {
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

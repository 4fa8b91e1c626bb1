//! The report's figures: accuracy and loss curves with their bands over seeds, selection
//! frequencies, availability, and accuracy on the virtual clock ([`crate::plot`]).
//! It draws what the gathered runs hold (and the first cell's availability record); it
//! computes no table.

use super::*;

/// Mean and std over runs at each round present in all of them, optionally smoothed.
pub(super) fn band(
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

pub(super) fn slug(s: &str) -> String {
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
pub(super) fn ranked_frequencies(runs: &[Run]) -> Vec<f64> {
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
pub(super) fn figures(
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
pub(super) fn time_clocks(strategies: &ByStrategy) -> Option<Vec<crate::timeline::ArmClocks>> {
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

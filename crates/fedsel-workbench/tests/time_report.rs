//! Time to accuracy in `fedsel report`: hand-made sweep directories whose runs kept a
//! virtual clock give the hand-computed seconds to a target, and runs without a clock give
//! the report they always did.

use std::path::Path;

use fedsel_workbench::report::{self, Format};

/// One hand-made run: its seed, test accuracy and virtual seconds of each round.
struct Run {
    strategy: &'static str,
    seed: u64,
    acc: [f64; 4],
    round_s: [f64; 4],
}

const TARGET: f64 = 0.5;

/// uniform (the baseline) reaches 50 % at 60 s (seed 1, round 3) and 30 s (seed 2, round 2)
/// and never within seed 3's 100 s; oort at 5 s, 20 s and 36 s; md's one seed never, its
/// clock stopping at 80 s.
fn runs() -> Vec<Run> {
    let r = |strategy, seed, acc, round_s| Run {
        strategy,
        seed,
        acc,
        round_s,
    };
    vec![
        r("uniform", 1, [0.2, 0.4, 0.5, 0.6], [10.0, 20.0, 30.0, 40.0]),
        r("uniform", 2, [0.3, 0.5, 0.55, 0.6], [15.0; 4]),
        r("uniform", 3, [0.1, 0.2, 0.3, 0.4], [25.0; 4]),
        r("oort", 1, [0.5, 0.6, 0.6, 0.7], [5.0, 20.0, 20.0, 20.0]),
        r("oort", 2, [0.3, 0.5, 0.6, 0.6], [10.0; 4]),
        r("oort", 3, [0.2, 0.3, 0.5, 0.6], [12.0; 4]),
        r("md", 1, [0.1, 0.2, 0.3, 0.4], [20.0; 4]),
    ]
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A finished sweep directory of [`runs`], with `metrics.csv`'s clock columns and the
/// summary's clock totals when `clock`, as a run under `[system]` writes them.
fn sweep(dir: &Path, clock: bool) {
    let mut cells = Vec::new();
    for run in runs() {
        let name = format!("{}-s{}", run.strategy, run.seed);
        let cell = dir.join("cells").join(&name);
        let mut metrics = String::from("round,test_acc,test_loss,train_loss");
        metrics.push_str(if clock { ",round_s,clock_s\n" } else { "\n" });
        let (mut t, mut reached, mut at) = (0.0, None, None);
        for (i, (a, s)) in run.acc.iter().zip(run.round_s).enumerate() {
            t += s;
            if reached.is_none() && *a >= TARGET {
                (reached, at) = (Some(i + 1), Some(t));
            }
            metrics.push_str(&format!("{i},{a},{},1.0", 2.0 - a));
            metrics.push_str(&if clock {
                format!(",{s},{t}\n")
            } else {
                "\n".into()
            });
        }
        write(&cell.join("metrics.csv"), &metrics);
        write(
            &cell.join("selections.csv"),
            "round,client\n0,0\n1,1\n2,0\n3,2\n",
        );
        write(
            &cell.join("availability.csv"),
            "round,available\n0,0 1 2\n1,0 1 2\n2,0 1 2\n3,0 1 2\n",
        );
        let best = run.acc.iter().cloned().fold(0.0, f64::max);
        let mut summary = serde_json::json!({
            "status": "finished",
            "strategy": run.strategy,
            "seed": run.seed,
            "rounds": 4,
            "final_acc": run.acc[3],
            "final_loss": 2.0 - run.acc[3],
            "best_acc": best,
            "best_loss": 2.0 - best,
            "rounds_to_target": [[TARGET, reached]],
            "cost": {
                "broadcasts": 12, "uploads": 12, "trainings": 12, "extra_trainings": 0,
                "probe_trainings": 0, "train_steps": 120, "evaluations": 0,
                "eval_examples": 0, "scalar_reports": 0, "gradients": 0,
                "gradient_examples": 0, "protocol_messages": 0
            },
        });
        if clock {
            summary["clock_s"] = t.into();
            summary["time_to_target_s"] = serde_json::json!([[TARGET, at]]);
            summary["wasted_trainings"] = 0.into();
        }
        write(&cell.join("summary.json"), &summary.to_string());
        cells.push(serde_json::json!({
            "dir": name, "label": name, "strategy": run.strategy, "seed": run.seed,
            "setting": "all", "targets": [TARGET],
        }));
    }
    let index = serde_json::json!({
        "name": "tta", "baseline": "uniform", "version": fedsel::VERSION, "cells": cells,
    });
    write(&dir.join("sweep.json"), &index.to_string());
}

/// The markdown row of `strategy` in the table whose heading starts with `title`.
fn row<'a>(report: &'a str, title: &str, strategy: &str) -> &'a str {
    let table = &report[report.find(&format!("## {title}")).unwrap()..];
    let start = format!("| all | {strategy} |");
    table.lines().find(|l| l.starts_with(&start)).unwrap()
}

#[test]
fn seconds_to_target_are_the_clock_at_the_round_that_reached_it() {
    let dir = tempfile::tempdir().unwrap();
    sweep(dir.path(), true);
    let text = report::write(dir.path(), None).unwrap();
    // uniform: 60 s and 30 s, seed 3 censored at its 100 s (every bound above the middle
    // value, so the median 60 is exact); the mean with the censored seed at its bound,
    // (60 + 30 + 100) / 3 = 63.3, is a lower bound. Hours: 60 / 3600 = 0.017,
    // 63.33 / 3600 = 0.018.
    let uniform = row(&text, "Time to target", "uniform");
    assert_eq!(
        uniform,
        "| all | uniform | 3 | ≥ 63.3 (median 60.0, 2/3) | ≥ 0.018 (median 0.017, 2/3) | (baseline) |"
    );
    // oort: 5, 20, 36 s, mean 20.33, std √(480.67 / 2) = 15.50. Paired with uniform, every
    // seed is faster (36 s against more than 100 s included): 0↑ 3↓, p = 2/8; the median
    // difference −55 (seed 1) is exact, the censored pair's bound 36 − 100 lying below it.
    let oort = row(&text, "Time to target", "oort");
    assert!(
        oort.starts_with("| all | oort | 3 | 20.3 ± 15.5 (median 20.0, CI "),
        "{oort}"
    );
    assert!(
        oort.contains(", 3/3) | 0.006 ± 0.004 (median 0.006, CI ")
            && oort.ends_with(", 3/3) | Δ -55.0, p = 0.250 (0↑ 3↓ of 3) |"),
        "{oort}"
    );
    // md never reaches 50 %: more than its final clock, 80 s (0.022 h), and so slower
    // than uniform's 60 s on seed 1 (1↑), by an amount censoring leaves unknown.
    assert_eq!(
        row(&text, "Time to target", "md"),
        "| all | md | 1 | > 80 (0/1) | > 0.022 (0/1) | Δ N/A, p = 1.000 (1↑ 0↓ of 1) |"
    );
    // The rounds table is unchanged by the clock: uniform reached at rounds 3 and 2.
    assert!(
        row(&text, "Rounds to target", "uniform").starts_with("| all | uniform | 3 | ≥ 3.0 "),
        "{text}"
    );
    let csv = std::fs::read_to_string(dir.path().join("time_to_target.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next().unwrap(),
        "setting,strategy,seeds,50%_s_mean,50%_s_std,50%_h_mean,50%_h_std,50%_s_median,50%_s_ci_lo,50%_s_ci_hi,50%_s_reached,50%_s_mean_lb,50%_h_median,50%_h_ci_lo,50%_h_ci_hi,50%_h_reached,50%_h_mean_lb,50%_s_paired_n,50%_s_paired_above,50%_s_paired_below,50%_s_paired_diff,50%_s_p"
    );
    assert_eq!(
        lines.next().unwrap(),
        "all,uniform,3,,,,,60.0,,,2,63.3,0.017,,,2,0.018,,,,,"
    );
    let tex = report::report(
        &[dir.path().to_path_buf()],
        None,
        None,
        Format::Latex,
        false,
    )
    .unwrap()
    .1;
    assert!(
        tex.contains("uniform & 3 & $\\geq$ 63.3 (2/3) & $\\geq$ 0.018 (2/3) & (baseline)"),
        "{tex}"
    );
    if fedsel_workbench::plot::ensure_font().is_ok() {
        for ext in ["png", "svg"] {
            let fig = dir.path().join(format!("plots/all-accuracy-time.{ext}"));
            assert!(std::fs::metadata(&fig).unwrap().len() > 0, "{fig:?}");
        }
        assert!(text.contains("![accuracy over virtual time](plots/all-accuracy-time.png)"));
    }
}

/// Runs without a clock: the report, its CSVs and its LaTeX are those of the release
/// before time to accuracy (golden files written by it from the same runs).
#[test]
fn runs_without_a_clock_report_as_before() {
    let dir = tempfile::tempdir().unwrap();
    sweep(dir.path(), false);
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/clockless");
    let md = report::write(dir.path(), None).unwrap();
    // The golden report names no version, so that a release does not outdate it.
    let tables = |s: &str| {
        s[..s.find("\n## Figures").unwrap()]
            .replace(&format!("fedsel {}; ", fedsel::VERSION), "fedsel VERSION; ")
    };
    assert_eq!(
        tables(&md),
        tables(&std::fs::read_to_string(golden.join("report.md")).unwrap())
    );
    assert!(!md.contains("virtual"), "{md}");
    assert!(!dir.path().join("time_to_target.csv").exists());
    assert!(!dir.path().join("plots/all-accuracy-time.png").exists());
    for csv in [
        "rounds_to_target.csv",
        "best_final.csv",
        "speedup.csv",
        "selection_stats.csv",
    ] {
        assert_eq!(
            std::fs::read_to_string(dir.path().join(csv)).unwrap(),
            std::fs::read_to_string(golden.join(csv)).unwrap(),
            "{csv}"
        );
    }
    let tex = report::report(
        &[dir.path().to_path_buf()],
        None,
        None,
        Format::Latex,
        false,
    )
    .unwrap()
    .1;
    assert_eq!(
        tex,
        std::fs::read_to_string(golden.join("report.tex")).unwrap()
    );
}

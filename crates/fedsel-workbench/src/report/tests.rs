//! The report's tests: hand-made runs and sweeps, their tables, figures and files.

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

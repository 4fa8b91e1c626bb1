//! Stale updates (`[system.stale]`, REFL) and buffered asynchronous rounds
//! (`policy = "fedbuff"`) end to end on the synthetic data.

#[allow(dead_code)]
mod common;

use common::{run, synthetic};
use fedsel::config::Config;
use fedsel::engine::{self, RoundRecord};
use fedsel::output::RunWriter;

const FEDBUFF: &str = "system.round={policy=\"fedbuff\", concurrency=8, buffer_size=4}";

/// FedBuff with C = 8, K = 4 on the 30 always-available synthetic clients, under uniform
/// selection and under Oort: round 0 starts C + K − 1 = 11 clients, every later round
/// the one slot its aggregation freed plus K − 1 = 4; every round aggregates K updates,
/// the clock moves forward, and some updates are stale.
#[test]
fn fedbuff_runs_with_any_selector() {
    for strategy in ["uniform", "oort"] {
        let exp = synthetic(&[
            "rounds=12",
            &format!("selection.strategy=\"{strategy}\""),
            "system.kind=\"lognormal\"",
            FEDBUFF,
        ]);
        let rows = run(&exp);
        assert_eq!(rows.len(), 12);
        assert_eq!(rows[0].n_selected, 11, "{strategy}");
        let mut stale = 0;
        let mut last = 0.0;
        for r in &rows {
            if r.round > 0 {
                assert_eq!(r.n_selected, 4, "{strategy} round {}", r.round);
            }
            let c = r.clock.unwrap();
            assert_eq!(c.aggregated, 4, "{strategy} round {}", r.round);
            assert!(c.clock_s >= last && c.round_s >= 0.0);
            last = c.clock_s;
            let (n, mean) = c.stale.unwrap();
            assert!(n <= 4 && (n == 0 || mean >= 1.0));
            stale += n;
        }
        assert!(stale > 0, "{strategy}: no stale update in 12 rounds");
        let acc = rows.last().unwrap().test_acc.unwrap();
        assert!(acc.is_finite() && acc > 0.2, "{strategy}: accuracy {acc}");
        // Same run, same bits.
        let again = run(&exp);
        let strip = |r: &[RoundRecord]| {
            r.iter()
                .map(|x| (x.selected.clone(), x.test_loss.map(f64::to_bits), x.clock))
                .collect::<Vec<_>>()
        };
        assert_eq!(strip(&rows), strip(&again));
    }
}

/// Over-commitment 0.5 (9 selected, 6 kept) with REFL's stale updates: the cut stragglers
/// are folded into later rounds, counted and booked; round 0, which folds nothing, is the
/// round of a run without the option (but for its wasted trainings, booked later).
#[test]
fn stale_updates_fold_into_later_rounds_and_are_booked() {
    let base = [
        "rounds=10",
        "system.kind=\"lognormal\"",
        "system.round={policy=\"overcommit\", overcommit=0.5}",
    ];
    for factor in ["1", "-2", "-4"] {
        let stale = format!("system.stale={{stale_update=-1, stale_factor={factor}}}");
        let exp = synthetic(&[&base[..], &[stale.as_str()]].concat());
        let rows = run(&exp);
        let plain = run(&synthetic(&base));
        assert_eq!(rows[0].test_loss, plain[0].test_loss);
        assert_eq!(rows[0].selected, plain[0].selected);
        assert_eq!(plain[0].cost.wasted_trainings, 3);
        assert_eq!(rows[0].cost.wasted_trainings, 0, "late, not wasted");
        let folded: usize = rows.iter().map(|r| r.clock.unwrap().stale.unwrap().0).sum();
        let booked: u64 = rows.iter().map(|r| r.cost.stale_trainings).sum();
        assert!(folded > 0, "factor {factor}: nothing folded");
        assert_eq!(folded as u64, booked);
        for r in &rows {
            let (n, mean) = r.clock.unwrap().stale.unwrap();
            assert!(n == 0 || mean >= 1.0);
        }
        assert_ne!(
            rows.last().unwrap().test_loss,
            plain.last().unwrap().test_loss,
            "folded updates change the model"
        );
    }
}

/// `metrics.csv` appends the staleness columns only when a run has them.
#[test]
fn staleness_columns_are_appended_only_with_the_options() {
    let exp = synthetic(&["rounds=3", "system.kind=\"lognormal\"", FEDBUFF]);
    let dir = tempfile::tempdir().unwrap();
    let mut w = RunWriter::create(dir.path(), &exp.config).unwrap();
    let summary = engine::run(&exp, &mut w).unwrap();
    w.finish(&summary).unwrap();
    let text = std::fs::read_to_string(dir.path().join("metrics.csv")).unwrap();
    let header: Vec<&str> = text.lines().next().unwrap().split(',').collect();
    assert_eq!(header[header.len() - 3..], fedsel::output::STALE_COLUMNS);
    assert_eq!(
        header[header.len() - 6..header.len() - 3],
        fedsel::output::CLOCK_COLUMNS
    );
    for line in text.lines().skip(1) {
        assert_eq!(line.split(',').count(), header.len());
    }

    let exp = synthetic(&["rounds=2", "system.kind=\"lognormal\""]);
    let dir = tempfile::tempdir().unwrap();
    let mut w = RunWriter::create(dir.path(), &exp.config).unwrap();
    let summary = engine::run(&exp, &mut w).unwrap();
    w.finish(&summary).unwrap();
    let text = std::fs::read_to_string(dir.path().join("metrics.csv")).unwrap();
    assert!(!text.contains("stale"));
}

/// The options' config errors name their keys.
#[test]
fn stale_and_fedbuff_config_errors_name_their_keys() {
    let err = |set: &[&str]| {
        let set: Vec<String> = set.iter().map(|s| s.to_string()).collect();
        Config::load(None, &set)
            .and_then(|c| c.validate().map(|_| c))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    let e = err(&["system.kind=\"lognormal\"", "system.stale={stale_update=1}"]);
    assert!(e.contains("system.stale"), "{e}");
    let e = err(&[
        "system.kind=\"lognormal\"",
        "system.round={policy=\"deadline\", deadline_s=3.0}",
        "system.stale={stale_factor=0.5}",
    ]);
    assert!(e.contains("system.stale.stale_factor"), "{e}");
    let e = err(&[
        "system.kind=\"lognormal\"",
        "system.round={policy=\"fedbuff\", concurrency=2, buffer_size=3}",
    ]);
    assert!(e.contains("system.round.concurrency"), "{e}");
}

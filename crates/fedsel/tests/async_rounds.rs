//! Stale updates (`[system.stale]`, REFL) and buffered asynchronous rounds
//! (`policy = "fedbuff"`) end to end on the synthetic data.

#[allow(dead_code)]
mod common;

use common::{Resumed, run, synthetic};
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
    // FedBuff's sizes have no default: the error names the key and says what to give.
    let e = err(&[
        "system.kind=\"lognormal\"",
        "system.round={policy=\"fedbuff\", buffer_size=3}",
    ]);
    assert!(
        e.contains("system.round.concurrency") && e.contains("concurrency = 20"),
        "{e}"
    );
    // A buffer that covers the federation (30 clients) is said to make the run synchronous.
    let config = Config::load(
        None,
        &[
            "system.kind=\"lognormal\"".into(),
            "system.round={policy=\"fedbuff\", concurrency=40, buffer_size=30}".into(),
        ],
    )
    .unwrap();
    let warnings: Vec<String> = config.warnings(30).iter().map(|w| w.to_string()).collect();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("system.round.buffer_size") && w.contains("synchronous")),
        "{warnings:?}"
    );
    let config = Config::load(
        None,
        &[
            "system.kind=\"lognormal\"".into(),
            "system.round={policy=\"fedbuff\", concurrency=8, buffer_size=4}".into(),
        ],
    )
    .unwrap();
    assert!(config.warnings(30).is_empty());
}

/// Every asynchronous policy resumes exactly: FedBuff, REFL's stale updates with no limit
/// under a deadline and with a finite bound under over-commitment, and the selectors that
/// give orders or a sample pass (PyramidFL, FedBalancer), each killed just before a
/// checkpoint (after round 9, resumed from round 5) and mid-interval (after round 13,
/// resumed from round 10): `metrics.csv` but for wall time, `selections.csv` and the
/// summary equal an uninterrupted run's, and the checkpoint carries what was in flight.
#[test]
fn asynchronous_runs_killed_anywhere_resume_exactly() {
    let lognormal = "system.kind=\"lognormal\"";
    let cases: [(&str, Vec<&str>, bool); 5] = [
        ("fedbuff", vec![FEDBUFF], true),
        (
            "refl stale -1, deadline",
            vec![
                "selection.strategy=\"refl\"",
                "system.round={policy=\"deadline\", deadline_s=1.5}",
                "system.stale={stale_update=-1}",
            ],
            true,
        ),
        (
            "stale 2, overcommit",
            vec![
                "system.round={policy=\"overcommit\", overcommit=0.5}",
                "system.stale={stale_update=2, stale_factor=-4}",
            ],
            true,
        ),
        (
            "pyramidfl",
            vec![
                "selection.strategy=\"pyramidfl\"",
                "system.round.policy=\"overcommit\"",
                "selection.pyramidfl.overcommit=1.0",
            ],
            false,
        ),
        (
            "fedbalancer",
            vec![
                "selection.strategy=\"fedbalancer\"",
                "system.round={policy=\"deadline\", deadline_s=3.0}",
            ],
            false,
        ),
    ];
    for (what, set, in_flight) in cases {
        let exp = synthetic(&[&["rounds=20", "checkpoint_every=5", lognormal][..], &set].concat());
        for (crash, next) in [(9, 5), (13, 10)] {
            let r = Resumed::run(&exp, crash, next);
            r.assert_same(&format!("{what}, killed after round {crash}"));
            assert_eq!(r.resumed.cost, r.full.cost, "{what}");
            assert_eq!(r.resumed.clock, r.full.clock, "{what}");
            assert_eq!(r.resumed.final_loss, r.full.final_loss, "{what}");
            assert_eq!(
                !r.checkpoint.in_flight.is_empty(),
                in_flight,
                "{what}: the checkpoint's book"
            );
        }
    }
}

/// A round that trains nobody still takes time: FedCS under a deadline no client meets
/// picks nobody, and each such round lasts the deadline; under wait-all it lasts
/// `system.idle_s`; and FedBuff with nobody in flight waits the same. Every such round is
/// counted in `rounds_without_updates`.
#[test]
fn rounds_that_train_nobody_move_the_clock_and_are_counted() {
    let cases = [
        (
            vec!["system.round={policy=\"deadline\", deadline_s=0.001}"],
            0.001,
        ),
        (
            vec![
                "system.round.policy=\"wait_all\"",
                "selection.fedcs.deadline_s=0.001",
                "system.idle_s=2.5",
            ],
            2.5,
        ),
    ];
    for (set, wait) in cases {
        let exp = synthetic(
            &[
                &[
                    "rounds=14",
                    "selection.strategy=\"fedcs\"",
                    "system.kind=\"lognormal\"",
                ][..],
                &set,
            ]
            .concat(),
        );
        let mut c = common::Collect::default();
        let summary = engine::run(&exp, &mut c).unwrap();
        let mut last = 0.0;
        let (mut empty, mut without) = (0, 0);
        for r in &c.0 {
            let clock = r.clock.unwrap();
            if r.n_selected == 0 {
                empty += 1;
                assert!((clock.round_s - wait).abs() < 1e-12, "{set:?}: {clock:?}");
            }
            without += usize::from(clock.aggregated == 0);
            assert!(clock.clock_s > last, "{set:?}: the clock stalled");
            last = clock.clock_s;
        }
        assert!(empty >= 6, "{set:?}: {empty} rounds picked nobody");
        assert_eq!(summary.clock.unwrap().rounds_without_updates, without);
    }
}

/// Under `stale_update = -1` with a deadline no update meets, no update is ever folded: a
/// client's new task replaces its late one (wasted then), the updates still late at the
/// end are wasted then, so every training is wasted, as without stale updates; and the
/// book never holds more than one late update per client.
#[test]
fn unlimited_staleness_wastes_every_unused_training_and_holds_one_update_per_client() {
    let base = [
        "rounds=40",
        "checkpoint_every=7",
        "system.kind=\"lognormal\"",
        "system.round={policy=\"deadline\", deadline_s=0.001}",
    ];
    let stale = synthetic(&[&base[..], &["system.stale={stale_update=-1}"]].concat());
    let plain = synthetic(&base);
    let (mut s, mut p) = (common::Collect::default(), common::Collect::default());
    let ss = engine::run(&stale, &mut s).unwrap();
    let ps = engine::run(&plain, &mut p).unwrap();
    let trained = ps.cost.trainings;
    assert_eq!(ps.cost.wasted_trainings, trained);
    assert_eq!(ss.cost.wasted_trainings, trained, "every training wasted");
    assert_eq!(ss.cost.stale_trainings, 0);
    assert_eq!(ss.clock.unwrap().wasted_trainings, trained);
    // The checkpoints' books: at most one late update per client.
    let dir = tempfile::tempdir().unwrap();
    let mut w = RunWriter::create(dir.path(), &stale.config).unwrap();
    engine::run(&stale, &mut w).unwrap();
    let cp = fedsel::checkpoint::load(dir.path()).unwrap();
    let mut clients: Vec<usize> = cp.in_flight.late.iter().map(|u| u.client).collect();
    let n = clients.len();
    clients.sort_unstable();
    clients.dedup();
    assert!(n > 0 && clients.len() == n, "{n} late updates");
}

/// The trackers see every `metrics.csv` column, the staleness ones included, in the file's
/// order.
#[test]
fn trackers_get_every_metrics_column_of_an_asynchronous_run() {
    let exp = synthetic(&["rounds=3", "system.kind=\"lognormal\"", FEDBUFF]);
    let dir = tempfile::tempdir().unwrap();
    let mut w = RunWriter::create(dir.path(), &exp.config).unwrap();
    engine::run(&exp, &mut w).unwrap();
    let text = std::fs::read_to_string(dir.path().join("metrics.csv")).unwrap();
    let header: Vec<&str> = text.lines().next().unwrap().split(',').collect();
    for r in run(&exp) {
        let names: Vec<&str> = fedsel::output::metric_values(&r)
            .iter()
            .map(|(n, _)| *n)
            .collect();
        assert_eq!(names, header, "round {}", r.round);
    }
}

//! REFL and FedBalancer end to end on the synthetic data, under every round policy, and
//! FedBalancer's client-side sample-selection pass on the ledger and the clock.

#[allow(dead_code)]
mod common;

use common::{run, synthetic};
use fedsel::engine::RoundRecord;

/// Every round policy of `system.round` (and no clock at all), with REFL's own stale
/// updates beside over-commitment.
const POLICIES: [&[&str]; 6] = [
    &[],
    &["system.kind=\"lognormal\""],
    &[
        "system.kind=\"lognormal\"",
        "system.round={policy=\"overcommit\", overcommit=0.3}",
    ],
    &[
        "system.kind=\"lognormal\"",
        "system.round={policy=\"overcommit\", overcommit=0.5}",
        "system.stale={stale_update=-1, stale_factor=-4}",
    ],
    &[
        "system.kind=\"lognormal\"",
        "system.round={policy=\"deadline\", deadline_s=3.0}",
    ],
    &[
        "system.kind=\"lognormal\"",
        "system.round={policy=\"fedbuff\", concurrency=8, buffer_size=4}",
    ],
];

/// Both strategies run 6 rounds under each policy with clients that come and go: only
/// available clients are selected, the model stays finite, FedBalancer books one forward
/// pass per training example of every client it trains, and a second run repeats the
/// first bit for bit.
#[test]
fn refl_and_fedbalancer_run_under_every_round_policy() {
    for strategy in ["refl", "fedbalancer"] {
        for policy in POLICIES {
            let strategy_key = format!("selection.strategy=\"{strategy}\"");
            let mut set = vec![
                "rounds=6",
                "availability={ kind = \"smartphones\", sigma = 0.25 }",
                strategy_key.as_str(),
            ];
            set.extend_from_slice(policy);
            let exp = synthetic(&set);
            let rows = run(&exp);
            assert_eq!(rows.len(), 6, "{strategy} {policy:?}");
            let sizes = exp.sizes();
            for r in &rows {
                let what = format!("{strategy} {policy:?} round {}", r.round);
                assert!(r.selected.iter().all(|k| r.available.contains(k)), "{what}");
                assert!(r.train_loss.is_finite(), "{what}");
                let mut distinct = r.selected.clone();
                distinct.sort_unstable();
                distinct.dedup();
                let examples: u64 = distinct.iter().map(|&k| sizes[k] as u64).sum();
                let want = if strategy == "fedbalancer" {
                    examples
                } else {
                    0
                };
                assert_eq!(r.cost.sample_examples, want, "{what}");
            }
            let last = rows.last().unwrap();
            assert!(last.test_loss.unwrap().is_finite());
            let strip = |r: &[RoundRecord]| {
                r.iter()
                    .map(|x| (x.selected.clone(), x.test_loss.map(f64::to_bits), x.clock))
                    .collect::<Vec<_>>()
            };
            assert_eq!(strip(&rows), strip(&run(&exp)), "{strategy} {policy:?}");
        }
    }
}

/// FedBalancer's first round is Oort's (the same draws pick the same clients) and trains
/// every client on all its data (the threshold starts at 0), so its model is Oort's to the
/// bit; only its sample-selection pass is added: the forward passes and 10 reported
/// scalars per client in the ledger, and the pass before each training on the clock, so
/// the round lasts longer.
#[test]
fn the_sample_pass_is_booked_and_timed_and_changes_nothing_else_in_round_0() {
    let make = |strategy: &str| {
        synthetic(&[
            "rounds=1",
            &format!("selection.strategy=\"{strategy}\""),
            "system.kind=\"lognormal\"",
        ])
    };
    let (oort, balancer) = (run(&make("oort")), run(&make("fedbalancer")));
    let (o, b) = (&oort[0], &balancer[0]);
    assert_eq!(o.selected, b.selected);
    assert_eq!(o.test_loss.map(f64::to_bits), b.test_loss.map(f64::to_bits));
    let sizes = make("oort").sizes();
    let examples: u64 = b.selected.iter().map(|&k| sizes[k] as u64).sum();
    assert_eq!(b.cost.sample_examples, examples);
    assert_eq!(o.cost.sample_examples, 0);
    assert_eq!(b.cost.scalar_reports, 10 * b.selected.len() as u64);
    assert_eq!(b.cost.trainings, o.cost.trainings);
    assert_eq!(b.cost.train_steps, o.cost.train_steps);
    let (oc, bc) = (o.clock.unwrap(), b.clock.unwrap());
    assert!(bc.round_s > oc.round_s, "{} vs {}", bc.round_s, oc.round_s);
}

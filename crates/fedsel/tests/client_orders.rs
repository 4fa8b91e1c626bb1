//! Per-client orders ([`ClientOrder`]: local work and upload dropout) end to end on the
//! synthetic data, and PyramidFL, which gives them, under every round policy.

#[allow(dead_code)]
mod common;

use std::sync::{Arc, Mutex};

use common::{Collect, run, synthetic};
use fedsel::config::Config;
use fedsel::engine::{self, Experiment, RoundRecord};
use fedsel::error::Error;
use fedsel::rng::Rng;
use fedsel::select::{
    ClientOrder, ClientQuery, Feedback, Needs, Planned, RoundContext, Selection, Selector,
    UpdateKind, UploadDropout,
};

/// One fixed client a round, 0, 1, 2, ..., each with `order` (or none), recording the
/// updates the server received.
struct Fixed {
    order: Option<ClientOrder>,
    seen: Arc<Mutex<Vec<Vec<f32>>>>,
}

impl Selector for Fixed {
    fn name(&self) -> &'static str {
        "fixed"
    }
    fn needs(&self) -> Needs {
        Needs {
            updates: UpdateKind::Full,
            ..Needs::default()
        }
    }
    fn select(
        &mut self,
        ctx: &RoundContext<'_>,
        _: &mut dyn ClientQuery,
        _: &mut Rng,
    ) -> Result<Selection, Error> {
        Ok(Selection {
            clients: vec![ctx.round % 30],
            weights: None,
        })
    }
    fn plan(
        &mut self,
        ctx: &RoundContext<'_>,
        query: &mut dyn ClientQuery,
        rng: &mut Rng,
    ) -> Result<Planned, Error> {
        Ok(Planned {
            selection: self.select(ctx, query, rng)?,
            orders: self.order.map(|o| vec![o]),
        })
    }
    fn observe(&mut self, f: &Feedback<'_>) {
        let mut seen = self.seen.lock().unwrap();
        seen.extend(f.updates.unwrap().iter().cloned());
    }
}

/// Runs `exp` with [`Fixed`] under `order`: the records and the updates received.
fn fixed(exp: &Experiment, order: Option<ClientOrder>) -> (Vec<RoundRecord>, Vec<Vec<f32>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = Fixed {
        order,
        seen: seen.clone(),
    };
    let mut c = Collect::default();
    engine::run_with(exp, Box::new(s), &mut c, None).unwrap();
    let seen = seen.lock().unwrap().clone();
    (c.0, seen)
}

/// Fixed bandwidth, so that a whole transfer takes P·32/1024 / 10,000 s.
const CLOCK: [&str; 3] = [
    "rounds=3",
    "system.kind=\"lognormal\"",
    "system.bandwidth_skew=0.0",
];

/// Orders of the run's own work and a whole upload change nothing: the same bits as no
/// orders.
#[test]
fn full_orders_are_the_run_without_orders() {
    let exp = synthetic(&CLOCK);
    let (plain, u) = fixed(&exp, None);
    let (ordered, v) = fixed(&exp, Some(ClientOrder::FULL));
    let timeless = |rows: Vec<RoundRecord>| {
        rows.into_iter()
            .map(|r| RoundRecord {
                elapsed_s: 0.0,
                ..r
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(timeless(plain), timeless(ordered));
    assert_eq!(u, v);
}

/// Client 0 of round 0, ordered twice its work (one epoch of E steps → 2E steps): the
/// ledger books 2E steps, and the round, download + compute + upload, gains exactly the
/// compute of the first: (2T + 2C) − (2T + C) = C = round_s − 2T.
#[test]
fn more_local_work_is_trained_booked_and_timed() {
    let exp = synthetic(&CLOCK);
    let transfer = exp.layout.total as f64 * 32.0 / 1024.0 / 10_000.0;
    let (plain, _) = fixed(&exp, None);
    let twice = ClientOrder {
        work: 2.0,
        dropout: None,
    };
    let (more, _) = fixed(&exp, Some(twice));
    let e = plain[0].cost.train_steps;
    assert_eq!(more[0].cost.train_steps, 2 * e);
    let (a, b) = (
        plain[0].clock.unwrap().round_s,
        more[0].clock.unwrap().round_s,
    );
    let compute = a - 2.0 * transfer;
    assert!(compute > 0.0);
    assert!(((b - a) - compute).abs() < 1e-9 * b, "{a} {b} {compute}");
    // Half its work: ⌊E/2⌋ steps.
    let half = ClientOrder {
        work: 0.5,
        dropout: None,
    };
    let (less, _) = fixed(&exp, Some(half));
    assert_eq!(less[0].cost.train_steps, e / 2);
}

/// Dropping the 40 % smallest changes: the server receives the update with exactly those
/// ⌊0.4·P⌋ coordinates at 0 (the others as trained), the ledger books them, and the upload
/// takes 1 − ⌊0.4·P⌋/P of its time.
#[test]
fn smallest_change_dropout_sends_the_largest_and_shortens_the_upload() {
    let exp = synthetic(&CLOCK);
    let p = exp.layout.total;
    let transfer = p as f64 * 32.0 / 1024.0 / 10_000.0;
    let (plain, whole) = fixed(&exp, None);
    let order = ClientOrder {
        work: 1.0,
        dropout: Some(UploadDropout::Smallest(0.4)),
    };
    let (dropped, sent) = fixed(&exp, Some(order));
    let n = (0.4 * p as f64).floor() as usize;
    // Round 0 trains the same model from the same start: the rule, by hand.
    let mut by_change: Vec<usize> = (0..p).collect();
    by_change.sort_by(|&a, &b| {
        whole[0][a]
            .abs()
            .total_cmp(&whole[0][b].abs())
            .then(a.cmp(&b))
    });
    let mut want = whole[0].clone();
    for &i in &by_change[..n] {
        want[i] = 0.0;
    }
    assert_eq!(sent[0], want);
    assert!(dropped.iter().all(|r| r.cost.dropped_params == n as u64));
    assert!(plain.iter().all(|r| r.cost.dropped_params == 0));
    let (a, b) = (
        plain[0].clock.unwrap().round_s,
        dropped[0].clock.unwrap().round_s,
    );
    let saved = n as f64 / p as f64 * transfer;
    assert!(((a - b) - saved).abs() < 1e-9 * a, "{a} {b} {saved}");
}

/// Dropping whole layers: each of the model's tensors is sent whole or not at all.
#[test]
fn layer_dropout_sends_whole_tensors() {
    let exp = synthetic(&["rounds=6", "system.kind=\"lognormal\""]);
    let order = ClientOrder {
        work: 1.0,
        dropout: Some(UploadDropout::Layers(0.5)),
    };
    let (rows, sent) = fixed(&exp, Some(order));
    let layout = &exp.layout;
    let mut dropped_tensors = 0;
    for (r, u) in rows.iter().zip(&sent) {
        let mut zeros = 0;
        for i in 0..layout.specs.len() {
            let part = &u[layout.range(i)];
            if part.iter().all(|&x| x == 0.0) {
                zeros += part.len();
                dropped_tensors += 1;
            }
        }
        assert_eq!(r.cost.dropped_params, zeros as u64, "round {}", r.round);
    }
    assert!(dropped_tensors > 0 && dropped_tensors < 6 * layout.specs.len());
}

/// A selector's bad orders are refused with the selector named.
#[test]
fn bad_orders_are_refused() {
    let exp = synthetic(&CLOCK);
    for order in [
        ClientOrder {
            work: 0.0,
            dropout: None,
        },
        ClientOrder {
            work: 1.0,
            dropout: Some(UploadDropout::Smallest(1.0)),
        },
    ] {
        let s = Fixed {
            order: Some(order),
            seen: Arc::default(),
        };
        let e = engine::run_with(&exp, Box::new(s), &mut Collect::default(), None).unwrap_err();
        assert!(
            matches!(&e, Error::Selection { selector, .. } if selector == "fixed"),
            "{e}"
        );
    }
}

/// PyramidFL under every round policy (and with stale updates): each round selects and
/// aggregates, the clock moves, fast clients train more steps than their own work, uploads
/// are cut, and the run repeats bit for bit.
#[test]
fn pyramidfl_runs_under_every_round_policy() {
    let base = [
        "rounds=8",
        "selection.strategy=\"pyramidfl\"",
        "selection.clients_per_round=5",
        "system.kind=\"lognormal\"",
    ];
    let wait = run(&synthetic(&base));
    // Round 0's round trip: PyramidFL fills it with its fast clients' extra steps.
    let deadline = wait[0].clock.unwrap().round_s;
    let policies = [
        "system.round={policy=\"wait_all\"}".to_string(),
        "system.round={policy=\"overcommit\", overcommit=0.3}".into(),
        format!("system.round={{policy=\"deadline\", deadline_s={deadline}}}"),
        "system.round={policy=\"fedbuff\", concurrency=8, buffer_size=4}".into(),
        "system.round={policy=\"overcommit\", overcommit=0.3}\nsystem.stale={stale_update=-1}"
            .into(),
    ];
    for policy in &policies {
        let mut set: Vec<&str> = base.to_vec();
        let parts: Vec<&str> = policy.split('\n').collect();
        set.extend(parts);
        // The engine's over-commitment replaces PyramidFL's own (both are refused).
        if policy.contains("overcommit") {
            set.push("selection.pyramidfl.overcommit=1.0");
        }
        let exp = synthetic(&set);
        let rows = run(&exp);
        set.push("selection.pyramidfl.enable_adapt_local_epoch=false");
        let own = run(&synthetic(&set));
        assert_eq!(rows.len(), 8, "{policy}");
        let mut last = 0.0;
        for r in &rows {
            let c = r.clock.unwrap();
            assert!(
                r.n_selected > 0 && c.clock_s > last,
                "{policy} round {}",
                r.round
            );
            last = c.clock_s;
        }
        assert!(
            rows.iter().any(|r| r.clock.unwrap().aggregated > 0),
            "{policy}"
        );
        // Round 0 selects the same clients with or without the step multiplier, and the
        // fast ones train more than their own work.
        assert_eq!(rows[0].selected, own[0].selected, "{policy}");
        assert!(
            rows[0].cost.train_steps > own[0].cost.train_steps,
            "{policy}: {} steps against {}",
            rows[0].cost.train_steps,
            own[0].cost.train_steps
        );
        assert!(rows.iter().any(|r| r.cost.dropped_params > 0), "{policy}");
        let acc = rows.last().unwrap().test_acc.unwrap();
        assert!(acc.is_finite(), "{policy}");
        let again = run(&exp);
        let strip = |r: &[RoundRecord]| {
            r.iter()
                .map(|x| (x.selected.clone(), x.test_loss.map(f64::to_bits), x.clock))
                .collect::<Vec<_>>()
        };
        assert_eq!(strip(&rows), strip(&again), "{policy}");
    }
}

/// PyramidFL under the engine's over-commitment, with its own on too, is a config error
/// naming the key; with its own off (`overcommit = 1`) it is run.
#[test]
fn pyramidfl_is_not_over_committed_twice() {
    let load = |extra: &[&str]| {
        let mut set: Vec<String> = [
            "selection.strategy=\"pyramidfl\"",
            "system.kind=\"lognormal\"",
            "system.round.policy=\"overcommit\"",
        ]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect();
        set.dedup();
        Config::load(None, &set).and_then(|c| c.validate().map(|_| c))
    };
    let e = load(&[]).unwrap_err().to_string();
    assert!(
        e.contains("system.round.overcommit") && e.contains("selection.pyramidfl.overcommit"),
        "{e}"
    );
    assert!(load(&["selection.pyramidfl.overcommit=1.0"]).is_ok());
}

/// PyramidFL without a clock is a config error naming the key.
#[test]
fn pyramidfl_needs_a_clock() {
    let e = Config::load(None, &["selection.strategy=\"pyramidfl\"".into()])
        .and_then(|c| c.validate().map(|_| c))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("selection.strategy") && e.contains("[system]"),
        "{e}"
    );
}

/// Keeps the rounds and the first checkpoint.
#[derive(Default)]
struct Keep {
    rows: Vec<RoundRecord>,
    checkpoint: Option<fedsel::checkpoint::Checkpoint>,
}

impl engine::Observer for Keep {
    fn on_round(&mut self, r: &RoundRecord) -> fedsel::error::Result<()> {
        self.rows.push(r.clone());
        Ok(())
    }
    fn on_checkpoint(&mut self, c: &fedsel::checkpoint::Checkpoint) -> fedsel::error::Result<()> {
        self.checkpoint.get_or_insert_with(|| c.clone());
        Ok(())
    }
}

/// PyramidFL's state (Oort's, its gradient utilities, the samples it ordered) is
/// checkpointed: a run resumed from round 4 repeats the rounds after it bit for bit.
#[test]
fn pyramidfl_resumes_exactly() {
    let exp = synthetic(&[
        "rounds=8",
        "checkpoint_every=4",
        "selection.strategy=\"pyramidfl\"",
        "selection.clients_per_round=5",
        "system.kind=\"lognormal\"",
    ]);
    let mut whole = Keep::default();
    engine::run(&exp, &mut whole).unwrap();
    let cp = whole.checkpoint.unwrap();
    assert_eq!(cp.next_round, 4);
    let mut resumed = Keep::default();
    engine::resume(&exp, &mut resumed, cp).unwrap();
    let strip = |r: &[RoundRecord]| {
        r.iter()
            .map(|x| {
                (
                    x.selected.clone(),
                    x.test_loss.map(f64::to_bits),
                    x.clock,
                    x.cost,
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(strip(&whole.rows[4..]), strip(&resumed.rows));
}

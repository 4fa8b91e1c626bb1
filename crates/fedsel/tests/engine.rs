//! End-to-end properties of the round loop.

#[allow(dead_code)]
mod common;

use std::sync::mpsc;
use std::time::Duration;

use common::{Collect, Resumed};
use fedsel::config::Config;
use fedsel::data::{self, locate};
use fedsel::engine::{self, ClientAccuracy, Experiment, RoundRecord};
use fedsel::error::Error;
use fedsel::ledger::Ledger;
use fedsel::output::RunWriter;
use fedsel::rng::Rng;
use fedsel::select::{
    ClientQuery, Feedback, GradientScope, Needs, RoundContext, Selection, Selector, Setup,
    UpdateKind,
};

fn synthetic(overrides: &[&str]) -> Experiment {
    let set: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    let config = Config::load(None, &set).unwrap();
    let dir = locate::data_dir(None, None);
    Experiment::prepare(config, &dir).unwrap()
}

fn run_in_pool(threads: usize, exp: &Experiment) -> Vec<RoundRecord> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| {
        let mut c = Collect::default();
        engine::run(exp, &mut c).unwrap();
        c.0
    })
}

/// Everything but timing must be bit-identical.
fn strip_time(mut rows: Vec<RoundRecord>) -> Vec<RoundRecord> {
    rows.iter_mut().for_each(|r| r.elapsed_s = 0.0);
    rows
}

#[test]
fn default_experiment_converges_on_synthetic() {
    let exp = synthetic(&[]);
    assert_eq!(exp.clients.len(), 30);
    let rows = run_in_pool(2, &exp);
    assert_eq!(rows.len(), 200);
    let first = rows[0].test_acc.unwrap();
    let last = rows.last().unwrap().test_acc.unwrap();
    assert!(
        last > 0.7 && last > first + 0.3,
        "accuracy {first} -> {last}"
    );
    assert!(rows.last().unwrap().test_loss.unwrap() < rows[0].test_loss.unwrap());
    assert!(
        rows.iter()
            .all(|r| r.n_selected == 6 && r.n_available == 30)
    );
}

/// numpy's `percentile` (linear interpolation) and the mean of the ⌈n/10⌉ lowest, by hand:
/// sorted 0.1 0.3 0.5 0.7 0.9 put p10 at position 0.4 (0.1 + 0.4·0.2 = 0.18) and p90 at 3.6
/// (0.7 + 0.6·0.2 = 0.82); 11 clients make the worst 10 % two of them.
#[test]
fn client_accuracy_percentiles_are_numpys_and_the_worst_tenth_rounds_up() {
    let a = ClientAccuracy::of(&[0.5, 0.1, 0.9, 0.3, 0.7]).unwrap();
    let close = |x: f64, y: f64| (x - y).abs() < 1e-12;
    assert!(
        close(a.p10, 0.18) && close(a.p50, 0.5) && close(a.p90, 0.82),
        "{a:?}"
    );
    assert_eq!(a.worst10, 0.1);
    let eleven: Vec<f64> = (0..11).rev().map(|i| i as f64 / 10.0).collect();
    let b = ClientAccuracy::of(&eleven).unwrap();
    assert!(
        close(b.worst10, 0.05) && close(b.p10, 0.1) && close(b.p90, 0.9),
        "{b:?}"
    );
    let one = ClientAccuracy::of(&[0.25]).unwrap();
    assert_eq!(
        (one.p10, one.p50, one.p90, one.worst10),
        (0.25, 0.25, 0.25, 0.25)
    );
    assert_eq!(ClientAccuracy::of(&[]), None);
}

/// Per-client accuracies come on exactly the rounds the test set is evaluated, are
/// fractions of each client's held-out examples, and are ordered p10 ≤ p50 ≤ p90 with the
/// worst tenth below p10; they book no cost. Without held-out data there are none.
#[test]
fn client_accuracy_is_measured_on_evaluation_rounds_only() {
    let exp = synthetic(&["rounds=7", "eval.every=3", "eval.per_client_every=1"]);
    let rows = run_in_pool(2, &exp);
    let measured: Vec<usize> = rows
        .iter()
        .filter(|r| r.client_acc.is_some())
        .map(|r| r.round)
        .collect();
    assert_eq!(measured, [2, 5, 6]);
    assert!(
        rows.iter()
            .all(|r| r.client_acc.is_some() == r.test_acc.is_some())
    );
    for c in rows.iter().filter_map(|r| r.client_acc) {
        assert!(0.0 <= c.worst10 && c.worst10 <= c.p10, "{c:?}");
        assert!(c.p10 <= c.p50 && c.p50 <= c.p90 && c.p90 <= 1.0, "{c:?}");
    }
    let params = exp.layout.init(1);
    let acc = exp.client_accuracies(&params);
    let holding: Vec<_> = exp
        .clients
        .iter()
        .filter(|c| !c.holdout.is_empty())
        .collect();
    assert!(
        holding.len() > 20,
        "{} of 30 clients hold data out",
        holding.len()
    );
    assert_eq!(acc.len(), holding.len());
    for (a, c) in acc.iter().zip(holding) {
        let correct = a * c.holdout.len() as f64;
        assert!(
            (correct - correct.round()).abs() < 1e-9,
            "{a} of {}",
            c.holdout.len()
        );
    }
    let cost: u64 = rows.iter().map(|r| r.cost.evaluations).sum();
    assert_eq!(
        cost, 0,
        "uniform asks for no evaluation, and the measurement books none"
    );
    let none = synthetic(&["rounds=2", "partition.holdout_fraction=0.0"]);
    assert!(none.client_accuracies(&params).is_empty());
    assert!(run_in_pool(2, &none).iter().all(|r| r.client_acc.is_none()));
    // Switched off: no measurement, and every other value of every round as it was.
    let off = synthetic(&[
        "rounds=7",
        "eval.every=3",
        "eval.per_client_every=1",
        "eval.per_client=false",
    ]);
    let without = run_in_pool(2, &off);
    assert!(without.iter().all(|r| r.client_acc.is_none()));
    let cleared = |rows: Vec<RoundRecord>| {
        let mut rows = strip_time(rows);
        rows.iter_mut().for_each(|r| r.client_acc = None);
        rows
    };
    assert_eq!(cleared(without), cleared(rows));
    // On by default and then not written out, so the hash of every earlier config stands;
    // off, it is written and the hash moves.
    assert!(
        !synthetic(&["rounds=7"])
            .config
            .to_resolved_toml()
            .contains("per_client")
    );
    assert!(off.config.to_resolved_toml().contains("per_client = false"));
    let mut on = off.config.clone();
    on.eval.per_client = true;
    assert_eq!(
        on.hash(),
        synthetic(&["rounds=7", "eval.every=3", "eval.per_client_every=1"])
            .config
            .hash()
    );
    assert_ne!(on.hash(), off.config.hash());
}

/// By default the per-client accuracies come every 10 rounds and at the last, among the
/// evaluation rounds; every other column of every round is what it is when they come at
/// every evaluation. Past `eval.per_client_clients` clients they are measured on a fixed
/// sample drawn from the data seed: the same for every strategy, and each sampled client's
/// accuracy is the one measured on all.
#[test]
fn client_accuracy_comes_on_its_cadence_and_on_a_seeded_sample() {
    let measured = |set: &[&str]| -> (Vec<usize>, Vec<RoundRecord>) {
        let rows = run_in_pool(2, &synthetic(set));
        let at = rows
            .iter()
            .filter(|r| r.client_acc.is_some())
            .map(|r| r.round)
            .collect();
        (at, rows)
    };
    let (at, cadenced) = measured(&["rounds=25"]);
    assert_eq!(at, [9, 19, 24]);
    let (every, all) = measured(&["rounds=25", "eval.per_client_every=1"]);
    assert_eq!(every, (0..25).collect::<Vec<_>>());
    for (a, b) in cadenced.iter().zip(&all) {
        assert_eq!(a.test_acc, b.test_acc);
        assert_eq!(a.selected, b.selected);
        if a.client_acc.is_some() {
            assert_eq!(a.client_acc, b.client_acc, "round {}", a.round);
        }
    }
    let (at, _) = measured(&["rounds=12", "eval.every=3", "eval.per_client_every=2"]);
    assert_eq!(at, [5, 11]);

    let full = synthetic(&["rounds=2"]);
    let sampled = synthetic(&["rounds=2", "eval.per_client_clients=10"]);
    let other = synthetic(&[
        "rounds=2",
        "eval.per_client_clients=10",
        "selection.strategy=\"powd\"",
    ]);
    let params = full.layout.init(3);
    let all = full.client_accuracies(&params);
    let some = sampled.client_accuracies(&params);
    assert!(!some.is_empty() && some.len() <= 10, "{}", some.len());
    assert_eq!(some, other.client_accuracies(&params));
    // Each sampled value is one of the full measurement's, in client order.
    let mut rest = all.iter();
    for a in &some {
        assert!(
            rest.any(|b| b == a),
            "{a} is not among the full measurement's"
        );
    }
}

#[test]
fn results_are_identical_across_thread_counts() {
    for (strategy, extra) in [
        ("uniform", ""),
        ("md", ""),
        ("powd", ""),
        ("cpowd", ""),
        ("rpowd", ""),
        ("afl", ""),
        ("fedcor", ""),
        ("fedgp", ""),
        ("fedgs", "selection.fedgs.graph=\"functional\""),
        ("fedgs", "availability={ kind = \"sln\", beta = 0.5 }"),
        ("f3ast", "budget={ kind = \"random\", min = 2, max = 8 }"),
        ("hics", "selection.hics.protocol=\"code\""),
        ("cs1", ""),
        ("cs2", ""),
        ("divfl", ""),
        ("divfl", "selection.divfl.refresh=\"stale\""),
    ] {
        let exp = synthetic(&[
            "rounds=30",
            &format!("selection.strategy=\"{strategy}\""),
            if extra.is_empty() { "seed=1" } else { extra },
            "selection.fedcor.warmup=5",
            "selection.fedcor.interval=5",
            "selection.fedcor.steps=20",
            "selection.fedcor.warmup_steps=20",
            "train.momentum=0.9",
            // Momentum is HiCS-FL's protocol `code` regime, which keeps each client's optimizer.
            &format!("train.persistent_state={}", strategy == "hics"),
            "model.kind=\"mlp\"",
            "model.dropout=0.3",
        ]);
        let one = strip_time(run_in_pool(1, &exp));
        let two = strip_time(run_in_pool(2, &exp));
        assert_eq!(one, two, "{strategy} {extra}");
    }
}

/// For a given seed every strategy faces the same availability (FedGS App. C), and F3AST
/// never exceeds the budget K_t nor picks an unavailable client.
#[test]
fn availability_is_the_same_for_every_strategy() {
    let avail = |strategy: &str| {
        let exp = synthetic(&[
            "rounds=40",
            &format!("selection.strategy=\"{strategy}\""),
            "availability={ kind = \"smartphones\", sigma = 0.25 }",
            "budget={ kind = \"periodic\", values = [3, 6, 9], hold = 2 }",
            if strategy == "f3ast" {
                "server.aggregation=\"selector\""
            } else {
                "server.aggregation=\"data_size\""
            },
        ]);
        run_in_pool(2, &exp)
    };
    let f3ast = avail("f3ast");
    for other in ["uniform", "fedgs"] {
        let rows = if other == "uniform" {
            run_in_pool(
                2,
                &synthetic(&[
                    "rounds=40",
                    "availability={ kind = \"smartphones\", sigma = 0.25 }",
                ]),
            )
        } else {
            avail(other)
        };
        for (a, b) in f3ast.iter().zip(&rows) {
            assert_eq!(a.available, b.available, "{other}, round {}", a.round);
        }
    }
    let budgets = [3, 3, 6, 6, 9, 9];
    for r in &f3ast {
        assert_eq!(r.budget, budgets[r.round % 6]);
        assert_eq!(r.n_selected, r.budget.min(r.n_available));
        assert!(r.selected.iter().all(|k| r.available.contains(k)));
    }
    assert!(f3ast.iter().any(|r| r.n_available < 30));
}

/// The secure-scalar-product route builds the same 3DG as the oracle route, so FedGS
/// selects the same clients; only the protocol's messages are added to the ledger.
#[test]
fn fedgs_through_secure_scalar_products_matches_the_oracle_graph() {
    let run = |graph: &str| {
        run_in_pool(
            2,
            &synthetic(&[
                "rounds=15",
                "selection.strategy=\"fedgs\"",
                &format!("selection.fedgs.graph=\"{graph}\""),
                "availability={ kind = \"ln\", beta = 0.5 }",
            ]),
        )
    };
    let (oracle, sspp) = (run("oracle"), run("sspp"));
    for (a, b) in oracle.iter().zip(&sspp) {
        assert_eq!(a.selected, b.selected, "round {}", a.round);
    }
    assert_eq!(oracle[0].cost.protocol_messages, 0);
    assert_eq!(
        sspp[0].cost.protocol_messages,
        30 * 29 / 2 * fedsel::sspp::MESSAGES_PER_PRODUCT
    );
    assert!(sspp[1..].iter().all(|r| r.cost.protocol_messages == 0));
}

#[test]
fn seeds_change_the_run_and_fixed_seeds_repeat_it() {
    let a = strip_time(run_in_pool(2, &synthetic(&["rounds=5"])));
    let b = strip_time(run_in_pool(2, &synthetic(&["rounds=5"])));
    let c = strip_time(run_in_pool(2, &synthetic(&["rounds=5", "seed=2"])));
    assert_eq!(a, b);
    assert_ne!(a, c);
}

/// A pinned data seed keeps the data, partition and held-out splits across run seeds,
/// which then vary only training; unpinned, each run seed draws its own data (issue 22).
#[test]
fn a_pinned_data_seed_fixes_the_data_and_run_seeds_vary_training() {
    let clients = |e: &Experiment| e.clients.clone();
    let pinned1 = synthetic(&["data_seed=0", "seed=1"]);
    let pinned2 = synthetic(&["data_seed=0", "seed=2"]);
    assert_eq!(clients(&pinned1), clients(&pinned2));
    assert_eq!(pinned1.data.train.labels, pinned2.data.train.labels);
    let own1 = synthetic(&["seed=1"]);
    let own2 = synthetic(&["seed=2"]);
    assert_ne!(own1.data.train.labels, own2.data.train.labels);
    assert_ne!(clients(&own1), clients(&pinned1));
    let a = strip_time(run_in_pool(
        2,
        &synthetic(&["rounds=3", "data_seed=0", "seed=1"]),
    ));
    let b = strip_time(run_in_pool(
        2,
        &synthetic(&["rounds=3", "data_seed=0", "seed=2"]),
    ));
    assert_ne!(a, b, "the run seed still drives training");
    // The resolved config records the data seed used, pinned or not.
    assert!(own2.config.to_resolved_toml().contains("data_seed = 2"));
    assert!(pinned2.config.to_resolved_toml().contains("data_seed = 0"));
}

/// Trains many parallel clients for many rounds; a burn-autodiff deadlock
/// (upstream issues 5573, 2729) would hang here, so it runs under a timeout.
#[test]
fn parallel_training_does_not_deadlock() {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let exp = synthetic(&[
            "rounds=60",
            "selection.fraction=1.0",
            "model.kind=\"mlp\"",
            "train.work.steps=3",
        ]);
        let rows = run_in_pool(2, &exp);
        tx.send(rows.len()).unwrap();
    });
    let done = rx
        .recv_timeout(Duration::from_secs(300))
        .expect("60 rounds of 30 parallel clients did not finish in 300 s: deadlock?");
    assert_eq!(done, 60);
}

/// A selector that asks for every report the engine offers and records what it got.
struct Probe {
    setup_ok: bool,
    losses_seen: usize,
    updates_seen: usize,
}

impl Selector for Probe {
    fn name(&self) -> &'static str {
        "probe"
    }
    fn needs(&self) -> Needs {
        Needs {
            updates: UpdateKind::OutputLayer,
            oracle_label_histograms: true,
            oracle_features: false,
        }
    }
    fn setup(&mut self, s: &Setup) {
        let h = s.oracle_label_histograms.as_ref().unwrap();
        self.setup_ok = h
            .iter()
            .zip(&s.sizes)
            .all(|(h, &n)| h.iter().sum::<usize>() == n);
    }
    fn select(
        &mut self,
        ctx: &RoundContext<'_>,
        q: &mut dyn ClientQuery,
        _: &mut Rng,
    ) -> Result<Selection, Error> {
        let g = q.gradients(ctx.available, GradientScope::Full)?;
        assert_eq!(g.len(), ctx.available.len());
        let cand = &ctx.available[..4];
        assert_eq!(q.gradients(cand, GradientScope::Minibatch)?.len(), 4);
        let losses = q.holdout_losses(cand)?;
        assert!(losses.iter().all(|l| l.is_finite() && *l > 0.0));
        self.losses_seen += losses.len();
        // Pick the two highest-loss candidates, like Pow-d.
        let mut order: Vec<usize> = (0..4).collect();
        order.sort_by(|&a, &b| losses[b].total_cmp(&losses[a]));
        Ok(Selection {
            clients: vec![cand[order[0]], cand[order[1]]],
            weights: None,
        })
    }
    fn observe(&mut self, f: &Feedback<'_>) {
        let u = f.updates.unwrap();
        assert_eq!(u.len(), 2);
        assert!(u.iter().all(|v| v.len() == 10 + 60 * 10));
        self.updates_seen += u.len();
    }
}

#[test]
fn reports_a_selector_asks_for_are_provided_and_booked() {
    let exp = synthetic(&["rounds=3"]);
    let mut c = Collect::default();
    let probe = Probe {
        setup_ok: false,
        losses_seen: 0,
        updates_seen: 0,
    };
    let summary = engine::run_with(&exp, Box::new(probe), &mut c, None).unwrap();
    // Full gradients pass over every training example of the 30 clients, mini-batch
    // ones over one batch (10 examples) of each of the 4 candidates.
    let sizes = exp.sizes();
    assert!(sizes.iter().all(|&n| n > 10));
    let per_round = Ledger {
        // 30 full and 4 mini-batch gradient requests + 4 loss requests + 2 trainings.
        broadcasts: 30 + 4 + 4 + 2,
        uploads: 30 + 4 + 2,
        trainings: 2,
        evaluations: 4,
        scalar_reports: 4,
        gradients: 30 + 4,
        gradient_examples: sizes.iter().sum::<usize>() as u64 + 4 * 10,
        ..c.0[0].cost
    };
    assert_eq!(c.0[0].cost, per_round);
    assert_eq!(summary.cost.evaluations, 12);
    assert_eq!(summary.cost.gradients, 3 * 34);
    assert_eq!(
        summary.cost.gradient_examples,
        3 * per_round.gradient_examples
    );
}

/// Selects client 0 every round and keeps the output-layer updates it is sent.
struct OutputLayerRecorder(std::sync::Arc<std::sync::Mutex<Vec<Vec<f32>>>>);

impl Selector for OutputLayerRecorder {
    fn name(&self) -> &'static str {
        "output-layer-recorder"
    }
    fn needs(&self) -> Needs {
        Needs {
            updates: UpdateKind::OutputLayer,
            ..Needs::default()
        }
    }
    fn select(
        &mut self,
        _: &RoundContext<'_>,
        _: &mut dyn ClientQuery,
        _: &mut Rng,
    ) -> Result<Selection, Error> {
        Ok(Selection {
            clients: vec![0],
            weights: None,
        })
    }
    fn observe(&mut self, f: &Feedback<'_>) {
        self.0.lock().unwrap().push(f.updates.unwrap()[0].clone());
    }
}

/// Keeps the global model of every checkpoint.
#[derive(Default)]
struct Globals(Vec<Vec<f32>>);

impl engine::Observer for Globals {
    fn on_round(&mut self, _: &RoundRecord) -> fedsel::error::Result<()> {
        Ok(())
    }
    fn on_checkpoint(&mut self, cp: &fedsel::checkpoint::Checkpoint) -> fedsel::error::Result<()> {
        self.0.push(cp.global.clone());
        Ok(())
    }
}

/// `UpdateKind::OutputLayer` sends [Δb, ΔW] with Δ = local − global (HiCS-FL reads Δb
/// first). With one client selected and its model averaged alone, the global model after
/// round 1 minus the one after round 0 is that client's update, so on the logistic
/// regression (weight 60 × 10 = flat 0..600, bias 600..610) the first 10 values sent must
/// be the bias's change and the next 600 the weight's, with the same sign.
#[test]
fn the_output_layer_update_is_bias_then_weight_local_minus_global() {
    let exp = synthetic(&["rounds=3", "checkpoint_every=1"]);
    let sent = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut globals = Globals::default();
    engine::run_with(
        &exp,
        Box::new(OutputLayerRecorder(sent.clone())),
        &mut globals,
        None,
    )
    .unwrap();
    let sent = sent.lock().unwrap();
    let (before, after) = (&globals.0[0], &globals.0[1]);
    let change: Vec<f32> = [600..610, 0..600]
        .into_iter()
        .flat_map(|r| r.map(|i| after[i] - before[i]))
        .collect();
    assert_eq!(sent[1].len(), change.len());
    assert!(change.iter().any(|d| d.abs() > 1e-3));
    for (s, c) in sent[1].iter().zip(&change) {
        assert!((s - c).abs() < 1e-6, "sent {s}, global moved {c}");
    }
}

/// What an [`Asker`] asks of the engine in a round.
type Ask = fn(&RoundContext<'_>, &mut dyn ClientQuery) -> Result<(), Error>;

/// Asks what its `ask` function names, then selects the first available client.
struct Asker(Ask);

impl Selector for Asker {
    fn name(&self) -> &'static str {
        "asker"
    }
    fn select(
        &mut self,
        ctx: &RoundContext<'_>,
        q: &mut dyn ClientQuery,
        _: &mut Rng,
    ) -> Result<Selection, Error> {
        (self.0)(ctx, q)?;
        Ok(Selection {
            clients: vec![ctx.available[0]],
            weights: None,
        })
    }
}

/// The first client that is not available in a round.
fn away(ctx: &RoundContext<'_>) -> usize {
    (0..).find(|k| !ctx.available.contains(k)).unwrap()
}

#[test]
fn a_query_for_an_unavailable_client_is_an_error() {
    let asks: [Ask; 5] = [
        |ctx, q| q.holdout_losses(&[away(ctx)]).map(drop),
        |ctx, q| q.minibatch_losses(&[away(ctx)]).map(drop),
        |ctx, q| q.gradients(&[away(ctx)], GradientScope::Full).map(drop),
        |ctx, q| q.probe(&ctx.available[..1], &[away(ctx)]).map(drop),
        |ctx, q| q.advance(&[away(ctx)], ctx.available).map(drop),
    ];
    let exp = synthetic(&[
        "rounds=2",
        "availability.kind=\"scarce\"",
        "availability.q=0.5",
    ]);
    for ask in asks {
        let mut c = Collect::default();
        let e = engine::run_with(&exp, Box::new(Asker(ask)), &mut c, None).unwrap_err();
        assert!(
            matches!(&e, Error::Selection { round: 0, reason, .. } if reason.contains("not available")),
            "{e}"
        );
        assert!(c.0.is_empty());
    }
    // The same questions of available clients are answered.
    let mut c = Collect::default();
    let fine = Asker(|ctx, q| {
        q.holdout_losses(ctx.available)?;
        q.probe(&ctx.available[..1], ctx.available).map(drop)
    });
    engine::run_with(&exp, Box::new(fine), &mut c, None).unwrap();
    assert_eq!(c.0.len(), 2);
}

/// A round's test evaluation runs beside the next round's training; an error in that
/// next round must not lose the finished round's record, nor change its numbers.
#[test]
fn a_round_evaluated_beside_the_next_is_recorded_before_the_next_rounds_error() {
    let exp = synthetic(&["rounds=4"]);
    let mut full = Collect::default();
    engine::run_with(&exp, Box::new(Asker(|_, _| Ok(()))), &mut full, None).unwrap();
    let full = strip_time(full.0);
    assert!(full.iter().all(|r| r.test_acc.is_some()));
    let mut cut = Collect::default();
    let failing = Asker(|ctx, _| match ctx.round {
        2 => Err(Error::Selection {
            selector: "asker".into(),
            round: 2,
            reason: "fails on purpose".into(),
        }),
        _ => Ok(()),
    });
    let e = engine::run_with(&exp, Box::new(failing), &mut cut, None).unwrap_err();
    assert!(matches!(e, Error::Selection { round: 2, .. }), "{e}");
    assert_eq!(strip_time(cut.0), full[..2]);
}

#[test]
fn probes_and_extra_steps_are_booked_and_an_extra_step_moves_the_model() {
    let exp = synthetic(&["rounds=1"]);
    let n = exp.clients.len() as u64;
    // A FedCor GP-training round's reports: the round's losses, one probe of two clients.
    let mut c = Collect::default();
    let probing = Asker(|ctx, q| {
        let before = q.holdout_losses(ctx.available)?;
        let after = q.probe(&ctx.available[..2], ctx.available)?;
        assert_ne!(before, after);
        // The probe model was discarded: the global model's losses are unchanged.
        assert_eq!(q.holdout_losses(ctx.available)?, before);
        Ok(())
    });
    engine::run_with(&exp, Box::new(probing), &mut c, None).unwrap();
    let cost = c.0[0].cost;
    assert_eq!(cost.probe_trainings, 2);
    assert_eq!(cost.trainings, 1);
    assert_eq!(cost.evaluations, 3 * n);
    assert_eq!(cost.scalar_reports, 3 * n);
    assert_eq!(cost.broadcasts, 3 * n + 2 + 1);
    assert_eq!(cost.uploads, 2 + 1);
    // FedGP's extra step feeds the global model: its trainings count as extra trainings,
    // and the model the round's selection trains from has moved.
    let mut c = Collect::default();
    let advancing = Asker(|ctx, q| {
        let before = q.holdout_losses(ctx.available)?;
        let after = q.advance(&ctx.available[..2], ctx.available)?;
        assert_ne!(before, after);
        assert_eq!(q.holdout_losses(ctx.available)?, after);
        Ok(())
    });
    engine::run_with(&exp, Box::new(advancing), &mut c, None).unwrap();
    let cost = c.0[0].cost;
    assert_eq!(cost.probe_trainings, 0);
    assert_eq!((cost.trainings, cost.extra_trainings), (1, 2));
    assert_eq!(cost.evaluations, 3 * n);
    assert_eq!(cost.broadcasts, 3 * n + 2 + 1);
}

#[test]
fn a_failed_run_leaves_finished_rounds_readable() {
    let exp = synthetic(&["rounds=50", "train.lr=1e37", "train.work.epochs=3"]);
    let dir = tempfile::tempdir().unwrap();
    let mut w = RunWriter::create(dir.path(), &exp.config).unwrap();
    let err = engine::run(&exp, &mut w).unwrap_err();
    assert!(matches!(err, Error::Diverged { .. }), "{err}");
    let Error::Diverged { round, .. } = err else {
        unreachable!()
    };
    w.fail(&err, round).unwrap();
    let metrics = std::fs::read_to_string(dir.path().join("metrics.csv")).unwrap();
    assert_eq!(
        metrics.lines().count(),
        1 + round,
        "header plus every finished round"
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["status"], "failed");
    let resolved = std::fs::read_to_string(dir.path().join("config.resolved.toml")).unwrap();
    assert!(resolved.contains(fedsel::VERSION));
}

#[test]
fn fmnist_loader_checks_real_files_and_reports_corruption() {
    let Some(shared) = common::shared_data() else {
        return;
    };
    let d = data::fmnist::load(&shared.join("fashion-mnist")).unwrap();
    assert_eq!((d.train.len(), d.test.len()), (60_000, 10_000));
    assert!(d.train.histogram(None).iter().all(|&c| c == 6000));
    let dir = tempfile::tempdir().unwrap();
    for f in [
        "train-images-idx3-ubyte.gz",
        "t10k-images-idx3-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz",
    ] {
        std::fs::copy(shared.join("fashion-mnist").join(f), dir.path().join(f)).unwrap();
    }
    // A truncated labels file (raw, 5000 labels instead of 60000).
    let mut bad = vec![0, 0, 8, 1, 0, 0, 0xea, 0x60];
    bad.extend(std::iter::repeat_n(1u8, 5000));
    std::fs::write(dir.path().join("train-labels-idx1-ubyte"), &bad).unwrap();
    let err = data::fmnist::load(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("train-labels-idx1-ubyte") && err.contains("truncated"),
        "{err}"
    );
    // A wrong magic number.
    bad[3] = 3;
    std::fs::write(dir.path().join("train-labels-idx1-ubyte"), &bad).unwrap();
    let err = data::fmnist::load(dir.path()).unwrap_err().to_string();
    assert!(err.contains("magic number is 2051"), "{err}");
    // A missing file is named.
    std::fs::remove_file(dir.path().join("train-labels-idx1-ubyte")).unwrap();
    let err = data::fmnist::load(dir.path()).unwrap_err().to_string();
    assert!(err.contains("train-labels-idx1-ubyte"), "{err}");
}

#[test]
fn shakespeare_builds_leaf_roles_from_the_gutenberg_text() {
    let Some(shared) = common::shared_data() else {
        return;
    };
    let text = std::fs::read_to_string(shared.join("shakespeare/pg100.txt")).unwrap();
    let roles = data::shakespeare::parse_roles(&text);
    // LEAF's preprocessing of this file gives 1,129 users (../shared/data/README.md).
    assert_eq!(roles.len(), 1129);
    assert!(
        roles
            .iter()
            .any(|r| r.id == "THE_TRAGEDY_OF_HAMLET__PRINCE_OF_DENMARK_HAM")
    );
}

#[test]
fn a_resumed_run_equals_an_uninterrupted_one() {
    // Every kind of carried state: client momentum kept between rounds, FedAdam moments,
    // MD sampling, dropout, and an LR schedule.
    let exp = synthetic(&[
        "rounds=30",
        "checkpoint_every=5",
        "selection.strategy=\"md\"",
        "model.kind=\"mlp\"",
        "model.dropout=0.2",
        "train.momentum=0.9",
        "train.persistent_state=true",
        "train.schedule={kind=\"step\", milestones=[12], gamma=0.5}",
        "server.optimizer=\"adam\"",
        "server.lr=0.02",
    ]);
    let r = Resumed::run(&exp, 17, 15);
    assert!(r.checkpoint.client_states.iter().any(Option::is_some));
    assert!(!r.checkpoint.server_m.is_empty());
    r.assert_same("md, mlp, adam");
    assert_eq!(
        (r.resumed.final_acc, r.resumed.best_loss, r.resumed.cost),
        (r.full.final_acc, r.full.best_loss, r.full.cost)
    );

    // A checkpoint from another config is refused by name.
    let other = synthetic(&["rounds=30", "checkpoint_every=5", "seed=9"]);
    let err = engine::resume(&other, &mut Collect::default(), r.checkpoint.clone())
        .unwrap_err()
        .to_string();
    assert!(err.contains("checkpoint"), "{err}");
}

#[test]
fn selectors_with_state_resume_exactly() {
    for strategy in [
        "fedcor", "fedgp", "afl", "rpowd", "fedgs", "f3ast", "hics", "cs2", "divfl",
    ] {
        let exp = synthetic(&[
            "rounds=24",
            "checkpoint_every=5",
            &format!("selection.strategy=\"{strategy}\""),
            "selection.fedgs.graph=\"update\"",
            "selection.divfl.refresh=\"stale\"",
            "availability={ kind = \"ln\", beta = 0.5 }",
            "selection.fedcor.warmup=4",
            "selection.fedcor.interval=3",
            "selection.fedcor.steps=20",
            "selection.fedcor.warmup_steps=20",
        ]);
        Resumed::run(&exp, 13, 10).assert_same(strategy);
    }
}

/// HiCS-FL under protocol `code` with frozen updates resumes exactly: the frozen updates
/// are checkpointed, and whether a round is a warm-up round is decided anew by `select`.
#[test]
fn hics_code_protocol_with_frozen_updates_resumes_exactly() {
    let exp = synthetic(&[
        "rounds=16",
        "checkpoint_every=5",
        "selection.strategy=\"hics\"",
        "selection.hics.protocol=\"code\"",
        "selection.hics.statistic=\"weight_rows\"",
        "selection.hics.temperature=0.001",
        "selection.hics.lambda=10",
        "selection.hics.clusters=3",
        "selection.hics.cs_switch=0.1",
        "selection.hics.several_alpha_groups=true",
        "train.momentum=0.9",
        "train.persistent_state=true",
    ]);
    Resumed::run(&exp, 12, 10).assert_same("hics code, frozen updates");
}

/// HiCS-FL asks for the oracle label histograms only to write `entropy.csv`: its
/// selections are the same with the report switched off, and the ideal DivFL's one-step
/// gradients are booked for every client every round.
#[test]
fn hics_selection_ignores_its_oracle_diagnostic_and_divfl_books_its_gradients() {
    let run = |extra: &str| {
        run_in_pool(
            2,
            &synthetic(&["rounds=20", "selection.strategy=\"hics\"", extra]),
        )
    };
    let with = run("selection.hics.entropy_report=true");
    let without = run("selection.hics.entropy_report=false");
    for (a, b) in with.iter().zip(&without) {
        assert_eq!(a.selected, b.selected, "round {}", a.round);
    }
    // Warm-up: ⌈30/6⌉ = 5 rounds cover every client exactly once.
    let mut seen: Vec<usize> = with[..5].iter().flat_map(|r| r.selected.clone()).collect();
    seen.sort();
    assert_eq!(seen, (0..30).collect::<Vec<_>>());
    // DivFL's gradients cover each client's whole training set by default (the DivFL
    // code), one batch of 10 with `gradient = "minibatch"`: the ledger shows the difference.
    let full = synthetic(&["rounds=3", "selection.strategy=\"divfl\""]);
    let examples = full.sizes().iter().sum::<usize>() as u64;
    assert!(examples > 30 * 10);
    let divfl = run_in_pool(2, &full);
    assert!(divfl.iter().all(|r| r.cost.gradients == 30
        && r.cost.gradient_examples == examples
        && r.n_selected == 6));
    let one_batch = run_in_pool(
        2,
        &synthetic(&[
            "rounds=3",
            "selection.strategy=\"divfl\"",
            "selection.divfl.gradient=\"minibatch\"",
        ]),
    );
    assert!(
        one_batch
            .iter()
            .all(|r| r.cost.gradients == 30 && r.cost.gradient_examples == 30 * 10)
    );
}

/// Keeps the selector's report files.
#[derive(Default)]
struct Reports(Vec<(String, String)>);

impl engine::Observer for Reports {
    fn on_round(&mut self, _: &RoundRecord) -> fedsel::error::Result<()> {
        Ok(())
    }

    fn on_reports(&mut self, files: &[(String, String)]) -> fedsel::error::Result<()> {
        self.0.extend_from_slice(files);
        Ok(())
    }
}

/// Under FedGS's `code` protocol α acts: on Synthetic with LogNormal availability the
/// mean graph distance among the selected clients, per round in `fedgs_solver.csv`,
/// rises with α ∈ {0, 1, 5}.
#[test]
fn fedgs_alpha_spreads_the_selection_on_synthetic_ln() {
    let spread = |alpha: f64| {
        let exp = synthetic(&[
            "rounds=40",
            "selection.strategy=\"fedgs\"",
            "selection.fedgs.protocol=\"code\"",
            &format!("selection.fedgs.alpha={alpha}"),
            "availability={ kind = \"ln\", beta = 0.5 }",
        ]);
        let mut r = Reports::default();
        engine::run(&exp, &mut r).unwrap();
        let csv = &r.0.iter().find(|f| f.0 == "fedgs_solver.csv").unwrap().1;
        let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
        let col = header.iter().position(|h| *h == "mean_distance").unwrap();
        let values: Vec<f64> = csv
            .lines()
            .skip(1)
            .map(|l| l.split(',').nth(col).unwrap().parse().unwrap())
            .collect();
        values.iter().sum::<f64>() / values.len() as f64
    };
    let (s0, s1, s5) = (spread(0.0), spread(1.0), spread(5.0));
    eprintln!("mean selected distance: α=0 {s0:.4}, α=1 {s1:.4}, α=5 {s5:.4}");
    assert!(s0 < s1 && s1 < s5, "{s0} {s1} {s5}");
}

/// HiCS-FL FMNIST setting (2) (CPU-sized: the MLP), right after the ⌈50/5⌉ = 10 warm-up
/// rounds: the positive-part estimate ranks clients by true label entropy at Spearman
/// ρ ≥ 0.7 (0.88–0.92 on seeds 1–3 here and with the paper's CNN).
#[test]
fn hics_positive_part_estimate_tracks_true_entropy_on_fmnist_setting_2() {
    let Some(shared) = common::shared_data() else {
        return;
    };
    let base = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../configs/hics/fmnist_base.toml");
    let set: Vec<String> = [
        "rounds=11",
        "model.kind=\"mlp\"",
        "server.aggregation=\"mean\"",
        "selection.strategy=\"hics\"",
        "selection.hics.estimator=\"positive_part\"",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let config = Config::load(Some(&base), &set).unwrap();
    let exp = Experiment::prepare(config, &shared).unwrap();
    let mut reports = Reports::default();
    engine::run(&exp, &mut reports).unwrap();
    let csv = &reports
        .0
        .iter()
        .find(|(name, _)| name == "entropy.csv")
        .expect("HiCS-FL writes entropy.csv")
        .1;
    let (mut truth, mut estimate) = (Vec::new(), Vec::new());
    for line in csv.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        if f[0] == "10" {
            truth.push(f[2].parse::<f64>().unwrap());
            estimate.push(f[3].parse::<f64>().unwrap());
        }
    }
    assert_eq!(
        truth.len(),
        50,
        "every client has an estimate after warm-up"
    );
    let rho = fedsel::diagnostics::spearman(&truth, &estimate);
    assert!(rho >= 0.7, "Spearman {rho}");
}

/// Records the sizes and weights a selector is set up with, then picks the first clients.
struct SizeSpy(std::sync::Arc<std::sync::Mutex<(Vec<usize>, Vec<f64>)>>);

impl Selector for SizeSpy {
    fn name(&self) -> &'static str {
        "size-spy"
    }
    fn needs(&self) -> Needs {
        Needs::default()
    }
    fn setup(&mut self, s: &Setup) {
        *self.0.lock().unwrap() = (s.sizes.clone(), s.weights.clone());
    }
    fn select(
        &mut self,
        ctx: &RoundContext<'_>,
        _: &mut dyn ClientQuery,
        _: &mut Rng,
    ) -> Result<Selection, Error> {
        Ok(Selection {
            clients: ctx.available[..ctx.budget].to_vec(),
            weights: None,
        })
    }
}

#[test]
fn client_size_local_reports_the_whole_partition_to_selectors() {
    let seen = |client_size: &str| {
        let exp = synthetic(&[
            "rounds=1",
            &format!("selection.client_size=\"{client_size}\""),
        ]);
        let cell = std::sync::Arc::new(std::sync::Mutex::new((Vec::new(), Vec::new())));
        engine::run_with(
            &exp,
            Box::new(SizeSpy(cell.clone())),
            &mut Collect::default(),
            None,
        )
        .unwrap();
        let (sizes, weights) = cell.lock().unwrap().clone();
        (exp, sizes, weights)
    };
    let (exp, train, _) = seen("train");
    assert_eq!(train, exp.sizes());
    let (exp, local, weights) = seen("local");
    let whole: Vec<usize> = exp
        .clients
        .iter()
        .map(|c| c.train.len() + c.holdout.len())
        .collect();
    assert_eq!(local, whole);
    // The held-out part is not empty, so the two bases differ.
    assert!(local.iter().zip(&train).all(|(l, t)| l > t));
    let total: usize = whole.iter().sum();
    for (w, n) in weights.iter().zip(&whole) {
        assert!((w - *n as f64 / total as f64).abs() < 1e-15);
    }
}

/// With `partition.holdout_fraction = 0` (the HiCS-FL configs: the authors' code trains on
/// all local data) no client holds examples out, and a loss report (pow-d's ranking) is the
/// current model's loss over the client's whole training data, as the HiCS code's pow-d
/// ranks by.
#[test]
fn without_holdout_a_loss_report_is_the_training_loss_of_the_current_model() {
    let exp = synthetic(&["partition.holdout_fraction=0"]);
    assert!(exp.clients.iter().all(|c| c.holdout.is_empty()));
    let params = exp.layout.init(7);
    let clients = [0, 3, 5];
    let reports = exp.holdout_losses(&params, &clients);
    let tensors = exp.layout.to_tensors(&params, &exp.device);
    for (&k, r) in clients.iter().zip(&reports) {
        let train = &exp.clients[k].train;
        let e = fedsel::train::evaluate(
            exp.arch.as_ref(),
            &tensors,
            &exp.data.train,
            train,
            exp.config.eval.batch_size,
            &exp.device,
        );
        assert_eq!((r.loss, r.examples), (e.loss, train.len()), "client {k}");
    }
    let held = synthetic(&[]);
    assert!(held.clients.iter().all(|c| !c.holdout.is_empty()));
}

fn read_json(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn a_clock_run_writes_round_and_clock_seconds_and_time_to_target() {
    let exp = synthetic(&[
        "rounds=25",
        "targets=[0.3, 0.5, 0.999]",
        "system.kind=\"lognormal\"",
        "system.round.policy=\"overcommit\"",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let mut w = RunWriter::create(dir.path(), &exp.config).unwrap();
    let summary = engine::run(&exp, &mut w).unwrap();
    w.finish(&summary).unwrap();

    let text = std::fs::read_to_string(dir.path().join("metrics.csv")).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(header[header.len() - 2..], ["round_s", "clock_s"]);
    assert_eq!(header[header.len() - 3..], fedsel::output::CLOCK_COLUMNS);
    assert_eq!(
        header[..header.len() - 3],
        fedsel::output::metric_columns(),
        "appended after the old columns"
    );
    let rows: Vec<Vec<f64>> = lines
        .map(|l| {
            let v: Vec<&str> = l.split(',').collect();
            v[v.len() - 2..]
                .iter()
                .map(|x| x.parse().unwrap())
                .collect()
        })
        .collect();
    assert_eq!(rows.len(), 25);
    let mut clock = 0.0;
    for r in &rows {
        assert!(r[0] > 0.0, "every round takes time: {r:?}");
        clock += r[0];
        assert!(
            (r[1] - clock).abs() < 1e-5,
            "clock_s is the sum of round_s: {r:?}"
        );
    }
    assert!(
        rows.windows(2).all(|w| w[1][1] > w[0][1]),
        "clock_s increases"
    );

    // Over-commitment: ⌈1.3 · 6⌉ = 8 selected of the 30 always-available clients, 6 kept.
    let mut c = Collect::default();
    engine::run(&exp, &mut c).unwrap();
    for r in &c.0 {
        assert_eq!((r.n_selected, r.budget), (8, 6));
        assert_eq!(r.clock.unwrap().aggregated, 6);
    }
    let wasted: u64 = c.0.iter().map(|r| r.cost.wasted_trainings).sum();
    let total = summary.clock.as_ref().unwrap();
    assert_eq!(total.wasted_trainings, wasted);
    assert!(wasted > 0 && wasted <= 2 * 25);

    let json = read_json(&dir.path().join("summary.json"));
    let rtt = json["rounds_to_target"].as_array().unwrap();
    let ttt = json["time_to_target_s"].as_array().unwrap();
    assert_eq!(rtt.len(), 3);
    assert!(
        rtt[0][1].is_u64(),
        "the synthetic run reaches 30 % in 25 rounds"
    );
    assert!(
        rtt[2][1].is_null() && ttt[2][1].is_null(),
        "99.9 % is not reached"
    );
    for (r, t) in rtt.iter().zip(ttt) {
        assert_eq!(r[0], t[0]);
        match r[1].as_u64() {
            Some(n) => {
                let at = t[1].as_f64().unwrap();
                assert!(
                    (at - rows[n as usize - 1][1]).abs() < 1e-5,
                    "{at} vs round {n}"
                );
            }
            None => assert!(t[1].is_null()),
        }
    }
    assert!((json["clock_s"].as_f64().unwrap() - clock).abs() < 1e-5);
}

#[test]
fn a_wait_all_clock_leaves_every_result_as_without_one() {
    let base = ["rounds=8", "model.kind=\"mlp\"", "model.dropout=0.2"];
    let exp = synthetic(&base);
    let clocked = synthetic(&[&base[..], &["system.kind=\"lognormal\""]].concat());
    let plain = run_in_pool(2, &exp);
    let timed = run_in_pool(2, &clocked);
    assert!(plain.iter().all(|r| r.clock.is_none()));
    assert!(timed.iter().all(|r| r.clock.is_some()));
    let untimed = timed
        .into_iter()
        .map(|mut r| {
            r.clock = None;
            r
        })
        .collect();
    assert_eq!(strip_time(plain), strip_time(untimed));

    // Without [system], no file mentions the clock.
    let dir = tempfile::tempdir().unwrap();
    let mut w = RunWriter::create(dir.path(), &exp.config).unwrap();
    let summary = engine::run(&exp, &mut w).unwrap();
    w.finish(&summary).unwrap();
    let metrics = std::fs::read_to_string(dir.path().join("metrics.csv")).unwrap();
    let header: Vec<&str> = metrics.lines().next().unwrap().split(',').collect();
    assert_eq!(header, fedsel::output::metric_columns());
    let json = read_json(&dir.path().join("summary.json"));
    for key in ["clock_s", "time_to_target_s", "wasted_trainings"] {
        assert!(json.get(key).is_none(), "{key} in {json}");
    }
    let resolved = std::fs::read_to_string(dir.path().join("config.resolved.toml")).unwrap();
    assert!(!resolved.contains("system"), "{resolved}");
}

#[test]
fn past_a_deadline_no_update_is_aggregated_and_the_run_goes_on() {
    let exp = synthetic(&[
        "rounds=4",
        "system.kind=\"lognormal\"",
        "system.round={policy=\"deadline\", deadline_s=1e-9}",
    ]);
    let mut c = Collect::default();
    let summary = engine::run(&exp, &mut c).unwrap();
    assert_eq!(c.0.len(), 4);
    for r in &c.0 {
        let clock = r.clock.unwrap();
        assert_eq!((clock.round_s, clock.aggregated), (1e-9, 0));
        assert_eq!(r.cost.wasted_trainings, r.cost.trainings);
        // The model never moves, so every evaluation sees the initial one.
        assert_eq!(r.test_loss, c.0[0].test_loss);
    }
    let total = summary.clock.unwrap();
    assert_eq!(total.wasted_trainings, summary.cost.trainings);
    assert!((total.clock_s - 4e-9).abs() < 1e-18);
    assert_eq!(total.rounds_without_updates, 4);
}

/// Writes a FedScale behave trace with Python's pickle: every one of the 30 clients gets
/// `entry` (a Python dict literal). `None`, with the reason printed, without `python3`.
fn behave_trace(dir: &std::path::Path, entry: &str) -> Option<String> {
    let path = dir.join("client_behave_trace");
    let script = format!(
        "import pickle\npickle.dump({{k: {entry} for k in range(31)}}, open({:?}, 'wb'))",
        path.display().to_string()
    );
    match std::process::Command::new("python3")
        .args(["-c", &script])
        .status()
    {
        Ok(s) if s.success() => Some(path.display().to_string()),
        Ok(s) => panic!("python3 could not write the trace: {s}"),
        Err(e) => {
            eprintln!("skipped: no python3 to write a behave trace ({e})");
            None
        }
    }
}

/// A run on `trace` must move the clock forward every round, and count the rounds that
/// lost every update; returns those rounds' count.
fn assert_the_clock_moves(trace: &str, policy: &str, rounds: usize, extra: &[&str]) -> usize {
    let rounds = format!("rounds={rounds}");
    let trace = format!("system.behave_trace={trace:?}");
    let policy_set = format!("system.round.policy={policy:?}");
    let mut set = vec![
        rounds.as_str(),
        "system.kind=\"lognormal\"",
        &trace,
        &policy_set,
    ];
    set.extend_from_slice(extra);
    let exp = synthetic(&set);
    let mut c = Collect::default();
    let summary = engine::run(&exp, &mut c).unwrap();
    let mut last = 0.0;
    for r in &c.0 {
        let clock = r.clock.unwrap();
        assert!(
            clock.round_s > 0.0 && clock.clock_s > last,
            "{policy}, round {}: {clock:?} after {last}",
            r.round
        );
        last = clock.clock_s;
    }
    let empty =
        c.0.iter()
            .filter(|r| r.clock.unwrap().aggregated == 0)
            .count();
    assert_eq!(
        summary.clock.unwrap().rounds_without_updates,
        empty,
        "{policy}"
    );
    empty
}

/// Every client online during [0, 300] and [500, 900] of each 1,000 s. A round that
/// starts just before 300 s loses every update (its clients go offline before they
/// finish); it still lasts its slowest client's time, so the next round starts after
/// 300 s, waits for 500 s, and the run goes on rather than repeating that instant.
#[test]
fn a_round_that_loses_every_update_still_moves_the_clock() {
    let dir = tempfile::tempdir().unwrap();
    let Some(trace) = behave_trace(
        dir.path(),
        "{'active': [0, 500], 'inactive': [300, 900], 'finish_time': 1000}",
    ) else {
        return;
    };
    for policy in ["wait_all", "overcommit"] {
        let empty = assert_the_clock_moves(&trace, policy, 120, &[]);
        assert!(
            empty > 0 && empty < 60,
            "{policy}: {empty} rounds without updates"
        );
    }
}

/// Each client online 2 s in every 1,000 s, at its own offset (client k from 33k s): TiFL
/// picks from its tier, whose clients are seldom the ones online, and from some round on
/// picks nobody; those rounds still move the clock (to the next client's change) and are
/// counted, as are the ones whose updates miss the 2 s window.
#[test]
fn tifl_under_rare_availability_moves_the_clock_every_round() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("client_behave_trace");
    let script = format!(
        "import pickle\npickle.dump({{k: {{'active': [33 * (k % 30)], 'inactive': [33 * (k % 30) + 2], 'finish_time': 1000}} for k in range(31)}}, open({:?}, 'wb'))",
        path.display().to_string()
    );
    match std::process::Command::new("python3")
        .args(["-c", &script])
        .status()
    {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("python3 could not write the trace: {s}"),
        Err(e) => {
            eprintln!("skipped: no python3 to write a behave trace ({e})");
            return;
        }
    }
    let trace = path.display().to_string();
    for policy in ["wait_all", "overcommit"] {
        let empty = assert_the_clock_moves(
            &trace,
            policy,
            40,
            &[
                "selection.strategy=\"tifl\"",
                "selection.clients_per_round=3",
            ],
        );
        assert!(empty > 0, "{policy}: no round without updates");
    }
}

/// Online one second a day, and every training takes longer (a sample takes e seconds on
/// every device): each round starts when the clients come online, loses every update, and
/// lasts its slowest client's time; the next starts the next day.
#[test]
fn clients_online_one_second_a_day_lose_every_update_and_the_days_go_by() {
    let dir = tempfile::tempdir().unwrap();
    let Some(trace) = behave_trace(
        dir.path(),
        "{'active': [0], 'inactive': [1], 'finish_time': 86400}",
    ) else {
        return;
    };
    for policy in ["wait_all", "overcommit"] {
        let slow = ["system.mean_ms_per_sample=1000", "system.tail_skew=0"];
        assert_eq!(
            assert_the_clock_moves(&trace, policy, 6, &slow),
            6,
            "{policy}"
        );
    }
}

/// Values each legal alone whose product overflows the clock: a config error before
/// round 0, naming the key that makes it and its value.
#[test]
fn durations_that_overflow_the_clock_are_config_errors_naming_key_and_value() {
    let prepare = |set: Vec<String>| {
        let config = Config::load(None, &set).unwrap();
        Experiment::prepare(config, &locate::data_dir(None, None))
            .err()
            .expect("an overflowing clock is refused")
            .to_string()
    };
    let lognormal = |extra: &str| vec!["system.kind=\"lognormal\"".to_string(), extra.into()];
    let e = prepare(lognormal("system.tail_skew=1000"));
    assert!(e.contains("system.tail_skew") && e.contains("1000"), "{e}");
    let e = prepare(lognormal("system.augmentation=1e308"));
    assert!(
        e.contains("system.augmentation") && e.contains("1e308"),
        "{e}"
    );
    let e = prepare(lognormal("system.mean_ms_per_sample=1e306"));
    assert!(
        e.contains("system.mean_ms_per_sample") && e.contains("1e306"),
        "{e}"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("devices.csv");
    let rows: String = (0..30)
        .map(|k| format!("{k},{},32\n", if k == 7 { "1e308" } else { "1" }))
        .collect();
    std::fs::write(
        &path,
        format!("client,compute_ms_per_sample,bandwidth_kbps\n{rows}"),
    )
    .unwrap();
    let e = prepare(vec![
        "system.kind=\"csv\"".into(),
        format!("system.path={:?}", path.display().to_string()),
    ]);
    assert!(
        e.contains("system.path") && e.contains("1e308") && e.contains("client 7"),
        "{e}"
    );
}

#[test]
fn a_device_csv_drives_the_clock_and_a_bad_one_names_file_and_client() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("devices.csv");
    // Client k computes at 1 ms a sample and sends at 32 kbit/s: identical devices.
    let rows: String = (0..30).map(|k| format!("{k},1,32\n")).collect();
    std::fs::write(
        &path,
        format!("client,compute_ms_per_sample,bandwidth_kbps\n{rows}"),
    )
    .unwrap();
    let set = |p: &std::path::Path| {
        vec![
            "rounds=2".to_string(),
            "train.work={steps=5}".into(),
            "system.kind=\"csv\"".into(),
            format!("system.path={:?}", p.display().to_string()),
        ]
    };
    let config = Config::load(None, &set(&path)).unwrap();
    let exp = Experiment::prepare(config, &locate::data_dir(None, None)).unwrap();
    let mut c = Collect::default();
    engine::run(&exp, &mut c).unwrap();
    // Every client: 2 · (P · 32 / 1024) / 32 s of transfers plus 3 · 5 steps · batch · 1 ms.
    let kbit = exp.layout.total as f64 * 32.0 / 1024.0;
    let samples = 5.0 * exp.config.train.batch_size as f64;
    let r = &c.0[0];
    assert_eq!(r.cost.train_steps, 5 * r.cost.trainings);
    let want = 2.0 * kbit / 32.0 + 3.0 * samples / 1000.0;
    assert!((r.clock.unwrap().round_s - want).abs() < 1e-9);

    let bad = dir.path().join("bad.csv");
    std::fs::write(
        &bad,
        "client,compute_ms_per_sample,bandwidth_kbps\n0,1,32\n1,-4,32\n",
    )
    .unwrap();
    let config = Config::load(None, &set(&bad)).unwrap();
    let err = Experiment::prepare(config, &locate::data_dir(None, None))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("bad.csv") && err.contains("client 1"), "{err}");
}

#[test]
fn a_resumed_clock_run_equals_an_uninterrupted_one() {
    let exp = synthetic(&[
        "rounds=12",
        "checkpoint_every=5",
        "targets=[0.3, 0.5]",
        "system.kind=\"lognormal\"",
        "system.round.policy=\"overcommit\"",
    ]);
    let r = Resumed::run(&exp, 7, 5);
    r.assert_same("overcommit clock");
    assert!(r.full.clock.as_ref().unwrap().clock_s > 0.0);
    assert_eq!(r.resumed.clock, r.full.clock);
}

/// Oort runs the default experiment end to end (no clock: statistical utility only),
/// picks K distinct available clients every round, learns, and resumes mid-run exactly.
#[test]
fn oort_runs_end_to_end_and_resumes_exactly() {
    let exp = synthetic(&["selection.strategy=\"oort\""]);
    let rows = run_in_pool(2, &exp);
    assert_eq!(rows.len(), 200);
    assert!(rows.iter().all(|r| r.n_selected == 6));
    let last = rows.last().unwrap().test_acc.unwrap();
    assert!(last > 0.7, "accuracy {last}");

    let exp = synthetic(&[
        "rounds=24",
        "checkpoint_every=5",
        "selection.strategy=\"oort\"",
        "selection.oort.pacer_step=3",
        "selection.oort.blacklist_rounds=5",
        "availability={ kind = \"ln\", beta = 0.5 }",
    ]);
    Resumed::run(&exp, 13, 10).assert_same("oort");
}

/// On a virtual clock Oort hears each update's duration and prefers the fast devices
/// (its system utility, (T/t_i)^α past the preferred duration T): over the same seed's
/// devices its rounds are shorter on average than uniform selection's, and its choices
/// are the same at any thread count.
#[test]
fn oort_on_a_clock_prefers_fast_devices() {
    let clocked = |strategy: &str| {
        synthetic(&[
            "rounds=80",
            &format!("selection.strategy=\"{strategy}\""),
            "system.kind=\"lognormal\"",
        ])
    };
    let oort = clocked("oort");
    let rows = run_in_pool(1, &oort);
    let again = run_in_pool(2, &oort);
    let picks = |r: &[RoundRecord]| r.iter().map(|x| x.selected.clone()).collect::<Vec<_>>();
    assert_eq!(picks(&rows), picks(&again));
    let mean_round = |r: &[RoundRecord]| {
        r.iter().map(|x| x.clock.unwrap().round_s).sum::<f64>() / r.len() as f64
    };
    let uniform = run_in_pool(2, &clocked("uniform"));
    let (o, u) = (mean_round(&rows), mean_round(&uniform));
    assert!(o < 0.8 * u, "Oort {o:.2} s a round, uniform {u:.2} s");
}

/// Writes FedScale's two files with Python's own pickle (protocol 4, as FedScale's are
/// written) for 30 clients; `None`, with the reason printed, when there is no `python3`.
/// Every device is the same (1 ms a sample, 32 kbit/s). In the behave trace, client k
/// reads the entry at position k + 1 (FedScale's mapping), so entry 1 is client 0's: online
/// only around 5·10⁸ s of a 10⁹ s cycle, never within the run. Entry 2, client 1's: online
/// at 10 s exactly. Every other client is online from 10 s on. `broken` drops entry 2's
/// `finish_time`.
fn fedscale_files(dir: &std::path::Path, broken: bool) -> Option<(String, String)> {
    let devices = dir.join("client_device_capacity");
    let trace = dir.join("client_behave_trace");
    let script = format!(
        r#"import pickle, sys
devices = {{i: {{"computation": 1.0, "communication": 32.0}} for i in range(30)}}
trace = {{i: {{"active": [10], "inactive": [9e8], "finish_time": 1e9, "duration": 0, "model": "x"}}
          for i in range(30)}}
trace[1] = {{"active": [5e8], "inactive": [5e8 + 1], "finish_time": 1e9}}
trace[2] = {{"active": [10.0], "inactive": [10.0], "finish_time": 1e9}}
if {broken}:
    del trace[2]["finish_time"]
for name, d in (("{d}", devices), ("{t}", trace)):
    with open(name, "wb") as f:
        pickle.dump(d, f, protocol=4)
"#,
        broken = if broken { "True" } else { "False" },
        d = devices.display(),
        t = trace.display(),
    );
    match std::process::Command::new("python3")
        .args(["-c", &script])
        .status()
    {
        Ok(s) if s.success() => Some((devices.display().to_string(), trace.display().to_string())),
        Ok(s) => panic!("python3 could not write the pickles: {s}"),
        Err(e) => {
            eprintln!("skipped: no python3 to write FedScale's pickles ({e})");
            None
        }
    }
}

#[test]
fn fedscale_pickles_drive_the_clock_and_an_offline_client_is_neither_selected_nor_aggregated() {
    let dir = tempfile::tempdir().unwrap();
    let Some((devices, trace)) = fedscale_files(dir.path(), false) else {
        return;
    };
    let set = |trace: &str| {
        vec![
            "rounds=4".to_string(),
            "train.work={steps=5}".into(),
            "selection.clients_per_round=30".into(),
            "system.kind=\"fedscale\"".into(),
            format!("system.path={devices:?}"),
            format!("system.behave_trace={trace:?}"),
        ]
    };
    let config = Config::load(None, &set(&trace)).unwrap();
    let exp = Experiment::prepare(config, &locate::data_dir(None, None)).unwrap();
    let mut c = Collect::default();
    let summary = engine::run(&exp, &mut c).unwrap();
    // Each update: 2 · (P · 32 / 1024) / 32 s of transfers plus 3 · 5 steps · batch · 1 ms.
    let kbit = exp.layout.total as f64 * 32.0 / 1024.0;
    let update_s = 2.0 * kbit / 32.0 + 3.0 * 5.0 * exp.config.train.batch_size as f64 / 1000.0;
    // Nobody is online at 0 s: round 0 starts at 10 s, with everyone but client 0.
    let r0 = &c.0[0];
    let clock = r0.clock.unwrap();
    assert!(
        (clock.round_s - (10.0 + update_s)).abs() < 1e-9,
        "{clock:?}"
    );
    assert_eq!(r0.available, (1..30).collect::<Vec<_>>());
    // Client 1 is selected at 10 s but offline when its update arrives: lost, wasted.
    assert!(r0.selected.contains(&1));
    assert_eq!(clock.aggregated, r0.selected.len() - 1);
    assert_eq!(r0.cost.wasted_trainings, 1);
    for r in &c.0 {
        assert!(!r.available.contains(&0) && !r.selected.contains(&0));
    }
    for r in &c.0[1..] {
        assert_eq!(r.available, (2..30).collect::<Vec<_>>());
        let clock = r.clock.unwrap();
        assert!((clock.round_s - update_s).abs() < 1e-9);
        assert_eq!(clock.aggregated, r.selected.len());
    }
    let total = summary.clock.unwrap();
    assert!((total.clock_s - (10.0 + 4.0 * update_s)).abs() < 1e-9);
    assert_eq!(total.wasted_trainings, 1);

    let broken = tempfile::tempdir().unwrap();
    let (_, trace) = fedscale_files(broken.path(), true).unwrap();
    let config = Config::load(None, &set(&trace)).unwrap();
    let err = Experiment::prepare(config, &locate::data_dir(None, None))
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("client_behave_trace")
            && err.contains("client 1 (the file's client 2)")
            && err.contains("`finish_time` is missing"),
        "{err}"
    );
}

#[test]
fn a_resumed_run_on_fedscale_files_equals_an_uninterrupted_one() {
    let dir = tempfile::tempdir().unwrap();
    let Some((devices, trace)) = fedscale_files(dir.path(), false) else {
        return;
    };
    let exp = synthetic(&[
        "rounds=8",
        "checkpoint_every=3",
        "system.kind=\"fedscale\"",
        &format!("system.path={devices:?}"),
        &format!("system.behave_trace={trace:?}"),
        "system.round.policy=\"overcommit\"",
    ]);
    let r = Resumed::run(&exp, 4, 3);
    r.assert_same("fedscale files");
    assert!(r.full.clock.as_ref().unwrap().clock_s > 10.0);
    assert_eq!(r.resumed.clock, r.full.clock);
}

/// FedCS on devices of known speeds (client k at 1 + k ms a sample, 32 kbit/s), with a
/// deadline between client 9's and client 10's finish times and a budget of 12: it explores
/// the 30 clients in the first three rounds (12 + 12 + 6 never measured, the greedy filling
/// the third), and from then on
/// selects exactly the ten that fit, fastest first; every update arrives, so the round
/// closes with client 9's. It resumes mid-run exactly.
#[test]
fn fedcs_on_a_clock_selects_the_clients_that_fit_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("devices.csv");
    let rows: String = (0..30).map(|k| format!("{k},{},32\n", 1 + k)).collect();
    std::fs::write(
        &path,
        format!("client,compute_ms_per_sample,bandwidth_kbps\n{rows}"),
    )
    .unwrap();
    let probe = synthetic(&[]);
    let kbit = probe.layout.total as f64 * 32.0 / 1024.0;
    let samples = 5.0 * probe.config.train.batch_size as f64;
    let finish = |k: usize| 2.0 * kbit / 32.0 + 3.0 * samples * (1 + k) as f64 / 1000.0;
    let deadline = (finish(9) + finish(10)) / 2.0;
    let set = [
        "rounds=8".to_string(),
        "checkpoint_every=5".into(),
        "train.work={steps=5}".into(),
        "selection.strategy=\"fedcs\"".into(),
        "selection.clients_per_round=12".into(),
        "system.kind=\"csv\"".into(),
        format!("system.path={:?}", path.display().to_string()),
        format!("system.round={{policy=\"deadline\", deadline_s={deadline}}}"),
    ];
    let config = Config::load(None, &set).unwrap();
    assert_eq!(config.selection.fedcs.deadline_s, Some(deadline));
    let exp = Experiment::prepare(config, &locate::data_dir(None, None)).unwrap();
    let rows = run_in_pool(2, &exp);
    let mut explored: Vec<usize> = rows[..3].iter().flat_map(|r| r.selected.clone()).collect();
    explored.sort_unstable();
    explored.dedup();
    assert_eq!(explored, (0..30).collect::<Vec<_>>());
    for r in &rows[3..] {
        assert_eq!(r.selected, (0..10).collect::<Vec<_>>(), "round {}", r.round);
        let clock = r.clock.unwrap();
        assert_eq!(clock.aggregated, 10);
        assert!(
            (clock.round_s - finish(9)).abs() < 1e-9,
            "{}",
            clock.round_s
        );
    }
    Resumed::run(&exp, 6, 5).assert_same("fedcs");
}

/// Pow-d's loss queries are on the clock: on identical devices (1 ms a sample, 32 kbit/s)
/// every candidate (d = all clients) downloads the model and evaluates its held-out part
/// before the server selects, so each round lasts longer than uniform selection's by the
/// slowest candidate's evaluation, kbit / 32 + (largest held-out part) × 1 ms; uniform
/// queries nothing, and its round is the training phase alone.
#[test]
fn pow_d_s_loss_queries_lengthen_the_round_by_the_slowest_candidate() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("devices.csv");
    let rows: String = (0..30).map(|k| format!("{k},1,32\n")).collect();
    std::fs::write(
        &path,
        format!("client,compute_ms_per_sample,bandwidth_kbps\n{rows}"),
    )
    .unwrap();
    let rounds = |strategy: &str| {
        let set = [
            "rounds=3".to_string(),
            "train.work={steps=5}".into(),
            format!("selection.strategy=\"{strategy}\""),
            "selection.powd.d=0".into(),
            "system.kind=\"csv\"".into(),
            format!("system.path={:?}", path.display().to_string()),
        ];
        let config = Config::load(None, &set).unwrap();
        let exp = Experiment::prepare(config, &locate::data_dir(None, None)).unwrap();
        (run_in_pool(2, &exp), exp)
    };
    let (powd, exp) = rounds("powd");
    let (uniform, _) = rounds("uniform");
    let kbit = exp.layout.total as f64 * 32.0 / 1024.0;
    let all: Vec<usize> = (0..exp.clients.len()).collect();
    let largest = exp
        .holdout_losses(&exp.layout.init(1), &all)
        .iter()
        .map(|e| e.examples)
        .max()
        .unwrap();
    let query = kbit / 32.0 + largest as f64 / 1000.0;
    let training = 2.0 * kbit / 32.0 + 3.0 * 5.0 * exp.config.train.batch_size as f64 / 1000.0;
    for (p, u) in powd.iter().zip(&uniform) {
        let (p, u) = (p.clock.unwrap().round_s, u.clock.unwrap().round_s);
        assert!((u - training).abs() < 1e-9, "uniform {u} ≠ {training}");
        assert!(
            (p - (query + training)).abs() < 1e-9,
            "pow-d {p} ≠ {query} + {training}"
        );
    }
}

/// Over-commitment's stragglers are booked in the ledger: each round 8 distinct clients are
/// broadcast to, train and upload (all booked), and the 2 the policy drops are wasted
/// trainings, in the round's ledger, `metrics.csv`'s clock columns and `summary.json`.
#[test]
fn over_committed_stragglers_are_wasted_trainings_in_the_ledger() {
    let exp = synthetic(&[
        "rounds=5",
        "system.kind=\"lognormal\"",
        "system.round.policy=\"overcommit\"",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let mut w = RunWriter::create(dir.path(), &exp.config).unwrap();
    let mut c = Collect::default();
    let summary = engine::run(&exp, &mut c).unwrap();
    engine::run(&exp, &mut w).unwrap();
    w.finish(&summary).unwrap();
    for r in &c.0 {
        let l = &r.cost;
        assert_eq!((l.broadcasts, l.uploads, l.trainings), (8, 8, 8));
        assert_eq!(l.wasted_trainings, 2);
    }
    assert_eq!(summary.cost.wasted_trainings, 10);
    assert_eq!(summary.clock.as_ref().unwrap().wasted_trainings, 10);
    let text = std::fs::read_to_string(dir.path().join("metrics.csv")).unwrap();
    let header: Vec<&str> = text.lines().next().unwrap().split(',').collect();
    let col = header
        .iter()
        .position(|&h| h == "wasted_trainings")
        .unwrap();
    for line in text.lines().skip(1) {
        assert_eq!(line.split(',').nth(col), Some("2"), "{line}");
    }
    let json = read_json(&dir.path().join("summary.json"));
    assert_eq!(json["cost"]["wasted_trainings"], 10);
    assert_eq!(json["wasted_trainings"], 10);
}

//! The round loop, in one place.
//!
//! Each round runs, top to bottom:
//! availability → selection (with any loss, gradient or probe reports it
//! asks for) → broadcast → local training of the selected, in
//! parallel, each after the strategy's sample-selection pass if it asks for one
//! ([`select::SampleRule`]) → (with `[system]`, the virtual clock's round policy) →
//! aggregation → server step → feedback to the selector → evaluation →
//! metrics.
//!
//! A round's test evaluation reads only its global model, so it runs beside
//! the next round's local training, and the round's record is complete (and
//! handed to the observer) once it is done: on two cores a round of 5 clients
//! would keep one core idle while the last client trains, and the evaluation
//! fills it (FedCor's FMNIST round: 14.2 → 11.6 ms). A round that ends the
//! run or is checkpointed is evaluated on its own, so a checkpoint holds every
//! round before it, and an error in the next round's selection still leaves
//! the round recorded. Selectors never see the test evaluation.
//!
//! Every random draw comes from a stream keyed by (seed, purpose, round,
//! client) and parallel results are combined in selection order, so a run is
//! bit-identical whatever the thread count.

use std::borrow::Cow;

use std::path::Path;

use std::sync::OnceLock;

use std::time::Instant;

use burn::tensor::{Device, Int, Tensor};

use rayon::prelude::*;

use crate::aggregate::{self, Server};

use crate::availability;

use crate::checkpoint::Checkpoint;

use crate::config::{AggregationRule, ClientSize, Config, LocalWork, TrainConfig};

use crate::data::{self, Dataset, FederatedData};

use crate::error::{ConfigError, Error, Result};

use crate::ledger::Ledger;

use crate::model::{self, Architecture, ParamLayout};

use crate::partition::{self, ClientData};

use crate::rng::{Purpose, stream};

use crate::select::guard::{self, AvailableOnly};

use crate::select::{
    self, ClientOrder, ClientQuery, DeviceReport, Dropped, Feedback, GradientScope, Planned,
    RoundContext, Setup, UpdateKind, UploadDropout,
};

use crate::summary::{ClockSummary, RunSummary};

use crate::system::clock::{self, Clock, QueryWork, RoundClock};
use crate::system::round::{self, RoundTiming};

use crate::system::inflight::{Flying, InFlight, LateUpdate};

use crate::system::{RoundPolicy, StaleConfig};

use crate::train::{self, Evaluation, OptimizerState, Trainer};

mod aggregation;
mod arrivals;
mod experiment;
mod query;
mod run;
mod training;

pub use experiment::Experiment;
use training::*;

/// One finished round, as written to `metrics.csv`.
#[derive(Debug, Clone, PartialEq)]
pub struct RoundRecord {
    /// Round index (0-based).
    pub round: usize,
    /// Test accuracy, when evaluated this round.
    pub test_acc: Option<f64>,
    /// Test loss, when evaluated this round.
    pub test_loss: Option<f64>,
    /// The spread of the clients' accuracies on their own held-out data, when evaluated
    /// this round and some client holds out data.
    pub client_acc: Option<ClientAccuracy>,
    /// Mean training loss of the selected clients.
    pub train_loss: f64,
    /// Entries selected (duplicates counted).
    pub n_selected: usize,
    /// Clients available.
    pub n_available: usize,
    /// Budget K_t.
    pub budget: usize,
    /// Local learning rate used.
    pub lr: f64,
    /// Costs of this round.
    pub cost: Ledger,
    /// Seconds since the run started, when the record was complete: after its test
    /// evaluation, which may have run beside the next round's training.
    pub elapsed_s: f64,
    /// The selection (duplicates kept).
    pub selected: Vec<usize>,
    /// The clients that were available.
    pub available: Vec<usize>,
    /// The round on the virtual clock, when `[system]` runs one.
    pub clock: Option<RoundClock>,
}

impl RoundRecord {
    /// Round `t`'s record before its cost, clock and evaluation are known.
    fn of_round(
        t: usize,
        lr: f64,
        budget: usize,
        train_loss: f64,
        selected: Vec<usize>,
        available: Vec<usize>,
    ) -> Self {
        RoundRecord {
            round: t,
            test_acc: None,
            test_loss: None,
            client_acc: None,
            train_loss,
            n_selected: selected.len(),
            n_available: available.len(),
            budget,
            lr,
            cost: Ledger::default(),
            elapsed_s: 0.0,
            selected,
            available,
            clock: None,
        }
    }
}

/// How the global model fares across clients, each on its own held-out data: the fairness
/// measures of LEAF and FedScale, on which AFL and q-FFL are judged. A mean over the
/// pooled test set hides a tail of clients the model serves badly; these show it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClientAccuracy {
    /// 10th percentile of the clients' accuracies.
    pub p10: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// Mean accuracy of the worst 10 % of clients: the ⌈n/10⌉ lowest of n.
    pub worst10: f64,
}

impl ClientAccuracy {
    /// The spread of `accuracies`, one per client; `None` for no client. Percentiles
    /// interpolate linearly between order statistics (numpy's default): the q-th of n
    /// sorted values lies at position q·(n − 1), counted from 0.
    pub fn of(accuracies: &[f64]) -> Option<Self> {
        if accuracies.is_empty() {
            return None;
        }
        let mut x = accuracies.to_vec();
        x.sort_by(f64::total_cmp);
        let n = x.len();
        // Positions in hundredths, in integers, so that 10 % of 31 clients is exactly 3.0.
        let pct = |q: usize| {
            let h = (n - 1) * q;
            let (lo, frac) = (h / 100, (h % 100) as f64 / 100.0);
            match x.get(lo + 1) {
                Some(&hi) if frac > 0.0 => x[lo] + frac * (hi - x[lo]),
                _ => x[lo],
            }
        };
        let worst = n.div_ceil(10);
        Some(Self {
            p10: pct(10),
            p50: pct(50),
            p90: pct(90),
            worst10: x[..worst].iter().sum::<f64>() / worst as f64,
        })
    }
}

/// Receives each round as it finishes (writers, progress bars).
pub trait Observer {
    /// Called once per round, in order.
    fn on_round(&mut self, record: &RoundRecord) -> Result<()>;

    /// Diagnostic files (name, CSV text): the clients' data summary at the start (for
    /// offline analysis only; no selector sees it) and the selector's reports at the end.
    fn on_reports(&mut self, files: &[(String, String)]) -> Result<()> {
        let _ = files;
        Ok(())
    }

    /// Called every `checkpoint_every` rounds, after [`Observer::on_round`].
    fn on_checkpoint(&mut self, checkpoint: &Checkpoint) -> Result<()> {
        let _ = checkpoint;
        Ok(())
    }
}

/// The engine's answer to a selector's report requests; books every cost.
struct Query<'a> {
    exp: &'a Experiment,
    global: &'a mut Vec<f32>,
    server: &'a mut Server,
    /// The run's aggregation rule, resolved; probes and extra steps use it too.
    rule: AggregationRule,
    ledger: &'a mut Ledger,
    /// The round's query phase on the clock so far, in virtual seconds.
    query_s: &'a mut f64,
    round: usize,
    lr: f64,
    sizes: &'a [usize],
}

/// A test loss this many times ln C (C classes) flags the run as diverged.
pub const DIVERGENCE_FACTOR: f64 = 10.0;

/// Runs every round of `exp` with the configured selector, reporting each to `observer`.
pub fn run(exp: &Experiment, observer: &mut dyn Observer) -> Result<RunSummary> {
    run_with(exp, select::build(&exp.config.selection)?, observer, None)
}

/// Continues a run of `exp` from a checkpoint with the configured selector.
pub fn resume(
    exp: &Experiment,
    observer: &mut dyn Observer,
    from: Checkpoint,
) -> Result<RunSummary> {
    run_with(
        exp,
        select::build(&exp.config.selection)?,
        observer,
        Some(from),
    )
}

/// Refuses a checkpoint written under another config. Callers run it before they touch
/// any file of the run, so a refused resume leaves the run's rows and summary as they were.
pub fn check_resumable(config: &Config, cp: &Checkpoint) -> Result<()> {
    if cp.config_hash != config.hash() {
        return Err(ConfigError::invalid(
            "checkpoint",
            "was written by a run with a different config (was config.resolved.toml edited?)",
        )
        .into());
    }
    Ok(())
}

/// Refuses a resume from `cp` that could not continue (a checkpoint of another config, a
/// selector state that does not load) without touching any file: callers run it before
/// they reopen the run's files, which drops the rows written after the checkpoint, so a
/// refused resume leaves the run's rows and summary as they were.
pub fn check_resume(exp: &Experiment, cp: &Checkpoint) -> Result<()> {
    check_resume_with(exp, select::build(&exp.config.selection)?, cp)
}

/// [`check_resume`] with a given selector (one the caller built, as for [`run_with`]).
pub fn check_resume_with(
    exp: &Experiment,
    selector: Box<dyn select::Selector>,
    cp: &Checkpoint,
) -> Result<()> {
    check_resumable(&exp.config, cp)?;
    let mut run = Run::new(exp, selector)?;
    run.restore(cp.clone()).map(|_| ())
}

/// Runs the rounds of `exp` with a given selector, from the start or from a checkpoint.
pub fn run_with(
    exp: &Experiment,
    selector: Box<dyn select::Selector>,
    observer: &mut dyn Observer,
    from: Option<Checkpoint>,
) -> Result<RunSummary> {
    let cfg = &exp.config;
    let mut run = Run::new(exp, selector)?;
    let start = match from {
        Some(cp) => run.restore(cp)?,
        None => 0,
    };
    // The initial phase's costs are booked to round 0.
    let mut initial_cost = Ledger::default();
    if start == 0 {
        observer.on_reports(&[("clients.csv".into(), exp.client_summary())])?;
        run.initial_phase(&mut initial_cost)?;
    }
    // Time already spent before a resume counts towards elapsed_s.
    let started = Instant::now() - std::time::Duration::from_secs_f64(run.summary.wall_s);

    // The last round, while its test evaluation waits to run beside this round's
    // training: its global model, and its record without the evaluation.
    let mut pending: Option<(Vec<f32>, RoundRecord)> = None;
    for t in start..cfg.rounds {
        let mut cost = std::mem::take(&mut initial_cost);
        let lr = cfg.train.schedule.rate(cfg.train.lr, t);
        // Availability A_t and budget K_t, then the phases in the order they run.
        let (active, budget, fedbuff) = run.round_availability(t);
        let ctx = run.round_context(t, &active, budget, fedbuff);
        let planned = run.select(&ctx, lr, &mut cost);
        let mut assessed = None;
        let trained = planned.as_ref().ok().map(|p| {
            let orders = p.orders.as_deref();
            run.train(t, lr, &p.selection.clients, orders, &mut cost, || {
                assessed = pending.as_ref().map(|(g, r)| assess(exp, g, r.round));
            })
        });
        // The last round is recorded before this one's error, if any, is returned.
        run.log_pending(pending.take(), assessed, started, observer)?;
        let selection = planned?.selection;
        let trained = trained.expect("trained when selected");
        let train_loss = trained.mean_loss();
        let (reported, trained, clock) =
            run.close_round(t, &selection, trained, budget, fedbuff, &mut cost)?;
        run.feedback(t, &reported, trained)?;
        let mut record =
            RoundRecord::of_round(t, lr, budget, train_loss, selection.clients, active);
        (record.cost, record.clock) = (cost, clock);
        run.end_round(t, record, &mut pending, started, observer)?;
    }
    let reports = run.selector.reports();
    run.failed()?;
    observer.on_reports(&reports)?;
    Ok(run.summary)
}

/// A global model's evaluation: on the pooled test set and, on the rounds
/// [`EvalConfig::per_client_at`](crate::config::EvalConfig::per_client_at) names, across
/// the clients' held-out data.
struct Assessment {
    test: Evaluation,
    clients: Option<ClientAccuracy>,
}

/// Evaluates `global`. It reads nothing but the model and the data, so it may run beside
/// the next round (see the module doc); its arithmetic does not depend on the threads.
fn assess(exp: &Experiment, global: &[f32], t: usize) -> Assessment {
    Assessment {
        test: exp.test(global),
        clients: exp
            .config
            .eval
            .per_client_at(t, exp.config.rounds)
            .then(|| ClientAccuracy::of(&exp.client_accuracies(global)))
            .flatten(),
    }
}

/// Whether `n` is 1, 10, 100, …: the counts at which a repeated condition is said again.
fn is_power_of_ten(mut n: usize) -> bool {
    while n >= 10 && n.is_multiple_of(10) {
        n /= 10;
    }
    n == 1
}

/// The count of `taus` and their mean (0 for none), as `metrics.csv`'s `stale_updates` and
/// `mean_staleness` record them.
fn staleness(taus: impl Iterator<Item = usize>) -> (usize, f64) {
    let (n, sum) = taus.fold((0, 0usize), |(n, s), t| (n + 1, s + t));
    (n, if n == 0 { 0.0 } else { sum as f64 / n as f64 })
}

/// The state a run carries from round to round, with one method per phase of a round so
/// that [`run_with`] reads as the round's outline.
struct Run<'a> {
    exp: &'a Experiment,
    selector: Box<dyn select::Selector>,
    /// The selector's standing needs, asked once before setup.
    needs: select::Needs,
    env: availability::Environment,
    trainer: Trainer<'a>,
    /// The aggregation rule, resolved from `auto` to the selector's own.
    rule: AggregationRule,
    sizes: Vec<usize>,
    /// Written into every checkpoint, so that a resume under another config is refused.
    config_hash: String,
    global: Vec<f32>,
    server: Server,
    /// Each client's persistent optimizer state, carried between its trainings.
    states: Vec<Option<OptimizerState>>,
    /// Virtual seconds of the selector's queries not yet on the clock: the current round's,
    /// with the initial phase's in round 0.
    query_s: f64,
    summary: RunSummary,
    /// The virtual second the current round started ([`Run::available`]): the clock's
    /// time, or later when a behave trace had none of the available clients online.
    start_s: f64,
    /// The updates in flight: late ones waiting to be folded, FedBuff's clients training.
    book: InFlight,
    /// The current round's entries that miss its cut but arrive later, with their arrival
    /// second (`[system.stale]`, set by [`Run::time`]).
    fresh_late: Vec<(usize, f64)>,
    /// The virtual second of the current round's training broadcast (set by [`Run::time`]).
    broadcast_s: f64,
    /// Rounds so far that trained nobody, for the console.
    idle_rounds: usize,
}

/// The round's local trainings: one per distinct selected client, shared by duplicates.
struct Trained {
    /// The selected clients, ascending, each once.
    distinct: Vec<usize>,
    /// One update per entry of `distinct`, as uploaded: the coordinates its order dropped
    /// ([`UploadDropout`]) hold the broadcast model's values.
    updates: Vec<train::LocalUpdate>,
    /// Per entry of `distinct`, the fraction of the update uploaded (1 without dropout).
    sent: Vec<f64>,
    /// Per selection entry, the mean training loss.
    losses: Vec<f64>,
    /// Per selection entry, the local model minus the broadcast one (whole or output layer,
    /// as the selector asked), or `None` when it asked for no updates.
    deltas: Option<Vec<Vec<f32>>>,
    /// Per selection entry, the virtual seconds until its update arrived, when the run has
    /// a clock.
    durations: Option<Vec<f64>>,
    /// The entries the round policy discarded, each with the seconds from the broadcast
    /// until the round closed without it, when the run has a clock.
    dropped: Option<(Vec<usize>, Vec<f64>)>,
    /// Per selection entry, the report of its client's sample-selection pass, when the
    /// selector asked for one ([`select::SampleRule`]).
    samples: Option<Vec<Vec<f64>>>,
    /// Per entry of `distinct`, the examples its sample-selection pass passed forward
    /// (none without a pass): the clock puts them before the client's training.
    inferred: Vec<u64>,
}

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
use crate::system::clock::{self, Clock, Flight, QueryWork, RoundClock, RoundTiming};
use crate::system::inflight::{Flying, InFlight, LateUpdate};
use crate::system::{RoundPolicy, StaleConfig};
use crate::train::{self, Evaluation, OptimizerState, Trainer};

/// A prepared run: data, clients, model.
pub struct Experiment {
    /// The resolved configuration.
    pub config: Config,
    /// The dataset.
    pub data: FederatedData,
    /// The clients' train / held-out index lists.
    pub clients: Vec<ClientData>,
    /// The network.
    pub arch: Box<dyn Architecture>,
    /// Its parameter layout.
    pub layout: ParamLayout,
    /// Compute device.
    pub device: Device,
    /// Global test examples evaluated each round.
    pub test_idx: Vec<usize>,
    /// Those examples, batched on the device once for the whole run; none where the
    /// architecture evaluates on host slices ([`train::evaluate_flat`]), which reads
    /// them in place.
    test_batches: Vec<(model::Batch, Tensor<1, Int>)>,
    /// Each client's held-out examples as a dataset of their own, made on first use
    /// where the architecture evaluates on host slices: evaluation reads them in place
    /// rather than gathering them from the training pool every round (the per-client
    /// accuracies of the FedCor MLP round spent a tenth of it there), for the memory of
    /// the held-out part once more.
    holdout_sets: OnceLock<Vec<Dataset>>,
    /// The availability trace, read and checked against the partition once, before any
    /// output directory is made (`availability.kind = "trace"` only).
    trace: Option<crate::availability::trace::Trace>,
    /// The virtual clock, with every client's device (`[system]` with a profile only),
    /// built here so that a bad profile file fails before any output directory is made.
    clock: Option<Clock>,
    /// The clients whose accuracies the per-client columns summarise: every client, or
    /// at most `eval.per_client_clients` of them drawn once from the data seed.
    fairness_clients: Vec<usize>,
    /// The held-out examples of the measured clients that hold any, pooled in client
    /// order as one dataset, with each client's count: made on first use, so that one pass
    /// in whole batches measures them all (a federation of 10,000 clients of a few
    /// held-out examples each took 10,000 tiny passes).
    fairness_pool: OnceLock<(Dataset, Vec<usize>)>,
}

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

fn device_for(name: &str) -> Result<Device> {
    match name {
        "flex" => Ok(Device::flex()),
        #[cfg(feature = "cuda")]
        "cuda" => Ok(Device::cuda(0)),
        other => Err(ConfigError::invalid(
            "device",
            format!(
                "`{other}` is not available in this build (the cuda device needs `--features cuda`)"
            ),
        )
        .into()),
    }
}

impl Experiment {
    /// Loads the data a config names from `data_dir` and prepares the run.
    pub fn prepare(config: Config, data_dir: &Path) -> Result<Self> {
        let data = data::load(&config, data_dir)?;
        Self::from_data(config, data)
    }

    /// Prepares a run on data already in memory.
    pub fn from_data(config: Config, data: FederatedData) -> Result<Self> {
        config.validate()?;
        let clients = partition::build(&config.partition, &data, config.data_seed())?;
        let m = config.selection.clients_per_round;
        if m > clients.len() {
            return Err(ConfigError::invalid(
                "selection.clients_per_round",
                format!(
                    "{m} is more than the {} clients of the partition",
                    clients.len()
                ),
            )
            .into());
        }
        // A trace is read here, not at round 0, so that a trace naming a client the
        // partition does not have fails before any output directory is made.
        let trace = match &config.availability {
            crate::config::AvailabilityConfig::Trace(t) => Some(
                crate::availability::trace::Trace::load(&t.trace, clients.len())?,
            ),
            _ => None,
        };
        let arch = model::build(&config.model, &data.train)?;
        let layout = ParamLayout::of(arch.as_ref()).with_init(config.model.init);
        let clock = match &config.system {
            Some(system) => {
                let train = &config.train;
                let samples: Vec<u64> = clients
                    .iter()
                    .map(|c| train.work.samples(c.train.len(), train.batch_size))
                    .collect();
                system.clock(&samples, config.rounds, layout.total, config.data_seed())?
            }
            None => None,
        };
        let device = device_for(&config.device)?;
        let fairness_clients = {
            let (n, max) = (clients.len(), config.eval.per_client_clients);
            if max == 0 || max >= n {
                (0..n).collect()
            } else {
                let mut rng = stream(config.data_seed(), Purpose::Dataset, 2, 0);
                let mut idx = rand::seq::index::sample(&mut rng, n, max).into_vec();
                idx.sort_unstable();
                idx
            }
        };
        let n_test = data.test.len();
        let test_idx = if config.eval.max_test_samples > 0 && config.eval.max_test_samples < n_test
        {
            let mut rng = stream(config.data_seed(), Purpose::Dataset, 1, 0);
            let mut idx =
                rand::seq::index::sample(&mut rng, n_test, config.eval.max_test_samples).into_vec();
            idx.sort_unstable();
            idx
        } else {
            (0..n_test).collect()
        };
        let test_batches = if train::evaluates_on_host(arch.as_ref(), &data.test, &device) {
            Vec::new()
        } else {
            test_idx
                .chunks(config.eval.batch_size)
                .map(|c| model::batch(&data.test, c, &device))
                .collect()
        };
        Ok(Self {
            config,
            data,
            clients,
            arch,
            layout,
            device,
            test_idx,
            test_batches,
            holdout_sets: OnceLock::new(),
            trace,
            clock,
            fairness_clients,
            fairness_pool: OnceLock::new(),
        })
    }

    /// **Oracle** data-distribution features: on Synthetic data with its natural
    /// partition each client's generating model (W_k, b_k), otherwise its training
    /// label distribution (FedGS's oracle 3DG, FedGS §4.1 and its code).
    pub fn oracle_features(&self) -> Vec<Vec<f64>> {
        use crate::config::PartitionScheme;
        match (&self.data.user_models, &self.config.partition.scheme) {
            (Some(models), PartitionScheme::Natural) => models.clone(),
            _ => self
                .clients
                .iter()
                .map(|c| {
                    let h = self.data.train.histogram(Some(&c.train));
                    let n = c.train.len().max(1) as f64;
                    h.into_iter().map(|x| x as f64 / n).collect()
                })
                .collect(),
        }
    }

    /// What the simulated environment knows of the clients (availability models
    /// such as MDF or YMF depend on it).
    pub fn client_info(&self) -> availability::ClientInfo {
        let labels = self
            .clients
            .iter()
            .map(|c| {
                let mut l: Vec<usize> = c
                    .train
                    .iter()
                    .chain(&c.holdout)
                    .map(|&i| self.data.train.labels[i] as usize)
                    .collect();
                l.sort_unstable();
                l.dedup();
                l
            })
            .collect();
        availability::ClientInfo {
            sizes: self.sizes(),
            labels,
            classes: self.data.train.classes,
        }
    }

    /// `clients.csv`: each client's sizes, dominant label and label entropy (nats) of its
    /// training part. Diagnostics only: selectors never see it.
    pub fn client_summary(&self) -> String {
        let mut out = String::from("client,n_train,n_holdout,dominant_label,label_entropy\n");
        for (k, c) in self.clients.iter().enumerate() {
            let h = self.data.train.histogram(Some(&c.train));
            let dominant = h
                .iter()
                .enumerate()
                .max_by_key(|(i, v)| (**v, std::cmp::Reverse(*i)))
                .map_or(0, |x| x.0);
            let entropy = crate::diagnostics::shannon_entropy(
                &h.iter().map(|&v| v as f64).collect::<Vec<_>>(),
            );
            out.push_str(&format!(
                "{k},{},{},{dominant},{entropy:.6}\n",
                c.train.len(),
                c.holdout.len()
            ));
        }
        out
    }

    /// Training-set size of each client.
    pub fn sizes(&self) -> Vec<usize> {
        self.clients.iter().map(|c| c.train.len()).collect()
    }

    /// The size each client reports to the selector, per `selection.client_size`.
    pub fn reported_sizes(&self) -> Vec<usize> {
        match self.config.selection.client_size {
            ClientSize::Train => self.sizes(),
            ClientSize::Local => self
                .clients
                .iter()
                .map(|c| c.train.len() + c.holdout.len())
                .collect(),
        }
    }

    fn trainer(&self) -> Trainer<'_> {
        Trainer {
            arch: self.arch.as_ref(),
            layout: &self.layout,
            data: &self.data.train,
            cfg: &self.config.train,
            dropout: self.config.model.dropout,
            device: &self.device,
        }
    }

    /// Loss of `params` on each client's held-out part, in parallel.
    pub fn holdout_losses(&self, params: &[f32], clients: &[usize]) -> Vec<Evaluation> {
        let bs = self.config.eval.batch_size;
        clients
            .par_iter()
            .map(|&k| {
                let (data, idx) = self.holdout(k);
                train::evaluate_flat(
                    self.arch.as_ref(),
                    &self.layout,
                    params,
                    data,
                    &idx,
                    bs,
                    &self.device,
                )
            })
            .collect()
    }

    /// The examples client `k`'s held-out loss is measured on, and where they are: its
    /// held-out part, or its training part when it holds none out.
    fn holdout(&self, k: usize) -> (&Dataset, Cow<'_, [usize]>) {
        let c = &self.clients[k];
        if c.holdout.is_empty() {
            return (&self.data.train, Cow::Borrowed(&c.train));
        }
        if !train::evaluates_on_host(self.arch.as_ref(), &self.data.train, &self.device) {
            return (&self.data.train, Cow::Borrowed(&c.holdout));
        }
        let sets = self.holdout_sets.get_or_init(|| {
            self.clients
                .par_iter()
                .map(|c| self.data.train.subset(&c.holdout))
                .collect()
        });
        (&sets[k], Cow::Owned((0..c.holdout.len()).collect()))
    }

    /// Accuracy of `params` on each measured client's held-out part (every client, or the
    /// fixed sample of `eval.per_client_clients`), in client order, leaving out the clients
    /// that hold none out. The simulator's measurement, as LEAF's: no strategy asks for it,
    /// so no cost is booked.
    pub fn client_accuracies(&self, params: &[f32]) -> Vec<f64> {
        let (pool, counts) = self.fairness_pool.get_or_init(|| {
            let holding = self
                .fairness_clients
                .iter()
                .map(|&k| &self.clients[k].holdout)
                .filter(|h| !h.is_empty());
            let counts = holding.clone().map(Vec::len).collect();
            let idx: Vec<usize> = holding.flatten().copied().collect();
            (self.data.train.subset(&idx), counts)
        });
        let all: Vec<usize> = (0..pool.len()).collect();
        let correct = train::correct_flags(
            self.arch.as_ref(),
            &self.layout,
            params,
            pool,
            &all,
            self.config.eval.batch_size,
            &self.device,
        );
        let mut at = 0;
        counts
            .iter()
            .map(|&n| {
                let right = correct[at..at + n].iter().filter(|&&c| c).count();
                at += n;
                right as f64 / n as f64
            })
            .collect()
    }

    /// Loss and accuracy of `params` on the global test set.
    pub fn test(&self, params: &[f32]) -> Evaluation {
        if train::evaluates_on_host(self.arch.as_ref(), &self.data.test, &self.device) {
            let bs = self.config.eval.batch_size;
            return train::evaluate_flat(
                self.arch.as_ref(),
                &self.layout,
                params,
                &self.data.test,
                &self.test_idx,
                bs,
                &self.device,
            );
        }
        let p = self.layout.to_tensors(params, &self.device);
        train::evaluate_batches(self.arch.as_ref(), &p, &self.test_batches)
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

impl Query<'_> {
    /// Adds one query to the round's query phase on the clock: the server waits for the
    /// slowest of its clients' `work` before it goes on.
    fn stage(&mut self, work: impl IntoIterator<Item = (usize, QueryWork)>) {
        if let Some(clock) = &self.exp.clock {
            *self.query_s += clock.stage_s(work);
        }
    }

    /// Local trainings a strategy asks for beyond the round's own (probes, FedGP's extra
    /// step, FedGS's graph building), with their broadcasts and uploads: booked as
    /// `extra_trainings` when they feed the global model, as `probe_trainings` otherwise. They draw
    /// from Probe streams keyed by `key_offset + k` and start without persistent optimizer
    /// state, so they leave the round's own trainings untouched.
    fn train_extra(
        &mut self,
        clients: &[usize],
        key_offset: usize,
        feeds_global: bool,
    ) -> Vec<train::LocalUpdate> {
        let exp = self.exp;
        let trainer = exp.trainer();
        let (seed, t) = (exp.config.seed, self.round as u64);
        let global: &[f32] = self.global;
        let updates: Vec<train::LocalUpdate> = clients
            .par_iter()
            .map(|&k| {
                trainer.train(
                    global,
                    &exp.clients[k].train,
                    self.lr,
                    &mut stream(seed, Purpose::Probe, t, (key_offset + k) as u64),
                    None,
                )
            })
            .collect();
        let m = clients.len() as u64;
        self.ledger.broadcasts += m;
        self.ledger.uploads += m;
        if feeds_global {
            self.ledger.extra_trainings += m;
        } else {
            self.ledger.probe_trainings += m;
        }
        self.ledger.train_steps += updates.iter().map(|u| u.steps as u64).sum::<u64>();
        let batch = exp.config.train.batch_size as u64;
        let work = |u: &train::LocalUpdate| QueryWork::training(u.steps as u64 * batch);
        self.stage(clients.iter().zip(&updates).map(|(&k, u)| (k, work(u))));
        updates
    }

    /// Trains `clients` from the global model and aggregates them by the run's rule (the
    /// mean where the rule needs selector weights, which a probe does not have).
    fn aggregated_delta(
        &mut self,
        clients: &[usize],
        key_offset: usize,
        feeds_global: bool,
    ) -> Vec<f32> {
        let updates = self.train_extra(clients, key_offset, feeds_global);
        let locals: Vec<&[f32]> = updates.iter().map(|u| u.params.as_slice()).collect();
        let rule = match self.rule {
            AggregationRule::Selector => AggregationRule::Mean,
            r => r,
        };
        let w = aggregate::weights(rule, clients, self.sizes, None);
        aggregate::delta(self.global, &locals, &w)
    }

    /// Books the evaluations of `clients` with their broadcasts and scalar reports, and
    /// their stage on the clock, and returns the losses.
    fn booked_losses(&mut self, clients: &[usize], evals: Vec<Evaluation>) -> Vec<f64> {
        let n = evals.len() as u64;
        let ledger = &mut *self.ledger;
        ledger.broadcasts += n;
        ledger.evaluations += n;
        ledger.scalar_reports += n;
        ledger.eval_examples += evals.iter().map(|e| e.examples as u64).sum::<u64>();
        let work = |e: &Evaluation| QueryWork::evaluation(e.examples as u64);
        self.stage(clients.iter().zip(&evals).map(|(&k, e)| (k, work(e))));
        evals.into_iter().map(|e| e.loss).collect()
    }
}

impl ClientQuery for Query<'_> {
    fn holdout_losses(&mut self, clients: &[usize]) -> Result<Vec<f64>> {
        let evals = self.exp.holdout_losses(self.global, clients);
        Ok(self.booked_losses(clients, evals))
    }

    fn minibatch_losses(&mut self, clients: &[usize]) -> Result<Vec<f64>> {
        let exp = self.exp;
        let (seed, bs, t) = (
            exp.config.seed,
            exp.config.train.batch_size,
            self.round as u64,
        );
        let global: &[f32] = self.global;
        let evals: Vec<Evaluation> = clients
            .par_iter()
            .map(|&k| {
                let train = &exp.clients[k].train;
                let mut rng = stream(seed, Purpose::Probe, t, k as u64);
                let idx = rand::seq::index::sample(&mut rng, train.len(), bs.min(train.len()))
                    .into_iter()
                    .map(|i| train[i])
                    .collect::<Vec<_>>();
                let p = exp.layout.to_tensors(global, &exp.device);
                train::evaluate(
                    exp.arch.as_ref(),
                    &p,
                    &exp.data.train,
                    &idx,
                    bs,
                    &exp.device,
                )
            })
            .collect();
        Ok(self.booked_losses(clients, evals))
    }

    fn probe(&mut self, clients: &[usize], evaluate: &[usize]) -> Result<Vec<f64>> {
        let n_clients = self.exp.clients.len();
        let delta = self.aggregated_delta(clients, n_clients, false);
        let probe: Vec<f32> = self.global.iter().zip(&delta).map(|(g, d)| g + d).collect();
        let evals = self.exp.holdout_losses(&probe, evaluate);
        Ok(self.booked_losses(evaluate, evals))
    }

    fn advance(&mut self, clients: &[usize], evaluate: &[usize]) -> Result<Vec<f64>> {
        let n_clients = self.exp.clients.len();
        let delta = self.aggregated_delta(clients, 4 * n_clients, true);
        self.server.step(self.global, &delta);
        if self.global.iter().any(|x| !x.is_finite()) {
            return Err(Error::Diverged {
                round: self.round,
                what: "parameters after the selector's extra training step".into(),
            });
        }
        self.holdout_losses(evaluate)
    }

    fn local_updates(&mut self, clients: &[usize]) -> Result<Vec<Vec<f32>>> {
        let updates = self.train_extra(clients, 2 * self.exp.clients.len(), false);
        Ok(updates
            .into_iter()
            .map(|u| {
                u.params
                    .iter()
                    .zip(self.global.iter())
                    .map(|(x, w)| x - w)
                    .collect()
            })
            .collect())
    }

    fn noise_responses(&mut self, updates: &[Vec<f32>], batch: usize) -> Result<Vec<Vec<f64>>> {
        let exp = self.exp;
        let test = &exp.data.test;
        let (shape, values) = match &test.inputs {
            data::Inputs::Dense { shape, values } => (shape, values),
            data::Inputs::Tokens { .. } => {
                return Err(ConfigError::invalid(
                    "selection.fedgs.graph",
                    "functional similarity needs real-valued inputs; token data has none",
                )
                .into());
            }
        };
        let dim: usize = shape.iter().product();
        let reference = &values[..(batch * dim).min(values.len())];
        let count = reference.len().max(1) as f64;
        let mean = reference.iter().map(|&v| v as f64).sum::<f64>() / count;
        let var = reference
            .iter()
            .map(|&v| (v as f64 - mean).powi(2))
            .sum::<f64>()
            / count;
        let normal = rand_distr::Normal::new(mean, var.sqrt().max(1e-12))
            .expect("finite mean and positive std");
        let mut rng = stream(exp.config.seed, Purpose::Probe, self.round as u64, u64::MAX);
        let noise: Vec<f32> = (0..batch * dim)
            .map(|_| rand_distr::Distribution::sample(&normal, &mut rng) as f32)
            .collect();
        let x = Tensor::<2>::from_data(
            burn::tensor::TensorData::new(noise, [batch, dim]),
            &exp.device,
        );
        Ok(updates
            .par_iter()
            .map(|u| {
                let m: Vec<f32> = self.global.iter().zip(u).map(|(w, d)| w + d).collect();
                let p = exp.layout.to_tensors(&m, &exp.device);
                let logits = exp.arch.forward(&p, model::Batch::Dense(x.clone()), None);
                let mean: Vec<f32> = logits
                    .mean_dim(0)
                    .into_data()
                    .try_into_vec::<f32>()
                    .expect("f32 logits");
                mean.into_iter().map(f64::from).collect()
            })
            .collect())
    }

    fn gradients(&mut self, clients: &[usize], scope: GradientScope) -> Result<Vec<Vec<f32>>> {
        let exp = self.exp;
        let trainer = exp.trainer();
        let (seed, t, n) = (exp.config.seed, self.round as u64, exp.clients.len());
        let g: Vec<train::Gradient> = clients
            .par_iter()
            .map(|&k| {
                trainer.gradient(
                    self.global,
                    &exp.clients[k].train,
                    scope,
                    &mut stream(seed, Purpose::Probe, t, (3 * n + k) as u64),
                )
            })
            .collect();
        let m = clients.len() as u64;
        self.ledger.broadcasts += m;
        self.ledger.gradients += m;
        self.ledger.gradient_examples += g.iter().map(|g| g.examples as u64).sum::<u64>();
        self.ledger.uploads += m;
        let work = |g: &train::Gradient| QueryWork::training(g.examples as u64);
        self.stage(clients.iter().zip(&g).map(|(&k, g)| (k, work(g))));
        Ok(g.into_iter().map(|g| g.values).collect())
    }

    fn secure_gram(&mut self, clients: &[usize]) -> Result<Vec<Vec<f64>>> {
        // The features stay on the client side of this simulation: only the
        // protocol's outputs reach the selector.
        let features = self.exp.oracle_features();
        let (seed, t) = (self.exp.config.seed, self.round as u64);
        let m = clients.len();
        let mut gram = vec![vec![0.0; m]; m];
        for i in 0..m {
            let a = &features[clients[i]];
            gram[i][i] = a.iter().map(|x| x * x).sum();
            for j in i + 1..m {
                let key = (clients[i] * features.len() + clients[j]) as u64;
                let (p, _) = crate::sspp::scalar_product(
                    a,
                    &features[clients[j]],
                    &mut stream(seed, Purpose::Strategy, t, key),
                    &mut stream(seed, Purpose::Probe, t, key),
                );
                gram[i][j] = p;
                gram[j][i] = p;
                self.ledger.protocol_messages += crate::sspp::MESSAGES_PER_PRODUCT;
            }
        }
        self.ledger.scalar_reports += m as u64;
        Ok(gram)
    }
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
        let availability::RoundAvailability { mut active, budget } = run.available(t);
        let fedbuff = run.fedbuff();
        if fedbuff.is_some() {
            run.not_in_flight(&mut active);
        }
        let ctx = RoundContext {
            round: t,
            available: &active,
            budget: match fedbuff {
                Some((c, k)) => {
                    clock::fedbuff_budget(c, k, run.book.flights.len()).min(active.len())
                }
                None => run.selection_budget(budget, active.len()),
            },
            clock_s: exp.clock.is_some().then_some(run.start_s),
        };
        let planned = run.select(&ctx, lr, &mut cost);
        let mut assessed = None;
        let trained = planned.as_ref().ok().map(|p| {
            let orders = p.orders.as_deref();
            run.train(t, lr, &p.selection.clients, orders, &mut cost, || {
                assessed = pending
                    .as_ref()
                    .map(|(global, r)| assess(exp, global, r.round));
            })
        });
        // The last round is recorded before this one's error, if any, is returned.
        if let Some((global, mut record)) = pending.take() {
            let assessment = assessed.unwrap_or_else(|| assess(exp, &global, record.round));
            record.elapsed_s = started.elapsed().as_secs_f64();
            run.log(record, Some(assessment), observer)?;
        }
        let selection = planned?.selection;
        let mut trained = trained.expect("trained when selected");
        let train_loss = trained.mean_loss();
        let (reported, trained, clock) = match fedbuff {
            Some((_, k)) => {
                let (reported, trained, clock) =
                    run.buffer(t, &selection, trained, k, &mut cost)?;
                (Cow::Owned(reported), trained, clock)
            }
            None => {
                let timing = run.time(&selection.clients, &mut trained, budget);
                let stale = run.fold_stale(t, &selection.clients, timing.as_ref(), &mut cost);
                run.aggregate(t, &selection, &trained, timing.as_ref(), &stale)?;
                run.keep_late(t, &selection, &trained);
                let (reported, trained, mut clock) =
                    run.on_time(t, &selection.clients, trained, timing, &mut cost)?;
                if let Some(c) = &mut clock
                    && run.stale().is_some()
                {
                    c.stale = Some(staleness(stale.iter().map(|(_, tau)| *tau)));
                }
                (reported, trained, clock)
            }
        };
        if t + 1 == cfg.rounds {
            // Updates still late or in flight when the run ends were never used.
            cost.wasted_trainings += run.book.unused() as u64;
        }
        run.feedback(t, &reported, trained)?;
        let mut record = RoundRecord {
            round: t,
            test_acc: None,
            test_loss: None,
            client_acc: None,
            train_loss,
            n_selected: selection.clients.len(),
            n_available: active.len(),
            budget,
            lr,
            cost,
            elapsed_s: 0.0,
            selected: selection.clients,
            available: active,
            clock,
        };
        run.book(&record);
        let assessment = if !run.evaluates(t) {
            None
        } else if t + 1 < cfg.rounds && !run.checkpoint_due(t) {
            pending = Some((run.global.clone(), record));
            continue;
        } else {
            Some(assess(exp, &run.global, t))
        };
        record.elapsed_s = started.elapsed().as_secs_f64();
        run.log(record, assessment, observer)?;
        run.checkpoint(t, observer)?;
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

/// Client `k`'s sample-selection pass of round `t` ([`select::SampleRule`]): the loss of the
/// received model `global` on each of its training examples (in batches of the evaluation
/// batch size), handed to the rule with the client's device and its own stream (Probe,
/// keyed 5N + k, apart from every other query's).
fn sample_pass(
    exp: &Experiment,
    rule: &dyn select::SampleRule,
    global: &[f32],
    t: usize,
    k: usize,
) -> select::SampleChoice {
    let losses = train::example_losses(
        exp.arch.as_ref(),
        &exp.layout,
        global,
        &exp.data.train,
        &exp.clients[k].train,
        exp.config.eval.batch_size,
        &exp.device,
    );
    let batch_size = exp.config.train.batch_size;
    let device = exp.clock.as_ref().map(|c| {
        let work = |inference_samples, training_samples| QueryWork {
            transfers: 0,
            inference_samples,
            training_samples,
        };
        select::DeviceTiming {
            batch_s: c.query_s(k, work(0, batch_size as u64)),
            sample_inference_s: c.query_s(k, work(1, 0)),
            transfer_s: c.transfer_s(k),
        }
    });
    let key = (5 * exp.clients.len() + k) as u64;
    let mut rng = stream(exp.config.seed, Purpose::Probe, t as u64, key);
    let (epochs, fixed_steps) = match exp.config.train.work {
        LocalWork::Epochs(e) => (Some(e), 0),
        LocalWork::Steps(s) => (None, s),
    };
    let plan = select::ClientPlan {
        epochs,
        fixed_steps,
        batch_size,
        device,
    };
    rule.choose(k, &losses, &plan, &mut rng)
}

/// Gives weight 0 in `w` to each model of `models`, as (index in `w`, client, model),
/// that holds a non-finite value (F3AST's code, TFF's `zero_all_if_any_non_finite`),
/// logging each drop, and returns how many models it was given; when it was given some and
/// dropped them all, the round has nothing to aggregate and the run has diverged.
fn check_finite<'m>(
    t: usize,
    models: impl Iterator<Item = (usize, usize, &'m [f32])>,
    w: &mut [f64],
) -> Result<usize> {
    let (mut given, mut dropped) = (0, 0);
    for (i, client, x) in models {
        given += 1;
        if x.iter().any(|v| !v.is_finite()) {
            tracing::warn!(
                "round {t}: client {client} sent a non-finite model; dropped with weight 0"
            );
            w[i] = 0.0;
            dropped += 1;
        }
    }
    if given > 0 && dropped == given {
        return Err(Error::Diverged {
            round: t,
            what: "every local model of the round".into(),
        });
    }
    Ok(given)
}

/// Mini-batch steps of a client of `n` training examples under `train.work`.
fn client_steps(cfg: &TrainConfig, n: usize) -> usize {
    let batch = cfg.batch_size.max(1);
    (cfg.work.samples(n, batch) / batch as u64) as usize
}

/// What each client reports of its device when it registers ([`DeviceReport`]).
fn device_reports(exp: &Experiment, clock: &Clock) -> Vec<DeviceReport> {
    let cfg = &exp.config.train;
    let batch = cfg.batch_size.max(1);
    exp.clients
        .iter()
        .enumerate()
        .map(|(k, c)| {
            let n = c.train.len();
            DeviceReport {
                download_s: clock.transfer_s(k),
                compute_s: clock.compute_s(k, cfg.work.samples(n, batch)),
                upload_s: clock.transfer_s(k),
                steps: client_steps(cfg, n),
                epoch_steps: n.div_ceil(batch),
                batch,
            }
        })
        .collect()
}

/// Checks a selector's orders: one per entry, work finite and > 0, dropout rates in
/// [0, 1), and the same order on every entry of one client (its entries share a training).
fn check_orders(clients: &[usize], orders: &[ClientOrder]) -> std::result::Result<(), String> {
    if orders.len() != clients.len() {
        return Err(format!(
            "gave {} orders for {} selected clients",
            orders.len(),
            clients.len()
        ));
    }
    for (i, (&k, o)) in clients.iter().zip(orders).enumerate() {
        if !(o.work.is_finite() && o.work > 0.0) {
            return Err(format!(
                "ordered client {k} a work of {}, not finite and > 0",
                o.work
            ));
        }
        if let Some(d) = o.dropout
            && !(0.0..1.0).contains(&d.rate())
        {
            return Err(format!(
                "ordered client {k} an upload dropout of {}, outside [0, 1)",
                d.rate()
            ));
        }
        if let Some(j) = clients[..i].iter().position(|&c| c == k)
            && orders[j] != *o
        {
            return Err(format!("gave client {k}'s entries different orders"));
        }
    }
    Ok(())
}

/// Drops part of a trained model's update before upload ([`UploadDropout`]): each dropped
/// coordinate of `params` is set back to the broadcast `global`'s value, so the server
/// aggregates it as no change. Returns how many coordinates were dropped.
fn drop_upload(
    params: &mut [f32],
    global: &[f32],
    layout: &ParamLayout,
    dropout: UploadDropout,
    rng: &mut crate::rng::Rng,
) -> usize {
    match dropout {
        UploadDropout::Smallest(f) => {
            let n = (f * params.len() as f64).floor() as usize;
            let mut order: Vec<usize> = (0..params.len()).collect();
            let change = |i: usize| (params[i] - global[i]).abs();
            order.sort_by(|&a, &b| change(a).total_cmp(&change(b)).then(a.cmp(&b)));
            for &i in &order[..n] {
                params[i] = global[i];
            }
            n
        }
        UploadDropout::Layers(p) => {
            use rand::Rng as _;
            let mut dropped = 0;
            for i in 0..layout.specs.len() {
                // The code keeps a tensor when its draw is at least the ratio.
                if rng.random::<f64>() < p {
                    let r = layout.range(i);
                    dropped += r.len();
                    params[r.clone()].copy_from_slice(&global[r]);
                }
            }
            dropped
        }
    }
}

/// The items of the entries the round policy `kept`, in entry order.
fn kept_entries<T>(items: Vec<T>, kept: &[bool]) -> Vec<T> {
    items
        .into_iter()
        .zip(kept)
        .filter_map(|(x, &k)| k.then_some(x))
        .collect()
}

/// The aggregation weights of the entries the round policy `kept`, computed over those
/// alone (so the mean and data-size rules weigh the arrivals among themselves; a
/// selector's own weights are kept as given), and 0 for the others.
fn kept_weights(
    rule: AggregationRule,
    selection: &select::Selection,
    sizes: &[usize],
    kept: &[bool],
) -> Vec<f64> {
    let entries: Vec<usize> = (0..kept.len()).filter(|&i| kept[i]).collect();
    let clients: Vec<usize> = entries.iter().map(|&i| selection.clients[i]).collect();
    let own: Option<Vec<f64>> = selection
        .weights
        .as_ref()
        .map(|w| entries.iter().map(|&i| w[i]).collect());
    let mut w = vec![0.0; kept.len()];
    for (&i, x) in entries
        .iter()
        .zip(aggregate::weights(rule, &clients, sizes, own.as_deref()))
    {
        w[i] = x;
    }
    w
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

impl Trained {
    /// The update of selected client `k`.
    fn of(&self, k: usize) -> &train::LocalUpdate {
        let i = self
            .distinct
            .binary_search(&k)
            .expect("selected clients are in `distinct`");
        &self.updates[i]
    }

    /// The fraction of selected client `k`'s update that it uploaded.
    fn sent_of(&self, k: usize) -> f64 {
        let i = self
            .distinct
            .binary_search(&k)
            .expect("selected clients are in `distinct`");
        self.sent[i]
    }

    /// Seconds selected client `k` spent on its sample-selection pass (one forward pass
    /// per example), or `None` when it ran none.
    fn pass_s(&self, clock: &Clock, k: usize) -> Option<f64> {
        let i = self
            .distinct
            .binary_search(&k)
            .expect("selected clients are in `distinct`");
        let n = *self.inferred.get(i)?;
        (n > 0).then(|| {
            clock.query_s(
                k,
                QueryWork {
                    transfers: 0,
                    inference_samples: n,
                    training_samples: 0,
                },
            )
        })
    }

    /// Mean training loss over the selection's entries, duplicates counted as selected.
    fn mean_loss(&self) -> f64 {
        self.losses.iter().sum::<f64>() / self.losses.len().max(1) as f64
    }
}

impl<'a> Run<'a> {
    /// Sets the selector up and builds the environment, starting from the initial model.
    fn new(exp: &'a Experiment, mut selector: Box<dyn select::Selector>) -> Result<Self> {
        let cfg = &exp.config;
        let seed = cfg.seed;
        let n = exp.clients.len();
        let sizes = exp.sizes();
        let reported = exp.reported_sizes();
        let total: f64 = reported.iter().sum::<usize>() as f64;
        let per_round = cfg.selection.per_round(n);
        let needs = selector.needs();
        selector.setup(&Setup {
            weights: reported.iter().map(|&s| s as f64 / total).collect(),
            sizes: reported,
            per_round,
            rounds: cfg.rounds,
            num_params: exp.layout.total,
            classes: exp.data.train.classes,
            oracle_label_histograms: needs.oracle_label_histograms.then(|| {
                exp.clients
                    .iter()
                    .map(|c| exp.data.train.histogram(Some(&c.train)))
                    .collect()
            }),
            oracle_features: needs.oracle_features.then(|| exp.oracle_features()),
            durations: exp.clock.as_ref().map(|clock| {
                let (work, batch) = (cfg.train.work, cfg.train.batch_size);
                exp.clients
                    .iter()
                    .enumerate()
                    .map(|(k, c)| clock.finish_s(k, work.samples(c.train.len(), batch)))
                    .collect()
            }),
        });
        if let Some(clock) = &exp.clock {
            selector.register_devices(&device_reports(exp, clock));
        }
        let env = availability::Environment::new(
            &cfg.availability,
            &cfg.budget,
            per_round,
            &exp.client_info(),
            seed,
            exp.trace.as_ref(),
        )?;
        let name = selector.name();
        let rule = match cfg.server.aggregation {
            AggregationRule::Auto => select::own_aggregation(name),
            r => r,
        };
        if let Some(warning) = select::aggregation_override(rule, name) {
            tracing::warn!("{warning}");
        }
        let summary = RunSummary {
            strategy: name.into(),
            seed,
            rounds: 0,
            final_acc: None,
            final_loss: None,
            best_acc: None,
            best_acc_round: 0,
            best_loss: None,
            rounds_to_target: cfg.targets.iter().map(|&t| (t, None)).collect(),
            diverged_at: None,
            wall_s: 0.0,
            cost: Ledger::default(),
            version: crate::VERSION.into(),
            cpu: crate::cpu::isa().name().into(),
            commit: crate::build_commit(),
            clock: exp.clock.as_ref().map(|_| ClockSummary {
                clock_s: 0.0,
                time_to_target_s: cfg.targets.iter().map(|&t| (t, None)).collect(),
                wasted_trainings: 0,
                rounds_without_updates: 0,
            }),
        };
        Ok(Run {
            exp,
            selector,
            needs,
            env,
            trainer: exp.trainer(),
            rule,
            sizes,
            config_hash: cfg.hash(),
            global: {
                let mut g = exp.layout.init(seed);
                if cfg.model.zero_bias {
                    g[exp.layout.output_bias()].fill(0.0);
                }
                g
            },
            server: Server::new(&cfg.server),
            states: vec![None; n],
            query_s: 0.0,
            summary,
            start_s: 0.0,
            book: InFlight::default(),
            fresh_late: Vec::new(),
            broadcast_s: 0.0,
            idle_rounds: 0,
        })
    }

    /// Replaces the initial state with a checkpoint's; returns the round to continue from.
    fn restore(&mut self, cp: Checkpoint) -> Result<usize> {
        check_resumable(&self.exp.config, &cp)?;
        self.selector.load(&cp.selector)?;
        self.global = cp.global;
        self.server = Server::with_moments(&self.exp.config.server, cp.server_m, cp.server_v);
        self.states = cp.client_states;
        self.summary = cp.summary;
        self.book = cp.in_flight;
        self.summary
            .resumed_on(crate::cpu::isa().name(), &crate::build_commit());
        Ok(cp.next_round)
    }

    /// The selector's initial phase (FedCor's warm-up, FedGS's graph), with every client
    /// reachable; its costs go to `cost`.
    fn initial_phase(&mut self, cost: &mut Ledger) -> Result<()> {
        let all: Vec<usize> = (0..self.exp.clients.len()).collect();
        let lr = self
            .exp
            .config
            .train
            .schedule
            .rate(self.exp.config.train.lr, 0);
        self.with_query(0, lr, &all, cost, |selector, query| {
            selector.initial_phase(query)
        })
    }

    /// Lets the selector act on a query of round `t` that reaches only `available` and
    /// books to `cost`: the one way its initial phase and its selections see clients.
    fn with_query<T>(
        &mut self,
        t: usize,
        lr: f64,
        available: &[usize],
        cost: &mut Ledger,
        act: impl FnOnce(&mut dyn select::Selector, &mut dyn ClientQuery) -> Result<T>,
    ) -> Result<T> {
        let name = self.selector.name();
        let mut query = Query {
            exp: self.exp,
            global: &mut self.global,
            server: &mut self.server,
            rule: self.rule,
            ledger: cost,
            query_s: &mut self.query_s,
            round: t,
            lr,
            sizes: &self.sizes,
        };
        act(
            self.selector.as_mut(),
            &mut AvailableOnly {
                inner: &mut query,
                available,
                selector: name,
                round: t,
            },
        )
    }

    /// Asks the selector for the round's clients and orders, answering its queries, and
    /// checks that it chose only available clients, under the `selector` rule gave their
    /// weights, and gave valid orders ([`check_orders`]).
    fn select(&mut self, ctx: &RoundContext, lr: f64, cost: &mut Ledger) -> Result<Planned> {
        let t = ctx.round;
        let name = self.selector.name();
        let seed = self.exp.config.seed;
        let planned = self.with_query(t, lr, ctx.available, cost, |selector, query| {
            selector.plan(
                ctx,
                query,
                &mut stream(seed, Purpose::Selection, t as u64, 0),
            )
        })?;
        let selection = &planned.selection;
        if let Some(orders) = &planned.orders {
            check_orders(&selection.clients, orders).map_err(|reason| Error::Selection {
                selector: name.into(),
                round: t,
                reason,
            })?;
        }
        if let Some(&k) = selection
            .clients
            .iter()
            .find(|k| ctx.available.binary_search(k).is_err())
        {
            return Err(Error::Selection {
                selector: name.into(),
                round: t,
                reason: format!("chose client {k}, which is not available"),
            });
        }
        if self.rule == AggregationRule::Selector
            && selection.weights.as_ref().map(Vec::len) != Some(selection.clients.len())
        {
            return Err(Error::Selection {
                selector: name.into(),
                round: t,
                reason: "the `selector` aggregation rule needs one weight per selected client"
                    .into(),
            });
        }
        Ok(planned)
    }

    /// Broadcasts the global model and trains: each distinct client trains once, in
    /// parallel, and duplicates share its update. `beside` (the last round's evaluation)
    /// runs in the same pool, queued after the trainings: a client's training cannot be
    /// split and the evaluation can, so the threads take the trainings first, in client
    /// order, and whichever runs out of them first moves on to the evaluation, which the
    /// other joins when its last training ends.
    ///
    /// A client with an order ([`ClientOrder`]) trains its ordered steps and drops what it
    /// was told to from its upload.
    fn train(
        &mut self,
        t: usize,
        lr: f64,
        selected: &[usize],
        orders: Option<&[ClientOrder]>,
        cost: &mut Ledger,
        beside: impl FnOnce() + Send,
    ) -> Trained {
        let seed = self.exp.config.seed;
        let mut distinct = selected.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        let order_of = |k: usize| {
            orders.map_or(ClientOrder::FULL, |o| {
                o[selected
                    .iter()
                    .position(|&s| s == k)
                    .expect("a selected client")]
            })
        };
        let distinct_orders: Vec<ClientOrder> = distinct.iter().map(|&k| order_of(k)).collect();
        // The work of a client told to train more or less, as steps of its own.
        let works: Vec<Option<TrainConfig>> = distinct
            .iter()
            .zip(&distinct_orders)
            .map(|(&k, o)| self.ordered_work(k, o.work))
            .collect();
        let taken: Vec<Option<OptimizerState>> =
            distinct.iter().map(|&k| self.states[k].take()).collect();
        let (exp, trainer, global) = (self.exp, &self.trainer, &self.global);
        let rule = self.selector.sample_rule();
        let rule = rule.as_deref();
        let mut slots: Vec<Option<(train::LocalUpdate, Option<Vec<f64>>)>> =
            distinct.iter().map(|_| None).collect();
        rayon::scope_fifo(|s| {
            for (((slot, &k), state), work) in
                slots.iter_mut().zip(&distinct).zip(taken).zip(&works)
            {
                s.spawn_fifo(move |_| {
                    let mut rng = stream(seed, Purpose::Training, t as u64, k as u64);
                    let trainer = match work {
                        Some(cfg) => Trainer { cfg, ..*trainer },
                        None => *trainer,
                    };
                    let own = &exp.clients[k].train;
                    *slot = Some(match rule {
                        None => (trainer.train(global, own, lr, &mut rng, state), None),
                        Some(rule) => {
                            let choice = sample_pass(exp, rule, global, t, k);
                            let idx: Vec<usize> = choice.keep.iter().map(|&i| own[i]).collect();
                            let u = trainer.train(global, &idx, lr, &mut rng, state);
                            (u, Some(choice.report))
                        }
                    });
                });
            }
            s.spawn_fifo(|_| beside());
        });
        let (mut updates, reports): (Vec<train::LocalUpdate>, Vec<Option<Vec<f64>>>) = slots
            .into_iter()
            .map(|u| u.expect("every training ran in the scope"))
            .unzip();
        let total = self.global.len();
        let mut sent = vec![1.0; distinct.len()];
        for (i, (&k, o)) in distinct.iter().zip(&distinct_orders).enumerate() {
            if let Some(dropout) = o.dropout {
                let mut rng = stream(seed, Purpose::Upload, t as u64, k as u64);
                let layout = &self.exp.layout;
                let dropped =
                    drop_upload(&mut updates[i].params, global, layout, dropout, &mut rng);
                cost.dropped_params += dropped as u64;
                sent[i] = (total - dropped) as f64 / total as f64;
            }
        }
        let d = distinct.len() as u64;
        cost.broadcasts += d;
        cost.uploads += d;
        cost.trainings += d;
        cost.train_steps += updates.iter().map(|u| u.steps as u64).sum::<u64>();
        let inferred: Vec<u64> = match rule {
            Some(_) => distinct
                .iter()
                .map(|&k| exp.clients[k].train.len() as u64)
                .collect(),
            None => Vec::new(),
        };
        cost.sample_examples += inferred.iter().sum::<u64>();
        cost.scalar_reports += reports
            .iter()
            .flatten()
            .map(|r| r.len() as u64)
            .sum::<u64>();
        let mut trained = Trained {
            distinct,
            updates,
            sent,
            losses: Vec::new(),
            deltas: None,
            durations: None,
            dropped: None,
            samples: None,
            inferred,
        };
        trained.losses = selected.iter().map(|&k| trained.of(k).mean_loss).collect();
        if rule.is_some() {
            trained.samples = Some(
                selected
                    .iter()
                    .map(|&k| {
                        let i = trained.distinct.binary_search(&k).expect("selected");
                        reports[i].clone().unwrap_or_default()
                    })
                    .collect(),
            );
        }
        trained.deltas = (self.needs.updates != UpdateKind::None).then(|| {
            selected
                .iter()
                .map(|&k| self.delta(&trained.of(k).params))
                .collect()
        });
        trained
    }

    /// The training settings of client `k` told to do `work` times its own local work
    /// ([`ClientOrder::work`]): ⌊E·`work`⌋ steps, at least one, E being its steps under
    /// `train.work`. `None` for `work` = 1, the run's own settings, and for a client with
    /// no steps to scale (no training examples under epochs). Steps over its data
    /// reshuffle at each pass as epochs do, so E steps of an epoch-based run are its epochs.
    fn ordered_work(&self, k: usize, work: f64) -> Option<TrainConfig> {
        let cfg = &self.exp.config.train;
        let base = client_steps(cfg, self.exp.clients[k].train.len());
        if work == 1.0 || base == 0 {
            return None;
        }
        let steps = ((base as f64 * work).floor() as usize).max(1);
        Some(TrainConfig {
            work: LocalWork::Steps(steps),
            ..cfg.clone()
        })
    }

    /// `[system.stale]`, when the run folds late updates.
    fn stale(&self) -> Option<StaleConfig> {
        self.exp.config.system.as_ref().and_then(|s| s.stale)
    }

    /// Availability and budget of round `t`, and when it starts on the clock: with a
    /// behave trace, only the clients online then are available.
    fn available(&mut self, t: usize) -> availability::RoundAvailability {
        let mut round = self.env.round(t);
        if let (Some(clock), Some(total)) = (&self.exp.clock, &self.summary.clock) {
            (self.start_s, round.active) = clock.online(total.clock_s, round.active);
        }
        round
    }

    /// The budget the selector is given for a round of budget `k` with `available` clients:
    /// `k`, or more under over-commitment.
    fn selection_budget(&self, k: usize, available: usize) -> usize {
        self.exp
            .clock
            .as_ref()
            .map_or(k, |c| c.selection_budget(k, available))
    }

    /// Each selection entry's finish time on the virtual clock (its client's steps × batch
    /// samples, from the training broadcast), and the round policy's verdict for a round of
    /// budget `k` after the selector's query phase. `None` without a clock.
    /// The entries the policy discards are recorded in `trained` with the censored bound
    /// on their durations: the round's length after its query phase, when it closed.
    fn time(&mut self, selected: &[usize], trained: &mut Trained, k: usize) -> Option<RoundTiming> {
        let query_s = std::mem::take(&mut self.query_s);
        let clock = self.exp.clock.as_ref()?;
        let batch = self.exp.config.train.batch_size as u64;
        let finish: Vec<f64> = selected
            .iter()
            .map(|&c| {
                let samples = trained.of(c).steps as u64 * batch;
                let f = clock.finish_sending_s(c, samples, trained.sent_of(c));
                trained.pass_s(clock, c).map_or(f, |p| p + f)
            })
            .collect();
        self.broadcast_s = self.start_s + query_s;
        let own_deadline = self.selector.round_deadline_s();
        let mut timing = match (clock.policy(), own_deadline) {
            (RoundPolicy::Deadline { .. }, Some(deadline_s)) => {
                let arrives = clock.arrives(self.start_s, query_s, selected, &finish);
                let mut r = clock::deadline(&finish, &arrives, deadline_s);
                r.round_s += query_s;
                r
            }
            _ => clock.round(self.start_s, query_s, selected, &finish, k),
        };
        if selected.is_empty() {
            // Nobody trains: the round lasts until the server's next decision point.
            let deadline = match clock.policy() {
                RoundPolicy::Deadline { deadline_s } => Some(own_deadline.unwrap_or(deadline_s)),
                _ => own_deadline,
            };
            timing.round_s += clock.idle_s(self.broadcast_s, deadline);
        }
        self.fresh_late.clear();
        if self.stale().is_some() {
            let arrives = clock.arrives(self.start_s, query_s, selected, &finish);
            self.fresh_late = (0..selected.len())
                .filter(|&i| arrives[i] && !timing.kept[i])
                .map(|i| (i, self.start_s + query_s + finish[i]))
                .collect();
        }
        let closed_s = (timing.round_s - query_s).max(0.0);
        let dropped: Vec<usize> = selected
            .iter()
            .zip(&timing.kept)
            .filter(|(_, kept)| !**kept)
            .map(|(&c, _)| c)
            .collect();
        let bounds = vec![closed_s; dropped.len()];
        trained.dropped = Some((dropped, bounds));
        Some(timing)
    }

    /// The entries the selector hears of, and the round on the clock: updates the round
    /// policy discarded are not reported (the server never used them), though their clients
    /// keep the optimizer state of the training they did, and the trainings wasted are
    /// booked in `cost`. Without a clock, every entry. A round whose time the clock cannot
    /// count (durations whose sum overflows) is a config error naming the round.
    fn on_time<'s>(
        &self,
        t: usize,
        selected: &'s [usize],
        mut trained: Trained,
        timing: Option<RoundTiming>,
        cost: &mut Ledger,
    ) -> Result<(Cow<'s, [usize]>, Trained, Option<RoundClock>)> {
        let (Some(timing), Some(total)) = (timing, &self.summary.clock) else {
            return Ok((Cow::Borrowed(selected), trained, None));
        };
        let kept = &timing.kept;
        // Under `[system.stale]` a late update is not wasted yet: it is booked when it is
        // folded (`stale_trainings`) or expires (wasted then).
        cost.wasted_trainings += trained
            .distinct
            .iter()
            .filter(|&&c| !selected.iter().zip(kept).any(|(&s, &k)| k && s == c))
            .filter(|&&c| !self.fresh_late.iter().any(|&(i, _)| selected[i] == c))
            .count() as u64;
        let aggregated = kept.iter().filter(|&&k| k).count();
        trained.losses = kept_entries(std::mem::take(&mut trained.losses), kept);
        trained.deltas = trained.deltas.take().map(|d| kept_entries(d, kept));
        trained.samples = trained.samples.take().map(|s| kept_entries(s, kept));
        trained.durations = Some(kept_entries(timing.finish, kept));
        // A wait for someone to come online (a behave trace) is part of the round.
        let round_s = (self.start_s - total.clock_s) + timing.round_s;
        let clock_s = total.clock_s + round_s;
        if !(round_s.is_finite() && clock_s.is_finite()) {
            return Err(ConfigError::invalid(
                "system",
                format!(
                    "round {t} lasts {round_s:e} virtual seconds and ends at {clock_s:e}: the \
                     clock cannot count it (its devices, query stages and behave trace waits add \
                     up past f64); lower system.augmentation, the devices' times or `rounds`"
                ),
            )
            .into());
        }
        let clock = RoundClock {
            round_s,
            clock_s,
            aggregated,
            stale: None,
        };
        Ok((
            Cow::Owned(kept_entries(selected.to_vec(), kept)),
            trained,
            Some(clock),
        ))
    }

    /// A local model minus the global one, over the part the selector asked for.
    fn delta(&self, local: &[f32]) -> Vec<f32> {
        let diff = |r: std::ops::Range<usize>| {
            local[r.clone()]
                .iter()
                .zip(&self.global[r])
                .map(|(a, b)| a - b)
                .collect::<Vec<f32>>()
        };
        match self.needs.updates {
            UpdateKind::OutputLayer => [
                diff(self.exp.layout.output_bias()),
                diff(self.exp.layout.output_weight()),
            ]
            .concat(),
            _ => diff(0..self.global.len()),
        }
    }

    /// Averages the local models into the global one and takes the server step. A
    /// non-finite local model is dropped with weight 0 (F3AST's code, TFF's
    /// `zero_all_if_any_non_finite`), and the drop is logged. On the clock, only the entries
    /// the round policy kept are aggregated, weighted among themselves.
    fn aggregate(
        &mut self,
        t: usize,
        selection: &select::Selection,
        trained: &Trained,
        timing: Option<&RoundTiming>,
        stale: &[(LateUpdate, usize)],
    ) -> Result<()> {
        let locals: Vec<&[f32]> = selection
            .clients
            .iter()
            .map(|&k| trained.of(k).params.as_slice())
            .collect();
        let kept = timing.map(|r| r.kept.as_slice());
        if !stale.is_empty() {
            return self.aggregate_with_stale(t, selection, locals, kept, stale);
        }
        let mut w = match kept {
            None => aggregate::weights(
                self.rule,
                &selection.clients,
                &self.sizes,
                selection.weights.as_deref(),
            ),
            Some(kept) => kept_weights(self.rule, selection, &self.sizes, kept),
        };
        let live = check_finite(
            t,
            locals
                .iter()
                .enumerate()
                .filter(|(i, _)| kept.is_none_or(|k| k[*i]))
                .map(|(i, x)| (i, selection.clients[i], *x)),
            &mut w,
        )?;
        // A round with nobody selected (an empty trace round, K_t = 0) or no update in
        // time leaves the model alone.
        if live > 0 {
            let delta = aggregate::delta(&self.global, &locals, &w);
            self.step(t, &delta)?;
        }
        Ok(())
    }

    /// Takes the server step with the aggregated `delta`; parameters that are no longer
    /// finite end the run.
    fn step(&mut self, t: usize, delta: &[f32]) -> Result<()> {
        self.server.step(&mut self.global, delta);
        if self.global.iter().any(|x| !x.is_finite()) {
            return Err(Error::Diverged {
                round: t,
                what: "parameters after aggregation".into(),
            });
        }
        Ok(())
    }

    /// The aggregation of a round that folds late updates (`[system.stale]`): the kept
    /// entries and the folded updates weighted by the run's rule over all of them (the
    /// mean and data-size rules renormalised over them; a selector's weights as given, a
    /// late update's from its own round), each folded one's weight times REFL's staleness
    /// factor ([`clock::stale_factors`]), and the mean and data-size weights normalised
    /// again to sum to 1, as REFL's `normalize_importance` divides by the importances' sum
    /// (ahmedcs/REFL @ aa7e642, `core/aggregator.py` lines 1162-1175). The late model
    /// enters as a model, Δ = Σ w (x − w_now), as REFL averages models (its
    /// `send_delta` is off by default, `core/argParser.py` line 43).
    fn aggregate_with_stale(
        &mut self,
        t: usize,
        selection: &select::Selection,
        locals: Vec<&[f32]>,
        kept: Option<&[bool]>,
        stale: &[(LateUpdate, usize)],
    ) -> Result<()> {
        let cfg = self
            .stale()
            .expect("stale updates come with [system.stale]");
        let entries: Vec<usize> = (0..locals.len())
            .filter(|&i| kept.is_none_or(|k| k[i]))
            .collect();
        let mut clients: Vec<usize> = entries.iter().map(|&i| selection.clients[i]).collect();
        clients.extend(stale.iter().map(|(u, _)| u.client));
        let own: Option<Vec<f64>> = (self.rule == AggregationRule::Selector).then(|| {
            entries
                .iter()
                .map(|&i| selection.weights.as_ref().map_or(1.0, |w| w[i]))
                .chain(stale.iter().map(|(u, _)| u.weight.unwrap_or(1.0)))
                .collect()
        });
        let mut w = aggregate::weights(self.rule, &clients, &self.sizes, own.as_deref());
        // REFL's r, over the fresh models' unweighted sum (its importances are 1).
        let n = entries.len();
        let ratio: Vec<f64> = if cfg.stale_factor == -4.0 && n > 0 {
            let mut sum = vec![0f64; self.global.len()];
            for &i in &entries {
                for (a, &x) in sum.iter_mut().zip(locals[i]) {
                    *a += x as f64;
                }
            }
            stale
                .iter()
                .map(|(u, _)| clock::refl_ratio(&sum, n, &u.params))
                .collect()
        } else {
            vec![1.0; stale.len()]
        };
        let taus: Vec<usize> = stale.iter().map(|(_, tau)| *tau).collect();
        let factors = clock::stale_factors(&cfg, &taus, &ratio);
        clock::fold_weights(&mut w, n, &factors, self.rule != AggregationRule::Selector);
        let mut all: Vec<&[f32]> = entries.iter().map(|&i| locals[i]).collect();
        all.extend(stale.iter().map(|(u, _)| u.params.as_slice()));
        check_finite(
            t,
            all.iter().enumerate().map(|(i, x)| (i, clients[i], *x)),
            &mut w,
        )?;
        let delta = aggregate::delta(&self.global, &all, &w);
        self.step(t, &delta)
    }

    /// The late updates round `t` folds or lets expire (`[system.stale]`,
    /// [`clock::stale_due`]), taken out of the waiting list: the folded ones are returned
    /// with their staleness and booked as `stale_trainings`, the expired ones as wasted.
    fn fold_stale(
        &mut self,
        t: usize,
        selected: &[usize],
        timing: Option<&RoundTiming>,
        cost: &mut Ledger,
    ) -> Vec<(LateUpdate, usize)> {
        let (Some(cfg), Some(timing)) = (self.stale(), timing) else {
            return Vec::new();
        };
        let close_s = self.start_s + timing.round_s;
        let fresh = timing.kept.iter().any(|&k| k);
        // A client sent this round's model drops the task it was still on (inflight's doc).
        cost.wasted_trainings += self.book.supersede(selected, self.broadcast_s) as u64;
        let pending: Vec<(usize, f64)> = self
            .book
            .late
            .iter()
            .map(|u| (u.origin, u.arrival_s))
            .collect();
        let (folded, expired) = clock::stale_due(&pending, t, close_s, fresh, cfg.stale_update);
        cost.wasted_trainings += expired.len() as u64;
        cost.stale_trainings += folded.len() as u64;
        let mut tau_of: Vec<Option<usize>> = vec![None; self.book.late.len()];
        for &(i, tau) in &folded {
            tau_of[i] = Some(tau);
        }
        let mut out = Vec::new();
        let mut keep = Vec::new();
        for (i, u) in std::mem::take(&mut self.book.late).into_iter().enumerate() {
            match tau_of[i] {
                Some(tau) => out.push((u, tau)),
                None if expired.contains(&i) => {}
                None => keep.push(u),
            }
        }
        self.book.late = keep;
        out
    }

    /// Puts the round's late entries (set by [`Run::time`]) on the waiting list.
    fn keep_late(&mut self, t: usize, selection: &select::Selection, trained: &Trained) {
        // `fresh_late` stays for `on_time`, which does not book these as wasted.
        for &(i, arrival_s) in &self.fresh_late {
            let client = selection.clients[i];
            self.book.late.push(LateUpdate {
                client,
                origin: t,
                arrival_s,
                params: trained.of(client).params.clone(),
                weight: selection.weights.as_ref().map(|w| w[i]),
            });
        }
    }

    /// FedBuff's concurrency and buffer size, when the run's round policy is FedBuff.
    fn fedbuff(&self) -> Option<(usize, usize)> {
        match self.exp.clock.as_ref()?.policy() {
            RoundPolicy::Fedbuff {
                concurrency,
                buffer_size,
            } => Some((concurrency, buffer_size)),
            _ => None,
        }
    }

    /// Removes the clients training under FedBuff from `active`: a client trains one
    /// update at a time.
    fn not_in_flight(&self, active: &mut Vec<usize>) {
        let busy = self.book.busy();
        active.retain(|k| !busy.contains(k));
    }

    /// One FedBuff round ([`clock::fedbuff_round`]): the selection's trainings (done from
    /// this round's model, version `t`) join the clients in flight, the server waits for
    /// `buffer_size` arrivals and aggregates them, each weighted by the run's rule over the
    /// buffer times 1/√(1 + staleness), not renormalised (FedBuff Alg. 1: Δ̄ = Σ s(τ) Δ / K
    /// under the mean rule), Δ being each update minus the model it trained from; then
    /// the server step. Returns the buffer's clients (what the selector hears of), their
    /// losses, updates and durations, and the round on the clock. An update lost offline
    /// is a wasted training.
    fn buffer(
        &mut self,
        t: usize,
        selection: &select::Selection,
        trained: Trained,
        buffer_size: usize,
        cost: &mut Ledger,
    ) -> Result<(Vec<usize>, Trained, Option<RoundClock>)> {
        let query_s = std::mem::take(&mut self.query_s);
        let exp = self.exp;
        let clock = exp.clock.as_ref().expect("FedBuff runs on a clock");
        let before_s = self.summary.clock.as_ref().map_or(0.0, |c| c.clock_s);
        let batch = exp.config.train.batch_size as u64;
        let free = self
            .fedbuff()
            .map_or(0, |(c, _)| c.saturating_sub(self.book.flights.len()));
        let mut queue = Vec::with_capacity(selection.clients.len());
        for (i, &k) in selection.clients.iter().enumerate() {
            let u = trained.of(k);
            let id = self.book.next_flight;
            self.book.next_flight += 1;
            let delta: Vec<f32> = u
                .params
                .iter()
                .zip(&self.global)
                .map(|(a, b)| a - b)
                .collect();
            self.book.flying.insert(
                id,
                Flying {
                    client: k,
                    delta,
                    loss: trained.losses[i],
                    weight: selection.weights.as_ref().map(|w| w[i]),
                    report: trained.samples.as_ref().map(|s| s[i].clone()),
                },
            );
            let finish = clock.finish_sending_s(k, u.steps as u64 * batch, trained.sent_of(k));
            queue.push((id, trained.pass_s(clock, k).map_or(finish, |p| p + finish)));
        }
        for (k, u) in trained.distinct.iter().zip(trained.updates) {
            self.states[*k] = u.state;
        }
        let InFlight {
            flights, flying, ..
        } = &mut self.book;
        let flying = &*flying;
        let r = clock::fedbuff_round(
            flights,
            &queue,
            free,
            self.start_s + query_s,
            t,
            buffer_size,
            |id, at| clock.online_at(flying[&id].client, at),
        );
        let mut r = r;
        if r.buffer.is_empty() && r.lost.is_empty() {
            // Nobody trains or arrives: the round lasts until the server's next decision.
            r.close_s += clock.idle_s(r.close_s, None);
        }
        cost.wasted_trainings += r.lost.len() as u64;
        for f in &r.lost {
            self.book.flying.remove(&f.id);
        }
        let items: Vec<(Flying, Flight, usize)> = r
            .buffer
            .iter()
            .map(|&(f, s)| {
                (
                    self.book
                        .flying
                        .remove(&f.id)
                        .expect("a buffered update flew"),
                    f,
                    s,
                )
            })
            .collect();
        let clients: Vec<usize> = items.iter().map(|(x, _, _)| x.client).collect();
        let own: Option<Vec<f64>> = (self.rule == AggregationRule::Selector).then(|| {
            items
                .iter()
                .map(|(x, _, _)| x.weight.unwrap_or(1.0))
                .collect()
        });
        let mut w = aggregate::weights(self.rule, &clients, &self.sizes, own.as_deref());
        for (x, (_, _, s)) in w.iter_mut().zip(&items) {
            *x *= clock::fedbuff_weight(*s);
        }
        check_finite(
            t,
            items
                .iter()
                .enumerate()
                .map(|(i, (x, _, _))| (i, x.client, x.delta.as_slice())),
            &mut w,
        )?;
        if !items.is_empty() {
            let mut acc = vec![0f64; self.global.len()];
            for ((x, _, _), &wk) in items.iter().zip(&w).filter(|(_, w)| **w != 0.0) {
                for (a, &d) in acc.iter_mut().zip(&x.delta) {
                    *a += wk * d as f64;
                }
            }
            let delta: Vec<f32> = acc.into_iter().map(|a| a as f32).collect();
            self.step(t, &delta)?;
        }
        let round_s = r.close_s - before_s;
        if !(round_s.is_finite() && r.close_s.is_finite()) {
            return Err(ConfigError::invalid(
                "system",
                format!(
                    "round {t} ends at {:e} virtual seconds: the clock cannot count it",
                    r.close_s
                ),
            )
            .into());
        }
        let stale = staleness(items.iter().map(|(_, _, s)| *s).filter(|&s| s > 0));
        let rc = RoundClock {
            round_s,
            clock_s: r.close_s,
            aggregated: items.len(),
            stale: Some(stale),
        };
        let deltas = (self.needs.updates != UpdateKind::None).then(|| {
            items
                .iter()
                .map(|(x, _, _)| match self.needs.updates {
                    UpdateKind::OutputLayer => [
                        &x.delta[exp.layout.output_bias()],
                        &x.delta[exp.layout.output_weight()],
                    ]
                    .concat(),
                    _ => x.delta.clone(),
                })
                .collect()
        });
        let reported = Trained {
            distinct: Vec::new(),
            updates: Vec::new(),
            sent: Vec::new(),
            losses: items.iter().map(|(x, _, _)| x.loss).collect(),
            deltas,
            durations: Some(
                items
                    .iter()
                    .map(|(_, f, _)| f.arrival_s - f.start_s)
                    .collect(),
            ),
            dropped: Some((Vec::new(), Vec::new())),
            samples: trained.samples.as_ref().map(|_| {
                items
                    .iter()
                    .map(|(x, _, _)| x.report.clone().unwrap_or_default())
                    .collect()
            }),
            inferred: Vec::new(),
        };
        Ok((clients, reported, Some(rc)))
    }

    /// Whether round `t` tests the global model: every `eval.every` rounds and the last.
    fn evaluates(&self, t: usize) -> bool {
        let cfg = &self.exp.config;
        (t + 1).is_multiple_of(cfg.eval.every) || t + 1 == cfg.rounds
    }

    /// Reports the round to the selector and keeps each trained client's optimizer state.
    /// An entry with a non-finite loss or update is not reported ([`guard::observe_usable`]),
    /// as [`Run::aggregate`] gives its model weight 0.
    fn feedback(&mut self, t: usize, selected: &[usize], trained: Trained) -> Result<()> {
        let update_len = match self.needs.updates {
            UpdateKind::None => None,
            UpdateKind::Full => Some(self.global.len()),
            UpdateKind::OutputLayer => {
                Some(self.exp.layout.output_bias().len() + self.exp.layout.output_weight().len())
            }
        };
        let feedback = Feedback {
            round: t,
            selected,
            train_losses: &trained.losses,
            updates: trained.deltas.as_deref(),
            durations: trained.durations.as_deref(),
            dropped: trained
                .dropped
                .as_ref()
                .map(|(clients, at_least_s)| Dropped {
                    clients,
                    at_least_s,
                }),
        };
        for r in guard::observe_usable(self.selector.as_mut(), &feedback, update_len) {
            tracing::warn!(
                "round {t}: client {} (selection entry {}) not reported to the selector: {}",
                r.client,
                r.entry,
                r.reason
            );
        }
        if let Some(reports) = &trained.samples {
            self.selector.observe_samples(t, selected, reports);
        }
        for (k, u) in trained.distinct.iter().zip(trained.updates) {
            self.states[*k] = u.state;
        }
        self.failed()
    }

    /// The error a selector's hook without a result raised, if any
    /// ([`Selector::take_failure`](select::Selector::take_failure)).
    fn failed(&mut self) -> Result<()> {
        self.selector.take_failure().map_or(Ok(()), Err)
    }

    /// Books the round's costs and virtual time, which the next round's availability and
    /// clock start from, before its evaluation is done.
    /// A round that selected clients but aggregated no update is counted, and said once
    /// on the console: a deadline no client meets would otherwise repeat one warning every
    /// round.
    fn book(&mut self, record: &RoundRecord) {
        let summary = &mut self.summary;
        summary.cost.add(&record.cost);
        if let (Some(total), Some(c)) = (&mut summary.clock, &record.clock) {
            total.clock_s = c.clock_s;
            total.wasted_trainings = summary.cost.wasted_trainings;
            if c.aggregated == 0 && record.n_selected > 0 {
                if total.rounds_without_updates == self.idle_rounds {
                    tracing::warn!(
                        "round {}: no update arrived in time (lost offline or late); the model stays as it was and the round lasted {} virtual seconds. Later rounds like it are counted in the summary's rounds_without_updates, not logged",
                        record.round,
                        clock::show_s(c.round_s)
                    );
                }
                total.rounds_without_updates += 1;
            } else if c.aggregated == 0 {
                // Nobody trained: the round still took time (Run::time) and is counted. Said
                // at the first such round and at every tenfold after it, so that a run whose
                // selector picks nobody for many rounds says so without a line a round.
                self.idle_rounds += 1;
                total.rounds_without_updates += 1;
                if is_power_of_ten(self.idle_rounds) {
                    tracing::warn!(
                        "round {}: nobody trained ({} available, {} selected); the round lasted {} virtual seconds, waiting for the server's next decision point (the deadline, the next availability change or system.idle_s). {} round(s) so far without training, counted in rounds_without_updates",
                        record.round,
                        record.n_available,
                        record.n_selected,
                        clock::show_s(c.round_s),
                        self.idle_rounds
                    );
                }
            }
        }
    }

    /// Folds the round's evaluation into the summary and hands its record, completed
    /// with it, to the observer; a non-finite test loss ends the run.
    fn log(
        &mut self,
        mut record: RoundRecord,
        assessment: Option<Assessment>,
        observer: &mut dyn Observer,
    ) -> Result<()> {
        let t = record.round;
        let summary = &mut self.summary;
        if let Some(Assessment { test: e, clients }) = assessment {
            record.test_acc = Some(e.accuracy);
            record.test_loss = Some(e.loss);
            record.client_acc = clients;
            if !e.loss.is_finite() {
                return Err(Error::Diverged {
                    round: t,
                    what: "test loss".into(),
                });
            }
            summary.final_acc = Some(e.accuracy);
            summary.final_loss = Some(e.loss);
            if summary.best_acc.is_none_or(|b| e.accuracy > b) {
                summary.best_acc = Some(e.accuracy);
                summary.best_acc_round = t;
            }
            let uniform = (self.exp.data.train.classes as f64).ln();
            if summary.diverged_at.is_none() && e.loss > DIVERGENCE_FACTOR * uniform {
                summary.diverged_at = Some(t);
                tracing::warn!(
                    "round {t}: test loss {:.4e} is over {DIVERGENCE_FACTOR} times ln C = {uniform:.3}, the loss of predicting every class alike: the run is diverging (lower the learning rate)",
                    e.loss
                );
            }
            summary.best_loss = Some(summary.best_loss.map_or(e.loss, |b| b.min(e.loss)));
            for (i, (target, reached)) in summary.rounds_to_target.iter_mut().enumerate() {
                if reached.is_none() && e.accuracy >= *target {
                    *reached = Some(t + 1);
                    if let (Some(total), Some(c)) = (&mut summary.clock, &record.clock) {
                        total.time_to_target_s[i].1 = Some(c.clock_s);
                    }
                }
            }
        }
        summary.rounds = t + 1;
        summary.wall_s = record.elapsed_s;
        observer.on_round(&record)
    }

    /// Whether round `t` ends with a checkpoint: every `checkpoint_every` rounds, except
    /// the last.
    fn checkpoint_due(&self, t: usize) -> bool {
        let cfg = &self.exp.config;
        cfg.checkpoint_every != 0
            && (t + 1).is_multiple_of(cfg.checkpoint_every)
            && t + 1 < cfg.rounds
    }

    /// Hands the observer a checkpoint every `checkpoint_every` rounds, except after the last.
    /// The updates in flight are lent to it, not copied: they may hold a model per client.
    fn checkpoint(&mut self, t: usize, observer: &mut dyn Observer) -> Result<()> {
        if !self.checkpoint_due(t) {
            return Ok(());
        }
        let (m, v) = self.server.moments();
        let cp = Checkpoint {
            next_round: t + 1,
            config_hash: self.config_hash.clone(),
            global: self.global.clone(),
            server_m: m.to_vec(),
            server_v: v.to_vec(),
            client_states: self.states.clone(),
            selector: self.selector.save(),
            summary: self.summary.clone(),
            in_flight: std::mem::take(&mut self.book),
        };
        if let Err(e) = self.failed() {
            self.book = cp.in_flight;
            return Err(e);
        }
        let written = observer.on_checkpoint(&cp);
        self.book = cp.in_flight;
        written
    }
}

//! Client selection: the [`Selector`] trait and the strategies.
//!
//! A selector sees only what a real server sees: client ids, training-set
//! sizes, availability, and whatever it asks clients to report. It declares
//! standing needs once ([`Needs`]: which part of each update to keep, oracle
//! features), and asks for on-demand reports (held-out losses, gradients,
//! probe trainings) through [`ClientQuery`] while it selects. The engine performs every such request
//! and books its cost in the run's [`Ledger`](crate::ledger::Ledger).
//!
//! A strategy's options (e.g. [`powd::PowdConfig`]) are defined in its module, beside the
//! code that reads them, with their defaults and their part of
//! [`Config::validate`](crate::config::Config::validate);
//! [`SelectionConfig`] gathers them into the `[selection]` table.

pub mod afl;
pub mod clustered;
pub mod divfl;
pub mod f3ast;
pub mod fedbalancer;
pub mod fedcor;
pub mod fedcs;
pub mod fedgs;
pub mod guard;
pub mod hics;
pub mod md;
pub mod oort;
mod panels;
pub mod powd;
pub mod pyramidfl;
pub mod refl;
pub mod registry;
pub mod tifl;
pub mod uniform;
pub mod ward;

use serde::{Deserialize, Serialize};

use crate::aggregate::AggregationRule;
use crate::error::{ConfigError, Error};
use crate::rng::Rng;
use afl::AflConfig;
use divfl::DivflConfig;
use f3ast::F3astConfig;
use fedbalancer::FedBalancerConfig;
use fedcor::FedCorConfig;
use fedcs::FedCsConfig;
use fedgs::FedGsConfig;
use hics::HicsConfig;
use md::MdConfig;
use oort::OortConfig;
use powd::PowdConfig;
use pyramidfl::PyramidflConfig;
use refl::ReflConfig;
use tifl::TiflConfig;
use ward::WardDistances;

/// Client selection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SelectionConfig {
    /// `uniform`, `md`, `powd`, `cpowd`, `rpowd`, `afl`, `fedcor`, `fedgp`, `fedgs`, `f3ast`,
    /// `hics`, `cs1`, `cs2` (Clustered Sampling Alg. 1 / 2), `divfl`, `oort`, `fedcs`, `tifl`,
    /// `pyramidfl`, `refl` or `fedbalancer`, or a strategy a program registered
    /// ([`registry::register`]).
    pub strategy: String,
    /// Clients per round m; when 0, `fraction · N` rounded (at least 1).
    pub clients_per_round: usize,
    /// Fraction of clients per round, used when `clients_per_round` is 0.
    pub fraction: f64,
    /// What each client reports as its size n_k, from which selectors derive p_k = n_k / Σ n.
    pub client_size: ClientSize,
    /// MD sampling settings (`md`).
    pub md: MdConfig,
    /// Power-of-choice settings (`powd`, `cpowd`, `rpowd`).
    pub powd: PowdConfig,
    /// Active FL settings (`afl`).
    pub afl: AflConfig,
    /// FedCor / FedGP settings (`fedcor`, `fedgp`).
    pub fedcor: FedCorConfig,
    /// FedGS settings (`fedgs`).
    pub fedgs: FedGsConfig,
    /// F3AST settings (`f3ast`).
    pub f3ast: F3astConfig,
    /// HiCS-FL settings (`hics`).
    pub hics: HicsConfig,
    /// DivFL settings (`divfl`).
    pub divfl: DivflConfig,
    /// Oort settings (`oort`). Written out only when they differ from the defaults, so that
    /// configs from before the table keep their hash (sweep cells, checkpoints).
    #[serde(skip_serializing_if = "OortConfig::is_default")]
    pub oort: OortConfig,
    /// FedCS settings (`fedcs`), written out only when they differ from the defaults (as
    /// Oort's).
    #[serde(skip_serializing_if = "FedCsConfig::is_default")]
    pub fedcs: FedCsConfig,
    /// TiFL settings (`tifl`), written out only when they differ from the defaults (as
    /// Oort's).
    #[serde(skip_serializing_if = "TiflConfig::is_default")]
    pub tifl: TiflConfig,
    /// REFL settings (`refl`), written out only when they differ from the defaults (as
    /// Oort's).
    #[serde(skip_serializing_if = "ReflConfig::is_default")]
    pub refl: ReflConfig,
    /// FedBalancer settings (`fedbalancer`, whose Oort part reads `[selection.oort]`),
    /// written out only when they differ from the defaults (as Oort's).
    #[serde(skip_serializing_if = "FedBalancerConfig::is_default")]
    pub fedbalancer: FedBalancerConfig,
    /// How Clustered Sampling Alg. 2 and HiCS-FL obtain Ward's point distances: `auto`
    /// (exact up to 1,000 clients, incremental above), `exact` (Θ(N³) a round) or
    /// `incremental` (O(K N²), history-dependent last bits). Written out only when not
    /// the default.
    #[serde(skip_serializing_if = "WardDistances::is_default")]
    pub ward_distances: WardDistances,
    /// PyramidFL settings (`pyramidfl`), written out only when they differ from the
    /// defaults (as Oort's).
    #[serde(skip_serializing_if = "PyramidflConfig::is_default")]
    pub pyramidfl: PyramidflConfig,
    /// The options of a registered strategy ([`registry::register`]), as its factory reads
    /// them: fedsel checks only that a built-in strategy gets none. Written out only when
    /// given, so that configs without it keep their hash.
    #[serde(skip_serializing_if = "toml::Table::is_empty")]
    pub params: toml::Table,
}

impl Default for SelectionConfig {
    fn default() -> Self {
        Self {
            strategy: "uniform".into(),
            clients_per_round: 0,
            fraction: 0.2,
            client_size: ClientSize::Train,
            md: MdConfig::default(),
            powd: PowdConfig::default(),
            afl: AflConfig::default(),
            fedcor: FedCorConfig::default(),
            fedgs: FedGsConfig::default(),
            f3ast: F3astConfig::default(),
            hics: HicsConfig::default(),
            divfl: DivflConfig::default(),
            oort: OortConfig::default(),
            fedcs: FedCsConfig::default(),
            tifl: TiflConfig::default(),
            refl: ReflConfig::default(),
            fedbalancer: FedBalancerConfig::default(),
            ward_distances: WardDistances::Auto,
            pyramidfl: PyramidflConfig::default(),
            params: toml::Table::new(),
        }
    }
}

impl SelectionConfig {
    /// m for `n` clients.
    pub fn per_round(&self, n: usize) -> usize {
        if self.clients_per_round > 0 {
            self.clients_per_round
        } else {
            ((self.fraction * n as f64).round() as usize).max(1)
        }
    }
}

/// The size n_k a client reports to the server (selectors weigh clients by p_k = n_k / Σ n).
///
/// Aggregation by data size always uses the training part: this only changes what the
/// selectors see, since the papers' codes differ on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientSize {
    /// The training part of its local data (FedGS: n_k is the training-split size).
    #[default]
    Train,
    /// All its local data, training and held-out parts together. FedCor's code sets
    /// p_k = |partition_k| / |D| and AFL's valuation ℓ_k·√n_k on the whole partition
    /// before its 80/20 split (algorithms.md §1, §6).
    Local,
}

/// Which of a method's two definitions a run follows (decisions.md): a paper's tables were
/// produced by its authors' code, so where the text and the code differ, `paper` follows
/// the text's equations and `code` what produced the tables. FedGS and F3AST have both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// The paper's equations and settings.
    #[default]
    Paper,
    /// The authors' code, which produced the tables.
    Code,
}

/// Which training examples a client's gradient of the global model covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GradientScope {
    /// The mean loss over all of the client's training examples (the full-batch gradient
    /// of the DivFL code, algorithms.md §8).
    Full,
    /// The mean loss over one random mini-batch of the training batch size.
    Minibatch,
}

/// Which part of each selected client's update the selector wants back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UpdateKind {
    /// None.
    #[default]
    None,
    /// The whole update x_k − w.
    Full,
    /// The output layer's bias and weight only.
    OutputLayer,
}

/// What a selector needs from the engine besides its own draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Needs {
    /// Updates of the selected clients, given in [`Feedback::updates`].
    pub updates: UpdateKind,
    /// **Oracle**: every client's true label histogram, given at setup.
    /// A real server cannot see these; only strategies defined with oracle
    /// knowledge (e.g. FedGS's oracle 3DG) may ask.
    pub oracle_label_histograms: bool,
    /// **Oracle**: every client's data-distribution feature, given at setup: its
    /// label distribution, or on Synthetic data its generating model (FedGS's
    /// oracle 3DG). Same caveat as above.
    pub oracle_features: bool,
}

/// What the server knows about the clients before training starts.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Size n_k each client reports: its training part, or all its local data under
    /// `selection.client_size = "local"`.
    pub sizes: Vec<usize>,
    /// p_k = n_k / Σ n.
    pub weights: Vec<f64>,
    /// Clients per round m.
    pub per_round: usize,
    /// Rounds in the run.
    pub rounds: usize,
    /// Number of parameters of the model.
    pub num_params: usize,
    /// Number of classes: the length of the output-layer bias.
    pub classes: usize,
    /// **Oracle** label histograms, present only when [`Needs::oracle_label_histograms`].
    pub oracle_label_histograms: Option<Vec<Vec<usize>>>,
    /// **Oracle** features, present only when [`Needs::oracle_features`].
    pub oracle_features: Option<Vec<Vec<f64>>>,
    /// Each client's round trip in seconds as its device reports it when it registers:
    /// the model's download, one round's training and the upload on the device's profile,
    /// as a real client reports its hardware (FedScale's aggregator
    /// `client_register_handler` → `registerDuration`). `None` when the run has no clock.
    pub durations: Option<Vec<f64>>,
}

/// The state of one round as the selector sees it.
#[derive(Debug, Clone, Copy)]
pub struct RoundContext<'a> {
    /// Round index (0-based).
    pub round: usize,
    /// Clients available now, ascending.
    pub available: &'a [usize],
    /// How many clients the server may select now (K_t).
    pub budget: usize,
    /// The virtual clock when the round starts, in seconds since the run began; `None`
    /// when the run has no clock. A server knows its own time; none of the papers'
    /// strategies reads it, a selector written by a user may (a time-aware method).
    pub clock_s: Option<f64>,
}

/// Reports the selector can request from clients while it selects.
pub trait ClientQuery {
    /// Loss of the current global model on each client's held-out data.
    ///
    /// Each client costs one broadcast, one evaluation and one scalar report.
    fn holdout_losses(&mut self, clients: &[usize]) -> Result<Vec<f64>, Error>;

    /// Loss of the current global model on one random mini-batch (the training batch size)
    /// of each client's training data (cpow-d). Each client costs one broadcast, one
    /// evaluation and one scalar report.
    fn minibatch_losses(&mut self, clients: &[usize]) -> Result<Vec<f64>, Error>;

    /// A probe round (FedCor Alg. 2 lines 4–8): `clients` train from the current global
    /// model, their models are aggregated by the run's rule, and the probe model's held-out
    /// loss on each of `evaluate` comes back; the probe model is then discarded. Books the
    /// trainings as `probe_trainings` and the evaluations.
    fn probe(&mut self, clients: &[usize], evaluate: &[usize]) -> Result<Vec<f64>, Error>;

    /// An extra real FL step inside the round (FedGP Alg. 2 line 5): `clients` train from
    /// the current global model, their models are aggregated by the run's rule and the
    /// server step is applied, so the round's own selection then trains from the advanced
    /// model. Returns the advanced model's held-out loss on each of `evaluate`. Books the
    /// trainings as `extra_trainings` (they fed the global model) and the evaluations.
    fn advance(&mut self, clients: &[usize], evaluate: &[usize]) -> Result<Vec<f64>, Error> {
        let _ = (clients, evaluate);
        Err(unsupported("an extra training step"))
    }

    /// The updates x_k − w of the given clients, each trained from the current
    /// global model w and uploaded (FedGS §3.2: the 3DG from model parameters).
    /// Books the trainings as `probe_trainings` with their broadcasts and uploads.
    fn local_updates(&mut self, clients: &[usize]) -> Result<Vec<Vec<f32>>, Error> {
        let _ = clients;
        Err(unsupported("local updates"))
    }

    /// Server-side computation on uploaded models w + update (FedGS Eq. 12): each
    /// model's mean output-layer response (logits) to one batch of `batch`
    /// Gaussian-noise inputs with the scalar mean and standard deviation of the
    /// server's own test inputs. Every model sees the same noise. No client work.
    fn noise_responses(
        &mut self,
        updates: &[Vec<f32>],
        batch: usize,
    ) -> Result<Vec<Vec<f64>>, Error> {
        let _ = (updates, batch);
        Err(unsupported("noise responses"))
    }

    /// The Gram matrix of the given clients' private oracle features (see
    /// [`Needs::oracle_features`]), computed pair by pair with the secure scalar
    /// product protocol relayed through the server ([`crate::sspp`], FedGS App. D),
    /// so that the server learns dot products but never a feature vector. Each
    /// client's squared norm is its own report. Books every protocol message.
    fn secure_gram(&mut self, clients: &[usize]) -> Result<Vec<Vec<f64>>, Error> {
        let _ = clients;
        Err(unsupported("secure scalar products"))
    }

    /// The gradient of the current global model's mean training loss from each named
    /// client, over the examples `scope` names (DivFL's client gradients, on demand). Each
    /// costs a broadcast, a gradient and an upload, and the examples it passed over.
    fn gradients(
        &mut self,
        clients: &[usize],
        scope: GradientScope,
    ) -> Result<Vec<Vec<f32>>, Error> {
        let _ = (clients, scope);
        Err(unsupported("gradients"))
    }
}

fn unsupported(what: &str) -> Error {
    Error::Selection {
        selector: "query".into(),
        round: 0,
        reason: format!("this client query cannot provide {what}"),
    }
}

/// A selector's state as checkpoint JSON.
pub(crate) fn save_state<T: serde::Serialize>(state: &T) -> serde_json::Value {
    serde_json::to_value(state).expect("selector state is plain data")
}

/// Reads back what [`save_state`] wrote, naming the selector on failure.
pub(crate) fn load_state<T: serde::de::DeserializeOwned>(
    selector: &str,
    state: &serde_json::Value,
) -> Result<T, Error> {
    serde_json::from_value(state.clone()).map_err(|e| Error::Selection {
        selector: selector.into(),
        round: 0,
        reason: format!("checkpoint state unreadable: {e}"),
    })
}

/// Refuses a loaded state whose `what` holds `got` entries where `want` belong: a state
/// saved for another federation, or edited, must not index past a client list.
pub(crate) fn check_loaded(
    selector: &str,
    what: &str,
    got: usize,
    want: usize,
) -> Result<(), Error> {
    if got == want {
        return Ok(());
    }
    Err(Error::Selection {
        selector: selector.into(),
        round: 0,
        reason: format!("the loaded state holds {got} {what} where {want} belong"),
    })
}

/// Draws `k` distinct items with probability ∝ `weights`, one at a time, renormalising
/// after each draw (numpy's `choice(replace=False, p=...)`). Zero-weight items are only
/// drawn once every positive one is taken.
pub fn weighted_without_replacement(
    items: &[usize],
    weights: &[f64],
    k: usize,
    rng: &mut Rng,
) -> Vec<usize> {
    use rand::Rng as _;
    let mut left: Vec<(usize, f64)> = items.iter().copied().zip(weights.iter().copied()).collect();
    let mut out = Vec::with_capacity(k.min(items.len()));
    while out.len() < k && !left.is_empty() {
        let total: f64 = left.iter().map(|x| x.1).sum();
        let i = if total > 0.0 {
            let mut u = rng.random::<f64>() * total;
            left.iter()
                .position(|x| {
                    u -= x.1;
                    u < 0.0 && x.1 > 0.0
                })
                .unwrap_or_else(|| {
                    left.iter()
                        .rposition(|x| x.1 > 0.0)
                        .expect("a positive weight")
                })
        } else {
            rng.random_range(0..left.len())
        };
        out.push(left.remove(i).0);
    }
    out
}

/// A selector's choice for one round.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Selection {
    /// Clients to train; a client may appear more than once (MD sampling).
    pub clients: Vec<usize>,
    /// Aggregation weights per entry, for the `selector` aggregation rule.
    pub weights: Option<Vec<f64>>,
}

/// A selection with the work it orders of each entry ([`Selector::plan`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Planned {
    /// The clients, as [`Selector::select`] returns them.
    pub selection: Selection,
    /// One order per entry of `selection.clients`, or `None`: every entry trains the run's
    /// `train.work` and uploads its whole model, as without plans. Entries of one client
    /// (MD sampling's duplicates share one training) must carry the same order.
    pub orders: Option<Vec<ClientOrder>>,
}

/// What the server asks of one selected client beyond the run's defaults: how much local
/// work, and how much of its update to upload (PyramidFL's per-client local iterations
/// and update dropout). The engine trains and uploads as ordered, books the steps in the
/// ledger (`train_steps`, and `dropped_params` for what was not sent) and charges the
/// clock for the compute and the upload actually done.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClientOrder {
    /// The client trains ⌊E·`work`⌋ mini-batch steps, at least one, where E is its steps
    /// under `train.work` (e·⌈n/B⌉ for e epochs): PyramidFL's `int(upload_epoch · ratio)`
    /// (`training/learner.py` line 539). 1 is the run's own work; finite and > 0.
    pub work: f64,
    /// Which coordinates of its update the client leaves out of its upload, if any.
    pub dropout: Option<UploadDropout>,
}

impl ClientOrder {
    /// The run's own work and a whole upload.
    pub const FULL: Self = Self {
        work: 1.0,
        dropout: None,
    };
}

/// How a client drops part of its update x_k − w before it uploads it. A dropped
/// coordinate is not sent; the server takes it as no change (x_k = w there), so it
/// enters the aggregation as a zero update under the client's full weight, not
/// renormalised over the clients that sent it: PyramidFL's client zeroes the dropped
/// part of its delta (`training/learner.py` line 419) and its server adds every delta
/// times its weight into one sum (`training/param_server.py` lines 320-329).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum UploadDropout {
    /// The ⌊f·P⌋ of the P coordinates whose change |x_k − w| is smallest (ties to the
    /// lower index) are dropped, f in [0, 1).
    Smallest(f64),
    /// Each parameter tensor (a layer's weight or bias) is dropped whole with probability
    /// p in [0, 1), from the client's own stream of the round: PyramidFL's code, which
    /// multiplies each tensor's delta by `random.uniform(0, 1) >= dropout_ratio`
    /// (`training/learner.py` line 419).
    Layers(f64),
}

impl UploadDropout {
    /// The fraction or probability.
    pub fn rate(self) -> f64 {
        match self {
            Self::Smallest(f) | Self::Layers(f) => f,
        }
    }
}

/// A client's device as it reports it when it registers ([`Setup::durations`] is their
/// sum): the times of one round of the run's own work, and that work.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceReport {
    /// Seconds to download the model.
    pub download_s: f64,
    /// Seconds of compute for the run's `train.work`.
    pub compute_s: f64,
    /// Seconds to upload a whole update.
    pub upload_s: f64,
    /// Mini-batch steps of the run's `train.work` (E of [`ClientOrder::work`]).
    pub steps: usize,
    /// Mini-batch steps of one pass over its training part, ⌈n_k / B⌉.
    pub epoch_steps: usize,
    /// The batch size B.
    pub batch: usize,
}

/// What happened in a round, reported back to the selector.
#[derive(Debug, Clone, Copy)]
pub struct Feedback<'a> {
    /// Round index.
    pub round: usize,
    /// The selection that was trained.
    pub selected: &'a [usize],
    /// Each selected entry's mean training loss.
    pub train_losses: &'a [f64],
    /// Each selected entry's update (part per [`Needs::updates`]), when asked for.
    pub updates: Option<&'a [Vec<f32>]>,
    /// Each selected entry's duration of the round in seconds, as the server measures it
    /// (from the model's broadcast to the update's arrival); `None` when the run has no
    /// clock. Always the federation's time, never the simulator's own wall clock, so that
    /// results do not depend on the machine or its thread count.
    pub durations: Option<&'a [f64]>,
    /// The selected entries whose update the round policy discarded, with what the server
    /// knows of their durations; `None` when the run has no clock.
    pub dropped: Option<Dropped<'a>>,
}

/// Selected entries whose updates the server did not use (over-commitment's stragglers,
/// a deadline's late clients, clients that went offline): the server closed the round
/// without them, so each one's duration is only known to exceed a bound (censored), the
/// time from the broadcast until the round closed, as a server that timed it out knows.
#[derive(Debug, Clone, Copy)]
pub struct Dropped<'a> {
    /// The clients, one per dropped entry.
    pub clients: &'a [usize],
    /// Per entry, the lower bound on its duration in seconds.
    pub at_least_s: &'a [f64],
}

/// What a client knows when it runs a [`SampleRule`]: the round's training plan, as the
/// server configured it, and its own device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClientPlan {
    /// Local epochs over the examples kept (`train.work.epochs`), or `None` for a fixed
    /// number of steps whatever the examples kept.
    pub epochs: Option<usize>,
    /// The steps of a round of fixed steps (`train.work.steps`; unused with epochs).
    pub fixed_steps: usize,
    /// The training batch size.
    pub batch_size: usize,
    /// The client's device; `None` where the run has no clock.
    pub device: Option<DeviceTiming>,
}

impl ClientPlan {
    /// Training steps on `m` examples (an epoch's last, partial batch is a step).
    pub fn steps(&self, m: usize) -> usize {
        match self.epochs {
            Some(e) => e * m.div_ceil(self.batch_size.max(1)),
            None => self.fixed_steps,
        }
    }
}

/// A client's device as the client itself knows it: seconds to train one batch of the
/// training batch size, to pass one sample forward, and to send the model one way.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceTiming {
    /// Seconds of one training step on a whole batch.
    pub batch_s: f64,
    /// Seconds of one sample's forward pass.
    pub sample_inference_s: f64,
    /// Seconds of the model's download (or, equally, of the update's upload).
    pub transfer_s: f64,
}

/// What a client's sample-selection pass decided: the positions, among the client's
/// training examples, of those it trains on this round, and the scalars it uploads beside
/// its update.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SampleChoice {
    /// Positions into the client's training examples, each once; at least one where the
    /// client holds any.
    pub keep: Vec<usize>,
    /// The statistics the strategy asked for, reported with the update.
    pub report: Vec<f64>,
}

/// A client-side sample-selection pass (FedBalancer, Shin et al., MobiSys'22, Alg. 1): a
/// strategy that returns one from [`Selector::sample_rule`] makes every client it selected
/// pass its training examples forward through the model it received, hand the per-example
/// losses to [`SampleRule::choose`] on the client, and train on the chosen examples only.
/// The losses never leave the client; only [`SampleChoice::report`] does, and the strategy
/// hears it through [`Selector::observe_samples`]. The engine books the forward passes
/// (`sample_examples` in the ledger) and the reported scalars, and puts the pass on the
/// virtual clock before the client's training (one inference per example). A rule is a
/// snapshot of the strategy's state for the round, so the clients apply it side by side.
pub trait SampleRule: Send + Sync {
    /// The examples client `client` trains on, from `losses` (one per training example, in
    /// the client's order), its plan and device, and its own stream.
    fn choose(
        &self,
        client: usize,
        losses: &[f64],
        plan: &ClientPlan,
        rng: &mut Rng,
    ) -> SampleChoice;
}

/// A client-selection strategy.
pub trait Selector: Send {
    /// Name as used in configs.
    fn name(&self) -> &'static str;

    /// Standing needs; asked once, before [`Selector::setup`].
    fn needs(&self) -> Needs {
        Needs::default()
    }

    /// Receives what the server knows before the first round.
    fn setup(&mut self, setup: &Setup) {
        let _ = setup;
    }

    /// The initial phase before round 0, in which **every** client is reachable (FedGS §3.2
    /// assumes this to build its 3DG). It is the only time a selector may query a client
    /// that is not available in a round; its costs are booked to round 0. Not called again
    /// on resume: what it learns belongs in [`Selector::save`].
    fn initial_phase(&mut self, query: &mut dyn ClientQuery) -> Result<(), Error> {
        let _ = query;
        Ok(())
    }

    /// Chooses the clients of a round, among `ctx.available` only.
    fn select(
        &mut self,
        ctx: &RoundContext<'_>,
        query: &mut dyn ClientQuery,
        rng: &mut Rng,
    ) -> Result<Selection, Error>;

    /// Receives each client's registered device ([`DeviceReport`]), after
    /// [`Selector::setup`] and only when the run has a clock.
    fn register_devices(&mut self, devices: &[DeviceReport]) {
        let _ = devices;
    }

    /// Chooses the round's clients and what each is to do ([`ClientOrder`]): by default
    /// [`Selector::select`]'s clients with no orders. A strategy that orders per-client
    /// work or upload dropout overrides this; the engine calls this, never `select`.
    fn plan(
        &mut self,
        ctx: &RoundContext<'_>,
        query: &mut dyn ClientQuery,
        rng: &mut Rng,
    ) -> Result<Planned, Error> {
        Ok(Planned {
            selection: self.select(ctx, query, rng)?,
            orders: None,
        })
    }

    /// Learns from the round's outcome.
    fn observe(&mut self, feedback: &Feedback<'_>) {
        let _ = feedback;
    }

    /// The client-side sample selection the round's clients run before they train (see
    /// [`SampleRule`]); asked once per round, right after [`Selector::select`]. `None`, the
    /// default, trains every client on all its examples, as before the mechanism existed.
    fn sample_rule(&self) -> Option<Box<dyn SampleRule>> {
        None
    }

    /// The reports of the round's sample-selection pass (see [`SampleRule`]), one per entry
    /// whose update the server used, after [`Selector::observe`]; never called for a round
    /// without a rule.
    fn observe_samples(&mut self, round: usize, clients: &[usize], reports: &[Vec<f64>]) {
        let _ = (round, clients, reports);
    }

    /// The deadline, in seconds after the training broadcast, at which the server closes
    /// this round when the round policy is `deadline`: a strategy that adapts the deadline
    /// (FedBalancer's Alg. 4) sets it here, in place of `system.round.deadline_s`. Asked
    /// right after [`Selector::select`]; `None`, the default, keeps the policy's.
    fn round_deadline_s(&self) -> Option<f64> {
        None
    }

    /// State to checkpoint: everything learned from rounds so far. What
    /// [`Selector::setup`] derives need not be saved; it is called again on resume.
    fn save(&self) -> serde_json::Value {
        serde_json::Value::Null
    }

    /// Diagnostic files to write beside the run's outputs, as (file name, CSV text).
    fn reports(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// Restores what [`Selector::save`] returned, after [`Selector::setup`].
    fn load(&mut self, state: &serde_json::Value) -> Result<(), Error> {
        let _ = state;
        Ok(())
    }

    /// An error raised in a hook that returns none ([`Selector::observe`],
    /// [`Selector::observe_samples`], [`Selector::save`], [`Selector::reports`]), taken
    /// once: the engine asks right after each such hook and stops the run with it. The
    /// built-in strategies cannot fail there and keep the default `None`; a selector that
    /// runs code of its own that can (one written in Python) holds the error until asked.
    fn take_failure(&mut self) -> Option<Error> {
        None
    }
}

/// The aggregation rule a strategy's paper and code use, which `aggregation = "auto"`
/// resolves to (decisions.md, "Aggregation is separate from selection"): F3AST's own
/// importance weights p_k/r_k (its Alg. 1 line 9), data-size weights for FedGS (Eq. 18) and
/// DivFL (its code's `aggregate`), and the unweighted mean for the rest (FedCor, HiCS-FL,
/// Pow-d, Clustered Sampling and MD sampling as their codes aggregate); a registered
/// strategy's, the rule it was registered with.
pub fn own_aggregation(strategy: &str) -> AggregationRule {
    registry::get(strategy).map_or(AggregationRule::Mean, |s| s.aggregation)
}

/// The warning a run prints when its explicit aggregation rule is not the strategy's own;
/// `None` when they agree. Such a run is allowed (e.g. FedGS's baselines with data-size
/// weights), but it no longer runs the strategy as its paper does, so it is never silent.
pub fn aggregation_override(rule: AggregationRule, strategy: &str) -> Option<String> {
    let own = own_aggregation(strategy);
    (rule != AggregationRule::Auto && rule != own).then(|| {
        format!(
            "server.aggregation = {} overrides {strategy}'s own rule ({}, what `auto` gives)",
            rule.name(),
            own.name()
        )
    })
}

/// Builds the selector a config names, from the strategy table ([`registry`]): a built-in
/// strategy, or one a program registered. A registered strategy reads
/// `[selection.params]`; a built-in one refuses them, since it would ignore them.
pub fn build(cfg: &SelectionConfig) -> Result<Box<dyn Selector>, ConfigError> {
    let strategy = registry::get(&cfg.strategy).ok_or_else(|| {
        ConfigError::invalid("selection.strategy", registry::unknown(&cfg.strategy))
    })?;
    (strategy.factory)(cfg)
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// A query whose held-out (and mini-batch) loss of client k is `losses[k]`.
    pub struct FixedLosses(pub Vec<f64>);

    impl ClientQuery for FixedLosses {
        fn holdout_losses(&mut self, clients: &[usize]) -> Result<Vec<f64>, Error> {
            Ok(clients.iter().map(|&k| self.0[k]).collect())
        }
        fn minibatch_losses(&mut self, clients: &[usize]) -> Result<Vec<f64>, Error> {
            self.holdout_losses(clients)
        }
        fn probe(&mut self, _: &[usize], evaluate: &[usize]) -> Result<Vec<f64>, Error> {
            self.holdout_losses(evaluate)
        }
    }

    /// A query that answers held-out losses from `holdout` and mini-batch losses from
    /// `minibatch` (indexed by client), and records which clients each call names.
    pub struct Recording {
        pub holdout: Vec<f64>,
        pub minibatch: Vec<f64>,
        /// (query, clients) per call, in call order.
        pub calls: Vec<(&'static str, Vec<usize>)>,
    }

    impl Recording {
        pub fn new(holdout: Vec<f64>, minibatch: Vec<f64>) -> Self {
            Self {
                holdout,
                minibatch,
                calls: Vec::new(),
            }
        }

        /// Every client named by any call so far.
        pub fn named(&self) -> Vec<usize> {
            let mut all: Vec<usize> = self.calls.iter().flat_map(|c| c.1.clone()).collect();
            all.sort_unstable();
            all.dedup();
            all
        }
    }

    impl ClientQuery for Recording {
        fn holdout_losses(&mut self, clients: &[usize]) -> Result<Vec<f64>, Error> {
            self.calls.push(("holdout", clients.to_vec()));
            Ok(clients.iter().map(|&k| self.holdout[k]).collect())
        }
        fn minibatch_losses(&mut self, clients: &[usize]) -> Result<Vec<f64>, Error> {
            self.calls.push(("minibatch", clients.to_vec()));
            Ok(clients.iter().map(|&k| self.minibatch[k]).collect())
        }
        fn probe(&mut self, clients: &[usize], evaluate: &[usize]) -> Result<Vec<f64>, Error> {
            self.calls.push(("probe", [clients, evaluate].concat()));
            Ok(evaluate.iter().map(|&k| self.holdout[k]).collect())
        }
        /// Client k's gradient is (held-out loss of k, k).
        fn gradients(
            &mut self,
            clients: &[usize],
            scope: GradientScope,
        ) -> Result<Vec<Vec<f32>>, Error> {
            let name = match scope {
                GradientScope::Full => "full_gradients",
                GradientScope::Minibatch => "minibatch_gradients",
            };
            self.calls.push((name, clients.to_vec()));
            Ok(clients
                .iter()
                .map(|&k| vec![self.holdout[k] as f32, k as f32])
                .collect())
        }
    }

    /// A query that answers gradients and local updates with `vector(call, client)`, the
    /// calls counted from 1, and every loss with 0: for the selectors that read vectors
    /// alone (DivFL, FedGS's update graph).
    pub struct Vectors<F> {
        calls: u64,
        vector: F,
    }

    impl<F: FnMut(u64, usize) -> Vec<f32>> Vectors<F> {
        pub fn new(vector: F) -> Self {
            Self { calls: 0, vector }
        }

        fn answer(&mut self, clients: &[usize]) -> Vec<Vec<f32>> {
            self.calls += 1;
            clients
                .iter()
                .map(|&k| (self.vector)(self.calls, k))
                .collect()
        }
    }

    impl<F: FnMut(u64, usize) -> Vec<f32>> ClientQuery for Vectors<F> {
        fn holdout_losses(&mut self, clients: &[usize]) -> Result<Vec<f64>, Error> {
            Ok(vec![0.0; clients.len()])
        }
        fn minibatch_losses(&mut self, clients: &[usize]) -> Result<Vec<f64>, Error> {
            Ok(vec![0.0; clients.len()])
        }
        fn probe(&mut self, _: &[usize], evaluate: &[usize]) -> Result<Vec<f64>, Error> {
            Ok(vec![0.0; evaluate.len()])
        }
        fn gradients(
            &mut self,
            clients: &[usize],
            _: GradientScope,
        ) -> Result<Vec<Vec<f32>>, Error> {
            Ok(self.answer(clients))
        }
        fn local_updates(&mut self, clients: &[usize]) -> Result<Vec<Vec<f32>>, Error> {
            Ok(self.answer(clients))
        }
    }

    pub fn setup(weights: &[f64]) -> Setup {
        Setup {
            sizes: weights.iter().map(|w| (w * 1000.0) as usize).collect(),
            weights: weights.to_vec(),
            per_round: 1,
            rounds: 1,
            num_params: 1,
            classes: 2,
            oracle_label_histograms: None,
            oracle_features: None,
            durations: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{FixedLosses, setup};
    use super::*;
    use crate::rng::{Purpose, stream};
    use crate::select::powd::PowdConfig;

    /// Inclusion probabilities of 2 draws without replacement from weights (0.5, 0.3, 0.2),
    /// by hand: P(0 not drawn) = 0.3·0.2/0.7 + 0.2·0.3/0.8, and so on.
    const INCLUSION: [f64; 3] = [
        1.0 - (0.3 * 0.2 / 0.7 + 0.2 * 0.3 / 0.8),
        1.0 - (0.5 * 0.2 / 0.5 + 0.2 * 0.5 / 0.8),
        1.0 - (0.5 * 0.3 / 0.5 + 0.3 * 0.5 / 0.7),
    ];
    const TRIALS: usize = 20_000;

    /// Empirical frequencies must lie within 5 standard errors of `p`.
    fn assert_close(counts: &[usize], p: &[f64]) {
        for (c, p) in counts.iter().zip(p) {
            let f = *c as f64 / TRIALS as f64;
            let se = (p * (1.0 - p) / TRIALS as f64).sqrt();
            assert!((f - p).abs() < 5.0 * se, "frequency {f} vs probability {p}");
        }
    }

    #[test]
    fn auto_aggregation_resolves_to_each_strategy_s_own_rule() {
        use crate::config::Config;
        let resolved = |strategy: &str, extra: &str| {
            Config::from_toml_str(
                &format!("[selection]\nstrategy = \"{strategy}\"\n{extra}"),
                "test",
                &[],
            )
            .unwrap()
            .server
            .aggregation
        };
        assert_eq!(resolved("f3ast", ""), AggregationRule::Selector);
        assert_eq!(resolved("fedgs", ""), AggregationRule::DataSize);
        assert_eq!(resolved("divfl", ""), AggregationRule::DataSize);
        assert_eq!(resolved("uniform", ""), AggregationRule::Mean);
        assert_eq!(resolved("hics", ""), AggregationRule::Mean);
        // An explicit rule stays, and a contradicting one is named in a warning.
        let explicit = "[server]\naggregation = \"data_size\"";
        assert_eq!(resolved("f3ast", explicit), AggregationRule::DataSize);
        let warning = aggregation_override(AggregationRule::DataSize, "f3ast").unwrap();
        assert!(warning.contains("server.aggregation = data_size") && warning.contains("selector"));
        assert_eq!(
            aggregation_override(AggregationRule::DataSize, "fedgs"),
            None
        );
        assert_eq!(aggregation_override(AggregationRule::Auto, "f3ast"), None);
    }

    #[test]
    fn weighted_draws_without_replacement_match_their_probabilities() {
        let mut rng = stream(1, Purpose::Selection, 0, 0);
        let mut counts = [0; 3];
        for _ in 0..TRIALS {
            for k in weighted_without_replacement(&[0, 1, 2], &[0.5, 0.3, 0.2], 2, &mut rng) {
                counts[k] += 1;
            }
        }
        assert_close(&counts, &INCLUSION);
    }

    #[test]
    fn pow_d_candidates_follow_p_and_the_top_losses_win() {
        // rpow-d before anyone trained: every loss is +∞, so the m = 2 picks are the
        // two candidates, drawn ∝ p without replacement (d = m = 2).
        let ctx = RoundContext {
            round: 0,
            available: &[0, 1, 2],
            budget: 2,
            clock_s: None,
        };
        let mut counts = [0; 3];
        let mut rng = stream(2, Purpose::Selection, 0, 0);
        for _ in 0..TRIALS {
            let mut s =
                powd::PowerOfChoice::new(PowdConfig { d: 2, d_per_m: 0 }, powd::LossSource::Stale);
            s.setup(&setup(&[0.5, 0.3, 0.2]));
            for k in s
                .select(&ctx, &mut FixedLosses(vec![0.0; 3]), &mut rng)
                .unwrap()
                .clients
            {
                counts[k] += 1;
            }
        }
        assert_close(&counts, &INCLUSION);
        // pow-d with d = all keeps the m highest held-out losses.
        let mut s =
            powd::PowerOfChoice::new(PowdConfig { d: 0, d_per_m: 0 }, powd::LossSource::Holdout);
        s.setup(&setup(&[0.25; 4]));
        let ctx = RoundContext {
            round: 0,
            available: &[0, 1, 2, 3],
            budget: 2,
            clock_s: None,
        };
        let mut picked = s
            .select(&ctx, &mut FixedLosses(vec![0.3, 0.9, 0.1, 0.5]), &mut rng)
            .unwrap()
            .clients;
        picked.sort();
        assert_eq!(picked, vec![1, 3]);
    }

    #[test]
    fn afl_drops_the_lowest_values_and_samples_the_softmax() {
        // Valuations loss·√n with n = 1: (1, 2, 3, 4). α1 = 0.5 drops clients 0 and 1;
        // α2 = 1 gives softmax(3, 4) = (0.2689, 0.7311) over clients 2 and 3.
        let cfg = afl::AflConfig {
            alpha1: 0.5,
            alpha2: 1.0,
            alpha3: 0.0,
        };
        let sizes = Setup {
            sizes: vec![1; 4],
            ..setup(&[0.25; 4])
        };
        let ctx = RoundContext {
            round: 0,
            available: &[0, 1, 2, 3],
            budget: 1,
            clock_s: None,
        };
        let e = (1f64).exp();
        let expected = [0.0, 0.0, 1.0 / (1.0 + e), e / (1.0 + e)];
        let mut counts = [0; 4];
        let mut rng = stream(3, Purpose::Selection, 0, 0);
        for _ in 0..TRIALS {
            let mut s = afl::ActiveFl::new(cfg.clone());
            s.setup(&sizes);
            for k in s
                .select(&ctx, &mut FixedLosses(vec![1.0, 2.0, 3.0, 4.0]), &mut rng)
                .unwrap()
                .clients
            {
                counts[k] += 1;
            }
        }
        assert_eq!(&counts[..2], &[0, 0]);
        assert_close(&counts[2..], &expected[2..]);
    }
}

//! Client selection: the [`Selector`] trait and the strategies.
//!
//! A selector sees only what a real server sees: client ids, training-set
//! sizes, availability, and whatever it asks clients to report. It declares
//! standing needs once ([`Needs`]: which part of each update to keep, one-step
//! gradients of every client, oracle label histograms), and asks for
//! on-demand reports (held-out losses of some clients) through
//! [`ClientQuery`] while it selects. The engine performs every such request
//! and books its cost in the run's [`Ledger`](crate::ledger::Ledger).

pub mod md;
pub mod uniform;

use crate::config::SelectionConfig;
use crate::error::{ConfigError, Error};
use crate::rng::Rng;

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
    /// A one-step gradient from every available client before each selection,
    /// given in [`RoundContext::gradients`] (DivFL and Pow-d "ideal").
    pub gradients_of_all: bool,
    /// **Oracle**: every client's true label histogram, given at setup.
    /// A real server cannot see these; only strategies defined with oracle
    /// knowledge (e.g. FedGS's oracle 3DG) may ask.
    pub oracle_label_histograms: bool,
}

/// What the server knows about the clients before training starts.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Training-set size n_k of each client.
    pub sizes: Vec<usize>,
    /// p_k = n_k / Σ n.
    pub weights: Vec<f64>,
    /// Clients per round m.
    pub per_round: usize,
    /// Rounds in the run.
    pub rounds: usize,
    /// Number of parameters of the model.
    pub num_params: usize,
    /// **Oracle** label histograms, present only when [`Needs::oracle_label_histograms`].
    pub oracle_label_histograms: Option<Vec<Vec<usize>>>,
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
    /// One-step gradients of the available clients (same order), when asked for.
    pub gradients: Option<&'a [Vec<f32>]>,
}

/// Reports the selector can request from clients while it selects.
pub trait ClientQuery {
    /// Loss of the current global model on each client's held-out data.
    ///
    /// Each client costs one broadcast, one evaluation and one scalar report.
    fn holdout_losses(&mut self, clients: &[usize]) -> Result<Vec<f64>, Error>;
}

/// A selector's choice for one round.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Selection {
    /// Clients to train; a client may appear more than once (MD sampling).
    pub clients: Vec<usize>,
    /// Aggregation weights per entry, for the `selector` aggregation rule.
    pub weights: Option<Vec<f64>>,
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

    /// Chooses the clients of a round, among `ctx.available` only.
    fn select(
        &mut self,
        ctx: &RoundContext<'_>,
        query: &mut dyn ClientQuery,
        rng: &mut Rng,
    ) -> Result<Selection, Error>;

    /// Learns from the round's outcome.
    fn observe(&mut self, feedback: &Feedback<'_>) {
        let _ = feedback;
    }

    /// State to checkpoint: everything learned from rounds so far. What
    /// [`Selector::setup`] derives need not be saved; it is called again on resume.
    fn save(&self) -> serde_json::Value {
        serde_json::Value::Null
    }

    /// Restores what [`Selector::save`] returned, after [`Selector::setup`].
    fn load(&mut self, state: &serde_json::Value) -> Result<(), Error> {
        let _ = state;
        Ok(())
    }
}

/// Builds the selector a config names.
pub fn build(cfg: &SelectionConfig) -> Result<Box<dyn Selector>, ConfigError> {
    match cfg.strategy.as_str() {
        "uniform" => Ok(Box::new(uniform::Uniform)),
        "md" => Ok(Box::new(md::MdSampling::default())),
        other => Err(ConfigError::invalid(
            "selection.strategy",
            format!("unknown strategy `{other}`"),
        )),
    }
}

//! Power-of-choice (Cho, Wang & Joshi 2022), as FedCor and HiCS-FL ran it.
//!
//! Draw d candidates among the available clients without replacement with
//! probability ∝ p_k, then keep the K_t with the highest loss (stable sort,
//! ties keep the draw order). The loss comes from one of:
//! - `powd`: each candidate's held-out loss of the current global model (d evaluations);
//! - `cpowd`: the loss on one mini-batch of each candidate's data (cheaper evaluations);
//! - `rpowd`: the training loss a client reported when it last trained, +∞ if it never
//!   did (no extra cost).
//!
//! d is resolved each round by [`PowdConfig::candidates`]: `d_per_m · K_t` (FedCor App. C.1
//! runs d = 2m), an absolute `d`, or every available client for `d = 0` ("ideal" pow-d of
//! HiCS-FL, d = N). With d ≤ K_t every candidate is kept and pow-d is only the ∝ p_k draw,
//! which [`crate::config::Config::warnings`] flags.

use super::{
    ClientQuery, Feedback, RoundContext, Selection, Selector, Setup, weighted_without_replacement,
};
use crate::config::PowdConfig;
use crate::error::Error;
use crate::rng::Rng;

/// Where candidate losses come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossSource {
    /// Held-out loss of the current model (pow-d).
    Holdout,
    /// Loss on one mini-batch (cpow-d).
    MiniBatch,
    /// Last reported training loss (rpow-d).
    Stale,
}

/// The Power-of-choice selector.
#[derive(Debug, Clone)]
pub struct PowerOfChoice {
    cfg: PowdConfig,
    source: LossSource,
    weights: Vec<f64>,
    stale: Vec<f64>,
}

impl PowerOfChoice {
    /// A selector drawing the candidates `cfg` sets, ranked by `source`.
    pub fn new(cfg: PowdConfig, source: LossSource) -> Self {
        Self {
            cfg,
            source,
            weights: Vec::new(),
            stale: Vec::new(),
        }
    }
}

impl Selector for PowerOfChoice {
    fn name(&self) -> &'static str {
        match self.source {
            LossSource::Holdout => "powd",
            LossSource::MiniBatch => "cpowd",
            LossSource::Stale => "rpowd",
        }
    }

    fn setup(&mut self, setup: &Setup) {
        self.weights = setup.weights.clone();
        self.stale = vec![f64::INFINITY; setup.sizes.len()];
    }

    fn select(
        &mut self,
        ctx: &RoundContext<'_>,
        query: &mut dyn ClientQuery,
        rng: &mut Rng,
    ) -> Result<Selection, Error> {
        let avail = ctx.available;
        let d = self.cfg.candidates(ctx.budget, avail.len());
        let w: Vec<f64> = avail.iter().map(|&k| self.weights[k]).collect();
        let candidates = weighted_without_replacement(avail, &w, d, rng);
        let losses = match self.source {
            LossSource::Holdout => query.holdout_losses(&candidates)?,
            LossSource::MiniBatch => query.minibatch_losses(&candidates)?,
            LossSource::Stale => candidates.iter().map(|&k| self.stale[k]).collect(),
        };
        let mut order: Vec<usize> = (0..candidates.len()).collect();
        order.sort_by(|&a, &b| losses[b].total_cmp(&losses[a]));
        let m = ctx.budget.min(candidates.len());
        Ok(Selection {
            clients: order[..m].iter().map(|&i| candidates[i]).collect(),
            weights: None,
        })
    }

    fn observe(&mut self, f: &Feedback<'_>) {
        for (&k, &l) in f.selected.iter().zip(f.train_losses) {
            self.stale[k] = l;
        }
    }

    fn save(&self) -> serde_json::Value {
        // JSON has no infinity: never-seen clients are null.
        serde_json::json!({ "stale": self.stale.iter().map(|l| l.is_finite().then_some(*l)).collect::<Vec<_>>() })
    }

    fn load(&mut self, state: &serde_json::Value) -> Result<(), Error> {
        let stale: Vec<Option<f64>> =
            serde_json::from_value(state["stale"].clone()).map_err(|e| Error::Selection {
                selector: self.name().into(),
                round: 0,
                reason: format!("checkpoint state: {e}"),
            })?;
        self.stale = stale
            .into_iter()
            .map(|l| l.unwrap_or(f64::INFINITY))
            .collect();
        Ok(())
    }
}

//! Active Federated Learning (Goetz et al. 2019), as the FedCor code runs it.
//!
//! Each client has a valuation v_k = (held-out loss) × √n_k, set for every client from
//! the initial model and refreshed for the selected clients with the loss of the model
//! they receive. Each round, among the available clients: drop the ⌊α1·|A|⌋ lowest
//! valuations, draw ⌊(1−α3)·m⌋ clients without replacement with probability
//! softmax(α2·v) over the rest, and fill the remaining picks uniformly without
//! replacement from the other available clients.

use rand::seq::index::sample;

use super::{ClientQuery, RoundContext, Selection, Selector, Setup, weighted_without_replacement};
use crate::config::AflConfig;
use crate::error::Error;
use crate::rng::Rng;

/// The Active FL selector.
#[derive(Debug, Clone)]
pub struct ActiveFl {
    cfg: AflConfig,
    sqrt_sizes: Vec<f64>,
    values: Vec<f64>,
}

impl ActiveFl {
    /// A selector with the given α1, α2, α3.
    pub fn new(cfg: AflConfig) -> Self {
        Self {
            cfg,
            sqrt_sizes: Vec::new(),
            values: Vec::new(),
        }
    }

    /// Selection probabilities of the softmax stage over `avail` (0 for dropped clients).
    pub fn softmax_probabilities(&self, avail: &[usize]) -> Vec<f64> {
        let mut order: Vec<usize> = (0..avail.len()).collect();
        order.sort_by(|&a, &b| self.values[avail[a]].total_cmp(&self.values[avail[b]]));
        let n_drop = (self.cfg.alpha1 * avail.len() as f64).floor() as usize;
        let kept = &order[n_drop.min(avail.len())..];
        let max = kept
            .iter()
            .map(|&i| self.cfg.alpha2 * self.values[avail[i]])
            .fold(f64::NEG_INFINITY, f64::max);
        let mut p = vec![0.0; avail.len()];
        for &i in kept {
            p[i] = (self.cfg.alpha2 * self.values[avail[i]] - max).exp();
        }
        let s: f64 = p.iter().sum();
        p.iter_mut().for_each(|x| *x /= s);
        p
    }
}

impl Selector for ActiveFl {
    fn name(&self) -> &'static str {
        "afl"
    }

    fn setup(&mut self, setup: &Setup) {
        self.sqrt_sizes = setup.sizes.iter().map(|&n| (n as f64).sqrt()).collect();
    }

    fn select(
        &mut self,
        ctx: &RoundContext<'_>,
        query: &mut dyn ClientQuery,
        rng: &mut Rng,
    ) -> Result<Selection, Error> {
        if self.values.is_empty() {
            let all: Vec<usize> = (0..self.sqrt_sizes.len()).collect();
            let losses = query.holdout_losses(&all)?;
            self.values = losses
                .iter()
                .zip(&self.sqrt_sizes)
                .map(|(l, s)| l * s)
                .collect();
        }
        let avail = ctx.available;
        let m = ctx.budget.min(avail.len());
        let p = self.softmax_probabilities(avail);
        let n_soft = ((1.0 - self.cfg.alpha3) * m as f64).floor() as usize;
        let mut chosen = weighted_without_replacement(avail, &p, n_soft, rng);
        let rest: Vec<usize> = avail
            .iter()
            .copied()
            .filter(|k| !chosen.contains(k))
            .collect();
        chosen.extend(
            sample(rng, rest.len(), m - chosen.len())
                .into_iter()
                .map(|i| rest[i]),
        );
        // The selected clients value the model they receive before training on it.
        let losses = query.holdout_losses(&chosen)?;
        for (&k, l) in chosen.iter().zip(losses) {
            self.values[k] = l * self.sqrt_sizes[k];
        }
        Ok(Selection {
            clients: chosen,
            weights: None,
        })
    }

    fn save(&self) -> serde_json::Value {
        serde_json::json!({ "values": self.values })
    }

    fn load(&mut self, state: &serde_json::Value) -> Result<(), Error> {
        self.values = super::load_state("afl", &state["values"])?;
        Ok(())
    }
}

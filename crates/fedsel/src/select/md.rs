//! MD sampling (Li et al., FedProx): K_t draws with replacement ∝ p_k among
//! the available clients. With the `mean` aggregation rule duplicates count
//! twice, which makes the aggregate unbiased for Σ p_k x_k.

use rand::distr::Distribution;
use rand::distr::weighted::WeightedIndex;

use super::{ClientQuery, RoundContext, Selection, Selector, Setup};
use crate::error::Error;
use crate::rng::Rng;

/// Multinomial-distribution sampling.
#[derive(Debug, Clone, Default)]
pub struct MdSampling {
    weights: Vec<f64>,
}

impl Selector for MdSampling {
    fn name(&self) -> &'static str {
        "md"
    }

    fn setup(&mut self, setup: &Setup) {
        self.weights = setup.weights.clone();
    }

    fn select(
        &mut self,
        ctx: &RoundContext<'_>,
        _: &mut dyn ClientQuery,
        rng: &mut Rng,
    ) -> Result<Selection, Error> {
        if ctx.available.is_empty() {
            return Ok(Selection::default());
        }
        let w: Vec<f64> = ctx.available.iter().map(|&k| self.weights[k]).collect();
        let dist = WeightedIndex::new(&w).map_err(|e| Error::Selection {
            selector: "md".into(),
            round: ctx.round,
            reason: format!("no positive weight among available clients: {e}"),
        })?;
        let clients = (0..ctx.budget)
            .map(|_| ctx.available[dist.sample(rng)])
            .collect();
        Ok(Selection {
            clients,
            weights: None,
        })
    }
}

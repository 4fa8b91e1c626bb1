//! Uniform sampling without replacement (Rand in FedCor, UniformSample in FedGS).

use rand::seq::index::sample;

use super::{ClientQuery, RoundContext, Selection, Selector};
use crate::error::Error;
use crate::rng::Rng;

/// min(K_t, |A_t|) available clients, uniformly without replacement.
#[derive(Debug, Clone, Copy, Default)]
pub struct Uniform;

impl Selector for Uniform {
    fn name(&self) -> &'static str {
        "uniform"
    }

    fn select(
        &mut self,
        ctx: &RoundContext<'_>,
        _: &mut dyn ClientQuery,
        rng: &mut Rng,
    ) -> Result<Selection, Error> {
        let m = ctx.budget.min(ctx.available.len());
        let clients = sample(rng, ctx.available.len(), m)
            .into_iter()
            .map(|i| ctx.available[i])
            .collect();
        Ok(Selection {
            clients,
            weights: None,
        })
    }
}

//! MD sampling (Li et al., FedProx): K_t draws with replacement ∝ p_k. With the `mean`
//! aggregation rule duplicates count twice, which makes the aggregate unbiased for Σ p_k x_k.
//!
//! Under partial availability the draws can be taken two ways, and FedGS's Table 2 holds
//! both (see [`MdPool`]).

use rand::distr::Distribution;
use rand::distr::weighted::WeightedIndex;
use serde::{Deserialize, Serialize};

use super::{ClientQuery, RoundContext, Selection, Selector, Setup};
use crate::error::Error;
use crate::rng::Rng;

/// MD sampling's settings (`selection.md`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MdConfig {
    /// Which clients the K_t draws are taken from.
    pub pool: MdPool,
}

/// Where MD sampling draws from when not every client is available.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MdPool {
    /// ∝ p_k among the available clients only, so K_t clients train each round: the FedGS
    /// repository's `mdsample.py` and `fedprox.py` (`np.random.choice(self.active_clients,
    /// ..., replace=True, p)`).
    #[default]
    Available,
    /// ∝ p_k among all N clients, as FedProx's server does not know who is available; the
    /// draws that land on an unavailable client are dropped, so fewer than K_t may train.
    /// This is easyFL's `BasicServer.sample` (`sample_option = "md"`) under its
    /// `with_inactivity` wrapper, which keeps only the selected clients that are active.
    /// FedGS's Table 2 FedProx row agrees with this pool, not with its repository's
    /// `fedprox.py` (docs/results.md).
    All,
}

/// Multinomial-distribution sampling.
#[derive(Debug, Clone, Default)]
pub struct MdSampling {
    config: MdConfig,
    weights: Vec<f64>,
    /// The ∝ p_k law over all clients, for [`MdPool::All`].
    all: Option<WeightedIndex<f64>>,
}

impl MdSampling {
    /// MD sampling drawing from `config.pool`.
    pub fn new(config: MdConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    fn no_weight(round: usize, e: impl std::fmt::Display) -> Error {
        Error::Selection {
            selector: "md".into(),
            round,
            reason: format!("no positive weight among the clients drawn from: {e}"),
        }
    }
}

impl Selector for MdSampling {
    fn name(&self) -> &'static str {
        "md"
    }

    fn setup(&mut self, setup: &Setup) {
        self.weights = setup.weights.clone();
        self.all = None;
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
        let clients = match self.config.pool {
            MdPool::Available => {
                let w: Vec<f64> = ctx.available.iter().map(|&k| self.weights[k]).collect();
                let dist = WeightedIndex::new(&w).map_err(|e| Self::no_weight(ctx.round, e))?;
                (0..ctx.budget)
                    .map(|_| ctx.available[dist.sample(rng)])
                    .collect()
            }
            MdPool::All => {
                if self.all.is_none() {
                    let dist = WeightedIndex::new(&self.weights)
                        .map_err(|e| Self::no_weight(ctx.round, e))?;
                    self.all = Some(dist);
                }
                let dist = self.all.as_ref().expect("set above");
                (0..ctx.budget)
                    .map(|_| dist.sample(rng))
                    .filter(|k| ctx.available.binary_search(k).is_ok())
                    .collect()
            }
        };
        Ok(Selection {
            clients,
            weights: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Purpose, stream};
    use crate::select::testing::{Recording, setup};

    const P: [f64; 4] = [0.1, 0.4, 0.2, 0.3];

    /// Selections of `rounds` rounds with `available` and budget 4; asserts no client query.
    fn draws(pool: MdPool, available: &[usize], rounds: usize) -> Vec<Vec<usize>> {
        let mut md = MdSampling::new(MdConfig { pool });
        md.setup(&setup(&P));
        let mut query = Recording::new(vec![0.0; 4], vec![0.0; 4]);
        let out = (0..rounds)
            .map(|t| {
                let ctx = RoundContext {
                    round: t,
                    available,
                    budget: 4,
                    clock_s: None,
                };
                let mut rng = stream(7, Purpose::Selection, t as u64, 0);
                md.select(&ctx, &mut query, &mut rng).unwrap().clients
            })
            .collect();
        assert!(query.calls.is_empty(), "MD sampling asks clients nothing");
        out
    }

    #[test]
    fn the_available_pool_draws_k_among_the_available_in_proportion_to_p() {
        let rounds = 20_000;
        let sel = draws(MdPool::Available, &[0, 2], rounds);
        assert!(sel.iter().all(|s| s.len() == 4));
        let zeros = sel.iter().flatten().filter(|&&k| k == 0).count();
        let twos = sel.iter().flatten().filter(|&&k| k == 2).count();
        assert_eq!(zeros + twos, 4 * rounds);
        // p_0 / (p_0 + p_2) = 1/3.
        let share = zeros as f64 / (4 * rounds) as f64;
        assert!(
            (share - 1.0 / 3.0).abs() < 0.01,
            "share of client 0: {share}"
        );
    }

    #[test]
    fn the_all_pool_drops_the_draws_that_land_on_unavailable_clients() {
        let rounds = 20_000;
        let sel = draws(MdPool::All, &[0, 2], rounds);
        assert!(sel.iter().flatten().all(|&k| k == 0 || k == 2));
        // Each of the 4 draws lands on {0, 2} with p_0 + p_2 = 0.3: 1.2 clients a round.
        let mean = sel.iter().map(Vec::len).sum::<usize>() as f64 / rounds as f64;
        assert!((mean - 1.2).abs() < 0.03, "clients a round: {mean}");
        assert!(
            sel.iter().any(Vec::is_empty),
            "a round can draw no available client"
        );
        let zeros = sel.iter().flatten().filter(|&&k| k == 0).count() as f64;
        let total = sel.iter().map(Vec::len).sum::<usize>() as f64;
        assert!((zeros / total - 1.0 / 3.0).abs() < 0.015);
    }

    #[test]
    fn both_pools_draw_the_same_clients_when_everyone_is_available() {
        let all = [0, 1, 2, 3];
        assert_eq!(
            draws(MdPool::All, &all, 50),
            draws(MdPool::Available, &all, 50)
        );
    }
}

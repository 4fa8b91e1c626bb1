//! Power-of-choice (Cho, Wang & Joshi 2022), as FedCor and HiCS-FL ran it.
//!
//! Draw d candidates among the available clients without replacement with
//! probability ∝ p_k, then keep the K_t with the highest loss (stable sort,
//! ties keep the draw order). The loss comes from one of:
//! - `powd`: each candidate's held-out loss of the current global model (d evaluations).
//!   With `partition.holdout_fraction = 0` a client has no held-out part and reports the
//!   loss over its whole training data instead: the training loss of the current global
//!   model that the HiCS-FL code ranks by (`server_poc.py`, with d = 2K: `d_per_m = 2`);
//! - `cpowd`: the loss on one mini-batch of each candidate's data (cheaper evaluations);
//! - `rpowd`: the training loss a client reported when it last trained, +∞ if it never
//!   did (no extra cost).
//!
//! d is resolved each round by [`PowdConfig::candidates`]: `d_per_m · K_t` (FedCor App. C.1
//! runs d = 2m), an absolute `d`, or every available client for `d = 0` ("ideal" pow-d of
//! HiCS-FL, d = N). With d ≤ K_t every candidate is kept and pow-d is only the ∝ p_k draw,
//! which [`crate::config::Config::warnings`] flags.

use serde::{Deserialize, Serialize};

use super::{
    ClientQuery, Feedback, RoundContext, Selection, Selector, Setup, weighted_without_replacement,
};
use crate::error::Error;
use crate::rng::Rng;

/// Power-of-choice (Cho et al.): how many candidates d a round draws.
///
/// The papers give d either absolutely (F3AST's pool of 30, HiCS-FL's ideal d = N) or
/// relative to the budget (FedCor App. C.1: d = 2m, so 10 with m = 5 and 20 with m = 10;
/// Cho et al. Fig. 4: d ∈ {2m, 3m, 5m}). `d_per_m > 0` wins over `d`. Rejecting configs
/// that set both is impossible: `d` has a default that TOML has no null to unset, so such
/// a rule would reject every config that sets only `d_per_m`.
/// [`Config::warnings`](crate::config::Config::warnings) names a non-default `d` that
/// `d_per_m` overrides.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PowdConfig {
    /// Candidates drawn ∝ p_k without replacement; 0 means all available clients ("ideal").
    /// Ignored when `d_per_m` > 0.
    pub d: usize,
    /// Candidates per unit of the round's budget: d = d_per_m · K_t each round. 0 = use `d`.
    pub d_per_m: usize,
}

impl Default for PowdConfig {
    fn default() -> Self {
        Self { d: 10, d_per_m: 0 }
    }
}

impl PowdConfig {
    /// d for a round with budget K_t = `budget` and `available` clients: d_per_m · K_t
    /// when `d_per_m` > 0, else `d` (0 = all), never more than the available count.
    pub fn candidates(&self, budget: usize, available: usize) -> usize {
        let d = match (self.d_per_m, self.d) {
            (0, 0) => available,
            (0, d) => d,
            (per_m, _) => per_m.saturating_mul(budget),
        };
        d.min(available)
    }

    /// The key that sets d: `d_per_m` when in effect, else `d`.
    pub(crate) fn key(&self) -> &'static str {
        if self.d_per_m > 0 {
            "selection.powd.d_per_m"
        } else {
            "selection.powd.d"
        }
    }
}

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
        super::check_loaded(self.name(), "stale losses", stale.len(), self.stale.len())?;
        self.stale = stale
            .into_iter()
            .map(|l| l.unwrap_or(f64::INFINITY))
            .collect();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Purpose, stream};
    use crate::select::testing::{Recording, setup};

    fn ctx(round: usize, available: &[usize], budget: usize) -> RoundContext<'_> {
        RoundContext {
            round,
            available,
            budget,
            clock_s: None,
        }
    }

    fn powd(d: usize, d_per_m: usize, source: LossSource, weights: &[f64]) -> PowerOfChoice {
        let mut s = PowerOfChoice::new(PowdConfig { d, d_per_m }, source);
        s.setup(&setup(weights));
        s
    }

    #[test]
    fn powd_candidates_resolve_per_round() {
        let rel = PowdConfig { d: 10, d_per_m: 2 };
        // d_per_m wins over d: 2 · 10 = 20 candidates with m = 10, capped by availability.
        assert_eq!(rel.candidates(10, 100), 20);
        assert_eq!(rel.candidates(5, 100), 10);
        assert_eq!(rel.candidates(10, 13), 13);
        let abs = PowdConfig { d: 10, d_per_m: 0 };
        assert_eq!((abs.candidates(5, 100), abs.candidates(5, 7)), (10, 7));
        let all = PowdConfig { d: 0, d_per_m: 0 };
        assert_eq!(all.candidates(5, 37), 37);
    }

    #[test]
    fn only_candidates_are_ranked_and_the_top_losses_among_them_win() {
        // Clients 4 and 5 have p = 0, so the d = 4 candidates are exactly {0, 1, 2, 3}
        // (zero weights are drawn only once every positive one is taken). The highest losses
        // overall are 4 and 5 (9, 8), but among the candidates (0.3, 0.9, 0.1, 0.5) the
        // top m = 2 are clients 1 and 3.
        let losses = vec![0.3, 0.9, 0.1, 0.5, 9.0, 8.0];
        let weights = [0.25, 0.25, 0.25, 0.25, 0.0, 0.0];
        let avail = [0, 1, 2, 3, 4, 5];
        for seed in 0..20 {
            let mut rng = stream(seed, Purpose::Selection, 0, 0);
            let mut q = Recording::new(losses.clone(), vec![f64::NAN; 6]);
            let mut s = powd(4, 0, LossSource::Holdout, &weights);
            let mut picked = s
                .select(&ctx(0, &avail, 2), &mut q, &mut rng)
                .unwrap()
                .clients;
            picked.sort_unstable();
            assert_eq!(picked, vec![1, 3]);
            assert_eq!(q.calls.len(), 1);
            assert_eq!(
                q.named(),
                vec![0, 1, 2, 3],
                "only the candidates are evaluated"
            );
        }
    }

    #[test]
    fn d_per_m_scales_the_candidates_with_each_rounds_budget() {
        // d = 2 · K_t: 4 candidates of 7 with K_t = 2, all 7 (capped) with K_t = 4. Whatever
        // is drawn, the picks are the K_t highest held-out losses among the evaluated.
        let losses = vec![0.7, 0.1, 0.4, 0.9, 0.2, 0.6, 0.3];
        let avail = [0, 1, 2, 3, 4, 5, 6];
        let mut s = powd(1, 2, LossSource::Holdout, &[1.0 / 7.0; 7]);
        let mut rng = stream(5, Purpose::Selection, 0, 0);
        for (budget, d) in [(2, 4), (4, 7), (1, 2)] {
            let mut q = Recording::new(losses.clone(), vec![f64::NAN; 7]);
            let picked = s.select(&ctx(0, &avail, budget), &mut q, &mut rng).unwrap();
            let evaluated = &q.calls[0].1;
            assert_eq!(evaluated.len(), d);
            let mut by_loss = evaluated.clone();
            by_loss.sort_by(|&a, &b| losses[b].total_cmp(&losses[a]));
            assert_eq!(picked.clients, by_loss[..budget]);
        }
    }

    #[test]
    fn cpow_d_ranks_by_mini_batch_losses() {
        // Held-out and mini-batch losses disagree: with every client a candidate (d = 0)
        // cpow-d must follow the mini-batch ones and never ask for held-out losses.
        let mut q = Recording::new(vec![0.9, 0.8, 0.1, 0.2], vec![0.1, 0.2, 0.9, 0.8]);
        let mut s = powd(0, 0, LossSource::MiniBatch, &[0.25; 4]);
        let mut rng = stream(6, Purpose::Selection, 0, 0);
        let mut picked = s
            .select(&ctx(0, &[0, 1, 2, 3], 2), &mut q, &mut rng)
            .unwrap()
            .clients;
        picked.sort_unstable();
        assert_eq!(picked, vec![2, 3]);
        assert!(q.calls.iter().all(|c| c.0 == "minibatch"), "{:?}", q.calls);
        assert_eq!(q.named(), vec![0, 1, 2, 3]);
    }

    #[test]
    fn rpow_d_prefers_the_unseen_then_follows_reported_training_losses() {
        // One selector over rounds, d = all, m = 1. Never-seen clients (+∞) win until every
        // client has reported; then the highest last-reported training loss wins, and a
        // client that reports a low loss stops being picked. No query is ever made.
        let mut s = powd(0, 0, LossSource::Stale, &[1.0 / 3.0; 3]);
        let mut q = Recording::new(vec![f64::NAN; 3], vec![f64::NAN; 3]);
        let mut rng = stream(7, Purpose::Selection, 0, 0);
        let avail = [0, 1, 2];
        let mut round = |s: &mut PowerOfChoice, t: usize, loss: f64| -> usize {
            let k = s
                .select(&ctx(t, &avail, 1), &mut q, &mut rng)
                .unwrap()
                .clients[0];
            s.observe(&Feedback {
                round: t,
                selected: &[k],
                train_losses: &[loss],
                updates: None,
                durations: None,
                dropped: None,
            });
            k
        };
        let order: Vec<usize> = [(0, 0.5), (1, 0.2), (2, 0.9)]
            .iter()
            .map(|&(t, l)| round(&mut s, t, l))
            .collect();
        let (a, b, c) = (order[0], order[1], order[2]);
        let mut seen = order.clone();
        seen.sort_unstable();
        assert_eq!(seen, vec![0, 1, 2], "each unseen client goes first once");
        // Losses now: a 0.5, b 0.2, c 0.9. c wins, then reports 0.1 and drops below a.
        assert_eq!(round(&mut s, 3, 0.1), c);
        // a 0.5, b 0.2, c 0.1: a, which reports 0.05.
        assert_eq!(round(&mut s, 4, 0.05), a);
        // a 0.05, b 0.2, c 0.1: b.
        assert_eq!(round(&mut s, 5, 0.3), b);
        assert!(q.calls.is_empty());
    }
}

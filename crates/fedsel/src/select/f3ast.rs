//! F3AST (Ribero, Vikalo, de Veciana; seed 004): availability-aware selection
//! with unbiased aggregation.
//!
//! The server keeps r, its running estimate of each client's long-term
//! participation rate, initialised to p (decisions.md). Each round it takes the
//! K_t available clients with the largest −∂H/∂r_k (Eq. 4; greedy is optimal
//! because the objective is additive over the set), updates
//! r ← (1−β) r + β 1_S (Eq. 5, Alg. 1 line 5), and aggregates with the
//! importance weights p_k / r_k of the updated r (Alg. 1 line 9), which make
//! the update unbiased for Σ p_k v_k (Lemma 3.4). Ties go to the lowest id.
//!
//! Protocols (decisions.md): `paper` uses the weights p_k/r_k as they are; `code`, what
//! the tables ran, divides them by K_t as the authors' code does. Once r is stationary it is
//! each client's inclusion probability π_k, so E Σ_S p_k/r_k = Σ_k π_k p_k/π_k = 1: the
//! paper's aggregate is unbiased and `code`'s is 1/K of it. From r(0) = p (Σr = 1, not K)
//! Σ_S p_k/r_k starts at K and falls towards 1 as r settles, so `code` starts at 1 and falls
//! towards 1/K; how far it gets depends on β, N and the run length (on Synthetic, 100
//! clients, 500 rounds, the run's mean is 0.15-0.35). `f3ast_weights.csv` records Σ_S of
//! each round's weights.
//!
//! With fewer than K_t clients available F3AST takes all of them (the paper); the authors'
//! code pads the selection with unavailable low-id clients, which we do not.

use serde::{Deserialize, Serialize};

use super::{ClientQuery, Protocol, RoundContext, Selection, Selector, Setup};
use crate::error::{ConfigError, Error};
use crate::rng::Rng;
use crate::validate::check_prob;

/// Which H(r) F3AST minimises (F3AST Eq. 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum F3astObjective {
    /// H = Σ p_k² / r_k, the default.
    Independent,
    /// H = Σ p_k / r_k, for positively correlated availability.
    Correlated,
}

/// F3AST (seed 004).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct F3astConfig {
    /// Rate-smoothing β of Eq. 5 (App. D: 0.001).
    pub beta: f64,
    /// The variance proxy H.
    pub objective: F3astObjective,
    /// `code` divides the aggregate by K_t as the authors' code does; `paper` does not.
    pub protocol: Protocol,
}

impl Default for F3astConfig {
    fn default() -> Self {
        Self {
            beta: 0.001,
            objective: F3astObjective::Independent,
            protocol: Protocol::Paper,
        }
    }
}

impl F3astConfig {
    /// Rejects a β no run can use, naming the key: the `selection.f3ast` part of
    /// [`Config::validate`](crate::config::Config::validate).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        check_prob(self.beta, "selection.f3ast.beta", true, true)
    }
}

/// The F3AST selector. Use it with the `selector` aggregation rule.
#[derive(Debug, Clone)]
pub struct F3ast {
    cfg: F3astConfig,
    p: Vec<f64>,
    state: State,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct State {
    r: Vec<f64>,
    selected: Vec<u64>,
    /// (round, K_t, Σ_S weights) of each round.
    #[serde(default)]
    weight_sums: Vec<(usize, usize, f64)>,
}

impl F3ast {
    /// A selector with the given settings.
    pub fn new(cfg: F3astConfig) -> Self {
        Self {
            cfg,
            p: Vec::new(),
            state: State::default(),
        }
    }

    /// The current rate estimate r.
    pub fn rates(&self) -> &[f64] {
        &self.state.r
    }

    /// −∂H/∂r_k (Eq. 3): p_k²/r_k² or, for correlated availability, p_k/r_k².
    fn score(&self, k: usize) -> f64 {
        let r2 = self.state.r[k] * self.state.r[k];
        match self.cfg.objective {
            F3astObjective::Independent => self.p[k] * self.p[k] / r2,
            F3astObjective::Correlated => self.p[k] / r2,
        }
    }
}

impl Selector for F3ast {
    fn name(&self) -> &'static str {
        "f3ast"
    }

    fn setup(&mut self, setup: &Setup) {
        self.p = setup.weights.clone();
        self.state = State {
            r: setup.weights.clone(),
            selected: vec![0; setup.weights.len()],
            weight_sums: Vec::new(),
        };
    }

    fn select(
        &mut self,
        ctx: &RoundContext<'_>,
        _: &mut dyn ClientQuery,
        _: &mut Rng,
    ) -> Result<Selection, Error> {
        let mut order: Vec<usize> = ctx.available.to_vec();
        // Stable sort of the ascending ids: equal scores keep the lowest id first.
        order.sort_by(|&a, &b| self.score(b).total_cmp(&self.score(a)));
        order.truncate(ctx.budget.min(order.len()));
        order.sort_unstable();
        let beta = self.cfg.beta;
        for r in &mut self.state.r {
            *r *= 1.0 - beta;
        }
        for &k in &order {
            self.state.r[k] += beta;
            self.state.selected[k] += 1;
        }
        let scale = match self.cfg.protocol {
            Protocol::Code => 1.0 / ctx.budget.max(1) as f64,
            Protocol::Paper => 1.0,
        };
        let weights: Vec<f64> = order
            .iter()
            .map(|&k| scale * self.p[k] / self.state.r[k])
            .collect();
        self.state
            .weight_sums
            .push((ctx.round, ctx.budget, weights.iter().sum()));
        Ok(Selection {
            clients: order,
            weights: Some(weights),
        })
    }

    fn save(&self) -> serde_json::Value {
        super::save_state(&self.state)
    }

    fn load(&mut self, state: &serde_json::Value) -> Result<(), Error> {
        let loaded: State = super::load_state("f3ast", state)?;
        super::check_loaded("f3ast", "rates r_k", loaded.r.len(), self.p.len())?;
        super::check_loaded(
            "f3ast",
            "selection counts",
            loaded.selected.len(),
            self.p.len(),
        )?;
        self.state = loaded;
        Ok(())
    }

    fn reports(&self) -> Vec<(String, String)> {
        let mut csv = String::from("client,p,r,times_selected\n");
        for (k, (p, r)) in self.p.iter().zip(&self.state.r).enumerate() {
            csv.push_str(&format!("{k},{p:.6},{r:.6},{}\n", self.state.selected[k]));
        }
        let mut sums = String::from("round,budget,weight_sum\n");
        for (t, k, w) in &self.state.weight_sums {
            sums.push_str(&format!("{t},{k},{w:.6}\n"));
        }
        vec![
            ("f3ast_rates.csv".into(), csv),
            ("f3ast_weights.csv".into(), sums),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Purpose, stream};
    use crate::select::testing::{FixedLosses, setup};
    use rand::Rng as _;

    /// F3AST's introductory example (its Table 1): two clients with p = (½, ½),
    /// independently available with P(A₁) = 0.375 and P(A₂) = 0.8, budget 1.
    ///
    /// The achievable rates are r₁ ≤ 0.375, r₂ ≤ 0.8 and r₁ + r₂ ≤ P(A₁ ∪ A₂) =
    /// 1 − 0.625·0.2 = 0.875. H = ¼(1/r₁ + 1/r₂) falls as either rate rises, so the
    /// optimum lies on r₁ + r₂ = 0.875, where H is smallest at r₁ = r₂ = 0.4375;
    /// that violates r₁ ≤ 0.375, so by convexity r* = (0.375, 0.5): always pick c₁
    /// when it is available, else c₂ (the paper's r^b).
    #[test]
    fn converges_to_the_optimal_rate_of_the_two_client_example() {
        let mut s = F3ast::new(F3astConfig {
            beta: 0.001,
            ..F3astConfig::default()
        });
        s.setup(&setup(&[0.5, 0.5]));
        let rounds = 60_000;
        let mut counts = [0usize; 2];
        for t in 0..rounds {
            let mut rng = stream(5, Purpose::Availability, t, 0);
            let available: Vec<usize> = [0.375, 0.8]
                .iter()
                .enumerate()
                .filter_map(|(k, &q)| (rng.random::<f64>() < q).then_some(k))
                .collect();
            let ctx = RoundContext {
                round: t as usize,
                available: &available,
                budget: 1,
                clock_s: None,
            };
            let sel = s
                .select(&ctx, &mut FixedLosses(vec![0.0; 2]), &mut rng)
                .unwrap();
            assert!(sel.clients.len() <= 1);
            if t >= rounds / 2 {
                for k in sel.clients {
                    counts[k] += 1;
                }
            }
        }
        let half = (rounds / 2) as f64;
        let empirical = [counts[0] as f64 / half, counts[1] as f64 / half];
        assert!((empirical[0] - 0.375).abs() < 0.02, "{empirical:?}");
        assert!((empirical[1] - 0.5).abs() < 0.02, "{empirical:?}");
        assert!((s.rates()[0] - 0.375).abs() < 0.02 && (s.rates()[1] - 0.5).abs() < 0.02);
    }

    #[test]
    fn weights_are_p_over_the_updated_rate_and_ties_go_to_the_lowest_id() {
        let mut s = F3ast::new(F3astConfig {
            beta: 0.5,
            ..F3astConfig::default()
        });
        s.setup(&setup(&[0.25; 4]));
        let ctx = RoundContext {
            round: 0,
            available: &[1, 2, 3],
            budget: 2,
            clock_s: None,
        };
        let sel = s
            .select(
                &ctx,
                &mut FixedLosses(vec![0.0; 4]),
                &mut stream(1, Purpose::Selection, 0, 0),
            )
            .unwrap();
        // Equal scores: clients 1 and 2. r = 0.5·0.25 + 0.5 = 0.625 for them.
        assert_eq!(sel.clients, vec![1, 2]);
        let w = sel.weights.unwrap();
        assert!(w.iter().all(|&x| (x - 0.25 / 0.625).abs() < 1e-12), "{w:?}");
        assert!((s.rates()[0] - 0.125).abs() < 1e-12);
    }

    /// p = (0.6, 0.3, 0.1). With r = (0.6, 0.2, 0.08) the scores are p²/r² = (1, 2.25,
    /// 1.5625), p/r² = (1.67, 7.5, 15.6) and 1/r = (1.67, 5, 12.5): budget 1 takes client 1
    /// under the default H and client 2 under the correlated one (so does 1/r). With
    /// r = (0.1, 0.2, 0.08), p/r² = (60, 7.5, 15.6) takes client 0 where 1/r takes 2.
    #[test]
    fn unequal_p_tells_the_scores_apart_and_weights_use_the_updated_rate() {
        let pick = |objective, r: [f64; 3], budget, protocol| {
            let mut s = F3ast::new(F3astConfig {
                beta: 0.5,
                objective,
                protocol,
            });
            s.setup(&setup(&[0.6, 0.3, 0.1]));
            s.state.r = r.to_vec();
            let ctx = RoundContext {
                round: 0,
                available: &[0, 1, 2],
                budget,
                clock_s: None,
            };
            let sel = s
                .select(
                    &ctx,
                    &mut FixedLosses(vec![]),
                    &mut stream(1, Purpose::Selection, 0, 0),
                )
                .unwrap();
            (sel.clients, sel.weights.unwrap())
        };
        use F3astObjective::{Correlated, Independent};
        let a = [0.6, 0.2, 0.08];
        assert_eq!(pick(Independent, a, 1, Protocol::Paper).0, vec![1]);
        assert_eq!(pick(Correlated, a, 1, Protocol::Paper).0, vec![2]);
        assert_eq!(
            pick(Correlated, [0.1, 0.2, 0.08], 1, Protocol::Paper).0,
            vec![0]
        );
        // Budget 2 under the default H takes {1, 2}; with β = ½ the updated rates are
        // (0.3, 0.6, 0.54), so the weights are p/r = (0.5, 0.1/0.54), and half that
        // under `code` (divided by K = 2).
        let (clients, w) = pick(Independent, a, 2, Protocol::Paper);
        assert_eq!(clients, vec![1, 2]);
        assert!((w[0] - 0.5).abs() < 1e-12 && (w[1] - 0.1 / 0.54).abs() < 1e-12);
        let (_, w) = pick(Independent, a, 2, Protocol::Code);
        assert!((w[0] - 0.25).abs() < 1e-12 && (w[1] - 0.05 / 0.54).abs() < 1e-12);
    }

    /// p_k = k / Σk for k = 1..=n.
    fn linear_p(n: usize) -> Vec<f64> {
        let total = (n * (n + 1) / 2) as f64;
        (1..=n).map(|k| k as f64 / total).collect()
    }

    /// (round, K, Σ_S weights) of `rounds` rounds with every client available and budget k.
    fn everyone_available(
        cfg: F3astConfig,
        p: &[f64],
        k: usize,
        rounds: usize,
    ) -> Vec<(usize, usize, f64)> {
        let mut s = F3ast::new(cfg);
        s.setup(&setup(p));
        let all: Vec<usize> = (0..p.len()).collect();
        for t in 0..rounds {
            let ctx = RoundContext {
                round: t,
                available: &all,
                budget: k,
                clock_s: None,
            };
            s.select(
                &ctx,
                &mut FixedLosses(vec![]),
                &mut stream(1, Purpose::Selection, 0, 0),
            )
            .unwrap();
        }
        s.state.weight_sums
    }

    /// Under `code` each round's weights are the `paper` weights divided by K_t; at round
    /// 0 (r = p, all tied, so the K lowest ids) they are p_k/(0.999 p_k + 0.001) each.
    #[test]
    fn code_weights_are_paper_weights_over_k() {
        let p = linear_p(20);
        let sums = |protocol| {
            let cfg = F3astConfig {
                protocol,
                ..F3astConfig::default()
            };
            everyone_available(cfg, &p, 5, 50)
        };
        let (code, paper) = (sums(Protocol::Code), sums(Protocol::Paper));
        for (c, q) in code.iter().zip(&paper) {
            assert!((c.2 - q.2 / 5.0).abs() < 1e-12);
        }
        let first: f64 = p[..5].iter().map(|p| p / (0.999 * p + 0.001)).sum();
        assert!(
            (paper[0].2 - first).abs() < 1e-12,
            "{} vs {first}",
            paper[0].2
        );
    }

    /// Lemma 3.4's unbiasedness as the rates settle: from r(0) = p the paper's Σ_S p/r
    /// starts inflated (K at round 0) and tends to Σ p = 1 once r is stationary, while
    /// `code`'s (the same over K, `code_weights_are_paper_weights_over_k`) tends to 1/K,
    /// not to 1. Hand-simulated: rounds 2000-3999 average 0.986 with β = 0.01,
    /// p ∝ (1..=20), K = 5 and everyone available.
    #[test]
    fn paper_weight_sums_tend_to_one_and_code_sums_to_one_over_k() {
        let cfg = F3astConfig {
            beta: 0.01,
            protocol: Protocol::Paper,
            ..F3astConfig::default()
        };
        let sums = everyone_available(cfg, &linear_p(20), 5, 4000);
        let mean = |from: usize, to: usize| {
            sums[from..to].iter().map(|w| w.2).sum::<f64>() / (to - from) as f64
        };
        assert!(mean(0, 50) > 2.0, "early mean {}", mean(0, 50));
        let settled = mean(2000, 4000);
        assert!((settled - 1.0).abs() < 0.05, "settled mean {settled}");
    }
}

//! Server-side aggregation: weights, the aggregated update Δ, and the server optimizer.
//!
//! Aggregation is kept apart from selection because each paper names its own
//! rule (decisions.md): unweighted mean (FedCor, HiCS-FL, Pow-d, Clustered
//! Sampling), data-size weights renormalised over the selected (FedGS Eq. 18,
//! DivFL), or selector-given importance weights (F3AST's p_k/r_k).
//! Δ = Σ_k w_k (x_k − w); the server optimizer then moves w along Δ.

use serde::{Deserialize, Serialize};

/// How the uploaded models are combined.
///
/// Aggregation belongs to the strategy as much as selection does (F3AST's importance
/// weights are what make its selection unbiased), so the default is `auto`: the rule the
/// strategy's paper and code use ([`crate::select::own_aggregation`]). Loading a config
/// replaces `auto` by that rule, so the resolved config records the rule that ran. An
/// explicit rule that differs from the strategy's own runs, with a warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AggregationRule {
    /// The strategy's own rule.
    Auto,
    /// Unweighted mean over the selected (duplicates count twice).
    Mean,
    /// Data-size weights n_k renormalised over the selected.
    DataSize,
    /// Weights given by the selector (e.g. F3AST's p_k/r_k); not renormalised.
    Selector,
}

impl AggregationRule {
    /// The name configs use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Mean => "mean",
            Self::DataSize => "data_size",
            Self::Selector => "selector",
        }
    }
}

/// Server-side optimizer applied to the aggregated update Δ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerOptimizer {
    /// w ← w + Δ (plain FedAvg).
    Replace,
    /// w ← w + η Δ.
    Sgd,
    /// FedAdam (Reddi et al.): Adam on Δ with adaptivity τ, no bias correction.
    Adam,
}

/// Server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Aggregation rule.
    pub aggregation: AggregationRule,
    /// Server optimizer.
    pub optimizer: ServerOptimizer,
    /// Server learning rate η (SGD and Adam).
    pub lr: f64,
    /// Adam β1.
    pub beta1: f64,
    /// Adam β2.
    pub beta2: f64,
    /// Adam adaptivity τ.
    pub tau: f64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            aggregation: AggregationRule::Auto,
            optimizer: ServerOptimizer::Replace,
            lr: 1.0,
            beta1: 0.9,
            beta2: 0.99,
            tau: 1e-3,
        }
    }
}

/// Aggregation weight of each selected entry (duplicates are separate entries).
///
/// `selector_weights` must be given for [`AggregationRule::Selector`].
pub fn weights(
    rule: AggregationRule,
    selected: &[usize],
    sizes: &[usize],
    selector_weights: Option<&[f64]>,
) -> Vec<f64> {
    let m = selected.len() as f64;
    match rule {
        AggregationRule::Auto => unreachable!("the engine resolves `auto` before aggregating"),
        AggregationRule::Mean => vec![1.0 / m; selected.len()],
        AggregationRule::DataSize => {
            let total: f64 = selected.iter().map(|&k| sizes[k] as f64).sum();
            selected.iter().map(|&k| sizes[k] as f64 / total).collect()
        }
        AggregationRule::Selector => selector_weights
            .expect("the engine checks that a selector-weighted rule gets weights")
            .to_vec(),
    }
}

/// Δ = Σ_k w_k (x_k − global), summed in the given order. Entries of weight 0 are
/// skipped, so a dropped non-finite model cannot poison the sum.
pub fn delta(global: &[f32], locals: &[&[f32]], w: &[f64]) -> Vec<f32> {
    let mut acc = vec![0f64; global.len()];
    for (x, &wk) in locals.iter().zip(w).filter(|(_, w)| **w != 0.0) {
        for ((a, &xi), &gi) in acc.iter_mut().zip(x.iter()).zip(global) {
            *a += wk * (xi as f64 - gi as f64);
        }
    }
    acc.into_iter().map(|a| a as f32).collect()
}

/// The server optimizer and its state.
#[derive(Debug, Clone)]
pub struct Server {
    cfg: ServerConfig,
    m: Vec<f32>,
    v: Vec<f32>,
}

impl Server {
    /// A server resuming with saved Adam moments (empty for the other optimizers).
    pub fn with_moments(cfg: &ServerConfig, m: Vec<f32>, v: Vec<f32>) -> Self {
        Self {
            cfg: cfg.clone(),
            m,
            v,
        }
    }

    /// The Adam moments (m, v); empty before the first Adam step and for other optimizers.
    pub fn moments(&self) -> (&[f32], &[f32]) {
        (&self.m, &self.v)
    }

    /// A server with empty optimizer state.
    pub fn new(cfg: &ServerConfig) -> Self {
        Self {
            cfg: cfg.clone(),
            m: Vec::new(),
            v: Vec::new(),
        }
    }

    /// Applies Δ to the global parameters.
    ///
    /// FedAdam follows Reddi et al. (2021), Alg. 2: m ← β1 m + (1−β1) Δ,
    /// v ← β2 v + (1−β2) Δ², w ← w + η m / (√v + τ), without bias correction.
    pub fn step(&mut self, global: &mut [f32], delta: &[f32]) {
        let c = &self.cfg;
        match c.optimizer {
            ServerOptimizer::Replace => global.iter_mut().zip(delta).for_each(|(w, d)| *w += d),
            ServerOptimizer::Sgd => {
                let lr = c.lr as f32;
                global.iter_mut().zip(delta).for_each(|(w, d)| *w += lr * d)
            }
            ServerOptimizer::Adam => {
                if self.m.is_empty() {
                    self.m = vec![0.0; global.len()];
                    self.v = vec![0.0; global.len()];
                }
                let (b1, b2, lr, tau) = (c.beta1 as f32, c.beta2 as f32, c.lr as f32, c.tau as f32);
                for (((w, &d), m), v) in global
                    .iter_mut()
                    .zip(delta)
                    .zip(&mut self.m)
                    .zip(&mut self.v)
                {
                    *m = b1 * *m + (1.0 - b1) * d;
                    *v = b2 * *v + (1.0 - b2) * d * d;
                    *w += lr * *m / (v.sqrt() + tau);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_match_hand_computed_cases() {
        let sizes = [10, 30, 60];
        assert_eq!(
            weights(AggregationRule::Mean, &[0, 2, 2, 1], &sizes, None),
            vec![0.25; 4]
        );
        assert_eq!(
            weights(AggregationRule::DataSize, &[0, 1], &sizes, None),
            vec![0.25, 0.75]
        );
        assert_eq!(
            weights(AggregationRule::Selector, &[2], &sizes, Some(&[3.0])),
            vec![3.0]
        );
    }

    #[test]
    fn replace_gives_the_weighted_average_and_duplicates_count_twice() {
        let global = [0.0f32, 1.0];
        let a = [1.0f32, 1.0];
        let b = [4.0f32, -2.0];
        // MD sampling drew b twice: mean of (a, b, b) = (3, -1).
        let w = weights(AggregationRule::Mean, &[0, 1, 1], &[1, 1], None);
        let d = delta(&global, &[&a, &b, &b], &w);
        let mut g = global;
        Server::new(&ServerConfig::default()).step(&mut g, &d);
        assert!(
            (g[0] - 3.0).abs() < 1e-6 && (g[1] + 1.0).abs() < 1e-6,
            "{g:?}"
        );
    }

    #[test]
    fn server_sgd_and_adam_match_hand_computation() {
        let cfg = ServerConfig {
            optimizer: ServerOptimizer::Sgd,
            lr: 0.5,
            ..ServerConfig::default()
        };
        let mut g = [1.0f32];
        Server::new(&cfg).step(&mut g, &[2.0]);
        assert_eq!(g, [2.0]);
        let cfg = ServerConfig {
            optimizer: ServerOptimizer::Adam,
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.99,
            tau: 1e-3,
            ..ServerConfig::default()
        };
        let mut s = Server::new(&cfg);
        let mut g = [0.0f32];
        s.step(&mut g, &[1.0]);
        // m = 0.1, v = 0.01, step = 0.1 · 0.1 / (0.1 + 0.001).
        assert!((g[0] - 0.01 / 0.101).abs() < 1e-6, "{g:?}");
        s.step(&mut g, &[1.0]);
        // m = 0.19, v = 0.0199.
        let expected = 0.01 / 0.101 + 0.1 * 0.19 / (0.0199f64.sqrt() + 0.001);
        assert!((g[0] as f64 - expected).abs() < 1e-5, "{g:?} vs {expected}");
    }
}

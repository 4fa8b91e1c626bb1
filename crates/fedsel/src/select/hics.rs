//! HiCS-FL (Chen & Vikalo; seed 003): hierarchical clustered sampling guided
//! by data heterogeneity estimated from output-layer updates.
//!
//! - Warm-up (Alg. 1 lines 3–4): for ⌈N/K⌉ rounds, K clients drawn uniformly
//!   without replacement from those that have not reported yet.
//! - Heterogeneity (Eq. 7): Ĥ_k = H(softmax(Δb_k / T)) from client k's latest
//!   output-bias update Δb_k (Alg. 1 line 18); the weight-row-mean statistic of
//!   the authors' code is an option, and so is scaling the statistic to unit
//!   length first (ours: Ĥ then ignores how far a client moved, which otherwise
//!   depends on its class mix and step count). The softmax is max-shifted.
//! - Distance (Eq. 9): λ·arccos(cos(Δb_u, Δb_k)) + (1 − λ)·|Ĥ_u − Ĥ_k|.
//! - Ward clustering of the rows of that matrix into M groups (decisions.md).
//! - Sampling (Eq. 10): group m with probability ∝ exp(γ_t H̄_m), γ_t =
//!   γ⁰(1 − t/T), then a member ∝ p_k; a round never holds a client twice, so
//!   a group without unpicked members is redrawn.
//!
//! The estimates see only the bias (or weight) part of the uploaded updates.
//! The **oracle** label histograms this selector asks for feed the diagnostic
//! `entropy.csv` (true vs estimated entropy) and nothing else.

use rand::Rng as _;
use rand::seq::index::sample;
use serde::{Deserialize, Serialize};

use super::{
    ClientQuery, Feedback, Needs, RoundContext, Selection, Selector, Setup, UpdateKind, ward,
};
use crate::config::{HicsConfig, HicsStatistic};
use crate::error::Error;
use crate::rng::Rng;

/// Entropy (nats) of softmax(x / T), max-shifted.
pub fn softmax_entropy(x: &[f64], temperature: f64) -> f64 {
    let max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = x.iter().map(|v| ((v - max) / temperature).exp()).collect();
    let z: f64 = e.iter().sum();
    e.iter()
        .map(|v| v / z)
        .filter(|&p| p > 0.0)
        .map(|p| -p * p.ln())
        .sum()
}

/// The HiCS-FL selector.
#[derive(Debug, Clone)]
pub struct Hics {
    cfg: HicsConfig,
    n: usize,
    classes: usize,
    rounds: usize,
    weights: Vec<f64>,
    true_entropy: Option<Vec<f64>>,
    state: State,
    log: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct State {
    /// Latest output-layer update per client: bias (C values) then weight.
    latest: Vec<Vec<f32>>,
    /// Clients that have not reported during warm-up.
    unseen: Vec<usize>,
}

impl Hics {
    /// A selector with the given settings.
    pub fn new(cfg: HicsConfig) -> Self {
        Self {
            cfg,
            n: 0,
            classes: 0,
            rounds: 0,
            weights: Vec::new(),
            true_entropy: None,
            state: State::default(),
            log: String::new(),
        }
    }

    /// The statistic of client k that Eq. 7 turns into a distribution.
    fn statistic(&self, k: usize) -> Vec<f64> {
        let u = &self.state.latest[k];
        let c = self.classes;
        if u.is_empty() {
            return vec![0.0; c];
        }
        match self.cfg.statistic {
            HicsStatistic::Bias => u[..c].iter().map(|&x| f64::from(x)).collect(),
            HicsStatistic::WeightRows => {
                // The weight is [hidden, C] row-major: class j's weights are column j.
                let w = &u[c..];
                let h = w.len() / c;
                (0..c)
                    .map(|j| (0..h).map(|i| f64::from(w[i * c + j])).sum::<f64>() / h as f64)
                    .collect()
            }
        }
    }

    /// Ĥ of every client.
    pub fn estimates(&self) -> Vec<f64> {
        (0..self.n)
            .map(|k| {
                let mut x = self.statistic(k);
                if self.cfg.normalize {
                    let norm = x.iter().map(|v| v * v).sum::<f64>().sqrt();
                    if norm > 0.0 {
                        x.iter_mut().for_each(|v| *v /= norm);
                    }
                }
                softmax_entropy(&x, self.cfg.temperature)
            })
            .collect()
    }

    /// Eq. 9 distances between all clients.
    fn distances(&self, h: &[f64]) -> Vec<Vec<f64>> {
        let c = self.classes;
        let bias: Vec<Vec<f64>> = (0..self.n)
            .map(|k| {
                let u = &self.state.latest[k];
                if u.is_empty() {
                    vec![0.0; c]
                } else {
                    u[..c].iter().map(|&x| f64::from(x)).collect()
                }
            })
            .collect();
        let norm: Vec<f64> = bias
            .iter()
            .map(|b| b.iter().map(|x| x * x).sum::<f64>().sqrt())
            .collect();
        let l = self.cfg.lambda;
        (0..self.n)
            .map(|u| {
                (0..self.n)
                    .map(|k| {
                        if u == k {
                            return 0.0;
                        }
                        let angle = if norm[u] == 0.0 || norm[k] == 0.0 {
                            0.0
                        } else {
                            let dot: f64 = bias[u].iter().zip(&bias[k]).map(|(a, b)| a * b).sum();
                            (dot / (norm[u] * norm[k])).clamp(-1.0, 1.0).acos()
                        };
                        l * angle + (1.0 - l) * (h[u] - h[k]).abs()
                    })
                    .collect()
            })
            .collect()
    }

    fn warmup_rounds(&self, k: usize) -> usize {
        self.n.div_ceil(k.max(1))
    }
}

impl Selector for Hics {
    fn name(&self) -> &'static str {
        "hics"
    }

    fn needs(&self) -> Needs {
        Needs {
            updates: UpdateKind::OutputLayer,
            oracle_label_histograms: self.cfg.entropy_report,
            ..Needs::default()
        }
    }

    fn setup(&mut self, setup: &Setup) {
        self.n = setup.sizes.len();
        self.classes = setup.classes;
        self.rounds = setup.rounds;
        self.weights = setup.weights.clone();
        self.true_entropy = setup.oracle_label_histograms.as_ref().map(|hs| {
            hs.iter()
                .map(|h| {
                    let n: usize = h.iter().sum();
                    h.iter()
                        .filter(|&&c| c > 0)
                        .map(|&c| {
                            let p = c as f64 / n as f64;
                            -p * p.ln()
                        })
                        .sum()
                })
                .collect()
        });
        self.state = State {
            latest: vec![Vec::new(); self.n],
            unseen: (0..self.n).collect(),
        };
    }

    fn select(
        &mut self,
        ctx: &RoundContext<'_>,
        _: &mut dyn ClientQuery,
        rng: &mut Rng,
    ) -> Result<Selection, Error> {
        let k = ctx.budget;
        let open = |c: &usize| ctx.available.binary_search(c).is_ok();
        if ctx.round < self.warmup_rounds(k) && !self.state.unseen.is_empty() {
            let pool: Vec<usize> = self.state.unseen.iter().copied().filter(open).collect();
            let mut clients: Vec<usize> = sample(rng, pool.len(), k.min(pool.len()))
                .into_iter()
                .map(|i| pool[i])
                .collect();
            clients.sort_unstable();
            self.state.unseen.retain(|c| !clients.contains(c));
            return Ok(Selection {
                clients,
                weights: None,
            });
        }
        let h = self.estimates();
        if let Some(truth) = &self.true_entropy {
            for c in 0..self.n {
                self.log
                    .push_str(&format!("{},{c},{:.6},{:.6}\n", ctx.round, truth[c], h[c]));
            }
        }
        let clusters_wanted = if self.cfg.clusters == 0 {
            k
        } else {
            self.cfg.clusters
        };
        let merges = ward::linkage(&self.distances(&h));
        let groups: Vec<Vec<usize>> = ward::cut_into(&merges, self.n, clusters_wanted)
            .into_iter()
            .map(|g| g.into_iter().filter(open).collect::<Vec<_>>())
            .filter(|g: &Vec<usize>| !g.is_empty())
            .collect();
        let gamma = self.cfg.gamma0 * (1.0 - ctx.round as f64 / self.rounds.max(1) as f64);
        let score: Vec<f64> = groups
            .iter()
            .map(|g| gamma * g.iter().map(|&c| h[c]).sum::<f64>() / g.len() as f64)
            .collect();
        let top = score.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let pi: Vec<f64> = score.iter().map(|s| (s - top).exp()).collect();
        let want = k.min(ctx.available.len());
        let mut left: Vec<Vec<usize>> = groups;
        let mut clients = Vec::with_capacity(want);
        while clients.len() < want {
            // Redraw a group with no unpicked member left: draw among the non-empty ones.
            let live: Vec<usize> = (0..left.len()).filter(|&g| !left[g].is_empty()).collect();
            let total: f64 = live.iter().map(|&g| pi[g]).sum();
            let mut u = rng.random::<f64>() * total;
            let g = *live
                .iter()
                .find(|&&g| {
                    u -= pi[g];
                    u < 0.0
                })
                .unwrap_or(live.last().expect("fewer picks than available clients"));
            let members = &mut left[g];
            let mass: f64 = members.iter().map(|&c| self.weights[c]).sum();
            let mut v = rng.random::<f64>() * mass;
            let i = members
                .iter()
                .position(|&c| {
                    v -= self.weights[c];
                    v < 0.0
                })
                .unwrap_or(members.len() - 1);
            clients.push(members.remove(i));
        }
        clients.sort_unstable();
        Ok(Selection {
            clients,
            weights: None,
        })
    }

    fn observe(&mut self, feedback: &Feedback<'_>) {
        if let Some(updates) = feedback.updates {
            for (&k, u) in feedback.selected.iter().zip(updates) {
                self.state.latest[k] = u.clone();
            }
        }
    }

    fn save(&self) -> serde_json::Value {
        super::save_state(&self.state)
    }

    fn load(&mut self, state: &serde_json::Value) -> Result<(), Error> {
        self.state = super::load_state("hics", state)?;
        Ok(())
    }

    fn reports(&self) -> Vec<(String, String)> {
        if self.true_entropy.is_none() {
            return Vec::new();
        }
        vec![(
            "entropy.csv".into(),
            format!("round,client,true_entropy,estimated_entropy\n{}", self.log),
        )]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Eq. 4: under SGD a client's bias update for class c is proportional to its share of
    /// c minus the model's mean prediction of c, so a one-class client's Δb has one large
    /// entry and a balanced client's is flat. Ĥ must put the balanced one higher.
    #[test]
    fn a_balanced_client_has_higher_estimated_entropy_than_a_one_class_client() {
        let t = 0.0025;
        // Predictions start uniform (0.1 each); lr·steps = 0.05.
        let step = |share: &[f64]| -> Vec<f64> { share.iter().map(|s| 0.05 * (s - 0.1)).collect() };
        let balanced = step(&[0.1; 10]);
        let mut one = vec![0.0; 10];
        one[3] = 1.0;
        let one_class = step(&one);
        let (hb, ho) = (
            softmax_entropy(&balanced, t),
            softmax_entropy(&one_class, t),
        );
        assert!((hb - 10f64.ln()).abs() < 1e-9, "{hb}");
        assert!(ho < 0.01, "{ho}");
        // Mildly skewed lies in between.
        let skew = step(&[0.3, 0.2, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05, 0.0, 0.0]);
        let hs = softmax_entropy(&skew, t);
        assert!(ho < hs && hs < hb, "{ho} {hs} {hb}");
        // Max-shifting keeps huge updates finite.
        assert!(softmax_entropy(&[1e3, 0.0], 1e-3).is_finite());
    }
}

//! HiCS-FL (Chen & Vikalo; seed 003): hierarchical clustered sampling guided
//! by data heterogeneity estimated from output-layer updates.
//!
//! - Warm-up (Alg. 1 lines 3–4): for ⌈N/K⌉ rounds, K clients drawn uniformly
//!   without replacement from those that have not reported yet.
//! - Heterogeneity (Eq. 7): Ĥ_k = H(softmax(Δb_k / T)) from client k's latest
//!   output-bias update Δb_k (Alg. 1 line 18), max-shifted; the weight-row-mean
//!   statistic of the authors' code is an option.
//! - The `positive_part` estimator (ours) takes the entropy of Δb⁺/ΣΔb⁺ instead.
//!   Eq. 5 gives E[Δb_i] ∝ D_i − Ē_i (the client's share of class i minus the
//!   model's mean prediction of it), and App. 6.9 argues that balanced clients
//!   show more positive entries. A fixed T only works while every client's Δb
//!   has the scale T was tuned for: with momentum, longer local work or a model
//!   that already fits a client's classes, the softmax saturates to one-hot or
//!   flattens to uniform. The positive part keeps Eq. 5's linearity and has no
//!   scale to tune; on FMNIST setting (2) it ranks clients by true entropy at
//!   ρ ≈ 0.9 where the softmax reaches ρ ≈ 0.5–0.6 (README, issue 6 note).
//! - Distance (Eq. 9): λ·arccos(cos(Δb_u, Δb_k)) + (1 − λ)·|Ĥ_u − Ĥ_k|.
//! - Ward clustering of the rows of that matrix into M groups (decisions.md).
//! - Optionally (`cs_switch`, the authors' code, off by default): in a round where
//!   Var(Ĥ) reaches the threshold, Clustered Sampling Alg. 2 on the same rows
//!   with weights p_k, one client per bucket.
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
    ClientQuery, Feedback, Needs, RoundContext, Selection, Selector, Setup, UpdateKind, clustered,
    ward,
};
use crate::config::{HicsConfig, HicsEstimator, HicsStatistic};
use crate::diagnostics::shannon_entropy;
use crate::error::Error;
use crate::rng::Rng;

/// Entropy (nats) of softmax(x / T), max-shifted.
pub fn softmax_entropy(x: &[f64], temperature: f64) -> f64 {
    let max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = x.iter().map(|v| ((v - max) / temperature).exp()).collect();
    shannon_entropy(&e)
}

/// Entropy (nats) of x⁺ / Σ x⁺; ln C when no entry is positive (no evidence,
/// as softmax(0) gives).
pub fn positive_part_entropy(x: &[f64]) -> f64 {
    let positive: Vec<f64> = x.iter().map(|v| v.max(0.0)).collect();
    if positive.iter().all(|&v| v == 0.0) {
        return (x.len() as f64).ln();
    }
    shannon_entropy(&positive)
}

/// Population variance (numpy's default, as the authors' switch computes it).
fn variance(x: &[f64]) -> f64 {
    let n = x.len().max(1) as f64;
    let mean = x.iter().sum::<f64>() / n;
    x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n
}

/// The HiCS-FL selector.
#[derive(Debug, Clone)]
pub struct Hics {
    cfg: HicsConfig,
    n: usize,
    classes: usize,
    rounds: usize,
    sizes: Vec<usize>,
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
            sizes: Vec::new(),
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
                let x = self.statistic(k);
                match self.cfg.estimator {
                    HicsEstimator::Softmax => softmax_entropy(&x, self.cfg.temperature),
                    HicsEstimator::PositivePart => positive_part_entropy(&x),
                }
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
        self.sizes = setup.sizes.clone();
        self.weights = setup.weights.clone();
        self.true_entropy = setup.oracle_label_histograms.as_ref().map(|hs| {
            hs.iter()
                .map(|h| shannon_entropy(&h.iter().map(|&c| c as f64).collect::<Vec<_>>()))
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
        let distances = self.distances(&h);
        if self.cfg.cs_switch > 0.0 && variance(&h) >= self.cfg.cs_switch {
            let buckets = clustered::similarity_buckets(&distances, &self.sizes, k, rng);
            return Ok(Selection {
                clients: clustered::draw(&buckets, ctx.available, rng),
                weights: None,
            });
        }
        let merges = ward::linkage(&distances);
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
        // The positive part orders one class < skewed (two entries above the mean
        // prediction: ⅔, ⅓) < five balanced classes (ln 5), at any scale of the update.
        let five = step(&[0.2, 0.2, 0.2, 0.2, 0.2, 0.0, 0.0, 0.0, 0.0, 0.0]);
        for scale in [1e-3, 1.0, 1e3] {
            let h =
                |u: &[f64]| positive_part_entropy(&u.iter().map(|v| v * scale).collect::<Vec<_>>());
            let (ho, hs, h5) = (h(&one_class), h(&skew), h(&five));
            assert!(ho.abs() < 1e-12, "{ho}");
            let two_thirds =
                -(2.0 / 3.0f64) * (2.0 / 3.0f64).ln() - (1.0 / 3.0f64) * (1.0 / 3.0f64).ln();
            assert!((hs - two_thirds).abs() < 1e-9, "{hs}");
            assert!((h5 - 5f64.ln()).abs() < 1e-9, "{h5}");
        }
    }

    /// The authors' switch: with Ĥ = (0, 0, ln 2, ln 2) (positive parts of one-class and
    /// two-class updates), Var(Ĥ) = (ln 2)²/4 = 0.120. A threshold of 0.1 selects by
    /// Clustered Sampling Alg. 2 on the Eq. 9 rows; 0.2, like no switch, by Eq. 10.
    #[test]
    fn the_cs_switch_follows_the_variance_of_the_estimates() {
        let selector = |cs_switch: f64| {
            let mut h = Hics::new(HicsConfig {
                estimator: HicsEstimator::PositivePart,
                cs_switch,
                ..HicsConfig::default()
            });
            h.setup(&Setup {
                classes: 3,
                rounds: 10,
                ..crate::select::testing::setup(&[0.1, 0.2, 0.3, 0.4])
            });
            h.state.latest = vec![
                vec![1.0, -0.5, -0.5],
                vec![-0.5, 1.0, -0.5],
                vec![0.5, 0.5, -1.0],
                vec![-1.0, 0.5, 0.5],
            ];
            h.state.unseen.clear();
            h
        };
        let est = selector(0.0).estimates();
        assert!((variance(&est) - 2f64.ln().powi(2) / 4.0).abs() < 1e-12);
        let ctx = RoundContext {
            round: 5,
            available: &[0, 1, 2, 3],
            budget: 2,
        };
        let pick = |cs_switch: f64, seed: u64| {
            let mut rng = crate::rng::stream(seed, crate::rng::Purpose::Selection, 5, 0);
            let mut q = crate::select::testing::FixedLosses(vec![0.0; 4]);
            selector(cs_switch)
                .select(&ctx, &mut q, &mut rng)
                .unwrap()
                .clients
        };
        let reference = selector(0.0);
        for seed in 0..50 {
            let mut rng = crate::rng::stream(seed, crate::rng::Purpose::Selection, 5, 0);
            let buckets = clustered::similarity_buckets(
                &reference.distances(&est),
                &reference.sizes,
                ctx.budget,
                &mut rng,
            );
            assert_eq!(
                pick(0.1, seed),
                clustered::draw(&buckets, ctx.available, &mut rng)
            );
            assert_eq!(pick(0.2, seed), pick(0.0, seed));
        }
    }

    /// Hand-computed: x⁺ = (0.3, 0.1, 0, 0) → (3/4, 1/4), entropy
    /// −(¾ ln ¾ + ¼ ln ¼) = 0.562335; no positive entry → ln C.
    #[test]
    fn positive_part_entropy_matches_hand_computation() {
        let h = positive_part_entropy(&[0.3, 0.1, -0.2, -0.2]);
        assert!((h - 0.562_335_144).abs() < 1e-8, "{h}");
        assert!((positive_part_entropy(&[0.0; 10]) - 10f64.ln()).abs() < 1e-12);
        assert!((positive_part_entropy(&[-1.0, -2.0]) - 2f64.ln()).abs() < 1e-12);
    }
}

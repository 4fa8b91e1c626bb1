//! DivFL (Balakrishnan et al., ICLR 2022): select a diverse subset by greedy
//! facility location on client gradients.
//!
//! With G the available clients' gradients and D_ij = ‖g_i − g_j‖, the subset S
//! minimises Σ_{i∈A} min_{j∈S} D_ij (equivalently maximises the submodular
//! F(S) = Σ_i (L − min_{j∈S} D_ij), L = max D); greedy adds the client with the
//! largest gain, which guarantees F(S) ≥ (1 − 1/e) F(S*). The first pick is the
//! column with the smallest sum. Ties go to the lowest index.
//!
//! A client's gradient is, as in the DivFL code (algorithms.md §8), the full-batch
//! gradient of its mean loss over all its local training data at the global model it
//! receives; `gradient = "minibatch"` takes one batch instead, which is cheaper. The
//! ledger books the examples either passed over.
//!
//! Cost at N available clients with P parameters: O(N² P) a round for the distances
//! (N²/2 dot products, each kept in parameter order so that the selections stay bit for
//! bit), then O(K N²) for the greedy, and one N × N matrix. Under "ideal" refresh every
//! gradient is new each round, so no distance carries over: at 10,000 clients and 7,850
//! parameters that is 4·10¹¹ multiply-adds a round, the figure `fedsel bench` shows.
//!
//! Refresh (decisions.md): "ideal" asks every available client for its gradient
//! each round (the HiCS-FL comparison); "stale" asks all clients once
//! and afterwards only the selected ones, at the model they receive (the DivFL
//! code). Stochastic greedy evaluates a random subset of max(m, ⌊fraction·n⌋)
//! candidates per step.

mod distances;

use rand::seq::index::sample;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

pub use distances::gradient_distances;

use super::{ClientQuery, GradientScope, RoundContext, Selection, Selector, Setup};
use crate::error::{ConfigError, Error};
use crate::rng::Rng;
use crate::validate::check_prob;

/// How DivFL refreshes client gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DivflRefresh {
    /// Every available client sends its gradient every round.
    Ideal,
    /// All clients once, then only the selected, at the model they receive.
    Stale,
}

/// DivFL (Balakrishnan et al. 2022).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DivflConfig {
    /// Gradient refresh.
    pub refresh: DivflRefresh,
    /// What each client gradient covers: `full` (all local training data at the received
    /// global model, as the DivFL code computes it) or `minibatch` (one batch, cheaper).
    pub gradient: GradientScope,
    /// Stochastic greedy: scan a random subset of candidates per step.
    pub stochastic: bool,
    /// Size of that subset as a fraction of the available clients (at least m).
    pub fraction: f64,
}

impl Default for DivflConfig {
    fn default() -> Self {
        Self {
            refresh: DivflRefresh::Ideal,
            gradient: GradientScope::Full,
            stochastic: false,
            fraction: 0.1,
        }
    }
}

impl DivflConfig {
    /// Rejects a fraction no run can use, naming the key: the `selection.divfl` part of
    /// [`Config::validate`](crate::config::Config::validate).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        check_prob(self.fraction, "selection.divfl.fraction", true, false)
    }
}

/// Greedy facility location: `k` indices into `dist` (n × n), in pick order.
/// With `subsample = Some(s)` each step scans `s` random candidates (stochastic greedy).
pub fn facility_location(
    dist: &[Vec<f64>],
    k: usize,
    subsample: Option<usize>,
    rng: &mut Rng,
) -> Vec<usize> {
    let n = dist.len();
    let k = k.min(n);
    let mut chosen = Vec::with_capacity(k);
    let mut taken = vec![false; n];
    // Distance of each point to its nearest chosen facility; "∞" before the first pick
    // makes the first step the smallest column sum.
    let mut nearest = vec![f64::INFINITY; n];
    for _ in 0..k {
        let left: Vec<usize> = (0..n).filter(|&j| !taken[j]).collect();
        let candidates: Vec<usize> = match subsample {
            Some(s) if s < left.len() => {
                let mut c: Vec<usize> = sample(rng, left.len(), s)
                    .into_iter()
                    .map(|i| left[i])
                    .collect();
                c.sort_unstable();
                c
            }
            _ => left,
        };
        // Each candidate's cost is one sequential sum, whatever thread computes it; the
        // choice among them is made in candidate order.
        let costs: Vec<f64> = candidates
            .par_iter()
            .map(|&j| nearest.iter().zip(&dist[j]).map(|(&a, &b)| a.min(b)).sum())
            .collect();
        let best = candidates
            .iter()
            .copied()
            .zip(costs)
            .fold(None, |best: Option<(usize, f64)>, (j, c)| match best {
                Some((_, bc)) if bc <= c => best,
                _ => Some((j, c)),
            })
            .expect("k ≤ n leaves a candidate")
            .0;
        taken[best] = true;
        chosen.push(best);
        for (a, &b) in nearest.iter_mut().zip(&dist[best]) {
            *a = a.min(b);
        }
    }
    chosen
}

/// The DivFL selector.
#[derive(Debug, Clone)]
pub struct DivFl {
    cfg: DivflConfig,
    state: State,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct State {
    /// Latest gradient per client (stale refresh).
    gradients: Vec<Vec<f32>>,
}

impl DivFl {
    /// A selector with the given settings.
    pub fn new(cfg: DivflConfig) -> Self {
        Self {
            cfg,
            state: State::default(),
        }
    }
}

impl Selector for DivFl {
    fn name(&self) -> &'static str {
        "divfl"
    }

    fn setup(&mut self, setup: &Setup) {
        self.state.gradients = vec![Vec::new(); setup.sizes.len()];
    }

    fn select(
        &mut self,
        ctx: &RoundContext<'_>,
        query: &mut dyn ClientQuery,
        rng: &mut Rng,
    ) -> Result<Selection, Error> {
        let a = ctx.available;
        let fresh: Vec<Vec<f32>>;
        let g: Vec<&[f32]> = match self.cfg.refresh {
            DivflRefresh::Ideal => {
                fresh = query.gradients(a, self.cfg.gradient)?;
                fresh.iter().map(Vec::as_slice).collect()
            }
            DivflRefresh::Stale => {
                let missing: Vec<usize> = a
                    .iter()
                    .copied()
                    .filter(|&k| self.state.gradients[k].is_empty())
                    .collect();
                if !missing.is_empty() {
                    for (k, v) in missing
                        .iter()
                        .zip(query.gradients(&missing, self.cfg.gradient)?)
                    {
                        self.state.gradients[*k] = v;
                    }
                }
                a.iter()
                    .map(|&k| self.state.gradients[k].as_slice())
                    .collect()
            }
        };
        let dist = gradient_distances(&g);
        let subsample = self
            .cfg
            .stochastic
            .then(|| ((self.cfg.fraction * a.len() as f64).floor() as usize).max(ctx.budget));
        let mut clients: Vec<usize> = facility_location(&dist, ctx.budget, subsample, rng)
            .into_iter()
            .map(|i| a[i])
            .collect();
        clients.sort_unstable();
        if self.cfg.refresh == DivflRefresh::Stale && !clients.is_empty() {
            // The selected compute their gradient at the model they receive (DivFL code).
            for (k, v) in clients
                .iter()
                .zip(query.gradients(&clients, self.cfg.gradient)?)
            {
                self.state.gradients[*k] = v;
            }
        }
        Ok(Selection {
            clients,
            weights: None,
        })
    }

    fn save(&self) -> serde_json::Value {
        super::save_state(&self.state)
    }

    fn load(&mut self, state: &serde_json::Value) -> Result<(), Error> {
        let loaded: State = super::load_state("divfl", state)?;
        let n = self.state.gradients.len();
        super::check_loaded("divfl", "gradients", loaded.gradients.len(), n)?;
        self.state = loaded;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Purpose, stream};
    use rand::Rng as _;

    /// The four-at-a-time distances are the one-at-a-time sums bit for bit, for every
    /// remainder of the row length modulo the lanes.
    #[test]
    fn side_by_side_distances_equal_the_serial_sums() {
        let mut rng = stream(9, Purpose::Strategy, 0, 0);
        let g: Vec<Vec<f32>> = (0..11)
            .map(|_| (0..37).map(|_| rng.random_range(-1.0f32..1.0)).collect())
            .collect();
        let refs: Vec<&[f32]> = g.iter().map(Vec::as_slice).collect();
        let d = gradient_distances(&refs);
        let sq = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>();
        for i in 0..g.len() {
            for j in 0..g.len() {
                let dot: f64 = g[i]
                    .iter()
                    .zip(&g[j])
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum();
                let want = if i == j {
                    0.0
                } else {
                    (sq(&g[i]) + sq(&g[j]) - 2.0 * dot).max(0.0).sqrt()
                };
                assert_eq!(d[i][j].to_bits(), want.to_bits(), "{i} {j}");
            }
        }
    }

    fn cost(dist: &[Vec<f64>], set: &[usize]) -> f64 {
        (0..dist.len())
            .map(|i| {
                set.iter()
                    .map(|&j| dist[i][j])
                    .fold(f64::INFINITY, f64::min)
            })
            .sum()
    }

    /// F(S) = Σ_i (L − min_{j∈S} D_ij) with F(∅) = 0: greedy must reach (1 − 1/e) of the
    /// brute-force optimum, and equals it on a clearly clustered instance.
    #[test]
    fn greedy_meets_its_guarantee_against_brute_force() {
        let mut rng = stream(4, Purpose::Strategy, 0, 0);
        for trial in 0..30 {
            let n = 9;
            let pts: Vec<(f64, f64)> = (0..n).map(|_| (rng.random(), rng.random())).collect();
            let dist: Vec<Vec<f64>> = pts
                .iter()
                .map(|a| {
                    pts.iter()
                        .map(|b| ((a.0 - b.0).powi(2) + (a.1 - b.1).powi(2)).sqrt())
                        .collect()
                })
                .collect();
            let l = dist.iter().flatten().copied().fold(0.0, f64::max);
            let f = |s: &[usize]| n as f64 * l - cost(&dist, s);
            for k in [2, 3] {
                let greedy = facility_location(&dist, k, None, &mut rng);
                let mut best = 0.0f64;
                for mask in 0u32..(1 << n) {
                    if mask.count_ones() as usize == k {
                        let s: Vec<usize> = (0..n).filter(|&i| mask >> i & 1 == 1).collect();
                        best = best.max(f(&s));
                    }
                }
                let got = f(&greedy);
                assert!(
                    got >= (1.0 - (-1f64).exp()) * best - 1e-9,
                    "trial {trial}: {got} vs {best}"
                );
            }
        }
        // Three tight groups far apart: greedy with k = 3 takes one from each, the optimum.
        let pts: [f64; 8] = [0.0, 0.1, 0.2, 10.0, 10.1, 20.0, 20.1, 20.2];
        let dist: Vec<Vec<f64>> = pts
            .iter()
            .map(|a| pts.iter().map(|b| (a - b).abs()).collect())
            .collect();
        let mut s = facility_location(&dist, 3, None, &mut rng);
        s.sort();
        assert_eq!(s, vec![1, 3, 6]);
    }

    #[test]
    fn client_gradients_cover_the_configured_examples() {
        use crate::config::Config;
        use crate::select::testing::{Recording, setup};
        for (overrides, refresh, scope) in [
            (vec![], "ideal", "full_gradients"),
            (
                vec!["selection.divfl.refresh=\"stale\""],
                "stale",
                "full_gradients",
            ),
            (
                vec!["selection.divfl.gradient=\"minibatch\""],
                "ideal",
                "minibatch_gradients",
            ),
        ] {
            let overrides: Vec<String> = overrides.into_iter().map(String::from).collect();
            let cfg = Config::from_toml_str("", "d", &overrides).unwrap();
            let mut s = DivFl::new(cfg.selection.divfl);
            s.setup(&setup(&[0.25; 4]));
            let mut q = Recording::new(vec![0.1, 0.2, 0.3, 0.4], vec![]);
            let mut rng = stream(1, Purpose::Selection, 0, 0);
            let ctx = RoundContext {
                round: 0,
                available: &[0, 1, 2, 3],
                budget: 2,
            };
            s.select(&ctx, &mut q, &mut rng).unwrap();
            assert!(!q.calls.is_empty());
            assert!(
                q.calls.iter().all(|c| c.0 == scope),
                "{refresh}: {:?}",
                q.calls
            );
        }
    }

    #[test]
    fn gradient_distances_are_euclidean() {
        let a = [0.0f32, 3.0];
        let b = [4.0f32, 0.0];
        let d = gradient_distances(&[&a, &b, &a]);
        assert!((d[0][1] - 5.0).abs() < 1e-9 && (d[1][0] - 5.0).abs() < 1e-9 && d[0][2] == 0.0);
    }
}

//! Optimal Client Sampling (OCS): a selection strategy that fedsel does not ship, written
//! outside it against the public [`Selector`] trait and registered under the name `ocs`,
//! to show what a researcher's own method needs (this file, and [`register`] called
//! before the CLI runs; see `main.rs`).
//!
//! Chen, Horváth & Richtárik, "Optimal Client Sampling for Federated Learning", TMLR 2022
//! (arXiv:2010.13723), §3: every available client i computes its update U_i; the server
//! learns their norms and samples each client independently with probability p_i, chosen
//! to minimise the variance of the unbiased estimate Σ_{i∈S} (w_i / p_i) U_i of the full
//! update Σ_i w_i U_i under the budget Σ p_i = m (their optimal probabilities): with
//! ũ_i = ‖w_i U_i‖ sorted ascending, ũ_(1) ≤ … ≤ ũ_(n), and l the largest index with
//! 0 < m + l − n ≤ Σ_{j≤l} ũ_(j) / ũ_(l), the n − l largest are taken with p = 1 and the
//! others with p_(i) = (m + l − n) ũ_(i) / Σ_{j≤l} ũ_(j). The selected are aggregated
//! with the weights w_i / p_i (server.aggregation `selector`, which `auto` gives).
//!
//! Departures, both for this example's brevity: w_i = n_i / Σ n over the round's
//! available clients; and the norms come from `ClientQuery::local_updates`, booked as
//! probe trainings of every available client, after which the engine trains the selected
//! clients again (OCS's clients would send the update they computed). The paper samples
//! each client independently, so |S| varies around m; fedsel holds every strategy to at
//! most K_t clients a round, so the example draws the same inclusion probabilities by
//! systematic (Madow) sampling ([`systematic`]), which takes exactly m (each p_i ≤ 1, Σ p_i
//! = m): every client is in S with probability p_i as in the paper, and the estimate stays
//! unbiased; only the joint draw of two clients differs.
//!
//! `selection.params`: none.

use fedsel::aggregate::AggregationRule;
use fedsel::error::{ConfigError, Error};
use fedsel::rng::Rng;
use fedsel::select::{ClientQuery, RoundContext, Selection, Selector, Setup, registry};
use rand::Rng as _;

/// The OCS selector: it keeps only the clients' reported sizes.
#[derive(Debug, Default)]
pub struct Ocs {
    sizes: Vec<usize>,
}

impl Selector for Ocs {
    fn name(&self) -> &'static str {
        "ocs"
    }

    fn setup(&mut self, setup: &Setup) {
        self.sizes = setup.sizes.clone();
    }

    fn select(
        &mut self,
        ctx: &RoundContext<'_>,
        query: &mut dyn ClientQuery,
        rng: &mut Rng,
    ) -> Result<Selection, Error> {
        let available = ctx.available;
        if available.is_empty() || ctx.budget == 0 {
            return Ok(Selection {
                clients: Vec::new(),
                weights: Some(Vec::new()),
            });
        }
        let total: f64 = available.iter().map(|&k| self.sizes[k] as f64).sum();
        let w: Vec<f64> = available
            .iter()
            .map(|&k| self.sizes[k] as f64 / total)
            .collect();
        let updates = query.local_updates(available)?;
        let norms: Vec<f64> = updates
            .iter()
            .zip(&w)
            .map(|(u, wi)| {
                wi * u
                    .iter()
                    .map(|&x| f64::from(x) * f64::from(x))
                    .sum::<f64>()
                    .sqrt()
            })
            .collect();
        let p = probabilities(&norms, ctx.budget);
        // One draw from the round's stream places the m points.
        let picked = systematic(&p, rng.random());
        let clients = picked.iter().map(|&i| available[i]).collect();
        let weights = picked.iter().map(|&i| w[i] / p[i]).collect();
        Ok(Selection {
            clients,
            weights: Some(weights),
        })
    }
}

/// OCS's optimal inclusion probabilities for the scores `u` (ũ_i ≥ 0) and budget `m`
/// (module doc): they sum to min(m, n), none exceeds 1, and below the cap each is
/// proportional to its score. All scores 0 (no client would move the model): m/n each.
pub fn probabilities(u: &[f64], m: usize) -> Vec<f64> {
    let n = u.len();
    if m >= n {
        return vec![1.0; n];
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| u[a].total_cmp(&u[b]));
    let sorted: Vec<f64> = order.iter().map(|&i| u[i]).collect();
    let mut prefix = vec![0.0; n + 1];
    for (j, &x) in sorted.iter().enumerate() {
        prefix[j + 1] = prefix[j] + x;
    }
    // The largest l (1-based) with 0 < m + l − n ≤ Σ_{j≤l} ũ_(j) / ũ_(l).
    let l = (n - m + 1..=n).rev().find(|&l| {
        let top = sorted[l - 1];
        top > 0.0 && (m + l - n) as f64 * top <= prefix[l]
    });
    let mut p = vec![1.0; n];
    match l {
        Some(l) if prefix[l] > 0.0 => {
            let scale = (m + l - n) as f64 / prefix[l];
            for (rank, &i) in order.iter().enumerate().take(l) {
                p[i] = (scale * sorted[rank]).min(1.0);
            }
        }
        _ => p.fill(m as f64 / n as f64),
    }
    p
}

/// Systematic πps sampling (Madow, 1949): the indices i whose interval (C_{i−1}, C_i] of
/// the cumulative probabilities holds one of the points u, u + 1, …, u + ⌈Σ p⌉ − 1 for the
/// uniform `u` ∈ [0, 1). Each i is drawn with probability p_i (every p_i ≤ 1), and exactly
/// Σ p_i indices when that sum is whole; in ascending order.
pub fn systematic(p: &[f64], u: f64) -> Vec<usize> {
    // The sum rounded, so that rounding in the cumulative sums cannot add a point.
    let m = p.iter().sum::<f64>().round() as usize;
    let mut out = Vec::with_capacity(m);
    let (mut below, mut next) = (0.0, u);
    for (i, &pi) in p.iter().enumerate() {
        let above = below + pi;
        // The points fall in intervals of length ≤ 1: at most one in each.
        if next < above && out.len() < m {
            out.push(i);
            next += 1.0;
        }
        below = above;
    }
    out
}

/// Puts `ocs` in fedsel's strategy table, aggregated with its own weights.
pub fn register() -> Result<(), ConfigError> {
    registry::register("ocs", AggregationRule::Selector, |cfg| {
        if !cfg.params.is_empty() {
            return Err(ConfigError::invalid(
                "selection.params",
                "ocs takes no parameters",
            ));
        }
        Ok(Box::new(Ocs::default()))
    })
}

#[cfg(test)]
mod tests {
    use super::probabilities;

    /// n = 4, m = 2, scores 1, 1, 1, 6 (sum 9): the largest, 6, would get 2·6/9 > 1, so
    /// it is taken (l = 3) and the other three share m + l − n = 1 in proportion to their
    /// scores, 1/3 each.
    #[test]
    fn the_largest_update_is_capped_and_the_rest_share_what_is_left() {
        let p = probabilities(&[1.0, 6.0, 1.0, 1.0], 2);
        let want = [1.0 / 3.0, 1.0, 1.0 / 3.0, 1.0 / 3.0];
        for (a, b) in p.iter().zip(want) {
            assert!((a - b).abs() < 1e-12, "{p:?}");
        }
    }

    /// Without a dominant score the probabilities are m·ũ_i / Σ ũ: scores 1, 2, 3, 4 and
    /// m = 2 give 0.2, 0.4, 0.6, 0.8.
    #[test]
    fn below_the_cap_probabilities_are_proportional() {
        let p = probabilities(&[1.0, 2.0, 3.0, 4.0], 2);
        for (a, b) in p.iter().zip([0.2, 0.4, 0.6, 0.8]) {
            assert!((a - b).abs() < 1e-12, "{p:?}");
        }
        assert_eq!(probabilities(&[0.0; 4], 2), [0.5; 4]);
        assert_eq!(probabilities(&[3.0, 1.0], 5), [1.0; 2]);
    }

    /// Probabilities 0.2, 0.4, 0.6, 0.8 (sum 2) lay out as (0, 0.2], (0.2, 0.6], (0.6, 1.2],
    /// (1.2, 2.0]: u = 0.1 puts the points 0.1 and 1.1 in the first and third; u = 0.5 puts
    /// 0.5 and 1.5 in the second and fourth. Over a grid of u each index is drawn in the
    /// share p_i of it, and always exactly two.
    #[test]
    fn systematic_sampling_takes_exactly_m_with_each_probability() {
        let p = [0.2, 0.4, 0.6, 0.8];
        assert_eq!(super::systematic(&p, 0.1), [0, 2]);
        assert_eq!(super::systematic(&p, 0.5), [1, 3]);
        let grid = 10_000;
        let mut drawn = [0usize; 4];
        for g in 0..grid {
            let s = super::systematic(&p, (g as f64 + 0.5) / grid as f64);
            assert_eq!(s.len(), 2);
            s.iter().for_each(|&i| drawn[i] += 1);
        }
        for (d, pi) in drawn.iter().zip(p) {
            assert!((*d as f64 / grid as f64 - pi).abs() < 1e-3, "{drawn:?}");
        }
    }
}

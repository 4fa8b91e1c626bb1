//! Log-normal client sizes with Dirichlet label mixes (FedGS, CIFAR-10 setting).
//!
//! Sizes follow n_k ~ LogNormal(log(n/N) − σ²/2, σ), which keeps the mean size
//! at n/N (FedGS App., σ = 1), rescaled so they sum to n exactly (largest
//! remainders). Each client's labels follow p_k ~ Dir(α·p*), p* the class
//! frequencies. A client whose mix asks for more of a class than is left
//! draws a new mix, as the FedGS generator loops; after a bounded number of
//! redraws it takes what is left in proportion to the remaining pools.

use rand::seq::SliceRandom;
use rand_distr::{Distribution, LogNormal};

use super::{by_class, dirichlet};
use crate::error::PartitionError;
use crate::rng::Rng;

const REDRAWS: usize = 100;

/// Integer sizes proportional to `w` that sum to `total` (largest remainder).
fn apportion(w: &[f64], total: usize) -> Vec<usize> {
    let s: f64 = w.iter().sum();
    let raw: Vec<f64> = w.iter().map(|x| x / s * total as f64).collect();
    let mut out: Vec<usize> = raw.iter().map(|x| x.floor() as usize).collect();
    let mut order: Vec<usize> = (0..w.len()).collect();
    order.sort_by(|&a, &b| {
        (raw[b] - raw[b].floor())
            .total_cmp(&(raw[a] - raw[a].floor()))
            .then(a.cmp(&b))
    });
    let short = total - out.iter().sum::<usize>();
    for &i in order.iter().take(short) {
        out[i] += 1;
    }
    out
}

/// Partitions `labels` over `clients`.
pub fn partition(
    labels: &[u32],
    classes: usize,
    clients: usize,
    sigma: f64,
    alpha: f64,
    rng: &mut Rng,
) -> Result<Vec<Vec<usize>>, PartitionError> {
    let n = labels.len();
    let mean = n as f64 / clients as f64;
    let dist =
        LogNormal::new(mean.ln() - sigma * sigma / 2.0, sigma).map_err(|e| PartitionError {
            kind: "lognormal_dirichlet",
            reason: format!("bad log-normal: {e}"),
        })?;
    let w: Vec<f64> = (0..clients).map(|_| dist.sample(rng)).collect();
    let sizes = apportion(&w, n);
    let mut pools = by_class(labels, classes);
    for p in &mut pools {
        p.shuffle(rng);
    }
    let prior: Vec<f64> = pools
        .iter()
        .map(|p| alpha * p.len() as f64 / n as f64)
        .map(|a| a.max(1e-12))
        .collect();
    let mut parts = Vec::with_capacity(clients);
    for &size in &sizes {
        let left: Vec<usize> = pools.iter().map(Vec::len).collect();
        let mut want = None;
        for _ in 0..REDRAWS {
            let mix = dirichlet(&prior, rng);
            let w: Vec<f64> = mix.iter().map(|m| m * size as f64).collect();
            let counts = apportion(&w, size);
            if counts.iter().zip(&left).all(|(c, l)| c <= l) {
                want = Some(counts);
                break;
            }
        }
        let counts = want.unwrap_or_else(|| {
            let l: Vec<f64> = left.iter().map(|&x| x as f64).collect();
            let mut c = apportion(&l, size);
            // Apportioning by what is left never asks for more than is left, up to rounding.
            for (ci, li) in c.iter_mut().zip(&left) {
                *ci = (*ci).min(*li);
            }
            c
        });
        let mut mine = Vec::with_capacity(size);
        for (pool, c) in pools.iter_mut().zip(counts) {
            mine.extend(pool.drain(pool.len() - c..));
        }
        mine.shuffle(rng);
        parts.push(mine);
    }
    // Rounding in the fallback can leave a few examples; give them to the last clients.
    let rest: Vec<usize> = pools.into_iter().flatten().collect();
    for (i, e) in rest.into_iter().enumerate() {
        let k = clients - 1 - (i % clients);
        parts[k].push(e);
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::testing::{assert_disjoint, labels};
    use crate::rng::{Purpose, stream};

    #[test]
    fn sizes_are_spread_and_samples_conserved() {
        let labels = labels(500);
        let parts = partition(
            &labels,
            10,
            100,
            1.0,
            1.75,
            &mut stream(7, Purpose::Partition, 0, 0),
        )
        .unwrap();
        assert_eq!(assert_disjoint(&parts, labels.len()), labels.len());
        let mut sizes: Vec<usize> = parts.iter().map(Vec::len).collect();
        sizes.sort();
        // σ = 1: the largest client is several times the median one.
        assert!(sizes[99] as f64 > 3.0 * sizes[50] as f64, "{sizes:?}");
    }

    #[test]
    fn apportion_sums_exactly() {
        assert_eq!(apportion(&[1.0, 1.0, 1.0], 10).iter().sum::<usize>(), 10);
        assert_eq!(apportion(&[0.5, 0.25, 0.25], 4), vec![2, 1, 1]);
    }
}

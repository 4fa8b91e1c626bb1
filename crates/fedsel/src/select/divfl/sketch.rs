//! A count sketch of client gradients (Charikar, Chen and Farach-Colton 2002; the signed
//! feature hashing of Weinberger et al. 2009): parameter p adds s(p)·g_p to bucket h(p),
//! with h uniform over the m buckets and s a fair sign. For any two gradients,
//! E‖Sx − Sy‖² = ‖x − y‖² and the relative standard deviation of that estimate is at most
//! √(2/m), about 4.4 % at m = 1,024 (2.2 % on the distance itself).
//!
//! DivFL's ideal refresh needs all N² distances between N fresh gradients of P parameters
//! every round: N²P/2 multiply-adds, 4·10¹¹ at 10,000 clients and 7,850 parameters, four
//! seconds at the f64 peak of two cores. Sketched, the same pass is N P additions and
//! N²m/2 multiply-adds: the greedy then works on distances within a few per cent, which
//! is why [`super::DivflDistances::Auto`] sketches only above every paper's size.

use rand::Rng as _;
use rayon::prelude::*;

use crate::rng::Rng;

/// One draw of (h, s) over P parameters into m buckets.
#[derive(Debug, Clone)]
pub(super) struct CountSketch {
    /// h(p).
    bucket: Vec<u32>,
    /// s(p) ∈ {−1, +1}.
    sign: Vec<f64>,
    /// m.
    dim: usize,
}

impl CountSketch {
    /// Draws h and s for `params` parameters into `dim` buckets (`dim` ≥ 1).
    pub(super) fn draw(params: usize, dim: usize, rng: &mut Rng) -> Self {
        let buckets = u32::try_from(dim).expect("sketch_dim is validated to fit in u32");
        let (bucket, sign) = (0..params)
            .map(|_| {
                let b = rng.random_range(0..buckets);
                let s = if rng.random::<bool>() { 1.0 } else { -1.0 };
                (b, s)
            })
            .unzip();
        Self { bucket, sign, dim }
    }

    /// S g for each gradient, side by side. Each bucket's sum runs in parameter order
    /// in f64 and is rounded once to f32, the precision [`super::gradient_distances`]
    /// takes: the rounding (2⁻²⁴ relative) is far below the sketch's own error.
    pub(super) fn apply(&self, gradients: &[Vec<f32>]) -> Vec<Vec<f32>> {
        gradients
            .par_iter()
            .map(|g| {
                assert_eq!(g.len(), self.bucket.len(), "a gradient of every parameter");
                let mut acc = vec![0.0f64; self.dim];
                for ((&x, &b), &s) in g.iter().zip(&self.bucket).zip(&self.sign) {
                    acc[b as usize] += s * f64::from(x);
                }
                acc.into_iter().map(|v| v as f32).collect()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Purpose, stream};

    /// Hand-computed: h = (0, 1, 0), s = (+, −, −) sends (1, 2, 3) to (1 − 3, −2).
    #[test]
    fn buckets_add_signed_parameters() {
        let sketch = CountSketch {
            bucket: vec![0, 1, 0],
            sign: vec![1.0, -1.0, -1.0],
            dim: 2,
        };
        assert_eq!(
            sketch.apply(&[vec![1.0, 2.0, 3.0], vec![0.5, 0.0, 0.25]]),
            vec![vec![-2.0, -2.0], vec![0.25, 0.0]]
        );
    }

    /// Over many pairs the squared distances are unbiased and within the √(2/m) spread:
    /// the mean ratio lies within 1 % of 1 and the ratios' standard deviation within 1.2
    /// √(2/m) at m = 1,024 over 4,000 parameters (the pairs share one draw, so their
    /// spread estimates the bound with some noise of its own).
    #[test]
    fn squared_distances_are_unbiased_within_the_bound() {
        let mut rng = stream(2, Purpose::Strategy, 0, 0);
        let (n, params, dim) = (60, 4000, 1024);
        let g: Vec<Vec<f32>> = (0..n)
            .map(|_| {
                (0..params)
                    .map(|_| rng.random_range(-1.0f32..1.0))
                    .collect()
            })
            .collect();
        let sg = CountSketch::draw(params, dim, &mut rng).apply(&g);
        let sq = |v: &[Vec<f32>], i: usize, j: usize| {
            v[i].iter()
                .zip(&v[j])
                .map(|(a, b)| (f64::from(*a) - f64::from(*b)).powi(2))
                .sum::<f64>()
        };
        let ratios: Vec<f64> = (0..n)
            .flat_map(|i| (i + 1..n).map(move |j| (i, j)))
            .map(|(i, j)| sq(&sg, i, j) / sq(&g, i, j))
            .collect();
        let mean = ratios.iter().sum::<f64>() / ratios.len() as f64;
        let sd = (ratios.iter().map(|r| (r - mean).powi(2)).sum::<f64>()
            / (ratios.len() - 1) as f64)
            .sqrt();
        assert!((mean - 1.0).abs() < 0.01, "mean ratio {mean}");
        assert!(sd < 1.2 * (2.0 / dim as f64).sqrt(), "sd {sd}");
        assert!(
            sd > 0.2 * (2.0 / dim as f64).sqrt(),
            "a sketch, not exact: sd {sd}"
        );
    }

    /// The sketch of a gradient depends on the draw and the gradient alone, whatever the
    /// thread count.
    #[test]
    fn the_thread_count_does_not_change_a_bit() {
        let mut rng = stream(3, Purpose::Strategy, 0, 0);
        let g: Vec<Vec<f32>> = (0..33)
            .map(|_| (0..500).map(|_| rng.random_range(-1.0f32..1.0)).collect())
            .collect();
        let sketch = CountSketch::draw(500, 64, &mut rng);
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap()
            .install(|| sketch.apply(&g));
        let many = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap()
            .install(|| sketch.apply(&g));
        let bits =
            |v: &[Vec<f32>]| -> Vec<u32> { v.iter().flatten().map(|x| x.to_bits()).collect() };
        assert_eq!(bits(&one), bits(&many));
    }
}

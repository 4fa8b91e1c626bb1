//! numpy's legacy `RandomState`, the part a seeded data program of the FedGS authors uses:
//! where a paper's data came from `np.random.seed(s)` and a fixed sequence of draws, the same
//! stream reproduces the same data.
//!
//! The generator is MT19937 (the `rand_mt` crate) seeded as `RandomState.seed(int)` seeds
//! it (`init_genrand`). On top of it, as numpy's `legacy-distributions.c` and
//! `randomkit` define them: `random_sample` takes two 32-bit words a, b and returns
//! ((a >> 5)·2²⁶ + (b >> 6)) / 2⁵³; `gauss` is the Marsaglia polar method, which makes two
//! normals per accepted pair, returns the second and keeps the first for the next call;
//! `normal(μ, σ)` = μ + σ·gauss; `lognormal(μ, σ)` = exp(normal(μ, σ)). Every array draw
//! fills its elements in row-major order. `tests::streams_match_numpy` holds values that
//! numpy printed.

use rand_mt::Mt;

/// The state of `numpy.random.RandomState`, for the draws fedsel needs.
pub struct RandomState {
    mt: Mt,
    /// The second normal of the last polar-method pair, not yet returned.
    cached_gauss: Option<f64>,
}

impl RandomState {
    /// `numpy.random.RandomState(seed)` (and `np.random.seed(seed)`) for a seed below 2³².
    pub fn new(seed: u32) -> Self {
        Self {
            mt: Mt::new(seed),
            cached_gauss: None,
        }
    }

    /// `random_sample()`: uniform on [0, 1) with 53 random bits.
    pub fn random_sample(&mut self) -> f64 {
        let a = self.mt.next_u32() >> 5;
        let b = self.mt.next_u32() >> 6;
        (f64::from(a) * 67_108_864.0 + f64::from(b)) / 9_007_199_254_740_992.0
    }

    /// `standard_normal()` of the legacy generator (`legacy_gauss`).
    pub fn gauss(&mut self) -> f64 {
        if let Some(g) = self.cached_gauss.take() {
            return g;
        }
        loop {
            let x1 = 2.0 * self.random_sample() - 1.0;
            let x2 = 2.0 * self.random_sample() - 1.0;
            let r2 = x1 * x1 + x2 * x2;
            if r2 < 1.0 && r2 != 0.0 {
                let f = (-2.0 * r2.ln() / r2).sqrt();
                self.cached_gauss = Some(f * x1);
                return f * x2;
            }
        }
    }

    /// `normal(loc, scale)`.
    pub fn normal(&mut self, loc: f64, scale: f64) -> f64 {
        loc + scale * self.gauss()
    }

    /// `normal(loc, scale, n)`.
    pub fn normals(&mut self, loc: f64, scale: f64, n: usize) -> Vec<f64> {
        (0..n).map(|_| self.normal(loc, scale)).collect()
    }

    /// `lognormal(mean, sigma)`.
    pub fn lognormal(&mut self, mean: f64, sigma: f64) -> f64 {
        self.normal(mean, sigma).exp()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values numpy 2.4.6 printed (its legacy stream is frozen across versions):
    /// `r = np.random.RandomState(97); r.random_sample(3); r.standard_normal(3);
    /// r.lognormal(4, 2, 2)`, in that order on one state.
    #[test]
    fn streams_match_numpy() {
        let mut r = RandomState::new(97);
        let uniform = [0.8369441242645237, 0.9702358519403298, 0.4471537852615114];
        for u in uniform {
            assert_eq!(r.random_sample(), u);
        }
        for g in [0.9489304485405241, -0.7537062582590117, -1.1490103810283563] {
            assert_eq!(r.gauss(), g);
        }
        for l in [15.841679140122855, 7.273180378597075] {
            assert!((r.lognormal(4.0, 2.0) - l).abs() <= 1e-15 * l, "{l}");
        }
    }
}

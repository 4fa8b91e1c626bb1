//! `exp`, `sigmoid` and `tanh` on `f32` without calls into libm, so that a loop over
//! a slice of them vectorises.
//!
//! libm's `expf` and `tanhf` are scalar calls; in the char-LSTM's elementwise pass
//! (five of them per unit, row and step) they cost about as much as the recurrent
//! products. These are branch-free (selects only) and use plain IEEE `+ − × ÷` and
//! integer bit operations, so the compiler turns a loop of them into SSE2 or AVX2
//! code and the bits are the same on either. Accuracy, tested against f64 over the
//! whole range: a few ulp (see the tests' bounds). NaN propagates.

/// 1.5 · 2^23: adding it to a float of magnitude below 2^22 rounds it to an integer
/// held in the low mantissa bits.
const ROUND: f32 = 12_582_912.0;
/// ln 2 split so that `n · LN2_HI` is exact for |n| < 2^15 (Cephes' `expf`).
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;

/// e^x for x in [−87, 88] (clamped outside: e^−87 ≈ 1.6·10⁻³⁸ is the smallest value
/// returned, e^88 ≈ 1.7·10³⁸ the largest).
///
/// x = n ln 2 + r with n an integer and |r| ≤ ln 2 / 2, e^x = 2^n e^r, e^r from
/// Cephes' degree-7 minimax polynomial, 2^n built in the exponent bits.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    // `clamp` passes NaN through (`max`/`min` would not).
    let x = x.clamp(-87.0, 88.0);
    let t = x * std::f32::consts::LOG2_E + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let e = p * (r * r) + r + 1.0;
    // n is t's low mantissa bits, offset by ROUND's; adding the exponent bias and
    // shifting gives 2^n (n ∈ [−126, 127] after the clamp).
    let n_bits = t.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127) << 23;
    e * f32::from_bits(n_bits)
}

/// The logistic function 1 / (1 + e^−x).
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// tanh x: for |x| < 0.625 Cephes' odd polynomial `x + x³ P(x²)` (where
/// `1 − 2/(e^{2|x|} + 1)` would cancel), above it that expression, with the sign of x.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let a = x.abs();
    let z = a * a;
    let p = -5.704_988_7e-3;
    let p = p * z + 2.063_909e-2;
    let p = p * z - 5.373_971_6e-2;
    let p = p * z + 1.333_144_2e-1;
    let p = p * z - 3.333_328e-1;
    let small = p * z * a + a;
    let large = 1.0 - 2.0 / (exp(2.0 * a) + 1.0);
    let y = if a < 0.625 { small } else { large };
    // Copy x's sign bit; NaN stays NaN.
    f32::from_bits(y.to_bits() | (x.to_bits() & 0x8000_0000))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every float from −90 to 90 in steps of 2⁻¹² plus a sweep of tiny values.
    fn grid() -> impl Iterator<Item = f32> {
        (-90 * 4096..=90 * 4096)
            .map(|i| i as f32 / 4096.0)
            .chain((-40..=40).map(|e| 2f32.powi(e) * 1.2345))
            .chain((-40..=40).map(|e| -(2f32.powi(e) * 0.987)))
    }

    /// The largest error of `f` against `want` over the grid, in units of the
    /// result's last place (ulp of the f32 nearest the exact value).
    fn max_ulps(
        f: impl Fn(f32) -> f32,
        want: impl Fn(f64) -> f64,
        domain: impl Fn(f32) -> bool,
    ) -> f64 {
        grid()
            .filter(|&x| domain(x))
            .map(|x| {
                let w = want(f64::from(x));
                let ulp = f64::from(f32::EPSILON) * (w as f32).abs().max(f32::MIN_POSITIVE) as f64;
                (f64::from(f(x)) - w).abs() / ulp
            })
            .fold(0.0, f64::max)
    }

    #[test]
    fn exp_is_within_two_ulp_of_libm() {
        let e = max_ulps(exp, f64::exp, |x| (-87.0..=88.0).contains(&x));
        assert!(e <= 2.0, "{e} ulp");
        assert_eq!(exp(-100.0), exp(-87.0));
        assert_eq!(exp(100.0), exp(88.0));
        assert_eq!(exp(0.0), 1.0);
    }

    #[test]
    fn sigmoid_and_tanh_are_within_a_few_ulp_of_libm() {
        let s = max_ulps(sigmoid, |x| 1.0 / (1.0 + (-x).exp()), |x| x > -80.0);
        assert!(s <= 3.0, "sigmoid: {s} ulp");
        let t = max_ulps(tanh, f64::tanh, |_| true);
        assert!(t <= 3.0, "tanh: {t} ulp");
        assert_eq!(tanh(0.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(tanh(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(tanh(100.0), 1.0);
        assert_eq!(tanh(-100.0), -1.0);
        assert_eq!(sigmoid(100.0), 1.0);
    }

    #[test]
    fn nan_propagates() {
        assert!(exp(f32::NAN).is_nan());
        assert!(sigmoid(f32::NAN).is_nan());
        assert!(tanh(f32::NAN).is_nan());
    }
}

//! PReLU with one slope and BatchNorm over the channels, the stages of the HiCS-FL
//! code's CNN ([`crate::model::cnn_hics_code`]).
//!
//! BatchNorm in training mode normalises by the batch's statistics, so it couples the
//! images that every other stage treats one at a time: the network runs its per-image
//! stages up to a BatchNorm for the whole batch, computes the statistics here, and goes
//! on ([`super::Net`]'s segments). With `x̂ = (x − μ)·σ⁻¹`, σ = √(var + ε), per channel
//! over the batch's `n = B·h·w` values:
//!
//! ```text
//! forward   y = γ·x̂ + β = x·scale + shift,  scale = γ·σ⁻¹,  shift = β − μ·scale
//! backward  ∂γ = Σ δy·x̂   ∂β = Σ δy
//!           δx = scale·(δy − Σδy/n − x̂·Σ(δy·x̂)/n)    (training mode: μ, σ depend on x)
//!           δx = scale·δy                             (eval mode: running μ, σ)
//! ```
//!
//! Every sum over the batch is each image's sum in `f64` (in [`LANES`] lanes, the lanes
//! then added in order), added in image order, so it does not depend on the thread
//! count or the instruction set. burn computes the same quantities in `f32` with its own
//! reduction order: the two agree within float tolerance, not bit for bit (the model
//! tests compare them).

use super::{fit, glue_isa};
use crate::cpu::Isa;
use crate::model::cnn_hics_code::{BN_EPS, BN_MOMENTUM};

/// Lanes of the `f64` sums: entry `i` of a row goes to lane `i % LANES`, whichever
/// instruction set runs, so that the sums vectorise and keep one order.
const LANES: usize = 8;

/// The lanes of a sum added first to last, then the entries past the last whole lane
/// group.
#[inline(always)]
fn total(lanes: [f64; LANES], tail: impl Iterator<Item = f64>) -> f64 {
    lanes.into_iter().chain(tail).fold(0.0, |s, v| s + v)
}

/// A channel's (Σx, Σx²) from its lanes' sums over the whole lane groups, then the
/// entries `tail` past them: the same for every copy of [`channel_moments`].
#[inline(always)]
fn moment_pair(s: [f64; LANES], q: [f64; LANES], tail: &[f32]) -> [f64; 2] {
    let sum = total(s, tail.iter().map(|&v| f64::from(v)));
    let squares = total(q, tail.iter().map(|&v| f64::from(v) * f64::from(v)));
    [sum, squares]
}

/// A channel's (Σδy, Σδy·x̂) likewise, from the entries `dy` and `x` past the lane
/// groups, for every copy of [`gradient_moments`].
#[inline(always)]
fn gradient_pair(
    a: [f64; LANES],
    b: [f64; LANES],
    dy: &[f32],
    x: &[f32],
    m: f32,
    s: f32,
) -> [f64; 2] {
    let tail = || dy.iter().zip(x);
    let sum = total(a, tail().map(|(&g, _)| f64::from(g)));
    let dot = total(
        b,
        tail().map(|(&g, &v)| f64::from(g) * f64::from((v - m) * s)),
    );
    [sum, dot]
}

/// Each channel of one image's δy and x (`[c, hw]` each), with its mean, inverse
/// deviation and pair of `out`.
#[inline(always)]
fn gradient_channels<'a>(
    dy: &'a [f32],
    x: &'a [f32],
    mean: &'a [f32],
    inv_std: &'a [f32],
    out: &'a mut [[f64; 2]],
) -> impl Iterator<Item = (&'a [f32], &'a [f32], f32, f32, &'a mut [f64; 2])> {
    let hw = x.len() / mean.len();
    dy.chunks_exact(hw)
        .zip(x.chunks_exact(hw))
        .zip(mean.iter().zip(inv_std))
        .zip(out.iter_mut())
        .map(|(((dy, x), (&m, &s)), o)| (dy, x, m, s, o))
}

dispatch! {
    /// Per channel of one image `x` (`[c, hw]`), Σx and Σx² into `out`.
    fn channel_moments(x: &[f32], hw: usize, out: &mut [[f64; 2]]) {
        for (ch, o) in x.chunks_exact(hw).zip(out.iter_mut()) {
            let (mut s, mut q) = ([0.0f64; LANES], [0.0f64; LANES]);
            let mut groups = ch.chunks_exact(LANES);
            for g in &mut groups {
                let g: &[f32; LANES] = g.try_into().expect("a lane group");
                for l in 0..LANES {
                    let v = f64::from(g[l]);
                    s[l] += v;
                    q[l] += v * v;
                }
            }
            *o = moment_pair(s, q, groups.remainder());
        }
    }
}

dispatch! {
    /// Per channel of one image, Σδy and Σδy·x̂ (x̂ = (x − mean)·inv_std) into `out`.
    fn gradient_moments(
        dy: &[f32],
        x: &[f32],
        mean: &[f32],
        inv_std: &[f32],
        out: &mut [[f64; 2]],
    ) {
        for (dy, x, m, s, o) in gradient_channels(dy, x, mean, inv_std, out) {
            let (mut a, mut b) = ([0.0f64; LANES], [0.0f64; LANES]);
            let (mut gs, mut xs) = (dy.chunks_exact(LANES), x.chunks_exact(LANES));
            for (g, v) in (&mut gs).zip(&mut xs) {
                let g: &[f32; LANES] = g.try_into().expect("a lane group");
                let v: &[f32; LANES] = v.try_into().expect("a lane group");
                for l in 0..LANES {
                    a[l] += f64::from(g[l]);
                    b[l] += f64::from(g[l]) * f64::from((v[l] - m) * s);
                }
            }
            *o = gradient_pair(a, b, gs.remainder(), xs.remainder(), m, s);
        }
    }
}

/// A vector of `f64` lanes as the portable loops' lane array.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn lanes_of(v: std::arch::x86_64::__m512d) -> [f64; LANES] {
    let mut out = [0.0; LANES];
    // SAFETY: `out` holds the vector's LANES = 8 entries.
    unsafe { std::arch::x86_64::_mm512_storeu_pd(out.as_mut_ptr(), v) };
    out
}

/// [`channel_moments`] with AVX-512: each lane group's 8 entries widened into one vector
/// of `f64`, so each lane takes the same adds in the same order. The compiler's loop
/// ran one entry at a time (5 % of the HiCS code CNN's step with [`gradient_moments`]).
///
/// # Safety
/// The CPU has AVX-512F; `out` holds a pair for each channel of `x`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn channel_moments_avx512(x: &[f32], hw: usize, out: &mut [[f64; 2]]) {
    use std::arch::x86_64::{
        _mm256_loadu_ps, _mm512_add_pd, _mm512_cvtps_pd, _mm512_mul_pd, _mm512_setzero_pd,
    };
    for (ch, o) in x.chunks_exact(hw).zip(out.iter_mut()) {
        let (mut s, mut q) = (_mm512_setzero_pd(), _mm512_setzero_pd());
        let mut groups = ch.chunks_exact(LANES);
        for g in &mut groups {
            // SAFETY: a group holds LANES = 8 entries.
            let v = _mm512_cvtps_pd(unsafe { _mm256_loadu_ps(g.as_ptr()) });
            s = _mm512_add_pd(s, v);
            q = _mm512_add_pd(q, _mm512_mul_pd(v, v));
        }
        *o = moment_pair(lanes_of(s), lanes_of(q), groups.remainder());
    }
}

/// [`gradient_moments`] with AVX-512, as [`channel_moments_avx512`]: x̂ in `f32` as the
/// loop has it, then widened.
///
/// # Safety
/// The CPU has AVX-512F; `out` holds a pair for each channel.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn gradient_moments_avx512(
    dy: &[f32],
    x: &[f32],
    mean: &[f32],
    inv_std: &[f32],
    out: &mut [[f64; 2]],
) {
    use std::arch::x86_64::{
        _mm256_loadu_ps, _mm256_mul_ps, _mm256_set1_ps, _mm256_sub_ps, _mm512_add_pd,
        _mm512_cvtps_pd, _mm512_mul_pd, _mm512_setzero_pd,
    };
    for (dy, x, m, s, o) in gradient_channels(dy, x, mean, inv_std, out) {
        let (mv, sv) = (_mm256_set1_ps(m), _mm256_set1_ps(s));
        let (mut a, mut b) = (_mm512_setzero_pd(), _mm512_setzero_pd());
        let (mut gs, mut xs) = (dy.chunks_exact(LANES), x.chunks_exact(LANES));
        for (g, v) in (&mut gs).zip(&mut xs) {
            // SAFETY: each group holds LANES = 8 entries.
            let (g, v) = unsafe { (_mm256_loadu_ps(g.as_ptr()), _mm256_loadu_ps(v.as_ptr())) };
            let g = _mm512_cvtps_pd(g);
            let xh = _mm512_cvtps_pd(_mm256_mul_ps(_mm256_sub_ps(v, mv), sv));
            a = _mm512_add_pd(a, g);
            b = _mm512_add_pd(b, _mm512_mul_pd(g, xh));
        }
        *o = gradient_pair(
            lanes_of(a),
            lanes_of(b),
            gs.remainder(),
            xs.remainder(),
            m,
            s,
        );
    }
}

dispatch! {
    /// `out = x·scale + shift` per channel of one image (`[c, hw]`).
    fn affine(out: &mut [f32], x: &[f32], scale: &[f32], shift: &[f32]) {
        let hw = x.len() / scale.len();
        for (((o, x), &a), &b) in out
            .chunks_exact_mut(hw)
            .zip(x.chunks_exact(hw))
            .zip(scale)
            .zip(shift)
        {
            for (o, &v) in o.iter_mut().zip(x) {
                *o = v * a + b;
            }
        }
    }
}

dispatch! {
    /// Eval mode's δx = scale·δy in place of `dy`, per channel of one image.
    fn scale_channels(dy: &mut [f32], scale: &[f32]) {
        let hw = dy.len() / scale.len();
        for (dy, &a) in dy.chunks_exact_mut(hw).zip(scale) {
            dy.iter_mut().for_each(|g| *g *= a);
        }
    }
}

dispatch! {
    /// Training mode's δx = scale·(δy − mean(δy) − x̂·mean(δy·x̂)) in place of `dy`, per
    /// channel of one image, with `means` the batch's (mean(δy), mean(δy·x̂)).
    fn train_backward(
        dy: &mut [f32],
        x: &[f32],
        parts: [&[f32]; 3],
        means: &[[f32; 2]],
    ) {
        let [scale, mean, inv_std] = parts;
        let hw = x.len() / mean.len();
        for (c, (dy, x)) in dy.chunks_exact_mut(hw).zip(x.chunks_exact(hw)).enumerate() {
            let (a, m, s, [mdy, mdx]) = (scale[c], mean[c], inv_std[c], means[c]);
            for (g, &v) in dy.iter_mut().zip(x) {
                *g = a * (*g - mdy - (v - m) * s * mdx);
            }
        }
    }
}

/// One BatchNorm layer's normalisation in a pass, per channel.
pub(super) struct Norm {
    mean: Vec<f32>,
    inv_std: Vec<f32>,
    scale: Vec<f32>,
    shift: Vec<f32>,
    /// The batch's biased variance, in training mode; `None` in eval mode.
    batch_var: Option<Vec<f64>>,
}

/// A BatchNorm layer's parameters in the flat vector: scale γ, shift β, running mean
/// and running variance, `c` each, in that order.
fn parts(p: &[f32], c: usize) -> [&[f32]; 4] {
    assert_eq!(p.len(), 4 * c, "γ, β, running mean and variance");
    let (gamma, rest) = p.split_at(c);
    let (beta, rest) = rest.split_at(c);
    let (mean, var) = rest.split_at(c);
    [gamma, beta, mean, var]
}

/// One image's per-channel pairs of sums (Σx, Σx²) of `x` (`[c, hw]`) into `out`: taken
/// as each image leaves the stage before a BatchNorm, while its output is in cache.
pub(super) fn moments(x: &[f32], hw: usize, out: &mut Vec<[f64; 2]>) {
    fit(out, x.len() / hw);
    #[cfg(target_arch = "x86_64")]
    if glue_isa() == Isa::Avx512 {
        // SAFETY: glue_isa found AVX-512F; `out` holds a pair per channel of `x`.
        return unsafe { channel_moments_avx512(x, hw, out) };
    }
    channel_moments(x, hw, out);
}

/// The batch's per-channel pairs of sums: each image's pairs `per_image` added in image
/// order, so the totals do not depend on how the images were spread over threads.
pub(super) fn in_image_order<'a>(
    per_image: impl IntoIterator<Item = &'a [[f64; 2]]>,
    c: usize,
) -> Vec<[f64; 2]> {
    let mut sums = vec![[0.0f64; 2]; c];
    for image in per_image {
        for (s, v) in sums.iter_mut().zip(image) {
            s[0] += v[0];
            s[1] += v[1];
        }
    }
    sums
}

impl Norm {
    fn new(p: &[f32], c: usize, mean: Vec<f64>, var: &[f64], batch: bool) -> Self {
        let [gamma, beta, ..] = parts(p, c);
        let inv_std: Vec<f64> = var.iter().map(|v| 1.0 / (v + BN_EPS).sqrt()).collect();
        let scale: Vec<f64> = inv_std
            .iter()
            .zip(gamma)
            .map(|(s, &g)| f64::from(g) * s)
            .collect();
        let shift = beta
            .iter()
            .zip(&mean)
            .zip(&scale)
            .map(|((&b, m), s)| (f64::from(b) - m * s) as f32)
            .collect();
        let f32s = |v: &[f64]| v.iter().map(|&x| x as f32).collect();
        Self {
            mean: f32s(&mean),
            inv_std: f32s(&inv_std),
            scale: f32s(&scale),
            shift,
            batch_var: batch.then(|| var.to_vec()),
        }
    }

    /// Eval mode: the running statistics of the layer's parameters `p` (`4·c`).
    pub(super) fn running(p: &[f32], c: usize) -> Self {
        let [_, _, mean, var] = parts(p, c);
        let wide = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<f64>>();
        Self::new(p, c, wide(mean), &wide(var), false)
    }

    /// Training mode: the statistics of a batch whose images' pairs of [`moments`],
    /// added by [`in_image_order`], are `sums`, over `n` values per channel.
    pub(super) fn of_batch(p: &[f32], c: usize, n: usize, sums: &[[f64; 2]]) -> Self {
        let n = n as f64;
        let mean: Vec<f64> = sums.iter().map(|s| s[0] / n).collect();
        let var: Vec<f64> = sums
            .iter()
            .zip(&mean)
            .map(|(s, m)| (s[1] / n - m * m).max(0.0))
            .collect();
        Self::new(p, c, mean, &var, true)
    }

    /// The running mean and variance after a training pass over `n` values per channel
    /// (PyTorch's rule: running ← (1 − 0.1)·running + 0.1·batch, the batch variance
    /// unbiased), from the layer's parameters `p`; `None` in eval mode.
    pub(super) fn moved_running(&self, p: &[f32], n: usize) -> Option<(Vec<f32>, Vec<f32>)> {
        let var = self.batch_var.as_ref()?;
        let c = self.mean.len();
        let [_, _, mean, running_var] = parts(p, c);
        let n = n as f64;
        let unbiased = n / (n - 1.0).max(1.0);
        let keep = 1.0 - BN_MOMENTUM;
        let new_mean = mean
            .iter()
            .zip(&self.mean)
            .map(|(&r, &m)| (f64::from(r) * keep + f64::from(m) * BN_MOMENTUM) as f32)
            .collect();
        let new_var = running_var
            .iter()
            .zip(var)
            .map(|(&r, v)| (f64::from(r) * keep + v * unbiased * BN_MOMENTUM) as f32)
            .collect();
        Some((new_mean, new_var))
    }

    /// `out = x·scale + shift` per channel of one image (`[c, hw]`).
    pub(super) fn forward(&self, out: &mut [f32], x: &[f32]) {
        affine(out, x, &self.scale, &self.shift);
    }

    /// One image's (Σ δy, Σ δy·x̂) per channel into `out`, from the gradient `dy` at the
    /// layer's output and its input `x`.
    pub(super) fn sums(&self, dy: &[f32], x: &[f32], out: &mut Vec<[f64; 2]>) {
        fit(out, self.mean.len());
        #[cfg(target_arch = "x86_64")]
        if glue_isa() == Isa::Avx512 {
            // SAFETY: glue_isa found AVX-512F; `out` holds a pair per channel.
            return unsafe { gradient_moments_avx512(dy, x, &self.mean, &self.inv_std, out) };
        }
        gradient_moments(dy, x, &self.mean, &self.inv_std, out);
    }

    /// `dy` (one image's gradient at the layer's output) becomes the gradient at its
    /// input `x`, given the batch's sums of [`Norm::sums`] over `n` values per channel.
    pub(super) fn backward(&self, dy: &mut [f32], x: &[f32], sums: &[[f64; 2]], n: usize) {
        if self.batch_var.is_none() {
            return scale_channels(dy, &self.scale);
        }
        let means: Vec<[f32; 2]> = sums
            .iter()
            .map(|s| [(s[0] / n as f64) as f32, (s[1] / n as f64) as f32])
            .collect();
        let parts = [&self.scale[..], &self.mean, &self.inv_std];
        train_backward(dy, x, parts, &means);
    }
}

dispatch! {
    /// `out = x` where `x > 0`, else `a·x` (PyTorch's `nn.PReLU()` with one slope).
    pub(super) fn prelu_forward(out: &mut [f32], x: &[f32], a: f32) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = if v > 0.0 { v } else { v * a };
        }
    }
}

/// PReLU's gradient at input `v` from `g` at its output: `g` where `v > 0`, `a·g` where
/// `v < 0`, 0 at 0 and NaN (burn's `relu(x) − a·relu(−x)` passes neither ReLU's
/// gradient there).
#[inline(always)]
fn prelu_pass(g: f32, v: f32, a: f32) -> f32 {
    if v > 0.0 {
        g
    } else if v < 0.0 {
        g * a
    } else {
        0.0
    }
}

/// One entry's term of ∂a: `g·v` where `v < 0`, else 0.
#[inline(always)]
fn prelu_term(g: f32, v: f32) -> f64 {
    if v < 0.0 { f64::from(g * v) } else { 0.0 }
}

/// The entries past the last whole lane group of a PReLU backward: their gradients into
/// `d`, and ∂a's lanes with their terms added after them.
fn prelu_rest(d: &mut [f32], g: &[f32], x: &[f32], a: f32, lanes: [f64; LANES]) -> f64 {
    for (d, (&g, &v)) in d.iter_mut().zip(g.iter().zip(x)) {
        *d = prelu_pass(g, v, a);
    }
    total(lanes, g.iter().zip(x).map(|(&g, &v)| prelu_term(g, v)))
}

/// PReLU backward from its input `x`: `d` takes [`prelu_pass`] of `g`, and this image's
/// ∂a = Σ g·x over `x < 0` is added to `da`, summed in `f64` lanes (tens of thousands
/// of terms of both signs).
pub(super) fn prelu_backward(d: &mut [f32], g: &[f32], x: &[f32], a: f32, da: &mut f64) {
    assert!(
        d.len() == g.len() && g.len() == x.len(),
        "one gradient per input"
    );
    #[cfg(target_arch = "x86_64")]
    if glue_isa() == Isa::Avx512 {
        // SAFETY: glue_isa found AVX-512F; the lengths are asserted above.
        return unsafe { prelu_backward_avx512(d, g, x, a, da) };
    }
    prelu_backward_lanes(d, g, x, a, da);
}

dispatch! {
    /// [`prelu_backward`] a lane group at a time.
    fn prelu_backward_lanes(d: &mut [f32], g: &[f32], x: &[f32], a: f32, da: &mut f64) {
        let mut lanes = [0.0f64; LANES];
        let (mut ds, mut gs, mut xs) =
            (d.chunks_exact_mut(LANES), g.chunks_exact(LANES), x.chunks_exact(LANES));
        for ((d, g), v) in (&mut ds).zip(&mut gs).zip(&mut xs) {
            let d: &mut [f32; LANES] = d.try_into().expect("a lane group");
            let g: &[f32; LANES] = g.try_into().expect("a lane group");
            let v: &[f32; LANES] = v.try_into().expect("a lane group");
            for l in 0..LANES {
                lanes[l] += prelu_term(g[l], v[l]);
                d[l] = prelu_pass(g[l], v[l], a);
            }
        }
        *da += prelu_rest(ds.into_remainder(), gs.remainder(), xs.remainder(), a, lanes);
    }
}

/// [`prelu_backward_lanes`] with AVX-512, a lane group a vector: the same products,
/// tests and `f64` adds, masked where the loop picks. The compiler's loop ran one entry
/// at a time.
///
/// # Safety
/// The CPU has AVX-512F; `d`, `g` and `x` have one length.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl")]
unsafe fn prelu_backward_avx512(d: &mut [f32], g: &[f32], x: &[f32], a: f32, da: &mut f64) {
    use std::arch::x86_64::{
        _CMP_GT_OQ, _CMP_LT_OQ, _mm256_cmp_ps_mask, _mm256_loadu_ps, _mm256_mask_blend_ps,
        _mm256_maskz_mul_ps, _mm256_mul_ps, _mm256_set1_ps, _mm256_setzero_ps, _mm256_storeu_ps,
        _mm512_add_pd, _mm512_cvtps_pd, _mm512_maskz_mov_pd, _mm512_setzero_pd,
    };
    let (av, zero) = (_mm256_set1_ps(a), _mm256_setzero_ps());
    let mut lanes = _mm512_setzero_pd();
    let (mut ds, mut gs, mut xs) = (
        d.chunks_exact_mut(LANES),
        g.chunks_exact(LANES),
        x.chunks_exact(LANES),
    );
    for ((d, g), v) in (&mut ds).zip(&mut gs).zip(&mut xs) {
        // SAFETY: each group holds LANES = 8 entries.
        let (g, v) = unsafe { (_mm256_loadu_ps(g.as_ptr()), _mm256_loadu_ps(v.as_ptr())) };
        let below = _mm256_cmp_ps_mask::<_CMP_LT_OQ>(v, zero);
        let above = _mm256_cmp_ps_mask::<_CMP_GT_OQ>(v, zero);
        let term = _mm512_maskz_mov_pd(below, _mm512_cvtps_pd(_mm256_mul_ps(g, v)));
        lanes = _mm512_add_pd(lanes, term);
        let pass = _mm256_mask_blend_ps(above, _mm256_maskz_mul_ps(below, g, av), g);
        // SAFETY: as above.
        unsafe { _mm256_storeu_ps(d.as_mut_ptr(), pass) };
    }
    let lanes = lanes_of(lanes);
    *da += prelu_rest(
        ds.into_remainder(),
        gs.remainder(),
        xs.remainder(),
        a,
        lanes,
    );
}

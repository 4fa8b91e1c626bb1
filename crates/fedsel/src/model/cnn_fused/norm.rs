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

use rayon::prelude::*;

use super::glue_isa;
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
            let tail = groups.remainder();
            let sum = total(s, tail.iter().map(|&v| f64::from(v)));
            let squares = total(q, tail.iter().map(|&v| f64::from(v) * f64::from(v)));
            *o = [sum, squares];
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
        let hw = x.len() / mean.len();
        for (((dy, x), (&m, &s)), o) in dy
            .chunks_exact(hw)
            .zip(x.chunks_exact(hw))
            .zip(mean.iter().zip(inv_std))
            .zip(out.iter_mut())
        {
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
            let tail = || gs.remainder().iter().zip(xs.remainder());
            let sum = total(a, tail().map(|(&g, _)| f64::from(g)));
            let dot = total(b, tail().map(|(&g, &v)| f64::from(g) * f64::from((v - m) * s)));
            *o = [sum, dot];
        }
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

/// The batch's per-channel pairs of sums: each image's pairs `per_image` added in image
/// order, so the totals do not depend on how the images were spread over threads.
pub(super) fn in_image_order(per_image: &[Vec<[f64; 2]>], c: usize) -> Vec<[f64; 2]> {
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

    /// Training mode: the statistics of the batch whose images' inputs to the layer
    /// (`[c, hw]` each) `inputs` gives, in image order.
    pub(super) fn of_batch<'a>(
        p: &[f32],
        c: usize,
        hw: usize,
        inputs: impl IndexedParallelIterator<Item = &'a [f32]>,
    ) -> Self {
        let per_image: Vec<Vec<[f64; 2]>> = inputs
            .map(|x| {
                let mut m = vec![[0.0; 2]; c];
                channel_moments(x, hw, &mut m);
                m
            })
            .collect();
        let n = (per_image.len() * hw) as f64;
        let sums = in_image_order(&per_image, c);
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

    /// One image's (Σ δy, Σ δy·x̂) per channel, from the gradient `dy` at the layer's
    /// output and its input `x`.
    pub(super) fn sums(&self, dy: &[f32], x: &[f32]) -> Vec<[f64; 2]> {
        let mut out = vec![[0.0; 2]; self.mean.len()];
        gradient_moments(dy, x, &self.mean, &self.inv_std, &mut out);
        out
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

dispatch! {
    /// PReLU backward from its input `x`: `d = g` where `x > 0`, `a·g` where `x < 0` and
    /// 0 at 0 (burn's `relu(x) − a·relu(−x)` passes neither ReLU's gradient there); adds
    /// this image's ∂a = Σ g·x over `x < 0` to `da`, summed in `f64` lanes (tens of
    /// thousands of terms of both signs).
    pub(super) fn prelu_backward(d: &mut [f32], g: &[f32], x: &[f32], a: f32, da: &mut f64) {
        let term = |g: f32, v: f32| if v < 0.0 { f64::from(g * v) } else { 0.0 };
        let pass = |g: f32, v: f32| {
            if v > 0.0 {
                g
            } else if v < 0.0 {
                g * a
            } else {
                0.0
            }
        };
        let mut lanes = [0.0f64; LANES];
        let (mut ds, mut gs, mut xs) =
            (d.chunks_exact_mut(LANES), g.chunks_exact(LANES), x.chunks_exact(LANES));
        for ((d, g), v) in (&mut ds).zip(&mut gs).zip(&mut xs) {
            let d: &mut [f32; LANES] = d.try_into().expect("a lane group");
            let g: &[f32; LANES] = g.try_into().expect("a lane group");
            let v: &[f32; LANES] = v.try_into().expect("a lane group");
            for l in 0..LANES {
                lanes[l] += term(g[l], v[l]);
                d[l] = pass(g[l], v[l]);
            }
        }
        let tail = gs.remainder().iter().zip(xs.remainder());
        for (d, (&g, &v)) in ds.into_remainder().iter_mut().zip(tail.clone()) {
            *d = pass(g, v);
        }
        *da += total(lanes, tail.map(|(&g, &v)| term(g, v)));
    }
}

//! The seeds' small CNNs (`cnn_fmnist`, `cnn_hics`, `cnn_cifar`) on plain `f32`
//! slices: forward, mean softmax cross-entropy and a hand-derived backward pass,
//! instead of burn's autodiff (DESIGN.md "Speed: the CNNs").
//!
//! A network is a stack of per-image stages (stride-1 convolution, ReLU, 2×2 max-pool)
//! followed by dense layers with ReLU between them. Each image is laid out
//! channel-major (`[c, h, w]`), so flattening the last stage gives burn's
//! `reshape([b, c·h·w])` order.
//!
//! A convolution is im2col plus one GEMM per image: with `col` the `[cin·k·k, ho·wo]`
//! patch matrix of the image and `W` the weight as `[cout, cin·k·k]`,
//!
//! ```text
//! forward   y = W·col + b
//! backward  ∂W += δy·colᵀ    ∂b += Σ_pixels δy    δcol = Wᵀ·δy   δx = col2im(δcol)
//! ```
//!
//! ReLU passes the gradient where its output is positive or NaN, and max-pool sends it
//! to the first maximum of each window in row-major order (NaN winning), the rules of
//! burn-flex's `relu_backward` and `max_pool2d_with_indices`, so that the gradients match
//! the autodiff path even on ties (common after a ReLU: a window of zeros).
//! Dense layers are `a·W + b` with `W` as `[fan_in, fan_out]`; their backward is
//! `∂W = aᵀ·δz`, `∂b = Σ_rows δz`, `δa = δz·Wᵀ`.
//!
//! Determinism: the per-image stages run one image per rayon task, each GEMM a
//! single-threaded `gemm` call. Convolution weight gradients are summed over fixed
//! chunks of [`CHUNK`] images (one task each, images in order) and the chunks' partial
//! sums are added in chunk order. Dense products are split into blocks fixed by their
//! shape. So no sum depends on the number of threads.

use crate::model::matmul::{View, gemm_into, matmul};
use rayon::prelude::*;

/// One per-image stage.
#[derive(Debug, Clone, Copy)]
pub(super) enum Stage {
    /// Stride-1 convolution to `cout` channels with a `k × k` kernel and zero padding `pad`.
    Conv { cout: usize, k: usize, pad: usize },
    /// ReLU.
    Relu,
    /// 2×2 max-pool with stride 2; an odd last row or column is dropped.
    Pool,
}

/// A CNN: the image shape `[c, h, w]`, the per-image stages, and the widths of the
/// dense layers after them (hidden widths, then the classes). Parameters are laid
/// out as each convolution's weight `[cout, cin, k, k]` and bias, then each dense
/// layer's weight `[fan_in, fan_out]` and bias, as the models' `params()`.
pub(super) struct Net {
    pub input: [usize; 3],
    pub stages: &'static [Stage],
    pub dense: Vec<usize>,
}

/// Images per task in the backward pass; weight gradients are summed per chunk and the
/// chunks' sums added in order, so this fixes the summation order.
const CHUNK: usize = 4;

/// Shapes and parameter offsets of a [`Net`].
struct Plan {
    /// Shape of the input of stage i, and last the output of the stages.
    shapes: Vec<[usize; 3]>,
    /// Offset of each stage's weight (convolutions only; bias follows it).
    conv_at: Vec<usize>,
    /// Scalars of all convolution parameters (they come first in the flat vector).
    conv_total: usize,
    /// Offsets of each dense layer's weight and bias.
    dense_at: Vec<(usize, usize)>,
    /// All parameters.
    total: usize,
}

impl Net {
    fn plan(&self) -> Plan {
        let mut shapes = vec![self.input];
        let mut conv_at = Vec::with_capacity(self.stages.len());
        let mut at = 0;
        for s in self.stages {
            let [c, h, w] = *shapes.last().expect("starts with the input");
            conv_at.push(at);
            shapes.push(match *s {
                Stage::Conv { cout, k, pad } => {
                    at += cout * c * k * k + cout;
                    [cout, h + 2 * pad + 1 - k, w + 2 * pad + 1 - k]
                }
                Stage::Relu => [c, h, w],
                Stage::Pool => [c, h / 2, w / 2],
            });
        }
        let conv_total = at;
        let [c, h, w] = *shapes.last().expect("starts with the input");
        let mut fan_in = c * h * w;
        let mut dense_at = Vec::with_capacity(self.dense.len());
        for &width in &self.dense {
            dense_at.push((at, at + fan_in * width));
            at += fan_in * width + width;
            fan_in = width;
        }
        Plan {
            shapes,
            conv_at,
            conv_total,
            dense_at,
            total: at,
        }
    }

    fn features(&self) -> usize {
        let [c, h, w] = *self.plan().shapes.last().expect("starts with the input");
        c * h * w
    }
}

/// The patch matrix of image `x` (`[c, h, w]`) for a `k × k` kernel with padding `pad`:
/// row `(ci·k + ky)·k + kx`, column `oy·wo + ox` holds `x[ci, oy + ky − pad, ox + kx − pad]`
/// (zero outside the image).
fn im2col(x: &[f32], [c, h, w]: [usize; 3], k: usize, pad: usize, col: &mut [f32]) {
    let (ho, wo) = (h + 2 * pad + 1 - k, w + 2 * pad + 1 - k);
    assert_eq!(col.len(), c * k * k * ho * wo, "patch matrix size");
    for (r, row) in col.chunks_exact_mut(ho * wo).enumerate() {
        let (ci, ky, kx) = (r / (k * k), r / k % k, r % k);
        // Output columns whose input column ox + kx − pad lies inside the image.
        let lo = pad.saturating_sub(kx);
        let hi = (w + pad).saturating_sub(kx).min(wo);
        for (oy, dst) in row.chunks_exact_mut(wo).enumerate() {
            let iy = oy + ky;
            if iy < pad || iy - pad >= h || lo >= hi {
                dst.fill(0.0);
                continue;
            }
            let src = &x[(ci * h + iy - pad) * w..][..w];
            dst[..lo].fill(0.0);
            dst[lo..hi].copy_from_slice(&src[lo + kx - pad..hi + kx - pad]);
            dst[hi..].fill(0.0);
        }
    }
}

/// The adjoint of [`im2col`]: adds each patch-matrix entry of `col` to the input pixel
/// it was read from.
fn col2im(col: &[f32], [c, h, w]: [usize; 3], k: usize, pad: usize, x: &mut [f32]) {
    let (ho, wo) = (h + 2 * pad + 1 - k, w + 2 * pad + 1 - k);
    assert_eq!(x.len(), c * h * w, "image size");
    for (r, row) in col.chunks_exact(ho * wo).enumerate() {
        let (ci, ky, kx) = (r / (k * k), r / k % k, r % k);
        let lo = pad.saturating_sub(kx);
        let hi = (w + pad).saturating_sub(kx).min(wo);
        for (oy, src) in row.chunks_exact(wo).enumerate() {
            let iy = oy + ky;
            if iy < pad || iy - pad >= h || lo >= hi {
                continue;
            }
            let dst = &mut x[(ci * h + iy - pad) * w..][..w];
            for (d, s) in dst[lo + kx - pad..hi + kx - pad]
                .iter_mut()
                .zip(&src[lo..hi])
            {
                *d += s;
            }
        }
    }
}

/// burn-flex's ReLU: NaN passes through.
fn relu(x: f32) -> f32 {
    if x.is_nan() || x > 0.0 { x } else { 0.0 }
}

/// burn-flex's ReLU backward: the gradient passes where the output is positive or NaN.
fn relu_passes(out: f32) -> bool {
    out.is_nan() || out > 0.0
}

/// What one image's forward pass keeps: each stage's output, and for each pool the
/// index (into its input) of each window's maximum. Buffers are reused across images.
#[derive(Default)]
struct Trace {
    outs: Vec<Vec<f32>>,
    argmax: Vec<Vec<u32>>,
}

/// Scratch buffers of one task, reused across its images.
#[derive(Default)]
struct Scratch {
    col: Vec<f32>,
    grad: Vec<f32>,
    grad_in: Vec<f32>,
}

fn resize(v: &mut Vec<f32>, n: usize) {
    v.clear();
    v.resize(n, 0.0);
}

impl Net {
    /// Runs the stages on image `x`, filling `tr`.
    fn forward_image(
        &self,
        plan: &Plan,
        params: &[f32],
        x: &[f32],
        tr: &mut Trace,
        col: &mut Vec<f32>,
    ) {
        let n = self.stages.len();
        tr.outs.resize_with(n, Vec::new);
        tr.argmax.resize_with(n, Vec::new);
        for (i, stage) in self.stages.iter().enumerate() {
            let shape = plan.shapes[i];
            let [co, ho, wo] = plan.shapes[i + 1];
            let (done, rest) = tr.outs.split_at_mut(i);
            let input: &[f32] = if i == 0 { x } else { &done[i - 1] };
            let out = &mut rest[0];
            resize(out, co * ho * wo);
            match *stage {
                Stage::Conv { cout, k, pad } => {
                    let ckk = shape[0] * k * k;
                    let w = &params[plan.conv_at[i]..][..cout * ckk];
                    let b = &params[plan.conv_at[i] + cout * ckk..][..cout];
                    resize(col, ckk * ho * wo);
                    im2col(input, shape, k, pad, col);
                    for (row, &bias) in out.chunks_exact_mut(ho * wo).zip(b) {
                        row.fill(bias);
                    }
                    gemm_into(
                        out,
                        ho * wo,
                        View::new(w, cout, ckk),
                        View::new(col, ckk, ho * wo),
                        true,
                    );
                }
                Stage::Relu => {
                    for (o, &v) in out.iter_mut().zip(input) {
                        *o = relu(v);
                    }
                }
                Stage::Pool => {
                    let [_, h, w] = shape;
                    let idx = &mut tr.argmax[i];
                    idx.clear();
                    idx.resize(co * ho * wo, 0);
                    for c in 0..co {
                        for oy in 0..ho {
                            for ox in 0..wo {
                                let mut best = f32::NEG_INFINITY;
                                let mut at = usize::MAX;
                                for (dy, dx) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                                    let j = (c * h + 2 * oy + dy) * w + 2 * ox + dx;
                                    let v = input[j];
                                    if at == usize::MAX || v > best || v.is_nan() {
                                        best = v;
                                        at = j;
                                    }
                                }
                                let o = (c * ho + oy) * wo + ox;
                                out[o] = best;
                                idx[o] = u32::try_from(at).expect("images have < 2³² pixels");
                            }
                        }
                    }
                }
            }
        }
    }

    /// Backward through the stages of one image: `g` holds the loss gradient of the
    /// stages' output; convolution gradients are added to `grad` (the convolution
    /// part of the flat gradient).
    fn backward_image(
        &self,
        plan: &Plan,
        params: &[f32],
        x: &[f32],
        tr: &Trace,
        grad: &mut [f32],
        s: &mut Scratch,
    ) {
        for (i, stage) in self.stages.iter().enumerate().rev() {
            let shape = plan.shapes[i];
            let [ci, h, w] = shape;
            let [_, ho, wo] = plan.shapes[i + 1];
            let input: &[f32] = if i == 0 { x } else { &tr.outs[i - 1] };
            match *stage {
                Stage::Conv { cout, k, pad } => {
                    let ckk = ci * k * k;
                    let at = plan.conv_at[i];
                    let (gw, gb) = grad[at..at + cout * ckk + cout].split_at_mut(cout * ckk);
                    let w_par = &params[at..][..cout * ckk];
                    resize(&mut s.col, ckk * ho * wo);
                    im2col(input, shape, k, pad, &mut s.col);
                    gemm_into(
                        gw,
                        ckk,
                        View::new(&s.grad, cout, ho * wo),
                        View::new(&s.col, ckk, ho * wo).t(),
                        true,
                    );
                    for (acc, row) in gb.iter_mut().zip(s.grad.chunks_exact(ho * wo)) {
                        *acc += row.iter().sum::<f32>();
                    }
                    if i == 0 {
                        return;
                    }
                    // δcol reuses the patch buffer: δcol = Wᵀ·δy overwrites it.
                    gemm_into(
                        &mut s.col,
                        ho * wo,
                        View::new(w_par, cout, ckk).t(),
                        View::new(&s.grad, cout, ho * wo),
                        false,
                    );
                    resize(&mut s.grad_in, ci * h * w);
                    col2im(&s.col, shape, k, pad, &mut s.grad_in);
                }
                Stage::Relu => {
                    resize(&mut s.grad_in, ci * h * w);
                    for ((d, &g), &o) in s.grad_in.iter_mut().zip(&s.grad).zip(&tr.outs[i]) {
                        if relu_passes(o) {
                            *d = g;
                        }
                    }
                }
                Stage::Pool => {
                    resize(&mut s.grad_in, ci * h * w);
                    for (&j, &g) in tr.argmax[i].iter().zip(&s.grad) {
                        s.grad_in[j as usize] += g;
                    }
                }
            }
            std::mem::swap(&mut s.grad, &mut s.grad_in);
        }
    }

    /// The stages' output of each image of `x` (`batch` images), one row each.
    fn features_of(
        &self,
        plan: &Plan,
        params: &[f32],
        x: &[f32],
        batch: usize,
        keep: Option<&mut Vec<Trace>>,
    ) -> Vec<f32> {
        let pixels: usize = self.input.iter().product();
        assert_eq!(x.len(), batch * pixels, "input size");
        let d = self.features();
        let mut feats = vec![0.0; batch * d];
        let last = self.stages.len() - 1;
        match keep {
            Some(traces) => {
                traces.resize_with(batch, Trace::default);
                traces
                    .par_iter_mut()
                    .zip(feats.par_chunks_mut(d))
                    .zip(x.par_chunks(pixels))
                    .for_each_init(Vec::new, |col, ((tr, f), x)| {
                        self.forward_image(plan, params, x, tr, col);
                        f.copy_from_slice(&tr.outs[last]);
                    });
            }
            None => feats
                .par_chunks_mut(d)
                .zip(x.par_chunks(pixels))
                .for_each_init(
                    || (Trace::default(), Vec::new()),
                    |(tr, col), (f, x)| {
                        self.forward_image(plan, params, x, tr, col);
                        f.copy_from_slice(&tr.outs[last]);
                    },
                ),
        }
        feats
    }

    /// Dense layers on `feats`: each layer's input (the features, then the hidden
    /// activations after ReLU), and last the logits.
    fn dense_forward(
        &self,
        plan: &Plan,
        params: &[f32],
        feats: Vec<f32>,
        batch: usize,
    ) -> Vec<Vec<f32>> {
        let mut acts = vec![feats];
        let mut fan_in = self.features();
        for (l, (&width, &(wa, ba))) in self.dense.iter().zip(&plan.dense_at).enumerate() {
            let mut z = vec![0.0; batch * width];
            for row in z.chunks_exact_mut(width) {
                row.copy_from_slice(&params[ba..ba + width]);
            }
            let a = acts.last().expect("starts with the features");
            matmul(
                &mut z,
                View::new(a, batch, fan_in),
                View::new(&params[wa..ba], fan_in, width),
                true,
            );
            if l + 1 < self.dense.len() {
                for v in &mut z {
                    *v = relu(*v);
                }
            }
            acts.push(z);
            fan_in = width;
        }
        acts
    }

    /// Logits `[batch, classes]` of the images `x` (`batch` of them, one after another).
    pub(super) fn logits(&self, params: &[f32], x: &[f32], batch: usize) -> Vec<f32> {
        let plan = self.plan();
        assert_eq!(params.len(), plan.total, "parameter count");
        let feats = self.features_of(&plan, params, x, batch, None);
        self.dense_forward(&plan, params, feats, batch)
            .pop()
            .expect("at least the output layer")
    }

    /// Mean cross-entropy of the images `x` against `labels` and its flat gradient.
    pub(super) fn loss_and_gradient(
        &self,
        params: &[f32],
        x: &[f32],
        labels: &[u32],
    ) -> (f32, Vec<f32>) {
        let plan = self.plan();
        assert_eq!(params.len(), plan.total, "parameter count");
        let batch = labels.len();
        assert!(batch > 0, "an empty batch has no mean loss");
        let mut traces = Vec::new();
        let feats = self.features_of(&plan, params, x, batch, Some(&mut traces));
        let mut acts = self.dense_forward(&plan, params, feats, batch);
        let classes = *self.dense.last().expect("at least the output layer");

        // Softmax cross-entropy: loss = mean_b (logsumexp(z_b) − z_b[y_b]) and
        // ∂loss/∂z_b = (softmax(z_b) − onehot(y_b)) / B.
        let mut dz = acts.pop().expect("the logits");
        let mut loss = 0.0f64;
        for (row, &y) in dz.chunks_exact_mut(classes).zip(labels) {
            let y = y as usize;
            assert!(y < classes, "label {y} outside the {classes} classes");
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum: f32 = row.iter().map(|z| (z - max).exp()).sum();
            loss += f64::from(max + sum.ln() - row[y]);
            for z in row.iter_mut() {
                *z = (*z - max).exp() / sum / batch as f32;
            }
            row[y] -= 1.0 / batch as f32;
        }

        let mut grad = vec![0.0; plan.total];
        let mut width = classes;
        for l in (0..self.dense.len()).rev() {
            let a = acts.pop().expect("one input per layer");
            let fan_in = a.len() / batch;
            let (wa, ba) = plan.dense_at[l];
            let (gw, gb) = grad[wa..ba + width].split_at_mut(ba - wa);
            matmul(
                gw,
                View::new(&a, batch, fan_in).t(),
                View::new(&dz, batch, width),
                false,
            );
            for row in dz.chunks_exact(width) {
                for (acc, v) in gb.iter_mut().zip(row) {
                    *acc += v;
                }
            }
            let mut da = vec![0.0; batch * fan_in];
            matmul(
                &mut da,
                View::new(&dz, batch, width),
                View::new(&params[wa..ba], fan_in, width).t(),
                false,
            );
            if l > 0 {
                for (d, &o) in da.iter_mut().zip(&a) {
                    if !relu_passes(o) {
                        *d = 0.0;
                    }
                }
            }
            dz = da;
            width = fan_in;
        }

        let pixels: usize = self.input.iter().product();
        let conv_grads: Vec<Vec<f32>> = traces
            .par_chunks(CHUNK)
            .zip(dz.par_chunks(CHUNK * width))
            .zip(x.par_chunks(CHUNK * pixels))
            .map(|((trs, dfeat), xs)| {
                let mut g = vec![0.0; plan.conv_total];
                let mut s = Scratch::default();
                for ((tr, df), x) in trs
                    .iter()
                    .zip(dfeat.chunks_exact(width))
                    .zip(xs.chunks_exact(pixels))
                {
                    s.grad.clear();
                    s.grad.extend_from_slice(df);
                    self.backward_image(&plan, params, x, tr, &mut g, &mut s);
                }
                g
            })
            .collect();
        for part in &conv_grads {
            for (acc, v) in grad[..plan.conv_total].iter_mut().zip(part) {
                *acc += v;
            }
        }
        ((loss / batch as f64) as f32, grad)
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::activation::relu as burn_relu;
    use burn::tensor::module::{conv2d, max_pool2d};
    use burn::tensor::ops::{ConvOptions, MaxPoolOptions};
    use burn::tensor::{Device, Int, Tensor, TensorData};
    use rand::Rng as _;

    use super::*;
    use crate::bench::random_dataset;
    use crate::data::Dataset;
    use crate::model::cnn_cifar::CnnCifar;
    use crate::model::cnn_fmnist::CnnFmnist;
    use crate::model::{
        Architecture, AutodiffOnly, Batch, ParamLayout, batch, cross_entropy, dense_rows,
    };
    use crate::rng::{Purpose, stream};
    use crate::train::evaluate;

    /// The flat parameters split per tensor, in the order of the models' `params()`.
    fn split(net: &Net, flat: &[f32], device: &Device) -> Vec<Tensor<1>> {
        let plan = net.plan();
        let mut bounds = Vec::new();
        for (i, s) in net.stages.iter().enumerate() {
            if let Stage::Conv { cout, k, .. } = *s {
                let at = plan.conv_at[i];
                let w = cout * plan.shapes[i][0] * k * k;
                bounds.extend([at..at + w, at + w..at + w + cout]);
            }
        }
        for (&(wa, ba), &width) in plan.dense_at.iter().zip(&net.dense) {
            bounds.extend([wa..ba, ba..ba + width]);
        }
        bounds
            .into_iter()
            .map(|r| {
                let n = r.len();
                Tensor::<1>::from_data(TensorData::new(flat[r].to_vec(), [n]), device)
            })
            .collect()
    }

    /// The logits of `net` by burn's ops, stage by stage.
    fn burn_forward(net: &Net, p: &[Tensor<1>], x: Tensor<2>) -> Tensor<2> {
        let b = x.dims()[0];
        let [c, h, w] = net.input;
        let mut t = x.reshape([b, c, h, w]);
        let mut next = 0;
        for s in net.stages {
            t = match *s {
                Stage::Conv { cout, k, pad } => {
                    let cin = t.dims()[1];
                    let weight = p[next].clone().reshape([cout, cin, k, k]);
                    let bias = p[next + 1].clone();
                    next += 2;
                    conv2d(
                        t,
                        weight,
                        Some(bias),
                        ConvOptions::new([1, 1], [pad, pad], [1, 1], 1),
                    )
                }
                Stage::Relu => burn_relu(t),
                Stage::Pool => max_pool2d(t, MaxPoolOptions::new([2, 2])),
            };
        }
        let mut fan_in = net.features();
        let mut a = t.reshape([b, fan_in]);
        for (l, &width) in net.dense.iter().enumerate() {
            let z = a.matmul(p[next].clone().reshape([fan_in, width]))
                + p[next + 1].clone().unsqueeze::<2>();
            next += 2;
            a = if l + 1 < net.dense.len() {
                burn_relu(z)
            } else {
                z
            };
            fan_in = width;
        }
        a
    }

    /// Loss and flat gradient by burn's autodiff through `forward`.
    fn autodiff(
        params: Vec<Tensor<1>>,
        data: &Dataset,
        idx: &[usize],
        forward: impl Fn(&[Tensor<1>], Batch) -> Tensor<2>,
    ) -> (f32, Vec<f32>) {
        let device = Device::flex();
        let ad: Vec<Tensor<1>> = params
            .into_iter()
            .map(|p| p.autodiff().require_grad())
            .collect();
        let (x, y) = batch(data, idx, &device);
        let loss = cross_entropy(forward(&ad, x), y);
        let grads = loss.backward();
        let g: Vec<f32> = ad
            .iter()
            .flat_map(|p| {
                p.grad(&grads)
                    .unwrap()
                    .into_data()
                    .try_into_vec::<f32>()
                    .unwrap()
            })
            .collect();
        (loss.inner().into_scalar::<f32>(), g)
    }

    fn relative_error(a: &[f32], b: &[f32]) -> f64 {
        let diff: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
        let norm: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
        (diff / norm).sqrt()
    }

    /// Each parameter tensor's fused gradient is within 1e-4 (relative, in norm) of
    /// `want`, and the losses agree to 1e-5.
    fn assert_close(net: &Net, got: (f32, Vec<f32>), want: (f32, Vec<f32>)) {
        let ((loss, grad), (want_loss, want)) = (got, want);
        assert!(
            (loss - want_loss).abs() <= 1e-5 * want_loss.abs(),
            "{loss} vs {want_loss}"
        );
        let device = Device::flex();
        let parts = |g: &[f32]| -> Vec<Vec<f32>> {
            split(net, g, &device)
                .into_iter()
                .map(|t| t.into_data().try_into_vec::<f32>().unwrap())
                .collect()
        };
        for (i, (g, w)) in parts(&grad).iter().zip(parts(&want)).enumerate() {
            assert!(w.iter().any(|&v| v != 0.0), "parameter {i} has no gradient");
            let err = relative_error(g, &w);
            assert!(err < 1e-4, "parameter {i}: relative error {err:e}");
        }
    }

    /// Parameters of `net` drawn uniformly from ±0.5.
    fn random_params(net: &Net, seed: u64) -> Vec<f32> {
        let mut rng = stream(seed, Purpose::Init, 0, 0);
        (0..net.plan().total)
            .map(|_| rng.random_range(-0.5..0.5))
            .collect()
    }

    /// Odd image sizes (pools drop a row and a column), padding on a non-square image,
    /// a pool before its ReLU and two dense layers.
    #[test]
    fn the_fused_gradient_matches_autodiff_on_small_cnns() {
        let nets = [
            Net {
                input: [2, 7, 6],
                stages: &[
                    Stage::Conv {
                        cout: 3,
                        k: 3,
                        pad: 1,
                    },
                    Stage::Relu,
                    Stage::Pool,
                    Stage::Conv {
                        cout: 4,
                        k: 2,
                        pad: 0,
                    },
                    Stage::Pool,
                    Stage::Relu,
                ],
                dense: vec![5, 3],
            },
            Net {
                input: [1, 9, 9],
                stages: &[
                    Stage::Conv {
                        cout: 2,
                        k: 5,
                        pad: 2,
                    },
                    Stage::Relu,
                    Stage::Pool,
                ],
                dense: vec![4],
            },
        ];
        let device = Device::flex();
        for (seed, net) in nets.iter().enumerate() {
            let classes = *net.dense.last().unwrap();
            let data = random_dataset(&net.input, None, 14, classes);
            let params = random_params(net, seed as u64);
            let idx: Vec<usize> = (0..14).step_by(2).collect();
            let (x, labels) = dense_rows(&data, &idx);
            let got = net.loss_and_gradient(&params, &x, &labels);
            let want = autodiff(split(net, &params, &device), &data, &idx, |p, x| {
                burn_forward(net, p, crate::model::dense(x))
            });
            assert_close(net, got, want);
        }
    }

    /// The three seed models at their real shapes, against their own burn forward pass.
    fn models() -> Vec<(Box<dyn Architecture>, Net, Dataset)> {
        let fmnist = |hidden| {
            let m = CnnFmnist {
                classes: 10,
                hidden,
            };
            let net = m.net();
            (
                Box::new(m) as Box<dyn Architecture>,
                net,
                random_dataset(&[1, 28, 28], None, 12, 10),
            )
        };
        let cifar = CnnCifar { classes: 10 };
        vec![
            fmnist(Some(512)),
            fmnist(None),
            (
                Box::new(cifar.clone()),
                cifar.net(),
                random_dataset(&[3, 32, 32], None, 12, 10),
            ),
        ]
    }

    #[test]
    fn the_fused_gradient_matches_autodiff_on_the_seed_models() {
        let device = Device::flex();
        for (seed, (arch, net, data)) in models().into_iter().enumerate() {
            let layout = ParamLayout::of(arch.as_ref());
            assert_eq!(layout.total, net.plan().total, "{}", arch.name());
            let params = layout.init(seed as u64);
            let idx = [1, 4, 5, 7, 10];
            let got = arch
                .loss_gradient()
                .expect("the CNNs have a fused gradient")
                .loss_and_gradient(&params, &data, &idx);
            let want = autodiff(layout.to_tensors(&params, &device), &data, &idx, |p, x| {
                arch.forward(p, x, None)
            });
            assert_close(&net, got, want);
        }
    }

    /// Batches of 9 cut into chunks of 4, 4 and 1; the dense products split into blocks.
    #[test]
    fn the_fused_gradient_does_not_depend_on_the_thread_count() {
        for (arch, _, data) in models() {
            let params = ParamLayout::of(arch.as_ref()).init(5);
            let idx: Vec<usize> = (0..9).collect();
            let f = arch
                .loss_gradient()
                .expect("the CNNs have a fused gradient");
            let run = |threads: usize| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap()
                    .install(|| f.loss_and_gradient(&params, &data, &idx))
            };
            let (loss, grad) = run(1);
            for threads in [2, 3, 4] {
                let (l, g) = run(threads);
                assert_eq!(l.to_bits(), loss.to_bits(), "{} {threads}", arch.name());
                assert!(
                    g.iter().zip(&grad).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{} {threads} threads",
                    arch.name()
                );
            }
        }
    }

    /// The fused logits match burn's forward pass, and evaluation through them matches
    /// evaluation through burn.
    #[test]
    fn the_fused_logits_match_the_burn_forward_pass() {
        let device = Device::flex();
        for (arch, _, data) in models() {
            let layout = ParamLayout::of(arch.as_ref());
            let params = layout.init(6);
            let idx: Vec<usize> = (0..12).collect();
            let p = layout.to_tensors(&params, &device);
            let (x, _) = batch(&data, &idx, &device);
            let want = arch
                .forward(&p, x, None)
                .into_data()
                .try_into_vec::<f32>()
                .unwrap();
            let (x, _) = dense_rows(&data, &idx);
            let got = arch
                .fused_logits()
                .expect("the CNNs have fused logits")
                .logits(&params, &x, idx.len());
            let err = relative_error(&got, &want);
            assert!(err < 1e-5, "{}: relative error {err:e}", arch.name());
            let fused = evaluate(arch.as_ref(), &p, &data, &idx, 5, &device);
            let reference = evaluate(&AutodiffOnly(arch.as_ref()), &p, &data, &idx, 5, &device);
            assert_eq!(fused.accuracy, reference.accuracy, "{}", arch.name());
            assert!(
                (fused.loss - reference.loss).abs() <= 1e-5 * reference.loss,
                "{}: {} vs {}",
                arch.name(),
                fused.loss,
                reference.loss
            );
            let labels: Vec<i64> = idx.iter().map(|&i| i64::from(data.labels[i])).collect();
            let (_, correct) = crate::model::loss_and_correct_of(&got, &labels);
            let y = Tensor::<1, Int>::from_data(
                TensorData::new(labels.iter().map(|&l| l as i32).collect(), [12]),
                &device,
            );
            let logits = Tensor::<2>::from_data(TensorData::new(want, [12, 10]), &device);
            assert_eq!(correct, crate::model::loss_and_correct(logits, y).1);
        }
    }
}

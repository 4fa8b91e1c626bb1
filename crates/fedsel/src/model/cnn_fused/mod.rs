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
//! shape. So no sum depends on the number of threads. Across CPU kinds the bits may
//! differ: the loops here give the same bits on SSE2, AVX2 and AVX-512 ([`Isa`]), but
//! `gemm` picks its kernels (and their blocking) by instruction set.

use std::cell::RefCell;

use rayon::prelude::*;

use crate::cpu::Isa;
use crate::model::matmul::{View, gemm_into, gemm_into_padded, matmul};

#[cfg(test)]
thread_local! {
    /// Tests run the narrower copies on this thread (never one the CPU lacks), to check
    /// that every copy gives the same bits.
    static FORCED_ISA: std::cell::Cell<Option<Isa>> = const { std::cell::Cell::new(None) };
}

/// The [`Isa`] the loops around the GEMMs ("glue": im2col, col2im, ReLU, pooling, bias
/// sums) run on: [`crate::cpu::isa`], or in tests the one a test forces. They are
/// elementwise work, copies and sums each kept in its sequential order, so the bits are
/// the same whichever version runs.
pub(crate) fn glue_isa() -> Isa {
    #[cfg(test)]
    if let Some(isa) = FORCED_ISA.with(std::cell::Cell::get) {
        return isa;
    }
    crate::cpu::isa()
}

/// Defines `fn name(args) body` compiled once per [`Isa`], the call running the
/// version [`glue_isa`] picks. The body is inlined into each version, so its loops are
/// vectorised for that instruction set.
macro_rules! dispatch {
    ($(#[$attr:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$attr])*
        $vis fn $name($($arg: $ty),*) {
            crate::cpu::on_isa!(glue_isa(), fn $name($($arg: $ty),*) $body)
        }
    };
}

mod conv;
mod elementwise;
#[cfg(test)]
mod tests;

#[cfg(target_arch = "x86_64")]
use conv::conv_direct_avx512;
use conv::{DIRECT_PATCH, col2im, im2col, pad_image, patch_stride, transposed};
use elementwise::{
    add_assign, add_row_sums, pool_backward, pool_forward, relu, relu_backward, relu_in_place,
    relu_into, relu_passes,
};

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

/// Entries per task when the chunks' gradients are summed.
const SUM_BLOCK: usize = 1 << 13;

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

/// What one image's forward pass keeps: each stage's output, and for each pool the
/// index (into its input) of each window's maximum. Buffers are reused across images.
#[derive(Default)]
struct Trace {
    outs: Vec<Vec<f32>>,
    argmax: Vec<Vec<u32>>,
}

/// Scratch buffers of one thread, reused across its images and steps.
#[derive(Default)]
struct Scratch {
    col: Vec<f32>,
    /// A convolution's output at the patch matrix's row stride, where that is wider.
    wide: Vec<f32>,
    padded: Vec<f32>,
    grad: Vec<f32>,
    grad_in: Vec<f32>,
}

thread_local! {
    /// This thread's scratch. Kept across steps, so that the patch matrices (0.6 MB per
    /// image in the FMNIST models' second layer) are not allocated and zeroed anew.
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
    /// The per-image traces of the last batch this thread ran [`Net::loss_and_gradient`]
    /// on, kept for the same reason (about 21 MB for `cnn_fmnist` at batch 64).
    static TRACES: RefCell<Vec<Trace>> = const { RefCell::new(Vec::new()) };
}

/// Makes `v` `n` zeros long.
fn zeros(v: &mut Vec<f32>, n: usize) {
    v.clear();
    v.resize(n, 0.0);
}

/// Makes `v` `n` long, keeping what it holds (only new entries are set): for buffers
/// that are then written in full, where zeroing them first would be wasted work.
fn fit<T: Copy + Default>(v: &mut Vec<T>, n: usize) {
    v.resize(n, T::default());
}

impl Net {
    /// Whether stage `i` is a ReLU just before a pool: the pool then runs on the ReLU's
    /// input and applies it to the window maxima (ReLU is monotone and keeps NaN, so
    /// `max(relu(v)) = relu(max(v))`), and the ReLU's own pass and output are skipped.
    /// Only the argmax of a window whose maximum is at most 0 can differ, and there the
    /// ReLU passes no gradient anyway.
    fn relu_into_pool(&self, i: usize) -> bool {
        matches!(self.stages[i], Stage::Relu) && matches!(self.stages.get(i + 1), Some(Stage::Pool))
    }

    /// Runs the stages on image `x`, filling `tr` (a ReLU just before a pool leaves its
    /// output empty, [`Net::relu_into_pool`]).
    fn forward_image(
        &self,
        plan: &Plan,
        params: &[f32],
        x: &[f32],
        tr: &mut Trace,
        s: &mut Scratch,
    ) {
        let n = self.stages.len();
        tr.outs.resize_with(n, Vec::new);
        tr.argmax.resize_with(n, Vec::new);
        for (i, stage) in self.stages.iter().enumerate() {
            let shape = plan.shapes[i];
            let [co, ho, wo] = plan.shapes[i + 1];
            let (done, rest) = tr.outs.split_at_mut(i);
            let fused_relu = i > 0 && self.relu_into_pool(i - 1);
            // A pool after a fused ReLU reads the ReLU's input.
            let input: &[f32] = match (i, fused_relu) {
                (0, _) => x,
                (1, true) => x,
                (_, true) => &done[i - 2],
                _ => &done[i - 1],
            };
            let out = &mut rest[0];
            if self.relu_into_pool(i) {
                out.clear();
                continue;
            }
            fit(out, co * ho * wo);
            match *stage {
                Stage::Conv { cout, k, pad } => {
                    let ckk = shape[0] * k * k;
                    let (hw, ld) = (ho * wo, patch_stride(ho * wo));
                    let w = &params[plan.conv_at[i]..][..cout * ckk];
                    let b = &params[plan.conv_at[i] + cout * ckk..][..cout];
                    #[cfg(target_arch = "x86_64")]
                    if ckk <= DIRECT_PATCH && glue_isa() == Isa::Avx512 {
                        let [c, h, w_in] = shape;
                        let xp: &[f32] = if pad == 0 {
                            input
                        } else {
                            pad_image(input, shape, pad, &mut s.padded);
                            &s.padded
                        };
                        // SAFETY: glue_isa found AVX-512F; `xp` is the padded image, `w`
                        // and `b` this stage's weights and biases, `out` its output.
                        unsafe {
                            conv_direct_avx512(xp, [c, h + 2 * pad, w_in + 2 * pad], k, w, b, out)
                        };
                        continue;
                    }
                    fit(&mut s.col, ckk * ld);
                    im2col(input, shape, k, pad, &mut s.padded, &mut s.col, ld);
                    let wide = if ld == hw {
                        &mut out[..]
                    } else {
                        fit(&mut s.wide, cout * ld);
                        &mut s.wide[..]
                    };
                    for (row, &bias) in wide.chunks_exact_mut(ld).zip(b) {
                        row.fill(bias);
                    }
                    gemm_into_padded(
                        wide,
                        ld,
                        View::new(w, cout, ckk),
                        View::new(&s.col, ckk, ld),
                        true,
                        hw,
                    );
                    if ld > hw {
                        for (o, row) in out.chunks_exact_mut(hw).zip(s.wide.chunks_exact(ld)) {
                            o.copy_from_slice(&row[..hw]);
                        }
                    }
                }
                Stage::Relu => relu_into(out, input),
                Stage::Pool => {
                    let idx = &mut tr.argmax[i];
                    fit(idx, co * ho * wo);
                    pool_forward(input, shape, out, idx);
                    if fused_relu {
                        relu_in_place(out);
                    }
                }
            }
        }
    }

    /// Backward through the stages of one image: `s.grad` holds the loss gradient of
    /// the stages' output; convolution gradients are added to `grad` (the convolution
    /// part of the flat gradient, each weight transposed to `[cin·k·k, cout]`). `w_t`
    /// holds each convolution's weight transposed the same way (empty for the first).
    fn backward_image(
        &self,
        plan: &Plan,
        w_t: &[Vec<f32>],
        x: &[f32],
        tr: &Trace,
        grad: &mut [f32],
        s: &mut Scratch,
    ) {
        let mut i = self.stages.len();
        while i > 0 {
            i -= 1;
            let shape = plan.shapes[i];
            let [ci, h, w] = shape;
            let [_, ho, wo] = plan.shapes[i + 1];
            let input: &[f32] = if i == 0 { x } else { &tr.outs[i - 1] };
            match self.stages[i] {
                Stage::Conv { cout, k, pad } => {
                    let ckk = ci * k * k;
                    let (hw, ld) = (ho * wo, patch_stride(ho * wo));
                    let at = plan.conv_at[i];
                    let (gw_t, gb) = grad[at..at + cout * ckk + cout].split_at_mut(cout * ckk);
                    fit(&mut s.col, ckk * ld);
                    im2col(input, shape, k, pad, &mut s.padded, &mut s.col, ld);
                    // ∂Wᵀ += col·δyᵀ: laid out this way, `gemm` reads the patch matrix in
                    // place (rows of whole vectors) where ∂W = δy·colᵀ made it copy it.
                    let col = View {
                        data: &s.col,
                        rows: ckk,
                        cols: hw,
                        rs: ld,
                        cs: 1,
                    };
                    gemm_into(gw_t, cout, col, View::new(&s.grad, cout, hw).t(), true);
                    add_row_sums(gb, &s.grad, hw);
                    if i == 0 {
                        return;
                    }
                    // δcol = Wᵀ·δy overwrites the patch buffer; read from Wᵀ in memory,
                    // `gemm` does not copy W for every image.
                    gemm_into(
                        &mut s.col,
                        hw,
                        View::new(&w_t[i], ckk, cout),
                        View::new(&s.grad, cout, hw),
                        false,
                    );
                    zeros(&mut s.grad_in, ci * h * w);
                    col2im(&s.col[..ckk * hw], shape, k, pad, &mut s.grad_in);
                }
                Stage::Relu => {
                    fit(&mut s.grad_in, ci * h * w);
                    relu_backward(&mut s.grad_in, &s.grad, &tr.outs[i]);
                }
                Stage::Pool => {
                    zeros(&mut s.grad_in, ci * h * w);
                    // A ReLU just before the pool (fused in the forward pass) is applied
                    // here: its gradient passes where its output does, and only window
                    // maxima receive one, where its output is the pool's. Skipping its
                    // own pass gives the same bits: each pixel gets at most one 0 + g,
                    // masked or not.
                    let relu_before = i > 0 && self.relu_into_pool(i - 1);
                    pool_backward(
                        &mut s.grad_in,
                        &tr.argmax[i],
                        &s.grad,
                        relu_before.then_some(&tr.outs[i][..]),
                    );
                    if relu_before {
                        i -= 1;
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
                    .for_each(|((tr, f), x)| {
                        SCRATCH.with_borrow_mut(|s| {
                            self.forward_image(plan, params, x, tr, s);
                        });
                        f.copy_from_slice(&tr.outs[last]);
                    });
            }
            None => feats
                .par_chunks_mut(d)
                .zip(x.par_chunks(pixels))
                .for_each_init(Trace::default, |tr, (f, x)| {
                    SCRATCH.with_borrow_mut(|s| {
                        self.forward_image(plan, params, x, tr, s);
                    });
                    f.copy_from_slice(&tr.outs[last]);
                }),
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

    /// Lays each convolution weight's gradient in `grad` (the convolution part of the
    /// flat gradient) out as the parameters are, from the `[cin·k·k, cout]` layout the
    /// backward pass accumulates it in.
    fn untranspose_weights(&self, plan: &Plan, grad: &mut [f32]) {
        for (i, stage) in self.stages.iter().enumerate() {
            if let Stage::Conv { cout, k, .. } = *stage {
                let ckk = plan.shapes[i][0] * k * k;
                let w = &mut grad[plan.conv_at[i]..][..cout * ckk];
                let t = transposed(w, ckk, cout);
                w.copy_from_slice(&t);
            }
        }
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
        // Taken, not borrowed: a nested call on this thread (a rayon task stolen while
        // this one waits) finds an empty list and allocates its own.
        let mut traces = TRACES.take();
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
                add_assign(gb, row);
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

        // Each convolution's weight transposed, `[cin·k·k, cout]`, for the input
        // gradients (the first convolution has none); the chunks' weight gradients come
        // in that layout too (see `backward_image`).
        let w_t: Vec<Vec<f32>> = self
            .stages
            .iter()
            .enumerate()
            .map(|(i, stage)| match *stage {
                Stage::Conv { cout, k, .. } if i > 0 => {
                    let ckk = plan.shapes[i][0] * k * k;
                    transposed(&params[plan.conv_at[i]..][..cout * ckk], cout, ckk)
                }
                _ => Vec::new(),
            })
            .collect();
        let pixels: usize = self.input.iter().product();
        let conv_grads: Vec<Vec<f32>> = traces
            .par_chunks(CHUNK)
            .zip(dz.par_chunks(CHUNK * width))
            .zip(x.par_chunks(CHUNK * pixels))
            .map(|((trs, dfeat), xs)| {
                let mut g = vec![0.0; plan.conv_total];
                // No rayon call runs inside (each GEMM is single-threaded), so no other
                // task of this thread can want the scratch while it is borrowed.
                SCRATCH.with_borrow_mut(|s| {
                    for ((tr, df), x) in trs
                        .iter()
                        .zip(dfeat.chunks_exact(width))
                        .zip(xs.chunks_exact(pixels))
                    {
                        s.grad.clear();
                        s.grad.extend_from_slice(df);
                        self.backward_image(&plan, &w_t, x, tr, &mut g, s);
                    }
                });
                g
            })
            .collect();
        // The chunks' sums added in chunk order, entry by entry (the entries in blocks
        // side by side), each weight still in the backward pass's layout; then laid out
        // as the parameters, once.
        grad[..plan.conv_total]
            .par_chunks_mut(SUM_BLOCK)
            .enumerate()
            .for_each(|(b, dst)| {
                for part in &conv_grads {
                    add_assign(dst, &part[b * SUM_BLOCK..][..dst.len()]);
                }
            });
        self.untranspose_weights(&plan, &mut grad[..plan.conv_total]);
        TRACES.set(traces);
        ((loss / batch as f64) as f32, grad)
    }
}

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
use std::ops::Range;

use rayon::prelude::*;

use crate::cpu::Isa;
use crate::model::fit;
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

/// The mask of a 16-lane vector's first `n` lanes (all of them from 16 on): the row
/// edges of the AVX-512 loops.
#[cfg(target_arch = "x86_64")]
fn first_lanes(n: usize) -> u16 {
    ((1u32 << n.min(16)) - 1) as u16
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
mod norm;
#[cfg(test)]
mod tests;

#[cfg(target_arch = "x86_64")]
use conv::conv_direct_avx512;
use conv::{DIRECT_PATCH, Padded, col2im, im2col, patch_stride, transposed};
use elementwise::{
    add_assign, add_row_sums, pool_backward, pool_forward, relu, relu_backward, relu_in_place,
    relu_into, relu_passes,
};
use norm::{Norm, in_image_order, moments, prelu_backward, prelu_forward};

/// One per-image stage.
#[derive(Debug, Clone, Copy)]
pub(super) enum Stage {
    /// Stride-1 convolution to `cout` channels with a `k × k` kernel and zero padding
    /// `pad`, with a bias per channel or none.
    Conv {
        cout: usize,
        k: usize,
        pad: usize,
        bias: bool,
    },
    /// ReLU.
    Relu,
    /// 2×2 max-pool with stride 2; an odd last row or column is dropped.
    Pool,
    /// PReLU with one slope for all channels (one parameter).
    Prelu,
    /// BatchNorm over the channels ([`norm`]): its scale, shift, running mean and running
    /// variance, one per channel each; the running ones are not trained.
    BatchNorm,
}

/// Which statistics BatchNorm normalises by; a net without BatchNorm runs the same
/// either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// The batch's, moving the running statistics (PyTorch's `train()`).
    Train,
    /// The running statistics (PyTorch's `eval()`).
    Eval,
}

/// A CNN: the image shape `[c, h, w]`, the per-image stages, and the widths of the
/// dense layers after them (hidden widths, then the classes). Parameters are laid
/// out stage by stage (each convolution's weight `[cout, cin, k, k]` and bias, each
/// PReLU's slope, each BatchNorm's four vectors), then each dense layer's weight
/// `[fan_in, fan_out]` and bias, as the models' `params()`.
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
    /// Offset of each stage's parameters (a convolution's bias follows its weight).
    at: Vec<usize>,
    /// Scalars of all stages' parameters (they come first in the flat vector).
    stage_total: usize,
    /// Offsets of each dense layer's weight and bias.
    dense_at: Vec<(usize, usize)>,
    /// Whether stage i's output stays in the image's trace: when the backward pass or a
    /// later range reads it, or it is the features. The others pass through the
    /// thread's scratch, which stays in cache where a batch's traces do not: those read
    /// only by the next stage (or the pool after a fused ReLU), as a convolution's
    /// output before its pool, and a PReLU's output before a BatchNorm, recomputed from
    /// the PReLU's input where it is read again ([`Net::norm_input`]).
    kept: Vec<bool>,
    /// All parameters.
    total: usize,
}

impl Net {
    fn plan(&self) -> Plan {
        let mut shapes = vec![self.input];
        let mut stage_at = Vec::with_capacity(self.stages.len());
        let mut at = 0;
        for s in self.stages {
            let [c, h, w] = *shapes.last().expect("starts with the input");
            stage_at.push(at);
            shapes.push(match *s {
                Stage::Conv { cout, k, pad, bias } => {
                    at += cout * c * k * k + if bias { cout } else { 0 };
                    [cout, h + 2 * pad + 1 - k, w + 2 * pad + 1 - k]
                }
                Stage::Relu => [c, h, w],
                Stage::Pool => [c, h / 2, w / 2],
                Stage::Prelu => {
                    at += 1;
                    [c, h, w]
                }
                Stage::BatchNorm => {
                    assert!(shapes.len() > 1, "a BatchNorm follows a stage");
                    at += 4 * c;
                    [c, h, w]
                }
            });
        }
        let stage_total = at;
        let [c, h, w] = *shapes.last().expect("starts with the input");
        let mut fan_in = c * h * w;
        let mut dense_at = Vec::with_capacity(self.dense.len());
        for &width in &self.dense {
            dense_at.push((at, at + fan_in * width));
            at += fan_in * width + width;
            fan_in = width;
        }
        let n = self.stages.len();
        let kept = (0..n)
            .map(|j| {
                let read_next = match self.stages.get(j + 1) {
                    Some(Stage::Conv { .. } | Stage::Prelu) => true,
                    Some(Stage::BatchNorm) => j == 0 || !matches!(self.stages[j], Stage::Prelu),
                    _ => false,
                };
                let read_own = match self.stages[j] {
                    Stage::Relu => !self.relu_into_pool(j),
                    Stage::Pool => j > 0 && self.relu_into_pool(j - 1),
                    _ => false,
                };
                j + 1 == n || read_next || read_own
            })
            .collect();
        Plan {
            shapes,
            at: stage_at,
            stage_total,
            dense_at,
            total: at,
            kept,
        }
    }

    fn features(&self) -> usize {
        let [c, h, w] = *self.plan().shapes.last().expect("starts with the input");
        c * h * w
    }

    /// The BatchNorm stages, in order.
    fn norms(&self) -> impl DoubleEndedIterator<Item = usize> + '_ {
        (0..self.stages.len()).filter(|&i| matches!(self.stages[i], Stage::BatchNorm))
    }

    /// Each BatchNorm's statistics from its running ones, by stage (eval mode).
    fn running_norms(&self, plan: &Plan, params: &[f32]) -> Vec<Option<Norm>> {
        let mut norms: Vec<Option<Norm>> = self.stages.iter().map(|_| None).collect();
        for i in self.norms() {
            let c = plan.shapes[i][0];
            norms[i] = Some(Norm::running(&params[plan.at[i]..][..4 * c], c));
        }
        norms
    }
}

/// A BatchNorm's stage and its batch sums (Σ δy, Σ δy·x̂) per channel.
type NormSums = (usize, Vec<[f64; 2]>);

/// What one image's forward pass keeps: each stage's output that [`Plan::kept`] keeps
/// (the others' entries stay empty), and for each pool the index (into its input) of
/// each window's maximum. Buffers are reused across images.
#[derive(Default)]
struct Trace {
    outs: Vec<Vec<f32>>,
    argmax: Vec<Vec<u32>>,
    /// In the backward pass of a net with BatchNorm, the image's gradient held while
    /// the batch's sums are taken.
    grad: Vec<f32>,
    /// The image's per-channel pairs of sums at the BatchNorm that ends the range it
    /// last ran, taken as it left that range: (Σx, Σx²) of the BatchNorm's input going
    /// forward, (Σδy, Σδy·x̂) going backward.
    sums: Vec<[f64; 2]>,
}

/// Scratch buffers of one thread, reused across its images and steps.
#[derive(Default)]
struct Scratch {
    col: Vec<f32>,
    /// A convolution's output at the patch matrix's row stride, where that is wider.
    wide: Vec<f32>,
    padded: Padded,
    grad: Vec<f32>,
    grad_in: Vec<f32>,
    /// The outputs of the stages a trace does not keep, by stage, for the next stage.
    passing: Vec<Vec<f32>>,
}

thread_local! {
    /// This thread's scratch. Kept across steps, so that the patch matrices (0.6 MB per
    /// image in the FMNIST models' second layer) are not allocated and zeroed anew.
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
    /// The per-image traces of the last batch this thread ran [`Net::loss_and_gradient`]
    /// on, kept for the same reason: at batch 64, 4.8 MB for `cnn_fmnist` (its pools'
    /// outputs and indices) and 27 MB for `cnn_hics_code` ([`Plan::kept`]).
    static TRACES: RefCell<Vec<Trace>> = const { RefCell::new(Vec::new()) };
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

    /// The input of BatchNorm stage `b` for one image with stage outputs `outs`: the
    /// trace's, or the PReLU's output recomputed into `buf` from its input where the
    /// trace does not keep it ([`Plan::kept`]; the same bits).
    fn norm_input<'a>(
        plan: &Plan,
        params: &[f32],
        b: usize,
        outs: &'a [Vec<f32>],
        buf: &'a mut Vec<f32>,
    ) -> &'a [f32] {
        if plan.kept[b - 1] {
            return &outs[b - 1];
        }
        let x = &outs[b - 2];
        fit(buf, x.len());
        prelu_forward(buf, x, params[plan.at[b - 1]]);
        buf
    }

    /// Runs stages `range` on image `x`, filling `tr` (a ReLU just before a pool leaves
    /// its output empty, [`Net::relu_into_pool`]); a BatchNorm normalises by its `norms`.
    /// A range that ends at a BatchNorm leaves the image's moments of its input in
    /// `tr.sums`.
    #[allow(clippy::too_many_arguments)]
    fn forward_image(
        &self,
        plan: &Plan,
        params: &[f32],
        norms: &[Option<Norm>],
        range: Range<usize>,
        x: &[f32],
        tr: &mut Trace,
        s: &mut Scratch,
    ) {
        let n = self.stages.len();
        tr.outs.resize_with(n, Vec::new);
        tr.argmax.resize_with(n, Vec::new);
        s.passing.resize_with(n, Vec::new);
        for i in range.clone() {
            let stage = &self.stages[i];
            let shape = plan.shapes[i];
            let [co, ho, wo] = plan.shapes[i + 1];
            if i == range.start && matches!(stage, Stage::BatchNorm) {
                // The range starts here: an input not kept is no longer in the scratch.
                Self::norm_input(plan, params, i, &tr.outs, &mut s.passing[i - 1]);
            }
            let (done, rest) = tr.outs.split_at_mut(i);
            let (passed, ahead) = s.passing.split_at_mut(i);
            let fused_relu = i > 0 && self.relu_into_pool(i - 1);
            let output = |j: usize| -> &[f32] { if plan.kept[j] { &done[j] } else { &passed[j] } };
            // A pool after a fused ReLU reads the ReLU's input.
            let input: &[f32] = match (i, fused_relu) {
                (0, _) => x,
                (1, true) => x,
                (_, true) => output(i - 2),
                _ => output(i - 1),
            };
            let out = if plan.kept[i] {
                &mut rest[0]
            } else {
                &mut ahead[0]
            };
            if self.relu_into_pool(i) {
                out.clear();
                continue;
            }
            fit(out, co * ho * wo);
            match *stage {
                Stage::Conv { cout, k, pad, bias } => {
                    let ckk = shape[0] * k * k;
                    let (hw, ld) = (ho * wo, patch_stride(ho * wo));
                    let w = &params[plan.at[i]..][..cout * ckk];
                    let b = bias.then(|| &params[plan.at[i] + cout * ckk..][..cout]);
                    #[cfg(target_arch = "x86_64")]
                    if ckk <= DIRECT_PATCH && glue_isa() == Isa::Avx512 {
                        let [c, h, w_in] = shape;
                        let xp: &[f32] = if pad == 0 {
                            input
                        } else {
                            s.padded.of(input, shape, pad)
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
                    match b {
                        Some(b) => {
                            for (row, &bias) in wide.chunks_exact_mut(ld).zip(b) {
                                row.fill(bias);
                            }
                        }
                        None => wide.fill(0.0),
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
                Stage::Prelu => prelu_forward(out, input, params[plan.at[i]]),
                Stage::BatchNorm => norms[i]
                    .as_ref()
                    .expect("a BatchNorm's statistics")
                    .forward(out, input),
            }
        }
        if let Some(Stage::BatchNorm) = self.stages.get(range.end) {
            let [_, h, w] = plan.shapes[range.end];
            let j = range.end - 1;
            let x = if plan.kept[j] {
                &tr.outs[j]
            } else {
                &s.passing[j]
            };
            moments(x, h * w, &mut tr.sums);
        }
    }

    /// Backward through stages `range` of one image: `s.grad` holds the loss gradient
    /// of the range's output, and leaves it holding the gradient of the range's input
    /// (none when the range starts at the image). Parameter gradients are added to
    /// `grad` (the stages' part of the flat gradient, each convolution weight transposed
    /// to `[cin·k·k, cout]`). `w_t` holds each convolution's weight transposed the same
    /// way (empty for the first).
    #[allow(clippy::too_many_arguments)]
    fn backward_image(
        &self,
        plan: &Plan,
        params: &[f32],
        w_t: &[Vec<f32>],
        range: Range<usize>,
        x: &[f32],
        tr: &Trace,
        grad: &mut [f32],
        s: &mut Scratch,
    ) {
        let mut i = range.end;
        while i > range.start {
            i -= 1;
            let shape = plan.shapes[i];
            let [ci, h, w] = shape;
            let [_, ho, wo] = plan.shapes[i + 1];
            let input: &[f32] = if i == 0 { x } else { &tr.outs[i - 1] };
            match self.stages[i] {
                Stage::Conv { cout, k, pad, bias } => {
                    let ckk = ci * k * k;
                    let (hw, ld) = (ho * wo, patch_stride(ho * wo));
                    let at = plan.at[i];
                    let biases = if bias { cout } else { 0 };
                    let (gw_t, gb) = grad[at..at + cout * ckk + biases].split_at_mut(cout * ckk);
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
                    if bias {
                        add_row_sums(gb, &s.grad, hw);
                    }
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
                    fit(&mut s.grad_in, ci * h * w);
                    col2im(&s.col[..ckk * hw], shape, k, pad, &mut s.grad_in);
                }
                Stage::Relu => {
                    fit(&mut s.grad_in, ci * h * w);
                    relu_backward(&mut s.grad_in, &s.grad, &tr.outs[i]);
                }
                Stage::Pool => {
                    fit(&mut s.grad_in, ci * h * w);
                    // A ReLU just before the pool (fused in the forward pass) is applied
                    // here: its gradient passes where its output does, and only window
                    // maxima receive one, where its output is the pool's. Skipping its
                    // own pass gives the same bits: each pixel gets at most one 0 + g,
                    // masked or not.
                    let relu_before = i > 0 && self.relu_into_pool(i - 1);
                    pool_backward(
                        &mut s.grad_in,
                        shape,
                        &tr.argmax[i],
                        &s.grad,
                        relu_before.then_some(&tr.outs[i][..]),
                    );
                    if relu_before {
                        i -= 1;
                    }
                }
                Stage::Prelu => {
                    fit(&mut s.grad_in, ci * h * w);
                    let at = plan.at[i];
                    let mut da = 0.0;
                    prelu_backward(&mut s.grad_in, &s.grad, input, params[at], &mut da);
                    grad[at] += da as f32;
                }
                Stage::BatchNorm => unreachable!("a BatchNorm bounds the backward ranges"),
            }
            std::mem::swap(&mut s.grad, &mut s.grad_in);
        }
    }

    /// The stages' output of each image of `x` (`batch` images), one row each, and each
    /// BatchNorm's statistics by stage. With `keep`, the images' traces stay there; a
    /// BatchNorm in training mode then waits for every image's input to it, so the
    /// stages run in ranges, each BatchNorm starting one once its statistics are known.
    /// Without `keep` (evaluation), BatchNorm reads its running statistics.
    fn features_of(
        &self,
        plan: &Plan,
        params: &[f32],
        x: &[f32],
        batch: usize,
        keep: Option<&mut Vec<Trace>>,
        mode: Mode,
    ) -> (Vec<f32>, Vec<Option<Norm>>) {
        let pixels: usize = self.input.iter().product();
        assert_eq!(x.len(), batch * pixels, "input size");
        let d = self.features();
        let mut feats = vec![0.0; batch * d];
        let n = self.stages.len();
        let last = n - 1;
        let mut norms = match mode {
            Mode::Eval => self.running_norms(plan, params),
            Mode::Train => self.stages.iter().map(|_| None).collect(),
        };
        match keep {
            Some(traces) => {
                traces.resize_with(batch, Trace::default);
                let starts: Vec<usize> = match mode {
                    Mode::Train => self.norms().collect(),
                    Mode::Eval => Vec::new(),
                };
                let mut from = 0;
                for end in starts.iter().copied().chain([n]) {
                    if from > 0 {
                        let [c, h, w] = plan.shapes[from];
                        let sums = in_image_order(traces.iter().map(|tr| &tr.sums[..]), c);
                        let p = &params[plan.at[from]..][..4 * c];
                        norms[from] = Some(Norm::of_batch(p, c, batch * h * w, &sums));
                    }
                    let norms = &norms;
                    traces
                        .par_iter_mut()
                        .zip(x.par_chunks(pixels))
                        .for_each(|(tr, x)| {
                            SCRATCH.with_borrow_mut(|s| {
                                self.forward_image(plan, params, norms, from..end, x, tr, s);
                            });
                        });
                    from = end;
                }
                feats
                    .par_chunks_mut(d)
                    .zip(traces.par_iter())
                    .for_each(|(f, tr)| f.copy_from_slice(&tr.outs[last]));
            }
            None => {
                assert!(
                    mode == Mode::Eval || self.norms().next().is_none(),
                    "batch statistics need the batch's traces"
                );
                let norms = &norms;
                feats
                    .par_chunks_mut(d)
                    .zip(x.par_chunks(pixels))
                    .for_each_init(Trace::default, |tr, (f, x)| {
                        SCRATCH.with_borrow_mut(|s| {
                            self.forward_image(plan, params, norms, 0..n, x, tr, s);
                        });
                        f.copy_from_slice(&tr.outs[last]);
                    });
            }
        }
        (feats, norms)
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

    /// Backward through the stages of every image, from `dz`, the loss gradient of the
    /// features (`batch` rows); returns the stages' parameter gradients of each chunk of
    /// [`CHUNK`] images (images in order within a chunk) and each BatchNorm's batch sums
    /// (Σ δy, Σ δy·x̂) by stage. The BatchNorms bound the ranges the images run
    /// through one at a time: each image leaves its sums at the BatchNorm that starts
    /// its range, the batch's are added in image order, and the next range begins by
    /// passing each image's gradient through it ([`Norm::backward`]).
    #[allow(clippy::too_many_arguments)]
    fn stages_backward(
        &self,
        plan: &Plan,
        params: &[f32],
        w_t: &[Vec<f32>],
        norms: &[Option<Norm>],
        x: &[f32],
        dz: &[f32],
        traces: &mut [Trace],
    ) -> (Vec<Vec<f32>>, Vec<NormSums>) {
        let pixels: usize = self.input.iter().product();
        let width = dz.len() / traces.len();
        let mut parts = vec![vec![0.0; plan.stage_total]; traces.len().div_ceil(CHUNK)];
        let mut norm_sums = Vec::new();
        let mut end = self.stages.len();
        let bounds: Vec<usize> = self.norms().rev().collect();
        let batch = traces.len();
        let norm = |b: usize| norms[b].as_ref().expect("a BatchNorm's statistics");
        for start in bounds.iter().map(|b| b + 1).chain([0]) {
            // The BatchNorm that ends this range (its sums already taken) and the one
            // that starts it: each image passes the first and leaves its sums at the
            // second while its gradient is in cache.
            let above = norm_sums.last().map(|(b, sums): &NormSums| {
                let [_, h, w] = plan.shapes[*b];
                (*b, norm(*b), &sums[..], batch * h * w)
            });
            let below = start.checked_sub(1).map(|b| (b, norm(b)));
            traces
                .par_chunks_mut(CHUNK)
                .zip(&mut parts)
                .zip(dz.par_chunks(CHUNK * width))
                .zip(x.par_chunks(CHUNK * pixels))
                .for_each(|(((trs, g), dfeat), xs)| {
                    // No rayon call runs inside (each GEMM is single-threaded), so no
                    // other task of this thread can want the scratch while it is borrowed.
                    SCRATCH.with_borrow_mut(|s| {
                        s.passing.resize_with(self.stages.len(), Vec::new);
                        for ((tr, df), x) in trs
                            .iter_mut()
                            .zip(dfeat.chunks_exact(width))
                            .zip(xs.chunks_exact(pixels))
                        {
                            match above {
                                None => {
                                    s.grad.clear();
                                    s.grad.extend_from_slice(df);
                                }
                                Some((b, norm, sums, n)) => {
                                    std::mem::swap(&mut s.grad, &mut tr.grad);
                                    let x = Self::norm_input(
                                        plan,
                                        params,
                                        b,
                                        &tr.outs,
                                        &mut s.passing[b - 1],
                                    );
                                    norm.backward(&mut s.grad, x, sums, n);
                                }
                            }
                            self.backward_image(plan, params, w_t, start..end, x, tr, g, s);
                            if let Some((b, norm)) = below {
                                let x = Self::norm_input(
                                    plan,
                                    params,
                                    b,
                                    &tr.outs,
                                    &mut s.passing[b - 1],
                                );
                                norm.sums(&s.grad, x, &mut tr.sums);
                                std::mem::swap(&mut s.grad, &mut tr.grad);
                            }
                        }
                    });
                });
            let Some((b, _)) = below else { break };
            let sums = in_image_order(traces.iter().map(|tr| &tr.sums[..]), plan.shapes[b][0]);
            norm_sums.push((b, sums));
            end = b;
        }
        (parts, norm_sums)
    }

    /// Lays each convolution weight's gradient in `grad` (the convolution part of the
    /// flat gradient) out as the parameters are, from the `[cin·k·k, cout]` layout the
    /// backward pass accumulates it in.
    fn untranspose_weights(&self, plan: &Plan, grad: &mut [f32]) {
        for (i, stage) in self.stages.iter().enumerate() {
            if let Stage::Conv { cout, k, .. } = *stage {
                let ckk = plan.shapes[i][0] * k * k;
                let w = &mut grad[plan.at[i]..][..cout * ckk];
                let t = transposed(w, ckk, cout);
                w.copy_from_slice(&t);
            }
        }
    }

    /// Logits `[batch, classes]` of the images `x` (`batch` of them, one after another).
    pub(super) fn logits(&self, params: &[f32], x: &[f32], batch: usize) -> Vec<f32> {
        let plan = self.plan();
        assert_eq!(params.len(), plan.total, "parameter count");
        let (feats, _) = self.features_of(&plan, params, x, batch, None, Mode::Eval);
        self.dense_forward(&plan, params, feats, batch)
            .pop()
            .expect("at least the output layer")
    }

    /// Mean cross-entropy of the images `x` against `labels` and its flat gradient, with
    /// BatchNorm in `mode`. A running statistic has no gradient: its entry holds 0 in
    /// eval mode, and in training mode the statistic's new value
    /// ([`crate::model::LossGradient::train_loss_and_gradient`]).
    pub(super) fn loss_and_gradient(
        &self,
        params: &[f32],
        x: &[f32],
        labels: &[u32],
        mode: Mode,
    ) -> (f32, Vec<f32>) {
        let plan = self.plan();
        assert_eq!(params.len(), plan.total, "parameter count");
        let batch = labels.len();
        assert!(batch > 0, "an empty batch has no mean loss");
        // Taken, not borrowed: a nested call on this thread (a rayon task stolen while
        // this one waits) finds an empty list and allocates its own.
        let mut traces = TRACES.take();
        let (feats, norms) = self.features_of(&plan, params, x, batch, Some(&mut traces), mode);
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
                    transposed(&params[plan.at[i]..][..cout * ckk], cout, ckk)
                }
                _ => Vec::new(),
            })
            .collect();
        let (parts, norm_sums) =
            self.stages_backward(&plan, params, &w_t, &norms, x, &dz, &mut traces);
        // The chunks' sums added in chunk order, entry by entry (the entries in blocks
        // side by side), each weight still in the backward pass's layout; then laid out
        // as the parameters, once.
        grad[..plan.stage_total]
            .par_chunks_mut(SUM_BLOCK)
            .enumerate()
            .for_each(|(b, dst)| {
                for part in &parts {
                    add_assign(dst, &part[b * SUM_BLOCK..][..dst.len()]);
                }
            });
        self.untranspose_weights(&plan, &mut grad[..plan.stage_total]);
        // BatchNorm's scale and shift take the batch's sums (the chunks left them 0), its
        // running statistics their new values in training mode.
        for (i, sums) in norm_sums {
            let [c, h, w] = plan.shapes[i];
            let at = plan.at[i];
            let (gamma, rest) = grad[at..at + 4 * c].split_at_mut(c);
            let (beta, running) = rest.split_at_mut(c);
            for ((g, b), s) in gamma.iter_mut().zip(beta.iter_mut()).zip(&sums) {
                *g = s[1] as f32;
                *b = s[0] as f32;
            }
            let norm = norms[i].as_ref().expect("a BatchNorm's statistics");
            if let Some((mean, var)) = norm.moved_running(&params[at..][..4 * c], batch * h * w) {
                running[..c].copy_from_slice(&mean);
                running[c..].copy_from_slice(&var);
            }
        }
        TRACES.set(traces);
        ((loss / batch as f64) as f32, grad)
    }
}

//! The char-LSTM's loss and gradient on plain `f32` slices, with a hand-derived
//! backward pass through time instead of burn's autodiff.
//!
//! Autodiff records every small op of every time step (a gate slice, a sigmoid, a
//! product) as a graph node with its own allocation; at batch 10 those dominate the
//! step. Here each layer is a handful of large matrix products plus one fused
//! elementwise pass per time step.
//!
//! Forward, per layer, with `x_t` the input and `h_{t−1}`, `c_{t−1}` the state
//! (zero at t = 0) and gate pre-activations `a = x_t W_ih + h_{t−1} W_hh + b`
//! split as `[a_i, a_f, a_g, a_o]`:
//!
//! ```text
//! i = σ(a_i)   f = σ(a_f)   g = tanh(a_g)   o = σ(a_o)
//! c_t = f ⊙ c_{t−1} + i ⊙ g        h_t = o ⊙ tanh(c_t)
//! ```
//!
//! Backward, with `δh_t` the loss gradient reaching `h_t` from above plus from step
//! t + 1 (`δa_{t+1} W_hhᵀ`), and `δc_t` carried from step t + 1, using
//! σ' = σ(1 − σ) and tanh' = 1 − tanh²:
//!
//! ```text
//! δc_t  += δh_t ⊙ o ⊙ (1 − tanh²(c_t))
//! δa_i = δc_t ⊙ g ⊙ i(1 − i)          δa_f = δc_t ⊙ c_{t−1} ⊙ f(1 − f)
//! δa_g = δc_t ⊙ i ⊙ (1 − g²)          δa_o = δh_t ⊙ tanh(c_t) ⊙ o(1 − o)
//! δc_{t−1} = δc_t ⊙ f                 δh_{t−1} ⊇ δa_t W_hhᵀ
//! ```
//!
//! and, summed over steps as one product each, `∂W_ih = Xᵀ δA`, `∂W_hh = H_{prev}ᵀ δA`,
//! `∂b = Σ_t δa_t`, `δX = δA W_ihᵀ` (the gradient handed to the layer below).
//!
//! Rows are time-major (`t·B + b`) so that each step's batch is one contiguous block.
//!
//! Determinism: every product is split into pieces fixed by its shape alone, each
//! piece one single-threaded `gemm` call; rayon only decides which thread runs
//! which piece, so the bits do not depend on the thread count. Sums over rows
//! (biases, embedding rows) run in a fixed order.

use gemm::{Parallelism, gemm};
use rayon::prelude::*;

use super::CharLstm;
use crate::model::ParamLayout;

/// A strided read-only matrix: element (r, c) is `data[r·rs + c·cs]`.
#[derive(Clone, Copy)]
struct View<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl<'a> View<'a> {
    /// A row-major `rows × cols` matrix.
    fn new(data: &'a [f32], rows: usize, cols: usize) -> Self {
        assert_eq!(data.len(), rows * cols, "matrix size");
        Self {
            data,
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }

    /// The transpose, by swapping strides (no copy).
    fn t(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }
}

/// A raw pointer that rayon tasks may share; each task writes a disjoint block.
#[derive(Clone, Copy)]
struct SharedMut(*mut f32);
// SAFETY: the pointer is only used by `matmul`, whose tasks write disjoint blocks
// of one exclusively borrowed slice while the borrow is alive.
unsafe impl Send for SharedMut {}
unsafe impl Sync for SharedMut {}

impl SharedMut {
    /// The pointer, through a method so that closures capture the whole (`Sync`)
    /// wrapper rather than its raw-pointer field.
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Products below this many multiply-adds run as one call: a rayon split costs more.
const SPLIT_WORK: usize = 1 << 18;
/// Rows or columns of the output per task when a product is split.
const BLOCK: usize = 128;

/// `out = a·b`, or `out += a·b` with `accumulate`; `out` is row-major `a.rows × b.cols`.
///
/// The larger output dimension is cut into blocks of [`BLOCK`] (a choice that
/// depends on the shape only), and each block is one single-threaded `gemm` call,
/// so each output entry's sum over k runs in the same order whatever the number of
/// threads.
fn matmul(out: &mut [f32], a: View<'_>, b: View<'_>, accumulate: bool) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(b.rows, k, "inner dimensions");
    assert_eq!(out.len(), m * n, "output size");
    for v in [a, b] {
        assert!(
            v.rows == 0 || v.cols == 0 || (v.rows - 1) * v.rs + (v.cols - 1) * v.cs < v.data.len(),
            "view inside its slice"
        );
    }
    if m == 0 || n == 0 {
        return;
    }
    let by_rows = m >= n;
    let pieces = if m * n * k < SPLIT_WORK {
        1
    } else {
        (if by_rows { m } else { n }).div_ceil(BLOCK)
    };
    let dst = SharedMut(out.as_mut_ptr());
    let run = |piece: usize| {
        let span = if by_rows { m } else { n };
        let lo = piece * span / pieces;
        let hi = (piece + 1) * span / pieces;
        let (rows, cols) = if by_rows { (hi - lo, n) } else { (m, hi - lo) };
        let (a_off, b_off, d_off) = if by_rows {
            (lo * a.rs, 0, lo * n)
        } else {
            (0, lo * b.cs, lo)
        };
        // SAFETY: the asserts above keep every read inside `a.data` and `b.data` and
        // every write inside `out`; pieces cover disjoint row or column ranges of
        // `out`, which this function borrows exclusively.
        unsafe {
            gemm(
                rows,
                cols,
                k,
                dst.get().add(d_off),
                1,
                n as isize,
                accumulate,
                a.data.as_ptr().add(a_off),
                a.cs as isize,
                a.rs as isize,
                b.data.as_ptr().add(b_off),
                b.cs as isize,
                b.rs as isize,
                1.0,
                1.0,
                false,
                false,
                false,
                Parallelism::None,
            );
        }
    };
    if pieces == 1 {
        run(0);
    } else {
        (0..pieces).into_par_iter().for_each(run);
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// What the forward pass of one layer keeps for the backward pass, all time-major.
struct Trace {
    /// Activated gates `[i, f, g, o]`, `T·B × 4H`.
    gates: Vec<f32>,
    /// Cell states, `T·B × H`.
    c: Vec<f32>,
    /// tanh of the cell states, `T·B × H`.
    tc: Vec<f32>,
    /// Hidden states (the layer's output), `T·B × H`.
    h: Vec<f32>,
}

/// One layer's parameters.
struct Weights<'a> {
    w_ih: &'a [f32],
    w_hh: &'a [f32],
    bias: &'a [f32],
}

/// Sizes shared by both layers.
#[derive(Clone, Copy)]
struct Dims {
    t: usize,
    b: usize,
    h: usize,
}

fn forward_layer(x: &[f32], inputs: usize, w: &Weights<'_>, d: Dims) -> Trace {
    let Dims { t, b, h } = d;
    let h4 = 4 * h;
    let step = b * h;
    let mut gates = vec![0.0; t * b * h4];
    for row in gates.chunks_exact_mut(h4) {
        row.copy_from_slice(w.bias);
    }
    // The input projection of all steps at once; only the recurrence is sequential.
    matmul(
        &mut gates,
        View::new(x, t * b, inputs),
        View::new(w.w_ih, inputs, h4),
        true,
    );
    let mut c = vec![0.0; t * step];
    let mut tc = vec![0.0; t * step];
    let mut hs = vec![0.0; t * step];
    for s in 0..t {
        let g_s = &mut gates[s * b * h4..(s + 1) * b * h4];
        if s > 0 {
            matmul(
                g_s,
                View::new(&hs[(s - 1) * step..s * step], b, h),
                View::new(w.w_hh, h, h4),
                true,
            );
        }
        let (c_done, c_rest) = c.split_at_mut(s * step);
        let c_prev = if s > 0 {
            &c_done[(s - 1) * step..]
        } else {
            &[][..]
        };
        g_s.par_chunks_mut(h4)
            .zip(c_rest[..step].par_chunks_mut(h))
            .zip(tc[s * step..(s + 1) * step].par_chunks_mut(h))
            .zip(hs[s * step..(s + 1) * step].par_chunks_mut(h))
            .enumerate()
            .for_each(|(r, (((g, c), tc), hh))| {
                for j in 0..h {
                    let i = sigmoid(g[j]);
                    let f = sigmoid(g[h + j]);
                    let gg = g[2 * h + j].tanh();
                    let o = sigmoid(g[3 * h + j]);
                    g[j] = i;
                    g[h + j] = f;
                    g[2 * h + j] = gg;
                    g[3 * h + j] = o;
                    let cp = if c_prev.is_empty() {
                        0.0
                    } else {
                        c_prev[r * h + j]
                    };
                    c[j] = f * cp + i * gg;
                    tc[j] = c[j].tanh();
                    hh[j] = o * tc[j];
                }
            });
    }
    Trace {
        gates,
        c,
        tc,
        h: hs,
    }
}

/// Where one layer's parameter gradients go.
struct Grads<'a> {
    w_ih: &'a mut [f32],
    w_hh: &'a mut [f32],
    bias: &'a mut [f32],
}

/// Backward through time of one layer. `dh_out` is the loss gradient reaching the
/// layer's outputs at steps `from..T` (time-major); returns `δX`, the gradient of
/// the layer's inputs.
#[allow(clippy::too_many_arguments)]
fn backward_layer(
    x: &[f32],
    inputs: usize,
    w: &Weights<'_>,
    tr: &Trace,
    d: Dims,
    dh_out: &[f32],
    from: usize,
    g: Grads<'_>,
) -> Vec<f32> {
    let Dims { t, b, h } = d;
    let h4 = 4 * h;
    let step = b * h;
    assert_eq!(dh_out.len(), (t - from) * step, "output gradient size");
    let mut da = vec![0.0; t * b * h4];
    // δh_t from step t + 1 (δa_{t+1} W_hhᵀ) and δc_t from step t + 1 (δc_{t+1} ⊙ f_{t+1}).
    let mut dh_next = vec![0.0; step];
    let mut dc = vec![0.0; step];
    for s in (0..t).rev() {
        let gates = &tr.gates[s * b * h4..(s + 1) * b * h4];
        let tc = &tr.tc[s * step..(s + 1) * step];
        let c_prev = if s > 0 {
            &tr.c[(s - 1) * step..s * step]
        } else {
            &[][..]
        };
        let out = (s >= from).then(|| &dh_out[(s - from) * step..(s - from + 1) * step]);
        let da_s = &mut da[s * b * h4..(s + 1) * b * h4];
        da_s.par_chunks_mut(h4)
            .zip(dc.par_chunks_mut(h))
            .zip(dh_next.par_chunks(h))
            .enumerate()
            .for_each(|(r, ((da, dc), dh_next))| {
                let gr = &gates[r * h4..(r + 1) * h4];
                for j in 0..h {
                    let (i, f, gg, o) = (gr[j], gr[h + j], gr[2 * h + j], gr[3 * h + j]);
                    let tcj = tc[r * h + j];
                    let dh = dh_next[j] + out.map_or(0.0, |o| o[r * h + j]);
                    let dct = dc[j] + dh * o * (1.0 - tcj * tcj);
                    let cp = if c_prev.is_empty() {
                        0.0
                    } else {
                        c_prev[r * h + j]
                    };
                    da[j] = dct * gg * i * (1.0 - i);
                    da[h + j] = dct * cp * f * (1.0 - f);
                    da[2 * h + j] = dct * i * (1.0 - gg * gg);
                    da[3 * h + j] = dh * tcj * o * (1.0 - o);
                    dc[j] = dct * f;
                }
            });
        if s > 0 {
            matmul(
                &mut dh_next,
                View::new(da_s, b, h4),
                View::new(w.w_hh, h, h4).t(),
                false,
            );
        }
    }
    // ∂W_hh = Σ_{t≥1} h_{t−1}ᵀ δa_t: h_{−1} = 0, so step 0 adds nothing (and a
    // one-step sequence leaves ∂W_hh zero).
    if t > 1 {
        matmul(
            g.w_hh,
            View::new(&tr.h[..(t - 1) * step], (t - 1) * b, h).t(),
            View::new(&da[b * h4..], (t - 1) * b, h4),
            false,
        );
    }
    matmul(
        g.w_ih,
        View::new(x, t * b, inputs).t(),
        View::new(&da, t * b, h4),
        false,
    );
    for row in da.chunks_exact(h4) {
        for (acc, v) in g.bias.iter_mut().zip(row) {
            *acc += v;
        }
    }
    let mut dx = vec![0.0; t * b * inputs];
    matmul(
        &mut dx,
        View::new(&da, t * b, h4),
        View::new(w.w_ih, inputs, h4).t(),
        false,
    );
    dx
}

/// Mean cross-entropy of the batch and its gradient, laid out as `net.params()`.
///
/// `tokens` holds `batch` sequences of `seq` token ids one after another; the model
/// reads each whole sequence and predicts `labels[b]` from the last hidden state.
pub(super) fn loss_and_gradient(
    net: &CharLstm,
    params: &[f32],
    tokens: &[u8],
    labels: &[u32],
    seq: usize,
) -> (f32, Vec<f32>) {
    let layout = ParamLayout::of(net);
    assert_eq!(params.len(), layout.total, "parameter count");
    let batch = labels.len();
    assert!(batch > 0 && seq > 0, "an empty batch has no mean loss");
    assert_eq!(tokens.len(), batch * seq, "token count");
    let (v, e, h) = (net.vocab, net.embed, net.hidden);
    let d = Dims {
        t: seq,
        b: batch,
        h,
    };
    let p = |i: usize| &params[layout.range(i)];
    let w1 = Weights {
        w_ih: p(1),
        w_hh: p(2),
        bias: p(3),
    };
    let w2 = Weights {
        w_ih: p(4),
        w_hh: p(5),
        bias: p(6),
    };
    let (w_out, b_out) = (p(7), p(8));

    let mut x = vec![0.0; seq * batch * e];
    for s in 0..seq {
        for r in 0..batch {
            let tok = tokens[r * seq + s] as usize;
            assert!(tok < v, "token id {tok} outside the vocabulary of {v}");
            x[(s * batch + r) * e..][..e].copy_from_slice(&p(0)[tok * e..(tok + 1) * e]);
        }
    }
    let l1 = forward_layer(&x, e, &w1, d);
    let l2 = forward_layer(&l1.h, h, &w2, d);
    let last = &l2.h[(seq - 1) * batch * h..];

    // Softmax cross-entropy: loss = mean_b (logsumexp(z_b) − z_b[y_b]) and
    // ∂loss/∂z_b = (softmax(z_b) − onehot(y_b)) / B.
    let mut dz = vec![0.0; batch * v];
    for row in dz.chunks_exact_mut(v) {
        row.copy_from_slice(b_out);
    }
    matmul(
        &mut dz,
        View::new(last, batch, h),
        View::new(w_out, h, v),
        true,
    );
    let mut loss = 0.0f64;
    for (row, &y) in dz.chunks_exact_mut(v).zip(labels) {
        let y = y as usize;
        assert!(y < v, "label {y} outside the {v} classes");
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = row.iter().map(|z| (z - max).exp()).sum();
        loss += f64::from(max + sum.ln() - row[y]);
        for z in row.iter_mut() {
            *z = (*z - max).exp() / sum / batch as f32;
        }
        row[y] -= 1.0 / batch as f32;
    }

    let mut grad = vec![0.0; layout.total];
    let mut parts: Vec<&mut [f32]> = Vec::with_capacity(layout.specs.len());
    let mut rest = &mut grad[..];
    for s in &layout.specs {
        let (head, tail) = rest.split_at_mut(s.numel());
        parts.push(head);
        rest = tail;
    }
    let [g_embed, g1_ih, g1_hh, g1_b, g2_ih, g2_hh, g2_b, g_w, g_b] = &mut parts[..] else {
        unreachable!("the char-LSTM has nine parameters")
    };
    matmul(
        g_w,
        View::new(last, batch, h).t(),
        View::new(&dz, batch, v),
        false,
    );
    for row in dz.chunks_exact(v) {
        for (acc, z) in g_b.iter_mut().zip(row) {
            *acc += z;
        }
    }
    let mut dlast = vec![0.0; batch * h];
    matmul(
        &mut dlast,
        View::new(&dz, batch, v),
        View::new(w_out, h, v).t(),
        false,
    );
    let dx2 = backward_layer(
        &l1.h,
        h,
        &w2,
        &l2,
        d,
        &dlast,
        seq - 1,
        Grads {
            w_ih: g2_ih,
            w_hh: g2_hh,
            bias: g2_b,
        },
    );
    let dx1 = backward_layer(
        &x,
        e,
        &w1,
        &l1,
        d,
        &dx2,
        0,
        Grads {
            w_ih: g1_ih,
            w_hh: g1_hh,
            bias: g1_b,
        },
    );
    for s in 0..seq {
        for r in 0..batch {
            let tok = tokens[r * seq + s] as usize;
            for (acc, v) in g_embed[tok * e..(tok + 1) * e]
                .iter_mut()
                .zip(&dx1[(s * batch + r) * e..][..e])
            {
                *acc += v;
            }
        }
    }
    ((loss / batch as f64) as f32, grad)
}

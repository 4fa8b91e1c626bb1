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
//! Parallelism: rows of a batch meet only in the weight gradients. Through the
//! recurrence a row's gates read its own `x_t`, `h_{t−1}` and `c_{t−1}` alone, so the
//! batch is cut into even groups of at most [`GROUP_ROWS`] rows ([`group_rows`]),
//! fixed by the batch size, and each
//! group runs a layer's whole forward recurrence, and later its whole backward one, as
//! one single-threaded rayon task with its scratch allocated once. Splitting each
//! step's units among tasks instead needs a barrier per step, layer and pass (320 per
//! training step at sequence 80) around about 5 MFLOP of work each (DESIGN.md, "Speed:
//! the char-LSTM").
//!
//! Rows are time-major (`t·B + b`), so a group's rows at one step are one contiguous
//! block of every array: a group owns its blocks through plain slice splits, and the
//! products over all rows (`∂W_ih`, `∂W_hh`, `δX`, the output layer) read the same
//! matrices in the same order whatever the grouping.
//!
//! Determinism: the kernel computes a row's entries in the same order whichever rows
//! share its tile ([`kernel`]), the cell is elementwise, and every product over all
//! rows is split into pieces fixed by its shape alone, each piece one single-threaded
//! `gemm` call; rayon only decides which thread runs which group or piece, so the
//! bits do not depend on the thread count, nor on the grouping. Sums over rows
//! (biases, embedding rows) run in a fixed order.

use rayon::prelude::*;

use super::CharLstm;
use super::kernel::{self, Panels, W};
use crate::model::ParamLayout;
use crate::model::fastmath::{sigmoid, tanh};
use crate::model::matmul::{View, matmul};

/// Rows per group at most (module doc): one kernel tile, so a batch of 10, the
/// Shakespeare step's, still makes two tasks.
const GROUP_ROWS: usize = kernel::TILE_ROWS;

/// Rows per group for a batch of `b` rows: as few groups as [`GROUP_ROWS`] allows, of
/// equal size but the last. A batch of 10 makes groups of 5 and 5, not 6 and 4: each
/// group streams the packed weights through the recurrence alike, so the uneven split
/// left one thread idle for a third of it. Entries do not depend on the grouping
/// (module doc), so neither do the bits.
fn group_rows(b: usize) -> usize {
    b.div_ceil(b.div_ceil(GROUP_ROWS))
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

/// One row group's blocks of a [`Trace`], one per step.
struct GroupTrace<'a> {
    gates: Vec<&'a mut [f32]>,
    c: Vec<&'a mut [f32]>,
    tc: Vec<&'a mut [f32]>,
    h: Vec<&'a mut [f32]>,
}

impl Trace {
    fn zeros(d: Dims) -> Self {
        let n = d.t * d.b * d.h;
        Self {
            gates: vec![0.0; 4 * n],
            c: vec![0.0; n],
            tc: vec![0.0; n],
            h: vec![0.0; n],
        }
    }

    /// The trace cut into row groups, in group order.
    fn groups(&mut self, d: Dims) -> Vec<GroupTrace<'_>> {
        let mut gates = by_group(&mut self.gates, d.b, 4 * d.h).into_iter();
        let mut c = by_group(&mut self.c, d.b, d.h).into_iter();
        let mut tc = by_group(&mut self.tc, d.b, d.h).into_iter();
        let mut h = by_group(&mut self.h, d.b, d.h).into_iter();
        std::iter::from_fn(|| {
            Some(GroupTrace {
                gates: gates.next()?,
                c: c.next()?,
                tc: tc.next()?,
                h: h.next()?,
            })
        })
        .collect()
    }
}

/// Cuts a time-major array of `B` rows of `n` entries per step into its row groups:
/// entry `[g][s]` is the block of group `g`'s rows at step `s`.
fn by_group(data: &mut [f32], b: usize, n: usize) -> Vec<Vec<&mut [f32]>> {
    assert!(b > 0 && n > 0, "rows and columns");
    let steps = data.len() / (b * n);
    let g = group_rows(b);
    let mut groups: Vec<Vec<&mut [f32]>> = (0..b.div_ceil(g))
        .map(|_| Vec::with_capacity(steps))
        .collect();
    for step in data.chunks_exact_mut(b * n) {
        for (group, rows) in groups.iter_mut().zip(step.chunks_mut(g * n)) {
            group.push(rows);
        }
    }
    groups
}

/// Rows `lo..lo + rows` of step `s` of a time-major array of `B` rows of `n` entries.
fn rows_at(data: &[f32], d: Dims, s: usize, lo: usize, rows: usize, n: usize) -> &[f32] {
    &data[(s * d.b + lo) * n..][..rows * n]
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

/// One layer's weights packed for the step products: panel `4u + g` holds gate `g`'s
/// columns for units `u·W .. u·W + W` of `[W_ih; W_hh]` (inner dimension
/// `inputs + H`), so one task computes all four gates of its units.
struct Packed<'a> {
    panels: Panels,
    inputs: usize,
    h: usize,
    bias: &'a [f32],
}

impl<'a> Packed<'a> {
    fn new(w: &Weights<'a>, inputs: usize, h: usize) -> Self {
        let h4 = 4 * h;
        let panels = Panels::pack_rows(4 * h.div_ceil(W), inputs + h, |p, k| {
            let unit = p / 4 * W;
            let col = p % 4 * h + unit;
            let len = W.min(h - unit);
            if k < inputs {
                &w.w_ih[k * h4 + col..][..len]
            } else {
                &w.w_hh[(k - inputs) * h4 + col..][..len]
            }
        });
        Self {
            panels,
            inputs,
            h,
            bias: w.bias,
        }
    }
}

/// `W_hhᵀ` in panels of [`W`] units (inner dimension 4H), for `δh_{t−1} = δa_t W_hhᵀ`.
fn pack_transposed(w_hh: &[f32], h: usize) -> Panels {
    Panels::pack_columns(h.div_ceil(W), 4 * h, |u, j| {
        let unit = u * W + j;
        if unit < h {
            &w_hh[unit * 4 * h..(unit + 1) * 4 * h]
        } else {
            &[]
        }
    })
}

/// Working memory for one block of [`W`] units over `rows` rows, reused by a task
/// across blocks and steps; gates are gate-major (`a[(g·rows + r)·W + j]`) so that
/// each gate's tile is one kernel output.
struct Block {
    rows: usize,
    a: Vec<f32>,
    c_prev: Vec<f32>,
    c: Vec<f32>,
    tc: Vec<f32>,
    h: Vec<f32>,
}

impl Block {
    fn new(rows: usize) -> Self {
        Self {
            rows,
            a: vec![0.0; 4 * rows * W],
            c_prev: vec![0.0; rows * W],
            c: vec![0.0; rows * W],
            tc: vec![0.0; rows * W],
            h: vec![0.0; rows * W],
        }
    }

    /// One time step for units `u·W ..` (module doc): `a = b + x_t W_ih + h_{t−1} W_hh`
    /// through the kernel, then the cell. `x` is `rows × inputs`; `prev` holds
    /// `h_{t−1}` and `c_{t−1}` (`rows × H` each), `None` at t = 0. Leaves the activated
    /// gates in `a` and `c_t`, `tanh c_t`, `h_t` in `c`, `tc`, `h` (zero-padded past H).
    fn forward(&mut self, p: &Packed<'_>, u: usize, x: &[f32], prev: Option<(&[f32], &[f32])>) {
        let (rows, h, inputs) = (self.rows, p.h, p.inputs);
        let width = W.min(h - u * W);
        for (g, tile) in self.a.chunks_exact_mut(rows * W).enumerate() {
            let bias = &p.bias[g * h + u * W..][..width];
            for row in tile.chunks_exact_mut(W) {
                row[..width].copy_from_slice(bias);
                row[width..].fill(0.0);
            }
        }
        // The four gates' panels (4u .. 4u + 3) against the same rows.
        let gates = |lo, hi| std::array::from_fn(|g| p.panels.panel(4 * u + g, lo, hi));
        kernel::accumulate4(&mut self.a, x, inputs, rows, gates(0, inputs));
        if let Some((h_prev, _)) = prev {
            kernel::accumulate4(&mut self.a, h_prev, h, rows, gates(inputs, inputs + h));
        }
        match prev {
            Some((_, c_prev)) => gather(&mut self.c_prev, c_prev, h, u * W, width),
            None => self.c_prev.fill(0.0),
        }
        cell_forward(
            &mut self.a,
            &self.c_prev,
            &mut self.c,
            &mut self.tc,
            &mut self.h,
        );
    }
}

/// Copies columns `col..col + width` of the `H`-wide rows of `src` into the
/// `W`-wide rows of `dst`, zero past `width`.
fn gather(dst: &mut [f32], src: &[f32], stride: usize, col: usize, width: usize) {
    for (d, s) in dst.chunks_exact_mut(W).zip(src.chunks(stride)) {
        d[..width].copy_from_slice(&s[col..col + width]);
        d[width..].fill(0.0);
    }
}

/// Writes the `W`-wide rows of `src` (first `width` columns) to columns
/// `col..col + width` of the `stride`-wide rows of `dst`.
fn put(dst: &mut [f32], stride: usize, col: usize, width: usize, src: &[f32]) {
    for (d, s) in dst.chunks_exact_mut(stride).zip(src.chunks_exact(W)) {
        d[col..col + width].copy_from_slice(&s[..width]);
    }
}

/// The forward cell on one block (module doc): `a` (gate-major pre-activations)
/// becomes the activated gates; `c`, `tc`, `h` get `c_t`, `tanh c_t` and `h_t`.
/// Dispatched to an AVX2 build of the same code where the CPU has it; the bits are
/// the same either way (plain IEEE operations, no fused multiply-add).
fn cell_forward(a: &mut [f32], c_prev: &[f32], c: &mut [f32], tc: &mut [f32], h: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if kernel::avx2() {
        // SAFETY: the CPU has AVX2 and FMA.
        unsafe { cell_forward_avx2(a, c_prev, c, tc, h) };
        return;
    }
    cell_forward_body(a, c_prev, c, tc, h);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn cell_forward_avx2(a: &mut [f32], c_prev: &[f32], c: &mut [f32], tc: &mut [f32], h: &mut [f32]) {
    cell_forward_body(a, c_prev, c, tc, h);
}

#[inline(always)]
fn cell_forward_body(a: &mut [f32], c_prev: &[f32], c: &mut [f32], tc: &mut [f32], h: &mut [f32]) {
    let n = c.len();
    let (ai, rest) = a.split_at_mut(n);
    let (af, rest) = rest.split_at_mut(n);
    let (ag, ao) = rest.split_at_mut(n);
    let (ao, c_prev, tc, h) = (&mut ao[..n], &c_prev[..n], &mut tc[..n], &mut h[..n]);
    for j in 0..n {
        let i = sigmoid(ai[j]);
        let f = sigmoid(af[j]);
        let g = tanh(ag[j]);
        let o = sigmoid(ao[j]);
        let cj = f * c_prev[j] + i * g;
        let t = tanh(cj);
        (ai[j], af[j], ag[j], ao[j]) = (i, f, g, o);
        (c[j], tc[j], h[j]) = (cj, t, o * t);
    }
}

/// The backward cell on one block (module doc): from the activated gates `gates`
/// (gate-major), `tanh c_t`, `c_{t−1}`, `δh_t` and the carried `δc`, the
/// pre-activation gradients `da` (gate-major) and `δc_{t−1}` (in `dc`).
fn cell_backward(
    gates: &[f32],
    tc: &[f32],
    c_prev: &[f32],
    dh: &[f32],
    dc: &mut [f32],
    da: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if kernel::avx2() {
        // SAFETY: the CPU has AVX2 and FMA.
        unsafe { cell_backward_avx2(gates, tc, c_prev, dh, dc, da) };
        return;
    }
    cell_backward_body(gates, tc, c_prev, dh, dc, da);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn cell_backward_avx2(
    gates: &[f32],
    tc: &[f32],
    c_prev: &[f32],
    dh: &[f32],
    dc: &mut [f32],
    da: &mut [f32],
) {
    cell_backward_body(gates, tc, c_prev, dh, dc, da);
}

#[inline(always)]
fn cell_backward_body(
    gates: &[f32],
    tc: &[f32],
    c_prev: &[f32],
    dh: &[f32],
    dc: &mut [f32],
    da: &mut [f32],
) {
    let n = dc.len();
    let (gi, gf, gg, go) = (
        &gates[..n],
        &gates[n..2 * n],
        &gates[2 * n..3 * n],
        &gates[3 * n..4 * n],
    );
    let (di, rest) = da.split_at_mut(n);
    let (df, rest) = rest.split_at_mut(n);
    let (dg, dout) = rest.split_at_mut(n);
    let (dout, tc, c_prev, dh) = (&mut dout[..n], &tc[..n], &c_prev[..n], &dh[..n]);
    for j in 0..n {
        let (i, f, g, o) = (gi[j], gf[j], gg[j], go[j]);
        let dct = dc[j] + dh[j] * o * (1.0 - tc[j] * tc[j]);
        di[j] = dct * g * i * (1.0 - i);
        df[j] = dct * c_prev[j] * f * (1.0 - f);
        dg[j] = dct * i * (1.0 - g * g);
        dout[j] = dh[j] * tc[j] * o * (1.0 - o);
        dc[j] = dct * f;
    }
}

/// The forward pass of one layer over the whole sequence, keeping the [`Trace`]: one
/// rayon task per row group (module doc).
fn forward_layer(x: &[f32], inputs: usize, w: &Weights<'_>, d: Dims) -> Trace {
    let packed = Packed::new(w, inputs, d.h);
    let mut tr = Trace::zeros(d);
    tr.groups(d)
        .into_par_iter()
        .enumerate()
        .for_each(|(group, out)| forward_group(&packed, x, d, group * group_rows(d.b), out));
    tr
}

/// The forward recurrence of the row group starting at row `lo`, step by step, each
/// step a loop over blocks of [`W`] units ([`Block::forward`]).
fn forward_group(p: &Packed<'_>, x: &[f32], d: Dims, lo: usize, mut out: GroupTrace<'_>) {
    let h = d.h;
    let rows = group_rows(d.b).min(d.b - lo);
    let mut blk = Block::new(rows);
    for s in 0..d.t {
        let x_s = rows_at(x, d, s, lo, rows, p.inputs);
        let (c_done, c_now) = out.c.split_at_mut(s);
        let (h_done, h_now) = out.h.split_at_mut(s);
        let prev = s.checked_sub(1).map(|q| (&*h_done[q], &*c_done[q]));
        for u in 0..h.div_ceil(W) {
            blk.forward(p, u, x_s, prev);
            let (col, width) = (u * W, W.min(h - u * W));
            for (k, tile) in blk.a.chunks_exact(rows * W).enumerate() {
                put(out.gates[s], 4 * h, k * h + col, width, tile);
            }
            put(c_now[0], h, col, width, &blk.c);
            put(out.tc[s], h, col, width, &blk.tc);
            put(h_now[0], h, col, width, &blk.h);
        }
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
///
/// The recurrence runs as one rayon task per row group (module doc) and fills `δA`;
/// the products over all steps and rows follow.
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
    let w_hh_t = pack_transposed(w.w_hh, h);
    let mut da = vec![0.0; t * b * h4];
    by_group(&mut da, b, h4)
        .into_par_iter()
        .enumerate()
        .for_each(|(group, da)| {
            backward_group(&w_hh_t, tr, d, dh_out, from, group * group_rows(d.b), da);
        });
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

/// The backward recurrence of the row group starting at row `lo`, steps in reverse,
/// each a loop over blocks of [`W`] units: the block's `δh_t = δh_out + δa_{t+1} W_hhᵀ`
/// (its columns need all of the group's `δa_{t+1}`, finished by the previous step),
/// then its cell backward into the group's blocks `da` of `δA`.
fn backward_group(
    w_hh_t: &Panels,
    tr: &Trace,
    d: Dims,
    dh_out: &[f32],
    from: usize,
    lo: usize,
    mut da: Vec<&mut [f32]>,
) {
    let Dims { t, b, h } = d;
    let h4 = 4 * h;
    let rows = group_rows(b).min(b - lo);
    let mut blk = Block::new(rows);
    let tile = rows * W;
    // δh of four blocks of units at a time (one `rows × W` tile each), so that the
    // kernel runs four panels of `W_hhᵀ` against the same rows of `δa_{t+1}`.
    let mut dh = vec![0.0; 4 * tile];
    let mut da_blk = vec![0.0; 4 * tile];
    // δc_t carried from step t + 1 (δc_{t+1} ⊙ f_{t+1}), one `rows × W` block per
    // block of units.
    let mut dc = vec![0.0; h.div_ceil(W) * rows * W];
    for s in (0..t).rev() {
        let (da_now, da_later) = da.split_at_mut(s + 1);
        let da_s = &mut *da_now[s];
        let da_next = da_later.first().map(|next| &**next);
        let out = (s >= from).then(|| rows_at(dh_out, d, s - from, lo, rows, h));
        let gates = rows_at(&tr.gates, d, s, lo, rows, h4);
        let tc = rows_at(&tr.tc, d, s, lo, rows, h);
        let c_prev = s.checked_sub(1).map(|q| rows_at(&tr.c, d, q, lo, rows, h));
        for (quad, dcs) in dc.chunks_mut(4 * tile).enumerate() {
            let blocks = dcs.len() / tile;
            let dh = &mut dh[..blocks * tile];
            for (i, dh) in dh.chunks_exact_mut(tile).enumerate() {
                let u = 4 * quad + i;
                match out {
                    Some(o) => gather(dh, o, h, u * W, W.min(h - u * W)),
                    None => dh.fill(0.0),
                }
            }
            if let Some(next) = da_next {
                let panel = |i: usize| w_hh_t.panel(4 * quad + i, 0, h4);
                if blocks == 4 {
                    kernel::accumulate4(dh, next, h4, rows, std::array::from_fn(panel));
                } else {
                    for (i, dh) in dh.chunks_exact_mut(tile).enumerate() {
                        kernel::accumulate(dh, next, h4, rows, panel(i));
                    }
                }
            }
            for (i, (dh, dc)) in dh
                .chunks_exact(tile)
                .zip(dcs.chunks_exact_mut(tile))
                .enumerate()
            {
                let u = 4 * quad + i;
                let (col, width) = (u * W, W.min(h - u * W));
                for (k, gate) in blk.a.chunks_exact_mut(tile).enumerate() {
                    gather(gate, gates, h4, k * h + col, width);
                }
                gather(&mut blk.tc, tc, h, col, width);
                match c_prev {
                    Some(cp) => gather(&mut blk.c_prev, cp, h, col, width),
                    None => blk.c_prev.fill(0.0),
                }
                cell_backward(&blk.a, &blk.tc, &blk.c_prev, dh, dc, &mut da_blk);
                for (k, gate) in da_blk.chunks_exact(tile).enumerate() {
                    put(da_s, h4, k * h + col, width, gate);
                }
            }
        }
    }
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

/// Rows per evaluation task: fixed, so the split depends on the batch size alone, and
/// four kernel tiles, more than a training group ([`GROUP_ROWS`]) because evaluation
/// batches (500 rows) leave tasks to spare, and each packed panel then serves 24 rows
/// while it is in cache.
const EVAL_ROWS: usize = 4 * kernel::TILE_ROWS;

/// Logits `[batch, vocab]` of the sequences `tokens` (`seq` ids each, one after
/// another) by the training forward pass's own per-row arithmetic ([`Block::forward`]
/// and the same output product), keeping no trace. Rows are independent, so the batch
/// is cut into chunks of [`EVAL_ROWS`], one rayon task each running both layers step
/// by step: the bits depend neither on the thread count nor on the chunking.
pub(super) fn logits(net: &CharLstm, params: &[f32], tokens: &[usize], seq: usize) -> Vec<f32> {
    let layout = ParamLayout::of(net);
    assert_eq!(params.len(), layout.total, "parameter count");
    assert!(
        seq > 0 && tokens.len().is_multiple_of(seq),
        "whole sequences"
    );
    let batch = tokens.len() / seq;
    let (v, e, h) = (net.vocab, net.embed, net.hidden);
    let p = |i: usize| &params[layout.range(i)];
    let weights = |i: usize| Weights {
        w_ih: p(i),
        w_hh: p(i + 1),
        bias: p(i + 2),
    };
    let (l1, l2) = (
        Packed::new(&weights(1), e, h),
        Packed::new(&weights(4), h, h),
    );
    let mut last = vec![0.0; batch * h];
    last.par_chunks_mut(EVAL_ROWS * h)
        .zip(tokens.par_chunks(EVAL_ROWS * seq))
        .for_each(|(last, toks)| {
            let rows = toks.len() / seq;
            let mut blk = Block::new(rows);
            let mut x = vec![0.0; rows * e];
            let [mut h1, mut c1, mut h2, mut c2, mut h_new] =
                std::array::from_fn(|_| vec![0.0; rows * h]);
            for s in 0..seq {
                for (r, xr) in x.chunks_exact_mut(e).enumerate() {
                    let tok = toks[r * seq + s];
                    assert!(tok < v, "token id {tok} outside the vocabulary of {v}");
                    xr.copy_from_slice(&p(0)[tok * e..(tok + 1) * e]);
                }
                eval_step(&l1, &mut blk, &x, s > 0, &mut h1, &mut c1, &mut h_new);
                eval_step(&l2, &mut blk, &h1, s > 0, &mut h2, &mut c2, &mut h_new);
            }
            last.copy_from_slice(&h2);
        });
    let mut z = vec![0.0; batch * v];
    for row in z.chunks_exact_mut(v) {
        row.copy_from_slice(p(8));
    }
    matmul(
        &mut z,
        View::new(&last, batch, h),
        View::new(p(7), h, v),
        true,
    );
    z
}

/// One step of one layer for all its units, in place: `h` and `c` go from step t − 1
/// (ignored where `!has_prev`) to step t; `h_new` is scratch.
fn eval_step(
    p: &Packed<'_>,
    blk: &mut Block,
    x: &[f32],
    has_prev: bool,
    h: &mut Vec<f32>,
    c: &mut [f32],
    h_new: &mut Vec<f32>,
) {
    let hh = p.h;
    for u in 0..hh.div_ceil(W) {
        // Block u reads only its own columns of c_{t−1}, so c is updated in place;
        // every block reads all of h_{t−1}, so h_t goes to h_new.
        blk.forward(p, u, x, has_prev.then_some((&h[..], &c[..])));
        let (col, width) = (u * W, W.min(hh - u * W));
        for (r, (cr, hr)) in c
            .chunks_exact_mut(hh)
            .zip(h_new.chunks_exact_mut(hh))
            .enumerate()
        {
            cr[col..col + width].copy_from_slice(&blk.c[r * W..r * W + width]);
            hr[col..col + width].copy_from_slice(&blk.h[r * W..r * W + width]);
        }
    }
    std::mem::swap(h, h_new);
}

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

use crate::model::matmul::{View, gemm_into, gemm_into_padded, matmul};
use rayon::prelude::*;

use crate::cpu::Isa;

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
    ($(#[$attr:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$attr])*
        fn $name($($arg: $ty),*) {
            crate::cpu::on_isa!(glue_isa(), fn $name($($arg: $ty),*) $body)
        }
    };
}

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

/// Patch sizes (`cin·k·k`) up to which a convolution's forward pass is direct on
/// AVX-512 ([`conv_direct_avx512`]): the first layers of the seed CNNs (25 and 27).
const DIRECT_PATCH: usize = 32;

/// A convolution's forward pass without the patch matrix, for small patches: `out[co]`
/// = `b[co]` + the sum over the patch, 16 output pixels a vector, eight channels at a
/// time. Each sum runs as `gemm`'s does for the im2col product (a chain of fused
/// multiply-adds from zero over the patch in `(ci, ky, kx)` order, one block since the
/// patch is shorter than any block, then added to the bias), so the bits are the same;
/// `gemm` spent most of those products' time on its setup and edges at k = 25, and
/// im2col on a matrix 25 times the image.
///
/// # Safety
/// The CPU has AVX-512F; `xp` holds `c·hp·wp` entries (`padded`), `w` holds
/// `cout·c·k·k` and `b` `cout`, and `out` `cout·(hp + 1 − k)·(wp + 1 − k)`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn conv_direct_avx512(
    xp: &[f32],
    padded: [usize; 3],
    k: usize,
    w: &[f32],
    b: &[f32],
    out: &mut [f32],
) {
    let [c, hp, wp] = padded;
    let (ho, wo, ckk) = (hp + 1 - k, wp + 1 - k, c * k * k);
    let cout = b.len();
    assert!(xp.len() >= c * hp * wp && w.len() == cout * ckk && out.len() == cout * ho * wo);
    crate::model::matmul::count_flops(2 * cout * ho * wo * ckk);
    assert!(ckk <= DIRECT_PATCH, "a small patch");
    // Each patch entry's offset in `xp` from the output pixel's.
    let mut offsets = [0; DIRECT_PATCH];
    for (r, off) in offsets[..ckk].iter_mut().enumerate() {
        *off = (r / (k * k) * hp + r / k % k) * wp + r % k;
    }
    let offsets = &offsets[..ckk];
    let mut co = 0;
    while co < cout {
        let group = (cout - co).min(8);
        // SAFETY: the caller's contract, for channels co..co + group.
        unsafe {
            if group == 8 {
                conv_direct_group::<8>(xp, wp, [ho, wo], offsets, w, b, out, co);
            } else {
                for g in co..co + group {
                    conv_direct_group::<1>(xp, wp, [ho, wo], offsets, w, b, out, g);
                }
            }
        }
        co += group;
    }
}

/// Output channels `co..co + G` of [`conv_direct_avx512`].
///
/// # Safety
/// As [`conv_direct_avx512`], with `co + G ≤ cout`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn conv_direct_group<const G: usize>(
    xp: &[f32],
    wp: usize,
    [ho, wo]: [usize; 2],
    offsets: &[usize],
    w: &[f32],
    b: &[f32],
    out: &mut [f32],
    co: usize,
) {
    use std::arch::x86_64::{
        _mm512_add_ps, _mm512_fmadd_ps, _mm512_mask_storeu_ps, _mm512_maskz_loadu_ps,
        _mm512_set1_ps, _mm512_setzero_ps,
    };
    let ckk = offsets.len();
    let (x, o) = (xp.as_ptr(), out.as_mut_ptr());
    for oy in 0..ho {
        let mut ox = 0;
        while ox < wo {
            let mask = u16::MAX >> (16 - (wo - ox).min(16));
            let at = oy * wp + ox;
            // SAFETY: patch entry r of output pixels at..at + 16 (masked to the row)
            // reads xp[at + offsets[r] ..], inside the padded image; channel co + g's
            // weights and output row lie inside `w` and `out`.
            unsafe {
                let mut acc = [_mm512_setzero_ps(); G];
                for (r, &off) in offsets.iter().enumerate() {
                    let v = _mm512_maskz_loadu_ps(mask, x.add(at + off));
                    for (g, a) in acc.iter_mut().enumerate() {
                        let wt = _mm512_set1_ps(*w.get_unchecked((co + g) * ckk + r));
                        *a = _mm512_fmadd_ps(wt, v, *a);
                    }
                }
                for (g, a) in acc.iter().enumerate() {
                    let sum = _mm512_add_ps(_mm512_set1_ps(b[co + g]), *a);
                    _mm512_mask_storeu_ps(o.add(((co + g) * ho + oy) * wo + ox), mask, sum);
                }
            }
            ox += 16;
        }
    }
}

/// Entries per task when the chunks' gradients are summed.
const SUM_BLOCK: usize = 1 << 13;

/// Row stride of a patch matrix of `n` columns (an image's output pixels): `n` rounded
/// up to 16 floats where that adds at most a sixteenth. `gemm` copies ("packs") an
/// operand whose rows it cannot load as whole vectors; with the rows a multiple of the
/// widest vector (16 `f32` with AVX-512, 8 with AVX2) it reads the patch matrix in
/// place, which in the FMNIST CNNs' second convolution (14·14 = 196 columns, padded to
/// 208) saves copying 0.6 MB per image. The padding columns are zeros and their outputs
/// are dropped; every kept output is the same sum over the same k in the same order, so
/// the bits do not change.
fn patch_stride(n: usize) -> usize {
    let padded = n.next_multiple_of(16);
    if (padded - n) * 16 <= n { padded } else { n }
}

/// `w` (`rows × cols`, row-major) transposed.
fn transposed(w: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0; w.len()];
    for (r, row) in w.chunks_exact(cols).enumerate() {
        for (c, &v) in row.iter().enumerate() {
            t[c * rows + r] = v;
        }
    }
    t
}

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

/// The patch matrix of image `x` (`[c, h, w]`) for a `k × k` kernel with padding
/// `pad`: row `(ci·k + ky)·k + kx`, column `oy·wo + ox` holds
/// `x[ci, oy + ky − pad, ox + kx − pad]` (zero outside the image). Rows are `ld`
/// apart ([`patch_stride`]); every entry of `col` is written, those past a row's
/// `ho·wo` columns with zeros. `padded` is scratch for the zero-padded image.
///
/// Each patch row is a copy of `ho` rows of `wo` entries of the padded image: with
/// AVX-512, one masked 16-lane move each ([`patch_rows_avx512`]); else 8-entry block
/// moves ([`patch_rows`]). Copies give the same bits either way.
fn im2col(
    x: &[f32],
    shape: [usize; 3],
    k: usize,
    pad: usize,
    padded: &mut Vec<f32>,
    col: &mut [f32],
    ld: usize,
) {
    let [c, h, w] = shape;
    let (hp, wp) = (h + 2 * pad, w + 2 * pad);
    let (ho, wo) = (hp + 1 - k, wp + 1 - k);
    assert!(ld >= ho * wo, "patch rows hold a whole output");
    assert_eq!(col.len(), c * k * k * ld, "patch matrix size");
    assert_eq!(x.len(), c * h * w, "image size");
    let xp: &[f32] = if pad == 0 {
        x
    } else {
        pad_image(x, shape, pad, padded);
        padded
    };
    #[cfg(target_arch = "x86_64")]
    if glue_isa() == Isa::Avx512 {
        // SAFETY: glue_isa found AVX-512F; the sizes of `xp` and `col` are those the
        // function's contract asks for (asserted above and in `pad_image`).
        unsafe { patch_rows_avx512(xp, [c, hp, wp], k, col, ld) };
        return;
    }
    patch_rows(xp, [c, hp, wp], k, col, ld);
}

dispatch! {
    /// `padded` = image `x` (`[c, h, w]`) with `pad` zeros around each channel.
    fn pad_image(x: &[f32], shape: [usize; 3], pad: usize, padded: &mut Vec<f32>) {
        let [c, h, w] = shape;
        let (hp, wp) = (h + 2 * pad, w + 2 * pad);
        zeros(padded, c * hp * wp);
        for (dst, src) in padded
            .chunks_exact_mut(wp)
            .enumerate()
            .filter(|(r, _)| (pad..pad + h).contains(&(r % hp)))
            .map(|(_, row)| row)
            .zip(x.chunks_exact(w))
        {
            dst[pad..pad + w].copy_from_slice(src);
        }
    }
}

dispatch! {
    /// The patch rows of [`im2col`] from the padded image `xp` (`[c, hp, wp]`), each
    /// image row as 8-entry block moves: `copy_from_slice` on these short rows becomes
    /// a libc call, which costs more than the copy.
    fn patch_rows(xp: &[f32], padded: [usize; 3], k: usize, col: &mut [f32], ld: usize) {
        let [_, hp, wp] = padded;
        let (ho, wo) = (hp + 1 - k, wp + 1 - k);
        for (r, row) in col.chunks_exact_mut(ld).enumerate() {
            let (ci, ky, kx) = (r / (k * k), r / k % k, r % k);
            let (row, tail) = row.split_at_mut(ho * wo);
            for (oy, dst) in row.chunks_exact_mut(wo).enumerate() {
                let src = &xp[(ci * hp + oy + ky) * wp + kx..][..wo];
                copy_short(dst, src);
            }
            tail.fill(0.0);
        }
    }
}

/// [`patch_rows`] with AVX-512: each image row of a patch row is one masked 16-lane
/// load and store per 16 entries. The block moves it replaces cost two loads, two
/// stores and the slicing around them per row of 14 entries (the FMNIST CNNs' second
/// convolution), which made im2col 8 % of a step.
///
/// # Safety
/// The CPU has AVX-512F, `xp` holds `c·hp·wp` entries and `col` `c·k·k·ld`, with
/// `ld ≥ (hp + 1 − k)·(wp + 1 − k)`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn patch_rows_avx512(xp: &[f32], padded: [usize; 3], k: usize, col: &mut [f32], ld: usize) {
    use std::arch::x86_64::{_mm512_mask_storeu_ps, _mm512_maskz_loadu_ps};
    let [c, hp, wp] = padded;
    let (ho, wo) = (hp + 1 - k, wp + 1 - k);
    assert!(xp.len() >= c * hp * wp && col.len() >= c * k * k * ld && ld >= ho * wo);
    let (src, dst) = (xp.as_ptr(), col.as_mut_ptr());
    for r in 0..c * k * k {
        let (ci, ky, kx) = (r / (k * k), r / k % k, r % k);
        for oy in 0..ho {
            let (from, to) = ((ci * hp + oy + ky) * wp + kx, r * ld + oy * wo);
            let mut j = 0;
            while j < wo {
                let mask = u16::MAX >> (16 - (wo - j).min(16));
                // SAFETY: entries from..from + wo of `xp` lie in image row
                // ci·hp + oy + ky (kx + wo ≤ wp), and to..to + wo in patch row r
                // (oy·wo + wo ≤ ho·wo ≤ ld); the masks touch no lane past them.
                unsafe {
                    let v = _mm512_maskz_loadu_ps(mask, src.add(from + j));
                    _mm512_mask_storeu_ps(dst.add(to + j), mask, v);
                }
                j += 16;
            }
        }
        // SAFETY: entries ho·wo..ld of patch row r lie inside `col`; all-zero bytes are 0.0.
        unsafe { std::ptr::write_bytes(dst.add(r * ld + ho * wo), 0, ld - ho * wo) };
    }
}

/// `dst = src` for rows of a few dozen entries, without a call: 8-entry block moves,
/// the last ending at the row's end (overlapping the one before, with equal values).
#[inline(always)]
fn copy_short(dst: &mut [f32], src: &[f32]) {
    const BLOCK: usize = 8;
    let n = dst.len();
    assert_eq!(src.len(), n, "row lengths");
    if n < BLOCK {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = s;
        }
        return;
    }
    for (d, s) in dst.chunks_exact_mut(BLOCK).zip(src.chunks_exact(BLOCK)) {
        let s: &[f32; BLOCK] = s.try_into().expect("a block");
        let d: &mut [f32; BLOCK] = d.try_into().expect("a block");
        *d = *s;
    }
    let s: &[f32; BLOCK] = src[n - BLOCK..].try_into().expect("a block");
    let d: &mut [f32; BLOCK] = (&mut dst[n - BLOCK..]).try_into().expect("a block");
    *d = *s;
}

dispatch! {
    /// The adjoint of [`im2col`]: adds each patch-matrix entry of `col` to the input
    /// pixel it was read from.
    fn col2im(col: &[f32], shape: [usize; 3], k: usize, pad: usize, x: &mut [f32]) {
        let [c, h, w] = shape;
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
                for (d, s) in dst[lo + kx - pad..hi + kx - pad].iter_mut().zip(&src[lo..hi]) {
                    *d += s;
                }
            }
        }
    }
}

/// burn-flex's ReLU: NaN passes through.
#[inline(always)]
fn relu(x: f32) -> f32 {
    if x.is_nan() || x > 0.0 { x } else { 0.0 }
}

/// burn-flex's ReLU backward: the gradient passes where the output is positive or NaN.
#[inline(always)]
fn relu_passes(out: f32) -> bool {
    out.is_nan() || out > 0.0
}

dispatch! {
    /// `out = relu(x)`, elementwise.
    fn relu_into(out: &mut [f32], x: &[f32]) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = relu(v);
        }
    }
}

dispatch! {
    /// `x = relu(x)`, elementwise.
    fn relu_in_place(x: &mut [f32]) {
        for v in x {
            *v = relu(*v);
        }
    }
}

dispatch! {
    /// ReLU backward: `d = g` where the ReLU's output `out` passes, else 0.
    fn relu_backward(d: &mut [f32], g: &[f32], out: &[f32]) {
        for ((d, &g), &o) in d.iter_mut().zip(g).zip(out) {
            *d = if relu_passes(o) { g } else { 0.0 };
        }
    }
}

dispatch! {
    /// 2×2 max-pool of `x` (`[c, h, w]`) into `out` (`[c, h/2, w/2]`), with `idx` the
    /// index into `x` of each window's maximum: the first in row-major order, a NaN
    /// replacing anything before it (burn-flex's rule).
    fn pool_forward(x: &[f32], shape: [usize; 3], out: &mut [f32], idx: &mut [u32]) {
        let [c, h, w] = shape;
        let (ho, wo) = (h / 2, w / 2);
        assert!(x.len() == c * h * w && out.len() == c * ho * wo && idx.len() == out.len());
        assert!(x.len() <= u32::MAX as usize, "images have < 2³² pixels");
        for ((o, ix), row) in out
            .chunks_exact_mut(wo)
            .zip(idx.chunks_exact_mut(wo))
            .enumerate()
            .map(|(r, (o, ix))| ((o, ix), (r / ho * h + r % ho * 2) * w))
        {
            let (top, bottom) = (&x[row..row + 2 * wo], &x[row + w..row + w + 2 * wo]);
            for (ox, (o, ix)) in o.iter_mut().zip(ix.iter_mut()).enumerate() {
                let j = 2 * ox;
                let mut best = top[j];
                let mut at = row + j;
                for (v, a) in [(top[j + 1], row + j + 1), (bottom[j], row + w + j), (bottom[j + 1], row + w + j + 1)] {
                    if v > best || v.is_nan() {
                        best = v;
                        at = a;
                    }
                }
                *o = best;
                *ix = at as u32;
            }
        }
    }
}

dispatch! {
    /// Max-pool backward: adds each `g` to the input pixel `idx` its window took, when
    /// `maxima` (the pool's output after a fused ReLU, one per window) passes the ReLU
    /// or there is none; the ReLU before the pool is thereby applied in the same pass.
    fn pool_backward(d: &mut [f32], idx: &[u32], g: &[f32], maxima: Option<&[f32]>) {
        match maxima {
            Some(m) => {
                for ((&j, &g), &m) in idx.iter().zip(g).zip(m) {
                    if relu_passes(m) {
                        d[j as usize] += g;
                    }
                }
            }
            None => {
                for (&j, &g) in idx.iter().zip(g) {
                    d[j as usize] += g;
                }
            }
        }
    }
}

dispatch! {
    /// Adds each row's sum (rows of `len` entries of `g`, summed first to last) to the
    /// matching entry of `acc`. Eight rows are summed side by side, each still in its
    /// own order, so the sums are those of one row at a time, without waiting on each
    /// add's latency.
    fn add_row_sums(acc: &mut [f32], g: &[f32], len: usize) {
        assert_eq!(g.len(), acc.len() * len, "one row per sum");
        const LANES: usize = 8;
        let mut accs = acc.chunks_exact_mut(LANES);
        let mut rows = g.chunks_exact(LANES * len);
        for (a, block) in (&mut accs).zip(&mut rows) {
            let mut s = [-0.0f32; LANES];
            for p in 0..len {
                for (l, s) in s.iter_mut().enumerate() {
                    *s += block[l * len + p];
                }
            }
            for (a, s) in a.iter_mut().zip(s) {
                *a += s;
            }
        }
        for (a, row) in accs.into_remainder().iter_mut().zip(rows.remainder().chunks_exact(len)) {
            *a += row.iter().sum::<f32>();
        }
    }
}

dispatch! {
    /// `acc += v`, elementwise.
    fn add_assign(acc: &mut [f32], v: &[f32]) {
        for (a, &v) in acc.iter_mut().zip(v) {
            *a += v;
        }
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

    /// One step of a two-convolution net runs exactly the hand-counted multiply-adds
    /// (2·m·n·k per product), as `fedsel bench` reports them. Image [1, 4, 4]:
    /// conv 3×3 pad 1 to 2 channels ([2, 4, 4]: 9 taps × 16 pixels), pool ([2, 2, 2]),
    /// conv 2×2 to 3 channels ([3, 1, 1]: 8 taps × 1 pixel), dense 3 → 2, batch 2.
    #[test]
    fn a_step_counts_the_hand_counted_flops() {
        let net = Net {
            input: [1, 4, 4],
            stages: &[
                Stage::Conv {
                    cout: 2,
                    k: 3,
                    pad: 1,
                },
                Stage::Pool,
                Stage::Conv {
                    cout: 3,
                    k: 2,
                    pad: 0,
                },
            ],
            dense: vec![2],
        };
        let per_image = 2 * 2 * 9 * 16 // conv 1 forward: W [2, 9] · col [9, 16]
            + 2 * 3 * 8 // conv 2 forward: W [3, 8] · col [8, 1]
            + 2 * 3 * 8 // conv 2 ∂W: δy [3, 1] · colᵀ [1, 8]
            + 2 * 8 * 3 // conv 2 δcol: Wᵀ [8, 3] · δy [3, 1]
            + 2 * 2 * 16 * 9; // conv 1 ∂W: δy [2, 16] · colᵀ [16, 9]; no δcol for the input
        let dense = 3 * (2 * 2 * 3 * 2); // forward a·W, ∂W = aᵀ·δz, δa = δz·Wᵀ: [2, 3]·[3, 2] each
        assert_eq!(counted_flops(&net), (2 * per_image + dense) as u64);

        // 14 × 14 = 196 output pixels: the patch matrix is padded to 208 columns
        // (`patch_stride`), and the padding's products are not counted.
        assert_eq!(patch_stride(196), 208);
        let padded = Net {
            input: [1, 14, 14],
            stages: &[Stage::Conv {
                cout: 2,
                k: 3,
                pad: 1,
            }],
            dense: vec![2],
        };
        let per_image = 2 * 2 * 9 * 196 // forward: W [2, 9] · col [9, 196]
            + 2 * 2 * 196 * 9; // ∂W: δy [2, 196] · colᵀ [196, 9]; no δcol for the input
        let dense = 3 * (2 * 2 * 392 * 2); // [2, 392]·[392, 2] and its two gradients
        assert_eq!(counted_flops(&padded), (2 * per_image + dense) as u64);
    }

    /// FLOPs counted in one training step of `net` on two images, on one thread.
    fn counted_flops(net: &Net) -> u64 {
        let params = random_params(net, 3);
        let pixels: usize = net.input.iter().product();
        let x: Vec<f32> = (0..2 * pixels)
            .map(|i| (i % 7) as f32 * 0.1 - 0.3)
            .collect();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        pool.install(|| {
            let before = crate::model::matmul::flops_counted();
            net.loss_and_gradient(&params, &x, &[0, 1]);
            crate::model::matmul::flops_counted() - before
        })
    }

    /// Summing eight rows side by side gives each row's sequential sum bit for bit,
    /// signed zeros included, with rows left over after the blocks of eight.
    #[test]
    fn row_sums_side_by_side_equal_sequential_sums() {
        let mut rng = stream(9, Purpose::Init, 0, 0);
        let (rows, len) = (19, 37);
        let mut g: Vec<f32> = (0..rows * len)
            .map(|_| rng.random_range(-1.0f32..1.0) * 10f32.powi(rng.random_range(-8..8)))
            .collect();
        g[3 * len..4 * len].fill(-0.0);
        g[17 * len..18 * len].fill(-0.0);
        let start: Vec<f32> = (0..rows)
            .map(|r| if r % 3 == 0 { -0.0 } else { r as f32 })
            .collect();
        let mut got = start.clone();
        add_row_sums(&mut got, &g, len);
        for (r, (&got, &s)) in got.iter().zip(&start).enumerate() {
            let want = s + g[r * len..][..len].iter().sum::<f32>();
            assert_eq!(got.to_bits(), want.to_bits(), "row {r}");
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

    /// The SSE2, AVX2 and AVX-512 copies of the loops around the products (those this CPU
    /// runs) give the same loss and gradient bits: results may differ across CPU kinds only
    /// through `gemm`'s kernels (docs/reliability.md).
    #[test]
    fn every_glue_copy_gives_the_same_bits() {
        let widest = glue_isa();
        let isas: Vec<Isa> = [Isa::Baseline, Isa::Avx2, Isa::Avx512]
            .into_iter()
            .filter(|&i| match widest {
                Isa::Avx512 => true,
                Isa::Avx2 => i != Isa::Avx512,
                Isa::Baseline => i == Isa::Baseline,
            })
            .collect();
        for (arch, _, data) in models() {
            let params = ParamLayout::of(arch.as_ref()).init(7);
            let idx: Vec<usize> = (0..9).collect();
            let f = arch
                .loss_gradient()
                .expect("the CNNs have a fused gradient");
            // One thread, so that every loop runs where the override is set.
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .unwrap();
            let run = |isa: Isa| {
                pool.install(|| {
                    FORCED_ISA.with(|c| c.set(Some(isa)));
                    let out = f.loss_and_gradient(&params, &data, &idx);
                    FORCED_ISA.with(|c| c.set(None));
                    out
                })
            };
            let (loss, grad) = run(Isa::Baseline);
            for &isa in &isas[1..] {
                let (l, g) = run(isa);
                assert_eq!(
                    l.to_bits(),
                    loss.to_bits(),
                    "{} {}",
                    arch.name(),
                    isa.name()
                );
                assert!(
                    g.iter().zip(&grad).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{} {}",
                    arch.name(),
                    isa.name()
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

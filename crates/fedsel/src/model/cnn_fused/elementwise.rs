//! The elementwise and pooling loops between the products: ReLU, 2×2 max-pool, the
//! bias sums and the chunks' sums, each in its fixed sequential order.

#[cfg(target_arch = "x86_64")]
use super::first_lanes;
use super::glue_isa;

/// burn-flex's ReLU: NaN passes through.
#[inline(always)]
pub(super) fn relu(x: f32) -> f32 {
    if x.is_nan() || x > 0.0 { x } else { 0.0 }
}

/// burn-flex's ReLU backward: the gradient passes where the output is positive or NaN.
#[inline(always)]
pub(super) fn relu_passes(out: f32) -> bool {
    out.is_nan() || out > 0.0
}

dispatch! {
    /// `out = relu(x)`, elementwise.
    pub(super) fn relu_into(out: &mut [f32], x: &[f32]) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = relu(v);
        }
    }
}

dispatch! {
    /// `x = relu(x)`, elementwise.
    pub(super) fn relu_in_place(x: &mut [f32]) {
        for v in x {
            *v = relu(*v);
        }
    }
}

dispatch! {
    /// ReLU backward: `d = g` where the ReLU's output `out` passes, else 0.
    pub(super) fn relu_backward(d: &mut [f32], g: &[f32], out: &[f32]) {
        for ((d, &g), &o) in d.iter_mut().zip(g).zip(out) {
            *d = if relu_passes(o) { g } else { 0.0 };
        }
    }
}

/// 2×2 max-pool of `x` (`[c, h, w]`) into `out` (`[c, h/2, w/2]`), with `idx` the index
/// into `x` of each window's maximum: the first in row-major order, a NaN replacing
/// anything before it (burn-flex's rule). With AVX-512, 16 windows a vector
/// ([`pool_rows_avx512`]): the compiler's loop ran one window at a time, 5 % of the
/// CIFAR CNN's step. Both make the same comparisons, so they pick the same entries.
pub(super) fn pool_forward(x: &[f32], shape: [usize; 3], out: &mut [f32], idx: &mut [u32]) {
    let [c, h, w] = shape;
    assert!(x.len() == c * h * w && out.len() == c * (h / 2) * (w / 2) && idx.len() == out.len());
    assert!(x.len() <= u32::MAX as usize, "images have < 2³² pixels");
    #[cfg(target_arch = "x86_64")]
    if glue_isa() == crate::cpu::Isa::Avx512 {
        // SAFETY: glue_isa found AVX-512F; the sizes are asserted above.
        unsafe { pool_rows_avx512(x, shape, out, idx) };
        return;
    }
    pool_rows(x, shape, out, idx);
}

dispatch! {
    /// [`pool_forward`] a window at a time.
    fn pool_rows(x: &[f32], shape: [usize; 3], out: &mut [f32], idx: &mut [u32]) {
        let [_, h, w] = shape;
        let (ho, wo) = (h / 2, w / 2);
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

/// [`pool_rows`] with AVX-512: the even and odd columns of 32 entries of both rows are
/// split into four vectors, and the window's entries are taken in row-major order with
/// the same test (`v > best` or `v` NaN), masked.
///
/// # Safety
/// The CPU has AVX-512F; `x` holds `c·h·w` entries, `out` and `idx` `c·(h/2)·(w/2)`, and
/// `c·h·w < 2³²`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn pool_rows_avx512(x: &[f32], shape: [usize; 3], out: &mut [f32], idx: &mut [u32]) {
    use std::arch::x86_64::{
        __m512, _CMP_GT_OQ, _CMP_UNORD_Q, _mm512_add_epi32, _mm512_cmp_ps_mask,
        _mm512_mask_blend_epi32, _mm512_mask_blend_ps, _mm512_mask_storeu_epi32,
        _mm512_mask_storeu_ps, _mm512_maskz_loadu_ps, _mm512_permutex2var_ps, _mm512_set1_epi32,
        _mm512_setr_epi32,
    };
    let [c, h, w] = shape;
    let (ho, wo) = (h / 2, w / 2);
    assert!(x.len() >= c * h * w && out.len() >= c * ho * wo && idx.len() >= c * ho * wo);
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    let (src, o, ix) = (x.as_ptr(), out.as_mut_ptr(), idx.as_mut_ptr());
    // The 32 entries from `at` of one row, masked to its first `n`, split in two.
    let split = |at: usize, n: usize| -> [__m512; 2] {
        let (lo, hi) = (first_lanes(n), first_lanes(n.saturating_sub(16)));
        // SAFETY: the caller reads the first n ≤ 2·wo ≤ w entries of an image row.
        let (a, b) = unsafe {
            (
                _mm512_maskz_loadu_ps(lo, src.add(at)),
                _mm512_maskz_loadu_ps(hi, src.add(at + 16)),
            )
        };
        [
            _mm512_permutex2var_ps(a, even, b),
            _mm512_permutex2var_ps(a, odd, b),
        ]
    };
    for r in 0..c * ho {
        let row = (r / ho * h + r % ho * 2) * w;
        let mut ox = 0;
        while ox < wo {
            let lanes = (wo - ox).min(16);
            let j = row + 2 * ox;
            let [te, to] = split(j, 2 * lanes);
            let [be, bo] = split(j + w, 2 * lanes);
            let first = _mm512_add_epi32(_mm512_set1_epi32(j as i32), even);
            let (mut best, mut at) = (te, first);
            for (v, step) in [(to, 1), (be, w), (bo, w + 1)] {
                let take = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(v, best)
                    | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
                best = _mm512_mask_blend_ps(take, best, v);
                let cand = _mm512_add_epi32(first, _mm512_set1_epi32(step as i32));
                at = _mm512_mask_blend_epi32(take, at, cand);
            }
            let mask = first_lanes(lanes);
            // SAFETY: windows ox..ox + lanes of output row r lie inside `out` and `idx`.
            unsafe {
                _mm512_mask_storeu_ps(o.add(r * wo + ox), mask, best);
                _mm512_mask_storeu_epi32(ix.add(r * wo + ox).cast(), mask, at);
            }
            ox += 16;
        }
    }
}

/// Max-pool backward: `d` (`[c, h, w]`, written in full) holds at each window's
/// maximum `0 + g` (the pixel `idx` the window took), when `maxima` (the pool's output
/// after a fused ReLU, one per window) passes the ReLU or there is none, and zeros
/// elsewhere; the ReLU before the pool is thereby applied in the same pass. With
/// AVX-512 the image is written once, 16 windows at a time ([`pool_grad_rows_avx512`]),
/// where the plain loop zeroes it and then adds each gradient at its index.
pub(super) fn pool_backward(
    d: &mut [f32],
    shape: [usize; 3],
    idx: &[u32],
    g: &[f32],
    maxima: Option<&[f32]>,
) {
    let [c, h, w] = shape;
    assert!(d.len() == c * h * w && idx.len() == c * (h / 2) * (w / 2) && g.len() == idx.len());
    assert!(
        maxima.is_none_or(|m| m.len() == idx.len()),
        "one maximum per window"
    );
    #[cfg(target_arch = "x86_64")]
    if glue_isa() == crate::cpu::Isa::Avx512 {
        // SAFETY: glue_isa found AVX-512F; the sizes are asserted above, and `idx` is
        // the pool's forward pass's (each window's index lies in its window).
        unsafe { pool_grad_rows_avx512(d, shape, idx, g, maxima) };
        return;
    }
    d.fill(0.0);
    pool_grad_scatter(d, idx, g, maxima);
}

dispatch! {
    /// [`pool_backward`] into zeros, a window at a time.
    fn pool_grad_scatter(d: &mut [f32], idx: &[u32], g: &[f32], maxima: Option<&[f32]>) {
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

/// [`pool_backward`] with AVX-512: for 16 windows, the four entries of each (`0 + g`
/// where the index is that entry's, masked by the ReLU, else zero) are interleaved back
/// into the two image rows and stored; an odd last row or column is zeroed.
///
/// # Safety
/// The CPU has AVX-512F; `d` holds `c·h·w` entries, `idx`, `g` and `maxima` (if any)
/// `c·(h/2)·(w/2)`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn pool_grad_rows_avx512(
    d: &mut [f32],
    shape: [usize; 3],
    idx: &[u32],
    g: &[f32],
    maxima: Option<&[f32]>,
) {
    use std::arch::x86_64::{
        _CMP_GT_OQ, _CMP_UNORD_Q, _MM_CMPINT_EQ, _mm512_add_epi32, _mm512_cmp_epi32_mask,
        _mm512_cmp_ps_mask, _mm512_mask_storeu_ps, _mm512_maskz_add_ps, _mm512_maskz_loadu_epi32,
        _mm512_maskz_loadu_ps, _mm512_maskz_mov_ps, _mm512_permutex2var_ps, _mm512_set1_epi32,
        _mm512_setr_epi32, _mm512_setzero_ps,
    };
    let [c, h, w] = shape;
    let (ho, wo) = (h / 2, w / 2);
    assert!(d.len() >= c * h * w && idx.len() >= c * ho * wo && g.len() >= c * ho * wo);
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let low = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    let high = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    let zero = _mm512_setzero_ps();
    let out = d.as_mut_ptr();
    for ch in 0..c {
        for oy in 0..ho {
            let (r, row) = (ch * ho + oy, (ch * h + 2 * oy) * w);
            let mut ox = 0;
            while ox < wo {
                let n = (wo - ox).min(16);
                let lanes = first_lanes(n);
                let at = r * wo + ox;
                // SAFETY: windows ox..ox + n of window row r lie inside idx, g, maxima.
                let (ix, gv) = unsafe {
                    (
                        _mm512_maskz_loadu_epi32(lanes, idx.as_ptr().add(at).cast()),
                        _mm512_maskz_loadu_ps(lanes, g.as_ptr().add(at)),
                    )
                };
                let pass = match maxima {
                    // SAFETY: as above.
                    Some(m) => unsafe {
                        let m = _mm512_maskz_loadu_ps(lanes, m.as_ptr().add(at));
                        _mm512_cmp_ps_mask::<_CMP_GT_OQ>(m, zero)
                            | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(m, m)
                    },
                    None => u16::MAX,
                };
                let grad = _mm512_maskz_add_ps(lanes & pass, zero, gv);
                let first = _mm512_add_epi32(_mm512_set1_epi32((row + 2 * ox) as i32), even);
                let [tl, tr, bl, br] = [0, 1, w, w + 1].map(|step| {
                    let here = _mm512_add_epi32(first, _mm512_set1_epi32(step as i32));
                    _mm512_maskz_mov_ps(_mm512_cmp_epi32_mask::<_MM_CMPINT_EQ>(ix, here), grad)
                });
                let (front, back) = (first_lanes(2 * n), first_lanes((2 * n).saturating_sub(16)));
                for (line, left, right) in [(row, tl, tr), (row + w, bl, br)] {
                    let to = line + 2 * ox;
                    // SAFETY: entries to..to + 2n lie in image row `line` (2·wo ≤ w).
                    unsafe {
                        let p = out.add(to);
                        _mm512_mask_storeu_ps(p, front, _mm512_permutex2var_ps(left, low, right));
                        _mm512_mask_storeu_ps(
                            p.add(16),
                            back,
                            _mm512_permutex2var_ps(left, high, right),
                        );
                    }
                }
                ox += 16;
            }
            if w % 2 == 1 {
                // SAFETY: the last entries of the window row's two image rows.
                unsafe {
                    *out.add(row + w - 1) = 0.0;
                    *out.add(row + 2 * w - 1) = 0.0;
                }
            }
        }
        if h % 2 == 1 {
            // SAFETY: channel ch's last image row.
            unsafe { std::ptr::write_bytes(out.add((ch * h + h - 1) * w), 0, w) };
        }
    }
}

dispatch! {
    /// Adds each row's sum (rows of `len` entries of `g`, summed first to last) to the
    /// matching entry of `acc`. Eight rows are summed side by side, each still in its
    /// own order, so the sums are those of one row at a time, without waiting on each
    /// add's latency.
    pub(super) fn add_row_sums(acc: &mut [f32], g: &[f32], len: usize) {
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
    pub(super) fn add_assign(acc: &mut [f32], v: &[f32]) {
        for (a, &v) in acc.iter_mut().zip(v) {
            *a += v;
        }
    }
}

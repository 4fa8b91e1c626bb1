//! The elementwise and pooling loops between the products: ReLU, 2×2 max-pool, the
//! bias sums and the chunks' sums, each in its fixed sequential order.

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

dispatch! {
    /// 2×2 max-pool of `x` (`[c, h, w]`) into `out` (`[c, h/2, w/2]`), with `idx` the
    /// index into `x` of each window's maximum: the first in row-major order, a NaN
    /// replacing anything before it (burn-flex's rule).
    pub(super) fn pool_forward(x: &[f32], shape: [usize; 3], out: &mut [f32], idx: &mut [u32]) {
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
    pub(super) fn pool_backward(d: &mut [f32], idx: &[u32], g: &[f32], maxima: Option<&[f32]>) {
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

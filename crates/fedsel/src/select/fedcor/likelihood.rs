//! FedCor's likelihood (Eq. 16-17) and its gradient in the embeddings X, by the Woodbury
//! identity: each group of samples over the same clients factors only the d × d matrix
//! K = σ_n² I + XXᵀ, never the N × N covariance.

use std::borrow::Cow;

use nalgebra::{DMatrix, DMatrixView, DVector, DVectorView};
use rayon::prelude::*;

/// One weighted sample in the likelihood: Δl over `clients`.
#[derive(Debug, Clone, Copy)]
pub struct Observation<'a> {
    /// Weight γ^m.
    pub weight: f64,
    /// Observed clients (columns of X), ascending.
    pub clients: &'a [usize],
    /// Their loss changes.
    pub dl: &'a [f64],
}

/// Cholesky factor of K = σ²I + X Xᵀ (d × d), with the noise variance actually used:
/// jitter is added until the factorisation succeeds, and a failure past 1e-2 is an error.
/// Xᵀ is a strided view of X, not a copy (the matrix product packs either alike).
fn factor(
    x: &DMatrix<f64>,
    s2: f64,
) -> Result<(nalgebra::Cholesky<f64, nalgebra::Dyn>, f64), String> {
    let (d, n) = x.shape();
    let xxt = x * DMatrixView::from_slice_with_strides(x.as_slice(), n, d, d, 1);
    let mut jitter = 0.0;
    loop {
        let k = &xxt + DMatrix::identity(d, d) * (s2 + jitter);
        if let Some(c) = k.cholesky() {
            return Ok((c, s2 + jitter));
        }
        jitter = if jitter == 0.0 { 1e-10 } else { jitter * 10.0 };
        if jitter > 1e-2 {
            return Err("Cholesky of σ²I + XXᵀ failed even with jitter 1e-2".into());
        }
    }
}

/// Columns a tile of [`solve_scaled`] transposes at once.
const TILE: usize = 32;

/// w · K⁻¹B for K = LLᵀ (L the lower triangle of `l`) and B d × n, entry for entry what
/// nalgebra's `Cholesky::solve` then `* w` compute: per column, forward substitution
/// (b_i ← b_i / L_ii, then b_j ← b_j − b_i L_ji), back substitution with its dot product's
/// order (eight running sums over blocks of eight rows, then the rest in order), and the
/// product with w. Tiles of [`TILE`] columns are transposed so that each of those
/// operations runs across the tile's columns at once, not down one column's chain of
/// dependent divisions. Tiles are independent, so they run in parallel: each column's
/// arithmetic is the same whatever thread solves it.
fn solve_scaled(l: &DMatrix<f64>, b: &DMatrix<f64>, w: f64) -> DMatrix<f64> {
    let d = b.nrows();
    let mut out = DMatrix::zeros(d, b.ncols());
    if d == 0 {
        return out;
    }
    out.as_mut_slice()
        .par_chunks_mut(TILE * d)
        .zip(b.as_slice().par_chunks(TILE * d))
        .for_each_init(
            || vec![[0.0; TILE]; d],
            |rows, (dst, src)| solve_tile(l, src, dst, w, rows),
        );
    out
}

/// One tile of [`solve_scaled`]: the `src.len() / d` columns of `src` solved into `dst`,
/// with `rows` (d rows of [`TILE`]) as scratch.
fn solve_tile(l: &DMatrix<f64>, src: &[f64], dst: &mut [f64], w: f64, rows: &mut [[f64; TILE]]) {
    let d = rows.len();
    let tw = src.len() / d;
    // A last, partial tile is padded with zeros, which solve to zeros and are not
    // written back.
    for (r, row) in rows.iter_mut().enumerate() {
        row.fill(0.0);
        for (v, bc) in row.iter_mut().zip(src.chunks_exact(d)) {
            *v = bc[r];
        }
    }
    for i in 0..d {
        let lii = l[(i, i)];
        let (head, tail) = rows.split_at_mut(i + 1);
        let ri = &mut head[i];
        ri.iter_mut().for_each(|v| *v /= lii);
        for (j, rj) in (i + 1..d).zip(tail) {
            let lji = l[(j, i)];
            for (v, &c) in rj.iter_mut().zip(ri.iter()) {
                *v += -c * lji;
            }
        }
    }
    for i in (0..d).rev() {
        let len = d - 1 - i;
        let mut acc = [[0.0; TILE]; 8];
        let mut k = 0;
        while len - k >= 8 {
            for (q, accq) in acc.iter_mut().enumerate() {
                let row = i + 1 + k + q;
                let lv = l[(row, i)];
                for (a, &v) in accq.iter_mut().zip(&rows[row]) {
                    *a += lv * v;
                }
            }
            k += 8;
        }
        let mut res = [0.0; TILE];
        for (t, r) in res.iter_mut().enumerate() {
            *r += acc[0][t] + acc[4][t];
            *r += acc[1][t] + acc[5][t];
            *r += acc[2][t] + acc[6][t];
            *r += acc[3][t] + acc[7][t];
        }
        for row in i + 1 + k..d {
            let lv = l[(row, i)];
            for (r, &v) in res.iter_mut().zip(&rows[row]) {
                *r += lv * v;
            }
        }
        let lii = l[(i, i)];
        for (v, &r) in rows[i].iter_mut().zip(&res) {
            *v = (*v - r) / lii;
        }
    }
    debug_assert_eq!(dst.len(), tw * d);
    for (t, oc) in dst.chunks_exact_mut(d).enumerate() {
        for (o, row) in oc.iter_mut().zip(rows.iter()) {
            *o = row[t] * w;
        }
    }
}

/// Columns of X per parallel task of [`nll_and_grad`]'s per-column passes.
const COLUMNS: usize = 256;

/// X u for each u of `us` (n values each, X d × n), each entry summed as nalgebra's
/// matrix-vector product sums it: x_r0 u_0 first, then x_rc u_c added in order of c. The
/// u's are shared among the threads, each pass over X serving its share of them.
fn products(x: &DMatrix<f64>, us: &[&[f64]]) -> Vec<DVector<f64>> {
    let share = us.len().div_ceil(rayon::current_num_threads()).max(1);
    us.par_chunks(share)
        .flat_map_iter(|us| products_serial(x, us))
        .collect()
}

/// [`products`] on the calling thread, in one pass over X.
fn products_serial(x: &DMatrix<f64>, us: &[&[f64]]) -> Vec<DVector<f64>> {
    let d = x.nrows();
    let mut out = vec![DVector::zeros(d); us.len()];
    if d == 0 {
        return out;
    }
    for (c, xc) in x.as_slice().chunks_exact(d).enumerate() {
        for (o, u) in out.iter_mut().zip(us) {
            let uc = u[c];
            let o = o.as_mut_slice();
            if c == 0 {
                o.iter_mut().zip(xc).for_each(|(o, &xr)| *o = xr * uc);
            } else {
                o.iter_mut().zip(xc).for_each(|(o, &xr)| *o += xr * uc);
            }
        }
    }
    out
}

/// The negative discounted log-likelihood Σ_s w_s · ½(log|Σ_S| + yᵀΣ_S⁻¹y) (without the
/// constant) and its gradient in X, where Σ_S is the GP's marginal over the sample's
/// observed clients S. Consecutive samples over the same clients share one factorisation.
/// A sample over every client reads X in place. O(n_S d²) per group of samples over the
/// same n_S clients and O(n_S d) per sample, with no n_S × n_S matrix; the arithmetic is
/// entry for entry that of the plain nalgebra expressions, sample after sample
/// (`select_columns`, `chol.solve(&xs) * w`, `xs y`, `xsᵀ v`, `g −= (xs a) aᵀ w`), but
/// without their d × n_S temporaries, and each pass over X serves every sample of the group.
pub fn nll_and_grad(
    x: &DMatrix<f64>,
    noise: f64,
    samples: &[Observation<'_>],
) -> Result<(f64, DMatrix<f64>), String> {
    let (d, n) = x.shape();
    if d == 0 {
        return Err("the embeddings have no dimension".into());
    }
    let mut grad = DMatrix::zeros(d, n);
    let mut nll = 0.0;
    let mut i = 0;
    while i < samples.len() {
        let clients = samples[i].clients;
        let group_end = samples[i..]
            .iter()
            .position(|s| s.clients != clients)
            .map_or(samples.len(), |j| i + j);
        let group = &samples[i..group_end];
        i = group_end;
        let every = clients.len() == n && clients.iter().enumerate().all(|(c, &k)| c == k);
        let xs = if every {
            Cow::Borrowed(x)
        } else {
            Cow::Owned(x.select_columns(clients))
        };
        let (chol, s2) = factor(&xs, noise * noise)?;
        let l = chol.l();
        let logdet_k: f64 = 2.0 * l.diagonal().iter().map(|v| v.ln()).sum::<f64>();
        let logdet = (clients.len() as f64 - d as f64) * s2.ln() + logdet_k;
        let total_w: f64 = group.iter().map(|s| s.weight).sum();
        let mut g = solve_scaled(&l, &xs, total_w);
        nll += 0.5 * total_w * logdet;
        let ys: Vec<&[f64]> = group.iter().map(|s| s.dl).collect();
        let vs: Vec<DVector<f64>> = products(&xs, &ys).iter().map(|xy| chol.solve(xy)).collect();
        // a_s = (y_s − X_Sᵀ v_s)/σ², each (X_Sᵀ v_s)_c summed as the matrix-vector product
        // sums it: x_0c v_0 first, then x_rc v_r added in order of r.
        // The v_s side by side (entry r of every sample together), so that the group's
        // sums for one column run at once.
        let k = group.len();
        let mut vt = vec![0.0; d * k];
        for (s, v) in vs.iter().enumerate() {
            for (r, &vr) in v.iter().enumerate() {
                vt[r * k + s] = vr;
            }
        }
        // Columns in parallel, the samples of one column side by side (`at[c·k + s]`).
        let mut at = vec![0.0; xs.ncols() * k];
        at.par_chunks_mut(COLUMNS * k)
            .zip(xs.as_slice().par_chunks(COLUMNS * d))
            .enumerate()
            .for_each(|(chunk, (at, xcs))| {
                let mut t = vec![0.0; k];
                let (first, rest) = vt.split_at(k);
                for (j, (at_c, xc)) in at.chunks_exact_mut(k).zip(xcs.chunks_exact(d)).enumerate() {
                    let c = chunk * COLUMNS + j;
                    t.iter_mut().zip(first).for_each(|(t, &v)| *t = xc[0] * v);
                    for (&xr, vr) in xc[1..].iter().zip(rest.chunks_exact(k)) {
                        t.iter_mut().zip(vr).for_each(|(t, &v)| *t += xr * v);
                    }
                    for ((a, y), &ts) in at_c.iter_mut().zip(&ys).zip(&t) {
                        *a = (y[c] - ts) / s2;
                    }
                }
            });
        let a: Vec<Vec<f64>> = (0..k)
            .map(|s| at.iter().skip(s).step_by(k).copied().collect())
            .collect();
        for ((s, y), a_s) in group.iter().zip(&ys).zip(&a) {
            let (y, a_s) = (DVectorView::from(*y), DVectorView::from(a_s.as_slice()));
            nll += 0.5 * s.weight * y.dot(&a_s);
        }
        let a_refs: Vec<&[f64]> = a.iter().map(Vec::as_slice).collect();
        let xa = products(&xs, &a_refs);
        g.as_mut_slice()
            .par_chunks_mut(COLUMNS * d)
            .enumerate()
            .for_each(|(chunk, gcs)| {
                for (j, gc) in gcs.chunks_exact_mut(d).enumerate() {
                    let c = chunk * COLUMNS + j;
                    for ((s, a_s), xa_s) in group.iter().zip(&a).zip(&xa) {
                        let ac = a_s[c];
                        for (gv, &xr) in gc.iter_mut().zip(xa_s.as_slice()) {
                            *gv -= (xr * ac) * s.weight;
                        }
                    }
                }
            });
        // Slices, not nalgebra's column views: the same one addition per entry, without
        // a view's set-up per client (most of the likelihood's time at 10,000 clients).
        let out: &mut [f64] = grad.as_mut_slice();
        for (&k, gc) in clients.iter().zip(g.as_slice().chunks_exact(d)) {
            for (a, &b) in out[k * d..(k + 1) * d].iter_mut().zip(gc) {
                *a += b;
            }
        }
    }
    if !nll.is_finite() || grad.iter().any(|g| !g.is_finite()) {
        return Err("the GP likelihood is not finite".into());
    }
    Ok((nll, grad))
}

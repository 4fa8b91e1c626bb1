//! FedCor's posterior selection (Alg. 1, Eq. 11-13): the GP's covariance conditioned on
//! each pick, held as its prior plus one downdate a pick.

use nalgebra::{DMatrix, DVector};

/// Σ = XᵀX + σ_n² I conditioned on the clients picked so far (Eq. 11), never built as an
/// N × N matrix. After j picks Σ⁽ʲ⁾ = Σ⁽⁰⁾ − Σ_{l<j} c_l c_lᵀ / v_l, where c_l and v_l are
/// the column and variance Σ⁽ˡ⁾_{·k_l}, Σ⁽ˡ⁾_{k_l k_l} of the l-th pick when it was picked:
/// a column costs O(N(d + j)), and the two things the scores read, the variances diag Σ
/// and the weighted sums Σp (Eq. 12's Σ_i p_i Σ_ik, Σ being symmetric), are downdated in
/// O(N) per pick.
#[derive(Debug, Clone)]
pub(super) struct Posterior<'a> {
    x: &'a DMatrix<f64>,
    noise_var: f64,
    p: &'a [f64],
    /// c_0, c_1, …: N values each.
    cols: Vec<f64>,
    /// v_0, v_1, …
    pivots: Vec<f64>,
    /// Σ_kk of the current Σ.
    pub(super) var: Vec<f64>,
    /// (Σp)_k of the current Σ.
    pub(super) sp: Vec<f64>,
}

impl<'a> Posterior<'a> {
    /// The prior Σ⁽⁰⁾ = XᵀX + σ_n² I: its diagonal, and Σ⁽⁰⁾p = Xᵀ(Xp) + σ_n² p.
    pub(super) fn new(x: &'a DMatrix<f64>, noise_var: f64, p: &'a [f64]) -> Self {
        let xp = x * DVector::from_column_slice(p);
        let columns = || x.as_slice().chunks_exact(x.nrows().max(1));
        let var = columns().map(|xk| dot(xk, xk) + noise_var).collect();
        let sp = columns()
            .zip(p)
            .map(|(xk, &pk)| dot(xk, xp.as_slice()) + noise_var * pk)
            .collect();
        Self {
            x,
            noise_var,
            p,
            cols: Vec::new(),
            pivots: Vec::new(),
            var,
            sp,
        }
    }

    /// Column k of the current Σ: x_iᵀx_k + σ_n² δ_ik, then each pick's
    /// (c_l,i · c_l,k) / v_l subtracted in the order of the picks, as Eq. 11's dense update
    /// subtracts them.
    pub(super) fn column(&self, k: usize) -> Vec<f64> {
        let n = self.p.len();
        let d = self.x.nrows();
        let xs = self.x.as_slice();
        let xk = &xs[k * d..(k + 1) * d];
        let mut col: Vec<f64> = (0..n).map(|i| dot(&xs[i * d..(i + 1) * d], xk)).collect();
        col[k] += self.noise_var;
        for (c, &v) in self.cols.chunks_exact(n).zip(&self.pivots) {
            let ck = c[k];
            for (o, &ci) in col.iter_mut().zip(c) {
                *o -= (ci * ck) / v;
            }
        }
        col
    }

    /// Eq. 11: Σ ← Σ − Σ_{·k} Σ_{k·} / Σ_kk, for a k whose variance is positive.
    fn condition(&mut self, k: usize) {
        let v = self.var[k];
        let c = self.column(k);
        let cp = dot(&c, self.p);
        for ((vi, si), &ci) in self.var.iter_mut().zip(&mut self.sp).zip(&c) {
            *vi -= (ci * ci) / v;
            *si -= (ci * cp) / v;
        }
        self.cols.extend_from_slice(&c);
        self.pivots.push(v);
    }

    /// Alg. 1: `m` greedy picks among `candidates`, each the argmax of
    /// α_k (Σp)_k / √Σ_kk (Eq. 12–13; the first of equal scores), Σ conditioned on it.
    pub(super) fn select(&mut self, alpha: &[f64], candidates: &[usize], m: usize) -> Vec<usize> {
        let mut left: Vec<usize> = candidates.to_vec();
        let mut picked = Vec::with_capacity(m);
        while picked.len() < m && !left.is_empty() {
            let mut best: Option<(usize, f64)> = None;
            for (j, &k) in left.iter().enumerate() {
                let var = self.var[k];
                let score = if var > 1e-300 {
                    alpha[k] * self.sp[k] / var.sqrt()
                } else {
                    f64::NEG_INFINITY
                };
                if best.is_none_or(|b| score > b.1) {
                    best = Some((j, score));
                }
            }
            let (j, _) = best.expect("left is not empty");
            let k = left.remove(j);
            if self.var[k] > 1e-300 {
                self.condition(k);
            }
            picked.push(k);
        }
        picked
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(u, v)| u * v).sum()
}

/// Greedy posterior selection (Alg. 1): `m` picks among `candidates` under the GP with
/// embeddings `x` (d × N) and noise variance σ_n², in O(N d + m N (d + m)) time and
/// O(N (d + m)) memory: Σ is held as its prior plus one downdate a pick, never built.
pub fn greedy_select(
    x: &DMatrix<f64>,
    noise_var: f64,
    p: &[f64],
    alpha: &[f64],
    candidates: &[usize],
    m: usize,
) -> Vec<usize> {
    Posterior::new(x, noise_var, p).select(alpha, candidates, m)
}

/// cos(Σ_a, Σ_b) of the covariances Σ = XᵀX + s² I of two embeddings, from d × d
/// products: ⟨Σ_a, Σ_b⟩_F = ‖X_a X_bᵀ‖²_F + s²(‖X_a‖²_F + ‖X_b‖²_F) + N s⁴, every term
/// non-negative, so O(N d²) and no N × N matrix.
pub(super) fn sigma_cosine(a: &DMatrix<f64>, b: &DMatrix<f64>, s2: f64) -> f64 {
    let n = a.ncols() as f64;
    let inner = |x: &DMatrix<f64>, y: &DMatrix<f64>| {
        (x * y.transpose()).norm_squared()
            + s2 * (x.norm_squared() + y.norm_squared())
            + n * s2 * s2
    };
    inner(a, b) / (inner(a, a).sqrt() * inner(b, b).sqrt())
}

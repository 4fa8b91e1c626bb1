//! FedCor (Tang et al., CVPR 2022; seed 000) and its FedGP variant (seed 001):
//! correlation-based active client selection with a Gaussian process over the
//! clients' loss changes.
//!
//! - **Model (Eq. 8, 14).** Δl^t ~ N(0, Σ) with Σ = XᵀX + σ_n² I, X the d × N matrix of
//!   client embeddings (linear kernel, prior mean 0 as footnote 1).
//! - **Selection (Alg. 1, Eq. 9–11 as Lemma 2 / Eq. 12–13 restate them).** Greedily pick
//!   k* = argmax α_k Σ_i p_i Σ_ik / √Σ_kk among available, unpicked clients, then
//!   condition Σ on k*: Σ ← Σ − Σ_{·k*} Σ_{k*·} / Σ_{k*k*} (Eq. 11).
//! - **Annealing (Alg. 2 line 14).** α_k ← β α_k each time k is selected; reset to 1 on
//!   every GP-training round (line 9).
//! - **Warm-up (decisions.md, §5.1).** Rounds 0..=R_w select uniformly. Each warm-up
//!   round's own loss change (held-out loss after − before, over the clients available at
//!   both ends) is one GP sample, and the GP is fitted on it at the start of the next round,
//!   with Δt = 1 and the warm-up M. GP selection starts at round R_w + 1.
//! - **GP-training rounds (Alg. 2 lines 3–11).** When t % Δt = 0 after warm-up, S probe
//!   selections are drawn uniformly among the available clients and trained from w^t; each
//!   probe model's held-out losses on the available clients give one sample of round t, and
//!   the probes are discarded (`ClientQuery::probe`, booked as probe trainings). α is reset
//!   and X is trained with Adam, warm-started from X^{t−1}, on the discounted likelihood
//!   Φ_t (Eq. 16–17).
//! - **Eq. 17's window.** A fit anchored at round t uses exactly the samples of rounds
//!   t − mΔt, m = 0..=M, each with weight γ^m = θ^{mΔt} (App. C: γ = θ^Δt): M + 1 = 11 in
//!   warm-up (Δt = 1, M = 10), and M + 1 = 2 after it (M = 1). So the first fit after
//!   warm-up sees its own sample and the warm-up sample of round t − Δt, and none of the
//!   warm-up samples in between.
//! - **FedGP (seed 001, Alg. 2).** On a GP-training round a uniform selection K^r is trained
//!   and aggregated into the global model first (line 5, `ClientQuery::advance`, booked as
//!   trainings); its loss change is the round's sample; X is refitted (line 8); then the
//!   GP-selected clients train from the advanced model in the same round (lines 9–10).
//! - **Availability.** Losses are asked of available clients only; a sample covers the
//!   clients observed at both ends of its loss change, and the likelihood of a sample is
//!   the marginal of the GP over those clients (columns of X), which is exact for a GP.
//!
//! **Protocol `code`** ([`FedCorProtocol::Code`]): the authors' code (Yoruko-Tang/FedCor
//! at d941083) as the README's FMNIST command runs it (`--update_mean --group_size=100
//! --GPR_gamma=0.95`) differs from the text in four ways, all four taken under `code`:
//! - **Discounted mean.** With `--update_mean` each fit first sets the prior mean to the
//!   per-client discounted mean of the kept loss changes, μ_k = Σ_s γ^{t−e_s} Δl_{s,k} /
//!   Σ_s γ^{t−e_s} over the samples s that observed k (`GPR.MLE_Mean`, GPR.py:117-135,
//!   called by `Train` at GPR.py:152-153), and the likelihood is that of Δl − μ
//!   (`MultivariateNormal(loc = self.mu[idx], …)`, GPR.py:86). The selection reads Σ
//!   only (GPR.py:213), so μ changes the fit, not Alg. 1.
//! - **Window.** Every sample of the last `group_size` rounds is kept, warm-up samples
//!   included (`Update_Training_Data` drops a round e once e + group_size < t,
//!   GPR.py:50-52), each weighted γ^{t−e} with γ = θ per round of age and t the newest
//!   sample's round (GPR.py:155-163; federated_main.py:116 passes `group_size` and
//!   `GPR_gamma`).
//! - **One warm-up fit.** Every warm-up round still records its sample, but the GP is fitted
//!   once, on the last warm-up round's sample, for [`CODE_WARMUP_STEPS`] Adam steps
//!   (federated_main.py:282-289: with `--update_mean` only `epoch == args.warmup` trains,
//!   `max_epoches=1000`); GP-training rounds fit `steps` (`GPR_Epoch`, 100,
//!   federated_main.py:299).
//! - **Fit after the round's selection.** The code's round r (r a multiple of Δt past
//!   warm-up) selects with the GP and α as they stand, then probes from the model that
//!   round produced, resets α and fits (federated_main.py:180-182, 291-299): here the
//!   probe, reset and fit open round r + 1, anchored at r, and r's annealing is wiped by
//!   the reset as the code never applies it (its `Update_Discount` is in the `else`
//!   branch, federated_main.py:301-302).
//!
//! The likelihood uses the Woodbury identity, so each Adam step factors only the d × d
//! matrix K = σ_n² I + XXᵀ (Cholesky with jitter; a factorisation that still fails is an
//! error, never a NaN): Σ⁻¹y = (y − XᵀK⁻¹Xy)/σ_n², log|Σ| = (N−d) log σ_n² + log|K|, and
//! ∂NLL/∂X = (Σ_s w_s) K⁻¹X − Σ_s w_s (X a_s) a_sᵀ with a_s = Σ⁻¹y_s.
//!
//! **Cost per round** (N clients, embeddings d × N, K picks, S samples in a fit's window).
//! No N × N matrix is built ([`FedCor::sigma`] is for inspection only). The selection is
//! O(N d) for the prior's variances and Σp, then O(N (d + j)) for the j-th pick's column
//! of the conditioned Σ: O(N d + K N (d + K)) time and O(N (d + K)) memory. A round that
//! fits X adds, per Adam step and per group of samples over the same clients,
//! O(N d² + d³) for K and K⁻¹X, plus O(N d) per sample: O(steps · (N d² + S N d)) time
//! and O(N (d + S)) memory. The fit's cosine with the previous fit's Σ (Fig. 3) is
//! O(N d²), from d × d products.

use std::borrow::Cow;
use std::time::Instant;

use nalgebra::{DMatrix, DMatrixView, DVector, DVectorView};
use rand::seq::index::sample;
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::{ClientQuery, RoundContext, Selection, Selector, Setup};
use crate::error::{ConfigError, Error};
use crate::rng::Rng;
use crate::validate::{check, check_pos, check_prob};

/// Adam steps of protocol `code`'s one warm-up fit: a literal of the authors' code
/// (federated_main.py:289, `max_epoches=1000`), no flag of theirs.
pub const CODE_WARMUP_STEPS: usize = 1000;

/// Which FedCor the selector runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FedCorProtocol {
    /// The CVPR text: prior mean 0 (footnote 1), Eq. 17's window, a fit every warm-up round.
    Paper,
    /// The authors' code as their README runs it: the discounted mean, the window of every
    /// sample of the last `group_size` rounds, one warm-up fit (see the module docs).
    Code,
}

impl FedCorProtocol {
    /// Whether this is the default, which the resolved config leaves out so that configs
    /// from before the key keep their hash.
    fn is_paper(&self) -> bool {
        *self == Self::Paper
    }
}

/// `group_size`'s default, the README's `--group_size=100`.
const GROUP_SIZE: usize = 100;

fn is_default_group_size(g: &usize) -> bool {
    *g == GROUP_SIZE
}

/// FedCor (seed 000) and its FedGP variant (seed 001).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FedCorConfig {
    /// The paper's algorithm or the authors' code (see [`FedCorProtocol`]).
    #[serde(skip_serializing_if = "FedCorProtocol::is_paper")]
    pub protocol: FedCorProtocol,
    /// Under protocol `code`, the rounds of history a fit keeps (`--group_size`, 100 in
    /// the README); ignored under `paper`, whose window is `history_warmup` / `history`.
    #[serde(skip_serializing_if = "is_default_group_size")]
    pub group_size: usize,
    /// Embedding dimension d.
    pub dim: usize,
    /// Observation noise σ_n.
    pub noise: f64,
    /// Warm-up rounds R_w: rounds 0..=R_w select uniformly and train the GP every round.
    pub warmup: usize,
    /// GP-training interval Δt.
    pub interval: usize,
    /// Annealing coefficient β.
    pub beta: f64,
    /// Discount base θ; samples are weighted θ^(age in rounds), i.e. γ = θ^Δt per interval
    /// (protocol `code`: `--GPR_gamma`, 0.95 in the README).
    pub theta: f64,
    /// Past samples kept during warm-up (M in Eq. 17, warm-up phase); protocol `code`
    /// keeps `group_size` rounds instead.
    pub history_warmup: usize,
    /// Past GP-training samples kept after warm-up (M in Eq. 17); protocol `code` keeps
    /// `group_size` rounds instead.
    pub history: usize,
    /// Probe selections per GP-training round (S in Eq. 17).
    pub probes: usize,
    /// Adam steps per GP fit after warm-up.
    pub steps: usize,
    /// Adam steps per GP fit during warm-up; protocol `code` fits once, at the end of
    /// warm-up, for [`CODE_WARMUP_STEPS`].
    pub warmup_steps: usize,
    /// Adam learning rate of the embeddings.
    pub lr: f64,
}

impl Default for FedCorConfig {
    fn default() -> Self {
        Self {
            protocol: FedCorProtocol::Paper,
            group_size: GROUP_SIZE,
            dim: 15,
            noise: 0.01,
            warmup: 15,
            interval: 10,
            beta: 0.95,
            theta: 0.9,
            history_warmup: 10,
            history: 1,
            probes: 1,
            steps: 100,
            warmup_steps: 150,
            lr: 0.01,
        }
    }
}

impl FedCorConfig {
    /// Rejects values no run can use, naming the key: the `selection.fedcor` part of
    /// [`Config::validate`](crate::config::Config::validate).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        check(self.dim > 0, "selection.fedcor.dim", "must be at least 1")?;
        check_pos(self.noise, "selection.fedcor.noise")?;
        check(
            self.interval > 0,
            "selection.fedcor.interval",
            "must be at least 1",
        )?;
        check_prob(self.beta, "selection.fedcor.beta", true, false)?;
        check_prob(self.theta, "selection.fedcor.theta", true, false)?;
        check(
            self.probes > 0,
            "selection.fedcor.probes",
            "must be at least 1",
        )?;
        check_pos(self.lr, "selection.fedcor.lr")
    }
}

/// Which paper's Algorithm 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// FedCor: probe selections on GP-training rounds.
    FedCor,
    /// FedGP: the real round of a GP-training round is uniform and is the sample.
    FedGp,
}

/// One observed vector of loss changes.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Sample {
    /// Round the change belongs to.
    pub round: usize,
    /// The clients observed, ascending.
    pub clients: Vec<usize>,
    /// Δl of each of those clients.
    pub dl: Vec<f64>,
}

/// Held-out losses of the global model at the start of a round.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Losses {
    round: usize,
    clients: Vec<usize>,
    values: Vec<f64>,
}

/// Diagnostics of one GP fit.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FitRecord {
    /// Round the fit is anchored at (Eq. 17's t).
    pub round: usize,
    /// Samples used.
    pub samples: usize,
    /// The rounds of those samples, newest first.
    pub sample_rounds: Vec<usize>,
    /// Their weights γ^m.
    pub sample_weights: Vec<f64>,
    /// Adam steps.
    pub steps: usize,
    /// Negative discounted log-likelihood before and after.
    pub nll_before: f64,
    /// After the fit.
    pub nll_after: f64,
    /// Cosine similarity of Σ with Σ at the previous fit (FedCor Fig. 3).
    pub sigma_cosine_prev: Option<f64>,
    /// Wall-clock milliseconds of the fit.
    pub fit_ms: f64,
}

/// The FedCor / FedGP selector.
#[derive(Debug, Clone)]
pub struct FedCor {
    cfg: FedCorConfig,
    variant: Variant,
    p: Vec<f64>,
    x: DMatrix<f64>,
    alpha: Vec<f64>,
    samples: Vec<Sample>,
    /// Losses at the start of the last round that opened a sample.
    last_losses: Option<Losses>,
    fits: Vec<FitRecord>,
    /// X at the previous fit, for the cosine of the two Σ.
    prev_x: Option<DMatrix<f64>>,
    select_ms: f64,
    /// X as it stood at the end of warm-up (FedCor Fig. 7 shows these).
    x_warmup: Option<DMatrix<f64>>,
}

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

fn err(round: usize, reason: String) -> Error {
    Error::Selection {
        selector: "fedcor".into(),
        round,
        reason,
    }
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

/// Σ = XᵀX + σ_n² I conditioned on the clients picked so far (Eq. 11), never built as an
/// N × N matrix. After j picks Σ⁽ʲ⁾ = Σ⁽⁰⁾ − Σ_{l<j} c_l c_lᵀ / v_l, where c_l and v_l are
/// the column and variance Σ⁽ˡ⁾_{·k_l}, Σ⁽ˡ⁾_{k_l k_l} of the l-th pick when it was picked:
/// a column costs O(N(d + j)), and the two things the scores read, the variances diag Σ
/// and the weighted sums Σp (Eq. 12's Σ_i p_i Σ_ik, Σ being symmetric), are downdated in
/// O(N) per pick.
#[derive(Debug, Clone)]
struct Posterior<'a> {
    x: &'a DMatrix<f64>,
    noise_var: f64,
    p: &'a [f64],
    /// c_0, c_1, …: N values each.
    cols: Vec<f64>,
    /// v_0, v_1, …
    pivots: Vec<f64>,
    /// Σ_kk of the current Σ.
    var: Vec<f64>,
    /// (Σp)_k of the current Σ.
    sp: Vec<f64>,
}

impl<'a> Posterior<'a> {
    /// The prior Σ⁽⁰⁾ = XᵀX + σ_n² I: its diagonal, and Σ⁽⁰⁾p = Xᵀ(Xp) + σ_n² p.
    fn new(x: &'a DMatrix<f64>, noise_var: f64, p: &'a [f64]) -> Self {
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
    fn column(&self, k: usize) -> Vec<f64> {
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
    fn select(&mut self, alpha: &[f64], candidates: &[usize], m: usize) -> Vec<usize> {
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
fn sigma_cosine(a: &DMatrix<f64>, b: &DMatrix<f64>, s2: f64) -> f64 {
    let n = a.ncols() as f64;
    let inner = |x: &DMatrix<f64>, y: &DMatrix<f64>| {
        (x * y.transpose()).norm_squared()
            + s2 * (x.norm_squared() + y.norm_squared())
            + n * s2 * s2
    };
    inner(a, b) / (inner(a, a).sqrt() * inner(b, b).sqrt())
}

impl FedCor {
    /// A selector with the given settings.
    pub fn new(cfg: FedCorConfig, variant: Variant) -> Self {
        Self {
            cfg,
            variant,
            p: Vec::new(),
            x: DMatrix::zeros(0, 0),
            alpha: Vec::new(),
            samples: Vec::new(),
            last_losses: None,
            fits: Vec::new(),
            prev_x: None,
            select_ms: 0.0,
            x_warmup: None,
        }
    }

    /// The current covariance Σ = XᵀX + σ_n² I, N × N: for inspection at small N (the
    /// selection and the fits never build it).
    pub fn sigma(&self) -> DMatrix<f64> {
        let n = self.x.ncols();
        self.x.transpose() * &self.x + DMatrix::identity(n, n) * self.cfg.noise.powi(2)
    }

    /// The embeddings (d × N).
    pub fn embeddings(&self) -> &DMatrix<f64> {
        &self.x
    }

    /// The GP fits so far.
    pub fn fits(&self) -> &[FitRecord] {
        &self.fits
    }

    fn warm(&self, t: usize) -> bool {
        t <= self.cfg.warmup
    }

    /// Eq. 17's samples for a fit anchored at round `t`, as (index, weight γ^m) newest
    /// first: the samples of rounds t − mΔt for m = 0..=M, weighted θ^{mΔt}. Warm-up fits
    /// use Δt = 1 and the warm-up M (§5.1, App. C).
    /// Under protocol `code`, every sample of age at most `group_size`, weighted θ^age
    /// (GPR.py:50-52, 155-163).
    fn window(&self, t: usize) -> Vec<(usize, f64)> {
        // Every dt-th round back, up to max_age rounds old.
        let (dt, max_age) = if self.cfg.protocol == FedCorProtocol::Code {
            (1, self.cfg.group_size)
        } else if self.warm(t) {
            (1, self.cfg.history_warmup)
        } else {
            (
                self.cfg.interval,
                self.cfg.history.saturating_mul(self.cfg.interval),
            )
        };
        let mut picked: Vec<(usize, f64)> = self
            .samples
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let age = t.checked_sub(s.round)?;
                (age.is_multiple_of(dt) && age <= max_age)
                    .then(|| (i, self.cfg.theta.powi(age as i32)))
            })
            .collect();
        picked.sort_by_key(|&(i, _)| std::cmp::Reverse(self.samples[i].round));
        picked
    }

    /// Protocol `code`'s prior mean over the weighted `window`: per client, the weighted
    /// mean of its loss changes over the samples that observed it, and 0 for a client no
    /// sample observed (`GPR.MLE_Mean`, GPR.py:117-135; its 1e-6 guard leaves 0/1e-6 = 0).
    pub fn discounted_mean(&self, window: &[(usize, f64)]) -> Vec<f64> {
        let n = self.p.len();
        let mut sum = vec![0.0; n];
        let mut total = vec![0.0; n];
        for &(i, w) in window {
            let s = &self.samples[i];
            for (&k, &dl) in s.clients.iter().zip(&s.dl) {
                sum[k] += w * dl;
                total[k] += w;
            }
        }
        sum.iter()
            .zip(&total)
            .map(|(&s, &w)| if w > 0.0 { s / w } else { 0.0 })
            .collect()
    }

    /// Trains X with Adam on Eq. 17's window for round `anchor` (protocol `code`: on the
    /// code's window, centred on [`FedCor::discounted_mean`]), then forgets the samples no
    /// later window can use.
    pub fn fit(&mut self, anchor: usize, steps: usize) -> Result<(), Error> {
        let started = Instant::now();
        let window = self.window(anchor);
        let code = self.cfg.protocol == FedCorProtocol::Code;
        // Δl − μ over each sample's clients: the likelihood with prior mean μ (GPR.py:86).
        let centred: Vec<Vec<f64>> = if code {
            let mu = self.discounted_mean(&window);
            window
                .iter()
                .map(|&(i, _)| {
                    let s = &self.samples[i];
                    s.clients
                        .iter()
                        .zip(&s.dl)
                        .map(|(&k, &d)| d - mu[k])
                        .collect()
                })
                .collect()
        } else {
            Vec::new()
        };
        let data: Vec<Observation<'_>> = window
            .iter()
            .enumerate()
            .map(|(j, &(i, weight))| Observation {
                weight,
                clients: &self.samples[i].clients,
                dl: if code {
                    &centred[j]
                } else {
                    &self.samples[i].dl
                },
            })
            .collect();
        let (b1, b2, eps, lr): (f64, f64, f64, f64) = (0.9, 0.999, 1e-8, self.cfg.lr);
        let mut m: DMatrix<f64> = DMatrix::zeros(self.x.nrows(), self.x.ncols());
        let mut v = m.clone();
        let mut nll_before = f64::NAN;
        for step in 1..=steps {
            let (nll, g) =
                nll_and_grad(&self.x, self.cfg.noise, &data).map_err(|e| err(anchor, e))?;
            if step == 1 {
                nll_before = nll;
            }
            let c1 = 1.0 - b1.powi(step as i32);
            let c2 = 1.0 - b2.powi(step as i32);
            // Adam, in place and in parallel chunks: each entry as the matrix expressions
            // m ← m β₁ + g (1 − β₁), v ← v β₂ + g² (1 − β₂),
            // x ← x − lr (m/c₁) / (√(v/c₂) + ε) compute it.
            const CHUNK: usize = 4096;
            self.x
                .as_mut_slice()
                .par_chunks_mut(CHUNK)
                .zip(m.as_mut_slice().par_chunks_mut(CHUNK))
                .zip(v.as_mut_slice().par_chunks_mut(CHUNK))
                .zip(g.as_slice().par_chunks(CHUNK))
                .for_each(|(((xs, ms), vs), gs)| {
                    for (((xv, mv), vv), &gv) in xs.iter_mut().zip(ms).zip(vs).zip(gs) {
                        *mv = *mv * b1 + gv * (1.0 - b1);
                        *vv = *vv * b2 + (gv * gv) * (1.0 - b2);
                        *xv -= lr * (*mv / c1) / ((*vv / c2).sqrt() + eps);
                    }
                });
        }
        let nll_after = nll_and_grad(&self.x, self.cfg.noise, &data)
            .map_err(|e| err(anchor, e))?
            .0;
        let s2 = self.cfg.noise.powi(2);
        let sigma_cosine_prev = self.prev_x.as_ref().map(|p| sigma_cosine(p, &self.x, s2));
        self.prev_x = Some(self.x.clone());
        self.fits.push(FitRecord {
            round: anchor,
            samples: window.len(),
            sample_rounds: window.iter().map(|&(i, _)| self.samples[i].round).collect(),
            sample_weights: window.iter().map(|&(_, w)| w).collect(),
            steps,
            nll_before,
            nll_after,
            sigma_cosine_prev,
            fit_ms: started.elapsed().as_secs_f64() * 1e3,
        });
        let keep = if code {
            self.cfg.group_size
        } else {
            self.cfg
                .history_warmup
                .max(self.cfg.history * self.cfg.interval)
        };
        self.samples
            .retain(|s| s.round.saturating_add(keep) >= anchor);
        Ok(())
    }

    /// A uniform draw of K_t among the available clients (warm-up, probes, FedGP's K^r).
    fn uniform(ctx: &RoundContext<'_>, rng: &mut Rng) -> Vec<usize> {
        let m = ctx.budget.min(ctx.available.len());
        sample(rng, ctx.available.len(), m)
            .into_iter()
            .map(|i| ctx.available[i])
            .collect()
    }

    /// Stores Δl = after − before of round `round` over the clients in both (ascending) lists.
    fn record_change(&mut self, round: usize, before: &Losses, clients: &[usize], after: &[f64]) {
        let (mut i, mut j) = (0, 0);
        let mut sample = Sample {
            round,
            clients: Vec::new(),
            dl: Vec::new(),
        };
        while i < before.clients.len() && j < clients.len() {
            match before.clients[i].cmp(&clients[j]) {
                std::cmp::Ordering::Less => i += 1,
                std::cmp::Ordering::Greater => j += 1,
                std::cmp::Ordering::Equal => {
                    sample.clients.push(clients[j]);
                    sample.dl.push(after[j] - before.values[i]);
                    i += 1;
                    j += 1;
                }
            }
        }
        self.samples.push(sample);
    }
}

impl Selector for FedCor {
    fn name(&self) -> &'static str {
        match self.variant {
            Variant::FedCor => "fedcor",
            Variant::FedGp => "fedgp",
        }
    }

    fn setup(&mut self, setup: &Setup) {
        self.p = setup.weights.clone();
        self.alpha = vec![1.0; setup.sizes.len()];
    }

    fn select(
        &mut self,
        ctx: &RoundContext<'_>,
        query: &mut dyn ClientQuery,
        rng: &mut Rng,
    ) -> Result<Selection, Error> {
        let t = ctx.round;
        let n = self.p.len();
        if self.x.is_empty() {
            // X ~ N(0, 1)/√d, drawn from this round's selection stream.
            let d = self.cfg.dim;
            let scale = 1.0 / (d as f64).sqrt();
            self.x = DMatrix::from_fn(d, n, |_, _| {
                let z: f64 = StandardNormal.sample(rng);
                z * scale
            });
        }
        let warm = self.warm(t);
        // The round a GP-training sample and fit belong to. Protocol `code` selects round
        // r with the GP as it stands and trains the GP at the end of r when r is a multiple
        // of Δt past warm-up (federated_main.py:180-182, then 291-299): here, at the start
        // of round r + 1, from the same model w^{r+1}, anchored at r.
        let (gp_round, anchor) = match self.cfg.protocol {
            FedCorProtocol::Paper => (!warm && t.is_multiple_of(self.cfg.interval), t),
            FedCorProtocol::Code => {
                let r = t.saturating_sub(1);
                (
                    !warm && r > self.cfg.warmup && r.is_multiple_of(self.cfg.interval),
                    r,
                )
            }
        };
        // The current model's losses close the previous warm-up round's sample, and open
        // this round's sample in warm-up and on GP-training rounds.
        let closes = t > 0
            && self.warm(t - 1)
            && self.last_losses.as_ref().is_some_and(|l| l.round + 1 == t);
        if closes || warm || gp_round {
            let losses = query.holdout_losses(ctx.available)?;
            if closes {
                let before = self.last_losses.take().expect("checked above");
                self.record_change(t - 1, &before, ctx.available, &losses);
                match self.cfg.protocol {
                    FedCorProtocol::Paper => self.fit(t - 1, self.cfg.warmup_steps)?,
                    // federated_main.py:284-289: one fit, on the last warm-up round.
                    FedCorProtocol::Code if t - 1 == self.cfg.warmup => {
                        self.fit(t - 1, CODE_WARMUP_STEPS)?
                    }
                    FedCorProtocol::Code => {}
                }
                if t == self.cfg.warmup + 1 {
                    self.x_warmup = Some(self.x.clone());
                }
            }
            self.last_losses = (warm || gp_round).then(|| Losses {
                round: t,
                clients: ctx.available.to_vec(),
                values: losses,
            });
        }
        if warm {
            return Ok(Selection {
                clients: Self::uniform(ctx, rng),
                weights: None,
            });
        }
        if gp_round {
            let before = self.last_losses.take().expect("set above");
            match self.variant {
                Variant::FedCor => {
                    for _ in 0..self.cfg.probes {
                        let probe = Self::uniform(ctx, rng);
                        let after = query.probe(&probe, &before.clients)?;
                        self.record_change(anchor, &before, &before.clients, &after);
                    }
                }
                Variant::FedGp => {
                    let k_r = Self::uniform(ctx, rng);
                    let after = query.advance(&k_r, &before.clients)?;
                    self.record_change(anchor, &before, &before.clients, &after);
                }
            }
            self.alpha.iter_mut().for_each(|a| *a = 1.0);
            self.fit(anchor, self.cfg.steps)?;
        }
        let started = Instant::now();
        let m = ctx.budget.min(ctx.available.len());
        let chosen = greedy_select(
            &self.x,
            self.cfg.noise.powi(2),
            &self.p,
            &self.alpha,
            ctx.available,
            m,
        );
        for &k in &chosen {
            self.alpha[k] *= self.cfg.beta;
        }
        self.select_ms += started.elapsed().as_secs_f64() * 1e3;
        Ok(Selection {
            clients: chosen,
            weights: None,
        })
    }

    fn save(&self) -> serde_json::Value {
        serde_json::json!({
            "x": self.x.as_slice(),
            "d": self.x.nrows(),
            "alpha": self.alpha,
            "samples": self.samples,
            "last_losses": self.last_losses,
            "fits": self.fits,
            "prev_x": self.prev_x.as_ref().map(|x| x.as_slice().to_vec()),
            "select_ms": self.select_ms,
            "x_warmup": self.x_warmup.as_ref().map(|x| x.as_slice().to_vec()),
        })
    }

    fn load(&mut self, s: &serde_json::Value) -> Result<(), Error> {
        let bad = |e: serde_json::Error| err(0, format!("checkpoint state: {e}"));
        let d: usize = serde_json::from_value(s["d"].clone()).map_err(bad)?;
        let x: Vec<f64> = serde_json::from_value(s["x"].clone()).map_err(bad)?;
        let n = self.p.len();
        let name = self.name();
        if !x.is_empty() {
            super::check_loaded(name, "embedding values", x.len(), d * n)?;
        }
        self.x = if x.is_empty() {
            DMatrix::zeros(0, 0)
        } else {
            DMatrix::from_column_slice(d, n, &x)
        };
        self.alpha = serde_json::from_value(s["alpha"].clone()).map_err(bad)?;
        super::check_loaded(name, "weights α_k", self.alpha.len(), n)?;
        self.samples = serde_json::from_value(s["samples"].clone()).map_err(bad)?;
        for sample in &self.samples {
            super::check_loaded(
                name,
                "Δl values of a sample",
                sample.dl.len(),
                sample.clients.len(),
            )?;
            if let Some(&k) = sample.clients.iter().find(|&&k| k >= n) {
                super::check_loaded(name, "clients (one a sample names)", k + 1, n)?;
            }
        }
        self.last_losses = serde_json::from_value(s["last_losses"].clone()).map_err(bad)?;
        self.fits = serde_json::from_value(s["fits"].clone()).map_err(bad)?;
        if !s["prev_sigma"].is_null() {
            return Err(err(
                0,
                "checkpoint state: it holds the previous fit's N × N covariance, as fedsel \
                 before the low-rank selection wrote it, where the previous fit's embeddings \
                 are expected; resume it with that version or start the run over"
                    .into(),
            ));
        }
        let prev: Option<Vec<f64>> = serde_json::from_value(s["prev_x"].clone()).map_err(bad)?;
        if let Some(p) = &prev {
            super::check_loaded(name, "previous fit's embedding values", p.len(), d * n)?;
        }
        self.prev_x = prev.map(|p| DMatrix::from_column_slice(d, n, &p));
        self.select_ms = serde_json::from_value(s["select_ms"].clone()).map_err(bad)?;
        let xw: Option<Vec<f64>> = serde_json::from_value(s["x_warmup"].clone()).map_err(bad)?;
        if let Some(x) = &xw {
            super::check_loaded(name, "warm-up embedding values", x.len(), d * n)?;
        }
        self.x_warmup = xw.map(|x| DMatrix::from_column_slice(d, n, &x));
        Ok(())
    }

    fn reports(&self) -> Vec<(String, String)> {
        let table = |x: &DMatrix<f64>| {
            let mut out = String::from("client");
            for j in 0..x.nrows() {
                out.push_str(&format!(",x{j}"));
            }
            out.push('\n');
            for k in 0..x.ncols() {
                out.push_str(&k.to_string());
                for j in 0..x.nrows() {
                    out.push_str(&format!(",{:.6}", x[(j, k)]));
                }
                out.push('\n');
            }
            out
        };
        let mut fits = String::from(
            "round,samples,sample_rounds,sample_weights,steps,nll_before,nll_after,sigma_cosine_prev,fit_ms\n",
        );
        let joined = |v: Vec<String>| v.join(";");
        for f in &self.fits {
            fits.push_str(&format!(
                "{},{},{},{},{},{:.4},{:.4},{},{:.3}\n",
                f.round,
                f.samples,
                joined(f.sample_rounds.iter().map(|r| r.to_string()).collect()),
                joined(f.sample_weights.iter().map(|w| format!("{w:.6}")).collect()),
                f.steps,
                f.nll_before,
                f.nll_after,
                f.sigma_cosine_prev
                    .map_or(String::new(), |c| format!("{c:.6}")),
                f.fit_ms
            ));
        }
        let fit_ms: f64 = self.fits.iter().map(|f| f.fit_ms).sum();
        let timing = format!(
            "gp_fit_ms,selection_ms\n{fit_ms:.3},{:.3}\n",
            self.select_ms
        );
        let mut files = vec![
            ("embeddings.csv".into(), table(&self.x)),
            ("gp_fits.csv".into(), fits),
            ("selector_time.csv".into(), timing),
        ];
        if let Some(x) = &self.x_warmup {
            files.push(("embeddings_warmup.csv".into(), table(x)));
        }
        files
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Purpose, stream};

    fn nrm(rng: &mut Rng) -> f64 {
        StandardNormal.sample(rng)
    }

    /// Alg. 1 as it stood before the low-rank [`Posterior`], the reference the tests compare
    /// with: Σ built N × N, each score summed down Σ's column, Eq. 11 applied to the whole
    /// matrix. Returns the picks and the conditioned Σ.
    fn reference_greedy(
        mut sigma: DMatrix<f64>,
        p: &[f64],
        alpha: &[f64],
        candidates: &[usize],
        m: usize,
    ) -> (Vec<usize>, DMatrix<f64>) {
        let n = p.len();
        let mut left: Vec<usize> = candidates.to_vec();
        let mut picked = Vec::with_capacity(m);
        while picked.len() < m && !left.is_empty() {
            let mut best: Option<(usize, f64)> = None;
            for (j, &k) in left.iter().enumerate() {
                let var = sigma[(k, k)];
                let score = if var > 1e-300 {
                    alpha[k] * (0..n).map(|i| p[i] * sigma[(i, k)]).sum::<f64>() / var.sqrt()
                } else {
                    f64::NEG_INFINITY
                };
                if best.is_none_or(|b| score > b.1) {
                    best = Some((j, score));
                }
            }
            let (j, _) = best.expect("left is not empty");
            let k = left.remove(j);
            let var = sigma[(k, k)];
            if var > 1e-300 {
                let col = sigma.column(k).clone_owned();
                sigma -= (&col * col.transpose()) / var;
            }
            picked.push(k);
        }
        (picked, sigma)
    }

    /// The reference's Σ = XᵀX + σ_n² I.
    fn reference_sigma(x: &DMatrix<f64>, noise_var: f64) -> DMatrix<f64> {
        let n = x.ncols();
        x.transpose() * x + DMatrix::identity(n, n) * noise_var
    }

    /// The likelihood and gradient as plain nalgebra expressions, as they stood before
    /// [`nll_and_grad`] worked in place: the reference its results must equal bit for bit.
    fn reference_nll_and_grad(
        x: &DMatrix<f64>,
        noise: f64,
        samples: &[Observation<'_>],
    ) -> (f64, DMatrix<f64>) {
        let (d, n) = x.shape();
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
            let xs = x.select_columns(clients);
            let xxt = &xs * xs.transpose();
            let s2 = noise * noise;
            let chol = (&xxt + DMatrix::identity(d, d) * s2).cholesky().unwrap();
            let logdet_k: f64 = 2.0 * chol.l().diagonal().iter().map(|v| v.ln()).sum::<f64>();
            let logdet = (clients.len() as f64 - d as f64) * s2.ln() + logdet_k;
            let total_w: f64 = group.iter().map(|s| s.weight).sum();
            let mut g = chol.solve(&xs) * total_w;
            nll += 0.5 * total_w * logdet;
            for s in group {
                let y = DVector::from_column_slice(s.dl);
                let xy = &xs * &y;
                let a = (&y - xs.transpose() * chol.solve(&xy)) / s2;
                nll += 0.5 * s.weight * y.dot(&a);
                g -= (&xs * &a) * a.transpose() * s.weight;
            }
            for (c, &k) in clients.iter().enumerate() {
                let mut col = grad.column_mut(k);
                col += g.column(c);
            }
        }
        (nll, grad)
    }

    /// Adam on X as matrix expressions, as [`FedCor::fit`] ran it before working in place,
    /// on the reference likelihood.
    fn reference_adam(
        mut x: DMatrix<f64>,
        noise: f64,
        lr: f64,
        data: &[Observation<'_>],
        steps: usize,
    ) -> DMatrix<f64> {
        let (b1, b2, eps) = (0.9, 0.999, 1e-8);
        let mut m = DMatrix::zeros(x.nrows(), x.ncols());
        let mut v = m.clone();
        for step in 1..=steps {
            let (_, g) = reference_nll_and_grad(&x, noise, data);
            m = &m * b1 + &g * (1.0 - b1);
            v = &v * b2 + g.component_mul(&g) * (1.0 - b2);
            let c1 = 1.0 - b1.powi(step as i32);
            let c2 = 1.0 - b2.powi(step as i32);
            x -= (&m / c1).zip_map(&(&v / c2), |mh, vh| lr * mh / (vh.sqrt() + eps));
        }
        x
    }

    fn bits(m: &DMatrix<f64>) -> Vec<u64> {
        m.iter().map(|v| v.to_bits()).collect()
    }

    /// The in-place likelihood, gradient and Adam steps give the reference's bits: at
    /// d = 15 (the default; the back substitution's dot products reach eight terms, and
    /// the Gram matrix goes through the blocked matrix product) and d = 4 (the plain
    /// product), over 200 clients (several tiles and a partial one), with samples over
    /// every client (X read in place) and over a subset, and groups that share a factor.
    #[test]
    fn in_place_likelihood_and_adam_equal_the_reference_bit_for_bit() {
        // Past two of the per-column passes' chunks and the Adam step's, and not a
        // multiple of a solve tile, so that the parallel splits are exercised.
        let n = 700;
        let mut rng = stream(31, Purpose::Strategy, 0, 0);
        let all: Vec<usize> = (0..n).collect();
        let some: Vec<usize> = (0..n).filter(|k| k % 3 != 0).collect();
        let ys: Vec<Vec<f64>> = (0..4)
            .map(|s| {
                let len = if s == 2 { some.len() } else { n };
                (0..len).map(|_| 0.05 * nrm(&mut rng)).collect()
            })
            .collect();
        let data = [
            Observation {
                weight: 1.0,
                clients: &all,
                dl: &ys[0],
            },
            Observation {
                weight: 0.9,
                clients: &all,
                dl: &ys[1],
            },
            Observation {
                weight: 0.81,
                clients: &some,
                dl: &ys[2],
            },
            Observation {
                weight: 0.729,
                clients: &all,
                dl: &ys[3],
            },
        ];
        let pool = |threads| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
        };
        let (one, three) = (pool(1), pool(3));
        for d in [15, 4] {
            let x = DMatrix::from_fn(d, n, |_, _| nrm(&mut rng) / (d as f64).sqrt());
            let (want_nll, want_g) = reference_nll_and_grad(&x, 0.01, &data);
            for (threads, pool) in [(1, &one), (3, &three)] {
                let (nll, g) = pool.install(|| nll_and_grad(&x, 0.01, &data)).unwrap();
                assert_eq!(
                    nll.to_bits(),
                    want_nll.to_bits(),
                    "d = {d}, {threads} threads"
                );
                assert_eq!(bits(&g), bits(&want_g), "d = {d}, {threads} threads");
            }
            let cfg = FedCorConfig {
                dim: d,
                ..FedCorConfig::default()
            };
            let mut gp = FedCor::new(cfg.clone(), Variant::FedCor);
            gp.x = x.clone();
            for (round, o) in data.iter().enumerate() {
                gp.samples.push(Sample {
                    round: 3 - round,
                    clients: o.clients.to_vec(),
                    dl: o.dl.to_vec(),
                });
            }
            let mut serial = gp.clone();
            gp.fit(3, 20).unwrap();
            one.install(|| serial.fit(3, 20)).unwrap();
            assert_eq!(
                bits(&gp.x),
                bits(&serial.x),
                "d = {d}: one thread or several"
            );
            let weighted: Vec<Observation<'_>> = data
                .iter()
                .enumerate()
                .map(|(m, o)| Observation {
                    weight: cfg.theta.powi(m as i32),
                    ..*o
                })
                .collect();
            let want_x = reference_adam(x, cfg.noise, cfg.lr, &weighted, 20);
            assert_eq!(bits(&gp.x), bits(&want_x), "d = {d}");
        }
    }

    /// The reference's cosine of two N × N covariances, entry by entry.
    fn reference_cosine(a: &DMatrix<f64>, b: &DMatrix<f64>) -> f64 {
        a.dot(b) / (a.norm() * b.norm())
    }

    #[test]
    fn greedy_selection_follows_eq_12_and_13_on_three_clients() {
        // Clients 0 and 1 are strongly correlated, client 2 is independent: with σ_n² = 0.1
        // these embeddings give Σ = [[1, 0.9, 0], [0.9, 1, 0], [0, 0, 0.8]].
        let x = DMatrix::from_row_slice(
            2,
            3,
            &[0.9f64.sqrt(), 0.9f64.sqrt(), 0.0, 0.0, 0.0, 0.7f64.sqrt()],
        );
        let p = [0.4, 0.3, 0.3];
        // Eq. 12: Σ_i p_i Σ_ik / σ_k = 0.67, 0.66, 0.268 → client 0 first.
        // Eq. 11 conditioning leaves Σ_11 = 1 − 0.81 = 0.19 and Σ_01 = 0, so the second
        // scores are 0.3·0.19/√0.19 = 0.131 for client 1 and 0.268 for client 2 (Eq. 13's
        // redundancy penalty): client 2 second, although client 1 scored higher alone.
        assert_eq!(
            greedy_select(&x, 0.1, &p, &[1.0; 3], &[0, 1, 2], 2),
            vec![0, 2]
        );
        // Annealing α_0 = 0.5 halves client 0's score (0.335 < 0.66): client 1 first, then 2.
        assert_eq!(
            greedy_select(&x, 0.1, &p, &[0.5, 1.0, 1.0], &[0, 1, 2], 2),
            vec![1, 2]
        );
        // Only available clients are chosen.
        assert_eq!(greedy_select(&x, 0.1, &p, &[1.0; 3], &[1, 2], 1), vec![1]);
    }

    /// The low-rank greedy against the dense reference at N = 200, d = 15: 20 picks among
    /// 150 available clients (more than the rank d, where Σ is left near σ_n² I), unequal p
    /// and α, embeddings at the initial scale and at ten times it. The picks are the same.
    /// The conditioned Σ (every column), its diagonal and Σp, the state the next pick reads,
    /// agree to 1e-12 of the prior Σ's largest entry rather than bit for bit: the reference
    /// sums x_iᵀx_k in the matrix product's order and Eq. 12's Σ_i p_i Σ_ik down the
    /// conditioned column, where the low-rank form takes Σp = Xᵀ(Xp) + σ_n² p and downdates
    /// it, which is what makes a pick O(N) instead of O(N²), in another order of the same
    /// sums. Both round at the scale of the prior entries they subtract, so the bound is
    /// relative to those and not to the conditioned entries, which Eq. 11 brings down to
    /// about σ_n².
    #[test]
    fn low_rank_selection_matches_the_dense_reference_at_n_200() {
        let (n, d, m, noise_var) = (200, 15, 20, 1e-4);
        for (seed, scale) in [(11, 1.0), (12, 1.0), (13, 10.0)] {
            let mut rng = stream(seed, Purpose::Strategy, 0, 0);
            let x = DMatrix::from_fn(d, n, |_, _| nrm(&mut rng) * scale / (d as f64).sqrt());
            let w: Vec<f64> = (0..n).map(|_| 0.5 + nrm(&mut rng).abs()).collect();
            let p: Vec<f64> = w.iter().map(|v| v / w.iter().sum::<f64>()).collect();
            let alpha: Vec<f64> = (0..n).map(|k| 0.95f64.powi((k % 4) as i32)).collect();
            let candidates: Vec<usize> = (0..n).filter(|k| k % 4 != 1).collect();
            let prior = reference_sigma(&x, noise_var);
            let tol = 1e-12 * prior.amax();
            let (want, sigma) = reference_greedy(prior, &p, &alpha, &candidates, m);
            let mut post = Posterior::new(&x, noise_var, &p);
            assert_eq!(post.select(&alpha, &candidates, m), want, "seed {seed}");
            let sp = &sigma * DVector::from_column_slice(&p);
            for k in 0..n {
                let col = post.column(k);
                for i in 0..n {
                    assert!((col[i] - sigma[(i, k)]).abs() <= tol, "Σ_{i}{k}");
                }
                assert!((post.var[k] - sigma[(k, k)]).abs() <= tol, "Σ_{k}{k}");
                assert!((post.sp[k] - sp[k]).abs() <= tol, "(Σp)_{k}");
            }
        }
    }

    /// Held-out losses with a per-client level and fresh N(0, 0.05²) noise on every call.
    struct NoisyLosses(Rng);

    impl ClientQuery for NoisyLosses {
        fn holdout_losses(&mut self, clients: &[usize]) -> Result<Vec<f64>, Error> {
            Ok(clients
                .iter()
                .map(|&k| 1.0 + 0.01 * (k % 13) as f64 + 0.05 * nrm(&mut self.0))
                .collect())
        }
        fn minibatch_losses(&mut self, _: &[usize]) -> Result<Vec<f64>, Error> {
            unreachable!("FedCor asks for no mini-batch losses")
        }
        fn probe(&mut self, _: &[usize], evaluate: &[usize]) -> Result<Vec<f64>, Error> {
            self.holdout_losses(evaluate)
        }
        fn advance(&mut self, _: &[usize], evaluate: &[usize]) -> Result<Vec<f64>, Error> {
            self.holdout_losses(evaluate)
        }
    }

    /// The selector at N = 200 (weights p_k ∝ 1 + k mod 5) with the default settings through
    /// warm-up and two GP-training rounds, a seventh of the clients away each round: every
    /// GP round picks what the dense reference picks from the selector's own X and α (reset
    /// to 1 on a GP-training round), α is then annealed bit for bit as Alg. 2 line 14 says,
    /// and each fit's cosine with the previous fit's Σ (Fig. 3), now from d × d products,
    /// is the reference's entry-by-entry cosine of the two N × N matrices to 1e-12
    /// relative (the same sums in another order).
    #[test]
    fn the_selector_picks_as_the_dense_reference_at_n_200() {
        let (n, budget) = (200, 10);
        for variant in [Variant::FedCor, Variant::FedGp] {
            let cfg = FedCorConfig::default();
            let mut gp = FedCor::new(cfg.clone(), variant);
            let weights: Vec<f64> = (0..n).map(|k| (1 + k % 5) as f64 / 600.0).collect();
            gp.setup(&super::super::testing::setup(&weights));
            let mut q = NoisyLosses(stream(21, Purpose::Strategy, 0, 0));
            let mut fit_x: Option<DMatrix<f64>> = None;
            for t in 0..=cfg.warmup + 2 * cfg.interval {
                let available: Vec<usize> = (0..n).filter(|k| (k + t) % 7 != 0).collect();
                let ctx = RoundContext {
                    round: t,
                    available: &available,
                    budget,
                    clock_s: None,
                };
                let alpha = gp.alpha.clone();
                let mut rng = stream(22, Purpose::Selection, t as u64, 0);
                let fits = gp.fits.len();
                let sel = gp.select(&ctx, &mut q, &mut rng).unwrap().clients;
                if gp.fits.len() > fits {
                    let cosine = gp.fits.last().unwrap().sigma_cosine_prev;
                    match &fit_x {
                        Some(prev) => {
                            let s2 = cfg.noise.powi(2);
                            let want = reference_cosine(
                                &reference_sigma(prev, s2),
                                &reference_sigma(&gp.x, s2),
                            );
                            let got = cosine.unwrap();
                            assert!((got - want).abs() <= 1e-12 * want, "{got} vs {want}");
                        }
                        None => assert_eq!(cosine, None),
                    }
                    fit_x = Some(gp.x.clone());
                }
                if gp.warm(t) {
                    continue;
                }
                let alpha = if t.is_multiple_of(cfg.interval) {
                    vec![1.0; n]
                } else {
                    alpha
                };
                let sigma = reference_sigma(&gp.x, cfg.noise.powi(2));
                let (want, _) = reference_greedy(sigma, &gp.p, &alpha, &available, budget);
                assert_eq!(sel, want, "{variant:?} round {t}");
                let mut annealed = alpha;
                for &k in &want {
                    annealed[k] *= cfg.beta;
                }
                assert_eq!(gp.alpha, annealed, "{variant:?} round {t}");
            }
        }
    }

    /// Checks ∂NLL/∂X at `entries` against forward differences (σ_n = 0.3); returns the NLL.
    fn assert_gradient_matches_finite_differences(
        x: &DMatrix<f64>,
        data: &[Observation<'_>],
        entries: &[(usize, usize)],
    ) -> f64 {
        let (f0, g) = nll_and_grad(x, 0.3, data).unwrap();
        let h = 1e-6;
        for &(i, j) in entries {
            let mut xp = x.clone();
            xp[(i, j)] += h;
            let fd = (nll_and_grad(&xp, 0.3, data).unwrap().0 - f0) / h;
            assert!(
                (fd - g[(i, j)]).abs() < 1e-3 * (1.0 + fd.abs()),
                "{fd} vs {}",
                g[(i, j)]
            );
        }
        f0
    }

    #[test]
    fn gradient_matches_finite_differences() {
        let mut rng = stream(3, Purpose::Strategy, 0, 0);
        let x = DMatrix::from_fn(3, 6, |_, _| nrm(&mut rng));
        let y1: Vec<f64> = (0..6).map(|_| nrm(&mut rng)).collect();
        let y2: Vec<f64> = (0..6).map(|_| nrm(&mut rng)).collect();
        let all: Vec<usize> = (0..6).collect();
        let data = [
            Observation {
                weight: 1.0,
                clients: &all,
                dl: &y1,
            },
            Observation {
                weight: 0.5,
                clients: &all,
                dl: &y2,
            },
        ];
        let f0 = assert_gradient_matches_finite_differences(&x, &data, &[(0, 0), (2, 5), (1, 3)]);
        // And the value matches the dense formula ½ Σ_s w_s (log|Σ| + yᵀΣ⁻¹y).
        let sigma = x.transpose() * &x + DMatrix::identity(6, 6) * 0.09;
        let inv = sigma.clone().try_inverse().unwrap();
        let logdet = sigma.determinant().ln();
        let dense: f64 = data
            .iter()
            .map(|o| {
                let y = DVector::from_column_slice(o.dl);
                0.5 * o.weight * (logdet + y.dot(&(&inv * &y)))
            })
            .sum();
        assert!(
            (dense - f0).abs() < 1e-8 * dense.abs().max(1.0),
            "{dense} vs {f0}"
        );
    }

    /// 300 loss vectors from a rank-3 covariance over 20 clients plus N(0, 0.1²) noise,
    /// fitted with the paper's Adam lr 0.01 and d = 15 (the model's σ_n set to the planted
    /// 0.1: with σ_n = 0.01 on data this noisy the likelihood is too ill-conditioned for
    /// 1000 steps to settle).
    #[test]
    fn training_recovers_a_planted_low_rank_covariance() {
        let (n, d_true, samples) = (20, 3, 300);
        let mut rng = stream(5, Purpose::Strategy, 0, 0);
        let planted = DMatrix::from_fn(d_true, n, |_, _| nrm(&mut rng));
        let truth = planted.transpose() * &planted;
        let cfg = FedCorConfig {
            history_warmup: usize::MAX,
            warmup: 10,
            noise: 0.1,
            ..FedCorConfig::default()
        };
        let mut gp = FedCor::new(cfg, Variant::FedCor);
        gp.setup(&Setup {
            sizes: vec![1; n],
            weights: vec![1.0 / n as f64; n],
            per_round: 5,
            rounds: 10,
            num_params: 1,
            classes: 2,
            oracle_label_histograms: None,
            oracle_features: None,
            durations: None,
        });
        gp.x = DMatrix::from_fn(15, n, |_, _| nrm(&mut rng)) / 15f64.sqrt();
        for _ in 0..samples {
            let z: DVector<f64> = DVector::from_fn(d_true, |_, _| nrm(&mut rng));
            let y: DVector<f64> =
                planted.transpose() * z + DVector::from_fn(n, |_, _| 0.1 * nrm(&mut rng));
            gp.samples.push(Sample {
                round: 0,
                clients: (0..n).collect(),
                dl: y.as_slice().to_vec(),
            });
        }
        gp.fit(0, 1000).unwrap();
        let learned = gp.sigma();
        let (a, b): (Vec<f64>, Vec<f64>) = (0..n)
            .flat_map(|i| (0..n).map(move |j| (i, j)))
            .map(|(i, j)| (truth[(i, j)], learned[(i, j)]))
            .unzip();
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let (ma, mb) = (mean(&a), mean(&b));
        let cov: f64 = a.iter().zip(&b).map(|(x, y)| (x - ma) * (y - mb)).sum();
        let corr = cov
            / (a.iter().map(|x| (x - ma).powi(2)).sum::<f64>().sqrt()
                * b.iter().map(|y| (y - mb).powi(2)).sum::<f64>().sqrt());
        eprintln!("correlation of learned vs planted Σ entries: {corr:.4}");
        assert!(
            corr >= 0.9,
            "correlation of learned vs planted Σ entries: {corr}"
        );
        let fit = gp.fits().last().unwrap();
        assert!(fit.nll_after < fit.nll_before);
    }

    /// A query that records every call, checks it names only available clients, and
    /// returns losses that fall by 0.01 with every held-out evaluation call, so each
    /// warm-up loss change is exactly −0.01; a probe or extra step lowers them by 0.05.
    struct Recorder {
        available: Vec<usize>,
        calls: Vec<(usize, &'static str, Vec<usize>, Vec<usize>)>,
        round: usize,
        evals: usize,
    }

    impl Recorder {
        fn losses(&self, clients: &[usize], drop: f64) -> Vec<f64> {
            clients
                .iter()
                .map(|&k| 1.0 + 0.1 * k as f64 - 0.01 * self.evals as f64 - drop)
                .collect()
        }
        fn check(&self, clients: &[usize]) {
            for k in clients {
                assert!(
                    self.available.contains(k),
                    "round {}: asked unavailable client {k}",
                    self.round
                );
            }
        }
    }

    impl ClientQuery for Recorder {
        fn holdout_losses(&mut self, clients: &[usize]) -> Result<Vec<f64>, Error> {
            self.check(clients);
            self.calls
                .push((self.round, "holdout", clients.to_vec(), Vec::new()));
            let l = self.losses(clients, 0.0);
            self.evals += 1;
            Ok(l)
        }
        fn minibatch_losses(&mut self, _: &[usize]) -> Result<Vec<f64>, Error> {
            unreachable!("FedCor asks for no mini-batch losses")
        }
        fn probe(&mut self, clients: &[usize], evaluate: &[usize]) -> Result<Vec<f64>, Error> {
            self.check(clients);
            self.check(evaluate);
            self.calls
                .push((self.round, "probe", clients.to_vec(), evaluate.to_vec()));
            Ok(self.losses(evaluate, 0.05 - 0.01))
        }
        fn advance(&mut self, clients: &[usize], evaluate: &[usize]) -> Result<Vec<f64>, Error> {
            self.check(clients);
            self.check(evaluate);
            self.calls
                .push((self.round, "advance", clients.to_vec(), evaluate.to_vec()));
            Ok(self.losses(evaluate, 0.05 - 0.01))
        }
    }

    /// Warm-up R_w = 3, Δt = 5, warm-up M = 2, M = 1, S = 2 probes, θ = 0.5, β = 0.5, six
    /// clients, two per round; client 5 is away in rounds 2, 7 and 10.
    fn drive(variant: Variant, rounds: usize) -> (FedCor, Recorder, Vec<Vec<usize>>) {
        drive_with(FedCorConfig::default(), variant, rounds)
    }

    /// [`drive`] with `base`'s protocol and `group_size`.
    fn drive_with(
        base: FedCorConfig,
        variant: Variant,
        rounds: usize,
    ) -> (FedCor, Recorder, Vec<Vec<usize>>) {
        let cfg = FedCorConfig {
            protocol: base.protocol,
            group_size: base.group_size,
            dim: 2,
            warmup: 3,
            interval: 5,
            history_warmup: 2,
            history: 1,
            probes: 2,
            steps: 3,
            warmup_steps: 3,
            theta: 0.5,
            beta: 0.5,
            ..FedCorConfig::default()
        };
        let n = 6;
        let mut gp = FedCor::new(cfg, variant);
        gp.setup(&Setup {
            sizes: vec![10; n],
            weights: vec![1.0 / n as f64; n],
            per_round: 2,
            rounds,
            num_params: 1,
            classes: 2,
            oracle_label_histograms: None,
            oracle_features: None,
            durations: None,
        });
        let mut q = Recorder {
            available: Vec::new(),
            calls: Vec::new(),
            round: 0,
            evals: 0,
        };
        let mut picks = Vec::new();
        for t in 0..rounds {
            q.round = t;
            q.available = if [2, 7, 10].contains(&t) {
                (0..5).collect()
            } else {
                (0..6).collect()
            };
            let available = q.available.clone();
            let ctx = RoundContext {
                round: t,
                available: &available,
                budget: 2,
                clock_s: None,
            };
            let mut rng = stream(9, Purpose::Selection, t as u64, 0);
            let sel = gp.select(&ctx, &mut q, &mut rng).unwrap().clients;
            assert_eq!(sel.len(), 2);
            assert!(sel.iter().all(|k| available.contains(k)));
            picks.push(sel);
        }
        (gp, q, picks)
    }

    fn calls_in(q: &Recorder, t: usize) -> Vec<&'static str> {
        q.calls.iter().filter(|c| c.0 == t).map(|c| c.1).collect()
    }

    /// Rounds `asking` ask every available client's loss once, rounds `silent` ask
    /// nothing, and GP-training rounds `probing` ask the losses and then S = 2 probes.
    fn assert_round_calls(q: &Recorder, asking: &[usize], silent: &[usize], probing: &[usize]) {
        for &t in asking {
            assert_eq!(calls_in(q, t), vec!["holdout"], "round {t}");
        }
        for &t in silent {
            assert!(calls_in(q, t).is_empty(), "round {t}");
        }
        for &t in probing {
            assert_eq!(
                calls_in(q, t),
                vec!["holdout", "probe", "probe"],
                "round {t}"
            );
        }
    }

    #[test]
    fn fedcor_rounds_follow_warm_up_then_algorithm_2_with_eq_17_windows() {
        let (gp, q, _) = drive(Variant::FedCor, 12);
        // Warm-up rounds 0..=3 and the round that closes round 3's sample each ask every
        // available client once; rounds 6..=9 and 11 ask nothing; GP-training rounds 5 and
        // 10 probe two uniformly drawn available clients, each evaluated on the available.
        assert_round_calls(&q, &[0, 1, 2, 3, 4], &[6, 7, 8, 9, 11], &[5, 10]);
        for t in [5, 10] {
            for c in q.calls.iter().filter(|c| c.0 == t && c.1 == "probe") {
                assert_eq!(c.2.len(), 2);
                assert_eq!(c.3, q.calls.iter().find(|d| d.0 == t).unwrap().2);
            }
        }
        // Client 5 was away in round 10: that round's probes neither train nor evaluate it.
        assert!(
            q.calls
                .iter()
                .filter(|c| c.0 == 10)
                .all(|c| !c.2.contains(&5) && !c.3.contains(&5))
        );
        // Warm-up fits are anchored at rounds 0..=3 with M + 1 = 3 samples once there are
        // enough, weighted θ^m; the GP-training fits use exactly rounds t and t − Δt:
        // the first one keeps warm-up round 0 and none of warm-up rounds 1..=3 (Eq. 17).
        let fits: Vec<(usize, Vec<usize>, Vec<f64>)> = gp
            .fits
            .iter()
            .map(|f| (f.round, f.sample_rounds.clone(), f.sample_weights.clone()))
            .collect();
        assert_eq!(
            fits,
            vec![
                (0, vec![0], vec![1.0]),
                (1, vec![1, 0], vec![1.0, 0.5]),
                (2, vec![2, 1, 0], vec![1.0, 0.5, 0.25]),
                (3, vec![3, 2, 1], vec![1.0, 0.5, 0.25]),
                (5, vec![5, 5, 0], vec![1.0, 1.0, 0.5f64.powi(5)]),
                (
                    10,
                    vec![10, 10, 5, 5],
                    vec![1.0, 1.0, 0.5f64.powi(5), 0.5f64.powi(5)]
                ),
            ]
        );
        // Each warm-up loss change is exactly −0.01 per client (losses fall with every
        // evaluation), over the clients available at both ends: client 5, away in
        // round 2, is missing from the samples of rounds 1 and 2.
        for s in gp.samples.iter().filter(|s| s.round <= 3) {
            assert!(s.dl.iter().all(|d| (d + 0.01).abs() < 1e-12), "{s:?}");
            let expected: Vec<usize> = if [1, 2].contains(&s.round) {
                (0..5).collect()
            } else {
                (0..6).collect()
            };
            assert_eq!(s.clients, expected, "round {}", s.round);
        }
        // A probe's change is its model's losses minus the round's: −0.05 each.
        for s in gp.samples.iter().filter(|s| s.round >= 5) {
            assert!(s.dl.iter().all(|d| (d + 0.05).abs() < 1e-12), "{s:?}");
        }
    }

    /// Protocol `code` on [`drive`]'s run with `group_size` = 6: the warm-up records a sample
    /// every round but fits once, at its last round, for 1000 steps on all four warm-up
    /// samples; rounds 5 and 10 select with the GP as it stands and rounds 6 and 11 open
    /// with their probes and fit, anchored at 5 and 10; each of those fits keeps every
    /// sample of age ≤ 6, warm-up ones included, weighted θ^age (GPR.py:50-52, 155-163;
    /// federated_main.py:180-182, 282-299).
    #[test]
    fn code_protocol_fits_once_in_warm_up_and_keeps_every_sample_of_the_window() {
        let code = FedCorConfig {
            protocol: FedCorProtocol::Code,
            group_size: 6,
            ..FedCorConfig::default()
        };
        let (gp, q, _) = drive_with(code, Variant::FedCor, 12);
        assert_round_calls(&q, &[0, 1, 2, 3, 4], &[5, 7, 8, 9, 10], &[6, 11]);
        let fits: Vec<(usize, usize, Vec<usize>, Vec<f64>)> = gp
            .fits
            .iter()
            .map(|f| {
                (
                    f.round,
                    f.steps,
                    f.sample_rounds.clone(),
                    f.sample_weights.clone(),
                )
            })
            .collect();
        let h = |m: i32| 0.5f64.powi(m);
        assert_eq!(
            fits,
            vec![
                (
                    3,
                    CODE_WARMUP_STEPS,
                    vec![3, 2, 1, 0],
                    vec![1.0, h(1), h(2), h(3)]
                ),
                (
                    5,
                    3,
                    vec![5, 5, 3, 2, 1, 0],
                    vec![1.0, 1.0, h(2), h(3), h(4), h(5)]
                ),
                (10, 3, vec![10, 10, 5, 5], vec![1.0, 1.0, h(5), h(5)]),
            ]
        );
        assert!(gp.x_warmup.is_some());
        // Round 3 (age 7 at round 10) and older are forgotten.
        assert!(gp.samples.iter().all(|s| s.round >= 5));
    }

    /// The discounted mean by hand (θ = 0.5, `group_size` = 2, anchored at round 3): round
    /// 0 is too old; client 0 saw 1, 2, 4 in rounds 1, 2, 3, so μ_0 = (¼·1 + ½·2 + 1·4) /
    /// (¼ + ½ + 1) = 3; client 1 saw 6 and 0 in rounds 1 and 3, so μ_1 = (¼·6) / (¼ + 1) =
    /// 1.2; client 2 was never observed, μ_2 = 0 (GPR.py:117-135). The fit's likelihood is
    /// that of the centred changes (GPR.py:86).
    #[test]
    fn code_protocol_centres_the_changes_on_their_discounted_mean() {
        let cfg = FedCorConfig {
            protocol: FedCorProtocol::Code,
            group_size: 2,
            theta: 0.5,
            dim: 2,
            ..FedCorConfig::default()
        };
        let mut gp = FedCor::new(cfg, Variant::FedCor);
        gp.setup(&super::super::testing::setup(&[1.0 / 3.0; 3]));
        gp.x = DMatrix::from_column_slice(2, 3, &[0.3, -0.1, 0.2, 0.4, -0.5, 0.1]);
        let sample = |round: usize, clients: &[usize], dl: &[f64]| Sample {
            round,
            clients: clients.to_vec(),
            dl: dl.to_vec(),
        };
        gp.samples = vec![
            sample(0, &[0, 1], &[100.0, 100.0]),
            sample(1, &[0, 1], &[1.0, 6.0]),
            sample(2, &[0], &[2.0]),
            sample(3, &[0, 1], &[4.0, 0.0]),
        ];
        let window = gp.window(3);
        assert_eq!(window, vec![(3, 1.0), (2, 0.5), (1, 0.25)]);
        let mu = gp.discounted_mean(&window);
        assert_eq!(mu[0], 3.0);
        assert!((mu[1] - 1.2).abs() < 1e-15, "{mu:?}");
        assert_eq!(mu[2], 0.0);
        let (y3, y2, y1) = ([1.0, 0.0 - mu[1]], [-1.0], [-2.0, 6.0 - mu[1]]);
        let data = [
            Observation {
                weight: 1.0,
                clients: &[0, 1],
                dl: &y3,
            },
            Observation {
                weight: 0.5,
                clients: &[0],
                dl: &y2,
            },
            Observation {
                weight: 0.25,
                clients: &[0, 1],
                dl: &y1,
            },
        ];
        let expected = nll_and_grad(&gp.x, gp.cfg.noise, &data).unwrap().0;
        gp.fit(3, 1).unwrap();
        assert_eq!(gp.fits[0].nll_before, expected);
        assert_eq!(gp.fits[0].sample_rounds, vec![3, 2, 1]);
        assert!(gp.samples.iter().all(|s| s.round >= 1));
    }

    /// Protocol `paper` pinned: the picks, the embeddings and every fit's likelihoods of
    /// [`drive`]'s FedCor and FedGP runs, as fedsel computed them before protocol `code`
    /// existed (FNV-1a over their bits).
    #[test]
    fn paper_protocol_runs_are_bit_identical_to_before_the_code_protocol() {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |v: u64| {
            for b in v.to_le_bytes() {
                h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
            }
        };
        for (variant, rounds) in [(Variant::FedCor, 12), (Variant::FedGp, 11)] {
            let (gp, _, picks) = drive(variant, rounds);
            picks.iter().flatten().for_each(|&k| eat(k as u64));
            gp.x.iter().for_each(|v| eat(v.to_bits()));
            for f in &gp.fits {
                eat(f.nll_before.to_bits());
                eat(f.nll_after.to_bits());
            }
        }
        assert_eq!(h, 0xb2df_01d4_b291_8104, "{h:#018x}");
    }

    #[test]
    fn annealing_multiplies_by_beta_and_gp_rounds_reset_it() {
        let (gp, _, picks) = drive(Variant::FedCor, 12);
        // α was reset at round 10 and then annealed by rounds 10 and 11 only.
        let mut expected = [1.0; 6];
        for t in [10, 11] {
            for &k in &picks[t] {
                expected[k] *= 0.5;
            }
        }
        assert_eq!(gp.alpha, expected);
        // Without the reset α would carry the picks of rounds 5..=9 too.
        let (gp, _, picks) = drive(Variant::FedCor, 10);
        let mut expected = [1.0; 6];
        for &k in picks[5..10].iter().flatten() {
            expected[k] *= 0.5;
        }
        assert_eq!(gp.alpha, expected);
    }

    #[test]
    fn fedgp_trains_the_uniform_selection_then_the_gp_selection_in_one_round() {
        let (gp, q, _) = drive(Variant::FedGp, 11);
        // FedGP Alg. 2: on a GP-training round the uniform K^r advances the model (no
        // probe), X is refitted on its loss change, and the GP selection is returned.
        for t in [5, 10] {
            assert_eq!(calls_in(&q, t), vec!["holdout", "advance"], "round {t}");
        }
        assert!(q.calls.iter().all(|c| c.1 != "probe"));
        // Post-warm-up fits use M + 1 = 2 samples: rounds t and t − Δt.
        let post: Vec<(usize, Vec<usize>)> = gp
            .fits
            .iter()
            .filter(|f| f.round > 3)
            .map(|f| (f.round, f.sample_rounds.clone()))
            .collect();
        assert_eq!(post, vec![(5, vec![5, 0]), (10, vec![10, 5])]);
    }

    #[test]
    fn default_warm_up_fits_use_eleven_samples() {
        let cfg = FedCorConfig::default();
        let n = 4;
        let mut gp = FedCor::new(
            FedCorConfig {
                warmup_steps: 1,
                ..cfg.clone()
            },
            Variant::FedCor,
        );
        gp.setup(&super::super::testing::setup(&[0.25; 4]));
        let mut q = Recorder {
            available: (0..n).collect(),
            calls: Vec::new(),
            round: 0,
            evals: 0,
        };
        let all: Vec<usize> = (0..n).collect();
        for t in 0..=cfg.warmup + 1 {
            q.round = t;
            let ctx = RoundContext {
                round: t,
                available: &all,
                budget: 1,
                clock_s: None,
            };
            gp.select(
                &ctx,
                &mut q,
                &mut stream(1, Purpose::Selection, t as u64, 0),
            )
            .unwrap();
        }
        let last = gp.fits.last().unwrap();
        assert_eq!(last.round, cfg.warmup);
        assert_eq!(last.samples, cfg.history_warmup + 1);
        assert_eq!(last.sample_rounds, (5..=15).rev().collect::<Vec<_>>());
    }

    #[test]
    fn a_partial_sample_is_scored_by_the_marginal_over_its_clients() {
        let mut rng = stream(4, Purpose::Strategy, 0, 0);
        let x = DMatrix::from_fn(3, 6, |_, _| nrm(&mut rng));
        let clients = [1usize, 3, 4];
        let y: Vec<f64> = (0..3).map(|_| nrm(&mut rng)).collect();
        let data = [Observation {
            weight: 0.7,
            clients: &clients,
            dl: &y,
        }];
        let (f0, g) = nll_and_grad(&x, 0.3, &data).unwrap();
        // The value is ½ w (log|Σ_SS| + yᵀ Σ_SS⁻¹ y) with Σ_SS = X_SᵀX_S + σ²I.
        let xs = x.select_columns(&clients);
        let sigma = xs.transpose() * &xs + DMatrix::identity(3, 3) * 0.09;
        let yv = DVector::from_column_slice(&y);
        let dense =
            0.5 * 0.7 * (sigma.determinant().ln() + yv.dot(&(sigma.try_inverse().unwrap() * &yv)));
        assert!(
            (dense - f0).abs() < 1e-9 * dense.abs().max(1.0),
            "{dense} vs {f0}"
        );
        // Unobserved clients' embeddings get no gradient; observed ones match finite
        // differences.
        for k in [0, 2, 5] {
            assert!(g.column(k).iter().all(|&v| v == 0.0));
        }
        assert_gradient_matches_finite_differences(&x, &data, &[(0, 1), (2, 4), (1, 3)]);
    }

    #[test]
    fn a_checkpoint_with_the_dense_covariance_is_refused_and_the_embeddings_round_trip() {
        let (gp, _, _) = drive(Variant::FedCor, 12);
        let state = gp.save();
        let mut back = FedCor::new(gp.cfg.clone(), Variant::FedCor);
        back.setup(&super::super::testing::setup(&[1.0 / 6.0; 6]));
        back.load(&state).unwrap();
        assert_eq!(back.prev_x, gp.prev_x);
        assert!(back.prev_x.is_some());
        let mut old = state.clone();
        old["prev_sigma"] = serde_json::json!(vec![0.0; 36]);
        let e = back.load(&old).unwrap_err().to_string();
        assert!(e.contains("covariance"), "{e}");
    }
}

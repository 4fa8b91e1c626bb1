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

use std::time::Instant;

use nalgebra::DMatrix;
use rand::seq::index::sample;
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::{ClientQuery, RoundContext, Selection, Selector, Setup};
use crate::error::{ConfigError, Error};
use crate::rng::Rng;
use crate::validate::{check, check_pos, check_prob};

mod likelihood;
mod posterior;

pub use likelihood::{Observation, nll_and_grad};
pub use posterior::greedy_select;
use posterior::sigma_cosine;

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

fn err(round: usize, reason: String) -> Error {
    Error::Selection {
        selector: "fedcor".into(),
        round,
        reason,
    }
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
mod tests;

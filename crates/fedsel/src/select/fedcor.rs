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
//! - **Warm-up (decisions.md).** Rounds 0..=R_w select uniformly; every round's own loss
//!   change over all N clients (held-out loss after − before) is one GP sample, and the
//!   GP is trained each warm-up round. GP selection starts at round R_w + 1.
//! - **GP-training rounds (Alg. 2 lines 3–11).** When t % Δt = 0 after warm-up, S probe
//!   selections are drawn uniformly and trained from w^t; the probe models' losses on all
//!   clients give S samples and the probes are discarded (`ClientQuery::probe`, booked as
//!   probe trainings). X is then trained with Adam, warm-started from X^{t−1}, on the
//!   discounted likelihood Φ_t (Eq. 16–17): samples older than M intervals are dropped and
//!   a sample of age a rounds has weight θ^a (γ = θ^Δt per interval).
//! - **FedGP.** On a GP-training round the real round is the uniformly sampled one and its
//!   own loss change is the sample (FedGP Alg. 2 lines 4–5): no probe is trained.
//!
//! The likelihood uses the Woodbury identity, so each Adam step factors only the d × d
//! matrix K = σ_n² I + XXᵀ (Cholesky with jitter; a factorisation that still fails is an
//! error, never a NaN): Σ⁻¹y = (y − XᵀK⁻¹Xy)/σ_n², log|Σ| = (N−d) log σ_n² + log|K|, and
//! ∂NLL/∂X = (Σ_s w_s) K⁻¹X − Σ_s w_s (X a_s) a_sᵀ with a_s = Σ⁻¹y_s.

use std::time::Instant;

use nalgebra::{DMatrix, DVector};
use rand::seq::index::sample;
use rand_distr::{Distribution, StandardNormal};

use super::{ClientQuery, RoundContext, Selection, Selector, Setup};
use crate::config::FedCorConfig;
use crate::error::Error;
use crate::rng::Rng;

/// Which paper's Algorithm 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// FedCor: probe selections on GP-training rounds.
    FedCor,
    /// FedGP: the real round of a GP-training round is uniform and is the sample.
    FedGp,
}

/// One observed vector of loss changes over all clients.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Sample {
    /// Round the change belongs to.
    pub round: usize,
    /// Δl for every client.
    pub dl: Vec<f64>,
}

/// Diagnostics of one GP fit.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FitRecord {
    /// Round of the fit.
    pub round: usize,
    /// Samples used.
    pub samples: usize,
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
    /// Held-out losses of all clients under the global model of a round.
    last_losses: Option<(usize, Vec<f64>)>,
    fits: Vec<FitRecord>,
    prev_sigma: Option<DMatrix<f64>>,
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

/// The negative discounted log-likelihood (without the constant) and its gradient in X.
pub fn nll_and_grad(
    x: &DMatrix<f64>,
    noise: f64,
    samples: &[(f64, &[f64])],
) -> Result<(f64, DMatrix<f64>), String> {
    let (d, n) = x.shape();
    let s2 = noise * noise;
    let xxt = x * x.transpose();
    let mut jitter = 0.0;
    let chol = loop {
        let k = &xxt + DMatrix::identity(d, d) * (s2 + jitter);
        if let Some(c) = k.cholesky() {
            break c;
        }
        jitter = if jitter == 0.0 { 1e-10 } else { jitter * 10.0 };
        if jitter > 1e-2 {
            return Err("Cholesky of σ²I + XXᵀ failed even with jitter 1e-2".into());
        }
    };
    let logdet_k: f64 = 2.0 * chol.l().diagonal().iter().map(|v| v.ln()).sum::<f64>();
    let logdet = (n as f64 - d as f64) * (s2 + jitter).ln() + logdet_k;
    let kinv_x = chol.solve(x);
    let total_w: f64 = samples.iter().map(|s| s.0).sum();
    let mut grad = &kinv_x * total_w;
    let mut nll = 0.5 * total_w * logdet;
    for &(w, y) in samples {
        let y = DVector::from_column_slice(y);
        let xy = x * &y;
        let a = (&y - x.transpose() * chol.solve(&xy)) / (s2 + jitter);
        nll += 0.5 * w * y.dot(&a);
        let xa = x * &a;
        grad -= (xa * a.transpose()) * w;
    }
    if !nll.is_finite() || grad.iter().any(|g| !g.is_finite()) {
        return Err("the GP likelihood is not finite".into());
    }
    Ok((nll, grad))
}

/// Greedy posterior selection (Alg. 1): `m` picks among `candidates` from covariance `sigma`.
pub fn greedy_select(
    mut sigma: DMatrix<f64>,
    p: &[f64],
    alpha: &[f64],
    candidates: &[usize],
    m: usize,
) -> Vec<usize> {
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
    picked
}

fn cosine(a: &DMatrix<f64>, b: &DMatrix<f64>) -> f64 {
    a.dot(b) / (a.norm() * b.norm())
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
            prev_sigma: None,
            select_ms: 0.0,
            x_warmup: None,
        }
    }

    /// The current covariance Σ = XᵀX + σ_n² I.
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

    /// Trains X with Adam on the stored samples, as of round `now`.
    pub fn fit(&mut self, now: usize, steps: usize) -> Result<(), Error> {
        let started = Instant::now();
        let keep = if self.warm(now) {
            self.cfg.history_warmup
        } else {
            self.cfg.history * self.cfg.interval
        };
        self.samples.retain(|s| now - s.round <= keep);
        let weights: Vec<f64> = self
            .samples
            .iter()
            .map(|s| self.cfg.theta.powi((now - s.round) as i32))
            .collect();
        let data: Vec<(f64, &[f64])> = weights
            .iter()
            .copied()
            .zip(self.samples.iter().map(|s| s.dl.as_slice()))
            .collect();
        let (b1, b2, eps, lr) = (0.9, 0.999, 1e-8, self.cfg.lr);
        let mut m = DMatrix::zeros(self.x.nrows(), self.x.ncols());
        let mut v = m.clone();
        let mut nll_before = f64::NAN;
        for step in 1..=steps {
            let (nll, g) = nll_and_grad(&self.x, self.cfg.noise, &data).map_err(|e| err(now, e))?;
            if step == 1 {
                nll_before = nll;
            }
            m = &m * b1 + &g * (1.0 - b1);
            v = &v * b2 + g.component_mul(&g) * (1.0 - b2);
            let c1 = 1.0 - b1.powi(step as i32);
            let c2 = 1.0 - b2.powi(step as i32);
            self.x -= (&m / c1).zip_map(&(&v / c2), |mh, vh| lr * mh / (vh.sqrt() + eps));
        }
        let nll_after = nll_and_grad(&self.x, self.cfg.noise, &data)
            .map_err(|e| err(now, e))?
            .0;
        let sigma = self.sigma();
        let sigma_cosine_prev = self.prev_sigma.as_ref().map(|p| cosine(p, &sigma));
        self.prev_sigma = Some(sigma);
        self.fits.push(FitRecord {
            round: now,
            samples: data.len(),
            steps,
            nll_before,
            nll_after,
            sigma_cosine_prev,
            fit_ms: started.elapsed().as_secs_f64() * 1e3,
        });
        Ok(())
    }

    fn uniform(ctx: &RoundContext<'_>, rng: &mut Rng) -> Vec<usize> {
        let m = ctx.budget.min(ctx.available.len());
        sample(rng, ctx.available.len(), m)
            .into_iter()
            .map(|i| ctx.available[i])
            .collect()
    }

    /// Records Δl = `after` − the losses stored for round `round`, if any.
    fn record_change(&mut self, round: usize, after: &[f64]) {
        if let Some((r, before)) = &self.last_losses
            && *r == round
        {
            let dl = after.iter().zip(before).map(|(a, b)| a - b).collect();
            self.samples.push(Sample { round, dl });
        }
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
        let all: Vec<usize> = (0..n).collect();
        if self.x.is_empty() {
            // X ~ N(0, 1)/√d, drawn from this round's selection stream.
            let d = self.cfg.dim;
            let scale = 1.0 / (d as f64).sqrt();
            self.x = DMatrix::from_fn(d, n, |_, _| {
                let z: f64 = StandardNormal.sample(rng);
                z * scale
            });
        }
        let gp_round = !self.warm(t) && t.is_multiple_of(self.cfg.interval);
        // Losses of the current model are needed to close the previous round's sample
        // (warm-up; FedGP after a GP round) and to start this round's sample.
        let closes = self.last_losses.as_ref().is_some_and(|(r, _)| *r + 1 == t);
        if self.warm(t) || closes || gp_round {
            let losses = query.holdout_losses(&all)?;
            if closes {
                self.record_change(t - 1, &losses);
                let steps = if self.warm(t - 1) {
                    self.cfg.warmup_steps
                } else {
                    self.cfg.steps
                };
                self.fit(t, steps)?;
                if t == self.cfg.warmup + 1 {
                    self.x_warmup = Some(self.x.clone());
                }
            }
            self.last_losses = Some((t, losses));
        }
        if !self.warm(t) && !gp_round {
            // After warm-up only GP-training rounds produce samples.
            self.last_losses = None;
        }
        if self.warm(t) {
            return Ok(Selection {
                clients: Self::uniform(ctx, rng),
                weights: None,
            });
        }
        if gp_round {
            self.alpha.iter_mut().for_each(|a| *a = 1.0);
            match self.variant {
                Variant::FedCor => {
                    let before = self.last_losses.as_ref().expect("set above").1.clone();
                    for _ in 0..self.cfg.probes {
                        let m = ctx.budget.min(n);
                        let probe: Vec<usize> = sample(rng, n, m).into_vec();
                        let after = query.probe(&probe)?;
                        let dl = after.iter().zip(&before).map(|(a, b)| a - b).collect();
                        self.samples.push(Sample { round: t, dl });
                    }
                    self.last_losses = None;
                    self.fit(t, self.cfg.steps)?;
                }
                Variant::FedGp => {
                    return Ok(Selection {
                        clients: Self::uniform(ctx, rng),
                        weights: None,
                    });
                }
            }
        }
        let started = Instant::now();
        let m = ctx.budget.min(ctx.available.len());
        let chosen = greedy_select(self.sigma(), &self.p, &self.alpha, ctx.available, m);
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
            "prev_sigma": self.prev_sigma.as_ref().map(|s| s.as_slice().to_vec()),
            "select_ms": self.select_ms,
            "x_warmup": self.x_warmup.as_ref().map(|x| x.as_slice().to_vec()),
        })
    }

    fn load(&mut self, s: &serde_json::Value) -> Result<(), Error> {
        let bad = |e: serde_json::Error| err(0, format!("checkpoint state: {e}"));
        let d: usize = serde_json::from_value(s["d"].clone()).map_err(bad)?;
        let x: Vec<f64> = serde_json::from_value(s["x"].clone()).map_err(bad)?;
        let n = self.p.len();
        self.x = if x.is_empty() {
            DMatrix::zeros(0, 0)
        } else {
            DMatrix::from_column_slice(d, n, &x)
        };
        self.alpha = serde_json::from_value(s["alpha"].clone()).map_err(bad)?;
        self.samples = serde_json::from_value(s["samples"].clone()).map_err(bad)?;
        self.last_losses = serde_json::from_value(s["last_losses"].clone()).map_err(bad)?;
        self.fits = serde_json::from_value(s["fits"].clone()).map_err(bad)?;
        let prev: Option<Vec<f64>> =
            serde_json::from_value(s["prev_sigma"].clone()).map_err(bad)?;
        self.prev_sigma = prev.map(|p| DMatrix::from_column_slice(n, n, &p));
        self.select_ms = serde_json::from_value(s["select_ms"].clone()).map_err(bad)?;
        let xw: Option<Vec<f64>> = serde_json::from_value(s["x_warmup"].clone()).map_err(bad)?;
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
        let mut fits =
            String::from("round,samples,steps,nll_before,nll_after,sigma_cosine_prev,fit_ms\n");
        for f in &self.fits {
            fits.push_str(&format!(
                "{},{},{},{:.4},{:.4},{},{:.3}\n",
                f.round,
                f.samples,
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

    #[test]
    fn greedy_selection_follows_eq_12_and_13_on_three_clients() {
        // Clients 0 and 1 are strongly correlated, client 2 is independent.
        let sigma = DMatrix::from_row_slice(3, 3, &[1.0, 0.9, 0.0, 0.9, 1.0, 0.0, 0.0, 0.0, 0.8]);
        let p = [0.4, 0.3, 0.3];
        // Eq. 12: Σ_i p_i Σ_ik / σ_k = 0.67, 0.66, 0.268 → client 0 first.
        // Eq. 11 conditioning leaves Σ_11 = 1 − 0.81 = 0.19 and Σ_01 = 0, so the second
        // scores are 0.3·0.19/√0.19 = 0.131 for client 1 and 0.268 for client 2 (Eq. 13's
        // redundancy penalty): client 2 second, although client 1 scored higher alone.
        assert_eq!(
            greedy_select(sigma.clone(), &p, &[1.0; 3], &[0, 1, 2], 2),
            vec![0, 2]
        );
        // Annealing α_0 = 0.5 halves client 0's score (0.335 < 0.66): client 1 first, then 2.
        assert_eq!(
            greedy_select(sigma.clone(), &p, &[0.5, 1.0, 1.0], &[0, 1, 2], 2),
            vec![1, 2]
        );
        // Only available clients are chosen.
        assert_eq!(greedy_select(sigma, &p, &[1.0; 3], &[1, 2], 1), vec![1]);
    }

    #[test]
    fn gradient_matches_finite_differences() {
        let mut rng = stream(3, Purpose::Strategy, 0, 0);
        let x = DMatrix::from_fn(3, 6, |_, _| nrm(&mut rng));
        let y1: Vec<f64> = (0..6).map(|_| nrm(&mut rng)).collect();
        let y2: Vec<f64> = (0..6).map(|_| nrm(&mut rng)).collect();
        let data = [(1.0, y1.as_slice()), (0.5, y2.as_slice())];
        let (f0, g) = nll_and_grad(&x, 0.3, &data).unwrap();
        let h = 1e-6;
        for (i, j) in [(0, 0), (2, 5), (1, 3)] {
            let mut xp = x.clone();
            xp[(i, j)] += h;
            let fd = (nll_and_grad(&xp, 0.3, &data).unwrap().0 - f0) / h;
            assert!(
                (fd - g[(i, j)]).abs() < 1e-3 * (1.0 + fd.abs()),
                "{fd} vs {}",
                g[(i, j)]
            );
        }
        // And the value matches the dense formula ½ Σ_s w_s (log|Σ| + yᵀΣ⁻¹y).
        let sigma = x.transpose() * &x + DMatrix::identity(6, 6) * 0.09;
        let inv = sigma.clone().try_inverse().unwrap();
        let logdet = sigma.determinant().ln();
        let dense: f64 = data
            .iter()
            .map(|(w, y)| {
                let y = DVector::from_column_slice(y);
                0.5 * w * (logdet + y.dot(&(&inv * &y)))
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
        });
        gp.x = DMatrix::from_fn(15, n, |_, _| nrm(&mut rng)) / 15f64.sqrt();
        for _ in 0..samples {
            let z: DVector<f64> = DVector::from_fn(d_true, |_, _| nrm(&mut rng));
            let y: DVector<f64> =
                planted.transpose() * z + DVector::from_fn(n, |_, _| 0.1 * nrm(&mut rng));
            gp.samples.push(Sample {
                round: 0,
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
}

//! FedCor's tests: the likelihood and the posterior against dense references, and the
//! selector's rounds, protocols and checkpoints.

use nalgebra::DVector;

use super::posterior::Posterior;
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

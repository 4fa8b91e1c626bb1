//! Synthetic(α, β), the FedProx generator (Li et al. 2020; FedGS and F3AST
//! use it too).
//!
//! Per user k: n_k = ⌊LogNormal(4, 2)⌋ + 50; u_k ~ N(0, α²), B_k ~ N(0, β²)
//! (α and β are standard deviations, as in the authors' script);
//! v_k[j] ~ N(B_k, 1); W_k, b_k ~ N(u_k, 1) elementwise;
//! x ~ N(v_k, diag(j^−1.2)); y = argmax(x W_k + b_k).
//! Draws happen in the script's order (all sizes, all u, all B, all v, then
//! each user's W, b, X), from one seeded stream.

use rand::seq::SliceRandom;
use rand_distr::{Distribution, LogNormal, Normal, StandardNormal};

use super::numpy_legacy::RandomState;
use super::{Dataset, FederatedData, Inputs};
use crate::rng::{Purpose, stream};

fn normal(rng: &mut crate::rng::Rng) -> f64 {
    StandardNormal.sample(rng)
}

/// Parameters of the generator.
#[derive(Debug, Clone)]
pub struct SyntheticSpec {
    /// Std of u_k.
    pub alpha: f64,
    /// Std of B_k.
    pub beta: f64,
    /// Number of users.
    pub users: usize,
    /// Input dimension d.
    pub dim: usize,
    /// Number of classes C.
    pub classes: usize,
    /// Fraction of each user's samples that goes to the global test set.
    pub test_fraction: f64,
    /// Seed.
    pub seed: u64,
}

/// Generates the data; each user's train part becomes one natural client.
pub fn generate(spec: &SyntheticSpec) -> FederatedData {
    let mut rng = stream(spec.seed, Purpose::Dataset, 0, 0);
    let (d, c) = (spec.dim, spec.classes);
    let sizes_dist = LogNormal::<f64>::new(4.0, 2.0).expect("valid log-normal");
    let sizes: Vec<usize> = (0..spec.users)
        .map(|_| sizes_dist.sample(&mut rng).floor() as usize + 50)
        .collect();
    let u: Vec<f64> = (0..spec.users)
        .map(|_| spec.alpha * normal(&mut rng))
        .collect();
    let b_mean: Vec<f64> = (0..spec.users)
        .map(|_| spec.beta * normal(&mut rng))
        .collect();
    let v: Vec<Vec<f64>> = b_mean
        .iter()
        .map(|&bk| {
            let n = Normal::new(bk, 1.0).expect("valid normal");
            (0..d).map(|_| n.sample(&mut rng)).collect()
        })
        .collect();
    let diag_std: Vec<f64> = (1..=d).map(|j| (j as f64).powf(-1.2).sqrt()).collect();

    let mut train_x = Vec::new();
    let mut train_y = Vec::new();
    let mut test_x = Vec::new();
    let mut test_y = Vec::new();
    let mut users = Vec::with_capacity(spec.users);
    let mut user_models = Vec::with_capacity(spec.users);
    for k in 0..spec.users {
        let wn = Normal::new(u[k], 1.0).expect("valid normal");
        let w: Vec<f64> = (0..d * c).map(|_| wn.sample(&mut rng)).collect();
        let b: Vec<f64> = (0..c).map(|_| wn.sample(&mut rng)).collect();
        let mut samples: Vec<(Vec<f32>, u32)> = (0..sizes[k])
            .map(|_| {
                let x: Vec<f64> = (0..d)
                    .map(|j| v[k][j] + diag_std[j] * normal(&mut rng))
                    .collect();
                let y = (0..c)
                    .map(|cls| b[cls] + (0..d).map(|j| x[j] * w[j * c + cls]).sum::<f64>())
                    .enumerate()
                    .fold((0, f64::NEG_INFINITY), |best, (i, s)| {
                        if s > best.1 { (i, s) } else { best }
                    })
                    .0 as u32;
                (x.into_iter().map(|e| e as f32).collect(), y)
            })
            .collect();
        samples.shuffle(&mut rng);
        let n_test = ((spec.test_fraction * sizes[k] as f64).ceil() as usize).min(sizes[k] - 1);
        let n_train = sizes[k] - n_test;
        let start = train_y.len();
        for (x, y) in samples.drain(..n_train) {
            train_x.extend(x);
            train_y.push(y);
        }
        users.push((start..train_y.len()).collect());
        user_models.push(w.iter().chain(&b).copied().collect());
        for (x, y) in samples {
            test_x.extend(x);
            test_y.push(y);
        }
    }
    FederatedData {
        name: format!("synthetic({},{})", spec.alpha, spec.beta),
        train: dense(train_x, train_y, d, c),
        test: dense(test_x, test_y, d, c),
        users: Some(users),
        user_models: Some(user_models),
        user_holdout: None,
    }
}

/// The FedGS authors' Synthetic task, as their easyFL program
/// (`benchmark/synthetic_regression/core.py` of WwZzz/FedGS, `dist_id` 10, after
/// `np.random.seed(97 + seed)` in `benchmark/toolkits.py`) makes it, draw for draw on
/// numpy's legacy stream ([`RandomState`]): W_global and b_global (drawn, unused), u_k ~
/// N(0, α²) for all users, every W_k ~ N(u_k, 1) (60 × 10, row-major), every b_k ~ N(u_k, 1),
/// B_k ~ N(0, β²), every v_k ~ N(B_k, 1), sizes ⌊LogNormal(4, 2)⌋ + 50, then per user
/// X ~ N(v_k, diag(j^−1.2)) (numpy's `multivariate_normal`, whose SVD of this diagonal,
/// decreasing Σ is the identity, so x_j = √Σ_jj·z_j + v_kj) and y = argmax softmax(x W_k +
/// b_k), numpy's argmax (the first maximum; the first NaN if an exponential overflows).
/// Each user's examples are split by position: the first ⌊0.75 n⌋ train, up to ⌊0.9 n⌋
/// held out (the program's validation part), the rest pooled into the test set. With
/// seed 0 this is `synthetic_regression_cnum30_dist10_skew0.5_seed0`, on which the FedGS
/// tables were run (`tests::the_authors_task_is_numpys`).
pub fn generate_easyfl(spec: &SyntheticSpec) -> FederatedData {
    let seed = u32::try_from(97 + spec.seed).expect("validated: 97 + data_seed < 2^32");
    let mut r = RandomState::new(seed);
    let (d, c, n) = (spec.dim, spec.classes, spec.users);
    r.normals(0.0, 1.0, d * c);
    r.normals(0.0, 1.0, c);
    let u = r.normals(0.0, spec.alpha, n);
    let w: Vec<Vec<f64>> = u.iter().map(|&uk| r.normals(uk, 1.0, d * c)).collect();
    let b: Vec<Vec<f64>> = u.iter().map(|&uk| r.normals(uk, 1.0, c)).collect();
    let b_mean = r.normals(0.0, spec.beta, n);
    let v: Vec<Vec<f64>> = b_mean.iter().map(|&bk| r.normals(bk, 1.0, d)).collect();
    let sizes: Vec<usize> = (0..n)
        .map(|_| r.lognormal(4.0, 2.0) as usize + 50)
        .collect();
    let scale: Vec<f64> = (1..=d).map(|j| (j as f64).powf(-1.2).sqrt()).collect();
    let mut pool_x = Vec::new();
    let mut pool_y = Vec::new();
    let mut test_x = Vec::new();
    let mut test_y = Vec::new();
    let mut users = Vec::with_capacity(n);
    let mut held = Vec::with_capacity(n);
    for k in 0..n {
        let m = sizes[k];
        let (train_end, valid_end) = ((0.75 * m as f64) as usize, (0.9 * m as f64) as usize);
        let mut mine = Vec::new();
        let mut mine_held = Vec::new();
        for i in 0..m {
            let x: Vec<f64> = (0..d).map(|j| r.gauss() * scale[j] + v[k][j]).collect();
            let logits: Vec<f64> = (0..c)
                .map(|cls| (0..d).map(|j| x[j] * w[k][j * c + cls]).sum::<f64>() + b[k][cls])
                .collect();
            let y = numpy_argmax_softmax(&logits);
            let xs = x.iter().map(|&e| e as f32);
            if i < valid_end {
                (if i < train_end {
                    &mut mine
                } else {
                    &mut mine_held
                })
                .push(pool_y.len());
                pool_x.extend(xs);
                pool_y.push(y);
            } else {
                test_x.extend(xs);
                test_y.push(y);
            }
        }
        users.push(mine);
        held.push(mine_held);
    }
    let user_models = w
        .iter()
        .zip(&b)
        .map(|(wk, bk)| wk.iter().chain(bk).copied().collect())
        .collect();
    FederatedData {
        name: format!("synthetic-easyfl({},{})", spec.alpha, spec.beta),
        train: dense(pool_x, pool_y, d, c),
        test: dense(test_x, test_y, d, c),
        users: Some(users),
        user_models: Some(user_models),
        user_holdout: Some(held),
    }
}

/// `d`-dimensional examples and their labels among `c` classes.
fn dense(values: Vec<f32>, labels: Vec<u32>, d: usize, c: usize) -> Dataset {
    Dataset {
        inputs: Inputs::Dense {
            shape: vec![d],
            values,
        },
        labels,
        classes: c,
    }
}

/// `np.argmax(softmax(logits))` as the authors' program computes it (exp, divide by the
/// sum): the first maximum, or the first NaN when an exponential overflowed.
fn numpy_argmax_softmax(logits: &[f64]) -> u32 {
    let e: Vec<f64> = logits.iter().map(|z| z.exp()).collect();
    let sum: f64 = e.iter().sum();
    let mut best = 0;
    for (i, p) in e.iter().map(|x| x / sum).enumerate() {
        if p.is_nan() {
            return i as u32;
        }
        if p > e[best] / sum {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The FedGS authors' task, checked against numpy 2.4.6 running the draws of their
    /// `gen_data` (dist 10, skew 0.5, 30 users, after `np.random.seed(97)`): sizes, a few
    /// inputs and weights, the label histogram and sums over every input.
    #[test]
    fn the_authors_task_is_numpys() {
        let data = generate_easyfl(&SyntheticSpec {
            seed: 0,
            ..spec(0.5)
        });
        let users = data.users.as_ref().unwrap();
        let held = data.user_holdout.as_ref().unwrap();
        let sizes = [
            774, 51, 159, 55, 80, 57, 117, 338, 53, 167, 97, 51, 59, 591, 55, 1088, 245, 83, 2143,
            132, 140, 323, 395, 394, 75, 184, 113, 64, 602, 50,
        ];
        let train = [
            580, 38, 119, 41, 60, 42, 87, 253, 39, 125, 72, 38, 44, 443, 41, 816, 183, 62, 1607,
            99, 105, 242, 296, 295, 56, 138, 84, 48, 451, 37,
        ];
        for k in 0..30 {
            assert_eq!(users[k].len(), train[k], "user {k}");
            let valid = (0.9 * sizes[k] as f64) as usize - train[k];
            assert_eq!(held[k].len(), valid, "user {k}");
        }
        assert_eq!(data.test.len(), 888);
        let Inputs::Dense { values: x, .. } = &data.train.inputs else {
            unreachable!()
        };
        // numpy: X_0[0][:3] (stored as f32 here).
        for (j, v) in [2.740873881449957f64, 0.7864485498781235, 2.1786665679096524]
            .into_iter()
            .enumerate()
        {
            assert_eq!(x[j], v as f32);
        }
        let first: Vec<u32> = users[0][..20]
            .iter()
            .map(|&i| data.train.labels[i])
            .collect();
        assert_eq!(
            first,
            [6, 6, 9, 6, 6, 6, 6, 6, 9, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6]
        );
        let mut hist = data.train.histogram(None);
        for (h, t) in hist.iter_mut().zip(data.test.histogram(None)) {
            *h += t;
        }
        assert_eq!(hist, [322, 1350, 1769, 296, 444, 572, 731, 199, 438, 2614]);
        let models = data.user_models.as_ref().unwrap();
        assert_eq!(
            models[0][..3],
            [2.2581865398949397, 0.8583779564302283, 0.9496183970704335]
        );
        assert_eq!(
            models[29][600..602],
            [0.5583158570701023, -2.3509658176764248]
        );
    }

    fn spec(alpha: f64) -> SyntheticSpec {
        SyntheticSpec {
            alpha,
            beta: 0.5,
            users: 30,
            dim: 60,
            classes: 10,
            test_fraction: 0.1,
            seed: 3,
        }
    }

    #[test]
    fn sizes_split_and_seed_determinism() {
        let a = generate(&spec(0.5));
        let b = generate(&spec(0.5));
        assert_eq!(a.train.labels, b.train.labels);
        let users = a.users.as_ref().unwrap();
        assert_eq!(users.len(), 30);
        // Every user keeps at least 50·0.9 training examples and users tile the pool.
        let total: usize = users.iter().map(Vec::len).sum();
        assert_eq!(total, a.train.len());
        assert!(users.iter().all(|u| u.len() >= 45));
        let all = a.train.len() + a.test.len();
        let test_share = a.test.len() as f64 / all as f64;
        assert!((0.09..0.12).contains(&test_share), "{test_share}");
        assert!(a.train.labels.iter().all(|&y| y < 10));
    }

    #[test]
    fn seeds_give_different_data() {
        let a = generate(&spec(0.5));
        let b = generate(&SyntheticSpec {
            seed: 4,
            ..spec(0.5)
        });
        assert_ne!(a.train.labels, b.train.labels);
    }
}

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
        train: Dataset {
            inputs: Inputs::Dense {
                shape: vec![d],
                values: train_x,
            },
            labels: train_y,
            classes: c,
        },
        test: Dataset {
            inputs: Inputs::Dense {
                shape: vec![d],
                values: test_x,
            },
            labels: test_y,
            classes: c,
        },
        users: Some(users),
        user_models: Some(user_models),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

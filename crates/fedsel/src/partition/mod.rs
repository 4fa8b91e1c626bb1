//! Assigning training examples to clients, and each client's held-out split.
//!
//! A partitioner returns one index list per client into the training pool.
//! Every partitioner conserves samples (no example is given twice) and its
//! tests check that, together with the property that defines it.

pub mod class_dirichlet;
pub mod dirichlet_qp;
pub mod iid;
pub mod labels;
pub mod lognormal;
pub mod shards;

use rand::Rng as _;
use rand::seq::SliceRandom;

use crate::config::{PartitionConfig, PartitionScheme};
use crate::data::FederatedData;
use crate::error::PartitionError;
use crate::rng::{Purpose, Rng, stream};

/// One client's data: indices into the training pool.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientData {
    /// Examples the client trains on; their count is n_k.
    pub train: Vec<usize>,
    /// Examples the client evaluates the global model on for loss reports.
    pub holdout: Vec<usize>,
}

/// Builds the clients of a run: partition, then a seeded train/held-out split per client;
/// under the natural partition, data that fixes its users' held-out parts (easyFL's
/// `dvalid`, a LEAF user's test data) gives them instead, and `holdout_fraction` is unused.
pub fn build(
    cfg: &PartitionConfig,
    data: &FederatedData,
    seed: u64,
) -> Result<Vec<ClientData>, PartitionError> {
    let mut rng = stream(seed, Purpose::Partition, 0, 0);
    let labels = &data.train.labels;
    let classes = data.train.classes;
    let n = cfg.clients;
    // Checked before any per-client allocation: a huge count gets this error, not an abort.
    if !matches!(cfg.scheme, PartitionScheme::Natural) && n > labels.len() {
        return Err(PartitionError {
            kind: "any",
            reason: format!(
                "partition.clients = {n} exceeds the {} training examples; every client needs at least one",
                labels.len()
            ),
        });
    }
    let parts = match &cfg.scheme {
        PartitionScheme::Natural => data.users.clone().ok_or_else(|| PartitionError {
            kind: "natural",
            reason: format!(
                "dataset `{}` has no natural users; choose another partition",
                data.name
            ),
        })?,
        PartitionScheme::Iid => iid::partition(labels.len(), n, &mut rng),
        PartitionScheme::Shards { shards_per_client } => {
            shards::partition(labels, n, *shards_per_client, &mut rng)?
        }
        PartitionScheme::DirichletQp { alpha } => {
            dirichlet_qp::partition(labels, classes, n, *alpha, &mut rng)?
        }
        PartitionScheme::ClassDirichlet { alphas, all_full } => {
            class_dirichlet::partition(labels, classes, n, alphas, *all_full, &mut rng)?
        }
        PartitionScheme::Labels { labels_per_client } => {
            labels::partition(labels, classes, n, *labels_per_client, &mut rng)?
        }
        PartitionScheme::LognormalDirichlet { sigma, alpha } => {
            lognormal::partition(labels, classes, n, *sigma, *alpha, &mut rng)?
        }
    };
    if let Some(k) = parts.iter().position(Vec::is_empty) {
        return Err(PartitionError {
            kind: "any",
            reason: format!("client {k} received no examples; use fewer clients or another scheme"),
        });
    }
    if let (PartitionScheme::Natural, Some(held)) = (&cfg.scheme, &data.user_holdout) {
        return Ok(parts
            .into_iter()
            .zip(held)
            .map(|(train, holdout)| ClientData {
                train,
                holdout: holdout.clone(),
            })
            .collect());
    }
    Ok(split_holdout(parts, cfg.holdout_fraction, seed))
}

/// Splits each client's examples at random into train and held-out parts.
///
/// The first ⌈(1−f)·n⌉ of a shuffled list train (at least one example), the rest are held out,
/// as in the FedCor and FedGS code (80/20 by default).
pub fn split_holdout(parts: Vec<Vec<usize>>, fraction: f64, seed: u64) -> Vec<ClientData> {
    parts
        .into_iter()
        .enumerate()
        .map(|(k, mut idx)| {
            idx.shuffle(&mut stream(seed, Purpose::HoldoutSplit, 0, k as u64));
            let n_train =
                (((1.0 - fraction) * idx.len() as f64).ceil() as usize).clamp(1, idx.len().max(1));
            let holdout = idx.split_off(n_train.min(idx.len()));
            ClientData {
                train: idx,
                holdout,
            }
        })
        .collect()
}

/// Draws from Dirichlet(α) in log space, so tiny concentrations (α = 0.001)
/// give a proper one-hot-like vector instead of 0/0.
///
/// Uses Gamma(a) = Gamma(a+1)·U^{1/a} (Marsaglia–Tsang boosting).
pub fn dirichlet(alphas: &[f64], rng: &mut Rng) -> Vec<f64> {
    use rand_distr::{Distribution, Gamma};
    let logs: Vec<f64> = alphas
        .iter()
        .map(|&a| {
            let g: f64 = Gamma::new(a + 1.0, 1.0)
                .expect("positive shape")
                .sample(rng);
            let u: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
            g.ln() + u.ln() / a
        })
        .collect();
    let max = logs.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = logs.iter().map(|l| (l - max).exp()).collect();
    let s: f64 = w.iter().sum();
    w.into_iter().map(|x| x / s).collect()
}

/// Indices of each class, in index order.
pub(crate) fn by_class(labels: &[u32], classes: usize) -> Vec<Vec<usize>> {
    let mut out = vec![Vec::new(); classes];
    for (i, &l) in labels.iter().enumerate() {
        out[l as usize].push(i);
    }
    out
}

#[cfg(test)]
pub(crate) mod testing {
    /// Asserts no index appears twice and returns how many were assigned.
    pub fn assert_disjoint(parts: &[Vec<usize>], pool: usize) -> usize {
        let mut seen = vec![false; pool];
        for p in parts {
            for &i in p {
                assert!(!seen[i], "example {i} assigned twice");
                seen[i] = true;
            }
        }
        seen.iter().filter(|&&s| s).count()
    }

    /// 10 classes × `per_class` labels, class-major.
    pub fn labels(per_class: usize) -> Vec<u32> {
        (0..10u32)
            .flat_map(|c| std::iter::repeat_n(c, per_class))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holdout_split_is_80_20_and_conserves() {
        let parts = vec![(0..10).collect(), (10..15).collect(), vec![15]];
        let clients = split_holdout(parts, 0.2, 9);
        assert_eq!((clients[0].train.len(), clients[0].holdout.len()), (8, 2));
        assert_eq!((clients[1].train.len(), clients[1].holdout.len()), (4, 1));
        assert_eq!((clients[2].train.len(), clients[2].holdout.len()), (1, 0));
        let mut all: Vec<usize> = clients
            .iter()
            .flat_map(|c| c.train.iter().chain(&c.holdout).copied())
            .collect();
        all.sort();
        assert_eq!(all, (0..16).collect::<Vec<_>>());
    }

    #[test]
    fn natural_partition_keeps_the_users_and_needs_them() {
        use crate::data::synthetic::{SyntheticSpec, generate};
        let data = generate(&SyntheticSpec {
            alpha: 0.5,
            beta: 0.5,
            users: 12,
            dim: 5,
            classes: 3,
            test_fraction: 0.1,
            seed: 2,
        });
        let cfg = PartitionConfig::default();
        let clients = build(&cfg, &data, 1).unwrap();
        let users = data.users.clone().unwrap();
        for (c, u) in clients.iter().zip(&users) {
            let mut mine: Vec<usize> = c.train.iter().chain(&c.holdout).copied().collect();
            mine.sort();
            assert_eq!(&mine, u);
        }
        let no_users = FederatedData {
            users: None,
            ..data
        };
        let err = build(&cfg, &no_users, 1).unwrap_err().to_string();
        assert!(err.contains("natural"), "{err}");
    }

    /// A billion clients is refused before any per-client list is allocated (it used to
    /// abort on allocation failure), by every scheme that takes a client count.
    #[test]
    fn more_clients_than_examples_is_an_error_before_allocating() {
        use crate::data::synthetic::{SyntheticSpec, generate};
        let data = generate(&SyntheticSpec {
            alpha: 0.5,
            beta: 0.5,
            users: 3,
            dim: 5,
            classes: 3,
            test_fraction: 0.1,
            seed: 2,
        });
        for scheme in [
            PartitionScheme::Iid,
            PartitionScheme::DirichletQp { alpha: 0.5 },
            PartitionScheme::Labels {
                labels_per_client: 2,
            },
            PartitionScheme::LognormalDirichlet {
                sigma: 1.0,
                alpha: 0.5,
            },
        ] {
            let cfg = PartitionConfig {
                clients: 1_000_000_000,
                scheme,
                ..PartitionConfig::default()
            };
            let err = build(&cfg, &data, 1).unwrap_err().to_string();
            assert!(err.contains("partition.clients = 1000000000"), "{err}");
        }
    }

    #[test]
    fn dirichlet_sums_to_one_even_for_tiny_alpha() {
        let mut rng = stream(1, Purpose::Partition, 0, 0);
        for a in [0.001, 0.1, 1.0, 100.0] {
            let p = dirichlet(&[a; 10], &mut rng);
            assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-9);
            assert!(p.iter().all(|x| x.is_finite() && *x >= 0.0));
        }
        // Tiny α concentrates the mass; large α spreads it.
        let tiny = dirichlet(&[0.001; 10], &mut rng);
        assert!(tiny.iter().cloned().fold(0.0, f64::max) > 0.99);
        let flat = dirichlet(&[1000.0; 10], &mut rng);
        assert!(flat.iter().all(|&x| (x - 0.1).abs() < 0.02));
    }
}

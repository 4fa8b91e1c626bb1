//! Per-class Dirichlet over clients (Hsu et al. 2019), with α groups (HiCS-FL App. 6.10).
//!
//! Clients are split evenly into one group per α. Group g owns the g-th
//! contiguous slice of every class (the last group also takes the remainder,
//! so no example is lost). Inside a group, each class is shuffled and split
//! over the group's clients by a Dir(α_g) draw; clients already holding their
//! fair share (slice size / clients in group) get no more, as in the HiCS
//! code. The group draw repeats until every client holds at least 20% of its
//! fair share; a single α gives the classic Hsu partition.

use rand::seq::SliceRandom;

use super::{by_class, dirichlet};
use crate::error::PartitionError;
use crate::rng::Rng;

const MAX_TRIES: usize = 10_000;

/// Partitions `labels` over `clients`, split into `alphas.len()` groups.
pub fn partition(
    labels: &[u32],
    classes: usize,
    clients: usize,
    alphas: &[f64],
    rng: &mut Rng,
) -> Result<Vec<Vec<usize>>, PartitionError> {
    let groups = alphas.len();
    let per_group = clients / groups;
    let pools = by_class(labels, classes);
    let mut parts = Vec::with_capacity(clients);
    for (g, &alpha) in alphas.iter().enumerate() {
        let slices: Vec<&[usize]> = pools
            .iter()
            .map(|pool| {
                let w = pool.len() / groups;
                let end = if g + 1 == groups {
                    pool.len()
                } else {
                    (g + 1) * w
                };
                &pool[g * w..end]
            })
            .collect();
        let group_total: usize = slices.iter().map(|s| s.len()).sum();
        let fair = group_total as f64 / per_group as f64;
        let min_size = (0.2 * fair).floor() as usize;
        let mut tries = 0;
        let group = loop {
            tries += 1;
            if tries > MAX_TRIES {
                return Err(PartitionError {
                    kind: "class_dirichlet",
                    reason: format!(
                        "group {g} (alpha {alpha}) found no split giving every client {min_size} examples in {MAX_TRIES} draws"
                    ),
                });
            }
            let mut mine: Vec<Vec<usize>> = vec![Vec::new(); per_group];
            for slice in &slices {
                let mut idx = slice.to_vec();
                idx.shuffle(rng);
                let mut p = dirichlet(&vec![alpha; per_group], rng);
                for (k, pk) in p.iter_mut().enumerate() {
                    if mine[k].len() as f64 >= fair {
                        *pk = 0.0;
                    }
                }
                let s: f64 = p.iter().sum();
                if s <= 0.0 {
                    p = vec![1.0 / per_group as f64; per_group];
                } else {
                    p.iter_mut().for_each(|x| *x /= s);
                }
                let mut at = 0;
                let mut cum = 0.0;
                for k in 0..per_group {
                    cum += p[k];
                    let end = if k + 1 == per_group {
                        idx.len()
                    } else {
                        ((cum * idx.len() as f64) as usize).clamp(at, idx.len())
                    };
                    mine[k].extend_from_slice(&idx[at..end]);
                    at = end;
                }
            }
            if mine.iter().all(|m| m.len() >= min_size.max(1)) {
                break mine;
            }
        };
        parts.extend(group);
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::testing::{assert_disjoint, labels};
    use crate::rng::{Purpose, stream};

    fn entropy(p: &[usize], labels: &[u32]) -> f64 {
        let mut h = [0usize; 10];
        p.iter().for_each(|&i| h[labels[i] as usize] += 1);
        let n = p.len() as f64;
        h.iter()
            .filter(|&&c| c > 0)
            .map(|&c| -(c as f64 / n) * (c as f64 / n).ln())
            .sum()
    }

    #[test]
    fn groups_follow_their_alpha_and_conserve() {
        let labels = labels(1000);
        let alphas = [0.001, 0.002, 0.005, 0.01, 0.5];
        let parts = partition(
            &labels,
            10,
            50,
            &alphas,
            &mut stream(5, Purpose::Partition, 0, 0),
        )
        .unwrap();
        assert_eq!(parts.len(), 50);
        assert_eq!(assert_disjoint(&parts, labels.len()), labels.len());
        let mean_h = |g: usize| {
            parts[g * 10..(g + 1) * 10]
                .iter()
                .map(|p| entropy(p, &labels))
                .sum::<f64>()
                / 10.0
        };
        // α = 0.001 clients hold essentially one class; α = 0.5 clients are mixed.
        assert!(mean_h(0) < 0.3, "{}", mean_h(0));
        assert!(mean_h(4) > 1.0, "{}", mean_h(4));
        assert!(parts.iter().all(|p| p.len() >= 200 / 10 * 2));
    }
}

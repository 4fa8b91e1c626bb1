//! Per-class Dirichlet over clients (Hsu et al. 2019), with α groups (HiCS-FL App. 6.10).
//!
//! Clients are split evenly into one group per α. Group g owns the g-th
//! contiguous slice of every class (the last group also takes the remainder,
//! so no example is lost). Inside a group, each class is shuffled and split
//! over the group's clients by a Dir(α_g) draw; clients already holding their
//! fair share (slice size / clients in group) get no more, as in the HiCS
//! code. The group draw repeats until every client holds at least 20% of its
//! fair share; a single α gives the classic Hsu partition. When the draw gives
//! mass only to full clients, `all_full` says where the slice goes ([`AllFull`]).

use rand::seq::SliceRandom;

use super::{by_class, dirichlet};
use crate::config::AllFull;
use crate::error::PartitionError;
use crate::rng::Rng;

const MAX_TRIES: usize = 10_000;

/// Partitions `labels` over `clients`, split into `alphas.len()` groups.
pub fn partition(
    labels: &[u32],
    classes: usize,
    clients: usize,
    alphas: &[f64],
    all_full: AllFull,
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
                let held: Vec<usize> = mine.iter().map(Vec::len).collect();
                let p = shares(
                    dirichlet(&vec![alpha; per_group], rng),
                    &held,
                    fair,
                    all_full,
                );
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

/// The shares of one class slice: the draw `p` with full clients (holding `fair` or more)
/// masked out, renormalised; when nothing is left, as `all_full` says.
fn shares(mut p: Vec<f64>, held: &[usize], fair: f64, all_full: AllFull) -> Vec<f64> {
    for (pk, &n) in p.iter_mut().zip(held) {
        if n as f64 >= fair {
            *pk = 0.0;
        }
    }
    let s: f64 = p.iter().sum();
    if s > 0.0 {
        p.iter_mut().for_each(|x| *x /= s);
        return p;
    }
    let n = p.len();
    match all_full {
        AllFull::Spread => vec![1.0 / n as f64; n],
        AllFull::LastClient => (0..n).map(|k| if k + 1 == n { 1.0 } else { 0.0 }).collect(),
    }
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
            AllFull::Spread,
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

    /// A slice whose draw gives mass only to full clients: fedsel's `spread` splits it
    /// evenly over the group, the HiCS code's `last_client` hands it all to the last
    /// client (NumPy's 0/0 split); a draw with mass left on an open client is renormalised
    /// over the open clients under both.
    #[test]
    fn a_slice_for_full_clients_goes_where_all_full_says() {
        let fair = 100.0;
        let held = [100, 40, 120, 0];
        let onto_full = vec![0.7, 0.0, 0.3, 0.0];
        assert_eq!(
            shares(onto_full.clone(), &held, fair, AllFull::Spread),
            vec![0.25; 4]
        );
        assert_eq!(
            shares(onto_full, &held, fair, AllFull::LastClient),
            vec![0.0, 0.0, 0.0, 1.0]
        );
        for all_full in [AllFull::Spread, AllFull::LastClient] {
            assert_eq!(
                shares(vec![0.5, 0.125, 0.25, 0.125], &held, fair, all_full),
                vec![0.0, 0.5, 0.0, 0.5]
            );
        }
    }
}

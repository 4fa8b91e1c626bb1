//! k labels per client, balanced (FedGS FMNIST, easyFL `dist 1`).
//!
//! Clients take their labels one at a time from the currently least-used
//! labels (ties broken at random), so label use is as even as possible; each
//! label's examples are then split into equal parts over the clients holding
//! it. Labels no client holds (possible only when N·k < C) are left out.

use rand::Rng as _;
use rand::seq::SliceRandom;

use super::by_class;
use crate::error::PartitionError;
use crate::rng::Rng;

/// Gives every client `k` distinct labels.
pub fn partition(
    labels: &[u32],
    classes: usize,
    clients: usize,
    k: usize,
    rng: &mut Rng,
) -> Result<Vec<Vec<usize>>, PartitionError> {
    if k > classes {
        return Err(PartitionError {
            kind: "labels",
            reason: format!("{k} labels per client but the data has only {classes}"),
        });
    }
    let mut used = vec![0usize; classes];
    let mut holders: Vec<Vec<usize>> = vec![Vec::new(); classes];
    for c in 0..clients {
        let mut mine = Vec::with_capacity(k);
        for _ in 0..k {
            let least = (0..classes)
                .filter(|l| !mine.contains(l))
                .map(|l| used[l])
                .min()
                .expect("k <= classes");
            let ties: Vec<usize> = (0..classes)
                .filter(|l| !mine.contains(l) && used[*l] == least)
                .collect();
            let l = ties[rng.random_range(0..ties.len())];
            mine.push(l);
            used[l] += 1;
            holders[l].push(c);
        }
    }
    let mut parts = vec![Vec::new(); clients];
    for (l, mut pool) in by_class(labels, classes).into_iter().enumerate() {
        let h = &holders[l];
        if h.is_empty() {
            continue;
        }
        pool.shuffle(rng);
        let (base, extra) = (pool.len() / h.len(), pool.len() % h.len());
        let mut at = 0;
        for (i, &c) in h.iter().enumerate() {
            let len = base + usize::from(i < extra);
            parts[c].extend_from_slice(&pool[at..at + len]);
            at += len;
        }
    }
    for p in &mut parts {
        p.shuffle(rng);
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::testing::{assert_disjoint, labels};
    use crate::rng::{Purpose, stream};

    #[test]
    fn every_client_has_exactly_k_labels_and_use_is_balanced() {
        let labels = labels(600);
        let parts = partition(
            &labels,
            10,
            100,
            2,
            &mut stream(6, Purpose::Partition, 0, 0),
        )
        .unwrap();
        assert_eq!(assert_disjoint(&parts, labels.len()), labels.len());
        let mut use_count = [0usize; 10];
        for p in &parts {
            let mut ls: Vec<u32> = p.iter().map(|&i| labels[i]).collect();
            ls.sort();
            ls.dedup();
            assert_eq!(ls.len(), 2);
            ls.iter().for_each(|&l| use_count[l as usize] += 1);
        }
        // 200 label slots over 10 labels: exactly 20 holders each.
        assert!(use_count.iter().all(|&u| u == 20), "{use_count:?}");
        assert!(parts.iter().all(|p| p.len() == 60));
    }
}

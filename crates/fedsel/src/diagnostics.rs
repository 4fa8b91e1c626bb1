//! Statistics of HiCS-FL's entropy estimate: the engine and the selector record them per
//! round, and the workbench's offline diagnostics summarise them.
//!
//! Spearman's ρ over all clients is a weak test of HiCS-FL's Ĥ: in FMNIST setting (2)
//! an estimate that separates the 10 mixed clients from the 40 severely imbalanced ones
//! perfectly but orders each group at random scores only ρ ≈ 0.5 (0.52 on average with
//! seed 1's partition), although the separation is all Eq. 10 needs. So `entropy.csv`
//! also carries, per round, the AUC of Ĥ for the high-entropy group
//! ([`high_entropy_group`]) and the share of the round's selections that went to it.

/// Ranks with ties given their average rank (1-based).
fn ranks(x: &[f64]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..x.len()).collect();
    idx.sort_by(|&a, &b| x[a].total_cmp(&x[b]));
    let mut r = vec![0.0; x.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && x[idx[j + 1]] == x[idx[i]] {
            j += 1;
        }
        let avg = (i + j) as f64 / 2.0 + 1.0;
        for &k in &idx[i..=j] {
            r[k] = avg;
        }
        i = j + 1;
    }
    r
}

/// Spearman's rank correlation: Pearson's correlation of the (tie-averaged) ranks.
pub fn spearman(x: &[f64], y: &[f64]) -> f64 {
    let (rx, ry) = (ranks(x), ranks(y));
    let n = x.len() as f64;
    let (mx, my) = (rx.iter().sum::<f64>() / n, ry.iter().sum::<f64>() / n);
    let cov: f64 = rx.iter().zip(&ry).map(|(a, b)| (a - mx) * (b - my)).sum();
    let vx: f64 = rx.iter().map(|a| (a - mx).powi(2)).sum();
    let vy: f64 = ry.iter().map(|b| (b - my).powi(2)).sum();
    if vx == 0.0 || vy == 0.0 {
        0.0
    } else {
        cov / (vx * vy).sqrt()
    }
}

/// Shannon entropy (nats) of non-negative masses normalised by their sum; zero
/// entries contribute nothing. Label histograms, softmax weights and HiCS-FL's
/// positive parts all go through it.
pub fn shannon_entropy(masses: &[f64]) -> f64 {
    let total: f64 = masses.iter().sum();
    masses
        .iter()
        .filter(|&&m| m > 0.0)
        .map(|m| m / total)
        .map(|p| -p * p.ln())
        .sum()
}

/// The high-entropy ("mixed") group of a partition and the threshold above which a
/// client belongs to it: the upper group of the best split of the true label entropies
/// into two groups (1-D two-means: the least within-group sum of squares, Otsu's
/// threshold), which lies above the midpoint between the two groups' mean entropies,
/// the threshold returned. The partitions HiCS-FL evaluates on have two kinds of
/// clients, severely imbalanced (α ≤ 0.01: one or two classes) and mixed (α = 0.2 or
/// 0.5); in FMNIST setting (2), seed 1, the split puts exactly the 10 α = 0.2 clients
/// above 0.654, where the widest gap between sorted entropies would leave one out.
/// `None` with fewer than two distinct entropies.
pub fn high_entropy_group(truth: &[f64]) -> Option<(Vec<bool>, f64)> {
    let mut sorted = truth.to_vec();
    sorted.sort_by(f64::total_cmp);
    let sse = |x: &[f64]| {
        let mean = x.iter().sum::<f64>() / x.len() as f64;
        (x.iter().map(|v| (v - mean).powi(2)).sum::<f64>(), mean)
    };
    let (_, low, high) = (1..sorted.len())
        .filter(|&i| sorted[i] > sorted[i - 1])
        .map(|i| {
            let ((a, low), (b, high)) = (sse(&sorted[..i]), sse(&sorted[i..]));
            (a + b, low, high)
        })
        .min_by(|x, y| x.0.total_cmp(&y.0))?;
    let threshold = (low + high) / 2.0;
    Some((truth.iter().map(|&h| h > threshold).collect(), threshold))
}

/// The AUC of `score` for the `positive` clients: the probability that a random positive
/// client scores higher than a random negative one, ties counting ½. `None` when either
/// group is empty.
pub fn auc(score: &[f64], positive: &[bool]) -> Option<f64> {
    let pos: Vec<f64> = (0..score.len())
        .filter(|&i| positive[i])
        .map(|i| score[i])
        .collect();
    let neg: Vec<f64> = (0..score.len())
        .filter(|&i| !positive[i])
        .map(|i| score[i])
        .collect();
    if pos.is_empty() || neg.is_empty() {
        return None;
    }
    let wins: f64 = pos
        .iter()
        .flat_map(|p| neg.iter().map(move |n| (p, n)))
        .map(|(p, n)| match p.total_cmp(n) {
            std::cmp::Ordering::Greater => 1.0,
            std::cmp::Ordering::Equal => 0.5,
            std::cmp::Ordering::Less => 0.0,
        })
        .sum();
    Some(wins / (pos.len() * neg.len()) as f64)
}

/// The share of `selected` entries (duplicates count each time) that are `group` clients.
/// `None` for an empty selection.
pub fn group_share(selected: &[usize], group: &[bool]) -> Option<f64> {
    (!selected.is_empty())
        .then(|| selected.iter().filter(|&&k| group[k]).count() as f64 / selected.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spearman_matches_hand_computation() {
        assert!((spearman(&[1.0, 2.0, 3.0], &[10.0, 20.0, 30.0]) - 1.0).abs() < 1e-12);
        assert!((spearman(&[1.0, 2.0, 3.0], &[3.0, 2.0, 1.0]) + 1.0).abs() < 1e-12);
        // Ranks (1, 2, 3, 4) vs (2, 1, 4, 3): d² = 4, ρ = 1 − 6·4/(4·15) = 0.6.
        assert!((spearman(&[1.0, 2.0, 3.0, 4.0], &[2.0, 1.0, 4.0, 3.0]) - 0.6).abs() < 1e-12);
        // Ties get average ranks: (1, 2.5, 2.5, 4).
        assert_eq!(ranks(&[0.0, 5.0, 5.0, 9.0]), vec![1.0, 2.5, 2.5, 4.0]);
    }

    /// Hand values: true entropies split best into {0, 0.1, 0.1} and {1.5, 1.7} (means
    /// 1/15 and 1.6, threshold 5/6); {0, 0.1, 0.1, 1.5} | {1.7} would leave a sum of squares
    /// of 1.55 against 0.027. Ĥ of the high clients (0.9, 0.4) against the low (0.5, 0.4,
    /// 0.1): pairs won 3 + 1.5 (a tie with 0.4 counts ½) out of 6 → AUC 0.75.
    #[test]
    fn auc_and_share_of_the_high_entropy_group_match_hand_values() {
        let truth = [0.0, 1.5, 0.1, 1.7, 0.1];
        let (group, threshold) = high_entropy_group(&truth).unwrap();
        assert_eq!(group, vec![false, true, false, true, false]);
        assert!((threshold - 5.0 / 6.0).abs() < 1e-12);
        // Three tight groups: the split with the least spread takes the top one apart.
        let (top, _) = high_entropy_group(&[0.0, 0.0, 1.0, 1.0, 2.2, 2.2]).unwrap();
        assert_eq!(top, vec![false, false, false, false, true, true]);
        let estimate = [0.5, 0.9, 0.4, 0.4, 0.1];
        assert_eq!(auc(&estimate, &group), Some(4.5 / 6.0));
        // A perfect separation with random order inside the groups scores 1.
        assert_eq!(auc(&[0.2, 2.0, 0.1, 1.0, 0.3], &group), Some(1.0));
        assert_eq!(auc(&estimate, &[true; 5]), None);
        assert_eq!(high_entropy_group(&[0.3, 0.3]), None);
        // Selections (1, 1, 2, 4): two of four go to the group; duplicates count.
        assert_eq!(group_share(&[1, 1, 2, 4], &group), Some(0.5));
        assert_eq!(group_share(&[], &group), None);
    }
}

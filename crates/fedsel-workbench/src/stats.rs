//! Statistics over seeds for the report tables: median, bootstrap confidence interval of the
//! mean, censored rounds to a target, and paired tests against a baseline.
//!
//! **Censoring.** A seed that never reaches a target within its R rounds is *censored*: its
//! rounds to the target are only known to be more than R. It is kept, never dropped
//! (dropping it would make a method that often fails look fast), and shown as "> R".
//! - *Median*: censored seeds sort above every reached one (a seed reaches a target within
//!   its own R rounds, and the seeds of one setting share R). The median is then known
//!   exactly while fewer than half of the seeds are censored; otherwise it is "> R".
//!   Seconds to a target are censored at each run's own final clock, which differ between
//!   seeds: a censored seed whose clock stopped below a middle reached value could sort
//!   anywhere above its bound, so the median is then only bounded below, by the median with
//!   every censored seed at its bound. Rounds never meet this case (every bound is R).
//! - *Mean*: the mean over the seeds that reached is biased low (it keeps only the lucky
//!   seeds), so it is not shown. With every seed reached the mean ± std is shown; otherwise
//!   the mean with each censored seed counted as R, a strict lower bound of the true mean,
//!   shown as "≥ x" without a std.
//! - *Bootstrap CI*: only when every seed reached. A bootstrap of the lower bound would give
//!   an interval for the bound, whose upper end says nothing about the true mean.
//!
//! **Bootstrap.** Percentile 95 % interval of the mean over seeds from [`RESAMPLES`]
//! resamples with replacement, drawn by ChaCha8 from the fixed seed [`BOOTSTRAP_SEED`] over
//! the values sorted first: the interval depends only on the values, never on the order of
//! the cells or on the run, so reports are reproducible. The 2.5 % and 97.5 % points are the
//! ⌈0.025·B⌉-th and ⌈0.975·B⌉-th smallest resampled means. With few seeds (3 or 5) the
//! percentile interval is narrower than it should be (it cannot see spread the seeds did not
//! show); it is a summary of the seeds at hand, not a guarantee.
//!
//! **Paired comparison.** Against the sweep's baseline, over the seeds both strategies ran in
//! the same setting (the same seed gives both the same data partition and availability, so
//! pairing removes that shared variation). The difference is strategy − baseline.
//! - Rounds to a target (censorable): the exact two-sided *sign test*. It needs only the sign
//!   of each difference, which censoring keeps: reached vs censored has a known sign, both
//!   censored is a tie; ties are left out (the usual convention). A pair with one censored
//!   member bounds its difference from one side (reached x against censored > R: the
//!   difference is below x − R); the median paired difference is given when these bounds put
//!   every such pair on one side of the middle values, so no completion of the censored
//!   values could move it, and not when a pair has both members censored (its difference is
//!   unknown).
//! - Accuracy and loss (never censored): the exact two-sided *Wilcoxon signed-rank test*,
//!   which also uses the size of the differences and so has more power at the same n. Zero
//!   differences are left out (Wilcoxon's own treatment, scipy's default `zero_method`); tied
//!   magnitudes get mid-ranks and the p-value is exact under that ranking (the permutation
//!   distribution of the signs), for any n.
//!
//! With n untied pairs neither test can give p below 2/2ⁿ: 0.25 for 3 seeds, 0.0625 for 5.

use std::collections::BTreeMap;

use rand::{Rng as _, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Resamples of each bootstrap.
pub const RESAMPLES: usize = 10_000;

/// Seed of every bootstrap ("fedsel" in ASCII).
pub const BOOTSTRAP_SEED: u64 = 0x6665_6473_656c;

/// One seed's value of a metric.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Obs {
    /// The value.
    Value(f64),
    /// Censored: more than this (rounds to a target never reached within this many rounds).
    Above(f64),
}

/// The median over seeds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Median {
    /// Known exactly.
    Value(f64),
    /// Half or more of the seeds are censored: the median is more than this.
    Above(f64),
}

/// What a report shows of one metric over seeds.
#[derive(Debug, Clone, PartialEq)]
pub struct SeedStats {
    /// Seeds.
    pub n: usize,
    /// Seeds that were not censored.
    pub reached: usize,
    /// Mean and sample standard deviation, when no seed is censored.
    pub mean_std: Option<(f64, f64)>,
    /// The mean with each censored seed counted at its bound: the mean when none is
    /// censored, a lower bound of it otherwise.
    pub mean_lb: f64,
    /// The smallest bound of a censored seed, if any.
    pub censored_at: Option<f64>,
    /// The median.
    pub median: Median,
    /// Percentile bootstrap 95 % interval of the mean, when no seed is censored and n ≥ 2.
    pub ci: Option<(f64, f64)>,
}

/// Sample mean and standard deviation (n − 1 in the denominator; 0 for one value).
pub fn mean_std(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let m = xs.iter().sum::<f64>() / n;
    let v = if xs.len() > 1 {
        xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (m, v.sqrt())
}

/// The statistics of one metric over seeds (see the module doc for censored seeds).
/// `obs` must not be empty.
pub fn seed_stats(obs: &[Obs]) -> SeedStats {
    let values: Vec<f64> = obs
        .iter()
        .filter_map(|o| match o {
            Obs::Value(x) => Some(*x),
            Obs::Above(_) => None,
        })
        .collect();
    let bounds: Vec<f64> = obs
        .iter()
        .map(|o| match o {
            Obs::Value(x) | Obs::Above(x) => *x,
        })
        .collect();
    let n = obs.len();
    let censored_at = obs
        .iter()
        .filter_map(|o| match o {
            Obs::Above(r) => Some(*r),
            Obs::Value(_) => None,
        })
        .min_by(f64::total_cmp);
    let complete = values.len() == n;
    // Censored seeds sort last, so the middle order statistics are reached values exactly
    // when fewer than half of the seeds are censored and no censored seed stopped below them.
    let middle = |v: &[f64]| {
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    };
    let median = match censored_at {
        Some(r) if 2 * (n - values.len()) >= n => Median::Above(r),
        _ => {
            let mut v = values.clone();
            v.sort_by(f64::total_cmp);
            v.resize(n, f64::INFINITY);
            match censored_at {
                Some(r) if r < v[n / 2] => {
                    let mut b = bounds.clone();
                    b.sort_by(f64::total_cmp);
                    Median::Above(middle(&b))
                }
                _ => Median::Value(middle(&v)),
            }
        }
    };
    SeedStats {
        n,
        reached: values.len(),
        mean_std: complete.then(|| mean_std(&values)),
        mean_lb: mean_std(&bounds).0,
        censored_at,
        median,
        ci: (complete && n >= 2).then(|| bootstrap_mean_ci(&values)),
    }
}

/// The percentile bootstrap 95 % interval of the mean of `xs` (see the module doc).
pub fn bootstrap_mean_ci(xs: &[f64]) -> (f64, f64) {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let mut rng = ChaCha8Rng::seed_from_u64(BOOTSTRAP_SEED);
    let mut means: Vec<f64> = (0..RESAMPLES)
        .map(|_| (0..n).map(|_| v[rng.random_range(0..n)]).sum::<f64>() / n as f64)
        .collect();
    means.sort_by(f64::total_cmp);
    let at = |q: f64| means[((q * RESAMPLES as f64).ceil() as usize).max(1) - 1];
    (at(0.025), at(0.975))
}

/// The exact two-sided sign test: p = min(1, 2·P(X ≤ min(pos, neg))) for X ~ Bin(n, ½),
/// n = pos + neg; `None` without an untied pair. Summed in log space so no 2ⁿ overflows.
pub fn sign_test(pos: usize, neg: usize) -> Option<f64> {
    let n = pos + neg;
    if n == 0 {
        return None;
    }
    let mut ln_p = -(n as f64) * std::f64::consts::LN_2;
    let mut tail = 0.0;
    for i in 0..=pos.min(neg) {
        tail += ln_p.exp();
        ln_p += ((n - i) as f64).ln() - ((i + 1) as f64).ln();
    }
    Some((2.0 * tail).min(1.0))
}

/// The exact two-sided Wilcoxon signed-rank p-value of differences `d`: zeros left out,
/// tied magnitudes given mid-ranks, and the null distribution of the positive rank sum
/// computed exactly over the 2ⁿ sign assignments (by dynamic programming on doubled ranks,
/// so mid-ranks stay integers). `None` when every difference is zero.
pub fn wilcoxon(d: &[f64]) -> Option<f64> {
    let mut a: Vec<(f64, bool)> = d
        .iter()
        .filter(|x| **x != 0.0)
        .map(|&x| (x.abs(), x > 0.0))
        .collect();
    if a.is_empty() {
        return None;
    }
    a.sort_by(|x, y| x.0.total_cmp(&y.0));
    let n = a.len();
    // Doubled mid-ranks: a run of ties over positions i..=j (0-based) shares rank
    // (i + j + 2) / 2.
    let mut ranks = vec![0usize; n];
    let mut i = 0;
    while i < n {
        let mut j = i;
        while j + 1 < n && a[j + 1].0 == a[i].0 {
            j += 1;
        }
        ranks[i..=j].fill(i + j + 2);
        i = j + 1;
    }
    let t: usize = ranks
        .iter()
        .zip(&a)
        .filter(|(_, x)| x.1)
        .map(|(r, _)| r)
        .sum();
    let total: usize = ranks.iter().sum();
    let mut dist = vec![0.0f64; total + 1];
    dist[0] = 1.0;
    for &r in &ranks {
        for s in (r..=total).rev() {
            dist[s] = 0.5 * (dist[s] + dist[s - r]);
        }
        for p in &mut dist[..r] {
            *p *= 0.5;
        }
    }
    let le: f64 = dist[..=t].iter().sum();
    let ge: f64 = dist[t..].iter().sum();
    Some((2.0 * le.min(ge)).min(1.0))
}

/// Which paired test a metric gets (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    /// Exact sign test: for censorable metrics.
    Sign,
    /// Exact Wilcoxon signed-rank test: for metrics never censored.
    Wilcoxon,
}

/// A paired comparison of a strategy with the baseline over their shared seeds.
#[derive(Debug, Clone, PartialEq)]
pub struct Paired {
    /// Shared seeds.
    pub n: usize,
    /// Seeds where the strategy's value is above the baseline's.
    pub above: usize,
    /// Seeds where it is below.
    pub below: usize,
    /// Median of strategy − baseline, when censoring cannot move it (see the module doc).
    pub median_diff: Option<f64>,
    /// Two-sided p-value, when some pair differs.
    pub p: Option<f64>,
}

/// Compares `(seed, value)` of a strategy with those of the baseline over the seeds that
/// occur once in each (a seed twice in a group cannot be paired unambiguously).
pub fn paired(strategy: &[(u64, Obs)], baseline: &[(u64, Obs)], test: Test) -> Paired {
    let once = |xs: &[(u64, Obs)]| {
        let mut m: BTreeMap<u64, Vec<Obs>> = BTreeMap::new();
        for (s, o) in xs {
            m.entry(*s).or_default().push(*o);
        }
        m.into_iter()
            .filter(|(_, v)| v.len() == 1)
            .map(|(s, v)| (s, v[0]))
            .collect::<BTreeMap<u64, Obs>>()
    };
    let (a, b) = (once(strategy), once(baseline));
    let pairs: Vec<(Obs, Obs)> = a
        .iter()
        .filter_map(|(s, x)| b.get(s).map(|y| (*x, *y)))
        .collect();
    let d: Vec<Diff> = pairs.iter().map(|&(x, y)| Diff::of(x, y)).collect();
    let above = d.iter().filter(|d| d.sign() > 0).count();
    let below = d.iter().filter(|d| d.sign() < 0).count();
    let exact: Option<Vec<f64>> = d
        .iter()
        .map(|d| match d {
            Diff::Exact(x) => Some(*x),
            _ => None,
        })
        .collect();
    let p = match (test, exact.filter(|e| !e.is_empty())) {
        (Test::Wilcoxon, Some(e)) => wilcoxon(&e),
        _ => sign_test(above, below),
    };
    Paired {
        n: pairs.len(),
        above,
        below,
        median_diff: bounded_median(&d),
        p,
    }
}

/// What is known of one paired difference strategy − baseline.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Diff {
    Exact(f64),
    /// Less than this: the strategy reached at x, the baseline is censored past R (x − R).
    Below(f64),
    /// More than this: the strategy is censored past R, the baseline reached at y (R − y).
    Above(f64),
    /// Both censored.
    Unknown,
}

impl Diff {
    fn of(x: Obs, y: Obs) -> Self {
        match (x, y) {
            (Obs::Value(x), Obs::Value(y)) => Diff::Exact(x - y),
            (Obs::Value(x), Obs::Above(r)) => Diff::Below(x - r),
            (Obs::Above(r), Obs::Value(y)) => Diff::Above(r - y),
            (Obs::Above(_), Obs::Above(_)) => Diff::Unknown,
        }
    }

    /// +1, −1, or 0 for a tie or an unknown sign.
    fn sign(self) -> i8 {
        match self {
            Diff::Exact(d) => (d > 0.0) as i8 - (d < 0.0) as i8,
            Diff::Below(u) if u <= 0.0 => -1,
            Diff::Above(l) if l >= 0.0 => 1,
            _ => 0,
        }
    }
}

/// The median of the differences when the bounded ones cannot move it: sorting those
/// bounded above first and those bounded below last, the middle values must be exact and
/// every bound on the right side of them.
fn bounded_median(d: &[Diff]) -> Option<f64> {
    if d.is_empty() || d.contains(&Diff::Unknown) {
        return None;
    }
    let (mut exact, mut below, mut above) = (Vec::new(), Vec::new(), Vec::new());
    for x in d {
        match *x {
            Diff::Exact(v) => exact.push(v),
            Diff::Below(u) => below.push(u),
            Diff::Above(l) => above.push(l),
            Diff::Unknown => {}
        }
    }
    exact.sort_by(f64::total_cmp);
    let n = d.len();
    let (i, j) = (n.div_ceil(2) - 1, n / 2);
    let k = below.len();
    if i < k || j >= k + exact.len() {
        return None;
    }
    let (m1, m2) = (exact[i - k], exact[j - k]);
    (below.iter().all(|&u| u <= m1) && above.iter().all(|&l| l >= m2)).then(|| (m1 + m2) / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    /// n = 10 with 9 positive: p = 2·(C(10,0) + C(10,1))/2¹⁰ = 2·11/1024.
    #[test]
    fn sign_test_matches_the_binomial_tail() {
        assert!(close(sign_test(9, 1).unwrap(), 0.021484375));
        assert!(close(sign_test(1, 9).unwrap(), 0.021484375));
        // 5 of 5: 2/32; 3 of 3: 2/8; balanced: 1.
        assert!(close(sign_test(5, 0).unwrap(), 0.0625));
        assert!(close(sign_test(0, 3).unwrap(), 0.25));
        assert!(close(sign_test(2, 2).unwrap(), 1.0));
        assert_eq!(sign_test(0, 0), None);
        // Large n stays finite: 2·P(X ≤ 0) for n = 2000 underflows to 0, not NaN.
        assert_eq!(sign_test(2000, 0), Some(0.0));
    }

    /// scipy's documented example (Cushny & Peebles via Fisher): statistic 24, p =
    /// 0.041259765625 exactly; all positive of 5 is 2/32.
    #[test]
    fn wilcoxon_matches_scipys_exact_values() {
        let d = [
            6.0, 8.0, 14.0, 16.0, 23.0, 24.0, 28.0, 29.0, 41.0, -48.0, 49.0, 56.0, 60.0, -67.0,
            75.0,
        ];
        assert!(close(wilcoxon(&d).unwrap(), 0.041259765625));
        let neg: Vec<f64> = d.iter().map(|x| -x).collect();
        assert!(close(wilcoxon(&neg).unwrap(), 0.041259765625));
        assert!(close(wilcoxon(&[1.0, 2.0, 3.0, 4.0, 5.0]).unwrap(), 0.0625));
        assert_eq!(wilcoxon(&[0.0, 0.0]), None);
    }

    /// d = (1, 1, −2, 3) with zero dropped: mid-ranks 1.5, 1.5, 3, 4 and T+ = 7. Of the 16
    /// sign assignments 5 give T+ ≥ 7 (7, 7, 8.5, 8.5, 10): p = 2·5/16.
    #[test]
    fn wilcoxon_handles_ties_and_zeros_exactly() {
        assert!(close(wilcoxon(&[1.0, 0.0, 1.0, -2.0, 3.0]).unwrap(), 0.625));
    }

    #[test]
    fn median_of_censored_seeds_is_known_only_below_half() {
        use Obs::{Above, Value};
        let s = seed_stats(&[
            Value(10.0),
            Value(30.0),
            Above(200.0),
            Value(20.0),
            Above(200.0),
        ]);
        assert_eq!(s.median, Median::Value(30.0));
        assert_eq!((s.reached, s.n), (3, 5));
        assert_eq!(s.mean_std, None);
        assert_eq!(s.ci, None);
        assert!(close(s.mean_lb, (10.0 + 30.0 + 20.0 + 400.0) / 5.0));
        // Two of four censored: the upper middle value is censored.
        let s = seed_stats(&[Value(10.0), Value(30.0), Above(200.0), Above(200.0)]);
        assert_eq!(s.median, Median::Above(200.0));
        assert_eq!(s.censored_at, Some(200.0));
        // One of four: (20 + 30) / 2.
        let s = seed_stats(&[Value(10.0), Value(30.0), Above(200.0), Value(20.0)]);
        assert_eq!(s.median, Median::Value(25.0));
        let s = seed_stats(&[Value(1.0), Value(4.0), Value(2.0), Value(9.0)]);
        assert_eq!(s.median, Median::Value(3.0));
        assert_eq!(s.mean_std.unwrap().0, 4.0);
        assert_eq!(s.mean_lb, 4.0);
        assert!(s.ci.is_some());
    }

    /// Two values {0, 1}: a resample's mean is 0, ½ or 1 with probabilities ¼, ½, ¼, so the
    /// 2.5 % and 97.5 % points are 0 and 1. For 0..19 the interval is near the normal one,
    /// 9.5 ± 1.96·σ/√20 = 9.5 ± 2.53.
    /// Seconds to a target: each censored seed has its own bound. One stopped at 100 s, below
    /// the middle reached value 300 s: the median is only bounded, by the median of
    /// 100, 200, 300 (the censored seed at its bound). One stopped at 500 s cannot move it.
    #[test]
    fn median_with_censoring_bounds_below_it_is_a_bound() {
        use Obs::{Above, Value};
        let s = seed_stats(&[Value(200.0), Above(100.0), Value(300.0)]);
        assert_eq!(s.median, Median::Above(200.0));
        assert_eq!(s.censored_at, Some(100.0));
        let s = seed_stats(&[Value(200.0), Above(500.0), Value(300.0)]);
        assert_eq!(s.median, Median::Value(300.0));
    }

    #[test]
    fn bootstrap_interval_is_the_percentile_interval_and_seeded() {
        assert_eq!(bootstrap_mean_ci(&[0.0, 1.0]), (0.0, 1.0));
        assert_eq!(bootstrap_mean_ci(&[3.0, 3.0, 3.0]), (3.0, 3.0));
        let xs: Vec<f64> = (0..20).map(f64::from).collect();
        let (lo, hi) = bootstrap_mean_ci(&xs);
        assert!(
            (lo - 6.97).abs() < 0.3 && (hi - 12.03).abs() < 0.3,
            "{lo} {hi}"
        );
        let mut rev = xs.clone();
        rev.reverse();
        assert_eq!(
            bootstrap_mean_ci(&rev),
            (lo, hi),
            "order of the seeds matters"
        );
    }

    #[test]
    fn pairs_match_seeds_and_keep_censored_signs() {
        use Obs::{Above, Value};
        let base = [
            (1, Value(50.0)),
            (2, Above(100.0)),
            (3, Above(100.0)),
            (4, Value(40.0)),
            (9, Value(1.0)),
        ];
        // Seed 5 has no baseline partner; seed 3 is a censored tie.
        let s = [
            (4, Value(30.0)),
            (1, Value(60.0)),
            (2, Value(70.0)),
            (3, Above(100.0)),
            (5, Value(1.0)),
        ];
        let p = paired(&s, &base, Test::Sign);
        assert_eq!((p.n, p.above, p.below), (4, 1, 2));
        assert_eq!(p.median_diff, None, "seed 3's difference is unknown");
        assert!(close(p.p.unwrap(), 1.0));
        // Without seed 3: 60 − 50 = 10, 30 − 40 = −10, and seed 2's difference is below
        // 70 − 100 = −30, so it sorts first whatever it is: the median is −10.
        let p = paired(&[s[0], s[1], s[2]], &base, Test::Sign);
        assert_eq!(p.median_diff, Some(-10.0));
        // A bound of 95 − 100 = −5 could lie above −10 or below it: unknown.
        let p = paired(&[s[0], s[1], (2, Value(95.0))], &base, Test::Sign);
        assert_eq!(p.median_diff, None);
        assert_eq!((p.above, p.below), (1, 2));
        let s = [(1, Value(60.0)), (4, Value(45.0)), (9, Value(4.0))];
        let p = paired(&s, &base, Test::Wilcoxon);
        assert_eq!((p.n, p.above, p.below), (3, 3, 0));
        assert_eq!(p.median_diff, Some(5.0));
        assert!(close(p.p.unwrap(), 0.25));
    }
}

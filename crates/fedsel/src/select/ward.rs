//! Ward's agglomerative clustering (scipy `linkage(X, "ward")`), shared by
//! Clustered Sampling Alg. 2 and HiCS-FL, and the two cuts they use.
//!
//! Both pass the rows of an N × N distance matrix as the points (algorithms.md §3.3, §7.2:
//! what the authors ran), so the points' own distances are Θ(N³) a clustering: 5·10¹¹
//! squared differences at 10,000 clients, 31 s a round of Clustered Sampling on the 2-core
//! machine that measured it (docs/speed.md), the bound of both selectors at that size
//! ([`point_distances`]). Only the K clients that report change their rows, but updating
//! the sums in O(K N²) would make each distance depend on the run's history, not on the
//! rows alone, and a resumed run would then cluster differently from an uninterrupted one.
//!
//! The Lance–Williams recurrence on Euclidean distances, merging the closest pair
//! (the lowest-index pair on ties, so the result is deterministic), with each
//! row's nearest neighbour cached (Müllner's "generic" scheme): O(n²) per run in
//! practice instead of the full scan's O(n³), and the same merges bit for bit
//! (`tests::the_cached_scan_merges_as_the_full_scan`).

use super::panels::{BLOCK, PANEL, pair_sums};

/// One merge, in scipy's convention: clusters 0..n are the points, cluster n + i
/// is the one formed by merge i.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Merge {
    /// First merged cluster (the smaller id).
    pub a: usize,
    /// Second merged cluster.
    pub b: usize,
    /// Ward distance between them.
    pub height: f64,
    /// Points in the merged cluster.
    pub size: usize,
}

/// Ward linkage of `points` (rows are feature vectors).
pub fn linkage(points: &[Vec<f64>]) -> Vec<Merge> {
    let n = points.len();
    // d[i][j] for the active clusters, indexed by slot; slot i holds cluster id[i].
    let mut d = point_distances(points);
    let mut id: Vec<usize> = (0..n).collect();
    let mut size = vec![1usize; n];
    let mut active = vec![true; n];
    // nn[i]: the active j > i nearest to i (the lowest such j on ties), or n if none. The
    // pair the full scan would merge, the least d[i][j] with the lowest (i, j) on ties, is
    // then the least d[i][nn[i]] with the lowest i: the scan's merges, in its order, with
    // the same arithmetic, at O(n) per row instead of O(n²) per merge (issue 23).
    let nearest = |i: usize, d: &[Vec<f64>], active: &[bool]| -> usize {
        let mut best = n;
        for j in i + 1..n {
            if active[j] && (best == n || d[i][j] < d[i][best]) {
                best = j;
            }
        }
        best
    };
    let mut nn: Vec<usize> = (0..n).map(|i| nearest(i, &d, &active)).collect();
    let mut merges = Vec::with_capacity(n.saturating_sub(1));
    for step in 0..n.saturating_sub(1) {
        // The first candidate is taken whatever its distance, so that a merge is found even
        // when every distance left is infinite or NaN (no such input reaches Ward through
        // the guard, but the merge count must not depend on it).
        let mut best = (usize::MAX, usize::MAX, f64::INFINITY);
        for i in 0..n {
            if active[i] && nn[i] < n && (best.0 == usize::MAX || d[i][nn[i]] < best.2) {
                best = (i, nn[i], d[i][nn[i]]);
            }
        }
        let (i, j, h) = best;
        let (si, sj) = (size[i] as f64, size[j] as f64);
        for k in 0..n {
            if !active[k] || k == i || k == j {
                continue;
            }
            let v = lance_williams(si, sj, size[k] as f64, d[i][k], d[j][k], h);
            d[i][k] = v;
            d[k][i] = v;
        }
        merges.push(Merge {
            a: id[i].min(id[j]),
            b: id[i].max(id[j]),
            height: h,
            size: size[i] + size[j],
        });
        size[i] += size[j];
        id[i] = n + step;
        active[j] = false;
        // Rows whose nearest may have changed: i's own, those that pointed at i or j (their
        // distance to i changed, or j is gone), and those before i, for which i may now
        // be nearer than their nearest (or as near, with a lower index).
        for k in 0..n {
            if !active[k] {
                continue;
            }
            if k == i || nn[k] == i || nn[k] == j {
                nn[k] = nearest(k, &d, &active);
            } else if k < i && (d[k][i] < d[k][nn[k]] || (d[k][i] == d[k][nn[k]] && i < nn[k])) {
                // nn[k] < n here: i itself is an active candidate after k.
                nn[k] = i;
            }
        }
    }
    merges
}

/// Column panels per tile: independent chains of additions enough to keep two adders busy.
const GROUP: usize = 8;
/// Features per block: a tile's column panels, GROUP × DEPTH × PANEL values, stay in L1.
const DEPTH: usize = 64;

/// Euclidean distances between the points, each the plain sum of (x − y)² over the
/// features in order from −0.0, as `Iterator::sum` adds them, then √: the bits of a serial
/// pass. Clustered Sampling and HiCS-FL pass the rows of an N × N matrix, so this is
/// N²/2 sums of N terms, Θ(N³), the whole cost of their clustering; it is blocked as a
/// matrix product is, without reordering any sum ([`pair_sums`], blocks of [`DEPTH`]
/// features, tiles of [`GROUP`] column panels). Only the upper triangle is summed, then
/// mirrored ((x − y)² = (y − x)² exactly).
fn point_distances(points: &[Vec<f64>]) -> Vec<Vec<f64>> {
    point_distances_on(points, crate::cpu::isa())
}

/// [`point_distances`] with the kernel compiled for `isa` (one this CPU runs).
fn point_distances_on(points: &[Vec<f64>], isa: crate::cpu::Isa) -> Vec<Vec<f64>> {
    let n = points.len();
    let rows: Vec<&[f64]> = points.iter().map(Vec::as_slice).collect();
    let sums = pair_sums(&rows, DEPTH, GROUP, |tile, rows, cols, _| {
        squared_differences(isa, tile, rows, cols)
    });
    let mut d: Vec<Vec<f64>> = (0..n)
        .map(|i| {
            (0..n)
                .map(|j| if j > i { sums.get(i, j).sqrt() } else { 0.0 })
                .collect()
        })
        .collect();
    for i in 1..n {
        let (above, below) = d.split_at_mut(i);
        for (j, row) in above.iter().enumerate() {
            below[0][j] = row[i];
        }
    }
    d
}

/// Adds (row r − column c)² for every feature of the block, in order, to
/// `tile[c / PANEL · BLOCK + r · PANEL + c % PANEL]`: `rows` is one packed panel, `cols`
/// `tile.len() / BLOCK` consecutive ones.
fn squared_differences(isa: crate::cpu::Isa, tile: &mut [f64], rows: &[f64], cols: &[f64]) {
    crate::cpu::on_isa!(
        isa,
        fn add(tile: &mut [f64], rows: &[f64], cols: &[f64]) {
            let width = tile.len() / BLOCK;
            let stride = rows.len();
            for r in 0..PANEL {
                let mut acc = [[0.0; PANEL]; GROUP];
                for (c, a) in acc.iter_mut().enumerate().take(width) {
                    a.copy_from_slice(&tile[c * BLOCK + r * PANEL..c * BLOCK + (r + 1) * PANEL]);
                }
                for (t, lanes) in rows.chunks_exact(PANEL).enumerate() {
                    let x = lanes[r];
                    for (c, a) in acc.iter_mut().enumerate().take(width) {
                        let col = &cols[c * stride + t * PANEL..c * stride + (t + 1) * PANEL];
                        for (s, &y) in a.iter_mut().zip(col) {
                            let e = x - y;
                            *s += e * e;
                        }
                    }
                }
                for (c, a) in acc.iter().enumerate().take(width) {
                    tile[c * BLOCK + r * PANEL..c * BLOCK + (r + 1) * PANEL].copy_from_slice(a);
                }
            }
        }
    )
}

/// Ward distance from the merge of clusters i and j (sizes si, sj, at distance h) to a
/// cluster k of size sk, from d(i, k) and d(j, k): the Lance–Williams recurrence.
fn lance_williams(si: f64, sj: f64, sk: f64, dik: f64, djk: f64, h: f64) -> f64 {
    let v = ((si + sk) * dik.powi(2) + (sj + sk) * djk.powi(2) - sk * h * h) / (si + sj + sk);
    v.max(0.0).sqrt()
}

/// Members of every cluster id (points and merges).
fn members(merges: &[Merge], n: usize) -> Vec<Vec<usize>> {
    let mut m: Vec<Vec<usize>> = (0..n).map(|i| vec![i]).collect();
    for g in merges {
        let mut v = m[g.a].clone();
        v.extend_from_slice(&m[g.b]);
        v.sort_unstable();
        m.push(v);
    }
    m
}

/// The `k` clusters left after all but the last k − 1 merges (scipy
/// `fcluster(criterion="maxclust")` for Ward's monotone heights), each sorted,
/// ordered by their smallest member.
pub fn cut_into(merges: &[Merge], n: usize, k: usize) -> Vec<Vec<usize>> {
    let k = k.clamp(1, n.max(1));
    let all = members(merges, n);
    let kept = n - k;
    let mut alive = vec![true; n + kept];
    for (i, g) in merges[..kept].iter().enumerate() {
        alive[g.a] = false;
        alive[g.b] = false;
        alive[n + i] = true;
    }
    let mut out: Vec<Vec<usize>> = (0..n + kept)
        .filter(|&c| alive[c])
        .map(|c| all[c].clone())
        .collect();
    out.sort_by_key(|c| c[0]);
    out
}

/// The maximal subtrees whose total `weight` is at most `cap` (Clustered Sampling
/// Alg. 2's cut at 1/m); a single point heavier than `cap` is its own cluster.
pub fn cut_by_weight(merges: &[Merge], weight: &[f64], cap: f64) -> Vec<Vec<usize>> {
    let n = weight.len();
    let all = members(merges, n);
    let w = |c: usize| all[c].iter().map(|&i| weight[i]).sum::<f64>();
    let mut out = Vec::new();
    let mut stack = vec![if merges.is_empty() {
        0
    } else {
        n + merges.len() - 1
    }];
    while let Some(c) = stack.pop() {
        if c < n || w(c) <= cap + 1e-12 {
            out.push(all[c].clone());
        } else {
            let g = merges[c - n];
            stack.push(g.a);
            stack.push(g.b);
        }
    }
    out.sort_by_key(|c| c[0]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The full O(n³) scan the cached version replaced: every merge picks the least
    /// distance over all active pairs, the first pair in row-major order on ties.
    fn full_scan(points: &[Vec<f64>]) -> Vec<Merge> {
        let n = points.len();
        let mut d: Vec<Vec<f64>> = points
            .iter()
            .map(|p| {
                points
                    .iter()
                    .map(|q| {
                        p.iter()
                            .zip(q)
                            .map(|(x, y)| (x - y) * (x - y))
                            .sum::<f64>()
                            .sqrt()
                    })
                    .collect()
            })
            .collect();
        let (mut id, mut size, mut active) =
            ((0..n).collect::<Vec<_>>(), vec![1usize; n], vec![true; n]);
        let mut merges = Vec::new();
        for step in 0..n.saturating_sub(1) {
            let mut best = (usize::MAX, usize::MAX, f64::INFINITY);
            for i in 0..n {
                for j in i + 1..n {
                    if active[i] && active[j] && d[i][j] < best.2 {
                        best = (i, j, d[i][j]);
                    }
                }
            }
            let (i, j, h) = best;
            let (si, sj) = (size[i] as f64, size[j] as f64);
            for k in 0..n {
                if active[k] && k != i && k != j {
                    let sk = size[k] as f64;
                    let v = ((si + sk) * d[i][k].powi(2) + (sj + sk) * d[j][k].powi(2)
                        - sk * h * h)
                        / (si + sj + sk);
                    d[i][k] = v.max(0.0).sqrt();
                    d[k][i] = d[i][k];
                }
            }
            merges.push(Merge {
                a: id[i].min(id[j]),
                b: id[i].max(id[j]),
                height: h,
                size: size[i] + size[j],
            });
            size[i] += size[j];
            id[i] = n + step;
            active[j] = false;
        }
        merges
    }

    /// Random points, with exact duplicates and all-zero rows (Clustered Sampling's
    /// clients not yet seen) to exercise ties: the same merges, heights bit for bit.
    /// The blocked distances are the serial sums bit for bit, for every instruction set
    /// this CPU runs and every remainder of the points and features modulo the blocks,
    /// with infinities and NaN passing through as they do serially.
    #[test]
    fn blocked_distances_equal_the_serial_sums() {
        use crate::cpu::Isa;
        use crate::rng::{Purpose, stream};
        use rand::Rng as _;
        let mut rng = stream(5, Purpose::Strategy, 0, 0);
        let isas: Vec<Isa> = [Isa::Baseline, Isa::Avx2, Isa::Avx512]
            .into_iter()
            .filter(|&i| i <= crate::cpu::isa())
            .collect();
        for (n, dims) in [(1, 3), (7, 1), (8, 64), (9, 65), (70, 130), (17, 63)] {
            let mut points: Vec<Vec<f64>> = (0..n)
                .map(|_| (0..dims).map(|_| rng.random_range(-3.0..3.0)).collect())
                .collect();
            if n > 3 {
                points[2][0] = f64::INFINITY;
                points[3][dims - 1] = f64::NAN;
            }
            for &isa in &isas {
                let got = point_distances_on(&points, isa);
                for i in 0..n {
                    for j in 0..n {
                        let want = if i == j {
                            0.0
                        } else {
                            points[i]
                                .iter()
                                .zip(&points[j])
                                .map(|(x, y)| (x - y) * (x - y))
                                .sum::<f64>()
                                .sqrt()
                        };
                        assert_eq!(
                            got[i][j].to_bits(),
                            want.to_bits(),
                            "{isa:?} n {n} dims {dims}: {i} {j}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_cached_scan_merges_as_the_full_scan() {
        use crate::rng::{Purpose, stream};
        use rand::Rng as _;
        for seed in 0..12 {
            let mut rng = stream(seed, Purpose::Strategy, 0, 0);
            let n = 5 + rng.random_range(0..60);
            let dim = 1 + rng.random_range(0..6);
            let mut pts: Vec<Vec<f64>> = (0..n)
                .map(|_| {
                    (0..dim)
                        .map(|_| f64::from(rng.random_range(0..4u8)))
                        .collect()
                })
                .collect();
            for p in pts.iter_mut().step_by(3) {
                if seed % 2 == 0 {
                    p.iter_mut().for_each(|x| *x = 0.0);
                } else {
                    p.iter_mut().for_each(|x| *x += rng.random::<f64>());
                }
            }
            let (fast, slow) = (linkage(&pts), full_scan(&pts));
            assert_eq!(fast.len(), slow.len());
            for (a, b) in fast.iter().zip(&slow) {
                assert_eq!(
                    (a.a, a.b, a.size, a.height.to_bits()),
                    (b.a, b.b, b.size, b.height.to_bits()),
                    "seed {seed}"
                );
            }
        }
    }

    /// Points whose distances are all NaN or infinite still merge n − 1 times into one
    /// tree that every cut can read (it panicked on an index out of bounds before).
    #[test]
    fn non_finite_points_still_make_a_whole_tree() {
        for bad in [f64::NAN, f64::INFINITY] {
            let pts = vec![
                vec![bad, 1.0],
                vec![bad, 2.0],
                vec![0.0, bad],
                vec![1.0, 1.0],
            ];
            let m = linkage(&pts);
            assert_eq!(m.len(), 3);
            assert_eq!(m[2].size, 4);
            let mut all: Vec<usize> = cut_into(&m, 4, 2).concat();
            all.sort_unstable();
            assert_eq!(all, [0, 1, 2, 3]);
        }
    }

    /// Five points on a line, 0, 1, 5, 6, 20. By hand, with the Ward distance
    /// √(2 n_u n_v / (n_u + n_v)) · |centroid_u − centroid_v|:
    /// {0,1} at 1, {5,6} at 1, then {0,1}+{5,6} at √2·5 = 7.0711 (beating {5,6}+{20}
    /// at √(4/3)·14.5 = 16.74), then everything + {20} at √(8/5)·17 = 21.5035.
    #[test]
    fn ward_matches_a_hand_checked_five_point_example() {
        let pts: Vec<Vec<f64>> = [0.0, 1.0, 5.0, 6.0, 20.0]
            .iter()
            .map(|&x| vec![x])
            .collect();
        let m = linkage(&pts);
        let heights: Vec<f64> = m.iter().map(|g| g.height).collect();
        let expected = [1.0, 1.0, 50f64.sqrt(), (1.6f64).sqrt() * 17.0];
        for (h, e) in heights.iter().zip(expected) {
            assert!((h - e).abs() < 1e-9, "{heights:?}");
        }
        assert_eq!((m[0].a, m[0].b), (0, 1));
        assert_eq!((m[1].a, m[1].b), (2, 3));
        assert_eq!((m[2].a, m[2].b, m[2].size), (5, 6, 4));
        assert_eq!(cut_into(&m, 5, 2), vec![vec![0, 1, 2, 3], vec![4]]);
        assert_eq!(cut_into(&m, 5, 3), vec![vec![0, 1], vec![2, 3], vec![4]]);
        assert_eq!(cut_into(&m, 5, 5).len(), 5);
        // Weights: {0,1,2,3} weighs 0.8 > 0.5, so it splits into {0,1} and {2,3}.
        let w = [0.2, 0.2, 0.2, 0.2, 0.2];
        assert_eq!(
            cut_by_weight(&m, &w, 0.5),
            vec![vec![0, 1], vec![2, 3], vec![4]]
        );
        assert_eq!(cut_by_weight(&m, &w, 1.0), vec![vec![0, 1, 2, 3, 4]]);
    }
}

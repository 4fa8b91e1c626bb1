//! The Data-Distribution-Dependency Graph (3DG) of FedGS §3.2 and its
//! all-pairs shortest paths (Alg. 1 lines 2–3).

/// Cosine similarities of feature vectors, clipped at 0 as in Eq. 11–12, with a
/// zero diagonal.
pub fn cosine_similarity(features: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let norms: Vec<f64> = features
        .iter()
        .map(|f| f.iter().map(|x| x * x).sum::<f64>().sqrt())
        .collect();
    let gram: Vec<Vec<f64>> = features
        .iter()
        .map(|a| {
            features
                .iter()
                .map(|b| a.iter().zip(b).map(|(x, y)| x * y).sum())
                .collect()
        })
        .collect();
    similarity_from_gram(&gram, &norms.iter().map(|n| n * n).collect::<Vec<_>>())
}

/// Cosine similarities from a Gram matrix and squared norms (what the secure scalar
/// product protocol gives the server), clipped at 0, with a zero diagonal.
pub fn similarity_from_gram(gram: &[Vec<f64>], sq_norms: &[f64]) -> Vec<Vec<f64>> {
    let n = gram.len();
    (0..n)
        .map(|i| {
            (0..n)
                .map(|j| {
                    let d = (sq_norms[i] * sq_norms[j]).sqrt();
                    if i == j || d <= 0.0 {
                        0.0
                    } else {
                        (gram[i][j] / d).max(0.0)
                    }
                })
                .collect()
        })
        .collect()
}

/// Edge lengths R of the 3DG (FedGS §3.2): similarities are min–max normalised
/// (over the whole matrix, zero diagonal included, as the authors' code does);
/// i ≠ j are joined when V_ij ≥ ε, by an edge of length e^{−V_ij/σ²}; otherwise
/// R_ij = ∞. R_ii = 0.
pub fn adjacency(similarity: &[Vec<f64>], epsilon: f64, sigma2: f64) -> Vec<Vec<f64>> {
    let all = similarity.iter().flatten().copied();
    let (lo, hi) = all.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    let span = if hi > lo { hi - lo } else { 1.0 };
    similarity
        .iter()
        .enumerate()
        .map(|(i, row)| {
            row.iter()
                .enumerate()
                .map(|(j, &s)| {
                    let v = (s - lo) / span;
                    if i == j {
                        0.0
                    } else if v >= epsilon {
                        (-v / sigma2).exp()
                    } else {
                        f64::INFINITY
                    }
                })
                .collect()
        })
        .collect()
}

/// Floyd–Warshall shortest paths H, divided by the largest finite distance;
/// disconnected pairs get 1 (decisions.md). A graph without edges gives 1 off
/// the diagonal.
pub fn shortest_paths(adjacency: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let n = adjacency.len();
    let mut d = adjacency.to_vec();
    for m in 0..n {
        let through = d[m].clone();
        for row in d.iter_mut() {
            let dim = row[m];
            if dim.is_infinite() {
                continue;
            }
            for (dij, dmj) in row.iter_mut().zip(&through) {
                let via = dim + dmj;
                if via < *dij {
                    *dij = via;
                }
            }
        }
    }
    let max = d
        .iter()
        .flatten()
        .copied()
        .filter(|x| x.is_finite())
        .fold(0.0, f64::max);
    for (i, row) in d.iter_mut().enumerate() {
        for (j, x) in row.iter_mut().enumerate() {
            *x = if i == j {
                0.0
            } else if x.is_finite() && max > 0.0 {
                *x / max
            } else {
                1.0
            };
        }
    }
    d
}

/// Precision, recall and F1 of the edges of `built` against those of `oracle`
/// (FedGS Table 3), over unordered pairs. An empty side counts as 0.
pub fn edge_quality(built: &[Vec<f64>], oracle: &[Vec<f64>]) -> (f64, f64, f64) {
    let n = built.len();
    let (mut tp, mut built_edges, mut oracle_edges) = (0usize, 0usize, 0usize);
    for i in 0..n {
        for j in i + 1..n {
            let b = built[i][j].is_finite();
            let o = oracle[i][j].is_finite();
            built_edges += usize::from(b);
            oracle_edges += usize::from(o);
            tp += usize::from(b && o);
        }
    }
    let ratio = |a: usize, b: usize| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    let (p, r) = (ratio(tp, built_edges), ratio(tp, oracle_edges));
    let f1 = if p + r > 0.0 {
        2.0 * p * r / (p + r)
    } else {
        0.0
    };
    (p, r, f1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hand_built_graph_gives_the_expected_paths_and_quality() {
        // Clients 0 and 1 share label 0, 1 and 2 share label 1, 3 holds label 2 alone.
        let features = vec![
            vec![1.0, 0.0, 0.0],
            vec![1.0, 1.0, 0.0],
            vec![0.0, 1.0, 0.0],
            vec![0.0, 0.0, 1.0],
        ];
        let s = cosine_similarity(&features);
        let c = 1.0 / 2f64.sqrt();
        assert!((s[0][1] - c).abs() < 1e-12 && s[0][2] == 0.0 && s[0][3] == 0.0);
        // Normalised by max c: V_01 = V_12 = 1, so both edges have length e^{-1/σ²}.
        let a = adjacency(&s, 0.1, 1.0);
        let e = (-1.0f64).exp();
        assert!((a[0][1] - e).abs() < 1e-12 && (a[1][2] - e).abs() < 1e-12);
        assert!(a[0][2].is_infinite() && a[2][3].is_infinite());
        let h = shortest_paths(&a);
        // 0→2 goes through 1: 2e, the longest finite path, so it normalises to 1;
        // the isolated client 3 is at 1 from everyone.
        assert!((h[0][2] - 1.0).abs() < 1e-12 && (h[0][1] - 0.5).abs() < 1e-12);
        assert_eq!(h[3][0], 1.0);
        assert_eq!(h[2][2], 0.0);
        // A built graph that also joins 2–3 and misses 0–1: precision ½, recall ½.
        let mut built = a.clone();
        built[0][1] = f64::INFINITY;
        built[1][0] = f64::INFINITY;
        built[2][3] = 1.0;
        built[3][2] = 1.0;
        let (p, r, f1) = edge_quality(&built, &a);
        assert!((p - 0.5).abs() < 1e-12 && (r - 0.5).abs() < 1e-12 && (f1 - 0.5).abs() < 1e-12);
    }
}

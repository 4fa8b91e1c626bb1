//! The Data-Distribution-Dependency Graph (3DG) of FedGS §3.2 and its
//! all-pairs shortest paths (Alg. 1 lines 2–3).

use crate::select::Protocol;

/// How a Gram matrix of client features becomes the similarity matrix V (Eq. 10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Similarity {
    /// The inner product itself: the paper's oracle and SSPP similarity (App. D: "the
    /// SSPP-based method only applies when f_sim is a simple dot product").
    InnerProduct,
    /// Cosine, negative values kept (the authors' code for every feature source).
    Cosine,
    /// Cosine clipped at 0 (the paper's Eq. 11 and 12 for updates and responses).
    ClippedCosine,
}

/// The Gram matrix of feature vectors.
pub fn gram(features: &[Vec<f64>]) -> Vec<Vec<f64>> {
    features
        .iter()
        .map(|a| {
            features
                .iter()
                .map(|b| a.iter().zip(b).map(|(x, y)| x * y).sum())
                .collect()
        })
        .collect()
}

/// Similarities of feature vectors, zero diagonal.
pub fn similarity(features: &[Vec<f64>], kind: Similarity) -> Vec<Vec<f64>> {
    from_gram(&gram(features), kind)
}

/// Similarities from a Gram matrix (what the secure scalar product protocol gives the
/// server: the diagonal holds each client's own squared norm), zero diagonal. A zero
/// vector's cosine is 0.
pub fn from_gram(gram: &[Vec<f64>], kind: Similarity) -> Vec<Vec<f64>> {
    let n = gram.len();
    (0..n)
        .map(|i| {
            (0..n)
                .map(|j| {
                    if i == j {
                        return 0.0;
                    }
                    let d = (gram[i][i] * gram[j][j]).sqrt();
                    match kind {
                        Similarity::InnerProduct => gram[i][j],
                        _ if d <= 0.0 => 0.0,
                        Similarity::Cosine => gram[i][j] / d,
                        Similarity::ClippedCosine => (gram[i][j] / d).max(0.0),
                    }
                })
                .collect()
        })
        .collect()
}

/// Edge lengths R of the 3DG (FedGS §3.2). Similarities are min–max normalised over the
/// whole matrix, zero diagonal included, as the authors' code does; negative similarities
/// are kept, so they fall below the threshold instead of being clipped to 0 first. Then
/// i ≠ j are joined:
/// - `paper` (Eq. 13): when V_ij ≥ ε, by an edge of length e^{−V_ij/σ²} (`sigma` is σ²);
/// - `code`: when V_ij > ε, by an edge of length exp(−V_ij²/σ) (`sigma` is σ).
///
/// Otherwise R_ij = ∞. R_ii = 0.
pub fn adjacency(
    similarity: &[Vec<f64>],
    epsilon: f64,
    sigma: f64,
    protocol: Protocol,
) -> Vec<Vec<f64>> {
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
                        return 0.0;
                    }
                    match protocol {
                        Protocol::Paper if v >= epsilon => (-v / sigma).exp(),
                        Protocol::Code if v > epsilon => (-v * v / sigma).exp(),
                        _ => f64::INFINITY,
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
        let s = similarity(&features, Similarity::Cosine);
        let c = 1.0 / 2f64.sqrt();
        assert!((s[0][1] - c).abs() < 1e-12 && s[0][2] == 0.0 && s[0][3] == 0.0);
        // Normalised by max c: V_01 = V_12 = 1, so both edges have length e^{-1/σ²}.
        let a = adjacency(&s, 0.1, 1.0, Protocol::Paper);
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

    /// Negative similarities survive min–max normalisation unclipped, and the two
    /// protocols' edge rules and lengths differ: with V = (−0.5, 0.25, 1) off the
    /// diagonal and 0 on it, min–max over the matrix gives (0, 0.5, 1) and the diagonal
    /// 1/3. Paper (ε = 0.5, σ² = 0.01): V ≥ 0.5 joins pairs 0–2 (length e^{−50}) and 1–2
    /// (e^{−100}). Code (ε = 0.5, σ = 0.1): V > 0.5 joins only 1–2, with length
    /// exp(−1/0.1) = e^{−10}.
    #[test]
    fn negative_similarities_and_the_two_edge_forms() {
        let v = vec![
            vec![0.0, -0.5, 0.25],
            vec![-0.5, 0.0, 1.0],
            vec![0.25, 1.0, 0.0],
        ];
        let paper = adjacency(&v, 0.5, 0.01, Protocol::Paper);
        assert!(paper[0][1].is_infinite());
        assert!((paper[0][2] - (-50.0f64).exp()).abs() < 1e-30);
        assert!((paper[1][2] - (-100.0f64).exp()).abs() < 1e-50);
        let code = adjacency(&v, 0.5, 0.1, Protocol::Code);
        assert!(code[0][1].is_infinite() && code[0][2].is_infinite());
        assert!((code[1][2] - (-10.0f64).exp()).abs() < 1e-15);
        // Cosine keeps the sign, the clipped cosine does not, the inner product keeps
        // the scale.
        let f = vec![vec![2.0, 0.0], vec![-1.0, 0.0], vec![1.0, 1.0]];
        let c = similarity(&f, Similarity::Cosine);
        assert!((c[0][1] + 1.0).abs() < 1e-12);
        assert_eq!(similarity(&f, Similarity::ClippedCosine)[0][1], 0.0);
        let ip = similarity(&f, Similarity::InnerProduct);
        assert_eq!((ip[0][1], ip[0][2], ip[1][1]), (-2.0, 2.0, 0.0));
    }
}

//! The Data-Distribution-Dependency Graph (3DG) of FedGS §3.2, its all-pairs shortest
//! paths (Alg. 1 lines 2–3), and the Table 3 measure of a constructed graph's edges
//! against the oracle's.

use serde::{Deserialize, Serialize};

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

/// The thresholds ε the authors' Table 3 script tries for a constructed graph
/// (`es` in `algorithm/3DG_builder.py` of WwZzz/FedGS; the paper's text lists
/// {0, 0.01, 0.05, 0.1, 0.5}). The table reports each graph at its best ε.
pub const TABLE3_EPSILONS: [f64; 6] = [0.0, 0.01, 0.05, 0.1, 0.2, 0.5];

/// The oracle graph's fixed threshold in the same script (with σ = 0.01).
pub const TABLE3_ORACLE_EPSILON: f64 = 0.1;

/// One threshold's comparison of a constructed 3DG's edges with the oracle's, as pair
/// counts over i < j; [`EdgeQuality::as_code`] adds the diagonal the way the script does.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EdgeQuality {
    /// The constructed graph's threshold ε.
    pub epsilon: f64,
    /// Clients n: the diagonal pairs the script counts in every edge set.
    pub clients: usize,
    /// Pairs i < j joined in the constructed graph.
    pub built: usize,
    /// Pairs i < j joined in the oracle graph.
    pub oracle: usize,
    /// Pairs i < j joined in both.
    pub matched: usize,
}

impl EdgeQuality {
    /// Precision, recall and F1 as `measure_3DG_construction` in `3DG_builder.py` computes
    /// them, which is what FedGS Table 3 reports. Its edge lists take the pairs i ≤ j whose
    /// length is finite and ≥ 0, and the adjacency's diagonal is 0, so each of the n
    /// self-pairs is an edge of both graphs: n is added to every count. This keeps precision
    /// and recall above 0 and pulls them towards 1 (by n / (n + edges)); the F1 is the
    /// harmonic mean 2 / (1/P + 1/R), as the script writes it.
    pub fn as_code(&self) -> (f64, f64, f64) {
        let n = self.clients;
        scores(self.matched + n, self.built + n, self.oracle + n)
    }

    /// The same over the pairs i < j only, the measure without the script's diagonal. An
    /// empty edge set gives 0.
    pub fn off_diagonal(&self) -> (f64, f64, f64) {
        scores(self.matched, self.built, self.oracle)
    }
}

fn scores(matched: usize, built: usize, oracle: usize) -> (f64, f64, f64) {
    let ratio = |a: usize, b: usize| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    let (p, r) = (ratio(matched, built), ratio(matched, oracle));
    let f1 = if p > 0.0 && r > 0.0 {
        2.0 / (1.0 / p + 1.0 / r)
    } else {
        0.0
    };
    (p, r, f1)
}

/// Which pairs i < j the Table 3 script's `create_graph_from_similarity` joins: s_ij > ε,
/// on the raw similarity (no min–max normalisation, unlike the selection graph). The length
/// it gives an edge, exp(−s²/σ), is finite and ≥ 0 for every σ > 0 (an underflow to 0 still
/// counts), so σ cannot change the edge set and is no argument here.
fn script_edges(similarity: &[Vec<f64>], epsilon: f64) -> Vec<(usize, usize)> {
    let n = similarity.len();
    (0..n)
        .flat_map(|i| (i + 1..n).map(move |j| (i, j)))
        .filter(|&(i, j)| similarity[i][j] > epsilon)
        .collect()
}

/// FedGS Table 3 as `algorithm/3DG_builder.py` of WwZzz/FedGS computes it: the oracle 3DG
/// joins pairs whose label distributions' inner product exceeds
/// [`TABLE3_ORACLE_EPSILON`], the constructed one pairs whose similarity (the script's
/// clipped cosine of updates or of noise responses) exceeds each ε of
/// [`TABLE3_EPSILONS`]; one comparison per ε. Both similarities are taken as they are, not
/// normalised.
pub fn table3_quality(built: &[Vec<f64>], oracle: &[Vec<f64>]) -> Vec<EdgeQuality> {
    let truth: std::collections::BTreeSet<(usize, usize)> =
        script_edges(oracle, TABLE3_ORACLE_EPSILON)
            .into_iter()
            .collect();
    TABLE3_EPSILONS
        .iter()
        .map(|&epsilon| {
            let edges = script_edges(built, epsilon);
            EdgeQuality {
                epsilon,
                clients: built.len(),
                built: edges.len(),
                oracle: truth.len(),
                matched: edges.iter().filter(|e| truth.contains(e)).count(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hand_built_graph_gives_the_expected_paths() {
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
    }

    /// Table 3 on four clients, by hand. Label distributions (0.5, 0.5, 0, 0),
    /// (0.5, 0, 0.5, 0), (0, 0, 0.5, 0.5), (0.2, 0, 0, 0.8) have inner products 0.25 (0–1),
    /// 0.25 (1–2), 0.4 (2–3), exactly 0.1 (0–3, 1–3) and 0 (0–2): the oracle at s > 0.1
    /// joins {0–1, 1–2, 2–3}. The constructed similarities 0.3 (0–1), 0.05 (0–2), 0 (0–3),
    /// 0.15 (1–2), 0.6 (1–3), 0.005 (2–3) join, per ε (matched / built off the diagonal):
    /// 0: all but 0–3 (3 / 5); 0.01: 0–1, 0–2, 1–2, 1–3 (2 / 4); 0.05 and 0.1: 0–1, 1–2, 1–3
    /// (2 / 3; 0.05 is not > 0.05); 0.2: 0–1, 1–3 (1 / 2); 0.5: 1–3 (0 / 1). The script adds
    /// the 4 self-pairs to matched, built and oracle (3 + 4 = 7).
    #[test]
    fn table3_counts_pairs_as_the_authors_script_with_and_without_its_diagonal() {
        let labels = vec![
            vec![0.5, 0.5, 0.0, 0.0],
            vec![0.5, 0.0, 0.5, 0.0],
            vec![0.0, 0.0, 0.5, 0.5],
            vec![0.2, 0.0, 0.0, 0.8],
        ];
        let oracle = similarity(&labels, Similarity::InnerProduct);
        assert_eq!(oracle[0][3], 0.1);
        let pairs = [
            ((0, 1), 0.3),
            ((0, 2), 0.05),
            ((0, 3), 0.0),
            ((1, 2), 0.15),
            ((1, 3), 0.6),
            ((2, 3), 0.005),
        ];
        let mut built = vec![vec![0.0; 4]; 4];
        for ((i, j), s) in pairs {
            built[i][j] = s;
            built[j][i] = s;
        }
        let q = table3_quality(&built, &oracle);
        let eps: Vec<f64> = q.iter().map(|x| x.epsilon).collect();
        assert_eq!(eps, TABLE3_EPSILONS);
        let counts: Vec<(usize, usize, usize)> =
            q.iter().map(|x| (x.matched, x.built, x.oracle)).collect();
        assert_eq!(
            counts,
            [
                (3, 5, 3),
                (2, 4, 3),
                (2, 3, 3),
                (2, 3, 3),
                (1, 2, 3),
                (0, 1, 3)
            ]
        );
        let close = |a: (f64, f64, f64), b: (f64, f64, f64)| {
            assert!(
                (a.0 - b.0).abs() < 1e-12 && (a.1 - b.1).abs() < 1e-12 && (a.2 - b.2).abs() < 1e-12,
                "{a:?} vs {b:?}"
            );
        };
        // With the diagonal: P = (m + 4)/(b + 4), R = (m + 4)/7, F1 = 2/(1/P + 1/R).
        let code = [
            (7.0 / 9.0, 1.0, 14.0 / 16.0),
            (6.0 / 8.0, 6.0 / 7.0, 12.0 / 15.0),
            (6.0 / 7.0, 6.0 / 7.0, 6.0 / 7.0),
            (6.0 / 7.0, 6.0 / 7.0, 6.0 / 7.0),
            (5.0 / 6.0, 5.0 / 7.0, 10.0 / 13.0),
            (4.0 / 5.0, 4.0 / 7.0, 2.0 / 3.0),
        ];
        let pairs_only = [
            (3.0 / 5.0, 1.0, 0.75),
            (0.5, 2.0 / 3.0, 4.0 / 7.0),
            (2.0 / 3.0, 2.0 / 3.0, 2.0 / 3.0),
            (2.0 / 3.0, 2.0 / 3.0, 2.0 / 3.0),
            (0.5, 1.0 / 3.0, 0.4),
            (0.0, 0.0, 0.0),
        ];
        for (x, (c, o)) in q.iter().zip(code.into_iter().zip(pairs_only)) {
            close(x.as_code(), c);
            close(x.off_diagonal(), o);
        }
        // The diagonal keeps the script's precision at 0.8 where no constructed edge is right.
        assert_eq!(q[5].as_code().0, 0.8);
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

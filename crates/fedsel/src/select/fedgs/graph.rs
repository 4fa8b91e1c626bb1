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

/// The Gram matrix of feature vectors, rows in parallel (each entry the same sequential
/// sum whatever thread computes it).
pub fn gram(features: &[Vec<f64>]) -> Vec<Vec<f64>> {
    use rayon::prelude::*;
    features
        .par_iter()
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
    use rayon::prelude::*;
    let n = gram.len();
    (0..n)
        .into_par_iter()
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
    use rayon::prelude::*;
    similarity
        .par_iter()
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
/// the diagonal. `adjacency` is symmetric and square, with a zero diagonal and
/// non-negative lengths (what [`adjacency`] gives).
///
/// O(n³) time and one n × n matrix (the adjacency's own storage); the time is the
/// setup's at 10,000 clients. The textbook loop (every row against intermediate m, for
/// m = 0, 1, …) streams the whole matrix once per m, n passes over memory. Here the same
/// relaxations run phase by phase, [`PHASE`] intermediates a pass, on the upper triangle
/// only: the textbook keeps a symmetric matrix symmetric bit for bit (d_im + d_mj and
/// d_jm + d_mi are the same sum), so row m's entries are column m's, and every entry
/// i < j goes through the textbook's comparisons in its order. H is the textbook's bit
/// for bit (`tests::the_phased_loop_is_the_textbook_one`) at half its arithmetic.
pub fn shortest_paths(adjacency: Vec<Vec<f64>>) -> Vec<Vec<f64>> {
    shortest_paths_with(adjacency, crate::cpu::isa())
}

/// [`shortest_paths`] with the relaxations compiled for `isa` (one this CPU runs).
///
/// Each phase M = m0..m0 + b of intermediates, with D the matrix before it and m = m0 + t:
/// 1. the textbook loop on the b × b block D[M][M], whose row m at the start of step m is
///    the textbook's pivot row m there;
/// 2. for every row i, its b entries D[i][M] (read from the upper triangle) relaxed in
///    order against those pivots, which records `reads[i][t]`, the textbook's D[i][m] at
///    step m, and gives the final D[i][M] (written back where it is upper);
/// 3. by symmetry the pivot row m outside the block is column m at step m:
///    `reads[j][t]` for every j;
/// 4. every row's upper entries outside M relaxed through M in order, tile by tile.
fn shortest_paths_with(adjacency: Vec<Vec<f64>>, isa: crate::cpu::Isa) -> Vec<Vec<f64>> {
    use rayon::prelude::*;
    let mut d = adjacency;
    let n = d.len();
    let mut block = vec![0.0; PHASE * PHASE];
    let mut diag = vec![0.0; PHASE * PHASE];
    let mut cols = vec![0.0; n * PHASE];
    let mut reads = vec![0.0; n * PHASE];
    let mut pivots = vec![0.0; PHASE * n];
    for m0 in (0..n).step_by(PHASE) {
        let b = PHASE.min(n - m0);
        // 1. The block, in the textbook's order.
        let (block, diag) = (&mut block[..b * b], &mut diag[..b * b]);
        for p in 0..b {
            for q in 0..b {
                let (i, j) = (m0 + p.min(q), m0 + p.max(q));
                block[p * b + q] = d[i][j];
            }
        }
        for t in 0..b {
            diag[t * b..(t + 1) * b].copy_from_slice(&block[t * b..(t + 1) * b]);
            for p in 0..b {
                let v = block[p * b + t];
                if v.is_infinite() {
                    continue;
                }
                for q in 0..b {
                    let via = v + diag[t * b + q];
                    if via < block[p * b + q] {
                        block[p * b + q] = via;
                    }
                }
            }
        }
        let diag = &*diag;
        // 2. Every row's entries in the block's columns.
        let (cols, reads) = (&mut cols[..n * b], &mut reads[..n * b]);
        for (i, c) in cols.chunks_mut(b).enumerate().take(m0 + b) {
            let from = i.saturating_sub(m0);
            c[from..].copy_from_slice(&d[i][m0 + from..m0 + b]);
        }
        for t in 0..b {
            let m = m0 + t;
            for (c, &x) in cols.chunks_mut(b).skip(m + 1).zip(&d[m][m + 1..]) {
                c[t] = x;
            }
        }
        cols.par_chunks_mut(b)
            .zip(reads.par_chunks_mut(b))
            .for_each(|(c, r)| relax_block_columns(isa, c, r, diag));
        for (i, c) in cols.chunks(b).enumerate().take(m0 + b) {
            let from = i.saturating_sub(m0);
            d[i][m0 + from..m0 + b].copy_from_slice(&c[from..]);
        }
        let reads = &*reads;
        // 3. The pivot rows.
        let pivots = &mut pivots[..b * n];
        for (j, r) in reads.chunks(b).enumerate() {
            for (t, &v) in r.iter().enumerate() {
                pivots[t * n + j] = v;
            }
        }
        let pivots = &*pivots;
        // 4. The rest of the upper triangle: rows are independent given the pivot rows, each
        // relaxed in the textbook's order whatever thread runs it.
        d.par_chunks_mut(ROWS).enumerate().for_each(|(c, rows)| {
            relax_rows(isa, rows, c * ROWS, m0, b, pivots, reads);
        });
    }
    let max = d
        .iter()
        .enumerate()
        .flat_map(|(i, row)| row[i..].iter().copied())
        .filter(|x| x.is_finite())
        .fold(0.0, f64::max);
    // The upper triangle normalised, then mirrored row by row.
    for (i, row) in d.iter_mut().enumerate() {
        row[i] = 0.0;
        for x in &mut row[i + 1..] {
            *x = if x.is_finite() && max > 0.0 {
                *x / max
            } else {
                1.0
            };
        }
    }
    for i in 1..n {
        let (above, below) = d.split_at_mut(i);
        for (j, row) in above.iter().enumerate() {
            below[0][j] = row[i];
        }
    }
    d
}

/// Intermediates of one phase of [`shortest_paths`]: their pivot rows (PHASE × n) stay
/// in cache while the rows pass.
const PHASE: usize = 128;
/// Rows a task relaxes together, so that each column tile of the pivot rows is read
/// from cache once for all of them.
const ROWS: usize = 16;
/// Columns of a row relaxed in registers through a phase's intermediates.
const LANES: usize = 32;

/// Step 2 of [`shortest_paths_with`] for one row: `cols` (its entries in the phase's
/// columns) relaxed through the phase's intermediates in order against the block's pivot
/// rows `diag` (b × b), each entry d(row, m) recorded in `reads[t]` before step m.
fn relax_block_columns(isa: crate::cpu::Isa, cols: &mut [f64], reads: &mut [f64], diag: &[f64]) {
    crate::cpu::on_isa!(
        isa,
        fn relax(cols: &mut [f64], reads: &mut [f64], diag: &[f64]) {
            let b = cols.len();
            for t in 0..b {
                let v = cols[t];
                reads[t] = v;
                if v.is_infinite() {
                    continue;
                }
                for (x, &y) in cols.iter_mut().zip(&diag[t * b..(t + 1) * b]) {
                    let via = v + y;
                    if via < *x {
                        *x = via;
                    }
                }
            }
        }
    )
}

/// Step 4 of [`shortest_paths_with`] for rows `first..first + rows.len()`: each row i's
/// entries j > i outside the phase's columns m0..m0 + b become min(entry, d(i, m) +
/// pivot_m[j]) for each m of the phase in turn, the textbook's relaxation compared as it
/// does (`via < entry`), with d(i, m) = `reads[i][t]`. A tile of [`LANES`] columns stays
/// in registers through the phase, and each pivot tile is read once for the rows.
fn relax_rows(
    isa: crate::cpu::Isa,
    rows: &mut [Vec<f64>],
    first: usize,
    m0: usize,
    b: usize,
    pivots: &[f64],
    reads: &[f64],
) {
    crate::cpu::on_isa!(
        isa,
        fn relax(
            rows: &mut [Vec<f64>],
            first: usize,
            m0: usize,
            b: usize,
            pivots: &[f64],
            reads: &[f64],
        ) {
            let n = pivots.len() / b;
            let lo = first + 1;
            for span in [lo.min(m0)..m0, lo.max(m0 + b)..n] {
                for j0 in span.clone().step_by(LANES) {
                    let end = (j0 + LANES).min(span.end);
                    for (r, row) in rows.iter_mut().enumerate() {
                        let i = first + r;
                        let start = j0.max(i + 1);
                        if start >= end {
                            continue;
                        }
                        let read = &reads[i * b..(i + 1) * b];
                        let tile = &mut row[start..end];
                        if tile.len() == LANES {
                            let mut acc = [0.0; LANES];
                            acc.copy_from_slice(tile);
                            for (t, &v) in read.iter().enumerate() {
                                if v.is_infinite() {
                                    continue;
                                }
                                let pivot = &pivots[t * n + start..t * n + start + LANES];
                                for (x, &y) in acc.iter_mut().zip(pivot) {
                                    let via = v + y;
                                    if via < *x {
                                        *x = via;
                                    }
                                }
                            }
                            tile.copy_from_slice(&acc);
                        } else {
                            for (t, &v) in read.iter().enumerate() {
                                if v.is_infinite() {
                                    continue;
                                }
                                let pivot = &pivots[t * n + start..t * n + end];
                                for (x, &y) in tile.iter_mut().zip(pivot) {
                                    let via = v + y;
                                    if via < *x {
                                        *x = via;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    )
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
pub(super) mod tests {
    use super::*;

    /// The textbook Floyd–Warshall loop the phased one replaced: every row against
    /// intermediate m, for m = 0, 1, …, then the same normalisation.
    pub(in crate::select::fedgs) fn textbook_shortest_paths(
        adjacency: &[Vec<f64>],
    ) -> Vec<Vec<f64>> {
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

    /// The phased loop gives the textbook's distances bit for bit: on random graphs of
    /// every size around the phase and tile widths (sparse, so that paths chain through
    /// many intermediates, with lengths whose sums round), on FedGS's FMNIST-like oracle
    /// graph at the paper's 100 clients under both protocols, and with the narrower
    /// instruction sets' copies.
    #[test]
    fn the_phased_loop_is_the_textbook_one() {
        use crate::rng::{Purpose, stream};
        use rand::Rng as _;
        let mut rng = stream(5, Purpose::Strategy, 0, 0);
        for n in [1, 2, 31, 33, 64, 65, 100, 127, 128, 129, 200, 300] {
            for density in [0.03, 0.3] {
                let mut a = vec![vec![f64::INFINITY; n]; n];
                for (i, j) in (0..n).flat_map(|i| (i..n).map(move |j| (i, j))) {
                    if i == j {
                        a[i][i] = 0.0;
                    } else if rng.random::<f64>() < density {
                        let w = rng.random::<f64>() * 3.0;
                        a[i][j] = w;
                        a[j][i] = w;
                    }
                }
                let want = textbook_shortest_paths(&a);
                let got = shortest_paths(a);
                for (x, y) in want.iter().flatten().zip(got.iter().flatten()) {
                    assert_eq!(x.to_bits(), y.to_bits(), "n = {n}, density {density}");
                }
            }
        }
        let features: Vec<Vec<f64>> = (0..100)
            .map(|k| {
                let mut f = vec![0.0; 10];
                f[k % 10] += 0.5;
                f[(k / 10 + 3 * k + 1) % 10] += 0.5;
                f
            })
            .collect();
        for (kind, epsilon, sigma, protocol) in [
            (Similarity::InnerProduct, 0.1, 0.01, Protocol::Paper),
            (Similarity::Cosine, 0.01, 0.1, Protocol::Code),
        ] {
            let a = adjacency(&similarity(&features, kind), epsilon, sigma, protocol);
            let want = textbook_shortest_paths(&a);
            assert_eq!(shortest_paths(a.clone()), want);
            for isa in [crate::cpu::Isa::Baseline, crate::cpu::Isa::Avx2] {
                if isa <= crate::cpu::isa() {
                    assert_eq!(shortest_paths_with(a.clone(), isa), want);
                }
            }
        }
    }

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
        let h = shortest_paths(a.clone());
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

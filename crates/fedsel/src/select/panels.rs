//! Sums over every pair of a set of vectors, blocked as a matrix product is but without
//! reordering any sum: DivFL's dot products and Ward's squared differences. A blocked
//! matrix product would reorder each pair's sum; here each pair's terms are still added one
//! by one in feature order, so the results are the bits of a serial pass.
//!
//! The vectors are cut into panels of [`PANEL`] and the features into blocks; per block
//! the panels are widened to f64 and interleaved (panel p, feature t, lane l at
//! (p·depth + t)·PANEL + l), and each tile of one row panel against a few column panels
//! adds the block's terms to its running sums while the block sits in cache. Row panels run
//! in parallel, each tile's sums in a fixed order whatever the thread count.

use rayon::prelude::*;

/// Vectors per panel: one AVX-512 vector of f64.
pub(crate) const PANEL: usize = 8;
/// Running sums of one row panel against one column panel.
pub(crate) const BLOCK: usize = PANEL * PANEL;

/// The running sums of every pair i ≤ j, from [`pair_sums`].
#[derive(Debug, Clone, Default)]
pub(crate) struct PairSums {
    /// Row panel p against column panels p.., entry (q − p)·BLOCK + r·PANEL + l the sum of
    /// vectors p·PANEL + r and q·PANEL + l.
    sums: Vec<Vec<f64>>,
}

impl PairSums {
    /// The sum of vectors `i` and `j`, `i ≤ j`.
    pub(crate) fn get(&self, i: usize, j: usize) -> f64 {
        self.sums[i / PANEL][(j / PANEL - i / PANEL) * BLOCK + i % PANEL * PANEL + j % PANEL]
    }

    /// The sums of row panel `p` against column panel `q`, `p ≤ q`: entry r·PANEL + l that
    /// of vectors p·PANEL + r and q·PANEL + l (lanes past the last vector unspecified).
    pub(crate) fn tile(&self, p: usize, q: usize) -> &[f64] {
        &self.sums[p][(q - p) * BLOCK..(q - p + 1) * BLOCK]
    }

    /// Applies `f(p, q, tile)` to the sums of every row panel p against column panel
    /// q ≥ p, the row panels in parallel: each tile is rewritten once, by one thread.
    pub(crate) fn for_each_tile_mut(&mut self, f: impl Fn(usize, usize, &mut [f64]) + Sync) {
        self.sums.par_iter_mut().enumerate().for_each(|(p, row)| {
            for (c, tile) in row.chunks_exact_mut(BLOCK).enumerate() {
                f(p, p + c, tile);
            }
        });
    }
}

/// Every pair's sum over the features of `points` (all of one length), starting at −0.0 as
/// `Iterator::sum` does, in blocks of at most `depth` features: `tile(sums, rows, cols,
/// depth)` adds, for each feature of the block in order, the term of row r and column c to
/// `sums[c / PANEL · BLOCK + r · PANEL + c % PANEL]`, where `rows` is one packed panel and
/// `cols` up to `group` consecutive ones.
pub(crate) fn pair_sums<T: Copy + Into<f64> + Sync>(
    points: &[&[T]],
    depth: usize,
    group: usize,
    tile: impl Fn(&mut [f64], &[f64], &[f64], usize) + Sync,
) -> PairSums {
    let mut sums = PairSums::default();
    pair_sums_into(points, depth, group, tile, &mut sums);
    sums
}

/// [`pair_sums`] into `out`, reusing its memory: DivFL's ideal refresh sums every pair
/// every round (400 MB at 10,000 clients), which, allocated afresh, is faulted in page by
/// page every round.
pub(crate) fn pair_sums_into<T: Copy + Into<f64> + Sync>(
    points: &[&[T]],
    depth: usize,
    group: usize,
    tile: impl Fn(&mut [f64], &[f64], &[f64], usize) + Sync,
    out: &mut PairSums,
) {
    let n = points.len();
    let dims = points.first().map_or(0, |v| v.len());
    assert!(
        points.iter().all(|v| v.len() == dims),
        "pairwise sums over vectors of one length"
    );
    let panels = n.div_ceil(PANEL);
    let sums = &mut out.sums;
    sums.resize_with(panels, Vec::new);
    sums.par_iter_mut().enumerate().for_each(|(p, row)| {
        row.clear();
        row.resize((panels - p) * BLOCK, -0.0);
    });
    let mut packed = vec![0.0; panels * depth * PANEL];
    for start in (0..dims).step_by(depth) {
        let depth = depth.min(dims - start);
        let stride = depth * PANEL;
        let packed = &mut packed[..panels * stride];
        packed
            .par_chunks_mut(stride)
            .enumerate()
            .for_each(|(p, panel)| {
                // Lanes past the last vector keep what they hold: their sums are never read.
                for l in 0..PANEL {
                    if let Some(v) = points.get(p * PANEL + l) {
                        for (t, &x) in v[start..start + depth].iter().enumerate() {
                            panel[t * PANEL + l] = x.into();
                        }
                    }
                }
            });
        let packed = &*packed;
        sums.par_iter_mut().enumerate().for_each(|(p, row_sums)| {
            let rows = &packed[p * stride..(p + 1) * stride];
            for q in (p..panels).step_by(group) {
                let width = group.min(panels - q);
                let tiles = &mut row_sums[(q - p) * BLOCK..(q - p + width) * BLOCK];
                tile(
                    tiles,
                    rows,
                    &packed[q * stride..(q + width) * stride],
                    depth,
                );
            }
        });
    }
}

/// Every sum of a row vector with a column vector over their features (all of one length),
/// as [`pair_sums`] adds them (from −0.0, blocks of at most `depth` features, the same
/// `tile`): `out[r][j]` for row `r` and column `j`, each the bits of a serial pass. For the
/// few clients that reported in a round against all N: one pass over the columns, where a
/// row at a time reads all of them once per row (K passes over N vectors). Groups of
/// `group` column panels run in parallel, each with its own running sums, so the order of
/// every sum is fixed whatever the thread count.
pub(crate) fn cross_sums<T: Copy + Into<f64> + Sync>(
    rows: &[&[T]],
    cols: &[&[T]],
    depth: usize,
    group: usize,
    tile: impl Fn(&mut [f64], &[f64], &[f64], usize) + Sync,
) -> Vec<Vec<f64>> {
    let dims = rows.first().or(cols.first()).map_or(0, |v| v.len());
    assert!(
        rows.iter().chain(cols).all(|v| v.len() == dims),
        "cross sums over vectors of one length"
    );
    let (row_panels, col_panels) = (rows.len().div_ceil(PANEL), cols.len().div_ceil(PANEL));
    // Lanes past the last vector keep what they hold: their sums are never read.
    let pack = |vs: &[&[T]], first: usize, start: usize, depth: usize, panel: &mut [f64]| {
        for l in 0..PANEL {
            if let Some(v) = vs.get(first + l) {
                for (t, &x) in v[start..start + depth].iter().enumerate() {
                    panel[t * PANEL + l] = x.into();
                }
            }
        }
    };
    let blocks: Vec<(usize, usize)> = (0..dims)
        .step_by(depth.max(1))
        .map(|start| (start, depth.min(dims - start)))
        .collect();
    // The rows' panels of every block, packed once.
    let packed_rows: Vec<Vec<f64>> = blocks
        .iter()
        .map(|&(start, depth)| {
            let mut p = vec![0.0; row_panels * depth * PANEL];
            for (rp, panel) in p.chunks_mut(depth * PANEL).enumerate() {
                pack(rows, rp * PANEL, start, depth, panel);
            }
            p
        })
        .collect();
    let groups: Vec<Vec<f64>> = (0..col_panels.div_ceil(group))
        .into_par_iter()
        .map(|g| {
            let first = g * group;
            let width = group.min(col_panels - first);
            let mut sums = vec![-0.0; row_panels * width * BLOCK];
            let mut packed = vec![0.0; width * depth * PANEL];
            for (&(start, depth), rows) in blocks.iter().zip(&packed_rows) {
                let stride = depth * PANEL;
                let packed = &mut packed[..width * stride];
                for (c, panel) in packed.chunks_mut(stride).enumerate() {
                    pack(cols, (first + c) * PANEL, start, depth, panel);
                }
                for (rp, tiles) in sums.chunks_mut(width * BLOCK).enumerate() {
                    tile(tiles, &rows[rp * stride..(rp + 1) * stride], packed, depth);
                }
            }
            sums
        })
        .collect();
    (0..rows.len())
        .map(|r| {
            (0..cols.len())
                .map(|j| {
                    let (q, g) = (j / PANEL, j / PANEL / group);
                    let width = group.min(col_panels - g * group);
                    groups[g][(r / PANEL * width + q - g * group) * BLOCK
                        + r % PANEL * PANEL
                        + j % PANEL]
                })
                .collect()
        })
        .collect()
}

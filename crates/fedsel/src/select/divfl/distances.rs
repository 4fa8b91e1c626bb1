//! DivFL's pairwise gradient distances, ‖g_i − g_j‖ = √(‖g_i‖² + ‖g_j‖² − 2 g_i·g_j),
//! with every dot product the plain sequential f64 sum over the parameters in order, so
//! that the selections stay bit for bit the ones of the one-at-a-time loop.
//!
//! The blocking is [`pair_sums_into`]'s (panels of [`PANEL`] clients, blocks of [`DEPTH`]
//! parameters); each tile of one row panel against up to [`GROUP`] column panels carries
//! its PANEL × GROUP·PANEL running sums in registers through the block: each sum still adds
//! its products in parameter order, but the gradients are read from cache, not memory, and
//! 24 (AVX-512) or 12 (AVX2) independent chains of additions keep the core's vector units
//! busy. A product of two widened f32 is exact in f64 (24 + 24 significant bits), so a
//! fused multiply-add rounds once where mul-then-add rounds once: the same bits.

use rayon::prelude::*;

use crate::select::panels::{BLOCK, PANEL, PairSums, cross_sums, pair_sums_into};

/// Column panels per tile: 8 × 3 accumulator vectors fill 24 of AVX-512's 32 registers.
const GROUP: usize = 3;
/// Parameters per block: a block of 1,000 clients' gradients is 1 MB, within L2.
const DEPTH: usize = 128;

/// The tile kernel a CPU runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kernel {
    /// Any CPU: plain loops the compiler vectorises for the baseline target.
    Portable,
    /// x86-64 with AVX2 and FMA.
    Avx2,
    /// x86-64 with AVX-512F.
    Avx512,
}

impl Kernel {
    /// The widest kernel this CPU runs ([`crate::cpu::isa`]).
    pub(super) fn detect() -> Self {
        match crate::cpu::isa() {
            crate::cpu::Isa::Avx512 => Self::Avx512,
            crate::cpu::Isa::Avx2 => Self::Avx2,
            crate::cpu::Isa::Baseline => Self::Portable,
        }
    }

    /// Every kernel this CPU runs.
    #[cfg(test)]
    pub(super) fn available() -> Vec<Self> {
        [Self::Portable, Self::Avx2, Self::Avx512]
            .into_iter()
            .filter(|k| match (k, Self::detect()) {
                (Self::Portable, _) => true,
                (Self::Avx2, d) => d != Self::Portable,
                (Self::Avx512, d) => d == Self::Avx512,
            })
            .collect()
    }
}

/// Pairwise Euclidean distances of gradient vectors (all of one length).
pub fn gradient_distances(g: &[&[f32]]) -> Vec<Vec<f64>> {
    distances_with(g, Kernel::detect())
}

/// [`gradient_distances`] with the given kernel.
pub(super) fn distances_with(g: &[&[f32]], kernel: Kernel) -> Vec<Vec<f64>> {
    let mut tiled = Tiled::default();
    tiled.fill(g, kernel);
    tiled.rows()
}

/// The distances of [`gradient_distances`] kept as their upper triangle of PANEL × PANEL
/// tiles, as the dot products were summed: half the memory of the N × N rows (400 MB at
/// 10,000 clients) and no pass writing them out. The ideal refresh's greedy reads them
/// in place, a row panel of candidates at a time ([`Tiled::costs`]), and keeps the memory
/// between rounds.
#[derive(Debug, Clone, Default)]
pub(super) struct Tiled {
    roots: PairSums,
    n: usize,
}

impl Tiled {
    /// The distances between the vectors of `g`, replacing what was kept.
    pub(super) fn refill(&mut self, g: &[&[f32]]) {
        self.fill(g, Kernel::detect());
    }

    fn fill(&mut self, g: &[&[f32]], kernel: Kernel) {
        let n = g.len();
        pair_sums_into(
            g,
            DEPTH,
            GROUP,
            |tile, rows, cols, depth| accumulate(kernel, tile, rows, cols, depth),
            &mut self.roots,
        );
        let panels = n.div_ceil(PANEL);
        // Lanes past the last vector: their entries are never read.
        let mut sq: Vec<f64> = (0..n).map(|i| self.roots.get(i, i)).collect();
        sq.resize(panels * PANEL, 0.0);
        let isa = crate::cpu::isa();
        // Each pair's distance once, in its tile of the upper triangle, vectorised over
        // the tile; a point's distance to itself is 0.
        self.roots.for_each_tile_mut(|p, q, tile| {
            tile_distances(isa, tile, &sq[p * PANEL..], &sq[q * PANEL..]);
            if p == q {
                for r in 0..PANEL {
                    tile[r * PANEL + r] = 0.0;
                }
            }
        });
        self.n = n;
    }

    /// The number of vectors.
    pub(super) fn len(&self) -> usize {
        self.n
    }

    /// ‖g_a − g_b‖.
    pub(super) fn at(&self, a: usize, b: usize) -> f64 {
        self.roots.get(a.min(b), a.max(b))
    }

    /// Σ_i min(nearest_i, d(j, i)) for every point j of a row panel holding a candidate,
    /// as (j, cost): one sequential sum over the points in order from −0.0, the panels in
    /// parallel, each summing its PANEL lanes side by side through the tiles of its row
    /// and column, so that a panel costs one pass over N·PANEL distances, as PANEL rows do.
    pub(super) fn costs(&self, nearest: &[f64], candidates: &[usize]) -> Vec<(usize, f64)> {
        let mut panels: Vec<usize> = candidates.iter().map(|&c| c / PANEL).collect();
        panels.sort_unstable();
        panels.dedup();
        let isa = crate::cpu::isa();
        let n = self.n;
        panels
            .par_iter()
            .flat_map_iter(|&p| {
                let sums = self.panel_costs(isa, p, nearest);
                (p * PANEL..((p + 1) * PANEL).min(n)).zip(sums)
            })
            .collect()
    }

    /// [`Self::costs`] of the PANEL lanes of row panel `p`.
    fn panel_costs(&self, isa: crate::cpu::Isa, p: usize, nearest: &[f64]) -> [f64; PANEL] {
        let mut sums = [-0.0f64; PANEL];
        let mut turned = [0.0f64; BLOCK];
        for q in 0..self.n.div_ceil(PANEL) {
            let near = &nearest[q * PANEL..((q + 1) * PANEL).min(self.n)];
            // Entry l·PANEL + r: the distance of point q·PANEL + l to candidate lane r.
            let tile = if q < p {
                self.roots.tile(q, p)
            } else {
                let tile = self.roots.tile(p, q);
                for (r, row) in tile.chunks_exact(PANEL).enumerate() {
                    for (l, &v) in row.iter().enumerate() {
                        turned[l * PANEL + r] = v;
                    }
                }
                &turned[..]
            };
            add_nearer(isa, &mut sums, tile, near);
        }
        sums
    }

    /// Every row in full ([`gradient_distances`]: the stale refresh's first matrix). A row
    /// panel at a time, a tile at a time: entry (i, j) is pair (min, max)'s one expression
    /// (floating-point addition commutes, so both halves hold the same bits), read whole
    /// for the rows of its row panel and, transposed, for those of its column panel; read
    /// entry by entry, each of the lower triangle's was a cache line of its own.
    pub(super) fn rows(&self) -> Vec<Vec<f64>> {
        let n = self.n;
        let mut out = vec![vec![0.0; n]; n];
        out.par_chunks_mut(PANEL).enumerate().for_each(|(q, rows)| {
            for p in 0..n.div_ceil(PANEL) {
                let roots = self.roots.tile(p.min(q), p.max(q));
                let width = PANEL.min(n - p * PANEL);
                for (r, row) in rows.iter_mut().enumerate() {
                    for (l, d) in row[p * PANEL..p * PANEL + width].iter_mut().enumerate() {
                        *d = if p >= q {
                            roots[r * PANEL + l]
                        } else {
                            roots[l * PANEL + r]
                        };
                    }
                }
            }
        });
        out
    }
}

/// `sums[r] += min(near[l], tile[l·PANEL + r])` for each point l of `near` in order.
fn add_nearer(isa: crate::cpu::Isa, sums: &mut [f64; PANEL], tile: &[f64], near: &[f64]) {
    crate::cpu::on_isa!(
        isa,
        fn add(sums: &mut [f64; PANEL], tile: &[f64], near: &[f64]) {
            for (&v, row) in near.iter().zip(tile.chunks_exact(PANEL)) {
                for (s, &d) in sums.iter_mut().zip(row) {
                    *s += v.min(d);
                }
            }
        }
    )
}

/// Entry r·PANEL + l of `tile`, the dot product g_a·g_b of the row panel's vector a = r
/// and the column panel's vector b = l, becomes √max(0, ‖g_a‖² + ‖g_b‖² − 2 g_a·g_b),
/// from the squared norms of the two panels.
fn tile_distances(isa: crate::cpu::Isa, tile: &mut [f64], sq_a: &[f64], sq_b: &[f64]) {
    crate::cpu::on_isa!(
        isa,
        fn fill(tile: &mut [f64], sq_a: &[f64], sq_b: &[f64]) {
            for (row, &a) in tile.chunks_exact_mut(PANEL).zip(sq_a) {
                for (d, &b) in row.iter_mut().zip(&sq_b[..PANEL]) {
                    *d = (a + b - 2.0 * *d).max(0.0).sqrt();
                }
            }
        }
    )
}

/// ‖v‖² as [`gradient_distances`] sums it: the products in parameter order from −0.0.
pub(super) fn squared_norm(v: &[f32]) -> f64 {
    v.iter().fold(-0.0, |s, &x| s + f64::from(x) * f64::from(x))
}

/// Rows `rows` of [`gradient_distances`] over `g`, bit for bit, given every ‖g_j‖² in `sq`
/// ([`squared_norm`]): the stale refresh's update when a few gradients change. A client
/// with a gradient of another length (none reported yet) gets 0.0, a value no pick reads.
pub(super) fn distances_from(g: &[&[f32]], sq: &[f64], rows: &[usize]) -> Vec<Vec<f64>> {
    rows.iter()
        .zip(dots_with_all(g, rows))
        .map(|(&i, dots)| {
            (0..g.len())
                .map(|j| {
                    if j != i && g[j].len() == g[i].len() {
                        (sq[i] + sq[j] - 2.0 * dots[j]).max(0.0).sqrt()
                    } else {
                        0.0
                    }
                })
                .collect()
        })
        .collect()
}

/// The dot product of `vectors[i]` with every vector, for each `i` in `rows`: entry `j` of
/// row r is `vectors[rows[r]] · vectors[j]`, the sequential f64 sum in parameter order of
/// [`gradient_distances`], bit for bit, where the two are of one length (unspecified
/// otherwise). All of them come from one pass over the vectors ([`cross_sums`]): a row at
/// a time read them all once per row, K passes over N gradients when K clients report.
pub(crate) fn dots_with_all(vectors: &[&[f32]], rows: &[usize]) -> Vec<Vec<f64>> {
    let kernel = Kernel::detect();
    let mut out = vec![Vec::new(); rows.len()];
    let mut lengths: Vec<usize> = rows.iter().map(|&i| vectors[i].len()).collect();
    lengths.sort_unstable();
    lengths.dedup();
    for len in lengths {
        let group: Vec<usize> = (0..rows.len())
            .filter(|&r| vectors[rows[r]].len() == len)
            .collect();
        let xs: Vec<&[f32]> = group.iter().map(|&r| vectors[rows[r]]).collect();
        // A vector of another length is stood in for by a row: its sums are not used.
        let cols: Vec<&[f32]> = vectors
            .iter()
            .map(|&v| if v.len() == len { v } else { xs[0] })
            .collect();
        let dots = cross_sums(&xs, &cols, DEPTH, GROUP, |tile, rows, cols, depth| {
            accumulate(kernel, tile, rows, cols, depth)
        });
        for (&r, row) in group.iter().zip(dots) {
            out[r] = row;
        }
    }
    out
}

/// Adds, for every parameter of the block in order, row r's value times column c's to
/// `tile[c / PANEL · BLOCK + r · PANEL + c % PANEL]`: `rows` is one packed panel, `cols`
/// `tile.len() / BLOCK` consecutive ones, `depth` parameters each.
fn accumulate(kernel: Kernel, tile: &mut [f64], rows: &[f64], cols: &[f64], depth: usize) {
    let width = tile.len() / BLOCK;
    assert!(
        (1..=GROUP).contains(&width)
            && tile.len() == width * BLOCK
            && rows.len() == depth * PANEL
            && cols.len() == width * depth * PANEL,
        "a tile of whole panels"
    );
    match kernel {
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => {
            // SAFETY: `Avx512` is only chosen where the CPU has AVX-512F, and the lengths
            // were checked above.
            unsafe {
                match width {
                    1 => avx512::<1>(tile.as_mut_ptr(), rows.as_ptr(), cols.as_ptr(), depth),
                    2 => avx512::<2>(tile.as_mut_ptr(), rows.as_ptr(), cols.as_ptr(), depth),
                    _ => avx512::<3>(tile.as_mut_ptr(), rows.as_ptr(), cols.as_ptr(), depth),
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => {
            // SAFETY: `Avx2` is only chosen where the CPU has AVX2 and FMA, and the
            // lengths were checked above.
            unsafe {
                match width {
                    1 => avx2::<1>(tile.as_mut_ptr(), rows.as_ptr(), cols.as_ptr(), depth),
                    2 => avx2::<2>(tile.as_mut_ptr(), rows.as_ptr(), cols.as_ptr(), depth),
                    _ => avx2::<3>(tile.as_mut_ptr(), rows.as_ptr(), cols.as_ptr(), depth),
                }
            }
        }
        _ => portable(tile, rows, cols, depth),
    }
}

/// One row at a time against the tile's column panels side by side.
fn portable(tile: &mut [f64], rows: &[f64], cols: &[f64], depth: usize) {
    let width = tile.len() / BLOCK;
    let stride = depth * PANEL;
    for r in 0..PANEL {
        let mut acc = [[0.0; PANEL]; GROUP];
        for (c, a) in acc.iter_mut().enumerate().take(width) {
            a.copy_from_slice(&tile[c * BLOCK + r * PANEL..c * BLOCK + (r + 1) * PANEL]);
        }
        for t in 0..depth {
            let x = rows[t * PANEL + r];
            for (c, a) in acc.iter_mut().enumerate().take(width) {
                let col = &cols[c * stride + t * PANEL..c * stride + (t + 1) * PANEL];
                for (s, &y) in a.iter_mut().zip(col) {
                    *s += x * y;
                }
            }
        }
        for (c, a) in acc.iter().enumerate().take(width) {
            tile[c * BLOCK + r * PANEL..c * BLOCK + (r + 1) * PANEL].copy_from_slice(a);
        }
    }
}

/// The AVX-512 tile: per parameter, `W` column vectors and one broadcast per row feed
/// 8·W fused multiply-adds into accumulators that stay in registers for the whole block.
///
/// # Safety
/// The CPU has AVX-512F; `tile` points to `W·BLOCK` writable entries, `rows` to
/// `depth·PANEL` readable ones and `cols` to `W·depth·PANEL`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn avx512<const W: usize>(tile: *mut f64, rows: *const f64, cols: *const f64, depth: usize) {
    use std::arch::x86_64::{_mm512_fmadd_pd, _mm512_loadu_pd, _mm512_set1_pd, _mm512_storeu_pd};
    let stride = depth * PANEL;
    // SAFETY: every pointer stays inside the ranges the caller vouches for.
    unsafe {
        let mut acc = [[_mm512_set1_pd(0.0); W]; PANEL];
        for (r, a) in acc.iter_mut().enumerate() {
            for (c, v) in a.iter_mut().enumerate() {
                *v = _mm512_loadu_pd(tile.add(c * BLOCK + r * PANEL));
            }
        }
        for t in 0..depth {
            let mut y = [_mm512_set1_pd(0.0); W];
            for (c, v) in y.iter_mut().enumerate() {
                *v = _mm512_loadu_pd(cols.add(c * stride + t * PANEL));
            }
            for (r, a) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_pd(*rows.add(t * PANEL + r));
                for (v, &y) in a.iter_mut().zip(&y) {
                    *v = _mm512_fmadd_pd(x, y, *v);
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            for (c, &v) in a.iter().enumerate() {
                _mm512_storeu_pd(tile.add(c * BLOCK + r * PANEL), v);
            }
        }
    }
}

/// The AVX2 tile: two rows at a time against `W` column panels (two vectors each), 4·W
/// accumulators in registers for the whole block.
///
/// # Safety
/// The CPU has AVX2 and FMA; `tile` points to `W·BLOCK` writable entries, `rows` to
/// `depth·PANEL` readable ones and `cols` to `W·depth·PANEL`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2<const W: usize>(tile: *mut f64, rows: *const f64, cols: *const f64, depth: usize) {
    use std::arch::x86_64::{
        __m256d, _mm256_broadcast_sd, _mm256_fmadd_pd, _mm256_loadu_pd, _mm256_setzero_pd,
        _mm256_storeu_pd,
    };
    const ROWS: usize = 2;
    let stride = depth * PANEL;
    // SAFETY: every pointer stays inside the ranges the caller vouches for.
    unsafe {
        for r0 in (0..PANEL).step_by(ROWS) {
            let mut acc = [[[_mm256_setzero_pd(); 2]; W]; ROWS];
            for (r, a) in acc.iter_mut().enumerate() {
                for (c, v) in a.iter_mut().enumerate() {
                    let at = tile.add(c * BLOCK + (r0 + r) * PANEL);
                    *v = [_mm256_loadu_pd(at), _mm256_loadu_pd(at.add(4))];
                }
            }
            for t in 0..depth {
                let mut y: [[__m256d; 2]; W] = [[_mm256_setzero_pd(); 2]; W];
                for (c, v) in y.iter_mut().enumerate() {
                    let at = cols.add(c * stride + t * PANEL);
                    *v = [_mm256_loadu_pd(at), _mm256_loadu_pd(at.add(4))];
                }
                for (r, a) in acc.iter_mut().enumerate() {
                    let x = _mm256_broadcast_sd(&*rows.add(t * PANEL + r0 + r));
                    for (v, y) in a.iter_mut().zip(&y) {
                        v[0] = _mm256_fmadd_pd(x, y[0], v[0]);
                        v[1] = _mm256_fmadd_pd(x, y[1], v[1]);
                    }
                }
            }
            for (r, a) in acc.iter().enumerate() {
                for (c, v) in a.iter().enumerate() {
                    let at = tile.add(c * BLOCK + (r0 + r) * PANEL);
                    _mm256_storeu_pd(at, v[0]);
                    _mm256_storeu_pd(at.add(4), v[1]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Purpose, stream};
    use rand::Rng as _;

    /// The straightforward distances: each dot product and squared norm summed one
    /// product at a time, in parameter order, as DivFL computed them before the tiles.
    fn reference(g: &[Vec<f32>]) -> Vec<Vec<f64>> {
        let sq: Vec<f64> = g
            .iter()
            .map(|v| v.iter().map(|x| f64::from(*x).powi(2)).sum())
            .collect();
        (0..g.len())
            .map(|i| {
                (0..g.len())
                    .map(|j| {
                        if i == j {
                            return 0.0;
                        }
                        let dot: f64 = g[i]
                            .iter()
                            .zip(&g[j])
                            .map(|(a, b)| f64::from(*a) * f64::from(*b))
                            .sum();
                        (sq[i] + sq[j] - 2.0 * dot).max(0.0).sqrt()
                    })
                    .collect()
            })
            .collect()
    }

    /// Gradients with values of very different scales, so that a reordered sum would
    /// round differently, and some exact zeros of both signs and f32 subnormals.
    fn gradients(n: usize, params: usize, seed: u64) -> Vec<Vec<f32>> {
        let mut rng = stream(seed, Purpose::Strategy, 0, 0);
        (0..n)
            .map(|_| {
                (0..params)
                    .map(|_| match rng.random_range(0..20) {
                        0 => 0.0,
                        1 => -0.0,
                        2 => f32::MIN_POSITIVE / 3.0,
                        _ => rng.random_range(-1.0f32..1.0) * 10f32.powi(rng.random_range(-6..6)),
                    })
                    .collect()
            })
            .collect()
    }

    fn assert_same_bits(got: &[Vec<f64>], want: &[Vec<f64>], what: &str) {
        assert_eq!(got.len(), want.len(), "{what}");
        for (i, (a, b)) in got.iter().zip(want).enumerate() {
            for (j, (x, y)) in a.iter().zip(b).enumerate() {
                assert_eq!(x.to_bits(), y.to_bits(), "{what}: ({i}, {j}) {x} vs {y}");
            }
        }
    }

    /// Every kernel this CPU runs gives the one-at-a-time sums bit for bit: for client
    /// counts with every remainder modulo the panel and the group (partial panels, tiles
    /// of one, two and three panels), and parameter counts below, at and across the
    /// block depth.
    #[test]
    fn every_kernel_equals_the_sequential_sums_bit_for_bit() {
        let kernels = Kernel::available();
        assert!(kernels.contains(&Kernel::Portable));
        for (seed, n) in [0usize, 1, 2, 7, 8, 9, 16, 17, 23, 24, 25, 41]
            .into_iter()
            .enumerate()
        {
            for params in [0, 1, 37, DEPTH, 2 * DEPTH + 45] {
                let g = gradients(n, params, seed as u64);
                let refs: Vec<&[f32]> = g.iter().map(Vec::as_slice).collect();
                let want = reference(&g);
                for &kernel in &kernels {
                    assert_same_bits(
                        &distances_with(&refs, kernel),
                        &want,
                        &format!("{kernel:?}, n = {n}, {params} parameters"),
                    );
                }
            }
        }
    }

    /// One thread or several, the same bits: each sum's order is fixed by its tile.
    #[test]
    fn the_thread_count_does_not_change_a_bit() {
        let g = gradients(70, 300, 5);
        let refs: Vec<&[f32]> = g.iter().map(Vec::as_slice).collect();
        let run = |threads: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("a thread pool")
                .install(|| gradient_distances(&refs))
        };
        let one = run(1);
        assert_same_bits(&one, &reference(&g), "one thread");
        assert_same_bits(&run(3), &one, "three threads");
    }
}

//! The recurrent products of the char-LSTM against weights packed once per call.
//!
//! Each time step multiplies a thin matrix (the batch's rows, 10 in training) by a
//! weight matrix (`[x_t, h_{t−1}] · [W_ih; W_hh]` forward, `δa_{t+1} · W_hhᵀ`
//! backward). Through `gemm` every such call packs the whole weight matrix again
//! (1 MiB for `W_hh`, 80 steps per layer and pass) and sets up its blocking, which
//! costs about as much as the arithmetic at 10 rows. Here the weights are packed once
//! per step call into [`Panels`] of [`W`] output columns stored k-major, so a panel
//! streams through the kernel contiguously, and each product is a loop over panels
//! with a register tile of up to 6 rows × 16 columns (12 AVX2 accumulators, the
//! shape of `gemm`'s own f32 AVX2 microkernel).
//!
//! With AVX-512, [`accumulate4`] runs four panels against the same rows in one pass:
//! 6 rows × 4 panels of one 16-lane vector each, 24 accumulators, where one panel at a
//! time would keep only 6 of them in flight (too few to hide the FMA latency) and read
//! the rows four times.
//!
//! Every output entry is one running sum over k in increasing order (one FMA per k),
//! whatever the number of rows or panels computed together and whichever kernel runs,
//! so the result of a row depends neither on how rows or panels are grouped into tasks
//! nor on the CPU's vector width.

/// Output columns per panel: two 8-lane AVX2 vectors.
pub(super) const W: usize = 16;

/// Rows per register tile: 6 × 2 accumulators, 2 panel vectors and a broadcast fill
/// 15 of the 16 AVX2 registers.
pub(super) const TILE_ROWS: usize = 6;

/// A weight matrix cut into panels of [`W`] columns, each stored k-major
/// (`panel[k·W + j]`), zero where a panel runs past the matrix.
pub(super) struct Panels {
    /// Rows of the packed matrix (the products' inner dimension).
    pub k: usize,
    data: Vec<f32>,
}

impl Panels {
    /// Packs `count` panels; `entry(p, k, j)` is the weight of panel `p`'s column `j`
    /// at inner index `k`, or `None` for padding. The tests' reference for the two
    /// packings the products use, which copy runs of weights instead of calling a
    /// closure per weight (a tenth of the char-LSTM's step when they did).
    #[cfg(test)]
    pub fn pack(
        count: usize,
        k: usize,
        entry: impl Fn(usize, usize, usize) -> Option<f32> + Sync,
    ) -> Self {
        Self::fill(count, k, |p, panel| {
            for (kk, row) in panel.chunks_exact_mut(W).enumerate() {
                for (j, v) in row.iter_mut().enumerate() {
                    *v = entry(p, kk, j).unwrap_or(0.0);
                }
            }
        })
    }

    /// Packs `count` panels whose inner row `kk` of panel `p` is the run `row(p, kk)`
    /// of at most [`W`] consecutive weights (a row-major matrix's columns), padded with
    /// zeros.
    pub fn pack_rows<'w>(
        count: usize,
        k: usize,
        row: impl Fn(usize, usize) -> &'w [f32] + Sync,
    ) -> Self {
        Self::fill(count, k, |p, panel| {
            for (kk, dst) in panel.chunks_exact_mut(W).enumerate() {
                let src = row(p, kk);
                dst[..src.len()].copy_from_slice(src);
            }
        })
    }

    /// Packs `count` panels whose column `j` of panel `p` is the run `column(p, j)` of
    /// `k` consecutive weights (a row-major matrix's rows, transposed), or empty for
    /// padding.
    pub fn pack_columns<'w>(
        count: usize,
        k: usize,
        column: impl Fn(usize, usize) -> &'w [f32] + Sync,
    ) -> Self {
        Self::fill(count, k, |p, panel| {
            for j in 0..W {
                let src = column(p, j);
                if src.is_empty() {
                    continue;
                }
                assert_eq!(src.len(), k, "a column of the inner dimension's length");
                for (dst, &v) in panel[j..].iter_mut().step_by(W).zip(src) {
                    *dst = v;
                }
            }
        })
    }

    /// `count` zeroed panels of inner dimension `k`, each filled by `fill(p, panel)`,
    /// the panels in parallel.
    fn fill(count: usize, k: usize, fill: impl Fn(usize, &mut [f32]) + Sync) -> Self {
        use rayon::prelude::*;
        let mut data = vec![0.0; count * k * W];
        if k > 0 {
            data.par_chunks_mut(k * W)
                .enumerate()
                .for_each(|(p, panel)| fill(p, panel));
        }
        Self { k, data }
    }

    /// Panel `p`, inner rows `lo..hi`.
    pub fn panel(&self, p: usize, lo: usize, hi: usize) -> &[f32] {
        assert!(lo <= hi && hi <= self.k, "inner range inside the panel");
        &self.data[(p * self.k + lo) * W..(p * self.k + hi) * W]
    }
}

/// Whether this CPU runs the AVX2+FMA kernel ([`crate::cpu`]).
pub(super) fn avx2() -> bool {
    crate::cpu::isa() >= crate::cpu::Isa::Avx2
}

/// Whether this CPU runs the AVX-512 four-panel kernel ([`accumulate4`]).
pub(super) fn avx512() -> bool {
    crate::cpu::isa() == crate::cpu::Isa::Avx512
}

/// [`accumulate`] for four panels with the same inner range against the same rows:
/// `outs` holds four `rows × W` tiles one after another (tile `g` for `panels[g]`).
/// With AVX-512 in one pass ([`tile4_avx512`]), else panel by panel; the bits are the
/// same either way.
pub(super) fn accumulate4(
    outs: &mut [f32],
    a: &[f32],
    a_rs: usize,
    rows: usize,
    panels: [&[f32]; 4],
) {
    let k = panels[0].len() / W;
    assert!(
        panels.iter().all(|p| p.len() == k * W),
        "four panels of whole rows, one inner range"
    );
    assert_eq!(outs.len(), 4 * rows * W, "four output tiles");
    #[cfg(target_arch = "x86_64")]
    if rows > 0 && k > 0 && avx512() {
        assert!((rows - 1) * a_rs + k <= a.len(), "rows inside their slice");
        let _product = crate::model::matmul::count_flops(4 * 2 * rows * k * W);
        let p = panels.map(<[f32]>::as_ptr);
        let mut r = 0;
        while r < rows {
            let n = (rows - r).min(TILE_ROWS);
            let (o, x) = (outs[r * W..].as_mut_ptr(), a[r * a_rs..].as_ptr());
            // SAFETY: the CPU has AVX-512F; tile g's rows r..r + n lie at
            // `o + g·rows·W` inside `outs` (checked length), rows r..r + n of `a` hold
            // k entries each (checked), and each panel holds k·W (checked).
            unsafe {
                match n {
                    1 => tile4_avx512::<1>(o, rows * W, x, a_rs, k, p),
                    2 => tile4_avx512::<2>(o, rows * W, x, a_rs, k, p),
                    3 => tile4_avx512::<3>(o, rows * W, x, a_rs, k, p),
                    4 => tile4_avx512::<4>(o, rows * W, x, a_rs, k, p),
                    5 => tile4_avx512::<5>(o, rows * W, x, a_rs, k, p),
                    _ => tile4_avx512::<6>(o, rows * W, x, a_rs, k, p),
                }
            }
            r += n;
        }
        return;
    }
    for (out, panel) in outs.chunks_exact_mut(rows * W).zip(panels) {
        accumulate(out, a, a_rs, rows, panel);
    }
}

/// The AVX-512 tile of `R` rows and four panels: per k, one vector of each panel and
/// one broadcast per row feed 4·R fused multiply-adds.
///
/// # Safety
/// The CPU has AVX-512F; tile `g` row `r` is `W` writable entries at
/// `out + g·tile + r·W`, row `r` of `a` holds `k` readable entries at `a + r·a_rs`,
/// and each panel `k·W` readable entries.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn tile4_avx512<const R: usize>(
    out: *mut f32,
    tile: usize,
    a: *const f32,
    a_rs: usize,
    k: usize,
    panels: [*const f32; 4],
) {
    use std::arch::x86_64::{_mm512_fmadd_ps, _mm512_loadu_ps, _mm512_set1_ps, _mm512_storeu_ps};
    // SAFETY: every pointer stays inside the ranges the caller vouches for.
    unsafe {
        let mut acc = [[_mm512_set1_ps(0.0); 4]; R];
        for (r, row) in acc.iter_mut().enumerate() {
            for (g, v) in row.iter_mut().enumerate() {
                *v = _mm512_loadu_ps(out.add(g * tile + r * W));
            }
        }
        for kk in 0..k {
            let b = panels.map(|p| _mm512_loadu_ps(p.add(kk * W)));
            for (r, row) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_ps(*a.add(r * a_rs + kk));
                for (v, &b) in row.iter_mut().zip(&b) {
                    *v = _mm512_fmadd_ps(x, b, *v);
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            for (g, &v) in row.iter().enumerate() {
                _mm512_storeu_ps(out.add(g * tile + r * W), v);
            }
        }
    }
}

/// `out[r·W + j] += Σ_k a[r·a_rs + k] · panel[k·W + j]` for `r < rows`, `j < W`,
/// with `k` running over the panel's `panel.len() / W` inner rows.
pub(super) fn accumulate(out: &mut [f32], a: &[f32], a_rs: usize, rows: usize, panel: &[f32]) {
    let k = panel.len() / W;
    assert_eq!(panel.len(), k * W, "whole panel rows");
    assert!(out.len() >= rows * W, "output tile size");
    if rows == 0 || k == 0 {
        return;
    }
    assert!((rows - 1) * a_rs + k <= a.len(), "rows inside their slice");
    // For `fedsel bench`'s GFLOP/s (a last panel's padding columns included).
    let _product = crate::model::matmul::count_flops(2 * rows * k * W);
    let fast = avx2();
    let mut r = 0;
    while r < rows {
        let n = (rows - r).min(TILE_ROWS);
        let (o, x) = (&mut out[r * W..(r + n) * W], &a[r * a_rs..]);
        macro_rules! tile {
            ($n:literal) => {
                tile::<$n>(fast, o, x, a_rs, k, panel)
            };
        }
        match n {
            1 => tile!(1),
            2 => tile!(2),
            3 => tile!(3),
            4 => tile!(4),
            5 => tile!(5),
            _ => tile!(6),
        }
        r += n;
    }
}

/// One tile of `R` rows (checked by [`accumulate`]: `out` holds `R·W` entries, each
/// row of `a` holds `k` entries from its start, `panel` holds `k·W`).
#[inline(always)]
fn tile<const R: usize>(
    fast: bool,
    out: &mut [f32],
    a: &[f32],
    a_rs: usize,
    k: usize,
    panel: &[f32],
) {
    #[cfg(target_arch = "x86_64")]
    if fast {
        // SAFETY: `fast` says the CPU has AVX2 and FMA; the bounds are checked above.
        unsafe { tile_avx2::<R>(out.as_mut_ptr(), a.as_ptr(), a_rs, k, panel.as_ptr()) };
        return;
    }
    let _ = fast;
    let mut acc = [[0.0f32; W]; R];
    for (r, row) in acc.iter_mut().enumerate() {
        row.copy_from_slice(&out[r * W..(r + 1) * W]);
    }
    for (kk, b) in panel.chunks_exact(W).enumerate() {
        for (r, row) in acc.iter_mut().enumerate() {
            let x = a[r * a_rs + kk];
            for (c, w) in row.iter_mut().zip(b) {
                *c = x.mul_add(*w, *c);
            }
        }
    }
    for (r, row) in acc.iter().enumerate() {
        out[r * W..(r + 1) * W].copy_from_slice(row);
    }
}

/// The AVX2 tile: per k, two panel vectors and one broadcast per row feed 2·R fused
/// multiply-adds into accumulators that stay in registers for the whole k loop.
///
/// # Safety
/// The CPU has AVX2 and FMA; `out` points to `R·W` writable entries, row `r` of `a`
/// to `k` readable entries at `a + r·a_rs`, and `panel` to `k·W` readable entries.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2<const R: usize>(
    out: *mut f32,
    a: *const f32,
    a_rs: usize,
    k: usize,
    panel: *const f32,
) {
    use std::arch::x86_64::{
        _mm256_broadcast_ss, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_setzero_ps, _mm256_storeu_ps,
    };
    // SAFETY: every pointer stays inside the ranges the caller vouches for.
    unsafe {
        let mut lo = [_mm256_setzero_ps(); R];
        let mut hi = [_mm256_setzero_ps(); R];
        for r in 0..R {
            lo[r] = _mm256_loadu_ps(out.add(r * W));
            hi[r] = _mm256_loadu_ps(out.add(r * W + 8));
        }
        for kk in 0..k {
            let b0 = _mm256_loadu_ps(panel.add(kk * W));
            let b1 = _mm256_loadu_ps(panel.add(kk * W + 8));
            for r in 0..R {
                let x = _mm256_broadcast_ss(&*a.add(r * a_rs + kk));
                lo[r] = _mm256_fmadd_ps(x, b0, lo[r]);
                hi[r] = _mm256_fmadd_ps(x, b1, hi[r]);
            }
        }
        for r in 0..R {
            _mm256_storeu_ps(out.add(r * W), lo[r]);
            _mm256_storeu_ps(out.add(r * W + 8), hi[r]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two packings the products use give the reference's panels exactly: a
    /// row-major matrix's columns by runs of rows, and its transpose by runs of columns,
    /// each with a padded last panel.
    #[test]
    fn the_run_packings_equal_the_entry_packing() {
        let (rows, cols) = (7, 2 * W + 5);
        let m: Vec<f32> = (0..rows * cols).map(|i| i as f32 - 40.5).collect();
        let by_rows = Panels::pack_rows(cols.div_ceil(W), rows, |p, kk| {
            &m[kk * cols + p * W..][..W.min(cols - p * W)]
        });
        let want = Panels::pack(cols.div_ceil(W), rows, |p, kk, j| {
            let c = p * W + j;
            (c < cols).then(|| m[kk * cols + c])
        });
        assert_eq!(by_rows.data, want.data);
        let (units, inner) = (cols, rows);
        let mt: Vec<f32> = (0..units * inner).map(|i| 0.5 * i as f32 - 7.0).collect();
        let by_columns = Panels::pack_columns(units.div_ceil(W), inner, |u, j| {
            let unit = u * W + j;
            if unit < units {
                &mt[unit * inner..(unit + 1) * inner]
            } else {
                &[]
            }
        });
        let want = Panels::pack(units.div_ceil(W), inner, |u, n, j| {
            let unit = u * W + j;
            (unit < units).then(|| mt[unit * inner + n])
        });
        assert_eq!(by_columns.data, want.data);
    }

    /// The packed product equals a naive f64 product up to f32 rounding, for every
    /// tile height (1–13 rows: whole and partial 6-row tiles), a strided `a`, and a
    /// padded last panel.
    #[test]
    fn the_panel_product_matches_a_naive_product() {
        let (k, cols) = (37, 2 * W + 5);
        let b: Vec<f32> = (0..k * cols)
            .map(|i| ((i * 7919 % 101) as f32 - 50.0) / 37.0)
            .collect();
        let panels = Panels::pack(cols.div_ceil(W), k, |p, kk, j| {
            let c = p * W + j;
            (c < cols).then(|| b[kk * cols + c])
        });
        for rows in 1..=13 {
            let a_rs = k + 3;
            let a: Vec<f32> = (0..rows * a_rs)
                .map(|i| ((i * 31 % 17) as f32 - 8.0) / 5.0)
                .collect();
            for p in 0..cols.div_ceil(W) {
                let mut out: Vec<f32> = (0..rows * W).map(|i| i as f32 / 10.0).collect();
                let init = out.clone();
                accumulate(&mut out, &a, a_rs, rows, panels.panel(p, 0, k));
                for r in 0..rows {
                    for j in 0..W {
                        let c = p * W + j;
                        let want = f64::from(init[r * W + j])
                            + if c < cols {
                                (0..k)
                                    .map(|kk| {
                                        f64::from(a[r * a_rs + kk]) * f64::from(b[kk * cols + c])
                                    })
                                    .sum()
                            } else {
                                0.0
                            };
                        let got = f64::from(out[r * W + j]);
                        assert!(
                            (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                            "{rows} rows, ({r}, {c}): {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    /// A row's result does not depend on the rows computed with it (so neither on the
    /// grouping of rows into tasks), and accumulating two inner ranges one after the
    /// other equals one call over both.
    #[test]
    fn a_rows_sum_does_not_depend_on_its_tile() {
        let k = 50;
        let panels = Panels::pack(1, k, |_, kk, j| {
            Some(((kk * 13 + j * 5) % 23) as f32 / 7.0 - 1.5)
        });
        let a: Vec<f32> = (0..11 * k)
            .map(|i| ((i * 29 % 41) as f32 - 20.0) / 9.0)
            .collect();
        let mut all = vec![0.5; 11 * W];
        accumulate(&mut all, &a, k, 11, panels.panel(0, 0, k));
        for r in 0..11 {
            let mut one = vec![0.5; W];
            accumulate(&mut one, &a[r * k..], k, 1, panels.panel(0, 0, 20));
            accumulate(&mut one, &a[r * k + 20..], k, 1, panels.panel(0, 20, k));
            assert!(
                one.iter()
                    .zip(&all[r * W..])
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "row {r}"
            );
        }
    }

    /// Four panels in one pass give the bits of four one-panel calls, for every tile
    /// height and a strided `a`; on a CPU without AVX-512 both sides run the same code.
    #[test]
    fn four_panels_at_once_give_the_bits_of_one_at_a_time() {
        let k = 45;
        let panels = Panels::pack(4, k, |p, kk, j| {
            Some(((p * 131 + kk * 13 + j * 5) % 29) as f32 / 7.0 - 2.0)
        });
        let ps: [&[f32]; 4] = std::array::from_fn(|g| panels.panel(g, 0, k));
        for rows in 1..=13 {
            let a_rs = k + 2;
            let a: Vec<f32> = (0..rows * a_rs)
                .map(|i| ((i * 23 % 37) as f32 - 18.0) / 7.0)
                .collect();
            let init: Vec<f32> = (0..4 * rows * W).map(|i| (i % 9) as f32 / 4.0).collect();
            let mut together = init.clone();
            accumulate4(&mut together, &a, a_rs, rows, ps);
            let mut apart = init.clone();
            for (g, out) in apart.chunks_exact_mut(rows * W).enumerate() {
                accumulate(out, &a, a_rs, rows, ps[g]);
            }
            assert!(
                together
                    .iter()
                    .zip(&apart)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "{rows} rows"
            );
            assert_ne!(together, init, "the products were added");
        }
    }

    /// The portable tile (`mul_add`, one rounding per step, as FMA) gives the AVX2
    /// tile's bits, so the dispatch does not change results.
    #[test]
    fn the_portable_tile_gives_the_dispatched_bits() {
        let k = 40;
        let panel: Vec<f32> = (0..k * W)
            .map(|i| ((i * 37 % 53) as f32 - 26.0) / 11.0)
            .collect();
        let a: Vec<f32> = (0..6 * k)
            .map(|i| ((i * 17 % 29) as f32 - 14.0) / 3.0)
            .collect();
        let mut portable = vec![0.25; 6 * W];
        let mut dispatched = portable.clone();
        tile::<6>(false, &mut portable, &a, k, k, &panel);
        tile::<6>(avx2(), &mut dispatched, &a, k, k, &panel);
        assert!(
            portable
                .iter()
                .zip(&dispatched)
                .all(|(x, y)| x.to_bits() == y.to_bits())
        );
    }
}

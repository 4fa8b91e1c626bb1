//! The convolutions' data movement around their products: the patch matrix (im2col),
//! its adjoint (col2im), and the direct forward pass for small patches.

#[cfg(target_arch = "x86_64")]
use super::first_lanes;
use super::glue_isa;
use crate::cpu::Isa;

/// Patch sizes (`cin·k·k`) up to which a convolution's forward pass is direct on
/// AVX-512 ([`conv_direct_avx512`]): the first layers of the seed CNNs (25 and 27).
pub(super) const DIRECT_PATCH: usize = 32;

/// A convolution's forward pass without the patch matrix, for small patches: `out[co]`
/// = `b[co]` + the sum over the patch, 16 output pixels a vector, eight channels at a
/// time. Each sum runs as `gemm`'s does for the im2col product (a chain of fused
/// multiply-adds from zero over the patch in `(ci, ky, kx)` order, one block since the
/// patch is shorter than any block, then added to the bias), so the bits are the same;
/// `gemm` spent most of those products' time on its setup and edges at k = 25, and
/// im2col on a matrix 25 times the image.
///
/// # Safety
/// The CPU has AVX-512F; `xp` holds `c·hp·wp` entries (`padded`), `w` holds
/// `cout·c·k·k` and `b` (zeros where `None`) `cout`, and `out` `cout·(hp + 1 − k)·(wp + 1 − k)`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn conv_direct_avx512(
    xp: &[f32],
    padded: [usize; 3],
    k: usize,
    w: &[f32],
    b: Option<&[f32]>,
    out: &mut [f32],
) {
    let [c, hp, wp] = padded;
    let (ho, wo, ckk) = (hp + 1 - k, wp + 1 - k, c * k * k);
    let cout = w.len() / ckk;
    assert!(xp.len() >= c * hp * wp && w.len() == cout * ckk && out.len() == cout * ho * wo);
    assert!(b.is_none_or(|b| b.len() == cout), "one bias per channel");
    let _product = crate::model::matmul::count_flops(2 * cout * ho * wo * ckk);
    assert!(ckk <= DIRECT_PATCH, "a small patch");
    // Each patch entry's offset in `xp` from the output pixel's.
    let mut offsets = [0; DIRECT_PATCH];
    for (r, off) in offsets[..ckk].iter_mut().enumerate() {
        *off = (r / (k * k) * hp + r / k % k) * wp + r % k;
    }
    let offsets = &offsets[..ckk];
    let mut co = 0;
    while co < cout {
        let group = (cout - co).min(8);
        // SAFETY: the caller's contract, for channels co..co + group.
        unsafe {
            if group == 8 {
                conv_direct_group::<8>(xp, wp, [ho, wo], offsets, w, b, out, co);
            } else {
                for g in co..co + group {
                    conv_direct_group::<1>(xp, wp, [ho, wo], offsets, w, b, out, g);
                }
            }
        }
        co += group;
    }
}

/// Output channels `co..co + G` of [`conv_direct_avx512`].
///
/// # Safety
/// As [`conv_direct_avx512`], with `co + G ≤ cout`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn conv_direct_group<const G: usize>(
    xp: &[f32],
    wp: usize,
    [ho, wo]: [usize; 2],
    offsets: &[usize],
    w: &[f32],
    b: Option<&[f32]>,
    out: &mut [f32],
    co: usize,
) {
    use std::arch::x86_64::{
        _mm512_add_ps, _mm512_fmadd_ps, _mm512_mask_storeu_ps, _mm512_maskz_loadu_ps,
        _mm512_set1_ps, _mm512_setzero_ps,
    };
    let ckk = offsets.len();
    let (x, o) = (xp.as_ptr(), out.as_mut_ptr());
    for oy in 0..ho {
        let mut ox = 0;
        while ox < wo {
            let mask = first_lanes(wo - ox);
            let at = oy * wp + ox;
            // SAFETY: patch entry r of output pixels at..at + 16 (masked to the row)
            // reads xp[at + offsets[r] ..], inside the padded image; channel co + g's
            // weights and output row lie inside `w` and `out`.
            unsafe {
                let mut acc = [_mm512_setzero_ps(); G];
                for (r, &off) in offsets.iter().enumerate() {
                    let v = _mm512_maskz_loadu_ps(mask, x.add(at + off));
                    for (g, a) in acc.iter_mut().enumerate() {
                        let wt = _mm512_set1_ps(*w.get_unchecked((co + g) * ckk + r));
                        *a = _mm512_fmadd_ps(wt, v, *a);
                    }
                }
                for (g, a) in acc.iter().enumerate() {
                    let bias = b.map_or(0.0, |b| b[co + g]);
                    let sum = _mm512_add_ps(_mm512_set1_ps(bias), *a);
                    _mm512_mask_storeu_ps(o.add(((co + g) * ho + oy) * wo + ox), mask, sum);
                }
            }
            ox += 16;
        }
    }
}

/// Row stride of a patch matrix of `n` columns (an image's output pixels): `n` rounded
/// up to 16 floats where that adds at most a sixteenth. `gemm` copies ("packs") an
/// operand whose rows it cannot load as whole vectors; with the rows a multiple of the
/// widest vector (16 `f32` with AVX-512, 8 with AVX2) it reads the patch matrix in
/// place, which in the FMNIST CNNs' second convolution (14·14 = 196 columns, padded to
/// 208) saves copying 0.6 MB per image. The padding columns are zeros and their outputs
/// are dropped; every kept output is the same sum over the same k in the same order, so
/// the bits do not change.
pub(super) fn patch_stride(n: usize) -> usize {
    let padded = n.next_multiple_of(16);
    if (padded - n) * 16 <= n { padded } else { n }
}

/// `w` (`rows × cols`, row-major) transposed.
pub(super) fn transposed(w: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0; w.len()];
    for (r, row) in w.chunks_exact(cols).enumerate() {
        for (c, &v) in row.iter().enumerate() {
            t[c * rows + r] = v;
        }
    }
    t
}

/// The patch matrix of image `x` (`[c, h, w]`) for a `k × k` kernel with padding
/// `pad`: row `(ci·k + ky)·k + kx`, column `oy·wo + ox` holds
/// `x[ci, oy + ky − pad, ox + kx − pad]` (zero outside the image). Rows are `ld`
/// apart ([`patch_stride`]); every entry of `col` is written, those past a row's
/// `ho·wo` columns with zeros. `padded` is scratch for the zero-padded image.
///
/// Each patch row is a copy of `ho` rows of `wo` entries of the padded image: with
/// AVX-512, one masked 16-lane move each ([`patch_rows_avx512`]); else 8-entry block
/// moves ([`patch_rows`]). Copies give the same bits either way.
pub(super) fn im2col(
    x: &[f32],
    shape: [usize; 3],
    k: usize,
    pad: usize,
    padded: &mut Padded,
    col: &mut [f32],
    ld: usize,
) {
    let [c, h, w] = shape;
    let (hp, wp) = (h + 2 * pad, w + 2 * pad);
    let (ho, wo) = (hp + 1 - k, wp + 1 - k);
    assert!(ld >= ho * wo, "patch rows hold a whole output");
    assert_eq!(col.len(), c * k * k * ld, "patch matrix size");
    assert_eq!(x.len(), c * h * w, "image size");
    let xp: &[f32] = if pad == 0 {
        x
    } else {
        padded.of(x, shape, pad)
    };
    #[cfg(target_arch = "x86_64")]
    if glue_isa() == Isa::Avx512 {
        // SAFETY: glue_isa found AVX-512F; the sizes of `xp` and `col` are those the
        // function's contract asks for (asserted above and in `Padded::of`).
        unsafe { patch_rows_avx512(xp, [c, hp, wp], k, col, ld) };
        return;
    }
    patch_rows(xp, [c, hp, wp], k, col, ld);
}

/// Zero-padded copies of images, one buffer per image shape and padding. A buffer is
/// zeroed once, when it is made, and each image then writes only its own rows into
/// it, so the border stays zero: zeroing the whole buffer for every image and copying
/// its rows with a libc call each cost 3-5 % of the HiCS code CNN's step. A thread
/// keeps one buffer for each shape it has seen (two or three per CNN).
#[derive(Default)]
pub(super) struct Padded {
    buffers: Vec<([usize; 4], Vec<f32>)>,
}

impl Padded {
    /// Image `x` (`[c, h, w]`) with `pad` zeros around each channel.
    pub(super) fn of(&mut self, x: &[f32], shape: [usize; 3], pad: usize) -> &[f32] {
        let [c, h, w] = shape;
        assert_eq!(x.len(), c * h * w, "image size");
        let key = [c, h, w, pad];
        let at = match self.buffers.iter().position(|(k, _)| *k == key) {
            Some(at) => at,
            None => {
                let zeros = vec![0.0; c * (h + 2 * pad) * (w + 2 * pad)];
                self.buffers.push((key, zeros));
                self.buffers.len() - 1
            }
        };
        let buf = &mut self.buffers[at].1;
        image_rows_into(x, shape, pad, buf);
        buf
    }
}

dispatch! {
    /// Each row of image `x` (`[c, h, w]`) into its place in `padded`, the image with
    /// `pad` entries around each channel, by [`copy_short`]; the border is not written.
    fn image_rows_into(x: &[f32], shape: [usize; 3], pad: usize, padded: &mut [f32]) {
        let [_, h, w] = shape;
        let (hp, wp) = (h + 2 * pad, w + 2 * pad);
        for (r, src) in x.chunks_exact(w).enumerate() {
            let (ci, y) = (r / h, r % h);
            let at = (ci * hp + pad + y) * wp + pad;
            copy_short(&mut padded[at..at + w], src);
        }
    }
}

dispatch! {
    /// The patch rows of [`im2col`] from the padded image `xp` (`[c, hp, wp]`), each
    /// image row as 8-entry block moves: `copy_from_slice` on these short rows becomes
    /// a libc call, which costs more than the copy.
    fn patch_rows(xp: &[f32], padded: [usize; 3], k: usize, col: &mut [f32], ld: usize) {
        let [_, hp, wp] = padded;
        let (ho, wo) = (hp + 1 - k, wp + 1 - k);
        for (r, row) in col.chunks_exact_mut(ld).enumerate() {
            let (ci, ky, kx) = (r / (k * k), r / k % k, r % k);
            let (row, tail) = row.split_at_mut(ho * wo);
            for (oy, dst) in row.chunks_exact_mut(wo).enumerate() {
                let src = &xp[(ci * hp + oy + ky) * wp + kx..][..wo];
                copy_short(dst, src);
            }
            tail.fill(0.0);
        }
    }
}

/// [`patch_rows`] with AVX-512: each image row of a patch row is one masked 16-lane
/// load and store per 16 entries. The block moves it replaces cost two loads, two
/// stores and the slicing around them per row of 14 entries (the FMNIST CNNs' second
/// convolution), which made im2col 8 % of a step.
///
/// # Safety
/// The CPU has AVX-512F, `xp` holds `c·hp·wp` entries and `col` `c·k·k·ld`, with
/// `ld ≥ (hp + 1 − k)·(wp + 1 − k)`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn patch_rows_avx512(xp: &[f32], padded: [usize; 3], k: usize, col: &mut [f32], ld: usize) {
    use std::arch::x86_64::{_mm512_mask_storeu_ps, _mm512_maskz_loadu_ps};
    let [c, hp, wp] = padded;
    let (ho, wo) = (hp + 1 - k, wp + 1 - k);
    assert!(xp.len() >= c * hp * wp && col.len() >= c * k * k * ld && ld >= ho * wo);
    let (src, dst) = (xp.as_ptr(), col.as_mut_ptr());
    for r in 0..c * k * k {
        let (ci, ky, kx) = (r / (k * k), r / k % k, r % k);
        for oy in 0..ho {
            let (from, to) = ((ci * hp + oy + ky) * wp + kx, r * ld + oy * wo);
            let mut j = 0;
            while j < wo {
                let mask = first_lanes(wo - j);
                // SAFETY: entries from..from + wo of `xp` lie in image row
                // ci·hp + oy + ky (kx + wo ≤ wp), and to..to + wo in patch row r
                // (oy·wo + wo ≤ ho·wo ≤ ld); the masks touch no lane past them.
                unsafe {
                    let v = _mm512_maskz_loadu_ps(mask, src.add(from + j));
                    _mm512_mask_storeu_ps(dst.add(to + j), mask, v);
                }
                j += 16;
            }
        }
        // SAFETY: entries ho·wo..ld of patch row r lie inside `col`; all-zero bytes are 0.0.
        unsafe { std::ptr::write_bytes(dst.add(r * ld + ho * wo), 0, ld - ho * wo) };
    }
}

/// `dst = src` for rows of a few dozen entries, without a call: 8-entry block moves,
/// the last ending at the row's end (overlapping the one before, with equal values).
#[inline(always)]
fn copy_short(dst: &mut [f32], src: &[f32]) {
    const BLOCK: usize = 8;
    let n = dst.len();
    assert_eq!(src.len(), n, "row lengths");
    if n < BLOCK {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = s;
        }
        return;
    }
    for (d, s) in dst.chunks_exact_mut(BLOCK).zip(src.chunks_exact(BLOCK)) {
        let s: &[f32; BLOCK] = s.try_into().expect("a block");
        let d: &mut [f32; BLOCK] = d.try_into().expect("a block");
        *d = *s;
    }
    let s: &[f32; BLOCK] = src[n - BLOCK..].try_into().expect("a block");
    let d: &mut [f32; BLOCK] = (&mut dst[n - BLOCK..]).try_into().expect("a block");
    *d = *s;
}

/// The adjoint of [`im2col`]: each input pixel of `x` becomes the sum, from 0 and patch
/// rows in order, of the patch-matrix entries of `col` read from it (what `x` held
/// before is overwritten). With AVX-512, 16 pixels at a time take all their entries
/// from a zero vector ([`add_patch_rows_avx512`]), so the image needs no zeroing pass
/// of its own; the patch rows of the CIFAR CNN's last convolutions are 13 and 4 entries
/// long, where the compiler's loop spent its time on the edges. Each pixel gets the
/// same adds in the same order either way, so the bits do not change.
pub(super) fn col2im(col: &[f32], shape: [usize; 3], k: usize, pad: usize, x: &mut [f32]) {
    let [c, h, w] = shape;
    let (ho, wo) = (h + 2 * pad + 1 - k, w + 2 * pad + 1 - k);
    assert_eq!(x.len(), c * h * w, "image size");
    assert_eq!(col.len(), c * k * k * ho * wo, "patch matrix size");
    #[cfg(target_arch = "x86_64")]
    if glue_isa() == Isa::Avx512 {
        // SAFETY: glue_isa found AVX-512F; the sizes of `col` and `x` are asserted above.
        unsafe { add_patch_rows_avx512(col, shape, k, pad, x) };
        return;
    }
    x.fill(0.0);
    add_patch_rows(col, shape, k, pad, x);
}

/// The image columns `lo..hi` of output row `oy` that patch row `(ky, kx)` reads inside
/// the image (not its padding), as `(image row, first image column, lo, hi)`; `None`
/// where the row reads only padding.
#[inline(always)]
fn patch_span(
    [h, w]: [usize; 2],
    wo: usize,
    pad: usize,
    [ky, kx]: [usize; 2],
    oy: usize,
) -> Option<(usize, usize, usize, usize)> {
    let lo = pad.saturating_sub(kx);
    let hi = (w + pad).saturating_sub(kx).min(wo);
    let iy = oy + ky;
    (iy >= pad && iy - pad < h && lo < hi).then(|| (iy - pad, lo + kx - pad, lo, hi))
}

dispatch! {
    /// [`col2im`] without explicit vectors.
    fn add_patch_rows(col: &[f32], shape: [usize; 3], k: usize, pad: usize, x: &mut [f32]) {
        let [_, h, w] = shape;
        let (ho, wo) = (h + 2 * pad + 1 - k, w + 2 * pad + 1 - k);
        for (r, row) in col.chunks_exact(ho * wo).enumerate() {
            let (ci, ky, kx) = (r / (k * k), r / k % k, r % k);
            for (oy, src) in row.chunks_exact(wo).enumerate() {
                let Some((iy, ix, lo, hi)) = patch_span([h, w], wo, pad, [ky, kx], oy) else {
                    continue;
                };
                let dst = &mut x[(ci * h + iy) * w + ix..][..hi - lo];
                for (d, s) in dst.iter_mut().zip(&src[lo..hi]) {
                    *d += s;
                }
            }
        }
    }
}

/// [`add_patch_rows`] into a zeroed image, with AVX-512, pixel by pixel instead of
/// patch row by patch row: 16 pixels of an image row start from zero, take the entries
/// of every patch row that reads them (masked adds, patch rows in order, so each
/// pixel's sum is the same chain of adds), and are stored once. Adding patch row after patch row into the image
/// instead stored each pixel k² times, and each masked load waited on the overlapping
/// masked store just before it.
///
/// # Safety
/// The CPU has AVX-512F; `x` holds `c·h·w` entries and `col` `c·k·k·ho·wo`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn add_patch_rows_avx512(
    col: &[f32],
    shape: [usize; 3],
    k: usize,
    pad: usize,
    x: &mut [f32],
) {
    use std::arch::x86_64::{
        _mm512_mask_add_ps, _mm512_mask_storeu_ps, _mm512_maskz_loadu_ps, _mm512_setzero_ps,
    };
    let [c, h, w] = shape;
    let (ho, wo) = (h + 2 * pad + 1 - k, w + 2 * pad + 1 - k);
    assert!(x.len() >= c * h * w && col.len() >= c * k * k * ho * wo);
    let (src, dst) = (col.as_ptr(), x.as_mut_ptr());
    // Lanes lo..hi of a mask.
    let lanes =
        |lo: isize, hi: isize| first_lanes(hi.max(0) as usize) & !first_lanes(lo.max(0) as usize);
    for ci in 0..c {
        for iy in 0..h {
            let mut ix = 0;
            while ix < w {
                let pixels = lanes(0, (w - ix) as isize);
                let at = (ci * h + iy) * w + ix;
                let mut acc = _mm512_setzero_ps();
                for ky in 0..k {
                    let Some(oy) = (iy + pad).checked_sub(ky).filter(|&oy| oy < ho) else {
                        continue;
                    };
                    for kx in 0..k {
                        // Lane l reads output column ix + l + pad − kx, if inside 0..wo.
                        let start = (ix + pad) as isize - kx as isize;
                        let take = pixels & lanes(-start, wo as isize - start);
                        let row = ((ci * k + ky) * k + kx) * ho + oy;
                        let from = src.wrapping_add(row * wo).wrapping_offset(start);
                        // SAFETY: the lanes of `take` read output columns 0..wo of output
                        // row oy of patch row (ci, ky, kx); masked lanes are not read.
                        let v = unsafe { _mm512_maskz_loadu_ps(take, from) };
                        acc = _mm512_mask_add_ps(acc, take, acc, v);
                    }
                }
                // SAFETY: the pixels' lanes lie in image row iy of channel ci.
                unsafe { _mm512_mask_storeu_ps(dst.add(at), pixels, acc) };
                ix += 16;
            }
        }
    }
}

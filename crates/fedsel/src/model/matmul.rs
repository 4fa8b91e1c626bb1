//! Matrix products for the fused model paths (`cnn_fused`, `lstm::fused`, `mlp`), on the
//! `gemm` crate that burn-flex already uses.
//!
//! Every product is cut into pieces fixed by its shape, each piece one single-threaded
//! `gemm` call, and rayon only schedules the pieces: each output entry's sum over k runs
//! in the same order whatever the number of threads, so the fused paths keep fedsel's
//! bit-identical results across thread counts. Not across CPU kinds: `gemm` dispatches
//! at run time to AVX-512 (its `x86-v4` feature), AVX2+FMA or scalar kernels, which
//! block the sums differently.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use gemm::{Parallelism, gemm};
use rayon::prelude::*;

thread_local! {
    /// Floating-point operations of the products this thread has run (2·m·n·k each).
    static FLOPS: Cell<u64> = const { Cell::new(0) };
    /// Nanoseconds this thread has spent in products while [`time_products`] is on.
    static PRODUCT_NS: Cell<u64> = const { Cell::new(0) };
}

/// Whether products are timed ([`time_products`]); off, a product pays one relaxed load.
static TIMING: AtomicBool = AtomicBool::new(false);

/// One product in progress: its FLOPs are counted when it starts, and while
/// [`time_products`] is on its time is added to the thread's product time when it is
/// dropped, at the end of the scope that computes the product.
#[must_use = "the product's time runs until the guard is dropped"]
pub(crate) struct Product(Option<Instant>);

impl Drop for Product {
    fn drop(&mut self) {
        if let Some(started) = self.0 {
            let ns = started.elapsed().as_nanos() as u64;
            PRODUCT_NS.with(|t| t.set(t.get() + ns));
        }
    }
}

/// Starts a product of `n` floating-point operations on this thread: counts them, and
/// times the product until the returned guard is dropped. Products computed outside
/// this module (the char-LSTM's packed-panel kernel, the direct convolution) call it too.
pub(crate) fn count_flops(n: usize) -> Product {
    FLOPS.with(|f| f.set(f.get() + n as u64));
    Product(TIMING.load(Ordering::Relaxed).then(Instant::now))
}

/// Floating-point operations of every product run so far (2·m·n·k each: a multiply
/// and an add per term) on the calling thread and the threads of its rayon pool:
/// `fedsel bench` divides a step's count by its time. Only products through this
/// module or reported by [`count_flops`] count, not the elementwise work around them
/// nor burn's own ops.
pub(crate) fn flops_counted() -> u64 {
    summed(&FLOPS)
}

/// Turns the timing of products on or off, for every thread. `fedsel bench` turns it on
/// for one run of steps, to show how much of a step's time its products take.
pub(crate) fn time_products(on: bool) {
    TIMING.store(on, Ordering::Relaxed);
}

/// Nanoseconds spent in products while [`time_products`] was on, summed over the
/// calling thread and the threads of its rayon pool (core time, not wall time).
pub(crate) fn product_ns() -> u64 {
    summed(&PRODUCT_NS)
}

/// A per-thread count summed over the calling thread and its rayon pool's threads.
fn summed(count: &'static std::thread::LocalKey<Cell<u64>>) -> u64 {
    let pool: u64 = rayon::broadcast(|_| count.with(Cell::get))
        .into_iter()
        .sum();
    match rayon::current_thread_index() {
        Some(_) => pool,
        None => pool + count.with(Cell::get),
    }
}

/// The kernels `gemm` dispatches to on this CPU, by the test it makes itself
/// (gemm-common's dispatch with the `x86-v4` feature: AVX-512F, else FMA, else scalar).
pub(crate) fn gemm_isa() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return "x86-v4 (avx512f)";
        }
        if std::arch::is_x86_feature_detected!("fma") {
            return "x86-v3 (avx2+fma)";
        }
    }
    "scalar"
}

/// Dense products below this many multiply-adds run as one call: a rayon split costs more.
const SPLIT_WORK: usize = 1 << 18;
/// Rows or columns of a dense product's output per task when it is split.
const BLOCK: usize = 128;

/// A strided read-only matrix: element (r, c) is `data[r·rs + c·cs]`.
#[derive(Clone, Copy)]
pub(crate) struct View<'a> {
    pub(crate) data: &'a [f32],
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) rs: usize,
    pub(crate) cs: usize,
}

impl<'a> View<'a> {
    /// A row-major `rows × cols` matrix.
    pub(crate) fn new(data: &'a [f32], rows: usize, cols: usize) -> Self {
        assert_eq!(data.len(), rows * cols, "matrix size");
        Self {
            data,
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }

    /// The transpose, by swapping strides (no copy).
    pub(crate) fn t(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }
}

/// A raw pointer that rayon tasks may share; each task writes a disjoint block.
#[derive(Clone, Copy)]
struct SharedMut(*mut f32);
// SAFETY: its one user, `matmul`, has each piece write a disjoint block of one
// exclusively borrowed slice while the borrow is alive.
unsafe impl Send for SharedMut {}
unsafe impl Sync for SharedMut {}

impl SharedMut {
    /// The pointer, through a method so that closures capture the whole (`Sync`) wrapper.
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Checks that `a` and `b` can be multiplied and read inside their slices; returns
/// the product's shape `(m, k, n)`.
fn check(a: View<'_>, b: View<'_>) -> (usize, usize, usize) {
    assert_eq!(b.rows, a.cols, "inner dimensions");
    for v in [a, b] {
        assert!(
            v.rows == 0 || v.cols == 0 || (v.rows - 1) * v.rs + (v.cols - 1) * v.cs < v.data.len(),
            "view inside its slice"
        );
    }
    (a.rows, a.cols, b.cols)
}

/// `dst = a·b`, or `dst += a·b` with `accumulate`, on the calling thread; `dst` is
/// row-major with `dst_rs` between rows.
///
/// # Safety
/// `a` and `b` must have passed [`check`], and `dst` must be valid for writes of the
/// `a.rows × b.cols` block at row stride `dst_rs`, with no other access to that block.
pub(crate) unsafe fn gemm_raw(
    dst: *mut f32,
    dst_rs: usize,
    a: View<'_>,
    b: View<'_>,
    accumulate: bool,
) {
    let _product = count_flops(2 * a.rows * b.cols * a.cols);
    // SAFETY: the caller's contract.
    unsafe { gemm_raw_uncounted(dst, dst_rs, a, b, accumulate) }
}

/// [`gemm_raw`] without adding to the FLOP count.
///
/// # Safety
/// As [`gemm_raw`].
unsafe fn gemm_raw_uncounted(
    dst: *mut f32,
    dst_rs: usize,
    a: View<'_>,
    b: View<'_>,
    accumulate: bool,
) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: the caller's contract.
    unsafe {
        gemm(
            m,
            n,
            k,
            dst,
            1,
            dst_rs as isize,
            accumulate,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            Parallelism::None,
        );
    }
}

/// `out = a·b`, or `out += a·b` with `accumulate`, on the calling thread; the product
/// fills the first `a.rows × b.cols` block of `out`, rows `out_rs` apart.
pub(crate) fn gemm_into(
    out: &mut [f32],
    out_rs: usize,
    a: View<'_>,
    b: View<'_>,
    accumulate: bool,
) {
    gemm_into_padded(out, out_rs, a, b, accumulate, b.cols);
}

/// [`gemm_into`] for a product whose columns past the first `cols` are padding (zeros
/// in `b`, outputs the caller drops): only the first `cols` count as FLOPs.
pub(crate) fn gemm_into_padded(
    out: &mut [f32],
    out_rs: usize,
    a: View<'_>,
    b: View<'_>,
    accumulate: bool,
    cols: usize,
) {
    let (m, k, n) = check(a, b);
    assert!(cols <= n, "padding past the product's columns");
    assert!(
        m == 0 || n == 0 || (m - 1) * out_rs + n <= out.len(),
        "output inside its slice"
    );
    let _product = count_flops(2 * m * cols * k);
    // SAFETY: checked above; `out` is borrowed exclusively.
    unsafe { gemm_raw_uncounted(out.as_mut_ptr(), out_rs, a, b, accumulate) }
}

/// `out = a·b` (or `+=`), `out` row-major `a.rows × b.cols`, with the larger output
/// dimension cut into blocks of [`BLOCK`] run in parallel: a split fixed by the shape,
/// so each entry's sum runs in the same order whatever the number of threads.
pub(crate) fn matmul(out: &mut [f32], a: View<'_>, b: View<'_>, accumulate: bool) {
    let (m, k, n) = check(a, b);
    assert_eq!(out.len(), m * n, "output size");
    let by_rows = m >= n;
    let span = if by_rows { m } else { n };
    if m * n * k < SPLIT_WORK || span <= BLOCK {
        gemm_into(out, n, a, b, accumulate);
        return;
    }
    let pieces = span.div_ceil(BLOCK);
    let dst = SharedMut(out.as_mut_ptr());
    (0..pieces).into_par_iter().for_each(|piece| {
        let lo = piece * span / pieces;
        let hi = (piece + 1) * span / pieces;
        let (a, b, offset) = if by_rows {
            let a = View {
                data: &a.data[lo * a.rs..],
                rows: hi - lo,
                ..a
            };
            (a, b, lo * n)
        } else {
            let b = View {
                data: &b.data[lo * b.cs..],
                cols: hi - lo,
                ..b
            };
            (a, b, lo)
        };
        // SAFETY: the views are sub-views of checked ones; the piece writes rows lo..hi
        // (by rows) or columns lo..hi (by columns) of `out`, which this function borrows
        // exclusively, and no two pieces share an entry.
        unsafe { gemm_raw(dst.get().add(offset), n, a, b, accumulate) }
    });
}

/// Held by the tests that turn the timing of products on, so that none of them sees
/// another's timing: the switch is global.
#[cfg(test)]
pub(crate) static TIMING_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;

    /// A product's time reaches this thread's count only while the timing is on, and
    /// its FLOPs are counted either way.
    #[test]
    fn products_are_timed_only_while_the_timing_is_on() {
        let _alone = TIMING_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let n = 128;
        let a: Vec<f32> = (0..n * n).map(|i| (i % 7) as f32).collect();
        let mut out = vec![0.0; n * n];
        let mine = || (PRODUCT_NS.with(Cell::get), FLOPS.with(Cell::get));
        let mut product =
            || gemm_into(&mut out, n, View::new(&a, n, n), View::new(&a, n, n), false);
        let (ns, flops) = mine();
        product();
        assert_eq!(mine(), (ns, flops + 2 * (n * n * n) as u64));
        time_products(true);
        product();
        time_products(false);
        let (timed_ns, timed_flops) = mine();
        assert!(timed_ns > ns, "the timed product added no time");
        assert_eq!(timed_flops, flops + 4 * (n * n * n) as u64);
    }
}

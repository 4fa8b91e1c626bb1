//! Ward's agglomerative clustering (scipy `linkage(X, "ward")`), shared by
//! Clustered Sampling Alg. 2 and HiCS-FL, and the two cuts they use.
//!
//! Both pass the rows of an N × N distance matrix as the points (algorithms.md §3.3, §7.2:
//! what the authors ran), so the points' own distances are Θ(N³) a clustering: 5·10¹¹
//! squared differences at 10,000 clients, 31 s a round of Clustered Sampling on the 2-core
//! machine that measured it (docs/speed.md), the bound of both selectors at that size
//! ([`point_distances`]). Only the K clients that report change their rows (and, the
//! matrix being symmetric, their columns), so [`KeptDistances`] updates the squared sums in
//! O(K N²) instead ([`WardDistances::Incremental`]): each sum then depends on the run's
//! history, not on the rows alone, and differs from the exact one in its last bits. The
//! default recomputes exactly up to [`EXACT_UP_TO`] clients, which covers every paper's
//! setting bit for bit, and keeps the sums above; kept sums go into the selector's
//! checkpoint, so that a resumed run clusters as an uninterrupted one does.
//!
//! The Lance–Williams recurrence on Euclidean distances, merging the closest pair
//! (the lowest-index pair on ties, so the result is deterministic), with each
//! row's nearest neighbour cached (Müllner's "generic" scheme): O(n²) per run in
//! practice instead of the full scan's O(n³), and the same merges bit for bit
//! (`tests::the_cached_scan_merges_as_the_full_scan`).

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::panels::{BLOCK, PANEL, cross_sums, pair_sums};

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
    merge(point_distances(points))
}

/// The merges from the points' Euclidean distances `d` (n × n, symmetric).
fn merge(mut d: Vec<Vec<f64>>) -> Vec<Merge> {
    let n = d.len();
    // d[i][j] for the active clusters, indexed by slot; slot i holds cluster id[i].
    let mut id: Vec<usize> = (0..n).collect();
    let mut size = vec![1usize; n];
    let mut active = vec![true; n];
    // A merge rewrites row i (slot i holding the merged cluster) whole; column i, a stride
    // through every row and a cache miss per row at thousands of points, is brought up to
    // date only when a row is next read. `rewritten` lists the slot each merge rewrote;
    // row k holds the current d[k][m] for every m rewritten before `synced[k]`. Reading
    // from row m what it would have been written is the same value: only its time changes.
    let mut rewritten: Vec<usize> = Vec::with_capacity(n);
    let mut synced = vec![0usize; n];
    let sync = |k: usize, d: &mut [Vec<f64>], synced: &mut [usize], rewritten: &[usize]| {
        for &m in &rewritten[synced[k]..] {
            if m != k {
                d[k][m] = d[m][k];
            }
        }
        synced[k] = rewritten.len();
    };
    // nn[i]: the active j > i nearest to i (the lowest such j on ties), or n if none. The
    // pair the full scan would merge, the least d[i][j] with the lowest (i, j) on ties, is
    // then the least d[i][nn[i]] with the lowest i: the scan's merges, in its order, with
    // the same arithmetic, at O(n) per row instead of O(n²) per merge (issue 23). nd[i] =
    // d[i][nn[i]], so that neither the search for the closest pair nor the comparisons
    // below reach into other rows.
    let nearest = |i: usize, d: &[Vec<f64>], active: &[bool]| -> (usize, f64) {
        let (mut best, mut least) = (n, f64::INFINITY);
        for (j, (&v, &open)) in d[i].iter().zip(active).enumerate().skip(i + 1) {
            if open && (best == n || v < least) {
                (best, least) = (j, v);
            }
        }
        (best, least)
    };
    let (mut nn, mut nd): (Vec<usize>, Vec<f64>) = (0..n).map(|i| nearest(i, &d, &active)).unzip();
    let mut merges = Vec::with_capacity(n.saturating_sub(1));
    for step in 0..n.saturating_sub(1) {
        // The first candidate is taken whatever its distance, so that a merge is found even
        // when every distance left is infinite or NaN (no such input reaches Ward through
        // the guard, but the merge count must not depend on it).
        let mut best = (usize::MAX, usize::MAX, f64::INFINITY);
        for i in 0..n {
            if active[i] && nn[i] < n && (best.0 == usize::MAX || nd[i] < best.2) {
                best = (i, nn[i], nd[i]);
            }
        }
        let (i, j, h) = best;
        sync(i, &mut d, &mut synced, &rewritten);
        sync(j, &mut d, &mut synced, &rewritten);
        let (si, sj) = (size[i] as f64, size[j] as f64);
        let (head, tail) = d.split_at_mut(j);
        let (row_i, row_j) = (&mut head[i], &tail[0]);
        for k in 0..n {
            if active[k] && k != i && k != j {
                row_i[k] = lance_williams(si, sj, size[k] as f64, row_i[k], row_j[k], h);
            }
        }
        rewritten.push(i);
        synced[i] = rewritten.len();
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
        // be nearer than their nearest (or as near, with a lower index); d[k][i] is d[i][k].
        for k in 0..n {
            if !active[k] {
                continue;
            }
            if k == i || nn[k] == i || nn[k] == j {
                sync(k, &mut d, &mut synced, &rewritten);
                (nn[k], nd[k]) = nearest(k, &d, &active);
            } else if k < i && (d[i][k] < nd[k] || (d[i][k] == nd[k] && i < nn[k])) {
                // nn[k] < n here: i itself is an active candidate after k.
                nn[k] = i;
                nd[k] = d[i][k];
            }
        }
    }
    merges
}

/// The merges from `d` by the nearest-neighbour chain (Murtagh 1983; Müllner 2011, Fig. 4):
/// follow nearest neighbours until two are each other's, merge them, go on from what is
/// left of the chain. Ward's distance is reducible, so the chain finds the greedy scan's
/// merges, at O(n²) whatever the data, where [`merge`]'s rescans of the rows that pointed
/// at a merged pair grow with how many did. The merges are found in another order, so
/// Lance–Williams sums its terms in another order: heights within rounding of the scan's,
/// and on exact ties possibly another pair first. Used with [`KeptDistances`], whose sums
/// are not the exact bits either; merges are then sorted by height (stably) and numbered
/// as scipy does. `d` is used up.
///
/// Each step's nearest slot comes from one vectorised pass over the row ([`nearest`]), and
/// a merge rewrites row i (slot i holding the merged cluster) in one vectorised pass over
/// every slot, whose entries reach column i of the other active rows when each is next
/// read ([`LateColumns`]): the choices and values of the loops that did both one slot at a
/// time, copying each merged row into its column at once, bit for bit
/// (`tests::the_vectorised_chain_merges_as_it_did`).
fn merge_by_chain(d: &mut [Vec<f64>]) -> Vec<Merge> {
    let n = d.len();
    let isa = crate::cpu::isa();
    let mut size = vec![1.0f64; n];
    let mut active = vec![true; n];
    // (slot a, slot b, height): slot i holds a cluster containing point i.
    let mut raw: Vec<(usize, usize, f64)> = Vec::with_capacity(n.saturating_sub(1));
    let mut chain: Vec<usize> = Vec::new();
    let mut columns = LateColumns::new(n);
    while raw.len() + 1 < n {
        if chain.is_empty() {
            chain.push(active.iter().position(|&a| a).expect("two clusters left"));
        }
        let (a, b) = loop {
            let a = chain[chain.len() - 1];
            let prev = chain.len().checked_sub(2).map(|p| chain[p]);
            columns.bring_up_to_date(d, a, &active);
            let best = nearest(isa, &mut d[a], &active, a, prev);
            if Some(best) == prev {
                chain.truncate(chain.len() - 2);
                break (a, best);
            }
            chain.push(best);
        };
        let (i, j) = (a.min(b), a.max(b));
        columns.bring_up_to_date(d, i, &active);
        columns.bring_up_to_date(d, j, &active);
        let h = d[i][j];
        let mut row_i = std::mem::take(&mut d[i]);
        lance_williams_row(isa, &mut row_i, &d[j], &size, size[i], size[j], h);
        active[j] = false;
        d[i] = row_i;
        columns.rewritten(i);
        size[i] += size[j];
        raw.push((i, j, h));
    }
    // Heights in order (stably: equal heights keep the order found), then scipy's numbering:
    // a cluster's id is n + the index of the merge that formed it.
    raw.sort_by(|x, y| x.2.total_cmp(&y.2));
    // Sizes are counted again in that order: with non-finite heights the order is not the
    // one found, and the tree must still be whole.
    let mut parent: Vec<usize> = (0..n).collect();
    let mut label: Vec<usize> = (0..n).collect();
    let mut count = vec![1usize; n];
    let find = |parent: &mut Vec<usize>, mut x: usize| {
        while parent[x] != x {
            parent[x] = parent[parent[x]];
            x = parent[x];
        }
        x
    };
    raw.iter()
        .enumerate()
        .map(|(t, &(i, j, height))| {
            let (ri, rj) = (find(&mut parent, i), find(&mut parent, j));
            let (a, b) = (label[ri].min(label[rj]), label[ri].max(label[rj]));
            parent[rj] = ri;
            label[ri] = n + t;
            count[ri] += count[rj];
            Merge {
                a,
                b,
                height,
                size: count[ri],
            }
        })
        .collect()
}

/// The chain's merged rows written into their columns when a row is next read, not at
/// each merge. A merge rewrites row i whole; column i of every other active row then
/// holds stale values until the row is brought up to date, which copies entry i from row
/// i for each slot i rewritten since (its latest rewrite only). Every value a row is read
/// with is the one the copy at each merge gave, so the merges are the same bits; but a
/// row now takes one copy per slot rewritten since it was last read, where every merge
/// wrote one into every active row, each a cache line of its own: at 10,000 points
/// 2.6·10⁷ copies a HiCS-FL linkage on the bench's updates and 1·10⁴ a CS2 one, where the
/// copy at each merge made about 5·10⁷. Each copy reads a line of another row, so the
/// lines are prefetched [`AHEAD`] copies ahead.
struct LateColumns {
    /// The slots rewritten, in merge order.
    log: Vec<usize>,
    /// Per slot, 1 + the log position of its latest rewrite (0: never rewritten).
    latest: Vec<usize>,
    /// Per slot, the log length when its row was last brought up to date.
    synced: Vec<usize>,
    /// The slots of one bring-up-to-date.
    todo: Vec<usize>,
}

/// Copies ahead of the one made that [`LateColumns::bring_up_to_date`] prefetches.
const AHEAD: usize = 16;

impl LateColumns {
    fn new(n: usize) -> Self {
        Self {
            log: Vec::with_capacity(n),
            latest: vec![0; n],
            synced: vec![0; n],
            todo: Vec::new(),
        }
    }

    /// Copies into row `a` entry a of every active slot rewritten since the row was last
    /// brought up to date.
    fn bring_up_to_date(&mut self, d: &mut [Vec<f64>], a: usize, active: &[bool]) {
        self.todo.clear();
        for t in self.synced[a]..self.log.len() {
            let i = self.log[t];
            if i != a && active[i] && self.latest[i] == t + 1 {
                self.todo.push(i);
            }
        }
        for (x, &i) in self.todo.iter().enumerate() {
            #[cfg(target_arch = "x86_64")]
            if let Some(&ahead) = self.todo.get(x + AHEAD) {
                use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
                // SAFETY: a prefetch reads and writes nothing; the address is in row `ahead`.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(d[ahead].as_ptr().add(a).cast()) };
            }
            let v = d[i][a];
            d[a][i] = v;
        }
        self.synced[a] = self.log.len();
    }

    /// Notes that row `i` was rewritten whole from rows brought up to date.
    fn rewritten(&mut self, i: usize) {
        self.log.push(i);
        self.latest[i] = self.log.len();
        self.synced[i] = self.log.len();
    }
}

/// The slot the chain goes to from `a`, whose row is `row`: the previous link `prev` unless
/// an active slot is strictly nearer (so that the chain ends on ties), else the lowest of
/// the nearest, the first active slot ≠ a being taken whatever its value when there is no
/// previous link. That is the one-slot-at-a-time scan's choice (`v < least`), found as the
/// least value in one vectorised pass (the least of the values that are not NaN does not
/// depend on the order they are taken in, ±0 comparing equal), then its first slot.
/// `row[a]`, never read otherwise, is set to +∞ so that the pass need not skip it.
fn nearest(
    isa: crate::cpu::Isa,
    row: &mut [f64],
    active: &[bool],
    a: usize,
    prev: Option<usize>,
) -> usize {
    row[a] = f64::INFINITY;
    let mut found = f64::INFINITY;
    let least = &mut found;
    crate::cpu::on_isa!(
        isa,
        fn pass(row: &[f64], active: &[bool], least: &mut f64) {
            const LANES: usize = 8;
            let mut lanes = [f64::INFINITY; LANES];
            let (rows, opens) = (row.chunks_exact(LANES), active.chunks_exact(LANES));
            let (rest, open_rest) = (rows.remainder(), opens.remainder());
            for (r, o) in rows.zip(opens) {
                for ((m, &v), &open) in lanes.iter_mut().zip(r).zip(o) {
                    let v = if open { v } else { f64::INFINITY };
                    *m = if v < *m { v } else { *m };
                }
            }
            for (&v, &open) in rest.iter().zip(open_rest) {
                if open && v < lanes[0] {
                    lanes[0] = v;
                }
            }
            *least = lanes
                .into_iter()
                .fold(f64::INFINITY, |m, v| if v < m { v } else { m });
        }
    );
    let least = found;
    let first = prev.unwrap_or_else(|| {
        (0..row.len())
            .find(|&k| active[k] && k != a)
            .expect("two clusters left")
    });
    // `first` stands unless something is strictly nearer (a NaN there is never beaten).
    if least.partial_cmp(&row[first]) != Some(std::cmp::Ordering::Less) {
        return first;
    }
    (0..row.len())
        .find(|&k| active[k] && k != a && row[k] == least)
        .expect("the least value is an active slot's")
}

/// Row i of the merge of clusters i and j (sizes `si`, `sj`, at distance `h`):
/// [`lance_williams`] of `row_i[k]` and `row_j[k]` for every slot k, the sizes in `size`.
/// Every entry is written, so that the loop has no branch to keep it from vectorising:
/// those of inactive slots, of i and of j are never read.
fn lance_williams_row(
    isa: crate::cpu::Isa,
    row_i: &mut [f64],
    row_j: &[f64],
    size: &[f64],
    si: f64,
    sj: f64,
    h: f64,
) {
    crate::cpu::on_isa!(
        isa,
        fn rewrite(row_i: &mut [f64], row_j: &[f64], size: &[f64], si: f64, sj: f64, h: f64) {
            for ((x, &y), &sk) in row_i.iter_mut().zip(row_j).zip(size) {
                *x = lance_williams(si, sj, sk, *x, y, h);
            }
        }
    )
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
    roots(&point_sums_on(points, crate::cpu::isa()))
}

/// √ of every entry.
fn roots(sums: &[Vec<f64>]) -> Vec<Vec<f64>> {
    sums.iter()
        .map(|row| row.iter().map(|s| s.sqrt()).collect())
        .collect()
}

/// The squared distances under [`point_distances`], with the kernel compiled for `isa`
/// (one this CPU runs); 0 on the diagonal.
fn point_sums_on(points: &[Vec<f64>], isa: crate::cpu::Isa) -> Vec<Vec<f64>> {
    let n = points.len();
    let rows: Vec<&[f64]> = points.iter().map(Vec::as_slice).collect();
    let sums = pair_sums(&rows, DEPTH, GROUP, |tile, rows, cols, _| {
        squared_differences(isa, tile, rows, cols)
    });
    let mut d: Vec<Vec<f64>> = (0..n)
        .map(|i| {
            (0..n)
                .map(|j| if j > i { sums.get(i, j) } else { 0.0 })
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

/// How CS2 and HiCS-FL obtain Ward's point distances each round
/// (`selection.ward_distances`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WardDistances {
    /// [`Self::Exact`] up to [`EXACT_UP_TO`] clients, every paper's size, and
    /// [`Self::Incremental`] above, where Θ(N³) a round is tens of seconds.
    #[default]
    Auto,
    /// Recomputed from the rows every round, Θ(N³): the same bits whatever came before.
    Exact,
    /// Updated where the rows changed, O(K N² + K N·dims) ([`KeptDistances`]): not the
    /// exact sums' bits, and history-dependent; for federations of thousands of clients.
    Incremental,
}

/// The most clients [`WardDistances::Auto`] recomputes the distances for (as FedGS's
/// `exact_up_to`): 33 ms a round of CS2 at 1,000 clients, 31 s at 10,000.
pub const EXACT_UP_TO: usize = 1000;

impl WardDistances {
    /// Whether this is the default, so that configs without the key keep their hash.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// The distances a selector of `n` clients keeps under this setting: `None` when they
    /// are recomputed every round.
    pub fn kept(self, n: usize) -> Option<KeptDistances> {
        let incremental = match self {
            Self::Auto => n > EXACT_UP_TO,
            Self::Exact => false,
            Self::Incremental => true,
        };
        incremental.then(KeptDistances::default)
    }
}

/// The points last clustered and their squared distances, updated in place where the
/// points change ([`WardDistances::Incremental`]).
///
/// Between two calls, a point reported changed ([`Self::mark_changed`]: a client that
/// reported) has its row summed afresh over all features, with the exact sums' arithmetic,
/// so a pair is exact again as soon as one of its two clients reports. Every other pair
/// gains, for each feature c changed in some other point (the reporting clients'
/// columns), in order, (x′ − y′)² − (x − y)², and is floored at 0. The drift of the
/// others is rounding: measured at ≤ 1e-12 relative over 300 rounds at 200 clients
/// (`tests::kept_sums_stay_close_to_the_exact_ones`). The first call, a change of
/// shape, a non-finite value in a changed feature, or a quarter of the points or features
/// or more changed recompute everything exactly.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct KeptDistances {
    points: Vec<Vec<f64>>,
    sums: Vec<Vec<f64>>,
    /// Points reported changed since the last linkage ([`Self::mark_changed`]).
    reported: Vec<usize>,
    /// Whether every report since the last linkage came from
    /// [`Self::mark_changed_symmetric`] (`None`: no report), so that the changed features
    /// are known without comparing every point with its last value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    symmetric: Option<bool>,
    /// √`sums`, which the chain merges in place: kept between calls so that its n² values
    /// (800 MB at 10,000 clients) are not allocated and faulted in again every round.
    #[serde(skip)]
    roots: Vec<Vec<f64>>,
}

/// `roots` is scratch, overwritten by every linkage.
impl PartialEq for KeptDistances {
    fn eq(&self, other: &Self) -> bool {
        (&self.points, &self.sums, &self.reported, self.symmetric)
            == (&other.points, &other.sums, &other.reported, other.symmetric)
    }
}

impl KeptDistances {
    /// Notes that the rows of `points` (clients that reported) changed: the next linkage
    /// sums their rows afresh. Any row may change unannounced; announcing the ones that
    /// changed in most of their features keeps the update O(K N²).
    pub fn mark_changed(&mut self, points: &[usize]) {
        self.symmetric = Some(false);
        self.report(points);
    }

    /// Notes that the rows and the columns of `points` changed and nothing else did, as
    /// they do in Clustered Sampling's and HiCS-FL's symmetric matrices of client
    /// distances: the next linkage then takes those columns as the changed features
    /// without comparing all N² values with the last ones (1.6 GB read at 10,000 clients).
    /// The sums are those [`Self::mark_changed`] gives.
    pub fn mark_changed_symmetric(&mut self, points: &[usize]) {
        self.symmetric = Some(self.symmetric.unwrap_or(true));
        self.report(points);
    }

    fn report(&mut self, points: &[usize]) {
        self.reported.extend_from_slice(points);
        self.reported.sort_unstable();
        self.reported.dedup();
    }

    /// Ward linkage of `points`, from the squared distances kept since the last call.
    pub fn linkage(&mut self, points: &[Vec<f64>]) -> Vec<Merge> {
        self.update(points);
        merge_by_chain(&mut self.roots)
    }

    /// The squared distances now kept (for tests and checks).
    pub fn sums(&self) -> &[Vec<f64>] {
        &self.sums
    }

    /// Brings `sums` up to date with `points`, and `roots` to their √.
    fn update(&mut self, points: &[Vec<f64>]) {
        let n = points.len();
        let dims = points.first().map_or(0, Vec::len);
        let same_shape = self.points.len() == n
            && points.iter().all(|p| p.len() == dims)
            && self.points.iter().all(|p| p.len() == dims);
        if !same_shape || self.reported.iter().any(|&i| i >= n) {
            return self.recompute(points);
        }
        // The reported clients' rows are summed afresh; the features changed in the other
        // rows (the reported clients' columns, when the matrix is symmetric) are the ones
        // whose terms are replaced. A row changed without being reported only widens them.
        let reported = std::mem::take(&mut self.reported);
        let symmetric = self.symmetric.take() == Some(true) && dims == n;
        let mut row_changed = vec![false; n];
        for &i in &reported {
            row_changed[i] = true;
        }
        // Compared in parallel, the rows' findings or-ed: no order to keep. A column
        // announced changed whose values did not change adds (x − y)² − (x − y)² = 0 to
        // each sum.
        let col_changed = if symmetric {
            row_changed.clone()
        } else {
            Self::changed_columns(points, &self.points, &row_changed, dims)
        };
        let cols: Vec<usize> = (0..dims).filter(|&c| col_changed[c]).collect();
        if cols.is_empty() && reported.is_empty() {
            // The last linkage used the roots up.
            return self.fill_roots();
        }
        let column = |m: &[Vec<f64>], c: usize| m.iter().map(|p| p[c]).collect::<Vec<f64>>();
        let new_cols: Vec<Vec<f64>> = cols.iter().map(|&c| column(points, c)).collect();
        let old_cols: Vec<Vec<f64>> = cols.iter().map(|&c| column(&self.points, c)).collect();
        let finite = |m: &[Vec<f64>]| m.iter().flatten().all(|x| x.is_finite());
        if 4 * cols.len() >= dims
            || 4 * reported.len() >= n
            || !finite(&new_cols)
            || !finite(&old_cols)
        {
            return self.recompute(points);
        }
        let isa = crate::cpu::isa();
        let fresh = fresh_rows(points, &reported, isa);
        let mut slot = vec![usize::MAX; n];
        for (r, &a) in reported.iter().enumerate() {
            slot[a] = r;
        }
        shape(&mut self.roots, n);
        // Row blocks in parallel, and in each, column chunks: the changed columns' chunk
        // stays in cache for every row of the block. Each entry gets the arithmetic it had
        // when the reported rows were written after the others' update: a reported row
        // its fresh sums, the others (x′ − y′)² − (x − y)² added per changed feature in
        // order, floored at 0, their reported columns the fresh sums and their diagonal
        // kept; then √ into `roots`.
        self.sums
            .par_chunks_mut(UPDATE_ROWS)
            .zip(self.roots.par_chunks_mut(UPDATE_ROWS))
            .enumerate()
            .for_each(|(block, (sums, roots))| {
                for start in (0..n).step_by(UPDATE_CHUNK) {
                    let end = (start + UPDATE_CHUNK).min(n);
                    for (r, (row, root)) in sums.iter_mut().zip(roots.iter_mut()).enumerate() {
                        let a = block * UPDATE_ROWS + r;
                        let (row, root) = (&mut row[start..end], &mut root[start..end]);
                        if row_changed[a] {
                            row.copy_from_slice(&fresh[slot[a]][start..end]);
                        } else {
                            let diagonal = (start..end).contains(&a).then(|| row[a - start]);
                            add_changes(isa, row, &new_cols, &old_cols, a, start);
                            if let Some(s) = diagonal {
                                row[a - start] = s;
                            }
                            for &b in reported.iter().filter(|&&b| (start..end).contains(&b)) {
                                row[b - start] = fresh[slot[b]][a];
                            }
                        }
                        square_roots(isa, root, row);
                    }
                }
            });
        for (a, p) in points.iter().enumerate() {
            if row_changed[a] {
                self.points[a].copy_from_slice(p);
            } else {
                for &c in &cols {
                    self.points[a][c] = p[c];
                }
            }
        }
    }

    /// The features in which some point not reported changed since `old`: one
    /// comparison of every value, the rows in parallel and their findings or-ed.
    fn changed_columns(
        points: &[Vec<f64>],
        old: &[Vec<f64>],
        row_changed: &[bool],
        dims: usize,
    ) -> Vec<bool> {
        points
            .par_iter()
            .zip(old)
            .zip(row_changed)
            .filter(|&(_, &reported)| !reported)
            .fold(
                || vec![false; dims],
                |mut changed, ((new, old), _)| {
                    for ((c, x), y) in changed.iter_mut().zip(new).zip(old) {
                        *c |= x.to_bits() != y.to_bits();
                    }
                    changed
                },
            )
            .reduce(
                || vec![false; dims],
                |mut a, b| {
                    a.iter_mut().zip(b).for_each(|(x, y)| *x |= y);
                    a
                },
            )
    }

    fn recompute(&mut self, points: &[Vec<f64>]) {
        self.reported.clear();
        self.symmetric = None;
        self.sums = point_sums_on(points, crate::cpu::isa());
        self.points = points.to_vec();
        self.fill_roots();
    }

    /// `roots` = √`sums`.
    fn fill_roots(&mut self) {
        let isa = crate::cpu::isa();
        shape(&mut self.roots, self.sums.len());
        self.roots
            .par_iter_mut()
            .zip(&self.sums)
            .for_each(|(root, row)| square_roots(isa, root, row));
    }
}

/// Rows of a block of [`KeptDistances`]'s update, one parallel task.
const UPDATE_ROWS: usize = 16;
/// Columns of a chunk of that update: the changed columns' chunk, 2 × 8 B × K × 512 (80 KB
/// at K = 10), stays in L2 while every row of the block takes its share.
const UPDATE_CHUNK: usize = 512;

/// `m` as an n × n matrix, reusing its rows' memory (their values are overwritten).
fn shape(m: &mut Vec<Vec<f64>>, n: usize) {
    m.resize_with(n, Vec::new);
    for row in m.iter_mut() {
        row.resize(n, 0.0);
    }
}

/// Rows `reported` of the exact squared distances between `points` (0 on the diagonal),
/// each the same serial sum as [`point_sums_on`]'s, in one pass over the points
/// ([`cross_sums`]) where a row at a time read all of them once per reported client.
fn fresh_rows(points: &[Vec<f64>], reported: &[usize], isa: crate::cpu::Isa) -> Vec<Vec<f64>> {
    let rows: Vec<&[f64]> = reported.iter().map(|&a| points[a].as_slice()).collect();
    let all: Vec<&[f64]> = points.iter().map(Vec::as_slice).collect();
    let mut fresh = cross_sums(&rows, &all, DEPTH, GROUP, |tile, rows, cols, _| {
        squared_differences(isa, tile, rows, cols)
    });
    for (row, &a) in fresh.iter_mut().zip(reported) {
        row[a] = 0.0;
    }
    fresh
}

/// Adds to `row` (sums of point `a` with points `start..`) Σ over the changed features c,
/// in order, of (x′_a − x′_b)² − (x_a − x_b)², the new values in `new[c]` and the old in
/// `old[c]`, then floors each at 0.
fn add_changes(
    isa: crate::cpu::Isa,
    row: &mut [f64],
    new: &[Vec<f64>],
    old: &[Vec<f64>],
    a: usize,
    start: usize,
) {
    crate::cpu::on_isa!(
        isa,
        fn add(row: &mut [f64], new: &[Vec<f64>], old: &[Vec<f64>], a: usize, start: usize) {
            let mut delta = [0.0; UPDATE_CHUNK];
            let delta = &mut delta[..row.len()];
            let end = start + row.len();
            for (new, old) in new.iter().zip(old) {
                let (x, y) = (new[a], old[a]);
                for ((d, &xb), &yb) in delta.iter_mut().zip(&new[start..end]).zip(&old[start..end])
                {
                    let (e, f) = (x - xb, y - yb);
                    *d += e * e - f * f;
                }
            }
            for (s, d) in row.iter_mut().zip(delta.iter()) {
                *s = (*s + d).max(0.0);
            }
        }
    )
}

/// `root` = √`row`, entry by entry.
fn square_roots(isa: crate::cpu::Isa, root: &mut [f64], row: &[f64]) {
    crate::cpu::on_isa!(
        isa,
        fn roots(root: &mut [f64], row: &[f64]) {
            for (r, s) in root.iter_mut().zip(row) {
                *r = s.sqrt();
            }
        }
    )
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
#[inline(always)]
fn lance_williams(si: f64, sj: f64, sk: f64, dik: f64, djk: f64, h: f64) -> f64 {
    let v = ((si + sk) * dik.powi(2) + (sj + sk) * djk.powi(2) - sk * h * h) / (si + sj + sk);
    v.max(0.0).sqrt()
}

/// The points under cluster `c` (a point or n + a merge's index), sorted.
fn leaves(merges: &[Merge], n: usize, c: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut stack = vec![c];
    while let Some(c) = stack.pop() {
        if c < n {
            out.push(c);
        } else {
            let g = merges[c - n];
            stack.extend([g.a, g.b]);
        }
    }
    out.sort_unstable();
    out
}

/// The `k` clusters left after all but the last k − 1 merges (scipy
/// `fcluster(criterion="maxclust")` for Ward's monotone heights), each sorted,
/// ordered by their smallest member. Only those clusters' members are listed: listing every
/// cluster's, as it once did, is O(n²) on the chain-like trees of thousands of points.
pub fn cut_into(merges: &[Merge], n: usize, k: usize) -> Vec<Vec<usize>> {
    let k = k.clamp(1, n.max(1));
    let kept = n - k;
    let mut alive = vec![true; n + kept];
    for (i, g) in merges[..kept].iter().enumerate() {
        alive[g.a] = false;
        alive[g.b] = false;
        alive[n + i] = true;
    }
    let mut out: Vec<Vec<usize>> = (0..n + kept)
        .filter(|&c| alive[c])
        .map(|c| leaves(merges, n, c))
        .collect();
    out.sort_by_key(|c| c[0]);
    out
}

/// The maximal subtrees whose total `weight` is at most `cap` (Clustered Sampling
/// Alg. 2's cut at 1/m); a single point heavier than `cap` is its own cluster.
///
/// A subtree's weight is the sum over its points in id order. Summing it afresh for every
/// subtree visited is O(n²) on a chain-like tree (each subtree one point smaller than its
/// parent), 0.2 s a round of CS2 at 10,000 clients; the sum of its two children's sums
/// (O(1) a subtree) is within 4 (m + 2) ε of it for m points, and decides wherever it is
/// farther than that from the cap. Only the rare subtree closer to it is summed in id
/// order: the same cut as summing every one.
pub fn cut_by_weight(merges: &[Merge], weight: &[f64], cap: f64) -> Vec<Vec<usize>> {
    let n = weight.len();
    let limit = cap + 1e-12;
    let bounded = weight.iter().all(|w| w.is_finite() && *w >= 0.0);
    let mut approx = weight.to_vec();
    let mut count = vec![1usize; n];
    for g in merges {
        approx.push(approx[g.a] + approx[g.b]);
        count.push(count[g.a] + count[g.b]);
    }
    let fits = |c: usize| {
        let margin = 4.0 * (count[c] + 2) as f64 * f64::EPSILON * approx[c];
        if bounded && approx[c].is_finite() && (approx[c] - limit).abs() > margin {
            approx[c] <= limit
        } else {
            leaves(merges, n, c).iter().map(|&i| weight[i]).sum::<f64>() <= limit
        }
    };
    let mut out = Vec::new();
    let mut stack = vec![if merges.is_empty() {
        0
    } else {
        n + merges.len() - 1
    }];
    while let Some(c) = stack.pop() {
        if c < n || fits(c) {
            out.push(leaves(merges, n, c));
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

    // The code the faster paths are held to, as it was before them: the cuts listing every
    // cluster's members, the chain rewriting a merged row entry by entry, and the kept
    // sums updated one reported row at a time.

    /// Members of every cluster id (points and merges).
    fn old_members(merges: &[Merge], n: usize) -> Vec<Vec<usize>> {
        let mut m: Vec<Vec<usize>> = (0..n).map(|i| vec![i]).collect();
        for g in merges {
            // Both lists are sorted and disjoint: one merging pass, not a sort (a chain of
            // merges, common at thousands of points, made the sorts O(n² log n)).
            let (a, b) = (&m[g.a], &m[g.b]);
            let mut v = Vec::with_capacity(a.len() + b.len());
            let (mut x, mut y) = (a.iter().peekable(), b.iter().peekable());
            while let (Some(&&p), Some(&&q)) = (x.peek(), y.peek()) {
                if p < q {
                    v.push(p);
                    x.next();
                } else {
                    v.push(q);
                    y.next();
                }
            }
            v.extend(x);
            v.extend(y);
            m.push(v);
        }
        m
    }

    /// The `k` clusters left after all but the last k − 1 merges (scipy
    /// `fcluster(criterion="maxclust")` for Ward's monotone heights), each sorted,
    /// ordered by their smallest member.
    fn old_cut_into(merges: &[Merge], n: usize, k: usize) -> Vec<Vec<usize>> {
        let k = k.clamp(1, n.max(1));
        let all = old_members(merges, n);
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
    fn old_cut_by_weight(merges: &[Merge], weight: &[f64], cap: f64) -> Vec<Vec<usize>> {
        let n = weight.len();
        let all = old_members(merges, n);
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

    /// The merges from `d` by the nearest-neighbour chain (Murtagh 1983; Müllner 2011, Fig. 4):
    /// follow nearest neighbours until two are each other's, merge them, go on from what is
    /// left of the chain. Ward's distance is reducible, so the chain finds the greedy scan's
    /// merges, at O(n²) whatever the data, where [`merge`]'s rescans of the rows that pointed
    /// at a merged pair grow with how many did. The merges are found in another order, so
    /// Lance–Williams sums its terms in another order: heights within rounding of the scan's,
    /// and on exact ties possibly another pair first. Used with [`KeptDistances`], whose sums
    /// are not the exact bits either; merges are then sorted by height (stably) and numbered
    /// as scipy does.
    fn chain_entry_by_entry(mut d: Vec<Vec<f64>>) -> Vec<Merge> {
        let n = d.len();
        let mut size = vec![1usize; n];
        let mut active = vec![true; n];
        // (slot a, slot b, height, size): slot i holds a cluster containing point i.
        let mut raw: Vec<(usize, usize, f64, usize)> = Vec::with_capacity(n.saturating_sub(1));
        let mut chain: Vec<usize> = Vec::new();
        while raw.len() + 1 < n {
            if chain.is_empty() {
                chain.push(active.iter().position(|&a| a).expect("two clusters left"));
            }
            let (a, b) = loop {
                let a = chain[chain.len() - 1];
                let prev = chain.len().checked_sub(2).map(|p| chain[p]);
                // The previous link wins ties, so the chain ends; otherwise the lowest slot.
                let (mut best, mut least) = match prev {
                    Some(p) => (p, d[a][p]),
                    None => (n, f64::INFINITY),
                };
                for (k, (&v, &open)) in d[a].iter().zip(&active).enumerate() {
                    if open && k != a && (best == n || v < least) {
                        (best, least) = (k, v);
                    }
                }
                if Some(best) == prev {
                    chain.truncate(chain.len() - 2);
                    break (a, best);
                }
                chain.push(best);
            };
            let (i, j) = (a.min(b), a.max(b));
            let h = d[i][j];
            let (si, sj) = (size[i] as f64, size[j] as f64);
            for k in 0..n {
                if active[k] && k != i && k != j {
                    let v = lance_williams(si, sj, size[k] as f64, d[i][k], d[j][k], h);
                    d[i][k] = v;
                    d[k][i] = v;
                }
            }
            size[i] += size[j];
            active[j] = false;
            raw.push((i, j, h, size[i]));
        }
        // Heights in order (stably: equal heights keep the order found), then scipy's numbering:
        // a cluster's id is n + the index of the merge that formed it.
        raw.sort_by(|x, y| x.2.total_cmp(&y.2));
        // Sizes are counted again in that order: with non-finite heights the order is not the
        // one found, and the tree must still be whole.
        let mut parent: Vec<usize> = (0..n).collect();
        let mut label: Vec<usize> = (0..n).collect();
        let mut count = vec![1usize; n];
        let find = |parent: &mut Vec<usize>, mut x: usize| {
            while parent[x] != x {
                parent[x] = parent[parent[x]];
                x = parent[x];
            }
            x
        };
        raw.iter()
            .enumerate()
            .map(|(t, &(i, j, height, _))| {
                let (ri, rj) = (find(&mut parent, i), find(&mut parent, j));
                let (a, b) = (label[ri].min(label[rj]), label[ri].max(label[rj]));
                parent[rj] = ri;
                label[ri] = n + t;
                count[ri] += count[rj];
                Merge {
                    a,
                    b,
                    height,
                    size: count[ri],
                }
            })
            .collect()
    }

    /// Side-by-side sums of [`sums_from`]: enough independent additions to fill the adders.
    const ROW_LANES: usize = 8;

    /// Row `a` of the exact squared distances (0 at `a`), each the same serial sum as
    /// [`point_sums_on`]'s, [`ROW_LANES`] of them advancing side by side.
    fn sums_from(points: &[Vec<f64>], a: usize) -> Vec<f64> {
        let x = &points[a];
        let mut row = vec![0.0; points.len()];
        row.par_chunks_mut(ROW_LANES)
            .enumerate()
            .for_each(|(chunk, out)| {
                let first = chunk * ROW_LANES;
                // Lanes past the chunk run on x itself: their sums are never read.
                let mut cols: [&[f64]; ROW_LANES] = [x; ROW_LANES];
                for (l, col) in cols.iter_mut().enumerate().take(out.len()) {
                    *col = &points[first + l];
                }
                let mut sums = [-0.0f64; ROW_LANES];
                for (p, &xp) in x.iter().enumerate() {
                    for (s, col) in sums.iter_mut().zip(&cols) {
                        let e = xp - col[p];
                        *s += e * e;
                    }
                }
                for (l, s) in out.iter_mut().enumerate() {
                    if first + l != a {
                        *s = sums[l];
                    }
                }
            });
        row
    }

    /// The kept sums' update as it was: `sums` of the points `old` brought to `points`,
    /// the rows `reported` summed afresh (a case it updates, not one it recomputes).
    fn reference_update(
        sums: &mut [Vec<f64>],
        old: &[Vec<f64>],
        points: &[Vec<f64>],
        reported: &[usize],
    ) {
        let n = points.len();
        let mut row_changed = vec![false; n];
        for &i in reported {
            row_changed[i] = true;
        }
        let mut col_changed = vec![false; n];
        for (i, (new, old)) in points.iter().zip(old).enumerate() {
            if row_changed[i] {
                continue;
            }
            for (c, (x, y)) in new.iter().zip(old).enumerate() {
                if x.to_bits() != y.to_bits() {
                    col_changed[c] = true;
                }
            }
        }
        let cols: Vec<usize> = (0..n).filter(|&c| col_changed[c]).collect();
        let column = |m: &[Vec<f64>], c: usize| m.iter().map(|p| p[c]).collect::<Vec<f64>>();
        let new_cols: Vec<Vec<f64>> = cols.iter().map(|&c| column(points, c)).collect();
        let old_cols: Vec<Vec<f64>> = cols.iter().map(|&c| column(old, c)).collect();
        for (a, row) in sums.iter_mut().enumerate() {
            if row_changed[a] {
                continue;
            }
            let mut delta = vec![0.0; n];
            for (new, old) in new_cols.iter().zip(&old_cols) {
                let (x, y) = (new[a], old[a]);
                for ((d, &xb), &yb) in delta.iter_mut().zip(new).zip(old) {
                    let (e, f) = (x - xb, y - yb);
                    *d += e * e - f * f;
                }
            }
            for (b, (s, d)) in row.iter_mut().zip(&delta).enumerate() {
                if b != a && !row_changed[b] {
                    *s = (*s + d).max(0.0);
                }
            }
        }
        for &a in reported {
            let fresh = sums_from(points, a);
            for (b, &s) in fresh.iter().enumerate() {
                sums[a][b] = s;
                sums[b][a] = s;
            }
        }
    }

    /// The kept sums and the merges are those of the code before the one-pass update and
    /// the one-pass chain rows, bit for bit, over 20 rounds of 10 of 600 clients changing their
    /// row and column (and one row changing unannounced), at every thread count: rows
    /// past one block and one chunk of the update.
    #[test]
    fn the_kept_update_keeps_the_bits_it_had() {
        use crate::rng::{Purpose, stream};
        use rand::seq::index::sample;
        let n = 600;
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let mut rng = stream(11, Purpose::Strategy, 0, 0);
                let mut points = symmetric(n, &mut rng);
                let mut kept = KeptDistances::default();
                kept.linkage(&points);
                let mut want = kept.sums().to_vec();
                for round in 0..20 {
                    let old = points.clone();
                    let fresh: Vec<usize> = sample(&mut rng, n, 10).into_vec();
                    for &k in &fresh {
                        set_row(&mut points, k, &mut rng);
                    }
                    if round % 5 == 0 {
                        // A change nobody announced: only its column's terms are updated.
                        points[(round * 7) % n][(round * 13 + 1) % n] += 0.25;
                    }
                    kept.mark_changed(&fresh);
                    let mut reported = fresh.clone();
                    reported.sort_unstable();
                    let got = kept.linkage(&points);
                    reference_update(&mut want, &old, &points, &reported);
                    for (a, (x, y)) in kept.sums().iter().zip(&want).enumerate() {
                        for (b, (x, y)) in x.iter().zip(y).enumerate() {
                            assert_eq!(x.to_bits(), y.to_bits(), "round {round}: {a} {b}");
                        }
                    }
                    let expected = chain_entry_by_entry(roots(&want));
                    assert_eq!(got.len(), expected.len());
                    for (g, e) in got.iter().zip(&expected) {
                        assert_eq!(
                            (g.a, g.b, g.size, g.height.to_bits()),
                            (e.a, e.b, e.size, e.height.to_bits()),
                            "round {round}, {threads} threads"
                        );
                    }
                }
            });
        }
    }

    /// The chain with its rows rewritten in one pass merges as the chain that rewrote
    /// them entry by entry, bit for bit, on random points, on points with many exact
    /// ties, and on non-finite ones.
    #[test]
    fn the_vectorised_chain_merges_as_it_did() {
        use crate::rng::{Purpose, stream};
        use rand::Rng as _;
        for seed in 0..16 {
            let mut rng = stream(seed, Purpose::Strategy, 0, 0);
            let n = 2 + rng.random_range(0..200);
            let points: Vec<Vec<f64>> = (0..n)
                .map(|_| {
                    (0..4)
                        .map(|_| {
                            if seed % 2 == 0 {
                                f64::from(rng.random_range(0..3u8))
                            } else {
                                rng.random_range(-1.0..1.0)
                            }
                        })
                        .collect()
                })
                .collect();
            let d = point_distances(&points);
            let (now, before) = (merge_by_chain(&mut d.clone()), chain_entry_by_entry(d));
            assert_eq!(now.len(), before.len());
            for (a, b) in now.iter().zip(&before) {
                assert_eq!(
                    (a.a, a.b, a.size, a.height.to_bits()),
                    (b.a, b.b, b.size, b.height.to_bits()),
                    "seed {seed}"
                );
            }
        }
        for bad in [f64::NAN, f64::INFINITY] {
            let pts = vec![
                vec![bad, 1.0],
                vec![bad, 2.0],
                vec![0.0, bad],
                vec![1.0, 1.0],
                vec![1.0, 3.0],
            ];
            let d = point_distances(&pts);
            let (now, before) = (merge_by_chain(&mut d.clone()), chain_entry_by_entry(d));
            for (a, b) in now.iter().zip(&before) {
                assert_eq!((a.a, a.b, a.size), (b.a, b.b, b.size));
                assert_eq!(a.height.to_bits(), b.height.to_bits());
            }
        }
    }

    /// The cuts without every cluster's member list are the cuts with it: on balanced and
    /// chain-like trees, with weights of every size and caps falling exactly on a
    /// subtree's weight, where the children's sum and the sum in id order may differ in
    /// their last bit.
    #[test]
    fn the_cuts_are_the_cuts_they_were() {
        use crate::rng::{Purpose, stream};
        use rand::Rng as _;
        for seed in 0..24 {
            let mut rng = stream(seed, Purpose::Strategy, 1, 0);
            let n = 1 + rng.random_range(0..300);
            let points: Vec<Vec<f64>> = (0..n)
                .map(|i| {
                    if seed % 3 == 0 {
                        // Each point farther from the rest than the last: a chain-like tree.
                        vec![1.5f64.powi(i as i32 % 60), rng.random()]
                    } else {
                        vec![rng.random(), rng.random()]
                    }
                })
                .collect();
            let merges = linkage(&points);
            let weight: Vec<f64> = match seed % 4 {
                0 => vec![1.0 / n as f64; n],
                1 => (0..n)
                    .map(|_| f64::from(rng.random_range(1..60u8)))
                    .collect(),
                _ => (0..n).map(|_| rng.random::<f64>() * 0.1).collect(),
            };
            let total: f64 = weight.iter().sum();
            let weight: Vec<f64> = weight.iter().map(|w| w / total).collect();
            let mut caps: Vec<f64> = [0.01, 0.05, 0.1, 0.2, 0.5, 1.0].to_vec();
            // Caps on a subtree's own weight, less the cut's tolerance.
            let all = old_members(&merges, n);
            for c in (n..n + merges.len()).step_by(5) {
                caps.push(all[c].iter().map(|&i| weight[i]).sum::<f64>() - 1e-12);
            }
            for cap in caps {
                assert_eq!(
                    cut_by_weight(&merges, &weight, cap),
                    old_cut_by_weight(&merges, &weight, cap),
                    "seed {seed}, cap {cap}"
                );
            }
            for k in [1, 2, 5, 10, n] {
                assert_eq!(
                    cut_into(&merges, n, k),
                    old_cut_into(&merges, n, k),
                    "seed {seed}"
                );
            }
        }
    }

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
                let got = roots(&point_sums_on(&points, isa));
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

    /// A symmetric N × N matrix of arccos-like distances in [0, π), 0 on the diagonal.
    fn symmetric(n: usize, rng: &mut crate::rng::Rng) -> Vec<Vec<f64>> {
        let mut m = vec![vec![0.0; n]; n];
        for k in 0..n {
            set_row(&mut m, k, rng);
        }
        m
    }

    /// Draws row and column `k` of a symmetric matrix afresh (0 on the diagonal).
    fn set_row(m: &mut [Vec<f64>], k: usize, rng: &mut crate::rng::Rng) {
        use rand::Rng as _;
        let row: Vec<f64> = (0..m.len())
            .map(|j| {
                if j == k {
                    0.0
                } else {
                    rng.random_range(0.0..std::f64::consts::PI)
                }
            })
            .collect();
        for (j, v) in row.into_iter().enumerate() {
            m[k][j] = v;
            m[j][k] = v;
        }
    }

    /// Clustered Sampling's rows as clients report: 300 rounds of 10 of 200 clients changing
    /// their row and column. The kept squared distances stay within 1e-12 (relative) of the
    /// exact ones, a pair with a client that just reported is exact bit for bit, and the
    /// merges are the exact linkage's (same pairs and sizes, heights within 1e-12).
    #[test]
    fn kept_sums_stay_close_to_the_exact_ones() {
        use crate::rng::{Purpose, stream};
        use rand::seq::index::sample;
        let n = 200;
        let mut rng = stream(3, Purpose::Strategy, 0, 0);
        let mut points = symmetric(n, &mut rng);
        let mut kept = KeptDistances::default();
        let mut worst = 0.0f64;
        for round in 0..300 {
            let fresh: Vec<usize> = sample(&mut rng, n, 10).into_vec();
            for &k in &fresh {
                set_row(&mut points, k, &mut rng);
            }
            kept.mark_changed(&fresh);
            let merges = kept.linkage(&points);
            let exact = point_sums_on(&points, crate::cpu::isa());
            for (i, (kept_row, exact_row)) in kept.sums().iter().zip(&exact).enumerate() {
                for (j, (&got, &want)) in kept_row.iter().zip(exact_row).enumerate() {
                    if fresh.contains(&i) || fresh.contains(&j) {
                        assert_eq!(got.to_bits(), want.to_bits(), "round {round}: {i} {j}");
                    }
                    worst = worst.max((got - want).abs() / want.max(f64::MIN_POSITIVE));
                }
            }
            let want = linkage(&points);
            for (a, b) in merges.iter().zip(&want) {
                assert_eq!((a.a, a.b, a.size), (b.a, b.b, b.size), "round {round}");
                assert!(
                    (a.height - b.height).abs() <= 1e-12 * b.height,
                    "round {round}"
                );
            }
        }
        assert!(worst <= 1e-12, "worst relative error {worst:e}");
        assert!(
            worst > 0.0,
            "the updates were all exact: the test would not see drift"
        );
    }

    /// Changes announced as symmetric give the sums, roots and merges of the same changes
    /// announced as rows, whose columns are found by comparison, bit for bit, round after
    /// round; a plain announcement among symmetric ones falls back to the comparison.
    #[test]
    fn symmetric_announcements_keep_the_compared_sums() {
        use crate::rng::{Purpose, stream};
        use rand::seq::index::sample;
        let n = 120;
        let mut rng = stream(12, Purpose::Strategy, 0, 0);
        let mut points = symmetric(n, &mut rng);
        let (mut rows, mut both) = (KeptDistances::default(), KeptDistances::default());
        for round in 0..25 {
            let fresh: Vec<usize> = sample(&mut rng, n, 1 + round % 6).into_vec();
            for &k in &fresh {
                set_row(&mut points, k, &mut rng);
            }
            rows.mark_changed(&fresh);
            if round % 5 == 4 {
                both.mark_changed_symmetric(&fresh[..1]);
                both.mark_changed(&fresh[1..]);
            } else {
                both.mark_changed_symmetric(&fresh);
            }
            let (want, got) = (rows.linkage(&points), both.linkage(&points));
            assert_eq!(rows, both, "round {round}");
            let bits = |m: &[Merge]| -> Vec<(usize, usize, usize, u64)> {
                m.iter()
                    .map(|m| (m.a, m.b, m.size, m.height.to_bits()))
                    .collect()
            };
            assert_eq!(bits(&got), bits(&want), "round {round}");
        }
    }

    /// The kept sums are the same bits on one thread as on several, and survive a JSON
    /// round trip (a checkpoint) bit for bit, so that a resumed run clusters the same.
    #[test]
    fn kept_sums_do_not_depend_on_threads_and_survive_a_checkpoint() {
        use crate::rng::{Purpose, stream};
        let n = 90;
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let mut rng = stream(8, Purpose::Strategy, 0, 0);
                let mut kept = KeptDistances::default();
                let mut points = symmetric(n, &mut rng);
                for round in 0..20 {
                    kept.linkage(&points);
                    let next = symmetric(n, &mut rng);
                    for k in (round % 7..n).step_by(30) {
                        kept.mark_changed(&[k]);
                        for j in 0..n {
                            points[k][j] = next[k][j];
                            points[j][k] = next[k][j];
                        }
                        points[k][k] = 0.0;
                    }
                }
                kept
            })
        };
        let (one, two) = (run(1), run(2));
        assert_eq!(one, two);
        let back: KeptDistances =
            serde_json::from_str(&serde_json::to_string(&one).unwrap()).unwrap();
        assert_eq!(back, one);
        let bits = |k: &KeptDistances| -> Vec<u64> {
            k.sums().iter().flatten().map(|x| x.to_bits()).collect()
        };
        assert_eq!(bits(&back), bits(&one));
    }

    /// The chain finds the scan's merges on random points: the same pairs and sizes in the
    /// same order, heights within rounding; and non-finite distances still make a whole
    /// tree.
    #[test]
    fn the_chain_merges_as_the_scan() {
        use crate::rng::{Purpose, stream};
        use rand::Rng as _;
        for seed in 0..12 {
            let mut rng = stream(seed, Purpose::Strategy, 0, 0);
            let n = 2 + rng.random_range(0..120);
            let points: Vec<Vec<f64>> = (0..n)
                .map(|_| (0..5).map(|_| rng.random_range(-1.0..1.0)).collect())
                .collect();
            let (chain, scan) = (
                merge_by_chain(&mut point_distances(&points)),
                linkage(&points),
            );
            assert_eq!(chain.len(), n - 1);
            for (a, b) in chain.iter().zip(&scan) {
                assert_eq!((a.a, a.b, a.size), (b.a, b.b, b.size), "seed {seed}");
                assert!(
                    (a.height - b.height).abs() <= 1e-12 * b.height,
                    "seed {seed}"
                );
            }
        }
        for bad in [f64::NAN, f64::INFINITY] {
            let pts = vec![
                vec![bad, 1.0],
                vec![bad, 2.0],
                vec![0.0, bad],
                vec![1.0, 1.0],
            ];
            let m = merge_by_chain(&mut point_distances(&pts));
            assert_eq!((m.len(), m[2].size), (3, 4));
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

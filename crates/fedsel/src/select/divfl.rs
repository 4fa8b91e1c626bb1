//! DivFL (Balakrishnan et al., ICLR 2022): select a diverse subset by greedy
//! facility location on client gradients.
//!
//! With G the available clients' gradients and D_ij = ‖g_i − g_j‖, the subset S
//! minimises Σ_{i∈A} min_{j∈S} D_ij (equivalently maximises the submodular
//! F(S) = Σ_i (L − min_{j∈S} D_ij), L = max D); greedy adds the client with the
//! largest gain, which guarantees F(S) ≥ (1 − 1/e) F(S*). The first pick is the
//! column with the smallest sum. Ties go to the lowest index.
//!
//! A client's gradient is, as in the DivFL code (algorithms.md §8), the full-batch
//! gradient of its mean loss over all its local training data at the global model it
//! receives; `gradient = "minibatch"` takes one batch instead, which is cheaper. The
//! ledger books the examples either passed over.
//!
//! Cost at N available clients with P parameters. Under the "ideal" refresh every
//! gradient is new each round, so no distance carries over: O(N² P) a round for the
//! distances (N²/2 dot products, each kept in parameter order so that the selections stay
//! bit for bit), one N × N matrix, then O(K N²) for the greedy. At 10,000 clients and
//! 7,850 parameters that is 4·10¹¹ multiply-adds a round, seconds at any precision on two
//! cores: inherent to the refresh, whose N gradients are also N passes over the clients'
//! data. Under the "stale" refresh only the K selected (and newly available) clients send a
//! new gradient, and the kept matrix changes in their rows alone: O(K N P + K N²) a round
//! after the first (`Cache`), the same picks as recomputing it.
//!
//! Above [`EXACT_UP_TO`] available clients the ideal refresh, by default
//! (`distances = "auto"`), computes the distances between count sketches of the
//! gradients ([`sketch`], `sketch_dim` = m buckets, a fresh sketch drawn from the round's
//! selection stream): O(N P + N² m) a round, each distance within a few per cent of the
//! exact one, and so picks that may differ from the exact ones. Up to that size, which
//! covers every paper's federation, the distances are exact and the picks are the same bits
//! as always; `distances = "exact"` keeps them exact at any size.
//!
//! Refresh (decisions.md): "ideal" asks every available client for its gradient
//! each round (the HiCS-FL comparison); "stale" asks all clients once
//! and afterwards only the selected ones, at the model they receive (the DivFL
//! code). Stochastic greedy evaluates a random subset of max(m, ⌊fraction·n⌋)
//! candidates per step.

mod distances;
mod sketch;

use rand::seq::index::sample;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

pub(crate) use distances::dots_with_all;
pub use distances::gradient_distances;

use super::{ClientQuery, GradientScope, RoundContext, Selection, Selector, Setup};
use crate::error::{ConfigError, Error};
use crate::rng::Rng;
use crate::validate::{check, check_prob};

/// How DivFL refreshes client gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DivflRefresh {
    /// Every available client sends its gradient every round.
    Ideal,
    /// All clients once, then only the selected, at the model they receive.
    Stale,
}

/// How the ideal refresh obtains its N² gradient distances (`selection.divfl.distances`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DivflDistances {
    /// [`Self::Exact`] up to [`EXACT_UP_TO`] available clients, every paper's size, and
    /// [`Self::Sketch`] above, where the exact pass takes seconds a round.
    #[default]
    Auto,
    /// The exact Euclidean distances, O(N² P) a round.
    Exact,
    /// Distances between count sketches of `sketch_dim` buckets, O(N P + N² m) a round.
    Sketch,
}

impl DivflDistances {
    /// Whether this is the default, so that configs without the key keep their hash.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// The most available clients [`DivflDistances::Auto`] computes exact distances for (as
/// Ward's [`super::ward::EXACT_UP_TO`]): about 50 ms a round at 1,000 clients and 7,850
/// parameters, 4.9 s at 10,000.
pub const EXACT_UP_TO: usize = 1000;

/// Buckets of the count sketch unless `sketch_dim` says otherwise.
const DEFAULT_SKETCH_DIM: usize = 1024;

fn is_default_sketch_dim(dim: &usize) -> bool {
    *dim == DEFAULT_SKETCH_DIM
}

/// DivFL (Balakrishnan et al. 2022).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DivflConfig {
    /// Gradient refresh.
    pub refresh: DivflRefresh,
    /// What each client gradient covers: `full` (all local training data at the received
    /// global model, as the DivFL code computes it) or `minibatch` (one batch, cheaper).
    pub gradient: GradientScope,
    /// Stochastic greedy: scan a random subset of candidates per step.
    pub stochastic: bool,
    /// Size of that subset as a fraction of the available clients (at least m).
    pub fraction: f64,
    /// The ideal refresh's distances: `auto` (exact up to 1,000 available clients,
    /// sketched above), `exact` or `sketch`. Written out only when not the default.
    #[serde(skip_serializing_if = "DivflDistances::is_default")]
    pub distances: DivflDistances,
    /// Buckets m of the count sketch (1,024 unless set; written out only when set).
    #[serde(skip_serializing_if = "is_default_sketch_dim")]
    pub sketch_dim: usize,
}

impl Default for DivflConfig {
    fn default() -> Self {
        Self {
            refresh: DivflRefresh::Ideal,
            gradient: GradientScope::Full,
            stochastic: false,
            fraction: 0.1,
            distances: DivflDistances::Auto,
            sketch_dim: DEFAULT_SKETCH_DIM,
        }
    }
}

impl DivflConfig {
    /// Rejects a fraction or sketch no run can use, naming the key: the `selection.divfl`
    /// part of [`Config::validate`](crate::config::Config::validate).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        check_prob(self.fraction, "selection.divfl.fraction", true, false)?;
        check(
            self.sketch_dim >= 1 && u32::try_from(self.sketch_dim).is_ok(),
            "selection.divfl.sketch_dim",
            "must be at least 1 (and below 2³²)",
        )?;
        check(
            !(self.distances == DivflDistances::Sketch && self.refresh == DivflRefresh::Stale),
            "selection.divfl.distances",
            "\"sketch\" applies to the ideal refresh; the stale refresh updates its K new \
             rows exactly, O(K N P) a round",
        )
    }

    /// Whether the ideal refresh sketches `n` gradients of `params` parameters: never when
    /// the sketch would be as wide as the gradients.
    fn sketches(&self, n: usize, params: usize) -> bool {
        match self.distances {
            DivflDistances::Exact => false,
            DivflDistances::Sketch => true,
            DivflDistances::Auto => n > EXACT_UP_TO && params > self.sketch_dim,
        }
    }
}

/// Greedy facility location: `k` indices into `dist` (n × n), in pick order.
/// With `subsample = Some(s)` each step scans `s` random candidates (stochastic greedy).
pub fn facility_location(
    dist: &[Vec<f64>],
    k: usize,
    subsample: Option<usize>,
    rng: &mut Rng,
) -> Vec<usize> {
    let all: Vec<usize> = (0..dist.len()).collect();
    facility_location_among(dist, &all, k, subsample, rng)
}

/// [`facility_location`] on the points `members` of a larger symmetric matrix (the
/// stale refresh's matrix of every client): `k` positions in `members`, in pick order,
/// the picks the submatrix would give, bit for bit.
fn facility_location_among(
    dist: &[Vec<f64>],
    members: &[usize],
    k: usize,
    subsample: Option<usize>,
    rng: &mut Rng,
) -> Vec<usize> {
    greedy(&Members { dist, members }, k, subsample, rng)
}

/// The distances a greedy step reads, however they are stored.
trait Facilities: Sync {
    /// The number of points.
    fn len(&self) -> usize;
    /// Each candidate's cost Σ_i min(nearest_i, d(candidate, i)), one sequential sum over
    /// the points in order from −0.0 (as `Iterator::sum`) whatever thread computes it, as
    /// (candidate, cost); other points' costs summed on the way may come too.
    fn costs(&self, nearest: &[f64], candidates: &[usize]) -> Vec<(usize, f64)>;
    /// nearest_i ← min(nearest_i, d(pick, i)) for every point i.
    fn lower(&self, nearest: &mut [f64], pick: usize);
}

/// Rows `members` of an N × N matrix, and their entries in the columns `members`.
struct Members<'a> {
    dist: &'a [Vec<f64>],
    members: &'a [usize],
}

/// Candidate costs summed side by side: independent chains of additions, each still in
/// point order.
const COST_LANES: usize = 8;

impl Facilities for Members<'_> {
    fn len(&self) -> usize {
        self.members.len()
    }

    fn costs(&self, nearest: &[f64], candidates: &[usize]) -> Vec<(usize, f64)> {
        candidates
            .par_chunks(COST_LANES)
            .flat_map_iter(|group| {
                let rows: Vec<&[f64]> = group
                    .iter()
                    .map(|&j| &self.dist[self.members[j]][..])
                    .collect();
                let mut sums = [-0.0f64; COST_LANES];
                for (&near, &m) in nearest.iter().zip(self.members) {
                    for (s, row) in sums.iter_mut().zip(&rows) {
                        *s += near.min(row[m]);
                    }
                }
                group.iter().copied().zip(sums)
            })
            .collect()
    }

    fn lower(&self, nearest: &mut [f64], pick: usize) {
        let row = &self.dist[self.members[pick]];
        for (a, &m) in nearest.iter_mut().zip(self.members) {
            *a = a.min(row[m]);
        }
    }
}

impl Facilities for distances::Tiled {
    fn len(&self) -> usize {
        distances::Tiled::len(self)
    }

    fn costs(&self, nearest: &[f64], candidates: &[usize]) -> Vec<(usize, f64)> {
        distances::Tiled::costs(self, nearest, candidates)
    }

    fn lower(&self, nearest: &mut [f64], pick: usize) {
        for (i, a) in nearest.iter_mut().enumerate() {
            *a = a.min(self.at(pick, i));
        }
    }
}

/// The greedy of [`facility_location`] on `f`.
///
/// Without a subsample the greedy is lazy (Minoux 1978), yet picks what the full scan
/// picks: a candidate's cost after adding it, c_j = Σ_i min(near_i, d_ij), falls by at
/// most what the objective F = Σ_i near_i falls (its gain F − c_j only shrinks as picks
/// are added: the objective is submodular), so c_j − F_then + F_now bounds its cost now
/// from below. After the first two full scans (the first has F = ∞), a step sums afresh
/// only the candidates whose bound, less a margin far wider than the rounding of any of
/// these sums, does not exceed the least cost found; every other one costs more than that,
/// so the choice, lowest index on ties, is the full scan's. At 10,000 clients a step sums
/// 0.3-8 % of the candidates.
fn greedy(f: &impl Facilities, k: usize, subsample: Option<usize>, rng: &mut Rng) -> Vec<usize> {
    let n = f.len();
    let k = k.min(n);
    let mut chosen = Vec::with_capacity(k);
    let mut taken = vec![false; n];
    // Distance of each point to its nearest chosen facility; "∞" before the first pick
    // makes the first step the smallest column sum.
    let mut nearest = vec![f64::INFINITY; n];
    // Each candidate's cost when last summed, and the objective then.
    let mut known: Vec<Option<(f64, f64)>> = vec![None; n];
    // Sums of n non-negative terms are each within n·2⁻⁵³ of their value, relatively; the
    // margin is 64 times that, of the larger objective.
    let slack = 64.0 * (n as f64 + 2.0) * f64::EPSILON;
    for _ in 0..k {
        let left: Vec<usize> = (0..n).filter(|&j| !taken[j]).collect();
        let objective = nearest.iter().fold(-0.0, |s: f64, &v| s + v);
        let candidates = match subsample {
            Some(s) if s < left.len() => {
                let mut c: Vec<usize> = sample(rng, left.len(), s)
                    .into_iter()
                    .map(|i| left[i])
                    .collect();
                c.sort_unstable();
                c
            }
            _ => left,
        };
        let bounds: Option<Vec<f64>> = if candidates.len() < n - chosen.len() {
            None
        } else {
            candidates
                .iter()
                .map(|&j| {
                    known[j]
                        .map(|(cost, then)| cost - then + objective - slack * then)
                        .filter(|b| b.is_finite())
                })
                .collect()
        };
        let summed = match bounds.filter(|_| objective.is_finite()) {
            Some(bounds) => lazy_costs(f, &nearest, &candidates, &bounds, &taken),
            None => f.costs(&nearest, &candidates),
        };
        let mut costs = vec![f64::NAN; n];
        let mut fresh = vec![false; n];
        for &(j, c) in &summed {
            if !taken[j] {
                known[j] = Some((c, objective));
                costs[j] = c;
                fresh[j] = true;
            }
        }
        // Candidate order, so that ties go to the lowest, as in the full scan.
        let best = candidates
            .iter()
            .filter(|&&j| fresh[j])
            .map(|&j| (j, costs[j]))
            .fold(None, |best: Option<(usize, f64)>, (j, c)| match best {
                Some((_, bc)) if bc <= c => best,
                _ => Some((j, c)),
            })
            .expect("k ≤ n leaves a candidate")
            .0;
        taken[best] = true;
        chosen.push(best);
        f.lower(&mut nearest, best);
    }
    chosen
}

/// The costs of the candidates whose lower bound (`bounds`, one per candidate) does not
/// exceed the least cost found, summed in order of their bounds, a group of
/// [`COST_LANES`] at a time (with whatever other costs `f` sums on the way).
fn lazy_costs(
    f: &impl Facilities,
    nearest: &[f64],
    candidates: &[usize],
    bounds: &[f64],
    taken: &[bool],
) -> Vec<(usize, f64)> {
    let mut order: Vec<(f64, usize)> = bounds
        .iter()
        .copied()
        .zip(candidates.iter().copied())
        .collect();
    order.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut summed: Vec<(usize, f64)> = Vec::new();
    let mut fresh = vec![false; taken.len()];
    let mut least = f64::INFINITY;
    let mut next = 0;
    while next < order.len() && order[next].0 <= least {
        let mut group = Vec::with_capacity(COST_LANES);
        while group.len() < COST_LANES && next < order.len() && order[next].0 <= least {
            let j = order[next].1;
            if !fresh[j] {
                group.push(j);
            }
            next += 1;
        }
        for (j, c) in f.costs(nearest, &group) {
            if !taken[j] && !fresh[j] {
                fresh[j] = true;
                least = least.min(c);
                summed.push((j, c));
            }
        }
    }
    summed
}

/// The DivFL selector.
#[derive(Debug, Clone)]
pub struct DivFl {
    cfg: DivflConfig,
    state: State,
    /// The stale refresh's distances between every pair of clients with a gradient,
    /// rebuilt from `state` when absent (after `setup` or `load`).
    cache: Option<Cache>,
    /// The ideal refresh's distances, rewritten every round in memory kept between rounds.
    distances: distances::Tiled,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct State {
    /// Latest gradient per client (stale refresh).
    gradients: Vec<Vec<f32>>,
}

/// Under the stale refresh only the clients that sent a new gradient change their row
/// and column of the distance matrix: K rows a round, O(K N P), where recomputing the
/// matrix is O(N² P). Each entry depends on its two gradients alone, so the kept matrix
/// is the one a full recomputation gives, bit for bit.
#[derive(Debug, Clone)]
struct Cache {
    /// ‖g_k‖² per client ([`distances::squared_norm`]).
    sq: Vec<f64>,
    /// N × N; rows and columns of clients without a gradient are unused.
    dist: Vec<Vec<f64>>,
    /// Clients whose gradient changed since the matrix was last brought up to date.
    changed: Vec<usize>,
}

impl Cache {
    /// The distances of every client with a gradient in `gradients`.
    fn build(gradients: &[Vec<f32>]) -> Self {
        let known: Vec<usize> = (0..gradients.len())
            .filter(|&k| !gradients[k].is_empty())
            .collect();
        let g: Vec<&[f32]> = known.iter().map(|&k| gradients[k].as_slice()).collect();
        let sub = gradient_distances(&g);
        let n = gradients.len();
        let mut dist = vec![Vec::new(); n];
        let mut sq = vec![0.0; n];
        let mut rows = sub.into_iter();
        for &k in &known {
            sq[k] = distances::squared_norm(&gradients[k]);
            let mut row = vec![0.0; n];
            for (&j, d) in known
                .iter()
                .zip(rows.next().expect("a row per known client"))
            {
                row[j] = d;
            }
            dist[k] = row;
        }
        for row in dist.iter_mut().filter(|r| r.is_empty()) {
            *row = vec![0.0; n];
        }
        Self {
            sq,
            dist,
            changed: Vec::new(),
        }
    }

    /// Brings the rows and columns of the changed clients up to date.
    fn refresh(&mut self, gradients: &[Vec<f32>]) {
        let mut changed = std::mem::take(&mut self.changed);
        changed.sort_unstable();
        changed.dedup();
        let g: Vec<&[f32]> = gradients.iter().map(Vec::as_slice).collect();
        for &k in &changed {
            self.sq[k] = distances::squared_norm(&gradients[k]);
        }
        for (&k, row) in changed
            .iter()
            .zip(distances::distances_from(&g, &self.sq, &changed))
        {
            for (j, &d) in row.iter().enumerate() {
                self.dist[j][k] = d;
            }
            self.dist[k] = row;
        }
    }
}

impl DivFl {
    /// A selector with the given settings.
    pub fn new(cfg: DivflConfig) -> Self {
        Self {
            cfg,
            state: State::default(),
            cache: None,
            distances: distances::Tiled::default(),
        }
    }

    /// Stores new gradients of `clients` (stale refresh), marking their rows stale.
    fn store(&mut self, clients: &[usize], gradients: Vec<Vec<f32>>) {
        for (&k, v) in clients.iter().zip(gradients) {
            self.state.gradients[k] = v;
        }
        if let Some(cache) = &mut self.cache {
            cache.changed.extend_from_slice(clients);
        }
    }
}

impl Selector for DivFl {
    fn name(&self) -> &'static str {
        "divfl"
    }

    fn setup(&mut self, setup: &Setup) {
        self.state.gradients = vec![Vec::new(); setup.sizes.len()];
        self.cache = None;
    }

    fn select(
        &mut self,
        ctx: &RoundContext<'_>,
        query: &mut dyn ClientQuery,
        rng: &mut Rng,
    ) -> Result<Selection, Error> {
        let a = ctx.available;
        let subsample = self
            .cfg
            .stochastic
            .then(|| ((self.cfg.fraction * a.len() as f64).floor() as usize).max(ctx.budget));
        let picks = match self.cfg.refresh {
            DivflRefresh::Ideal => {
                let mut fresh = query.gradients(a, self.cfg.gradient)?;
                let params = fresh.first().map_or(0, Vec::len);
                if self.cfg.sketches(fresh.len(), params) {
                    let sketch = sketch::CountSketch::draw(params, self.cfg.sketch_dim, rng);
                    fresh = sketch.apply(&fresh);
                }
                let g: Vec<&[f32]> = fresh.iter().map(Vec::as_slice).collect();
                self.distances.refill(&g);
                greedy(&self.distances, ctx.budget, subsample, rng)
            }
            DivflRefresh::Stale => {
                let missing: Vec<usize> = a
                    .iter()
                    .copied()
                    .filter(|&k| self.state.gradients[k].is_empty())
                    .collect();
                if !missing.is_empty() {
                    let got = query.gradients(&missing, self.cfg.gradient)?;
                    self.store(&missing, got);
                }
                let gradients = &self.state.gradients;
                let cache = self.cache.get_or_insert_with(|| Cache::build(gradients));
                cache.refresh(gradients);
                facility_location_among(&cache.dist, a, ctx.budget, subsample, rng)
            }
        };
        let mut clients: Vec<usize> = picks.into_iter().map(|i| a[i]).collect();
        clients.sort_unstable();
        if self.cfg.refresh == DivflRefresh::Stale && !clients.is_empty() {
            // The selected compute their gradient at the model they receive (DivFL code).
            let got = query.gradients(&clients, self.cfg.gradient)?;
            self.store(&clients, got);
        }
        Ok(Selection {
            clients,
            weights: None,
        })
    }

    fn save(&self) -> serde_json::Value {
        super::save_state(&self.state)
    }

    fn load(&mut self, state: &serde_json::Value) -> Result<(), Error> {
        let loaded: State = super::load_state("divfl", state)?;
        let n = self.state.gradients.len();
        super::check_loaded("divfl", "gradients", loaded.gradients.len(), n)?;
        self.state = loaded;
        self.cache = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Purpose, stream};
    use crate::select::testing;
    use rand::Rng as _;

    /// The four-at-a-time distances are the one-at-a-time sums bit for bit, for every
    /// remainder of the row length modulo the lanes.
    #[test]
    fn side_by_side_distances_equal_the_serial_sums() {
        let mut rng = stream(9, Purpose::Strategy, 0, 0);
        let g: Vec<Vec<f32>> = (0..11)
            .map(|_| (0..37).map(|_| rng.random_range(-1.0f32..1.0)).collect())
            .collect();
        let refs: Vec<&[f32]> = g.iter().map(Vec::as_slice).collect();
        let d = gradient_distances(&refs);
        let sq = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>();
        for i in 0..g.len() {
            for j in 0..g.len() {
                let dot: f64 = g[i]
                    .iter()
                    .zip(&g[j])
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum();
                let want = if i == j {
                    0.0
                } else {
                    (sq(&g[i]) + sq(&g[j]) - 2.0 * dot).max(0.0).sqrt()
                };
                assert_eq!(d[i][j].to_bits(), want.to_bits(), "{i} {j}");
            }
        }
    }

    fn cost(dist: &[Vec<f64>], set: &[usize]) -> f64 {
        (0..dist.len())
            .map(|i| {
                set.iter()
                    .map(|&j| dist[i][j])
                    .fold(f64::INFINITY, f64::min)
            })
            .sum()
    }

    /// F(S) = Σ_i (L − min_{j∈S} D_ij) with F(∅) = 0: greedy must reach (1 − 1/e) of the
    /// brute-force optimum, and equals it on a clearly clustered instance.
    #[test]
    fn greedy_meets_its_guarantee_against_brute_force() {
        let mut rng = stream(4, Purpose::Strategy, 0, 0);
        for trial in 0..30 {
            let n = 9;
            let pts: Vec<(f64, f64)> = (0..n).map(|_| (rng.random(), rng.random())).collect();
            let dist: Vec<Vec<f64>> = pts
                .iter()
                .map(|a| {
                    pts.iter()
                        .map(|b| ((a.0 - b.0).powi(2) + (a.1 - b.1).powi(2)).sqrt())
                        .collect()
                })
                .collect();
            let l = dist.iter().flatten().copied().fold(0.0, f64::max);
            let f = |s: &[usize]| n as f64 * l - cost(&dist, s);
            for k in [2, 3] {
                let greedy = facility_location(&dist, k, None, &mut rng);
                let mut best = 0.0f64;
                for mask in 0u32..(1 << n) {
                    if mask.count_ones() as usize == k {
                        let s: Vec<usize> = (0..n).filter(|&i| mask >> i & 1 == 1).collect();
                        best = best.max(f(&s));
                    }
                }
                let got = f(&greedy);
                assert!(
                    got >= (1.0 - (-1f64).exp()) * best - 1e-9,
                    "trial {trial}: {got} vs {best}"
                );
            }
        }
        // Three tight groups far apart: greedy with k = 3 takes one from each, the optimum.
        let pts: [f64; 8] = [0.0, 0.1, 0.2, 10.0, 10.1, 20.0, 20.1, 20.2];
        let dist: Vec<Vec<f64>> = pts
            .iter()
            .map(|a| pts.iter().map(|b| (a - b).abs()).collect())
            .collect();
        let mut s = facility_location(&dist, 3, None, &mut rng);
        s.sort();
        assert_eq!(s, vec![1, 3, 6]);
    }

    /// The greedy as it was, one sequential sum per candidate over a submatrix.
    fn one_sum_per_candidate(
        dist: &[Vec<f64>],
        k: usize,
        subsample: Option<usize>,
        rng: &mut Rng,
    ) -> Vec<usize> {
        let n = dist.len();
        let mut chosen = Vec::new();
        let mut taken = vec![false; n];
        let mut nearest = vec![f64::INFINITY; n];
        for _ in 0..k.min(n) {
            let left: Vec<usize> = (0..n).filter(|&j| !taken[j]).collect();
            let candidates: Vec<usize> = match subsample {
                Some(s) if s < left.len() => {
                    let mut c: Vec<usize> = sample(rng, left.len(), s)
                        .into_iter()
                        .map(|i| left[i])
                        .collect();
                    c.sort_unstable();
                    c
                }
                _ => left,
            };
            let mut best: Option<(usize, f64)> = None;
            for j in candidates {
                let c: f64 = nearest.iter().zip(&dist[j]).map(|(&a, &b)| a.min(b)).sum();
                if best.is_none_or(|(_, bc)| c < bc) {
                    best = Some((j, c));
                }
            }
            let best = best.unwrap().0;
            taken[best] = true;
            chosen.push(best);
            for (a, &b) in nearest.iter_mut().zip(&dist[best]) {
                *a = a.min(b);
            }
        }
        chosen
    }

    fn random_gradients(n: usize, params: usize, rng: &mut Rng) -> Vec<Vec<f32>> {
        (0..n)
            .map(|_| {
                (0..params)
                    .map(|_| rng.random_range(-1.0f32..1.0))
                    .collect()
            })
            .collect()
    }

    /// The greedy tests' gradients: uniform for small sets, in `clusters` clusters above
    /// 100, where many candidates' costs lie close together.
    fn greedy_gradients(n: usize, params: usize, clusters: usize, rng: &mut Rng) -> Vec<Vec<f32>> {
        if n > 100 {
            clustered(n, params, clusters, rng)
        } else {
            random_gradients(n, params, rng)
        }
    }

    /// Side-by-side candidate sums and the lazy greedy pick what one sum per candidate
    /// picks, on a matrix and on members of a larger one, with and without the stochastic
    /// subsample; ties (duplicated gradients) go to the lowest index in both. The larger
    /// sets are clustered, with several copies of some gradients, so that many lazy bounds
    /// sit near the least cost.
    #[test]
    fn grouped_greedy_picks_as_one_sum_per_candidate() {
        let mut rng = stream(3, Purpose::Strategy, 0, 0);
        for n in [1, 5, 9, 17, 40, 150, 301] {
            let mut g = greedy_gradients(n, 13, 6, &mut rng);
            if n > 4 {
                g[3] = g[1].clone();
            }
            for c in (20..n).step_by(7) {
                g[c] = g[c - 20].clone();
            }
            let refs: Vec<&[f32]> = g.iter().map(Vec::as_slice).collect();
            let dist = gradient_distances(&refs);
            for k in [1, 3, 10, 40] {
                for sub in [None, Some(4)] {
                    let seed = (n * 100 + k) as u64;
                    let got = facility_location(
                        &dist,
                        k,
                        sub,
                        &mut stream(seed, Purpose::Selection, 0, 0),
                    );
                    let want = one_sum_per_candidate(
                        &dist,
                        k,
                        sub,
                        &mut stream(seed, Purpose::Selection, 0, 0),
                    );
                    assert_eq!(got, want, "n {n} k {k} {sub:?}");
                    // Every other member of the same matrix: the submatrix's picks.
                    let members: Vec<usize> = (0..n).step_by(2).collect();
                    let sub_dist: Vec<Vec<f64>> = members
                        .iter()
                        .map(|&i| members.iter().map(|&j| dist[i][j]).collect())
                        .collect();
                    let got = facility_location_among(
                        &dist,
                        &members,
                        k,
                        sub,
                        &mut stream(seed, Purpose::Selection, 1, 0),
                    );
                    let want = one_sum_per_candidate(
                        &sub_dist,
                        k,
                        sub,
                        &mut stream(seed, Purpose::Selection, 1, 0),
                    );
                    assert_eq!(got, want, "members, n {n} k {k} {sub:?}");
                }
            }
        }
    }

    /// The ideal refresh's greedy on the distances in their tiles picks what it picks on
    /// the full rows, and every cost it sums there is the rows' bits: for sizes with every
    /// remainder modulo the panel, duplicated gradients, with and without the subsample.
    #[test]
    fn tiled_distances_pick_as_the_rows() {
        let mut rng = stream(4, Purpose::Strategy, 0, 0);
        for n in [1, 7, 8, 9, 33, 150, 301] {
            let mut g = greedy_gradients(n, 29, 5, &mut rng);
            for c in (9..n).step_by(5) {
                g[c] = g[c - 9].clone();
            }
            let refs: Vec<&[f32]> = g.iter().map(Vec::as_slice).collect();
            let rows = gradient_distances(&refs);
            let mut tiled = distances::Tiled::default();
            // Filled twice, the second time over memory a larger set left behind.
            tiled.refill(&refs[..n / 2]);
            tiled.refill(&refs);
            assert_eq!(tiled.rows(), rows, "n {n}");
            let all: Vec<usize> = (0..n).collect();
            let members = Members {
                dist: &rows,
                members: &all,
            };
            let nearest: Vec<f64> = (0..n).map(|i| rows[i][n / 3]).collect();
            let want = members.costs(&nearest, &all);
            let got = tiled.costs(&nearest, &all);
            let bits = |v: &[(usize, f64)]| -> Vec<(usize, u64)> {
                v.iter().map(|&(j, c)| (j, c.to_bits())).collect()
            };
            assert_eq!(bits(&got), bits(&want), "n {n}");
            for k in [1, 3, 10, 40] {
                for sub in [None, Some(4)] {
                    let seed = (n * 100 + k) as u64;
                    let picks = |f: &dyn Fn(&mut Rng) -> Vec<usize>| {
                        f(&mut stream(seed, Purpose::Selection, 0, 0))
                    };
                    assert_eq!(
                        picks(&|rng| greedy(&tiled, k, sub, rng)),
                        picks(&|rng| facility_location(&rows, k, sub, rng)),
                        "n {n} k {k} {sub:?}"
                    );
                }
            }
        }
    }

    /// A query whose gradients change at every call, as a client's do when the model moves.
    fn moving(params: usize) -> testing::Vectors<impl FnMut(u64, usize) -> Vec<f32>> {
        testing::Vectors::new(move |call, k| {
            let mut r = stream(call, Purpose::Strategy, 0, k as u64);
            (0..params).map(|_| r.random_range(-1.0f32..1.0)).collect()
        })
    }

    /// Clustered gradients as DivFL's clients send them: `clusters` centres, each client
    /// one centre plus noise a tenth its size.
    fn clustered(n: usize, params: usize, clusters: usize, rng: &mut Rng) -> Vec<Vec<f32>> {
        let centres = random_gradients(clusters, params, rng);
        (0..n)
            .map(|k| {
                centres[k % clusters]
                    .iter()
                    .map(|&c| c + 0.1 * rng.random_range(-1.0f32..1.0))
                    .collect()
            })
            .collect()
    }

    /// Σ_i min_{j∈S} D_ij.
    fn coverage_cost(dist: &[Vec<f64>], picks: &[usize]) -> f64 {
        dist.iter()
            .map(|row| picks.iter().map(|&j| row[j]).fold(f64::INFINITY, f64::min))
            .sum()
    }

    /// `auto` is exact up to 1,000 available clients (the picks of `exact`, bit for bit)
    /// and sketched above, where its picks cover the clients within 2 % of the exact
    /// greedy's cost (measured on the exact distances), one pick per cluster as the exact
    /// greedy's; a stale refresh refuses `sketch`, naming the key.
    #[test]
    fn sketched_distances_cover_as_the_exact_ones() {
        let mut rng = stream(5, Purpose::Strategy, 0, 0);
        let (params, clusters, k) = (1500, 12, 12);
        let pick = |distances: DivflDistances, g: &[Vec<f32>]| {
            let n = g.len();
            let cfg = DivflConfig {
                distances,
                ..DivflConfig::default()
            };
            let mut s = DivFl::new(cfg);
            s.setup(&testing::setup(&vec![1.0 / n as f64; n]));
            let available: Vec<usize> = (0..n).collect();
            let ctx = RoundContext {
                round: 0,
                available: &available,
                budget: k,
                clock_s: None,
            };
            let mut q = testing::Vectors::new(|_, k| g[k].clone());
            s.select(&ctx, &mut q, &mut stream(1, Purpose::Selection, 0, 0))
                .unwrap()
                .clients
        };
        let g = clustered(1000, params, clusters, &mut rng);
        assert_eq!(
            pick(DivflDistances::Auto, &g),
            pick(DivflDistances::Exact, &g)
        );
        let g = clustered(1100, params, clusters, &mut rng);
        let refs: Vec<&[f32]> = g.iter().map(Vec::as_slice).collect();
        let dist = gradient_distances(&refs);
        let exact = pick(DivflDistances::Exact, &g);
        let sketched = pick(DivflDistances::Auto, &g);
        let (ce, cs) = (
            coverage_cost(&dist, &exact),
            coverage_cost(&dist, &sketched),
        );
        assert!(cs <= 1.02 * ce, "sketched cost {cs} against exact {ce}");
        let covered = |picks: &[usize]| {
            let mut c: Vec<usize> = picks.iter().map(|&j| j % clusters).collect();
            c.sort_unstable();
            c.dedup();
            c.len()
        };
        assert_eq!(covered(&exact), clusters);
        assert_eq!(covered(&sketched), clusters);
        let refused = DivflConfig {
            refresh: DivflRefresh::Stale,
            distances: DivflDistances::Sketch,
            ..DivflConfig::default()
        }
        .validate()
        .unwrap_err();
        assert!(refused.to_string().contains("selection.divfl.distances"));
    }

    /// The stale refresh's kept matrix, updated K rows a round, picks what recomputing
    /// every distance among the available clients picks, round after round, as
    /// availability changes and after a save and load.
    #[test]
    fn stale_rows_pick_as_a_full_recomputation() {
        for stochastic in [false, true] {
            let n = 30;
            let cfg = DivflConfig {
                refresh: DivflRefresh::Stale,
                stochastic,
                fraction: 0.3,
                ..DivflConfig::default()
            };
            let mut s = DivFl::new(cfg.clone());
            s.setup(&testing::setup(&vec![1.0 / n as f64; n]));
            let mut q = moving(21);
            // The reference: the same gradients, every distance recomputed each round.
            let mut mirror = moving(21);
            let mut kept: Vec<Vec<f32>> = vec![Vec::new(); n];
            for round in 0..12 {
                if round == 6 {
                    let saved = s.save();
                    s = DivFl::new(cfg.clone());
                    s.setup(&testing::setup(&vec![1.0 / n as f64; n]));
                    s.load(&saved).unwrap();
                }
                let mut avail_rng = stream(round as u64, Purpose::Availability, 0, 0);
                let available: Vec<usize> = (0..n).filter(|_| avail_rng.random_bool(0.7)).collect();
                let ctx = RoundContext {
                    round,
                    available: &available,
                    budget: 4,
                    clock_s: None,
                };
                let got = s
                    .select(
                        &ctx,
                        &mut q,
                        &mut stream(round as u64, Purpose::Selection, 0, 0),
                    )
                    .unwrap()
                    .clients;
                let missing: Vec<usize> = available
                    .iter()
                    .copied()
                    .filter(|&k| kept[k].is_empty())
                    .collect();
                if !missing.is_empty() {
                    for (&k, v) in missing
                        .iter()
                        .zip(mirror.gradients(&missing, GradientScope::Full).unwrap())
                    {
                        kept[k] = v;
                    }
                }
                let g: Vec<&[f32]> = available.iter().map(|&k| kept[k].as_slice()).collect();
                let sub =
                    stochastic.then(|| ((0.3 * available.len() as f64).floor() as usize).max(4));
                let mut want: Vec<usize> = one_sum_per_candidate(
                    &gradient_distances(&g),
                    4,
                    sub,
                    &mut stream(round as u64, Purpose::Selection, 0, 0),
                )
                .into_iter()
                .map(|i| available[i])
                .collect();
                want.sort_unstable();
                for (&k, v) in want
                    .iter()
                    .zip(mirror.gradients(&want, GradientScope::Full).unwrap())
                {
                    kept[k] = v;
                }
                assert_eq!(got, want, "round {round}, stochastic {stochastic}");
            }
        }
    }

    /// Changed rows, computed together, equal the full matrix's rows bit for bit, with
    /// clients that have no gradient yet left out.
    #[test]
    fn one_row_equals_the_full_matrix_row() {
        let mut rng = stream(8, Purpose::Strategy, 0, 0);
        for params in [1, 7, 8, 9, 130] {
            let mut g = random_gradients(19, params, &mut rng);
            g[5].clear();
            let known: Vec<usize> = (0..19).filter(|&k| k != 5).collect();
            let refs: Vec<&[f32]> = g.iter().map(Vec::as_slice).collect();
            let sq: Vec<f64> = g.iter().map(|v| distances::squared_norm(v)).collect();
            let kg: Vec<&[f32]> = known.iter().map(|&k| g[k].as_slice()).collect();
            let full = gradient_distances(&kg);
            let rows = distances::distances_from(&refs, &sq, &known);
            for (a, (&i, row)) in known.iter().zip(&rows).enumerate() {
                for (b, &j) in known.iter().enumerate() {
                    assert_eq!(
                        row[j].to_bits(),
                        full[a][b].to_bits(),
                        "params {params}: {i} {j}"
                    );
                }
            }
        }
    }

    #[test]
    fn client_gradients_cover_the_configured_examples() {
        use crate::config::Config;
        use crate::select::testing::{Recording, setup};
        for (overrides, refresh, scope) in [
            (vec![], "ideal", "full_gradients"),
            (
                vec!["selection.divfl.refresh=\"stale\""],
                "stale",
                "full_gradients",
            ),
            (
                vec!["selection.divfl.gradient=\"minibatch\""],
                "ideal",
                "minibatch_gradients",
            ),
        ] {
            let overrides: Vec<String> = overrides.into_iter().map(String::from).collect();
            let cfg = Config::from_toml_str("", "d", &overrides).unwrap();
            let mut s = DivFl::new(cfg.selection.divfl);
            s.setup(&setup(&[0.25; 4]));
            let mut q = Recording::new(vec![0.1, 0.2, 0.3, 0.4], vec![]);
            let mut rng = stream(1, Purpose::Selection, 0, 0);
            let ctx = RoundContext {
                round: 0,
                available: &[0, 1, 2, 3],
                budget: 2,
                clock_s: None,
            };
            s.select(&ctx, &mut q, &mut rng).unwrap();
            assert!(!q.calls.is_empty());
            assert!(
                q.calls.iter().all(|c| c.0 == scope),
                "{refresh}: {:?}",
                q.calls
            );
        }
    }

    #[test]
    fn gradient_distances_are_euclidean() {
        let a = [0.0f32, 3.0];
        let b = [4.0f32, 0.0];
        let d = gradient_distances(&[&a, &b, &a]);
        assert!((d[0][1] - 5.0).abs() < 1e-9 && (d[1][0] - 5.0).abs() < 1e-9 && d[0][2] == 0.0);
    }
}

//! Clustered Sampling (Fraboni et al., ICML 2021), Algorithms 1 and 2.
//!
//! Both build m "buckets", distributions over clients in which client i carries
//! total mass m·p_i across buckets and every bucket carries mass 1; each round
//! draws one client per bucket (with replacement across buckets), so every
//! client is selected m·p_i times per round in expectation while similar
//! clients compete inside a bucket. Masses are kept as exact integers: client
//! i holds m·n_i units and a bucket holds Σn units (decisions.md).
//!
//! - Alg. 1 fills buckets in order of decreasing size, once.
//! - Alg. 2 re-clusters every round: representative updates (the latest full
//!   update of each client, zero until first seen), arccos of their cosine
//!   (0 when either is zero), Ward on the rows of that matrix, a cut into
//!   maximal subtrees of weight ≤ 1/m; the m heaviest clusters seed the
//!   buckets and the rest are poured in, smallest cluster first, each cluster's
//!   members in a random order (Fraboni's code shuffles them, algorithms.md §7.2).
//!
//! Cost at N clients, P parameters: Alg. 1 is O(N log N) a round (the draws); Alg. 2
//! keeps the N × N arccos distances up to date in O(K N P) a round, and Ward on their N
//! rows (points of N coordinates) is O(N³) for the rows' distances alone, with two N × N
//! matrices held.
//!
//! Under partial availability a bucket draws among its available members; a
//! bucket with none is skipped (the paper assumes full availability).

use rand::Rng as _;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

use super::divfl::dots_with_all;
use super::{
    ClientQuery, Feedback, Needs, RoundContext, Selection, Selector, Setup, UpdateKind, ward,
};
use crate::error::Error;
use crate::rng::Rng;

/// Which of the two algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// Algorithm 1: by sample size.
    Sizes,
    /// Algorithm 2: by update similarity.
    Similarity,
}

/// Buckets: for each, the (client, units) it holds; every bucket sums to `capacity`.
pub type Buckets = Vec<Vec<(usize, u128)>>;

/// Pours `(client, units)` into `buckets` (each of capacity `capacity`) from `fill`,
/// topping up each bucket before moving on.
fn pour(
    items: impl IntoIterator<Item = (usize, u128)>,
    buckets: &mut Buckets,
    fill: &mut [u128],
    capacity: u128,
) {
    let mut b = 0;
    for (i, mut amount) in items {
        while amount > 0 {
            while fill[b] == capacity {
                b += 1;
            }
            let put = amount.min(capacity - fill[b]);
            buckets[b].push((i, put));
            fill[b] += put;
            amount -= put;
        }
    }
}

/// Algorithm 1: clients by decreasing size (ties by id), m·n_i units each, into m
/// buckets of Σn units.
pub fn sizes_buckets(sizes: &[usize], m: usize) -> Buckets {
    let capacity: u128 = sizes.iter().map(|&s| s as u128).sum();
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by(|&a, &b| sizes[b].cmp(&sizes[a]).then(a.cmp(&b)));
    let mut buckets = vec![Vec::new(); m];
    let mut fill = vec![0; m];
    pour(
        order.iter().map(|&i| (i, m as u128 * sizes[i] as u128)),
        &mut buckets,
        &mut fill,
        capacity,
    );
    buckets
}

/// Algorithm 2's buckets from clusters (each a list of clients): the m heaviest seed one
/// bucket each (bucket 0 the lightest of them), and the others are poured from bucket 0 on,
/// lightest cluster first, each cluster's members shuffled with `rng` as in Fraboni's
/// `get_clusters_with_alg2`. Which member tops up a bucket decides which bucket it shares
/// with a seed cluster, so a fixed order would always put the same ids together.
pub fn cluster_buckets(
    clusters: &[Vec<usize>],
    sizes: &[usize],
    m: usize,
    rng: &mut Rng,
) -> Buckets {
    let capacity: u128 = sizes.iter().map(|&s| s as u128).sum();
    let units = |i: usize| m as u128 * sizes[i] as u128;
    let weight = |c: &Vec<usize>| c.iter().map(|&i| units(i)).sum::<u128>();
    let mut order: Vec<&Vec<usize>> = clusters.iter().collect();
    order.sort_by(|a, b| weight(a).cmp(&weight(b)).then(a[0].cmp(&b[0])));
    let split = order.len().saturating_sub(m);
    let (rest, seeds) = order.split_at(split);
    let mut buckets = vec![Vec::new(); m];
    let mut fill = vec![0; m];
    let mut spill = Vec::new();
    for (b, c) in seeds.iter().enumerate() {
        for &i in c.iter() {
            let put = units(i).min(capacity - fill[b]);
            if put > 0 {
                buckets[b].push((i, put));
                fill[b] += put;
            }
            if units(i) > put {
                spill.push((i, units(i) - put));
            }
        }
    }
    let mut remaining = spill;
    for c in rest {
        let mut members = c.to_vec();
        members.shuffle(rng);
        remaining.extend(members.into_iter().map(|i| (i, units(i))));
    }
    pour(remaining, &mut buckets, &mut fill, capacity);
    buckets
}

/// Algorithm 2's buckets for m draws: the Ward `merges` of the rows of the distance
/// matrix, cut into maximal subtrees of weight ≤ 1/m under the weights p ∝ `sizes`, then
/// [`cluster_buckets`] with `rng`.
pub fn similarity_buckets(
    merges: &[ward::Merge],
    sizes: &[usize],
    m: usize,
    rng: &mut Rng,
) -> Buckets {
    let total: f64 = sizes.iter().sum::<usize>() as f64;
    let p: Vec<f64> = sizes.iter().map(|&s| s as f64 / total).collect();
    let clusters = ward::cut_by_weight(merges, &p, 1.0 / m.max(1) as f64);
    cluster_buckets(&clusters, sizes, m, rng)
}

/// One client per bucket, drawn in proportion to its units among the bucket's
/// available members (`available` sorted); a bucket with none is skipped.
pub fn draw(buckets: &Buckets, available: &[usize], rng: &mut Rng) -> Vec<usize> {
    let mut clients = Vec::with_capacity(buckets.len());
    for bucket in buckets {
        let open: Vec<(usize, u128)> = bucket
            .iter()
            .copied()
            .filter(|(i, _)| available.binary_search(i).is_ok())
            .collect();
        let total: u128 = open.iter().map(|x| x.1).sum();
        if total == 0 {
            continue;
        }
        let mut u = rng.random_range(0..total);
        for (i, units) in open {
            if u < units {
                clients.push(i);
                break;
            }
            u -= units;
        }
    }
    clients
}

/// Arccos of the cosine between two updates; 0 when either is zero.
fn arccos_distance(a: &[f32], b: &[f32], na: f64, nb: f64) -> f64 {
    if na == 0.0 || nb == 0.0 {
        return 0.0;
    }
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    (dot / (na * nb)).clamp(-1.0, 1.0).acos()
}

/// Rows `ks` of the arccos distances, each [`arccos_distance`] bit for bit (0 on the
/// diagonal): the reporting clients' dot products with every client in one pass over the
/// updates ([`dots_with_all`], the same sequential sums), where a row at a time read all
/// of them once per reporter (0.3 s a round of 10 reports at 10,000 clients).
fn arccos_rows(updates: &[Vec<f32>], norms: &[f64], ks: &[usize]) -> Vec<Vec<f64>> {
    let all: Vec<&[f32]> = updates.iter().map(Vec::as_slice).collect();
    ks.iter()
        .zip(dots_with_all(&all, ks))
        .map(|(&k, dots)| {
            let x = &updates[k];
            (0..updates.len())
                .map(|j| {
                    if j == k || norms[k] == 0.0 || norms[j] == 0.0 {
                        0.0
                    } else if updates[j].len() != x.len() {
                        arccos_distance(x, &updates[j], norms[k], norms[j])
                    } else {
                        (dots[j] / (norms[k] * norms[j])).clamp(-1.0, 1.0).acos()
                    }
                })
                .collect()
        })
        .collect()
}

/// The Clustered Sampling selector.
#[derive(Debug, Clone)]
pub struct ClusteredSampling {
    variant: Variant,
    /// How Ward's point distances are obtained (Alg. 2, `selection.ward_distances`).
    ward: ward::WardDistances,
    sizes: Vec<usize>,
    per_round: usize,
    buckets: Buckets,
    state: State,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct State {
    /// Latest full update per client (Alg. 2), empty until first seen.
    updates: Vec<Vec<f32>>,
    /// Their Euclidean norms.
    norms: Vec<f64>,
    /// Pairwise arccos distances, kept up to date as updates arrive.
    distance: Vec<Vec<f64>>,
    /// Ward's kept point distances (`selection.ward_distances = "incremental"` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ward: Option<ward::KeptDistances>,
}

impl ClusteredSampling {
    /// A selector running the given algorithm.
    pub fn new(variant: Variant) -> Self {
        Self {
            variant,
            ward: ward::WardDistances::Auto,
            sizes: Vec::new(),
            per_round: 0,
            buckets: Vec::new(),
            state: State::default(),
        }
    }

    /// The same selector with Ward's point distances obtained as `ward` says (Alg. 2).
    pub fn with_ward_distances(mut self, ward: ward::WardDistances) -> Self {
        self.ward = ward;
        self
    }

    /// The buckets of the latest selection.
    pub fn buckets(&self) -> &Buckets {
        &self.buckets
    }
}

impl Selector for ClusteredSampling {
    fn name(&self) -> &'static str {
        match self.variant {
            Variant::Sizes => "cs1",
            Variant::Similarity => "cs2",
        }
    }

    fn needs(&self) -> Needs {
        Needs {
            updates: match self.variant {
                Variant::Sizes => UpdateKind::None,
                Variant::Similarity => UpdateKind::Full,
            },
            ..Needs::default()
        }
    }

    fn setup(&mut self, setup: &Setup) {
        let n = setup.sizes.len();
        self.sizes = setup.sizes.clone();
        self.per_round = setup.per_round;
        // Only Alg. 2 keeps updates and their N × N distances (80 GB at 100,000 clients).
        self.state = match self.variant {
            Variant::Sizes => {
                self.buckets = sizes_buckets(&self.sizes, setup.per_round);
                State::default()
            }
            Variant::Similarity => State {
                updates: vec![Vec::new(); n],
                norms: vec![0.0; n],
                distance: vec![vec![0.0; n]; n],
                ward: self.ward.kept(n),
            },
        };
    }

    fn select(
        &mut self,
        ctx: &RoundContext<'_>,
        _: &mut dyn ClientQuery,
        rng: &mut Rng,
    ) -> Result<Selection, Error> {
        let m = ctx.budget;
        if self.variant == Variant::Similarity || self.buckets.len() != m {
            self.buckets = match self.variant {
                Variant::Sizes => sizes_buckets(&self.sizes, m),
                Variant::Similarity => {
                    let merges = match &mut self.state.ward {
                        Some(kept) => kept.linkage(&self.state.distance),
                        None => ward::linkage(&self.state.distance),
                    };
                    similarity_buckets(&merges, &self.sizes, m, rng)
                }
            };
        }
        Ok(Selection {
            clients: draw(&self.buckets, ctx.available, rng),
            weights: None,
        })
    }

    fn observe(&mut self, feedback: &Feedback<'_>) {
        let (Variant::Similarity, Some(updates)) = (self.variant, feedback.updates) else {
            return;
        };
        for (&k, u) in feedback.selected.iter().zip(updates) {
            self.state.updates[k] = u.clone();
            self.state.norms[k] = u.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        }
        let norms = &self.state.norms;
        let mut fresh: Vec<usize> = feedback.selected.to_vec();
        fresh.sort_unstable();
        fresh.dedup();
        if let Some(kept) = &mut self.state.ward {
            kept.mark_changed_symmetric(&fresh);
        }
        for (&k, row) in fresh
            .iter()
            .zip(arccos_rows(&self.state.updates, norms, &fresh))
        {
            for (j, &d) in row.iter().enumerate() {
                self.state.distance[k][j] = d;
                self.state.distance[j][k] = d;
            }
        }
    }

    fn save(&self) -> serde_json::Value {
        super::save_state(&self.state)
    }

    fn load(&mut self, state: &serde_json::Value) -> Result<(), Error> {
        let loaded: State = super::load_state(self.name(), state)?;
        if self.variant == Variant::Sizes {
            // Alg. 1 learns nothing: a checkpoint's per-client placeholders (earlier versions
            // wrote them) are left unread.
            return Ok(());
        }
        let n = self.sizes.len();
        let name = self.name();
        super::check_loaded(name, "updates", loaded.updates.len(), n)?;
        super::check_loaded(name, "norms", loaded.norms.len(), n)?;
        super::check_loaded(name, "distance rows", loaded.distance.len(), n)?;
        for row in &loaded.distance {
            super::check_loaded(name, "distances in a row", row.len(), n)?;
        }
        self.state = loaded;
        // Kept sums from the checkpoint, where this run keeps them (an exact run's
        // checkpoint has none: the first linkage then recomputes them).
        let saved = self.state.ward.take();
        self.state.ward = self
            .ward
            .kept(self.sizes.len())
            .map(|fresh| saved.unwrap_or(fresh));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Purpose, stream};

    fn check_masses(b: &Buckets, sizes: &[usize], m: usize) {
        let cap: u128 = sizes.iter().map(|&s| s as u128).sum();
        assert_eq!(b.len(), m);
        for bucket in b {
            assert_eq!(
                bucket.iter().map(|x| x.1).sum::<u128>(),
                cap,
                "a bucket carries mass 1"
            );
        }
        for (i, &s) in sizes.iter().enumerate() {
            let got: u128 = b.iter().flatten().filter(|x| x.0 == i).map(|x| x.1).sum();
            assert_eq!(got, m as u128 * s as u128, "client {i} carries m·p_i");
        }
    }

    /// Alg. 1 keeps no per-client state (Alg. 2's N × N distances would be 80 GB at
    /// 100,000 clients), and still reads a checkpoint that holds it.
    #[test]
    fn algorithm_1_keeps_no_per_client_state() {
        use crate::select::testing::setup;
        let mut s = ClusteredSampling::new(Variant::Sizes);
        s.setup(&setup(&[0.25; 4]));
        assert!(s.state.updates.is_empty() && s.state.distance.is_empty());
        let mut alg2 = ClusteredSampling::new(Variant::Similarity);
        alg2.setup(&setup(&[0.25; 4]));
        assert_eq!(alg2.state.distance.len(), 4);
        s.load(&alg2.save()).unwrap();
        assert!(s.state.distance.is_empty());
    }

    #[test]
    fn algorithm_1_buckets_carry_exactly_m_p() {
        let sizes = [7, 300, 31, 31, 129, 2, 500];
        for m in [1, 2, 3, 5] {
            check_masses(&sizes_buckets(&sizes, m), &sizes, m);
        }
        // Hand case: sizes (3, 1), m = 2, Σn = 4: client 0 holds 6 units, so bucket 0 is
        // all client 0 and bucket 1 is 2 units of client 0 and 2 of client 1.
        let b = sizes_buckets(&[3, 1], 2);
        assert_eq!(b, vec![vec![(0, 4)], vec![(0, 2), (1, 2)]]);
    }

    #[test]
    fn algorithm_2_buckets_carry_exactly_m_p() {
        let mut rng = stream(1, Purpose::Selection, 0, 0);
        let sizes = [10, 20, 30, 40, 50, 60];
        let clusters = vec![vec![0, 5], vec![1, 4], vec![2], vec![3]];
        check_masses(&cluster_buckets(&clusters, &sizes, 3, &mut rng), &sizes, 3);
        let one_each: Vec<Vec<usize>> = (0..6).map(|i| vec![i]).collect();
        check_masses(&cluster_buckets(&one_each, &sizes, 4, &mut rng), &sizes, 4);
    }

    #[test]
    fn algorithm_2_pours_each_cluster_in_shuffled_order() {
        // m = 2, Σn = 80 units per bucket, client i holds 2·n_i units: (20, 20, 20, 10, 30,
        // 20, 20, 20). Clusters {0, 1, 2} and {5, 6, 7} (60 each) seed buckets 0 and 1;
        // {3, 4} (40) is poured into the 20 units left in each. Whichever of 3 and 4 comes
        // first tops up bucket 0: 3 first gives bucket 0 = 3 (10) + 4 (10), bucket 1 = 4
        // (20); 4 first gives bucket 0 = 4 (20), bucket 1 = 4 (10) + 3 (10).
        let sizes = [10, 10, 10, 5, 15, 10, 10, 10];
        let clusters = vec![vec![0, 1, 2], vec![3, 4], vec![5, 6, 7]];
        let mut first = [0; 2];
        for seed in 0..40 {
            let mut rng = stream(seed, Purpose::Selection, 0, 0);
            let b = cluster_buckets(&clusters, &sizes, 2, &mut rng);
            check_masses(&b, &sizes, 2);
            let seeds = |k: usize| b[k].iter().filter(|x| x.0 != 3 && x.0 != 4).count();
            assert_eq!((seeds(0), seeds(1)), (3, 3));
            match b[0][3] {
                (3, 10) => {
                    assert_eq!(&b[0][4..], &[(4, 10)]);
                    assert_eq!(&b[1][3..], &[(4, 20)]);
                    first[0] += 1;
                }
                (4, 20) => {
                    assert_eq!(b[0].len(), 4);
                    assert_eq!(&b[1][3..], &[(4, 10), (3, 10)]);
                    first[1] += 1;
                }
                other => panic!("bucket 0 topped up with {other:?}"),
            }
        }
        // Each order has probability 1/2: 40 seeds see both.
        assert!(first[0] > 0 && first[1] > 0, "{first:?}");
    }

    /// Alg. 2 with Ward's distances kept (`ward_distances = "incremental"`) picks as the
    /// exact recomputation does over 40 rounds of 60 clients, and a run saved and loaded at
    /// round 20 continues as the uninterrupted one, its kept distances included.
    #[test]
    fn kept_ward_distances_pick_as_exact_ones_and_resume() {
        use crate::select::testing::{FixedLosses, setup};
        use rand::Rng as _;
        let n = 60;
        let make = |ward: ward::WardDistances| {
            let mut s = ClusteredSampling::new(Variant::Similarity).with_ward_distances(ward);
            s.setup(&Setup {
                per_round: 6,
                ..setup(&vec![1.0 / n as f64; n])
            });
            s
        };
        let (mut exact, mut kept) = (
            make(ward::WardDistances::Exact),
            make(ward::WardDistances::Incremental),
        );
        let mut resumed = None;
        let all: Vec<usize> = (0..n).collect();
        let mut data = stream(4, Purpose::Strategy, 0, 0);
        for round in 0..40 {
            let ctx = RoundContext {
                round,
                available: &all,
                budget: 6,
                clock_s: None,
            };
            let mut q = FixedLosses(vec![0.0; n]);
            let pick = |s: &mut ClusteredSampling, q: &mut FixedLosses| {
                let mut rng = stream(4, Purpose::Selection, round as u64, 0);
                s.select(&ctx, q, &mut rng).unwrap().clients
            };
            let want = pick(&mut exact, &mut q);
            assert_eq!(pick(&mut kept, &mut q), want, "round {round}");
            if let Some(r) = resumed.as_mut() {
                assert_eq!(pick(r, &mut q), want, "round {round}, resumed");
            }
            let updates: Vec<Vec<f32>> = want
                .iter()
                .map(|_| (0..20).map(|_| data.random_range(-1.0..1.0)).collect())
                .collect();
            let feedback = Feedback {
                round,
                selected: &want,
                train_losses: &vec![0.0; want.len()],
                updates: Some(&updates),
                durations: None,
                dropped: None,
            };
            for s in [&mut exact, &mut kept].into_iter().chain(resumed.as_mut()) {
                s.observe(&feedback);
            }
            if round == 20 {
                let mut r = make(ward::WardDistances::Incremental);
                r.load(&kept.save()).unwrap();
                resumed = Some(r);
            }
        }
        assert!(
            kept.state
                .ward
                .as_ref()
                .is_some_and(|k| !k.sums().is_empty())
        );
        assert_eq!(resumed.unwrap().save(), kept.save());
        assert!(
            exact.save().get("ward").is_none(),
            "exact runs keep no distances"
        );
    }

    /// Rows of [`arccos_rows`] are [`arccos_distance`] bit for bit, with clients not yet
    /// seen (empty updates), an all-zero update, opposite and equal updates, and a row
    /// length that is no multiple of the lanes.
    #[test]
    fn arccos_rows_are_the_pairwise_distances_bit_for_bit() {
        use rand::Rng as _;
        let mut rng = stream(6, Purpose::Strategy, 0, 0);
        let mut updates: Vec<Vec<f32>> = (0..21)
            .map(|_| (0..37).map(|_| rng.random_range(-1.0..1.0)).collect())
            .collect();
        updates[3] = Vec::new();
        updates[5] = vec![0.0; 37];
        updates[7] = updates[2].iter().map(|x| -x).collect();
        updates[8] = updates[2].clone();
        let norms: Vec<f64> = updates
            .iter()
            .map(|u| u.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt())
            .collect();
        let all: Vec<usize> = (0..updates.len()).collect();
        for ks in [&all[..], &all[2..9], &[4, 11, 20]] {
            let rows = arccos_rows(&updates, &norms, ks);
            for (&k, row) in ks.iter().zip(&rows) {
                for (j, d) in row.iter().enumerate() {
                    let want = if j == k {
                        0.0
                    } else {
                        arccos_distance(&updates[k], &updates[j], norms[k], norms[j])
                    };
                    assert_eq!(d.to_bits(), want.to_bits(), "{k} {j}");
                }
            }
        }
    }
}

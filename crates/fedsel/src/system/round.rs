//! The round policies: which of a round's trainings the server waits for (wait for all,
//! over-commitment, a deadline), FedBuff's buffered asynchronous rounds, and the rules for
//! stale updates (when a late update is folded or expires, and what it then weighs). Each
//! is a pure function of finish times, arrivals and versions; the book of what is in
//! flight between rounds is [`super::inflight`], the clock arithmetic [`super::clock`].
//! Nothing here sees a model's meaning: a stale update's weight reads only its numbers.

use crate::system::StaleConfig;

/// A round on the clock.
#[derive(Debug, Clone, PartialEq)]
pub struct RoundTiming {
    /// Per selection entry, whether its update is aggregated.
    pub kept: Vec<bool>,
    /// Virtual seconds from the round's start (its query phase, then the training
    /// broadcast) until the server closes it.
    pub round_s: f64,
    /// Per selection entry, virtual seconds from the broadcast until its update arrives:
    /// what a server measures, and Oort's system utility reads.
    pub finish: Vec<f64>,
}

/// The last finish time among the kept entries; when none is kept, the last finish time
/// of all the entries (the server's wait for updates that never come, module doc), so
/// that a round with a selection always takes time. 0 for an empty selection.
fn last_kept(finish: &[f64], kept: &[bool]) -> f64 {
    let last = |keep: &dyn Fn(bool) -> bool| {
        finish
            .iter()
            .zip(kept)
            .filter(|(_, k)| keep(**k))
            .map(|(f, _)| *f)
            .fold(0.0, f64::max)
    };
    if kept.iter().any(|&k| k) {
        last(&|k| k)
    } else {
        last(&|_| true)
    }
}

/// Waits for every update that `arrives`: the round lasts until the slowest of them.
pub fn wait_all(finish: &[f64], arrives: &[bool]) -> RoundTiming {
    let kept = arrives.to_vec();
    RoundTiming {
        round_s: last_kept(finish, &kept),
        kept,
        finish: finish.to_vec(),
    }
}

/// Keeps the `k` entries that finish first among those that `arrive` (ties to the earlier
/// entry) and closes the round when the last of them arrives; with `k` or fewer arriving
/// entries, waits for all of them.
pub fn overcommit(finish: &[f64], arrives: &[bool], k: usize) -> RoundTiming {
    let mut order: Vec<usize> = (0..finish.len()).filter(|&i| arrives[i]).collect();
    // A stable sort keeps entry order among equal times.
    order.sort_by(|&a, &b| finish[a].total_cmp(&finish[b]));
    let mut kept = vec![false; finish.len()];
    for &i in order.iter().take(k) {
        kept[i] = true;
    }
    RoundTiming {
        round_s: last_kept(finish, &kept),
        kept,
        finish: finish.to_vec(),
    }
}

/// Keeps the updates that arrive by `deadline_s`. The server cannot know that a missing
/// update will not come, so a round that misses one (late or lost) lasts the whole
/// deadline; a round where every update arrives closes with the last of them.
pub fn deadline(finish: &[f64], arrives: &[bool], deadline_s: f64) -> RoundTiming {
    let kept: Vec<bool> = finish
        .iter()
        .zip(arrives)
        .map(|(&f, &a)| a && f <= deadline_s)
        .collect();
    let round_s = if kept.iter().all(|&k| k) {
        last_kept(finish, &kept)
    } else {
        deadline_s
    };
    RoundTiming {
        kept,
        round_s,
        finish: finish.to_vec(),
    }
}

/// What becomes of the late updates waiting at round `t`, which closes at virtual second
/// `close_s` and aggregates a fresh update or not (`fresh`), under REFL's rule
/// (ahmedcs/REFL @ aa7e642, `core/aggregator.py`, `get_stale_updates`, lines 980-1016):
/// each `(origin round, arrival second)` of `pending` is folded, with staleness
/// τ = t − origin, when it has arrived by `close_s` and τ − 1 ≤ `stale_update` (REFL's
/// counter `stale_rounds` is τ − 1 then, line 989; negative: no limit); it expires once
/// τ − 1 > `stale_update`; otherwise it waits. Two departures, said in docs/experiments.md:
/// REFL's update may first be folded two rounds after its own (its counter must be > 0,
/// line 988, and it is 0 in the round after), here in the first later round that closes
/// after it arrives; REFL folds nothing in a round without a fresh update (line 734), and
/// here such a round folds nothing either, while the update ages.
///
/// Returns the folded `(index, τ)` and the expired indices, in `pending` order.
pub fn stale_due(
    pending: &[(usize, f64)],
    t: usize,
    close_s: f64,
    fresh: bool,
    stale_update: i64,
) -> (Vec<(usize, usize)>, Vec<usize>) {
    let mut folded = Vec::new();
    let mut expired = Vec::new();
    for (i, &(origin, arrival_s)) in pending.iter().enumerate() {
        let tau = t - origin;
        if stale_update >= 0 && (tau as i64 - 1) > stale_update {
            expired.push(i);
        } else if fresh && arrival_s <= close_s {
            folded.push((i, tau));
        }
    }
    (folded, expired)
}

/// REFL's staleness factors for the updates folded in a round with staleness `tau` (each
/// τ = rounds since the update's own, REFL's `update_stale_rounds[c] + 1`), as
/// `update_importance` has them (ahmedcs/REFL @ aa7e642, `core/aggregator.py` lines
/// 1197-1222), by `stale_factor` code: > 1 divides by it (1201), 1 keeps 1 (1204), −1
/// divides by the mean τ of the round's stale updates (1209), −2 divides by τ (AdaSGD,
/// 1213), −3 multiplies by e^(−τ) (DynSGD, 1217), −4 REFL's
/// (1 − β)/τ + β (1 − e^(−r/max r)/`scale_coff`) (1221-1222), with `ratio` the updates'
/// r ([`refl_ratio`]) and max r over the round's. Each factor multiplies the update's
/// aggregation weight of 1 (REFL's importance, line 746) before the weights are
/// normalised (lines 1162-1175).
pub fn stale_factors(cfg: &StaleConfig, tau: &[usize], ratio: &[f64]) -> Vec<f64> {
    let f = cfg.stale_factor;
    let mean_tau = tau.iter().map(|&t| t as f64).sum::<f64>() / tau.len().max(1) as f64;
    let max_ratio = ratio.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    tau.iter()
        .enumerate()
        .map(|(i, &t)| {
            let t = t as f64;
            if f > 1.0 {
                1.0 / f
            } else if f == 1.0 {
                1.0
            } else if f == -1.0 {
                1.0 / mean_tau
            } else if f == -2.0 {
                1.0 / t
            } else if f == -3.0 {
                (-t).exp()
            } else {
                let beta = cfg.stale_beta;
                (1.0 - beta) / t + beta * (1.0 - (-ratio[i] / max_ratio).exp() / cfg.scale_coff)
            }
        })
        .collect()
}

/// REFL's r for a stale model `stale` beside the round's `n` fresh models summed in
/// `fresh_sum` (ahmedcs/REFL @ aa7e642, `core/aggregator.py` lines 1185-1193):
/// ‖u/(n+1) + p/(n+1) − p/n‖² / ‖p/n‖², p the sum and u the stale model: how far the
/// stale model moves the fresh models' mean, relative to the mean.
pub fn refl_ratio(fresh_sum: &[f64], n: usize, stale: &[f32]) -> f64 {
    let n = n as f64;
    let (mut v1, mut v2) = (0.0, 0.0);
    for (&p, &u) in fresh_sum.iter().zip(stale) {
        let d = u as f64 / (n + 1.0) + p / (n + 1.0) - p / n;
        v1 += d * d;
        v2 += (p / n) * (p / n);
    }
    (v1 / v2).abs()
}

/// The weights of a round that folds late updates: `w` holds the run's rule's weights of
/// the round's fresh updates (its first `fresh`) and of the folded ones after them; each
/// folded one's is multiplied by its staleness factor, and with `normalise` (the mean and
/// data-size rules) all are divided by their sum, as REFL's `normalize_importance` divides
/// the importances by theirs (ahmedcs/REFL @ aa7e642, `core/aggregator.py` lines
/// 1162-1175).
pub fn fold_weights(w: &mut [f64], fresh: usize, factors: &[f64], normalise: bool) {
    for (x, f) in w[fresh..].iter_mut().zip(factors) {
        *x *= f;
    }
    if normalise {
        let total: f64 = w.iter().sum();
        for x in w.iter_mut() {
            *x /= total;
        }
    }
}

/// FedBuff's staleness weight s(τ) = 1/√(1 + τ) (Nguyen et al., AISTATS'22, §5, the
/// polynomial staleness of their experiments).
pub fn fedbuff_weight(staleness: usize) -> f64 {
    1.0 / (1.0 + staleness as f64).sqrt()
}

/// Clients a FedBuff round selects: the slots free at its start (`concurrency` minus those
/// in flight) and one for each of the first K − 1 arrivals, whose slots it refills before
/// the buffer is full; all of them pull the same model, this round's.
pub fn fedbuff_budget(concurrency: usize, buffer_size: usize, in_flight: usize) -> usize {
    concurrency.saturating_sub(in_flight) + buffer_size.saturating_sub(1)
}

/// A client training under FedBuff.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Flight {
    /// The engine's handle on the update.
    pub id: usize,
    /// The server model version it pulled (the round it started in).
    pub version: usize,
    /// Virtual second it started (pulled the model).
    pub start_s: f64,
    /// Virtual second its update arrives.
    pub arrival_s: f64,
}

/// One FedBuff round (one aggregation) on the clock.
#[derive(Debug, Clone, PartialEq)]
pub struct BufferRound {
    /// The buffer, in arrival order: each update and its staleness, the server versions
    /// since its client pulled.
    pub buffer: Vec<(Flight, usize)>,
    /// Updates that arrived while their client was offline (behave trace): lost.
    pub lost: Vec<Flight>,
    /// Virtual second of the aggregation: the K-th arrival (the last one when fewer than
    /// K could arrive, the round's start when none).
    pub close_s: f64,
}

/// Runs FedBuff (Nguyen et al., AISTATS'22, Alg. 1) on the clock from `now_s` until the
/// server aggregates, at model version `version`: the first `free` entries of `queue`
/// (this round's selection, `(id, seconds of training)`) start at `now_s`; then updates
/// arrive in time order (ties: the earlier started), each buffered if `arrives(id, at)`
/// (its client online) and lost otherwise, and each arrival before the buffer holds
/// `buffer_size` updates starts the next queued entry at that instant, from this same
/// model. Queued entries that no arrival frees a slot for start at the aggregation.
/// `in_flight` keeps the clients still training.
pub fn fedbuff_round(
    in_flight: &mut Vec<Flight>,
    queue: &[(usize, f64)],
    free: usize,
    now_s: f64,
    version: usize,
    buffer_size: usize,
    arrives: impl Fn(usize, f64) -> bool,
) -> BufferRound {
    let mut next = queue.iter();
    let start =
        |at: f64, in_flight: &mut Vec<Flight>, next: &mut std::slice::Iter<(usize, f64)>| {
            if let Some(&(id, d)) = next.next() {
                in_flight.push(Flight {
                    id,
                    version,
                    start_s: at,
                    arrival_s: at + d,
                });
            }
        };
    for _ in 0..free {
        start(now_s, in_flight, &mut next);
    }
    let (mut buffer, mut lost, mut close_s) = (Vec::new(), Vec::new(), now_s);
    while buffer.len() < buffer_size && !in_flight.is_empty() {
        // The earliest arrival; among equal times the first in flight (started earlier).
        let mut i = 0;
        for j in 1..in_flight.len() {
            if in_flight[j].arrival_s < in_flight[i].arrival_s {
                i = j;
            }
        }
        let f = in_flight.remove(i);
        close_s = f.arrival_s;
        if arrives(f.id, f.arrival_s) {
            buffer.push((f, version - f.version));
        } else {
            lost.push(f);
        }
        if buffer.len() < buffer_size {
            start(close_s, in_flight, &mut next);
        }
    }
    for &(id, d) in next {
        in_flight.push(Flight {
            id,
            version,
            start_s: close_s,
            arrival_s: close_s + d,
        });
    }
    BufferRound {
        buffer,
        lost,
        close_s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    /// Late updates under a 4.1 s deadline: the three clients of `three_clients` finish at
    /// 2.3, 4.0 and 4.3 s; client 2 misses round 0's cut and arrives at 4.3 s. Round 1
    /// (4.1 s to 8.2 s) folds it with τ = 1. An update of round 0 arriving at 20 s has
    /// τ − 1 = 2 > stale_update = 1 at round 3 and expires; one of round 1 arriving at 9 s
    /// folds in round 3 (closing at 16 s) with τ = 2, as REFL's counter is then 1 ≤ 1.
    #[test]
    fn late_updates_fold_when_they_arrive_and_expire_after_stale_update_rounds() {
        let pending = [(0, 4.3), (0, 20.0), (1, 9.0)];
        let (folded, expired) = stale_due(&pending, 1, 8.2, true, 1);
        assert_eq!(folded, [(0, 1)]);
        assert!(expired.is_empty());
        // Before its arrival it waits.
        let (folded, expired) = stale_due(&pending[..1], 1, 4.2, true, 1);
        assert!(folded.is_empty() && expired.is_empty());
        // A round without a fresh update folds nothing.
        let (folded, _) = stale_due(&pending, 1, 8.2, false, 1);
        assert!(folded.is_empty());
        let (folded, expired) = stale_due(&pending[1..], 3, 16.0, true, 1);
        assert_eq!(folded, [(1, 2)]);
        assert_eq!(expired, [0]);
        // No limit: nothing expires.
        let (folded, expired) = stale_due(&pending[1..], 3, 16.0, true, -1);
        assert_eq!(folded, [(1, 2)]);
        assert!(expired.is_empty());
    }

    /// REFL's factors for τ = 1 and 2, by hand.
    #[test]
    fn refl_staleness_factors_by_hand() {
        let with = |stale_factor| StaleConfig {
            stale_factor,
            ..StaleConfig::default()
        };
        let tau = [1, 2];
        let r = [0.5, 1.0];
        assert_eq!(stale_factors(&with(2.0), &tau, &r), [0.5, 0.5]);
        assert_eq!(stale_factors(&with(1.0), &tau, &r), [1.0, 1.0]);
        let mean = stale_factors(&with(-1.0), &tau, &r);
        assert!(close(mean[0], 1.0 / 1.5) && close(mean[1], 1.0 / 1.5));
        assert_eq!(stale_factors(&with(-2.0), &tau, &r), [1.0, 0.5]);
        let dyn_sgd = stale_factors(&with(-3.0), &tau, &r);
        assert!(close(dyn_sgd[0], 0.36787944117144233));
        assert!(close(dyn_sgd[1], 0.1353352832366127));
        // −4: (1 − 0.35)/τ + 0.35 (1 − e^(−r/1)/10):
        // τ = 1, r = 0.5: 0.65 + 0.35 · (1 − 0.6065306597/10) = 0.9787714269;
        // τ = 2, r = 1:  0.325 + 0.35 · (1 − 0.3678794412/10) = 0.6621242196.
        let refl = stale_factors(&with(-4.0), &tau, &r);
        assert!((refl[0] - 0.9787714269).abs() < 1e-9, "{}", refl[0]);
        assert!((refl[1] - 0.6621242196).abs() < 1e-9, "{}", refl[1]);
        // r: fresh sum p = (2, 0) of n = 2, stale u = (4, 3):
        // u/3 + p/3 − p/2 = (1, 1), ‖·‖² = 2; ‖p/2‖² = 1.
        assert!(close(refl_ratio(&[2.0, 0.0], 2, &[4.0, 3.0]), 2.0));
    }

    /// Three fresh updates and one folded with τ = 2 under AdaSGD's 1/τ (REFL code −2) and
    /// the mean rule: REFL's importances 1, 1, 1, 1/2 over their sum 3.5 give 2/7 each and
    /// 1/7; the rule's own weights (1/4 each) are only rescaled.
    #[test]
    fn folded_weights_are_refl_importances_normalised() {
        let cfg = StaleConfig {
            stale_factor: -2.0,
            ..StaleConfig::default()
        };
        let f = stale_factors(&cfg, &[2], &[1.0]);
        let mut w = vec![0.25; 4];
        fold_weights(&mut w, 3, &f, true);
        for (got, want) in w.iter().zip([2.0 / 7.0, 2.0 / 7.0, 2.0 / 7.0, 1.0 / 7.0]) {
            assert!(close(*got, want), "{got} ≠ {want}");
        }
        // A selector's weights are kept as given, the folded one's times its factor.
        let mut w = vec![0.5, 0.3, 0.4];
        fold_weights(&mut w, 2, &f, false);
        assert_eq!(w, [0.5, 0.3, 0.2]);
    }

    /// FedBuff with concurrency 2, buffer 2 and three clients A (3 s), B (1 s), C (1.5 s).
    ///
    /// Round 0 (version 0, budget 2 + 1 = 3, queue A, B, C): A and B start at 0; B
    /// arrives at 1 (buffer B⁰) and C starts then (arrives 2.5); C arrives at 2.5: buffer
    /// B⁰ C⁰, aggregation at 2.5; A is in flight.
    /// Round 1 (version 1, budget 1 + 1 = 2, queue B, C): B starts at 2.5 (arrives 3.5);
    /// A arrives at 3 (buffer A¹: pulled version 0) and C starts (arrives 4.5); B arrives
    /// at 3.5: buffer A¹ B⁰, aggregation at 3.5; weights 1/√2 and 1.
    /// Round 2 (version 2, queue A, B): A starts at 3.5 (arrives 6.5); C arrives at 4.5
    /// (C¹), B starts (arrives 5.5); B arrives at 5.5: buffer C¹ B⁰ at 5.5.
    #[test]
    fn fedbuff_three_clients_by_hand() {
        let (a, b, c) = (3.0, 1.0, 1.5);
        let mut flying = Vec::new();
        let all = |_: usize, _: f64| true;
        let ids = |r: &BufferRound| -> Vec<(usize, usize)> {
            r.buffer.iter().map(|(f, s)| (f.id, *s)).collect()
        };
        assert_eq!(fedbuff_budget(2, 2, 0), 3);
        let r0 = fedbuff_round(&mut flying, &[(0, a), (1, b), (2, c)], 2, 0.0, 0, 2, all);
        assert_eq!(ids(&r0), [(1, 0), (2, 0)]);
        assert_eq!(r0.close_s, 2.5);
        assert_eq!(
            flying,
            [Flight {
                id: 0,
                version: 0,
                start_s: 0.0,
                arrival_s: 3.0
            }]
        );
        assert_eq!(fedbuff_budget(2, 2, flying.len()), 2);
        let r1 = fedbuff_round(&mut flying, &[(1, b), (2, c)], 1, 2.5, 1, 2, all);
        assert_eq!(ids(&r1), [(0, 1), (1, 0)]);
        assert_eq!(r1.close_s, 3.5);
        assert_eq!(r1.buffer[1].0.start_s, 2.5);
        let w: Vec<f64> = r1.buffer.iter().map(|(_, s)| fedbuff_weight(*s)).collect();
        assert!(close(w[0], 1.0 / 2f64.sqrt()) && w[1] == 1.0);
        assert_eq!(flying.len(), 1);
        assert_eq!(
            (flying[0].id, flying[0].start_s, flying[0].arrival_s),
            (2, 3.0, 4.5)
        );
        let r2 = fedbuff_round(&mut flying, &[(0, a), (1, b)], 1, 3.5, 2, 2, all);
        assert_eq!(ids(&r2), [(2, 1), (1, 0)]);
        assert_eq!(r2.close_s, 5.5);
        assert_eq!((flying[0].id, flying[0].arrival_s), (0, 6.5));
        assert!(r0.lost.is_empty() && r1.lost.is_empty() && r2.lost.is_empty());
    }

    /// An update whose client is offline when it arrives is lost, frees its slot, and the
    /// buffer waits for the next arrival: round 0 above with B offline at 1 s starts C at 1
    /// and fills the buffer with C (2.5 s) and A (3 s).
    #[test]
    fn fedbuff_loses_an_offline_arrival_and_refills_its_slot() {
        let mut flying = Vec::new();
        let r = fedbuff_round(
            &mut flying,
            &[(0, 3.0), (1, 1.0), (2, 1.5)],
            2,
            0.0,
            0,
            2,
            |id, _| id != 1,
        );
        assert_eq!(r.lost.len(), 1);
        assert_eq!(r.lost[0].id, 1);
        let got: Vec<usize> = r.buffer.iter().map(|(f, _)| f.id).collect();
        assert_eq!(got, [2, 0]);
        assert_eq!(r.close_s, 3.0);
        assert!(flying.is_empty());
    }
}

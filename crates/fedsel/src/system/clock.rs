//! The virtual clock: how long each participant takes, and which updates a round policy
//! aggregates and how long the round lasts.
//!
//! A client's time in a round is FedScale's model: download + compute + upload, where
//! compute = augmentation × samples processed × ms per sample / 1000 and each transfer is
//! the model's size in kbit (f32 parameters × 32 / 1024) over the client's bandwidth. The
//! policies are pure functions of the participants' finish times, in selection order, and
//! of which updates arrive at all.
//!
//! With a behave trace, an update whose client is offline when it would arrive is lost
//! (FedScale's `tictak_client_tasks`). As in FedScale's simulation, a lost update is out of
//! the round before the policy applies: over-commitment keeps the K first among the
//! updates that arrive, and waiting for all waits for those that arrive (the server sees
//! the client drop). Under a deadline a lost update is a missing one, so the round lasts
//! the whole deadline, as for a late update. Lost updates are booked as wasted trainings.
//!
//! **A round that receives no update still takes time.** When every selected client's
//! update is lost, the server has nothing to close the round on; it keeps the round open
//! as long as its slowest participant would have needed (the finish time of the last
//! entry, as if all had arrived), then gives up. Without this a round whose clients all go
//! offline before they finish would last 0 s, the next round would start at the same
//! instant with the same clients and lose them again, and the clock would never move.
//! Every finish time is positive (a transfer takes time), so every round with a selection
//! moves the clock forward. A deadline round already lasts its deadline.
//!
//! **What a strategy adds.** A selector's queries (Pow-d's loss queries, FedCor's probes,
//! DivFL's gradients, FedGS's graph building) happen before the round's training: the
//! server waits for the answers before it selects. Each query is a stage that lasts as
//! long as its slowest client's download, compute and upload ([`QueryWork`]); stages run
//! one after the other, as the selector asks them, and together they are the round's
//! query phase. So round_s = query phase + the training phase under the round policy,
//! whose finish times (and deadline) count from the training broadcast. An evaluation
//! costs inference only (one forward pass a sample); a gradient or a training costs
//! `augmentation` × that a sample; a loss report or a protocol message carries a few
//! numbers, which the bandwidth model (no latency) does not charge. The selector's
//! initial phase (before round 0) is round 0's query phase, as its costs are round 0's.
//! A strategy that queries nothing has no query phase.

use crate::system::behave::Activity;
use crate::system::profile::Profile;
use crate::system::{RoundPolicy, StaleConfig, SystemConfig};

/// Virtual seconds for people to read, at any magnitude: six significant digits, in
/// exponent form below a millisecond or at a million seconds and above (`0.00125`,
/// `53.1235`, `4.2e-7`, `5.12410e15`), so that neither a fast device's microseconds nor
/// an extreme one's centuries collapse into `0.000` or a saturated count.
pub fn show_s(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let magnitude = x.abs().log10().floor();
    if (-3.0..6.0).contains(&magnitude) {
        format!("{x:.*}", (5.0 - magnitude) as usize)
    } else {
        format!("{x:.5e}")
    }
}

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

/// A finished round on the clock, as `metrics.csv` records it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoundClock {
    /// Virtual seconds the round lasted.
    pub round_s: f64,
    /// Virtual seconds since the run started, at the round's end.
    pub clock_s: f64,
    /// Selection entries whose update was aggregated (the trainings it wasted are in the
    /// round's ledger).
    pub aggregated: usize,
    /// Under `[system.stale]` or `policy = "fedbuff"`: the aggregated updates whose
    /// staleness is ≥ 1 (late updates folded, or buffered updates trained from an older
    /// model) and their mean staleness (`metrics.csv`'s `stale_updates`, `mean_staleness`).
    pub stale: Option<(usize, f64)>,
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

/// What one client does to answer one query of a selector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueryWork {
    /// Models sent to or from the client (a loss report is not a model).
    pub transfers: u64,
    /// Samples passed forward only (evaluations).
    pub inference_samples: u64,
    /// Samples passed forward and backward (gradients, trainings).
    pub training_samples: u64,
}

impl QueryWork {
    /// An evaluation of `samples` samples: the model down, a loss (uncharged) up.
    pub fn evaluation(samples: u64) -> Self {
        Self {
            transfers: 1,
            inference_samples: samples,
            training_samples: 0,
        }
    }

    /// A training or a gradient over `samples` samples: the model down, a model up.
    pub fn training(samples: u64) -> Self {
        Self {
            transfers: 2,
            inference_samples: 0,
            training_samples: samples,
        }
    }
}

/// The clients' devices and the round policy, with what every client's time shares.
#[derive(Debug, Clone)]
pub struct Clock {
    profiles: Vec<Profile>,
    augmentation: f64,
    /// The model's size in kbit, sent once each way.
    model_kbit: f64,
    policy: RoundPolicy,
    /// Per client, when it is online (`[system] behave_trace` only).
    behave: Option<Vec<Activity>>,
    /// Seconds a round that trains nobody waits when nothing else sets its end
    /// ([`Clock::idle_s`]).
    idle_s: f64,
}

impl Clock {
    /// The clock for `profiles` (one per client) and a model of `num_params` f32 parameters.
    pub fn new(cfg: &SystemConfig, profiles: Vec<Profile>, num_params: usize) -> Self {
        Self {
            profiles,
            augmentation: cfg.augmentation,
            model_kbit: num_params as f64 * 32.0 / 1024.0,
            policy: cfg.round,
            behave: None,
            idle_s: cfg.idle_s.unwrap_or(1.0),
        }
    }

    /// Sets the wait of a round that trains nobody when nothing else sets it
    /// (`system.idle_s`, or the median registered round trip: [`SystemConfig::clock`]).
    pub fn set_idle_s(&mut self, idle_s: f64) {
        self.idle_s = idle_s;
    }

    /// How long a round that trains nobody lasts from `now_s`, when the server next has
    /// something to decide on: its `deadline_s` if the round has one; else, with a behave
    /// trace, the next time a client comes online or goes offline; else `system.idle_s`.
    /// Always > 0, so such rounds move the clock (a round of 0 s would be asked again at
    /// the same instant, with the same clients, and the clock would never move).
    pub fn idle_s(&self, now_s: f64, deadline_s: Option<f64>) -> f64 {
        if let Some(d) = deadline_s {
            return d;
        }
        self.behave
            .as_ref()
            .map(|b| {
                b.iter()
                    .map(|a| a.next_change(now_s))
                    .filter(|&t| t > now_s)
                    .fold(f64::INFINITY, f64::min)
                    - now_s
            })
            .filter(|w| w.is_finite() && *w > 0.0)
            .unwrap_or(self.idle_s)
    }

    /// The clock with per-client online times (one per client), or without any.
    pub fn with_behave(self, behave: Option<Vec<Activity>>) -> Self {
        Self { behave, ..self }
    }

    /// When a round asked for at virtual second `now_s` starts, and which of the
    /// `available` clients (those of the round-indexed availability model) are online then.
    /// Without a behave trace, at once with all of them. With one, at once with those
    /// online; if none of them is, the server waits for the first to come online (the
    /// round starts then, with every client online at that moment), rather than spend
    /// rounds with nobody, which on a clock that does not move would repeat forever.
    pub fn online(&self, now_s: f64, available: Vec<usize>) -> (f64, Vec<usize>) {
        let Some(behave) = &self.behave else {
            return (now_s, available);
        };
        let next: Vec<f64> = available
            .iter()
            .map(|&k| behave[k].next_active(now_s))
            .collect();
        let start = next.iter().copied().fold(f64::INFINITY, f64::min);
        let online = available
            .into_iter()
            .zip(next)
            .filter_map(|(k, t)| (t <= start).then_some(k))
            .collect();
        (if start.is_finite() { start } else { now_s }, online)
    }

    /// Whether client `k` is online at virtual second `at_s` (always, without a behave
    /// trace).
    pub fn online_at(&self, k: usize, at_s: f64) -> bool {
        self.behave.as_ref().is_none_or(|b| b[k].is_active(at_s))
    }

    /// Client `k`'s device.
    pub fn profile(&self, k: usize) -> &Profile {
        &self.profiles[k]
    }

    /// Seconds client `k` takes to send the model one way.
    pub fn transfer_s(&self, k: usize) -> f64 {
        self.model_kbit / self.profiles[k].bandwidth_kbps
    }

    /// Seconds client `k` takes to download the model, process `samples` samples and
    /// upload its update.
    pub fn finish_s(&self, k: usize, samples: u64) -> f64 {
        self.finish_sending_s(k, samples, 1.0)
    }

    /// [`Clock::finish_s`] for an upload of the fraction `sent` of the model (a client
    /// that drops part of its update, [`UploadDropout`](crate::select::UploadDropout)):
    /// the upload takes that fraction of the transfer; the download is whole. The indices
    /// of a sparse upload are not charged, as PyramidFL's clock does not charge them
    /// (`training/param_server.py` line 179 scales the transfer by 1 − ratio).
    pub fn finish_sending_s(&self, k: usize, samples: u64, sent: f64) -> f64 {
        let transfer = self.transfer_s(k);
        transfer + self.compute_s(k, samples) + sent * transfer
    }

    /// Seconds of client `k`'s compute to train on `samples` samples.
    pub fn compute_s(&self, k: usize, samples: u64) -> f64 {
        self.augmentation * samples as f64 * self.profiles[k].compute_ms_per_sample / 1000.0
    }

    /// Seconds client `k` takes to do `work`.
    pub fn query_s(&self, k: usize, work: QueryWork) -> f64 {
        let p = &self.profiles[k];
        let transfer = self.transfer_s(k);
        let samples =
            work.inference_samples as f64 + self.augmentation * work.training_samples as f64;
        work.transfers as f64 * transfer + samples * p.compute_ms_per_sample / 1000.0
    }

    /// Seconds one query lasts: until the slowest of its clients answers (0 for none).
    pub fn stage_s(&self, work: impl IntoIterator<Item = (usize, QueryWork)>) -> f64 {
        work.into_iter()
            .map(|(k, w)| self.query_s(k, w))
            .fold(0.0, f64::max)
    }

    /// The budget handed to the selector for a round whose budget is `k` with `available`
    /// clients: ⌈(1 + o)·k⌉ under over-commitment, capped at the available clients but
    /// never below `k`; `k` otherwise.
    pub fn selection_budget(&self, k: usize, available: usize) -> usize {
        match self.policy {
            RoundPolicy::Overcommit { overcommit } => {
                let more = ((1.0 + overcommit) * k as f64).ceil() as usize;
                more.min(available).max(k)
            }
            // FedBuff's refills are sized by the engine ([`fedbuff_budget`]).
            RoundPolicy::WaitAll | RoundPolicy::Deadline { .. } | RoundPolicy::Fedbuff { .. } => k,
        }
    }

    /// The round policy.
    pub fn policy(&self) -> RoundPolicy {
        self.policy
    }

    /// Per entry of `clients`, whether its update arrives: its client is online when it
    /// would, `finish` seconds after a broadcast at `start_s + query_s` (always, without a
    /// behave trace).
    pub fn arrives(
        &self,
        start_s: f64,
        query_s: f64,
        clients: &[usize],
        finish: &[f64],
    ) -> Vec<bool> {
        match &self.behave {
            Some(behave) => clients
                .iter()
                .zip(finish)
                .map(|(&c, &f)| behave[c].is_active(start_s + query_s + f))
                .collect(),
            None => vec![true; finish.len()],
        }
    }

    /// Applies the round policy to the entries' finish times (seconds after the training
    /// broadcast), `k` being the round's own budget (before over-commitment), for a round
    /// that started at `start_s` with a query phase of `query_s` seconds. An entry of
    /// `clients` offline when its update would arrive is lost.
    pub fn round(
        &self,
        start_s: f64,
        query_s: f64,
        clients: &[usize],
        finish: &[f64],
        k: usize,
    ) -> RoundTiming {
        let arrives = self.arrives(start_s, query_s, clients, finish);
        let mut r = match self.policy {
            // The engine runs FedBuff's rounds itself ([`fedbuff_round`]).
            RoundPolicy::WaitAll | RoundPolicy::Fedbuff { .. } => wait_all(finish, &arrives),
            RoundPolicy::Overcommit { .. } => overcommit(finish, &arrives, k),
            RoundPolicy::Deadline { deadline_s } => deadline(finish, &arrives, deadline_s),
        };
        r.round_s += query_s;
        r
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

    #[test]
    fn seconds_keep_six_significant_digits_at_every_magnitude() {
        assert_eq!(show_s(0.0), "0");
        assert_eq!(show_s(0.00125), "0.00125000");
        assert_eq!(show_s(53.123456), "53.1235");
        assert_eq!(show_s(999_999.0), "999999");
        assert_eq!(show_s(4.2e-7), "4.20000e-7");
        assert_eq!(show_s(5_124_095_576_030_431.0 * 3600.0), "1.84467e19");
    }

    /// Three clients with a model of 1024 parameters (32 kbit each way) and augmentation 3:
    ///
    /// | client | ms/sample | kbit/s | steps × batch | compute (s)         | transfers (s)   | finish (s) |
    /// |--------|-----------|--------|---------------|---------------------|-----------------|------------|
    /// | 0      | 1         | 32     | 10 × 10 = 100 | 3·100·1/1000 = 0.3  | 2 · 32/32 = 2   | 2.3        |
    /// | 1      | 10        | 64     | 10 × 10 = 100 | 3·100·10/1000 = 3   | 2 · 32/64 = 1   | 4.0        |
    /// | 2      | 2         | 16     | 5 × 10 = 50   | 3·50·2/1000 = 0.3   | 2 · 32/16 = 4   | 4.3        |
    fn three_clients(round: RoundPolicy) -> Clock {
        let p = |c, b| Profile {
            compute_ms_per_sample: c,
            bandwidth_kbps: b,
        };
        let cfg = SystemConfig {
            round,
            ..SystemConfig::default()
        };
        Clock::new(&cfg, vec![p(1.0, 32.0), p(10.0, 64.0), p(2.0, 16.0)], 1024)
    }

    fn finish(clock: &Clock) -> Vec<f64> {
        [(0, 100), (1, 100), (2, 50)]
            .iter()
            .map(|&(k, s)| clock.finish_s(k, s))
            .collect()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn hand_computed_finish_times_and_round_lengths() {
        let clock = three_clients(RoundPolicy::WaitAll);
        let f = finish(&clock);
        for (got, want) in f.iter().zip([2.3, 4.0, 4.3]) {
            assert!(close(*got, want), "{got} ≠ {want}");
        }
        // wait_all: everyone, until the slowest (4.3 s).
        let r = clock.round(0.0, 0.0, &[0, 1, 2], &f, 3);
        assert_eq!(r.kept, [true, true, true]);
        assert!(close(r.round_s, 4.3));

        // overcommit 0.3 with K = 2: ⌈1.3 · 2⌉ = 3 selected; the two first (2.3 s and
        // 4.0 s) are aggregated, the round closes at 4.0 s.
        let clock = three_clients(RoundPolicy::Overcommit { overcommit: 0.3 });
        assert_eq!(clock.selection_budget(2, 10), 3);
        assert_eq!(
            clock.selection_budget(2, 2),
            2,
            "capped at the available clients"
        );
        let r = clock.round(0.0, 0.0, &[0, 1, 2], &f, 2);
        assert_eq!(r.kept, [true, true, false]);
        assert!(close(r.round_s, 4.0));

        // deadline 4.1 s: client 2 (4.3 s) misses it, so the round waits the whole 4.1 s.
        let clock = three_clients(RoundPolicy::Deadline { deadline_s: 4.1 });
        let r = clock.round(0.0, 0.0, &[0, 1, 2], &f, 3);
        assert_eq!(r.kept, [true, true, false]);
        assert!(close(r.round_s, 4.1));
        // deadline 5 s: everyone arrives, the round closes with the last at 4.3 s.
        let all = [true; 3];
        let r = deadline(&f, &all, 5.0);
        assert_eq!(r.kept, [true, true, true]);
        assert!(close(r.round_s, 4.3));
        // deadline 1 s: no update arrives; the round still lasts its deadline.
        let r = deadline(&f, &all, 1.0);
        assert_eq!(r.kept, [false, false, false]);
        assert!(close(r.round_s, 1.0));
    }

    /// A Pow-d-like query on the three clients: each downloads the model (32 kbit) and
    /// evaluates 20 samples; client 2 trains 10 samples more for a probe and uploads.
    ///
    /// | client | transfers (s) | compute (s)                     | query (s) |
    /// |--------|---------------|---------------------------------|-----------|
    /// | 0      | 32/32 = 1     | 20·1/1000 = 0.02                | 1.02      |
    /// | 1      | 32/64 = 0.5   | 20·10/1000 = 0.2                | 0.7       |
    /// | 2      | 2 · 32/16 = 4 | (20 + 3·10)·2/1000 = 0.1        | 4.1       |
    ///
    /// The query lasts 4.1 s and wait_all's round 4.1 + 4.3 s; without queries the round
    /// is exactly what it was.
    #[test]
    fn the_query_phase_is_the_slowest_answer_before_the_training_phase() {
        let clock = three_clients(RoundPolicy::WaitAll);
        let eval = QueryWork::evaluation(20);
        let probe = QueryWork {
            inference_samples: 20,
            ..QueryWork::training(10)
        };
        for (k, w, want) in [(0, eval, 1.02), (1, eval, 0.7), (2, probe, 4.1)] {
            let got = clock.query_s(k, w);
            assert!(close(got, want), "client {k}: {got} ≠ {want}");
        }
        let q = clock.stage_s([(0, eval), (1, eval), (2, probe)]);
        assert!(close(q, 4.1));
        assert_eq!(clock.stage_s([]), 0.0);
        let f = finish(&clock);
        assert!(close(
            clock.round(0.0, q, &[0, 1, 2], &f, 3).round_s,
            4.1 + 4.3
        ));
        assert_eq!(
            clock.round(0.0, 0.0, &[0, 1, 2], &f, 3),
            wait_all(&f, &[true; 3])
        );
        let clock = three_clients(RoundPolicy::Deadline { deadline_s: 4.1 });
        let r = clock.round(0.0, q, &[0, 1, 2], &f, 3);
        assert_eq!(
            r.kept,
            [true, true, false],
            "the deadline counts from the broadcast"
        );
        assert!(close(r.round_s, 4.1 + 4.1));
    }

    #[test]
    fn overcommit_breaks_ties_by_entry_order_and_an_empty_round_lasts_nothing() {
        let r = overcommit(&[3.0, 1.0, 3.0, 3.0], &[true; 4], 2);
        assert_eq!(r.kept, [true, true, false, false]);
        assert_eq!(r.round_s, 3.0);
        assert_eq!(wait_all(&[], &[]).round_s, 0.0);
        assert_eq!(overcommit(&[], &[], 2).round_s, 0.0);
    }

    /// Every update lost: the server waits as long as the slowest entry would have
    /// needed (4.3 s of the three clients' 2.3, 4.0 and 4.3 s), under wait-all and
    /// over-commitment alike; a deadline round lasts its deadline.
    #[test]
    fn a_round_that_loses_every_update_lasts_its_slowest_entry() {
        let f = finish(&three_clients(RoundPolicy::WaitAll));
        let lost = [false; 3];
        let r = wait_all(&f, &lost);
        assert_eq!(r.kept, lost);
        assert!(close(r.round_s, 4.3));
        let r = overcommit(&f, &lost, 2);
        assert_eq!(r.kept, lost);
        assert!(close(r.round_s, 4.3));
        assert!(close(deadline(&f, &lost, 10.0).round_s, 10.0));
        // One update arrives: the round closes with it, as before.
        assert!(close(wait_all(&f, &[true, false, false]).round_s, 2.3));
    }

    /// The three clients of [`three_clients`] (finishing at 2.3, 4.0 and 4.3 s after the
    /// broadcast), client 1 online during [0, 3] of every 100 s, the others always:
    /// from a broadcast at 0 its update (at 4.0 s) is lost, from one at 98 s (arriving at
    /// 102 ≡ 2 s) it counts.
    #[test]
    fn an_update_arriving_offline_is_lost_before_the_policy_applies() {
        let always = || Activity::new(vec![0.0], vec![100.0], 100.0).unwrap();
        let short = Activity::new(vec![0.0], vec![3.0], 100.0).unwrap();
        let behave = Some(vec![always(), short, always()]);
        let entries = [0, 1, 2];
        let at = |policy, start_s, k| {
            let clock = three_clients(policy).with_behave(behave.clone());
            clock.round(start_s, 0.0, &entries, &finish(&clock), k)
        };
        // wait_all: clients 0 and 2 are aggregated, the round waits for 2 (4.3 s).
        let r = at(RoundPolicy::WaitAll, 0.0, 3);
        assert_eq!(r.kept, [true, false, true]);
        assert!(close(r.round_s, 4.3));
        assert_eq!(at(RoundPolicy::WaitAll, 98.0, 3).kept, [true, true, true]);
        // overcommit, K = 2: client 1 is lost, so the two first to arrive are 0 and 2.
        let r = at(RoundPolicy::Overcommit { overcommit: 0.3 }, 0.0, 2);
        assert_eq!(r.kept, [true, false, true]);
        assert!(close(r.round_s, 4.3));
        // deadline 5 s: everyone would be in time, but the lost update keeps the server
        // waiting the whole deadline.
        let r = at(RoundPolicy::Deadline { deadline_s: 5.0 }, 0.0, 3);
        assert_eq!(r.kept, [true, false, true]);
        assert!(close(r.round_s, 5.0));
    }

    #[test]
    fn a_round_starts_when_the_first_available_client_is_online() {
        let cfg = SystemConfig::default();
        let p = Profile {
            compute_ms_per_sample: 1.0,
            bandwidth_kbps: 1.0,
        };
        let window = |a: f64, b: f64| Activity::new(vec![a], vec![b], 100.0).unwrap();
        let clock = Clock::new(&cfg, vec![p; 3], 10).with_behave(Some(vec![
            window(10.0, 20.0),
            window(30.0, 40.0),
            window(30.0, 35.0),
        ]));
        // At 15 s client 0 is online: the round starts at once, with it alone.
        assert_eq!(clock.online(15.0, vec![0, 1, 2]), (15.0, vec![0]));
        // At 25 s nobody is: the round starts at 30 s, with clients 1 and 2.
        assert_eq!(clock.online(25.0, vec![0, 1, 2]), (30.0, vec![1, 2]));
        // Client 0 alone, at 25 s: its next interval, in the next cycle, at 110 s.
        assert_eq!(clock.online(25.0, vec![0]), (110.0, vec![0]));
        // Nobody available: no wait, nobody online.
        assert_eq!(clock.online(25.0, vec![]), (25.0, vec![]));
        // Without a trace, nothing changes.
        let plain = Clock::new(&cfg, vec![p; 3], 10);
        assert_eq!(plain.online(25.0, vec![0, 2]), (25.0, vec![0, 2]));
    }
}

#[cfg(test)]
mod async_tests {
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

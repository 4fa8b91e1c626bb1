//! The virtual clock: how long each participant takes, who is online when, and the round
//! policy applied to a round's finish times (the policies themselves are [`super::round`]).
//!
//! A client's time in a round is FedScale's model: download + compute + upload, where
//! compute = augmentation × samples processed × ms per sample / 1000 and each transfer is
//! the model's size in kbit (f32 parameters × 32 / 1024) over the client's bandwidth. The
//! policies are pure functions of the participants' finish times, in selection order, and
//! of which updates arrive at all: the clock computes those, the policies choose.
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
use crate::system::round::{RoundTiming, deadline, overcommit, wait_all};
use crate::system::{RoundPolicy, SystemConfig};

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
            // FedBuff's rounds are the in-flight book's (`InFlight::fedbuff_round`).
            RoundPolicy::WaitAll | RoundPolicy::Fedbuff { .. } => wait_all(finish, &arrives),
            RoundPolicy::Overcommit { .. } => overcommit(finish, &arrives, k),
            RoundPolicy::Deadline { deadline_s } => deadline(finish, &arrives, deadline_s),
        };
        r.round_s += query_s;
        r
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
